/*
 * tunables.h - the library's one table of tunables.
 *
 * Each tunable has an environment name, a policy `set` name (or none), a
 * default, a range, a unit and one line of help (struct sdp_tunable).
 * Start-up resolves them from the table (switch/config.c:
 * sdp_tunables_load), `sdp check --tunables` prints the table with the
 * values in effect and where each came from, and the man pages list every
 * one (tests/unit/test_tunables_doc.py holds them to it). The numbers land
 * in sdp_tun, which the engine reads.
 */
#ifndef SDP_TUNABLES_H
#define SDP_TUNABLES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* The values in effect (set once at start-up, then read-only, except the
 * `auto` choices, resolved at the first connection: pool.c). */
struct sdp_tunables {
	uint32_t spin_us;              /* busy-poll before blocking, microseconds */
	uint32_t zcopy_thresh;         /* bytes; 0 = zero copy off */
	uint32_t zcopy_chunk;          /* bytes per SrcAvail in Pipelined mode */
	uint32_t zcopy_depth;          /* SrcAvails outstanding (1 = Combined) */
	uint32_t zcopy_tail;           /* bytes of a large send sent by BCopy */
	uint32_t zcopy_auto;           /* 1: zcopy_thresh still to be measured */
	uint32_t copy_auto;            /* 1: the copy routine still to be chosen */
	uint32_t copy_stream_auto;     /* 1: streaming stores learned (copy.h) */
	uint32_t calib_pending;        /* zcopy_auto || copy_auto, until resolved */
	uint32_t cma_alias;            /* 1: bounce CMA between page-aliased buffers */
	uint32_t nslots;               /* receive buffers per direction */
	uint32_t slot_size;            /* bytes per receive buffer */
	uint32_t geometry_given;       /* 1: SDP_NSLOTS or SDP_SLOT_SIZE given
					* (else a provider may choose its own) */
	uint32_t region_cache;         /* shm regions reused per peer process */
	uint32_t ring_start;           /* receive buffers a connection's sends
					* start with (grown x4 while streaming) */
	uint32_t idle_trim_ms;         /* idle ms before a direction gives its
					* buffers back (0 = never) */
	uint32_t ofi_port_offset;      /* network rendezvous port = listener's + this */
	uint32_t ofi_hello_ms;         /* longest wait for a network rendezvous, ms */
	uint32_t ofi_provider_auto;    /* 1: any libfabric provider */
	uint32_t log_level;            /* SDP_LOG, 0..3 */
	/* Asynchronous Zero Copy (az.h) */
	uint32_t azcopy;               /* 1: on */
	uint32_t azcopy_thresh;        /* bytes: a blocking send at least this
					* large advertises asynchronously
					* (az_thresh(): the `auto` one resolved) */
	uint32_t azcopy_auto;          /* 1: "auto" given: measured (calib.c) */
	uint32_t az_fault;             /* 0 block-on-write, 1 copy-on-write */
	uint32_t az_fault_auto;        /* "auto" given: block */
	uint32_t az_depth;             /* asynchronous advertisements outstanding
					* per connection, at most */
	uint32_t az_protect;           /* enum az_mech: 0 = measure, 1 mprotect,
					* 2 userfaultfd */
	uint32_t az_protect_auto;      /* "auto" given */
	uint32_t az_recv;              /* 1: a recv may return before the copy */
	uint32_t az_recv_max;          /* bytes: ... only into a buffer of at
					* most this many */
	uint32_t az_cool;              /* sends made synchronously after most of
					* 16 were written while in flight (0 never) */
	uint32_t az_pool;              /* bytes: the process's pool of bounce
					* buffers for copies aside (0 = a mapping
					* per copy) */
};
extern struct sdp_tunables sdp_tun;
/* The libfabric provider asked for (SDP_OFI_PROVIDER), "" = any. */
extern char sdp_ofi_provider[32];

enum sdp_tun_kind {
	SDP_TK_NUM,        /* a number in [lo, hi] */
	SDP_TK_NUM_AUTO,   /* "auto", or a number in [lo, hi] */
	SDP_TK_NAME,       /* "auto", or a name the table's check accepts */
	SDP_TK_LEVEL,      /* a number, clamped into [lo, hi] */
	SDP_TK_TEXT,       /* a path, a directory or a flag: taken as it is
			    * by the code that reads it (environment only) */
};

struct sdp_tunable {
	const char *env;               /* environment name, "SDP_SPIN_US" */
	const char *set;               /* policy `set` name, or NULL */
	enum sdp_tun_kind kind;
	const char *def;               /* the default, as text */
	uint32_t    lo, hi;            /* range of a number */
	uint32_t    align;             /* a number is rounded down to a multiple
					* of this (0: not rounded) */
	const char *unit;              /* "us", "bytes", "buffers", "level", "path" ... */
	const char *choices;           /* SDP_TK_NAME: the names, for help */
	const char *help;              /* one line */
	uint32_t   *var;               /* where a number goes (in sdp_tun) */
	uint32_t   *is_auto;           /* set to 1 for "auto", else 0 */
	bool      (*check)(const char *name);   /* SDP_TK_NAME: accept and use it */
};

extern const struct sdp_tunable sdp_tunables[];
extern const size_t sdp_ntunables;

enum sdp_tun_src {
	SDP_TS_DEFAULT = 0,            /* not given */
	SDP_TS_ENV,                    /* the environment */
	SDP_TS_POLICY,                 /* a `set` line of the policy file */
};

/* What sdp_tunables_load found for one tunable. */
struct sdp_tun_value {
	const char *text;              /* the value in effect, as text (the
					* default if none or a bad one was given) */
	const char *given;             /* a value that was given but rejected */
	enum sdp_tun_src src;
};

/* The value of a policy `set` NAME, or NULL. */
typedef const char *(*sdp_tun_lookup)(const char *set, void *arg);
/* A rejected value v of t, from the environment or the policy; want: the
 * accepted values (sdp_tun_range). */
typedef void (*sdp_tun_report)(const struct sdp_tunable *t, enum sdp_tun_src src,
			       const char *v, const char *want, void *arg);

/* Resolve every tunable: the environment, else lookup() of its `set`
 * name (lookup may be NULL), else the default. A value out of range or
 * not understood is reported and the default used. Numbers land in
 * sdp_tun; vals (NULL, or sdp_ntunables entries) gets what was found. */
void sdp_tunables_load(sdp_tun_lookup lookup, void *arg, sdp_tun_report report,
		       void *report_arg, struct sdp_tun_value *vals);

/* "0 - 1000000", "auto, or 0 - 4294967295", "auto, libc, avx2, ...": the
 * accepted values of t as text, into buf. */
const char *sdp_tun_range(const struct sdp_tunable *t, char *buf, size_t n);
const char *sdp_tun_src_name(enum sdp_tun_src src);

#endif
