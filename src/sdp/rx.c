/*
 * rx.c - the receive side: the recv loop, Buffer Copy out of the ring, end
 * of stream, and readiness.
 *
 * recv() walks the received messages in order, one handler per message
 * type (the zero-copy ones are in zcsink.c). A Data message's payload is
 * copied out (one copy: from the receive buffer straight into the user's
 * buffer); when a message is fully consumed its buffer is released, which
 * returns the credit, and the peer is kicked if it waits for credits.
 * DisConn means end of stream (TCP FIN), AbortConn a reset (TCP RST).
 * Every header is copied out of shared memory and validated before use: a
 * malformed message aborts the connection, never the process.
 */
#include <errno.h>
#include <poll.h>
#include <string.h>

#include "sdp/az.h"
#include "sdp/iov.h"
#include "sdp/log.h"
#include "sdp/rx.h"

_Thread_local uint64_t sdp_rx_seen;
_Thread_local uint32_t sdp_rx_revoke;

/* Read and validate the idx-th pending message header (its payload stays
 * in shared memory: handlers copy out what they use). */
int rx_hdr(struct sdp_conn *c, uint32_t idx, struct sdp_bsdh *h, const char **payload)
{
	struct fab_ep *ep = &c->ep;
	const void *msg;
	size_t cap;
	int r = ep->ops->rx_peek(ep, idx, &msg, &cap);
	if (r == -EPROTO) {
		sdp_log(0, "peer's message out of range: connection aborted");
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	const char *why;
	if (r == -EAGAIN && !ep->ops->peer_sane(ep, &why)) {
		sdp_abort_insane(c, why);
		return -ECONNRESET;
	}
	if (r)
		return r;
	memcpy(h, msg, sizeof *h);
	uint32_t want = (uint32_t)(ep->ops->rx_seq(ep) + 1 + idx);
	uint32_t plen = h->len - (uint32_t)sizeof *h;
	bool ok = h->len >= sizeof *h && h->len <= cap && h->mseq == want &&
		  h->bufs <= ep->nslots;
	switch (h->mid) {
	case SDP_MID_DATA:
	case SDP_MID_DISCONN:
	case SDP_MID_ABORT:
		break;
	case SDP_MID_SRC_AVAIL:
		ok = ok && plen == sizeof(struct sdp_srcavail);
		break;
	case SDP_MID_RDMA_WR_COMPL:
		ok = ok && plen == sizeof(struct sdp_wrcompl);
		break;
	case SDP_MID_MODE_CHANGE:
		ok = ok && plen == sizeof(struct sdp_modechange);
		break;
	default:
		ok = false;
	}
	if (!ok) {
		sdp_log(0, "malformed message (mid 0x%02x len %u mseq %u, expected %u): "
			"connection aborted", h->mid, h->len, h->mseq, want);
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	*payload = (const char *)msg + sizeof *h;
	return 0;
}

void rx_release(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	ep->ops->set_rx_bytes(ep, c->rx_stream);   /* the byte window (tx.c) */
	ep->ops->rx_release(ep);
	c->st.rx_msgs++;
	/* Also written by sends (tx.c), under the other lock. */
	__atomic_store_n(&c->st.credits, ep->ops->credits(ep), __ATOMIC_RELAXED);
	ep->ops->kick(ep, fd, FAB_WAIT_CREDIT);
}

/* End-of-stream or error state when no data is pending: 0 = EOF,
 * -errno = error, 1 = nothing known (wait). As in TCP, once the peer's
 * FIN is in, reads say EOF: an error that came after it (the reset that
 * answers data sent to a closed peer) is for sends and SO_ERROR. */
static int rx_end_state(struct sdp_conn *c)
{
	sdp_check_peer(c);
	if (sdp_fallback_pending(c))
		return -SDP_EFALLBACK;
	if (atomic_load(&c->rx_eof) || sdp_marked(c, FAB_M_FIN_READ))
		return 0;
	int e = atomic_exchange(&c->so_error, 0);
	if (e)
		return -e;
	if (sdp_is_reset(c)) {
		e = sdp_reset_errno(c);
		return e ? -e : 0;
	}
	if (atomic_load(&c->rx_shut) || atomic_load(&c->peer_gone))
		return 0;
	return 1;
}

/* Is a Data message (not just control) waiting? */
static bool data_pending(struct sdp_conn *c)
{
	struct sdp_bsdh h;
	const char *pl;
	return rx_hdr(c, 0, &h, &pl) == 0 && h.mid == SDP_MID_DATA;
}

/* ---- one handler per message type --------------------------------------- */

/* Everything before it was read: now the reset. */
static int rx_on_abort(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl)
{
	(void)h;
	(void)pl;
	atomic_store(&rc->c->state, SDP_ST_RESET);
	return -EAGAIN;
}

/* End of stream after what we have. */
static int rx_on_disconn(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl)
{
	(void)h;
	(void)pl;
	if (!rc->peek && rc->copied == 0) {
		rx_release(rc->c, rc->fd);
		atomic_store(&rc->c->rx_eof, 1);
	}
	/* A peek that reached it returns what it copied before it, or EOF
	 * (nothing is consumed, so the FIN's position cannot tell it). */
	rc->fin_met = rc->peek;
	return -EAGAIN;
}

/* The peer's send half changed mode (no stream bytes). */
int rx_on_modechange(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl)
{
	(void)h;
	struct sdp_modechange mc;
	memcpy(&mc, pl, sizeof mc);
	if (mc.mode > SDP_MODE_PIPELINED) {
		sdp_log(0, "ModeChange to unknown mode %u: connection aborted", mc.mode);
		sdp_conn_abort(rc->c, ECONNRESET);
		return -ECONNRESET;
	}
	if (rc->peek || rc->idx) {
		rc->idx++;
	} else {
		rc->c->peer_mode = (uint8_t)mc.mode;
		rx_release(rc->c, rc->fd);
	}
	rc->off = 0;
	return RX_MORE;
}

/* Stream bytes in the ring: copy them out. */
static int rx_on_data(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl)
{
	struct sdp_conn *c = rc->c;
	int r = rx_sink_settle(rc, h->mid, false);
	if (r)
		return r;
	uint32_t plen = h->len - (uint32_t)sizeof *h;
	if (rc->off > plen) {                 /* cannot happen unless corrupted */
		sdp_log(0, "receive position beyond its message: connection aborted");
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	size_t n = plen - rc->off;
	if (n > rc->total - rc->copied)
		n = rc->total - rc->copied;
	iov_scatter(rc->iov, rc->iovcnt, rc->copied, pl + rc->off, n);
	rc->copied += n;
	if (rc->peek) {
		rc->idx++;
		rc->off = 0;
	} else {
		c->rx_stream += n;
		c->st.rx_bcopy_bytes += n;
		if (rc->off + n == plen) {
			c->rx_off = 0;
			rc->off = 0;
			rx_release(c, rc->fd);
		} else {
			c->rx_off = rc->off + (uint32_t)n;   /* the buffer is full */
		}
	}
	return rc->copied == rc->total ? 0 : RX_MORE;
}

/* Walk the ring from (rc->idx, rc->off) until the buffer is full, nothing
 * more is queued (-EAGAIN) or a handler stops. */
static int rx_walk(struct rx_call *rc)
{
	for (;;) {
		struct sdp_bsdh h;
		const char *pl;
		int r = rx_hdr(rc->c, rc->idx, &h, &pl);
		if (r)
			return r;
		switch (h.mid) {
		case SDP_MID_DATA:          r = rx_on_data(rc, &h, pl); break;
		case SDP_MID_SRC_AVAIL:     r = rx_on_srcavail(rc, &h, pl); break;
		case SDP_MID_RDMA_WR_COMPL: r = rx_on_wrcompl(rc, &h, pl); break;
		case SDP_MID_MODE_CHANGE:   r = rx_on_modechange(rc, &h, pl); break;
		case SDP_MID_DISCONN:       r = rx_on_disconn(rc, &h, pl); break;
		case SDP_MID_ABORT:         r = rx_on_abort(rc, &h, pl); break;
		default:                    r = -ECONNRESET; break;   /* rx_hdr let it by */
		}
		if (r != RX_MORE)
			return r;
	}
}

ssize_t sdp_recv(struct sdp_conn *c, int fd, const struct iovec *iov,
		 int iovcnt, int flags)
{
	size_t total = iov_total(iov, iovcnt);
	bool peek = flags & MSG_PEEK;
	bool waitall = (flags & MSG_WAITALL) && !peek;
	bool nonblock = (flags & MSG_DONTWAIT) || atomic_load(&c->nonblock);
	if (flags & MSG_OOB)
		return -EINVAL;               /* no urgent data is ever pending */

	/* Pages of the buffer in flight (sent asynchronously, or still being
	 * received into) must be ours again before we write them (az.h). */
	az_settle_iov(iov, iovcnt, true);
	az_progress(c);
	int r = sdp_lock(&c->rx_lock);
	if (r)
		return r;
	if (atomic_load_explicit(&c->zcopy_thresh, memory_order_relaxed))
		zc_probe(c, fd);                  /* so that the peer may advertise */
	uint32_t thresh = atomic_load(&c->zcopy_thresh);
	struct rx_call rc = {
		.c = c, .fd = fd, .iov = iov, .iovcnt = iovcnt, .total = total,
		.peek = peek, .nonblock = nonblock, .thresh = thresh,
		.bounce = !thresh || total < thresh,
	};
	/* SO_RCVLOWAT: a blocking recv returns once this much is copied. */
	size_t lowat = atomic_load(&c->rcvlowat);
	if (lowat < 1)
		lowat = 1;
	if (lowat > total)
		lowat = total;
	r = 0;
	while (rc.copied < total || (total == 0 && !data_pending(c))) {
		/* Our side froze for a fallback (maybe another thread): what
		 * is still in the ring is re-sent by the peer on TCP. */
		if (sdp_marked(c, FAB_MY(FAB_M_FB)) || atomic_load(&c->fb_done)) {
			r = rc.copied ? 0 : -SDP_EFALLBACK;
			break;
		}
		/* A peek consumes nothing: every pass copies from the head
		 * again (counting on would hand the same bytes out twice). */
		if (peek)
			rc.copied = 0;
		rx_ack_cancel(c, fd);
		rc.idx = 0;
		rc.off = c->rx_off;
		rc.refused = 0;
		rc.fin_met = false;
		r = rx_walk(&rc);
		if (r == -ECONNRESET)
			break;
		if (rc.copied == total && total)
			{ r = 0; break; }
		if (rc.copied && !waitall && (rc.copied >= lowat || nonblock))
			{ r = 0; break; }
		if (rc.fin_met)
			{ r = 0; break; }
		int end = rx_end_state(c);
		if (end <= 0) {
			r = end;
			break;
		}
		if (total == 0 && data_pending(c))
			{ r = 0; break; }
		if (nonblock) {
			r = -EAGAIN;
			break;
		}
		r = rx_sink_before_wait(&rc);
		if (r < 0)
			break;
		if (r > 0)
			continue;                 /* something came: take it */
		/* A peek left idx messages queued (control messages, or data
		 * below SO_RCVLOWAT): sleep until there is one more, or the
		 * wait would find them and return at once, over and over. */
		/* A SrcAvail we refused stays where it is until the source
		 * revokes it, and nothing behind it can be read before: sleep
		 * until the source does, or the wait would find it and return
		 * at once, over and over. */
		sdp_rx_seen = rc.refused ? UINT64_MAX :
			      peek ? c->ep.ops->rx_seq(&c->ep) + rc.idx : 0;
		sdp_rx_revoke = rc.refused;
		r = sdp_wait(c, fd, FAB_WAIT_RX,
			     SDP_WAIT_RCVTIMEO | (rc.copied ? SDP_WAIT_PARTIAL : 0),
			     &c->rx_lock);
		sdp_rx_seen = 0;
		sdp_rx_revoke = 0;
		if (r)
			break;
	}
	r = rx_sink_end(&rc, r);
	if (!peek)
		c->st.rx_bytes += rc.copied;
	if (!peek && rc.copied && c->rx_off && c->ep.ops->peer_tx_limited(&c->ep)) {
		/* Part of a message read: a byte-limited sender may go on
		 * (a released message published its bytes already). */
		c->ep.ops->set_rx_bytes(&c->ep, c->rx_stream);
		c->ep.ops->kick(&c->ep, fd, FAB_WAIT_CREDIT);
	}
	bool net = FAB_EP_NET(&c->ep);
	sdp_unlock(&c->rx_lock);
	sdp_reset_tell(c, fd);
	if (!peek)
		sdp_proc_bytes(0, rc.copied, net);
	if (rc.copied)
		return (ssize_t)rc.copied;
	return r;
}

/* ---- outside recv: FIONREAD, readiness ---------------------------------- */

/* Lock-free on purpose (a reader may be asleep in recv): a snapshot. */
int sdp_fionread(struct sdp_conn *c)
{
	size_t n = 0;
	uint32_t off = c->rx_off;
	for (uint32_t i = 0;; i++) {
		struct sdp_bsdh h;
		const char *pl;
		if (rx_hdr(c, i, &h, &pl))
			break;
		if (h.mid == SDP_MID_MODE_CHANGE || h.mid == SDP_MID_RDMA_WR_COMPL) {
			off = 0;
			continue;
		}
		if (h.mid == SDP_MID_SRC_AVAIL) {
			struct sdp_srcavail sa;
			memcpy(&sa, pl, sizeof sa);
			if (sa.len >= off)
				n += sa.len - off;
			off = 0;
			continue;
		}
		if (h.mid != SDP_MID_DATA)
			break;
		if (h.len - sizeof h >= off)
			n += h.len - sizeof h - off;
		off = 0;
	}
	return n > INT32_MAX ? INT32_MAX : (int)n;
}

unsigned sdp_events(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	unsigned ev = 0;
	sdp_check_peer(c);
	if (sdp_is_reset(c))
		return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLHUP | POLLRDHUP |
		       (atomic_load(&c->err_reported) && !atomic_load(&c->so_error) ?
			0 : POLLERR);
	uint32_t pend = ep->ops->rx_pending(ep);
	if (pend == UINT32_MAX)
		return POLLIN | POLLERR | POLLHUP;
	unsigned m = ep->ops->marks(ep, FAB_M_FIN | FAB_M_CLOSED);
	bool fin = atomic_load(&c->rx_eof) || (m & FAB_M_FIN) ||
		   atomic_load(&c->peer_gone);
	bool rd_closed = fin || atomic_load(&c->rx_shut);
	uint32_t lowat = atomic_load(&c->rcvlowat);
	if ((pend && (lowat <= 1 || (uint32_t)sdp_fionread(c) >= lowat)) || rd_closed)
		ev |= POLLIN | POLLRDNORM;
	if (rd_closed)
		ev |= POLLRDHUP;
	if (atomic_load(&c->so_error))
		ev |= POLLERR;
	bool wr_closed = atomic_load(&c->tx_shut);
	if (sdp_tx_writable(c) || wr_closed || atomic_load(&c->peer_gone) ||
	    (m & FAB_M_CLOSED))
		ev |= POLLOUT | POLLWRNORM;
	if (wr_closed && rd_closed)
		ev |= POLLHUP;                /* TCP: both directions shut */
	return ev;
}

uint64_t sdp_rx_arrived(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	return ep->ops->rx_seq(ep) + ep->ops->rx_pending(ep);
}

uint64_t sdp_tx_acked(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	return ep->ops->tx_seq(ep) + ep->ops->credits(ep) + ep->ops->peer_rx_bytes(ep);
}

uint32_t sdp_credits(struct sdp_conn *c)
{
	return c->ep.ops->credits(&c->ep);
}

uint64_t sdp_ready_since(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	uint32_t pend = ep->ops->rx_pending(ep);
	if (pend == 0 || pend == UINT32_MAX)
		return 0;
	return ep->ops->rx_since(ep);
}

/* The queue route (fabric.h FAB_WAIT_Q): a waiter over many connections
 * (the switch's epoll) sleeps on a queue their peers' kicks report to. */
int sdp_q_bind(struct sdp_conn *c)
{
	const struct fab_ops *o = c->ep.ops;
	return o && o->q_bind ? o->q_bind(&c->ep, c->idx) : -1;
}

void sdp_arm_q(struct sdp_conn *c, int fd, unsigned events, bool owed)
{
	unsigned what = FAB_WAIT_RX;
	if (events & (POLLOUT | POLLWRNORM))
		what |= FAB_WAIT_CREDIT;
	c->ep.ops->arm(&c->ep, FAB_WAIT_Q(what));
	sdp_up_check(c, fd);                  /* a server end gone (upwatch.c) */
	if (owed && c->ep.ops->kick_owed(&c->ep, fd) == 1)
		__atomic_fetch_add(&c->st.tokens_owed, 1, __ATOMIC_RELAXED); /* unlocked */
}

void sdp_arm(struct sdp_conn *c, int fd, unsigned events)
{
	unsigned what = 0;
	if (events & (POLLIN | POLLRDNORM | POLLRDHUP))
		what |= FAB_WAIT_RX;
	if (events & (POLLOUT | POLLWRNORM))
		what |= FAB_WAIT_CREDIT;
	c->ep.ops->arm(&c->ep, what | FAB_WAIT_RX);
	sdp_up_check(c, fd);                  /* a server end gone (upwatch.c) */
	sdp_kick_owed(c, fd);                 /* we may sleep now */
}
