/*
 * accept / accept4: SOCK_NONBLOCK and SOCK_CLOEXEC land on the new file
 * (and nothing else does: a non-blocking listener does not make accepted
 * sockets non-blocking), invalid flags are EINVAL, the peer address is
 * returned and truncated with the full length reported; socket() takes
 * the same flags.
 */
#include "testlib.h"

int main(void)
{
	uint16_t port;
	char buf[16];

	tl_watchdog(10);
	int l = tl_listen(AF_INET, &port);

	int c1 = tl_connect(AF_INET, port);
	int s1 = SYS(accept4(l, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC));
	expect_transport(c1);
	expect_transport(s1);
	CHECK_EQ(fcntl(s1, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	CHECK_EQ(fcntl(s1, F_GETFD), FD_CLOEXEC);
	CHECK_ERR(recv(s1, buf, sizeof buf, 0), EAGAIN);
	CHECK_EQ(send(c1, "a", 1, 0), 1);
	CHECK_EQ(recv(s1, buf, sizeof buf, 0), 1);

	int c2 = tl_connect(AF_INET, port);
	int s2 = SYS(accept4(l, NULL, NULL, SOCK_CLOEXEC));
	expect_transport(s2);
	CHECK_EQ(fcntl(s2, F_GETFL) & O_NONBLOCK, 0);
	CHECK_EQ(fcntl(s2, F_GETFD), FD_CLOEXEC);

	int c3 = tl_connect(AF_INET, port);
	int s3 = SYS(accept4(l, NULL, NULL, SOCK_NONBLOCK));
	expect_transport(s3);
	CHECK_EQ(fcntl(s3, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	CHECK_EQ(fcntl(s3, F_GETFD), 0);

	/* Non-blocking listener: accepted sockets still start blocking. */
	SYS(fcntl(l, F_SETFL, O_NONBLOCK));
	CHECK_ERR(accept4(l, NULL, NULL, 0), EAGAIN);
	int c4 = tl_connect(AF_INET, port);
	struct pollfd p = { l, POLLIN, 0 };
	CHECK_EQ(poll(&p, 1, 2000), 1);
	CHECK_EQ(p.revents, POLLIN);
	struct sockaddr_in peer;
	socklen_t plen = sizeof peer;
	int s4 = SYS(accept4(l, (struct sockaddr *)&peer, &plen, 0));
	expect_transport(c4);
	expect_transport(s4);
	CHECK_EQ(fcntl(s4, F_GETFL) & O_NONBLOCK, 0);
	CHECK_EQ(fcntl(s4, F_GETFD), 0);
	CHECK_EQ(plen, sizeof peer);
	CHECK_EQ(peer.sin_family, AF_INET);
	CHECK_EQ(peer.sin_addr.s_addr, htonl(INADDR_LOOPBACK));
	CHECK_EQ(ntohs(peer.sin_port), tl_port_of(c4));

	/* Invalid flags. */
	int c5 = tl_connect(AF_INET, port);
	CHECK_ERR(accept4(l, NULL, NULL, 0x1234), EINVAL);
	/* Truncated address: length reports the full size. */
	char small[4];
	plen = sizeof small;
	int s5 = SYS(accept(l, (struct sockaddr *)small, &plen));
	expect_transport(s5);
	CHECK_EQ(plen, sizeof(struct sockaddr_in));
	sa_family_t fam;
	memcpy(&fam, small, sizeof fam);
	CHECK_EQ(fam, AF_INET);

	/* socket() flags. */
	int x = SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
	CHECK_EQ(fcntl(x, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	CHECK_EQ(fcntl(x, F_GETFD), FD_CLOEXEC);
	SYS(close(x));

	/* Every accepted socket carries its own stream. */
	int cs[5] = { c1, c2, c3, c4, c5 }, ss[5] = { s1, s2, s3, s4, s5 };
	for (int i = 0; i < 5; i++) {
		SYS(fcntl(ss[i], F_SETFL, 0));
		char m = (char)('0' + i);
		CHECK_EQ(send(cs[i], &m, 1, 0), 1);
	}
	for (int i = 0; i < 5; i++) {
		CHECK_EQ(recv(ss[i], buf, sizeof buf, 0), 1);
		CHECK_EQ(buf[0], '0' + i);
		SYS(close(cs[i]));
		CHECK_EQ(recv(ss[i], buf, sizeof buf, 0), 0);
		SYS(close(ss[i]));
	}
	SYS(close(l));
	return 0;
}
