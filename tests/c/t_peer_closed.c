/*
 * What send() and recv() return after the peer closed or shut down its
 * socket, call by call, compared with kernel TCP.
 *
 * Kernel TCP: after the peer's close (FIN) the next send is accepted -
 * the peer answers it with a reset - and, the reset having arrived, every
 * later send fails with EPIPE (SIGPIPE unless MSG_NOSIGNAL); since the FIN
 * came first, reads go on returning EOF and the reset is reported as EPIPE
 * (SO_ERROR, POLLERR), never as ECONNRESET. A zero-length send moves no
 * data, so it provokes no reset and leaves the next send accepted. A peer
 * that closes with data of ours unread resets at once (ECONNRESET once,
 * then EPIPE / EOF). A peer that shut down both directions resets on our
 * data as if it had closed.
 *
 * Each scenario runs on a fresh connected pair in this process and records
 * every call's result as text ("send1=1 send1=EPIPE+SIG recv=0 ..."): the
 * expected strings are kernel TCP's (this program also runs on kernel TCP
 * and must match there), and under SDP the record must be the same.
 */
#include "testlib.h"
#include <sys/ioctl.h>

static volatile sig_atomic_t pipes;
static void on_pipe(int sig) { (void)sig; pipes++; }

static char rec[2048];
static int c, s;                       /* our socket, the peer's */

static const char *ename(int e)
{
	switch (e) {
	case EPIPE: return "EPIPE";
	case ECONNRESET: return "ECONNRESET";
	case EAGAIN: return "EAGAIN";
	case ENOTCONN: return "ENOTCONN";
	default: {
		static char b[16];
		snprintf(b, sizeof b, "E%d", e);
		return b;
	}
	}
}

static void put(const char *op, long r, int e, int sig0)
{
	size_t n = strlen(rec);
	char v[32];
	if (r < 0)
		snprintf(v, sizeof v, "%s", ename(e));
	else
		snprintf(v, sizeof v, "%ld", r);
	snprintf(rec + n, sizeof rec - n, "%s%s=%s%s", n ? " " : "", op, v,
		 pipes != sig0 ? "+SIG" : "");
}

/* ---- recorded calls ---------------------------------------------------- */

static void op_send(size_t len, int flags)
{
	static char buf[4096];
	int p0 = pipes;
	errno = 0;
	long r = send(c, buf, len, flags);
	char op[32];
	snprintf(op, sizeof op, "send%zu%s", len,
		 (flags & MSG_DONTWAIT) ? "nb" : (flags & MSG_NOSIGNAL) ? "ns" : "");
	put(op, r, errno, p0);
}

static void op_writev(void)
{
	struct iovec v[2] = { { "ab", 2 }, { "cde", 3 } };
	int p0 = pipes;
	errno = 0;
	long r = writev(c, v, 2);
	put("writev5", r, errno, p0);
}

static void op_sendmsg(int flags)
{
	struct iovec v[2] = { { "ab", 2 }, { "c", 1 } };
	struct msghdr m = { .msg_iov = v, .msg_iovlen = 2 };
	int p0 = pipes;
	errno = 0;
	long r = sendmsg(c, &m, flags);
	put(flags & MSG_NOSIGNAL ? "sendmsg3ns" : "sendmsg3", r, errno, p0);
}

static void op_write0(void)
{
	int p0 = pipes;
	errno = 0;
	long r = write(c, "", 0);
	put("write0", r, errno, p0);
}

/* Never blocks: every scenario reads only where TCP has an answer now
 * (data, EOF or an error); EAGAIN would show a difference. */
static void op_recv(void)
{
	char buf[64];
	errno = 0;
	long r = recv(c, buf, sizeof buf, MSG_DONTWAIT);
	put("recv", r, errno, pipes);
}

static void op_read(void)
{
	char buf[64];
	errno = 0;
	long r = read(c, buf, sizeof buf);
	put("read", r, errno, pipes);
}

static void op_soerror(void)
{
	int e = -1;
	socklen_t l = sizeof e;
	SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &e, &l));
	size_t n = strlen(rec);
	snprintf(rec + n, sizeof rec - n, "%sSO_ERROR=%s", n ? " " : "",
		 e ? ename(e) : "0");
}

static void op_poll(void)
{
	struct pollfd p = { c, POLLIN | POLLOUT | POLLRDHUP, 0 };
	SYS(poll(&p, 1, 0));
	size_t n = strlen(rec);
	snprintf(rec + n, sizeof rec - n, "%spoll=%s%s%s%s%s", n ? " " : "",
		 p.revents & POLLIN ? "I" : "", p.revents & POLLOUT ? "O" : "",
		 p.revents & POLLRDHUP ? "R" : "", p.revents & POLLHUP ? "H" : "",
		 p.revents & POLLERR ? "E" : "");
}

/* The peer's view, for a peer that is still there. */
static void op_peer_recv(void)
{
	char buf[64];
	errno = 0;
	long r = recv(s, buf, sizeof buf, MSG_DONTWAIT);
	put("peer_recv", r, errno, pipes);
}

static void op_peer_soerror(void)
{
	int e = -1;
	socklen_t l = sizeof e;
	SYS(getsockopt(s, SOL_SOCKET, SO_ERROR, &e, &l));
	size_t n = strlen(rec);
	snprintf(rec + n, sizeof rec - n, "%speer_SO_ERROR=%s", n ? " " : "",
		 e ? ename(e) : "0");
}

/* ---- scenarios --------------------------------------------------------- */

static void pair(void)
{
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	rec[0] = 0;
	pipes = 0;
}

static void done(const char *name, const char *want)
{
	close(c);
	if (s >= 0)
		close(s);
	if (strcmp(rec, want)) {
		fprintf(stderr, "%s:\n  got  %s\n  want %s\n", name, rec, want);
		if (!getenv("T_RECORD"))
			_exit(1);
	}
	printf("%-22s %s\n", name, rec);
}

/* Peer closes with nothing unread; our first call is a send. */
static void sc_close_send(void)
{
	pair();
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	char b[8];
	CHECK_EQ(recv(s, b, sizeof b, 0), 3);
	SYS(close(s)); s = -1;
	op_poll();
	op_send(1, 0);
	op_poll();
	op_soerror();
	op_poll();
	op_send(1, 0);
	op_send(1, MSG_NOSIGNAL);
	op_recv();
	op_recv();
	op_send(1, 0);
	done("close_send", "poll=IOR send1=1 poll=IORHE SO_ERROR=EPIPE poll=IORH "
	     "send1=EPIPE+SIG send1ns=EPIPE recv=0 recv=0 send1=EPIPE+SIG");
}

/* Peer closes; we read its EOF first, then send (a TLS close_notify). */
static void sc_close_eof_send(void)
{
	pair();
	SYS(close(s)); s = -1;
	op_recv();
	op_send(24, MSG_NOSIGNAL);
	op_recv();
	op_send(1, MSG_NOSIGNAL);
	op_soerror();
	op_send(1, MSG_NOSIGNAL);
	done("close_eof_send", "recv=0 send24ns=24 recv=0 send1ns=EPIPE SO_ERROR=0 "
	     "send1ns=EPIPE");
}

/* The peer sent data and closed; we send before reading it. */
static void sc_close_data_send(void)
{
	pair();
	CHECK_EQ(send(s, "xyz", 3, 0), 3);
	SYS(close(s)); s = -1;
	op_send(2, 0);
	op_poll();
	op_recv();
	op_recv();
	op_send(2, 0);
	op_soerror();
	done("close_data_send", "send2=2 poll=IORHE recv=3 recv=0 send2=EPIPE+SIG "
	     "SO_ERROR=0");
}

/* Zero-length sends move nothing: no reset, the next real send is the
 * accepted one. */
static void sc_close_zero(void)
{
	pair();
	SYS(close(s)); s = -1;
	op_send(0, 0);
	op_send(0, MSG_DONTWAIT);
	op_write0();
	op_poll();
	op_send(1, 0);
	op_send(0, 0);
	op_send(0, 0);
	op_write0();
	op_recv();
	done("close_zero", "send0=0 send0nb=0 write0=0 poll=IOR send1=1 "
	     "send0=EPIPE+SIG send0=EPIPE+SIG write0=EPIPE+SIG recv=0");
}

/* Non-blocking socket and MSG_DONTWAIT. */
static void sc_close_nonblock(void)
{
	pair();
	SYS(fcntl(c, F_SETFL, SYS(fcntl(c, F_GETFL)) | O_NONBLOCK));
	SYS(close(s)); s = -1;
	op_send(100, MSG_DONTWAIT);
	op_send(100, MSG_DONTWAIT);
	op_read();
	op_send(1, 0);
	done("close_nonblock", "send100nb=100 send100nb=EPIPE+SIG read=0 send1=EPIPE+SIG");
}

/* writev and sendmsg count like send. */
static void sc_close_vec(void)
{
	pair();
	SYS(close(s)); s = -1;
	op_writev();
	op_writev();
	op_sendmsg(MSG_NOSIGNAL);
	op_sendmsg(0);
	op_read();
	done("close_vec", "writev5=5 writev5=EPIPE+SIG sendmsg3ns=EPIPE "
	     "sendmsg3=EPIPE+SIG read=0");
}

/* Peer closes with our data unread: reset at once. Send first. */
static void sc_unread_send(void)
{
	pair();
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	SYS(close(s)); s = -1;
	op_poll();
	op_send(0, 0);
	op_send(1, 0);
	op_send(1, 0);
	op_soerror();
	op_recv();
	done("unread_send", "poll=IORHE send0=ECONNRESET send1=EPIPE+SIG "
	     "send1=EPIPE+SIG SO_ERROR=0 recv=0");
}

/* Same, recv first. */
static void sc_unread_recv(void)
{
	pair();
	CHECK_EQ(send(c, "abc", 3, 0), 3);
	SYS(close(s)); s = -1;
	op_recv();
	op_recv();
	op_send(1, MSG_NOSIGNAL);
	op_poll();
	done("unread_recv", "recv=ECONNRESET recv=0 send1ns=EPIPE poll=IORH");
}

/* The peer shut down its sending side, then closed with our data unread:
 * its FIN came first, so the reset shows as EPIPE, and reads say EOF. */
static void sc_shutwr_unread(void)
{
	pair();
	SYS(shutdown(s, SHUT_WR));
	op_send(3, 0);
	op_poll();
	SYS(close(s)); s = -1;
	op_poll();
	op_recv();
	op_send(1, MSG_NOSIGNAL);
	op_send(1, MSG_NOSIGNAL);
	op_recv();
	done("shutwr_unread", "send3=3 poll=IOR poll=IORHE recv=0 send1ns=EPIPE "
	     "send1ns=EPIPE recv=0");
}

/* The peer shut down its sending side only: we read EOF, our sends go on
 * and are read. */
static void sc_shutwr(void)
{
	pair();
	SYS(shutdown(s, SHUT_WR));
	op_recv();
	op_send(3, 0);
	op_send(0, 0);
	op_send(2, 0);
	char b[8];
	CHECK_EQ(recv(s, b, 5, MSG_WAITALL), 5);
	op_poll();
	done("shutwr", "recv=0 send3=3 send0=0 send2=2 poll=IOR");
}

/* The peer shut down its receiving side only: nothing changes for us. */
static void sc_shutrd(void)
{
	pair();
	SYS(shutdown(s, SHUT_RD));
	op_send(3, 0);
	op_send(2, 0);
	op_recv();
	op_poll();
	char b[8];
	CHECK_EQ(recv(s, b, sizeof b, MSG_DONTWAIT), 5);
	done("shutrd", "send3=3 send2=2 recv=EAGAIN poll=O");
}

/* The peer shut down both directions: our data is answered with a reset. */
static void sc_shutrdwr(void)
{
	pair();
	SYS(shutdown(s, SHUT_RDWR));
	op_poll();
	op_send(0, 0);
	op_send(4, 0);
	op_poll();
	op_send(4, 0);
	op_recv();
	op_soerror();
	op_peer_soerror();
	op_peer_recv();
	done("shutrdwr", "poll=IOR send0=0 send4=4 poll=IORHE send4=EPIPE+SIG recv=0 "
	     "SO_ERROR=0 peer_SO_ERROR=ECONNRESET peer_recv=0");
}

/* Same, but our send comes before we read its EOF and we ask SO_ERROR. */
static void sc_shutrdwr_soerror(void)
{
	pair();
	SYS(shutdown(s, SHUT_RDWR));
	op_send(4, MSG_NOSIGNAL);
	op_soerror();
	op_soerror();
	op_poll();
	op_send(4, MSG_NOSIGNAL);
	op_recv();
	op_peer_recv();
	op_peer_recv();
	done("shutrdwr_soerror", "send4ns=4 SO_ERROR=EPIPE SO_ERROR=0 poll=IORH "
	     "send4ns=EPIPE recv=0 peer_recv=ECONNRESET peer_recv=0");
}

/* The peer's process exits without closing (the kernel closes its
 * socket); we wait for its EOF in poll(), as an event loop does. */
static void sc_exit_poll(void)
{
	pair();
	pid_t pid = tl_fork();
	if (pid == 0) {
		close(c);
		_exit(0);
	}
	SYS(close(s)); s = -1;
	tl_wait_ok(pid);
	struct pollfd p = { c, POLLIN, 0 };
	CHECK_EQ(poll(&p, 1, 5000), 1);
	op_poll();
	op_send(5, 0);
	op_poll();
	op_send(5, 0);
	op_recv();
	done("exit_poll", "poll=IOR send5=5 poll=IORHE send5=EPIPE+SIG recv=0");
}

int main(void)
{
	tl_watchdog(20);
	setvbuf(stdout, NULL, _IONBF, 0);
	struct sigaction sa = { .sa_handler = on_pipe };
	SYS(sigaction(SIGPIPE, &sa, NULL));
	sc_close_send();
	sc_close_eof_send();
	sc_close_data_send();
	sc_close_zero();
	sc_close_nonblock();
	sc_close_vec();
	sc_unread_send();
	sc_unread_recv();
	sc_shutwr_unread();
	sc_shutwr();
	sc_shutrd();
	sc_shutrdwr();
	sc_shutrdwr_soerror();
	sc_exit_poll();
	return 0;
}
