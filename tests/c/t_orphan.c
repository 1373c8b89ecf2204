/*
 * Unread bytes survive a hand-back whose peer can no longer take part.
 *
 * A client process sends 100,000 bytes that the server has not read yet,
 * then closes its socket, or is killed with SIGKILL, or (the cooperative
 * case) only shuts down its write side and waits for an answer. The server
 * then hands the connection on without reading: it forks a child that
 * dup2()s it to fd 0 and execs this program as a reader, or it passes it
 * with SCM_RIGHTS to a reader process. The reader must get all 100,000
 * bytes in order, then exactly what kernel TCP gives after them: EOF after
 * a close or a kill; ECONNRESET once, then EOF, after a kill that left the
 * server's own bytes unread in the client (TCP answers with a reset).
 */
#include "testlib.h"

#include <sys/syscall.h>

#define N 100000
#define N_BIG 1000000                 /* 62 of the 64 default ring slots */
#define SEED 23

enum how { BY_EXEC, BY_SCM };
enum peer { P_CLOSE, P_KILL, P_KILL_RESET, P_SHUT };

static const char *self;

static size_t total = N;
static bool big;                      /* N_BIG bytes, then lose CAP_NET_ADMIN */

/* Read the stream to its end; check the bytes and how it ends. */
static void reader(int fd, enum peer p)
{
	tl_watchdog(20);
	char buf[65536];
	size_t got = 0;
	for (;;) {
		ssize_t n = recv(fd, buf, sizeof buf, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && p == P_KILL_RESET && errno == ECONNRESET)
			break;
		CHECK(n >= 0, "recv after %zu bytes", got);
		if (n == 0) {
			CHECK(p != P_KILL_RESET, "EOF after %zu bytes, expected a reset",
			      got);
			break;
		}
		CHECK(got + (size_t)n <= total, "%zu bytes, more than sent",
		      got + (size_t)n);
		CHECK_PAT(buf, (size_t)n, got, SEED);
		got += (size_t)n;
	}
	CHECK_EQ(got, total);
	if (p == P_KILL_RESET)
		CHECK_EQ(recv(fd, buf, sizeof buf, 0), 0);   /* reported once */
	if (p == P_SHUT)
		tl_send_all(fd, "ok", 2);
	SYS(close(fd));
}

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
	CHECK_EQ(recvmsg(u, &mh, 0), 1);
	struct cmsghdr *cm = CMSG_FIRSTHDR(&mh);
	CHECK(cm && cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS);
	int fd;
	memcpy(&fd, CMSG_DATA(cm), sizeof fd);
	return fd;
}

/* Without CAP_NET_ADMIN (no SO_SNDBUFFORCE), as for any user: more bytes
 * than a local socket buffer holds. */
static void drop_net_admin(void)
{
	struct { uint32_t version; int pid; } hdr = { 0x20080522, 0 };
	struct { uint32_t eff, perm, inh; } data[2];
	SYS(syscall(SYS_capget, &hdr, data));
	data[0].eff &= ~(1u << 12);           /* CAP_NET_ADMIN */
	data[0].perm &= ~(1u << 12);
	SYS(syscall(SYS_capset, &hdr, data));
}

static void run(enum how how, enum peer p)
{
	tl_watchdog(30);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	/* Kernel TCP must hold the unread bytes too (the oracle run):
	 * accepted sockets inherit the listener's receive buffer. */
	int bufsz = 4 << 20;
	if (big && setsockopt(l, SOL_SOCKET, SO_RCVBUFFORCE, &bufsz, sizeof bufsz) < 0) {
		printf("no SO_RCVBUFFORCE (not root?): big case not run\n");
		return;
	}
	int sync[2], go[2], u[2];
	SYS(pipe(sync));
	SYS(pipe(go));
	SYS(socketpair(AF_UNIX, SOCK_STREAM, 0, u));
	pid_t rd = -1;
	if (how == BY_SCM) {
		rd = tl_fork();
		if (rd == 0) {
			SYS(close(u[0]));
			SYS(close(l));
			reader(recv_fd(u[1]), p);
			_exit(0);
		}
	}
	SYS(close(u[1]));
	pid_t cl = tl_fork();
	if (cl == 0) {
		SYS(close(l));
		SYS(close(sync[0]));
		int fd = SYS(socket(AF_INET, SOCK_STREAM, 0));
		if (big)
			SYS(setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bufsz, sizeof bufsz));
		struct sockaddr_storage ss;
		socklen_t sl = tl_addr(AF_INET, port, &ss);
		SYS(connect(fd, (struct sockaddr *)&ss, sl));
		expect_transport(fd);
		tl_nodelay(fd);
		if (tl_sdp_mode()) {
			/* Buffer Copy only: a zero-copy send waits for the
			 * reader, and this one never reads. */
			int zero = 0;
			SYS(setsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &zero, sizeof zero));
		}
		tl_send_pat(fd, 0, total, SEED, 16384);
		if (p == P_CLOSE) {
			/* Not before the server attached: a client that closes
			 * first takes the connection back for TCP (PROTOCOL.md
			 * section 4), and there is nothing left to orphan. */
			char g;
			CHECK_EQ(read(go[0], &g, 1), 1);
			SYS(close(fd));
		}
		if (p == P_SHUT)
			SYS(shutdown(fd, SHUT_WR));
		CHECK_EQ(write(sync[1], "x", 1), 1);
		if (p == P_SHUT) {
			char ok[8];
			tl_recv_all(fd, ok, 2);
			CHECK(memcmp(ok, "ok", 2) == 0);
			CHECK_EQ(recv(fd, ok, sizeof ok, 0), 0);
		} else if (p != P_CLOSE) {
			for (;;)
				pause();          /* until killed */
		}
		_exit(0);
	}
	SYS(close(sync[1]));
	int s = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	expect_transport(s);
	CHECK_EQ(write(go[1], "g", 1), 1);
	if (p == P_KILL_RESET)
		tl_send_all(s, "unread", 6);  /* the client never reads these */
	char b;
	CHECK_EQ(read(sync[0], &b, 1), 1);
	if (p == P_KILL || p == P_KILL_RESET)
		SYS(kill(cl, SIGKILL));
	if (p != P_SHUT) {
		int st;
		CHECK_EQ(waitpid(cl, &st, 0), cl);
	}
	/* The server has read nothing; hand the connection on. */
	if (big)
		drop_net_admin();
	if (how == BY_EXEC) {
		rd = tl_fork();
		if (rd == 0) {
			char arg[8], len[24];
			snprintf(arg, sizeof arg, "%d", (int)p);
			snprintf(len, sizeof len, "%zu", total);
			SYS(dup2(s, 0));
			SYS(close(s));
			execl(self, self, "reader", arg, len, (char *)NULL);
			TL_FAIL("execl");
		}
	} else {
		send_fd(u[0], s);
	}
	SYS(close(s));
	tl_wait_ok(rd);
	if (p == P_SHUT)
		tl_wait_ok(cl);
}

static void exec_close(void) { run(BY_EXEC, P_CLOSE); }
static void exec_kill(void) { run(BY_EXEC, P_KILL); }
static void exec_reset(void) { run(BY_EXEC, P_KILL_RESET); }
static void exec_shut(void) { run(BY_EXEC, P_SHUT); }
static void scm_close(void) { run(BY_SCM, P_CLOSE); }
static void scm_kill(void) { run(BY_SCM, P_KILL); }
static void scm_reset(void) { run(BY_SCM, P_KILL_RESET); }
static void scm_shut(void) { run(BY_SCM, P_SHUT); }

static void exec_big(void) { big = true; total = N_BIG; run(BY_EXEC, P_CLOSE); }
static void scm_big(void) { big = true; total = N_BIG; run(BY_SCM, P_CLOSE); }

int main(int argc, char **argv)
{
	self = "/proc/self/exe";
	if (argc == 4 && strcmp(argv[1], "reader") == 0) {
		total = (size_t)atol(argv[3]);
		reader(0, (enum peer)atoi(argv[2]));
		return 0;
	}
	static char path[4096];
	ssize_t n = readlink("/proc/self/exe", path, sizeof path - 1);
	if (n > 0) {
		path[n] = 0;
		self = path;
	}
	static const struct tl_case cases[] = {
		{ "exec-close", exec_close }, { "exec-kill", exec_kill },
		{ "exec-reset", exec_reset }, { "exec-shut", exec_shut },
		{ "scm-close", scm_close },   { "scm-kill", scm_kill },
		{ "scm-reset", scm_reset },   { "scm-shut", scm_shut },
		{ "exec-big", exec_big },     { "scm-big", scm_big },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
