/*
 * Clients connecting while their server's listening socket is shut down
 * and closed - how a server stops under load. A thread is blocked in
 * accept() and serves each connection (a 4-byte id in, its complement
 * back); client threads connect back to back, each sending its id at
 * once and reading the answers after; the main thread does
 * shutdown(SHUT_RDWR) + close() on the listener after a different number
 * of connections in each round, while the clients go on connecting.
 *
 * Kernel TCP gives every client an answer: its id echoed (accepted before
 * the close), or ECONNREFUSED / ECONNRESET / EPIPE / EOF (its connection
 * was queued, or its SYN came, when the listener went away). It never
 * leaves one waiting - even when the server's kernel dropped the server's
 * end of a connection without a reset as the listener closed (it does,
 * rarely): the client's id then draws the reset. An SDP client, whose id
 * goes into the ring and not on TCP, must get the same answers
 * (ARCHITECTURE.md section 4, "a server end gone"). Every wait is bounded
 * (SO_RCVTIMEO, SO_SNDTIMEO: 10 s): a client or server still waiting then
 * fails the test - a hang is a failure, not a slow run. Without the fix
 * about one round in 250 left a client waiting.
 *
 * TL_ROUNDS=n runs n rounds instead of 500 (for loops that look for the
 * race).
 */
#include "testlib.h"
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <sys/epoll.h>

#define ROUNDS    500
#define NCLIENT   3      /* client threads */
#define PER       16     /* connections per client thread and round, at most
			 * (3 x 16 fit the backlog of 64: no SYN waits
			 * for a retransmission) */
#define WAIT_S    10     /* a wait longer than this is a hang */

struct round {
	int l;
	uint16_t port;
	_Atomic int accepted, connected, echoed, refused, reset, eof, sdp;
	_Atomic bool closed;
};

/* A wait ran out: report it (TL_HOLD=s: first keep the process as it is
 * for s seconds, for a look at its sockets and threads). */
static void hung(const char *who, const char *what)
{
	fprintf(stderr, "%s: %s: no answer, no error, no EOF in %d s (hung)\n", who,
		what, WAIT_S);
	const char *h = getenv("TL_HOLD");
	if (h && atoi(h) > 0) {
		fprintf(stderr, "holding pid %d for %s s\n", (int)getpid(), h);
		sleep((unsigned)atoi(h));
	}
	_exit(1);
}

static void timeouts(int fd)
{
	struct timeval tv = { .tv_sec = WAIT_S };
	SYS(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	SYS(setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
}

static void *acceptor(void *arg)
{
	struct round *r = arg;
	for (;;) {
		int n = accept(r->l, NULL, NULL);
		if (n < 0) {
			/* shut down (EINVAL), closed (EBADF), or the number
			 * already names another socket (EINVAL, ENOTSOCK) */
			CHECK(errno == EINVAL || errno == EBADF || errno == ENOTSOCK ||
			      errno == ECONNABORTED, "accept: %s", strerror(errno));
			if (errno == ECONNABORTED)
				continue;
			return NULL;
		}
		timeouts(n);
		atomic_fetch_add(&r->accepted, 1);
		int v = 0;
		socklen_t vl = sizeof v;
		if (getsockopt(n, SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0 && v == 1)
			atomic_fetch_add(&r->sdp, 1);
		/* Every client sends its id at once and waits for the answer:
		 * an accepted connection always carries it. */
		uint32_t id = 0;
		ssize_t k = recv(n, &id, sizeof id, MSG_WAITALL);
		int err = errno;
		if (k < 0 && err == EAGAIN)
			hung("server", "recv of the id");
		CHECK(k == (ssize_t)sizeof id, "server: recv of the id: %zd (%s)", k,
		      k < 0 ? strerror(err) : "EOF");
		CHECK(id >> 16 == 0xC1, "id %#x", id);
		uint32_t ack = id ^ 0xFFFFFFFFu;
		CHECK_EQ(send(n, &ack, sizeof ack, MSG_NOSIGNAL), (ssize_t)sizeof ack);
		SYS(close(n));
	}
}

struct client {
	struct round *r;
	int no;
};

/* Wait for fd to be readable as client thread `no` does: 0 in recv
 * itself, 1 in poll, 2 in epoll_wait (an application's event loop). */
static void wait_readable(int no, int fd)
{
	if (no == 0)
		return;
	int r;
	if (no == 1) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		r = poll(&p, 1, WAIT_S * 1000);
	} else {
		int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd }, out;
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
		r = epoll_wait(ep, &out, 1, WAIT_S * 1000);
		SYS(close(ep));
	}
	CHECK(r >= 0, "client %d: %s: %s", no, no == 1 ? "poll" : "epoll_wait",
	      strerror(errno));
	if (r == 0)
		hung("client", no == 1 ? "poll for the answer" : "epoll_wait for the answer");
}

/* One connection's answer (its id sent): echoed, EOF or reset. */
static void answer(struct round *r, int no, int i, int fd, uint32_t id)
{
	uint32_t ack = 0;
	wait_readable(no, fd);
	ssize_t k = recv(fd, &ack, sizeof ack, MSG_WAITALL);
	int err = errno;
	if (k < 0 && err == EAGAIN)
		hung("client", "recv of the answer");
	CHECK(k >= 0 || err == ECONNRESET, "client %d.%d: recv: %s", no, i, strerror(err));
	if (k == (ssize_t)sizeof ack) {
		CHECK_EQ(ack, id ^ 0xFFFFFFFFu);
		atomic_fetch_add(&r->echoed, 1);
	} else if (k == 0) {
		atomic_fetch_add(&r->eof, 1);
	} else {
		CHECK(k < 0, "client %d.%d: %zd bytes of the answer, then EOF", no, i, k);
		CHECK(atomic_load(&r->closed), "client %d.%d: %s before the listener "
		      "was shut down", no, i, strerror(err));
		atomic_fetch_add(&r->reset, 1);
	}
}

/* Connections back to back, each sending its id at once (so that some
 * are always between SYN and accept when the listener goes), then every
 * answer (waited for in recv, poll or epoll_wait: wait_readable). */
static void *client(void *arg)
{
	struct client *cl = arg;
	struct round *r = cl->r;
	int fds[PER];
	uint32_t ids[PER];
	int n = 0;
	for (int i = 0; i < PER; i++) {
		int fd = SYS(socket(AF_INET, SOCK_STREAM, 0));
		timeouts(fd);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(r->port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			int err = errno;
			if (err == EINPROGRESS || err == EAGAIN)
				hung("client", "connect");
			CHECK(err == ECONNREFUSED || err == ECONNRESET, "connect: %s",
			      strerror(err));
			CHECK(atomic_load(&r->closed), "connect refused (%s) before the "
			      "listener was shut down", strerror(err));
			atomic_fetch_add(&r->refused, 1);
			SYS(close(fd));
			break;                /* the listener is gone */
		}
		atomic_fetch_add(&r->connected, 1);
		uint32_t id = 0xC10000u | (uint32_t)(cl->no << 8) | (uint32_t)i;
		ssize_t k = send(fd, &id, sizeof id, MSG_NOSIGNAL);
		int err = errno;
		if (k == (ssize_t)sizeof id) {
			fds[n] = fd;
			ids[n++] = id;
			continue;
		}
		if (k < 0 && err == EAGAIN)
			hung("client", "send of the id");
		CHECK(k < 0 && (err == ECONNRESET || err == EPIPE),
		      "client %d.%d: send: %zd (%s)", cl->no, i, k,
		      k < 0 ? strerror(err) : "short");
		CHECK(atomic_load(&r->closed), "client %d.%d: %s before the listener "
		      "was shut down", cl->no, i, strerror(err));
		atomic_fetch_add(&r->reset, 1);
		SYS(close(fd));
	}
	for (int j = 0; j < n; j++) {
		answer(r, cl->no, (int)(ids[j] & 0xFF), fds[j], ids[j]);
		SYS(close(fds[j]));
	}
	return NULL;
}

/* ---- a server slow to accept ------------------------------------------------
 * The client's looks for its server's end (while it waits for the attach)
 * must never give up on a server that is only slow: 400 ms before the
 * accept, the connection stays SDP. A client that cannot look (its thread
 * waits from another network namespace than the socket's, where the
 * kernel knows neither end) goes back to TCP after 2 s without an attach;
 * the server, accepting after that, finds the connection abandoned and
 * serves it on TCP too: the bytes arrive either way. */
struct late {
	uint16_t port;
	bool blind;                   /* wait from another network namespace */
	_Atomic int waiting;          /* 1: id sent, about to wait */
	_Atomic int ns_err;           /* blind: unshare's errno (cannot) */
	int fd;
};

static void *late_client(void *arg)
{
	struct late *lt = arg;
	int fd = SYS(socket(AF_INET, SOCK_STREAM, 0));
	timeouts(fd);
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(lt->port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	SYS(connect(fd, (struct sockaddr *)&a, sizeof a));
	lt->fd = fd;
	uint32_t id = 0xC1F00Du, ack = 0;
	CHECK_EQ(send(fd, &id, sizeof id, MSG_NOSIGNAL), (ssize_t)sizeof id);
	if (lt->blind && unshare(CLONE_NEWNET) < 0)
		atomic_store(&lt->ns_err, errno ? errno : EPERM);
	atomic_store(&lt->waiting, 1);
	ssize_t k = recv(fd, &ack, sizeof ack, MSG_WAITALL);
	int err = errno;
	if (k < 0 && err == EAGAIN)
		hung("late client", "recv of the answer");
	CHECK(k == (ssize_t)sizeof ack, "late client: recv: %zd (%s)", k,
	      k < 0 ? strerror(err) : "EOF");
	CHECK_EQ(ack, id ^ 0xFFFFFFFFu);
	return NULL;
}

static int transport(int fd)
{
	int v = -1;
	socklen_t vl = sizeof v;
	return getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0 ? v : -1;
}

static void late_case(bool blind)
{
	struct late lt = { .blind = blind };
	int l = tl_listen(AF_INET, &lt.port);
	pthread_t t;
	CHECK_EQ(pthread_create(&t, NULL, late_client, &lt), 0);
	while (!atomic_load(&lt.waiting))
		sched_yield();
	bool sdp = tl_sdp_mode(), tcp_after = false;
	if (blind && atomic_load(&lt.ns_err)) {
		printf("late accept, client in another namespace: not run (unshare: %s)\n",
		       strerror(atomic_load(&lt.ns_err)));
		blind = false;
	}
	if (blind && sdp) {
		/* the client gives up on the attach after 2 s: wait (10 s at
		 * most) until its socket is TCP, then accept */
		double end = tl_now() + WAIT_S;
		while (transport(lt.fd) == 1) {
			CHECK(tl_now() < end, "the client still waits for the attach "
			      "after %d s, unable to look for the server's end", WAIT_S);
			tl_idle_ms(20);
		}
		CHECK_EQ(transport(lt.fd), 0);
		tcp_after = true;
	} else {
		tl_idle_ms(400);      /* the client looks a few times meanwhile */
	}
	int n = accept(l, NULL, NULL);
	CHECK(n >= 0, "accept: %s", strerror(errno));
	timeouts(n);
	if (tcp_after)
		CHECK_EQ(transport(n), 0);    /* abandoned: TCP here too */
	else
		expect_transport(n);          /* SDP: never given up on */
	uint32_t id = 0, ack;
	ssize_t k = recv(n, &id, sizeof id, MSG_WAITALL);
	if (k < 0 && errno == EAGAIN)
		hung("late server", "recv of the id");
	CHECK_EQ(k, (ssize_t)sizeof id);
	CHECK_EQ(id, 0xC1F00Du);
	ack = id ^ 0xFFFFFFFFu;
	CHECK_EQ(send(n, &ack, sizeof ack, MSG_NOSIGNAL), (ssize_t)sizeof ack);
	CHECK_EQ(pthread_join(t, NULL), 0);
	if (!tcp_after)
		expect_transport(lt.fd);
	SYS(close(lt.fd));
	SYS(close(n));
	SYS(close(l));
	printf("late accept%s: answered on %s\n", blind ? ", client in another namespace" : "",
	       !sdp ? "kernel TCP" : tcp_after ? "TCP (given up on the attach)" : "SDP");
}

int main(void)
{
	const char *e = getenv("TL_ROUNDS");
	int rounds = e && atoi(e) > 0 ? atoi(e) : ROUNDS;
	/* the watchdog only backs up the waits' own 10 s bound */
	tl_watchdog(rounds <= ROUNDS ? 50 : 50 + (unsigned)rounds);
	int echoed = 0, refused = 0, reset = 0, eof = 0, sdp = 0;
	for (int round = 0; round < rounds; round++) {
		struct round r = { 0 };
		r.l = tl_listen(AF_INET, &r.port);
		pthread_t at, ct[NCLIENT];
		struct client cl[NCLIENT];
		CHECK_EQ(pthread_create(&at, NULL, acceptor, &r), 0);
		for (int i = 0; i < NCLIENT; i++) {
			cl[i] = (struct client){ &r, i };
			CHECK_EQ(pthread_create(&ct[i], NULL, client, &cl[i]), 0);
		}
		/* stop after 0 .. NCLIENT * PER / 2 connections, clients still
		 * connecting (they do at most NCLIENT * PER) */
		int want = round % (NCLIENT * PER / 2 + 1);
		while (atomic_load(&r.connected) < want)
			sched_yield();
		atomic_store(&r.closed, true);
		SYS(shutdown(r.l, SHUT_RDWR));
		SYS(close(r.l));
		for (int i = 0; i < NCLIENT; i++)
			CHECK_EQ(pthread_join(ct[i], NULL), 0);
		CHECK_EQ(pthread_join(at, NULL), 0);
		/* every client that connected got its answer or an error */
		CHECK_EQ(atomic_load(&r.echoed) + atomic_load(&r.reset) + atomic_load(&r.eof),
			 atomic_load(&r.connected));
		CHECK_EQ(atomic_load(&r.echoed), atomic_load(&r.accepted));
		echoed += atomic_load(&r.echoed);
		refused += atomic_load(&r.refused);
		reset += atomic_load(&r.reset);
		eof += atomic_load(&r.eof);
		sdp += atomic_load(&r.sdp);
	}
	printf("%d rounds: %d connections echoed (%d over SDP), %d refused, %d reset, "
	       "%d EOF\n", rounds, echoed, sdp, refused, reset, eof);
	CHECK(echoed > 0);
	if (tl_sdp_mode())
		CHECK(sdp > 0, "no connection over SDP");
	late_case(false);
	late_case(true);
	return 0;
}
