/*
 * shm_region.c - where a connection's memory comes from and goes back to.
 *
 * A region (layout: shm_layout.h) is created by the connecting side and
 * passed to the accepting side as a memfd with the hello. Creating a
 * sealed memfd, mapping it on both sides, faulting its pages in and
 * tearing it all down again costs about as much as a loopback TCP
 * connect+accept, so regions are reused between the same processes, as
 * SMC-R reuses the buffers of a link group:
 *
 * Connecting side: an "arena" per peer process - one memfd divided into
 * equal slots, each one region. The accepting side maps the whole memfd,
 * so an arena only ever serves connections to one peer (the process that
 * created the listener, as SO_PEERCRED named it): no peer can see another
 * peer's connections. A slot is claimed with a CAS on the lease word in its
 * header (forked children share the arena and claim from it too). When the
 * connection is closed on our side the lease becomes CDONE; the slot is
 * claimed again only once the peer has marked its side closed (its last
 * write to the region) or the connect failed (no peer ever attached), so a
 * reused slot never has a writer from its previous life. Each arena keeps
 * its memfd open (kept at a high descriptor number). A busy peer gets more
 * arenas (SHM_PEER_ARENAS at most) when the slots of those it has are all
 * taken; SHM_ARENAS arenas in all, one with no connection of ours is
 * dropped to make room. A connection that finds no free slot gets a region
 * of its own as before.
 *
 * The set-up state word in the header (PROTOCOL.md section 4) decides by
 * CAS between the server attaching, the server declining (out of
 * resources: both ends use TCP) and the client abandoning (closed before
 * the server looked: both use TCP); see shm_ep_decline.
 *
 * Accepting side: mappings of received memfds are cached by (st_dev,
 * st_ino). A hello that names a slot of an arena we have mapped costs no
 * mmap and no page faults; the cache holds a mapping while a connection
 * uses it and, unused, for at most SHM_IDLE_NS and SHM_IDLE_MAX mappings.
 *
 * The lease only decides who may reuse a slot; nothing about it is trusted
 * from the peer beyond what a fresh region already allows (a same-user
 * peer that owns the memfd can write it at any time anyway).
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "fabric/shm_layout.h"
#include "sdp/sys.h"

enum shm_lease {
	LEASE_FREE  = 0,   /* never used: claim at will */
	LEASE_BUSY  = 1,   /* a connection of ours uses it */
	LEASE_CDONE = 2,   /* closed on our side; reusable once the peer is done */
};

#define SHM_MAPS      128                      /* mappings one process tracks */
#define SHM_IDLE_MAX  4                        /* unused mappings kept */
#define SHM_IDLE_NS   (2ull * 1000000000ull)   /* ... and for how long */
#define SHM_ARENA_FD_MIN 900                   /* keep our fd out of the way */

struct shm_map {                   /* one mapping of a memfd in this process */
	char    *base;                 /* NULL: free entry */
	size_t   len;
	uint64_t dev, ino;             /* identity of the memfd */
	int      fd;                   /* an arena of ours: the memfd we pass; else -1 */
	uint32_t refs;                 /* connections of this process using it */
	uint64_t idle_since;           /* CLOCK_MONOTONIC ns when refs became 0 */
	/* arenas only */
	int32_t  peer;                 /* the one process it serves */
	uint32_t nslots, slot_size;    /* geometry of its regions */
	uint32_t next;                 /* slot to look at first */
	size_t   slot_len;             /* bytes per slot (page multiple) */
};

#define SHM_ARENAS      48   /* arenas of ours in all */
#define SHM_PEER_ARENAS 24   /* ... and for one peer, each twice the one
			      * before up to 8 x region_cache slots: 1,400
			      * slots with the default 8 (a server tier with
			      * hundreds of connections open to one peer and
			      * as many closing) */

/* Private to the process (fork copies it, as fork copies the mappings). */
static struct shm_map maps[SHM_MAPS];
static uint32_t arena_slots = 8;   /* tunable: slots per arena, 0 = no reuse */
static pthread_mutex_t maps_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void lock_prepare(void) { pthread_mutex_lock(&maps_lock); }
static void lock_parent(void) { pthread_mutex_unlock(&maps_lock); }
static void lock_child(void) { pthread_mutex_unlock(&maps_lock); }   /* prepare's */
static void init_once(void) { pthread_atfork(lock_prepare, lock_parent, lock_child); }

static void lock(void)
{
	pthread_once(&once, init_once);
	pthread_mutex_lock(&maps_lock);
}
static void unlock(void) { pthread_mutex_unlock(&maps_lock); }

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void shm_init(const struct fab_params *p)
{
	arena_slots = p->region_cache > 64 ? 64 : p->region_cache;
	shm_win_init(p->ring_start, p->idle_trim_ms);
}

static size_t page_up(size_t n) { return (n + 4095) & ~(size_t)4095; }

bool shm_fits(uint32_t nslots, uint32_t slot_size)
{
	return page_up(region_size(nslots, slot_size)) <= SHM_MEMFD_MAX;
}

static struct shm_map *map_of(const void *p)
{
	for (int i = 0; i < SHM_MAPS; i++)
		if (maps[i].base && (const char *)p >= maps[i].base &&
		    (const char *)p < maps[i].base + maps[i].len)
			return &maps[i];
	return NULL;
}

/* Unmap cached mappings nobody uses: those idle too long, and the oldest
 * beyond SHM_IDLE_MAX. Our own arenas are not dropped here. */
static void trim(uint64_t now)
{
	int idle = 0;
	for (int i = 0; i < SHM_MAPS; i++) {
		struct shm_map *m = &maps[i];
		if (!m->base || m->refs || m->fd >= 0)
			continue;
		if (now - m->idle_since > SHM_IDLE_NS) {
			munmap(m->base, m->len);
			m->base = NULL;
		} else {
			idle++;
		}
	}
	while (idle > SHM_IDLE_MAX) {
		struct shm_map *old = NULL;
		for (int i = 0; i < SHM_MAPS; i++) {
			struct shm_map *m = &maps[i];
			if (m->base && !m->refs && m->fd < 0 &&
			    (!old || m->idle_since < old->idle_since))
				old = m;
		}
		munmap(old->base, old->len);
		old->base = NULL;
		idle--;
	}
}

static struct shm_map *map_slot(void)
{
	for (int i = 0; i < SHM_MAPS; i++)
		if (!maps[i].base)
			return &maps[i];
	return NULL;
}

static void hdr_init(struct shm_hdr *h, uint32_t nslots, uint32_t slot_size,
		     uint64_t token)
{
	/* Everything but the lease, which a forked sibling may be reading. */
	memset(h->side, 0, sizeof h->side);
	h->magic = SHM_MAGIC;
	h->version = SHM_VERSION;
	h->nslots = nslots;
	h->slot_size = slot_size;
	h->token = token;
	h->ring_off = SHM_HDR_SIZE;
	atomic_store(&h->state, SHM_ST_CONNECTING);
}

static void ep_init(struct fab_ep *ep, void *base, size_t len, uint32_t side,
		    uint32_t nslots, uint32_t slot_size, uint32_t flags)
{
	ep->ops = &fab_shm_ops;
	ep->base = base;
	ep->len = len;
	ep->side = side;
	ep->nslots = nslots;
	ep->slot_size = slot_size;
	ep->flags = flags;
	/* Our private copies of what we publish (the control blocks are
	 * zeroed): all zero. No link until one is attached. */
	memset(ep->priv, 0, sizeof ep->priv);
	SE(ep)->link = -1;
}

static int memfd_new(size_t len)
{
	int fd = (int)syscall(SYS_memfd_create, "sdp-conn",
			      MFD_CLOEXEC | MFD_ALLOW_SEALING);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) < 0 ||
	    sys_fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
		int e = -errno;
		sys_close(fd);
		return e;
	}
	return fd;
}

static bool arena_ours(struct shm_map *m)
{
	struct stat st;
	return sys_fstat(m->fd, &st) == 0 && (uint64_t)st.st_dev == m->dev &&
	       (uint64_t)st.st_ino == m->ino;
}

static void arena_drop(struct shm_map *m)
{
	munmap(m->base, m->len);
	if (arena_ours(m))
		sys_close(m->fd);
	m->base = NULL;
}

/* A new arena for peer (one more when those it has are full). At most
 * SHM_ARENAS arenas in all: beyond that the one idle longest (no
 * connection of ours in it) makes room, else NULL. Called locked. */
static struct shm_map *arena_new(int32_t peer, uint32_t nslots, uint32_t slot_size,
				 int nth)
{
	struct shm_map *idle = NULL;
	int narenas = 0;
	for (int i = 0; i < SHM_MAPS; i++) {
		struct shm_map *m = &maps[i];
		if (!m->base || m->fd < 0)
			continue;
		narenas++;
		if (!m->refs && (!idle || m->idle_since < idle->idle_since))
			idle = m;
	}
	if (narenas >= SHM_ARENAS) {
		if (!idle)
			return NULL;          /* every arena busy: a region of its own */
		arena_drop(idle);
	}
	struct shm_map *m = map_slot();
	if (!m)
		return NULL;
	/* The peer maps the whole arena: no more slots than its limit holds. */
	size_t slot_len = page_up(region_size(nslots, slot_size));
	size_t fit = SHM_MEMFD_MAX / slot_len;
	if (!fit)
		return NULL;
	/* A peer's first arena has region_cache slots, each further one
	 * twice as many up to 8 times (8, 16, 32, 64, 64, ... by default). */
	size_t want = (size_t)arena_slots << (nth < 3 ? nth : 3);
	size_t len = slot_len * (want < fit ? want : fit);
	int fd = memfd_new(len);
	if (fd < 0)
		return NULL;
	fd = sys_fd_keep(fd, SHM_ARENA_FD_MIN);
	struct stat st;
	void *base = sys_fstat(fd, &st) == 0 ?
		     mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
	if (base == MAP_FAILED) {
		sys_close(fd);
		return NULL;
	}
	*m = (struct shm_map){ .base = base, .len = len, .dev = (uint64_t)st.st_dev,
			       .ino = (uint64_t)st.st_ino, .fd = fd, .peer = peer,
			       .nslots = nslots, .slot_size = slot_size,
			       .slot_len = slot_len, .idle_since = now_ns() };
	return m;
}

/* An arena of ours our descriptor no longer names (the application closed
 * or replaced it: close loops, dup2): never passed again; its mapping stays
 * while connections use it. Called locked. */
static void arena_retire(struct shm_map *m)
{
	m->fd = -2;
	if (!m->refs) {
		munmap(m->base, m->len);
		m->base = NULL;
	}
}

static struct shm_hdr *slot_claim(struct shm_map *a, uint64_t *off, uint32_t *was);

/* A free slot of an arena serving peer: of those it has, else of a new
 * one while it has fewer than SHM_PEER_ARENAS (a busy peer's arenas grow,
 * so that sustained churn reuses slots instead of making a region per
 * connection). The arena is checked to be still ours (fstat) only when a
 * slot of it is taken. Called locked; NULL: a region of its own. */
static struct shm_hdr *arena_claim(int32_t peer, uint32_t nslots, uint32_t slot_size,
				   struct shm_map **out, uint64_t *off)
{
	if (!arena_slots || peer <= 0)
		return NULL;
	int mine = 0;
	uint32_t was;
	for (int i = 0; i < SHM_MAPS; i++) {
		struct shm_map *m = &maps[i];
		if (!m->base || m->fd < 0 || m->peer != peer || m->nslots != nslots ||
		    m->slot_size != slot_size)
			continue;
		mine++;
		struct shm_hdr *h = slot_claim(m, off, &was);
		if (!h)
			continue;
		if (arena_ours(m)) {
			*out = m;
			return h;
		}
		atomic_store(&h->lease, was);     /* not ours to pass any more */
		mine--;
		arena_retire(m);
	}
	if (mine >= SHM_PEER_ARENAS)
		return NULL;
	struct shm_map *m = arena_new(peer, nslots, slot_size, mine);
	struct shm_hdr *h = m ? slot_claim(m, off, &was) : NULL;
	if (h)
		*out = m;
	return h;
}

/* May the slot be claimed? Its previous connection must be over on both
 * sides: ours closed (CDONE) and the peer's closed mark set - or the
 * connect failed, so no peer ever attached. */
static bool slot_done(struct shm_hdr *h)
{
	uint32_t st = atomic_load(&h->state);
	return atomic_load(&h->side[1].closed) || st == SHM_ST_FAILED ||
	       st == SHM_ST_REFUSED;
}

static struct shm_hdr *slot_claim(struct shm_map *a, uint64_t *off, uint32_t *was)
{
	uint32_t n = (uint32_t)(a->len / a->slot_len);
	/* From the slot after the last one claimed: slots come back about
	 * in the order they were taken, so a big arena is not scanned whole
	 * (each look at a lease is a cache and TLB miss). */
	for (uint32_t k = 0; k < n; k++) {
		uint32_t i = (a->next + k) % n;
		struct shm_hdr *h = (void *)(a->base + (size_t)i * a->slot_len);
		uint32_t l = atomic_load(&h->lease);
		if (l == LEASE_BUSY || (l == LEASE_CDONE && !slot_done(h)))
			continue;
		if (atomic_compare_exchange_strong(&h->lease, &l, LEASE_BUSY)) {
			*was = l;
			a->next = i + 1;
			*off = (uint64_t)i * a->slot_len;
			return h;
		}
	}
	return NULL;
}

/* Our side's identity in a region we set up. */
static void side_init(struct fab_ep *ep, const struct fab_setup *s)
{
	atomic_store(&me(ep)->pid, s->pid);
}

/* A region for a new connection, mapped as side 0: a slot of the arena this
 * process keeps for the peer process when one is free, else a memfd of its
 * own. The offer names it for the peer. */
int shm_ep_offer(struct fab_ep *ep, const struct fab_setup *s, struct fab_offer *o)
{
	struct shm_offer so = { 0 };
	uint64_t off = 0;
	memset(o, 0, sizeof *o);
	lock();
	struct shm_map *a = NULL;
	struct shm_hdr *h = arena_claim(s->peer_pid, s->nslots, s->slot_size, &a, &off);
	if (h) {
		o->reused = h->magic == SHM_MAGIC;
		a->refs++;
		unlock();
		hdr_init(h, s->nslots, s->slot_size, s->token);
		ep_init(ep, h, region_size(s->nslots, s->slot_size), 0, s->nslots,
			s->slot_size, FAB_EP_POOLED);
		o->fds[0] = a->fd;            /* the arena's: kept open */
		so.flags = SHM_OFFER_POOLED;
	} else {
		unlock();
		size_t len = region_size(s->nslots, s->slot_size);
		int fd = memfd_new(len);
		if (fd < 0)
			return fd;
		h = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
		if (h == MAP_FAILED) {
			int e = -errno;
			sys_close(fd);
			return e;
		}
		hdr_init(h, s->nslots, s->slot_size, s->token);
		ep_init(ep, h, len, 0, s->nslots, s->slot_size, 0);
		o->fds[0] = fd;
		o->close_after = 1u << 0;     /* ours alone: the peer maps it */
	}
	side_init(ep, s);
	so.region_pg = (uint32_t)(off / 4096);
	o->nfds = 1;
	so.flags |= (uint32_t)shm_link_offer(ep, s->peer_pid, s->pid, o, &so.link_id);
	o->len = sizeof so;
	memcpy(o->data, &so, sizeof so);
	return 0;
}

/* Our last close comes first: if the server has not attached yet, take
 * the connection back for TCP (state ABANDONED) - the server, seeing it,
 * keeps the connection on TCP and marks its side closed - and the engine
 * re-sends what we posted on the TCP socket (our peer's marks say final
 * at position 0, shm.c unborn). Only once our TCP connect is done (a
 * connect still running keeps the old way: the server reads our ring). */
bool shm_ep_abandon(struct fab_ep *ep)
{
	if (ep->side != 0 || !ep->base)
		return false;
	uint32_t st = SHM_ST_CONNECTED;
	if (atomic_compare_exchange_strong(&H(ep)->state, &st, SHM_ST_ABANDONED))
		return true;
	return st == SHM_ST_ABANDONED || st == SHM_ST_REFUSED;
}

/* The server has attached (accepting side: we are the server). */
bool shm_ep_peer_up(struct fab_ep *ep)
{
	if (ep->side != 0 || atomic_load_explicit(&SE(ep)->peer_up, memory_order_relaxed))
		return true;
	if (atomic_load_explicit(&H(ep)->state, memory_order_relaxed) != SHM_ST_ATTACHED)
		return false;
	atomic_store_explicit(&SE(ep)->peer_up, 1, memory_order_relaxed);
	return true;
}

void shm_ep_connected(struct fab_ep *ep, int err)
{
	if (err) {
		atomic_store(&H(ep)->state, SHM_ST_FAILED);   /* nobody will attach */
		return;
	}
	uint32_t st = SHM_ST_CONNECTING;
	atomic_compare_exchange_strong(&H(ep)->state, &st, SHM_ST_CONNECTED);
}

/* Check a region header the peer wrote; n and sz are read once. */
static int hdr_check(struct shm_hdr *h, size_t room, uint32_t *n, uint32_t *sz)
{
	*n = h->nslots;
	*sz = h->slot_size;
	if (h->magic != SHM_MAGIC || h->version != SHM_VERSION ||
	    *n < 2 || *n > 4096 || *sz < 256 || *sz > (1u << 22) || (*sz & 63) ||
	    region_size(*n, *sz) > room)
		return -EPROTO;
	return 0;
}

static int seals_ok(int memfd)
{
	int seals = sys_fcntl(memfd, F_GET_SEALS, 0);
	return seals >= 0 && (seals & (F_SEAL_SHRINK | F_SEAL_GROW)) ==
			     (F_SEAL_SHRINK | F_SEAL_GROW);
}

/* A mapping of memfd from off, of its own (unmapped by shm_unmap): the
 * rest of the memfd (a region of its own), or, for a slot of an arena we
 * could not map whole, just that region (its header says how long). */
static int attach_own(struct fab_ep *ep, int memfd, const struct stat *st,
		      uint32_t side, uint64_t off, bool slot)
{
	if (!seals_ok(memfd))
		return -EPROTO;               /* peer could truncate under us */
	size_t len = (size_t)((uint64_t)st->st_size - off);
	if (slot) {
		struct shm_hdr *h = mmap(NULL, SHM_HDR_SIZE, PROT_READ, MAP_SHARED,
					 memfd, (off_t)off);
		if (h == MAP_FAILED)
			return -errno;
		uint32_t n, sz;
		int r = hdr_check(h, len, &n, &sz);
		munmap(h, SHM_HDR_SIZE);
		if (r < 0)
			return r;
		len = region_size(n, sz);
	}
	void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, memfd,
			  (off_t)off);
	if (base == MAP_FAILED)
		return -errno;
	uint32_t n, sz;
	if (hdr_check(base, len, &n, &sz) < 0) {
		munmap(base, len);
		return -EPROTO;
	}
	ep_init(ep, base, len, side, n, sz, 0);
	return 0;
}

static int attach(struct fab_ep *ep, int memfd, uint32_t side, uint64_t off,
		  bool pooled)
{
	struct stat st;
	if (sys_fstat(memfd, &st) < 0)
		return -errno;
	if ((size_t)st.st_size < SHM_HDR_SIZE || (uint64_t)st.st_size > SHM_MEMFD_MAX ||
	    (off & 4095) || off > (uint64_t)st.st_size - SHM_HDR_SIZE ||
	    (!pooled && off))
		return -EPROTO;
	if (!pooled)
		return attach_own(ep, memfd, &st, side, off, false);

	lock();
	struct shm_map *m = NULL;
	for (int i = 0; i < SHM_MAPS && !m; i++)
		if (maps[i].base && maps[i].fd == -1 && maps[i].dev == (uint64_t)st.st_dev &&
		    maps[i].ino == (uint64_t)st.st_ino)
			m = &maps[i];
	int r = m ? 1 : 0;
	if (!m) {
		trim(now_ns());
		m = map_slot();
		void *base = MAP_FAILED;
		if (m && seals_ok(memfd))
			base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE,
				    MAP_SHARED, memfd, 0);
		if (base == MAP_FAILED) {
			unlock();
			/* No room to cache it: map this region alone. */
			return attach_own(ep, memfd, &st, side, off, true);
		}
		*m = (struct shm_map){ .base = base, .len = (size_t)st.st_size,
				       .dev = (uint64_t)st.st_dev,
				       .ino = (uint64_t)st.st_ino, .fd = -1,
				       .idle_since = now_ns() };
	}
	struct shm_hdr *h = (void *)(m->base + off);
	uint32_t n, sz;
	if (hdr_check(h, m->len - off, &n, &sz) < 0) {
		unlock();
		return -EPROTO;
	}
	m->refs++;
	unlock();
	ep_init(ep, h, region_size(n, sz), side, n, sz, FAB_EP_POOLED);
	return r;
}

static void spare_reserve(void);

/* Map the region the client's offer names, as side 1, validating its
 * header; an offer of an earlier attempt of the same connection (another
 * token, or its client failed) is stale. */
int shm_ep_accept(struct fab_ep *ep, const struct fab_setup *s, const struct fab_offer *o)
{
	struct shm_offer so;
	if (o->len != sizeof so)
		return -EPROTO;
	memcpy(&so, o->data, sizeof so);
	lock();
	spare_reserve();                      /* for declining later (below) */
	unlock();
	if ((so.flags & ~(SHM_OFFER_POOLED | SHM_OFFER_LINK | SHM_OFFER_LINK_ID)) ||
	    (so.flags & SHM_OFFER_LINK && so.flags & SHM_OFFER_LINK_ID) ||
	    o->nfds != ((so.flags & SHM_OFFER_LINK) ? 3u : 1u))
		return -EPROTO;
	int r = attach(ep, o->fds[0], 1, (uint64_t)so.region_pg * 4096,
		       (so.flags & SHM_OFFER_POOLED) != 0);
	if (r < 0)
		return r;
	if (H(ep)->token != s->token) {
		shm_unmap(ep);
		ep->base = NULL;
		return -ESTALE;
	}
	/* Attaching is a CAS on the state: the client may be taking the
	 * connection back for TCP at its close (ABANDONED) at the same time.
	 * Nothing else of ours is written before we won. */
	uint32_t st = atomic_load(&H(ep)->state);
	for (;;) {
		if (st == SHM_ST_CONNECTING || st == SHM_ST_CONNECTED) {
			if (atomic_compare_exchange_weak(&H(ep)->state, &st,
							 SHM_ST_ATTACHED))
				break;
			continue;
		}
		if (st == SHM_ST_ABANDONED)   /* our last word: the slot is free */
			atomic_store(&H(ep)->side[1].closed, 1);
		shm_unmap(ep);
		ep->base = NULL;
		return st == SHM_ST_ABANDONED ? -ENOTCONN : -ESTALE;
	}
	side_init(ep, s);
	if (so.flags & (SHM_OFFER_LINK | SHM_OFFER_LINK_ID))
		shm_link_accept(ep, o, so.link_id, s->pid);
	return r;
}

/*
 * Declining an offer (PROTOCOL.md section 4): the server could not set up
 * its side (no address space or mapping for the region, no connection
 * slot) and tells the client, through the region's header, that both ends
 * use TCP. The header page is mapped over a page of address space kept in
 * reserve for this (MAP_FIXED over a mapping of ours neither grows the
 * address space nor adds a mapping), so that a server with RLIMIT_AS or
 * vm.max_map_count exhausted can still decline instead of resetting.
 * Called locked.
 */
static void *spare;                /* reserved PROT_NONE page, or NULL */

static void spare_reserve(void)
{
	if (!spare) {
		void *p = mmap(NULL, SHM_HDR_SIZE, PROT_NONE,
			       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
		spare = p == MAP_FAILED ? NULL : p;
	}
}

static void spare_restore(void)
{
	void *p = mmap(spare, SHM_HDR_SIZE, PROT_NONE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
	if (p == MAP_FAILED) {
		munmap(spare, SHM_HDR_SIZE);
		spare = NULL;
	}
}

static struct shm_hdr *hdr_map(int memfd, uint64_t off, bool *fixed)
{
	spare_reserve();
	*fixed = spare != NULL;
	void *p = mmap(spare, SHM_HDR_SIZE, PROT_READ | PROT_WRITE,
		       MAP_SHARED | (spare ? MAP_FIXED : 0), memfd, (off_t)off);
	if (p != MAP_FAILED)
		return p;
	if (spare)
		spare_restore();          /* a failed MAP_FIXED may have unmapped it */
	return NULL;
}

static void hdr_unmap(struct shm_hdr *h, bool fixed)
{
	if (fixed)
		spare_restore();
	else
		munmap(h, SHM_HDR_SIZE);
}

int shm_ep_decline(const struct fab_setup *s, const struct fab_offer *o, int wfd)
{
	struct shm_offer so;
	struct stat st;
	if (o->len != sizeof so || o->nfds < 1)
		return -EPROTO;
	memcpy(&so, o->data, sizeof so);
	uint64_t off = (uint64_t)so.region_pg * 4096;
	if ((so.flags & ~(SHM_OFFER_POOLED | SHM_OFFER_LINK | SHM_OFFER_LINK_ID)) ||
	    (!(so.flags & SHM_OFFER_POOLED) && off))
		return -EPROTO;
	if (sys_fstat(o->fds[0], &st) < 0)
		return -errno;
	if ((size_t)st.st_size < SHM_HDR_SIZE || (uint64_t)st.st_size > SHM_MEMFD_MAX ||
	    off > (uint64_t)st.st_size - SHM_HDR_SIZE || !seals_ok(o->fds[0]))
		return -EPROTO;
	lock();
	bool fixed;
	struct shm_hdr *h = hdr_map(o->fds[0], off, &fixed);
	if (!h) {
		int e = -errno;
		unlock();
		return e ? e : -ENOMEM;
	}
	int r = 0;
	if (h->magic != SHM_MAGIC || h->version != SHM_VERSION) {
		r = -EPROTO;
	} else if (h->token != s->token) {
		r = -ESTALE;
	} else {
		uint32_t v = atomic_load(&h->state);
		for (;;) {
			if (v == SHM_ST_CONNECTING || v == SHM_ST_CONNECTED) {
				if (!atomic_compare_exchange_weak(&h->state, &v,
								  SHM_ST_REFUSED))
					continue;
				r = 1;        /* declined: a token follows */
			} else if (v == SHM_ST_ABANDONED) {
				atomic_store(&h->side[1].closed, 1);
			} else {
				r = -ESTALE;  /* failed, or decided already */
			}
			break;
		}
	}
	hdr_unmap(h, fixed);
	unlock();
	if (r != 1)
		return r;
	/* The one token the client counts for a declined connection: it
	 * wakes a client asleep on the socket; written after the state, so
	 * the client that reads it finds the state too. Nothing of ours was
	 * on the socket before, and the application gets it only now. */
	r = shm_token_write(wfd);
	return r == 1 ? 0 : r;
}

/* This process no longer uses the region; the connection may live on in
 * another process (fork), so the shared endpoint is left as it is. */
void shm_unmap(struct fab_ep *ep)
{
	if (!ep->base)
		return;
	shm_link_put(ep);
	if (ep->flags & FAB_EP_POOLED) {
		lock();
		struct shm_map *m = map_of(ep->base);
		if (m && m->refs && --m->refs == 0) {
			uint64_t now = now_ns();
			m->idle_since = now;
			trim(now);
		}
		unlock();
	} else {
		munmap(ep->base, ep->len);
	}
}

/* The last holder of our side is done with the connection (our closed
 * mark is set): an arena slot of ours becomes reusable once the peer is
 * done too. */
void shm_detach(struct fab_ep *ep)
{
	if (ep->base && (ep->flags & FAB_EP_POOLED) && ep->side == 0)
		atomic_store(&H(ep)->lease, LEASE_CDONE);
	shm_unmap(ep);
	ep->base = NULL;
}
