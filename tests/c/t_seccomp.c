/*
 * A process that sandboxes itself with seccomp keeps its connections.
 *
 * A child shares a connection with its parent (as sshd's sandboxed
 * pre-authentication child shares the client's connection with its
 * monitor), installs a filter that kills it on any system call but read,
 * write, poll and exit, and then still exchanges data on the socket, with
 * bytes queued before the filter delivered too. The filter comes through
 * prctl(PR_SET_SECCOMP), the seccomp(2) system call through syscall(),
 * libseccomp, and strict mode (read, write and exit only). Before the
 * filter the connection was on SDP; afterwards the parent's copy of the
 * child's socket carries on, on plain TCP.
 *
 * "inherit": under a filter that kills memfd_create, sendto, sendmsg and
 * accept4 (calls such a program never makes itself), a process accepts on
 * a listener of its own with accept(), a child forked after the filter and
 * a new image exec'd under it connect to the parent; every connection
 * works (on TCP).
 */
#include "seccomplib.h"
#include <dlfcn.h>

#define SEED 97
#define PRE  5000              /* queued each way before the filter */
#define N    (1u << 20)
#define N2   (256u << 10)

/* In sdp mode the socket is a TCP connection the library left to the
 * kernel; kernel TCP does not know the option at all. */
static void expect_tcp(int fd)
{
	int v = -7;
	socklen_t len = sizeof v;
	errno = 0;
	int r = getsockopt(fd, SOL_TCP, SDP_TRANSPORT, &v, &len);
	if (tl_sdp_mode())
		CHECK(r == 0 && v == 0, "fd %d: SDP_TRANSPORT %d value %d", fd, r, v);
	else
		CHECK(r == -1 && errno == ENOPROTOOPT, "kernel TCP: %d", r);
}

/* ---- I/O of the sandboxed side: read, write, poll only ------------------- */

static void k_wait_in(int fd, bool use_poll)
{
	if (!use_poll)
		return;
	struct pollfd p = { .fd = fd, .events = POLLIN };
	int r;
	do
		r = poll(&p, 1, -1);
	while (r < 0 && errno == EINTR);
	CHECK(r == 1 && (p.revents & (POLLIN | POLLHUP)), "poll %d revents 0x%x", r, p.revents);
}

static void k_recv_pat(int fd, uint64_t off, size_t total, uint32_t seed, bool use_poll)
{
	static char buf[65536];
	while (total) {
		k_wait_in(fd, use_poll);
		ssize_t n = read(fd, buf, total < sizeof buf ? total : sizeof buf);
		if (n < 0 && errno == EINTR)
			continue;
		CHECK(n > 0, "read returned %zd with %zu bytes to go", n, total);
		CHECK_PAT(buf, (size_t)n, off, seed);
		off += (uint64_t)n;
		total -= (size_t)n;
	}
}

static void k_send_pat(int fd, uint64_t off, size_t total, uint32_t seed)
{
	static char buf[40000];
	while (total) {
		size_t n = total < sizeof buf ? total : sizeof buf;
		tl_fill(buf, n, off, seed);
		for (size_t done = 0; done < n;) {
			ssize_t w = write(fd, buf + done, n - done);
			if (w < 0 && errno == EINTR)
				continue;
			CHECK(w > 0, "write returned %zd", w);
			done += (size_t)w;
		}
		off += n;
		total -= n;
	}
}

/* ---- the filters --------------------------------------------------------- */

#define ALLOW(nr) { (nr), SECCOMP_RET_ALLOW }
#ifdef __NR_poll
#define ALLOW_POLL ALLOW(__NR_poll)           /* glibc's poll() is poll(2) here */
#else
#define ALLOW_POLL ALLOW(__NR_ppoll)
#endif
static const struct sc_rule io_only[] = {
	ALLOW(__NR_read), ALLOW(__NR_write), ALLOW_POLL,
	ALLOW(__NR_exit), ALLOW(__NR_exit_group), ALLOW(__NR_rt_sigreturn),
};

enum how { VIA_PRCTL, VIA_SYSCALL, VIA_LIBSECCOMP, VIA_STRICT };

/* libseccomp, as a program linked with it uses it (found at run time so
 * that building the tests needs no development package). */
static void install_libseccomp(void)
{
	void *h = dlopen("libseccomp.so.2", RTLD_NOW);
	CHECK(h != NULL, "libseccomp.so.2: %s (scripts/install-deps.sh installs it)", dlerror());
	void *(*init)(uint32_t) = (void *(*)(uint32_t))dlsym(h, "seccomp_init");
	int (*add)(void *, uint32_t, int, unsigned, ...) =
		(int (*)(void *, uint32_t, int, unsigned, ...))dlsym(h, "seccomp_rule_add");
	int (*load)(void *) = (int (*)(void *))dlsym(h, "seccomp_load");
	CHECK(init && add && load);
	void *ctx = init(0x80000000u);                /* SCMP_ACT_KILL_PROCESS */
	CHECK(ctx != NULL);
	/* What the allocator may do when libseccomp frees its work. */
	static const int mem[] = { __NR_brk, __NR_mmap, __NR_munmap, __NR_madvise,
				   __NR_mprotect };
	for (size_t i = 0; i < sizeof io_only / sizeof *io_only; i++)
		CHECK_EQ(add(ctx, 0x7fff0000u, io_only[i].nr, 0), 0);   /* SCMP_ACT_ALLOW */
	for (size_t i = 0; i < sizeof mem / sizeof *mem; i++)
		CHECK_EQ(add(ctx, 0x7fff0000u, mem[i], 0), 0);
	CHECK_EQ(load(ctx), 0);
}

static void sandbox(enum how how)
{
	static struct sc_filter f;
	switch (how) {
	case VIA_PRCTL:
		sc_build(&f, io_only, sizeof io_only / sizeof *io_only, SECCOMP_RET_KILL_PROCESS);
		sc_install_prctl(&f);
		break;
	case VIA_SYSCALL:
		sc_build(&f, io_only, sizeof io_only / sizeof *io_only, SECCOMP_RET_KILL_PROCESS);
		sc_install_syscall(&f);
		break;
	case VIA_LIBSECCOMP:
		install_libseccomp();
		break;
	case VIA_STRICT:
		SYS(prctl(PR_SET_SECCOMP, SECCOMP_MODE_STRICT, 0, 0, 0));
		break;
	}
}

static void sandboxed_peer(enum how how)
{
	int c, s;
	char b[4];
	tl_watchdog(10);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	tl_send_all(c, "ping", 4);
	tl_recv_all(s, b, 4);
	tl_send_all(s, "pong", 4);
	tl_recv_all(c, b, 4);
	CHECK(memcmp(b, "pong", 4) == 0);
	/* Queued and unread when the filter goes in, both directions. */
	tl_send_pat(c, 0, PRE, SEED, 4096);
	tl_send_pat(s, 0, PRE, SEED + 1, 4096);

	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(c));
		sandbox(how);
		bool use_poll = how != VIA_STRICT;   /* strict: read/write only */
		k_recv_pat(s, 0, PRE + N, SEED, use_poll);
		k_send_pat(s, 0, N, SEED + 2);
		if (how == VIA_STRICT)
			syscall(SYS_exit, 0);         /* not even exit_group */
		_exit(0);
	}
	/* We keep our copy of s, as sshd's monitor does. */
	tl_send_pat(c, PRE, N, SEED, 65536);
	tl_recv_pat(c, 0, PRE, SEED + 1, 65536);
	tl_recv_pat(c, 0, N, SEED + 2, 65536);
	tl_wait_ok(pid);
	/* The connection lives on, now on TCP for everyone. */
	tl_send_pat(c, 0, 70000, SEED + 3, 65536);
	tl_recv_pat(s, 0, 70000, SEED + 3, 65536);
	tl_send_pat(s, 0, 70000, SEED + 4, 65536);
	tl_recv_pat(c, 0, 70000, SEED + 4, 65536);
	expect_tcp(c);
	expect_tcp(s);
	SYS(shutdown(c, SHUT_WR));
	CHECK_EQ(recv(s, b, 1, 0), 0);
	SYS(close(c));
	SYS(close(s));
}

static void case_prctl(void) { sandboxed_peer(VIA_PRCTL); }
static void case_syscall(void) { sandboxed_peer(VIA_SYSCALL); }
static void case_libseccomp(void) { sandboxed_peer(VIA_LIBSECCOMP); }
static void case_strict(void) { sandboxed_peer(VIA_STRICT); }

/* ---- inherited filters ----------------------------------------------------- */

#define KILL(nr) { (nr), SECCOMP_RET_KILL_PROCESS }
static const struct sc_rule no_extras[] = {
	KILL(__NR_memfd_create), KILL(__NR_sendto), KILL(__NR_sendmsg), KILL(__NR_accept4),
};

/* A new image started under the filter: talks to the parent's listener. */
static int exec_child(uint16_t port)
{
	tl_watchdog(10);
	int fd = tl_connect(AF_INET, port);
	k_send_pat(fd, 0, N2, SEED + 14);
	k_recv_pat(fd, 0, N2, SEED + 15, true);
	SYS(close(fd));
	return 0;
}

static void case_inherit(void)
{
	uint16_t lport, kport;
	tl_watchdog(10);
	int l = tl_listen(AF_INET, &lport);
	int pp[2];
	SYS(pipe(pp));
	pid_t k = tl_fork();
	if (k == 0) {
		static struct sc_filter f;
		SYS(close(pp[0]));
		sc_build(&f, no_extras, sizeof no_extras / sizeof *no_extras, SECCOMP_RET_ALLOW);
		sc_install_prctl(&f);
		/* A listener of our own: accept() is what we call. */
		int kl = tl_listen(AF_INET, &kport);
		CHECK_EQ(write(pp[1], &kport, sizeof kport), (ssize_t)sizeof kport);
		int n = accept(kl, NULL, NULL);
		CHECK(n >= 0, "accept");
		k_recv_pat(n, 0, N2, SEED + 10, true);
		k_send_pat(n, 0, N2, SEED + 11);
		SYS(close(n));
		SYS(close(kl));
		/* A child forked after the filter. */
		pid_t g = tl_fork();
		if (g == 0) {
			int fd = tl_connect(AF_INET, lport);
			k_send_pat(fd, 0, N2, SEED + 12);
			k_recv_pat(fd, 0, N2, SEED + 13, true);
			_exit(0);
		}
		tl_wait_ok(g);
		/* A new image under the same filter. */
		char a[16];
		snprintf(a, sizeof a, "%u", lport);
		execl("/proc/self/exe", "t_seccomp", "exec-child", a, (char *)NULL);
		TL_FAIL("execl");
	}
	SYS(close(pp[1]));
	CHECK_EQ(read(pp[0], &kport, sizeof kport), (ssize_t)sizeof kport);
	SYS(close(pp[0]));
	int fd = tl_connect(AF_INET, kport);
	tl_send_pat(fd, 0, N2, SEED + 10, 65536);
	tl_recv_pat(fd, 0, N2, SEED + 11, 65536);
	expect_tcp(fd);                       /* a sandboxed listener: TCP */
	SYS(close(fd));
	for (uint32_t i = 0; i < 2; i++) {
		int a = SYS(accept(l, NULL, NULL));
		tl_recv_pat(a, 0, N2, SEED + 12 + 2 * i, 65536);
		tl_send_pat(a, 0, N2, SEED + 13 + 2 * i, 65536);
		expect_tcp(a);
		SYS(close(a));
	}
	tl_wait_ok(k);
	SYS(close(l));
}

int main(int argc, char **argv)
{
	if (argc == 3 && strcmp(argv[1], "exec-child") == 0)
		return exec_child((uint16_t)atoi(argv[2]));
	static const struct tl_case cases[] = {
		{ "prctl", case_prctl },
		{ "syscall", case_syscall },
		{ "libseccomp", case_libseccomp },
		{ "strict", case_strict },
		{ "inherit", case_inherit },
	};
	return tl_run_cases(cases, sizeof cases / sizeof *cases);
}
