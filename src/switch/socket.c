/*
 * socket.c - interposed socket life-cycle calls: socket, listen, connect,
 * accept, close, dup, fcntl, ioctl, setsockopt/getsockopt, shutdown.
 *
 * Decisions happen here: a listener offers SDP when the server policy
 * allows it (hello.c publishes its rendezvous); a connect uses SDP when the
 * client policy allows it and an SDP listener serves the destination; an
 * accepted socket is SDP when its client said hello. Everything else passes
 * straight to libc.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/sockios.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "switch/switch.h"
#include "sdp/sys.h"

static bool is_tcp_type(int domain, int type, int proto)
{
	return (domain == AF_INET || domain == AF_INET6) &&
	       (type & 0xf) == SOCK_STREAM &&
	       (proto == 0 || proto == IPPROTO_TCP);
}

static uint8_t fd_opts(int fd)
{
	struct fdent *e = fd_get(fd);
	return e ? atomic_load(&e->opts) : OPT_UNKNOWN;
}

static void fd_opt_set(int fd, uint8_t bit, bool on)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	if (on)
		atomic_fetch_or(&e->opts, bit);
	else
		atomic_fetch_and(&e->opts, (uint8_t)~bit);
}

/* Fill in what a new SDP connection needs to know about its TCP socket.
 * opts: what the application set (fd_opts); only that is read back. */
static void conn_adopt(int fd, struct sdp_conn *c, bool nonblock, uint8_t opts)
{
	struct stat st;
	if (sys_fstat(fd, &st) == 0)
		c->tcp_ino = st.st_ino;
	if (opts & OPT_UNKNOWN) {
		int fl = sys_fcntl(fd, F_GETFL, 0);
		nonblock |= fl >= 0 && (fl & O_NONBLOCK);
		opts |= OPT_NODELAY | OPT_CORK | OPT_RCVLOWAT;
	}
	atomic_store(&c->nonblock, nonblock || (opts & OPT_NONBLOCK));
	if (opts & (OPT_TIMEO | OPT_UNKNOWN)) {
		struct timeval tv;
		socklen_t tl = sizeof tv;
		if (sys_getsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, &tl) == 0)
			atomic_store(&c->rcvtimeo_us, (int64_t)tv.tv_sec * 1000000 + tv.tv_usec);
		tl = sizeof tv;
		if (sys_getsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, &tl) == 0)
			atomic_store(&c->sndtimeo_us, (int64_t)tv.tv_sec * 1000000 + tv.tv_usec);
		/* SO_LINGER (also inherited from a listener): a close that
		 * resets must reset over SDP too. */
		struct linger lg;
		tl = sizeof lg;
		if (sys_getsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, &tl) == 0 &&
		    lg.l_onoff && lg.l_linger == 0)
			sdp_linger_set(c, true);
	}
	/* The TCP socket now only carries 1-byte wake-up tokens: Nagle or a
	 * cork would hold them back behind delayed ACKs. The application's
	 * own settings are remembered and reported back to it. TCP_NODELAY
	 * itself: a network provider's now; shm sets it before its first
	 * token (shm.c send_token), and a hand-back before its re-send. */
	int v = 0;
	socklen_t vl = sizeof v;
	if ((opts & OPT_NODELAY) && sys_getsockopt(fd, SOL_TCP, TCP_NODELAY, &v, &vl) == 0)
		atomic_store(&c->app_nodelay, v != 0);
	vl = sizeof v;
	if ((opts & OPT_CORK) && sys_getsockopt(fd, SOL_TCP, TCP_CORK, &v, &vl) == 0 && v) {
		atomic_store(&c->app_cork, 1);
		v = 0;
		sys_setsockopt(fd, SOL_TCP, TCP_CORK, &v, sizeof v);
	}
	v = 1;
	if (!c->ep.ops || (c->ep.ops->traits & FAB_T_REMOTE))
		sys_setsockopt(fd, SOL_TCP, TCP_NODELAY, &v, sizeof v);
	/* Buffer sizes the application chose (on this socket or, inherited
	 * by the kernel, on its listener) limit the bytes in flight. */
	if (opts & OPT_SNDBUF)
		sdp_bufsize_set(c, fd, true);
	if (opts & OPT_RCVBUF)
		sdp_bufsize_set(c, fd, false);
	/* SO_RCVLOWAT is ours now: on the kernel socket it would hold back
	 * the 1-byte wake-ups. */
	vl = sizeof v;
	if ((opts & OPT_RCVLOWAT) &&
	    sys_getsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, &vl) == 0 && v > 1) {
		atomic_store(&c->rcvlowat, (uint32_t)v);
		v = 1;
		sys_setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &v, sizeof v);
	}
}

EXPORT int socket(int domain, int type, int protocol)
{
	SDP_INIT();
	int fd = real_socket(domain, type, protocol);
	if (fd >= 0 && fab_private)
		fd = sys_fd_high(fd);         /* a provider's: not at the app's numbers */
	if (fd >= 0) {
		/* a provider's own socket (fabric.h fab_private) is not the
		 * application's: passed through like any other descriptor */
		fd_set_kind(fd, is_tcp_type(domain, type, protocol) && !fab_private ?
			    FDK_INET : FDK_NONE);
		struct fdent *e = fd_get(fd);
		if (e)
			atomic_store(&e->opts, (type & SOCK_NONBLOCK) ? OPT_NONBLOCK : 0);
		else if (is_tcp_type(domain, type, protocol) &&
			 !atomic_load_explicit(&sdp_passthru, memory_order_relaxed))
			sdp_log(2, "socket fd %d: TCP (above the %d descriptors the library "
				"tracks: the hard RLIMIT_NOFILE when it started)", fd,
				fd_table_size());
	}
	return fd;
}

/* Does the policy let this listening socket offer SDP, and over which
 * provider (*pref)? If not, why. */
static bool offers_sdp(int fd, enum fab_pref *pref, char *why, size_t n)
{
	union sdp_addr a;
	socklen_t len = sizeof a;
	*pref = FAB_PREF_ANY;
	if (sys_getsockname(fd, &a, &len) < 0) {
		snprintf(why, n, "cannot read the listening address");
		return false;
	}
	return sdp_decide(SDP_ROLE_SERVER, &a.sa, len, pref, why, n) != SDP_USE_TCP;
}

EXPORT int listen(int fd, int backlog)
{
	SDP_INIT();
	if (fd_kind(fd) != FDK_INET)
		return real_listen(fd, backlog);
	/* A SO_REUSEPORT socket bound to a port joins its group's rendezvous
	 * before the kernel can give it a SYN (hello.c, group.c); a group
	 * member the policy keeps on TCP joins too, to withdraw the group. */
	int one = 0;
	socklen_t ol = sizeof one;
	union sdp_addr a;
	socklen_t len = sizeof a;
	bool early = sys_getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, &ol) == 0 && one &&
		     sys_getsockname(fd, &a, &len) == 0 &&
		     (a.sa.sa_family == AF_INET ? a.in.sin_port : a.in6.sin6_port) != 0;
	struct sdp_listener *l = NULL;
	char why[300] = "no rendezvous";
	bool offer = false;
	enum fab_pref fab = FAB_PREF_ANY;
	int e = 0;
	sdp_why_take();
	if (early) {
		offer = offers_sdp(fd, &fab, why, sizeof why);
		e = sdp_listener_open(fd, offer, fab, &l);
	} else {
		sdp_net_prepare(fd);
	}
	int r = real_listen(fd, backlog);
	if (r < 0) {
		int le = errno;
		if (l) {                      /* let the fd table count its holders */
			fd_set_listen(fd, l);
			fd_forget(fd);
			fd_set_kind(fd, FDK_INET);
		}
		errno = le;
		return r;
	}
	if (!early) {
		offer = offers_sdp(fd, &fab, why, sizeof why);
		if (offer)
			e = sdp_listener_open(fd, true, fab, &l);
	}
	bool said = false;                    /* withdrawn (a group's), or no SDP */
	if (offer) {
		const char *w = sdp_why_take();
		said = w != NULL;
		snprintf(why, sizeof why, "%s", w ? w : e < 0 ? strerror(-e) : "no rendezvous");
		if (e < 0)
			sdp_log(1, "listen fd %d: SDP not offered (%s)", fd, why);
	}
	fd_set_listen(fd, l);
	sdp_proc_note_socket();
	listen_defer_take(fd, l && offer && !said);
	epoll_drop_pending(fd);               /* a listener never becomes SDP */
	if (l && offer && !said)
		sdp_log(2, "listen fd %d: SDP offered", fd);
	else
		sdp_log(2, "listen fd %d: TCP only (%s)", fd, why);
	return r;
}

/* Test only (tests/c/t_putback.c): with SDP_TEST_HELLO_GATE="W:R" the
 * process's first SDP connect, once its hello is queued and before its
 * SYN, writes a byte to descriptor W and waits for one on R - so a test
 * can order another connection between the two. Looked at once. */
static void test_hello_gate(void)
{
	static _Atomic bool looked;
	if (atomic_load_explicit(&looked, memory_order_relaxed) ||
	    atomic_exchange(&looked, true))
		return;
	const char *g = getenv("SDP_TEST_HELLO_GATE");
	int w, r;
	if (!g || sscanf(g, "%d:%d", &w, &r) != 2)
		return;
	char b = 'h';
	if (sys_write(w, &b, 1) != 1)
		return;
	while (sys_read(r, &b, 1) < 0 && errno == EINTR)
		;
}

EXPORT int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
	SDP_INIT();
	if (fd_kind(fd) != FDK_INET || !addr ||
	    (addr->sa_family != AF_INET && addr->sa_family != AF_INET6))
		return real_connect(fd, addr, len);
	struct sdp_conn *c = NULL;
	struct sdp_connect_state cs = { 0 };
	enum fab_pref fab;
	char why[300];
	sdp_why_take();
	if (sdp_decide(SDP_ROLE_CLIENT, addr, len, &fab, why, sizeof why) != SDP_USE_TCP) {
		c = sdp_hello_connect(fd, addr, len, fab, &cs);
		const char *w = sdp_why_take();
		snprintf(why, sizeof why, "%s", w ? w : "no SDP listener serves the destination");
	}
	int r, e;
	if (c)
		test_hello_gate();
	if (cs.deferred) {
		/* Release the SYN held back while the hello was queued: a
		 * zero-length send completes a deferred connect (blocking:
		 * waits for the handshake; non-blocking: EINPROGRESS). */
		long w = syscall(SYS_sendto, fd, NULL, 0, MSG_NOSIGNAL, NULL, 0);
		r = w < 0 ? -1 : 0;
		e = w < 0 ? errno : 0;
		if (r < 0 && e == EAGAIN)
			e = EINPROGRESS;      /* SO_SNDTIMEO ran out: still going */
	} else if (cs.issued) {
		r = cs.result < 0 ? -1 : 0;
		e = cs.result < 0 ? -cs.result : 0;
	} else {
		r = real_connect(fd, addr, len);
		e = errno;
	}
	if (!c) {
		if (r == 0 || e == EINPROGRESS) {
			fd_set_tcp(fd, SDP_ROLE_CLIENT);
			sdp_proc_count(0, 1, false);
			epoll_drop_pending(fd);
			sdp_log(2, "connect fd %d: TCP (%s)", fd, why);
		}
		errno = e;
		return r;
	}
	if (r == 0 || e == EINPROGRESS) {
		if (r == 0)
			sdp_connect_done(c, fd, 0);
		conn_adopt(fd, c, false, fd_opts(fd));
		fd_set_sdp(fd, c);
		epoll_adopt(fd, c);
		sdp_proc_count(1, 0, FAB_EP_NET(&c->ep));
		sdp_log(2, "connect fd %d: SDP over %s%s", fd, c->ep.label, r ? " (in progress)" : "");
	} else {
		sdp_connect_done(c, fd, e);
		sdp_conn_drop(c);
	}
	errno = e;
	return r;
}

/* A client that said hello and cannot be served: reset its connection
 * (it sees ECONNRESET, as if the server had aborted it at once). */
static void refuse_conn(int lfd, int nfd, const char *why)
{
	sdp_log(0, "accept fd %d: an SDP client could not be served (%s): "
		"connection reset", lfd, why ? why : "?");
	struct linger lg = { .l_onoff = 1, .l_linger = 0 };
	sys_setsockopt(nfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	fd_set_kind(nfd, FDK_NONE);
	real_close(nfd);
}

/* Record an accepted socket; -1 when it was refused (and closed). peer:
 * its peer's address if accept() returned it whole, else NULL. l: the
 * listener, held since before the kernel's accept (accept_common). */
static int after_accept(int lfd, int nfd, int flags, const struct sockaddr *peer,
			socklen_t peer_len, struct sdp_listener *l)
{
	struct fdent *e = fd_get(lfd);
	int k = l ? FDK_LISTEN : e ? atomic_load(&e->kind) : FDK_NONE;
	if (k != FDK_LISTEN && k != FDK_INET) {
		fd_set_kind(nfd, FDK_NONE);
		return nfd;
	}
	int refuse = 0;
	const char *why = NULL;
	sdp_why_take();
	struct sdp_conn *c = l ? sdp_hello_accept(l, nfd, peer, peer_len, &refuse, &why) :
			     NULL;
	if (refuse < 0) {
		refuse_conn(lfd, nfd, why);
		return -1;
	}
	if (refuse > 0) {                     /* a listener's wake-up: not the app's */
		sdp_log(2, "accept fd %d: a joining listener's wake-up connection, dropped",
			lfd);
		fd_set_kind(nfd, FDK_NONE);
		real_close(nfd);
		return -1;
	}
	/* Accepted sockets inherit the listener's options, not O_NONBLOCK. */
	uint8_t opts = (atomic_load(&e->opts) & ~OPT_NONBLOCK) |
		       ((flags & SOCK_NONBLOCK) ? OPT_NONBLOCK : 0);
	struct fdent *ne = fd_get(nfd);
	if (ne)
		atomic_store(&ne->opts, opts);
	if (c) {
		conn_adopt(nfd, c, flags & SOCK_NONBLOCK, opts);
		fd_set_sdp(nfd, c);
		sdp_proc_count(1, 0, FAB_EP_NET(&c->ep));
		sdp_log(2, "accept fd %d -> %d: SDP over %s", lfd, nfd, c->ep.label);
	} else {
		fd_set_tcp(nfd, SDP_ROLE_SERVER);
		sdp_proc_count(0, 1, false);
		const char *w = sdp_why_take();
		sdp_log(2, "accept fd %d -> %d: TCP (%s)", lfd, nfd,
			k != FDK_LISTEN ? "listen() was not seen on this socket" :
			!l ? "the listener offers TCP only, see its listen line" :
			w ? w : "the client sent no hello: not an SDP client");
	}
	return nfd;
}

/* Taking an SDP client's hello needs descriptors besides the connection's
 * own: the rendezvous connection, the client's memfd, one to put a hello
 * back. Without them the client could only be reset. So near the fd limit
 * they are made sure of before the kernel's accept: lacking them, accept()
 * fails with EMFILE and the connection stays queued, as with TCP when no
 * descriptor is left (here: when fewer than ACCEPT_SPARE + 1 are). */
#define ACCEPT_SPARE 3   /* rendezvous connection, the region's memfd, a put-back */
static _Atomic int accept_last = -1;           /* fd the last accept returned */
static __thread int spare[ACCEPT_SPARE];
static __thread int nspare;

static void unreserve(void)
{
	while (nspare > 0)
		sys_close(spare[--nspare]);
}

/* Is the last accepted descriptor within 64 of RLIMIT_NOFILE? The limit is
 * read at most every NOFILE_TTL_NS while far from it (a getrlimit per
 * accept was one system call in 14 of a connection's set-up), and read
 * afresh whenever the remembered one says near. */
#define NOFILE_TTL_NS 100000000ull
static bool near_nofile(void)
{
	static _Atomic uint64_t lim, at_ns;      /* rlim_cur (0: none), when read */
	rlim_t last = (rlim_t)atomic_load(&accept_last);
	uint64_t now = sdp_now_ns(), l = atomic_load_explicit(&lim, memory_order_relaxed);
	if (l && now - atomic_load_explicit(&at_ns, memory_order_relaxed) < NOFILE_TTL_NS &&
	    last + 64 < l)
		return false;
	struct rlimit rl;
	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return false;
	atomic_store_explicit(&lim, rl.rlim_cur == RLIM_INFINITY ? UINT64_MAX :
			      (uint64_t)rl.rlim_cur, memory_order_relaxed);
	atomic_store_explicit(&at_ns, now, memory_order_relaxed);
	return rl.rlim_cur != RLIM_INFINITY && last + 64 >= rl.rlim_cur;
}

/* 0, or -EMFILE when the descriptors are not there. */
static int reserve(int lfd)
{
	struct fdent *e = fd_get(lfd);
	if (!e || atomic_load(&e->kind) != FDK_LISTEN || !e->l || !near_nofile())
		return 0;                     /* plenty of room (the usual case) */
	/* Hellos already taken hold their memfds: the connections they name
	 * are the next ones in the kernel's queue, and taking one of those
	 * needs no further descriptor (its memfd is closed once mapped).
	 * Asking for spares on top would refuse every accept for ever while
	 * those hellos hold the very descriptors that are missing. */
	if (sdp_listener_pending(e->l) > 0)
		return 0;
	while (nspare < ACCEPT_SPARE) {
		int d = sys_fcntl(lfd, F_DUPFD_CLOEXEC, 0);
		if (d < 0) {
			int err = errno;
			unreserve();
			return err == EMFILE ? -EMFILE : 0;
		}
		spare[nspare++] = d;
	}
	return 0;
}

/* A refused connection is invisible to the application: accept the next
 * one (a nonblocking listener then says EAGAIN if there is none). The
 * kernel gets the application's own call (four: accept4): a seccomp
 * filter may allow accept and not accept4. The peer's address comes with
 * it (the hello is matched on it): into our own buffer when the
 * application asks for none, else read back from the application's when
 * it holds any address whole (the kernel wrote it: we never write
 * memory the application did not give the kernel). */
static int accept_common(int fd, struct sockaddr *addr, socklen_t *len, int flags,
			 bool four)
{
	socklen_t len0 = len ? *len : 0;
	union sdp_addr own;
	for (;;) {
		socklen_t ownl = sizeof own;
		struct sockaddr *a = addr;
		socklen_t *al = len;
		if (!addr) {
			a = &own.sa;
			al = &ownl;
		}
		int r = reserve(fd);
		if (r < 0) {
			sdp_log(2, "accept fd %d: EMFILE: too few descriptors left to "
				"take an SDP client's hello", fd);
			errno = -r;
			return -1;
		}
		/* The listener is held across the kernel's accept: a close of
		 * the listening socket on another thread meanwhile must not
		 * leave a client that sent its hello unserved (the kernel
		 * keeps a listener a blocked accept holds, too). */
		struct fdent *le = fd_get(fd);
		struct sdp_listener *l = le && atomic_load(&le->kind) == FDK_LISTEN ?
					 sdp_listener_hold(&le->l) : NULL;
		int n = four ? real_accept4(fd, a, al, flags) : real_accept(fd, a, al);
		int e = errno;
		unreserve();
		if (n < 0) {
			sdp_listener_put(l);
			errno = e;
			return n;
		}
		atomic_store(&accept_last, n);
		/* The address is whole if it fit the room given. */
		bool whole = al && *al <= (addr ? len0 : (socklen_t)sizeof own) &&
			     *al >= sizeof(sa_family_t);
		int got = after_accept(fd, n, flags, whole ? a : NULL, whole ? *al : 0, l);
		sdp_listener_put(l);
		if (got >= 0) {
			errno = e;
			return n;
		}
		if (len)
			*len = len0;
	}
}

/* A connection a provider's library accepts for itself (fabric.h
 * fab_private: libfabric's passive endpoint) is the provider's: passed
 * through, at a number out of the application's way (sys.h sys_fd_high). */
static int accept_private(int fd, struct sockaddr *addr, socklen_t *len, int flags,
			  bool four)
{
	int n = four ? real_accept4(fd, addr, len, flags) : real_accept(fd, addr, len);
	if (n >= 0) {
		int e = errno;
		n = sys_fd_high(n);
		fd_set_kind(n, FDK_NONE);
		errno = e;
	}
	return n;
}

EXPORT int accept(int fd, struct sockaddr *addr, socklen_t *len)
{
	SDP_INIT();
	if (fab_private)
		return accept_private(fd, addr, len, 0, false);
	return accept_common(fd, addr, len, 0, false);
}

EXPORT int accept4(int fd, struct sockaddr *addr, socklen_t *len, int flags)
{
	SDP_INIT();
	if (fab_private)
		return accept_private(fd, addr, len, flags, true);
	return accept_common(fd, addr, len, flags, true);
}

/* Passed through; interposed only so that the pairs a provider's library
 * makes for itself (libfabric's wait objects) take no number the
 * application would get. */
EXPORT int socketpair(int domain, int type, int protocol, int sv[2])
{
	SDP_INIT();
	int r = real_socketpair(domain, type, protocol, sv);
	if (r == 0) {
		if (fab_private) {
			sv[0] = sys_fd_high(sv[0]);
			sv[1] = sys_fd_high(sv[1]);
		}
		fd_set_kind(sv[0], FDK_NONE);
		fd_set_kind(sv[1], FDK_NONE);
	}
	return r;
}

EXPORT int close(int fd)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(fd), 0))
		return ours_not_open("close", fd);
	struct fdent *e = fd_get(fd);
	/* (the vfork check is a system call: only for a number we know) */
	if (e && (atomic_load(&e->kind) != FDK_NONE || atomic_load(&e->deferred)) &&
	    !sdp_in_vfork_child()) {
		if (__builtin_expect(atomic_load(&e->deferred), 0)) {
			errno = EBADF;        /* closed already (fd_forget_close) */
			return -1;
		}
		if (atomic_load(&e->kind) != FDK_NONE && fd_forget_close(fd))
			return 0;             /* closed when the other call returns */
	}
	return real_close(fd);
}

EXPORT int close_range(unsigned first, unsigned last, int flags)
{
	SDP_INIT();
	if (!(flags & CLOSE_RANGE_CLOEXEC) && !sdp_in_vfork_child()) {
		int n = fd_table_size();
		for (unsigned fd = first; fd <= last && (int)fd < n; fd++) {
			fd_deferred_move((int)fd);
			if (fd_kind((int)fd) != FDK_NONE)
				fd_forget((int)fd);
		}
	}
	if (first > last) {
		errno = EINVAL;
		return -1;
	}
	return ours_close_range_around(first, last, flags);
}

/* glibc's closefrom() calls close_range inside libc: ours is here. */
EXPORT void closefrom(int lowfd)
{
	SDP_INIT();
	unsigned lo = lowfd < 0 ? 0u : (unsigned)lowfd;
	if (close_range(lo, ~0u, 0) == 0)
		return;
	/* A kernel without close_range: each number up to the limit. */
	struct rlimit rl;
	rlim_t n = getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY &&
		   rl.rlim_cur < (1u << 20) ? rl.rlim_cur : (1u << 20);
	for (rlim_t fd = lo; fd < n; fd++)
		if (!sys_fd_ours((int)fd))
			close((int)fd);
}

/* In a vfork child our fd table is the parent's: only make sure an SDP
 * socket that is about to get a second number (for the program to be
 * exec'd) has left SDP. */
static bool vfork_dup(int o)
{
	if (!sdp_in_vfork_child())
		return false;
	struct sdp_conn *c = fd_conn(o);
	if (c)
		fd_fallback_for(o, c, "a vfork child gives it to the program it runs");
	return true;
}

EXPORT int dup(int fd)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(fd), 0))
		return ours_not_open("dup", fd);
	if (vfork_dup(fd))
		return real_dup(fd);
	int n = real_dup(fd);
	if (n >= 0)
		fd_dup(fd, n);
	return n;
}

static int dup_common(int o, int n, int r)
{
	if (r >= 0 && o != n)
		fd_dup(o, n);
	return r;
}

EXPORT int dup2(int o, int n)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(o) || (o != n && sys_fd_ours(n)), 0) &&
	    !sdp_in_vfork_child() && ours_dup_onto(o, n) < 0)
		return -1;
	if (vfork_dup(o))
		return real_dup2(o, n);
	if (o != n)
		fd_deferred_move(n);
	if (o != n && fd_kind(n) != FDK_NONE && sys_fcntl(o, F_GETFD, 0) >= 0)
		fd_forget(n);                 /* dup2 closes n first */
	return dup_common(o, n, real_dup2(o, n));
}

EXPORT int dup3(int o, int n, int flags)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(o) || (o != n && sys_fd_ours(n)), 0) &&
	    !sdp_in_vfork_child() && ours_dup_onto(o, n) < 0)
		return -1;
	if (vfork_dup(o))
		return real_dup3(o, n, flags);
	if (o != n)
		fd_deferred_move(n);
	if (o != n && fd_kind(n) != FDK_NONE && sys_fcntl(o, F_GETFD, 0) >= 0)
		fd_forget(n);
	return dup_common(o, n, real_dup3(o, n, flags));
}

static int fcntl_common(int (*fn)(int, int, ...), int fd, int cmd, va_list ap)
{
	long arg = va_arg(ap, long);
	if ((cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) && vfork_dup(fd))
		return fn(fd, cmd, arg);
	int r = fn(fd, cmd, arg);
	if (r < 0)
		return r;
	if (cmd == F_DUPFD || cmd == F_DUPFD_CLOEXEC) {
		fd_dup(fd, r);
	} else if (cmd == F_SETFL) {
		struct sdp_conn *c = fd_conn(fd);
		if (c)
			atomic_store(&c->nonblock, (arg & O_NONBLOCK) != 0);
		else if (fd_kind(fd) != FDK_NONE)
			fd_opt_set(fd, OPT_NONBLOCK, (arg & O_NONBLOCK) != 0);
	}
	return r;
}

EXPORT int fcntl(int fd, int cmd, ...)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(fd), 0))
		return ours_not_open("fcntl", fd);
	va_list ap;
	va_start(ap, cmd);
	int r = fcntl_common(real_fcntl, fd, cmd, ap);
	va_end(ap);
	return r;
}

EXPORT int fcntl64(int fd, int cmd, ...)
{
	SDP_INIT();
	if (__builtin_expect(sys_fd_ours(fd), 0))
		return ours_not_open("fcntl", fd);
	va_list ap;
	va_start(ap, cmd);
	int r = fcntl_common(real_fcntl64 ? real_fcntl64 : real_fcntl, fd, cmd, ap);
	va_end(ap);
	return r;
}

EXPORT int ioctl(int fd, unsigned long req, ...)
{
	SDP_INIT();
	va_list ap;
	va_start(ap, req);
	void *arg = va_arg(ap, void *);
	va_end(ap);
	struct sdp_conn *c = fd_conn(fd);
	if (c && req == FIONREAD && conn_enter(c, fd)) {
		int v = sdp_fionread(c);
		conn_leave(c);
		if (!arg) {
			errno = EFAULT;
			return -1;
		}
		*(int *)arg = v;
		return 0;
	}
	int r = real_ioctl(fd, req, arg);
	if (r == 0 && req == FIONBIO && arg) {
		if (c)
			atomic_store(&c->nonblock, *(int *)arg != 0);
		else if (fd_kind(fd) != FDK_NONE)
			fd_opt_set(fd, OPT_NONBLOCK, *(int *)arg != 0);
	}
	return r;
}

static int setsockopt_in(int fd, int level, int name, const void *val, socklen_t len);
static int getsockopt_in(int fd, int level, int name, void *val, socklen_t *len);

/* Options read and change the connection: held like a data call (io.c
 * conn_enter), so a close() on another thread cannot release it under us. */
EXPORT int setsockopt(int fd, int level, int name, const void *val, socklen_t len)
{
	SDP_INIT();
	struct sdp_conn *c = fd_conn(fd);
	if (!c || !conn_enter(c, fd))
		return setsockopt_in(fd, level, name, val, len);
	int r = setsockopt_in(fd, level, name, val, len);
	conn_leave(c);                        /* keeps errno */
	return r;
}

EXPORT int getsockopt(int fd, int level, int name, void *val, socklen_t *len)
{
	SDP_INIT();
	struct sdp_conn *c = fd_conn(fd);
	if (!c || !conn_enter(c, fd))
		return getsockopt_in(fd, level, name, val, len);
	int r = getsockopt_in(fd, level, name, val, len);
	conn_leave(c);
	return r;
}

static int setsockopt_in(int fd, int level, int name, const void *val, socklen_t len)
{
	int dr;
	if (level == SOL_TCP && name == TCP_DEFER_ACCEPT && listen_defer_set(fd, val, len, &dr))
		return dr;
	struct sdp_conn *c = fd_conn(fd);
	/* The options readiness depends on (POLLIN from SO_RCVLOWAT, POLLOUT
	 * from the buffer sizes): epoll sets look at every member once more.
	 * Not for the others - TCP_NODELAY, SO_KEEPALIVE... on every accepted
	 * socket made a server's every wait look at all its connections. */
	if (c && level == SOL_SOCKET &&
	    (name == SO_RCVLOWAT || name == SO_SNDBUF || name == SO_SNDBUFFORCE ||
	     name == SO_RCVBUF || name == SO_RCVBUFFORCE))
		epoll_local_change();
	if (level == SOL_TCP && name >= SDP_TRANSPORT && name <= SDP_SPIN_US &&
	    fd_kind(fd) != FDK_NONE) {
		if (!c) {                     /* not (yet) SDP: accept tunables */
			if (name == SDP_ZCOPY_THRESH || name == SDP_SPIN_US)
				return 0;
			errno = ENOPROTOOPT;
			return -1;
		}
		if (len < sizeof(int) || !val) {
			errno = EINVAL;
			return -1;
		}
		int v = *(const int *)val;
		if (v < 0) {
			errno = EINVAL;
			return -1;
		}
		if (name == SDP_ZCOPY_THRESH)
			atomic_store(&c->zcopy_thresh, (uint32_t)v);
		else if (name == SDP_SPIN_US)
			atomic_store(&c->spin_us, (uint32_t)v);
		else {
			errno = ENOPROTOOPT;
			return -1;
		}
		return 0;
	}
	if (c && level == SOL_SOCKET && name == SO_RCVLOWAT) {
		if (!val || len < sizeof(int)) {
			errno = EINVAL;
			return -1;
		}
		int v = *(const int *)val;
		atomic_store(&c->rcvlowat, v < 1 ? 1u : (uint32_t)v);
		return 0;
	}
	if (c && level == SOL_TCP && (name == TCP_NODELAY || name == TCP_CORK)) {
		if (!val || len < sizeof(int)) {
			errno = EINVAL;
			return -1;
		}
		atomic_store(name == TCP_NODELAY ? &c->app_nodelay : &c->app_cork,
			     *(const int *)val != 0);
		return 0;
	}
	int r = real_setsockopt(fd, level, name, val, len);
	if (r == 0 && !c) {
		if (level == SOL_TCP && name == TCP_NODELAY)
			fd_opt_set(fd, OPT_NODELAY, true);
		else if (level == SOL_TCP && name == TCP_CORK)
			fd_opt_set(fd, OPT_CORK, true);
		else if (level == SOL_SOCKET && name == SO_RCVLOWAT)
			fd_opt_set(fd, OPT_RCVLOWAT, true);
	}
	if (r == 0 && c && level == SOL_SOCKET &&
	    (name == SO_SNDTIMEO || name == SO_RCVTIMEO) &&
	    len >= sizeof(struct timeval)) {
		const struct timeval *tv = val;
		atomic_store(name == SO_SNDTIMEO ? &c->sndtimeo_us : &c->rcvtimeo_us,
			     (int64_t)tv->tv_sec * 1000000 + tv->tv_usec);
	}
	if (r == 0 && !c && level == SOL_SOCKET &&
	    (name == SO_SNDTIMEO || name == SO_RCVTIMEO || name == SO_LINGER))
		fd_opt_set(fd, OPT_TIMEO, true);
	if (r == 0 && level == SOL_SOCKET &&
	    (name == SO_SNDBUF || name == SO_SNDBUFFORCE ||
	     name == SO_RCVBUF || name == SO_RCVBUFFORCE)) {
		/* The kernel keeps the value (doubled, clamped) and reports
		 * it; the SDP window takes it from there. */
		bool snd = name == SO_SNDBUF || name == SO_SNDBUFFORCE;
		if (c)
			sdp_bufsize_set(c, fd, snd);
		else
			fd_opt_set(fd, snd ? OPT_SNDBUF : OPT_RCVBUF, true);
	}
	if (r == 0 && c && level == SOL_SOCKET && name == SO_LINGER &&
	    len >= sizeof(struct linger)) {
		const struct linger *lg = val;
		sdp_linger_set(c, lg->l_onoff && lg->l_linger == 0);
	}
	return r;
}

static int put_int(void *val, socklen_t *len, int v)
{
	if (!val || !len || *len < sizeof(int)) {
		errno = EINVAL;
		return -1;
	}
	*(int *)val = v;
	*len = sizeof(int);
	return 0;
}

static int getsockopt_in(int fd, int level, int name, void *val, socklen_t *len)
{
	int dr;
	if (level == SOL_TCP && name == TCP_DEFER_ACCEPT && listen_defer_get(fd, val, len, &dr))
		return dr;
	struct sdp_conn *c = fd_conn(fd);
	if (level == SOL_TCP && name >= SDP_TRANSPORT && name <= SDP_SPIN_US) {
		int k = fd_kind(fd);
		if (k == FDK_NONE) {
			int proto = 0;
			socklen_t pl = sizeof proto;
			if (sys_getsockopt(fd, SOL_SOCKET, SO_PROTOCOL, &proto, &pl) == 0 &&
			    proto == IPPROTO_TCP)
				k = FDK_TCP;
		}
		if (k == FDK_NONE)
			return real_getsockopt(fd, level, name, val, len);
		switch (name) {
		case SDP_TRANSPORT:
			return put_int(val, len, c != NULL);
		case SDP_ZCOPY_THRESH:
			return put_int(val, len, (int)(c ? atomic_load(&c->zcopy_thresh)
							: sdp_tun.zcopy_thresh));
		case SDP_SPIN_US:
			return put_int(val, len, (int)(c ? atomic_load(&c->spin_us)
							: sdp_tun.spin_us));
		case SDP_STATS: {
			struct sdp_sock_stats s;
			memset(&s, 0, sizeof s);
			if (c) {
				s = c->st;
				s.transport = 1;
				s.credits = sdp_credits(c);
			}
			if (!val || !len) {
				errno = EINVAL;
				return -1;
			}
			socklen_t n = *len < sizeof s ? *len : sizeof s;
			memcpy(val, &s, n);
			*len = n;
			return 0;
		}
		}
	}
	if (c && level == SOL_SOCKET && name == SO_RCVLOWAT)
		return put_int(val, len, (int)atomic_load(&c->rcvlowat));
	if (c && level == SOL_TCP && (name == TCP_NODELAY || name == TCP_CORK))
		return put_int(val, len, (int)atomic_load(name == TCP_NODELAY ?
					 &c->app_nodelay : &c->app_cork));
	if (c && level == SOL_SOCKET && name == SO_ERROR) {
		int e = atomic_exchange(&c->so_error, 0);
		if (!e)
			e = sdp_reset_errno(c);
		/* Only ours: the TCP socket's own errors (a peer's RST on
		 * close) are already part of this connection's state. */
		return put_int(val, len, e);
	}
	return real_getsockopt(fd, level, name, val, len);
}

EXPORT int shutdown(int fd, int how)
{
	SDP_INIT();
	struct sdp_conn *c = fd_conn(fd);
	if (!c || !conn_enter(c, fd))
		return real_shutdown(fd, how);
	if (atomic_load(&c->state) == SDP_ST_CONNECTING) {
		conn_leave(c);
		return real_shutdown(fd, how);
	}
	int r = (int)sdp_ret(sdp_shutdown(c, fd, how));
	int e = errno;
	conn_leave(c);
	epoll_local_change();
	errno = e;
	return r;
}
