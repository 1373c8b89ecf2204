/*
 * A peer stopped (SIGSTOP) in the middle of a zero-copy hand-off must
 * cost the waiting end no CPU, and the stream resumes intact when the
 * peer continues.
 *
 *   sink:   the receiver's recv() offered its buffer (SinkAvail), the
 *           sender took it and stopped after writing into it, before its
 *           RdmaWrCompl. The receiver's SO_RCVTIMEO runs out meanwhile:
 *           the recv cannot return before the RdmaWrCompl (the bytes are
 *           in its buffer already) and waits for it.
 *   cancel: the receiver stopped while reading the sender's buffer (a
 *           SrcAvail); the sender's SO_SNDTIMEO runs out meanwhile: it
 *           revokes what is not read and waits for the receiver's answer
 *           (no read of its buffer may be in flight when send() returns).
 *
 * The stop is reproduced naturally: the buffer that the stopping process
 * copies from (sink: the sender's) or into (cancel: the receiver's) has
 * no pages yet and is registered with userfaultfd. The copy's first page
 * fault reaches a thread of that process, which fills the whole buffer
 * without waking the copy and then stops its own process: the copy's
 * system call completes (the stop wakes it), and the process stops as it
 * returns - exactly between taking part in the hand-off and finishing it.
 * A controller waits for the stop, lets a second pass, and continues it.
 *
 * Measured: the waiting end's CPU time and voluntary context switches
 * over its call (getrusage RUSAGE_THREAD), a second of which the peer
 * was stopped. Kernel TCP runs the same programs (there the waiting end
 * is simply asleep in the kernel, or returns at its timeout). In sdp mode
 * the counters prove the zero-copy path.
 */
#include "zclib.h"
#include <linux/userfaultfd.h>
#include <pthread.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>

#define LEN (8u << 20)
#define SEED 41
#define T 65536
#define STOP_MS 1000

/* ---- a buffer whose first page fault stops its process ------------------ */

struct ufd { int fd; char *buf; const char *fill; };

static void *ufd_handler(void *arg)
{
	struct ufd *u = arg;
	struct pollfd p = { u->fd, POLLIN, 0 };
	while (poll(&p, 1, -1) < 0 && errno == EINTR)
		;
	struct uffd_msg m;
	CHECK_EQ(read(u->fd, &m, sizeof m), (ssize_t)sizeof m);
	CHECK_EQ(m.event, UFFD_EVENT_PAGEFAULT);
	/* The whole buffer, without waking the copy that faulted ... */
	if (u->fill) {
		struct uffdio_copy cp = { .dst = (uintptr_t)u->buf, .src = (uintptr_t)u->fill,
					  .len = LEN, .mode = UFFDIO_COPY_MODE_DONTWAKE };
		SYS(ioctl(u->fd, UFFDIO_COPY, &cp));
	} else {
		struct uffdio_zeropage zp = { .range = { (uintptr_t)u->buf, LEN },
					      .mode = UFFDIO_ZEROPAGE_MODE_DONTWAKE };
		SYS(ioctl(u->fd, UFFDIO_ZEROPAGE, &zp));
	}
	/* ... which the stop wakes: it finishes its system call, and the
	 * process stops on the way out. */
	SYS(kill(getpid(), SIGSTOP));
	return NULL;
}

/* LEN bytes without pages; fill: what they are to hold (NULL: zeros). */
static char *stopping_buffer(const char *fill)
{
	static struct ufd u;
	u.buf = mmap(NULL, LEN, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	CHECK(u.buf != MAP_FAILED);
	u.fill = fill;
	u.fd = (int)syscall(SYS_userfaultfd, O_CLOEXEC);
	if (u.fd < 0)
		SKIP("userfaultfd: %s (needs CAP_SYS_PTRACE or "
		     "vm.unprivileged_userfaultfd)", strerror(errno));
	struct uffdio_api api = { .api = UFFD_API };
	SYS(ioctl(u.fd, UFFDIO_API, &api));
	struct uffdio_register reg = { .range = { (uintptr_t)u.buf, LEN },
				       .mode = UFFDIO_REGISTER_MODE_MISSING };
	SYS(ioctl(u.fd, UFFDIO_REGISTER, &reg));
	pthread_t th;
	CHECK_EQ(pthread_create(&th, NULL, ufd_handler, &u), 0);
	CHECK_EQ(pthread_detach(th), 0);
	return u.buf;
}

/* ---- measuring the waiting end ---------------------------------------- */

struct usage { double cpu_ms; long nvcsw; };

static struct usage usage_now(void)
{
	struct rusage ru;
	SYS(getrusage(RUSAGE_THREAD, &ru));
	return (struct usage){
		(double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e3 +
		(double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) / 1e3,
		ru.ru_nvcsw };
}

/* Over a call during which the peer was stopped for STOP_MS: asleep,
 * not spinning or napping. */
static void idle_while_stopped(const char *who, struct usage a, struct usage b)
{
	double cpu = b.cpu_ms - a.cpu_ms;
	long sw = b.nvcsw - a.nvcsw;
	printf("    %s: %.1f ms CPU, %ld voluntary context switches\n", who, cpu, sw);
	fflush(stdout);
	CHECK(cpu < 25, "%s used %.1f ms of CPU while its peer was stopped", who, cpu);
	CHECK(sw < 20, "%s woke up %ld times while its peer was stopped", who, sw);
}

/* The process is in a recvfrom() on fd, or blocked in some system call
 * past set-up (sdp: its own sleeps): wait until /proc says so. */
static void await_syscall(pid_t pid, const char *prefix)
{
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/%d/syscall", (int)pid);
	for (int i = 0; i < 20000; i++) {
		FILE *f = fopen(path, "r");
		if (!f)
			SKIP("cannot read %s: %s", path, strerror(errno));
		char *ok = fgets(line, sizeof line, f);
		fclose(f);
		if (ok && !strncmp(line, prefix, strlen(prefix)))
			return;
		tl_idle_ms(1);
	}
	TL_FAIL("process %d never entered the call (%s...), last: %s", (int)pid,
		prefix, line);
}

/* Continue pid STOP_MS after it stopped; it must then exit 0. */
static void stop_window(pid_t pid)
{
	int st;
	CHECK_EQ(waitpid(pid, &st, WUNTRACED), pid);
	CHECK(WIFSTOPPED(st), "the peer did not stop (status 0x%x)", st);
	tl_idle_ms(STOP_MS);
	SYS(kill(pid, SIGCONT));
}

/* ---- sink: the sender stops holding our SinkAvail ----------------------- */

static void sink_case(void)
{
	tl_watchdog(30);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int rep[2];
	SYS(pipe(rep));
	pid_t rcv = tl_fork();
	if (rcv == 0) {                       /* receiver: offers its buffer */
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		zc_thresh(s, T);
		struct timeval tv = { 0, 300000 };
		SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv));
		char *buf = malloc(LEN);
		CHECK(buf != NULL);
		CHECK_EQ(write(rep[1], &s, sizeof s), (ssize_t)sizeof s);
		struct usage a = usage_now();
		ssize_t n = recv(s, buf, LEN, 0);
		struct usage b = usage_now();
		CHECK(n > 0, "recv -> %zd", n);
		CHECK_PAT(buf, (size_t)n, 0, SEED);
		idle_while_stopped("receiver", a, b);
		struct zc z = zc_get(s);
		if (tl_sdp_mode())
			CHECK(z.rxw > 0, "the sender did not write into our buffer");
		struct timeval forever = { 0, 0 };
		SYS(setsockopt(s, SOL_SOCKET, SO_RCVTIMEO, &forever, sizeof forever));
		tl_recv_pat(s, (uint64_t)n, LEN - (size_t)n, SEED, 65536);
		CHECK_EQ(recv(s, buf, 1, 0), 0);
		_exit(0);
	}
	close(l);
	pid_t snd = tl_fork();
	if (snd == 0) {                       /* sender: stops in the write */
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		zc_thresh(c, T);
		char *fill = malloc(LEN);
		CHECK(fill != NULL);
		tl_fill(fill, LEN, 0, SEED);
		char *buf = stopping_buffer(fill);
		int rfd;
		CHECK_EQ(read(rep[0], &rfd, sizeof rfd), (ssize_t)sizeof rfd);
		char want[32];
		snprintf(want, sizeof want, "45 0x%x ", rfd);
		await_syscall(rcv, want);     /* its offer is out */
		tl_send_all(c, buf, LEN);
		SYS(close(c));
		_exit(0);
	}
	stop_window(snd);
	tl_wait_ok(snd);
	tl_wait_ok(rcv);
}

/* ---- cancel: the receiver stops reading our SrcAvail -------------------- */

static void cancel_case(void)
{
	tl_watchdog(30);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	int go[2];
	SYS(pipe(go));
	pid_t rcv = tl_fork();
	if (rcv == 0) {                       /* receiver: stops in its read */
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		zc_thresh(s, T);
		char *buf = stopping_buffer(NULL);
		/* Only once the sender's buffer is announced: Read ZCopy. */
		struct pollfd p = { s, POLLIN, 0 };
		CHECK_EQ(poll(&p, 1, 5000), 1);
		ssize_t n = recv(s, buf, LEN, 0);
		CHECK(n > 0, "recv -> %zd", n);
		struct zc z = zc_get(s);
		if (tl_sdp_mode())
			CHECK(z.rxr > 0, "we did not read the sender's buffer");
		/* What the sender's send() counted, and nothing else. */
		uint64_t sent;
		CHECK_EQ(read(go[0], &sent, sizeof sent), (ssize_t)sizeof sent);
		CHECK((uint64_t)n <= sent);
		CHECK_PAT(buf, (size_t)n, 0, SEED);
		tl_recv_pat(s, (uint64_t)n, sent - (uint64_t)n, SEED, 65536);
		CHECK_EQ(recv(s, buf, 1, 0), 0);
		_exit(0);
	}
	close(l);
	pid_t snd = tl_fork();
	if (snd == 0) {                       /* sender: times out, revokes */
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		zc_thresh(c, T);
		struct timeval tv = { 0, 300000 };
		SYS(setsockopt(c, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv));
		char *buf = malloc(LEN);
		CHECK(buf != NULL);
		tl_fill(buf, LEN, 0, SEED);
		struct usage a = usage_now();
		ssize_t n = send(c, buf, LEN, MSG_NOSIGNAL);
		struct usage b = usage_now();
		/* sdp: what was read before the cancel; TCP: what the
		 * kernel took before the timeout */
		CHECK(n > 0 && (n < (ssize_t)LEN || !tl_sdp_mode()), "send -> %zd", n);
		uint64_t sent = (uint64_t)n;
		CHECK_EQ(write(go[1], &sent, sizeof sent), (ssize_t)sizeof sent);
		idle_while_stopped("sender", a, b);
		SYS(close(c));
		_exit(0);
	}
	stop_window(rcv);
	tl_wait_ok(rcv);
	tl_wait_ok(snd);
}

int main(void)
{
	static const struct tl_case cases[] = {
		{ "sink", sink_case },
		{ "cancel", cancel_case },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
