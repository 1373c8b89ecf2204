/*
 * sdp-appserver - the application tier of the data-center benchmark.
 *
 * A small HTTP/1.1 server (keep-alive, one thread per connection) that, for
 * every request, reads one item from redis (GET item:<n>, RESP protocol over
 * a connection of its own per client connection) and answers with an HTML
 * page that embeds the value. Plain blocking sockets, so that `sdp run`
 * carries both its HTTP and its redis connections over SDP.
 *
 *   sdp-appserver --port P [--bind A] --redis-port R [--redis-host H]
 *                 [--keys N] [--value-size S] [--populate] [--timeout S]
 */
#include "perf_common.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static const char *g_bind = "127.0.0.1", *g_rhost = "127.0.0.1";
static int g_port, g_rport;
static int g_keys = 1000;
static size_t g_vsize = 1024;
static int g_populate;
static double g_timeout = 600;
static atomic_uint_fast64_t g_counter, g_requests, g_errors, g_conns;
static volatile sig_atomic_t g_stop;

static void on_stop(int s)
{
	(void)s;
	g_stop = 1;
}

static int send_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t r = send(fd, p, n, MSG_NOSIGNAL);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -1;
		}
		p += r;
		n -= (size_t)r;
	}
	return 0;
}

static int dial(const char *host, int port)
{
	struct addrinfo hints = {0}, *res = NULL;
	char ps[16];
	hints.ai_family = AF_INET;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(ps, sizeof(ps), "%d", port);
	if (getaddrinfo(host, ps, &hints, &res) != 0 || !res)
		return -1;
	int fd = socket(AF_INET, SOCK_STREAM, 0);
	if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) < 0) {
		close(fd);
		fd = -1;
	}
	freeaddrinfo(res);
	if (fd >= 0) {
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	return fd;
}

/* buffered reader over a socket */
struct rd {
	int fd;
	char buf[65536];
	size_t off, len;
};

static int rd_fill(struct rd *r)
{
	if (r->off > 0 && r->off < r->len) {
		memmove(r->buf, r->buf + r->off, r->len - r->off);
		r->len -= r->off;
	} else if (r->off >= r->len) {
		r->len = 0;
	}
	r->off = 0;
	if (r->len == sizeof(r->buf))
		return -1;
	ssize_t n;
	do {
		n = recv(r->fd, r->buf + r->len, sizeof(r->buf) - r->len, 0);
	} while (n < 0 && errno == EINTR);
	if (n <= 0)
		return -1;
	r->len += (size_t)n;
	return 0;
}

/* returns a pointer to a line (without CRLF) or NULL */
static char *rd_line(struct rd *r)
{
	for (;;) {
		char *s = r->buf + r->off;
		char *e = memmem(s, r->len - r->off, "\r\n", 2);
		if (e) {
			*e = 0;
			r->off = (size_t)(e - r->buf) + 2;
			return s;
		}
		if (rd_fill(r) < 0)
			return NULL;
	}
}

static int rd_bytes(struct rd *r, char *dst, size_t n)
{
	while (n) {
		if (r->off == r->len && rd_fill(r) < 0)
			return -1;
		size_t k = r->len - r->off < n ? r->len - r->off : n;
		memcpy(dst, r->buf + r->off, k);
		r->off += k;
		dst += k;
		n -= k;
	}
	return 0;
}

/* One RESP command; the reply's bulk string goes to out (NULL reply -> 0). */
static long redis_cmd(int fd, struct rd *r, const char *cmd, const char *key,
		      const char *val, size_t vlen, char *out, size_t cap)
{
	char hdr[256];
	int n;
	if (val)
		n = snprintf(hdr, sizeof(hdr), "*3\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n$%zu\r\n",
			     strlen(cmd), cmd, strlen(key), key, vlen);
	else
		n = snprintf(hdr, sizeof(hdr), "*2\r\n$%zu\r\n%s\r\n$%zu\r\n%s\r\n",
			     strlen(cmd), cmd, strlen(key), key);
	if (send_all(fd, hdr, (size_t)n) < 0)
		return -1;
	if (val && (send_all(fd, val, vlen) < 0 || send_all(fd, "\r\n", 2) < 0))
		return -1;
	char *line = rd_line(r);
	if (!line)
		return -1;
	if (line[0] == '+' || line[0] == ':')
		return 0;
	if (line[0] != '$')
		return -1;
	long len = atol(line + 1);
	if (len < 0)
		return 0;
	char crlf[2];
	size_t take = (size_t)len < cap ? (size_t)len : cap;
	if (rd_bytes(r, out, take) < 0)
		return -1;
	for (size_t left = (size_t)len - take; left;) {  /* drop what doesn't fit */
		char sink[4096];
		size_t k = left < sizeof(sink) ? left : sizeof(sink);
		if (rd_bytes(r, sink, k) < 0)
			return -1;
		left -= k;
	}
	if (rd_bytes(r, crlf, 2) < 0)
		return -1;
	return (long)take;
}

static void *serve(void *arg)
{
	int fd = (int)(intptr_t)arg;
	struct rd *in = calloc(1, sizeof(*in)), *rr = calloc(1, sizeof(*rr));
	size_t bodycap = g_vsize + 4096;
	char *val = malloc(g_vsize + 1), *body = malloc(bodycap);
	int rfd = -1;
	if (!in || !rr || !val || !body)
		goto out;
	in->fd = fd;
	int one = 1;
	setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	for (;;) {
		/* request line + headers */
		char *line = rd_line(in);
		if (!line)
			break;
		int keepalive = strstr(line, "HTTP/1.1") != NULL;
		int bad = strncmp(line, "GET ", 4) != 0;
		for (;;) {
			char *h = rd_line(in);
			if (!h)
				goto out;
			if (!*h)
				break;
			if (!strncasecmp(h, "Connection:", 11)) {
				if (strcasestr(h, "close"))
					keepalive = 0;
				else if (strcasestr(h, "keep-alive"))
					keepalive = 1;
			}
		}
		long vlen = 0;
		if (!bad) {
			if (rfd < 0) {
				rfd = dial(g_rhost, g_rport);
				rr->fd = rfd;
				rr->off = rr->len = 0;
			}
			char key[64];
			uint64_t n = atomic_fetch_add(&g_counter, 1);
			snprintf(key, sizeof(key), "item:%llu", (unsigned long long)(n % (uint64_t)g_keys));
			vlen = rfd >= 0 ? redis_cmd(rfd, rr, "GET", key, NULL, 0, val, g_vsize) : -1;
			if (vlen < 0) {
				atomic_fetch_add(&g_errors, 1);
				if (rfd >= 0)
					close(rfd);
				rfd = -1;
			}
		}
		int blen;
		const char *status = "200 OK";
		if (bad) {
			status = "400 Bad Request";
			blen = snprintf(body, bodycap, "bad request\n");
		} else if (vlen < 0) {
			status = "502 Bad Gateway";
			blen = snprintf(body, bodycap, "redis unavailable\n");
		} else {
			blen = snprintf(body, bodycap,
					"<html><head><title>item</title></head><body><h1>Item</h1>"
					"<p>request %llu</p><pre>",
					(unsigned long long)atomic_load(&g_requests));
			memcpy(body + blen, val, (size_t)vlen);
			blen += (int)vlen;
			blen += snprintf(body + blen, bodycap - (size_t)blen, "</pre></body></html>\n");
		}
		char hdr[256];
		int hl = snprintf(hdr, sizeof(hdr),
				  "HTTP/1.1 %s\r\nContent-Type: text/html\r\nContent-Length: %d\r\n"
				  "Connection: %s\r\n\r\n", status, blen, keepalive ? "keep-alive" : "close");
		if (send_all(fd, hdr, (size_t)hl) < 0 || send_all(fd, body, (size_t)blen) < 0)
			break;
		atomic_fetch_add(&g_requests, 1);
		if (!keepalive)
			break;
	}
out:
	if (rfd >= 0)
		close(rfd);
	close(fd);
	free(in);
	free(rr);
	free(val);
	free(body);
	return NULL;
}

static int populate(void)
{
	int fd = dial(g_rhost, g_rport);
	if (fd < 0)
		return -1;
	struct rd *r = calloc(1, sizeof(*r));
	char *v = malloc(g_vsize);
	if (!r || !v)
		return -1;
	r->fd = fd;
	for (size_t i = 0; i < g_vsize; i++)
		v[i] = (char)('a' + i % 26);
	for (int k = 0; k < g_keys; k++) {
		char key[64];
		snprintf(key, sizeof(key), "item:%d", k);
		if (redis_cmd(fd, r, "SET", key, v, g_vsize, NULL, 0) < 0) {
			close(fd);
			return -1;
		}
	}
	close(fd);
	free(r);
	free(v);
	return 0;
}

int main(int argc, char **argv)
{
	for (int i = 1; i < argc; i++) {
		const char *v = i + 1 < argc ? argv[i + 1] : "";
		if (!strcmp(argv[i], "--port")) { g_port = atoi(v); i++; }
		else if (!strcmp(argv[i], "--bind")) { g_bind = v; i++; }
		else if (!strcmp(argv[i], "--redis-port")) { g_rport = atoi(v); i++; }
		else if (!strcmp(argv[i], "--redis-host")) { g_rhost = v; i++; }
		else if (!strcmp(argv[i], "--keys")) { g_keys = atoi(v); i++; }
		else if (!strcmp(argv[i], "--value-size")) { g_vsize = parse_size(v); i++; }
		else if (!strcmp(argv[i], "--timeout")) { g_timeout = atof(v); i++; }
		else if (!strcmp(argv[i], "--populate")) { g_populate = 1; }
		else {
			fprintf(stderr, "usage: sdp-appserver --port P [--bind A] --redis-port R "
				"[--redis-host H] [--keys N] [--value-size S] [--populate] [--timeout S]\n");
			return 2;
		}
	}
	if (g_keys < 1 || !g_rport || g_vsize == 0 || g_vsize > (16u << 20))
		return 2;
	signal(SIGPIPE, SIG_IGN);
	struct sigaction sa = {0};
	sa.sa_handler = on_stop;
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	if (g_populate && populate() < 0) {
		fprintf(stderr, "sdp-appserver: cannot populate redis at %s:%d\n", g_rhost, g_rport);
		return 1;
	}
	struct sockaddr_in a = {0};
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)g_port);
	if (inet_pton(AF_INET, g_bind, &a.sin_addr) != 1)
		return 2;
	int lfd = socket(AF_INET, SOCK_STREAM, 0);
	int one = 1;
	setsockopt(lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(lfd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(lfd, 1024) < 0) {
		perror("sdp-appserver: bind/listen");
		return 1;
	}
	socklen_t al = sizeof(a);
	getsockname(lfd, (struct sockaddr *)&a, &al);
	printf("{\"event\":\"listening\",\"port\":%d,\"pid\":%d}\n", ntohs(a.sin_port), (int)getpid());
	fflush(stdout);
	uint64_t deadline = now_ns() + (uint64_t)(g_timeout * 1e9);
	while (!g_stop && now_ns() < deadline) {
		struct pollfd p = { .fd = lfd, .events = POLLIN };
		if (poll(&p, 1, 100) <= 0)
			continue;
		int cfd = accept(lfd, NULL, NULL);
		if (cfd < 0)
			continue;
		atomic_fetch_add(&g_conns, 1);
		pthread_t th;
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&at, 256 * 1024);
		if (pthread_create(&th, &at, serve, (void *)(intptr_t)cfd) != 0)
			close(cfd);
		pthread_attr_destroy(&at);
	}
	printf("{\"role\":\"appserver\",\"requests\":%llu,\"connections\":%llu,\"redis_errors\":%llu}\n",
	       (unsigned long long)atomic_load(&g_requests), (unsigned long long)atomic_load(&g_conns),
	       (unsigned long long)atomic_load(&g_errors));
	fflush(stdout);
	return 0;
}
