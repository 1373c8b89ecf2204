/*
 * A socket added to an epoll set before its connect(), as nginx does with
 * its upstream connections: socket, O_NONBLOCK, EPOLL_CTL_ADD (in,
 * out, rdhup, edge- or level-triggered), connect -> EINPROGRESS. The set
 * must then report the connect's completion (EPOLLOUT), and after a
 * request is sent, the answer (EPOLLIN) - also when the connection turned
 * out to be SDP after it was registered. Two sets hold the socket at once
 * (one edge-, one level-triggered), and a second socket is registered and
 * closed before it ever connects. Byte-exact.
 */
#include "testlib.h"
#include <sys/epoll.h>

#define REQ  1000
#define RESP 200000

static int wait_one(int ep, int fd, uint32_t want, int ms)
{
	struct epoll_event ev[8];
	double end = tl_now() + ms / 1000.0;
	for (;;) {
		int left = (int)((end - tl_now()) * 1000);
		CHECK(left > 0, "epoll set %d: no event 0x%x for fd %d within %d ms",
		      ep, want, fd, ms);
		int n = epoll_wait(ep, ev, 8, left);
		CHECK(n >= 0);
		for (int i = 0; i < n; i++)
			if (ev[i].data.fd == fd && (ev[i].events & want))
				return (int)ev[i].events;
	}
}

static void one_round(bool edge)
{
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int ep_a = SYS(epoll_create1(0)), ep_b = SYS(epoll_create1(0));

	/* registered and closed before any connect: must leave nothing behind */
	int gone = SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
	struct epoll_event g = { .events = EPOLLIN | EPOLLOUT, .data.fd = gone };
	SYS(epoll_ctl(ep_a, EPOLL_CTL_ADD, gone, &g));
	SYS(close(gone));

	int s = SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
	struct epoll_event ea = { .events = EPOLLIN | EPOLLOUT | EPOLLRDHUP |
					    (edge ? EPOLLET : 0u), .data.fd = s };
	struct epoll_event eb = { .events = EPOLLIN | EPOLLOUT, .data.fd = s };
	SYS(epoll_ctl(ep_a, EPOLL_CTL_ADD, s, &ea));
	SYS(epoll_ctl(ep_b, EPOLL_CTL_ADD, s, &eb));
	struct sockaddr_storage sa;
	socklen_t sl = tl_addr(AF_INET, port, &sa);
	int r = connect(s, (struct sockaddr *)&sa, sl);
	CHECK(r == 0 || errno == EINPROGRESS);
	int a = SYS(accept(l, NULL, NULL));

	wait_one(ep_a, s, EPOLLOUT, 5000);
	wait_one(ep_b, s, EPOLLOUT, 5000);
	int err = -1;
	socklen_t el = sizeof err;
	SYS(getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el));
	CHECK_EQ(err, 0);
	expect_transport(s);
	expect_transport(a);

	static char buf[RESP];
	tl_fill(buf, REQ, 0, 7);
	CHECK_EQ(send(s, buf, REQ, 0), REQ);
	tl_recv_pat(a, 0, REQ, 7, REQ);
	tl_send_pat(a, 0, RESP, 8, 65536);

	/* the answer must be reported by both sets, then read in full */
	wait_one(ep_a, s, EPOLLIN, 5000);
	wait_one(ep_b, s, EPOLLIN, 5000);
	size_t got = 0;
	while (got < RESP) {
		ssize_t k = recv(s, buf + got, RESP - got, 0);
		if (k < 0 && errno == EAGAIN) {
			wait_one(ep_b, s, EPOLLIN, 5000);
			continue;
		}
		CHECK(k > 0, "recv after %zu of %d bytes", got, RESP);
		got += (size_t)k;
	}
	CHECK_PAT(buf, RESP, 0, 8);
	SYS(close(a));
	wait_one(ep_b, s, EPOLLIN, 5000);
	CHECK_EQ(recv(s, buf, 1, 0), 0);
	SYS(close(s));
	SYS(close(ep_a));
	SYS(close(ep_b));
	SYS(close(l));
}

static void case_edge(void)
{
	tl_watchdog(30);
	for (int i = 0; i < 20; i++)
		one_round(true);
}

static void case_level(void)
{
	tl_watchdog(30);
	for (int i = 0; i < 20; i++)
		one_round(false);
}

int main(void)
{
	static const struct tl_case cases[] = {
		{ "edge", case_edge },
		{ "level", case_level },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
