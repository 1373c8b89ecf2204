/*
 * Asynchronous zero copy, the receive side: a blocking recv() into a large
 * buffer, of data the peer has already advertised, may return before the
 * bytes are in (SDP_AZ_RECV=1, userfaultfd); touching the buffer then waits
 * until they are. Every way of touching it must see exactly the stream's
 * bytes: the application reading it at once, writing into it at once
 * (the write must survive: it lands after the data), the kernel reading it
 * (write(2) to a pipe) and writing it (read(2) from a pipe), another
 * thread reading it, and a receiver that computes a while before it looks.
 * Buffers misaligned, several rounds each. sdp mode: rx_azasync_bytes
 * shows receives that returned before the copy.
 */
#include "azlib.h"
#include <pthread.h>

#define ROUNDS 24

enum { T_READ, T_WRITE, T_KWRITE, T_KREAD, T_THREAD, T_LATER, T_END };
static const char *names[] = { "read at once", "write at once", "write(2) from it",
			       "read(2) into it", "another thread", "compute first" };

struct peek { const uint8_t *p; size_t len; uint64_t r; long bad; };

static void *reader(void *arg)
{
	struct peek *k = arg;
	k->bad = az_check(k->p, k->len, k->r);
	return NULL;
}

static void receiver(int s, size_t off)
{
	uint8_t *r = az_buf(MiB, off);
	uint8_t *other = az_buf(MiB, 0);
	int pp[2];
	CHECK(pipe(pp) == 0);
	CHECK(fcntl(pp[1], F_SETPIPE_SZ, 1 << 20) > 0 || 1);
	uint64_t round = 0;
	for (int t = 0; t < T_END; t++) {
		for (int k = 0; k < ROUNDS; k++, round++) {
			/* the data is there (advertised) before we receive */
			struct pollfd p = { s, POLLIN, 0 };
			CHECK_EQ(poll(&p, 1, 20000), 1);
			size_t got = 0;
			while (got < MiB) {
				ssize_t n = recv(s, r + got, MiB - got, 0);
				CHECK(n > 0, "recv -> %zd", n);
				got += (size_t)n;
			}
			long bad = -1;
			switch (t) {
			case T_READ:
				bad = az_check(r, MiB, round);
				break;
			case T_WRITE:
				r[MiB / 2] ^= 0xFF;       /* must land after the data */
				r[MiB / 2] ^= 0xFF;
				bad = az_check(r, MiB, round);
				break;
			case T_KWRITE: {
				/* the kernel reads the buffer for us */
				for (size_t o = 0; o < MiB; o += 65536) {
					CHECK_EQ(write(pp[1], r + o, 65536), 65536);
					CHECK_EQ(read(pp[0], other, 65536), 65536);
					CHECK(memcmp(other, r + o, 65536) == 0);
				}
				bad = az_check(r, MiB, round);
				break;
			}
			case T_KREAD: {
				/* the kernel writes the buffer's first page */
				uint8_t page[4096];
				memset(page, 0x5A, sizeof page);
				CHECK_EQ(write(pp[1], page, sizeof page), (ssize_t)sizeof page);
				CHECK_EQ(read(pp[0], r + 8192, sizeof page), (ssize_t)sizeof page);
				CHECK(memcmp(r + 8192, page, sizeof page) == 0);
				az_fill(other, MiB, round);
				memcpy(other + 8192, page, sizeof page);
				CHECK(memcmp(r, other, MiB) == 0, "round %llu",
				      (unsigned long long)round);
				break;
			}
			case T_THREAD: {
				struct peek pk = { r, MiB, round, 0 };
				pthread_t th;
				CHECK_EQ(pthread_create(&th, NULL, reader, &pk), 0);
				CHECK_EQ(pthread_join(th, NULL), 0);
				bad = pk.bad;
				break;
			}
			case T_LATER:
				az_fill(other, MiB, round + 7);   /* a while of work */
				az_fill(other, MiB, round + 8);
				bad = az_check(r, MiB, round);
				break;
			}
			CHECK(bad < 0, "%s, round %llu: byte %ld wrong", names[t],
			      (unsigned long long)round, bad);
			char go = 'g';
			tl_send_all(s, &go, 1);
		}
	}
	if (tl_sdp_mode()) {
		struct azst a = az_get(s);
		fprintf(stderr, "offset %zu: %llu bytes received asynchronously\n", off,
			(unsigned long long)a.asy);
		CHECK(a.asy > 0, "no recv returned before its copy");
	}
}

static int scenario(char **argv)
{
	size_t off = (size_t)atol(argv[0]);
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		tl_watchdog(100);
		close(c);
		receiver(s, off);
		_exit(0);
	}
	close(s);
	uint8_t *b = az_buf(MiB, (off * 3) % 4096);
	for (uint64_t round = 0; round < (uint64_t)ROUNDS * T_END; round++) {
		az_fill(b, MiB, round);
		tl_send_all(c, b, MiB);
		char go;
		tl_recv_all(c, &go, 1);            /* the receiver is done with it */
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "receiver failed (status 0x%x)", st);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return scenario(argv + 2);
	tl_watchdog(200);
	static const char *offs[] = { "0", "1000", "4095" };
	for (int i = 0; i < 3; i++) {
		const char *env[] = { "SDP_AZ_RECV=1", NULL };
		const char *args[] = { offs[i], NULL };
		int st = az_run(argv, env, args);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "offset %s failed (0x%x)",
		      offs[i], st);
	}
	return 0;
}
