/*
 * A peer that breaks the protocol aborts its connection, never the process.
 *
 * Under SDP both ends of a connection map one shared region (a sealed
 * memfd, "/memfd:sdp-conn"): a header page holding one control block per
 * side, then per side a ring of receive buffers that side writes into. A
 * peer process can write anything there. Each case below makes a fresh
 * connected pair in a forked child, finds the region in /proc/self/maps
 * (both ends live in this process, so the memfd is mapped twice), and plays
 * a malicious peer by writing into the peer's half. Then:
 *
 *   - the victim's next call (recv, poll, epoll_wait or send, blocking)
 *     returns promptly and reports the fault: ECONNRESET / EPIPE / EOF, or
 *     POLLERR / POLLHUP / POLLIN;
 *   - from then on the connection is aborted in both directions: recv never
 *     returns a byte no valid message carried and never EAGAIN (ECONNRESET
 *     or EOF), poll shows POLLHUP or POLLERR, send fails EPIPE / ECONNRESET;
 *   - closing both ends is harmless, the child exits normally (not by a
 *     signal; a hang is cut by a watchdog and reported with its step), and
 *     a second SDP connection of the same process, never touched, still
 *     carries data byte-exactly in both directions.
 *
 * A call is excused from noticing a fault only where TCP would be too:
 * a send may still succeed while the fault lies only in what the peer sent
 * us (TCP accepts bytes until it has processed an incoming reset), and a
 * receive may return bytes of valid messages queued before the fault. Then
 * the call that does look (recv for the incoming direction, send for the
 * outgoing one) must report it.
 *
 * Zero copy adds messages that name memory (SrcAvail, RdmaWrCompl and
 * ModeChange in the ring, SinkAvail in the control block). Besides the
 * malformed ones above, two cases use a separate attacker process: its
 * SrcAvail or SinkAvail names the victim's own process, which must never
 * make the victim read or write its own memory on the peer's behalf.
 *
 * The reference case "reset" is a real abortive close by the peer (SO_LINGER
 * 0). It runs on kernel TCP as well, which shows that the expectations are
 * TCP's. The other cases exist only under SDP.
 *
 * T_CASE=name runs only the cases of that name (for debugging).
 */
#include "testlib.h"
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/epoll.h>
#include <sys/time.h>

/* The wire formats as the library defines them: messages and control
 * words, and the shm provider's region layout (what a peer could write). */
#include "sdp/proto.h"
#include "fabric/shm_layout.h"

/* ---- one case --------------------------------------------------------- */

enum dir { DIR_IN, DIR_OUT, DIR_BOTH };   /* where the fault lies, seen by the victim */
enum probe { P_RECV, P_POLL, P_EPOLL, P_SEND, NPROBES };
static const char *const probe_name[NPROBES] = { "recv", "poll", "epoll_wait",
						 "send" };

struct ctx {
	char *base;                   /* the region, through one of its mappings */
	size_t len;
	struct shm_hdr *h;
	uint32_t n, sz;               /* receive buffers per side, bytes each */
	int v, a;                     /* victim side, attacking side */
	int vfd, pfd;                 /* the victim's socket, the peer's */
};

struct scenario {
	const char *name;
	enum dir dir;
	const char *prefix;           /* valid bytes queued before the fault */
	bool tcp_too;                 /* meaningful on kernel TCP */
	void (*attack)(struct ctx *x);
};

static const char *g_scen = "-", *g_probe = "-", *g_step = "set-up";
static unsigned g_wd_ms;

static void step(const char *s) { g_step = s; }

static void on_hang(int sig)
{
	char msg[512];
	int n = snprintf(msg, sizeof msg,
			 "HANG: case %s, first call %s: still in \"%s\" after "
			 "%u ms (last check started at %s:%d)\n", g_scen, g_probe,
			 g_step, g_wd_ms, tl_last_file, tl_last_line);
	(void)sig;
	if (write(2, msg, (size_t)n) < 0) { /* nothing else to do */ }
	_exit(3);
}

static void child_watchdog(unsigned ms)
{
	g_wd_ms = ms;
	signal(SIGALRM, on_hang);
	struct itimerval it = { .it_value = { ms / 1000, (long)(ms % 1000) * 1000 } };
	SYS(setitimer(ITIMER_REAL, &it, NULL));
}

static char *ring_of(struct ctx *x, int side)
{
	return x->base + SHM_HDR_SIZE + (size_t)side * x->n * x->sz;
}

/* ---- finding the region ----------------------------------------------- */

struct map { unsigned long start, end, off, ino; };
#define MAXMAPS 64

static int conn_maps(struct map *m)
{
	FILE *f = fopen("/proc/self/maps", "re");
	CHECK(f != NULL);
	char line[600];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		if (!strstr(line, "/memfd:sdp-conn (deleted)"))
			continue;
		struct map e;
		char perms[8];
		if (sscanf(line, "%lx-%lx %7s %lx %*s %lu", &e.start, &e.end,
			   perms, &e.off, &e.ino) != 5)
			continue;
		CHECK(strcmp(perms, "rw-s") == 0, "connection memory mapped %s: %s",
		      perms, line);
		if (n < MAXMAPS)
			m[n++] = e;
	}
	fclose(f);
	return n;
}

/* The region that appeared since `before`: both of its mappings. */
static void locate(struct ctx *x, const struct map *before, int nb)
{
	struct map now[MAXMAPS], mine[4];
	int nn = conn_maps(now), k = 0;
	for (int i = 0; i < nn; i++) {
		bool old = false;
		for (int j = 0; j < nb; j++)
			old |= before[j].ino == now[i].ino;
		if (!old && k < 4)
			mine[k++] = now[i];
	}
	CHECK_EQ(k, 2);                      /* one mapping per end */
	CHECK_EQ(mine[0].ino, mine[1].ino);
	CHECK(mine[0].start != mine[1].start);
	CHECK_EQ(mine[0].off, 0);
	CHECK_EQ(mine[1].off, 0);
	CHECK_EQ(mine[0].end - mine[0].start, mine[1].end - mine[1].start);
	x->base = (char *)mine[0].start;
	x->len = mine[0].end - mine[0].start;
	x->h = (struct shm_hdr *)x->base;
	const struct shm_hdr *h2 = (const struct shm_hdr *)mine[1].start;
	CHECK_EQ(x->h->magic, SHM_MAGIC);
	CHECK(x->h->version == SHM_VERSION, "region layout version %u, this "
	      "test was built for version %u: rebuild it", x->h->version,
	      SHM_VERSION);
	CHECK_EQ(x->h->ring_off, SHM_HDR_SIZE);
	CHECK_EQ(h2->token, x->h->token);    /* the same memory twice */
	x->n = x->h->nslots;
	x->sz = x->h->slot_size;
	CHECK(x->n >= 2 && x->sz >= 256);
	CHECK(SHM_HDR_SIZE + 2 * (size_t)x->n * x->sz <= x->len);
}

/* ---- the malicious peer ----------------------------------------------- */

static struct shm_side *att(struct ctx *x) { return &x->h->side[x->a]; }
static struct shm_side *vic(struct ctx *x) { return &x->h->side[x->v]; }

/* A well-formed Data header for the next message we post. */
static struct sdp_bsdh good_hdr(struct ctx *x, size_t plen)
{
	uint64_t queued = atomic_load(&att(x)->prod) - atomic_load(&vic(x)->cons);
	struct sdp_bsdh h = {
		.mid = SDP_MID_DATA,
		.bufs = (uint16_t)x->n,
		.len = (uint32_t)(sizeof h + plen),
		.mseq = (uint32_t)(atomic_load(&vic(x)->cons) + 1 + queued),
		.mseq_ack = (uint32_t)atomic_load(&att(x)->cons),
	};
	return h;
}

/* Write a message into the victim's next receive buffer, then publish it. */
static void post(struct ctx *x, struct sdp_bsdh h, const void *pl, size_t plen)
{
	uint64_t p = atomic_load(&att(x)->prod);
	char *slot = ring_of(x, x->a) +
		     (size_t)shm_slot(x->n, atomic_load(&att(x)->win), p) * x->sz;
	memcpy(slot, &h, sizeof h);
	if (plen)
		memcpy(slot + sizeof h, pl, plen);
	atomic_store_explicit(&att(x)->prod, p + 1, memory_order_release);
}

static void post_valid(struct ctx *x, const char *s)
{
	post(x, good_hdr(x, strlen(s)), s, strlen(s));
}

static uint64_t rnd_state;
static uint64_t rnd(void)
{
	uint64_t z = (rnd_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

static void scribble(void *p, size_t len, uint64_t seed)
{
	rnd_state = seed;
	unsigned char *b = p;
	for (size_t i = 0; i < len; i += 8) {
		uint64_t r = rnd();
		memcpy(b + i, &r, len - i < 8 ? len - i : 8);
	}
}

static void atk_reset(struct ctx *x)
{
	struct linger lg = { 1, 0 };
	SYS(setsockopt(x->pfd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg));
	SYS(close(x->pfd));
	x->pfd = -1;
}

static void atk_len_big(struct ctx *x)
{
	struct sdp_bsdh h = good_hdr(x, 4);
	h.len = x->sz + 1;                  /* longer than a receive buffer */
	post(x, h, "boom", 4);
}

static void atk_len_15(struct ctx *x)
{
	struct sdp_bsdh h = good_hdr(x, 4);
	h.len = sizeof h - 1;               /* shorter than its own header */
	post(x, h, "boom", 4);
}

static void atk_len_0(struct ctx *x)
{
	struct sdp_bsdh h = good_hdr(x, 4);
	h.len = 0;
	post(x, h, "boom", 4);
}

static void atk_mseq(struct ctx *x)
{
	struct sdp_bsdh h = good_hdr(x, 4);
	h.mseq += 7;
	post(x, h, "boom", 4);
}

static void atk_mid(struct ctx *x)
{
	struct sdp_bsdh h = good_hdr(x, 4);
	h.mid = 0x42;                       /* no such message */
	post(x, h, "boom", 4);
}

static void atk_bufs(struct ctx *x)
{
	struct sdp_bsdh h = good_hdr(x, 4);
	h.bufs = (uint16_t)(x->n + 1);      /* more buffers than exist */
	post(x, h, "boom", 4);
}

static void atk_ok_then_bad(struct ctx *x)
{
	post_valid(x, "ok");
	struct sdp_bsdh h = good_hdr(x, 4);
	h.mseq -= 1;                        /* repeats the previous number */
	post(x, h, "boom", 4);
}

static void atk_prod_jump(struct ctx *x)
{
	atomic_fetch_add(&att(x)->prod, (uint64_t)x->n + 1);
}

static void atk_prod_back(struct ctx *x)
{
	atomic_store(&att(x)->prod, atomic_load(&vic(x)->cons) - 1);
}

static void atk_fin_ahead(struct ctx *x)
{
	/* FIN after messages that will never be posted */
	atomic_store(&att(x)->fin_seq, atomic_load(&att(x)->prod) + 1000);
	atomic_store(&att(x)->fin, 1);
}

static void atk_cons(struct ctx *x)
{
	/* credit return: more consumed than the victim ever posted */
	atomic_store(&att(x)->cons, atomic_load(&vic(x)->prod) + 5);
	post_valid(x, "ok");
}

static void atk_tokens(struct ctx *x)
{
	/* "I left SDP for TCP, and wrote 2^40 wake-up bytes before my data":
	 * none of them will ever come. */
	x->h->side[x->a].fb_rx_off = 0;
	atomic_store(&att(x)->fb_rx_cons, atomic_load(&att(x)->cons));
	atomic_store(&att(x)->tokens_sent, 1ull << 40);
	atomic_store(&att(x)->fb, 1);
}

static void atk_garbage_ring(struct ctx *x)
{
	scribble(ring_of(x, x->a), (size_t)x->n * x->sz, 0x5eed0001);
	atomic_fetch_add(&att(x)->prod, 1);
}

static void atk_garbage_peer(struct ctx *x)
{
	scribble(ring_of(x, x->a), (size_t)x->n * x->sz, 0x5eed0002);
	scribble(att(x), sizeof *att(x), 0x5eed0003);
}

static void atk_garbage_all(struct ctx *x)
{
	scribble(x->base, x->len, 0x5eed0004);
}

/* Zero copy: messages that name memory. */
static void post_srcavail(struct ctx *x, struct sdp_srcavail sa)
{
	struct sdp_bsdh h = good_hdr(x, sizeof sa);
	h.mid = SDP_MID_SRC_AVAIL;
	post(x, h, &sa, sizeof sa);
}

static void atk_srcavail_unmapped(struct ctx *x)
{
	/* a buffer of ours (both ends live here) that does not exist */
	post_srcavail(x, (struct sdp_srcavail){ .id = 1, .len = 64,
		.addr = 4096, .key = (int32_t)getpid() });
}

static void atk_srcavail_key0(struct ctx *x)
{
	static char buf[64];
	post_srcavail(x, (struct sdp_srcavail){ .id = 1, .len = sizeof buf,
		.addr = (uint64_t)(uintptr_t)buf, .key = 0 });
}

static void atk_srcavail_id(struct ctx *x)
{
	static char buf[64];
	post_srcavail(x, (struct sdp_srcavail){ .id = 100000, .len = sizeof buf,
		.addr = (uint64_t)(uintptr_t)buf, .key = (int32_t)getpid() });
}

static void atk_wrcompl(struct ctx *x)
{
	/* "I wrote 10 bytes into your buffer": no buffer was offered */
	struct sdp_wrcompl wc = { .id = 1, .len = 10 };
	struct sdp_bsdh h = good_hdr(x, sizeof wc);
	h.mid = SDP_MID_RDMA_WR_COMPL;
	post(x, h, &wc, sizeof wc);
}

static void atk_modechange(struct ctx *x)
{
	struct sdp_modechange mc = { .mode = 77 };
	struct sdp_bsdh h = good_hdr(x, sizeof mc);
	h.mid = SDP_MID_MODE_CHANGE;
	post(x, h, &mc, sizeof mc);
}

/* A send window the ring cannot have: more slots than it holds, or an
 * offset beyond the window (PROTOCOL.md 5.2, win). */
static void atk_win_big(struct ctx *x)
{
	atomic_store(&att(x)->win, SHM_WIN(x->n + 1, 0));
	post_valid(x, "boom");
}

static void atk_win_off(struct ctx *x)
{
	atomic_store(&att(x)->win, SHM_WIN(2, 2));
	post_valid(x, "boom");
}

static const struct scenario scenarios[] = {
	{ "reset",        DIR_BOTH, NULL, true,  atk_reset },
	{ "len>bufsize",  DIR_IN,   NULL, false, atk_len_big },
	{ "len=15",       DIR_IN,   NULL, false, atk_len_15 },
	{ "len=0",        DIR_IN,   NULL, false, atk_len_0 },
	{ "wrong-mseq",   DIR_IN,   NULL, false, atk_mseq },
	{ "unknown-mid",  DIR_IN,   NULL, false, atk_mid },
	{ "bufs>nslots",  DIR_IN,   NULL, false, atk_bufs },
	{ "ok-then-bad",  DIR_IN,   "ok", false, atk_ok_then_bad },
	{ "prod-jump",    DIR_IN,   NULL, false, atk_prod_jump },
	{ "prod-back",    DIR_IN,   NULL, false, atk_prod_back },
	{ "fin-ahead",    DIR_IN,   NULL, false, atk_fin_ahead },
	{ "cons>posted",  DIR_OUT,  "ok", false, atk_cons },
	{ "tokens-huge",  DIR_BOTH, NULL, false, atk_tokens },
	{ "garbage-ring", DIR_IN,   NULL, false, atk_garbage_ring },
	{ "garbage-peer", DIR_BOTH, NULL, false, atk_garbage_peer },
	{ "garbage-all",  DIR_BOTH, NULL, false, atk_garbage_all },
	{ "srcavail-unmapped", DIR_IN, NULL, false, atk_srcavail_unmapped },
	{ "srcavail-key0", DIR_IN,  NULL, false, atk_srcavail_key0 },
	{ "srcavail-id",  DIR_IN,   NULL, false, atk_srcavail_id },
	{ "wrcompl-unasked", DIR_IN, NULL, false, atk_wrcompl },
	{ "modechange-77", DIR_IN,  NULL, false, atk_modechange },
	{ "window>nslots", DIR_IN,  NULL, false, atk_win_big },
	{ "window-offset", DIR_IN,  NULL, false, atk_win_off },
};
#define NSCEN (int)(sizeof scenarios / sizeof scenarios[0])

/* ---- the victim ------------------------------------------------------- */

struct run {
	const struct scenario *sc;
	struct ctx x;
	size_t got;                   /* bytes of sc->prefix received */
};

static bool reset_errno(int e) { return e == ECONNRESET || e == EPIPE; }

/* recv that may only ever deliver the rest of the valid prefix. */
static ssize_t vrecv(struct run *r, int flags)
{
	char buf[4096];
	errno = 0;
	ssize_t n = recv(r->x.vfd, buf, sizeof buf, flags);
	int e = errno;
	if (n > 0) {
		size_t plen = r->sc->prefix ? strlen(r->sc->prefix) : 0;
		CHECK((size_t)n <= plen - r->got &&
		      memcmp(buf, r->sc->prefix + r->got, (size_t)n) == 0,
		      "recv returned %zd byte(s) that no valid message carried "
		      "(first 0x%02x)", n, (unsigned char)buf[0]);
		r->got += (size_t)n;
	}
	errno = e;
	return n;
}

static ssize_t vsend(struct run *r, size_t len, int flags)
{
	static char buf[1024];
	memset(buf, 'v', sizeof buf);
	errno = 0;
	return send(r->x.vfd, buf, len, flags | MSG_NOSIGNAL);
}

/* The victim's first call. Returns true if it reported the fault. */
static bool first_call(struct run *r, enum probe p)
{
	int fd = r->x.vfd;
	ssize_t n;
	switch (p) {
	case P_RECV:
		step("blocking recv");
		n = vrecv(r, 0);
		if (n > 0)
			return false;        /* valid bytes first (checked) */
		CHECK(n == 0 || reset_errno(errno),
		      "recv returned %zd: expected ECONNRESET, EPIPE or EOF", n);
		return true;
	case P_POLL: {
		step("poll for POLLIN|POLLRDHUP, 500 ms");
		struct pollfd pf = { fd, POLLIN | POLLRDHUP, 0 };
		int k = poll(&pf, 1, 500);
		CHECK(k == 1, "poll returned %d: the fault was not reported "
		      "within 500 ms", k);
		CHECK(pf.revents & (POLLERR | POLLHUP | POLLIN),
		      "poll revents 0x%x", pf.revents);
		return pf.revents & (POLLERR | POLLHUP);
	}
	case P_EPOLL: {
		step("epoll_wait for EPOLLIN|EPOLLRDHUP, 500 ms");
		int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
		struct epoll_event ev = { .events = EPOLLIN | EPOLLRDHUP };
		ev.data.u64 = 0xfeed;
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev));
		memset(&ev, 0, sizeof ev);
		int k = epoll_wait(ep, &ev, 1, 500);
		CHECK(k == 1, "epoll_wait returned %d: the fault was not "
		      "reported within 500 ms", k);
		CHECK_EQ(ev.data.u64, 0xfeed);
		CHECK(ev.events & (EPOLLERR | EPOLLHUP | EPOLLIN),
		      "epoll events 0x%x", ev.events);
		SYS(close(ep));
		return ev.events & (EPOLLERR | EPOLLHUP);
	}
	case P_SEND:
		step("blocking send of 1024 bytes");
		n = vsend(r, 1024, 0);
		if (n == 1024 && r->sc->dir == DIR_IN)
			return false;        /* the fault is only in what came in */
		CHECK(n < 0 && reset_errno(errno),
		      "send returned %zd: expected ECONNRESET or EPIPE", n);
		return true;
	default:
		return false;
	}
}

/* The call that must look at the fault reports it (non-blocking). */
static void notice(struct run *r)
{
	if (r->sc->dir == DIR_OUT) {
		step("send(MSG_DONTWAIT) after the fault");
		ssize_t n = vsend(r, 1, MSG_DONTWAIT);
		CHECK(n < 0 && reset_errno(errno),
		      "send(MSG_DONTWAIT) returned %zd: the bad credit return "
		      "went unnoticed", n);
		return;
	}
	step("recv(MSG_DONTWAIT) after the fault");
	for (int i = 0; i < 8; i++) {
		ssize_t n = vrecv(r, MSG_DONTWAIT);
		if (n > 0)
			continue;
		CHECK(n == 0 || reset_errno(errno),
		      "recv(MSG_DONTWAIT) returned %zd: the fault went "
		      "unnoticed", n);
		return;
	}
	TL_FAIL("recv keeps returning data");
}

/* Aborted, in both directions, for good. */
static void expect_dead(struct run *r)
{
	int fd = r->x.vfd;
	step("recv(MSG_DONTWAIT) on the aborted connection");
	for (int i = 0; i < 3; i++) {
		ssize_t n = vrecv(r, MSG_DONTWAIT);
		if (n > 0) {
			i--;
			continue;
		}
		CHECK(n == 0 || reset_errno(errno),
		      "recv(MSG_DONTWAIT) on the aborted connection returned "
		      "%zd: expected ECONNRESET or EOF", n);
	}
	step("poll on the aborted connection");
	struct pollfd pf = { fd, POLLIN | POLLOUT | POLLRDHUP, 0 };
	CHECK_EQ(poll(&pf, 1, 0), 1);
	CHECK(pf.revents & (POLLHUP | POLLERR),
	      "poll revents 0x%x on the aborted connection: no POLLHUP/POLLERR",
	      pf.revents);
	step("send(MSG_DONTWAIT) on the aborted connection");
	for (int i = 0; i < 2; i++) {
		ssize_t n = vsend(r, 1, MSG_DONTWAIT);
		CHECK(n < 0 && reset_errno(errno),
		      "send(MSG_DONTWAIT) on the aborted connection returned "
		      "%zd: expected EPIPE or ECONNRESET", n);
	}
}

#define B_BYTES 60000

static void run_case(int si, enum probe p)
{
	const struct scenario *sc = &scenarios[si];
	bool sdp = tl_sdp_mode();
	struct run r = { .sc = sc };
	struct ctx *x = &r.x;
	char buf[8];

	g_scen = sc->name;
	g_probe = probe_name[p];
	child_watchdog(2000);

	/* The bystander: another connection of this process. */
	step("bystander set-up");
	int b1, b2;
	tl_pair(AF_INET, &b1, &b2);
	expect_transport(b1);
	expect_transport(b2);

	step("victim set-up");
	struct map before[MAXMAPS];
	int nb = sdp ? conn_maps(before) : 0;
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	x->v = (si + (int)p) & 1;            /* victims on both sides */
	x->a = !x->v;
	x->vfd = x->v == 0 ? c : s;          /* side 0 is the connecting end */
	x->pfd = x->v == 0 ? s : c;
	if (sdp)
		locate(x, before, nb);

	/* Some honest traffic both ways first: counters are not zero. */
	step("honest traffic");
	tl_send_all(x->pfd, "abc", 3);
	tl_recv_all(x->vfd, buf, 3);
	CHECK(memcmp(buf, "abc", 3) == 0);
	tl_send_all(x->vfd, "xyz", 3);
	tl_recv_all(x->pfd, buf, 3);
	CHECK(memcmp(buf, "xyz", 3) == 0);

	step("attack");
	sc->attack(x);

	bool reported = first_call(&r, p);
	if (!reported)
		notice(&r);
	expect_dead(&r);

	step("closing the victim");
	SYS(close(x->vfd));
	if (x->pfd >= 0) {
		step("closing the peer end");
		SYS(close(x->pfd));
	}

	step("bystander traffic");
	expect_transport(b1);
	expect_transport(b2);
	tl_send_pat(b1, 0, B_BYTES, 7, 4000);
	tl_recv_pat(b2, 0, B_BYTES, 7, 65536);
	tl_send_pat(b2, 0, B_BYTES, 8, 65536);
	tl_recv_pat(b1, 0, B_BYTES, 8, 1000);
	SYS(close(b1));
	SYS(close(b2));
	_exit(0);
}

/* ---- zero copy between two processes: the peer names *our* memory ------ */

/*
 * Zero copy moves bytes by process_vm_readv/writev at an address and a
 * process id (the "key") that the peer advertises. A peer process must only
 * ever get its own memory read or written: a SrcAvail or SinkAvail naming
 * the victim's own process (or any third one) is malformed. These cases need
 * two processes: the attacker A is forked from the victim V, so it knows
 * V's addresses (the same after fork), and V changes the memory after the
 * fork so that only V's copy holds what is checked.
 */
static char canary[65536];        /* V: memory no recv of V ever offered */
static char secret[4096];         /* V: memory no send of V ever offered */

enum xkind { X_SINK, X_SRC, NXKINDS };
static const char *const xname[NXKINDS] = { "sinkavail-names-victim",
					    "srcavail-names-victim" };

static void run_xcase(enum xkind k)
{
	char b;
	g_scen = xname[k];
	g_probe = k == X_SINK ? "send" : "recv";
	child_watchdog(3000);
	memset(canary, 'C', sizeof canary);
	memset(secret, 0, sizeof secret);

	step("set-up");
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int go[2], ready[2];
	SYS(pipe(go));
	SYS(pipe(ready));
	pid_t victim = getpid();
	fflush(NULL);
	pid_t att_pid = SYS(fork());
	if (att_pid == 0) {
		g_scen = xname[k];
		g_probe = "attacker";
		child_watchdog(3000);
		SYS(close(l));
		SYS(close(go[1]));
		SYS(close(ready[0]));
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		CHECK_EQ(read(go[0], &b, 1), 1);        /* V accepted */
		struct map m[MAXMAPS];
		CHECK_EQ(conn_maps(m), 1);
		struct ctx x = { .base = (char *)m[0].start,
				 .len = m[0].end - m[0].start, .v = 1, .a = 0 };
		x.h = (struct shm_hdr *)x.base;
		CHECK_EQ(x.h->magic, SHM_MAGIC);
		CHECK_EQ(x.h->version, SHM_VERSION);
		x.n = x.h->nslots;
		x.sz = x.h->slot_size;
		if (k == X_SINK) {
			/* "Write your next bytes into my buffer": the buffer is
			 * V's canary, the process V itself (its own probe address
			 * makes the Cross Memory Attach probe agree). */
			struct sdp_zctl *mz = &att(&x)->zc, *vz = &vic(&x)->zc;
			mz->probe_addr = vz->probe_addr;
			atomic_store(&mz->pid, (int32_t)victim);
			mz->sink_addr = (uint64_t)(uintptr_t)canary;
			mz->sink_len = sizeof canary;
			mz->sink_pos = 0;
			atomic_store(&mz->sink_id, 1);
			atomic_store_explicit(&mz->sink_state, SDP_SINK_OFFERED,
					      memory_order_release);
		} else {
			/* "Read my 4 KiB at this address": V's secret, in V. */
			post_srcavail(&x, (struct sdp_srcavail){ .id = 1,
				.len = sizeof secret,
				.addr = (uint64_t)(uintptr_t)secret,
				.key = (int32_t)victim });
		}
		CHECK_EQ(write(ready[1], "a", 1), 1);
		step("waiting for the victim");
		if (read(go[0], &b, 1) < 0)             /* V is done (or gone) */
			TL_FAIL("read");
		_exit(0);
	}
	SYS(close(go[0]));
	SYS(close(ready[1]));
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	SYS(close(l));
	memset(secret, 'K', sizeof secret);          /* only V's copy */
	if (k == X_SINK) {
		int th = 65536;                          /* zero copy on */
		SYS(setsockopt(s, SOL_TCP, SDP_ZCOPY_THRESH, &th, sizeof th));
	}
	CHECK_EQ(write(go[1], "g", 1), 1);
	CHECK_EQ(read(ready[0], &b, 1), 1);

	if (k == X_SINK) {
		step("blocking send of 64 KiB, zero copy on");
		static char out[65536];
		memset(out, 'S', sizeof out);
		/* The bogus offer must be refused; the send may then wait for
		 * the peer to read a SrcAvail (Read ZCopy waits for the reader)
		 * and this peer never reads: bound it with a send timeout. */
		struct timeval tv = { 0, 300000 };
		SYS(setsockopt(s, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
		errno = 0;
		ssize_t n = send(s, out, sizeof out, MSG_NOSIGNAL);
		CHECK((n >= 0 && n <= (ssize_t)sizeof out) ||
		      (n < 0 && (reset_errno(errno) || errno == EAGAIN)),
		      "send returned %zd", n);
		size_t hit = 0;
		for (size_t i = 0; i < sizeof canary; i++)
			hit += canary[i] != 'C';
		CHECK(hit == 0, "a SinkAvail naming this process made send write "
		      "%zu bytes of its own outgoing data over its memory at %p "
		      "(send returned %zd)", hit, (void *)canary, n);
	} else {
		step("blocking recv after a SrcAvail naming this process");
		static char in[sizeof secret];
		errno = 0;
		ssize_t n = recv(s, in, sizeof in, 0);
		CHECK(n <= 0, "a SrcAvail naming this process made recv return "
		      "%zd bytes%s", n, n > 0 && memcmp(in, secret, (size_t)n) == 0 ?
		      " of this process's own memory as stream data" : "");
		CHECK(n == 0 || reset_errno(errno), "recv returned %zd", n);
	}
	CHECK_EQ(write(go[1], "z", 1), 1);
	int st;
	CHECK_EQ(waitpid(att_pid, &st, 0), att_pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "attacker status 0x%x", st);
	SYS(close(s));
	_exit(0);
}

/* Run one case in a child; returns true if it failed. */
static bool report(pid_t pid, const char *name, const char *probe, int side)
{
	int st;
	pid_t w;
	do
		w = waitpid(pid, &st, 0);
	while (w < 0 && errno == EINTR);
	CHECK_EQ(w, pid);
	const char *what = NULL;
	char sig[64];
	if (WIFSIGNALED(st)) {
		snprintf(sig, sizeof sig, "CRASH: killed by signal %d (%s)",
			 WTERMSIG(st), strsignal(WTERMSIG(st)));
		what = sig;
	} else if (WEXITSTATUS(st) == 3) {
		what = "HANG";
	} else if (WEXITSTATUS(st) != 0) {
		what = "FAIL";
	}
	if (what)
		fprintf(stderr, "  -> case %-17s first call %-10s victim side "
			"%d: %s\n", name, probe, side, what);
	return what != NULL;
}

int main(void)
{
	tl_watchdog(55);
	signal(SIGPIPE, SIG_IGN);
	bool sdp = tl_sdp_mode();
	int total = 0, failed = 0;

	const char *only = getenv("T_CASE");
	for (int si = 0; si < NSCEN; si++) {
		if (!sdp && !scenarios[si].tcp_too)
			continue;
		if (only && strcmp(only, scenarios[si].name))
			continue;
		for (int p = 0; p < NPROBES; p++) {
			fflush(NULL);
			pid_t pid = SYS(fork());
			if (pid == 0)
				run_case(si, (enum probe)p);
			total++;
			failed += report(pid, scenarios[si].name, probe_name[p],
					 (si + p) & 1);
		}
	}
	for (int k = 0; sdp && k < NXKINDS; k++) {
		if (only && strcmp(only, xname[k]))
			continue;
		fflush(NULL);
		pid_t pid = SYS(fork());
		if (pid == 0)
			run_xcase((enum xkind)k);
		total++;
		failed += report(pid, xname[k], k == X_SINK ? "send" : "recv", 1);
	}

	/* The parent, which only watched, still makes working connections. */
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	tl_send_pat(c, 0, B_BYTES, 9, 65536);
	tl_recv_pat(s, 0, B_BYTES, 9, 65536);
	SYS(close(c));
	SYS(close(s));

	if (!sdp)
		printf("kernel TCP: only the reference case (peer reset) "
		       "applies; malformed SDP messages need SDP\n");
	printf("%d of %d cases passed\n", total - failed, total);
	if (failed)
		fprintf(stderr, "%d of %d cases failed\n", failed, total);
	return failed ? 1 : 0;
}
