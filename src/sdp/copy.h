/*
 * copy.h - the routine that moves stream bytes into and out of receive
 * buffers (Buffer Copy), chosen per host.
 *
 * glibc picks its memcpy for the application's general use; for the ring
 * copies (tens of KiB, source and destination often at the same offset in
 * their pages) that choice can be several times slower than a plain vector
 * loop on some CPUs (rep movsb on some AMD hosts). The library therefore
 * measures its candidates once per host (calib.c, cached) and uses the
 * fastest, without changing anything the application sees.
 */
#ifndef SDP_COPY_H
#define SDP_COPY_H

#include <stdbool.h>
#include <stddef.h>

typedef void (*sdp_copy_fn)(void *dst, const void *src, size_t n);

struct sdp_copy_impl {
	const char *name;              /* "libc", "sse2", "avx2", "avx512", "movsb" */
	sdp_copy_fn fn;
	bool (*usable)(void);          /* the CPU has what it needs */
};

#define SDP_COPY_MAX 5

/* The candidates, in order of preference at equal speed (libc first). */
const struct sdp_copy_impl *sdp_copy_impls(int *n);
const struct sdp_copy_impl *sdp_copy_find(const char *name);  /* NULL: unknown */

/* The routine in use (libc memcpy until a choice is made). */
extern sdp_copy_fn sdp_copy_cur;
static inline void sdp_copy(void *dst, const void *src, size_t n)
{
	sdp_copy_cur(dst, src, n);
}
/* Use this routine from now on; false if unknown or unusable here. */
bool sdp_copy_use(const char *name);
const char *sdp_copy_name(void);

#endif
