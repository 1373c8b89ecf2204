/*
 * azlib.h - helpers of the t_az_* programs (asynchronous zero copy):
 * running a scenario in a fresh process with the AZ settings in its
 * environment (the library reads them at start-up), a cheap word pattern
 * for megabytes of data, and the AZ counters.
 */
#ifndef SDP_AZLIB_H
#define SDP_AZLIB_H

#include "zclib.h"
#include <sys/mman.h>

#define MiB (1u << 20)

/* Re-run this program as `PROG --az ARGS...` with AZ on and the given
 * extra environment ("NAME=VALUE", NULL-terminated); returns its wait
 * status. Under kernel TCP the variables change nothing, which is the
 * point: the same program must behave the same. */
static inline int az_run(char **argv0, const char *const *env, const char *const *args)
{
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		setenv("SDP_AZCOPY", "1", 1);
		/* The scenarios are written for 64 KiB and up: not the
		 * threshold measured on this host (t_az_thresh tests that). */
		setenv("SDP_AZCOPY_THRESH", "65536", 0);
		for (int i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		char *av[16];
		int n = 0;
		av[n++] = argv0[0];
		av[n++] = (char *)"--az";
		for (int i = 0; args && args[i] && n < 15; i++)
			av[n++] = (char *)args[i];
		av[n] = NULL;
		alarm(100);                   /* kept across exec: a hang dies */
		execv("/proc/self/exe", av);
		_exit(127);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	return st;
}

/* The 8-byte words of round r at offset off (in bytes, a multiple of 8 or
 * not: the pattern is defined per byte through its word). */
static inline uint64_t az_word(uint64_t r, uint64_t w)
{
	return (r * 0x9E3779B97F4A7C15ull) ^ (w * 0xD6E8FEB86659FD93ull) ^ 0x5DC0FFEE;
}

static inline void az_fill(void *buf, size_t len, uint64_t r)
{
	uint8_t *p = buf;
	size_t i = 0;
	for (; i + 8 <= len; i += 8) {
		uint64_t v = az_word(r, i / 8);
		memcpy(p + i, &v, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)(az_word(r, i / 8) >> (8 * (i % 8)));
}

/* -1 if buf holds round r's bytes, else the first wrong offset. */
static inline long az_check(const void *buf, size_t len, uint64_t r)
{
	static __thread uint8_t *ref;
	static __thread size_t reflen;
	if (reflen < len) {
		free(ref);
		ref = malloc(len);
		reflen = len;
		CHECK(ref != NULL);
	}
	az_fill(ref, len, r);
	if (memcmp(ref, buf, len) == 0)
		return -1;
	for (size_t i = 0; i < len; i++)
		if (((const uint8_t *)buf)[i] != ref[i])
			return (long)i;
	return -1;
}

/* The AZ counters of fd (zero under kernel TCP). */
struct azst { uint64_t tx, rx, asy, faults, cow, out; };
static inline struct azst az_get(int fd)
{
	struct sdp_sock_stats s;
	struct azst a = { 0 };
	if (tl_stats(fd, &s))
		a = (struct azst){ s.tx_azcopy_bytes, s.rx_azcopy_bytes, s.rx_azasync_bytes,
				   s.az_faults, s.az_cow_copies, s.az_outstanding };
	return a;
}

/* A buffer of len bytes at offset off into fresh pages. */
static inline uint8_t *az_buf(size_t len, size_t off)
{
	void *p = mmap(NULL, len + off + 4096, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(p != MAP_FAILED);
	return (uint8_t *)p + off;
}

/* ---- a peer process --------------------------------------------------- */

/* Gates between this process and its peer (pipes made before the fork):
 * az_gate_pass(g) lets the other side's az_gate_wait(g) through once. */
static int az_gates[4][2];

static inline void az_gates_open(void)
{
	for (int i = 0; i < 4; i++)
		CHECK(pipe(az_gates[i]) == 0);
}

static inline void az_gate_pass(int g)
{
	char b = 'g';
	CHECK_EQ(write(az_gates[g][1], &b, 1), 1);
}

static inline void az_gate_wait(int g)
{
	char b;
	ssize_t n;
	while ((n = read(az_gates[g][0], &b, 1)) < 0 && errno == EINTR)
		;
	CHECK_EQ(n, 1);
}

/* A connection whose other end is served by rx(fd, arg) in a child
 * process; returns our end, *pid the child. */
static inline int az_peer(void (*rx)(int, void *), void *arg, pid_t *pid)
{
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	*pid = fork();
	CHECK(*pid >= 0);
	if (*pid == 0) {
		tl_watchdog(100);
		close(c);
		rx(s, arg);
		_exit(0);
	}
	close(s);
	return c;
}

static inline void az_reap(pid_t pid, const char *what)
{
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s failed (status 0x%x)", what, st);
}

/* Receive len bytes of round r and check them. */
static inline void az_recv_round(int s, uint8_t *r, size_t len, uint64_t round)
{
	tl_recv_all(s, r, len);
	long bad = az_check(r, len, round);
	CHECK(bad < 0, "round %llu: byte %ld of %zu wrong", (unsigned long long)round, bad, len);
}

/* Run every scenario of a t_az_* program in a fresh process with AZ on
 * (and env), under both fault policies. */
static inline void az_run_all(char **argv, const char *const *names, int n,
			      const char *extra_env)
{
	static const char *faults[] = { "SDP_AZ_FAULT=block", "SDP_AZ_FAULT=copy" };
	for (int f = 0; f < 2; f++)
		for (int i = 0; i < n; i++) {
			const char *env[] = { faults[f], "SDP_AZ_COOL=0", extra_env, NULL };
			const char *args[] = { names[i], NULL };
			int st = az_run(argv, env, args);
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s (%s) failed (status 0x%x)",
			      names[i], faults[f], st);
		}
}

/* main() of a t_az_* program with one scenario: in the child (--az) run
 * it; else run it under both fault policies with the library's choice of
 * protection and, if also_mprotect, again with mprotect. */
static inline int az_main_one(int argc, char **argv, int (*scenario)(void),
			      int also_mprotect)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario();
	tl_watchdog(120);
	const char *names[] = { "all" };
	az_run_all(argv, names, 1, NULL);
	if (also_mprotect)
		az_run_all(argv, names, 1, "SDP_AZ_PROTECT=mprotect");
	return 0;
}

#endif
