/*
 * xcopy.c - `sdp check`'s look at copies between two CPUs, now.
 *
 * The library's copy routine is chosen once per host from copies within
 * one thread (calib.c), but a ring's bytes are written on one CPU and read
 * on another, and what that costs depends on where the two CPUs are: on a
 * VM it changes whenever the host moves the vCPUs. The library learns it
 * per thread while it runs (copy.h: streaming stores); this probe shows
 * the user the two speeds at the moment of the check: one thread on each
 * of two CPUs passes 16 KiB messages through a 2 MiB ring (as a Buffer
 * Copy connection does), with plain stores and with streaming stores,
 * end to end, a few milliseconds each, best of three.
 */
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "sdp/copy.h"
#include "tools/tool.h"

#define RING  (2u << 20)
#define SLOT  (32u << 10)
#define NSLOT (RING / SLOT)
#define MSG   16384u
#define COUNT 1500u

struct probe {
	char *ring, *in, *out;
	sdp_copy_fn wr;                /* how the writer copies into the ring */
	int cpu_w, cpu_r;
	_Atomic uint32_t head, tail;   /* messages written, read */
};

static void pin(int cpu)
{
	cpu_set_t s;
	CPU_ZERO(&s);
	CPU_SET(cpu, &s);
	pthread_setaffinity_np(pthread_self(), sizeof s, &s);
}

static void *reader(void *arg)
{
	struct probe *p = arg;
	pin(p->cpu_r);
	for (uint32_t i = 0; i < COUNT; i++) {
		while (atomic_load_explicit(&p->head, memory_order_acquire) == i)
			sched_yield();
		sdp_copy(p->out, p->ring + (i % NSLOT) * SLOT, MSG);
		atomic_store_explicit(&p->tail, i + 1, memory_order_release);
	}
	return NULL;
}

static double now(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* GB/s end to end, or 0 if the threads could not run. */
static double one_run(struct probe *p)
{
	pthread_t t;
	atomic_store(&p->head, 0);
	atomic_store(&p->tail, 0);
	if (pthread_create(&t, NULL, reader, p))
		return 0;
	pin(p->cpu_w);
	double t0 = now();
	for (uint32_t i = 0; i < COUNT; i++) {
		while (i - atomic_load_explicit(&p->tail, memory_order_acquire) >= NSLOT)
			sched_yield();
		p->wr(p->ring + (i % NSLOT) * SLOT, p->in, MSG);
		atomic_store_explicit(&p->head, i + 1, memory_order_release);
	}
	pthread_join(t, NULL);
	double el = now() - t0;
	return el > 0 ? (double)MSG * COUNT / el / 1e9 : 0;
}

int sdp_cross_copy(struct sdp_cross_copy *o)
{
	memset(o, 0, sizeof *o);
	cpu_set_t set, saved;
	if (sched_getaffinity(0, sizeof set, &set))
		return -1;
	saved = set;
	int cpus[2], n = 0;
	for (int c = 0; c < CPU_SETSIZE && n < 2; c++)
		if (CPU_ISSET(c, &set))
			cpus[n++] = c;
	if (n < 2)
		return -1;                 /* one CPU: the reader shares its cache */
	struct probe p = { .cpu_w = cpus[0], .cpu_r = cpus[1] };
	p.ring = aligned_alloc(4096, RING);
	p.in = aligned_alloc(4096, MSG + 4096);
	p.out = aligned_alloc(4096, MSG + 4096);
	if (!p.ring || !p.in || !p.out) {
		free(p.ring);
		free(p.in);
		free(p.out);
		return -1;
	}
	memset(p.ring, 0, RING);
	memset(p.in, 7, MSG + 4096);
	memset(p.out, 0, MSG + 4096);
	for (int r = 0; r < 3; r++) {
		p.wr = sdp_copy_cur;
		double g = one_run(&p);
		if (g > o->plain_gbps)
			o->plain_gbps = g;
		p.wr = sdp_copy_streaming;
		g = one_run(&p);
		if (g > o->stream_gbps)
			o->stream_gbps = g;
	}
	sched_setaffinity(0, sizeof saved, &saved);
	o->cpu_a = cpus[0];
	o->cpu_b = cpus[1];
	free(p.ring);
	free(p.in);
	free(p.out);
	return 0;
}
