/*
 * A readiness queue's link entry must not be dropped or filled again for
 * another peer process while an epoll set still uses the queue.
 *
 * This process connects to server processes, one after the other, each a
 * child that echoes one connection and exits. First 256 of them (the
 * links one process keeps, shm_link.c SHM_LINKS) without epoll, so that
 * every later new peer process takes the entry of a gone one; then a few
 * rounds in which a thread sleeps in epoll_wait over the connection to
 * the current server, and:
 *   - once the waiter is asleep (the queue of that connection's link
 *     counted as slept on), the connection is closed and its server
 *     reaped: nothing of this process names the link any more but the
 *     sleeper;
 *   - the waiter is woken (an eventfd in the set), and while it is
 *     between its wake-up and its count off that queue, the next server
 *     is connected to - which needs a link entry, and the lowest gone one
 *     is the entry the sleeper is about to count itself off.
 * Under SDP the harness sets SDP_TEST_QUEUE_DELAY_US: the library then
 * sleeps between a queue's check and its use, and aborts if the entry was
 * dropped or filled again meanwhile. Before epoll sets and sleepers held
 * the entry it was, at the first such round: the connect unmapped the
 * page and gave the entry to the new link, whose page came at the same
 * address, and the sleeper's count off went to that link (its sleepers
 * word 0 -> 4294967295). The main thread sees the waiter inside that
 * delay through /proc (blocked in a nanosleep), so the connect lands in
 * the window every round. Without the delay the window is a few
 * instructions: the program cannot fail then. Every echo is checked, and
 * the sockets must be on SDP.
 */
#include "testlib.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/syscall.h>

#define FILL   256        /* links one process keeps (shm_link.c) */
#define BATCH  16         /* fill servers at a time */
#define ROUNDS 6          /* rounds with the epoll waiter */

static int ep, evfd, done_w;
static _Atomic pid_t waiter_tid;
static _Atomic uint64_t expect_echo;   /* what the next echo must be */
static _Atomic uint32_t returns;       /* the waiter's epoll_wait returns */
static _Atomic int quit;

static uint64_t ping_of(uint64_t i) { return 0x5a5a000000000000ull ^ i * 0x9e3779b97f4a7c15ull; }

static void ping(int fd, uint64_t i)
{
	uint64_t p = ping_of(i), e = 0;
	tl_send_all(fd, &p, sizeof p);
	tl_recv_all(fd, &e, sizeof e);
	CHECK(e == p, "echo %llu wrong", (unsigned long long)i);
}

/* The waiter: epoll_wait over the eventfd and the current connection;
 * takes each echo (non-blocking) and tells the main thread. */
static void *waiter(void *arg)
{
	(void)arg;
	atomic_store(&waiter_tid, (pid_t)syscall(SYS_gettid));
	unsigned char got[8];
	unsigned have = 0;
	for (;;) {
		struct epoll_event evs[4];
		int n = epoll_wait(ep, evs, 4, 20000);
		CHECK(n > 0, "waiter: epoll_wait -> %d (nothing in 20 s)", n);
		for (int i = 0; i < n; i++) {
			int fd = evs[i].data.fd;
			if (fd == evfd) {
				uint64_t v;
				SYS(read(evfd, &v, sizeof v));
				if (atomic_load(&quit))
					return NULL;
				continue;
			}
			ssize_t r = recv(fd, got + have, sizeof got - have, MSG_DONTWAIT);
			if (r < 0 && errno == EAGAIN)
				continue;
			CHECK(r > 0, "waiter: recv");
			have += (unsigned)r;
			if (have == sizeof got) {
				uint64_t e;
				memcpy(&e, got, sizeof e);
				CHECK(e == atomic_load(&expect_echo), "waiter: wrong echo");
				have = 0;
				char b = 1;
				SYS(write(done_w, &b, 1));
			}
		}
		atomic_fetch_add(&returns, 1);
	}
}

/* The system call the waiter is blocked in (/proc), -1 if running or not
 * in one. */
static long waiter_syscall(void)
{
	char path[64], buf[128];
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)atomic_load(&waiter_tid));
	int fd = SYS(open(path, O_RDONLY | O_CLOEXEC));
	ssize_t r = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (r <= 0)
		return -1;
	buf[r] = 0;
	if (buf[0] < '0' || buf[0] > '9')
		return -1;              /* "running", or "-1 ..." */
	return strtol(buf, NULL, 10);
}

static bool is_sleep(long nr)
{
#ifdef SYS_nanosleep
	if (nr == SYS_nanosleep)
		return true;
#endif
	return nr == SYS_clock_nanosleep;
}

/* Bounded look until cond (checked between reads of the waiter's state). */
#define WAIT_FOR(cond, what)                                                \
	do {                                                                \
		double t0_ = tl_now();                                      \
		while (!(cond)) {                                           \
			CHECK(tl_now() - t0_ < 10, "waiter never " what);   \
			sched_yield();                                      \
		}                                                           \
	} while (0)

int main(void)
{
	tl_watchdog(50);
	if (access("/proc/thread-self/syscall", R_OK) < 0)
		SKIP("no /proc/thread-self/syscall: cannot see where the waiter is");
	ep = SYS(epoll_create1(0));
	evfd = SYS(eventfd(0, EFD_CLOEXEC));
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = evfd };
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, evfd, &ev));
	int dp[2];
	SYS(pipe2(dp, O_CLOEXEC));
	done_w = dp[1];

	/* Fill this process's link table with links to gone processes. */
	uint64_t seq = 0;
	for (int b = 0; b < FILL / BATCH; b++) {
		pid_t pids[BATCH];
		uint16_t ports[BATCH];
		int fds[BATCH];
		for (int i = 0; i < BATCH; i++)
			pids[i] = tl_fork_echo_once(&ports[i]);
		for (int i = 0; i < BATCH; i++) {
			fds[i] = tl_connect(AF_INET, ports[i]);
			expect_transport(fds[i]);
		}
		for (int i = 0; i < BATCH; i++) {
			ping(fds[i], seq++);
			SYS(close(fds[i]));
		}
		for (int i = 0; i < BATCH; i++)
			tl_wait_ok(pids[i]);
	}

	pthread_t th;
	CHECK(pthread_create(&th, NULL, waiter, NULL) == 0, "pthread_create");
	WAIT_FOR(atomic_load(&waiter_tid) != 0, "started");

	/* A server is forked only while the waiter sleeps in the kernel (it
	 * holds no lock of the library then) and while no connection of
	 * ours is open (it would hold a copy). */
	WAIT_FOR(tl_task_in_epoll_wait(atomic_load(&waiter_tid)), "slept in epoll_wait");
	uint16_t port;
	pid_t next = tl_fork_echo_once(&port);
	int prev = -1;
	pid_t prev_pid = 0;
	int windows = 0;
	for (int r = 0; r < ROUNDS; r++) {
		if (prev >= 0) {
			/* Asleep with the connection's queue counted... */
			WAIT_FOR(tl_task_in_epoll_wait(atomic_load(&waiter_tid)), "slept in epoll_wait");
			/* ...then nothing but the sleeper names its link. */
			SYS(close(prev));
			tl_wait_ok(prev_pid);
			next = tl_fork_echo_once(&port);
			uint32_t ret0 = atomic_load(&returns);
			uint64_t one = 1;
			SYS(write(evfd, &one, sizeof one));
			/* The waiter woke: inside the library's delay (under
			 * SDP with SDP_TEST_QUEUE_DELAY_US), or back already. */
			bool in_delay = false;
			WAIT_FOR((in_delay = is_sleep(waiter_syscall())) ||
				 atomic_load(&returns) != ret0, "woke");
			windows += in_delay;
		}
		/* A new peer process: a link entry for it now. */
		int fd = tl_connect(AF_INET, port);
		expect_transport(fd);
		uint64_t p = ping_of(seq);
		atomic_store(&expect_echo, p);
		struct epoll_event e = { .events = EPOLLIN, .data.fd = fd };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &e));
		tl_send_all(fd, &p, sizeof p);
		char b;
		CHECK(read(dp[0], &b, 1) == 1, "the waiter's echo");
		seq++;
		prev = fd;
		prev_pid = next;
	}
	WAIT_FOR(tl_task_in_epoll_wait(atomic_load(&waiter_tid)), "slept in epoll_wait");
	SYS(close(prev));
	tl_wait_ok(prev_pid);
	/* The last server: connect, echo, done. */
	next = tl_fork_echo_once(&port);
	int fd = tl_connect(AF_INET, port);
	ping(fd, seq++);
	SYS(close(fd));
	tl_wait_ok(next);

	atomic_store(&quit, 1);
	uint64_t one = 1;
	SYS(write(evfd, &one, sizeof one));
	CHECK(pthread_join(th, NULL) == 0, "pthread_join");
	if (tl_sdp_mode() && getenv("SDP_TEST_QUEUE_DELAY_US"))
		/* (every round, unless this thread was held off the CPU
		 * for the whole delay) */
		CHECK(windows >= 1, "the connect never met the waiter's delay (%d rounds)",
		      ROUNDS - 1);
	printf("t_epoll_qreuse: %llu echoes, %d connects inside the waiter's window\n",
	       (unsigned long long)seq, windows);
	return 0;
}
