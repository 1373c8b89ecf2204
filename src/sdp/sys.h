/*
 * sys.h - raw system calls for the library's own use.
 *
 * libsdp exports close, poll, fcntl, connect, ... for the application; a
 * call to those names from inside the library would come back into the
 * switch. Internal code uses these wrappers instead. They return -1/errno
 * like libc.
 */
#ifndef SDP_SYS_H
#define SDP_SYS_H

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

static inline int sys_close(int fd) { return (int)syscall(SYS_close, fd); }
static inline int sys_open(const char *path, int flags) { return (int)syscall(SYS_openat, AT_FDCWD, path, flags, 0); }
static inline ssize_t sys_read(int fd, void *b, size_t n) { return syscall(SYS_read, fd, b, n); }
static inline int sys_fcntl(int fd, int cmd, long arg) { return (int)syscall(SYS_fcntl, fd, cmd, arg); }
static inline int sys_socket(int d, int t, int p) { return (int)syscall(SYS_socket, d, t, p); }
static inline int sys_bind(int fd, const void *a, socklen_t l) { return (int)syscall(SYS_bind, fd, a, l); }
static inline int sys_shutdown(int fd, int how) { return (int)syscall(SYS_shutdown, fd, how); }
static inline int sys_listen(int fd, int b) { return (int)syscall(SYS_listen, fd, b); }
static inline int sys_connect(int fd, const void *a, socklen_t l) { return (int)syscall(SYS_connect, fd, a, l); }
static inline int sys_accept4(int fd, void *a, socklen_t *l, int f) { return (int)syscall(SYS_accept4, fd, a, l, f); }
static inline ssize_t sys_sendmsg(int fd, const struct msghdr *m, int f) { return syscall(SYS_sendmsg, fd, m, f); }
static inline ssize_t sys_recvmsg(int fd, struct msghdr *m, int f) { return syscall(SYS_recvmsg, fd, m, f); }
static inline ssize_t sys_recvfrom(int fd, void *b, size_t n, int f) { return syscall(SYS_recvfrom, fd, b, n, f, NULL, NULL); }
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

#endif
