/*
 * A shared listener's accepts when hellos and SYNs come in different
 * orders. The parent holds the listening socket (as nginx's master does)
 * while a child accepts, so every hello the child reads for another
 * connection must be given back for the group. NCONN clients connect
 * before the child accepts any: the first client's hello is queued first
 * but its SYN only after the second connection's (the library's test gate,
 * SDP_TEST_HELLO_GATE, holds it between the two), then the rest in order.
 *
 * The accept of connection 2 reads hello 1 and gives it back; the accept
 * of connection 1 must then find it without reading - and giving back -
 * the ~NCONN hellos queued behind it. Checked through each accepted
 * connection's accept_hellos_read / accept_hellos_back (SDP_STATS): at
 * most NCONN + 10 read and 5 given back in all (reading round the whole
 * queue costs about 2 * NCONN and NCONN). Every connection carries its
 * number both ways.
 */
#include <pthread.h>

#include "testlib.h"

#define NCONN  100
#define GATE_W 500                     /* the library writes here: hello 1 queued */
#define GATE_R 501                     /* and waits for a byte here */

static uint16_t port;
static int cfd[NCONN];

static void *first(void *arg)
{
	(void)arg;
	cfd[0] = tl_connect(AF_INET, port);   /* held by the gate (SDP) */
	return NULL;
}

static void serve(int l, int start, int report)
{
	char b;
	CHECK_EQ(read(start, &b, 1), 1);
	uint64_t sum[2] = { 0, 0 };
	int seen[NCONN] = { 0 }, s[NCONN];
	for (int i = 0; i < NCONN; i++) {
		s[i] = SYS(accept(l, NULL, NULL));
		expect_transport(s[i]);
		struct sdp_sock_stats st;
		if (tl_stats(s[i], &st)) {
			CHECK(st.accept_hellos_read >= 1, "accept read no hello");
			sum[0] += st.accept_hellos_read;
			sum[1] += st.accept_hellos_back;
		}
	}
	for (int i = 0; i < NCONN; i++) {
		uint32_t id;
		CHECK_EQ(recv(s[i], &id, sizeof id, MSG_WAITALL), (ssize_t)sizeof id);
		CHECK(id < NCONN && !seen[id], "connection number %u", id);
		seen[id] = 1;
		id = ~id;
		CHECK_EQ(send(s[i], &id, sizeof id, 0), (ssize_t)sizeof id);
		CHECK_EQ(recv(s[i], &b, 1, 0), 0);
		SYS(close(s[i]));
	}
	CHECK_EQ(write(report, sum, sizeof sum), (ssize_t)sizeof sum);
}

int main(void)
{
	tl_watchdog(30);
	int sdp = tl_sdp_mode();
	int gw[2], gr[2], st[2], rp[2];
	SYS(pipe(gw));
	SYS(pipe(gr));
	SYS(pipe(st));
	SYS(pipe(rp));
	SYS(dup2(gw[1], GATE_W));
	SYS(dup2(gr[0], GATE_R));

	struct sockaddr_in a = { .sin_family = AF_INET,
				 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
	int l = SYS(socket(AF_INET, SOCK_STREAM, 0));
	SYS(bind(l, (struct sockaddr *)&a, sizeof a));
	SYS(listen(l, 2 * NCONN));
	port = tl_port_of(l);

	pid_t srv = tl_fork();
	if (srv == 0) {
		serve(l, st[0], rp[1]);
		_exit(0);
	}
	/* We keep l open: the listener is shared by two processes. */
	pthread_t t;
	CHECK_EQ(pthread_create(&t, NULL, first, NULL), 0);
	char b;
	if (sdp)
		CHECK_EQ(read(gw[0], &b, 1), 1);   /* hello 1 is queued */
	else
		CHECK_EQ(pthread_join(t, NULL), 0);
	cfd[1] = tl_connect(AF_INET, port);     /* hello 2, SYN 2 */
	if (sdp) {
		CHECK_EQ(write(gr[1], "g", 1), 1);  /* now SYN 1 */
		CHECK_EQ(pthread_join(t, NULL), 0);
	}
	for (int i = 2; i < NCONN; i++)
		cfd[i] = tl_connect(AF_INET, port);
	CHECK_EQ(write(st[1], "s", 1), 1);

	for (uint32_t i = 0; i < NCONN; i++) {
		expect_transport(cfd[i]);
		CHECK_EQ(send(cfd[i], &i, sizeof i, 0), (ssize_t)sizeof i);
		SYS(shutdown(cfd[i], SHUT_WR));
	}
	for (uint32_t i = 0; i < NCONN; i++) {
		uint32_t back;
		CHECK_EQ(recv(cfd[i], &back, sizeof back, MSG_WAITALL), (ssize_t)sizeof back);
		CHECK_EQ(back, ~i);
	}
	uint64_t sum[2];
	CHECK_EQ(read(rp[0], sum, sizeof sum), (ssize_t)sizeof sum);
	tl_wait_ok(srv);
	printf("hellos read %llu, given back %llu for %d accepts\n",
	       (unsigned long long)sum[0], (unsigned long long)sum[1], NCONN);
	if (sdp) {
		CHECK(sum[0] >= NCONN && sum[0] <= NCONN + 10,
		      "the accepts read %llu hellos for %d connections",
		      (unsigned long long)sum[0], NCONN);
		CHECK(sum[1] >= 1 && sum[1] <= 5,
		      "the accepts gave back %llu hellos", (unsigned long long)sum[1]);
	}
	for (int i = 0; i < NCONN; i++)
		SYS(close(cfd[i]));
	SYS(close(l));
	return 0;
}
