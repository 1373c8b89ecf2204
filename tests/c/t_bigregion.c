/*
 * Large rings: SDP_NSLOTS=1024 with SDP_SLOT_SIZE=1048576 (test_c_features
 * sets them for this program), so each connection's region is 2 GiB (of
 * address space: the memfd is sparse). Eight of them would make an arena
 * larger than the 16 GiB an accepting side maps; the client then puts
 * fewer slots in its arena, and every connection works. And a server with
 * too little address space for the arena maps the one region it needs,
 * or, with too little even for that, declines SDP: both ends carry the
 * connection on TCP (the client hands back the bytes it had posted) and
 * the exchange works as on kernel TCP.
 */
#include "testlib.h"
#include <sys/resource.h>

#define NCONN 10
#define NBYTES (3u << 20)

/* Echo server: at most `conns` connections at once, each NBYTES; with
 * room_mib, that much address space beyond what it has now. */
static void server(int l, int conns, long room_mib)
{
	tl_watchdog(50);
	if (room_mib) {
		long kib = tl_vm_size_kib();
		CHECK(kib > 0);
		struct rlimit rl = { (rlim_t)(kib + room_mib * 1024) * 1024,
				     (rlim_t)(kib + room_mib * 1024) * 1024 };
		SYS(setrlimit(RLIMIT_AS, &rl));
	}
	int s[NCONN];
	for (int i = 0; i < conns; i++) {
		s[i] = SYS(accept(l, NULL, NULL));
		if (room_mib && room_mib < 2048) {
			int v = -1;       /* no room for a region: declined */
			socklen_t vl = sizeof v;
			if (getsockopt(s[i], SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0)
				CHECK_EQ(v, 0);
		} else {
			expect_transport(s[i]);
		}
	}
	for (int i = 0; i < conns; i++) {
		tl_recv_pat(s[i], 0, NBYTES, (uint32_t)i, 65536);
		tl_send_pat(s[i], 0, NBYTES, (uint32_t)i + 100, 65536);
	}
	for (int i = 0; i < conns; i++)
		SYS(close(s[i]));
	_exit(0);
}

/* NCONN connections open at once, more than an arena's slots. */
static void many(void)
{
	uint16_t port;
	int l;
	pid_t pid = tl_fork_listener(&port, &l);
	if (pid == 0)
		server(l, NCONN, 0);
	int c[NCONN];
	for (int i = 0; i < NCONN; i++) {
		c[i] = tl_connect(AF_INET, port);
		expect_transport(c[i]);
	}
	for (int i = 0; i < NCONN; i++)
		tl_send_pat(c[i], 0, NBYTES, (uint32_t)i, 65536);
	for (int i = 0; i < NCONN; i++) {
		tl_recv_pat(c[i], 0, NBYTES, (uint32_t)i + 100, 65536);
		expect_bytes(c[i], NBYTES, NBYTES);
		SYS(close(c[i]));
	}
	tl_wait_ok(pid);
}

/* One exchange with a server limited to room_mib more address space:
 * 1 echoed, 0 reset. */
static int limited(long room_mib)
{
	uint16_t port;
	int l;
	pid_t pid = tl_fork_listener(&port, &l);
	if (pid == 0)
		server(l, 1, room_mib);
	int c = tl_connect(AF_INET, port);
	expect_transport(c);                  /* committed to SDP */
	struct timeval tv = { 10, 0 };
	SYS(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	static char buf[65536];
	size_t sent = 0;
	int res = 1;
	while (sent < NBYTES && res) {
		size_t n = NBYTES - sent < sizeof buf ? NBYTES - sent : sizeof buf;
		tl_fill(buf, n, sent, 0);
		ssize_t k = send(c, buf, n, MSG_NOSIGNAL);
		if (k < 0) {
			CHECK(errno == ECONNRESET || errno == EPIPE, "send");
			res = 0;
		} else {
			sent += (size_t)k;
		}
	}
	size_t got = 0;
	while (res && got < NBYTES) {
		ssize_t n = recv(c, buf, sizeof buf, 0);
		CHECK(n != -1 || errno != EAGAIN,
		      "no answer and no reset in 10 s: the two ends wait for each other");
		if (n <= 0) {
			CHECK(got == 0 && (n == 0 || errno == ECONNRESET), "recv %zd", n);
			res = 0;
			break;
		}
		CHECK_PAT(buf, (size_t)n, got, 100);
		got += (size_t)n;
	}
	close(c);
	if (res) {
		tl_wait_ok(pid);
	} else {
		kill(pid, SIGKILL);           /* it waits for a connection that never came */
		waitpid(pid, NULL, 0);
	}
	return res;
}

int main(void)
{
	tl_watchdog(55);
	signal(SIGPIPE, SIG_IGN);
	many();
	bool sdp = tl_sdp_mode();
	int r3 = limited(3 * 1024);   /* room for one region, not for an arena */
	CHECK_EQ(r3, 1);
	int r1 = limited(1024);       /* not even for one region: TCP */
	CHECK_EQ(r1, 1);
	printf("ok: %d connections of 2 GiB regions at once; a server without room "
	       "for the arena talks SDP, without room for a region TCP%s\n", NCONN,
	       sdp ? " (declined)" : "");
	return 0;
}
