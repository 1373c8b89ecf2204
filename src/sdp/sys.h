/*
 * sys.h - raw system calls for the library's own use.
 *
 * libsdp exports close, poll, fcntl, connect, ... for the application; a
 * call to those names from inside the library would come back into the
 * switch. Internal code (src/sdp, src/fabric) uses these wrappers
 * instead. They return -1/errno like libc.
 */
#ifndef SDP_SYS_H
#define SDP_SYS_H

#include <fcntl.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/*
 * The descriptors the library holds for long (its listeners' rendezvous,
 * group blocks and queues, wake-up fds, the pool...) are marked here, so
 * that the application's own close, close_range, closefrom, dup, fcntl,
 * fstat and epoll_ctl treat them as not open (switch/ours.c): a daemon that
 * closes every descriptor it does not know, or a loop of close() over all
 * numbers, must not take the library's from under it. Marked by
 * sys_fd_keep, unmarked by sys_close. Numbers beyond the map are not
 * marked (and so not protected).
 */
#define SYS_FDMAP_BITS (1u << 20)
extern _Atomic unsigned long sys_fd_map[SYS_FDMAP_BITS / (8 * sizeof(unsigned long))];
#define SYS_FDMAP_W(fd) ((unsigned)(fd) / (8 * sizeof(unsigned long)))
#define SYS_FDMAP_B(fd) (1ul << ((unsigned)(fd) % (8 * sizeof(unsigned long))))

static inline bool sys_fd_ours(int fd)
{
	return fd >= 0 && (unsigned)fd < SYS_FDMAP_BITS &&
	       (atomic_load_explicit(&sys_fd_map[SYS_FDMAP_W(fd)], memory_order_relaxed) &
		SYS_FDMAP_B(fd));
}

static inline void sys_fd_mark(int fd, bool ours)
{
	if (fd < 0 || (unsigned)fd >= SYS_FDMAP_BITS)
		return;
	if (ours)
		atomic_fetch_or(&sys_fd_map[SYS_FDMAP_W(fd)], SYS_FDMAP_B(fd));
	else if (atomic_load_explicit(&sys_fd_map[SYS_FDMAP_W(fd)], memory_order_relaxed) &
		 SYS_FDMAP_B(fd))
		atomic_fetch_and(&sys_fd_map[SYS_FDMAP_W(fd)], ~SYS_FDMAP_B(fd));
}

static inline int sys_close(int fd)
{
	sys_fd_mark(fd, false);
	return (int)syscall(SYS_close, fd);
}
static inline int sys_open(const char *path, int flags) { return (int)syscall(SYS_openat, AT_FDCWD, path, flags, 0); }
static inline int sys_open_mode(const char *path, int flags, mode_t mode) { return (int)syscall(SYS_openat, AT_FDCWD, path, flags, mode); }
static inline ssize_t sys_read(int fd, void *b, size_t n) { return syscall(SYS_read, fd, b, n); }
static inline ssize_t sys_write(int fd, const void *b, size_t n) { return syscall(SYS_write, fd, b, n); }
static inline int sys_fcntl(int fd, int cmd, long arg) { return (int)syscall(SYS_fcntl, fd, cmd, arg); }
static inline int sys_fstat(int fd, struct stat *st) { return (int)syscall(SYS_fstat, fd, st); }
static inline int sys_socket(int d, int t, int p) { return (int)syscall(SYS_socket, d, t, p); }
static inline int sys_bind(int fd, const void *a, socklen_t l) { return (int)syscall(SYS_bind, fd, a, l); }
static inline int sys_shutdown(int fd, int how) { return (int)syscall(SYS_shutdown, fd, how); }
static inline int sys_listen(int fd, int b) { return (int)syscall(SYS_listen, fd, b); }
static inline int sys_connect(int fd, const void *a, socklen_t l) { return (int)syscall(SYS_connect, fd, a, l); }
static inline int sys_socketpair(int d, int t, int p, int *sv) { return (int)syscall(SYS_socketpair, d, t, p, sv); }
static inline int sys_accept4(int fd, void *a, socklen_t *l, int f) { return (int)syscall(SYS_accept4, fd, a, l, f); }
static inline ssize_t sys_sendmsg(int fd, const struct msghdr *m, int f) { return syscall(SYS_sendmsg, fd, m, f); }
static inline ssize_t sys_recvmsg(int fd, struct msghdr *m, int f) { return syscall(SYS_recvmsg, fd, m, f); }
static inline ssize_t sys_recvfrom(int fd, void *b, size_t n, int f) { return syscall(SYS_recvfrom, fd, b, n, f, NULL, NULL); }
static inline ssize_t sys_send(int fd, const void *b, size_t n, int f) { return syscall(SYS_sendto, fd, b, n, f, NULL, 0); }
static inline int sys_getsockname(int fd, void *a, socklen_t *l) { return (int)syscall(SYS_getsockname, fd, a, l); }
static inline int sys_getpeername(int fd, void *a, socklen_t *l) { return (int)syscall(SYS_getpeername, fd, a, l); }
static inline int sys_getsockopt(int fd, int lv, int o, void *v, socklen_t *l) { return (int)syscall(SYS_getsockopt, fd, lv, o, v, l); }
static inline int sys_setsockopt(int fd, int lv, int o, const void *v, socklen_t l) { return (int)syscall(SYS_setsockopt, fd, lv, o, v, l); }
static inline int sys_poll(struct pollfd *p, nfds_t n, int ms)
{
	struct timespec ts, *tp = NULL;
	if (ms >= 0) {
		ts.tv_sec = ms / 1000;
		ts.tv_nsec = (long)(ms % 1000) * 1000000;
		tp = &ts;
	}
	return (int)syscall(SYS_ppoll, p, n, tp, NULL, (size_t)8);
}

/* A descriptor the library keeps (its own, or one a provider's library
 * made for it: fabric.h fab_private), moved out of the numbers the
 * application expects. The kernel gives every new descriptor the lowest
 * free number, and applications size their tables by the descriptors they
 * opened themselves (wrk's event loop: 3 per connection + 10; select:
 * FD_SETSIZE; redis: maxclients + 128): ours in between would push theirs
 * past those tables, where kernel TCP would not. So ours live in the upper
 * half of the soft RLIMIT_NOFILE (from 900 at least, from 65536 at most:
 * the kernel's table grows to the highest number in use). Where that
 * range is full the descriptor keeps its number. The moved one is
 * close-on-exec; fd < 0 is returned as it is. */
#define SYS_FD_HIGH_MIN 900
#define SYS_FD_HIGH_MAX 65536
static inline int sys_fd_base(void)
{
	struct rlimit rl;
	if (syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl) != 0 ||
	    rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur / 2 >= SYS_FD_HIGH_MAX)
		return SYS_FD_HIGH_MAX;
	return rl.rlim_cur / 2 > SYS_FD_HIGH_MIN ? (int)(rl.rlim_cur / 2) : SYS_FD_HIGH_MIN;
}

/* fd moved to min or above (close-on-exec), or left where it is when it
 * is there already or no number is free. */
static inline int sys_fd_move(int fd, int min)
{
	if (fd < 0 || fd >= min)
		return fd;
	int h = sys_fcntl(fd, F_DUPFD_CLOEXEC, min);
	if (h < 0)
		return fd;
	sys_close(fd);
	return h;
}

static inline int sys_fd_high(int fd)
{
	return fd < 0 ? fd : sys_fd_move(fd, sys_fd_base());
}

/* A descriptor the library keeps for long: moved to min or above (-1: the
 * upper half of RLIMIT_NOFILE, as sys_fd_high) and marked as the
 * library's (sys_fd_ours). Where no number is free it keeps its own,
 * marked all the same. fd < 0 is returned as it is. */
static inline int sys_fd_keep(int fd, int min)
{
	if (fd < 0)
		return fd;
	fd = sys_fd_move(fd, min < 0 ? sys_fd_base() : min);
	sys_fd_mark(fd, true);
	return fd;
}

/* Closes a descriptor sys_fd_keep made, unless the program has taken its
 * number since (dup2 onto it: switch/ours.c): that file is the program's.
 * Parts of the library that use a kept descriptor ask sys_fd_ours first,
 * or check its identity (inode, name). */
static inline int sys_close_kept(int fd)
{
	return sys_fd_ours(fd) ? sys_close(fd) : 0;
}

#endif
