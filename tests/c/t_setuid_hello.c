/*
 * A client whose real and effective uids differ (a set-uid program, a
 * daemon that changed only its effective uid) connects to a server of its
 * effective uid (root only). The names, the client's check of the
 * listener and the server's check of the hello all go by the effective
 * uid, as on kernel TCP nothing depends on uids at all: the connection
 * must be SDP and carry the bytes exactly, both ways. (The credentials the
 * kernel attaches to a hello name the real uid: the server must then ask
 * SO_PEERCRED, not drop the hello of a client committed to SDP.)
 */
#include "testlib.h"
#include <grp.h>

#define NOBODY 65534
#define BYTES (256 * 1024)

/* Server in a process of its own, as uid `as` (all three uids). */
static void serve(int l, int seed)
{
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	tl_recv_pat(s, 0, BYTES, (uint32_t)seed, 65536);
	tl_send_pat(s, 0, BYTES, (uint32_t)seed + 1, 65536);
	char x;
	CHECK_EQ(recv(s, &x, 1, 0), 0);
	SYS(close(s));
}

static void one(uid_t server_uid, uid_t client_ruid, uid_t client_euid, int seed)
{
	uint16_t port;
	int l;
	int p[2];
	SYS(pipe(p));
	fflush(NULL);
	pid_t pid = tl_fork();
	if (pid == 0) {
		close(p[0]);
		if (server_uid) {
			SYS(setgroups(0, NULL));
			SYS(setresgid(NOBODY, NOBODY, NOBODY));
			SYS(setresuid(server_uid, server_uid, server_uid));
		}
		l = tl_listen(AF_INET, &port);
		CHECK_EQ(write(p[1], &port, sizeof port), sizeof port);
		serve(l, seed);
		_exit(0);
	}
	close(p[1]);
	CHECK_EQ(read(p[0], &port, sizeof port), sizeof port);
	close(p[0]);
	pid_t cpid = tl_fork();
	if (cpid == 0) {
		/* saved uid 0 where the effective one is not: allowed */
		SYS(setresuid(client_ruid, client_euid, 0));
		CHECK_EQ(getuid(), client_ruid);
		CHECK_EQ(geteuid(), client_euid);
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		tl_send_pat(c, 0, BYTES, (uint32_t)seed, 65536);
		tl_recv_pat(c, 0, BYTES, (uint32_t)seed + 1, 65536);
		SYS(close(c));
		_exit(0);
	}
	tl_wait_ok(cpid);
	tl_wait_ok(pid);
}

/* Real uid nobody, effective root; the server root. */
static void case_real_nobody(void) { one(0, NOBODY, 0, 31); }

/* Real uid root, effective nobody; the server nobody. */
static void case_effective_nobody(void) { one(NOBODY, 0, NOBODY, 41); }

int main(void)
{
	tl_watchdog(30);
	if (geteuid() != 0) {
		printf("skip: needs root to change uids\n");
		return 77;
	}
	static const struct tl_case cases[] = {
		{ "real nobody, effective root", case_real_nobody },
		{ "real root, effective nobody", case_effective_nobody },
	};
	return tl_run_cases(cases, sizeof cases / sizeof cases[0]);
}
