/*
 * Closing a socket with unread data resets the connection, as kernel TCP
 * does: the peer first reads whatever was already queued to it, then gets
 * ECONNRESET exactly once, then EOF; its sends fail ECONNRESET (if the
 * error is still pending) then EPIPE; poll shows POLLERR|POLLHUP; SO_ERROR
 * reports and clears ECONNRESET. SO_LINGER {1, 0} resets as well, also
 * when it was set before the connection existed (on the listener, or
 * before connect).
 */
#include "testlib.h"

static short revents(int fd)
{
	struct pollfd p = { fd, POLLIN | POLLOUT | POLLRDHUP, 0 };
	SYS(poll(&p, 1, 0));
	return p.revents;
}

#define ALL (POLLIN | POLLOUT | POLLERR | POLLHUP | POLLRDHUP)

int main(void)
{
	int c, s, e;
	socklen_t el;
	char buf[100];

	tl_watchdog(10);
	signal(SIGPIPE, SIG_IGN);

	/* 1: reader gets ECONNRESET then EOF, sends are EPIPE. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	SYS(close(s));			/* "abc" unread */
	CHECK_EQ(revents(c), ALL);
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(revents(c), POLLIN | POLLOUT | POLLHUP | POLLRDHUP);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_ERR(send(c, "x", 1, 0), EPIPE);
	CHECK_ERR(send(c, "x", 1, 0), EPIPE);
	SYS(close(c));

	/* 2: data sent to us before the reset is still read first. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	CHECK_EQ(send(s, "xyz", 3, 0), 3);
	SYS(close(s));
	CHECK_EQ(revents(c), ALL);
	CHECK_EQ(recv(c, buf, 1, 0), 1);
	CHECK_EQ(buf[0], 'x');
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 2);
	CHECK(memcmp(buf, "yz", 2) == 0);
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	SYS(close(c));

	/* 3: the first call after the reset is a send: ECONNRESET, then
	 * EPIPE, and reads are EOF (the error was consumed). */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	SYS(close(s));
	CHECK_ERR(send(c, "b", 1, 0), ECONNRESET);
	CHECK_ERR(send(c, "b", 1, 0), EPIPE);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	SYS(close(c));

	/* 4: SO_ERROR reports the reset once and clears it. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	SYS(close(s));
	e = -1;
	el = sizeof e;
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &el));
	CHECK_EQ(e, ECONNRESET);
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &el));
	CHECK_EQ(e, 0);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	SYS(close(c));

	/* 5: unread data that arrived after shutdown(SHUT_RD), then close. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(shutdown(s, SHUT_RD));
	CHECK_EQ(send(c, "de", 2, 0), 2);
	SYS(close(s));
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	SYS(close(c));

	/* 6: SO_LINGER {on, 0}: close resets even with nothing unread. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	struct linger lg = { 1, 0 };
	SYS(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	SYS(close(s));
	CHECK_EQ(revents(c), ALL);
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	SYS(close(c));

	/* 7: a reader blocked in recv is woken by the reset. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	int ready[2];
	SYS(pipe(ready));
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(c));
		/* Wait until the parent is about to block, then reset. */
		CHECK_EQ(read(ready[0], buf, 1), 1);
		SYS(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
		SYS(close(s));
		_exit(0);
	}
	SYS(close(s));
	CHECK_EQ(write(ready[1], "g", 1), 1);
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	tl_wait_ok(pid);
	SYS(close(c));

	/* 8: SO_LINGER {on, 0} set before the connection existed - on the
	 * listener (the accepted socket inherits it), on a socket before its
	 * connect - resets as well. */
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	SYS(setsockopt(l, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	c = tl_connect(AF_INET, port);
	s = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	expect_transport(c);
	expect_transport(s);
	SYS(close(s));
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	SYS(close(c));
	l = tl_listen(AF_INET, &port);
	c = SYS(socket(AF_INET, SOCK_STREAM, 0));
	SYS(setsockopt(c, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	struct sockaddr_storage ss;
	socklen_t sl = tl_addr(AF_INET, port, &ss);
	SYS(connect(c, (struct sockaddr *)&ss, sl));
	s = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	expect_transport(c);
	expect_transport(s);
	SYS(close(c));
	CHECK_ERR(recv(s, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));
	return 0;
}
