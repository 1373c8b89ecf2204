/*
 * copy.h - the routine that moves stream bytes into and out of receive
 * buffers (Buffer Copy), chosen per host.
 *
 * glibc picks its memcpy for the application's general use; for the ring
 * copies (tens of KiB, source and destination often at the same offset in
 * their pages) that choice can be several times slower than a plain vector
 * loop on some CPUs (rep movsb on some AMD hosts). The library therefore
 * measures its candidates once per host (calib.c, cached) and uses the
 * fastest, without changing anything the application sees.
 */
#ifndef SDP_COPY_H
#define SDP_COPY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef void (*sdp_copy_fn)(void *dst, const void *src, size_t n);

struct sdp_copy_impl {
	const char *name;              /* "libc", "sse2", "avx2", "avx512", "movsb" */
	sdp_copy_fn fn;
	bool (*usable)(void);          /* the CPU has what it needs */
};

#define SDP_COPY_MAX 5

/* The candidates, in order of preference at equal speed (libc first). */
const struct sdp_copy_impl *sdp_copy_impls(int *n);
const struct sdp_copy_impl *sdp_copy_find(const char *name);  /* NULL: unknown */

/* The routine in use (libc memcpy until a choice is made). */
extern sdp_copy_fn sdp_copy_cur;
static inline void sdp_copy(void *dst, const void *src, size_t n)
{
	sdp_copy_cur(dst, src, n);
}
/* Use this routine from now on; false if unknown or unusable here. */
bool sdp_copy_use(const char *name);
const char *sdp_copy_name(void);

/* ---- copies the peer's CPU reads in place (the shm ring) ----------------
 * Plain stores take each destination line into the writer's cache first,
 * from wherever it is: when the reader runs behind another cache (another
 * core complex of the host, which a VM's vCPUs can be moved onto at any
 * time), every line crosses between them and a 16 KiB copy runs at 2-3
 * instead of 18 GB/s (measured on a 2-vCPU AMD EPYC VM). Streaming stores
 * write to memory without that, and the reader's hardware prefetch reads
 * it back: 12-13 GB/s end to end either way. So each thread times one in
 * SDP_STREAM_PROBE_OFF of its large plain copies into shared buffers;
 * when their smoothed speed falls below SDP_STREAM_SLOW of the host's
 * calibrated copy speed, and below SDP_STREAM_SLOW_GBPS whatever that
 * is (a host whose copies within one cache are very fast may still move
 * 8-15 GB/s between cores with plain stores, more than streaming stores
 * give end to end), it streams, timing one plain copy in
 * SDP_STREAM_PROBE_ON, and goes back above SDP_STREAM_FAST (at most
 * SDP_STREAM_FAST_GBPS). A reader on the same core or cache finds plain
 * stores fast and keeps them. */
#define SDP_STREAM_MIN       4096  /* bytes: smaller copies use plain stores */
#define SDP_STREAM_PROBE_OFF 16    /* plain: time one large copy in 16 */
#define SDP_STREAM_PROBE_ON  128   /* streaming: one plain, timed, in 128 */
#define SDP_STREAM_SLOW      0.25  /* of the reference: stream below it */
#define SDP_STREAM_FAST      0.40  /* ... plain again above it */
#define SDP_STREAM_SLOW_GBPS 6.0   /* and never stream above this */
#define SDP_STREAM_FAST_GBPS 10.0  /* ... plain again above this at most */
#define SDP_STREAM_REF_GBPS  24.0  /* reference until calibration gives one */

struct sdp_stream_pick {           /* one per thread */
	bool     on;                   /* large copies use streaming stores */
	uint32_t n;                    /* large copies since the last timed one */
	double   gbps;                 /* smoothed speed of timed plain copies,
					* GB/s (0: none yet) */
};
enum sdp_stream_act { SDP_ST_PLAIN, SDP_ST_TIMED, SDP_ST_STREAM };
/* What the next large copy does; then, for SDP_ST_TIMED, what it took
 * (ref: the host's calibrated copy speed, GB/s). Pure: tests/unit. */
enum sdp_stream_act sdp_stream_next(struct sdp_stream_pick *p);
void sdp_stream_learn(struct sdp_stream_pick *p, size_t bytes, uint64_t ns, double ref);

/* Copy into a buffer the peer reads in place; true if streaming stores
 * were used (statistics: tx_stream_bytes). */
bool sdp_copy_shared(void *dst, const void *src, size_t n);
/* The streaming routine itself (tests). */
void sdp_copy_streaming(void *dst, const void *src, size_t n);
/* SDP_COPY_STREAM: "on" (always, from SDP_STREAM_MIN bytes), "off"
 * (never); auto = learned per thread. */
extern int sdp_copy_stream_mode;
bool sdp_copy_stream_set(const char *name);
/* The host's calibrated speed of the copy routine in use, GB/s. */
void sdp_copy_stream_ref(double gbps);

#endif
