/*
 * tx.c - the send side: Buffer Copy of stream bytes into Data messages.
 *
 * send() copies the application's bytes into the peer's receive buffers, one
 * Data message (BSDH + payload) per buffer, as long as it holds credits.
 * Without credits a blocking send waits for the peer to consume (TCP: a full
 * send window); a nonblocking one returns what it queued or EAGAIN. Each
 * posted message kicks the peer if it sleeps. A blocking send returns only
 * when every byte is queued, unless a signal or SO_SNDTIMEO interrupts it
 * (then the partial count, as TCP).
 */
#include <errno.h>
#include <string.h>

#include "sdp/conn.h"
#include "sdp/proto.h"

static size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Copy len bytes starting at stream offset off of the iovec into dst. */
static void iov_gather(void *dst, const struct iovec *iov, int n, size_t off,
		       size_t len)
{
	char *d = dst;
	for (int i = 0; i < n && len; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		size_t k = iov[i].iov_len - off;
		if (k > len)
			k = len;
		memcpy(d, (char *)iov[i].iov_base + off, k);
		d += k;
		len -= k;
		off = 0;
	}
}

static int post(struct sdp_conn *c, int fd, uint8_t mid, const struct iovec *iov,
		int iovcnt, size_t off, size_t len, bool kick);

/* Post one control or data message; caller holds tx_lock and a credit. */
int sdp_post_msg(struct sdp_conn *c, int fd, uint8_t mid, const struct iovec *iov,
		 int iovcnt, size_t off, size_t len)
{
	return post(c, fd, mid, iov, iovcnt, off, len, true);
}

/* A message without payload, optionally without waking the peer. */
int sdp_post_msg_nokick(struct sdp_conn *c, int fd, uint8_t mid, bool nokick)
{
	return post(c, fd, mid, NULL, 0, 0, 0, !nokick);
}

static int post(struct sdp_conn *c, int fd, uint8_t mid, const struct iovec *iov,
		int iovcnt, size_t off, size_t len, bool kick)
{
	struct fab_ep *ep = &c->ep;
	size_t cap;
	char *buf = ep->ops->tx_buf(ep, &cap);
	/* A peer whose counters make no sense (shutdown and close post
	 * without checking) must not make our header break the protocol. */
	uint32_t pend = ep->ops->rx_pending(ep);
	if (pend > ep->nslots)
		pend = ep->nslots;
	struct sdp_bsdh h = {
		.mid = mid,
		.flags = 0,
		.bufs = (uint16_t)(ep->nslots - pend),
		.len = (uint32_t)(sizeof h + len),
		.mseq = ++c->tx_mseq,
		.mseq_ack = (uint32_t)ep->ops->rx_seq(ep),
	};
	if (len)
		iov_gather(buf + sizeof h, iov, iovcnt, off, len);
	memcpy(buf, &h, sizeof h);
	ep->ops->post(ep, sizeof h + len);
	c->st.tx_msgs++;
	if (kick && ep->ops->kick(ep, fd, FAB_WAIT_RX) > 0)
		c->st.doorbells_tx++;
	return 0;
}

/* Why a send cannot queue data now (0 = it can). 1 = the peer has closed:
 * the bytes are accepted and dropped once, as TCP does before the RST. */
static int tx_error(struct sdp_conn *c)
{
	sdp_check_peer(c);
	if (sdp_fallback_pending(c))
		return -SDP_EFALLBACK;
	int e = atomic_exchange(&c->so_error, 0);
	if (e)
		return -e;
	if (sdp_is_reset(c))
		return sdp_take_reset(c) ? -ECONNRESET : -EPIPE;
	if (atomic_load(&c->tx_shut))
		return -EPIPE;
	if (shm_peer_closed(&c->ep) || atomic_load(&c->peer_gone))
		return atomic_exchange(&c->sent_after_close, 1) ? -EPIPE : 1;
	if (shm_peer_rd_shut(&c->ep) && shm_peer_fin_seen(&c->ep)) {
		/* The peer shut both halves: as with TCP, these bytes are taken
		 * and the peer answers with a reset, which both ends see:
		 * we get EPIPE if we had its FIN already, else ECONNRESET. */
		shm_set_abort(&c->ep);
		atomic_store(&c->state, SDP_ST_RESET);
		if (shm_peer_fin_seen(&c->ep))
			atomic_store(&c->err_reported, 1);
		return 1;
	}
	return 0;
}

ssize_t sdp_send(struct sdp_conn *c, int fd, const struct iovec *iov,
		 int iovcnt, int flags)
{
	size_t total = iov_total(iov, iovcnt);
	bool nonblock = (flags & MSG_DONTWAIT) || atomic_load(&c->nonblock);
	struct fab_ep *ep = &c->ep;

	int r = sdp_lock(&c->tx_lock);
	if (r)
		return r;
	r = tx_error(c);
	if (r) {
		sdp_unlock(&c->tx_lock);
		return r == 1 ? (ssize_t)total : r;
	}
	zc_ack_cancel(c, fd);
	if (atomic_load_explicit(&c->zcopy_thresh, memory_order_relaxed))
		zc_probe(c, fd);
	size_t payload = ep->slot_size - sizeof(struct sdp_bsdh);
	size_t done = 0;
	if (zc_usable(c, fd, total, nonblock)) {
		bool go_bcopy;
		ssize_t z = zc_send(c, fd, iov, iovcnt, 0, total, &go_bcopy);
		if (z < 0) {
			sdp_unlock(&c->tx_lock);
			return z;
		}
		/* 0: neither zero-copy path was open: Buffer Copy below.
		 * Less than asked: interrupted, return that (as TCP);
		 * refused by the reader: the rest by Buffer Copy below. */
		if (go_bcopy)
			done = (size_t)z;
		else if (z > 0) {
			done = (size_t)z;
			c->st.tx_bytes += done;
			sdp_unlock(&c->tx_lock);
			sdp_proc_bytes(done, 0);
			return (ssize_t)done;
		}
	}
	while (done < total) {
		if (ep->ops->credits(ep) == 0) {
			if (nonblock) {
				r = -EAGAIN;
				break;
			}
			/* The ring is full: if the reader can now read us, the
			 * rest of a large send goes by zero copy. */
			if (zc_usable(c, fd, total - done, false)) {
				bool go_bcopy;
				ssize_t z = zc_send(c, fd, iov, iovcnt, done, total - done,
						    &go_bcopy);
				if (z < 0) {
					r = (int)z;
					break;
				}
				if (z > 0 || go_bcopy) {
					done += (size_t)z;
					if (done < total && !go_bcopy)
						break;    /* interrupted: partial */
					continue;
				}
			}
			r = sdp_wait(c, fd, FAB_WAIT_CREDIT,
				     done ? SDP_WAIT_PARTIAL : 0, &c->tx_lock);
			if (!r)
				r = tx_error(c);
			if (r == 1) {             /* peer gone while we waited */
				r = done ? 0 : -EPIPE;
				if (!done)
					atomic_store(&c->sent_after_close, 1);
				break;
			}
			if (r)
				break;
			continue;
		}
		size_t n = total - done < payload ? total - done : payload;
		sdp_post_msg(c, fd, SDP_MID_DATA, iov, iovcnt, done, n);
		done += n;
		c->tx_stream += n;
		c->st.tx_bcopy_bytes += n;
	}
	c->st.tx_bytes += done;
	/* Also written by receives (rx_release), under the other lock. */
	__atomic_store_n(&c->st.credits, ep->ops->credits(ep), __ATOMIC_RELAXED);
	sdp_unlock(&c->tx_lock);
	sdp_proc_bytes(done, 0);
	if (done || total == 0)
		return (ssize_t)done;
	return r;
}
