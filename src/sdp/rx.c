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
#include "sdp/iov.h"
#include "sdp/proto.h"
#include "switch/log.h"
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

_Thread_local uint64_t sdp_rx_seen;
_Thread_local uint32_t sdp_rx_revoke;

/* Read and validate the idx-th pending message header. */
static int rx_hdr(struct sdp_conn *c, uint32_t idx, struct sdp_bsdh *h,
		  const char **payload)
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
	if (r == -EAGAIN && !shm_peer_sane(ep)) {
		sdp_abort_insane(c);
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

static void rx_release(struct sdp_conn *c, int fd)
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
	if (atomic_load(&c->rx_eof) || shm_peer_fin(&c->ep))
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

/*
 * A SrcAvail: RDMA Read (process_vm_readv) up to room bytes of it, from
 * offset off, into the application's buffer at stream offset copied (or,
 * for a receive below the threshold, through a bounce buffer: 000 §2.5).
 * Returns the bytes read (0 if cancelled or nothing fits) or -errno;
 * *whole is set when the advertisement is finished (read or cancelled).
 */
/* Is this SrcAvail (at the head, not read yet) revoked by the source?
 * Revocation covers every unread id up to cancel_last (see below). */
static bool srcavail_revoked(struct sdp_conn *c, const char *pl)
{
	struct sdp_srcavail sa;
	memcpy(&sa, pl, sizeof sa);
	struct sdp_zctl *pz = shm_zc_peer(&c->ep);
	uint32_t cid = atomic_load(&pz->cancel_id), clast = pz->reserved0;
	return cid && sa.id <= clast && sa.id > c->rx_src_id;
}

static ssize_t rx_srcavail(struct sdp_conn *c, int fd, const char *pl, uint32_t off,
			   const struct iovec *iov, int iovcnt, size_t copied,
			   size_t room, bool peek, bool bounce, bool *whole)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = shm_zc_me(ep), *pz = shm_zc_peer(ep);
	struct sdp_srcavail sa;
	memcpy(&sa, pl, sizeof sa);
	*whole = false;
	if (sa.id <= c->rx_src_id || sa.id - c->rx_src_id > ep->nslots ||
	    sa.len == 0 || sa.len > (1u << 30) || !sa.addr ||
	    sa.key <= 0 || off > sa.len) {
		sdp_log(0, "malformed SrcAvail (id %u len %u): connection aborted",
			sa.id, sa.len);
		sdp_conn_abort(c, ECONNRESET);
		return -ECONNRESET;
	}
	/* Mark the read before looking for a cancel (the source looks the
	 * other way round), so a cancel never races a read. */
	atomic_store(&z->reading, sa.id);
	/* Revoked ranges always run from the first unfinished advertisement
	 * to the last posted, so every id up to the highest revoked one that
	 * is still unread (it is here, at the head) is revoked: a later cancel
	 * must not bring an earlier revoked buffer back to life. */
	uint32_t cid = atomic_load(&pz->cancel_id), clast = pz->reserved0;
	if (cid && sa.id <= clast) {
		atomic_store(&z->reading, 0);
		*whole = true;                /* revoked: skip it */
		if (!peek) {
			c->rx_src_id = sa.id;
			atomic_store(&z->rd_done, sa.id);
			/* The source may wait for rd_done to make room for
			 * its next advertisement. */
			ep->ops->kick(ep, fd, FAB_WAIT_ZC);
		}
		return 0;
	}
	size_t n = sa.len - off;
	if (n > room)
		n = room;
	if (n == 0) {
		atomic_store(&z->reading, 0);
		return 0;
	}
	/* The key must be a process that holds the far end of this
	 * connection: never let a peer point our reads at another process,
	 * or at ourselves. Unknowable (no access to /proc): refuse below. */
	int kc = zc_key_check(c, fd, sa.key);
	if (kc == 0) {
		atomic_store(&z->reading, 0);
		sdp_log(0, "SrcAvail %u names process %d, which does not hold "
			"this connection: connection aborted", sa.id, (int)sa.key);
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
						       k, (uint64_t)sa.key);
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
		size_t cap = 0;
		for (int i = 0; i < ln; i++)
			cap += lv[i].iov_len;
		n = cap < n ? cap : n;
		got = zc_rdma(c, false, lv, ln, sa.addr + off, n, (uint64_t)sa.key);
		if (got < 0) {
			errno = (int)-got;
			got = -1;
		}
		if (got > 0 && (size_t)got < n)
			n = (size_t)got;      /* a partial copy is progress */
	}
	if (got < 0 && (errno == EPERM || errno == EACCES) && !peek) {
		/* The kernel will not let us read the source: refuse; it
		 * revokes its SrcAvails and sends by Buffer Copy instead. */
		atomic_store(&z->reading, 0);
		atomic_store(&z->adv_max, 0);
		atomic_store(&c->cma, -errno);
		atomic_store(&z->refused, 1);
		ep->ops->kick(ep, fd, FAB_WAIT_ZC | FAB_WAIT_CREDIT);
		sdp_log(1, "RDMA Read refused (%s): Buffer Copy from now on",
			strerror(errno));
		return -EAGAIN;
	}
	if (got != (ssize_t)n) {
failed:
		atomic_store(&z->reading, 0);
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
		c->st.rx_rzcopy_bytes += n;
	} else if (off + n == sa.len) {
		*whole = true;
	}
	atomic_store(&z->reading, 0);         /* after rd_bytes is published */
	if (!peek)
		ep->ops->kick(ep, fd, FAB_WAIT_ZC);
	return (ssize_t)n;
}


/* Offer the application's buffer as a SinkAvail (Write ZCopy). */
static bool sink_offer(struct sdp_conn *c, int fd, const struct iovec *iov,
		       int iovcnt, size_t copied, size_t room)
{
	struct fab_ep *ep = &c->ep;
	struct iovec v;
	if (iov_slice(iov, iovcnt, copied, room, &v, 1) != 1)
		return false;
	struct sdp_zctl *z = shm_zc_me(ep);
	if (atomic_load(&z->adv_max) == 0 ||
	    v.iov_len < atomic_load(&c->zcopy_thresh))
		return false;                 /* the peer may not write into us */
	z->sink_addr = (uint64_t)(uintptr_t)v.iov_base;
	z->sink_len = v.iov_len > (1u << 30) ? (1u << 30) : (uint32_t)v.iov_len;
	z->sink_pos = c->rx_stream;
	atomic_store(&z->pid, (int32_t)sdp_pid);
	atomic_store(&z->sink_id, ++c->sink_id);
	atomic_store_explicit(&z->sink_state, SDP_SINK_OFFERED, memory_order_release);
	ep->ops->kick(ep, fd, FAB_WAIT_CREDIT);
	return true;
}

/* Withdraw our offer; false if the source has taken it (its RdmaWrCompl
 * is then on its way and must be read). */
static bool sink_withdraw(struct sdp_conn *c)
{
	struct sdp_zctl *z = shm_zc_me(&c->ep);
	uint32_t st = SDP_SINK_OFFERED;
	if (atomic_compare_exchange_strong(&z->sink_state, &st, SDP_SINK_WITHDRAWN))
		return true;
	return st != SDP_SINK_TAKEN;
}

static void ack_cancel_locked(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = shm_zc_me(ep), *pz = shm_zc_peer(ep);
	uint32_t cid = atomic_load(&pz->cancel_id);
	if (cid && atomic_load(&z->cancel_ack) != cid) {
		atomic_store(&z->cancel_ack, cid);
		ep->ops->kick(ep, fd, FAB_WAIT_ZC);
	}
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
	if (atomic_load_explicit(&c->zcopy_thresh, memory_order_relaxed))
		zc_probe(c, fd);                  /* so that the peer may advertise */
	size_t copied = 0;
	r = 0;
	/* SO_RCVLOWAT: a blocking recv returns once this much is copied. */
	size_t lowat = atomic_load(&c->rcvlowat);
	if (lowat < 1)
		lowat = 1;
	if (lowat > total)
		lowat = total;
	bool offered = false;                 /* a SinkAvail of ours is out */
	uint32_t thresh = atomic_load(&c->zcopy_thresh);
	bool bounce = !thresh || total < thresh;
	while (copied < total || (total == 0 && !data_pending(c))) {
		/* Our side froze for a fallback (maybe another thread): what
		 * is still in the ring is re-sent by the peer on TCP. */
		if (shm_my_fb(&c->ep) || atomic_load(&c->fb_done)) {
			r = copied ? 0 : -SDP_EFALLBACK;
			break;
		}
		/* A peek consumes nothing: every pass copies from the head
		 * again (counting on would hand the same bytes out twice). */
		if (peek)
			copied = 0;
		ack_cancel_locked(c, fd);
		uint32_t idx = 0, off = c->rx_off, refused = 0;
		bool fin_met = false;
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
				/* A peek that reached it returns what it copied
				 * before it, or EOF (nothing is consumed, so the
				 * FIN's position cannot tell it). */
				fin_met = peek;
				r = -EAGAIN;      /* stop: EOF after what we have */
				break;
			}
			if (h.mid == SDP_MID_MODE_CHANGE) {
				struct sdp_modechange mc;
				memcpy(&mc, pl, sizeof mc);
				if (mc.mode > SDP_MODE_PIPELINED) {
					sdp_conn_abort(c, ECONNRESET);
					r = -ECONNRESET;
					break;
				}
				if (peek || idx) {
					idx++;
				} else {
					c->peer_mode = (uint8_t)mc.mode;
					rx_release(c, fd);
				}
				off = 0;
				continue;
			}
			if (h.mid == SDP_MID_RDMA_WR_COMPL) {
				/* The source wrote into our SinkAvail buffer. */
				struct sdp_wrcompl wc;
				memcpy(&wc, pl, sizeof wc);
				struct sdp_zctl *z = shm_zc_me(&c->ep);
				if (!offered || idx || wc.id != c->sink_id ||
				    atomic_load(&z->sink_state) != SDP_SINK_TAKEN ||
				    wc.len > z->sink_len || copied + wc.len > total) {
					sdp_log(0, "unexpected RdmaWrCompl: connection aborted");
					sdp_conn_abort(c, ECONNRESET);
					r = -ECONNRESET;
					break;
				}
				atomic_store(&z->sink_state, SDP_SINK_NONE);
				offered = false;
				copied += wc.len;
				c->rx_stream += wc.len;
				c->st.rx_wzcopy_bytes += wc.len;
				rx_release(c, fd);
				off = 0;
				if (copied == total)
					break;
				continue;
			}
			/* A SrcAvail revoked before the source took our offer
			 * may come before its RdmaWrCompl: skip it below. */
			bool revoked = h.mid == SDP_MID_SRC_AVAIL && srcavail_revoked(c, pl);
			if (offered && !revoked && !sink_withdraw(c)) {
				/* Taken, so its RdmaWrCompl comes first: protocol
				 * violation to see data here. */
				sdp_log(0, "message %u before the RdmaWrCompl of a "
					"taken SinkAvail: connection aborted", h.mid);
				sdp_conn_abort(c, ECONNRESET);
				r = -ECONNRESET;
				break;
			}
			if (!revoked)
				offered = false;
			if (h.mid == SDP_MID_SRC_AVAIL) {
				bool whole;
				ssize_t n = rx_srcavail(c, fd, pl, off, iov, iovcnt, copied,
							total - copied, peek, bounce, &whole);
				if (n == -EAGAIN) {
					r = -EAGAIN;  /* refused: wait for the revocation */
					struct sdp_srcavail sa;
					memcpy(&sa, pl, sizeof sa);
					refused = sa.id;
					break;
				}
				if (n < 0) {
					r = (int)n;
					break;
				}
				copied += (size_t)n;
				if (!peek)
					c->rx_stream += (uint64_t)n;
				if (whole) {
					if (peek) {
						idx++;
					} else {
						c->rx_off = 0;
						rx_release(c, fd);
					}
					off = 0;
				} else {
					if (!peek)
						c->rx_off = off + (uint32_t)n;
					off += (uint32_t)n;
				}
				if (copied == total)
					break;
				continue;
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
			if (peek) {
				idx++;
				off = 0;
			} else {
				c->rx_stream += n;
				c->st.rx_bcopy_bytes += n;
				if (off + n == plen) {
					c->rx_off = 0;
					off = 0;
					rx_release(c, fd);
				} else {
					c->rx_off = off + (uint32_t)n;
				}
			}
			if (copied == total)
				break;
		}
		if (r == -ECONNRESET)
			break;
		if (copied == total && total)
			{ r = 0; break; }
		if (copied && !waitall && (copied >= lowat || nonblock))
			{ r = 0; break; }
		if (fin_met)
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
		/* About to wait with nothing queued: if the receiver is the one
		 * waiting, let the source write straight into our buffer. But
		 * spin first: a streaming source advertises its next buffer
		 * right after our read completed its send, and reading that
		 * keeps every copy on this CPU. Offered at once, the buffer is
		 * written by the source's CPU now and then, and its cache
		 * lines move between the CPUs with every switch of direction.
		 * (Sharing one CPU with the source, the spin ends at once.) */
		if (!offered && !peek && total - copied >= thresh &&
		    c->ep.ops->rx_pending(&c->ep) == 0 &&
		    zc_usable(c, fd, total - copied, false)) {
			r = sdp_spin(c, FAB_WAIT_RX, &c->rx_lock);
			if (r < 0)
				break;
			if (r > 0)
				continue;         /* something came: take it */
			offered = sink_offer(c, fd, iov, iovcnt, copied, total - copied);
		}
		/* A peek left idx messages queued (control messages, or data
		 * below SO_RCVLOWAT): sleep until there is one more, or the
		 * wait would find them and return at once, over and over. */
		/* A SrcAvail we refused stays where it is until the source
		 * revokes it, and nothing behind it can be read before: sleep
		 * until the source does, or the wait would find it and return
		 * at once, over and over. */
		sdp_rx_seen = refused ? UINT64_MAX : peek ? c->ep.ops->rx_seq(&c->ep) + idx : 0;
		sdp_rx_revoke = refused;
		r = sdp_wait(c, fd, FAB_WAIT_RX,
			     SDP_WAIT_RCVTIMEO | (copied ? SDP_WAIT_PARTIAL : 0),
			     &c->rx_lock);
		sdp_rx_seen = 0;
		sdp_rx_revoke = 0;
		if (r)
			break;
	}
	if (offered && !sink_withdraw(c)) {
		/* The source is writing into our buffer now: take its
		 * RdmaWrCompl, which it posts right after the write. */
		uint64_t deadline = sdp_now_ns() + 2000000000ull;
		for (;;) {
			struct sdp_bsdh h;
			const char *pl;
			int hr = rx_hdr(c, 0, &h, &pl);
			if (hr == 0 && ((h.mid == SDP_MID_SRC_AVAIL && srcavail_revoked(c, pl)) ||
					h.mid == SDP_MID_MODE_CHANGE)) {
				/* Posted before the source took our buffer:
				 * no stream bytes, consume and look again. */
				if (h.mid == SDP_MID_SRC_AVAIL) {
					bool whole = false;
					rx_srcavail(c, fd, pl, 0, iov, iovcnt, copied, 0,
						    false, false, &whole);
				} else {
					struct sdp_modechange mc;
					memcpy(&mc, pl, sizeof mc);
					if (mc.mode <= SDP_MODE_PIPELINED)
						c->peer_mode = (uint8_t)mc.mode;
				}
				c->rx_off = 0;
				rx_release(c, fd);
				continue;
			}
			if (hr == 0 && h.mid == SDP_MID_RDMA_WR_COMPL) {
				struct sdp_wrcompl wc;
				memcpy(&wc, pl, sizeof wc);
				if (wc.id == c->sink_id && copied + wc.len <= total) {
					copied += wc.len;
					c->rx_stream += wc.len;
					c->st.rx_wzcopy_bytes += wc.len;
					rx_release(c, fd);
					r = 0;
				}
				atomic_store(&shm_zc_me(&c->ep)->sink_state, SDP_SINK_NONE);
				break;
			}
			if (sdp_now_ns() > deadline || sdp_is_reset(c)) {
				if (!sdp_is_reset(c))
					sdp_log(0, "no RdmaWrCompl for a taken SinkAvail "
						"(head message %d): connection aborted",
						hr == 0 ? (int)h.mid : -1);
				sdp_conn_abort(c, ECONNRESET);
				break;
			}
			/* The write takes one copy's time; past a millisecond
			 * (a stopped source, or a state a third process wrote),
			 * wait without taking the CPU. */
			if (sdp_now_ns() + 1999000000ull > deadline) {
				struct timespec nap = { 0, 200000 };
				nanosleep(&nap, NULL);
			} else {
				__builtin_ia32_pause();
			}
		}
	}
	if (!peek)
		c->st.rx_bytes += copied;
	if (!peek && copied && c->rx_off && c->ep.ops->peer_tx_limited(&c->ep)) {
		/* Part of a message read: a byte-limited sender may go on
		 * (a released message published its bytes already). */
		c->ep.ops->set_rx_bytes(&c->ep, c->rx_stream);
		c->ep.ops->kick(&c->ep, fd, FAB_WAIT_CREDIT);
	}
	sdp_unlock(&c->rx_lock);
	sdp_reset_tell(c, fd);
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
	bool fin = atomic_load(&c->rx_eof) || shm_peer_fin_seen(ep) ||
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
	    shm_peer_closed(ep))
		ev |= POLLOUT | POLLWRNORM;
	if (wr_closed && rd_closed)
		ev |= POLLHUP;                /* TCP: both directions shut */
	return ev;
}

uint64_t sdp_ready_since(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	uint32_t pend = ep->ops->rx_pending(ep);
	if (pend == 0 || pend == UINT32_MAX)
		return 0;
	return ep->ops->rx_since(ep);
}

void sdp_arm(struct sdp_conn *c, int fd, unsigned events)
{
	unsigned what = 0;
	if (events & (POLLIN | POLLRDNORM | POLLRDHUP))
		what |= FAB_WAIT_RX;
	if (events & (POLLOUT | POLLWRNORM))
		what |= FAB_WAIT_CREDIT;
	c->ep.ops->arm(&c->ep, what | FAB_WAIT_RX);
	shm_kick_owed(&c->ep, fd);            /* we may sleep now */
}
