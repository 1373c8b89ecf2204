/*
 * connect(): blocking connect to a listener (IPv4 and IPv6, with the server
 * already blocked in accept in another process, and with nobody accepting
 * yet); non-blocking connect gives EINPROGRESS, then POLLOUT, SO_ERROR 0 and
 * EISCONN; a closed port gives ECONNREFUSED blocking, and EINPROGRESS then
 * POLLERR|POLLHUP and SO_ERROR ECONNREFUSED non-blocking; a second connect
 * reports the pending outcome.
 */
#include "testlib.h"

static uint16_t closed_port(int family, int *holder)
{
	/* Bound but not listening: the port is ours and refuses. */
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(family, 0, &ss);
	*holder = SYS(socket(family, SOCK_STREAM, 0));
	SYS(bind(*holder, (struct sockaddr *)&ss, len));
	return tl_port_of(*holder);
}

static void run(int family)
{
	struct sockaddr_storage ss;
	socklen_t len;
	char buf[64];
	uint16_t port;
	int l = tl_listen(family, &port);

	/* Server blocked in accept() in a child before we connect. */
	int sync[2];
	SYS(pipe(sync));
	pid_t pid = tl_fork();
	if (pid == 0) {
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		CHECK_EQ(recv(s, buf, 5, MSG_WAITALL), 5);
		CHECK(memcmp(buf, "hello", 5) == 0);
		CHECK_EQ(send(s, "world", 5, 0), 5);
		CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
		expect_bytes(s, 5, 5);
		_exit(0);
	}
	int c = tl_connect(family, port);
	expect_transport(c);
	CHECK_EQ(send(c, "hello", 5, 0), 5);
	CHECK_EQ(recv(c, buf, 5, MSG_WAITALL), 5);
	CHECK(memcmp(buf, "world", 5) == 0);
	expect_bytes(c, 5, 5);
	SYS(close(c));
	tl_wait_ok(pid);

	/* Non-blocking connect. */
	c = SYS(socket(family, SOCK_STREAM | SOCK_NONBLOCK, 0));
	len = tl_addr(family, port, &ss);
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EINPROGRESS);
	struct pollfd p = { c, POLLOUT, 0 };
	CHECK_EQ(poll(&p, 1, 2000), 1);
	CHECK_EQ(p.revents, POLLOUT);
	int err = -1;
	socklen_t el = sizeof err;
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el));
	CHECK_EQ(err, 0);
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "ping", 4, 0), 4);
	p.fd = s;
	p.events = POLLIN;
	CHECK_EQ(poll(&p, 1, 2000), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
	CHECK(memcmp(buf, "ping", 4) == 0);
	SYS(close(c));
	SYS(close(s));

	/* Non-blocking connect, second connect() reports completion. */
	c = SYS(socket(family, SOCK_STREAM, 0));
	SYS(fcntl(c, F_SETFL, O_NONBLOCK));
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EINPROGRESS);
	p.fd = c;
	p.events = POLLOUT;
	CHECK_EQ(poll(&p, 1, 2000), 1);
	CHECK_EQ(connect(c, (struct sockaddr *)&ss, len), 0);
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EISCONN);
	s = SYS(accept(l, NULL, NULL));
	expect_transport(c);
	expect_transport(s);
	SYS(close(c));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));
	SYS(close(l));

	/* Refused, blocking: again and again. */
	int holder;
	uint16_t cp = closed_port(family, &holder);
	len = tl_addr(family, cp, &ss);
	c = SYS(socket(family, SOCK_STREAM, 0));
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), ECONNREFUSED);
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), ECONNREFUSED);
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el));
	CHECK_EQ(err, 0);
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ENOTCONN);
	CHECK_ERR(send(c, buf, 1, MSG_NOSIGNAL), EPIPE);
	SYS(close(c));

	/* Refused, non-blocking: poll, then SO_ERROR, cleared after. */
	c = SYS(socket(family, SOCK_STREAM | SOCK_NONBLOCK, 0));
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EINPROGRESS);
	p.fd = c;
	p.events = POLLOUT;
	CHECK_EQ(poll(&p, 1, 2000), 1);
	CHECK_EQ(p.revents, POLLOUT | POLLERR | POLLHUP);
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el));
	CHECK_EQ(err, ECONNREFUSED);
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el));
	CHECK_EQ(err, 0);
	SYS(close(c));

	/* Refused, non-blocking: the second connect() reports it. */
	c = SYS(socket(family, SOCK_STREAM | SOCK_NONBLOCK, 0));
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EINPROGRESS);
	CHECK_EQ(poll(&p, 1, 2000), 1);
	p.fd = c;
	CHECK_EQ(poll(&p, 1, 2000), 1);
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), ECONNREFUSED);
	SYS(close(c));
	SYS(close(holder));

	/* A listener that was closed refuses too. */
	l = tl_listen(family, &port);
	SYS(close(l));
	len = tl_addr(family, port, &ss);
	c = SYS(socket(family, SOCK_STREAM, 0));
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), ECONNREFUSED);
	SYS(close(c));
}

int main(void)
{
	tl_watchdog(10);
	run(AF_INET);
	if (tl_have_ipv6())
		run(AF_INET6);
	return 0;
}
