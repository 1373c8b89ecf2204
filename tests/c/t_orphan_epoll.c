/*
 * A connection in an epoll set leaves SDP after its peer is gone, with the
 * peer's bytes still unread: the set must go on reporting it.
 *
 * A child connects, sends 100,000 bytes the server has not read, and
 * closes (case close) or is killed (case kill). The server, which holds
 * the connection in a level-triggered epoll set, then installs a seccomp
 * filter (allowing everything): every SDP connection of the process goes
 * to plain TCP first, and this one, whose peer can no longer take part,
 * becomes a socket that delivers the unread bytes (the same descriptor
 * number). epoll_wait must still report it readable, and reading it must
 * give exactly the 100,000 bytes, then EOF - as on kernel TCP, where the
 * bytes waited in the socket all along.
 */
#include "seccomplib.h"

#include <sys/epoll.h>

#define N 100000
#define SEED 41

static void run(bool kill_it)
{
	tl_watchdog(20);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int pp[2], go[2];
	SYS(pipe(pp));
	SYS(pipe(go));
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(pp[0]));
		SYS(close(go[1]));
		int fd = tl_connect(AF_INET, port);
		expect_transport(fd);
		char a;
		CHECK_EQ(read(go[0], &a, 1), 1);       /* accepted: a closing client
							* would take it back to TCP */
		tl_send_pat(fd, 0, N, SEED, 65536);
		CHECK_EQ(write(pp[1], "s", 1), 1);    /* all sent */
		if (kill_it)
			for (;;)
				pause();                  /* killed by the server */
		SYS(close(fd));
		_exit(0);
	}
	SYS(close(pp[1]));
	SYS(close(go[0]));
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	CHECK_EQ(write(go[1], "a", 1), 1);
	int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
	struct epoll_event ev = { .events = EPOLLIN, .data.u64 = 0x5eed };
	SYS(epoll_ctl(ep, EPOLL_CTL_ADD, s, &ev));
	char b;
	CHECK_EQ(read(pp[0], &b, 1), 1);
	if (kill_it) {
		SYS(kill(pid, SIGKILL));
		int st;
		CHECK_EQ(waitpid(pid, &st, 0), pid);
		CHECK(WIFSIGNALED(st));
	} else {
		tl_wait_ok(pid);
	}
	/* The filter: the library hands every connection to TCP before it. */
	static struct sc_filter f;
	static const struct sc_rule none[] = { { __NR_getpid, SECCOMP_RET_ALLOW } };
	sc_build(&f, none, 1, SECCOMP_RET_ALLOW);
	sc_install_prctl(&f);

	static char buf[65536];
	size_t got = 0;
	for (;;) {
		struct epoll_event out[4];
		int n = epoll_wait(ep, out, 4, 5000);
		CHECK(n == 1, "epoll_wait -> %d after %zu of %d bytes (the set lost the "
		      "connection)", n, got, N);
		CHECK_EQ(out[0].data.u64, (uint64_t)0x5eed);
		CHECK(out[0].events & EPOLLIN);
		ssize_t r = recv(s, buf, sizeof buf, MSG_DONTWAIT);
		if (r == 0)
			break;
		CHECK(r > 0, "recv: %s", strerror(errno));
		CHECK_PAT(buf, (size_t)r, got, SEED);
		got += (size_t)r;
		CHECK(got <= N);
	}
	CHECK_EQ(got, (size_t)N);
	SYS(close(ep));
	SYS(close(s));
	SYS(close(l));
}

static void case_close(void) { run(false); }
static void case_kill(void) { run(true); }

int main(void)
{
	static const struct tl_case cases[] = {
		{ "close", case_close },
		{ "kill", case_kill },
	};
	return tl_run_cases(cases, sizeof cases / sizeof *cases);
}
