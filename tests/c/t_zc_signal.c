/*
 * Zero copy and signals. A SIGALRM every millisecond (handler without
 * SA_RESTART, then with SA_RESTART) hits a process sending 64 MiB in
 * blocking sends (more rounds of 64 MiB until a send was cut short), then
 * a process receiving 64 MiB in blocking receives.
 * The program loops on partial counts and EINTR as a TCP program must;
 * every byte arrives exactly once and in order (pattern over the whole
 * stream, then EOF), so a call that returned EINTR or a count other than
 * what it moved would show as lost or duplicated bytes. With SA_RESTART
 * (no timeout set) the calls restart and EINTR is never returned.
 * SO_SNDTIMEO and SO_RCVTIMEO with zero copy: EAGAIN after about the
 * timeout when the peer neither reads nor writes, the partial count when
 * it moved some, and the stream continues byte-exact afterwards.
 * In sdp mode the counters show zero copy ran and agree on both ends.
 */
#include "zclib.h"
#include <pthread.h>
#include <sys/prctl.h>
#include <sys/time.h>

#define T 65536
#define MiB (1u << 20)
#define TOTAL (64u * MiB)

/* ---- the storm ---------------------------------------------------------- */

static volatile sig_atomic_t nsig;
static void on_alrm(int sig)
{
	(void)sig;
	nsig++;
}

/* In the storm process: SIGALRM every ms (ITIMER_REAL, so the watchdog
 * moves to a CLOCK_MONOTONIC timer on SIGUSR2). */
static void storm_start(int restart, unsigned watchdog_secs)
{
	SYS(prctl(PR_SET_PDEATHSIG, SIGKILL));
	alarm(0);
	tl_watchdog_secs = watchdog_secs;
	signal(SIGUSR2, tl_alarm);
	struct sigevent sev = { .sigev_notify = SIGEV_SIGNAL,
				.sigev_signo = SIGUSR2 };
	timer_t wd;
	SYS(timer_create(CLOCK_MONOTONIC, &sev, &wd));
	struct itimerspec its = { .it_value = { watchdog_secs, 0 } };
	SYS(timer_settime(wd, 0, &its, NULL));

	struct sigaction sa = { .sa_handler = on_alrm };
	sigemptyset(&sa.sa_mask);
	sa.sa_flags = restart ? SA_RESTART : 0;
	SYS(sigaction(SIGALRM, &sa, NULL));
	struct itimerval iv = { { 0, 1000 }, { 0, 1000 } };
	SYS(setitimer(ITIMER_REAL, &iv, NULL));
}

static void storm_stop(void)
{
	struct itimerval iv = { { 0, 0 }, { 0, 0 } };
	SYS(setitimer(ITIMER_REAL, &iv, NULL));
}

struct report { struct zc z; uint64_t calls, eintr, partial, sigs, sent; };

/* Storm process, sending: rounds of 64 MiB in blocking sends of up to
 * 16 MiB, until the storm has really hit the sends (signals delivered and
 * a send cut short by one) or after 32 rounds. A fast reader can consume a
 * whole round while the sender is still spinning, where a signal cannot
 * interrupt anything, so one round is not always enough. */
static void storm_sender(uint16_t port, int restart, int rep)
{
	uint8_t *buf = malloc(TOTAL);
	CHECK(buf != NULL);
	int fd = tl_connect(AF_INET, port);
	expect_transport(fd);
	zc_thresh(fd, T);
	struct report r = { 0 };
	storm_start(restart, 20);
	for (uint64_t round = 0; round < 32; round++) {
		if (round > 0 && nsig > 50 && r.eintr + r.partial > 0)
			break;
		tl_fill(buf, TOTAL, round * TOTAL, 100 + (uint32_t)restart);
		size_t off = 0;
		while (off < TOTAL) {
			size_t want = TOTAL - off < 16 * MiB ? TOTAL - off : 16 * MiB;
			r.calls++;
			ssize_t n = send(fd, buf + off, want, 0);
			if (n < 0) {
				CHECK(errno == EINTR, "send under signals");
				CHECK(!restart, "send returned EINTR under SA_RESTART "
				      "(no SO_SNDTIMEO)");
				r.eintr++;
				continue;
			}
			CHECK(n > 0 && (size_t)n <= want, "send -> %zd", n);
			if ((size_t)n < want)
				r.partial++;
			off += (size_t)n;
		}
		r.sent += TOTAL;
	}
	storm_stop();
	r.sigs = (uint64_t)nsig;
	r.z = zc_get(fd);
	CHECK_EQ(write(rep, &r, sizeof r), (ssize_t)sizeof r);
	SYS(close(fd));
	free(buf);
}

/* Storm process, receiving: 64 MiB in blocking receives, then EOF. */
static void storm_receiver(uint16_t port, int restart, int rep)
{
	static const size_t sz[] = { 4 * MiB, MiB, 100000, 1000, 2 * MiB + 7,
				     T };
	static const int fl[] = { MSG_WAITALL, 0, 0, 0, MSG_WAITALL, 0 };
	uint32_t seed = 200 + (uint32_t)restart;
	uint8_t *buf = malloc(4 * MiB + 64);
	CHECK(buf != NULL);
	int fd = tl_connect(AF_INET, port);
	expect_transport(fd);
	zc_thresh(fd, T);
	struct report r = { 0 };
	storm_start(restart, 10);
	uint64_t off = 0;
	for (unsigned i = 0;; i++) {
		uint8_t *p = buf + i % 61;
		r.calls++;
		ssize_t n = recv(fd, p, sz[i % 6], fl[i % 6]);
		if (n < 0) {
			CHECK(errno == EINTR, "recv under signals after %llu "
			      "bytes", (unsigned long long)off);
			CHECK(!restart, "recv returned EINTR under SA_RESTART "
			      "(no SO_RCVTIMEO)");
			r.eintr++;
			continue;
		}
		if (n == 0)
			break;
		if ((fl[i % 6] & MSG_WAITALL) && (size_t)n < sz[i % 6] &&
		    off + (uint64_t)n < TOTAL)
			r.partial++;
		CHECK_PAT(p, (size_t)n, off, seed);
		off += (uint64_t)n;
		CHECK(off <= TOTAL, "more bytes than were sent: %llu",
		      (unsigned long long)off);
	}
	storm_stop();
	CHECK_EQ(off, TOTAL);
	r.sigs = (uint64_t)nsig;
	r.z = zc_get(fd);
	CHECK_EQ(write(rep, &r, sizeof r), (ssize_t)sizeof r);
	SYS(close(fd));
	free(buf);
}

static void storm(int storm_sends, int restart)
{
	uint16_t port;
	int l = tl_listen(AF_INET, &port), rp[2];
	SYS(pipe(rp));
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(l));
		if (storm_sends)
			storm_sender(port, restart, rp[1]);
		else
			storm_receiver(port, restart, rp[1]);
		_exit(0);
	}
	SYS(close(rp[1]));
	int s = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	expect_transport(s);
	zc_thresh(s, T);
	static uint8_t buf[4 * MiB + 64];
	uint64_t off = 0;
	if (storm_sends) {
		/* receive and verify, in changing sizes */
		static const size_t sz[] = { MiB, 100000, 4 * MiB, 1000,
					     3 * MiB + 7 };
		uint32_t seed = 100 + (uint32_t)restart;
		for (unsigned i = 0;; i++) {
			ssize_t n = recv(s, buf + i % 59, sz[i % 5], 0);
			CHECK(n >= 0, "recv after %llu bytes",
			      (unsigned long long)off);
			if (n == 0)
				break;
			CHECK_PAT(buf + i % 59, (size_t)n, off, seed);
			off += (uint64_t)n;
			/* Now and then a slow reader, so that the sender
			 * stops spinning and sleeps where signals hit. */
			if (i % 8 == 7)
				tl_idle_ms(3);
		}
	} else {
		/* send in 4 MiB pieces, each made just before it is sent
		 * (the receiver waits for most of them) */
		uint32_t seed = 200 + (uint32_t)restart;
		for (off = 0; off < TOTAL; off += 4 * MiB) {
			tl_fill(buf, 4 * MiB, off, seed);
			tl_send_all(s, buf, 4 * MiB);
		}
		SYS(shutdown(s, SHUT_WR));
	}
	struct report r;
	CHECK_EQ(read(rp[0], &r, sizeof r), (ssize_t)sizeof r);
	tl_wait_ok(pid);
	if (storm_sends)
		CHECK(off == r.sent && off >= TOTAL, "received %llu bytes, the "
		      "sender sent %llu", (unsigned long long)off,
		      (unsigned long long)r.sent);
	if (!storm_sends) {
		char b;
		CHECK_EQ(recv(s, &b, 1, 0), 0);
	}
	struct zc me = zc_get(s);
	fprintf(stderr, "%s storm on the %s: %llu signals, %llu calls, "
		"%llu EINTR, %llu partial", restart ? "SA_RESTART" :
		"no-restart", storm_sends ? "sender" : "receiver",
		(unsigned long long)r.sigs, (unsigned long long)r.calls,
		(unsigned long long)r.eintr, (unsigned long long)r.partial);
	if (tl_sdp_mode())
		fprintf(stderr, "; bcopy %llu rzcopy %llu wzcopy %llu",
			(unsigned long long)me.rxb + me.txb,
			(unsigned long long)me.rxr + me.txr,
			(unsigned long long)me.rxw + me.txw);
	fprintf(stderr, "\n");
	/* Expirations that come while the process waits for a CPU merge
	 * into one signal: sharing one CPU with its peer, a storm of ~60
	 * expirations is ~20 signals. A few show the storm hit the calls. */
	CHECK(r.sigs >= 5, "the storm did not happen (%llu signals)",
	      (unsigned long long)r.sigs);
	if (storm_sends)
		CHECK(r.eintr + r.partial > 0, "%llu signals cut no send short",
		      (unsigned long long)r.sigs);
	if (tl_sdp_mode()) {
		if (storm_sends) {
			CHECK_EQ(r.z.tx, r.sent);
			zc_match(r.z, me);
			CHECK(me.rxr + me.rxw > 0, "no zero copy");
		} else {
			CHECK_EQ(me.tx, TOTAL);
			zc_match(me, r.z);
			CHECK(me.txr + me.txw > 0, "no zero copy");
		}
	}
	SYS(close(rp[0]));
	SYS(close(s));
}

/* ---- SO_SNDTIMEO / SO_RCVTIMEO ------------------------------------------ */

static void elapsed_ok(double t0, double tmo, const char *what)
{
	double dt = tl_now() - t0;
	CHECK(dt >= tmo * 0.9 && dt < tmo + 1.3, "%s returned after %.3f s, "
	      "timeout %.3f s", what, dt, tmo);
}

static void set_tmo(int fd, int opt, long us)
{
	struct timeval tv = { us / 1000000, us % 1000000 };
	SYS(setsockopt(fd, SOL_SOCKET, opt, &tv, sizeof tv));
}

struct rd { int fd; size_t len; int flags; uint8_t *buf; ssize_t ret; };
static void *reader(void *arg)
{
	struct rd *r = arg;
	r->ret = recv(r->fd, r->buf, r->len, r->flags);
	return NULL;
}

struct wr { int fd; const uint8_t *buf; size_t len; int ready; };
static void *writer(void *arg)
{
	struct wr *w = arg;
	if (w->ready >= 0) {
		char x;
		CHECK_EQ(read(w->ready, &x, 1), 1);
		tl_idle_ms(50);		/* let the receiver block */
	}
	tl_send_all(w->fd, w->buf, w->len);
	return NULL;
}

static void zpair(int *c, int *s)
{
	tl_pair(AF_INET, c, s);
	expect_transport(*c);
	expect_transport(*s);
	zc_thresh(*c, T);
	zc_thresh(*s, T);
}

/* After a timed-out send of which `sent` bytes went: the rest of the
 * total bytes from there, the receiver reading from stream offset from. */
static void finish(int c, int s, const uint8_t *buf, size_t total,
		   uint64_t sent, uint64_t from, uint32_t seed)
{
	set_tmo(c, SO_SNDTIMEO, 0);
	struct wr w = { c, buf + sent, total - sent, -1 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, writer, &w), 0);
	tl_recv_pat(s, from, total - from, seed, 65536);
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc zcl = zc_get(c), zs = zc_get(s);
	if (tl_sdp_mode()) {
		CHECK_EQ(zcl.tx, total);
		zc_match(zcl, zs);
		CHECK(zcl.txr + zcl.txw > 0);
	}
	SYS(close(c));
	SYS(close(s));
}

static void sndtimeo(void)
{
	int c, s;
	enum { BUF = 24 * MiB };
	uint8_t *buf = malloc(BUF), *rb = malloc(MiB);
	CHECK(buf && rb);
	tl_fill(buf, BUF, 0, 300);

	/* nobody reads: EAGAIN after the timeout (kernel TCP may buffer
	 * part of it and return that count instead) */
	zpair(&c, &s);
	set_tmo(c, SO_SNDTIMEO, 200000);
	double t0 = tl_now();
	errno = 0;
	ssize_t n = send(c, buf, 16 * MiB, 0);
	int e = errno;
	elapsed_ok(t0, 0.2, "send with SO_SNDTIMEO, peer not reading");
	CHECK(n == -1 ? e == EAGAIN : (n > 0 && n < 16 * (ssize_t)MiB),
	      "send -> %zd errno %d", n, e);
	fprintf(stderr, "send 16 MiB, peer not reading: %zd %s\n", n,
		n < 0 ? strerror(e) : "");
	if (tl_sdp_mode()) {
		/* zero copy buffers nothing: nothing read, nothing sent */
		CHECK(n == -1 && e == EAGAIN, "zero-copy send with nobody "
		      "reading returned %zd errno %d", n, e);
		CHECK_EQ(zc_get(c).tx, 0);
	}
	finish(c, s, buf, BUF, n > 0 ? (uint64_t)n : 0, 0, 300);

	/* the peer reads 1 MiB of the send, then stops: partial count */
	zpair(&c, &s);
	set_tmo(c, SO_SNDTIMEO, 200000);
	struct rd r = { s, MiB, MSG_WAITALL, rb, 0 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, reader, &r), 0);
	t0 = tl_now();
	errno = 0;
	n = send(c, buf, BUF, 0);
	e = errno;
	double dt = tl_now() - t0;
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK_EQ(r.ret, (ssize_t)MiB);
	CHECK_PAT(rb, MiB, 0, 300);
	fprintf(stderr, "send 24 MiB, peer read 1 MiB: %zd after %.3f s\n",
		n, dt);
	CHECK(n >= (ssize_t)MiB && n < (ssize_t)BUF, "send with SO_SNDTIMEO, "
	      "peer read 1 MiB: %zd errno %d after %.3f s", n, e, dt);
	CHECK(dt >= 0.15 && dt < 1.5, "partial send returned after %.3f s",
	      dt);
	if (tl_sdp_mode())
		CHECK_EQ(n, MiB);	/* exactly what the peer took */
	finish(c, s, buf, BUF, (uint64_t)n, MiB, 300);
	free(buf);
	free(rb);
}

static void rcvtimeo(void)
{
	int c, s, pp[2];
	static uint8_t buf[4 * MiB], rb[4 * MiB + 64];
	zpair(&c, &s);
	set_tmo(s, SO_RCVTIMEO, 200000);
	tl_fill(buf, sizeof buf, 0, 400);
	SYS(pipe(pp));

	/* nothing sent: EAGAIN after the timeout (an offered buffer is
	 * withdrawn) */
	double t0 = tl_now();
	errno = 0;
	ssize_t n = recv(s, rb, MiB, 0);
	int e = errno;
	elapsed_ok(t0, 0.2, "recv with SO_RCVTIMEO, nothing sent");
	CHECK(n == -1 && e == EAGAIN, "recv -> %zd errno %d", n, e);
	n = recv(s, rb, MiB, MSG_WAITALL);
	e = errno;
	CHECK(n == -1 && e == EAGAIN, "recv waitall -> %zd errno %d", n, e);

	/* then a send: all of it arrives */
	struct wr w = { c, buf, MiB, -1 };
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, writer, &w), 0);
	tl_recv_pat(s, 0, MiB, 400, 65536);
	CHECK_EQ(pthread_join(th, NULL), 0);

	/* MSG_WAITALL for 3 MiB, 1 MiB written while it waits: the
	 * partial count after the timeout */
	w = (struct wr){ c, buf + MiB, MiB, pp[0] };
	CHECK_EQ(pthread_create(&th, NULL, writer, &w), 0);
	CHECK_EQ(write(pp[1], "g", 1), 1);
	t0 = tl_now();
	n = recv(s, rb + 1, 3 * MiB, MSG_WAITALL);
	e = errno;
	double dt = tl_now() - t0;
	CHECK_EQ(pthread_join(th, NULL), 0);
	CHECK(n == (ssize_t)MiB, "waitall recv with SO_RCVTIMEO -> %zd errno "
	      "%d after %.3f s", n, e, dt);
	CHECK(dt >= 0.18 && dt < 1.5, "partial waitall recv after %.3f s", dt);
	CHECK_PAT(rb + 1, MiB, MiB, 400);

	/* the rest, with a plain blocking receive under the timeout */
	w = (struct wr){ c, buf + 2 * MiB, 2 * MiB, pp[0] };
	CHECK_EQ(pthread_create(&th, NULL, writer, &w), 0);
	CHECK_EQ(write(pp[1], "g", 1), 1);
	tl_recv_pat(s, 2 * MiB, 2 * MiB, 400, 65536);
	CHECK_EQ(pthread_join(th, NULL), 0);
	struct zc zcl = zc_get(c), zs = zc_get(s);
	if (tl_sdp_mode()) {
		CHECK_EQ(zcl.tx, sizeof buf);
		zc_match(zcl, zs);
		CHECK(zcl.txr + zcl.txw > 0);
	}
	SYS(close(pp[0]));
	SYS(close(pp[1]));
	SYS(close(c));
	SYS(close(s));
}

/* Optional argument: run one part only (a-f), for diagnosis. */
int main(int argc, char **argv)
{
	const char *only = argc > 1 ? argv[1] : "abcdef";
	tl_watchdog(20);
	signal(SIGPIPE, SIG_IGN);
	if (strchr(only, 'a'))
		storm(1, 0);
	if (strchr(only, 'b'))
		storm(0, 0);
	if (strchr(only, 'c'))
		sndtimeo();
	if (strchr(only, 'd'))
		rcvtimeo();
	if (strchr(only, 'e'))
		storm(1, 1);
	if (strchr(only, 'f'))
		storm(0, 1);
	return 0;
}
