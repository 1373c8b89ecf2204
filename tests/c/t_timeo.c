/*
 * SO_RCVTIMEO / SO_SNDTIMEO: a blocking receive on an empty stream and a
 * blocking send on a full one fail with EAGAIN after about the timeout;
 * data arriving in time is returned; the option reads back as set; accept
 * honours SO_RCVTIMEO; a zero timeout means wait forever.
 */
#include "testlib.h"
#include <pthread.h>

#define TMO_US 200000
#define SEED 4

static void check_elapsed(double t0, const char *what)
{
	double dt = tl_now() - t0;
	CHECK(dt >= 0.18 && dt < 1.5, "%s returned after %.3f s, timeout "
	      "was 0.2 s", what, dt);
}

/* Fill the stream without blocking, then one blocking call must time
 * out. The kernel may reopen a little window on its own while we wait
 * (zero-window probing), in which case the call sends and we fill again;
 * it must time out within a few rounds. */
static void timed_send(int c, int use_write, uint64_t *sent)
{
	static char buf[65536];
	for (int round = 0; round < 5; round++) {
		for (;;) {
			tl_fill(buf, sizeof buf, *sent, SEED);
			ssize_t n = send(c, buf, sizeof buf, MSG_DONTWAIT);
			if (n < 0) {
				CHECK_EQ(errno, EAGAIN);
				break;
			}
			*sent += (uint64_t)n;
		}
		tl_fill(buf, 1000, *sent, SEED);
		double t0 = tl_now();
		errno = 0;
		ssize_t n = use_write ? write(c, buf, 1000)
				      : send(c, buf, 1000, 0);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			check_elapsed(t0, use_write ? "write" : "send");
			return;
		}
		CHECK(n > 0 && n <= 1000, "timed send -> %zd", n);
		*sent += (uint64_t)n;
	}
	TL_FAIL("a blocking send on a full stream never timed out");
}

static int g_c;
static void *late_sender(void *arg)
{
	(void)arg;
	tl_idle_ms(50);
	CHECK_EQ(send(g_c, "late", 4, 0), 4);
	return NULL;
}

int main(void)
{
	int c, s;
	static char buf[65536];
	struct timeval tv = { 0, TMO_US }, got;
	socklen_t len = sizeof got;
	double t0;

	tl_watchdog(15);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	SYS(getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &got, &len));
	CHECK_EQ(len, sizeof got);
	CHECK(got.tv_sec == 0 && got.tv_usec == 0);
	SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	SYS(getsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &got, &len));
	CHECK(got.tv_sec == 0 && got.tv_usec == TMO_US, "%ld.%06ld",
	      (long)got.tv_sec, (long)got.tv_usec);

	/* Receive timeouts through several entry points. */
	t0 = tl_now();
	CHECK_ERR(recv(s, buf, 10, 0), EAGAIN);
	check_elapsed(t0, "recv");
	t0 = tl_now();
	CHECK_ERR(read(s, buf, 10), EAGAIN);
	check_elapsed(t0, "read");
	struct iovec iov = { buf, 10 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	t0 = tl_now();
	CHECK_ERR(recvmsg(s, &mh, 0), EAGAIN);
	check_elapsed(t0, "recvmsg");

	/* Data arriving within the timeout is returned. */
	pthread_t th;
	g_c = c;
	CHECK_EQ(pthread_create(&th, NULL, late_sender, NULL), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
	CHECK(memcmp(buf, "late", 4) == 0);
	CHECK_EQ(pthread_join(th, NULL), 0);
	/* Data queued already: no waiting at all. */
	CHECK_EQ(send(c, "now", 3, 0), 3);
	t0 = tl_now();
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 3);
	CHECK(tl_now() - t0 < 0.1);

	/* Send timeout: fill the stream, then a blocking send gives up. */
	SYS(setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
	SYS(getsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &got, &len));
	CHECK(got.tv_sec == 0 && got.tv_usec == TMO_US);
	uint64_t sent = 0;
	timed_send(c, 0, &sent);
	timed_send(c, 1, &sent);
	/* Nothing of the timed-out sends got through: drain exactly. */
	uint64_t off = 0;
	for (;;) {
		ssize_t n = recv(s, buf, sizeof buf, MSG_DONTWAIT);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			break;
		}
		CHECK_PAT(buf, (size_t)n, off, SEED);
		off += (uint64_t)n;
	}
	CHECK_EQ(off, sent);

	/* A timeout of zero waits forever again (data comes late). */
	tv.tv_usec = 0;
	SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	CHECK_EQ(pthread_create(&th, NULL, late_sender, NULL), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 4);
	CHECK_EQ(pthread_join(th, NULL), 0);
	expect_bytes(c, sent + 11, 0);
	expect_bytes(s, 0, sent + 11);
	SYS(close(c));
	SYS(close(s));

	/* accept() honours SO_RCVTIMEO on the listener. */
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	tv.tv_usec = TMO_US;
	SYS(setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	t0 = tl_now();
	CHECK_ERR(accept(l, NULL, NULL), EAGAIN);
	check_elapsed(t0, "accept");
	SYS(close(l));
	return 0;
}
