/*
 * io.c - interposed data calls: read/write and every send/recv variant,
 * including the FORTIFY entry points and sendfile.
 *
 * For an SDP fd each call becomes one sdp_send/sdp_recv over an iovec; for
 * anything else it is the libc call, after one table lookup.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <string.h>
#include <sys/sendfile.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sdp/az.h"
#include "switch/switch.h"
#include "sdp/sys.h"

extern void __chk_fail(void) __attribute__((noreturn));

/* The kernel is to write into the application's buffer: a page of it that
 * asynchronous zero copy protects with mprotect must be writable first
 * (sdp/az.h). One load while nothing is in flight. */
#define AZ_SETTLE(b, n) do { \
	if (atomic_load_explicit(&az_nspans, memory_order_relaxed)) { \
		struct iovec v_ = { (b), (n) }; \
		az_settle_syscall(&v_, 1); \
	} } while (0)
#define AZ_SETTLE_V(iov, n) do { \
	if (atomic_load_explicit(&az_nspans, memory_order_relaxed) && (n) > 0) \
		az_settle_syscall((iov), (n)); \
	} while (0)

/* A nonblocking connect may have finished (or failed) since the last call. */
static struct sdp_conn *settle(int fd, struct sdp_conn *c)
{
	if (atomic_load_explicit(&c->state, memory_order_relaxed) != SDP_ST_CONNECTING)
		return c;
	struct pollfd p = { .fd = fd, .events = POLLOUT };
	if (sys_poll(&p, 1, 0) <= 0)
		return c;
	union sdp_addr a;
	socklen_t l = sizeof a;
	if (sys_getpeername(fd, &a, &l) == 0) {
		sdp_connect_done(c, fd, 0);
		return c;
	}
	/* Failed: leave the error to the kernel socket; it is TCP now. */
	sdp_connect_done(c, fd, ECONNREFUSED);
	fd_forget(fd);
	fd_set_kind(fd, FDK_TCP);
	return NULL;
}

struct sdp_conn *sdp_fd_conn(int fd)
{
	struct sdp_conn *c = fd_conn(fd);
	if (!c)
		return NULL;
	if (__builtin_expect(sdp_fallback_pending(c), 0)) {
		fd_fallback(fd, c);
		return NULL;
	}
	return settle(fd, c);
}

/*
 * Inside a call on c (sdp_conn_enter): a close() of fd on another thread
 * keeps c's memory until we leave. Entered, fd must still name c - else it
 * was closed since we looked it up, and the call is the kernel's (EBADF, or
 * whatever socket took the number, as for TCP).
 */
bool conn_enter(struct sdp_conn *c, int fd)
{
	sdp_conn_enter(c);
	if (__builtin_expect(fd_conn(fd) == c, 1))
		return true;
	sdp_conn_leave(c);
	return false;
}

/* The last call to leave closes a number closed meanwhile (socket.c close). */
void conn_leave(struct sdp_conn *c)
{
	int e = errno;
	if (sdp_conn_leave(c))
		fd_close_deferred(c);
	errno = e;
}

static ssize_t do_send_in(struct sdp_conn *c, int fd, const struct iovec *iov,
			  int n, int flags);
static ssize_t do_recv_in(struct sdp_conn *c, int fd, const struct iovec *iov,
			  int n, int flags);

static ssize_t do_send(struct sdp_conn *c, int fd, const struct iovec *iov,
		       int n, int flags)
{
	if (!conn_enter(c, fd)) {
		struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };
		return real_sendmsg(fd, &m, flags);
	}
	ssize_t r = do_send_in(c, fd, iov, n, flags);
	conn_leave(c);
	return r;
}

static ssize_t do_recv(struct sdp_conn *c, int fd, const struct iovec *iov,
		       int n, int flags)
{
	if (!conn_enter(c, fd)) {
		struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };
		return real_recvmsg(fd, &m, flags);
	}
	ssize_t r = do_recv_in(c, fd, iov, n, flags);
	conn_leave(c);
	return r;
}

static ssize_t do_send_in(struct sdp_conn *c, int fd, const struct iovec *iov,
			  int n, int flags)
{
	ssize_t r = sdp_send(c, fd, iov, n, flags);
	if (r == -SDP_EFALLBACK) {
		fd_fallback(fd, c);
		struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };
		return real_sendmsg(fd, &m, flags);
	}
	if (r == -EPIPE && !(flags & MSG_NOSIGNAL))
		syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), SIGPIPE);
	return sdp_ret(r);
}

static ssize_t do_recv_in(struct sdp_conn *c, int fd, const struct iovec *iov,
			  int n, int flags)
{
	ssize_t r = sdp_recv(c, fd, iov, n, flags);
	if (r == -SDP_EFALLBACK) {
		fd_fallback(fd, c);
		struct msghdr m = { .msg_iov = (struct iovec *)iov, .msg_iovlen = (size_t)n };
		return real_recvmsg(fd, &m, flags);
	}
	return sdp_ret(r);
}

/* Passing an SDP socket to another process: it leaves SDP first. */
static void before_pass(const struct msghdr *m)
{
	if (!m || !m->msg_control || m->msg_controllen < sizeof(struct cmsghdr))
		return;
	for (struct cmsghdr *cm = CMSG_FIRSTHDR((struct msghdr *)m); cm;
	     cm = CMSG_NXTHDR((struct msghdr *)m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t n = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < n; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			struct sdp_conn *c = fd_conn(fd);
			if (c)
				fd_fallback_for(fd, c, "passed to another process (SCM_RIGHTS)");
			struct fdent *e = fd_get(fd);
			if (e && atomic_load(&e->kind) == FDK_LISTEN && e->l) {
				listen_defer_restore(fd);
				sdp_log(2, "listen fd %d: SDP withdrawn, new connections TCP "
					"(passed to another process with SCM_RIGHTS)", fd);
				sdp_listener_withdraw(e->l);
			}
		}
	}
}

EXPORT ssize_t read(int fd, void *buf, size_t n)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		AZ_SETTLE(buf, n);
		return real_read(fd, buf, n);
	}
	struct iovec v = { buf, n };
	return do_recv(c, fd, &v, 1, 0);
}

EXPORT ssize_t __read_chk(int fd, void *buf, size_t n, size_t buflen)
{
	if (n > buflen)
		__chk_fail();
	return read(fd, buf, n);
}

EXPORT ssize_t write(int fd, const void *buf, size_t n)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c)
		return real_write(fd, buf, n);
	struct iovec v = { (void *)buf, n };
	return do_send(c, fd, &v, 1, 0);
}

EXPORT ssize_t readv(int fd, const struct iovec *iov, int n)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		AZ_SETTLE_V(iov, n);
		return real_readv(fd, iov, n);
	}
	if (n < 0 || n > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	return do_recv(c, fd, iov, n, 0);
}

EXPORT ssize_t writev(int fd, const struct iovec *iov, int n)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c)
		return real_writev(fd, iov, n);
	if (n < 0 || n > IOV_MAX) {
		errno = EINVAL;
		return -1;
	}
	return do_send(c, fd, iov, n, 0);
}

EXPORT ssize_t recv(int fd, void *buf, size_t n, int flags)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		AZ_SETTLE(buf, n);
		return real_recv(fd, buf, n, flags);
	}
	struct iovec v = { buf, n };
	return do_recv(c, fd, &v, 1, flags);
}

EXPORT ssize_t __recv_chk(int fd, void *buf, size_t n, size_t buflen, int flags)
{
	if (n > buflen)
		__chk_fail();
	return recv(fd, buf, n, flags);
}

EXPORT ssize_t send(int fd, const void *buf, size_t n, int flags)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c)
		return real_send(fd, buf, n, flags);
	struct iovec v = { (void *)buf, n };
	return do_send(c, fd, &v, 1, flags);
}

EXPORT ssize_t recvfrom(int fd, void *buf, size_t n, int flags,
			struct sockaddr *addr, socklen_t *alen)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		AZ_SETTLE(buf, n);
		return real_recvfrom(fd, buf, n, flags, addr, alen);
	}
	struct iovec v = { buf, n };
	ssize_t r = do_recv(c, fd, &v, 1, flags);
	if (r >= 0 && addr && alen)
		*alen = 0;                    /* TCP reports no source address */
	return r;
}

EXPORT ssize_t __recvfrom_chk(int fd, void *buf, size_t n, size_t buflen,
			      int flags, struct sockaddr *addr, socklen_t *alen)
{
	if (n > buflen)
		__chk_fail();
	return recvfrom(fd, buf, n, flags, addr, alen);
}

EXPORT ssize_t sendto(int fd, const void *buf, size_t n, int flags,
		      const struct sockaddr *addr, socklen_t alen)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c)
		return real_sendto(fd, buf, n, flags, addr, alen);
	struct iovec v = { (void *)buf, n };
	return do_send(c, fd, &v, 1, flags);
}

EXPORT ssize_t recvmsg(int fd, struct msghdr *m, int flags)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		if (m && m->msg_iovlen <= IOV_MAX)
			AZ_SETTLE_V(m->msg_iov, (int)m->msg_iovlen);
		return real_recvmsg(fd, m, flags);
	}
	if (!m || m->msg_iovlen > IOV_MAX) {
		errno = m ? EMSGSIZE : EFAULT;
		return -1;
	}
	ssize_t r = do_recv(c, fd, m->msg_iov, (int)m->msg_iovlen, flags);
	if (r >= 0) {
		m->msg_namelen = 0;
		m->msg_controllen = 0;
		m->msg_flags = 0;
	}
	return r;
}

EXPORT ssize_t sendmsg(int fd, const struct msghdr *m, int flags)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		if (m && m->msg_controllen)
			before_pass(m);
		return real_sendmsg(fd, m, flags);
	}
	if (!m || m->msg_iovlen > IOV_MAX) {
		errno = m ? EMSGSIZE : EFAULT;
		return -1;
	}
	return do_send(c, fd, m->msg_iov, (int)m->msg_iovlen, flags);
}

EXPORT int recvmmsg(int fd, struct mmsghdr *v, unsigned n, int flags,
		    struct timespec *timeout)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c)
		return real_recvmmsg(fd, v, n, flags, timeout);
	unsigned i;
	int f = flags & ~MSG_WAITFORONE;
	for (i = 0; i < n; i++) {
		ssize_t r = recvmsg(fd, &v[i].msg_hdr, f);
		if (r < 0)
			return i ? (int)i : -1;
		v[i].msg_len = (unsigned)r;
		if (r == 0)
			return (int)i + 1;
		if (flags & MSG_WAITFORONE)
			f |= MSG_DONTWAIT;
	}
	return (int)i;
}

EXPORT int sendmmsg(int fd, struct mmsghdr *v, unsigned n, int flags)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(fd);
	if (!c) {
		for (unsigned i = 0; i < n; i++)
			if (v[i].msg_hdr.msg_controllen)
				before_pass(&v[i].msg_hdr);
		return real_sendmmsg(fd, v, n, flags);
	}
	unsigned i;
	for (i = 0; i < n; i++) {
		ssize_t r = sendmsg(fd, &v[i].msg_hdr, flags);
		if (r < 0)
			return i ? (int)i : -1;
		v[i].msg_len = (unsigned)r;
	}
	return (int)i;
}

static ssize_t sendfile_sdp(struct sdp_conn *c, int out, int in, off_t *off,
			    size_t count)
{
	char buf[65536];
	size_t done = 0;
	off_t pos = off ? *off : 0;
	while (done < count) {
		size_t want = count - done < sizeof buf ? count - done : sizeof buf;
		ssize_t n = off ? pread(in, buf, want, pos) : real_read(in, buf, want);
		if (n < 0) {
			if (done)
				break;
			return -1;
		}
		if (n == 0)
			break;
		struct iovec v = { buf, (size_t)n };
		ssize_t w = do_send(c, out, &v, 1, 0);
		if (w < 0) {
			if (!off && done == 0)
				return -1;
			if (done == 0)
				return -1;
			break;
		}
		done += (size_t)w;
		pos += w;
		if (w < n) {
			/* Nonblocking partial send: put back what was not sent. */
			if (!off)
				lseek(in, (off_t)w - n, SEEK_CUR);
			break;
		}
	}
	if (off)
		*off = pos;
	return (ssize_t)done;
}

EXPORT ssize_t sendfile(int out, int in, off_t *off, size_t count)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(out);
	if (!c)
		return real_sendfile(out, in, off, count);
	return sendfile_sdp(c, out, in, off, count);
}

EXPORT ssize_t sendfile64(int out, int in, off_t *off, size_t count)
{
	SDP_INIT();
	struct sdp_conn *c = sdp_fd_conn(out);
	if (!c)
		return (real_sendfile64 ? real_sendfile64 : real_sendfile)(out, in, off, count);
	return sendfile_sdp(c, out, in, off, count);
}
