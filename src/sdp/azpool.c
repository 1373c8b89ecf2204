/*
 * azpool.c - Asynchronous Zero Copy: the pool of bounce buffers for copies
 * aside (az.h).
 *
 * An advertisement moves aside when its pages are written (copy-on-write)
 * or given back (madvise, munmap, free...) before the peer has read them.
 * Its bytes go to a bounce buffer that the sink reads instead. A mapping
 * per copy (mmap, then munmap at the peer's read) costs more than the copy
 * of a 64 KiB advertisement itself, so the buffers come from one mapping
 * per process, made at the first copy aside: SDP_AZ_POOL bytes, in pages,
 * first fit. Its pages are touched once and then reused. Several
 * advertisements of the same pages moved at the same time (the same buffer
 * sent again and again before the peer read it) share one copy: each page
 * run carries a count of users.
 *
 * A copy that does not fit waits as block-on-write does (the peer reads
 * meanwhile, which frees both the pages and pool room); only a wait that
 * lasted its limit maps a buffer of its own, as before (az_move_range).
 *
 * Everything here runs under az_lock.
 */
#include <string.h>

#include "sdp/az.h"
#include "sdp/log.h"
#include "sdp/tunables.h"

#define PAGE 4096ul
#define POOL_MAX_PAGES 16384u              /* 64 MiB, SDP_AZ_POOL's upper bound */

static uintptr_t pool;                     /* the mapping, 0 = not made (yet) */
static uint32_t npages;                    /* its pages */
static bool pool_failed;                   /* mmap refused: no pool */
static uint64_t used[POOL_MAX_PAGES / 64]; /* one bit per page in use */
static uint16_t users[POOL_MAX_PAGES];     /* at a run's first page: its users */
static uint32_t hint;                      /* where the last search ended */
static uint32_t pages_used;                /* pages in use now */

static bool pool_make(void)
{
	if (pool || pool_failed)
		return pool != 0;
	uint64_t bytes = sdp_tun.az_pool;
	if (bytes > (uint64_t)POOL_MAX_PAGES * PAGE)
		bytes = (uint64_t)POOL_MAX_PAGES * PAGE;
	npages = (uint32_t)(bytes / PAGE);
	if (!npages) {
		pool_failed = true;
		return false;
	}
	void *p = az_mmap((size_t)npages * PAGE);
	if (p == MAP_FAILED) {
		sdp_log(1, "asynchronous zero copy: no pool for copies aside (%u pages)",
			npages);
		pool_failed = true;
		return false;
	}
	pool = (uintptr_t)p;
	az_lib_add(pool, (size_t)npages * PAGE);
	return true;
}

static bool bit(uint32_t i)
{
	return (used[i / 64] >> (i % 64)) & 1;
}

static void mark(uint32_t i, uint32_t n, bool on)
{
	for (uint32_t k = i; k < i + n; k++) {
		if (on)
			used[k / 64] |= 1ull << (k % 64);
		else
			used[k / 64] &= ~(1ull << (k % 64));
	}
}

uintptr_t az_pool_get(size_t len)
{
	uint32_t n = (uint32_t)((len + PAGE - 1) / PAGE);
	if (!n || !pool_make() || n > npages - pages_used)
		return 0;
	/* First fit from where the last search ended, wrapping once. */
	for (uint32_t pass = 0, i = hint >= npages ? 0 : hint; pass < 2; pass++, i = 0) {
		uint32_t lim = pass == 0 ? npages : hint;
		while (i + n <= npages && i < lim) {
			if (!(used[i / 64] + 1) && i % 64 == 0) {    /* a full word */
				i += 64;
				continue;
			}
			uint32_t k = 0;
			while (k < n && !bit(i + k))
				k++;
			if (k == n) {
				mark(i, n, true);
				users[i] = 1;
				pages_used += n;
				hint = i + n;
				return pool + (uintptr_t)i * PAGE;
			}
			i += k + 1;
		}
	}
	return 0;
}

bool az_pool_owns(uintptr_t b)
{
	return pool && b >= pool && b < pool + (uintptr_t)npages * PAGE;
}

void az_pool_share(uintptr_t b)
{
	if (az_pool_owns(b))
		users[(b - pool) / PAGE]++;
}

bool az_pool_put(uintptr_t b, size_t len)
{
	if (!az_pool_owns(b))
		return false;
	uint32_t i = (uint32_t)((b - pool) / PAGE);
	uint32_t n = (uint32_t)((len + PAGE - 1) / PAGE);
	if (users[i] > 1) {
		users[i]--;
		return true;
	}
	users[i] = 0;
	mark(i, n, false);
	pages_used -= n;
	return true;
}

void az_pool_fork_child(void)
{
	/* The parent's copies aside are the parent's: the child's pool is
	 * empty (the same mapping, its own copy of the pages). */
	memset(used, 0, sizeof used);
	memset(users, 0, sizeof users);
	pages_used = 0;
	hint = 0;
}
