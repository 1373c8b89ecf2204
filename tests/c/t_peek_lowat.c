/*
 * A blocking recv(MSG_PEEK) that must wait with data already queued: with
 * SO_RCVLOWAT 100 and 10 bytes queued, TCP waits (without using the CPU)
 * until 100 bytes are there and then returns them once each, in order.
 * The SDP receive path used to re-peek the queued messages on every pass
 * while it counted what it had already copied (the 10 bytes came back
 * ten times over), and to re-check without sleeping while unconsumed
 * messages were queued (a busy loop until the rest arrived, for ever if
 * a FIN came instead: TCP returns what it has then).
 */
#include "testlib.h"
#include <pthread.h>

static int g_s;
static double g_cpu;                   /* the peeker's CPU seconds */
static ssize_t g_n;
static unsigned char g_buf[200];

static double thread_cpu(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void *peeker(void *arg)
{
	(void)arg;
	double t0 = thread_cpu();
	g_n = recv(g_s, g_buf, sizeof g_buf, MSG_PEEK);
	g_cpu = thread_cpu() - t0;
	return NULL;
}

int main(void)
{
	int c, s;
	unsigned char pat[100], buf[200];
	tl_watchdog(20);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	tl_fill(pat, sizeof pat, 0, 7);
	int lowat = 100;
	SYS(setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat));

	tl_send_all(c, pat, 10);
	/* The 10 bytes are there before the peek starts. */
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK | MSG_DONTWAIT), 10);
	g_s = s;
	pthread_t t;
	CHECK(pthread_create(&t, NULL, peeker, NULL) == 0);
	tl_idle_ms(400);                   /* the peeker waits meanwhile */
	tl_send_all(c, pat + 10, 90);
	CHECK(pthread_join(t, NULL) == 0);
	CHECK_EQ(g_n, 100);
	CHECK(memcmp(g_buf, pat, 100) == 0, "peeked bytes differ from what was sent");
	/* Waiting must not burn the CPU: TCP uses ~0 s of the 0.4 s. */
	CHECK(g_cpu < 0.1, "the peeker used %.3f s of CPU while it waited", g_cpu);
	/* Nothing was consumed. */
	tl_recv_all(s, buf, 100);
	CHECK(memcmp(buf, pat, 100) == 0);
	close(c);
	close(s);

	/* Less than SO_RCVLOWAT, then the FIN: the peek returns what is
	 * there (it used to wait for ever, spinning). */
	tl_pair(AF_INET, &c, &s);
	expect_transport(s);
	SYS(setsockopt(s, SOL_SOCKET, SO_RCVLOWAT, &lowat, sizeof lowat));
	tl_send_all(c, pat, 10);
	SYS(shutdown(c, SHUT_WR));
	CHECK_EQ(recv(s, buf, sizeof buf, MSG_PEEK), 10);
	CHECK(memcmp(buf, pat, 10) == 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 10);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	close(c);
	close(s);
	return 0;
}
