/*
 * A server that cannot serve an SDP client (here: no address space left
 * for the connection's memory, RLIMIT_AS) must not keep the connection
 * as TCP on its side while the client, committed to SDP since it said
 * hello, waits in shared memory: the two would wait for each other for
 * ever. The connection is reset instead - the client sees ECONNRESET
 * (or EPIPE) - and the server application never sees it: its accept()
 * goes on to the next connection, and the server keeps working. Under
 * kernel TCP the same program simply gets its echo.
 */
#include "testlib.h"
#include <sys/resource.h>

static long vm_size_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmSize: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

/* Echo server with almost no address space left: reports on `rep` how
 * many connections accept() returned. */
static void server(int l, int rep, int nconn)
{
	tl_watchdog(30);
	long kib = vm_size_kib();
	CHECK(kib > 0);
	struct rlimit rl = { (rlim_t)(kib + 2048) * 1024, (rlim_t)(kib + 2048) * 1024 };
	SYS(setrlimit(RLIMIT_AS, &rl));
	int got = 0;
	struct timeval tv = { 3, 0 };      /* then nothing more comes */
	SYS(setsockopt(l, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
	for (int i = 0; i < nconn; i++) {
		int s = accept(l, NULL, NULL);
		if (s < 0)
			break;                /* timed out: nothing more comes */
		got++;
		/* a real server waits for the request as long as it takes */
		struct timeval forever = { 0, 0 };
		SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever));
		char buf[64];
		ssize_t n = recv(s, buf, sizeof buf, 0);
		if (n > 0)
			tl_send_all(s, buf, (size_t)n);
		close(s);
	}
	CHECK_EQ(write(rep, &got, sizeof got), (ssize_t)sizeof got);
	_exit(0);
}

/* A client that sends nothing, only ends its side: TCP's server reads
 * EOF and closes, so it reads EOF; refused under SDP, it must see the
 * reset itself (ECONNRESET), not an orderly end - the server never took
 * part in the connection. 1 = EOF, 0 = reset. */
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

/* One client exchange: 1 = echoed, 0 = reset. */
static int ping(uint16_t port)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);              /* the client did commit to SDP */
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
	close(c);
	return res;
}

int main(void)
{
	tl_watchdog(60);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int p[2];
	SYS(pipe(p));
	fflush(NULL);
	pid_t pid = SYS(fork());
	if (pid == 0) {
		close(p[0]);
		server(l, p[1], 3);
	}
	close(p[1]);
	close(l);
	bool sdp = tl_sdp_mode() == 1;
	for (int i = 0; i < 2; i++) {
		int echoed = ping(port);
		CHECK_EQ(echoed, sdp ? 0 : 1);
	}
	CHECK_EQ(quiet(port), sdp ? 0 : 1);
	int got = -1;
	CHECK_EQ(read(p[0], &got, sizeof got), (ssize_t)sizeof got);
	/* Under SDP the application saw no connection (accept went on and
	 * finally timed out); under TCP it served all three. */
	CHECK_EQ(got, sdp ? 0 : 3);
	tl_wait_ok(pid);
	printf("ok: %s\n", sdp ? "every SDP client reset, server never saw them"
			       : "all served over TCP");
	return 0;
}
