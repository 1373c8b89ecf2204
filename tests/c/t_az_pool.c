/*
 * Copies aside come from the process's pool (SDP_AZ_POOL) and are shared.
 *
 * shared: one buffer sent four times before the peer read any of it, then
 * given back (madvise MADV_DONTNEED) and rewritten. The four advertisements
 * hold the same bytes: they move aside as one copy (az_cow_copies 1, not
 * 4), and the receiver gets the old bytes four times, never the new ones
 * or zeros.
 *
 * full: a pool of one 256 KiB copy, two different buffers in flight, both
 * given back while the receiver does not read. The first copy fits; the
 * second waits as block-on-write does and, as the peer does not read, gets
 * a buffer of its own after the wait: both arrive intact, nothing hangs.
 *
 * Under kernel TCP the counters are not there; the bytes are checked the
 * same. Both fault policies.
 */
#include "azlib.h"

#define SZ (MiB / 4)

static void rx_shared(int s, void *arg)
{
	(void)arg;
	az_gate_wait(0);
	uint8_t *r = az_buf(SZ, 0);
	for (int k = 0; k < 4; k++)
		az_recv_round(s, r, SZ, 7);
	az_gate_pass(1);
	az_gate_wait(2);
	close(s);
}

static int shared(void)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx_shared, NULL, &pid);
	uint8_t *b = az_buf(SZ, 0);
	az_fill(b, SZ, 7);
	if (!tl_sdp_mode())
		az_gate_pass(0);                  /* TCP's sends may wait for the reads */
	for (int k = 0; k < 4; k++)
		tl_send_all(c, b, SZ);
	struct azst a0 = az_get(c);
	if (tl_sdp_mode())
		CHECK(a0.out == 4, "%llu advertisements outstanding, not 4",
		      (unsigned long long)a0.out);
	CHECK_EQ(madvise(b, SZ, MADV_DONTNEED), 0);
	if (tl_sdp_mode()) {
		struct azst a1 = az_get(c);
		CHECK(a1.cow - a0.cow == 1, "%llu copies aside for one buffer sent 4 times",
		      (unsigned long long)(a1.cow - a0.cow));
	}
	memset(b, 0x5A, SZ);                      /* the application's now */
	if (tl_sdp_mode())
		az_gate_pass(0);
	az_gate_wait(1);
	az_gate_pass(2);
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

static void rx_full(int s, void *arg)
{
	(void)arg;
	az_gate_wait(0);
	uint8_t *r = az_buf(SZ, 0);
	az_recv_round(s, r, SZ, 1);
	az_recv_round(s, r, SZ, 2);
	az_gate_pass(1);
	az_gate_wait(2);
	close(s);
}

static int full(void)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx_full, NULL, &pid);
	uint8_t *b1 = az_buf(SZ, 0), *b2 = az_buf(SZ, 0);
	az_fill(b1, SZ, 1);
	az_fill(b2, SZ, 2);
	if (!tl_sdp_mode())
		az_gate_pass(0);
	tl_send_all(c, b1, SZ);
	tl_send_all(c, b2, SZ);
	struct azst a0 = az_get(c);
	CHECK_EQ(madvise(b1, SZ, MADV_DONTNEED), 0);  /* into the pool */
	memset(b1, 0x11, SZ);
	CHECK_EQ(madvise(b2, SZ, MADV_DONTNEED), 0);  /* pool full: waits, then its own */
	memset(b2, 0x22, SZ);
	if (tl_sdp_mode()) {
		struct azst a1 = az_get(c);
		CHECK(a1.cow - a0.cow == 2, "%llu copies aside, not 2",
		      (unsigned long long)(a1.cow - a0.cow));
		az_gate_pass(0);
	}
	az_gate_wait(1);
	az_gate_pass(2);
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return !strcmp(argv[2], "shared") ? shared() : full();
	tl_watchdog(120);
	const char *names[] = { "shared", "full" };
	az_run_all(argv, names, 2, "SDP_AZ_POOL=262144");
	return 0;
}
