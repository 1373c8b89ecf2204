/*
 * close.c - the close state machine: half-close, orderly close, abort.
 *
 *   shutdown(SHUT_WR)  -> DisConn message (TCP FIN) + FIN mark in our
 *                         control block, which also works without a credit;
 *                         the peer reads EOF after our last byte.
 *   shutdown(SHUT_RD)  -> local only: reads return EOF.
 *   last close         -> unread data or SO_LINGER 0: AbortConn (TCP RST);
 *                         otherwise DisConn. Then the TCP socket is closed by
 *                         the switch: the kernel's FIN/RST on it is what the
 *                         peer's wait object reports if it sleeps.
 * The connection memory stays mapped by the peer until it has read the
 * last byte, so a close never loses queued data. Our "closed" mark
 * (FAB_M_CLOSED) is the last thing we write to shared state: from then on
 * the provider may reuse the memory for another connection (shm: the
 * connecting side's arena slots, fabric/shm_region.c). The switch calls
 * sdp_release for an SDP connection, sdp_release_tcp for one kept on TCP
 * or fallen back, sdp_conn_drop for one whose connect failed at once. A
 * close with asynchronous advertisements unread (az.h) hands the release
 * to the progress thread, which makes it once the peer has read them.
 */
#include <errno.h>
#include <sys/mman.h>
#include <sys/socket.h>

#include "sdp/az.h"
#include "sdp/conn.h"
#include "sdp/proto.h"
#include "sdp/sys.h"
#include "sdp/log.h"

/* closing: the TCP socket is closed right after, and its FIN wakes a
 * sleeping peer; no wake-up token is needed. */
static void send_fin(struct sdp_conn *c, int fd, bool closing)
{
	if (sdp_lock(&c->tx_lock))
		return;
	if (!atomic_exchange(&c->tx_shut, 1)) {
		sdp_mark(c, FAB_M_FIN);
		if (c->ep.ops->credits(&c->ep) > 0)
			sdp_post_msg_nokick(c, fd, SDP_MID_DISCONN, closing);
		if (!closing)
			c->ep.ops->kick(&c->ep, fd, FAB_WAIT_RX);
	}
	sdp_unlock(&c->tx_lock);
}

int sdp_shutdown(struct sdp_conn *c, int fd, int how)
{
	if (how != SHUT_RD && how != SHUT_WR && how != SHUT_RDWR)
		return -EINVAL;
	if (sdp_is_reset(c))
		return -ENOTCONN;             /* TCP: the reset closed it */
	if (how == SHUT_RD || how == SHUT_RDWR) {
		atomic_store(&c->rx_shut, 1);
		sdp_mark(c, FAB_M_RD_SHUT);
		c->ep.ops->kick(&c->ep, fd, FAB_WAIT_CREDIT);
		/* Our threads asleep on it wake, as TCP's readers do. */
		sdp_wake_sleepers(c);
	}
	if (how == SHUT_WR || how == SHUT_RDWR)
		send_fin(c, fd, false);
	/* Both directions: nothing more is read or sent on the kernel
	 * socket; shut for reading, it wakes whatever sleeps on it (a
	 * single-threaded process's signal handler, a forked process's
	 * sleeps). SHUT_RD alone cannot: our sends still wait there for the
	 * peer's tokens (the wake descriptor above wakes our sleepers). */
	if (how == SHUT_RDWR)
		sys_shutdown(fd, SHUT_RD);
	/* A provider whose connection was not up yet (ofi) answers a FIN by
	 * going to TCP: hand back now, and shut the socket as asked. */
	if (sdp_fallback_by_peer(c) && !atomic_load(&c->fb_done) &&
	    sdp_fallback_fd(c, fd) == 0)
		sys_shutdown(fd, how);
	return 0;
}

void sdp_linger_set(struct sdp_conn *c, bool zero)
{
	atomic_store(&c->linger0, zero);
	/* For a peer that sees our socket reset when our process ends
	 * without closing it (wait.c). */
	c->ep.ops->set_linger0(&c->ep, zero);
}

void sdp_release(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	az_recv_settle(c);                    /* receives still being copied */
	/* Asynchronous advertisements of ours unread: the release waits until
	 * the peer has read them (az.h), as a closed TCP socket still sends
	 * what it had queued; the progress thread makes it then. */
	if (az_linger(c, fd))
		return;
	uint32_t np = atomic_fetch_sub(&c->nproc, 1);
	sdp_log(3, "release fd %d: %u process(es) held it", fd, np);
	if (np > 1) {
		/* Another process (fork) still holds the socket: drop only our
		 * own mapping (the struct is shared, the mapping is not). */
		sdp_conn_retire(c, SDP_RETIRE_UNMAP);
		return;
	}
	uint32_t st = atomic_load(&c->state);
	if (st != SDP_ST_RESET) {
		/* TCP sends RST when closing with unread data. */
		bool unread = sdp_fionread(c) > 0;
		if (unread || atomic_load(&c->linger0)) {
			sdp_log(2, "close fd %d with %s: abort", fd,
				unread ? "unread data" : "SO_LINGER 0");
			if (sdp_lock(&c->tx_lock) == 0) {
				sdp_mark(c, FAB_M_ABORT);
				if (ep->ops->credits(ep) > 0)
					sdp_post_msg(c, fd, SDP_MID_ABORT, NULL, 0, 0, 0);
				sdp_unlock(&c->tx_lock);
			}
			struct linger lg = { 1, 0 };
			sys_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
		} else {
			/* Closed before the server attached: the provider may
			 * take the connection back for TCP (shm), so that a
			 * server that later cannot serve it still gets our
			 * bytes; the hand-back below then sends them. */
			if (ep->ops->abandon)
				ep->ops->abandon(ep);
			send_fin(c, fd, true);
			/* A provider whose connection was not up yet (ofi)
			 * answers a FIN by going to TCP: hand what we posted
			 * back on the socket before it closes. */
			if (sdp_fallback_by_peer(c) && !atomic_load(&c->fb_done))
				sdp_fallback_fd(c, fd);
		}
	}
	sdp_release_finish(c, fd);
}

void sdp_release_finish(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	/* Stop asking for kicks and eat tokens already queued, so that the
	 * kernel closes the TCP socket with a FIN rather than an RST. */
	ep->ops->disarm(ep, FAB_WAIT_ALL | FAB_WAIT_QALL);
	if (fd >= 0 && ep->ops->tokens_due(ep))
		ep->ops->drain(ep, fd);
	sdp_trim_close(c);                    /* before the region can be reused */
	atomic_store(&c->state, SDP_ST_CLOSED);
	/* The closed mark - our last write to the shared state, after which
	 * the peer may reuse the memory - goes with the detach, when no call
	 * of another thread still reads it (sdp_conn_retire). */
	sdp_conn_retire(c, SDP_RETIRE_DETACH | SDP_RETIRE_FREE);
}

void sdp_release_tcp(struct sdp_conn *c)
{
	az_conn_drop(c);                      /* re-sent on TCP: nothing in flight */
	bool last = atomic_fetch_sub(&c->nproc, 1) == 1;
	unsigned how = last ? SDP_RETIRE_FREE : 0;
	if (c->ep.ops) {                      /* fell back from SDP */
		if (last) {
			how |= SDP_RETIRE_DETACH;     /* with the closed mark */
		} else {
			how |= SDP_RETIRE_UNMAP;
		}
	}
	if (how)
		sdp_conn_retire(c, how);
}

void sdp_conn_drop(struct sdp_conn *c)
{
	if (c->ep.ops)
		c->ep.ops->detach(&c->ep);
	sdp_conn_free(c);
}
