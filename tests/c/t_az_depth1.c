/*
 * An asynchronous sender whose pipeline is full (SDP_AZ_DEPTH=1: every send
 * waits for the read of the one before) must not sleep through the read
 * that empties it. The sender tests "full" against the sink's rd_done and
 * then marks the value its wait must see change; a read completed between
 * two loads of rd_done made the mark the final value, and the sender slept
 * for ever beside an idle receiver (both asleep on the socket). A stream
 * of 128 KiB sends for 1.5 s, three times, each end on its own CPU: the
 * receiver checks the bytes and gives up after 10 s without data, so a
 * stall fails the test instead of hanging it. The window is two loads
 * wide: a stream of sdp-perf stalled in 4 of 81 runs of 0.3 s at this
 * depth before the fix (0 of 399 after); this test, with fewer sends, is
 * a guard that catches it only sometimes.
 */
#include "azlib.h"

#include <sched.h>
#include <time.h>

#define SZ (128u * 1024)
#define MAX_SENDS 200000
#define RUN_NS 1500000000ull

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Batches of BATCH sends, each announced by its count (4 bytes, Buffer
 * Copy); a count of 0 ends the stream. */
#define BATCH 256

/* Each end on a CPU of its own when there are two: the race needs the
 * read to complete while the sender is between its test and its mark. */
static void pin(int cpu)
{
	cpu_set_t set;
	if (sched_getaffinity(0, sizeof set, &set) || CPU_COUNT(&set) < 2)
		return;
	int seen = 0;
	for (int i = 0; i < CPU_SETSIZE; i++)
		if (CPU_ISSET(i, &set) && seen++ == cpu) {
			cpu_set_t one;
			CPU_ZERO(&one);
			CPU_SET(i, &one);
			sched_setaffinity(0, sizeof one, &one);
			return;
		}
}

static void rx(int s, void *arg)
{
	(void)arg;
	pin(0);
	struct timeval tv = { .tv_sec = 10 };
	CHECK(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv) == 0);
	uint8_t *r = az_buf(SZ, 0);
	uint8_t *ref = az_buf(SZ, 0);
	az_fill(ref, SZ, 7);
	uint64_t k = 0;
	for (;;) {
		uint32_t n;
		tl_recv_all(s, &n, sizeof n);
		if (n == 0)
			break;
		for (uint32_t i = 0; i < n; i++, k++) {
			size_t got = 0;
			while (got < SZ) {
				ssize_t m = recv(s, r + got, SZ - got, 0);
				CHECK(m > 0, "send %llu: recv %zd (%s): the sender stalled",
				      (unsigned long long)k, m, m ? strerror(errno) : "EOF");
				got += (size_t)m;
			}
			/* Every 8th send whole, the others one word per page
			 * (a whole compare per send would slow the receiver
			 * to a fifth and leave the sender rarely waiting). */
			bool ok = true;
			if (k % 8 == 0)
				ok = memcmp(r, ref, SZ) == 0;
			else
				for (size_t o = (k * 8) % 4096; o < SZ && ok; o += 4096)
					ok = !memcmp(r + o, ref + o, 8);
			CHECK(ok, "send %llu: wrong bytes", (unsigned long long)k);
		}
	}
	char go = 'g';
	tl_send_all(s, &go, 1);
}

static int stream(void)
{
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	pin(1);
	uint8_t *b = az_buf(SZ, 0);
	az_fill(b, SZ, 7);
	uint64_t t0 = now_ns(), sent = 0;
	while (sent < MAX_SENDS && now_ns() - t0 < RUN_NS) {
		uint32_t n = BATCH;
		tl_send_all(c, &n, sizeof n);
		for (uint32_t i = 0; i < n; i++)
			tl_send_all(c, b, SZ);    /* the same pages every time */
		sent += n;
	}
	uint32_t end = 0;
	tl_send_all(c, &end, sizeof end);
	char go;
	tl_recv_all(c, &go, 1);
	if (tl_sdp_mode()) {
		struct azst a = az_get(c);
		fprintf(stderr, "%llu sends of %u bytes, %llu bytes asynchronously\n",
			(unsigned long long)sent, SZ, (unsigned long long)a.tx);
		CHECK(a.tx > 0, "no asynchronous send: the pipeline was not exercised");
	}
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return stream();
	tl_watchdog(120);
	/* Three runs of the stream, each in a fresh process. */
	for (int i = 0; i < 3; i++) {
		const char *env[] = { "SDP_AZ_DEPTH=1", "SDP_AZ_COOL=0", NULL };
		const char *args[] = { "stream", NULL };
		int st = az_run(argv, env, args);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "run %d failed (status 0x%x)", i, st);
	}
	return 0;
}
