/*
 * fuzz_stubs.c - what start-up (src/switch/config.c) does for the engine,
 * for the fuzzers: the tunables a fuzzer wants (small rings, no spinning,
 * zero copy from the first byte), the process id, the log level and the
 * providers' init. The switch itself (src/switch/, which interposes libc's
 * socket calls) is not linked into a fuzzer. FUZZ_LOG=N shows the
 * engine's log up to level N.
 */
#include <stdlib.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/log.h"
#include "sdp/tunables.h"
#include "fabric/fabric.h"

__attribute__((constructor)) static void fuzz_stubs_init(void)
{
	sdp_tun.spin_us = 0;
	sdp_tun.zcopy_thresh = 0;
	sdp_tun.zcopy_auto = 0;
	sdp_tun.zcopy_chunk = 1u << 20;
	sdp_tun.zcopy_depth = 4;
	sdp_tun.zcopy_tail = 256u << 10;
	sdp_tun.nslots = 8;
	sdp_tun.slot_size = 1024;
	sdp_tun.region_cache = 0;
	sdp_pid = getpid();
	const char *l = getenv("FUZZ_LOG");
	sdp_log_level = l ? atoi(l) : -1;
	fab_init(&(struct fab_params){ .region_cache = 0 });
}
