/*
 * epoll.c - epoll over sets that mix SDP sockets with other fds: the sets.
 *
 * The kernel cannot know an SDP socket's readiness, so each epoll instance
 * with SDP members has a shadow list of them (fd, the application's events
 * and data, edge/one-shot state). In the kernel such a member is registered
 * level-triggered for EPOLLIN with a tagged data word: it fires when the
 * peer's kick token or the peer's FIN/RST arrives. This file keeps the
 * sets: epoll_create/epoll_ctl, members joining and leaving (parked
 * deletes, fallbacks, closes), the readiness queues a set reads, and fork.
 * epoll_wait.c scans and waits over them.
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
#include "sdp/wake.h"
#include "switch/epoll_int.h"

struct sdp_conn *sdp_fd_conn(int fd);

static int find_key(struct ep_shadow *s, uint32_t key);

_Atomic uint32_t ep_local_changes;

void epoll_local_change(void)
{
	atomic_fetch_add_explicit(&ep_local_changes, 1, memory_order_release);
}

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

/* Parked entries in all sets (park() below): while 0, closing a socket
 * that left SDP skips the walk over the sets. */
static _Atomic int parked_total;

static void count_parked(struct ep_ent *e, bool parked)
{
	if (e->parked == parked)
		return;
	e->parked = parked;
	atomic_fetch_add(&parked_total, parked ? 1 : -1);
}

/*
 * A queue is read by one set of the process (its claim): a waiter that
 * took another set's news from it would leave that set asleep. Members
 * whose queue another set reads, or that have none, use tokens. The set
 * also holds the queue in the provider (q_hold) from its claim until it
 * gives the queue up (queue_drop: its last member gone, the set closed,
 * the process leaving SDP; queue_dead): until then the provider keeps what
 * the queue is made of, so that a pop never reads a page or descriptor
 * that went to another peer process meanwhile. A forked child's copy of
 * the set holds nothing (the provider forgets the holds in the child).
 */
static struct ep_shadow *_Atomic q_claim[256];

/* A waiter asleep on the set is counted only on the queues it counted
 * itself on before its sleep (ep_queues_sleep), a wait that went to the
 * kernel without the shadow on none: a kick on another queue would ring
 * no bell for it. So the set counts one sleeper on such a queue for them
 * (its bell is in the kernel set) until a sole sleeper has counted
 * itself, or none sleeps. Called locked. */
static bool set_ours(const struct ep_shadow *s)
{
	return !s->qpid || s->qpid == sdp_pid;   /* not a forked child's copy */
}

static void proxy_take(struct ep_shadow *s, struct ep_queue *x)
{
	if (!x->proxy && !x->dead && set_ours(s))
		x->proxy = x->ops->q_sleep(x->q, +1);
}

static void proxy_drop(struct ep_shadow *s, struct ep_queue *x)
{
	if (x->proxy && set_ours(s))
		x->ops->q_sleep(x->q, -1);
	x->proxy = false;
}

/* The queue for a new member c of s, as 1 + its index in s->qs, or 0
 * (tokens). Called locked. */
static uint8_t queue_for(struct ep_shadow *s, struct sdp_conn *c)
{
	if (s->qpid && s->qpid != sdp_pid)
		return 0;
	/* A vfork child (it shares our memory, sdp_pid included) is not the
	 * link's owner: the provider's bind refuses it (one getpid, not two:
	 * an event loop adds its sockets once per request). */
	int q = sdp_q_bind(c);
	if (q < 0) {
		sdp_log(3, "epoll fd %d: a member without a readiness queue (tokens)", s->epfd);
		return 0;
	}
	const struct fab_ops *o = c->ep.ops;
	int free_i = -1;
	for (int i = 0; i < EP_QMAX; i++) {
		struct ep_queue *x = &s->qs[i];
		if (!x->ops) {
			if (free_i < 0)
				free_i = i;
		} else if (x->ops == o && x->q == q) {
			if (x->dead)
				return 0;
			x->members++;
			return (uint8_t)(i + 1);
		}
	}
	if (free_i < 0)
		return 0;
	struct ep_shadow *none = NULL;
	if (!atomic_compare_exchange_strong(&q_claim[Q_IDX(q)], &none, s)) {
		sdp_log(3, "epoll fd %d: queue %d is read by another set", s->epfd, q);
		return 0;
	}
	int fd = o->q_hold(q);
	struct epoll_event kev = { .events = EPOLLIN | EPOLLET,
				   .data.u64 = TAGQ | (uint32_t)free_i };
	if (fd < 0 || real_epoll_ctl(s->epfd, EPOLL_CTL_ADD, fd, &kev) < 0) {
		if (fd >= 0)
			o->q_release(q);
		atomic_store(&q_claim[Q_IDX(q)], NULL);
		return 0;
	}
	s->qs[free_i] = (struct ep_queue){ .ops = o, .q = q, .fd = fd, .members = 1 };
	if (s->nsleep > 0 || !s->counted)
		proxy_take(s, &s->qs[free_i]);
	s->qpid = sdp_pid;
	return (uint8_t)(free_i + 1);
}

/* Stop reading queue i of s: out of the kernel set (if its descriptor is
 * still the queue's: the application may have closed and reused the
 * number), and the provider's hold released - only in the process that
 * took it. Called locked, once per queue (dead or dropped). */
static void queue_unhold(struct ep_shadow *s, struct ep_queue *x)
{
	if (s->qpid != sdp_pid)
		return;
	if (x->ops->q_fd(x->q) == x->fd)
		real_epoll_ctl(s->epfd, EPOLL_CTL_DEL, x->fd, NULL);
	x->ops->q_release(x->q);
}

/* Give queue i of s up: its hold (unless dead: released then) and its
 * claim. Called locked. */
static void queue_drop(struct ep_shadow *s, int i)
{
	struct ep_queue *x = &s->qs[i];
	if (!x->ops)
		return;
	proxy_drop(s, x);
	if (!x->dead)
		queue_unhold(s, x);
	struct ep_shadow *me = s;
	atomic_compare_exchange_strong(&q_claim[Q_IDX(x->q)], &me, NULL);
	*x = (struct ep_queue){ 0 };
}

/* Entry e leaves its queue (removed, modified, or not SDP any more). */
static void ent_unqueue(struct ep_shadow *s, struct ep_ent *e)
{
	if (!e->q1)
		return;
	int i = e->q1 - 1;
	e->q1 = 0;
	if (--s->qs[i].members <= 0)
		queue_drop(s, i);
}

/* The queue is gone (its peer process closed its end): its members go
 * back to tokens at their next arm; a peer's kick that finds no link
 * sends a token, so nothing is missed meanwhile. Nothing reads it any
 * more: its descriptor leaves the kernel set and the hold goes now (the
 * slot stays until its members leave). */
static void queue_dead(struct ep_shadow *s, int i)
{
	struct ep_queue *x = &s->qs[i];
	if (!x->ops || x->dead)
		return;
	proxy_drop(s, x);
	x->dead = true;
	queue_unhold(s, x);
	s->full = true;                   /* its members: tokens, every scan */
	struct ep_shadow *me = s;
	atomic_compare_exchange_strong(&q_claim[Q_IDX(x->q)], &me, NULL);
}

/* Is this process the one that reads the set's queues? */
bool ep_queues_ours(const struct ep_shadow *s)
{
	return s->qpid && s->qpid == sdp_pid;
}

/* Take everything queue i has: its keys name the members the next scan
 * looks at. Returns how many keys it had, or marks it dead. */
int ep_queue_take(struct ep_shadow *s, int i)
{
	struct ep_queue *x = &s->qs[i];
	uint32_t keys[256];
	int total = 0;
	for (;;) {
		int n = x->ops->q_pop(x->q, keys, 256);
		if (n < 0) {
			queue_dead(s, i);
			return total;
		}
		total += n;
		for (int k = 0; k < n; k++) {
			int m = find_key(s, keys[k]);
			if (m >= 0)
				ep_note_check(s, m);
		}
		if (n < 256)
			return total;
	}
}

/*
 * About to sleep: the queues' peers ring their descriptors only while a
 * waiter sleeps, so count ourselves in, then take what came since the
 * last look (a kick after our arm but before the count went up rang no
 * bell): true if something did - then do not sleep, look again.
 */
bool ep_queues_sleep(struct ep_shadow *s, struct q_sleep *z)
{
	z->n = 0;
	bool news = false;
	pthread_mutex_lock(&s->lock);
	s->nsleep++;
	s->counted = true;
	for (int i = 0; ep_queues_ours(s) && i < EP_QMAX; i++) {
		struct ep_queue *x = &s->qs[i];
		if (!x->ops || x->dead)
			continue;
		if (x->ops->q_sleep(x->q, +1)) {
			/* Held until queues_wake: the set may give the queue
			 * up while we sleep. */
			z->ops[z->n] = x->ops;
			z->q[z->n++] = x->q;
		}
		if (s->nsleep == 1)
			proxy_drop(s, x);            /* the only sleeper, counted now */
		if (ep_queue_take(s, i) > 0)
			news = true;
	}
	pthread_mutex_unlock(&s->lock);
	return news;
}

void ep_queues_wake(struct ep_shadow *s, struct q_sleep *z)
{
	for (int i = 0; i < z->n; i++)
		z->ops[i]->q_sleep(z->q[i], -1);
	z->n = 0;
	pthread_mutex_lock(&s->lock);
	if (--s->nsleep == 0 && s->counted)
		/* No sleeper left: the next counts itself on every queue. */
		for (int i = 0; i < EP_QMAX; i++)
			proxy_drop(s, &s->qs[i]);
	pthread_mutex_unlock(&s->lock);
}

/* A wait of the set goes to the kernel without the shadow (no members):
 * it counts itself on no queue. */
void ep_raw_sleep(struct ep_shadow *s)
{
	pthread_mutex_lock(&s->lock);
	s->counted = false;
	for (int i = 0; ep_queues_ours(s) && i < EP_QMAX; i++)
		if (s->qs[i].ops)
			proxy_take(s, &s->qs[i]);
	pthread_mutex_unlock(&s->lock);
}

struct ep_shadow *ep_shadow_of(int epfd, bool create)
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
	s->owner = sdp_pid;
	atomic_store(&s->spin_cur, sdp_tun.spin_us);
	/* Two threads' first epoll_ctl on one set: one shadow (an orphan
	 * left in `all` would outlive the number and later act on another
	 * set that took it). */
	pthread_mutex_lock(&all_lock);
	if (atomic_load(&e->kind) == FDK_EPOLL && e->ep) {
		struct ep_shadow *won = e->ep;
		pthread_mutex_unlock(&all_lock);
		pthread_mutex_destroy(&s->lock);
		free(s);
		return won;
	}
	s->next = all;
	all = s;
	e->ep = s;
	fd_set_kind(epfd, FDK_EPOLL);
	e->ep = s;
	pthread_mutex_unlock(&all_lock);
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
	for (int i = 0; i < s->n; i++)
		count_parked(&s->v[i], false);
	for (int i = 0; i < EP_QMAX; i++)
		queue_drop(s, i);
	free(s->check);
	free(s->hot);
	free(s->kmap);
	free(s->fmap);
	free(s->cand);
	free(s->v);
	free(s);
}

/*
 * fork. A thread inside epoll_ctl or epoll_wait holds a set's lock, and a
 * walk over the sets (close, connect) the list's: a child that copied one
 * of them taken would wait for ever at its first close of an SDP socket.
 * The interposed fork() (process.c) takes them all in the order the code
 * does - the list's, then each set's in list order - before the real fork,
 * whose pthread_atfork handlers then take the fd table's and the
 * provider's locks (a set's lock is taken before those, never after). So
 * the child copies every set whole; the parent unlocks, the child makes
 * new locks (epoll_fork_child). A fork made inside libc (daemon()) runs
 * only the pthread_atfork handlers: a set whose lock the child finds taken
 * may be half changed, and the child's copy of it starts empty.
 */
static _Atomic bool fork_locked;   /* epoll_fork_prepare holds every lock */

void epoll_fork_prepare(void)
{
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next)
		pthread_mutex_lock(&s->lock);
	atomic_store(&fork_locked, true);
}

void epoll_fork_parent(void)
{
	atomic_store(&fork_locked, false);
	for (struct ep_shadow *s = all; s; s = s->next)
		pthread_mutex_unlock(&s->lock);
	pthread_mutex_unlock(&all_lock);
}

/* A child's copy of a set that another thread was changing: its members
 * are forgotten (not reported in the child; their kernel events dropped,
 * filter()), its arrays left alone (they may be half reallocated). */
static void shadow_untrusted(struct ep_shadow *s)
{
	s->v = NULL;
	s->cand = NULL;
	s->check = s->hot = s->kmap = s->fmap = NULL;
	s->n = s->cap = s->npending = s->ncheck = s->nhot = 0;
	s->nqueued = s->nwatching = 0;
	s->kcap = s->fcap = 0;
	s->kmap_inexact = s->fmap_inexact = s->reap = false;
	memset(s->qs, 0, sizeof s->qs);   /* the parent's: held by it */
	s->full = true;
}

/* pthread_atfork child handler (fdtab.c). Locks epoll_fork_prepare took
 * (this thread: the child's only one) are released; one a thread of the
 * parent's held (a fork past fork()) is made anew, and its set is not
 * trusted. */
static void child_lock(pthread_mutex_t *m, bool whole, struct ep_shadow *s)
{
	if (whole || pthread_mutex_trylock(m) == 0) {
		pthread_mutex_unlock(m);
		return;
	}
	if (s) {
		shadow_untrusted(s);
		sdp_log(2, "epoll fd %d: forked (past fork()) while another "
			"thread changed the set: its copy starts empty", s->epfd);
	}
	pthread_mutex_init(m, NULL);
}

void epoll_fork_child(void)
{
	bool whole = atomic_load(&fork_locked);
	atomic_store(&fork_locked, false);
	for (struct ep_shadow *s = all; s; s = s->next)
		child_lock(&s->lock, whole, s);
	child_lock(&all_lock, whole, NULL);
}

/* Remember that map[k] is member i (+1), growing the map up to limit
 * entries; without memory it stays a miss. */
static void hint(int **map, uint32_t *cap, uint32_t k, int i, uint32_t limit)
{
	if (k >= *cap) {
		if (k >= limit)
			return;
		uint32_t nc = *cap ? *cap : 64;
		while (nc <= k)
			nc *= 2;
		int *nm = realloc(*map, (size_t)nc * sizeof *nm);
		if (!nm)
			return;
		memset(nm + *cap, 0, (size_t)(nc - *cap) * sizeof *nm);
		*map = nm;
		*cap = nc;
	}
	(*map)[k] = i + 1;
}

/* The member for fd, or -1: the map first (checked); only if some
 * member's fd could not be mapped, a walk (an event loop that adds a
 * socket per request must not walk every member for it). */
int ep_find(struct ep_shadow *s, int fd)
{
	if (fd >= 0 && (uint32_t)fd < s->fcap) {
		int i = s->fmap[fd] - 1;
		if (i >= 0 && i < s->n && s->v[i].fd == fd)
			return i;
	}
	if (!s->fmap_inexact)
		return -1;
	for (int i = 0; i < s->n; i++)
		if (s->v[i].fd == fd) {
			if (fd >= 0)
				hint(&s->fmap, &s->fcap, (uint32_t)fd, i, 1u << 22);
			return i;
		}
	return -1;
}

bool ep_on_queue(const struct ep_shadow *s, const struct ep_ent *e)
{
	return e->c && e->q1 && !s->qs[e->q1 - 1].dead;
}

/* Looked at only with news (a popped key, an event of its socket), armed
 * only after a look, and watched by no sleep (filter takes its tokens):
 * a member on one of our queues, and in a lazy set one on tokens. */
bool ep_by_news(const struct ep_shadow *s, const struct ep_ent *e)
{
	if (!e->c)
		return false;
	if (ep_on_queue(s, e))
		return ep_queues_ours(s);
	return s->lazy && e->tok_ok;
}

/* The queue member whose key (sdp_q_bind: the connection's pool index) is
 * key, or -1: the map (exact for every queue member unless one could not
 * be mapped), else a walk. */
static int find_key(struct ep_shadow *s, uint32_t key)
{
	if (key < s->kcap) {
		int i = s->kmap[key] - 1;
		if (i >= 0 && i < s->n && ep_on_queue(s, &s->v[i]) && s->v[i].c->idx == key)
			return i;
	}
	if (!s->kmap_inexact)
		return -1;
	for (int i = 0; i < s->n; i++)
		if (ep_on_queue(s, &s->v[i]) && s->v[i].c->idx == key) {
			hint(&s->kmap, &s->kcap, key, i, 1u << 20);
			return i;
		}
	return -1;
}

/* Member i joined a queue (q1 set): map its key. */
static void key_map(struct ep_shadow *s, int i)
{
	struct ep_ent *e = &s->v[i];
	if (!ep_on_queue(s, e))
		return;
	hint(&s->kmap, &s->kcap, e->c->idx, i, 1u << 20);
	if (e->c->idx >= s->kcap)
		s->kmap_inexact = true;
}

/* Member i has news: the next scan looks at it. Called locked. */
void ep_note_check(struct ep_shadow *s, int i)
{
	if (s->ncheck < s->cap)
		s->check[s->ncheck++] = i;
	else
		s->full = true;
}

/*
 * Member i leaves the set; the last member takes its place. The lists
 * (check, hot) name members by index: an entry naming the old last index
 * is past the end now and skipped, so the moved member is noted at its new
 * one, and entries that named i name the moved member (one look more).
 * Its hints follow it. No look at every member: an application that
 * deletes and adds a socket per request (redis-benchmark's event loop)
 * would otherwise make every wait look at all of them.
 */
void ep_remove_at(struct ep_shadow *s, int i)
{
	count_pending(s, &s->v[i], false);
	count_parked(&s->v[i], false);
	ent_unqueue(s, &s->v[i]);
	int last = --s->n;
	if (i == last)
		return;
	s->v[i] = s->v[last];
	struct ep_ent *e = &s->v[i];
	if (e->fd >= 0 && (uint32_t)e->fd < s->fcap)
		s->fmap[e->fd] = i + 1;
	if (ep_on_queue(s, e) && e->c->idx < s->kcap)
		s->kmap[e->c->idx] = i + 1;
	if (e->c)
		ep_note_check(s, i);
}

void epoll_forget_fd(int fd)
{
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		int i = ep_find(s, fd);
		if (i >= 0 && s->v[i].parked)
			ep_unpark(s, i);         /* the application deleted it: a
					       * duplicate must not keep it */
		else if (i >= 0)
			ep_remove_at(s, i);
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

EXPORT int epoll_create(int size)
{
	SDP_INIT();
	int fd = real_epoll_create(size);
	if (fd >= 0 && fab_private)
		fd = sys_fd_high(fd);         /* a provider's (sys.h) */
	if (fd >= 0)
		fd_set_kind(fd, FDK_NONE);
	return fd;
}

EXPORT int epoll_create1(int flags)
{
	SDP_INIT();
	int fd = real_epoll_create1(flags);
	if (fd >= 0 && fab_private)
		fd = sys_fd_high(fd);         /* a provider's (sys.h) */
	if (fd >= 0)
		fd_set_kind(fd, FDK_NONE);
	return fd;
}

uint64_t ep_arrived(struct sdp_conn *c)
{
	return sdp_rx_arrived(c);
}

/* Changes whenever room to send comes back: credits, or bytes the peer
 * consumed (a byte-limited window opens on partial reads too). */
uint64_t ep_acked(struct sdp_conn *c)
{
	return sdp_tx_acked(c);
}

/* A member whose provider wakes it on a descriptor of its own (ofi: the
 * completion queue's wait object) has that one registered too, with the
 * member's tag; the TCP socket stays registered for the application's
 * later EPOLL_CTL_MOD / DEL and for a fallback. */
void ep_wait_fd_ctl(int epfd, int op, int fd, struct sdp_conn *c)
{
	int w = fab_wait_fd(&c->ep, fd);
	if (w == fd || w < 0)
		return;
	struct epoll_event kev = { .events = EPOLLIN, .data.u64 = TAG | (uint32_t)fd };
	real_epoll_ctl(epfd, op, w, op == EPOLL_CTL_DEL ? NULL : &kev);
}

/* Shadow entry i (or a new one) for fd; called locked. NULL: no memory. */
static struct ep_ent *ent_for(struct ep_shadow *s, int i, int fd)
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
		int *nchk = realloc(s->check, (size_t)nc * sizeof *nchk);
		if (!nchk)
			return NULL;
		s->check = nchk;
		int *nhot = realloc(s->hot, (size_t)nc * sizeof *nhot);
		if (!nhot)
			return NULL;
		s->hot = nhot;
		s->cap = nc;
	}
	/* Appended: the indexes in the lists stay valid. */
	s->v[s->n].fd = fd;
	s->v[s->n].pending = false;
	s->v[s->n].q1 = 0;
	hint(&s->fmap, &s->fcap, (uint32_t)fd, s->n, 1u << 22);
	if ((uint32_t)fd >= s->fcap)
		s->fmap_inexact = true;   /* ep_find() walks from now on */
	return &s->v[s->n++];
}

/* Not an SDP socket: the kernel has the application's registration. An
 * undecided TCP socket is remembered as pending (it may become SDP). */
static int ctl_plain(struct ep_shadow *s, int epfd, int op, int fd,
		     struct epoll_event *ev, bool undecided)
{
	if (s && atomic_load_explicit(&parked_total, memory_order_relaxed)) {
		/* The number names a member the application deleted while
		 * it was SDP (it left SDP since): our registration goes
		 * first, and the kernel answers as it would. */
		pthread_mutex_lock(&s->lock);
		int i = ep_find(s, fd);
		if (i >= 0 && s->v[i].parked)
			ep_unpark(s, i);
		pthread_mutex_unlock(&s->lock);
	}
	int r = real_epoll_ctl(epfd, op, fd, ev);
	if (!s || r < 0)
		return r;
	pthread_mutex_lock(&s->lock);
	int i = ep_find(s, fd);
	if (undecided) {
		struct ep_ent *e = ent_for(s, i, fd);
		if (e) {
			bool was = e->pending;
			if (i >= 0)
				ent_unqueue(s, e);
			*e = (struct ep_ent){ .fd = fd, .events = ev->events,
					      .data = ev->data, .pending = was };
			count_pending(s, e, true);
		}
	} else if (i >= 0) {
		ep_remove_at(s, i);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* Ask member e's peer for a kick: through the set's queue if it has one
 * (no system call on either side while we are awake), else a token on its
 * socket. Called locked. */
void ep_arm(struct ep_shadow *s, struct ep_ent *e, bool owed)
{
	if (e->q1 && ep_queues_ours(s) && !s->qs[e->q1 - 1].dead)
		sdp_arm_q(e->c, e->fd, e->events, owed);
	else
		sdp_arm(e->c, e->fd, e->events);
}

/*
 * EPOLL_CTL_DEL of an SDP member parks it: its kernel registration (ours:
 * EPOLLIN for tokens and FIN) stays, the shadow entry stays on its queue,
 * and nothing of it is reported, armed or watched. An event loop that
 * deletes and adds a socket around every request (redis-benchmark: its
 * write event off, its read event on, and back, four epoll_ctl per request
 * on TCP) then makes no system call for it. The registration is really
 * removed when anything arrives on the socket (a token, the peer's FIN: a
 * parked member must not make the set's sleep end, filter()), when the
 * socket is closed (a duplicate of the descriptor would keep it in the
 * kernel set), falls back to TCP, or its number is added as another socket,
 * and when the process leaves SDP. Called locked.
 */
static bool parkable(struct ep_shadow *s, int i, struct sdp_conn *c)
{
	struct ep_ent *e = &s->v[i];
	return s->owner == sdp_pid && e->c == c && !e->pending && !e->connecting &&
	       atomic_load(&c->state) != SDP_ST_CONNECTING && !sdp_fallback_pending(c);
}

static void park(struct ep_shadow *s, int i)
{
	struct ep_ent *e = &s->v[i];
	count_parked(e, true);
	e->watching = false;
	e->seen = 0;
}

/* Out of the kernel set for real, and out of the shadow. A forked child's
 * copy of the set leaves the kernel set alone: the parent that parked the
 * member may add it back without a system call. */
void ep_unpark(struct ep_shadow *s, int i)
{
	struct ep_ent *e = &s->v[i];
	count_parked(e, false);
	if (s->owner == sdp_pid) {
		real_epoll_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, NULL);
		if (e->c)
			ep_wait_fd_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, e->c);
	}
	ep_remove_at(s, i);
}

void epoll_adopt(int fd, struct sdp_conn *c)
{
	if (!atomic_load(&pending_total))
		return;
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		int i = ep_find(s, fd);
		if (i >= 0 && s->v[i].pending) {
			struct ep_ent *e = &s->v[i];
			bool connecting = atomic_load(&c->state) == SDP_ST_CONNECTING;
			struct epoll_event kev = {
				.events = EPOLLIN | (connecting ? EPOLLOUT : 0),
				.data.u64 = TAG | (uint32_t)fd,
			};
			if (real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, fd, &kev) == 0) {
				ep_wait_fd_ctl(s->epfd, EPOLL_CTL_ADD, fd, c);
				e->c = c;
				count_pending(s, e, false);
				e->connecting = connecting;
				e->last_arrived = ep_arrived(c) - 1;
				e->last_acked = ep_acked(c) - 1;
				e->rep = fab_clock();
				e->q1 = queue_for(s, c);
				key_map(s, i);
				ep_arm(s, e, false);     /* as in epoll_ctl */
				ep_note_check(s, i);
			} else {
				ep_remove_at(s, i);
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
		for (int i = s->n - 1; i >= 0; i--) {
			struct ep_ent *e = &s->v[i];
			if (e->parked) {
				ep_unpark(s, i); /* the application deleted it */
				continue;
			}
			if (!e->c)
				continue;     /* pending: the kernel has its own */
			ep_wait_fd_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, e->c);
			struct epoll_event kev = {
				.events = e->disabled ? EPOLLONESHOT : e->events,
				.data = e->data,
			};
			/* (ENOENT: a socket replaced by its dead peer's bytes,
			 * ent_plain) */
			if (real_epoll_ctl(s->epfd, EPOLL_CTL_MOD, e->fd, &kev) < 0 &&
			    (errno != ENOENT ||
			     real_epoll_ctl(s->epfd, EPOLL_CTL_ADD, e->fd, &kev) < 0))
				sdp_log(0, "epoll fd %d: fd %d not given back to the kernel (%s)",
					s->epfd, e->fd, strerror(errno));
			e->c = NULL;
			s->reap = true;
			ent_unqueue(s, e);
		}
		pthread_mutex_unlock(&s->lock);
	}
	pthread_mutex_unlock(&all_lock);
}

/* fd, a socket that left SDP, is being closed: a parked entry of it goes
 * (with our registration, which a duplicate would keep). */
void epoll_drop_parked(int fd)
{
	if (atomic_load(&parked_total))
		epoll_forget_fd(fd);
}

void epoll_drop_pending(int fd)
{
	if (atomic_load(&pending_total))
		epoll_forget_fd(fd);      /* a plain socket's entries are pending */
}

EXPORT int epoll_ctl(int epfd, int op, int fd, struct epoll_event *ev)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(fd), 0)) {
		errno = EBADF;            /* the library's own (socket.c not_open) */
		return -1;
	}
	struct sdp_conn *c = sdp_fd_conn(fd);
	bool undecided = !c && op != EPOLL_CTL_DEL && fd_kind(fd) == FDK_INET;
	struct ep_shadow *s = ep_shadow_of(epfd, c != NULL || undecided);
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
	int i = ep_find(s, fd);
	int r;
	if (i >= 0 && s->v[i].parked && (op != EPOLL_CTL_ADD || s->v[i].c != c ||
					 s->v[i].connecting != connecting)) {
		if (op != EPOLL_CTL_ADD) {
			pthread_mutex_unlock(&s->lock);
			errno = ENOENT;           /* the application deleted it */
			return -1;
		}
		ep_unpark(s, i);                     /* not the same socket: afresh */
		i = -1;
	}
	if (op == EPOLL_CTL_DEL) {
		if (i >= 0 && parkable(s, i, c)) {
			park(s, i);
			r = 0;
		} else {
			r = real_epoll_ctl(epfd, op, fd, ev);
			if (r == 0)
				ep_wait_fd_ctl(epfd, EPOLL_CTL_DEL, fd, c);
			if (i >= 0)
				ep_remove_at(s, i);
		}
	} else {
		/* A MOD changes only the shadow: the kernel keeps our own
		 * registration (one system call less than on TCP); so does
		 * the ADD of a member the application deleted (parked). */
		bool parked = op == EPOLL_CTL_ADD && i >= 0 && s->v[i].parked;
		bool same = (op == EPOLL_CTL_MOD || (parked && s->owner == sdp_pid)) &&
			    i >= 0 && !s->v[i].pending &&
			    s->v[i].c == c && s->v[i].connecting == connecting;
		if (parked)
			count_parked(&s->v[i], false);
		r = same ? 0 : real_epoll_ctl(epfd, op, fd, &kev);
		if (r < 0 && errno == EEXIST && parked)
			/* A forked child adds what its parent parked: the
			 * registration is ours already. */
			r = real_epoll_ctl(epfd, EPOLL_CTL_MOD, fd, &kev);
		if (r == 0 && op == EPOLL_CTL_ADD && !same)
			ep_wait_fd_ctl(epfd, EPOLL_CTL_ADD, fd, c);
		if (r == 0) {
			struct ep_ent *e = ent_for(s, i, fd);
			if (!e) {
				pthread_mutex_unlock(&s->lock);
				real_epoll_ctl(epfd, EPOLL_CTL_DEL, fd, NULL);
				errno = ENOMEM;
				return -1;
			}
			count_pending(s, e, false);
			uint8_t q1 = 0;           /* the same connection keeps its queue */
			if (i >= 0 && e->c == c && e->q1)
				q1 = e->q1;
			else if (i >= 0)
				ent_unqueue(s, e);
			memset(e, 0, sizeof *e);
			e->fd = fd;
			e->c = c;
			e->events = ev->events;
			e->data = ev->data;
			e->connecting = connecting;
			e->last_arrived = ep_arrived(c) - 1;   /* edge: report current state */
			e->last_acked = ep_acked(c) - 1;
			e->rep = fab_clock();     /* TCP: ready now, queued now */
			e->q1 = q1 ? q1 : queue_for(s, c);
			key_map(s, (int)(e - s->v));
			/* No owed token here: an event loop that adds its
			 * socket after each request (redis-benchmark) would
			 * send one per request to a busy peer, and make it
			 * drain it. A queue member's owed tokens go out from
			 * arm_all every SDP_CHECK_MS (a token member's before
			 * every sleep, in sdp_arm). */
			ep_arm(s, e, false);
			ep_note_check(s, (int)(e - s->v));   /* ready already? */
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}
