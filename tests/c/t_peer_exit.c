/*
 * A peer process that ends without closing its socket (exit, SIGKILL):
 * what the survivor reads, compared with kernel TCP.
 *
 * Kernel TCP: the exiting process's socket is closed by the kernel. With
 * nothing unread in its receive queue it sends a FIN - the survivor reads
 * EOF (and its first send is then accepted, the next fails with EPIPE); a
 * FIN of ours left unread is no data and changes nothing. With data of
 * ours unread, or SO_LINGER {1, 0} set, it sends a reset: ECONNRESET once,
 * then EOF.
 *
 * Under SDP the peer's TCP socket also holds the wake-up tokens we sent
 * it. The peer here leaves one unread on purpose, as an event loop does:
 * it polls with a timeout that expires (a poll asks to be woken and stays
 * asked), we then send and tell it over a pipe, and it reads our bytes
 * without waiting (nothing consumes the token). Its kernel then resets
 * where TCP's would send a FIN: the survivor must still read EOF.
 */
#include "testlib.h"

#define SEED 17
#define LEN 100

enum end { END_EXIT, END_KILL, END_LINGER0, END_UNREAD, END_FIN_UNREAD };

/* The peer: connects, polls (times out), reports, waits for our word,
 * then reads our bytes (or not) and ends as told, never closing. */
static void peer(uint16_t port, int to_us, int from_us, enum end how)
{
	int s = tl_connect(AF_INET, port);
	tl_nodelay(s);
	expect_transport(s);
	struct pollfd p = { s, POLLIN, 0 };
	CHECK_EQ(poll(&p, 1, 20), 0);         /* nothing yet: times out */
	CHECK_EQ(write(to_us, "p", 1), 1);
	char b;
	CHECK_EQ(read(from_us, &b, 1), 1);    /* we sent (or shut down) */
	if (how != END_UNREAD && how != END_FIN_UNREAD) {
		static char buf[LEN];
		CHECK_EQ(recv(s, buf, sizeof buf, MSG_DONTWAIT), LEN);
		CHECK_PAT(buf, LEN, 0, SEED);
	}
	if (how == END_LINGER0) {
		struct linger lg = { 1, 0 };
		SYS(setsockopt(s, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	}
	if (how == END_KILL)
		kill(getpid(), SIGKILL);
	_exit(0);
}

static void run(enum end how)
{
	tl_watchdog(20);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int up[2], down[2];
	SYS(pipe(up));
	SYS(pipe(down));
	pid_t pid = tl_fork();
	if (pid == 0) {
		close(l);
		peer(port, up[1], down[0], how);
	}
	int s = SYS(accept(l, NULL, NULL));
	tl_nodelay(s);
	expect_transport(s);
	char b;
	CHECK_EQ(read(up[0], &b, 1), 1);      /* its poll timed out */
	if (how == END_FIN_UNREAD) {
		SYS(shutdown(s, SHUT_WR));
	} else {
		static char buf[LEN];
		tl_fill(buf, LEN, 0, SEED);
		tl_send_all(s, buf, LEN);
	}
	struct sdp_sock_stats st;
	if (tl_stats(s, &st))                 /* the peer asked: it got a token */
		CHECK(st.doorbells_tx >= 1, "no wake-up sent: the case tests nothing");
	CHECK_EQ(write(down[1], "s", 1), 1);
	int status;
	CHECK_EQ(waitpid(pid, &status, 0), pid);
	if (how == END_KILL)
		CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	else
		CHECK(WIFEXITED(status) && WEXITSTATUS(status) == 0);

	char buf[16];
	if (how == END_LINGER0 || how == END_UNREAD) {
		/* TCP resets: ECONNRESET once, then EOF. */
		CHECK_ERR(recv(s, buf, sizeof buf, 0), ECONNRESET);
		CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	} else {
		/* TCP closes with a FIN: EOF, and stays EOF. */
		CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
		CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
		if (how != END_FIN_UNREAD) {
			/* The first send after a FIN is accepted (the dead
			 * peer's kernel answers with a reset), later ones
			 * fail. */
			CHECK_EQ(send(s, "x", 1, MSG_NOSIGNAL), 1);
			CHECK_ERR(send(s, "x", 1, MSG_NOSIGNAL), EPIPE);
		}
	}
	SYS(close(s));
	SYS(close(l));
}

static void c_exit(void) { run(END_EXIT); }
static void c_kill(void) { run(END_KILL); }
static void c_linger0(void) { run(END_LINGER0); }
static void c_unread(void) { run(END_UNREAD); }
static void c_fin_unread(void) { run(END_FIN_UNREAD); }

int main(void)
{
	static const struct tl_case cases[] = {
		{ "exit", c_exit },           /* caught up, token unread: EOF */
		{ "kill", c_kill },
		{ "linger0", c_linger0 },     /* SO_LINGER 0: the reset is real */
		{ "unread", c_unread },       /* our data unread: reset */
		{ "fin_unread", c_fin_unread },  /* only our FIN unread: EOF */
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
