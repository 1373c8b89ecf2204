/*
 * A listening socket shut down and closed by one thread while another is
 * blocked in accept() on it - how a server stops. The accepting thread's
 * accept() holds the library's listener state (as the kernel holds the
 * listening socket's file): it must come back with the kernel's error,
 * not crash on freed state, and every connection accepted before must
 * have carried its own bytes. 60 rounds, each after a different number
 * of clients.
 *
 * (Clients that connect while the listener is being shut down:
 * t_listen_race.c.)
 */
#include "testlib.h"
#include <pthread.h>
#include <stdatomic.h>

#define ROUNDS 60
#define CLIENTS 24

struct round {
	int l;
	uint16_t port;
	_Atomic int accepted, connected, sdp;
	_Atomic bool stop, done;
};

static void *acceptor(void *arg)
{
	struct round *r = arg;
	for (;;) {
		int n = accept(r->l, NULL, NULL);
		if (n < 0) {
			/* shut down (EINVAL), closed (EBADF), or the number
			 * already names a client's socket (EINVAL) */
			CHECK(errno == EINVAL || errno == EBADF || errno == ENOTSOCK ||
			      errno == ECONNABORTED, "accept: %s", strerror(errno));
			if (errno == ECONNABORTED)
				continue;
			return NULL;
		}
		uint32_t id = 0;
		ssize_t k = recv(n, &id, sizeof id, MSG_WAITALL);
		/* a client that gave up (the round ended) may have sent nothing */
		if (k == (ssize_t)sizeof id) {
			CHECK(id >= 0x1000 && id < 0x1000 + CLIENTS, "id %#x", id);
			uint32_t ack = id ^ 0xFFFF;
			CHECK_EQ(send(n, &ack, sizeof ack, MSG_NOSIGNAL), (ssize_t)sizeof ack);
		}
		atomic_fetch_add(&r->accepted, 1);
		int v = 0;
		socklen_t vl = sizeof v;
		if (getsockopt(n, SOL_TCP, SDP_TRANSPORT, &v, &vl) == 0 && v == 1)
			atomic_fetch_add(&r->sdp, 1);
		SYS(close(n));
	}
}

static void *clients(void *arg)
{
	struct round *r = arg;
	for (int i = 0; i < CLIENTS && !atomic_load(&r->stop); i++) {
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		CHECK(fd >= 0);
		struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(r->port),
					 .sin_addr.s_addr = htonl(INADDR_LOOPBACK) };
		if (connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
			CHECK(errno == ECONNREFUSED || errno == ECONNRESET, "connect: %s",
			      strerror(errno));
			SYS(close(fd));
			break;
		}
		atomic_fetch_add(&r->connected, 1);
		uint32_t id = 0x1000 + (uint32_t)i, ack = 0;
		if (send(fd, &id, sizeof id, MSG_NOSIGNAL) == (ssize_t)sizeof id &&
		    recv(fd, &ack, sizeof ack, MSG_WAITALL) == (ssize_t)sizeof ack)
			CHECK_EQ(ack, id ^ 0xFFFF);
		SYS(close(fd));
	}
	atomic_store(&r->done, true);
	return NULL;
}

int main(void)
{
	tl_watchdog(60);
	int total = 0, sdp = 0;
	for (int round = 0; round < ROUNDS; round++) {
		struct round r = { .accepted = 0, .connected = 0, .sdp = 0, .stop = false, .done = false };
		r.l = tl_listen(AF_INET, &r.port);
		pthread_t at, ct;
		CHECK_EQ(pthread_create(&at, NULL, acceptor, &r), 0);
		CHECK_EQ(pthread_create(&ct, NULL, clients, &r), 0);
		int want = round % (CLIENTS + 1);
		while (atomic_load(&r.connected) < want && !atomic_load(&r.done))
			sched_yield();
		atomic_store(&r.stop, true);
		CHECK_EQ(pthread_join(ct, NULL), 0);
		/* every client served: the acceptor is in (or on its way into)
		 * accept(); stop as servers do */
		while (atomic_load(&r.accepted) < atomic_load(&r.connected))
			sched_yield();
		SYS(shutdown(r.l, SHUT_RDWR));
		SYS(close(r.l));
		CHECK_EQ(pthread_join(at, NULL), 0);
		CHECK_EQ(atomic_load(&r.accepted), atomic_load(&r.connected));
		total += atomic_load(&r.accepted);
		sdp += atomic_load(&r.sdp);
	}
	printf("%d connections accepted over %d rounds, %d over SDP\n", total, ROUNDS, sdp);
	CHECK(total > 0);
	if (tl_sdp_mode())
		CHECK(sdp > 0, "no connection over SDP");
	return 0;
}
