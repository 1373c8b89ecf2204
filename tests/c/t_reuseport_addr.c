/*
 * SO_REUSEPORT lets listeners on the wildcard address and on a specific
 * address share a port; the kernel gives a SYN to the most specific one.
 * A client looks for the rendezvous of its destination's exact address,
 * then of the wildcard - the one that served the port last time first -
 * so it may say hello to the wildcard group while its SYN goes to the
 * specific listener. Neither order may leave a client hanging:
 *
 *  1. wildcard first: W listens on 0.0.0.0:P, a client connects to
 *     127.0.0.1:P (served by W); then S listens on 127.0.0.1:P; the same
 *     client connects to 127.0.0.1:P again (it tries the wildcard name
 *     first): S gets the SYN and must find the hello - SDP on both ends.
 *     A client of 127.0.0.2:P is still W's.
 *  2. specific first: S listens on 127.0.0.1:P, then W on 0.0.0.0:P. W's
 *     group must not offer SDP (S takes some of the SYNs its clients
 *     would name); S's clients are SDP, 127.0.0.2's are served over TCP.
 *
 * Each exchange is verified byte for byte; on kernel TCP everything works
 * the same, over TCP.
 */
#include "testlib.h"

#define NBYTES 40000

static int rp_listen(uint32_t addr, uint16_t port)
{
	int fd = SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
	int one = 1;
	SYS(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(addr) };
	SYS(bind(fd, (struct sockaddr *)&a, sizeof a));
	SYS(listen(fd, 64));
	return fd;
}

/* A listener in a process of its own: echoes each connection; reports
 * how many it served over SDP and over TCP when ctl closes. */
struct srv {
	pid_t pid;
	int ctl, rep;
};

static int g_ends[8], g_nends;         /* our ends of the servers' pipes */

static struct srv start(uint32_t addr, uint16_t port)
{
	int ctl[2], rep[2];
	SYS(pipe(ctl));
	SYS(pipe(rep));
	struct srv s;
	s.pid = tl_fork();
	if (s.pid == 0) {
		tl_watchdog(30);
		for (int i = 0; i < g_nends; i++)
			close(g_ends[i]);     /* another server's */
		close(ctl[1]);
		close(rep[0]);
		int l = rp_listen(addr, port);
		CHECK_EQ(write(rep[1], "r", 1), 1);
		int n[2] = { 0, 0 };
		for (;;) {
			struct pollfd p[2] = { { l, POLLIN, 0 }, { ctl[0], POLLIN, 0 } };
			if (poll(p, 2, -1) < 0) {
				CHECK(errno == EINTR);
				continue;
			}
			if (p[1].revents)
				break;
			int c = accept(l, NULL, NULL);
			if (c < 0) {
				CHECK(errno == EAGAIN);
				continue;
			}
			int fl = SYS(fcntl(c, F_GETFL));
			SYS(fcntl(c, F_SETFL, fl & ~O_NONBLOCK));
			int v = 0;
			socklen_t vl = sizeof v;
			n[getsockopt(c, SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0 && v == 1]++;
			tl_recv_pat(c, 0, NBYTES, 5, 65536);
			tl_send_pat(c, 0, NBYTES, 6, 65536);
			SYS(close(c));
		}
		CHECK_EQ(write(rep[1], n, sizeof n), (ssize_t)sizeof n);
		_exit(0);
	}
	close(ctl[0]);
	close(rep[1]);
	s.ctl = ctl[1];
	s.rep = rep[0];
	g_ends[g_nends++] = s.ctl;
	g_ends[g_nends++] = s.rep;
	char c;
	CHECK_EQ(read(s.rep, &c, 1), 1);
	return s;
}

/* {tcp, sdp} connections the server took. */
static void stop(struct srv *s, int n[2])
{
	for (int i = 0; i < g_nends; i++)
		if (g_ends[i] == s->ctl || g_ends[i] == s->rep)
			g_ends[i--] = g_ends[--g_nends];
	close(s->ctl);
	CHECK_EQ(read(s->rep, n, 2 * sizeof(int)), (ssize_t)(2 * sizeof(int)));
	close(s->rep);
	tl_wait_ok(s->pid);
}

/* One exchange with addr:port; returns 1 if this end was on SDP. */
static int talk(uint32_t addr, uint16_t port)
{
	int c = SYS(socket(AF_INET, SOCK_STREAM, 0));
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(addr) };
	SYS(connect(c, (struct sockaddr *)&a, sizeof a));
	int v = 0;
	socklen_t vl = sizeof v;
	int sdp = getsockopt(c, SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0 && v == 1;
	tl_send_pat(c, 0, NBYTES, 5, 65536);
	tl_recv_pat(c, 0, NBYTES, 6, 65536);
	SYS(close(c));
	return sdp;
}

static uint16_t free_port(void)
{
	int fd = SYS(socket(AF_INET, SOCK_STREAM, 0));
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	SYS(bind(fd, (struct sockaddr *)&a, sizeof a));
	uint16_t p = tl_port_of(fd);
	SYS(close(fd));
	return p;
}

#define LO1 0x7f000001u
#define LO2 0x7f000002u

int main(void)
{
	tl_watchdog(55);
	signal(SIGPIPE, SIG_IGN);
	bool sdp = tl_sdp_mode();
	int nw[2], ns[2];

	/* 1: wildcard first, then specific. */
	uint16_t port = free_port();
	struct srv w = start(INADDR_ANY, port);
	CHECK_EQ(talk(LO1, port), sdp);       /* W serves it; the client notes
						* the wildcard name for the port */
	struct srv s = start(LO1, port);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(talk(LO1, port), sdp);   /* hello to W's name, SYN to S */
	CHECK_EQ(talk(LO2, port), sdp);
	stop(&s, ns);
	stop(&w, nw);
	CHECK(ns[sdp] == 3 && ns[!sdp] == 0, "S took %d TCP, %d SDP", ns[0], ns[1]);
	CHECK(nw[sdp] == 2 && nw[!sdp] == 0, "W took %d TCP, %d SDP", nw[0], nw[1]);

	/* 2: specific first, then wildcard. */
	port = free_port();
	s = start(LO1, port);
	CHECK_EQ(talk(LO1, port), sdp);
	w = start(INADDR_ANY, port);
	CHECK_EQ(talk(LO2, port), 0);         /* W offers TCP only */
	for (int i = 0; i < 3; i++)
		CHECK_EQ(talk(LO1, port), sdp);
	stop(&s, ns);
	stop(&w, nw);
	CHECK(ns[sdp] == 4 && ns[!sdp] == 0, "S took %d TCP, %d SDP", ns[0], ns[1]);
	CHECK(nw[0] == 1 && nw[1] == 0, "W took %d TCP, %d SDP", nw[0], nw[1]);
	printf("ok: wildcard and specific SO_REUSEPORT listeners of one port, "
	       "both orders\n");
	return 0;
}
