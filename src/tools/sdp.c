/*
 * sdp.c - the `sdp` command.
 *
 *   sdp run [--policy FILE] -- CMD ARGS...   run CMD with libsdp preloaded
 *   sdp stat [--json] [--procs]              live SDP connections / processes (stat.c)
 *   sdp check [--json] [--recalibrate] [--tunables]
 *                                            what this host allows, the
 *                                            tunables in effect
 *   sdp bench ARGS...                        the benchmark suite (bench/)
 *
 * Unknown options are refused with the usage (exit 2) by every command.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sdp/az.h"
#include "sdp/pool.h"
#include "sdp/calib.h"
#include "sdp/copy.h"
#include "fabric/fabric.h"
#include "sdp/tunables.h"
#include "switch/policy.h"
#include "tools/tool.h"

void sdp_usage(void)
{
	fprintf(stderr,
		"usage: sdp run [--policy FILE] -- CMD [ARGS...]\n"
		"       sdp stat [--json] [--procs]\n"
		"       sdp check [--json] [--recalibrate] [--tunables]\n"
		"       sdp bench [--quick] [--out DIR] [--only EXP,...] [--pin]\n");
	exit(2);
}

void sdp_bad_option(const char *cmd, const char *arg)
{
	fprintf(stderr, "sdp %s: unknown option '%s'\n", cmd, arg);
	sdp_usage();
}

static char *self_dir(void)
{
	static char buf[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
	if (n <= 0)
		return NULL;
	buf[n] = 0;
	char *s = strrchr(buf, '/');
	if (s)
		*s = 0;
	return buf;
}

static char *lib_path(void)
{
	static char p[PATH_MAX + 32];
	const char *env = getenv("SDP_LIB");
	if (env && *env)
		return (char *)env;
	char *d = self_dir();
	if (!d)
		return NULL;
	snprintf(p, sizeof p, "%s/../lib/libsdp.so", d);
	char *r = realpath(p, NULL);
	return r ? r : p;
}

/* ---- run ---------------------------------------------------------------- */

static void run_policy_err(const char *msg, void *arg)
{
	(void)arg;
	fprintf(stderr, "sdp: %s (line ignored)\n", msg);
}

static int cmd_run(int argc, char **argv)
{
	int i = 0;
	const char *policy = NULL;
	for (; i < argc; i++) {
		if (!strcmp(argv[i], "--")) {
			i++;
			break;
		}
		if (!strcmp(argv[i], "--policy")) {
			if (i + 1 >= argc || !strcmp(argv[i + 1], "--")) {
				fprintf(stderr, "sdp run: --policy needs a file name\n");
				sdp_usage();
			}
			policy = argv[++i];
		} else if (!strncmp(argv[i], "--policy=", 9)) {
			policy = argv[i] + 9;
		} else if (argv[i][0] == '-') {
			sdp_bad_option("run", argv[i]);
		} else {
			break;
		}
		if (!*policy) {
			/* Not "no policy": that is what leaving it out means. */
			fprintf(stderr, "sdp run: --policy needs a file name, not an "
				"empty string\n");
			return 2;
		}
	}
	if (i >= argc) {
		fprintf(stderr, "sdp run: no command to run\n");
		sdp_usage();
	}
	char *lib = lib_path();
	if (!lib || access(lib, R_OK) != 0) {
		fprintf(stderr, "sdp: cannot find libsdp.so (looked at %s)\n",
			lib ? lib : "?");
		return 127;
	}
	const char *old = getenv("LD_PRELOAD");
	char *pre;
	if (old && *old) {
		size_t n = strlen(lib) + strlen(old) + 2;
		pre = malloc(n);
		snprintf(pre, n, "%s:%s", lib, old);
	} else {
		pre = lib;
	}
	setenv("LD_PRELOAD", pre, 1);
	if (policy) {
		char *abs = realpath(policy, NULL);
		setenv("SDP_CONFIG", abs ? abs : policy, 1);
	}
	/* Report bad policy lines once, here, rather than in every process
	 * of the command (the library stays quiet when told so). */
	const char *path = getenv("SDP_CONFIG");
	bool named = path && *path;
	if (!named)
		path = "/etc/sdp.conf";
	int err = 0;
	struct sdp_policy *p = sdp_policy_load(path, run_policy_err, NULL, &err);
	if (p)
		sdp_policy_free(p);
	else if (named)
		fprintf(stderr, "sdp: cannot use policy %s: %s; every socket stays TCP\n",
			path, sdp_policy_strerror(err));
	setenv("SDP_POLICY_REPORTED", "1", 1);
	execvp(argv[i], argv + i);
	fprintf(stderr, "sdp: %s: %s\n", argv[i], strerror(errno));
	return errno == ENOENT ? 127 : 126;
}

/* ---- check -------------------------------------------------------------- */

struct check { const char *name; bool ok; char why[400]; };

static void cma_selftest(struct check *c)
{
	c->name = "cross_memory_attach";
	static volatile char secret[64] = "sdp-cma-selftest";
	int p[2];
	if (pipe(p) < 0) {
		snprintf(c->why, sizeof c->why, "pipe: %s", strerror(errno));
		return;
	}
	pid_t child = fork();
	if (child == 0) {
		close(p[1]);
		char b;
		ssize_t r = read(p[0], &b, 1);   /* wait for the parent */
		_exit(r < 0);
	}
	close(p[0]);
	char buf[64] = { 0 };
	struct iovec l = { buf, sizeof buf }, r = { (void *)secret, sizeof buf };
	ssize_t n = process_vm_readv(child, &l, 1, &r, 1, 0);
	int e = errno;
	close(p[1]);
	waitpid(child, NULL, 0);
	if (n == (ssize_t)sizeof buf && !strcmp(buf, "sdp-cma-selftest")) {
		c->ok = true;
		snprintf(c->why, sizeof c->why, "process_vm_readv works between processes of this user");
	} else {
		snprintf(c->why, sizeof c->why, "process_vm_readv failed: %s (ptrace policy, seccomp or container)",
			 strerror(e));
	}
}

static void policy_err(const char *msg, void *arg)
{
	char *out = arg;
	size_t l = strlen(out);
	snprintf(out + l, 400 - l, "%s%s", l ? "; " : "", msg);
}

/* The per-host choices of the library (calib.c): read from its cache, or
 * measured now (and cached) as the library would at its first connection. */
static void host_report(bool json, bool force, int az_mech)
{
	struct sdp_calib cal;
	const char *ss = getenv("SDP_SLOT_SIZE");
	uint32_t slot = ss && atoi(ss) >= 1024 ? (uint32_t)atoi(ss) & ~63u : 32768;
	sdp_calib_get_az(slot, force, &cal);
	/* The AZ threshold: measured for the mechanism a process would use,
	 * unless SDP_AZCOPY_THRESH (or the policy) gives one. */
	struct sdp_az_choice w;
	uint32_t azt = sdp_calib_az_thresh(&cal, az_mech, &w);
	if (!w.thresh && cal.naz > 0) {          /* never: the largest size says why */
		int i = cal.naz - 1;
		w.below_pages = cal.az[i].bytes / 4096;
		w.below_copy_us = cal.az[i].copy_us;
		w.below_cycle_us = az_mech == AZ_MECH_UFFD ? cal.az[i].uffd_us :
				   cal.az[i].mprotect_us;
	}
	const char *az_src = cal.faked ? "simulated" : cal.cached ? "cache" : "measured";
	if (!sdp_tun.azcopy_auto) {
		azt = sdp_tun.azcopy_thresh;
		az_src = "SDP_AZCOPY_THRESH";
	}
	const char *az_mname = az_mech == AZ_MECH_UFFD ? "uffd" : "mprotect";
	const char *env = getenv("SDP_COPY");
	const char *routine = cal.copy, *source = cal.faked ? "simulated" :
			      cal.cached ? "cache" : "measured";
	if (env && *env && strcmp(env, "auto")) {
		const struct sdp_copy_impl *ci = sdp_copy_find(env);
		if (ci && ci->usable()) {
			routine = ci->name;
			source = "SDP_COPY";
		}
	}
	const char *model = strchr(cal.host, '|');
	model = model ? model + 1 : "?";
	struct sdp_cross_copy xc;
	sdp_copy_use(routine);
	bool have_xc = sdp_cross_copy(&xc) == 0;
	const char *smode = getenv("SDP_COPY_STREAM");
	if (!smode || (strcmp(smode, "on") && strcmp(smode, "off")))
		smode = "auto";
	if (json) {
		printf("\"host\": {\"cpu\": \"%s\", \"kernel\": \"%.*s\", "
		       "\"copy\": {\"routine\": \"%s\", \"source\": \"%s\", \"gbps\": {",
		       model, (int)strcspn(cal.host, "|"), cal.host, routine, source);
		for (int i = 0; i < cal.ncopy; i++)
			printf("%s\"%s\": %.2f", i ? ", " : "", cal.copy_speed[i].name,
			       cal.copy_speed[i].gbps);
		printf("}, \"stream\": {\"mode\": \"%s\", \"min_bytes\": %d", smode,
		       SDP_STREAM_MIN);
		if (have_xc)
			printf(", \"cpus\": [%d, %d], \"plain_gbps\": %.2f, \"stream_gbps\": %.2f",
			       xc.cpu_a, xc.cpu_b, xc.plain_gbps, xc.stream_gbps);
		printf("}}, \"zcopy\": {\"cma\": %s, \"threshold\": %u, \"page_aliased\": \"%s\", "
		       "\"cma_gbps_same_offset\": %.2f, \"cma_gbps_shifted\": %.2f}, ",
		       cal.cma_ok ? "true" : "false", cal.zcopy_thresh,
		       cal.cma_alias ? "bounce" : "direct", cal.cma_gbps_same,
		       cal.cma_gbps_shifted);
		/* The AZ threshold, the two costs that decided it (at the
		 * threshold and the size below it) and every size measured. */
		printf("\"az_threshold\": {\"threshold\": %u, \"source\": \"%s\", "
		       "\"protect\": \"%s\", \"measured\": %u", azt, az_src, az_mname, w.thresh);
		if (w.at_pages)
			printf(", \"at\": {\"pages\": %u, \"bytes\": %u, \"copy_us\": %.2f, "
			       "\"cycle_us\": %.2f}", w.at_pages, w.at_pages * 4096, w.at_copy_us,
			       w.at_cycle_us);
		else
			printf(", \"at\": null");
		if (w.below_pages)
			printf(", \"below\": {\"pages\": %u, \"bytes\": %u, \"copy_us\": %.2f, "
			       "\"cycle_us\": %.2f}", w.below_pages, w.below_pages * 4096,
			       w.below_copy_us, w.below_cycle_us);
		else
			printf(", \"below\": null");
		printf(", \"sizes\": [");
		for (int i = 0; i < cal.naz; i++)
			printf("%s{\"bytes\": %u, \"copy_us\": %.2f, \"mprotect_us\": %.2f, "
			       "\"uffd_us\": %.2f}", i ? ", " : "", cal.az[i].bytes,
			       cal.az[i].copy_us, cal.az[i].mprotect_us, cal.az[i].uffd_us);
		printf("]}, \"cache\": \"%s\"}, ", cal.path);
		return;
	}
	printf("%-20s %s (kernel %.*s)\n", "host", model, (int)strcspn(cal.host, "|"), cal.host);
	printf("%-20s %s (%s;", "copy_routine", routine, source);
	for (int i = 0; i < cal.ncopy; i++)
		printf(" %s %.1f", cal.copy_speed[i].name, cal.copy_speed[i].gbps);
	printf(" GB/s through a ring)\n");
	printf("%-20s %s (copies of %d bytes and more into shared memory", "copy_stream", smode,
	       SDP_STREAM_MIN);
	if (have_xc)
		printf("; now, CPU %d to CPU %d: plain stores %.1f GB/s, streaming %.1f GB/s%s",
		       xc.cpu_a, xc.cpu_b, xc.plain_gbps, xc.stream_gbps,
		       !strcmp(smode, "auto") ? (xc.stream_gbps > xc.plain_gbps ?
						 ": streaming pays" : ": plain pays") : "");
	printf(")\n");
	printf("%-20s %u bytes%s; page-aliased transfers %s (CMA 64 KiB: %.1f GB/s same "
	       "offset, %.1f shifted)\n", "zcopy_threshold", cal.zcopy_thresh,
	       cal.zcopy_thresh ? "" : " (never)", cal.cma_alias ? "bounced" : "direct",
	       cal.cma_gbps_same, cal.cma_gbps_shifted);
	printf("%-20s %u bytes%s (%s", "azcopy_threshold", azt,
	       azt ? "" : " (never: a copy costs less than protecting the pages)", az_src);
	if (w.at_pages)
		printf("; %s: %u whole pages copy %.1f us > cycle %.1f us", az_mname, w.at_pages,
		       w.at_copy_us, w.at_cycle_us);
	if (w.below_pages)
		printf("%s %u pages copy %.1f us <= cycle %.1f us", w.at_pages ? "," : ";",
		       w.below_pages, w.below_copy_us, w.below_cycle_us);
	printf(")\n");
	printf("%-20s %s\n", "calibration_cache", cal.path);
}

/* A JSON string: quotes, backslashes and control characters escaped. */
static void json_str(const char *s)
{
	putchar('"');
	for (; s && *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			printf("\\%c", ch);
		else if (ch < 0x20)
			printf("\\u%04x", ch);
		else
			putchar(ch);
	}
	putchar('"');
}

static const char *tun_policy_set(const char *name, void *arg)
{
	const char *v = NULL;
	sdp_policy_setting(arg, name, &v);
	return v;
}

static void tun_report_quiet(const struct sdp_tunable *t, enum sdp_tun_src src,
			     const char *v, const char *want, void *arg)
{
	(void)t;
	(void)src;
	(void)v;
	(void)want;
	(void)arg;
}

/* The library's tunables (sdp/tunables.c) as it would resolve them in
 * this environment: the value in effect and where it came from. */
static void tunables_report(bool json)
{
	const char *path = getenv("SDP_CONFIG");
	if (!path || !*path)
		path = "/etc/sdp.conf";
	int err = 0;
	struct sdp_policy *p = sdp_policy_load(path, NULL, NULL, &err);
	struct sdp_tun_value v[sdp_ntunables];
	sdp_tunables_load(p ? tun_policy_set : NULL, p, tun_report_quiet, NULL, v);
	char range[200];
	if (json) {
		printf("\"tunables\": [");
		for (size_t i = 0; i < sdp_ntunables; i++) {
			const struct sdp_tunable *t = &sdp_tunables[i];
			printf("%s{\"env\": ", i ? ", " : "");
			json_str(t->env);
			printf(", \"set\": ");
			if (t->set)
				json_str(t->set);
			else
				printf("null");
			printf(", \"value\": ");
			json_str(v[i].text);
			printf(", \"source\": \"%s\", \"default\": ", sdp_tun_src_name(v[i].src));
			json_str(t->def);
			printf(", \"range\": ");
			json_str(sdp_tun_range(t, range, sizeof range));
			printf(", \"unit\": ");
			json_str(t->unit);
			if (v[i].given) {
				printf(", \"rejected\": ");
				json_str(v[i].given);
			}
			printf(", \"help\": ");
			json_str(t->help);
			printf("}");
		}
		printf("]");
	} else {
		printf("%-20s %-13s %-14s %s\n", "TUNABLE", "SET NAME", "SOURCE", "VALUE");
		for (size_t i = 0; i < sdp_ntunables; i++) {
			const struct sdp_tunable *t = &sdp_tunables[i];
			printf("%-20s %-13s %-14s %s%s%s%s\n", t->env, t->set ? t->set : "-",
			       sdp_tun_src_name(v[i].src), v[i].text[0] ? v[i].text : "(unset)",
			       v[i].given ? " (ignored: " : "", v[i].given ? v[i].given : "",
			       v[i].given ? ")" : "");
			bool num = t->kind != SDP_TK_TEXT && t->kind != SDP_TK_NAME;
			printf("    %s; %s %s%s%s, default %s\n", t->help,
			       t->kind == SDP_TK_TEXT ? "a" : "range",
			       sdp_tun_range(t, range, sizeof range), num ? " " : "",
			       num ? t->unit : "", t->def[0] ? t->def : "unset");
		}
	}
	if (p)
		sdp_policy_free(p);
}

/* The libfabric providers this host has, and whether each offers what
 * SDP between hosts needs (fabric/ofi_lib.c). */


static void ofi_report(bool json)
{
#ifdef SDP_HAVE_OFI
	struct fab_prov_info pv[32];
	int n = fab_list_libfabric(pv, 32);
	if (json) {
		printf(", \"ofi\": {\"libfabric\": %s, \"providers\": [", n < 0 ? "false" : "true");
		for (int i = 0; i < n; i++) {
			printf("%s{\"name\": ", i ? ", " : "");
			json_str(pv[i].name);
			printf(", \"fabric\": ");
			json_str(pv[i].fabric);
			printf(", \"domain\": ");
			json_str(pv[i].domain);
			printf(", \"ep_msg\": %s, \"msg\": %s, \"rma\": %s, \"mr_mode\": [%s], "
			       "\"usable\": %s, \"why\": ", pv[i].msg_ep ? "true" : "false",
			       pv[i].msg ? "true" : "false", pv[i].rma ? "true" : "false",
			       pv[i].mr_mode,
			       pv[i].usable ? "true" : "false");
			json_str(pv[i].why);
			printf("}");
		}
		printf("]}");
		return;
	}
	if (n < 0) {
		printf("%-20s      libfabric.so.1 not found: peers on other hosts use TCP\n", "ofi");
		return;
	}
	for (int i = 0; i < n; i++)
		printf("%-20s %-4s %s %s (%s)%s%s\n", i ? "" : "ofi providers",
		       pv[i].usable ? "ok" : "no", pv[i].name, pv[i].fabric, pv[i].domain,
		       pv[i].usable ? "" : ": ", pv[i].why);
#else
	if (json)
		printf(", \"ofi\": {\"libfabric\": false, \"providers\": [], "
		       "\"why\": \"built without libfabric's headers\"}");
	else
		printf("%-20s      built without libfabric's headers: peers on other hosts use TCP\n",
		       "ofi");
#endif
}

static int cmd_check(int argc, char **argv)
{
	bool json = false, recal = false, tunables = false;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = true;
		else if (!strcmp(argv[i], "--recalibrate"))
			recal = true;
		else if (!strcmp(argv[i], "--tunables"))
			tunables = true;
		else
			sdp_bad_option("check", argv[i]);
	}
	if (tunables) {
		if (json)
			printf("{");
		tunables_report(json);
		printf(json ? "}\n" : "");
		return 0;
	}
	struct check ck[8];
	int n = 0;
	memset(ck, 0, sizeof ck);

	char *lib = lib_path();
	ck[n].name = "libsdp";
	ck[n].ok = lib && access(lib, R_OK) == 0;
	snprintf(ck[n].why, sizeof ck[n].why, "%s", lib ? lib : "not found");
	n++;

	ck[n].name = "memfd";
	int mfd = (int)syscall(SYS_memfd_create, "sdp-check", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	ck[n].ok = mfd >= 0 && fcntl(mfd, F_ADD_SEALS, F_SEAL_GROW) == 0;
	snprintf(ck[n].why, sizeof ck[n].why, "%s", ck[n].ok ? "sealed memfd available"
		 : strerror(errno));
	if (mfd >= 0)
		close(mfd);
	n++;

	ck[n].name = "rendezvous";
	int s = socket(AF_UNIX, SOCK_SEQPACKET, 0);
	ck[n].ok = s >= 0;
	snprintf(ck[n].why, sizeof ck[n].why, "%s", s >= 0 ? "abstract AF_UNIX seqpacket sockets available"
		 : strerror(errno));
	if (s >= 0)
		close(s);
	n++;

	cma_selftest(&ck[n++]);

	ck[n].name = "ptrace_scope";
	FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "r");
	int scope = -1;
	if (f) {
		if (fscanf(f, "%d", &scope) != 1)
			scope = -1;
		fclose(f);
	}
	ck[n].ok = scope <= 1;
	if (scope < 0)
		snprintf(ck[n].why, sizeof ck[n].why, "Yama not enabled: no extra ptrace restriction");
	else
		snprintf(ck[n].why, sizeof ck[n].why, "kernel.yama.ptrace_scope=%d%s", scope,
			 scope >= 2 ? ": Cross Memory Attach needs CAP_SYS_PTRACE" :
			 scope == 1 ? ": zero copy only towards descendant processes, "
				      "others fall back to Buffer Copy" : "");
	n++;

	ck[n].name = "policy";
	const char *path = getenv("SDP_CONFIG");
	if (!path || !*path)
		path = "/etc/sdp.conf";
	char errs[400] = "";
	int err = 0;
	struct sdp_policy *p = sdp_policy_load(path, policy_err, errs, &err);
	if (p) {
		ck[n].ok = errs[0] == 0;
		snprintf(ck[n].why, sizeof ck[n].why, "%s: %d rule(s)%s%.120s", path,
			 sdp_policy_nrules(p), errs[0] ? "; " : "", errs);
		sdp_policy_free(p);
	} else if (getenv("SDP_CONFIG") && *getenv("SDP_CONFIG")) {
		ck[n].ok = false;
		snprintf(ck[n].why, sizeof ck[n].why, "%s: %s -> every socket stays TCP",
			 path, sdp_policy_strerror(err));
	} else {
		ck[n].ok = true;
		snprintf(ck[n].why, sizeof ck[n].why, "%s: %s -> SDP wherever the peer supports it",
			 path, sdp_policy_strerror(err));
	}
	n++;

	/* Asynchronous zero copy: zero copy, and pages that can be protected
	 * (mprotect always can; userfaultfd as measured). */
	struct az_calib az;
	sdp_tunables_load(NULL, NULL, NULL, NULL, NULL);
	az_calibrate(&az, true);
	ck[n].name = "async_zero_copy";
	ck[n].ok = ck[3].ok && az.mprotect_us > 0;
	snprintf(ck[n].why, sizeof ck[n].why, "protects with %s (%s); faults %.1f us "
		 "(mprotect), %.1f us (userfaultfd)%s%s",
		 az.choice == AZ_MECH_UFFD ? "userfaultfd" : "mprotect", az.why,
		 az.mprotect_fault_us, az.uffd_fault_us, az.uffd_ok ? "" : "; ",
		 az.uffd_ok ? "" : az.uffd_why);
	int azk = n++;

	bool cma = ck[3].ok;
	if (json) {
		printf("{\"features\": [\"bcopy\"%s%s], ", cma ? ", \"zcopy\"" : "",
		       ck[azk].ok ? ", \"azcopy\"" : "");
		printf("\"azcopy\": {\"protect\": \"%s\", \"why\": \"%s\", "
		       "\"uffd\": %s, \"mprotect_cycle_us\": %.2f, \"uffd_cycle_us\": %.2f, "
		       "\"mprotect_fault_us\": %.2f, \"uffd_fault_us\": %.2f}, ",
		       az.choice == AZ_MECH_UFFD ? "uffd" : "mprotect", az.why,
		       az.uffd_ok ? "true" : "false", az.mprotect_us, az.uffd_us,
		       az.mprotect_fault_us, az.uffd_fault_us);
		host_report(true, recal, az.choice);
		tunables_report(true);
		ofi_report(true);
		printf(", \"checks\": {");
		for (int i = 0; i < n; i++)
			printf("%s\"%s\": {\"ok\": %s, \"why\": \"%s\"}", i ? ", " : "",
			       ck[i].name, ck[i].ok ? "true" : "false", ck[i].why);
		printf("}}\n");
	} else {
		for (int i = 0; i < n; i++)
			printf("%-20s %-4s %s\n", ck[i].name, ck[i].ok ? "ok" : "no", ck[i].why);
		printf("%-20s      bcopy%s%s\n", "features",
		       cma ? " zcopy" : " (zero copy unavailable: see cross_memory_attach)",
		       ck[azk].ok ? " azcopy" : "");
		host_report(false, recal, az.choice);
		ofi_report(false);
	}
	return 0;
}

/* ---- bench -------------------------------------------------------------- */

static int cmd_bench(int argc, char **argv)
{
	char script[PATH_MAX + 64];
	char *d = self_dir();
	snprintf(script, sizeof script, "%s/../../bench/sdp_bench.py", d ? d : ".");
	if (access(script, R_OK) != 0)
		snprintf(script, sizeof script, "%s/bench/sdp_bench.py", SDP_SOURCE_DIR);
	char **av = calloc((size_t)argc + 3, sizeof *av);
	av[0] = "python3";
	av[1] = script;
	for (int i = 0; i < argc; i++)
		av[i + 2] = argv[i];
	execvp("python3", av);
	fprintf(stderr, "sdp: python3: %s\n", strerror(errno));
	return 127;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		sdp_usage();
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 2, argv + 2);
	if (!strcmp(argv[1], "stat"))
		return sdp_cmd_stat(argc - 2, argv + 2);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 2, argv + 2);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 2, argv + 2);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		sdp_usage();
	fprintf(stderr, "sdp: unknown command '%s'\n", argv[1]);
	sdp_usage();
}
