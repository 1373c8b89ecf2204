/*
 * calib.c - the per-host measurements behind the `auto` settings (calib.h):
 *
 *   1. the copy routine for stream bytes: every candidate of copy.c copies
 *      warm application buffers into a 2 MiB "ring" and back out, in
 *      receive-buffer sized pieces, at three page offsets of the
 *      application buffer (malloc puts large buffers 16 bytes into a page,
 *      the ring's payload is 16 bytes into its slot: the aliased case is
 *      the common one); the fastest wins, libc's memcpy unless another is
 *      at least 10% faster;
 *   2. Cross Memory Attach at 64 KiB with source and destination at the
 *      same page offset and 2 KiB apart: where the first is much slower
 *      (rep movsb in the kernel on some CPUs), zero copy between aliased
 *      buffers goes through a bounce buffer at another offset (zcopy.c);
 *   3. the `auto` zero-copy threshold: where one CMA copy plus the
 *      zero-copy handshake becomes cheaper than two ring copies;
 *   4. for Asynchronous Zero Copy (only when it is on, and for `sdp
 *      check`): at each size from 8 KiB to 4 MiB, the CMA copy of a
 *      page-aligned buffer - what a synchronous send waits for - against a
 *      protect + unprotect cycle of its pages by mprotect and by
 *      userfaultfd - what an asynchronous send pays instead
 *      (sdp_calib_az_thresh turns them into the `auto` AZ threshold).
 *
 * A few tens of milliseconds, then cached in a small text file keyed by
 * kernel release and CPU model:
 *   $SDP_CALIB_FILE, else $XDG_CACHE_HOME/sdp-calib, else
 *   ~/.cache/sdp-calib, else /tmp/sdp-calib.<uid>
 * This file uses no part of the library but copy.c, the tunables and
 * azcal.c (the protection cycle), so `sdp check` links it too.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <sys/utsname.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "sdp/calib.h"
#include "sdp/sys.h"
#include "sdp/tunables.h"

#define ZC_HANDSHAKE_NS 8000.0   /* SrcAvail, completion and the sender
				  * noticing it between two sends, estimate */
#define CALIB_MAGIC "sdp-calib 3"   /* 3: az_fine lines (a cache without them is measured again) */

static double now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e9 + (double)ts.tv_nsec;
}

/* The cache's path as the process's environment gave it at start-up
 * (sdp_calib_env): servers that clear their environment before serving
 * (nginx's workers keep only TZ) still find the user's cache. */
static char start_path[256];

static void path_from_env(char *p, size_t n)
{
	const char *e = getenv("SDP_CALIB_FILE");
	if (e && *e) {
		snprintf(p, n, "%s", e);
		return;
	}
	e = getenv("XDG_CACHE_HOME");
	if (e && *e) {
		snprintf(p, n, "%s/sdp-calib", e);
		return;
	}
	e = getenv("HOME");
	if (e && *e && access(e, W_OK) == 0) {
		snprintf(p, n, "%s/.cache/sdp-calib", e);
		return;
	}
	snprintf(p, n, "/tmp/sdp-calib.%u", (unsigned)getuid());
}

void sdp_calib_env(void)
{
	path_from_env(start_path, sizeof start_path);
}

static void cache_path(char *p, size_t n)
{
	const char *e = getenv("SDP_CALIB_FILE");
	if (start_path[0] && !(e && *e)) {
		snprintf(p, n, "%s", start_path);
		return;
	}
	path_from_env(p, n);
}

static void host_key(char *k, size_t n)
{
	struct utsname u;
	char model[128] = "?", buf[8192];
	uname(&u);
	int fd = sys_open("/proc/cpuinfo", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t got = sys_read(fd, buf, sizeof buf - 1);
		sys_close(fd);
		buf[got > 0 ? got : 0] = 0;
		char *m = strstr(buf, "model name");
		char *c = m ? strchr(m, ':') : NULL;
		if (c) {
			c += 2;
			size_t l = strcspn(c, "\n");
			snprintf(model, sizeof model, "%.*s", (int)l, c);
		}
	}
	snprintf(k, n, "%s|%s", u.release, model);
}

/* ---- 1. the copy routine ------------------------------------------------ */

/* GB/s of copy in + copy out through a 2 MiB ring, app buffer at offset
 * `aoff` in its page, best of two passes of `total` bytes. */
static double time_copy(sdp_copy_fn f, char *app, char *out, char *ring,
			size_t piece, size_t aoff, size_t total)
{
	double best = 1e30;
	size_t ring_len = 2u << 20, win = 256u << 10;
	for (int r = 0; r < 2; r++) {
		size_t ro = 0, ao = 0;
		double t = now_ns();
		for (size_t done = 0; done < total; done += piece) {
			f(ring + ro + 16, app + aoff + ao, piece);
			f(out + aoff + ao, ring + ro + 16, piece);
			ro = (ro + piece + 16 + 4095) & ~(size_t)4095;
			if (ro + piece + 16 > ring_len)
				ro = 0;
			ao += piece;
			if (ao + piece > win)
				ao = 0;
		}
		t = now_ns() - t;
		if (t < best)
			best = t;
	}
	return (double)total / best;
}

static void measure_copy(uint32_t slot_size, struct sdp_calib *o)
{
	int n;
	const struct sdp_copy_impl *im = sdp_copy_impls(&n);
	size_t piece = slot_size > 64 ? slot_size - 16 : 1024;
	size_t win = (256u << 10) + 8192;
	char *app = aligned_alloc(4096, win), *out = aligned_alloc(4096, win);
	char *ring = aligned_alloc(4096, 2u << 20);
	o->ncopy = 0;
	if (!app || !out || !ring)
		goto done;
	memset(app, 1, win);
	memset(out, 2, win);
	memset(ring, 3, 2u << 20);
	static const size_t offs[] = { 16, 0, 1040 };
	for (int i = 0; i < n; i++) {
		if (!im[i].usable())
			continue;
		double inv = 0;
		time_copy(im[i].fn, app, out, ring, piece, 16, 1u << 20);   /* warm */
		for (size_t k = 0; k < sizeof offs / sizeof offs[0]; k++)
			inv += 1.0 / time_copy(im[i].fn, app, out, ring, piece, offs[k], 4u << 20);
		snprintf(o->copy_speed[o->ncopy].name, sizeof o->copy_speed[0].name, "%s",
			 im[i].name);
		o->copy_speed[o->ncopy].gbps = (double)(sizeof offs / sizeof offs[0]) / inv;
		o->ncopy++;
	}
done:
	free(app);
	free(out);
	free(ring);
}

/* libc unless another routine is at least 10% faster. */
static void choose_copy(struct sdp_calib *o)
{
	double libc = 0, best = 0;
	const char *pick = "libc";
	for (int i = 0; i < o->ncopy; i++)
		if (!strcmp(o->copy_speed[i].name, "libc"))
			libc = o->copy_speed[i].gbps;
	for (int i = 0; i < o->ncopy; i++) {
		double g = o->copy_speed[i].gbps;
		if (strcmp(o->copy_speed[i].name, "libc") && g > libc * 1.1 && g > best) {
			best = g;
			pick = o->copy_speed[i].name;
		}
	}
	snprintf(o->copy, sizeof o->copy, "%s", pick);
}

/* ---- 2. and 3.: Cross Memory Attach ------------------------------------- */

/* ns for one process_vm_readv of n bytes from the child's src into dst,
 * best of `reps`; < 0 if refused. */
static double time_cma(pid_t child, char *dst, char *src, size_t n, int reps)
{
	double best = 1e30;
	for (int r = 0; r < reps; r++) {
		struct iovec l = { dst, n }, rv = { src, n };
		double t = now_ns();
		if (process_vm_readv(child, &l, 1, &rv, 1, 0) != (ssize_t)n)
			return -1;
		t = now_ns() - t;
		if (t < best)
			best = t;
	}
	return best;
}

/* ns to move n bytes as Buffer Copy would: copy in, copy out. */
static double time_bcopy(sdp_copy_fn f, char *dst, const char *src, char *ring,
			 size_t n, size_t piece)
{
	double best = 1e30;
	for (int r = 0; r < 3; r++) {
		double t = now_ns();
		size_t stride = (piece + 16 + 4095) & ~(size_t)4095, ro = 0;
		for (size_t o = 0; o < n; o += piece) {
			size_t k = n - o < piece ? n - o : piece;
			if (ro + stride > (2u << 20))
				ro = 0;
			char *slot = ring + ro;       /* 16 bytes into a slot */
			ro += stride;
			f(slot, src + o, k);
			f(dst + o, slot, k);
		}
		t = now_ns() - t;
		if (t < best)
			best = t;
	}
	return best;
}

/* 4.: what the AZ costs are measured with: the child holding src (page-
 * aligned; dst is the receiver's buffer), or a simulated host's model. */
struct az_meter {
	pid_t  child;
	char  *dst, *src;
	bool   fake;
	double gbps, fixed_us, page_us;    /* the model */
};

static double meter_copy(const struct az_meter *m, size_t n)
{
	if (m->fake)
		return (double)n / (m->gbps * 1000);
	time_cma(m->child, m->dst, m->src, n, 1);          /* warm */
	double ns = time_cma(m->child, m->dst, m->src, n, 3);
	return ns < 0 ? -1 : ns / 1000;
}

static double meter_cycle(const struct az_meter *m, int mech, size_t n)
{
	if (m->fake)
		return m->fixed_us + m->page_us * (double)(n / 4096);
	return az_cycle_us(mech, n, 3);
}

/* The smallest index of az[] from which on (to 4 MiB) the copy costs more
 * than mech's cycle, or -1. */
static int table_pick(const struct sdp_calib *c, int mech)
{
	int pick = -1;
	for (int i = c->naz - 1; i >= 0; i--) {
		double cyc = mech == 2 ? c->az[i].uffd_us : c->az[i].mprotect_us;
		if (cyc < 0 || c->az[i].copy_us <= cyc)
			break;
		pick = i;
	}
	return pick;
}

static void measure_az(const struct az_meter *m, struct sdp_calib *o)
{
	o->naz = 0;
	memset(o->az_fine, 0, sizeof o->az_fine);
	for (int i = 0; i < SDP_CALIB_AZ_SIZES; i++) {
		size_t n = (size_t)8192 << i;
		double cp = meter_copy(m, n);
		if (cp < 0)
			return;
		o->az[i].bytes = (uint32_t)n;
		o->az[i].copy_us = cp;
		o->az[i].mprotect_us = meter_cycle(m, 1, n);
		o->az[i].uffd_us = meter_cycle(m, 2, n);
		o->naz = i + 1;
	}
	/* Between the size below the table's pick and the pick, in pages:
	 * the cycle need not grow with the pages (x86 flushes up to 33 pages
	 * from the TLB one by one, more with one flush: in a VM 34 pages
	 * cost a quarter of 33), so the doubling sizes may overshoot. */
	for (int mech = 1; mech <= 2; mech++) {
		int at = table_pick(o, mech);
		if (at <= 0)
			continue;
		struct sdp_az_fine *f = &o->az_fine[mech];
		f->lo_pages = o->az[at - 1].bytes / 4096;
		f->hi_pages = o->az[at].bytes / 4096;
		f->lo_copy_us = o->az[at - 1].copy_us;
		f->hi_copy_us = o->az[at].copy_us;
		f->lo_cycle_us = mech == 2 ? o->az[at - 1].uffd_us : o->az[at - 1].mprotect_us;
		f->hi_cycle_us = mech == 2 ? o->az[at].uffd_us : o->az[at].mprotect_us;
		while (f->hi_pages - f->lo_pages > 1) {
			uint32_t mid = (f->lo_pages + f->hi_pages) / 2;
			double cp = meter_copy(m, (size_t)mid * 4096);
			double cy = meter_cycle(m, mech, (size_t)mid * 4096);
			if (cp < 0 || cy < 0)
				break;
			if (cp > cy) {
				f->hi_pages = mid;
				f->hi_copy_us = cp;
				f->hi_cycle_us = cy;
			} else {
				f->lo_pages = mid;
				f->lo_copy_us = cp;
				f->lo_cycle_us = cy;
			}
		}
	}
}

/*
 * The sink reads the source as the peer's process would be read: a forked
 * child holds the source buffer. The threshold is the smallest size where
 * zero copy (plus ZC_HANDSHAKE_NS, plus the bounce copy where aliased
 * buffers bounce) is clearly cheaper than Buffer Copy; 0 if none up to
 * 8 MiB or if CMA is refused.
 */
static void measure_cma(uint32_t slot_size, bool fake_cma, bool with_az,
			struct sdp_calib *o)
{
	size_t max = 8u << 20;
	char *a = aligned_alloc(4096, max + 8192), *b = aligned_alloc(4096, max + 8192);
	char *ring = aligned_alloc(4096, (2u << 20) + 4096);
	int go[2] = { -1, -1 };
	pid_t child = -1;
	o->zcopy_thresh = 0;
	o->cma_ok = false;
	if (!a || !b || !ring || pipe2(go, O_CLOEXEC) < 0)
		goto out;
	memset(a, 1, max + 8192);
	memset(b, 2, max + 8192);
	memset(ring, 3, (2u << 20) + 4096);
	/* The raw system call: not the switch's fork() (which would count
	 * this child as holding every connection), no atfork handlers. */
	child = (pid_t)syscall(SYS_fork);
	if (child == 0) {
		char c;
		sys_close(go[1]);
		long r = sys_read(go[0], &c, 1);   /* hold `a` until told */
		syscall(SYS_exit_group, r < 0);
	}
	if (child < 0)
		goto out;
	/* Aliasing: 64 KiB at the same offset vs 2 KiB apart. */
	double same = time_cma(child, b + 16, a + 16, 65536, 5);
	double shifted = time_cma(child, b + 2064, a + 16, 65536, 5);
	if (same < 0 || shifted < 0)
		goto out;                     /* CMA refused: never */
	o->cma_ok = true;
	if (!fake_cma) {
		o->cma_gbps_same = 65536 / same;
		o->cma_gbps_shifted = 65536 / shifted;
	}
	o->cma_alias = o->cma_gbps_same < 0.6 * o->cma_gbps_shifted;
	if (with_az) {               /* at an offset zero copy reads directly */
		struct az_meter m = { .child = child, .dst = b + (o->cma_alias ? 2064 : 16),
				      .src = a };
		measure_az(&m, o);
	}
	const struct sdp_copy_impl *ci = sdp_copy_find(o->copy);
	sdp_copy_fn f = ci ? ci->fn : sdp_copy_impls(&(int){ 0 })[0].fn;
	size_t piece = slot_size > 64 ? slot_size - 16 : 1024;
	for (size_t n = 16384; n <= max; n *= 2) {
		time_bcopy(f, b + 16, a + 16, ring + 16, n, piece);   /* warm */
		double bc = time_bcopy(f, b + 16, a + 16, ring + 16, n, piece);
		/* Large malloc'd buffers sit 16 bytes into a page on both
		 * sides: the aliased case is the common one. */
		double zc = o->cma_alias ? time_cma(child, b + 2064, a + 16, n, 3) : 
			    time_cma(child, b + 16, a + 16, n, 3);
		if (zc < 0)
			break;
		if (o->cma_alias) {
			double t = now_ns();
			f(a + 16, b + 2064, n);   /* the bounce copy (a: ours, not the child's) */
			zc += now_ns() - t;
		}
		zc += ZC_HANDSHAKE_NS;
		if (zc < bc * 0.9) {
			o->zcopy_thresh = (uint32_t)n;
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
}

/* ---- fake numbers (tests) ----------------------------------------------- */

/* "copy=libc:1.0,avx2:9.5;cma=1.2:5.1;az=16:2:0.1": returns which parts
 * were given (1: copy, 2: cma, 4: az). */
static int parse_fake(const char *s, struct sdp_calib *o)
{
	int got = 0;
	char buf[512];
	snprintf(buf, sizeof buf, "%s", s);
	for (char *part = strtok(buf, ";"); part; part = strtok(NULL, ";")) {
		if (!strncmp(part, "copy=", 5)) {
			int n;
			const struct sdp_copy_impl *im = sdp_copy_impls(&n);
			o->ncopy = 0;
			for (char *e = part + 5; *e && o->ncopy < SDP_COPY_MAX;) {
				char name[16];
				double g;
				int used;
				if (sscanf(e, "%15[^:]:%lf%n", name, &g, &used) != 2)
					break;
				for (int i = 0; i < n; i++)
					if (!strcmp(im[i].name, name) && im[i].usable()) {
						snprintf(o->copy_speed[o->ncopy].name,
							 sizeof o->copy_speed[0].name, "%s", name);
						o->copy_speed[o->ncopy++].gbps = g;
					}
				e += used;
				if (*e == ',')
					e++;
			}
			got |= 1;
		} else if (!strncmp(part, "cma=", 4) &&
			   sscanf(part + 4, "%lf:%lf", &o->cma_gbps_same,
				  &o->cma_gbps_shifted) == 2) {
			got |= 2;
		} else if (!strncmp(part, "az=", 3)) {
			/* copies at GBPS, a cycle of FIXED_US + PAGE_US a page
			 * by either mechanism */
			struct az_meter m = { .fake = true };
			if (sscanf(part + 3, "%lf:%lf:%lf", &m.gbps, &m.fixed_us,
				   &m.page_us) == 3 && m.gbps > 0) {
				measure_az(&m, o);
				got |= 4;
			}
		}
	}
	return got;
}

/* ---- the cache file ----------------------------------------------------- */

static bool cache_read(struct sdp_calib *o, bool with_az)
{
	char buf[4096];
	int fd = sys_open(o->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return false;
	ssize_t n = sys_read(fd, buf, sizeof buf - 1);
	sys_close(fd);
	if (n <= 0)
		return false;
	buf[n] = 0;
	int have = 0;
	char *save = NULL;
	for (char *l = strtok_r(buf, "\n", &save); l; l = strtok_r(NULL, "\n", &save)) {
		if (!strcmp(l, CALIB_MAGIC)) {
			have |= 1;
		} else if (!strncmp(l, "host ", 5)) {
			if (strcmp(l + 5, o->host))
				return false;
			have |= 2;
		} else if (sscanf(l, "zcopy_thresh %u", &o->zcopy_thresh) == 1) {
			have |= 4;
		} else if (!strncmp(l, "copy ", 5) && sscanf(l + 5, "%15s", o->copy) == 1) {
			have |= 8;
		} else if (!strncmp(l, "cma ", 4)) {
			int ok, al;
			if (sscanf(l + 4, "%d %d %lf %lf", &ok, &al, &o->cma_gbps_same,
				   &o->cma_gbps_shifted) != 4)
				return false;
			o->cma_ok = ok;
			o->cma_alias = al;
			have |= 16;
		} else if (!strncmp(l, "az ", 3) && o->naz < SDP_CALIB_AZ_SIZES) {
			int i = o->naz;
			if (sscanf(l + 3, "%u %lf %lf %lf", &o->az[i].bytes, &o->az[i].copy_us,
				   &o->az[i].mprotect_us, &o->az[i].uffd_us) != 4 ||
			    o->az[i].bytes != 8192u << i)
				return false;
			o->naz++;
		} else if (!strncmp(l, "az_fine ", 8)) {
			int mech;
			struct sdp_az_fine f;
			if (sscanf(l + 8, "%d %u %lf %lf %u %lf %lf", &mech, &f.lo_pages,
				   &f.lo_copy_us, &f.lo_cycle_us, &f.hi_pages, &f.hi_copy_us,
				   &f.hi_cycle_us) == 7 && (mech == 1 || mech == 2) &&
			    f.lo_pages < f.hi_pages)
				o->az_fine[mech] = f;
		} else if (!strncmp(l, "copy_gbps ", 10)) {
			char *e = l + 10;
			o->ncopy = 0;
			char name[16];
			double g;
			int used;
			while (o->ncopy < SDP_COPY_MAX &&
			       sscanf(e, " %15s %lf%n", name, &g, &used) == 2) {
				snprintf(o->copy_speed[o->ncopy].name,
					 sizeof o->copy_speed[0].name, "%s", name);
				o->copy_speed[o->ncopy++].gbps = g;
				e += used;
			}
		}
	}
	const struct sdp_copy_impl *c = sdp_copy_find(o->copy);
	return have == 31 && c && c->usable() &&
	       (!with_az || o->naz == SDP_CALIB_AZ_SIZES || !o->cma_ok);
}

static void cache_write(const struct sdp_calib *o)
{
	char dir[512];
	snprintf(dir, sizeof dir, "%s", o->path);
	char *slash = strrchr(dir, '/');
	if (slash) {
		*slash = 0;
		mkdir(dir, 0700);
	}
	char out[4096];
	int n = snprintf(out, sizeof out, "%s\nhost %s\nzcopy_thresh %u\ncopy %s\n"
			 "cma %d %d %.3f %.3f\ncopy_gbps", CALIB_MAGIC, o->host,
			 o->zcopy_thresh, o->copy, o->cma_ok, o->cma_alias,
			 o->cma_gbps_same, o->cma_gbps_shifted);
	for (int i = 0; i < o->ncopy && n > 0 && (size_t)n < sizeof out; i++)
		n += snprintf(out + n, sizeof out - (size_t)n, " %s %.3f",
			      o->copy_speed[i].name, o->copy_speed[i].gbps);
	for (int i = 0; i < o->naz && n > 0 && (size_t)n < sizeof out; i++)
		n += snprintf(out + n, sizeof out - (size_t)n, "\naz %u %.3f %.3f %.3f",
			      o->az[i].bytes, o->az[i].copy_us, o->az[i].mprotect_us,
			      o->az[i].uffd_us);
	for (int m = 1; m <= 2 && n > 0 && (size_t)n < sizeof out; m++) {
		const struct sdp_az_fine *f = &o->az_fine[m];
		if (f->hi_pages)
			n += snprintf(out + n, sizeof out - (size_t)n,
				      "\naz_fine %d %u %.3f %.3f %u %.3f %.3f", m, f->lo_pages,
				      f->lo_copy_us, f->lo_cycle_us, f->hi_pages, f->hi_copy_us,
				      f->hi_cycle_us);
	}
	if (n <= 0 || (size_t)n >= sizeof out - 2)
		return;
	out[n++] = '\n';
	char tmp[600];
	snprintf(tmp, sizeof tmp, "%s.%d", o->path, (int)getpid());
	/* Never follow a link someone planted (the cache may be in /tmp). */
	int fd = sys_open_mode(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return;
	bool ok = sys_write(fd, out, (size_t)n) == n;
	sys_close(fd);
	if (ok)
		rename(tmp, o->path);
	else
		unlink(tmp);
}

static void calib_get(uint32_t slot_size, bool force, bool with_az, struct sdp_calib *o)
{
	memset(o, 0, sizeof *o);
	cache_path(o->path, sizeof o->path);
	host_key(o->host, sizeof o->host);
	const char *fake = getenv("SDP_CALIB_FAKE");
	int faked = fake && *fake ? parse_fake(fake, o) : 0;
	o->faked = faked != 0;
	if (!faked && !force && cache_read(o, with_az)) {
		o->cached = true;
		return;
	}
	if (!(faked & 1))
		measure_copy(slot_size, o);
	choose_copy(o);
	measure_cma(slot_size, faked & 2, with_az && !(faked & 4), o);
	if (!faked)
		cache_write(o);
}

void sdp_calib_get(uint32_t slot_size, bool force, struct sdp_calib *o)
{
	calib_get(slot_size, force, sdp_tun.azcopy != 0, o);
}

void sdp_calib_get_az(uint32_t slot_size, bool force, struct sdp_calib *o)
{
	calib_get(slot_size, force, true, o);
}

uint32_t sdp_calib_az_thresh(const struct sdp_calib *c, int mech, struct sdp_az_choice *why)
{
	struct sdp_az_choice w = { 0 };
	int at = mech == 1 || mech == 2 ? table_pick(c, mech) : -1;
	if (at >= 0) {
		const struct sdp_az_fine *f = &c->az_fine[mech];
		w.at_pages = c->az[at].bytes / 4096;
		w.at_copy_us = c->az[at].copy_us;
		w.at_cycle_us = mech == 2 ? c->az[at].uffd_us : c->az[at].mprotect_us;
		if (at > 0) {
			w.below_pages = c->az[at - 1].bytes / 4096;
			w.below_copy_us = c->az[at - 1].copy_us;
			w.below_cycle_us = mech == 2 ? c->az[at - 1].uffd_us :
					   c->az[at - 1].mprotect_us;
		}
		/* The refinement, if it belongs to this pick. */
		if (f->hi_pages && f->lo_pages >= w.below_pages && f->hi_pages <= w.at_pages &&
		    f->lo_pages < f->hi_pages) {
			w.at_pages = f->hi_pages;
			w.at_copy_us = f->hi_copy_us;
			w.at_cycle_us = f->hi_cycle_us;
			w.below_pages = f->lo_pages;
			w.below_copy_us = f->lo_copy_us;
			w.below_cycle_us = f->lo_cycle_us;
		}
		/* A send of this many bytes has at_pages whole pages wherever
		 * it starts (malloc'd buffers start 16 bytes into a page). */
		w.thresh = (w.at_pages + 1) * 4096;
	}
	if (why)
		*why = w;
	return w.thresh;
}
