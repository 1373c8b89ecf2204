/*
 * sdp.h - public interface of libsdp for applications that want to look at
 * or tune the Sockets Direct Protocol under an unmodified socket API.
 *
 * Nothing here is needed to run an application over SDP: `sdp run -- CMD`
 * is enough. These socket options let a program (or a test) ask whether a
 * stream socket really travels over SDP and tune it per socket. All options
 * live at level SOL_TCP (IPPROTO_TCP). On a kernel TCP socket without libsdp
 * loaded they fail with ENOPROTOOPT, exactly as unknown TCP options do.
 */
#ifndef SDP_H
#define SDP_H

#include <stdint.h>

/* getsockopt, int: 1 if the socket's stream travels over SDP, 0 if it is
 * plain TCP (never SDP, or fallen back). */
#define SDP_TRANSPORT        0x5D00

/* get/setsockopt, int: Zero Copy threshold in bytes for this socket.
 * Sends/receives of at least this many bytes may use Read/Write Zero Copy;
 * 0 turns zero copy off for the socket. */
#define SDP_ZCOPY_THRESH     0x5D01

/* getsockopt, struct sdp_sock_stats: the socket's counters. */
#define SDP_STATS            0x5D02

/* get/setsockopt, int: microseconds to busy-poll before blocking. */
#define SDP_SPIN_US          0x5D03

struct sdp_sock_stats {
	uint64_t tx_bytes;        /* stream bytes sent over SDP (any path) */
	uint64_t rx_bytes;        /* stream bytes received over SDP */
	uint64_t tx_msgs;         /* SDP messages posted (all kinds) */
	uint64_t rx_msgs;         /* SDP messages consumed (all kinds) */
	uint64_t tx_bcopy_bytes;  /* bytes sent by Buffer Copy */
	uint64_t tx_rzcopy_bytes; /* bytes sent by Read Zero Copy (peer pulled) */
	uint64_t tx_wzcopy_bytes; /* bytes sent by Write Zero Copy (we pushed) */
	uint64_t rx_bcopy_bytes;
	uint64_t rx_rzcopy_bytes;
	uint64_t rx_wzcopy_bytes;
	uint64_t doorbells_tx;    /* wake-ups sent to a sleeping peer */
	uint64_t doorbells_rx;
	uint32_t credits;         /* send credits (peer receive buffers) now */
	uint32_t transport;       /* 1 = SDP, 0 = TCP */
	/* The connection's shared memory: 1 if it is a reusable slot of the
	 * connecting process's arena; reused: 1 if that slot served an earlier
	 * connection (connecting side), or the accepting side already had the
	 * arena mapped (accepting side). */
	uint32_t region_pooled;
	uint32_t region_reused;
	/* zero-copy bytes moved through a bounce buffer: page-aliased
	 * buffers on a host whose Cross Memory Attach is slow for those */
	uint64_t zc_bounced;
	/* wake-ups for new data given through the readiness queue that all
	 * connections between the same two processes share (no system call
	 * unless the peer's epoll slept); doorbells_tx counts tokens */
	uint64_t queue_kicks;
	/* Asynchronous Zero Copy (SDP_AZCOPY=1). tx_bytes is the sum of the
	 * four tx_*copy_bytes, rx_bytes of the four rx_*copy_bytes. */
	uint64_t tx_azcopy_bytes; /* bytes whose send() returned while the
				   * peer had still to read them */
	uint64_t rx_azcopy_bytes; /* bytes read from such advertisements */
	uint64_t rx_azasync_bytes;/* bytes whose recv() returned before they
				   * were copied in (part of the rx_* above) */
	uint64_t az_faults;       /* accesses that found a page still in flight */
	uint64_t az_cow_copies;   /* advertisements copied aside to let a
				   * writer (or free, munmap...) go on */
	uint64_t az_outstanding;  /* advertisements not read yet, now */
	/* The send window (PROTOCOL.md 8): receive buffers of the peer our
	 * sends use now (credits with nothing in flight; TCP: the receive
	 * window), and the largest it was; an idle connection shrinks it back
	 * and gives its buffers' memory back (SDP_IDLE_TRIM_MS): trims, and
	 * the bytes they gave back. */
	uint32_t ring_window;
	uint32_t ring_window_max;
	uint64_t trims;
	uint64_t trimmed_bytes;
	/* tokens sent before sleeping although the peer had not asked for a
	 * wake-up (it may have been kept from asking: kick_owed, PROTOCOL.md
	 * section 9); not in doorbells_tx */
	uint64_t tokens_owed;
	/* wake-ups given to a peer thread blocked in send/recv through the
	 * futex word of shared memory (one FUTEX_WAKE, no token); not in
	 * doorbells_tx */
	uint64_t futex_kicks;
	/* sleeps of a blocked send/recv of this (threaded) process on that
	 * word, before it sleeps on the TCP socket */
	uint64_t futex_sleeps;
	/* Accepting side: the hellos its accept read (from the rendezvous
	 * and the put-back queue) to find this connection's - 1 when its
	 * own came first - and those of other connections it gave back for
	 * the other processes of a shared listener. Connecting side: 0. */
	uint32_t accept_hellos_read;
	uint32_t accept_hellos_back;
	/* of tx_bcopy_bytes, those written into the peer's buffer with
	 * streaming stores (SDP_COPY_STREAM: when plain stores are slow
	 * because the peer reads behind another cache) */
	uint64_t tx_stream_bytes;
};

#endif /* SDP_H */
