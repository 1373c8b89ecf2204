/*
 * Asynchronous receive is for buffers of at most SDP_AZ_RECV_MAX (1 MiB by
 * default): a stream of 4 MiB messages read by recv() calls of 4 MiB gets
 * no receive that returned before its copy (the progress thread's copy is
 * slower than the recv's own, and the receiver is what limits a stream),
 * and every byte is the stream's. With SDP_AZ_RECV_MAX=8 MiB the same
 * stream does get asynchronous receives (userfaultfd hosts): the limit,
 * not something else, kept them off.
 */
#include "azlib.h"

#define SZ (4 * MiB)
#define ROUNDS 6

static void rx(int s, void *arg)
{
	(void)arg;
	uint8_t *r = az_buf(SZ, 0);
	uint8_t *ref = az_buf(SZ, 0);
	for (uint64_t k = 0; k < ROUNDS; k++) {
		az_fill(ref, SZ, k);
		size_t got = 0;
		while (got < SZ) {
			/* always the whole buffer, as a streaming reader does
			 * (the next round comes only after our answer) */
			ssize_t n = recv(s, r, SZ, 0);
			CHECK(n > 0 && (size_t)n <= SZ - got, "recv: %zd (%s)", n,
			      n ? strerror(errno) : "EOF");
			CHECK(memcmp(r, ref + got, (size_t)n) == 0, "round %llu: wrong bytes at %zu",
			      (unsigned long long)k, got);
			got += (size_t)n;
		}
		char go = 'g';
		tl_send_all(s, &go, 1);
	}
	if (tl_sdp_mode()) {
		struct azst a = az_get(s);
		const char *mx = getenv("SDP_AZ_RECV_MAX");
		fprintf(stderr, "SDP_AZ_RECV_MAX=%s: %llu of %llu bytes received asynchronously\n",
			mx ? mx : "(default)", (unsigned long long)a.asy,
			(unsigned long long)a.rx);
		CHECK(a.rx > 0, "nothing read from asynchronous advertisements");
		if (!mx)
			CHECK(a.asy == 0, "%llu bytes received asynchronously into 4 MiB buffers",
			      (unsigned long long)a.asy);
		else
			CHECK(a.asy > 0, "no asynchronous receive with the limit raised");
	}
}

static int run(void)
{
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	uint8_t *b = az_buf(SZ, 0);
	for (uint64_t k = 0; k < ROUNDS; k++) {
		az_fill(b, SZ, k);
		tl_send_all(c, b, SZ);
		char go;
		tl_recv_all(c, &go, 1);
	}
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return run();
	tl_watchdog(120);
	const char *envs[][3] = { { "SDP_AZ_RECV=1", NULL, NULL },
				  { "SDP_AZ_RECV=1", "SDP_AZ_RECV_MAX=8388608", NULL } };
	for (int i = 0; i < 2; i++) {
		const char *args[] = { "stream", NULL };
		int st = az_run(argv, envs[i], args);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "case %d failed (0x%x)", i, st);
	}
	return 0;
}
