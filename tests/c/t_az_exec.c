/*
 * exec() with asynchronous sends still unread. The new image has none of
 * the old one's memory, so what the peer still had to read of it must be
 * read first: the sender advertises 1 MiB in four sends, lets the receiver
 * start reading and execs at once. With the socket inherited (the
 * connection goes on as plain TCP in the new image, which sends four more
 * rounds and reads the receiver's answer) and with it close-on-exec (the
 * kernel closes it at the exec: the receiver reads everything, then EOF).
 * Every byte arrives once, in order. Both fault policies.
 */
#include "azlib.h"

#define SZ (MiB / 4)

static void rx(int s, void *arg)
{
	const char *how = arg;
	uint8_t *r = az_buf(SZ, 0);
	az_gate_pass(1);                          /* our copy of the sender's end is closed */
	az_gate_wait(0);
	uint64_t n = !strcmp(how, "inherit") ? 8 : 4;
	for (uint64_t k = 0; k < n; k++)
		az_recv_round(s, r, SZ, k);
	if (!strcmp(how, "inherit")) {
		char ok = 'k';
		tl_send_all(s, &ok, 1);
	}
	char x;
	CHECK_EQ(recv(s, &x, 1, 0), 0);
}

/* The new image. */
static int after(const char *how, int c, pid_t pid)
{
	if (!strcmp(how, "inherit")) {
		uint8_t *b = az_buf(SZ, 0);
		for (uint64_t k = 4; k < 8; k++) {
			az_fill(b, SZ, k);
			tl_send_all(c, b, SZ);
		}
		char ok;
		tl_recv_all(c, &ok, 1);
		CHECK_EQ(ok, 'k');
		close(c);
	}
	az_reap(pid, "receiver");
	return 0;
}

static int scenario(char **argv0, const char *how)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx, (void *)how, &pid);
	if (!strcmp(how, "cloexec"))
		CHECK_EQ(fcntl(c, F_SETFD, FD_CLOEXEC), 0);
	uint8_t *b = az_buf(SZ, 0);
	for (uint64_t k = 0; k < 4; k++) {
		az_fill(b, SZ, k);
		tl_send_all(c, b, SZ);
	}
	memset(b, 0xEE, SZ);
	/* The exec must find the connection ours alone (the receiver's
	 * process closed its inherited copy), as the scenario says. */
	az_gate_wait(1);
	az_gate_pass(0);
	char fd[16], p[16];
	snprintf(fd, sizeof fd, "%d", c);
	snprintf(p, sizeof p, "%d", (int)pid);
	execl("/proc/self/exe", argv0[0], "--after", how, fd, p, (char *)NULL);
	TL_FAIL("exec");
	return 1;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "--after"))
		return after(argv[2], atoi(argv[3]), (pid_t)atoi(argv[4]));
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario(argv, argv[2]);
	tl_watchdog(120);
	const char *names[] = { "inherit", "cloexec" };
	az_run_all(argv, names, 2, NULL);
	return 0;
}
