/*
 * The hand-back to TCP, repeated: a server accepts, forks, and its child
 * dup2()s the connection to fds 0 and 1 and execs
 * `/bin/sh -c 'head -c 2; echo hello'`, while the client (a process of its
 * own) sends "ab" and blocks in recv() until EOF. The client must read
 * exactly "abhello\n" every time: the exec hands the connection back to
 * TCP while the client sleeps in recv(), which must then wake up, follow,
 * and read the rest from the kernel. Then the same with SCM_RIGHTS: the
 * server passes the connection to a helper process, which echoes the two
 * bytes and writes "hello\n". Each run has a deadline (SO_RCVTIMEO on the
 * client), so a lost wake-up fails the run instead of hanging the test.
 */
#include "testlib.h"

#define RUNS_EXEC 200
#define RUNS_SCM 200

static void send_fd(int u, int fd)
{
	char ctl[CMSG_SPACE(sizeof(int))];
	memset(ctl, 0, sizeof ctl);
	struct iovec iov = { "F", 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = ctl, .msg_controllen = sizeof ctl };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &fd, sizeof fd);
	CHECK_EQ(sendmsg(u, &mh, 0), 1);
}

static int recv_fd(int u)
{
	char ctl[CMSG_SPACE(sizeof(int))], b;
	struct iovec iov = { &b, 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = ctl, .msg_controllen = sizeof ctl };
	ssize_t n = recvmsg(u, &mh, 0);
	if (n == 0)
		return -1;                    /* the server is done */
	CHECK_EQ(n, 1);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	CHECK(cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof fd);
	return fd;
}

/* The client: its own process, so that the hand-back has a real peer that
 * sleeps in recv(). Sends "ab", expects `want` then EOF within 10 s. */
static pid_t client(int l, uint16_t port, int run, const char *want)
{
	pid_t pid = tl_fork();
	if (pid)
		return pid;
	SYS(close(l));
	int fd = tl_connect(AF_INET, port);
	expect_transport(fd);
	struct timeval tv = { 10, 0 };
	SYS(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	tl_send_all(fd, "ab", 2);
	char buf[64];
	size_t got = 0, len = strlen(want);
	for (;;) {
		ssize_t n = recv(fd, buf + got, sizeof buf - got, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			TL_FAIL("run %d: no answer after 10 s (got %zu bytes): "
				"the hand-back lost a wake-up", run, got);
		CHECK(n >= 0, "run %d", run);
		if (n == 0)
			break;
		got += (size_t)n;
		CHECK(got <= len, "run %d: %zu bytes, more than expected", run, got);
	}
	CHECK(got == len && memcmp(buf, want, len) == 0,
	      "run %d: got %zu bytes \"%.*s\", expected \"%s\"", run, got,
	      (int)got, buf, want);
	_exit(0);
}

static void exec_runs(int l, uint16_t port)
{
	for (int run = 0; run < RUNS_EXEC; run++) {
		pid_t cl = client(l, port, run, "abhello\n");
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		pid_t ch = tl_fork();
		if (ch == 0) {
			SYS(dup2(s, 0));
			SYS(dup2(s, 1));
			SYS(close(s));
			SYS(close(l));
			execl("/bin/sh", "sh", "-c", "head -c 2; echo hello",
			      (char *)NULL);
			TL_FAIL("execl /bin/sh");
		}
		SYS(close(s));
		tl_wait_ok(ch);
		tl_wait_ok(cl);
	}
}

/* A helper that takes connections over u and answers each like the
 * exec'd shell does. */
static void helper(int u)
{
	for (;;) {
		int fd = recv_fd(u);
		if (fd < 0)
			_exit(0);
		char ab[2];
		tl_recv_all(fd, ab, 2);
		tl_send_all(fd, ab, 2);
		tl_send_all(fd, "hello\n", 6);
		SYS(close(fd));
	}
}

static void scm_runs(int l, uint16_t port)
{
	int u[2];
	SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, u));
	pid_t h = tl_fork();
	if (h == 0) {
		SYS(close(u[0]));
		SYS(close(l));
		helper(u[1]);
	}
	SYS(close(u[1]));
	for (int run = 0; run < RUNS_SCM; run++) {
		pid_t cl = client(l, port, run, "abhello\n");
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		send_fd(u[0], s);
		SYS(close(s));
		tl_wait_ok(cl);
	}
	SYS(close(u[0]));
	tl_wait_ok(h);
}

int main(void)
{
	tl_watchdog(120);
	if (access("/bin/sh", X_OK) != 0)
		SKIP("no /bin/sh");
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	double t0 = tl_now();
	exec_runs(l, port);
	double t1 = tl_now();
	scm_runs(l, port);
	printf("%d exec hand-backs in %.2f s, %d SCM_RIGHTS hand-backs in %.2f s\n",
	       RUNS_EXEC, t1 - t0, RUNS_SCM, tl_now() - t1);
	SYS(close(l));
	return 0;
}
