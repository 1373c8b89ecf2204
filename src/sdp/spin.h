/*
 * spin.h - busy-polling, the one way the library spins: a portable
 * cpu_relax, the spin loop's steps (struct sdp_spin), used by the engine's
 * waits (wait.c) and the switch's poll and epoll scans, and the adaptive
 * budget they share. Implementation in spin.c.
 */
#ifndef SDP_SPIN_H
#define SDP_SPIN_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

/* Tell the CPU we are spinning (it may save power or give the other
 * hardware thread of the core a turn); on other architectures at least a
 * compiler barrier, so the loop re-reads memory. */
static inline void sdp_cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#elif defined(__aarch64__) || (defined(__arm__) && defined(__ARM_ARCH) && __ARM_ARCH >= 7)
	__asm__ __volatile__("yield" ::: "memory");
#elif defined(__powerpc__) || defined(__powerpc64__)
	__asm__ __volatile__("or 27,27,27" ::: "memory");
#else
	atomic_signal_fence(memory_order_seq_cst);
#endif
}

/*
 * One spin, step by step:
 *
 *	struct sdp_spin sp;
 *	sdp_spin_start(&sp, budget_us, deadline, 64, 1, 0);
 *	while (!condition()) {
 *		int st = sdp_spin_step(&sp);
 *		if (st == SDP_SPIN_OVER)
 *			break;
 *		if (st == SDP_SPIN_TICK)
 *			...something slower, now and then (sp.now is fresh)...
 *	}
 *	sdp_spin_result(&cur, max, met, sp.contended);
 *
 * Each step relaxes the CPU `relax` times; every `tick` steps it reads the
 * clock, ends the spin once the budget is spent, and - after the first
 * SDP_SPIN_YIELD_NS - lets any other runnable task have the CPU
 * (sched_yield), noting whether one ran: then the CPU is wanted, and a
 * peer that shares it answers only when we give it away.
 */
struct sdp_spin {
	uint64_t start;                /* CLOCK_MONOTONIC ns when it began */
	uint64_t end;                  /* ns: the budget is spent */
	uint64_t now;                  /* ns at the last clock read */
	uint32_t n;                    /* steps taken */
	uint32_t tick;                 /* steps between clock reads (power of 2) */
	uint32_t relax;                /* cpu_relax per step */
	unsigned flags;                /* SDP_SPIN_* */
	bool     contended;            /* a sched_yield during it ran another task */
	bool     shared;               /* the last one did */
	/* Optional: past `end`, go on while extend(arg) holds, until ext_end. */
	bool   (*extend)(void *arg);
	void    *arg;
	uint64_t ext_end;
};

enum {
	SDP_SPIN_FOLLOW = 1u << 0,     /* carry the thread's last yield result
					* from spin to spin: while the CPU is
					* wanted, yield at every step */
	SDP_SPIN_STOP_SHARED = 1u << 1,/* end as soon as a yield ran another task */
};

enum {
	SDP_SPIN_AGAIN = 0,            /* check the condition again */
	SDP_SPIN_TICK = 1,             /* the same, and the clock was read */
	SDP_SPIN_OVER = -1,            /* the budget is spent (or, with
					* SDP_SPIN_STOP_SHARED, the CPU is wanted:
					* sp.shared) */
};

#define SDP_SPIN_YIELD_NS 3000         /* spin this long before yielding */

/* Start a spin of us microseconds, cut at deadline (ns, 0 = none). */
void sdp_spin_start(struct sdp_spin *s, uint32_t us, uint64_t deadline,
		    uint32_t tick, uint32_t relax, unsigned flags);
int  sdp_spin_step(struct sdp_spin *s);

/* Adaptive budget (per connection or per thread): sdp_spin_budget gives
 * this wait's budget in microseconds, at most max; sdp_spin_result says
 * whether spinning paid off (hit) and whether the CPU was wanted. */
uint32_t sdp_spin_budget(_Atomic uint32_t *cur, _Atomic uint32_t *waits, uint32_t max);
void     sdp_spin_result(_Atomic uint32_t *cur, uint32_t max, bool hit, bool contended);
/* The budget a new connection starts with: where this process's spins
 * have lately brought theirs (at most max). */
uint32_t sdp_spin_initial(uint32_t max);
/* The runnable count of a /proc/loadavg line ("0.52 0.58 0.59 3/765 4242":
 * the number before the '/'), or -1 if the line is not of that form. */
static inline int sdp_loadavg_runnable(const char *s)
{
	for (int field = 0; field < 3; field++) {
		while (*s && *s != ' ')
			s++;
		if (*s++ != ' ')
			return -1;
	}
	long n = 0;
	const char *d = s;
	while (*s >= '0' && *s <= '9' && n < 1000000000)
		n = n * 10 + (*s++ - '0');
	return s > d && *s == '/' ? (int)n : -1;
}

/* sched_yield that says whether it ran another task (the CPU is wanted). */
bool     sdp_yield(void);
/* Did this thread's last spin find its CPU wanted? (Then a wait that has
 * something else to do does it rather than spin: wait.c sdp_spin.) */
bool     sdp_spin_cpu_shared(void);

#endif
