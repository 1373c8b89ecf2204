/*
 * What idle connections cost: 1,000 connections between two processes each
 * carry 1 MiB (client to server, 16 KiB writes, plus a 1-byte answer), then
 * both processes sit in epoll_wait. The memory both processes hold (Pss from
 * /proc/PID/smaps_rollup, which counts a shared page half to each) is
 * measured then; the kernel TCP run prints it as a metric, and the SDP run
 * must stay within 64 KiB per connection of it (TL_TCP_pss_kib).
 *
 * Under SDP each process waits in epoll_wait (500 ms at a time) until its
 * own counters show every connection trimmed (SDP_STATS trims >= 1: the
 * library's looks gave the idle rings back), at most 20 s; then memory is
 * measured whatever the counters say. A library that never gives memory
 * back holds about 1 MiB per connection here and fails the bound.
 */
#include "testlib.h"
#include <sys/epoll.h>
#include <sys/resource.h>

#define NCONN 1000
#define MIB (1u << 20)

static long pss_kib(pid_t pid)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/smaps_rollup", (int)pid);
	FILE *f = fopen(path, "r");
	CHECK(f != NULL, "open %s", path);
	long v = -1;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "Pss: %ld kB", &v) == 1)
			break;
	fclose(f);
	CHECK(v >= 0, "no Pss in %s", path);
	return v;
}

/* Sit in epoll_wait until every fd's trims counter moved (SDP), or the
 * bound; returns the number of waits. */
static int idle(const int *fds, int n, bool want_trims)
{
	int ep = SYS(epoll_create1(0));
	for (int i = 0; i < n; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.u32 = (uint32_t)i };
		SYS(epoll_ctl(ep, EPOLL_CTL_ADD, fds[i], &ev));
	}
	int waits = 0;
	/* measuring by hand (docs): a fixed number of waits, no counters */
	const char *fw = getenv("TL_IDLE_FIXED_WAITS");
	for (int k = fw ? atoi(fw) : 0; k > 0; k--) {
		struct epoll_event ev[8];
		CHECK_EQ(epoll_wait(ep, ev, 8, 500), 0);
		want_trims = false;
	}
	for (; want_trims && waits < 40; waits++) {
		struct epoll_event ev[8];
		CHECK_EQ(epoll_wait(ep, ev, 8, 500), 0);
		int left = 0;
		for (int i = 0; i < n; i++) {
			struct sdp_sock_stats st;
			tl_stats(fds[i], &st);
			left += st.trims == 0;
		}
		if (!left)
			break;
	}
	SYS(close(ep));
	return waits;
}

static char buf[16384];

int main(void)
{
	struct rlimit rl;
	SYS(getrlimit(RLIMIT_NOFILE, &rl));
	if (rl.rlim_max < 2 * NCONN + 64) {
		fprintf(stderr, "skip: RLIMIT_NOFILE %llu is too low\n",
			(unsigned long long)rl.rlim_max);
		return 77;
	}
	rl.rlim_cur = rl.rlim_max;
	SYS(setrlimit(RLIMIT_NOFILE, &rl));
	tl_watchdog(90);
	/* TL_IDLE_BYTES: another amount per connection (measuring by hand) */
	size_t bytes = getenv("TL_IDLE_BYTES") ? (size_t)atol(getenv("TL_IDLE_BYTES")) : MIB;
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int ready[2], stop[2];
	SYS(pipe(ready));
	SYS(pipe(stop));
	static int fds[NCONN];
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(stop[1]));          /* the client's end: EOF if it fails */
		for (int i = 0; i < NCONN; i++) {
			fds[i] = SYS(accept(l, NULL, NULL));
			size_t got = 0;
			while (got < bytes) {
				ssize_t r = SYS(recv(fds[i], buf, sizeof buf, 0));
				CHECK(r > 0, "EOF after %zu bytes", got);
				for (ssize_t k = 0; k < r; k++)
					CHECK((unsigned char)buf[k] == (unsigned char)((got + k) * 7),
					      "byte %zu of connection %d", got + k, i);
				got += (size_t)r;
			}
		}
		for (int i = 0; i < NCONN; i++)
			tl_send_all(fds[i], "k", 1);
		int w = idle(fds, NCONN, tl_sdp_mode());
		fprintf(stderr, "server: %d waits\n", w);
		CHECK_EQ(write(ready[1], "r", 1), 1);
		char b;
		(void)!read(stop[0], &b, 1);
		for (int i = 0; i < NCONN; i++)
			SYS(close(fds[i]));
		_exit(0);
	}
	for (size_t k = 0; k < sizeof buf; k++)
		buf[k] = (char)(k * 7);       /* 16384 * 7 is a multiple of 256 */
	for (int i = 0; i < NCONN; i++) {
		fds[i] = tl_connect(AF_INET, port);
		if (i == 0)
			expect_transport(fds[i]);
		for (size_t sent = 0; sent < bytes; sent += sizeof buf)
			tl_send_all(fds[i], buf, bytes - sent < sizeof buf ?
				    bytes - sent : sizeof buf);
	}
	for (int i = 0; i < NCONN; i++) {
		char b;
		CHECK_EQ(recv(fds[i], &b, 1, MSG_WAITALL), 1);
	}
	int w = idle(fds, NCONN, tl_sdp_mode());
	char b;
	CHECK_EQ(read(ready[0], &b, 1), 1);
	long mine = pss_kib(getpid()), theirs = pss_kib(pid);
	fprintf(stderr, "client: %d waits; Pss client %ld KiB, server %ld KiB\n",
		w, mine, theirs);
	tl_metric("pss_kib", mine + theirs);
	long long tcp = tl_tcp_metric("pss_kib");
	if (tl_sdp_mode() && tcp >= 0 && bytes == MIB) {
		double per = (double)(mine + theirs - tcp) / NCONN;
		fprintf(stderr, "SDP beyond TCP: %.1f KiB per idle connection\n", per);
		CHECK(per <= 64.0, "idle connections cost %.1f KiB each beyond TCP's "
		      "(%ld KiB in all, TCP %lld KiB)", per, mine + theirs, tcp);
	}
	CHECK_EQ(write(stop[1], "s", 1), 1);
	tl_wait_ok(pid);
	for (int i = 0; i < NCONN; i++)
		SYS(close(fds[i]));
	SYS(close(l));
	return 0;
}
