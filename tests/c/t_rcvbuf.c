/*
 * Connection memory follows the traffic: 64 connections stream random
 * amounts both ways (their send windows grow), go idle in epoll_wait (each
 * direction that carried data shrinks back and gives its ring's pages
 * back: the trims are counted), then stream again (the windows grow
 * again). Every byte is checked (FNV-1a of each direction's stream, and
 * its length). Under SDP: ring_window_max reached SDP_NSLOTS on each
 * direction that streamed, every such direction was trimmed while idle
 * (waiting in epoll_wait until the counters say so, bounded by the
 * watchdog) and its window is back at its start (SDP_RING_START, 4).
 * A connection of 64-byte requests and answers keeps a window of 4.
 * Zero copy is off for this program (test_c_features.py): the bytes must
 * go through the rings.
 */
#include "testlib.h"
#include <sys/epoll.h>

#define NCONN 64

struct dir {
	int from, to;
	size_t total, sent, got;
	uint64_t hs, hr;               /* FNV-1a of what was sent / received */
	uint64_t seed;
};

static uint64_t rng = 0x1234567;
static uint64_t rnd(void)
{
	rng ^= rng << 13;
	rng ^= rng >> 7;
	rng ^= rng << 17;
	return rng;
}

static uint64_t fnv(uint64_t h, const unsigned char *p, size_t n)
{
	for (size_t i = 0; i < n; i++)
		h = (h ^ p[i]) * 0x100000001b3ull;
	return h;
}

static unsigned char src[256 << 10], dst[256 << 10];

/* Pump every direction until each has carried its total. */
static void stream(struct dir *d, int nd)
{
	for (int i = 0; i < nd; i++) {
		d[i].sent = d[i].got = 0;
		d[i].hs = d[i].hr = 0xcbf29ce484222325ull;
	}
	/* First each sender alone, as far as the peer's buffers take it
	 * (a peer that does not read yet gets the whole ring: the window
	 * grows while it fills), then both ends in turn. */
	for (int i = 0; i < nd; i++)
		while (d[i].sent < d[i].total) {
			size_t n = d[i].total - d[i].sent;
			size_t off = (d[i].seed + d[i].sent) % 4096;
			if (n > sizeof src - off)
				n = sizeof src - off;
			ssize_t r = send(d[i].from, src + off, n, MSG_DONTWAIT);
			if (r < 0) {
				CHECK(errno == EAGAIN, "send: %s", strerror(errno));
				break;
			}
			d[i].hs = fnv(d[i].hs, src + off, (size_t)r);
			d[i].sent += (size_t)r;
		}
	for (;;) {
		bool progress = false, done = true;
		for (int i = 0; i < nd; i++) {
			struct dir *x = &d[i];
			if (x->sent < x->total) {
				size_t n = 1 + rnd() % (sizeof src);
				if (n > x->total - x->sent)
					n = x->total - x->sent;
				size_t off = (x->seed + x->sent) % 4096;
				ssize_t r = send(x->from, src + off, n < sizeof src - off ? n : sizeof src - off,
						 MSG_DONTWAIT);
				if (r > 0) {
					x->hs = fnv(x->hs, src + off, (size_t)r);
					x->sent += (size_t)r;
					progress = true;
				} else {
					CHECK(r < 0 && errno == EAGAIN, "send: %s", strerror(errno));
				}
			}
			if (x->got < x->total) {
				ssize_t r = recv(x->to, dst, sizeof dst, MSG_DONTWAIT);
				if (r > 0) {
					x->hr = fnv(x->hr, dst, (size_t)r);
					x->got += (size_t)r;
					progress = true;
				} else {
					CHECK(r < 0 && errno == EAGAIN, "recv: %s",
					      r == 0 ? "EOF" : strerror(errno));
				}
			}
			if (x->got < x->total)
				done = false;
		}
		if (done)
			break;
		if (!progress) {              /* wait for any end to move */
			struct pollfd p[2 * NCONN * 2];
			int np = 0;
			for (int i = 0; i < nd; i++) {
				if (d[i].sent < d[i].total)
					p[np++] = (struct pollfd){ d[i].from, POLLOUT, 0 };
				if (d[i].got < d[i].total)
					p[np++] = (struct pollfd){ d[i].to, POLLIN, 0 };
			}
			SYS(poll(p, (nfds_t)np, 1000));
		}
	}
	for (int i = 0; i < nd; i++) {
		CHECK_EQ(d[i].got, d[i].total);
		CHECK(d[i].hs == d[i].hr, "direction %d: bytes differ", i);
	}
}

static void plan(struct dir *d, int nd)
{
	for (int i = 0; i < nd; i++) {
		/* most directions stream (>= 1 MiB), some carry a little */
		d[i].total = (i % 4 == 3) ? 1 + rnd() % 4096 : (1u << 20) + rnd() % (1u << 20);
		d[i].seed = rnd();
	}
}

int main(void)
{
	uint16_t port;
	struct dir d[2 * NCONN];
	int a[NCONN], b[NCONN];

	tl_watchdog(60);
	for (size_t i = 0; i < sizeof src; i++)
		src[i] = (unsigned char)rnd();
	int l = tl_listen(AF_INET, &port);
	for (int i = 0; i < NCONN; i++) {
		a[i] = tl_connect(AF_INET, port);
		b[i] = SYS(accept(l, NULL, NULL));
		expect_transport(a[i]);
		expect_transport(b[i]);
		d[2 * i] = (struct dir){ .from = a[i], .to = b[i] };
		d[2 * i + 1] = (struct dir){ .from = b[i], .to = a[i] };
	}
	/* Small messages back and forth (a request, an answer) never run
	 * out of a window of 4: the connection stays small. */
	struct sdp_sock_stats st;
	{
		int p = tl_connect(AF_INET, port), q = SYS(accept(l, NULL, NULL));
		char m[64];
		for (int k = 0; k < 2000; k++) {
			memset(m, k, sizeof m);
			tl_send_all(p, m, sizeof m);
			tl_recv_all(q, m, sizeof m);
			CHECK((unsigned char)m[63] == (unsigned char)k, "request %d", k);
			tl_send_all(q, m, sizeof m);
			tl_recv_all(p, m, sizeof m);
		}
		if (tl_stats(p, &st)) {
			CHECK_EQ(st.ring_window_max, 4);
			tl_stats(q, &st);
			CHECK_EQ(st.ring_window_max, 4);
		}
		SYS(close(p));
		SYS(close(q));
	}

	plan(d, 2 * NCONN);
	stream(d, 2 * NCONN);

	bool sdp = tl_stats(a[0], &st);
	uint32_t nslots = 64;
	if (sdp)
		for (int i = 0; i < 2 * NCONN; i++) {
			tl_stats(d[i].from, &st);
			if (d[i].total >= (1u << 20))
				CHECK(st.ring_window_max == nslots,
				      "direction %d streamed %zu bytes: window only grew to %u",
				      i, d[i].total, st.ring_window_max);
		}

	/* Idle: all ends wait in epoll_wait; the library's looks trim. */
	int ep = SYS(epoll_create1(0));
	for (int i = 0; i < NCONN; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, a[i], &ev));
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, b[i], &ev));
	}
	int waits = 0;
	bool all = !sdp;
	for (; !all && waits < 40; waits++) {   /* at most 20 s */
		struct epoll_event ev[8];
		CHECK_EQ(epoll_wait(ep, ev, 8, 500), 0);
		all = true;
		for (int i = 0; i < 2 * NCONN && all; i++) {
			tl_stats(d[i].from, &st);
			all = st.trims >= 1 && st.ring_window == 4;
		}
	}
	CHECK(all, "idle for %d waits of 500 ms: not every direction was trimmed "
	      "back to a window of 4", waits);
	if (sdp) {
		uint64_t trims = 0, bytes = 0;
		for (int i = 0; i < 2 * NCONN; i++) {
			tl_stats(d[i].from, &st);
			trims += st.trims;
			bytes += st.trimmed_bytes;
		}
		fprintf(stderr, "idle: %d waits of 500 ms, %llu trims gave back %llu bytes\n",
			waits, (unsigned long long)trims, (unsigned long long)bytes);
		CHECK(bytes >= (uint64_t)NCONN * (1u << 20), "too little given back");
	}

	/* Busy again: the windows grow again, the bytes stay exact. */
	plan(d, 2 * NCONN);
	stream(d, 2 * NCONN);
	if (sdp)
		for (int i = 0; i < 2 * NCONN; i++) {
			tl_stats(d[i].from, &st);
			if (d[i].total >= (1u << 20))
				CHECK(st.ring_window == nslots,
				      "direction %d: window %u after streaming again",
				      i, st.ring_window);
		}
	for (int i = 0; i < NCONN; i++) {
		SYS(close(a[i]));
		SYS(close(b[i]));
	}
	SYS(close(ep));
	SYS(close(l));
	return 0;
}
