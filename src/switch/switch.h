/*
 * switch.h - internals of the socket switch shared by its files.
 *
 * The switch keeps, per file descriptor, what the descriptor is to SDP:
 * nothing (pass through), a TCP socket not yet decided, a listener (with its
 * rendezvous), an SDP connection, or a TCP connection the policy or the
 * peer kept on TCP. The application always holds the real TCP socket fd;
 * SDP state hangs off it, so getsockname, getpeername, fcntl, dup and fork
 * act on a real kernel object.
 */
#ifndef SDP_SWITCH_H
#define SDP_SWITCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "switch/policy.h"
#include "sdp/log.h"

#define EXPORT __attribute__((visibility("default")))

enum fd_kind {
	FDK_NONE = 0,     /* not a TCP socket we know: pass through */
	FDK_INET,         /* AF_INET/AF_INET6 stream socket, undecided */
	FDK_LISTEN,       /* listening; l != NULL if SDP is offered */
	FDK_SDP,          /* connection over SDP: c */
	FDK_TCP,          /* connection on plain TCP */
	FDK_EPOLL,        /* an epoll instance with SDP members: ep */
	FDK_FALLING,      /* SDP -> TCP: its socket being replaced (for a
			   * moment; fd_fb_install) */
};

struct ep_shadow;

/* Options the application set on a socket before it became a connection
 * (inherited by accepted sockets from their listener): only these need to
 * be read back from the kernel when the connection goes over SDP. */
enum {
	OPT_NODELAY  = 1 << 0,
	OPT_CORK     = 1 << 1,
	OPT_RCVLOWAT = 1 << 2,
	OPT_NONBLOCK = 1 << 3,        /* O_NONBLOCK known to be set */
	OPT_TIMEO    = 1 << 4,        /* SO_RCVTIMEO, SO_SNDTIMEO or SO_LINGER
				       * set (read back together) */
	OPT_SNDBUF   = 1 << 5,        /* SO_SNDBUF set (the byte window, tx.c) */
	OPT_RCVBUF   = 1 << 6,        /* SO_RCVBUF set */
	OPT_UNKNOWN  = 1 << 7,        /* socket we did not see created: ask */
};

struct fdent {
	_Atomic uint8_t kind;
	_Atomic uint8_t deferred;      /* closed by the application while a call
					* of another thread was in its SDP
					* connection: still open until that call
					* returns (fd_close_deferred) */
	_Atomic uint8_t opts;
	/* Listener offering SDP: the TCP_DEFER_ACCEPT the application set, in
	 * seconds as the kernel reports it, kept off the kernel socket
	 * (defer.c); 0 none, -1 handed back to the kernel. */
	_Atomic int32_t defer_s;
	struct sdp_conn *c;
	struct sdp_listener *l;
	struct ep_shadow *ep;
};

/* fdtab.c */
struct fdent *fd_get(int fd);           /* NULL if out of range */
static inline int fd_kind(int fd)
{
	struct fdent *e = fd_get(fd);
	return e ? atomic_load_explicit(&e->kind, memory_order_acquire) : FDK_NONE;
}
void fd_wait_settled(struct fdent *e);   /* while FDK_FALLING */
static inline struct sdp_conn *fd_conn(int fd)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return NULL;
	uint8_t k = atomic_load_explicit(&e->kind, memory_order_acquire);
	if (k == FDK_SDP)
		return e->c;
	if (k == FDK_FALLING)
		fd_wait_settled(e);           /* then TCP: its new socket */
	return NULL;
}
void fd_set_sdp(int fd, struct sdp_conn *c);      /* takes a process hold */
/* A stream connection on plain TCP: recorded (for sdp stat) as kind TCP. */
void fd_set_tcp(int fd, enum sdp_role role);
void fd_set_listen(int fd, struct sdp_listener *l);
void fd_set_kind(int fd, int kind);
/* Forget fd (closed by the app). Releases the SDP connection if this was
 * the process's last fd for it (fd must still be open for FIN/drain). */
void fd_forget(int fd);
/* close(): the same, but when another thread's call is inside the SDP
 * connection the number stays open until that call returns (true: do not
 * close it now), as the kernel keeps a file while a call holds it. */
bool fd_forget_close(int fd);
/* After the last call inside c left (io.c): a close deferred meanwhile. */
void fd_close_deferred(struct sdp_conn *c);
/* The application replaces or closes n by other means (dup2, dup3,
 * close_range) while its close is deferred: the deferred socket moves to
 * a number of ours first. */
void fd_deferred_move(int n);
void fd_dup(int oldfd, int newfd);
void fd_fork_prepare(void);
void fd_fork_failed(void);
/* The connection left SDP (sdp/fallback.c): every fd of this process that
 * names it becomes plain TCP. */
void fd_fallback(int fd, struct sdp_conn *c);
/* The same, saying why this side hands the connection back (for the log;
 * fd_fallback says whether the peer asked for it). */
void fd_fallback_for(int fd, struct sdp_conn *c, const char *why);
/* After a hand-back: every fd naming c becomes TCP (and the substitute
 * socket of a peer gone, fallback.c); sdp_fb_install_hook. */
void fd_fb_install(struct sdp_conn *c, int fd);
void fd_locks_init(void);                /* once, at the library's start */
void fd_before_exec(void);
/* The same, for a program started with extra descriptors (posix_spawn). */
void fd_before_exec_with(const int *extra, int nextra);
struct sdp_conn *sdp_fd_conn(int fd);   /* fd_conn + connect/fallback upkeep */
/* io.c: a call inside c's connection (sdp_conn_enter), if fd still names
 * it; conn_leave closes what a close() of another thread deferred. */
bool conn_enter(struct sdp_conn *c, int fd);
void conn_leave(struct sdp_conn *c);
int  fd_table_size(void);
/* Before a seccomp filter (sandbox.c): hand every SDP connection back to
 * TCP, withdraw the listeners, release everything; returns the number of
 * connections handed back. fd_passthru: from then on no fd is known. */
int  fd_leave_all(void);
void fd_passthru(void);
void conn_hold(struct sdp_conn *c);

/* azsw.c: Asynchronous Zero Copy's view of signals and memory calls */
void sdp_az_switch_init(void);

/* ours.c: the library's own descriptors (sys.h sys_fd_ours) are not
 * open to the application */
int  ours_not_open(const char *call, int fd);           /* -1, EBADF */
int  ours_dup_onto(int o, int n);                       /* 0: go ahead; -1, EBADF */
int  ours_close_range_around(unsigned first, unsigned last, int flags);

/* config.c */
void sdp_init(void);
extern int sdp_inited;
#define SDP_INIT() do { if (__builtin_expect(!sdp_inited, 0)) sdp_init(); } while (0)
/* sandbox.c: set once the process is under seccomp (its own filter, or
 * one it started under); every call then passes straight through and the
 * library makes no system call of its own. */
extern _Atomic int sdp_passthru;
bool sdp_seccomp_at_start(void);
/* A vfork child shares our memory (fd table included) but not our file
 * descriptors: there the switch only passes calls through. */
extern pid_t sdp_pid;
static inline bool sdp_in_vfork_child(void)
{
	return !atomic_load_explicit(&sdp_passthru, memory_order_relaxed) &&
	       getpid() != sdp_pid;
}
/* SDP or TCP for this socket, and the provider the policy forces
 * (*fabric, FAB_PREF_ANY: whichever reaches the peer); when the answer is
 * TCP, why[n] (if why is not NULL) says why (policy file:line). */
enum sdp_use sdp_decide(enum sdp_role role, const struct sockaddr *a, socklen_t l,
			enum fab_pref *fabric, char *why, size_t n);
extern const char *sdp_prog;

/* The next definition of each interposed function (libc), resolved in
 * config.c. */
#define REAL_FUNCS(X) \
	X(int, socket, (int, int, int)) \
	X(int, socketpair, (int, int, int, int *)) \
	X(int, listen, (int, int)) \
	X(int, connect, (int, const struct sockaddr *, socklen_t)) \
	X(int, accept, (int, struct sockaddr *, socklen_t *)) \
	X(int, accept4, (int, struct sockaddr *, socklen_t *, int)) \
	X(int, close, (int)) \
	X(int, close_range, (unsigned, unsigned, int)) \
	X(int, dup, (int)) \
	X(int, dup2, (int, int)) \
	X(int, dup3, (int, int, int)) \
	X(int, fcntl, (int, int, ...)) \
	X(int, fcntl64, (int, int, ...)) \
	X(int, ioctl, (int, unsigned long, ...)) \
	X(int, setsockopt, (int, int, int, const void *, socklen_t)) \
	X(int, getsockopt, (int, int, int, void *, socklen_t *)) \
	X(int, shutdown, (int, int)) \
	X(ssize_t, read, (int, void *, size_t)) \
	X(ssize_t, write, (int, const void *, size_t)) \
	X(ssize_t, readv, (int, const struct iovec *, int)) \
	X(ssize_t, writev, (int, const struct iovec *, int)) \
	X(ssize_t, recv, (int, void *, size_t, int)) \
	X(ssize_t, send, (int, const void *, size_t, int)) \
	X(ssize_t, recvfrom, (int, void *, size_t, int, struct sockaddr *, socklen_t *)) \
	X(ssize_t, sendto, (int, const void *, size_t, int, const struct sockaddr *, socklen_t)) \
	X(ssize_t, recvmsg, (int, struct msghdr *, int)) \
	X(ssize_t, sendmsg, (int, const struct msghdr *, int)) \
	X(int, recvmmsg, (int, struct mmsghdr *, unsigned, int, struct timespec *)) \
	X(int, sendmmsg, (int, struct mmsghdr *, unsigned, int)) \
	X(ssize_t, sendfile, (int, int, off_t *, size_t)) \
	X(ssize_t, sendfile64, (int, int, off_t *, size_t)) \
	X(ssize_t, __read_chk, (int, void *, size_t, size_t)) \
	X(ssize_t, __recv_chk, (int, void *, size_t, size_t, int)) \
	X(ssize_t, __recvfrom_chk, (int, void *, size_t, size_t, int, struct sockaddr *, socklen_t *)) \
	X(int, poll, (struct pollfd *, nfds_t, int)) \
	X(int, ppoll, (struct pollfd *, nfds_t, const struct timespec *, const sigset_t *)) \
	X(int, select, (int, fd_set *, fd_set *, fd_set *, struct timeval *)) \
	X(int, pselect, (int, fd_set *, fd_set *, fd_set *, const struct timespec *, const sigset_t *)) \
	X(int, epoll_create, (int)) \
	X(int, epoll_create1, (int)) \
	X(int, epoll_ctl, (int, int, int, struct epoll_event *)) \
	X(int, epoll_wait, (int, struct epoll_event *, int, int)) \
	X(int, epoll_pwait, (int, struct epoll_event *, int, int, const sigset_t *)) \
	X(int, epoll_pwait2, (int, struct epoll_event *, int, const struct timespec *, const sigset_t *)) \
	X(pid_t, fork, (void))

#include <poll.h>
#include <sys/select.h>
#include <signal.h>
#define X(ret, name, args) extern ret (*real_##name) args;
REAL_FUNCS(X)
#undef X

/* defer.c: TCP_DEFER_ACCEPT on listeners that offer SDP */
/* listen() made fd a listener; offered: it offers SDP */
void listen_defer_take(int fd, bool offered);
void listen_defer_restore(int fd);      /* it stops offering SDP */
/* setsockopt/getsockopt of TCP_DEFER_ACCEPT: true if handled (*r set) */
bool listen_defer_set(int fd, const void *val, socklen_t len, int *r);
bool listen_defer_get(int fd, void *val, socklen_t *len, int *r);

/* epoll.c */
void epoll_forget_fd(int fd);
void epoll_drop_parked(int fd);
void epoll_adopt(int fd, struct sdp_conn *c);   /* connect() made fd SDP */
void epoll_drop_pending(int fd);                /* ... or plain TCP */
/* This process changed an SDP socket's readiness itself (shutdown,
 * options, a hand-back): epoll sets look at all their members again. */
void epoll_local_change(void);
void epoll_shadow_free(struct ep_shadow *s);
void epoll_leave_all(void);     /* members go back to the kernel (fd_leave_all) */
/* fork: every epoll lock taken before the real fork (process.c), released
 * in the parent; the child's made anew (fdtab.c's pthread_atfork handler). */
void epoll_fork_prepare(void);
void epoll_fork_parent(void);
void epoll_fork_child(void);
void spawn_fork_child(void);     /* process.c: its lock made anew */
void sandbox_fork_child(void);   /* sandbox.c: its lock made anew */

/* How long a poll/epoll sleep may last: until deadline (0 = none), cut to
 * SDP_SHARED_SLICE_MS when another sleeper consumes the tokens of one of
 * our sockets, to a few ms while a fabric holds sends (fabric.h
 * fab_held_ms: the caller pushes them with fab_held_push before each
 * sleep), and to SDP_CHECK_MS in any case (conn.h). */
static inline const struct timespec *sdp_sleep_ts(uint64_t deadline, bool shared,
						  struct timespec *ts)
{
	uint64_t left = UINT64_MAX;
	if (deadline) {
		uint64_t now = sdp_now_ns();
		left = now < deadline ? deadline - now : 0;
	}
	if (shared && left > SDP_SHARED_SLICE_MS * 1000000ull)
		left = SDP_SHARED_SLICE_MS * 1000000ull;
	if (left > SDP_CHECK_MS * 1000000ull)
		left = SDP_CHECK_MS * 1000000ull;   /* look again (conn.h) */
	int held = fab_held_ms(-1);
	if (held >= 0 && left > (uint64_t)held * 1000000ull)
		left = (uint64_t)held * 1000000ull;
	ts->tv_sec = (time_t)(left / 1000000000);
	ts->tv_nsec = (long)(left % 1000000000);
	return ts;
}

/* Convert an engine result (-errno) at the POSIX boundary. */
static inline long sdp_ret(long r)
{
	if (r < 0) {
		errno = (int)-r;
		return -1;
	}
	return r;
}

#endif
