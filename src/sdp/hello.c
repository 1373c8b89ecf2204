/*
 * hello.c - how two SDP endpoints on one host find each other and agree.
 *
 * Listener: when an application listens on a TCP socket that policy allows
 * for SDP, we publish a rendezvous: an abstract AF_UNIX SOCK_SEQPACKET socket
 * named after the listening address and port (and our uid). Abstract names
 * vanish with their last holder: nothing is left behind on a crash.
 *
 * Client: before its TCP connect, a client allowed to use SDP asks the
 * fabric registry for a provider that reaches the destination (fab_choose:
 * shm reaches the addresses of this host) and looks for the rendezvous of
 * the destination (exact address, then the wildcard of its family, then the
 * IPv6 wildcard). If there is none, the connection is plain TCP and no SDP
 * byte is ever sent. If there is one, and the listener was created by a
 * process of our uid (SO_PEERCRED), the client has the kernel choose its
 * local address and port without sending the SYN (a deferred connect), has
 * the provider set up its side and make an offer (shm: the connection
 * memory, a sealed memfd), and sends a hello naming the TCP 4-tuple with
 * the offer's bytes and descriptors (SCM_RIGHTS). Only then does the SYN
 * go out. The connection is SDP from the client's side.
 *
 * Server: after accept() returns a TCP socket, the switch looks for the hello
 * of that 4-tuple in the rendezvous queue. Because the hello was queued
 * before the TCP connection existed, "no hello" means "not an SDP client":
 * the decision needs no timeout and no byte on the TCP stream. A hello is
 * accepted only from the listener's uid (SO_PEERCRED); the provider it
 * names consumes the offer (shm: maps and validates the memory).
 *
 * Forked servers (one listening socket, several accepting processes) share
 * the rendezvous: each process takes the queue's hellos under a process-
 * shared lock, keeps the one it needs and puts the others back before
 * unlocking, so whichever process accepts a connection finds its hello.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <netinet/tcp.h>

#include "sdp/conn.h"
#include "sdp/hello_net.h"
#include "sdp/proto.h"
#include "sdp/sys.h"
#include "sdp/log.h"

#define HELLO_STALE_NS (120ull * 1000000000ull)

struct pending {
	struct sdp_hello h;            /* h.pid: the sender as SO_PEERCRED says */
	int fds[FAB_OFFER_FDS];        /* the offer's descriptors (h.nfds), ours */
	uint64_t rx_ns;                /* when we took it (our clock, not theirs) */
};

struct lshared {                   /* shared by processes forked after listen */
	pthread_mutex_t lock;
	_Atomic uint32_t nproc;
	uint64_t secret;               /* proves a put-back hello is a sibling's */
};

#define SILENT_MAX 32
struct silent {                    /* rendezvous connections with no hello yet */
	int fd;
	uint64_t since_ns;
	bool net;                      /* the network rendezvous (hello_net.c) */
};

struct sdp_listener {
	int rv;                        /* rendezvous socket (abstract, listening) */
	int net;                       /* network rendezvous (hello_net.c), or -1 */
	enum fab_pref pref;            /* the policy's choice of provider */
	struct sockaddr_un name;
	socklen_t namelen;
	uid_t uid;                     /* creator: the only uid we take hellos from */
	struct lshared *sh;
	struct pending *pend;
	int npend, cap;
	struct silent silent[SILENT_MAX];
	int nsilent;
};

/* ---- addresses -------------------------------------------------------------- */

struct key {                       /* normalized address: v4-mapped -> v4 */
	uint16_t family;
	uint8_t  addr[16];
	uint16_t port;                 /* network order */
};

static int key_of(const struct sockaddr *sa, socklen_t len, struct key *k)
{
	memset(k, 0, sizeof *k);
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const void *)sa;
		k->family = AF_INET;
		memcpy(k->addr, &in->sin_addr, 4);
		k->port = in->sin_port;
		return 0;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		k->port = in6->sin6_port;
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			k->family = AF_INET;
			memcpy(k->addr, &in6->sin6_addr.s6_addr[12], 4);
		} else {
			k->family = AF_INET6;
			memcpy(k->addr, &in6->sin6_addr, 16);
		}
		return 0;
	}
	return -EAFNOSUPPORT;
}

static socklen_t rv_name(struct sockaddr_un *un, uid_t uid, const struct key *k)
{
	memset(un, 0, sizeof *un);
	un->sun_family = AF_UNIX;
	char *p = un->sun_path + 1;       /* abstract namespace */
	int n = snprintf(p, sizeof un->sun_path - 1, "sdp1.%u.%u.%u.",
			 (unsigned)uid, (unsigned)k->family, (unsigned)ntohs(k->port));
	int alen = k->family == AF_INET ? 4 : 16;
	for (int i = 0; i < alen; i++)
		n += snprintf(p + n, sizeof un->sun_path - 1 - (size_t)n, "%02x", k->addr[i]);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

/* ---- listener ---------------------------------------------------------------- */

int sdp_listener_open(int fd, enum fab_pref pref, struct sdp_listener **out)
{
	union sdp_addr a;
	socklen_t len = sizeof a;
	struct key k;
	int one = 0;
	socklen_t ol = sizeof one;
	*out = NULL;
	if (sys_getsockname(fd, &a, &len) < 0 || key_of(&a.sa, len, &k) < 0)
		return -errno;
	/* SO_REUSEPORT spreads connections over several listeners that we
	 * cannot tell apart: stay on TCP. */
	if (sys_getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, &ol) == 0 && one) {
		sdp_why("SO_REUSEPORT is set: its connections spread over "
			"listeners SDP cannot tell apart");
		return 0;
	}
	struct sdp_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->uid = geteuid();
	l->pref = pref;
	l->namelen = rv_name(&l->name, l->uid, &k);
	l->rv = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (l->rv < 0)
		goto fail;
	if (sys_bind(l->rv, &l->name, l->namelen) < 0 || sys_listen(l->rv, 4096) < 0) {
		sdp_why("rendezvous not published: %s", errno == EADDRINUSE ?
			"its name is taken (another listener of this user on the "
			"same address, or a squatter)" : strerror(errno));
		goto fail;
	}
	l->sh = mmap(NULL, sizeof *l->sh, PROT_READ | PROT_WRITE,
		     MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (l->sh == MAP_FAILED)
		goto fail;
	pthread_mutexattr_t ma;
	pthread_mutexattr_init(&ma);
	pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(&l->sh->lock, &ma);
	pthread_mutexattr_destroy(&ma);
	atomic_store(&l->sh->nproc, 1);
	if (getrandom(&l->sh->secret, sizeof l->sh->secret, 0) != sizeof l->sh->secret) {
		munmap(l->sh, sizeof *l->sh);
		goto fail;
	}
	l->net = sdp_net_listen(fd, pref);
	*out = l;
	return 0;
fail:;
	int e = -errno;
	if (l->rv >= 0)
		sys_close(l->rv);
	free(l);
	return e;
}

static void close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n; i++)
		sys_close(fds[i]);
}

/* The client's descriptors of an offer that are ours to close once sent. */
static void close_offer_fds(struct fab_offer *o)
{
	for (unsigned i = 0; i < o->nfds && i < FAB_OFFER_FDS; i++)
		if (o->close_after & (1u << i))
			sys_close(o->fds[i]);
	o->nfds = 0;
}

void sdp_listener_close(struct sdp_listener *l)
{
	if (!l)
		return;
	for (int i = 0; i < l->npend; i++)
		close_fds(l->pend[i].fds, l->pend[i].h.nfds);
	for (int i = 0; i < l->nsilent; i++)
		sys_close(l->silent[i].fd);
	free(l->pend);
	sys_close(l->rv);
	if (l->net >= 0)
		sys_close(l->net);
	if (l->sh && l->sh != MAP_FAILED) {
		atomic_fetch_sub(&l->sh->nproc, 1);
		munmap(l->sh, sizeof *l->sh);
	}
	free(l);
}

/* The listening socket is about to be accepted from by a process that
 * cannot see our rendezvous (exec, SCM_RIGHTS): stop offering SDP on it for
 * every process sharing it. shutdown() on the shared AF_UNIX listener makes
 * every new rendezvous connect fail, so new clients stay on TCP. */
void sdp_listener_withdraw(struct sdp_listener *l)
{
	sys_shutdown(l->rv, SHUT_RDWR);
	if (l->net >= 0)
		sys_shutdown(l->net, SHUT_RDWR);
}

void sdp_listener_fork(struct sdp_listener *l, int delta)
{
	if (delta > 0)
		atomic_fetch_add(&l->sh->nproc, 1);
	else
		atomic_fetch_sub(&l->sh->nproc, 1);
}

/* Take one hello from a connected rendezvous socket s (nonblocking).
 * 1: taken into l->pend, 0: nothing there yet, -1: dropped (bad).
 *
 * A client's hello is taken from the listener's uid only, and its pid is
 * the kernel's (SO_PEERCRED). A hello a sibling put back (it took it but
 * accepted another connection) comes from that sibling, whose uid may
 * have changed since the fork (nginx workers run as "nobody"): it is
 * taken when it carries the listener's secret, and keeps the pid the
 * first taker verified. What the offer says is the provider's to check
 * (sdp_hello_accept). */
static int pend_add(struct sdp_listener *l, const struct sdp_hello *hp,
		    const int *fds, unsigned nfds);

static int take_hello(struct sdp_listener *l, int s)
{
	struct sdp_hello_back b;
	struct sdp_hello h;
	/* Room for more descriptors than an offer carries: every one
	 * received is closed unless the hello is well-formed. */
	union { struct cmsghdr c; char buf[CMSG_SPACE(8 * sizeof(int))]; } u;
	struct iovec iov = { &b, sizeof b };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = u.buf, .msg_controllen = sizeof u.buf };
	ssize_t n = sys_recvmsg(s, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && errno == EAGAIN)
		return 0;
	int fds[FAB_OFFER_FDS];
	unsigned nfds = 0, nrecv = 0;
	for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; cm;
	     cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			if (nfds < FAB_OFFER_FDS)
				fds[nfds++] = fd;
			else
				sys_close(fd);
			nrecv++;
		}
	}
	h = b.h;
	bool back = h.flags & SDP_HELLO_RETURNED;
	struct ucred cr;
	socklen_t cl = sizeof cr;
	static const uint8_t zero[FAB_OFFER_MAX];
	bool ok = n == (ssize_t)(back ? sizeof b : sizeof h) && nrecv == h.nfds &&
		  !(m.msg_flags & (MSG_TRUNC | MSG_CTRUNC)) &&
		  h.magic == SDP_HELLO_MAGIC && h.version == SDP_PROTO_VERSION &&
		  (h.flags & ~SDP_HELLO_RETURNED) == 0 && h.reserved == 0 &&
		  fab_by_id(h.fabric) &&
		  h.offer_len <= FAB_OFFER_MAX &&
		  !memcmp(h.offer + h.offer_len, zero, FAB_OFFER_MAX - h.offer_len) &&
		  sys_getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0 &&
		  (back ? b.secret == l->sh->secret && h.pid > 0 : cr.uid == l->uid);
	if (!ok) {
		close_fds(fds, nfds);
		sdp_log(2, "rendezvous: dropped a malformed or foreign hello");
		return -1;
	}
	if (!back)
		h.pid = cr.pid;
	h.flags &= ~SDP_HELLO_RETURNED;
	return pend_add(l, &h, fds, nfds);
}

/* Keep a hello (and its descriptors) in l->pend: 1, or -1 (no memory: the
 * descriptors are closed). */
static int pend_add(struct sdp_listener *l, const struct sdp_hello *hp,
		    const int *fds, unsigned nfds)
{
	struct sdp_hello h = *hp;
	if (l->npend == l->cap) {
		int nc = l->cap ? l->cap * 2 : 16;
		struct pending *np = realloc(l->pend, (size_t)nc * sizeof *np);
		if (!np) {
			close_fds(fds, nfds);
			return -1;
		}
		l->pend = np;
		l->cap = nc;
	}
	l->pend[l->npend].h = h;
	memcpy(l->pend[l->npend].fds, fds, nfds * sizeof fds[0]);
	l->pend[l->npend].rx_ns = sdp_now_ns();
	l->npend++;
	return 1;
}

/* Send a hello (len bytes: a client's, or a returned one with its
 * secret) with its nfds descriptors on a connected rendezvous socket s.
 * Returns 0 or -errno. */
static int hello_put(int s, const void *h, size_t len, const int *fds, unsigned nfds)
{
	int r = 0;
	struct iovec iov = { (void *)h, len };
	union { struct cmsghdr c; char buf[CMSG_SPACE(FAB_OFFER_FDS * sizeof(int))]; } u;
	memset(&u, 0, sizeof u);
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds) {
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE(nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN(nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, nfds * sizeof(int));
	}
	if (sys_sendmsg(s, &m, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)len)
		r = errno ? -errno : -EIO;
	return r;
}

/* Put a hello back into our own rendezvous queue (a sibling may need it). */
static int hello_send(const struct sdp_listener *l, const struct pending *p)
{
	struct sdp_hello_back b = { .h = p->h, .secret = l->sh->secret };
	b.h.flags |= SDP_HELLO_RETURNED;
	int s = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s < 0)
		return -errno;
	int r = sys_connect(s, &l->name, l->namelen) < 0 ? -errno :
		hello_put(s, &b, sizeof b, p->fds, p->h.nfds);
	sys_close(s);
	return r;
}

/* A hello from the network rendezvous (hello_net.c): the socket goes with
 * it as its one descriptor (the provider answers on it). 1 / 0 / -1 as
 * take_hello; on 1 the caller keeps s open. */
static int take_net(struct sdp_listener *l, int s)
{
	struct sdp_hello h;
	int r = sdp_net_take(s, &h);
	if (r <= 0)
		return r;
	int fds[1] = { s };
	if (pend_add(l, &h, fds, 1) < 0)
		return -2;                    /* s closed already */
	return 1;
}

static bool hello_matches(const struct sdp_hello *h, const struct key *lk,
			  const struct key *pk)
{
	size_t n = lk->family == AF_INET ? 4 : 16;
	return h->family == lk->family && pk->family == lk->family &&
	       h->src_port == pk->port && h->dst_port == lk->port &&
	       !memcmp(h->dst_addr, lk->addr, n) && !memcmp(h->src_addr, pk->addr, n);
}

/* Take queued hellos into l->pend, up to the one of (lk, pk). Nothing
 * here blocks: a rendezvous connection that has not sent its hello yet is
 * kept aside (a real client sends before its TCP connect, so a connection
 * we are matching always has its hello queued already) and dropped after a
 * second, or when too many wait. */
static void drain_queue(struct sdp_listener *l, const struct key *lk,
			const struct key *pk)
{
	uint64_t now = sdp_now_ns();
	for (int i = l->nsilent - 1; i >= 0; i--) {
		bool net = l->silent[i].net;
		int r = net ? take_net(l, l->silent[i].fd) : take_hello(l, l->silent[i].fd);
		if (r == 0 && now - l->silent[i].since_ns < 1000000000ull)
			continue;
		if (!net || r == -1 || r == 0)
			sys_close(l->silent[i].fd);
		l->silent[i] = l->silent[--l->nsilent];
	}
	for (int net = 0; net < 2; net++) {
		int lfd = net ? l->net : l->rv;
		while (lfd >= 0) {
			int s = sys_accept4(lfd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
			if (s < 0)
				break;
			int r = net ? take_net(l, s) : take_hello(l, s);
			if (r == 0) {
				if (l->nsilent == SILENT_MAX) {
					sys_close(l->silent[0].fd);
					l->silent[0] = l->silent[--l->nsilent];
				}
				l->silent[l->nsilent].fd = s;
				l->silent[l->nsilent].since_ns = now;
				l->silent[l->nsilent].net = net;
				l->nsilent++;
				continue;
			}
			if (!net || r == -1)
				sys_close(s);     /* a network hello keeps its socket */
			if (r > 0 && hello_matches(&l->pend[l->npend - 1].h, lk, pk))
				return;
		}
	}
}

static void drop_pending(struct sdp_listener *l, int i)
{
	close_fds(l->pend[i].fds, l->pend[i].h.nfds);
	l->pend[i] = l->pend[--l->npend];
}

static bool pending_stale(const struct pending *p, uint64_t now)
{
	if (now - p->rx_ns > HELLO_STALE_NS)
		return true;
	const struct fab_ops *ops = fab_by_id(p->h.fabric);
	if (ops && (ops->traits & FAB_T_REMOTE))
		return false;                 /* its pid is another host's */
	return kill(p->h.pid, 0) < 0 && errno == ESRCH;
}

/* Take the hello of connection (lk, pk) from the queue. Both alone and
 * shared, the queue is read only up to the first hello naming it: the
 * hello of an accepted connection was queued before its SYN, so it is
 * there; one for the same 4-tuple behind it would belong to a later
 * connection, which cannot exist while this one does. (Reading the whole
 * queue and sending every other hello back on each accept made a burst
 * of connections cost O(n^2): nginx accepted ~100 a second.) Shared, the
 * hellos read before ours go back into the queue for the siblings. */
static struct pending take_mine(struct sdp_listener *l, const struct key *lk,
				const struct key *pk)
{
	struct pending mine = { .h.magic = 0 };
	bool shared = atomic_load(&l->sh->nproc) > 1;
	if (shared && sdp_lock(&l->sh->lock))
		return mine;
	drain_queue(l, lk, pk);
	int best = -1;
	uint64_t now = sdp_now_ns();
	for (int i = 0; i < l->npend; i++) {
		const struct sdp_hello *h = &l->pend[i].h;
		if (hello_matches(h, lk, pk) &&
		    (best < 0 || l->pend[i].rx_ns >= l->pend[best].rx_ns))
			best = i;
	}
	if (best >= 0) {
		mine = l->pend[best];
		l->pend[best] = l->pend[--l->npend];
	}
	/* Drop hellos whose client died or that are very old. */
	if (l->npend > 32)
		for (int i = l->npend - 1; i >= 0; i--)
			if (pending_stale(&l->pend[i], now))
				drop_pending(l, i);
	if (shared) {
		/* Put back what others may need, then let them look. */
		for (int i = l->npend - 1; i >= 0; i--) {
			hello_send(l, &l->pend[i]);
			drop_pending(l, i);
		}
		sdp_unlock(&l->sh->lock);
	}
	return mine;
}

struct sdp_conn *sdp_hello_accept(struct sdp_listener *l, int newfd, int *refuse)
{
	*refuse = 0;
	union sdp_addr la, pa;
	socklen_t ll = sizeof la, pl = sizeof pa;
	struct key lk, pk;
	if (!l || sys_getsockname(newfd, &la, &ll) < 0 ||
	    sys_getpeername(newfd, &pa, &pl) < 0 ||
	    key_of(&la.sa, ll, &lk) < 0 || key_of(&pa.sa, pl, &pk) < 0) {
		sdp_why("cannot name the connection's addresses");
		return NULL;
	}
	/* Only a client some provider reaches over the rendezvous can have
	 * said hello (a remote one cannot); the policy may allow only one. */
	const struct fab_ops *may = fab_choose(&pa.sa, pl, l->pref);
	if (!may && (l->pref == FAB_PREF_ANY || !fab_choose(&pa.sa, pl, FAB_PREF_ANY))) {
		sdp_why("the client is not on this host");
		return NULL;              /* a remote client cannot have said hello */
	}

	/* A hello left over from an earlier connection of the same 4-tuple
	 * that never completed (its client failed or died) names memory that
	 * is no longer that connection's: its provider says -ESTALE (the
	 * token no longer matches, or the client gave up). Skip it and look
	 * further for the live one. */
	/* The client has committed to SDP once its hello is queued: a hello
	 * we find but cannot serve for lack of resources (connection slots,
	 * memory, mappings) must not leave the connection TCP on our side
	 * only - both ends would wait for each other. *refuse asks the caller
	 * to reset it (the client sees ECONNRESET). A malformed one (-EPROTO:
	 * no honest client sends it) leaves the connection plain TCP. */
	for (int tries = 0; tries < 4; tries++) {
		struct pending mine = take_mine(l, &lk, &pk);
		if (mine.h.magic == 0) {
			sdp_why("the client sent no hello: not an SDP client (not "
				"preloaded, a static program, or its policy says tcp)");
			return NULL;
		}
		const struct fab_ops *ops = fab_by_id(mine.h.fabric);
		if (ops != may) {
			/* Said hello over a provider this listener may not
			 * use for that client: it waits for SDP, so reset. */
			sdp_log(1, "hello for fd %d over %s, which the policy does "
				"not allow here", newfd, ops ? ops->name : "?");
			close_fds(mine.fds, mine.h.nfds);
			*refuse = -EPROTONOSUPPORT;
			return NULL;
		}
		struct sdp_conn *c = sdp_conn_alloc();
		if (!c) {
			close_fds(mine.fds, mine.h.nfds);
			*refuse = -ENOSPC;
			return NULL;
		}
		struct fab_setup su = { .token = mine.h.token, .pid = (int32_t)sdp_pid,
					.peer_pid = mine.h.pid, .local = &la.sa, .local_len = ll,
					.remote = &pa.sa, .remote_len = pl, .chan = -1 };
		struct fab_offer o = { .len = mine.h.offer_len, .nfds = mine.h.nfds };
		memcpy(o.fds, mine.fds, sizeof o.fds);
		memcpy(o.data, mine.h.offer, sizeof o.data);
		int r = ops->accept(&c->ep, &su, &o);
		close_fds(mine.fds, mine.h.nfds);
		if (r == -ESTALE) {
			sdp_log(1, "hello for fd %d is stale: looking for a newer one", newfd);
			sdp_conn_free(c);
			continue;
		}
		if (r < 0) {
			sdp_log(1, "hello for fd %d rejected (%d)", newfd, r);
			sdp_conn_free(c);
			if (r != -EPROTO)
				*refuse = r;
			else
				sdp_why("malformed hello");
			return NULL;
		}
		fab_label_default(&c->ep);
		sdp_proc_region(1, r == 1);
		c->st.region_pooled = (c->ep.flags & FAB_EP_POOLED) != 0;
		c->st.region_reused = r == 1;
		c->token = mine.h.token;
		c->peer_pid = mine.h.pid;
		atomic_store(&c->zcopy_thresh, sdp_zcopy_default());
		c->role = SDP_ROLE_SERVER;
		c->transport = 1;
		c->local = la;
		c->remote = pa;
		zc_attach(c);
		atomic_store(&c->state, SDP_ST_ESTABLISHED);
		return c;
	}
	*refuse = -ESTALE;                    /* only stale hellos found */
	return NULL;
}

/* ---- client ------------------------------------------------------------------ */

struct sdp_conn *sdp_hello_connect(int fd, const struct sockaddr *dst,
				   socklen_t len, enum fab_pref pref,
				   struct sdp_connect_state *cs)
{
	memset(cs, 0, sizeof *cs);
	struct key dk;
	if (key_of(dst, len, &dk) < 0) {
		sdp_why("the destination is not an IP address");
		return NULL;
	}
	/* The provider that reaches dst (shm: an address of this host). */
	const struct fab_ops *ops = fab_choose(dst, len, pref);
	if (!ops) {
		if (pref != FAB_PREF_ANY)
			sdp_why("the policy's fabric %s does not reach the destination",
				fab_pref_name(pref));
		else
			sdp_why("the destination is not an address of this host");
		return NULL;
	}
	if (ops->traits & FAB_T_REMOTE)
		return sdp_net_connect(fd, dst, len, ops, cs);
	uid_t uid = geteuid();

	/* Which rendezvous serves dst? exact, family wildcard, v6 wildcard. */
	struct key cand[3];
	int nc = 0;
	cand[nc++] = dk;
	struct key w = dk;
	memset(w.addr, 0, sizeof w.addr);
	cand[nc++] = w;
	if (dk.family == AF_INET) {
		w.family = AF_INET6;
		cand[nc++] = w;
	}
	/* Which candidate served this port last time is tried first. */
	static _Atomic uint32_t hint[256];    /* port -> candidate + 1 */
	uint32_t hslot = ntohs(dk.port) & 255, hv = atomic_load(&hint[hslot]);
	int first = (hv >> 16) == ntohs(dk.port) ? (int)(hv & 0xff) : 0;
	if (first >= nc)
		first = 0;
	struct sockaddr_un name;
	int rv = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (rv < 0) {
		sdp_why("no socket for the rendezvous: %s", strerror(errno));
		return NULL;
	}
	int found = -1, busy = 0;
	for (int k = 0; k < nc && found < 0; k++) {
		int i = (first + k) % nc;
		socklen_t nl = rv_name(&name, uid, &cand[i]);
		/* A refused connect leaves an AF_UNIX socket reusable. */
		if (sys_connect(rv, &name, nl) == 0)
			found = i;
		else if (errno == EAGAIN)
			busy++;
	}
	if (found < 0) {
		if (busy)
			sdp_why("the listener's rendezvous queue is full");
		else
			sdp_why("no SDP listener at the destination: no rendezvous "
				"(its server is not preloaded, its policy says tcp, "
				"or it set SO_REUSEPORT)");
		sys_close(rv);
		return NULL;
	}
	struct ucred cr;
	socklen_t cl = sizeof cr;
	if (sys_getsockopt(rv, SOL_SOCKET, SO_PEERCRED, &cr, &cl) < 0 || cr.uid != uid) {
		sdp_why("the listener belongs to another user");
		sys_close(rv);                /* squatted by another user: TCP */
		return NULL;
	}
	atomic_store(&hint[hslot], ((uint32_t)ntohs(dk.port) << 16) | (uint32_t)found);
	pid_t listener_pid = cr.pid;
	struct sdp_conn *c = NULL;
	struct fab_offer o = { .nfds = 0 };
	const char *why = "cannot name the local address";

	/* The hello names the whole 4-tuple and must be queued before the
	 * SYN. A deferred connect (TCP_FASTOPEN_CONNECT with
	 * TCP_FASTOPEN_NO_COOKIE) has the kernel choose the source address
	 * and port exactly as any connect would, without sending the SYN;
	 * the caller releases it once the hello is queued. If the kernel did
	 * not defer (the SYN is out), no hello is sent: plain TCP. A socket
	 * bound to the wildcard address (0.0.0.0 or [::], with port 0 - bind
	 * picks a port then - or a port of the application's: many client
	 * libraries bind before connecting) takes the same path: the kernel
	 * keeps the bound port and chooses the source address at connect (a
	 * v4-mapped one for an IPv6 socket connecting to IPv4). Only a socket
	 * bound to an address and a port needs none of this. */
	union sdp_addr la;
	socklen_t ll = sizeof la;
	struct key lk;
	if (sys_getsockname(fd, &la, &ll) < 0 || key_of(&la.sa, ll, &lk) < 0)
		goto fail;
	static const uint8_t zero[16];
	bool any_addr = !memcmp(lk.addr, zero, lk.family == AF_INET ? 4 : 16);
	if (lk.port == 0 || any_addr) {
		int one = 1;
		why = "no deferred connect (TCP_FASTOPEN_CONNECT)";
		if (sys_setsockopt(fd, SOL_TCP, TCP_FASTOPEN_CONNECT, &one, sizeof one) < 0 ||
		    sys_setsockopt(fd, SOL_TCP, TCP_FASTOPEN_NO_COOKIE, &one, sizeof one) < 0)
			goto fail;
		int r = sys_connect(fd, dst, len);
		cs->issued = true;
		cs->result = r < 0 ? -errno : 0;
		struct tcp_info ti;
		socklen_t tl = sizeof ti;
		why = r < 0 ? strerror(errno) : "the kernel did not defer the SYN";
		if (r < 0 || sys_getsockopt(fd, SOL_TCP, TCP_INFO, &ti, &tl) < 0 ||
		    ti.tcpi_state != TCP_SYN_SENT || ti.tcpi_unacked != 0)
			goto fail;            /* not deferred: stay TCP */
		why = "cannot name the local address";
		cs->deferred = true;
		ll = sizeof la;
		if (sys_getsockname(fd, &la, &ll) < 0 || key_of(&la.sa, ll, &lk) < 0 ||
		    lk.port == 0 || !memcmp(lk.addr, zero, lk.family == AF_INET ? 4 : 16))
			goto fail;
	}
	why = "out of connection slots or memory";

	struct sdp_hello h = {
		.magic = SDP_HELLO_MAGIC,
		.version = SDP_PROTO_VERSION,
		.family = dk.family,
		.dst_port = dk.port,
		.src_port = lk.port,
		.pid = (int32_t)sdp_pid,
		.time_ns = sdp_now_ns(),
		.fabric = ops->id,
	};
	memcpy(h.dst_addr, dk.addr, sizeof h.dst_addr);
	memcpy(h.src_addr, lk.addr, sizeof h.src_addr);
	/* Unique, not secret (the offer's memory is the capability). */
	static _Atomic uint64_t seq;
	h.token = (h.time_ns * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)sdp_pid << 40) ^
		  atomic_fetch_add(&seq, 1);

	c = sdp_conn_alloc();
	if (!c)
		goto fail;
	atomic_store(&c->zcopy_thresh, sdp_zcopy_default());
	struct fab_setup su = { .nslots = sdp_tun.nslots, .slot_size = sdp_tun.slot_size,
				.token = h.token, .pid = (int32_t)sdp_pid,
				.peer_pid = (int32_t)listener_pid };
	if (ops->offer(&c->ep, &su, &o) < 0) {
		sdp_conn_free(c);
		c = NULL;
		o.nfds = 0;                   /* nothing to undo */
		goto fail;
	}
	if (o.len > FAB_OFFER_MAX || o.nfds > FAB_OFFER_FDS) {
		why = "the provider's offer does not fit the hello";
		o.nfds = o.nfds > FAB_OFFER_FDS ? FAB_OFFER_FDS : o.nfds;
		ops->connected(&c->ep, -EPROTO);
		ops->detach(&c->ep);
		sdp_conn_free(c);
		c = NULL;
		goto fail;
	}
	h.nfds = (uint8_t)o.nfds;
	h.offer_len = (uint16_t)o.len;
	memcpy(h.offer, o.data, o.len);
	why = "the hello could not be sent";
	if (hello_put(rv, &h, sizeof h, o.fds, o.nfds) < 0) {
		ops->connected(&c->ep, -EIO);     /* nobody will accept it */
		ops->detach(&c->ep);
		sdp_conn_free(c);
		c = NULL;
		goto fail;
	}
	close_offer_fds(&o);
	sys_close(rv);
	fab_label_default(&c->ep);
	sdp_proc_region(0, o.reused);
	c->st.region_pooled = (c->ep.flags & FAB_EP_POOLED) != 0;
	c->st.region_reused = o.reused;
	c->token = h.token;
	c->peer_pid = (int32_t)listener_pid;
	c->role = SDP_ROLE_CLIENT;
	c->transport = 1;
	c->local = la;
	memcpy(&c->remote, dst, len < sizeof c->remote ? len : sizeof c->remote);
	zc_attach(c);
	atomic_store(&c->state, SDP_ST_CONNECTING);
	return c;
fail:
	sdp_why("%s", why);
	close_offer_fds(&o);
	sys_close(rv);
	return NULL;
}

void sdp_connect_done(struct sdp_conn *c, int fd, int err)
{
	if (err) {
		c->ep.ops->connected(&c->ep, -err);
		atomic_store(&c->state, SDP_ST_RESET);
		return;
	}
	c->ep.ops->connected(&c->ep, 0);
	/* The hello named our address already (the kernel chose it at the
	 * deferred connect, or the application bound it). */
	bool known = c->local.sa.sa_family == AF_INET ? c->local.in.sin_port != 0 :
		     c->local.sa.sa_family == AF_INET6 && c->local.in6.sin6_port != 0;
	union sdp_addr la;
	socklen_t ll = sizeof la;
	if (!known && sys_getsockname(fd, &la, &ll) == 0)
		c->local = la;
	atomic_store(&c->state, SDP_ST_ESTABLISHED);
}
