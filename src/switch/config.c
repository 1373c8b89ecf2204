/*
 * config.c - start-up of the switch: resolve the real libc entry points,
 * read the policy file and the tunables, create the connection pool, and
 * answer "SDP or TCP?" for a socket. A process started under a seccomp
 * filter does none of this: it passes every call through (sandbox.c).
 *
 * Policy file: --policy FILE (sdp run sets SDP_CONFIG), else $SDP_CONFIG,
 * else /etc/sdp.conf. With none, every connection uses SDP when the peer
 * supports it. Tunables: the engine's table (sdp/tunables.c), resolved
 * from the environment first, then the `set` lines of the policy.
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

#include "sdp/az.h"
#include "sdp/calib.h"
#include "sdp/copy.h"
#include "sdp/wake.h"
#include "switch/switch.h"
#include "sdp/sys.h"

#define X(ret, name, args) ret (*real_##name) args;
REAL_FUNCS(X)
#undef X

int sdp_inited;
const char *sdp_prog = "";

static struct sdp_policy *policy;
static bool have_policy;
static char policy_path[512];           /* for reasons in the log */
static int policy_error;                /* why a named policy is unusable */
static _Atomic int init_state;          /* 0 new, 1 running, 2 done */
static __thread int init_thread;

static void policy_err(const char *msg, void *arg)
{
	(void)arg;
	char buf[1200];
	int n = snprintf(buf, sizeof buf, "sdp: %s (line ignored)\n", msg);
	ssize_t w = syscall(SYS_write, 2, buf, (size_t)(n < (int)sizeof buf ? n : (int)sizeof buf - 1));
	(void)w;
}

/* A tunable's `set` line in the policy, for sdp_tunables_load. */
static const char *policy_set(const char *name, void *arg)
{
	const char *v = NULL;
	sdp_policy_setting(arg, name, &v);
	return v;
}

/* A rejected value, said as the environment variable or the policy line
 * that gave it. */
static void tun_report(const struct sdp_tunable *t, enum sdp_tun_src src,
		       const char *v, const char *want, void *arg)
{
	(void)arg;
	const char *pv;
	unsigned long line = 0;
	if (src == SDP_TS_POLICY && policy)
		sdp_policy_setting_at(policy, t->set, &pv, &line);
	if (t->kind == SDP_TK_NAME) {
		if (line)
			sdp_logf("%s:%lu: set %s %s: unknown or not supported here (want "
				 "%s); choosing automatically", sdp_policy_file(policy),
				 line, t->set, v, want);
		else
			sdp_logf("%s=%s: unknown or not supported here (want %s); "
				 "choosing automatically", t->env, v, want);
	} else if (line) {
		sdp_logf("%s:%lu: ignoring set %s %s (want %s)", sdp_policy_file(policy),
			 line, t->set, v, want);
	} else {
		sdp_logf("ignoring %s=%s (want %s)", t->env, v, want);
	}
}

/* Settings valid one by one that cannot work together are refused here,
 * at start-up, naming them - not later by the peer, one connection at a
 * time. */
static void tun_refuse_unworkable(void)
{
	if (fab_fits(sdp_tun.nslots, sdp_tun.slot_size))
		return;
	sdp_logf("refusing SDP_NSLOTS=%u with SDP_SLOT_SIZE=%u (nslots, slot_size): "
		 "a connection needs 2 x %u x %u bytes, more than a peer maps; "
		 "using %u x %u", sdp_tun.nslots, sdp_tun.slot_size,
		 sdp_tun.nslots, sdp_tun.slot_size, 64u, 32768u);
	sdp_tun.nslots = 64;
	sdp_tun.slot_size = 32768;
}

static void at_exit(void)
{
	/* Under seccomp they were written before the filter (sandbox.c). */
	if (!atomic_load(&sdp_passthru)) {
		az_at_exit();                 /* peers read what we advertised */
		sdp_proc_write_stats(getenv("SDP_STATS_DIR"));
	}
}

static void atfork_child(void)
{
	spawn_fork_child();               /* locks another thread may have held */
	sandbox_fork_child();
	if (atomic_load(&sdp_passthru))
		return;                       /* forked under a filter: no calls */
	sdp_pid = getpid();
	sdp_pool_atfork_child();
	sdp_wake_atfork_child();
}

static void do_init(void)
{
#define X(ret, name, args) real_##name = (ret (*) args)dlsym(RTLD_NEXT, #name);
	REAL_FUNCS(X)
#undef X
	/* The tunables as the environment alone says (quietly: they are
	 * read again with the policy below), for the log level at once. */
	sdp_tunables_load(NULL, NULL, NULL, NULL, NULL);
	sdp_log_level = (int)sdp_tun.log_level;
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
	sdp_tunables_load(policy ? policy_set : NULL, policy, tun_report, NULL, NULL);
	sdp_calib_env();
	sdp_log_level = (int)sdp_tun.log_level;
	tun_refuse_unworkable();
	struct fab_params fp = {
		.region_cache = sdp_tun.region_cache,
		.ofi_port_offset = sdp_tun.ofi_port_offset,
		.ofi_hello_ms = sdp_tun.ofi_hello_ms,
		.ofi_provider = sdp_tun.ofi_provider_auto ? NULL : sdp_ofi_provider,
		.ring_start = sdp_tun.ring_start,
		.idle_trim_ms = sdp_tun.idle_trim_ms,
		.log = sdp_log_at,
	};
	fab_init(&fp);
	sdp_az_switch_init();
	fd_locks_init();
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

enum sdp_use sdp_decide(enum sdp_role role, const struct sockaddr *a, socklen_t l,
			enum fab_pref *fabric, char *why, size_t n)
{
	*fabric = FAB_PREF_ANY;
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
	enum sdp_use u = sdp_policy_lookup(policy, role, sdp_prog, a, l, &line, fabric);
	if (*fabric == FAB_PREF_TCP)
		u = SDP_USE_TCP;
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
