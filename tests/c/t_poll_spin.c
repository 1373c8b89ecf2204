/*
 * An event loop on a busy CPU: each turn, one poll() finds the socket
 * ready at once and the next finds nothing before its short timeout - a
 * server whose requests come in between its timers (MooseFS's daemons).
 *
 * Kernel TCP sleeps in the "nothing yet" calls. Under SDP a poll spins
 * before it sleeps, with a budget that halves after a spin that waited in
 * vain while another task wanted the CPU: here a CPU burner shares ours,
 * so the budget must wither and most "nothing yet" calls sleep at once. A
 * call that finds the socket ready at its first look did not spin: it must
 * not count as a spin that paid off and restore the budget, or every
 * "nothing yet" call would spin its full budget again, giving the CPU away
 * to the burner in a sched_yield (an involuntary context switch) each
 * time. The same when what is ready at once is another descriptor of the
 * set (a pipe): poll() asks the kernel about those at its first look
 * too, before it spins. The same loops with epoll_wait.
 *
 * Measured: the involuntary context switches of the polling thread over
 * the loop (getrusage RUSAGE_THREAD). Spinning with the full budget in
 * each of the N "nothing yet" calls makes at least N; a withered budget
 * (one call in 8 probes with the full budget) about N / 8.
 */
#include "testlib.h"
#include <sched.h>
#include <sys/epoll.h>
#include <sys/resource.h>

#define TURNS 200

static long nivcsw(void)
{
	struct rusage ru;
	SYS(getrusage(RUSAGE_THREAD, &ru));
	return ru.ru_nivcsw;
}

/* This process and a CPU burner on one CPU; returns the burner. */
static pid_t share_cpu(void)
{
	cpu_set_t set;
	CPU_ZERO(&set);
	int cpu = sched_getcpu();
	CHECK(cpu >= 0);
	CPU_SET(cpu, &set);
	SYS(sched_setaffinity(0, sizeof set, &set));
	pid_t pid = tl_fork();
	if (pid == 0)
		for (;;)
			;                     /* burn until killed */
	return pid;
}

/* mixed: the "ready at once" call finds a pipe ready, not the socket. */
static void loop(bool use_epoll, bool mixed)
{
	tl_watchdog(30);
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(s);
	int pp[2];
	SYS(pipe(pp));
	int ep = -1;
	if (use_epoll) {
		ep = SYS(epoll_create1(0));
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = s };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
		ev.data.fd = pp[0];
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, pp[0], &ev));
	}
	pid_t burner = share_cpu();
	long before = nivcsw();
	for (int i = 0; i < TURNS; i++) {
		CHECK_EQ(mixed ? write(pp[1], "r", 1) : send(c, "r", 1, 0), 1);
		struct pollfd p[2] = { { s, POLLIN, 0 }, { pp[0], POLLIN, 0 } };
		struct epoll_event ev;
		/* ready at once */
		if (use_epoll)
			CHECK_EQ(epoll_wait(ep, &ev, 1, 5000), 1);
		else
			CHECK_EQ(poll(p, 2, 5000), 1);
		char b;
		CHECK_EQ(mixed ? read(pp[0], &b, 1) : recv(s, &b, 1, 0), 1);
		/* nothing yet: the timeout runs out */
		if (use_epoll)
			CHECK_EQ(epoll_wait(ep, &ev, 1, 1), 0);
		else
			CHECK_EQ(poll(p, 2, 1), 0);
	}
	long n = nivcsw() - before;
	SYS(kill(burner, SIGKILL));
	SYS(waitpid(burner, NULL, 0));
	printf("    %s%s: %ld involuntary context switches in %d turns\n",
	       use_epoll ? "epoll" : "poll", mixed ? " (a pipe ready)" : "", n, TURNS);
	fflush(stdout);
	CHECK(n < TURNS / 3, "%ld involuntary context switches in %d turns: the "
	      "\"nothing yet\" calls kept spinning on a shared CPU", n, TURNS);
	if (ep >= 0)
		SYS(close(ep));
	SYS(close(pp[0]));
	SYS(close(pp[1]));
	SYS(close(c));
	SYS(close(s));
}

static void c_poll(void) { loop(false, false); }
static void c_poll_pipe(void) { loop(false, true); }
static void c_epoll(void) { loop(true, false); }
static void c_epoll_pipe(void) { loop(true, true); }

int main(void)
{
	static const struct tl_case cases[] = {
		{ "poll", c_poll },
		{ "poll_pipe", c_poll_pipe },
		{ "epoll", c_epoll },
		{ "epoll_pipe", c_epoll_pipe },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
