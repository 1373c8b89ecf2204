/*
 * Zero copy mixed with Buffer Copy. Small (below the threshold) and large
 * sends interleaved in both directions at once keep their order; one
 * MSG_WAITALL receive spans Buffer Copy and zero-copy data; MSG_PEEK of an
 * announced zero-copy send returns the bytes without consuming or counting
 * them and the next recv returns the same bytes; receives smaller than the
 * advertisement (at and below the threshold) and readv into several
 * iovecs take it piece by piece; a receiver blocked in recv with nothing
 * queued gets the sender's bytes by Write ZCopy; a large blocking send
 * queued behind a stream filled with small nonblocking sends (until
 * EAGAIN) waits for the reader and keeps its place. All byte-exact; in sdp
 * mode the counters say which path ran and add up on both ends.
 */
#include "zclib.h"
#include <pthread.h>

#define T 65536
#define MiB (1u << 20)

static void zc_print(const char *what, struct zc d)
{
	if (tl_sdp_mode())
		fprintf(stderr, "%-28s tx %9llu (b %9llu r %9llu w %9llu)  "
			"rx %9llu (b %9llu r %9llu w %9llu)\n", what,
			(unsigned long long)d.tx, (unsigned long long)d.txb,
			(unsigned long long)d.txr, (unsigned long long)d.txw,
			(unsigned long long)d.rx, (unsigned long long)d.rxb,
			(unsigned long long)d.rxr, (unsigned long long)d.rxw);
}

static void zpair(int *c, int *s, int th)
{
	tl_pair(AF_INET, c, s);
	expect_transport(*c);
	expect_transport(*s);
	zc_thresh(*c, th);
	zc_thresh(*s, th);
}

/* ---- pattern send of a list of sizes in one thread ---------------------- */

struct plan {
	int fd;
	uint32_t seed;
	int n;
	size_t sizes[64];
	int shut;		/* shutdown(SHUT_WR) when done */
	uint64_t small, large;	/* bytes sent below / at or above T */
};

static void send_exact(int fd, const uint8_t *p, size_t len)
{
	/* one call: a blocking send returns only when all is sent */
	ssize_t n = send(fd, p, len, 0);
	CHECK(n == (ssize_t)len, "send of %zu bytes returned %zd", len, n);
}

static void *plan_sender(void *arg)
{
	struct plan *pl = arg;
	uint64_t off = 0;
	for (int i = 0; i < pl->n; i++) {
		size_t len = pl->sizes[i];
		uint8_t *b = malloc(len + 64);
		CHECK(b != NULL);
		uint8_t *p = b + (i * 13) % 64;	/* alignment varies too */
		tl_fill(p, len, off, pl->seed);
		send_exact(pl->fd, p, len);
		free(b);
		off += len;
		if (len < T)
			pl->small += len;
		else
			pl->large += len;
	}
	if (pl->shut)
		SYS(shutdown(pl->fd, SHUT_WR));
	return NULL;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static uint32_t rnd(uint32_t n)
{
	rng = rng * 6364136223846793005ull + 1442695040888963407ull;
	return (uint32_t)(rng >> 33) % n;
}

/* Receives until EOF in changing recv sizes, verifying; returns bytes. */
struct drain { int fd; uint32_t seed; uint64_t got; };
static void *drainer(void *arg)
{
	struct drain *d = arg;
	static const size_t sz[] = { 1000, 100000, T, 3 * MiB, 7, MiB, T - 1,
				     250000 };
	uint8_t *buf = malloc(3 * MiB + 64);
	CHECK(buf != NULL);
	for (unsigned i = 0;; i++) {
		uint8_t *p = buf + (i * 7) % 64;
		ssize_t n = recv(d->fd, p, sz[i % 8], 0);
		CHECK(n >= 0, "recv after %llu bytes", (unsigned long long)d->got);
		if (n == 0)
			break;
		CHECK_PAT(p, (size_t)n, d->got, d->seed);
		d->got += (uint64_t)n;
	}
	free(buf);
	return NULL;
}

/* ---- A: both directions at once, small and large interleaved ----------- */

static void both_ways(void)
{
	int c, s;
	zpair(&c, &s, T);
	struct plan pc = { .fd = c, .seed = 1, .shut = 1 },
		    ps = { .fd = s, .seed = 2, .shut = 1 };
	for (int i = 0; i < 40; i++) {
		pc.sizes[i] = i % 2 ? T + rnd(3 * MiB) : 1 + rnd(T - 1);
		ps.sizes[i] = i % 3 ? 1 + rnd(T - 1) : T + rnd(2 * MiB);
	}
	pc.n = ps.n = 40;
	struct drain dc = { .fd = c, .seed = 2 }, ds = { .fd = s, .seed = 1 };
	pthread_t t1, t2, t3;
	CHECK_EQ(pthread_create(&t1, NULL, plan_sender, &pc), 0);
	CHECK_EQ(pthread_create(&t2, NULL, plan_sender, &ps), 0);
	CHECK_EQ(pthread_create(&t3, NULL, drainer, &dc), 0);
	drainer(&ds);
	CHECK_EQ(pthread_join(t1, NULL), 0);
	CHECK_EQ(pthread_join(t2, NULL), 0);
	CHECK_EQ(pthread_join(t3, NULL), 0);
	CHECK_EQ(ds.got, pc.small + pc.large);
	CHECK_EQ(dc.got, ps.small + ps.large);
	struct zc zcl = zc_get(c), zs = zc_get(s);
	zc_print("both ways c", zcl);
	zc_print("both ways s", zs);
	if (tl_sdp_mode()) {
		CHECK_EQ(zcl.tx, ds.got);
		CHECK_EQ(zs.tx, dc.got);
		zc_match(zcl, zs);
		zc_match(zs, zcl);
		/* the small sends went by Buffer Copy, the large used zero
		 * copy */
		CHECK(zcl.txb >= pc.small);
		CHECK(zs.txb >= ps.small);
		CHECK(zcl.txr + zcl.txw > 0);
		CHECK(zs.txr + zs.txw > 0);
	}
	SYS(close(c));
	SYS(close(s));
}

/* ---- B: MSG_WAITALL over Buffer Copy and zero-copy data ------------------ */

static void waitall(int late)
{
	int c, s;
	zpair(&c, &s, T);
	struct plan pl = { .fd = c, .seed = 3, .n = 5,
			   .sizes = { 1000, 200000, 500, 3 * T, 77 } };
	size_t total = 1000 + 200000 + 500 + 3 * T + 77;
	uint8_t *buf = malloc(total + 1);
	CHECK(buf != NULL);
	struct zc c0 = zc_get(c), s0 = zc_get(s);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, plan_sender, &pl), 0);
	if (late) {
		struct pollfd p = { s, POLLIN, 0 };
		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	ssize_t n = recv(s, buf + 1, total, MSG_WAITALL);
	CHECK_EQ(n, (ssize_t)total);
	CHECK_PAT(buf + 1, total, 0, 3);
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc dc = zc_sub(zc_get(c), c0), ds = zc_sub(zc_get(s), s0);
	zc_print(late ? "waitall, late receiver" : "waitall, receiver first",
		 ds);
	if (tl_sdp_mode()) {
		CHECK_EQ(ds.rx, total);
		zc_match(dc, ds);
		CHECK(ds.rxb >= 1577);
		CHECK(ds.rxr + ds.rxw > 0);
	}
	free(buf);
	SYS(close(c));
	SYS(close(s));
}

/* ---- C: MSG_PEEK of an announced zero-copy send -------------------------- */

static void peek(void)
{
	int c, s;
	enum { LEN = 300000 };
	static uint8_t a[LEN + 64], b[LEN + 64], small[100];
	zpair(&c, &s, T);
	struct plan pl = { .fd = c, .seed = 4, .n = 1, .sizes = { LEN } };
	struct zc c0 = zc_get(c), s0 = zc_get(s);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, plan_sender, &pl), 0);
	struct pollfd p = { s, POLLIN, 0 };
	CHECK_EQ(poll(&p, 1, 5000), 1);

	ssize_t n1 = recv(s, a + 3, LEN, MSG_PEEK);
	CHECK(n1 > 0 && n1 <= LEN, "peek -> %zd", n1);
	CHECK_PAT(a + 3, (size_t)n1, 0, 4);
	struct zc d = zc_sub(zc_get(s), s0);
	CHECK_EQ(d.rx, 0);		/* a peek consumes and counts nothing */
	CHECK_EQ(d.rxr + d.rxw + d.rxb, 0);
	/* again, below the threshold: the same first bytes */
	ssize_t n2 = recv(s, small, sizeof small, MSG_PEEK);
	CHECK_EQ(n2, (ssize_t)sizeof small);
	CHECK(memcmp(small, a + 3, sizeof small) == 0);
	d = zc_sub(zc_get(s), s0);
	CHECK_EQ(d.rx, 0);
	/* the real receive returns the same bytes */
	ssize_t n3 = recv(s, b + 5, (size_t)n1, 0);
	CHECK_EQ(n3, n1);
	CHECK(memcmp(a + 3, b + 5, (size_t)n1) == 0);
	d = zc_sub(zc_get(s), s0);
	if (tl_sdp_mode())
		CHECK_EQ(d.rx, (uint64_t)n1);
	/* the rest, peeked in pieces then read */
	uint64_t off = (uint64_t)n1;
	while (off < LEN) {
		ssize_t k = recv(s, a, LEN - off, MSG_PEEK);
		CHECK(k > 0);
		CHECK_PAT(a, (size_t)k, off, 4);
		ssize_t m = recv(s, b, (size_t)k, 0);
		CHECK_EQ(m, k);
		CHECK(memcmp(a, b, (size_t)k) == 0);
		off += (uint64_t)k;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc dc = zc_sub(zc_get(c), c0), ds = zc_sub(zc_get(s), s0);
	zc_print("peek", ds);
	if (tl_sdp_mode()) {
		CHECK_EQ(ds.rx, LEN);	/* not double counted */
		zc_match(dc, ds);
		CHECK(ds.rxr > 0, "the announced send was not read by Read "
		      "ZCopy");
	}
	SYS(close(c));
	SYS(close(s));
}

/* ---- D: receives smaller than the advertisement; readv ------------------ */

static void partial(size_t len, size_t piece, int late, int use_readv,
		    const char *what)
{
	int c, s;
	static uint8_t buf[4 * MiB];
	zpair(&c, &s, T);
	struct plan pl = { .fd = c, .seed = 5, .n = 1, .sizes = { len } };
	struct zc c0 = zc_get(c), s0 = zc_get(s);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, plan_sender, &pl), 0);
	if (late) {
		struct pollfd p = { s, POLLIN, 0 };
		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	uint64_t off = 0;
	while (off < len) {
		ssize_t n;
		if (use_readv) {
			/* odd pieces, the last one large */
			static const size_t parts[] = { 7, 70000, 1, 100003,
							4096, 300000, 13 };
			struct iovec iov[8];
			size_t at = 0;
			for (int i = 0; i < 7; i++) {
				iov[i].iov_base = buf + at + 1;
				iov[i].iov_len = parts[i];
				at += parts[i] + 1;	/* a gap between */
			}
			iov[7].iov_base = buf + at + 1;
			iov[7].iov_len = 2 * MiB;
			n = readv(s, iov, 8);
			CHECK(n > 0);
			size_t left = (size_t)n;
			uint64_t o = off;
			for (int i = 0; i < 8 && left; i++) {
				size_t k = left < iov[i].iov_len ? left
								 : iov[i].iov_len;
				CHECK_PAT(iov[i].iov_base, k, o, 5);
				o += k;
				left -= k;
			}
		} else {
			n = recv(s, buf + 3, piece, 0);
			CHECK(n > 0 && (size_t)n <= piece);
			CHECK_PAT(buf + 3, (size_t)n, off, 5);
		}
		off += (uint64_t)n;
	}
	CHECK_EQ(off, len);
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc dc = zc_sub(zc_get(c), c0), ds = zc_sub(zc_get(s), s0);
	zc_print(what, ds);
	if (tl_sdp_mode()) {
		CHECK_EQ(ds.rx, len);
		zc_match(dc, ds);
		CHECK(ds.rxr + ds.rxw > 0);
		if (late)
			CHECK(ds.rxr > 0, "%s: announced send not read by "
			      "Read ZCopy", what);
		if (piece < T && !use_readv) {
			/* never offered a buffer below the threshold: the
			 * advertisement was read through a bounce buffer */
			CHECK_EQ(ds.rxw, 0);
			CHECK(ds.rxr > 0);
		}
	}
	SYS(close(c));
	SYS(close(s));
}

/* ---- E: a receiver blocked with nothing queued: Write ZCopy ------------- */

struct blocked {
	int fd, ready;
	size_t len;
	int flags;
	uint8_t *buf;
	ssize_t ret;
};

static void *blocked_recv(void *arg)
{
	struct blocked *b = arg;
	CHECK_EQ(write(b->ready, "r", 1), 1);
	b->ret = recv(b->fd, b->buf, b->len, b->flags);
	return NULL;
}

static void write_zcopy(size_t rlen, int flags, int nsends, size_t slen,
			const char *what)
{
	int c, s, pp[2];
	char x;
	zpair(&c, &s, T);
	SYS(pipe(pp));
	uint8_t *rb = malloc(rlen + 64);
	CHECK(rb != NULL);
	struct zc c0 = zc_get(c), s0 = zc_get(s);
	struct blocked b = { s, pp[1], rlen, flags, rb + 1, 0 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, blocked_recv, &b), 0);
	CHECK_EQ(read(pp[0], &x, 1), 1);
	tl_idle_ms(50);			/* let it block in recv */
	/* a send of the threshold or more may wait until it is read: send
	 * from a thread */
	struct plan pl = { .fd = c, .seed = 6, .n = nsends };
	for (int i = 0; i < nsends; i++)
		pl.sizes[i] = slen;
	pthread_t ts;
	CHECK_EQ(pthread_create(&ts, NULL, plan_sender, &pl), 0);
	size_t want = slen * (size_t)nsends < rlen ? slen * (size_t)nsends
						   : rlen;
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK(b.ret > 0 && (size_t)b.ret <= want, "%s: recv -> %zd", what,
	      b.ret);
	if (flags & MSG_WAITALL)
		CHECK_EQ(b.ret, (ssize_t)want);
	CHECK_PAT(rb + 1, (size_t)b.ret, 0, 6);
	/* the rest of the sends */
	size_t total = slen * (size_t)nsends;
	tl_recv_pat(s, (uint64_t)b.ret, total - (size_t)b.ret, 6, 65536);
	CHECK_EQ(pthread_join(ts, NULL), 0);
	struct zc dc = zc_sub(zc_get(c), c0), ds = zc_sub(zc_get(s), s0);
	zc_print(what, ds);
	if (tl_sdp_mode()) {
		CHECK_EQ(ds.rx, total);
		zc_match(dc, ds);
		CHECK(ds.rxw > 0, "%s: blocked receiver not written by Write "
		      "ZCopy (b %llu r %llu)", what, (unsigned long long)ds.rxb,
		      (unsigned long long)ds.rxr);
	}
	free(rb);
	SYS(close(pp[0]));
	SYS(close(pp[1]));
	SYS(close(c));
	SYS(close(s));
}

/* ---- F: a large send behind a full stream of small ones ------------------ */

struct one { int fd; const uint8_t *p; size_t len; ssize_t ret; int err; };
static void *one_send(void *arg)
{
	struct one *o = arg;
	errno = 0;
	o->ret = send(o->fd, o->p, o->len, MSG_NOSIGNAL);
	o->err = errno;
	return NULL;
}

static void behind_full(void)
{
	int c, s;
	static uint8_t small[1000], big[MiB];
	zpair(&c, &s, T);
	/* small nonblocking sends until the stream is full */
	uint64_t queued = 0;
	for (;;) {
		tl_fill(small, sizeof small, queued, 7);
		ssize_t n = send(c, small, sizeof small, MSG_DONTWAIT);
		if (n < 0) {
			CHECK_EQ(errno, EAGAIN);
			break;
		}
		queued += (uint64_t)n;
	}
	/* then one large blocking send; the reader starts later */
	tl_fill(big, sizeof big, queued, 7);
	struct one o = { c, big, sizeof big, 0, 0 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, one_send, &o), 0);
	tl_idle_ms(50);
	tl_recv_pat(s, 0, queued + sizeof big, 7, 65536);
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK(o.ret == (ssize_t)sizeof big, "large send behind %llu queued "
	      "bytes -> %zd errno %d (%s)", (unsigned long long)queued, o.ret,
	      o.err, strerror(o.err));
	struct zc zcl = zc_get(c), zs = zc_get(s);
	zc_print("behind a full stream", zs);
	if (tl_sdp_mode()) {
		CHECK_EQ(zcl.tx, queued + sizeof big);
		zc_match(zcl, zs);
		CHECK(zcl.txr + zcl.txw > 0);
	}
	SYS(close(c));
	SYS(close(s));
}

int main(void)
{
	tl_watchdog(20);

	both_ways();
	waitall(0);
	waitall(1);
	peek();
	partial(MiB, 100000, 1, 0, "1 MiB, recv 100000, late");
	partial(MiB, 100000, 0, 0, "1 MiB, recv 100000");
	partial(MiB, 1000, 1, 0, "1 MiB, recv 1000 (bounce)");
	partial(MiB + 5, 1000, 0, 0, "1 MiB+5, recv 1000 (bounce)");
	partial(3 * MiB, 0, 1, 1, "3 MiB, readv, late");
	partial(3 * MiB, 0, 0, 1, "3 MiB, readv");
	for (int i = 0; i < 3; i++)
		write_zcopy(MiB, 0, 1, MiB, "blocked recv 1 MiB");
	write_zcopy(MiB, MSG_WAITALL, 1, MiB, "blocked waitall 1 MiB");
	write_zcopy(512 * 1024, 0, 1, MiB, "blocked recv 512K, send 1M");
	write_zcopy(MiB, MSG_WAITALL, 4, 256 * 1024,
		    "blocked waitall, 4 sends");
	behind_full();
	return 0;
}
