/*
 * The paper's aliasing problem: protecting a virtual page does not protect
 * the same physical page mapped elsewhere. A buffer in a shared mapping
 * (a memfd mapped twice; a MAP_SHARED|MAP_ANONYMOUS region and its mremap
 * alias; a file both mapped and written with pwrite) is written through
 * the other name right after send() returns: the receiver must still get
 * the bytes as sent. Shared memory is never sent asynchronously (in sdp
 * mode tx_azcopy_bytes does not move for it), while a private buffer in
 * the same process still is. Both fault policies.
 */
#include "azlib.h"
#include <sys/syscall.h>

#define ROUNDS 8

static void rx(int s, void *arg)
{
	(void)arg;
	uint8_t *r = az_buf(MiB, 0);
	for (uint64_t k = 0; k < 4 * ROUNDS; k++)
		az_recv_round(s, r, MiB, k);
}

static int scenario(void)
{
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	int mfd = (int)syscall(SYS_memfd_create, "az-alias", 0);
	CHECK(mfd >= 0);
	CHECK_EQ(ftruncate(mfd, MiB), 0);
	uint8_t *a = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	uint8_t *b = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
	CHECK(a != MAP_FAILED && b != MAP_FAILED && a != b);
	uint8_t *sh = mmap(NULL, MiB, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	CHECK(sh != MAP_FAILED);
	uint8_t *sh2 = mremap(sh, 0, MiB, MREMAP_MAYMOVE);   /* a second name */
	CHECK(sh2 != MAP_FAILED && sh2 != sh);
	uint8_t *priv = az_buf(MiB, 0);
	uint64_t k = 0;
	struct azst s0 = az_get(c);
	for (int i = 0; i < ROUNDS; i++) {
		az_fill(a, MiB, k);
		tl_send_all(c, a, MiB);
		memset(b, 0xEE, MiB);                 /* the same pages, other name */
		k++;
		az_fill(sh, MiB, k);
		tl_send_all(c, sh, MiB);
		memset(sh2, 0xEE, MiB);
		k++;
		az_fill(a, MiB, k);
		tl_send_all(c, a, MiB);
		uint8_t junk[4096];
		memset(junk, 0xEE, sizeof junk);
		for (size_t o = 0; o < MiB; o += sizeof junk)   /* the file itself */
			CHECK_EQ(pwrite(mfd, junk, sizeof junk, (off_t)o), (ssize_t)sizeof junk);
		k++;
	}
	struct azst s1 = az_get(c);
	CHECK_EQ(s1.tx, s0.tx);                     /* none of it asynchronous */
	for (int i = 0; i < ROUNDS; i++, k++) {
		az_fill(priv, MiB, k);
		tl_send_all(c, priv, MiB);
		memset(priv, 0xEE, MiB);
	}
	struct azst s2 = az_get(c);
	if (tl_sdp_mode())
		CHECK(s2.tx > s1.tx, "a private buffer was not sent asynchronously");
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	return az_main_one(argc, argv, scenario, 0);
}
