/*
 * Built with -O2 -D_FORTIFY_SOURCE=2 -D_FILE_OFFSET_BITS=64 (see
 * CMakeLists.txt): the receive calls below compile to glibc's checked entry
 * points __read_chk, __recv_chk and __recvfrom_chk (and poll to
 * __poll_chk), and fcntl to fcntl64. The stream must behave exactly as
 * through the plain entry points. test_c_features.py checks the symbols.
 */
#include "testlib.h"

#define SEED 31

/* Lengths the compiler cannot see, so the _chk variants are used. */
static volatile size_t vlen = 1000;

static size_t len_of(size_t n)
{
	vlen = n;
	return vlen;
}

int main(void)
{
	int c, s;
	char buf[4096];
	char src[4096];
	uint64_t off = 0;

	tl_watchdog(10);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* __read_chk */
	tl_fill(src, 3000, off, SEED);
	CHECK_EQ(send(c, src, 3000, 0), 3000);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(read(s, buf, len_of(1000)), 1000);
	CHECK_PAT(buf, 1000, off, SEED);
	off += 1000;
	/* __recv_chk */
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, len_of(1500), 0), 1500);
	CHECK_PAT(buf, 1500, off, SEED);
	off += 1500;
	/* __recvfrom_chk */
	struct sockaddr_storage from;
	socklen_t flen = sizeof from;
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recvfrom(s, buf, len_of(sizeof buf), 0,
			  (struct sockaddr *)&from, &flen), 500);
	CHECK_PAT(buf, 500, off, SEED);
	off += 500;
	CHECK_EQ(flen, 0);
	/* recvfrom with NULL address, and MSG_PEEK through __recv_chk */
	tl_fill(src, 10, off, SEED);
	CHECK_EQ(send(c, src, 10, 0), 10);
	CHECK_EQ(recv(s, buf, len_of(sizeof buf), MSG_PEEK), 10);
	CHECK_EQ(recvfrom(s, buf, len_of(sizeof buf), 0, NULL, NULL), 10);
	CHECK_PAT(buf, 10, off, SEED);
	off += 10;

	/* __poll_chk */
	struct pollfd p[1] = { { s, POLLIN, 0 } };
	CHECK_EQ(poll(p, len_of(1), 0), 0);
	CHECK_EQ(send(c, "!", 1, 0), 1);
	CHECK_EQ(poll(p, len_of(1), 1000), 1);
	CHECK_EQ(p[0].revents, POLLIN);
	CHECK_EQ(read(s, buf, len_of(sizeof buf)), 1);
	CHECK_EQ(buf[0], '!');

	/* fcntl64: O_NONBLOCK really applies to the socket. */
	int fl = SYS(fcntl(s, F_GETFL));
	CHECK_EQ(fl & O_NONBLOCK, 0);
	SYS(fcntl(s, F_SETFL, fl | O_NONBLOCK));
	CHECK_EQ(fcntl(s, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	CHECK_ERR(read(s, buf, len_of(100)), EAGAIN);
	CHECK_ERR(recv(s, buf, len_of(100), 0), EAGAIN);
	CHECK_ERR(recvfrom(s, buf, len_of(100), 0, NULL, NULL), EAGAIN);
	SYS(fcntl(s, F_SETFL, fl));
	CHECK_EQ(fcntl(s, F_GETFD), 0);
	SYS(fcntl(s, F_SETFD, FD_CLOEXEC));
	CHECK_EQ(fcntl(s, F_GETFD), FD_CLOEXEC);
	/* F_DUPFD_CLOEXEC: the copy is the same connection. */
	int d = SYS(fcntl(s, F_DUPFD_CLOEXEC, 100));
	CHECK(d >= 100);
	CHECK_EQ(fcntl(d, F_GETFD), FD_CLOEXEC);
	expect_transport(d);
	SYS(close(s));
	tl_fill(src, 2000, off, SEED);
	CHECK_EQ(send(c, src, 2000, 0), 2000);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(d, buf, len_of(2000), MSG_WAITALL), 2000);
	CHECK_PAT(buf, 2000, off, SEED);
	off += 2000;

	expect_bytes(c, off + 1, 0);
	expect_bytes(d, 0, off + 1);
	SYS(close(c));
	CHECK_EQ(read(d, buf, len_of(sizeof buf)), 0);
	SYS(close(d));
	return 0;
}
