/*
 * Socket options and ioctls as kernel TCP answers them: SO_TYPE, SO_DOMAIN,
 * SO_PROTOCOL, SO_ACCEPTCONN, SO_ERROR, TCP_NODELAY, SO_KEEPALIVE and the
 * keepalive tunables, SO_LINGER, SO_SNDBUF/SO_RCVBUF (doubled), SO_REUSEADDR,
 * unknown options (ENOPROTOOPT), bad lengths (EINVAL), FIONREAD/SIOCINQ,
 * and getsockname/getpeername agreeing across the two ends.
 */
#include "testlib.h"
#include <linux/sockios.h>
#include <sys/ioctl.h>

static int geti(int fd, int level, int opt)
{
	int v = -12345;
	socklen_t len = sizeof v;
	SYS(getsockopt(fd, level, opt, &v, &len));
	CHECK_EQ(len, sizeof v);
	return v;
}

static void seti(int fd, int level, int opt, int v)
{
	SYS(setsockopt(fd, level, opt, &v, sizeof v));
}

static void same_addr(const struct sockaddr_storage *a,
		      const struct sockaddr_storage *b)
{
	CHECK_EQ(a->ss_family, b->ss_family);
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		CHECK_EQ(x->sin_port, y->sin_port);
		CHECK_EQ(x->sin_addr.s_addr, y->sin_addr.s_addr);
		CHECK_EQ(x->sin_addr.s_addr, htonl(INADDR_LOOPBACK));
	} else {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
		CHECK_EQ(x->sin6_port, y->sin6_port);
		CHECK(memcmp(&x->sin6_addr, &y->sin6_addr, 16) == 0);
		CHECK(memcmp(&x->sin6_addr, &in6addr_loopback, 16) == 0);
	}
}

static void run(int family)
{
	uint16_t port;
	int l = tl_listen(family, &port);
	int c = tl_connect(family, port);
	int s = SYS(accept(l, NULL, NULL));
	int fds[3] = { l, c, s };
	expect_transport(c);
	expect_transport(s);

	for (int i = 0; i < 3; i++) {
		CHECK_EQ(geti(fds[i], SOL_SOCKET, SO_TYPE), SOCK_STREAM);
		CHECK_EQ(geti(fds[i], SOL_SOCKET, SO_DOMAIN), family);
		CHECK_EQ(geti(fds[i], SOL_SOCKET, SO_PROTOCOL), IPPROTO_TCP);
		CHECK_EQ(geti(fds[i], SOL_SOCKET, SO_ACCEPTCONN), i == 0);
		CHECK_EQ(geti(fds[i], SOL_SOCKET, SO_ERROR), 0);
	}

	/* Addresses: each end's name is the other's peer. */
	struct sockaddr_storage cn, cp, sn, sp;
	socklen_t len;
	len = sizeof cn;
	SYS(getsockname(c, (struct sockaddr *)&cn, &len));
	CHECK_EQ(len, family == AF_INET ? sizeof(struct sockaddr_in)
					: sizeof(struct sockaddr_in6));
	len = sizeof cp;
	SYS(getpeername(c, (struct sockaddr *)&cp, &len));
	len = sizeof sn;
	SYS(getsockname(s, (struct sockaddr *)&sn, &len));
	len = sizeof sp;
	SYS(getpeername(s, (struct sockaddr *)&sp, &len));
	same_addr(&cn, &sp);
	same_addr(&cp, &sn);
	CHECK_EQ(tl_port_of(s), port);
	CHECK(tl_port_of(c) != port);
	CHECK_ERR(getpeername(l, (struct sockaddr *)&sp, &len), ENOTCONN);

	for (int i = 1; i < 3; i++) {
		int fd = fds[i];
		CHECK_EQ(geti(fd, SOL_TCP, TCP_NODELAY), 0);
		seti(fd, SOL_TCP, TCP_NODELAY, 1);
		CHECK_EQ(geti(fd, SOL_TCP, TCP_NODELAY), 1);
		seti(fd, SOL_TCP, TCP_NODELAY, 0);
		CHECK_EQ(geti(fd, SOL_TCP, TCP_NODELAY), 0);
		seti(fd, SOL_TCP, TCP_NODELAY, 1);

		CHECK_EQ(geti(fd, SOL_SOCKET, SO_KEEPALIVE), 0);
		seti(fd, SOL_SOCKET, SO_KEEPALIVE, 5);
		CHECK_EQ(geti(fd, SOL_SOCKET, SO_KEEPALIVE), 1);
		seti(fd, SOL_TCP, TCP_KEEPIDLE, 30);
		CHECK_EQ(geti(fd, SOL_TCP, TCP_KEEPIDLE), 30);
		seti(fd, SOL_TCP, TCP_KEEPINTVL, 7);
		CHECK_EQ(geti(fd, SOL_TCP, TCP_KEEPINTVL), 7);
		seti(fd, SOL_TCP, TCP_KEEPCNT, 3);
		CHECK_EQ(geti(fd, SOL_TCP, TCP_KEEPCNT), 3);
		CHECK_ERR(setsockopt(fd, SOL_TCP, TCP_KEEPIDLE, &(int){ 0 },
				     sizeof(int)), EINVAL);

		struct linger lg = { 1, 5 }, lg2 = { 9, 9 };
		len = sizeof lg2;
		SYS(getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg2, &len));
		CHECK(lg2.l_onoff == 0 && lg2.l_linger == 0);
		SYS(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
		len = sizeof lg2;
		SYS(getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg2, &len));
		CHECK_EQ(len, sizeof lg2);
		CHECK(lg2.l_onoff == 1 && lg2.l_linger == 5, "%d %d",
		      lg2.l_onoff, lg2.l_linger);
		CHECK_ERR(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, 4), EINVAL);
		lg.l_onoff = 0;
		SYS(setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));

		/* The kernel doubles buffer sizes for its bookkeeping. */
		seti(fd, SOL_SOCKET, SO_SNDBUF, 65536);
		CHECK_EQ(geti(fd, SOL_SOCKET, SO_SNDBUF), 131072);
		seti(fd, SOL_SOCKET, SO_RCVBUF, 65536);
		CHECK_EQ(geti(fd, SOL_SOCKET, SO_RCVBUF), 131072);

		/* An accepted socket inherits SO_REUSEADDR from the
		 * listener (tl_listen sets it); the client has it off. */
		CHECK_EQ(geti(fd, SOL_SOCKET, SO_REUSEADDR), fd == s);
		int v;
		len = sizeof v;
		CHECK_ERR(getsockopt(fd, SOL_TCP, 9999, &v, &len), ENOPROTOOPT);
		CHECK_ERR(setsockopt(fd, SOL_TCP, 9999, &v, sizeof v),
			  ENOPROTOOPT);
		CHECK_ERR(setsockopt(fd, SOL_SOCKET, 9999, &v, sizeof v),
			  ENOPROTOOPT);
		CHECK_ERR(setsockopt(fd, SOL_TCP, TCP_NODELAY, &v, 2), EINVAL);
		len = 0;
		SYS(getsockopt(fd, SOL_SOCKET, SO_TYPE, &v, &len));
		CHECK_EQ(len, 0);
	}
	CHECK_EQ(geti(l, SOL_SOCKET, SO_REUSEADDR), 1);

	/* FIONREAD / SIOCINQ follow the receive queue exactly (Nagle is off
	 * for c from here: the loop above left TCP_NODELAY set). */
	int n = -1;
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 0);
	char buf[2000];
	tl_fill(buf, 1234, 0, 1);
	CHECK_EQ(send(c, buf, 1234, 0), 1234);
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 1234);
	SYS(ioctl(s, SIOCINQ, &n));
	CHECK_EQ(n, 1234);
	CHECK_EQ(recv(s, buf, 234, 0), 234);
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 1000);
	CHECK_EQ(send(c, buf, 500, 0), 500);
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 1500);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1500);
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 0);
	CHECK_ERR(ioctl(l, FIONREAD, &n), EINVAL);
	expect_bytes(c, 1734, 0);
	expect_bytes(s, 0, 1734);

	SYS(close(c));
	SYS(close(s));
	SYS(close(l));
}

int main(void)
{
	tl_watchdog(10);
	run(AF_INET);
	if (tl_have_ipv6())
		run(AF_INET6);
	return 0;
}
