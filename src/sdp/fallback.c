/*
 * fallback.c - leaving SDP for plain TCP in the middle of a connection.
 *
 * Needed when the socket is about to be used by a program that may not run
 * the switch (exec) or handed to another process (SCM_RIGHTS). Either side
 * may start; the other side follows when it next enters the library (the
 * starter kicks it). Each side, when it leaves:
 *   1. marks itself leaving (it posts and consumes nothing more), kicks
 *      the peer, then publishes (in its control block) how far it consumed
 *      the peer's ring and that its count of wake-up tokens written to the
 *      TCP socket is final - in that order, so that no peer can go to
 *      sleep without either seeing the mark or getting the kick;
 *   2. waits until the peer has done the same;
 *   3. re-sends on the TCP socket, in order, the payload of every message
 *      of its own that the peer had not consumed (DisConn becomes a TCP
 *      shutdown(SHUT_WR));
 *   4. reads and discards exactly the peer's announced tokens.
 * From then on each TCP byte stream holds exactly the application's bytes,
 * in order, with nothing lost, repeated or injected, and no timeout taken.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <time.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/proto.h"
#include "sdp/sys.h"
#include "switch/log.h"

/* Write all of buf to the TCP socket, whatever its O_NONBLOCK says. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t r = syscall(SYS_sendto, fd, buf, len, MSG_NOSIGNAL, NULL, 0);
		if (r > 0) {
			buf += r;
			len -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			sys_poll(&p, 1, -1);
			continue;
		}
		return -errno;
	}
	return 0;
}

static int discard_tokens(struct fab_ep *ep, int fd)
{
	char buf[256];
	uint64_t due;
	/* The peer counted each token before writing it, so they are all
	 * on their way; a peer that announced tokens it never sends is
	 * broken: give up after a second without progress. */
	uint64_t last = sdp_now_ns();
	while ((due = shm_tokens_due(ep)) != 0) {
		if (due > (1u << 20) || sdp_now_ns() - last > 1000000000ull)
			return -EPROTO;
		size_t want = due < sizeof buf ? (size_t)due : sizeof buf;
		ssize_t r = syscall(SYS_recvfrom, fd, buf, want, MSG_DONTWAIT, NULL, NULL);
		if (r > 0) {
			shm_tokens_took(ep, (uint64_t)r);
			last = sdp_now_ns();
			continue;
		}
		if (r == 0)
			return -EPIPE;            /* peer closed: nothing follows */
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		sys_poll(&p, 1, 100);
	}
	return 0;
}

static int resend_unconsumed(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	uint64_t pcons;
	uint32_t poff;
	shm_fb_peer_pos(ep, &pcons, &poff);
	uint64_t end = ep->ops->tx_seq(ep);
	if (pcons > end || end - pcons > ep->nslots)
		return -EPROTO;
	bool fin = false;
	for (uint64_t seq = pcons; seq < end; seq++) {
		const char *m = shm_tx_msg(ep, seq);
		struct sdp_bsdh h;
		memcpy(&h, m, sizeof h);
		if (h.len < sizeof h || h.len > ep->slot_size)
			return -EPROTO;
		uint32_t skip = seq == pcons ? poff : 0;
		if (h.mid == SDP_MID_DATA) {
			uint32_t plen = h.len - (uint32_t)sizeof h;
			if (skip > plen)
				return -EPROTO;
			int r = write_all(fd, m + sizeof h + skip, plen - skip);
			if (r)
				return r;
		} else if (h.mid == SDP_MID_SRC_AVAIL) {
			/* Our advertised buffer: still valid, since only the
			 * sending call (this process) falls back while it waits. */
			struct sdp_srcavail sa;
			memcpy(&sa, m + sizeof h, sizeof sa);
			if (sa.key != (int32_t)sdp_pid || skip > sa.len)
				return -EPROTO;
			int r = write_all(fd, (const char *)(uintptr_t)sa.addr + skip,
					  sa.len - skip);
			if (r)
				return r;
		} else if (h.mid == SDP_MID_DISCONN) {
			fin = true;
		}
	}
	if (fin || atomic_load(&c->tx_shut))
		sys_shutdown(fd, SHUT_WR);
	return 0;
}

/*
 * Step 1, with both locks held: leave in two stages around the kick.
 * The peer may be asleep or about to sleep: it arms, looks at our mark,
 * and sleeps if it sees nothing. So the mark it looks at ("leaving") must
 * be visible before the kick, as any progress is before its kick (the
 * Dekker pair of PROTOCOL.md section 9); kicking first let a peer that
 * armed in between wake, look, see nothing and sleep for ever, since no
 * token is sent once our count is final. The count the peer discards must
 * include that kick's token, so it is frozen only after the kick (stage
 * 2), and the peer waits for stage 2 before it reads it. Idempotent.
 */
static void leave(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	if (shm_my_fb(ep) == SHM_FB_FINAL)
		return;
	shm_fb_leave(ep);
	ep->ops->kick(ep, fd, FAB_WAIT_RX | FAB_WAIT_CREDIT);
	shm_fb_publish(ep, c->rx_off);
}

/* Step 1 alone: freeze our side and wake the peer. Idempotent. */
void sdp_fallback_publish(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	if (atomic_load(&c->fb_done) || shm_my_fb(ep) == SHM_FB_FINAL)
		return;
	if (sdp_lock(&c->tx_lock))
		return;
	if (sdp_lock(&c->rx_lock) == 0) {
		leave(c, fd);
		sdp_unlock(&c->rx_lock);
	}
	sdp_unlock(&c->tx_lock);
}

/*
 * Step 2: wait until the peer's mark is final. We arm before each look, so
 * the kick the peer gives after its stage 1 wakes us (the peer has not
 * seen our mark yet while it is on SDP; once it follows, its kick is
 * counted before its count is frozen). Between the peer's two stages
 * there are only a few stores: yield for them, then nap in short slices,
 * so a peer stopped there costs no CPU. Tokens are taken only as the
 * connection's watcher (another thread's sleep may be taking them).
 */
static int wait_peer_final(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	unsigned yields = 0;
	for (;;) {
		if (atomic_load(&c->peer_gone) || shm_peer_abort(ep) ||
		    atomic_load(&c->state) == SDP_ST_RESET)
			return -ECONNRESET;   /* nothing to hand over: TCP says the rest */
		ep->ops->arm(ep, FAB_WAIT_RX | FAB_WAIT_CREDIT);
		bool watching = sdp_watch(c);
		int pfb = shm_peer_fb(ep);
		if (pfb == SHM_FB_FINAL) {
			if (watching)
				sdp_unwatch(c);
			return 0;
		}
		int ms = 100;
		if (pfb == SHM_FB_LEAVING) {
			if (yields++ < 64) {
				if (watching)
					sdp_unwatch(c);
				sched_yield();
				continue;
			}
			ms = 1;
		}
		if (watching) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			if (sys_poll(&p, 1, ms) > 0)
				sdp_on_wakeup(c, fd);
			sdp_unwatch(c);
		} else {
			/* Someone else sleeps on the socket and takes the
			 * tokens; it bumps wake_gen, but a nap is enough. */
			struct timespec nap = { 0, 1000000 };
			nanosleep(&nap, NULL);
		}
	}
}

/* Are a and b the two ends of one connection (both in this process)? */
bool sdp_same_conn_peer(struct sdp_conn *a, struct sdp_conn *b)
{
	return a != b && a->ep.base && b->ep.base && a->ep.side != b->ep.side &&
	       shm_token(&a->ep) == shm_token(&b->ep);
}

int sdp_fallback(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	if (atomic_load(&c->fb_done))
		return 0;
	if (sdp_lock(&c->tx_lock))
		return -EIO;
	if (sdp_lock(&c->rx_lock)) {
		sdp_unlock(&c->tx_lock);
		return -EIO;
	}
	int r = 0;
	if (atomic_load(&c->fb_done))
		goto out;
	if (!shm_peer_sane(ep)) {
		r = -EPROTO;
		goto done;
	}
	leave(c, fd);
	r = wait_peer_final(c, fd);
	if (r)
		goto done;
	r = resend_unconsumed(c, fd);
	if (!r)
		r = discard_tokens(ep, fd);
done:
	if (r && r != -ECONNRESET && r != -EPIPE) {
		/* The streams cannot be handed over intact: end the TCP
		 * connection rather than let it carry anything wrong. */
		sdp_log(0, "fd %d: fallback impossible (%d): connection shut down", fd, r);
		struct linger lg = { 1, 0 };
		sys_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
		sys_shutdown(fd, SHUT_RDWR);
	}
	atomic_store(&c->fb_done, 1);
	c->transport = 0;
	sdp_log(2, "fd %d left SDP for TCP (%d)", fd, r);
out:
	sdp_unlock(&c->rx_lock);
	sdp_unlock(&c->tx_lock);
	return r;
}

bool sdp_fallback_pending(struct sdp_conn *c)
{
	return atomic_load_explicit(&c->fb_done, memory_order_relaxed) ||
	       shm_peer_fb(&c->ep) || shm_my_fb(&c->ep);
}
