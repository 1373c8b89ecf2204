/*
 * ofi_chan.c - the ofi provider's data path: the message channel with
 * credits, the control blocks, wake-ups, marks and what a fallback reads;
 * and the ops table (fab_ofi_ops).
 *
 * Message channel (Buffer Copy over FI_MSG, as in the SDP papers): the
 * receiver posts nslots + OFI_KICKS receive buffers; each engine message
 * is one FI_MSG send from our tx ring into the next one, i.e. one credit.
 * Credits come back BSDH-style: every message carries the sender's
 * consumption of ours (mseq_ack), and the receiver copies its control
 * block (cons among it) with an RDMA Write when the sender may be waiting,
 * when its queue ran empty, or every nslots/8 messages.
 *
 * State words (marks, byte window, zero-copy words): each side's
 * control block (struct ofi_ctl) is written by it and copied into the
 * peer's ctl[1] with one RDMA Write of 256 bytes; the engine reads the
 * peer's words there without a lock, as on shm.
 *
 * Wake-ups: a message that arrives completes on the receiver's CQ, whose
 * wait object is in the connection's wait descriptor: a receiver asleep
 * for data needs nothing more. A side that sleeps for credits or zero-
 * copy words "arms": it records what it waits for and the peer's version
 * it has seen, copies its block and sends an 8-byte kick, which wakes the
 * peer; the peer kicks back once it has (or gets) a newer version than
 * the one seen. Marks always come with a kick. At most OFI_KICKS kicks
 * are in flight each way (the receiver's kicks_reaped bounds them); a
 * side that has that many out does not need to send another: the peer
 * will wake for those.
 */
#include <errno.h>
#include <poll.h>
#include <sched.h>
#include <string.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fabric/ofi.h"
#include "sdp/sys.h"

/* ---- which connection ---------------------------------------------------- */

struct ofi_conn *ofi_of(struct fab_ep *ep)
{
	struct ofi_conn *oc = ep->base;
	/* A forked process has a copy of the pointer, not of the objects:
	 * only the process that set the endpoint up may use it. */
	if (!oc || oc->owner != ofi_p.pid)
		return NULL;
	return oc;
}

static int state(struct ofi_conn *oc)
{
	return atomic_load_explicit(&oc->state, memory_order_acquire);
}

static void relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#else
	sched_yield();
#endif
}

/* ---- the backlog: sends the fabric may still hold --------------------------- */

static uint64_t peer_cons(struct ofi_conn *oc);

/* Sends not known to have left libfabric: a send or an RDMA operation not
 * completed, or an injected message (a copy queued without a completion:
 * the tcp provider holds it as it holds a send when the socket is full)
 * the peer has not consumed yet. */
static bool has_backlog(struct ofi_conn *oc)
{
	return atomic_load_explicit(&oc->tx_out, memory_order_relaxed) ||
	       atomic_load_explicit(&oc->misc_busy, memory_order_relaxed) ||
	       peer_cons(oc) < atomic_load_explicit(&oc->inj_hi, memory_order_relaxed);
}

/*
 * The backlog list and each connection's in_bk change together, under
 * bklock (in_bk is read without it only as a hint). The walk below reads
 * queues while it holds bklock, and a read may post (a control block's
 * copy, a kick) and so list a connection: the walking thread already owns
 * the lock then (bk_walker), and must not take it again.
 */
static __thread bool bk_walker;

static void bk_lock(void)
{
	if (!bk_walker)
		pthread_mutex_lock(&ofi_p.bklock);
}

static void bk_unlock(void)
{
	if (!bk_walker)
		pthread_mutex_unlock(&ofi_p.bklock);
}

/* Just posted: on the list until a read of its queue finds all done. */
static void bk_add(struct ofi_conn *oc)
{
	if (atomic_load_explicit(&oc->in_bk, memory_order_relaxed))
		return;
	bk_lock();
	if (!atomic_load(&oc->in_bk) && !atomic_load(&oc->dead) &&
	    ofi_p.nbk < (int)(sizeof ofi_p.bk / sizeof ofi_p.bk[0])) {
		ofi_p.bk[ofi_p.nbk++] = oc;       /* full: its own calls move it */
		atomic_store(&oc->in_bk, true);
	}
	bk_unlock();
}

static void bk_del_locked(struct ofi_conn *oc)
{
	for (int i = 0; i < ofi_p.nbk; i++)
		if (ofi_p.bk[i] == oc) {
			ofi_p.bk[i] = ofi_p.bk[--ofi_p.nbk];
			break;
		}
	atomic_store(&oc->in_bk, false);
}

void ofi_bk_del(struct ofi_conn *oc)
{
	if (!atomic_load(&oc->in_bk))
		return;
	bk_lock();
	bk_del_locked(oc);
	bk_unlock();
}

/* A connection being freed (dead already set): off the list for sure. */
void ofi_bk_forget(struct ofi_conn *oc)
{
	bk_lock();
	bk_del_locked(oc);
	bk_unlock();
}

/*
 * Read the queues of the connections on the backlog list (other than
 * self): over the tcp provider, bytes of a send the kernel could not take
 * at once wait in libfabric until that endpoint's queue is read, where
 * TCP's kernel would send them by itself - a receiver in this process, or
 * a peer waiting for them, would wait for ever for a connection nobody
 * calls. A connection whose sends all completed leaves the list.
 *
 * The list holds every connection with an injected message its peer has
 * not consumed yet: a server's every client that has an answer and has
 * not sent its next request (redis with 600 clients: the whole list). So
 * one walk reads at most OFI_BK_BUDGET queues (round robin: each listed
 * connection within a few walks), and after a walk that found nothing to
 * reap the next one starts no sooner than eight times its length later
 * (and OFI_BK_TICKS at least): such walks take at most about a ninth of
 * the process's time, however many connections are listed. After one
 * that reaped (held sends went out) the next may start OFI_BK_TICKS after
 * its start, as before. Reading the whole list every ~15 us made each
 * walk cost 256 system calls and left nothing else running: redis-
 * benchmark with 600 clients did not finish 6,000 requests in 60 s.
 */
#define OFI_BK_BUDGET 32
#define OFI_BK_TICKS (32u << 10)     /* fab_clock: about 10-20 us at least between
				      * two walks */

void ofi_backlog(struct ofi_conn *self)
{
	if (!atomic_load_explicit(&ofi_p.nbk, memory_order_relaxed) ||
	    bk_walker || pthread_mutex_trylock(&ofi_p.bklock))
		return;
	bk_walker = true;
	uint64_t t0 = fab_clock();
	bool moved = false;
	for (int k = 0; k < OFI_BK_BUDGET && ofi_p.nbk > 0; k++) {
		if (ofi_p.bk_next >= ofi_p.nbk)
			ofi_p.bk_next = 0;
		int i = ofi_p.bk_next++;
		struct ofi_conn *oc = ofi_p.bk[i];
		if (oc == self)
			continue;
		if (oc->owner != ofi_p.pid || atomic_load(&oc->dead) ||
		    atomic_load(&oc->state) != OFI_ST_UP) {
			bk_del_locked(oc);            /* the last one moves to i */
			ofi_p.bk_next = i;
			continue;
		}
		if (pthread_mutex_trylock(&oc->cqlock))
			continue;
		uint64_t before = atomic_load_explicit(&oc->reaps, memory_order_relaxed);
		bool drained = ofi_reap(oc, false);
		pthread_mutex_unlock(&oc->cqlock);
		moved |= before != atomic_load_explicit(&oc->reaps, memory_order_relaxed);
		if (drained && !has_backlog(oc)) {
			bk_del_locked(oc);
			ofi_p.bk_next = i;
		}
		if (k + 1 >= ofi_p.nbk)
			break;                        /* each listed one once */
	}
	/* A walk that moved something (completions reaped: held sends went
	 * out) was work the kernel does for TCP: the next may start soon. */
	uint64_t t1 = fab_clock(), pause = 8 * (t1 - t0);
	atomic_store_explicit(&ofi_p.bk_tick, moved ? t0 + OFI_BK_TICKS :
			      t1 + (pause > OFI_BK_TICKS ? pause : OFI_BK_TICKS),
			      memory_order_relaxed);
	bk_walker = false;
	pthread_mutex_unlock(&ofi_p.bklock);
}

/* May a walk start now (ofi_p.bk_tick)? */
static bool bk_due(void)
{
	return (int64_t)(fab_clock() - atomic_load_explicit(&ofi_p.bk_tick,
							     memory_order_relaxed)) >= 0;
}

/*
 * The process's sleeps (wait.c, poll.c, epoll.c; fabric.h): while the
 * backlog list is not empty a sleep lasts at most OFI_HELD_MS and pushes
 * the held sends before it (and so after each wake, before the next).
 * Not their wait objects: the tcp provider's queue says nothing when its
 * socket can take bytes again, and a peer that does not read keeps them
 * held - a timer costs a few system calls per OFI_HELD_MS then, a spin
 * never. The list empty (no ofi connection sends, or none in this
 * process): one load, nothing else.
 */
#define OFI_HELD_MS 2

int fab_held_ms(int ms)
{
	if (!atomic_load_explicit(&ofi_p.nbk, memory_order_relaxed))
		return ms;
	return ms < 0 || ms > OFI_HELD_MS ? OFI_HELD_MS : ms;
}

void fab_held_push(void)
{
	/* A walk a moment ago (the arm of the sleeper's own ofi connection
	 * makes one) is enough. */
	if (!atomic_load_explicit(&ofi_p.nbk, memory_order_relaxed) || !bk_due())
		return;
	fab_private++;
	ofi_backlog(NULL);
	fab_private--;
}

/* ---- posting ------------------------------------------------------------- */

int ofi_post_recv(struct ofi_conn *oc, uint32_t buf)
{
	struct ofi_op *op = &oc->rxop[buf];
	op->kind = OFI_OP_RECV;
	op->idx = buf;
	for (int tries = 0;; tries++) {
		ssize_t r = fi_recv(oc->ep, oc->rx + (size_t)buf * oc->slot_size,
				    oc->slot_size, oc->desc, 0, &op->ctx);
		if (r != -FI_EAGAIN)
			return (int)r;
		if (tries > 1000000)
			return -EAGAIN;
		ofi_progress(oc);
		relax();
	}
}

struct ofi_op *ofi_misc_op(struct ofi_conn *oc)
{
	/* Bounded: wait for one to complete if all are in flight. */
	for (int i = 0; atomic_load(&oc->misc_busy) >= OFI_MISC_CTX - 1; i++) {
		if (state(oc) == OFI_ST_DOWN || i > 10000000)
			return NULL;
		ofi_progress(oc);
		relax();
	}
	atomic_fetch_add(&oc->misc_busy, 1);
	bk_add(oc);
	uint32_t k = atomic_fetch_add(&oc->misc_next, 1) % OFI_MISC_CTX;
	struct ofi_op *op = &oc->miscop[k];
	op->kind = OFI_OP_MISC;
	op->idx = k;
	return op;
}

void ofi_misc_done(struct ofi_conn *oc)
{
	atomic_fetch_sub(&oc->misc_busy, 1);
}

/* Retry an operation the provider's queue refused for now. */
#define OFI_RETRY(oc, call) ({                                              \
	ssize_t r_;                                                         \
	for (int t_ = 0;; t_++) {                                           \
		r_ = (call);                                                \
		if (r_ != -FI_EAGAIN || state(oc) == OFI_ST_DOWN ||         \
		    t_ > 10000000)                                          \
			break;                                              \
		ofi_progress(oc);                                           \
		relax();                                                    \
	}                                                                   \
	r_; })

/* Copy our control block into the peer's ctl[1] (RDMA Write). A change
 * the peer may wait for bumps the version; our own arm does not (else two
 * sleepers would wake each other for ever). */
static int publish(struct ofi_conn *oc, bool bump)
{
	if (state(oc) != OFI_ST_UP)
		return 0;
	struct ofi_ctl *m = oc->me;
	if (bump) {
		uint64_t v = atomic_load(&m->vers_head) + 1;
		atomic_store(&m->vers_head, v);
		atomic_store(&m->vers_tail, v);
	}
	atomic_store(&oc->published, atomic_load(&m->cons));
	memcpy(&oc->zc_sent, &m->zc, sizeof oc->zc_sent);
	struct ofi_op *op = ofi_misc_op(oc);
	if (!op)
		return -ECONNRESET;
	ssize_t r = OFI_RETRY(oc, fi_write(oc->ep, m, sizeof *m, oc->desc, 0,
					   oc->peer_ctl_addr, oc->peer_ctl_key, &op->ctx));
	if (r) {
		ofi_misc_done(oc);
		ofi_fail(oc, (int)r, "RDMA Write of the control block");
		return (int)r;
	}
	return 0;
}

int ofi_publish(struct ofi_conn *oc)
{
	return publish(oc, true);
}

/*
 * The copy a consumption needs (after each message of a ping-pong): the
 * block's second half only - every word but the zero-copy ones, versions
 * at both ends - is 128 bytes, what the tcp provider injects (copied at
 * once, no completion to reap, no wake-up of our own queue). A full copy
 * when the zero-copy words differ from those of the last full one, or the
 * provider cannot inject that much. Ordered before later copies and messages
 * (FI_ORDER_WAW, FI_ORDER_WAS) like any.
 */
static int publish_cons(struct ofi_conn *oc)
{
	enum { HALF = sizeof(struct ofi_ctl) - offsetof(struct ofi_ctl, vers_head) };
	_Static_assert(HALF == 128, "the block's second half is 128 bytes");
	if (state(oc) != OFI_ST_UP)
		return 0;
	if (oc->dom->inject < HALF || memcmp(&oc->me->zc, &oc->zc_sent, sizeof oc->zc_sent))
		return publish(oc, true);
	struct ofi_ctl *m = oc->me;
	uint64_t v = atomic_load(&m->vers_head) + 1;
	atomic_store(&m->vers_head, v);
	atomic_store(&m->vers_tail, v);
	atomic_store(&oc->published, atomic_load(&m->cons));
	ssize_t r = OFI_RETRY(oc, fi_inject_write(oc->ep, &m->vers_head, HALF, 0,
						  oc->peer_ctl_addr + offsetof(struct ofi_ctl, vers_head),
						  oc->peer_ctl_key));
	if (r) {
		ofi_fail(oc, (int)r, "RDMA Write of the control block");
		return (int)r;
	}
	bk_add(oc);
	return 0;
}

static int flush(struct ofi_conn *oc, uint64_t upto);

/* Send a wake-up, if fewer than OFI_KICKS are in flight. 1 sent, 0 not. */
static int send_kick(struct ofi_conn *oc)
{
	uint32_t sent = atomic_load(&oc->kicks_sent);
	uint64_t reaped = atomic_load_explicit(&oc->peer->kicks_reaped, memory_order_acquire);
	/* All in flight: the peer is waking for them, and will say so
	 * (kicks_reaped) - wait for that, briefly: a kick skipped here could
	 * be the one that carries an arm the peer reads too early. */
	uint64_t until = 0;
	while ((uint64_t)sent - reaped >= OFI_KICKS) {
		uint64_t now = ofi_now_ns();
		if (!until)
			until = now + 100000000ull;
		if (now > until || state(oc) != OFI_ST_UP)
			return 0;
		ofi_progress(oc);
		relax();
		reaped = atomic_load_explicit(&oc->peer->kicks_reaped, memory_order_acquire);
	}
	atomic_fetch_add(&oc->kicks_sent, 1);
	oc->kick->magic = OFI_KICK_MAGIC;
	oc->kick->seq = sent + 1;
	ssize_t r;
	if (oc->dom->inject >= sizeof *oc->kick) {
		r = OFI_RETRY(oc, fi_inject(oc->ep, oc->kick, sizeof *oc->kick, 0));
	} else {
		struct ofi_op *op = ofi_misc_op(oc);
		if (!op)
			return 0;
		r = OFI_RETRY(oc, fi_send(oc->ep, oc->kick, sizeof *oc->kick, oc->desc, 0,
					  &op->ctx));
		if (r)
			ofi_misc_done(oc);
	}
	if (r) {
		ofi_fail(oc, (int)r, "send of a wake-up");
		return 0;
	}
	return 1;
}

/* The peer's version as we have it: the older end of a copy in progress. */
static uint64_t peer_version(struct ofi_conn *oc)
{
	uint64_t t = atomic_load_explicit(&oc->peer->vers_tail, memory_order_acquire);
	uint64_t h = atomic_load_explicit(&oc->peer->vers_head, memory_order_acquire);
	return h < t ? h : t;
}

/* After our state moved or the peer's arm arrived: does the peer sleep
 * for something we have published since it looked? Then kick it, once
 * per arm. Also publish consumption it may be waiting for. */
static int service(struct ofi_conn *oc)
{
	struct ofi_ctl *p = oc->peer, *m = oc->me;
	uint32_t armed = atomic_load_explicit(&p->armed, memory_order_acquire);
	if (!armed)
		return 0;
	if ((armed & FAB_WAIT_CREDIT) &&
	    atomic_load(&m->cons) != atomic_load(&oc->published))
		ofi_publish(oc);
	uint32_t seq = atomic_load_explicit(&p->arm_seq, memory_order_acquire);
	if (seq == atomic_load(&oc->kicked_for))
		return 0;
	uint64_t seen = atomic_load_explicit(&p->seen, memory_order_acquire);
	uint64_t mine = atomic_load(&m->vers_head);
	if (seen >= mine)
		return 0;                     /* it saw all we published */
	atomic_store(&oc->kicked_for, seq);
	return send_kick(oc);
}

/* ---- progress: reap the completion queue --------------------------------- */

static void on_recv(struct ofi_conn *oc, struct ofi_op *op, size_t len, bool *kicked)
{
	uint32_t buf = op->idx;
	const char *m = oc->rx + (size_t)buf * oc->slot_size;
	if (len == sizeof(struct ofi_kick)) {
		struct ofi_kick k;
		memcpy(&k, m, sizeof k);
		if (k.magic == OFI_KICK_MAGIC) {
			uint64_t n = atomic_fetch_add(&oc->kicks_reaped, 1) + 1;
			atomic_store(&oc->me->kicks_reaped, n);
			*kicked = true;
			if (ofi_post_recv(oc, buf))
				ofi_fail(oc, -EIO, "re-posting a receive buffer");
			return;
		}
	}
	if (len < sizeof(struct sdp_bsdh) || len > oc->slot_size) {
		ofi_fail(oc, -EPROTO, "a message of impossible length");
		return;
	}
	uint64_t a = atomic_load_explicit(&oc->arrived, memory_order_relaxed);
	if (a - atomic_load(&oc->cons) >= oc->nslots) {
		ofi_fail(oc, -EPROTO, "more messages than credits");
		return;
	}
	/* BSDH-style credit: the sender's consumption of our messages. */
	struct sdp_bsdh h;
	memcpy(&h, m, sizeof h);
	uint64_t prod = atomic_load(&oc->tx_prod), known = atomic_load(&oc->peer_cons);
	uint64_t ack = prod - (uint32_t)((uint32_t)prod - h.mseq_ack);
	if (ack <= prod && ack > known && prod - ack <= oc->nslots)
		atomic_store(&oc->peer_cons, ack);
	oc->order[a % oc->nbufs] = buf;
	if (a == atomic_load(&oc->cons))
		atomic_store_explicit(&oc->since, fab_clock(), memory_order_relaxed);
	atomic_store_explicit(&oc->arrived, a + 1, memory_order_release);
}

static void after_reap(struct ofi_conn *oc, bool kicked)
{
	/* The peer may sleep for words we have moved, or have armed just
	 * now (its kick brought the arm). */
	if (kicked || atomic_load_explicit(&oc->peer->armed, memory_order_relaxed))
		service(oc);
	/* Tell the peer we took its kicks before it runs out of them. */
	if (kicked) {
		uint32_t sent_by_peer = (uint32_t)atomic_load(&oc->kicks_reaped);
		if (sent_by_peer % (OFI_KICKS / 2) == 0)
			publish(oc, false);
	}
}

static void on_error(struct ofi_conn *oc, struct fi_cq_err_entry *ee)
{
	struct ofi_op *op = ee->op_context;
	int e = ee->err ? ee->err : EIO;
	if (op->kind == OFI_OP_READ) {
		/* the caller of the read decides (ofi_mr.c) */
		atomic_store(&oc->read_err, -e);
		atomic_fetch_add(&oc->reads_done, 1);
		ofi_misc_done(oc);
		return;
	}
	if (op->kind == OFI_OP_MISC)
		ofi_misc_done(oc);
	if (op->kind == OFI_OP_SEND)
		atomic_fetch_sub_explicit(&oc->tx_out, 1, memory_order_relaxed);
	if (ee->err == FI_ECANCELED)
		return;
	ofi_fail(oc, -e, "a fabric operation failed");
}

/* Read the connection's own queue (under oc->cqlock). dying: its
 * endpoint is closed, what is left is only dropped. */
bool ofi_reap(struct ofi_conn *oc, bool dying)
{
	struct fi_cq_msg_entry ev[16];
	bool kicked = false, drained = false;
	if (!oc->cq)
		return true;
	for (int rounds = 0; rounds < 64; rounds++) {
		ssize_t n = fi_cq_read(oc->cq, ev, 16);
		if (n == -FI_EAGAIN) {
			drained = true;
			break;
		}
		if (n == -FI_EAVAIL) {
			struct fi_cq_err_entry ee;
			memset(&ee, 0, sizeof ee);
			if (fi_cq_readerr(oc->cq, &ee, 0) < 0)
				break;
			struct ofi_op *op = ee.op_context;
			if (op && !dying)
				on_error(oc, &ee);
			continue;
		}
		if (n < 0)
			break;
		atomic_fetch_add_explicit(&oc->reaps, (uint64_t)n, memory_order_relaxed);
		if (dying)
			continue;
		bool arrived = false;
		for (ssize_t i = 0; i < n; i++) {
			struct ofi_op *op = ev[i].op_context;
			if (!op)
				continue;
			if (op->kind == OFI_OP_RECV && (ev[i].flags & FI_RECV)) {
				on_recv(oc, op, ev[i].len, &kicked);
				arrived = true;
			} else if (op->kind == OFI_OP_SEND) {
				atomic_fetch_sub_explicit(&oc->tx_out, 1, memory_order_relaxed);
			} else if (op->kind == OFI_OP_MISC) {
				ofi_misc_done(oc);
			} else if (op->kind == OFI_OP_READ) {
				atomic_fetch_add(&oc->reads_done, 1);
				ofi_misc_done(oc);
			}
		}
		if (arrived)
			ofi_wake(oc);             /* a sleeper of oc may not be us */
	}
	if (kicked)
		after_reap(oc, true);
	return drained;
}

static void progress(struct ofi_conn *oc, bool now);

void ofi_progress(struct ofi_conn *oc)
{
	fab_private++;
	progress(oc, false);
	fab_private--;
}

void ofi_progress_now(struct ofi_conn *oc)
{
	fab_private++;
	progress(oc, true);
	fab_private--;
}

/*
 * Reading the queue is a system call or more (the tcp provider polls its
 * sockets each time), and one send or receive of the engine asks for
 * progress several times (pending messages, credits, marks). A queue read
 * to its end less than OFI_REAP_TICKS ago (fab_clock; about a microsecond)
 * is not read again: what arrived since is still signalled by its wait
 * object (the socket's readiness, or the provider's check before a sleep,
 * ofi_arm), a spinner looks again a microsecond later, and a wake-up reads
 * it at once (ofi_drain).
 */
#define OFI_REAP_TICKS 2048

static void progress(struct ofi_conn *oc, bool now)
{
	int st = state(oc);
	if (st != OFI_ST_UP) {
		if (st == OFI_ST_TCP || st == OFI_ST_DOWN)
			return;
		ofi_chan_progress(oc);
		if (pthread_mutex_trylock(&ofi_p.lock) == 0) {
			/* every domain: a connection set up in this process
			 * may wait on another one's events (its peer here) */
			for (int i = 0; i < OFI_MAX_DOMAINS; i++)
				if (ofi_p.dom[i].used)
					ofi_cm_progress(&ofi_p.dom[i]);
			pthread_mutex_unlock(&ofi_p.lock);
		}
		if (state(oc) != OFI_ST_UP)
			return;
	}
	/* Our own queue: reading it moves this endpoint's data (and only
	 * its). A queue another thread reads is left to it. */
	uint64_t t = fab_clock();
	uint64_t last = atomic_load_explicit(&oc->reap_tick, memory_order_relaxed);
	if ((now || t - last >= OFI_REAP_TICKS) && pthread_mutex_trylock(&oc->cqlock) == 0) {
		uint64_t before = atomic_load_explicit(&oc->reaps, memory_order_relaxed);
		bool drained = ofi_reap(oc, false);
		atomic_store_explicit(&oc->reap_tick, drained ? fab_clock() : 0,
				      memory_order_relaxed);
		pthread_mutex_unlock(&oc->cqlock);
		if (drained && atomic_load_explicit(&oc->in_bk, memory_order_relaxed) &&
		    !has_backlog(oc))
			ofi_bk_del(oc);
		/* Nothing for us: a moment for the others' held sends (at
		 * most every OFI_BK_TICKS, process-wide). */
		if (before == atomic_load_explicit(&oc->reaps, memory_order_relaxed) &&
		    ofi_p.nbk && bk_due())
			ofi_backlog(oc);
	}
	if (atomic_load_explicit(&oc->peer->armed, memory_order_relaxed))
		service(oc);
}

void ofi_wake(struct ofi_conn *oc)
{
	/* Dekker with ofi_arm: the arrival was stored before this look at
	 * the arm, the sleeper's arm (a read-modify-write of the same word)
	 * before its look at the arrivals. Both are read-modify-writes of
	 * local_armed, so one reads the other's: either this one sees the
	 * arm, or the sleeper's acquires this side's arrival. (Not a fence:
	 * ThreadSanitizer does not model fences.) */
	if (atomic_fetch_or_explicit(&oc->local_armed, 0, memory_order_seq_cst)) {
		uint64_t one = 1;
		ssize_t w = sys_write(oc->evfd, &one, sizeof one);
		(void)w;
	}
}

/* Did the fabric's own socket (found for the application's
 * TCP_USER_TIMEOUT, copy_user_timeout) close because that timeout ran out
 * while it retransmitted? libfabric then says only "not connected" or
 * "shut down", which would read as the peer's close. Only read: the
 * number may be another descriptor's by now. */
bool ofi_timed_out(struct ofi_conn *oc)
{
	struct tcp_info ti;
	socklen_t l = sizeof ti;
	return oc->utmo_ms > 0 && oc->fsock >= 0 &&
	       !sys_getsockopt(oc->fsock, IPPROTO_TCP, TCP_INFO, &ti, &l) &&
	       ti.tcpi_state == TCP_CLOSE &&
	       (ti.tcpi_retransmits || ti.tcpi_backoff || ti.tcpi_probes);
}

void ofi_fail(struct ofi_conn *oc, int err, const char *why)
{
	ofi_fail_if(oc, -1, err, why);
}

void ofi_fail_if(struct ofi_conn *oc, int expect, int err, const char *why)
{
	/* The fabric connection is broken: nothing more comes on it (the
	 * tcp provider fails the posted receives after the peer's last
	 * byte; it reports no FI_SHUTDOWN). Any thread may get here, several
	 * at once for one connection (a send, a reap, the set-up's progress):
	 * the state moves by compare-and-swap, and only the thread that moved
	 * it acts (the hello's socket closed twice could close another
	 * connection's descriptor that took its number). */
	bool was_shut = oc->peer_shut;
	oc->peer_shut = true;
	for (;;) {
		int st = state(oc);
		if (st == OFI_ST_DOWN || st == OFI_ST_TCP || (expect >= 0 && st != expect))
			return;               /* (a set-up's failure seen late) */
		int e = err < 0 ? err : -EIO;
		/* A link that timed out is no close of the peer's: reset, and
		 * the application hears ETIMEDOUT as from TCP (ofi_drain). */
		bool timed_out = st == OFI_ST_UP && ofi_timed_out(oc);
		if (timed_out) {
			e = -ETIMEDOUT;
			was_shut = false;
		}
		/* The peer never came up if it never copied its block to us
		 * (it does as it comes up): it closed or failed first, and
		 * consumed nothing. We may be up and have sent: the hand-back
		 * re-sends it all. */
		bool peer_never_up = atomic_load(&oc->peer->vers_head) == 0;
		if (st != OFI_ST_UP || peer_never_up) {
			/* Nothing was ever sent over the fabric: both ends use
			 * TCP (what waits in our ring is re-sent there). */
			int zero = 0;
			atomic_compare_exchange_strong(&oc->err, &zero, e);
			if (!atomic_compare_exchange_strong(&oc->state, &st, OFI_ST_TCP))
				continue;         /* moved meanwhile: look again */
			OFI_LOG(err == -ECONNABORTED ? 2 : 1, "ofi: %s (%s) before the "
				"connection came up: TCP", why,
				ofi_fi.strerror ? ofi_fi.strerror(-e) : "?");
			ofi_wake(oc);
			ofi_chan_close(oc);       /* tells the client, if it waits */
			if (oc->ep)
				fi_shutdown(oc->ep, 0);   /* ... and a peer that accepted */
			return;
		}
		/* The peer closed (its marks, or its endpoint went away): what
		 * we still send is lost as on TCP, the engine reads the marks. */
		if (was_shut || (atomic_load(&oc->peer->marks) & (FAB_M_CLOSED | FAB_M_ABORT))) {
			OFI_LOG(2, "ofi: %s after the peer closed", why);
			return;
		}
		int zero = 0;
		atomic_compare_exchange_strong(&oc->err, &zero, e);
		if (!atomic_compare_exchange_strong(&oc->state, &st, OFI_ST_DOWN))
			continue;
		OFI_LOG(0, "ofi: %s (%s): connection reset", why,
			timed_out ? "its socket timed out: TCP_USER_TIMEOUT" :
			ofi_fi.strerror ? ofi_fi.strerror(-e) : "?");
		ofi_wake(oc);
		return;
	}
}

void ofi_up(struct ofi_conn *oc)
{
	/* (under ofi_p.lock) The connection events of the domains no longer
	 * concern it: only its own queue and sockets wake it from now on. */
	if (oc->eqs_in_wfd) {
		oc->eqs_in_wfd = false;
		for (int i = 0; i < OFI_MAX_DOMAINS; i++)
			if (ofi_p.dom[i].used)
				syscall(SYS_epoll_ctl, oc->wfd, EPOLL_CTL_DEL, ofi_p.dom[i].eq_fd,
					NULL);
	}
	pthread_mutex_lock(&oc->plock);
	/* A failure another thread saw first (ofi_fail) stands: we never
	 * come up, the peer hears it (fi_shutdown) and finds us never up. */
	int st = state(oc);
	bool up = st != OFI_ST_TCP && st != OFI_ST_DOWN &&
		  atomic_compare_exchange_strong(&oc->state, &st, OFI_ST_UP);
	if (up)
		flush(oc, atomic_load(&oc->tx_prod));     /* what waited in the ring */
	pthread_mutex_unlock(&oc->plock);
	if (!up)
		return;
	ofi_chan_close(oc);
	ofi_publish(oc);                      /* what we wrote before */
	send_kick(oc);                        /* a sleeper looks again */
	ofi_wake(oc);
}

/* ---- message channel ------------------------------------------------------ */

static void *ofi_tx_buf(struct fab_ep *ep, size_t *cap)
{
	struct ofi_conn *oc = ofi_of(ep);
	*cap = ep->slot_size;
	if (!oc)
		return NULL;
	uint64_t p = atomic_load_explicit(&oc->tx_prod, memory_order_relaxed);
	return oc->tx + (p % oc->nslots) * oc->slot_size;
}

/* Hand messages [tx_flushed, upto) to the fabric (under plock). */
static int flush(struct ofi_conn *oc, uint64_t upto)
{
	while (oc->tx_flushed < upto) {
		uint64_t seq = oc->tx_flushed;
		uint32_t slot = (uint32_t)(seq % oc->nslots);
		const char *m = oc->tx + (size_t)slot * oc->slot_size;
		struct sdp_bsdh h;
		memcpy(&h, m, sizeof h);
		struct ofi_op *op = &oc->txop[slot];
		op->kind = OFI_OP_SEND;
		op->idx = slot;
		/* A small message (a ping-pong's) is injected: copied at
		 * once, no completion to write and reap; it stays in the ring
		 * all the same until the peer consumed it. */
		bool inj = h.len <= oc->dom->inject;
		ssize_t r = inj ? OFI_RETRY(oc, fi_inject(oc->ep, m, h.len, 0)) :
			OFI_RETRY(oc, fi_send(oc->ep, (void *)m, h.len, oc->desc, 0,
					      &op->ctx));
		if (r) {
			ofi_fail(oc, (int)r, "send of a message");
			return (int)r;
		}
		oc->tx_flushed = seq + 1;
		if (!inj)
			atomic_fetch_add_explicit(&oc->tx_out, 1, memory_order_relaxed);
		else
			atomic_store_explicit(&oc->inj_hi, seq + 1, memory_order_relaxed);
		bk_add(oc);
	}
	return 0;
}

/* Before the connection is up a message waits in the ring (the peer's
 * receive buffers are posted before it accepts, so the credits hold):
 * as a TCP socket takes bytes before its peer accepted. Up, they go out
 * in order (ofi_up); if it never comes up, the fallback re-sends them on
 * TCP (the peer consumed none). */
static int ofi_post(struct fab_ep *ep, size_t len)
{
	(void)len;                            /* the BSDH says it */
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return -ECONNRESET;
	int st = state(oc);
	if (st == OFI_ST_DOWN || st == OFI_ST_TCP)
		return -ECONNRESET;
	pthread_mutex_lock(&oc->plock);
	uint64_t p = atomic_load_explicit(&oc->tx_prod, memory_order_relaxed);
	atomic_store_explicit(&oc->tx_prod, p + 1, memory_order_release);
	int r = 0;
	if (state(oc) == OFI_ST_UP)
		r = flush(oc, p + 1);
	pthread_mutex_unlock(&oc->plock);
	/* The message carries our consumption (its BSDH): as good as a copy
	 * of our block for the peer's credits. */
	atomic_store(&oc->published, atomic_load(&oc->me->cons));
	return r;
}

static uint32_t pending(struct ofi_conn *oc)
{
	uint64_t c = atomic_load_explicit(&oc->cons, memory_order_acquire);
	uint64_t a = atomic_load_explicit(&oc->arrived, memory_order_acquire);
	return a >= c ? (uint32_t)(a - c) : 0;
}

/* What readiness (poll, epoll) and every wait go by: always reads the
 * queue (an edge-triggered waiter may not be woken again for it). */
static uint32_t ofi_rx_pending(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return 0;
	ofi_progress_now(oc);
	return pending(oc);
}

static int ofi_rx_peek(struct fab_ep *ep, uint32_t idx, const void **msg, size_t *cap)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return -EAGAIN;
	/* Messages known to be there need no read of the queue. */
	if (idx >= pending(oc) && idx >= ofi_rx_pending(ep))
		return -EAGAIN;
	uint64_t c = atomic_load_explicit(&oc->cons, memory_order_relaxed) + idx;
	uint32_t buf = oc->order[c % oc->nbufs];
	*msg = oc->rx + (size_t)buf * oc->slot_size;
	*cap = oc->slot_size;
	return 0;
}

/* Copy our consumption to the peer when it may wait for it. */
static void maybe_publish_cons(struct ofi_conn *oc)
{
	uint64_t c = atomic_load(&oc->cons);
	uint64_t pub = atomic_load(&oc->published);
	uint32_t batch = oc->nslots / 8 ? oc->nslots / 8 : 1;
	if (c == pub)
		return;
	if ((atomic_load_explicit(&oc->peer->armed, memory_order_relaxed) & FAB_WAIT_CREDIT) ||
	    c == atomic_load(&oc->arrived) || c - pub >= batch)
		publish_cons(oc);
}

static int ofi_rx_release(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return -ECONNRESET;
	uint64_t c = atomic_load_explicit(&oc->cons, memory_order_relaxed);
	uint32_t buf = oc->order[c % oc->nbufs];
	if (state(oc) == OFI_ST_UP && ofi_post_recv(oc, buf))
		ofi_fail(oc, -EIO, "re-posting a receive buffer");
	atomic_store_explicit(&oc->cons, c + 1, memory_order_release);
	atomic_store(&oc->me->cons, c + 1);
	maybe_publish_cons(oc);
	return 0;
}

static uint64_t peer_cons(struct ofi_conn *oc)
{
	uint64_t a = atomic_load_explicit(&oc->peer->cons, memory_order_acquire);
	uint64_t b = atomic_load_explicit(&oc->peer_cons, memory_order_acquire);
	return a > b ? a : b;
}

static uint32_t ofi_credits(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return 0;
	ofi_progress(oc);
	int st = state(oc);
	if (st == OFI_ST_DOWN || st == OFI_ST_TCP)
		return 0;
	uint64_t sent = atomic_load(&oc->tx_prod), acked = peer_cons(oc);
	if (acked > sent || sent - acked > oc->nslots)
		return 0;
	return oc->nslots - (uint32_t)(sent - acked);
}

static uint64_t ofi_tx_seq(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc ? atomic_load(&oc->tx_prod) : 0;
}

static uint64_t ofi_rx_seq(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc ? atomic_load(&oc->cons) : 0;
}

/* Stamped here, by our clock, when a message reaped found the queue empty. */
static uint64_t ofi_rx_since(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || atomic_load(&oc->arrived) == atomic_load(&oc->cons))
		return 0;
	return atomic_load_explicit(&oc->since, memory_order_relaxed);
}

/* ---- byte window ------------------------------------------------------------ */

static void ofi_set_rx_bytes(struct fab_ep *ep, uint64_t bytes)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (oc)
		atomic_store(&oc->me->rx_bytes, bytes);   /* copied with the next change */
}

static uint64_t ofi_peer_rx_bytes(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc ? atomic_load_explicit(&oc->peer->rx_bytes, memory_order_acquire) : 0;
}

static void ofi_set_rcvbuf(struct fab_ep *ep, uint32_t bytes)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return;
	atomic_store(&oc->me->rcvbuf, bytes);
	ofi_publish(oc);
}

static uint32_t ofi_peer_rcvbuf(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc ? atomic_load_explicit(&oc->peer->rcvbuf, memory_order_relaxed) : 0;
}

static void ofi_set_tx_limited(struct fab_ep *ep, bool on)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || atomic_load_explicit(&oc->me->tx_limited, memory_order_relaxed) == on)
		return;
	atomic_store(&oc->me->tx_limited, on);
	ofi_publish(oc);
}

static bool ofi_peer_tx_limited(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc && atomic_load_explicit(&oc->peer->tx_limited, memory_order_relaxed) != 0;
}

static void ofi_set_linger0(struct fab_ep *ep, bool on)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || atomic_load_explicit(&oc->me->linger0, memory_order_relaxed) == on)
		return;
	atomic_store(&oc->me->linger0, on);
	ofi_publish(oc);
}

static bool ofi_peer_linger0(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc && atomic_load_explicit(&oc->peer->linger0, memory_order_acquire) != 0;
}

/* ---- marks ------------------------------------------------------------------- */

static void ofi_mark(struct fab_ep *ep, unsigned m)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return;
	struct ofi_ctl *me = oc->me;
	m &= FAB_M_FIN | FAB_M_ABORT | FAB_M_RD_SHUT | FAB_M_CLOSED | FAB_M_FB;
	int st = state(oc);
	if ((m & (FAB_M_FIN | FAB_M_ABORT | FAB_M_CLOSED | FAB_M_FB)) &&
	    (st == OFI_ST_ANSWER || st == OFI_ST_WAITREQ || st == OFI_ST_CONNECTING)) {
		/* Closing (or leaving) before the fabric connection is up:
		 * what waits in the ring must not be lost with it. Both ends
		 * go to TCP, where the engine's hand-back re-sends it. */
		fab_private++;
		ofi_fail(oc, -ECONNABORTED, "closing");
		fab_private--;
	}
	if ((m & FAB_M_FIN) && !(atomic_load(&me->marks) & FAB_M_FIN))
		atomic_store(&me->fin_seq, atomic_load(&oc->tx_prod));
	if ((atomic_fetch_or(&me->marks, m) & m) == m)
		return;                       /* nothing new */
	/* A mark changes what the peer's waits look at: copy and wake. */
	if (ofi_publish(oc) == 0 && state(oc) == OFI_ST_UP)
		send_kick(oc);
}

static unsigned ofi_marks(struct fab_ep *ep, unsigned want)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return want & FAB_M_ABORT;    /* not ours to use here */
	ofi_progress(oc);
	unsigned r = 0;
	int st = state(oc);
	uint32_t pm = atomic_load_explicit(&oc->peer->marks, memory_order_acquire);
	if (st == OFI_ST_TCP)
		pm |= FAB_M_FB | FAB_M_FB_FINAL;  /* never up: the peer is on TCP */
	if (st == OFI_ST_DOWN)
		pm |= FAB_M_ABORT;
	r |= pm & want & 0xffffu;
	if (want & FAB_MY(0xffffu))
		r |= FAB_MY(atomic_load(&oc->me->marks)) & want;
	if ((want & FAB_M_FIN_READ) && (pm & FAB_M_FIN) &&
	    atomic_load(&oc->cons) >= atomic_load(&oc->peer->fin_seq))
		r |= FAB_M_FIN_READ;
	if ((want & FAB_M_CAUGHT_UP) && peer_cons(oc) >= atomic_load(&oc->tx_prod))
		r |= FAB_M_CAUGHT_UP;
	return r;
}

static bool insane(const char **why, const char *what)
{
	if (why)
		*why = what;
	return false;
}

/* What we publish is written by us only, into our private region: the
 * peer cannot change it. */
static bool ofi_self_sane(struct fab_ep *ep, unsigned locked, const char **why)
{
	(void)ep;
	(void)locked;
	(void)why;
	return true;
}

static bool ofi_peer_sane(struct fab_ep *ep, const char **why)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || state(oc) != OFI_ST_UP)
		return true;
	struct ofi_ctl *p = oc->peer;
	uint64_t prod = atomic_load(&oc->tx_prod);
	if (atomic_load(&p->cons) > prod)
		return insane(why, "credits for messages never sent");
	uint64_t fs = atomic_load(&p->fin_seq);
	if ((atomic_load(&p->marks) & FAB_M_FIN) &&
	    fs > atomic_load(&oc->arrived) + oc->nslots)
		return insane(why, "FIN after messages that do not exist");
	if (atomic_load(&p->kicks_reaped) > atomic_load(&oc->kicks_sent))
		return insane(why, "wake-ups that were never sent");
	return true;
}

/* ---- zero-copy words -------------------------------------------------------- */

static struct sdp_zctl zc_none[2];        /* for a process that does not own it */

static struct sdp_zctl *ofi_zc_me(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc ? &oc->me->zc : &zc_none[0];
}

static struct sdp_zctl *ofi_zc_peer(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	return oc ? &oc->peer->zc : &zc_none[1];
}

static void ofi_zc_publish(struct fab_ep *ep, size_t off, size_t len)
{
	(void)off;
	(void)len;
	struct ofi_conn *oc = ofi_of(ep);
	if (oc)
		ofi_publish(oc);
}

/* Our own words only: the peer's cannot be swapped without fabric
 * atomics (FAB_T_NO_SINK), so a SinkAvail is never taken. */
static uint32_t ofi_zc_cas(struct fab_ep *ep, unsigned whose, size_t off,
			   uint32_t expect, uint32_t desired)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || whose != FAB_OURS || off > sizeof(struct sdp_zctl) - 4 || (off & 3))
		return ~expect;
	_Atomic uint32_t *w = (_Atomic uint32_t *)((char *)&oc->me->zc + off);
	if (atomic_compare_exchange_strong(w, &expect, desired))
		ofi_publish(oc);
	return expect;
}

/* ---- wake-ups ---------------------------------------------------------------- */

static void ofi_arm(struct fab_ep *ep, unsigned what)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || state(oc) == OFI_ST_TCP || state(oc) == OFI_ST_DOWN)
		return;
	atomic_fetch_or(&oc->local_armed, what | FAB_WAIT_RX);
	fab_private++;
	/* A message wakes its receiver by itself: only waits for the
	 * peer's words need the peer told. */
	what &= FAB_WAIT_CREDIT | FAB_WAIT_ZC;
	struct ofi_ctl *m = oc->me;
	/* Writable already (a free credit, no byte limit: sdp_tx_writable):
	 * nothing the peer does can make it more so - no arm, no kick. An
	 * event loop registers EPOLLOUT on every connection (nginx) and arms
	 * before each sleep: one RDMA Write and one kick per connection per
	 * sleep, and with OFI_KICKS unacknowledged send_kick spins for the
	 * peer, which may spin for ours on another connection (nginx and wrk
	 * with 50 connections: 100 ms stalls, 700 requests/s). */
	if ((what & FAB_WAIT_CREDIT) && state(oc) == OFI_ST_UP &&
	    !atomic_load_explicit(&m->tx_limited, memory_order_relaxed)) {
		uint64_t sent = atomic_load(&oc->tx_prod), acked = peer_cons(oc);
		if (acked <= sent && sent - acked < oc->nslots)
			what &= ~(unsigned)FAB_WAIT_CREDIT;
	}
	if (what && state(oc) == OFI_ST_UP) {
		atomic_fetch_or(&m->armed, what);
		atomic_store(&m->seen, peer_version(oc));
		atomic_fetch_add(&m->arm_seq, 1);
		publish(oc, false);
		send_kick(oc);
	}
	/* Sleeping on the wait objects: the provider may ask to be told
	 * first (verbs arms the completion channel; util objects clear their
	 * signal, else a wait object read empty stays readable); the check
	 * that follows reaps whatever is already there. */
	ofi_backlog(oc);                      /* held sends of others move on */
	if (oc->cq) {
		/* Data the provider holds already (read from its socket, or
		 * completions queued): no wait object says so, read it now. */
		struct fid *f[1] = { &oc->cq->fid };
		if (fi_trywait(oc->dom->fabric, f, 1) == -FI_EAGAIN) {
			/* Read it here: a waiter in epoll may not look at this
			 * connection again before it sleeps. An arrival makes
			 * wfd readable (ofi_wake: we are armed now). */
			atomic_store_explicit(&oc->reap_tick, 0, memory_order_relaxed);
			if (pthread_mutex_trylock(&oc->cqlock) == 0) {
				ofi_reap(oc, false);
				pthread_mutex_unlock(&oc->cqlock);
			}
		}
	}
	if (oc->eqs_in_wfd && pthread_mutex_trylock(&ofi_p.lock) == 0) {
		for (int i = 0; i < OFI_MAX_DOMAINS; i++) {
			struct ofi_dom *d = &ofi_p.dom[i];
			if (!d->used)
				continue;
			struct fid *f[1] = { &d->eq->fid };
			if (fi_trywait(d->fabric, f, 1) == -FI_EAGAIN)
				ofi_cm_progress(d);
		}
		pthread_mutex_unlock(&ofi_p.lock);
	}
	fab_private--;
}

static void ofi_disarm(struct fab_ep *ep, unsigned what)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (oc) {
		atomic_fetch_and(&oc->me->armed, ~what);  /* a stale arm costs a kick */
		atomic_fetch_and(&oc->local_armed, ~(what | FAB_WAIT_RX));
	}
}

static int ofi_kick(struct fab_ep *ep, int wfd, unsigned what)
{
	(void)wfd;
	what &= FAB_WAIT_ALL;                 /* bits 8-15: another route's */
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || state(oc) != OFI_ST_UP)
		return 0;
	struct ofi_ctl *p = oc->peer, *m = oc->me;
	if (what & FAB_WAIT_CREDIT) {
		/* Consumption, a larger window, partial reads a byte-limited
		 * sender waits for. */
		if (atomic_load(&m->cons) != atomic_load(&oc->published) ||
		    atomic_load_explicit(&p->tx_limited, memory_order_relaxed) ||
		    (atomic_load_explicit(&p->armed, memory_order_relaxed) & FAB_WAIT_CREDIT))
			publish_cons(oc);
	}
	if (!(atomic_load_explicit(&p->armed, memory_order_acquire) & what))
		return 0;
	return service(oc);
}

/* Reap; then the TCP socket's own news: FIN (1) or a reset (-errno). */
static int ofi_drain(struct fab_ep *ep, int wfd)
{
	struct ofi_conn *oc = ofi_of(ep);
	/* The fabric's connection timed out (ofi_fail): as TCP says it.
	 * wfd < 0: only that is asked (the engine reporting a reset). */
	if (oc && state(oc) == OFI_ST_DOWN && oc->err == -ETIMEDOUT)
		return -ETIMEDOUT;
	if (wfd < 0)
		return 0;
	if (oc) {
		uint64_t v;
		ssize_t e = sys_read(oc->evfd, &v, sizeof v);
		(void)e;
		ofi_progress_now(oc);
	}
	char b;
	ssize_t r = sys_recvfrom(wfd, &b, 1, MSG_DONTWAIT | MSG_PEEK);
	int e = r < 0 ? errno : 0;
	if (r > 0 || (r < 0 && (e == EAGAIN || e == EINTR)))
		return 0;
	/* The peer's TCP socket closed. Its fabric connection is another
	 * TCP connection (or another fabric): what the peer sent there
	 * before it closed - its last messages, its FIN mark - may still be
	 * on the way. Wait for the fabric to say the peer's endpoint is gone
	 * (all its data came before that), at most a second, before the
	 * engine judges the end orderly or a reset. */
	if (oc && state(oc) == OFI_ST_UP) {
		uint64_t until = ofi_now_ns() + 1000000000ull;
		while (!oc->peer_shut && state(oc) == OFI_ST_UP && ofi_now_ns() < until) {
			struct pollfd p = { .fd = oc->wfd, .events = POLLIN };
			sys_poll(&p, 1, 10);
			ofi_progress_now(oc);
			if (pthread_mutex_trylock(&ofi_p.lock) == 0) {
				for (int i = 0; i < OFI_MAX_DOMAINS; i++)
					if (ofi_p.dom[i].used)
						ofi_cm_progress(&ofi_p.dom[i]);
				pthread_mutex_unlock(&ofi_p.lock);
			}
		}
	}
	return r == 0 ? 1 : -e;
}

static uint64_t ofi_tokens_due(struct fab_ep *ep)
{
	(void)ep;
	return 0;                             /* nothing travels on the TCP socket */
}

/* None of our wake-ups travel on the TCP socket: none left unread there. */
static uint64_t ofi_tokens_unread(struct fab_ep *ep)
{
	(void)ep;
	return 0;
}

/* No byte on the TCP socket is ever a token of ours. */
static int ofi_tokens_took(struct fab_ep *ep, const void *buf, size_t n)
{
	(void)ep;
	(void)buf;
	return n ? -EPROTO : 0;
}

/* ---- the application's TCP_USER_TIMEOUT on the fabric's socket ------------- */

/* Same address and port? (what getsockname/getpeername and libfabric's
 * getname/getpeer give: the fields that matter, not the padding) */
static bool same_addr(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET) {
		const struct sockaddr_in *x = (const void *)a, *y = (const void *)b;
		return x->sin_port == y->sin_port && x->sin_addr.s_addr == y->sin_addr.s_addr;
	}
	if (a->ss_family == AF_INET6) {
		const struct sockaddr_in6 *x = (const void *)a, *y = (const void *)b;
		return x->sin6_port == y->sin6_port &&
		       !memcmp(&x->sin6_addr, &y->sin6_addr, sizeof x->sin6_addr);
	}
	return false;
}

/* Is fd the TCP socket whose ends are the endpoint's addresses? */
static bool is_fabric_sock(int fd, const struct sockaddr_storage *la,
			   const struct sockaddr_storage *pa)
{
	struct sockaddr_storage a;
	socklen_t l = sizeof a;
	if (sys_getsockname(fd, &a, &l) || !same_addr(&a, la))
		return false;
	l = sizeof a;
	return !sys_getpeername(fd, &a, &l) && same_addr(&a, pa);
}

/*
 * Over the tcp provider the data travels on a TCP connection of
 * libfabric's, not on the application's socket, which stays idle: the
 * application's TCP_USER_TIMEOUT would never fire, and a sender blocked
 * behind a cut link would wait for the kernel's default (about 15 minutes
 * of retransmissions) instead of failing with ETIMEDOUT after the time it
 * asked for. Before a sleep (at most every 200 ms) copy the option onto
 * libfabric's socket of this endpoint, found once by its addresses (other
 * providers have none: nothing is found, nothing done). The socket is
 * checked again before each copy: libfabric may have closed it and its
 * number may be another descriptor's now.
 */
static void copy_user_timeout(struct ofi_conn *oc, int appfd)
{
	uint64_t now = ofi_now_ns();
	uint64_t last = atomic_load_explicit(&oc->opt_ns, memory_order_relaxed);
	if (appfd < 0 || oc->fsock == -1 || (last && now - last < 200000000ull) ||
	    !atomic_compare_exchange_strong(&oc->opt_ns, &last, now))
		return;
	int ut = 0;
	socklen_t l = sizeof ut;
	if (sys_getsockopt(appfd, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, &l) || ut == oc->utmo_ms)
		return;
	struct sockaddr_storage la, pa;
	size_t ll = sizeof la, pl = sizeof pa;
	memset(&la, 0, sizeof la);
	memset(&pa, 0, sizeof pa);
	if (!oc->ep || fi_getname(&oc->ep->fid, &la, &ll) || fi_getpeer(oc->ep, &pa, &pl))
		return;
	if (oc->fsock >= 0 && !is_fabric_sock(oc->fsock, &la, &pa))
		oc->fsock = -2;
	if (oc->fsock == -2) {
		struct rlimit rl;
		int lim = getrlimit(RLIMIT_NOFILE, &rl) || rl.rlim_cur > 65536 ? 65536 :
			  (int)rl.rlim_cur;
		oc->fsock = -1;
		for (int fd = 0; fd < lim; fd++)
			if (fd != appfd && fd != oc->tcp_added && is_fabric_sock(fd, &la, &pa)) {
				oc->fsock = fd;
				break;
			}
		if (oc->fsock < 0) {
			OFI_LOG(2, "ofi: no socket of the fabric's found for TCP_USER_TIMEOUT");
			return;
		}
	}
	if (sys_setsockopt(oc->fsock, IPPROTO_TCP, TCP_USER_TIMEOUT, &ut, sizeof ut) == 0) {
		oc->utmo_ms = ut;
		OFI_LOG(2, "ofi: TCP_USER_TIMEOUT %d ms on the fabric's socket (fd %d)", ut,
			oc->fsock);
	}
}

/* A wake-up the peer may be owed although it did not arm: its arm bits
 * are in its own block, which only it writes (and copies to us), so none
 * is lost that way; a sleeper's arm already told us what it waits for. */
static int ofi_kick_owed(struct fab_ep *ep, int wfd)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (oc && state(oc) == OFI_ST_UP)
		copy_user_timeout(oc, wfd);
	return 0;
}

/* Any geometry: the number of buffers is clamped to the provider's queues
 * at set-up (the client's offer says what was taken). */
static bool ofi_fits(uint32_t nslots, uint32_t slot_size)
{
	(void)nslots;
	(void)slot_size;
	return true;
}

/* ---- fallback to TCP ------------------------------------------------------ */

static void ofi_fb_publish(struct fab_ep *ep, uint32_t rx_off)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return;
	struct ofi_ctl *m = oc->me;
	atomic_store(&m->fb_rx_cons, atomic_load(&oc->cons));
	atomic_store(&m->fb_rx_off, rx_off);
	atomic_fetch_or(&m->marks, FAB_M_FB | FAB_M_FB_FINAL);
	if (ofi_publish(oc) == 0 && state(oc) == OFI_ST_UP)
		send_kick(oc);
}

static void ofi_fb_peer_pos(struct fab_ep *ep, uint64_t *cons, uint32_t *off)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || state(oc) == OFI_ST_TCP) {
		*cons = 0;                    /* never up: nothing was consumed */
		*off = 0;
		return;
	}
	*cons = atomic_load(&oc->peer->fb_rx_cons);
	*off = atomic_load(&oc->peer->fb_rx_off);
}

static const void *ofi_tx_msg(struct fab_ep *ep, uint64_t seq)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return NULL;
	return oc->tx + (seq % oc->nslots) * oc->slot_size;
}

const struct fab_ops fab_ofi_ops = {
	.name        = "ofi",
	.id          = FAB_ID_OFI,
	.traits      = FAB_T_PRIVATE | FAB_T_MR_KEYS | FAB_T_NO_SINK | FAB_T_REMOTE,
	/* choice and set-up (ofi_cm.c) */
	.init        = ofi_init,
	.reaches     = ofi_reaches,
	.fits        = ofi_fits,
	.offer       = ofi_offer,
	.accept      = ofi_accept,
	.connected   = ofi_connected,
	.detach      = ofi_detach,
	.unmap       = ofi_unmap,
	/* message channel */
	.tx_buf      = ofi_tx_buf,
	.post        = ofi_post,
	.rx_peek     = ofi_rx_peek,
	.rx_release  = ofi_rx_release,
	.credits     = ofi_credits,
	.rx_pending  = ofi_rx_pending,
	.tx_seq      = ofi_tx_seq,
	.rx_seq      = ofi_rx_seq,
	.rx_since    = ofi_rx_since,
	/* byte window */
	.set_rx_bytes    = ofi_set_rx_bytes,
	.peer_rx_bytes   = ofi_peer_rx_bytes,
	.set_rcvbuf      = ofi_set_rcvbuf,
	.peer_rcvbuf     = ofi_peer_rcvbuf,
	.set_tx_limited  = ofi_set_tx_limited,
	.peer_tx_limited = ofi_peer_tx_limited,
	.set_linger0     = ofi_set_linger0,
	.peer_linger0    = ofi_peer_linger0,
	/* marks */
	.mark        = ofi_mark,
	.marks       = ofi_marks,
	.peer_sane   = ofi_peer_sane,
	.self_sane   = ofi_self_sane,
	/* zero-copy words */
	.zc_me       = ofi_zc_me,
	.zc_peer     = ofi_zc_peer,
	.zc_publish  = ofi_zc_publish,
	.zc_cas      = ofi_zc_cas,
	.probe_addr  = ofi_probe_addr,
	.probe       = ofi_probe,
	/* RDMA (ofi_mr.c) */
	.rdma_read   = ofi_rdma_read,
	.rdma_write  = ofi_rdma_write,
	/* wake-ups */
	.arm         = ofi_arm,
	.disarm      = ofi_disarm,
	.kick        = ofi_kick,
	.drain       = ofi_drain,
	.kick_owed   = ofi_kick_owed,
	.tokens_due  = ofi_tokens_due,
	.tokens_took = ofi_tokens_took,
	.tokens_unread = ofi_tokens_unread,
	.wait_fd     = ofi_wait_fd,
	/* memory keys */
	.mr_key      = ofi_mr_key,
	/* fallback */
	.fb_publish  = ofi_fb_publish,
	.fb_peer_pos = ofi_fb_peer_pos,
	.tx_msg      = ofi_tx_msg,
};
