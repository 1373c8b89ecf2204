/*
 * Connection memory is reused between the same two processes, and only
 * when that is safe: every stream stays byte-exact, a slot is never shared
 * with a second peer, forked processes share the arena, and an application
 * that closes the library's descriptors keeps working.
 *
 *   sequential  one server process; 40 connections one after the other,
 *               sizes that wrap the rings to different depths, the client
 *               closing first or the server closing first. Under SDP every
 *               connection uses an arena slot; all but the first 8 (one per
 *               slot) reuse one; the server maps the arena once.
 *   two-peers   two server processes; connections alternate between them:
 *               each server only ever maps one client memfd, not the
 *               other's.
 *   fork        the client forks after its arena exists; parent and child
 *               make 30 connections each at the same time.
 *   closed-fd   the client closes every descriptor >= 900 (as daemons do)
 *               and dup2()s a file onto the old numbers; connections still
 *               work and still use a (new) arena.
 *   peer-killed the server is killed with connections' slots awaiting it;
 *               a new server process gets a new arena and everything works.
 *   grow        30 connections open at once (more than an arena's 8 slots),
 *               12 rounds: the client's arenas for the server grow, so every
 *               connection has an arena slot and later rounds reuse them.
 * Under kernel TCP the same programs run and only the bytes are checked.
 */
#include "testlib.h"
#include <dirent.h>
#include <pthread.h>
#include <signal.h>
#include <sys/wait.h>

#define SLOTS 8

static bool sdp;

/* ---- a server process: accept, echo every byte, close ------------------ */

struct srv {
	pid_t pid;
	uint16_t port;
	int report;                   /* pipe: the server's findings */
};

struct verdict {
	uint32_t accepted, pooled, reused;
	uint32_t memfds;              /* distinct sdp-conn memfds it maps */
	uint64_t ino[4];
};

static int conn_inodes(uint64_t *ino, int max)
{
	FILE *f = fopen("/proc/self/maps", "re");
	CHECK(f != NULL);
	char line[600];
	int n = 0;
	while (fgets(line, sizeof line, f)) {
		unsigned long long i;
		if (!strstr(line, "/memfd:sdp-conn") ||
		    sscanf(line, "%*s %*s %*s %*s %llu", &i) != 1)
			continue;
		bool seen = false;
		for (int k = 0; k < n; k++)
			seen |= ino[k] == i;
		if (!seen && n < max)
			ino[n++] = i;
		else if (!seen)
			n++;
	}
	fclose(f);
	return n;
}

/* Echo one connection; the first 4 bytes say who closes first. */
static void serve_one(int s, struct verdict *v)
{
	uint32_t how;
	tl_recv_all(s, &how, sizeof how);
	if (sdp) {
		struct sdp_sock_stats st;
		tl_stats(s, &st);
		CHECK_EQ(st.transport, 1);
		v->pooled += st.region_pooled;
		v->reused += st.region_reused;
	}
	static char buf[65536];
	for (;;) {
		ssize_t n = recv(s, buf, sizeof buf, 0);
		CHECK(n >= 0, "server recv");
		if (n == 0)
			break;
		tl_send_all(s, buf, (size_t)n);
		if (how == 1 && n > 0 && buf[n - 1] == '.')
			break;                    /* server closes first */
	}
	SYS(close(s));
	v->accepted++;
}

static void server_main(int l, int out, uint32_t count)
{
	tl_watchdog(60);
	struct verdict v = { 0 };
	for (uint32_t i = 0; i < count; i++)
		serve_one(SYS(accept(l, NULL, NULL)), &v);
	v.memfds = (uint32_t)conn_inodes(v.ino, 4);
	CHECK_EQ(write(out, &v, sizeof v), (ssize_t)sizeof v);
	_exit(0);
}

/* The server process creates its own listener: the listener's creator is
 * the peer an arena is kept for. */
static struct srv server_start(uint32_t count)
{
	struct srv s;
	int p[2], l;
	SYS(pipe(p));                     /* the server's findings */
	s.pid = tl_fork_listener(&s.port, &l);
	if (s.pid == 0) {
		SYS(close(p[0]));
		server_main(l, p[1], count);
	}
	SYS(close(p[1]));
	s.report = p[0];
	return s;
}

static struct verdict server_end(struct srv *s)
{
	struct verdict v;
	CHECK_EQ(read(s->report, &v, sizeof v), (ssize_t)sizeof v);
	SYS(close(s->report));
	tl_wait_ok(s->pid);
	return v;
}

/* ---- the client side of one connection ---------------------------------- */

struct cstat { uint32_t pooled, reused; };

/* Send `len` bytes of pattern seed, read the echo, close. how = 1: the
 * server closes first (after the final '.'), else the client does. */
static void one_conn(uint16_t port, uint32_t seed, size_t len, uint32_t how,
		     struct cstat *cs)
{
	int c = tl_connect(AF_INET, port);
	expect_transport(c);
	if (sdp) {
		struct sdp_sock_stats st;
		tl_stats(c, &st);
		cs->pooled += st.region_pooled;
		cs->reused += st.region_reused;
	}
	tl_send_all(c, &how, sizeof how);
	char *buf = malloc(len + 1);
	CHECK(buf != NULL);
	tl_fill(buf, len, 0, seed);
	buf[len] = '.';
	for (size_t i = 0; i < len; i++)
		if (buf[i] == '.')
			buf[i] = ',';             /* only the last byte is '.' */
	char *back = malloc(len + 1);
	CHECK(back != NULL);
	size_t sent = 0, got = 0;
	while (got < len + 1) {
		if (sent < len + 1) {
			size_t k = len + 1 - sent < 32768 ? len + 1 - sent : 32768;
			tl_send_all(c, buf + sent, k);
			sent += k;
		}
		size_t want = sent - got;
		tl_recv_all(c, back + got, want);
		got += want;
	}
	CHECK(memcmp(buf, back, len + 1) == 0, "echo differs (seed %u, %zu bytes)",
	      seed, len);
	if (how == 1) {
		char x;
		CHECK_EQ(recv(c, &x, 1, 0), 0);   /* the server closed */
	}
	SYS(close(c));
	free(buf);
	free(back);
}

static size_t size_of(uint32_t i)
{
	/* 1 byte .. 6 MiB: some connections fill and wrap both rings */
	static const size_t sz[] = { 1, 1000, 70000, 2100000, 33, 6u << 20, 4096, 300000 };
	return sz[i % (sizeof sz / sizeof sz[0])];
}

/* ---- cases ------------------------------------------------------------- */

static void c_sequential(void)
{
	const uint32_t n = 40;
	struct srv s = server_start(n);
	struct cstat cs = { 0 };
	for (uint32_t i = 0; i < n; i++)
		one_conn(s.port, 100 + i, size_of(i), i & 1, &cs);
	struct verdict v = server_end(&s);
	CHECK_EQ(v.accepted, n);
	if (!sdp)
		return;
	CHECK(cs.pooled == n, "%u of %u connections used an arena slot", cs.pooled, n);
	CHECK(cs.reused >= n - SLOTS, "only %u of %u connections reused a slot",
	      cs.reused, n);
	CHECK(v.pooled == n, "server: %u of %u pooled", v.pooled, n);
	CHECK(v.reused == n - 1, "server mapped the arena %u times for %u "
	      "connections", n - v.reused, n);
	CHECK(v.memfds == 1, "server maps %u connection memfds", v.memfds);
}

static void c_two_peers(void)
{
	const uint32_t n = 12;
	struct srv a = server_start(n), b = server_start(n);
	struct cstat cs = { 0 };
	for (uint32_t i = 0; i < 2 * n; i++)
		one_conn(i & 1 ? b.port : a.port, 200 + i, size_of(i + 3), i & 2 ? 1 : 0, &cs);
	struct verdict va = server_end(&a), vb = server_end(&b);
	CHECK_EQ(va.accepted, n);
	CHECK_EQ(vb.accepted, n);
	if (!sdp)
		return;
	CHECK_EQ(cs.pooled, 2 * n);
	CHECK(cs.reused >= 2 * n - 2 * SLOTS, "only %u reused", cs.reused);
	CHECK(va.memfds == 1 && vb.memfds == 1, "servers map %u and %u memfds",
	      va.memfds, vb.memfds);
	CHECK(va.ino[0] != vb.ino[0], "both servers map the same client memfd");
	uint64_t mine[8];
	CHECK_EQ(conn_inodes(mine, 8), 2);    /* one arena per peer */
}

static void c_fork(void)
{
	const uint32_t per = 30;
	struct srv s = server_start(2 * per - 1);
	/* The server answers one connection at a time: parent and child
	 * queue behind each other in its backlog but never share a slot. */
	struct cstat warm = { 0 };
	one_conn(s.port, 300, 5000, 0, &warm);         /* the arena exists */
	fflush(NULL);
	pid_t kid = SYS(fork());
	struct cstat cs = { 0 };
	for (uint32_t i = 1; i < per; i++)
		one_conn(s.port, (kid ? 300 : 400) + i, size_of(i), i & 1, &cs);
	if (kid == 0) {
		if (sdp)
			CHECK(cs.pooled == per - 1, "child: %u pooled", cs.pooled);
		_exit(0);
	}
	tl_wait_ok(kid);
	struct verdict v = server_end(&s);
	CHECK_EQ(v.accepted, 2 * per - 1);
	if (sdp) {
		CHECK(cs.pooled == per - 1, "parent: %u pooled", cs.pooled);
		CHECK(v.memfds == 1, "server maps %u memfds", v.memfds);
	}
}

static void c_closed_fd(void)
{
	const uint32_t n = 10;
	struct srv s = server_start(2 * n);
	struct cstat cs = { 0 };
	for (uint32_t i = 0; i < n; i++)
		one_conn(s.port, 500 + i, size_of(i), i & 1, &cs);
	/* A daemon closing "everything": the pool and the arena. Then
	 * a file on those numbers, which must never be sent to a peer. */
	SYS(close_range(900, ~0u, 0));
	int f = SYS(open("/dev/null", O_RDWR));
	for (int fd = 900; fd < 920; fd++)
		SYS(dup2(f, fd));
	SYS(close(f));
	for (uint32_t i = 0; i < n; i++)
		one_conn(s.port, 600 + i, size_of(i + 1), i & 1, &cs);
	struct verdict v = server_end(&s);
	CHECK_EQ(v.accepted, 2 * n);
	if (sdp) {
		CHECK(cs.pooled == 2 * n, "%u of %u pooled", cs.pooled, 2 * n);
		CHECK(v.pooled == 2 * n, "server: %u pooled", v.pooled);
		/* the new arena, and the old one unless it aged out */
		CHECK(v.memfds == 1 || v.memfds == 2, "server maps %u memfds",
		      v.memfds);
	}
	for (int fd = 900; fd < 920; fd++)
		close(fd);
}

static void c_peer_killed(void)
{
	/* A server that holds its connections open and is then killed:
	 * their slots wait for a "closed" mark that never comes. */
	int p[2];
	SYS(pipe(p));
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	fflush(NULL);
	pid_t srv = SYS(fork());
	if (srv == 0) {
		tl_watchdog(30);
		for (int i = 0; i < SLOTS; i++)
			SYS(accept(l, NULL, NULL));
		CHECK_EQ(write(p[1], "k", 1), 1);
		for (;;)
			pause();
	}
	SYS(close(l));
	int c[SLOTS];
	for (int i = 0; i < SLOTS; i++) {
		c[i] = tl_connect(AF_INET, port);
		expect_transport(c[i]);
		tl_send_all(c[i], "x", 1);
	}
	char k;
	CHECK_EQ(read(p[0], &k, 1), 1);
	SYS(kill(srv, SIGKILL));
	SYS(waitpid(srv, NULL, 0));
	for (int i = 0; i < SLOTS; i++)
		SYS(close(c[i]));
	SYS(close(p[0]));
	SYS(close(p[1]));
	const uint32_t n = 12;
	struct srv s = server_start(n);
	struct cstat cs = { 0 };
	for (uint32_t i = 0; i < n; i++)
		one_conn(s.port, 700 + i, size_of(i), i & 1, &cs);
	struct verdict v = server_end(&s);
	CHECK_EQ(v.accepted, n);
	if (sdp) {
		CHECK_EQ(cs.pooled, n);
		CHECK(cs.reused >= n - SLOTS, "only %u reused", cs.reused);
	}
}

/* Churn with many connections open at once: GROW_K at a time (more than
 * an arena's slots), GROW_ROUNDS times. The client's arenas for this
 * server grow, so every connection gets an arena slot (none a region of
 * its own) and later rounds reuse them; the bytes stay exact. */
#define GROW_K 30
#define GROW_ROUNDS 12

static void grow_server(int l, int out)
{
	tl_watchdog(60);
	static char buf[4096];
	uint32_t pooled = 0;
	for (int r = 0; r < GROW_ROUNDS; r++) {
		int fds[GROW_K];
		for (int i = 0; i < GROW_K; i++) {
			int s = SYS(accept(l, NULL, NULL));
			fds[i] = s;
			uint32_t seed;
			tl_recv_all(s, &seed, sizeof seed);
			tl_recv_pat(s, 0, sizeof buf, seed, sizeof buf);
			tl_send_pat(s, 0, sizeof buf, seed + 1, sizeof buf);
			if (sdp) {
				struct sdp_sock_stats st;
				tl_stats(s, &st);
				pooled += st.region_pooled;
			}
		}
		for (int i = 0; i < GROW_K; i++) {
			char x;
			CHECK_EQ(recv(fds[i], &x, 1, 0), 0);
			SYS(close(fds[i]));
		}
	}
	CHECK_EQ(write(out, &pooled, sizeof pooled), (ssize_t)sizeof pooled);
	_exit(0);
}

static void c_grow(void)
{
	int p[2], l;
	uint16_t port;
	SYS(pipe(p));
	pid_t pid = tl_fork_listener(&port, &l);
	if (pid == 0) {
		SYS(close(p[0]));
		grow_server(l, p[1]);
	}
	SYS(close(p[1]));
	struct cstat cs = { 0 };
	uint32_t n = 0;
	for (int r = 0; r < GROW_ROUNDS; r++) {
		int c[GROW_K];
		for (int i = 0; i < GROW_K; i++) {
			c[i] = tl_connect(AF_INET, port);
			expect_transport(c[i]);
			if (sdp) {
				struct sdp_sock_stats st;
				tl_stats(c[i], &st);
				cs.pooled += st.region_pooled;
				cs.reused += st.region_reused;
			}
			uint32_t seed = (uint32_t)(r * GROW_K + i) * 7;
			tl_send_all(c[i], &seed, sizeof seed);
			tl_send_pat(c[i], 0, 4096, seed, 4096);
			n++;
		}
		for (int i = 0; i < GROW_K; i++) {
			tl_recv_pat(c[i], 0, 4096, (uint32_t)(r * GROW_K + i) * 7 + 1, 4096);
			SYS(close(c[i]));
		}
	}
	uint32_t spooled = 0;
	CHECK_EQ(read(p[0], &spooled, sizeof spooled), (ssize_t)sizeof spooled);
	tl_wait_ok(pid);
	if (sdp) {
		CHECK(cs.pooled == n, "%u of %u connections had an arena slot", cs.pooled, n);
		CHECK_EQ(spooled, n);
		/* At most 2 x GROW_K slots are taken or await the server's
		 * close at once, so the arenas stop growing at 8 + 16 + 32 +
		 * 64 slots: at most that many connections had a fresh one. */
		CHECK(cs.reused >= n - 120, "only %u of %u reused", cs.reused, n);
	}
}

static const struct tl_case cases[] = {
	{ "grow",        c_grow },
	{ "sequential",  c_sequential },
	{ "two-peers",   c_two_peers },
	{ "fork",        c_fork },
	{ "closed-fd",   c_closed_fd },
	{ "peer-killed", c_peer_killed },
};

int main(void)
{
	tl_watchdog(120);
	sdp = tl_sdp_mode();
	signal(SIGPIPE, SIG_IGN);
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
