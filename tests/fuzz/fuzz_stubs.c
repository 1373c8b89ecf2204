/*
 * fuzz_stubs.c - what the engine takes from the socket switch, for the
 * fuzzers: the tunables, the process id and the log. The switch itself
 * (src/switch/, which interposes libc's socket calls) is not linked into a
 * fuzzer. FUZZ_LOG=N shows the engine's log up to level N.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "sdp/conn.h"

int sdp_log_level = -1;
pid_t sdp_pid;
struct sdp_tunables sdp_tun = {
	.spin_us = 0,
	.zcopy_thresh = 0,
	.zcopy_chunk = 1u << 20,
	.zcopy_depth = 4,
	.zcopy_tail = 256u << 10,
	.nslots = 8,
	.slot_size = 1024,
};

void sdp_logf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	fprintf(stderr, "sdp: ");
	vfprintf(stderr, fmt, ap);
	fputc('\n', stderr);
	va_end(ap);
}

__attribute__((constructor)) static void fuzz_stubs_init(void)
{
	sdp_pid = getpid();
	const char *l = getenv("FUZZ_LOG");
	sdp_log_level = l ? atoi(l) : -1;
}

static __thread char why_buf[200];

void sdp_whyf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why_buf, sizeof why_buf, fmt, ap);
	va_end(ap);
}

const char *sdp_why_take(void)
{
	static __thread char taken[sizeof why_buf];
	if (!why_buf[0])
		return NULL;
	memcpy(taken, why_buf, sizeof taken);
	why_buf[0] = 0;
	return taken;
}
