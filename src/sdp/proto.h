/*
 * proto.h - SDP wire formats: the Base Sockets Direct Header (BSDH) that
 * starts every SDP message, the message ids, and the hello exchanged at
 * connection set-up. docs/PROTOCOL.md describes each message.
 *
 * All multi-byte fields are in host byte order: both ends of an shm
 * connection run on one host. (A network provider converts at its edge.)
 */
#ifndef SDP_PROTO_H
#define SDP_PROTO_H

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
 * before its TCP connect, with the connection's memory (a memfd) attached
 * as SCM_RIGHTS. 64 bytes.
 *
 *  off len field       meaning
 *   0   4  magic       SDP_HELLO_MAGIC
 *   4   2  version     SDP_PROTO_VERSION
 *   6   2  family      AF_INET or AF_INET6 of the TCP connection
 *   8  16  dst_addr    address connected to (IPv4 in the first 4 bytes)
 *  24   2  dst_port    port connected to (network order)
 *  26   2  src_port    connecting socket's local port (network order)
 *  28   4  nslots      receive buffers per direction
 *  32   4  slot_size   bytes per receive buffer
 *  36   4  pid         connecting process
 *  40   8  token       random; also stored in the shared region header
 *  48   8  time_ns     CLOCK_MONOTONIC at send (newest hello for a tuple wins)
 *  56   8  reserved    zero
 */
struct sdp_hello {
	uint32_t magic;
	uint16_t version;
	uint16_t family;
	uint8_t  dst_addr[16];
	uint16_t dst_port;
	uint16_t src_port;
	uint32_t nslots;
	uint32_t slot_size;
	int32_t  pid;
	uint64_t token;
	uint64_t time_ns;
	uint64_t reserved;
};
_Static_assert(sizeof(struct sdp_hello) == 64, "hello is 64 bytes");

#define SDP_HELLO_MAGIC   0x53445048u   /* "SDPH" */
#define SDP_PROTO_VERSION 1

#endif
