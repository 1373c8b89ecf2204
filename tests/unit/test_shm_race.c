/*
 * test_shm_race.c - the shm provider's views of a connection stay sane
 * while both processes and several threads of one of them advance the
 * counters at full speed (src/fabric/shm.c).
 *
 * One region, both sides in this process. Threads play: our receiver and
 * our sender (side 0), the peer's sender and receiver (side 1), the peer
 * sending and us taking wake-up tokens, and an observer on side 0 that -
 * as poll(), a waiting sender or the other thread of an application does -
 * asks peer_sane(), credits() and rx_pending() without holding any
 * lock. With three busy threads per CPU the observer is often preempted
 * between two loads: every answer must still be one an honest peer can
 * produce (sane, at most nslots credits, at most nslots pending).
 * Exit status 0 when every check passes, 1 otherwise.
 */
#include "fabric/fabric.h"
#include "fabric/shm_layout.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define NSLOTS    4
#define SLOT_SIZE 256
#define RUN_NS    (1500ull * 1000000ull)

static struct fab_ep ep0, ep1;         /* side 0 (observed), side 1 (peer) */
static _Atomic int stop;
static _Atomic unsigned long observed, bad_sane, bad_credits, bad_pending;
static const char *why[8];             /* distinct reasons given */
static unsigned long why_n[8];
static pthread_mutex_t why_lock = PTHREAD_MUTEX_INITIALIZER;

static void note_insane(const char *w)
{
	pthread_mutex_lock(&why_lock);
	for (int i = 0; i < 8; i++) {
		if (!why[i])
			why[i] = w;
		if (why[i] == w) {
			why_n[i]++;
			break;
		}
	}
	pthread_mutex_unlock(&why_lock);
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void *sender(void *arg)
{
	struct fab_ep *ep = arg;
	while (!atomic_load(&stop)) {
		if (ep->ops->credits(ep) == 0) {
			sched_yield();
			continue;
		}
		size_t cap;
		char *b = ep->ops->tx_buf(ep, &cap);
		memset(b, 0x5a, 16);
		ep->ops->post(ep, 16);
	}
	return NULL;
}

static void *receiver(void *arg)
{
	struct fab_ep *ep = arg;
	while (!atomic_load(&stop)) {
		const void *m;
		size_t cap;
		if (ep->ops->rx_peek(ep, 0, &m, &cap) == 0)
			ep->ops->rx_release(ep);
		else
			sched_yield();
	}
	return NULL;
}

/* The peer announces wake-up tokens; we take what it announced. */
static void *tokens(void *arg)
{
	(void)arg;
	struct shm_hdr *h = ep0.base;
	while (!atomic_load(&stop)) {
		atomic_fetch_add(&h->side[1].tokens_sent, 1);
		uint64_t sent = atomic_load(&h->side[1].tokens_sent);
		static const unsigned char tok = SHM_TOKEN_BYTE;
		if (atomic_load(&SE(&ep0)->my_tokens_rcvd) < sent)
			ep0.ops->tokens_took(&ep0, &tok, 1);
		if ((sent & 63) == 0)
			sched_yield();
	}
	return NULL;
}

static void *observer(void *arg)
{
	(void)arg;
	while (!atomic_load(&stop)) {
		const char *w = "?";
		if (!ep0.ops->peer_sane(&ep0, &w)) {
			atomic_fetch_add(&bad_sane, 1);
			note_insane(w);
		}
		if (ep0.ops->credits(&ep0) > NSLOTS)
			atomic_fetch_add(&bad_credits, 1);
		if (ep0.ops->rx_pending(&ep0) > NSLOTS)
			atomic_fetch_add(&bad_pending, 1);
		atomic_fetch_add_explicit(&observed, 1, memory_order_relaxed);
	}
	return NULL;
}

int main(void)
{
	const struct fab_ops *ops = &fab_shm_ops;
	struct fab_params fp = { .region_cache = 0 };   /* a region of its own */
	ops->init(&fp);
	struct fab_setup su = { .nslots = NSLOTS, .slot_size = SLOT_SIZE, .token = 42,
				.pid = (int32_t)getpid() };
	struct fab_offer o;
	int r = ops->offer(&ep0, &su, &o);
	if (r < 0) {
		fprintf(stderr, "offer: %s\n", strerror(-r));
		return 1;
	}
	r = ops->accept(&ep1, &su, &o);
	if (r < 0) {
		fprintf(stderr, "accept: %s\n", strerror(-r));
		return 1;
	}
	pthread_t t[7];
	void *(*fn[7])(void *) = { sender, receiver, sender, receiver, tokens,
				   observer, observer };
	void *args[7] = { &ep0, &ep0, &ep1, &ep1, NULL, NULL, NULL };
	for (int i = 0; i < 7; i++)
		pthread_create(&t[i], NULL, fn[i], args[i]);
	uint64_t end = now_ns() + RUN_NS;
	while (now_ns() < end)
		usleep(10000);
	atomic_store(&stop, 1);
	for (int i = 0; i < 7; i++)
		pthread_join(t[i], NULL);

	uint64_t sent0 = ep0.ops->tx_seq(&ep0), sent1 = ep1.ops->tx_seq(&ep1);
	printf("%lu observations; messages 0->1 %lu, 1->0 %lu\n",
	       (unsigned long)observed, (unsigned long)sent0, (unsigned long)sent1);
	int fail = 0;
	if (bad_sane) {
		fprintf(stderr, "an honest peer looked insane %lu times:\n",
			(unsigned long)bad_sane);
		for (int i = 0; i < 8 && why[i]; i++)
			fprintf(stderr, "  %lu x %s\n", (unsigned long)why_n[i], why[i]);
		fail = 1;
	}
	if (bad_credits) {
		fprintf(stderr, "more than %d credits %lu times\n", NSLOTS,
			(unsigned long)bad_credits);
		fail = 1;
	}
	if (bad_pending) {
		fprintf(stderr, "more than %d messages pending %lu times\n", NSLOTS,
			(unsigned long)bad_pending);
		fail = 1;
	}
	if (sent0 < 200 || sent1 < 200) {
		fprintf(stderr, "the counters hardly moved: nothing was tested\n");
		fail = 1;
	}
	ops->unmap(&ep1);
	ops->unmap(&ep0);
	close(o.fds[0]);
	return fail;
}
