/*
 * sendfile(): file -> socket. The whole file, a range with an offset
 * pointer (file position untouched, offset advanced), and with a NULL
 * offset (file position advanced), EOF of the source (0), a full
 * non-blocking socket (EAGAIN); the receiver gets exactly the file bytes.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/sendfile.h>

#define FSIZE (3u << 20)
#define SEED 55

struct rx { int fd; uint64_t off; size_t len; };

static void *receiver(void *arg)
{
	struct rx *r = arg;
	tl_recv_pat(r->fd, r->off, r->len, SEED, 65536);
	return NULL;
}

int main(void)
{
	int c, s;
	char path[] = "/tmp/sdp-sendfile-XXXXXX";

	tl_watchdog(15);
	int f = SYS(mkstemp(path));
	SYS(unlink(path));
	static char buf[65536];
	for (uint64_t off = 0; off < FSIZE; off += sizeof buf) {
		tl_fill(buf, sizeof buf, off, SEED);
		CHECK_EQ(write(f, buf, sizeof buf), (ssize_t)sizeof buf);
	}
	SYS(lseek(f, 0, SEEK_SET));

	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* Whole file, NULL offset: file position moves to the end. */
	pthread_t th;
	struct rx r = { s, 0, FSIZE };
	CHECK_EQ(pthread_create(&th, NULL, receiver, &r), 0);
	size_t left = FSIZE;
	while (left) {
		ssize_t n = sendfile(c, f, NULL, left);
		CHECK(n > 0, "sendfile -> %zd", n);
		left -= (size_t)n;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(lseek(f, 0, SEEK_CUR), FSIZE);
	/* At EOF of the source: 0. */
	CHECK_EQ(sendfile(c, f, NULL, 100), 0);

	/* A range through an offset pointer: position untouched. */
	SYS(lseek(f, 12345, SEEK_SET));
	off_t off = 1000003;
	r.off = 1000003;
	r.len = 777777;
	CHECK_EQ(pthread_create(&th, NULL, receiver, &r), 0);
	left = 777777;
	while (left) {
		off_t before = off;
		ssize_t n = sendfile(c, f, &off, left);
		CHECK(n > 0, "sendfile -> %zd", n);
		CHECK_EQ(off, before + n);
		left -= (size_t)n;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(off, 1000003 + 777777);
	CHECK_EQ(lseek(f, 0, SEEK_CUR), 12345);

	/* Small and unaligned: 1 byte and 4097 bytes from the end. */
	off = FSIZE - 1;
	CHECK_EQ(sendfile(c, f, &off, 10), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	CHECK_PAT(buf, 1, FSIZE - 1, SEED);
	off = FSIZE - 4097;
	CHECK_EQ(sendfile(c, f, &off, 4097), 4097);
	CHECK_EQ(recv(s, buf, 4097, MSG_WAITALL), 4097);
	CHECK_PAT(buf, 4097, FSIZE - 4097, SEED);

	/* Non-blocking socket that is full: EAGAIN, nothing lost. */
	SYS(fcntl(c, F_SETFL, O_NONBLOCK));
	off = 0;
	uint64_t sent = 0;
	for (;;) {
		ssize_t n = sendfile(c, f, &off, 65536);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			break;
		}
		CHECK(n > 0);
		sent += (uint64_t)n;
		if (off >= (off_t)FSIZE)
			off = 0;	/* keep the pattern: restart the file */
	}
	CHECK(sent > 0);
	uint64_t got = 0;
	while (got < sent) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		CHECK(n > 0);
		for (ssize_t i = 0; i < n; i++, got++)
			CHECK(buf[i] == (char)tl_pat(got % FSIZE, SEED),
			      "stream offset %llu", (unsigned long long)got);
	}
	CHECK_EQ(got, sent);
	SYS(fcntl(c, F_SETFL, 0));

	uint64_t total = FSIZE + 777777 + 1 + 4097 + sent;
	expect_bytes(c, total, 0);
	expect_bytes(s, 0, total);
	SYS(close(c));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));
	SYS(close(f));
	return 0;
}
