/*
 * One byte written to the kernel TCP socket outside the library (here a
 * raw sendto system call; io_uring or a hostile peer would do the same)
 * while the other end waits in recv(), poll() or epoll_wait().
 *
 * Kernel TCP: the byte is data; the waiter gets it.
 * SDP: the stream travels in shared memory, and the TCP socket carries only
 * counted wake-up tokens; a byte that is not one has no place in the
 * stream. The waiter's connection is reset (ECONNRESET, logged), and so is
 * the writer's. Either way the waiter must not burn CPU: its CPU time
 * while it waits (at most 3 s) is measured and must stay far below the
 * wall time (a spin detector with generous bounds, not a speed test).
 */
#include "testlib.h"

#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>

enum mode { M_RECV, M_POLL, M_EPOLL };
static const char *mode_name[] = { "recv", "poll", "epoll_wait" };

/* The waiter: report ready, wait the mode's way, then read. */
static void waiter(int fd, enum mode m, int ready)
{
	CHECK_EQ(write(ready, "r", 1), 1);
	if (m == M_POLL) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		CHECK_EQ(poll(&p, 1, 10000), 1);
		CHECK(p.revents & POLLIN, "revents 0x%x", p.revents);
		if (tl_sdp_mode())
			CHECK(p.revents & POLLERR, "revents 0x%x", p.revents);
	} else if (m == M_EPOLL) {
		int ep = SYS(epoll_create1(0));
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
		struct epoll_event out;
		CHECK_EQ(epoll_wait(ep, &out, 1, 10000), 1);
		CHECK_EQ(out.data.fd, fd);
		CHECK(out.events & EPOLLIN, "events 0x%x", out.events);
		if (tl_sdp_mode())
			CHECK(out.events & EPOLLERR, "events 0x%x", out.events);
		SYS(close(ep));
	}
	char b[8];
	if (tl_sdp_mode()) {
		CHECK_ERR(recv(fd, b, sizeof b, 0), ECONNRESET);
		CHECK_EQ(recv(fd, b, sizeof b, 0), 0);
	} else {
		CHECK_EQ(recv(fd, b, sizeof b, 0), 1);
		CHECK_EQ(b[0], 'X');
	}
	_exit(0);
}

/* CPU seconds (user + system) process pid has used so far. */
static double cpu_of(pid_t pid)
{
	char path[64], buf[1024];
	snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
	int f = open(path, O_RDONLY);
	if (f < 0)
		return -1;
	ssize_t n = read(f, buf, sizeof buf - 1);
	close(f);
	if (n <= 0)
		return -1;
	buf[n] = 0;
	char *p = strrchr(buf, ')');
	unsigned long ut = 0, st = 0;
	/* fields after the command: state ppid ... utime(14) stime(15) */
	if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu",
			 &ut, &st) != 2)
		return -1;
	return (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
}

static void one(enum mode m)
{
	int c, s, pr[2];
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(pipe(pr));
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(s));
		SYS(close(pr[0]));
		waiter(c, m, pr[1]);
	}
	SYS(close(c));
	SYS(close(pr[1]));
	char r;
	CHECK_EQ(read(pr[0], &r, 1), 1);
	SYS(close(pr[0]));
	/* Past the library: straight to the kernel socket. */
	CHECK_EQ(syscall(SYS_sendto, s, "X", 1, MSG_NOSIGNAL, NULL, 0), 1);

	int pfd = (int)syscall(SYS_pidfd_open, pid, 0);
	if (pfd < 0)
		SKIP("pidfd_open: %s", strerror(errno));
	struct pollfd p = { .fd = pfd, .events = POLLIN };
	double t0 = tl_now();
	int done = poll(&p, 1, 3000);
	double wall = tl_now() - t0;
	if (done != 1) {
		double cpu = cpu_of(pid);
		kill(pid, SIGKILL);
		waitpid(pid, NULL, 0);
		TL_FAIL("%s: the waiter neither got the byte nor a reset in %.1f s, "
			"and used %.2f s of CPU meanwhile", mode_name[m], wall, cpu);
	}
	int st;
	struct rusage ru;
	CHECK_EQ(wait4(pid, &st, 0, &ru), pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: waiter status 0x%x",
	      mode_name[m], st);
	double cpu = (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 +
		     (double)ru.ru_stime.tv_sec + ru.ru_stime.tv_usec / 1e6;
	printf("%-10s waiter done after %.3f s, %.3f s CPU\n", mode_name[m], wall, cpu);
	CHECK(cpu < 0.5, "%s: the waiter used %.2f s of CPU", mode_name[m], cpu);
	char b[8];
	if (tl_sdp_mode()) {
		/* The writer's end is reset too: it sent something that is
		 * not SDP on an SDP connection. */
		CHECK_ERR(recv(s, b, sizeof b, 0), ECONNRESET);
	} else {
		CHECK_EQ(recv(s, b, sizeof b, 0), 0);
	}
	SYS(close(s));
}

int main(void)
{
	tl_watchdog(30);
	one(M_RECV);
	one(M_POLL);
	one(M_EPOLL);
	return 0;
}
