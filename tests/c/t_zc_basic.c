/*
 * Zero copy basics. SDP_ZCOPY_THRESH reads back as set per socket (0 turns
 * zero copy off, a negative value is EINVAL, kernel TCP refuses it with
 * ENOPROTOOPT); the environment sets the default of new sockets. Transfers
 * of threshold-1, threshold and threshold+1 bytes, odd sizes and buffers
 * misaligned by 1..63 bytes on both sides arrive byte-exact with nothing
 * written outside the receive buffer. In sdp mode the counters prove the
 * path: a send below the sender's threshold goes entirely by Buffer Copy,
 * a blocking send at or above it uses zero copy (Read or Write ZCopy),
 * nonblocking sends never use zero copy, and on both ends
 * bcopy + rzcopy + wzcopy equals the bytes moved, tx of one end equal to
 * rx of the other, path by path.
 */
#include "zclib.h"
#include <limits.h>
#include <pthread.h>

#define T 65536
#define MiB (1u << 20)
#define BIG (MiB + 13)

/* ---- one transfer ----------------------------------------------------- */

#define PAD 128
static uint8_t sbuf[BIG + 3 * PAD], rbuf[BIG + 3 * PAD];

struct job { int fd; const uint8_t *p; size_t len; int flags; int nb; };

static void *send_job(void *arg)
{
	struct job *j = arg;
	size_t done = 0;
	while (done < j->len) {
		ssize_t n = send(j->fd, j->p + done, j->len - done, j->flags);
		if (n < 0 && errno == EAGAIN && j->nb) {
			struct pollfd p = { j->fd, POLLOUT, 0 };
			CHECK(poll(&p, 1, 5000) == 1);
			continue;
		}
		CHECK(n > 0, "send of %zu bytes -> %zd", j->len - done, n);
		done += (size_t)n;
	}
	return NULL;
}

enum { ANY = 0, BCOPY, ZCOPY, RZCOPY };
#define NB 0x40000000	/* the socket is O_NONBLOCK */
#define LATE 0x20000000	/* receive only once the data is announced */

/*
 * len bytes from sbuf+soff on tx to rbuf+roff on rx (blocking recvs of
 * everything still missing), verified byte by byte, the bytes around the
 * receive area untouched. sdp: expect says which path the sender must use.
 */
static void xfer(int tx, int rx, size_t len, size_t soff, size_t roff,
		 int expect, int sflags, uint32_t seed)
{
	uint8_t *s = sbuf + PAD + soff, *r = rbuf + PAD + roff;
	tl_fill(s, len, 0, seed);
	memset(rbuf, 0xA5, sizeof rbuf);
	struct zc s0 = zc_get(tx), r0 = zc_get(rx);

	struct job j = { tx, s, len, sflags & ~(NB | LATE),
			 (sflags & (MSG_DONTWAIT | NB)) != 0 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, send_job, &j), 0);
	if (sflags & LATE) {
		/* the send is under way before we receive: Read ZCopy */
		struct pollfd p = { rx, POLLIN, 0 };
		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	size_t got = 0;
	while (got < len) {
		ssize_t n = recv(rx, r + got, len - got, 0);
		CHECK(n > 0, "recv after %zu of %zu bytes -> %zd", got, len, n);
		got += (size_t)n;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	if (tl_verify(r, len, 0, seed) >= 0)
		fprintf(stderr, "transfer of %zu bytes, offsets %zu/%zu\n",
			len, soff, roff);
	CHECK_PAT(r, len, 0, seed);
	for (uint8_t *p = rbuf; p < r; p++)
		CHECK(*p == 0xA5, "byte %td before the receive buffer written "
		      "(len %zu roff %zu)", r - p, len, roff);
	for (uint8_t *p = r + len; p < r + len + PAD; p++)
		CHECK(*p == 0xA5, "byte %td after the receive buffer written "
		      "(len %zu roff %zu)", p - (r + len), len, roff);

	if (!tl_sdp_mode())
		return;
	struct zc ds = zc_sub(zc_get(tx), s0), dr = zc_sub(zc_get(rx), r0);
	CHECK_EQ(ds.tx, len);
	CHECK_EQ(ds.rx, 0);
	CHECK_EQ(dr.rx, len);
	CHECK_EQ(dr.tx, 0);
	zc_match(ds, dr);
	if (expect == BCOPY) {
		CHECK_EQ(ds.txb, len);
		CHECK_EQ(ds.txr + ds.txw, 0);
	} else if (expect == RZCOPY) {
		CHECK(ds.txr > 0, "Read ZCopy not used for %zu bytes: bcopy "
		      "%llu wzcopy %llu", len, (unsigned long long)ds.txb,
		      (unsigned long long)ds.txw);
	} else if (expect == ZCOPY) {
		if (ds.txr + ds.txw == 0)
			fprintf(stderr, "send of %zu bytes (offsets %zu/%zu) "
				"did not use zero copy: bcopy %llu\n", len,
				soff, roff, (unsigned long long)ds.txb);
		CHECK(ds.txr + ds.txw > 0);
	}
}

/* ---- the environment default (run in a fresh process) ----------------- */

static int env_child(const char *val)
{
	int c, s, th = atoi(val);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	int v = -7;
	socklen_t len = sizeof v;
	if (!tl_sdp_mode()) {
		CHECK_ERR(getsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len),
			  ENOPROTOOPT);
		xfer(c, s, 300000, 0, 0, ANY, 0, 77);
		return 0;
	}
	SYS(getsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
	CHECK_EQ(v, th);
	SYS(getsockopt(s, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
	CHECK_EQ(v, th);
	if (th == 0) {
		/* off by default: nothing is zero copy without setsockopt */
		xfer(c, s, BIG, 0, 0, BCOPY, 0, 76);
		xfer(s, c, BIG, 0, 0, BCOPY, 0, 77);
		struct zc z = zc_get(s);
		CHECK_EQ(z.rxr + z.rxw, 0);
		z = zc_get(c);
		CHECK_EQ(z.rxr + z.rxw, 0);
		return 0;
	}
	xfer(c, s, (size_t)th - 1, 0, 0, BCOPY, 0, 77);
	xfer(c, s, (size_t)th, 0, 0, ZCOPY, 0, 78);
	xfer(s, c, 300000, 5, 3, ZCOPY, 0, 79);
	return 0;
}

/* A fresh process with SDP_ZCOPY_THRESH=val in its environment. */
static void check_env_default(const char *self, const char *val)
{
	pid_t pid = tl_fork();
	if (pid == 0) {
		setenv("SDP_ZCOPY_THRESH", val, 1);
		execl(self, self, "--env-child", val, (char *)NULL);
		TL_FAIL("exec %s", self);
	}
	tl_wait_ok(pid);
}

int main(int argc, char **argv)
{
	int c, s;
	tl_watchdog(20);
	if (argc > 2 && strcmp(argv[1], "--env-child") == 0)
		return env_child(argv[2]);

	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);

	/* --- the option itself. */
	int v = -7;
	socklen_t len = sizeof v;
	if (tl_sdp_mode()) {
		SYS(getsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
		CHECK_EQ(len, sizeof v);
		CHECK(v >= 0);
		int dflt = v;
		fprintf(stderr, "default threshold: %d\n", dflt);
		int vals[] = { 1, 4096, T, INT_MAX, 0, 12345 };
		for (unsigned i = 0; i < sizeof vals / sizeof *vals; i++)
			zc_thresh(c, vals[i]);
		int neg = -1;
		CHECK_ERR(setsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &neg,
				     sizeof neg), EINVAL);
		neg = INT_MIN;
		CHECK_ERR(setsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &neg,
				     sizeof neg), EINVAL);
		len = sizeof v;
		SYS(getsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
		CHECK_EQ(v, 12345);	/* unchanged by the refused values */
		short sh = 100;
		CHECK_ERR(setsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &sh,
				     sizeof sh), EINVAL);
		/* per socket: the peer's socket kept its own value */
		len = sizeof v;
		SYS(getsockopt(s, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
		CHECK_EQ(v, dflt);
	} else {
		zc_thresh(c, T);
		int neg = -1;
		CHECK_ERR(setsockopt(c, SOL_TCP, SDP_ZCOPY_THRESH, &neg,
				     sizeof neg), ENOPROTOOPT);
	}

	/* --- zero copy off on both ends: everything Buffer Copy. */
	zc_thresh(c, 0);
	zc_thresh(s, 0);
	xfer(c, s, BIG, 0, 0, BCOPY, 0, 1);
	xfer(s, c, BIG, 7, 9, BCOPY, 0, 2);

	/* --- around the threshold, both ends at T. */
	zc_thresh(c, T);
	zc_thresh(s, T);
	xfer(c, s, T - 1, 0, 0, BCOPY, 0, 3);
	xfer(c, s, T, 0, 0, ZCOPY, 0, 4);
	xfer(c, s, T + 1, 0, 0, ZCOPY, 0, 5);
	xfer(s, c, T - 1, 0, 0, BCOPY, 0, 6);
	xfer(s, c, T, 0, 0, ZCOPY, 0, 7);
	xfer(s, c, T + 1, 0, 0, ZCOPY, 0, 8);
	/* the receiver comes late: the sender's advertisement is read */
	xfer(c, s, T, 0, 0, RZCOPY, LATE, 60);
	xfer(c, s, T + 1, 0, 0, RZCOPY, LATE, 61);
	xfer(s, c, BIG, 0, 0, RZCOPY, LATE, 62);
	xfer(c, s, BIG, 17, 45, RZCOPY, LATE, 63);
	/* odd sizes: below T by Buffer Copy, the large one zero copy */
	size_t odd[] = { 1, 4095, 4097, BIG };
	for (unsigned i = 0; i < 4; i++)
		xfer(c, s, odd[i], 0, 0, odd[i] < T ? BCOPY : ZCOPY, 0,
		     10 + i);

	/* --- threshold 1: every blocking send is zero copy, odd sizes too. */
	zc_thresh(c, 1);
	zc_thresh(s, 1);
	for (unsigned i = 0; i < 4; i++) {
		xfer(c, s, odd[i], 0, 0, ZCOPY, 0, 20 + i);
		xfer(s, c, odd[i], 3, 61, ZCOPY, 0, 30 + i);
		xfer(c, s, odd[i], 62, 1, RZCOPY, LATE, 70 + i);
	}

	/* --- per socket: off on the sender only / on the receiver only. */
	zc_thresh(c, 0);
	zc_thresh(s, T);
	xfer(c, s, BIG, 0, 0, BCOPY, 0, 40);	/* c never zero copies */
	struct zc z0 = zc_get(c);
	xfer(s, c, BIG, 0, 0, ZCOPY, 0, 41);	/* s still does */
	/* c (threshold 0) never offers its buffer for Write ZCopy */
	CHECK_EQ(zc_sub(zc_get(c), z0).rxw, 0);

	/* --- nonblocking sends never use zero copy. */
	zc_thresh(c, T);
	zc_thresh(s, T);
	xfer(c, s, BIG, 0, 0, BCOPY, MSG_DONTWAIT, 50);
	int fl = SYS(fcntl(c, F_GETFL));
	SYS(fcntl(c, F_SETFL, fl | O_NONBLOCK));
	xfer(c, s, BIG, 1, 2, BCOPY, NB, 51);
	SYS(fcntl(c, F_SETFL, fl));
	xfer(c, s, BIG, 1, 2, ZCOPY, 0, 52);	/* blocking again */

	/* --- misaligned buffers, offsets 1..63 on both sides. */
	zc_thresh(c, 4096);
	zc_thresh(s, 4096);
	size_t sizes[] = { 4096, 4097, 65537, 200003, BIG };
	for (size_t off = 1; off < 64; off++) {
		size_t n = sizes[off % 5];
		if (off % 3 == 0)
			xfer(c, s, n, off, 64 - off, RZCOPY, LATE,
			     100 + (uint32_t)off);
		else if (off & 1)
			xfer(c, s, n, off, 64 - off, ZCOPY, 0,
			     100 + (uint32_t)off);
		else
			xfer(s, c, n, off, (off * 29) % 63 + 1, ZCOPY, 0,
			     100 + (uint32_t)off);
	}
	/* and below the threshold, misaligned, by Buffer Copy */
	for (size_t off = 1; off < 64; off += 7)
		xfer(c, s, 4095 - off, off, 64 - off, BCOPY, 0,
		     200 + (uint32_t)off);

	/* --- the totals add up on both ends. */
	if (tl_sdp_mode()) {
		struct zc zcl = zc_get(c), zs = zc_get(s);
		zc_match(zcl, zs);
		zc_match(zs, zcl);
		fprintf(stderr, "c->s: bcopy %llu rzcopy %llu wzcopy %llu; "
			"s->c: bcopy %llu rzcopy %llu wzcopy %llu\n",
			(unsigned long long)zcl.txb, (unsigned long long)zcl.txr,
			(unsigned long long)zcl.txw, (unsigned long long)zs.txb,
			(unsigned long long)zs.txr, (unsigned long long)zs.txw);
		CHECK(zcl.txr + zcl.txw > 0);
		CHECK(zs.txr + zs.txw > 0);
	}
	SYS(close(c));
	SYS(close(s));

	check_env_default("/proc/self/exe", "8192");
	check_env_default("/proc/self/exe", "0");
	return 0;
}
