/*
 * sdp-rawbench - the limits under the socket layer, between two processes
 * on this host: what SDP's transports could at best deliver.
 *
 *   sdp-rawbench cma     --size S [--time T] [--write]
 *       Cross Memory Attach bandwidth: the parent pulls (process_vm_readv,
 *       the RDMA Read analogue) or pushes (--write: process_vm_writev) S
 *       bytes per call from/to a child's buffer. One copy per byte.
 *   sdp-rawbench shm-bw  --size S [--time T] [--ring R]
 *       Shared-memory ring bandwidth: the producer copies messages of S
 *       bytes into a ring of R bytes, the consumer copies them out (two
 *       copies per byte, as Buffer Copy does).
 *   sdp-rawbench shm-lat --size S [--time T] [--iters N] [--ring R]
 *       Ping-pong latency through two such rings, busy polling.
 *
 * Prints one JSON line with the metric, the CPU of both processes and the
 * wall time of the measured interval.
 */
#include "perf_common.h"

#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sdp/spin.h"

static uint64_t g_size = 65536, g_iters = 200000, g_ring = 4u << 20;
static double g_time = 1.0;
static int g_write;
static int g_cpu_parent = -1, g_cpu_child = -1;

/* --cpus PEER,SELF: pin the peer (child) and the measuring process */
static void pin_to(int cpu)
{
	if (cpu < 0)
		return;
	cpu_set_t set;
	CPU_ZERO(&set);
	CPU_SET(cpu, &set);
	if (sched_setaffinity(0, sizeof(set), &set) != 0)
		perror("sched_setaffinity");
}

static void usage(void)
{
	fprintf(stderr,
		"usage: sdp-rawbench cma --size S [--time T] [--write] [--cpus PEER,SELF]\n"
		"       sdp-rawbench shm-bw --size S [--time T] [--ring R]\n"
		"       sdp-rawbench shm-lat --size S [--time T] [--iters N] [--ring R]\n");
	exit(2);
}

static void *xmap(size_t n, bool shared)
{
	void *p = mmap(NULL, n, PROT_READ | PROT_WRITE,
		       (shared ? MAP_SHARED : MAP_PRIVATE) | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memset(p, 0x5A, n);
	return p;
}

static inline void cpu_relax(void)
{
	sdp_cpu_relax();                  /* the library's, sdp/spin.h */
}

/* spin politely: after a while yield, so that an overcommitted machine
 * still makes progress */
static inline void spin_wait(unsigned *spins)
{
	if (++*spins < 2000)
		cpu_relax();
	else
		sched_yield();
}

struct shared_ctl {
	_Atomic uint64_t go;          /* parent sets 1 when measurement starts */
	_Atomic uint64_t stop;
	uint64_t t0, t1;
	uint64_t bytes;
	double cu, cs;                /* child's CPU over the interval */
	uint64_t ready;
	char pad[64];
};

static void print_result(const char *test, double secs, uint64_t bytes, uint64_t msgs,
			 double pu, double ps, double cu, double cs, double *lat, size_t nlat,
			 const char *err)
{
	struct jw j;
	jw_begin(&j);
	jw_str(&j, "tool", "sdp-rawbench");
	jw_str(&j, "test", test);
	jw_int(&j, "ok", err == NULL);
	if (err)
		jw_str(&j, "error", err);
	jw_int(&j, "size", (int64_t)g_size);
	jw_int(&j, "bytes", (int64_t)bytes);
	jw_int(&j, "iters", (int64_t)msgs);
	jw_num(&j, "seconds", secs);
	jw_num(&j, "gbps", secs > 0 ? (double)bytes * 8 / secs / 1e9 : NAN);
	jw_num(&j, "mbytes_per_s", secs > 0 ? (double)bytes / secs / 1e6 : NAN);
	jw_num(&j, "msgs_per_s", secs > 0 ? (double)msgs / secs : NAN);
	if (lat) {
		sort_doubles(lat, nlat);
		double sum = 0;
		for (size_t i = 0; i < nlat; i++)
			sum += lat[i];
		jw_obj_begin(&j, "lat_us");
		jw_int(&j, "n", (int64_t)nlat);
		jw_num(&j, "mean", nlat ? sum / (double)nlat : NAN);
		jw_num(&j, "p50", percentile_sorted(lat, nlat, 50));
		jw_num(&j, "p90", percentile_sorted(lat, nlat, 90));
		jw_num(&j, "p99", percentile_sorted(lat, nlat, 99));
		jw_num(&j, "min", nlat ? lat[0] : NAN);
		jw_num(&j, "max", nlat ? lat[nlat - 1] : NAN);
		jw_obj_end(&j);
	}
	/* "client" = the measuring (parent) process, "server" = its peer */
	jw_obj_begin(&j, "cpu");
	jw_num(&j, "user", pu);
	jw_num(&j, "sys", ps);
	jw_num(&j, "total", pu + ps);
	jw_num(&j, "per_s", secs > 0 ? (pu + ps) / secs : NAN);
	jw_obj_end(&j);
	jw_obj_begin(&j, "peer_cpu");
	jw_num(&j, "user", cu);
	jw_num(&j, "sys", cs);
	jw_num(&j, "total", cu + cs);
	jw_num(&j, "per_s", secs > 0 ? (cu + cs) / secs : NAN);
	jw_obj_end(&j);
	jw_str(&j, "transport", "raw");
	jw_end_print(&j, stdout);
}

/* ------------------------------------------------------------------ cma */

static int run_cma(void)
{
	struct shared_ctl *ctl = xmap(sizeof(*ctl), true);
	memset(ctl, 0, sizeof(*ctl));
	int p2c[2], c2p[2];
	if (pipe(p2c) || pipe(c2p)) {
		perror("pipe");
		return 1;
	}
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		pin_to(g_cpu_child);
		close(p2c[1]);
		close(c2p[0]);
		char *buf = xmap(g_size, false);
		uintptr_t addr = (uintptr_t)buf;
		if (write(c2p[1], &addr, sizeof(addr)) != sizeof(addr))
			_exit(1);
		double u0, s0, u1, s1;
		cpu_self(&u0, &s0);
		char c;
		while (read(p2c[0], &c, 1) < 0 && errno == EINTR) /* wait for the end */
			;
		cpu_self(&u1, &s1);
		ctl->cu = u1 - u0;
		ctl->cs = s1 - s0;
		_exit(0);
	}
	close(p2c[0]);
	close(c2p[1]);
	uintptr_t raddr = 0;
	if (read(c2p[0], &raddr, sizeof(raddr)) != sizeof(raddr)) {
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		print_result("cma", 0, 0, 0, 0, 0, 0, 0, NULL, 0, "child setup failed");
		return 1;
	}
	char *local = xmap(g_size, false);
	struct iovec lv = { .iov_base = local, .iov_len = g_size };
	struct iovec rv = { .iov_base = (void *)raddr, .iov_len = g_size };
	const char *err = NULL;
	char ebuf[128];
	double u0, s0, u1, s1;
	cpu_self(&u0, &s0);
	uint64_t t0 = now_ns(), end = t0 + (uint64_t)(g_time * 1e9), bytes = 0, n = 0;
	while (now_ns() < end) {
		ssize_t r = g_write ? process_vm_writev(pid, &lv, 1, &rv, 1, 0)
				    : process_vm_readv(pid, &lv, 1, &rv, 1, 0);
		if (r < 0) {
			snprintf(ebuf, sizeof(ebuf), "process_vm_%s: %s",
				 g_write ? "writev" : "readv", strerror(errno));
			err = ebuf;
			break;
		}
		bytes += (uint64_t)r;
		n++;
	}
	uint64_t t1 = now_ns();
	cpu_self(&u1, &s1);
	close(p2c[1]);
	waitpid(pid, NULL, 0);
	print_result(g_write ? "cma-write" : "cma", (double)(t1 - t0) / 1e9, bytes, n,
		     u1 - u0, s1 - s0, ctl->cu, ctl->cs, NULL, 0, err);
	return err ? 1 : 0;
}

/* ----------------------------------------------------------------- ring */

struct ring {
	_Atomic uint64_t head;  /* bytes written (producer) */
	char pad1[56];
	_Atomic uint64_t tail;  /* bytes read (consumer) */
	char pad2[56];
	char data[];
};

static void ring_put(struct ring *r, uint64_t cap, const char *src, uint64_t n)
{
	uint64_t head = atomic_load_explicit(&r->head, memory_order_relaxed);
	while (n) {
		unsigned spins = 0;
		uint64_t tail, free_b;
		while ((free_b = cap - (head - (tail = atomic_load_explicit(&r->tail, memory_order_acquire)))) == 0)
			spin_wait(&spins);
		uint64_t off = head % cap;
		uint64_t k = n < free_b ? n : free_b;
		if (k > cap - off)
			k = cap - off;
		memcpy(r->data + off, src, k);
		head += k;
		src += k;
		n -= k;
		atomic_store_explicit(&r->head, head, memory_order_release);
	}
}

/* returns false if stopped before n bytes arrived */
static bool ring_get(struct ring *r, uint64_t cap, char *dst, uint64_t n, _Atomic uint64_t *stop)
{
	uint64_t tail = atomic_load_explicit(&r->tail, memory_order_relaxed);
	while (n) {
		unsigned spins = 0;
		uint64_t head, avail;
		while ((avail = (head = atomic_load_explicit(&r->head, memory_order_acquire)) - tail) == 0) {
			if (stop && atomic_load_explicit(stop, memory_order_acquire)) {
				head = atomic_load_explicit(&r->head, memory_order_acquire);
				if (head == tail)
					return false;
				break;
			}
			spin_wait(&spins);
		}
		avail = head - tail;
		uint64_t off = tail % cap;
		uint64_t k = n < avail ? n : avail;
		if (k > cap - off)
			k = cap - off;
		memcpy(dst, r->data + off, k);
		tail += k;
		dst += k;
		n -= k;
		atomic_store_explicit(&r->tail, tail, memory_order_release);
	}
	return true;
}

static int run_shm(bool lat)
{
	struct shared_ctl *ctl = xmap(sizeof(*ctl), true);
	memset(ctl, 0, sizeof(*ctl));
	size_t rsz = sizeof(struct ring) + g_ring;
	struct ring *a = xmap(rsz, true), *b = xmap(rsz, true);
	memset(a, 0, sizeof(struct ring));
	memset(b, 0, sizeof(struct ring));
	pid_t pid = fork();
	if (pid < 0) {
		perror("fork");
		return 1;
	}
	if (pid == 0) {
		pin_to(g_cpu_child);
		char *buf = xmap(g_size, false);
		unsigned spins = 0;
		while (!atomic_load_explicit(&ctl->go, memory_order_acquire))
			spin_wait(&spins);
		double u0, s0, u1, s1;
		cpu_self(&u0, &s0);
		uint64_t bytes = 0;
		for (;;) {
			if (!ring_get(a, g_ring, buf, g_size, &ctl->stop))
				break;
			bytes += g_size;
			if (lat)
				ring_put(b, g_ring, buf, g_size);
		}
		ctl->t1 = now_ns();
		cpu_self(&u1, &s1);
		ctl->bytes = bytes;
		ctl->cu = u1 - u0;
		ctl->cs = s1 - s0;
		_exit(0);
	}
	char *buf = xmap(g_size, false);
	double *lats = NULL;
	if (lat) {
		lats = calloc(g_iters, sizeof(double));
		if (!lats)
			return 1;
	}
	double u0, s0, u1, s1;
	cpu_self(&u0, &s0);
	uint64_t t0 = now_ns(), end = t0 + (uint64_t)(g_time * 1e9), n = 0;
	atomic_store_explicit(&ctl->go, 1, memory_order_release);
	if (lat) {
		/* a few warm-up round trips */
		for (int i = 0; i < 20; i++) {
			ring_put(a, g_ring, buf, g_size);
			ring_get(b, g_ring, buf, g_size, NULL);
		}
		t0 = now_ns();
		while (n < g_iters) {
			uint64_t t = now_ns();
			if (t >= end && n >= 10)
				break;
			ring_put(a, g_ring, buf, g_size);
			ring_get(b, g_ring, buf, g_size, NULL);
			lats[n++] = (double)(now_ns() - t) / 2000.0;
		}
	} else {
		while (now_ns() < end) {
			ring_put(a, g_ring, buf, g_size);
			n++;
		}
	}
	uint64_t tp = now_ns();
	cpu_self(&u1, &s1);
	atomic_store_explicit(&ctl->stop, 1, memory_order_release);
	waitpid(pid, NULL, 0);
	if (lat) {
		print_result("shm-lat", (double)(tp - t0) / 1e9, n * g_size * 2, n,
			     u1 - u0, s1 - s0, ctl->cu, ctl->cs, lats, n, NULL);
	} else {
		uint64_t t1 = ctl->t1 > tp ? ctl->t1 : tp;
		print_result("shm-bw", (double)(t1 - t0) / 1e9, ctl->bytes, n,
			     u1 - u0, s1 - s0, ctl->cu, ctl->cs, NULL, 0,
			     ctl->bytes == n * g_size ? NULL : "consumer lost bytes");
	}
	free(lats);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc < 2)
		usage();
	const char *cmd = argv[1];
	for (int i = 2; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (!strcmp(argv[i], "--size") && v) { g_size = parse_size(v); i++; }
		else if (!strcmp(argv[i], "--time") && v) { g_time = atof(v); i++; }
		else if (!strcmp(argv[i], "--iters") && v) { g_iters = strtoull(v, NULL, 10); i++; }
		else if (!strcmp(argv[i], "--ring") && v) { g_ring = parse_size(v); i++; }
		else if (!strcmp(argv[i], "--write")) { g_write = 1; }
		else if (!strcmp(argv[i], "--cpus") && v) {
			if (sscanf(v, "%d,%d", &g_cpu_child, &g_cpu_parent) != 2)
				usage();
			i++;
		}
		else usage();
	}
	if (!g_size || g_size > (1ull << 30) || !g_ring || g_time <= 0 || g_time > 600 || g_iters < 10)
		usage();
	alarm((unsigned)(g_time * 2 + 60));
	pin_to(g_cpu_parent);
	if (!strcmp(cmd, "cma"))
		return run_cma();
	if (!strcmp(cmd, "shm-bw"))
		return run_shm(false);
	if (!strcmp(cmd, "shm-lat"))
		return run_shm(true);
	usage();
	return 2;
}
