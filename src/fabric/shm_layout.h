/*
 * shm_layout.h - the shared-memory provider's wire formats: the region
 * layout and its offer in the hello (docs/PROTOCOL.md sections 3 and 5),
 * shared by its two files, shm.c (the message channel, marks, wake-ups,
 * control words) and shm_region.c (where a connection's memory comes from
 * and goes back to). Private to src/fabric/; the tests that play a hostile
 * peer include it to write exactly what a peer could write.
 */
#ifndef SDP_SHM_LAYOUT_H
#define SDP_SHM_LAYOUT_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "fabric/fabric.h"
#include "sdp/proto.h"

#define SHM_MAGIC   0x53444d52u   /* "SDMR" */
#define SHM_VERSION 8
#define SHM_HDR_SIZE 4096u
#define TOKENS_FROZEN (1ull << 63)   /* in tokens_sent: the count is final */
#define SHM_TOKEN_BYTE 0xDB          /* the byte a kick writes on the TCP socket */
/* The largest memfd an accepting side maps (bytes): a region, or an arena
 * of regions, never exceeds it. */
#define SHM_MEMFD_MAX (1ull << 34)

struct shm_side {                 /* written only by its own side */
	_Atomic uint64_t prod;        /* messages posted into our ring (TCP: snd_nxt) */
	_Atomic uint64_t post_ns;     /* fab_clock() when we last posted into an
				       * empty ring (TCP: when the skb queued to an
				       * empty receive queue woke the reader) */
	_Atomic uint64_t post_seq;    /* the message posted then (its prod value) */
	_Atomic uint32_t tx_limited;  /* 1: our sends are byte-limited: publish
				       * rx_bytes on partial reads too */
	_Atomic uint32_t win;         /* our send window: bits 0-15 W, the
				       * slots of our ring in use (1..nslots;
				       * 0: all, the layout of version 6),
				       * bits 16-31 its offset (< W): message
				       * seq sits in slot (seq + off) % W
				       * (shm_slot). TCP: the receive window
				       * (SDP's ChRcvBuf) */
	char pad0[32];
	_Atomic uint64_t cons;        /* messages consumed from the peer's ring (TCP: rcv_nxt acked) */
	_Atomic uint64_t rx_bytes;    /* stream bytes our application consumed
				       * (TCP: copied_seq) */
	_Atomic uint32_t rcvbuf;      /* SO_RCVBUF, bytes as getsockopt reports
				       * it, if the application set it; 0 = not
				       * set (TCP: sk_rcvbuf with SOCK_RCVBUF_LOCK) */
	_Atomic uint32_t link_key;    /* what our link's news bitmap calls this
				       * connection (shm_link.c); valid once a
				       * queue arm (FAB_WAIT_Q) of ours is seen */
	_Atomic uint32_t linger0;     /* 1: our socket closes with a reset
				       * (TCP: SOCK_LINGER with sk_lingertime 0) */
	char pad1[36];
	/* marks: change a few times in a connection's life; the peer reads
	 * them in every call on its socket, so they share no line with the
	 * words we write at every sleep and wake-up (below) */
	_Atomic uint32_t fin;         /* 1: no message after fin_seq (TCP: FIN) */
	_Atomic uint32_t abort;       /* 1: connection reset by this side (TCP: RST) */
	_Atomic uint64_t fin_seq;     /* prod value when fin was set */
	_Atomic uint32_t fb;          /* enum shm_fb: leaving SDP for TCP */
	uint32_t fb_rx_off;           /* bytes of message fb_rx_cons+1 consumed */
	_Atomic uint64_t fb_rx_cons;  /* peer messages fully consumed at fallback */
	_Atomic uint32_t closed;      /* 1: this side's socket is fully closed */
	_Atomic uint32_t rd_shut;     /* 1: shutdown(SHUT_RD): data now resets */
	_Atomic int32_t  pid;         /* process that last used this side */
	char pad2[20];
	/* wake-ups: written at every sleep (armed) and every token */
	_Atomic uint32_t armed;       /* FAB_WAIT_* bits: kick me on these */
	_Atomic uint32_t fwake;       /* futex word of our threads asleep with a
				       * FAB_WAIT_F arm: the peer's kick (and our
				       * own wake-ups) bump it and FUTEX_WAKE (TCP:
				       * the socket's wait queue). Written by both */
	_Atomic uint64_t tokens_sent; /* wake-up bytes written to the TCP socket */
	_Atomic uint64_t tokens_rcvd; /* wake-up bytes of the peer's consumed */
	_Atomic uint32_t arms;        /* arms made less those withdrawn, a
				       * count (wraps): the peer whose kick
				       * took one notes it, and an arm gone
				       * while this stayed is its own kick's,
				       * not a third party's (kick_owed) */
	char pad4[36];
	struct sdp_zctl zc;           /* zero-copy control words (proto.h) */
};
_Static_assert(sizeof(struct shm_side) == 384, "side block is 6 cache lines");

/*
 * The provider's state in an endpoint (struct fab_ep priv): what this side
 * published in its own control block. Its own decisions use these copies,
 * never the shared words (which anyone who can write the region can
 * change); the shared words are what the peer reads, and self_sane
 * compares the two. Each copy is stored before its shared word.
 */
struct shm_ep {
	_Atomic uint64_t my_prod;        /* messages posted (TCP: snd_nxt) */
	_Atomic uint64_t my_cons;        /* peer messages consumed (TCP: rcv_nxt) */
	_Atomic uint64_t my_tokens_rcvd; /* peer tokens read off the socket */
	_Atomic uint64_t my_rx_bytes;    /* stream bytes consumed, as published
					  * for the byte window (TCP: copied_seq) */
	_Atomic uint32_t my_fb;          /* enum shm_fb */
	_Atomic uint32_t my_flags;       /* SHM_MY_*: marks we set (FIN, RST...) */
	_Atomic uint64_t full_at;        /* the peer's prod when a release of ours
					  * found its ring full: it may wait for
					  * that credit (0: none) */
	_Atomic uint32_t owed_engine;    /* a FAB_WAIT_ZC kick found the peer not
					  * armed: it may wait for it */
	_Atomic uint32_t took_arms;      /* the peer's arms count when a kick of
					  * ours last took an arm of its */
	_Atomic uint32_t took;           /* 1: took_arms is set */
	int32_t link;                    /* our link with the peer process
					  * (shm_link.c: index in this process's
					  * table, inherited by fork), -1: none */
	_Atomic int32_t q_bound;         /* pid of the process that bound the
					  * endpoint to its queue (q_bind), 0: none */
	/* The send window (shm.c, PROTOCOL.md 5.2): as published in win,
	 * changed under tx_lock. */
	_Atomic uint32_t my_win;         /* the win word (0: not set yet) */
	_Atomic uint32_t my_grow;        /* 1: credits ran out below nslots:
					  * grow at the next wrap of the window */
	_Atomic uint32_t touch;          /* slots of our ring written since the
					  * last trim (high-water mark) */
	_Atomic uint32_t nodelay;        /* 1 once TCP_NODELAY is set on the TCP
					  * socket: before the first token (a
					  * connection that never sends one makes
					  * no such call) */
	_Atomic uint64_t idle_prod;      /* my_prod at the last idle look */
	_Atomic uint64_t idle_since;     /* sdp_now_ns() since when my_prod has
					  * stayed idle_prod with the ring empty */
	_Atomic uint32_t peer_up;        /* connecting side: 1 once the region's
					  * state was seen ATTACHED (it never
					  * changes again: not looked at since) */
};
_Static_assert(sizeof(struct shm_ep) <= FAB_EP_PRIV, "fits the endpoint");
static inline struct shm_ep *SE(struct fab_ep *ep) { return (struct shm_ep *)(void *)ep->priv; }

enum { SHM_MY_FIN = 1, SHM_MY_ABORT = 2, SHM_MY_RDSHUT = 4, SHM_MY_CLOSED = 8 };

/* A control block's `fb` word: leaving SDP for TCP (fallback). */
enum shm_fb {
	SHM_FB_NONE    = 0,      /* on SDP */
	SHM_FB_LEAVING = 1,      /* stage 1: posts and consumes nothing more;
				  * the peer must follow (FAB_M_FB) */
	SHM_FB_FINAL   = 2,      /* stage 2: tokens_sent final, fb_rx_* valid
				  * (FAB_M_FB_FINAL) */
};

/* The region's set-up state (hdr.state). */
enum shm_state {
	SHM_ST_CONNECTING = 0,   /* client sent its hello, TCP connect running */
	SHM_ST_CONNECTED  = 1,   /* client's TCP connect succeeded */
	SHM_ST_ATTACHED   = 2,   /* server accepted and attached */
	SHM_ST_FAILED     = 3,   /* client's connect failed: hello is stale */
	SHM_ST_REFUSED    = 4,   /* server could not set up its side (out of
				  * resources) before attaching: both ends use
				  * TCP; one wake-up token follows on it */
	SHM_ST_ABANDONED  = 5,   /* client closed before the server attached:
				  * it re-sent its ring on TCP; both use TCP */
};

/*
 * Region header, page 0 of the region (PROTOCOL.md 5.1).
 *
 *  off len field      meaning
 *   0   4  magic      SHM_MAGIC
 *   4   4  version    SHM_VERSION
 *   8   4  nslots     receive buffers per direction
 *  12   4  slot_size  bytes per receive buffer
 *  16   8  token      the connection's identity, also in the hello
 *  24   8  ring_off   offset of ring 0 (SHM_HDR_SIZE)
 *  32   4  state      enum shm_state
 *  36   4  lease      enum shm_lease (shm_region.c): arena slots only
 *  40  24  pad
 *  64 768  side[2]    control blocks of side 0 and side 1
 */
struct shm_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t nslots;              /* receive buffers per direction */
	uint32_t slot_size;           /* bytes per receive buffer */
	uint64_t token;               /* random, also in the hello */
	uint64_t ring_off;            /* offset of ring 0 */
	_Atomic uint32_t state;       /* enum shm_state */
	_Atomic uint32_t lease;       /* enum shm_lease: pooled regions only,
				       * kept across reuse (shm_region.c) */
	char pad[24];
	struct shm_side side[2];
};
_Static_assert(sizeof(struct shm_hdr) <= SHM_HDR_SIZE, "header fits a page");
_Static_assert(offsetof(struct shm_hdr, state) == 32, "state at 32");
_Static_assert(offsetof(struct shm_hdr, side) == 64, "control blocks at 64");
_Static_assert(offsetof(struct shm_side, cons) == 64, "cons on its own line");
_Static_assert(offsetof(struct shm_side, zc) == 256, "zero-copy words at 256");
_Static_assert(offsetof(struct shm_side, fin) == 128 && offsetof(struct shm_side, pid) == 168,
	       "marks on their own line, at 128");
_Static_assert(offsetof(struct shm_side, armed) == 192 && offsetof(struct shm_side, tokens_rcvd) == 208,
	       "wake-up words on their own line, at 192");
_Static_assert(offsetof(struct shm_side, win) == 28, "window at 28");

/*
 * The one place a ring slot is named (PROTOCOL.md 5): message seq of a
 * sender whose control block's win word says (W, off) sits in slot
 * (seq + off) % W of its ring; a word of 0 is the whole ring (W = nslots,
 * off 0). Any word names a slot inside the ring; whether it makes sense
 * (1 <= W <= nslots, off < W) is shm_win_ok's.
 */
#define SHM_WIN(w, off) ((uint32_t)(w) | (uint32_t)(off) << 16)
static inline uint32_t shm_win_w(uint32_t win) { return win & 0xffffu; }
static inline uint32_t shm_win_off(uint32_t win) { return win >> 16; }

static inline bool shm_win_ok(uint32_t nslots, uint32_t win)
{
	uint32_t w = shm_win_w(win), off = shm_win_off(win);
	return w ? w <= nslots && off < w : off == 0;
}

static inline uint32_t shm_slot(uint32_t nslots, uint32_t win, uint64_t seq)
{
	uint32_t w = shm_win_w(win), off = shm_win_off(win);
	if (!shm_win_ok(nslots, win) || !w)
		w = nslots, off = 0;
	return (uint32_t)((seq % w + off) % w);
}

/*
 * The shm offer: the provider's bytes of the hello (sdp_hello.offer), 8
 * bytes, with exactly one descriptor passed: the memfd holding the region.
 *
 *  off len field      meaning
 *   0   4  region_pg  offset of the region in the memfd, in 4 KiB pages
 *                     (0 for a memfd of its own)
 *   4   4  flags      SHM_OFFER_POOLED: the memfd is an arena of the
 *                     client's and the region one of its slots, so the
 *                     server may keep its mapping; any other bit: rejected
 */
struct shm_offer {
	uint32_t region_pg;
	uint32_t flags;
	uint64_t link_id;             /* SHM_OFFER_LINK*: the link's id */
};
_Static_assert(sizeof(struct shm_offer) == 16, "shm offer is 16 bytes");
_Static_assert(sizeof(struct shm_offer) <= FAB_OFFER_MAX, "fits the hello");
#define SHM_OFFER_POOLED 0x1u
/* SHM_OFFER_LINK: two more descriptors follow the region's memfd: the link
 * page's memfd and the accepting side's end of the link socket pair
 * (shm_link.c, PROTOCOL.md 9.1), sent until a process of the accepting side
 * has taken the link or declined it (the page's owner[1]). SHM_OFFER_LINK_ID:
 * no descriptors; link_id names the link the accepting side may have taken.
 * Neither: no link, the connection's wake-ups are tokens only. */
#define SHM_OFFER_LINK    0x2u
#define SHM_OFFER_LINK_ID 0x4u
#define SHM_LINK_DECLINED (-1)        /* owner[1]: the accepting side said no */

/*
 * Links (shm_link.c, PROTOCOL.md 9.1): one per pair of processes, shared by
 * all their connections. A link page (a memfd of SHM_LINK_SIZE bytes, made
 * by the connecting process) holds, for each side, a bitmap of the keys of
 * its connections that have news for it (set by the other side's kick of a
 * queue arm), and a socket pair carries the bells that wake a side asleep
 * on its end.
 *
 *  link page           off   len
 *   magic, version       0     8
 *   owner[2]             8     8   pid using each side's end, 0 = none
 *   id                  16     8   random (logs)
 *   dir[0], dir[1]      64  2x2112 news for side 0 / side 1:
 *     summary[4]         0    32   bit w: bits[w] may be non-zero
 *     sleepers          32     4   waiters of that side asleep on its end
 *     bell              36     4   1: a bell is on its way, not taken yet
 *     rings             40     8   bells sent (statistics)
 *     bits[256]         64  2048   bit k: the connection with key k
 */
#define SHM_LINK_MAGIC   0x53444c4bu  /* "SDLK" */
#define SHM_LINK_VERSION 1
#define SHM_LINK_KEYS    16384        /* keys are connection pool indexes */
#define SHM_LINK_SIZE    8192u
struct shm_link_dir {
	_Atomic uint64_t summary[SHM_LINK_KEYS / 64 / 64];
	_Atomic uint32_t sleepers;
	_Atomic uint32_t bell;
	_Atomic uint64_t rings;
	char pad[16];
	_Atomic uint64_t bits[SHM_LINK_KEYS / 64];
};
struct shm_link_page {
	uint32_t magic;
	uint32_t version;
	_Atomic int32_t owner[2];
	uint64_t id;
	char pad[40];
	struct shm_link_dir dir[2];
};
_Static_assert(sizeof(struct shm_link_dir) == 2112, "link direction is 2112 bytes");
_Static_assert(offsetof(struct shm_link_page, dir) == 64, "link directions at 64");
_Static_assert(sizeof(struct shm_link_page) <= SHM_LINK_SIZE, "link page fits");

/* shm_link.c: the links of this process. */
/* shm_link_offer: 0 no link, else the SHM_OFFER_LINK* flag to set. */
int  shm_link_offer(struct fab_ep *ep, int32_t peer, int32_t me, struct fab_offer *o,
		    uint64_t *id);
void shm_link_accept(struct fab_ep *ep, const struct fab_offer *o, uint64_t id, int32_t me);
void shm_link_put(struct fab_ep *ep);
int  shm_link_kick(struct fab_ep *ep, unsigned q);   /* 1: news sent; <0: no link */
int  shm_q_bind(struct fab_ep *ep, uint32_t key);
int  shm_q_hold(int q);
void shm_q_release(int q);
int  shm_q_fd(int q);
int  shm_q_pop(int q, uint32_t *keys, int max);
bool shm_q_sleep(int q, int delta);
bool shm_q_pending(int q);

static inline struct shm_hdr *H(struct fab_ep *ep) { return ep->base; }
static inline struct shm_side *me(struct fab_ep *ep) { return &H(ep)->side[ep->side]; }
static inline struct shm_side *peer(struct fab_ep *ep) { return &H(ep)->side[!ep->side]; }

static inline char *ring(struct fab_ep *ep, uint32_t which)
{
	return (char *)ep->base + SHM_HDR_SIZE +
	       (size_t)which * ep->nslots * ep->slot_size;
}

static inline size_t region_size(uint32_t nslots, uint32_t slot_size)
{
	return SHM_HDR_SIZE + 2 * (size_t)nslots * slot_size;
}

/* The provider's table (shm.c); the engine reaches it through fabric.c. */
extern const struct fab_ops fab_shm_ops;

/* shm_region.c: the ops-table entries that make and give back memory. */
void shm_init(const struct fab_params *p);
bool shm_fits(uint32_t nslots, uint32_t slot_size);
int  shm_ep_offer(struct fab_ep *ep, const struct fab_setup *s, struct fab_offer *o);
int  shm_ep_accept(struct fab_ep *ep, const struct fab_setup *s,
		const struct fab_offer *o);
void shm_ep_connected(struct fab_ep *ep, int err);
int  shm_ep_decline(const struct fab_setup *s, const struct fab_offer *o, int wfd);
bool shm_ep_abandon(struct fab_ep *ep);
bool shm_ep_peer_up(struct fab_ep *ep);
void shm_detach(struct fab_ep *ep);
void shm_unmap(struct fab_ep *ep);

/* shm.c: the send window's start and the idle time before a trim. */
void shm_win_init(uint32_t start, uint32_t idle_ms);
/* shm.c: write one wake-up byte on the TCP socket wfd, not blocking, not
 * raising SIGPIPE: 1 written, or -errno (-EIO: the socket took nothing).
 * Counting it (tokens_sent) is the caller's. */
int shm_token_write(int wfd);

#endif
