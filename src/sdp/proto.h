/*
 * proto.h - SDP wire formats: the Base Sockets Direct Header (BSDH) that
 * starts every SDP message, the message ids, and the hello exchanged at
 * connection set-up. docs/PROTOCOL.md describes each message.
 *
 * All multi-byte fields are in host byte order: both ends of an shm
 * connection run on one host. (A network provider converts at its edge.)
 * Each struct has its field table and a _Static_assert on its size.
 */
#ifndef SDP_PROTO_H
#define SDP_PROTO_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

/* Message ids, numbered as in the SDP specification (annex A4 of IBTA). */
enum sdp_mid {
	SDP_MID_HELLO          = 0x00,
	SDP_MID_HELLO_ACK      = 0x01,
	SDP_MID_DISCONN        = 0x02,  /* orderly close of one direction (FIN) */
	SDP_MID_ABORT          = 0x03,  /* abortive close (RST) */
	SDP_MID_SENDSM         = 0x04,
	SDP_MID_RDMA_WR_COMPL  = 0x05,
	SDP_MID_RDMA_RD_COMPL  = 0x06,
	SDP_MID_MODE_CHANGE    = 0x07,
	SDP_MID_SRC_CANCEL     = 0x08,
	SDP_MID_SINK_CANCEL    = 0x09,
	SDP_MID_SINK_CANCEL_ACK= 0x0A,
	SDP_MID_SINK_AVAIL     = 0xFD,
	SDP_MID_SRC_AVAIL      = 0xFE,
	SDP_MID_DATA           = 0xFF,  /* stream bytes follow the header */
};

/* BSDH flags */
#define SDP_BSDH_OOB_PEND  0x01
#define SDP_BSDH_REQ_ACK   0x02   /* sender waits for credits: answer soon */

/*
 * Base Sockets Direct Header, 16 bytes, at the start of every message.
 *
 *  off len field     meaning
 *   0   1  mid       message id (enum sdp_mid)
 *   1   1  flags     SDP_BSDH_*
 *   2   2  bufs      receive buffers the sender has posted for the peer
 *                    (its credit advertisement; TCP: the receive window)
 *   4   4  len       total message length in bytes, header included
 *   8   4  mseq      sequence number of this message (first is 1)
 *  12   4  mseq_ack  last message sequence the sender has consumed
 *                    (TCP: the acknowledgement number)
 */
struct sdp_bsdh {
	uint8_t  mid;
	uint8_t  flags;
	uint16_t bufs;
	uint32_t len;
	uint32_t mseq;
	uint32_t mseq_ack;
};
_Static_assert(sizeof(struct sdp_bsdh) == 16, "BSDH is 16 bytes");

/*
 * Hello: sent by the connecting side over the listener's rendezvous socket,
 * before its TCP connect, with the descriptors of the provider's offer
 * attached as SCM_RIGHTS (shm: the memfd of the connection's memory).
 * 144 bytes. Names the whole TCP 4-tuple; the provider's part (offer) is
 * opaque to the engine (shm: struct shm_offer, fabric/shm_layout.h).
 *
 *  off len field       meaning
 *   0   4  magic       SDP_HELLO_MAGIC
 *   4   2  version     SDP_PROTO_VERSION
 *   6   2  family      AF_INET or AF_INET6 of the TCP connection
 *   8  16  dst_addr    address connected to (IPv4 in the first 4 bytes)
 *  24   2  dst_port    port connected to (network order)
 *  26   2  src_port    connecting socket's local port (network order)
 *  28   4  pid         connecting process
 *  32   8  token       the connection's identity: unique, not secret
 *  40   8  time_ns     CLOCK_MONOTONIC at send (informational)
 *  48   4  flags       SDP_HELLO_RETURNED, _CONN, _JOIN (below); from a
 *                      client none
 *  52   1  fabric      the provider (enum fab_id: 1 = shm)
 *  53   1  nfds        descriptors attached (at most FAB_OFFER_FDS)
 *  54   2  offer_len   bytes of offer used (at most FAB_OFFER_MAX)
 *  56   8  reserved    zero
 *  64  16  src_addr    connecting socket's local address (IPv4: first 4)
 *  80  64  offer       the provider's offer, zero after offer_len
 *
 * The 4-tuple keeps its place in every version (offsets 0-27 and 64-79),
 * so that a listener can name the connection of a hello of another
 * version.
 */
struct sdp_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t family;
	uint8_t  dst_addr[16];
	uint16_t dst_port;
	uint16_t src_port;
	int32_t  pid;
	uint64_t token;
	uint64_t time_ns;
	uint32_t flags;         /* SDP_HELLO_* */
	uint8_t  fabric;        /* enum fab_id */
	uint8_t  nfds;
	uint16_t offer_len;
	uint64_t reserved;      /* zero */
	uint8_t  src_addr[16];
	uint8_t  offer[64];     /* FAB_OFFER_MAX */
};
_Static_assert(sizeof(struct sdp_hello) == 144, "hello is 144 bytes");
_Static_assert(offsetof(struct sdp_hello, src_port) == 26, "the 4-tuple keeps 0-27");
_Static_assert(offsetof(struct sdp_hello, token) == 32, "token at 32");
_Static_assert(offsetof(struct sdp_hello, flags) == 48, "flags at 48");
_Static_assert(offsetof(struct sdp_hello, src_addr) == 64, "src_addr stays at 64");
_Static_assert(offsetof(struct sdp_hello, offer) == 80, "offer at 80");

#define SDP_HELLO_MAGIC   0x53445048u   /* "SDPH" */
#define SDP_PROTO_VERSION 5
/* Only between processes sharing one listener (never from a client): a
 * hello taken by one of them and put back into the queue for another. It
 * is followed by the listener's 8-byte secret (struct sdp_hello_back). */
#define SDP_HELLO_RETURNED 0x80000000u
/* With SDP_HELLO_RETURNED only: what comes back is a rendezvous connection
 * whose hello had not arrived yet (the descriptor attached is that
 * connection, time_ns when it was first seen); the 4-tuple is empty. */
#define SDP_HELLO_CONN 0x20000000u

struct sdp_hello_back {
	struct sdp_hello h;     /* as the client sent it, h.pid as verified */
	uint64_t secret;        /* random, known only to the sharing processes */
};
_Static_assert(sizeof(struct sdp_hello_back) == 152, "returned hello is 152 bytes");

/* Only between listeners of one SO_REUSEPORT group (never from a client):
 * a listener asks to join the group's rendezvous: a hello (144 bytes) with
 * no descriptor and no offer; the 4-tuple names its wake-up TCP connection to the group,
 * token is a nonce. Answered on the same connection with struct
 * sdp_join_answer and two descriptors: the rendezvous socket and the
 * memfd of the group's shared block. Every other flag must be clear. */
#define SDP_HELLO_JOIN 0x40000000u

/*
 * Answer to a join request, 16 bytes, with SCM_RIGHTS [rendezvous, block].
 *
 *  off len field    meaning
 *   0   4  magic    SDP_JOIN_MAGIC
 *   4   2  version  SDP_PROTO_VERSION
 *   6   2  nfds     2
 *   8   8  nonce    the request's token
 */
struct sdp_join_answer {
	uint32_t magic;
	uint16_t version;
	uint16_t nfds;
	uint64_t nonce;
};
_Static_assert(sizeof(struct sdp_join_answer) == 16, "join answer is 16 bytes");
#define SDP_JOIN_MAGIC 0x53444a41u     /* "SDJA" */

/* Every version keeps the meaning of these hello fields: magic, version,
 * family, dst_addr, dst_port, src_port (offsets 0-27) and src_addr (64-79),
 * so that a listener can name - and reset - the connection of a client
 * whose hello it cannot serve (asserted with struct sdp_hello above). */

/*
 * SrcAvail payload (after the BSDH), 32 bytes: the data source offers a
 * buffer for the sink to RDMA Read (Read ZCopy).
 *
 *  off len field   meaning
 *   0   4  id      advertisement number, 1, 2, ... per connection
 *   4   4  len     bytes offered
 *   8   8  addr    address of the buffer in the source process
 *  16   4  key     the rkey: on shm the source process (Cross Memory
 *                  Attach); on a network fabric the low half of the
 *                  buffer's registration key
 *  20   4  flags   SDP_SA_ASYNC, or zero; other bits abort the connection
 *  24   4  key_hi  the key's high half (network fabrics), zero on shm
 *  28   4  rsvd    zero
 */
struct sdp_srcavail {
	uint32_t id;
	uint32_t len;
	uint64_t addr;
	int32_t  key;
	uint32_t flags;
	uint32_t key_hi;
	uint32_t rsvd;
};
/* The SrcAvail's whole key. */
static inline uint64_t sdp_srcavail_key(const struct sdp_srcavail *sa)
{
	return (uint64_t)(uint32_t)sa->key | (uint64_t)sa->key_hi << 32;
}
_Static_assert(sizeof(struct sdp_srcavail) == 32, "SrcAvail payload is 32 bytes");
/* The source's send() has returned (Asynchronous Zero Copy): its bytes may
 * move before they are read (copy-on-write): the sink reads them where the
 * source's table of moved advertisements says, after the moving/reading
 * handshake on az_moving (struct sdp_zctl). */
#define SDP_SA_ASYNC 0x1u

/*
 * The source's table of moved advertisements (Asynchronous Zero Copy), in
 * its own memory at zctl az_table; the sink reads what it needs of it by
 * RDMA Read (key: the SrcAvail's). A header, then one entry per ring slot,
 * for SrcAvail id at index id % nslots.
 *
 * header, 16 bytes:      entry, 16 bytes:
 *  off len field          off len field
 *   0   4  magic           0   4  id    the SrcAvail moved (0: none)
 *   4   4  pid             4   4  len   its length (as advertised)
 *   8   4  nslots          8   8  addr  where its bytes are now
 *  12   4  zero
 */
struct sdp_az_thdr {
	uint32_t magic;          /* SDP_AZ_TABLE_MAGIC */
	int32_t  pid;            /* the process whose table it is */
	uint32_t nslots;         /* entries */
	uint32_t zero;
};
_Static_assert(sizeof(struct sdp_az_thdr) == 16, "table header is 16 bytes");
struct sdp_az_tent {
	uint32_t id;
	uint32_t len;
	uint64_t addr;
};
_Static_assert(sizeof(struct sdp_az_tent) == 16, "table entry is 16 bytes");
#define SDP_AZ_TABLE_MAGIC 0x53444d54u    /* "SDMT" */

/*
 * RdmaWrCompl payload, 8 bytes: the source wrote len bytes into the sink
 * buffer of SinkAvail id (Write ZCopy); they come next in the stream.
 */
struct sdp_wrcompl {
	uint32_t id;
	uint32_t len;
};
_Static_assert(sizeof(struct sdp_wrcompl) == 8, "RdmaWrCompl payload is 8 bytes");

/*
 * ModeChange payload, 4 bytes: the new mode of the sender's half.
 *
 *  off len field   meaning
 *   0   4  mode    enum sdp_mode (conn.h): 0 buffered, 1 combined,
 *                  2 pipelined; anything else aborts the connection
 */
struct sdp_modechange {
	uint32_t mode;
};
_Static_assert(sizeof(struct sdp_modechange) == 4, "ModeChange payload is 4 bytes");

/*
 * Zero-copy control words, 128 bytes, part of each side's control block
 * in the shared region (written by that side and read by the peer; the one
 * exception is sink_state, which the source moves from offered to taken
 * with a compare-and-swap). On
 * this fabric they carry, as RDMA writes of a control word would, the
 * messages that refer to advertisements rather than to a stream position:
 *
 *  off len field       message / meaning
 *   0   4  rd_done     RdmaRdCompl: last SrcAvail id fully read or cancelled
 *   4   4  cancel_id   SrcAvailCancel: nonzero once a cancel was made; every
 *                      unread SrcAvail with id <= cancel_last is revoked
 *   8   8  rd_bytes    RdmaRdCompl: bytes read from the peer's SrcAvails, total
 *  16   4  cancel_ack  SrcAvailCancel acknowledged: the peer's cancel_id done
 *  20   4  sink_state  SinkAvail: 0 none, 1 offered, 2 taken (being written),
 *                      3 withdrawn by the sink
 *  24   4  sink_id     SinkAvail number
 *  28   4  sink_len    bytes the buffer can take
 *  32   8  sink_addr   buffer address in the sink process
 *  40   8  sink_pos    stream bytes the sink had consumed when it offered
 *  48   4  pid         our process (CMA key for SinkAvail, probe target)
 *  52   4  adv_max     SrcAvails we accept outstanding (Pipelined depth);
 *                      0 once we know we cannot read the peer
 *  56   4  mode        our send half's mode (enum sdp_mode)
 *  60   4  cancel_last highest revoked SrcAvail id (only grows)
 *  64   8  probe_addr  address of this region in our process (CMA probe)
 *  72   4  reading     SrcAvail id we are reading right now (0 none): a
 *                      cancel needs no answer while this is not in range
 *  76   4  refused     nonzero: the kernel refused us reading the peer; it
 *                      revokes its SrcAvails and sends by Buffer Copy (the
 *                      sink's request for Buffered mode)
 *  80   4  az_moving   source: id of an asynchronous SrcAvail whose bytes it
 *                      is copying aside right now, 0 none (CAS 0 -> id, then
 *                      0; never while the sink's `reading` is that id)
 *  84   4  az_zero     zero
 *  88   8  az_table    source: address of its table of moved advertisements
 *                      (struct sdp_az_thdr), 0 = none moved yet
 *  96  32  reserved
 */
struct sdp_zctl {
	_Atomic uint32_t rd_done;
	_Atomic uint32_t cancel_id;
	_Atomic uint64_t rd_bytes;
	_Atomic uint32_t cancel_ack;
	_Atomic uint32_t sink_state;
	_Atomic uint32_t sink_id;
	uint32_t sink_len;
	uint64_t sink_addr;
	uint64_t sink_pos;
	_Atomic int32_t pid;
	_Atomic uint32_t adv_max;
	_Atomic uint32_t mode;
	_Atomic uint32_t cancel_last;
	uint64_t probe_addr;
	_Atomic uint32_t reading;
	_Atomic uint32_t refused;
	_Atomic uint32_t az_moving;
	uint32_t az_zero;
	_Atomic uint64_t az_table;
	_Atomic int32_t fd_hint;
	char reserved[28];
};
_Static_assert(sizeof(struct sdp_zctl) == 128, "zero-copy control words are 128 bytes");
_Static_assert(offsetof(struct sdp_zctl, sink_state) == 20, "sink_state at 20");
_Static_assert(offsetof(struct sdp_zctl, pid) == 48, "pid at 48");
_Static_assert(offsetof(struct sdp_zctl, cancel_last) == 60, "cancel_last at 60");
_Static_assert(offsetof(struct sdp_zctl, refused) == 76, "refused at 76");
_Static_assert(offsetof(struct sdp_zctl, az_moving) == 80, "az_moving at 80");
_Static_assert(offsetof(struct sdp_zctl, az_table) == 88, "az_table at 88");
_Static_assert(offsetof(struct sdp_zctl, fd_hint) == 96, "fd_hint at 96");

enum { SDP_SINK_NONE = 0, SDP_SINK_OFFERED, SDP_SINK_TAKEN, SDP_SINK_WITHDRAWN };

#endif
