/*
 * Misuse errors, as kernel TCP reports them: calls on never-connected
 * sockets, on listeners, on connected sockets that cannot do them, on
 * non-sockets and closed descriptors.
 */
#include "testlib.h"
#include <sys/ioctl.h>

int main(void)
{
	char buf[16];
	int n;
	struct sockaddr_storage ss;
	socklen_t len;

	tl_watchdog(10);
	signal(SIGPIPE, SIG_IGN);

	/* Never connected. */
	int u = SYS(socket(AF_INET, SOCK_STREAM, 0));
	CHECK_ERR(recv(u, buf, sizeof buf, 0), ENOTCONN);
	CHECK_ERR(read(u, buf, sizeof buf), ENOTCONN);
	CHECK_ERR(send(u, "a", 1, 0), EPIPE);
	CHECK_ERR(write(u, "a", 1), EPIPE);
	CHECK_ERR(send(u, buf, 0, 0), EPIPE);
	CHECK_ERR(shutdown(u, SHUT_WR), ENOTCONN);
	len = sizeof ss;
	CHECK_ERR(getpeername(u, (struct sockaddr *)&ss, &len), ENOTCONN);
	CHECK_ERR(accept(u, NULL, NULL), EINVAL);
	SYS(ioctl(u, FIONREAD, &n));
	CHECK_EQ(n, 0);
	struct pollfd p = { u, POLLIN | POLLOUT, 0 };
	CHECK_EQ(poll(&p, 1, 0), 1);
	CHECK_EQ(p.revents, POLLOUT | POLLHUP);

	/* Listener. */
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	CHECK_ERR(recv(l, buf, sizeof buf, 0), ENOTCONN);
	CHECK_ERR(send(l, "a", 1, 0), EPIPE);
	CHECK_ERR(ioctl(l, FIONREAD, &n), EINVAL);
	len = tl_addr(AF_INET, port, &ss);
	CHECK_ERR(connect(l, (struct sockaddr *)&ss, len), EISCONN);
	/* Port taken. */
	int b = SYS(socket(AF_INET, SOCK_STREAM, 0));
	CHECK_ERR(bind(b, (struct sockaddr *)&ss, len), EADDRINUSE);
	SYS(close(b));

	/* Connected. */
	int c = tl_connect(AF_INET, port);
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(c);
	expect_transport(s);
	CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EISCONN);
	CHECK_ERR(listen(c, 5), EINVAL);
	CHECK_ERR(bind(c, (struct sockaddr *)&ss, len), EINVAL);
	CHECK_ERR(accept(c, NULL, NULL), EINVAL);
	CHECK_ERR(accept(s, NULL, NULL), EINVAL);
	CHECK_ERR(recv(c, buf, sizeof buf, MSG_OOB), EINVAL);
	/* Linux ignores a destination address on a connected stream. */
	CHECK_EQ(sendto(c, "a", 1, 0, (struct sockaddr *)&ss, len), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	CHECK_ERR(shutdown(c, 7), EINVAL);
	/* After shutdown(SHUT_WR): EPIPE; receiving still works. */
	SYS(shutdown(c, SHUT_WR));
	CHECK_ERR(send(c, "a", 1, 0), EPIPE);
	CHECK_ERR(write(c, "a", 1), EPIPE);
	CHECK_EQ(send(s, "b", 1, 0), 1);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);

	/* Closed descriptor, not a socket. */
	int dead = c;
	SYS(close(c));
	CHECK_ERR(recv(dead, buf, sizeof buf, 0), EBADF);
	CHECK_ERR(send(dead, "a", 1, 0), EBADF);
	CHECK_ERR(getsockopt(dead, SOL_SOCKET, SO_TYPE, &n, &(socklen_t){ 4 }),
		  EBADF);
	CHECK_ERR(close(dead), EBADF);
	int pfd[2];
	SYS(pipe(pfd));
	CHECK_ERR(recv(pfd[0], buf, sizeof buf, MSG_DONTWAIT), ENOTSOCK);
	CHECK_ERR(send(pfd[1], "a", 1, 0), ENOTSOCK);
	CHECK_ERR(getsockopt(pfd[0], SOL_TCP, SDP_TRANSPORT, &n,
			     &(socklen_t){ 4 }), ENOTSOCK);
	CHECK_ERR(shutdown(pfd[0], SHUT_RD), ENOTSOCK);

	/* Unsupported protocol for a stream socket. */
	CHECK_ERR(socket(AF_INET, SOCK_STREAM, IPPROTO_UDP), EPROTONOSUPPORT);

	SYS(close(s));
	SYS(close(l));
	SYS(close(u));
	return 0;
}
