/*
 * Asynchronous zero copy (SDP_AZCOPY=1): a sender that overwrites every
 * byte of its buffer right after each send() returns. Each round sends
 * 1 MiB and at once fills the same buffer with the next round's bytes; the
 * receiver, another process, must get exactly the bytes of every round.
 * Buffers page-aligned and misaligned, with SDP_AZ_FAULT=block and =copy,
 * with the protection mechanism auto picks and each forced one
 * (SDP_AZ_PROTECT=mprotect, =uffd). In sdp mode the counters prove the
 * path: the sender's bytes went asynchronously (tx_azcopy_bytes: all but
 * the partial pages at the ends), the receiver read them so
 * (rx_azcopy_bytes) and the writes found pages in flight (az_faults);
 * how many copy-on-write copied aside (az_cow_copies) is printed.
 */
#include "azlib.h"

struct variant { const char *fault, *prot, *off, *rounds; };

static const struct variant variants[] = {
	{ "block", "auto", "0", "1000" },
	{ "block", "auto", "123", "1000" },
	{ "copy", "auto", "0", "1000" },
	{ "copy", "auto", "4001", "1000" },
	{ "block", "mprotect", "0", "250" },
	{ "copy", "mprotect", "2049", "250" },
	{ "block", "uffd", "7", "250" },
	{ "copy", "uffd", "0", "250" },
};

static int scenario(char **argv)
{
	const char *fault = argv[0];
	size_t off = (size_t)atol(argv[1]);
	int rounds = atoi(argv[2]);
	int c, s;
	tl_pair(AF_INET, &c, &s);
	expect_transport(c);
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		/* the receiver */
		tl_watchdog(100);
		close(c);
		uint8_t *r = az_buf(MiB, (off * 7) % 4096);
		for (int k = 0; k < rounds; k++) {
			tl_recv_all(s, r, MiB);
			long bad = az_check(r, MiB, (uint64_t)k);
			CHECK(bad < 0, "round %d: byte %ld wrong (0x%02x)", k, bad,
			      bad >= 0 ? r[bad] : 0);
		}
		struct azst a = az_get(s);
		if (tl_sdp_mode())
			CHECK(a.rx > 0, "no byte read from asynchronous advertisements");
		char ok = 'k';
		tl_send_all(s, &ok, 1);
		_exit(0);
	}
	close(s);
	uint8_t *b = az_buf(MiB, off);
	az_fill(b, MiB, 0);
	for (int k = 0; k < rounds; k++) {
		tl_send_all(c, b, MiB);
		az_fill(b, MiB, (uint64_t)k + 1);    /* at once: the next round */
	}
	char ok = 0;
	tl_recv_all(c, &ok, 1);
	CHECK_EQ(ok, 'k');
	struct azst a = az_get(c);
	if (tl_sdp_mode()) {
		/* all but the partial pages at the ends went asynchronously */
		uint64_t whole = (uint64_t)rounds * (MiB - (off ? 4096 : 0));
		CHECK(a.tx >= whole, "%s, offset %zu: %llu of %llu bytes asynchronous",
		      fault, off, (unsigned long long)a.tx, (unsigned long long)whole);
		CHECK(a.faults > 0, "no write found its page in flight");
		/* With copy-on-write a fault copies the page aside, or finds
		 * that the receiver finished reading it meanwhile - often, when
		 * the sender is slow (AddressSanitizer): the copies are printed,
		 * not required; the bytes above are. */
		fprintf(stderr, "%s offset %zu: %d rounds, %llu faults, %llu copies\n", fault,
			off, rounds, (unsigned long long)a.faults, (unsigned long long)a.cow);
	}
	int st;
	CHECK(waitpid(pid, &st, 0) == pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0, "receiver failed (status 0x%x)", st);
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 5 && !strcmp(argv[1], "--az"))
		return scenario(argv + 2);
	tl_watchdog(240);
	for (size_t i = 0; i < sizeof variants / sizeof variants[0]; i++) {
		const struct variant *v = &variants[i];
		char f[64], p[64];
		snprintf(f, sizeof f, "SDP_AZ_FAULT=%s", v->fault);
		snprintf(p, sizeof p, "SDP_AZ_PROTECT=%s", v->prot);
		/* every send asynchronous, however often it faults */
		const char *env[] = { f, p, "SDP_AZ_COOL=0", NULL };
		const char *args[] = { v->fault, v->off, v->rounds, NULL };
		int st = az_run(argv, env, args);
		CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0,
		      "%s/%s offset %s failed (status 0x%x)", v->fault, v->prot, v->off, st);
	}
	return 0;
}
