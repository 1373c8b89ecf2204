/*
 * az.h - Asynchronous Zero Copy (AZ-SDP), the engine's internal interface.
 *
 * A blocking send of at least SDP_AZCOPY_THRESH bytes advertises the whole
 * pages of its buffer (SrcAvail with SDP_SA_ASYNC), write-protects them and
 * returns the full count at once; the partial pages at either end go by
 * Buffer Copy. The peer reads the pages by Cross Memory Attach whenever its
 * recv() meets the SrcAvail; once it has (RdmaRdCompl, its rd_done), the
 * protection is lifted. A write to a protected page before that waits in
 * the fault until the peer has read it (SDP_AZ_FAULT=block) or copies the
 * advertisement to a bounce buffer and re-advertises it there
 * (SDP_AZ_FAULT=copy). A recv that finds the data already advertised may
 * return at once too, with the whole pages of its buffer inaccessible until
 * the progress thread has copied the data into them (azrecv.c).
 *
 *   azprot.c  the protected page spans, the two protection mechanisms
 *             (mprotect + SIGSEGV, userfaultfd write-protect), faults and
 *             the chain to the application's own SIGSEGV handling
 *   azcal.c   measuring the mechanisms (also linked into `sdp check`)
 *   azsend.c  advertising, completions, copy-on-write moves, close,
 *             exit, exec and the hand-back to TCP with data outstanding
 *   azrecv.c  asynchronous receive
 *   azprog.c  the progress thread: userfaultfd faults, completions
 *             nobody else is there to see, lingering closes, receive copies
 *
 * Everything here is per process (addresses are): the state lives in
 * private memory; what the peer must see is in the zero-copy control words
 * (proto.h: az_moving, az_redir) and the SrcAvail flags.
 */
#ifndef SDP_AZ_H
#define SDP_AZ_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include "sdp/conn.h"
#include "sdp/proto.h"

/* ---- raw calls ------------------------------------------------------------ */

/* The switch interposes mmap, munmap, mprotect, madvise, ioctl and the
 * rest (azsw.c): the library's own calls must not come back through it. */
static inline void *az_mmap(size_t len)
{
	long r = syscall(SYS_mmap, NULL, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return r < 0 && r > -4096 ? MAP_FAILED : (void *)r;
}
static inline int az_munmap(void *p, size_t len) { return (int)syscall(SYS_munmap, p, len); }
/* Fresh pages exactly at addr, or MAP_FAILED (something is there). */
static inline void *az_mmap_at(uintptr_t addr, size_t len)
{
	long r = syscall(SYS_mmap, addr, len, PROT_READ | PROT_WRITE,
			 MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
	if (r < 0 && r > -4096)
		return MAP_FAILED;
	if ((uintptr_t)r != addr) {           /* a kernel that took it as a hint */
		syscall(SYS_munmap, r, len);
		return MAP_FAILED;
	}
	return (void *)r;
}
static inline int az_mprotect(uintptr_t a, size_t len, int prot)
{
	return (int)syscall(SYS_mprotect, a, len, prot);
}
static inline int az_madvise(uintptr_t a, size_t len, int adv)
{
	return (int)syscall(SYS_madvise, a, len, adv);
}
static inline int az_ioctl(int fd, unsigned long req, void *arg)
{
	return (int)syscall(SYS_ioctl, fd, req, arg);
}

/* ---- the protection mechanisms (azcal.c) -------------------------------- */

enum az_mech {
	AZ_MECH_NONE     = 0,      /* not protected (already read-only, or not yet) */
	AZ_MECH_MPROTECT = 1,      /* mprotect: writes (sends) or every access
				    * (receives) raise SIGSEGV; the kernel's own
				    * accesses fail with EFAULT */
	AZ_MECH_UFFD     = 2,      /* userfaultfd: the faulting thread, and the
				    * kernel's accesses, wait for the progress
				    * thread */
};

/* What a process measured of the mechanisms (once, at its first AZ send;
 * `sdp check` runs the same). Costs per protect + unprotect cycle of 64
 * pages and per fault, in microseconds; 0 = not measured. */
struct az_calib {
	bool     uffd_ok;              /* userfaultfd write-protect works here */
	char     uffd_why[96];         /* why not */
	double   mprotect_us;          /* mprotect(PROT_READ) + mprotect(back) */
	double   uffd_us;              /* UFFDIO_WRITEPROTECT on + off */
	double   mprotect_fault_us;    /* a write fault resolved by SIGSEGV */
	double   uffd_fault_us;        /* ... by a userfaultfd reader thread */
	int      choice;               /* enum az_mech auto picks */
	char     why[96];              /* why that one */
};
/* Measure (faults too if with_faults: that starts a thread). */
void az_calibrate(struct az_calib *cal, bool with_faults);
/* A userfaultfd for write-protect faults, kernel accesses included
 * (O_CLOEXEC | O_NONBLOCK), or -errno; *features gets what it supports. */
int  az_uffd_open(uint64_t *features);
/* What older kernel headers lack: write-protecting pages never touched,
 * and marking pages whose data is lost (an access raises SIGBUS). */
#define AZ_UFFD_WP_UNPOPULATED (1ull << 13)
#define AZ_UFFD_POISON         (1ull << 14)
struct az_uffdio_poison {
	uint64_t start, len;           /* struct uffdio_range */
	uint64_t mode;
	int64_t  updated;
};
#define AZ_UFFDIO_POISON _IOWR(0xAA, 0x08, struct az_uffdio_poison)

/* ---- azprot.c: spans of protected pages ---------------------------------- */

enum az_kind {
	AZ_SEND = 1,               /* advertised by a send: writes fault */
	AZ_RECV = 2,               /* the target of an asynchronous receive:
				    * every access faults */
};

/* Start-up (after the tunables): choose the mechanism lazily. */
void az_init(void);
bool az_on(void);                        /* SDP_AZCOPY=1 and usable */
extern _Atomic int az_nspans;           /* spans exist: the memory calls look */
int  az_mech_default(void);              /* enum az_mech for new spans */
/* Lock for every AZ structure of the process: taken with all signals
 * blocked (a signal handler of the application that touches a protected
 * page must not find it held by its own thread). */
void az_lock(sigset_t *saved);
void az_unlock(const sigset_t *saved);

/* Under az_lock: cover [start, end) (pages) with spans of kind, protected,
 * one more user each. 0 or -errno (nothing done). */
int  az_span_hold(uintptr_t start, uintptr_t end, int kind);
/* Under az_lock: one user less on each span of [start, end); a send span
 * left without users is unprotected at once (mprotect, whose protection
 * the kernel's own accesses trip over) or kept until the next write or
 * send reuses it (userfaultfd). */
void az_span_put(uintptr_t start, uintptr_t end);
/* Under az_lock: lift every protection on [start, end) and forget it (the
 * memory goes away or the application takes it over). */
void az_span_drop(uintptr_t start, uintptr_t end);
/* The memory of [start, end) changes owner or goes away (munmap, mremap,
 * madvise(DONTNEED), mmap over it, free, realloc, mprotect): advertisements
 * on it move to bounce buffers, asynchronous receives into it finish, its
 * spans are dropped. Any thread, no lock held. */
void az_mem_release(uintptr_t start, uintptr_t end);
/* The same for contents dropped with the mapping kept (madvise DONTNEED,
 * FREE, REMOVE): the protection mechanisms' set-up of the range stays for
 * the next send (a write-protect registration, the view of the mapping). */
void az_mem_discard(uintptr_t start, uintptr_t end);
/* The engine is about to write (recv) or read (send: write = false) the
 * application's buffer: its pages must be accessible. */
void az_settle_iov(const struct iovec *iov, int n, bool write);
/* The kernel is about to write into the buffer for the application (a
 * read-type system call): pages mprotect protects must be writable (the
 * userfaultfd's make the kernel wait by themselves). */
void az_settle_syscall(const struct iovec *iov, int n);
/* Library memory that must never be protected (az_lib_add, az_lib_forget:
 * under az_lock). */
void az_lib_range(uintptr_t start, size_t len);
void az_lib_add(uintptr_t start, size_t len);
void az_lib_forget(uintptr_t start);
/* The progress thread gave up waiting for the peer: copy aside now. */
int  az_fault_force(uintptr_t addr);
/* The application changed its mappings (mmap, mprotect...). */
void az_vma_changed(void);
/* azprot.c internals shared with the other az files. */
void az_segv_install(void);
void az_prot_fork_child(void);
void az_prot_lock_fork(bool take);
void az_prot_set_uffd(uint64_t features);
const struct az_calib *az_calib_get(void);
void az_count_fault(uintptr_t start, uintptr_t end);

/* A fault at addr (write = a write access, if known). Returns 1: resolved,
 * retry the access; 0: not ours; -EAGAIN: not yet (the progress thread
 * keeps it pending). may_block: the caller is the faulting thread. */
int  az_fault(uintptr_t addr, bool may_block);

/* ---- azprot.c: the application's SIGSEGV ------------------------------- */

/* The next sigaction (libc's), given by the switch at start-up. */
extern int (*az_real_sigaction)(int, const struct sigaction *, struct sigaction *);
/* The application sets or asks for the action of sig: if the library
 * handles SIGSEGV now, the application's action is kept aside (and old
 * gets the application's previous one): returns 1; 0 = pass through. */
int  az_sigaction(int sig, const struct sigaction *act, struct sigaction *old);
/* Before exec: the application's own SIGSEGV action goes back in place
 * (an ignored signal stays ignored across exec). */
void az_sig_restore(void);

/* ---- azsend.c: the send side --------------------------------------------- */

/* Is a send (or receive) of n bytes at or above the AZ threshold in
 * effect: SDP_AZCOPY_THRESH, or `auto` - measured once per host (calib.c),
 * for the protection mechanism this process uses: the smallest size whose
 * copy costs more than protecting and unprotecting its pages. */
bool az_big_enough(size_t n);

/* A send of total bytes from iov: advertise asynchronously what qualifies
 * and Buffer-copy the rest, in stream order. Returns the bytes sent, 0 if
 * AZ does not apply (the caller sends the usual way), or -errno. Caller
 * holds tx_lock; *done gets the bytes queued even on error. */
ssize_t az_send(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
		size_t total, bool *used);
/* Completions of c's advertisements made by this process (RdmaRdCompl):
 * lift their protection. Any thread; cheap when nothing is outstanding. */
void az_progress(struct sdp_conn *c);
/* The same for every connection (the progress thread, exit). */
void az_progress_all(void);
/* Advertisements of this process still unread: all connections. */
uint32_t az_outstanding_all(void);
/* Is any advertisement of this process outstanding on c? */
bool az_busy(struct sdp_conn *c);
/* This process's close of c (sdp_release) with advertisements unread:
 * the progress thread keeps the connection (and a copy of the TCP socket)
 * until the peer has read them, as a closed TCP socket still sends what
 * it had queued, then makes the release. true: it took it over. */
bool az_linger(struct sdp_conn *c, int fd);
/* Where the bytes of an asynchronous SrcAvail are now: the address in
 * its process (sa->key) - the advertised one or where it moved to - or 0
 * if that cannot be told. ours: one of our own side's (the hand-back to
 * TCP re-sends it), else the peer's (the sink reads it). */
uint64_t az_where(struct sdp_conn *c, const struct sdp_srcavail *sa, bool ours);
/* Where our own advertisement id moved (its bounce buffer), or 0. */
uint64_t az_adv_bounce(struct sdp_conn *c, uint32_t id);
/* c left SDP or was reset: its advertisements are void (the hand-back
 * re-sent them on TCP); lift their protection. */
void az_conn_drop(struct sdp_conn *c);
/* Wait until every advertisement of this process was read, its peer left,
 * or nothing moved for the given time (exit, exec). */
void az_drain(uint32_t idle_ms);
/* Move advertisement bytes overlapping [start, end) to bounce buffers
 * (under az_lock: 1 all moved, 0 some could not be, without blocking).
 * The buffers come from the pool; may_map: if it is full, map one (the
 * caller has waited for the peer's read long enough). */
int  az_move_range(uintptr_t start, uintptr_t end, bool may_map);
/* Block-on-write: wait (lock not held) until every advertisement of this
 * process overlapping [start, end) is read or moved, at most max_ms. */
bool az_wait_range(uintptr_t start, uintptr_t end, uint32_t max_ms);
/* fork, exec and exit. */
void az_fork_prepare(void);
void az_fork_parent(void);
void az_fork_child(void);
void az_before_exec(void);
void az_at_exit(void);

/* ---- the sink's half of the asynchronous protocol (zcsink.c) ----------- */

/* Before reading an asynchronous SrcAvail (our `reading` = its id is
 * published): the address to read from - the advertised one, or where
 * the source moved it (waiting while it moves it now) - or 0 if that
 * cannot be known (the source is stuck or its table unreadable: the
 * caller aborts). */
uint64_t az_src_addr(struct sdp_conn *c, const struct sdp_srcavail *sa, int fd);

/* ---- azrecv.c: asynchronous receive -------------------------------------- */

/* The rest of asynchronous SrcAvail sa (from offset off, its bytes at
 * addr) into the application's buffer at stream offset copied, room bytes
 * there, if a blocking recv may take it asynchronously: its partial pages
 * now, its whole pages by the progress thread. Our `reading` word holds
 * sa's id until the copy is done, which publishes rd_done. Returns the
 * bytes taken (all of the rest), 0 (read it the usual way) or -errno. */
ssize_t az_recv_take(struct sdp_conn *c, int fd, const struct sdp_srcavail *sa,
		     uint64_t addr, uint32_t off, const struct iovec *iov, int iovcnt,
		     size_t copied, size_t room);
/* Finish every asynchronous receive of c (or of all connections: NULL). */
void az_recv_settle(struct sdp_conn *c);
void az_recv_fork_child(void);    /* its lock made anew */
/* An asynchronous receive of c is still being copied. */
bool az_recv_busy(struct sdp_conn *c);
/* The progress thread: copies to make; make them. */
bool az_recv_work_pending(void);
void az_recv_work(void);
/* A missing-page fault at addr: a receive in flight covers it (the copy
 * will fill it and wake the faulting thread). */
bool az_recv_missing(uintptr_t addr);

/* ---- azpool.c: bounce buffers for copies aside (under az_lock) ---------- */

/* A buffer of len bytes (whole pages) from the pool, or 0 (full, or no
 * pool: SDP_AZ_POOL=0 or its mapping refused). */
uintptr_t az_pool_get(size_t len);
/* Another advertisement shares the copy at b. */
void az_pool_share(uintptr_t b);
/* One user less on the copy at b of len bytes; false: b is not the
 * pool's (the caller unmaps it). */
bool az_pool_put(uintptr_t b, size_t len);
bool az_pool_owns(uintptr_t b);
/* fork: the child's pool is empty. */
void az_pool_fork_child(void);

/* ---- azprog.c: the progress thread ---------------------------------------- */

/* Start it if it is not running; wake it. */
int  az_prog_start(void);
void az_prog_kick(void);
/* The userfaultfd it reads (-1 if none); az_prog_uffd opens it (and
 * starts the thread): the descriptor or -1. What it supports. */
extern int az_uffd;
int  az_prog_uffd(void);
uint64_t az_uffd_features(void);
/* fork: the child has no progress thread. */
void az_prog_forget(void);

/* ---- counters ------------------------------------------------------------- */
static inline void az_count(uint64_t *ctr, uint64_t n)
{
	__atomic_fetch_add(ctr, n, __ATOMIC_RELAXED);
}

#endif
