/*
 * azsend.c - Asynchronous Zero Copy, the send side (az.h).
 *
 * az_send cuts a send into runs in stream order: the whole pages of each
 * large enough buffer element are advertised asynchronously (SrcAvail with
 * SDP_SA_ASYNC, at most zcopy_chunk bytes each, at most az_depth
 * outstanding), their pages write-protected first (azprot.c); everything
 * else - the partial pages at either end, small elements, memory that may
 * not be protected - goes by Buffer Copy (the paper's hybrid). The send
 * then returns the full count: the application may write its buffer at
 * once, the write waits (or copies aside) in the fault.
 *
 * Each advertisement this process made is remembered until the peer's
 * rd_done passes its id (RdmaRdCompl) - az_progress, called on every
 * library call on the connection, by the fault path and by the progress
 * thread - and then its pages are released. An advertisement can move:
 * the bytes are copied to a bounce buffer, entered in our table of moved
 * advertisements (struct sdp_az_thdr, its address in zctl az_table) and
 * the sink reads them there. A move and the sink's read exclude each other
 * by a handshake on our az_moving and the sink's reading words (each
 * stores its own, then looks at the other's: at most one goes on; the
 * sink's read wins and is waited for). Moves serve copy-on-write faults,
 * and memory the application gives back (free, munmap...) while read.
 *
 * A connection closed with advertisements outstanding stays with the
 * progress thread until they are read (TCP too delivers what a closed
 * socket still had to send); exit and exec wait for them; a hand-back to
 * TCP re-sends them from wherever they are (fallback.c).
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <sched.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>

#include "sdp/az.h"
#include "sdp/calib.h"
#include "sdp/iov.h"
#include "sdp/log.h"
#include "sdp/pool.h"
#include "sdp/proto.h"
#include "sdp/spin.h"
#include "sdp/sys.h"

#define PAGE 4096ul
#define PG_DOWN(a) ((uintptr_t)(a) & ~(PAGE - 1))
#define PG_UP(a) (((uintptr_t)(a) + PAGE - 1) & ~(PAGE - 1))

#define AZ_MAXADV 64
/* The whole pages of an element below this go by Buffer Copy. */
#define AZ_MIN_PAGES 4

struct az_adv {
	uint32_t  id;              /* our SrcAvail id; 0 = free entry */
	uint32_t  len;             /* bytes advertised */
	uintptr_t app;             /* the application's pages (page-aligned);
				    * 0 once moved */
	uintptr_t bounce;          /* where they moved to, or 0 */
};

struct az_conn {                   /* this process's AZ state of one connection */
	struct sdp_conn *c;
	uint64_t ino;              /* the TCP socket's inode (fd still names it?) */
	int      fd;               /* fd of the last AZ send: wake-ups; -1 none */
	uint8_t  linger;           /* closed: released once all is read */
	uint8_t  pad[3];
	int      linger_fd;        /* then our copy of the TCP socket, kept open
				    * until the peer has read (TCP lingers so) */
	_Atomic uint32_t nadv;     /* entries in use */
	uint32_t sends, faults;    /* the last window: sends, faults on them */
	uint32_t cool;             /* sends left to make synchronously */
	uint32_t cool_len;         /* how many the next cool-down lasts */
	struct sdp_az_thdr *table; /* our moved advertisements, or NULL */
	size_t   table_len;
	struct az_adv adv[AZ_MAXADV];
};

static struct az_conn **azc;            /* by connection slot */
static uint32_t *live;                  /* slots with state */
static uint32_t nlive;
static pthread_once_t azc_once = PTHREAD_ONCE_INIT;

static void azc_init(void)
{
	void *p = az_mmap(SDP_POOL_CONNS * (sizeof *azc + sizeof *live));
	if (p == MAP_FAILED)
		return;
	azc = p;
	live = (uint32_t *)(azc + SDP_POOL_CONNS);
	az_lib_range((uintptr_t)p, SDP_POOL_CONNS * (sizeof *azc + sizeof *live));
}

static inline struct az_conn *ac_of(struct sdp_conn *c)
{
	return azc ? __atomic_load_n(&azc[c->idx], __ATOMIC_ACQUIRE) : NULL;
}

/* Under az_lock. */
static struct az_conn *ac_get(struct sdp_conn *c, int fd)
{
	struct az_conn *ac = azc[c->idx];
	if (ac && ac->c == c) {
		if (fd >= 0)
			ac->fd = fd;
		return ac;
	}
	void *p = az_mmap(sizeof *ac);
	if (p == MAP_FAILED)
		return NULL;
	ac = p;
	ac->c = c;
	ac->ino = c->tcp_ino;
	ac->fd = fd;
	ac->linger_fd = -1;
	ac->cool_len = sdp_tun.az_cool;
	az_lib_add((uintptr_t)p, sizeof *ac);
	live[nlive++] = c->idx;
	__atomic_store_n(&azc[c->idx], ac, __ATOMIC_RELEASE);
	return ac;
}

/* Under az_lock: nothing outstanding, forget it. */
static void ac_free(struct az_conn *ac)
{
	uint32_t idx = ac->c->idx;
	for (uint32_t i = 0; i < nlive; i++)
		if (live[i] == idx) {
			live[i] = live[--nlive];
			break;
		}
	__atomic_store_n(&azc[idx], NULL, __ATOMIC_RELEASE);
	if (ac->table) {
		/* The address stays published while other processes share
		 * the connection: theirs may be there too. */
		if (atomic_load(&ac->c->nproc) <= 1 &&
		    atomic_load(&sdp_zc_me(ac->c)->az_table) == (uint64_t)(uintptr_t)ac->table) {
			atomic_store(&sdp_zc_me(ac->c)->az_table, 0);
			sdp_zc_publish(ac->c, az_table, az_table);
		}
		az_lib_forget((uintptr_t)ac->table);
		az_munmap(ac->table, ac->table_len);
	}
	az_lib_forget((uintptr_t)ac);
	az_munmap(ac, sizeof *ac);
}

static bool id_done(uint32_t rd, uint32_t id)
{
	return (int32_t)(rd - id) >= 0;
}

static bool conn_dead(struct sdp_conn *c)
{
	return sdp_is_reset(c) || atomic_load(&c->peer_gone) || atomic_load(&c->fb_done) ||
	       sdp_marked(c, FAB_M_CLOSED | FAB_M_ABORT | FAB_M_FB);
}

/* Is the process that reads our advertisements gone (it died, or left
 * without closing)? Only for the slow paths: a socket we no longer hold
 * (a lingering close) or nobody waits on (exit) tells us nothing. */
static bool peer_vanished(struct sdp_conn *c)
{
	pid_t p1 = c->peer_pid, p2 = atomic_load(&sdp_zc_peer(c)->pid);
	bool gone1 = p1 <= 0 || (kill(p1, 0) < 0 && errno == ESRCH);
	bool gone2 = p2 <= 0 || p2 == p1 || (kill(p2, 0) < 0 && errno == ESRCH);
	return gone1 && gone2;
}

static void set_outstanding(struct az_conn *ac)
{
	__atomic_store_n(&ac->c->st.az_outstanding, (uint64_t)atomic_load(&ac->nadv),
			 __ATOMIC_RELAXED);
}

/* Under az_lock: the advertisement is read (or void): release its pages. */
static void adv_finish(struct az_conn *ac, struct az_adv *a)
{
	if (a->app)
		az_span_put(a->app, a->app + a->len);
	if (a->bounce) {
		if (ac->table) {
			struct sdp_az_tent *t = (struct sdp_az_tent *)(ac->table + 1);
			struct sdp_az_tent *e = &t[a->id % ac->table->nslots];
			if (e->id == a->id)
				e->id = 0;
		}
		if (!az_pool_put(a->bounce, PG_UP(a->len))) {
			az_lib_forget(a->bounce);
			az_munmap((void *)a->bounce, PG_UP(a->len));
		}
	}
	memset(a, 0, sizeof *a);
	atomic_fetch_sub(&ac->nadv, 1);
}

/* Under az_lock: finish what the peer has read; everything if the
 * connection is gone (nothing will be read: TCP drops a reset
 * connection's unsent data too) or was handed back to TCP. */
static void complete_locked(struct az_conn *ac)
{
	struct sdp_conn *c = ac->c;
	uint32_t rd = atomic_load(&sdp_zc_peer(c)->rd_done);
	bool dead = conn_dead(c);
	for (int i = 0; i < AZ_MAXADV && atomic_load(&ac->nadv); i++) {
		struct az_adv *a = &ac->adv[i];
		if (a->id && (dead || id_done(rd, a->id)))
			adv_finish(ac, a);
	}
	set_outstanding(ac);
}

void az_progress(struct sdp_conn *c)
{
	struct az_conn *ac = ac_of(c);
	if (!ac || !atomic_load_explicit(&ac->nadv, memory_order_relaxed))
		return;
	sigset_t ss;
	az_lock(&ss);
	if (azc[c->idx] == ac)
		complete_locked(ac);
	az_unlock(&ss);
}

bool az_busy(struct sdp_conn *c)
{
	struct az_conn *ac = ac_of(c);
	return ac && atomic_load(&ac->nadv);
}

/* Under az_lock. */
static uint32_t outstanding_locked(void)
{
	uint32_t n = 0;
	for (uint32_t i = 0; i < nlive; i++) {
		struct az_conn *ac = azc[live[i]];
		if (ac)
			n += atomic_load(&ac->nadv);
	}
	return n;
}

uint32_t az_outstanding_all(void)
{
	if (!azc || !nlive)
		return 0;
	sigset_t ss;
	az_lock(&ss);
	uint32_t n = outstanding_locked();
	az_unlock(&ss);
	return n;
}

/* Lingering connections whose advertisements are all read (or void):
 * make their release now (the progress thread, exit). */
static void linger_finish(void)
{
	for (;;) {
		struct sdp_conn *done = NULL;
		int lfd = -1;
		sigset_t ss;
		az_lock(&ss);
		for (uint32_t i = 0; i < nlive && !done; i++) {
			struct az_conn *ac = azc[live[i]];
			if (!ac || !ac->linger)
				continue;
			complete_locked(ac);
			if (atomic_load(&ac->nadv) && peer_vanished(ac->c)) {
				sdp_log(1, "the peer left with %u asynchronous advertisement(s) "
					"of a closed connection unread",
					(unsigned)atomic_load(&ac->nadv));
				for (int k = 0; k < AZ_MAXADV; k++)
					if (ac->adv[k].id)
						adv_finish(ac, &ac->adv[k]);
			}
			if (atomic_load(&ac->nadv))
				continue;
			done = ac->c;
			lfd = ac->linger_fd;
			ac_free(ac);
		}
		az_unlock(&ss);
		if (!done)
			return;
		/* the release the close deferred; then our copy of the socket
		 * goes (for the last holder: the FIN after the last byte) */
		sdp_release(done, lfd);
		if (lfd >= 0)
			sys_close(lfd);
	}
}

void az_progress_all(void)
{
	if (!azc || !nlive)
		return;
	sigset_t ss;
	az_lock(&ss);
	bool linger = false;
	for (uint32_t i = 0; i < nlive; i++) {
		struct az_conn *ac = azc[live[i]];
		if (!ac)
			continue;
		complete_locked(ac);
		linger |= ac->linger != 0;
	}
	az_unlock(&ss);
	if (linger)
		linger_finish();
}

/* ---- waiting for the peer's read ------------------------------------------ */

/* Until the peer read id on c (or c is gone), at most until deadline (ns):
 * spin a little, then sleep on the TCP socket as its watcher (the peer
 * kicks us for FAB_WAIT_ZC after each read), else nap. Any thread, no
 * lock held; also from a fault handler (only system calls and atomics). */
static bool wait_read(struct sdp_conn *c, int fd, uint64_t ino, uint32_t id,
		      uint64_t deadline)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	bool fd_ok = false;
	if (fd >= 0) {
		struct stat st;
		fd_ok = sys_fstat(fd, &st) == 0 && (uint64_t)st.st_ino == ino;
	}
	uint64_t spin_end = sdp_now_ns() + 50000;
	for (unsigned n = 0;; n++) {
		if (id_done(atomic_load(&pz->rd_done), id) || conn_dead(c))
			return true;
		uint64_t now = sdp_now_ns();
		if (now >= deadline)
			return false;
		if (now < spin_end) {
			sdp_cpu_relax();
			if ((n & 255) == 255)
				sched_yield();
			continue;
		}
		ep->ops->arm(ep, FAB_WAIT_ZC);
		if (id_done(atomic_load(&pz->rd_done), id))
			continue;
		int ms = (int)((deadline - now) / 1000000);
		if (ms > 10)
			ms = 10;
		if (ms < 1)
			ms = 1;
		if (fd_ok && sdp_watch(c)) {
			sdp_kick_owed(c, fd);
			struct pollfd p = { .fd = fd, .events = POLLIN };
			if (sys_poll(&p, 1, ms) > 0)
				sdp_on_wakeup(c, fd);
			sdp_unwatch(c);
		} else {
			struct timespec nap = { 0, 100000 };
			nanosleep(&nap, NULL);
		}
	}
}

bool az_wait_range(uintptr_t start, uintptr_t end, uint32_t max_ms)
{
	uint64_t deadline = sdp_now_ns() + (uint64_t)max_ms * 1000000ull;
	for (;;) {
		struct sdp_conn *c = NULL;
		int fd = -1;
		uint64_t ino = 0;
		uint32_t id = 0;
		sigset_t ss;
		az_lock(&ss);
		for (uint32_t i = 0; i < nlive && !c; i++) {
			struct az_conn *ac = azc[live[i]];
			if (!ac)
				continue;
			complete_locked(ac);
			for (int k = 0; k < AZ_MAXADV; k++) {
				struct az_adv *a = &ac->adv[k];
				if (a->id && a->app && a->app < end && start < a->app + a->len &&
				    (!c || (int32_t)(a->id - id) > 0)) {
					c = ac->c;
					id = a->id;
					fd = ac->fd;
					ino = ac->ino;
				}
			}
		}
		az_unlock(&ss);
		if (!c)
			return true;
		if (!wait_read(c, fd, ino, id, deadline))
			return false;
	}
}

/* ---- moving an advertisement aside (copy-on-write) ------------------------- */

/* Tables inherited from the parent by a forked child: kept mapped (their
 * address is the one published for the connection, which the child's own
 * table must take) until the child makes its table there. */
#define AZ_SPARE 16
static struct { uintptr_t at; size_t len; } spare[AZ_SPARE];
static int nspare;

static void *spare_take(uintptr_t at, size_t len)
{
	for (int i = 0; i < nspare; i++)
		if (spare[i].at == at && spare[i].len == len) {
			spare[i] = spare[--nspare];
			memset((void *)at, 0, len);
			return (void *)at;
		}
	return MAP_FAILED;
}

/* Under az_lock: our table of moved advertisements for ac, published.
 * One address is published per side of a connection, but every process
 * that shares the connection (fork) may have to move its own
 * advertisements: each keeps its table at that same address in its own
 * memory (the sink reads the table of the SrcAvail's key process). So a
 * table is made where the published one is, if that is free here. */
static bool table_ready(struct az_conn *ac)
{
	struct sdp_conn *c = ac->c;
	struct sdp_zctl *z = sdp_zc_me(c);
	bool alone = atomic_load(&c->nproc) <= 1;
	if (!ac->table) {
		uint32_t n = c->ep.nslots;
		size_t len = PG_UP(sizeof(struct sdp_az_thdr) + (size_t)n * sizeof(struct sdp_az_tent));
		uint64_t at = atomic_load(&z->az_table);
		void *p = at ? spare_take((uintptr_t)at, len) : MAP_FAILED;
		bool lib = p != MAP_FAILED;           /* a spare is listed already */
		if (p == MAP_FAILED && at)
			p = az_mmap_at((uintptr_t)at, len);
		if (p == MAP_FAILED && (!at || alone))
			p = az_mmap(len);             /* anywhere: ours is published */
		if (p == MAP_FAILED)
			return false;
		ac->table = p;
		ac->table_len = len;
		ac->table->magic = SDP_AZ_TABLE_MAGIC;
		ac->table->pid = (int32_t)sdp_pid;
		ac->table->nslots = n;
		if (!lib)
			az_lib_add((uintptr_t)p, len);
	}
	uint64_t mine = (uint64_t)(uintptr_t)ac->table, cur = atomic_load(&z->az_table);
	if (cur == mine)
		return true;
	if (cur != 0 && !alone)
		return false;                 /* another process's, not free here */
	atomic_store(&z->az_table, mine);
	sdp_zc_publish(c, az_table, az_table);
	return true;
}

/* One copy aside made by the current az_move_range: advertisements of
 * exactly the same pages moved together share it (their bytes are the
 * pages' bytes: protected since each was made). */
struct az_moved {
	uintptr_t app;             /* the pages copied, 0 = none yet */
	uint32_t  len;             /* their bytes */
	uintptr_t bounce;          /* the copy (in the pool) */
};

/* Under az_lock: move one advertisement. 1 moved (or read meanwhile),
 * 0 not now (the sink reads it: it finishes first; or the pool is full
 * and !may_map: the caller waits for the peer's read), -1 cannot. */
static int move_one(struct az_conn *ac, struct az_adv *a, bool may_map,
		    struct az_moved *last)
{
	struct sdp_conn *c = ac->c;
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = sdp_zc_me(c), *pz = sdp_zc_peer(c);
	if (id_done(atomic_load(&pz->rd_done), a->id) || conn_dead(c)) {
		adv_finish(ac, a);
		return 1;
	}
	if (!table_ready(ac))
		return -1;
	/* The handshake: our mark first, then a look at the sink's. */
	if (ep->ops->zc_cas(ep, FAB_OURS, offsetof(struct sdp_zctl, az_moving), 0, a->id) != 0)
		return 0;                     /* another process moves one now */
	sdp_zc_publish(c, az_moving, az_moving);
	if (atomic_load(&pz->reading) == a->id) {
		atomic_store(&z->az_moving, 0);   /* the sink won: it reads first */
		sdp_zc_publish(c, az_moving, az_moving);
		return 0;
	}
	size_t blen = PG_UP(a->len);
	uintptr_t b = 0;
	bool shared = last->app == a->app && last->len == a->len && last->bounce;
	if (shared) {
		b = last->bounce;
		az_pool_share(b);
	} else {
		b = az_pool_get(blen);
	}
	bool mapped = false;
	if (!b && may_map) {
		void *m = az_mmap(blen);
		if (m != MAP_FAILED) {
			b = (uintptr_t)m;
			mapped = true;
		}
	}
	if (!b) {
		atomic_store(&z->az_moving, 0);
		sdp_zc_publish(c, az_moving, az_moving);
		return may_map ? -1 : 0;
	}
	if (!shared)
		memcpy((void *)b, (const void *)a->app, a->len);
	struct sdp_az_tent *t = (struct sdp_az_tent *)(ac->table + 1);
	struct sdp_az_tent *e = &t[a->id % ac->table->nslots];
	e->len = a->len;
	e->addr = (uint64_t)b;
	__atomic_store_n(&e->id, a->id, __ATOMIC_RELEASE);
	atomic_store_explicit(&z->az_moving, 0, memory_order_release);
	sdp_zc_publish(c, az_moving, az_moving);
	if (mapped)
		az_lib_add(b, blen);
	else if (!shared) {
		last->app = a->app;
		last->len = a->len;
		last->bounce = b;
	}
	az_span_put(a->app, a->app + a->len);
	a->app = 0;
	a->bounce = b;
	if (!shared)
		az_count(&c->st.az_cow_copies, 1);
	return 1;
}

int az_move_range(uintptr_t start, uintptr_t end, bool may_map)
{
	int all = 1;
	struct az_moved last = { 0, 0, 0 };
	if (!azc)
		return 1;
	for (uint32_t i = 0; i < nlive; i++) {
		struct az_conn *ac = azc[live[i]];
		if (!ac)
			continue;
		for (int k = 0; k < AZ_MAXADV; k++) {
			struct az_adv *a = &ac->adv[k];
			if (!a->id || !a->app || a->app >= end || start >= a->app + a->len)
				continue;
			if (move_one(ac, a, may_map, &last) != 1)
				all = 0;
		}
	}
	return all;
}

/* Under az_lock: a fault (or a release) found pages of [start, end) in
 * flight: count it on the connections whose advertisements they hold. */
void az_count_fault(uintptr_t start, uintptr_t end)
{
	if (!azc)
		return;
	for (uint32_t i = 0; i < nlive; i++) {
		struct az_conn *ac = azc[live[i]];
		if (!ac)
			continue;
		for (int k = 0; k < AZ_MAXADV; k++) {
			struct az_adv *a = &ac->adv[k];
			if (a->id && a->app && a->app < end && start < a->app + a->len) {
				az_count(&ac->c->st.az_faults, 1);
				ac->faults++;
				break;
			}
		}
	}
}

/* ---- sending ------------------------------------------------------------- */

/* The calling thread's stack (never protected: the kernel writes locals
 * there, and a signal frame). */
static __thread uintptr_t stk_lo, stk_hi;

static bool on_stack(uintptr_t s, uintptr_t e)
{
	if (!stk_hi) {
		pthread_attr_t at;
		void *addr;
		size_t sz;
		if (pthread_getattr_np(pthread_self(), &at) == 0) {
			if (pthread_attr_getstack(&at, &addr, &sz) == 0) {
				stk_lo = (uintptr_t)addr;
				stk_hi = (uintptr_t)addr + sz;
			}
			pthread_attr_destroy(&at);
		}
		if (!stk_hi) {
			stk_lo = 1;
			stk_hi = 1;
		}
	}
	/* The main thread's stack may grow below what was reported. */
	uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
	uintptr_t lo = stk_lo < sp - (8u << 20) ? stk_lo : sp - (8u << 20);
	return s < stk_hi && lo < e;
}

/* Buffer-copy stream bytes [off, off + n) of the iovec, waiting for
 * credits (a blocking send). 0, or -errno with *posted the bytes posted. */
static int post_bcopy(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
		 size_t off, size_t n, size_t *posted, bool partial)
{
	struct fab_ep *ep = &c->ep;
	size_t payload = ep->slot_size - sizeof(struct sdp_bsdh);
	*posted = 0;
	while (*posted < n) {
		if (ep->ops->credits(ep) == 0) {
			int r = sdp_wait(c, fd, FAB_WAIT_CREDIT,
					 partial || *posted ? SDP_WAIT_PARTIAL : 0, &c->tx_lock);
			if (!r && (sdp_fallback_pending(c) || sdp_is_reset(c) ||
				   atomic_load(&c->peer_gone)))
				r = sdp_fallback_pending(c) ? -SDP_EFALLBACK : -EPIPE;
			if (r)
				return r;
			continue;
		}
		size_t k = n - *posted < payload ? n - *posted : payload;
		sdp_post_msg(c, fd, SDP_MID_DATA, iov, iovcnt, off + *posted, k);
		*posted += k;
		c->tx_stream += k;
		c->st.tx_bcopy_bytes += k;
	}
	return 0;
}

/* Advertise [p, p + n) (whole pages) asynchronously as id: room in the
 * pipeline and a credit are there. 0, or -errno (nothing done). */
static int advertise(struct sdp_conn *c, int fd, uintptr_t p, size_t n)
{
	sigset_t ss;
	az_lock(&ss);
	struct az_conn *ac = ac_get(c, fd);
	int r = ac ? 0 : -ENOMEM;
	struct az_adv *slot = NULL;
	if (!r) {
		for (int k = 0; k < AZ_MAXADV && !slot; k++)
			if (!ac->adv[k].id)
				slot = &ac->adv[k];
		if (!slot)
			r = -EBUSY;
	}
	if (!r)
		r = az_span_hold(p, p + n, AZ_SEND);
	if (!r) {
		/* The table of moved advertisements is made before it is
		 * needed, so that a child forked from now on finds its
		 * address free and can keep its own there. */
		if (!ac->table)
			table_ready(ac);
		slot->id = ++c->src_id;
		slot->len = (uint32_t)n;
		slot->app = p;
		atomic_fetch_add(&ac->nadv, 1);
		ac->sends++;
		set_outstanding(ac);
	}
	az_unlock(&ss);
	if (r)
		return r;
	struct sdp_srcavail sa = {
		.id = slot->id,
		.len = (uint32_t)n,
		.addr = (uint64_t)p,
		.key = (int32_t)sdp_pid,
		.flags = SDP_SA_ASYNC,
	};
	struct iovec sv = { &sa, sizeof sa };
	sdp_post_msg(c, fd, SDP_MID_SRC_AVAIL, &sv, 1, 0, sizeof sa);
	c->tx_stream += n;
	c->st.tx_azcopy_bytes += n;
	return 0;
}

/* The `auto` AZ threshold: per protection mechanism, from the per-host
 * measurements (calib.c: a file read once they are cached). 0 = never. */
static pthread_once_t thresh_once = PTHREAD_ONCE_INIT;
static uint32_t thresh_mprotect, thresh_uffd, thresh_low;
static _Atomic int thresh_mech = -1;     /* the one this process uses */

static void thresh_resolve(void)
{
	struct sdp_calib cal;
	sdp_calib_get_az(sdp_tun.slot_size, false, &cal);
	thresh_mprotect = sdp_calib_az_thresh(&cal, AZ_MECH_MPROTECT, NULL);
	thresh_uffd = sdp_calib_az_thresh(&cal, AZ_MECH_UFFD, NULL);
	uint32_t m = thresh_mprotect ? thresh_mprotect : UINT32_MAX;
	uint32_t u = thresh_uffd ? thresh_uffd : UINT32_MAX;
	thresh_low = m < u ? m : u;
	sdp_log(2, "asynchronous zero copy threshold (%s%s): %u bytes with mprotect, "
		"%u with userfaultfd (0 = never: a copy costs less than protecting)",
		cal.faked ? "simulated" : cal.cached ? "cached in " : "measured, cached in ",
		cal.faked ? "" : cal.path, thresh_mprotect, thresh_uffd);
}

bool az_big_enough(size_t n)
{
	if (!sdp_tun.azcopy_auto)
		return n >= sdp_tun.azcopy_thresh;
	if (n < 4096)
		return false;
	pthread_once(&thresh_once, thresh_resolve);
	/* Below both mechanisms' thresholds: no need to choose one yet (that
	 * starts the progress thread). */
	if (n < thresh_low)
		return false;
	int m = atomic_load_explicit(&thresh_mech, memory_order_relaxed);
	if (m < 0) {
		m = az_mech_default();
		atomic_store(&thresh_mech, m);
		uint32_t t = m == AZ_MECH_UFFD ? thresh_uffd : thresh_mprotect;
		sdp_log(1, "asynchronous zero copy from %u bytes (%s, measured)%s", t,
			m == AZ_MECH_UFFD ? "userfaultfd" : "mprotect",
			t ? "" : ": never, a copy costs less than protecting the pages here");
	}
	uint32_t t = m == AZ_MECH_UFFD ? thresh_uffd : m == AZ_MECH_MPROTECT ?
		     thresh_mprotect : 0;
	return t && n >= t;
}

/* Does this send qualify, and how many advertisements may be out? */
static uint32_t az_depth_for(struct sdp_conn *c, int fd, size_t total)
{
	if (!az_on() || !azc || !az_big_enough(total))
		return 0;
	/* The peer tells whether it can read us (adv_max 0: it cannot). The
	 * synchronous zero-copy threshold does not apply: what pays here is
	 * not one copy against two but the send returning at once. */
	zc_probe(c, fd);
	uint32_t depth = atomic_load(&sdp_zc_peer(c)->adv_max);
	if (depth > sdp_tun.az_depth)
		depth = sdp_tun.az_depth;
	if (depth > AZ_MAXADV)
		depth = AZ_MAXADV;
	if (depth >= c->ep.nslots)
		depth = c->ep.nslots - 1;
	return depth;
}

/* Faults on most of the last sends: the application touches its buffers
 * right away, and a synchronous send costs less than the faults (the
 * paper's fall-back to ZSDP). Under az_lock. */
static bool cooling(struct az_conn *ac)
{
	if (ac->cool) {
		ac->cool--;
		return true;
	}
	if (ac->sends >= 16) {
		if (ac->faults * 4 > ac->sends * 3 && sdp_tun.az_cool) {
			ac->cool = ac->cool_len;
			if (ac->cool_len < 16 * sdp_tun.az_cool)
				ac->cool_len *= 2;
		} else if (ac->faults * 4 < ac->sends) {
			ac->cool_len = sdp_tun.az_cool;
		}
		ac->sends = 0;
		ac->faults = 0;
	}
	return false;
}

ssize_t az_send(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
		size_t total, bool *used)
{
	*used = false;
	pthread_once(&azc_once, azc_init);
	uint32_t depth = az_depth_for(c, fd, total);
	if (!depth || atomic_load(&c->zc_sending) || az_mech_default() == AZ_MECH_NONE)
		return 0;
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	{
		sigset_t ss;
		az_lock(&ss);
		struct az_conn *ac = ac_get(c, fd);
		bool cool = !ac || cooling(ac);
		if (ac)
			complete_locked(ac);
		az_unlock(&ss);
		if (cool)
			return 0;
	}
	*used = true;
	size_t chunk = sdp_tun.zcopy_chunk;
	size_t off = 0;                       /* stream offset handled so far */
	size_t brun = 0;                      /* bytes from off on to Buffer-copy */
	int r = 0;
	zc_set_mode(c, SDP_MODE_PIPELINED);
	for (int i = 0; i < iovcnt && !r; i++) {
		uintptr_t b = (uintptr_t)iov[i].iov_base, e = b + iov[i].iov_len;
		uintptr_t ms = PG_UP(b), me = PG_DOWN(e);
		if (me <= ms || me - ms < AZ_MIN_PAGES * PAGE || on_stack(b, e)) {
			brun += iov[i].iov_len;       /* all of it by Buffer Copy */
			continue;
		}
		brun += ms - b;                   /* the head */
		for (uintptr_t p = ms; p < me && !r;) {
			size_t n = me - p < chunk ? me - p : chunk;
			/* Room: a credit (two if a ModeChange is due) and a
			 * free place in the pipeline; the Buffer Copy run
			 * before it goes first. */
			if (brun) {
				size_t posted;
				r = post_bcopy(c, fd, iov, iovcnt, off, brun, &posted, off > 0);
				off += posted;
				brun -= posted;
				if (r)
					break;
			}
			uint32_t need = c->mode_msg ? 2 : 1;
			/* One load of rd_done for both the test and the mark:
			 * a read completed between two loads would move the
			 * mark past the value the test saw full, and the wait
			 * (rd_done != mark) would then sleep for a read that
			 * already happened - for ever, with the sink idle. */
			uint32_t rd = atomic_load(&pz->rd_done);
			if (ep->ops->credits(ep) < need || c->src_id - rd >= depth) {
				bool room = ep->ops->credits(ep) < need;
				c->zc_mark = rd;
				c->zc_spin_us = (uint32_t)(chunk / 12000);
				r = sdp_wait(c, fd, room ? FAB_WAIT_CREDIT : FAB_WAIT_ZC,
					     off ? SDP_WAIT_PARTIAL : 0, &c->tx_lock);
				az_progress(c);
				if (!r && sdp_fallback_pending(c))
					r = -SDP_EFALLBACK;
				if (!r && (sdp_is_reset(c) || atomic_load(&c->peer_gone)))
					r = -EPIPE;
				continue;
			}
			if (c->mode_msg)
				zc_post_mode(c, fd);
			int a = advertise(c, fd, p, n);
			if (a) {
				/* Not protectable (the library's memory, a
				 * shared mapping, no room): Buffer Copy. */
				sdp_log(3, "asynchronous send of %zu bytes at %p: %s; Buffer Copy",
					n, (void *)p, strerror(-a));
				brun += n;
			} else {
				off += n;
			}
			p += n;
		}
		brun += e - me;                   /* the tail */
	}
	if (!r && brun) {
		size_t posted;
		r = post_bcopy(c, fd, iov, iovcnt, off, brun, &posted, off > 0);
		off += posted;
	}
	if (r && off == 0)
		return r;
	return (ssize_t)off;
}

/* ---- close, exit, exec, hand-back, fork ------------------------------------- */

bool az_linger(struct sdp_conn *c, int fd)
{
	struct az_conn *ac = ac_of(c);
	if (!ac)
		return false;
	sigset_t ss;
	az_lock(&ss);
	if (azc[c->idx] != ac || ac->linger) {
		az_unlock(&ss);
		return ac->linger;
	}
	complete_locked(ac);
	/* TCP answers a close with unread data with a reset, which drops what
	 * it still had to send: so do we. */
	bool abort = sdp_is_reset(c) || atomic_load(&c->linger0) || sdp_fionread(c) > 0;
	int lfd = -1;
	if (atomic_load(&ac->nadv) && !abort)
		lfd = fd >= 0 ? sys_fcntl(fd, F_DUPFD_CLOEXEC, 900) : -1;
	if (lfd < 0) {
		if (atomic_load(&ac->nadv) && !abort) {
			/* No descriptor to linger with: wait here. */
			az_unlock(&ss);
			az_drain(10000);
			az_lock(&ss);
		}
		for (int k = 0; k < AZ_MAXADV; k++)
			if (ac->adv[k].id)
				adv_finish(ac, &ac->adv[k]);
		if (azc[c->idx] == ac)
			ac_free(ac);
		az_unlock(&ss);
		return false;
	}
	/* Keep the TCP socket open (our copy) and the connection ours until
	 * the peer has read: its FIN comes after the last byte, the peer's
	 * wake-ups land on an open socket, another holder cannot free it. */
	ac->linger = 1;
	ac->linger_fd = lfd;
	ac->fd = lfd;
	uint32_t n = atomic_load(&ac->nadv);
	az_unlock(&ss);
	sdp_log(2, "close with %u asynchronous advertisement(s) unread: kept until "
		"the peer has read them", (unsigned)n);
	az_prog_start();
	az_prog_kick();
	return true;
}

void az_conn_drop(struct sdp_conn *c)
{
	struct az_conn *ac = ac_of(c);
	if (!ac)
		return;
	sigset_t ss;
	az_lock(&ss);
	if (azc[c->idx] == ac) {
		for (int k = 0; k < AZ_MAXADV; k++)
			if (ac->adv[k].id)
				adv_finish(ac, &ac->adv[k]);
		set_outstanding(ac);
		if (!ac->linger)
			ac_free(ac);
	}
	az_unlock(&ss);
}

uint64_t az_adv_bounce(struct sdp_conn *c, uint32_t id)
{
	struct az_conn *ac = ac_of(c);
	uint64_t b = 0;
	if (!ac)
		return 0;
	sigset_t ss;
	az_lock(&ss);
	for (int k = 0; k < AZ_MAXADV; k++)
		if (ac->adv[k].id == id && ac->adv[k].bounce)
			b = ac->adv[k].bounce;
	az_unlock(&ss);
	return b;
}

void az_drain(uint32_t idle_ms)
{
	if (!azc || !nlive)
		return;
	uint32_t last = UINT32_MAX;
	uint64_t since = sdp_now_ns();
	for (unsigned round = 0;; round++) {
		if ((round & 63) == 63) {
			/* peers that left will read nothing more */
			sigset_t ss;
			az_lock(&ss);
			for (uint32_t i = 0; i < nlive; i++) {
				struct az_conn *ac = azc[live[i]];
				if (ac && atomic_load(&ac->nadv) && peer_vanished(ac->c))
					for (int k = 0; k < AZ_MAXADV; k++)
						if (ac->adv[k].id)
							adv_finish(ac, &ac->adv[k]);
			}
			az_unlock(&ss);
		}
		az_progress_all();
		uint32_t n = az_outstanding_all();
		if (!n)
			return;
		uint64_t now = sdp_now_ns();
		if (n != last) {
			last = n;
			since = now;
		} else if (now - since > (uint64_t)idle_ms * 1000000ull) {
			sdp_log(0, "asynchronous zero copy: %u advertisement(s) still unread "
				"after %u ms without progress: given up", n, idle_ms);
			return;
		}
		struct timespec nap = { 0, 500000 };
		nanosleep(&nap, NULL);
	}
}

/* The connections this process alone holds and is about to lose (exit;
 * exec, for close-on-exec ones) end as the kernel would end them: FIN
 * after the last byte. Then we wait until the peer has read what we
 * advertised, and take the wake-ups it sent meanwhile off the socket -
 * closed with unread bytes, the kernel would answer with a reset. With
 * our FIN in, the peer owes us no further wake-up (wait.c). */
static void end_held(bool cloexec_only)
{
	struct sdp_conn *cs[64];
	int fds[64], n = 0;
	if (azc) {
		sigset_t ss;
		az_lock(&ss);
		for (uint32_t i = 0; i < nlive && n < 64; i++) {
			struct az_conn *ac = azc[live[i]];
			struct stat st;
			if (!ac || ac->linger || ac->fd < 0 || atomic_load(&ac->c->nproc) != 1 ||
			    sys_fstat(ac->fd, &st) != 0 || (uint64_t)st.st_ino != ac->ino)
				continue;
			if (cloexec_only && !(sys_fcntl(ac->fd, F_GETFD, 0) & FD_CLOEXEC))
				continue;
			cs[n] = ac->c;
			fds[n++] = ac->fd;
		}
		az_unlock(&ss);
	}
	for (int i = 0; i < n; i++)
		if (!sdp_is_reset(cs[i]))
			sdp_shutdown(cs[i], fds[i], SHUT_WR);
	az_drain(10000);
	for (int i = 0; i < n; i++) {
		struct fab_ep *ep = &cs[i]->ep;
		/* Nothing more is waited for: no further kick may send a
		 * token. One that took our arm bit just before is counted
		 * (tokens_due) a moment after it took it - the peer's last
		 * read publishes rd_done, then kicks: a short grace covers
		 * the count still to come. */
		ep->ops->disarm(ep, FAB_WAIT_ALL | FAB_WAIT_QALL);
		uint64_t now = sdp_now_ns();
		uint64_t until = now + 100000000ull, grace = now + 5000000ull;
		for (;;) {
			bool due = ep->ops->tokens_due(ep) != 0;
			now = sdp_now_ns();
			if (now >= until || (!due && now >= grace))
				break;
			struct pollfd p = { .fd = fds[i], .events = POLLIN };
			if (sys_poll(&p, 1, due ? 10 : 1) > 0) {
				int d = ep->ops->drain(ep, fds[i]);
				if (d == 1 || (d < 0 && d != -EAGAIN && d != -EINTR))
					break;                /* the peer closed or is gone */
			}
		}
	}
}

void az_before_exec(void)
{
	if (!az_on())
		return;
	/* The new image has none of this memory: what the peer still has to
	 * read of it must be read now, and the application's own SIGSEGV
	 * action goes back (an ignored SIGSEGV stays ignored across exec). */
	az_recv_settle(NULL);
	end_held(true);
	az_sig_restore();
}

void az_fork_prepare(void)
{
	if (!az_on())
		return;
	az_recv_settle(NULL);
	az_prot_lock_fork(true);
}

void az_fork_parent(void)
{
	if (!az_on())
		return;
	az_prot_lock_fork(false);
}

void az_fork_child(void)
{
	if (!az_on())
		return;
	/* The parent's advertisements stay the parent's: the child forgets
	 * them, and its copies of their pages and bounce buffers are its own. */
	if (azc) {
		for (uint32_t i = 0; i < nlive; i++) {
			struct az_conn *ac = azc[live[i]];
			if (!ac)
				continue;
			for (int k = 0; k < AZ_MAXADV; k++)
				if (ac->adv[k].bounce && !az_pool_owns(ac->adv[k].bounce))
					az_munmap((void *)ac->adv[k].bounce, PG_UP(ac->adv[k].len));
			if (ac->linger_fd >= 0)
				sys_close(ac->linger_fd);   /* the parent's to keep */
			if (ac->table) {
				/* kept: its address is where ours must go */
				if (nspare < AZ_SPARE) {
					spare[nspare].at = (uintptr_t)ac->table;
					spare[nspare++].len = ac->table_len;
				} else {
					az_munmap(ac->table, ac->table_len);
				}
			}
			azc[live[i]] = NULL;
			az_munmap(ac, sizeof *ac);
		}
		nlive = 0;
	}
	az_pool_fork_child();
	az_prot_fork_child();
	az_recv_fork_child();
	az_prog_forget();
}

/* At exit: what the peers still have to read of this process's memory is
 * read before the memory goes (TCP would still deliver it). */
void az_at_exit(void)
{
	if (!az_on())
		return;
	az_recv_settle(NULL);
	end_held(false);
}
