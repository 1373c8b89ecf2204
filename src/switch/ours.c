/*
 * ours.c - the library's own descriptors, as the application sees them.
 *
 * The library keeps descriptors of its own for as long as it runs: a
 * listener's rendezvous, a group's block and queues, links, wake-up fds,
 * the pool that `sdp stat` finds. They are marked (sys.h sys_fd_keep) and
 * to the application their numbers are not open: close, close_range,
 * closefrom, dup, fcntl, fstat and epoll_ctl answer as the kernel answers
 * for a number that is not open (EBADF). dup2/dup3 onto one go ahead (the
 * number is free to the application; the library finds out by checking
 * its descriptors' identity before use). A daemon that closes
 * every number it does not know, or a test that lists the descriptors it
 * inherited by fstat, then sees only its own. (/proc/self/fd still lists
 * them.)
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/stat.h>

#include "switch/switch.h"
#include "sdp/sys.h"

int ours_not_open(const char *call, int fd)
{
	sdp_log(2, "%s(%d): the library's own descriptor, left open (EBADF)", call, fd);
	errno = EBADF;
	return -1;
}

/* dup2/dup3(o, n) where o or n is the library's. From o: EBADF. Onto n:
 * the number is free to the application, so the call goes ahead and the
 * kernel closes ours: each part of the library checks that its
 * descriptor is still its own before it uses it (identity by inode or
 * name: the pool, arenas, links, rendezvous). Returns 0 to go ahead. */
int ours_dup_onto(int o, int n)
{
	if (sys_fd_ours(o))
		return ours_not_open("dup2", o);
	sdp_log(1, "dup2(%d, %d): the application takes the number of the library's "
		"descriptor %d", o, n, n);
	sys_fd_mark(n, false);
	return 0;
}

/* The lowest number of the library's in [lo, hi], or -1. */
static long next_ours(unsigned lo, unsigned hi)
{
	const unsigned W = 8 * sizeof(unsigned long);
	if (hi >= SYS_FDMAP_BITS)
		hi = SYS_FDMAP_BITS - 1;
	while (lo <= hi) {
		unsigned long w = atomic_load_explicit(&sys_fd_map[lo / W], memory_order_relaxed);
		w &= ~0ul << (lo % W);
		if (w) {
			unsigned fd = (lo / W) * W + (unsigned)__builtin_ctzl(w);
			return fd <= hi ? (long)fd : -1;
		}
		lo = (lo / W + 1) * W;
	}
	return -1;
}

/* close_range(2) over [first, last] (first <= last) except the library's
 * descriptors: one call per gap between them. */
int ours_close_range_around(unsigned first, unsigned last, int flags)
{
	unsigned lo = first;
	for (long o = next_ours(first, last); o >= 0;
	     o = (unsigned)o < last ? next_ours((unsigned)o + 1, last) : -1) {
		if ((unsigned)o > lo) {
			if (real_close_range(lo, (unsigned)o - 1, flags) < 0)
				return -1;
			flags &= ~CLOSE_RANGE_UNSHARE;   /* unshared by the first */
		}
		lo = (unsigned)o + 1;
		if ((unsigned)o == last)
			return 0;
	}
	return real_close_range(lo, last, flags);
}

/* ---- fstat: the usual way to ask whether a number is open --------------- */

/* The next definition (libc's), looked up at the first call: fstat and
 * friends are called before and while the library starts. */
typedef int (*fstat_fn)(int, struct stat *);
typedef int (*fstat64_fn)(int, struct stat64 *);
typedef int (*fstatat_fn)(int, const char *, struct stat *, int);
typedef int (*fstatat64_fn)(int, const char *, struct stat64 *, int);
#define NEXT(name)                                                           \
	static name##_fn next_##name;                                        \
	if (!next_##name)                                                    \
		next_##name = (name##_fn)dlsym(RTLD_NEXT, #name)

static int at_empty(int fd, const char *path, int flags)
{
	return (flags & AT_EMPTY_PATH) && path && !*path && sys_fd_ours(fd);
}

EXPORT int fstat(int fd, struct stat *st)
{
	if (__builtin_expect(sys_fd_ours(fd), 0))
		return ours_not_open("fstat", fd);
	NEXT(fstat);
	if (next_fstat)
		return next_fstat(fd, st);
	return (int)syscall(SYS_newfstatat, fd, "", st, AT_EMPTY_PATH);
}

EXPORT int fstat64(int fd, struct stat64 *st)
{
	if (__builtin_expect(sys_fd_ours(fd), 0))
		return ours_not_open("fstat", fd);
	NEXT(fstat64);
	if (next_fstat64)
		return next_fstat64(fd, st);
	return (int)syscall(SYS_newfstatat, fd, "", st, AT_EMPTY_PATH);
}

EXPORT int fstatat(int dfd, const char *path, struct stat *st, int flags)
{
	if (__builtin_expect(at_empty(dfd, path, flags), 0))
		return ours_not_open("fstatat", dfd);
	NEXT(fstatat);
	if (next_fstatat)
		return next_fstatat(dfd, path, st, flags);
	return (int)syscall(SYS_newfstatat, dfd, path, st, flags);
}

EXPORT int fstatat64(int dfd, const char *path, struct stat64 *st, int flags)
{
	if (__builtin_expect(at_empty(dfd, path, flags), 0))
		return ours_not_open("fstatat", dfd);
	NEXT(fstatat64);
	if (next_fstatat64)
		return next_fstatat64(dfd, path, st, flags);
	return (int)syscall(SYS_newfstatat, dfd, path, st, flags);
}
