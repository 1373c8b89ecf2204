/*
 * epoll over many connections between the same two processes: request /
 * reply rounds on 32 connections, the client's split over two threads with
 * an epoll set each, the server's in one set. Every reply carries its
 * request transformed, so a lost, duplicated or misrouted wake-up shows as
 * a hang (watchdog) or a wrong byte.
 *
 * Under SDP the wake-ups of an epoll set's members travel through the
 * readiness queue the two processes share (one bell for however many
 * connections got news, and no system call while the set's waiter is
 * awake) instead of a token on each connection's TCP socket: the server's
 * set reads the queue of all 32 client connections, so the client's kicks
 * are queue news, not tokens (queue_kicks, doorbells_tx). Of the client's
 * two sets only one may read the queue its connections share; the other's
 * members get tokens, and both must work. The harness runs this with
 * SDP_SPIN_US=0, so waiters sleep and every wake-up is needed.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/epoll.h>

#define NTH    2
#ifndef PER
#define PER    16             /* t_epoll_lazy: more */
#endif
#define NCONN  (NTH * PER)
#ifndef ROUNDS
#define ROUNDS 400
#endif

static uint16_t port;

static uint64_t answer(uint64_t q) { return q ^ 0xa5a5a5a55a5a5a5aull; }

struct sums { uint64_t queue, tokens; };

static void add_stats(int fd, struct sums *s)
{
	struct sdp_sock_stats st;
	if (tl_stats(fd, &st)) {
		s->queue += st.queue_kicks;
		s->tokens += st.doorbells_tx;
	}
}

/* ---- server: one epoll set, non-blocking connections ------------------ */

struct conn_in { int fd; unsigned have; unsigned char buf[8]; };

static void server(int l)
{
	int ep = SYS(epoll_create1(0));
	struct conn_in cs[NCONN];
	int n = 0;
	while (n < NCONN) {
		int fd = SYS(accept4(l, NULL, NULL, SOCK_NONBLOCK));
		expect_transport(fd);
		cs[n] = (struct conn_in){ .fd = fd };
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)n };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
		n++;
	}
	struct sums s = { 0, 0 };
	long replies = 0;
	int open = NCONN;
	while (open > 0) {
		struct epoll_event evs[NCONN];
		int k = epoll_wait(ep, evs, NCONN, 10000);
		CHECK(k > 0, "server: epoll_wait -> %d (nothing in 10 s)", k);
		for (int i = 0; i < k; i++) {
			struct conn_in *c = &cs[evs[i].data.u32];
			for (;;) {
				ssize_t r = recv(c->fd, c->buf + c->have, 8 - c->have, 0);
				if (r < 0 && errno == EAGAIN)
					break;
				CHECK(r >= 0, "server: recv");
				if (r == 0) {
					CHECK_EQ(c->have, 0u);
					add_stats(c->fd, &s);
					SYS(epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL));
					SYS(close(c->fd));
					open--;
					break;
				}
				c->have += (unsigned)r;
				if (c->have == 8) {
					uint64_t q;
					memcpy(&q, c->buf, 8);
					q = answer(q);
					CHECK_EQ(send(c->fd, &q, 8, 0), 8);
					replies++;
					c->have = 0;
				}
			}
		}
	}
	CHECK_EQ(replies, (long)NCONN * ROUNDS);
	printf("    server: %llu queue kicks, %llu tokens for %ld replies\n",
	       (unsigned long long)s.queue, (unsigned long long)s.tokens, replies);
	if (tl_sdp_mode())
		CHECK(s.queue > 0, "the replies to the set that reads the queue "
		      "never went through it");
	close(ep);
	close(l);
}

/* ---- client: two threads, one epoll set each --------------------------- */

struct client { int id; int fd[PER]; struct sums s; };

static void *client(void *arg)
{
	struct client *cl = arg;
	int ep = SYS(epoll_create1(0));
	for (int i = 0; i < PER; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, cl->fd[i], &ev));
	}
	for (uint32_t round = 0; round < ROUNDS; round++) {
		for (int i = 0; i < PER; i++) {
			uint64_t q = (uint64_t)round << 32 | (uint64_t)cl->id << 16 | (uint64_t)i;
			CHECK_EQ(send(cl->fd[i], &q, 8, 0), 8);
		}
		int got = 0;
		bool done[PER] = { false };
		while (got < PER) {
			struct epoll_event evs[PER];
			int k = epoll_wait(ep, evs, PER, 10000);
			CHECK(k > 0, "client %d round %u: epoll_wait -> %d (%d of %d replies)",
			      cl->id, round, k, got, PER);
			for (int j = 0; j < k; j++) {
				int i = (int)evs[j].data.u32;
				CHECK(!done[i], "client %d: conn %d reported again after "
				      "its reply was read", cl->id, i);
				uint64_t a;
				tl_recv_all(cl->fd[i], &a, 8);
				uint64_t q = (uint64_t)round << 32 | (uint64_t)cl->id << 16 |
					     (uint64_t)i;
				CHECK_EQ(a, answer(q));
				done[i] = true;
				got++;
			}
		}
	}
	/* EPOLL_CTL_MOD of members that are writable and read up: each is
	 * reported with EPOLLOUT at once (a MOD looks at the member again,
	 * news or not), and only with it. */
	for (int i = 0; i < PER; i++) {
		struct epoll_event ev = { .events = EPOLLIN | EPOLLOUT, .data.u32 = (uint32_t)i };
		SYS(epoll_ctl(ep, EPOLL_CTL_MOD, cl->fd[i], &ev));
	}
	struct epoll_event evs[PER];
	int k = epoll_wait(ep, evs, PER, 0);
	CHECK_EQ(k, PER);
	for (int j = 0; j < k; j++)
		CHECK_EQ(evs[j].events, (uint32_t)EPOLLOUT);
	for (int i = 0; i < PER; i++) {
		add_stats(cl->fd[i], &cl->s);
		SYS(shutdown(cl->fd[i], SHUT_WR));
		char b;
		CHECK_EQ(recv(cl->fd[i], &b, 1, 0), 0);
		close(cl->fd[i]);
	}
	close(ep);
	return NULL;
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
	struct client cl[NTH];
	for (int t = 0; t < NTH; t++) {
		cl[t] = (struct client){ .id = t };
		for (int i = 0; i < PER; i++) {
			cl[t].fd[i] = tl_connect(AF_INET, port);
			tl_nodelay(cl[t].fd[i]);
			expect_transport(cl[t].fd[i]);
		}
	}
	pthread_t th[NTH];
	for (int t = 0; t < NTH; t++)
		CHECK_EQ(pthread_create(&th[t], NULL, client, &cl[t]), 0);
	for (int t = 0; t < NTH; t++)
		CHECK_EQ(pthread_join(th[t], NULL), 0);
	tl_wait_ok(pid);
	struct sums s = { cl[0].s.queue + cl[1].s.queue, cl[0].s.tokens + cl[1].s.tokens };
	printf("    client: %llu queue kicks, %llu tokens for %d requests\n",
	       (unsigned long long)s.queue, (unsigned long long)s.tokens, NCONN * ROUNDS);
	if (tl_sdp_mode()) {
		/* The server's one set reads the queue of all 32 connections:
		 * its wake-ups are queue news, and tokens only in passing. */
		CHECK(s.queue > 0, "the server's epoll set never read the queue");
		CHECK(s.tokens * 10 <= s.queue, "%llu tokens beside %llu queue kicks",
		      (unsigned long long)s.tokens, (unsigned long long)s.queue);
	}
	return 0;
}
