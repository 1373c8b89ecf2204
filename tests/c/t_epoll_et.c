/*
 * epoll edge-triggered and one-shot: EPOLLET reports each arrival once (no
 * repeat while the data sits unread, a new event for each new arrival),
 * EPOLLOUT edge after the send side drains; EPOLLONESHOT reports once and
 * stays silent until re-armed with EPOLL_CTL_MOD; two epoll sets watching
 * one socket both see it.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/epoll.h>

static int wait_n(int ep, struct epoll_event *ev, int max, int ms)
{
	memset(ev, 0, sizeof *ev * (size_t)max);
	return epoll_wait(ep, ev, max, ms);
}

static size_t drained;                 /* bytes the drainer read */

static void *drainer(void *arg)
{
	int s = *(int *)arg;
	static char buf[65536];
	tl_idle_ms(50);
	ssize_t n;
	while ((n = recv(s, buf, sizeof buf, MSG_DONTWAIT)) > 0)
		drained += (size_t)n;
	return NULL;
}

int main(void)
{
	int c, s;
	char buf[64];
	struct epoll_event ev, out[4];

	tl_watchdog(15);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* --- EPOLLET on the receiver. */
	int ep = SYS(epoll_create1(0));
	ev.events = EPOLLIN | EPOLLET;
	ev.data.fd = s;
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
	CHECK_EQ(wait_n(ep, out, 4, 0), 0);
	for (int round = 0; round < 5; round++) {
		CHECK_EQ(send(c, "12345", 5, 0), 5);
		CHECK_EQ(wait_n(ep, out, 4, 1000), 1);
		CHECK_EQ(out[0].events, EPOLLIN);
		CHECK_EQ(out[0].data.fd, s);
		/* Not repeated while unread. */
		CHECK_EQ(wait_n(ep, out, 4, 0), 0);
		CHECK_EQ(wait_n(ep, out, 4, 20), 0);
	}
	/* Everything is still there: 25 bytes, read once. */
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 25);
	CHECK_EQ(wait_n(ep, out, 4, 0), 0);
	/* Partial read leaves data but no new event; a new arrival is a new
	 * event. */
	CHECK_EQ(send(c, "abcdef", 6, 0), 6);
	CHECK_EQ(wait_n(ep, out, 4, 1000), 1);
	CHECK_EQ(recv(s, buf, 3, 0), 3);
	CHECK_EQ(wait_n(ep, out, 4, 0), 0);
	CHECK_EQ(send(c, "g", 1, 0), 1);
	CHECK_EQ(wait_n(ep, out, 4, 1000), 1);
	CHECK_EQ(out[0].events, EPOLLIN);
	CHECK_EQ(wait_n(ep, out, 4, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
	CHECK(memcmp(buf, "defg", 4) == 0);
	/* EOF is an edge too. */
	/* (checked at the end) */

	/* --- EPOLLOUT edge on the sender. */
	int ep2 = SYS(epoll_create1(0));
	ev.events = EPOLLOUT | EPOLLET;
	ev.data.fd = c;
	SYS(epoll_ctl(ep2, EPOLL_CTL_ADD, c, &ev));
	CHECK_EQ(wait_n(ep2, out, 4, 0), 1);	/* initial edge */
	CHECK_EQ(out[0].events, EPOLLOUT);
	CHECK_EQ(wait_n(ep2, out, 4, 0), 0);	/* not repeated */
	static char big[65536];
	memset(big, 'q', sizeof big);
	size_t filled = 0;
	ssize_t k;
	while ((k = send(c, big, sizeof big, MSG_DONTWAIT)) > 0)
		filled += (size_t)k;
	CHECK_EQ(errno, EAGAIN);
	/* The receiver sees the data (one edge, maybe merged). */
	CHECK(wait_n(ep, out, 4, 1000) >= 1);
	CHECK_EQ(wait_n(ep2, out, 4, 0), 0);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, drainer, &s), 0);
	CHECK_EQ(wait_n(ep2, out, 4, 5000), 1);
	CHECK_EQ(out[0].events, EPOLLOUT);
	CHECK_EQ(pthread_join(th, NULL), 0);
	/* The rest of what was sent, whole (across a link some may still be
	 * on its way when a non-blocking drain finds the queue empty). */
	while (drained < filled) {
		ssize_t n = recv(s, big, sizeof big, 0);
		CHECK(n > 0, "recv -> %zd with %zu of %zu bytes read", n, drained, filled);
		drained += (size_t)n;
	}
	CHECK_EQ(drained, filled);
	SYS(close(ep2));
	while (wait_n(ep, out, 4, 0) > 0)
		;

	/* --- EPOLLONESHOT. */
	int ep3 = SYS(epoll_create1(0));
	ev.events = EPOLLIN | EPOLLONESHOT;
	ev.data.u32 = 42;
	SYS(epoll_ctl(ep3, EPOLL_CTL_ADD, s, &ev));
	CHECK_EQ(send(c, "one", 3, 0), 3);
	CHECK_EQ(wait_n(ep3, out, 4, 1000), 1);
	CHECK_EQ(out[0].events, EPOLLIN);
	CHECK_EQ(out[0].data.u32, 42);
	/* Disarmed: neither the unread data nor new data are reported. */
	CHECK_EQ(wait_n(ep3, out, 4, 0), 0);
	CHECK_EQ(send(c, "two", 3, 0), 3);
	CHECK_EQ(wait_n(ep3, out, 4, 20), 0);
	/* The ET set still sees the new arrival. */
	CHECK(wait_n(ep, out, 4, 1000) >= 1);
	/* Re-arm: reported again (data is queued). */
	ev.data.u32 = 43;
	SYS(epoll_ctl(ep3, EPOLL_CTL_MOD, s, &ev));
	CHECK_EQ(wait_n(ep3, out, 4, 1000), 1);
	CHECK_EQ(out[0].data.u32, 43);
	CHECK_EQ(wait_n(ep3, out, 4, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 6);
	CHECK(memcmp(buf, "onetwo", 6) == 0);
	/* Re-armed with nothing queued: quiet until data arrives. */
	SYS(epoll_ctl(ep3, EPOLL_CTL_MOD, s, &ev));
	CHECK_EQ(wait_n(ep3, out, 4, 0), 0);
	CHECK_EQ(send(c, "3", 1, 0), 1);
	CHECK_EQ(wait_n(ep3, out, 4, 1000), 1);
	CHECK_EQ(wait_n(ep3, out, 4, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);

	/* EOF: one ET edge with EPOLLIN. */
	while (wait_n(ep, out, 4, 0) > 0)
		;
	SYS(close(c));
	CHECK_EQ(wait_n(ep, out, 4, 1000), 1);
	CHECK(out[0].events & EPOLLIN);
	CHECK_EQ(wait_n(ep, out, 4, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));
	SYS(close(ep));
	SYS(close(ep3));
	return 0;
}
