/*
 * sdp-perf - socket micro-benchmarks for the SDP benchmark suite.
 *
 * Plain POSIX stream sockets only, so that running the binary under
 * `sdp run` makes every connection an SDP connection and running it
 * directly measures kernel TCP. Every client prints exactly one JSON line
 * with its results, its own CPU time (getrusage) and the transport check
 * (getsockopt(SOL_TCP, SDP_TRANSPORT): 1 = SDP, ENOPROTOOPT = kernel TCP).
 *
 *   sdp-perf server   [--bind A] [--port P] [--sessions N] [--timeout S] [--accept-close]
 *   sdp-perf pingpong --host H --port P --size S [--time S] [--iters N] [--procs N]
 *   sdp-perf stream   --host H --port P --size S [--time S] [--streams N] [--procs N]
 *                     [--reverse] [--busy-us U] [--window W] [--max-bytes B]
 *   sdp-perf connrate --host H --port P [--count N] [--time S]
 *
 * The server is one process that serves any client test: each connection
 * starts with a header that says what to do. It prints a "listening" JSON
 * line with the bound port, and a result line (its CPU from the first
 * accept to the last session end) when N sessions are done, on SIGTERM or
 * SIGINT, or when its timeout expires.
 */
#include "perf_common.h"
#include "sdp.h"

#include <errno.h>
#include <math.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <arpa/inet.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#define HDR_MAGIC 0x53445042u /* "SDPB" */

enum mode { M_PINGPONG = 1, M_SINK = 2, M_SOURCE = 3 };

struct hdr {
	uint32_t magic;
	uint32_t mode;
	uint64_t size;
	uint64_t duration_ns;
	uint64_t max_bytes;
	uint32_t busy_us;
	uint32_t window;
};

/* ------------------------------------------------------------------ opts */

struct opts {
	const char *cmd;
	const char *host;
	const char *bind;
	int port;
	uint64_t size;
	double time_s;
	uint64_t iters;
	uint64_t warmup;
	int warmup_given;      /* --warmup on the command line (connrate: 0 else) */
	int streams;
	int procs;
	int reverse;
	uint32_t busy;
	uint32_t window;
	uint64_t max_bytes;
	uint64_t count;
	int sessions;
	double timeout_s;
	int accept_close;
};

static struct opts O = {
	.host = "127.0.0.1", .bind = "0.0.0.0", .port = 0, .size = 64,
	.time_s = 1.0, .iters = 200000, .warmup = 50, .streams = 1, .procs = 1,
	.count = 100000, .sessions = 0, .timeout_s = 0,
};

static void usage(void)
{
	fprintf(stderr,
		"usage: sdp-perf server   [--bind A] [--port P] [--sessions N] [--timeout S] [--accept-close]\n"
		"       sdp-perf pingpong --host H --port P --size S [--time S] [--iters N] [--warmup N] [--procs N]\n"
		"       sdp-perf stream   --host H --port P --size S [--time S] [--streams N] [--procs N]\n"
		"                         [--reverse] [--busy-us U] [--window W] [--max-bytes B]\n"
		"       sdp-perf connrate --host H --port P [--count N] [--time S] [--warmup N]\n");
	exit(2);
}

static void parse_args(int argc, char **argv)
{
	if (argc < 2)
		usage();
	O.cmd = argv[1];
	for (int i = 2; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
#define NEEDV() do { if (!v) usage(); i++; } while (0)
		if (!strcmp(a, "--host")) { NEEDV(); O.host = v; }
		else if (!strcmp(a, "--bind")) { NEEDV(); O.bind = v; }
		else if (!strcmp(a, "--port")) { NEEDV(); O.port = atoi(v); }
		else if (!strcmp(a, "--size")) { NEEDV(); O.size = parse_size(v); }
		else if (!strcmp(a, "--time")) { NEEDV(); O.time_s = atof(v); }
		else if (!strcmp(a, "--iters")) { NEEDV(); O.iters = strtoull(v, NULL, 10); }
		else if (!strcmp(a, "--warmup")) { NEEDV(); O.warmup = strtoull(v, NULL, 10); O.warmup_given = 1; }
		else if (!strcmp(a, "--streams")) { NEEDV(); O.streams = atoi(v); }
		else if (!strcmp(a, "--procs")) { NEEDV(); O.procs = atoi(v); }
		else if (!strcmp(a, "--reverse")) { O.reverse = 1; }
		else if (!strcmp(a, "--busy-us")) { NEEDV(); O.busy = (uint32_t)atoi(v); }
		else if (!strcmp(a, "--window")) { NEEDV(); O.window = (uint32_t)atoi(v); }
		else if (!strcmp(a, "--max-bytes")) { NEEDV(); O.max_bytes = parse_size(v); }
		else if (!strcmp(a, "--count")) { NEEDV(); O.count = strtoull(v, NULL, 10); }
		else if (!strcmp(a, "--sessions")) { NEEDV(); O.sessions = atoi(v); }
		else if (!strcmp(a, "--timeout")) { NEEDV(); O.timeout_s = atof(v); }
		else if (!strcmp(a, "--accept-close")) { O.accept_close = 1; }
		else usage();
#undef NEEDV
	}
	if (!O.size || O.streams < 1 || O.procs < 1 || O.streams > 256 || O.procs > 256)
		usage();
	if (O.time_s <= 0 || O.time_s > 600)
		O.time_s = 1.0;
}

/* ------------------------------------------------------------ socket io */

static ssize_t send_all(int fd, const void *b, size_t n)
{
	const char *p = b;
	size_t done = 0;
	while (done < n) {
		ssize_t r = send(fd, p + done, n - done, MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		done += (size_t)r;
	}
	return (ssize_t)done;
}

/* Returns n, 0 on EOF before anything was read, -1 on error/short EOF. */
static ssize_t recv_all(int fd, void *b, size_t n)
{
	char *p = b;
	size_t done = 0;
	while (done < n) {
		ssize_t r = recv(fd, p + done, n - done, 0);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		if (r == 0)
			return done ? -1 : 0;
		done += (size_t)r;
	}
	return (ssize_t)done;
}

/* 1 = SDP, 0 = libsdp says TCP, -1 = ENOPROTOOPT (kernel TCP), -2 = other. */
static int transport_of(int fd)
{
	int v = -1;
	socklen_t len = sizeof(v);
	if (getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &len) == 0)
		return v ? 1 : 0;
	return errno == ENOPROTOOPT ? -1 : -2;
}

struct tstats { uint64_t v[12]; int have; };

static void sdp_stats_add(int fd, struct tstats *acc)
{
	struct sdp_sock_stats st;
	socklen_t len = sizeof(st);
	memset(&st, 0, sizeof(st));
	if (getsockopt(fd, SOL_TCP, SDP_STATS, &st, &len) != 0)
		return;
	acc->have = 1;
	acc->v[0] += st.tx_bcopy_bytes;
	acc->v[1] += st.tx_rzcopy_bytes;
	acc->v[2] += st.tx_wzcopy_bytes;
	acc->v[3] += st.rx_bcopy_bytes;
	acc->v[4] += st.rx_rzcopy_bytes;
	acc->v[5] += st.rx_wzcopy_bytes;
	acc->v[6] += st.tx_azcopy_bytes;
	acc->v[7] += st.rx_azcopy_bytes;
	acc->v[8] += st.rx_azasync_bytes;
	acc->v[9] += st.az_faults;
	acc->v[10] += st.az_cow_copies;
	acc->v[11] += st.tx_stream_bytes;
}

static void jw_sdp_stats(struct jw *j, const struct tstats *s)
{
	if (!s->have)
		return;
	jw_obj_begin(j, "sdp_stats");
	jw_int(j, "tx_bcopy_bytes", (int64_t)s->v[0]);
	jw_int(j, "tx_rzcopy_bytes", (int64_t)s->v[1]);
	jw_int(j, "tx_wzcopy_bytes", (int64_t)s->v[2]);
	jw_int(j, "rx_bcopy_bytes", (int64_t)s->v[3]);
	jw_int(j, "rx_rzcopy_bytes", (int64_t)s->v[4]);
	jw_int(j, "rx_wzcopy_bytes", (int64_t)s->v[5]);
	jw_int(j, "tx_azcopy_bytes", (int64_t)s->v[6]);
	jw_int(j, "rx_azcopy_bytes", (int64_t)s->v[7]);
	jw_int(j, "rx_azasync_bytes", (int64_t)s->v[8]);
	jw_int(j, "az_faults", (int64_t)s->v[9]);
	jw_int(j, "az_cow_copies", (int64_t)s->v[10]);
	jw_int(j, "tx_stream_bytes", (int64_t)s->v[11]);
	jw_obj_end(j);
}

struct tcount { int sdp, tcp, noopt, other; };

static void tcount_add(struct tcount *c, int t)
{
	if (t == 1) c->sdp++;
	else if (t == 0) c->tcp++;
	else if (t == -1) c->noopt++;
	else c->other++;
}

static void jw_transport(struct jw *j, const struct tcount *c)
{
	int n = c->sdp + c->tcp + c->noopt + c->other;
	const char *t = "none";
	if (n && c->sdp == n) t = "sdp";
	else if (n && c->tcp + c->noopt == n) t = "tcp";
	else if (n && c->other == n) t = "unknown";
	else if (n) t = "mixed";
	jw_str(j, "transport", t);
	jw_obj_begin(j, "transport_counts");
	jw_int(j, "sdp", c->sdp);
	jw_int(j, "tcp_fallback", c->tcp);
	jw_int(j, "enoprotoopt", c->noopt);
	jw_int(j, "error", c->other);
	jw_obj_end(j);
}

static void *alloc_buf(size_t n)
{
	size_t len = n ? n : 1;
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED) {
		perror("mmap");
		exit(1);
	}
	memset(p, 0xA5, len);
	return p;
}

static void free_buf(void *p, size_t n)
{
	munmap(p, n ? n : 1);
}

/* The page-fault window: drop the buffer's pages and write a pattern into
 * it, so the next send/recv works on freshly faulted pages. */
static void pf_touch(char *buf, size_t n, uint64_t seq)
{
	long pg = sysconf(_SC_PAGESIZE);
	uintptr_t start = ((uintptr_t)buf + (uintptr_t)pg - 1) & ~((uintptr_t)pg - 1);
	uintptr_t end = ((uintptr_t)buf + n) & ~((uintptr_t)pg - 1);
	if (end > start)
		madvise((void *)start, end - start, MADV_DONTNEED);
	for (size_t i = 0; i < n; i += (size_t)pg)
		buf[i] = (char)(seq + i);
	if (n)
		buf[n - 1] = (char)seq;
}

/* --------------------------------------------------------------- server */

static volatile sig_atomic_t g_stop;

static void on_stop(int sig)
{
	(void)sig;
	g_stop = 1;
}

static struct {
	pthread_mutex_t mu;
	int active;
	int done;
	uint64_t rx, tx;
	uint64_t t_first, t_last;
	double cpu0_u, cpu0_s, cpu1_u, cpu1_s;
	int have_cpu0;
	struct tcount tc;
	struct tstats st;
	int errors;
} S = { .mu = PTHREAD_MUTEX_INITIALIZER };

static void server_mark_end(void)
{
	/* caller holds S.mu */
	S.t_last = now_ns();
	cpu_self(&S.cpu1_u, &S.cpu1_s);
}

static void *serve_conn(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct hdr h;
	uint64_t rx = 0, tx = 0;
	int err = 0;
	int tr = transport_of(fd);
	struct tstats st = {0};

	if (recv_all(fd, &h, sizeof(h)) != (ssize_t)sizeof(h) || h.magic != HDR_MAGIC ||
	    h.size == 0 || h.size > (1ull << 30)) {
		err = 1;
		goto out;
	}
	char *buf = alloc_buf(h.size);
	if (h.mode == M_PINGPONG) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		for (;;) {
			ssize_t r = recv_all(fd, buf, h.size);
			if (r <= 0) {
				err = r < 0;
				break;
			}
			rx += (uint64_t)r;
			if (send_all(fd, buf, h.size) < 0) {
				err = 1;
				break;
			}
			tx += h.size;
		}
	} else if (h.mode == M_SINK) {
		uint64_t calls = 0;
		for (;;) {
			ssize_t r = recv(fd, buf, h.size, 0);
			if (r < 0 && errno == EINTR)
				continue;
			if (r <= 0) {
				err = r < 0;
				break;
			}
			rx += (uint64_t)r;
			calls++;
			if (h.window && calls % h.window == 0)
				pf_touch(buf, h.size, calls);
		}
		sdp_stats_add(fd, &st);
		if (!err && send_all(fd, &rx, sizeof(rx)) < 0)
			err = 1;
	} else if (h.mode == M_SOURCE) {
		char go;
		if (recv_all(fd, &go, 1) != 1) {
			err = 1;
		} else {
			uint64_t calls = 0, end = now_ns() + h.duration_ns;
			while (now_ns() < end && (!h.max_bytes || tx < h.max_bytes)) {
				if (send_all(fd, buf, h.size) < 0) {
					err = 1;
					break;
				}
				tx += h.size;
				calls++;
				busy_us(h.busy_us);
				if (h.window && calls % h.window == 0)
					pf_touch(buf, h.size, calls);
			}
			sdp_stats_add(fd, &st);
			shutdown(fd, SHUT_WR);
			uint64_t ack = 0;
			if (!err && recv_all(fd, &ack, sizeof(ack)) != sizeof(ack))
				err = 1;
		}
	} else {
		err = 1;
	}
	if (h.mode == M_PINGPONG)
		sdp_stats_add(fd, &st);
	free_buf(buf, h.size);
out:
	close(fd);
	pthread_mutex_lock(&S.mu);
	S.rx += rx;
	S.tx += tx;
	S.active--;
	S.done++;
	S.errors += err;
	tcount_add(&S.tc, tr);
	if (st.have) {
		S.st.have = 1;
		for (int i = 0; i < (int)(sizeof st.v / sizeof st.v[0]); i++)
			S.st.v[i] += st.v[i];
	}
	server_mark_end();
	pthread_mutex_unlock(&S.mu);
	return NULL;
}

static int make_listener(int *port_out)
{
	struct sockaddr_in sa;
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_port = htons((uint16_t)O.port);
	if (inet_pton(AF_INET, O.bind, &sa.sin_addr) != 1) {
		fprintf(stderr, "sdp-perf: bad --bind %s\n", O.bind);
		exit(2);
	}
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd < 0) {
		perror("socket");
		exit(1);
	}
	int one = 1;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		perror("bind");
		exit(1);
	}
	if (listen(fd, 1024) < 0) {
		perror("listen");
		exit(1);
	}
	socklen_t len = sizeof(sa);
	getsockname(fd, (struct sockaddr *)&sa, &len);
	*port_out = ntohs(sa.sin_port);
	return fd;
}

static int server_main(void)
{
	int port;
	int lfd = make_listener(&port);
	struct sigaction sa;
	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);

	printf("{\"event\":\"listening\",\"port\":%d,\"pid\":%d}\n", port, (int)getpid());
	fflush(stdout);

	double timeout = O.timeout_s > 0 ? O.timeout_s : 300.0;
	uint64_t t_start = now_ns(), deadline = t_start + (uint64_t)(timeout * 1e9);
	int accepted = 0;
	bool timed_out = false;
	for (;;) {
		pthread_mutex_lock(&S.mu);
		int done = S.done;
		pthread_mutex_unlock(&S.mu);
		if (g_stop || (O.sessions > 0 && done >= O.sessions))
			break;
		if (now_ns() > deadline) {
			timed_out = true;
			break;
		}
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		int r = poll(&p, 1, 50);
		if (r <= 0)
			continue;
		int cfd = accept(lfd, NULL, NULL);
		if (cfd < 0)
			continue;
		pthread_mutex_lock(&S.mu);
		if (!S.have_cpu0) {
			S.have_cpu0 = 1;
			S.t_first = now_ns();
			cpu_self(&S.cpu0_u, &S.cpu0_s);
		}
		pthread_mutex_unlock(&S.mu);
		accepted++;
		if (O.accept_close) {
			int tr = transport_of(cfd);
			close(cfd);
			pthread_mutex_lock(&S.mu);
			if (S.done < 4) /* sample the first few only */
				tcount_add(&S.tc, tr);
			S.done++;
			server_mark_end();
			pthread_mutex_unlock(&S.mu);
			continue;
		}
		pthread_mutex_lock(&S.mu);
		S.active++;
		pthread_mutex_unlock(&S.mu);
		pthread_t th;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		if (pthread_create(&th, &at, serve_conn, (void *)(intptr_t)cfd) != 0) {
			close(cfd);
			pthread_mutex_lock(&S.mu);
			S.active--;
			S.errors++;
			pthread_mutex_unlock(&S.mu);
		}
		pthread_attr_destroy(&at);
	}
	close(lfd);
	/* give running sessions a moment to finish after a stop request */
	for (int i = 0; i < 200; i++) {
		pthread_mutex_lock(&S.mu);
		int act = S.active;
		pthread_mutex_unlock(&S.mu);
		if (!act)
			break;
		usleep(10000);
	}
	pthread_mutex_lock(&S.mu);
	struct jw j;
	jw_begin(&j);
	jw_str(&j, "tool", "sdp-perf");
	jw_str(&j, "role", "server");
	jw_int(&j, "accepted", accepted);
	jw_int(&j, "sessions", S.done);
	jw_int(&j, "errors", S.errors);
	jw_int(&j, "active_at_exit", S.active);
	jw_int(&j, "timed_out", timed_out);
	jw_int(&j, "bytes_rx", (int64_t)S.rx);
	jw_int(&j, "bytes_tx", (int64_t)S.tx);
	double wall = S.have_cpu0 ? (double)(S.t_last - S.t_first) / 1e9 : 0;
	double cu = S.have_cpu0 ? S.cpu1_u - S.cpu0_u : 0;
	double cs = S.have_cpu0 ? S.cpu1_s - S.cpu0_s : 0;
	jw_num(&j, "seconds", wall);
	jw_obj_begin(&j, "cpu");
	jw_num(&j, "user", cu);
	jw_num(&j, "sys", cs);
	jw_num(&j, "total", cu + cs);
	jw_num(&j, "per_s", wall > 0 ? (cu + cs) / wall : NAN);
	jw_obj_end(&j);
	jw_transport(&j, &S.tc);
	jw_sdp_stats(&j, &S.st);
	jw_end_print(&j, stdout);
	pthread_mutex_unlock(&S.mu);
	return S.errors || timed_out ? 1 : 0;
}

/* --------------------------------------------------------------- client */

struct wres {
	uint64_t bytes;
	uint64_t t0, t1;
	uint64_t iters;
	uint64_t nlat;
	double cpu_u, cpu_s;
	int transport;
	int err;
	struct tstats st;
	char errmsg[96];
};

static struct wres *W;      /* shared between workers (threads or processes) */
static double *LAT;         /* nworkers * O.iters one-way latencies (us) */
static int ready_pipe[2], go_pipe[2];
static int g_test;          /* M_PINGPONG / M_SINK / M_SOURCE */

static int connect_to(const char *host, int port)
{
	struct addrinfo hints, *res = NULL;
	char ps[16];
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%d", port);
	if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
		return -1;
	int fd = socket(res->ai_family, res->ai_socktype, 0);
	if (fd < 0) {
		freeaddrinfo(res);
		return -1;
	}
	int r;
	do {
		r = connect(fd, res->ai_addr, res->ai_addrlen);
	} while (r < 0 && errno == EINTR);
	freeaddrinfo(res);
	if (r < 0) {
		close(fd);
		return -1;
	}
	return fd;
}

static void werr(struct wres *w, const char *what)
{
	w->err = 1;
	snprintf(w->errmsg, sizeof(w->errmsg), "%s: %s", what, strerror(errno));
}

static void worker_run(int idx)
{
	struct wres *w = &W[idx];
	double *lat = LAT ? LAT + (size_t)idx * O.iters : NULL;
	char c = 'R';
	int fd = connect_to(O.host, O.port);
	char *buf = alloc_buf(O.size);

	if (fd < 0) {
		werr(w, "connect");
		c = 'E';
	} else {
		w->transport = transport_of(fd);
		struct hdr h = {
			.magic = HDR_MAGIC, .mode = (uint32_t)g_test, .size = O.size,
			.duration_ns = (uint64_t)(O.time_s * 1e9), .max_bytes = O.max_bytes,
			.busy_us = O.busy, .window = O.window,
		};
		if (g_test == M_PINGPONG) {
			int one = 1;
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		}
		if (send_all(fd, &h, sizeof(h)) < 0) {
			werr(w, "send header");
			c = 'E';
		}
	}
	if (write(ready_pipe[1], &c, 1) != 1)
		w->err = 1;
	char dummy;
	while (read(go_pipe[0], &dummy, 1) < 0 && errno == EINTR)
		;
	if (c == 'E')
		goto out;

	double u0, s0, u1, s1;
	cpu_self(&u0, &s0);
	uint64_t deadline;
	if (g_test == M_PINGPONG) {
		for (uint64_t i = 0; i < O.warmup; i++) {
			if (send_all(fd, buf, O.size) < 0 || recv_all(fd, buf, O.size) != (ssize_t)O.size) {
				werr(w, "warmup");
				goto out;
			}
		}
		w->t0 = now_ns();
		deadline = w->t0 + (uint64_t)(O.time_s * 1e9);
		uint64_t i = 0;
		while (i < O.iters) {
			uint64_t t = now_ns();
			if (t >= deadline && i >= 10)
				break;
			if (send_all(fd, buf, O.size) < 0 || recv_all(fd, buf, O.size) != (ssize_t)O.size) {
				werr(w, "pingpong");
				break;
			}
			lat[i++] = (double)(now_ns() - t) / 2000.0;
		}
		w->t1 = now_ns();
		w->iters = w->nlat = i;
		w->bytes = i * O.size * 2;
		sdp_stats_add(fd, &w->st);
	} else if (g_test == M_SINK) {
		uint64_t calls = 0, bytes = 0;
		w->t0 = now_ns();
		deadline = w->t0 + (uint64_t)(O.time_s * 1e9);
		while (now_ns() < deadline && (!O.max_bytes || bytes < O.max_bytes)) {
			if (send_all(fd, buf, O.size) < 0) {
				werr(w, "send");
				break;
			}
			bytes += O.size;
			calls++;
			busy_us(O.busy);
			if (O.window && calls % O.window == 0)
				pf_touch(buf, O.size, calls);
		}
		sdp_stats_add(fd, &w->st);
		shutdown(fd, SHUT_WR);
		uint64_t ack = 0;
		if (!w->err && recv_all(fd, &ack, sizeof(ack)) != sizeof(ack))
			werr(w, "ack");
		else if (!w->err && ack != bytes) {
			w->err = 1;
			snprintf(w->errmsg, sizeof(w->errmsg), "server got %llu of %llu bytes",
				 (unsigned long long)ack, (unsigned long long)bytes);
		}
		w->t1 = now_ns();
		w->bytes = bytes;
		w->iters = calls;
	} else { /* M_SOURCE */
		uint64_t calls = 0, bytes = 0;
		char g = 'G';
		w->t0 = now_ns();
		if (send_all(fd, &g, 1) < 0) {
			werr(w, "send go");
			goto out;
		}
		for (;;) {
			ssize_t r = recv(fd, buf, O.size, 0);
			if (r < 0 && errno == EINTR)
				continue;
			if (r < 0) {
				werr(w, "recv");
				break;
			}
			if (r == 0)
				break;
			bytes += (uint64_t)r;
			calls++;
			if (O.window && calls % O.window == 0)
				pf_touch(buf, O.size, calls);
		}
		w->t1 = now_ns();
		sdp_stats_add(fd, &w->st);
		if (!w->err && send_all(fd, &bytes, sizeof(bytes)) < 0)
			werr(w, "send ack");
		w->bytes = bytes;
		w->iters = calls;
	}
	cpu_self(&u1, &s1);
	w->cpu_u = u1 - u0;
	w->cpu_s = s1 - s0;
out:
	if (fd >= 0)
		close(fd);
	free_buf(buf, O.size);
}

static void *worker_thread(void *arg)
{
	worker_run((int)(intptr_t)arg);
	return NULL;
}

static void lat_summary(struct jw *j, double *v, size_t n, const char *key)
{
	sort_doubles(v, n);
	double sum = 0;
	for (size_t i = 0; i < n; i++)
		sum += v[i];
	jw_obj_begin(j, key);
	jw_int(j, "n", (int64_t)n);
	jw_num(j, "mean", n ? sum / (double)n : NAN);
	jw_num(j, "p50", percentile_sorted(v, n, 50));
	jw_num(j, "p90", percentile_sorted(v, n, 90));
	jw_num(j, "p99", percentile_sorted(v, n, 99));
	jw_num(j, "min", n ? v[0] : NAN);
	jw_num(j, "max", n ? v[n - 1] : NAN);
	jw_obj_end(j);
}

static int client_main(int test)
{
	g_test = test;
	signal(SIGPIPE, SIG_IGN);
	int nw = O.streams * O.procs;
	if (test == M_PINGPONG && O.streams != 1) {
		fprintf(stderr, "sdp-perf: pingpong uses --procs for several clients\n");
		return 2;
	}
	size_t wsz = sizeof(struct wres) * (size_t)nw;
	W = mmap(NULL, wsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (W == MAP_FAILED) {
		perror("mmap");
		return 1;
	}
	memset(W, 0, wsz);
	size_t lsz = 0;
	if (test == M_PINGPONG) {
		if (O.iters < 10)
			O.iters = 10;
		lsz = sizeof(double) * (size_t)nw * O.iters;
		LAT = mmap(NULL, lsz, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
		if (LAT == MAP_FAILED) {
			perror("mmap");
			return 1;
		}
	}
	if (pipe(ready_pipe) || pipe(go_pipe)) {
		perror("pipe");
		return 1;
	}
	alarm((unsigned)(O.time_s * 2 + 60)); /* hard bound on the whole run */

	pid_t pids[256];
	pthread_t ths[256];
	int np = 0, nt = 0;
	if (O.procs > 1) {
		for (int p = 0; p < O.procs; p++) {
			pid_t pid = fork();
			if (pid < 0) {
				perror("fork");
				break;
			}
			if (pid == 0) {
				close(go_pipe[1]);
				close(ready_pipe[0]);
				worker_run(p);
				_exit(0);
			}
			pids[np++] = pid;
		}
	} else {
		for (int t = 0; t < O.streams; t++) {
			if (pthread_create(&ths[nt], NULL, worker_thread, (void *)(intptr_t)t) != 0)
				break;
			nt++;
		}
	}
	int nready = 0;
	int started = np + nt;
	while (nready < started) {
		char c;
		ssize_t r = read(ready_pipe[0], &c, 1);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		nready++;
	}
	double u0, s0, u1, s1;
	cpu_self(&u0, &s0);
	close(go_pipe[1]); /* everybody starts now */
	for (int t = 0; t < nt; t++)
		pthread_join(ths[t], NULL);
	for (int p = 0; p < np; p++) {
		int st;
		while (waitpid(pids[p], &st, 0) < 0 && errno == EINTR)
			;
		if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
			W[p].err = 1;
			snprintf(W[p].errmsg, sizeof(W[p].errmsg), "worker process failed");
		}
	}
	cpu_self(&u1, &s1);

	uint64_t bytes = 0, iters = 0, t0 = UINT64_MAX, t1 = 0;
	double cu = 0, cs = 0;
	int errs = 0;
	const char *emsg = "";
	struct tcount tc = {0};
	struct tstats st = {0};
	for (int i = 0; i < nw; i++) {
		struct wres *w = &W[i];
		if (i >= started) {
			w->err = 1;
			snprintf(w->errmsg, sizeof(w->errmsg), "worker not started");
		}
		bytes += w->bytes;
		iters += w->iters;
		if (w->t0 && w->t0 < t0) t0 = w->t0;
		if (w->t1 > t1) t1 = w->t1;
		if (O.procs > 1) {
			cu += w->cpu_u;
			cs += w->cpu_s;
		}
		if (w->err) {
			errs++;
			if (!*emsg) emsg = w->errmsg;
		}
		if (i < started)
			tcount_add(&tc, w->transport);
		if (w->st.have) {
			st.have = 1;
			for (int k = 0; k < (int)(sizeof w->st.v / sizeof w->st.v[0]); k++)
				st.v[k] += w->st.v[k];
		}
	}
	if (O.procs == 1) {
		cu = u1 - u0;
		cs = s1 - s0;
	}
	double secs = t1 > t0 && t0 != UINT64_MAX ? (double)(t1 - t0) / 1e9 : 0;

	struct jw j;
	jw_begin(&j);
	jw_str(&j, "tool", "sdp-perf");
	jw_str(&j, "role", "client");
	jw_str(&j, "test", test == M_PINGPONG ? "pingpong" : "stream");
	jw_int(&j, "ok", errs == 0);
	if (errs)
		jw_str(&j, "error", emsg);
	jw_int(&j, "size", (int64_t)O.size);
	jw_int(&j, "streams", O.streams);
	jw_int(&j, "procs", O.procs);
	jw_int(&j, "reverse", O.reverse);
	jw_int(&j, "busy_us", O.busy);
	jw_int(&j, "window", O.window);
	jw_int(&j, "bytes", (int64_t)bytes);
	jw_int(&j, "iters", (int64_t)iters);
	jw_num(&j, "seconds", secs);
	jw_num(&j, "gbps", secs > 0 ? (double)bytes * 8 / secs / 1e9 : NAN);
	jw_num(&j, "mbytes_per_s", secs > 0 ? (double)bytes / secs / 1e6 : NAN);
	jw_num(&j, "msgs_per_s", secs > 0 ? (double)iters / secs : NAN);
	if (test == M_PINGPONG) {
		/* pack all samples, and the mean latency seen by each client */
		size_t n = 0;
		double means[256];
		for (int i = 0; i < nw; i++) {
			double s = 0;
			for (uint64_t k = 0; k < W[i].nlat; k++) {
				s += LAT[(size_t)i * O.iters + k];
				LAT[n++] = LAT[(size_t)i * O.iters + k];
			}
			means[i] = W[i].nlat ? s / (double)W[i].nlat : NAN;
		}
		double msum = 0;
		int mn = 0;
		for (int i = 0; i < nw; i++)
			if (!isnan(means[i])) {
				msum += means[i];
				mn++;
			}
		jw_num(&j, "client_mean_lat_us", mn ? msum / mn : NAN);
		lat_summary(&j, LAT, n, "lat_us");
	}
	jw_obj_begin(&j, "cpu");
	jw_num(&j, "user", cu);
	jw_num(&j, "sys", cs);
	jw_num(&j, "total", cu + cs);
	jw_num(&j, "per_s", secs > 0 ? (cu + cs) / secs : NAN);
	jw_obj_end(&j);
	jw_transport(&j, &tc);
	jw_sdp_stats(&j, &st);
	jw_end_print(&j, stdout);
	return errs ? 1 : 0;
}

static int connrate_main(void)
{
	signal(SIGPIPE, SIG_IGN);
	alarm((unsigned)(O.time_s * 2 + 60));
	size_t cap = O.count ? O.count : 1;
	double *lat = calloc(cap, sizeof(double));
	if (!lat)
		return 1;
	struct tcount tc = {0};
	double u0, s0, u1, s1;
	int err = 0;
	const char *what = "";
	/* Untimed connections first (--warmup N): a process's first
	 * connection may load libraries (libfabric for a fabric between
	 * hosts); its time is reported apart as first_us. */
	double first_us = NAN;
	for (uint64_t w = 0; O.warmup_given && w < O.warmup; w++) {
		uint64_t t = now_ns();
		int fd = connect_to(O.host, O.port);
		if (fd < 0) {
			err = errno ? errno : EIO;
			what = "connect (warm-up)";
			break;
		}
		char c;
		ssize_t r;
		do {
			r = recv(fd, &c, 1, 0);
		} while (r < 0 && errno == EINTR);
		close(fd);
		if (w == 0)
			first_us = (double)(now_ns() - t) / 1000.0;
	}
	cpu_self(&u0, &s0);
	uint64_t t0 = now_ns(), deadline = t0 + (uint64_t)(O.time_s * 1e9);
	size_t n = 0;
	while (!err && n < cap && now_ns() < deadline) {
		uint64_t t = now_ns();
		int fd = connect_to(O.host, O.port);
		if (fd < 0) {
			err = errno ? errno : EIO;
			what = "connect";
			break;
		}
		if (n < 4)
			tcount_add(&tc, transport_of(fd));
		char c;
		ssize_t r;
		do {
			r = recv(fd, &c, 1, 0);
		} while (r < 0 && errno == EINTR);
		close(fd);
		if (r != 0 && !(r < 0 && errno == ECONNRESET)) {
			err = r < 0 ? errno : EPROTO;
			what = "expected EOF";
			break;
		}
		lat[n++] = (double)(now_ns() - t) / 1000.0;
	}
	uint64_t t1 = now_ns();
	cpu_self(&u1, &s1);
	double secs = (double)(t1 - t0) / 1e9;
	struct jw j;
	jw_begin(&j);
	jw_str(&j, "tool", "sdp-perf");
	jw_str(&j, "role", "client");
	jw_str(&j, "test", "connrate");
	jw_int(&j, "ok", err == 0 && n > 0);
	if (err) {
		char m[128];
		snprintf(m, sizeof(m), "%s: %s", what, strerror(err));
		jw_str(&j, "error", m);
	}
	jw_int(&j, "connections", (int64_t)n);
	jw_num(&j, "seconds", secs);
	jw_num(&j, "conn_per_s", secs > 0 ? (double)n / secs : NAN);
	if (O.warmup_given)
		jw_num(&j, "first_us", first_us);
	lat_summary(&j, lat, n, "lat_us");
	jw_obj_begin(&j, "cpu");
	jw_num(&j, "user", u1 - u0);
	jw_num(&j, "sys", s1 - s0);
	jw_num(&j, "total", u1 - u0 + s1 - s0);
	jw_num(&j, "per_s", secs > 0 ? (u1 - u0 + s1 - s0) / secs : NAN);
	jw_obj_end(&j);
	jw_transport(&j, &tc);
	jw_end_print(&j, stdout);
	free(lat);
	return err == 0 && n > 0 ? 0 : 1;
}

int main(int argc, char **argv)
{
	parse_args(argc, argv);
	if (!strcmp(O.cmd, "server"))
		return server_main();
	if (!strcmp(O.cmd, "pingpong"))
		return client_main(M_PINGPONG);
	if (!strcmp(O.cmd, "stream"))
		return client_main(O.reverse ? M_SOURCE : M_SINK);
	if (!strcmp(O.cmd, "connrate"))
		return connrate_main();
	usage();
	return 2;
}
