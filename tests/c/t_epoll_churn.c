/*
 * epoll with a set that changes around every request, as redis-benchmark's
 * event loop does it: a connection waits for EPOLLOUT, sends its request,
 * is deleted from the set and added back for EPOLLIN, reads the reply, and
 * is deleted and added for EPOLLOUT again. 16 connections in one set do
 * this against an epoll server in another process; every reply is the
 * request transformed, so a lost wake-up shows as a hang (watchdog) and a
 * misrouted one as a wrong byte.
 *
 * What the kernel does and SDP must do too: a deleted socket is never
 * reported, even when its reply arrives; added back it is reported at once
 * (level-triggered); deleting or modifying it again fails with ENOENT,
 * adding it twice with EEXIST; a socket whose peer closed while it was
 * deleted is reported readable with EPOLLRDHUP when added back.
 *
 * Under SDP (SDP_EXPECT=sdp) also: a deleted SDP member stays in the
 * kernel set with the library's own registration (its next ADD makes no
 * system call: /proc/self/fdinfo of the epoll fd still lists it), and adding
 * a socket to the set sends no wake-up token to a peer that has not yet read
 * what we sent (a busy peer would otherwise drain one per request:
 * tokens_owed and doorbells_tx stay 0 on the quiet connection).
 */
#include "testlib.h"
#include <sys/epoll.h>

#define NCONN  16
#define ROUNDS 300
#define CLOSE_AFTER 0x8000000000000000ull   /* request flag: reply, then close */

static uint16_t port;

static uint64_t answer(uint64_t q) { return (q ^ 0xa5a5a5a55a5a5a5aull) & ~CLOSE_AFTER; }

/* ---- server: one epoll set; connection 0 (quiet) is read only at the end */

struct conn_in { int fd; unsigned have; unsigned char buf[8]; bool open; };

static void server(int l)
{
	int ep = SYS(epoll_create1(0));
	int quiet = SYS(accept(l, NULL, NULL));
	expect_transport(quiet);
	struct conn_in cs[NCONN];
	for (int n = 0; n < NCONN; n++) {
		int fd = SYS(accept4(l, NULL, NULL, SOCK_NONBLOCK));
		expect_transport(fd);
		tl_nodelay(fd);
		cs[n] = (struct conn_in){ .fd = fd, .open = true };
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)n };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
	}
	int open = NCONN;
	while (open > 0) {
		struct epoll_event evs[NCONN];
		int k = epoll_wait(ep, evs, NCONN, 10000);
		CHECK(k > 0, "server: epoll_wait -> %d (nothing in 10 s)", k);
		for (int i = 0; i < k; i++) {
			struct conn_in *c = &cs[evs[i].data.u32];
			while (c->open) {
				ssize_t r = recv(c->fd, c->buf + c->have, 8 - c->have, 0);
				if (r < 0 && errno == EAGAIN)
					break;
				CHECK(r >= 0, "server: recv");
				if (r == 0) {
					CHECK_EQ(c->have, 0u);
					SYS(epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL));
					SYS(close(c->fd));
					c->open = false;
					open--;
					break;
				}
				c->have += (unsigned)r;
				if (c->have < 8)
					continue;
				uint64_t q, a;
				memcpy(&q, c->buf, 8);
				a = answer(q);
				c->have = 0;
				CHECK_EQ(send(c->fd, &a, 8, 0), 8);
				if (q & CLOSE_AFTER) {
					SYS(epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL));
					SYS(close(c->fd));
					c->open = false;
					open--;
				}
			}
		}
	}
	/* The quiet connection's one request, sent at the start. */
	uint64_t q, a;
	tl_recv_all(quiet, &q, 8);
	a = answer(q);
	tl_send_all(quiet, &a, 8);
	char b;
	CHECK_EQ(recv(quiet, &b, 1, 0), 0);
	close(quiet);
	close(ep);
	close(l);
}

/* ---- client ------------------------------------------------------------ */

static int ep;

static void ctl(int op, int fd, uint32_t events, uint32_t id)
{
	struct epoll_event ev = { .events = events, .data.u32 = id };
	SYS(epoll_ctl(ep, op, fd, op == EPOLL_CTL_DEL ? NULL : &ev));
}

static void ctl_fails(int op, int fd, int err)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.u32 = 999 };
	errno = 0;
	CHECK_EQ(epoll_ctl(ep, op, fd, &ev), -1);
	CHECK_EQ(errno, err);
}

/* Is fd in the kernel's set of ep (/proc/self/fdinfo)? */
static bool in_kernel_set(int fd)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/self/fdinfo/%d", ep);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "open %s", path);
	bool found = false;
	int t;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "tfd: %d", &t) == 1 && t == fd)
			found = true;
	fclose(f);
	return found;
}

/* Wait for the reply on fd (registered for EPOLLIN as id), the only
 * member that may be reported. */
static void wait_only(int fd, uint32_t id, uint64_t q)
{
	struct epoll_event evs[4];
	int k = epoll_wait(ep, evs, 4, 10000);
	CHECK_EQ(k, 1);
	CHECK_EQ(evs[0].data.u32, id);
	CHECK(evs[0].events & EPOLLIN);
	uint64_t a;
	tl_recv_all(fd, &a, 8);
	CHECK_EQ(a, answer(q));
}

int main(void)
{
	tl_watchdog(60);
	int l;
	pid_t pid = tl_fork_listener(&port, &l);
	if (pid == 0) {
		server(l);
		fflush(NULL);
		_exit(0);
	}
	int quiet = tl_connect(AF_INET, port);
	tl_nodelay(quiet);
	expect_transport(quiet);
	int fd[NCONN];
	for (int i = 0; i < NCONN; i++) {
		fd[i] = tl_connect(AF_INET, port);
		tl_nodelay(fd[i]);
		expect_transport(fd[i]);
		SYS(fcntl(fd[i], F_SETFL, O_NONBLOCK));
	}
	ep = SYS(epoll_create1(0));

	/* The quiet connection: a request the server reads only at the end,
	 * then the set changes around it. Adding it is no reason to wake
	 * the peer, busy or not. */
	uint64_t quiet_q = 0x7171717171717171ull;
	tl_send_all(quiet, &quiet_q, 8);
	for (int i = 0; i < 20; i++) {
		ctl(EPOLL_CTL_ADD, quiet, EPOLLIN, 100);
		ctl_fails(EPOLL_CTL_ADD, quiet, EEXIST);
		ctl(EPOLL_CTL_MOD, quiet, EPOLLIN | EPOLLRDHUP, 100);
		ctl(EPOLL_CTL_DEL, quiet, 0, 0);
		ctl_fails(EPOLL_CTL_DEL, quiet, ENOENT);
		ctl_fails(EPOLL_CTL_MOD, quiet, ENOENT);
	}
	struct sdp_sock_stats st;
	if (tl_stats(quiet, &st)) {
		CHECK_EQ(st.tokens_owed, 0);
		CHECK_EQ(st.doorbells_tx, 0);
	}
	/* Deleted: out of the kernel's set on TCP; under SDP our own
	 * registration stays (the next ADD makes no system call). */
	CHECK_EQ(in_kernel_set(quiet), tl_sdp_mode() != 0);

	/* The churn: every connection EPOLLOUT -> send -> EPOLLIN -> recv. */
	unsigned round[NCONN] = { 0 };
	bool reading[NCONN] = { false };
	for (int i = 0; i < NCONN; i++)
		ctl(EPOLL_CTL_ADD, fd[i], EPOLLOUT, (uint32_t)i);
	int done = 0;
	long replies = 0;
	while (done < NCONN) {
		struct epoll_event evs[NCONN];
		int k = epoll_wait(ep, evs, NCONN, 10000);
		CHECK(k > 0, "client: epoll_wait -> %d (%ld replies)", k, replies);
		for (int j = 0; j < k; j++) {
			int i = (int)evs[j].data.u32;
			CHECK(i >= 0 && i < NCONN, "data %d", i);
			uint64_t q = (uint64_t)round[i] << 16 | (uint64_t)i;
			if (!reading[i]) {
				CHECK(evs[j].events & EPOLLOUT);
				CHECK_EQ(send(fd[i], &q, 8, 0), 8);
				ctl(EPOLL_CTL_DEL, fd[i], 0, 0);
				if (round[i] == 0) {
					ctl_fails(EPOLL_CTL_DEL, fd[i], ENOENT);
					ctl_fails(EPOLL_CTL_MOD, fd[i], ENOENT);
				}
				ctl(EPOLL_CTL_ADD, fd[i], EPOLLIN, (uint32_t)i);
				if (round[i] == 0)
					ctl_fails(EPOLL_CTL_ADD, fd[i], EEXIST);
				reading[i] = true;
				continue;
			}
			CHECK(evs[j].events & EPOLLIN);
			uint64_t a;
			ssize_t r = recv(fd[i], &a, 8, 0);
			if (r < 0 && errno == EAGAIN)
				continue;         /* not all there yet (TCP) */
			CHECK_EQ(r, 8);
			CHECK_EQ(a, answer(q));
			replies++;
			reading[i] = false;
			ctl(EPOLL_CTL_DEL, fd[i], 0, 0);
			if (++round[i] == ROUNDS) {
				done++;
				continue;
			}
			ctl(EPOLL_CTL_ADD, fd[i], EPOLLOUT, (uint32_t)i);
		}
	}
	CHECK_EQ(replies, (long)NCONN * ROUNDS);

	/* A deleted socket is not reported when its reply comes: the reply
	 * to fd[0] is sent before the one to fd[1], which is in the set. */
	uint64_t q0 = 0xabc0, q1 = 0xabc1, q2 = 0xabc2 | CLOSE_AFTER, q3 = 0xabc3;
	CHECK_EQ(send(fd[0], &q0, 8, 0), 8);
	ctl(EPOLL_CTL_ADD, fd[1], EPOLLIN, 1);
	CHECK_EQ(send(fd[1], &q1, 8, 0), 8);
	wait_only(fd[1], 1, q1);
	ctl(EPOLL_CTL_ADD, fd[0], EPOLLIN, 0);
	struct epoll_event evs[4];
	CHECK_EQ(epoll_wait(ep, evs, 4, 0), 1);
	CHECK_EQ(evs[0].data.u32, 0u);
	CHECK_EQ(evs[0].events, (uint32_t)EPOLLIN);
	uint64_t a;
	tl_recv_all(fd[0], &a, 8);
	CHECK_EQ(a, answer(q0));
	ctl(EPOLL_CTL_DEL, fd[0], 0, 0);

	/* The peer closes a deleted socket: not reported; added back, it is
	 * readable (the reply, then EOF) with EPOLLRDHUP. */
	CHECK_EQ(send(fd[2], &q2, 8, 0), 8);
	CHECK_EQ(send(fd[1], &q3, 8, 0), 8);
	wait_only(fd[1], 1, q3);
	ctl(EPOLL_CTL_ADD, fd[2], EPOLLIN | EPOLLRDHUP, 2);
	CHECK_EQ(epoll_wait(ep, evs, 4, 0), 1);
	CHECK_EQ(evs[0].data.u32, 2u);
	CHECK_EQ(evs[0].events, (uint32_t)(EPOLLIN | EPOLLRDHUP));
	tl_recv_all(fd[2], &a, 8);
	CHECK_EQ(a, answer(q2));
	char b;
	int fl = SYS(fcntl(fd[2], F_GETFL));
	SYS(fcntl(fd[2], F_SETFL, fl & ~O_NONBLOCK));
	CHECK_EQ(recv(fd[2], &b, 1, 0), 0);

	/* A deleted socket closed while a duplicate keeps it open leaves the
	 * kernel's set as on TCP (the kernel would keep our registration). */
	ctl(EPOLL_CTL_DEL, fd[1], 0, 0);
	int dup1 = SYS(dup(fd[1]));
	SYS(close(fd[1]));
	CHECK(!in_kernel_set(fd[1]), "fd %d closed after its delete is still in "
	      "the kernel's set", fd[1]);
	fd[1] = dup1;

	for (int i = 0; i < NCONN; i++)
		close(fd[i]);
	uint64_t qa;
	tl_recv_all(quiet, &qa, 8);
	CHECK_EQ(qa, answer(quiet_q));
	SYS(shutdown(quiet, SHUT_WR));
	close(quiet);
	close(ep);
	tl_wait_ok(pid);
	return 0;
}
