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
#include "sdp/wake.h"

struct sdp_conn *sdp_fd_conn(int fd);

#define TAG      0x5344500000000000ull      /* "SDP" in the top bytes */
#define TAGQ     0x5344510000000000ull      /* "SDQ": a readiness queue */
#define TAGW     0x5344570000000000ull      /* "SDW": a wake descriptor */
#define TAG_MASK 0xffffff0000000000ull
#define EP_QMAX  8                          /* queues one set reads */
/* Token members from which a set looks at them only with news (lazy):
 * below, a look at each in every scan costs less than the token per
 * message that news while awake costs their peers. */
#define EP_LAZY_MIN 32
#define Q_IDX(q) ((unsigned)(q) & 0xffu)    /* fabric.h q_bind: low byte */

/* A readiness queue of the provider's (fabric.h q_bind) that this set reads
 * the wake-ups of some members from: one descriptor in the kernel set
 * (edge-triggered, tagged) for all of them. */
struct ep_queue {
	const struct fab_ops *ops;    /* NULL: free entry */
	int q;                        /* the provider's id */
	int fd;                       /* its descriptor, in the kernel set */
	int members;                  /* entries of the set on it */
	bool dead;                    /* gone: its members use tokens */
};

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
	uint8_t q1;                   /* 1 + index of its queue in the set's qs;
				       * 0: its wake-ups are tokens */
	bool looked;                  /* looked at since its last arm (a queue
				       * arm stays until a kick takes it) */
	bool tok_ok;                  /* on tokens, and its tokens arrive on its
				       * own socket (not a provider's wait
				       * descriptor): may be lazy (set at look) */
	bool parked;                  /* deleted by the application, still in
				       * the kernel set with our registration:
				       * not reported, armed nor watched, and its
				       * next EPOLL_CTL_ADD makes no system call
				       * (park(), unpark()) */
	uint32_t gen;                 /* the partial scan that listed it */
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
	struct ep_queue qs[EP_QMAX];  /* readiness queues it reads */
	/* What a scan looks at when not at every member (scan()): */
	int *check;                   /* members with news (popped keys, kernel
				       * events of their sockets), cap entries */
	int ncheck;
	int *hot;                     /* members the last scan found ready */
	int nhot;
	int nqueued;                  /* members on a live queue of ours */
	bool full;                    /* next scan looks at every member */
	uint64_t full_at;             /* and one at the latest then (ns) */
	uint32_t gen;
	int *kmap;                    /* queue key -> 1 + member index (a hint,
				       * checked), kcap entries */
	uint32_t kcap;
	bool kmap_inexact;            /* a queue member's key could not be mapped */
	int *fmap;                    /* fd -> 1 + member index: exact for every
				       * member unless fmap_inexact */
	uint32_t fcap;
	bool fmap_inexact;            /* a member's fd could not be mapped */
	bool reap;                    /* some member left SDP: remove it */
	bool token_shared;            /* a queue member's token had another
				       * watcher: sleep in slices */
	bool lazy;                    /* token members are looked at only with
				       * news, like queue members (EP_LAZY_MIN) */
	int nwatching;                /* members we watch during this sleep */
	uint32_t epoch;               /* local_changes at the last scan */
	pid_t qpid;                   /* the process they belong to (a forked
				       * child's copy of the set uses tokens) */
	pid_t owner;                  /* the process that made the shadow: only
				       * it parks members (a forked child
				       * sharing the kernel set must not remove
				       * the registrations its parent keeps) */
	uint64_t owed_ns;             /* when queue members last got kick_owed */
	uint32_t wk_ids[SDP_WAKE_SLOTS]; /* wake descriptors in the kernel set
				       * (edge-triggered), by their id; atomic
				       * (two sleeps may register one: EEXIST) */
	struct ep_shadow *next;
};

static int find_key(struct ep_shadow *s, uint32_t key);
static void note_check(struct ep_shadow *s, int i);
static void unpark(struct ep_shadow *s, int i);

static _Atomic uint32_t local_changes;

void epoll_local_change(void)
{
	atomic_fetch_add_explicit(&local_changes, 1, memory_order_release);
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
	x->dead = true;
	queue_unhold(s, x);
	s->full = true;                   /* its members: tokens, every scan */
	struct ep_shadow *me = s;
	atomic_compare_exchange_strong(&q_claim[Q_IDX(x->q)], &me, NULL);
}

/* Is this process the one that reads the set's queues? */
static bool queues_ours(const struct ep_shadow *s)
{
	return s->qpid && s->qpid == sdp_pid;
}

/* Take everything queue i has: its keys name the members the next scan
 * looks at. Returns how many keys it had, or marks it dead. */
static int queue_take(struct ep_shadow *s, int i)
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
				note_check(s, m);
		}
		if (n < 256)
			return total;
	}
}

/* The queues a sleeper counted itself on (and holds), to count itself off
 * the same ones (the set may drop or gain queues meanwhile). */
struct q_sleep {
	const struct fab_ops *ops[EP_QMAX];
	int q[EP_QMAX];
	int n;
};

/*
 * About to sleep: the queues' peers ring their descriptors only while a
 * waiter sleeps, so count ourselves in, then take what came since the
 * last look (a kick after our arm but before the count went up rang no
 * bell): true if something did - then do not sleep, look again.
 */
static bool queues_sleep(struct ep_shadow *s, struct q_sleep *z)
{
	z->n = 0;
	if (!queues_ours(s))
		return false;
	bool news = false;
	pthread_mutex_lock(&s->lock);
	for (int i = 0; i < EP_QMAX; i++) {
		struct ep_queue *x = &s->qs[i];
		if (!x->ops || x->dead)
			continue;
		if (x->ops->q_sleep(x->q, +1)) {
			/* Held until queues_wake: the set may give the queue
			 * up while we sleep. */
			z->ops[z->n] = x->ops;
			z->q[z->n++] = x->q;
		}
		if (queue_take(s, i) > 0)
			news = true;
	}
	pthread_mutex_unlock(&s->lock);
	return news;
}

static void queues_wake(struct q_sleep *z)
{
	for (int i = 0; i < z->n; i++)
		z->ops[i]->q_sleep(z->q[i], -1);
	z->n = 0;
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
static int find(struct ep_shadow *s, int fd)
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

static bool on_queue(const struct ep_shadow *s, const struct ep_ent *e)
{
	return e->c && e->q1 && !s->qs[e->q1 - 1].dead;
}

/* Looked at only with news (a popped key, an event of its socket), armed
 * only after a look, and watched by no sleep (filter takes its tokens):
 * a member on one of our queues, and in a lazy set one on tokens. */
static bool by_news(const struct ep_shadow *s, const struct ep_ent *e)
{
	if (!e->c)
		return false;
	if (on_queue(s, e))
		return queues_ours(s);
	return s->lazy && e->tok_ok;
}

/* The queue member whose key (sdp_q_bind: the connection's pool index) is
 * key, or -1: the map (exact for every queue member unless one could not
 * be mapped), else a walk. */
static int find_key(struct ep_shadow *s, uint32_t key)
{
	if (key < s->kcap) {
		int i = s->kmap[key] - 1;
		if (i >= 0 && i < s->n && on_queue(s, &s->v[i]) && s->v[i].c->idx == key)
			return i;
	}
	if (!s->kmap_inexact)
		return -1;
	for (int i = 0; i < s->n; i++)
		if (on_queue(s, &s->v[i]) && s->v[i].c->idx == key) {
			hint(&s->kmap, &s->kcap, key, i, 1u << 20);
			return i;
		}
	return -1;
}

/* Member i joined a queue (q1 set): map its key. */
static void key_map(struct ep_shadow *s, int i)
{
	struct ep_ent *e = &s->v[i];
	if (!on_queue(s, e))
		return;
	hint(&s->kmap, &s->kcap, e->c->idx, i, 1u << 20);
	if (e->c->idx >= s->kcap)
		s->kmap_inexact = true;
}

/* Member i has news: the next scan looks at it. Called locked. */
static void note_check(struct ep_shadow *s, int i)
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
static void remove_at(struct ep_shadow *s, int i)
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
	if (on_queue(s, e) && e->c->idx < s->kcap)
		s->kmap[e->c->idx] = i + 1;
	if (e->c)
		note_check(s, i);
}

void epoll_forget_fd(int fd)
{
	pthread_mutex_lock(&all_lock);
	for (struct ep_shadow *s = all; s; s = s->next) {
		pthread_mutex_lock(&s->lock);
		int i = find(s, fd);
		if (i >= 0 && s->v[i].parked)
			unpark(s, i);         /* the application deleted it: a
					       * duplicate must not keep it */
		else if (i >= 0)
			remove_at(s, i);
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

/* A member whose provider wakes it on a descriptor of its own (ofi: the
 * completion queue's wait object) has that one registered too, with the
 * member's tag; the TCP socket stays registered for the application's
 * later EPOLL_CTL_MOD / DEL and for a fallback. */
static void wait_fd_ctl(int epfd, int op, int fd, struct sdp_conn *c)
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
		s->fmap_inexact = true;   /* find() walks from now on */
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
		int i = find(s, fd);
		if (i >= 0 && s->v[i].parked)
			unpark(s, i);
		pthread_mutex_unlock(&s->lock);
	}
	int r = real_epoll_ctl(epfd, op, fd, ev);
	if (!s || r < 0)
		return r;
	pthread_mutex_lock(&s->lock);
	int i = find(s, fd);
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
		remove_at(s, i);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

/* Ask member e's peer for a kick: through the set's queue if it has one
 * (no system call on either side while we are awake), else a token on its
 * socket. Called locked. */
static void arm(struct ep_shadow *s, struct ep_ent *e, bool owed)
{
	if (e->q1 && queues_ours(s) && !s->qs[e->q1 - 1].dead)
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
static void unpark(struct ep_shadow *s, int i)
{
	struct ep_ent *e = &s->v[i];
	count_parked(e, false);
	if (s->owner == sdp_pid) {
		real_epoll_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, NULL);
		if (e->c)
			wait_fd_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, e->c);
	}
	remove_at(s, i);
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
				wait_fd_ctl(s->epfd, EPOLL_CTL_ADD, fd, c);
				e->c = c;
				count_pending(s, e, false);
				e->connecting = connecting;
				e->last_arrived = arrived(c) - 1;
				e->last_acked = acked(c) - 1;
				e->rep = fab_clock();
				e->q1 = queue_for(s, c);
				key_map(s, i);
				arm(s, e, false);     /* as in epoll_ctl */
				note_check(s, i);
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
		for (int i = s->n - 1; i >= 0; i--) {
			struct ep_ent *e = &s->v[i];
			if (e->parked) {
				unpark(s, i); /* the application deleted it */
				continue;
			}
			if (!e->c)
				continue;     /* pending: the kernel has its own */
			wait_fd_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, e->c);
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
	if (i >= 0 && s->v[i].parked && (op != EPOLL_CTL_ADD || s->v[i].c != c ||
					 s->v[i].connecting != connecting)) {
		if (op != EPOLL_CTL_ADD) {
			pthread_mutex_unlock(&s->lock);
			errno = ENOENT;           /* the application deleted it */
			return -1;
		}
		unpark(s, i);                     /* not the same socket: afresh */
		i = -1;
	}
	if (op == EPOLL_CTL_DEL) {
		if (i >= 0 && parkable(s, i, c)) {
			park(s, i);
			r = 0;
		} else {
			r = real_epoll_ctl(epfd, op, fd, ev);
			if (r == 0)
				wait_fd_ctl(epfd, EPOLL_CTL_DEL, fd, c);
			if (i >= 0)
				remove_at(s, i);
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
			wait_fd_ctl(epfd, EPOLL_CTL_ADD, fd, c);
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
			e->last_arrived = arrived(c) - 1;   /* edge: report current state */
			e->last_acked = acked(c) - 1;
			e->rep = fab_clock();     /* TCP: ready now, queued now */
			e->q1 = q1 ? q1 : queue_for(s, c);
			key_map(s, (int)(e - s->v));
			/* No owed token here: an event loop that adds its
			 * socket after each request (redis-benchmark) would
			 * send one per request to a busy peer, and make it
			 * drain it. A queue member's owed tokens go out from
			 * arm_all every SDP_CHECK_MS (a token member's before
			 * every sleep, in sdp_arm). */
			arm(s, e, false);
			note_check(s, (int)(e - s->v));   /* ready already? */
		}
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

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
		wait_fd_ctl(s->epfd, EPOLL_CTL_DEL, e->fd, c);
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
	if (!e->c || e->disabled || e->parked)
		return 0;
	e->looked = true;
	if (!e->q1 || s->qs[e->q1 - 1].dead)
		e->tok_ok = !e->connecting && fab_wait_fd(&e->c->ep, e->fd) == e->fd;
	struct ep_cand *k = &s->cand[*nc];
	uint32_t ev = ent_events(s, e, k);
	if (!ev && by_news(s, e)) {
		/* Nothing yet: arm it now, not at the next sleep, so that
		 * its next data brings news even while we stay awake - a
		 * partial scan sees a member only through news, and one that
		 * got data unseen while another got news later would be
		 * served after it (order, ARCHITECTURE 7). Then look again:
		 * the data may have come before the arm. */
		arm(s, e, false);
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
	if (!queues_ours(s))
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
	uint32_t lc = atomic_load_explicit(&local_changes, memory_order_acquire);
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
			queue_take(s, i);
	uint32_t g = ++s->gen;
	for (int k = 0; k < s->nhot; k++)
		look_once(s, s->hot[k], g, now, &nc);
	for (int k = 0; k < s->ncheck; k++)
		look_once(s, s->check[k], g, now, &nc);
	if (nq < s->n - s->npending)
		for (int i = 0; i < s->n; i++)
			if (!on_queue(s, &s->v[i]) && !by_news(s, &s->v[i]))
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
				remove_at(s, i);
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
		if (by_news(s, e)) {
			/* Its arm stays until a kick takes it - and then its
			 * key came (queue) or its token did (an event of its
			 * socket), and a scan looked at it. Its socket's
			 * tokens are taken by filter. */
			if (!e->disabled && (e->looked || owed)) {
				/* Looked at, its data may have come while
				 * it was not armed: the scan after the arms
				 * looks again. */
				arm(s, e, owed);
				note_check(s, i);
			}
			e->looked = false;
			continue;
		}
		if (!e->disabled)
			arm(s, e, owed);
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
			if (qi < EP_QMAX && s->qs[qi].ops && !s->qs[qi].dead && queues_ours(s))
				queue_take(s, (int)qi);
			pthread_mutex_unlock(&s->lock);
			continue;
		}
		if ((ev[i].data.u64 & TAG_MASK) == TAG) {
			int fd = (int)(uint32_t)ev[i].data.u64;
			pthread_mutex_lock(&s->lock);
			int j = find(s, fd);
			struct sdp_conn *c = NULL;
			bool mine = false;        /* we watch it only for this */
			if (j >= 0 && s->v[j].parked) {
				/* Something came for a socket the application
				 * deleted (a token, FIN): it stays readable, so
				 * remove it from the kernel set now; whoever
				 * waits on it next takes it. */
				unpark(s, j);
				j = -1;
			}
			if (j >= 0 && s->v[j].c) {
				note_check(s, j);
				if (s->v[j].watching) {
					c = s->v[j].c;
				} else if (on_queue(s, &s->v[j]) || by_news(s, &s->v[j])) {
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
 * the kernel as it is. */
static struct ep_shadow *members(int epfd)
{
	struct ep_shadow *s = shadow_of(epfd, false);
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
			/* Also collect what the kernel has, without waiting. */
			if (n < max) {
				int r = kernel_wait(epfd, ev + n, max - n, &zero, mask);
				if (r > 0)
					n += filter(s, ev + n, r);
			}
			return n;
		}
		struct q_sleep z;
		if (queues_sleep(s, &z)) {
			/* News came between the arms and now: look again. */
			queues_wake(&z);
			unwatch_all(s);
			sdp_wake_drop(wk);
			continue;
		}
		struct timespec ts;
		const struct timespec *tp = sdp_sleep_ts(deadline, shared, &ts);
		fab_held_push();                      /* fabric.h */
		int r = kernel_wait(epfd, ev, max, tp, mask);
		sdp_wake_drop(wk);
		queues_wake(&z);
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

EXPORT int epoll_wait(int epfd, struct epoll_event *ev, int max, int timeout)
{
	SDP_INIT();
	struct ep_shadow *s = members(epfd);
	if (!s && held(timeout))
		return held_wait(epfd, ev, max, timeout < 0 ? -1 : (int64_t)timeout * 1000000, NULL);
	if (!s)
		return real_epoll_wait(epfd, ev, max, timeout);
	return wait_common(s, epfd, ev, max, timeout < 0 ? -1 : (int64_t)timeout * 1000000, NULL);
}

EXPORT int epoll_pwait(int epfd, struct epoll_event *ev, int max, int timeout,
		       const sigset_t *mask)
{
	SDP_INIT();
	struct ep_shadow *s = members(epfd);
	if (!s && held(timeout))
		return held_wait(epfd, ev, max, timeout < 0 ? -1 : (int64_t)timeout * 1000000, mask);
	if (!s)
		return real_epoll_pwait(epfd, ev, max, timeout, mask);
	return wait_common(s, epfd, ev, max, timeout < 0 ? -1 : (int64_t)timeout * 1000000, mask);
}

EXPORT int epoll_pwait2(int epfd, struct epoll_event *ev, int max,
			const struct timespec *t, const sigset_t *mask)
{
	SDP_INIT();
	struct ep_shadow *s = members(epfd);
	int64_t to = t ? (int64_t)t->tv_sec * 1000000000 + t->tv_nsec : -1;
	if (!s && real_epoll_pwait2 && held(to))
		return held_wait(epfd, ev, max, to, mask);
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
