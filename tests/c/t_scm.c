/*
 * Passing connected stream sockets with SCM_RIGHTS to another process over
 * an AF_UNIX socketpair: the receiving process carries on the stream where
 * the sender left off, in both directions, including data that was already
 * queued (unread) on the passed socket. The sender closes its copy; nothing
 * is lost, duplicated or reordered.
 */
#include "testlib.h"

#define SEED 81

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

/* A passed socket may stay on SDP or be handed to the receiver as plain
 * TCP first (it travels to a process that may not run the switch). */
static int passed_transport(int fd)
{
	int v = -1;
	socklen_t l = sizeof v;
	int r = getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &l);
	if (!tl_sdp_mode()) {
		CHECK_EQ(r, -1);
		CHECK_EQ(errno, ENOPROTOOPT);
		return 0;
	}
	CHECK(r == 0 && (v == 0 || v == 1), "SDP_TRANSPORT %d/%d", r, v);
	return v;
}

static int recv_fd(int u)
{
	char ctl[CMSG_SPACE(sizeof(int))], b;
	struct iovec iov = { &b, 1 };
	struct msghdr mh = { .msg_iov = &iov, .msg_iovlen = 1,
			     .msg_control = ctl, .msg_controllen = sizeof ctl };
	CHECK_EQ(recvmsg(u, &mh, MSG_CMSG_CLOEXEC), 1);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	CHECK(cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof fd);
	CHECK_EQ(fcntl(fd, F_GETFD), FD_CLOEXEC);
	return fd;
}

int main(void)
{
	int c, s, u[2];
	char buf[64];

	tl_watchdog(20);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, u));

	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(u[0]));
		SYS(close(c));
		SYS(close(s));
		/* 1: the client end, mid-stream in both directions. */
		int fc = recv_fd(u[1]);
		int fc_sdp = passed_transport(fc);
		tl_recv_pat(fc, 100000, 200000, SEED + 1, 65536);
		tl_send_pat(fc, 300000, 300000, SEED, 65536);
		if (fc_sdp)
			expect_bytes(fc, 600000, 300000);
		SYS(close(fc));
		/* 2: the server end of a second connection, with 50000
		 * bytes queued unread on it. */
		int fs = recv_fd(u[1]);
		passed_transport(fs);
		tl_recv_pat(fs, 0, 150000, SEED + 2, 7777);
		CHECK_EQ(recv(fs, buf, sizeof buf, 0), 0);
		SYS(close(fs));
		_exit(0);
	}
	SYS(close(u[1]));

	/* Some traffic first, then hand over the client end. */
	tl_send_pat(c, 0, 300000, SEED, 65536);
	tl_recv_pat(s, 0, 300000, SEED, 65536);
	tl_send_pat(s, 0, 100000, SEED + 1, 65536);
	tl_recv_pat(c, 0, 100000, SEED + 1, 65536);
	send_fd(u[0], c);
	SYS(close(c));
	tl_send_pat(s, 100000, 200000, SEED + 1, 65536);
	tl_recv_pat(s, 300000, 300000, SEED, 65536);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	int still = 0;
	socklen_t sl = sizeof still;
	if (tl_sdp_mode() && getsockopt(s, SOL_TCP, SDP_TRANSPORT, &still, &sl) == 0 && still)
		expect_bytes(s, 300000, 600000);
	SYS(close(s));

	/* Second connection: pass the receiving end with data queued. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	tl_send_pat(c, 0, 50000, SEED + 2, 65536);
	send_fd(u[0], s);
	SYS(close(s));
	tl_send_pat(c, 50000, 100000, SEED + 2, 65536);
	SYS(close(c));
	tl_wait_ok(pid);
	SYS(close(u[0]));
	return 0;
}
