/*
 * epoll_wait.c - epoll over sets that mix SDP sockets with other fds: the
 * wait (the sets themselves: epoll.c).
 *
 * epoll_wait reports the shadow members that are ready (level: while
 * ready; edge: once per new arrival or credit return; one-shot: once until
 * EPOLL_CTL_MOD), drains the tokens of tagged kernel events and passes all
 * other events through. It scans, spins, arms the members, and sleeps in
 * the kernel's wait.
 *
 * Order: the kernel's ready list reports members in the order they became
 * ready, and servers depend on it (redis serves blocked clients, WATCH and
 * UNSUBSCRIBE in the order the commands arrived). So scan() collects every
 * ready member with the time it became ready - the sender's stamp of the
 * moment its receive queue went from empty to non-empty (fab_clock, shared
 * by all processes), or the first scan that saw it ready - and reports the
 * oldest first. A level-triggered member that was reported and is still
 * ready counts from that report, as the kernel re-queues it at the tail.
 * A member checked early in a scan may have become ready after its check
 * but before another one that was found ready later in the same scan;
 * when the newest report is that recent, the members checked before it
 * are looked at again (see recheck in scan()).
 */
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "switch/switch.h"
#include "sdp/spin.h"
#include "sdp/sys.h"
#include "sdp/wake.h"
#include "switch/epoll_int.h"

struct sdp_conn *sdp_fd_conn(int fd);

/* The member is plain TCP again: the kernel set gets the application's
 * registration. A peer that died leaving bytes unread had its socket
 * replaced by one that delivers them (sdp/fallback.c, dup3 onto the
 * number): the kernel dropped the old file's registration with it. */
static void ent_plain(struct ep_shadow *s, struct ep_ent *e)
{
	struct epoll_event kev = { .events = e->events, .data = e->data };
	int saved = errno;
	if (real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &kev) < 0 && errno == ENOENT)
		real_epoll_ctl(s->epfd, EPOLL_CTL_ADD, e->fd, &kev);
	errno = saved;
}

/* Readiness of one member, as epoll would report it (0 = nothing). For a
 * member to report, *k gets the edge-triggered state that ent_report
 * keeps if it is reported (a member left out for lack of room in the
 * caller's array keeps its edge). */
static uint32_t ent_events(struct ep_shadow *s, struct ep_ent *e, struct ep_cand *k)
{
	if (e->disabled)
		return 0;
	struct sdp_conn *c = e->c;
	if (sdp_fallback_pending(c)) {
		/* Left SDP: give the kernel the application's registration. */
		ep_wait_fd_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, c);
		if (fd_kind(e->fd) == FDK_SDP)
			fd_fallback(e->fd, c);
		ent_plain(s, e);
		e->c = NULL;
		s->reap = true;
		return 0;
	}
	if (e->connecting) {
		if (atomic_load(&c->state) == SDP_ST_CONNECTING) {
			if (!sdp_fd_conn(e->fd)) {
				/* Connect failed: the fd is plain TCP now. */
				ent_plain(s, e);
				e->c = NULL;
				s->reap = true;
				return EPOLLOUT | EPOLLERR | EPOLLHUP;
			}
			if (atomic_load(&c->state) == SDP_ST_CONNECTING)
				return 0;
		}
		struct epoll_event kev = { .events = EPOLLIN,
					   .data.u64 = TAG | (uint32_t)e->fd };
		real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &kev);
		e->connecting = false;
	}
	zc_ack_cancel(c, e->fd);
	uint32_t want = e->events | EPOLLERR | EPOLLHUP;
	uint32_t ev = sdp_events(c) & want;
	if (e->events & EPOLLET) {
		uint64_t a = ep_arrived(c), ak = ep_acked(c);
		uint32_t out = 0;
		if ((ev & EPOLLIN) && (a != e->last_arrived || !(e->last_ev & EPOLLIN)))
			out |= EPOLLIN;
		if ((ev & EPOLLOUT) && (ak != e->last_acked || !(e->last_ev & EPOLLOUT)))
			out |= EPOLLOUT;
		out |= ev & ~e->last_ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
		/* An edge reports every event ready now, as the kernel's
		 * wake-up of an edge-triggered member does (new data on a
		 * writable socket: EPOLLIN | EPOLLOUT). */
		if (out)
			out = ev;
		if (out) {
			k->arrived = a;
			k->acked = ak;
			k->cur_ev = ev;
		} else {
			e->last_arrived = a;
			e->last_acked = ak;
			e->last_ev = ev;
		}
		ev = out;
	}
	return ev;
}

/* The member is reported: one-shot disarms, the edge is consumed, and a
 * level-triggered one still ready queues up behind what is ready now. */
static void ent_report(struct ep_ent *e, const struct ep_cand *k, uint64_t now)
{
	if (e->events & EPOLLONESHOT)
		e->disabled = true;
	if (e->events & EPOLLET) {
		e->last_arrived = k->arrived;
		e->last_acked = k->acked;
		e->last_ev = k->cur_ev;
	}
	e->rep = now;
	e->seen = 0;
}

/* Look at member i; a ready one becomes candidate *nc, keyed by since
 * when it has been ready (fab_clock): the sender's stamp of its data, or
 * the first scan that found it ready, and not before its last report or
 * ADD/MOD. Returns the stamp of its data (0: none; 1: ready without). */
static uint64_t look(struct ep_shadow *s, int i, uint64_t now, int *nc)
{
	struct ep_ent *e = &s->v[i];
	if (!e->c || e->disabled || e->parked)
		return 0;
	e->looked = true;
	if (!e->q1 || s->qs[e->q1 - 1].dead)
		e->tok_ok = !e->connecting && fab_wait_fd(&e->c->ep, e->fd) == e->fd;
	struct ep_cand *k = &s->cand[*nc];
	uint32_t ev = ent_events(s, e, k);
	if (!ev && ep_by_news(s, e)) {
		/* Nothing yet: arm it now, not at the next sleep, so that
		 * its next data brings news even while we stay awake - a
		 * partial scan sees a member only through news, and one that
		 * got data unseen while another got news later would be
		 * served after it (order, ARCHITECTURE 7). Then look again:
		 * the data may have come before the arm. */
		ep_arm(s, e, false);
		e->looked = false;
		ev = ent_events(s, e, k);
	}
	if (!ev) {
		if (e->seen)
			e->seen = 0;
		return 0;
	}
	uint64_t stamp = e->c && (ev & EPOLLIN) ? sdp_ready_since(e->c) : 0;
	uint64_t key = stamp;
	if (!key) {
		if (!e->seen)
			e->seen = now;
		key = e->seen;
	}
	k->i = i;
	k->ev = ev;
	k->key = key > e->rep ? key : e->rep;
	(*nc)++;
	return stamp ? stamp : 1;
}

static void sort_cands(struct ep_cand *v, int n)
{
	/* Insertion sort: usually a handful are ready, and the scan that
	 * found them cost O(members) already. Ties keep the member order. */
	for (int i = 1; i < n; i++) {
		struct ep_cand t = v[i];
		int j = i - 1;
		while (j >= 0 && (v[j].key > t.key || (v[j].key == t.key && v[j].i > t.i))) {
			v[j + 1] = v[j];
			j--;
		}
		v[j + 1] = t;
	}
}

static int cand_cmp(const void *a, const void *b)
{
	const struct ep_cand *x = a, *y = b;
	if (x->key != y->key)
		return x->key < y->key ? -1 : 1;
	return (x->i > y->i) - (x->i < y->i);
}

/* Members on our live queues. */
static int queued(const struct ep_shadow *s)
{
	if (!ep_queues_ours(s))
		return 0;
	int n = 0;
	for (int i = 0; i < EP_QMAX; i++)
		if (s->qs[i].ops && !s->qs[i].dead)
			n += s->qs[i].members;
	return n;
}

/* Look at member i once in partial scan g. */
static void look_once(struct ep_shadow *s, int i, uint32_t g, uint64_t now, int *nc)
{
	if (i >= s->n || s->v[i].gen == g)
		return;
	s->v[i].gen = g;
	look(s, i, now, nc);
}

/*
 * The members a scan looks at. Members on one of our queues change only
 * with news (a kick's key, or an event of their socket): a partial scan
 * looks at those, at the members the last scan found ready (level-
 * triggered ones stay ready until read), and at every member on tokens.
 * Every member after any change of the set, a queue gone, or SDP_CHECK_MS
 * since the last full look (a peer that cleared our news bits).
 */
static int scan_members(struct ep_shadow *s, uint64_t now, int *last, uint64_t *newest)
{
	int nc = 0;
	uint64_t t = sdp_now_ns();
	int nq = queued(s);
	uint32_t lc = atomic_load_explicit(&ep_local_changes, memory_order_acquire);
	if (lc != s->epoch) {
		s->epoch = lc;
		s->full = true;
	}
	/* Many members on tokens: look at them only with news too (their
	 * socket's event), as at queue members. Only the process that made
	 * the set (a forked child's copy looks at every member). Turned on,
	 * the next scan looks at all, and the arms that follow arm all. */
	bool lazy = s->owner == sdp_pid && s->n - s->npending - nq >= EP_LAZY_MIN;
	if (lazy != s->lazy) {
		s->lazy = lazy;
		s->full = true;
	}
	if ((!nq && !lazy) || s->full || t >= s->full_at) {
		s->full = false;
		s->full_at = t + SDP_CHECK_MS * 1000000ull;
		for (int i = 0; i < s->n; i++) {
			if (s->v[i].c)
				sdp_idle_look(s->v[i].c, t);   /* rcvbuf.c */
			uint64_t stamp = look(s, i, now, &nc);
			if (stamp) {
				*last = i;
				*newest = stamp > *newest ? stamp : *newest;
			}
		}
		return nc;
	}
	/* News since the last look (no bell rings while we are awake); a
	 * queue without any is not popped (a pop checks its owner with a
	 * system call). */
	for (int i = 0; i < EP_QMAX; i++)
		if (s->qs[i].ops && !s->qs[i].dead && s->qs[i].ops->q_pending(s->qs[i].q))
			ep_queue_take(s, i);
	uint32_t g = ++s->gen;
	for (int k = 0; k < s->nhot; k++)
		look_once(s, s->hot[k], g, now, &nc);
	for (int k = 0; k < s->ncheck; k++)
		look_once(s, s->check[k], g, now, &nc);
	if (nq < s->n - s->npending)
		for (int i = 0; i < s->n; i++)
			if (!ep_on_queue(s, &s->v[i]) && !ep_by_news(s, &s->v[i]))
				look_once(s, i, g, now, &nc);
	return nc;
}

/* Report up to max ready members, those that became ready first first. */
static int scan(struct ep_shadow *s, struct epoll_event *out, int max)
{
	pthread_mutex_lock(&s->lock);
	uint64_t now = fab_clock();
	int last = -1;
	uint64_t newest = 0;
	int nc = scan_members(s, now, &last, &newest);
	s->ncheck = 0;
	/* Data found became ready during this scan: a member checked before
	 * it may have become ready after its check but before it - and then
	 * first. Look at those once more (once: what becomes ready now is
	 * newer than everything found). */
	if (last > 0 && newest + FAB_CLOCK_SLACK > now) {
		int found = nc, ci = 0;       /* the first pass's, by member */
		for (int i = 0; i < last; i++) {
			while (ci < found && s->cand[ci].i < i)
				ci++;
			if (ci >= found || s->cand[ci].i != i)
				look(s, i, now, &nc);
		}
	}
	if (nc > 16)
		qsort(s->cand, (size_t)nc, sizeof *s->cand, cand_cmp);
	else
		sort_cands(s->cand, nc);
	s->nhot = 0;                      /* ready now: look again next time */
	for (int k = 0; k < nc; k++)
		s->hot[s->nhot++] = s->cand[k].i;
	int n = nc < max ? nc : max;
	for (int k = 0; k < n; k++) {
		struct ep_ent *e = &s->v[s->cand[k].i];
		ent_report(e, &s->cand[k], now);
		out[k].events = s->cand[k].ev;
		out[k].data = e->data;
	}
	if (s->reap) {
		s->reap = false;
		for (int i = s->n - 1; i >= 0; i--)
			if (!s->v[i].c && !s->v[i].pending)
				ep_remove_at(s, i);
	}
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* Before sleeping: arm every member and try to become its watcher (the
 * only sleeper that consumes its tokens). Returns true if some member is
 * watched by another sleeper (then our sleep is cut into slices). */
static bool arm_all(struct ep_shadow *s)
{
	bool shared = s->token_shared;
	s->token_shared = false;
	pthread_mutex_lock(&s->lock);
	uint64_t now = sdp_now_ns();
	bool owed = now - s->owed_ns >= SDP_CHECK_MS * 1000000ull;
	if (owed)
		s->owed_ns = now;
	for (int i = 0; i < s->n; i++) {
		struct ep_ent *e = &s->v[i];
		e->watching = false;
		if (!e->c || e->parked)
			continue;
		if (ep_by_news(s, e)) {
			/* Its arm stays until a kick takes it - and then its
			 * key came (queue) or its token did (an event of its
			 * socket), and a scan looked at it. Its socket's
			 * tokens are taken by filter. */
			if (!e->disabled && (e->looked || owed)) {
				/* Looked at, its data may have come while
				 * it was not armed: the scan after the arms
				 * looks again. */
				ep_arm(s, e, owed);
				ep_note_check(s, i);
			}
			e->looked = false;
			continue;
		}
		if (!e->disabled)
			ep_arm(s, e, owed);
		e->watching = sdp_watch(e->c);
		if (!e->watching)
			shared = true;
		else
			s->nwatching++;
	}
	pthread_mutex_unlock(&s->lock);
	return shared;
}

static void unwatch_all(struct ep_shadow *s)
{
	pthread_mutex_lock(&s->lock);
	for (int i = 0; s->nwatching && i < s->n; i++) {
		struct ep_ent *e = &s->v[i];
		if (e->watching && e->c)
			sdp_unwatch(e->c);
		e->watching = false;
	}
	s->nwatching = 0;
	pthread_mutex_unlock(&s->lock);
}

/* Turn the kernel's events into the application's: tokens of SDP members
 * are drained and dropped (their readiness comes from scan). */
static int filter(struct ep_shadow *s, struct epoll_event *ev, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++) {
		if ((ev[i].data.u64 & TAG_MASK) == TAGW) {
			/* A shutdown here (sdp/wake.c), maybe before its
			 * epoll_local_change: the scan looks at every member. */
			pthread_mutex_lock(&s->lock);
			s->full = true;
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		if ((ev[i].data.u64 & TAG_MASK) == TAGQ) {
			/* A queue's bell: its news is taken here, and the scan
			 * that follows looks at the members it names. */
			unsigned qi = (unsigned)(uint32_t)ev[i].data.u64;
			pthread_mutex_lock(&s->lock);
			if (qi < EP_QMAX && s->qs[qi].ops && !s->qs[qi].dead && ep_queues_ours(s))
				ep_queue_take(s, (int)qi);
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		if ((ev[i].data.u64 & TAG_MASK) == TAG) {
			int fd = (int)(uint32_t)ev[i].data.u64;
			pthread_mutex_lock(&s->lock);
			int j = ep_find(s, fd);
			struct sdp_conn *c = NULL;
			bool mine = false;        /* we watch it only for this */
			if (j >= 0 && s->v[j].parked) {
				/* Something came for a socket the application
				 * deleted (a token, FIN): it stays readable, so
				 * remove it from the kernel set now; whoever
				 * waits on it next takes it. */
				ep_unpark(s, j);
				j = -1;
			}
			if (j >= 0 && s->v[j].c) {
				ep_note_check(s, j);
				if (s->v[j].watching) {
					c = s->v[j].c;
				} else if (ep_on_queue(s, &s->v[j]) || ep_by_news(s, &s->v[j])) {
					/* Not watched during our sleeps: take its
					 * tokens (or FIN) now, unless another
					 * thread's wait does. */
					c = s->v[j].c;
					mine = sdp_watch(c);
					if (!mine) {
						c = NULL;
						s->token_shared = true;
					}
				}
			}
			pthread_mutex_unlock(&s->lock);
			if (c)
				sdp_on_wakeup(c, fd);
			if (mine)
				sdp_unwatch(c);
			continue;
		}
		ev[k++] = ev[i];
	}
	return k;
}

/* The kernel's wait for a set with SDP members: epoll_pwait2 (Linux 5.11)
 * for its nanosecond timeout, else - the kernel, valgrind or a seccomp
 * profile says ENOSYS, remembered - epoll_pwait with the timeout rounded
 * up to whole milliseconds. NULL: no timeout. */
static _Atomic bool no_pwait2;

static int kernel_wait(int epfd, struct epoll_event *ev, int max,
		       const struct timespec *tp, const sigset_t *mask)
{
	if (real_epoll_pwait2 && !atomic_load_explicit(&no_pwait2, memory_order_relaxed)) {
		int r = real_epoll_pwait2(epfd, ev, max, tp, mask);
		if (r >= 0 || errno != ENOSYS)
			return r;
		atomic_store(&no_pwait2, true);
		sdp_log(2, "epoll_pwait2 unavailable: epoll_pwait from now on");
	}
	int ms = -1;
	if (tp) {
		uint64_t ns = (uint64_t)tp->tv_sec * 1000000000u + (uint64_t)tp->tv_nsec;
		uint64_t m = (ns + 999999) / 1000000;
		ms = m > INT_MAX ? INT_MAX : (int)m;
	}
	return real_epoll_pwait(epfd, ev, max, ms, mask);
}

/* A set with SDP members, or NULL: the application's own call then goes to
 * the kernel as it is. *shadow: the set's shadow either way (NULL: none). */
static struct ep_shadow *members(int epfd, struct ep_shadow **shadow)
{
	struct ep_shadow *s = ep_shadow_of(epfd, false);
	*shadow = s;
	return s && s->n != s->npending ? s : NULL;
}

/* The process's wake descriptor for this sleep (sdp/wake.c: another
 * thread's shutdown(SHUT_RD) writes it), in the kernel set once per
 * descriptor, edge-triggered (a write is one event however often it was
 * written); -1: none. */
static int wake_hold(struct ep_shadow *s, int epfd)
{
	int fd;
	uint32_t id;
	int wk = sdp_wake_hold(&fd, &id);
	if (wk < 0)
		return wk;
	if (__atomic_load_n(&s->wk_ids[wk], __ATOMIC_RELAXED) == id)
		return wk;
	int e = errno;
	struct epoll_event kev = { .events = EPOLLIN | EPOLLET,
				   .data.u64 = TAGW | (uint32_t)wk };
	if (real_epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &kev) < 0 && errno != EEXIST) {
		sdp_wake_drop(wk);
		wk = -1;
	} else {
		__atomic_store_n(&s->wk_ids[wk], id, __ATOMIC_RELAXED);
	}
	errno = e;
	return wk;
}

static int wait_common(struct ep_shadow *s, int epfd, struct epoll_event *ev, int max,
		       int64_t timeout_ns, const sigset_t *mask)
{
	if (max <= 0) {
		errno = EINVAL;
		return -1;
	}
	struct timespec zero = { 0, 0 };
	uint64_t start = sdp_now_ns();
	uint64_t deadline = timeout_ns >= 0 ? start + (uint64_t)timeout_ns : 0;
	uint32_t spin = sdp_spin_budget(&s->spin_cur, &s->spin_waits, sdp_tun.spin_us);
	bool spun = timeout_ns == 0 || !spin;
	if (atomic_exchange(&s->kernel_owed, false)) {
		/* The last wait filled the caller's array with SDP members and
		 * never asked the kernel: its members (a listener, plain TCP
		 * sockets, timers) come first now, in up to half the array,
		 * as the kernel's own ready list would let them. Those it does
		 * not return stay queued there. */
		int half = max > 1 ? max / 2 : 1;
		int r = kernel_wait(epfd, ev, half, &zero, mask);
		int k = r > 0 ? filter(s, ev, r) : 0;
		int n = k + (k < max ? scan(s, ev + k, max - k) : 0);
		if (n == max && k == 0)
			atomic_store(&s->kernel_owed, true);
		if (n)
			return n;
	}
	for (;;) {
		int n = scan(s, ev, max);
		if (!spun && !n) {
			/* The other members may be ready at once: then the
			 * call ends without a spin, and counts as none (a
			 * spin's hit restores the budget). */
			int r = kernel_wait(epfd, ev, max, &zero, mask);
			if (r > 0 && (n = filter(s, ev, r)) > 0)
				return n < max ? n + scan(s, ev + n, max - n) : n;
		}
		if (!spun && !n) {
			/* A scan costs a look at every member: relax longer
			 * between two, and read the clock after each. */
			struct sdp_spin sp;
			sdp_spin_start(&sp, spin, deadline, 1, 32, 0);
			uint64_t next_kernel = sp.start;
			bool kernel = false;
			while (!n && sdp_spin_step(&sp) != SDP_SPIN_OVER) {
				n = scan(s, ev, max);
				if (!n && sp.now >= next_kernel) {
					/* The other members (TCP sockets, pipes,
					 * timers) count too: ask the kernel, without
					 * waiting, every 2 us of the spin. */
					next_kernel = sp.now + 2000;
					int r = kernel_wait(epfd, ev, max, &zero, mask);
					if (r > 0 && (n = filter(s, ev, r)) > 0) {
						kernel = true;
						break;
					}
				}
			}
			sdp_spin_result(&s->spin_cur, sdp_tun.spin_us, n > 0, sp.contended);
			spun = true;
			if (kernel) {
				if (n < max)
					n += scan(s, ev + n, max - n);
				return n;
			}
		}
		bool shared = false;
		int wk = -1;
		if (!n) {
			wk = wake_hold(s, epfd);      /* before the look */
			shared = arm_all(s);
			n = scan(s, ev, max);
			if (n)
				unwatch_all(s);
		}
		if (n) {
			sdp_wake_drop(wk);
			/* Also collect what the kernel has, without waiting;
			 * with no room left, the next wait asks it first. */
			if (n < max) {
				int r = kernel_wait(epfd, ev + n, max - n, &zero, mask);
				if (r > 0)
					n += filter(s, ev + n, r);
			} else {
				atomic_store(&s->kernel_owed, true);
			}
			return n;
		}
		struct q_sleep z;
		if (ep_queues_sleep(s, &z)) {
			/* News came between the arms and now: look again. */
			ep_queues_wake(s, &z);
			unwatch_all(s);
			sdp_wake_drop(wk);
			continue;
		}
		struct timespec ts;
		const struct timespec *tp = sdp_sleep_ts(deadline, shared, &ts);
		fab_held_push();                      /* fabric.h */
		int r = kernel_wait(epfd, ev, max, tp, mask);
		sdp_wake_drop(wk);
		ep_queues_wake(s, &z);
		if (r < 0) {
			unwatch_all(s);
			return r;
		}
		n = filter(s, ev, r);
		unwatch_all(s);
		if (n < max)
			n += scan(s, ev + n, max - n);
		if (n || (deadline && sdp_now_ns() >= deadline) || timeout_ns == 0)
			return n;
	}
}

/* A set without SDP members while a fabric holds sends (fabric.h): the
 * kernel's wait in slices of a few ms, each after a push of those sends. */
static bool held(int64_t timeout_ns)
{
	return timeout_ns != 0 && fab_held_ms(-1) >= 0;
}

static int held_wait(int epfd, struct epoll_event *ev, int max, int64_t timeout_ns,
		     const sigset_t *mask)
{
	uint64_t deadline = timeout_ns >= 0 ? sdp_now_ns() + (uint64_t)timeout_ns : 0;
	for (;;) {
		fab_held_push();
		struct timespec ts;
		const struct timespec *tp = sdp_sleep_ts(deadline, false, &ts);
		int r = kernel_wait(epfd, ev, max, tp, mask);
		if (r != 0 || (deadline && sdp_now_ns() >= deadline))
			return r;
	}
}

/*
 * A set without SDP members waits in the kernel as the application asked.
 * Another thread may add one meanwhile (a server handing a connection to
 * a worker's set): the kernel then returns our registrations of it -
 * tagged tokens, queue bells -, which the application must never see
 * (their data word is ours, not its pointer). They go through the shadow,
 * and a wait they alone ended goes on as a wait with members for the rest
 * of its time. The queues it counted on nothing (ep_raw_sleep).
 */
static uint64_t raw_begin(struct ep_shadow *shadow, int64_t timeout_ns)
{
	if (shadow)
		ep_raw_sleep(shadow);
	return timeout_ns > 0 ? sdp_now_ns() : 0;  /* raw_end's start */
}

static int raw_end(int epfd, struct epoll_event *ev, int max, int r, uint64_t start,
		   int64_t timeout_ns, const sigset_t *mask)
{
	if (r <= 0)
		return r;
	bool ours = false;
	for (int i = 0; i < r && !ours; i++) {
		uint64_t t = ev[i].data.u64 & TAG_MASK;
		ours = t == TAG || t == TAGQ || t == TAGW;
	}
	struct ep_shadow *s = ours ? ep_shadow_of(epfd, false) : NULL;
	if (!s)
		return r;
	int e = errno;
	int n = filter(s, ev, r);
	if (n < max)
		n += scan(s, ev + n, max - n);
	if (n)
		return n;
	int64_t left = -1;
	if (timeout_ns >= 0) {
		uint64_t spent = sdp_now_ns() - start;
		if (spent >= (uint64_t)timeout_ns)
			return 0;
		left = timeout_ns - (int64_t)spent;
	}
	errno = e;
	return wait_common(s, epfd, ev, max, left, mask);
}

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	SDP_INIT();
	struct ep_shadow *shadow, *s = members(epfd, &shadow);
	int64_t to = timeout < 0 ? -1 : (int64_t)timeout * 1000000;
	if (!s && held(timeout))
		return held_wait(epfd, ev, max, to, NULL);
	if (!s) {
		uint64_t t0 = raw_begin(shadow, to);
		int r = real_epoll_wait(epfd, ev, max, timeout);
		return raw_end(epfd, ev, max, r, t0, to, NULL);
	}
	return wait_common(s, epfd, ev, max, to, NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
		       const sigset_t *mask)
{
	SDP_INIT();
	struct ep_shadow *shadow, *s = members(epfd, &shadow);
	int64_t to = timeout < 0 ? -1 : (int64_t)timeout * 1000000;
	if (!s && held(timeout))
		return held_wait(epfd, ev, max, to, mask);
	if (!s) {
		uint64_t t0 = raw_begin(shadow, to);
		int r = real_epoll_pwait(epfd, ev, max, timeout, mask);
		return raw_end(epfd, ev, max, r, t0, to, mask);
	}
	return wait_common(s, epfd, ev, max, to, mask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max,
			const struct timespec *t, const sigset_t *mask)
{
	SDP_INIT();
	struct ep_shadow *shadow, *s = members(epfd, &shadow);
	int64_t to = t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;
	if (!s && real_epoll_pwait2 && held(to))
		return held_wait(epfd, ev, max, to, mask);
	if (!s) {
		if (!real_epoll_pwait2) {
			errno = ENOSYS;           /* a libc without it */
			return -1;
		}
		uint64_t t0 = raw_begin(shadow, to);
		int r = real_epoll_pwait2(epfd, ev, max, t, mask);
		return raw_end(epfd, ev, max, r, t0, to, mask);
	}
	return wait_common(s, epfd, ev, max,
			   t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1, mask);
}
