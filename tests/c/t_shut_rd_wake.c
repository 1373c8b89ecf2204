/*
 * shutdown(SHUT_RD) wakes a thread already asleep on the socket, whatever
 * it sleeps in: a blocking recv/read/recvmsg/recvmmsg (with MSG_WAITALL,
 * with bytes already taken, with SO_RCVTIMEO), poll, ppoll, select, and
 * epoll_wait level- and edge-triggered. The kernel's answers: a read
 * returns 0 (or the bytes it had), poll says POLLIN|POLLRDHUP, epoll
 * EPOLLIN|EPOLLRDHUP. The other direction keeps working: 24 MiB sent
 * after the shutdown (the sender waits for room) reach the peer intact. The thread is known to sleep from
 * /proc (state S inside a system call, twice alike), never from a delay;
 * a waiter that does not return within 5 s fails the case. So does one
 * that returns only after PROMPT_S three times in a row: it was woken by a
 * periodic look (the library's poll and epoll sleeps look at their SDP
 * members every second), not by the shutdown, which the kernel's answer
 * follows at once.
 */
#include <pthread.h>
#include <sys/epoll.h>
#include <sys/select.h>
#include <sys/syscall.h>

#include "testlib.h"

#define SEED 57
/* Bytes sent back after the shutdown: more than the rings and socket
 * buffers hold, so that the sender waits for room (on SDP: for the peer's
 * tokens on the kernel socket, which stays open for them). */
#define BACK (24 << 20)
#define PROMPT_S 0.6

enum style { RECV, READ, RECVMSG, RECVMMSG, WAITALL, WAITALL_PART, TIMEO,
	     POLL, PPOLL, SELECT, EPOLL_LT, EPOLL_ET };

struct waiter {
	enum style style;
	int fd;
	bool main_waits;              /* the main thread waits, a thread shuts */
	_Atomic pid_t tid;
	_Atomic int done;
	long long ret;                /* what the call returned */
	int err;
	unsigned ev;                  /* poll/epoll: the events reported */
	double woke_after;            /* s from the shutdown to the return */
};

static void do_wait(struct waiter *w)
{
	char buf[100];
	int fd = w->fd;
	w->tid = (pid_t)syscall(SYS_gettid);
	errno = 0;
	switch (w->style) {
	case RECV:
	case TIMEO:
		w->ret = recv(fd, buf, sizeof buf, 0);
		break;
	case READ:
		w->ret = read(fd, buf, sizeof buf);
		break;
	case RECVMSG: {
		struct iovec v = { buf, sizeof buf };
		struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1 };
		w->ret = recvmsg(fd, &m, 0);
		break;
	}
	case RECVMMSG: {
		struct iovec v = { buf, sizeof buf };
		struct mmsghdr mm = { .msg_hdr = { .msg_iov = &v, .msg_iovlen = 1 } };
		w->ret = recvmmsg(fd, &mm, 1, 0, NULL);
		if (w->ret == 1)
			w->ret = 100 + mm.msg_len;  /* one message of msg_len */
		break;
	}
	case WAITALL:
	case WAITALL_PART:
		w->ret = recv(fd, buf, sizeof buf, MSG_WAITALL);
		if (w->style == WAITALL_PART && w->ret == 10 &&
		    memcmp(buf, "0123456789", 10) != 0)
			w->ret = -2;
		break;
	case POLL: {
		struct pollfd p = { fd, POLLIN | POLLRDHUP, 0 };
		w->ret = poll(&p, 1, -1);
		w->ev = (unsigned)p.revents;
		break;
	}
	case PPOLL: {
		struct pollfd p = { fd, POLLIN | POLLRDHUP, 0 };
		w->ret = ppoll(&p, 1, NULL, NULL);
		w->ev = (unsigned)p.revents;
		break;
	}
	case SELECT: {
		fd_set r;
		FD_ZERO(&r);
		FD_SET(fd, &r);
		w->ret = select(fd + 1, &r, NULL, NULL, NULL);
		w->ev = FD_ISSET(fd, &r) ? POLLIN : 0;
		break;
	}
	case EPOLL_LT:
	case EPOLL_ET: {
		int ep = epoll_create1(EPOLL_CLOEXEC);
		struct epoll_event e = { .events = EPOLLIN | EPOLLRDHUP |
					 (w->style == EPOLL_ET ? EPOLLET : 0),
					 .data.u64 = 0x1234 };
		if (ep < 0 || epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e) < 0) {
			w->ret = -3;
			break;
		}
		struct epoll_event out[4];
		w->ret = epoll_wait(ep, out, 4, -1);
		if (w->ret == 1 && out[0].data.u64 == 0x1234)
			w->ev = out[0].events;
		close(ep);
		break;
	}
	}
	w->err = errno;
	atomic_store(&w->done, 1);
}

static void *waiter_main(void *arg)
{
	do_wait(arg);
	return NULL;
}

/* Is thread tid asleep inside a system call? State S in its stat and the
 * same system call line (number, arguments, stack) in two looks 1 ms
 * apart. */
static bool asleep(pid_t tid)
{
	char path[64], a[256] = "", b[256] = "", st[512];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return false;
	size_t n = fread(st, 1, sizeof st - 1, f);
	fclose(f);
	st[n] = 0;
	char *p = strrchr(st, ')');
	if (!p || p[1] != ' ' || p[2] != 'S')
		return false;
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
	for (int k = 0; k < 2; k++) {
		f = fopen(path, "r");
		if (!f)
			return false;
		char *dst = k ? b : a;
		if (!fgets(dst, 256, f))
			dst[0] = 0;
		fclose(f);
		if (!k)
			tl_idle_ms(1);        /* pacing of the two looks */
	}
	return a[0] >= '0' && a[0] <= '9' && strcmp(a, b) == 0;
}

/* Wait (bounded) until tid sleeps; fail if it never does. */
static void wait_asleep(struct waiter *w)
{
	double end = tl_now() + 5;
	while (!atomic_load(&w->tid) && tl_now() < end)
		sched_yield();
	CHECK(atomic_load(&w->tid) != 0, "the waiter never started");
	while (!asleep(w->tid)) {
		CHECK(!atomic_load(&w->done), "the waiter returned before the shutdown: "
		      "%lld errno %d", w->ret, w->err);
		CHECK(tl_now() < end, "the waiter never fell asleep");
		tl_idle_ms(1);
	}
}

/* Wait (bounded) for the waiter's return: 5 s, then a failure. */
static void wait_done(struct waiter *w, const char *what)
{
	double t0 = tl_now();
	while (!atomic_load(&w->done)) {
		if (tl_now() - t0 > 5)
			TL_FAIL("%s: the waiter still sleeps 5 s after shutdown(SHUT_RD)",
				what);
		tl_idle_ms(1);
	}
	w->woke_after = tl_now() - t0;
	printf("    %s returned after %.1f ms\n", what, w->woke_after * 1000);
	fflush(stdout);
}

static void *shutter_main(void *arg)
{
	struct waiter *w = arg;
	wait_asleep(w);
	SYS(shutdown(w->fd, SHUT_RD));
	wait_done(w, "the main thread's wait");
	return NULL;
}

static void *reader_main(void *arg)
{
	tl_recv_pat(*(int *)arg, 0, BACK, SEED, 65536);
	return NULL;
}

static void check_result(struct waiter *w)
{
	unsigned want_ev = w->style == SELECT ? POLLIN :
		(w->style == EPOLL_LT || w->style == EPOLL_ET) ?
		(unsigned)(EPOLLIN | EPOLLRDHUP) : (unsigned)(POLLIN | POLLRDHUP);
	switch (w->style) {
	case RECVMMSG:
		/* one message of 0 bytes: the end of the stream */
		CHECK_EQ(w->ret, 100);
		break;
	case WAITALL_PART:
		CHECK_EQ(w->ret, 10);         /* the bytes it had, then the end */
		break;
	case POLL:
	case PPOLL:
	case SELECT:
	case EPOLL_LT:
	case EPOLL_ET:
		CHECK_EQ(w->ret, 1);
		CHECK_EQ(w->ev, want_ev);
		break;
	default:
		CHECK_EQ(w->ret, 0);
	}
}

/* One try: how long the waiter took to return after the shutdown (s). */
static double run(enum style style, const char *what, bool main_waits)
{
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	if (style == TIMEO) {
		struct timeval tv = { 30, 0 };
		SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	}
	if (style == WAITALL_PART)
		CHECK_EQ(send(c, "0123456789", 10, 0), 10);
	struct waiter w = { .style = style, .fd = s, .main_waits = main_waits };
	pthread_t th;
	if (main_waits) {
		/* This thread waits; another one shuts the socket. */
		w.tid = (pid_t)syscall(SYS_gettid);
		CHECK_EQ(pthread_create(&th, NULL, shutter_main, &w), 0);
		do_wait(&w);
	} else {
		CHECK_EQ(pthread_create(&th, NULL, waiter_main, &w), 0);
		wait_asleep(&w);
		SYS(shutdown(s, SHUT_RD));
		wait_done(&w, what);
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	check_result(&w);
	/* Reading stays at the end; sending still works both ways. */
	char b;
	CHECK_EQ(recv(s, &b, 1, MSG_DONTWAIT), 0);
	pthread_t rd;
	CHECK_EQ(pthread_create(&rd, NULL, reader_main, &c), 0);
	tl_send_pat(s, 0, BACK, SEED, 65536);
	CHECK_EQ(pthread_join(rd, NULL), 0);
	CHECK_EQ(send(c, "x", 1, 0), 1);      /* taken, as TCP takes it */
	SYS(close(c));
	SYS(close(s));
	return w.woke_after;
}

static void run_case(enum style style, const char *what, bool main_waits)
{
	double t = 0;
	for (int k = 0; k < 3; k++) {
		tl_watchdog(30);
		t = run(style, what, main_waits);
		if (t < PROMPT_S)
			return;
	}
	TL_FAIL("%s: woke %.0f ms after shutdown(SHUT_RD), three times: by a "
		"periodic look, not by the shutdown", what, t * 1000);
}

#define CASE(st, main_waits)                                        \
	static void case_##st##_##main_waits(void)                  \
	{                                                           \
		run_case(st, #st, main_waits);                      \
	}
CASE(RECV, 0) CASE(RECV, 1) CASE(READ, 0) CASE(RECVMSG, 0) CASE(RECVMMSG, 0)
CASE(WAITALL, 0) CASE(WAITALL_PART, 0) CASE(TIMEO, 0) CASE(POLL, 0)
CASE(POLL, 1) CASE(PPOLL, 0) CASE(SELECT, 0) CASE(EPOLL_LT, 0)
CASE(EPOLL_ET, 0) CASE(EPOLL_ET, 1)

int main(void)
{
	signal(SIGPIPE, SIG_IGN);
	static const struct tl_case cases[] = {
		{ "recv", case_RECV_0 }, { "recv-main", case_RECV_1 },
		{ "read", case_READ_0 }, { "recvmsg", case_RECVMSG_0 },
		{ "recvmmsg", case_RECVMMSG_0 }, { "waitall", case_WAITALL_0 },
		{ "waitall-10", case_WAITALL_PART_0 }, { "rcvtimeo", case_TIMEO_0 },
		{ "poll", case_POLL_0 }, { "poll-main", case_POLL_1 },
		{ "ppoll", case_PPOLL_0 }, { "select", case_SELECT_0 },
		{ "epoll", case_EPOLL_LT_0 }, { "epoll-et", case_EPOLL_ET_0 },
		{ "epoll-et-main", case_EPOLL_ET_1 },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
