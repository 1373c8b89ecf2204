/*
 * The peer dies while asynchronous sends are in flight. The receiver is
 * killed with advertisements of ours unread: our buffers become writable
 * again without waiting for ever (nothing will read them), and the next
 * sends fail with EPIPE or ECONNRESET as TCP's do after the peer's reset.
 * The sender is killed after its sends returned but before the receiver
 * read them: the receiver gets, byte-exact, what it reads, and then EOF or
 * ECONNRESET - never other bytes. (Kernel TCP delivers the killed sender's
 * queued bytes, which live in the kernel; ours lived in the dead process.)
 * Both fault policies.
 */
#include "azlib.h"

#define SZ (MiB / 4)

static void idle_rx(int s, void *arg)
{
	(void)s;
	(void)arg;
	az_gate_wait(0);                          /* killed before */
}

static int receiver_dies(void)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(idle_rx, NULL, &pid);
	uint8_t *b = az_buf(SZ, 0);
	for (uint64_t k = 0; k < 4; k++) {
		az_fill(b, SZ, k);
		tl_send_all(c, b, SZ);
	}
	if (tl_sdp_mode())                        /* the AZ path, unread */
		CHECK(az_get(c).out > 0, "no advertisement outstanding");
	CHECK_EQ(kill(pid, SIGKILL), 0);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	memset(b, 0xEE, SZ);                      /* must not wait for ever */
	int err = 0;
	for (int i = 0; i < 100 && !err; i++)
		if (send(c, b, SZ, MSG_NOSIGNAL) < 0)
			err = errno;
	CHECK(err == EPIPE || err == ECONNRESET, "send after the peer died: %s",
	      strerror(err));
	if (tl_sdp_mode())
		CHECK_EQ(az_get(c).out, 0);
	close(c);
	return 0;
}

static int sender_dies(void)
{
	int c, s, ready[2];
	CHECK_EQ(pipe(ready), 0);
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(s);
		uint8_t *b = az_buf(SZ, 0);
		for (uint64_t k = 0; k < 4; k++) {
			az_fill(b, SZ, k);
			tl_send_all(c, b, SZ);
		}
		if (tl_sdp_mode())
			CHECK(az_get(c).out > 0, "no advertisement outstanding");
		char r = 'r';
		CHECK_EQ(write(ready[1], &r, 1), 1);
		pause();
		_exit(0);
	}
	close(c);
	char r;
	CHECK_EQ(read(ready[0], &r, 1), 1);
	CHECK_EQ(kill(pid, SIGKILL), 0);
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	uint8_t *rb = az_buf(SZ, 0);
	for (uint64_t k = 0; k < 4; k++) {
		size_t got = 0;
		while (got < SZ) {
			ssize_t n = recv(s, rb + got, SZ - got, 0);
			if (n <= 0) {
				CHECK(n == 0 || errno == ECONNRESET, "recv: %s", strerror(errno));
				close(s);
				return 0;             /* ended: what came was right */
			}
			got += (size_t)n;
			/* every byte that arrived is the stream's */
			uint8_t *ref = malloc(got);
			az_fill(ref, got, k);
			CHECK(memcmp(ref, rb, got) == 0, "round %llu: wrong bytes",
			      (unsigned long long)k);
			free(ref);
		}
	}
	char x;
	ssize_t n = recv(s, &x, 1, 0);
	CHECK(n == 0 || (n < 0 && errno == ECONNRESET));
	close(s);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return !strcmp(argv[2], "receiver") ? receiver_dies() : sender_dies();
	tl_watchdog(120);
	const char *names[] = { "receiver", "sender" };
	az_run_all(argv, names, 2, NULL);
	return 0;
}
