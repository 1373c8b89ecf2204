/*
 * Zero copy from processes other than the ones that set the connection up:
 * the peer they name as the owner of a buffer is verified with the kernel
 * (it must hold the far end of the TCP connection), so
 *
 *   worker     a pre-fork server: this process listens, a forked worker
 *              accepts and sends 64 MiB; this process, the client, reads
 *              them straight out of the worker's buffers;
 *   child-tx   a child forked after connect sends 64 MiB (its parent has
 *              closed its copy); the server reads them from the child;
 *   child-rx   a child forked after connect receives 64 MiB in large
 *              blocking receives.
 *
 * Byte-exact in every case; under SDP the reading end's counters show that
 * zero copy carried most of the bytes.
 */
#include "zclib.h"
#include <sys/wait.h>

#define MiB (1u << 20)
#define TOTAL (64u * MiB)
#define T 65536

static void send_total(int fd, uint32_t seed)
{
	static uint8_t buf[4 * MiB];
	for (uint64_t off = 0; off < TOTAL; off += sizeof buf) {
		tl_fill(buf, sizeof buf, off, seed);
		tl_send_all(fd, buf, sizeof buf);
	}
}

static void recv_total(int fd, uint32_t seed)
{
	static uint8_t buf[4 * MiB + 64];
	uint64_t off = 0;
	for (unsigned i = 0; off < TOTAL; i++) {
		size_t want = TOTAL - off < 4 * MiB ? TOTAL - off : 4 * MiB;
		ssize_t n = recv(fd, buf + i % 61, want, MSG_WAITALL);
		CHECK(n > 0, "recv after %llu bytes", (unsigned long long)off);
		CHECK_PAT(buf + i % 61, (size_t)n, off, seed);
		off += (uint64_t)n;
	}
	char x;
	CHECK_EQ(recv(fd, &x, 1, 0), 0);
}

/* Under SDP: most of what this end read came by zero copy. */
static void mostly_zcopy(int fd, const char *who)
{
	if (!tl_sdp_mode())
		return;
	struct zc z = zc_get(fd);
	CHECK_EQ(z.rx, TOTAL);
	CHECK(z.rxr + z.rxw >= TOTAL / 2, "%s: only %llu of %u bytes by zero "
	      "copy (bcopy %llu)", who, (unsigned long long)(z.rxr + z.rxw),
	      TOTAL, (unsigned long long)z.rxb);
}

static void c_worker(void)
{
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	fflush(NULL);
	pid_t w = SYS(fork());
	if (w == 0) {
		tl_watchdog(30);
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		zc_thresh(s, T);
		send_total(s, 11);
		SYS(close(s));
		_exit(0);
	}
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	zc_thresh(c, T);
	recv_total(c, 11);
	mostly_zcopy(c, "client of a pre-fork worker");
	tl_wait_ok(w);
	SYS(close(c));
	SYS(close(l));
}

/* A server process that receives (or sends) TOTAL on one connection. */
static pid_t server(uint16_t *port, bool sends, uint32_t seed)
{
	int l;
	pid_t pid = tl_fork_listener(port, &l);
	if (pid == 0) {
		tl_watchdog(30);
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		zc_thresh(s, T);
		if (sends) {
			send_total(s, seed);
			SYS(shutdown(s, SHUT_WR));
			char x;
			CHECK_EQ(recv(s, &x, 1, 0), 0);
		} else {
			recv_total(s, seed);
			mostly_zcopy(s, "server reading a forked child");
		}
		SYS(close(s));
		_exit(0);
	}
	return pid;
}

static void c_child(bool child_sends)
{
	uint16_t port;
	pid_t srv = server(&port, !child_sends, 21);
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	zc_thresh(c, T);
	fflush(NULL);
	pid_t k = SYS(fork());
	if (k == 0) {
		tl_watchdog(30);
		if (child_sends) {
			send_total(c, 21);
		} else {
			recv_total(c, 21);
			mostly_zcopy(c, "forked child reading");
		}
		SYS(close(c));
		_exit(0);
	}
	SYS(close(c));            /* the child holds the connection alone */
	tl_wait_ok(k);
	tl_wait_ok(srv);
}

static void c_child_tx(void) { c_child(true); }
static void c_child_rx(void) { c_child(false); }

static const struct tl_case cases[] = {
	{ "worker",   c_worker },
	{ "child-tx", c_child_tx },
	{ "child-rx", c_child_rx },
};

int main(void)
{
	tl_watchdog(90);
	signal(SIGPIPE, SIG_IGN);
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
