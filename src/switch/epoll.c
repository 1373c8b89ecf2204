/*
 * epoll.c - epoll over sets that mix SDP sockets with other fds.
 *
 * The kernel cannot know an SDP socket's readiness, so each epoll instance
 * with SDP members has a shadow list of them (fd, the application's events
 * and data, edge/one-shot state). In the kernel such a member is registered
 * level-triggered for EPOLLIN with a tagged data word: it fires when the
 * peer's kick token or the peer's FIN/RST arrives. epoll_wait reports the
 * shadow members that are ready (level: while ready; edge: once per new
 * arrival or credit return; one-shot: once until EPOLL_CTL_MOD), drains the
 * tokens of tagged kernel events and passes all other events through.
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
 *
 * A socket registered before its connect() (nginx adds its upstream
 * sockets first) is not SDP yet: the kernel gets the application's
 * registration, and the shadow keeps a "pending" entry. If connect() makes
 * it SDP, epoll_adopt() turns that entry into a member (else its SDP data
 * would never be reported: no arm, no token, no scan); if it stays TCP,
 * epoll_drop_pending() forgets it.
 */
#include <errno.h>
#include <limits.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>

#include "switch/switch.h"
#include "sdp/spin.h"
#include "sdp/sys.h"

struct sdp_conn *sdp_fd_conn(int fd);

#define TAG      0x5344500000000000ull      /* "SDP" in the top bytes */
#define TAG_MASK 0xffffff0000000000ull

struct ep_ent {
	int fd;
	struct sdp_conn *c;
	uint32_t events;              /* as the application asked */
	epoll_data_t data;
	bool disabled;                /* one-shot fired */
	bool connecting;              /* kernel registration includes EPOLLOUT */
	bool watching;                /* we are its watcher during this sleep */
	bool pending;                 /* undecided socket (c == NULL): the kernel
				       * has the application's registration */
	uint64_t last_arrived, last_acked;
	uint32_t last_ev;
	uint64_t seen;                /* fab_clock of the first scan that found it
				       * ready without a stamp, 0 = not ready */
	uint64_t rep;                 /* fab_clock of the scan that last reported it,
				       * or of epoll_ctl ADD/MOD (TCP: (re-)queued at
				       * the ready list's tail then) */
};

/* A ready member found by a scan: when it became ready, its events, and
 * the ET state to keep if it is reported. */
struct ep_cand {
	uint64_t key;
	int i;
	uint32_t ev;
	uint64_t arrived, acked;
	uint32_t cur_ev;
};

struct ep_shadow {
	pthread_mutex_t lock;
	int epfd;
	struct ep_ent *v;
	int n, cap;
	int npending;                 /* of the n, pending entries (no member) */
	struct ep_cand *cand;         /* scan(): ready members, cap entries */
	_Atomic uint32_t spin_cur, spin_waits;   /* adaptive spin (wait.c) */
	struct ep_shadow *next;
};

static pthread_mutex_t all_lock = PTHREAD_MUTEX_INITIALIZER;
static struct ep_shadow *all;
/* Pending entries in all sets: while 0, connect() and close() of plain
 * sockets skip the walk over the sets. */
static _Atomic int pending_total;

/* Count an entry in or out of the pending ones; called locked. */
static void count_pending(struct ep_shadow *s, struct ep_ent *e, bool pending)
{
	if (e->pending == pending)
		return;
	e->pending = pending;
	s->npending += pending ? 1 : -1;
	atomic_fetch_add(&pending_total, pending ? 1 : -1);
}

static struct ep_shadow *shadow_of(int epfd, bool create)
{
	struct fdent *e = fd_get(epfd);
	if (!e)
		return NULL;
	if (atomic_load(&e->kind) == FDK_EPOLL && e->ep)
		return e->ep;
	if (!create)
		return NULL;
	struct ep_shadow *s = calloc(1, sizeof *s);
	if (!s)
		return NULL;
	pthread_mutex_init(&s->lock, NULL);
	s->epfd = epfd;
	atomic_store(&s->spin_cur, sdp_tun.spin_us);
	pthread_mutex_lock(&all_lock);
	s->next = all;
	all = s;
	pthread_mutex_unlock(&all_lock);
	e->ep = s;
	fd_set_kind(epfd, FDK_EPOLL);
	e->ep = s;
	return s;
}

void epoll_shadow_free(struct ep_shadow *s)
{
	if (!s)
		return;
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow **p = &all; *p; p = &(*p)->next)
		if (*p == s) {
			*p = s->next;
			break;
		}
	pthread_mutex_unlock(&all_lock);
	atomic_fetch_sub(&pending_total, s->npending);
	free(s->cand);
	free(s->v);
	free(s);
}

static int find(struct ep_shadow *s, int fd)
{
	for (int i = 0; i < s->n; i++)
		if (s->v[i].fd == fd)
			return i;
	return -1;
}

static void remove_at(struct ep_shadow *s, int i)
{
	count_pending(s, &s->v[i], false);
	s->v[i] = s->v[--s->n];
}

void epoll_forget_fd(int fd)
{
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		int i = find(s, fd);
		if (i >= 0)
			remove_at(s, i);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

EXPORT int epoll_create(int size)
{
	SDP_INIT();
	int fd = real_epoll_create(size);
	if (fd >= 0)
		fd_set_kind(fd, FDK_NONE);
	return fd;
}

EXPORT int epoll_create1(int flags)
{
	SDP_INIT();
	int fd = real_epoll_create1(flags);
	if (fd >= 0)
		fd_set_kind(fd, FDK_NONE);
	return fd;
}

static uint64_t arrived(struct sdp_conn *c)
{
	return sdp_rx_arrived(c);
}

/* Changes whenever room to send comes back: credits, or bytes the peer
 * consumed (a byte-limited window opens on partial reads too). */
static uint64_t acked(struct sdp_conn *c)
{
	return sdp_tx_acked(c);
}

/* Shadow entry i (or a new one) for fd; called locked. NULL: no memory. */
static struct ep_ent *ent_for(struct ep_shadow *s, int i)
{
	if (i >= 0)
		return &s->v[i];
	if (s->n == s->cap) {
		int nc = s->cap ? s->cap * 2 : 16;
		struct ep_ent *nv = realloc(s->v, (size_t)nc * sizeof *nv);
		if (!nv)
			return NULL;
		s->v = nv;
		struct ep_cand *ncand = realloc(s->cand, (size_t)nc * sizeof *ncand);
		if (!ncand)
			return NULL;
		s->cand = ncand;
		s->cap = nc;
	}
	s->v[s->n].pending = false;
	return &s->v[s->n++];
}

/* Not an SDP socket: the kernel has the application's registration. An
 * undecided TCP socket is remembered as pending (it may become SDP). */
static int ctl_plain(struct ep_shadow *s, int epfd, int op, int fd,
		     struct epoll_event *ev, bool undecided)
{
	int r = real_epoll_ctl(epfd, op, fd, ev);
	if (!s || r < 0)
		return r;
	pthread_mutex_lock(&s->lock);
	int i = find(s, fd);
	if (undecided) {
		struct ep_ent *e = ent_for(s, i);
		if (e) {
			bool was = e->pending;
			*e = (struct ep_ent){ .fd = fd, .events = ev->events,
					      .data = ev->data, .pending = was };
			count_pending(s, e, true);
		}
	} else if (i >= 0) {
		remove_at(s, i);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

void epoll_adopt(int fd, struct sdp_conn *c)
{
	if (!atomic_load(&pending_total))
		return;
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		int i = find(s, fd);
		if (i >= 0 && s->v[i].pending) {
			struct ep_ent *e = &s->v[i];
			bool connecting = atomic_load(&c->state) == SDP_ST_CONNECTING;
			struct epoll_event kev = {
				.events = EPOLLIN | (connecting ? EPOLLOUT : 0),
				.data.u64 = TAG | (uint32_t)fd,
			};
			if (real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, fd, &kev) == 0) {
				e->c = c;
				count_pending(s, e, false);
				e->connecting = connecting;
				e->last_arrived = arrived(c) - 1;
				e->last_acked = acked(c) - 1;
				e->rep = fab_clock();
				sdp_arm(c, fd, e->events);
			} else {
				remove_at(s, i);
			}
		}
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

/* The process is about to be sandboxed and its connections have left SDP
 * (fd_leave_all): every member's registration in the kernel becomes the
 * application's own again (a fired one-shot stays disabled). The shadow
 * sets are freed when the table forgets their epoll fds. */
void epoll_leave_all(void)
{
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		for (int i = 0; i < s->n; i++) {
			struct ep_ent *e = &s->v[i];
			if (!e->c)
				continue;     /* pending: the kernel has its own */
			struct epoll_event kev = {
				.events = e->disabled ? EPOLLONESHOT : e->events,
				.data = e->data,
			};
			if (real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &kev) < 0)
				sdp_log(0, "epoll fd %d: fd %d not given back to the kernel (%s)",
					s->epfd, e->fd, strerror(errno));
			e->c = NULL;
		}
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

void epoll_drop_pending(int fd)
{
	if (atomic_load(&pending_total))
		epoll_forget_fd(fd);      /* a plain socket's entries are pending */
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	bool undecided = !c && op != EPOLL_CTL_DEL && fd_kind(fd) == FDK_INET;
	struct ep_shadow *s = shadow_of(epfd, c != NULL || undecided);
	if (!c)
		return ctl_plain(s, epfd, op, fd, ev, undecided);
	if (!s) {
		errno = ENOMEM;
		return -1;
	}
	if (op != EPOLL_CTL_DEL && !ev) {
		errno = EFAULT;
		return -1;
	}
	bool connecting = atomic_load(&c->state) == SDP_ST_CONNECTING;
	struct epoll_event kev = {
		.events = EPOLLIN | (connecting ? EPOLLOUT : 0),
		.data.u64 = TAG | (uint32_t)fd,
	};
	pthread_mutex_lock(&s->lock);
	int i = find(s, fd);
	int r;
	if (op == EPOLL_CTL_DEL) {
		r = real_epoll_ctl(epfd, op, fd, ev);
		if (i >= 0)
			remove_at(s, i);
	} else {
		r = real_epoll_ctl(epfd, op, fd, &kev);
		if (r == 0) {
			struct ep_ent *e = ent_for(s, i);
			if (!e) {
				pthread_mutex_unlock(&s->lock);
				real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
				errno = ENOMEM;
				return -1;
			}
			count_pending(s, e, false);
			memset(e, 0, sizeof *e);
			e->fd = fd;
			e->c = c;
			e->events = ev->events;
			e->data = ev->data;
			e->connecting = connecting;
			e->last_arrived = arrived(c) - 1;   /* edge: report current state */
			e->last_acked = acked(c) - 1;
			e->rep = fab_clock();     /* TCP: ready now, queued now */
			sdp_arm(c, fd, ev->events);
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
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
		if (fd_kind(e->fd) == FDK_SDP)
			fd_fallback(e->fd, c);
		struct epoll_event kev = { .events = e->events, .data = e->data };
		real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &kev);
		e->c = NULL;
		return 0;
	}
	if (e->connecting) {
		if (atomic_load(&c->state) == SDP_ST_CONNECTING) {
			if (!sdp_fd_conn(e->fd)) {
				/* Connect failed: the fd is plain TCP now. */
				struct epoll_event kev = { .events = e->events, .data = e->data };
				real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &kev);
				e->c = NULL;
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
		uint64_t a = arrived(c), ak = acked(c);
		uint32_t out = 0;
		if ((ev & EPOLLIN) && (a != e->last_arrived || !(e->last_ev & EPOLLIN)))
			out |= EPOLLIN;
		if ((ev & EPOLLOUT) && (ak != e->last_acked || !(e->last_ev & EPOLLOUT)))
			out |= EPOLLOUT;
		out |= ev & ~e->last_ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
		if (out)
			out |= ev & (EPOLLRDHUP | EPOLLHUP | EPOLLERR);
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
	if (!e->c || e->disabled)
		return 0;
	struct ep_cand *k = &s->cand[*nc];
	uint32_t ev = ent_events(s, e, k);
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

/* Report up to max ready members, those that became ready first first. */
static int scan(struct ep_shadow *s, struct epoll_event *out, int max)
{
	pthread_mutex_lock(&s->lock);
	uint64_t now = fab_clock();
	int nc = 0, last = -1;
	uint64_t newest = 0;
	for (int i = 0; i < s->n; i++) {
		uint64_t stamp = look(s, i, now, &nc);
		if (stamp) {
			last = i;
			newest = stamp > newest ? stamp : newest;
		}
	}
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
	int n = nc < max ? nc : max;
	for (int k = 0; k < n; k++) {
		struct ep_ent *e = &s->v[s->cand[k].i];
		ent_report(e, &s->cand[k], now);
		out[k].events = s->cand[k].ev;
		out[k].data = e->data;
	}
	for (int i = s->n - 1; i >= 0; i--)
		if (!s->v[i].c && !s->v[i].pending)
			remove_at(s, i);
	pthread_mutex_unlock(&s->lock);
	return n;
}

/* Before sleeping: arm every member and try to become its watcher (the
 * only sleeper that consumes its tokens). Returns true if some member is
 * watched by another sleeper (then our sleep is cut into slices). */
static bool arm_all(struct ep_shadow *s)
{
	bool shared = false;
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < s->n; i++) {
		struct ep_ent *e = &s->v[i];
		e->watching = false;
		if (!e->c)
			continue;
		if (!e->disabled)
			sdp_arm(e->c, e->fd, e->events);
		e->watching = sdp_watch(e->c);
		if (!e->watching)
			shared = true;
	}
	pthread_mutex_unlock(&s->lock);
	return shared;
}

static void unwatch_all(struct ep_shadow *s)
{
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < s->n; i++) {
		struct ep_ent *e = &s->v[i];
		if (e->watching && e->c)
			sdp_unwatch(e->c);
		e->watching = false;
	}
	pthread_mutex_unlock(&s->lock);
}

/* Turn the kernel's events into the application's: tokens of SDP members
 * are drained and dropped (their readiness comes from scan). */
static int filter(struct ep_shadow *s, struct epoll_event *ev, int n)
{
	int k = 0;
	for (int i = 0; i < n; i++) {
		if ((ev[i].data.u64 & TAG_MASK) == TAG) {
			int fd = (int)(uint32_t)ev[i].data.u64;
			pthread_mutex_lock(&s->lock);
			int j = find(s, fd);
			struct sdp_conn *c = j >= 0 && s->v[j].watching ? s->v[j].c : NULL;
			pthread_mutex_unlock(&s->lock);
			if (c)
				sdp_on_wakeup(c, fd);
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
 * the kernel as it is. */
static struct ep_shadow *members(int epfd)
{
	struct ep_shadow *s = shadow_of(epfd, false);
	return s && s->n != s->npending ? s : NULL;
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
		if (!n) {
			shared = arm_all(s);
			n = scan(s, ev, max);
			if (n)
				unwatch_all(s);
		}
		if (n) {
			/* Also collect what the kernel has, without waiting. */
			if (n < max) {
				int r = kernel_wait(epfd, ev + n, max - n, &zero, mask);
				if (r > 0)
					n += filter(s, ev + n, r);
			}
			return n;
		}
		struct timespec ts;
		const struct timespec *tp = sdp_sleep_ts(deadline, shared, &ts);
		int r = kernel_wait(epfd, ev, max, tp, mask);
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

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	SDP_INIT();
	struct ep_shadow *s = members(epfd);
	if (!s)
		return real_epoll_wait(epfd, ev, max, timeout);
	return wait_common(s, epfd, ev, max, timeout < 0 ? -1 : (int64_t)timeout * 1000000, NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
		       const sigset_t *mask)
{
	SDP_INIT();
	struct ep_shadow *s = members(epfd);
	if (!s)
		return real_epoll_pwait(epfd, ev, max, timeout, mask);
	return wait_common(s, epfd, ev, max, timeout < 0 ? -1 : (int64_t)timeout * 1000000, mask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max,
			const struct timespec *t, const sigset_t *mask)
{
	SDP_INIT();
	struct ep_shadow *s = members(epfd);
	if (!s) {
		if (!real_epoll_pwait2) {
			errno = ENOSYS;           /* a libc without it */
			return -1;
		}
		return real_epoll_pwait2(epfd, ev, max, t, mask);
	}
	return wait_common(s, epfd, ev, max,
			   t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1, mask);
}
