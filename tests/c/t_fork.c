/*
 * fork() with a connected socket: (1) the child uses it while the parent
 * closes its copy: the connection stays up, the child's data arrives and
 * the peer sees EOF only when the child closes; (2) the opposite: the
 * child closes its copy and exits, the parent keeps using it; (3) parent
 * and child take turns writing to the same socket: the peer reads both in
 * turn order.
 */
#include "testlib.h"

#define SEED 17
#define N (1u << 20)

int main(void)
{
	int c, s, sync[2];
	char buf[256];

	tl_watchdog(20);

	/* (1) child uses c, parent closes its copy of c at once. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	SYS(pipe(sync));
	pid_t pid = tl_fork();
	if (pid == 0) {
		SYS(close(s));
		expect_transport(c);
		char go;
		CHECK_EQ(read(sync[0], &go, 1), 1);	/* parent closed c */
		tl_send_pat(c, 0, N, SEED, 32768);
		tl_recv_pat(c, 0, 1000, SEED + 1, 1000);
		expect_bytes(c, N, 1000);
		SYS(close(c));
		_exit(0);
	}
	SYS(close(c));
	CHECK_EQ(write(sync[1], "g", 1), 1);
	tl_recv_pat(s, 0, N, SEED, 65536);
	tl_send_pat(s, 0, 1000, SEED + 1, 1000);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	tl_wait_ok(pid);
	expect_bytes(s, 1000, N);
	SYS(close(s));

	/* (2) child closes its copy and exits; the parent goes on. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	pid = tl_fork();
	if (pid == 0) {
		SYS(close(c));
		SYS(close(s));
		_exit(0);
	}
	tl_wait_ok(pid);
	CHECK_ERR(recv(s, buf, sizeof buf, MSG_DONTWAIT), EAGAIN);
	struct pollfd p = { s, POLLIN | POLLRDHUP, 0 };
	CHECK_EQ(poll(&p, 1, 0), 0);
	tl_send_pat(c, 0, N, SEED, 32768);
	tl_recv_pat(s, 0, N, SEED, 65536);
	tl_send_pat(s, 0, 5000, SEED + 2, 5000);
	tl_recv_pat(c, 0, 5000, SEED + 2, 5000);
	expect_bytes(c, N, 5000);
	expect_bytes(s, 5000, N);
	SYS(close(c));
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	SYS(close(s));

	/* (3) parent and child write turn by turn to the same socket. */
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	expect_transport(s);
	int to_child[2], to_parent[2];
	SYS(pipe(to_child));
	SYS(pipe(to_parent));
	pid = tl_fork();
	if (pid == 0) {
		SYS(close(s));
		for (int i = 0; i < 20; i++) {
			char t;
			CHECK_EQ(read(to_child[0], &t, 1), 1);
			tl_send_pat(c, (uint64_t)(2 * i + 1) * 4000, 4000,
				    SEED + 3, 4000);
			CHECK_EQ(write(to_parent[1], "t", 1), 1);
		}
		SYS(close(c));
		_exit(0);
	}
	for (int i = 0; i < 20; i++) {
		char t;
		tl_send_pat(c, (uint64_t)(2 * i) * 4000, 4000, SEED + 3, 4000);
		CHECK_EQ(write(to_child[1], "t", 1), 1);
		CHECK_EQ(read(to_parent[0], &t, 1), 1);
	}
	SYS(close(c));
	tl_recv_pat(s, 0, 40 * 4000, SEED + 3, 7000);
	CHECK_EQ(recv(s, buf, sizeof buf, 0), 0);
	tl_wait_ok(pid);
	expect_bytes(s, 0, 40 * 4000);
	SYS(close(s));
	return 0;
}
