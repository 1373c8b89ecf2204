/*
 * 16 connections across 4 client threads and 4 server threads: every
 * client thread runs 4 sockets round-robin, every server thread polls its
 * 4 and verifies each stream's own pattern, then answers; nothing is
 * mixed up between connections.
 */
#include "testlib.h"
#include <pthread.h>

#define NT 4
#define PER 4
#define BYTES (512u << 10)
#define CHUNK 16384

static uint16_t port;
static int srv[NT * PER];

static void *client(void *arg)
{
	int t = (int)(intptr_t)arg;
	int fd[PER];
	uint64_t off[PER] = { 0 };
	static __thread char buf[CHUNK];
	for (int j = 0; j < PER; j++) {
		fd[j] = tl_connect(AF_INET, port);
		expect_transport(fd[j]);
		uint32_t id = (uint32_t)(t * PER + j);
		CHECK_EQ(send(fd[j], &id, sizeof id, 0), 4);
	}
	for (int done = 0; done < PER;) {
		done = 0;
		for (int j = 0; j < PER; j++) {
			if (off[j] == BYTES) {
				done++;
				continue;
			}
			size_t n = CHUNK;
			tl_fill(buf, n, off[j], 100 + (uint32_t)(t * PER + j));
			tl_send_all(fd[j], buf, n);
			off[j] += n;
		}
	}
	for (int j = 0; j < PER; j++) {
		uint32_t ack = 0;
		CHECK_EQ(recv(fd[j], &ack, sizeof ack, MSG_WAITALL), 4);
		CHECK_EQ(ack, (uint32_t)(t * PER + j) ^ 0xA5A5A5A5u);
		expect_bytes(fd[j], 4 + BYTES, 4);
		SYS(close(fd[j]));
	}
	return NULL;
}

static void *server(void *arg)
{
	int t = (int)(intptr_t)arg;
	struct pollfd p[PER];
	uint64_t off[PER] = { 0 };
	static __thread char buf[65536];
	for (int j = 0; j < PER; j++)
		p[j] = (struct pollfd){ srv[t * PER + j], POLLIN, 0 };
	for (int left = PER; left;) {
		CHECK(poll(p, PER, 5000) > 0);
		for (int j = 0; j < PER; j++) {
			if (!(p[j].revents & POLLIN) || p[j].fd < 0)
				continue;
			uint32_t id = (uint32_t)(t * PER + j);
			ssize_t n = recv(p[j].fd, buf, sizeof buf,
					 MSG_DONTWAIT);
			CHECK(n > 0, "conn %u: recv -> %zd", id, n);
			CHECK_PAT(buf, (size_t)n, off[j], 100 + id);
			off[j] += (uint64_t)n;
			CHECK(off[j] <= BYTES);
			if (off[j] == BYTES) {
				uint32_t ack = id ^ 0xA5A5A5A5u;
				CHECK_EQ(send(p[j].fd, &ack, 4, 0), 4);
				p[j].fd = -1;
				left--;
			}
		}
	}
	for (int j = 0; j < PER; j++) {
		int fd = srv[t * PER + j];
		CHECK_EQ(recv(fd, buf, 1, 0), 0);
		expect_bytes(fd, 4, 4 + BYTES);
		SYS(close(fd));
	}
	return NULL;
}

int main(void)
{
	pthread_t ct[NT], st[NT];

	tl_watchdog(30);
	int l = tl_listen(AF_INET, &port);
	for (int t = 0; t < NT; t++)
		CHECK_EQ(pthread_create(&ct[t], NULL, client,
					(void *)(intptr_t)t), 0);
	for (int i = 0; i < NT * PER; i++) {
		int s = SYS(accept(l, NULL, NULL));
		expect_transport(s);
		uint32_t id = 99;
		CHECK_EQ(recv(s, &id, sizeof id, MSG_WAITALL), 4);
		CHECK(id < NT * PER, "bad id %u", id);
		srv[id] = s;
	}
	for (int t = 0; t < NT; t++)
		CHECK_EQ(pthread_create(&st[t], NULL, server,
					(void *)(intptr_t)t), 0);
	for (int t = 0; t < NT; t++) {
		CHECK_EQ(pthread_join(ct[t], NULL), 0);
		CHECK_EQ(pthread_join(st[t], NULL), 0);
	}
	SYS(close(l));
	return 0;
}
