/*
 * fabric.h - the provider contract between the SDP engine and a fabric.
 *
 * The engine (src/sdp/) moves messages, credits and zero-copy data only
 * through this table. (The zero-copy control words, struct sdp_zctl, are
 * read and written in place through shm_zc_me/shm_zc_peer: a provider on
 * an RDMA fabric would mirror them with RDMA writes of those words.) A
 * provider gives it, per connection:
 *   - a reliable, ordered message channel in each direction made of a fixed
 *     number of receive buffers ("slots"); one posted message uses one of the
 *     peer's receive buffers, i.e. one credit;
 *   - a credit word: how many of our messages the peer has consumed (the
 *     receiver publishes it; on RDMA fabrics this is an RDMA write);
 *   - RDMA Read / RDMA Write of a peer buffer named by address + key;
 *   - a wake-up mechanism: a side that is about to sleep "arms" and the other
 *     side "kicks" it after making progress; the kick makes the endpoint's
 *     wait object (a file descriptor) readable.
 * All functions return >= 0 on success and -errno on failure.
 */
#ifndef SDP_FABRIC_H
#define SDP_FABRIC_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

struct fab_ep;

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
	FAB_WAIT_ENGINE = 1u << 2,   /* the engine's own (FAB_WAIT_ZC, conn.h) */
	FAB_WAIT_ALL    = 0x7,       /* every bit a waiter may arm */
};

struct fab_ops {
	const char *name;

	/* Message channel. tx_buf returns the next send buffer (which needs a
	 * credit: call only when credits() > 0) and its capacity; post publishes
	 * len bytes of it. rx_peek returns the idx-th unconsumed message (or -EAGAIN);
	 * rx_release hands the buffer back to the sender (returns one credit). */
	void    *(*tx_buf)(struct fab_ep *ep, size_t *cap);
	int      (*post)(struct fab_ep *ep, size_t len);
	int      (*rx_peek)(struct fab_ep *ep, uint32_t idx, const void **msg,
			    size_t *cap);
	int      (*rx_release)(struct fab_ep *ep);
	uint32_t (*credits)(struct fab_ep *ep);
	uint32_t (*rx_pending)(struct fab_ep *ep);     /* messages waiting */
	uint64_t (*tx_seq)(struct fab_ep *ep);         /* messages posted so far */
	uint64_t (*rx_seq)(struct fab_ep *ep);         /* messages consumed so far */
	/* When our receive queue last went from empty to non-empty
	 * (fab_clock; stamped by the sender as it posts into an empty queue):
	 * with messages pending, since when we have been readable; 0 when
	 * the stamped message was consumed already (not known). */
	uint64_t (*rx_since)(struct fab_ep *ep);

	/* Byte window (SO_SNDBUF / SO_RCVBUF, sdp/tx.c), words each side
	 * publishes for the other (RDMA writes on a network fabric):
	 * rx_bytes - the stream bytes our application consumed (with every
	 * release, and after partial reads while the peer's sends are
	 * byte-limited); rcvbuf - our SO_RCVBUF as getsockopt reports it,
	 * 0 = not set; tx_limited - our sends are byte-limited. */
	void     (*set_rx_bytes)(struct fab_ep *ep, uint64_t bytes);
	uint64_t (*peer_rx_bytes)(struct fab_ep *ep);
	void     (*set_rcvbuf)(struct fab_ep *ep, uint32_t bytes);
	uint32_t (*peer_rcvbuf)(struct fab_ep *ep);
	void     (*set_tx_limited)(struct fab_ep *ep, bool on);
	bool     (*peer_tx_limited)(struct fab_ep *ep);

	/* RDMA by address + key (the key names the peer's memory): len bytes
	 * at raddr, to or from our scattered buffer local[0..nlocal). Return
	 * the bytes moved (a short count is progress) or -errno. */
	ssize_t  (*rdma_read)(struct fab_ep *ep, const struct iovec *local, int nlocal,
			      uint64_t raddr, size_t len, uint64_t rkey);
	ssize_t  (*rdma_write)(struct fab_ep *ep, const struct iovec *local, int nlocal,
			       uint64_t raddr, size_t len, uint64_t rkey);

	/* Wake-ups. arm: ask the peer to kick us for `what`; disarm undoes it.
	 * kick: after progress of kind `what` (FAB_WAIT_RX: we posted;
	 * FAB_WAIT_CREDIT: we released), wake the peer if it armed for it.
	 * drain: consume pending wake-up tokens; returns 0 or -ECONNRESET/-EPIPE
	 * when the wait object reports the peer gone (1 = orderly EOF seen). */
	void     (*arm)(struct fab_ep *ep, unsigned what);
	void     (*disarm)(struct fab_ep *ep, unsigned what);
	int      (*kick)(struct fab_ep *ep, int wfd, unsigned what);
	int      (*drain)(struct fab_ep *ep, int wfd);
	/* detach: the last holder of our side is done with the connection
	 * (the memory may be reused once the peer is done too); unmap: this
	 * process stops using it while a forked process still holds it. */
	void     (*detach)(struct fab_ep *ep);
	void     (*unmap)(struct fab_ep *ep);
};

/*
 * The wait object of a connection is its TCP socket: the application keeps
 * the real socket fd, the peer's kick writes one token byte to it, so poll,
 * epoll and blocking reads on that fd wake up when the peer made progress,
 * and the kernel's FIN/RST on it tells that the peer process is gone. The
 * fd is passed per call (wfd) because fd numbers are per process while an
 * endpoint may be shared by forked processes.
 */

/* An endpoint lives in memory shared with forked children (the connection
 * pool), so it holds no pointers except into mappings inherited by fork. */
struct fab_ep {
	const struct fab_ops *ops;
	void     *base;        /* mapping of the connection region */
	size_t    len;         /* its length in bytes */
	uint32_t  side;        /* 0 = connecting side, 1 = accepting side */
	uint32_t  nslots;      /* receive buffers per direction (= max credits) */
	uint32_t  slot_size;   /* bytes per receive buffer */
	int32_t   peer_pid;    /* for RDMA by Cross Memory Attach */
	uint32_t  flags;       /* FAB_EP_* */
	/* What this side published in its own control block. Its own
	 * decisions use these copies, never the shared words (which anyone
	 * who can write the region can change); the shared words are what
	 * the peer reads, and shm_self_sane compares the two. */
	_Atomic uint64_t my_prod;        /* messages posted (TCP: snd_nxt) */
	_Atomic uint64_t my_cons;        /* peer messages consumed (TCP: rcv_nxt) */
	_Atomic uint64_t my_tokens_rcvd; /* peer tokens read off the socket */
	_Atomic uint64_t my_rx_bytes;    /* stream bytes consumed, as published
					  * for the byte window (TCP: copied_seq) */
	_Atomic uint32_t my_fb;          /* enum shm_fb */
	_Atomic uint32_t my_flags;       /* SHM_MY_*: marks we set (FIN, RST...) */
	_Atomic uint64_t full_at; /* the peer's prod when a release of ours
				   * found its ring full: it may wait for that
				   * credit (0: none) */
	_Atomic uint32_t owed_engine; /* a FAB_WAIT_ENGINE kick found the peer
				       * not armed: it may wait for it */
	uint32_t  pad1;
};

enum {
	FAB_EP_POOLED = 1u << 0,   /* the region is reused (shm_region.c) */
};

extern const struct fab_ops fab_shm_ops;

/* shm provider set-up (fabric/shm_region.c). create: a region sized for
 * nslots x slot_size per direction, mapped as side 0 - a slot of the arena
 * this process keeps for the peer process when one is free, else a memfd
 * of its own; the offer says what to pass to the peer. attach: map a region received from the peer,
 * validating its header; returns 1 if an existing mapping was reused. */
struct shm_offer {
	int      fd;           /* memfd to send with the hello */
	bool     own_fd;       /* a memfd of its own: close it once sent */
	bool     pooled;       /* an arena slot: the peer may keep its mapping */
	bool     reused;       /* the slot served an earlier connection */
	uint64_t off;          /* offset of the region in the memfd (pages) */
};
int  shm_region_create(uint32_t nslots, uint32_t slot_size, uint64_t token,
		       int32_t peer, struct fab_ep *ep, struct shm_offer *o);
int  shm_ep_attach(struct fab_ep *ep, int memfd, uint32_t side, uint64_t off,
		   bool pooled);
void shm_region_tune(uint32_t arena_slots);   /* 0: no reuse */
/* The largest memfd an accepting side maps (bytes): a region, or an arena
 * of regions, never exceeds it. */
#define SHM_MEMFD_MAX (1ull << 34)
/* Can a region of this geometry be created and accepted at all? */
bool shm_region_fits(uint32_t nslots, uint32_t slot_size);
/* Fields of the shared header other layers use. */
uint64_t shm_token(struct fab_ep *ep);
void shm_set_state(struct fab_ep *ep, uint32_t st);
uint32_t shm_get_state(struct fab_ep *ep);
void shm_set_pid(struct fab_ep *ep, int32_t pid);
void shm_set_fin(struct fab_ep *ep);         /* our direction is finished */
int  shm_peer_fin(struct fab_ep *ep);        /* peer direction finished, all consumed */
void shm_set_abort(struct fab_ep *ep);
int  shm_peer_abort(struct fab_ep *ep);
int  shm_peer_fin_seen(struct fab_ep *ep);   /* FIN received, maybe data before it */
bool shm_peer_sane(struct fab_ep *ep);       /* false: abort the connection */
/* Our own control block still holds what we wrote (exactly for the words
 * the held lock serializes: SHM_SELF_TX with tx_lock, SHM_SELF_RX with
 * rx_lock); false: abort, the reason in shm_peer_insane_why(). */
enum { SHM_SELF_TX = 1, SHM_SELF_RX = 2 };
enum { SHM_MY_FIN = 1, SHM_MY_ABORT = 2, SHM_MY_RDSHUT = 4, SHM_MY_CLOSED = 8 };
int  shm_my_abort(struct fab_ep *ep);        /* we published a reset */
bool shm_self_sane(struct fab_ep *ep, unsigned locked);
/* Before sleeping: a token the peer may be owed (see shm.c). */
int  shm_kick_owed(struct fab_ep *ep, int wfd);
const char *shm_peer_insane_why(void);       /* what the last false was about */
void shm_set_closed(struct fab_ep *ep);      /* our socket is fully closed */
void shm_set_rd_shut(struct fab_ep *ep);
int  shm_peer_rd_shut(struct fab_ep *ep);
int  shm_peer_closed(struct fab_ep *ep);
int  shm_peer_caught_up(struct fab_ep *ep);

/* Zero-copy control words of each side (layout: struct sdp_zctl). */
struct sdp_zctl;
struct sdp_zctl *shm_zc_me(struct fab_ep *ep);
struct sdp_zctl *shm_zc_peer(struct fab_ep *ep);

/* The one byte a kick writes on the TCP socket (a wake-up token). */
#define SHM_TOKEN_BYTE 0xDB

/* Fallback to TCP (sdp/fallback.c): the `fb` mark of a control block. */
enum shm_fb {
	SHM_FB_NONE    = 0,      /* on SDP */
	SHM_FB_LEAVING = 1,      /* stage 1: posts and consumes nothing more;
				  * the peer must follow */
	SHM_FB_FINAL   = 2,      /* stage 2: tokens_sent final, fb_rx_* valid */
};
int  shm_peer_fb(struct fab_ep *ep);         /* enum shm_fb */
int  shm_my_fb(struct fab_ep *ep);
void shm_fb_leave(struct fab_ep *ep);        /* stage 1 */
void shm_fb_publish(struct fab_ep *ep, uint32_t rx_off);   /* stage 2 */
void shm_fb_peer_pos(struct fab_ep *ep, uint64_t *cons, uint32_t *off);
uint64_t shm_tokens_due(struct fab_ep *ep);
void shm_tokens_took(struct fab_ep *ep, uint64_t n);
const void *shm_tx_msg(struct fab_ep *ep, uint64_t seq);

enum shm_state {
	SHM_ST_CONNECTING = 0,   /* client sent its hello, TCP connect running */
	SHM_ST_CONNECTED  = 1,   /* client's TCP connect succeeded */
	SHM_ST_ATTACHED   = 2,   /* server accepted and attached */
	SHM_ST_FAILED     = 3,   /* client's connect failed: hello is stale */
};

#endif
