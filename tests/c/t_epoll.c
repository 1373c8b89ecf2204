/*
 * epoll, level-triggered: EPOLLIN while data is queued (reported again and
 * again until read), EPOLLOUT while writable and again after a full stream
 * was drained by the peer, EPOLLRDHUP on the peer's shutdown(SHUT_WR),
 * EPOLLHUP when both directions are shut, EPOLLERR|EPOLLHUP after a reset;
 * epoll_pwait and epoll_pwait2 (timeout and signal mask); data.u64 kept;
 * EPOLL_CTL_DEL / MOD and their errors.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/epoll.h>

static int wait1(int ep, struct epoll_event *ev, int ms)
{
	memset(ev, 0, sizeof *ev);
	return epoll_wait(ep, ev, 1, ms);
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

static int g_fd;
static void *late_send(void *arg)
{
	(void)arg;
	tl_idle_ms(50);
	CHECK_EQ(send(g_fd, "w", 1, 0), 1);
	return NULL;
}

static size_t drained;                 /* bytes the drainer read */

static void *drainer(void *arg)
{
	int s = *(int *)arg;
	static char buf[65536];
	tl_idle_ms(50);
	ssize_t n;
	while ((n = recv(s, buf, sizeof buf, MSG_DONTWAIT)) > 0)
		drained += (size_t)n;
	return NULL;
}

int main(void)
{
	int c, s;
	char buf[64];
	struct epoll_event ev, out[4];
	pthread_t th;

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

	int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
	ev.events = EPOLLIN | EPOLLRDHUP;
	ev.data.u64 = 0x1122334455667788ull;
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
	CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev), EEXIST);
	CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_MOD, c, &ev), ENOENT);
	CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_DEL, c, NULL), ENOENT);

	/* Nothing yet; timeout honoured. */
	double t0 = tl_now();
	CHECK_EQ(wait1(ep, out, 100), 0);
	CHECK(tl_now() - t0 >= 0.09);

	/* Level-triggered: reported until consumed. */
	CHECK_EQ(send(c, "abcd", 4, 0), 4);
	for (int i = 0; i < 3; i++) {
		CHECK_EQ(wait1(ep, out, 1000), 1);
		CHECK_EQ(out[0].events, EPOLLIN);
		CHECK_EQ(out[0].data.u64, 0x1122334455667788ull);
	}
	CHECK_EQ(recv(s, buf, 2, 0), 2);
	CHECK_EQ(wait1(ep, out, 0), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 2);
	CHECK_EQ(wait1(ep, out, 0), 0);

	/* Woken by data from another thread. */
	g_fd = c;
	CHECK_EQ(pthread_create(&th, NULL, late_send, NULL), 0);
	CHECK_EQ(wait1(ep, out, 5000), 1);
	CHECK_EQ(out[0].events, EPOLLIN);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);

	/* epoll_pwait: mask keeps the signal out, then lets it in. */
	CHECK_EQ(send(c, "p", 1, 0), 1);
	CHECK_EQ(epoll_pwait(ep, out, 4, 1000, &usr1), 1);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
	got_usr1 = 0;
	CHECK_EQ(pthread_create(&th, NULL, late_signal, NULL), 0);
	CHECK_ERR(epoll_pwait(ep, out, 4, 5000, &none), EINTR);
	CHECK_EQ(got_usr1, 1);
	CHECK_EQ(pthread_join(th, NULL), 0);

	/* epoll_pwait2: nanosecond timeout, data, and the mask. */
	struct timespec ts = { 0, 100000000 };
	t0 = tl_now();
	int r = epoll_pwait2(ep, out, 4, &ts, NULL);
	if (r < 0 && errno == ENOSYS) {
		fprintf(stderr, "note: epoll_pwait2 not in this kernel\n");
	} else {
		CHECK_EQ(r, 0);
		CHECK(tl_now() - t0 >= 0.09);
		CHECK_EQ(send(c, "q", 1, 0), 1);
		CHECK_EQ(epoll_pwait2(ep, out, 4, NULL, &usr1), 1);
		CHECK_EQ(out[0].events, EPOLLIN);
		CHECK_EQ(recv(s, buf, sizeof buf, 0), 1);
		got_usr1 = 0;
		CHECK_EQ(pthread_create(&th, NULL, late_signal, NULL), 0);
		CHECK_ERR(epoll_pwait2(ep, out, 4, NULL, &none), EINTR);
		CHECK_EQ(got_usr1, 1);
		CHECK_EQ(pthread_join(th, NULL), 0);
	}

	/* EPOLLOUT: writable, not while full, again after the peer drains. */
	int epo = SYS(epoll_create1(0));
	ev.events = EPOLLOUT;
	ev.data.fd = c;
	SYS(epoll_ctl(epo, EPOLL_CTL_ADD, c, &ev));
	CHECK_EQ(wait1(epo, out, 0), 1);
	CHECK_EQ(out[0].events, EPOLLOUT);
	CHECK_EQ(out[0].data.fd, c);
	static char big[65536];
	memset(big, 'z', sizeof big);
	size_t filled = 0;
	ssize_t k;
	while ((k = send(c, big, sizeof big, MSG_DONTWAIT)) > 0)
		filled += (size_t)k;
	CHECK_EQ(errno, EAGAIN);
	CHECK_EQ(wait1(epo, out, 0), 0);
	CHECK_EQ(pthread_create(&th, NULL, drainer, &s), 0);
	CHECK_EQ(wait1(epo, out, 5000), 1);
	CHECK_EQ(out[0].events, EPOLLOUT);
	CHECK_EQ(out[0].data.fd, c);
	CHECK_EQ(pthread_join(th, NULL), 0);
	/* The rest of what was sent (across a link some is still on its way:
	 * read it whole, blocking). */
	while (drained < filled) {
		ssize_t n = recv(s, big, sizeof big, 0);
		CHECK(n > 0, "recv -> %zd with %zu of %zu bytes read", n, drained, filled);
		drained += (size_t)n;
	}
	CHECK_EQ(drained, filled);
	SYS(epoll_ctl(epo, EPOLL_CTL_DEL, c, NULL));
	SYS(close(epo));

	/* EPOLLRDHUP (with EPOLLIN) on the peer's SHUT_WR; no EPOLLHUP. */
	SYS(shutdown(c, SHUT_WR));
	CHECK_EQ(wait1(ep, out, 1000), 1);
	CHECK_EQ(out[0].events, EPOLLIN | EPOLLRDHUP);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	CHECK_EQ(wait1(ep, out, 0), 1);		/* EOF stays readable */
	CHECK_EQ(out[0].events, EPOLLIN | EPOLLRDHUP);
	/* Our own SHUT_WR too: EPOLLHUP. */
	SYS(shutdown(s, SHUT_WR));
	CHECK_EQ(wait1(ep, out, 0), 1);
	CHECK_EQ(out[0].events, EPOLLIN | EPOLLRDHUP | EPOLLHUP);
	/* EPOLLHUP is reported even when not asked for. */
	ev.events = 0;
	ev.data.u64 = 7;
	SYS(epoll_ctl(ep, EPOLL_CTL_MOD, s, &ev));
	CHECK_EQ(wait1(ep, out, 0), 1);
	CHECK_EQ(out[0].events, EPOLLHUP);
	CHECK_EQ(out[0].data.u64, 7);
	SYS(close(c));
	SYS(close(s));
	/* Closed: gone from the set. */
	CHECK_EQ(wait1(ep, out, 0), 0);

	/* Reset: EPOLLERR|EPOLLHUP (with IN/OUT/RDHUP). */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	ev.events = EPOLLIN | EPOLLOUT | EPOLLRDHUP;
	ev.data.fd = c;
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, c, &ev));
	CHECK_EQ(wait1(ep, out, 0), 1);
	CHECK_EQ(out[0].events, EPOLLOUT);
	CHECK_EQ(send(c, "unread", 6, 0), 6);
	SYS(close(s));
	CHECK_EQ(wait1(ep, out, 1000), 1);
	CHECK_EQ(out[0].events,
		 EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLERR | EPOLLHUP);
	CHECK_ERR(recv(c, buf, sizeof buf, 0), ECONNRESET);
	CHECK_EQ(wait1(ep, out, 0), 1);
	CHECK_EQ(out[0].events, EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLHUP);
	SYS(close(c));
	SYS(close(ep));
	return 0;
}
