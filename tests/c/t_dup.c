/*
 * dup / dup2 / dup3 / F_DUPFD: copies share one connection and one file
 * status (O_NONBLOCK); closing copies does not end the connection until the
 * last one is closed (no early EOF at the peer); shutdown() through any
 * copy affects all; dup2 onto another socket closes that one; dup3 sets
 * O_CLOEXEC on the copy only.
 */
#include "testlib.h"

#define SEED 71

static void no_eof(int s)
{
	char b;
	CHECK_ERR(recv(s, &b, 1, MSG_DONTWAIT), EAGAIN);
	struct pollfd p = { s, POLLIN | POLLRDHUP, 0 };
	CHECK_EQ(poll(&p, 1, 0), 0);
}

int main(void)
{
	int c, s;
	char buf[64];

	tl_watchdog(10);
	signal(SIGPIPE, SIG_IGN);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	int d1 = SYS(dup(c));
	int d2 = SYS(dup2(c, 100));
	CHECK_EQ(d2, 100);
	int d3 = SYS(dup3(c, 101, O_CLOEXEC));
	CHECK_EQ(d3, 101);
	int d4 = SYS(fcntl(c, F_DUPFD, 200));
	CHECK(d4 >= 200);
	CHECK_EQ(dup2(c, c), c);
	CHECK_ERR(dup3(c, c, 0), EINVAL);
	CHECK_EQ(fcntl(d1, F_GETFD), 0);
	CHECK_EQ(fcntl(d2, F_GETFD), 0);
	CHECK_EQ(fcntl(d3, F_GETFD), FD_CLOEXEC);
	CHECK_EQ(fcntl(c, F_GETFD), 0);
	int all[5] = { c, d1, d2, d3, d4 };
	for (int i = 0; i < 5; i++)
		expect_transport(all[i]);

	/* One stream whatever copy writes. */
	uint64_t off = 0;
	for (int round = 0; round < 3; round++)
		for (int i = 0; i < 5; i++) {
			tl_send_pat(all[i], off, 3000, SEED, 3000);
			off += 3000;
		}
	tl_recv_pat(s, 0, off, SEED, 5000);
	/* ... and whatever copy reads. */
	uint64_t roff = 0;
	for (int i = 0; i < 5; i++) {
		tl_send_pat(s, roff, 1000, SEED + 1, 1000);
		tl_recv_pat(all[i], roff, 1000, SEED + 1, 1000);
		roff += 1000;
	}

	/* File status flags are shared. */
	SYS(fcntl(d1, F_SETFL, O_NONBLOCK));
	CHECK_EQ(fcntl(c, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	CHECK_ERR(recv(c, buf, 1, 0), EAGAIN);
	CHECK_ERR(recv(d4, buf, 1, 0), EAGAIN);
	SYS(fcntl(d4, F_SETFL, 0));
	CHECK_EQ(fcntl(d2, F_GETFL) & O_NONBLOCK, 0);

	/* Closing copies one by one: no EOF until the last. */
	SYS(close(c));
	no_eof(s);
	SYS(close(d1));
	no_eof(s);
	SYS(close(d3));
	no_eof(s);
	SYS(close(d4));
	no_eof(s);
	tl_send_pat(d2, off, 777, SEED, 777);
	off += 777;
	tl_recv_pat(s, off - 777, 777, SEED, 777);
	expect_bytes(d2, off, roff);
	expect_bytes(s, roff, off);
	SYS(close(d2));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));

	/* shutdown through one copy acts on the connection. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	d1 = SYS(dup(c));
	SYS(shutdown(d1, SHUT_WR));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_ERR(send(c, "x", 1, 0), EPIPE);
	CHECK_EQ(send(s, "back", 4, 0), 4);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 4);
	SYS(close(d1));
	SYS(close(c));
	SYS(close(s));

	/* dup2 onto a descriptor holding another connection closes it. */
	int c2, s2;
	tl_pair(AF_INET, &c, &s);
	tl_pair(AF_INET, &c2, &s2);
	CHECK_EQ(dup2(c, c2), c2);		/* old c2 connection closed */
	CHECK_EQ(recv(s2, buf, sizeof buf, 0), 0);
	expect_transport(c2);
	CHECK_EQ(send(c2, "via-c2", 6, 0), 6);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 6);
	CHECK(memcmp(buf, "via-c2", 6) == 0);
	SYS(close(c));
	no_eof(s);
	SYS(close(c2));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));
	SYS(close(s2));
	return 0;
}
