/*
 * SO_REUSEPORT: a group of listening sockets on one address and port, in
 * several processes, serves clients; the kernel gives each SYN to one of
 * them by a hash nobody outside can compute.
 *
 * Members A and B are processes of their own, each creating its own
 * socket (nothing inherited from one another); A also forks a worker after
 * listen() that accepts from A's socket. Each serves echo connections
 * (a header naming seed and length, that many pattern bytes, the pattern
 * of seed+1 back) and checks every accepted connection's transport (SDP
 * under SDP on its end). Clients - three processes at once, so that hellos
 * for different members interleave in the queue - run in rounds: with A
 * and B; after a third member C joined while the others sat in poll();
 * after A, the first member, left with its worker. Every byte is verified,
 * every connection must be on SDP on both ends under SDP (TCP on kernel
 * TCP), the members' counts must add up, and the connections must really
 * have been spread over the group (each member served some: the chance
 * that the hash gives one none is below 1e-6).
 */
#include "testlib.h"

#define ROUND 24
#define NBYTES 20000

static uint16_t g_port;

static int rp_listen(uint16_t port, bool listening)
{
	int fd = SYS(socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0));
	int one = 1;
	SYS(setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one));
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(AF_INET, port, &ss);
	SYS(bind(fd, (struct sockaddr *)&ss, len));
	if (listening)
		SYS(listen(fd, 128));
	return fd;
}

struct hdr {
	uint32_t seed;
	uint32_t len;
};

static void serve(int s)
{
	int fl = SYS(fcntl(s, F_GETFL));
	SYS(fcntl(s, F_SETFL, fl & ~O_NONBLOCK));
	expect_transport(s);
	tl_nodelay(s);
	struct hdr h;
	tl_recv_all(s, &h, sizeof h);
	CHECK(h.len <= NBYTES);
	tl_recv_pat(s, 0, h.len, h.seed, 65536);
	tl_send_pat(s, 0, h.len, h.seed + 1, 65536);
	char b;
	CHECK_EQ(recv(s, &b, 1, 0), 0);       /* the client closed */
	SYS(close(s));
}

/* Serves until ctl is closed, then writes its count to rep. */
static int member_loop(int l, int ctl, int rep)
{
	int served = 0;
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
			CHECK(errno == EAGAIN || errno == EINTR, "accept");
			continue;             /* a sibling took it */
		}
		serve(s);
		served++;
	}
	CHECK_EQ(write(rep, &served, sizeof served), (ssize_t)sizeof served);
	return served;
}

struct member {
	pid_t pid;
	int ctl;                      /* closing it stops the member */
	int rep;                      /* 'r' when listening, then counts */
	int nproc;                    /* processes reporting a count */
};

static int g_ends[8], g_nends;         /* our ends of members' pipes */

static struct member start_member(bool fork_worker)
{
	int ctl[2], rep[2];
	SYS(pipe(ctl));
	SYS(pipe(rep));
	struct member m = { .nproc = fork_worker ? 2 : 1 };
	m.pid = tl_fork();
	if (m.pid == 0) {
		tl_watchdog(50);
		for (int i = 0; i < g_nends; i++)
			close(g_ends[i]);     /* the other members' */
		close(ctl[1]);
		close(rep[0]);
		int l = rp_listen(g_port, true);
		pid_t w = fork_worker ? tl_fork() : -1;
		if (w == 0) {
			member_loop(l, ctl[0], rep[1]);
			_exit(0);
		}
		CHECK_EQ(write(rep[1], "r", 1), 1);
		member_loop(l, ctl[0], rep[1]);
		if (w > 0)                    /* its socket is closed when we return */
			tl_wait_ok(w);
		_exit(0);
	}
	close(ctl[0]);
	close(rep[1]);
	m.ctl = ctl[1];
	m.rep = rep[0];
	g_ends[g_nends++] = m.ctl;
	g_ends[g_nends++] = m.rep;
	char c;
	CHECK_EQ(read(m.rep, &c, 1), 1);
	CHECK_EQ(c, 'r');
	return m;
}

/* Stops the member; returns the connections its processes served. */
static int stop_member(struct member *m)
{
	close(m->ctl);
	int total = 0;
	for (int i = 0; i < m->nproc; i++) {
		int n;
		CHECK_EQ(read(m->rep, &n, sizeof n), (ssize_t)sizeof n);
		total += n;
	}
	close(m->rep);
	tl_wait_ok(m->pid);
	return total;
}

static void client(uint32_t seed)
{
	int c = tl_connect(AF_INET, g_port);
	expect_transport(c);
	tl_nodelay(c);
	struct hdr h = { seed, NBYTES - seed % 1000 };
	tl_send_all(c, &h, sizeof h);
	tl_send_pat(c, 0, h.len, seed, 7000);
	tl_recv_pat(c, 0, h.len, seed + 1, 65536);
	expect_bytes(c, sizeof h + h.len, h.len);
	SYS(close(c));
}

#define CLIENTS 3

static void round_of(uint32_t base)
{
	pid_t pid[CLIENTS];
	for (int k = 0; k < CLIENTS; k++) {
		pid[k] = tl_fork();
		if (pid[k] == 0) {
			for (uint32_t i = 0; i < ROUND / CLIENTS; i++)
				client(base + (uint32_t)k * 100 + i);
			_exit(0);
		}
	}
	for (int k = 0; k < CLIENTS; k++)
		tl_wait_ok(pid[k]);
}

int main(void)
{
	tl_watchdog(50);
	signal(SIGPIPE, SIG_IGN);
	/* Hold the port (bound, not listening) while the members bind it. */
	int hold = rp_listen(0, false);
	g_port = tl_port_of(hold);
	struct member a = start_member(true);
	struct member b = start_member(false);
	SYS(close(hold));
	round_of(1000);
	struct member c = start_member(false);     /* joins the group */
	round_of(2000);
	int na = stop_member(&a);                  /* the first one leaves */
	round_of(3000);
	int nb = stop_member(&b), nc = stop_member(&c);
	printf("served: A %d (two processes), B %d, C %d\n", na, nb, nc);
	CHECK_EQ(na + nb + nc, 3 * ROUND);
	CHECK(na > 0 && nb > 0 && nc > 0, "the group's connections were not "
	      "spread: A %d, B %d, C %d", na, nb, nc);
	return 0;
}
