/*
 * An epoll set whose SDP members alone can fill the caller's array must
 * still report its other members: the kernel's level-triggered ready list
 * re-queues a reported member at its tail, so with maxevents smaller than
 * the ready members every one of them comes in turn. A server that waits
 * for 512 events with 600 busy connections must still see its listener
 * (one accept per turn, as nginx) and its pipes and timers.
 *
 * level: 4 connections with unread bytes and a pipe with unread bytes,
 *        epoll_wait(maxevents 1) 40 times: each of the 5 is reported.
 * listen: the same 4 connections and a listener with a connection waiting,
 *         epoll_wait(maxevents 4): the listener is reported within 10
 *         waits, and accept() then returns the connection.
 * Byte-exact: the pending bytes are read and checked at the end.
 */
#include "testlib.h"
#include <sys/epoll.h>

#define NC    4
#define BYTES 1000

struct conns {
	int cli[NC], srv[NC];
};

static void conns_open(struct conns *k)
{
	for (int i = 0; i < NC; i++) {
		tl_pair(AF_INET, &k->cli[i], &k->srv[i]);
		expect_transport(k->cli[i]);
		expect_transport(k->srv[i]);
		tl_send_pat(k->srv[i], 0, BYTES, 30 + (uint32_t)i, BYTES);
	}
}

static void conns_check_close(struct conns *k)
{
	for (int i = 0; i < NC; i++) {
		tl_recv_pat(k->cli[i], 0, BYTES, 30 + (uint32_t)i, BYTES);
		SYS(close(k->cli[i]));
		SYS(close(k->srv[i]));
	}
}

static void add(int ep, int fd, int tag)
{
	struct epoll_event e = { .events = EPOLLIN, .data.u32 = (uint32_t)tag };
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e));
}

static void case_level(void)
{
	tl_watchdog(30);
	struct conns k;
	conns_open(&k);
	int pfd[2];
	SYS(pipe(pfd));
	CHECK_EQ(write(pfd[1], "p", 1), 1);
	int ep = SYS(epoll_create1(0));
	for (int i = 0; i < NC; i++)
		add(ep, k.cli[i], i);
	add(ep, pfd[0], NC);
	/* every member must be ready before the count starts */
	for (int i = 0; i < NC; i++) {
		struct pollfd p = { .fd = k.cli[i], .events = POLLIN };
		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	int seen[NC + 1] = { 0 };
	for (int w = 0; w < 40; w++) {
		struct epoll_event ev;
		int n = SYS(epoll_wait(ep, &ev, 1, 5000));
		CHECK_EQ(n, 1);
		CHECK(ev.data.u32 <= NC, "unknown tag %u", ev.data.u32);
		seen[ev.data.u32]++;
	}
	for (int i = 0; i < NC; i++)
		CHECK(seen[i] > 0, "connection %d never reported in 40 waits "
		      "(pipe %d times)", i, seen[NC]);
	CHECK(seen[NC] > 0, "the pipe was never reported in 40 waits of "
	      "maxevents 1 (connections %d %d %d %d times)",
	      seen[0], seen[1], seen[2], seen[3]);
	char c;
	CHECK_EQ(read(pfd[0], &c, 1), 1);
	CHECK_EQ(c, 'p');
	conns_check_close(&k);
	SYS(close(pfd[0]));
	SYS(close(pfd[1]));
	SYS(close(ep));
}

static void case_listen(void)
{
	tl_watchdog(30);
	struct conns k;
	conns_open(&k);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int ep = SYS(epoll_create1(0));
	for (int i = 0; i < NC; i++)
		add(ep, k.cli[i], i);
	add(ep, l, NC);
	for (int i = 0; i < NC; i++) {
		struct pollfd p = { .fd = k.cli[i], .events = POLLIN };
		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	int c = tl_connect(AF_INET, port);
	struct pollfd p = { .fd = l, .events = POLLIN };
	CHECK_EQ(poll(&p, 1, 5000), 1);
	int w;
	bool got = false;
	for (w = 0; w < 10 && !got; w++) {
		struct epoll_event ev[NC];
		int n = SYS(epoll_wait(ep, ev, NC, 5000));
		CHECK(n >= 1 && n <= NC);
		for (int i = 0; i < n; i++)
			got |= ev[i].data.u32 == NC;
	}
	CHECK(got, "the listener was never reported in %d waits of maxevents "
	      "%d with %d busy connections", w, NC, NC);
	int a = SYS(accept(l, NULL, NULL));
	expect_transport(a);
	tl_send_pat(c, 0, BYTES, 40, BYTES);
	tl_recv_pat(a, 0, BYTES, 40, BYTES);
	SYS(close(a));
	SYS(close(c));
	SYS(close(l));
	conns_check_close(&k);
	SYS(close(ep));
}

int main(void)
{
	static const struct tl_case cases[] = {
		{ "level", case_level },
		{ "listen", case_listen },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
