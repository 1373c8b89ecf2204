/*
 * calib.c - the `auto` zero-copy threshold: where, on this host, one Cross
 * Memory Attach copy plus the zero-copy handshake becomes cheaper than the
 * two Buffer Copy copies through the (cache-resident) receive buffers.
 *
 * Measured once (a few milliseconds: memcpy in receive-buffer sized pieces,
 * and process_vm_readv on our own process at several sizes), then cached
 * in a small file keyed by kernel release and CPU model:
 *   $SDP_CALIB_FILE, else $XDG_CACHE_HOME/sdp-zcopy, else ~/.cache/sdp-zcopy,
 *   else /tmp/sdp-zcopy.<uid>
 * The answer is a threshold in bytes, or 0 when zero copy never pays here.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/sys.h"
#include "switch/log.h"

#define ZC_HANDSHAKE_NS 8000.0   /* SrcAvail, completion and the sender
				  * noticing it between two sends, estimate */

static void cache_path(char *p, size_t n)
{
	const char *e = getenv("SDP_CALIB_FILE");
	if (e && *e) {
		snprintf(p, n, "%s", e);
		return;
	}
	e = getenv("XDG_CACHE_HOME");
	if (e && *e) {
		snprintf(p, n, "%s/sdp-zcopy", e);
		return;
	}
	e = getenv("HOME");
	if (e && *e && access(e, W_OK) == 0) {
		snprintf(p, n, "%s/.cache/sdp-zcopy", e);
		return;
	}
	snprintf(p, n, "/tmp/sdp-zcopy.%u", (unsigned)getuid());
}

static void host_key(char *k, size_t n)
{
	struct utsname u;
	char model[128] = "?";
	uname(&u);
	FILE *f = fopen("/proc/cpuinfo", "re");
	if (f) {
		char line[256];
		while (fgets(line, sizeof line, f))
			if (!strncmp(line, "model name", 10)) {
				char *c = strchr(line, ':');
				if (c)
					snprintf(model, sizeof model, "%s", c + 2);
				model[strcspn(model, "\n")] = 0;
				break;
			}
		fclose(f);
	}
	snprintf(k, n, "%s|%s", u.release, model);
}

static double now_ns(void) { return (double)sdp_now_ns(); }

/* Best of 3: ns to move n bytes with the function. */
static double time_memcpy(char *dst, const char *src, size_t n, size_t piece)
{
	double best = 1e30;
	for (int r = 0; r < 3; r++) {
		double t = now_ns();
		for (size_t o = 0; o < n; o += piece)
			memcpy(dst + (o % (2u << 20)), src + o, n - o < piece ? n - o : piece);
		t = now_ns() - t;
		if (t < best)
			best = t;
	}
	return best;
}

static __attribute__((unused)) double time_cma(char *dst, char *src, size_t n)
{
	double best = 1e30;
	for (int r = 0; r < 3; r++) {
		struct iovec l = { dst, n }, rv = { src, n };
		double t = now_ns();
		if (process_vm_readv(getpid(), &l, 1, &rv, 1, 0) != (ssize_t)n)
			return -1;
		t = now_ns() - t;
		if (t < best)
			best = t;
	}
	return best;
}

/*
 * Both paths as a streaming application sees them: the application's
 * buffers are warm; Buffer Copy copies them into and out of receive
 * buffers that stay in cache; Zero Copy reads another process's memory
 * (a forked child holding the source, as the peer would) and pays a
 * hand-off per transfer (SrcAvail, completion, and the sender noticing it:
 * ZC_HANDSHAKE_NS). The smallest size where zero copy is clearly cheaper
 * is the threshold; 0 if none up to 8 MiB.
 */
static uint32_t measure(void)
{
	size_t max = 8u << 20;
	char *a = malloc(max), *b = malloc(max), *ring = malloc(2u << 20);
	int go[2] = { -1, -1 };
	pid_t child = -1;
	uint32_t th = 0;
	if (!a || !b || !ring || pipe2(go, O_CLOEXEC) < 0)
		goto out;
	memset(a, 1, max);
	memset(b, 2, max);
	memset(ring, 3, 2u << 20);
	/* The raw system call: not the switch's fork() (which would count
	 * this child as holding every connection), no atfork handlers. */
	child = (pid_t)syscall(SYS_fork);
	if (child == 0) {
		char c;
		syscall(SYS_close, go[1]);
		long r = syscall(SYS_read, go[0], &c, 1);   /* hold `a` until told */
		syscall(SYS_exit_group, r < 0);
	}
	if (child < 0)
		goto out;
	size_t slot = sdp_tun.slot_size;
	for (size_t n = 16384; n <= max; n *= 2) {
		time_memcpy(b, a, n, slot);           /* warm, as a stream is */
		double bc = time_memcpy(ring, a, n, slot) + time_memcpy(b, ring, n, slot);
		double zc = 1e30;
		for (int r = 0; r < 3; r++) {
			struct iovec l = { b, n }, rv = { a, n };
			double t = now_ns();
			if (process_vm_readv(child, &l, 1, &rv, 1, 0) != (ssize_t)n) {
				zc = -1;
				break;
			}
			t = now_ns() - t;
			if (t < zc)
				zc = t;
		}
		if (zc < 0)
			break;                    /* CMA refused: never */
		zc += ZC_HANDSHAKE_NS;
		if (zc < bc * 0.9) {
			th = (uint32_t)n;
			break;
		}
	}
out:
	if (child > 0) {
		sys_close(go[1]);
		go[1] = -1;
		waitpid(child, NULL, 0);
	}
	if (go[0] >= 0)
		sys_close(go[0]);
	if (go[1] >= 0)
		sys_close(go[1]);
	free(a);
	free(b);
	free(ring);
	return th;
}

uint32_t sdp_zcopy_auto(void)
{
	char path[512], key[256], line[512];
	cache_path(path, sizeof path);
	host_key(key, sizeof key);
	int rfd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	FILE *f = rfd >= 0 ? fdopen(rfd, "r") : NULL;
	if (f) {
		unsigned long th;
		char k[300];
		if (fgets(line, sizeof line, f) &&
		    sscanf(line, "%lu %299[^\n]", &th, k) == 2 && !strcmp(k, key)) {
			fclose(f);
			return (uint32_t)th;
		}
		fclose(f);
	}
	uint32_t th = measure();
	char dir[512];
	snprintf(dir, sizeof dir, "%s", path);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = 0;
		mkdir(dir, 0700);
	}
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.%d", path, (int)getpid());
	/* Never follow a link someone planted (the cache may be in /tmp). */
	int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd >= 0) {
		char out[400];
		int n = snprintf(out, sizeof out, "%u %s\n", th, key);
		bool ok = n > 0 && write(fd, out, (size_t)n) == n;
		close(fd);
		if (ok)
			rename(tmp, path);
		else
			unlink(tmp);
	}
	sdp_log(1, "zero-copy threshold calibrated: %u%s (cached in %s)", th,
		th ? " bytes" : " (never: Buffer Copy is as cheap here)", path);
	return th;
}
