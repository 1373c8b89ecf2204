/*
 * A server that cannot set up an SDP connection (here: no address space
 * left for the connection's memory, RLIMIT_AS) before it attached serves
 * it over TCP, as kernel TCP would: it declines the client's offer
 * through the region's header, and the client, committed to SDP since
 * its hello, hands what it posted back on the TCP connection. The server
 * application sees every connection, on TCP, and every exchange works:
 * an echo, and a client that sends nothing and only ends its side (EOF
 * both ways, no reset). The same program under kernel TCP behaves the
 * same. (Before, such connections were reset.)
 */
#include "testlib.h"
#include <sys/resource.h>

/* Echo server with almost no address space left: reports on `rep` how
 * many connections accept() returned. */
static void server(int l, int rep, int go, int nconn)
{
	tl_watchdog(30);
	long kib = tl_vm_size_kib();
	CHECK(kib > 0);
	struct rlimit rl = { (rlim_t)(kib + 2048) * 1024, (rlim_t)(kib + 2048) * 1024 };
	SYS(setrlimit(RLIMIT_AS, &rl));
	int got = 0, fired = 0;
	struct timeval tv = { 3, 0 };      /* then nothing more comes */
	SYS(setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	for (int i = 0; i < nconn; i++) {
		char g;
		if (i == nconn - 1)           /* the last client has closed */
			CHECK_EQ(read(go, &g, 1), 1);
		int s = accept(l, NULL, NULL);
		if (s < 0)
			break;                /* timed out: nothing more comes */
		got++;
		int v = -1;
		socklen_t vl = sizeof v;
		if (getsockopt(s, SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0)
			CHECK_EQ(v, 0);       /* declined: TCP */
		/* a real server waits for the request as long as it takes */
		struct timeval forever = { 0, 0 };
		SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever));
		char buf[64];
		ssize_t n = recv(s, buf, 4, MSG_WAITALL);
		if (n == 4 && !memcmp(buf, "fire", 4)) {
			/* its client closed right after sending */
			CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
			fired++;
		} else if (n > 0) {
			tl_send_all(s, buf, (size_t)n);
		}
		close(s);
	}
	CHECK_EQ(write(rep, &got, sizeof got), (ssize_t)sizeof got);
	CHECK_EQ(write(rep, &fired, sizeof fired), (ssize_t)sizeof fired);
	_exit(0);
}

/* A client that sends nothing, only ends its side: TCP's server reads
 * EOF and closes, so it reads EOF. 1 = EOF, 0 = reset. */
static int quiet(uint16_t port)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	struct timeval tv = { 5, 0 };
	SYS(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	SYS(shutdown(c, SHUT_WR));
	char buf[8];
	ssize_t n = recv(c, buf, sizeof buf, 0);
	CHECK(n <= 0 && (n == 0 || errno == ECONNRESET), "recv returned %zd", n);
	close(c);
	return n == 0;
}

/* A client that sends and closes at once, most likely before the server
 * looked at its connection: its bytes must reach the server all the same
 * (the client takes the connection back for TCP at its close). */
static void fire(uint16_t port)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	tl_send_all(c, "fire", 4);
	SYS(close(c));
}

/* One client exchange: 1 = echoed, 0 = reset. */
static int ping(uint16_t port)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);              /* the client did commit to SDP */
	bool sdp = tl_sdp_mode() == 1;
	struct timeval tv = { 5, 0 };
	SYS(setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	ssize_t k = send(c, "ping", 4, MSG_NOSIGNAL);
	int res;
	if (k < 0) {
		CHECK(errno == ECONNRESET || errno == EPIPE, "send");
		res = 0;
	} else {
		CHECK_EQ(k, 4);
		char buf[8];
		ssize_t n = recv(c, buf, sizeof buf, MSG_WAITALL);
		CHECK(n >= 0 || errno != EAGAIN,
		      "no answer and no reset within 5 s: the two ends wait for each other");
		if (n < 0) {
			CHECK(errno == ECONNRESET, "recv");
			res = 0;
		} else if (n == 0) {
			res = 0;              /* closed by the reset before any data */
		} else {
			CHECK_EQ(n, 4);
			CHECK(!memcmp(buf, "ping", 4));
			res = 1;
		}
	}
	if (sdp && res) {                 /* both ends went to TCP */
		int v = -1;
		socklen_t vl = sizeof v;
		SYS(getsockopt(c, SOL_TCP, SDP_TRANSPORT, &v, &vl));
		CHECK_EQ(v, 0);
	}
	close(c);
	return res;
}

int main(void)
{
	tl_watchdog(60);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int p[2], g[2];
	SYS(pipe(p));
	SYS(pipe(g));
	fflush(NULL);
	pid_t pid = SYS(fork());
	if (pid == 0) {
		close(p[0]);
		close(g[1]);
		server(l, p[1], g[0], 4);
	}
	close(p[1]);
	close(l);
	bool sdp = tl_sdp_mode() == 1;
	for (int i = 0; i < 2; i++)
		CHECK_EQ(ping(port), 1);
	CHECK_EQ(quiet(port), 1);
	fire(port);
	CHECK_EQ(write(g[1], "g", 1), 1);
	int got = -1, fired = -1;
	CHECK_EQ(read(p[0], &got, sizeof got), (ssize_t)sizeof got);
	CHECK_EQ(read(p[0], &fired, sizeof fired), (ssize_t)sizeof fired);
	CHECK_EQ(got, 4);                     /* the application saw all four */
	CHECK_EQ(fired, 1);
	tl_wait_ok(pid);
	printf("ok: all served over TCP%s\n", sdp ? " (declined SDP)" : "");
	return 0;
}
