/*
 * Full duplex on one socket: in each of two processes, one thread sends
 * 8 MiB while another thread receives 8 MiB on the same socket at the same
 * time. Both streams arrive byte-exact; counters match.
 */
#include "testlib.h"
#include <pthread.h>

#define TOTAL (8u << 20)

struct dir { int fd; uint32_t seed; };

static void *sender(void *arg)
{
	struct dir *d = arg;
	tl_send_pat(d->fd, 0, TOTAL, d->seed, 50000);
	return NULL;
}

static void *receiver(void *arg)
{
	struct dir *d = arg;
	tl_recv_pat(d->fd, 0, TOTAL, d->seed, 40000);
	return NULL;
}

static void duplex(int fd, uint32_t tx_seed, uint32_t rx_seed)
{
	pthread_t a, b;
	struct dir tx = { fd, tx_seed }, rx = { fd, rx_seed };
	CHECK_EQ(pthread_create(&a, NULL, sender, &tx), 0);
	CHECK_EQ(pthread_create(&b, NULL, receiver, &rx), 0);
	CHECK_EQ(pthread_join(a, NULL), 0);
	CHECK_EQ(pthread_join(b, NULL), 0);
	expect_bytes(fd, TOTAL, TOTAL);
}

int main(void)
{
	uint16_t port;
	char b;

	tl_watchdog(30);
	int l = tl_listen(AF_INET, &port);
	pid_t pid = tl_fork();
	if (pid == 0) {
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		duplex(c, 1, 2);
		SYS(shutdown(c, SHUT_WR));
		CHECK_EQ(recv(c, &b, 1, 0), 0);
		_exit(0);
	}
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	duplex(s, 2, 1);
	CHECK_EQ(recv(s, &b, 1, 0), 0);
	SYS(close(s));
	tl_wait_ok(pid);
	SYS(close(l));
	return 0;
}
