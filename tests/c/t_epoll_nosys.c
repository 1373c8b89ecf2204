/*
 * epoll where the kernel has no epoll_pwait2 (Linux before 5.11, valgrind,
 * seccomp profiles that answer ENOSYS): epoll_wait and epoll_pwait keep
 * working, on a set holding only a pipe and on sets with an SDP socket
 * (timeouts, readiness, a wake-up while asleep); the application's own
 * epoll_pwait2 fails with ENOSYS as the kernel says.
 *
 * The filter goes in with a system call instruction of our own, so the
 * library cannot tell it from a kernel that lacks the call (a filter it
 * sees would make it leave the connections to TCP, t_seccomp.c).
 */
#include "seccomplib.h"
#include <pthread.h>
#include <sys/epoll.h>

static int g_fd;
static void *late_send(void *arg)
{
	(void)arg;
	tl_idle_ms(50);
	CHECK_EQ(send(g_fd, "w", 1, 0), 1);
	return NULL;
}

static void add(int ep, int fd, uint32_t events, uint64_t data)
{
	struct epoll_event ev = { .events = events, .data.u64 = data };
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
}

int main(void)
{
	int c, s, p[2];
	char buf[64];
	struct epoll_event out[4];
	pthread_t th;
	tl_watchdog(15);
	tl_pair(AF_INET, &c, &s);
	SYS(pipe(p));
	expect_transport(c);
	expect_transport(s);

	static struct sc_filter f;
	static const struct sc_rule no_pwait2[] = {
		{ __NR_epoll_pwait2, SECCOMP_RET_ERRNO | ENOSYS },
	};
	sc_build(&f, no_pwait2, 1, SECCOMP_RET_ALLOW);
	sc_install_raw(&f);

	/* Only a pipe. */
	int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
	add(ep, p[0], EPOLLIN, 7);
	CHECK_EQ(epoll_wait(ep, out, 4, 0), 0);
	CHECK_EQ(epoll_wait(ep, out, 4, 10), 0);
	CHECK_EQ(write(p[1], "x", 1), 1);
	CHECK_EQ(epoll_wait(ep, out, 4, -1), 1);
	CHECK_EQ(out[0].data.u64, 7);
	CHECK_EQ(out[0].events, EPOLLIN);
	CHECK_EQ(epoll_pwait(ep, out, 4, 1000, NULL), 1);
	struct timespec zero = { 0, 0 };
	CHECK_ERR(epoll_pwait2(ep, out, 4, &zero, NULL), ENOSYS);
	CHECK_EQ(read(p[0], buf, 1), 1);

	/* An SDP socket and the pipe. */
	int ep2 = SYS(epoll_create1(EPOLL_CLOEXEC));
	add(ep2, s, EPOLLIN, 1);
	add(ep2, p[0], EPOLLIN, 2);
	CHECK_EQ(epoll_wait(ep2, out, 4, 0), 0);
	CHECK_EQ(epoll_wait(ep2, out, 4, 20), 0);  /* sleeps, times out */
	CHECK_EQ(epoll_pwait(ep2, out, 4, 0, NULL), 0);
	tl_send_all(c, "abc", 3);
	CHECK_EQ(epoll_wait(ep2, out, 4, -1), 1);
	CHECK_EQ(out[0].data.u64, 1);
	CHECK_EQ(out[0].events, EPOLLIN);
	tl_recv_all(s, buf, 3);
	CHECK(memcmp(buf, "abc", 3) == 0);
	/* Woken while asleep in the kernel. */
	g_fd = c;
	CHECK_EQ(pthread_create(&th, NULL, late_send, NULL), 0);
	CHECK_EQ(epoll_pwait(ep2, out, 4, -1, NULL), 1);
	CHECK_EQ(out[0].data.u64, 1);
	CHECK_EQ(pthread_join(th, NULL), 0);
	tl_recv_all(s, buf, 1);
	CHECK_EQ(write(p[1], "y", 1), 1);
	CHECK_EQ(epoll_wait(ep2, out, 4, 5000), 1);
	CHECK_EQ(out[0].data.u64, 2);
	CHECK_EQ(read(p[0], buf, 1), 1);

	/* Writable and edge-triggered. */
	int ep3 = SYS(epoll_create1(EPOLL_CLOEXEC));
	add(ep3, c, EPOLLOUT | EPOLLET, 3);
	CHECK_EQ(epoll_wait(ep3, out, 4, 1000), 1);
	CHECK_EQ(out[0].events, EPOLLOUT);
	CHECK_EQ(epoll_wait(ep3, out, 4, 0), 0);

	expect_transport(c);
	expect_transport(s);
	SYS(close(ep));
	SYS(close(ep2));
	SYS(close(ep3));
	SYS(close(c));
	SYS(close(s));
	return 0;
}
