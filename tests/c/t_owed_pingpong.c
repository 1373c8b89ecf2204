/*
 * A request/response exchange over blocking sockets sends no owed tokens.
 *
 * The client sends a request and sleeps in recv at once (the harness turns
 * spinning off under SDP), so it goes to sleep before the server, woken by
 * the request's kick, has read it. The server's arm was taken by that
 * kick: it is awake and looks before it arms again (or arms, finds the
 * request and withdraws the arm, which undoes its count), so it is owed
 * nothing. The library used to send it a token anyway (a TCP send, and a
 * drain on the server) whenever the server was "not armed" with data
 * unread: from one to several hundred in 2,000 rounds. Every answer is
 * checked.
 */
#include "testlib.h"

#define ROUNDS 2000

int main(void)
{
	tl_watchdog(60);
	uint16_t port;
	int l;
	pid_t pid = tl_fork_listener(&port, &l);
	if (pid == 0) {
		int c = SYS(accept(l, NULL, NULL));
		close(l);
		uint64_t v;
		for (;;) {
			ssize_t r = recv(c, &v, sizeof v, MSG_WAITALL);
			CHECK(r >= 0, "server: recv");
			if (r == 0)
				break;
			CHECK(r == sizeof v, "server: short request");
			v = ~v;
			tl_send_all(c, &v, sizeof v);
		}
		close(c);
		fflush(NULL);
		_exit(0);
	}
	int fd = tl_connect(AF_INET, port);
	expect_transport(fd);
	for (uint64_t i = 0; i < ROUNDS; i++) {
		uint64_t q = 0x0123456789abcdefull ^ (i * 0x9e3779b97f4a7c15ull), a = 0;
		tl_send_all(fd, &q, sizeof q);
		tl_recv_all(fd, &a, sizeof a);
		CHECK(a == ~q, "answer %llu wrong", (unsigned long long)i);
	}
	struct sdp_sock_stats st;
	if (tl_stats(fd, &st)) {
		printf("t_owed_pingpong: %d rounds, %llu owed tokens, %llu wake-up tokens\n",
		       ROUNDS, (unsigned long long)st.tokens_owed,
		       (unsigned long long)st.doorbells_tx);
		CHECK(st.tokens_owed == 0,
		      "%llu owed tokens in %d rounds", (unsigned long long)st.tokens_owed, ROUNDS);
	}
	SYS(close(fd));
	tl_wait_ok(pid);
	return 0;
}
