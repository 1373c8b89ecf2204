/*
 * stat.c - `sdp stat [--json] [--procs]`: the SDP connections and processes
 * of this host, read from outside the processes.
 *
 * Every process running libsdp keeps its connection pool in a memfd named
 * "sdp-pool" (sdp/pool.h). One walk over /proc/PID/fd finds which process
 * holds which pool and, in the same pass, every socket's inode -> (pid,
 * fd); a connection record names its TCP socket by inode, so each is
 * placed with one lookup.
 *
 * A pool is another process's memory - possibly another user's (root sees
 * everyone's), possibly forged, possibly changing while it is read. It is
 * never mapped: it is copied with pread (a file that shrinks gives short
 * reads, never SIGBUS; holes are skipped, not read), its header is checked
 * against the file's size before any count or offset is used, records are
 * copied a chunk at a time and judged on the copy, and only records that
 * name a holder of the pool (a process) or a socket a holder has (a
 * connection, once) are kept - so what a pool claims cannot make sdp stat
 * read, keep or print more than the holders' own sockets. Strings are
 * bounded and escaped. A pool that fails a check is skipped with a note
 * on stderr.
 */
#include <arpa/inet.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "sdp/pool.h"
#include "tools/tool.h"

/* Bounds on what a header may claim: a pool of this libsdp is
 * sdp_pool_size() bytes with SDP_POOL_PROCS and SDP_POOL_CONNS records. */
#define POOL_MAX_BYTES  (2 * sdp_pool_size())
#define CHUNK           256              /* records copied per pread */

struct pool {                /* a pool found (and checked, unless bad) */
	dev_t dev;
	ino_t ino;
	bool bad;                /* failed a check: ignored */
	struct sdp_proc *procs;  /* copies of the records sdp stat lists */
	struct sdp_conn *conns;
	uint32_t nprocs, nconns;
};

struct holder { int pid, fd, pool; };      /* pid's descriptor fd is pool */
struct sockent { unsigned long long ino; int pid, fd; }; /* socket:[ino] */

struct scan {
	bool want_procs;         /* --procs: process records, else connections */
	struct pool *pools;
	int npools, cap_pools;
	struct holder *holders;
	int nholders, cap_holders;
	struct sockent *socks;   /* sockets of pool holders, sorted by inode */
	size_t nsocks, cap_socks;
	bool *claimed;           /* per socket: a record of this pool names it */
};

static void *grow(void *p, size_t n, int *cap, size_t size)
{
	if (n < (size_t)*cap)
		return p;
	int nc = *cap ? *cap * 2 : 16;
	void *np = realloc(p, (size_t)nc * size);
	if (!np) {
		fprintf(stderr, "sdp stat: out of memory\n");
		exit(1);
	}
	*cap = nc;
	return np;
}

static bool is_num(const char *s)
{
	if (!*s)
		return false;
	for (; *s; s++)
		if (*s < '0' || *s > '9')
			return false;
	return true;
}

/* Read exactly n bytes at off; what the file does not have (beyond its
 * end, or holes: skipped without reading) reads as zeros. -1 on error. */
static int pread_all(int fd, void *buf, size_t n, uint64_t off)
{
	off_t d = lseek(fd, (off_t)off, SEEK_DATA);
	if ((d < 0 && errno == ENXIO) || (d >= 0 && (uint64_t)d >= off + n)) {
		memset(buf, 0, n);       /* a hole: never written */
		return 0;
	}
	size_t got = 0;
	while (got < n) {
		ssize_t r = pread(fd, (char *)buf + got, n - got, (off_t)(off + got));
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -1;
		if (r == 0)
			break;
		got += (size_t)r;
	}
	memset((char *)buf + got, 0, n - got);
	return 0;
}

/* Does [off, off + n * size) lie inside the file, after the header, and
 * aligned for the records' loads? */
static bool range_ok(uint64_t off, uint64_t n, uint64_t size, uint64_t len,
		     uint64_t align)
{
	return off >= sizeof(struct sdp_pool_hdr) && off % align == 0 &&
	       off <= len && n <= (len - off) / size;
}

/* Check a pool's header against the file it came from: NULL if usable,
 * else why not. */
static const char *pool_check(const struct sdp_pool_hdr *h, uint64_t len)
{
	if (h->magic != SDP_POOL_MAGIC)
		return "bad magic";
	if (h->version != SDP_POOL_VERSION)
		return "another version of libsdp";
	if (h->conn_size != sizeof(struct sdp_conn))
		return "record size differs from this sdp's";
	if (h->nprocs > SDP_POOL_PROCS || h->nconns > SDP_POOL_CONNS)
		return "record counts out of range";
	if (!range_ok(h->procs_off, h->nprocs, sizeof(struct sdp_proc), len,
		      _Alignof(struct sdp_proc)))
		return "process table outside the pool";
	if (!range_ok(h->conns_off, h->nconns, sizeof(struct sdp_conn), len,
		      _Alignof(struct sdp_conn)))
		return "connection table outside the pool";
	uint64_t pe = h->procs_off + (uint64_t)h->nprocs * sizeof(struct sdp_proc);
	uint64_t ce = h->conns_off + (uint64_t)h->nconns * sizeof(struct sdp_conn);
	if (h->nprocs && h->nconns && h->procs_off < ce && h->conns_off < pe)
		return "process and connection tables overlap";
	return NULL;
}

static bool holds_pool(const struct scan *s, int pid, int k)
{
	for (int u = 0; u < s->nholders; u++)
		if (s->holders[u].pid == pid && s->holders[u].pool == k)
			return true;
	return false;
}

/* First index of ino in the sorted socket table, or nsocks. */
static size_t sock_find(const struct scan *s, unsigned long long ino)
{
	size_t lo = 0, hi = s->nsocks;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (s->socks[mid].ino < ino)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo < s->nsocks && s->socks[lo].ino == ino ? lo : s->nsocks;
}

/* Is this record one sdp stat lists for pool k? Processes: a pid that
 * holds the pool, once. Connections: in use, and naming a socket one of
 * the pool's holders has, which no earlier record of the pool named. So
 * what is kept is bounded by the holders and their sockets, whatever the
 * pool claims. */
static bool wanted(struct scan *s, int k, const void *r, size_t *claims,
		   size_t *nclaims)
{
	if (s->want_procs) {
		int pid = atomic_load(&((const struct sdp_proc *)r)->pid);
		const struct pool *p = &s->pools[k];
		if (pid <= 0 || !holds_pool(s, pid, k))
			return false;
		for (uint32_t i = 0; i < p->nprocs; i++)
			if (atomic_load(&p->procs[i].pid) == pid)
				return false;
		return true;
	}
	const struct sdp_conn *c = r;
	uint32_t st = atomic_load(&c->state);
	if (!atomic_load(&c->inuse) || st == SDP_ST_FREE || st == SDP_ST_CLOSED)
		return false;
	bool any = false;
	for (size_t x = sock_find(s, c->tcp_ino);
	     x < s->nsocks && s->socks[x].ino == c->tcp_ino; x++) {
		if (s->claimed[x] || !holds_pool(s, s->socks[x].pid, k))
			continue;
		s->claimed[x] = true;
		claims[(*nclaims)++] = x;
		any = true;
	}
	return any;
}

/* Copy the records of pool k that sdp stat lists. Records are read in
 * chunks and judged on the copy only. */
static void copy_records(struct scan *s, int k, int fd, const struct sdp_pool_hdr *h)
{
	struct pool *p = &s->pools[k];
	bool procs = s->want_procs;
	size_t size = procs ? sizeof(struct sdp_proc) : sizeof(struct sdp_conn);
	uint32_t total = procs ? h->nprocs : h->nconns;
	uint64_t off = procs ? h->procs_off : h->conns_off;
	char *chunk = malloc(CHUNK * size);
	size_t *claims = malloc((s->nsocks + 1) * sizeof *claims), nclaims = 0;
	char *keep = NULL;
	uint32_t nkeep = 0, cap = 0;
	if (!chunk || !claims) {
		fprintf(stderr, "sdp stat: out of memory\n");
		exit(1);
	}
	for (uint32_t i0 = 0; i0 < total; i0 += CHUNK) {
		uint32_t n = total - i0 < CHUNK ? total - i0 : CHUNK;
		if (pread_all(fd, chunk, n * size, off + (uint64_t)i0 * size) < 0)
			break;
		for (uint32_t i = 0; i < n; i++) {
			const char *r = chunk + (size_t)i * size;
			if (!wanted(s, k, r, claims, &nclaims))
				continue;
			if (nkeep == cap) {
				cap = cap ? cap * 2 : 64;
				keep = realloc(keep, (size_t)cap * size);
				if (!keep) {
					fprintf(stderr, "sdp stat: out of memory\n");
					exit(1);
				}
			}
			memcpy(keep + (size_t)nkeep++ * size, r, size);
			if (procs) {          /* wanted() looks for a pid kept already */
				p->procs = (void *)keep;
				p->nprocs = nkeep;
			}
		}
	}
	for (size_t i = 0; i < nclaims; i++)
		s->claimed[claims[i]] = false;
	free(claims);
	free(chunk);
	if (procs) {
		p->procs = (void *)keep;
		p->nprocs = nkeep;
	} else {
		p->conns = (void *)keep;
		p->nconns = nkeep;
	}
}

/* Open pool k through one of its holders (the descriptor must still be
 * that pool), check it and copy what sdp stat lists; a bad pool is noted
 * once on stderr. */
static void load_pool(struct scan *s, int k)
{
	struct pool *p = &s->pools[k];
	const struct holder *by = NULL;
	int fd = -1;
	struct stat st;
	for (int u = 0; u < s->nholders && fd < 0; u++) {
		if (s->holders[u].pool != k)
			continue;
		char path[64];
		snprintf(path, sizeof path, "/proc/%d/fd/%d", s->holders[u].pid,
			 s->holders[u].fd);
		fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
		if (fd >= 0 && (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) ||
				st.st_dev != p->dev || st.st_ino != p->ino)) {
			close(fd);        /* closed and the number reused meanwhile */
			fd = -1;
		}
		by = &s->holders[u];
	}
	if (fd < 0) {
		p->bad = true;            /* gone meanwhile */
		return;
	}
	struct sdp_pool_hdr h;
	const char *bad = NULL;
	if (st.st_size < (off_t)sizeof h || (uint64_t)st.st_size > POOL_MAX_BYTES)
		bad = "size out of range";
	else if (pread_all(fd, &h, sizeof h, 0) < 0)
		bad = strerror(errno);
	else
		bad = pool_check(&h, (uint64_t)st.st_size);
	if (bad) {
		fprintf(stderr, "sdp stat: skipping the pool of pid %d (fd %d): %s\n",
			by->pid, by->fd, bad);
		p->bad = true;
	} else {
		copy_records(s, k, fd, &h);
	}
	close(fd);
}

/* fd of pid is "/memfd:sdp-pool...": note it as a holder of its pool
 * (found by the file's identity: forked processes share one). */
static void add_holder(struct scan *s, int pid, int fd, const char *path)
{
	struct stat st;
	if (stat(path, &st) < 0 || !S_ISREG(st.st_mode))
		return;                   /* gone, or not ours to see */
	int k;
	for (k = 0; k < s->npools; k++)
		if (s->pools[k].dev == st.st_dev && s->pools[k].ino == st.st_ino)
			break;
	if (k == s->npools) {
		s->pools = grow(s->pools, (size_t)s->npools, &s->cap_pools, sizeof *s->pools);
		s->pools[s->npools++] = (struct pool){ .dev = st.st_dev, .ino = st.st_ino };
	}
	s->holders = grow(s->holders, (size_t)s->nholders, &s->cap_holders,
			  sizeof *s->holders);
	s->holders[s->nholders++] = (struct holder){ pid, fd, k };
}

static void add_sock(struct scan *s, unsigned long long ino, int pid, int fd)
{
	if (s->nsocks == s->cap_socks) {
		size_t nc = s->cap_socks ? s->cap_socks * 2 : 1024;
		struct sockent *n = realloc(s->socks, nc * sizeof *n);
		if (!n) {
			fprintf(stderr, "sdp stat: out of memory\n");
			exit(1);
		}
		s->socks = n;
		s->cap_socks = nc;
	}
	s->socks[s->nsocks++] = (struct sockent){ ino, pid, fd };
}

/* One pass over /proc/PID/fd of every process we may inspect: the pools
 * each holds and its sockets. */
static void scan_proc(struct scan *s)
{
	DIR *proc = opendir("/proc");
	struct dirent *de;
	while (proc && (de = readdir(proc))) {
		if (!is_num(de->d_name))
			continue;
		int pid = atoi(de->d_name);
		char dir[64];
		snprintf(dir, sizeof dir, "/proc/%d/fd", pid);
		DIR *d = opendir(dir);
		if (!d)
			continue;
		size_t socks0 = s->nsocks;
		int holders0 = s->nholders;
		struct dirent *fe;
		while ((fe = readdir(d))) {
			if (!is_num(fe->d_name))
				continue;
			char path[64 + sizeof fe->d_name], link[256];
			snprintf(path, sizeof path, "%s/%s", dir, fe->d_name);
			ssize_t l = readlink(path, link, sizeof link - 1);
			if (l <= 0)
				continue;
			link[l] = 0;
			unsigned long long ino;
			char tail;
			if (!strncmp(link, "socket:[", 8)) {
				if (sscanf(link + 8, "%llu%c", &ino, &tail) == 2 && tail == ']')
					add_sock(s, ino, pid, atoi(fe->d_name));
			} else if (!strncmp(link, "/memfd:" SDP_POOL_NAME,
					    7 + strlen(SDP_POOL_NAME))) {
				add_holder(s, pid, atoi(fe->d_name), path);
			}
		}
		closedir(d);
		if (s->nholders == holders0)
			s->nsocks = socks0;   /* only the sockets of pool holders matter */
	}
	if (proc)
		closedir(proc);
}

static int sock_cmp(const void *a, const void *b)
{
	const struct sockent *x = a, *y = b;
	if (x->ino != y->ino)
		return x->ino < y->ino ? -1 : 1;
	if (x->pid != y->pid)
		return x->pid < y->pid ? -1 : 1;
	return (x->fd > y->fd) - (x->fd < y->fd);
}

static const char *state_name(uint32_t st)
{
	switch (st) {
	case SDP_ST_CONNECTING:  return "connecting";
	case SDP_ST_ESTABLISHED: return "established";
	case SDP_ST_CLOSED:      return "closed";
	case SDP_ST_RESET:       return "reset";
	default:                 return "free";
	}
}

static const char *mode_name(uint8_t m)
{
	return m == SDP_MODE_PIPELINED ? "pipelined" :
	       m == SDP_MODE_COMBINED ? "combined" : "buffered";
}

static void addr_str(const union sdp_addr *a, char *out, size_t n)
{
	char h[INET6_ADDRSTRLEN] = "?";
	if (a->sa.sa_family == AF_INET) {
		inet_ntop(AF_INET, &a->in.sin_addr, h, sizeof h);
		snprintf(out, n, "%s:%u", h, ntohs(a->in.sin_port));
	} else if (a->sa.sa_family == AF_INET6) {
		inet_ntop(AF_INET6, &a->in6.sin6_addr, h, sizeof h);
		snprintf(out, n, "[%s]:%u", h, ntohs(a->in6.sin6_port));
	} else {
		snprintf(out, n, "-");
	}
}

/* A process name from a pool: at most 20 bytes, printable, JSON-safe. */
static void comm_str(const char src[20], char *out, size_t n, bool json)
{
	size_t k = 0;
	for (size_t i = 0; i < 20 && src[i] && k + 7 < n; i++) {
		unsigned char ch = (unsigned char)src[i];
		if (json && (ch == '"' || ch == '\\'))
			k += (size_t)snprintf(out + k, n - k, "\\%c", ch);
		else if (json && (ch < 0x20 || ch >= 0x7f))
			k += (size_t)snprintf(out + k, n - k, "\\u%04x", ch);
		else
			out[k++] = ch < 0x20 || ch >= 0x7f ? '?' : (char)ch;
	}
	out[k] = 0;
}

static bool first = true;

static void print_procs(const struct scan *s, int k, bool json)
{
	const struct pool *p = &s->pools[k];
	for (uint32_t i = 0; i < p->nprocs; i++) {
		const struct sdp_proc *pr = &p->procs[i];
		int pid = atomic_load(&pr->pid);
		if (!holds_pool(s, pid, k))
			continue;             /* a stale or forged record */
		char comm[20 * 6 + 8];
		comm_str(pr->comm, comm, sizeof comm, json);
		unsigned long long sc = pr->sdp_conns, tc = pr->tcp_conns,
				   tx = pr->tx_bytes, rx = pr->rx_bytes;
		unsigned long long rc = pr->regions[0], rr = pr->regions_reused[0],
				   mc = pr->regions[1], mr = pr->regions_reused[1];
		if (json) {
			printf("%s\n {\"pid\": %d, \"comm\": \"%s\", \"sdp_conns\": %llu, "
			       "\"tcp_conns\": %llu, \"tx_bytes\": %llu, \"rx_bytes\": %llu, "
			       "\"regions_created\": %llu, \"regions_reused\": %llu, "
			       "\"regions_mapped\": %llu, \"mappings_reused\": %llu, "
			       "\"net_conns\": %llu, \"net_tx_bytes\": %llu, "
			       "\"net_rx_bytes\": %llu}",
			       first ? "" : ",", pid, comm, sc, tc, tx, rx, rc, rr, mc, mr,
			       (unsigned long long)pr->net_conns,
			       (unsigned long long)pr->net_tx_bytes,
			       (unsigned long long)pr->net_rx_bytes);
		} else {
			char a[48], b[48];
			snprintf(a, sizeof a, "%llu(%llu)", rc, rr);
			snprintf(b, sizeof b, "%llu(%llu)", mc, mr);
			printf("%-8d %-16s %9llu %9llu %14llu %14llu %14s %13s\n",
			       pid, comm, sc, tc, tx, rx, a, b);
		}
		first = false;
	}
}

/* The connection's fabric as its process wrote it (untrusted: letters,
 * digits and : _ - only, at most 15). "none" if it never had one. */
static void fabric_str(const struct sdp_conn *c, char *out, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < sizeof c->ep.label && c->ep.label[i] && k + 1 < n; i++) {
		char ch = c->ep.label[i];
		if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') ||
		    (ch >= '0' && ch <= '9') || ch == ':' || ch == '_' || ch == '-')
			out[k++] = ch;
	}
	out[k] = 0;
	if (!k)
		snprintf(out, n, "none");
}

static void print_conn(const struct sdp_conn *c, uint32_t st, int pid, int fd,
		       bool json)
{
	char la[64], ra[64], fab[20];
	fabric_str(c, fab, sizeof fab);
	addr_str(&c->local, la, sizeof la);
	addr_str(&c->remote, ra, sizeof ra);
	if (json)
		printf("%s\n {\"pid\": %d, \"fd\": %d, \"local\": \"%s\", "
		       "\"remote\": \"%s\", \"transport\": \"%s\", \"fabric\": \"%s\", "
		       "\"state\": \"%s\", \"mode\": \"%s\", "
		       "\"role\": \"%s\", "
		       "\"tx_bytes\": %llu, \"rx_bytes\": %llu, "
		       "\"tx_msgs\": %llu, \"rx_msgs\": %llu, "
		       "\"tx_bcopy_bytes\": %llu, \"rx_bcopy_bytes\": %llu, "
		       "\"tx_stream_bytes\": %llu, "
		       "\"tx_rzcopy_bytes\": %llu, \"rx_rzcopy_bytes\": %llu, "
		       "\"tx_wzcopy_bytes\": %llu, \"rx_wzcopy_bytes\": %llu, "
		       "\"mr_cache_hits\": %llu, \"mr_cache_misses\": %llu, "
		       "\"tx_azcopy_bytes\": %llu, \"rx_azcopy_bytes\": %llu, "
		       "\"rx_azasync_bytes\": %llu, \"az_faults\": %llu, "
		       "\"az_cow_copies\": %llu, \"az_outstanding\": %llu, "
		       "\"ring_window\": %u, \"ring_window_max\": %u, "
		       "\"trims\": %llu, \"trimmed_bytes\": %llu, "
		       "\"nslots\": %u, \"slot_size\": %u, "
		       "\"doorbells_tx\": %llu, \"doorbells_rx\": %llu, "
		       "\"queue_kicks\": %llu, \"futex_kicks\": %llu, "
		       "\"futex_sleeps\": %llu, \"tokens_owed\": %llu, "
		       "\"accept_hellos_read\": %u, \"accept_hellos_back\": %u, "
		       "\"credits\": %u}",
		       first ? "" : ",", pid, fd, la, ra,
		       c->transport ? "sdp" : "tcp", fab,
		       state_name(st), mode_name(c->mode),
		       c->role == SDP_ROLE_SERVER ? "server" : "client",
		       (unsigned long long)c->st.tx_bytes,
		       (unsigned long long)c->st.rx_bytes,
		       (unsigned long long)c->st.tx_msgs,
		       (unsigned long long)c->st.rx_msgs,
		       (unsigned long long)c->st.tx_bcopy_bytes,
		       (unsigned long long)c->st.rx_bcopy_bytes,
		       (unsigned long long)c->st.tx_stream_bytes,
		       (unsigned long long)c->st.tx_rzcopy_bytes,
		       (unsigned long long)c->st.rx_rzcopy_bytes,
		       (unsigned long long)c->st.tx_wzcopy_bytes,
		       (unsigned long long)c->st.rx_wzcopy_bytes,
		       (unsigned long long)c->ep.mr_hits,
		       (unsigned long long)c->ep.mr_misses,
		       (unsigned long long)c->st.tx_azcopy_bytes,
		       (unsigned long long)c->st.rx_azcopy_bytes,
		       (unsigned long long)c->st.rx_azasync_bytes,
		       (unsigned long long)c->st.az_faults,
		       (unsigned long long)c->st.az_cow_copies,
		       (unsigned long long)c->st.az_outstanding,
		       c->st.ring_window, c->st.ring_window_max,
		       (unsigned long long)c->st.trims,
		       (unsigned long long)c->st.trimmed_bytes,
		       c->ep.nslots, c->ep.slot_size,
		       (unsigned long long)c->st.doorbells_tx,
		       (unsigned long long)c->st.doorbells_rx,
		       (unsigned long long)c->st.queue_kicks,
		       (unsigned long long)c->st.futex_kicks,
		       (unsigned long long)c->st.futex_sleeps,
		       (unsigned long long)c->st.tokens_owed,
		       c->st.accept_hellos_read, c->st.accept_hellos_back,
		       c->st.credits);
	else
		printf("%-7d %-4d %-22s %-22s %-5s %-11s %-9s %12llu %12llu %9llu %9llu %4u\n",
		       pid, fd, la, ra, c->transport ? "sdp" : "tcp",
		       state_name(st), mode_name(c->mode),
		       (unsigned long long)c->st.tx_bytes,
		       (unsigned long long)c->st.rx_bytes,
		       (unsigned long long)c->st.tx_msgs,
		       (unsigned long long)c->st.rx_msgs, c->st.credits);
	first = false;
}

static void print_conns(const struct scan *s, int k, bool json)
{
	const struct pool *p = &s->pools[k];
	for (uint32_t i = 0; i < p->nconns; i++) {
		const struct sdp_conn *c = &p->conns[i];
		/* Every (pid, fd) of a process holding this pool whose
		 * descriptor is the connection's socket. */
		for (size_t x = sock_find(s, c->tcp_ino);
		     x < s->nsocks && s->socks[x].ino == c->tcp_ino; x++)
			if (holds_pool(s, s->socks[x].pid, k))
				print_conn(c, atomic_load(&c->state), s->socks[x].pid,
					   s->socks[x].fd, json);
	}
}

int sdp_cmd_stat(int argc, char **argv)
{
	bool json = false, procs = false;
	for (int i = 0; i < argc; i++) {
		if (!strcmp(argv[i], "--json"))
			json = true;
		else if (!strcmp(argv[i], "--procs"))
			procs = true;
		else
			sdp_bad_option("stat", argv[i]);
	}
	struct scan s = { .want_procs = procs };
	scan_proc(&s);
	qsort(s.socks, s.nsocks, sizeof *s.socks, sock_cmp);
	s.claimed = calloc(s.nsocks + 1, sizeof *s.claimed);
	if (!s.claimed) {
		fprintf(stderr, "sdp stat: out of memory\n");
		return 1;
	}
	for (int k = 0; k < s.npools; k++)
		load_pool(&s, k);

	if (json)
		printf("[");
	else if (procs)
		printf("%-8s %-16s %9s %9s %14s %14s %13s %13s\n", "PID", "COMM",
		       "SDP_CONNS", "TCP_CONNS", "TX_BYTES", "RX_BYTES",
		       "REGIONS(REUSE)", "MAPPED(REUSE)");
	else
		printf("%-7s %-4s %-22s %-22s %-5s %-11s %-9s %12s %12s %9s %9s %4s\n",
		       "PID", "FD", "LOCAL", "REMOTE", "TRANS", "STATE", "MODE",
		       "TX_BYTES", "RX_BYTES", "TX_MSGS", "RX_MSGS", "CRED");
	for (int k = 0; k < s.npools; k++) {
		if (s.pools[k].bad)
			continue;
		if (procs)
			print_procs(&s, k, json);
		else
			print_conns(&s, k, json);
	}
	if (json)
		printf("%s]\n", first ? "" : "\n");
	for (int k = 0; k < s.npools; k++) {
		free(s.pools[k].procs);
		free(s.pools[k].conns);
	}
	free(s.pools);
	free(s.holders);
	free(s.socks);
	free(s.claimed);
	return 0;
}
