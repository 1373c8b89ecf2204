/*
 * calib.h - what the library measures once per host and caches: the copy
 * routine for stream bytes, whether Cross Memory Attach suffers when source
 * and destination share their offset in a page, and the `auto` zero-copy
 * threshold; and, for Asynchronous Zero Copy, what a copy and a
 * protect + unprotect cycle of the same buffer cost at each size, from
 * which the `auto` AZ threshold follows. Used by the library (at the first
 * connection) and by `sdp check`, which reports it.
 */
#ifndef SDP_CALIB_H
#define SDP_CALIB_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "sdp/copy.h"

#define SDP_CALIB_AZ_SIZES 10     /* 8 KiB .. 4 MiB */

struct sdp_calib {
	uint32_t zcopy_thresh;         /* bytes, 0 = zero copy never pays here */
	char     copy[16];             /* the fastest copy routine (copy.h) */
	bool     cma_alias;            /* CMA between buffers at the same page
					* offset is slow here: bounce those */
	int      ncopy;
	struct {
		char   name[16];
		double gbps;               /* ring copy in + copy out, GB/s */
	} copy_speed[SDP_COPY_MAX];
	double   cma_gbps_same;        /* 64 KiB CMA, same page offset, GB/s */
	double   cma_gbps_shifted;     /* ... offsets 2 KiB apart */
	bool     cma_ok;               /* CMA worked at all */
	bool     cached;               /* read from the cache file */
	bool     faked;                /* numbers from SDP_CALIB_FAKE (tests) */
	/* Asynchronous Zero Copy (az.h): per size, 8 KiB doubling to 4 MiB,
	 * the zero-copy transfer of the buffer (what a synchronous send waits
	 * for) against one protect + unprotect cycle of its pages (what an
	 * asynchronous send pays instead). Microseconds; < 0 = not available
	 * (userfaultfd refused here). naz = 0: not measured. */
	int      naz;
	struct {
		uint32_t bytes;
		double   copy_us;          /* CMA of `bytes`, page-aligned source */
		double   mprotect_us;      /* mprotect(PROT_READ) + mprotect(back) */
		double   uffd_us;          /* UFFDIO_WRITEPROTECT on + off */
	} az[SDP_CALIB_AZ_SIZES];
	/* Per mechanism (index 1 mprotect, 2 userfaultfd): between the
	 * table's size below its pick and the pick, the page counts on either
	 * side of the crossing, by bisection (hi_pages 0: not refined). */
	struct sdp_az_fine {
		uint32_t lo_pages, hi_pages;   /* copy <= cycle at lo, > at hi */
		double   lo_copy_us, lo_cycle_us, hi_copy_us, hi_cycle_us;
	} az_fine[3];
	char     path[512];            /* the cache file */
	char     host[256];            /* kernel release | CPU model */
};

/* Read the cache or measure (and cache). slot_size: the receive-buffer
 * size the copies are timed with. force: measure even if cached.
 * SDP_CALIB_FAKE="copy=NAME:GBPS,...;cma=SAME:SHIFTED" replaces the
 * measured speeds (and bypasses the cache): a host that prefers another
 * routine, simulated. */
void sdp_calib_get(uint32_t slot_size, bool force, struct sdp_calib *out);
/* Note where the cache is while the environment is the one the process
 * started with (the library's start-up): later lookups use it even if the
 * program cleared its environment. */
void sdp_calib_env(void);
/* The same with the Asynchronous Zero Copy costs measured too (cached with
 * the rest; sdp_calib_get measures them only with SDP_AZCOPY=1).
 * SDP_CALIB_FAKE may add ";az=GBPS:FIXED_US:PAGE_US": copies at GBPS, a
 * protection cycle (either mechanism) of FIXED_US + PAGE_US per page. */
void sdp_calib_get_az(uint32_t slot_size, bool force, struct sdp_calib *out);

/* The `auto` AZ threshold for protection mechanism mech (enum az_mech:
 * 1 mprotect, 2 userfaultfd). The table gives the smallest measured size
 * from which on (to 4 MiB) a copy costs more than a protection cycle -
 * below it a send is cheaper synchronous (zero copy or Buffer Copy) -
 * narrowed to a page count by the refinement; the threshold is one page
 * more, so that a send of that many bytes has those whole pages at any
 * alignment. 0 if no size pays (AZ never does here) or nothing was
 * measured. *why (if not NULL) gets the costs on either side. */
struct sdp_az_choice {
	uint32_t thresh;               /* bytes; 0 = never */
	uint32_t at_pages;             /* whole pages where the copy costs more */
	double   at_copy_us, at_cycle_us;
	uint32_t below_pages;          /* the largest measured count where it
					* does not (0: none measured) */
	double   below_copy_us, below_cycle_us;
};
uint32_t sdp_calib_az_thresh(const struct sdp_calib *c, int mech, struct sdp_az_choice *why);

/* One protect + unprotect cycle of len bytes of fresh private pages by
 * mech (1 mprotect, 2 userfaultfd write-protect), microseconds, best of
 * reps; < 0 if that mechanism is not available here (azcal.c). */
double az_cycle_us(int mech, size_t len, int reps);

/* Below this distance (mod 4 KiB) two buffers count as page-aliased. */
#define SDP_ALIAS_WINDOW 256
static inline bool sdp_page_aliased(uintptr_t a, uintptr_t b)
{
	uintptr_t d = (a - b) & 4095;
	return d < SDP_ALIAS_WINDOW || d > 4096 - SDP_ALIAS_WINDOW;
}

#endif
