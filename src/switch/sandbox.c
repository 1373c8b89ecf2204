/*
 * sandbox.c - processes that sandbox themselves with seccomp.
 *
 * A seccomp filter limits the system calls a process may make; sshd's
 * pre-authentication child, for instance, is killed by any call outside a
 * short list. SDP makes calls of its own that such a program never makes
 * (wake-up tokens with sendto, futex, ppoll, memfd_create, AF_UNIX
 * rendezvous, Cross Memory Attach), so under a filter the library steps
 * aside:
 *
 *   - The ways a program installs a filter are interposed: prctl
 *     (PR_SET_SECCOMP), and the seccomp(2) system call made through
 *     glibc's syscall() (libseccomp uses one of the two). Before the call
 *     reaches the kernel, every SDP connection of the process is handed
 *     back to plain TCP (sdp_fallback: nothing lost), its listeners stop
 *     offering SDP, epoll sets give their SDP members back to the kernel,
 *     and the fd table forgets everything.
 *   - From then on the process is in pass-through: every interposed call
 *     goes straight to libc, the library makes no system call of its own,
 *     and the exit-time statistics are written now instead of at exit.
 *     Children forked later inherit the pass-through.
 *   - A process started under a filter (an exec under a filter keeps it)
 *     is in pass-through from start-up: "Seccomp:" in /proc/self/status,
 *     read with the calls the dynamic loader itself just made.
 *
 * syscall() is interposed for every system call number: it forwards its
 * six argument words unchanged, with a system call instruction of its own
 * where the architecture is known (so that it needs nothing resolved and
 * can run before the library's start-up), through libc's syscall()
 * elsewhere.
 */
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/seccomp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#include "switch/switch.h"

_Atomic int sdp_passthru;

/* ---- system calls without libc's syscall() -------------------------------- */

#if defined(__x86_64__)
static long raw_syscall(long nr, long a, long b, long c, long d, long e, long f)
{
	register long r10 __asm__("r10") = d;
	register long r8 __asm__("r8") = e;
	register long r9 __asm__("r9") = f;
	long ret;
	__asm__ volatile("syscall"
			 : "=a"(ret)
			 : "a"(nr), "D"(a), "S"(b), "d"(c), "r"(r10), "r"(r8), "r"(r9)
			 : "rcx", "r11", "memory");
	return ret;
}
#define HAVE_RAW 1
#elif defined(__aarch64__)
static long raw_syscall(long nr, long a, long b, long c, long d, long e, long f)
{
	register long x8 __asm__("x8") = nr;
	register long x0 __asm__("x0") = a;
	register long x1 __asm__("x1") = b;
	register long x2 __asm__("x2") = c;
	register long x3 __asm__("x3") = d;
	register long x4 __asm__("x4") = e;
	register long x5 __asm__("x5") = f;
	__asm__ volatile("svc 0"
			 : "+r"(x0)
			 : "r"(x8), "r"(x1), "r"(x2), "r"(x3), "r"(x4), "r"(x5)
			 : "memory");
	return x0;
}
#define HAVE_RAW 1
#endif

typedef long (*syscall_fn)(long, ...);
typedef int (*prctl_fn)(int, ...);

/* A system call with libc's conventions: -1 and errno on failure. */
static long do_syscall(long nr, long a, long b, long c, long d, long e, long f)
{
#ifdef HAVE_RAW
	long r = raw_syscall(nr, a, b, c, d, e, f);
	if ((unsigned long)r > -4096ul) {
		errno = (int)-r;
		return -1;
	}
	return r;
#else
	static _Atomic(syscall_fn) next;
	syscall_fn fn = atomic_load_explicit(&next, memory_order_acquire);
	if (!fn) {
		fn = (syscall_fn)dlsym(RTLD_NEXT, "syscall");
		atomic_store_explicit(&next, fn, memory_order_release);
	}
	return fn(nr, a, b, c, d, e, f);
#endif
}

/* ---- leaving SDP -------------------------------------------------------------- */

static pthread_mutex_t enter_lock = PTHREAD_MUTEX_INITIALIZER;

/* The child of a fork (config.c's pthread_atfork handler). */
void sandbox_fork_child(void)
{
	pthread_mutex_init(&enter_lock, NULL);
}

/* Called before a filter is installed: afterwards the library must make
 * no system call of its own in this process. */
static void sandbox_enter(const char *how)
{
	static bool done;
	SDP_INIT();
	pthread_mutex_lock(&enter_lock);
	if (!done && !atomic_load(&sdp_passthru)) {
		int n = fd_leave_all();
		sdp_log(1, "%s: seccomp filter: %d SDP connection(s) handed back to TCP; "
			"libsdp passes every call through from now on", how, n);
		sdp_proc_write_stats(getenv("SDP_STATS_DIR"));
		atomic_store(&sdp_passthru, 1);
		fd_passthru();
	}
	done = true;
	pthread_mutex_unlock(&enter_lock);
}

/* Does this call install a filter? (Probes with no program, such as
 * libseccomp's check for the seccomp system call, do not.) */
static bool installs_filter_prctl(unsigned long mode, unsigned long prog)
{
	return mode == SECCOMP_MODE_STRICT || (mode == SECCOMP_MODE_FILTER && prog);
}

static bool installs_filter_seccomp(unsigned long op, unsigned long prog)
{
	return op == SECCOMP_SET_MODE_STRICT || (op == SECCOMP_SET_MODE_FILTER && prog);
}

/* Reads six argument words whatever the caller passed, as glibc's own
 * syscall() does (the kernel ignores the ones a call does not take): for
 * a caller that passed fewer, the last reads are of its stack, which is
 * harmless but which AddressSanitizer would flag. */
__attribute__((no_sanitize_address))
EXPORT long syscall(long nr, ...)
{
	va_list ap;
	va_start(ap, nr);
	long a = va_arg(ap, long), b = va_arg(ap, long), c = va_arg(ap, long);
	long d = va_arg(ap, long), e = va_arg(ap, long), f = va_arg(ap, long);
	va_end(ap);
	if (__builtin_expect(nr == SYS_seccomp || nr == SYS_prctl, 0) &&
	    !atomic_load_explicit(&sdp_passthru, memory_order_relaxed)) {
		if (nr == SYS_seccomp && installs_filter_seccomp((unsigned long)a, (unsigned long)c))
			sandbox_enter("seccomp()");
		else if (nr == SYS_prctl && a == PR_SET_SECCOMP &&
			 installs_filter_prctl((unsigned long)b, (unsigned long)c))
			sandbox_enter("prctl(PR_SET_SECCOMP)");
	}
	return do_syscall(nr, a, b, c, d, e, f);
}

EXPORT int prctl(int option, ...)
{
	static _Atomic(prctl_fn) next;
	va_list ap;
	va_start(ap, option);
	unsigned long a = va_arg(ap, unsigned long), b = va_arg(ap, unsigned long);
	unsigned long c = va_arg(ap, unsigned long), d = va_arg(ap, unsigned long);
	va_end(ap);
	if (option == PR_SET_SECCOMP && installs_filter_prctl(a, b))
		sandbox_enter("prctl(PR_SET_SECCOMP)");
	prctl_fn fn = atomic_load_explicit(&next, memory_order_acquire);
	if (!fn) {
		fn = (prctl_fn)dlsym(RTLD_NEXT, "prctl");
		atomic_store_explicit(&next, fn, memory_order_release);
	}
	if (!fn)
		return (int)do_syscall(SYS_prctl, option, (long)a, (long)b, (long)c, (long)d, 0);
	return fn(option, a, b, c, d);
}

/* ---- start-up under a filter -------------------------------------------------- */

/* Is this process already under seccomp? Read /proc/self/status with
 * openat, read and close, as the dynamic loader did to load us. A status
 * the process cannot read for another reason than its absence may itself
 * be the filter's doing: then assume one. */
bool sdp_seccomp_at_start(void)
{
	char buf[4096];
	int fd = (int)do_syscall(SYS_openat, AT_FDCWD, (long)"/proc/self/status",
				 O_RDONLY | O_CLOEXEC, 0, 0, 0);
	if (fd < 0)
		return errno != ENOENT;
	size_t len = 0;
	for (;;) {
		long n = do_syscall(SYS_read, fd, (long)(buf + len), (long)(sizeof buf - 1 - len),
				    0, 0, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		len += (size_t)n;
		if (len == sizeof buf - 1)
			break;
	}
	do_syscall(SYS_close, fd, 0, 0, 0, 0, 0);
	buf[len] = 0;
	const char *p = strstr(buf, "\nSeccomp:");
	if (!p)
		return false;                 /* a kernel without seccomp */
	p += strlen("\nSeccomp:");
	while (*p == ' ' || *p == '\t')
		p++;
	return *p != '0';
}
