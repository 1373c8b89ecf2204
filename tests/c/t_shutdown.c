/*
 * shutdown(): SHUT_WR sends EOF after all queued data while the other
 * direction keeps working; SHUT_RD makes reads return queued data then 0
 * instead of blocking, while incoming data is still accepted; SHUT_RDWR
 * does both. Repeated shutdowns, poll flags (POLLRDHUP, POLLHUP) and the
 * errno of later calls are those of kernel TCP.
 */
#include "testlib.h"

#define SEED 21

static short revents(int fd)
{
	struct pollfd p = { fd, POLLIN | POLLOUT | POLLRDHUP, 0 };
	SYS(poll(&p, 1, 0));
	return p.revents;
}

int main(void)
{
	int c, s;
	static char buf[100000];

	tl_watchdog(10);
	signal(SIGPIPE, SIG_IGN);

	/* --- SHUT_WR: queued data arrives before EOF; reverse path open. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	tl_fill(buf, 50000, 0, SEED);
	tl_send_all(c, buf, 50000);
	SYS(shutdown(c, SHUT_WR));
	CHECK_ERR(send(c, "x", 1, 0), EPIPE);
	CHECK_EQ(revents(c), POLLOUT);
	CHECK_EQ(revents(s), POLLIN | POLLOUT | POLLRDHUP);
	memset(buf, 0, sizeof buf);
	tl_recv_all(s, buf, 50000);
	CHECK_PAT(buf, 50000, 0, SEED);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	/* The peer can still send back, more than once, and we read it. */
	tl_fill(buf, 30000, 0, SEED + 1);
	tl_send_all(s, buf, 30000);
	CHECK_EQ(send(s, "tail", 4, 0), 4);
	memset(buf, 0, sizeof buf);
	tl_recv_all(c, buf, 30000);
	CHECK_PAT(buf, 30000, 0, SEED + 1);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 4);
	CHECK(memcmp(buf, "tail", 4) == 0);
	/* Shutting down the same direction again is fine. */
	SYS(shutdown(c, SHUT_WR));
	/* Now the other way: both halves closed, both see HUP. */
	SYS(shutdown(s, SHUT_WR));
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_EQ(revents(c), POLLIN | POLLOUT | POLLHUP | POLLRDHUP);
	CHECK_EQ(revents(s), POLLIN | POLLOUT | POLLHUP | POLLRDHUP);
	expect_bytes(c, 50000, 30004);
	expect_bytes(s, 30004, 50000);
	SYS(close(c));
	SYS(close(s));

	/* --- SHUT_RD: queued data still readable, then 0 without blocking;
	 * the peer's further data is accepted and readable too. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	SYS(shutdown(s, SHUT_RD));
	CHECK_EQ(revents(s), POLLIN | POLLOUT | POLLRDHUP);
	CHECK_EQ(revents(c), POLLOUT);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 3);
	CHECK(memcmp(buf, "abc", 3) == 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_EQ(send(c, "de", 2, 0), 2);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 2);
	CHECK(memcmp(buf, "de", 2) == 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	/* Writing is unaffected. */
	CHECK_EQ(send(s, "zz", 2, 0), 2);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 2);
	CHECK(memcmp(buf, "zz", 2) == 0);
	expect_bytes(c, 5, 2);
	expect_bytes(s, 2, 5);
	SYS(close(c));
	SYS(close(s));

	/* --- SHUT_RDWR: peer reads EOF, our send is EPIPE, our recv 0,
	 * repeating it is fine. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(s, "bye", 3, 0), 3);
	SYS(shutdown(s, SHUT_RDWR));
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 3);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_ERR(send(s, "a", 1, 0), EPIPE);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(shutdown(s, SHUT_RDWR));
	CHECK_EQ(revents(s), POLLIN | POLLOUT | POLLHUP | POLLRDHUP);
	SYS(close(c));
	CHECK_EQ(revents(s), POLLIN | POLLOUT | POLLHUP | POLLRDHUP);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));

	/* --- SHUT_RDWR and then the peer sends: the data cannot be read
	 * any more, so kernel TCP resets. The peer's send itself succeeds;
	 * our side reports ECONNRESET once, then EOF; the peer gets EOF on
	 * read (it had our FIN) and EPIPE on its next send. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(shutdown(s, SHUT_RDWR));
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_EQ(send(c, "q", 1, 0), 1);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_ERR(send(c, "q", 1, 0), EPIPE);
	CHECK_ERR(recv(s, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_ERR(shutdown(s, SHUT_RDWR), ENOTCONN);
	SYS(close(c));
	SYS(close(s));

	/* --- invalid "how". */
	tl_pair(AF_INET, &c, &s);
	CHECK_ERR(shutdown(c, 3), EINVAL);
	CHECK_ERR(shutdown(c, -1), EINVAL);
	CHECK_EQ(send(c, "ok", 2, 0), 2);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 2);
	SYS(close(c));
	SYS(close(s));
	return 0;
}
