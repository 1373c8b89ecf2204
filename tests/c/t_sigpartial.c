/*
 * A signal ends a blocking call that already moved bytes, with the partial
 * count, even when the handler has SA_RESTART - as TCP does - also when
 * another thread of the process is blocked on the same socket at the same
 * time (so this one is not the thread watching the socket under SDP).
 *
 * The peer sends 1000 bytes and then reads nothing; a second thread
 * blocks in a 64 MiB send on the same socket (the peer is not reading),
 * then the main thread calls recv(4000, MSG_WAITALL) with a SIGALRM
 * handler (SA_RESTART) and a 100 ms timer: recv must return 1000.
 * (SIGUSR1 from a timer: SIGALRM belongs to the test's watchdog.)
 */
#include "testlib.h"
#include <pthread.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <time.h>

#define BIG (64u << 20)

static int c;
static _Atomic pid_t sender_tid;
static volatile sig_atomic_t alarms;

static void on_sig(int sig) { (void)sig; alarms++; }

static void *sender(void *arg)
{
	(void)arg;
	sigset_t m;
	sigemptyset(&m);
	sigaddset(&m, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &m, NULL);   /* the signal is for main */
	atomic_store(&sender_tid, (pid_t)syscall(SYS_gettid));
	char *buf = calloc(1, BIG);
	CHECK(buf != NULL);
	size_t off = 0;
	while (off < BIG) {
		ssize_t n = send(c, buf + off, BIG - off, MSG_NOSIGNAL);
		if (n < 0)
			break;                    /* the peer closed at the end */
		off += (size_t)n;
	}
	free(buf);
	return NULL;
}

/* State letter of a thread of ours ('S' = sleeping in the kernel). */
static char thread_state(pid_t tid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "re");
	if (!f)
		return '?';
	char st = '?';
	if (fgets(line, sizeof line, f)) {
		char *p = strrchr(line, ')');
		if (p && p[1] == ' ')
			st = p[2];
	}
	fclose(f);
	return st;
}

int main(void)
{
	tl_watchdog(20);
	uint16_t port;
	int go[2], l;
	SYS(pipe(go));
	pid_t peer = tl_fork_listener(&port, &l);
	if (peer == 0) {
		SYS(close(go[1]));
		int s = SYS(accept(l, NULL, NULL));
		char first[1000];
		memset(first, 'p', sizeof first);
		tl_send_all(s, first, sizeof first);
		char b;
		CHECK_EQ(read(go[0], &b, 1), 1);       /* then drain and leave */
		static char sink[1 << 16];
		while (recv(s, sink, sizeof sink, 0) > 0)
			;
		_exit(0);
	}
	SYS(close(go[0]));
	c = tl_connect(AF_INET, port);
	expect_transport(c);
	if (tl_sdp_mode()) {
		/* Buffer Copy: the send fills the ring, then sleeps for credits
		 * (the thread watching the socket) and stays asleep. */
		int zero = 0;
		SYS(setsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &zero, sizeof zero));
	}
	struct pollfd p = { .fd = c, .events = POLLIN };
	CHECK_EQ(poll(&p, 1, 5000), 1);               /* the 1000 bytes are here */

	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, sender, NULL), 0);
	/* Wait until the sender sleeps in the kernel: its send is blocked. */
	double t0 = tl_now();
	while (!atomic_load(&sender_tid) || thread_state(atomic_load(&sender_tid)) != 'S') {
		CHECK(tl_now() - t0 < 5, "the sending thread never blocked");
		sched_yield();
	}

	struct sigaction sa = { .sa_handler = on_sig, .sa_flags = SA_RESTART };
	sigemptyset(&sa.sa_mask);
	SYS(sigaction(SIGUSR1, &sa, NULL));
	struct sigevent sev = { .sigev_notify = SIGEV_THREAD_ID,
				.sigev_signo = SIGUSR1 };
	sev._sigev_un._tid = (pid_t)syscall(SYS_gettid);   /* this thread */
	timer_t tm;
	SYS(timer_create(CLOCK_MONOTONIC, &sev, &tm));
	struct itimerspec its = { .it_value = { 0, 100000000 } };
	SYS(timer_settime(tm, 0, &its, NULL));
	char in[4000];
	ssize_t n = recv(c, in, sizeof in, MSG_WAITALL);
	CHECK(alarms == 1, "%d alarms", (int)alarms);
	CHECK(n == 1000, "recv(MSG_WAITALL) interrupted under SA_RESTART after "
	      "1000 bytes returned %zd (errno %d)", n, n < 0 ? errno : 0);
	for (int i = 0; i < 1000; i++)
		CHECK(in[i] == 'p', "byte %d", i);

	CHECK_EQ(write(go[1], "g", 1), 1);
	SYS(shutdown(c, SHUT_WR));
	CHECK_EQ(pthread_join(th, NULL), 0);
	SYS(close(c));
	tl_wait_ok(peer);
	return 0;
}
