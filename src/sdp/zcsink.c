/*
 * zcsink.c - the sink half of zero copy (the source half is zcopy.c): what
 * a recv does with the zero-copy messages and control words.
 *
 *   SrcAvail (Read Zero Copy): the source advertises a buffer; we RDMA-read
 *   it straight into the application's buffer, mark the read in our
 *   control words (reading, then rd_bytes/rd_done: RdmaRdCompl) and skip
 *   advertisements the source revoked (its cancel_id..cancel_last).
 *   SinkAvail (Write Zero Copy): a blocking recv that finds nothing queued
 *   offers its buffer in our control words; a source that takes it (CAS
 *   on sink_state) writes into it and posts RdmaWrCompl, which carries the
 *   stream bytes' count. An offer not taken is withdrawn with the same CAS.
 *   SrcAvailCancel: answered in cancel_ack once no read is in flight.
 *
 * The words are ours to write and publish (zc_publish) or the peer's to
 * read; every message is validated before use (rx.c rx_hdr, and here its
 * payload): a bad one aborts the connection.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "sdp/az.h"
#include "sdp/iov.h"
#include "sdp/log.h"
#include "sdp/rx.h"
#include "sdp/spin.h"

/* Is this SrcAvail (at the head, not read yet) revoked by the source?
 * Revocation covers every unread id up to cancel_last (see below). */
bool srcavail_revoked(struct sdp_conn *c, const char *pl)
{
	struct sdp_srcavail sa;
	memcpy(&sa, pl, sizeof sa);
	struct sdp_zctl *pz = sdp_zc_peer(c);
	uint32_t cid = atomic_load(&pz->cancel_id), clast = atomic_load(&pz->cancel_last);
	/* An asynchronous advertisement is never revoked: its send returned. */
	return cid && sa.id <= clast && sa.id > c->rx_src_id && !(sa.flags & SDP_SA_ASYNC);
}

/*
 * RDMA Read (the provider's rdma_read: Cross Memory Attach on shm) up to
 * room bytes of a SrcAvail, from offset off, into the application's
 * buffer at stream offset copied (or, for a receive below the threshold,
 * through a bounce buffer). Returns the bytes read (0 if revoked or nothing
 * fits), -EAGAIN if the kernel refused the read (the source revokes and
 * goes on by Buffer Copy), or -ECONNRESET (aborted); *whole is set when
 * the advertisement is finished (read or revoked).
 */
static ssize_t read_srcavail(struct sdp_conn *c, int fd, const char *pl, uint32_t off,
			     const struct iovec *iov, int iovcnt, size_t copied,
			     size_t room, bool peek, bool bounce, bool async_ok, bool *whole)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = sdp_zc_me(c), *pz = sdp_zc_peer(c);
	struct sdp_srcavail sa;
	/* An asynchronous receive still copying holds `reading` and rd_done
	 * (which goes in order): it finishes first. */
	if (az_recv_busy(c))
		az_recv_settle(c);
	memcpy(&sa, pl, sizeof sa);
	*whole = false;
	if (sa.id <= c->rx_src_id || sa.id - c->rx_src_id > ep->nslots ||
	    sa.len == 0 || sa.len > (1u << 30) || !sa.addr ||
	    !sdp_srcavail_key(&sa) || (sa.key <= 0 && !(ep->ops->traits & FAB_T_MR_KEYS)) ||
	    off > sa.len || (sa.flags & ~SDP_SA_ASYNC) || sa.rsvd ||
	    ((sa.flags & SDP_SA_ASYNC) && (ep->ops->traits & FAB_T_MR_KEYS))) {
		sdp_log(0, "malformed SrcAvail (id %u len %u): connection aborted",
			sa.id, sa.len);
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	/* Mark the read before looking for a cancel (the source looks the
	 * other way round), so a cancel never races a read. */
	atomic_store(&z->reading, sa.id);
	sdp_zc_publish(c, reading, reading);
	/* Revoked ranges always run from the first unfinished advertisement
	 * to the last posted, so every id up to the highest revoked one that
	 * is still unread (it is here, at the head) is revoked: a later cancel
	 * must not bring an earlier revoked buffer back to life. */
	uint32_t cid = atomic_load(&pz->cancel_id), clast = atomic_load(&pz->cancel_last);
	bool async = sa.flags & SDP_SA_ASYNC;
	if (cid && sa.id <= clast && !async) {
		atomic_store(&z->reading, 0);
		*whole = true;                /* revoked: skip it */
		if (!peek) {
			c->rx_src_id = sa.id;
			atomic_store(&z->rd_done, sa.id);
		}
		sdp_zc_publish(c, rd_done, rd_done);
		sdp_zc_publish(c, reading, reading);
		/* The source may wait for rd_done to make room for its
		 * next advertisement, or for our read mark to go (its
		 * cancel): every clear of the mark kicks. */
		ep->ops->kick(ep, fd, FAB_WAIT_ZC);
		return 0;
	}
	size_t n = sa.len - off;
	if (n > room)
		n = room;
	if (n == 0) {
		atomic_store(&z->reading, 0);
		sdp_zc_publish(c, reading, reading);
		ep->ops->kick(ep, fd, FAB_WAIT_ZC);
		return 0;
	}
	/* The key must be a process that holds the far end of this
	 * connection: never let a peer point our reads at another process,
	 * or at ourselves. Unknowable (no access to /proc): refuse below. */
	int kc = zc_key_check(c, fd, sa.key);
	if (kc == 1 && async) {
		/* The source's send returned: its bytes may have moved, or be
		 * moving now (az_moving, which it sets before it looks at our
		 * `reading`, as we set `reading` before we look at its mark). */
		uint64_t at = az_src_addr(c, &sa, fd);
		if (at == 0) {
			atomic_store(&z->reading, 0);
			sdp_zc_publish(c, reading, reading);
			sdp_log(0, "SrcAvail %u: where its bytes moved cannot be told: "
				"connection aborted", sa.id);
			sdp_conn_abort(c, ECONNRESET);
			return -ECONNRESET;
		}
		sa.addr = at;
		/* A blocking recv may return before its whole pages are
		 * filled (az.h): the progress thread copies them. */
		ssize_t a = async_ok && !peek ?
			    az_recv_take(c, fd, &sa, at, off, iov, iovcnt, copied, room) : 0;
		if (a < 0) {
			sdp_log(0, "RDMA Read of SrcAvail %u failed: connection aborted", sa.id);
			sdp_conn_abort(c, ECONNRESET);
			return -ECONNRESET;
		}
		if (a > 0) {
			*whole = true;
			c->rx_src_id = sa.id;
			c->st.rx_azcopy_bytes += (uint64_t)a;
			return a;             /* `reading` stays: the copy's */
		}
	}
	if (kc == 0) {
		atomic_store(&z->reading, 0);
		sdp_zc_publish(c, reading, reading);
		sdp_log(0, "SrcAvail %u names process %d, which does not hold "
			"this connection (it never did, or it died): connection aborted",
			sa.id, (int)sa.key);
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	ssize_t got;
	if (kc < 0) {
		got = -1;                     /* cannot verify: refuse */
		errno = EPERM;
	} else if (bounce) {
		/* Below the threshold: read into our buffer, then copy. */
		char tmp[16384];
		size_t done = 0;
		while (done < n) {
			size_t k = n - done < sizeof tmp ? n - done : sizeof tmp;
			struct iovec l = { tmp, k };
			ssize_t g = ep->ops->rdma_read(ep, &l, 1, sa.addr + off + done,
						       k, sdp_srcavail_key(&sa));
			if (g <= 0) {
				if (done)
					break;    /* keep what was copied */
				got = -1;
				errno = g < 0 ? (int)-g : EIO;
				goto failed;
			}
			iov_scatter(iov, iovcnt, copied + done, tmp, (size_t)g);
			done += (size_t)g;
			if ((size_t)g < k)
				break;            /* partial: progress so far */
		}
		n = done;
		got = (ssize_t)n;
	} else {
		struct iovec lv[64];
		int ln = iov_slice(iov, iovcnt, copied, n, lv, 64);
		size_t cap = iov_total(lv, ln);
		n = cap < n ? cap : n;
		got = zc_rdma(c, false, lv, ln, sa.addr + off, n, sdp_srcavail_key(&sa));
		if (got < 0) {
			errno = (int)-got;
			got = -1;
		}
		if (got > 0 && (size_t)got < n)
			n = (size_t)got;      /* a partial copy is progress */
	}
	if (got < 0 && (errno == EPERM || errno == EACCES) && !peek && !async) {
		/* The kernel will not let us read the source: refuse; it
		 * revokes its SrcAvails and sends by Buffer Copy instead.
		 * Not an asynchronous one: its send() returned and nothing
		 * would revoke it - the read failed (below), as TCP resets. */
		int e = errno;
		atomic_store(&z->reading, 0);
		atomic_store(&z->adv_max, 0);
		atomic_store(&c->cma, -e);
		sdp_zc_publish(c, adv_max, reading);
		atomic_store(&z->refused, 1);
		sdp_zc_publish(c, refused, refused);
		errno = e;
		ep->ops->kick(ep, fd, FAB_WAIT_ZC | FAB_WAIT_CREDIT);
		sdp_log(1, "RDMA Read refused (%s): Buffer Copy from now on",
			strerror(errno));
		return -EAGAIN;
	}
	if (got != (ssize_t)n) {
failed:
		atomic_store(&z->reading, 0);
		sdp_zc_publish(c, reading, reading);
		sdp_log(0, "RDMA Read of SrcAvail %u failed (%s): connection aborted",
			sa.id, got < 0 ? strerror(errno) : "short read");
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	if (!peek) {
		atomic_fetch_add(&z->rd_bytes, n);
		if (off + n == sa.len) {
			*whole = true;
			c->rx_src_id = sa.id;
			atomic_store(&z->rd_done, sa.id);
		}
		sdp_zc_publish(c, rd_done, rd_bytes);
		if (async)
			c->st.rx_azcopy_bytes += n;
		else
			c->st.rx_rzcopy_bytes += n;
	} else if (off + n == sa.len) {
		*whole = true;
	}
	atomic_store(&z->reading, 0);         /* after rd_bytes is published */
	sdp_zc_publish(c, reading, reading);
	ep->ops->kick(ep, fd, FAB_WAIT_ZC);
	return (ssize_t)n;
}

/* ---- SinkAvail ---------------------------------------------------------- */

/* Offer the application's buffer as a SinkAvail (Write ZCopy). */
static bool sink_offer(struct sdp_conn *c, int fd, const struct iovec *iov,
		       int iovcnt, size_t copied, size_t room)
{
	struct fab_ep *ep = &c->ep;
	struct iovec v;
	if (iov_slice(iov, iovcnt, copied, room, &v, 1) != 1)
		return false;
	struct sdp_zctl *z = sdp_zc_me(c);
	if (atomic_load(&z->adv_max) == 0 ||
	    v.iov_len < atomic_load(&c->zcopy_thresh))
		return false;                 /* the peer may not write into us */
	z->sink_addr = (uint64_t)(uintptr_t)v.iov_base;
	z->sink_len = v.iov_len > (1u << 30) ? (1u << 30) : (uint32_t)v.iov_len;
	z->sink_pos = c->rx_stream;
	atomic_store(&z->pid, (int32_t)sdp_pid);
	atomic_store(&z->sink_id, ++c->sink_id);
	sdp_zc_publish(c, sink_id, pid);
	atomic_store_explicit(&z->sink_state, SDP_SINK_OFFERED, memory_order_release);
	sdp_zc_publish(c, sink_state, sink_state);
	ep->ops->kick(ep, fd, FAB_WAIT_CREDIT);
	return true;
}

/* Withdraw our offer; false if the source has taken it (its RdmaWrCompl
 * is then on its way and must be read). */
static bool sink_withdraw(struct sdp_conn *c)
{
	uint32_t st = c->ep.ops->zc_cas(&c->ep, FAB_OURS,
					offsetof(struct sdp_zctl, sink_state),
					SDP_SINK_OFFERED, SDP_SINK_WITHDRAWN);
	return st != SDP_SINK_TAKEN;          /* withdrawn now, or never taken */
}

/* ---- handlers of the walk (rx.c) -------------------------------------- */

int rx_sink_settle(struct rx_call *rc, uint8_t mid, bool revoked)
{
	if (rc->offered && !revoked && !sink_withdraw(rc->c)) {
		/* Taken, so its RdmaWrCompl comes first: protocol
		 * violation to see stream bytes here. */
		sdp_log(0, "message %u before the RdmaWrCompl of a taken SinkAvail: "
			"connection aborted", mid);
		sdp_conn_abort(rc->c, ECONNRESET);
		return -ECONNRESET;
	}
	/* A SrcAvail revoked before the source took our offer may come
	 * before its RdmaWrCompl: the offer stays out. */
	if (!revoked)
		rc->offered = false;
	return 0;
}

int rx_on_srcavail(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl)
{
	struct sdp_conn *c = rc->c;
	int r = rx_sink_settle(rc, h->mid, srcavail_revoked(c, pl));
	if (r)
		return r;
	bool whole;
	/* Asynchronous bytes go straight into a large enough buffer, whatever
	 * the synchronous threshold says. */
	struct sdp_srcavail sa;
	memcpy(&sa, pl, sizeof sa);
	bool bounce = rc->bounce && !((sa.flags & SDP_SA_ASYNC) && sdp_tun.azcopy &&
				      rc->total - rc->copied >= 16384);
	ssize_t n = read_srcavail(c, rc->fd, pl, rc->off, rc->iov, rc->iovcnt, rc->copied,
				  rc->total - rc->copied, rc->peek, bounce, !rc->nonblock,
				  &whole);
	if (n == -EAGAIN) {                   /* refused: wait for the revocation */
		rc->refused = sa.id;
		return -EAGAIN;
	}
	if (n < 0)
		return (int)n;
	rc->copied += (size_t)n;
	if (!rc->peek)
		c->rx_stream += (uint64_t)n;
	if (whole) {
		if (rc->peek) {
			rc->idx++;
		} else {
			c->rx_off = 0;
			rx_release(c, rc->fd);
		}
		rc->off = 0;
	} else {
		if (!rc->peek)
			c->rx_off = rc->off + (uint32_t)n;
		rc->off += (uint32_t)n;
	}
	return rc->copied == rc->total ? 0 : RX_MORE;
}

/* The source wrote into our SinkAvail buffer. */
int rx_on_wrcompl(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl)
{
	(void)h;
	struct sdp_conn *c = rc->c;
	struct sdp_wrcompl wc;
	memcpy(&wc, pl, sizeof wc);
	struct sdp_zctl *z = sdp_zc_me(c);
	if (!rc->offered || rc->idx || wc.id != c->sink_id ||
	    atomic_load(&z->sink_state) != SDP_SINK_TAKEN ||
	    wc.len > z->sink_len || rc->copied + wc.len > rc->total) {
		sdp_log(0, "unexpected RdmaWrCompl: connection aborted");
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	atomic_store(&z->sink_state, SDP_SINK_NONE);
	sdp_zc_publish(c, sink_state, sink_state);
	rc->offered = false;
	rc->copied += wc.len;
	c->rx_stream += wc.len;
	c->st.rx_wzcopy_bytes += wc.len;
	rx_release(c, rc->fd);
	rc->off = 0;
	return rc->copied == rc->total ? 0 : RX_MORE;
}

/* ---- before and after the waits of a recv ------------------------------ */

int rx_sink_before_wait(struct rx_call *rc)
{
	struct sdp_conn *c = rc->c;
	size_t room = rc->total - rc->copied;
	if (rc->offered || rc->peek || room < rc->thresh ||
	    c->ep.ops->rx_pending(&c->ep) != 0 || !zc_usable(c, rc->fd, room, false))
		return 0;
	/* About to wait with nothing queued: the receiver is the one waiting,
	 * so let the source write straight into our buffer. But spin first:
	 * a streaming source advertises its next buffer right after our read
	 * completed its send, and reading that keeps every copy on this CPU.
	 * Offered at once, the buffer is written by the source's CPU now and
	 * then, and its cache lines move between the CPUs with every switch
	 * of direction. (Sharing one CPU with the source, the spin ends at
	 * once.) */
	int r = sdp_spin(c, FAB_WAIT_RX, &c->rx_lock);
	if (r)
		return r;                     /* < 0 error, > 0 something came */
	rc->offered = sink_offer(c, rc->fd, rc->iov, rc->iovcnt, rc->copied, room);
	return 0;
}

/* How long a taken SinkAvail may go without its RdmaWrCompl. */
#define SINK_WRITE_NS 2000000000ull

/* Something came (or the peer's counters make no sense: rx_hdr says). */
static bool msg_pending(struct sdp_conn *c, void *arg)
{
	(void)arg;
	return c->ep.ops->rx_pending(&c->ep) != 0;
}

int rx_sink_end(struct rx_call *rc, int r)
{
	struct sdp_conn *c = rc->c;
	if (!rc->offered || sink_withdraw(c))
		return r;
	/* The source is writing into our buffer now: its RdmaWrCompl follows
	 * the write. Only messages without stream bytes can come before it
	 * (a SrcAvail revoked before the source took the buffer, a
	 * ModeChange): the walk's handlers take them, and the RdmaWrCompl.
	 * The rx_lock stays held: no other reader may see the RdmaWrCompl. */
	uint64_t deadline = sdp_now_ns() + SINK_WRITE_NS;
	while (rc->offered) {
		struct sdp_bsdh h;
		const char *pl;
		int hr = rx_hdr(c, 0, &h, &pl);
		int k = 0;
		rc->idx = 0;
		rc->off = 0;
		if (hr == 0 && h.mid == SDP_MID_RDMA_WR_COMPL) {
			k = rx_on_wrcompl(rc, &h, pl);
		} else if (hr == 0 && h.mid == SDP_MID_MODE_CHANGE) {
			k = rx_on_modechange(rc, &h, pl);
		} else if (hr == 0 && h.mid == SDP_MID_SRC_AVAIL && srcavail_revoked(c, pl)) {
			k = rx_on_srcavail(rc, &h, pl);
		} else if (hr == -EAGAIN && !sdp_is_reset(c) && !atomic_load(&c->peer_gone)) {
			/* Nothing yet: the write takes one copy's time. Spin
			 * through it, then sleep on the wake-up its message
			 * brings: a stopped source (or a state a third
			 * process wrote) costs no CPU. */
			if (sdp_wait_until(c, rc->fd, FAB_WAIT_RX, msg_pending, NULL,
					   deadline) == -ETIMEDOUT) {
				sdp_log(0, "no RdmaWrCompl for a taken SinkAvail in %llu ms: "
					"connection aborted", SINK_WRITE_NS / 1000000);
				sdp_conn_abort(c, ECONNRESET);
				return r;
			}
			continue;
		} else if (hr == -EAGAIN && msg_pending(c, NULL)) {
			continue;                 /* posted just before the source went */
		} else {
			/* Reset, the source gone, or a message that may not
			 * come before the RdmaWrCompl: it never will. */
			if (!sdp_is_reset(c) && hr == 0)
				sdp_log(0, "message %u before the RdmaWrCompl of a taken "
					"SinkAvail: connection aborted", h.mid);
			else if (!sdp_is_reset(c))
				sdp_log(0, "the source went away with our SinkAvail taken: "
					"connection aborted");
			sdp_conn_abort(c, ECONNRESET);
			return r;
		}
		if (k < 0)
			return k;                 /* aborted */
	}
	return 0;                             /* its bytes are in the buffer */
}

/* ---- SrcAvailCancel ---------------------------------------------------- */

/* (rx_lock held) */
void rx_ack_cancel(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = sdp_zc_me(c), *pz = sdp_zc_peer(c);
	uint32_t cid = atomic_load(&pz->cancel_id);
	if (cid && atomic_load(&z->cancel_ack) != cid) {
		atomic_store(&z->cancel_ack, cid);
		sdp_zc_publish(c, cancel_ack, cancel_ack);
		ep->ops->kick(ep, fd, FAB_WAIT_ZC);
	}
}

void zc_ack_cancel(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = sdp_zc_me(c), *pz = sdp_zc_peer(c);
	uint32_t cid = atomic_load(&pz->cancel_id);
	if (!cid || atomic_load(&z->cancel_ack) == cid)
		return;
	/* Reads happen under rx_lock: holding it, none is in flight. */
	if (pthread_mutex_trylock(&c->rx_lock) != 0)
		return;                       /* the reader will answer */
	atomic_store(&z->cancel_ack, cid);
	sdp_zc_publish(c, cancel_ack, cancel_ack);
	pthread_mutex_unlock(&c->rx_lock);
	ep->ops->kick(ep, fd, FAB_WAIT_ZC);
}
