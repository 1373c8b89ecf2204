/*
 * pool.c - the per-process connection pool and per-process counters.
 *
 * Connections are allocated from a MAP_SHARED memfd so that they survive
 * fork() shared (one socket, one state, like the kernel's struct sock) and
 * so that `sdp stat` can read them. Slots are claimed with a CAS on inuse.
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sdp/calib.h"
#include "sdp/pool.h"
#include "sdp/log.h"
#include "sdp/spin.h"
#include "sdp/sys.h"

pid_t sdp_pid;
static struct sdp_pool_hdr *pool;
static struct sdp_proc *myproc;
/* This process (since its fork) listened or connected on TCP: only then
 * is there anything to write into SDP_STATS_DIR. */
static _Atomic bool had_sockets;

static inline struct sdp_proc *procs(void)
{
	return (struct sdp_proc *)((char *)pool + pool->procs_off);
}

static inline struct sdp_conn *conns(void)
{
	return (struct sdp_conn *)((char *)pool + pool->conns_off);
}

uint64_t sdp_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void proc_register(void)
{
	struct sdp_proc *p = procs();
	int32_t pid = (int32_t)getpid();
	myproc = NULL;
	for (uint32_t i = 0; i < pool->nprocs; i++) {
		int32_t cur = atomic_load(&p[i].pid);
		if (cur && cur != pid && kill(cur, 0) < 0 && errno == ESRCH)
			atomic_compare_exchange_strong(&p[i].pid, &cur, 0);
		int32_t zero = 0;
		if (atomic_compare_exchange_strong(&p[i].pid, &zero, pid)) {
			myproc = &p[i];
			break;
		}
	}
	atomic_store(&had_sockets, false);
	if (!myproc)
		return;
	memset(myproc->comm, 0, sizeof myproc->comm);
	int fd = sys_open("/proc/self/comm", O_RDONLY | O_CLOEXEC);
	if (fd >= 0) {
		ssize_t n = sys_read(fd, myproc->comm, sizeof myproc->comm - 1);
		if (n > 0 && myproc->comm[n - 1] == '\n')
			myproc->comm[n - 1] = 0;
		sys_close(fd);
	}
	atomic_store(&myproc->sdp_conns, 0);
	atomic_store(&myproc->tcp_conns, 0);
	atomic_store(&myproc->tx_bytes, 0);
	atomic_store(&myproc->rx_bytes, 0);
	atomic_store(&myproc->net_conns, 0);
	atomic_store(&myproc->net_tx_bytes, 0);
	atomic_store(&myproc->net_rx_bytes, 0);
	for (int i = 0; i < 2; i++) {
		atomic_store(&myproc->regions[i], 0);
		atomic_store(&myproc->regions_reused[i], 0);
	}
}

/* Per slot, this process's own (private memory, unlike the pool): threads
 * inside a call, and what a close left for the last of them to do. */
static _Atomic uint32_t calls_of[SDP_POOL_CONNS];
static _Atomic uint8_t retire_of[SDP_POOL_CONNS];

static void retire_now(struct sdp_conn *c, unsigned how)
{
	struct fab_ep *ep = &c->ep;
	if ((how & SDP_RETIRE_DETACH) && ep->ops) {
		sdp_mark(c, FAB_M_CLOSED);    /* last write: the peer may reuse it */
		ep->ops->detach(ep);
	}
	else if ((how & SDP_RETIRE_UNMAP) && ep->ops)
		ep->ops->unmap(ep);
	if (how & SDP_RETIRE_FREE)
		sdp_conn_free(c);
}

void sdp_conn_enter(struct sdp_conn *c)
{
	atomic_fetch_add(&calls_of[c->idx], 1);
}

bool sdp_conn_leave(struct sdp_conn *c)
{
	uint32_t i = c->idx;
	/* Dekker with sdp_conn_retire: our count's drop before our look at
	 * retire_of, its store there before its look at the count. */
	if (atomic_fetch_sub(&calls_of[i], 1) != 1)
		return false;
	if (atomic_load(&retire_of[i])) {
		unsigned how = atomic_exchange(&retire_of[i], 0);
		if (how)
			retire_now(c, how);
	}
	return true;
}

uint32_t sdp_conn_calls(struct sdp_conn *c)
{
	return atomic_load(&calls_of[c->idx]);
}

void sdp_conn_retire(struct sdp_conn *c, unsigned how)
{
	uint32_t i = c->idx;
	atomic_store(&retire_of[i], (uint8_t)how);
	if (atomic_load(&calls_of[i]) == 0) {
		how = atomic_exchange(&retire_of[i], 0);
		if (how)
			retire_now(c, how);
	} else {
		sdp_log(2, "connection %u closed while a call of another thread is in it: "
			"released when that call returns", i);
	}
}

int sdp_pool_init(void)
{
	size_t len = sdp_pool_size();
	int fd = (int)syscall(SYS_memfd_create, SDP_POOL_NAME, MFD_CLOEXEC);
	if (fd < 0)
		return -errno;
	if (ftruncate(fd, (off_t)len) < 0) {
		int e = -errno;
		sys_close(fd);
		return e;
	}
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	if (p == MAP_FAILED) {
		int e = -errno;
		sys_close(fd);
		return e;
	}
	/* Keep the fd open: it is how `sdp stat` finds the pool. Move it high
	 * so it does not take the numbers applications expect. */
	fd = sys_fd_keep(fd, 900);
	pool = p;
	pool->magic = SDP_POOL_MAGIC;
	pool->version = SDP_POOL_VERSION;
	pool->nprocs = SDP_POOL_PROCS;
	pool->nconns = SDP_POOL_CONNS;
	pool->conn_size = sizeof(struct sdp_conn);
	pool->procs_off = 4096;
	pool->conns_off = (uint32_t)(sdp_pool_size() - (size_t)SDP_POOL_CONNS * sizeof(struct sdp_conn));
	proc_register();
	return 0;
}

static atomic_flag free_busy;          /* below: the slots this process freed */

void sdp_pool_atfork_child(void)
{
	atomic_flag_clear(&free_busy);        /* a thread of the parent's had it */
	if (pool)
		proc_register();
	/* the other threads' calls are the parent's */
	memset(calls_of, 0, sizeof calls_of);
	memset(retire_of, 0, sizeof retire_of);
}

static void mutex_init(pthread_mutex_t *m)
{
	pthread_mutexattr_t a;
	pthread_mutexattr_init(&a);
	pthread_mutexattr_setpshared(&a, PTHREAD_PROCESS_SHARED);
	pthread_mutexattr_setrobust(&a, PTHREAD_MUTEX_ROBUST);
	pthread_mutex_init(m, &a);
	pthread_mutexattr_destroy(&a);
}

int sdp_lock(pthread_mutex_t *m)
{
	int r = pthread_mutex_lock(m);
	if (r == EOWNERDEAD) {          /* a process died holding it */
		pthread_mutex_consistent(m);
		r = 0;
	}
	return -r;
}

void sdp_unlock(pthread_mutex_t *m)
{
	pthread_mutex_unlock(m);
}

static pthread_once_t auto_once = PTHREAD_ONCE_INIT;

/* The per-host choices (calib.c): read from the cache, or measured once. */
static void resolve_auto(void)
{
	struct sdp_calib cal;
	sdp_calib_get(sdp_tun.slot_size, false, &cal);
	if (sdp_tun.zcopy_auto)
		sdp_tun.zcopy_thresh = cal.zcopy_thresh;
	if (sdp_tun.copy_auto)
		sdp_copy_use(cal.copy);
	for (int i = 0; i < cal.ncopy; i++)
		if (!strcmp(cal.copy_speed[i].name, sdp_copy_name()))
			sdp_copy_stream_ref(cal.copy_speed[i].gbps);
	sdp_tun.cma_alias = cal.cma_alias;
	sdp_log(cal.cached ? 2 : 1, "host calibration (%s%s): copy routine %s, zero-copy "
		"threshold %u%s, page-aliased zero copy %s", cal.cached ? "cached in " :
		"measured, cached in ", cal.path, sdp_copy_name(), sdp_tun.zcopy_thresh,
		sdp_tun.zcopy_thresh ? " bytes" : " (never: Buffer Copy is as cheap here)",
		cal.cma_alias ? "bounced" : "direct");
	__atomic_store_n(&sdp_tun.calib_pending, 0, __ATOMIC_RELEASE);
}

/* The `auto` zero-copy threshold (and copy routine), resolved at the
 * first SDP connection, before its first byte is copied. */
uint32_t sdp_zcopy_default(void)
{
	if (__atomic_load_n(&sdp_tun.calib_pending, __ATOMIC_ACQUIRE))
		pthread_once(&auto_once, resolve_auto);
	return sdp_tun.zcopy_thresh;
}

/*
 * Slots this process freed, the last on top: the next connections take
 * them again, warm, so churn touches a few slots instead of walking all
 * 16384 (each first touch a page fault, and over time the whole pool
 * resident: tests/c/t_pool_warm.c). Only a hint - an entry is taken with
 * the same CAS on inuse as any slot, so a slot a forked sibling took
 * meanwhile is skipped. Guarded by a try-lock: a call from a signal
 * handler that interrupted its own thread in here does without it.
 */
#define FREE_MAX 1024
static uint32_t free_top[FREE_MAX];
static uint32_t nfree;
static atomic_flag free_busy = ATOMIC_FLAG_INIT;

static struct sdp_conn *take_slot(uint32_t i)
{
	struct sdp_conn *c = &conns()[i];
	uint32_t zero = 0;
	if (atomic_load_explicit(&c->inuse, memory_order_relaxed) ||
	    !atomic_compare_exchange_strong(&c->inuse, &zero, 1))
		return NULL;
	return c;
}

static struct sdp_conn *take_freed(void)
{
	struct sdp_conn *c = NULL;
	if (atomic_flag_test_and_set_explicit(&free_busy, memory_order_acquire))
		return NULL;
	while (!c && nfree)
		c = take_slot(free_top[--nfree]);
	atomic_flag_clear_explicit(&free_busy, memory_order_release);
	return c;
}

static void put_freed(uint32_t i)
{
	if (atomic_flag_test_and_set_explicit(&free_busy, memory_order_acquire))
		return;                       /* the scan finds it */
	if (nfree < FREE_MAX)
		free_top[nfree++] = i;
	atomic_flag_clear_explicit(&free_busy, memory_order_release);
}

struct sdp_conn *sdp_conn_alloc(void)
{
	if (!pool)
		return NULL;
	uint32_t n = pool->nconns, i = 0;
	struct sdp_conn *c = take_freed();
	/* None freed: on from the slot after the one taken last. */
	uint32_t start = atomic_load_explicit(&pool->hint, memory_order_relaxed) % n;
	for (uint32_t k = 0; !c && k < n; k++) {
		i = (start + k) % n;
		if ((c = take_slot(i)) != NULL)
			atomic_store_explicit(&pool->hint, i + 1 < n ? i + 1 : 0,
					      memory_order_relaxed);
	}
	if (c) {
		i = (uint32_t)(c - conns());
		memset((char *)c + sizeof c->inuse, 0, sizeof *c - sizeof c->inuse);
		c->idx = i;
		c->creator_pid = (int32_t)sdp_pid;
		c->created_ns = sdp_now_ns();
		atomic_store(&c->nproc, 1);
		atomic_store(&c->spin_us, sdp_tun.spin_us);
		atomic_store(&c->spin_cur, sdp_spin_initial(sdp_tun.spin_us));
		atomic_store(&c->zcopy_thresh, 0);   /* SDP connections: hello.c */
		atomic_store(&c->rcvlowat, 1);
		mutex_init(&c->tx_lock);
		mutex_init(&c->rx_lock);
	}
	return c;
}

void sdp_conn_free(struct sdp_conn *c)
{
	atomic_store(&c->state, SDP_ST_FREE);
	atomic_store(&c->inuse, 0);
	if (pool)
		put_freed(c->idx);
}

void sdp_proc_note_socket(void)
{
	if (!atomic_load_explicit(&had_sockets, memory_order_relaxed))
		atomic_store(&had_sockets, true);
}

void sdp_proc_count(int sdp, int tcp, bool net)
{
	sdp_proc_note_socket();
	if (!myproc)
		return;
	if (sdp)
		atomic_fetch_add(&myproc->sdp_conns, (uint64_t)sdp);
	if (sdp && net)
		atomic_fetch_add(&myproc->net_conns, (uint64_t)sdp);
	if (tcp)
		atomic_fetch_add(&myproc->tcp_conns, (uint64_t)tcp);
}

void sdp_proc_region(int accepting, bool reused)
{
	if (!myproc)
		return;
	atomic_fetch_add(&myproc->regions[accepting != 0], 1);
	if (reused)
		atomic_fetch_add(&myproc->regions_reused[accepting != 0], 1);
}

void sdp_proc_bytes(uint64_t tx, uint64_t rx, bool net)
{
	if (!myproc)
		return;
	if (tx)
		atomic_fetch_add_explicit(&myproc->tx_bytes, tx, memory_order_relaxed);
	if (rx)
		atomic_fetch_add_explicit(&myproc->rx_bytes, rx, memory_order_relaxed);
	if (net && tx)
		atomic_fetch_add_explicit(&myproc->net_tx_bytes, tx, memory_order_relaxed);
	if (net && rx)
		atomic_fetch_add_explicit(&myproc->net_rx_bytes, rx, memory_order_relaxed);
}

void sdp_proc_write_stats(const char *dir)
{
	if (!myproc || !dir || !*dir || !atomic_load(&had_sockets))
		return;
	/* The name is the program's to choose (prctl PR_SET_NAME): no '/' or
	 * control characters in the file name, and JSON-escaped in the file. */
	char name[sizeof myproc->comm], esc[sizeof myproc->comm * 6];
	size_t k = 0;
	name[0] = 0;
	for (size_t i = 0; i < sizeof name - 1 && myproc->comm[i]; i++) {
		unsigned char ch = (unsigned char)myproc->comm[i];
		name[i] = ch == '/' || ch < 0x20 || ch == 0x7f ? '_' : (char)ch;
		name[i + 1] = 0;
		if (ch == '"' || ch == '\\')
			k += (size_t)snprintf(esc + k, sizeof esc - k, "\\%c", ch);
		else if (ch < 0x20 || ch == 0x7f)
			k += (size_t)snprintf(esc + k, sizeof esc - k, "\\u%04x", ch);
		else
			esc[k++] = (char)ch;
	}
	esc[k] = 0;
	char path[4096], tmp[4200];
	snprintf(path, sizeof path, "%s/%s.%d.json", dir, name, (int)getpid());
	snprintf(tmp, sizeof tmp, "%s.tmp", path);
	FILE *f = fopen(tmp, "we");
	if (!f)
		return;
	fprintf(f, "{\"pid\": %d, \"comm\": \"%s\", \"sdp_conns\": %llu, "
		"\"tcp_conns\": %llu, \"tx_bytes\": %llu, \"rx_bytes\": %llu, "
		"\"regions_created\": %llu, \"regions_reused\": %llu, "
		"\"regions_mapped\": %llu, \"mappings_reused\": %llu, "
		"\"net_conns\": %llu, \"net_tx_bytes\": %llu, \"net_rx_bytes\": %llu}\n",
		(int)getpid(), esc,
		(unsigned long long)atomic_load(&myproc->sdp_conns),
		(unsigned long long)atomic_load(&myproc->tcp_conns),
		(unsigned long long)atomic_load(&myproc->tx_bytes),
		(unsigned long long)atomic_load(&myproc->rx_bytes),
		(unsigned long long)atomic_load(&myproc->regions[0]),
		(unsigned long long)atomic_load(&myproc->regions_reused[0]),
		(unsigned long long)atomic_load(&myproc->regions[1]),
		(unsigned long long)atomic_load(&myproc->regions_reused[1]),
		(unsigned long long)atomic_load(&myproc->net_conns),
		(unsigned long long)atomic_load(&myproc->net_tx_bytes),
		(unsigned long long)atomic_load(&myproc->net_rx_bytes));
	fclose(f);
	rename(tmp, path);
}
