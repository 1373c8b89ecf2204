/*
 * rx.h - the receive path's parts, shared by rx.c (the recv loop, Buffer
 * Copy, end of stream, readiness) and zcsink.c (the sink half of zero
 * copy: SrcAvail, SinkAvail, RdmaWrCompl). Private to those two files.
 *
 * recv walks the received messages in order; each message type has its
 * handler, which consumes what it can of the message into the call
 * (struct rx_call) and says whether the walk goes on.
 */
#ifndef SDP_RX_H
#define SDP_RX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include "sdp/conn.h"
#include "sdp/proto.h"

/* One recv call. */
struct rx_call {
	struct sdp_conn *c;
	int fd;                        /* the TCP socket (wake-ups) */
	const struct iovec *iov;       /* the application's buffer */
	int iovcnt;
	size_t total;                  /* bytes asked for */
	size_t copied;                 /* bytes delivered so far */
	bool peek;                     /* MSG_PEEK: consume nothing */
	bool nonblock;                 /* MSG_DONTWAIT or O_NONBLOCK */
	uint32_t thresh;               /* the zero-copy threshold (0: off) */
	bool bounce;                   /* below the zero-copy threshold: read
					* SrcAvails through a bounce buffer */
	bool offered;                  /* a SinkAvail of ours is out */
	/* What one walk of the ring met (reset at each pass): */
	bool fin_met;                  /* a peek reached the DisConn */
	uint32_t refused;              /* id of a SrcAvail we refused to read */
	/* Where the walk of the ring is: */
	uint32_t idx;                  /* message looked at (peek walks ahead) */
	uint32_t off;                  /* bytes of it already consumed */
};

/* A handler's answer: go on with the next message, or stop the walk with
 * 0 (the buffer is full) or -errno (-EAGAIN: look at the end state or
 * wait; -ECONNRESET: the connection was aborted). */
#define RX_MORE 1

/* rx.c */
int  rx_hdr(struct sdp_conn *c, uint32_t idx, struct sdp_bsdh *h, const char **payload);
void rx_release(struct sdp_conn *c, int fd);
int  rx_on_modechange(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl);

/* zcsink.c */
bool srcavail_revoked(struct sdp_conn *c, const char *pl);
/* Before a message with stream bytes: a SinkAvail of ours the source has
 * taken means its RdmaWrCompl had to come first (else abort). */
int  rx_sink_settle(struct rx_call *rc, uint8_t mid, bool revoked);
int  rx_on_srcavail(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl);
int  rx_on_wrcompl(struct rx_call *rc, const struct sdp_bsdh *h, const char *pl);
/* About to wait with nothing queued: spin, then maybe offer the
 * application's buffer (SinkAvail). > 0: something came, walk again;
 * 0: wait; < 0: -errno. */
int  rx_sink_before_wait(struct rx_call *rc);
/* The call ends with a SinkAvail out: withdraw it, or, taken, read its
 * RdmaWrCompl. Returns 0 or the call's result to keep. */
int  rx_sink_end(struct rx_call *rc, int r);
/* Answer a SrcAvailCancel of the peer (rx_lock held: no read in flight). */
void rx_ack_cancel(struct sdp_conn *c, int fd);

#endif
