/*
 * Handing a connection back to TCP while asynchronous sends are unread:
 * the receiving process passes its socket to another process with
 * SCM_RIGHTS (or execs with it) while the sender's last four sends are
 * still only advertised - the sender waits in recv() for the answer and so
 * takes part in the hand-back, which re-sends the unread bytes on TCP from
 * the sender's protected buffers. The new holder reads every byte once, in
 * order, and answers; the sender's buffers are its own again. Both fault
 * policies.
 */
#include "azlib.h"

#define SZ (MiB / 4)
static int unix_sp[2];

static void reader(int s)
{
	uint8_t *r = az_buf(SZ, 0);
	for (uint64_t k = 0; k < 4; k++)
		az_recv_round(s, r, SZ, k);
	char ok = 'k';
	tl_send_all(s, &ok, 1);
	close(s);
}

static void rx(int s, void *arg)
{
	const char *how = arg;
	az_gate_wait(0);                          /* all four are advertised */
	if (!strcmp(how, "exec")) {
		char fd[16];
		snprintf(fd, sizeof fd, "%d", s);
		execl("/proc/self/exe", "t_az_handback", "--reader", fd, (char *)NULL);
		TL_FAIL("exec");
	}
	char dummy = 'x';
	struct iovec v = { &dummy, 1 };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof cbuf };
	struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
	cm->cmsg_level = SOL_SOCKET;
	cm->cmsg_type = SCM_RIGHTS;
	cm->cmsg_len = CMSG_LEN(sizeof(int));
	memcpy(CMSG_DATA(cm), &s, sizeof s);
	CHECK_EQ(sendmsg(unix_sp[0], &m, 0), 1);
	close(s);
}

static void holder(void)
{
	char dummy;
	struct iovec v = { &dummy, 1 };
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct msghdr m = { .msg_iov = &v, .msg_iovlen = 1, .msg_control = cbuf,
			    .msg_controllen = sizeof cbuf };
	CHECK_EQ(recvmsg(unix_sp[1], &m, 0), 1);
	int s;
	memcpy(&s, CMSG_DATA(CMSG_FIRSTHDR(&m)), sizeof s);
	reader(s);
}

static int scenario(const char *how)
{
	CHECK_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, unix_sp), 0);
	pid_t h = fork();                         /* holds nothing of the connection */
	CHECK(h >= 0);
	if (h == 0) {
		tl_watchdog(100);
		if (!strcmp(how, "scm"))
			holder();
		_exit(0);
	}
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx, (void *)how, &pid);
	uint8_t *b[4];
	for (uint64_t k = 0; k < 4; k++) {
		b[k] = az_buf(SZ, (k * 1000) % 4096);
		az_fill(b[k], SZ, k);
		tl_send_all(c, b[k], SZ);
	}
	struct azst a = az_get(c);
	if (tl_sdp_mode())
		CHECK(a.tx > 0, "not asynchronous");
	az_gate_pass(0);
	char ok;
	tl_recv_all(c, &ok, 1);                   /* meanwhile: the hand-back */
	CHECK_EQ(ok, 'k');
	for (int k = 0; k < 4; k++)
		memset(b[k], 0xEE, SZ);
	az_reap(pid, "receiver");
	az_reap(h, "holder");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--reader")) {
		tl_watchdog(60);
		reader(atoi(argv[2]));
		return 0;
	}
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario(argv[2]);
	tl_watchdog(120);
	const char *names[] = { "scm", "exec" };
	az_run_all(argv, names, 2, NULL);
	return 0;
}
