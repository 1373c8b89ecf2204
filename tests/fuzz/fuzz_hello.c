/*
 * fuzz_hello.c - the listener's side of connection set-up, as a client
 * (honest or not) drives it: the rendezvous records and the descriptors
 * they carry (take_hello), the choice of the hello for an accepted
 * connection (drain_queue, take_mine), and the shared-memory provider's
 * offer the hello carries (shm_ep_accept: seals, size, offset, header,
 * token, state).
 *
 * Everything is real: a TCP listener on 127.0.0.1 with its rendezvous
 * (sdp_listener_open), a memfd built from the input, a rendezvous record
 * sent with sendmsg(SCM_RIGHTS), a TCP connect, accept4, and then
 * sdp_hello_accept() exactly as the switch calls it. An accepted region is
 * then used: readiness, a non-blocking receive, a send, the last close.
 *
 * Input: a control byte, a hello record (the fields the fuzzer does not
 * choose - 4-tuple, token, the provider and its offer's shape - can be
 * filled in so that the deeper checks
 * are reached), a memfd size and the first bytes of the region header.
 * Invariants: no crash or leak; an accepted connection's geometry lies in
 * the documented ranges and inside the memfd; its token is the hello's.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/pool.h"
#include "sdp/proto.h"
#include "fabric/shm_layout.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: invariant failed: %s (errno %d)\n", \
				__FILE__, __LINE__, #c, errno); abort(); } } while (0)

static int lfd = -1;
static uint16_t lport;                 /* network order */
static struct sockaddr_un rvname;
static socklen_t rvlen;

static void setup(void)
{
	if (lfd >= 0)
		return;
	CHECK(sdp_pool_init() == 0);
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in a = { .sin_family = AF_INET };
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	socklen_t al = sizeof a;
	CHECK(lfd >= 0 && bind(lfd, (void *)&a, sizeof a) == 0 && listen(lfd, 64) == 0);
	CHECK(getsockname(lfd, (void *)&a, &al) == 0);
	lport = a.sin_port;
	memset(&rvname, 0, sizeof rvname);
	rvname.sun_family = AF_UNIX;
	int n = snprintf(rvname.sun_path + 1, sizeof rvname.sun_path - 1,
			 "sdp1.%u.2.%u.7f000001", (unsigned)geteuid(), (unsigned)ntohs(lport));
	rvlen = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

struct in {
	const uint8_t *p;
	size_t n;
};

static uint8_t u8(struct in *in)
{
	if (!in->n)
		return 0;
	in->n--;
	return *in->p++;
}

static size_t take(struct in *in, void *dst, size_t want)
{
	size_t k = want < in->n ? want : in->n;
	memcpy(dst, in->p, k);
	in->p += k;
	in->n -= k;
	return k;
}

/* A rendezvous record: len bytes with nfd descriptors (the first is memfd,
 * others are /dev/null). Returns the connected rendezvous socket or -1. */
static int send_record(const void *rec, size_t len, int memfd, int nfd)
{
	int s = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
	if (s < 0)
		return -1;
	if (connect(s, (void *)&rvname, rvlen) < 0) {
		close(s);
		return -1;
	}
	if (len == (size_t)-1)
		return s;                  /* silent: connected, says nothing */
	int fds[4];
	int k = 0;
	for (; k < nfd && k < 4; k++)
		fds[k] = k == 0 && memfd >= 0 ? memfd : open("/dev/null", O_RDONLY | O_CLOEXEC);
	union { struct cmsghdr c; char buf[CMSG_SPACE(4 * sizeof(int))]; } u;
	memset(&u, 0, sizeof u);
	struct iovec iov = { (void *)rec, len };
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (k) {
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE((size_t)k * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)k * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)k * sizeof(int));
	}
	ssize_t r = sendmsg(s, &m, MSG_NOSIGNAL);
	(void)r;
	for (int i = 0; i < k; i++)
		if (!(i == 0 && memfd >= 0))
			close(fds[i]);
	return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	struct in in = { data, size };
	uint8_t ctl = u8(&in), ctl2 = u8(&in);
	bool fill_tuple = ctl & 1, with_fd = ctl & 2, sealed = ctl & 4,
	     silent = ctl & 8, shared = ctl & 16, fill_token = ctl & 32,
	     extra_fd = ctl & 64, twice = ctl & 128;
	bool fill_hdr = ctl2 & 1, tcp_only = ctl2 & 2;
	size_t reclen = (size_t)u8(&in) % 160;
	if (ctl2 & 4)
		reclen = sizeof(struct sdp_hello);
	uint8_t rec[160] = { 0 };
	take(&in, rec, reclen);
	struct sdp_hello h;
	memcpy(&h, rec, sizeof h);
	struct shm_offer so;
	memcpy(&so, h.offer, sizeof so);
	if (fill_tuple) {
		h.magic = SDP_HELLO_MAGIC;
		h.version = SDP_PROTO_VERSION;
		h.family = AF_INET;
		memset(h.dst_addr, 0, sizeof h.dst_addr);
		memset(h.src_addr, 0, sizeof h.src_addr);
		uint32_t lo = htonl(INADDR_LOOPBACK);
		memcpy(h.dst_addr, &lo, 4);
		h.dst_port = lport;
		h.flags &= SDP_HELLO_RETURNED | 0x100;
		h.fabric = FAB_ID_SHM;
		h.nfds = 1;
		h.offer_len = sizeof so;
		h.reserved = 0;
		so.flags &= SHM_OFFER_POOLED | 0x100;
	}
	/* The region: size in pages, then header bytes at region_pg. */
	uint32_t pages = 1 + u8(&in) % 40;
	uint64_t off = (uint64_t)(so.region_pg % 4) * 4096;
	if (fill_tuple) {
		so.region_pg = (uint32_t)(off / 4096);
		memcpy(h.offer, &so, sizeof so);
	}
	_Alignas(64) uint8_t hdr[1024] = { 0 };
	size_t hn = take(&in, hdr, sizeof hdr);
	if (fill_hdr) {
		struct shm_hdr *sh = (void *)hdr;
		sh->magic = SHM_MAGIC;
		sh->version = SHM_VERSION;
		if (hn < 16) {
			sh->nslots = 2;
			sh->slot_size = 256;
		}
		hn = sizeof hdr;
	}

	int memfd = -1;
	if (with_fd) {
		memfd = (int)syscall(SYS_memfd_create, "sdp-conn", MFD_CLOEXEC | MFD_ALLOW_SEALING);
		CHECK(memfd >= 0);
		CHECK(ftruncate(memfd, (off_t)pages * 4096) == 0);
		if (off < (uint64_t)pages * 4096)
			CHECK(pwrite(memfd, hdr, hn, (off_t)off) == (ssize_t)hn);
		if (sealed)
			fcntl(memfd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW);
	}
	int cs = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	struct sockaddr_in ca = { .sin_family = AF_INET };
	/* A new loopback source address each time: millions of inputs never
	 * meet a 4-tuple still in TIME_WAIT (ours or another program's). */
	static uint32_t src;
	src = src % 0xfffffd + 1;
	ca.sin_addr.s_addr = htonl(0x7f000000u | src);
	int one = 1;
	setsockopt(cs, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	socklen_t cal = sizeof ca;
	CHECK(cs >= 0 && bind(cs, (void *)&ca, sizeof ca) == 0 &&
	      getsockname(cs, (void *)&ca, &cal) == 0);
	if (fill_tuple) {
		h.src_port = ca.sin_port;
		memcpy(h.src_addr, &ca.sin_addr, 4);
	}
	if (fill_token && memfd >= 0 && off + 24 <= (uint64_t)pages * 4096) {
		uint64_t tok;
		CHECK(pread(memfd, &tok, 8, (off_t)off + 16) == 8);
		h.token = tok;
	}
	memcpy(rec, &h, sizeof h);

	struct sdp_listener *l = NULL;
	CHECK(sdp_listener_open(lfd, true, FAB_PREF_ANY, &l) == 0 && l);
	if (shared)
		sdp_listener_fork(l, 1);
	int rs[3] = { -1, -1, -1 };
	if (!tcp_only) {
		if (silent)
			rs[2] = send_record(NULL, (size_t)-1, -1, 0);
		int nfd = with_fd ? 1 : 0;
		if (extra_fd)
			nfd += 1 + ctl2 % 3;
		rs[0] = send_record(rec, reclen, memfd, nfd);
		if (twice)
			rs[1] = send_record(rec, reclen, memfd, nfd);
	}
	/* libFuzzer's SIGALRM (-timeout) may interrupt the connect: it then
	 * goes on in the background. */
	struct sockaddr_in la = { .sin_family = AF_INET, .sin_port = lport,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	if (connect(cs, (void *)&la, sizeof la) < 0) {
		CHECK(errno == EINTR);
		struct pollfd p = { .fd = cs, .events = POLLOUT };
		int e = 0;
		socklen_t el = sizeof e;
		while (poll(&p, 1, -1) < 0)
			CHECK(errno == EINTR);
		CHECK(getsockopt(cs, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0);
	}
	int nfd;
	while ((nfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC)) < 0)
		CHECK(errno == EINTR);
	int refuse = 0;
	const char *why = NULL;
	struct sdp_conn *c = sdp_hello_accept(l, nfd, NULL, 0, &refuse, &why);
	if (c) {
		CHECK(refuse == 0);
		CHECK(memfd >= 0);
		struct fab_ep *ep = &c->ep;
		CHECK(ep->nslots >= 2 && ep->nslots <= 4096);
		CHECK(ep->slot_size >= 256 && ep->slot_size <= (1u << 22) &&
		      ep->slot_size % 64 == 0);
		CHECK(off + region_size(ep->nslots, ep->slot_size) <= (uint64_t)pages * 4096);
		CHECK(ep->ops == &fab_shm_ops);
		CHECK(c->token == h.token && H(ep)->token == h.token);
		CHECK(atomic_load(&H(ep)->state) == SHM_ST_ATTACHED);
		/* Use it: the rings lie where the header says. */
		atomic_store(&c->nonblock, 1);
		(void)sdp_events(c);
		char buf[300];
		struct iovec v = { buf, sizeof buf };
		ssize_t r = sdp_recv(c, nfd, &v, 1, MSG_DONTWAIT);
		CHECK(r <= (ssize_t)sizeof buf);
		memset(buf, 'x', sizeof buf);
		r = sdp_send(c, nfd, &v, 1, MSG_DONTWAIT);
		CHECK(r <= (ssize_t)sizeof buf);
		(void)sdp_fionread(c);
		sdp_release(c, nfd);
	} else {
		/* refused (reset by the switch), kept TCP, or internal (> 0) */
		CHECK(refuse <= 0 || refuse == 1);
	}
	if (shared)
		sdp_listener_fork(l, -1);
	sdp_listener_close(l);
	for (int i = 0; i < 3; i++)
		if (rs[i] >= 0)
			close(rs[i]);
	/* A reset leaves no TIME_WAIT behind: ports are reused at once. */
	struct linger lg = { 1, 0 };
	setsockopt(cs, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
	close(cs);
	close(nfd);
	if (memfd >= 0)
		close(memfd);
	return 0;
}
