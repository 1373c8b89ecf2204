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
 *
 * SO_SNDBUF and SO_RCVBUF, when the application sets them, also limit the
 * bytes in flight (see window() below); by default only the ring does.
 */
#include <errno.h>
#include <string.h>

#include "sdp/az.h"
#include "sdp/conn.h"
#include "sdp/iov.h"
#include "sdp/proto.h"
#include "sdp/sys.h"

/*
 * The byte window. On TCP the bytes a sender may have queued and not yet
 * read by the peer application are its send queue (SO_SNDBUF) plus the
 * receiver's queue (its window, from SO_RCVBUF). SDP has one queue, the
 * peer's ring: by default (neither option set) the ring's credits are the
 * only limit, as fast as ever. When the application set SO_SNDBUF on our
 * socket or the peer's application SO_RCVBUF on its own (the peer
 * publishes it), the bytes outstanding - handed over and not yet consumed
 * by the peer's application - are limited to
 *
 *     SO_SNDBUF + SO_RCVBUF / 2        (both as getsockopt reports them)
 *
 * with an unset SO_SNDBUF counting as the whole ring, and an unset peer
 * SO_RCVBUF as TCP's initial 64 KiB window (or the ring, if neither is
 * set). Over Linux loopback a non-blocking send to a peer that does not
 * read takes within 0.75 - 1.5 times this for buffers of 8 - 128 KiB
 * (tests/c/t_sockbuf.c compares). The peer publishes what it consumed
 * (rx_bytes) with each message it releases, and after a partial read
 * while we are byte-limited (tx_limited).
 */
#define RCV_WIN_DEFAULT 65536u

/* false: no byte limit. Else the limit and the bytes outstanding. */
static bool window(struct sdp_conn *c, uint64_t *lim, uint64_t *out)
{
	struct fab_ep *ep = &c->ep;
	uint32_t snd = atomic_load_explicit(&c->sndbuf, memory_order_relaxed);
	uint32_t rcv = ep->ops->peer_rcvbuf(ep);
	if (!snd && !rcv)
		return false;                 /* never set: never limited */
	uint64_t ring = (uint64_t)ep->nslots * (ep->slot_size - sizeof(struct sdp_bsdh));
	uint64_t l = (snd ? (uint64_t)snd : ring) +
		     (rcv ? rcv / 2 : snd ? RCV_WIN_DEFAULT : ring);
	ep->ops->set_tx_limited(ep, l < ring);
	if (l >= ring)
		return false;
	/* tx_stream moves under tx_lock; a poll reads it without. */
	uint64_t sent = __atomic_load_n(&c->tx_stream, __ATOMIC_RELAXED);
	uint64_t taken = ep->ops->peer_rx_bytes(ep);
	*lim = l;
	*out = sent > taken ? sent - taken : 0;   /* nonsense from the peer: 0 */
	/* With our ring empty the peer consumed every byte we handed over
	 * (a message is released only when wholly read): nothing is
	 * outstanding, whatever its word says - a word a third process may
	 * have written while the peer sleeps, which would leave this send
	 * waiting for a release that never comes. */
	if (ep->ops->marks(ep, FAB_M_CAUGHT_UP))
		*out = 0;
	return true;
}

size_t sdp_tx_room(struct sdp_conn *c)
{
	uint64_t lim, out;
	if (!window(c, &lim, &out))
		return SIZE_MAX;
	return out >= lim ? 0 : (size_t)(lim - out);
}

bool sdp_tx_open(struct sdp_conn *c)
{
	return c->ep.ops->credits(&c->ep) != 0 && sdp_tx_room(c) != 0;
}

/* TCP reports POLLOUT while the free space is at least half of what is
 * queued (sk_stream_is_writeable): a third of the buffer free. */
bool sdp_tx_writable(struct sdp_conn *c)
{
	if (c->ep.ops->credits(&c->ep) == 0)
		return false;
	uint64_t lim, out;
	if (!window(c, &lim, &out))
		return true;
	return out < lim && 2 * (lim - out) >= out;
}

void sdp_bufsize_set(struct sdp_conn *c, int fd, bool snd)
{
	int v = 0;
	socklen_t l = sizeof v;
	if (sys_getsockopt(fd, SOL_SOCKET, snd ? SO_SNDBUF : SO_RCVBUF, &v, &l) < 0 ||
	    v <= 0)
		return;
	if (snd) {
		atomic_store(&c->sndbuf, (uint32_t)v);
		return;
	}
	c->ep.ops->set_rcvbuf(&c->ep, (uint32_t)v);
	/* A larger window may let a waiting sender go on. */
	c->ep.ops->kick(&c->ep, fd, FAB_WAIT_CREDIT);
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
		c->st.tx_stream_bytes += iov_gather(buf + sizeof h, iov, iovcnt, off, len,
						    ep->ops->traits & FAB_T_PEER_READS);
	memcpy(buf, &h, sizeof h);
	ep->ops->post(ep, sizeof h + len);
	c->st.tx_msgs++;
	if (kick) {
		int k = ep->ops->kick(ep, fd, FAB_WAIT_RX);
		if (k == 1)
			c->st.doorbells_tx++;
		else if (k == 2)
			c->st.queue_kicks++;
		else if (k == 3)
			c->st.futex_kicks++;
	}
	return 0;
}

/* Our data reached a peer that will never read it: its socket is closed,
 * or shut down both ways. TCP's peer answers such data with a reset, which
 * arrives while we are in CLOSE_WAIT (its FIN came first): the connection
 * is closed with sk_err = EPIPE - reported once by the next send (EPIPE)
 * or SO_ERROR, shown by POLLERR - and never as ECONNRESET; reads go on
 * returning what was queued, then EOF. A peer still there (shut down
 * both ways) sees the reset as ECONNRESET. */
static void peer_answers_reset(struct sdp_conn *c)
{
	atomic_store(&c->so_error, EPIPE);
	atomic_store(&c->err_reported, 1);
	sdp_mark(c, FAB_M_ABORT);
	atomic_store(&c->state, SDP_ST_RESET);
}

/* The error TCP reports for a reset not reported yet (0: none, or it was
 * reported): EPIPE if the peer's FIN came before it (CLOSE_WAIT), else
 * ECONNRESET. Reported once, by whichever call gets here first. */
int sdp_reset_errno(struct sdp_conn *c)
{
	if (!sdp_take_reset(c))
		return 0;
	/* A network fabric's connection that timed out (ofi: the
	 * application's TCP_USER_TIMEOUT on the fabric's socket) is
	 * reported as TCP reports it. */
	if (FAB_EP_NET(&c->ep) && c->ep.ops->drain(&c->ep, -1) == -ETIMEDOUT)
		return ETIMEDOUT;
	return sdp_marked(c, FAB_M_FIN) ? EPIPE : ECONNRESET;
}

/* Why a send of len bytes cannot queue data now (0 = it can). 1 = the
 * peer will never read it: the bytes are accepted and dropped, as TCP
 * takes them before the peer's reset comes back. A zero-length send moves
 * no data, provokes no reset and returns 0. */
static int tx_error(struct sdp_conn *c, size_t len)
{
	sdp_check_peer(c);
	if (sdp_fallback_pending(c))
		return -SDP_EFALLBACK;
	int e = atomic_exchange(&c->so_error, 0);
	if (e)
		return -e;
	if (sdp_is_reset(c)) {
		e = sdp_reset_errno(c);
		return e ? -e : -EPIPE;
	}
	if (atomic_load(&c->tx_shut))
		return -EPIPE;
	unsigned m = c->ep.ops->marks(&c->ep, FAB_M_CLOSED | FAB_M_RD_SHUT | FAB_M_FIN);
	if ((m & FAB_M_CLOSED) || atomic_load(&c->peer_gone) ||
	    (m & (FAB_M_RD_SHUT | FAB_M_FIN)) == (FAB_M_RD_SHUT | FAB_M_FIN)) {
		if (!len)
			return 0;
		peer_answers_reset(c);
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

	/* Pages of the buffer still being received into must be filled
	 * before we read them (az.h); our completions first. */
	az_settle_iov(iov, iovcnt, false);
	az_progress(c);
	int r = sdp_lock(&c->tx_lock);
	if (r)
		return r;
	r = tx_error(c, total);
	if (r) {
		sdp_unlock(&c->tx_lock);
		sdp_reset_tell(c, fd);
		return r == 1 ? (ssize_t)total : r;
	}
	zc_ack_cancel(c, fd);
	if (atomic_load_explicit(&c->zcopy_thresh, memory_order_relaxed))
		zc_probe(c, fd);
	size_t payload = ep->slot_size - sizeof(struct sdp_bsdh);
	size_t done = 0;
	/* A byte-limited window is a small one: Buffer Copy only. */
	size_t room = sdp_tx_room(c);
	bool limited = room != SIZE_MAX;
	if (!limited && !nonblock && az_on() && !FAB_EP_NET(ep)) {
		/* Asynchronous Zero Copy (az.h): advertise, protect, return
		 * (shm only: its reads are Cross Memory Attach). */
		bool used;
		ssize_t z = az_send(c, fd, iov, iovcnt, total, &used);
		if (used) {
			if (z > 0)
				c->st.tx_bytes += (uint64_t)z;
			c->st.credits = ep->ops->credits(ep);
			sdp_unlock(&c->tx_lock);
			sdp_reset_tell(c, fd);
			if (z > 0)
				sdp_proc_bytes((uint64_t)z, 0, false);
			return z;
		}
	}
	if (!limited && zc_usable(c, fd, total, nonblock)) {
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
			bool net = FAB_EP_NET(ep);
			sdp_unlock(&c->tx_lock);
			sdp_proc_bytes(done, 0, net);
			return (ssize_t)done;
		}
	}
	while (done < total) {
		if (limited && room == 0)
			room = sdp_tx_room(c);
		if (ep->ops->credits(ep) == 0 || room == 0) {
			if (nonblock) {
				r = -EAGAIN;
				break;
			}
			/* The ring is full: if the reader can now read us, the
			 * rest of a large send goes by zero copy. */
			if (!limited && zc_usable(c, fd, total - done, false)) {
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
				r = tx_error(c, total - done);
			if (r == 1) {             /* the peer went while we waited: */
				done = total;     /* the rest is taken and dropped */
				r = 0;
				break;
			}
			if (r)
				break;
			room = sdp_tx_room(c);
			limited = room != SIZE_MAX;
			continue;
		}
		size_t n = total - done < payload ? total - done : payload;
		if (n > room)
			n = room;
		sdp_post_msg(c, fd, SDP_MID_DATA, iov, iovcnt, done, n);
		if (limited)
			room -= n;
		done += n;
		c->tx_stream += n;
		c->st.tx_bcopy_bytes += n;
	}
	c->st.tx_bytes += done;
	/* Also written by receives (rx_release), under the other lock. */
	__atomic_store_n(&c->st.credits, ep->ops->credits(ep), __ATOMIC_RELAXED);
	sdp_window_note(c);
	bool net = FAB_EP_NET(ep);
	sdp_unlock(&c->tx_lock);
	sdp_reset_tell(c, fd);
	sdp_proc_bytes(done, 0, net);
	/* A send that moved some bytes returns their count; an error met
	 * after them is the next call's, as TCP keeps sk_err for it (taken
	 * here it would be lost: a reset would then read as EPIPE). */
	if (done && r < 0 && r != -EAGAIN && r != -EINTR && r != -SDP_EFALLBACK) {
		int32_t z = 0;
		atomic_compare_exchange_strong(&c->so_error, &z, -r);
	}
	if (done || total == 0)
		return (ssize_t)done;
	return r;
}
