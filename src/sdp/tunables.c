/*
 * tunables.c - the library's one table of tunables (tunables.h) and how
 * their values are found: the environment first, then the policy file's
 * `set` lines, else the default. Also linked into the `sdp` tool, which
 * prints the table (`sdp check --tunables`); it uses nothing of the library
 * but copy.c (the copy routine's names).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sdp/copy.h"
#include "sdp/tunables.h"

struct sdp_tunables sdp_tun = {
	.spin_us = 40,
	.zcopy_chunk = 1u << 20,
	.zcopy_depth = 4,
	.zcopy_tail = 256u << 10,
	.nslots = 64,
	.ring_start = 4,
	.idle_trim_ms = 1000,
	.slot_size = 32768,
	.region_cache = 8,
	.ofi_port_offset = 1000,
	.ofi_hello_ms = 500,
	.ofi_provider_auto = 1,
	.azcopy_thresh = 65536,
	.azcopy_auto = 1,
	.az_depth = 8,
	.az_recv = 1,
	.az_recv_max = 1u << 20,
	.az_cool = 64,
	.az_pool = 4u << 20,
};
char sdp_ofi_provider[32];

/* A libfabric provider name: taken as it is (libfabric checks it when
 * the provider is first used; an unknown one means no fabric). */
static bool ofi_prov_check(const char *name)
{
	size_t n = strlen(name);
	if (!n || n >= sizeof sdp_ofi_provider)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z') || (name[i] >= '0' && name[i] <= '9') ||
		      name[i] == '_' || name[i] == '-'))
			return false;
	memcpy(sdp_ofi_provider, name, n + 1);
	return true;
}

/* SDP_AZ_FAULT: what a write to a page still in flight does. */
static bool az_fault_check(const char *name)
{
	if (!strcmp(name, "block"))
		sdp_tun.az_fault = 0;
	else if (!strcmp(name, "copy"))
		sdp_tun.az_fault = 1;
	else
		return false;
	return true;
}

/* SDP_AZ_PROTECT: how pages in flight are protected (enum az_mech). */
static bool az_protect_check(const char *name)
{
	if (!strcmp(name, "mprotect"))
		sdp_tun.az_protect = 1;
	else if (!strcmp(name, "uffd"))
		sdp_tun.az_protect = 2;
	else
		return false;
	return true;
}

/* The copy routine: one copy.c knows and this CPU runs (it is then used). */
static bool copy_check(const char *name)
{
	return sdp_copy_use(name);
}

/* SDP_COPY_STREAM: streaming stores into the peer's buffers. */
static bool copy_stream_check(const char *name)
{
	return sdp_copy_stream_set(name);
}

const struct sdp_tunable sdp_tunables[] = {
	{ .env = "SDP_SPIN_US", .set = "spin_us", .kind = SDP_TK_NUM, .def = "40",
	  .lo = 0, .hi = 1000000, .unit = "us", .var = &sdp_tun.spin_us,
	  .help = "busy-poll before sleeping (per socket: the SDP_SPIN_US option)" },
	{ .env = "SDP_ZCOPY_THRESH", .set = "zcopy_thresh", .kind = SDP_TK_NUM_AUTO,
	  .def = "auto", .lo = 0, .hi = UINT32_MAX, .unit = "bytes",
	  .var = &sdp_tun.zcopy_thresh, .is_auto = &sdp_tun.zcopy_auto,
	  .help = "zero-copy threshold, 0 = Buffer Copy only, auto = measured once "
		  "per host (per socket: the SDP_ZCOPY_THRESH option)" },
	{ .env = "SDP_COPY", .set = "copy", .kind = SDP_TK_NAME, .def = "auto",
	  .unit = "name", .choices = "libc, avx2, avx512, sse2, movsb",
	  .is_auto = &sdp_tun.copy_auto, .check = copy_check,
	  .help = "routine that copies stream bytes, auto = the fastest measured "
		  "on this host" },
	{ .env = "SDP_COPY_STREAM", .set = "copy_stream", .kind = SDP_TK_NAME,
	  .def = "auto", .unit = "name", .choices = "on, off",
	  .is_auto = &sdp_tun.copy_stream_auto, .check = copy_stream_check,
	  .help = "streaming stores for copies of 4 KiB and more into shared "
		  "memory, auto = while plain stores run slow (the peer reads "
		  "behind another cache; learned per thread)" },
	{ .env = "SDP_ZCOPY_CHUNK", .set = "zcopy_chunk", .kind = SDP_TK_NUM,
	  .def = "1048576", .lo = 4096, .hi = 1u << 30, .unit = "bytes",
	  .var = &sdp_tun.zcopy_chunk,
	  .help = "bytes per SrcAvail in Pipelined mode" },
	{ .env = "SDP_ZCOPY_DEPTH", .set = "zcopy_depth", .kind = SDP_TK_NUM,
	  .def = "4", .lo = 1, .hi = 64, .unit = "advertisements",
	  .var = &sdp_tun.zcopy_depth,
	  .help = "SrcAvails outstanding (1 = Combined mode)" },
	{ .env = "SDP_ZCOPY_TAIL", .set = "zcopy_tail", .kind = SDP_TK_NUM,
	  .def = "262144", .lo = 0, .hi = 1u << 30, .unit = "bytes",
	  .var = &sdp_tun.zcopy_tail,
	  .help = "with spinning off: at most this many bytes at the end of a "
		  "zero-copy send go by Buffer Copy" },
	{ .env = "SDP_NSLOTS", .set = "nslots", .kind = SDP_TK_NUM, .def = "64",
	  .lo = 2, .hi = 4096, .unit = "buffers", .var = &sdp_tun.nslots,
	  .help = "receive buffers per direction (the connecting side's value is "
		  "used)" },
	{ .env = "SDP_SLOT_SIZE", .set = "slot_size", .kind = SDP_TK_NUM,
	  .def = "32768", .lo = 1024, .hi = 4u << 20, .align = 64, .unit = "bytes",
	  .var = &sdp_tun.slot_size,
	  .help = "bytes per receive buffer, rounded down to a multiple of 64 (the "
		  "connecting side's value is used; over ofi, unless this or "
		  "SDP_NSLOTS is given: 64 KiB buffers of the same ring bytes)" },
	{ .env = "SDP_RING_START", .set = "ring_start", .kind = SDP_TK_NUM,
	  .def = "4", .lo = 1, .hi = 4096, .unit = "buffers",
	  .var = &sdp_tun.ring_start,
	  .help = "receive buffers a connection's sends use at first and again "
		  "after an idle trim; a stream that runs out grows the window "
		  "x4 (up to SDP_NSLOTS) once the ring is empty" },
	{ .env = "SDP_IDLE_TRIM_MS", .set = "idle_trim_ms", .kind = SDP_TK_NUM,
	  .def = "1000", .lo = 0, .hi = 3600000, .unit = "ms",
	  .var = &sdp_tun.idle_trim_ms,
	  .help = "a direction idle this long (nothing in flight, nothing sent) "
		  "shrinks its window back and gives its buffers' memory back, "
		  "at the process's next look (poll, epoll, a blocking wait: at "
		  "least once a second while it waits there); 0 = never" },
	{ .env = "SDP_REGION_CACHE", .set = "region_cache", .kind = SDP_TK_NUM,
	  .def = "8", .lo = 0, .hi = 64, .unit = "regions",
	  .var = &sdp_tun.region_cache,
	  .help = "connection regions reused per peer process (0 = a region per "
		  "connection)" },
	{ .env = "SDP_OFI_PORT_OFFSET", .set = "ofi_port_offset", .kind = SDP_TK_NUM,
	  .def = "1000", .lo = 1, .hi = 65534, .unit = "ports",
	  .var = &sdp_tun.ofi_port_offset,
	  .help = "between hosts: the network rendezvous of a listener on port P "
		  "listens on P plus this (modulo 65535)" },
	{ .env = "SDP_OFI_HELLO_MS", .set = "ofi_hello_ms", .kind = SDP_TK_NUM,
	  .def = "500", .lo = 1, .hi = 60000, .unit = "ms",
	  .var = &sdp_tun.ofi_hello_ms,
	  .help = "between hosts: longest wait for a server's network rendezvous "
		  "to accept the hello (then TCP, remembered for a minute)" },
	{ .env = "SDP_OFI_PROVIDER", .set = "ofi_provider", .kind = SDP_TK_NAME,
	  .def = "auto", .unit = "name", .choices = "verbs, tcp, sockets, ...",
	  .is_auto = &sdp_tun.ofi_provider_auto, .check = ofi_prov_check,
	  .help = "between hosts: the libfabric provider, auto = the first with "
		  "FI_EP_MSG, FI_MSG and FI_RMA" },
	{ .env = "SDP_AZCOPY", .set = "azcopy", .kind = SDP_TK_NUM, .def = "0",
	  .lo = 0, .hi = 1, .unit = "flag", .var = &sdp_tun.azcopy,
	  .help = "1: Asynchronous Zero Copy - a large blocking send returns at once, "
		  "its pages write-protected until the peer has read them" },
	{ .env = "SDP_AZCOPY_THRESH", .set = "azcopy_thresh", .kind = SDP_TK_NUM_AUTO,
	  .def = "auto", .lo = 4096, .hi = 1u << 30, .unit = "bytes",
	  .var = &sdp_tun.azcopy_thresh, .is_auto = &sdp_tun.azcopy_auto,
	  .help = "with SDP_AZCOPY=1: blocking sends and receives of at least this "
		  "many bytes are asynchronous; auto = measured once per host: the "
		  "smallest size whose copy costs more than protecting its pages" },
	{ .env = "SDP_AZ_FAULT", .set = "az_fault", .kind = SDP_TK_NAME, .def = "block",
	  .unit = "name", .choices = "block, copy", .is_auto = &sdp_tun.az_fault_auto,
	  .check = az_fault_check,
	  .help = "a write to a page still in flight waits until the peer has read it "
		  "(block), or copies it aside and goes on (copy); auto = block" },
	{ .env = "SDP_AZ_DEPTH", .set = "az_depth", .kind = SDP_TK_NUM, .def = "8",
	  .lo = 1, .hi = 64, .unit = "advertisements", .var = &sdp_tun.az_depth,
	  .help = "asynchronous advertisements outstanding per connection; a send "
		  "beyond them waits" },
	{ .env = "SDP_AZ_PROTECT", .set = "az_protect", .kind = SDP_TK_NAME,
	  .def = "auto", .unit = "name", .choices = "mprotect, uffd",
	  .is_auto = &sdp_tun.az_protect_auto, .check = az_protect_check,
	  .help = "how pages in flight are protected: mprotect (SIGSEGV), uffd "
		  "(userfaultfd write-protect), auto = measured at first use" },
	{ .env = "SDP_AZ_RECV", .set = "az_recv", .kind = SDP_TK_NUM, .def = "1",
	  .lo = 0, .hi = 1, .unit = "flag", .var = &sdp_tun.az_recv,
	  .help = "with SDP_AZCOPY=1 and userfaultfd: a blocking recv of advertised "
		  "data may return before the copy, its pages inaccessible until done" },
	{ .env = "SDP_AZ_RECV_MAX", .set = "az_recv_max", .kind = SDP_TK_NUM,
	  .def = "1048576", .lo = 4096, .hi = 1u << 30, .unit = "bytes",
	  .var = &sdp_tun.az_recv_max,
	  .help = "with SDP_AZ_RECV=1: only a recv into a buffer of at most this many "
		  "bytes may return before the copy (a larger one copies at once: the "
		  "progress thread's copy is slower than the recv's own)" },
	{ .env = "SDP_AZ_COOL", .set = "az_cool", .kind = SDP_TK_NUM, .def = "64",
	  .lo = 0, .hi = 65536, .unit = "sends",
	  .help = "when most of 16 asynchronous sends were written while in flight, "
		  "this many sends (doubling while it goes on) are synchronous; 0 = never",
	  .var = &sdp_tun.az_cool },
	{ .env = "SDP_AZ_POOL", .set = "az_pool", .kind = SDP_TK_NUM, .def = "4194304",
	  .lo = 0, .hi = 64u << 20, .unit = "bytes", .var = &sdp_tun.az_pool,
	  .help = "bounce buffers for copies aside (pages written or given back while "
		  "in flight), one pool per process, reused; a copy that does not fit "
		  "waits as block-on-write does; 0 = a mapping per copy" },
	{ .env = "SDP_LOG", .kind = SDP_TK_LEVEL, .def = "0", .lo = 0, .hi = 3,
	  .unit = "level", .var = &sdp_tun.log_level,
	  .help = "diagnostics on stderr (above 3: as 3)" },
	{ .env = "SDP_STATS_DIR", .kind = SDP_TK_TEXT, .def = "", .unit = "directory",
	  .help = "at exit, write COMM.PID.json with the process's totals there" },
	{ .env = "SDP_CONFIG", .kind = SDP_TK_TEXT, .def = "/etc/sdp.conf",
	  .unit = "path", .help = "the policy file (sdp run --policy sets it)" },
	{ .env = "SDP_CALIB_FILE", .kind = SDP_TK_TEXT,
	  .def = "$XDG_CACHE_HOME/sdp-calib, ~/.cache/sdp-calib or /tmp/sdp-calib.UID",
	  .unit = "path",
	  .help = "cache of the per-host measurements (copy routine, zero-copy "
		  "threshold, page-aliased zero copy, AZ threshold)" },
	{ .env = "SDP_POLICY_REPORTED", .kind = SDP_TK_TEXT, .def = "", .unit = "flag",
	  .help = "1: do not report policy problems (sdp run sets it after "
		  "reporting them once)" },
};
const size_t sdp_ntunables = sizeof sdp_tunables / sizeof sdp_tunables[0];

const char *sdp_tun_src_name(enum sdp_tun_src src)
{
	return src == SDP_TS_ENV ? "environment" : src == SDP_TS_POLICY ? "policy" :
	       "default";
}

const char *sdp_tun_range(const struct sdp_tunable *t, char *buf, size_t n)
{
	switch (t->kind) {
	case SDP_TK_NUM:
	case SDP_TK_LEVEL:
		snprintf(buf, n, "%u - %u", t->lo, t->hi);
		break;
	case SDP_TK_NUM_AUTO:
		snprintf(buf, n, "auto, or %u - %u", t->lo, t->hi);
		break;
	case SDP_TK_NAME:
		snprintf(buf, n, "auto, %s", t->choices);
		break;
	case SDP_TK_TEXT:
		snprintf(buf, n, "%s", t->unit);
		break;
	}
	return buf;
}

/* A number in [lo, hi] (decimal, 0x hex or 0 octal), or false. */
static bool parse_num(const char *v, uint32_t lo, uint32_t hi, uint32_t *out)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(v, &end, 0);
	if (errno || end == v || *end || *v == '-' || x < lo || x > hi)
		return false;
	*out = (uint32_t)x;
	return true;
}

/* Apply text v to t: false if it is not a value of t. */
static bool apply(const struct sdp_tunable *t, const char *v)
{
	uint32_t x;
	switch (t->kind) {
	case SDP_TK_NUM:
		if (!parse_num(v, t->lo, t->hi, &x))
			return false;
		*t->var = t->align ? x - x % t->align : x;
		return true;
	case SDP_TK_NUM_AUTO:
		if (!strcmp(v, "auto")) {
			*t->is_auto = 1;
			return true;
		}
		if (!parse_num(v, t->lo, t->hi, &x))
			return false;
		*t->var = x;
		*t->is_auto = 0;
		return true;
	case SDP_TK_NAME:
		if (!strcmp(v, "auto")) {
			*t->is_auto = 1;
			return true;
		}
		if (!t->check(v))
			return false;
		*t->is_auto = 0;
		return true;
	case SDP_TK_LEVEL:
		if (!parse_num(v, t->lo, UINT32_MAX, &x))
			return false;
		*t->var = x > t->hi ? t->hi : x;
		return true;
	case SDP_TK_TEXT:
		return true;
	}
	return false;
}

void sdp_tunables_load(sdp_tun_lookup lookup, void *arg, sdp_tun_report report,
		       void *report_arg, struct sdp_tun_value *vals)
{
	bool geometry_given = false;
	for (size_t i = 0; i < sdp_ntunables; i++) {
		const struct sdp_tunable *t = &sdp_tunables[i];
		struct sdp_tun_value tv = { .text = t->def, .src = SDP_TS_DEFAULT };
		const char *v = getenv(t->env);
		enum sdp_tun_src src = SDP_TS_ENV;
		if ((!v || !*v) && t->set && lookup) {
			v = lookup(t->set, arg);
			src = SDP_TS_POLICY;
		}
		apply(t, t->def);
		if (v && *v) {
			if (apply(t, v)) {
				tv.text = v;
				tv.src = src;
			} else {
				tv.given = v;
				apply(t, t->def);
				if (report) {
					char want[200];
					report(t, src, v, sdp_tun_range(t, want, sizeof want),
					       report_arg);
				}
			}
		}
		if (vals)
			vals[i] = tv;
		if ((t->var == &sdp_tun.nslots || t->var == &sdp_tun.slot_size) &&
		    tv.src != SDP_TS_DEFAULT)
			geometry_given = true;
	}
	sdp_tun.geometry_given = geometry_given;
	sdp_tun.calib_pending = sdp_tun.zcopy_auto || sdp_tun.copy_auto;
	if (sdp_tun.copy_stream_auto)
		sdp_copy_stream_mode = 0;
	if (sdp_tun.az_fault_auto)
		sdp_tun.az_fault = 0;
	if (sdp_tun.az_protect_auto)
		sdp_tun.az_protect = 0;
}
