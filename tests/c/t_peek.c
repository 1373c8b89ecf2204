/*
 * MSG_PEEK: returns queued data without consuming it, spanning separate
 * sends, never more than is queued; peeking at EOF returns 0; peeking an
 * empty socket with MSG_DONTWAIT is EAGAIN; a blocking peek waits for data.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/ioctl.h>

static int g_s;

static void *blocking_peeker(void *arg)
{
	char buf[16];
	(void)arg;
	ssize_t n = recv(g_s, buf, sizeof buf, MSG_PEEK);
	CHECK_EQ(n, 4);
	CHECK(memcmp(buf, "wake", 4) == 0);
	return NULL;
}

int main(void)
{
	int c, s, n;
	char buf[100];

	tl_watchdog(10);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	CHECK_ERR(recv(s, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT), EAGAIN);

	CHECK_EQ(send(c, "hello", 5, 0), 5);
	CHECK_EQ(send(c, " world", 6, 0), 6);

	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, 5, MSG_PEEK), 5);
	CHECK(memcmp(buf, "hello", 5) == 0);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK), 11);
	CHECK(memcmp(buf, "hello world", 11) == 0);
	/* Peeking again sees the same bytes. */
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT), 11);
	CHECK(memcmp(buf, "hello world", 11) == 0);
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 11);

	/* Consume part, peek the rest. */
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, 5, 0), 5);
	CHECK(memcmp(buf, "hello", 5) == 0);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK), 6);
	CHECK(memcmp(buf, " world", 6) == 0);
	SYS(ioctl(s, FIONREAD, &n));
	CHECK_EQ(n, 6);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(read(s, buf, sizeof buf), 6);
	CHECK(memcmp(buf, " world", 6) == 0);
	CHECK_ERR(recv(s, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT), EAGAIN);

	/* A peek of a larger pattern, then exact consumption. */
	char big[3000], got[3000];
	tl_fill(big, sizeof big, 0, 5);
	CHECK_EQ(send(c, big, sizeof big, 0), (ssize_t)sizeof big);
	CHECK_EQ(recv(s, got, 1000, MSG_PEEK), 1000);
	CHECK_PAT(got, 1000, 0, 5);
	CHECK_EQ(recv(s, got, sizeof got, MSG_PEEK), 3000);
	CHECK_PAT(got, 3000, 0, 5);
	CHECK_EQ(recv(s, got, 2999, 0), 2999);
	CHECK_PAT(got, 2999, 0, 5);
	CHECK_EQ(recv(s, got, 10, MSG_PEEK), 1);
	CHECK_PAT(got, 1, 2999, 5);
	CHECK_EQ(recv(s, got, 10, 0), 1);
	CHECK_PAT(got, 1, 2999, 5);

	/* A blocking peek waits for data, and does not consume it. */
	pthread_t th;
	g_s = s;
	CHECK_EQ(pthread_create(&th, NULL, blocking_peeker, NULL), 0);
	CHECK_EQ(send(c, "wake", 4, 0), 4);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
	CHECK(memcmp(buf, "wake", 4) == 0);

	/* Data then EOF: peek sees the data, then 0 once it is consumed. */
	CHECK_EQ(send(c, "xy", 2, 0), 2);
	SYS(shutdown(c, SHUT_WR));
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK), 2);
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK), 2);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 2);
	CHECK(memcmp(buf, "xy", 2) == 0);
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);

	expect_bytes(c, 11 + 3000 + 4 + 2, 0);
	expect_bytes(s, 0, 11 + 3000 + 4 + 2);
	SYS(close(c));
	SYS(close(s));
	return 0;
}
