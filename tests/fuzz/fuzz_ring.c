/*
 * fuzz_ring.c - one established SDP connection whose other end is the
 * fuzzer: everything the peer controls in the shared region (its control
 * block with the zero-copy control words, the messages in its ring: BSDH
 * plus the Data, DisConn, AbortConn, SrcAvail, RdmaWrCompl and ModeChange
 * payloads, its wake-up tokens on the socket, the sink_state word it may
 * move in ours) against the engine's real entry points: sdp_recv (with
 * MSG_PEEK / MSG_WAITALL, split buffers), sdp_send, sdp_events,
 * sdp_fionread, sdp_on_wakeup, sdp_shutdown, sdp_fallback, sdp_release.
 *
 * The region is mapped in this process with a PROT_NONE page right after
 * its end; the connection is attached as side 0 or 1, the fuzzer plays
 * the other side. Every call is non-blocking (MSG_DONTWAIT, O_NONBLOCK
 * semantics), except one receive per input that may block for at most
 * 1 ms (SO_RCVTIMEO); the "TCP socket" is one end of a socketpair whose
 * other end the fuzzer reads and writes.
 *
 * Input: a geometry byte, options, then operations (one byte each plus
 * their arguments). While the fuzzer behaves as an honest peer, a model
 * knows the exact stream: the engine must deliver exactly those bytes, in
 * order, report FIONREAD exactly, never report a reset or EOF the peer did
 * not cause, post exactly the bytes it was given, and hand exactly the
 * unconsumed bytes to TCP at a fallback, after exactly the wake-up tokens
 * it announced. Once the fuzzer corrupts anything, only the invariants
 * that hold against any peer are checked: no crash, no out-of-bounds
 * access, nothing delivered beyond the buffer, our consumer counter never
 * ahead of anything the peer ever published, no call that does not return.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/proto.h"
#include "fabric/shm_layout.h"

#define CHECK(c) do { if (!(c)) { fprintf(stderr, "%s:%d: invariant failed: %s\n", \
				__FILE__, __LINE__, #c); abort(); } } while (0)

#define STREAM_MAX (1u << 20)
#define MSG_MAX    (1u << 16)

static int wfd = -1, pfd = -1;        /* our "TCP socket", the peer's end */
static uint8_t srcbuf[65536];         /* what honest SrcAvails advertise */

static void setup(void)
{
	static bool done;
	if (done)
		return;
	done = true;
	CHECK(sdp_pool_init() == 0);
	sdp_fb_stall_ms = 20;               /* a fuzzed peer never finishes leaving */
	for (size_t i = 0; i < sizeof srcbuf; i++)
		srcbuf[i] = (uint8_t)(i * 131 + (i >> 8) * 7 + 1);
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

static uint16_t u16(struct in *in) { return (uint16_t)(u8(in) | u8(in) << 8); }
static uint32_t u32(struct in *in) { return u16(in) | (uint32_t)u16(in) << 16; }
static uint64_t u64(struct in *in) { return u32(in) | (uint64_t)u32(in) << 32; }

/* The fuzzer's view of the connection. */
struct model {
	struct sdp_conn *c;
	struct fab_ep *ep;
	struct shm_side *P, *M;            /* peer's block, ours */
	uint32_t pmseq;                    /* last mseq the peer posted */
	uint32_t psrc_id;                  /* last SrcAvail id the peer posted */
	bool honest;                       /* nothing corrupted so far */
	bool fin_posted, abort_posted, stray, blocked_once, fell_back;
	bool keys_refused;                 /* our SrcAvails' key is refused */
	uint64_t pprod_max;                /* highest peer prod ever visible */
	uint64_t cons_last;                /* our cons, to see it only grows */
	/* peer -> us: the bytes the engine must deliver, in order */
	uint8_t *expect;
	size_t exp_len, exp_pos;
	/* us -> peer: what we sent, where each of our messages starts */
	uint8_t *sent;
	size_t sent_len;
	uint64_t *msg_start;
	uint64_t our_seq_seen;             /* our messages checked so far */
	uint32_t our_mseq;
	uint64_t tokens_read;              /* our tokens the peer read off pfd */
};

static char *peer_slot(struct model *m, uint64_t seq)
{
	uint32_t k = shm_slot(m->ep->nslots, atomic_load(&m->P->win), seq);
	return ring(m->ep, !m->ep->side) + (size_t)k * m->ep->slot_size;
}

static uint32_t peer_credits(struct model *m)
{
	uint64_t p = atomic_load(&m->P->prod), c = atomic_load(&m->M->cons);
	return p - c >= m->ep->nslots ? 0 : (uint32_t)(m->ep->nslots - (p - c));
}

/* The peer posts one message into its ring (as tx.c would). */
static bool peer_post(struct model *m, uint8_t mid, const void *pl, uint32_t plen)
{
	if (!peer_credits(m) || plen + sizeof(struct sdp_bsdh) > m->ep->slot_size)
		return false;
	uint64_t p = atomic_load(&m->P->prod);
	char *s = peer_slot(m, p);
	struct sdp_bsdh h = { .mid = mid, .bufs = (uint16_t)m->ep->nslots,
			      .len = (uint32_t)sizeof h + plen, .mseq = ++m->pmseq,
			      .mseq_ack = (uint32_t)atomic_load(&m->P->cons) };
	memcpy(s, &h, sizeof h);
	if (plen)
		memcpy(s + sizeof h, pl, plen);
	atomic_store_explicit(&m->P->prod, p + 1, memory_order_release);
	return true;
}

static void expect_add(struct model *m, const void *b, size_t n)
{
	if (m->exp_len + n > STREAM_MAX) {
		m->honest = false;
		return;
	}
	memcpy(m->expect + m->exp_len, b, n);
	m->exp_len += n;
}

/* Read what arrived on the peer's end of the socket: while nothing was
 * handed back to TCP, only our wake-up tokens, never more than we
 * announced (they are counted before they are written). */
static void peer_read_tokens(struct model *m)
{
	uint8_t b[4096];
	for (;;) {
		ssize_t r = recv(pfd, b, sizeof b, MSG_DONTWAIT);
		if (r <= 0)
			break;
		for (ssize_t i = 0; i < r; i++)
			CHECK(b[i] == SHM_TOKEN_BYTE);
		m->tokens_read += (uint64_t)r;
	}
	CHECK(m->tokens_read <= (atomic_load(&m->M->tokens_sent) & ~TOKENS_FROZEN));
}

/* Check the messages we posted since the last look: well formed, in
 * sequence, and carrying exactly the bytes we were given. */
static size_t check_our_msgs(struct model *m, const uint8_t *src, size_t srclen)
{
	uint64_t prod = atomic_load(&m->M->prod);
	size_t got = 0;
	CHECK(prod >= m->our_seq_seen);
	for (uint64_t s = m->our_seq_seen; s < prod; s++) {
		uint32_t k = shm_slot(m->ep->nslots, atomic_load(&m->M->win), s);
		const char *msg = ring(m->ep, m->ep->side) + (size_t)k * m->ep->slot_size;
		struct sdp_bsdh h;
		memcpy(&h, msg, sizeof h);
		CHECK(h.len >= sizeof h && h.len <= m->ep->slot_size);
		CHECK(h.mseq == ++m->our_mseq);
		CHECK(h.bufs <= m->ep->nslots);
		CHECK(h.mid == SDP_MID_DATA || h.mid == SDP_MID_DISCONN || h.mid == SDP_MID_ABORT);
		if (s < MSG_MAX)
			m->msg_start[s] = m->sent_len;
		if (h.mid == SDP_MID_DATA) {
			size_t n = h.len - sizeof h;
			CHECK(got + n <= srclen);
			CHECK(!memcmp(msg + sizeof h, src + got, n));
			if (m->sent_len + n <= STREAM_MAX) {
				memcpy(m->sent + m->sent_len, msg + sizeof h, n);
				m->sent_len += n;
			}
			got += n;
		} else {
			CHECK(h.len == sizeof h);
		}
	}
	m->our_seq_seen = prod;
	return got;
}

static void check_counters(struct model *m)
{
	uint64_t pp = atomic_load(&m->P->prod);
	if (pp > m->pprod_max)
		m->pprod_max = pp;
	uint64_t mc = atomic_load(&m->M->cons);
	CHECK(mc >= m->cons_last);          /* consumed never goes back */
	CHECK(mc <= m->pprod_max);          /* nothing consumed that was not posted */
	m->cons_last = mc;
}

static void do_recv(struct model *m, struct in *in, bool blocking)
{
	size_t len = 1 + u16(in) % 3000;
	uint8_t fl = u8(in);
	int flags = (fl & 1 ? MSG_PEEK : 0) | (fl & 2 ? MSG_WAITALL : 0);
	if (!blocking)
		flags |= MSG_DONTWAIT;
	static uint8_t buf[4096];
	memset(buf, 0xA5, sizeof buf);
	struct iovec v[3];
	int n = 1 + (fl >> 2) % 3;
	size_t cut1 = n > 1 ? (fl >> 4) % (len + 1) : len;
	size_t cut2 = n > 2 ? cut1 + (len - cut1) / 2 : len;
	v[0] = (struct iovec){ buf, cut1 };
	v[1] = (struct iovec){ buf + cut1, cut2 - cut1 };
	v[2] = (struct iovec){ buf + cut2, len - cut2 };
	if (n == 1)
		v[0].iov_len = len;
	ssize_t r = sdp_recv(m->c, wfd, v, n, flags);
	CHECK(r <= (ssize_t)len);
	CHECK(r >= 0 || r == -EAGAIN || r == -ECONNRESET || r == -EPIPE ||
	      r == -SDP_EFALLBACK || r == -EINTR);
	for (size_t i = r > 0 ? (size_t)r : 0; i < len; i++)
		CHECK(buf[i] == 0xA5);          /* nothing written beyond the count */
	if (!m->honest)
		return;
	size_t avail = m->exp_len - m->exp_pos;
	if (r > 0) {
		CHECK((size_t)r <= avail);
		CHECK(!memcmp(buf, m->expect + m->exp_pos, (size_t)r));
		if (!(flags & MSG_PEEK))
			m->exp_pos += (size_t)r;
	} else if (r == 0) {
		/* EOF: only after everything, and only if someone ended it */
		CHECK(avail == 0);
		CHECK(m->fin_posted || m->abort_posted || atomic_load(&m->c->rx_shut) ||
		      atomic_load(&m->c->peer_gone));
	} else if (r == -EAGAIN) {
		CHECK(avail == 0 || m->c->rcvlowat > 1);
	} else if (r == -ECONNRESET || r == -EPIPE) {
		CHECK(m->abort_posted || atomic_load(&m->c->peer_gone) == 2);
	}
}

static void do_send(struct model *m, struct in *in)
{
	size_t len = u16(in) % 5000;
	static uint8_t buf[5000];
	static uint32_t ctr;
	for (size_t i = 0; i < len; i++)
		buf[i] = (uint8_t)(ctr++ * 2654435761u >> 24);
	struct iovec v = { buf, len };
	bool closed = atomic_load(&m->P->closed) || atomic_load(&m->c->peer_gone) ||
		      atomic_load(&m->P->rd_shut);
	ssize_t r = sdp_send(m->c, wfd, &v, 1, MSG_DONTWAIT);
	CHECK(r <= (ssize_t)len);
	size_t posted = check_our_msgs(m, buf, len);
	if (r >= 0) {
		/* What send reports is what it posted, unless the peer has
		 * closed (TCP too takes those bytes, then answers RST). */
		CHECK(posted == (size_t)r || (posted == 0 && (closed || !m->honest)));
	} else {
		CHECK(posted == 0);
		CHECK(r == -EAGAIN || r == -EPIPE || r == -ECONNRESET ||
		      r == -SDP_EFALLBACK);
		if (m->honest && r != -EAGAIN && r != -SDP_EFALLBACK)
			CHECK(m->abort_posted || closed || atomic_load(&m->c->tx_shut));
	}
}

/* The peer consumes k of our messages (honestly: it reads them first). */
static void peer_consume(struct model *m, uint32_t k)
{
	uint64_t c = atomic_load(&m->P->cons), p = atomic_load(&m->M->prod);
	while (k-- && c < p)
		c++;
	atomic_store_explicit(&m->P->cons, c, memory_order_release);
}

static void do_fallback(struct model *m)
{
	struct shm_side *P = m->P;
	uint64_t due = (atomic_load(&P->tokens_sent) & ~TOKENS_FROZEN) -
		       atomic_load(&m->M->tokens_rcvd);
	if ((int64_t)due < 0 || due > 65536)
		return;
	peer_read_tokens(m);
	atomic_fetch_or(&P->tokens_sent, TOKENS_FROZEN);
	if (m->honest) {
		atomic_store(&P->fb_rx_cons, atomic_load(&P->cons));
		P->fb_rx_off = 0;
	}
	atomic_store(&P->fb, SHM_FB_FINAL);
	static const uint8_t tok[4096] = { [0 ... 4095] = SHM_TOKEN_BYTE };
	for (uint64_t left = due; left; ) {
		size_t k = left < sizeof tok ? left : sizeof tok;
		ssize_t w = send(pfd, tok, k, MSG_NOSIGNAL);
		/* Our side shut for reading (shutdown(SHUT_RDWR) shuts the
		 * socket's reading too): on this AF_UNIX stand-in the peer's
		 * writes fail, where TCP would still take them. */
		if (w < 0 && errno == EPIPE)
			break;
		CHECK(w == (ssize_t)k);
		left -= k;
	}
	uint64_t cons = atomic_load(&P->fb_rx_cons);
	int r = sdp_fallback(m->c, wfd);
	int subst = sdp_fallback_subst_take(m->c);
	if (subst >= 0)
		close(subst);
	m->fell_back = true;
	CHECK(atomic_load(&m->c->fb_done));
	/* What reached TCP: our remaining tokens, then the unconsumed bytes. */
	static uint8_t got[STREAM_MAX + 65536];
	size_t n = 0;
	for (;;) {
		ssize_t k = recv(pfd, got + n, sizeof got - n, MSG_DONTWAIT);
		if (k <= 0)
			break;
		n += (size_t)k;
	}
	if (!m->honest || r != 0)
		return;
	uint64_t ours = (atomic_load(&m->M->tokens_sent) & ~TOKENS_FROZEN) - m->tokens_read;
	CHECK(n >= ours);
	for (uint64_t i = 0; i < ours; i++)
		CHECK(got[i] == SHM_TOKEN_BYTE);
	CHECK(atomic_load(&m->M->tokens_rcvd) ==
	      (atomic_load(&P->tokens_sent) & ~TOKENS_FROZEN));
	if (cons >= MSG_MAX || m->sent_len == STREAM_MAX)
		return;
	size_t from = cons < atomic_load(&m->M->prod) ? m->msg_start[cons] : m->sent_len;
	CHECK(n - ours == m->sent_len - from);
	CHECK(!memcmp(got + ours, m->sent + from, m->sent_len - from));
}

static void run(struct model *m, struct in *in)
{
	struct fab_ep *ep = m->ep;
	for (int ops = 0; in->n && ops < 400 && !m->fell_back; ops++) {
		uint8_t op = u8(in);
		switch (op % 16) {
		case 0: {                       /* Data, honest */
			uint8_t pl[4096];
			uint32_t n = u16(in) % (ep->slot_size - 15);
			for (uint32_t i = 0; i < n; i++)
				pl[i] = u8(in);
			if (!m->fin_posted && !m->abort_posted && peer_post(m, SDP_MID_DATA, pl, n))
				expect_add(m, pl, n);
			break;
		}
		case 1: {                       /* SrcAvail, honest: our srcbuf */
			struct sdp_srcavail sa = { .id = m->psrc_id + 1,
						   .key = (int32_t)getpid() };
			uint16_t o = u16(in), l = u16(in);
			sa.len = 1 + l % 8192;
			o %= (uint16_t)(sizeof srcbuf - sa.len);
			sa.addr = (uint64_t)(uintptr_t)(srcbuf + o);
			if (!m->fin_posted && !m->abort_posted &&
			    peer_post(m, SDP_MID_SRC_AVAIL, &sa, sizeof sa)) {
				m->psrc_id++;
				expect_add(m, srcbuf + o, sa.len);
				/* refused: the sink waits for the source to
				 * revoke it, which this peer never does */
				if (m->keys_refused)
					m->honest = false;
			}
			break;
		}
		case 2: {                       /* ModeChange */
			struct sdp_modechange mc = { u8(in) % 4 };
			if (mc.mode > SDP_MODE_PIPELINED)
				m->honest = false;
			if (!m->fin_posted && !m->abort_posted)
				peer_post(m, SDP_MID_MODE_CHANGE, &mc, sizeof mc);
			break;
		}
		case 3:                         /* DisConn: FIN (as close.c) */
			if (m->fin_posted || m->abort_posted)
				break;
			atomic_store(&m->P->fin_seq, atomic_load(&m->P->prod));
			atomic_store(&m->P->fin, 1);
			peer_post(m, SDP_MID_DISCONN, NULL, 0);
			m->fin_posted = true;
			break;
		case 4:                         /* AbortConn: RST */
			atomic_store(&m->P->abort, 1);
			peer_post(m, SDP_MID_ABORT, NULL, 0);
			m->abort_posted = true;
			break;
		case 5: {                       /* any message, any header */
			uint8_t raw[4096];
			uint32_t n = u16(in) % (ep->slot_size + 1);
			for (uint32_t i = 0; i < n; i++)
				raw[i] = u8(in);
			uint8_t how = u8(in);
			if (how & 1) {          /* a valid header around it */
				struct sdp_bsdh h = { .mid = raw[0], .len = (uint32_t)n,
						      .mseq = m->pmseq + 1 };
				if (n >= sizeof h)
					memcpy(raw, &h, sizeof h);
			}
			uint64_t p = atomic_load(&m->P->prod);
			memcpy(peer_slot(m, p + (how >> 1) % 3), raw, n);
			if (how & 8) {
				m->pmseq++;
				atomic_store(&m->P->prod, p + 1);
			}
			m->honest = false;
			break;
		}
		case 6: {                       /* poke the peer's control block */
			uint16_t off = u16(in) % sizeof(struct shm_side);
			uint8_t w = u8(in) % 3;
			uint64_t v = u64(in);
			char *b = (char *)m->P;
			if (w == 0)
				b[off] = (char)v;
			else if (w == 1)
				memcpy(b + (off & ~3u), &v, 4);
			else
				memcpy(b + (off & ~7u), &v, 8);
			m->honest = false;
			break;
		}
		case 7:                         /* the peer moves our sink_state */
			atomic_store(&m->M->zc.sink_state, u8(in) % 5);
			m->honest = false;
			break;
		case 8:
		case 9:
			do_recv(m, in, false);
			break;
		case 10:
			do_send(m, in);
			break;
		case 11:                        /* the peer consumes our messages */
			peer_consume(m, u8(in) % 9);
			break;
		case 12: {                      /* readiness, FIONREAD */
			unsigned ev = sdp_events(m->c);
			CHECK(!(ev & ~(unsigned)(POLLIN | POLLRDNORM | POLLOUT | POLLWRNORM |
						 POLLERR | POLLHUP | POLLRDHUP)));
			int fr = sdp_fionread(m->c);
			CHECK(fr >= 0);
			if (m->honest && !m->abort_posted)
				CHECK((size_t)fr == m->exp_len - m->exp_pos);
			break;
		}
		case 13: {                      /* wake-up tokens, announced or stray */
			uint8_t k = u8(in) % 8, stray = u8(in) & 1;
			static const uint8_t tok[8] = { [0 ... 7] = SHM_TOKEN_BYTE };
			if (k && !stray)
				atomic_fetch_add(&m->P->tokens_sent, k);
			ssize_t sr = k ? send(pfd, tok, k, MSG_NOSIGNAL) : 0;
			/* Our end shut for reading refuses them (EPIPE: a
			 * socketpair does, TCP would not): the peer's write
			 * failed, and a library peer takes its count back. */
			CHECK(sr == k || (sr < 0 && errno == EPIPE));
			if (sr < 0 && !stray)
				atomic_fetch_sub(&m->P->tokens_sent, k);
			if (stray && sr > 0) {
				m->stray = true;   /* resets the connection */
				m->honest = false;
			}
			sdp_on_wakeup(m->c, wfd);
			break;
		}
		case 14: {                      /* arm, shut down, or fall back */
			uint8_t what = u8(in);
			if (what < 128) {
				atomic_fetch_or(&m->P->armed, what & 7);
			} else if (what < 192) {
				int how = what % 3;
				int r = sdp_shutdown(m->c, wfd, how);
				CHECK(r == 0 || r == -ENOTCONN);
				check_our_msgs(m, NULL, 0);
			} else {
				do_fallback(m);
			}
			break;
		}
		case 15:                        /* one receive that may sleep 1 ms */
			if (m->blocked_once || m->stray)
				break;
			int q = 0;
			if (ioctl(wfd, FIONREAD, &q) < 0 || q != 0)
				break;
			m->blocked_once = true;
			atomic_store(&m->c->nonblock, 0);
			do_recv(m, in, true);
			atomic_store(&m->c->nonblock, 1);
			break;
		}
		peer_read_tokens(m);
		check_counters(m);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	setup();
	struct in in = { data, size };
	uint8_t g = u8(&in), o = u8(&in);
	uint32_t nslots = 2 + g % 7;
	uint32_t slot_size = 256 + 64 * ((g >> 3) % 13);
	uint32_t side = o & 1;
	size_t rlen = region_size(nslots, slot_size);
	size_t maplen = (rlen + 4095) & ~(size_t)4095;
	char *map = mmap(NULL, maplen + 4096, PROT_READ | PROT_WRITE,
			 MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(map != MAP_FAILED);
	CHECK(mprotect(map + maplen, 4096, PROT_NONE) == 0);   /* guard */
	char *base = map + maplen - rlen;                      /* ends at the guard */

	struct shm_hdr *H = (void *)base;
	H->magic = SHM_MAGIC;
	H->version = SHM_VERSION;
	H->nslots = nslots;
	H->slot_size = slot_size;
	H->token = 42;
	H->ring_off = SHM_HDR_SIZE;
	atomic_store(&H->state, SHM_ST_ATTACHED);

	struct sdp_conn *c = sdp_conn_alloc();
	CHECK(c);
	c->ep = (struct fab_ep){ .ops = &fab_shm_ops, .base = base, .len = rlen,
				 .side = side, .nslots = nslots, .slot_size = slot_size };
	/* The peer process as the kernel told us: ourselves, so that honest
	 * SrcAvails (key = our pid) are read from srcbuf by Cross Memory
	 * Attach; with o & 2 a pid that holds nothing (every key refused). */
	c->peer_pid = o & 2 ? 1 : (int32_t)getpid();
	c->token = H->token;
	c->role = side ? SDP_ROLE_SERVER : SDP_ROLE_CLIENT;
	c->transport = 1;
	static const uint32_t th[4] = { 0, 64, 2048, 1u << 20 };
	atomic_store(&c->zcopy_thresh, th[(o >> 2) & 3]);
	atomic_store(&c->spin_us, 0);
	atomic_store(&c->spin_cur, 0);
	atomic_store(&c->nonblock, 1);
	atomic_store(&c->rcvlowat, o & 16 ? 1 + (o >> 5) * 100 : 1);
	atomic_store(&c->rcvtimeo_us, 1000);
	int sv[2];                          /* a fallback shuts it down: new each time */
	CHECK(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) == 0);
	wfd = sv[0];
	pfd = sv[1];
	CHECK(fcntl(pfd, F_SETFL, O_NONBLOCK) == 0);
	struct timeval tv = { 0, 1000 };
	setsockopt(wfd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
	zc_attach(c, -1);
	atomic_store(&c->state, SDP_ST_ESTABLISHED);

	static uint8_t expect[STREAM_MAX], sent[STREAM_MAX];
	static uint64_t msg_start[MSG_MAX];
	struct model m = { .c = c, .ep = &c->ep, .P = &H->side[!side], .M = &H->side[side],
			   .honest = true, .expect = expect, .sent = sent,
			   .msg_start = msg_start, .keys_refused = (o & 2) != 0 };
	atomic_store(&m.P->pid, (int32_t)getpid());
	run(&m, &in);

	if (m.fell_back) {                  /* as the switch does (fdtab.c) */
		sdp_release_tcp(c);
	} else {
		sdp_release(c, wfd);
	}
	munmap(map, maplen + 4096);
	close(wfd);
	close(pfd);
	return 0;
}
