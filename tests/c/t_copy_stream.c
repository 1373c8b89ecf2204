/*
 * Buffer Copy with streaming stores (SDP_COPY_STREAM, src/sdp/copy.c):
 * sends of every size around the 4 KiB threshold and up to 1 MiB, from
 * sources at odd offsets, in both directions at once between two
 * processes, arrive byte-exact while the receiver reads them as they land.
 * Under SDP the run is made with SDP_COPY_STREAM=on (test_c_features.py),
 * so sends of 4 KiB and more must be counted as streamed (tx_stream_bytes)
 * and smaller ones not; with T_COPY_STREAM_EXPECT=off none may be.
 */
#include "testlib.h"
#include <pthread.h>

#define ROUNDS 3

static const size_t sizes[] = { 100, 4095, 4096, 4097, 5000, 16384, 16656, 32767,
				65536 + 17, 262144, 1048576 - 3 };
#define NSIZES (sizeof sizes / sizeof sizes[0])

static size_t total_bytes(void)
{
	size_t t = 0;
	for (size_t i = 0; i < NSIZES; i++)
		t += sizes[i];
	return t * ROUNDS;
}

struct dir { int fd; uint32_t seed; };

static void *sender(void *arg)
{
	struct dir *d = arg;
	char *buf = malloc((1u << 20) + 64);
	CHECK(buf);
	uint64_t off = 0;
	for (int r = 0; r < ROUNDS; r++)
		for (size_t i = 0; i < NSIZES; i++) {
			char *p = buf + (i * 7 + (size_t)r) % 64;   /* odd source offsets */
			tl_fill(p, sizes[i], off, d->seed);
			tl_send_all(d->fd, p, sizes[i]);
			off += sizes[i];
		}
	free(buf);
	return NULL;
}

static void *receiver(void *arg)
{
	struct dir *d = arg;
	tl_recv_pat(d->fd, 0, total_bytes(), d->seed, 65536);
	return NULL;
}

#define SMALL (40 * 4000)

static void duplex(int fd, uint32_t tx_seed, uint32_t rx_seed, int client)
{
	pthread_t a, b;
	struct dir tx = { fd, tx_seed }, rx = { fd, rx_seed };
	CHECK_EQ(pthread_create(&a, NULL, sender, &tx), 0);
	CHECK_EQ(pthread_create(&b, NULL, receiver, &rx), 0);
	CHECK_EQ(pthread_join(a, NULL), 0);
	CHECK_EQ(pthread_join(b, NULL), 0);
	expect_bytes(fd, total_bytes() + (client ? SMALL : 0),
		     total_bytes() + (client ? 0 : SMALL));
}

/* Small sends first: below the threshold nothing is streamed. */
static void small_first(int fd, int sending)
{
	char buf[4000];
	for (uint64_t off = 0; off < SMALL; off += sizeof buf) {
		if (sending) {
			tl_fill(buf, sizeof buf, off, 9);
			tl_send_all(fd, buf, sizeof buf);
		} else {
			tl_recv_all(fd, buf, sizeof buf);
			CHECK_PAT(buf, sizeof buf, off, 9);
		}
	}
	struct sdp_sock_stats st;
	if (sending && tl_stats(fd, &st))
		CHECK(st.tx_stream_bytes == 0, "4000-byte sends streamed: %llu bytes",
		      (unsigned long long)st.tx_stream_bytes);
}

static void check_streamed(int fd)
{
	struct sdp_sock_stats st;
	if (!tl_stats(fd, &st))
		return;
	const char *e = getenv("T_COPY_STREAM_EXPECT");
	/* every round's sends of 4 KiB and more */
	uint64_t want = 0;
	for (size_t i = 0; i < NSIZES; i++)
		if (sizes[i] >= 4096)
			want += sizes[i] * ROUNDS;
	fprintf(stderr, "t_copy_stream: pid %d streamed %llu of %llu Buffer Copy bytes\n",
		(int)getpid(), (unsigned long long)st.tx_stream_bytes,
		(unsigned long long)st.tx_bcopy_bytes);
	CHECK(st.tx_stream_bytes <= st.tx_bcopy_bytes, "streamed more than copied");
	if (e && !strcmp(e, "off"))
		CHECK(st.tx_stream_bytes == 0, "streamed %llu bytes with streaming off",
		      (unsigned long long)st.tx_stream_bytes);
	else
		/* a large send is cut into ring buffers: a piece under 4 KiB at
		 * a buffer's end is copied plainly */
		CHECK(st.tx_stream_bytes >= want / 2 && st.tx_stream_bytes <= want,
		      "streamed %llu bytes, expected about %llu",
		      (unsigned long long)st.tx_stream_bytes, (unsigned long long)want);
}

int main(void)
{
	uint16_t port;
	char b;

	tl_watchdog(60);
	int l = tl_listen(AF_INET, &port);
	pid_t pid = tl_fork();
	if (pid == 0) {
		int c = tl_connect(AF_INET, port);
		expect_transport(c);
		small_first(c, 1);
		duplex(c, 1, 2, 1);
		check_streamed(c);
		SYS(shutdown(c, SHUT_WR));
		CHECK_EQ(recv(c, &b, 1, 0), 0);
		_exit(0);
	}
	int s = SYS(accept(l, NULL, NULL));
	expect_transport(s);
	small_first(s, 0);
	duplex(s, 2, 1, 0);
	CHECK_EQ(recv(s, &b, 1, 0), 0);
	SYS(close(s));
	tl_wait_ok(pid);
	SYS(close(l));
	return 0;
}
