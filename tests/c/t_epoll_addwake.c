/*
 * A connection added to an epoll set while another thread already sleeps
 * in epoll_wait on it wakes that thread, with the application's own data
 * word.
 *
 * The pattern of servers that accept in one thread and hand connections
 * to workers: each worker sleeps in epoll_wait on its own set, and the
 * acceptor adds the new socket (data.ptr = the connection's state) from
 * its thread. Here the worker's set holds nothing else at first (its wait
 * goes to the kernel as the application asked) or one connection already
 * (a wait with SDP members, counted on that peer's queue), and each new
 * connection comes from a new peer process, so the set takes a new
 * readiness queue while the worker sleeps. Every echo must reach the
 * worker with the pointer the acceptor registered, and its bytes intact.
 * Before: the worker slept on (nothing woke it but a safety-net token),
 * and a wait that went to the kernel with no members could be handed the
 * library's own registration (a tagged data word instead of the pointer).
 */
#include "testlib.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>

#define ROUNDS 8

struct conn {
	uint64_t magic;
	int fd;
	uint64_t expect;
};
#define MAGIC 0xc0ffee5dc0ffee5dull

static int ep, done_w;
static _Atomic pid_t worker_tid;

static void *worker(void *arg)
{
	(void)arg;
	atomic_store(&worker_tid, (pid_t)syscall(SYS_gettid));
	for (;;) {
		struct epoll_event evs[4];
		int n = epoll_wait(ep, evs, 4, 20000);
		CHECK(n > 0, "worker: epoll_wait -> %d (nothing in 20 s)", n);
		for (int i = 0; i < n; i++) {
			struct conn *c = evs[i].data.ptr;
			CHECK(c && c->magic == MAGIC, "worker: data word %#llx is not ours",
			      (unsigned long long)evs[i].data.u64);
			if (c->fd < 0)
				return NULL;      /* the quit pipe */
			uint64_t got;
			ssize_t r = recv(c->fd, &got, sizeof got, MSG_DONTWAIT | MSG_PEEK);
			if (r < 0 && errno == EAGAIN)
				continue;
			if (r < (ssize_t)sizeof got)
				continue;         /* the rest is on its way */
			CHECK(recv(c->fd, &got, sizeof got, MSG_DONTWAIT) == sizeof got,
			      "worker: recv");
			CHECK(got == c->expect, "worker: wrong echo");
			char b = 1;
			SYS(write(done_w, &b, 1));
		}
	}
}

static void wait_blocked(void)
{
	double t0 = tl_now();
	while (!tl_task_in_epoll_wait(atomic_load(&worker_tid))) {
		CHECK(tl_now() - t0 < 10, "the worker never slept in epoll_wait");
		sched_yield();
	}
}

int main(void)
{
	tl_watchdog(60);
	if (access("/proc/thread-self/syscall", R_OK) < 0)
		SKIP("no /proc/thread-self/syscall: cannot see where the worker is");
	ep = SYS(epoll_create1(EPOLL_CLOEXEC));
	int dp[2], qp[2];
	SYS(pipe2(dp, O_CLOEXEC));
	SYS(pipe2(qp, O_CLOEXEC));
	done_w = dp[1];
	static struct conn quit = { MAGIC, -1, 0 };
	struct epoll_event qe = { .events = EPOLLIN, .data.ptr = &quit };
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, qp[0], &qe));

	pthread_t th;
	CHECK(pthread_create(&th, NULL, worker, NULL) == 0, "pthread_create");
	static struct conn conns[ROUNDS];
	pid_t pids[ROUNDS];
	for (int r = 0; r < ROUNDS; r++) {
		uint16_t port;
		pids[r] = tl_fork_echo_once(&port);
		/* Rounds 0-3: the worker's set has no connection while it
		 * sleeps (each round's connection is closed before the next);
		 * rounds 4-7: the previous one stays in the set. */
		wait_blocked();
		struct conn *c = &conns[r];
		c->magic = MAGIC;
		c->fd = tl_connect(AF_INET, port);
		expect_transport(c->fd);
		c->expect = 0x5a5a000000000000ull ^ (uint64_t)(r + 1) * 0x9e3779b97f4a7c15ull;
		struct epoll_event e = { .events = EPOLLIN, .data.ptr = c };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, c->fd, &e));
		tl_send_all(c->fd, &c->expect, sizeof c->expect);
		char b;
		CHECK(read(dp[0], &b, 1) == 1, "the worker's echo, round %d", r);
		if (r < ROUNDS / 2) {
			wait_blocked();
			SYS(epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL));
			SYS(close(c->fd));
			tl_wait_ok(pids[r]);
		}
	}
	char q = 1;
	SYS(write(qp[1], &q, 1));
	CHECK(pthread_join(th, NULL) == 0, "pthread_join");
	/* Each later server holds copies of the earlier connections (forked
	 * after them): all closed first, they end in a cascade. */
	for (int r = ROUNDS / 2; r < ROUNDS; r++)
		SYS(close(conns[r].fd));
	for (int r = ROUNDS / 2; r < ROUNDS; r++)
		tl_wait_ok(pids[r]);
	printf("t_epoll_addwake: %d connections added while the worker slept, every echo "
	       "with its pointer\n", ROUNDS);
	return 0;
}
