/*
 * fdtab.c - what each file descriptor is to the switch.
 *
 * A flat array indexed by fd, sized to the process's hard fd limit and
 * allocated lazily by the kernel (mmap). Lookups are one load. A per-process
 * count of fds per connection tells when the process's last fd for a
 * connection closes (dup, dup2 and fork make several).
 */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "switch/switch.h"
#include "sdp/pool.h"
#include "sdp/sys.h"

static struct fdent *tab;
static _Atomic int tabsize;                 /* 0 in pass-through (sandbox.c) */
static _Atomic uint32_t *holds;             /* fds per connection slot */
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int hiwater;                 /* highest fd ever marked + 1 */
static pthread_mutex_t listen_lock = PTHREAD_MUTEX_INITIALIZER;   /* fd_forget of listeners */
static pthread_mutex_t fb_lock = PTHREAD_MUTEX_INITIALIZER;       /* fd_fb_install */
static void locks_prepare(void)
{
	pthread_mutex_lock(&fb_lock);
	pthread_mutex_lock(&listen_lock);
}
static void locks_parent(void)
{
	pthread_mutex_unlock(&listen_lock);
	pthread_mutex_unlock(&fb_lock);
}
static void defer_child(void);
static void locks_child(void)
{
	/* taken by locks_prepare on this very thread: released, as in the
	 * parent (ThreadSanitizer, which sees no unlock in a re-init, took
	 * them for held in the child) */
	pthread_mutex_unlock(&listen_lock);
	pthread_mutex_unlock(&fb_lock);
	defer_child();
	epoll_fork_child();
}
/* Registered at the library's start (config.c), after which the fd table
 * is used. */
void fd_locks_init(void)
{
	pthread_atfork(locks_prepare, locks_parent, locks_child);
	sdp_fb_install_hook = fd_fb_install;
}

static void mark(int fd)
{
	int h = atomic_load(&hiwater);
	while (fd >= h && !atomic_compare_exchange_weak(&hiwater, &h, fd + 1))
		;
}

static void tab_init(void)
{
	struct rlimit rl;
	long n = 1 << 16;
	if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_max != RLIM_INFINITY)
		n = (long)rl.rlim_max;
	if (n > (1 << 20))
		n = 1 << 20;
	if (n < 1024)
		n = 1024;
	void *p = mmap(NULL, (size_t)n * sizeof *tab, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	void *h = mmap(NULL, SDP_POOL_CONNS * sizeof *holds, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED || h == MAP_FAILED)
		return;
	holds = h;
	tab = p;
	atomic_store(&tabsize, (int)n);
	if (atomic_load(&sdp_passthru))     /* raced with fd_passthru */
		atomic_store(&tabsize, 0);
}

struct fdent *fd_get(int fd)
{
	if (__builtin_expect(!tab, 0))
		pthread_once(&once, tab_init);
	if (fd < 0 || fd >= atomic_load_explicit(&tabsize, memory_order_relaxed))
		return NULL;
	return &tab[fd];
}

int fd_table_size(void) { return atomic_load_explicit(&tabsize, memory_order_relaxed); }

void conn_hold(struct sdp_conn *c)
{
	atomic_fetch_add(&holds[c->idx], 1);
}

void fd_set_sdp(int fd, struct sdp_conn *c)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	conn_hold(c);
	mark(fd);
	e->c = c;
	e->l = NULL;
	atomic_store_explicit(&e->kind, FDK_SDP, memory_order_release);
}

void fd_set_tcp(int fd, enum sdp_role role)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	struct sdp_conn *c = sdp_conn_alloc();
	if (c) {
		struct stat st;
		socklen_t l = sizeof c->local;
		if (fstat(fd, &st) == 0)
			c->tcp_ino = st.st_ino;
		sys_getsockname(fd, &c->local, &l);
		l = sizeof c->remote;
		sys_getpeername(fd, &c->remote, &l);
		c->role = (uint8_t)role;
		c->transport = 0;
		atomic_store(&c->state, SDP_ST_ESTABLISHED);
		conn_hold(c);
	}
	mark(fd);
	e->c = c;
	e->l = NULL;
	atomic_store_explicit(&e->kind, FDK_TCP, memory_order_release);
}

void fd_set_listen(int fd, struct sdp_listener *l)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	mark(fd);
	e->l = l;
	e->c = NULL;
	atomic_store_explicit(&e->kind, FDK_LISTEN, memory_order_release);
}

void fd_set_kind(int fd, int kind)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	mark(fd);
	if (kind != FDK_SDP && kind != FDK_TCP)
		e->c = NULL;
	if (kind != FDK_LISTEN)
		e->l = NULL;
	atomic_store_explicit(&e->kind, (uint8_t)kind, memory_order_release);
}

/*
 * Closes that wait for calls of other threads (fd_forget_close): per pool
 * slot, ((fd + 1) << 1) | release-the-connection, or 0. One at a time per
 * connection; the slot cannot be reused before (the release is deferred).
 */
static _Atomic int64_t defer_of[SDP_POOL_CONNS];

static bool defer_close(struct fdent *e, int fd, struct sdp_conn *c, bool last)
{
	int64_t v = ((int64_t)fd + 1) << 1 | (last ? 1 : 0), zero = 0;
	atomic_store(&e->deferred, 1);
	if (!atomic_compare_exchange_strong(&defer_of[c->idx], &zero, v)) {
		atomic_store(&e->deferred, 0);
		return false;
	}
	/* Dekker with fd_close_deferred: our store before our look at the
	 * calls, the last call's leave before its look at defer_of. */
	if (sdp_conn_calls(c) == 0 && atomic_exchange(&defer_of[c->idx], 0)) {
		atomic_store(&e->deferred, 0);
		return false;                 /* they left meanwhile: close now */
	}
	/* closed as far as the application knows: not for a program it runs */
	int fl = sys_fcntl(fd, F_GETFD, 0);
	if (fl >= 0 && !(fl & FD_CLOEXEC))
		sys_fcntl(fd, F_SETFD, fl | FD_CLOEXEC);
	sdp_log(2, "close fd %d: a call of another thread is inside its connection; "
		"closed when that call returns", fd);
	return true;
}

void fd_close_deferred(struct sdp_conn *c)
{
	if (!atomic_load(&defer_of[c->idx]))
		return;
	int64_t v = atomic_exchange(&defer_of[c->idx], 0);
	if (!v)
		return;
	int fd = (int)(v >> 1) - 1;
	struct fdent *e = fd_get(fd);
	if (e)
		atomic_store(&e->deferred, 0);
	if (v & 1)
		sdp_release(c, fd);
	sys_close(fd);
}

void fd_deferred_move(int n)
{
	struct fdent *e = fd_get(n);
	if (!e || !atomic_load(&e->deferred))
		return;
	for (uint32_t i = 0; i < SDP_POOL_CONNS; i++) {
		int64_t v = atomic_load(&defer_of[i]);
		if (!v || (int)(v >> 1) - 1 != n)
			continue;
		int h = sys_fd_high(sys_fcntl(n, F_DUPFD_CLOEXEC, 0));
		if (h < 0)
			return;               /* it goes with n: its FIN comes early */
		int64_t w = ((int64_t)h + 1) << 1 | (v & 1);
		if (atomic_compare_exchange_strong(&defer_of[i], &v, w)) {
			struct fdent *he = fd_get(h);
			if (he)
				atomic_store(&he->deferred, 1);
			atomic_store(&e->deferred, 0);
		} else {
			sys_close(h);         /* the call left and closed it */
		}
		return;
	}
}

/* A forked child: the calls a deferred close waits for are the parent's. */
static void defer_child(void)
{
	for (uint32_t i = 0; i < SDP_POOL_CONNS; i++) {
		int64_t v = atomic_exchange(&defer_of[i], 0);
		if (!v)
			continue;
		int fd = (int)(v >> 1) - 1;
		struct fdent *e = fd_get(fd);
		if (e)
			atomic_store(&e->deferred, 0);
		sys_close(fd);
	}
}

static void forget(int fd, bool may_defer, bool *deferred);

void fd_forget(int fd)
{
	bool d;
	forget(fd, false, &d);
}

bool fd_forget_close(int fd)
{
	bool d = false;
	forget(fd, true, &d);
	return d;
}

static void forget(int fd, bool may_defer, bool *deferred)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	/* A number whose socket is being replaced (fd_fb_install) is closed
	 * only after: never the number another socket takes meanwhile. */
	uint8_t k;
	for (;;) {
		k = atomic_load(&e->kind);
		if (k == FDK_FALLING) {
			fd_wait_settled(e);
			continue;
		}
		if (atomic_compare_exchange_weak(&e->kind, &k, FDK_NONE))
			break;
	}
	if (k == FDK_INET)
		epoll_drop_pending(fd);       /* registered before any connect */
	if (k == FDK_SDP && e->c && atomic_load(&e->c->fb_done))
		k = FDK_TCP;                  /* left SDP: the kernel closes it */
	if (k == FDK_TCP && e->c) {
		struct sdp_conn *c = e->c;
		e->c = NULL;
		epoll_drop_parked(fd);        /* deleted from a set while SDP */
		if (atomic_fetch_sub(&holds[c->idx], 1) == 1)
			sdp_release_tcp(c);
	} else if (k == FDK_SDP && e->c) {
		struct sdp_conn *c = e->c;
		e->c = NULL;
		epoll_forget_fd(fd);
		bool last = atomic_fetch_sub(&holds[c->idx], 1) == 1;
		if (may_defer && sdp_conn_calls(c) && defer_close(e, fd, c, last)) {
			*deferred = true;
			return;
		}
		if (last)
			sdp_release(c, fd);
	} else if (k == FDK_LISTEN && e->l) {
		/* Another fd of this process may still name the listener - or
		 * be in this branch for it on another thread (its kind already
		 * NONE): the last one to clear its slot closes it, once. */
		pthread_mutex_lock(&listen_lock);
		struct sdp_listener *l = e->l;
		__atomic_store_n(&e->l, NULL, __ATOMIC_RELEASE);
		int hi = atomic_load(&hiwater);
		bool other = false;
		for (int i = 0; i < hi && !other; i++)
			other = i != fd && tab[i].l == l;
		pthread_mutex_unlock(&listen_lock);
		if (!other)
			sdp_listener_close(l);
	} else if (k == FDK_EPOLL) {
		struct ep_shadow *s = e->ep;
		e->ep = NULL;
		epoll_shadow_free(s);
	}
}

void fd_fallback(int fd, struct sdp_conn *c)
{
	fd_fallback_for(fd, c, NULL);
}

void fd_fallback_for(int fd, struct sdp_conn *c, const char *why)
{
	epoll_local_change();
	if (!atomic_load(&c->fb_done))
		sdp_log(2, "fd %d: leaving SDP for TCP (%s)", fd,
			sdp_fallback_by_peer(c) && !sdp_fallback_started(c) ?
			"the peer left SDP: its program exec'd or passed the socket on" :
			why ? why : "handed back to TCP");
	if (!atomic_load(&c->fb_done) && !sdp_fallback_by_peer(c)) {
		/* If the other end of this connection is ours too (both ends
		 * in one process, maybe one thread), it cannot answer while
		 * we wait: run its half here. */
		int hi = atomic_load(&hiwater);
		for (int i = 0; i < hi; i++) {
			struct sdp_conn *p = tab[i].c;
			if (i == fd || atomic_load(&tab[i].kind) != FDK_SDP || !p ||
			    !sdp_same_conn_peer(c, p))
				continue;
			sdp_fallback_publish(c, fd);
			fd_fallback_for(i, p, "its peer in this process leaves SDP");
			break;
		}
	}
	sdp_fallback(c, fd);
	fd_fb_install(c, fd);
	/* The rings stay mapped until close: this may be a vfork child that
	 * shares our address space with its parent. */
}

void fd_wait_settled(struct fdent *e)
{
	while (atomic_load(&e->kind) == FDK_FALLING)
		sched_yield();
}

/*
 * After the hand-back (fb_done): every number of this process naming c
 * becomes TCP, and names the substitute socket if the peer was gone
 * (sdp_fallback_subst_take; same close-on-exec flag). Any thread that
 * finds the connection handed back comes here before it uses the number
 * as TCP, and the first one does all numbers while the others wait on
 * fb_lock: none reads the old socket while the substitute is on its way.
 * A number is FDK_FALLING while its socket is replaced, so a close() of
 * it on another thread waits, and the number cannot go to another socket
 * in between (fd_forget).
 */
void fd_fb_install(struct sdp_conn *c, int fd)
{
	(void)fd;
	pthread_mutex_lock(&fb_lock);
	int subst = sdp_fallback_subst_take(c);
	int hi = atomic_load(&hiwater);
	for (int i = 0; i < hi; i++) {
		uint8_t k = FDK_SDP;
		if (tab[i].c != c || !atomic_compare_exchange_strong(&tab[i].kind, &k, FDK_FALLING))
			continue;
		if (tab[i].c != c) {          /* closed and taken meanwhile */
			atomic_store(&tab[i].kind, FDK_SDP);
			continue;
		}
		if (subst >= 0) {
			int fl = sys_fcntl(i, F_GETFD, 0);
			syscall(SYS_dup3, subst, i, fl >= 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0);
		}
		atomic_store(&tab[i].kind, FDK_TCP);   /* c stays: sdp stat */
	}
	if (subst >= 0)
		sys_close(subst);
	pthread_mutex_unlock(&fb_lock);
}

/* Does the new program get fd: not close-on-exec, or one of the extra
 * descriptors (posix_spawn dup2 sources, which the child's dup2 hands
 * over without close-on-exec)? */
static bool inherited(int fd, const int *extra, int nextra)
{
	for (int i = 0; i < nextra; i++)
		if (extra[i] == fd)
			return true;
	int fl = sys_fcntl(fd, F_GETFD, 0);
	return fl >= 0 && !(fl & FD_CLOEXEC);
}

void fd_before_exec_with(const int *extra, int nextra)
{
	int hi = atomic_load(&hiwater);
	for (int fd = 0; fd < hi; fd++) {
		if (atomic_load(&tab[fd].kind) == FDK_LISTEN && tab[fd].l) {
			if (inherited(fd, extra, nextra)) {
				listen_defer_restore(fd);
				sdp_log(2, "listen fd %d: SDP withdrawn, new connections "
					"TCP (the listener is inherited across exec)", fd);
				sdp_listener_withdraw(tab[fd].l);
			}
			continue;
		}
		struct sdp_conn *c = tab[fd].c;
		if (atomic_load(&tab[fd].kind) != FDK_SDP || !c)
			continue;
		if (inherited(fd, extra, nextra))   /* the new program gets plain TCP */
			fd_fallback_for(fd, c, "inherited across exec");
	}
}

void fd_before_exec(void)
{
	fd_before_exec_with(NULL, 0);
}

int fd_leave_all(void)
{
	if (!tab)
		return 0;
	int n = 0, hi = atomic_load(&hiwater);
	for (int fd = 0; fd < hi; fd++) {
		struct sdp_conn *c = tab[fd].c;
		if (atomic_load(&tab[fd].kind) == FDK_SDP && c) {
			/* every fd naming c becomes TCP */
			fd_fallback_for(fd, c, "the process installs a seccomp filter");
			n++;
		}
	}
	epoll_leave_all();
	for (int fd = 0; fd < hi; fd++)
		if (atomic_load(&tab[fd].kind) == FDK_LISTEN && tab[fd].l) {
			sdp_log(2, "listen fd %d: SDP withdrawn, new connections TCP "
				"(the process installs a seccomp filter)", fd);
			sdp_listener_withdraw(tab[fd].l);
		}
	for (int fd = 0; fd < hi; fd++)
		if (atomic_load(&tab[fd].kind) != FDK_NONE)
			fd_forget(fd);
	return n;
}

/* Called after sdp_passthru is set: every lookup misses from now on (a
 * table made meanwhile ends up empty too, see tab_init). */
void fd_passthru(void)
{
	atomic_store(&tabsize, 0);
}

void fd_dup(int oldfd, int newfd)
{
	if (oldfd == newfd)
		return;
	struct fdent *o = fd_get(oldfd), *n = fd_get(newfd);
	if (!o || !n)
		return;
	uint8_t k = atomic_load(&o->kind);
	if (k == FDK_SDP && o->c) {
		fd_set_sdp(newfd, o->c);
	} else if (k == FDK_LISTEN) {
		fd_set_listen(newfd, o->l);
	} else if (k == FDK_TCP && o->c) {
		conn_hold(o->c);
		mark(newfd);
		n->c = o->c;
		n->l = NULL;
		atomic_store_explicit(&n->kind, FDK_TCP, memory_order_release);
	} else if (k == FDK_INET || k == FDK_TCP) {
		fd_set_kind(newfd, k);
	}
	atomic_store(&n->opts, atomic_load(&o->opts));
	atomic_store(&n->defer_s, atomic_load(&o->defer_s));
}

/* Count each listener this process holds once (several fds may name one
 * listener after dup) as held by delta more processes. */
static void fork_count_listeners(int delta)
{
	enum { SEEN = 256 };
	struct sdp_listener *seen[SEEN];
	int nseen = 0, hi = atomic_load(&hiwater);
	for (int fd = 0; fd < hi; fd++) {
		struct sdp_listener *l = tab[fd].l;
		if (atomic_load(&tab[fd].kind) != FDK_LISTEN || !l)
			continue;
		bool dup = false;
		for (int j = 0; j < nseen && !dup; j++)
			dup = seen[j] == l;
		if (dup)
			continue;
		if (nseen < SEEN)
			seen[nseen++] = l;
		sdp_listener_fork(l, delta);
	}
}

/* fork(): every connection and listener this process holds gets one more
 * holding process. Counted in the parent before the child exists, so that
 * a parent closing its copy at once can never look like the last holder. */
static void fork_count(int delta)
{
	if (!tab)
		return;
	static uint8_t counted[SDP_POOL_CONNS / 8];
	memset(counted, 0, sizeof counted);
	int hi = atomic_load(&hiwater);
	for (int fd = 0; fd < hi; fd++) {
		struct sdp_conn *c = tab[fd].c;
		uint8_t k = atomic_load(&tab[fd].kind);
		if ((k != FDK_SDP && k != FDK_TCP) || !c)
			continue;
		if (counted[c->idx / 8] & (1u << (c->idx % 8)))
			continue;
		counted[c->idx / 8] |= (uint8_t)(1u << (c->idx % 8));
		if (delta > 0)
			atomic_fetch_add(&c->nproc, 1);
		else
			atomic_fetch_sub(&c->nproc, 1);
	}
	fork_count_listeners(delta);
}

/* Connections whose provider's endpoints belong to this process
 * (FAB_T_PRIVATE: libfabric's objects) cannot be used by the child: they
 * go back to TCP before the fork, as before an exec. */
static void fork_private(void)
{
	if (!tab)
		return;
	int hi = atomic_load(&hiwater);
	for (int fd = 0; fd < hi; fd++) {
		struct sdp_conn *c = tab[fd].c;
		if (atomic_load(&tab[fd].kind) == FDK_SDP && c && c->ep.ops &&
		    (c->ep.ops->traits & FAB_T_PRIVATE))
			fd_fallback_for(fd, c, "fork: its fabric endpoint belongs to "
					"this process alone");
	}
}

void fd_fork_prepare(void)
{
	fork_private();
	fork_count(+1);
}


void fd_fork_failed(void) { fork_count(-1); }
