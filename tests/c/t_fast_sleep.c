/*
 * A thread blocked in recv() of a process with threads (a server with a
 * thread per connection): under SDP it first sleeps on the futex word the
 * two ends share, and the peer wakes it with one FUTEX_WAKE instead of a
 * wake-up token on the TCP socket.
 *
 * pingpong: ROUNDS request/reply rounds of a varying size, every byte
 * checked, between a threaded client and a single-threaded echo server in
 * another process. The harness runs this with SDP_SPIN_US=0, so a wait
 * that finds no reply yet sleeps. Under SDP those are futex sleeps
 * (futex_sleeps) and the server's wake-ups of them futex kicks
 * (futex_kicks), not tokens.
 *
 * peer_dies: the peer is killed while a thread of ours is blocked in
 * recv(); the call must end as on TCP (0: the peer's kernel closed its
 * socket with nothing of ours unread), however the thread sleeps - the
 * futex word is not watched by the kernel, so the fast sleep is bounded.
 *
 * restart: a signal with SA_RESTART during the blocked recv() is handled
 * and the call goes on to return the bytes sent afterwards; without
 * SA_RESTART it ends with EINTR.
 */
#include "testlib.h"
#include <pthread.h>
#include <sys/syscall.h>

#define ROUNDS 2000

static void echo_server(int l)
{
	int fd = SYS(accept(l, NULL, NULL));
	expect_transport(fd);
	unsigned char buf[4096];
	uint64_t n = 0;
	for (;;) {
		uint32_t len;
		ssize_t r = recv(fd, &len, sizeof len, MSG_WAITALL);
		if (r == 0)
			break;
		CHECK(r == (ssize_t)sizeof len, "server: recv length -> %zd", r);
		if (len == 0) {                  /* the client asks for our counts */
			struct sdp_sock_stats st;
			tl_stats(fd, &st);
			uint64_t v[2] = { st.futex_kicks, st.doorbells_tx };
			tl_send_all(fd, v, sizeof v);
			continue;
		}
		CHECK(len <= sizeof buf, "server: length %u", len);
		tl_recv_all(fd, buf, len);
		tl_send_all(fd, buf, len);
		n++;
	}
	CHECK_EQ(n, (uint64_t)ROUNDS);
	close(fd);
}

struct cli { uint16_t port; };

static void *client(void *arg)
{
	struct cli *a = arg;
	int fd = tl_connect(AF_INET, a->port);
	expect_transport(fd);
	unsigned char msg[4 + 4096], in[4096];
	for (uint32_t i = 0; i < ROUNDS; i++) {
		uint32_t len = 1 + (i * 131) % (sizeof in - 1);
		memcpy(msg, &len, sizeof len);     /* one send: no Nagle wait */
		tl_fill(msg + sizeof len, len, i, 7);
		tl_send_all(fd, msg, sizeof len + len);
		tl_recv_all(fd, in, len);
		CHECK(memcmp(in, msg + sizeof len, len) == 0, "round %u: reply differs", i);
	}
	struct sdp_sock_stats st;
	if (tl_stats(fd, &st)) {
		uint32_t z = 0;
		uint64_t v[2];
		tl_send_all(fd, &z, sizeof z);
		tl_recv_all(fd, v, sizeof v);
		/* Waits that found no reply yet slept (no spin) on the futex,
		 * and the server woke them through it: a token only for a
		 * sleep that outlasted the fast one (a server held off the
		 * CPU for 200 ms), where every wake-up used to be a token.
		 * How many waits sleep at all depends on the scheduling. */
		CHECK(st.futex_sleeps >= 1, "no futex sleep in %u rounds", ROUNDS);
		CHECK(v[0] >= 1, "no futex kick from the server in %u rounds", ROUNDS);
		CHECK(v[1] <= v[0], "server's tokens %llu, futex kicks %llu",
		      (unsigned long long)v[1], (unsigned long long)v[0]);
	}
	close(fd);
	return NULL;
}

static void pingpong(void)
{
	int l;
	uint16_t port;
	pid_t srv = tl_fork_listener(&port, &l);
	if (srv == 0) {
		echo_server(l);
		_exit(0);
	}
	struct cli a = { port };
	pthread_t th;
	CHECK(pthread_create(&th, NULL, client, &a) == 0, "pthread_create");
	pthread_join(th, NULL);
	tl_wait_ok(srv);
}

/* ---- peer_dies ---------------------------------------------------------- */

struct blocked { int fd; ssize_t r; int err; _Atomic pid_t tid; };

static void *block_recv(void *arg)
{
	struct blocked *b = arg;
	b->tid = (pid_t)syscall(SYS_gettid);
	char c;
	b->r = recv(b->fd, &c, 1, 0);
	b->err = errno;
	return NULL;
}

/* In sdp mode: until the thread is asleep on the futex (its counter),
 * so the case tests the fast sleep; on TCP there is nothing to wait for. */
static void until_fast_asleep(int fd)
{
	struct sdp_sock_stats st;
	for (int i = 0; i < 100000; i++) {
		if (!tl_stats(fd, &st) || st.futex_sleeps > 0)
			return;
		sched_yield();
	}
	TL_FAIL("the blocked recv never slept on the futex");
}

static void peer_dies(void)
{
	int l;
	uint16_t port;
	pid_t srv = tl_fork_listener(&port, &l);
	if (srv == 0) {
		int fd = SYS(accept(l, NULL, NULL));
		tl_send_all(fd, "x", 1);
		for (;;)
			pause();
	}
	struct blocked b = { .fd = tl_connect(AF_INET, port) };
	expect_transport(b.fd);
	char c;
	tl_recv_all(b.fd, &c, 1);           /* the server has accepted */
	pthread_t th;
	CHECK(pthread_create(&th, NULL, block_recv, &b) == 0, "pthread_create");
	until_fast_asleep(b.fd);
	SYS(kill(srv, SIGKILL));
	pthread_join(th, NULL);
	CHECK(b.r == 0, "recv after the peer died -> %zd (%s)", b.r, strerror(b.err));
	waitpid(srv, NULL, 0);
	close(b.fd);
}

/* ---- restart ------------------------------------------------------------ */

/* Until the thread sits in system call nr (from /proc: a signal sent
 * before it gets there would be handled before the call blocks). */
static void until_in_syscall(struct blocked *b, long nr)
{
	while (!b->tid)
		sched_yield();
	char path[64], line[256];
	snprintf(path, sizeof path, "/proc/self/task/%d/syscall", (int)b->tid);
	for (int i = 0; i < 1000000; i++) {
		int fd = open(path, O_RDONLY);
		CHECK(fd >= 0, "open %s", path);
		ssize_t n = read(fd, line, sizeof line - 1);
		close(fd);
		if (n > 0) {
			line[n] = 0;
			if (atol(line) == nr)
				return;
		}
		sched_yield();
	}
	TL_FAIL("the thread never blocked in system call %ld", nr);
}

static volatile sig_atomic_t got;
static void on_sig(int s) { (void)s; got++; }

static void restart_case(int flags)
{
	struct sigaction sa = { .sa_handler = on_sig, .sa_flags = flags };
	sigemptyset(&sa.sa_mask);
	SYS(sigaction(SIGUSR1, &sa, NULL));
	int cli, srv;
	tl_pair(AF_INET, &cli, &srv);
	expect_transport(cli);
	struct blocked b = { .fd = cli };
	got = 0;
	pthread_t th;
	CHECK(pthread_create(&th, NULL, block_recv, &b) == 0, "pthread_create");
	until_fast_asleep(cli);
	until_in_syscall(&b, tl_sdp_mode() ? SYS_futex : SYS_recvfrom);
	pthread_kill(th, SIGUSR1);
	while (!got)
		sched_yield();
	if (flags & SA_RESTART) {
		/* still blocked: the byte sent now is what it returns */
		tl_send_all(srv, "y", 1);
		pthread_join(th, NULL);
		CHECK(b.r == 1, "recv under SA_RESTART -> %zd (%s)", b.r, strerror(b.err));
	} else {
		pthread_join(th, NULL);
		CHECK(b.r == -1 && b.err == EINTR, "recv without SA_RESTART -> %zd (%s)",
		      b.r, strerror(b.err));
	}
	close(cli);
	close(srv);
}

static void restart(void)
{
	restart_case(SA_RESTART);
	restart_case(0);
}

int main(void)
{
	tl_watchdog(60);
	static const struct tl_case cases[] = {
		{ "pingpong", pingpong },
		{ "peer_dies", peer_dies },
		{ "restart", restart },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
