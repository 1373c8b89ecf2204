/*
 * One thread blocked in recv() on a socket while another shuts it down and
 * closes it - how thread-per-connection servers stop a reader - and at once
 * opens new connections that may take the same descriptor number and the
 * library's connection slot.
 *
 * Kernel TCP: the blocked recv() returns 0 (the shutdown), and whatever the
 * new connections carry is theirs alone. The library must give the same:
 * the reader's call may still be inside the closed connection's state when
 * the close releases it, and must neither read the new connection's bytes
 * nor crash. 200 rounds.
 */
#include "testlib.h"
#include <pthread.h>
#include <stdatomic.h>
#include <fcntl.h>
#include <sys/syscall.h>

#define ROUNDS 200
#define BYTES 4096

struct rd {
	int fd;
	_Atomic int started;
	_Atomic pid_t tid;
	ssize_t r;
	int err;
	char buf[BYTES];
};

static void *reader(void *arg)
{
	struct rd *x = arg;
	atomic_store(&x->tid, (pid_t)syscall(SYS_gettid));
	atomic_store(&x->started, 1);
	x->r = recv(x->fd, x->buf, sizeof x->buf, 0);
	x->err = errno;
	return NULL;
}

/* The thread asleep (state S: blocked inside its recv)? */
static bool asleep(pid_t tid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	int f = open(path, O_RDONLY | O_CLOEXEC);
	if (f < 0)
		return false;
	ssize_t n = read(f, buf, sizeof buf - 1);
	close(f);
	if (n <= 0)
		return false;
	buf[n] = 0;
	const char *p = strrchr(buf, ')');
	return p && p[1] == ' ' && p[2] == 'S';
}

int main(void)
{
	tl_watchdog(60);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	static char buf[BYTES];
	for (int round = 0; round < ROUNDS; round++) {
		int c = tl_connect(AF_INET, port);
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		struct rd x = { .fd = s, .started = 0 };
		pthread_t t;
		CHECK_EQ(pthread_create(&t, NULL, reader, &x), 0);
		while (!atomic_load(&x.started))
			sched_yield();
		/* Odd rounds: the reader is asleep inside recv(), and new
		 * connections follow the close at once (they would take s's
		 * number and slot). Even rounds: it may still be on its way in
		 * or spinning, and nothing takes the number before it returns
		 * (a recv on a closed number is the kernel's EBADF). */
		bool odd = round & 1;
		while (odd && !asleep(atomic_load(&x.tid)))
			sched_yield();
		SYS(shutdown(s, SHUT_RDWR));
		SYS(close(s));
		if (!odd)
			CHECK_EQ(pthread_join(t, NULL), 0);
		int c2 = tl_connect(AF_INET, port);
		int s2 = SYS(accept(l, NULL, NULL));
		tl_fill(buf, sizeof buf, 0, 1000 + (uint32_t)round);
		tl_send_all(c2, buf, sizeof buf);
		if (odd)
			CHECK_EQ(pthread_join(t, NULL), 0);
		/* TCP: 0 (shut down); a number closed before the call began
		 * gives EBADF - never another connection's bytes. */
		CHECK(x.r == 0 || (x.r < 0 && x.err == EBADF), "round %d: recv -> %zd (%s)",
		      round, x.r, x.r < 0 ? strerror(x.err) : "bytes of another connection");
		static char got[BYTES];
		tl_recv_all(s2, got, sizeof got);
		CHECK_PAT(got, sizeof got, 0, 1000 + (uint32_t)round);
		SYS(close(c));
		SYS(close(c2));
		SYS(close(s2));
	}
	SYS(close(l));
	return 0;
}
