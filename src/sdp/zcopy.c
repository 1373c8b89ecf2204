/*
 * zcopy.c - Zero Copy: the application's buffers move directly between the
 * two processes by Cross Memory Attach (process_vm_readv/writev), the shm
 * fabric's RDMA Read and RDMA Write.
 *
 * Read ZCopy (the receiver is slower): a blocking send() of at least the
 * threshold advertises its buffer with SrcAvail messages in the data ring
 * (after any Buffer Copy data, so order is kept): one at a time in
 * Combined mode, up to adv_max chunks at once in Pipelined mode. The sink's
 * recv() reads straight into the application's buffer and reports progress
 * in its control block (RdmaRdCompl: rd_bytes, rd_done). send() returns when
 * everything was read. A signal or SO_SNDTIMEO revokes what is left
 * (SrcAvailCancel: cancel_id..cancel_last); the sink acknowledges
 * (cancel_ack) once no read is in flight, and send() returns exactly the
 * bytes read, or EINTR/EAGAIN. A sink that never answers is aborted after
 * SDP_CANCEL_WAIT_MS.
 *
 * Write ZCopy (the sender is slower): a blocking recv() of at least the
 * threshold that finds nothing queued offers its buffer (SinkAvail, in its
 * control block, with the stream position it has consumed). A send() that
 * finds the offer at its own stream position takes it (CAS), writes into it
 * and posts RdmaWrCompl in the data ring. The sink withdraws an offer not
 * taken with the same CAS, so withdrawing needs no round trip.
 *
 * Cross Memory Attach is probed once per connection (reading the peer's
 * mapping of the shared header must give our own header); if the kernel
 * refuses (ptrace policy, seccomp, other users), zero copy stays off for the
 * connection and everything goes by Buffer Copy.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "sdp/calib.h"
#include "sdp/conn.h"
#include "sdp/iov.h"
#include "sdp/proto.h"
#include "sdp/sys.h"
#include "sdp/log.h"

#define SDP_CANCEL_WAIT_MS 2000

const char *zc_mode_name(int mode)
{
	return mode == SDP_MODE_PIPELINED ? "pipelined" :
	       mode == SDP_MODE_COMBINED ? "combined" : "buffered";
}

void zc_attach(struct sdp_conn *c, int fd)
{
	struct sdp_zctl *z = sdp_zc_me(c);
	atomic_store(&z->fd_hint, (int32_t)fd);
	atomic_store(&z->pid, (int32_t)sdp_pid);
	z->probe_addr = c->ep.ops->probe_addr(&c->ep);
	/* Optimistic: if the kernel refuses a read later, we refuse that
	 * SrcAvail and the source falls back to Buffer Copy. */
	atomic_store(&z->adv_max, sdp_tun.azcopy && sdp_tun.az_depth > sdp_tun.zcopy_depth ?
		     sdp_tun.az_depth : sdp_tun.zcopy_depth);
	atomic_store(&z->mode, SDP_MODE_BUFFERED);
	sdp_zc_publish(c, rd_done, refused);
}

int zc_key_check(struct sdp_conn *c, int fd, int32_t key)
{
	if (c->ep.ops->traits & FAB_T_MR_KEYS)
		return 1;                     /* a registration the fabric checks */
	if (key <= 0)
		return 0;
	if (key == c->peer_pid || key == atomic_load(&c->key_ok))
		return 1;
	/* The pid written in shared memory is the peer's claim and could name
	 * anyone (us): only a process the kernel shows holding the far end
	 * of this connection (a pre-fork worker, a forked child). */
	int r = sdp_ident_holds_peer(fd, key, atomic_load(&sdp_zc_peer(c)->fd_hint));
	sdp_log(2, "zero-copy key %d: %s", (int)key, r == 1 ? "holds the far end" :
		r == 0 ? "does not hold the far end" : strerror(-r));
	if (r == 1)
		atomic_store(&c->key_ok, key);
	return r;
}

bool zc_key_ok(struct sdp_conn *c, int fd, int32_t key)
{
	return zc_key_check(c, fd, key) == 1;
}

/* Can we read the peer's memory? The provider's probe of the address the
 * peer published (shm: its mapping of our shared header). */
static int cma_probe(struct sdp_conn *c, int fd)
{
	struct sdp_zctl *pz = sdp_zc_peer(c);
	uint64_t addr = pz->probe_addr;
	pid_t pid = atomic_load(&pz->pid);
	if (!pid || !addr)
		return 0;                     /* peer not attached yet: ask later */
	if (!zc_key_ok(c, fd, pid))
		return -EPERM;                /* not provably our peer: no CMA */
	int r = c->ep.ops->probe(&c->ep, addr, (uint64_t)pid);
	if (r < 0 && r != -EPROTO)
		sdp_log(1, "zero copy off for this connection: RDMA Read from %d: %s",
			(int)pid, strerror(-r));
	return r;
}

/* Probe once the peer is there; publish what we can do: adv_max > 0 tells
 * the peer we can read its SrcAvails and that it may write into us. */
void zc_probe(struct sdp_conn *c, int fd)
{
	if (atomic_load_explicit(&c->cma, memory_order_relaxed) != 0)
		return;
	int v = cma_probe(c, fd);
	if (!v)
		return;
	atomic_store(&c->cma, v);
	if (v < 0) {
		atomic_store(&sdp_zc_me(c)->adv_max, 0);
		sdp_zc_publish(c, adv_max, adv_max);
	}
}

bool zc_usable(struct sdp_conn *c, int fd, size_t len, bool nonblock)
{
	uint32_t th = atomic_load_explicit(&c->zcopy_thresh, memory_order_relaxed);
	if (!th || nonblock || len < th)
		return false;
	/* Any process holding the socket may hand out its buffers: the peer
	 * verifies the key it is given (zc_key_ok). */
	zc_probe(c, fd);
	/* Usable if we can write into the peer (Write ZCopy) or it can read
	 * us (Read ZCopy, its adv_max). */
	return atomic_load(&c->cma) > 0 ||
	       atomic_load(&sdp_zc_peer(c)->adv_max) > 0;
}

/* ---- RDMA by Cross Memory Attach, around the host's slow case ------------- */

#define BOUNCE_CHUNK (64u << 10)

/* Where the calibration found CMA slow between buffers at the same offset
 * in their pages (the kernel's rep movsb on some CPUs), such a transfer
 * goes through a bounce buffer 2 KiB further into its page: two fast
 * copies beat one slow one there. Returns the bytes moved (a short count
 * is progress) or -errno. */
ssize_t zc_rdma(struct sdp_conn *c, bool write, const struct iovec *local, int nlocal,
		uint64_t raddr, size_t n, uint64_t key)
{
	struct fab_ep *ep = &c->ep;
	if (!sdp_tun.cma_alias || nlocal < 1 ||
	    !sdp_page_aliased((uintptr_t)local[0].iov_base, (uintptr_t)raddr))
		return write ? ep->ops->rdma_write(ep, local, nlocal, raddr, n, key)
			     : ep->ops->rdma_read(ep, local, nlocal, raddr, n, key);
	char *mem = malloc(BOUNCE_CHUNK + 4096);
	if (!mem)
		return write ? ep->ops->rdma_write(ep, local, nlocal, raddr, n, key)
			     : ep->ops->rdma_read(ep, local, nlocal, raddr, n, key);
	uintptr_t want = ((uintptr_t)raddr + 2048) & 4095;
	char *b = mem + ((want - ((uintptr_t)mem & 4095)) & 4095);
	size_t done = 0;
	ssize_t r = 0;
	while (done < n) {
		size_t k = n - done < BOUNCE_CHUNK ? n - done : BOUNCE_CHUNK;
		struct iovec bv = { b, k };
		if (write) {
			iov_gather(b, local, nlocal, done, k, false);
			r = ep->ops->rdma_write(ep, &bv, 1, raddr + done, k, key);
		} else {
			r = ep->ops->rdma_read(ep, &bv, 1, raddr + done, k, key);
			if (r > 0)
				iov_scatter(local, nlocal, done, b, (size_t)r);
		}
		if (r <= 0)
			break;
		done += (size_t)r;
		if ((size_t)r < k)
			break;                    /* partial: progress so far */
	}
	free(mem);
	c->st.zc_bounced += done;
	if (done)
		return (ssize_t)done;
	return r < 0 ? r : 0;
}

/* ---- source: Write ZCopy into an offered sink buffer ----------------------- */

static ssize_t try_sink(struct sdp_conn *c, int fd, const struct iovec *iov,
			int iovcnt, size_t off, size_t len)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	if (atomic_load(&c->cma) <= 0 ||
	    atomic_load(&pz->sink_state) != SDP_SINK_OFFERED ||
	    pz->sink_pos != c->tx_stream || ep->ops->credits(ep) == 0)
		return 0;
	int32_t sink = atomic_load(&pz->pid);
	if (!zc_key_ok(c, fd, sink))
		return 0;                     /* only into a verified peer */
	uint32_t id = atomic_load(&pz->sink_id);
	if (ep->ops->zc_cas(ep, FAB_PEERS, offsetof(struct sdp_zctl, sink_state),
			    SDP_SINK_OFFERED, SDP_SINK_TAKEN) != SDP_SINK_OFFERED)
		return 0;                     /* withdrawn meanwhile */
	size_t n = len < pz->sink_len ? len : pz->sink_len;
	/* The local side of the copy: our iovec from stream offset off. */
	struct iovec lv[64];
	int ln = iov_slice(iov, iovcnt, off, n, lv, 64);
	n = iov_total(lv, ln);
	ssize_t w = zc_rdma(c, true, lv, ln, pz->sink_addr, n, (uint64_t)sink);
	if (w < 0) {
		sdp_log(1, "Write ZCopy refused (%s): Buffer Copy from now on",
			strerror((int)-w));
		atomic_store(&c->cma, (int32_t)w);
		w = 0;
	}
	struct sdp_wrcompl wc = { .id = id, .len = (uint32_t)w };
	struct iovec v = { &wc, sizeof wc };
	sdp_post_msg(c, fd, SDP_MID_RDMA_WR_COMPL, &v, 1, 0, sizeof wc);
	c->tx_stream += (uint64_t)w;
	c->st.tx_wzcopy_bytes += (uint64_t)w;
	return w;
}

/* ---- source: Read ZCopy ------------------------------------------------------ */

/* Our half's mode; the ModeChange message is posted (with a credit of its
 * own) before the next SrcAvail: see post_mode. */
void zc_set_mode(struct sdp_conn *c, int mode)
{
	if (c->mode == mode)
		return;
	c->mode = (uint8_t)mode;
	atomic_store(&sdp_zc_me(c)->mode, (uint32_t)mode);
	sdp_zc_publish(c, mode, mode);
	c->mode_msg = 1;
}

void zc_post_mode(struct sdp_conn *c, int fd)
{
	struct sdp_modechange m = { .mode = c->mode };
	struct iovec v = { &m, sizeof m };
	sdp_post_msg(c, fd, SDP_MID_MODE_CHANGE, &v, 1, 0, sizeof m);
	c->mode_msg = 0;
}

/* Has the sink answered the cancel of ids r[0]..r[1]? It marks the
 * SrcAvail it reads before checking for a cancel (and clears the mark
 * after publishing rd_bytes): if none of ours is being read, it never
 * will be, and rd_bytes is final. */
static bool cancel_answered(struct sdp_conn *c, void *arg)
{
	const uint32_t *r = arg;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	if (atomic_load(&pz->cancel_ack) == r[0])
		return true;
	uint32_t rd = atomic_load(&pz->reading);
	return rd == 0 || rd < r[0] || rd > r[1] ||
	       atomic_load(&pz->rd_done) >= r[1];    /* all read before the cancel */
}

/* Revoke advertisements first..last; wait (bounded) for the sink's ack.
 * Returns 0, or -ECONNRESET when the sink never answered (aborted). */
static int cancel_and_wait(struct sdp_conn *c, int fd, uint32_t first, uint32_t last)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *z = sdp_zc_me(c);
	if (last > atomic_load(&z->cancel_last)) {
		atomic_store(&z->cancel_last, last);   /* only grows */
		sdp_zc_publish(c, cancel_last, cancel_last);
	}
	atomic_store(&z->cancel_id, first);   /* seq_cst: before reading "reading" */
	sdp_zc_publish(c, cancel_id, cancel_id);
	ep->ops->kick(ep, fd, FAB_WAIT_RX | FAB_WAIT_CREDIT | FAB_WAIT_ZC);
	/* The sink answers within one read's time: spin through it, then
	 * sleep on the wake-up its answer brings (a stopped sink costs no
	 * CPU), keeping tx_lock: no other send may advertise meanwhile. */
	uint64_t deadline = sdp_now_ns() + SDP_CANCEL_WAIT_MS * 1000000ull;
	uint32_t range[2] = { first, last };
	while (!cancel_answered(c, range)) {
		if (sdp_is_reset(c) || atomic_load(&c->peer_gone))
			return -ECONNRESET;
		if (sdp_wait_until(c, fd, FAB_WAIT_ZC, cancel_answered, range,
				   deadline) == -ETIMEDOUT) {
			sdp_log(0, "SrcAvailCancel not answered in %d ms: connection aborted",
				SDP_CANCEL_WAIT_MS);
			sdp_conn_abort(c, ECONNRESET);
			return -ECONNRESET;
		}
	}
	return 0;
}

static ssize_t send_sync(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
			 size_t off, size_t len, bool *go_bcopy);

/* A synchronous send may revoke what it advertised: while it runs no
 * asynchronous SrcAvail is posted among its own (az.h). */
ssize_t zc_send(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
		size_t off, size_t len, bool *go_bcopy)
{
	atomic_store(&c->zc_sending, 1);
	ssize_t r = send_sync(c, fd, iov, iovcnt, off, len, go_bcopy);
	atomic_store(&c->zc_sending, 0);
	return r;
}

static ssize_t send_sync(struct sdp_conn *c, int fd, const struct iovec *iov, int iovcnt,
			 size_t off, size_t len, bool *go_bcopy)
{
	*go_bcopy = false;
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	size_t done = 0;

	/* The receiver already waits with its buffer: write into it. */
	ssize_t w = try_sink(c, fd, iov, iovcnt, off, len);
	if (w > 0) {
		done += (size_t)w;
		if (done == len)
			return (ssize_t)done;
	}

	uint32_t depth = atomic_load(&pz->adv_max);
	if (depth == 0)
		return (ssize_t)done;         /* the sink cannot read us: BCopy */
	if (depth > sdp_tun.zcopy_depth)
		depth = sdp_tun.zcopy_depth;
	zc_set_mode(c, depth > 1 ? SDP_MODE_PIPELINED : SDP_MODE_COMBINED);
	size_t chunk = depth > 1 ? sdp_tun.zcopy_chunk : len;

	/* Overlap: the last part goes by Buffer Copy behind the SrcAvails.
	 * While the receiver copies it out of the ring, this send has
	 * already returned and the next one is advertising its buffer.
	 * That pays only when the hand-off costs wake-ups (spinning off):
	 * the receiver copies the tail twice as slowly as it reads by CMA
	 * (the ring was just written on the other CPU), so a tail of a
	 * quarter made 1 MiB streams 15-20% slower, 64 KiB ones 35% slower,
	 * than a hand-off both sides catch by spinning (wait.c). */
	size_t tail = (len - done) / 4;
	if (tail > sdp_tun.zcopy_tail)
		tail = sdp_tun.zcopy_tail;
	if (len - done < 65536)
		tail = 0;                     /* too small to be worth splitting */
	if (atomic_load_explicit(&c->spin_us, memory_order_relaxed))
		tail = 0;
	size_t zlen = len - tail;             /* advertise [done, zlen) */

	uint64_t rd_start = atomic_load(&pz->rd_bytes);
	uint32_t first_id = c->src_id + 1, last_id = c->src_id;
	size_t advertised = done, bdone = 0;
	int err = 0;
	bool nokey = false;
	for (;;) {
		/* Advertise while the pipeline and the credits allow. */
		while (advertised < zlen && last_id - atomic_load(&pz->rd_done) < depth &&
		       ep->ops->credits(ep) > 0) {
			if (c->mode_msg) {
				zc_post_mode(c, fd);
				continue;     /* re-check the credits */
			}
			/* One SrcAvail is contiguous: stay in one iovec element. */
			struct iovec v;
			if (iov_slice(iov, iovcnt, off + advertised, zlen - advertised,
				      &v, 1) != 1)
				break;            /* cannot happen: zlen is within the iovec */
			size_t n = v.iov_len < chunk ? v.iov_len : chunk;
			/* shm: our pid; a network fabric: the buffer's
			 * registration (its cache, fabric.h mr_key) */
			uint64_t key = ep->ops->mr_key ?
				       ep->ops->mr_key(ep, v.iov_base, n) : (uint64_t)sdp_pid;
			if (!key) {
				nokey = true;     /* cannot register: Buffer Copy */
				break;
			}
			struct sdp_srcavail sa = {
				.id = ++c->src_id,
				.len = (uint32_t)n,
				.addr = (uint64_t)(uintptr_t)v.iov_base,
				.key = (int32_t)(uint32_t)key,
				.key_hi = (uint32_t)(key >> 32),
			};
			struct iovec sv = { &sa, sizeof sa };
			sdp_post_msg(c, fd, SDP_MID_SRC_AVAIL, &sv, 1, 0, sizeof sa);
			last_id = sa.id;
			advertised += n;
			c->tx_stream += n;
		}
		if (nokey) {
			err = -EACCES;            /* the rest by Buffer Copy */
			break;
		}
		/* Everything advertised was read: queue the tail by Buffer
		 * Copy (only now, so that a cancel never leaves a gap). */
		size_t payload = ep->slot_size - sizeof(struct sdp_bsdh);
		while (advertised == zlen && bdone < tail &&
		       atomic_load(&pz->rd_done) >= last_id && ep->ops->credits(ep) > 0) {
			size_t n = tail - bdone < payload ? tail - bdone : payload;
			sdp_post_msg(c, fd, SDP_MID_DATA, iov, iovcnt, off + zlen + bdone, n);
			bdone += n;
			c->tx_stream += n;
			c->st.tx_bcopy_bytes += n;
		}
		uint32_t rd = atomic_load(&pz->rd_done);
		if (advertised == zlen && bdone == tail && rd >= last_id)
			break;                    /* everything was read or queued */
		bool room = (advertised < zlen && last_id - rd < depth) ||
			    (advertised == zlen && bdone < tail && rd >= last_id);
		c->zc_mark = rd;
		/* Spin about as long as the peer needs to read what is out. */
		c->zc_spin_us = (uint32_t)((advertised - done) / 12000);
		bool moved = off > 0 || done > 0 || bdone > 0 ||
			     atomic_load(&pz->rd_bytes) != rd_start;
		err = sdp_wait(c, fd, room ? FAB_WAIT_CREDIT : FAB_WAIT_ZC,
			       moved ? SDP_WAIT_PARTIAL : 0, &c->tx_lock);
		if (!err && atomic_load(&pz->refused)) {
			err = -EACCES;            /* the sink cannot read us */
			break;
		}
		if (!err && sdp_fallback_pending(c))
			err = -SDP_EFALLBACK;
		if (!err && (sdp_is_reset(c) || atomic_load(&c->peer_gone)))
			err = -EPIPE;
		if (err)
			break;
	}
	if (err == -SDP_EFALLBACK) {
		/* Leave SDP now, while our buffer is valid: the fallback
		 * re-sends on TCP what the peer had not read of it. */
		sdp_unlock(&c->tx_lock);
		sdp_fallback_fd(c, fd);
		sdp_lock(&c->tx_lock);
		c->st.tx_rzcopy_bytes += atomic_load(&pz->rd_bytes) - rd_start;
		return (ssize_t)(advertised + bdone);
	}
	if (err && last_id >= first_id && atomic_load(&pz->rd_done) < last_id &&
	    !sdp_is_reset(c) && !atomic_load(&c->peer_gone)) {
		/* Interrupted (a signal, SO_SNDTIMEO) or refused: revoke what
		 * was not read. */
		uint32_t from = atomic_load(&pz->rd_done) + 1;
		if (from < first_id)
			from = first_id;
		int r = cancel_and_wait(c, fd, from, last_id);
		if (r)
			err = r;
	}
	uint64_t read_now = atomic_load(&pz->rd_bytes) - rd_start;
	c->st.tx_rzcopy_bytes += read_now;
	if (!err)
		return (ssize_t)len;
	if (err == -EACCES) {
		/* Refused: what was not read goes by Buffer Copy (caller). */
		size_t sent = done + (size_t)read_now;
		c->tx_stream -= (uint64_t)(advertised - sent);
		*go_bcopy = true;
		return (ssize_t)sent;
	}
	size_t sent = done + (size_t)read_now;
	if (sent > advertised)
		sent = advertised;
	c->tx_stream -= (uint64_t)(advertised - sent);
	sent += bdone;                        /* queued only after all was read */
	return sent ? (ssize_t)sent : err;
}
