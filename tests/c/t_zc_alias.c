/*
 * t_zc_alias: zero copy between buffers at the same offset in their pages
 * (as two large malloc'd buffers are) and at different offsets, in both
 * directions of the zero-copy handshake (Read ZCopy: the receive starts
 * late; Write ZCopy: the receive waits first), contents verified byte by
 * byte with the bytes around the receive area untouched.
 *
 * Where Cross Memory Attach is slow between page-aliased buffers, the
 * library bounces those transfers (src/sdp/zcopy.c zc_rdma); the run with
 * SDP_CALIB_FAKE in tests/c/test_host_choice.py simulates such a host and
 * sets T_ZC_ALIAS_EXPECT=bounce: aliased transfers must then show in the
 * zc_bounced counter, shifted ones not. Without it the counter may be
 * anything this host's calibration decided.
 */
#include <pthread.h>

#include "zclib.h"

#define LEN ((1u << 20) + 4096 + 7)
#define PAD 256

struct job { int fd; const uint8_t *p; size_t len; };

static void *send_job(void *arg)
{
	struct job *j = arg;
	size_t done = 0;
	while (done < j->len) {
		ssize_t n = send(j->fd, j->p + done, j->len - done, 0);
		CHECK(n > 0, "send -> %zd", n);
		done += (size_t)n;
	}
	return NULL;
}

static uint64_t bounced(int a, int b)
{
	struct sdp_sock_stats x, y;
	if (!tl_stats(a, &x) || !tl_stats(b, &y))
		return 0;
	return x.zc_bounced + y.zc_bounced;
}

/* len bytes from page offset soff to page offset roff, tx -> rx. */
static void xfer(int tx, int rx, uint8_t *sp, uint8_t *rp, size_t soff, size_t roff,
		 int late, uint32_t seed)
{
	uint8_t *s = sp + soff, *r = rp + roff;
	tl_fill(s, LEN, 0, seed);
	memset(rp, 0xA5, roff + LEN + PAD);
	struct job j = { tx, s, LEN };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, send_job, &j), 0);
	if (late) {
		struct pollfd p = { rx, POLLIN, 0 };
		CHECK_EQ(poll(&p, 1, 5000), 1);
	}
	size_t got = 0;
	while (got < LEN) {
		ssize_t n = recv(rx, r + got, LEN - got, 0);
		CHECK(n > 0, "recv after %zu -> %zd", got, n);
		got += (size_t)n;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_PAT(r, LEN, 0, seed);
	for (uint8_t *p = rp; p < r; p++)
		CHECK(*p == 0xA5, "byte before the receive area written");
	for (uint8_t *p = r + LEN; p < r + LEN + PAD; p++)
		CHECK(*p == 0xA5, "byte after the receive area written");
}

int main(void)
{
	tl_watchdog(60);
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	zc_thresh(c, 65536);
	zc_thresh(s, 65536);
	/* aligned_alloc wants a multiple of the alignment (ASan insists). */
	size_t alen = (LEN + 8192 + 4095) & ~(size_t)4095;
	uint8_t *sp = aligned_alloc(4096, alen), *rp = aligned_alloc(4096, alen);
	CHECK(sp && rp);
	const char *ex = getenv("T_ZC_ALIAS_EXPECT");
	bool expect_bounce = ex && !strcmp(ex, "bounce") && tl_sdp_mode();
	uint32_t seed = 1;
	for (int late = 0; late < 2; late++) {
		/* aliased: same offset (16, as malloc places large buffers) */
		uint64_t b0 = bounced(c, s);
		xfer(c, s, sp, rp, 16, 16, late, seed++);
		xfer(s, c, sp, rp, 100, 100 + 64, late, seed++);
		uint64_t b1 = bounced(c, s);
		/* 2 KiB apart */
		xfer(c, s, sp, rp, 16, 2064, late, seed++);
		xfer(s, c, sp, rp, 3000, 900, late, seed++);
		uint64_t b2 = bounced(c, s);
		if (expect_bounce) {
			CHECK(b1 > b0, "aliased transfers were not bounced (late %d)", late);
			CHECK_EQ(b2, b1);
		}
		if (tl_sdp_mode())
			fprintf(stderr, "late %d: bounced %llu aliased, %llu shifted\n", late,
				(unsigned long long)(b1 - b0), (unsigned long long)(b2 - b1));
	}
	if (tl_sdp_mode()) {
		struct zc z = zc_get(c);
		CHECK(z.txr + z.txw > 0, "zero copy was not used");
	}
	free(sp);
	free(rp);
	SYS(close(c));
	SYS(close(s));
	return 0;
}
