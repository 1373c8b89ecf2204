/*
 * testlib.h - tiny helpers shared by the C feature tests.
 *
 * Every test is a plain POSIX TCP program. It exits 0 on success, 77 to
 * skip, anything else on failure (with a file:line message on stderr).
 * SDP_EXPECT=tcp|sdp tells expect_transport() which transport the sockets
 * must be using; without it, the presence of libsdp in LD_PRELOAD decides.
 */
#ifndef SDP_TESTLIB_H
#define SDP_TESTLIB_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/timerfd.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <poll.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sdp.h"

#define TL_SKIP 77

/* ---- assertions ------------------------------------------------------- */

/* Where the last check started: the watchdog names it. */
static const char *tl_last_file = "?";
static int tl_last_line;
#define TL_MARK() (tl_last_file = __FILE__, tl_last_line = __LINE__)

static inline void tl_fail_at(const char *file, int line)
{
	fflush(stdout);
	fprintf(stderr, "%s:%d: [pid %d] ", file, line, (int)getpid());
}

static inline void tl_fail_end(int err)
{
	fprintf(stderr, " (errno=%d %s)\n", err, strerror(err));
	_exit(1);
}

#define TL_FAIL(...)                                                        \
	do {                                                                \
		int e_ = errno;                                             \
		tl_fail_at(__FILE__, __LINE__);                             \
		fprintf(stderr, __VA_ARGS__);                               \
		tl_fail_end(e_);                                            \
	} while (0)

/* CHECK(cond) or CHECK(cond, "fmt", ...) */
#define CHECK(cond, ...)                                                    \
	do {                                                                \
		TL_MARK();                                                  \
		if (!(cond)) {                                              \
			int e_ = errno;                                     \
			tl_fail_at(__FILE__, __LINE__);                     \
			fprintf(stderr, "CHECK failed: %s", #cond);         \
			__VA_OPT__(fprintf(stderr, ": ");                   \
				   fprintf(stderr, __VA_ARGS__);)           \
			tl_fail_end(e_);                                    \
		}                                                           \
	} while (0)

/* Both sides evaluated once, compared as long long, both values printed. */
#define CHECK_EQ(a, b)                                                      \
	do {                                                                \
		TL_MARK();                                                  \
		long long a_ = (long long)(a), b_ = (long long)(b);         \
		if (a_ != b_)                                               \
			TL_FAIL("CHECK_EQ failed: %s == %lld, expected %s "  \
				"== %lld", #a, a_, #b, b_);                 \
	} while (0)

/* A system call that must succeed: returns its value. */
#define SYS(call)                                                           \
	({                                                                  \
		TL_MARK();                                                  \
		errno = 0;                                                  \
		__auto_type r_ = (call);                                    \
		if (r_ == -1)                                               \
			TL_FAIL("%s failed", #call);                        \
		r_;                                                         \
	})

/* A system call that must fail with exactly errno `err`. */
#define CHECK_ERR(call, err)                                                \
	do {                                                                \
		TL_MARK();                                                  \
		errno = 0;                                                  \
		long long r_ = (long long)(call);                           \
		int e_ = errno;                                             \
		if (r_ != -1 || e_ != (err))                                \
			TL_FAIL("%s returned %lld errno %d (%s), expected "  \
				"-1 errno %s", #call, r_, e_, strerror(e_), \
				#err);                                      \
	} while (0)

#define SKIP(...)                                                           \
	do {                                                                \
		fprintf(stderr, "SKIP: " __VA_ARGS__);                      \
		fprintf(stderr, "\n");                                      \
		exit(TL_SKIP);                                              \
	} while (0)

/* ---- watchdog --------------------------------------------------------- */

static unsigned tl_watchdog_secs;

static void tl_alarm(int sig)
{
	char msg[512];
	int n = snprintf(msg, sizeof msg,
			 "WATCHDOG: %s [pid %d] still running after %u s: "
			 "hung at or after %s:%d\n",
			 program_invocation_short_name, (int)getpid(),
			 tl_watchdog_secs, tl_last_file, tl_last_line);
	(void)sig;
	if (write(2, msg, (size_t)n) < 0) { /* nothing else to do */ }
	_exit(3);
}

/* Arm (or re-arm, e.g. in a forked child) the hang watchdog. */
static inline void tl_watchdog(unsigned secs)
{
	tl_watchdog_secs = secs;
	signal(SIGALRM, tl_alarm);
	alarm(secs);
}

/* ---- time ------------------------------------------------------------- */

/* This process's address space (VmSize), KiB; -1 if unknown. */
static inline long tl_vm_size_kib(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	long kib = -1;
	while (f && fgets(line, sizeof line, f))
		if (sscanf(line, "VmSize: %ld kB", &kib) == 1)
			break;
	if (f)
		fclose(f);
	return kib;
}

static inline double tl_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Let ms milliseconds pass (pacing, never synchronisation). */
static inline void tl_idle_ms(unsigned ms)
{
	int t = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC);
	struct itimerspec its = { .it_value = { ms / 1000,
						(long)(ms % 1000) * 1000000 } };
	uint64_t ticks;
	if (t < 0 || timerfd_settime(t, 0, &its, NULL) < 0)
		TL_FAIL("timerfd");
	while (read(t, &ticks, sizeof ticks) < 0 && errno == EINTR)
		;
	close(t);
}

/* ---- data pattern: byte at stream offset i for a given seed ----------- */

static inline uint8_t tl_pat(uint64_t i, uint32_t seed)
{
	uint64_t x = (i + (uint64_t)seed * 0x100000001ull + 1) *
		     0x9E3779B97F4A7C15ull;
	return (uint8_t)((x >> 56) ^ (x >> 29));
}

static inline void tl_fill(void *buf, size_t len, uint64_t off, uint32_t seed)
{
	uint8_t *p = buf;
	for (size_t i = 0; i < len; i++)
		p[i] = tl_pat(off + i, seed);
}

/* Returns -1 if buf holds the pattern for [off, off+len), else the index
 * of the first wrong byte. */
static inline long tl_verify(const void *buf, size_t len, uint64_t off,
			     uint32_t seed)
{
	const uint8_t *p = buf;
	for (size_t i = 0; i < len; i++)
		if (p[i] != tl_pat(off + i, seed))
			return (long)i;
	return -1;
}

#define CHECK_PAT(buf, len, off, seed)                                      \
	do {                                                                \
		const uint8_t *b_ = (const uint8_t *)(buf);                 \
		uint64_t o_ = (off);                                        \
		long i_ = tl_verify(b_, (len), o_, (seed));                 \
		if (i_ >= 0)                                                \
			TL_FAIL("data corrupted at stream offset %llu: "     \
				"got 0x%02x expected 0x%02x",               \
				(unsigned long long)(o_ + (uint64_t)i_),    \
				b_[i_], tl_pat(o_ + (uint64_t)i_, (seed))); \
	} while (0)

/* ---- two hosts (tests/netns) ------------------------------------------ */

/* With TL_NET_CLIENT_NS (a network namespace file, /run/netns/NAME) and
 * TL_NET_SERVER4 / TL_NET_SERVER6 set, the program runs in the server's
 * namespace and every socket tl_connect makes is created and connected in
 * the client's namespace (setns around it): listeners and connections
 * are two hosts apart, joined by a veth pair, and the servers' address is
 * the given one instead of loopback. */
#include <sched.h>
#include <stdatomic.h>
static inline const char *tl_net_server(int family)
{
	const char *e = getenv(family == AF_INET6 ? "TL_NET_SERVER6" : "TL_NET_SERVER4");
	return e && *e && getenv("TL_NET_CLIENT_NS") ? e : NULL;
}

/* Enter the client's namespace (1) or go back home (0). */
static inline void tl_net_enter(int client)
{
	static int home = -1, away = -1;
	static _Atomic int once;              /* 0, 1 opening, 2 open: threads */
	const char *ns = getenv("TL_NET_CLIENT_NS");
	if (!ns || !*ns)
		return;
	if (atomic_load(&once) != 2) {
		int z = 0;
		if (atomic_compare_exchange_strong(&once, &z, 1)) {
			home = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
			away = open(ns, O_RDONLY | O_CLOEXEC);
			if (home < 0 || away < 0) {
				fprintf(stderr, "TL_NET_CLIENT_NS %s: %s\n", ns, strerror(errno));
				exit(1);
			}
			atomic_store(&once, 2);
		}
		while (atomic_load(&once) != 2)
			sched_yield();
	}
	if (setns(client ? away : home, CLONE_NEWNET) < 0) {
		fprintf(stderr, "setns: %s\n", strerror(errno));
		exit(1);
	}
}

/* ---- sockets ---------------------------------------------------------- */

static inline socklen_t tl_addr(int family, uint16_t port,
				struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof *ss);
	const char *srv = tl_net_server(family);
	if (family == AF_INET6) {
		struct sockaddr_in6 *a = (struct sockaddr_in6 *)ss;
		a->sin6_family = AF_INET6;
		a->sin6_addr = in6addr_loopback;
		if (srv)
			inet_pton(AF_INET6, srv, &a->sin6_addr);
		a->sin6_port = htons(port);
		return sizeof *a;
	}
	struct sockaddr_in *a = (struct sockaddr_in *)ss;
	a->sin_family = AF_INET;
	a->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (srv)
		inet_pton(AF_INET, srv, &a->sin_addr);
	a->sin_port = htons(port);
	return sizeof *a;
}

static inline uint16_t tl_port_of(int fd)
{
	struct sockaddr_storage ss;
	socklen_t len = sizeof ss;
	SYS(getsockname(fd, (struct sockaddr *)&ss, &len));
	if (ss.ss_family == AF_INET6)
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	return ntohs(((struct sockaddr_in *)&ss)->sin_port);
}

/* Listening socket on 127.0.0.1:0 or [::1]:0; *port gets the port. */
static inline int tl_listen(int family, uint16_t *port)
{
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(family, 0, &ss);
	int fd = SYS(socket(family, SOCK_STREAM, 0));
	int one = 1;
	SYS(setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one));
	SYS(bind(fd, (struct sockaddr *)&ss, len));
	SYS(listen(fd, 64));
	if (port)
		*port = tl_port_of(fd);
	return fd;
}

static inline int tl_connect(int family, uint16_t port)
{
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(family, port, &ss);
	tl_net_enter(1);
	int fd = SYS(socket(family, SOCK_STREAM, 0));
	SYS(connect(fd, (struct sockaddr *)&ss, len));
	tl_net_enter(0);
	return fd;
}

/* Nagle off: everything sent is at the peer when send() returns, so a
 * test can expect queued bytes without timing assumptions. */
static inline void tl_nodelay(int fd)
{
	int one = 1;
	SYS(setsockopt(fd, SOL_TCP, TCP_NODELAY, &one, sizeof one));
}

/* A connected pair in one process: *cli connected, *srv accepted, both
 * with TCP_NODELAY. */
static inline void tl_pair(int family, int *cli, int *srv)
{
	uint16_t port;
	int l = tl_listen(family, &port);
	*cli = tl_connect(family, port);
	*srv = SYS(accept(l, NULL, NULL));
	SYS(close(l));
	tl_nodelay(*cli);
	tl_nodelay(*srv);
}

/* Send or receive exactly len bytes (blocking socket), checked. */
static inline void tl_send_all_(const char *cf_, int cl_, int fd,
				const void *buf, size_t len)
{
	const char *p = buf;
	while (len) {
		ssize_t n = send(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			TL_FAIL("send of %zu bytes returned %zd (called from "
				"%s:%d)", len, n, cf_, cl_);
		p += n;
		len -= (size_t)n;
	}
}

static inline void tl_recv_all_(const char *cf_, int cl_, int fd, void *buf,
				size_t len)
{
	char *p = buf;
	size_t want = len;
	while (len) {
		ssize_t n = recv(fd, p, len, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			TL_FAIL("recv returned %zd after %zu of %zu bytes "
				"(called from %s:%d)", n, want - len, want, cf_,
				cl_);
		p += n;
		len -= (size_t)n;
	}
}

/* Send / receive-and-verify `total` pattern bytes starting at stream offset
 * off, in chunks of at most chunk bytes. */
static inline void tl_send_pat_(const char *cf_, int cl_, int fd,
				uint64_t off, size_t total, uint32_t seed,
				size_t chunk)
{
	static __thread char buf[65536];
	if (chunk > sizeof buf)
		chunk = sizeof buf;
	while (total) {
		size_t n = total < chunk ? total : chunk;
		tl_fill(buf, n, off, seed);
		tl_send_all_(cf_, cl_, fd, buf, n);
		off += n;
		total -= n;
	}
}

static inline void tl_recv_pat_(const char *cf_, int cl_, int fd,
				uint64_t off, size_t total, uint32_t seed,
				size_t chunk)
{
	static __thread char buf[65536];
	if (chunk > sizeof buf)
		chunk = sizeof buf;
	while (total) {
		ssize_t n = recv(fd, buf, total < chunk ? total : chunk, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			TL_FAIL("recv returned %zd with %zu bytes to go "
				"(called from %s:%d)", n, total, cf_, cl_);
		if (tl_verify(buf, (size_t)n, off, seed) >= 0)
			fprintf(stderr, "in tl_recv_pat called from %s:%d\n",
				cf_, cl_);
		CHECK_PAT(buf, (size_t)n, off, seed);
		off += (uint64_t)n;
		total -= (size_t)n;
	}
}

#define tl_send_all(...) tl_send_all_(__FILE__, __LINE__, __VA_ARGS__)
#define tl_recv_all(...) tl_recv_all_(__FILE__, __LINE__, __VA_ARGS__)
#define tl_send_pat(...) tl_send_pat_(__FILE__, __LINE__, __VA_ARGS__)
#define tl_recv_pat(...) tl_recv_pat_(__FILE__, __LINE__, __VA_ARGS__)

/* ---- transport expectations ------------------------------------------- */

/* 1 if the sockets must travel over SDP, 0 if they must be kernel TCP. */
static inline int tl_sdp_mode(void)
{
	const char *e = getenv("SDP_EXPECT");
	if (e && *e)
		return strcmp(e, "sdp") == 0;
	e = getenv("LD_PRELOAD");
	return e && strstr(e, "libsdp") != NULL;
}

#define expect_transport(fd) tl_expect_transport((fd), __FILE__, __LINE__)
static inline void tl_expect_transport(int fd, const char *file, int line)
{
	int v = -7;
	socklen_t len = sizeof v;
	errno = 0;
	int r = getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &len);
	if (tl_sdp_mode()) {
		if (r != 0 || v != 1 || len != sizeof v) {
			fprintf(stderr, "%s:%d: [pid %d] fd %d is not on SDP: "
				"getsockopt(SDP_TRANSPORT) = %d, value %d, "
				"errno %d (%s)\n", file, line, (int)getpid(),
				fd, r, v, errno, strerror(errno));
			_exit(1);
		}
	} else if (r != -1 || errno != ENOPROTOOPT) {
		fprintf(stderr, "%s:%d: [pid %d] fd %d: kernel TCP must reject "
			"SDP_TRANSPORT with ENOPROTOOPT, got %d value %d errno "
			"%d (%s)\n", file, line, (int)getpid(), fd, r, v, errno,
			strerror(errno));
		_exit(1);
	}
}

/* Reads SDP_STATS. In sdp mode it must succeed (returns 1); in tcp mode it
 * must fail with ENOPROTOOPT (returns 0, *st zeroed). */
static inline int tl_stats(int fd, struct sdp_sock_stats *st)
{
	socklen_t len = sizeof *st;
	memset(st, 0, sizeof *st);
	errno = 0;
	int r = getsockopt(fd, SOL_TCP, SDP_STATS, st, &len);
	if (tl_sdp_mode()) {
		CHECK(r == 0, "getsockopt(fd %d, SDP_STATS)", fd);
		CHECK_EQ(len, sizeof *st);
		CHECK_EQ(st->transport, 1);
		return 1;
	}
	CHECK(r == -1 && errno == ENOPROTOOPT,
	      "kernel TCP must reject SDP_STATS with ENOPROTOOPT");
	memset(st, 0, sizeof *st);
	return 0;
}

/* In sdp mode: the socket's stream byte counters are exactly tx and rx. */
#define expect_bytes(fd, tx, rx)                                            \
	do {                                                                \
		struct sdp_sock_stats s_;                                   \
		if (tl_stats((fd), &s_)) {                                  \
			CHECK_EQ(s_.tx_bytes, (tx));                        \
			CHECK_EQ(s_.rx_bytes, (rx));                        \
		}                                                           \
	} while (0)

/* ---- metrics compared with kernel TCP ----------------------------------- */

/* Some behaviour is not exact under kernel TCP either (how often two
 * connections' requests are served out of order, how many bytes a small
 * send buffer takes): such a program prints a metric, and the harness
 * (test_c_features.py) runs it first on kernel TCP and then under SDP with
 * TL_TCP_<name> set to the kernel's value, so the SDP run can check a
 * bound derived from the kernel's. */
static inline void tl_metric(const char *name, long long v)
{
	printf("TL_METRIC %s %lld\n", name, v);
	fflush(stdout);
}

/* The kernel TCP run's value of metric name, or -1 if not given. */
static inline long long tl_tcp_metric(const char *name)
{
	char var[128];
	snprintf(var, sizeof var, "TL_TCP_%s", name);
	const char *v = getenv(var);
	return v && *v ? atoll(v) : -1;
}

/* ---- processes -------------------------------------------------------- */

/* fork(); the child gets its own watchdog. */
static inline pid_t tl_fork(void)
{
	fflush(NULL);
	pid_t pid = SYS(fork());
	if (pid == 0)
		tl_watchdog(tl_watchdog_secs ? tl_watchdog_secs : 10);
	return pid;
}

/* Wait for a child that must exit 0. */
static inline void tl_wait_ok(pid_t pid)
{
	int st;
	pid_t r;
	do
		r = waitpid(pid, &st, 0);
	while (r < 0 && errno == EINTR);
	if (r != pid)
		TL_FAIL("waitpid(%d)", (int)pid);
	if (WIFSIGNALED(st))
		TL_FAIL("child %d killed by signal %d (%s)", (int)pid,
			WTERMSIG(st), strsignal(WTERMSIG(st)));
	if (WEXITSTATUS(st) != 0)
		TL_FAIL("child %d exited with status %d", (int)pid,
			WEXITSTATUS(st));
}

static inline int tl_have_ipv6(void)
{
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(AF_INET6, 0, &ss);
	int fd = socket(AF_INET6, SOCK_STREAM, 0);
	if (fd < 0)
		return 0;
	int ok = bind(fd, (struct sockaddr *)&ss, len) == 0;
	close(fd);
	return ok;
}

/* A server in a process of its own that creates its own listener (so it,
 * not the caller, is what clients' SO_PEERCRED names). Returns 0 in the
 * child with *l the listening socket, the child's pid in the caller with
 * *port set. */
static inline pid_t tl_fork_listener(uint16_t *port, int *l)
{
	int p[2];
	if (pipe(p) < 0)
		TL_FAIL("pipe");
	fflush(NULL);
	pid_t pid = fork();
	if (pid < 0)
		TL_FAIL("fork");
	if (pid == 0) {
		close(p[0]);
		*l = tl_listen(AF_INET, port);
		if (write(p[1], port, sizeof *port) != (ssize_t)sizeof *port)
			TL_FAIL("write");
		close(p[1]);
		return 0;
	}
	close(p[1]);
	if (read(p[0], port, sizeof *port) != (ssize_t)sizeof *port)
		TL_FAIL("the server process did not report its port");
	close(p[0]);
	return pid;
}

/* A server process on a listener of its own that accepts one connection
 * and echoes it until EOF (then exits 0); returns its pid, *port its port. */
static inline pid_t tl_fork_echo_once(uint16_t *port)
{
	int l;
	pid_t pid = tl_fork_listener(port, &l);
	if (pid)
		return pid;
	tl_watchdog(30);
	int c = accept(l, NULL, NULL);
	if (c < 0)
		TL_FAIL("echo server: accept");
	close(l);
	char buf[256];
	for (;;) {
		ssize_t r = recv(c, buf, sizeof buf, 0);
		CHECK(r >= 0, "echo server: recv");
		if (r == 0)
			break;
		tl_send_all(c, buf, (size_t)r);
	}
	close(c);
	fflush(NULL);
	_exit(0);
}

/* Is thread tid of this process blocked in epoll_wait (or epoll_pwait,
 * epoll_pwait2) right now? From /proc/self/task/<tid>/syscall. */
static inline bool tl_task_in_epoll_wait(pid_t tid)
{
	char path[64], buf[128];
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)tid);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		TL_FAIL("open %s", path);
	ssize_t r = read(fd, buf, sizeof buf - 1);
	close(fd);
	if (r <= 0 || buf[0] < '0' || buf[0] > '9')
		return false;           /* "running", or "-1 ..." */
	buf[r] = 0;
	long nr = strtol(buf, NULL, 10);
#ifdef SYS_epoll_wait
	if (nr == SYS_epoll_wait)
		return true;
#endif
#ifdef SYS_epoll_pwait2
	if (nr == SYS_epoll_pwait2)
		return true;
#endif
	return nr == SYS_epoll_pwait;
}

/* Programs made of independent cases: each case runs in a child of its
 * own (a failure or crash ends that case only); prints one line per case
 * and returns the process exit status (1 if any case failed). */
struct tl_case {
	const char *name;
	void (*fn)(void);
};

static inline int tl_run_cases(const struct tl_case *cases, size_t n)
{
	int failed = 0;
	for (size_t i = 0; i < n; i++) {
		fflush(NULL);
		pid_t pid = fork();
		if (pid < 0)
			TL_FAIL("fork");
		if (pid == 0) {
			cases[i].fn();
			_exit(0);
		}
		int st;
		while (waitpid(pid, &st, 0) < 0)
			if (errno != EINTR)
				TL_FAIL("waitpid");
		bool ok = WIFEXITED(st) && WEXITSTATUS(st) == 0;
		printf("  -> case %-12s %s\n", cases[i].name, ok ? "ok" : "FAIL");
		failed += !ok;
	}
	if (failed)
		fprintf(stderr, "%d case(s) failed\n", failed);
	return failed ? 1 : 0;
}

#endif /* SDP_TESTLIB_H */
