/*
 * A server that cannot set up an SDP connection - here it has no address
 * space left for the connection's memory (RLIMIT_AS), as a server with
 * thousands of connections would not - serves it over TCP, as kernel TCP
 * would: both ends end up on the TCP connection with no byte lost, even
 * those the client had already posted into its ring. 2,000 connections,
 * each sending a checksummed request and reading a checksummed answer,
 * all kept open (so the server's address space fills up): all are served
 * exactly as on kernel TCP. Under SDP the first few dozen are on SDP and
 * the rest on TCP, and both ends agree on which.
 */
#include "testlib.h"
#include <sys/resource.h>

#define NCONN 2000
#define ROUND 50                  /* connections set up before reading answers */
#define REQ   8192

static int transport(int fd)
{
	int v = -1;
	socklen_t len = sizeof v;
	if (getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &len) < 0)
		return 0;                     /* kernel TCP */
	return v;
}

/* Serves nconn requests (a 4-byte index, then the index's pattern),
 * keeping every connection open; reports how many were on SDP. */
static void server(int l, int rep, int nconn)
{
	tl_watchdog(55);
	long kib = tl_vm_size_kib();
	CHECK(kib > 0);
	/* Room for a few dozen regions of 4 MiB, not for thousands. */
	struct rlimit rl = { (rlim_t)(kib + 160 * 1024) * 1024,
			     (rlim_t)(kib + 160 * 1024) * 1024 };
	SYS(setrlimit(RLIMIT_AS, &rl));
	static int fds[NCONN];
	static char buf[REQ];
	int nsdp = 0;
	for (int i = 0; i < nconn; i++) {
		int s = SYS(accept(l, NULL, NULL));
		fds[i] = s;
		tl_recv_all(s, buf, REQ);
		uint32_t idx;
		memcpy(&idx, buf, 4);
		CHECK(idx < NCONN, "request index %u", idx);
		CHECK_PAT(buf + 4, REQ - 4, 4, idx);
		tl_fill(buf, REQ, 0, idx + 1000);
		tl_send_all(s, buf, REQ);
		nsdp += transport(s) == 1;
	}
	CHECK_EQ(write(rep, &nsdp, sizeof nsdp), (ssize_t)sizeof nsdp);
	/* Until the client is done with all of them. */
	for (int i = 0; i < nconn; i++) {
		char b;
		CHECK_EQ(recv(fds[i], &b, 1, 0), 0);
		close(fds[i]);
	}
	_exit(0);
}

int main(void)
{
	tl_watchdog(55);
	signal(SIGPIPE, SIG_IGN);
	struct rlimit nf;
	SYS(getrlimit(RLIMIT_NOFILE, &nf));
	if (nf.rlim_max != RLIM_INFINITY && nf.rlim_max < NCONN + 200)
		SKIP("needs %d descriptors, the hard limit is %lu", NCONN + 200,
		     (unsigned long)nf.rlim_max);
	if (nf.rlim_cur == RLIM_INFINITY || nf.rlim_cur < NCONN + 200) {
		nf.rlim_cur = NCONN + 200;
		SYS(setrlimit(RLIMIT_NOFILE, &nf));
	}
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int p[2];
	SYS(pipe(p));
	fflush(NULL);
	pid_t pid = SYS(fork());
	if (pid == 0) {
		close(p[0]);
		server(l, p[1], NCONN);
	}
	close(p[1]);
	close(l);
	static int c[NCONN];
	static char buf[REQ];
	for (int r = 0; r < NCONN; r += ROUND) {
		for (int i = r; i < r + ROUND; i++) {
			c[i] = tl_connect(AF_INET, port);
			uint32_t idx = (uint32_t)i;
			tl_fill(buf, REQ, 0, idx);
			memcpy(buf, &idx, 4);
			tl_send_all(c[i], buf, REQ);
		}
		for (int i = r; i < r + ROUND; i++)
			tl_recv_pat(c[i], 0, REQ, (uint32_t)i + 1000, REQ);
	}
	int nsdp = 0;
	for (int i = 0; i < NCONN; i++)
		nsdp += transport(c[i]) == 1;
	int srv_sdp = -1;
	CHECK_EQ(read(p[0], &srv_sdp, sizeof srv_sdp), (ssize_t)sizeof srv_sdp);
	for (int i = 0; i < NCONN; i++)
		close(c[i]);
	tl_wait_ok(pid);
	CHECK_EQ(nsdp, srv_sdp);              /* both ends agree */
	if (tl_sdp_mode()) {
		CHECK(nsdp > 0, "no connection on SDP");
		CHECK(nsdp < NCONN, "every connection on SDP: the limit did not bite");
	} else {
		CHECK_EQ(nsdp, 0);
	}
	printf("ok: %d connections served, %d on SDP, %d on TCP\n", NCONN, nsdp,
	       NCONN - nsdp);
	return 0;
}
