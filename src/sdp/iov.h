/*
 * iov.h - the application's scattered buffer, addressed by stream offset.
 *
 * send and recv see the application's buffer as an iovec; the engine moves
 * bytes [off, off + len) of it into a receive buffer, out of one, or names
 * them for a zero-copy transfer. Copies use the host's chosen routine
 * (copy.h).
 */
#ifndef SDP_IOV_H
#define SDP_IOV_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/uio.h>

#include "sdp/copy.h"

static inline size_t iov_total(const struct iovec *iov, int n)
{
	size_t t = 0;
	for (int i = 0; i < n; i++)
		t += iov[i].iov_len;
	return t;
}

/* Copy len bytes starting at stream offset off of the iovec into dst;
 * shared: dst is a buffer the peer reads in place (sdp_copy_shared).
 * Returns the bytes written with streaming stores. */
static inline size_t iov_gather(void *dst, const struct iovec *iov, int n, size_t off,
				size_t len, bool shared)
{
	char *d = dst;
	size_t streamed = 0;
	for (int i = 0; i < n && len; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		size_t k = iov[i].iov_len - off;
		if (k > len)
			k = len;
		if (!shared)
			sdp_copy(d, (char *)iov[i].iov_base + off, k);
		else if (sdp_copy_shared(d, (char *)iov[i].iov_base + off, k))
			streamed += k;
		d += k;
		len -= k;
		off = 0;
	}
	return streamed;
}

/* Copy len bytes from src into the iovec at stream offset off. */
static inline void iov_scatter(const struct iovec *iov, int n, size_t off,
			       const char *src, size_t len)
{
	for (int i = 0; i < n && len; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		size_t k = iov[i].iov_len - off;
		if (k > len)
			k = len;
		sdp_copy((char *)iov[i].iov_base + off, src, k);
		src += k;
		len -= k;
		off = 0;
	}
}

/* The iovec elements (at most max) covering stream bytes [off, off+len). */
static inline int iov_slice(const struct iovec *iov, int n, size_t off, size_t len,
			    struct iovec *out, int max)
{
	int k = 0;
	for (int i = 0; i < n && len && k < max; i++) {
		if (off >= iov[i].iov_len) {
			off -= iov[i].iov_len;
			continue;
		}
		size_t m = iov[i].iov_len - off;
		if (m > len)
			m = len;
		out[k].iov_base = (char *)iov[i].iov_base + off;
		out[k].iov_len = m;
		k++;
		len -= m;
		off = 0;
	}
	return k;
}

#endif
