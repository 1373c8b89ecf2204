/*
 * shm_layout.h - the shared-memory provider's region layout, shared by its
 * two files: shm.c (the message channel, wake-ups, control words) and
 * shm_region.c (where a connection's memory comes from and goes back to).
 * Private to src/fabric/.
 */
#ifndef SDP_SHM_LAYOUT_H
#define SDP_SHM_LAYOUT_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "fabric/fabric.h"
#include "sdp/proto.h"

#define SHM_MAGIC   0x53444d52u   /* "SDMR" */
#define SHM_VERSION 5
#define SHM_HDR_SIZE 4096u
#define TOKENS_FROZEN (1ull << 63)   /* in tokens_sent: the count is final */

struct shm_side {                 /* written only by its own side */
	_Atomic uint64_t prod;        /* messages posted into our ring (TCP: snd_nxt) */
	_Atomic uint64_t post_ns;     /* fab_clock() when we last posted into an
				       * empty ring (TCP: when the skb queued to an
				       * empty receive queue woke the reader) */
	_Atomic uint64_t post_seq;    /* the message posted then (its prod value) */
	_Atomic uint32_t tx_limited;  /* 1: our sends are byte-limited: publish
				       * rx_bytes on partial reads too */
	char pad0[36];
	_Atomic uint64_t cons;        /* messages consumed from the peer's ring (TCP: rcv_nxt acked) */
	_Atomic uint64_t rx_bytes;    /* stream bytes our application consumed
				       * (TCP: copied_seq) */
	_Atomic uint32_t rcvbuf;      /* SO_RCVBUF, bytes as getsockopt reports
				       * it, if the application set it; 0 = not
				       * set (TCP: sk_rcvbuf with SOCK_RCVBUF_LOCK) */
	char pad1[44];
	_Atomic uint32_t armed;       /* FAB_WAIT_* bits: kick me on these */
	_Atomic uint32_t fin;         /* 1: no message after fin_seq (TCP: FIN) */
	_Atomic uint64_t fin_seq;     /* prod value when fin was set */
	_Atomic uint32_t abort;       /* 1: connection reset by this side (TCP: RST) */
	_Atomic int32_t  pid;         /* process that last used this side */
	_Atomic uint64_t tokens_sent; /* wake-up bytes written to the TCP socket */
	_Atomic uint64_t tokens_rcvd; /* wake-up bytes of the peer's consumed */
	_Atomic uint32_t fb;          /* enum shm_fb: leaving SDP for TCP */
	uint32_t fb_rx_off;           /* bytes of message fb_rx_cons+1 consumed */
	_Atomic uint64_t fb_rx_cons;  /* peer messages fully consumed at fallback */
	_Atomic uint32_t closed;      /* 1: this side's socket is fully closed */
	_Atomic uint32_t rd_shut;     /* 1: shutdown(SHUT_RD): data now resets */
	struct sdp_zctl zc;           /* zero-copy control words (proto.h) */
};
_Static_assert(sizeof(struct shm_side) == 320, "side block is 5 cache lines");

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

/* shm_region.c: the ops-table entries that give memory back. */
void shm_detach(struct fab_ep *ep);
void shm_unmap(struct fab_ep *ep);

#endif
