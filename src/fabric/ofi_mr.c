/*
 * ofi_mr.c - the ofi provider's memory: registrations, the registration
 * cache, RDMA Read and Write of the peer's memory, the probe.
 *
 * Registering memory with a fabric costs a system call and, on RDMA
 * hardware, pinning pages and programming the device's translation
 * table: the SDP papers name it as what decides the size from which zero
 * copy pays. Each connection keeps the last OFI_MRC_MAX registrations it
 * made (page-aligned, least recently used evicted); a buffer inside one
 * is a hit and costs nothing. Hits and misses are counted per connection
 * (struct fab_ep, shown by `sdp stat --json`).
 *
 * A provider that pins pages (FI_MR_LOCAL or FI_MR_ALLOCATED: verbs) would
 * keep pinned memory the application has since freed and mapped anew in a
 * cache of ours, with stale contents: there every registration is made for
 * the one transfer and closed after it, and libfabric's own cache, which
 * watches the process's memory map, saves the cost (counted as misses).
 *
 * How the peer names our memory: FI_MR_VIRT_ADDR - by virtual address;
 * without it (the tcp provider) by offset in the registration. Then SDP
 * chooses the key (no FI_MR_PROV_KEY) and puts the registration's page
 * number in its low 35 bits, so that the virtual address a SrcAvail
 * carries converts to the offset (key_page). A provider that picks keys
 * and wants offsets gets no zero copy (mr_key 0).
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/uio.h>

#include "fabric/ofi.h"

#define PAGE 4096ul
#define KEY_PAGE_BITS 35

static bool pins(struct ofi_dom *d)
{
	return (d->mr_mode & (FI_MR_LOCAL | FI_MR_ALLOCATED)) != 0;
}

static uint64_t key_page(uint64_t key)
{
	return (key & ((1ull << KEY_PAGE_BITS) - 1)) * PAGE;
}

/* The address the peer uses for its memory at va under key. */
static uint64_t remote_addr(struct ofi_dom *d, uint64_t va, uint64_t key)
{
	return (d->mr_mode & FI_MR_VIRT_ADDR) ? va : va - key_page(key);
}

int ofi_reg(struct ofi_dom *d, void *addr, size_t len, uint64_t access,
	    struct fid_mr **mr, uint64_t *key)
{
	for (int tries = 0; tries < 8; tries++) {
		uint64_t want = 0;
		if (!(d->mr_mode & FI_MR_PROV_KEY)) {
			uint64_t rnd = 0;
			if (getrandom(&rnd, sizeof rnd, 0) != sizeof rnd)
				return -EIO;
			want = ((rnd | 1) << KEY_PAGE_BITS) |
			       (((uintptr_t)addr / PAGE) & ((1ull << KEY_PAGE_BITS) - 1));
			if (d->key_bytes && d->key_bytes < 8)
				want &= (1ull << (8 * d->key_bytes)) - 1;
		}
		int r = fi_mr_reg(d->domain, addr, len, access, 0, want, 0, mr, NULL);
		if (r == -FI_ENOKEY)
			continue;                 /* that key is taken: another */
		if (r)
			return r;
		*key = fi_mr_key(*mr);
		return 0;
	}
	return -EBUSY;
}

/* A registration covering [addr, addr + len) with access, from the cache
 * or new (under oc->wlock). NULL: not possible. *temp: close it after the
 * transfer (providers that pin). */
static struct ofi_mrc *mr_get(struct fab_ep *ep, struct ofi_conn *oc, const void *addr,
			      size_t len, uint64_t access, struct ofi_mrc *tmp)
{
	uintptr_t a = (uintptr_t)addr;
	uintptr_t lo = a & ~(PAGE - 1), hi = (a + len + PAGE - 1) & ~(PAGE - 1);
	oc->mrc_tick++;
	if (!pins(oc->dom)) {
		for (uint32_t i = 0; i < oc->nmrc; i++) {
			struct ofi_mrc *m = &oc->mrc[i];
			if (m->base <= a && a + len <= m->base + m->len &&
			    (m->access & access) == access) {
				m->used = oc->mrc_tick;
				ep->mr_hits++;
				atomic_fetch_add(&ofi_p.mr_hits, 1);
				return m;
			}
		}
	}
	ep->mr_misses++;
	atomic_fetch_add(&ofi_p.mr_misses, 1);
	struct ofi_mrc *m = tmp;
	if (!pins(oc->dom)) {
		if (!oc->mrc)
			oc->mrc = calloc(OFI_MRC_MAX, sizeof *oc->mrc);
		if (oc->mrc && oc->nmrc < OFI_MRC_MAX) {
			m = &oc->mrc[oc->nmrc];
		} else if (oc->mrc) {
			m = &oc->mrc[0];          /* least recently used */
			for (uint32_t i = 1; i < oc->nmrc; i++)
				if (oc->mrc[i].used < m->used)
					m = &oc->mrc[i];
			fi_close(&m->mr->fid);
			m->mr = NULL;
		}
	}
	memset(m, 0, sizeof *m);
	access |= FI_READ | FI_WRITE;
	if (ofi_reg(oc->dom, (void *)lo, hi - lo, access | FI_REMOTE_READ, &m->mr, &m->key))
		return NULL;
	m->base = lo;
	m->len = hi - lo;
	m->access = access | FI_REMOTE_READ;
	m->desc = fi_mr_desc(m->mr);
	m->used = oc->mrc_tick;
	if (m != tmp && m == &oc->mrc[oc->nmrc])
		oc->nmrc++;
	return m;
}

static void mr_put(struct ofi_mrc *m, struct ofi_mrc *tmp)
{
	if (m == tmp && m->mr) {
		fi_close(&m->mr->fid);
		m->mr = NULL;
	}
}

void ofi_mr_drop(struct ofi_conn *oc)
{
	for (uint32_t i = 0; i < oc->nmrc; i++)
		if (oc->mrc[i].mr)
			fi_close(&oc->mrc[i].mr->fid);
	free(oc->mrc);
	oc->mrc = NULL;
	oc->nmrc = 0;
}

/* The key for a SrcAvail of ours: our buffer, readable by the peer. It
 * stays registered while cached (pinning providers: libfabric's cache). */
uint64_t ofi_mr_key(struct fab_ep *ep, const void *addr, size_t len)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || !len || ((oc->dom->mr_mode & FI_MR_PROV_KEY) &&
			    !(oc->dom->mr_mode & FI_MR_VIRT_ADDR)))
		return 0;
	pthread_mutex_lock(&oc->wlock);
	struct ofi_mrc tmp, *m = mr_get(ep, oc, addr, len, FI_REMOTE_READ, &tmp);
	uint64_t key = m ? m->key : 0;
	/* A pinning provider: the registration must outlive the send; it is
	 * kept in the cache slot even so (closed at eviction or detach). */
	if (m == &tmp && m->mr) {
		if (!oc->mrc)
			oc->mrc = calloc(OFI_MRC_MAX, sizeof *oc->mrc);
		struct ofi_mrc *slot = NULL;
		if (oc->mrc && oc->nmrc < OFI_MRC_MAX)
			slot = &oc->mrc[oc->nmrc++];
		else if (oc->mrc) {
			slot = &oc->mrc[0];
			for (uint32_t i = 1; i < oc->nmrc; i++)
				if (oc->mrc[i].used < slot->used)
					slot = &oc->mrc[i];
			if (slot->mr)
				fi_close(&slot->mr->fid);
		}
		if (slot)
			*slot = tmp;
		else
			mr_put(&tmp, &tmp), key = 0;
	}
	pthread_mutex_unlock(&oc->wlock);
	return key;
}

void *ofi_mr_desc(struct ofi_dom *d, const void *addr, size_t len)
{
	(void)d;
	(void)addr;
	(void)len;
	return NULL;
}

/* One RDMA Read or Write, waited for. */
static ssize_t rdma(struct fab_ep *ep, bool write, const struct iovec *local, int nlocal,
		    uint64_t raddr, size_t len, uint64_t rkey)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || atomic_load(&oc->state) != OFI_ST_UP)
		return -ECONNRESET;
	if (nlocal < 1 || !len)
		return 0;
	size_t lim = oc->dom->info->tx_attr->rma_iov_limit;
	if (lim < 1)
		lim = 1;
	if ((size_t)nlocal > lim)
		nlocal = (int)lim;
	if (nlocal > 4)
		nlocal = 4;
	struct iovec v[4];
	void *desc[4];
	struct ofi_mrc tmp[4], *m[4] = { 0 };
	size_t n = 0;
	pthread_mutex_lock(&oc->wlock);
	for (int i = 0; i < nlocal && n < len; i++) {
		v[i] = local[i];
		if (v[i].iov_len > len - n)
			v[i].iov_len = len - n;
		n += v[i].iov_len;
		desc[i] = NULL;
		if (oc->dom->mr_mode & FI_MR_LOCAL) {
			m[i] = mr_get(ep, oc, v[i].iov_base, v[i].iov_len,
				      write ? FI_WRITE : FI_READ, &tmp[i]);
			if (!m[i]) {
				for (int k = 0; k < i; k++)
					mr_put(m[k], &tmp[k]);
				pthread_mutex_unlock(&oc->wlock);
				return -ENOMEM;
			}
			desc[i] = m[i]->desc;
		}
	}
	int cnt = 0;
	while (cnt < nlocal && v[cnt].iov_len)
		cnt++;
	uint32_t before = atomic_load(&oc->reads_done);
	atomic_store(&oc->read_err, 0);
	struct ofi_op *op = ofi_misc_op(oc);
	ssize_t r = -ECONNRESET;
	if (op) {
		op->kind = OFI_OP_READ;
		uint64_t ra = remote_addr(oc->dom, raddr, rkey);
		for (int t = 0; t < 10000000; t++) {
			r = write ? fi_writev(oc->ep, v, desc, (size_t)cnt, 0, ra, rkey, &op->ctx)
				  : fi_readv(oc->ep, v, desc, (size_t)cnt, 0, ra, rkey, &op->ctx);
			if (r != -FI_EAGAIN)
				break;
			ofi_progress(oc);
		}
		if (r)
			ofi_misc_done(oc);
	}
	while (r == 0 && atomic_load(&oc->reads_done) == before) {
		if (atomic_load(&oc->state) != OFI_ST_UP) {
			r = -ECONNRESET;
			break;
		}
		ofi_progress(oc);
	}
	for (int i = 0; i < cnt; i++)
		if (m[i])
			mr_put(m[i], &tmp[i]);
	pthread_mutex_unlock(&oc->wlock);
	if (r)
		return r < 0 ? r : -EIO;
	int e = atomic_load(&oc->read_err);
	if (e)
		return e == -FI_EACCES || e == -EACCES ? -EACCES : e;
	return (ssize_t)n;
}

ssize_t ofi_rdma_read(struct fab_ep *ep, const struct iovec *local, int nlocal,
		      uint64_t raddr, size_t len, uint64_t rkey)
{
	return rdma(ep, false, local, nlocal, raddr, len, rkey);
}

ssize_t ofi_rdma_write(struct fab_ep *ep, const struct iovec *local, int nlocal,
		       uint64_t raddr, size_t len, uint64_t rkey)
{
	return rdma(ep, true, local, nlocal, raddr, len, rkey);
}

/* The fabric checks every access against the registration's key and
 * rights; nothing to ask the kernel. (A test read would need the peer's
 * progress - the tcp provider serves RDMA in software - and could wait
 * for a peer busy elsewhere.) */
uint64_t ofi_probe_addr(struct fab_ep *ep)
{
	(void)ep;
	return 1;
}

int ofi_probe(struct fab_ep *ep, uint64_t raddr, uint64_t key)
{
	(void)raddr;
	(void)key;
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc || atomic_load(&oc->state) != OFI_ST_UP)
		return 0;                     /* not yet: ask later */
	if ((oc->dom->mr_mode & FI_MR_PROV_KEY) && !(oc->dom->mr_mode & FI_MR_VIRT_ADDR))
		return -EOPNOTSUPP;           /* keys cannot name our addresses */
	return 1;
}
