/*
 * hello_net.c - the rendezvous between hosts: how a client learns that a
 * server on another host runs the library, and hands it the hello before
 * the TCP connection exists (hello.c does the same within one host over
 * an abstract AF_UNIX socket, which another host cannot reach).
 *
 * Server: a listener that may serve remote clients (a provider with
 * FAB_T_REMOTE is usable, the policy allows it, the address is not a
 * loopback one) also listens, with plain TCP, on its port plus
 * ofi_port_offset (modulo 65535, never 0): the network rendezvous. Its
 * queue is read, never blocking, where hello.c reads the AF_UNIX one.
 *
 * Client: for a destination only a remote provider reaches, connect to
 * that port first. A refusal (RST: no library there, or a listener that
 * does not offer SDP) comes within a round trip and means TCP; so does no
 * answer within ofi_hello_ms. Either is remembered for a minute per
 * address and port, so a server without the library costs one round trip
 * a minute. Otherwise: a deferred TCP connect names the 4-tuple (the SYN
 * held), the provider makes its offer, the hello goes out on the
 * rendezvous socket, and the client waits until the server's kernel has
 * acknowledged it (TCP_INFO: nothing unacknowledged) before the SYN is
 * released. So, as on one host, the hello is in the server's queue
 * before its accept() can return the connection, and "no hello" at
 * accept is final. The two TCP connections carry no order between them;
 * the acknowledgement does. The socket then stays with the provider: the
 * server answers on it once accept() took the hello (PROTOCOL.md 14.2).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <linux/sockios.h>
#include <netinet/tcp.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "sdp/conn.h"
#include "sdp/hello_net.h"
#include "sdp/log.h"
#include "sdp/proto.h"
#include "sdp/sys.h"

/* ---- the port ------------------------------------------------------------ */

static uint16_t net_port(uint16_t port)
{
	uint32_t p = ((uint32_t)port - 1 + sdp_tun.ofi_port_offset) % 65535u + 1;
	return (uint16_t)p;
}

static bool loopback(const struct sockaddr *a)
{
	if (a->sa_family == AF_INET)
		return ((const uint8_t *)&((const struct sockaddr_in *)(const void *)a)->sin_addr)[0] == 127;
	if (a->sa_family == AF_INET6) {
		const struct in6_addr *i6 = &((const struct sockaddr_in6 *)(const void *)a)->sin6_addr;
		return IN6_IS_ADDR_LOOPBACK(i6) ||
		       (IN6_IS_ADDR_V4MAPPED(i6) && i6->s6_addr[12] == 127);
	}
	return true;
}


/* ---- server ---------------------------------------------------------------- */

void sdp_net_prepare(int fd)
{
	union sdp_addr a;
	socklen_t len = sizeof a;
	if (sys_getsockname(fd, &a, &len) < 0 || loopback(&a.sa) ||
	    (a.sa.sa_family == AF_INET ? a.in.sin_port : a.in6.sin6_port) == 0)
		return;                       /* only this host, or no port yet */
	const struct fab_ops *ops = fab_remote();
	if (ops)
		ops->reaches(NULL, 0);        /* loads the provider's library */
}

int sdp_net_listen(int fd, enum fab_pref pref)
{
	union sdp_addr a;
	socklen_t len = sizeof a;
	if (pref != FAB_PREF_ANY && pref != FAB_PREF_OFI)
		return -1;
	if (sys_getsockname(fd, &a, &len) < 0 || loopback(&a.sa))
		return -1;                    /* only this host can reach it */
	const struct fab_ops *ops = fab_remote();
	if (!ops || !ops->reaches(NULL, 0))
		return -1;                    /* no fabric between hosts here */
	uint16_t port = ntohs(a.sa.sa_family == AF_INET ? a.in.sin_port : a.in6.sin6_port);
	uint16_t np = htons(net_port(port));
	if (a.sa.sa_family == AF_INET)
		a.in.sin_port = np;
	else
		a.in6.sin6_port = np;
	int s = sys_socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	int one = 1;
	sys_setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	if (sys_bind(s, &a, len) < 0 || sys_listen(s, 4096) < 0) {
		sdp_log(1, "listen fd %d: no network rendezvous on port %u (%s): clients on "
			"other hosts use TCP", fd, (unsigned)ntohs(np), strerror(errno));
		sys_close(s);
		return -1;
	}
	sdp_log(2, "listen fd %d: network rendezvous on port %u", fd, (unsigned)ntohs(np));
	return sys_fd_keep(s, -1);
}

int sdp_net_take(int s, struct sdp_hello *h)
{
	ssize_t n = sys_recvfrom(s, h, sizeof *h, MSG_DONTWAIT | MSG_PEEK);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return 0;
	if (n >= 0 && n < (ssize_t)sizeof *h) {
		/* Not all there yet: a client sends it whole before its SYN,
		 * so only a slow or hostile one is caught here. EOF: gone. */
		return n == 0 ? -1 : 0;
	}
	if (n != (ssize_t)sizeof *h)
		return -1;
	if (sys_recvfrom(s, h, sizeof *h, MSG_DONTWAIT) != (ssize_t)sizeof *h)
		return -1;
	/* Its source must be the address the hello names: the stream must
	 * not be sent anywhere else. */
	union sdp_addr pa;
	socklen_t pl = sizeof pa;
	if (sys_getpeername(s, &pa, &pl) < 0)
		return -1;
	uint8_t src[16] = { 0 };
	int fam;
	if (pa.sa.sa_family == AF_INET) {
		fam = AF_INET;
		memcpy(src, &pa.in.sin_addr, 4);
	} else if (IN6_IS_ADDR_V4MAPPED(&pa.in6.sin6_addr)) {
		fam = AF_INET;
		memcpy(src, &pa.in6.sin6_addr.s6_addr[12], 4);
	} else {
		fam = AF_INET6;
		memcpy(src, &pa.in6.sin6_addr, 16);
	}
	const struct fab_ops *ops = fab_by_id(h->fabric);
	if (h->magic != SDP_HELLO_MAGIC || h->version != SDP_PROTO_VERSION ||
	    h->family != fam || memcmp(h->src_addr, src, fam == AF_INET ? 4 : 16) ||
	    !ops || !(ops->traits & FAB_T_REMOTE) || h->nfds != 0 || h->flags ||
	    h->pid <= 0) {
		sdp_log(2, "network rendezvous: dropped a hello of another version, "
			"provider or address");
		return -1;
	}
	h->nfds = 1;                          /* the rendezvous socket itself */
	return 1;
}

/* ---- client: what failed lately ----------------------------------------------- */

#define NEG_SLOTS 64
#define NEG_NS (60ull * 1000000000ull)
static struct {
	uint8_t addr[16];
	uint16_t port;
	uint64_t until;
} neg[NEG_SLOTS];
static pthread_mutex_t neg_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t neg_once = PTHREAD_ONCE_INIT;

/* A fork while another thread held the lock: the child's is made anew,
 * and what it remembers starts empty (the entry may be half written). */
static void neg_child(void)
{
	pthread_mutex_init(&neg_lock, NULL);
	memset(neg, 0, sizeof neg);
}
static void neg_init(void) { pthread_atfork(NULL, NULL, neg_child); }

static unsigned neg_slot(const uint8_t a[16], uint16_t port)
{
	uint32_t h = port;
	for (int i = 0; i < 16; i++)
		h = h * 31 + a[i];
	return h % NEG_SLOTS;
}

static bool neg_find(const uint8_t a[16], uint16_t port)
{
	pthread_once(&neg_once, neg_init);
	pthread_mutex_lock(&neg_lock);
	unsigned i = neg_slot(a, port);
	bool hit = neg[i].until > sdp_now_ns() && neg[i].port == port &&
		   !memcmp(neg[i].addr, a, 16);
	pthread_mutex_unlock(&neg_lock);
	return hit;
}

static void neg_add(const uint8_t a[16], uint16_t port)
{
	pthread_once(&neg_once, neg_init);
	pthread_mutex_lock(&neg_lock);
	unsigned i = neg_slot(a, port);
	memcpy(neg[i].addr, a, 16);
	neg[i].port = port;
	neg[i].until = sdp_now_ns() + NEG_NS;
	pthread_mutex_unlock(&neg_lock);
}

/* Connect to the rendezvous of dst (port + offset) within ofi_hello_ms:
 * the socket, or -1 (refused, unreachable, or silent). */
static int rv_connect(const struct sockaddr *dst, socklen_t len)
{
	union sdp_addr a;
	memcpy(&a, dst, len < sizeof a ? len : sizeof a);
	uint16_t port = ntohs(a.sa.sa_family == AF_INET ? a.in.sin_port : a.in6.sin6_port);
	if (a.sa.sa_family == AF_INET)
		a.in.sin_port = htons(net_port(port));
	else
		a.in6.sin6_port = htons(net_port(port));
	int s = sys_socket(a.sa.sa_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	int one = 1;
	sys_setsockopt(s, SOL_TCP, TCP_NODELAY, &one, sizeof one);
	if (sys_connect(s, &a, len) < 0 && errno != EINPROGRESS) {
		sdp_why("no network rendezvous at the destination (%s): its server "
			"does not run libsdp, or does not offer SDP", strerror(errno));
		sys_close(s);
		return -1;
	}
	struct pollfd p = { .fd = s, .events = POLLOUT };
	int r;
	do
		r = sys_poll(&p, 1, (int)sdp_tun.ofi_hello_ms);
	while (r < 0 && errno == EINTR);
	int err = 0;
	socklen_t el = sizeof err;
	if (r <= 0 || sys_getsockopt(s, SOL_SOCKET, SO_ERROR, &err, &el) < 0 || err) {
		sdp_why("no network rendezvous at the destination (%s): its server "
			"does not run libsdp, or does not offer SDP",
			r == 0 ? "no answer in time" : strerror(err ? err : errno));
		sys_close(s);
		return -1;
	}
	return sys_fd_keep(s, -1);
}

/* Wait (at most ofi_hello_ms) until the server's kernel acknowledged all
 * we sent on s. */
static bool acked(int s, const char **why)
{
	uint64_t end = sdp_now_ns() + (uint64_t)sdp_tun.ofi_hello_ms * 1000000ull;
	for (unsigned i = 0;; i++) {
		struct tcp_info ti;
		socklen_t tl = sizeof ti;
		if (sys_getsockopt(s, SOL_TCP, TCP_INFO, &ti, &tl) < 0 ||
		    ti.tcpi_state != TCP_ESTABLISHED) {
			*why = "the server closed its network rendezvous before it "
			       "acknowledged the hello";
			return false;
		}
		int q = 0;
		if (ti.tcpi_unacked == 0 && syscall(SYS_ioctl, s, SIOCOUTQ, &q) == 0 && q == 0)
			return true;
		if (sdp_now_ns() > end)
			return false;
		if (i < 64) {
			sched_yield();
		} else {
			struct timespec nap = { 0, 50000 };
			nanosleep(&nap, NULL);
		}
	}
}

static int key_bytes(const struct sockaddr *sa, socklen_t len, uint8_t a[16],
		     uint16_t *port)
{
	memset(a, 0, 16);
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *in = (const void *)sa;
		memcpy(a, &in->sin_addr, 4);
		*port = in->sin_port;
		return AF_INET;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct sockaddr_in6 *in6 = (const void *)sa;
		*port = in6->sin6_port;
		if (IN6_IS_ADDR_V4MAPPED(&in6->sin6_addr)) {
			memcpy(a, &in6->sin6_addr.s6_addr[12], 4);
			return AF_INET;
		}
		memcpy(a, &in6->sin6_addr, 16);
		return AF_INET6;
	}
	return 0;
}

/* The client's side: as sdp_hello_connect (hello.c) for one host, with
 * the network rendezvous. */
struct sdp_conn *sdp_net_connect(int fd, const struct sockaddr *dst, socklen_t len,
				 const struct fab_ops *ops, struct sdp_connect_state *cs)
{
	uint8_t da[16];
	uint16_t dport;
	int fam = key_bytes(dst, len, da, &dport);
	if (!fam) {
		sdp_why("the destination is not an IP address");
		return NULL;
	}
	if (neg_find(da, dport)) {
		sdp_why("no network rendezvous at the destination a moment ago");
		return NULL;
	}
	int s = rv_connect(dst, len);
	if (s < 0) {
		neg_add(da, dport);
		return NULL;
	}
	/* The server runs the library: now the provider's library (loaded
	 * once per process; its "maybe" before becomes final). */
	if (!ops->reaches(NULL, 0) || !ops->reaches(dst, len)) {
		sdp_why("no fabric of this host reaches the destination");
		sys_close(s);
		return NULL;
	}
	const char *why = "cannot name the local address";
	struct sdp_conn *c = NULL;
	union sdp_addr la;
	socklen_t ll = sizeof la;
	uint8_t lka[16];
	uint16_t lport = 0;
	static const uint8_t zero[16];
	/* The 4-tuple before the SYN: the deferred connect of hello.c. */
	if (sys_getsockname(fd, &la, &ll) < 0 || !key_bytes(&la.sa, ll, lka, &lport))
		goto fail;
	if (lport == 0 || !memcmp(lka, zero, 16)) {
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
			goto fail;
		cs->deferred = true;
		why = "cannot name the local address";
		ll = sizeof la;
		if (sys_getsockname(fd, &la, &ll) < 0 || !key_bytes(&la.sa, ll, lka, &lport) ||
		    lport == 0 || !memcmp(lka, zero, 16))
			goto fail;
	}
	why = "out of connection slots or memory";
	struct sdp_hello h = {
		.magic = SDP_HELLO_MAGIC,
		.version = SDP_PROTO_VERSION,
		.family = (uint16_t)fam,
		.dst_port = dport,
		.src_port = lport,
		.pid = (int32_t)sdp_pid,
		.time_ns = sdp_now_ns(),
		.fabric = ops->id,
	};
	memcpy(h.dst_addr, da, sizeof h.dst_addr);
	memcpy(h.src_addr, lka, sizeof h.src_addr);
	static _Atomic uint64_t seq;
	h.token = (h.time_ns * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)sdp_pid << 40) ^
		  atomic_fetch_add(&seq, 1);
	c = sdp_conn_alloc();
	if (!c)
		goto fail;
	atomic_store(&c->zcopy_thresh, sdp_zcopy_default());
	struct fab_setup su = { .nslots = sdp_tun.nslots, .slot_size = sdp_tun.slot_size,
				.geometry_default = !sdp_tun.geometry_given,
				.token = h.token, .pid = (int32_t)sdp_pid, .peer_pid = 0,
				.local = &la.sa, .local_len = ll, .remote = dst,
				.remote_len = len, .chan = s };
	struct fab_offer o = { .nfds = 0 };
	why = "the fabric could not set up an endpoint";
	if (ops->offer(&c->ep, &su, &o) < 0) {
		sdp_conn_free(c);
		c = NULL;
		goto fail;
	}
	s = -1;                               /* the provider's now */
	if (o.len > FAB_OFFER_MAX || o.nfds) {
		why = "the provider's offer does not fit the hello";
		goto undo;
	}
	h.offer_len = (uint16_t)o.len;
	memcpy(h.offer, o.data, o.len);
	why = "the hello could not be sent";
	int chan = su.chan;
	if (sys_send(chan, &h, sizeof h, MSG_NOSIGNAL | MSG_DONTWAIT) != (ssize_t)sizeof h)
		goto undo;
	why = "the server's kernel did not acknowledge the hello in time";
	if (!acked(chan, &why))
		goto undo;
	fab_label_default(&c->ep);
	c->token = h.token;
	c->peer_pid = 0;                      /* another host: no process to name */
	c->role = SDP_ROLE_CLIENT;
	c->transport = 1;
	c->local = la;
	memcpy(&c->remote, dst, len < sizeof c->remote ? len : sizeof c->remote);
	zc_attach(c, fd);
	atomic_store(&c->state, SDP_ST_CONNECTING);
	return c;
undo:
	/* Nothing the server will serve: it sees no hello, or a hello for a
	 * 4-tuple that never connects (it ages out), and our SYN goes out
	 * plain. */
	ops->connected(&c->ep, -EIO);
	ops->detach(&c->ep);
	sdp_conn_free(c);
	c = NULL;
fail:
	sdp_why("%s", why);
	if (s >= 0)
		sys_close(s);
	return NULL;
}
