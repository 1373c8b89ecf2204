/*
 * fork() while pages are in flight. The sender advertises a buffer (the
 * receiver not reading yet), forks; the child writes its copy of the
 * buffer at once - freely: what the peer reads is the parent's - sends a
 * buffer of its own on the shared connection and exits normally (its
 * exit waits for the peer to read what it advertised). The parent then
 * writes its buffer too. The receiver must get the parent's bytes as sent,
 * then the child's. On the receiving side, a recv() that returned before
 * its copy (asynchronous receive) followed by fork(): parent and child both
 * find the bytes in the buffer. Both fault policies.
 */
#include "azlib.h"

static void rx(int s, void *arg)
{
	(void)arg;
	uint8_t *r = az_buf(MiB, 100);
	az_gate_wait(0);
	az_recv_round(s, r, MiB, 0);           /* the parent's */
	az_recv_round(s, r, MiB, 1);           /* the child's */
	az_recv_round(s, r, MiB, 2);
	/* receive asynchronously (the data is there), then fork at once */
	struct pollfd p = { s, POLLIN, 0 };
	CHECK_EQ(poll(&p, 1, 10000), 1);
	tl_recv_all(s, r, MiB);
	pid_t k = fork();
	CHECK(k >= 0);
	long bad = az_check(r, MiB, 3);
	CHECK(bad < 0, "%s: byte %ld after fork", k ? "parent" : "child", bad);
	if (k == 0)
		_exit(0);
	az_reap(k, "receiving child");
	char ok = 'k';
	tl_send_all(s, &ok, 1);
}

static int scenario(void)
{
	az_gates_open();
	int done[2];
	CHECK_EQ(pipe(done), 0);
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	uint8_t *b = az_buf(MiB, 0);
	az_fill(b, MiB, 0);
	tl_send_all(c, b, MiB);
	pid_t k = fork();
	CHECK(k >= 0);
	if (k == 0) {
		memset(b, 0xCC, MiB);             /* its own copy */
		CHECK_EQ(b[777], 0xCC);
		uint8_t *mine = az_buf(MiB, 0);
		az_fill(mine, MiB, 1);
		tl_send_all(c, mine, MiB);
		memset(mine, 0xDD, MiB);
		char d = 'd';
		CHECK_EQ(write(done[1], &d, 1), 1);
		exit(0);                          /* waits until it was read */
	}
	char d;
	CHECK_EQ(read(done[0], &d, 1), 1);
	memset(b, 0xEE, MiB);                     /* ours, still in flight */
	az_gate_pass(0);
	az_reap(k, "sending child");
	az_fill(b, MiB, 2);
	tl_send_all(c, b, MiB);
	az_fill(b, MiB, 3);
	tl_send_all(c, b, MiB);
	char ok;
	tl_recv_all(c, &ok, 1);
	az_reap(pid, "receiver");
	if (tl_sdp_mode())
		CHECK(az_get(c).tx > 0, "not asynchronous");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	return az_main_one(argc, argv, scenario, 1);
}
