/*
 * Clients that bind before connecting: many client libraries bind the
 * wildcard address (0.0.0.0 or [::]) with port 0, or with a port of their
 * own, with SO_REUSEADDR, and then connect. The kernel keeps the bound port
 * and picks the source address at connect (a v4-mapped one for an IPv6
 * socket connecting to IPv4); such connections are on SDP like unbound
 * ones, with the same local and peer names as on TCP and the data intact
 * both ways. Also non-blocking (EINPROGRESS, then POLLOUT).
 */
#include "testlib.h"

#define NBYTES (300 * 1000)

/* A port nobody holds right now (bound, then released). */
static uint16_t spare_port(int family)
{
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(family, 0, &ss);
	int t = SYS(socket(family, SOCK_STREAM, 0));
	SYS(bind(t, (struct sockaddr *)&ss, len));
	uint16_t p = tl_port_of(t);
	SYS(close(t));
	return p;
}

/* Bind fd to the wildcard of its family with port (0 = any). false: the
 * port was taken meanwhile. */
static bool bind_any(int fd, int family, uint16_t port)
{
	int one = 1;
	SYS(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
	struct sockaddr_storage ss;
	memset(&ss, 0, sizeof ss);
	socklen_t len;
	if (family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_any;
		a->sin6_port = htons(port);
		len = sizeof *a;
	} else {
		struct sockaddr_in *a = (struct sockaddr_in *)&ss;
		a->sin_family = AF_INET;
		a->sin_addr.s_addr = htonl(INADDR_ANY);
		a->sin_port = htons(port);
		len = sizeof *a;
	}
	if (bind(fd, (struct sockaddr *)&ss, len) == 0)
		return true;
	CHECK(errno == EADDRINUSE, "bind to the wildcard");
	return false;
}

/* The IPv4 loopback destination as an IPv6 socket names it. */
static socklen_t v4mapped(uint16_t port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
	a->sin6_family = AF_INET6;
	a->sin6_port = htons(port);
	CHECK_EQ(inet_pton(AF_INET6, "::ffff:127.0.0.1", &a->sin6_addr), 1);
	return sizeof *a;
}

static bool same_name(const struct sockaddr_storage *a, const struct sockaddr_storage *b)
{
	if (a->ss_family != b->ss_family)
		return false;
	if (a->ss_family == AF_INET)
		return !memcmp(&((struct sockaddr_in *)a)->sin_addr,
			       &((struct sockaddr_in *)b)->sin_addr, 4) &&
		       ((struct sockaddr_in *)a)->sin_port == ((struct sockaddr_in *)b)->sin_port;
	return !memcmp(&((struct sockaddr_in6 *)a)->sin6_addr,
		       &((struct sockaddr_in6 *)b)->sin6_addr, 16) &&
	       ((struct sockaddr_in6 *)a)->sin6_port == ((struct sockaddr_in6 *)b)->sin6_port;
}

/* One client: socket of family cfam bound to its wildcard with port
 * (0, or a spare one), connected to the listener of family lfam (an IPv6
 * client of an IPv4 listener uses the v4-mapped address). */
static void one(const char *what, int cfam, int lfam, bool fixed, bool nonblock)
{
	uint16_t lport;
	int l = tl_listen(lfam, &lport);
	int c = -1;
	uint16_t want = 0;
	for (int tries = 0; c < 0; tries++) {
		CHECK(tries < 20, "%s: no spare port", what);
		c = SYS(socket(cfam, SOCK_STREAM | (nonblock ? SOCK_NONBLOCK : 0), 0));
		want = fixed ? spare_port(cfam) : 0;
		if (!bind_any(c, cfam, want)) {
			SYS(close(c));
			c = -1;
		}
	}
	uint16_t bound = tl_port_of(c);
	CHECK(bound != 0, "%s: bind gave no port", what);
	if (fixed)
		CHECK_EQ(bound, want);

	struct sockaddr_storage ss;
	socklen_t len = cfam == AF_INET6 && lfam == AF_INET ? v4mapped(lport, &ss)
							    : tl_addr(lfam, lport, &ss);
	if (nonblock) {
		CHECK_ERR(connect(c, (struct sockaddr *)&ss, len), EINPROGRESS);
		struct pollfd p = { c, POLLOUT, 0 };
		CHECK_EQ(poll(&p, 1, 5000), 1);
		CHECK_EQ(p.revents, POLLOUT);
		int err = -1;
		socklen_t el = sizeof err;
		SYS(getsockopt(c, SOL_SOCKET, SO_ERROR, &err, &el));
		CHECK_EQ(err, 0);
		int fl = SYS(fcntl(c, F_GETFL));
		SYS(fcntl(c, F_SETFL, fl & ~O_NONBLOCK));
	} else {
		SYS(connect(c, (struct sockaddr *)&ss, len));
	}
	int s = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	expect_transport(c);
	expect_transport(s);

	/* The kernel kept the bound port and chose a loopback address; the
	 * two ends name each other exactly. */
	struct sockaddr_storage cn, sp;
	socklen_t cl = sizeof cn, sl = sizeof sp;
	SYS(getsockname(c, (struct sockaddr *)&cn, &cl));
	SYS(getpeername(s, (struct sockaddr *)&sp, &sl));
	CHECK_EQ(tl_port_of(c), bound);
	if (cfam == lfam)
		CHECK(same_name(&cn, &sp), "%s: client's name is not the server's peer", what);
	if (cfam == AF_INET)
		CHECK_EQ(((struct sockaddr_in *)&cn)->sin_addr.s_addr, htonl(INADDR_LOOPBACK));

	tl_nodelay(c);
	tl_nodelay(s);
	pid_t pid = tl_fork();
	if (pid == 0) {
		tl_send_pat(s, 0, NBYTES, 72, 32768);
		tl_recv_pat(s, 0, NBYTES, 71, 65536);
		_exit(0);
	}
	tl_send_pat(c, 0, NBYTES, 71, 16384);
	tl_recv_pat(c, 0, NBYTES, 72, 65536);
	tl_wait_ok(pid);
	expect_bytes(c, NBYTES, NBYTES);
	SYS(close(c));
	SYS(close(s));
	printf("  %s: ok\n", what);
}

int main(void)
{
	tl_watchdog(30);
	one("0.0.0.0:0", AF_INET, AF_INET, false, false);
	one("0.0.0.0:<port>", AF_INET, AF_INET, true, false);
	one("0.0.0.0:<port>, non-blocking", AF_INET, AF_INET, true, true);
	if (!tl_have_ipv6()) {
		printf("no IPv6 loopback: IPv6 cases left out\n");
		return 0;
	}
	one("[::]:0 to ::1", AF_INET6, AF_INET6, false, false);
	one("[::]:<port> to ::1", AF_INET6, AF_INET6, true, false);
	one("[::]:0 to ::ffff:127.0.0.1", AF_INET6, AF_INET, false, false);
	one("[::]:<port> to ::ffff:127.0.0.1, non-blocking", AF_INET6, AF_INET, true, true);
	return 0;
}
