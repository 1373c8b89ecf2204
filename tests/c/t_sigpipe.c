/*
 * SIGPIPE / EPIPE / MSG_NOSIGNAL. After our own shutdown(SHUT_WR) a send is
 * EPIPE and raises SIGPIPE unless MSG_NOSIGNAL. After the peer closed (no
 * unread data), kernel TCP accepts the first send (it cannot know the peer
 * will not read), the peer answers with a reset and every later send is
 * EPIPE + SIGPIPE; reads keep returning EOF. The default SIGPIPE action
 * kills the process.
 */
#include "testlib.h"

static volatile sig_atomic_t pipes;
static void on_pipe(int sig) { (void)sig; pipes++; }

int main(void)
{
	int c, s;
	char buf[64];

	tl_watchdog(10);
	struct sigaction sa = { .sa_handler = on_pipe };
	SYS(sigaction(SIGPIPE, &sa, NULL));

	/* Own shutdown(SHUT_WR). */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(shutdown(c, SHUT_WR));
	CHECK_ERR(send(c, "a", 1, 0), EPIPE);
	CHECK_EQ(pipes, 1);
	CHECK_ERR(send(c, "a", 1, MSG_NOSIGNAL), EPIPE);
	CHECK_EQ(pipes, 1);
	CHECK_ERR(write(c, "a", 1), EPIPE);
	CHECK_EQ(pipes, 2);
	struct iovec iov = { "a", 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1 };
	CHECK_ERR(sendmsg(c, &mh, MSG_NOSIGNAL), EPIPE);
	CHECK_EQ(pipes, 2);
	CHECK_ERR(sendmsg(c, &mh, 0), EPIPE);
	CHECK_EQ(pipes, 3);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(c));
	SYS(close(s));

	/* Peer closed with nothing unread. */
	pipes = 0;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 3);
	SYS(close(s));
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_EQ(send(c, "1", 1, MSG_NOSIGNAL), 1);
	CHECK_EQ(pipes, 0);
	CHECK_ERR(send(c, "2", 1, MSG_NOSIGNAL), EPIPE);
	CHECK_EQ(pipes, 0);
	CHECK_ERR(send(c, "3", 1, 0), EPIPE);
	CHECK_EQ(pipes, 1);
	CHECK_EQ(recv(c, buf, sizeof buf, 0), 0);
	CHECK_ERR(write(c, "4", 1), EPIPE);
	CHECK_EQ(pipes, 2);
	SYS(close(c));

	/* Same, peer gone before we even read its EOF; signal delivered to
	 * the default action kills a child. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(close(s));
	pid_t pid = tl_fork();
	if (pid == 0) {
		signal(SIGPIPE, SIG_DFL);
		CHECK_EQ(send(c, "1", 1, 0), 1);
		send(c, "2", 1, 0);
		_exit(42);	/* not reached: SIGPIPE */
	}
	int st;
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGPIPE,
	      "child status 0x%x, expected death by SIGPIPE", st);
	CHECK_ERR(send(c, "3", 1, MSG_NOSIGNAL), EPIPE);
	SYS(close(c));
	return 0;
}
