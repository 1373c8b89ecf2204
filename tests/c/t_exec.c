/*
 * exec() with a connected socket: the child re-executes this program with
 * the descriptor number as an argument and keeps using the inherited
 * stream (both directions, byte-exact); a socket marked close-on-exec is
 * really closed by the exec (EBADF in the new image, and its peer sees EOF
 * once the parent's copy is closed too).
 */
#include "testlib.h"

#define SEED 61
#define N (1u << 20)

static int child_main(int fd, int cloexec_fd)
{
	tl_watchdog(20);
	/* The close-on-exec socket is gone. */
	CHECK_ERR(fcntl(cloexec_fd, F_GETFD), EBADF);
	/* The inherited one is the same connected stream socket. */
	int type = 0;
	socklen_t len = sizeof type;
	SYS(getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &len));
	CHECK_EQ(type, SOCK_STREAM);
	CHECK_EQ(fcntl(fd, F_GETFD), 0);
	/* Across exec the socket either stays on SDP or is handed back to
	 * plain TCP first; under kernel TCP it must be plain TCP. */
	int on_sdp = -1;
	len = sizeof on_sdp;
	int r = getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &on_sdp, &len);
	if (tl_sdp_mode())
		CHECK(r == 0 && (on_sdp == 0 || on_sdp == 1), "SDP_TRANSPORT %d/%d", r, on_sdp);
	else
		{ CHECK_EQ(r, -1); CHECK_EQ(errno, ENOPROTOOPT); }
	char hello[6];
	CHECK_EQ(recv(fd, hello, 6, MSG_WAITALL), 6);
	CHECK(memcmp(hello, "before", 6) == 0);
	tl_recv_pat(fd, 0, N, SEED, 65536);
	tl_send_pat(fd, 0, N, SEED + 1, 40000);
	if (on_sdp == 1)
		expect_bytes(fd, N, N + 6);
	SYS(shutdown(fd, SHUT_WR));
	char b;
	CHECK_EQ(recv(fd, &b, 1, 0), 0);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "child") == 0)
		return child_main(atoi(argv[2]), atoi(argv[3]));

	int c, s, x, sx;
	char buf[64];
	tl_watchdog(20);
	tl_pair(AF_INET, &c, &s);
	tl_pair(AF_INET, &x, &sx);
	expect_transport(c);
	expect_transport(s);
	expect_transport(x);
	SYS(fcntl(x, F_SETFD, FD_CLOEXEC));
	/* Data queued before the exec is read by the new image. */
	CHECK_EQ(send(s, "before", 6, 0), 6);

	pid_t pid = tl_fork();
	if (pid == 0) {
		char a1[16], a2[16];
		snprintf(a1, sizeof a1, "%d", c);
		snprintf(a2, sizeof a2, "%d", x);
		SYS(close(s));
		SYS(close(sx));
		execl("/proc/self/exe", argv[0], "child", a1, a2, (char *)NULL);
		TL_FAIL("execl");
	}
	SYS(close(c));
	SYS(close(x));
	tl_send_pat(s, 0, N, SEED, 32768);
	tl_recv_pat(s, 0, N, SEED + 1, 65536);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(shutdown(s, SHUT_WR));
	tl_wait_ok(pid);
	/* Counters only exist while the connection is on SDP. */
	int still = 0;
	socklen_t sl = sizeof still;
	if (tl_sdp_mode() && getsockopt(s, SOL_TCP, SDP_TRANSPORT, &still, &sl) == 0 && still)
		expect_bytes(s, N + 6, N);
	SYS(close(s));
	/* Closed by exec in the child, by us in the parent: EOF. */
	CHECK_EQ(recv(sx, buf, sizeof buf, 0), 0);
	SYS(close(sx));
	return 0;
}
