/*
 * Zero copy and peer death. The peer process is killed with SIGKILL
 * (1) while our 64 MiB blocking send waits for it to read (it has read
 * the first MiB), (2) while it sends us 64 MiB in one call and we are
 * reading its advertisement, (3) while our blocking recv of 1 MiB waits
 * with nothing queued (its buffer offered for Write ZCopy), (4) while it
 * streams 1 MiB sends into our blocked receives. Nothing hangs; the
 * survivor's send returns the partial count or EPIPE/ECONNRESET and the
 * next send fails with EPIPE/ECONNRESET, its receives return verified
 * data and then EOF or ECONNRESET, all within 1 s of the kill, as with
 * TCP. In sdp mode the counters show zero copy was running.
 */
#include "zclib.h"
#include <pthread.h>
#include <stdatomic.h>

#define T 65536
#define MiB (1u << 20)
#define BIG (64u * MiB)

/* ---- plumbing ------------------------------------------------------------ */

static uint16_t port;
static int lfd, rp[2];

/* A child connected to us with the threshold set; runs fn, never returns. */
static pid_t peer(void (*fn)(int fd))
{
	pid_t pid = tl_fork();
	if (pid == 0) {
		int fd = tl_connect(AF_INET, port);
		expect_transport(fd);
		tl_nodelay(fd);
		zc_thresh(fd, T);
		fn(fd);
		_exit(0);
	}
	return pid;
}

static int accept_peer(void)
{
	int s = SYS(accept(lfd, NULL, NULL));
	expect_transport(s);
	tl_nodelay(s);
	zc_thresh(s, T);
	return s;
}

static void wait_ready(void)
{
	char b;
	CHECK_EQ(read(rp[0], &b, 1), 1);
}

static void ready(void)
{
	CHECK_EQ(write(rp[1], "r", 1), 1);
}

static double kill_peer(pid_t pid)
{
	double t0 = tl_now();
	SYS(kill(pid, SIGKILL));
	return t0;
}

static void reap(pid_t pid)
{
	int st;
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFSIGNALED(st) && WTERMSIG(st) == SIGKILL,
	      "peer was not killed: status 0x%x", st);
}

/* After the peer's death: a send fails with EPIPE or ECONNRESET at once. */
static void send_fails(int s)
{
	static char b[MiB];
	double t0 = tl_now();
	errno = 0;
	ssize_t n = send(s, b, sizeof b, MSG_NOSIGNAL);
	int e = errno;
	CHECK(n == -1 && (e == EPIPE || e == ECONNRESET),
	      "send to a dead peer -> %zd errno %d (%s)", n, e, strerror(e));
	CHECK(tl_now() - t0 < 1.0, "send to a dead peer took %.3f s",
	      tl_now() - t0);
}

/* Receive until the end, verifying; end within 1 s of t_kill. */
static uint64_t drain_end(int s, uint64_t off, uint32_t seed, double t_kill,
			  const char *what)
{
	static uint8_t buf[MiB];
	for (;;) {
		errno = 0;
		ssize_t n = recv(s, buf, sizeof buf, 0);
		int e = errno;
		double dt = tl_now() - t_kill;
		if (n == 0 || (n < 0 && e == ECONNRESET)) {
			fprintf(stderr, "%s: %s after %llu bytes, %.3f s after "
				"the kill\n", what, n ? "ECONNRESET" : "EOF",
				(unsigned long long)off, dt);
			CHECK(dt < 1.0, "%s: end seen %.3f s after the kill",
			      what, dt);
			return off;
		}
		CHECK(n > 0, "%s: recv after the kill -> %zd errno %d (%s)",
		      what, n, e, strerror(e));
		CHECK_PAT(buf, (size_t)n, off, seed);
		off += (uint64_t)n;
		CHECK(dt < 1.0, "%s: still receiving %.3f s after the kill",
		      what, dt);
	}
}

/* ---- (1) the receiver dies while our send waits --------------------------- */

static void reads_one_mib(int fd)
{
	static uint8_t b[MiB];
	CHECK_EQ(recv(fd, b, MiB, MSG_WAITALL), (ssize_t)MiB);
	CHECK_PAT(b, MiB, 0, 1);
	ready();
	for (;;)
		pause();
}

struct snd { int fd; const uint8_t *p; size_t len; ssize_t ret; int err;
	     double t; };
static void *big_send(void *arg)
{
	struct snd *x = arg;
	errno = 0;
	x->ret = send(x->fd, x->p, x->len, MSG_NOSIGNAL);
	x->err = errno;
	x->t = tl_now();
	return NULL;
}

static void receiver_dies(uint8_t *big)
{
	tl_fill(big, BIG, 0, 1);
	pid_t pid = peer(reads_one_mib);
	int s = accept_peer();
	struct snd x = { s, big, BIG, 0, 0, 0 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, big_send, &x), 0);
	wait_ready();
	tl_idle_ms(50);		/* the send is waiting for the reader */
	double t0 = kill_peer(pid);
	CHECK_EQ(pthread_join(th, NULL), 0);
	reap(pid);
	double dt = x.t - t0;
	fprintf(stderr, "receiver killed: our send returned %zd (%s) %.3f s "
		"after the kill\n", x.ret, x.ret < 0 ? strerror(x.err) : "count",
		dt);
	CHECK(x.ret >= (ssize_t)MiB ? x.ret < (ssize_t)BIG
				    : (x.ret == -1 && (x.err == EPIPE ||
						       x.err == ECONNRESET)),
	      "send -> %zd errno %d (%s)", x.ret, x.err, strerror(x.err));
	CHECK(dt < 1.0, "blocked send returned %.3f s after the kill", dt);
	struct zc z = zc_get(s);
	if (tl_sdp_mode()) {
		CHECK(z.txr + z.txw > 0, "no zero copy ran");
		if (x.ret > 0)
			CHECK_EQ(z.tx, x.ret);
	}
	send_fails(s);
	SYS(close(s));
}

/* ---- (2) the sender dies while we read its advertisement ------------------- */

static void sends_big(int fd)
{
	uint8_t *b = malloc(BIG);
	CHECK(b != NULL);
	tl_fill(b, BIG, 0, 2);
	ready();
	tl_send_all(fd, b, BIG);
	TL_FAIL("the 64 MiB send completed before the kill");
}

static _Atomic uint64_t progress;
struct killer { pid_t pid; uint64_t at; double t; };
static void *killer(void *arg)
{
	struct killer *k = arg;
	while (atomic_load(&progress) < k->at)
		sched_yield();
	k->t = kill_peer(k->pid);
	return NULL;
}

static void sender_dies(void)
{
	static uint8_t buf[MiB + 64];
	pid_t pid = peer(sends_big);
	int s = accept_peer();
	wait_ready();
	struct killer k = { pid, 8 * MiB, 0 };
	atomic_store(&progress, 0);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, killer, &k), 0);
	uint64_t off = 0;
	/* read in 1 MiB receives (odd offset) until the killer fired */
	for (;;) {
		ssize_t n = recv(s, buf + 1, MiB, 0);
		CHECK(n > 0, "recv before the kill -> %zd", n);
		CHECK_PAT(buf + 1, (size_t)n, off, 2);
		off += (uint64_t)n;
		atomic_store(&progress, off);
		if (off >= 8 * MiB)
			break;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc z0 = zc_get(s);
	off = drain_end(s, off, 2, k.t, "sender killed mid Read ZCopy");
	reap(pid);
	CHECK(off < BIG);
	if (tl_sdp_mode())
		CHECK(z0.rxr > 0, "the 64 MiB send was not read by Read ZCopy "
		      "(b %llu w %llu)", (unsigned long long)z0.rxb,
		      (unsigned long long)z0.rxw);
	SYS(close(s));
}

/* ---- (3) our recv waits with its buffer offered; the idle sender dies ------ */

static void idles(int fd)
{
	(void)fd;
	ready();
	for (;;)
		pause();
}

struct rcv { int fd; uint8_t *p; size_t len; ssize_t ret; int err;
	     double t; int ready; };
static void *blocked_recv(void *arg)
{
	struct rcv *r = arg;
	CHECK_EQ(write(r->ready, "b", 1), 1);
	errno = 0;
	r->ret = recv(r->fd, r->p, r->len, 0);
	r->err = errno;
	r->t = tl_now();
	return NULL;
}

static void idle_sender_dies(void)
{
	static uint8_t buf[MiB];
	int bp[2];
	SYS(pipe(bp));
	pid_t pid = peer(idles);
	int s = accept_peer();
	wait_ready();
	struct rcv r = { s, buf, MiB, 0, 0, 0, bp[1] };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, blocked_recv, &r), 0);
	char b;
	CHECK_EQ(read(bp[0], &b, 1), 1);
	tl_idle_ms(50);		/* blocked in recv, buffer offered */
	double t0 = kill_peer(pid);
	CHECK_EQ(pthread_join(th, NULL), 0);
	reap(pid);
	double dt = r.t - t0;
	fprintf(stderr, "idle sender killed: blocked recv -> %zd (%s), %.3f s "
		"after the kill\n", r.ret, r.ret < 0 ? strerror(r.err) : "EOF",
		dt);
	CHECK(r.ret == 0 || (r.ret == -1 && r.err == ECONNRESET),
	      "recv -> %zd errno %d (%s)", r.ret, r.err, strerror(r.err));
	CHECK(dt < 1.0, "blocked recv returned %.3f s after the kill", dt);
	SYS(close(bp[0]));
	SYS(close(bp[1]));
	SYS(close(s));
}

/* ---- (4) the sender dies while writing into our receives ------------------- */

static void streams(int fd)
{
	static uint8_t b[MiB];
	ready();
	for (uint64_t off = 0;; off += MiB) {
		tl_fill(b, MiB, off, 4);
		/* Slower than the reader, surely: it waits, buffer offered. */
		tl_idle_ms(1);
		tl_send_all(fd, b, MiB);
	}
}

static void streaming_sender_dies(void)
{
	static uint8_t buf[MiB];
	pid_t pid = peer(streams);
	int s = accept_peer();
	wait_ready();
	struct killer k = { pid, 16 * MiB, 0 };
	atomic_store(&progress, 0);
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, killer, &k), 0);
	uint64_t off = 0;
	for (;;) {
		ssize_t n = recv(s, buf, MiB, 0);
		CHECK(n > 0, "recv before the kill -> %zd", n);
		CHECK_PAT(buf, (size_t)n, off, 4);
		off += (uint64_t)n;
		atomic_store(&progress, off);
		if (off >= 16 * MiB)
			break;
	}
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc z0 = zc_get(s);
	drain_end(s, off, 4, k.t, "sender killed mid Write ZCopy");
	reap(pid);
	if (tl_sdp_mode())
		CHECK(z0.rxw > 0, "the blocked receives were not written by "
		      "Write ZCopy (b %llu r %llu)", (unsigned long long)z0.rxb,
		      (unsigned long long)z0.rxr);
	SYS(close(s));
}

/* Optional argument: run some parts only (1-4), for diagnosis. */
int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : "1234";
	tl_watchdog(20);
	signal(SIGPIPE, SIG_IGN);
	lfd = tl_listen(AF_INET, &port);
	SYS(pipe(rp));
	uint8_t *big = malloc(BIG);
	CHECK(big != NULL);
	if (strchr(only, '1'))
		receiver_dies(big);
	free(big);
	if (strchr(only, '2'))
		sender_dies();
	if (strchr(only, '3'))
		idle_sender_dies();
	if (strchr(only, '4'))
		streaming_sender_dies();
	SYS(close(lfd));
	return 0;
}
