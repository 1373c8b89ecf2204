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
		for (int i = 0; env && env[i]; i++)
			putenv((char *)env[i]);
		char *av[16];
		int n = 0;
		av[n++] = argv0[0];
		av[n++] = (char *)"--az";
		for (int i = 0; args && args[i] && n < 15; i++)
			av[n++] = (char *)args[i];
		av[n] = NULL;
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

#endif
