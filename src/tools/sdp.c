/*
 * sdp.c - the `sdp` command.
 *
 *   sdp run [--policy FILE] -- CMD ARGS...   run CMD with libsdp preloaded
 *   sdp stat [--json] [--procs]              live SDP connections / processes
 *   sdp check [--json] [--tunables]          what this host allows, the
 *                                            tunables in effect
 *   sdp bench ARGS...                        the benchmark suite (bench/)
 */
#include <arpa/inet.h>
#include <dirent.h>
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

#include "sdp/pool.h"
#include "sdp/calib.h"
#include "sdp/tunables.h"
#include "switch/policy.h"

static void usage(void)
{
	fprintf(stderr,
		"usage: sdp run [--policy FILE] -- CMD [ARGS...]\n"
		"       sdp stat [--json] [--procs]\n"
		"       sdp check [--json] [--recalibrate] [--tunables]\n"
		"       sdp bench [--quick] [--out DIR] [--only EXP,...] [--pin]\n");
	exit(2);
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
		if (!strcmp(argv[i], "--policy") && i + 1 < argc) {
			policy = argv[++i];
		} else if (!strncmp(argv[i], "--policy=", 9)) {
			policy = argv[i] + 9;
		} else if (argv[i][0] == '-') {
			usage();
		} else {
			break;
		}
	}
	if (i >= argc)
		usage();
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
		fprintf(stderr, "sdp: cannot read policy %s: %s; using TCP\n", path,
			strerror(-err));
	setenv("SDP_POLICY_REPORTED", "1", 1);
	execvp(argv[i], argv + i);
	fprintf(stderr, "sdp: %s: %s\n", argv[i], strerror(errno));
	return errno == ENOENT ? 127 : 126;
}

/* ---- stat --------------------------------------------------------------- */

struct pool_ref {
	ino_t ino;
	int pid;
	const struct sdp_pool_hdr *hdr;
	size_t len;
};

static const char *state_name(uint32_t st)
{
	switch (st) {
	case SDP_ST_CONNECTING:  return "connecting";
	case SDP_ST_ESTABLISHED: return "established";
	case SDP_ST_CLOSED:      return "closed";
	case SDP_ST_RESET:       return "reset";
	default:                 return "free";
	}
}

static const char *mode_name(uint8_t m)
{
	return m == SDP_MODE_PIPELINED ? "pipelined" :
	       m == SDP_MODE_COMBINED ? "combined" : "buffered";
}

static void addr_str(const union sdp_addr *a, char *out, size_t n)
{
	char h[INET6_ADDRSTRLEN] = "?";
	if (a->sa.sa_family == AF_INET) {
		inet_ntop(AF_INET, &a->in.sin_addr, h, sizeof h);
		snprintf(out, n, "%s:%u", h, ntohs(a->in.sin_port));
	} else if (a->sa.sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &a->in6.sin6_addr, h, sizeof h);
		snprintf(out, n, "[%s]:%u", h, ntohs(a->in6.sin6_port));
	} else {
		snprintf(out, n, "-");
	}
}

static bool is_num(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

/* All (pid, fd) on the host whose fd is socket:[ino]. */
struct fdhit { int pid, fd; };

static int find_socket(unsigned long ino, const int *pids, int npids,
		       struct fdhit *hits, int max)
{
	int n = 0;
	char want[64];
	snprintf(want, sizeof want, "socket:[%lu]", ino);
	for (int p = 0; p < npids && n < max; p++) {
		char dir[64];
		snprintf(dir, sizeof dir, "/proc/%d/fd", pids[p]);
		DIR *d = opendir(dir);
		if (!d)
			continue;
		struct dirent *de;
		while ((de = readdir(d)) && n < max) {
			if (!is_num(de->d_name))
				continue;
			char path[600], link[128];
			snprintf(path, sizeof path, "%s/%s", dir, de->d_name);
			ssize_t l = readlink(path, link, sizeof link - 1);
			if (l <= 0)
				continue;
			link[l] = 0;
			if (!strcmp(link, want)) {
				hits[n].pid = pids[p];
				hits[n].fd = atoi(de->d_name);
				n++;
			}
		}
		closedir(d);
	}
	return n;
}

static int cmd_stat(int argc, char **argv)
{
	bool json = false, procs = false;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = true;
		else if (!strcmp(argv[i], "--procs"))
			procs = true;
		else
			usage();
	}
	/* Find every process's pool: /proc/PID/fd/N -> /memfd:sdp-pool */
	struct pool_ref *pools = NULL;
	int npools = 0;
	int *users = NULL;                /* pids, parallel per pool: pool index */
	int *user_pool = NULL, nusers = 0;
	DIR *proc = opendir("/proc");
	struct dirent *de;
	while (proc && (de = readdir(proc))) {
		if (!is_num(de->d_name))
			continue;
		int pid = atoi(de->d_name);
		char dir[64];
		snprintf(dir, sizeof dir, "/proc/%d/fd", pid);
		DIR *d = opendir(dir);
		if (!d)
			continue;
		struct dirent *fe;
		while ((fe = readdir(d))) {
			if (!is_num(fe->d_name))
				continue;
			char path[600], link[256];
			snprintf(path, sizeof path, "%s/%s", dir, fe->d_name);
			ssize_t l = readlink(path, link, sizeof link - 1);
			if (l <= 0)
				continue;
			link[l] = 0;
			if (strncmp(link, "/memfd:" SDP_POOL_NAME, 7 + strlen(SDP_POOL_NAME)))
				continue;
			int fd = open(path, O_RDONLY | O_CLOEXEC);
			if (fd < 0)
				continue;
			struct stat st;
			fstat(fd, &st);
			int k;
			for (k = 0; k < npools; k++)
				if (pools[k].ino == st.st_ino)
					break;
			if (k == npools) {
				void *m = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
				if (m == MAP_FAILED) {
					close(fd);
					continue;
				}
				const struct sdp_pool_hdr *h = m;
				if (h->magic != SDP_POOL_MAGIC || h->version != SDP_POOL_VERSION ||
				    h->conn_size != sizeof(struct sdp_conn)) {
					munmap(m, (size_t)st.st_size);
					close(fd);
					continue;
				}
				pools = realloc(pools, (size_t)(npools + 1) * sizeof *pools);
				pools[npools] = (struct pool_ref){ st.st_ino, pid, h, (size_t)st.st_size };
				npools++;
			}
			close(fd);
			users = realloc(users, (size_t)(nusers + 1) * sizeof *users);
			user_pool = realloc(user_pool, (size_t)(nusers + 1) * sizeof *user_pool);
			users[nusers] = pid;
			user_pool[nusers] = k;
			nusers++;
			break;
		}
		closedir(d);
	}
	if (proc)
		closedir(proc);

	bool first = true;
	if (json)
		printf("[");
	else if (procs)
		printf("%-8s %-16s %9s %9s %14s %14s %13s %13s\n", "PID", "COMM",
		       "SDP_CONNS", "TCP_CONNS", "TX_BYTES", "RX_BYTES",
		       "REGIONS(REUSE)", "MAPPED(REUSE)");
	else
		printf("%-7s %-4s %-22s %-22s %-5s %-11s %-9s %12s %12s %9s %9s %4s\n",
		       "PID", "FD", "LOCAL", "REMOTE", "TRANS", "STATE", "MODE",
		       "TX_BYTES", "RX_BYTES", "TX_MSGS", "RX_MSGS", "CRED");
	for (int k = 0; k < npools; k++) {
		const struct sdp_pool_hdr *h = pools[k].hdr;
		int pids[4096], np = 0;
		for (int u = 0; u < nusers && np < 4096; u++)
			if (user_pool[u] == k)
				pids[np++] = users[u];
		if (procs) {
			const struct sdp_proc *pr = (const void *)((const char *)h + h->procs_off);
			for (uint32_t i = 0; i < h->nprocs; i++) {
				int pid = atomic_load(&pr[i].pid);
				bool live = false;
				for (int u = 0; u < np; u++)
					live |= pids[u] == pid;
				if (!pid || !live)
					continue;
				char comm[21];
				memcpy(comm, pr[i].comm, 20);
				comm[20] = 0;
				unsigned long long sc = pr[i].sdp_conns, tc = pr[i].tcp_conns,
						   tx = pr[i].tx_bytes, rx = pr[i].rx_bytes;
				unsigned long long rc = pr[i].regions[0], rr = pr[i].regions_reused[0],
						   mc = pr[i].regions[1], mr = pr[i].regions_reused[1];
				if (json)
					printf("%s\n {\"pid\": %d, \"comm\": \"%s\", \"sdp_conns\": %llu, "
					       "\"tcp_conns\": %llu, \"tx_bytes\": %llu, \"rx_bytes\": %llu, "
					       "\"regions_created\": %llu, \"regions_reused\": %llu, "
					       "\"regions_mapped\": %llu, \"mappings_reused\": %llu}",
					       first ? "" : ",", pid, comm, sc, tc, tx, rx, rc, rr, mc, mr);
				else {
					char a[32], b[32];
					snprintf(a, sizeof a, "%llu(%llu)", rc, rr);
					snprintf(b, sizeof b, "%llu(%llu)", mc, mr);
					printf("%-8d %-16s %9llu %9llu %14llu %14llu %14s %13s\n",
					       pid, comm, sc, tc, tx, rx, a, b);
				}
				first = false;
			}
			continue;
		}
		const struct sdp_conn *cs = (const void *)((const char *)h + h->conns_off);
		for (uint32_t i = 0; i < h->nconns; i++) {
			const struct sdp_conn *c = &cs[i];
			if (!atomic_load(&c->inuse))
				continue;
			uint32_t st = atomic_load(&c->state);
			if (st == SDP_ST_FREE || st == SDP_ST_CLOSED)
				continue;
			struct fdhit hits[64];
			int nh = find_socket((unsigned long)c->tcp_ino, pids, np, hits, 64);
			char la[64], ra[64];
			addr_str(&c->local, la, sizeof la);
			addr_str(&c->remote, ra, sizeof ra);
			for (int x = 0; x < nh; x++) {
				if (json)
					printf("%s\n {\"pid\": %d, \"fd\": %d, \"local\": \"%s\", "
					       "\"remote\": \"%s\", \"transport\": \"%s\", "
					       "\"state\": \"%s\", \"mode\": \"%s\", "
					       "\"role\": \"%s\", "
					       "\"tx_bytes\": %llu, \"rx_bytes\": %llu, "
					       "\"tx_msgs\": %llu, \"rx_msgs\": %llu, "
					       "\"tx_bcopy_bytes\": %llu, \"rx_bcopy_bytes\": %llu, "
					       "\"tx_rzcopy_bytes\": %llu, \"rx_rzcopy_bytes\": %llu, "
					       "\"tx_wzcopy_bytes\": %llu, \"rx_wzcopy_bytes\": %llu, "
					       "\"credits\": %u}",
					       first ? "" : ",", hits[x].pid, hits[x].fd, la, ra,
					       c->transport ? "sdp" : "tcp",
					       state_name(st), mode_name(c->mode),
					       c->role == SDP_ROLE_SERVER ? "server" : "client",
					       (unsigned long long)c->st.tx_bytes,
					       (unsigned long long)c->st.rx_bytes,
					       (unsigned long long)c->st.tx_msgs,
					       (unsigned long long)c->st.rx_msgs,
					       (unsigned long long)c->st.tx_bcopy_bytes,
					       (unsigned long long)c->st.rx_bcopy_bytes,
					       (unsigned long long)c->st.tx_rzcopy_bytes,
					       (unsigned long long)c->st.rx_rzcopy_bytes,
					       (unsigned long long)c->st.tx_wzcopy_bytes,
					       (unsigned long long)c->st.rx_wzcopy_bytes,
					       c->st.credits);
				else
					printf("%-7d %-4d %-22s %-22s %-5s %-11s %-9s %12llu %12llu %9llu %9llu %4u\n",
					       hits[x].pid, hits[x].fd, la, ra, c->transport ? "sdp" : "tcp",
					       state_name(st), mode_name(c->mode),
					       (unsigned long long)c->st.tx_bytes,
					       (unsigned long long)c->st.rx_bytes,
					       (unsigned long long)c->st.tx_msgs,
					       (unsigned long long)c->st.rx_msgs, c->st.credits);
				first = false;
			}
		}
	}
	if (json)
		printf("%s]\n", first ? "" : "\n");
	return 0;
}

/* ---- check -------------------------------------------------------------- */

struct check { const char *name; bool ok; char why[200]; };

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
static void host_report(bool json, bool force)
{
	struct sdp_calib cal;
	const char *ss = getenv("SDP_SLOT_SIZE");
	uint32_t slot = ss && atoi(ss) >= 1024 ? (uint32_t)atoi(ss) & ~63u : 32768;
	sdp_calib_get(slot, force, &cal);
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
	if (json) {
		printf("\"host\": {\"cpu\": \"%s\", \"kernel\": \"%.*s\", "
		       "\"copy\": {\"routine\": \"%s\", \"source\": \"%s\", \"gbps\": {",
		       model, (int)strcspn(cal.host, "|"), cal.host, routine, source);
		for (int i = 0; i < cal.ncopy; i++)
			printf("%s\"%s\": %.2f", i ? ", " : "", cal.copy_speed[i].name,
			       cal.copy_speed[i].gbps);
		printf("}}, \"zcopy\": {\"cma\": %s, \"threshold\": %u, \"page_aliased\": \"%s\", "
		       "\"cma_gbps_same_offset\": %.2f, \"cma_gbps_shifted\": %.2f}, "
		       "\"cache\": \"%s\"}, ",
		       cal.cma_ok ? "true" : "false", cal.zcopy_thresh,
		       cal.cma_alias ? "bounce" : "direct", cal.cma_gbps_same,
		       cal.cma_gbps_shifted, cal.path);
		return;
	}
	printf("%-20s %s (kernel %.*s)\n", "host", model, (int)strcspn(cal.host, "|"), cal.host);
	printf("%-20s %s (%s;", "copy_routine", routine, source);
	for (int i = 0; i < cal.ncopy; i++)
		printf(" %s %.1f", cal.copy_speed[i].name, cal.copy_speed[i].gbps);
	printf(" GB/s through a ring)\n");
	printf("%-20s %u bytes%s; page-aliased transfers %s (CMA 64 KiB: %.1f GB/s same "
	       "offset, %.1f shifted)\n", "zcopy_threshold", cal.zcopy_thresh,
	       cal.zcopy_thresh ? "" : " (never)", cal.cma_alias ? "bounced" : "direct",
	       cal.cma_gbps_same, cal.cma_gbps_shifted);
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

static void tun_report_quiet(const char *msg, void *arg)
{
	(void)msg;
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
		else {
			fprintf(stderr, "sdp check: unknown option '%s'\n", argv[i]);
			usage();
			return 2;
		}
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
			 path, strerror(-err));
	} else {
		ck[n].ok = true;
		snprintf(ck[n].why, sizeof ck[n].why, "%s: %s -> SDP wherever the peer supports it",
			 path, strerror(-err));
	}
	n++;

	bool cma = ck[3].ok;
	if (json) {
		printf("{\"features\": [\"bcopy\"%s], ", cma ? ", \"zcopy\"" : "");
		host_report(true, recal);
		tunables_report(true);
		printf(", \"checks\": {");
		for (int i = 0; i < n; i++)
			printf("%s\"%s\": {\"ok\": %s, \"why\": \"%s\"}", i ? ", " : "",
			       ck[i].name, ck[i].ok ? "true" : "false", ck[i].why);
		printf("}}\n");
	} else {
		for (int i = 0; i < n; i++)
			printf("%-20s %-4s %s\n", ck[i].name, ck[i].ok ? "ok" : "no", ck[i].why);
		printf("%-20s      bcopy%s\n", "features",
		       cma ? " zcopy" : " (zero copy unavailable: see cross_memory_attach)");
		host_report(false, recal);
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
		usage();
	if (!strcmp(argv[1], "run"))
		return cmd_run(argc - 2, argv + 2);
	if (!strcmp(argv[1], "stat"))
		return cmd_stat(argc - 2, argv + 2);
	if (!strcmp(argv[1], "check"))
		return cmd_check(argc - 2, argv + 2);
	if (!strcmp(argv[1], "bench"))
		return cmd_bench(argc - 2, argv + 2);
	if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))
		usage();
	fprintf(stderr, "sdp: unknown command '%s'\n", argv[1]);
	usage();
	return 2;
}
