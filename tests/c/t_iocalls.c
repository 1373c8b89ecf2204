/*
 * Every data entry point carries the same byte stream: read/write,
 * readv/writev, send/recv, sendto/recvfrom (address ignored / not filled on
 * a connected stream), sendmsg/recvmsg (scatter/gather, msg_flags),
 * sendmmsg/recvmmsg (several messages, each its own count). Each call moves
 * an exact, checked part of one pattern, mixed freely between calls.
 */
#include "testlib.h"

#define SEED 77

static uint64_t txoff, rxoff;

static void expect_rx(int s, size_t n, const char *how)
{
	static char buf[70000];
	memset(buf, 0, n);
	tl_recv_all(s, buf, n);
	CHECK_PAT(buf, n, rxoff, SEED);
	rxoff += n;
	(void)how;
}

int main(void)
{
	int c, s;
	static char a[70000], b[70000];

	tl_watchdog(10);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* write / read */
	tl_fill(a, 5000, txoff, SEED);
	CHECK_EQ(write(c, a, 5000), 5000);
	txoff += 5000;
	memset(b, 0, 5000);
	CHECK_EQ(read(s, b, 5000), 5000);
	CHECK_PAT(b, 5000, rxoff, SEED);
	rxoff += 5000;

	/* writev with 3 pieces (one empty) / readv into 4 */
	tl_fill(a, 3000, txoff, SEED);
	struct iovec wv[3] = { { a, 1000 }, { a + 1000, 0 }, { a + 1000, 2000 } };
	CHECK_EQ(writev(c, wv, 3), 3000);
	txoff += 3000;
	memset(b, 0, 3000);
	struct iovec rv[4] = { { b, 1 }, { b + 1, 999 }, { b + 1000, 1500 },
			       { b + 2500, 600 } };
	CHECK_EQ(readv(s, rv, 4), 3000);
	CHECK_PAT(b, 3000, rxoff, SEED);
	rxoff += 3000;

	/* send / recv */
	tl_fill(a, 4000, txoff, SEED);
	CHECK_EQ(send(c, a, 4000, 0), 4000);
	txoff += 4000;
	memset(b, 0, 4000);
	CHECK_EQ(recv(s, b, 4000, 0), 4000);
	CHECK_PAT(b, 4000, rxoff, SEED);
	rxoff += 4000;

	/* sendto (NULL and real address) / recvfrom (address left alone:
	 * a connected TCP socket reports no address, addrlen 0) */
	tl_fill(a, 2000, txoff, SEED);
	CHECK_EQ(sendto(c, a, 1000, 0, NULL, 0), 1000);
	struct sockaddr_storage peer;
	socklen_t plen = tl_addr(AF_INET, tl_port_of(s), &peer);
	CHECK_EQ(sendto(c, a + 1000, 1000, 0, (struct sockaddr *)&peer, plen),
		 1000);
	txoff += 2000;
	struct sockaddr_storage from;
	memset(&from, 0xAB, sizeof from);
	socklen_t flen = sizeof from;
	memset(b, 0, 2000);
	CHECK_EQ(recvfrom(s, b, 2000, MSG_WAITALL, (struct sockaddr *)&from,
			  &flen), 2000);
	CHECK_PAT(b, 2000, rxoff, SEED);
	rxoff += 2000;
	CHECK_EQ(flen, 0);
	CHECK_EQ(((unsigned char *)&from)[0], 0xAB);
	CHECK_EQ(recvfrom(s, b, 1, MSG_DONTWAIT, NULL, NULL), -1);
	CHECK_EQ(errno, EAGAIN);

	/* sendmsg / recvmsg with iovecs, msg_flags cleared, no control */
	tl_fill(a, 6000, txoff, SEED);
	struct iovec mv[3] = { { a, 100 }, { a + 100, 2900 }, { a + 3000, 3000 } };
	struct msghdr mh = { .msg_iov = mv, .msg_iovlen = 3 };
	CHECK_EQ(sendmsg(c, &mh, 0), 6000);
	txoff += 6000;
	memset(b, 0, 6000);
	char ctl[64];
	struct iovec nv[2] = { { b, 3333 }, { b + 3333, 2667 } };
	struct msghdr rh = { .msg_name = &from, .msg_namelen = sizeof from,
			     .msg_iov = nv, .msg_iovlen = 2,
			     .msg_control = ctl, .msg_controllen = sizeof ctl,
			     .msg_flags = -1 };
	CHECK_EQ(recvmsg(s, &rh, MSG_WAITALL), 6000);
	CHECK_PAT(b, 6000, rxoff, SEED);
	rxoff += 6000;
	CHECK_EQ(rh.msg_flags, 0);
	CHECK_EQ(rh.msg_namelen, 0);
	CHECK_EQ(rh.msg_controllen, 0);
	/* A short buffer: no MSG_TRUNC on a stream, the rest stays. */
	tl_fill(a, 100, txoff, SEED);
	CHECK_EQ(send(c, a, 100, 0), 100);
	txoff += 100;
	nv[0].iov_len = 60;
	rh.msg_iovlen = 1;
	rh.msg_flags = -1;
	rh.msg_controllen = sizeof ctl;
	CHECK_EQ(recvmsg(s, &rh, 0), 60);
	CHECK_EQ(rh.msg_flags, 0);
	CHECK_PAT(b, 60, rxoff, SEED);
	rxoff += 60;
	expect_rx(s, 40, "rest");

	/* sendmmsg: 3 messages, each counted; recvmmsg: first message takes
	 * what it can, later ones what is left. */
	tl_fill(a, 9000, txoff, SEED);
	struct iovec m1 = { a, 1000 }, m2 = { a + 1000, 3000 }, m3 = { a + 4000, 5000 };
	struct mmsghdr mm[3] = {
		{ .msg_hdr = { .msg_iov = &m1, .msg_iovlen = 1 } },
		{ .msg_hdr = { .msg_iov = &m2, .msg_iovlen = 1 } },
		{ .msg_hdr = { .msg_iov = &m3, .msg_iovlen = 1 } },
	};
	CHECK_EQ(sendmmsg(c, mm, 3, 0), 3);
	CHECK_EQ(mm[0].msg_len, 1000);
	CHECK_EQ(mm[1].msg_len, 3000);
	CHECK_EQ(mm[2].msg_len, 5000);
	txoff += 9000;
	memset(b, 0, 9000);
	struct iovec r1 = { b, 2000 }, r2 = { b + 2000, 4000 }, r3 = { b + 6000, 5000 };
	struct mmsghdr rm[3] = {
		{ .msg_hdr = { .msg_iov = &r1, .msg_iovlen = 1 } },
		{ .msg_hdr = { .msg_iov = &r2, .msg_iovlen = 1 } },
		{ .msg_hdr = { .msg_iov = &r3, .msg_iovlen = 1 } },
	};
	CHECK_EQ(recvmmsg(s, rm, 3, MSG_DONTWAIT, NULL), 3);
	CHECK_EQ(rm[0].msg_len, 2000);
	CHECK_EQ(rm[1].msg_len, 4000);
	CHECK_EQ(rm[2].msg_len, 3000);
	CHECK_PAT(b, 9000, rxoff, SEED);
	rxoff += 9000;
	/* Nothing left: recvmmsg with MSG_DONTWAIT is EAGAIN. */
	CHECK_ERR(recvmmsg(s, rm, 3, MSG_DONTWAIT, NULL), EAGAIN);
	/* Partial: one message's worth queued, vlen 2 -> 1 message. */
	tl_fill(a, 500, txoff, SEED);
	CHECK_EQ(send(c, a, 500, 0), 500);
	txoff += 500;
	r1.iov_len = 2000;
	CHECK_EQ(recvmmsg(s, rm, 2, MSG_DONTWAIT, NULL), 1);
	CHECK_EQ(rm[0].msg_len, 500);
	CHECK_PAT(b, 500, rxoff, SEED);
	rxoff += 500;

	/* Mixed: bytes written by one call read by another, large. */
	tl_fill(a, 65536, txoff, SEED);
	struct iovec big[2] = { { a, 30000 }, { a + 30000, 35536 } };
	CHECK_EQ(writev(c, big, 2), 65536);
	txoff += 65536;
	expect_rx(s, 65536, "mixed");

	/* And the reverse direction through the same calls. */
	CHECK_EQ(write(s, "r1", 2), 2);
	CHECK_EQ(sendto(s, "r2", 2, 0, NULL, 0), 2);
	struct iovec rvv = { "r3", 2 };
	struct msghdr rmh = { .msg_iov = &rvv, .msg_iovlen = 1 };
	CHECK_EQ(sendmsg(s, &rmh, 0), 2);
	memset(b, 0, 6);
	CHECK_EQ(recv(c, b, 6, MSG_WAITALL), 6);
	CHECK(memcmp(b, "r1r2r3", 6) == 0);

	CHECK_EQ(txoff, rxoff);
	expect_bytes(c, txoff, 6);
	expect_bytes(s, 6, rxoff);
	SYS(close(c));
	CHECK_EQ(read(s, b, 10), 0);
	CHECK_EQ(recvmsg(s, &rh, 0), 0);
	SYS(close(s));
	return 0;
}
