/*
 * test_policy.c - unit tests for the socket switch's policy parser/matcher
 * (src/switch/policy.c). Exit status 0 when every check passes, 1 otherwise.
 */
#include "switch/policy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

static int failures, checks;

#define CHECK(cond) do {						\
	checks++;							\
	if (!(cond)) {							\
		failures++;						\
		fprintf(stderr, "%s:%d: %s: check failed: %s\n",	\
			__FILE__, __LINE__, __func__, #cond);		\
	}								\
} while (0)

#define CHECK_INT(got, want) do {					\
	long g_ = (long)(got), w_ = (long)(want);			\
	checks++;							\
	if (g_ != w_) {							\
		failures++;						\
		fprintf(stderr, "%s:%d: %s: %s is %ld, want %ld\n",	\
			__FILE__, __LINE__, __func__, #got, g_, w_);	\
	}								\
} while (0)

#define CHECK_STR(got, want) do {					\
	const char *g_ = (got), *w_ = (want);				\
	checks++;							\
	if (!g_ || strcmp(g_, w_) != 0) {				\
		failures++;						\
		fprintf(stderr, "%s:%d: %s: %s is \"%s\", want \"%s\"\n",\
			__FILE__, __LINE__, __func__, #got,		\
			g_ ? g_ : "(null)", w_);			\
	}								\
} while (0)

/* ---- helpers ---------------------------------------------------------------- */

#define MAX_ERRS 16

struct errs {
	int n;
	char msg[MAX_ERRS][512];
};

static void collect(const char *msg, void *arg)
{
	struct errs *e = arg;

	if (e->n < MAX_ERRS)
		snprintf(e->msg[e->n], sizeof(e->msg[0]), "%s", msg);
	e->n++;
}

/* Parse text that must be entirely valid. */
static struct sdp_policy *good(const char *text)
{
	struct errs e = { 0 };
	struct sdp_policy *p = sdp_policy_parse(text, "good.conf", collect, &e);

	CHECK(p != NULL);
	CHECK_INT(e.n, 0);
	for (int i = 0; i < e.n && i < MAX_ERRS; i++)
		fprintf(stderr, "  unexpected report: %s\n", e.msg[i]);
	return p;
}

static enum sdp_use m4(const struct sdp_policy *p, enum sdp_role role,
		       const char *prog, const char *ip, unsigned port)
{
	struct sockaddr_in sin;

	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	sin.sin_port = htons((uint16_t)port);
	if (inet_pton(AF_INET, ip, &sin.sin_addr) != 1)
		abort();
	return sdp_policy_match(p, role, prog, (struct sockaddr *)&sin,
				sizeof(sin));
}

static enum sdp_use m6(const struct sdp_policy *p, enum sdp_role role,
		       const char *prog, const char *ip, unsigned port)
{
	struct sockaddr_in6 sin6;

	memset(&sin6, 0, sizeof(sin6));
	sin6.sin6_family = AF_INET6;
	sin6.sin6_port = htons((uint16_t)port);
	if (inet_pton(AF_INET6, ip, &sin6.sin6_addr) != 1)
		abort();
	return sdp_policy_match(p, role, prog, (struct sockaddr *)&sin6,
				sizeof(sin6));
}

#define S SDP_ROLE_SERVER
#define C SDP_ROLE_CLIENT
#define TCP SDP_USE_TCP
#define SDP SDP_USE_SDP
#define BOTH SDP_USE_BOTH

/* ---- matching ----------------------------------------------------------------- */

static void test_empty(void)
{
	struct sdp_policy *p = good("");
	const char *v = "untouched";

	CHECK_INT(sdp_policy_nrules(p), 0);
	CHECK_INT(m4(p, C, "nginx", "10.0.0.1", 80), TCP);
	CHECK_INT(sdp_policy_setting(p, "spin_us", &v), -ENOENT);
	CHECK_STR(v, "untouched");
	sdp_policy_free(p);

	p = good("\n\n   \n\t\n# only a comment\n");
	CHECK_INT(sdp_policy_nrules(p), 0);
	sdp_policy_free(p);
}

static void test_first_match_wins(void)
{
	struct sdp_policy *p = good(
		"use tcp * nginx 10.0.0.1:80\n"
		"use both * nginx 10.0.0.0/8:80\n"
		"use sdp * * *\n"
		"use tcp * * *\n");

	CHECK_INT(sdp_policy_nrules(p), 4);
	CHECK_INT(m4(p, C, "nginx", "10.0.0.1", 80), TCP);
	CHECK_INT(m4(p, C, "nginx", "10.0.0.2", 80), BOTH);
	CHECK_INT(m4(p, C, "nginx", "10.0.0.1", 81), SDP);
	CHECK_INT(m4(p, C, "curl", "10.0.0.1", 80), SDP);
	sdp_policy_free(p);
}

static void test_use_and_role(void)
{
	struct sdp_policy *p = good(
		"use sdp server a *\n"
		"use both client a *\n"
		"use tcp * b *\n"
		"use sdp * b2 *\n"
		"use both * b3 *\n"
		"use sdp server c *\n");

	CHECK_INT(m4(p, S, "a", "1.2.3.4", 1), SDP);
	CHECK_INT(m4(p, C, "a", "1.2.3.4", 1), BOTH);
	CHECK_INT(m4(p, S, "b", "1.2.3.4", 1), TCP);
	CHECK_INT(m4(p, C, "b", "1.2.3.4", 1), TCP);
	CHECK_INT(m4(p, S, "b2", "1.2.3.4", 1), SDP);
	CHECK_INT(m4(p, C, "b2", "1.2.3.4", 1), SDP);
	CHECK_INT(m6(p, S, "b3", "::1", 1), BOTH);
	CHECK_INT(m6(p, C, "b3", "::1", 1), BOTH);
	CHECK_INT(m4(p, S, "c", "1.2.3.4", 1), SDP);
	CHECK_INT(m4(p, C, "c", "1.2.3.4", 1), TCP);   /* no client rule */
	CHECK_INT(m4(p, (enum sdp_role)0, "b2", "1.2.3.4", 1), TCP);
	sdp_policy_free(p);
}

static void test_globs(void)
{
	struct sdp_policy *p = good(
		"use sdp * nginx *\n"
		"use both * redis-* *\n"
		"use sdp * ?ttpd *\n"
		"use both * [jk]ava *\n"
		"use sdp * *-bench *\n");

	CHECK_INT(m4(p, C, "nginx", "1.1.1.1", 1), SDP);
	CHECK_INT(m4(p, C, "nginx2", "1.1.1.1", 1), TCP);     /* not a prefix match */
	CHECK_INT(m4(p, C, "xnginx", "1.1.1.1", 1), TCP);
	CHECK_INT(m4(p, C, "redis-server", "1.1.1.1", 1), BOTH);
	CHECK_INT(m4(p, C, "redis-", "1.1.1.1", 1), BOTH);
	CHECK_INT(m4(p, C, "redis", "1.1.1.1", 1), TCP);
	CHECK_INT(m4(p, C, "httpd", "1.1.1.1", 1), SDP);
	CHECK_INT(m4(p, C, "ttpd", "1.1.1.1", 1), TCP);
	CHECK_INT(m4(p, C, "java", "1.1.1.1", 1), BOTH);
	CHECK_INT(m4(p, C, "kava", "1.1.1.1", 1), BOTH);
	CHECK_INT(m4(p, C, "lava", "1.1.1.1", 1), TCP);
	CHECK_INT(m4(p, C, "sdp-bench", "1.1.1.1", 1), SDP);
	CHECK_INT(m4(p, C, NULL, "1.1.1.1", 1), TCP);
	sdp_policy_free(p);

	p = good("use sdp * * *\n");
	CHECK_INT(m4(p, C, "", "1.1.1.1", 1), SDP);
	CHECK_INT(m4(p, C, NULL, "1.1.1.1", 1), SDP);
	sdp_policy_free(p);
}

static void test_ipv4_prefixes(void)
{
	struct sdp_policy *p = good(
		"use sdp * exact 10.1.2.3:80\n"
		"use sdp * p32 10.1.2.3/32:80\n"
		"use sdp * p8 10.1.2.3/8:80\n"          /* host bits are ignored */
		"use sdp * p0 192.168.1.1/0:80\n"
		"use sdp * p25 192.168.1.128/25:80\n"
		"use sdp * p31 192.168.1.2/31:80\n"
		"use sdp * p1 128.0.0.0/1:80\n"
		"use sdp * zero 0.0.0.0:80\n");

	CHECK_INT(m4(p, C, "exact", "10.1.2.3", 80), SDP);
	CHECK_INT(m4(p, C, "exact", "10.1.2.4", 80), TCP);
	CHECK_INT(m4(p, C, "p32", "10.1.2.3", 80), SDP);
	CHECK_INT(m4(p, C, "p32", "10.1.2.2", 80), TCP);
	CHECK_INT(m4(p, C, "p8", "10.0.0.0", 80), SDP);
	CHECK_INT(m4(p, C, "p8", "10.255.255.255", 80), SDP);
	CHECK_INT(m4(p, C, "p8", "11.0.0.0", 80), TCP);
	CHECK_INT(m4(p, C, "p8", "9.255.255.255", 80), TCP);
	CHECK_INT(m4(p, C, "p0", "1.2.3.4", 80), SDP);
	CHECK_INT(m4(p, C, "p0", "255.255.255.255", 80), SDP);
	CHECK_INT(m6(p, C, "p0", "::1", 80), TCP);            /* v4 rule, v6 addr */
	CHECK_INT(m4(p, C, "p25", "192.168.1.128", 80), SDP);
	CHECK_INT(m4(p, C, "p25", "192.168.1.255", 80), SDP);
	CHECK_INT(m4(p, C, "p25", "192.168.1.127", 80), TCP);
	CHECK_INT(m4(p, C, "p31", "192.168.1.2", 80), SDP);
	CHECK_INT(m4(p, C, "p31", "192.168.1.3", 80), SDP);
	CHECK_INT(m4(p, C, "p31", "192.168.1.4", 80), TCP);
	CHECK_INT(m4(p, C, "p31", "192.168.1.1", 80), TCP);
	CHECK_INT(m4(p, C, "p1", "200.1.1.1", 80), SDP);
	CHECK_INT(m4(p, C, "p1", "127.255.255.255", 80), TCP);
	CHECK_INT(m4(p, S, "zero", "0.0.0.0", 80), SDP);
	CHECK_INT(m4(p, S, "zero", "127.0.0.1", 80), TCP);
	sdp_policy_free(p);
}

static void test_ipv6(void)
{
	struct sdp_policy *p = good(
		"use sdp * lo [::1]:80\n"
		"use sdp * ll1 [fe80::]/10:80\n"
		"use sdp * ll2 [fe80::/10]:80\n"
		"use sdp * doc1 [2001:db8::]/32:80\n"
		"use sdp * doc2 [2001:db8::/32]:80\n"
		"use sdp * any [::]/0:80\n"
		"use sdp * p128 [2001:db8::5/128]:80\n"
		"use sdp * p127 [2001:db8::4]/127:80\n"
		"use sdp * p68 [2001:db8:0:0:f000::]/68:80\n");

	CHECK_INT(m6(p, C, "lo", "::1", 80), SDP);
	CHECK_INT(m6(p, C, "lo", "::2", 80), TCP);
	CHECK_INT(m4(p, C, "lo", "127.0.0.1", 80), TCP);
	CHECK_INT(m6(p, C, "ll1", "fe80::1", 80), SDP);
	CHECK_INT(m6(p, C, "ll1", "febf:ffff::1", 80), SDP);
	CHECK_INT(m6(p, C, "ll1", "fec0::1", 80), TCP);
	CHECK_INT(m6(p, C, "ll2", "fe80::1234", 80), SDP);
	CHECK_INT(m6(p, C, "ll2", "fe00::1", 80), TCP);
	CHECK_INT(m6(p, C, "doc1", "2001:db8:ffff::1", 80), SDP);
	CHECK_INT(m6(p, C, "doc1", "2001:db9::1", 80), TCP);
	CHECK_INT(m6(p, C, "doc2", "2001:db8::42", 80), SDP);
	CHECK_INT(m6(p, C, "doc2", "2001:db7::42", 80), TCP);
	CHECK_INT(m6(p, C, "any", "ffff::1", 80), SDP);
	CHECK_INT(m6(p, C, "any", "::", 80), SDP);
	CHECK_INT(m4(p, C, "any", "1.2.3.4", 80), TCP);       /* v6 rule, v4 addr */
	CHECK_INT(m6(p, C, "p128", "2001:db8::5", 80), SDP);
	CHECK_INT(m6(p, C, "p128", "2001:db8::4", 80), TCP);
	CHECK_INT(m6(p, C, "p127", "2001:db8::4", 80), SDP);
	CHECK_INT(m6(p, C, "p127", "2001:db8::5", 80), SDP);
	CHECK_INT(m6(p, C, "p127", "2001:db8::6", 80), TCP);
	CHECK_INT(m6(p, C, "p68", "2001:db8::f000:0:0:1", 80), SDP);
	CHECK_INT(m6(p, C, "p68", "2001:db8::ffff:0:0:1", 80), SDP);
	CHECK_INT(m6(p, C, "p68", "2001:db8::e000:0:0:1", 80), TCP);
	sdp_policy_free(p);
}

static void test_v4_mapped(void)
{
	struct sdp_policy *p = good(
		"use sdp * * 10.0.0.0/8:80\n"
		"use both * * 192.168.0.1:80\n");

	CHECK_INT(m6(p, C, "x", "::ffff:10.1.2.3", 80), SDP);
	CHECK_INT(m6(p, C, "x", "::ffff:192.168.0.1", 80), BOTH);
	CHECK_INT(m6(p, C, "x", "::ffff:192.168.0.2", 80), TCP);
	CHECK_INT(m6(p, C, "x", "::ffff:11.1.2.3", 80), TCP);
	CHECK_INT(m6(p, C, "x", "::ffff:10.1.2.3", 81), TCP);
	CHECK_INT(m6(p, C, "x", "::10.1.2.3", 80), TCP);      /* v4-compatible is not mapped */
	CHECK_INT(m6(p, C, "x", "::fffe:10.1.2.3", 80), TCP);
	sdp_policy_free(p);
}

static void test_ports(void)
{
	struct sdp_policy *p = good(
		"use sdp * one *:80\n"
		"use sdp * range *:1000-2000\n"
		"use sdp * zero *:0\n"
		"use sdp * top *:65535\n"
		"use sdp * all *:0-65535\n"
		"use sdp * star 1.2.3.4:*\n"
		"use sdp * single *:7-7\n");

	CHECK_INT(m4(p, C, "one", "1.1.1.1", 80), SDP);
	CHECK_INT(m4(p, C, "one", "1.1.1.1", 79), TCP);
	CHECK_INT(m4(p, C, "one", "1.1.1.1", 81), TCP);
	CHECK_INT(m4(p, C, "range", "1.1.1.1", 999), TCP);
	CHECK_INT(m4(p, C, "range", "1.1.1.1", 1000), SDP);
	CHECK_INT(m4(p, C, "range", "1.1.1.1", 1500), SDP);
	CHECK_INT(m4(p, C, "range", "1.1.1.1", 2000), SDP);
	CHECK_INT(m4(p, C, "range", "1.1.1.1", 2001), TCP);
	CHECK_INT(m4(p, S, "zero", "1.1.1.1", 0), SDP);
	CHECK_INT(m4(p, S, "zero", "1.1.1.1", 1), TCP);
	CHECK_INT(m4(p, C, "top", "1.1.1.1", 65535), SDP);
	CHECK_INT(m4(p, C, "top", "1.1.1.1", 65534), TCP);
	CHECK_INT(m4(p, C, "all", "1.1.1.1", 0), SDP);
	CHECK_INT(m4(p, C, "all", "1.1.1.1", 65535), SDP);
	CHECK_INT(m6(p, C, "all", "::1", 12345), SDP);
	CHECK_INT(m4(p, C, "star", "1.2.3.4", 0), SDP);
	CHECK_INT(m4(p, C, "star", "1.2.3.4", 65535), SDP);
	CHECK_INT(m4(p, C, "star", "1.2.3.5", 80), TCP);
	CHECK_INT(m4(p, C, "single", "1.1.1.1", 7), SDP);
	CHECK_INT(m4(p, C, "single", "1.1.1.1", 8), TCP);
	sdp_policy_free(p);
}

static void test_star_forms(void)
{
	struct sdp_policy *p = good(
		"use sdp * a *\n"
		"use sdp * b *:*\n"
		"use sdp * c *:443\n"
		"use sdp * d 10.0.0.0/8:*\n"
		"use sdp * e [::]/0:*\n"
		"use sdp * f 0.0.0.0/0:*\n");

	CHECK_INT(m4(p, C, "a", "8.8.8.8", 0), SDP);
	CHECK_INT(m6(p, C, "a", "2001:db8::1", 65535), SDP);
	CHECK_INT(m6(p, C, "a", "::ffff:1.2.3.4", 1), SDP);
	CHECK_INT(m4(p, C, "b", "8.8.8.8", 9), SDP);
	CHECK_INT(m6(p, C, "b", "::1", 9), SDP);
	CHECK_INT(m4(p, C, "c", "8.8.8.8", 443), SDP);
	CHECK_INT(m6(p, C, "c", "::1", 443), SDP);
	CHECK_INT(m6(p, C, "c", "::1", 444), TCP);
	CHECK_INT(m4(p, C, "d", "10.9.9.9", 1), SDP);
	CHECK_INT(m6(p, C, "d", "::1", 1), TCP);
	CHECK_INT(m6(p, C, "e", "::1", 1), SDP);
	CHECK_INT(m4(p, C, "e", "10.9.9.9", 1), TCP);
	CHECK_INT(m4(p, C, "f", "10.9.9.9", 1), SDP);
	CHECK_INT(m6(p, C, "f", "::ffff:10.9.9.9", 1), SDP);
	CHECK_INT(m6(p, C, "f", "::1", 1), TCP);
	sdp_policy_free(p);
}

static void test_odd_addresses(void)
{
	struct sdp_policy *p = good("use sdp * * *\n");
	struct sockaddr_un sun;
	struct sockaddr_in sin;

	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	CHECK_INT(sdp_policy_match(p, C, "x", (struct sockaddr *)&sun, sizeof(sun)), TCP);
	CHECK_INT(sdp_policy_match(p, C, "x", NULL, 0), TCP);
	memset(&sin, 0, sizeof(sin));
	sin.sin_family = AF_INET;
	CHECK_INT(sdp_policy_match(p, C, "x", (struct sockaddr *)&sin, sizeof(sin)), SDP);
	CHECK_INT(sdp_policy_match(p, C, "x", (struct sockaddr *)&sin, 4), TCP);  /* short */
	CHECK_INT(sdp_policy_match(p, C, "x", (struct sockaddr *)&sin, 1), TCP);
	CHECK_INT(sdp_policy_match(NULL, C, "x", (struct sockaddr *)&sin, sizeof(sin)), TCP);
	CHECK_INT(sdp_policy_nrules(NULL), 0);
	CHECK_INT(sdp_policy_setting(NULL, "x", NULL), -ENOENT);
	sdp_policy_free(NULL);
	sdp_policy_free(p);
}

/* ---- syntax ------------------------------------------------------------------- */

static void test_comments_and_spacing(void)
{
	struct sdp_policy *p = good(
		"# header comment\n"
		"   # indented comment\n"
		"\n"
		"use sdp * a *:80   # trailing comment\n"
		"\tuse\tboth\t*\tb\t*:80\t\n"
		"use sdp * c *:81#glued comment\n"
		"#use sdp * d *:80\n"
		"set spin_us 50 # comment after a setting\n"
		"   \t  \n");

	CHECK_INT(sdp_policy_nrules(p), 3);
	CHECK_INT(m4(p, C, "a", "1.1.1.1", 80), SDP);
	CHECK_INT(m4(p, C, "b", "1.1.1.1", 80), BOTH);
	CHECK_INT(m4(p, C, "c", "1.1.1.1", 81), SDP);
	CHECK_INT(m4(p, C, "d", "1.1.1.1", 80), TCP);
	const char *v = NULL;
	CHECK_INT(sdp_policy_setting(p, "spin_us", &v), 0);
	CHECK_STR(v, "50");
	sdp_policy_free(p);
}

static void test_crlf(void)
{
	struct sdp_policy *p = good(
		"# dos file\r\n"
		"use sdp * a *:80\r\n"
		"\r\n"
		"use both * b [::1]:1-2\r\n"
		"set zcopy_thresh 65536\r\n");
	const char *v = NULL;

	CHECK_INT(sdp_policy_nrules(p), 2);
	CHECK_INT(m4(p, C, "a", "1.1.1.1", 80), SDP);
	CHECK_INT(m6(p, C, "b", "::1", 2), BOTH);
	CHECK_INT(sdp_policy_setting(p, "zcopy_thresh", &v), 0);
	CHECK_STR(v, "65536");
	sdp_policy_free(p);

	/* line numbers are still right in a CRLF file */
	struct errs e = { 0 };
	p = sdp_policy_parse("use sdp * a *\r\n\r\nuse sdp * a 1.2.3.4:x\r\n",
			     "dos.conf", collect, &e);
	CHECK_INT(e.n, 1);
	CHECK_STR(e.msg[0], "dos.conf:3: bad port 'x'");
	sdp_policy_free(p);
}

static void test_no_trailing_newline(void)
{
	struct sdp_policy *p = good("use tcp * a *:1\nuse sdp * b *:2");
	const char *v = NULL;

	CHECK_INT(sdp_policy_nrules(p), 2);
	CHECK_INT(m4(p, C, "b", "1.1.1.1", 2), SDP);
	sdp_policy_free(p);

	p = good("set spin_us 7");
	CHECK_INT(sdp_policy_setting(p, "spin_us", &v), 0);
	CHECK_STR(v, "7");
	sdp_policy_free(p);

	p = good("use sdp * b *:2\r");
	CHECK_INT(m4(p, C, "b", "1.1.1.1", 2), SDP);
	sdp_policy_free(p);

	struct errs e = { 0 };
	p = sdp_policy_parse("use sdp * a *\nuse sdp", "t.conf", collect, &e);
	CHECK_INT(e.n, 1);
	CHECK_STR(e.msg[0], "t.conf:2: 'use' expects 4 fields, got 1");
	sdp_policy_free(p);
}

static void test_settings(void)
{
	struct sdp_policy *p = good(
		"set spin_us 10\n"
		"set zcopy_thresh 4096\n"
		"set unknown_knob Whatever-Value/1\n"
		"set spin_us 20\n"
		"use sdp * * *\n"
		"set spin_us 30\n"
		"set _ x\n");
	const char *v = NULL;

	CHECK_INT(sdp_policy_nrules(p), 1);
	CHECK_INT(sdp_policy_setting(p, "spin_us", &v), 0);
	CHECK_STR(v, "30");
	CHECK_INT(sdp_policy_setting(p, "zcopy_thresh", &v), 0);
	CHECK_STR(v, "4096");
	CHECK_INT(sdp_policy_setting(p, "unknown_knob", &v), 0);
	CHECK_STR(v, "Whatever-Value/1");
	CHECK_INT(sdp_policy_setting(p, "_", &v), 0);
	CHECK_STR(v, "x");
	CHECK_INT(sdp_policy_setting(p, "spin", NULL), -ENOENT);
	CHECK_INT(sdp_policy_setting(p, "spin_us_x", NULL), -ENOENT);
	CHECK_INT(sdp_policy_setting(p, "spin_us", NULL), 0);
	CHECK_INT(sdp_policy_setting(p, NULL, NULL), -ENOENT);
	sdp_policy_free(p);
}

static void test_long_lines(void)
{
	size_t n = 5000;
	char *text = malloc(4 * n + 200), *s = text;
	struct errs e = { 0 };
	struct sdp_policy *p;
	char *prog = malloc(n + 1);

	memset(prog, 'x', n);
	prog[n] = '\0';
	s += sprintf(s, "# %s\n", prog);                          /* long comment */
	s += sprintf(s, "use sdp * %s *:80\n", prog);             /* long glob */
	s += sprintf(s, "use sdp * b 1.2.3.4:%s\n", prog);        /* long bad port */
	s += sprintf(s, "%s\n", prog);                            /* long keyword */
	s += sprintf(s, "use both * c *:80");
	p = sdp_policy_parse(text, "long.conf", collect, &e);
	CHECK(p != NULL);
	CHECK_INT(sdp_policy_nrules(p), 2);
	CHECK_INT(m4(p, C, prog, "1.1.1.1", 80), SDP);
	CHECK_INT(m4(p, C, "c", "1.1.1.1", 80), BOTH);
	CHECK_INT(e.n, 2);
	/* long tokens are cut in messages, and the message still names the line */
	CHECK(strncmp(e.msg[0], "long.conf:3: bad port 'xxxx", 27) == 0);
	CHECK(strstr(e.msg[0], "...'") != NULL);
	CHECK(strlen(e.msg[0]) < 200);
	CHECK(strncmp(e.msg[1], "long.conf:4: unknown keyword 'xxxx", 34) == 0);
	CHECK(strlen(e.msg[1]) < 200);
	sdp_policy_free(p);
	free(text);
	free(prog);
}

/* ---- bad lines ---------------------------------------------------------------- */

struct bad_case {
	const char *line;
	const char *reason;
};

static const struct bad_case bad_cases[] = {
	{ "bogus sdp * * *",                 "unknown keyword 'bogus' (use or set)" },
	{ "USE sdp * * *",                   "unknown keyword 'USE' (use or set)" },
	{ "use sdp * *",                     "'use' expects 4 fields, got 3" },
	{ "use",                             "'use' expects 4 fields, got 0" },
	{ "use sdp * * * extra",             "'use' expects 4 fields, got 5" },
	{ "use a b c d e f g h i j k",       "'use' expects 4 fields, got 11" },
	{ "use fast * * *",                  "bad use 'fast' (sdp, tcp or both)" },
	{ "use SDP * * *",                   "bad use 'SDP' (sdp, tcp or both)" },
	{ "use sdp both * *",                "bad role 'both' (server, client or *)" },
	{ "use sdp 10.0.0.1:80 * *",         "bad role '10.0.0.1:80' (server, client or *)" },
	{ "use sdp * * 10.0.0.256:80",       "bad IPv4 address '10.0.0.256:80'" },
	{ "use sdp * * 10.0.0:80",           "bad IPv4 address '10.0.0:80'" },
	{ "use sdp * * host.example:80",     "bad IPv4 address 'host.example:80'" },
	{ "use sdp * * :80",                 "bad IPv4 address ':80'" },
	{ "use sdp * * 10.0.0.1/33:80",      "prefix out of range '/33' (max 32)" },
	{ "use sdp * * 10.0.0.1/1000:80",    "prefix out of range '/1000' (max 32)" },
	{ "use sdp * * 10.0.0.1/x:80",       "bad prefix '/x'" },
	{ "use sdp * * 10.0.0.1/:80",        "bad prefix '/'" },
	{ "use sdp * * 10.0.0.1/-1:80",      "bad prefix '/-1'" },
	{ "use sdp * * 10.0.0.1/8/8:80",     "bad prefix '/8/8'" },
	{ "use sdp * * [::1]/129:80",        "prefix out of range '/129' (max 128)" },
	{ "use sdp * * [::1/129]:80",        "prefix out of range '/129' (max 128)" },
	{ "use sdp * * [::1/64]/64:80",      "bad address '[::1/64]/64:80' (two prefixes)" },
	{ "use sdp * * [::1:80",             "bad address '[::1:80' (missing ']')" },
	{ "use sdp * * [1.2.3.4]:80",        "bad IPv6 address '[1.2.3.4]:80'" },
	{ "use sdp * * [::g]:80",            "bad IPv6 address '[::g]:80'" },
	{ "use sdp * * [*]:80",              "bad IPv6 address '[*]:80'" },
	{ "use sdp * * ::1:80",              "bad address spec '::1:80' (too many ':', IPv6 needs [brackets])" },
	{ "use sdp * * 10.0.0.1:80:90",      "bad address spec '10.0.0.1:80:90' (too many ':', IPv6 needs [brackets])" },
	{ "use sdp * * 10.0.0.1",            "bad address spec '10.0.0.1' (expected ':PORT')" },
	{ "use sdp * * [::1]",               "bad address spec '[::1]' (expected ':PORT')" },
	{ "use sdp * * [::1]80",             "bad address spec '[::1]80' (expected ':PORT')" },
	{ "use sdp * * [::]/10",             "bad address spec '[::]/10' (expected ':PORT')" },
	{ "use sdp * * */8:80",              "bad address '*/8:80' ('*' takes no prefix)" },
	{ "use sdp * * **",                  "bad address spec '**' (expected ':PORT')" },
	{ "use sdp * * 10.0.0.1:",           "bad port ''" },
	{ "use sdp * * 10.0.0.1:http",       "bad port 'http'" },
	{ "use sdp * * 10.0.0.1:+80",        "bad port '+80'" },
	{ "use sdp * * 10.0.0.1: 80",        "'use' expects 4 fields, got 5" },
	{ "use sdp * * 10.0.0.1:65536",      "port out of range '65536'" },
	{ "use sdp * * 10.0.0.1:99999999999999999999999", "port out of range '99999999999999999999999'" },
	{ "use sdp * * 10.0.0.1:2000-1000",  "bad port range '2000-1000'" },
	{ "use sdp * * 10.0.0.1:1000-",      "bad port range '1000-'" },
	{ "use sdp * * 10.0.0.1:6-5",         "bad port range '6-5'" },
	{ "use sdp * * 10.0.0.1:-5",         "bad port range '-5'" },
	{ "use sdp * * 10.0.0.1:1-2-3",      "bad port range '1-2-3'" },
	{ "use sdp * * 10.0.0.1:*-80",       "bad port range '*-80'" },
	{ "use sdp * * 10.0.0.1:1-70000",    "port out of range '1-70000'" },
	{ "set spin_us",                     "'set' expects 2 fields, got 1" },
	{ "set",                             "'set' expects 2 fields, got 0" },
	{ "set spin_us 1 2",                 "'set' expects 2 fields, got 3" },
	{ "set Spin_us 5",                   "bad setting name 'Spin_us'" },
	{ "set spin-us 5",                   "bad setting name 'spin-us'" },
	{ "set spin2 5",                     "bad setting name 'spin2'" },
};

static void test_bad_lines(void)
{
	char text[512], want[256];

	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		const struct bad_case *bc = &bad_cases[i];
		struct errs e = { 0 };
		struct sdp_policy *p;
		const char *v = NULL;

		snprintf(text, sizeof(text),
			 "# the line below is bad\n"
			 "use sdp * before 1.1.1.1:1\n"
			 "%s\n"
			 "use both * after 1.1.1.1:2\n"
			 "set spin_us 9\n", bc->line);
		p = sdp_policy_parse(text, "tests.conf", collect, &e);
		snprintf(want, sizeof(want), "tests.conf:3: %s", bc->reason);
		CHECK(p != NULL);
		CHECK_INT(e.n, 1);
		CHECK_STR(e.msg[0], want);
		if (e.n != 1 || strcmp(e.msg[0], want) != 0)
			fprintf(stderr, "  (case: \"%s\")\n", bc->line);
		CHECK_INT(sdp_policy_nrules(p), 2);
		CHECK_INT(m4(p, C, "before", "1.1.1.1", 1), SDP);
		CHECK_INT(m4(p, C, "after", "1.1.1.1", 2), BOTH);
		CHECK_INT(sdp_policy_setting(p, "spin_us", &v), 0);
		CHECK_STR(v, "9");
		sdp_policy_free(p);

		/* a NULL reporter is allowed */
		p = sdp_policy_parse(text, "tests.conf", NULL, NULL);
		CHECK_INT(sdp_policy_nrules(p), 2);
		sdp_policy_free(p);
	}
}

static void test_many_bad_lines(void)
{
	struct errs e = { 0 };
	struct sdp_policy *p = sdp_policy_parse(
		"use sdp * a *:1\n"             /* 1 */
		"junk\n"                        /* 2 */
		"\n"                            /* 3 */
		"use sdp * * 1.2.3.4:2000-1000\n" /* 4 */
		"use tcp * a *:1\n"             /* 5: shadowed, but valid */
		"set 1 2\n",                    /* 6 */
		NULL, collect, &e);

	CHECK_INT(e.n, 3);
	CHECK_STR(e.msg[0], "policy:2: unknown keyword 'junk' (use or set)");
	CHECK_STR(e.msg[1], "policy:4: bad port range '2000-1000'");
	CHECK_STR(e.msg[2], "policy:6: bad setting name '1'");
	CHECK_INT(sdp_policy_nrules(p), 2);
	CHECK_INT(m4(p, C, "a", "1.1.1.1", 1), SDP);
	sdp_policy_free(p);
}

/* A realistic file full of valid forms: nothing may be reported. */
static void test_good_file_is_silent(void)
{
	struct sdp_policy *p = good(
		"# libsdp-style policy\n"
		"set spin_us 50\n"
		"set zcopy_thresh 65536\n"
		"use tcp  server sshd          *\n"
		"use sdp  server nginx         0.0.0.0:80\n"
		"use sdp  server nginx         [::]:80\n"
		"use both client redis-*       10.0.0.0/8:6379\n"
		"use both client redis-*       [fd00::]/8:6379-6380\n"
		"use sdp  *      memcached     *:11211\n"
		"use sdp  client *             192.168.0.0/16:1024-65535\n"
		"use sdp  client *             [2001:db8::/32]:*\n"
		"use tcp  *      *             *\n");

	CHECK_INT(sdp_policy_nrules(p), 9);
	CHECK_INT(m4(p, S, "sshd", "0.0.0.0", 22), TCP);
	CHECK_INT(m4(p, S, "nginx", "0.0.0.0", 80), SDP);
	CHECK_INT(m6(p, S, "nginx", "::", 80), SDP);
	CHECK_INT(m4(p, C, "redis-cli", "10.2.3.4", 6379), BOTH);
	CHECK_INT(m6(p, C, "redis-cli", "fdff::1", 6380), BOTH);
	CHECK_INT(m6(p, C, "redis-cli", "fdff::1", 6381), TCP);
	CHECK_INT(m4(p, S, "memcached", "127.0.0.1", 11211), SDP);
	CHECK_INT(m4(p, C, "curl", "192.168.9.9", 1024), SDP);
	CHECK_INT(m4(p, C, "curl", "192.168.9.9", 1023), TCP);
	CHECK_INT(m6(p, C, "curl", "2001:db8::1", 1), SDP);
	sdp_policy_free(p);
}

/* ---- files -------------------------------------------------------------------- */

static void test_load(void)
{
	char dir[] = "/tmp/test_policy.XXXXXX", path[256];
	struct errs e = { 0 };
	struct sdp_policy *p;
	int error = 12345;
	FILE *f;

	if (!mkdtemp(dir)) {
		CHECK(!"mkdtemp");
		return;
	}
	snprintf(path, sizeof(path), "%s/sdp.conf", dir);
	f = fopen(path, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fputs("use sdp * a *:80\r\nuse sdp * a *:99999\nset spin_us 3", f);
	fclose(f);

	p = sdp_policy_load(path, collect, &e, &error);
	CHECK(p != NULL);
	CHECK_INT(error, 0);
	CHECK_INT(sdp_policy_nrules(p), 1);
	CHECK_INT(m4(p, C, "a", "1.1.1.1", 80), SDP);
	CHECK_INT(e.n, 1);
	char want[300];
	snprintf(want, sizeof(want), "%s:2: port out of range '99999'", path);
	CHECK_STR(e.msg[0], want);
	const char *v = NULL;
	CHECK_INT(sdp_policy_setting(p, "spin_us", &v), 0);
	CHECK_STR(v, "3");
	sdp_policy_free(p);

	/* a NUL byte makes that line bad, not the whole file */
	static const char with_nul[] =
		"use sdp * a *:80\nuse sdp\0 * b *:80\nuse sdp * c *:80\n";
	f = fopen(path, "w");
	CHECK(f != NULL);
	if (!f)
		return;
	fwrite(with_nul, 1, sizeof(with_nul) - 1, f);
	fclose(f);
	e.n = 0;
	p = sdp_policy_load(path, collect, &e, &error);
	CHECK_INT(error, 0);
	CHECK_INT(sdp_policy_nrules(p), 2);
	CHECK_INT(e.n, 1);
	snprintf(want, sizeof(want), "%s:2: NUL byte in line", path);
	CHECK_STR(e.msg[0], want);
	sdp_policy_free(p);

	/* a file bigger than the read buffer */
	f = fopen(path, "w");
	for (int i = 0; i < 3000; i++)
		fprintf(f, "use tcp * prog%d 10.0.%d.%d:%d\n", i, i / 256, i % 256, i);
	fputs("use sdp * last *", f);
	fclose(f);
	e.n = 0;
	p = sdp_policy_load(path, collect, &e, &error);
	CHECK_INT(error, 0);
	CHECK_INT(e.n, 0);
	CHECK_INT(sdp_policy_nrules(p), 3001);
	CHECK_INT(m4(p, C, "last", "1.1.1.1", 1), SDP);
	CHECK_INT(m4(p, C, "prog2999", "10.0.11.183", 2999), TCP);
	sdp_policy_free(p);

	/* empty file */
	f = fopen(path, "w");
	fclose(f);
	p = sdp_policy_load(path, collect, &e, &error);
	CHECK(p != NULL);
	CHECK_INT(error, 0);
	CHECK_INT(sdp_policy_nrules(p), 0);
	sdp_policy_free(p);

	unlink(path);
	p = sdp_policy_load(path, collect, &e, &error);
	CHECK(p == NULL);
	CHECK_INT(error, -ENOENT);

	p = sdp_policy_load(dir, collect, &e, &error);
	CHECK(p == NULL);
	CHECK_INT(error, -EISDIR);
	rmdir(dir);
}

/* A policy that is not a regular file is refused at once and says what it
 * is; a FIFO without a writer must not block the reader. An alarm turns a
 * blocked open or read into a failure instead of a hang. */
static void on_alarm(int sig)
{
	(void)sig;
	static const char m[] = "test_policy: blocked on a non-regular policy file\n";
	ssize_t w = write(2, m, sizeof m - 1);
	(void)w;
	_exit(1);
}

static void test_not_regular(void)
{
	char dir[] = "/tmp/test_policy.XXXXXX", fifo[256];
	struct errs e = { 0 };
	int error = 0;

	if (!mkdtemp(dir)) {
		CHECK(!"mkdtemp");
		return;
	}
	snprintf(fifo, sizeof(fifo), "%s/fifo.conf", dir);
	CHECK_INT(mkfifo(fifo, 0600), 0);
	signal(SIGALRM, on_alarm);
	alarm(10);
	CHECK(sdp_policy_load(fifo, collect, &e, &error) == NULL);
	CHECK(error <= SDP_POLICY_ENOTREG);
	CHECK_STR(sdp_policy_strerror(error), "a FIFO, not a regular file");

	/* a writer holding it open with text in it changes nothing */
	int w = open(fifo, O_RDWR | O_NONBLOCK);
	CHECK(w >= 0);
	if (w >= 0) {
		ssize_t n = write(w, "use sdp * * *\n", 14);
		CHECK_INT(n, 14);
	}
	CHECK(sdp_policy_load(fifo, collect, &e, &error) == NULL);
	CHECK_STR(sdp_policy_strerror(error), "a FIFO, not a regular file");
	if (w >= 0)
		close(w);

	CHECK(sdp_policy_load("/dev/zero", collect, &e, &error) == NULL);
	CHECK_STR(sdp_policy_strerror(error), "a character device, not a regular file");
	CHECK(sdp_policy_load("/dev/tty", collect, &e, &error) == NULL ||
	      !"a terminal is not a policy");
	alarm(0);
	CHECK_INT(e.n, 0);
	CHECK_STR(sdp_policy_strerror(-ENOENT), strerror(ENOENT));
	CHECK_STR(sdp_policy_strerror(-EFBIG), "larger than 16 MiB");
	unlink(fifo);
	rmdir(dir);
}

/* Rules and settings remember their lines, for reports. */
static void test_lines(void)
{
	struct sdp_policy *p = good("# comment\n"
				    "use tcp server * 10.0.0.0/8:*\n"
				    "\n"
				    "set spin_us 5\n"
				    "use sdp * * *\n"
				    "set spin_us 7\n");
	struct sockaddr_in sin = { .sin_family = AF_INET, .sin_port = htons(80) };
	unsigned long line = 99;
	const char *v = NULL;

	inet_pton(AF_INET, "10.1.2.3", &sin.sin_addr);
	CHECK_INT(sdp_policy_lookup(p, S, "x", (struct sockaddr *)&sin, sizeof sin, &line), TCP);
	CHECK_INT(line, 2);
	CHECK_INT(sdp_policy_lookup(p, C, "x", (struct sockaddr *)&sin, sizeof sin, &line), SDP);
	CHECK_INT(line, 5);
	CHECK_INT(sdp_policy_setting_at(p, "spin_us", &v, &line), 0);
	CHECK_STR(v, "7");
	CHECK_INT(line, 6);
	CHECK_INT(sdp_policy_setting_at(p, "nslots", &v, &line), -ENOENT);
	CHECK_STR(sdp_policy_file(p), "good.conf");
	sdp_policy_free(p);

	p = good("use sdp client * *:1\n");
	inet_pton(AF_INET, "10.1.2.3", &sin.sin_addr);
	CHECK_INT(sdp_policy_lookup(p, S, "x", (struct sockaddr *)&sin, sizeof sin, &line), TCP);
	CHECK_INT(line, 0);                 /* no rule: the default */
	sdp_policy_free(p);
}

/* ---- concurrency -------------------------------------------------------------- */

static void *match_thread(void *arg)
{
	const struct sdp_policy *p = arg;
	long bad = 0;

	for (int i = 0; i < 20000; i++) {
		bad += m4(p, C, "redis-server", "10.1.1.1", 6379) != BOTH;
		bad += m6(p, S, "nginx", "::ffff:10.0.0.1", 80) != SDP;
		bad += m4(p, C, "curl", "8.8.8.8", 443) != TCP;
	}
	return (void *)bad;
}

static void test_threads(void)
{
	struct sdp_policy *p = good(
		"use both client redis-* 10.0.0.0/8:6379\n"
		"use sdp server ngin? 10.0.0.0/8:80\n");
	pthread_t t[4];

	for (int i = 0; i < 4; i++)
		CHECK_INT(pthread_create(&t[i], NULL, match_thread, p), 0);
	for (int i = 0; i < 4; i++) {
		void *bad = NULL;
		pthread_join(t[i], &bad);
		CHECK_INT((long)bad, 0);
	}
	sdp_policy_free(p);
}

int main(void)
{
	test_empty();
	test_first_match_wins();
	test_use_and_role();
	test_globs();
	test_ipv4_prefixes();
	test_ipv6();
	test_v4_mapped();
	test_ports();
	test_star_forms();
	test_odd_addresses();
	test_comments_and_spacing();
	test_crlf();
	test_no_trailing_newline();
	test_settings();
	test_long_lines();
	test_bad_lines();
	test_many_bad_lines();
	test_good_file_is_silent();
	test_load();
	test_not_regular();
	test_lines();
	test_threads();

	printf("test_policy: %d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
