/*
 * Connection churn touches few connection slots: 3,000 connections one
 * after the other (connect, accept, a byte each way, close both) in one
 * process. Each takes a slot of the library's per-process connection pool
 * (a shared memfd of 16,384 slots, so that `sdp stat` and forked children
 * see them); a slot freed is taken again by the next connection, so the
 * pool's resident memory stays a few pages. Taking each connection the
 * next slot round the pool instead made every new slot a first touch (a
 * page fault) and, after this many connections, 3 MiB of the pool
 * resident for two connections open at a time.
 *
 * Under kernel TCP there is no pool: the program checks the bytes only.
 */
#include "testlib.h"

#define ROUNDS 3000

/* Resident KiB of the mapping of the library's pool (0: none mapped). */
static long pool_rss_kib(void)
{
	FILE *f = fopen("/proc/self/smaps", "r");
	CHECK(f != NULL, "open /proc/self/smaps");
	char line[512];
	bool in = false;
	long rss = 0;
	while (fgets(line, sizeof line, f)) {
		long v;
		if (strchr(line, '-') && strstr(line, " /memfd:")) {
			in = strstr(line, "/memfd:sdp-pool") != NULL;
			continue;
		}
		if (in && sscanf(line, "Rss: %ld kB", &v) == 1) {
			rss += v;
			in = false;
		}
	}
	fclose(f);
	return rss;
}

int main(void)
{
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	long before = -1;
	for (int i = 0; i < ROUNDS; i++) {
		int c = tl_connect(AF_INET, port);
		int s = SYS(accept(l, NULL, NULL));
		if (i == 0 || i == ROUNDS - 1) {
			expect_transport(c);
			expect_transport(s);
		}
		unsigned char b = (unsigned char)i, r = 0;
		tl_send_all(c, &b, 1);
		tl_recv_all(s, &r, 1);
		CHECK_EQ(r, b);
		b = (unsigned char)~b;
		tl_send_all(s, &b, 1);
		tl_recv_all(c, &r, 1);
		CHECK_EQ(r, b);
		SYS(close(c));
		SYS(close(s));
		if (i == 99)
			before = pool_rss_kib();
	}
	long after = pool_rss_kib();
	printf("pool resident: %ld KiB after 100 connections, %ld KiB after %d\n",
	       before, after, ROUNDS);
	if (tl_sdp_mode()) {
		CHECK(after > 0, "no connection pool mapped under SDP");
		/* the header and process table, and a few slots (504 B each) */
		CHECK(after <= 64, "the pool holds %ld KiB after %d connections "
		      "(two open at a time): churn walks the slots", after, ROUNDS);
	} else {
		CHECK_EQ(after, 0);
	}
	SYS(close(l));
	return 0;
}
