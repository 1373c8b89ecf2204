/*
 * conn.h - an SDP connection as the engine sees it, and the engine's API.
 *
 * A struct sdp_conn lives in the process's connection pool (pool.c), a
 * MAP_SHARED memfd inherited by forked children, so that a parent and a
 * child holding the same socket share one receive position, one set of
 * locks and one set of counters, exactly as they share one kernel socket.
 * `sdp stat` maps the same pool read-only to list connections.
 *
 * Engine functions return >= 0 or -errno; the switch converts to -1/errno.
 */
#ifndef SDP_CONN_H
#define SDP_CONN_H

#include <netinet/in.h>
#include <pthread.h>
#include <stddef.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include "sdp.h"
#include "fabric/fabric.h"
#include "sdp/tunables.h"

enum sdp_state {
	SDP_ST_FREE = 0,
	SDP_ST_CONNECTING,     /* hello sent, TCP connect in progress */
	SDP_ST_ESTABLISHED,
	SDP_ST_CLOSED,         /* this process closed it (slot draining) */
	SDP_ST_RESET,          /* aborted: peer RST/AbortConn or protocol error */
};

enum sdp_mode {                /* delivery mode of our send side */
	SDP_MODE_BUFFERED = 0,     /* Buffer Copy only */
	SDP_MODE_COMBINED = 1,
	SDP_MODE_PIPELINED = 2,
};

/* Which end of the TCP connection (also the policy's roles, policy.h). */
enum sdp_role {
	SDP_ROLE_SERVER = 1,  /* listening / accepted sockets */
	SDP_ROLE_CLIENT = 2,  /* connecting sockets */
};

union sdp_addr {
	struct sockaddr     sa;
	struct sockaddr_in  in;
	struct sockaddr_in6 in6;
};

struct sdp_conn {
	_Atomic uint32_t inuse;        /* pool slot allocated */
	uint32_t idx;                  /* slot index */
	int32_t  creator_pid;
	uint8_t  role;                 /* enum sdp_role */
	uint8_t  mode;                 /* enum sdp_mode */
	uint8_t  transport;            /* 1 = SDP, 0 = TCP (listed by sdp stat only) */
	uint8_t  pad0;
	uint64_t tcp_ino;              /* inode of the TCP socket (for sdp stat) */
	union sdp_addr local, remote;  /* TCP: getsockname / getpeername */
	uint64_t created_ns;
	uint64_t token;                /* the connection's identity (hello token),
					* the same on both ends; 0 on TCP */

	_Atomic uint32_t state;        /* enum sdp_state */
	_Atomic uint32_t nproc;        /* processes holding an fd to it */
	_Atomic uint32_t nwaiters;     /* threads blocked in send/recv */
	_Atomic uint32_t watcher;      /* 1: a waiter sleeps on the TCP fd */
	_Atomic uint32_t wake_gen;     /* futex: bumped after every wake-up */
	_Atomic uint32_t futex_sleepers; /* threads asleep on wake_gen */
	_Atomic uint32_t fast_sleepers; /* threads asleep on the fabric's futex
					 * word (FAB_WAIT_F: wait.c fast_sleep) */
	_Atomic int64_t  rcvtimeo_us;  /* SO_RCVTIMEO, 0 = none (also on the socket) */
	_Atomic uint32_t nonblock;     /* O_NONBLOCK of the open file (TCP: f_flags) */
	_Atomic int64_t  sndtimeo_us;  /* SO_SNDTIMEO, 0 = none */
	_Atomic uint32_t spin_us;      /* busy-poll before blocking (the maximum) */
	_Atomic uint32_t spin_cur;     /* adaptive budget now, <= spin_us */
	_Atomic uint32_t spin_waits;   /* waits since the budget reached 0 */
	_Atomic uint32_t zcopy_thresh; /* bytes; 0 = zero copy off */
	_Atomic uint32_t rx_shut;      /* shutdown(SHUT_RD) done */
	_Atomic uint32_t tx_shut;      /* shutdown(SHUT_WR) done (FIN sent) */
	_Atomic uint32_t rx_eof;       /* DisConn consumed: reads return 0 */
	_Atomic uint32_t peer_gone;    /* wait fd saw TCP FIN (1) or RST (2) */
	_Atomic int32_t  so_error;     /* pending error (TCP: sk_err) */
	_Atomic uint32_t linger0;      /* SO_LINGER on with 0 s: close = abort */
	_Atomic uint32_t app_nodelay;  /* TCP_NODELAY as the application set it */
	_Atomic uint32_t app_cork;     /* TCP_CORK as the application set it */
	_Atomic uint32_t rcvlowat;     /* SO_RCVLOWAT (TCP: sk_rcvlowat), >= 1 */
	_Atomic uint32_t sndbuf;       /* SO_SNDBUF in bytes as getsockopt reports it,
					* if the application set it; 0 = not set
					* (TCP: sk_sndbuf with SOCK_SNDBUF_LOCK).
					* Our SO_RCVBUF is in our control block */
	_Atomic uint32_t fb_done;      /* left SDP: the fd is plain TCP now */
	_Atomic int fb_subst1;         /* 1 + the socket that delivers what a peer
					* gone before the hand-back left unread,
					* until every number naming the
					* connection has it (fallback.c); 0 none.
					* Set before fb_done */
	_Atomic uint32_t err_reported; /* the reset was reported (TCP: sk_err read) */
	_Atomic uint32_t reset_told;   /* the peer was kicked to see our reset */

	uint32_t rx_off;               /* bytes of the head Data/SrcAvail consumed */
	uint32_t tx_mseq;              /* last BSDH mseq sent */

	/* Zero copy (zcopy.c). Stream positions count application bytes. */
	uint64_t tx_stream;            /* bytes handed to the peer (TCP: snd_nxt) */
	uint64_t rx_stream;            /* bytes the application consumed (TCP: copied_seq) */
	uint32_t src_id;               /* last SrcAvail id we posted */
	uint32_t rx_src_id;            /* last SrcAvail id we received */
	uint32_t sink_id;              /* last SinkAvail id we offered */
	uint32_t zc_mark;              /* rd_done seen when a send went to sleep */
	uint32_t zc_spin_us;           /* spin for this wait (expected read time) */
	_Atomic int32_t cma;           /* Cross Memory Attach to the peer: 0 unknown,
					* 1 works, -errno refused */
	int32_t  peer_pid;             /* the peer process as the kernel told us
					* (SO_PEERCRED at the rendezvous): the
					* only CMA key we accept */
	_Atomic int32_t key_ok;        /* a peer process verified to hold the far
					* end (ident.c), besides peer_pid */
	_Atomic uint32_t zc_sending;   /* a synchronous zero-copy send is
					* advertising (it may revoke what it
					* posted: no asynchronous SrcAvail in
					* between, az.h) */
	/* A client whose server has not taken the connection up yet
	 * (upwatch.c; TCP: a connection whose server end may have gone
	 * without a word): */
	_Atomic uint64_t up_wait_ns;   /* since when (ns, TCP connect done);
					* 0: up, given up, or not watched */
	_Atomic uint64_t up_look_ns;   /* next look at the server's end (ns) */
	uint8_t  peer_mode;            /* the peer's send half (ModeChange) */
	uint8_t  mode_msg;             /* a ModeChange is still to be posted */
	uint8_t  pad1[2];

	pthread_mutex_t tx_lock;       /* robust, process-shared */
	pthread_mutex_t rx_lock;

	struct sdp_sock_stats st;      /* counters (sdp.h); updated under locks */
	struct fab_ep ep;              /* fabric endpoint */
};

/* ---- pool.c --------------------------------------------------------------- */
int  sdp_pool_init(void);                         /* once per process image */
void sdp_pool_atfork_child(void);
struct sdp_conn *sdp_conn_alloc(void);
void sdp_conn_free(struct sdp_conn *c);
/*
 * Threads of this process inside a call on c (the switch's wrappers): a
 * close() on another thread releases the connection (its FIN, its marks)
 * at once, but its memory - the mapping of the peer's control block and
 * rings, the slot - is given up only when the last such call has left, as
 * the kernel keeps a socket's file while a call holds it. Enter, then make
 * sure the descriptor still names c (the switch does); a call that finds
 * the connection closed returns EBADF.
 */
enum { SDP_RETIRE_DETACH = 1, SDP_RETIRE_UNMAP = 2, SDP_RETIRE_FREE = 4 };
void sdp_conn_enter(struct sdp_conn *c);
bool sdp_conn_leave(struct sdp_conn *c);          /* true: the last call left */
uint32_t sdp_conn_calls(struct sdp_conn *c);      /* calls inside now */
void sdp_conn_retire(struct sdp_conn *c, unsigned how);
void sdp_proc_count(int sdp, int tcp, bool net);  /* per-process totals; net:
						   a network fabric carries it */
void sdp_proc_region(int accepting, bool reused);
void sdp_proc_bytes(uint64_t tx, uint64_t rx, bool net);
void sdp_proc_note_socket(void);                 /* a TCP listener or connection */
void sdp_proc_write_stats(const char *dir);       /* SDP_STATS_DIR at exit, if
						     the process had sockets */
int  sdp_lock(pthread_mutex_t *m);
void sdp_unlock(pthread_mutex_t *m);

/* Wake-up tokens on a connection's TCP socket are consumed only by its
 * watcher: the one sleeper (library wait, poll or epoll, any thread or
 * forked process) that holds c->watcher. Other library waiters sleep on the
 * wake_gen futex, which every drain bumps. Other poll/epoll sleepers leave
 * tokens alone and sleep in slices of this many milliseconds, re-checking:
 * the kernel cannot wake them through our futex. A single sleeper (the
 * usual case) is the watcher and sleeps unbounded: an idle connection
 * costs no CPU. */
#define SDP_SHARED_SLICE_MS 10
/* No library sleep on a connection lasts longer than this without a fresh
 * look at the shared state (and a new request to be kicked), except the
 * watcher's blocking recv(MSG_PEEK), which must stay the kernel's own for
 * exact signal and SO_RCVTIMEO behaviour: a corruption of the region that
 * clears a sleeper's request to be kicked then costs at most this delay
 * where the sleep is bounded (ARCHITECTURE.md section 11). */
#define SDP_CHECK_MS 1000

/* ---- rcvbuf.c (the send window and idle trims) ---------------------------- */
/* A look at an idle connection (now: sdp_now_ns()): gives its send ring's
 * memory back when it has been idle SDP_IDLE_TRIM_MS. No system call
 * unless a trim is due; takes tx_lock only then (never waits for it). */
void    sdp_idle_look(struct sdp_conn *c, uint64_t now);
void    sdp_idle_look_all(struct sdp_conn *const *cs, size_t n);   /* NULLs skipped */
void    sdp_trim_close(struct sdp_conn *c);     /* at the last close */
void    sdp_window_note(struct sdp_conn *c);    /* counters after a send */

/* ---- tx.c / rx.c (Buffer Copy data path) ---------------------------------- */
ssize_t sdp_send(struct sdp_conn *c, int fd, const struct iovec *iov,
		 int iovcnt, int flags);
ssize_t sdp_recv(struct sdp_conn *c, int fd, const struct iovec *iov,
		 int iovcnt, int flags);
int     sdp_fionread(struct sdp_conn *c);
/* The send window in bytes (tx.c). Without SO_SNDBUF or the peer's
 * SO_RCVBUF set, the ring's credits are the only limit: SIZE_MAX. */
size_t  sdp_tx_room(struct sdp_conn *c);
bool    sdp_tx_open(struct sdp_conn *c);       /* a send can post now */
bool    sdp_tx_writable(struct sdp_conn *c);   /* POLLOUT (TCP: sk_stream_is_writeable) */
/* The application set SO_SNDBUF (snd) or SO_RCVBUF on fd (before the
 * connection, on its listener, or now): take the kernel's value. */
void    sdp_bufsize_set(struct sdp_conn *c, int fd, bool snd);
/* Readiness as poll(2) bits, from shared state only (no syscalls). */
unsigned sdp_events(struct sdp_conn *c);
/* Counts that move on the events edge-triggered epoll reports: messages
 * arrived so far (consumed or pending), and a count that moves whenever
 * room to send comes back (credits, or stream bytes the peer consumed: a
 * byte-limited window opens on partial reads too). */
uint64_t sdp_rx_arrived(struct sdp_conn *c);
uint64_t sdp_tx_acked(struct sdp_conn *c);
uint32_t sdp_credits(struct sdp_conn *c);         /* messages we may post now */
/* With messages pending: since when (fab_clock) - when the sender posted
 * into our empty queue. 0 if nothing is pending. */
uint64_t sdp_ready_since(struct sdp_conn *c);
/* Before sleeping in poll/epoll on fd: ask the peer to kick us for the
 * events wanted; then re-check sdp_events. */
void    sdp_arm(struct sdp_conn *c, int fd, unsigned events);
/* The same on the queue route: the readiness queue (>= 0) this process
 * reads the connection's wake-ups from (sdp_q_bind, -1: none, tokens
 * only); its key there is c->idx. */
int     sdp_q_bind(struct sdp_conn *c);
/* owed: also send the token the peer may be owed (kick_owed) - a safety
 * net against a peer whose arms were cleared by a third process; a waiter
 * over many connections does it once per SDP_CHECK_MS, not per sleep (a
 * busy peer that has not read our data yet would get a token every time). */
void    sdp_arm_q(struct sdp_conn *c, int fd, unsigned events, bool owed);
/* The fd was reported readable by the kernel: consume wake-up tokens and
 * note a TCP FIN/RST from the peer process. */
void    sdp_on_wakeup(struct sdp_conn *c, int fd);
/* A local shutdown(SHUT_RD): wake this process's sleepers on c (wait.c,
 * wake.c). */
void    sdp_wake_sleepers(struct sdp_conn *c);
bool    sdp_watch(struct sdp_conn *c);     /* become the watcher, or false */
void    sdp_unwatch(struct sdp_conn *c);
/* Busy-polling (its budget, the spin loop, cpu_relax) is in spin.h. */
/* Common wait used by tx and rx: spin, arm, sleep. flags: */
enum {
	SDP_WAIT_RCVTIMEO = 1u << 0,   /* a receive: SO_RCVTIMEO applies */
	SDP_WAIT_PARTIAL  = 1u << 1,   /* the call already moved bytes: a
					* signal ends it (with the partial
					* count) even under SA_RESTART, as
					* in TCP */
};
int     sdp_wait(struct sdp_conn *c, int fd, unsigned what, unsigned flags,
		 pthread_mutex_t *held);
/* A receive of this thread that waits with messages still queued (a
 * MSG_PEEK leaves them there) has looked at the peer's messages up to this
 * count: its FAB_WAIT_RX is met only by a later one. 0: any message. */
extern _Thread_local uint64_t sdp_rx_seen;
/* ... and if not 0, the id of a SrcAvail it refused to read: the source
 * revoking it (cancel_last reaching it) meets the wait too. */
extern _Thread_local uint32_t sdp_rx_revoke;
/* Spin as sdp_wait would before sleeping: 1 met, 0 not, or -errno. */
int     sdp_spin(struct sdp_conn *c, unsigned what, pthread_mutex_t *held);
/* A bounded wait for a zero-copy hand-off, keeping the caller's lock:
 * until met(c, arg), the connection's end (0 either way: look), or the
 * deadline (ns: -ETIMEDOUT); spins, then sleeps on the wake-up for what. */
int     sdp_wait_until(struct sdp_conn *c, int fd, unsigned what,
		       bool (*met)(struct sdp_conn *c, void *arg), void *arg,
		       uint64_t deadline);
void    sdp_conn_abort(struct sdp_conn *c, int err);
/* The peer's state failed its provider's peer_sane check (why: what). */
void    sdp_abort_insane(struct sdp_conn *c, const char *why);
/* The connection is reset: make sure the peer sees it (our mark + kick). */
void    sdp_reset_tell(struct sdp_conn *c, int fd);
/* Before sleeping: the wake-up the peer may be owed (not to a peer that
 * sent its FIN or closed). */
void    sdp_kick_owed(struct sdp_conn *c, int fd);
/* Wake every library waiter on c (the futex sleepers: the watcher looks
 * again by itself). */
void    sdp_wake_waiters(struct sdp_conn *c);
/* upwatch.c: a client committed to SDP whose server has not taken the
 * connection up. Start watching at the end of its TCP connect; look
 * (cheap unless due) before every sleep on it: a server end that is gone
 * - the kernel dropped it without a reset, as it may when the listener
 * closes - makes the client take the connection back for TCP (abandon),
 * where the kernel answers its bytes as TCP would. true while the watch
 * is on (a waiter's sleep is then bounded by SDP_UP_LOOK_MS). */
#define SDP_UP_LOOK_MS 100
void    sdp_up_watch(struct sdp_conn *c);
bool    sdp_up_check(struct sdp_conn *c, int fd);
/* Abort (with the reason logged) if the peer's control block makes no
 * sense; nothing if the connection is already reset. */
void    sdp_check_peer(struct sdp_conn *c);
bool    sdp_is_reset(struct sdp_conn *c);
/* Report a reset once (recv/send/SO_ERROR): true the first time. */
bool    sdp_take_reset(struct sdp_conn *c);
/* tx.c: the errno TCP reports for a reset not reported yet (0 = none):
 * EPIPE if the peer's FIN came before it, else ECONNRESET. Once. */
int     sdp_reset_errno(struct sdp_conn *c);

/* ---- the endpoint's provider, for the engine's files --------------------- */
/* Do the peer's marks (enum fab_mark) include m? Ours: FAB_MY(m). */
static inline bool sdp_marked(struct sdp_conn *c, unsigned m)
{
	return c->ep.ops->marks(&c->ep, m) != 0;
}
static inline void sdp_mark(struct sdp_conn *c, unsigned m)
{
	c->ep.ops->mark(&c->ep, m);
}
/* Zero-copy control words: ours (written by us, then published) and the
 * peer's (read only). */
static inline struct sdp_zctl *sdp_zc_me(struct sdp_conn *c)
{
	return c->ep.ops->zc_me(&c->ep);
}
static inline struct sdp_zctl *sdp_zc_peer(struct sdp_conn *c)
{
	return c->ep.ops->zc_peer(&c->ep);
}
/* Publish fields first..last (inclusive, in layout order) of our block. */
#define sdp_zc_publish(c, first, last) \
	(c)->ep.ops->zc_publish(&(c)->ep, offsetof(struct sdp_zctl, first), \
		offsetof(struct sdp_zctl, last) + sizeof(((struct sdp_zctl *)0)->last) - \
		offsetof(struct sdp_zctl, first))

/* ---- tx.c: posting messages (caller holds tx_lock and a credit) ---------- */
/* One message: a header, then len bytes of the iovec from stream offset
 * off; kicks the peer. */
int  sdp_post_msg(struct sdp_conn *c, int fd, uint8_t mid, const struct iovec *iov,
		  int iovcnt, size_t off, size_t len);
/* A message without payload, optionally without waking the peer. */
int  sdp_post_msg_nokick(struct sdp_conn *c, int fd, uint8_t mid, bool nokick);

/* ---- zcopy.c: Read / Write Zero Copy over Cross Memory Attach ---------- */
void    zc_attach(struct sdp_conn *c, int fd);       /* publish pid, fd, probe addr */
bool    zc_usable(struct sdp_conn *c, int fd, size_t len, bool nonblock);
/* May the peer's memory be named by key? (the set-up pid, or a process
 * the kernel shows holding the far end: ident.c) */
bool    zc_key_ok(struct sdp_conn *c, int fd, int32_t key);
int     zc_key_check(struct sdp_conn *c, int fd, int32_t key);  /* 1/0/-errno */
/* ident.c: 1 if process pid holds the far end of TCP socket fd. */
int     sdp_ident_holds_peer(int fd, pid_t pid, int hint);
/* One socket of the kernel's TCP tables as sock_diag gives it (ident.c). */
struct sdp_diag {
	uint64_t ino;                  /* its inode (0: none) */
	uint8_t  state;                /* TCP_ESTABLISHED, TCP_LISTEN... */
	uint16_t sport, dport;         /* network order */
};
int     sdp_diag_one(int nl, int family, const void *src, uint16_t sport,
		     const void *dst, uint16_t dport, struct sdp_diag *d);
void    zc_probe(struct sdp_conn *c, int fd);
ssize_t zc_send(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
		size_t off, size_t len, bool *go_bcopy);
void    zc_ack_cancel(struct sdp_conn *c, int fd);     /* sink: answer cancels */
/* Our send half's mode; a ModeChange is posted (with a credit of its own)
 * before the next SrcAvail by zc_post_mode while c->mode_msg is set. */
void    zc_set_mode(struct sdp_conn *c, int mode);
void    zc_post_mode(struct sdp_conn *c, int fd);
const char *zc_mode_name(int mode);
uint32_t sdp_zcopy_default(void);             /* pool.c: resolves `auto` (calib.c) */
/* zcopy.c: RDMA Read (write = false) or Write of n bytes at raddr to or
 * from local[0..nlocal), through a bounce buffer where this host's Cross
 * Memory Attach is slow between page-aliased buffers (calib.c). */
ssize_t zc_rdma(struct sdp_conn *c, bool write, const struct iovec *local, int nlocal,
		uint64_t raddr, size_t n, uint64_t key);

/* ---- close.c -------------------------------------------------------------- */
int  sdp_shutdown(struct sdp_conn *c, int fd, int how);
/* SO_LINGER on with 0 s (zero), or not: the last close resets. */
void sdp_linger_set(struct sdp_conn *c, bool zero);
/* Last fd of this process closes: FIN or abort, unmap, maybe free. */
void sdp_release(struct sdp_conn *c, int fd);
/* The end of the last release (after the FIN or abort): stop wake-ups,
 * the closed mark, give the memory and the slot back. fd -1: the TCP
 * socket is closed already (a close that lingered for asynchronous
 * advertisements, az.h). */
void sdp_release_finish(struct sdp_conn *c, int fd);
/* Last fd of this process closes for a connection kept on TCP or fallen
 * back: give back its endpoint (if it had one) and its slot. */
void sdp_release_tcp(struct sdp_conn *c);
/* A connection that never got an fd (its connect failed at once): give
 * back its endpoint and its slot. */
void sdp_conn_drop(struct sdp_conn *c);

/* ---- fallback.c: leave SDP for TCP mid-stream, losing nothing ------------ */
/* When the peer was gone and left bytes we had not read, c->fb_subst1
 * names a socket that yields them (then EOF or a reset): every fd of this
 * process that names c is to name it instead, before any of them is used
 * as TCP (sdp_fb_install, or the switch's hook), and it is then closed. */
int  sdp_fallback(struct sdp_conn *c, int fd);
/* The substitute, taken (-1: none). */
int  sdp_fallback_subst_take(struct sdp_conn *c);
/* The same from inside the engine, where only fd is known: the switch's
 * hook (sdp_fb_install_hook) puts a substitute on every fd naming c, or
 * without one it replaces fd alone. */
int  sdp_fallback_fd(struct sdp_conn *c, int fd);
extern void (*sdp_fb_install_hook)(struct sdp_conn *c, int fd);
void sdp_fallback_publish(struct sdp_conn *c, int fd);
bool sdp_same_conn_peer(struct sdp_conn *a, struct sdp_conn *b);
bool sdp_fallback_pending(struct sdp_conn *c);
/* Has the peer started a fallback (so it runs its half itself)? Have we? */
bool sdp_fallback_by_peer(struct sdp_conn *c);
/* How long a peer that began leaving SDP (stage 1 of fallback.c) may take
 * to finish (stage 2) before the connection is reset: ms. */
extern unsigned sdp_fb_stall_ms;
bool sdp_fallback_started(struct sdp_conn *c);
#define SDP_EFALLBACK EREMCHG          /* internal: retry the call on TCP */

/* ---- hello.c: rendezvous and connection set-up ---------------------------- */
struct sdp_listener;
/* A listening socket: publish (or join, SO_REUSEPORT) its rendezvous.
 * offer: the policy allows SDP (over the provider pref says); a
 * SO_REUSEPORT listener that may not offer it still joins its group, to
 * withdraw it for every member. */
int  sdp_listener_open(int fd, bool offer, enum fab_pref pref, struct sdp_listener **out);
/* Before listen() opens the port of fd (bound to an address other hosts
 * reach): load what its network rendezvous needs (the fabric library,
 * which takes a while), so that once the port is open its rendezvous
 * follows within microseconds, not after clients were sent to TCP. */
void sdp_net_prepare(int fd);
void sdp_listener_close(struct sdp_listener *l);
/* The listener *slot names, kept alive until sdp_listener_put (an accept
 * in progress while another thread closes the listening socket): NULL if
 * the slot is empty. The slot is cleared before the listener's close. */
struct sdp_listener *sdp_listener_hold(struct sdp_listener *const *slot);
void sdp_listener_put(struct sdp_listener *l);
void sdp_listener_fork(struct sdp_listener *l, int delta);
void sdp_listener_withdraw(struct sdp_listener *l);
/* Hellos taken from the rendezvous and kept for connections not accepted
 * yet: each holds the client's memfd (a descriptor of ours). */
int  sdp_listener_pending(const struct sdp_listener *l);
/* Accepted TCP socket newfd: SDP connection if its client sent a hello.
 * *refuse < 0: the client said hello but cannot be served (-errno, *why
 * says why): reset the connection rather than keep it TCP on our side
 * only. *refuse > 0: an internal connection (a listener joining the
 * SO_REUSEPORT group woke us with it): close it unseen. peer: the
 * client's address as accept() returned it, or NULL (then asked). */
struct sdp_conn *sdp_hello_accept(struct sdp_listener *l, int newfd,
				  const struct sockaddr *peer, socklen_t peer_len,
				  int *refuse, const char **why);
/* Before connect(fd, dst): if an SDP listener serves dst, send it a hello
 * and return the new connection (state CONNECTING); NULL means plain TCP. */
struct sdp_connect_state {
	bool issued;                   /* connect() was already made */
	bool deferred;                 /* ...and its SYN is still to be released */
	int  result;                   /* issued, not deferred: 0 or -errno */
};
struct sdp_conn *sdp_hello_connect(int fd, const struct sockaddr *dst,
				   socklen_t len, enum fab_pref pref,
				   struct sdp_connect_state *cs);
void sdp_connect_done(struct sdp_conn *c, int fd, int err);

/* ---- pool.c: the process ------------------------------------------------- */
uint64_t sdp_now_ns(void);            /* CLOCK_MONOTONIC, ns */
extern pid_t sdp_pid;                 /* getpid(), kept current by the switch
				       * (start-up, fork) */

#endif
