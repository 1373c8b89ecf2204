/*
 * Stream semantics: a TCP stream has no message boundaries. Reads return
 * whatever is queued up to the buffer size (coalescing separate sends), a
 * short buffer leaves the rest queued, a blocking send of any size returns
 * the full count, zero-length calls return 0. IPv4 and IPv6.
 */
#include "testlib.h"
#include <pthread.h>

#define BIG (4u << 20)
#define SEED 11

struct big { int fd; };

static void *big_sender(void *arg)
{
	struct big *b = arg;
	char *buf = malloc(BIG);
	CHECK(buf);
	tl_fill(buf, BIG, 0, SEED);
	/* One blocking send of 4 MiB: must return the full count. */
	ssize_t n = send(b->fd, buf, BIG, 0);
	CHECK_EQ(n, BIG);
	free(buf);
	return NULL;
}

static void run(int family)
{
	int c, s;
	char buf[4096];
	uint64_t c2s = 0, s2c = 0;

	tl_pair(family, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* A read returns what is there, without waiting to fill the buffer. */
	CHECK_EQ(send(c, "x", 1, 0), 1);
	c2s += 1;
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	CHECK_EQ(buf[0], 'x');

	/* Separate sends are coalesced: no message boundaries. */
	tl_fill(buf, 60, 0, SEED);
	CHECK_EQ(send(c, buf, 10, 0), 10);
	CHECK_EQ(send(c, buf + 10, 20, 0), 20);
	CHECK_EQ(write(c, buf + 30, 30), 30);
	c2s += 60;
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 60);
	CHECK_PAT(buf, 60, 0, SEED);

	/* A short buffer takes part of the queue; the rest stays, in order. */
	tl_fill(buf, 1000, 0, SEED);
	CHECK_EQ(send(s, buf, 1000, 0), 1000);
	s2c += 1000;
	static const size_t chunks[] = { 1, 7, 13, 100, 256, 3, 2000 };
	uint64_t off = 0;
	for (size_t i = 0; i < sizeof chunks / sizeof chunks[0]; i++) {
		size_t want = chunks[i];
		if (want > 1000 - off)
			want = 1000 - off;
		memset(buf, 0, sizeof buf);
		CHECK_EQ(recv(c, buf, chunks[i], 0), want);
		CHECK_PAT(buf, want, off, SEED);
		off += want;
	}
	CHECK_EQ(off, 1000);
	CHECK_EQ(recv(c, buf, 1, MSG_DONTWAIT), -1);
	CHECK_EQ(errno, EAGAIN);

	/* Zero-length send is a no-op returning 0; a zero-length receive
	 * with data queued returns 0 and consumes nothing. */
	CHECK_EQ(send(c, buf, 0, 0), 0);
	CHECK_EQ(write(c, buf, 0), 0);
	CHECK_EQ(send(c, "yz", 2, 0), 2);
	c2s += 2;
	CHECK_EQ(recv(s, buf, 0, 0), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 2);
	CHECK(memcmp(buf, "yz", 2) == 0);
	/* ... and with nothing queued it does not report data. */
	CHECK_ERR(recv(s, buf, 0, MSG_DONTWAIT), EAGAIN);

	/* 4 MiB in one blocking send against reads of odd sizes. */
	struct big b = { c };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, big_sender, &b), 0);
	size_t sizes[] = { 1, 4096, 777, 65536, 3, 12345 };
	char *rb = malloc(65536);
	CHECK(rb);
	off = 0;
	for (unsigned i = 0; off < BIG; i++) {
		size_t want = sizes[i % 6];
		if (want > BIG - off)
			want = BIG - off;
		ssize_t n = recv(s, rb, want, 0);
		CHECK(n > 0 && (size_t)n <= want, "recv -> %zd", n);
		CHECK_PAT(rb, (size_t)n, off, SEED);
		off += (uint64_t)n;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	c2s += BIG;
	free(rb);
	CHECK_ERR(recv(s, buf, 1, MSG_DONTWAIT), EAGAIN);

	expect_bytes(c, c2s, s2c);
	expect_bytes(s, s2c, c2s);

	/* Orderly close: the peer reads EOF, repeatedly. */
	SYS(close(c));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_EQ(read(s, buf, sizeof buf), 0);
	SYS(close(s));
}

int main(void)
{
	tl_watchdog(20);
	run(AF_INET);
	if (tl_have_ipv6())
		run(AF_INET6);
	else
		fprintf(stderr, "note: no ::1, IPv6 part not run\n");
	return 0;
}
