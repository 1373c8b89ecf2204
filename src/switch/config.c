/*
 * config.c - start-up of the switch: resolve the real libc entry points,
 * read tunables from the environment and the policy file, create the
 * connection pool, and answer "SDP or TCP?" for a socket. A process started
 * under a seccomp filter does none of this: it passes every call through
 * (sandbox.c).
 *
 * Policy file: --policy FILE (sdp run sets SDP_CONFIG), else $SDP_CONFIG,
 * else /etc/sdp.conf. With none, every connection uses SDP when the peer
 * supports it. Tunables: environment first, then `set` lines of the policy.
 *   SDP_SPIN_US       busy-poll before blocking (default 40)
 *   SDP_ZCOPY_THRESH  zero-copy threshold in bytes, 0 = off, or auto
 *                     (default: measured once per host, calib.c)
 *   SDP_ZCOPY_CHUNK   bytes per SrcAvail in Pipelined mode (1 MiB)
 *   SDP_ZCOPY_DEPTH   SrcAvails outstanding (4; 1 = Combined mode)
 *   SDP_ZCOPY_TAIL    end of a large send sent by Buffer Copy, when
 *                     spinning is off (256 KiB)
 *   SDP_NSLOTS        receive buffers per direction (default 64)
 *   SDP_SLOT_SIZE     bytes per receive buffer (default 32768)
 *   SDP_REGION_CACHE  connection regions kept for reuse per process (8; 0 = none)
 *   SDP_CALIB_FILE    where the measured threshold is cached
 *   SDP_LOG           0..3
 *   SDP_STATS_DIR     write per-process totals there at exit
 *   SDP_POLICY_REPORTED  set by `sdp run`: bad policy lines already shown
 */
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdp/copy.h"
#include "switch/switch.h"
#include "sdp/sys.h"

#define X(ret, name, args) ret (*real_##name) args;
REAL_FUNCS(X)
#undef X

int sdp_inited;
int sdp_log_level;
const char *sdp_prog = "";
struct sdp_tunables sdp_tun = {
	.spin_us = 40,
	.zcopy_thresh = 0,
	.zcopy_chunk = 1u << 20,
	.zcopy_depth = 4,
	.zcopy_tail = 256u << 10,
	.nslots = 64,
	.slot_size = 32768,
};

static struct sdp_policy *policy;
static bool have_policy;
static char policy_path[512];           /* for reasons in the log */
static int policy_error;                /* why a named policy is unusable */
static _Atomic int init_state;          /* 0 new, 1 running, 2 done */
static __thread int init_thread;

void sdp_logf(const char *fmt, ...)
{
	char buf[1024];
	int n = snprintf(buf, sizeof buf, "sdp[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	ssize_t w = syscall(SYS_write, 2, buf, (size_t)n);
	(void)w;
}

static __thread char why_buf[200];

void sdp_whyf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why_buf, sizeof why_buf, fmt, ap);
	va_end(ap);
}

const char *sdp_why_take(void)
{
	static __thread char taken[sizeof why_buf];
	if (!why_buf[0])
		return NULL;
	memcpy(taken, why_buf, sizeof taken);
	why_buf[0] = 0;
	return taken;
}

static void policy_err(const char *msg, void *arg)
{
	(void)arg;
	char buf[1200];
	int n = snprintf(buf, sizeof buf, "sdp: %s (line ignored)\n", msg);
	ssize_t w = syscall(SYS_write, 2, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
	(void)w;
}

static uint32_t tun_get(const char *env, const char *set, uint32_t def,
			uint32_t lo, uint32_t hi)
{
	const char *v = getenv(env);
	unsigned long line = 0;           /* > 0: from that line of the policy */
	if ((!v || !*v) && policy)
		sdp_policy_setting_at(policy, set, &v, &line);
	if (!v || !*v)
		return def;
	char *end;
	unsigned long x = strtoul(v, &end, 0);
	if (*end || x < lo || x > hi) {
		if (line)
			sdp_logf("%s:%lu: ignoring set %s %s (want %u..%u)",
				 sdp_policy_file(policy), line, set, v, lo, hi);
		else
			sdp_logf("ignoring %s=%s (want %u..%u)", env, v, lo, hi);
		return def;
	}
	return (uint32_t)x;
}

/* Settings valid one by one that cannot work together are refused here,
 * at start-up, naming them - not later by the peer, one connection at a
 * time. */
static void tun_refuse_unworkable(void)
{
	if (shm_region_fits(sdp_tun.nslots, sdp_tun.slot_size))
		return;
	sdp_logf("refusing SDP_NSLOTS=%u with SDP_SLOT_SIZE=%u (nslots, slot_size): "
		 "a connection needs 2 x %u x %u bytes, more than the %llu GiB a peer "
		 "maps; using %u x %u", sdp_tun.nslots, sdp_tun.slot_size,
		 sdp_tun.nslots, sdp_tun.slot_size, SHM_MEMFD_MAX >> 30, 64u, 32768u);
	sdp_tun.nslots = 64;
	sdp_tun.slot_size = 32768;
}

static void at_exit(void)
{
	/* Under seccomp they were written before the filter (sandbox.c). */
	if (!atomic_load(&sdp_passthru))
		sdp_proc_write_stats(getenv("SDP_STATS_DIR"));
}

pid_t sdp_pid;

static void atfork_child(void)
{
	if (atomic_load(&sdp_passthru))
		return;                       /* forked under a filter: no calls */
	sdp_pid = getpid();
	sdp_pool_atfork_child();
}

static void do_init(void)
{
#define X(ret, name, args) real_##name = (ret (*) args)dlsym(RTLD_NEXT, #name);
	REAL_FUNCS(X)
#undef X
	const char *l = getenv("SDP_LOG");
	sdp_log_level = l ? atoi(l) : 0;
	/* Started under a seccomp filter (exec keeps it): the library steps
	 * aside before making any call the filter may not allow. */
	if (sdp_seccomp_at_start()) {
		atomic_store(&sdp_passthru, 1);
		fd_passthru();
		sdp_inited = 1;
		sdp_log(1, "seccomp filter in place at start-up: libsdp passes every call through");
		return;
	}
	/* From here on wrappers called by our own start-up (the policy file
	 * is read with read()) pass straight through. */
	sdp_pid = getpid();
	sdp_inited = 1;
	extern char *program_invocation_short_name;
	sdp_prog = program_invocation_short_name ? program_invocation_short_name : "";

	const char *path = getenv("SDP_CONFIG");
	bool explicit = path && *path;
	if (!explicit)
		path = "/etc/sdp.conf";
	int err = 0;
	/* `sdp run` reported bad lines already: say them once, not per process. */
	const char *rep = getenv("SDP_POLICY_REPORTED");
	bool quiet = rep && *rep == '1';
	snprintf(policy_path, sizeof policy_path, "%s", path);
	policy = sdp_policy_load(path, quiet ? NULL : policy_err, NULL, &err);
	if (policy) {
		have_policy = true;
	} else if (explicit) {
		policy_error = err;
		if (!quiet)
			sdp_logf("cannot use policy %s: %s; every socket stays TCP", path,
				 sdp_policy_strerror(err));
		have_policy = true;        /* a named but unusable policy: TCP */
	}
	sdp_tun.spin_us = tun_get("SDP_SPIN_US", "spin_us", sdp_tun.spin_us, 0, 1000000);
	/* Zero-copy threshold: bytes, 0 = off, or "auto" (the default):
	 * the crossover measured on this host (calib.c). */
	const char *zt = getenv("SDP_ZCOPY_THRESH");
	if ((!zt || !*zt) && policy)
		sdp_policy_setting(policy, "zcopy_thresh", &zt);
	if (!zt || !*zt || !strcmp(zt, "auto"))
		sdp_tun.zcopy_auto = 1;       /* measured at the first connection */
	else
		sdp_tun.zcopy_thresh = tun_get("SDP_ZCOPY_THRESH", "zcopy_thresh",
					       0, 0, UINT32_MAX);
	/* Copy routine for stream bytes: a name of copy.c, or "auto" (the
	 * default): the fastest measured on this host (calib.c). */
	const char *cp = getenv("SDP_COPY");
	unsigned long cp_line = 0;            /* > 0: from that line of the policy */
	if ((!cp || !*cp) && policy)
		sdp_policy_setting_at(policy, "copy", &cp, &cp_line);
	if (!cp || !*cp || !strcmp(cp, "auto"))
		sdp_tun.copy_auto = 1;        /* chosen at the first connection */
	else if (!sdp_copy_use(cp)) {
		if (cp_line)
			sdp_logf("%s:%lu: set copy %s: unknown or not supported by this "
				 "CPU; choosing automatically", sdp_policy_file(policy),
				 cp_line, cp);
		else
			sdp_logf("SDP_COPY=%s: unknown or not supported by this CPU; "
				 "choosing automatically", cp);
		sdp_tun.copy_auto = 1;
	}
	sdp_tun.calib_pending = sdp_tun.zcopy_auto || sdp_tun.copy_auto;
	sdp_tun.zcopy_chunk = tun_get("SDP_ZCOPY_CHUNK", "zcopy_chunk",
				      sdp_tun.zcopy_chunk, 4096, 1u << 30);
	sdp_tun.zcopy_depth = tun_get("SDP_ZCOPY_DEPTH", "zcopy_depth",
				      sdp_tun.zcopy_depth, 1, 64);
	sdp_tun.zcopy_tail = tun_get("SDP_ZCOPY_TAIL", "zcopy_tail",
				     sdp_tun.zcopy_tail, 0, 1u << 30);
	sdp_tun.nslots = tun_get("SDP_NSLOTS", "nslots", sdp_tun.nslots, 2, 4096);
	sdp_tun.slot_size = tun_get("SDP_SLOT_SIZE", "slot_size", sdp_tun.slot_size,
				    1024, 1u << 22) & ~63u;
	tun_refuse_unworkable();
	shm_region_tune(tun_get("SDP_REGION_CACHE", "region_cache", 8, 0, 64));
	int r = sdp_pool_init();
	if (r < 0)
		sdp_logf("connection pool unavailable (%s): all sockets stay TCP",
			 strerror(-r));
	pthread_atfork(NULL, NULL, atfork_child);
	atexit(at_exit);
	sdp_log(1, "libsdp loaded in %s: spin %uus, %u x %u B buffers, policy %s",
		sdp_prog, sdp_tun.spin_us, sdp_tun.nslots, sdp_tun.slot_size,
		have_policy ? path : "(none: SDP wherever possible)");
}

void sdp_init(void)
{
	int st = atomic_load(&init_state);
	if (st == 2 || init_thread)
		return;
	st = 0;
	if (atomic_compare_exchange_strong(&init_state, &st, 1)) {
		init_thread = 1;
		do_init();
		init_thread = 0;
		atomic_store(&init_state, 2);
		return;
	}
	while (atomic_load(&init_state) != 2)
		sched_yield();
}

__attribute__((constructor)) static void sdp_ctor(void)
{
	sdp_init();
}

enum sdp_use sdp_decide(enum sdp_role role, const struct sockaddr *a, socklen_t l)
{
	return sdp_decide_why(role, a, l, NULL, 0);
}

enum sdp_use sdp_decide_why(enum sdp_role role, const struct sockaddr *a,
			    socklen_t l, char *why, size_t n)
{
	if (atomic_load_explicit(&sdp_passthru, memory_order_relaxed)) {
		if (why)
			snprintf(why, n, "the process is under a seccomp filter: "
				 "libsdp passes every call through");
		return SDP_USE_TCP;
	}
	if (!have_policy)
		return SDP_USE_BOTH;
	if (!policy) {
		if (why)
			snprintf(why, n, "policy %s unusable (%s): every socket stays TCP",
				 policy_path, sdp_policy_strerror(policy_error));
		return SDP_USE_TCP;
	}
	unsigned long line;
	enum sdp_use u = sdp_policy_lookup(policy, role, sdp_prog, a, l, &line);
	if (u == SDP_USE_TCP && why) {
		if (line)
			snprintf(why, n, "policy %s:%lu says tcp", policy_path, line);
		else
			snprintf(why, n, "no rule of policy %s matches this %s, program "
				 "and address (default tcp)", policy_path,
				 role == SDP_ROLE_SERVER ? "server" : "client");
	}
	return u;
}
