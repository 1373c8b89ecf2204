/*
 * wait.c - how a blocked send or receive waits for the peer.
 *
 * First spin for spin_us (a wake-up on this class of machine costs tens of
 * microseconds, a spin costs nothing when the peer answers quickly); then
 * arm the fabric wake-up, re-check, and sleep on the connection's TCP socket
 * until the peer's kick token arrives.
 *
 * With a single waiter, receive-side sleeps are a blocking recv() on the
 * TCP socket itself: the kernel then gives exactly TCP's behaviour for
 * SO_RCVTIMEO (EAGAIN), signals (EINTR, or transparent restart under
 * SA_RESTART) and peer death (FIN/RST). When several threads wait on one
 * connection a token may be consumed by the "wrong" waiter, so they sleep
 * in poll() slices instead and re-check.
 */
#include <errno.h>
#include <poll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/sys.h"

static bool cond_met(struct sdp_conn *c, unsigned what)
{
	struct fab_ep *ep = &c->ep;
	if (atomic_load_explicit(&c->peer_gone, memory_order_relaxed) ||
	    atomic_load_explicit(&c->state, memory_order_relaxed) == SDP_ST_RESET ||
	    shm_peer_abort(ep) || sdp_fallback_pending(c))
		return true;
	if (what & FAB_WAIT_RX)
		return ep->ops->rx_pending(ep) != 0 || shm_peer_fin(ep);
	return ep->ops->credits(ep) != 0;
}

static void note_wakeup_result(struct sdp_conn *c, int r)
{
	if (r == 1) {
		uint32_t z = 0;
		atomic_compare_exchange_strong(&c->peer_gone, &z, 1);
	} else if (r < 0 && r != -EAGAIN && r != -EINTR) {
		atomic_store(&c->peer_gone, 2);
	}
}

static int wait_unlocked(struct sdp_conn *c, int fd, unsigned what,
			 bool use_rcvtimeo);

void sdp_on_wakeup(struct sdp_conn *c, int fd)
{
	int r = c->ep.ops->drain(&c->ep, fd);
	if (r)
		c->st.doorbells_rx++;
	note_wakeup_result(c, r);
}

static int64_t remaining_ms(uint64_t deadline)
{
	if (!deadline)
		return -1;
	uint64_t now = sdp_now_ns();
	if (now >= deadline)
		return 0;
	return (int64_t)((deadline - now + 999999) / 1000000);
}

int sdp_wait(struct sdp_conn *c, int fd, unsigned what, bool use_rcvtimeo,
	     pthread_mutex_t *held)
{
	/* Like the kernel's socket lock, ours is not held while sleeping:
	 * close, shutdown or a fallback from another thread or process must
	 * not wait for a blocked recv/send. The caller re-reads its state. */
	sdp_unlock(held);
	int ret = wait_unlocked(c, fd, what, use_rcvtimeo);
	int r = sdp_lock(held);
	return ret ? ret : r;
}

static int wait_unlocked(struct sdp_conn *c, int fd, unsigned what, bool use_rcvtimeo)
{
	struct fab_ep *ep = &c->ep;
	uint32_t spin = atomic_load_explicit(&c->spin_us, memory_order_relaxed);
	if (spin) {
		uint64_t end = sdp_now_ns() + (uint64_t)spin * 1000;
		for (unsigned i = 1;; i++) {
			if (cond_met(c, what))
				return 0;
			__builtin_ia32_pause();
			if (!(i & 63) && sdp_now_ns() > end)
				break;
		}
	}

	uint64_t deadline = 0;
	if (!use_rcvtimeo) {
		int64_t to = atomic_load(&c->sndtimeo_us);
		if (to > 0)
			deadline = sdp_now_ns() + (uint64_t)to * 1000;
	}
	int ret = 0;
	atomic_fetch_add(&c->nwaiters, 1);
	for (;;) {
		ep->ops->arm(ep, what);
		if (cond_met(c, what))
			break;
		bool alone = atomic_load(&c->nwaiters) == 1;
		if (alone && use_rcvtimeo) {
			/* Kernel-exact blocking: SO_RCVTIMEO, SA_RESTART, FIN.
			 * Peek: only announced tokens may be consumed. */
			unsigned char b;
			long r = syscall(SYS_recvfrom, fd, &b, 1, MSG_PEEK, NULL, NULL);
			if (r > 0) {
				sdp_on_wakeup(c, fd);
				if (!shm_tokens_due(ep) && !cond_met(c, what)) {
					/* A byte that is not a token: the peer
					 * left SDP; let the caller see it. */
					if (shm_peer_fb(ep))
						break;
				}
				continue;
			}
			if (r == 0) {
				note_wakeup_result(c, 1);
				break;
			}
			if (errno == EAGAIN || errno == EINTR) {
				ret = -errno;
				break;
			}
			note_wakeup_result(c, -errno);
			break;
		}
		int64_t ms = remaining_ms(deadline);
		if (ms == 0) {
			ret = -EAGAIN;
			break;
		}
		if (!alone && (ms < 0 || ms > 20))
			ms = 20;                  /* another waiter may eat our token */
		struct pollfd p = { .fd = fd, .events = POLLIN };
		int r = sys_poll(&p, 1, (int)ms);
		if (r < 0 && errno == EINTR) {
			ret = -EINTR;
			break;
		}
		if (r > 0)
			sdp_on_wakeup(c, fd);
	}
	ep->ops->disarm(ep, what);
	atomic_fetch_sub(&c->nwaiters, 1);
	return ret;
}

void sdp_conn_abort(struct sdp_conn *c, int err)
{
	atomic_store(&c->so_error, err);
	atomic_store(&c->state, SDP_ST_RESET);
	shm_set_abort(&c->ep);
}
