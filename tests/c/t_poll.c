/*
 * poll, ppoll, select, pselect on stream sockets: readable exactly when
 * data (or EOF) is queued, writable unless the send path is full, woken
 * from another thread by arriving data, timeouts honoured, signal masks of
 * ppoll/pselect applied (EINTR), POLLOUT/select-writable reported again
 * once a full stream has been drained by the peer.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/select.h>

static int g_fd;
static void *late_send(void *arg)
{
	(void)arg;
	tl_idle_ms(50);
	CHECK_EQ(send(g_fd, "w", 1, 0), 1);
	return NULL;
}

static volatile sig_atomic_t got_usr1;
static void on_usr1(int sig) { (void)sig; got_usr1 = 1; }
static pthread_t main_th;
static void *late_signal(void *arg)
{
	(void)arg;
	tl_idle_ms(50);
	CHECK_EQ(pthread_kill(main_th, SIGUSR1), 0);
	return NULL;
}

static void *drainer(void *arg)
{
	int s = *(int *)arg;
	static char buf[65536];
	uint64_t *total = malloc(sizeof *total);
	*total = 0;
	tl_idle_ms(50);
	for (;;) {
		ssize_t n = recv(s, buf, sizeof buf, MSG_DONTWAIT);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			break;
		}
		CHECK_PAT(buf, (size_t)n, *total, 8);
		*total += (uint64_t)n;
	}
	return total;
}

static uint64_t fill(int c)
{
	static char buf[65536];
	uint64_t sent = 0;
	for (;;) {
		tl_fill(buf, sizeof buf, sent, 8);
		ssize_t n = send(c, buf, sizeof buf, MSG_DONTWAIT);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			return sent;
		}
		sent += (uint64_t)n;
	}
}

int main(void)
{
	int c, s;
	char buf[64];
	pthread_t th;
	double t0, dt;

	tl_watchdog(15);
	main_th = pthread_self();
	struct sigaction sa = { .sa_handler = on_usr1 };
	SYS(sigaction(SIGUSR1, &sa, NULL));
	sigset_t usr1, none;
	sigemptyset(&usr1);
	sigaddset(&usr1, SIGUSR1);
	sigemptyset(&none);
	SYS(sigprocmask(SIG_BLOCK, &usr1, NULL));

	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* --- poll */
	struct pollfd p[2] = { { s, POLLIN | POLLOUT, 0 }, { c, POLLIN, 0 } };
	CHECK_EQ(poll(p, 2, 0), 1);
	CHECK_EQ(p[0].revents, POLLOUT);
	CHECK_EQ(p[1].revents, 0);
	p[0].events = POLLIN;
	t0 = tl_now();
	CHECK_EQ(poll(p, 2, 150), 0);
	dt = tl_now() - t0;
	CHECK(dt >= 0.14 && dt < 1.0, "poll timeout after %.3f s", dt);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	CHECK_EQ(poll(p, 2, 0), 1);
	CHECK_EQ(p[0].revents, POLLIN);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 3);
	CHECK_EQ(poll(p, 2, 0), 0);
	/* Woken by data from another thread. */
	g_fd = c;
	CHECK_EQ(pthread_create(&th, NULL, late_send, NULL), 0);
	CHECK_EQ(poll(p, 2, 5000), 1);
	CHECK_EQ(p[0].revents, POLLIN);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	/* Negative fd entries are ignored, POLLNVAL for a closed one. */
	int x = SYS(dup(0));
	SYS(close(x));
	struct pollfd q[3] = { { -1, POLLIN, 0 }, { x, POLLIN, 0 },
			       { s, POLLOUT, 0 } };
	CHECK_EQ(poll(q, 3, 0), 2);
	CHECK_EQ(q[0].revents, 0);
	CHECK_EQ(q[1].revents, POLLNVAL);
	CHECK_EQ(q[2].revents, POLLOUT);

	/* --- ppoll: timeout, data, and its signal mask. */
	struct timespec ts = { 0, 100000000 };
	t0 = tl_now();
	CHECK_EQ(ppoll(p, 2, &ts, NULL), 0);
	CHECK(tl_now() - t0 >= 0.09);
	CHECK_EQ(send(c, "d", 1, 0), 1);
	CHECK_EQ(ppoll(p, 2, NULL, &usr1), 1);
	CHECK_EQ(p[0].revents, POLLIN);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	got_usr1 = 0;
	CHECK_EQ(pthread_create(&th, NULL, late_signal, NULL), 0);
	CHECK_ERR(ppoll(p, 2, NULL, &none), EINTR);
	CHECK_EQ(got_usr1, 1);
	CHECK_EQ(pthread_join(th, NULL), 0);

	/* --- select */
	fd_set r, w;
	struct timeval tv = { 0, 100000 };
	FD_ZERO(&r);
	FD_ZERO(&w);
	FD_SET(s, &r);
	FD_SET(c, &r);
	t0 = tl_now();
	CHECK_EQ(select((s > c ? s : c) + 1, &r, NULL, NULL, &tv), 0);
	CHECK(tl_now() - t0 >= 0.09);
	CHECK(!FD_ISSET(s, &r) && !FD_ISSET(c, &r));
	CHECK(tv.tv_sec == 0 && tv.tv_usec == 0);
	CHECK_EQ(send(c, "e", 1, 0), 1);
	FD_SET(s, &r);
	FD_SET(c, &r);
	FD_SET(s, &w);
	tv.tv_sec = 2;
	CHECK_EQ(select((s > c ? s : c) + 1, &r, &w, NULL, &tv), 2);
	CHECK(FD_ISSET(s, &r) && !FD_ISSET(c, &r) && FD_ISSET(s, &w));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	/* Woken by data from another thread. */
	CHECK_EQ(pthread_create(&th, NULL, late_send, NULL), 0);
	FD_ZERO(&r);
	FD_SET(s, &r);
	CHECK_EQ(select(s + 1, &r, NULL, NULL, NULL), 1);
	CHECK(FD_ISSET(s, &r));
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);

	/* --- pselect: timeout and signal mask. */
	FD_ZERO(&r);
	FD_SET(s, &r);
	t0 = tl_now();
	CHECK_EQ(pselect(s + 1, &r, NULL, NULL, &ts, &usr1), 0);
	CHECK(tl_now() - t0 >= 0.09);
	got_usr1 = 0;
	CHECK_EQ(pthread_create(&th, NULL, late_signal, NULL), 0);
	FD_SET(s, &r);
	CHECK_ERR(pselect(s + 1, &r, NULL, NULL, NULL, &none), EINTR);
	CHECK_EQ(got_usr1, 1);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(send(c, "f", 1, 0), 1);
	FD_SET(s, &r);
	CHECK_EQ(pselect(s + 1, &r, NULL, NULL, NULL, &usr1), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);

	/* --- writable again after full, once the peer drains. */
	uint64_t sent = fill(c);
	struct pollfd o = { c, POLLOUT, 0 };
	CHECK_EQ(poll(&o, 1, 0), 0);
	FD_ZERO(&w);
	FD_SET(c, &w);
	tv.tv_sec = 0;
	tv.tv_usec = 0;
	CHECK_EQ(select(c + 1, NULL, &w, NULL, &tv), 0);
	CHECK_EQ(pthread_create(&th, NULL, drainer, &s), 0);
	CHECK_EQ(poll(&o, 1, 5000), 1);
	CHECK_EQ(o.revents, POLLOUT);
	void *ret;
	CHECK_EQ(pthread_join(th, &ret), 0);
	uint64_t drained = *(uint64_t *)ret;
	free(ret);
	/* Drain whatever else the kernel pushed after the window opened. */
	for (;;) {
		static char b2[65536];
		ssize_t n = recv(s, b2, sizeof b2, MSG_DONTWAIT);
		if (n < 0)
			break;
		CHECK_PAT(b2, (size_t)n, drained, 8);
		drained += (uint64_t)n;
	}
	CHECK_EQ(drained, sent);
	/* Again, through select. */
	sent += fill(c);
	CHECK_EQ(pthread_create(&th, NULL, drainer, &s), 0);
	FD_ZERO(&w);
	FD_SET(c, &w);
	CHECK_EQ(select(c + 1, NULL, &w, NULL, NULL), 1);
	CHECK(FD_ISSET(c, &w));
	CHECK_EQ(pthread_join(th, &ret), 0);
	free(ret);

	SYS(close(c));
	SYS(close(s));
	return 0;
}
