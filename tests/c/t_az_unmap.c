/*
 * Asynchronous zero copy: memory given back or changed while the peer has
 * not read it yet. After each send() of 1 MiB returns - the receiver does
 * not read until told, so every byte is still in flight - the sender
 * munmaps the buffer, frees it (malloc'd, large and heap-sized), reallocs
 * it far larger (glibc moves it), mprotects it (read-write, then PROT_NONE),
 * mremaps it elsewhere, madvise(MADV_DONTNEED)s it, or maps something else
 * over it (MAP_FIXED) - and scribbles on whatever it may still write. The
 * receiver must get exactly the bytes sent. A PROT_NONE the application
 * set stays as it set it. Both fault policies. sdp mode: the bytes went
 * asynchronously and were copied aside (az_cow_copies).
 */
#include "azlib.h"
#include <malloc.h>

enum { O_MUNMAP, O_FREE, O_FREE_SMALL, O_REALLOC, O_MPROTECT_RW, O_MPROTECT_NONE,
       O_MREMAP, O_MADVISE, O_MMAP_FIXED, O_END };
static const char *ops[] = { "munmap", "free", "free-heap", "realloc", "mprotect-rw",
			     "mprotect-none", "mremap", "madvise", "mmap-fixed" };
#define ROUNDS 3

static bool prot_none(const void *p)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char l[512];
	bool none = false;
	while (f && fgets(l, sizeof l, f)) {
		unsigned long s, e;
		char perm[8];
		if (sscanf(l, "%lx-%lx %7s", &s, &e, perm) == 3 && (uintptr_t)p >= s &&
		    (uintptr_t)p < e)
			none = !strncmp(perm, "---", 3);
	}
	if (f)
		fclose(f);
	return none;
}

static void rx(int s, void *arg)
{
	(void)arg;
	uint8_t *r = az_buf(MiB, 0);
	for (int op = 0; op < O_END; op++)
		for (int k = 0; k < ROUNDS; k++) {
			az_gate_wait(0);              /* the sender has done it */
			az_recv_round(s, r, MiB, (uint64_t)(op * ROUNDS + k));
		}
}

static int scenario(void)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	for (int op = 0; op < O_END; op++)
		for (int k = 0; k < ROUNDS; k++) {
			uint64_t round = (uint64_t)(op * ROUNDS + k);
			size_t map = 2 * MiB;
			uint8_t *b;
			if (op == O_FREE || op == O_REALLOC)
				b = malloc(MiB);
			else if (op == O_FREE_SMALL) {
				/* from the heap, not mmap'd: raise the threshold */
				mallopt(M_MMAP_THRESHOLD, 32 << 20);
				b = malloc(MiB);
			} else {
				b = mmap(NULL, map, PROT_READ | PROT_WRITE,
					 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
			}
			CHECK(b && b != MAP_FAILED);
			az_fill(b, MiB, round);
			tl_send_all(c, b, MiB);
			switch (op) {
			case O_MUNMAP:
				CHECK_EQ(munmap(b, map), 0);
				break;
			case O_FREE:
			case O_FREE_SMALL: {
				free(b);
				uint8_t *x = malloc(MiB);     /* likely the same memory */
				memset(x, 0xEE, MiB);
				free(x);
				break;
			}
			case O_REALLOC: {
				uint8_t *x = realloc(b, 64 * MiB);
				CHECK(x != NULL);
				CHECK(az_check(x, MiB, round) < 0, "realloc lost the bytes");
				memset(x, 0xEE, 2 * MiB);
				free(x);
				break;
			}
			case O_MPROTECT_RW:
				CHECK_EQ(mprotect(b, map, PROT_READ | PROT_WRITE), 0);
				memset(b, 0xEE, MiB);
				munmap(b, map);
				break;
			case O_MPROTECT_NONE:
				CHECK_EQ(mprotect(b, MiB, PROT_NONE), 0);
				CHECK(prot_none(b), "PROT_NONE not in place");
				break;
			case O_MREMAP: {
				uint8_t *x = mremap(b, map, 4 * map, MREMAP_MAYMOVE);
				CHECK(x != MAP_FAILED);
				CHECK(az_check(x, MiB, round) < 0, "mremap lost the bytes");
				memset(x, 0xEE, MiB);
				munmap(x, 4 * map);
				break;
			}
			case O_MADVISE:
				CHECK_EQ(madvise(b, MiB, MADV_DONTNEED), 0);
				CHECK_EQ(b[4096], 0);          /* dropped: zero */
				memset(b, 0xEE, MiB);
				munmap(b, map);
				break;
			case O_MMAP_FIXED: {
				void *x = mmap(b, map, PROT_READ | PROT_WRITE,
					       MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
				CHECK(x == b);
				memset(b, 0xEE, MiB);
				munmap(b, map);
				break;
			}
			}
			az_gate_pass(0);                      /* read it now */
			if (op == O_MPROTECT_NONE) {
				/* once read, our protection is gone, the
				 * application's stays */
				char ack;
				(void)ack;
				CHECK(prot_none(b), "PROT_NONE not left as the application set it");
				munmap(b, map);
			}
		}
	az_reap(pid, "receiver");
	struct azst a = az_get(c);
	if (tl_sdp_mode()) {
		fprintf(stderr, "%llu bytes asynchronous, %llu copied aside\n",
			(unsigned long long)a.tx, (unsigned long long)a.cow);
		CHECK(a.tx >= (uint64_t)O_END * ROUNDS * (MiB - 8192), "not asynchronous");
		CHECK(a.cow > 0, "nothing copied aside");
	}
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	(void)ops;
	return az_main_one(argc, argv, scenario, 0);
}
