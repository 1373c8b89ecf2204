/*
 * azsw.c - the calls Asynchronous Zero Copy must see (sdp/az.h).
 *
 * With SDP_AZCOPY=1 the pages of a buffer stay protected after send()
 * returns, until the peer has read them. So:
 *
 *   - SIGSEGV belongs to the library first: sigaction, signal, bsd_signal,
 *     sysv_signal, ssignal and sigset on SIGSEGV set the application's
 *     action aside (the library's handler stays in the kernel and hands on
 *     every fault that is not its own, as that action says) and report the
 *     application's own action back, never the library's;
 *   - memory that changes hands or goes away while in flight - munmap,
 *     mremap, madvise(MADV_DONTNEED, MADV_FREE, MADV_REMOVE), mmap over it
 *     (MAP_FIXED), mprotect of it, free and realloc of a block holding it -
 *     first has its advertisements moved aside (or waits for the peer's
 *     read, SDP_AZ_FAULT=block, briefly) and its protection lifted;
 *   - with mprotect as the mechanism the kernel's own writes into a
 *     protected page fail with EFAULT: pread and preadv (and read, readv
 *     and recv*, io.c) settle their buffer first.
 *
 * Without SDP_AZCOPY every one of these passes straight through, and with
 * it each costs one load until some page is in flight.
 */
#include <dlfcn.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/uio.h>

#include "sdp/az.h"
#include "switch/switch.h"

typedef void (*sighandler_fn)(int);

static int (*next_sigaction)(int, const struct sigaction *, struct sigaction *);
static sighandler_fn (*next_signal)(int, sighandler_fn);
static sighandler_fn (*next_sysv_signal)(int, sighandler_fn);
static sighandler_fn (*next_sigset)(int, sighandler_fn);
static int (*next_munmap)(void *, size_t);
static void *(*next_mremap)(void *, size_t, size_t, int, ...);
static int (*next_madvise)(void *, size_t, int);
static int (*next_mprotect)(void *, size_t, int);
static void *(*next_mmap)(void *, size_t, int, int, int, off_t);
static void *(*next_mmap64)(void *, size_t, int, int, int, off64_t);
static void (*next_free)(void *);
static void *(*next_realloc)(void *, size_t);
static void *(*next_reallocarray)(void *, size_t, size_t);
static size_t (*next_usable)(void *);
static ssize_t (*next_pread)(int, void *, size_t, off_t);
static ssize_t (*next_pread64)(int, void *, size_t, off64_t);
static ssize_t (*next_preadv)(int, const struct iovec *, int, off_t);
static ssize_t (*next_preadv64)(int, const struct iovec *, int, off64_t);
static ssize_t (*next_preadv2)(int, const struct iovec *, int, off_t, int);

extern void __libc_free(void *);
extern void *__libc_realloc(void *, size_t);

static __thread int resolving;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void resolve(void)
{
	resolving = 1;
#define R(v, name) v = (__typeof__(v))dlsym(RTLD_NEXT, name)
	R(next_sigaction, "sigaction");
	R(next_signal, "signal");
	R(next_sysv_signal, "sysv_signal");
	R(next_sigset, "sigset");
	R(next_munmap, "munmap");
	R(next_mremap, "mremap");
	R(next_madvise, "madvise");
	R(next_mprotect, "mprotect");
	R(next_mmap, "mmap");
	R(next_mmap64, "mmap64");
	R(next_free, "free");
	R(next_realloc, "realloc");
	R(next_reallocarray, "reallocarray");
	R(next_usable, "malloc_usable_size");
	R(next_pread, "pread");
	R(next_pread64, "pread64");
	R(next_preadv, "preadv");
	R(next_preadv64, "preadv64");
	R(next_preadv2, "preadv2");
#undef R
	resolving = 0;
}

static inline void need(void)
{
	if (__builtin_expect(!next_free, 0) && !resolving)
		pthread_once(&once, resolve);
}

/* From start-up (config.c), after the tunables. */
void sdp_az_switch_init(void)
{
	need();
	az_real_sigaction = next_sigaction;
	az_init();
}

static inline bool in_flight(void)
{
	return atomic_load_explicit(&az_nspans, memory_order_relaxed) != 0;
}

/* ---- SIGSEGV --------------------------------------------------------------- */

EXPORT int sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (__builtin_expect(!az_real_sigaction, 0)) {
		/* Before the library's start-up: a sanitizer runtime loaded
		 * ahead of us installs its handlers through us while it is not
		 * ready for anything but a pass-through. */
		int (*next)(int, const struct sigaction *, struct sigaction *) =
			__atomic_load_n(&next_sigaction, __ATOMIC_ACQUIRE);
		if (!next) {
			next = (__typeof__(next))dlsym(RTLD_NEXT, "sigaction");
			if (!next) {
				errno = ENOSYS;
				return -1;
			}
			__atomic_store_n(&next_sigaction, next, __ATOMIC_RELEASE);
		}
		return next(sig, act, old);
	}
	need();
	if (sig == SIGSEGV && az_sigaction(sig, act, old))
		return 0;
	return next_sigaction(sig, act, old);
}

/* signal() with BSD semantics (glibc's): restart, the signal blocked in
 * its handler. */
static sighandler_fn set_handler(int sig, sighandler_fn h, int flags, bool mask_self)
{
	struct sigaction a, o;
	memset(&a, 0, sizeof a);
	a.sa_handler = h;
	a.sa_flags = flags;
	sigemptyset(&a.sa_mask);
	if (mask_self)
		sigaddset(&a.sa_mask, sig);
	if (!az_sigaction(sig, &a, &o))
		return NULL;
	return o.sa_handler;
}

EXPORT sighandler_fn signal(int sig, sighandler_fn h)
{
	need();
	if (sig == SIGSEGV && h != SIG_ERR) {
		sighandler_fn o = set_handler(sig, h, SA_RESTART, true);
		if (o)
			return o;
	}
	return next_signal(sig, h);
}

EXPORT sighandler_fn bsd_signal(int sig, sighandler_fn h)
{
	return signal(sig, h);
}

EXPORT sighandler_fn ssignal(int sig, sighandler_fn h)
{
	return signal(sig, h);
}

EXPORT sighandler_fn sysv_signal(int sig, sighandler_fn h)
{
	need();
	if (sig == SIGSEGV && h != SIG_ERR) {
		sighandler_fn o = set_handler(sig, h, SA_RESETHAND | SA_NODEFER, false);
		if (o)
			return o;
	}
	return next_sysv_signal(sig, h);
}

EXPORT sighandler_fn sigset(int sig, sighandler_fn h)
{
	need();
	if (sig == SIGSEGV && h != SIG_HOLD && h != SIG_ERR) {
		sighandler_fn o = set_handler(sig, h, 0, false);
		if (o) {
			sigset_t s;
			sigemptyset(&s);
			sigaddset(&s, SIGSEGV);
			pthread_sigmask(SIG_UNBLOCK, &s, NULL);
			return o;
		}
	}
	return next_sigset(sig, h);
}

/* ---- memory that changes hands ------------------------------------------- */

EXPORT int munmap(void *a, size_t len)
{
	need();
	if (in_flight())
		az_mem_release((uintptr_t)a, (uintptr_t)a + len);
	int r = next_munmap(a, len);
	az_vma_changed();
	return r;
}

EXPORT void *mremap(void *old, size_t olen, size_t nlen, int flags, ...)
{
	need();
	void *to = NULL;
	if (flags & MREMAP_FIXED) {
		va_list ap;
		va_start(ap, flags);
		to = va_arg(ap, void *);
		va_end(ap);
	}
	if (in_flight()) {
		az_mem_release((uintptr_t)old, (uintptr_t)old + olen);
		if (to)
			az_mem_release((uintptr_t)to, (uintptr_t)to + nlen);
	}
	void *r = (flags & MREMAP_FIXED) ? next_mremap(old, olen, nlen, flags, to) :
					   next_mremap(old, olen, nlen, flags);
	az_vma_changed();
	return r;
}

EXPORT int madvise(void *a, size_t len, int advice)
{
	need();
	/* Advice that drops the contents (DONTNEED, FREE, REMOVE, and
	 * DONTNEED_LOCKED = 24): the bytes in flight go aside first. */
	if (in_flight() && (advice == MADV_DONTNEED || advice == MADV_FREE ||
			    advice == MADV_REMOVE || advice == 24))
		az_mem_discard((uintptr_t)a, (uintptr_t)a + len);
	return next_madvise(a, len, advice);
}

EXPORT int mprotect(void *a, size_t len, int prot)
{
	need();
	/* The application takes the pages' protection into its own hands:
	 * ours goes (what was advertised moves aside first). */
	if (in_flight())
		az_mem_release((uintptr_t)a, (uintptr_t)a + len);
	int r = next_mprotect(a, len, prot);
	az_vma_changed();
	return r;
}

EXPORT void *mmap(void *a, size_t len, int prot, int flags, int fd, off_t off)
{
	need();
	if (in_flight() && (flags & MAP_FIXED))
		az_mem_release((uintptr_t)a, (uintptr_t)a + len);
	void *r = next_mmap(a, len, prot, flags, fd, off);
	if (flags & MAP_FIXED)
		az_vma_changed();
	return r;
}

EXPORT void *mmap64(void *a, size_t len, int prot, int flags, int fd, off64_t off)
{
	need();
	if (in_flight() && (flags & MAP_FIXED))
		az_mem_release((uintptr_t)a, (uintptr_t)a + len);
	void *r = (next_mmap64 ? next_mmap64 : (void *(*)(void *, size_t, int, int, int, off64_t))
		   next_mmap)(a, len, prot, flags, fd, off);
	if (flags & MAP_FIXED)
		az_vma_changed();
	return r;
}

static void block_release(void *p)
{
	size_t n = next_usable ? next_usable(p) : 1;
	az_mem_release((uintptr_t)p, (uintptr_t)p + (n ? n : 1));
}

EXPORT void free(void *p)
{
	need();
	if (!next_free) {
		__libc_free(p);               /* while the next one is looked up */
		return;
	}
	if (p && in_flight())
		block_release(p);
	next_free(p);
}

EXPORT void *realloc(void *p, size_t n)
{
	need();
	if (!next_realloc)
		return __libc_realloc(p, n);
	if (p && in_flight())
		block_release(p);
	return next_realloc(p, n);
}

EXPORT void *reallocarray(void *p, size_t nm, size_t sz)
{
	need();
	if (p && in_flight())
		block_release(p);
	return next_reallocarray(p, nm, sz);
}

/* ---- the kernel writing into a buffer (mprotect only) --------------------- */

static inline void settle(void *b, size_t n)
{
	if (in_flight()) {
		struct iovec v = { b, n };
		az_settle_syscall(&v, 1);
	}
}

static inline void settle_v(const struct iovec *iov, int n)
{
	if (in_flight() && n > 0)
		az_settle_syscall(iov, n);
}

EXPORT ssize_t pread(int fd, void *b, size_t n, off_t off)
{
	need();
	settle(b, n);
	return next_pread(fd, b, n, off);
}

EXPORT ssize_t pread64(int fd, void *b, size_t n, off64_t off)
{
	need();
	settle(b, n);
	return next_pread64(fd, b, n, off);
}

EXPORT ssize_t preadv(int fd, const struct iovec *iov, int n, off_t off)
{
	need();
	settle_v(iov, n);
	return next_preadv(fd, iov, n, off);
}

EXPORT ssize_t preadv64(int fd, const struct iovec *iov, int n, off64_t off)
{
	need();
	settle_v(iov, n);
	return next_preadv64(fd, iov, n, off);
}

EXPORT ssize_t preadv2(int fd, const struct iovec *iov, int n, off_t off, int flags)
{
	need();
	settle_v(iov, n);
	return next_preadv2(fd, iov, n, off, flags);
}
