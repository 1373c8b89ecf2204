/*
 * zclib.h - zero-copy helpers shared by the t_zc_* programs: set and read
 * back the per-socket threshold, and read the path counters.
 */
#ifndef SDP_ZCLIB_H
#define SDP_ZCLIB_H

#include "testlib.h"

/* Sets the threshold; sdp: it reads back, tcp: both calls ENOPROTOOPT. */
static inline void zc_thresh(int fd, int th)
{
	int v = -7;
	socklen_t len = sizeof v;
	if (tl_sdp_mode()) {
		SYS(setsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &th, sizeof th));
		SYS(getsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len));
		CHECK_EQ(len, sizeof v);
		CHECK_EQ(v, th);
	} else {
		CHECK_ERR(setsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &th,
				     sizeof th), ENOPROTOOPT);
		CHECK_ERR(getsockopt(fd, SOL_TCP, SDP_ZCOPY_THRESH, &v, &len),
			  ENOPROTOOPT);
	}
}

struct zc { uint64_t tx, rx, txb, txr, txw, rxb, rxr, rxw; };

/* The counters of fd (zero under kernel TCP); each side's paths add up. */
static inline struct zc zc_get(int fd)
{
	struct sdp_sock_stats s;
	struct zc z = { 0 };
	if (tl_stats(fd, &s)) {
		z = (struct zc){ s.tx_bytes, s.rx_bytes, s.tx_bcopy_bytes,
				 s.tx_rzcopy_bytes, s.tx_wzcopy_bytes,
				 s.rx_bcopy_bytes, s.rx_rzcopy_bytes,
				 s.rx_wzcopy_bytes };
		CHECK_EQ(z.txb + z.txr + z.txw, z.tx);
		CHECK_EQ(z.rxb + z.rxr + z.rxw, z.rx);
	}
	return z;
}

static inline struct zc zc_sub(struct zc a, struct zc b)
{
	return (struct zc){ a.tx - b.tx, a.rx - b.rx, a.txb - b.txb,
			    a.txr - b.txr, a.txw - b.txw, a.rxb - b.rxb,
			    a.rxr - b.rxr, a.rxw - b.rxw };
}

/* What one end sent is what the other received, path by path. */
static inline void zc_match(struct zc snd, struct zc rcv)
{
	CHECK_EQ(snd.tx, rcv.rx);
	CHECK_EQ(snd.txb, rcv.rxb);
	CHECK_EQ(snd.txr, rcv.rxr);
	CHECK_EQ(snd.txw, rcv.rxw);
}

#endif
