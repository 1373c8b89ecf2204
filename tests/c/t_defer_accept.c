/*
 * TCP_DEFER_ACCEPT on a listener (MooseFS sets it on all of its listeners):
 * a client that connects and sends its request at once must be accepted at
 * once, whether the option was set before or after listen(), and
 * getsockopt must report the value as the kernel rounds it. Kernel TCP
 * completes the connection when the request arrives; an SDP client's
 * request never travels on the TCP socket, so a listener that left the
 * option on its kernel socket would hold every SDP connection back for the
 * whole deferral (here 30 s; the check allows 10). A listener handed to
 * another program by exec must carry the deferral in its kernel socket
 * again.
 */
#include "testlib.h"

#define DEFER_S 30
#define READY_MS 10000

static int geti(int fd, int level, int opt)
{
	int v = -12345;
	socklen_t len = sizeof v;
	SYS(getsockopt(fd, level, opt, &v, &len));
	CHECK_EQ(len, sizeof v);
	return v;
}

static void seti(int fd, int level, int opt, int v)
{
	SYS(setsockopt(fd, level, opt, &v, sizeof v));
}

/* What the kernel reports back for a deferral of s seconds (it keeps a
 * number of SYN-ACK retransmissions): asked of a socket that is no
 * listener. */
static int kernel_rounding(int family, int s)
{
	int fd = SYS(socket(family, SOCK_STREAM, 0));
	seti(fd, SOL_TCP, TCP_DEFER_ACCEPT, s);
	int v = geti(fd, SOL_TCP, TCP_DEFER_ACCEPT);
	close(fd);
	return v;
}

static int make_listener(int family, bool before, uint16_t *port)
{
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(family, 0, &ss);
	int fd = SYS(socket(family, SOCK_STREAM, 0));
	seti(fd, SOL_SOCKET, SO_REUSEADDR, 1);
	if (before)
		seti(fd, SOL_TCP, TCP_DEFER_ACCEPT, DEFER_S);
	SYS(bind(fd, (struct sockaddr *)&ss, len));
	SYS(listen(fd, 16));
	if (!before)
		seti(fd, SOL_TCP, TCP_DEFER_ACCEPT, DEFER_S);
	*port = tl_port_of(fd);
	return fd;
}

static void run(int family, bool before)
{
	int want = kernel_rounding(family, DEFER_S);
	CHECK(want > 0);
	uint16_t port;
	int l = make_listener(family, before, &port);
	CHECK_EQ(geti(l, SOL_TCP, TCP_DEFER_ACCEPT), want);

	/* A request sent right after connect: the listener must be ready
	 * long before the deferral would run out. */
	int c = tl_connect(family, port);
	tl_send_all(c, "ping", 4);
	struct pollfd p = { .fd = l, .events = POLLIN };
	double t0 = tl_now();
	int n = poll(&p, 1, READY_MS);
	CHECK(n == 1, "listener not ready %.1f s after a client sent its request "
	      "(TCP_DEFER_ACCEPT %d s, set %s listen)", tl_now() - t0, DEFER_S,
	      before ? "before" : "after");
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(c);
	expect_transport(s);
	char buf[4];
	tl_recv_all(s, buf, 4);
	CHECK(memcmp(buf, "ping", 4) == 0);
	tl_send_all(s, "pong", 4);
	tl_recv_all(c, buf, 4);
	CHECK(memcmp(buf, "pong", 4) == 0);

	/* The value stays what the application set; 0 turns it off. */
	CHECK_EQ(geti(l, SOL_TCP, TCP_DEFER_ACCEPT), want);
	seti(l, SOL_TCP, TCP_DEFER_ACCEPT, 0);
	CHECK_EQ(geti(l, SOL_TCP, TCP_DEFER_ACCEPT), 0);
	seti(l, SOL_TCP, TCP_DEFER_ACCEPT, DEFER_S);
	CHECK_EQ(geti(l, SOL_TCP, TCP_DEFER_ACCEPT), want);
	int v = 1;
	CHECK_ERR(setsockopt(l, SOL_TCP, TCP_DEFER_ACCEPT, &v, 2), EINVAL);

	/* A second client on the same listener, after the changes. */
	int c2 = tl_connect(family, port);
	tl_send_all(c2, "ping", 4);
	p.revents = 0;
	CHECK_EQ(poll(&p, 1, READY_MS), 1);
	int s2 = SYS(accept(l, NULL, NULL));
	expect_transport(s2);
	tl_recv_all(s2, buf, 4);
	CHECK(memcmp(buf, "ping", 4) == 0);

	close(c2);
	close(s2);
	close(c);
	close(s);
	close(l);
}

/* The listener goes to a new program (exec): it must find the deferral. */
static void exec_keeps(int family)
{
	int want = kernel_rounding(family, DEFER_S);
	uint16_t port;
	int l = make_listener(family, true, &port);
	pid_t pid = SYS(fork());
	if (pid == 0) {
		char a[16], b[16];
		snprintf(a, sizeof a, "%d", l);
		snprintf(b, sizeof b, "%d", want);
		execl("/proc/self/exe", "t_defer_accept", "--inherited", a, b, (char *)NULL);
		_exit(2);
	}
	int st;
	SYS(waitpid(pid, &st, 0));
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "exec'd program saw another deferral "
	      "(status %#x)", st);
	close(l);
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--inherited")) {
		int fd = atoi(argv[2]);
		CHECK_EQ(geti(fd, SOL_TCP, TCP_DEFER_ACCEPT), atoi(argv[3]));
		return 0;
	}
	tl_watchdog(90);
	exec_keeps(AF_INET);
	run(AF_INET, true);
	run(AF_INET, false);
	run(AF_INET6, true);
	run(AF_INET6, false);
	return 0;
}
