/*
 * hello.c - how two SDP endpoints on one host find each other and agree.
 *
 * Listener: when an application listens on a TCP socket that policy allows
 * for SDP, we publish a rendezvous: an abstract AF_UNIX SOCK_SEQPACKET socket
 * named after the listening address and port (and our uid). Abstract names
 * vanish with their last holder: nothing is left behind on a crash. The
 * listeners of a SO_REUSEPORT group share one rendezvous (group.c).
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
 * names consumes the offer (shm: maps and validates the memory). A client
 * whose offer we cannot take for lack of resources (memory, address
 * space, mappings, connection slots) is declined through its provider:
 * both ends carry the connection on TCP, the client handing back what it
 * had posted. A client whose hello is there but cannot be served otherwise
 * - its memory did not arrive, its offer is refused, its version is
 * another - is committed all the same: its connection is reset, never
 * kept as TCP on our side only.
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
#include "sdp/rendezvous.h"
#include "sdp/sys.h"
#include "sdp/log.h"

#define HELLO_STALE_NS (120ull * 1000000000ull)

/* ---- addresses -------------------------------------------------------------- */

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

int rv_key_of(const struct sockaddr *sa, socklen_t len, struct key *k)
{
	return key_of(sa, len, k);
}

/* Decimal digits of v at p; returns the end. */
static char *put_dec(char *p, unsigned v)
{
	char t[10];
	int n = 0;
	do
		t[n++] = (char)('0' + v % 10);
	while ((v /= 10) != 0);
	while (n)
		*p++ = t[--n];
	return p;
}

/* "sdp1.<uid>.<family>.<port>.<address in hex>" (PROTOCOL.md section 2),
 * formatted by hand: a client builds one per candidate per connect. */
static socklen_t rv_name(struct sockaddr_un *un, uid_t uid, const struct key *k)
{
	static const char hex[] = "0123456789abcdef";
	memset(un, 0, sizeof *un);
	un->sun_family = AF_UNIX;
	char *p = un->sun_path + 1;       /* abstract namespace */
	memcpy(p, "sdp1.", 5);
	p = put_dec(p + 5, (unsigned)uid);
	*p++ = '.';
	p = put_dec(p, (unsigned)k->family);
	*p++ = '.';
	p = put_dec(p, (unsigned)ntohs(k->port));
	*p++ = '.';
	int alen = k->family == AF_INET ? 4 : 16;
	for (int i = 0; i < alen; i++) {
		*p++ = hex[k->addr[i] >> 4];
		*p++ = hex[k->addr[i] & 15];
	}
	/* at most 5 + 3 * 11 + 32 = 70 characters: sun_path holds 107 */
	return (socklen_t)(p - (char *)un);
}

socklen_t rv_name_of(struct sockaddr_un *un, uid_t uid, const struct key *k)
{
	return rv_name(un, uid, k);
}

static void close_fds(const int *fds, unsigned n)
{
	for (unsigned i = 0; i < n && i < FAB_OFFER_FDS; i++)
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

/* ---- listener ---------------------------------------------------------------- */

int sdp_listener_open(int fd, bool offer, enum fab_pref pref, struct sdp_listener **out)
{
	union sdp_addr a;
	socklen_t len = sizeof a;
	struct key k;
	int one = 0;
	socklen_t ol = sizeof one;
	*out = NULL;
	if (sys_getsockname(fd, &a, &len) < 0 || key_of(&a.sa, len, &k) < 0)
		return -errno;
	/* SO_REUSEPORT spreads connections over several listening sockets,
	 * maybe in unrelated processes: they share one rendezvous. */
	if (sys_getsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, &ol) == 0 && one) {
		int r = k.port ? group_open(fd, &k, offer, out) : 0;
		if (*out)
			(*out)->pref = pref;
		return r;
	}
	if (!offer)
		return 0;
	struct sdp_listener *l = calloc(1, sizeof *l);
	if (!l)
		return -ENOMEM;
	l->uid = geteuid();
	l->pref = pref;
	l->k = k;
	static const uint8_t zero[16];
	if (memcmp(k.addr, zero, k.family == AF_INET ? 4 : 16) && len <= sizeof l->addr) {
		memcpy(&l->addr, &a, len);
		l->addrlen = len;
	}
	l->join = -1;
	l->shfd = -1;
	l->pb[0] = l->pb[1] = -1;
	l->refs = 1;
	l->fd_owned = true;
	l->namelen = rv_name(&l->name, l->uid, &k);
	l->rv = sys_fd_keep(sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0), -1);
	if (l->rv < 0)
		goto fail;
	/* Each hello then carries its sender's credentials (take_hello): no
	 * SO_PEERCRED call per connection. Without it, that call. */
	int pc = 1;
	if (sys_setsockopt(l->rv, SOL_SOCKET, SO_PASSCRED, &pc, sizeof pc) < 0)
		sdp_log(2, "rendezvous: no SO_PASSCRED (%s): SO_PEERCRED per hello",
			strerror(errno));
	if (sys_bind(l->rv, &l->name, l->namelen) < 0 || sys_listen(l->rv, 4096) < 0) {
		sdp_why("rendezvous not published: %s", errno == EADDRINUSE ?
			"its name is taken (another listener of this user on the "
			"same address, or a squatter)" : strerror(errno));
		goto fail;
	}
	int e = lshared_init(l, false);
	if (e < 0) {
		errno = -e;
		goto fail;
	}
	/* Clients of other hosts: the network rendezvous (hello_net.c). */
	l->net1 = sdp_net_listen(fd, pref) + 1;
	*out = l;
	return 0;
fail:;
	int err = -errno;
	if (l->rv >= 0)
		sys_close(l->rv);
	free(l);
	return err;
}

/*
 * Is l->rv still our rendezvous? The program may have closed its number
 * with a raw system call, or put a file of its own there (dup2, which the
 * switch lets through: switch/ours.c). Then SDP is no longer offered on
 * this listener (lost) and the number is never used by us again. Cheap
 * where it matters: callers on the accept path ask only when the number
 * lost its mark (sys_fd_ours) or could not be read.
 */
bool rv_intact(struct sdp_listener *l)
{
	if (l->lost)
		return false;
	if (l->rv < 0)
		return true;                  /* joining a group: none yet */
	struct sockaddr_un un;
	socklen_t len = sizeof un;
	if (sys_getsockname(l->rv, &un, &len) == 0 && len == l->namelen &&
	    memcmp(&un, &l->name, len) == 0)
		return true;
	sdp_log(1, "the rendezvous descriptor %d was closed or replaced by the program: "
		"SDP is no longer offered on this listener (its clients use TCP)", l->rv);
	l->lost = true;
	return false;
}

/* No fd of this process names the listener any more. */
void sdp_listener_close(struct sdp_listener *l)
{
	if (l)
		group_close(l);
}

/* Free what the listener holds in this process (group.c, last reference). */
void listener_free(struct sdp_listener *l)
{
	for (int i = 0; i < l->npend; i++)
		close_fds(l->pend[i].fds, l->pend[i].h.nfds);
	for (int i = 0; i < l->nsilent; i++)
		sys_close(l->silent[i].fd);
	for (int i = 0; i < l->nnetsilent; i++)
		sys_close(l->netsilent[i].fd);
	free(l->pend);
	if (l->rv >= 0 && rv_intact(l))
		sys_close(l->rv);
	if (l->net1 > 0)
		sys_close(l->net1 - 1);
	if (l->join >= 0)
		sys_close(l->join);
	lshared_drop(l);
	free(l);
}

/* The listening socket is about to be accepted from by a process that
 * cannot see our rendezvous (exec, SCM_RIGHTS): stop offering SDP on it for
 * every process sharing it. shutdown() on the shared AF_UNIX listener makes
 * every new rendezvous connect fail, so new clients stay on TCP. */
int sdp_listener_pending(const struct sdp_listener *l)
{
	return l ? l->npend : 0;
}

void sdp_listener_withdraw(struct sdp_listener *l)
{
	if (l && l->net1 > 0)
		sys_shutdown(l->net1 - 1, SHUT_RDWR);
	group_withdraw(l);
}

void sdp_listener_fork(struct sdp_listener *l, int delta)
{
	group_fork(l, delta);
}

/* Send msg (len bytes) with nfds descriptors on a connected rendezvous
 * socket s, never blocking. Returns 0 or -errno. */
int rv_send(int s, const void *msg, size_t len, const int *fds, int nfds)
{
	struct iovec iov = { (void *)msg, len };
	union { struct cmsghdr c; char buf[CMSG_SPACE(RV_FDS_MAX * sizeof(int))]; } u;
	memset(&u, 0, sizeof u);
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfds > RV_FDS_MAX)
		return -EINVAL;
	if (nfds > 0) {
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE((size_t)nfds * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfds * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfds * sizeof(int));
	}
	if (sys_sendmsg(s, &m, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)len)
		return errno ? -errno : -EIO;
	return 0;
}

/* Send a hello (len bytes: a client's, or a returned one with its
 * secret) with its offer's descriptors on a connected rendezvous socket s.
 * Returns 0 or -errno. */
static int hello_put(int s, const void *h, size_t len, const int *fds, unsigned nfds)
{
	return rv_send(s, h, len, fds, (int)nfds);
}

/* The TCP connection a hello names: listening side and peer. */
static bool hello_keys(const struct sdp_hello *h, struct key *lk, struct key *pk)
{
	if (h->family != AF_INET && h->family != AF_INET6)
		return false;
	memset(lk, 0, sizeof *lk);
	memset(pk, 0, sizeof *pk);
	lk->family = pk->family = h->family;
	size_t n = h->family == AF_INET ? 4 : 16;
	memcpy(lk->addr, h->dst_addr, n);
	memcpy(pk->addr, h->src_addr, n);
	lk->port = h->dst_port;
	pk->port = h->src_port;
	return true;
}

/* Bytes of the offer after offer_len are zero. */
static bool offer_tail_zero(const struct sdp_hello *h)
{
	for (size_t i = h->offer_len; i < sizeof h->offer; i++)
		if (h->offer[i])
			return false;
	return true;
}

/* Why a connection is reset, for the log. */
static const char *tomb_text(int err)
{
	switch (err) {
	case EMFILE: case ENFILE:
		return "its hello arrived without its memory (out of file descriptors)";
	case EPROTONOSUPPORT:
		return "its hello is of another protocol version";
	case EPROTO:
		return "its hello is malformed";
	case ENOMEM:
		return "no memory to keep its hello";
	case EXDEV:
		return "its hello could not be passed on to the process that accepted it";
	default:
		return "its hello could not be kept";
	}
}

/* What the accept of this thread has cost so far (sdp_sock_stats
 * accept_hellos_read, accept_hellos_back). */
static __thread struct {
	uint32_t read, back;
} accept_cost;

/* Take one message from a connected rendezvous socket s (nonblocking).
 * 0: nothing there yet; -1: dropped; 1: a hello appended to l->pend;
 * 2: recorded in the shared block instead (a hello that cannot be served,
 * or a join request's wake-up connection): *tl, *tp name its connection;
 * 3: a sibling handed us a rendezvous connection that was still silent:
 * *conn, first seen at *since.
 *
 * A client's hello is taken from the listener's uid only, and its pid is
 * the kernel's (SO_PEERCRED). A hello a sibling put back (it took it but
 * accepted another connection) comes from that sibling, whose uid may
 * have changed since the fork (nginx workers run as "nobody"): it is
 * taken when it carries the listener's secret, and keeps the pid the
 * first taker verified. A hello from our uid that names its connection but
 * cannot be served (its descriptors did not arrive: MSG_CTRUNC at our fd
 * limit; another version; malformed, or an offer of a provider we do not
 * know) still comes from a committed client: that connection is recorded,
 * and reset by whoever accepts it. What the offer says is its provider's
 * to check (sdp_hello_accept). */
static int take_hello(struct sdp_listener *l, int s, struct key *tl, struct key *tp,
		      int *conn, uint64_t *since)
{
	struct sdp_hello_back b;
	/* Room for more descriptors than an offer carries (every one
	 * received is closed unless the hello is well-formed), and for the
	 * sender's credentials (SO_PASSCRED on the rendezvous). */
	union { struct cmsghdr c;
		char buf[CMSG_SPACE(8 * sizeof(int)) + CMSG_SPACE(sizeof(struct ucred))]; } u;
	struct iovec iov = { &b, sizeof b };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
			    .msg_control = u.buf, .msg_controllen = sizeof u.buf };
	memset(&b, 0, sizeof b);
	ssize_t n = sys_recvmsg(s, &m, MSG_CMSG_CLOEXEC | MSG_DONTWAIT);
	if (n < 0 && errno == EAGAIN)
		return 0;
	accept_cost.read++;
	int fds[FAB_OFFER_FDS];
	unsigned kept = 0, nfds = 0;          /* descriptors kept, received */
	struct ucred cr;
	bool have_cr = false;                 /* cr from SCM_CREDENTIALS */
	for (struct cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&m) : NULL; cm;
	     cm = CMSG_NXTHDR(&m, cm)) {
		if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_CREDENTIALS &&
		    cm->cmsg_len == CMSG_LEN(sizeof cr)) {
			memcpy(&cr, CMSG_DATA(cm), sizeof cr);
			have_cr = true;
			continue;
		}
		if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
			continue;
		size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < k; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
			if (kept < FAB_OFFER_FDS)
				fds[kept++] = fd;
			else
				sys_close(fd);
			nfds++;
		}
	}
	struct sdp_hello h = b.h;
	bool back = h.flags & SDP_HELLO_RETURNED;
	socklen_t cl = sizeof cr;
	bool named = n >= (ssize_t)sizeof h && h.magic == SDP_HELLO_MAGIC &&
		     hello_keys(&h, tl, tp);
	/* Whose is it: the credentials the kernel attached to the record
	 * (SO_PASSCRED, set on the rendezvous and inherited by its
	 * connections) when they name the listener's uid and a process -
	 * the kernel lets a sender claim only a uid it holds (real,
	 * effective or saved), so such a sender can act as that uid anyway.
	 * Otherwise (none attached, or another uid: the kernel's default is
	 * the real uid, a set-uid client's effective one is what counts)
	 * the connection's SO_PEERCRED, as before. */
	bool cred_ok = have_cr && cr.uid == l->uid && cr.pid > 0;
	bool ours = named && (back || cred_ok ||
			      sys_getsockopt(s, SOL_SOCKET, SO_PEERCRED, &cr, &cl) == 0) &&
		    (back ? n == (ssize_t)sizeof b && b.secret == l->sh->secret && h.pid > 0
			  : cr.uid == l->uid);
	if (!ours) {
		close_fds(fds, kept);
		sdp_log(2, "rendezvous: dropped a %s hello", named ? "foreign" : "malformed");
		return -1;
	}
	if (back && (h.flags & SDP_HELLO_CONN)) {
		if (nfds == 1 && n == (ssize_t)sizeof b && !(m.msg_flags & MSG_CTRUNC)) {
			*conn = fds[0];
			*since = h.time_ns;
			return 3;
		}
		close_fds(fds, kept);
		return -1;
	}
	if (!back && h.version == SDP_PROTO_VERSION && h.flags == SDP_HELLO_JOIN &&
	    n == (ssize_t)sizeof h && nfds == 0 && kept == 0) {
		group_answer_join(l, s, &h);
		if (h.dst_port)               /* its wake-up connection */
			tomb_add(l->sh, TOMB_WAKE, 0, tl, tp);
		return 2;
	}
	int err = 0;
	if (h.version != SDP_PROTO_VERSION)
		err = EPROTONOSUPPORT;
	else if (m.msg_flags & MSG_CTRUNC)
		err = EMFILE;                 /* the kernel could not give us the fd */
	else if (n != (ssize_t)(back ? sizeof b : sizeof h) || (m.msg_flags & MSG_TRUNC) ||
		 nfds != h.nfds || h.nfds > FAB_OFFER_FDS ||
		 (h.flags & ~SDP_HELLO_RETURNED) != 0 || h.reserved != 0 ||
		 !fab_by_id(h.fabric) || h.offer_len > FAB_OFFER_MAX ||
		 !offer_tail_zero(&h))
		err = EPROTO;
	if (!err && l->npend == l->cap) {
		int nc = l->cap ? l->cap * 2 : 16;
		struct pending *np = realloc(l->pend, (size_t)nc * sizeof *np);
		if (np) {
			l->pend = np;
			l->cap = nc;
		} else {
			err = ENOMEM;
		}
	}
	if (err) {
		close_fds(fds, kept);
		sdp_log(1, "rendezvous: %s: its connection will be reset", tomb_text(err));
		tomb_add(l->sh, TOMB_RESET, err, tl, tp);
		return 2;
	}
	if (!back)
		h.pid = cr.pid;
	h.flags &= ~SDP_HELLO_RETURNED;
	uint64_t now = sdp_now_ns();
	l->pend[l->npend].h = h;
	memcpy(l->pend[l->npend].fds, fds, kept * sizeof fds[0]);
	l->pend[l->npend].rx_ns = back && h.time_ns <= now ? h.time_ns : now;
	l->npend++;
	return 1;
}

static bool pend_grow(struct sdp_listener *l)
{
	int nc = l->cap ? l->cap * 2 : 16;
	struct pending *np = realloc(l->pend, (size_t)nc * sizeof *np);
	if (!np)
		return false;
	l->pend = np;
	l->cap = nc;
	return true;
}

/* A hello as a process of the group gives it back (PROTOCOL.md: RETURNED
 * and the secret). Its time_ns becomes when it was first taken, so that
 * it ages across the processes that pass it on. */
static struct sdp_hello_back hello_back(const struct sdp_listener *l,
					const struct sdp_hello *h, uint64_t rx_ns)
{
	struct sdp_hello_back b = { .h = *h, .secret = l->sh->secret };
	b.h.flags |= SDP_HELLO_RETURNED;
	b.h.time_ns = rx_ns;
	return b;
}

/* Put a hello back into our own rendezvous queue (a sibling may need it). */
static int hello_send(const struct sdp_listener *l, const struct sdp_hello *h,
		      const int *fds, uint64_t rx_ns)
{
	struct sdp_hello_back b = hello_back(l, h, rx_ns);
	int s = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s < 0)
		return -errno;
	int r = sys_connect(s, &l->name, l->namelen) < 0 ? -errno :
		hello_put(s, &b, sizeof b, fds, h->nfds);
	sys_close(s);
	return r;
}

static bool key_eq(const struct key *a, const struct key *b)
{
	return a->family == b->family && a->port == b->port &&
	       !memcmp(a->addr, b->addr, a->family == AF_INET ? 4 : 16);
}

static bool hello_matches(const struct sdp_hello *h, const struct key *lk,
			  const struct key *pk)
{
	size_t n = lk->family == AF_INET ? 4 : 16;
	return h->family == lk->family && pk->family == lk->family &&
	       h->src_port == pk->port && h->dst_port == lk->port &&
	       !memcmp(h->dst_addr, lk->addr, n) && !memcmp(h->src_addr, pk->addr, n);
}

static void drop_pending(struct sdp_listener *l, int i)
{
	close_fds(l->pend[i].fds, l->pend[i].h.nfds);
	l->pend[i] = l->pend[--l->npend];
}

/* Very old, or its client is gone (looked up for those older than 1 s). */
static bool pending_stale(const struct pending *p, uint64_t now)
{
	uint64_t age = now > p->rx_ns ? now - p->rx_ns : 0;   /* now may be older */
	if (age > HELLO_STALE_NS)
		return true;
	const struct fab_ops *ops = fab_by_id(p->h.fabric);
	if (ops && (ops->traits & FAB_T_REMOTE))
		return false;                 /* its pid is another host's */
	return age > 1000000000ull && kill(p->h.pid, 0) < 0 && errno == ESRCH;
}

static int give_back(struct sdp_listener *l, int i, uint64_t now);

/* ---- the put-back queue ------------------------------------------------------
 *
 * A process of a shared rendezvous that reads a hello while looking for
 * another connection's must give it back: its connection may be another
 * process's to accept. Sent back into the rendezvous, it would wait behind
 * every hello queued since, and the accept that needs it would first read
 * (and send back) all of those: with a burst of connections whose hellos
 * arrive in a slightly other order than their SYNs, each such accept went
 * once round the whole queue. So hellos go back into the group's put-back
 * queue, a socket pair every member holds (group.c pb_open), with their
 * connections in an index in the shared block. An accept reads it only
 * when the index names its connection, and then only up to that hello:
 * the accept of a connection whose hello is not there costs nothing more.
 * Everything here runs under the group's lock. */

static uint32_t pb_find(const struct lshared *sh, const struct key *lk,
			const struct key *pk)
{
	for (uint32_t i = 0; i < sh->pb_n && i < PB_MAX; i++) {
		const struct pb_key *e = &sh->pb[(sh->pb_head + i) % PB_MAX];
		if (key_eq(&e->l, lk) && key_eq(&e->p, pk))
			return i;
	}
	return UINT32_MAX;
}

/* 0: sent to the put-back queue; -errno: it has none, or it is full. */
static int pb_put(struct sdp_listener *l, const struct pending *p)
{
	struct lshared *sh = l->sh;
	if (!sh->has_pb || l->pb[1] < 0 || !sys_fd_ours(l->pb[1]))
		return -ENOTSUP;              /* (its number taken: ours.c) */
	if (sh->pb_n >= PB_MAX)
		return -ENOSPC;
	struct pb_key *e = &sh->pb[(sh->pb_head + sh->pb_n) % PB_MAX];
	if (!hello_keys(&p->h, &e->l, &e->p))
		return -EINVAL;
	sh->pb_n++;                           /* before the send: never fewer */
	struct sdp_hello_back b = hello_back(l, &p->h, p->rx_ns);
	int r = hello_put(l->pb[1], &b, sizeof b, p->fds, p->h.nfds);
	if (r < 0)
		sh->pb_n--;
	return r;
}

static void pb_pop(struct lshared *sh)
{
	if (sh->pb_n) {
		sh->pb_head = (sh->pb_head + 1) % PB_MAX;
		sh->pb_n--;
	}
}

/* Take the put-back hellos up to the one of (lk, pk), if the index names
 * it. true: found (in l->pend, or recorded for a reset: *tl, *tp). The
 * others read on the way go back to the queue's tail (shared) or stay in
 * l->pend (we are the only process left). */
static bool pb_take(struct sdp_listener *l, const struct key *lk, const struct key *pk,
		    bool shared, uint64_t now)
{
	struct lshared *sh = l->sh;
	if (l->pb[0] < 0 || !sh->pb_n || !sys_fd_ours(l->pb[0]))
		return false;
	uint32_t pos = pb_find(sh, lk, pk);
	if (pos == UINT32_MAX)
		return false;
	/* The index may name hellos the queue no longer holds (a process
	 * killed between its receive and its pop), never fewer: ours is
	 * within the first pos + 1. */
	for (uint32_t i = 0; i <= pos; i++) {
		struct key tl, tp;
		int conn;
		uint64_t since;
		int r = take_hello(l, l->pb[0], &tl, &tp, &conn, &since);
		if (r == 0) {                 /* empty: so is the index */
			sh->pb_n = 0;
			return false;
		}
		pb_pop(sh);
		if (r == 3)
			sys_close(conn);      /* not sent here: not ours */
		if (r == 2 && key_eq(&tl, lk) && key_eq(&tp, pk))
			return true;
		if (r != 1)
			continue;
		if (hello_matches(&l->pend[l->npend - 1].h, lk, pk))
			return true;
		if (shared)
			give_back(l, l->npend - 1, now);
	}
	return false;
}

/* Shared: pend[i] is for a connection another process will accept: back
 * into the group's put-back queue with it, or where that has no room into
 * the rendezvous (unless stale); if it cannot go back, its connection is
 * recorded for a reset. 2: it went to the put-back queue, 1: to the
 * rendezvous, 0: dropped. */
static int give_back(struct sdp_listener *l, int i, uint64_t now)
{
	struct pending *p = &l->pend[i];
	int r = 0;
	if (!pending_stale(p, now)) {
		if (pb_put(l, p) == 0) {
			r = 2;
		} else if (hello_send(l, &p->h, p->fds, p->rx_ns) == 0) {
			r = 1;
		} else {
			struct key tl, tp;
			hello_keys(&p->h, &tl, &tp);
			tomb_add(l->sh, TOMB_RESET, EXDEV, &tl, &tp);
			sdp_log(1, "rendezvous: a hello could not be put back (%s): "
				"its connection will be reset", strerror(errno));
		}
	}
	if (r)
		accept_cost.back++;
	drop_pending(l, i);
	return r;
}

#define SILENT_NS 1000000000ull       /* a silent rendezvous connection lives 1 s */

/* Stop waiting for a silent rendezvous connection's hello. Shut down
 * first: a client whose hello comes later fails to send it and uses TCP;
 * one that came meanwhile is taken (else its committed client would be
 * lost). Returns what take_hello says of it. */
static int silent_give_up(struct sdp_listener *l, int fd, struct key *tl,
			  struct key *tp)
{
	int conn;
	uint64_t since;
	sys_shutdown(fd, SHUT_RDWR);
	int r = take_hello(l, fd, tl, tp, &conn, &since);
	if (r == 3)
		sys_close(conn);
	sys_close(fd);
	return r;
}

static void silent_add(struct sdp_listener *l, int fd, uint64_t since)
{
	if (l->nsilent == SILENT_MAX) {
		struct key tl, tp;
		silent_give_up(l, l->silent[0].fd, &tl, &tp);
		l->silent[0] = l->silent[--l->nsilent];
	}
	l->silent[l->nsilent].fd = fd;
	l->silent[l->nsilent].since_ns = since;
	l->nsilent++;
}

/* Hand a silent rendezvous connection to whichever process of the group
 * reads the queue next: its hello, when it comes, may be for any of them. */
static int silent_send(const struct sdp_listener *l, int fd, uint64_t since)
{
	struct sdp_hello_back b = {
		.h = { .magic = SDP_HELLO_MAGIC, .version = SDP_PROTO_VERSION,
		       .family = l->k.family, .pid = (int32_t)sdp_pid, .time_ns = since,
		       .flags = SDP_HELLO_RETURNED | SDP_HELLO_CONN, .nfds = 1 },
		.secret = l->sh->secret,
	};
	int s = sys_socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (s < 0)
		return -errno;
	int r = sys_connect(s, &l->name, l->namelen) < 0 ? -errno :
		hello_put(s, &b, sizeof b, &fd, 1);
	sys_close(s);
	return r;
}

/* After take_hello: stop draining? (the message named our connection, or,
 * shared, we met again the first hello we gave back: the whole queue has
 * been seen). Shared, a hello for another connection goes back at once -
 * kept until the end it would hold a descriptor per queued hello. */
static bool drain_stop(struct sdp_listener *l, int r, const struct key *tl,
		       const struct key *tp, const struct key *lk, const struct key *pk,
		       bool shared, uint64_t *mark, uint64_t now)
{
	if (r == 2)
		return key_eq(tl, lk) && key_eq(tp, pk);
	if (r != 1)
		return false;
	const struct sdp_hello *h = &l->pend[l->npend - 1].h;
	if (hello_matches(h, lk, pk))
		return true;
	if (!shared)
		return false;
	uint64_t tok = h->token | 1;
	bool wrapped = *mark == tok;
	/* Met again only if it went back into the rendezvous (the put-back
	 * queue full): the whole queue has been read. */
	if (give_back(l, l->npend - 1, now) == 1 && !*mark)
		*mark = tok;
	return wrapped;
}

/* A network rendezvous connection s whose hello h was taken (r, as
 * sdp_net_take returns): pending with its socket, or closed. */
static bool net_pend(struct sdp_listener *l, int s, const struct sdp_hello *h, int r,
		     uint64_t now)
{
	if (r != 1 || (l->npend == l->cap && !pend_grow(l))) {
		sys_close(s);
		return false;
	}
	l->pend[l->npend].h = *h;
	l->pend[l->npend].fds[0] = s;
	l->pend[l->npend].rx_ns = now;
	l->npend++;
	return true;
}

/* Take queued hellos into l->pend, up to the one of (lk, pk). Nothing
 * here blocks: a rendezvous connection that has not sent its hello yet is
 * kept aside (a real client sends before its TCP connect, so a connection
 * we are matching always has its hello queued already) and dropped after a
 * second, or when too many wait; shared, it goes back to the group when we
 * are done (take_mine). Returns 0, or -errno if the queue could not be read
 * (no descriptor left for a rendezvous connection). */
static int drain_queue(struct sdp_listener *l, const struct key *lk,
		       const struct key *pk, bool shared, bool net)
{
	uint64_t now = sdp_now_ns(), mark = 0;
	struct key tl, tp;
	int conn;
	uint64_t since;
	for (int i = l->nsilent - 1; i >= 0; i--) {
		int r = take_hello(l, l->silent[i].fd, &tl, &tp, &conn, &since);
		if (r == 0 && (now < l->silent[i].since_ns ||
			       now - l->silent[i].since_ns < SILENT_NS))
			continue;
		if (r == 3)
			sys_close(conn);
		if (r == 0)
			r = silent_give_up(l, l->silent[i].fd, &tl, &tp);
		else
			sys_close(l->silent[i].fd);
		l->silent[i] = l->silent[--l->nsilent];
		if (drain_stop(l, r, &tl, &tp, lk, pk, shared, &mark, now))
			return 0;
	}
	/* Hellos of other hosts (hello_net.c). Each was acknowledged by our
	 * kernel before its client's SYN: whole when its connection is
	 * accepted. A rendezvous connection whose hello is still on its way
	 * belongs to a client still setting up its endpoint: kept (silent)
	 * and looked at again by the next drains for SILENT_NS, then closed
	 * (its client then uses TCP). The socket goes with the hello. */
	for (int i = l->nnetsilent - 1; i >= 0; i--) {
		struct sdp_hello h;
		int s = l->netsilent[i].fd;
		int r = sdp_net_take(s, &h);
		if (r == 0 && now >= l->netsilent[i].since_ns &&
		    now - l->netsilent[i].since_ns < SILENT_NS)
			continue;
		l->netsilent[i] = l->netsilent[--l->nnetsilent];
		if (!net_pend(l, s, &h, r, now))
			continue;
		hello_keys(&h, &tl, &tp);
		if (drain_stop(l, 1, &tl, &tp, lk, pk, shared, &mark, now))
			return 0;
	}
	while (net && l->net1 > 0) {
		int s = sys_accept4(l->net1 - 1, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (s < 0)
			break;
		struct sdp_hello h;
		int r = sdp_net_take(s, &h);
		if (r == 0 && l->nnetsilent < SILENT_MAX) {
			l->netsilent[l->nnetsilent].fd = s;
			l->netsilent[l->nnetsilent].since_ns = now;
			l->nnetsilent++;
			continue;
		}
		if (!net_pend(l, s, &h, r, now))
			continue;
		hello_keys(&h, &tl, &tp);
		if (drain_stop(l, 1, &tl, &tp, lk, pk, shared, &mark, now))
			return 0;
	}
	if (pb_take(l, lk, pk, shared, now))
		return 0;
	for (;;) {
		int s = sys_accept4(l->rv, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
		if (s < 0)
			return errno == EAGAIN || errno == EINVAL ? 0 : -errno;
		int r = take_hello(l, s, &tl, &tp, &conn, &since);
		if (r == 0) {
			silent_add(l, s, now);
			continue;
		}
		sys_close(s);
		if (r == 3) {                 /* handed over: look at it now */
			int c = conn;
			r = take_hello(l, c, &tl, &tp, &conn, &since);
			if (r == 0 && (now < since || now - since < SILENT_NS)) {
				silent_add(l, c, since);
				continue;
			}
			if (r == 3)
				sys_close(conn);
			if (r == 0)
				r = silent_give_up(l, c, &tl, &tp);
			else
				sys_close(c);
		}
		if (drain_stop(l, r, &tl, &tp, lk, pk, shared, &mark, now))
			return 0;
	}
}


/* What one rendezvous knows about connection (lk, pk). */
enum look { LOOK_NONE = 0, LOOK_HELLO, LOOK_WAKE, LOOK_RESET };

/* Take the hello of connection (lk, pk) from l's queue, under the lock
 * every taker holds (threads of this process, and the processes sharing
 * the rendezvous). The queue is read only up to the first hello naming
 * the connection: the hello of an accepted connection was queued before
 * its SYN, so it is there; one for the same 4-tuple behind it would belong
 * to a later connection, which cannot exist while this one does. (Reading
 * the whole queue and sending every other hello back on each accept made
 * a burst of connections cost O(n^2): nginx accepted ~100 a second.)
 * Shared, the hellos read before ours go back into the queue for the
 * others; one that cannot go back is recorded for whoever accepts its
 * connection, which resets it. LOOK_RESET: *err says why. */
static enum look take_mine(struct sdp_listener *l, const struct key *lk,
			   const struct key *pk, bool net, struct pending *mine, int *err,
			   const char **why)
{
	memset(mine, 0, sizeof *mine);
	if (!l->sh || l->rv < 0 || l->lost || (!sys_fd_ours(l->rv) && !rv_intact(l)))
		return LOOK_NONE;
	static __thread char buf[96];
	int r = sdp_lock(&l->sh->lock);
	if (r) {
		*err = -r;
		snprintf(buf, sizeof buf, "the rendezvous lock is unusable (%s)",
			 strerror(-r));
		*why = buf;
		return LOOK_RESET;
	}
	bool shared = atomic_load(&l->sh->nproc) > 1;
	int unreadable = drain_queue(l, lk, pk, shared, net);
	int best = -1;
	uint64_t now = sdp_now_ns();
	enum look res = LOOK_NONE;
	for (int i = 0; i < l->npend; i++) {
		const struct sdp_hello *h = &l->pend[i].h;
		if (hello_matches(h, lk, pk) &&
		    (best < 0 || l->pend[i].rx_ns >= l->pend[best].rx_ns))
			best = i;
	}
	if (best >= 0) {
		*mine = l->pend[best];
		l->pend[best] = l->pend[--l->npend];
		res = LOOK_HELLO;
	} else {
		uint32_t kind = tomb_take(l->sh, lk, pk, err);
		if (kind == TOMB_RESET) {
			res = LOOK_RESET;
			*why = tomb_text(*err);
		} else if (kind == TOMB_WAKE)
			res = LOOK_WAKE;
	}
	if (res == LOOK_NONE && unreadable) {
		/* Its hello may be in there: we cannot tell this client
		 * from a TCP one unless the queue is empty. */
		/* A rendezvous closed under us (rv_intact): clients
		 * that come later find none and use TCP; a hello queued
		 * before is lost with it, so this one client, which may
		 * have sent one, is reset. */
		struct pollfd p = { .fd = l->rv, .events = POLLIN };
		if (!rv_intact(l) || l->nsilent || sys_poll(&p, 1, 0) > 0) {
			*err = -unreadable;
			snprintf(buf, sizeof buf, "the rendezvous could not be read (%s)",
				 strerror(-unreadable));
			*why = buf;
			res = LOOK_RESET;
		}
	}
	/* Drop hellos whose client died or that are very old. */
	if (l->npend > 32)
		for (int i = l->npend - 1; i >= 0; i--)
			if (pending_stale(&l->pend[i], now))
				drop_pending(l, i);
	if (shared) {
		/* Put back what others may need, then let them look. */
		for (int i = l->nsilent - 1; i >= 0; i--) {
			if (silent_send(l, l->silent[i].fd, l->silent[i].since_ns) < 0)
				continue;     /* keep it: better than nothing */
			sys_close(l->silent[i].fd);
			l->silent[i] = l->silent[--l->nsilent];
		}
		for (int i = l->npend - 1; i >= 0; i--)
			give_back(l, i, now);
	}
	sdp_unlock(&l->sh->lock);
	return res;
}

/* Look in our rendezvous, then in those of less specific names of our
 * port that we joined (clients may have used one of those). net: the
 * client is reached over a network provider, so its hello came to the
 * network rendezvous; a client of this host's cannot have used that one,
 * whose queue is then left for the accept of one of its own connections
 * (one system call less per local connection). */
static enum look take_any(struct sdp_listener *l, const struct key *lk,
			  const struct key *pk, bool net, struct pending *mine,
			  int *err, const char **why)
{
	enum look r = take_mine(l, lk, pk, net, mine, err, why);
	for (int i = 0; i < l->nwider && r == LOOK_NONE; i++)
		r = take_mine(l->wider[i], lk, pk, net, mine, err, why);
	return r;
}

/* A listener that has not joined its group (or a less specific one of its
 * port) cannot see the hellos of clients whose SYN it gets. */
static bool unjoined(struct sdp_listener *l)
{
	bool out = !group_join_poll(l);
	for (int i = 0; i < l->nwider; i++)
		out |= !group_join_poll(l->wider[i]);
	return out;
}

/* The client's offer cannot be set up here before we attached (out of
 * resources: reason): have its provider tell the client that both ends
 * use TCP, as TCP would serve it (PROTOCOL.md section 4). 0: the
 * connection is plain TCP now; -ESTALE: a stale hello (look further);
 * another -errno: the client could not be told (reset). */
static int decline(const struct fab_ops *ops, const struct pending *mine,
		   const struct fab_setup *su, int newfd, const char *reason)
{
	int r;
	if (ops->decline) {
		struct fab_offer o = { .len = mine->h.offer_len, .nfds = mine->h.nfds };
		memcpy(o.fds, mine->fds, sizeof o.fds);
		memcpy(o.data, mine->h.offer, sizeof o.data);
		r = ops->decline(su, &o, newfd);
	} else if ((ops->traits & FAB_T_REMOTE) && mine->h.nfds >= 1) {
		/* A network hello's descriptor is its rendezvous socket
		 * (hello_net.c): closed without the answer 'Y', the client
		 * and we both use TCP (PROTOCOL.md section 14.2). */
		r = sys_shutdown(mine->fds[0], SHUT_RDWR) < 0 ? -errno : 0;
	} else {
		return -EOPNOTSUPP;
	}
	if (r == 0) {
		sdp_log(1, "accept fd %d: SDP could not be set up (%s): TCP, and its "
			"client follows", newfd, reason);
		sdp_why("SDP could not be set up here (%s): declined, TCP", reason);
	}
	return r;
}

struct sdp_conn *sdp_hello_accept(struct sdp_listener *l, int newfd,
				  const struct sockaddr *peer, socklen_t peer_len,
				  int *refuse, const char **why)
{
	static __thread char whybuf[160];
	*refuse = 0;
	*why = NULL;
	union sdp_addr la, pa;
	socklen_t ll = sizeof la, pl = sizeof pa;
	struct key lk, pk;
	/* The peer's address accept() gave spares a getpeername. */
	if (peer && peer_len <= sizeof pa) {
		memset(&pa, 0, sizeof pa);
		memcpy(&pa, peer, peer_len);
		pl = peer_len;
	}
	/* A listener bound to one address gives it to all it accepts. */
	if (l && l->addrlen) {
		memcpy(&la, &l->addr, l->addrlen);
		ll = l->addrlen;
	}
	if (!l || (!l->addrlen && sys_getsockname(newfd, &la, &ll) < 0) ||
	    (!(peer && peer_len <= sizeof pa) && sys_getpeername(newfd, &pa, &pl) < 0) ||
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
	bool pending_join = (l->group || l->nwider) && unjoined(l);
	bool net = !may || (may->traits & FAB_T_REMOTE);

	/* A hello left over from an earlier connection of the same 4-tuple
	 * that never completed (its client failed or died) names memory that
	 * is no longer that connection's: its provider says -ESTALE (the
	 * token no longer matches, or the client gave up). Skip it and look
	 * further for the live one. */
	/* The client has committed to SDP once its hello is queued: a hello
	 * we find but cannot serve (connection slots, memory, mappings, a
	 * region we refuse) must not leave the connection TCP on our side
	 * only - both ends would wait for each other. *refuse < 0 asks the
	 * caller to reset it (the client sees ECONNRESET); > 0 to drop it
	 * unseen (a joining listener's wake-up connection). */
	accept_cost.read = accept_cost.back = 0;
	for (int tries = 0; tries < 4; tries++) {
		struct pending mine;
		int err = 0;
		const char *w = NULL;
		enum look lr = take_any(l, &lk, &pk, net, &mine, &err, &w);
		if (lr == LOOK_WAKE) {
			*refuse = 1;
			return NULL;
		}
		if (lr == LOOK_RESET) {
			*refuse = -(err ? err : EPROTO);
			*why = w;
			return NULL;
		}
		if (lr == LOOK_NONE) {
			if (pending_join) {
				*refuse = -EAGAIN;
				*why = "this listener has not joined its SO_REUSEPORT "
				       "group's rendezvous yet";
			} else {
				sdp_why("the client sent no hello: not an SDP client (not "
					"preloaded, a static program, or its policy says tcp)");
			}
			return NULL;
		}
		const struct fab_ops *ops = fab_by_id(mine.h.fabric);
		if (ops != may) {
			/* Said hello over a provider this listener may not
			 * use for that client: it waits for SDP, so reset. */
			close_fds(mine.fds, mine.h.nfds);
			*refuse = -EPROTONOSUPPORT;
			snprintf(whybuf, sizeof whybuf, "its hello is for the %s fabric, "
				 "which the policy does not allow here",
				 ops ? ops->name : "?");
			*why = whybuf;
			return NULL;
		}
		struct fab_setup su = { .token = mine.h.token, .pid = (int32_t)sdp_pid,
					.peer_pid = mine.h.pid, .local = &la.sa, .local_len = ll,
					.remote = &pa.sa, .remote_len = pl, .chan = -1 };
		struct sdp_conn *c = sdp_conn_alloc();
		if (!c) {
			int d = decline(ops, &mine, &su, newfd, "no connection slot left");
			close_fds(mine.fds, mine.h.nfds);
			if (d == 0)
				return NULL;
			if (d == -ESTALE)
				continue;
			*refuse = -ENOSPC;
			*why = "no connection slot left";
			return NULL;
		}
		struct fab_offer o = { .len = mine.h.offer_len, .nfds = mine.h.nfds };
		memcpy(o.fds, mine.fds, sizeof o.fds);
		memcpy(o.data, mine.h.offer, sizeof o.data);
		int r = ops->accept(&c->ep, &su, &o);
		if (r < 0 && r != -ESTALE && r != -EPROTO && r != -ENOTCONN) {
			/* Out of resources before we attached: TCP serves it. */
			snprintf(whybuf, sizeof whybuf, "its offer could not be taken: %s",
				 strerror(-r));
			int d = decline(ops, &mine, &su, newfd, whybuf);
			if (d == 0 || d == -ESTALE) {
				close_fds(mine.fds, mine.h.nfds);
				sdp_conn_free(c);
				if (d == 0)
					return NULL;
				continue;
			}
		}
		close_fds(mine.fds, mine.h.nfds);
		if (r == -ENOTCONN) {
			/* Its client closed before we looked and took the
			 * connection back for TCP: its bytes are on the socket. */
			sdp_log(2, "accept fd %d: its client closed first and went to TCP",
				newfd);
			sdp_why("the client closed before accept() and handed back to TCP");
			sdp_conn_free(c);
			return NULL;
		}
		if (r == -ESTALE) {
			sdp_log(1, "hello for fd %d is stale: looking for a newer one", newfd);
			sdp_conn_free(c);
			continue;
		}
		if (r < 0) {
			sdp_conn_free(c);
			*refuse = r;
			snprintf(whybuf, sizeof whybuf, "its offer %s (%s)",
				 r == -EPROTO ? "was refused" : "could not be taken",
				 strerror(-r));
			*why = whybuf;
			return NULL;
		}
		fab_label_default(&c->ep);
		sdp_proc_region(1, r == 1);
		c->st.region_pooled = (c->ep.flags & FAB_EP_POOLED) != 0;
		c->st.region_reused = r == 1;
		c->st.accept_hellos_read = accept_cost.read;
		c->st.accept_hellos_back = accept_cost.back;
		c->token = mine.h.token;
		c->peer_pid = mine.h.pid;
		atomic_store(&c->zcopy_thresh, sdp_zcopy_default());
		c->role = SDP_ROLE_SERVER;
		c->transport = 1;
		c->local = la;
		c->remote = pa;
		zc_attach(c, newfd);
		atomic_store(&c->state, SDP_ST_ESTABLISHED);
		return c;
	}
	*refuse = -ESTALE;                    /* only stale hellos found */
	*why = "only stale hellos found";
	return NULL;
}

/* ---- client ------------------------------------------------------------------ */

struct sdp_conn *sdp_hello_connect(int fd, const struct sockaddr *dst,
				   socklen_t len, enum fab_pref pref,
				   struct sdp_connect_state *cs)
{
	memset(cs, 0, sizeof *cs);
	struct key dk;
	/* The provider that reaches dst (shm: an address of this host). */
	const struct fab_ops *ops = key_of(dst, len, &dk) < 0 ? NULL :
				    fab_choose(dst, len, pref);
	if (!ops) {
		if (pref != FAB_PREF_ANY)
			sdp_why("the policy's fabric %s does not reach the destination",
				fab_pref_name(pref));
		else
			sdp_why("the destination is not an address of this host");
		return NULL;
	}
	if (ops->traits & FAB_T_REMOTE)           /* another host: hello_net.c */
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
	 * v4-mapped one for an IPv6 socket connecting to IPv4). A socket bound
	 * to an address and a port goes the same way too (the kernel keeps
	 * both): one path, and no getsockname to tell them apart first. */
	union sdp_addr la;
	socklen_t ll = sizeof la;
	struct key lk;
	static const uint8_t zero[16];
	{
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
				.geometry_default = !sdp_tun.geometry_given,
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
	zc_attach(c, fd);
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
	sdp_up_watch(c);                      /* until the server takes it up */
	atomic_store(&c->state, SDP_ST_ESTABLISHED);
}
