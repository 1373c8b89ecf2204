/*
 * The two ways pages in flight are protected: userfaultfd write-protect
 * and mprotect, forced each (SDP_AZ_PROTECT), chosen by measurement
 * (auto), and auto where userfaultfd is refused (an unprivileged process:
 * vm.unprivileged_userfaultfd is 0) - then mprotect serves. With each, the
 * kernel writing into a buffer still in flight for the application (read
 * from a pipe, pread from a file, recv from a plain TCP socket) and the
 * application writing it at once must leave the receiver with the bytes as
 * sent and the buffer with the new ones. sdp mode: the sends were
 * asynchronous and faulted; a userfaultfd is open exactly when it is the
 * mechanism in use.
 */
#include "azlib.h"
#include <dirent.h>
#include <grp.h>
#include <sys/prctl.h>

#define ROUNDS 12

static bool have_uffd(void)
{
	DIR *d = opendir("/proc/self/fd");
	struct dirent *e;
	bool found = false;
	while (d && (e = readdir(d))) {
		char p[300], t[128];
		snprintf(p, sizeof p, "/proc/self/fd/%s", e->d_name);
		ssize_t n = readlink(p, t, sizeof t - 1);
		if (n > 0) {
			t[n] = 0;
			found |= strstr(t, "userfaultfd") != NULL;
		}
	}
	if (d)
		closedir(d);
	return found;
}

static void rx(int s, void *arg)
{
	(void)arg;
	uint8_t *r = az_buf(MiB, 0);
	for (uint64_t k = 0; k < 3 * ROUNDS; k++)
		az_recv_round(s, r, MiB, k);
}

static int scenario(const char *how)
{
	if (!strcmp(how, "nonroot") && geteuid() == 0) {
		/* become an unprivileged user (who may still debug itself:
		 * Cross Memory Attach between its processes) */
		CHECK_EQ(setgroups(0, NULL), 0);
		CHECK_EQ(setresgid(65534, 65534, 65534), 0);
		CHECK_EQ(setresuid(65534, 65534, 65534), 0);
		CHECK_EQ(prctl(PR_SET_DUMPABLE, 1, 0, 0, 0), 0);
	}
	char tmpl[] = "/tmp/t_az_mech.XXXXXX";
	int file = mkstemp(tmpl);
	CHECK(file >= 0);
	unlink(tmpl);
	uint8_t *junk = az_buf(MiB, 0);
	memset(junk, 0x5A, MiB);
	CHECK_EQ(write(file, junk, MiB), (ssize_t)MiB);
	int pp[2];
	CHECK_EQ(pipe(pp), 0);
	int tc, ts;                               /* a plain TCP pair */
	uint16_t port;
	int l = socket(AF_INET, SOCK_STREAM, 0);
	struct sockaddr_storage ss;
	socklen_t sl = tl_addr(AF_INET, 0, &ss);
	CHECK_EQ(bind(l, (struct sockaddr *)&ss, sl), 0);
	CHECK_EQ(listen(l, 1), 0);
	port = tl_port_of(l);
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	tc = tl_connect(AF_INET, port);
	ts = accept(l, NULL, NULL);
	CHECK(ts >= 0);
	uint8_t *b = az_buf(MiB, 0);
	uint64_t k = 0;
	for (int i = 0; i < ROUNDS; i++) {
		/* the kernel writes the buffer: read(2) from a pipe */
		az_fill(b, MiB, k++);
		tl_send_all(c, b, MiB);
		CHECK_EQ(write(pp[1], junk, 4096), 4096);
		CHECK_EQ(read(pp[0], b + 3 * 4096, 4096), 4096);
		CHECK(b[3 * 4096] == 0x5A);
		/* pread(2) from a file */
		az_fill(b, MiB, k++);
		tl_send_all(c, b, MiB);
		CHECK_EQ(pread(file, b, MiB, 0), (ssize_t)MiB);
		CHECK(b[MiB - 1] == 0x5A);
		/* recv(2) from a plain TCP socket, then the application */
		az_fill(b, MiB, k++);
		tl_send_all(c, b, MiB);
		CHECK_EQ(send(ts, junk, 8192, 0), 8192);
		tl_recv_all(tc, b + 5000, 8192);
		CHECK(b[5000] == 0x5A);
		memset(b, 0xEE, MiB);
	}
	az_reap(pid, "receiver");
	if (tl_sdp_mode()) {
		struct azst a = az_get(c);
		CHECK(a.tx >= (uint64_t)ROUNDS * 3 * (MiB - 8192), "not asynchronous: %llu",
		      (unsigned long long)a.tx);
		CHECK(a.faults > 0);
		bool u = have_uffd();
		if (!strcmp(how, "uffd"))
			CHECK(u, "no userfaultfd open");
		if (!strcmp(how, "mprotect") || !strcmp(how, "nonroot"))
			CHECK(!u, "a userfaultfd is open");
	}
	close(c);
	close(tc);
	close(ts);
	close(l);
	close(file);
	close(pp[0]);
	close(pp[1]);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario(argv[2]);
	tl_watchdog(120);
	static const char *hows[] = { "uffd", "mprotect", "auto", "nonroot" };
	for (int f = 0; f < 2; f++)
		for (int i = 0; i < 4; i++) {
			char p[64];
			snprintf(p, sizeof p, "SDP_AZ_PROTECT=%s",
				 !strcmp(hows[i], "nonroot") ? "auto" : hows[i]);
			const char *env[] = { p, "SDP_AZ_COOL=0", f ? "SDP_AZ_FAULT=copy" :
					      "SDP_AZ_FAULT=block", NULL };
			const char *args[] = { hows[i], NULL };
			int st = az_run(argv, env, args);
			CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: status 0x%x", hows[i], st);
		}
	return 0;
}
