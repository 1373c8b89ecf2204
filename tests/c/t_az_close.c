/*
 * close(), shutdown() and exit with data in flight. A closed TCP socket
 * still delivers what it had to send; so must a connection whose last
 * send()s were asynchronous and not read yet: the sender advertises 1 MiB
 * in four sends (the receiver not reading), then closes the socket -
 * close() returns at once - writes and frees its buffers; the receiver
 * then reads it all and EOF. The same after shutdown(SHUT_WR) (the sender then reads the
 * receiver's answer), and when the sender exits right after its sends (its
 * exit waits until the peer has read them). Both fault policies.
 */
#include "azlib.h"

#define N 4
#define SZ (MiB / 4)        /* all of it fits kernel TCP's buffers too */

static void rx(int s, void *arg)
{
	const char *how = arg;
	uint8_t *r = az_buf(MiB, 0);
	if (strcmp(how, "exit"))
		az_gate_wait(0);
	for (uint64_t k = 0; k < N; k++)
		az_recv_round(s, r, SZ, k);
	char x;
	CHECK_EQ(recv(s, &x, 1, 0), 0);           /* EOF after the last byte */
	if (!strcmp(how, "shutdown")) {
		char ok = 'k';
		tl_send_all(s, &ok, 1);
	}
}

/* The sender exits right after its sends: here it is the child. */
static int at_exit(void)
{
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		close(s);
		uint8_t *b = az_buf(SZ, 0);
		for (int k = 0; k < N; k++) {
			az_fill(b, SZ, (uint64_t)k);
			tl_send_all(c, b, SZ);
		}
		exit(0);
	}
	close(c);
	rx(s, (void *)"exit");
	az_reap(pid, "sender");
	return 0;
}

static int scenario(const char *how)
{
	if (!strcmp(how, "exit"))
		return at_exit();
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx, (void *)how, &pid);
	uint8_t *b[N];
	for (int k = 0; k < N; k++) {
		b[k] = malloc(SZ);
		CHECK(b[k] != NULL);
		az_fill(b[k], SZ, (uint64_t)k);
		tl_send_all(c, b[k], SZ);
	}
	if (!strcmp(how, "close"))
		CHECK_EQ(close(c), 0);
	else
		CHECK_EQ(shutdown(c, SHUT_WR), 0);
	for (int k = 0; k < N; k++) {
		memset(b[k], 0xEE, SZ);
		free(b[k]);
	}
	az_gate_pass(0);
	if (!strcmp(how, "shutdown")) {
		char ok;
		tl_recv_all(c, &ok, 1);
		CHECK_EQ(ok, 'k');
		close(c);
	}
	az_reap(pid, "receiver");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario(argv[2]);
	tl_watchdog(120);
	const char *names[] = { "close", "shutdown", "exit" };
	az_run_all(argv, names, 3, NULL);
	return 0;
}
