/*
 * Isolation across users (root only): (1) a process that dropped to user
 * nobody cannot reach into the two processes of a live connection: their
 * /proc/PID/fd/N targets, /proc/PID/map_files and /proc/PID/mem cannot be
 * opened; (2) a server running as nobody and a client running as root
 * still exchange data byte-exactly, whatever transport they end up on.
 */
#include "testlib.h"
#include <dirent.h>
#include <grp.h>

#define SEED 13
#define NOBODY 65534

static void drop_to_nobody(void)
{
	SYS(setgroups(0, NULL));
	SYS(setresgid(NOBODY, NOBODY, NOBODY));
	SYS(setresuid(NOBODY, NOBODY, NOBODY));
	CHECK_EQ(geteuid(), NOBODY);
}

/* The descriptor numbers of pid, listed while we are still root. */
static int fd_numbers(pid_t pid, int *out, int max)
{
	char dir[64];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	DIR *d = opendir(dir);
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max)
		if (e->d_name[0] != '.')
			out[n++] = atoi(e->d_name);
	closedir(d);
	return n;
}

static void probe(pid_t pid, const int *fds, int nfd)
{
	char path[128];
	for (int i = 0; i < nfd; i++) {
		snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)pid, fds[i]);
		int r = open(path, O_RDONLY);
		CHECK(r < 0 && errno == EACCES, "nobody opened %s", path);
		r = open(path, O_RDWR);
		CHECK(r < 0 && errno == EACCES, "nobody opened %s rw", path);
	}
	snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
	CHECK(opendir(path) == NULL && errno == EACCES, "listed %s", path);
	snprintf(path, sizeof path, "/proc/%d/map_files", (int)pid);
	CHECK(opendir(path) == NULL && errno == EACCES, "listed %s", path);
	snprintf(path, sizeof path, "/proc/%d/mem", (int)pid);
	int r = open(path, O_RDONLY);
	CHECK(r < 0 && errno == EACCES, "nobody opened %s", path);
}

int main(void)
{
	uint16_t port;
	char b;

	tl_watchdog(20);
	if (geteuid() != 0)
		SKIP("needs root to switch users");

	/* (1) a live connection between us and a child, probed by nobody. */
	int l = tl_listen(AF_INET, &port);
	int go[2], done[2];
	SYS(pipe(go));
	SYS(pipe(done));
	pid_t peer = tl_fork();
	if (peer == 0) {
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		tl_send_pat(c, 0, 1u << 20, SEED, 65536);
		CHECK_EQ(write(go[1], "g", 1), 1);
		CHECK_EQ(read(done[0], &b, 1), 1);
		tl_send_pat(c, 1u << 20, 1u << 20, SEED, 65536);
		SYS(close(c));
		_exit(0);
	}
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	tl_recv_pat(s, 0, 1u << 20, SEED, 65536);
	CHECK_EQ(read(go[0], &b, 1), 1);
	int me_fds[256], peer_fds[256];
	int nme = fd_numbers(getpid(), me_fds, 256);
	int npeer = fd_numbers(peer, peer_fds, 256);
	pid_t me = getpid();
	pid_t spy = tl_fork();
	if (spy == 0) {
		drop_to_nobody();
		probe(me, me_fds, nme);
		probe(peer, peer_fds, npeer);
		_exit(0);
	}
	tl_wait_ok(spy);
	/* The connection is unharmed. */
	CHECK_EQ(write(done[1], "d", 1), 1);
	tl_recv_pat(s, 1u << 20, 1u << 20, SEED, 65536);
	CHECK_EQ(recv(s, &b, 1, 0), 0);
	tl_wait_ok(peer);
	SYS(close(s));
	SYS(close(l));

	/* (2) server as nobody, client as root. */
	int pp[2];
	SYS(pipe(pp));
	pid_t srv = tl_fork();
	if (srv == 0) {
		drop_to_nobody();
		uint16_t p2;
		int l2 = tl_listen(AF_INET, &p2);
		CHECK_EQ(write(pp[1], &p2, sizeof p2), (ssize_t)sizeof p2);
		int s2 = SYS(accept(l2, NULL, NULL));
		/* echo back, verifying */
		static char buf[65536];
		uint64_t off = 0;
		for (;;) {
			ssize_t n = recv(s2, buf, sizeof buf, 0);
			CHECK(n >= 0);
			if (n == 0)
				break;
			CHECK_PAT(buf, (size_t)n, off, SEED + 1);
			tl_send_all(s2, buf, (size_t)n);
			off += (uint64_t)n;
		}
		CHECK_EQ(off, 3u << 20);
		SYS(close(s2));
		_exit(0);
	}
	uint16_t p2;
	CHECK_EQ(read(pp[0], &p2, sizeof p2), (ssize_t)sizeof p2);
	int c2 = tl_connect(AF_INET, p2);
	int tr = -1;
	socklen_t tl = sizeof tr;
	if (getsockopt(c2, SOL_TCP, SDP_TRANSPORT, &tr, &tl) == 0)
		fprintf(stderr, "root client to nobody server: transport %s\n",
			tr == 1 ? "SDP" : "TCP");
	pid_t feeder = tl_fork();
	if (feeder == 0) {
		tl_send_pat(c2, 0, 3u << 20, SEED + 1, 50000);
		SYS(shutdown(c2, SHUT_WR));
		_exit(0);
	}
	tl_recv_pat(c2, 0, 3u << 20, SEED + 1, 65536);
	CHECK_EQ(recv(c2, &b, 1, 0), 0);
	tl_wait_ok(feeder);
	tl_wait_ok(srv);
	SYS(close(c2));
	return 0;
}
