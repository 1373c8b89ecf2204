/*
 * A program that closes every descriptor it does not know (a daemon's
 * start, a close loop over all numbers, close_range, closefrom) keeps its
 * own connections and gets new ones on the same transport afterwards. The
 * library's own descriptors are not open to it: close, dup, fcntl, fstat
 * and epoll_ctl on their numbers fail with EBADF, as for a number that is
 * not open; dup2 of a file onto them goes ahead (the listener keeps
 * accepting, on TCP once its rendezvous is gone, the old connection keeps
 * its bytes, and closing the listener leaves the program's files open).
 * Data is checked on the old connection and on each new one.
 */
#include <dirent.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "testlib.h"

#define SEED 53

static int keep[8];
static int nkeep;

static bool kept(int fd)
{
	for (int i = 0; i < nkeep; i++)
		if (keep[i] == fd)
			return true;
	return false;
}

/* A fresh connection to the listener, checked both ways, then closed;
 * any: on whichever transport. */
static void fresh_on(int l, uint16_t port, int round, bool any)
{
	int c = tl_connect(AF_INET, port);
	int s = SYS(accept(l, NULL, NULL));
	if (!any) {
		expect_transport(c);
		expect_transport(s);
	}
	tl_send_pat(c, 0, 300000, SEED + round, 65536);
	tl_recv_pat(s, 0, 300000, SEED + round, 65536);
	tl_send_pat(s, 0, 5000, SEED + round + 1, 5000);
	tl_recv_pat(c, 0, 5000, SEED + round + 1, 5000);
	SYS(close(c));
	char b;
	CHECK_EQ(recv(s, &b, 1, 0), 0);
	SYS(close(s));
}

static void fresh(int l, uint16_t port, int round)
{
	fresh_on(l, port, round, false);
}

/* The old connection still carries data, in order. */
static uint64_t old_off;
static void old_ok(int c, int s)
{
	tl_send_pat(c, old_off, 70000, SEED, 7000);
	tl_recv_pat(s, old_off, 70000, SEED, 70000);
	old_off += 70000;
}

/* Numbers open in this process that the program did not open itself: the
 * library's. Each is closed to the program. */
static int lib[64];

static int others(int ep)
{
	int n = 0, lfd[64];
	DIR *d = opendir("/proc/self/fd");
	CHECK(d != NULL);
	struct dirent *de;
	while ((de = readdir(d)) != NULL) {
		int fd = atoi(de->d_name);
		if (de->d_name[0] == '.' || fd <= 2 || fd == dirfd(d) || kept(fd) || fd == ep)
			continue;
		if (n < 64)
			lfd[n++] = fd;
	}
	closedir(d);
	for (int i = 0; i < n; i++) {
		struct epoll_event ev = { .events = EPOLLIN };
		CHECK_ERR(epoll_ctl(ep, EPOLL_CTL_ADD, lfd[i], &ev), EBADF);
		CHECK_ERR(dup(lfd[i]), EBADF);
		struct stat st;
		CHECK_ERR(fstat(lfd[i], &st), EBADF);
		CHECK_ERR(fstatat(lfd[i], "", &st, AT_EMPTY_PATH), EBADF);
		CHECK_ERR(fcntl(lfd[i], F_GETFD), EBADF);
		CHECK_ERR(dup2(lfd[i], 50), EBADF);
		CHECK_ERR(close(lfd[i]), EBADF);
	}
	memcpy(lib, lfd, sizeof lfd);
	return n;
}

int main(void)
{
	tl_watchdog(30);
	signal(SIGPIPE, SIG_IGN);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int c, s;
	c = tl_connect(AF_INET, port);
	s = SYS(accept(l, NULL, NULL));
	expect_transport(c);
	expect_transport(s);
	keep[nkeep++] = l;
	keep[nkeep++] = c;
	keep[nkeep++] = s;
	old_ok(c, s);
	fresh(l, port, 1);

	struct rlimit rl;
	SYS(getrlimit(RLIMIT_NOFILE, &rl));
	int lim = rl.rlim_cur > (1u << 20) ? (1 << 20) : (int)rl.rlim_cur;

	/* 1: close() over every number. */
	for (int fd = 3; fd < lim; fd++)
		if (!kept(fd))
			close(fd);
	old_ok(c, s);
	fresh(l, port, 2);

	/* 2: close_range around what we keep. */
	int lo = 3;
	for (int fd = 3; fd <= l || fd <= c || fd <= s; fd++)
		if (kept(fd)) {
			if (fd > lo)
				SYS(close_range((unsigned)lo, (unsigned)fd - 1, 0));
			lo = fd + 1;
		}
	SYS(close_range((unsigned)lo, ~0u, 0));
	old_ok(c, s);
	fresh(l, port, 3);

	/* 3: closefrom above what we keep. */
	closefrom(lo);
	old_ok(c, s);
	fresh(l, port, 4);

	/* 4: the library's numbers, one by one. */
	int ep = SYS(epoll_create1(EPOLL_CLOEXEC));
	int n = others(ep);
	if (tl_sdp_mode())
		CHECK(n > 0);             /* its rendezvous at least */
	else
		CHECK_EQ(n, 0);
	SYS(close(ep));
	old_ok(c, s);
	fresh(l, port, 5);

	/* 5: dup2 of a file onto those numbers goes ahead, as onto any
	 * number not open: the library no longer has them. The listener
	 * keeps accepting (SDP is no longer offered on it), and closing
	 * it later leaves the program's files alone. */
	int f = SYS(open("/dev/null", O_RDWR));
	for (int i = 0; i < n; i++)
		CHECK_EQ(dup2(f, lib[i]), lib[i]);
	SYS(close(f));
	for (int i = 0; i < 3; i++)
		fresh_on(l, port, 6 + i, true);
	old_ok(c, s);

	SYS(close(c));
	char b;
	CHECK_EQ(recv(s, &b, 1, 0), 0);
	SYS(close(s));
	SYS(close(l));
	for (int i = 0; i < n; i++) {
		CHECK(fcntl(lib[i], F_GETFD) >= 0, "fd %d closed", lib[i]);
		SYS(close(lib[i]));
	}
	return 0;
}
