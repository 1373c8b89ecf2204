/*
 * fork() while another thread is inside epoll_ctl or epoll_wait.
 *
 * A connected pair; the client end is in an epoll set, and a thread
 * changes its registration (MOD, DEL, ADD) and polls the set (timeout 0)
 * as fast as it can, so that at most moments it is inside the library's
 * epoll code (under SDP: holding the set's lock). Meanwhile the main
 * thread forks FORKS times; each child closes its copy of the client
 * socket (under SDP that walks every epoll set of the process), calls
 * epoll_ctl on its copy of the set (a MOD of a socket not in it: ENOENT)
 * and makes and drops spawn file actions (the thread makes them too: the
 * library follows them under a lock of its own),
 * every SEND_EVERY-th child sends a record on the server end, and it
 * exits. A child that copied a locked set used to wait in that close for
 * ever: each child must exit within CHILD_SECS, else it is killed and the
 * test fails (with where it waited). Afterwards the records the children
 * sent arrive in order on the parent's client end, and a pattern sent
 * through the connection both ways comes back intact. Kernel TCP first,
 * then SDP (the sockets must be on SDP).
 *
 * Then LIBC_FORKS more forks through libc's own fork, as one made inside
 * libc (daemon()) or by a library bound to libc directly is: the library's
 * fork() is bypassed, only the pthread_atfork handlers run. Such a child
 * is not counted as holding the connection (fdtab.c counts in fork()), so
 * it leaves the sockets alone and only calls epoll_ctl on its copy of the
 * set, which must not wait either.
 */
#include "testlib.h"
#include <dlfcn.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <sys/wait.h>

#define FORKS       300
#define FORK_SECS   20.0      /* stop forking after this long */
#define CHILD_SECS  10.0      /* a child that takes longer hangs */
#define SEND_EVERY  25
#define LIBC_FORKS  100
#define ECHO_BYTES  32768     /* fits either side's buffer */

static int ep, cli, srv;
static _Atomic int quit;
static _Atomic unsigned long churns;

static void *churn(void *arg)
{
	(void)arg;
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = cli }, out[4];
	while (!atomic_load(&quit)) {
		ev.events = EPOLLIN | EPOLLOUT;
		SYS(epoll_ctl(ep, EPOLL_CTL_MOD, cli, &ev));
		SYS(epoll_wait(ep, out, 4, 0));
		SYS(epoll_ctl(ep, EPOLL_CTL_DEL, cli, NULL));
		ev.events = EPOLLIN;
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, cli, &ev));
		SYS(epoll_wait(ep, out, 4, 0));
		/* The library follows spawn file actions under a lock. */
		posix_spawn_file_actions_t fa;
		CHECK_EQ(posix_spawn_file_actions_init(&fa), 0);
		CHECK_EQ(posix_spawn_file_actions_adddup2(&fa, srv, 3), 0);
		CHECK_EQ(posix_spawn_file_actions_destroy(&fa), 0);
		atomic_fetch_add(&churns, 1);
	}
	return NULL;
}

/* Where a hung child waits, for the failure message. */
static void describe(pid_t pid, char *buf, size_t n)
{
	char path[64], wchan[64] = "?";
	snprintf(path, sizeof path, "/proc/%d/wchan", (int)pid);
	FILE *f = fopen(path, "r");
	if (f) {
		size_t r = fread(wchan, 1, sizeof wchan - 1, f);
		wchan[r] = 0;
		fclose(f);
	}
	snprintf(buf, n, "wchan %s", wchan);
}

/* Waits for child pid for at most CHILD_SECS: its exit status, or -1 if it
 * is still running then (then it is killed and reaped). */
static int wait_child(pid_t pid, char *why, size_t n)
{
	int st, pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	double end = tl_now() + CHILD_SECS;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return st;
		CHECK(r == 0, "waitpid: %s", strerror(errno));
		double left = end - tl_now();
		if (left <= 0)
			break;
		if (pfd >= 0) {
			struct pollfd p = { .fd = pfd, .events = POLLIN };
			poll(&p, 1, (int)(left * 1000) + 1);
		} else {
			tl_idle_ms(1);        /* no pidfd: look again */
		}
	}
	describe(pid, why, n);
	kill(pid, SIGKILL);
	SYS(waitpid(pid, &st, 0));
	if (pfd >= 0)
		close(pfd);
	return -1;
}

static void child(int i, bool libc)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = srv };
	if (libc) {
		CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_MOD, srv, &ev), ENOENT);
		_exit(0);
	}
	/* Leaves every epoll set naming it: must not wait. */
	SYS(close(cli));
	CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_MOD, srv, &ev), ENOENT);
	posix_spawn_file_actions_t fa;
	CHECK_EQ(posix_spawn_file_actions_init(&fa), 0);
	CHECK_EQ(posix_spawn_file_actions_destroy(&fa), 0);
	if (i % SEND_EVERY == 0) {
		uint32_t rec[2] = { 0x666f726bu, (uint32_t)i };
		tl_send_all(srv, rec, sizeof rec);
	}
	_exit(0);
}

int main(void)
{
	tl_watchdog(55);
	tl_pair(AF_INET, &cli, &srv);
	expect_transport(cli);
	expect_transport(srv);
	ep = SYS(epoll_create1(EPOLL_CLOEXEC));
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = cli };
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, cli, &ev));

	pthread_t t;
	CHECK(pthread_create(&t, NULL, churn, NULL) == 0, "pthread_create");
	while (atomic_load(&churns) == 0)
		sched_yield();                /* the churn has started */

	void *libc = dlopen("libc.so.6", RTLD_NOW | RTLD_NOLOAD);
	pid_t (*libc_fork)(void) = libc ? (pid_t (*)(void))dlsym(libc, "fork") : NULL;
	CHECK(libc_fork, "libc's fork: %s", dlerror());

	double end = tl_now() + FORK_SECS;
	int forks = 0, sent = 0, total = FORKS + LIBC_FORKS;
	for (; forks < total && tl_now() < end; forks++) {
		bool by_libc = forks >= FORKS;
		pid_t pid = by_libc ? libc_fork() : fork();
		CHECK(pid >= 0, "fork: %s", strerror(errno));
		if (pid == 0)
			child(forks, by_libc);
		char why[128];
		int st = wait_child(pid, why, sizeof why);
		if (st == -1) {
			atomic_store(&quit, 1);
			TL_FAIL("child %d of %d (pid %d, %s) did not exit within "
				"%.0f s (%s)", forks + 1, total, (int)pid,
				by_libc ? "libc's fork" : "fork", CHILD_SECS, why);
		}
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "child %d: status 0x%x", forks + 1, st);
		if (!by_libc && forks % SEND_EVERY == 0)
			sent++;
	}
	atomic_store(&quit, 1);
	CHECK(pthread_join(t, NULL) == 0, "pthread_join");
	fprintf(stderr, "%d forks, %lu churn rounds\n", forks,
		atomic_load(&churns));
	CHECK(forks >= 20, "only %d forks in %.0f s", forks, FORK_SECS);

	/* The children's records, in order. */
	for (int k = 0; k < sent; k++) {
		uint32_t rec[2];
		tl_recv_all(cli, rec, sizeof rec);
		CHECK_EQ(rec[0], 0x666f726bu);
		CHECK_EQ(rec[1], (uint32_t)(k * SEND_EVERY));
	}
	/* The parent's connection still works, both ways. */
	tl_send_pat(cli, 0, ECHO_BYTES, 7, 4096);
	tl_recv_pat(srv, 0, ECHO_BYTES, 7, 4096);
	tl_send_pat(srv, 0, ECHO_BYTES, 9, 4096);
	tl_recv_pat(cli, 0, ECHO_BYTES, 9, 4096);
	struct epoll_event out;
	ev.events = EPOLLIN | EPOLLOUT;
	SYS(epoll_ctl(ep, EPOLL_CTL_MOD, cli, &ev));
	CHECK_EQ(epoll_wait(ep, &out, 1, 0), 1);   /* writable, nothing to read */
	CHECK_EQ(out.events, (uint32_t)EPOLLOUT);
	CHECK_EQ(out.data.fd, cli);
	SYS(close(ep));
	SYS(close(cli));
	SYS(close(srv));
	return 0;
}
