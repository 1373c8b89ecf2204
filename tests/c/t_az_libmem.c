/*
 * The library's own memory is never protected: an application may send
 * any bytes it can name, including the library's (its data and bss, found
 * in /proc/self/maps) and those of its own thread's stack. Those sends go
 * by Buffer Copy (tx_azcopy_bytes does not move), arrive as they were at
 * the send, and the library - which writes that memory all the time - goes
 * on working: asynchronous sends before and after still do. Both fault
 * policies.
 */
#include "azlib.h"
#include <dlfcn.h>

/* The library's writable mappings: its file's, and the anonymous one
 * right after it (its bss). */
static int lib_ranges(uintptr_t *s, uintptr_t *e, int max)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char l[600];
	int n = 0;
	uintptr_t last_end = 0;
	while (f && fgets(l, sizeof l, f) && n < max) {
		unsigned long a, b;
		char perm[8];
		int off = 0;
		if (sscanf(l, "%lx-%lx %7s %*s %*s %*s%n", &a, &b, perm, &off) < 3)
			continue;
		const char *path = l + off;
		while (*path == ' ')
			path++;
		bool mine = strstr(path, "libsdp.so") != NULL;
		bool anon_after = a == last_end && (*path == '\n' || !*path);
		if (perm[1] == 'w' && (mine || anon_after)) {
			s[n] = a;
			e[n] = b;
			n++;
		}
		last_end = mine && perm[1] == 'w' ? b : 0;
	}
	if (f)
		fclose(f);
	return n;
}

static void rx(int s, void *arg)
{
	size_t total = *(size_t *)arg;
	uint8_t *r = az_buf(MiB, 0);
	az_recv_round(s, r, MiB, 0);
	uint8_t *sink = az_buf(total + 4096, 0);
	tl_recv_all(s, sink, total);             /* the library's bytes: any */
	uint8_t st[256 << 10];
	tl_recv_all(s, st, sizeof st);
	for (size_t i = 0; i < sizeof st; i++)
		CHECK(st[i] == (uint8_t)(i * 7), "stack byte %zu", i);
	az_recv_round(s, r, MiB, 1);
	char ok = 'k';
	tl_send_all(s, &ok, 1);
}

static void send_stack(int c)
{
	uint8_t st[256 << 10];
	for (size_t i = 0; i < sizeof st; i++)
		st[i] = (uint8_t)(i * 7);
	tl_send_all(c, st, sizeof st);
	memset(st, 0xEE, sizeof st);             /* our stack: written at once */
	__asm__ __volatile__("" : : "r"(st) : "memory");
}

static int scenario(void)
{
	uintptr_t s[8], e[8];
	/* Under AddressSanitizer the library's globals are fenced by poisoned
	 * redzones, which reading them all would trip by design: then only
	 * the stack is sent. */
	bool asan = dlsym(RTLD_DEFAULT, "__asan_init") != NULL;
	int n = asan ? 0 : lib_ranges(s, e, 8);
	size_t total = 0;
	for (int i = 0; i < n; i++)
		total += e[i] - s[i];
	if (tl_sdp_mode() && !asan)
		CHECK(n > 0 && total >= 65536, "no writable mapping of libsdp found (%d, %zu)",
		      n, total);
	pid_t pid;
	int c = az_peer(rx, &total, &pid);
	uint8_t *b = az_buf(MiB, 0);
	az_fill(b, MiB, 0);
	tl_send_all(c, b, MiB);
	struct azst a0 = az_get(c);
	for (int i = 0; i < n; i++)
		tl_send_all(c, (void *)s[i], e[i] - s[i]);
	send_stack(c);
	struct azst a1 = az_get(c);
	CHECK_EQ(a1.tx, a0.tx);                  /* none of it asynchronous */
	az_fill(b, MiB, 1);
	tl_send_all(c, b, MiB);
	memset(b, 0xEE, MiB);
	char ok;
	tl_recv_all(c, &ok, 1);
	if (tl_sdp_mode())
		CHECK(az_get(c).tx > a1.tx, "asynchronous sends stopped");
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	return az_main_one(argc, argv, scenario, 1);
}
