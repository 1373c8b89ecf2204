/*
 * The sink may not read an asynchronous SrcAvail: the kernel refuses its
 * Cross Memory Attach read. A synchronous SrcAvail is then revoked and
 * re-sent by Buffer Copy, but the sender of an asynchronous one has had
 * send() return: nothing would re-send its bytes. The connection must be
 * reset on both sides - the bytes before are intact, no byte of the
 * refused one is invented, none is lost silently (an EOF where bytes were
 * missing, or a hang).
 *
 * How the read is made to fail, honestly: after its asynchronous sends
 * returned, the sender makes itself undumpable (prctl(PR_SET_DUMPABLE, 0));
 * the receiver has CAP_SYS_PTRACE out of its effective set (the test runs
 * as root, which may read any process). process_vm_readv then fails with EPERM, as for
 * a sender that changed its credentials. The probe of the connection was
 * made before, when the sender was readable, so the library's own
 * set-up never saw it unreadable. SDP_AZ_RECV=0: the recv reads by
 * itself (the progress thread's copy has its own path, poisoned pages).
 *
 * Kernel TCP has nothing to refuse: there all rounds arrive and then EOF.
 * Both fault policies.
 */
#include "azlib.h"

#include <linux/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

#define SZ (MiB / 4)
#define ROUNDS 3

/* Drop CAP_SYS_PTRACE from our effective set: the permitted one stays a
 * superset of the sender's (so a dumpable sender stays readable), but an
 * undumpable one needs the capability in effect. */
static void drop_ptrace_cap(void)
{
	struct __user_cap_header_struct h = { _LINUX_CAPABILITY_VERSION_3, 0 };
	struct __user_cap_data_struct d[2];
	CHECK_EQ(syscall(SYS_capget, &h, d), 0);
	d[CAP_SYS_PTRACE / 32].effective &= ~(1u << (CAP_SYS_PTRACE % 32));
	CHECK_EQ(syscall(SYS_capset, &h, d), 0);
}

static void rx(int s, void *arg)
{
	(void)arg;
	drop_ptrace_cap();
	uint8_t *r = az_buf(SZ, 0);
	az_recv_round(s, r, SZ, 0);              /* round 0: read as usual */
	az_gate_pass(0);
	az_gate_wait(1);                          /* the sender is unreadable now */
	size_t total = 0;
	int err = 0;
	for (uint64_t k = 1; k < ROUNDS && !err; k++) {
		size_t got = 0;
		while (got < SZ) {
			ssize_t n = recv(s, r + got, SZ - got, 0);
			if (n < 0 && errno == EINTR)
				continue;
			if (n <= 0) {
				err = n == 0 ? -1 : errno;
				break;
			}
			got += (size_t)n;
		}
		long bad = az_check(r, got, k);       /* what came is the stream's */
		CHECK(bad < 0, "round %llu: byte %ld of %zu wrong", (unsigned long long)k, bad,
		      got);
		total += got;
	}
	if (tl_sdp_mode()) {
		CHECK(err == ECONNRESET, "after the refused read: %s (%zu bytes of %u)",
		      err == -1 ? "EOF" : err ? strerror(err) : "every byte arrived",
		      total, (ROUNDS - 1) * SZ);
		CHECK(total < (size_t)(ROUNDS - 1) * SZ);
		/* the reset is reported once, then EOF as on TCP */
	} else {
		CHECK_EQ(err, 0);
		char x;
		CHECK_EQ(recv(s, &x, 1, 0), 0);
		CHECK_EQ(shutdown(s, SHUT_WR), 0);
	}
	az_gate_pass(2);
	az_gate_wait(3);
	close(s);
}

static int run(void)
{
	az_gates_open();
	pid_t pid;
	int c = az_peer(rx, NULL, &pid);
	uint8_t *b = az_buf(SZ, 0);
	az_fill(b, SZ, 0);
	tl_send_all(c, b, SZ);
	az_gate_wait(0);                          /* round 0 was read */
	uint8_t *b2 = az_buf((ROUNDS - 1) * SZ, 0);
	if (!tl_sdp_mode())
		az_gate_pass(1);                  /* TCP's sends may wait for the reads */
	for (uint64_t k = 1; k < ROUNDS; k++) {
		az_fill(b2 + (k - 1) * SZ, SZ, k);
		tl_send_all(c, b2 + (k - 1) * SZ, SZ);
	}
	if (tl_sdp_mode()) {
		struct azst a = az_get(c);
		CHECK(a.tx >= (uint64_t)SZ, "the sends were not asynchronous");
		CHECK(a.out > 0, "no advertisement outstanding");
	}
	CHECK_EQ(prctl(PR_SET_DUMPABLE, 0, 0, 0, 0), 0);
	if (tl_sdp_mode())
		az_gate_pass(1);
	else
		CHECK_EQ(shutdown(c, SHUT_WR), 0);
	az_gate_wait(2);                          /* the receiver saw the end */
	char x;
	ssize_t n = recv(c, &x, 1, 0);
	if (tl_sdp_mode()) {
		CHECK(n < 0 && errno == ECONNRESET, "the sender after the refused read: %s",
		      n == 0 ? "EOF" : n > 0 ? "data" : strerror(errno));
		CHECK_EQ(az_get(c).out, 0);
		/* its pages are writable again */
		memset(b2, 0xEE, (ROUNDS - 1) * SZ);
	} else {
		CHECK_EQ(n, 0);
	}
	az_gate_pass(3);
	az_reap(pid, "receiver");
	close(c);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "--az"))
		return run();
	tl_watchdog(120);
	const char *names[] = { "refused" };
	az_run_all(argv, names, 1, "SDP_AZ_RECV=0");
	return 0;
}
