/*
 * fabric.h - the provider contract: the only way the SDP engine (src/sdp/)
 * reaches a fabric.
 *
 * A provider is one constant table of operations (struct fab_ops, filled
 * with designated initializers, as libfabric's providers do). The engine
 * never names a provider: at set-up fab_choose() (fabric.c) picks the one
 * able to reach the peer, and from then on the connection's endpoint
 * (struct fab_ep) carries its table. Nothing else of a provider is visible
 * outside src/fabric/. A provider gives, per connection:
 *   - set-up: for the connecting side an opaque offer (bytes that travel
 *     in the hello, plus descriptors passed with it), which the accepting
 *     side's provider consumes;
 *   - a reliable, ordered message channel in each direction made of a fixed
 *     number of receive buffers ("slots"); one posted message uses one of
 *     the peer's receive buffers, i.e. one credit;
 *   - a credit word: how many of our messages the peer has consumed (the
 *     receiver publishes it; on RDMA fabrics this is an RDMA write);
 *   - marks each side sets in its own state and the peer reads (FIN,
 *     abort, closed, shutdown of reads, fallback), and a sanity check of
 *     everything the peer wrote;
 *   - the zero-copy control words of each side (struct sdp_zctl, proto.h):
 *     read and written in place, made visible to the peer by zc_publish;
 *   - RDMA Read / RDMA Write of a peer buffer named by address + key;
 *   - wake-ups: a side that is about to sleep "arms" and the other side
 *     "kicks" it after making progress; the kick makes the connection's
 *     wait object readable;
 *   - what a fallback to TCP needs: a frozen position, and our own posted
 *     messages to re-send.
 *
 * Conventions for every operation: it returns >= 0 (or a value) on success
 * and -errno on failure; "ep" is an endpoint set up by offer or accept and
 * not yet detached. The engine serialises what it must: posting (tx_buf,
 * post, mark FIN/ABORT) under the connection's tx_lock, consuming (rx_peek
 * with a release after it, rx_release) under its rx_lock; everything else
 * may be called by any thread or forked process that holds the connection,
 * at any time, and must not block unless it says so. "Release" and
 * "acquire" below are C11 memory orders; stores the engine makes with
 * seq_cst atomics before a call are visible to the peer no later than the
 * effect of the call.
 *
 * The wait object of a connection is its TCP socket: the application keeps
 * the real socket fd, the peer's kick makes it readable (shm writes one
 * token byte to it), so poll, epoll and blocking reads on that fd wake up
 * when the peer made progress, and the kernel's FIN/RST on it tells that
 * the peer process is gone. The fd is passed per call (wfd) because fd
 * numbers are per process while an endpoint may be shared by forked
 * processes. (A provider whose wake-ups arrive on another descriptor - a
 * completion queue's - adds an operation naming it; the sleepers that
 * would poll it are sdp_wait in src/sdp/wait.c and the poll and epoll
 * scans of the switch.)
 */
#ifndef SDP_FABRIC_H
#define SDP_FABRIC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

struct fab_ep;
struct sdp_zctl;

/*
 * The clock every process of the host shares, for ordering only: when
 * did a connection's receive queue become non-empty, compared across
 * connections of different peers (epoll reports ready members in that
 * order, as the kernel's ready list does). On x86 the TSC: about 10 ns,
 * where clock_gettime costs 30 and a fenced TSC read 25-30; synchronised
 * across CPUs wherever the kernel uses it as its clocksource (where it
 * does not, only the order of readiness reports suffers). Not fenced: a
 * read may execute a few hundred cycles early, far less than the code
 * between two sends. FAB_CLOCK_SLACK: a margin in its units (a few
 * microseconds) for such reads and for skew between CPUs.
 */
static inline uint64_t fab_clock(void)
{
#if defined(__x86_64__) || defined(__i386__)
	return __rdtsc();
#else
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
#endif
}
#if defined(__x86_64__) || defined(__i386__)
#define FAB_CLOCK_SLACK 8192u             /* TSC ticks: 2-4 us */
#else
#define FAB_CLOCK_SLACK 2000u             /* ns */
#endif

/* What a sleeping side waits for (arm/kick). */
enum fab_wait {
	FAB_WAIT_RX     = 1u << 0,   /* a message arrives */
	FAB_WAIT_CREDIT = 1u << 1,   /* the peer consumed messages (credits back) */
	FAB_WAIT_ZC     = 1u << 2,   /* the peer's zero-copy words moved (RdmaRdCompl,
				      * cancel acknowledged) */
	FAB_WAIT_ALL    = 0x7,       /* every bit a waiter may arm */
};
/*
 * The second route of the same wake-ups: FAB_WAIT_Q(what) armed asks the
 * peer to report progress of that kind through a readiness queue of this
 * process (q_bind) instead of - or besides - a token on the connection's
 * own socket. One queue collects the wake-ups of many connections, and a
 * sleeper is woken through its descriptor once however many of them made
 * progress: the switch's epoll arms it for its members and reads the queue
 * (q_pop). The engine's own waits (wait.c) use the bits above. A queue arm
 * stays set until the peer's kick consumes it, like a token arm.
 */
#define FAB_WAIT_ROUTE2_SHIFT 8
#define FAB_WAIT_Q(w) ((unsigned)(w) << FAB_WAIT_ROUTE2_SHIFT)
#define FAB_WAIT_QALL FAB_WAIT_Q(FAB_WAIT_ALL)
/*
 * The third route: FAB_WAIT_F(what) armed asks the peer to bump our futex
 * word (fwake_word) and wake the threads asleep on it: a thread blocked in
 * send/recv of a process with threads sleeps there for a while before it
 * sleeps on the TCP socket (wait.c), and the peer's wake-up is then one
 * FUTEX_WAKE instead of a TCP send and a receive. Offered by providers
 * whose peers share memory with us (fwake_word not NULL).
 */
#define FAB_WAIT_ROUTE3_SHIFT 16
#define FAB_WAIT_F(w) ((unsigned)(w) << FAB_WAIT_ROUTE3_SHIFT)
#define FAB_WAIT_FALL FAB_WAIT_F(FAB_WAIT_ALL)

/*
 * Marks: facts about one side, set by that side only (mark) and read by
 * both (marks). Each is set once and never cleared for the connection's
 * life. Marks of the peer are asked for as they are; marks of our own
 * side shifted with FAB_MY().
 */
enum fab_mark {
	FAB_M_FIN      = 1u << 0,   /* no message after those posted so far (TCP:
				     * FIN); set under tx_lock */
	FAB_M_ABORT    = 1u << 1,   /* reset by this side (TCP: RST) */
	FAB_M_RD_SHUT  = 1u << 2,   /* shutdown(SHUT_RD): data sent to it now resets */
	FAB_M_CLOSED   = 1u << 3,   /* this side's socket is fully closed: the last
				     * thing the side writes to shared state */
	FAB_M_FB       = 1u << 4,   /* leaving SDP for TCP (fallback stage 1): this
				     * side posts and consumes nothing more; set
				     * with seq_cst under both locks, before the
				     * kick that tells the peer */
	FAB_M_FB_FINAL = 1u << 5,   /* fallback stage 2: its wake-up count is final
				     * and its position published; set only by
				     * fb_publish, never by mark */
	/* Derived, readable for the peer only: */
	FAB_M_FIN_READ = 1u << 6,   /* FIN, and we consumed every message before it */
	FAB_M_CAUGHT_UP = 1u << 7,  /* the peer consumed every message we posted */
};
#define FAB_MY(m) ((unsigned)(m) << 16)
/* Whose block a zero-copy compare-and-swap targets (zc_cas). */
#define FAB_PEERS 0u
#define FAB_OURS  FAB_MY(1)
/* The locks a self_sane caller holds. */
enum { FAB_SELF_TX = 1, FAB_SELF_RX = 2 };

/* What the engine tells a provider at set-up. */
struct fab_setup {
	uint32_t nslots;       /* offer: receive buffers per direction wanted */
	uint32_t slot_size;    /* offer: bytes per receive buffer wanted */
	bool     geometry_default; /* offer: nslots and slot_size are the
				* library's defaults, not the user's: a provider
				* may choose its own of the same ring bytes */
	uint64_t token;        /* the connection's identity, also in the hello:
				* random, unique per connection */
	int32_t  pid;          /* our process */
	int32_t  peer_pid;     /* the peer process as the kernel named it
				* (SO_PEERCRED of the rendezvous; across hosts:
				* as the hello says) */
	/* Providers that reach other hosts (FAB_T_REMOTE) only: */
	const struct sockaddr *local;  /* the TCP connection's local address */
	const struct sockaddr *remote; /* ... and its peer's */
	socklen_t local_len, remote_len;
	int      chan;         /* offer: the hello's TCP socket (the network
				* rendezvous, hello_net.c), which the provider
				* takes over to read the server's answer; -1 */
};

/* The offer: the provider's part of the hello and the descriptors passed
 * with it. */
#define FAB_OFFER_MAX 64       /* bytes of a provider's offer in the hello */
#define FAB_OFFER_FDS 3        /* descriptors passed with it, at most */
struct fab_offer {
	uint32_t len;                  /* bytes of data[] used */
	uint32_t nfds;                 /* descriptors in fds[] */
	int      fds[FAB_OFFER_FDS];
	uint32_t close_after;          /* offer: bit i set = the engine closes
					* fds[i] once sent (or on failure) */
	bool     reused;               /* offer: the memory served an earlier
					* connection (statistics) */
	uint8_t  data[FAB_OFFER_MAX];  /* opaque to the engine */
};

/* Provider tunables, from the engine's table of tunables (sdp/tunables.c). */
struct fab_params {
	uint32_t region_cache;         /* shm: regions per peer arena, 0 = no reuse */
	uint32_t ofi_port_offset;      /* ofi: the network rendezvous listens on the
					* TCP listener's port plus this */
	uint32_t ofi_hello_ms;         /* ofi: longest wait for the network
					* rendezvous to answer a connect */
	const char *ofi_provider;      /* ofi: libfabric provider name, NULL = any */
	uint32_t ring_start;           /* shm: receive buffers a connection's
					* sends start with (its window) */
	uint32_t idle_trim_ms;         /* shm: an idle direction gives its
					* buffers back after this (0 = never) */
	/* The engine's log (sdp/log.h), for providers with something to say
	 * about why a connection stays on TCP or is reset; may be NULL. */
	void (*log)(int level, const char *fmt, ...);
};

/* What a provider is (fab_ops.traits). shm has none of these. */
enum {
	/* Endpoints belong to the process that set them up (libfabric
	 * objects are per process): a forked process cannot use them, so the
	 * switch hands such connections back to TCP before a fork. */
	FAB_T_PRIVATE = 1u << 0,
	/* RDMA keys are memory registrations the fabric checks (mr_key): the
	 * engine advertises mr_key()'s key and verifies no process. */
	FAB_T_MR_KEYS = 1u << 1,
	/* No compare-and-swap on the peer's words (zc_cas of FAB_PEERS
	 * fails): Write Zero Copy is never taken. */
	FAB_T_NO_SINK = 1u << 2,
	/* Reaches other hosts: the hello travels through the network
	 * rendezvous (sdp/hello_net.c), not the host's AF_UNIX one. */
	FAB_T_REMOTE  = 1u << 3,
	/* The peer's CPU reads our send buffers where we write them (shared
	 * memory): large copies into them may use streaming stores
	 * (sdp_copy_shared in sdp/copy.h). */
	FAB_T_PEER_READS = 1u << 4,
};

/* Does a network fabric (FAB_T_REMOTE) carry this endpoint? (statistics) */
#define FAB_EP_NET(ep) ((ep)->ops && ((ep)->ops->traits & FAB_T_REMOTE))

/* A policy's choice of transport for an address (policy.h "use ... FABRIC"). */
enum fab_pref {
	FAB_PREF_ANY = 0,              /* whichever provider reaches the peer */
	FAB_PREF_SHM,
	FAB_PREF_OFI,
	FAB_PREF_TCP,                  /* none: plain TCP */
};

/* Provider ids as carried in the hello (wire values, never reused). */
enum fab_id {
	FAB_ID_SHM = 1,
	FAB_ID_OFI = 2,
};

struct fab_ops {
	const char *name;              /* "shm" */
	uint8_t     id;                /* enum fab_id */
	unsigned    traits;            /* FAB_T_* */

	/* ---- choice and set-up ------------------------------------------ */

	/* Once per process image, before any other operation: the provider's
	 * tunables. Called again with new values only before any endpoint
	 * exists. */
	void     (*init)(const struct fab_params *p);
	/* Can this provider carry a connection to the peer at this address
	 * (shm: an address of this host)? Any thread; may make system calls.
	 * A provider with FAB_T_REMOTE may answer "maybe" cheaply before its
	 * library is loaded (ofi: a peer on one of our interfaces' networks):
	 * reaches(NULL, 0) loads it (and says whether a fabric is there), and
	 * the same question asked after that is final. */
	bool     (*reaches)(const struct sockaddr *peer, socklen_t len);
	/* Can it carry connections of this geometry at all (shm: the memory
	 * a peer would have to map)? Start-up refuses settings none fits. */
	bool     (*fits)(uint32_t nslots, uint32_t slot_size);
	/* Connecting side, before its TCP connect: set up ep as side 0 with
	 * the geometry s asks for, and describe it for the peer in o (data,
	 * descriptors and which of them the engine closes once sent). The
	 * provider keeps ownership of the descriptors not marked close_after.
	 * 0 or -errno (then nothing is left to undo). */
	int      (*offer)(struct fab_ep *ep, const struct fab_setup *s,
			  struct fab_offer *o);
	/* Accepting side: set up ep as side 1 from the peer's offer o (as
	 * received: validate everything). The engine keeps ownership of
	 * o->fds and closes them after the call. 0, 1 (set up on memory
	 * already mapped for an earlier connection: statistics), -EPROTO
	 * (malformed: no honest peer sends it), -ESTALE (the offer belongs to
	 * an earlier connection attempt: its token differs or its client
	 * gave up), or another -errno (out of resources). */
	int      (*accept)(struct fab_ep *ep, const struct fab_setup *s,
			   const struct fab_offer *o);
	/* Connecting side: its TCP connect finished (err 0) or failed, or
	 * the hello never left (err -errno: no peer will ever accept this
	 * offer). Under no lock; called once. */
	void     (*connected)(struct fab_ep *ep, int err);
	/* Accepting side, optional (NULL: the connection is reset): the
	 * offer o cannot be set up here before we attached (out of memory,
	 * address space, mappings, connection slots). Tell the client that
	 * both ends use the TCP connection wfd (the accepted socket), so
	 * that it hands back on it what it posted (PROTOCOL.md section 4):
	 * 0 (done: wfd is plain TCP, anything written on it for the client
	 * is accounted for), -ESTALE (as for accept), or -errno (the client
	 * could not be told: reset). The engine keeps ownership of o->fds. */
	int      (*decline)(const struct fab_setup *s, const struct fab_offer *o,
			    int wfd);
	/* Connecting side, optional: our last close comes before the peer
	 * attached. true: the provider took the connection back for TCP
	 * before the peer could attach (the peer then keeps it on TCP too),
	 * and the peer's marks say so (FB_FINAL at position 0): the engine
	 * hands back what we posted on the TCP socket before it closes. */
	bool     (*abandon)(struct fab_ep *ep);
	/* Optional: has the peer set up its side (shm: the server attached
	 * the region)? A wait for a peer that is not up does not spin: it
	 * arms and sleeps at once (the peer's first kick wakes it). Lock-free,
	 * any thread; NULL: always up. */
	bool     (*peer_up)(struct fab_ep *ep);
	/* The last holder of our side is done with the connection (after
	 * marking it closed, or after connected() with an error): the memory
	 * may be reused once the peer is done too. ep is unusable after it. */
	void     (*detach)(struct fab_ep *ep);
	/* This process stops using the endpoint while a forked process still
	 * holds it (the shared endpoint stays as it is). */
	void     (*unmap)(struct fab_ep *ep);

	/* ---- message channel -------------------------------------------- */

	/* tx_buf returns the next send buffer (which needs a credit: call only
	 * when credits() > 0) and its capacity (slot_size); post publishes len
	 * bytes of it (release: the payload is visible before the message).
	 * Both under tx_lock. */
	void    *(*tx_buf)(struct fab_ep *ep, size_t *cap);
	int      (*post)(struct fab_ep *ep, size_t len);
	/* rx_peek returns the idx-th unconsumed message (acquire: its payload
	 * is complete) and the buffer's capacity: 0, -EAGAIN (fewer than idx+1
	 * pending) or -EPROTO (the peer's counters make no sense: abort). The
	 * message stays in shared memory: copy its header out before checking
	 * it. rx_release hands the head buffer back to the sender (one credit;
	 * release). Under rx_lock; rx_peek also lock-free as a snapshot. */
	int      (*rx_peek)(struct fab_ep *ep, uint32_t idx, const void **msg,
			    size_t *cap);
	int      (*rx_release)(struct fab_ep *ep);
	/* Credits we hold (0 if the peer's count is nonsense); messages
	 * waiting for us (UINT32_MAX if the peer's count is nonsense); our
	 * messages posted so far; the peer's messages consumed so far. Any
	 * thread, lock-free. */
	uint32_t (*credits)(struct fab_ep *ep);
	uint32_t (*rx_pending)(struct fab_ep *ep);
	uint64_t (*tx_seq)(struct fab_ep *ep);
	uint64_t (*rx_seq)(struct fab_ep *ep);
	/* When our receive queue last went from empty to non-empty
	 * (fab_clock; stamped by the sender as it posts into an empty queue):
	 * with messages pending, since when we have been readable; 0 when
	 * the stamped message was consumed already (not known). Lock-free. */
	uint64_t (*rx_since)(struct fab_ep *ep);

	/* ---- byte window (SO_SNDBUF / SO_RCVBUF, sdp/tx.c) ----------------- */

	/* Words each side publishes for the other (RDMA writes on a network
	 * fabric): rx_bytes - the stream bytes our application consumed
	 * (with every release, and after partial reads while the peer's
	 * sends are byte-limited); rcvbuf - our SO_RCVBUF as getsockopt
	 * reports it, 0 = not set; tx_limited - our sends are byte-limited.
	 * Each is one word: set_* are single stores any thread may make
	 * (set_rx_bytes under rx_lock, so the count only grows), peer_* are
	 * lock-free loads. */
	void     (*set_rx_bytes)(struct fab_ep *ep, uint64_t bytes);
	uint64_t (*peer_rx_bytes)(struct fab_ep *ep);
	void     (*set_rcvbuf)(struct fab_ep *ep, uint32_t bytes);
	uint32_t (*peer_rcvbuf)(struct fab_ep *ep);
	void     (*set_tx_limited)(struct fab_ep *ep, bool on);
	bool     (*peer_tx_limited)(struct fab_ep *ep);
	/* One more such word, for the end of the connection: our socket
	 * closes with a reset (SO_LINGER on with 0 s), so that a peer whose
	 * process ended without closing (the kernel closed its socket with a
	 * reset) can tell a reset TCP would have sent from one only our
	 * unread wake-ups caused (see tokens_unread). */
	void     (*set_linger0)(struct fab_ep *ep, bool on);
	bool     (*peer_linger0)(struct fab_ep *ep);

	/* ---- marks and the peer's sanity --------------------------------- */

	/* Set enum fab_mark bits (not FAB_M_FB_FINAL) in our own state (seq_cst).
	 * FIN records the messages posted so far: call it under tx_lock. */
	void     (*mark)(struct fab_ep *ep, unsigned m);
	/* Which of the marks in want hold: the peer's as enum fab_mark, ours
	 * as FAB_MY(enum fab_mark). Acquire; lock-free. */
	unsigned (*marks)(struct fab_ep *ep, unsigned want);
	/* Does everything the peer wrote make sense with what we know? false:
	 * the caller aborts the connection; *why (if why is not NULL) says
	 * what was wrong, in a static string. Lock-free, any thread: counters
	 * other threads of ours advance meanwhile never make an honest peer
	 * look insane. */
	bool     (*peer_sane)(struct fab_ep *ep, const char **why);
	/* Does what we published still hold what we wrote (a writer of shared
	 * memory could change it)? Exact for the words the locks held
	 * serialize (locked: FAB_SELF_TX with tx_lock, FAB_SELF_RX with
	 * rx_lock), consistent for the others. false: abort; *why as above.
	 * peer_sane includes it with no lock held. */
	bool     (*self_sane)(struct fab_ep *ep, unsigned locked, const char **why);

	/* ---- zero-copy control words (struct sdp_zctl) ------------------- */

	/* Our block, written by us only (except its sink_state, see zc_cas),
	 * and the peer's, which we only read (atomic loads, acquire). After
	 * writing words of our block, the engine publishes them: zc_publish
	 * makes bytes [off, off+len) of our block visible to the peer no later
	 * than any message posted or kick sent after it (shm: nothing to do,
	 * the block is shared). The peer may see the words of one call in any
	 * order: a word that makes others valid (an id, a state) is published
	 * by a later call. */
	struct sdp_zctl *(*zc_me)(struct fab_ep *ep);
	struct sdp_zctl *(*zc_peer)(struct fab_ep *ep);
	void     (*zc_publish)(struct fab_ep *ep, size_t off, size_t len);
	/* Compare-and-swap of the 32-bit word at offset off of a block (whose:
	 * FAB_OURS or FAB_PEERS), atomic with the peer's zc_cas of the
	 * same word; returns the value found (== expect: swapped). Only
	 * sink_state and az_moving (our own, between processes sharing the
	 * connection) are ever swapped. seq_cst. */
	uint32_t (*zc_cas)(struct fab_ep *ep, unsigned whose, size_t off,
			   uint32_t expect, uint32_t desired);
	/* The probe that tells whether we may RDMA-read the peer: probe_addr
	 * is what we publish (zctl probe_addr) for the peer's probe of us;
	 * probe reads the peer's published address raddr with key: 1 if it
	 * holds what it should, -EPROTO if not, -errno if the read failed. */
	uint64_t (*probe_addr)(struct fab_ep *ep);
	int      (*probe)(struct fab_ep *ep, uint64_t raddr, uint64_t key);

	/* ---- RDMA by address + key ---------------------------------------- */

	/* len bytes at raddr, to or from our scattered buffer local[0..nlocal);
	 * the key names the peer's memory (shm: a process the engine verified
	 * holds the far end). Blocking until done. Return the bytes moved (a
	 * short count is progress) or -errno (-EPERM/-EACCES: refused). */
	ssize_t  (*rdma_read)(struct fab_ep *ep, const struct iovec *local, int nlocal,
			      uint64_t raddr, size_t len, uint64_t rkey);
	ssize_t  (*rdma_write)(struct fab_ep *ep, const struct iovec *local, int nlocal,
			       uint64_t raddr, size_t len, uint64_t rkey);

	/* ---- wake-ups ------------------------------------------------------ */

	/* arm: ask the peer to kick us for `what` (enum fab_wait; a full fence
	 * follows, so a check after it sees any progress made before the
	 * peer's next kick); disarm undoes it. kick: after progress of kind
	 * `what` (RX: we posted; CREDIT: we released; ZC: our zero-copy words
	 * moved), wake the peer if it armed for it: 1 if a wake-up token was
	 * sent, 2 if only the peer's queue got the news (FAB_WAIT_Q), 3 if only
	 * its futex word (FAB_WAIT_F), 0 if none was needed, -errno. drain: consume pending wake-ups on wfd;
	 * 0, 1 = the peer's socket is closed (orderly EOF seen) or -errno
	 * (-ECONNRESET, -EPIPE: the peer is gone; -ETIMEDOUT: a network
	 * fabric's connection timed out). wfd < 0 (network providers only):
	 * consume nothing, only say -ETIMEDOUT or 0. */
	void     (*arm)(struct fab_ep *ep, unsigned what);
	void     (*disarm)(struct fab_ep *ep, unsigned what);
	int      (*kick)(struct fab_ep *ep, int wfd, unsigned what);
	int      (*drain)(struct fab_ep *ep, int wfd);
	/* Before we sleep (after arming): wake the peer if it may wait for
	 * progress of ours although it did not arm for it (its arm bits can
	 * be cleared by a writer of shared memory). 1 if a wake-up was sent. */
	int      (*kick_owed)(struct fab_ep *ep, int wfd);
	/* The word our threads sleep on (FUTEX_WAIT, shared) when they armed
	 * FAB_WAIT_F: the peer's kick bumps it and wakes them; we bump it too
	 * to wake our own. NULL op: the route is not offered. */
	_Atomic uint32_t *(*fwake_word)(struct fab_ep *ep);
	/* Wake-up tokens the peer has put on the TCP socket that we have not
	 * consumed yet (0 for a provider whose wake-ups never travel on it),
	 * and the engine's note that it read n announced tokens off the
	 * socket itself (fallback: the last tokens are read before application
	 * bytes): counted as taken; -EPROTO if they are not tokens (written
	 * outside the library: the stream cannot be handed over). */
	uint64_t (*tokens_due)(struct fab_ep *ep);
	int      (*tokens_took)(struct fab_ep *ep, const void *buf, size_t n);
	/* The other way round: tokens we put on the TCP socket that the peer
	 * has not consumed (0 for a provider whose wake-ups never travel on
	 * it). A peer process that ends without closing leaves them unread
	 * in its socket, and its kernel then closes with a reset where TCP,
	 * whose receive queue never held them, closes with a FIN. Lock-free. */
	uint64_t (*tokens_unread)(struct fab_ep *ep);
	/* The descriptor a sleeper polls (POLLIN) for this endpoint instead
	 * of the TCP socket tcpfd (shm: tcpfd itself, the TCP socket is the
	 * wait object). A provider whose wake-ups come on a completion
	 * queue's wait object returns one descriptor that is readable on
	 * those and on tcpfd's own events (FIN, RST). Stable for the
	 * endpoint's life; any thread of the owning process. */
	int      (*wait_fd)(struct fab_ep *ep, int tcpfd);

	/* ---- memory keys (FAB_T_MR_KEYS) ----------------------------------- */

	/* The key under which the peer may RDMA-read or -write len bytes at
	 * addr of ours (registered, or found in the registration cache), or
	 * 0: not possible (the caller uses Buffer Copy). shm: our pid (Cross
	 * Memory Attach names a process). Keys fit in 64 bits; SrcAvail carries the upper half in
	 * key_hi. */
	uint64_t (*mr_key)(struct fab_ep *ep, const void *addr, size_t len);

	/* ---- fallback to TCP ------------------------------------------------ */

	/* Stage 2 of leaving (after mark(FAB_M_FB) and the kick): no more
	 * wake-up tokens (their count becomes final), record how far we
	 * consumed the peer's messages (all before rx_seq, plus rx_off bytes
	 * of the next one), then set FAB_M_FB_FINAL. Under both locks.
	 * fb_peer_pos gives the peer's recorded position, valid once the
	 * peer's FAB_M_FB_FINAL is seen. tx_msg: our own message seq as posted
	 * (tx_seq - nslots <= seq < tx_seq, not yet consumed by the peer),
	 * for re-sending its payload on TCP; copy it out before checking. */
	void     (*fb_publish)(struct fab_ep *ep, uint32_t rx_off);
	void     (*fb_peer_pos)(struct fab_ep *ep, uint64_t *cons, uint32_t *off);
	const void *(*tx_msg)(struct fab_ep *ep, uint64_t seq);

	/* ---- readiness queues (optional: NULL if the provider has none) ---- */

	/* Can this process receive the endpoint's wake-ups through a queue
	 * (FAB_WAIT_Q arms)? If so, publish key as what the queue reports
	 * for it and return the queue's id (>= 0, per process; the low byte
	 * is a small index, and an id names one queue only: the id of a
	 * queue since gone never reaches its successor); else
	 * -1: wake-ups come as tokens only (also in a process that is not the
	 * queue's owner: a forked child, or a vfork child sharing the
	 * owner's memory). The same key and queue for every call on one
	 * endpoint in one process. Any thread, under no lock. */
	int      (*q_bind)(struct fab_ep *ep, uint32_t key);
	/* A reader (an epoll set) takes the queue: what the queue is made of
	 * (memory, descriptors) stays until its q_release, whatever happens
	 * to the endpoints bound to it or to the peer. Returns the descriptor
	 * that becomes readable when the queue has news (level-triggered:
	 * until q_pop took it), or -1 if the queue is gone (then its
	 * endpoints' wake-ups come as tokens; nothing to release). The calls
	 * below take a queue held so, from any thread. */
	int      (*q_hold)(int q);
	void     (*q_release)(int q);
	/* The descriptor of a held queue, or -1 if it is not the queue's any
	 * more (the application closed the number): not to be touched. */
	int      (*q_fd)(int q);
	/* Take up to max keys of endpoints that made progress since their
	 * queue arm; each key once (a key may come although nothing new is
	 * there - check the endpoint). Also consumes the descriptor's
	 * readiness. -EPIPE: the queue is gone for good (the peer process
	 * closed its end): stop waiting on it. */
	int      (*q_pop)(int q, uint32_t *keys, int max);
	/* A waiter is about to sleep on the queue's descriptor (+1, a full
	 * fence follows: check q_pending after it) or has woken (-1): the
	 * peer rings the descriptor only while someone sleeps. A +1 that
	 * returns true holds the queue until its -1 (which may come after
	 * the reader's q_release); false: the queue is gone, no -1. */
	bool     (*q_sleep)(int q, int delta);
	bool     (*q_pending)(int q);

	/* ---- the send window (optional: NULL if the provider has none) ---- */

	/* Slots of the peer's receive buffers our sends use now (credits
	 * when nothing is in flight, <= nslots). Any thread. */
	uint32_t (*tx_window)(struct fab_ep *ep);
	/* An idle look (no lock, cheap, no system call): true when our ring
	 * has been empty and nothing was posted for the idle time since
	 * earlier looks, and it holds memory or a grown window to give back. */
	bool     (*idle_due)(struct fab_ep *ep, uint64_t now_ns);
	/* Give back: under tx_lock; when nothing is in flight (else 0),
	 * shrink the window to its start and give the ring's pages back to
	 * the system; how=FAB_TRIM_CLOSE at the last close (also the peer's
	 * ring if the peer has closed: no one uses it any more). Returns the
	 * bytes given back. */
	size_t   (*trim)(struct fab_ep *ep, unsigned how);
};
enum { FAB_TRIM_IDLE = 0, FAB_TRIM_CLOSE = 1 };

/*
 * An endpoint lives in memory shared with forked children (the connection
 * pool), so it holds no pointers except into mappings inherited by fork.
 * The engine reads ops, side, nslots, slot_size and flags; the rest is the
 * provider's.
 */
#define FAB_EP_PRIV 128        /* bytes of provider state per endpoint */
struct fab_ep {
	const struct fab_ops *ops;     /* the provider; NULL: no endpoint (TCP) */
	uint32_t  side;        /* 0 = connecting side, 1 = accepting side */
	uint32_t  nslots;      /* receive buffers per direction (= max credits) */
	uint32_t  slot_size;   /* bytes per receive buffer (largest message) */
	uint32_t  flags;       /* FAB_EP_* */
	void     *base;        /* provider's: shm maps the connection region here */
	size_t    len;         /* provider's: shm: the mapping's length in bytes */
	/* The provider's own state of this endpoint (shm: struct shm_ep,
	 * shm_layout.h: what this side published, kept where the peer
	 * cannot write it). */
	_Alignas(8) unsigned char priv[FAB_EP_PRIV];
	char      label[16];   /* what carries it, for `sdp stat`: "ofi:tcp";
				* empty: the provider's name */
	uint64_t  mr_hits;     /* registration cache (FAB_T_MR_KEYS): buffers
				* found registered, and registrations made */
	uint64_t  mr_misses;
};

enum {
	FAB_EP_POOLED = 1u << 0,   /* the memory is reused between connections
				    * (statistics) */
};

/* > 0 while the calling thread is inside a provider's own library
 * (libfabric): the sockets made then are the provider's, not the
 * application's, and the switch passes every call on them through. */
extern __thread int fab_private;

/* Sends a provider still holds for a connection nobody may call (ofi
 * over libfabric's tcp provider, whose progress is manual: what the kernel
 * socket could not take waits until the process calls libfabric, where
 * TCP's kernel would send it by itself). While any are held, every sleep
 * of the library - the engine's blocking waits, poll, select, epoll_wait,
 * with or without SDP members - pushes them (fab_held_push) and lasts at
 * most fab_held_ms(its timeout) before it pushes again: a thread asleep on
 * another descriptor still delivers what send() took. Nothing held (any
 * process without ofi connections): ms is returned unchanged after one
 * load, and fab_held_push does nothing (fabric/ofi_chan.c). ms < 0: no
 * limit. */
int  fab_held_ms(int ms);
void fab_held_push(void);

/* The receive buffers of the peer our sends use now (<= nslots). */
static inline uint32_t fab_tx_window(struct fab_ep *ep)
{
	return ep->ops->tx_window ? ep->ops->tx_window(ep) : ep->nslots;
}

/* ---- the registry (fabric.c) ------------------------------------------- */

/* Every provider's init, once per process image. */
void fab_init(const struct fab_params *p);
/* The provider for a connection to peer, as the policy prefers: NULL when
 * none may carry it (plain TCP). */
const struct fab_ops *fab_choose(const struct sockaddr *peer, socklen_t len,
				 enum fab_pref pref);
/* The provider a hello names (enum fab_id), or NULL. */
const struct fab_ops *fab_by_id(unsigned id);
/* Can every provider carry connections of this geometry? */
bool fab_fits(uint32_t nslots, uint32_t slot_size);
/* For `sdp check`: the libfabric providers this host has and whether each
 * offers what the ofi provider needs (fabric/ofi_lib.c, also linked into
 * the tool). Returns the count, -1 if libfabric is not there. */
struct fab_prov_info {
	char name[32], fabric[64], domain[64];
	bool msg_ep, msg, rma, usable;
	char mr_mode[160];             /* "\"FI_MR_LOCAL\", ..." (JSON strings) */
	char why[96];
};
int fab_list_libfabric(struct fab_prov_info *out, int max);
/* Name the fabric in ep->label if the provider did not ("shm"). */
static inline void fab_label_default(struct fab_ep *ep)
{
	if (ep->ops && !ep->label[0]) {
		size_t i = 0;
		for (; ep->ops->name[i] && i < sizeof ep->label - 1; i++)
			ep->label[i] = ep->ops->name[i];
		ep->label[i] = 0;
	}
}
/* The descriptor to sleep on for ep (its wait_fd, else tcpfd). */
static inline int fab_wait_fd(struct fab_ep *ep, int tcpfd)
{
	return ep->ops && ep->ops->wait_fd ? ep->ops->wait_fd(ep, tcpfd) : tcpfd;
}
/* The network providers (FAB_T_REMOTE) that reach peer, preferred first:
 * used by the engine's network rendezvous for a destination no local
 * provider reaches. */
const struct fab_ops *fab_remote(void);

/* The names of the preferences (policy files, logs): header-only, so that
 * the policy parser and the tools need no provider. */
static const char *const fab_pref_names[] = {
	[FAB_PREF_ANY] = "any", [FAB_PREF_SHM] = "shm",
	[FAB_PREF_OFI] = "ofi", [FAB_PREF_TCP] = "tcp",
};
static inline const char *fab_pref_name(enum fab_pref pref)
{
	return (unsigned)pref < sizeof fab_pref_names / sizeof fab_pref_names[0] ?
	       fab_pref_names[pref] : "?";
}
/* 0 and the preference a name says, or -1 for an unknown name. */
static inline int fab_pref_parse(const char *name, enum fab_pref *pref)
{
	for (unsigned i = 0; i < sizeof fab_pref_names / sizeof fab_pref_names[0]; i++)
		if (!__builtin_strcmp(name, fab_pref_names[i])) {
			*pref = (enum fab_pref)i;
			return 0;
		}
	return -1;
}

#endif
