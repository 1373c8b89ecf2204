/*
 * wait.c - how a blocked send or receive waits for the peer.
 *
 * First spin for spin_us (a wake-up on this class of machine costs tens of
 * microseconds, a spin costs nothing when the peer answers quickly); then
 * arm the fabric wake-up, re-check, and sleep on the connection's TCP socket
 * until the peer's kick token arrives.
 *
 * One waiter per connection, the watcher, sleeps on the TCP socket and is
 * the only one that consumes wake-up tokens; other threads of the library
 * sleep on the wake_gen futex, which every drain bumps. The watcher sleeps
 * in a blocking recv(MSG_PEEK) on the socket: the kernel then gives exactly
 * TCP's behaviour for SO_RCVTIMEO (EAGAIN), signals (EINTR, or transparent
 * restart under SA_RESTART) and peer death (FIN/RST). A send with
 * SO_SNDTIMEO sleeps in poll() with its deadline instead, and so does a
 * call that has already moved bytes (SDP_WAIT_PARTIAL): TCP returns the
 * partial count on a signal even under SA_RESTART, and poll() is never
 * restarted (threads behind the watcher then sleep in 1 ms ppoll() slices
 * instead of on the futex, which would restart). In a process with
 * threads a receiving watcher polls the socket and the process's wake
 * descriptor instead (wake.c: another thread's shutdown(SHUT_RD) must wake
 * it), with SO_RCVTIMEO as the deadline and SA_RESTART as restart_after_
 * signal finds it.
 */
#include <errno.h>
#include <signal.h>
#include <string.h>
#include <sched.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sdp/az.h"
#include "sdp/conn.h"
#include "sdp/proto.h"
#include "sdp/spin.h"
#include "sdp/sys.h"
#include "sdp/log.h"
#include "sdp/wake.h"

/* A message the waiting receive has not looked at yet (rx.c: a peek may
 * leave messages queued; only a newer one can change its answer). */
static bool rx_more(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	if (sdp_rx_revoke) {
		struct sdp_zctl *pz = sdp_zc_peer(c);
		if (atomic_load(&pz->cancel_id) &&
		    atomic_load(&pz->cancel_last) >= sdp_rx_revoke)
			return true;
	}
	uint32_t n = ep->ops->rx_pending(ep);
	if (n == 0 || n == UINT32_MAX || !sdp_rx_seen)
		return n != 0;
	return ep->ops->rx_seq(ep) + n > sdp_rx_seen;
}

/* A condition of the caller's own (sdp_wait_until). */
struct wait_for {
	bool (*met)(struct sdp_conn *c, void *arg);
	void *arg;
};

/* The wait is over: what it waits for happened, or the connection ended
 * (wf: only a reset or the peer's end - the caller holds its lock, so
 * neither side's fallback can start). */
static bool cond_met(struct sdp_conn *c, unsigned what, const struct wait_for *wf)
{
	struct fab_ep *ep = &c->ep;
	if (atomic_load_explicit(&c->peer_gone, memory_order_relaxed) ||
	    atomic_load_explicit(&c->state, memory_order_relaxed) == SDP_ST_RESET ||
	    (!wf && atomic_load_explicit(&c->fb_done, memory_order_relaxed)))
		return true;
	/* The peer's abort, either side's fallback, and for a receive the
	 * peer's FIN after everything we read: one look at the marks. */
	unsigned fb = wf ? 0 : FAB_M_FB | FAB_MY(FAB_M_FB);
	unsigned m = ep->ops->marks(ep, FAB_M_ABORT | fb |
				    ((what & FAB_WAIT_RX) && !wf ? FAB_M_FIN_READ : 0));
	if (m & (FAB_M_ABORT | fb))
		return true;
	const char *why;
	if (!ep->ops->peer_sane(ep, &why)) {
		sdp_abort_insane(c, why);
		return true;
	}
	if (wf)
		return wf->met(c, wf->arg);
	if ((what & FAB_WAIT_RX) && (rx_more(c) || (m & FAB_M_FIN_READ) ||
				     atomic_load_explicit(&c->rx_shut, memory_order_relaxed)))
		return true;                  /* (shutdown(SHUT_RD): EOF) */
	if ((what & FAB_WAIT_CREDIT) && sdp_tx_open(c))   /* credit and window */
		return true;
	if ((what & FAB_WAIT_ZC) &&
	    atomic_load(&sdp_zc_peer(c)->rd_done) != c->zc_mark)
		return true;
	return false;
}

/* Had the peer taken in everything we sent, as TCP counts it: every
 * message we posted, or all but our DisConn (a FIN is not data: a TCP
 * socket closed with only a FIN unread closes with a FIN)? */
static bool peer_read_all(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	if (sdp_marked(c, FAB_M_CAUGHT_UP))
		return true;
	uint64_t seq = ep->ops->tx_seq(ep);
	if (!atomic_load(&c->tx_shut) || seq == 0 ||
	    ep->ops->credits(ep) + 1 != fab_tx_window(ep))
		return false;                 /* more than one message unread */
	struct sdp_bsdh h;                    /* the last one we posted */
	memcpy(&h, ep->ops->tx_msg(ep, seq - 1), sizeof h);
	return h.mid == SDP_MID_DISCONN;
}

/*
 * The peer's socket reset: was it only our wake-up tokens? A process that
 * ends without closing (exit, a signal) leaves its socket to the kernel,
 * which resets a connection whose receive queue holds unread bytes - here
 * tokens of ours, which TCP's queue would never have held. TCP would have
 * closed with a FIN. So the reset is the peer's orderly end when tokens of
 * ours were unread, the peer had read everything we sent, had not reset
 * the connection itself (abort mark, or SO_LINGER 0, which resets on TCP
 * too), and neither side had started a fallback (the socket then carries
 * stream bytes). Otherwise it stays a reset.
 */
static bool reset_by_tokens(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	return !sdp_marked(c, FAB_M_ABORT | FAB_M_FB | FAB_MY(FAB_M_FB)) &&
	       !ep->ops->peer_linger0(ep) && ep->ops->tokens_unread(ep) > 0 &&
	       peer_read_all(c);
}

/* The peer's TCP socket closed (r = 1: FIN) or reset (r < 0). If the peer
 * closed through SDP (DisConn) this is the orderly end. If not, its process
 * died: as the kernel does, a peer that left our data unread resets. */
static void note_wakeup_result(struct sdp_conn *c, int r)
{
	if (r == -ECONNRESET && reset_by_tokens(c)) {
		sdp_log(2, "peer's TCP socket reset over our unread wake-ups only: "
			"its end, as TCP's FIN");
		r = 1;
	}
	if (r == 1) {
		uint32_t z = 0;
		/* No FIN, our data unread, no fallback: the peer died. */
		bool reset = !sdp_marked(c, FAB_M_FIN | FAB_M_FB) && !peer_read_all(c);
		if (atomic_compare_exchange_strong(&c->peer_gone, &z, reset ? 2 : 1))
			sdp_log(1, "peer's TCP socket closed%s", reset ?
				" before its data was read: reset" : "");
	} else if (r < 0 && r != -EAGAIN && r != -EINTR) {
		/* As TCP reports it: a connection that timed out (keepalive,
		 * TCP_USER_TIMEOUT) says ETIMEDOUT, not ECONNRESET. */
		if (r == -ETIMEDOUT || r == -EHOSTUNREACH) {
			int32_t z = 0;
			atomic_compare_exchange_strong(&c->so_error, &z, -r);
		}
		if (atomic_exchange(&c->peer_gone, 2) != 2)
			sdp_log(1, "peer's TCP socket: %s", strerror(-r));
	}
}

bool sdp_is_reset(struct sdp_conn *c)
{
	return atomic_load_explicit(&c->state, memory_order_relaxed) == SDP_ST_RESET ||
	       sdp_marked(c, FAB_M_ABORT) ||
	       atomic_load_explicit(&c->peer_gone, memory_order_relaxed) == 2;
}

bool sdp_take_reset(struct sdp_conn *c)
{
	return sdp_is_reset(c) && !atomic_exchange(&c->err_reported, 1);
}

static int wait_unlocked(struct sdp_conn *c, int fd, unsigned what,
			 unsigned flags, const struct wait_for *wf, uint64_t deadline);
static int64_t remaining_ms(uint64_t deadline);

static void wake_others(struct sdp_conn *c)
{
	atomic_fetch_add(&c->wake_gen, 1);
	if (atomic_load(&c->futex_sleepers) > 0)
		syscall(SYS_futex, &c->wake_gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	/* Threads in their fast sleep (below) sleep on the fabric's word. */
	if (atomic_load(&c->fast_sleepers) > 0) {
		_Atomic uint32_t *w = c->ep.ops->fwake_word(&c->ep);
		atomic_fetch_add(w, 1);
		syscall(SYS_futex, w, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
	}
}

/* A local shutdown(SHUT_RD) (rx_shut set): wake this process's threads
 * asleep on the connection, as TCP's shutdown wakes its readers - those on
 * the futex, and the watcher and poll/epoll sleepers through the wake
 * descriptor (wake.c). */
void sdp_wake_sleepers(struct sdp_conn *c)
{
	wake_others(c);
	if (sdp_wake_all(c))
		sdp_log(3, "shutdown(SHUT_RD): woke this process's sleepers");
}

void sdp_wake_waiters(struct sdp_conn *c)
{
	wake_others(c);
}

void sdp_on_wakeup(struct sdp_conn *c, int fd)
{
	int r = c->ep.ops->drain(&c->ep, fd);
	if (r == -EPROTO) {
		/* A byte on the TCP socket that no library wrote: it has no
		 * place in the stream, and left there it would end every
		 * sleep at once. Reset, and wake the peer to see it. */
		if (!sdp_is_reset(c)) {
			sdp_log(0, "fd %d: a byte that is not a wake-up token arrived "
				"on the TCP socket (written outside libsdp): "
				"connection reset", fd);
			sdp_conn_abort(c, ECONNRESET);
		}
		sdp_reset_tell(c, fd);
		wake_others(c);
		return;
	}
	if (r)
		c->st.doorbells_rx++;
	note_wakeup_result(c, r);
	wake_others(c);
	az_progress(c);                       /* a read of ours may be done */
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

int sdp_wait(struct sdp_conn *c, int fd, unsigned what, unsigned flags,
	     pthread_mutex_t *held)
{
	/* The words the held lock serializes must be exactly what we wrote
	 * (a process that can write the region may have changed them). */
	const char *why;
	if (!sdp_is_reset(c) &&
	    !c->ep.ops->self_sane(&c->ep, held == &c->tx_lock ? FAB_SELF_TX : FAB_SELF_RX,
				  &why))
		sdp_abort_insane(c, why);
	/* Like the kernel's socket lock, ours is not held while sleeping:
	 * close, shutdown or a fallback from another thread or process must
	 * not wait for a blocked recv/send. The caller re-reads its state. */
	sdp_unlock(held);
	sdp_idle_look(c, sdp_now_ns());       /* memory back if idle (rcvbuf.c) */
	int ret = wait_unlocked(c, fd, what, flags, NULL, 0);
	int r = sdp_lock(held);
	return ret ? ret : r;
}

/* Would a signal that interrupted a sleep have restarted the call
 * (SA_RESTART)? Which signal it was is not known: only if every caught
 * signal's handler says so. (A sleep on a provider's wait descriptor is a
 * poll, which the kernel never restarts.) The signals of a fault are
 * delivered to the faulting instruction, never to a sleeper: their
 * handlers do not count (sanitizers and language runtimes install them
 * without SA_RESTART). */
static bool restart_after_signal(void)
{
	for (int sig = 1; sig < 65; sig++) {
		if (sig == SIGSEGV || sig == SIGBUS || sig == SIGFPE || sig == SIGILL ||
		    sig == SIGTRAP || sig == SIGSYS)
			continue;
		struct sigaction sa;
		if (sigaction(sig, NULL, &sa) < 0)
			continue;
		if (sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
			continue;
		if (!(sa.sa_flags & SA_RESTART))
			return false;
	}
	return true;
}

/* The process's wake descriptor a receiving watcher also sleeps on
 * (wake.c: a local shutdown(SHUT_RD) writes it): its slot, or -1, and
 * its number. */
struct wake_ref {
	int slot;
	int fd;
};

/* After a poll() of the watcher's p[0] (the socket, or the provider's
 * wait descriptor wfd) and p[1] (the wake descriptor, or fd -1): take the
 * tokens, note a FIN/RST. A readable wake descriptor needs nothing: the
 * caller looks again. */
static void polled(struct sdp_conn *c, int fd, int wfd, const struct pollfd *p,
		   const struct wake_ref *wk)
{
	if (p[1].fd >= 0)
		sdp_wake_woke(wk->slot, p[1].revents);
	if (!p[0].revents)
		return;
	if (wfd == fd && atomic_load(&c->rx_shut) && atomic_load(&c->tx_shut)) {
		/* Our own shutdown of both directions shut the kernel
		 * socket's reading too (sdp_shutdown): its end is not the
		 * peer's; only tokens are taken. */
		unsigned char b;
		if (sys_recvfrom(fd, &b, 1, MSG_PEEK | MSG_DONTWAIT) <= 0)
			return;
	}
	sdp_on_wakeup(c, fd);
}

/* The watcher's sleep on a provider's wait descriptor wfd (it includes
 * the TCP socket's FIN and RST): poll, with SO_RCVTIMEO / SO_SNDTIMEO as
 * the deadline. */
static int sleep_on_wait_fd(struct sdp_conn *c, int fd, int wfd, unsigned flags,
			    uint64_t deadline, const struct wake_ref *wk)
{
	for (;;) {
		int64_t ms = remaining_ms(deadline);
		if (ms == 0)
			return -EAGAIN;
		struct pollfd p[2] = { { .fd = wfd, .events = POLLIN },
				       { .fd = wk->fd, .events = POLLIN } };
		/* Other connections' sends the fabric holds: pushed now and
		 * at least every few ms while we sleep (fabric.h). */
		fab_held_push();
		int r = sys_poll(p, wk->fd >= 0 ? 2 : 1,
				 fab_held_ms((int)(ms > INT_MAX ? INT_MAX : ms)));
		if (r < 0 && errno == EINTR) {
			if ((flags & SDP_WAIT_PARTIAL) || !restart_after_signal())
				return -EINTR;
			continue;
		}
		if (r > 0)
			polled(c, fd, wfd, p, wk);
		return 0;
	}
}

/* The watcher's sleep on the TCP socket (only the watcher consumes
 * tokens, so it may sleep unbounded). 0 = woke (re-check), else -errno. */
static int sleep_on_fd(struct sdp_conn *c, int fd, unsigned flags,
		       uint64_t deadline, const struct wake_ref *wk, bool up_wait)
{
	int wfd = fab_wait_fd(&c->ep, fd);
	if (wfd != fd)
		return sleep_on_wait_fd(c, fd, wfd, flags, deadline, wk);
	bool use_rcvtimeo = flags & SDP_WAIT_RCVTIMEO;
	/* A call that moved bytes already (SDP_WAIT_PARTIAL) sleeps in poll()
	 * below: like TCP, any signal ends it with the partial count, SA_RESTART
	 * or not, and poll() is never restarted, so the signal is seen. */
	bool partial = flags & SDP_WAIT_PARTIAL;
	/* A send without SO_SNDTIMEO sleeps the same restartable way (only
	 * tokens arrive on the socket); the socket's SO_RCVTIMEO expiring
	 * then just means "sleep again". */
	bool send_untimed = !use_rcvtimeo && !deadline;
	struct pollfd p[2] = { { .fd = fd, .events = POLLIN },
			       { .fd = wk->fd, .events = POLLIN } };
	nfds_t np = wk->fd >= 0 ? 2 : 1;
	if (up_wait) {
		/* The server has not taken the connection up: its end may
		 * be gone without a word (upwatch.c), so look again after
		 * SDP_UP_LOOK_MS. Signals wait for the end of this short
		 * sleep (blocked, then delivered as it ends), so that which
		 * ones came is known: the call restarts as the kernel
		 * restarts one without a timeout when every one of them has
		 * SA_RESTART, else EINTR. */
		int64_t ms = remaining_ms(deadline);
		if (ms == 0)
			return -EAGAIN;
		if (ms < 0 || ms > SDP_UP_LOOK_MS)
			ms = SDP_UP_LOOK_MS;
		fab_held_push();              /* fabric.h */
		sigset_t all, old, pend;
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		int r = sys_poll(p, np, fab_held_ms((int)ms));
		bool restart = true, caught = false;
		if (sigpending(&pend) == 0)
			for (int sig = 1; sig < 65; sig++) {
				struct sigaction sa;
				if (!sigismember(&pend, sig) || sigismember(&old, sig) ||
				    sigaction(sig, NULL, &sa) < 0 ||
				    sa.sa_handler == SIG_DFL || sa.sa_handler == SIG_IGN)
					continue;
				caught = true;
				restart &= (sa.sa_flags & SA_RESTART) != 0;
			}
		pthread_sigmask(SIG_SETMASK, &old, NULL);   /* delivered here */
		if (r > 0)
			polled(c, fd, fd, p, wk);
		if (caught && (partial || deadline || !restart))
			return -EINTR;
		return 0;
	}
	if (!partial && (fab_held_ms(-1) >= 0 || wk->fd >= 0)) {
		/* Sends the fabric holds for another connection (fabric.h),
		 * or a wake descriptor to watch too (wake.c: threads): not
		 * the kernel's recv - a poll (with held sends, a short one
		 * that pushes them first). A signal: restarted as the kernel
		 * restarts a call without a timeout (SA_RESTART), else
		 * EINTR; SO_RCVTIMEO's end is the deadline (EAGAIN). */
		int64_t ms = remaining_ms(deadline);
		if (ms == 0)
			return -EAGAIN;
		fab_held_push();
		int r = sys_poll(p, np, fab_held_ms(ms > INT_MAX ? INT_MAX : (int)ms));
		if (r < 0 && errno == EINTR)
			return !deadline && restart_after_signal() ? 0 : -EINTR;
		if (r > 0)
			polled(c, fd, fd, p, wk);
		return 0;
	}
	if (!partial && (use_rcvtimeo || send_untimed)) {
		/* Kernel-exact blocking: SO_RCVTIMEO, SA_RESTART, FIN.
		 * Peek: only announced tokens may be consumed (drain). */
		unsigned char b;
		long r = syscall(SYS_recvfrom, fd, &b, 1, MSG_PEEK, NULL, NULL);
		if (r > 0) {
			sdp_on_wakeup(c, fd);
			return 0;
		}
		if (r == 0) {
			/* (our own shutdown of both directions ends the kernel
			 * socket's reading too, sdp_shutdown: not the peer's) */
			if (!atomic_load(&c->rx_shut) || !atomic_load(&c->tx_shut))
				note_wakeup_result(c, 1);
			return 0;
		}
		if (errno == EAGAIN && send_untimed)
			return 0;
		if (errno == EAGAIN || errno == EINTR)
			return -errno;
		note_wakeup_result(c, -errno);
		return 0;
	}
	int64_t ms = remaining_ms(deadline);
	if (ms == 0)
		return -EAGAIN;
	if (ms < 0 || ms > SDP_CHECK_MS)
		ms = SDP_CHECK_MS;                /* then look again */
	fab_held_push();                      /* fabric.h */
	int r = sys_poll(p, np, fab_held_ms((int)ms));
	if (r < 0 && errno == EINTR)
		return -EINTR;
	if (r > 0)
		polled(c, fd, fd, p, wk);
	return 0;
}

bool sdp_watch(struct sdp_conn *c)
{
	uint32_t z = 0;
	return atomic_compare_exchange_strong(&c->watcher, &z, 1);
}

void sdp_unwatch(struct sdp_conn *c)
{
	atomic_store(&c->watcher, 0);
	wake_others(c);
}

/* A waiter while another thread watches the fd: sleep on wake_gen. */
static int sleep_on_futex(struct sdp_conn *c, uint32_t gen, uint64_t deadline,
			  bool partial)
{
	if (partial) {
		/* FUTEX_WAIT is restarted under SA_RESTART, so the signal that
		 * must end this call (it moved bytes) would go unseen: sleep
		 * in 1 ms slices of ppoll(), which never restarts, instead.
		 * (Rare: another thread of ours is the watcher.) */
		uint64_t now = sdp_now_ns(), left = 1000000;
		if (deadline) {
			if (now >= deadline)
				return -EAGAIN;
			if (deadline - now < left)
				left = deadline - now;
		}
		if (atomic_load(&c->wake_gen) != gen)
			return 0;
		struct timespec ts = { 0, (long)left };
		if (syscall(SYS_ppoll, NULL, 0, &ts, NULL, (size_t)8) < 0 && errno == EINTR)
			return -EINTR;
		return 0;
	}
	/* With a deadline (the kernel never restarts such a wait anyway),
	 * never longer than SDP_CHECK_MS: then look again. Without one, the
	 * futex wait must stay unbounded to be restarted under SA_RESTART as
	 * TCP's blocking call is; the watcher wakes us. */
	struct timespec ts, *tp = NULL;
	if (deadline) {
		uint64_t now = sdp_now_ns();
		if (now >= deadline)
			return -EAGAIN;
		uint64_t left = deadline - now;
		if (left > SDP_CHECK_MS * 1000000ull)
			left = SDP_CHECK_MS * 1000000ull;
		ts.tv_sec = (time_t)(left / 1000000000);
		ts.tv_nsec = (long)(left % 1000000000);
		tp = &ts;
	}
	atomic_fetch_add(&c->futex_sleepers, 1);
	long r = syscall(SYS_futex, &c->wake_gen, FUTEX_WAIT, gen, tp, NULL, 0);
	atomic_fetch_sub(&c->futex_sleepers, 1);
	if (r < 0 && errno == EINTR)
		return -EINTR;
	if (r < 0 && errno == ETIMEDOUT)
		return sdp_now_ns() >= deadline ? -EAGAIN : 0;
	return 0;
}

/*
 * The fast sleep of a blocked send/recv in a process with threads (a
 * server with a thread per connection): before the watcher's sleep on the
 * TCP socket, sleep up to SDP_FAST_SLEEP_MS on the futex word the fabric
 * shares with the peer (FAB_WAIT_F). The peer's kick is then one
 * FUTEX_WAKE, where a token costs it a TCP send and us a poll and a
 * receive. The word is not watched by the kernel for the peer's death, so
 * the sleep is bounded: a peer that died (its FIN on the socket) is seen
 * at most SDP_FAST_SLEEP_MS late, and an idle connection's thread goes on
 * to the socket sleep, which costs nothing while idle. Signals: a futex
 * wait with a timeout is never restarted by the kernel, so it restarts
 * as the watcher's poll does in a threaded process (restart_after_signal);
 * with a deadline or bytes moved, EINTR as TCP's. Local wake-ups
 * (shutdown(SHUT_RD), a fallback, another waiter's drain) reach it through
 * wake_others. 1: the condition came true, 0: go on to the socket sleep,
 * else -errno.
 */
#define SDP_FAST_SLEEP_MS 200

static bool fast_ok(struct sdp_conn *c)
{
	struct fab_ep *ep = &c->ep;
	return ep->ops->fwake_word && sdp_wake_threaded() &&
	       (!ep->ops->peer_up || ep->ops->peer_up(ep));
}

static int fast_sleep(struct sdp_conn *c, int fd, unsigned what, unsigned flags,
		      const struct wait_for *wf, uint64_t deadline)
{
	struct fab_ep *ep = &c->ep;
	_Atomic uint32_t *w = ep->ops->fwake_word(ep);
	uint64_t end = sdp_now_ns() + SDP_FAST_SLEEP_MS * 1000000ull;
	if (deadline && deadline < end)
		end = deadline;
	int ret;
	atomic_fetch_add(&c->fast_sleepers, 1);
	for (;;) {
		if (atomic_load_explicit(&c->state, memory_order_relaxed) == SDP_ST_CLOSED) {
			ret = -EBADF;         /* closed by another thread */
			break;
		}
		/* The word before the arm and the look: a kick or local wake
		 * after the look changes it, and the wait returns at once. */
		uint32_t gen = atomic_load(w);
		ep->ops->arm(ep, FAB_WAIT_F(what));
		if (cond_met(c, what, wf)) {
			ret = 1;
			break;
		}
		sdp_kick_owed(c, fd);
		uint64_t now = sdp_now_ns();
		if (now >= end) {
			ret = deadline && now >= deadline ? -EAGAIN : 0;
			break;
		}
		uint64_t left = end - now;
		/* Other connections' sends the fabric holds (fabric.h). */
		fab_held_push();
		int cap = fab_held_ms(-1);
		if (cap >= 0 && left > (uint64_t)cap * 1000000ull)
			left = (uint64_t)cap * 1000000ull;
		struct timespec ts = { (time_t)(left / 1000000000), (long)(left % 1000000000) };
		__atomic_fetch_add(&c->st.futex_sleeps, 1, __ATOMIC_RELAXED);   /* unlocked */
		long r = syscall(SYS_futex, w, FUTEX_WAIT, gen, &ts, NULL, 0);
		if (r < 0 && errno == EINTR &&
		    ((flags & SDP_WAIT_PARTIAL) || deadline || !restart_after_signal())) {
			ret = -EINTR;
			break;
		}
	}
	atomic_fetch_sub(&c->fast_sleepers, 1);
	return ret;
}

/* Longest spin while the peer copies for us: a larger copy sleeps once,
 * and the wake-up is then small beside the copy. */
#define SDP_BUSY_SPIN_US 2000

/*
 * Is the peer, on its CPU right now, doing the copy that ends this wait?
 * It reads one of our SrcAvails (it marks `reading` before the read and
 * clears it after publishing rd_done), or it took our SinkAvail and writes
 * into it (its RdmaWrCompl follows the write). The answer then comes within
 * one copy's time, and sleeping would add a wake-up to every transfer.
 */
static bool peer_copying(struct sdp_conn *c, unsigned what)
{
	if ((what & FAB_WAIT_ZC) &&
	    atomic_load_explicit(&sdp_zc_peer(c)->reading, memory_order_relaxed))
		return true;
	return (what & FAB_WAIT_RX) &&
	       atomic_load_explicit(&sdp_zc_me(c)->sink_state, memory_order_relaxed) ==
	       SDP_SINK_TAKEN;
}

/* Go on spinning past the budget while the peer copies for us. */
struct copy_watch {
	struct sdp_conn *c;
	unsigned what;
};

static bool still_copying(void *arg)
{
	struct copy_watch *w = arg;
	return peer_copying(w->c, w->what);
}

/* The spin before a sleep: true if the condition came true. With
 * until_shared, give up as soon as a yield shows that another task wants
 * our CPU. */
static bool spin_phase(struct sdp_conn *c, unsigned what, bool until_shared,
		       const struct wait_for *wf)
{
	/* A peer that has not set up its side yet (a server that has not
	 * accepted) answers in an accept's time, not a copy's: sleep at once
	 * (connection set-up spun 40 us per connection for nothing). */
	if (c->ep.ops->peer_up && !c->ep.ops->peer_up(&c->ep))
		return false;
	uint32_t max = atomic_load_explicit(&c->spin_us, memory_order_relaxed);
	uint32_t spin = sdp_spin_budget(&c->spin_cur, &c->spin_waits, max);
	if ((what & FAB_WAIT_ZC) && spin && c->zc_spin_us > spin)
		spin = c->zc_spin_us < 1000 ? c->zc_spin_us : 1000;
	/* A peer busy copying for us is not a slow peer: spin through the
	 * copy whatever the adaptive budget says. Otherwise, once a few
	 * waits miss (the peer was asleep), the budget falls to 0, every
	 * send then sleeps through the read it waits for, the receiver in
	 * turn misses the next SrcAvail, and both stay in that state:
	 * 1 MiB streams ran at 110-120 instead of ~140 Gbit/s. */
	bool busy = max && peer_copying(c, what);
	if (!spin && !busy)
		return false;
	struct sdp_spin sp;
	struct copy_watch cw = { c, what };
	sdp_spin_start(&sp, spin, 0, 64, 1,
		       SDP_SPIN_FOLLOW | (until_shared ? SDP_SPIN_STOP_SHARED : 0));
	sp.extend = still_copying;
	sp.arg = &cw;
	sp.ext_end = sp.start + SDP_BUSY_SPIN_US * 1000ull;
	for (;;) {
		if (cond_met(c, what, wf)) {
			sdp_spin_result(&c->spin_cur, max, true, sp.contended);
			return true;
		}
		if (sdp_spin_step(&sp) != SDP_SPIN_OVER)
			continue;
		if (sp.shared && until_shared) {
			/* Our CPU is wanted: the caller's alternative costs
			 * no more than waiting for the peer. */
			sdp_spin_result(&c->spin_cur, max, false, true);
			return false;
		}
		/* The copy may have ended since the check. */
		bool met = cond_met(c, what, wf);
		sdp_spin_result(&c->spin_cur, max, met, sp.contended);
		return met;
	}
}

/* Spin only, as a wait would before sleeping (the caller has something to
 * do before it sleeps): 1 if the condition came true, 0 if not, or -errno
 * from re-taking the lock. The lock is not held while spinning. The spin
 * ends early when the CPU is shared (the caller's alternative then costs
 * no more than waiting for the peer, which needs our CPU to answer). */
int sdp_spin(struct sdp_conn *c, unsigned what, pthread_mutex_t *held)
{
	if (sdp_spin_cpu_shared())
		return 0;
	sdp_unlock(held);
	bool met = spin_phase(c, what, true, NULL);
	int r = sdp_lock(held);
	return r ? r : met;
}

/* deadline: 0, or the caller's own (ns; with wf), instead of the
 * socket's timeouts. */
/*
 * A wait for a zero-copy hand-off to finish, which its caller cannot leave
 * and must not let another thread or process step into (it keeps its lock
 * throughout): the RdmaWrCompl of a SinkAvail the source took, the answer
 * to a SrcAvailCancel. The peer's part takes one copy's time, so spin as a
 * wait does (through the peer's copy), then sleep on the connection's
 * wake-up: a peer that is stopped (SIGSTOP, a debugger) or slow costs no
 * CPU. Signals do not end it. 0 when met(c, arg) holds or the connection
 * ended (reset, the peer gone: the caller looks which), -ETIMEDOUT at
 * deadline (ns).
 */
int sdp_wait_until(struct sdp_conn *c, int fd, unsigned what,
		   bool (*met)(struct sdp_conn *c, void *arg), void *arg,
		   uint64_t deadline)
{
	struct wait_for wf = { met, arg };
	for (;;) {
		int r = wait_unlocked(c, fd, what, 0, &wf, deadline);
		if (r == 0)
			return 0;
		if (r == -EAGAIN || sdp_now_ns() >= deadline)
			return -ETIMEDOUT;
		/* -EINTR: not the application's wait; go on */
	}
}

static int wait_unlocked(struct sdp_conn *c, int fd, unsigned what, unsigned flags,
			 const struct wait_for *wf, uint64_t deadline)
{
	bool use_rcvtimeo = flags & SDP_WAIT_RCVTIMEO;
	struct fab_ep *ep = &c->ep;
	if (spin_phase(c, what, false, wf)) {
		sdp_reset_tell(c, fd);
		return 0;
	}

	/* Deadline, unless the caller has its own: SO_SNDTIMEO for sends
	 * (tracked), SO_RCVTIMEO for receives (the kernel applies it to the
	 * watcher; futex sleepers read it). */
	if (!deadline) {
		int64_t to = atomic_load(use_rcvtimeo ? &c->rcvtimeo_us : &c->sndtimeo_us);
		if (to > 0)
			deadline = sdp_now_ns() + (uint64_t)to * 1000;
	}
	int ret = 0;
	atomic_fetch_add(&c->nwaiters, 1);
	if (fast_ok(c)) {
		ret = fast_sleep(c, fd, what, flags, wf, deadline);
		if (ret) {
			ret = ret < 0 ? ret : 0;
			goto out;
		}
	}
	for (;;) {
		/* Closed by another thread while we waited (sdp_conn_retire):
		 * the descriptor number is no longer ours to sleep on. */
		if (atomic_load_explicit(&c->state, memory_order_relaxed) == SDP_ST_CLOSED) {
			ret = -EBADF;
			break;
		}
		/* A server that has not taken the connection up may be gone
		 * without a word (upwatch.c): look, and sleep bounded. */
		bool up_wait = sdp_up_check(c, fd);
		/* Arm, take the watch, then check (poll.c says why this order:
		 * the check must follow the moment we became the watcher). */
		uint32_t gen = atomic_load(&c->wake_gen);
		ep->ops->arm(ep, what);
		bool watching = sdp_watch(c);
		/* A receiving watcher also watches the process's wake
		 * descriptor, taken before the look (wake.c): a local
		 * shutdown(SHUT_RD) from now on wakes it. (Threads on the
		 * futex are woken by the shutdown's wake_others.) */
		struct wake_ref wk = { -1, -1 };
		if (watching && (what & FAB_WAIT_RX) && !wf)
			wk.slot = sdp_wake_hold(&wk.fd, NULL);
		if (cond_met(c, what, wf)) {
			if (watching)
				sdp_unwatch(c);
			sdp_wake_drop(wk.slot);
			break;
		}
		/* The peer may sleep too, for something we gave it. */
		sdp_kick_owed(c, fd);
		if (watching) {
			ret = sleep_on_fd(c, fd, flags, deadline, &wk, up_wait);
			sdp_unwatch(c);       /* let another waiter watch */
			sdp_wake_drop(wk.slot);
		} else {
			ret = sleep_on_futex(c, gen, deadline, flags & SDP_WAIT_PARTIAL);
		}
		if (ret)
			break;
	}
out:
	/* Another thread may still wait for the same event: only the last
	 * waiter withdraws the request (a stale one costs one token). */
	if (atomic_fetch_sub(&c->nwaiters, 1) == 1)
		ep->ops->disarm(ep, what | FAB_WAIT_F(what));
	sdp_reset_tell(c, fd);
	return ret;
}

/*
 * Before we sleep: a wake-up the peer may be owed (the provider's
 * kick_owed). Not to a peer that has sent its FIN or closed: it waits for
 * nothing of ours that needs it, and after its socket is gone a token
 * would only make its kernel answer with a reset (a close that lingers
 * for asynchronous advertisements, az.h).
 */
void sdp_kick_owed(struct sdp_conn *c, int fd)
{
	if (!sdp_marked(c, FAB_M_FIN | FAB_M_CLOSED) &&
	    c->ep.ops->kick_owed(&c->ep, fd) == 1)
		__atomic_fetch_add(&c->st.tokens_owed, 1, __ATOMIC_RELAXED); /* unlocked */
}

/*
 * A reset we see is one the peer must see too. Usually it knows already
 * (it reset, or died), but when the reset comes from an inconsistency - a
 * mark a third process wrote into the region, a violation we found - the
 * peer may be asleep waiting for us and would never learn it. Publish our
 * own reset mark and kick it, once.
 */
void sdp_reset_tell(struct sdp_conn *c, int fd)
{
	if (!sdp_is_reset(c) || atomic_load_explicit(&c->reset_told, memory_order_relaxed) ||
	    atomic_exchange(&c->reset_told, 1))
		return;
	sdp_mark(c, FAB_M_ABORT);
	c->ep.ops->kick(&c->ep, fd, FAB_WAIT_RX | FAB_WAIT_CREDIT | FAB_WAIT_ZC);
}

/* The peer's control block failed its provider's peer_sane: say why, abort. */
void sdp_abort_insane(struct sdp_conn *c, const char *why)
{
	if (sdp_is_reset(c))
		return;
	sdp_log(0, "peer control block makes no sense (%s): connection aborted",
		why ? why : "?");
	sdp_conn_abort(c, ECONNRESET);
}

void sdp_check_peer(struct sdp_conn *c)
{
	const char *why;
	if (!sdp_is_reset(c) && !c->ep.ops->peer_sane(&c->ep, &why))
		sdp_abort_insane(c, why);
}

void sdp_conn_abort(struct sdp_conn *c, int err)
{
	/* A reset is reported once by the RESET state (sdp_take_reset), as
	 * TCP reports ECONNRESET once; only another error needs so_error. */
	if (err != ECONNRESET)
		atomic_store(&c->so_error, err);
	atomic_store(&c->state, SDP_ST_RESET);
	sdp_mark(c, FAB_M_ABORT);
}
