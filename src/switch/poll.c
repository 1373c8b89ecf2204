/*
 * poll.c - poll, ppoll, select, pselect (and their FORTIFY variants) over
 * sets that mix SDP sockets with anything else.
 *
 * An SDP socket's readiness comes from shared memory (sdp_events). To sleep,
 * the switch arms the wanted wake-ups and polls the real TCP fd for POLLIN:
 * the peer's kick token, or the kernel's FIN/RST when the peer process
 * dies, wakes it. Other fds are polled as they are. After waking, tokens are
 * drained and readiness recomputed; spurious wake-ups loop until the
 * deadline. Before arming, the sockets are checked for spin_us. In a
 * process with threads the sleep also watches the wake descriptor (sdp/
 * wake.c), which a shutdown(SHUT_RD) of a member by another thread writes.
 */
#include <errno.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "switch/switch.h"
#include "sdp/spin.h"
#include "sdp/sys.h"
#include "sdp/wake.h"

struct sdp_conn *sdp_fd_conn(int fd);

#define ALWAYS (POLLERR | POLLHUP | POLLNVAL)

static int64_t ts_to_ns(const struct timespec *t)
{
	return t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;
}

/* Readiness of SDP member i into its revents. A member that falls back
 * to TCP stops being watched (watch may be NULL). */
static unsigned sdp_look(struct pollfd *fds, nfds_t i, struct sdp_conn **cs, bool *watch)
{
	if (sdp_fallback_pending(cs[i])) {
		if (watch && watch[i]) {
			sdp_unwatch(cs[i]);
			watch[i] = false;
		}
		fd_fallback(fds[i].fd, cs[i]);
		conn_leave(cs[i]);
		cs[i] = NULL;                 /* polled by the kernel from now on */
		return 0;
	}
	zc_ack_cancel(cs[i], fds[i].fd);
	unsigned ev = sdp_events(cs[i]) & ((unsigned)fds[i].events | ALWAYS);
	fds[i].revents = (short)ev;
	return ev;
}

/* Readiness of the SDP members; returns how many are ready. Like the
 * kernel's, a poll that reports a member ready also reports every member
 * whose bytes arrived before: a member checked early in the scan may have
 * become ready after its check but before one found ready later. When a
 * member found ready became so that recently (the sender's stamp,
 * fab_clock), the members checked before it are looked at once more. */
static int sdp_scan(struct pollfd *fds, nfds_t n, struct sdp_conn **cs, bool *watch)
{
	int ready = 0;
	uint64_t now = fab_clock(), newest = 0;
	nfds_t last = 0;
	for (nfds_t i = 0; i < n; i++) {
		if (!cs[i])
			continue;
		unsigned ev = sdp_look(fds, i, cs, watch);
		if (!ev)
			continue;
		ready++;
		last = i;
		if (ev & POLLIN) {
			uint64_t t = sdp_ready_since(cs[i]);
			newest = t > newest ? t : newest;
		}
	}
	if (ready && newest + FAB_CLOCK_SLACK > now)
		for (nfds_t i = 0; i < last; i++)
			if (cs[i] && !fds[i].revents)
				ready += sdp_look(fds, i, cs, watch) != 0;
	return ready;
}

static void unwatch(struct sdp_conn **cs, bool *watch, nfds_t n)
{
	for (nfds_t i = 0; i < n; i++)
		if (watch[i]) {
			sdp_unwatch(cs[i]);
			watch[i] = false;
		}
}

/* Poll only the non-SDP members with the given timeout and merge. */
static int merge_others(struct pollfd *fds, nfds_t n, struct sdp_conn **cs,
			struct pollfd *tmp, const struct timespec *ts,
			const sigset_t *mask)
{
	for (nfds_t i = 0; i < n; i++) {
		tmp[i] = fds[i];
		if (cs[i])
			tmp[i].fd = -1;
	}
	int r = real_ppoll(tmp, n, ts, mask);
	if (r < 0)
		return r;
	int ready = 0;
	for (nfds_t i = 0; i < n; i++) {
		if (!cs[i])
			fds[i].revents = tmp[i].revents;
		ready += fds[i].revents != 0;
	}
	return ready;
}

/* A set without SDP members while a fabric holds sends (fabric.h): the
 * kernel's wait in slices of a few ms, each after a push of those sends,
 * until something is ready or the timeout ends. poll_ms: as poll(). */
static int held_ppoll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask,
		      const int *poll_ms)
{
	uint64_t deadline = timeout_ns >= 0 ? sdp_now_ns() + (uint64_t)timeout_ns : 0;
	for (;;) {
		fab_held_push();
		struct timespec ts;
		const struct timespec *tp = sdp_sleep_ts(deadline, false, &ts);
		int r = poll_ms && !mask ?
			real_poll(fds, n, (int)(ts.tv_sec * 1000 + ts.tv_nsec / 1000000)) :
			real_ppoll(fds, n, tp, mask);
		if (r != 0 || timeout_ns == 0 || (deadline && sdp_now_ns() >= deadline))
			return r;
	}
}

/* poll_ms: called as poll(): a set without SDP members goes to the kernel
 * as that very call (a seccomp filter may allow poll and not ppoll). */
static int sdp_ppoll(struct pollfd *fds, nfds_t n, int64_t timeout_ns, const sigset_t *mask,
		     const int *poll_ms)
{
	if (atomic_load_explicit(&sdp_passthru, memory_order_relaxed)) {
		/* Under seccomp: not even an allocation for a large set. */
		if (poll_ms)
			return real_poll(fds, n, *poll_ms);
		struct timespec ts;
		ts.tv_sec = timeout_ns / 1000000000;
		ts.tv_nsec = timeout_ns % 1000000000;
		return real_ppoll(fds, n, timeout_ns < 0 ? NULL : &ts, mask);
	}
	struct sdp_conn *cs_stack[64], **cs = cs_stack;
	struct pollfd tmp_stack[65], *tmp = tmp_stack;   /* + the wake descriptor */
	bool watch_stack[64], *watch = watch_stack;
	int nsdp = 0;
	if (n > 64) {
		cs = calloc(n, sizeof *cs);
		tmp = calloc(n + 1, sizeof *tmp);
		watch = calloc(n, sizeof *watch);
		if (!cs || !tmp || !watch) {
			free(cs);
			free(tmp);
			free(watch);
			errno = ENOMEM;
			return -1;
		}
	}
	uint32_t spin = 0;
	for (nfds_t i = 0; i < n; i++) {
		struct sdp_conn *c = fds[i].fd >= 0 ? sdp_fd_conn(fds[i].fd) : NULL;
		if (c && !conn_enter(c, fds[i].fd))
			c = NULL;             /* closed meanwhile: the kernel's */
		if (c && atomic_load(&c->state) == SDP_ST_CONNECTING) {
			conn_leave(c);
			c = NULL;             /* the kernel tells when connect ends */
		}
		cs[i] = c;
		if (c) {
			nsdp++;
			uint32_t s = atomic_load(&c->spin_us);
			spin = s > spin ? s : spin;
		}
	}
	int r;
	struct timespec zero = { 0, 0 };
	if (!nsdp && timeout_ns != 0 && fab_held_ms(-1) >= 0) {
		r = held_ppoll(fds, n, timeout_ns, mask, poll_ms);
		goto out;
	}
	if (!nsdp && poll_ms) {
		r = real_poll(fds, n, *poll_ms);
		goto out;
	}
	if (!nsdp) {
		struct timespec ts, *tp = NULL;
		if (timeout_ns >= 0) {
			ts.tv_sec = timeout_ns / 1000000000;
			ts.tv_nsec = timeout_ns % 1000000000;
			tp = &ts;
		}
		r = real_ppoll(fds, n, tp, mask);
		goto out;
	}
	uint64_t start = sdp_now_ns();
	uint64_t deadline = timeout_ns >= 0 ? start + (uint64_t)timeout_ns : 0;
	/* Spin on the SDP members (adaptive budget per thread, sdp/spin.c). */
	static __thread _Atomic uint32_t tcur = 1000000, twaits;
	uint32_t max = spin;
	spin = sdp_spin_budget(&tcur, &twaits, max);
	if (timeout_ns != 0 && spin) {
		struct sdp_spin sp;
		sdp_spin_start(&sp, spin, deadline, 64, 1, 0);
		for (;;) {
			if (sdp_scan(fds, n, cs, NULL)) {
				/* Only a spin that waited and then found readiness
				 * paid off. Found at the first look, nothing was
				 * spun: the budget stays as it is (restoring it made
				 * a loop alternating "ready at once" and "nothing
				 * yet" spin the full budget every other call). */
				if (sp.n)
					sdp_spin_result(&tcur, max, true, sp.contended);
				r = merge_others(fds, n, cs, tmp, &zero, mask);
				goto out;
			}
			/* The other descriptors count too: ask the kernel
			 * about them, without waiting - at the first look (one
			 * ready at once ends the call before any spin, and
			 * counts as no spin), then every 256 steps. */
			if ((nfds_t)nsdp < n && !(sp.n & 255)) {
				r = merge_others(fds, n, cs, tmp, &zero, mask);
				if (r != 0) {
					if (sp.n)
						sdp_spin_result(&tcur, max, r > 0, sp.contended);
					goto out;
				}
			}
			if (sdp_spin_step(&sp) == SDP_SPIN_OVER)
				break;
		}
		sdp_spin_result(&tcur, max, false, sp.contended);
	}
	for (;;) {
		/* Arm, then become the watcher, then look: a kick after the
		 * arm sends a token only the watcher drains, and a previous
		 * watcher that drained one (clearing our arm bit) left before
		 * we look. Looking before taking the watch could miss that
		 * wake-up and then sleep for good. */
		bool shared = false;
		/* The wake descriptor, taken before the look (sdp/wake.c). */
		int wk_fd = -1;
		int wk = sdp_wake_hold(&wk_fd, NULL);
		for (nfds_t i = 0; i < n; i++) {
			watch[i] = false;
			if (!cs[i])
				continue;
			sdp_arm(cs[i], fds[i].fd, (unsigned)fds[i].events);
			watch[i] = sdp_watch(cs[i]);
			if (!watch[i])
				shared = true;    /* someone else consumes its tokens */
		}
		if (sdp_scan(fds, n, cs, watch) || timeout_ns == 0) {
			unwatch(cs, watch, n);
			sdp_wake_drop(wk);
			r = merge_others(fds, n, cs, tmp, &zero, mask);
			goto out;
		}
		for (nfds_t i = 0; i < n; i++) {
			tmp[i] = fds[i];
			if (cs[i]) {
				/* the provider's wait object, or the socket */
				tmp[i].fd = fab_wait_fd(&cs[i]->ep, fds[i].fd);
				tmp[i].events = POLLIN;
			}
		}
		struct timespec ts;
		const struct timespec *tp = sdp_sleep_ts(deadline, shared, &ts);
		tmp[n] = (struct pollfd){ .fd = wk_fd, .events = POLLIN };
		fab_held_push();                      /* fabric.h */
		r = real_ppoll(tmp, n + (wk >= 0), tp, mask);
		if (wk >= 0 && r > 0) {
			sdp_wake_woke(wk, tmp[n].revents);
			r -= tmp[n].revents != 0;     /* ours, not the caller's */
		}
		sdp_wake_drop(wk);
		sdp_idle_look_all(cs, n);             /* rcvbuf.c */
		for (nfds_t i = 0; i < n; i++)
			if (watch[i] && r > 0 && tmp[i].revents)
				sdp_on_wakeup(cs[i], fds[i].fd);
		unwatch(cs, watch, n);
		if (r < 0)
			goto out;
		int ready = 0;
		for (nfds_t i = 0; i < n; i++) {
			if (cs[i])
				continue;
			fds[i].revents = tmp[i].revents;
			ready += tmp[i].revents != 0;
		}
		ready += sdp_scan(fds, n, cs, NULL);
		if (ready || (deadline && sdp_now_ns() >= deadline)) {
			r = ready;
			goto out;
		}
		for (nfds_t i = 0; i < n; i++)
			fds[i].revents = 0;
	}
out:
	for (nfds_t i = 0; i < n; i++)
		if (cs[i])
			conn_leave(cs[i]);    /* keeps errno */
	if (cs != cs_stack) {
		free(cs);
		free(tmp);
		free(watch);
	}
	return r;
}

EXPORT int poll(struct pollfd *fds, nfds_t n, int timeout)
{
	SDP_INIT();
	return sdp_ppoll(fds, n, timeout < 0 ? -1 : (int64_t)timeout * 1000000, NULL, &timeout);
}

EXPORT int __poll_chk(struct pollfd *fds, nfds_t n, int timeout, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		__builtin_trap();
	return poll(fds, n, timeout);
}

EXPORT int ppoll(struct pollfd *fds, nfds_t n, const struct timespec *t,
		 const sigset_t *mask)
{
	SDP_INIT();
	return sdp_ppoll(fds, n, ts_to_ns(t), mask, NULL);
}

EXPORT int __ppoll_chk(struct pollfd *fds, nfds_t n, const struct timespec *t,
		       const sigset_t *mask, size_t fdslen)
{
	if (fdslen / sizeof *fds < n)
		__builtin_trap();
	return ppoll(fds, n, t, mask);
}

/* select/pselect: when an SDP fd is in a set, translate to poll. */
static int select_common(int nfds, fd_set *r, fd_set *w, fd_set *e,
			 int64_t timeout_ns, const sigset_t *mask, bool *handled,
			 uint64_t *start)
{
	*handled = false;
	if (nfds < 0 || nfds > FD_SETSIZE)
		return 0;
	int nsdp = 0, cnt = 0;
	for (int fd = 0; fd < nfds; fd++) {
		bool in = (r && FD_ISSET(fd, r)) || (w && FD_ISSET(fd, w)) ||
			  (e && FD_ISSET(fd, e));
		if (!in)
			continue;
		cnt++;
		if (fd_conn(fd))
			nsdp++;
	}
	if (!nsdp && (timeout_ns == 0 || fab_held_ms(-1) < 0))
		return 0;                     /* (held sends: sdp_ppoll's slices) */
	*handled = true;
	*start = sdp_now_ns();
	struct pollfd *p = calloc((size_t)cnt, sizeof *p);
	if (!p) {
		errno = ENOMEM;
		return -1;
	}
	int k = 0;
	for (int fd = 0; fd < nfds; fd++) {
		short ev = 0;
		if (r && FD_ISSET(fd, r)) ev |= POLLIN;
		if (w && FD_ISSET(fd, w)) ev |= POLLOUT;
		if (e && FD_ISSET(fd, e)) ev |= POLLPRI;
		if (ev) {
			p[k].fd = fd;
			p[k].events = ev;
			k++;
		}
	}
	int res = sdp_ppoll(p, (nfds_t)k, timeout_ns, mask, NULL);
	if (res < 0) {
		free(p);
		return -1;
	}
	for (int i = 0; i < k; i++)
		if (p[i].revents & POLLNVAL) {
			free(p);
			errno = EBADF;
			return -1;
		}
	if (r) FD_ZERO(r);
	if (w) FD_ZERO(w);
	if (e) FD_ZERO(e);
	int n = 0;
	for (int i = 0; i < k; i++) {
		short rv = p[i].revents;
		if (r && (p[i].events & POLLIN) && (rv & (POLLIN | POLLHUP | POLLERR))) {
			FD_SET(p[i].fd, r);
			n++;
		}
		if (w && (p[i].events & POLLOUT) && (rv & (POLLOUT | POLLERR))) {
			FD_SET(p[i].fd, w);
			n++;
		}
		if (e && (p[i].events & POLLPRI) && (rv & POLLPRI)) {
			FD_SET(p[i].fd, e);
			n++;
		}
	}
	free(p);
	return n;
}

EXPORT int select(int nfds, fd_set *r, fd_set *w, fd_set *e, struct timeval *tv)
{
	SDP_INIT();
	bool handled;
	int64_t to = tv ? (int64_t)tv->tv_sec * 1000000000 + tv->tv_usec * 1000 : -1;
	uint64_t start;
	int res = select_common(nfds, r, w, e, to, NULL, &handled, &start);
	if (!handled)
		return real_select(nfds, r, w, e, tv);
	if (tv && res >= 0) {             /* Linux updates the timeout */
		int64_t left = to - (int64_t)(sdp_now_ns() - start);
		if (left < 0)
			left = 0;
		tv->tv_sec = left / 1000000000;
		tv->tv_usec = (left % 1000000000) / 1000;
	}
	return res;
}

EXPORT int pselect(int nfds, fd_set *r, fd_set *w, fd_set *e,
		   const struct timespec *t, const sigset_t *mask)
{
	SDP_INIT();
	bool handled;
	uint64_t start;
	int res = select_common(nfds, r, w, e, ts_to_ns(t), mask, &handled, &start);
	if (!handled)
		return real_pselect(nfds, r, w, e, t, mask);
	return res;
}
