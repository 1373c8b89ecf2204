/*
 * Stream sockets mixed in one readiness set with a pipe, a timerfd, an
 * AF_UNIX socketpair and a listening socket: poll, select and epoll each
 * report exactly the descriptors that are ready, with the right events,
 * and nothing else.
 */
#include "testlib.h"
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/timerfd.h>

enum { S_TCP, S_PIPE, S_TIMER, S_UNIX, S_LISTEN, NFD };
static int fds[NFD];
static const char *names[NFD] = { "tcp", "pipe", "timerfd", "unix",
				   "listener" };

/* Checks that exactly the descriptors in `ready` (bitmask) are readable,
 * through poll, select and epoll (ep holds all with EPOLLIN, data = idx). */
static void expect_ready(int ep, unsigned ready, int line)
{
	struct pollfd p[NFD];
	for (int i = 0; i < NFD; i++)
		p[i] = (struct pollfd){ fds[i], POLLIN, 0 };
	int n = poll(p, NFD, ready ? 2000 : 0);
	int want = __builtin_popcount(ready);
	if (n != want)
		TL_FAIL("line %d: poll -> %d, expected %d", line, n, want);
	for (int i = 0; i < NFD; i++) {
		short exp = (ready >> i & 1) ? POLLIN : 0;
		if (p[i].revents != exp)
			TL_FAIL("line %d: poll %s revents 0x%x expected 0x%x",
				line, names[i], p[i].revents, exp);
	}

	fd_set r;
	FD_ZERO(&r);
	int maxfd = 0;
	for (int i = 0; i < NFD; i++) {
		FD_SET(fds[i], &r);
		if (fds[i] > maxfd)
			maxfd = fds[i];
	}
	struct timeval tv = { 2, 0 };
	if (!ready)
		tv.tv_sec = 0;
	n = select(maxfd + 1, &r, NULL, NULL, &tv);
	if (n != want)
		TL_FAIL("line %d: select -> %d, expected %d", line, n, want);
	for (int i = 0; i < NFD; i++)
		if (!!FD_ISSET(fds[i], &r) != (ready >> i & 1))
			TL_FAIL("line %d: select %s wrong", line, names[i]);

	struct epoll_event ev[NFD + 1];
	memset(ev, 0, sizeof ev);
	n = epoll_wait(ep, ev, NFD + 1, ready ? 2000 : 0);
	if (n != want)
		TL_FAIL("line %d: epoll_wait -> %d, expected %d", line, n,
			want);
	unsigned seen = 0;
	for (int i = 0; i < n; i++) {
		unsigned idx = ev[i].data.u32;
		if (idx >= NFD || !(ready >> idx & 1) || ev[i].events != EPOLLIN)
			TL_FAIL("line %d: epoll reported %u events 0x%x", line,
				idx, ev[i].events);
		seen |= 1u << idx;
	}
	if (seen != ready)
		TL_FAIL("line %d: epoll saw 0x%x expected 0x%x", line, seen,
			ready);
}

#define EXPECT_READY(ep, mask) expect_ready((ep), (mask), __LINE__)
#define B(i) (1u << (i))

int main(void)
{
	int c, s, pp[2], up[2];
	char buf[64];
	uint16_t port;

	tl_watchdog(15);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(pipe(pp));
	SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, up));
	int tfd = SYS(timerfd_create(CLOCK_MONOTONIC, 0));
	int l = tl_listen(AF_INET, &port);

	fds[S_TCP] = s;
	fds[S_PIPE] = pp[0];
	fds[S_TIMER] = tfd;
	fds[S_UNIX] = up[0];
	fds[S_LISTEN] = l;
	int ep = SYS(epoll_create1(0));
	for (int i = 0; i < NFD; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev));
	}

	EXPECT_READY(ep, 0);

	/* One at a time. */
	struct itimerspec its = { .it_value = { 0, 30000000 } };
	SYS(timerfd_settime(tfd, 0, &its, NULL));
	EXPECT_READY(ep, B(S_TIMER));
	uint64_t ticks;
	CHECK_EQ(read(tfd, &ticks, sizeof ticks), 8);
	CHECK_EQ(ticks, 1);
	EXPECT_READY(ep, 0);

	CHECK_EQ(write(pp[1], "p", 1), 1);
	EXPECT_READY(ep, B(S_PIPE));
	CHECK_EQ(read(pp[0], buf, sizeof buf), 1);

	CHECK_EQ(send(up[1], "u", 1, 0), 1);
	EXPECT_READY(ep, B(S_UNIX));
	CHECK_EQ(recv(up[0], buf, sizeof buf, 0), 1);

	CHECK_EQ(send(c, "t", 1, 0), 1);
	EXPECT_READY(ep, B(S_TCP));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);

	int c2 = tl_connect(AF_INET, port);
	EXPECT_READY(ep, B(S_LISTEN));
	int s2 = SYS(accept(l, NULL, NULL));
	expect_transport(c2);
	expect_transport(s2);
	EXPECT_READY(ep, 0);

	/* The new connection's data does not show on the old one. */
	CHECK_EQ(send(c2, "n", 1, 0), 1);
	EXPECT_READY(ep, 0);
	CHECK_EQ(recv(s2, buf, sizeof buf, 0), 1);

	/* Several at once. */
	CHECK_EQ(send(c, "tt", 2, 0), 2);
	CHECK_EQ(write(pp[1], "pp", 2), 2);
	EXPECT_READY(ep, B(S_TCP) | B(S_PIPE));
	SYS(timerfd_settime(tfd, 0, &its, NULL));
	CHECK_EQ(send(up[1], "uu", 2, 0), 2);
	struct pollfd tp = { tfd, POLLIN, 0 };
	CHECK_EQ(poll(&tp, 1, 2000), 1);	/* let the timer expire */
	EXPECT_READY(ep, B(S_TCP) | B(S_PIPE) | B(S_UNIX) | B(S_TIMER));
	int c3 = tl_connect(AF_INET, port);
	EXPECT_READY(ep, B(S_TCP) | B(S_PIPE) | B(S_UNIX) | B(S_TIMER) |
			 B(S_LISTEN));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 2);
	EXPECT_READY(ep, B(S_PIPE) | B(S_UNIX) | B(S_TIMER) | B(S_LISTEN));
	CHECK_EQ(read(pp[0], buf, sizeof buf), 2);
	CHECK_EQ(read(tfd, &ticks, sizeof ticks), 8);
	EXPECT_READY(ep, B(S_UNIX) | B(S_LISTEN));
	int s3 = SYS(accept(l, NULL, NULL));
	CHECK_EQ(recv(up[0], buf, sizeof buf, 0), 2);
	EXPECT_READY(ep, 0);

	/* EOF on each kind is readable. */
	SYS(close(c));
	SYS(close(pp[1]));
	SYS(close(up[1]));
	struct pollfd e[4] = { { s, POLLIN, 0 }, { pp[0], POLLIN, 0 },
			       { up[0], POLLIN, 0 }, { tfd, POLLIN, 0 } };
	CHECK_EQ(poll(e, 4, 2000), 3);
	CHECK_EQ(e[0].revents, POLLIN);			/* half-closed TCP */
	CHECK_EQ(e[1].revents, POLLHUP);		/* pipe, no writer */
	CHECK_EQ(e[2].revents, POLLIN | POLLHUP);	/* unix, peer gone */
	CHECK_EQ(e[3].revents, 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);

	int all[] = { s, pp[0], up[0], tfd, l, c2, s2, c3, s3, ep };
	for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
		SYS(close(all[i]));
	return 0;
}
