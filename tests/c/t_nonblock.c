/*
 * Non-blocking I/O: O_NONBLOCK and MSG_DONTWAIT give EAGAIN on an empty
 * receive queue and on a full send path; filling the stream until EAGAIN,
 * then draining it, returns every byte exactly once and in order; space
 * freed by the reader is usable again; MSG_DONTWAIT does not change the
 * file's flags.
 */
#include "testlib.h"
#include <sys/ioctl.h>

#define SEED 9

int main(void)
{
	int c, s;
	static char buf[65536];

	tl_watchdog(15);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* Empty queue. */
	CHECK_ERR(recv(s, buf, 10, MSG_DONTWAIT), EAGAIN);
	CHECK_EQ(EAGAIN, EWOULDBLOCK);
	CHECK_EQ(fcntl(s, F_GETFL) & O_NONBLOCK, 0);
	SYS(fcntl(s, F_SETFL, fcntl(s, F_GETFL) | O_NONBLOCK));
	CHECK_EQ(fcntl(s, F_GETFL) & O_NONBLOCK, O_NONBLOCK);
	CHECK_ERR(recv(s, buf, 10, 0), EAGAIN);
	CHECK_ERR(read(s, buf, 10), EAGAIN);
	struct iovec iov = { buf, 10 };
	CHECK_ERR(readv(s, &iov, 1), EAGAIN);

	/* Fill with O_NONBLOCK sends of 64 KiB until EAGAIN. */
	SYS(fcntl(c, F_SETFL, O_NONBLOCK));
	uint64_t sent = 0;
	int partial = 0;
	for (int i = 0; i < 100000; i++) {
		tl_fill(buf, sizeof buf, sent, SEED);
		ssize_t n = send(c, buf, sizeof buf, 0);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			break;
		}
		CHECK(n > 0 && (size_t)n <= sizeof buf, "send -> %zd", n);
		if ((size_t)n < sizeof buf)
			partial++;
		sent += (uint64_t)n;
	}
	CHECK(sent >= 4096, "only %llu bytes fit", (unsigned long long)sent);
	/* Full: more sends fail, of any size, with both flags. */
	CHECK_ERR(send(c, buf, 1, 0), EAGAIN);
	CHECK_ERR(write(c, buf, 100), EAGAIN);
	SYS(fcntl(c, F_SETFL, 0));
	CHECK_ERR(send(c, buf, 1, MSG_DONTWAIT), EAGAIN);
	CHECK_EQ(fcntl(c, F_GETFL) & O_NONBLOCK, 0);
	fprintf(stderr, "filled %llu bytes (%d partial sends)\n",
		(unsigned long long)sent, partial);

	/* Drain with O_NONBLOCK reads of odd sizes; every byte once. */
	uint64_t got = 0;
	for (;;) {
		ssize_t n = recv(s, buf, 9973, 0);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			break;
		}
		CHECK(n > 0, "recv -> %zd", n);
		CHECK_PAT(buf, (size_t)n, got, SEED);
		got += (uint64_t)n;
	}
	CHECK_EQ(got, sent);
	CHECK_ERR(recv(s, buf, 1, 0), EAGAIN);
	int q;
	SYS(ioctl(s, FIONREAD, &q));
	CHECK_EQ(q, 0);

	/* Space is usable again, through MSG_DONTWAIT on a blocking socket. */
	tl_fill(buf, 1000, sent, SEED);
	CHECK_EQ(send(c, buf, 1000, MSG_DONTWAIT), 1000);
	sent += 1000;
	memset(buf, 0, 1000);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1000);
	CHECK_PAT(buf, 1000, got, SEED);
	got += 1000;

	/* Clearing O_NONBLOCK makes reads block again (data then arrives:
	 * the blocking read returns it). */
	SYS(fcntl(s, F_SETFL, fcntl(s, F_GETFL) & ~O_NONBLOCK));
	CHECK_EQ(send(c, "z", 1, 0), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	sent += 1;

	/* A partial write: a 16 MiB non-blocking send into an empty stream
	 * takes only part, returns that count, and that is exactly what the
	 * peer receives. */
	char *huge = malloc(16u << 20);
	CHECK(huge);
	tl_fill(huge, 16u << 20, 0, SEED + 1);
	ssize_t part = send(c, huge, 16u << 20, MSG_DONTWAIT);
	CHECK(part > 0 && part < (16 << 20), "send of 16 MiB -> %zd", part);
	/* Full now - on one host. Across a link (TL_NET_CLIENT_NS: two
	 * namespaces) acknowledgements arrive on their own time and may
	 * have made room already, for kernel TCP as for SDP. */
	if (getenv("TL_NET_CLIENT_NS")) {
		ssize_t one = send(c, huge + part, 1, MSG_DONTWAIT);
		CHECK(one == 1 || (one < 0 && errno == EAGAIN), "send of 1 byte -> %zd", one);
		if (one == 1)
			part++;
	} else {
		CHECK_ERR(send(c, huge + part, 1, MSG_DONTWAIT), EAGAIN);
	}
	uint64_t got2 = 0;
	while (got2 < (uint64_t)part) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		CHECK(n > 0);
		CHECK_PAT(buf, (size_t)n, got2, SEED + 1);
		got2 += (uint64_t)n;
	}
	CHECK_EQ(got2, part);
	CHECK_ERR(recv(s, buf, 1, MSG_DONTWAIT), EAGAIN);
	free(huge);
	sent += (uint64_t)part;

	/* EOF on a non-blocking socket is 0, not EAGAIN. */
	SYS(fcntl(s, F_SETFL, O_NONBLOCK));
	SYS(shutdown(c, SHUT_WR));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_DONTWAIT), 0);

	expect_bytes(c, sent, 0);
	expect_bytes(s, 0, sent);
	SYS(close(c));
	SYS(close(s));

	/* accept on a non-blocking listener with nothing pending. */
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	SYS(fcntl(l, F_SETFL, O_NONBLOCK));
	CHECK_ERR(accept(l, NULL, NULL), EAGAIN);
	SYS(close(l));
	return 0;
}
