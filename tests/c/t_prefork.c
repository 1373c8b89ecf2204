/*
 * Pre-fork server: the parent creates the listening socket, forks two
 * server children that both block in accept() on it and serve requests,
 * and a client child that makes 12 connections; the parent only waits.
 * Every request gets its own answer; both servers stop on "quit".
 */
#include "testlib.h"

#define NCONN 12

static int serve(int l)
{
	int served = 0;
	for (;;) {
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		uint32_t req[2];
		CHECK_EQ(recv(s, req, sizeof req, MSG_WAITALL), 8);
		if (req[0] == 0xFFFFFFFFu) {
			CHECK_EQ(send(s, "bye", 3, 0), 3);
			SYS(close(s));
			return served;
		}
		/* Answer: req[1] bytes of the pattern seeded by req[0]. */
		tl_send_pat(s, 0, req[1], req[0], 65536);
		char b;
		CHECK_EQ(recv(s, &b, 1, 0), 0);
		expect_bytes(s, req[1], 8);
		SYS(close(s));
		served++;
	}
}

int main(void)
{
	uint16_t port;
	pid_t srv[2];

	tl_watchdog(20);
	int l = tl_listen(AF_INET, &port);
	for (int i = 0; i < 2; i++) {
		srv[i] = tl_fork();
		if (srv[i] == 0)
			_exit(10 + serve(l));	/* 1 = failure */
	}
	pid_t cli = tl_fork();
	if (cli == 0) {
		SYS(close(l));
		for (uint32_t i = 0; i < NCONN; i++) {
			int c = tl_connect(AF_INET, port);
			expect_transport(c);
			uint32_t req[2] = { 1000 + i, 1000 + i * 37000 };
			CHECK_EQ(send(c, req, sizeof req, 0), 8);
			tl_recv_pat(c, 0, req[1], req[0], 65536);
			SYS(shutdown(c, SHUT_WR));
			char b;
			CHECK_EQ(recv(c, &b, 1, 0), 0);
			SYS(close(c));
		}
		for (int i = 0; i < 2; i++) {
			int c = tl_connect(AF_INET, port);
			uint32_t req[2] = { 0xFFFFFFFFu, 0 };
			CHECK_EQ(send(c, req, sizeof req, 0), 8);
			char b[8];
			CHECK_EQ(recv(c, b, sizeof b, MSG_WAITALL), 3);
			SYS(close(c));
		}
		_exit(0);
	}
	SYS(close(l));
	tl_wait_ok(cli);
	int total = 0;
	for (int i = 0; i < 2; i++) {
		int st;
		CHECK_EQ(waitpid(srv[i], &st, 0), srv[i]);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) >= 10,
		      "server %d failed, status 0x%x", i, st);
		total += WEXITSTATUS(st) - 10;
	}
	CHECK_EQ(total, NCONN);
	return 0;
}
