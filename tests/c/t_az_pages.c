/*
 * Asynchronous zero copy works on whole pages; buffers do not. A buffer
 * that starts and ends inside pages holding other live data (a struct's
 * neighbouring fields), written at once after the send: the neighbours
 * (same pages as the buffer's ends) are written without ever waiting or
 * faulting, the buffer's own bytes arrive as sent - the partial pages went
 * by Buffer Copy, the whole ones asynchronously (the counters say so:
 * tx_azcopy_bytes is exactly the whole pages). Pages the application made
 * read-only go asynchronously and stay read-only; pages it made PROT_NONE
 * while in flight stay PROT_NONE after the peer has read them. Both fault
 * policies.
 */
#include "azlib.h"

struct rec {
	char before[300];
	uint8_t buf[3 * MiB / 2];
	char after[300];
};

static int perm_of(const void *p, char *perm)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char l[512];
	int found = 0;
	while (f && fgets(l, sizeof l, f)) {
		unsigned long s, e;
		char pm[8];
		if (sscanf(l, "%lx-%lx %7s", &s, &e, pm) == 3 && (uintptr_t)p >= s &&
		    (uintptr_t)p < e) {
			strcpy(perm, pm);
			found = 1;
		}
	}
	if (f)
		fclose(f);
	return found;
}

static void rx(int s, void *arg)
{
	(void)arg;
	uint8_t *r = az_buf(2 * MiB, 5);
	for (uint64_t k = 0; k < 40; k++)
		az_recv_round(s, r, sizeof(((struct rec *)0)->buf), k);
	az_gate_wait(0);
	az_recv_round(s, r, MiB, 100);         /* read-only buffer */
	az_gate_wait(0);
	az_recv_round(s, r, MiB, 101);         /* made PROT_NONE in flight */
	char ok = 'k';
	tl_send_all(s, &ok, 1);
}

static int scenario(void)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	struct azst a0 = az_get(c);
	uint64_t expect_az = 0;
	for (uint64_t k = 0; k < 40; k++) {
		/* a struct at any offset in its pages */
		size_t off = (k * 389) % 4096;
		uint8_t *mem = az_buf(sizeof(struct rec) + 4096, off);
		struct rec *r = (struct rec *)mem;
		memset(r->before, 'b', sizeof r->before);
		memset(r->after, 'a', sizeof r->after);
		az_fill(r->buf, sizeof r->buf, k);
		struct azst f0 = az_get(c);
		tl_send_all(c, r->buf, sizeof r->buf);
		/* the neighbours share the buffer's first and last pages */
		memset(r->before, 'B', sizeof r->before);
		memset(r->after, 'A', sizeof r->after);
		struct azst f1 = az_get(c);
		CHECK_EQ(f1.faults, f0.faults);     /* no page of theirs protected */
		uintptr_t b = (uintptr_t)r->buf, e = b + sizeof r->buf;
		uintptr_t ms = (b + 4095) & ~(uintptr_t)4095, me = e & ~(uintptr_t)4095;
		expect_az += me - ms;
		/* now the buffer itself, at once */
		memset(r->buf, 0xEE, sizeof r->buf);
		munmap((void *)((uintptr_t)mem & ~(uintptr_t)4095), sizeof(struct rec) + 8192);
	}
	struct azst a1 = az_get(c);
	if (tl_sdp_mode())
		CHECK_EQ(a1.tx - a0.tx, expect_az);

	/* read-only pages: advertised as they are, left read-only */
	char perm[8];
	uint8_t *ro = az_buf(MiB, 0);
	az_fill(ro, MiB, 100);
	CHECK_EQ(mprotect(ro, MiB, PROT_READ), 0);
	tl_send_all(c, ro, MiB);
	az_gate_pass(0);
	/* PROT_NONE while in flight: the bytes still arrive, the protection
	 * stays the application's */
	uint8_t *pn = az_buf(MiB, 0);
	az_fill(pn, MiB, 101);
	tl_send_all(c, pn, MiB);
	CHECK_EQ(mprotect(pn, MiB, PROT_NONE), 0);
	az_gate_pass(0);
	char ok;
	tl_recv_all(c, &ok, 1);
	struct azst a2 = az_get(c);
	if (tl_sdp_mode())
		CHECK(a2.tx - a1.tx >= 2 * MiB - 8192, "read-only or later PROT_NONE buffer "
		      "not sent asynchronously");
	CHECK(perm_of(ro, perm) && !strncmp(perm, "r--", 3), "read-only became %s", perm);
	CHECK(perm_of(pn, perm) && !strncmp(perm, "---", 3), "PROT_NONE became %s", perm);
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	return az_main_one(argc, argv, scenario, 1);
}
