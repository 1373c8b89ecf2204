/*
 * A server at its file descriptor limit.
 *
 * The server's RLIMIT_NOFILE leaves room for a handful of connections. It
 * serves each one (a header naming seed and length, that many pattern
 * bytes, the pattern of seed+1 back) and keeps it open until accept()
 * fails with EMFILE; then it closes them all and goes on - what a server
 * does at its limit. Four client processes connect at once, forty
 * connections in all. Under SDP the client commits to SDP when it says
 * hello, before its SYN; a server that then cannot take the hello (no
 * descriptor for the rendezvous connection, or the memfd cut off by the
 * kernel: MSG_CTRUNC) must reset the connection, never keep it as TCP on
 * its side while the client waits in shared memory. So every client must
 * either talk (every byte verified) or be reset (ECONNRESET / EPIPE), none
 * may hang (10 s receive timeout), and the server must really have hit its
 * limit. On kernel TCP every client talks; under SDP most do too (accept()
 * says EMFILE while too few descriptors are left to take a hello).
 */
#include "testlib.h"
#include <dirent.h>
#include <sys/resource.h>

#define NCLIENTS 40
#define NPROC 4
#define HOLD 6
#define NBYTES 30000

struct hdr {
	uint32_t seed;
	uint32_t len;
};

static int highest_fd(void)
{
	DIR *d = opendir("/proc/self/fd");
	CHECK(d != NULL);
	int hi = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] != '.' && atoi(e->d_name) > hi)
			hi = atoi(e->d_name);
	closedir(d);
	return hi;
}

static void serve(int s)
{
	struct hdr h;
	tl_recv_all(s, &h, sizeof h);
	CHECK(h.len <= NBYTES);
	tl_recv_pat(s, 0, h.len, h.seed, 65536);
	tl_send_pat(s, 0, h.len, h.seed + 1, 65536);
}

/* Serves until ctl closes; reports (served, emfile) on rep. */
static void server(int l, int ctl, int rep)
{
	tl_watchdog(50);
	/* Exactly HOLD free descriptors: fill the holes below the highest one
	 * open (fds inherited from whoever started us included), and set the
	 * limit just above it. */
	int hi = highest_fd();
	for (;;) {
		int f = SYS(open("/dev/null", O_RDONLY | O_CLOEXEC));
		if (f > hi) {
			SYS(close(f));
			break;
		}
	}
	struct rlimit rl;
	SYS(getrlimit(RLIMIT_NOFILE, &rl));
	rl.rlim_cur = (rlim_t)hi + 1 + HOLD;
	SYS(setrlimit(RLIMIT_NOFILE, &rl));
	int held[64], nheld = 0, served = 0, emfile = 0;
	for (;;) {
		struct pollfd p[2] = { { l, POLLIN, 0 }, { ctl, POLLIN, 0 } };
		int r = poll(p, 2, -1);
		if (r < 0 && errno == EINTR)
			continue;
		CHECK(r > 0);
		if (p[1].revents)
			break;
		int s = accept(l, NULL, NULL);
		if (s < 0) {
			CHECK(errno == EMFILE || errno == EAGAIN, "accept");
			if (errno == EMFILE) {
				emfile++;
				while (nheld)
					SYS(close(held[--nheld]));
			}
			continue;
		}
		int fl = SYS(fcntl(s, F_GETFL));
		SYS(fcntl(s, F_SETFL, fl & ~O_NONBLOCK));
		expect_transport(s);
		serve(s);
		served++;
		CHECK(nheld < 64);
		held[nheld++] = s;
	}
	int out[2] = { served, emfile };
	CHECK_EQ(write(rep, out, sizeof out), (ssize_t)sizeof out);
	_exit(0);
}

/* 1: talked, 0: reset. */
static int client(uint16_t port, uint32_t seed)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	struct timeval tv = { 10, 0 };
	SYS(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	struct hdr h = { seed, NBYTES - seed % 997 };
	static char buf[NBYTES];
	tl_fill(buf, h.len, 0, seed);
	int res = 1;
	if (send(c, &h, sizeof h, MSG_NOSIGNAL) != (ssize_t)sizeof h ||
	    send(c, buf, h.len, MSG_NOSIGNAL) != (ssize_t)h.len) {
		CHECK(errno == ECONNRESET || errno == EPIPE, "send");
		res = 0;
	} else {
		size_t got = 0;
		while (got < h.len) {
			ssize_t n = recv(c, buf + got, h.len - got, 0);
			CHECK(n != -1 || errno != EAGAIN, "no answer and no reset in 10 s: "
			      "the two ends wait for each other");
			if (n <= 0) {
				CHECK(got == 0 && (n == 0 || errno == ECONNRESET),
				      "recv returned %zd after %zu bytes", n, got);
				res = 0;
				break;
			}
			got += (size_t)n;
		}
		if (res)
			CHECK_PAT(buf, h.len, 0, seed + 1);
	}
	close(c);
	return res;
}

int main(void)
{
	tl_watchdog(55);
	signal(SIGPIPE, SIG_IGN);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int fl = SYS(fcntl(l, F_GETFL));
	SYS(fcntl(l, F_SETFL, fl | O_NONBLOCK));
	int ctl[2], rep[2], res[2];
	SYS(pipe(ctl));
	SYS(pipe(rep));
	SYS(pipe(res));
	pid_t srv = tl_fork();
	if (srv == 0) {
		close(ctl[1]);
		close(rep[0]);
		close(res[0]);
		close(res[1]);
		server(l, ctl[0], rep[1]);
	}
	close(ctl[0]);
	close(rep[1]);
	close(l);
	pid_t cl[NPROC];
	for (int k = 0; k < NPROC; k++) {
		cl[k] = tl_fork();
		if (cl[k] == 0) {
			close(ctl[1]);
			close(rep[0]);
			close(res[0]);
			int talked = 0;
			for (int i = 0; i < NCLIENTS / NPROC; i++)
				talked += client(port, (uint32_t)(k * 1000 + i));
			CHECK_EQ(write(res[1], &talked, sizeof talked), (ssize_t)sizeof talked);
			_exit(0);
		}
	}
	close(res[1]);
	int talked = 0;
	for (int k = 0; k < NPROC; k++) {
		tl_wait_ok(cl[k]);
		int t;
		CHECK_EQ(read(res[0], &t, sizeof t), (ssize_t)sizeof t);
		talked += t;
	}
	close(ctl[1]);
	int out[2];
	CHECK_EQ(read(rep[0], out, sizeof out), (ssize_t)sizeof out);
	tl_wait_ok(srv);
	printf("%d of %d clients talked, %d were reset; the server served %d and "
	       "saw EMFILE %d times\n", talked, NCLIENTS, NCLIENTS - talked, out[0], out[1]);
	CHECK_EQ(out[0], talked);
	CHECK(out[1] > 0, "the server never reached its descriptor limit");
	if (!tl_sdp_mode())
		CHECK_EQ(talked, NCLIENTS);
	else
		CHECK(talked > 0, "no SDP client was served at the descriptor limit");
	return 0;
}
