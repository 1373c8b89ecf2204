/*
 * The rendezvous of an SDP listener faces hostile local processes.
 *
 * Under SDP, listen() on 127.0.0.1:P publishes an abstract AF_UNIX
 * SOCK_SEQPACKET socket "@sdp1.<uid>.<family>.<port>.<hex addr>"; a client
 * sends a hello (struct sdp_hello) naming its TCP 4-tuple, with the shm
 * provider's offer (struct shm_offer) and the connection memory (a sealed
 * memfd) attached, before it connects. Abstract names carry no
 * permissions: any process of the host can connect there and send anything.
 * Each case runs in a forked child with a fresh listener, does something a
 * hostile process would do, and then requires that
 *   - real SDP clients still connect and carry data byte-exactly both ways
 *     on SDP (both ends), and a plain TCP client (one that never says hello;
 *     raw system calls, so the library does not see it) is served as plain
 *     TCP, byte-exactly;
 *   - hellos the listener rejects leave no descriptor behind in it;
 *   - nothing blocks: each case has a watchdog, a hang names its step.
 * Hellos that carry a bad memory or a bad header name the 4-tuple of the
 * plain client that connects next, so that accepting them by mistake would
 * show (the server end would claim SDP). One the listener cannot even
 * attribute (too short, bad magic) changes nothing: the plain client is
 * served as TCP. One from the listener's own user that names the
 * connection but cannot be served (another version, no or two descriptors,
 * unknown flags, memory that is not a valid region) is, as far as the
 * listener can tell, a committed client's: that connection is reset - the
 * client sees ECONNRESET - and the application never sees it, rather than
 * kept as TCP on one side while the client waits in shared memory. The
 * case "forged" is the control: a well-formed forged hello from the
 * listener's own user is accepted, so the same forgery from another user is
 * refused for the right reason.
 *
 * As root, processes that dropped to user 65534 (nobody) attack: a forged
 * hello for their own TCP connection (which must stay plain TCP), many
 * hellos with two descriptors attached, a connection to the rendezvous that
 * never sends, and a squatted rendezvous name; nobody also cannot open the
 * listener's connection memory through /proc/PID/fd or /proc/PID/map_files.
 *
 * On kernel TCP there is no rendezvous: the name must not exist, and plain
 * and ordinary clients are served byte-exactly.
 *
 * T_CASE=name runs only the case of that name (for debugging).
 */
#include "testlib.h"
#include <dirent.h>
#include <grp.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <sys/un.h>

/* The wire formats as the library defines them: the hello, and the shm
 * provider's offer and region header. */
#include "sdp/proto.h"
#include "fabric/shm_layout.h"

#define NOBODY 65534

#define F_NSLOTS        8
#define F_SLOT          4096
#define F_SIZE          (SHM_HDR_SIZE + 2u * F_NSLOTS * F_SLOT)

/* ---- watchdog naming the step ------------------------------------------ */

static const char *g_case = "-", *g_step = "set-up";
static unsigned g_wd_ms;

static void step(const char *s) { g_step = s; }

static void on_hang(int sig)
{
	char msg[512];
	int n = snprintf(msg, sizeof msg, "HANG: case %s [pid %d]: still in "
			 "\"%s\" after %u ms (last check started at %s:%d)\n",
			 g_case, (int)getpid(), g_step, g_wd_ms, tl_last_file,
			 tl_last_line);
	(void)sig;
	if (write(2, msg, (size_t)n) < 0) { /* nothing else to do */ }
	_exit(3);
}

static void child_watchdog(unsigned ms)
{
	g_wd_ms = ms;
	signal(SIGALRM, on_hang);
	struct itimerval it = { .it_value = { ms / 1000, (long)(ms % 1000) * 1000 } };
	SYS(setitimer(ITIMER_REAL, &it, NULL));
}

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* ---- plain TCP by raw system calls (invisible to the library) ---------- */

static int raw_bound(uint16_t *sport)
{
	int fd = (int)syscall(SYS_socket, AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	CHECK(fd >= 0);
	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(syscall(SYS_bind, fd, &a, sizeof a) == 0);
	socklen_t len = sizeof a;
	CHECK(syscall(SYS_getsockname, fd, &a, &len) == 0);
	*sport = ntohs(a.sin_port);
	return fd;
}

static void raw_connect(int fd, uint16_t port)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(port),
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	CHECK(syscall(SYS_connect, fd, &a, sizeof a) == 0, "raw connect");
}

static void raw_close(int fd)
{
	CHECK(syscall(SYS_close, fd) == 0);
}

static void raw_send_pat(int fd, size_t total, uint32_t seed)
{
	static char buf[8192];
	uint64_t off = 0;
	while (off < total) {
		size_t n = total - off < sizeof buf ? total - off : sizeof buf;
		tl_fill(buf, n, off, seed);
		for (size_t d = 0; d < n;) {
			long r = syscall(SYS_sendto, fd, buf + d, n - d, MSG_NOSIGNAL,
					 NULL, 0);
			CHECK(r > 0, "raw send");
			d += (size_t)r;
		}
		off += n;
	}
}

static void raw_recv_pat(int fd, size_t total, uint32_t seed)
{
	static char buf[8192];
	uint64_t off = 0;
	while (off < total) {
		size_t want = total - off < sizeof buf ? total - off : sizeof buf;
		long r = syscall(SYS_recvfrom, fd, buf, want, 0, NULL, NULL);
		CHECK(r > 0, "raw recv returned %ld with %zu bytes to go", r,
		      (size_t)(total - off));
		CHECK_PAT(buf, (size_t)r, off, seed);
		off += (uint64_t)r;
	}
}

/* ---- the rendezvous ---------------------------------------------------- */

static socklen_t rv_name(struct sockaddr_un *un, unsigned uid, uint16_t port)
{
	memset(un, 0, sizeof *un);
	un->sun_family = AF_UNIX;
	int n = snprintf(un->sun_path + 1, sizeof un->sun_path - 1,
			 "sdp1.%u.%u.%u.7f000001", uid, (unsigned)AF_INET,
			 (unsigned)port);
	return (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + (size_t)n);
}

static bool rv_listed(unsigned uid, uint16_t port)
{
	char want[128], line[512];
	snprintf(want, sizeof want, " @sdp1.%u.%u.%u.7f000001\n", uid,
		 (unsigned)AF_INET, (unsigned)port);
	FILE *f = fopen("/proc/net/unix", "re");
	CHECK(f != NULL);
	bool found = false;
	while (!found && fgets(line, sizeof line, f)) {
		size_t ll = strlen(line), wl = strlen(want);
		found = ll >= wl && strcmp(line + ll - wl, want) == 0;
	}
	fclose(f);
	return found;
}

/* A connection to the listener's rendezvous, or -1 with errno. */
static int rv_connect(unsigned uid, uint16_t port)
{
	struct sockaddr_un un;
	socklen_t len = rv_name(&un, uid, port);
	int s = SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0));
	if (connect(s, (struct sockaddr *)&un, len) < 0) {
		int e = errno;
		close(s);
		errno = e;
		return -1;
	}
	return s;
}

static void put(int s, const void *msg, size_t len, const int *fds, int nfd)
{
	struct iovec iov = { (void *)msg, len };
	union { struct cmsghdr c; char buf[CMSG_SPACE(16 * sizeof(int))]; } u;
	memset(&u, 0, sizeof u);
	struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1 };
	if (nfd) {
		m.msg_control = u.buf;
		m.msg_controllen = CMSG_SPACE((size_t)nfd * sizeof(int));
		struct cmsghdr *cm = CMSG_FIRSTHDR(&m);
		cm->cmsg_level = SOL_SOCKET;
		cm->cmsg_type = SCM_RIGHTS;
		cm->cmsg_len = CMSG_LEN((size_t)nfd * sizeof(int));
		memcpy(CMSG_DATA(cm), fds, (size_t)nfd * sizeof(int));
	}
	CHECK_EQ(sendmsg(s, &m, MSG_NOSIGNAL), (ssize_t)len);
}

/* One message on a fresh connection to the rendezvous. */
static void send_to_rv(unsigned uid, uint16_t port, const void *msg,
		       size_t len, const int *fds, int nfd)
{
	int s = rv_connect(uid, port);
	CHECK(s >= 0, "connect to the rendezvous of port %u", port);
	put(s, msg, len, fds, nfd);
	SYS(close(s));
}

static struct sdp_hello mk_hello(uint16_t dport, uint16_t sport, uint64_t token)
{
	struct sdp_hello h = {
		.magic = SDP_HELLO_MAGIC,
		.version = SDP_PROTO_VERSION,
		.family = AF_INET,
		.dst_port = htons(dport),
		.src_port = htons(sport),
		.pid = (int32_t)getpid(),
		.token = token,
		.time_ns = now_ns(),
		.fabric = FAB_ID_SHM,
		.nfds = 1,
		.offer_len = sizeof(struct shm_offer),
	};
	uint32_t lo = htonl(INADDR_LOOPBACK);
	memcpy(h.dst_addr, &lo, 4);
	memcpy(h.src_addr, &lo, 4);          /* the whole 4-tuple, as a client */
	return h;
}

/* The shm offer: the region `pg` pages into the memfd, with these flags. */
static void set_offer(struct sdp_hello *h, uint32_t pg, uint32_t flags)
{
	struct shm_offer o = { .region_pg = pg, .flags = flags };
	memcpy(h->offer, &o, sizeof o);
}

enum rkind { R_GOOD, R_SMALL, R_UNSEALED, R_BADMAGIC };

/* Connection memory as a client makes it (or broken as asked), the
 * region `pages` pages into a memfd of `size` bytes (an arena slot). */
static int mk_region_at(uint64_t token, enum rkind k, uint32_t pages, off_t size)
{
	int fd = (int)syscall(SYS_memfd_create, "sdp-conn",
			      MFD_CLOEXEC | MFD_ALLOW_SEALING);
	CHECK(fd >= 0);
	SYS(ftruncate(fd, size));
	struct shm_hdr *h = mmap(NULL, SHM_HDR_SIZE, PROT_READ | PROT_WRITE,
				 MAP_SHARED, fd, (off_t)pages * 4096);
	CHECK(h != MAP_FAILED);
	h->magic = k == R_BADMAGIC ? ~SHM_MAGIC : SHM_MAGIC;
	h->version = SHM_VERSION;
	h->nslots = F_NSLOTS;
	h->slot_size = F_SLOT;
	h->token = token;
	h->ring_off = SHM_HDR_SIZE;
	h->state = SHM_ST_CONNECTING;
	SYS(munmap(h, SHM_HDR_SIZE));
	if (k != R_UNSEALED)
		SYS(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL));
	return fd;
}

static int mk_region(uint64_t token, enum rkind k)
{
	return mk_region_at(token, k, 0, k == R_SMALL ? SHM_HDR_SIZE : F_SIZE);
}

/* A complete, well-formed hello for (127.0.0.1:sport -> :dport). */
static void send_forged(unsigned uid, uint16_t dport, uint16_t sport,
			uint64_t token, enum rkind k)
{
	struct sdp_hello h = mk_hello(dport, sport, token);
	int m = mk_region(token, k);
	send_to_rv(uid, dport, &h, sizeof h, &m, 1);
	SYS(close(m));
}

/* ---- what must keep working -------------------------------------------- */

#define NBYTES 50000

static int transport_of(int fd)
{
	int v = -1;
	socklen_t l = sizeof v;
	if (getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &l) < 0)
		return -1;
	return v;
}

static void sdp_client_ok(int l, uint16_t port, uint32_t seed)
{
	step("an SDP client connects and exchanges data");
	int c = tl_connect(AF_INET, port);
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(c);
	expect_transport(s);
	tl_send_pat(c, 0, NBYTES, seed, 16384);
	tl_recv_pat(s, 0, NBYTES, seed, 65536);
	tl_send_pat(s, 0, NBYTES, seed + 1, 65536);
	tl_recv_pat(c, 0, NBYTES, seed + 1, 7000);
	SYS(close(c));
	SYS(close(s));
}

/* raw: a bound raw TCP socket, not connected yet. */
static void plain_client_ok(int l, int raw, uint16_t port, uint32_t seed)
{
	step("a plain TCP client connects and exchanges data");
	raw_connect(raw, port);
	int s = SYS(accept(l, NULL, NULL));
	if (tl_sdp_mode())
		CHECK(transport_of(s) == 0, "the server end of a plain TCP "
		      "client claims SDP_TRANSPORT %d", transport_of(s));
	else
		expect_transport(s);
	raw_send_pat(raw, NBYTES, seed);
	tl_recv_pat(s, 0, NBYTES, seed, 65536);
	tl_send_pat(s, 0, NBYTES, seed + 1, 65536);
	raw_recv_pat(raw, NBYTES, seed + 1);
	raw_close(raw);
	SYS(close(s));
}

/* The plain client's 4-tuple was named by a hello of our user that
 * cannot be served: accept() resets that connection and goes on (here to
 * EAGAIN: the listener is made non-blocking for the call), the client
 * sees ECONNRESET. */
static void plain_client_reset(int l, int raw, uint16_t port)
{
	step("a plain TCP client named by a bad hello is reset");
	raw_connect(raw, port);
	int fl = SYS(fcntl(l, F_GETFL));
	SYS(fcntl(l, F_SETFL, fl | O_NONBLOCK));
	CHECK_ERR(accept(l, NULL, NULL), EAGAIN);
	SYS(fcntl(l, F_SETFL, fl));
	char b;
	errno = 0;
	long r = syscall(SYS_recvfrom, raw, &b, 1, 0, NULL, NULL);
	CHECK(r == -1 && errno == ECONNRESET, "the client's recv returned %ld", r);
	raw_close(raw);
}

static int count_fds(void)
{
	DIR *d = opendir("/proc/self/fd");
	CHECK(d != NULL);
	int n = 0;
	struct dirent *e;
	while ((e = readdir(d)))
		n += e->d_name[0] != '.';
	closedir(d);
	return n - 1;                     /* the directory's own */
}

/* ---- same-user hostile acts -------------------------------------------- */

struct hctx {
	int l;
	uint16_t port;
	int raw;                      /* plain client, bound, connects later */
	uint16_t rport;               /* its local port: the tuple to name */
	int held[4];                  /* hostile sockets kept open meanwhile */
	int nheld;
	int keep;                     /* hellos the listener may keep pending */
	bool forged;                  /* the plain client's tuple was forged */
	bool reset;                   /* ... in a hello that cannot be served */
};

static void h_none(struct hctx *x) { (void)x; }

static void h_connect_close(struct hctx *x)
{
	for (int i = 0; i < 3; i++) {
		int s = rv_connect(geteuid(), x->port);
		CHECK(s >= 0);
		SYS(close(s));
	}
}

static void h_silent(struct hctx *x)
{
	/* connects, then neither sends nor closes */
	x->held[x->nheld] = rv_connect(geteuid(), x->port);
	CHECK(x->held[x->nheld] >= 0);
	x->nheld++;
}

static void h_short(struct hctx *x)
{
	send_to_rv(geteuid(), x->port, "SDPH", 4, NULL, 0);
	send_to_rv(geteuid(), x->port, "", 0, NULL, 0);
}

static void h_oversized(struct hctx *x)
{
	x->reset = true;
	/* a valid hello followed by more bytes, memory attached */
	char big[200];
	memset(big, 0xA5, sizeof big);
	struct sdp_hello h = mk_hello(x->port, x->rport, 77);
	memcpy(big, &h, sizeof h);
	int m = mk_region(77, R_GOOD);
	send_to_rv(geteuid(), x->port, big, sizeof big, &m, 1);
	SYS(close(m));
}

static void h_bad_magic(struct hctx *x)
{
	struct sdp_hello h = mk_hello(x->port, x->rport, 78);
	h.magic ^= 0x01000000;
	int m = mk_region(78, R_GOOD);
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
}

static void h_bad_version(struct hctx *x)
{
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 79);
	h.version = SDP_PROTO_VERSION + 41;
	int m = mk_region(79, R_GOOD);
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
}

static void h_no_fd(struct hctx *x)
{
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 80);
	send_to_rv(geteuid(), x->port, &h, sizeof h, NULL, 0);
}

static void h_pipe(struct hctx *x)
{
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 81);
	int p[2];
	SYS(pipe(p));
	send_to_rv(geteuid(), x->port, &h, sizeof h, &p[0], 1);
	SYS(close(p[0]));
	SYS(close(p[1]));
}

static void h_small(struct hctx *x)
{
	x->reset = true;
	send_forged(geteuid(), x->port, x->rport, 82, R_SMALL);
}

static void h_unsealed(struct hctx *x)
{
	x->reset = true;
	send_forged(geteuid(), x->port, x->rport, 83, R_UNSEALED);
}

static void h_region_magic(struct hctx *x)
{
	x->reset = true;
	send_forged(geteuid(), x->port, x->rport, 84, R_BADMAGIC);
}

static void h_token(struct hctx *x)
{
	struct sdp_hello h = mk_hello(x->port, x->rport, 85);
	int m = mk_region(86, R_GOOD);          /* another token inside */
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
}

static void h_two_fds(struct hctx *x)
{
	x->reset = true;
	/* a correct hello, but two descriptors attached */
	struct sdp_hello h = mk_hello(x->port, x->rport, 87);
	int fds[2] = { mk_region(87, R_GOOD), -1 };
	int p[2];
	SYS(pipe(p));
	fds[1] = p[0];
	for (int i = 0; i < 20; i++)
		send_to_rv(geteuid(), x->port, &h, sizeof h, fds, 2);
	SYS(close(fds[0]));
	SYS(close(p[0]));
	SYS(close(p[1]));
}

static void h_many_fds(struct hctx *x)
{
	/* more descriptors than the listener takes: the kernel cuts them off
	 * (MSG_CTRUNC), as it does when the listener is at its fd limit */
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 95);
	int fds[12];
	fds[0] = mk_region(95, R_GOOD);
	for (int i = 1; i < 12; i++)
		fds[i] = fds[0];
	send_to_rv(geteuid(), x->port, &h, sizeof h, fds, 12);
	SYS(close(fds[0]));
}

static void h_never(struct hctx *x)
{
	/* well-formed, for a 4-tuple that never connects, dated in the far
	 * future and naming a process that never exits */
	struct sdp_hello h = mk_hello(x->port, 1999, 88);
	h.time_ns = UINT64_MAX;
	h.pid = 1;
	int m = mk_region(88, R_GOOD);
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
	x->keep = 1;
}

#define FLOOD 300

static void h_flood(struct hctx *x)
{
	int p[2];
	SYS(pipe(p));
	for (int i = 0; i < FLOOD; i++) {
		/* well-formed, for tuples that never connect */
		send_forged(geteuid(), x->port, (uint16_t)(1000 + i),
			    1000 + (uint64_t)i, R_GOOD);
		/* and malformed ones, of every kind */
		struct sdp_hello h = mk_hello(x->port, (uint16_t)(2000 + i), 5);
		int m = mk_region(5, (enum rkind)(1 + i % 3));
		switch (i % 5) {
		case 0: h.magic = 0; break;
		case 1: h.version = 0; break;
		default: break;
		}
		if (i % 5 == 3)
			send_to_rv(geteuid(), x->port, &h, sizeof h, &p[0], 1);
		else if (i % 5 == 4)
			send_to_rv(geteuid(), x->port, &h, 10, NULL, 0);
		else
			send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
		SYS(close(m));
	}
	SYS(close(p[0]));
	SYS(close(p[1]));
	/* Pending until their client connects: the well-formed ones, and
	 * those whose only fault is in the memory (checked at accept). */
	x->keep = FLOOD + 2 * FLOOD / 5;
}

/* Arena slots (SHM_OFFER_POOLED): the offset must leave room for the
 * whole region inside the memfd; unknown flags are refused. */
static void h_pooled_past_end(struct hctx *x)
{
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 90);
	int m = mk_region(90, R_GOOD);
	set_offer(&h, F_SIZE / 4096, SHM_OFFER_POOLED);   /* just past the end */
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	set_offer(&h, UINT32_MAX, SHM_OFFER_POOLED);
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
	x->keep = 2;          /* well-formed until their memory is looked at */
}

static void h_pooled_no_room(struct hctx *x)
{
	x->reset = true;
	/* a good header one page in, but the rings would run past the end */
	struct sdp_hello h = mk_hello(x->port, x->rport, 91);
	int m = mk_region_at(91, R_GOOD, 1, F_SIZE);
	set_offer(&h, 1, SHM_OFFER_POOLED);
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
	x->keep = 1;
}

static void h_bad_flags(struct hctx *x)
{
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 92);
	int m = mk_region(92, R_GOOD);
	h.flags = 0x100;                      /* the hello's */
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	h.flags = 0;
	set_offer(&h, 0, 0x100);              /* the shm offer's */
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
}

/* The engine's checks around the provider's part: a provider that does
 * not exist, an offer longer than its room, bytes after its end, the
 * reserved word. */
static void h_bad_offer(struct hctx *x)
{
	x->reset = true;
	struct sdp_hello h = mk_hello(x->port, x->rport, 95);
	int m = mk_region(95, R_GOOD);
	h.fabric = 0xEE;
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	h = mk_hello(x->port, x->rport, 95);
	h.offer_len = sizeof h.offer + 1;
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	h = mk_hello(x->port, x->rport, 95);
	h.offer[sizeof h.offer - 1] = 1;
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	h = mk_hello(x->port, x->rport, 95);
	h.reserved = 1;
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	h = mk_hello(x->port, x->rport, 95);
	h.offer_len = 3;                      /* too short for the shm offer */
	send_to_rv(geteuid(), x->port, &h, sizeof h, &m, 1);
	SYS(close(m));
}

/* A hello that claims to be put back by a process sharing the listener
 * (SDP_HELLO_RETURNED) but does not carry the listener's secret. */
static void h_returned_forged(struct hctx *x)
{
	struct sdp_hello_back b = { .h = mk_hello(x->port, x->rport, 94),
				    .secret = 0x5d5d5d5d5d5d5d5dull };
	int m = mk_region(94, R_GOOD);
	b.h.flags = SDP_HELLO_RETURNED;
	send_to_rv(geteuid(), x->port, &b, sizeof b, &m, 1);
	SYS(close(m));
}

/* The control: a forged hello of the listener's own user is taken - a
 * region of its own, or (pooled-forged) a slot three pages into an arena. */
static int g_forged_mem = -1;
static uint32_t g_forged_pg;
static void h_forged(struct hctx *x)
{
	struct sdp_hello h = mk_hello(x->port, x->rport, 89);
	g_forged_mem = mk_region(89, R_GOOD);
	g_forged_pg = 0;
	send_to_rv(geteuid(), x->port, &h, sizeof h, &g_forged_mem, 1);
	x->forged = true;
}

static void h_pooled_forged(struct hctx *x)
{
	struct sdp_hello h = mk_hello(x->port, x->rport, 93);
	g_forged_pg = 3;
	g_forged_mem = mk_region_at(93, R_GOOD, g_forged_pg,
				    (off_t)g_forged_pg * 4096 + F_SIZE);
	set_offer(&h, g_forged_pg, SHM_OFFER_POOLED);
	send_to_rv(geteuid(), x->port, &h, sizeof h, &g_forged_mem, 1);
	x->forged = true;
}

static void forged_ok(struct hctx *x)
{
	step("the forged hello's client connects");
	raw_connect(x->raw, x->port);
	int s = SYS(accept(x->l, NULL, NULL));
	CHECK(transport_of(s) == 1, "a well-formed forged hello of the "
	      "listener's own user was not taken (transport %d): this test's "
	      "forgery no longer matches a real hello", transport_of(s));
	/* The server end writes into the forged memory: ring 1, first slot. */
	CHECK_EQ(send(s, "hi", 2, MSG_NOSIGNAL), 2);
	char *mem = mmap(NULL, F_SIZE, PROT_READ, MAP_SHARED, g_forged_mem,
			 (off_t)g_forged_pg * 4096);
	CHECK(mem != MAP_FAILED);
	struct sdp_bsdh b;
	memcpy(&b, mem + SHM_HDR_SIZE + F_NSLOTS * F_SLOT, sizeof b);
	CHECK_EQ(b.mid, SDP_MID_DATA);
	CHECK_EQ(b.len, sizeof b + 2);
	CHECK(memcmp(mem + SHM_HDR_SIZE + F_NSLOTS * F_SLOT + sizeof b,
		     "hi", 2) == 0);
	SYS(munmap(mem, F_SIZE));
	SYS(close(g_forged_mem));
	SYS(close(s));
	raw_close(x->raw);
}

/* ---- another user -------------------------------------------------------- */

struct orders {
	uint16_t port;
	int32_t server;
	int nfd;
	int fds[32];
	int nmap;
	unsigned long map_lo[8], map_hi[8];
};

static void drop_to_nobody(void)
{
	SYS(setgroups(0, NULL));
	SYS(setresgid(NOBODY, NOBODY, NOBODY));
	SYS(setresuid(NOBODY, NOBODY, NOBODY));
	CHECK_EQ(geteuid(), NOBODY);
}

typedef void (*nobody_fn)(const struct orders *o, int to_srv, int from_srv);

/* A process of user nobody, forked before anything of the case exists;
 * it runs fn once it has its orders. */
static pid_t spawn_nobody(nobody_fn fn, int *to_it, int *from_it)
{
	int a[2], b[2];
	SYS(pipe(a));
	SYS(pipe(b));
	fflush(NULL);
	pid_t pid = SYS(fork());
	if (pid == 0) {
		child_watchdog(g_wd_ms + 1000);   /* the server's fires first */
		SYS(close(a[1]));
		SYS(close(b[0]));
		drop_to_nobody();
		struct orders o;
		step("nobody: waiting for orders");
		if (read(a[0], &o, sizeof o) != (ssize_t)sizeof o)
			_exit(0);                 /* the server gave up */
		fn(&o, b[1], a[0]);
		_exit(0);
	}
	SYS(close(a[0]));
	SYS(close(b[1]));
	*to_it = a[1];
	*from_it = b[0];
	return pid;
}

static void wait_ok(pid_t pid, const char *who)
{
	int st;
	pid_t r;
	do
		r = waitpid(pid, &st, 0);
	while (r < 0 && errno == EINTR);
	CHECK_EQ(r, pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: %s %d", who,
	      WIFSIGNALED(st) ? "killed by signal" : "exit status",
	      WIFSIGNALED(st) ? WTERMSIG(st) : WEXITSTATUS(st));
}

/* nobody: a forged hello for its own TCP connection, then that connection
 * (plain TCP), then /proc probes of the server. */
static void nb_hello(const struct orders *o, int to_srv, int from_srv)
{
	char b;
	(void)from_srv;
	step("nobody: forged hello for its own connection");
	int c = SYS(socket(AF_INET, SOCK_STREAM, 0));
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(AF_INET, 0, &ss);
	SYS(bind(c, (struct sockaddr *)&ss, len));
	uint16_t mine = tl_port_of(c);
	int rv = rv_connect(0, o->port);
	if (rv >= 0) {
		struct sdp_hello h = mk_hello(o->port, mine, 90);
		int m = mk_region(90, R_GOOD);
		put(rv, &h, sizeof h, &m, 1);
		SYS(close(m));
		SYS(close(rv));
	} else {
		printf("nobody cannot reach the rendezvous (%s)\n",
		       strerror(errno));
	}
	step("nobody: its TCP connection");
	len = tl_addr(AF_INET, o->port, &ss);
	SYS(connect(c, (struct sockaddr *)&ss, len));
	CHECK(transport_of(c) == 0, "nobody's client claims SDP");
	CHECK_EQ(write(to_srv, "c", 1), 1);
	tl_send_pat(c, 0, NBYTES, 31, 16384);
	tl_recv_pat(c, 0, NBYTES, 32, 65536);
	SYS(close(c));

	step("nobody: /proc of the server");
	char path[128];
	for (int i = 0; i < o->nfd; i++) {
		snprintf(path, sizeof path, "/proc/%d/fd/%d", (int)o->server,
			 o->fds[i]);
		int r = open(path, O_RDWR);
		CHECK(r < 0 && errno == EACCES, "nobody opened %s", path);
		r = open(path, O_RDONLY);
		CHECK(r < 0 && errno == EACCES, "nobody opened %s", path);
	}
	for (int i = 0; i < o->nmap; i++) {
		snprintf(path, sizeof path, "/proc/%d/map_files/%lx-%lx",
			 (int)o->server, o->map_lo[i], o->map_hi[i]);
		int r = open(path, O_RDWR);
		CHECK(r < 0 && (errno == EACCES || errno == EPERM),
		      "nobody opened %s", path);
	}
	CHECK_EQ(read(from_srv, &b, 1), 1);
}

/* nobody: hellos with two descriptors attached. */
#define NB_TWO 50
static void nb_two_fds(const struct orders *o, int to_srv, int from_srv)
{
	(void)from_srv;
	step("nobody: hellos with two descriptors");
	int p[2];
	SYS(pipe(p));
	struct sdp_hello h = mk_hello(o->port, 3000, 91);
	for (int i = 0; i < NB_TWO; i++) {
		int rv = rv_connect(0, o->port);
		if (rv < 0)
			break;
		int fds[2] = { p[0], p[1] };
		put(rv, &h, sizeof h, fds, 2);
		SYS(close(rv));
	}
	CHECK_EQ(write(to_srv, "s", 1), 1);
}

/* nobody: connects to the rendezvous and says nothing, until told. */
static void nb_silent(const struct orders *o, int to_srv, int from_srv)
{
	char b;
	step("nobody: holding a silent connection");
	int rv = rv_connect(0, o->port);
	CHECK_EQ(write(to_srv, rv >= 0 ? "h" : "n", 1), 1);
	if (read(from_srv, &b, 1) < 0)
		TL_FAIL("read");
	if (rv >= 0)
		SYS(close(rv));
}

/* nobody: takes the listener's rendezvous name first; whatever connects
 * there must not hand it a hello or a descriptor. */
static void nb_squat(const struct orders *o, int to_srv, int from_srv)
{
	char b;
	step("nobody: squatting the rendezvous name");
	struct sockaddr_un un;
	socklen_t len = rv_name(&un, 0, o->port);
	int l = SYS(socket(AF_UNIX, SOCK_SEQPACKET | SOCK_NONBLOCK, 0));
	SYS(bind(l, (struct sockaddr *)&un, len));
	SYS(listen(l, 16));
	CHECK_EQ(write(to_srv, "q", 1), 1);
	CHECK_EQ(read(from_srv, &b, 1), 1);
	step("nobody: what came to the squatted name");
	int s;
	while ((s = accept4(l, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
		char buf[128];
		union { struct cmsghdr c; char b[CMSG_SPACE(4 * sizeof(int))]; } u;
		struct iovec iov = { buf, sizeof buf };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
				    .msg_control = u.b, .msg_controllen = sizeof u.b };
		ssize_t n = recvmsg(s, &m, MSG_DONTWAIT);
		CHECK(n <= 0 && m.msg_controllen == 0, "the squatter received "
		      "%zd bytes, %zu bytes of control (a hello%s)", n,
		      (size_t)m.msg_controllen, m.msg_controllen ?
		      " with a descriptor" : "");
		SYS(close(s));
	}
	CHECK(errno == EAGAIN);
	SYS(close(l));
}

static void send_orders(int to, const struct orders *o)
{
	CHECK_EQ(write(to, o, sizeof *o), (ssize_t)sizeof *o);
}

static void expect_byte(int from, char want)
{
	char b = 0;
	CHECK_EQ(read(from, &b, 1), 1);
	CHECK(b == want, "nobody said '%c'", b);
}

/* The server's connection memory: descriptors and mappings, for nobody. */
static void collect(struct orders *o)
{
	DIR *d = opendir("/proc/self/fd");
	CHECK(d != NULL);
	struct dirent *e;
	char path[300], tgt[256];
	while ((e = readdir(d)) && o->nfd < 32) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(path, tgt, sizeof tgt - 1);
		if (n > 0 && (tgt[n] = 0, strncmp(tgt, "/memfd:", 7) == 0))
			o->fds[o->nfd++] = atoi(e->d_name);
	}
	closedir(d);
	FILE *f = fopen("/proc/self/maps", "re");
	CHECK(f != NULL);
	char line[600];
	while (fgets(line, sizeof line, f) && o->nmap < 8)
		if (strstr(line, "/memfd:sdp-conn") &&
		    sscanf(line, "%lx-%lx", &o->map_lo[o->nmap],
			   &o->map_hi[o->nmap]) == 2)
			o->nmap++;
	fclose(f);
}

static void c_nobody_hello(void)
{
	int to, from;
	pid_t nb = spawn_nobody(nb_hello, &to, &from);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	/* Something to look for: a pending hello of ours (its memory is a
	 * descriptor of the server) and a live SDP connection (mapped). */
	send_forged(geteuid(), port, 1999, 92, R_GOOD);
	int c0 = tl_connect(AF_INET, port);
	int s0 = SYS(accept(l, NULL, NULL));
	expect_transport(s0);
	struct orders o = { .port = port, .server = (int32_t)getpid() };
	collect(&o);
	CHECK(o.nfd >= 1 && o.nmap >= 2, "%d memfd descriptors, %d mappings",
	      o.nfd, o.nmap);
	send_orders(to, &o);
	expect_byte(from, 'c');
	step("accepting nobody's connection");
	int s = SYS(accept(l, NULL, NULL));
	CHECK(transport_of(s) == 0, "the server took SDP from user nobody "
	      "(SDP_TRANSPORT %d)", transport_of(s));
	tl_recv_pat(s, 0, NBYTES, 31, 65536);
	tl_send_pat(s, 0, NBYTES, 32, 65536);
	CHECK_EQ(write(to, "d", 1), 1);
	wait_ok(nb, "nobody");
	SYS(close(s));
	SYS(close(c0));
	SYS(close(s0));
	sdp_client_ok(l, port, 33);
	SYS(close(l));
}

static void c_nobody_two_fds(void)
{
	int to, from;
	pid_t nb = spawn_nobody(nb_two_fds, &to, &from);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	sdp_client_ok(l, port, 0);            /* creates the region arena */
	int before = count_fds();
	struct orders o = { .port = port, .server = (int32_t)getpid() };
	send_orders(to, &o);
	expect_byte(from, 's');
	wait_ok(nb, "nobody");
	sdp_client_ok(l, port, 34);
	int grew = count_fds() - before;
	CHECK(grew == 0, "%d hellos of user nobody with two descriptors each "
	      "left %d descriptors open in the listening process", NB_TWO, grew);
	SYS(close(l));
}

static void c_nobody_silent(void)
{
	int to, from;
	pid_t nb = spawn_nobody(nb_silent, &to, &from);
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	struct orders o = { .port = port, .server = (int32_t)getpid() };
	send_orders(to, &o);
	expect_byte(from, 'h');
	sdp_client_ok(l, port, 35);           /* while nobody holds on */
	int raw;
	uint16_t rport;
	raw = raw_bound(&rport);
	plain_client_ok(l, raw, port, 36);
	CHECK_EQ(write(to, "d", 1), 1);
	wait_ok(nb, "nobody");
	SYS(close(l));
}

static void c_nobody_squat(void)
{
	int to, from;
	pid_t nb = spawn_nobody(nb_squat, &to, &from);
	/* The port first, the listen (and its rendezvous) after the squat. */
	int l = SYS(socket(AF_INET, SOCK_STREAM, 0));
	struct sockaddr_storage ss;
	socklen_t len = tl_addr(AF_INET, 0, &ss);
	SYS(bind(l, (struct sockaddr *)&ss, len));
	uint16_t port = tl_port_of(l);
	struct orders o = { .port = port, .server = (int32_t)getpid() };
	send_orders(to, &o);
	expect_byte(from, 'q');
	SYS(listen(l, 16));
	step("a client of a listener whose name was squatted");
	int c = tl_connect(AF_INET, port);
	int s = SYS(accept(l, NULL, NULL));
	CHECK(transport_of(c) == 0 && transport_of(s) == 0,
	      "SDP through a rendezvous name owned by another user "
	      "(client %d, server %d)", transport_of(c), transport_of(s));
	tl_send_pat(c, 0, NBYTES, 37, 16384);
	tl_recv_pat(s, 0, NBYTES, 37, 65536);
	tl_send_pat(s, 0, NBYTES, 38, 65536);
	tl_recv_pat(c, 0, NBYTES, 38, 7000);
	SYS(close(c));
	SYS(close(s));
	CHECK_EQ(write(to, "d", 1), 1);
	wait_ok(nb, "nobody");
	SYS(close(l));
}

/* ---- the cases ------------------------------------------------------------ */

struct hcase {
	const char *name;
	void (*hostile)(struct hctx *x);
	void (*other_user)(void);     /* instead: a case with user nobody */
};

static const struct hcase cases[] = {
	{ "none",            h_none,          NULL },
	{ "connect-close",   h_connect_close, NULL },
	{ "silent",          h_silent,        NULL },
	{ "short",           h_short,         NULL },
	{ "oversized",       h_oversized,     NULL },
	{ "bad-magic",       h_bad_magic,     NULL },
	{ "bad-version",     h_bad_version,   NULL },
	{ "no-fd",           h_no_fd,         NULL },
	{ "pipe-fd",         h_pipe,          NULL },
	{ "memfd-small",     h_small,         NULL },
	{ "memfd-unsealed",  h_unsealed,      NULL },
	{ "memfd-bad-head",  h_region_magic,  NULL },
	{ "token-mismatch",  h_token,         NULL },
	{ "two-fds",         h_two_fds,       NULL },
	{ "many-fds",        h_many_fds,      NULL },
	{ "never-connects",  h_never,         NULL },
	{ "flood",           h_flood,         NULL },
	{ "pooled-past-end", h_pooled_past_end, NULL },
	{ "pooled-no-room",  h_pooled_no_room, NULL },
	{ "bad-flags",       h_bad_flags,     NULL },
	{ "bad-offer",       h_bad_offer,     NULL },
	{ "returned-forged", h_returned_forged, NULL },
	{ "forged",          h_forged,        NULL },
	{ "pooled-forged",   h_pooled_forged, NULL },
	{ "nobody-hello",    NULL,            c_nobody_hello },
	{ "nobody-two-fds",  NULL,            c_nobody_two_fds },
	{ "nobody-silent",   NULL,            c_nobody_silent },
	{ "nobody-squat",    NULL,            c_nobody_squat },
};
#define NCASES (int)(sizeof cases / sizeof cases[0])

static void run_case(const struct hcase *hc)
{
	g_case = hc->name;
	child_watchdog(2500);
	if (hc->other_user) {
		hc->other_user();
		_exit(0);
	}
	struct hctx x = { 0 };
	x.l = tl_listen(AF_INET, &x.port);
	CHECK(rv_listed(geteuid(), x.port), "no rendezvous @sdp1.%u.%u.%u."
	      "7f000001 for the listener", (unsigned)geteuid(),
	      (unsigned)AF_INET, x.port);
	/* The first SDP connection of a process creates its region arena
	 * (one descriptor for the process's life): not a per-hello cost. */
	sdp_client_ok(x.l, x.port, 0);
	int before = count_fds();
	x.raw = raw_bound(&x.rport);
	step("hostile act");
	hc->hostile(&x);
	sdp_client_ok(x.l, x.port, 1);
	sdp_client_ok(x.l, x.port, 3);
	if (x.forged)
		forged_ok(&x);
	else if (x.reset)
		plain_client_reset(x.l, x.raw, x.port);
	else
		plain_client_ok(x.l, x.raw, x.port, 5);
	for (int i = 0; i < x.nheld; i++)
		SYS(close(x.held[i]));
	sdp_client_ok(x.l, x.port, 7);
	int grew = count_fds() - before;
	CHECK(grew <= x.keep, "the listening process holds %d more "
	      "descriptors than before (at most %d pending hellos allowed)",
	      grew, x.keep);
	SYS(close(x.l));
	_exit(0);
}

/* Kernel TCP: no rendezvous, and the clients are served. */
static void tcp_mode(void)
{
	uint16_t port;
	int l = tl_listen(AF_INET, &port);
	CHECK(!rv_listed(geteuid(), port), "a rendezvous exists without SDP");
	CHECK(rv_connect(geteuid(), port) < 0 && errno == ECONNREFUSED);
	sdp_client_ok(l, port, 1);
	uint16_t rport;
	int raw = raw_bound(&rport);
	plain_client_ok(l, raw, port, 3);
	SYS(close(l));
}

int main(void)
{
	tl_watchdog(50);
	signal(SIGPIPE, SIG_IGN);
	if (!tl_sdp_mode()) {
		tcp_mode();
		printf("kernel TCP: no rendezvous to attack; clients served\n");
		return 0;
	}
	int failed = 0, total = 0;
	bool root = geteuid() == 0;
	const char *only = getenv("T_CASE");
	for (int i = 0; i < NCASES; i++) {
		if (only && strcmp(only, cases[i].name))
			continue;
		if (cases[i].other_user && !root) {
			fprintf(stderr, "case %s skipped: needs root to switch "
				"users\n", cases[i].name);
			continue;
		}
		fflush(NULL);
		pid_t pid = SYS(fork());
		if (pid == 0)
			run_case(&cases[i]);
		int st;
		pid_t w;
		do
			w = waitpid(pid, &st, 0);
		while (w < 0 && errno == EINTR);
		CHECK_EQ(w, pid);
		total++;
		const char *what = NULL;
		char sig[64];
		if (WIFSIGNALED(st)) {
			snprintf(sig, sizeof sig, "CRASH: killed by signal %d (%s)",
				 WTERMSIG(st), strsignal(WTERMSIG(st)));
			what = sig;
		} else if (WEXITSTATUS(st) == 3) {
			what = "HANG";
		} else if (WEXITSTATUS(st) != 0) {
			what = "FAIL";
		}
		if (what) {
			failed++;
			fprintf(stderr, "  -> case %-15s %s\n", cases[i].name, what);
		}
	}
	printf("%d of %d cases passed\n", total - failed, total);
	if (failed)
		fprintf(stderr, "%d of %d cases failed\n", failed, total);
	return failed ? 1 : 0;
}
