/*
 * shm_link.c - links: the wake-ups that all connections between the same
 * two processes share.
 *
 * A token on a connection's own TCP socket wakes exactly the thread that
 * sleeps on that socket, but it costs a TCP send and a receive per wake-up:
 * a server with hundreds of connections spends most of its time sending
 * one-byte tokens. A link (one per pair of processes, made by the
 * connecting process at its first connection to the peer process and
 * passed with its hellos) carries instead:
 *   - per side, a bitmap of the keys of that side's connections with news
 *     for it (the kicker sets the bit of the connection's key: one atomic
 *     OR, no system call);
 *   - a socket pair whose ends wake a side asleep on its end, with one
 *     bell for however many connections got news meanwhile, and only while
 *     a waiter of that side sleeps (sleepers; bell coalesces).
 * A waiter (the switch's epoll) arms a connection's queue route
 * (FAB_WAIT_Q) and reads the bitmap (q_pop); its own connections' keys come
 * back, never another process's. Layout: shm_layout.h, PROTOCOL.md 9.1.
 *
 * Who may use a link: each side's end is used by one process, its owner
 * (the page's owner word: the connecting process that made it; on the
 * accepting side the first process to attach a connection of it, or a
 * later one once that process is gone). Forked children and the other
 * workers of a server use tokens. Any process holding the page may kick
 * through it (set bits and ring the owner's end).
 *
 * Trust: the page is shared with the peer, who can set any bit (we then
 * look at a connection with nothing new) or clear ours (we miss a
 * wake-up of a connection with that peer only; the periodic check of the
 * waiters finds it). Descriptors the application may have closed or
 * replaced (daemons closing "all" fds) are checked by identity before we
 * write or read them.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fabric/shm_layout.h"
#include "sdp/log.h"
#include "sdp/sys.h"

#define SHM_LINKS      256         /* links one process keeps */
#define SHM_LINK_FD_MIN 900        /* keep our descriptors out of the way */

struct shm_link {                  /* process-private, copied by fork */
	struct shm_link_page *pg;      /* NULL: free entry */
	int      side;                 /* 0: we connected, 1: we accepted */
	int32_t  owner;                /* our pid (the page's owner[side]) */
	int32_t  peer;                 /* side 0: the peer process it serves */
	int      sock;                 /* our end of the socket pair */
	uint64_t sock_ino;             /* its identity */
	int      memfd;                /* side 0: the page's memfd (passed) */
	int      peer_end;             /* side 0: the other end (passed) */
	uint64_t dev, ino;             /* identity of the page's memfd */
	uint64_t peer_ino;             /* side 0: identity of peer_end */
	_Atomic bool dead;             /* the peer's end is closed, or one of
					* ours was taken from us */
	uint32_t users;                /* endpoints of this process naming it
					* (SE(ep)->link): reused only at 0 */
	_Atomic uint32_t holds;        /* its queue's readers: epoll sets that
					* read it (q_hold) and sleepers counted
					* on it (q_sleep); reused only at 0 too.
					* Taken under links_lock, or by a holder
					* without it; dropped without it */
	uint32_t gen;                  /* bumped each time the entry is filled:
					* a queue id names one filling (q_id) */
	int32_t  taker;                /* side 0: the accepting owner last seen
					* alive (owner[1]), 0: not yet looked */
	uint64_t taker_ns;             /* when (CLOCK_MONOTONIC ns); looked at
					* again SHM_LINK_RECHECK_NS later */
};

/* How long a connecting side trusts that the accepting process which took
 * a link is still alive (one kill(pid, 0) per link and period, not per
 * connection). A taker that died meanwhile costs the connections of that
 * period their link: the peer's next owner cannot use a link only named
 * (SHM_OFFER_LINK_ID), so their wake-ups are tokens. */
#define SHM_LINK_RECHECK_NS 100000000ull

static struct shm_link links[SHM_LINKS];
static pthread_mutex_t links_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

/* Test only (tests/c/t_epoll_qreuse.c): SDP_TEST_QUEUE_DELAY_US widens the
 * window between a queue's check and its use (q_window). 0: off. */
static uint32_t q_delay_us;

static void lock_prepare(void) { pthread_mutex_lock(&links_lock); }
static void lock_parent(void) { pthread_mutex_unlock(&links_lock); }
/* A forked child reads no queue: the holds are its parent's (its copies
 * of the parent's epoll sets use tokens). */
static void lock_child(void)
{
	pthread_mutex_unlock(&links_lock);    /* lock_prepare's, this thread's */
	for (int i = 0; i < SHM_LINKS; i++)
		atomic_store_explicit(&links[i].holds, 0, memory_order_relaxed);
}
static void init_once(void)
{
	pthread_atfork(lock_prepare, lock_parent, lock_child);
	const char *d = getenv("SDP_TEST_QUEUE_DELAY_US");
	if (d && *d)
		q_delay_us = (uint32_t)strtoul(d, NULL, 10);
}

static void lock(void)
{
	pthread_once(&once, init_once);
	pthread_mutex_lock(&links_lock);
}
static void unlock(void) { pthread_mutex_unlock(&links_lock); }

static int32_t self(void) { return (int32_t)syscall(SYS_getpid); }

static uint64_t mono_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static bool gone(int32_t pid)
{
	return pid <= 0 || (kill(pid, 0) < 0 && errno == ESRCH);
}

static int high(int fd)
{
	return sys_fd_keep(fd, SHM_LINK_FD_MIN);
}

static uint64_t ino_of(int fd, uint64_t *dev)
{
	struct stat st;
	if (sys_fstat(fd, &st) < 0)
		return 0;
	if (dev)
		*dev = (uint64_t)st.st_dev;
	return (uint64_t)st.st_ino;
}

/* Are our descriptors still ours (the application may close any fd)? */
static bool fds_ours(struct shm_link *k)
{
	if (ino_of(k->sock, NULL) != k->sock_ino)
		return false;
	if (k->side == 0) {
		uint64_t dev = 0;
		if (ino_of(k->memfd, &dev) != k->ino || dev != k->dev ||
		    ino_of(k->peer_end, NULL) != k->peer_ino)
			return false;
	}
	return true;
}

/* Forget a link of ours; its descriptors are closed only if still ours. */
static void drop(struct shm_link *k)
{
	bool ours = fds_ours(k);
	if (ours) {
		sys_close(k->sock);
		if (k->side == 0) {
			sys_close(k->memfd);
			sys_close(k->peer_end);
		}
	}
	munmap(k->pg, SHM_LINK_SIZE);
	k->pg = NULL;
}

/* A free entry; one whose peer or owner is gone is reused (me: our pid),
 * unless an endpoint of ours names it or a reader of its queue holds it
 * (an epoll set, or a sleeper between its check of the entry and its
 * count off the page). Locked: a hold is taken under the lock, or by a
 * holder, so none can come once this one saw none. */
static struct shm_link *entry(int32_t me)
{
	struct shm_link *reuse = NULL;
	for (int i = 0; i < SHM_LINKS; i++) {
		struct shm_link *k = &links[i];
		if (!k->pg)
			return k;
		if (!reuse && !k->users && !atomic_load(&k->holds) &&
		    (atomic_load(&k->dead) || k->owner != me ||
		     (k->side == 0 && gone(k->peer))))
			reuse = k;
	}
	if (reuse && reuse->owner == me)
		drop(reuse);
	else if (reuse)
		reuse->pg = NULL;             /* a parent's: its descriptors are
					       * the parent's to close */
	return reuse;
}

/* ---- connecting side ------------------------------------------------------ */

static int memfd_link(void)
{
	int fd = (int)syscall(SYS_memfd_create, "sdp-link", MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -1;
	if (ftruncate(fd, SHM_LINK_SIZE) < 0 ||
	    sys_fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		sys_close(fd);
		return -1;
	}
	return fd;
}

/* A new link to process peer (me: our pid). Locked. */
static struct shm_link *link_new(int32_t peer, int32_t me)
{
	struct shm_link *k = entry(me);
	if (!k)
		return NULL;
	int sv[2] = { -1, -1 };
	int mfd = memfd_link();
	if (mfd < 0)
		return NULL;
	if (syscall(SYS_socketpair, AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK | SOCK_CLOEXEC,
		    0, sv) < 0) {
		sys_close(mfd);
		return NULL;
	}
	struct shm_link_page *pg = mmap(NULL, SHM_LINK_SIZE, PROT_READ | PROT_WRITE,
					MAP_SHARED, mfd, 0);
	if (pg == MAP_FAILED) {
		sys_close(mfd);
		sys_close(sv[0]);
		sys_close(sv[1]);
		return NULL;
	}
	pg->magic = SHM_LINK_MAGIC;
	pg->version = SHM_LINK_VERSION;
	if (getrandom(&pg->id, sizeof pg->id, GRND_NONBLOCK) != sizeof pg->id)
		pg->id = (uint64_t)me << 32 ^ (uint64_t)(uintptr_t)pg;
	atomic_store(&pg->owner[0], me);
	uint32_t gen = k->gen + 1;
	*k = (struct shm_link){ .pg = pg, .side = 0, .owner = me, .peer = peer,
				.sock = high(sv[0]), .memfd = high(mfd),
				.peer_end = high(sv[1]) };
	k->gen = gen;
	k->sock_ino = ino_of(k->sock, NULL);
	k->ino = ino_of(k->memfd, &k->dev);
	k->peer_ino = ino_of(k->peer_end, NULL);
	atomic_store(&k->dead, false);
	sdp_log(3, "link %016llx to process %d made", (unsigned long long)pg->id, peer);
	return k;
}

/* The connecting side's offer (me: our pid, fab_setup's): add the link
 * with peer (made at the first connection to it) - its page's memfd and the
 * peer's end - so that the connection's wake-ups can go through it. No link
 * (out of descriptors or entries): the connection is offered without one.
 *
 * What is checked per connection is only what the offer hands over: our
 * descriptors (fds_ours) when they go with the hello; a link only named
 * passes none, and kick and pop check them before each use. Whether the
 * peer's process that took the link is alive is looked at once per
 * SHM_LINK_RECHECK_NS, not per connection. */
int shm_link_offer(struct fab_ep *ep, int32_t peer, int32_t me, struct fab_offer *o,
		   uint64_t *id)
{
	SE(ep)->link = -1;
	if (peer <= 0 || o->nfds != 1)
		return 0;
	lock();
	struct shm_link *k = NULL;
	for (int i = 0; i < SHM_LINKS && !k; i++) {
		struct shm_link *c = &links[i];
		if (c->pg && c->side == 0 && c->peer == peer && c->owner == me &&
		    !atomic_load(&c->dead))
			k = c;
	}
	int flag = 0;
	for (int round = 0; round < 2; round++) {
		if (!k)
			k = link_new(peer, me);
		if (!k)
			break;
		/* The descriptors go with our hellos until a process of the
		 * peer has taken the link or declined it; a taker that died
		 * leaves it to the next one. */
		int32_t o1 = atomic_load(&k->pg->owner[1]);
		if (o1 > 0) {
			uint64_t now = mono_ns();
			if (o1 != k->taker || now - k->taker_ns >= SHM_LINK_RECHECK_NS) {
				if (gone(o1) &&
				    atomic_compare_exchange_strong(&k->pg->owner[1], &o1, 0))
					o1 = 0;
				else
					k->taker = o1;
				k->taker_ns = now;
			}
		}
		if (o1 == 0 && !fds_ours(k)) {
			atomic_store(&k->dead, true);   /* a new one */
			k = NULL;
			continue;
		}
		if (o1 == 0) {
			o->fds[1] = k->memfd;
			o->fds[2] = k->peer_end;
			o->nfds = 3;      /* kept open: ours */
			flag = SHM_OFFER_LINK;
		} else if (o1 > 0) {
			flag = SHM_OFFER_LINK_ID;
		}
		SE(ep)->link = (int32_t)(k - links);
		k->users++;
		*id = k->pg->id;
		break;
	}
	unlock();
	return flag;
}

/* ---- accepting side -------------------------------------------------------- */

/* The accepting side (me: our pid, fab_setup's): the offer carries a link
 * (o->fds[1], o->fds[2]). The link already ours: use it. New: map and check
 * its page, and become the owner of our side if nobody (alive) is. Not ours
 * to use: the connection's wake-ups are tokens. The engine closes o->fds
 * afterwards. A link only named hands nothing over: its descriptor is
 * checked by kick and pop before each use, not here. */
void shm_link_accept(struct fab_ep *ep, const struct fab_offer *o, uint64_t id, int32_t me)
{
	SE(ep)->link = -1;
	if (o->nfds == 1) {
		/* Named only: ours if we took it. */
		lock();
		for (int i = 0; i < SHM_LINKS; i++) {
			struct shm_link *k = &links[i];
			if (k->pg && k->side == 1 && k->pg->id == id && k->owner == me &&
			    !atomic_load(&k->dead)) {
				SE(ep)->link = i;
				k->users++;
				break;
			}
		}
		unlock();
		return;
	}
	uint64_t dev = 0, ino = ino_of(o->fds[1], &dev);
	if (!ino)
		return;
	lock();
	for (int i = 0; i < SHM_LINKS; i++) {
		struct shm_link *k = &links[i];
		if (k->pg && k->side == 1 && k->dev == dev && k->ino == ino) {
			if (k->owner == me && !atomic_load(&k->dead) && fds_ours(k)) {
				SE(ep)->link = i;
				k->users++;
			}
			unlock();
			return;
		}
	}
	struct stat st;
	int seals = sys_fcntl(o->fds[1], F_GET_SEALS, 0);
	if (sys_fstat(o->fds[1], &st) < 0 || st.st_size != SHM_LINK_SIZE || seals < 0 ||
	    (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) != (F_SEAL_SHRINK | F_SEAL_GROW)) {
		unlock();
		return;
	}
	struct shm_link_page *pg = mmap(NULL, SHM_LINK_SIZE, PROT_READ | PROT_WRITE,
					MAP_SHARED, o->fds[1], 0);
	if (pg == MAP_FAILED) {
		unlock();
		return;
	}
	int32_t cur = atomic_load(&pg->owner[1]);
	struct shm_link *k = NULL;
	int so_type = 0;
	socklen_t sl = sizeof so_type;
	if (pg->magic == SHM_LINK_MAGIC && pg->version == SHM_LINK_VERSION &&
	    sys_getsockopt(o->fds[2], SOL_SOCKET, SO_TYPE, &so_type, &sl) == 0 &&
	    pg->id == id && so_type == SOCK_SEQPACKET && (cur == 0 || gone(cur)) &&
	    atomic_compare_exchange_strong(&pg->owner[1], &cur, me))
		k = entry(me);
	int sock = k ? sys_fcntl(o->fds[2], F_DUPFD_CLOEXEC, SHM_LINK_FD_MIN) : -1;
	/* Near the descriptor limit the link's descriptor would take one
	 * the application needs (a server at its limit would refuse every
	 * accept): tokens then. */
	struct rlimit rl;
	if (sock >= 0 && (getrlimit(RLIMIT_NOFILE, &rl) < 0 ||
			  (rl.rlim_cur != RLIM_INFINITY && (rlim_t)sock + 64 >= rl.rlim_cur))) {
		sys_close(sock);
		sock = -1;
	}
	sys_fd_mark(sock, true);
	if (sock < 0) {
		if (k)                /* no room for it: the client stops asking */
			atomic_store(&pg->owner[1], SHM_LINK_DECLINED);
		munmap(pg, SHM_LINK_SIZE);
		unlock();
		return;
	}
	uint32_t gen = k->gen + 1;
	*k = (struct shm_link){ .pg = pg, .side = 1, .owner = me, .sock = sock,
				.memfd = -1, .peer_end = -1, .dev = dev, .ino = ino };
	k->gen = gen;
	k->sock_ino = ino_of(sock, NULL);
	atomic_store(&k->dead, false);
	SE(ep)->link = (int32_t)(k - links);
	k->users = 1;
	unlock();
	sdp_log(3, "link %016llx adopted", (unsigned long long)pg->id);
}

/* This process no longer uses the endpoint (shm_unmap, shm_detach). */
void shm_link_put(struct fab_ep *ep)
{
	int32_t i = SE(ep)->link;
	if (i < 0 || i >= SHM_LINKS)
		return;
	lock();
	if (links[i].pg && links[i].users)
		links[i].users--;
	unlock();
}

/* ---- wake-ups through a link ---------------------------------------------- */

static struct shm_link *link_of(int32_t i)
{
	if (i < 0 || i >= SHM_LINKS)
		return NULL;
	struct shm_link *k = &links[i];
	return k->pg && !atomic_load_explicit(&k->dead, memory_order_relaxed) ? k : NULL;
}

/* A queue id names one link entry's one filling: a waiter that kept the id
 * of a link since gone never reads its successor in the same entry. */
#define Q_GEN_MASK 0x3fffffu
_Static_assert(SHM_LINKS <= 256, "a queue id keeps the entry in its low byte");
static int q_id(int32_t i) { return (int)((links[i].gen & Q_GEN_MASK) << 8 | (uint32_t)i); }

static struct shm_link *queue_of(int q)
{
	if (q < 0)
		return NULL;
	struct shm_link *k = link_of(q & 0xff);
	return k && (k->gen & Q_GEN_MASK) == (uint32_t)q >> 8 ? k : NULL;
}

/* The entry of a queue the caller holds (q_hold, q_sleep): neither dropped
 * nor filled again meanwhile, dead or not. */
static struct shm_link *held_of(int q)
{
	if (q < 0)
		return NULL;
	struct shm_link *k = &links[q & 0xff];
	return k->pg && (k->gen & Q_GEN_MASK) == (uint32_t)q >> 8 ? k : NULL;
}

/* One hold less; the release orders the holder's last use of the page and
 * descriptor before a drop that sees no hold. Never below 0. */
static void unhold(struct shm_link *k)
{
	uint32_t h = atomic_load_explicit(&k->holds, memory_order_relaxed);
	while (h && !atomic_compare_exchange_weak_explicit(&k->holds, &h, h - 1,
							   memory_order_release,
							   memory_order_relaxed))
		;
}

/* Test only (SDP_TEST_QUEUE_DELAY_US): sleep between the check of queue q's
 * entry k and the use of its page and descriptor, then make sure the entry
 * is still the one checked - dropped or filled again for another link
 * meanwhile, the caller would read an unmapped page or another link's
 * bell: abort rather than do that. */
static void q_window(const struct shm_link *k, int q)
{
	if (__builtin_expect(!q_delay_us, 1))
		return;
	struct shm_link_page *pg = k->pg;
	struct timespec ts = { .tv_sec = q_delay_us / 1000000,
			       .tv_nsec = (long)(q_delay_us % 1000000) * 1000 };
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
	if (k->pg != pg || (k->gen & Q_GEN_MASK) != (uint32_t)q >> 8) {
		sdp_log(0, "link entry %d dropped or reused while its queue %#x was in use",
			q & 0xff, (unsigned)q);
		abort();
	}
}

/* The kick of a queue arm the peer set (the bits q, already taken from its
 * arm word): mark the connection's key in the peer's news and ring its
 * end if a waiter of the peer sleeps and no bell is on its way. 1, or -1:
 * no usable link here (the caller sends a token instead). */
int shm_link_kick(struct fab_ep *ep, unsigned q)
{
	(void)q;
	struct shm_link *k = link_of(SE(ep)->link);
	if (!k)
		return -1;
	uint32_t key = atomic_load_explicit(&peer(ep)->link_key, memory_order_relaxed);
	if (key >= SHM_LINK_KEYS)
		return -1;
	struct shm_link_dir *d = &k->pg->dir[!k->side];
	atomic_fetch_or(&d->bits[key / 64], 1ull << (key % 64));
	atomic_fetch_or(&d->summary[key / 4096], 1ull << ((key / 64) % 64));
	atomic_thread_fence(memory_order_seq_cst);
	if (!atomic_load_explicit(&d->sleepers, memory_order_relaxed) ||
	    atomic_load_explicit(&d->bell, memory_order_relaxed) ||
	    atomic_exchange(&d->bell, 1))
		return 1;
	if (!fds_ours(k)) {
		atomic_store(&k->dead, true);
		atomic_store(&d->bell, 0);
		return -1;
	}
	static const unsigned char b = 0xB1;
	long r;
	do
		r = syscall(SYS_sendto, k->sock, &b, 1, MSG_DONTWAIT | MSG_NOSIGNAL, NULL, 0);
	while (r < 0 && errno == EINTR);
	if (r == 1 || errno == EAGAIN) {  /* full: the peer has bells to read */
		atomic_fetch_add_explicit(&d->rings, 1, memory_order_relaxed);
		return 1;
	}
	atomic_store(&k->dead, true);         /* the peer's end is closed */
	return -1;
}

int shm_q_bind(struct fab_ep *ep, uint32_t key)
{
	struct shm_link *k = link_of(SE(ep)->link);
	if (!k || key >= SHM_LINK_KEYS)
		return -1;
	int32_t pid = self();       /* a forked or vfork child is not the owner */
	if (k->owner != pid)
		return -1;
	atomic_store(&me(ep)->link_key, key);
	atomic_store(&SE(ep)->q_bound, pid);
	return q_id(SE(ep)->link);
}

/* An epoll set reads queue q from now on: its entry stays (its page
 * mapped, its descriptor open) until shm_q_release, even if the link dies
 * and no endpoint names it any more. Returns the descriptor, or -1: the
 * queue is gone, not ours, or its descriptor was taken from us. */
int shm_q_hold(int q)
{
	lock();
	struct shm_link *k = queue_of(q);
	int fd = -1;
	if (k && k->owner == self() && ino_of(k->sock, NULL) == k->sock_ino) {
		atomic_fetch_add_explicit(&k->holds, 1, memory_order_relaxed);
		fd = k->sock;
	}
	unlock();
	return fd;
}

void shm_q_release(int q)
{
	struct shm_link *k = held_of(q);
	if (k)
		unhold(k);
}

/* The descriptor of a queue we hold, while still ours (the application
 * may have closed the number and reused it: -1 then). */
int shm_q_fd(int q)
{
	struct shm_link *k = held_of(q);
	return k && k->owner == self() && ino_of(k->sock, NULL) == k->sock_ino ? k->sock : -1;
}

bool shm_q_pending(int q)
{
	struct shm_link *k = queue_of(q);
	if (!k)
		return false;
	q_window(k, q);
	struct shm_link_dir *d = &k->pg->dir[k->side];
	for (size_t w = 0; w < sizeof d->summary / sizeof d->summary[0]; w++)
		if (atomic_load_explicit(&d->summary[w], memory_order_acquire))
			return true;
	return false;
}

/* +1 (by a holder of q): counted as asleep on a live queue, and holding
 * it until the -1 - which comes after the sleep, when the set may have
 * given the queue up (another thread removed its last member). */
bool shm_q_sleep(int q, int delta)
{
	if (delta > 0) {
		struct shm_link *k = queue_of(q);
		if (!k)
			return false;
		atomic_fetch_add_explicit(&k->holds, 1, memory_order_relaxed);
		q_window(k, q);
		atomic_fetch_add(&k->pg->dir[k->side].sleepers, 1);
		atomic_thread_fence(memory_order_seq_cst);
		return true;
	}
	struct shm_link *k = held_of(q);
	if (!k)
		return false;
	q_window(k, q);
	atomic_fetch_sub(&k->pg->dir[k->side].sleepers, 1);
	unhold(k);
	return true;
}

/* Bells first (so that news set after this pop rings again), then the
 * bitmap, word by word; keys beyond max go back. */
int shm_q_pop(int q, uint32_t *keys, int max)
{
	struct shm_link *k = queue_of(q);
	if (!k || k->owner != self())
		return -EPIPE;
	q_window(k, q);
	struct shm_link_dir *d = &k->pg->dir[k->side];
	bool eof = false;
	if (atomic_load_explicit(&d->bell, memory_order_relaxed)) {
		atomic_store(&d->bell, 0);
		if (!fds_ours(k)) {
			atomic_store(&k->dead, true);
			return -EPIPE;
		}
		unsigned char buf[64];
		for (;;) {
			long r = syscall(SYS_recvfrom, k->sock, buf, sizeof buf, MSG_DONTWAIT,
					 NULL, NULL);
			if (r > 0)
				continue;
			if (r == 0)
				eof = true;
			else if (errno == EINTR)
				continue;
			break;
		}
	}
	int n = 0;
	for (size_t w = 0; w < sizeof d->summary / sizeof d->summary[0]; w++) {
		uint64_t sm = atomic_load_explicit(&d->summary[w], memory_order_relaxed);
		if (!sm)
			continue;
		sm = atomic_exchange(&d->summary[w], 0);
		while (sm) {
			unsigned b = (unsigned)__builtin_ctzll(sm);
			sm &= sm - 1;
			size_t wi = w * 64 + b;
			uint64_t bits = atomic_exchange(&d->bits[wi], 0);
			while (bits) {
				unsigned j = (unsigned)__builtin_ctzll(bits);
				if (n == max) {
					/* No room: the rest goes back. */
					atomic_fetch_or(&d->bits[wi], bits);
					atomic_fetch_or(&d->summary[w], (1ull << b) | sm);
					return n;
				}
				bits &= bits - 1;
				keys[n++] = (uint32_t)(wi * 64 + j);
			}
		}
	}
	if (eof && !n) {
		/* The peer's end is closed (its process is gone): its
		 * connections end through their own sockets. */
		atomic_store(&k->dead, true);
		return -EPIPE;
	}
	return n;
}
