/*
 * azprot.c - Asynchronous Zero Copy: the pages in flight and their
 * protection (az.h).
 *
 * A span is a run of whole pages protected for one reason: advertised by
 * sends (AZ_SEND: writes fault) or the target of an asynchronous receive
 * (AZ_RECV: every access faults). Spans never overlap; a send whose pages
 * are already in a span (the same buffer sent again before it was read)
 * adds a user to it. Protection is by mprotect (faults are SIGSEGV, which
 * this file takes before the application's handler and hands on when the
 * fault is not ours) or by userfaultfd write-protect (faults go to the
 * progress thread, azprog.c, and the kernel's own accesses wait for it
 * instead of failing with EFAULT). Which one is measured at the first use
 * (azcal.c); a mapping userfaultfd cannot write-protect uses mprotect.
 *
 * The library's own memory, the calling thread's stack, shared mappings
 * (another process could write them) and pages the application made
 * unreadable are never protected (the send uses synchronous zero copy
 * then); pages already read-only are advertised as they are and left so.
 *
 * Every structure here is private to the process and guarded by one lock,
 * taken with all signals blocked: a signal handler of the application that
 * touches a protected page then never finds the lock held by its own
 * thread. Nothing under the lock touches the application's pages except
 * to read them (copy-on-write), and nothing under it waits for a peer.
 */
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>
#include <linux/userfaultfd.h>

#include "sdp/az.h"
#include "sdp/log.h"
#include "sdp/sys.h"

#define PAGE 4096ul
#define PG_DOWN(a) ((uintptr_t)(a) & ~(PAGE - 1))
#define PG_UP(a) (((uintptr_t)(a) + PAGE - 1) & ~(PAGE - 1))

/* How long a write waits in the fault for the peer's read before it copies
 * the advertisement aside anyway (block-on-write): a peer that does not
 * read (it waits for us, or computes) must not stop the writer for good. */
#define AZ_BLOCK_MS 50

struct az_span {
	uintptr_t start, end;      /* page-aligned */
	uint32_t  users;           /* advertisements / receives holding it */
	uint8_t   kind;            /* enum az_kind */
	uint8_t   mech;            /* enum az_mech protecting it now */
	uint8_t   prot;            /* the application's PROT_* (restored) */
	uint8_t   pad;
};

#define MAX_SPANS 4096
static struct az_span *spans;           /* sorted by start */
static size_t nspans;
_Atomic int az_nspans;                  /* nspans, for lock-free looks */

static pthread_mutex_t lk = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static _Atomic int mech_chosen = -1;
static struct az_calib calib;

/* The library's own memory (never protected). */
#define MAX_LIB 64
static struct { uintptr_t start, end; } lib[MAX_LIB];
static int nlib;

/* Recently unprotected runs: a fault the kernel raised just before one of
 * them was lifted is retried, not handed to the application. */
#define RECENT 256
static struct { uintptr_t start, end; } recent[RECENT];
static unsigned recent_n;

/* Ranges registered with the userfaultfd for write-protect. */
#define MAX_REG 512
static struct { uintptr_t start, end; } reg[MAX_REG];
static int nreg;
static uint64_t uffd_features;

void az_lock(sigset_t *saved)
{
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, saved);
	pthread_mutex_lock(&lk);
}

void az_unlock(const sigset_t *saved)
{
	pthread_mutex_unlock(&lk);
	pthread_sigmask(SIG_SETMASK, saved, NULL);
}

bool az_on(void)
{
	return sdp_tun.azcopy != 0;
}

/* Under the lock. */
void az_lib_add(uintptr_t start, size_t len)
{
	if (nlib < MAX_LIB) {
		lib[nlib].start = start;
		lib[nlib].end = start + len;
		nlib++;
	}
}

void az_lib_range(uintptr_t start, size_t len)
{
	sigset_t ss;
	az_lock(&ss);
	az_lib_add(start, len);
	az_unlock(&ss);
}

static bool lib_overlap(uintptr_t s, uintptr_t e)
{
	for (int i = 0; i < nlib; i++)
		if (s < lib[i].end && lib[i].start < e)
			return true;
	return false;
}

/* Under the lock. */
void az_lib_forget(uintptr_t s)
{
	for (int i = 0; i < nlib; i++)
		if (lib[i].start == s) {
			lib[i] = lib[--nlib];
			return;
		}
}

/* ---- the application's mappings (/proc/self/maps) ----------------------- */

/* What the maps file says of one mapping. */
struct vma {
	uintptr_t start, end;
	uint8_t prot;              /* PROT_* */
	bool shared;               /* MAP_SHARED */
	bool special;              /* [stack], [vvar], [vdso], the library's file */
};

#define VMA_CACHE 16
static struct vma vcache[VMA_CACHE];
static int nvcache, vnext;
static char maps_buf[16384];
static uintptr_t self_text;            /* an address inside libsdp */

static uintptr_t hex(const char **p)
{
	uintptr_t v = 0;
	for (;;) {
		char ch = **p;
		int d = ch >= '0' && ch <= '9' ? ch - '0' : ch >= 'a' && ch <= 'f' ? ch - 'a' + 10 : -1;
		if (d < 0)
			return v;
		v = v * 16 + (uintptr_t)d;
		(*p)++;
	}
}

/* One line of maps (NUL-terminated): the mapping, if addr is inside. */
static bool parse_line(const char *l, uintptr_t addr, struct vma *v, uintptr_t *lib_s,
		       uintptr_t *lib_e)
{
	const char *p = l;
	uintptr_t s = hex(&p);
	if (*p++ != '-')
		return false;
	uintptr_t e = hex(&p);
	if (*p++ != ' ' || !p[0] || !p[1] || !p[2] || !p[3])
		return false;
	bool in = addr >= s && addr < e;
	bool mine = self_text >= s && self_text < e;
	const char *path = strchr(p, '/');
	const char *br = strchr(p, '[');
	if (mine && path && lib_s) {
		/* the library's file: every mapping of it is special */
		*lib_s = s;
		*lib_e = e;
	}
	if (!in)
		return false;
	v->start = s;
	v->end = e;
	v->prot = (uint8_t)((p[0] == 'r' ? PROT_READ : 0) | (p[1] == 'w' ? PROT_WRITE : 0) |
			    (p[2] == 'x' ? PROT_EXEC : 0));
	v->shared = p[3] == 's';
	v->special = mine || (br && (!strncmp(br, "[stack", 6) || !strncmp(br, "[vvar", 5) ||
				     !strncmp(br, "[vdso", 5) || !strncmp(br, "[vsys", 5)));
	if (path && !mine && strstr(path, "libsdp.so"))
		v->special = true;
	return true;
}

/* The mapping holding addr, read from /proc/self/maps (under the lock). */
static bool vma_read(uintptr_t addr, struct vma *out)
{
	int fd = sys_open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return false;
	bool found = false;
	size_t have = 0;
	for (;;) {
		ssize_t n = sys_read(fd, maps_buf + have, sizeof maps_buf - 1 - have);
		if (n <= 0)
			break;
		have += (size_t)n;
		maps_buf[have] = 0;
		char *l = maps_buf, *nl;
		while ((nl = strchr(l, '\n'))) {
			*nl = 0;
			if (parse_line(l, addr, out, NULL, NULL)) {
				found = true;
				break;
			}
			l = nl + 1;
		}
		if (found)
			break;
		have = (size_t)(maps_buf + have - l);
		memmove(maps_buf, l, have);
		if (have >= sizeof maps_buf - 1)
			have = 0;              /* a line longer than the buffer */
	}
	sys_close(fd);
	return found;
}

static bool vma_of(uintptr_t addr, struct vma *out)
{
	for (int i = 0; i < nvcache; i++)
		if (addr >= vcache[i].start && addr < vcache[i].end) {
			*out = vcache[i];
			return true;
		}
	if (!vma_read(addr, out))
		return false;
	vcache[vnext] = *out;
	vnext = (vnext + 1) % VMA_CACHE;
	if (nvcache < VMA_CACHE)
		nvcache++;
	return true;
}

/* The application changed its mappings (the switch's mmap, munmap,
 * mprotect, mremap). */
static void vma_forget(void)
{
	nvcache = 0;
	vnext = 0;
}

/* The application's protection of [s, e) if it is one kind of private,
 * readable memory; -1 if it may not be protected. Pages inside spans are
 * ours now: only the gaps are looked up. */
static int app_prot(uintptr_t s, uintptr_t e)
{
	int prot = -1;
	while (s < e) {
		struct vma v;
		if (!vma_of(s, &v) || v.shared || v.special || !(v.prot & PROT_READ))
			return -1;
		if (prot >= 0 && prot != v.prot)
			return -1;
		prot = v.prot;
		s = v.end;
	}
	return prot;
}

/* ---- spans ----------------------------------------------------------------- */

static void reg_count(void);
static void az_envelope(void);

/* Index of the span containing addr, or -1; *at: where it would go. */
static int span_find_at(uintptr_t addr, size_t *at)
{
	size_t lo = 0, hi = nspans;
	while (lo < hi) {
		size_t mid = (lo + hi) / 2;
		if (spans[mid].end <= addr)
			lo = mid + 1;
		else
			hi = mid;
	}
	if (at)
		*at = lo;
	return lo < nspans && spans[lo].start <= addr ? (int)lo : -1;
}

static int span_find(uintptr_t addr)
{
	return span_find_at(addr, NULL);
}

static int span_insert(size_t at, const struct az_span *sp)
{
	if (nspans >= MAX_SPANS)
		return -ENOMEM;
	memmove(&spans[at + 1], &spans[at], (nspans - at) * sizeof *spans);
	spans[at] = *sp;
	nspans++;
	reg_count();
	return 0;
}

static void span_remove(size_t at)
{
	memmove(&spans[at], &spans[at + 1], (nspans - at - 1) * sizeof *spans);
	nspans--;
	reg_count();
}

/* Split the span containing addr (if any) so that one starts at addr. */
static int span_split(uintptr_t addr)
{
	int i = span_find(addr);
	if (i < 0 || spans[i].start == addr)
		return 0;
	struct az_span b = spans[i];
	b.start = addr;
	spans[i].end = addr;
	return span_insert((size_t)i + 1, &b);
}

static void recent_add(uintptr_t s, uintptr_t e)
{
	recent[recent_n % RECENT].start = s;
	recent[recent_n % RECENT].end = e;
	recent_n++;
}

static bool recent_has(uintptr_t a)
{
	for (unsigned i = 0; i < RECENT && i < recent_n; i++)
		if (a >= recent[i].start && a < recent[i].end)
			return true;
	return false;
}

/* ---- the mechanisms ---------------------------------------------------- */

static void choose(void)
{
	if (!spans) {
		void *p = az_mmap(MAX_SPANS * sizeof *spans);
		if (p == MAP_FAILED) {
			atomic_store(&mech_chosen, AZ_MECH_NONE);
			return;
		}
		spans = p;
		az_lib_range((uintptr_t)p, MAX_SPANS * sizeof *spans);
	}
	az_calibrate(&calib, false);
	int m = calib.choice;
	if (m == AZ_MECH_UFFD && az_prog_uffd() < 0) {
		sdp_log(1, "asynchronous zero copy: no userfaultfd, using mprotect");
		m = AZ_MECH_MPROTECT;
	}
	sdp_log(2, "asynchronous zero copy protects with %s (%s)",
		m == AZ_MECH_UFFD ? "userfaultfd" : "mprotect", calib.why);
	atomic_store(&mech_chosen, m);
}

int az_mech_default(void)
{
	int m = atomic_load_explicit(&mech_chosen, memory_order_acquire);
	if (m >= 0)
		return m;
	pthread_once(&once, choose);
	return atomic_load(&mech_chosen);
}

/* What the memory calls look at without the lock: how many spans and
 * registrations there are, and the addresses they lie between. */
static _Atomic uintptr_t env_lo, env_hi;

static void az_envelope(void)
{
	uintptr_t lo = UINTPTR_MAX, hi = 0;
	if (nspans) {
		lo = spans[0].start;
		hi = spans[nspans - 1].end;
	}
	for (int i = 0; i < nreg; i++) {
		if (reg[i].start < lo)
			lo = reg[i].start;
		if (reg[i].end > hi)
			hi = reg[i].end;
	}
	atomic_store(&env_lo, lo);
	atomic_store(&env_hi, hi);
	atomic_store(&az_nspans, (int)(nspans + (size_t)nreg));
}

static bool reg_has(uintptr_t s, uintptr_t e)
{
	for (int i = 0; i < nreg; i++)
		if (reg[i].start <= s && e <= reg[i].end)
			return true;
	return false;
}

static void reg_count(void)
{
	az_envelope();
}

/* The kernel dropped our registrations of [s, e) (the memory was unmapped
 * or registered anew): forget them. */
static void reg_forget(uintptr_t s, uintptr_t e)
{
	for (int i = 0; i < nreg;)
		if (s < reg[i].end && reg[i].start < e)
			reg[i] = reg[--nreg];
		else
			i++;
	reg_count();
}

/* Undo our registrations of [s, e): a registered range splits the
 * application's mapping, and mremap refuses to move or grow a range that
 * spans mappings. Parts of them outside [s, e) stay registered. */
static void reg_undo(uintptr_t s, uintptr_t e)
{
	for (int i = 0; i < nreg;) {
		uintptr_t a = reg[i].start > s ? reg[i].start : s;
		uintptr_t b = reg[i].end < e ? reg[i].end : e;
		if (a >= b) {
			i++;
			continue;
		}
		struct uffdio_range u = { a, b - a };
		if (az_uffd >= 0)
			az_ioctl(az_uffd, UFFDIO_UNREGISTER, &u);
		uintptr_t rs = reg[i].start, re = reg[i].end;
		reg[i] = reg[--nreg];
		if (rs < a && nreg < MAX_REG) {
			reg[nreg].start = rs;
			reg[nreg].end = a;
			nreg++;
		}
		if (b < re && nreg < MAX_REG) {
			reg[nreg].start = b;
			reg[nreg].end = re;
			nreg++;
		}
	}
	reg_count();
}

static int uffd_register(uintptr_t s, uintptr_t e)
{
	if (reg_has(s, e))
		return 0;
	struct uffdio_register r = {
		.range = { s, e - s }, .mode = UFFDIO_REGISTER_MODE_WP,
	};
	if (az_ioctl(az_uffd, UFFDIO_REGISTER, &r) < 0)
		return -errno;
	/* Keep it (a registration costs as much as a protect); merge with
	 * a neighbour. */
	for (int i = 0; i < nreg; i++)
		if (reg[i].end == s || reg[i].start == e) {
			if (reg[i].end == s)
				reg[i].end = e;
			else
				reg[i].start = s;
			return 0;
		}
	if (nreg < MAX_REG) {
		reg[nreg].start = s;
		reg[nreg].end = e;
		nreg++;
		reg_count();
	} else {
		/* No room to remember it: undo it when it is unprotected. */
		struct uffdio_range u = { s, e - s };
		(void)u;
	}
	return 0;
}

static int uffd_wp(uintptr_t s, uintptr_t e, bool on)
{
	struct uffdio_writeprotect wp = {
		.range = { s, e - s }, .mode = on ? UFFDIO_WRITEPROTECT_MODE_WP : 0,
	};
	return az_ioctl(az_uffd, UFFDIO_WRITEPROTECT, &wp) < 0 ? -errno : 0;
}

/* Protect span sp with mechanism m: 0 or -errno. */
static int protect(struct az_span *sp, int m)
{
	if (sp->kind == AZ_RECV) {
		/* An asynchronous receive: its pages are dropped (the copy
		 * fills every byte of them) and every access, the kernel's
		 * too, waits in a missing-page fault until the progress
		 * thread has put the data there (UFFDIO_COPY). */
		if (az_prog_uffd() < 0)
			return -ENOSYS;
		struct uffdio_register r = {
			.range = { sp->start, sp->end - sp->start },
			.mode = UFFDIO_REGISTER_MODE_MISSING,
		};
		if (az_ioctl(az_uffd, UFFDIO_REGISTER, &r) < 0)
			return -errno;
		if (az_madvise(sp->start, sp->end - sp->start, MADV_DONTNEED) < 0) {
			int e = -errno;
			struct uffdio_range u = { sp->start, sp->end - sp->start };
			az_ioctl(az_uffd, UFFDIO_UNREGISTER, &u);
			return e;
		}
		reg_forget(sp->start, sp->end);
		sp->mech = AZ_MECH_UFFD;
		return 0;
	}
	if (!(sp->prot & PROT_WRITE)) {
		sp->mech = AZ_MECH_NONE;       /* the application made it read-only */
		return 0;
	}
	if (m == AZ_MECH_UFFD && az_prog_uffd() >= 0) {
		if (!(uffd_features & AZ_UFFD_WP_UNPOPULATED)) {
			/* Pages never touched have nothing to protect
			 * yet: map them (the zero page) first. */
			for (uintptr_t a = sp->start; a < sp->end; a += PAGE)
				(void)*(volatile const char *)a;
		}
		int r = uffd_register(sp->start, sp->end);
		if (r == 0) {
			r = uffd_wp(sp->start, sp->end, true);
			if (r < 0) {
				/* Its registration went (an unmap we did not
				 * see): once more. */
				reg_forget(sp->start, sp->end);
				r = uffd_register(sp->start, sp->end);
				if (r == 0)
					r = uffd_wp(sp->start, sp->end, true);
			}
		}
		if (r == 0) {
			sp->mech = AZ_MECH_UFFD;
			return 0;
		}
		/* A mapping userfaultfd cannot write-protect (a private
		 * file mapping): mprotect it. */
	}
	int prot = sp->kind == AZ_RECV ? PROT_NONE : (sp->prot & ~PROT_WRITE);
	az_segv_install();
	if (az_mprotect(sp->start, sp->end - sp->start, prot) < 0)
		return -errno;
	sp->mech = AZ_MECH_MPROTECT;
	return 0;
}

static void unprotect(struct az_span *sp)
{
	if (sp->mech == AZ_MECH_MPROTECT) {
		az_mprotect(sp->start, sp->end - sp->start, sp->prot);
	} else if (sp->mech == AZ_MECH_UFFD && sp->kind == AZ_RECV && az_uffd >= 0) {
		/* Filled (or poisoned: the data was lost): plain memory again. */
		struct uffdio_range u = { sp->start, sp->end - sp->start };
		az_ioctl(az_uffd, UFFDIO_UNREGISTER, &u);
	} else if (sp->mech == AZ_MECH_UFFD && az_uffd >= 0) {
		uffd_wp(sp->start, sp->end, false);   /* wakes whoever waits */
	}
	if (sp->mech != AZ_MECH_NONE)
		recent_add(sp->start, sp->end);
	sp->mech = AZ_MECH_NONE;
}

/* Unprotect and forget span i. */
static void span_lift(size_t i)
{
	unprotect(&spans[i]);
	span_remove(i);
}

int az_span_hold(uintptr_t start, uintptr_t end, int kind)
{
	/* chosen before the lock was taken (az_mech_default) */
	int m = atomic_load(&mech_chosen);
	if (m == AZ_MECH_NONE || !spans || start >= end)
		return -ENOSYS;
	if (lib_overlap(start, end))
		return -EPERM;
	/* The gaps must be private, readable memory; spans already there
	 * must be of the same kind. */
	uintptr_t a = start;
	while (a < end) {
		size_t at;
		int i = span_find_at(a, &at);
		if (i >= 0) {
			if (spans[i].kind != kind || kind == AZ_RECV)
				return -EBUSY;
			a = spans[i].end;
			continue;
		}
		uintptr_t ge = at < nspans && spans[at].start < end ? spans[at].start : end;
		int prot = app_prot(a, ge);
		if (prot < 0 || (kind == AZ_RECV && !(prot & PROT_WRITE)))
			return -EPERM;
		a = ge;
	}
	int r = span_split(start);
	if (!r)
		r = span_split(end);
	if (r)
		return r;
	/* Fill the gaps, then protect what is new and count the users. */
	a = start;
	while (a < end) {
		size_t at;
		int i = span_find_at(a, &at);
		if (i >= 0) {
			a = spans[i].end;
			continue;
		}
		uintptr_t ge = at < nspans && spans[at].start < end ? spans[at].start : end;
		struct az_span sp = { .start = a, .end = ge, .kind = (uint8_t)kind,
				      .prot = (uint8_t)app_prot(a, ge) };
		r = span_insert(at, &sp);
		if (r)
			break;
		a = ge;
	}
	uintptr_t done = start;
	if (!r) {
		for (int i = span_find(start); i >= 0 && (size_t)i < nspans &&
		     spans[i].start < end; i++) {
			struct az_span *sp = &spans[i];
			if (sp->users == 0 && sp->mech == AZ_MECH_NONE) {
				r = protect(sp, m);
				if (r)
					break;
			}
			sp->users++;
			done = sp->end;
		}
	}
	if (r) {
		/* Undo: the users counted so far, and gaps left bare. */
		az_span_put(start, done);
		for (size_t i = 0; i < nspans;)
			if (spans[i].users == 0 && spans[i].mech == AZ_MECH_NONE)
				span_remove(i);
			else
				i++;
		return r;
	}
	return 0;
}

void az_span_put(uintptr_t start, uintptr_t end)
{
	for (int i = span_find(start); i >= 0 && (size_t)i < nspans && spans[i].start < end;) {
		struct az_span *sp = &spans[i];
		if (sp->users)
			sp->users--;
		/* A send span with nobody on it: mprotect's is lifted now, as
		 * the kernel's own accesses fail on it; a userfaultfd one stays
		 * until the next write faults (cheaply) or the next send of the
		 * same buffer finds it protected already. */
		if (sp->users == 0 && (sp->mech != AZ_MECH_UFFD || sp->kind != AZ_SEND)) {
			span_lift((size_t)i);
			continue;
		}
		i++;
	}
}

void az_span_drop(uintptr_t start, uintptr_t end)
{
	if (span_split(start) || span_split(end)) {
		/* No room to split: lift the whole spans involved. */
		start = PG_DOWN(start);
	}
	for (size_t i = 0; i < nspans;) {
		if (spans[i].start < end && start < spans[i].end)
			span_lift(i);
		else
			i++;
	}
}

/* ---- faults ------------------------------------------------------------- */

enum { FT_THREAD, FT_POLL, FT_FORCE, FT_SETTLE };

/* The last page this thread retried a fault on without finding a span:
 * a second fault there right away is the application's. */
static __thread uintptr_t retried_page;

static int resolve(uintptr_t addr, int how, bool count)
{
	bool waited_out = false;              /* a block-on-write wait ran out */
	for (int round = 0;; round++) {
		sigset_t ss;
		az_lock(&ss);
		int i = span_find(addr);
		if (i < 0 || spans[i].mech == AZ_MECH_NONE) {
			/* Not protected by us now. Lifted while the fault was
			 * on its way (the page is in a run lifted lately, or
			 * writable now)? Then the access is tried again - but a
			 * second fault of this thread on the same page at once
			 * is the application's own. */
			struct vma v;
			bool retry = recent_has(addr) ||
				     (vma_read(addr, &v) && (v.prot & PROT_WRITE));
			az_unlock(&ss);
			if (how == FT_THREAD && count) {
				if (!retry || retried_page == PG_DOWN(addr)) {
					retried_page = 0;
					return 0;
				}
				retried_page = PG_DOWN(addr);
			}
			return retry;
		}
		retried_page = 0;
		struct az_span sp = spans[i];
		if (count && round == 0)
			az_count_fault(sp.start, sp.end);
		if (sp.kind == AZ_RECV) {
			az_unlock(&ss);
			if (how == FT_POLL || how == FT_FORCE)
				return -EAGAIN;
			az_recv_settle(NULL);      /* the copies finish */
			continue;
		}
		if (sp.users == 0) {
			span_lift((size_t)i);
			az_unlock(&ss);
			return 1;
		}
		if (sdp_tun.az_fault == 1 || how == FT_FORCE || round > 0) {
			/* Copy-on-write: move what is advertised here aside
			 * (unless the sink is reading it: it finishes first),
			 * into the pool; if that is full, the writer waits for
			 * the peer's read as with block-on-write, and only a
			 * wait that ran out maps a buffer of its own. */
			az_move_range(sp.start, sp.end, how == FT_FORCE || waited_out);
			i = span_find(addr);
			if (i >= 0 && spans[i].users == 0) {
				span_lift((size_t)i);
				az_unlock(&ss);
				return 1;
			}
		}
		az_unlock(&ss);
		if (how != FT_THREAD && how != FT_SETTLE)
			return -EAGAIN;
		/* Block-on-write: until the peer has read it (then the next
		 * round lifts the span), at most AZ_BLOCK_MS - then copy. */
		if (!az_wait_range(sp.start, sp.end, AZ_BLOCK_MS))
			waited_out = true;
		else if (round > 8)
			sched_yield();
	}
}

int az_fault(uintptr_t addr, bool may_block)
{
	return resolve(addr, may_block ? FT_THREAD : FT_POLL, true);
}

/* The progress thread gave up waiting for the peer: copy now. */
int az_fault_force(uintptr_t addr)
{
	return resolve(addr, FT_FORCE, false);
}

/* Make [start, end) accessible for a write (or, !write, a read): what the
 * library is about to do to the application's buffer; mp_only: only what
 * mprotect protects (the kernel's own accesses fail on it). */
static void settle_range(uintptr_t start, uintptr_t end, bool write, bool mp_only)
{
	for (int guard = 0; guard < 1000000; guard++) {
		sigset_t ss;
		az_lock(&ss);
		uintptr_t at = 0;
		size_t k;
		span_find_at(start, &k);
		for (size_t i = k; i < nspans && spans[i].start < end; i++) {
			if (spans[i].mech == AZ_MECH_NONE ||
			    (mp_only && spans[i].mech != AZ_MECH_MPROTECT))
				continue;
			if (write || spans[i].kind == AZ_RECV) {
				at = spans[i].start > start ? spans[i].start : start;
				break;
			}
		}
		az_unlock(&ss);
		if (!at)
			return;
		resolve(at, FT_SETTLE, true);
	}
}

void az_settle_iov(const struct iovec *iov, int n, bool write)
{
	if (!atomic_load_explicit(&az_nspans, memory_order_relaxed))
		return;
	for (int i = 0; i < n; i++)
		if (iov[i].iov_len)
			settle_range(PG_DOWN(iov[i].iov_base),
				     PG_UP((uintptr_t)iov[i].iov_base + iov[i].iov_len), write,
				     false);
}

void az_settle_syscall(const struct iovec *iov, int n)
{
	if (atomic_load_explicit(&mech_chosen, memory_order_relaxed) != AZ_MECH_MPROTECT ||
	    !atomic_load_explicit(&az_nspans, memory_order_relaxed))
		return;
	for (int i = 0; i < n; i++)
		if (iov[i].iov_len)
			settle_range(PG_DOWN(iov[i].iov_base),
				     PG_UP((uintptr_t)iov[i].iov_base + iov[i].iov_len), true,
				     true);
}

/* maps: the mappings change too (munmap, mprotect...), not only the
 * contents (madvise): the cached view of them and our userfaultfd
 * registrations of the range go. */
static void mem_release(uintptr_t start, uintptr_t end, bool maps)
{
	if (!atomic_load_explicit(&az_nspans, memory_order_relaxed) || end <= start ||
	    end <= atomic_load_explicit(&env_lo, memory_order_relaxed) ||
	    start >= atomic_load_explicit(&env_hi, memory_order_relaxed))
		return;
	start = PG_DOWN(start);
	end = PG_UP(end);
	uint64_t deadline = sdp_now_ns() + 2000000000ull;
	bool waited_out = false, counted = false;
	for (;;) {
		sigset_t ss;
		az_lock(&ss);
		if (maps)
			vma_forget();
		bool any = false, recv = false;
		size_t k;
		span_find_at(start, &k);
		for (size_t i = k; i < nspans && spans[i].start < end; i++) {
			any = true;
			recv |= spans[i].kind == AZ_RECV;
		}
		if (!any) {
			if (maps)
				reg_undo(start, end);
			az_unlock(&ss);
			return;
		}
		if (recv) {
			az_unlock(&ss);
			az_recv_settle(NULL);
			continue;
		}
		/* Advertisements on this memory move to bounce buffers: the
		 * application may do with it what it likes. A read in flight
		 * (the sink won) is waited for, and so is the peer's read when
		 * the pool is full, at most AZ_BLOCK_MS before a buffer of its
		 * own is mapped. */
		if (!counted) {
			/* as a write would have been: a fault on pages in
			 * flight (it steers the cool-down of azsend.c) */
			az_count_fault(start, end);
			counted = true;
		}
		int all = az_move_range(start, end, waited_out);
		if (all || sdp_now_ns() > deadline) {
			if (!all)
				sdp_log(0, "asynchronous zero copy: memory released while "
					"the peer still reads it");
			az_span_drop(start, end);
			if (maps)
				reg_undo(start, end);
			az_unlock(&ss);
			return;
		}
		az_unlock(&ss);
		if (!az_wait_range(start, end, AZ_BLOCK_MS))
			waited_out = true;
	}
}

void az_mem_release(uintptr_t start, uintptr_t end)
{
	mem_release(start, end, true);
}

void az_mem_discard(uintptr_t start, uintptr_t end)
{
	mem_release(start, end, false);
}

/* The application changed its mappings without releasing span memory. */
void az_vma_changed(void)
{
	if (atomic_load_explicit(&mech_chosen, memory_order_relaxed) <= AZ_MECH_NONE)
		return;
	sigset_t ss;
	az_lock(&ss);
	vma_forget();
	az_unlock(&ss);
}

/* Under the lock: every span of [start, end) (the progress thread and the
 * receive side look at them). */
bool az_span_protected(uintptr_t addr)
{
	int i = span_find(addr);
	return i >= 0 && spans[i].mech != AZ_MECH_NONE;
}

/* ---- SIGSEGV: ours first, then the application's -------------------------- */

int (*az_real_sigaction)(int, const struct sigaction *, struct sigaction *);
static pthread_mutex_t sig_mu = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int segv_installed;
/* The application's action, double-buffered so that the handler always
 * reads a whole one. */
static struct sigaction app_act[2];
static _Atomic int app_idx;

static void az_segv(int sig, siginfo_t *si, void *uc);

static int install_ours(const struct sigaction *app)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = az_segv;
	/* The application's stack choice (a handler for stack overflows
	 * runs on its sigaltstack) and restart choice; every other signal
	 * waits while a fault is resolved. */
	sa.sa_flags = SA_SIGINFO | (app->sa_flags & (SA_ONSTACK | SA_RESTART));
	sigfillset(&sa.sa_mask);
	return az_real_sigaction(SIGSEGV, &sa, NULL);
}

void az_segv_install(void)
{
	if (atomic_load_explicit(&segv_installed, memory_order_acquire) || !az_real_sigaction)
		return;
	pthread_mutex_lock(&sig_mu);
	if (!atomic_load(&segv_installed)) {
		struct sigaction cur;
		if (az_real_sigaction(SIGSEGV, NULL, &cur) == 0) {
			app_act[0] = cur;
			atomic_store(&app_idx, 0);
			if (install_ours(&cur) == 0)
				atomic_store(&segv_installed, 1);
		}
	}
	pthread_mutex_unlock(&sig_mu);
}

int az_sigaction(int sig, const struct sigaction *act, struct sigaction *old)
{
	if (sig != SIGSEGV || !atomic_load_explicit(&segv_installed, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&sig_mu);
	if (!atomic_load(&segv_installed)) {
		pthread_mutex_unlock(&sig_mu);
		return 0;
	}
	int k = atomic_load(&app_idx);
	struct sigaction cur = app_act[k];
	if (act) {
		app_act[k ^ 1] = *act;
		atomic_store(&app_idx, k ^ 1);
		if ((act->sa_flags ^ cur.sa_flags) & (SA_ONSTACK | SA_RESTART))
			install_ours(act);
	}
	pthread_mutex_unlock(&sig_mu);
	if (old)
		*old = cur;
	return 1;
}

void az_sig_restore(void)
{
	if (!atomic_load(&segv_installed))
		return;
	pthread_mutex_lock(&sig_mu);
	if (atomic_load(&segv_installed)) {
		struct sigaction a = app_act[atomic_load(&app_idx)];
		az_real_sigaction(SIGSEGV, &a, NULL);
		atomic_store(&segv_installed, 0);
	}
	pthread_mutex_unlock(&sig_mu);
}

/* The default action of a fault: with our handler gone the faulting
 * instruction runs again and the kernel applies it (a core, if enabled);
 * a SIGSEGV sent by a process is sent again. */
static void default_action(siginfo_t *si)
{
	struct sigaction dfl;
	memset(&dfl, 0, sizeof dfl);
	dfl.sa_handler = SIG_DFL;
	atomic_store(&segv_installed, 0);
	az_real_sigaction(SIGSEGV, &dfl, NULL);
	if (si->si_code <= 0)
		syscall(SYS_tgkill, getpid(), (pid_t)syscall(SYS_gettid), SIGSEGV);
}

static void chain(int sig, siginfo_t *si, void *ucv)
{
	ucontext_t *uc = ucv;
	struct sigaction a = app_act[atomic_load(&app_idx)];
	if (a.sa_handler == SIG_IGN) {
		if (si->si_code <= 0)
			return;                   /* sent by a process: ignored */
		a.sa_handler = SIG_DFL;       /* a real fault cannot be ignored */
	}
	if (a.sa_handler == SIG_DFL) {
		default_action(si);
		return;
	}
	if (a.sa_flags & SA_RESETHAND) {
		/* One delivery, then the default again (as the kernel does). */
		int k = atomic_load(&app_idx);
		memset(&app_act[k ^ 1], 0, sizeof app_act[0]);
		app_act[k ^ 1].sa_handler = SIG_DFL;
		atomic_store(&app_idx, k ^ 1);
	}
	/* The mask the application's handler expects: what was blocked when
	 * the fault came, its sa_mask, and SIGSEGV itself unless SA_NODEFER. */
	sigset_t m = uc->uc_sigmask;
	for (int s = 1; s < NSIG; s++)
		if (sigismember(&a.sa_mask, s) == 1)
			sigaddset(&m, s);
	if (!(a.sa_flags & SA_NODEFER))
		sigaddset(&m, sig);
	else
		sigdelset(&m, sig);
	pthread_sigmask(SIG_SETMASK, &m, NULL);
	if (a.sa_flags & SA_SIGINFO)
		a.sa_sigaction(sig, si, ucv);
	else
		a.sa_handler(sig);
}

static void az_segv(int sig, siginfo_t *si, void *uc)
{
	int e = errno;
	/* Only an access fault on a mapped page can be ours. */
	if (si && si->si_code == SEGV_ACCERR && resolve((uintptr_t)si->si_addr, FT_THREAD, true) > 0) {
		errno = e;
		return;
	}
	if (si)
		chain(sig, si, uc);
	errno = e;
}

/* ---- start-up, fork ----------------------------------------------------- */

/* The library's own segments (data and bss included): never protected. */
static int self_segments(struct dl_phdr_info *info, size_t size, void *arg)
{
	(void)size;
	(void)arg;
	bool mine = false;
	for (int i = 0; i < info->dlpi_phnum && !mine; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		uintptr_t a = info->dlpi_addr + ph->p_vaddr;
		mine = ph->p_type == PT_LOAD && self_text >= a && self_text < a + ph->p_memsz;
	}
	if (!mine)
		return 0;
	for (int i = 0; i < info->dlpi_phnum; i++) {
		const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
		if (ph->p_type != PT_LOAD)
			continue;
		uintptr_t a = PG_DOWN(info->dlpi_addr + ph->p_vaddr);
		az_lib_add(a, PG_UP(info->dlpi_addr + ph->p_vaddr + ph->p_memsz) - a);
	}
	return 1;
}

static void find_self(void)
{
	/* Every mapping of the library's own file is special (vma), and its
	 * segments are library memory. */
	self_text = (uintptr_t)&find_self;
	dl_iterate_phdr(self_segments, NULL);
}

void az_init(void)
{
	find_self();
	if (az_on())
		pthread_atfork(az_fork_prepare, az_fork_parent, az_fork_child);
}

/* The child of a fork: the parent's advertisements are the parent's; the
 * child's copies of those pages are its own to write. */
void az_prot_fork_child(void)
{
	pthread_mutex_init(&lk, NULL);
	pthread_mutex_init(&sig_mu, NULL);   /* another thread's sigaction */
	for (size_t i = 0; i < nspans; i++)
		if (spans[i].mech == AZ_MECH_MPROTECT)
			az_mprotect(spans[i].start, spans[i].end - spans[i].start,
				    spans[i].prot);
	/* userfaultfd protection and registration do not pass to a child. */
	nspans = 0;
	nreg = 0;
	az_envelope();
	vma_forget();
}

void az_prot_lock_fork(bool take)
{
	if (take)
		pthread_mutex_lock(&lk);
	else
		pthread_mutex_unlock(&lk);
}

void az_prot_set_uffd(uint64_t features)
{
	uffd_features = features;
}

const struct az_calib *az_calib_get(void)
{
	return atomic_load(&mech_chosen) >= 0 ? &calib : NULL;
}
