/*
 * Zero copy where the kernel refuses Cross Memory Attach (root only).
 * (1) The peer process drops to user nobody before it connects to us,
 * (2) before it listens and we connect; both ends ask for zero copy on
 * their socket. 8 MiB go each way in blocking sends and receives of 1 MiB
 * (at and above the threshold, receivers waiting first so buffers would be
 * offered) and arrive byte-exact. The kernel refuses process_vm_readv/
 * writev between the two users, so the connection is either plain TCP or
 * uses Buffer Copy only: every zero-copy counter stays 0 on both ends.
 * (3) Both ends run as nobody (same user, so SDP), both non-dumpable after
 * the switch, so neither may read the other: Buffer Copy only, silently.
 * (4) As (3) but the client made itself dumpable again: the server may
 * access the client, not the reverse. The paths that need the refused
 * direction (Read ZCopy server->client, Write ZCopy client->server) stay
 * at 0; the transfer is byte-exact and the connection is not reset.
 */
#include "testlib.h"
#include <grp.h>
#include <sys/prctl.h>

#define T 65536
#define MiB (1u << 20)
#define TOTAL (8u * MiB)
#define NOBODY 65534

static void drop_to_nobody(void)
{
	SYS(setgroups(0, NULL));
	SYS(setresgid(NOBODY, NOBODY, NOBODY));
	SYS(setresuid(NOBODY, NOBODY, NOBODY));
	CHECK_EQ(geteuid(), NOBODY);
}

/* 1 if fd travels over SDP. In tcp mode it must be kernel TCP. */
static int on_sdp(int fd)
{
	int v = -7;
	socklen_t len = sizeof v;
	if (!tl_sdp_mode()) {
		expect_transport(fd);
		return 0;
	}
	SYS(getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &len));
	CHECK(v == 0 || v == 1);
	return v;
}

/* Ask for zero copy from T bytes on. */
static void want_zcopy(int fd, int sdp)
{
	int th = T, v = -7;
	socklen_t len = sizeof v;
	if (!tl_sdp_mode()) {
		CHECK_ERR(setsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &th,
				     sizeof th), ENOPROTOOPT);
		CHECK_ERR(getsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len),
			  ENOPROTOOPT);
		return;
	}
	SYS(setsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &th, sizeof th));
	if (sdp) {
		SYS(getsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
		CHECK_EQ(v, th);
	}
}

/* Counters that may be nonzero (the kernel allows that direction). */
#define TXR 1
#define TXW 2
#define RXR 4
#define RXW 8

/* No zero copy on this end except the allowed paths; the byte counts are
 * exact. */
static void check_counters(int fd, int sdp, const char *who, int allow)
{
	struct sdp_sock_stats s;
	if (!sdp)
		return;
	CHECK(tl_stats(fd, &s));
	fprintf(stderr, "%s: tx b %llu r %llu w %llu, rx b %llu r %llu w %llu\n",
		who, (unsigned long long)s.tx_bcopy_bytes,
		(unsigned long long)s.tx_rzcopy_bytes,
		(unsigned long long)s.tx_wzcopy_bytes,
		(unsigned long long)s.rx_bcopy_bytes,
		(unsigned long long)s.rx_rzcopy_bytes,
		(unsigned long long)s.rx_wzcopy_bytes);
	CHECK_EQ(s.tx_bytes, TOTAL);
	CHECK_EQ(s.rx_bytes, TOTAL);
	CHECK_EQ(s.tx_bcopy_bytes + s.tx_rzcopy_bytes + s.tx_wzcopy_bytes,
		 TOTAL);
	CHECK_EQ(s.rx_bcopy_bytes + s.rx_rzcopy_bytes + s.rx_wzcopy_bytes,
		 TOTAL);
	if (!(allow & TXR))
		CHECK_EQ(s.tx_rzcopy_bytes, 0);
	if (!(allow & TXW))
		CHECK_EQ(s.tx_wzcopy_bytes, 0);
	if (!(allow & RXR))
		CHECK_EQ(s.rx_rzcopy_bytes, 0);
	if (!(allow & RXW))
		CHECK_EQ(s.rx_wzcopy_bytes, 0);
}

static uint8_t buf[MiB + 64];

static void send_8m(int fd, uint32_t seed)
{
	for (uint64_t off = 0; off < TOTAL; off += MiB) {
		tl_fill(buf + 3, MiB, off, seed);
		ssize_t n = send(fd, buf + 3, MiB, 0);
		CHECK_EQ(n, (ssize_t)MiB);
	}
}

static void recv_8m(int fd, uint32_t seed)
{
	uint64_t off = 0;
	while (off < TOTAL) {
		ssize_t n = recv(fd, buf + 5, MiB, 0);
		CHECK(n > 0, "recv after %llu bytes", (unsigned long long)off);
		CHECK_PAT(buf + 5, (size_t)n, off, seed);
		off += (uint64_t)n;
	}
}

/* Both ends: a exchanges with b (first sends when first != 0). The
 * receiver of each direction is already waiting when the data comes. */
static void exchange(int fd, int first, const char *who, int go_r, int go_w,
		     int allow, int need_sdp)
{
	char b;
	int sdp = on_sdp(fd);
	if (need_sdp)
		expect_transport(fd);
	tl_nodelay(fd);
	want_zcopy(fd, sdp);
	fprintf(stderr, "%s: %s\n", who, sdp ? "SDP" : "TCP");
	for (int dir = 0; dir < 2; dir++) {
		if ((dir == 0) == (first != 0)) {
			/* sender: wait until the receiver is in recv */
			CHECK_EQ(read(go_r, &b, 1), 1);
			tl_idle_ms(30);
			send_8m(fd, 50 + (uint32_t)dir);
		} else {
			CHECK_EQ(write(go_w, "g", 1), 1);
			recv_8m(fd, 50 + (uint32_t)dir);
		}
	}
	check_counters(fd, sdp, who, allow);
	SYS(shutdown(fd, SHUT_WR));
	CHECK_EQ(recv(fd, &b, 1, 0), 0);
}

/* (3)/(4): a nobody server and a nobody client, children of ours. */
static void both_nobody(int client_dumpable)
{
	int a2b[2], b2a[2], pp[2];
	SYS(pipe(a2b));
	SYS(pipe(b2a));
	SYS(pipe(pp));
	pid_t srv = tl_fork();
	if (srv == 0) {
		drop_to_nobody();
		CHECK_EQ(prctl(PR_GET_DUMPABLE), 0);
		uint16_t p;
		int l = tl_listen(AF_INET, &p);
		CHECK_EQ(write(pp[1], &p, sizeof p), (ssize_t)sizeof p);
		int fd = SYS(accept(l, NULL, NULL));
		SYS(close(l));
		exchange(fd, 0, client_dumpable ? "nobody server (nodump)" :
			 "nobody server", a2b[0], b2a[1],
			 client_dumpable ? TXW | RXR : 0, 1);
		SYS(close(fd));
		_exit(0);
	}
	uint16_t port;
	CHECK_EQ(read(pp[0], &port, sizeof port), (ssize_t)sizeof port);
	pid_t cli = tl_fork();
	if (cli == 0) {
		drop_to_nobody();
		if (client_dumpable)
			SYS(prctl(PR_SET_DUMPABLE, 1));
		int fd = tl_connect(AF_INET, port);
		exchange(fd, 1, client_dumpable ? "nobody client (dumpable)" :
			 "nobody client", b2a[0], a2b[1],
			 client_dumpable ? TXR | RXW : 0, 1);
		SYS(close(fd));
		_exit(0);
	}
	tl_wait_ok(cli);
	tl_wait_ok(srv);
	int fds[] = { a2b[0], a2b[1], b2a[0], b2a[1], pp[0], pp[1] };
	for (int i = 0; i < 6; i++)
		SYS(close(fds[i]));
}

int main(void)
{
	int p2c[2], c2p[2];
	uint16_t port;

	tl_watchdog(20);
	if (geteuid() != 0)
		SKIP("needs root to switch users");
	SYS(pipe(p2c));
	SYS(pipe(c2p));

	/* (1) nobody connects to root */
	int l = tl_listen(AF_INET, &port);
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(l));
		drop_to_nobody();
		int fd = tl_connect(AF_INET, port);
		exchange(fd, 1, "nobody client", p2c[0], c2p[1], 0, 0);
		SYS(close(fd));
		_exit(0);
	}
	int s = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	exchange(s, 0, "root server", c2p[0], p2c[1], 0, 0);
	SYS(close(s));
	tl_wait_ok(pid);

	/* (2) root connects to nobody */
	int pp[2];
	SYS(pipe(pp));
	pid = tl_fork();
	if (pid == 0) {
		drop_to_nobody();
		uint16_t p;
		int l2 = tl_listen(AF_INET, &p);
		CHECK_EQ(write(pp[1], &p, sizeof p), (ssize_t)sizeof p);
		int fd = SYS(accept(l2, NULL, NULL));
		SYS(close(l2));
		exchange(fd, 0, "nobody server", p2c[0], c2p[1], 0, 0);
		SYS(close(fd));
		_exit(0);
	}
	CHECK_EQ(read(pp[0], &port, sizeof port), (ssize_t)sizeof port);
	int c = tl_connect(AF_INET, port);
	exchange(c, 1, "root client", c2p[0], p2c[1], 0, 0);
	SYS(close(c));
	tl_wait_ok(pid);

	both_nobody(0);
	both_nobody(1);
	return 0;
}
