/*
 * rx.c - the receive side: Data messages to the application, readiness.
 *
 * recv() walks the received messages in order. A Data message's payload is
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

#include "sdp/conn.h"
#include "sdp/proto.h"

/* Read and validate the idx-th pending message header. */
static int rx_hdr(struct sdp_conn *c, uint32_t idx, struct sdp_bsdh *h,
		  const char **payload)
{
	struct fab_ep *ep = &c->ep;
	const void *msg;
	size_t cap;
	int r = ep->ops->rx_peek(ep, idx, &msg, &cap);
	if (r)
		return r;
	memcpy(h, msg, sizeof *h);
	uint32_t want = (uint32_t)(ep->ops->rx_seq(ep) + 1 + idx);
	if (h->len < sizeof *h || h->len > cap || h->mseq != want ||
	    h->bufs > ep->nslots ||
	    (h->mid != SDP_MID_DATA && h->mid != SDP_MID_DISCONN &&
	     h->mid != SDP_MID_ABORT)) {
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	*payload = (const char *)msg + sizeof *h;
	return 0;
}

static void rx_release(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	ep->ops->rx_release(ep);
	c->st.rx_msgs++;
	ep->ops->kick(ep, fd, FAB_WAIT_CREDIT);
}

/* Scatter len bytes from src into the iovec at stream offset off. */
static void iov_scatter(const struct iovec *iov, int n, size_t off,
			const char *src, size_t len)
{
	for (int i = 0; i < n && len; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		size_t k = iov[i].iov_len - off;
		if (k > len)
			k = len;
		memcpy((char *)iov[i].iov_base + off, src, k);
		src += k;
		len -= k;
		off = 0;
	}
}

/* End-of-stream or error state when no data is pending: 0 = EOF,
 * -errno = error, 1 = nothing known (wait). */
static int rx_end_state(struct sdp_conn *c)
{
	if (sdp_fallback_pending(c))
		return -SDP_EFALLBACK;
	int e = atomic_exchange(&c->so_error, 0);
	if (e)
		return -e;
	if (sdp_is_reset(c))
		return sdp_take_reset(c) ? -ECONNRESET : 0;
	if (atomic_load(&c->rx_eof) || shm_peer_fin(&c->ep) ||
	    atomic_load(&c->rx_shut) || atomic_load(&c->peer_gone))
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

ssize_t sdp_recv(struct sdp_conn *c, int fd, const struct iovec *iov,
		 int iovcnt, int flags)
{
	size_t total = 0;
	for (int i = 0; i < iovcnt; i++)
		total += iov[i].iov_len;
	bool peek = flags & MSG_PEEK;
	bool waitall = (flags & MSG_WAITALL) && !peek;
	bool nonblock = (flags & MSG_DONTWAIT) || atomic_load(&c->nonblock);
	if (flags & MSG_OOB)
		return -EINVAL;               /* no urgent data is ever pending */

	int r = sdp_lock(&c->rx_lock);
	if (r)
		return r;
	size_t copied = 0;
	r = 0;
	while (copied < total || (total == 0 && !data_pending(c))) {
		uint32_t idx = 0, off = c->rx_off;
		bool progressed = false;
		for (;;) {
			struct sdp_bsdh h;
			const char *pl;
			r = rx_hdr(c, idx, &h, &pl);
			if (r)
				break;
			if (h.mid == SDP_MID_ABORT) {
				/* Everything before it was read: now the reset. */
				atomic_store(&c->state, SDP_ST_RESET);
				r = -EAGAIN;
				break;
			}
			if (h.mid == SDP_MID_DISCONN) {
				if (!peek && copied == 0) {
					rx_release(c, fd);
					atomic_store(&c->rx_eof, 1);
				}
				r = -EAGAIN;      /* stop: EOF after what we have */
				break;
			}
			uint32_t plen = h.len - (uint32_t)sizeof h;
			if (off > plen) {         /* cannot happen unless corrupted */
				sdp_conn_abort(c, ECONNRESET);
				r = -ECONNRESET;
				break;
			}
			size_t n = plen - off;
			if (n > total - copied)
				n = total - copied;
			iov_scatter(iov, iovcnt, copied, pl + off, n);
			copied += n;
			progressed = true;
			if (peek) {
				idx++;
				off = 0;
			} else if (off + n == plen) {
				c->rx_off = 0;
				off = 0;
				rx_release(c, fd);
			} else {
				c->rx_off = off + (uint32_t)n;
			}
			if (copied == total)
				break;
		}
		(void)progressed;
		if (r == -ECONNRESET)
			break;
		if (copied == total && total)
			{ r = 0; break; }
		if (copied && !waitall)
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
		r = sdp_wait(c, fd, FAB_WAIT_RX, true, &c->rx_lock);
		if (r)
			break;
	}
	if (!peek) {
		c->st.rx_bytes += copied;
		c->st.rx_bcopy_bytes += copied;
	}
	sdp_unlock(&c->rx_lock);
	if (!peek)
		sdp_proc_bytes(0, copied);
	if (copied)
		return (ssize_t)copied;
	return r;
}

/* Lock-free on purpose (a reader may be asleep in recv): a snapshot. */
int sdp_fionread(struct sdp_conn *c)
{
	size_t n = 0;
	uint32_t off = c->rx_off;
	for (uint32_t i = 0;; i++) {
		struct sdp_bsdh h;
		const char *pl;
		if (rx_hdr(c, i, &h, &pl) || h.mid != SDP_MID_DATA)
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
	if (sdp_is_reset(c))
		return POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM | POLLHUP | POLLRDHUP |
		       (atomic_load(&c->err_reported) ? 0 : POLLERR);
	uint32_t pend = ep->ops->rx_pending(ep);
	if (pend == UINT32_MAX)
		return POLLIN | POLLERR | POLLHUP;
	bool fin = atomic_load(&c->rx_eof) || shm_peer_fin_seen(ep) ||
		   atomic_load(&c->peer_gone);
	bool rd_closed = fin || atomic_load(&c->rx_shut);
	if (pend || rd_closed)
		ev |= POLLIN | POLLRDNORM;
	if (rd_closed)
		ev |= POLLRDHUP;
	if (atomic_load(&c->so_error))
		ev |= POLLERR;
	bool wr_closed = atomic_load(&c->tx_shut);
	if (ep->ops->credits(ep) || wr_closed || atomic_load(&c->peer_gone) ||
	    shm_peer_closed(ep))
		ev |= POLLOUT | POLLWRNORM;
	if (wr_closed && rd_closed)
		ev |= POLLHUP;                /* TCP: both directions shut */
	return ev;
}

void sdp_arm(struct sdp_conn *c, unsigned events)
{
	unsigned what = 0;
	if (events & (POLLIN | POLLRDNORM | POLLRDHUP))
		what |= FAB_WAIT_RX;
	if (events & (POLLOUT | POLLWRNORM))
		what |= FAB_WAIT_CREDIT;
	c->ep.ops->arm(&c->ep, what | FAB_WAIT_RX);
}
