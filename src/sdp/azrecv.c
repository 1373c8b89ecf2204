/*
 * azrecv.c - Asynchronous Zero Copy, the receive side (az.h).
 *
 * Where the bytes of an asynchronous SrcAvail are (az_src_addr): where it
 * was advertised, unless the source moved them (copy-on-write, azsend.c);
 * then its table of moved advertisements, in its own memory, says where.
 * The sink marks the read (`reading`) before it looks at the source's
 * az_moving, the source marks its move before it looks at `reading`: a
 * read never runs while the bytes move.
 *
 * Asynchronous receive: a blocking recv() that meets a SrcAvail already
 * there takes the whole pages of its buffer as a receive in flight: they
 * are dropped and registered with the userfaultfd for missing pages, so
 * every access to them - the application's, the kernel's on its behalf -
 * waits until the progress thread has copied the data in (UFFDIO_COPY
 * maps each filled page and wakes whoever waits for it). The recv()
 * returns at once. The partial pages at either end are read at once.
 * The advertisement counts as read (rd_done) only when the copy is done,
 * and until then our `reading` word holds its id, so the source neither
 * moves nor revokes it. One receive per connection is in flight at a
 * time; the next SrcAvail waits for it (rd_done stays in order). If the
 * source vanishes before the copy, the pages are poisoned - an access
 * raises SIGBUS, the connection is reset - rather than hold wrong data.
 *
 * The copy goes through a bounce buffer (Cross Memory Attach from the
 * source, then UFFDIO_COPY): about three times the cost of the
 * synchronous read, paid by the progress thread. So it is only taken when
 * that thread is idle, and not on a connection whose application touched
 * the previous such buffer before its copy was done (it gained nothing).
 */
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <linux/userfaultfd.h>

#include "sdp/az.h"
#include "sdp/iov.h"
#include "sdp/log.h"
#include "sdp/pool.h"
#include "sdp/proto.h"
#include "sdp/rx.h"
#include "sdp/spin.h"
#include "sdp/sys.h"

#define PAGE 4096ul
#define PG_DOWN(a) ((uintptr_t)(a) & ~(PAGE - 1))
#define PG_UP(a) (((uintptr_t)(a) + PAGE - 1) & ~(PAGE - 1))

/* How long the sink waits for a source's move before it gives up. */
#define MOVE_WAIT_NS 2000000000ull

/* ---- where the bytes are ------------------------------------------------- */

/* Header and entries of a table read at once: the entries up to sa's, when
 * it is among the first TL_ONE (64, the default ring: 1,040 bytes). */
#define TL_ONE 64

/* The table of moved advertisements of block z (whose process is the
 * SrcAvail's key): where sa's bytes are, or 0 if the table cannot be read.
 * The header (magic, pid, nslots) says whether it is that process's table
 * at all; the entry whether sa moved. Both come in one read (half the cost
 * of two: one Cross Memory Attach call is about 0.5 us here, a 1 MiB read
 * 60-66 us): the entry's index needs the table's nslots, which must be the
 * ring's anyway, and the header is checked before the entry is used. */
static uint64_t table_lookup(struct sdp_conn *c, struct sdp_zctl *z,
			     const struct sdp_srcavail *sa)
{
	struct fab_ep *ep = &c->ep;
	uint64_t t = atomic_load(&z->az_table);
	if (!t)
		return sa->addr;                  /* nothing ever moved */
	struct {
		struct sdp_az_thdr h;
		struct sdp_az_tent e[TL_ONE];
	} rd;
	uint32_t k = ep->nslots ? sa->id % ep->nslots : 0;
	bool one = k < TL_ONE;
	size_t want = sizeof rd.h + (one ? (size_t)(k + 1) * sizeof rd.e[0] : 0);
	struct iovec l = { &rd, want };
	ssize_t r = ep->ops->rdma_read(ep, &l, 1, t, want, (uint64_t)sa->key);
	if (r < (ssize_t)sizeof rd.h) {
		if (r < 0 && r != -EFAULT) {
			/* The source's memory is closed to us now (it
			 * changed credentials, became undumpable): its
			 * bytes cannot be read either. */
			sdp_log(0, "SrcAvail %u: the memory of process %d cannot be read (%s)",
				sa->id, (int)sa->key, strerror((int)-r));
			return 0;
		}
		return sa->addr;
	}
	struct sdp_az_thdr h = rd.h;
	if (h.magic != SDP_AZ_TABLE_MAGIC || h.pid != sa->key || h.nslots != ep->nslots)
		return sa->addr;                  /* not this source's table */
	struct sdp_az_tent e;
	if (one) {
		if (r != (ssize_t)want)
			return 0;                 /* the header without the entry */
		e = rd.e[k];
	} else {
		l.iov_base = &e;
		l.iov_len = sizeof e;
		r = ep->ops->rdma_read(ep, &l, 1, t + sizeof h + (uint64_t)k * sizeof e,
				       sizeof e, (uint64_t)sa->key);
		if (r != (ssize_t)sizeof e)
			return 0;
	}
	return e.id == sa->id && e.len == sa->len && e.addr ? e.addr : sa->addr;
}

uint64_t az_src_addr(struct sdp_conn *c, const struct sdp_srcavail *sa, int fd)
{
	(void)fd;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	uint64_t deadline = 0;
	/* Moving it right now: it takes one copy's time. */
	while (atomic_load(&pz->az_moving) == sa->id) {
		uint64_t now = sdp_now_ns();
		if (!deadline)
			deadline = now + MOVE_WAIT_NS;
		if (now > deadline || sdp_is_reset(c))
			return 0;
		sdp_cpu_relax();
	}
	return table_lookup(c, pz, sa);
}

uint64_t az_where(struct sdp_conn *c, const struct sdp_srcavail *sa, bool ours)
{
	if (!ours)
		return az_src_addr(c, sa, -1);
	if (sa->key == (int32_t)sdp_pid) {
		uint64_t b = az_adv_bounce(c, sa->id);
		return b ? b : sa->addr;
	}
	/* A process that shares the connection with us (fork) advertised
	 * it: its table, if it moved it. */
	return table_lookup(c, sdp_zc_me(c), sa);
}

/* ---- asynchronous receive -------------------------------------------------- */

#define MAX_JOBS 64
#define CHUNK (256u << 10)

enum { J_FREE = 0, J_QUEUED, J_COPYING };

struct job {
	_Atomic int      state;
	struct sdp_conn *c;
	int       fd;                  /* the TCP socket, to kick the source */
	uint64_t  ino;                 /* ... if fd still names it */
	uint32_t  id;                  /* the SrcAvail (our `reading` holds it) */
	int32_t   key;                 /* the source process */
	uint64_t  src;                 /* its bytes for dst */
	uintptr_t dst;                 /* whole pages, registered missing */
	size_t    len;
	uint64_t  more;                /* rd_bytes to publish with it (the
					* partial pages read at once) */
};

static struct job jobs[MAX_JOBS];
static _Atomic int njobs;               /* queued or copying */
static char *bounce;                    /* the copier's (the progress thread,
					 * or a thread that settles) */
static pthread_mutex_t copy_mu = PTHREAD_MUTEX_INITIALIZER;

/* Per connection: sends... receives to make synchronously (the
 * application touched or re-read before the last copy was done). */
static uint16_t cool[SDP_POOL_CONNS];
static uint16_t cool_len[SDP_POOL_CONNS];

static bool fd_names(int fd, uint64_t ino)
{
	struct stat st;
	return fd >= 0 && sys_fstat(fd, &st) == 0 && (uint64_t)st.st_ino == ino;
}

/* The copy is done (or failed: poisoned, reset): publish the read, lift
 * the registration, free the job. */
static void job_finish(struct job *j, bool ok)
{
	struct sdp_conn *c = j->c;
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = sdp_zc_me(c);
	if (ok) {
		atomic_fetch_add(&z->rd_bytes, j->len + j->more);
		atomic_store(&z->rd_done, j->id);
		sdp_zc_publish(c, rd_done, rd_bytes);
	}
	atomic_store(&z->reading, 0);
	sdp_zc_publish(c, reading, reading);
	/* Now whoever touched the pages meanwhile goes on. */
	struct uffdio_range w = { j->dst, j->len };
	az_ioctl(az_uffd, UFFDIO_WAKE, &w);
	sigset_t ss;
	az_lock(&ss);
	az_span_put(j->dst, j->dst + j->len);
	az_unlock(&ss);
	if (fd_names(j->fd, j->ino))
		ep->ops->kick(ep, j->fd, FAB_WAIT_ZC);
	atomic_store(&j->state, J_FREE);
	atomic_fetch_sub(&njobs, 1);
}

/* The child of a fork: the progress thread may have been copying. */
void az_recv_fork_child(void)
{
	pthread_mutex_init(&copy_mu, NULL);
}

/* Copy one job (the caller took it: J_COPYING). */
static void job_copy(struct job *j)
{
	struct fab_ep *ep = &j->c->ep;
	pthread_mutex_lock(&copy_mu);
	if (!bounce) {
		void *b = az_mmap(CHUNK);
		if (b != MAP_FAILED) {
			bounce = b;
			az_lib_range((uintptr_t)b, CHUNK);
		}
	}
	size_t done = 0;
	int err = bounce ? 0 : -ENOMEM;
	while (!err && done < j->len) {
		size_t k = j->len - done < CHUNK ? j->len - done : CHUNK;
		struct iovec l = { bounce, k };
		ssize_t g = ep->ops->rdma_read(ep, &l, 1, j->src + done, k, (uint64_t)j->key);
		if (g != (ssize_t)k) {
			err = g < 0 ? (int)g : -EIO;
			break;
		}
		for (size_t at = 0; at < k;) {
			/* Nobody is woken yet: the read is published first
			 * (job_finish), so an application that saw the data
			 * and left at once has told the source. */
			struct uffdio_copy cp = {
				.dst = j->dst + done + at, .src = (uintptr_t)bounce + at,
				.len = k - at, .mode = UFFDIO_COPY_MODE_DONTWAKE,
			};
			int r = az_ioctl(az_uffd, UFFDIO_COPY, &cp);
			if (cp.copy > 0)
				at += (size_t)cp.copy;
			else if (r < 0 && errno != EAGAIN) {
				err = -errno;
				break;
			}
		}
		done += k;
	}
	pthread_mutex_unlock(&copy_mu);
	if (err) {
		/* The data cannot be had any more (the source died, or its
		 * memory went): whoever touches these pages gets SIGBUS, not
		 * bytes that are not the stream's, and the connection is reset. */
		struct az_uffdio_poison po = {
			.start = j->dst + done, .len = j->len - done,
		};
		az_ioctl(az_uffd, AZ_UFFDIO_POISON, &po);
		sdp_log(0, "asynchronous receive of SrcAvail %u lost its source (%s): "
			"connection aborted, the buffer's pages raise SIGBUS", j->id,
			strerror(-err));
		sdp_conn_abort(j->c, ECONNRESET);
	}
	job_finish(j, !err);
}

/* Take a queued job (c's, or any if c is NULL) and copy it here. */
static bool run_one(struct sdp_conn *c)
{
	for (int i = 0; i < MAX_JOBS; i++) {
		struct job *j = &jobs[i];
		int q = J_QUEUED;
		if ((!c || j->c == c) && atomic_load(&j->state) == J_QUEUED &&
		    atomic_compare_exchange_strong(&j->state, &q, J_COPYING)) {
			job_copy(j);
			return true;
		}
	}
	return false;
}

bool az_recv_work_pending(void)
{
	for (int i = 0; i < MAX_JOBS && atomic_load(&njobs); i++)
		if (atomic_load(&jobs[i].state) == J_QUEUED)
			return true;
	return false;
}

void az_recv_work(void)
{
	while (atomic_load(&njobs) && run_one(NULL))
		;
}

bool az_recv_busy(struct sdp_conn *c)
{
	if (!atomic_load_explicit(&njobs, memory_order_relaxed))
		return false;
	for (int i = 0; i < MAX_JOBS; i++)
		if (atomic_load(&jobs[i].state) != J_FREE && jobs[i].c == c)
			return true;
	return false;
}

void az_recv_settle(struct sdp_conn *c)
{
	while (atomic_load_explicit(&njobs, memory_order_relaxed)) {
		if (run_one(c))
			continue;
		if (c ? !az_recv_busy(c) : !atomic_load(&njobs))
			return;
		/* the progress thread is copying it: one copy's time */
		struct timespec nap = { 0, 20000 };
		nanosleep(&nap, NULL);
	}
}

bool az_recv_missing(uintptr_t addr)
{
	for (int i = 0; i < MAX_JOBS && atomic_load(&njobs); i++) {
		struct job *j = &jobs[i];
		if (atomic_load(&j->state) != J_FREE && addr >= j->dst && addr < j->dst + j->len) {
			/* Touched before its copy was done: this connection's
			 * receives gain nothing from returning early. */
			uint32_t k = j->c->idx % SDP_POOL_CONNS;
			cool_len[k] = cool_len[k] ? (cool_len[k] < 4096 ? cool_len[k] * 2 : 4096) : 16;
			cool[k] = cool_len[k];
			return true;
		}
	}
	return false;
}

ssize_t az_recv_take(struct sdp_conn *c, int fd, const struct sdp_srcavail *sa,
		     uint64_t addr, uint32_t off, const struct iovec *iov, int iovcnt,
		     size_t copied, size_t room)
{
	struct fab_ep *ep = &c->ep;
	size_t n = sa->len - off;
	uint32_t k = c->idx % SDP_POOL_CONNS;
	if (!sdp_tun.azcopy || !sdp_tun.az_recv || !(sa->flags & SDP_SA_ASYNC) ||
	    room < n || !az_big_enough(n) || copied + room > sdp_tun.az_recv_max)
		return 0;
	if (az_recv_busy(c) || atomic_load(&njobs)) {
		/* The last one is not copied yet and the application is
		 * here again: returning early gained it nothing. */
		cool_len[k] = cool_len[k] ? (cool_len[k] < 4096 ? cool_len[k] * 2 : 4096) : 16;
		cool[k] = cool_len[k];
		return 0;
	}
	if (cool[k]) {
		cool[k]--;
		return 0;
	}
	/* All of it lands in one element of the buffer: its partial pages
	 * now, its whole pages later. */
	struct iovec v;
	if (iov_slice(iov, iovcnt, copied, n, &v, 1) != 1 || v.iov_len != n)
		return 0;
	uintptr_t d = (uintptr_t)v.iov_base, ms = PG_UP(d), me = PG_DOWN(d + n);
	if (me <= ms || me - ms < 4 * PAGE)
		return 0;
	uintptr_t sp = (uintptr_t)__builtin_frame_address(0);
	if (d < sp + (1u << 20) && sp < d + n + (8u << 20))
		return 0;                     /* perhaps our stack: never */
	if (az_mech_default() == AZ_MECH_NONE || az_prog_uffd() < 0)
		return 0;
	struct job *j = NULL;
	for (int i = 0; i < MAX_JOBS && !j; i++) {
		int f = J_FREE;
		if (atomic_compare_exchange_strong(&jobs[i].state, &f, J_COPYING))
			j = &jobs[i];
	}
	if (!j)
		return 0;
	sigset_t ss;
	az_lock(&ss);
	int r = az_span_hold(ms, me, AZ_RECV);
	az_unlock(&ss);
	if (r) {
		atomic_store(&j->state, J_FREE);
		return 0;
	}
	/* The partial pages at either end, now. */
	size_t h = ms - d, t = d + n - me;
	struct iovec lh = { (void *)d, h }, lt = { (void *)me, t };
	ssize_t g1 = h ? ep->ops->rdma_read(ep, &lh, 1, addr + off, h, (uint64_t)sa->key) : 0;
	ssize_t g2 = t ? ep->ops->rdma_read(ep, &lt, 1, addr + off + (me - d), t,
					    (uint64_t)sa->key) : 0;
	j->c = c;
	j->fd = fd;
	j->ino = c->tcp_ino;
	j->id = sa->id;
	j->key = sa->key;
	j->src = addr + off + h;
	j->dst = ms;
	j->len = me - ms;
	j->more = h + t;
	atomic_fetch_add(&njobs, 1);
	if (g1 != (ssize_t)h || g2 != (ssize_t)t) {
		job_finish(j, false);
		return -EIO;
	}
	atomic_store(&j->state, J_QUEUED);
	az_count(&c->st.rx_azasync_bytes, j->len);
	if (az_prog_start() == 0)
		az_prog_kick();
	else
		az_recv_settle(c);            /* nobody to copy it: now */
	return (ssize_t)n;
}
