/*
 * shm.c - the shared-memory fabric provider.
 *
 * One connection = one region of a memfd shared by exactly the two endpoint
 * processes (created by the connecting side, passed to the accepting side
 * with SCM_RIGHTS, sealed against resizing so neither side can make the
 * other fault; shm_region.c says where regions come from and how they are
 * reused). Layout (shm_layout.h):
 *
 *   page 0      struct shm_hdr: identity, state, and per side a control
 *               block written only by that side (producer and consumer
 *               counters on their own cache lines, wake-up arm bits, FIN)
 *   ring 0      nslots x slot_size receive buffers, written by side 0
 *   ring 1      the same for side 1
 *
 * Posting a message = copy it into the peer's next receive buffer, then
 * publish the producer counter (release). Consuming = read the buffer, then
 * publish the consumer counter, which is the credit return (on an RDMA
 * fabric, an RDMA write of the same word). RDMA Read/Write are Cross Memory
 * Attach (process_vm_readv/writev) into the peer process.
 *
 * Wake-ups: a side about to sleep sets arm bits in its control block; the
 * other side, after progress, clears a set bit and writes one token byte to
 * the connection's TCP socket, which makes the sleeper's fd readable.
 *
 * Anyone who can write the region can change any word in it, ours too: a
 * side decides only by private copies of what it wrote (struct shm_ep, in
 * the endpoint's provider area), checks the shared words against them
 * (self_sane), and sends a token the peer may be owed before it sleeps
 * (kick_owed).
 *
 * Marks (FIN, abort, closed, ...) are words of the control block; the
 * zero-copy control words are a part of it too, so publishing them is
 * nothing. This file is the ops table (fab_shm_ops, at the end); set-up
 * and tear-down are in shm_region.c.
 */
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <limits.h>
#include <linux/futex.h>
#include <net/if.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdatomic.h>
#include <stddef.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "fabric/fabric.h"
#include "sdp/proto.h"
#include "sdp/sys.h"

#include "fabric/shm_layout.h"

/* The connecting side's view of a server that never attached and never
 * will (PROTOCOL.md section 4): it declined (REFUSED: it wrote one token
 * on the TCP socket) or we abandoned the connection at close (ABANDONED:
 * it wrote nothing). Either way the peer is on TCP with a final count,
 * having consumed nothing: as if its fallback mark were final at
 * position 0. 0 while the connection may still be (or is) set up. */
static uint32_t unborn(struct fab_ep *ep)
{
	if (ep->side != 0 || atomic_load_explicit(&SE(ep)->peer_up, memory_order_relaxed))
		return 0;
	uint32_t st = atomic_load_explicit(&H(ep)->state, memory_order_acquire);
	if (st == SHM_ST_ATTACHED)
		atomic_store_explicit(&SE(ep)->peer_up, 1, memory_order_relaxed);
	return st == SHM_ST_REFUSED || st == SHM_ST_ABANDONED ? st : 0;
}

/* The peer's count of wake-up tokens, as published (bit TOKENS_FROZEN
 * included). */
static uint64_t peer_tokens_sent(struct fab_ep *ep)
{
	uint32_t u = unborn(ep);
	if (u)
		return TOKENS_FROZEN | (u == SHM_ST_REFUSED ? 1 : 0);
	return atomic_load(&peer(ep)->tokens_sent);
}

/* Tokens the peer announced that we have not consumed yet. */
static uint64_t shm_tokens_due(struct fab_ep *ep)
{
	uint64_t sent = peer_tokens_sent(ep) & ~TOKENS_FROZEN;
	uint64_t got = atomic_load(&SE(ep)->my_tokens_rcvd);
	return sent > got ? sent - got : 0;
}

/* Tokens we sent that the peer has not consumed (its count may be a
 * dead process's last word). */
static uint64_t shm_tokens_unread(struct fab_ep *ep)
{
	uint64_t sent = atomic_load(&me(ep)->tokens_sent) & ~TOKENS_FROZEN;
	uint64_t got = atomic_load(&peer(ep)->tokens_rcvd);
	return sent > got ? sent - got : 0;
}

static void took(struct fab_ep *ep, uint64_t n)
{
	atomic_fetch_add(&SE(ep)->my_tokens_rcvd, n);     /* copy first */
	atomic_fetch_add(&me(ep)->tokens_rcvd, n);
}

/* Are these bytes all wake-up tokens? */
static bool all_tokens(const unsigned char *b, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (b[i] != SHM_TOKEN_BYTE)
			return false;
	return true;
}

static int shm_tokens_took(struct fab_ep *ep, const void *buf, size_t n)
{
	took(ep, n);
	return all_tokens(buf, n) ? 0 : -EPROTO;
}

/* ---- marks -------------------------------------------------------------- */

/* Each mark: the private copy first, then the shared word (self_sane
 * relies on that order). */
static void shm_mark(struct fab_ep *ep, unsigned mk)
{
	struct shm_side *m = me(ep);
	struct shm_ep *se = SE(ep);
	if ((mk & FAB_M_FIN) && !(atomic_load(&se->my_flags) & SHM_MY_FIN)) {
		atomic_store(&m->fin_seq, atomic_load(&se->my_prod));
		atomic_fetch_or(&se->my_flags, SHM_MY_FIN);
		atomic_store(&m->fin, 1);
	}
	if (mk & FAB_M_ABORT) {
		atomic_fetch_or(&se->my_flags, SHM_MY_ABORT);
		atomic_store(&m->abort, 1);
	}
	if (mk & FAB_M_RD_SHUT) {
		atomic_fetch_or(&se->my_flags, SHM_MY_RDSHUT);
		atomic_store(&m->rd_shut, 1);
	}
	if (mk & FAB_M_CLOSED) {
		atomic_fetch_or(&se->my_flags, SHM_MY_CLOSED);
		atomic_store(&m->closed, 1);
	}
	/* Stage 1 of a fallback: a seq_cst store, so the fence of the kick
	 * that follows orders it before our look at the peer's arm bits (the
	 * Dekker pair of PROTOCOL.md section 9, with "we are leaving" as the
	 * progress). */
	if ((mk & FAB_M_FB) && atomic_load(&se->my_fb) == SHM_FB_NONE) {
		atomic_store(&se->my_fb, SHM_FB_LEAVING);
		atomic_store(&m->fb, SHM_FB_LEAVING);
	}
}

/* Our marks, as we set them (never the shared words, which a writer of
 * the region could change). */
static unsigned my_marks(struct fab_ep *ep, unsigned want)
{
	struct shm_ep *se = SE(ep);
	uint32_t f = atomic_load(&se->my_flags), fb = atomic_load(&se->my_fb);
	unsigned m = ((f & SHM_MY_FIN) ? FAB_M_FIN : 0) |
		     ((f & SHM_MY_ABORT) ? FAB_M_ABORT : 0) |
		     ((f & SHM_MY_RDSHUT) ? FAB_M_RD_SHUT : 0) |
		     ((f & SHM_MY_CLOSED) ? FAB_M_CLOSED : 0) |
		     (fb != SHM_FB_NONE ? FAB_M_FB : 0) |
		     (fb == SHM_FB_FINAL ? FAB_M_FB_FINAL : 0);
	return m & want;
}

/* The peer's plain marks. */
static unsigned peer_marks(struct shm_side *s, unsigned want)
{
	unsigned m = 0;
	if ((want & FAB_M_FIN) && atomic_load_explicit(&s->fin, memory_order_acquire))
		m |= FAB_M_FIN;
	if ((want & FAB_M_ABORT) && atomic_load_explicit(&s->abort, memory_order_acquire))
		m |= FAB_M_ABORT;
	if ((want & FAB_M_RD_SHUT) && atomic_load_explicit(&s->rd_shut, memory_order_acquire))
		m |= FAB_M_RD_SHUT;
	if ((want & FAB_M_CLOSED) && atomic_load_explicit(&s->closed, memory_order_acquire))
		m |= FAB_M_CLOSED;
	if (want & (FAB_M_FB | FAB_M_FB_FINAL)) {
		uint32_t fb = atomic_load_explicit(&s->fb, memory_order_acquire);
		if (fb != SHM_FB_NONE)
			m |= want & FAB_M_FB;
		if (fb == SHM_FB_FINAL)
			m |= want & FAB_M_FB_FINAL;
	}
	return m;
}

static unsigned shm_marks(struct fab_ep *ep, unsigned want)
{
	struct shm_side *p = peer(ep);
	unsigned r = peer_marks(p, want);
	if ((want & (FAB_M_FB | FAB_M_FB_FINAL)) && unborn(ep))
		r |= want & (FAB_M_FB | FAB_M_FB_FINAL);
	if (want & FAB_MY(0xffffu))
		r |= FAB_MY(my_marks(ep, want >> 16));
	/* FIN, and we consumed every message before it */
	if ((want & FAB_M_FIN_READ) &&
	    atomic_load_explicit(&p->fin, memory_order_acquire) &&
	    atomic_load(&SE(ep)->my_cons) >= atomic_load(&p->fin_seq))
		r |= FAB_M_FIN_READ;
	/* the peer consumed every message we posted */
	if ((want & FAB_M_CAUGHT_UP) && atomic_load(&p->cons) >= atomic_load(&SE(ep)->my_prod))
		r |= FAB_M_CAUGHT_UP;
	return r;
}

/*
 * Everything the peer wrote in its control block must make sense with
 * what we know; if not, the caller aborts the connection (*why says what
 * was wrong).
 *
 * The checks compare counters that both processes - and other threads of
 * ours - keep advancing while we read them, so the order of the loads is
 * what makes a check sound: a lower bound is read before the value it
 * bounds, an upper bound after it. (Read the other way round, a thread
 * preempted between two loads saw an honest peer as insane.)
 */
static bool insane(const char **why, const char *what)
{
	if (why)
		*why = what;
	return false;
}

static bool self_sane(struct fab_ep *ep, struct shm_side *m, unsigned locked,
		      const char **why);

static bool shm_peer_sane(struct fab_ep *ep, const char **why)
{
	struct shm_side *m = me(ep), *p = peer(ep);
	struct shm_ep *se = SE(ep);
	/* peer's prod: never below our cons, at most nslots beyond it */
	uint64_t mcons0 = atomic_load(&se->my_cons);
	uint64_t pprod = atomic_load(&p->prod);
	uint64_t mcons1 = atomic_load(&se->my_cons);
	if (pprod < mcons0 || (pprod > mcons1 && pprod - mcons1 > ep->nslots))
		return insane(why, "messages from nowhere, or unposted");
	/* peer's cons: never beyond our prod, at most nslots behind it */
	uint64_t pcons0 = atomic_load(&p->cons);
	uint64_t mprod = atomic_load(&se->my_prod);
	uint64_t pcons1 = atomic_load(&p->cons);
	if (pcons0 > mprod || (mprod > pcons1 && mprod - pcons1 > ep->nslots))
		return insane(why, "credits for messages never sent");
	/* a FIN names a message the peer has posted (fin_seq is written first) */
	uint32_t fin = atomic_load(&p->fin);
	uint64_t fin_seq = atomic_load(&p->fin_seq);
	if (fin > 1 || (fin && fin_seq > atomic_load(&p->prod)))
		return insane(why, "FIN after messages that do not exist");
	/* a final fallback mark comes after the frozen count (stage 2) */
	uint32_t fb = atomic_load(&p->fb);
	if (fb > SHM_FB_FINAL ||
	    (fb == SHM_FB_FINAL && !(atomic_load(&p->tokens_sent) & TOKENS_FROZEN)))
		return insane(why, "bad fallback mark");
	/* we never take more wake-up tokens than the peer has sent */
	uint64_t tr = atomic_load(&se->my_tokens_rcvd);
	uint64_t ts = peer_tokens_sent(ep) & ~TOKENS_FROZEN;
	if (ts < tr || ts - tr > (1u << 20))
		return insane(why, "wake-up tokens that cannot exist");
	if (atomic_load(&p->armed) & ~(FAB_WAIT_ALL | FAB_WAIT_QALL | FAB_WAIT_FALL))
		return insane(why, "unknown wake-up request");
	if (!shm_win_ok(ep->nslots, atomic_load(&p->win)))
		return insane(why, "a send window the ring cannot have");
	return self_sane(ep, m, 0, why);
}

/*
 * Our own words, as we wrote them. Where another thread of ours may be
 * writing a word right now, only what holds at every instant is checked:
 * we store the private copy first, then the shared word, so a shared word
 * read before its copy is never ahead of it. Under the lock that
 * serializes its writers, a word must equal its copy.
 */
static bool self_sane(struct fab_ep *ep, struct shm_side *m, unsigned locked,
		      const char **why)
{
	uint64_t sp = atomic_load(&m->prod), pp = atomic_load(&SE(ep)->my_prod);
	uint64_t sc = atomic_load(&m->cons), pc = atomic_load(&SE(ep)->my_cons);
	uint64_t st = atomic_load(&m->tokens_rcvd), pt = atomic_load(&SE(ep)->my_tokens_rcvd);
	if (sp > pp || ((locked & FAB_SELF_TX) && sp != pp))
		return insane(why, "our message count was overwritten");
	if (sc > pc || ((locked & FAB_SELF_RX) && sc != pc))
		return insane(why, "our consumed count was overwritten");
	if (st > pt)
		return insane(why, "our token count was overwritten");
	uint64_t sb = atomic_load(&m->rx_bytes), pb = atomic_load(&SE(ep)->my_rx_bytes);
	if (sb > pb || ((locked & FAB_SELF_RX) && sb != pb))
		return insane(why, "our consumed byte count was overwritten");
	uint32_t sfb = atomic_load(&m->fb), pfb = atomic_load(&SE(ep)->my_fb);
	if (sfb > pfb || (locked == (FAB_SELF_TX | FAB_SELF_RX) && sfb != pfb))
		return insane(why, "our fallback mark was overwritten");
	if (atomic_load(&m->armed) & ~(FAB_WAIT_ALL | FAB_WAIT_QALL | FAB_WAIT_FALL))
		return insane(why, "our wake-up request was overwritten");
	/* our window word: its copy is stored first; under tx_lock equal */
	if ((locked & FAB_SELF_TX) &&
	    atomic_load(&m->win) != atomic_load(&SE(ep)->my_win))
		return insane(why, "our send window was overwritten");
	/* Marks we set once: the copy is stored first, so a mark read
	 * before its copy is never set without it. One that vanished is
	 * stored again (the peer may have missed it meanwhile: it is told
	 * again by the kick that follows any change of ours). */
	static const struct { uint32_t bit; size_t off; const char *what; } mk[] = {
		{ SHM_MY_FIN, offsetof(struct shm_side, fin), "our FIN was overwritten" },
		{ SHM_MY_ABORT, offsetof(struct shm_side, abort), "our reset mark was overwritten" },
		{ SHM_MY_RDSHUT, offsetof(struct shm_side, rd_shut), "our SHUT_RD mark was overwritten" },
		{ SHM_MY_CLOSED, offsetof(struct shm_side, closed), "our close mark was overwritten" },
	};
	for (size_t i = 0; i < sizeof mk / sizeof mk[0]; i++) {
		_Atomic uint32_t *w = (_Atomic uint32_t *)((char *)m + mk[i].off);
		uint32_t v = atomic_load(w);
		bool mine = atomic_load(&SE(ep)->my_flags) & mk[i].bit;
		if (v > 1 || (v && !mine))
			return insane(why, mk[i].what);
		if (!v && mine)
			atomic_store(w, 1);
	}
	if (atomic_load(&m->fin) && atomic_load(&m->fin_seq) > pp)
		return insane(why, "our FIN was overwritten");
	return true;
}

static bool shm_self_sane(struct fab_ep *ep, unsigned locked, const char **why)
{
	return self_sane(ep, me(ep), locked, why);
}

/* ---- zero-copy control words -------------------------------------------- */

static struct sdp_zctl *shm_zc_me(struct fab_ep *ep) { return &me(ep)->zc; }
static struct sdp_zctl *shm_zc_peer(struct fab_ep *ep) { return &peer(ep)->zc; }

/* Both blocks are in the shared region: stored is published. */
static void shm_zc_publish(struct fab_ep *ep, size_t off, size_t len)
{
	(void)ep;
	(void)off;
	(void)len;
}

static uint32_t shm_zc_cas(struct fab_ep *ep, unsigned whose, size_t off,
			   uint32_t expect, uint32_t desired)
{
	struct sdp_zctl *z = whose == FAB_OURS ? &me(ep)->zc : &peer(ep)->zc;
	if (off > sizeof *z - sizeof(uint32_t) || (off & 3))
		return ~expect;               /* not a word of the block */
	_Atomic uint32_t *w = (_Atomic uint32_t *)((char *)z + off);
	atomic_compare_exchange_strong(w, &expect, desired);
	return expect;
}

/* The peer reads our mapping of the region header with Cross Memory
 * Attach: if it gets what its own mapping holds, it can read us. */
static uint64_t shm_probe_addr(struct fab_ep *ep)
{
	return (uint64_t)(uintptr_t)ep->base;
}

static ssize_t shm_rdma_read(struct fab_ep *ep, const struct iovec *local, int nlocal,
			     uint64_t raddr, size_t len, uint64_t rkey);

static int shm_probe(struct fab_ep *ep, uint64_t raddr, uint64_t key)
{
	uint64_t theirs = 0, ours;
	memcpy(&ours, ep->base, sizeof ours);
	struct iovec l = { &theirs, sizeof theirs };
	ssize_t r = shm_rdma_read(ep, &l, 1, raddr, sizeof theirs, key);
	if (r != (ssize_t)sizeof theirs)
		return r < 0 ? (int)r : -EIO;
	return theirs == ours ? 1 : -EPROTO;
}

/* ---- fallback to TCP ---------------------------------------------------- */

/* Stage 2: our token count is final and our position is published. */
static void shm_fb_publish(struct fab_ep *ep, uint32_t rx_off)
{
	struct shm_side *m = me(ep);
	atomic_fetch_or(&m->tokens_sent, TOKENS_FROZEN);   /* final count */
	atomic_store(&m->fb_rx_cons, atomic_load(&SE(ep)->my_cons));
	m->fb_rx_off = rx_off;
	atomic_store(&SE(ep)->my_fb, SHM_FB_FINAL);
	atomic_store(&m->fb, SHM_FB_FINAL);
}

static void shm_fb_peer_pos(struct fab_ep *ep, uint64_t *cons, uint32_t *off)
{
	struct shm_side *p = peer(ep);
	if (unborn(ep)) {
		*cons = 0;                    /* never attached: consumed nothing */
		*off = 0;
		return;
	}
	*cons = atomic_load(&p->fb_rx_cons);
	*off = p->fb_rx_off;
}

/* Our own message seq, still in our ring (for re-sending): every message
 * not consumed yet was posted under the window in effect (it changes only
 * with nothing in flight). */
static const void *shm_tx_msg(struct fab_ep *ep, uint64_t seq)
{
	uint32_t k = shm_slot(ep->nslots, atomic_load(&SE(ep)->my_win), seq);
	return ring(ep, ep->side) + (size_t)k * ep->slot_size;
}

/* ---- message channel ---------------------------------------------------- */

/* ---- the send window (PROTOCOL.md 5.2 and 8) ------------------------------
 *
 * Our sends use W slots of the peer's receive buffers, not all nslots:
 * message seq goes to slot (seq + off) % W (shm_slot), (W, off) being our
 * control block's win word. A connection starts with ring_start slots. A
 * sender that ran out of credits below nslots grows the window x4 (up to
 * nslots) at the next wrap - when its next message would go to slot 0:
 * the messages in flight then sit in slots [W - n, W), and the new window
 * keeps them there (its off puts that next message in slot W), so the
 * peer finds every message in flight in the same slot whichever of the two
 * words it reads, and no bubble is needed. A ring filled from slot 0
 * grows at once: a peer that does not read still gets nslots messages, as
 * before. A direction idle for idle_ns (nothing in flight, nothing posted,
 * seen by looks that far apart) goes back to ring_start and gives its
 * ring's pages back to the system (MADV_REMOVE on the shared memfd frees
 * them for both processes): the peer reads only messages in [cons, prod),
 * none when the ring is empty, and only we write our ring, under tx_lock.
 * The word changes only under tx_lock, before the prod that covers a
 * message under it is released. */
static uint32_t ring_start = 4;
static uint64_t idle_ns = 1000000000ull;

void shm_win_init(uint32_t start, uint32_t idle_ms)
{
	ring_start = start ? start : 1;
	idle_ns = (uint64_t)idle_ms * 1000000ull;
}

static uint32_t start_win(struct fab_ep *ep)
{
	return ring_start < ep->nslots ? ring_start : ep->nslots;
}

/* Our win word now (set before our first post). */
static uint32_t my_word(struct fab_ep *ep)
{
	uint32_t w = atomic_load_explicit(&SE(ep)->my_win, memory_order_relaxed);
	return w ? w : SHM_WIN(start_win(ep), 0);
}

static uint32_t shm_tx_window(struct fab_ep *ep)
{
	uint32_t w = shm_win_w(my_word(ep));
	return w ? w : ep->nslots;
}

/* The window after a growth at the wrap point of word w, or 0. */
static uint32_t grown(struct fab_ep *ep, uint32_t w, uint64_t p)
{
	uint32_t W = shm_win_w(w);
	if (!W || W >= ep->nslots || (p % W + shm_win_off(w)) % W)
		return 0;
	uint32_t nw = W >= ep->nslots / 4 ? ep->nslots : W * 4;
	/* message p goes to slot W: (p + off) % nw == W */
	uint32_t off = (uint32_t)((W + nw - p % nw) % nw);
	return SHM_WIN(nw, off);
}

/* Set the word (tx_lock held): the copy first, then the shared word,
 * before the prod covering a message under it is released. */
static void set_window(struct fab_ep *ep, uint32_t w)
{
	atomic_store(&SE(ep)->my_win, w);
	atomic_store_explicit(&me(ep)->win, w, memory_order_relaxed);
}

/* Our own counter may be advanced by another thread between the loads:
 * the pair is used only when that counter did not move meanwhile, so the
 * peer's value was read while ours was the one compared (else a stale
 * value of ours beside a fresh one of the peer's looks like nonsense).
 * Out of credits below nslots: the sender wants to grow (my_grow), and
 * at the wrap point the credits are those of the grown window. */
static uint32_t shm_credits(struct fab_ep *ep)
{
	for (;;) {
		uint64_t sent = atomic_load_explicit(&SE(ep)->my_prod, memory_order_acquire);
		uint32_t wd = my_word(ep);
		uint64_t acked = atomic_load_explicit(&peer(ep)->cons, memory_order_acquire);
		if (atomic_load_explicit(&SE(ep)->my_prod, memory_order_acquire) != sent)
			continue;
		if (acked > sent || sent - acked > ep->nslots)
			return 0;             /* nonsense from the peer: no credit */
		uint32_t W = shm_win_w(wd) ? shm_win_w(wd) : ep->nslots;
		uint32_t fl = (uint32_t)(sent - acked);
		if (fl >= W && W < ep->nslots &&
		    !atomic_load_explicit(&SE(ep)->my_grow, memory_order_relaxed))
			atomic_store(&SE(ep)->my_grow, 1);
		if (atomic_load_explicit(&SE(ep)->my_grow, memory_order_relaxed)) {
			uint32_t g = grown(ep, wd, sent);
			if (g)
				W = shm_win_w(g);
		}
		return fl >= W ? 0 : W - fl;
	}
}

static void *shm_tx_buf(struct fab_ep *ep, size_t *cap)
{
	struct shm_ep *se = SE(ep);
	uint64_t p = atomic_load_explicit(&se->my_prod, memory_order_relaxed);
	uint32_t w = atomic_load_explicit(&se->my_win, memory_order_relaxed);
	if (__builtin_expect(!w, 0)) {
		/* our first message (or a ring left empty by a trim) */
		w = SHM_WIN(start_win(ep), (start_win(ep) - p % start_win(ep)) % start_win(ep));
		set_window(ep, w);
	} else if (__builtin_expect(atomic_load_explicit(&se->my_grow,
							  memory_order_relaxed), 0)) {
		uint32_t g = grown(ep, w, p);
		if (g) {
			atomic_store(&se->my_grow, 0);
			set_window(ep, g);
			w = g;
		}
	}
	uint32_t k = shm_slot(ep->nslots, w, p);
	if (k >= atomic_load_explicit(&se->touch, memory_order_relaxed))
		atomic_store_explicit(&se->touch, k + 1, memory_order_relaxed);
	*cap = ep->slot_size;
	return ring(ep, ep->side) + (size_t)k * ep->slot_size;
}

/* Give back the pages of slots [0, n) of ring `which`: whole pages only
 * (a partial one at either end may hold a neighbour's bytes). */
static size_t give_back(struct fab_ep *ep, uint32_t which, uint32_t n)
{
	if (!n)
		return 0;
	uintptr_t a = (uintptr_t)ring(ep, which);
	uintptr_t e = a + (size_t)n * ep->slot_size;
	uintptr_t pa = (a + 4095) & ~(uintptr_t)4095, pe = e & ~(uintptr_t)4095;
	if (pe <= pa)
		return 0;
	if (syscall(SYS_madvise, pa, pe - pa, MADV_REMOVE) < 0)
		return 0;
	return pe - pa;
}

/* Cheap: a clock value the caller read and a few loads. */
static bool shm_idle_due(struct fab_ep *ep, uint64_t now)
{
	struct shm_ep *se = SE(ep);
	if (!idle_ns || !ep->base)
		return false;
	uint64_t p = atomic_load_explicit(&se->my_prod, memory_order_relaxed);
	if (p != atomic_load_explicit(&se->idle_prod, memory_order_relaxed) ||
	    atomic_load_explicit(&peer(ep)->cons, memory_order_relaxed) != p) {
		atomic_store_explicit(&se->idle_prod, p, memory_order_relaxed);
		atomic_store_explicit(&se->idle_since, now, memory_order_relaxed);
		return false;
	}
	if (now - atomic_load_explicit(&se->idle_since, memory_order_relaxed) < idle_ns)
		return false;
	return atomic_load_explicit(&se->touch, memory_order_relaxed) ||
	       shm_win_w(my_word(ep)) > start_win(ep);
}

static size_t shm_trim(struct fab_ep *ep, unsigned how)
{
	struct shm_ep *se = SE(ep);
	if (!ep->base)
		return 0;
	size_t r = 0;
	if (how == FAB_TRIM_CLOSE && !(ep->flags & FAB_EP_POOLED))
		return 0;
	uint64_t p = atomic_load(&se->my_prod);
	if (atomic_load_explicit(&peer(ep)->cons, memory_order_acquire) == p &&
	    atomic_load(&se->my_fb) == SHM_FB_NONE) {
		if (shm_win_w(my_word(ep)) > start_win(ep)) {
			uint32_t sw = start_win(ep);
			atomic_store(&se->my_grow, 0);
			set_window(ep, SHM_WIN(sw, (sw - p % sw) % sw));
		}
		/* At the close of an arena slot, a ring that never left its
		 * start window keeps its few pages for the slot's next
		 * connection, which writes the same slots first: under churn
		 * giving them back cost a page-freeing system call per close
		 * and the faults to get them again (connection rate -20 %). */
		uint32_t t = atomic_load(&se->touch);
		if (how != FAB_TRIM_CLOSE || t > start_win(ep))
			r = give_back(ep, ep->side, atomic_exchange(&se->touch, 0));
	}
	/* At our last close, a peer that closed too wrote its last word: its
	 * ring is no one's any more (an arena slot keeps its memfd; a region
	 * of its own goes with the last mapping). The same rule: a ring whose
	 * window never grew (an honest peer's word; any other word only
	 * changes what we give back) keeps its pages for the next user. */
	if (how == FAB_TRIM_CLOSE && (ep->flags & FAB_EP_POOLED) &&
	    atomic_load_explicit(&peer(ep)->closed, memory_order_acquire) &&
	    shm_win_w(atomic_load_explicit(&peer(ep)->win, memory_order_relaxed)) >
	    start_win(ep))
		r += give_back(ep, !ep->side, ep->nslots);
	return r;
}

/* Publishing into an empty ring also stamps the time and the message
 * (post_ns, post_seq, before the release of prod): the receiver orders
 * its ready connections by it. Streaming into a ring the peer has not
 * emptied costs one load. */
static int shm_post(struct fab_ep *ep, size_t len)
{
	(void)len;
	struct shm_side *m = me(ep);
	uint64_t p = atomic_load_explicit(&SE(ep)->my_prod, memory_order_relaxed);
	if (atomic_load_explicit(&peer(ep)->cons, memory_order_acquire) == p) {
		atomic_store_explicit(&m->post_ns, fab_clock(), memory_order_relaxed);
		atomic_store_explicit(&m->post_seq, p, memory_order_relaxed);
	}
	atomic_store_explicit(&SE(ep)->my_prod, p + 1, memory_order_release);
	atomic_store_explicit(&m->prod, p + 1, memory_order_release);
	return 0;
}

/* The stamp holds while the stamped message is the oldest one pending.
 * Once it is consumed, the messages behind it were posted into a queue
 * that was not empty (or the peer emptied it between the sender's look
 * and its post): since when we are readable is not known here (0). */
static uint64_t shm_rx_since(struct fab_ep *ep)
{
	struct shm_side *p = peer(ep);
	uint64_t seq = atomic_load_explicit(&p->post_seq, memory_order_acquire);
	uint64_t t = atomic_load_explicit(&p->post_ns, memory_order_relaxed);
	return seq == atomic_load_explicit(&SE(ep)->my_cons, memory_order_relaxed) ? t : 0;
}

/* ---- byte window (SO_SNDBUF / SO_RCVBUF, sdp/tx.c) ----------------------- */

static void shm_set_rx_bytes(struct fab_ep *ep, uint64_t bytes)
{
	atomic_store_explicit(&SE(ep)->my_rx_bytes, bytes, memory_order_release);
	atomic_store_explicit(&me(ep)->rx_bytes, bytes, memory_order_release);
}

static uint64_t shm_peer_rx_bytes(struct fab_ep *ep)
{
	return atomic_load_explicit(&peer(ep)->rx_bytes, memory_order_acquire);
}

static void shm_set_rcvbuf(struct fab_ep *ep, uint32_t bytes)
{
	atomic_store(&me(ep)->rcvbuf, bytes);
}

static uint32_t shm_peer_rcvbuf(struct fab_ep *ep)
{
	return atomic_load_explicit(&peer(ep)->rcvbuf, memory_order_relaxed);
}

static void shm_set_linger0(struct fab_ep *ep, bool on)
{
	atomic_store(&me(ep)->linger0, on);
}

static bool shm_peer_linger0(struct fab_ep *ep)
{
	return atomic_load_explicit(&peer(ep)->linger0, memory_order_acquire) != 0;
}

static void shm_set_tx_limited(struct fab_ep *ep, bool on)
{
	if (atomic_load_explicit(&me(ep)->tx_limited, memory_order_relaxed) != on)
		atomic_store(&me(ep)->tx_limited, on);
}

static bool shm_peer_tx_limited(struct fab_ep *ep)
{
	return atomic_load_explicit(&peer(ep)->tx_limited, memory_order_relaxed) != 0;
}

static uint32_t shm_rx_pending(struct fab_ep *ep)
{
	for (;;) {
		uint64_t c = atomic_load_explicit(&SE(ep)->my_cons, memory_order_acquire);
		uint64_t p = atomic_load_explicit(&peer(ep)->prod, memory_order_acquire);
		if (atomic_load_explicit(&SE(ep)->my_cons, memory_order_acquire) != c)
			continue;             /* a reader of ours took some: again */
		if (p < c || p - c > ep->nslots)
			return UINT32_MAX;    /* corrupt: caller aborts */
		return (uint32_t)(p - c);
	}
}

static int shm_rx_peek(struct fab_ep *ep, uint32_t idx, const void **msg,
		       size_t *cap)
{
	uint32_t n = shm_rx_pending(ep);
	if (n == UINT32_MAX)
		return -EPROTO;
	if (idx >= n)
		return -EAGAIN;
	uint64_t c = atomic_load_explicit(&SE(ep)->my_cons, memory_order_relaxed) + idx;
	/* The peer's window word, read after its prod (acquired above): a
	 * message in flight sits in the same slot under every word an honest
	 * peer writes while it is in flight. */
	uint32_t w = atomic_load_explicit(&peer(ep)->win, memory_order_acquire);
	if (!shm_win_ok(ep->nslots, w))
		return -EPROTO;
	*msg = ring(ep, !ep->side) + (size_t)shm_slot(ep->nslots, w, c) * ep->slot_size;
	*cap = ep->slot_size;
	return 0;
}

static int shm_rx_release(struct fab_ep *ep)
{
	struct shm_side *m = me(ep);
	uint64_t c = atomic_load_explicit(&SE(ep)->my_cons, memory_order_relaxed);
	/* Releasing into a full ring: the peer may sleep until it gets
	 * this credit (shm_kick_owed). */
	uint64_t pp = atomic_load_explicit(&peer(ep)->prod, memory_order_relaxed);
	uint32_t pw = shm_win_w(atomic_load_explicit(&peer(ep)->win, memory_order_relaxed));
	if (pp - c >= (pw && pw <= ep->nslots ? pw : ep->nslots))
		atomic_store_explicit(&SE(ep)->full_at, pp, memory_order_relaxed);
	atomic_store_explicit(&SE(ep)->my_cons, c + 1, memory_order_release);
	atomic_store_explicit(&m->cons, c + 1, memory_order_release);
	return 0;
}

static uint64_t shm_tx_seq(struct fab_ep *ep) { return atomic_load(&SE(ep)->my_prod); }
static uint64_t shm_rx_seq(struct fab_ep *ep) { return atomic_load(&SE(ep)->my_cons); }

/* ---- RDMA by Cross Memory Attach ---------------------------------------- */

/* The key of a Cross Memory Attach "memory region" is the process id;
 * the engine has verified it (zcopy.c, ident.c) before it gets here. */
static ssize_t shm_rdma_read(struct fab_ep *ep, const struct iovec *local, int nlocal,
			     uint64_t raddr, size_t len, uint64_t rkey)
{
	(void)ep;
	if (!rkey || rkey > INT32_MAX)
		return -EINVAL;
	struct iovec r = { (void *)(uintptr_t)raddr, len };
	ssize_t n = process_vm_readv((pid_t)rkey, local, (unsigned long)nlocal, &r, 1, 0);
	return n < 0 ? -errno : n;
}

static ssize_t shm_rdma_write(struct fab_ep *ep, const struct iovec *local, int nlocal,
			      uint64_t raddr, size_t len, uint64_t rkey)
{
	(void)ep;
	if (!rkey || rkey > INT32_MAX)
		return -EINVAL;
	struct iovec r = { (void *)(uintptr_t)raddr, len };
	ssize_t n = process_vm_writev((pid_t)rkey, local, (unsigned long)nlocal, &r, 1, 0);
	return n < 0 ? -errno : n;
}

/* ---- wake-ups ----------------------------------------------------------- */

static void shm_arm(struct fab_ep *ep, unsigned what)
{
	atomic_fetch_add_explicit(&me(ep)->arms, 1, memory_order_relaxed);
	atomic_fetch_or(&me(ep)->armed, what);
	atomic_thread_fence(memory_order_seq_cst);
}

static void shm_disarm(struct fab_ep *ep, unsigned what)
{
	/* A withdrawn arm undoes its count: a waiter that armed, found
	 * what it waited for and went on never slept, and the peer's kick
	 * that took the arm before it still says "awake" (kick_owed, which
	 * reads the bits first: the count goes back before they clear). */
	atomic_fetch_sub(&me(ep)->arms, 1);
	atomic_fetch_and(&me(ep)->armed, ~what);
}

static int send_token(struct fab_ep *ep, int wfd);

/*
 * The peer may have armed any route for this progress: a token on the
 * TCP socket (a thread asleep on the socket itself), its queue (a waiter
 * asleep on the link of the two processes: shm_link.c), or its futex word
 * (a blocked send/recv of a threaded process: wait.c). Each one armed. A
 * queue arm we cannot serve (no link here) gets a token: the peer's queue
 * waiter watches the socket too.
 */
static int shm_kick(struct fab_ep *ep, int wfd, unsigned what)
{
	atomic_thread_fence(memory_order_seq_cst);
	struct shm_side *p = peer(ep);
	unsigned all = what | FAB_WAIT_Q(what) | FAB_WAIT_F(what);
	uint32_t armed = atomic_load_explicit(&p->armed, memory_order_relaxed);
	if (!(armed & all)) {
		if (what & FAB_WAIT_ZC)
			atomic_store(&SE(ep)->owed_engine, 1);   /* kick_owed */
		return 0;
	}
	uint32_t took = atomic_fetch_and(&p->armed, ~all) & all;
	if (!took)
		return 0;
	uint32_t arms = atomic_load_explicit(&p->arms, memory_order_relaxed);
	if (took & FAB_WAIT_F(what)) {
		atomic_fetch_add(&p->fwake, 1);
		syscall(SYS_futex, &p->fwake, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	}
	if ((took & FAB_WAIT_Q(what)) && shm_link_kick(ep, took >> FAB_WAIT_ROUTE2_SHIFT) < 0)
		took |= what;                 /* no link: a token instead */
	int r = took & what ? send_token(ep, wfd) : 0;
	if (r < 0)
		return r;
	/* Woken: the peer looks before it arms again, so nothing is owed
	 * to it until it has (kick_owed). */
	atomic_store_explicit(&SE(ep)->took_arms, arms, memory_order_relaxed);
	atomic_store_explicit(&SE(ep)->took, 1, memory_order_relaxed);
	if (!(took & what))
		return took & FAB_WAIT_Q(what) ? 2 : 3;   /* no token */
	return 1;
}

static _Atomic uint32_t *shm_fwake_word(struct fab_ep *ep)
{
	return &me(ep)->fwake;
}

/*
 * Before we sleep: a token the peer may be owed. The peer's request to be
 * kicked lives in shared memory, so a process that can write the region
 * can clear it while the peer sleeps; the peer then sleeps on although we
 * made the progress it waits for, and if we sleep too, for ever. So when
 * the peer has not consumed all we posted, or we released into its full
 * ring and it has posted nothing since, or a zero-copy kick of ours found
 * it not armed, and it is not armed for that, and it has read every token
 * we sent (none is on its way to wake it), we send one anyway. An honest peer in that state is awake and busy (it
 * drained its tokens and did not arm); the token costs it one drain at
 * its next sleep, and while it is unread no further one is owed.
 */
static int shm_kick_owed(struct fab_ep *ep, int wfd)
{
	/* No fence of its own: callers have just armed (which fences), and
	 * this is a safety net, not one half of a Dekker pair. A peer that
	 * has not attached yet (or never will: it kept the connection on
	 * TCP) is owed nothing: only a peer that armed may get a token. */
	struct shm_side *p = peer(ep);
	if (atomic_load(&p->pid) == 0)
		return 0;                     /* its first write when it attaches */
	uint64_t sent = atomic_load(&me(ep)->tokens_sent);
	if ((sent & TOKENS_FROZEN) || atomic_load(&p->tokens_rcvd) != sent)
		return 0;
	/* A peer that has not armed since a kick of ours took its last arm
	 * (or never armed) has not slept since: it is awake, and looks
	 * before it arms again. Owed is only an arm that went without our
	 * kick. */
	uint32_t armed = atomic_load(&p->armed);
	uint32_t arms = atomic_load(&p->arms);
	if (atomic_load_explicit(&SE(ep)->took, memory_order_relaxed)
	    ? arms == atomic_load_explicit(&SE(ep)->took_arms, memory_order_relaxed)
	    : arms == 0)
		return 0;
	armed |= armed >> FAB_WAIT_ROUTE2_SHIFT;      /* any route */
	armed |= armed >> FAB_WAIT_ROUTE3_SHIFT;
	bool owed = !(armed & FAB_WAIT_RX) &&
		    atomic_load(&p->cons) < atomic_load(&SE(ep)->my_prod);
	uint64_t fa = atomic_load_explicit(&SE(ep)->full_at, memory_order_relaxed);
	if (fa) {
		if (atomic_load(&p->prod) == fa && !(armed & FAB_WAIT_CREDIT))
			owed = true;
		atomic_store_explicit(&SE(ep)->full_at, 0, memory_order_relaxed);
	}
	if (atomic_load_explicit(&SE(ep)->owed_engine, memory_order_relaxed) &&
	    atomic_exchange(&SE(ep)->owed_engine, 0) && !(armed & FAB_WAIT_ZC))
		owed = true;
	return owed ? send_token(ep, wfd) : 0;
}

/* Count a token, then write it (see PROTOCOL.md section 9). */
static int send_token(struct fab_ep *ep, int wfd)
{
	/* Count first, and never once the count is final (TOKENS_FROZEN):
	 * the peer reads exactly the announced number, so after a fallback no
	 * token can land among application bytes. */
	_Atomic uint64_t *ts = &me(ep)->tokens_sent;
	uint64_t v = atomic_load(ts);
	do {
		if (v & TOKENS_FROZEN)
			return 0;
	} while (!atomic_compare_exchange_weak(ts, &v, v + 1));
	/* The socket carries 1-byte tokens only: Nagle would hold the second
	 * behind the first one's delayed ACK. Set at the first token rather
	 * than at set-up (most short connections never send one). */
	if (!atomic_load_explicit(&SE(ep)->nodelay, memory_order_acquire)) {
		int one = 1;
		sys_setsockopt(wfd, SOL_TCP, TCP_NODELAY, &one, sizeof one);
		atomic_store_explicit(&SE(ep)->nodelay, 1, memory_order_release);
	}
	int r = shm_token_write(wfd);
	if (r == 1)
		return 1;
	/* Counted but not sent (socket gone or full): the count must stay
	 * true, so take it back only if it is not final yet. */
	uint64_t w = atomic_load(ts);
	while (!(w & TOKENS_FROZEN) && !atomic_compare_exchange_weak(ts, &w, w - 1))
		;
	return r;
}

int shm_token_write(int wfd)
{
	static const unsigned char tok = SHM_TOKEN_BYTE;
	for (;;) {
		long k = syscall(SYS_sendto, wfd, &tok, 1, MSG_DONTWAIT | MSG_NOSIGNAL,
				 NULL, 0);
		if (k == 1)
			return 1;
		if (k < 0 && errno == EINTR)
			continue;
		return k < 0 ? -errno : -EIO;
	}
}


/*
 * A byte beyond the announced tokens while the peer is on SDP (its
 * fallback mark not final) was not written by the peer's library: the
 * peer writes application bytes on the TCP socket only after its mark is
 * final, and counts every token before writing it. Such a byte (a raw
 * system call, io_uring, a hostile peer) cannot be placed in the stream,
 * and left unread it would keep the socket readable, so that every sleep
 * on it returned at once: -EPROTO, the caller resets the connection.
 * Loaded after the peek that showed the byte: a token or a final mark
 * behind it is then visible.
 */
static bool stray_byte(struct fab_ep *ep)
{
	return shm_tokens_due(ep) == 0 && !unborn(ep) &&
	       atomic_load(&peer(ep)->fb) != SHM_FB_FINAL;
}

static int shm_drain(struct fab_ep *ep, int wfd)
{
	unsigned char buf[256];
	for (;;) {
		uint64_t due = shm_tokens_due(ep);
		if (due == 0) {
			/* Nothing announced: only look for FIN/RST. */
			long r = syscall(SYS_recvfrom, wfd, buf, 1, MSG_DONTWAIT | MSG_PEEK,
					 NULL, NULL);
			if (r == 0)
				return 1;
			if (r == 1 && shm_tokens_due(ep))
				continue;             /* a token announced meanwhile */
			if (r == 1 && stray_byte(ep))
				return -EPROTO;
			if (r == 1)
				return 0;             /* application bytes after the
						       * peer's fallback */
			if (r < 0 && errno != EAGAIN && errno != EINTR)
				return -errno;
			return 0;
		}
		size_t want = due < sizeof buf ? (size_t)due : sizeof buf;
		long r = syscall(SYS_recvfrom, wfd, buf, want, MSG_DONTWAIT,
				 NULL, NULL);
		if (r > 0) {
			took(ep, (uint64_t)r);
			if (!all_tokens(buf, (size_t)r))
				return -EPROTO;   /* not ours: see stray_byte */
			/* All announced tokens taken: done. A FIN or RST
			 * behind them keeps the socket readable, so the next
			 * sleep or look sees it; looking now would cost every
			 * wake-up a third system call. */
			if ((size_t)r < want || shm_tokens_due(ep) == 0)
				return 0;
			continue;
		}
		if (r == 0)
			return 1;             /* TCP FIN: the peer's socket is closed */
		if (errno == EAGAIN || errno == EINTR)
			return 0;
		return -errno;                /* ECONNRESET etc. */
	}
}

/* ---- choice -------------------------------------------------------------- */

/* The IPv4 or IPv6 address of sa (a v4-mapped IPv6 address as IPv4):
 * its family and 4 or 16 bytes in a, or 0. */
static int addr_of(const struct sockaddr *sa, socklen_t len, uint8_t a[16])
{
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		memcpy(a, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
		return AF_INET;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct in6_addr *i6 = &((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
		if (IN6_IS_ADDR_V4MAPPED(i6)) {
			memcpy(a, &i6->s6_addr[12], 4);
			return AF_INET;
		}
		memcpy(a, i6, 16);
		return AF_INET6;
	}
	return 0;
}

/* Shared memory reaches the processes of this host: the peer's address is
 * a loopback address or one of an interface that is up. */
static bool shm_reaches(const struct sockaddr *peer, socklen_t len)
{
	uint8_t a[16];
	int fam = addr_of(peer, len, a);
	if (fam == AF_INET && a[0] == 127)
		return true;
	static const uint8_t lo6[16] = { [15] = 1 };
	if (fam == AF_INET6 && !memcmp(a, lo6, 16))
		return true;
	if (!fam)
		return false;
	struct ifaddrs *ifa, *i;
	if (getifaddrs(&ifa) < 0)
		return false;
	bool found = false;
	for (i = ifa; i && !found; i = i->ifa_next) {
		if (!i->ifa_addr || !(i->ifa_flags & IFF_UP))
			continue;
		uint8_t ia[16];
		socklen_t l = i->ifa_addr->sa_family == AF_INET ?
			      sizeof(struct sockaddr_in) : sizeof(struct sockaddr_in6);
		if (addr_of(i->ifa_addr, l, ia) == fam &&
		    !memcmp(ia, a, fam == AF_INET ? 4 : 16))
			found = true;
	}
	freeifaddrs(ifa);
	return found;
}

/* The TCP socket is the wait object. */
static int shm_wait_fd(struct fab_ep *ep, int tcpfd)
{
	(void)ep;
	return tcpfd;
}

/* Cross Memory Attach names a process: the key of our memory is our pid. */
static uint64_t shm_mr_key(struct fab_ep *ep, const void *addr, size_t len)
{
	(void)ep;
	(void)addr;
	(void)len;
	return (uint64_t)syscall(SYS_getpid);
}

const struct fab_ops fab_shm_ops = {
	.name        = "shm",
	.id          = FAB_ID_SHM,
	.traits      = FAB_T_PEER_READS,
	/* choice and set-up (shm_region.c) */
	.init        = shm_init,
	.reaches     = shm_reaches,
	.fits        = shm_fits,
	.offer       = shm_ep_offer,
	.accept      = shm_ep_accept,
	.connected   = shm_ep_connected,
	.decline     = shm_ep_decline,
	.abandon     = shm_ep_abandon,
	.peer_up     = shm_ep_peer_up,
	.detach      = shm_detach,
	.unmap       = shm_unmap,
	/* message channel */
	.tx_buf      = shm_tx_buf,
	.post        = shm_post,
	.rx_peek     = shm_rx_peek,
	.rx_release  = shm_rx_release,
	.credits     = shm_credits,
	.rx_pending  = shm_rx_pending,
	.tx_seq      = shm_tx_seq,
	.rx_seq      = shm_rx_seq,
	.rx_since    = shm_rx_since,
	/* byte window */
	.set_rx_bytes    = shm_set_rx_bytes,
	.peer_rx_bytes   = shm_peer_rx_bytes,
	.set_rcvbuf      = shm_set_rcvbuf,
	.peer_rcvbuf     = shm_peer_rcvbuf,
	.set_tx_limited  = shm_set_tx_limited,
	.peer_tx_limited = shm_peer_tx_limited,
	.set_linger0     = shm_set_linger0,
	.peer_linger0    = shm_peer_linger0,
	/* marks */
	.mark        = shm_mark,
	.marks       = shm_marks,
	.peer_sane   = shm_peer_sane,
	.self_sane   = shm_self_sane,
	/* zero-copy control words */
	.zc_me       = shm_zc_me,
	.zc_peer     = shm_zc_peer,
	.zc_publish  = shm_zc_publish,
	.zc_cas      = shm_zc_cas,
	.probe_addr  = shm_probe_addr,
	.probe       = shm_probe,
	/* RDMA */
	.rdma_read   = shm_rdma_read,
	.rdma_write  = shm_rdma_write,
	/* wake-ups */
	.arm         = shm_arm,
	.disarm      = shm_disarm,
	.kick        = shm_kick,
	.drain       = shm_drain,
	.kick_owed   = shm_kick_owed,
	.fwake_word  = shm_fwake_word,
	.tokens_due  = shm_tokens_due,
	.tokens_took = shm_tokens_took,
	.tokens_unread = shm_tokens_unread,
	.wait_fd     = shm_wait_fd,
	.mr_key      = shm_mr_key,
	/* fallback */
	.fb_publish  = shm_fb_publish,
	.fb_peer_pos = shm_fb_peer_pos,
	.tx_msg      = shm_tx_msg,
	/* readiness queues (shm_link.c) */
	.q_bind      = shm_q_bind,
	.q_hold      = shm_q_hold,
	.q_release   = shm_q_release,
	.q_fd        = shm_q_fd,
	.q_pop       = shm_q_pop,
	.q_sleep     = shm_q_sleep,
	.q_pending   = shm_q_pending,
	/* the send window (above) */
	.tx_window   = shm_tx_window,
	.idle_due    = shm_idle_due,
	.trim        = shm_trim,
};
