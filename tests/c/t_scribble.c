/*
 * A third process (here: a thread of ours standing in for one) scribbles
 * random bytes on the header page of a live connection - both control
 * blocks, including the words each end wrote itself - while the two ends
 * exchange data in rounds: a chunk of random size one way (received with
 * MSG_WAITALL and checked byte by byte), its length back as an answer.
 * Odd trials wait with poll() before each call, even ones block in
 * send/recv; in every other pair of trials the sockets have 64 KiB
 * SO_SNDBUF / SO_RCVBUF (a byte window).
 *
 * The promise (ARCHITECTURE.md section 11): anything inconsistent resets
 * that connection, never the process, and never leaves a call blocked or
 * spinning. So every trial must end, well within its watchdog, either with
 * every round done and every byte right, or with a reset (ECONNRESET,
 * EPIPE or an early EOF) seen by the calls; a byte that differs from what
 * was sent fails the test (the payload itself is not scribbled: its bytes
 * are as trusted as the peer). Under kernel TCP the same rounds run without
 * the scribbling.
 */
#include "testlib.h"

#include <pthread.h>
#include <stdatomic.h>
#include <sys/time.h>

#define TRIALS 120
#define ROUNDS 150
#define SEED 91
#define HDR_BYTES 704                 /* header and both control blocks */

static int cfd, sfd;
static _Atomic int rounds_done, stop;
static bool use_poll;

struct result { int ok, reset; };

static bool is_reset(ssize_t n, int e)
{
	return n == 0 || (n < 0 && (e == ECONNRESET || e == EPIPE));
}

static void wait_for(int fd, short ev)
{
	if (!use_poll)
		return;
	struct pollfd p = { .fd = fd, .events = ev };
	while (poll(&p, 1, -1) < 0 && errno == EINTR)
		;
}

/* One exact transfer; false if the connection was reset on the way. */
static bool send_exact(int fd, const char *b, size_t len)
{
	while (len) {
		wait_for(fd, POLLOUT);
		ssize_t n = send(fd, b, len, MSG_NOSIGNAL);
		if (n < 0 && errno == EINTR)
			continue;
		if (is_reset(n, errno))
			return false;
		CHECK(n > 0, "send");
		b += n;
		len -= (size_t)n;
	}
	return true;
}

static bool recv_exact(int fd, char *b, size_t len)
{
	while (len) {
		wait_for(fd, POLLIN);
		ssize_t n = recv(fd, b, len, MSG_WAITALL);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0 || is_reset(n, errno))
			return false;
		CHECK(n > 0, "recv");
		b += n;
		len -= (size_t)n;
	}
	return true;
}

static uint64_t rnd_state;
static uint64_t rnd(void)
{
	uint64_t z = (rnd_state += 0x9E3779B97F4A7C15ull);
	z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
	z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
	return z ^ (z >> 31);
}

/* The client: chunks out, answers in. */
static void *client(void *arg)
{
	uint64_t seed = (uint64_t)(uintptr_t)arg, x = seed, off = 0;
	static char buf[65536];
	for (int r = 0; r < ROUNDS && !atomic_load(&stop); r++) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		uint32_t len = 1 + (uint32_t)((x >> 33) % sizeof buf);
		tl_fill(buf, len, off, SEED);
		if (!send_exact(cfd, (char *)&len, sizeof len) || !send_exact(cfd, buf, len))
			break;
		uint32_t ack;
		if (!recv_exact(cfd, (char *)&ack, sizeof ack))
			break;
		CHECK_EQ(ack, len);
		off += len;
		atomic_fetch_add(&rounds_done, 1);
	}
	atomic_store(&stop, 1);
	shutdown(cfd, SHUT_WR);
	return NULL;
}

/* The server: checks every byte, answers with the length. */
static void *server(void *arg)
{
	(void)arg;
	static char buf[65536];
	uint64_t off = 0;
	for (;;) {
		uint32_t len;
		if (!recv_exact(sfd, (char *)&len, sizeof len))
			break;
		CHECK(len >= 1 && len <= sizeof buf, "length %u", len);
		if (!recv_exact(sfd, buf, len))
			break;
		CHECK_PAT(buf, len, off, SEED);
		off += len;
		if (!send_exact(sfd, (char *)&len, sizeof len))
			break;
	}
	atomic_store(&stop, 1);
	shutdown(sfd, SHUT_WR);
	return NULL;
}

/* ---- the region, found as t_malformed.c finds it ----------------------- */

struct map { unsigned long start, end, ino; };

static int conn_maps(struct map *m, int max)
{
	FILE *f = fopen("/proc/self/maps", "re");
	CHECK(f != NULL);
	char line[600];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		if (!strstr(line, "/memfd:sdp-conn (deleted)"))
			continue;
		struct map e;
		if (sscanf(line, "%lx-%lx %*s %*x %*s %lu", &e.start, &e.end, &e.ino) == 3 &&
		    n < max)
			m[n++] = e;
	}
	fclose(f);
	return n;
}

static void trial(int t)
{
	struct map before[16], now[16];
	int nb = tl_sdp_mode() ? conn_maps(before, 16) : 0;
	tl_pair(AF_INET, &cfd, &sfd);
	if (t % 4 >= 2 || getenv("T_SNDBUF")) {
		/* A byte window (SO_SNDBUF / SO_RCVBUF) limits the sender by
		 * the receiver's count of consumed bytes, one more word. */
		int v = getenv("T_SNDBUF") ? atoi(getenv("T_SNDBUF")) : 65536;
		SYS(setsockopt(cfd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v));
		SYS(setsockopt(sfd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v));
		SYS(setsockopt(cfd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v));
		SYS(setsockopt(sfd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v));
	}
	expect_transport(cfd);
	expect_transport(sfd);
	char *region = NULL;
	if (tl_sdp_mode()) {
		int nn = conn_maps(now, 16);
		for (int i = 0; i < nn && !region; i++) {
			bool old = false;
			for (int j = 0; j < nb; j++)
				old |= before[j].ino == now[i].ino;
			if (!old)
				region = (char *)now[i].start;
		}
		CHECK(region != NULL, "the connection's memory is not mapped");
	}
	use_poll = t & 1;
	const char *seed = getenv("T_SEED");   /* other trials, for soaking */
	rnd_state = 0x5eed0000ull + (uint64_t)t + (seed ? (uint64_t)atol(seed) << 20 : 0);
	pthread_t a, b;
	CHECK(pthread_create(&a, NULL, client, (void *)(uintptr_t)(t + 1)) == 0);
	CHECK(pthread_create(&b, NULL, server, NULL) == 0);
	if (region) {
		/* Scribble once or twice, at random rounds. */
		int when = (int)(rnd() % (ROUNDS / 2)), times = 1 + (int)(rnd() % 2);
		for (int k = 0; k < times; k++) {
			while (atomic_load(&rounds_done) < when && !atomic_load(&stop))
				sched_yield();
			size_t at = rnd() % HDR_BYTES, n = 1 + rnd() % 8;
			if (at + n > HDR_BYTES)
				n = HDR_BYTES - at;
			uint64_t v = rnd();
			memcpy(region + at, &v, n);
			if (getenv("T_VERBOSE"))
				fprintf(stderr, "trial %d: round %d: %zu byte(s) at %zu\n",
					t, atomic_load(&rounds_done), n, at);
			when += 1 + (int)(rnd() % 20);
		}
	}
	pthread_join(a, NULL);
	pthread_join(b, NULL);
	SYS(close(cfd));
	SYS(close(sfd));
	_exit(atomic_load(&rounds_done) == ROUNDS ? 0 : 10);
}

int main(void)
{
	struct result res = { 0, 0 };
	double t0 = tl_now();
	const char *only = getenv("T_TRIAL");
	for (int t = 0; t < TRIALS; t++) {
		if (only && atoi(only) != t)
			continue;
		fflush(NULL);
		pid_t pid = fork();
		CHECK(pid >= 0);
		if (pid == 0) {
			/* A trial ends in well under its watchdog: recovery
			 * from a lost wake-up takes at most a second or two. */
			tl_watchdog(8);
			trial(t);
		}
		int st;
		double t1 = tl_now();
		CHECK_EQ(waitpid(pid, &st, 0), pid);
		if (tl_now() - t1 > 1.5)
			printf("trial %d took %.1f s (status %d)\n", t, tl_now() - t1,
			       WIFEXITED(st) ? WEXITSTATUS(st) : -1);
		CHECK(WIFEXITED(st), "trial %d: killed by signal %d", t,
		      WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		CHECK(WEXITSTATUS(st) == 0 || WEXITSTATUS(st) == 10,
		      "trial %d failed (status %d)", t, WEXITSTATUS(st));
		CHECK(WEXITSTATUS(st) == 0 || tl_sdp_mode(),
		      "trial %d: reset without any scribbling", t);
		if (WEXITSTATUS(st) == 0)
			res.ok++;
		else
			res.reset++;
	}
	printf("%d trials in %.1f s: %d with every round right, %d reset\n",
	       TRIALS, tl_now() - t0, res.ok, res.reset);
	return 0;
}
