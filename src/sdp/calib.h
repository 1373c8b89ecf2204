/*
 * calib.h - what the library measures once per host and caches: the copy
 * routine for stream bytes, whether Cross Memory Attach suffers when source
 * and destination share their offset in a page, and the `auto` zero-copy
 * threshold. Used by the library (at the first connection) and by
 * `sdp check`, which reports it.
 */
#ifndef SDP_CALIB_H
#define SDP_CALIB_H

#include <stdbool.h>
#include <stdint.h>

#include "sdp/copy.h"

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
	char     path[512];            /* the cache file */
	char     host[256];            /* kernel release | CPU model */
};

/* Read the cache or measure (and cache). slot_size: the receive-buffer
 * size the copies are timed with. force: measure even if cached.
 * SDP_CALIB_FAKE="copy=NAME:GBPS,...;cma=SAME:SHIFTED" replaces the
 * measured speeds (and bypasses the cache): a host that prefers another
 * routine, simulated. */
void sdp_calib_get(uint32_t slot_size, bool force, struct sdp_calib *out);

/* Below this distance (mod 4 KiB) two buffers count as page-aliased. */
#define SDP_ALIAS_WINDOW 256
static inline bool sdp_page_aliased(uintptr_t a, uintptr_t b)
{
	uintptr_t d = (a - b) & 4095;
	return d < SDP_ALIAS_WINDOW || d > 4096 - SDP_ALIAS_WINDOW;
}

#endif
