/*
 * group.c - SO_REUSEPORT groups: one rendezvous for every listening socket
 * of an address and port.
 *
 * With SO_REUSEPORT several listening sockets, maybe in unrelated processes
 * of one user, share an address and port, and the kernel gives each SYN to
 * one of them by a hash nobody outside can compute (or by a BPF program's
 * choice). A client sends one hello, before its SYN, to the one rendezvous
 * name of the address and port, so every listener of the group must be
 * able to find it there. The group therefore shares one rendezvous:
 *
 *  - the first listener binds the name, as any listener does, and keeps
 *    the group's shared block (lock, secret, tombs: rendezvous.h) in a
 *    sealed memfd;
 *  - sockets of one process share one listener object (nginx's master
 *    opens one socket per worker); forked processes inherit it;
 *  - a listener in a process that does not hold the group finds the name
 *    taken and joins: it sends a join request on the rendezvous and makes
 *    a TCP connection to the address and port. That connection wakes a
 *    member - blocked in accept() or epoll_wait() - whose accept takes the
 *    request, answers with the rendezvous socket and the memfd, and drops
 *    the wake-up connection unseen (a tomb of kind WAKE). The new
 *    listener's listen() reaches the kernel only then, so no SYN reaches it
 *    before it can see the hellos. If no member answers within a second it
 *    listens anyway, resets local connections (their clients may be
 *    committed to SDP) and finishes joining at a later accept();
 *  - the name lives while any member holds the rendezvous: members come
 *    and go (a killed one included) and the clients see one name.
 *
 * Several addresses on one port - a group on the wildcard address and one
 * on a specific address, which only SO_REUSEPORT allows: the kernel gives
 * a SYN to the most specific listener, while a client may have used a less
 * specific rendezvous (it tries the name that served the port last time
 * first). So a listener also joins the groups of the less specific names
 * of its port and looks there when its own has no hello, and a wildcard
 * group offers no SDP while a more specific TCP listener exists on its
 * port (asked of the kernel with sock_diag when it starts listening).
 *
 * A listener the policy keeps on TCP still joins its group and withdraws
 * it: with some members on TCP no client may commit to SDP.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>

#include "sdp/conn.h"
#include "sdp/rendezvous.h"
#include "sdp/sys.h"
#include "sdp/log.h"

#define JOIN_WAIT_MS   1000                    /* listen() waits this long */
#define JOIN_RETRY_NS  (100ull * 1000000ull)   /* then a new request at most this often */
#define GROUP_FD_MIN   900                     /* keep our fds out of the way */

static void pb_open(struct sdp_listener *l);

static size_t lsh_len(void)
{
	return (sizeof(struct lshared) + 4095) & ~(size_t)4095;
}

/* ---- the shared block ------------------------------------------------------- */

int lshared_init(struct sdp_listener *l, bool passable)
{
	size_t len = lsh_len();
	int fd = -1;
	void *p;
	if (passable) {
		fd = (int)syscall(SYS_memfd_create, "sdp-group",
				  MFD_CLOEXEC | MFD_ALLOW_SEALING);
		if (fd < 0)
			return -errno;
		if (ftruncate(fd, (off_t)len) < 0 ||
		    sys_fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) < 0) {
			int e = -errno;
			sys_close(fd);
			return e;
		}
		fd = sys_fd_keep(fd, GROUP_FD_MIN);
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	} else {
		p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	}
	if (p == MAP_FAILED) {
		int e = -errno;
		if (fd >= 0)
			sys_close(fd);
		return e;
	}
	struct lshared *sh = p;
	sh->magic = LSH_MAGIC;
	sh->version = LSH_VERSION;
	sh->size = sizeof *sh;
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&sh->lock, &ma);
	pthread_mutexattr_destroy(&ma);
	atomic_store(&sh->nproc, 1);
	if (getrandom(&sh->secret, sizeof sh->secret, 0) != sizeof sh->secret) {
		munmap(p, len);
		if (fd >= 0)
			sys_close(fd);
		return -EIO;
	}
	l->sh = sh;
	l->shfd = fd;
	pb_open(l);
	return 0;
}

/* The put-back queue (hello.c): a socket pair every member holds, kept out
 * of the application's way like the group's other descriptors. Without it
 * (no descriptor left) the group puts hellos back into the rendezvous, as
 * every member then knows (has_pb). */
static void pb_open(struct sdp_listener *l)
{
	int sv[2];
	l->pb[0] = l->pb[1] = -1;
	l->sh->has_pb = 0;
	if (sys_socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK,
			   0, sv) < 0) {
		sdp_log(1, "rendezvous: no put-back queue (%s): hellos go back "
			"into the rendezvous", strerror(errno));
		return;
	}
	/* Room for several hundred hellos (the kernel caps it at
	 * wmem_max); a full queue sends them to the rendezvous. */
	int sz = 1 << 20;
	sys_setsockopt(sv[1], SOL_SOCKET, SO_SNDBUF, &sz, sizeof sz);
	for (int i = 0; i < 2; i++)
		l->pb[i] = sys_fd_keep(sv[i], GROUP_FD_MIN);
	l->sh->has_pb = 1;
}

static void pb_close(struct sdp_listener *l)
{
	for (int i = 0; i < 2; i++) {
		if (l->pb[i] >= 0)
			sys_close_kept(l->pb[i]);
		l->pb[i] = -1;
	}
}

void lshared_drop(struct sdp_listener *l)
{
	pb_close(l);
	if (l->sh) {
		atomic_fetch_sub(&l->sh->nproc, 1);
		munmap(l->sh, lsh_len());
		l->sh = NULL;
	}
	if (l->shfd >= 0)
		sys_close_kept(l->shfd);
	l->shfd = -1;
}

/* ---- tombs: connections whose hello cannot be served ------------------------ */

static bool keq(const struct key *a, const struct key *b)
{
	return a->family == b->family && a->port == b->port &&
	       !memcmp(a->addr, b->addr, a->family == AF_INET ? 4 : 16);
}

/* Called with sh->lock held. */
void tomb_add(struct lshared *sh, uint32_t kind, int err, const struct key *l,
	      const struct key *p)
{
	if (!sh)
		return;
	uint64_t now = sdp_now_ns();
	struct tomb *slot = NULL, *old = NULL;
	for (int i = 0; i < TOMB_MAX; i++) {
		struct tomb *t = &sh->tomb[i];
		if (t->kind != TOMB_FREE && keq(&t->l, l) && keq(&t->p, p)) {
			slot = t;             /* the same connection again */
			break;
		}
		if (!slot && (t->kind == TOMB_FREE ||
			      (now > t->t_ns && now - t->t_ns > TOMB_TTL_NS)))
			slot = t;
		else if (!old || t->t_ns < old->t_ns)
			old = t;
	}
	if (!slot) {
		slot = old;
		sdp_log(0, "rendezvous: more than %d connections wait to be reset: "
			"the oldest is forgotten", TOMB_MAX);
	}
	slot->kind = kind;
	slot->err = err;
	slot->t_ns = now;
	slot->l = *l;
	slot->p = *p;
}

/* Called with sh->lock held: the tomb of connection (l, p), taken. */
uint32_t tomb_take(struct lshared *sh, const struct key *l, const struct key *p,
		   int *err)
{
	uint64_t now = sdp_now_ns();
	for (int i = 0; i < TOMB_MAX; i++) {
		struct tomb *t = &sh->tomb[i];
		if (t->kind == TOMB_FREE || (now > t->t_ns && now - t->t_ns > TOMB_TTL_NS) ||
		    !keq(&t->l, l) || !keq(&t->p, p))
			continue;
		uint32_t kind = t->kind;
		*err = t->err;
		t->kind = TOMB_FREE;
		return kind;
	}
	return TOMB_FREE;
}

/* ---- this process's group listeners, by name -------------------------------- */

static struct sdp_listener *reg;
static pthread_mutex_t reg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t reg_once = PTHREAD_ONCE_INIT;

static void reg_prepare(void) { pthread_mutex_lock(&reg_lock); }
static void reg_parent(void) { pthread_mutex_unlock(&reg_lock); }
static void reg_child(void) { pthread_mutex_unlock(&reg_lock); }   /* reg_prepare's */
static void reg_init(void) { pthread_atfork(reg_prepare, reg_parent, reg_child); }

static void reg_enter(void)
{
	pthread_once(&reg_once, reg_init);
	pthread_mutex_lock(&reg_lock);
}

static struct sdp_listener *reg_find(const struct sockaddr_un *name, socklen_t len)
{
	for (struct sdp_listener *l = reg; l; l = l->reg_next)
		if (l->namelen == len && !memcmp(&l->name, name, len))
			return l;
	return NULL;
}

static void reg_remove(struct sdp_listener *l)
{
	for (struct sdp_listener **p = &reg; *p; p = &(*p)->reg_next)
		if (*p == l) {
			*p = l->reg_next;
			return;
		}
}

/* Called with reg_lock held. */
static void unref_locked(struct sdp_listener *l)
{
	if (--l->refs)
		return;
	for (int i = 0; i < l->nwider; i++)
		unref_locked(l->wider[i]);
	reg_remove(l);
	listener_free(l);
}

void group_close(struct sdp_listener *l)
{
	reg_enter();
	l->fd_owned = false;
	unref_locked(l);
	pthread_mutex_unlock(&reg_lock);
}

struct sdp_listener *sdp_listener_hold(struct sdp_listener *const *slot)
{
	reg_enter();
	struct sdp_listener *l = __atomic_load_n(slot, __ATOMIC_ACQUIRE);
	if (l)
		l->refs++;
	pthread_mutex_unlock(&reg_lock);
	return l;
}

void sdp_listener_put(struct sdp_listener *l)
{
	if (!l)
		return;
	reg_enter();
	unref_locked(l);
	pthread_mutex_unlock(&reg_lock);
}

void group_fork(struct sdp_listener *l, int delta)
{
	if (l->sh)
		atomic_fetch_add(&l->sh->nproc, (uint32_t)delta);
	for (int i = 0; i < l->nwider; i++)
		if (l->wider[i]->sh)
			atomic_fetch_add(&l->wider[i]->sh->nproc, (uint32_t)delta);
}

static void withdraw_one(struct sdp_listener *l)
{
	if (l->rv >= 0 && rv_intact(l))
		sys_shutdown(l->rv, SHUT_RDWR);
	else
		l->want_withdraw = true;      /* once joined */
}

void group_withdraw(struct sdp_listener *l)
{
	withdraw_one(l);
	for (int i = 0; i < l->nwider; i++)
		withdraw_one(l->wider[i]);
}

/* ---- joining ----------------------------------------------------------------- */

static socklen_t sa_of(const struct key *k, union sdp_addr *a)
{
	memset(a, 0, sizeof *a);
	if (k->family == AF_INET) {
		a->in.sin_family = AF_INET;
		memcpy(&a->in.sin_addr, k->addr, 4);
		a->in.sin_port = k->port;
		return sizeof a->in;
	}
	a->in6.sin6_family = AF_INET6;
	memcpy(&a->in6.sin6_addr, k->addr, 16);
	a->in6.sin6_port = k->port;
	return sizeof a->in6;
}

static bool wildcard(const struct key *k)
{
	static const uint8_t zero[16];
	return !memcmp(k->addr, zero, k->family == AF_INET ? 4 : 16);
}

/* Send a join request on a new connection to l's name; with wait, wake a
 * member and wait up to JOIN_WAIT_MS for its answer (group_join_poll
 * takes it). 0: asked (or to be asked again later), -errno: no group to
 * join there (ECONNREFUSED: no such name, or withdrawn; EACCES: another
 * user's). */
static int join_start(struct sdp_listener *l, bool wait)
{
	if (l->join >= 0)
		sys_close(l->join);
	l->join = -1;
	l->join_retry_ns = sdp_now_ns() + JOIN_RETRY_NS;
	int s = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s < 0)
		return 0;
	if (sys_connect(s, &l->name, l->namelen) < 0) {
		int e = errno;
		sys_close(s);
		return e == EAGAIN ? 0 : -e;
	}
	struct ucred cr;
	socklen_t cl = sizeof cr;
	if (sys_getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.uid != l->uid) {
		sys_close(s);
		return -EACCES;
	}
	struct sdp_hello h = {
		.magic = SDP_HELLO_MAGIC,
		.version = SDP_PROTO_VERSION,
		.family = l->k.family,
		.pid = (int32_t)sdp_pid,
		.time_ns = sdp_now_ns(),
		.flags = SDP_HELLO_JOIN,
	};
	if (getrandom(&h.token, sizeof h.token, GRND_NONBLOCK) != sizeof h.token)
		h.token = h.time_ns ^ ((uint64_t)sdp_pid << 32);
	/* The wake-up connection: to the group's address (loopback for a
	 * wildcard), from a port we bind now so the request can name it. */
	int w = -1;
	struct key dst = l->k;
	union sdp_addr da, sa;
	if (wait) {
		if (wildcard(&dst)) {
			memset(dst.addr, 0, sizeof dst.addr);
			if (dst.family == AF_INET)
				dst.addr[0] = 127, dst.addr[3] = 1;
			else
				dst.addr[15] = 1;
		}
		struct key src = dst;
		src.port = 0;
		socklen_t dl = sa_of(&dst, &da), sl = sa_of(&src, &sa);
		w = sys_socket(dst.family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		struct key got;
		socklen_t gl = sl;
		if (w >= 0 && sys_bind(w, &sa, sl) == 0 &&
		    sys_getsockname(w, &sa, &gl) == 0 && rv_key_of(&sa.sa, gl, &got) == 0) {
			memcpy(h.dst_addr, dst.addr, sizeof h.dst_addr);
			memcpy(h.src_addr, got.addr, sizeof h.src_addr);
			h.dst_port = dst.port;
			h.src_port = got.port;
		} else if (w >= 0) {
			sys_close(w);
			w = -1;
		}
		(void)dl;
	}
	if (rv_send(s, &h, sizeof h, NULL, 0) < 0) {
		if (w >= 0)
			sys_close(w);
		sys_close(s);
		return 0;
	}
	l->join = s;
	l->join_pid = (int32_t)sdp_pid;
	l->join_nonce = h.token;
	if (!wait)
		return 0;
	if (w >= 0)
		sys_connect(w, &da, da.sa.sa_family == AF_INET ? sizeof da.in : sizeof da.in6);
	uint64_t end = sdp_now_ns() + JOIN_WAIT_MS * 1000000ull;
	for (;;) {
		uint64_t now = sdp_now_ns();
		if (now >= end)
			break;
		struct pollfd p = { .fd = s, .events = POLLIN };
		int r = sys_poll(&p, 1, (int)((end - now) / 1000000 + 1));
		if (r > 0 || (r < 0 && errno != EINTR))
			break;
	}
	if (w >= 0)
		sys_close(w);
	return 0;
}

static bool join_poll_locked(struct sdp_listener *l);

/* Our pending join request's answer, if it came. Threads of this process
 * may ask at once (accept in several threads): one looks at a time. */
bool group_join_poll(struct sdp_listener *l)
{
	if (__atomic_load_n(&l->rv, __ATOMIC_ACQUIRE) >= 0)
		return true;
	reg_enter();
	bool r = join_poll_locked(l);
	pthread_mutex_unlock(&reg_lock);
	return r;
}

/* Called with reg_lock held. */
static bool join_poll_locked(struct sdp_listener *l)
{
	if (l->rv >= 0)
		return true;
	if (l->join >= 0 && l->join_pid != (int32_t)sdp_pid) {
		/* Inherited across fork: the answer goes to the parent. */
		sys_close(l->join);
		l->join = -1;
		l->join_retry_ns = 0;
	}
	if (l->join < 0) {
		if (sdp_now_ns() < l->join_retry_ns || join_start(l, false) < 0 ||
		    l->join < 0)
			return false;
	}
	struct sdp_join_answer a;
	union { struct cmsghdr c; char buf[CMSG_SPACE(4 * sizeof(int))]; } u;
	struct iovec iov = { &a, sizeof a };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = u.buf, .msg_controllen = sizeof u.buf };
	ssize_t n = sys_recvmsg(l->join, &m, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return false;
	int fds[4], nfds = 0;
	for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; cm;
	     cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			if (nfds < 4)
				fds[nfds++] = fd;
			else
				sys_close(fd);
		}
	}
	sys_close(l->join);
	l->join = -1;
	const char *bad = NULL;
	void *p = MAP_FAILED;
	int type = 0, acc = 0;
	socklen_t tl = sizeof type, al = sizeof acc;
	struct stat st;
	if (n != (ssize_t)sizeof a || a.magic != SDP_JOIN_MAGIC ||
	    a.version != SDP_PROTO_VERSION || a.nonce != l->join_nonce ||
	    (nfds != 2 && nfds != 4) || a.nfds != (uint16_t)nfds ||
	    (m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)))
		bad = n == 0 ? "no answer" : "a malformed answer";
	else if (sys_getsockopt(fds[0], SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
		 type != SOCK_SEQPACKET ||
		 sys_getsockopt(fds[0], SOL_SOCKET, SO_ACCEPTCONN, &acc, &al) < 0 || !acc)
		bad = "not a rendezvous";
	else if (sys_fstat(fds[1], &st) < 0 || (size_t)st.st_size != lsh_len() ||
		 (p = mmap(NULL, lsh_len(), PROT_READ | PROT_WRITE, MAP_SHARED,
			   fds[1], 0)) == MAP_FAILED)
		bad = "no shared block";
	else if (((struct lshared *)p)->magic != LSH_MAGIC ||
		 ((struct lshared *)p)->version != LSH_VERSION ||
		 ((struct lshared *)p)->size != sizeof(struct lshared))
		bad = "a shared block of another version";
	else if (((struct lshared *)p)->has_pb != (nfds == 4))
		bad = "an answer without the put-back queue";
	else if (nfds == 4 &&
		 (sys_getsockopt(fds[2], SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
		  type != SOCK_SEQPACKET ||
		  sys_getsockopt(fds[3], SOL_SOCKET, SO_TYPE, &type, &tl) < 0 ||
		  type != SOCK_SEQPACKET))
		bad = "not a put-back queue";
	if (bad) {
		if (p != MAP_FAILED)
			munmap(p, lsh_len());
		for (int i = 0; i < nfds; i++)
			sys_close(fds[i]);
		sdp_log(1, "joining the SO_REUSEPORT group: %s; asking again later", bad);
		return false;
	}
	l->sh = p;
	l->shfd = fds[1];
	l->pb[0] = nfds == 4 ? fds[2] : -1;
	l->pb[1] = nfds == 4 ? fds[3] : -1;
	int *high[4] = { &fds[0], &l->shfd, &l->pb[0], &l->pb[1] };
	for (int i = 0; i < 4; i++)
		*high[i] = sys_fd_keep(*high[i], GROUP_FD_MIN);
	if (l->want_withdraw)
		sys_shutdown(fds[0], SHUT_RDWR);
	__atomic_store_n(&l->rv, fds[0], __ATOMIC_RELEASE);   /* last: joined */
	sdp_log(1, "joined the SO_REUSEPORT group's rendezvous (%u processes)",
		atomic_load(&l->sh->nproc));
	return true;
}

/* A member's side: s carries a join request (sender's uid checked). */
void group_answer_join(struct sdp_listener *l, int s, const struct sdp_hello *h)
{
	if (!l->group || l->shfd < 0 || l->rv < 0 || !rv_intact(l)) {
		sdp_log(2, "rendezvous: join request for a listener that is not a "
			"SO_REUSEPORT group: ignored");
		return;
	}
	atomic_fetch_add(&l->sh->nproc, 1);
	int nfds = l->sh->has_pb ? 4 : 2;
	struct sdp_join_answer a = { .magic = SDP_JOIN_MAGIC,
				     .version = SDP_PROTO_VERSION, .nfds = (uint16_t)nfds,
				     .nonce = h->token };
	int fds[4] = { l->rv, l->shfd, l->pb[0], l->pb[1] };
	int r = rv_send(s, &a, sizeof a, fds, nfds);
	if (r < 0) {
		atomic_fetch_sub(&l->sh->nproc, 1);
		sdp_log(1, "rendezvous: could not answer a join request: %s", strerror(-r));
		return;
	}
	sdp_log(1, "rendezvous: process %d joined the SO_REUSEPORT group", (int)h->pid);
}

/* ---- more specific listeners on our port ------------------------------------- */

/* Does a TCP listener on the port of wildcard k take SYNs that k would
 * otherwise get (one on a specific address; for [::], any IPv4 one)?
 * 1 yes, 0 no, -errno cannot tell. */
static int more_specific(const struct key *k)
{
	int nl = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return -errno;
	int found = 0, err = 0;
	static const uint8_t zero[16];
	static const uint8_t v4map[12] = { [10] = 0xff, [11] = 0xff };
	for (int fam = 0; fam < 2 && !found && !err; fam++) {
		struct {
			struct nlmsghdr n;
			struct inet_diag_req_v2 r;
		} req;
		memset(&req, 0, sizeof req);
		req.n.nlmsg_len = sizeof req;
		req.n.nlmsg_type = SOCK_DIAG_BY_FAMILY;
		req.n.nlmsg_flags = NLM_F_REQUEST | NLM_F_DUMP;
		req.r.sdiag_family = fam ? AF_INET6 : AF_INET;
		req.r.sdiag_protocol = IPPROTO_TCP;
		req.r.idiag_states = 1u << TCP_LISTEN;
		if (syscall(SYS_sendto, nl, &req, sizeof req, 0, NULL, 0) < 0) {
			err = -errno;
			break;
		}
		for (bool done = false; !done && !err;) {
			static __thread char buf[16384];
			ssize_t n = sys_recvfrom(nl, buf, sizeof buf, 0);
			if (n <= 0) {
				err = n < 0 ? -errno : -EIO;
				break;
			}
			for (struct nlmsghdr *h = (void *)buf; NLMSG_OK(h, (size_t)n);
			     h = NLMSG_NEXT(h, n)) {
				if (h->nlmsg_type == NLMSG_DONE) {
					done = true;
					break;
				}
				if (h->nlmsg_type == NLMSG_ERROR) {
					err = -EIO;
					break;
				}
				const struct inet_diag_msg *d = NLMSG_DATA(h);
				if (d->id.idiag_sport != k->port)
					continue;
				const uint8_t *a = (const uint8_t *)d->id.idiag_src;
				if (d->idiag_family == AF_INET)
					found |= k->family == AF_INET6 || memcmp(a, zero, 4);
				else if (!memcmp(a, v4map, 12))
					found |= memcmp(a + 12, zero, 4) != 0;
				else if (k->family == AF_INET6)
					found |= memcmp(a, zero, 16) != 0;
			}
		}
	}
	sys_close(nl);
	return err ? err : found;
}

/* ---- opening ----------------------------------------------------------------- */

static struct sdp_listener *group_new(const struct key *k)
{
	struct sdp_listener *l = calloc(1, sizeof *l);
	if (!l)
		return NULL;
	l->rv = -1;
	l->join = -1;
	l->shfd = -1;
	l->pb[0] = l->pb[1] = -1;
	l->group = true;
	l->k = *k;
	l->uid = geteuid();
	l->namelen = rv_name_of(&l->name, l->uid, k);
	l->refs = 1;
	return l;
}

/* Publish the group's rendezvous, or join the one that exists. */
static int group_start(struct sdp_listener *l)
{
	l->rv = sys_fd_keep(sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0),
			    GROUP_FD_MIN);
	if (l->rv < 0)
		return -errno;
	if (sys_bind(l->rv, &l->name, l->namelen) == 0) {
		int r = sys_listen(l->rv, 4096) < 0 ? -errno : lshared_init(l, true);
		if (r < 0) {
			sys_close(l->rv);
			l->rv = -1;
		}
		return r;
	}
	int e = errno;
	sys_close(l->rv);
	l->rv = -1;
	if (e != EADDRINUSE)
		return -e;
	int r = join_start(l, true);
	if (r == 0 && !join_poll_locked(l))
		sdp_log(1, "no member of the SO_REUSEPORT group answered within %d ms: "
			"local connections are reset until one does", JOIN_WAIT_MS);
	return r;
}

int group_open(int fd, const struct key *k, bool offer, struct sdp_listener **out)
{
	*out = NULL;
	struct sockaddr_un name;
	socklen_t nl = rv_name_of(&name, geteuid(), k);
	reg_enter();
	struct sdp_listener *l = reg_find(&name, nl);
	if (l) {
		/* Another socket of this process is in the group already. */
		if (!l->fd_owned) {
			l->fd_owned = true;
			l->refs++;
		}
		if (!offer)
			withdraw_one(l);
		pthread_mutex_unlock(&reg_lock);
		*out = l;
		return 0;
	}
	l = group_new(k);
	if (!l) {
		pthread_mutex_unlock(&reg_lock);
		return -ENOMEM;
	}
	int r = group_start(l);
	if (r < 0) {
		pthread_mutex_unlock(&reg_lock);
		if (r == -ECONNREFUSED || r == -EACCES)
			sdp_why("its SO_REUSEPORT group's rendezvous is %s",
				r == -EACCES ? "another user's" : "withdrawn");
		listener_free(l);
		return r == -ECONNREFUSED || r == -EACCES ? 0 : r;
	}
	l->fd_owned = true;
	int ms = wildcard(k) && offer ? more_specific(k) : 0;
	if (!offer || ms) {
		const char *w = !offer ? "the policy keeps this listener on TCP" :
				ms > 0 ? "a more specific listener shares its port" :
				"cannot tell whether a more specific listener shares its port";
		sdp_log(1, "listen fd %d: SO_REUSEPORT group withdrawn: %s", fd, w);
		sdp_why("its SO_REUSEPORT group is withdrawn: %s", w);
		withdraw_one(l);
	}
	/* Clients of less specific names of our port whose SYN we get. */
	struct key wk[WIDER_MAX];
	int nw = 0;
	if (!wildcard(k)) {
		wk[nw] = *k;
		memset(wk[nw].addr, 0, sizeof wk[nw].addr);
		nw++;
	}
	if (k->family == AF_INET) {
		wk[nw] = *k;
		wk[nw].family = AF_INET6;
		memset(wk[nw].addr, 0, sizeof wk[nw].addr);
		nw++;
	}
	for (int i = 0; i < nw; i++) {
		struct sockaddr_un wn;
		socklen_t wl = rv_name_of(&wn, l->uid, &wk[i]);
		struct sdp_listener *w = reg_find(&wn, wl);
		if (w) {
			w->refs++;
		} else {
			w = group_new(&wk[i]);
			if (!w)
				continue;
			int jr = join_start(w, true);
			if (jr < 0) {
				listener_free(w);
				continue;             /* no such group: nothing to see */
			}
			if (!join_poll_locked(w))
				sdp_log(1, "listen fd %d: the group of a less specific address "
					"on its port did not answer yet", fd);
			w->reg_next = reg;
			reg = w;
		}
		l->wider[l->nwider++] = w;
	}
	l->reg_next = reg;
	reg = l;
	pthread_mutex_unlock(&reg_lock);
	*out = l;
	return 0;
}
