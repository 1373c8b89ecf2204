/*
 * Peer failure: a peer process killed with SIGKILL mid-transfer. The
 * survivor's poll reports POLLIN/POLLHUP/POLLERR within 1 s, its receives
 * return the data that was sent (byte-exact) and then 0 or ECONNRESET;
 * a send blocked on a full socket returns EPIPE or ECONNRESET within 1 s
 * of the kill. After both ends have exited no new file is left in
 * /dev/shm.
 */
#include "testlib.h"
#include <dirent.h>
#include <pthread.h>

#define SEED 91

static int list_shm(char names[][256], int max)
{
	DIR *d = opendir("/dev/shm");
	if (!d)
		return 0;
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)) && n < max) {
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			snprintf(names[n++], 256, "%s", e->d_name);
	}
	closedir(d);
	return n;
}

/* Child: connects and streams the pattern until killed. */
static pid_t streamer(uint16_t port, int ready_fd)
{
	pid_t pid = tl_fork();
	if (pid == 0) {
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		CHECK_EQ(write(ready_fd, "r", 1), 1);
		static char buf[16384];
		for (uint64_t off = 0;; off += sizeof buf) {
			tl_fill(buf, sizeof buf, off, SEED);
			tl_send_all(c, buf, sizeof buf);
		}
	}
	return pid;
}

/* Child: connects and never reads. */
static pid_t sleeper(uint16_t port, int ready_fd)
{
	pid_t pid = tl_fork();
	if (pid == 0) {
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		CHECK_EQ(write(ready_fd, "r", 1), 1);
		for (;;)
			pause();	/* until killed */
	}
	return pid;
}

struct blk { int fd; ssize_t ret; int err; double t; };
static void *blocked_send(void *arg)
{
	struct blk *b = arg;
	static char buf[65536];
	memset(buf, 'k', sizeof buf);
	errno = 0;
	b->ret = send(b->fd, buf, sizeof buf, MSG_NOSIGNAL);
	b->err = errno;
	b->t = tl_now();
	return NULL;
}

static void survivor(void)
{
	uint16_t port;
	int rp[2];
	char b;
	static char buf[65536];

	int l = tl_listen(AF_INET, &port);
	SYS(pipe(rp));

	/* --- killed while sending to us. */
	pid_t pid = streamer(port, rp[1]);
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	CHECK_EQ(read(rp[0], &b, 1), 1);
	uint64_t off = 0;
	while (off < (2u << 20)) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		CHECK(n > 0);
		CHECK_PAT(buf, (size_t)n, off, SEED);
		off += (uint64_t)n;
	}
	SYS(kill(pid, SIGKILL));
	int st;
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL);
	double t0 = tl_now();
	/* Data already sent may still be queued: drain it, verifying,
	 * until the end of the stream shows. */
	for (;;) {
		struct pollfd p = { s, POLLIN, 0 };
		CHECK_EQ(poll(&p, 1, 1000), 1);
		CHECK(p.revents & (POLLIN | POLLHUP | POLLERR));
		ssize_t n = recv(s, buf, sizeof buf, MSG_DONTWAIT);
		if (n == 0)
			break;
		if (n < 0) {
			CHECK(errno == ECONNRESET, "recv after peer death");
			break;
		}
		CHECK_PAT(buf, (size_t)n, off, SEED);
		off += (uint64_t)n;
		CHECK(tl_now() - t0 < 1.0, "still receiving 1 s after kill");
	}
	double dt = tl_now() - t0;
	CHECK(dt < 1.0, "end of stream seen %.3f s after the kill", dt);
	fprintf(stderr, "receiver: %llu bytes, end seen after %.3f s\n",
		(unsigned long long)off, dt);
	SYS(close(s));

	/* --- killed while we are blocked sending to it. */
	pid = sleeper(port, rp[1]);
	s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	CHECK_EQ(read(rp[0], &b, 1), 1);
	memset(buf, 'f', sizeof buf);
	while (send(s, buf, sizeof buf, MSG_DONTWAIT) > 0)
		;
	CHECK_EQ(errno, EAGAIN);
	struct blk bk = { .fd = s };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, blocked_send, &bk), 0);
	tl_idle_ms(100);	/* let it block */
	t0 = tl_now();
	SYS(kill(pid, SIGKILL));
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	dt = bk.t - t0;
	CHECK(bk.ret == -1 && (bk.err == EPIPE || bk.err == ECONNRESET),
	      "blocked send returned %zd errno %d (%s)", bk.ret, bk.err,
	      strerror(bk.err));
	CHECK(dt < 1.0, "blocked send returned %.3f s after the kill", dt);
	fprintf(stderr, "sender: %s after %.3f s\n", strerror(bk.err), dt);
	struct pollfd p = { s, POLLOUT, 0 };
	CHECK_EQ(poll(&p, 1, 1000), 1);
	CHECK(p.revents & (POLLERR | POLLHUP));
	SYS(close(s));
	SYS(close(l));
}

int main(void)
{
	static char before[512][256], after[512][256];

	tl_watchdog(20);
	int nb = list_shm(before, 512);
	pid_t pid = tl_fork();
	if (pid == 0) {
		survivor();
		_exit(0);
	}
	tl_wait_ok(pid);
	int na = list_shm(after, 512);
	int leaked = 0;
	for (int i = 0; i < na; i++) {
		int found = 0;
		for (int j = 0; j < nb && !found; j++)
			found = strcmp(after[i], before[j]) == 0;
		if (!found) {
			fprintf(stderr, "left in /dev/shm: %s\n", after[i]);
			leaked++;
		}
	}
	CHECK_EQ(leaked, 0);
	return 0;
}
