/*
 * azprog.c - Asynchronous Zero Copy: the progress thread (az.h).
 *
 * Who moves the bytes. On InfiniBand the adapter does the RDMA Read while
 * the application computes. Here a CPU must copy, and the design keeps that
 * copy on the peer: the sink's own recv() reads an asynchronous SrcAvail
 * by Cross Memory Attach, straight into its buffer, as it does for
 * synchronous zero copy. A sender that returns at once therefore computes
 * on its CPU while the receiver copies on its own - real overlap wherever
 * the receiver has a CPU, and no CPU of the sender spent on it. What this
 * thread adds costs little: one per process, started at the first
 * asynchronous send, asleep in ppoll() unless there is work:
 *
 *   - userfaultfd faults: a thread that writes a page still in flight
 *     (or the kernel, for it) waits until this thread lifts the protection
 *     (block-on-write: once the peer read it, at most AZ_BLOCK_MS, then
 *     copy-on-write) - faults it cannot resolve at once wait in a list and
 *     are looked at every 100 us;
 *   - completions nobody else sees: with advertisements outstanding it
 *     looks every millisecond (mprotect lifts protection as soon as the
 *     peer has read, since the kernel's own accesses fail on it);
 *   - connections closed with advertisements unread (kept until read);
 *   - asynchronous receives: the copy into the pages a recv() left
 *     inaccessible (azrecv.c) - there the receiver's CPU is this thread's.
 *
 * It blocks every signal (the application's go to its own threads) and
 * makes only system calls of its own.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>
#include <linux/userfaultfd.h>

#include "sdp/az.h"
#include "sdp/log.h"
#include "sdp/sys.h"

#define PAGE 4096ul
#define AZ_BLOCK_MS 50
#define MAX_PENDING 256

int az_uffd = -1;
static int efd = -1;                    /* kicks */
static _Atomic int running;
static pthread_mutex_t start_mu = PTHREAD_MUTEX_INITIALIZER;
static uint64_t uffd_feat;

/* Faults of other threads still waiting (userfaultfd). */
static struct { uintptr_t addr; uint64_t since; } pend[MAX_PENDING];
static int npend;

/* Descriptors of the library live above the application's (as the pool). */
static int move_high(int fd)
{
	return sys_fd_keep(fd, 900);
}

static void uffd_unwp_page(uintptr_t a)
{
	struct uffdio_writeprotect wp = {
		.range = { a & ~(PAGE - 1), PAGE }, .mode = 0,
	};
	az_ioctl(az_uffd, UFFDIO_WRITEPROTECT, &wp);
}

/* One fault (pending or new): 1 done, 0 still waiting. */
static int serve_fault(uintptr_t addr, uint64_t since, bool wp)
{
	int r = sdp_now_ns() - since > AZ_BLOCK_MS * 1000000ull ? az_fault_force(addr)
								 : az_fault(addr, false);
	if (r == -EAGAIN)
		return 0;
	if (wp && r <= 0) {
		/* Not ours (any more): the page must not stay write-protected,
		 * or its writer waits for ever. */
		uffd_unwp_page(addr);
	}
	if (!wp && r <= 0 && !az_recv_missing(addr)) {
		/* A missing page of no receive in flight: what an untouched
		 * anonymous page is. */
		struct uffdio_zeropage z = { .range = { addr & ~(PAGE - 1), PAGE } };
		az_ioctl(az_uffd, UFFDIO_ZEROPAGE, &z);
	}
	return 1;
}

static void read_faults(void)
{
	for (;;) {
		struct uffd_msg m[16];
		ssize_t n = sys_read(az_uffd, m, sizeof m);
		if (n < (ssize_t)sizeof m[0])
			return;
		for (size_t i = 0; i < (size_t)n / sizeof m[0]; i++) {
			if (m[i].event != UFFD_EVENT_PAGEFAULT)
				continue;
			uintptr_t a = (uintptr_t)m[i].arg.pagefault.address;
			bool wp = m[i].arg.pagefault.flags & UFFD_PAGEFAULT_FLAG_WP;
			uint64_t now = sdp_now_ns();
			if (serve_fault(a, now, wp))
				continue;
			if (npend < MAX_PENDING) {
				pend[npend].addr = a | (wp ? 1 : 0);
				pend[npend].since = now;
				npend++;
			} else {
				az_fault_force(a);
				if (wp)
					uffd_unwp_page(a);
			}
		}
	}
}

static void retry_pending(void)
{
	for (int i = 0; i < npend;) {
		uintptr_t a = pend[i].addr & ~(uintptr_t)1;
		if (serve_fault(a, pend[i].since, pend[i].addr & 1))
			pend[i] = pend[--npend];
		else
			i++;
	}
}

static void *prog_main(void *arg)
{
	(void)arg;
	sigset_t all;
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	syscall(SYS_prctl, PR_SET_NAME, "sdp-az", 0, 0, 0);
	for (;;) {
		struct pollfd p[2] = {
			{ .fd = efd, .events = POLLIN },
			{ .fd = az_uffd, .events = POLLIN },
		};
		struct timespec ts = { 0, 0 }, *tp = NULL;
		bool recv_work = az_recv_work_pending();
		if (npend)
			ts.tv_nsec = 100000;
		else if (az_outstanding_all())
			ts.tv_nsec = 1000000;
		if (npend || ts.tv_nsec)
			tp = &ts;
		if (!recv_work)
			syscall(SYS_ppoll, p, az_uffd >= 0 ? 2 : 1, tp, NULL, (size_t)8);
		if (p[0].revents & POLLIN) {
			uint64_t v;
			ssize_t r = sys_read(efd, &v, sizeof v);
			(void)r;
		}
		if (az_uffd >= 0)
			read_faults();
		az_recv_work();
		az_progress_all();
		retry_pending();
	}
	return NULL;
}

int az_prog_uffd(void)
{
	if (az_uffd >= 0)
		return az_uffd;
	pthread_mutex_lock(&start_mu);
	if (az_uffd < 0) {
		int fd = az_uffd_open(&uffd_feat);
		if (fd >= 0) {
			az_prot_set_uffd(uffd_feat);
			__atomic_store_n(&az_uffd, move_high(fd), __ATOMIC_RELEASE);
		}
	}
	pthread_mutex_unlock(&start_mu);
	if (az_uffd >= 0)
		az_prog_start();
	return az_uffd;
}

uint64_t az_uffd_features(void)
{
	return az_uffd >= 0 ? uffd_feat : 0;
}

int az_prog_start(void)
{
	if (atomic_load_explicit(&running, memory_order_acquire))
		return 0;
	pthread_mutex_lock(&start_mu);
	int r = 0;
	if (!atomic_load(&running)) {
		if (efd < 0) {
			int fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
			if (fd >= 0)
				efd = move_high(fd);
		}
		pthread_attr_t at;
		pthread_attr_init(&at);
		pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&at, 256 * 1024);
		pthread_t th;
		/* The thread takes no signal the application expects. */
		sigset_t all, old;
		sigfillset(&all);
		pthread_sigmask(SIG_BLOCK, &all, &old);
		r = efd < 0 ? -EMFILE : -pthread_create(&th, &at, prog_main, NULL);
		pthread_sigmask(SIG_SETMASK, &old, NULL);
		pthread_attr_destroy(&at);
		if (!r)
			atomic_store(&running, 1);
		else
			sdp_log(1, "asynchronous zero copy: no progress thread (%s)", strerror(-r));
	}
	pthread_mutex_unlock(&start_mu);
	return r;
}

void az_prog_kick(void)
{
	if (efd >= 0) {
		uint64_t one = 1;
		ssize_t r = sys_write(efd, &one, sizeof one);
		(void)r;
	}
}

void az_prog_forget(void)
{
	/* The child of a fork: no thread; the parent's descriptors are the
	 * parent's business (the userfaultfd is bound to its memory). */
	pthread_mutex_init(&start_mu, NULL);
	atomic_store(&running, 0);
	if (az_uffd >= 0)
		sys_close_kept(az_uffd);
	if (efd >= 0)
		sys_close_kept(efd);
	az_uffd = -1;
	efd = -1;
	npend = 0;
}
