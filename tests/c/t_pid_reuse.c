/*
 * A server process that ends, and a new server process that gets its pid,
 * while the client process keeps what it learnt about the first: its
 * connection memory for that peer (arenas), the link of wake-ups it shared
 * with it, and whether the process that took the link is alive. None of
 * it may be trusted for the second process: its connections must work as
 * the first one's did, bytes checked in both directions.
 *
 * The pid is reused on purpose: the test runs as the first process of a
 * pid namespace of its own (nothing else forks there), and before each new
 * server it sets the namespace's last pid so that the server's fork gets
 * the pid of the one before. The servers end three ways: exiting with
 * their connections open, closing them first, and killed.
 * Needs CAP_SYS_ADMIN (unshare(CLONE_NEWPID), ns_last_pid): skipped without.
 */
#include "testlib.h"

#include <sched.h>
#include <sys/epoll.h>

#define ROUNDS 4
#define CONNS  6
#define BYTES  (96 * 1024)

enum end { END_EXIT_OPEN, END_CLOSE, END_KILL };

static int set_last_pid(pid_t p)
{
	int fd = open("/proc/sys/kernel/ns_last_pid", O_WRONLY | O_CLOEXEC);
	if (fd < 0)
		return -1;
	char b[32];
	int n = snprintf(b, sizeof b, "%d", (int)p);
	int r = write(fd, b, (size_t)n) == n ? 0 : -1;
	close(fd);
	return r;
}

/* The server: listens itself (the rendezvous is then its own: the
 * client's SO_PEERCRED names it) on port, 0 the first time, and reports
 * the port; accepts CONNS connections, reads BYTES of each, answers with
 * BYTES, waits for the client's word, then ends as told. */
static void server(uint16_t port, int round, int ready_w, int go_r, enum end how)
{
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(AF_INET, port, &ss);
	int l = SYS(socket(AF_INET, SOCK_STREAM, 0));
	int one = 1;
	SYS(setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
	SYS(bind(l, (struct sockaddr *)&ss, len));
	SYS(listen(l, 64));
	port = tl_port_of(l);
	CHECK_EQ(write(ready_w, &port, sizeof port), sizeof port);
	int c[CONNS];
	for (int i = 0; i < CONNS; i++) {
		c[i] = SYS(accept(l, NULL, NULL));
		expect_transport(c[i]);
		tl_recv_pat(c[i], 0, BYTES, (uint32_t)(round * 100 + i), 16384);
		tl_send_pat(c[i], 0, BYTES, (uint32_t)(round * 100 + 50 + i), 16384);
	}
	char b;
	CHECK_EQ(read(go_r, &b, 1), 1);
	if (how == END_CLOSE)
		for (int i = 0; i < CONNS; i++)
			SYS(close(c[i]));
	if (how == END_KILL)
		kill(getpid(), SIGKILL);
	_exit(0);
}

/* The client: the namespace's first process. */
static int client(void)
{
	tl_watchdog(30);
	uint16_t port = 0;
	pid_t first = 0;
	for (int round = 0; round < ROUNDS; round++) {
		/* the same pid as the first server's */
		if (round && set_last_pid(first - 1) < 0)
			TL_FAIL("ns_last_pid");
		int ready[2], go[2];
		SYS(pipe(ready));
		SYS(pipe(go));
		enum end how = (enum end)(round % 3);
		pid_t pid = tl_fork();
		if (pid == 0) {
			close(ready[0]);
			close(go[1]);
			if (round && getpid() != first) {
				fprintf(stderr, "round %d: server got pid %d, not %d\n",
					round, (int)getpid(), (int)first);
				_exit(3);
			}
			/* the same address and port: the same rendezvous name */
			server(port, round, ready[1], go[0], how);
		}
		close(ready[1]);
		close(go[0]);
		if (round == 0)
			first = pid;
		CHECK_EQ(pid, first);
		uint16_t p = 0;
		CHECK_EQ(read(ready[0], &p, sizeof p), sizeof p);
		CHECK(round == 0 || p == port, "round %d: port %u, not %u", round, p, port);
		port = p;
		int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
		int c[CONNS];
		for (int i = 0; i < CONNS; i++) {
			c[i] = tl_connect(AF_INET, port);
			expect_transport(c[i]);
			tl_send_pat(c[i], 0, BYTES, (uint32_t)(round * 100 + i), 16384);
			/* wait for the answer through epoll: a link's route */
			struct epoll_event ev = { .events = EPOLLIN, .data.fd = c[i] };
			SYS(epoll_ctl(ep, EPOLL_CTL_ADD, c[i], &ev));
			struct epoll_event out;
			int n;
			do
				n = epoll_wait(ep, &out, 1, 10000);
			while (n < 0 && errno == EINTR);
			CHECK_EQ(n, 1);
			CHECK_EQ(out.data.fd, c[i]);
			SYS(epoll_ctl(ep, EPOLL_CTL_DEL, c[i], NULL));
			tl_recv_pat(c[i], 0, BYTES, (uint32_t)(round * 100 + 50 + i), 16384);
		}
		CHECK_EQ(write(go[1], "g", 1), 1);
		/* The server ends; its connections end with it (EOF or reset,
		 * as on TCP), and ours are closed while their memory and the
		 * link stay cached for the next server of the same pid. */
		if (how == END_KILL) {
			int st;
			CHECK_EQ(waitpid(pid, &st, 0), pid);
			CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL, "killed");
		} else {
			tl_wait_ok(pid);
		}
		for (int i = 0; i < CONNS; i++) {
			char x;
			ssize_t r = recv(c[i], &x, 1, 0);
			CHECK(r == 0 || (r < 0 && errno == ECONNRESET),
			      "round %d conn %d: recv after the server ended: %zd", round, i, r);
			SYS(close(c[i]));
		}
		close(ep);
		close(ready[0]);
		close(go[1]);
	}
	return 0;
}

/* Wait for pid; its exit status (a signal fails the test). */
static int status_of(pid_t pid)
{
	int st;
	pid_t r;
	do
		r = waitpid(pid, &st, 0);
	while (r < 0 && errno == EINTR);
	if (r != pid)
		TL_FAIL("waitpid");
	if (WIFSIGNALED(st))
		TL_FAIL("process %d: signal %d", (int)pid, WTERMSIG(st));
	return WEXITSTATUS(st);
}

/* The namespace is made by a child of ours (its children are the
 * namespace's processes), not by this process: a process whose new
 * children would go into a namespace already gone cannot fork again (a
 * leak checker at our exit must). Every process of the namespace ends
 * with _exit. */
int main(void)
{
	tl_watchdog(40);
	fflush(NULL);
	pid_t maker = fork();
	if (maker < 0)
		TL_FAIL("fork");
	if (maker == 0) {
		if (unshare(CLONE_NEWPID) < 0) {
			printf("skip: no pid namespace (%s): needs CAP_SYS_ADMIN\n",
			       strerror(errno));
			_exit(77);
		}
		fflush(NULL);
		pid_t init = fork();
		if (init < 0)
			TL_FAIL("fork");
		if (init == 0) {
			if (set_last_pid(1) < 0) {
				printf("skip: ns_last_pid not writable (%s)\n", strerror(errno));
				_exit(77);
			}
			_exit(client());
		}
		_exit(status_of(init));
	}
	return status_of(maker);
}
