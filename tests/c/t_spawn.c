/*
 * Programs started without fork+exec get an inherited socket as plain TCP,
 * with the stream intact: posix_spawn of a program that inherits the
 * socket (not close-on-exec), posix_spawn with a dup2 file action that puts
 * a close-on-exec socket on the child's stdin, system() and popen() running
 * a shell that writes into the socket. Each time the peer (another process)
 * first receives what was sent before, then the child's bytes, then ours,
 * in order and byte-exact, and the parent keeps using the socket.
 */
#include "testlib.h"
#include <spawn.h>

extern char **environ;

#define N (256u * 1024)
#define SEED 71

/* The peer: receives the whole expected stream on one connection and
 * answers "ok" once it has all of it. */
static pid_t peer(uint16_t *port, const char *mid)
{
	int l;
	pid_t pid = tl_fork_listener(port, &l);
	if (pid == 0) {
		tl_watchdog(20);
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		/* before: pattern 0..N; then the child's text; then N more */
		tl_recv_pat(s, 0, N, SEED, 65536);
		size_t ml = strlen(mid);
		char got[64];
		tl_recv_all(s, got, ml);
		CHECK(memcmp(got, mid, ml) == 0, "the child's bytes: '%.*s'",
		      (int)ml, got);
		tl_recv_pat(s, N, N, SEED, 40000);
		tl_send_all(s, "ok", 2);
		char x;
		CHECK_EQ(recv(s, &x, 1, 0), 0);
		SYS(close(s));
		_exit(0);
	}
	return pid;
}

static int connect_and_send_first(uint16_t port)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	tl_send_pat(c, 0, N, SEED, 32768);
	return c;
}

static void finish(int c, pid_t pid)
{
	tl_send_pat(c, N, N, SEED, 50000);
	char ok[2];
	tl_recv_all(c, ok, 2);
	CHECK(memcmp(ok, "ok", 2) == 0);
	if (tl_sdp_mode()) {
		int t = -1;
		socklen_t l = sizeof t;
		SYS(getsockopt(c, SOL_TCP, SDP_TRANSPORT, &t, &l));
		CHECK(t == 0, "the socket is still on SDP after the child used it");
	}
	SYS(close(c));
	tl_wait_ok(pid);
}

static char self[4096];

static void c_spawn_inherit(void)
{
	uint16_t port;
	pid_t pp = peer(&port, "spawned");
	int c = connect_and_send_first(port);
	char a[16];
	snprintf(a, sizeof a, "%d", c);
	char *argv[] = { self, "child", a, "spawned", NULL };
	pid_t k;
	CHECK_EQ(posix_spawn(&k, self, NULL, NULL, argv, environ), 0);
	tl_wait_ok(k);
	finish(c, pp);
}

static void c_spawn_dup2(void)
{
	uint16_t port;
	pid_t pp = peer(&port, "on-stdin");
	int c = connect_and_send_first(port);
	SYS(fcntl(c, F_SETFD, FD_CLOEXEC));
	posix_spawn_file_actions_t fa;
	CHECK_EQ(posix_spawn_file_actions_init(&fa), 0);
	CHECK_EQ(posix_spawn_file_actions_adddup2(&fa, c, 0), 0);
	char *argv[] = { self, "child", "0", "on-stdin", NULL };
	pid_t k;
	CHECK_EQ(posix_spawnp(&k, self, &fa, NULL, argv, environ), 0);
	CHECK_EQ(posix_spawn_file_actions_destroy(&fa), 0);
	tl_wait_ok(k);
	finish(c, pp);
}

static void c_system(void)
{
	uint16_t port;
	pid_t pp = peer(&port, "from-system");
	int c = connect_and_send_first(port);
	char cmd[64];
	snprintf(cmd, sizeof cmd, "printf from-system >&%d", c);
	CHECK_EQ(system(cmd), 0);
	finish(c, pp);
}

static void c_popen(void)
{
	uint16_t port;
	pid_t pp = peer(&port, "from-popen");
	int c = connect_and_send_first(port);
	char cmd[64];
	snprintf(cmd, sizeof cmd, "printf from-popen >&%d; echo done", c);
	FILE *f = popen(cmd, "r");
	CHECK(f != NULL, "popen");
	char line[16] = "";
	CHECK(fgets(line, sizeof line, f) != NULL);
	CHECK(strcmp(line, "done\n") == 0, "popen read '%s'", line);
	CHECK_EQ(pclose(f), 0);
	finish(c, pp);
}

/* The spawned program: writes its text into the inherited socket. */
static int child_main(int fd, const char *text)
{
	tl_watchdog(20);
	tl_send_all(fd, text, strlen(text));
	return 0;
}

static const struct tl_case cases[] = {
	{ "spawn",       c_spawn_inherit },
	{ "spawn-dup2",  c_spawn_dup2 },
	{ "system",      c_system },
	{ "popen",       c_popen },
};

int main(int argc, char **argv)
{
	if (argc == 4 && strcmp(argv[1], "child") == 0)
		return child_main(atoi(argv[2]), argv[3]);
	tl_watchdog(60);
	signal(SIGPIPE, SIG_IGN);
	ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
	CHECK(n > 0);
	self[n] = 0;
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
