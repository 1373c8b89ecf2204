/*
 * policy.c - parser and matcher for the socket switch's policy file.
 *
 * The text is parsed once into a flat, immutable rule table; matching only
 * reads that table, so it is thread-safe and allocates nothing itself ('*'
 * and plain program names skip fnmatch(3) entirely). Bad lines are reported
 * through the caller's callback and skipped. Nothing here prints, exits or
 * depends on any other part of the library being initialised.
 */
#include "switch/policy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdp/sys.h"

#define MAX_FIELDS   8              /* fields kept; more are only counted */
#define MAX_FILE     (16u << 20)    /* refuse policy files above 16 MiB */
#define TOK_SHOWN    64             /* longest token quoted in a message */

enum fam { FAM_ANY = 0, FAM_V4 = 4, FAM_V6 = 6 };
enum glob_kind { GLOB_ANY, GLOB_LITERAL, GLOB_PATTERN };

struct rule {
	char *glob;
	uint8_t use;            /* enum sdp_use */
	uint8_t fabric;         /* enum fab_pref: the provider it forces */
	uint8_t roles;          /* mask of enum sdp_role */
	uint8_t fam;            /* enum fam */
	uint8_t prefix;         /* significant bits of addr */
	uint8_t glob_kind;
	uint16_t port_lo, port_hi;
	uint8_t addr[16];       /* network order, host bits cleared */
	unsigned long line;     /* line of the file, for reports */
};

struct setting {                /* newest first, so the last "set" wins */
	struct setting *next;
	const char *value;      /* points into name[] */
	unsigned long line;     /* line of the file, for reports */
	char name[];
};

struct sdp_policy {
	struct rule *rules;
	int nrules, rules_cap;
	struct setting *sets;
	char *fname;            /* as given to the parser ("policy" if none) */
};

/* ---- small helpers -------------------------------------------------------- */

/* Decimal digits only: -EINVAL if empty or not digits, -ERANGE above max. */
static int parse_num(const char *s, size_t len, unsigned long max,
		     unsigned long *out)
{
	unsigned long v = 0;

	if (len == 0 || strspn(s, "0123456789") < len)
		return -EINVAL;
	for (size_t i = 0; i < len; i++)
		if ((v = v * 10 + (unsigned long)(s[i] - '0')) > max)
			return -ERANGE;
	*out = v;
	return 0;
}

#define WHY(...) (snprintf(why, whylen, __VA_ARGS__), -EINVAL)

/* Print at most TOK_SHOWN chars of a token: "%.*s%s", SHOW(tok). */
#define SHOW(t) (int)(strlen(t) > TOK_SHOWN ? TOK_SHOWN : strlen(t)), (t), \
		(strlen(t) > TOK_SHOWN ? "..." : "")

/* ---- address specification ------------------------------------------------ */

/* PORT: N, N-M or '*'. s is NUL-terminated. */
static int parse_ports(struct rule *r, const char *s, char *why, size_t whylen)
{
	const char *dash;
	unsigned long lo = 0, hi = 0;
	int e1, e2;

	if (strcmp(s, "*") == 0) {
		r->port_lo = 0;
		r->port_hi = 65535;
		return 0;
	}
	dash = strchr(s, '-');
	if (!dash) {
		e1 = parse_num(s, strlen(s), 65535, &lo);
		if (e1 == -EINVAL)
			return WHY("bad port '%.*s%s'", SHOW(s));
		if (e1 < 0)
			return WHY("port out of range '%.*s%s'", SHOW(s));
		r->port_lo = r->port_hi = (uint16_t)lo;
		return 0;
	}
	e1 = parse_num(s, (size_t)(dash - s), 65535, &lo);
	e2 = parse_num(dash + 1, strlen(dash + 1), 65535, &hi);
	if (e1 == -EINVAL || e2 == -EINVAL)
		return WHY("bad port range '%.*s%s'", SHOW(s));
	if (e1 < 0 || e2 < 0)
		return WHY("port out of range '%.*s%s'", SHOW(s));
	if (lo > hi)
		return WHY("bad port range '%.*s%s'", SHOW(s));
	r->port_lo = (uint16_t)lo;
	r->port_hi = (uint16_t)hi;
	return 0;
}

/* "/N" suffix: len chars at s (without the slash). */
static int parse_prefix(struct rule *r, const char *s, size_t len,
			unsigned max, char *why, size_t whylen)
{
	unsigned long n = 0;
	int e = parse_num(s, len, max, &n);
	int shown = (int)(len > TOK_SHOWN ? TOK_SHOWN : len);

	if (e == -EINVAL)
		return WHY("bad prefix '/%.*s'", shown, s);
	if (e < 0)
		return WHY("prefix out of range '/%.*s' (max %u)", shown, s, max);
	r->prefix = (uint8_t)n;
	return 0;
}

static void clear_host_bits(struct rule *r)
{
	unsigned bytes = r->fam == FAM_V4 ? 4 : 16;

	for (unsigned i = 0; i < bytes; i++) {
		unsigned bit = i * 8;
		if (bit >= r->prefix)
			r->addr[i] = 0;
		else if (r->prefix - bit < 8)
			r->addr[i] &= (uint8_t)(0xff00u >> (r->prefix - bit));
	}
}

/*
 * ADDR[/PREFIX]:PORT or '*'; ADDR is a.b.c.d, '*' or [v6] with the prefix
 * inside or after the brackets. spec is writable and gets cut into pieces.
 */
static int parse_addrspec(struct rule *r, char *spec, char *why, size_t whylen)
{
	char tok[TOK_SHOWN + 4], *addr = spec, *rest, *slash = NULL;
	int v6 = spec[0] == '[';
	size_t plen = 0;

	snprintf(tok, sizeof(tok), "%.*s%s", SHOW(spec));
	r->port_lo = 0;
	r->port_hi = 65535;
	if (strcmp(spec, "*") == 0)
		return 0;                   /* FAM_ANY, any port */
	if (v6) {
		if (!(rest = strchr(spec, ']')))
			return WHY("bad address '%s' (missing ']')", tok);
		*rest++ = '\0';
		addr = spec + 1;
		if (*rest == '/') {
			if (strchr(addr, '/'))
				return WHY("bad address '%s' (two prefixes)", tok);
			slash = rest + 1;
			plen = strcspn(slash, ":");
			rest = slash + plen;
		}
	} else {
		rest = spec + strcspn(spec, ":");
		if (*rest && strchr(rest + 1, ':'))
			return WHY("bad address spec '%s' (too many ':', IPv6 needs [brackets])", tok);
	}
	if (*rest != ':')
		return WHY("bad address spec '%s' (expected ':PORT')", tok);
	*rest = '\0';
	if (!slash && (slash = strchr(addr, '/'))) {
		*slash++ = '\0';
		plen = strlen(slash);
	}
	if (!v6 && strcmp(addr, "*") == 0) {
		if (slash)
			return WHY("bad address '%s' ('*' takes no prefix)", tok);
	} else {
		if (inet_pton(v6 ? AF_INET6 : AF_INET, addr, r->addr) != 1)
			return WHY("bad %s address '%s'", v6 ? "IPv6" : "IPv4", tok);
		r->fam = v6 ? FAM_V6 : FAM_V4;
		r->prefix = v6 ? 128 : 32;
		if (slash && parse_prefix(r, slash, plen, r->prefix, why, whylen) < 0)
			return -EINVAL;
		clear_host_bits(r);
	}
	return parse_ports(r, rest + 1, why, whylen);
}

/* ---- lines ------------------------------------------------------------------- */

static int add_rule(struct sdp_policy *p, const struct rule *r)
{
	if (p->nrules == p->rules_cap) {
		int cap = p->rules_cap ? p->rules_cap * 2 : 16;
		struct rule *n = realloc(p->rules, (size_t)cap * sizeof(*n));
		if (!n)
			return -ENOMEM;
		p->rules = n;
		p->rules_cap = cap;
	}
	p->rules[p->nrules++] = *r;
	return 0;
}

static int parse_use(struct sdp_policy *p, char **f, int n, unsigned long lineno,
		     char *why, size_t whylen)
{
	struct rule r;
	int ret;

	if (n != 5 && n != 6)
		return WHY("'use' expects 4 or 5 fields, got %d", n - 1);
	memset(&r, 0, sizeof(r));
	r.line = lineno;

	/* An optional fifth field forces a provider (fabric/fabric.h). */
	enum fab_pref fab = FAB_PREF_ANY;
	if (n == 6 && fab_pref_parse(f[5], &fab) < 0)
		return WHY("unknown fabric '%.*s%s' (shm, ofi or tcp)", SHOW(f[5]));
	r.fabric = (uint8_t)fab;

	if (strcmp(f[1], "sdp") == 0)
		r.use = SDP_USE_SDP;
	else if (strcmp(f[1], "tcp") == 0)
		r.use = SDP_USE_TCP;
	else if (strcmp(f[1], "both") == 0)
		r.use = SDP_USE_BOTH;
	else
		return WHY("bad use '%.*s%s' (sdp, tcp or both)", SHOW(f[1]));

	if (strcmp(f[2], "server") == 0)
		r.roles = SDP_ROLE_SERVER;
	else if (strcmp(f[2], "client") == 0)
		r.roles = SDP_ROLE_CLIENT;
	else if (strcmp(f[2], "*") == 0)
		r.roles = SDP_ROLE_SERVER | SDP_ROLE_CLIENT;
	else
		return WHY("bad role '%.*s%s' (server, client or *)", SHOW(f[2]));

	ret = parse_addrspec(&r, f[4], why, whylen);
	if (ret < 0)
		return ret;

	if (strcmp(f[3], "*") == 0)
		r.glob_kind = GLOB_ANY;
	else if (strpbrk(f[3], "*?[\\"))
		r.glob_kind = GLOB_PATTERN;
	else
		r.glob_kind = GLOB_LITERAL;
	r.glob = strdup(f[3]);
	if (!r.glob)
		return -ENOMEM;
	ret = add_rule(p, &r);
	if (ret < 0)
		free(r.glob);
	return ret;
}

static int parse_set(struct sdp_policy *p, char **f, int n, unsigned long lineno,
		     char *why, size_t whylen)
{
	struct setting *s;
	size_t nlen;

	if (n != 3)
		return WHY("'set' expects 2 fields, got %d", n - 1);
	if (strspn(f[1], "abcdefghijklmnopqrstuvwxyz_") != strlen(f[1]))
		return WHY("bad setting name '%.*s%s'", SHOW(f[1]));

	nlen = strlen(f[1]) + 1;
	s = malloc(sizeof(*s) + nlen + strlen(f[2]) + 1);
	if (!s)
		return -ENOMEM;
	memcpy(s->name, f[1], nlen);
	s->value = strcpy(s->name + nlen, f[2]);
	s->line = lineno;
	s->next = p->sets;
	p->sets = s;
	return 0;
}

/* One line, NUL-terminated, writable, without its '\n'. len counts the bytes
 * of the line in the buffer (a NUL byte before len is a binary file). */
static int parse_line(struct sdp_policy *p, char *line, size_t len,
		      unsigned long lineno, char *why, size_t whylen)
{
	char *f[MAX_FIELDS];
	char *s, *hash;
	int n = 0;

	if (strlen(line) != len)
		return WHY("NUL byte in line");
	hash = strchr(line, '#');
	if (hash)
		*hash = '\0';

	for (s = line; ; ) {
		s += strspn(s, " \t\r\v\f");
		if (!*s)
			break;
		if (n < MAX_FIELDS)
			f[n] = s;
		n++;
		s += strcspn(s, " \t\r\v\f");
		if (*s)
			*s++ = '\0';
	}
	if (n == 0)
		return 0;
	if (strcmp(f[0], "use") == 0)
		return parse_use(p, f, n, lineno, why, whylen);
	if (strcmp(f[0], "set") == 0)
		return parse_set(p, f, n, lineno, why, whylen);
	return WHY("unknown keyword '%.*s%s' (use or set)", SHOW(f[0]));
}

static void report(sdp_policy_err_fn err, void *arg, const char *fname,
		   unsigned long lineno, const char *why)
{
	char msg[4096 + 256];

	if (!err)
		return;
	snprintf(msg, sizeof(msg), "%s:%lu: %s", fname ? fname : "policy",
		 lineno, why);
	err(msg, arg);
}

/* Parse buf[0..len) in place (buf[len] must be writable). */
static struct sdp_policy *parse_buf(char *buf, size_t len, const char *fname,
				    sdp_policy_err_fn err, void *arg)
{
	struct sdp_policy *p = calloc(1, sizeof(*p));
	unsigned long lineno = 0;
	size_t pos = 0;

	if (!p)
		return NULL;
	p->fname = strdup(fname ? fname : "policy");
	if (!p->fname) {
		free(p);
		return NULL;
	}
	buf[len] = '\0';
	while (pos < len) {
		char *line = buf + pos, *nl = memchr(line, '\n', len - pos);
		size_t ll = nl ? (size_t)(nl - line) : len - pos;
		char why[256];
		int ret;

		pos += ll + (nl ? 1 : 0);
		lineno++;
		line[ll] = '\0';
		if (ll && line[ll - 1] == '\r')
			line[--ll] = '\0';
		ret = parse_line(p, line, ll, lineno, why, sizeof(why));
		if (ret == -ENOMEM) {
			sdp_policy_free(p);
			return NULL;
		}
		if (ret < 0)
			report(err, arg, fname, lineno, why);
	}
	return p;
}

/* ---- public interface -------------------------------------------------------- */

struct sdp_policy *sdp_policy_parse(const char *text, const char *fname,
				    sdp_policy_err_fn err, void *arg)
{
	size_t len = text ? strlen(text) : 0;
	char *buf = malloc(len + 1);
	struct sdp_policy *p;

	if (!buf)
		return NULL;
	if (len)
		memcpy(buf, text, len);
	p = parse_buf(buf, len, fname, err, arg);
	free(buf);
	return p;
}

/* Why a file cannot serve as the policy: only regular files are read (a
 * FIFO would block the process, a device might do anything on open). */
static int check_file(const struct stat *st)
{
	if (S_ISDIR(st->st_mode))
		return -EISDIR;
	if (!S_ISREG(st->st_mode))
		return SDP_POLICY_ENOTREG - (int)((st->st_mode & S_IFMT) >> 12);
	if (st->st_size > (off_t)MAX_FILE)
		return -EFBIG;
	return 0;
}

struct sdp_policy *sdp_policy_load(const char *path, sdp_policy_err_fn err,
				   void *arg, int *error)
{
	struct sdp_policy *p = NULL;
	size_t len = 0, cap = 0;
	char *buf = NULL, *nb;
	int fd = -1, ret = 0;
	ssize_t r;
	struct stat st;

	/* Look before opening (a device is never opened), then check what
	 * was opened (the name may have changed meanwhile). O_NONBLOCK: an
	 * open of a FIFO without a writer must not wait. */
	if (stat(path, &st) < 0) {
		ret = -errno;
		goto out;
	}
	if ((ret = check_file(&st)) < 0)
		goto out;
	fd = sys_open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
	if (fd < 0) {
		ret = -errno;
		goto out;
	}
	if (sys_fstat(fd, &st) < 0) {
		ret = -errno;
		goto out;
	}
	if ((ret = check_file(&st)) < 0)
		goto out;
	for (;;) {
		if (len == cap) {
			if (len > MAX_FILE) {
				ret = -EFBIG;     /* grew while we read it */
				goto out;
			}
			cap = cap ? cap * 2 : 4096;
			if (cap > MAX_FILE + 1)
				cap = MAX_FILE + 1;
			if (!(nb = realloc(buf, cap + 1))) {
				ret = -ENOMEM;
				goto out;
			}
			buf = nb;
		}
		r = sys_read(fd, buf + len, cap - len);
		if (r > 0)
			len += (size_t)r;
		else if (r == 0)
			break;
		else if (errno != EINTR) {
			ret = -errno;
			goto out;
		}
	}
	if (!(p = parse_buf(buf, len, path, err, arg)))
		ret = -ENOMEM;
out:
	if (fd >= 0)
		sys_close(fd);
	free(buf);
	if (error)
		*error = ret;
	return p;
}

const char *sdp_policy_strerror(int error)
{
	static const char *const kind[16] = {
		[S_IFIFO >> 12] = "a FIFO, not a regular file",
		[S_IFCHR >> 12] = "a character device, not a regular file",
		[S_IFBLK >> 12] = "a block device, not a regular file",
		[S_IFSOCK >> 12] = "a socket, not a regular file",
	};
	if (error <= SDP_POLICY_ENOTREG && error > SDP_POLICY_ENOTREG - 16) {
		const char *k = kind[SDP_POLICY_ENOTREG - error];
		return k ? k : "not a regular file";
	}
	if (error == -EFBIG)
		return "larger than 16 MiB";
	return strerror(-error);
}

static int prefix_match(const uint8_t *a, const uint8_t *net, unsigned prefix)
{
	unsigned full = prefix / 8, rest = prefix % 8;

	if (memcmp(a, net, full) != 0)
		return 0;
	if (rest && ((a[full] ^ net[full]) & (uint8_t)(0xff00u >> rest)))
		return 0;
	return 1;
}

enum sdp_use sdp_policy_match(const struct sdp_policy *p, enum sdp_role role,
			      const char *prog, const struct sockaddr *addr,
			      socklen_t addrlen)
{
	return sdp_policy_lookup(p, role, prog, addr, addrlen, NULL, NULL);
}

enum sdp_use sdp_policy_lookup(const struct sdp_policy *p, enum sdp_role role,
			       const char *prog, const struct sockaddr *addr,
			       socklen_t addrlen, unsigned long *line,
			       enum fab_pref *fabric)
{
	const uint8_t *a4 = NULL, *a6 = NULL;
	unsigned port;

	if (line)
		*line = 0;
	if (fabric)
		*fabric = FAB_PREF_ANY;
	if (!p || !addr || addrlen < sizeof(sa_family_t))
		return SDP_USE_TCP;
	if (addr->sa_family == AF_INET && addrlen >= sizeof(struct sockaddr_in)) {
		const struct sockaddr_in *sin = (const void *)addr;
		a4 = (const uint8_t *)&sin->sin_addr;
		port = ntohs(sin->sin_port);
	} else if (addr->sa_family == AF_INET6 &&
		   addrlen >= offsetof(struct sockaddr_in6, sin6_addr) +
			      sizeof(struct in6_addr)) {
		const struct sockaddr_in6 *sin6 = (const void *)addr;
		a6 = (const uint8_t *)&sin6->sin6_addr;
		if (IN6_IS_ADDR_V4MAPPED(&sin6->sin6_addr))
			a4 = a6 + 12;
		port = ntohs(sin6->sin6_port);
	} else {
		return SDP_USE_TCP;    /* not an IP stream address */
	}
	if (!prog)
		prog = "";

	for (int i = 0; i < p->nrules; i++) {
		const struct rule *r = &p->rules[i];

		if (!(r->roles & role))
			continue;
		if (port < r->port_lo || port > r->port_hi)
			continue;
		if (r->fam == FAM_V4 && !(a4 && prefix_match(a4, r->addr, r->prefix)))
			continue;
		if (r->fam == FAM_V6 && !(a6 && prefix_match(a6, r->addr, r->prefix)))
			continue;
		if (r->glob_kind == GLOB_LITERAL && strcmp(r->glob, prog) != 0)
			continue;
		if (r->glob_kind == GLOB_PATTERN && fnmatch(r->glob, prog, 0) != 0)
			continue;
		if (line)
			*line = r->line;
		if (fabric)
			*fabric = (enum fab_pref)r->fabric;
		return (enum sdp_use)r->use;
	}
	return SDP_USE_TCP;
}

int sdp_policy_setting(const struct sdp_policy *p, const char *name,
		       const char **value)
{
	return sdp_policy_setting_at(p, name, value, NULL);
}

int sdp_policy_setting_at(const struct sdp_policy *p, const char *name,
			  const char **value, unsigned long *line)
{
	for (const struct setting *s = p ? p->sets : NULL; s && name; s = s->next) {
		if (strcmp(s->name, name) == 0) {
			if (value)
				*value = s->value;
			if (line)
				*line = s->line;
			return 0;
		}
	}
	return -ENOENT;
}

const char *sdp_policy_file(const struct sdp_policy *p)
{
	return p && p->fname ? p->fname : "policy";
}

int sdp_policy_nrules(const struct sdp_policy *p)
{
	return p ? p->nrules : 0;
}

void sdp_policy_free(struct sdp_policy *p)
{
	if (!p)
		return;
	for (int i = 0; i < p->nrules; i++)
		free(p->rules[i].glob);
	while (p->sets) {
		struct setting *s = p->sets;
		p->sets = s->next;
		free(s);
	}
	free(p->rules);
	free(p->fname);
	free(p);
}
