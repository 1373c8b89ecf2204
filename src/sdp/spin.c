/*
 * spin.c - busy-polling (spin.h): the steps of a spin, its adaptive
 * budget, and the yield that tells whether the CPU is wanted.
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/spin.h"
#include "sdp/sys.h"

/*
 * Spinning pays when the peer answers within the budget; when it does not
 * (the peer is slow, or more processes want the CPUs than there are), every
 * spin is a CPU taken from someone who could make progress. So the budget
 * adapts like an adaptive mutex: restored to the maximum after a spin that
 * paid off, halved after one that did not while another task wanted the CPU
 * (a sched_yield during the spin ran one); at 0, one wait in 8 spins the
 * full maximum again, so a pattern where spinning pays (a ping-pong whose
 * answer takes longer than a short probe) is found again quickly. A miss
 * on an otherwise idle CPU costs only that CPU's time and keeps the budget:
 * halving there made event loops (nginx and wrk, one CPU each) sleep
 * through most of their requests.
 */
uint32_t sdp_spin_budget(_Atomic uint32_t *cur, _Atomic uint32_t *waits, uint32_t max)
{
	uint32_t b = atomic_load_explicit(cur, memory_order_relaxed);
	if (b > max)
		b = max;
	if (b == 0 && (atomic_fetch_add_explicit(waits, 1, memory_order_relaxed) & 7) == 0)
		b = max;
	return b;
}

/*
 * The process keeps a budget of its own under the same rule, fed by every
 * spin's result, and a new connection starts from it rather than from the
 * maximum: a server that makes a connection (and a thread) per client
 * would otherwise spin each one's first waits in full however busy the
 * CPUs are, and under churn most waits are first waits.
 */
static _Atomic uint32_t proc_cur = UINT32_MAX;

static void adapt(_Atomic uint32_t *cur, uint32_t max, bool hit, bool contended)
{
	uint32_t b = atomic_load_explicit(cur, memory_order_relaxed);
	if (b > max)
		b = max;
	uint32_t nb = hit ? max : contended ? b / 2 : b;
	if (nb != atomic_load_explicit(cur, memory_order_relaxed))
		atomic_store_explicit(cur, nb, memory_order_relaxed);
}

void sdp_spin_result(_Atomic uint32_t *cur, uint32_t max, bool hit, bool contended)
{
	adapt(cur, max, hit, contended);
	adapt(&proc_cur, max, hit, contended);
}

uint32_t sdp_spin_initial(uint32_t max)
{
	uint32_t p = atomic_load_explicit(&proc_cur, memory_order_relaxed);
	return p < max ? p : max;
}

/* A sched_yield that returns later than this ran another task. */
#define SDP_YIELD_RAN_NS 5000
/* The last yield of a SDP_SPIN_FOLLOW spin of this thread ran another. */
static _Thread_local bool yield_ran_other;

bool sdp_yield(void)
{
	uint64_t t = sdp_now_ns();
	sched_yield();
	return sdp_now_ns() - t > SDP_YIELD_RAN_NS;
}

bool sdp_spin_cpu_shared(void)
{
	return yield_ran_other;
}

void sdp_spin_start(struct sdp_spin *s, uint32_t us, uint64_t deadline,
		    uint32_t tick, uint32_t relax, unsigned flags)
{
	*s = (struct sdp_spin){ .tick = tick ? tick : 1, .relax = relax, .flags = flags };
	s->start = s->now = sdp_now_ns();
	s->end = s->start + (uint64_t)us * 1000;
	if (deadline && s->end > deadline)
		s->end = deadline;
	s->shared = (flags & SDP_SPIN_FOLLOW) && yield_ran_other;
}

/*
 * A sched_yield runs only tasks of the spinner's own scheduling group
 * (autogroup: its session; a cgroup: its service). A task of another
 * group waiting for this CPU waits out the whole spin, and the spinner's
 * group pays for the CPU it burnt at the next share: with the data
 * center's tiers in separate sessions, spinning made 1 request in 100
 * wait over 20 ms (TCP: 4-9 ms) for about 10 % more requests. So a yield
 * that ran nothing also asks whether more tasks are runnable than there
 * are CPUs (the first field of /proc/loadavg's "running/total", which
 * counts the asker): then the CPU may be wanted elsewhere, and the spin
 * ends as if the yield had run one. Read at most once a millisecond per
 * process; a host that does not have the file never stops a spin.
 */
#define SDP_LOADAVG_EVERY_NS 1000000

static _Atomic uint64_t wanted_at;       /* sdp_now_ns() of the last read */
static _Atomic int wanted;               /* its answer: 1 wanted, 0 not, -1 no file */
static _Atomic int ncpus;                /* CPUs online (the count is system-wide) */

static bool cpu_wanted_elsewhere(uint64_t now)
{
	uint64_t at = atomic_load_explicit(&wanted_at, memory_order_relaxed);
	int w = atomic_load_explicit(&wanted, memory_order_relaxed);
	if (w < 0 || (at && now - at < SDP_LOADAVG_EVERY_NS))
		return w > 0;
	if (!atomic_compare_exchange_strong(&wanted_at, &at, now))
		return w > 0;                 /* another thread reads it */
	int cpus = atomic_load_explicit(&ncpus, memory_order_relaxed);
	if (!cpus) {
		long on = sysconf(_SC_NPROCESSORS_ONLN);
		cpus = on > 0 && on < 1 << 20 ? (int)on : 1;
		atomic_store_explicit(&ncpus, cpus, memory_order_relaxed);
	}
	char buf[128];
	int fd = sys_open("/proc/loadavg", O_RDONLY | O_CLOEXEC);
	if (fd < 0) {
		/* No such file (no /proc, another system): never again. Out
		 * of descriptors, or interrupted: the last answer stands. */
		if (errno == ENOENT || errno == EACCES || errno == EPERM || errno == ENOSYS)
			atomic_store(&wanted, -1);
		return w > 0;
	}
	ssize_t r = sys_read(fd, buf, sizeof buf - 1);
	sys_close(fd);
	int n = -1;
	if (r > 0) {
		buf[r] = 0;
		n = sdp_loadavg_runnable(buf);
	}
	if (n < 0) {
		atomic_store(&wanted, -1);    /* not the format we read */
		return false;
	}
	w = n > cpus;
	atomic_store_explicit(&wanted, w, memory_order_relaxed);
	return w;
}

int sdp_spin_step(struct sdp_spin *s)
{
	s->n++;
	/* While the CPU is wanted, look at the clock (and yield) at every
	 * step: every microsecond spun is lost for the task we wait for. */
	if (!s->shared) {
		for (uint32_t i = 0; i < s->relax; i++)
			sdp_cpu_relax();
		if (s->n & (s->tick - 1))
			return SDP_SPIN_AGAIN;
	}
	s->now = sdp_now_ns();
	if (s->now > s->end &&
	    (!s->extend || s->now > s->ext_end || !s->extend(s->arg)))
		return SDP_SPIN_OVER;
	if (s->now - s->start > SDP_SPIN_YIELD_NS || s->shared) {
		bool ran = sdp_yield();
		if (!ran && cpu_wanted_elsewhere(s->now)) {
			s->contended = true;
			return SDP_SPIN_OVER;
		}
		if (s->flags & SDP_SPIN_FOLLOW) {
			yield_ran_other = ran;
			s->shared = ran;
		}
		s->contended |= ran;
		if (ran && (s->flags & SDP_SPIN_STOP_SHARED)) {
			s->shared = true;
			return SDP_SPIN_OVER;
		}
	}
	return SDP_SPIN_TICK;
}
