/*
 * MSG_WAITALL: a blocking receive waits for the full length even when the
 * data trickles in; it returns short only at EOF, on a receive timeout, or
 * with MSG_DONTWAIT; combined with MSG_PEEK it does not consume.
 */
#include "testlib.h"
#include <pthread.h>

#define N 10000
#define SEED 3

static void *trickle(void *arg)
{
	int fd = *(int *)arg;
	char buf[N];
	tl_fill(buf, N, 0, SEED);
	for (int i = 0; i < 10; i++) {
		tl_send_all(fd, buf + i * 1000, 1000);
		tl_idle_ms(3);
	}
	return NULL;
}

int main(void)
{
	int c, s;
	static char buf[2 * N];
	pthread_t th;

	tl_watchdog(10);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* 10 sends of 1000 bytes, paced; one MSG_WAITALL receive of all. */
	CHECK_EQ(pthread_create(&th, NULL, trickle, &c), 0);
	CHECK_EQ(recv(s, buf, N, MSG_WAITALL), N);
	CHECK_PAT(buf, N, 0, SEED);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_ERR(recv(s, buf, 1, MSG_DONTWAIT), EAGAIN);

	/* Same through recvmsg with two iovecs. */
	CHECK_EQ(pthread_create(&th, NULL, trickle, &c), 0);
	struct iovec iov[2] = { { buf, 2500 }, { buf + 2500, N - 2500 } };
	struct msghdr mh = { .msg_iov = iov, .msg_iovlen = 2 };
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recvmsg(s, &mh, MSG_WAITALL), N);
	CHECK_PAT(buf, N, 0, SEED);
	CHECK_EQ(pthread_join(th, NULL), 0);

	/* MSG_DONTWAIT wins over MSG_WAITALL: returns what is queued. */
	tl_fill(buf, 300, 0, SEED);
	CHECK_EQ(send(c, buf, 300, 0), 300);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, 1000, MSG_WAITALL | MSG_DONTWAIT), 300);
	CHECK_PAT(buf, 300, 0, SEED);

	/* MSG_WAITALL | MSG_PEEK with everything queued: full length, not
	 * consumed. */
	tl_fill(buf, 500, 0, SEED);
	CHECK_EQ(send(c, buf, 500, 0), 500);
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, 500, MSG_WAITALL | MSG_PEEK), 500);
	CHECK_PAT(buf, 500, 0, SEED);
	CHECK_EQ(recv(s, buf, 500, MSG_WAITALL), 500);
	CHECK_PAT(buf, 500, 0, SEED);

	/* With SO_RCVTIMEO the wait ends at the timeout with what arrived. */
	struct timeval tv = { 0, 150000 };
	SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	tl_fill(buf, 300, 0, SEED);
	CHECK_EQ(send(c, buf, 300, 0), 300);
	memset(buf, 0, sizeof buf);
	double t0 = tl_now();
	CHECK_EQ(recv(s, buf, 1000, MSG_WAITALL), 300);
	double dt = tl_now() - t0;
	CHECK(dt >= 0.12 && dt < 1.0, "returned after %.3f s", dt);
	CHECK_PAT(buf, 300, 0, SEED);
	/* ... and with nothing at all: EAGAIN after the timeout. */
	t0 = tl_now();
	CHECK_ERR(recv(s, buf, 1000, MSG_WAITALL), EAGAIN);
	dt = tl_now() - t0;
	CHECK(dt >= 0.12 && dt < 1.0, "returned after %.3f s", dt);
	tv.tv_usec = 0;
	SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));

	/* EOF before the full length: the short count, then 0. */
	tl_fill(buf, 700, 0, SEED);
	CHECK_EQ(send(c, buf, 700, 0), 700);
	SYS(shutdown(c, SHUT_WR));
	memset(buf, 0, sizeof buf);
	CHECK_EQ(recv(s, buf, 1000, MSG_WAITALL), 700);
	CHECK_PAT(buf, 700, 0, SEED);
	CHECK_EQ(recv(s, buf, 1000, MSG_WAITALL), 0);

	uint64_t total = 2 * N + 300 + 500 + 300 + 700;
	expect_bytes(c, total, 0);
	expect_bytes(s, 0, total);
	SYS(close(c));
	SYS(close(s));
	return 0;
}
