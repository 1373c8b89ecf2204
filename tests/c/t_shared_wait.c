/*
 * Two threads wait on one socket at once, for different things: on each
 * end of each connection a sender thread waits for room and a receiver
 * thread for data, both directions at the same time, random sizes. Case
 * "poll": nonblocking sockets, each thread poll()s before every call (as
 * CPython does for sockets with a timeout) with no timeout. Case
 * "blocking": blocking send and recv from the two threads. Every wake-up
 * meant for one thread must reach it even when the other thread is the
 * one watching the socket: a lost one hangs here (the watchdog names
 * where). The streams move in rounds: at the end of each, the senders
 * are done and stop waiting while the receivers still wait for the last
 * bytes - the moment a lost wake-up is no longer covered by a later one.
 * The poll sets also hold idle pipes, as event loops' sets do, which
 * widens the windows between looking and sleeping, and threads that only
 * burn CPU keep the waiters being preempted at arbitrary points (more
 * runnable threads than CPUs, as on a busy server). Small rings
 * (PROG_ENV in test_c_features.py) make the senders wait for room often.
 * Streams are pattern-verified.
 */
#include "testlib.h"
#include <pthread.h>
#include <stdatomic.h>

#define NCONN  16
#define ROUND  (64u << 10)
#define ROUNDS 128
#define BYTES  ((uint64_t)ROUND * ROUNDS)
#define MAXIO  (64u << 10)
#define NPIPES 64
#define NBURN  3

static _Atomic bool burning;

static bool use_poll;
static int idle_pipe[NPIPES];           /* read ends nobody writes to */

struct half {
	int fd;
	uint32_t seed_tx, seed_rx;
	uint32_t rng;
	pthread_barrier_t *round;       /* the four threads of a connection */
};

static uint32_t rnd(uint32_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 17;
	*s ^= *s << 5;
	return *s;
}

/* 1 .. MAXIO, mostly small: log-uniform. */
static size_t io_size(uint32_t *s)
{
	size_t n = (size_t)1 << (rnd(s) % 17);
	return n + rnd(s) % n;
}

static void wait_for(int fd, short ev)
{
	if (!use_poll)
		return;
	struct pollfd p[1 + NPIPES];
	p[0] = (struct pollfd){ fd, ev, 0 };
	for (int i = 0; i < NPIPES; i++)
		p[1 + i] = (struct pollfd){ idle_pipe[i], POLLIN, 0 };
	int r;
	do
		r = poll(p, 1 + NPIPES, -1);
	while (r < 0 && errno == EINTR);
	CHECK(r == 1, "poll(%s)", ev == POLLIN ? "POLLIN" : "POLLOUT");
	CHECK(!(p[0].revents & (POLLERR | POLLNVAL)), "revents 0x%x", p[0].revents);
}

static void round_end(struct half *h, uint64_t off)
{
	if (off % ROUND == 0) {
		int r = pthread_barrier_wait(h->round);
		CHECK(r == 0 || r == PTHREAD_BARRIER_SERIAL_THREAD);
	}
}

static void *sender(void *arg)
{
	struct half *h = arg;
	static __thread char buf[2 * MAXIO];
	uint32_t s = h->rng;
	for (uint64_t off = 0; off < BYTES;) {
		size_t n = io_size(&s);
		if (n > ROUND - off % ROUND)
			n = ROUND - off % ROUND;
		tl_fill(buf, n, off, h->seed_tx);
		wait_for(h->fd, POLLOUT);
		ssize_t k = send(h->fd, buf, n, MSG_NOSIGNAL);
		if (k < 0 && use_poll && errno == EAGAIN)
			continue;             /* the other thread was quicker: again */
		CHECK(k > 0, "send of %zu at %llu", n, (unsigned long long)off);
		off += (uint64_t)k;
		round_end(h, off);
	}
	return NULL;
}

static void *receiver(void *arg)
{
	struct half *h = arg;
	static __thread char buf[2 * MAXIO];
	uint32_t s = h->rng ^ 0x9e3779b9u;
	for (uint64_t off = 0; off < BYTES;) {
		size_t n = io_size(&s);
		if (n > ROUND - off % ROUND)
			n = ROUND - off % ROUND;
		wait_for(h->fd, POLLIN);
		ssize_t k = recv(h->fd, buf, n, 0);
		if (k < 0 && use_poll && errno == EAGAIN)
			continue;
		CHECK(k > 0, "recv at %llu", (unsigned long long)off);
		CHECK_PAT(buf, (size_t)k, off, h->seed_rx);
		off += (uint64_t)k;
		round_end(h, off);
	}
	return NULL;
}

static void *burner(void *arg)
{
	(void)arg;
	while (atomic_load_explicit(&burning, memory_order_relaxed))
		__asm__ volatile("" ::: "memory");
	return NULL;
}

static void run(void)
{
	struct half h[2 * NCONN];
	pthread_t t[4 * NCONN];
	static pthread_barrier_t round[NCONN];
	for (int i = 0; i < NPIPES; i++) {
		int p[2];
		SYS(pipe(p));
		idle_pipe[i] = p[0];      /* the write end stays open, unused */
	}
	for (int i = 0; i < NCONN; i++) {
		CHECK(pthread_barrier_init(&round[i], NULL, 4) == 0);
		int cli, srv;
		tl_pair(AF_INET, &cli, &srv);
		expect_transport(cli);
		expect_transport(srv);
		if (use_poll) {
			SYS(fcntl(cli, F_SETFL, O_NONBLOCK));
			SYS(fcntl(srv, F_SETFL, O_NONBLOCK));
		}
		uint32_t a = 1000u + (uint32_t)i, b = 2000u + (uint32_t)i;
		h[2 * i] = (struct half){ cli, a, b, 0x1234567u * (uint32_t)(i + 1),
					  &round[i] };
		h[2 * i + 1] = (struct half){ srv, b, a, 0x7654321u * (uint32_t)(i + 1),
					      &round[i] };
	}
	pthread_t burn[NBURN];
	atomic_store(&burning, true);
	for (int i = 0; i < NBURN; i++)
		CHECK(pthread_create(&burn[i], NULL, burner, NULL) == 0);
	for (int i = 0; i < 2 * NCONN; i++) {
		CHECK(pthread_create(&t[2 * i], NULL, sender, &h[i]) == 0);
		CHECK(pthread_create(&t[2 * i + 1], NULL, receiver, &h[i]) == 0);
	}
	for (int i = 0; i < 4 * NCONN; i++)
		pthread_join(t[i], NULL);
	atomic_store(&burning, false);
	for (int i = 0; i < NBURN; i++)
		pthread_join(burn[i], NULL);
	for (int i = 0; i < 2 * NCONN; i++) {
		expect_bytes(h[i].fd, BYTES, BYTES);
		SYS(close(h[i].fd));
	}
}

static void case_poll(void)
{
	tl_watchdog(60);
	use_poll = true;
	run();
}

static void case_blocking(void)
{
	tl_watchdog(60);
	use_poll = false;
	run();
}

int main(void)
{
	static const struct tl_case cases[] = {
		{ "poll", case_poll },
		{ "blocking", case_blocking },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
