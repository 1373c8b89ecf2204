/*
 * An idle blocked receiver must sleep, not spin: a child blocks in recv(),
 * then in poll(), then in epoll_wait() on a stream socket while the parent
 * lets time pass on a timerfd before sending. The child's CPU time (all its
 * threads, getrusage RUSAGE_SELF) over each wait must stay below 25% of the
 * wall time it waited.
 */
#include "testlib.h"
#include <sys/epoll.h>
#include <sys/resource.h>

static double cpu_now(void)
{
	struct rusage ru;
	SYS(getrusage(RUSAGE_SELF, &ru));
	return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
	       (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
}

struct report { double cpu, wall; };

int main(void)
{
	uint16_t port;
	int ready[2], rep[2];
	const unsigned wait_ms[3] = { 400, 300, 300 };

	tl_watchdog(15);
	int l = tl_listen(AF_INET, &port);
	SYS(pipe(ready));
	SYS(pipe(rep));
	pid_t pid = tl_fork();
	if (pid == 0) {
		char buf[16];
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		int ep = SYS(epoll_create1(0));
		struct epoll_event ev = { .events = EPOLLIN };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev));
		for (int i = 0; i < 3; i++) {
			double c0 = cpu_now(), t0 = tl_now();
			CHECK_EQ(write(ready[1], "r", 1), 1);
			if (i == 0) {
				CHECK_EQ(recv(c, buf, sizeof buf, 0), 1);
			} else if (i == 1) {
				struct pollfd p = { c, POLLIN, 0 };
				CHECK_EQ(poll(&p, 1, -1), 1);
				CHECK_EQ(recv(c, buf, sizeof buf, 0), 1);
			} else {
				CHECK_EQ(epoll_wait(ep, &ev, 1, -1), 1);
				CHECK_EQ(recv(c, buf, sizeof buf, 0), 1);
			}
			struct report r = { cpu_now() - c0, tl_now() - t0 };
			CHECK_EQ(write(rep[1], &r, sizeof r), (ssize_t)sizeof r);
		}
		_exit(0);
	}
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	const char *what[3] = { "recv", "poll", "epoll_wait" };
	for (int i = 0; i < 3; i++) {
		char b;
		CHECK_EQ(read(ready[0], &b, 1), 1);
		tl_idle_ms(wait_ms[i]);
		CHECK_EQ(send(s, "x", 1, 0), 1);
		struct report r;
		CHECK_EQ(read(rep[0], &r, sizeof r), (ssize_t)sizeof r);
		fprintf(stderr, "%s: waited %.3f s, child CPU %.3f s\n",
			what[i], r.wall, r.cpu);
		CHECK(r.wall >= wait_ms[i] / 1000.0 * 0.9,
		      "%s returned after %.3f s, before the data was sent",
		      what[i], r.wall);
		CHECK(r.cpu < 0.25 * r.wall,
		      "blocked in %s the child used %.3f s CPU in %.3f s: "
		      "busy-waiting", what[i], r.cpu, r.wall);
	}
	tl_wait_ok(pid);
	SYS(close(s));
	SYS(close(l));
	return 0;
}
