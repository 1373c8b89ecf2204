/*
 * rcvbuf.c - connection memory that follows the traffic: the engine's half
 * of the send window (the provider's half is in fabric/shm.c).
 *
 * A connection's sends start with a few of the peer's receive buffers and
 * grow while they stream (the provider does that by itself, at the post).
 * When a direction has been idle for SDP_IDLE_TRIM_MS the window shrinks
 * back and the ring's pages go back to the system. There is no timer
 * thread: the trim happens at the process's looks - the full scan an
 * epoll set makes at least every SDP_CHECK_MS, poll and select (which wake
 * as often), and a blocking send or receive that waits (it wakes as often
 * too) - each a clock value compared with the connection's last activity,
 * with no system call unless a trim is due. A process blocked outside the
 * library keeps its connections' pages until it next enters it. At the
 * last close, a ring whose window grew is given back too (an arena slot's
 * memfd outlives its connection); one that stayed in its start window
 * keeps its few pages for the slot's next connection.
 */
#include <errno.h>
#include <pthread.h>

#include "sdp/conn.h"
#include "sdp/log.h"

static void trimmed(struct sdp_conn *c, size_t bytes)
{
	struct fab_ep *ep = &c->ep;
	if (bytes) {
		/* Under tx_lock, but taken inside a poll(): ThreadSanitizer
		 * does not see a lock taken inside a blocking call it
		 * intercepts. */
		__atomic_fetch_add(&c->st.trims, 1, __ATOMIC_RELAXED);
		__atomic_fetch_add(&c->st.trimmed_bytes, bytes, __ATOMIC_RELAXED);
	}
	__atomic_store_n(&c->st.ring_window, ep->ops->tx_window(ep), __ATOMIC_RELAXED);
}

void sdp_idle_look(struct sdp_conn *c, uint64_t now)
{
	struct fab_ep *ep = &c->ep;
	const struct fab_ops *ops = ep->ops;
	if (!c->transport || !ops || !ops->idle_due ||
	    atomic_load_explicit(&c->state, memory_order_relaxed) != SDP_ST_ESTABLISHED ||
	    atomic_load_explicit(&c->fb_done, memory_order_relaxed) ||
	    !ops->idle_due(ep, now))
		return;
	/* A sender holds the lock: it is not idle; look again later. */
	int r = pthread_mutex_trylock(&c->tx_lock);
	if (r == EOWNERDEAD) {
		pthread_mutex_consistent(&c->tx_lock);
		r = 0;
	}
	if (r)
		return;
	if (atomic_load(&c->state) == SDP_ST_ESTABLISHED && !atomic_load(&c->fb_done)) {
		size_t n = ops->trim(ep, FAB_TRIM_IDLE);
		trimmed(c, n);
		if (n)
			sdp_log(3, "idle connection gave back %zu bytes of buffers", n);
	}
	sdp_unlock(&c->tx_lock);
}

void sdp_trim_close(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	if (!ep->ops || !ep->ops->trim || !c->transport)
		return;
	if (sdp_lock(&c->tx_lock))
		return;
	trimmed(c, ep->ops->trim(ep, FAB_TRIM_CLOSE));
	sdp_unlock(&c->tx_lock);
}

void sdp_window_note(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	if (!ep->ops->tx_window)
		return;
	uint32_t w = ep->ops->tx_window(ep);
	__atomic_store_n(&c->st.ring_window, w, __ATOMIC_RELAXED);
	if (w > c->st.ring_window_max)
		__atomic_store_n(&c->st.ring_window_max, w, __ATOMIC_RELAXED);
}

void sdp_idle_look_all(struct sdp_conn *const *cs, size_t n)
{
	uint64_t now = 0;
	for (size_t i = 0; i < n; i++) {
		if (!cs[i])
			continue;
		if (!now)
			now = sdp_now_ns();
		sdp_idle_look(cs[i], now);
	}
}
