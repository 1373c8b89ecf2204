/*
 * The AZ threshold (SDP_AZCOPY_THRESH=auto, the default): measured once per
 * host (src/sdp/calib.c), it is the smallest send size whose copy costs
 * more than protecting and unprotecting its pages. A send below it goes the
 * synchronous way (zero copy or Buffer Copy: no asynchronous bytes), a send
 * at or above it is advertised asynchronously (tx_azcopy_bytes grows by
 * it). Hosts simulated with SDP_CALIB_FAKE "az=GBPS:FIXED_US:PAGE_US":
 *
 *   - copies at 20 GB/s (0.2048 us a page), a cycle of 6 us + 0.05 us a
 *     page: from 39 whole pages, 160 KiB (128 KiB goes synchronously,
 *     256 KiB asynchronously);
 *   - 1 us + 0.01 us a page: from 6 pages, 28 KiB (16 KiB / 64 KiB);
 *   - a cycle of 1 ms: never (a 1 MiB send stays synchronous);
 *   - the 160 KiB host with SDP_AZCOPY_THRESH=65536: the setting wins.
 *
 * Every byte is checked on the other side; under kernel TCP the same
 * program just moves the bytes.
 */
#include "azlib.h"

struct tcase {
	const char *fake;       /* SDP_CALIB_FAKE */
	const char *thresh;     /* SDP_AZCOPY_THRESH or NULL (auto) */
	size_t below, above;    /* sizes that must not / must go AZ (0: none) */
};

static const struct tcase cases[] = {
	{ "copy=libc:10;cma=20:20;az=20:6:0.05", NULL, 128 * 1024, 256 * 1024 },
	{ "copy=libc:10;cma=20:20;az=20:1:0.01", NULL, 16 * 1024, 64 * 1024 },
	{ "copy=libc:10;cma=20:20;az=20:1000:0", NULL, 1 * MiB, 0 },
	{ "copy=libc:10;cma=20:20;az=20:6:0.05", "65536", 32 * 1024, 64 * 1024 },
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static void rx(int s, void *arg)
{
	const struct tcase *t = arg;
	size_t sizes[2] = { t->below, t->above };
	uint8_t *r = az_buf(MiB, 0);
	for (int k = 0; k < 2; k++)
		if (sizes[k]) {
			az_recv_round(s, r, sizes[k], (uint64_t)k + 1);
			char go = 'g';
			tl_send_all(s, &go, 1);
		}
}

static int run(int i)
{
	const struct tcase *t = &cases[i];
	pid_t pid;
	int c = az_peer(rx, (void *)t, &pid);
	size_t sizes[2] = { t->below, t->above };
	uint8_t *b = az_buf(MiB, 0);
	for (int k = 0; k < 2; k++) {
		if (!sizes[k])
			continue;
		az_fill(b, sizes[k], (uint64_t)k + 1);
		uint64_t before = az_get(c).tx;
		tl_send_all(c, b, sizes[k]);
		uint64_t az = az_get(c).tx - before;
		char go;
		tl_recv_all(c, &go, 1);       /* read: the buffer is free again */
		if (!tl_sdp_mode())
			continue;
		fprintf(stderr, "case %d: %zu-byte send, %llu bytes asynchronous\n", i,
			sizes[k], (unsigned long long)az);
		if (k == 0)
			CHECK(az == 0, "case %d: %zu bytes are below the threshold, %llu went "
			      "asynchronously", i, sizes[k], (unsigned long long)az);
		else
			CHECK(az >= sizes[k] / 2, "case %d: %zu bytes are at or above the "
			      "threshold, only %llu went asynchronously", i, sizes[k],
			      (unsigned long long)az);
	}
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return run(atoi(argv[2]));
	tl_watchdog(120);
	for (int i = 0; i < NCASES; i++) {
		char fake[128], th[64], idx[8];
		snprintf(fake, sizeof fake, "SDP_CALIB_FAKE=%s", cases[i].fake);
		snprintf(th, sizeof th, "SDP_AZCOPY_THRESH=%s",
			 cases[i].thresh ? cases[i].thresh : "auto");
		snprintf(idx, sizeof idx, "%d", i);
		const char *env[] = { fake, th, "SDP_AZ_COOL=0", NULL };
		const char *args[] = { idx, NULL };
		int st = az_run(argv, env, args);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "case %d failed (0x%x)", i, st);
	}
	return 0;
}
