/*
 * fallback.c - leaving SDP for plain TCP in the middle of a connection.
 *
 * Needed when the socket is about to be used by a program that may not run
 * the switch (exec) or handed to another process (SCM_RIGHTS). Either side
 * may start; the other side follows when it next enters the library (the
 * starter kicks it). Each side, when it leaves:
 *   1. marks itself leaving (it posts and consumes nothing more), kicks
 *      the peer, then publishes (in its control block) how far it consumed
 *      the peer's ring and that its count of wake-up tokens written to the
 *      TCP socket is final - in that order, so that no peer can go to
 *      sleep without either seeing the mark or getting the kick;
 *   2. waits until the peer has done the same;
 *   3. re-sends on the TCP socket, in order, the payload of every message
 *      of its own that the peer had not consumed (DisConn becomes a TCP
 *      shutdown(SHUT_WR));
 *   4. reads and discards exactly the peer's announced tokens.
 * From then on each TCP byte stream holds exactly the application's bytes,
 * in order, with nothing lost, repeated or injected, and no timeout taken
 * - except that a peer which began step 1 and does not finish it within
 * sdp_fb_stall_ms (stopped, or not speaking the protocol) gets the
 * connection reset rather than hanging us: close() must never hang.
 */
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <sched.h>
#include <time.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "sdp/az.h"
#include "sdp/conn.h"
#include "sdp/proto.h"
#include "sdp/sys.h"
#include "sdp/log.h"

/* Write all of buf to the TCP socket, whatever its O_NONBLOCK says. */
static int write_all(int fd, const char *buf, size_t len)
{
	while (len) {
		ssize_t r = syscall(SYS_sendto, fd, buf, len, MSG_NOSIGNAL, NULL, 0);
		if (r > 0) {
			buf += r;
			len -= (size_t)r;
			continue;
		}
		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0 && errno == EAGAIN) {
			struct pollfd p = { .fd = fd, .events = POLLOUT };
			sys_poll(&p, 1, -1);
			continue;
		}
		return -errno;
	}
	return 0;
}

static int discard_tokens(struct fab_ep *ep, int fd)
{
	char buf[256];
	uint64_t due;
	/* The peer counted each token before writing it, so they are all
	 * on their way; a peer that announced tokens it never sends is
	 * broken: give up after a second without progress. */
	uint64_t last = sdp_now_ns();
	while ((due = ep->ops->tokens_due(ep)) != 0) {
		if (due > (1u << 20) || sdp_now_ns() - last > 1000000000ull)
			return -EPROTO;
		size_t want = due < sizeof buf ? (size_t)due : sizeof buf;
		ssize_t r = syscall(SYS_recvfrom, fd, buf, want, MSG_DONTWAIT, NULL, NULL);
		if (r > 0) {
			if (ep->ops->tokens_took(ep, buf, (size_t)r) < 0)
				return -EPROTO;   /* not a token */
			last = sdp_now_ns();
			continue;
		}
		if (r == 0)
			return -EPIPE;            /* peer closed: nothing follows */
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		struct pollfd p = { .fd = fd, .events = POLLIN };
		sys_poll(&p, 1, 100);
	}
	return 0;
}

/* The unread part of an asynchronous SrcAvail of ours: from where its
 * bytes are now - our memory, or a forked process's (Cross Memory Attach,
 * through a bounce buffer). */
static int resend_async(struct sdp_conn *c, int fd, const struct sdp_srcavail *sa,
			uint32_t skip)
{
	uint64_t addr = az_where(c, sa, true);
	if (!addr)
		return -EPROTO;
	if (sa->key == (int32_t)sdp_pid)
		return write_all(fd, (const char *)(uintptr_t)addr + skip, sa->len - skip);
	char buf[16384];
	for (uint32_t off = skip; off < sa->len;) {
		size_t k = sa->len - off < sizeof buf ? sa->len - off : sizeof buf;
		struct iovec l = { buf, k };
		ssize_t g = c->ep.ops->rdma_read(&c->ep, &l, 1, addr + off, k, (uint64_t)sa->key);
		if (g <= 0)
			return g < 0 ? (int)g : -EIO;
		int r = write_all(fd, buf, (size_t)g);
		if (r)
			return r;
		off += (uint32_t)g;
	}
	return 0;
}

static int resend_unconsumed(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	uint64_t pcons;
	uint32_t poff;
	ep->ops->fb_peer_pos(ep, &pcons, &poff);
	uint64_t end = ep->ops->tx_seq(ep);
	if (pcons > end || end - pcons > ep->nslots)
		return -EPROTO;
	bool fin = false;
	for (uint64_t seq = pcons; seq < end; seq++) {
		const char *m = ep->ops->tx_msg(ep, seq);
		struct sdp_bsdh h;
		memcpy(&h, m, sizeof h);
		if (h.len < sizeof h || h.len > ep->slot_size)
			return -EPROTO;
		uint32_t skip = seq == pcons ? poff : 0;
		if (h.mid == SDP_MID_DATA) {
			uint32_t plen = h.len - (uint32_t)sizeof h;
			if (skip > plen)
				return -EPROTO;
			int r = write_all(fd, m + sizeof h + skip, plen - skip);
			if (r)
				return r;
		} else if (h.mid == SDP_MID_SRC_AVAIL) {
			/* Our advertised buffer: still valid, since only the
			 * sending call (this process) falls back while it waits;
			 * an asynchronous one is kept (protected, or moved) until
			 * read, by whichever process advertised it. */
			struct sdp_srcavail sa;
			memcpy(&sa, m + sizeof h, sizeof sa);
			/* A network fabric's key is a registration of ours; on
			 * shm a synchronous one names this process. */
			bool keys = ep->ops->traits & FAB_T_MR_KEYS;
			bool mine = keys ? (sa.key || sa.key_hi) && !(sa.flags & SDP_SA_ASYNC) :
				    (sa.flags & SDP_SA_ASYNC) || sa.key == (int32_t)sdp_pid;
			if (!mine || skip > sa.len)
				return -EPROTO;
			int r = (sa.flags & SDP_SA_ASYNC) ? resend_async(c, fd, &sa, skip) :
				write_all(fd, (const char *)(uintptr_t)sa.addr + skip,
					  sa.len - skip);
			if (r)
				return r;
		} else if (h.mid == SDP_MID_DISCONN) {
			fin = true;
		}
	}
	if (fin || atomic_load(&c->tx_shut))
		sys_shutdown(fd, SHUT_WR);
	return 0;
}

/*
 * Step 1, with both locks held: leave in two stages around the kick.
 * The peer may be asleep or about to sleep: it arms, looks at our mark,
 * and sleeps if it sees nothing. So the mark it looks at ("leaving") must
 * be visible before the kick, as any progress is before its kick (the
 * Dekker pair of PROTOCOL.md section 9); kicking first let a peer that
 * armed in between wake, look, see nothing and sleep for ever, since no
 * token is sent once our count is final. The count the peer discards must
 * include that kick's token, so it is frozen only after the kick (stage
 * 2), and the peer waits for stage 2 before it reads it. Idempotent.
 */
static void leave(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	if (sdp_marked(c, FAB_MY(FAB_M_FB_FINAL)))
		return;
	sdp_mark(c, FAB_M_FB);
	ep->ops->kick(ep, fd, FAB_WAIT_RX | FAB_WAIT_CREDIT);
	ep->ops->fb_publish(ep, c->rx_off);
}

/* Step 1 alone: freeze our side and wake the peer. Idempotent. */
void sdp_fallback_publish(struct sdp_conn *c, int fd)
{
	if (atomic_load(&c->fb_done) || sdp_marked(c, FAB_MY(FAB_M_FB_FINAL)))
		return;
	if (sdp_lock(&c->tx_lock))
		return;
	if (sdp_lock(&c->rx_lock) == 0) {
		leave(c, fd);
		sdp_unlock(&c->rx_lock);
	}
	sdp_unlock(&c->tx_lock);
}

/*
 * Step 2: wait until the peer's mark is final. We arm before each look, so
 * the kick the peer gives after its stage 1 wakes us (the peer has not
 * seen our mark yet while it is on SDP; once it follows, its kick is
 * counted before its count is frozen). Between the peer's two stages
 * there are only a few stores: yield for them, then nap in slices growing
 * from 1 to 100 ms, so a peer stopped there (or a mark that a third
 * process wrote) costs no CPU. Tokens are taken only as the
 * connection's watcher (another thread's sleep may be taking them).
 */
unsigned sdp_fb_stall_ms = 2000;

static int wait_peer_final(struct sdp_conn *c, int fd)
{
	struct fab_ep *ep = &c->ep;
	unsigned yields = 0;
	int nap = 1;                          /* ms, doubling up to 100 */
	uint64_t started = 0;                 /* when we first saw its stage 1 */
	for (;;) {
		/* Gone by the kernel's word (its FIN or RST; a `closed` mark
		 * alone is not trusted: the FIN follows it at once), or reset. */
		if (atomic_load(&c->peer_gone) || sdp_marked(c, FAB_M_ABORT) ||
		    atomic_load(&c->state) == SDP_ST_RESET)
			return 1;             /* the peer will not follow */
		ep->ops->arm(ep, FAB_WAIT_RX | FAB_WAIT_CREDIT);
		bool watching = sdp_watch(c);
		unsigned pfb = ep->ops->marks(ep, FAB_M_FB | FAB_M_FB_FINAL);
		if (pfb & FAB_M_FB_FINAL) {
			if (watching)
				sdp_unwatch(c);
			return 0;
		}
		int ms = 100;
		if (pfb & FAB_M_FB) {
			/* Stage 2 follows stage 1 within a few stores: a peer
			 * that has not got there by now is stopped or broken,
			 * and the streams cannot be handed over in order. */
			uint64_t now = sdp_now_ns();
			if (!started)
				started = now;
			else if (now - started > sdp_fb_stall_ms * 1000000ull) {
				if (watching)
					sdp_unwatch(c);
				sdp_log(1, "fd %d: the peer began leaving SDP but did not "
					"finish in %u ms", fd, sdp_fb_stall_ms);
				return -ETIMEDOUT;
			}
			if (yields++ < 64) {
				if (watching)
					sdp_unwatch(c);
				sched_yield();
				continue;
			}
			ms = nap;
			nap = nap < 50 ? nap * 2 : 100;
		}
		if (watching) {
			struct pollfd p = { .fd = fab_wait_fd(ep, fd), .events = POLLIN };
			if (sys_poll(&p, 1, ms) > 0)
				sdp_on_wakeup(c, fd);
			sdp_unwatch(c);
		} else {
			/* Someone else sleeps on the socket and takes the
			 * tokens; it bumps wake_gen, but a nap is enough. */
			struct timespec nap = { 0, 1000000 };
			nanosleep(&nap, NULL);
		}
	}
}

/* ---- a peer that can no longer follow ------------------------------------ */

/*
 * The peer closed its socket, died, or the connection was reset, before
 * it could take part in the hand-back. The bytes it posted into our ring
 * that we have not consumed can then never be re-sent by it, yet TCP
 * would deliver them (they were "in the kernel" from the application's
 * point of view): we hand them over ourselves. The descriptor becomes an
 * AF_UNIX stream socket that yields exactly what recv() on the SDP socket
 * would have - those bytes, then EOF, or ECONNRESET once and then EOF -
 * to whoever reads it next, with or without libsdp, in this process,
 * after exec or in a process it is passed to. The bytes are queued in the
 * socket when they fit its buffer; the rest is written by a small process
 * of its own (below), so the hand-back never waits for a reader.
 */

/* How recv() would end once the ring is empty: 0 (EOF) or ECONNRESET. */
static int orphan_end(struct sdp_conn *c)
{
	unsigned m = c->ep.ops->marks(&c->ep, FAB_M_ABORT | FAB_M_FIN | FAB_M_CLOSED);
	if (atomic_load(&c->state) == SDP_ST_RESET || (m & FAB_M_ABORT) ||
	    atomic_load(&c->peer_gone) == 2)
		return ECONNRESET;
	if (atomic_load(&c->peer_gone) == 1 || (m & (FAB_M_FIN | FAB_M_CLOSED)))
		return 0;                     /* closed in order: FIN */
	return ECONNRESET;
}

/*
 * The payload of the peer's messages we have not consumed, in order, as
 * recv() would deliver it: copied to out (at most cap bytes) unless out is
 * NULL; returns the byte count, *end says how the stream ends after it.
 * Headers are checked as rx.c checks them; anything that cannot be
 * delivered without the peer (an unread SrcAvail names its memory) ends
 * the stream there with a reset.
 */
static size_t orphan_bytes(struct sdp_conn *c, char *out, size_t cap, int *end)
{
	struct fab_ep *ep = &c->ep;
	struct sdp_zctl *pz = sdp_zc_peer(c);
	size_t n = 0;
	*end = orphan_end(c);
	for (uint32_t idx = 0;; idx++) {
		const void *msg;
		size_t scap;
		int r = ep->ops->rx_peek(ep, idx, &msg, &scap);
		if (r == -EAGAIN)
			return n;
		struct sdp_bsdh h;
		if (r == 0)
			memcpy(&h, msg, sizeof h);
		if (r || h.len < sizeof h || h.len > scap ||
		    h.mseq != (uint32_t)(ep->ops->rx_seq(ep) + 1 + idx))
			break;
		const char *pl = (const char *)msg + sizeof h;
		uint32_t plen = h.len - (uint32_t)sizeof h;
		if (h.mid == SDP_MID_DATA) {
			uint32_t off = idx == 0 ? c->rx_off : 0;
			if (off > plen)
				break;
			size_t k = plen - off;
			if (out) {
				if (k > cap - n)
					k = cap - n;
				memcpy(out + n, pl + off, k);
			}
			n += k;
			continue;
		}
		if (h.mid == SDP_MID_MODE_CHANGE)
			continue;
		if (h.mid == SDP_MID_SRC_AVAIL && plen == sizeof(struct sdp_srcavail)) {
			struct sdp_srcavail sa;
			memcpy(&sa, pl, sizeof sa);
			uint32_t cid = atomic_load(&pz->cancel_id);
			if (cid && sa.id <= atomic_load(&pz->cancel_last) && sa.id > c->rx_src_id &&
			    !(sa.flags & SDP_SA_ASYNC))
				continue;         /* revoked: no stream bytes */
			break;                    /* in the peer's memory */
		}
		if (h.mid == SDP_MID_DISCONN) {
			*end = 0;
			return n;
		}
		break;                            /* AbortConn, or malformed */
	}
	*end = ECONNRESET;
	return n;
}

/* Signal dispositions back to the default, by raw system call (the
 * kernel's struct sigaction: handler, flags, restorer, mask). */
static void default_signals(void)
{
	struct { void *handler; unsigned long flags; void *restorer; uint64_t mask; }
		sa = { SIG_DFL, 0, NULL, 0 };
	for (int sig = 1; sig <= 64; sig++)
		if (sig != SIGKILL && sig != SIGSTOP)
			syscall(SYS_rt_sigaction, sig, &sa, NULL, (size_t)8);
}

/* The feeder process: write buf to feed, then close it. With EOF as the
 * end, first discard what the reader wrote meanwhile (left unread, it
 * would turn the EOF into a reset); with a reset, the byte we put there
 * stays. Only raw system calls: this is a copy of any process. */
static void __attribute__((noreturn))
feeder_main(int feed, const char *buf, size_t len, bool reset)
{
	default_signals();
	syscall(SYS_prctl, PR_SET_NAME, "sdp-feeder", 0, 0, 0);
	/* Nothing of the application's stays open here (a pipe's write
	 * end held by us would keep its reader from ever seeing EOF). */
	if ((feed > 0 && syscall(SYS_close_range, 0u, (unsigned)feed - 1, 0u) < 0) ||
	    syscall(SYS_close_range, (unsigned)feed + 1, ~0u, 0u) < 0) {
		struct { uint64_t cur, max; } rl = { 1024, 1024 };
		syscall(SYS_prlimit64, 0, RLIMIT_NOFILE, NULL, &rl);
		for (uint64_t fd = 0; fd < rl.cur && fd < (1u << 20); fd++)
			if ((int)fd != feed)
				syscall(SYS_close, (int)fd);
	}
	while (len) {
		long r = syscall(SYS_sendto, feed, buf, len, MSG_NOSIGNAL, NULL, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;                    /* the reader is gone */
		buf += r;
		len -= (size_t)r;
	}
	if (!reset) {
		char junk[4096];
		while (syscall(SYS_recvfrom, feed, junk, sizeof junk, MSG_DONTWAIT,
			       NULL, NULL) > 0)
			;
	}
	syscall(SYS_exit_group, 0);
	__builtin_unreachable();
}

/*
 * Start the feeder. Raw clone calls: no atfork handler of the application
 * runs, and the application never sees a child of ours - the intermediate
 * process has no exit signal and is reaped here at once; the feeder it
 * starts is re-parented (to init or a subreaper) and ends by itself when
 * its bytes are written or the reader is gone.
 */
static int spawn_feeder(int feed, const char *buf, size_t len, bool reset)
{
	long pid = syscall(SYS_clone, 0ul, NULL, NULL, NULL, 0ul);
	if (pid < 0)
		return -errno;
	if (pid == 0) {
		long p2 = syscall(SYS_clone, (unsigned long)SIGCHLD, NULL, NULL, NULL, 0ul);
		if (p2 == 0)
			feeder_main(feed, buf, len, reset);
		syscall(SYS_exit_group, p2 < 0 ? 1 : 0);
	}
	int st = 0;
	while (syscall(SYS_wait4, pid, &st, __WALL, NULL) < 0 && errno == EINTR)
		;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EAGAIN;
}

/*
 * Hand the unconsumed bytes over in an AF_UNIX stream socket; *subst gets
 * the descriptor the application's fds are to name from now on (-1: the
 * TCP socket itself says the rest: nothing was left and it ends in EOF).
 */
static void orphan_handover(struct sdp_conn *c, int fd, int *subst)
{
	int end;
	size_t len = orphan_bytes(c, NULL, 0, &end);
	if (len == 0 && end == 0)
		return;                       /* the kernel's FIN says it */
	int sp[2] = { -1, -1 };
	char *buf = MAP_FAILED;
	const char *why = NULL;
	if (syscall(SYS_socketpair, AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) < 0) {
		why = "no socket";
		goto fail;
	}
	if (len) {
		buf = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
			   -1, 0);
		if (buf == MAP_FAILED) {
			why = "no memory";
			goto fail;
		}
		len = orphan_bytes(c, buf, len, &end);
	}
	/* Room for all of it in the socket if we may (SO_SNDBUFFORCE needs
	 * CAP_NET_ADMIN), else as much as the system allows. */
	int want = len + 65536 > (size_t)INT32_MAX / 2 ? INT32_MAX / 2 : (int)(len + 65536);
	if (sys_setsockopt(sp[1], SOL_SOCKET, SO_SNDBUFFORCE, &want, sizeof want) < 0)
		sys_setsockopt(sp[1], SOL_SOCKET, SO_SNDBUF, &want, sizeof want);
	size_t done = 0;
	while (done < len) {
		ssize_t r = syscall(SYS_sendto, sp[1], buf + done, len - done,
				    MSG_DONTWAIT | MSG_NOSIGNAL, NULL, 0);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			break;
		done += (size_t)r;
	}
	/* A reset: a byte left unread at the far end when it closes makes
	 * the kernel report ECONNRESET after the queued bytes. */
	if (end && syscall(SYS_sendto, sp[0], "R", 1, MSG_DONTWAIT | MSG_NOSIGNAL,
			   NULL, 0) != 1) {
		why = "cannot queue the reset";
		goto fail;
	}
	if (done < len && spawn_feeder(sp[1], buf + done, len - done, end != 0) < 0) {
		why = "no process for the rest";
		goto fail;
	}
	sys_close(sp[1]);
	if (buf != MAP_FAILED)
		munmap(buf, len);
	int fl = sys_fcntl(fd, F_GETFL, 0);
	if (fl >= 0 && (fl & O_NONBLOCK))
		sys_fcntl(sp[0], F_SETFL, O_RDWR | O_NONBLOCK);
	*subst = sp[0];
	sdp_log(1, "fd %d: the peer is gone; its %zu unread bytes are handed over "
		"in a local socket, then %s", fd, len, end ? "a reset" : "EOF");
	return;
fail:
	sdp_log(0, "fd %d: the peer is gone and its %zu unread bytes cannot be "
		"handed over (%s): lost", fd, len, why);
	if (sp[0] >= 0) {
		sys_close(sp[0]);
		sys_close(sp[1]);
	}
	if (buf != MAP_FAILED)
		munmap(buf, len);
}

/* Are a and b the two ends of one connection (both in this process)? */
bool sdp_same_conn_peer(struct sdp_conn *a, struct sdp_conn *b)
{
	return a != b && a->ep.ops && b->ep.ops && a->ep.side != b->ep.side &&
	       a->token && a->token == b->token;
}

int sdp_fallback(struct sdp_conn *c, int fd)
{
	az_recv_settle(c);                    /* our reads finish before we freeze */
	struct fab_ep *ep = &c->ep;
	if (atomic_load(&c->fb_done))
		return 0;
	if (sdp_lock(&c->tx_lock))
		return -EIO;
	if (sdp_lock(&c->rx_lock)) {
		sdp_unlock(&c->tx_lock);
		return -EIO;
	}
	int r = 0;
	if (atomic_load(&c->fb_done))
		goto out;
	const char *why;
	if (!ep->ops->peer_sane(ep, &why)) {
		sdp_log(1, "fd %d: peer control block makes no sense (%s)", fd, why);
		r = -EPROTO;
		goto done;
	}
	leave(c, fd);
	/* What was true of the socket while on SDP stays true on TCP: no
	 * Nagle (set at the first token, if any was sent). */
	int one = 1;
	sys_setsockopt(fd, SOL_TCP, TCP_NODELAY, &one, sizeof one);
	r = wait_peer_final(c, fd);
	if (r < 0)
		goto done;                    /* shut down below: a reset */
	if (r) {
		/* Nothing to hand over together: what the peer left is ours
		 * to deliver, TCP (or the substitute) says the rest. */
		int subst = -1;
		orphan_handover(c, fd, &subst);
		atomic_store(&c->fb_subst1, subst + 1);   /* before fb_done */
		r = -ECONNRESET;
		goto done;
	}
	r = resend_unconsumed(c, fd);
	if (!r || r == -EPIPE || r == -ECONNRESET) {
		/* Even when the peer died under our re-send, the wake-up bytes
		 * it had written are ahead of whatever else it sent us: they
		 * must not reach the application as data. */
		int d = discard_tokens(ep, fd);
		if (!r)
			r = d;
	}
done:
	if (r && r != -ECONNRESET && r != -EPIPE) {
		/* The streams cannot be handed over intact: end the TCP
		 * connection rather than let it carry anything wrong. */
		sdp_log(0, "fd %d: fallback impossible (%d): connection shut down", fd, r);
		struct linger lg = { 1, 0 };
		sys_setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof lg);
		sys_shutdown(fd, SHUT_RDWR);
	}
	atomic_store(&c->fb_done, 1);
	az_conn_drop(c);                      /* what it advertised went on TCP */
	c->transport = 0;
	sdp_log(2, "fd %d left SDP for TCP (%d)", fd, r);
out:
	sdp_unlock(&c->rx_lock);
	sdp_unlock(&c->tx_lock);
	return r;
}

int sdp_fallback_subst_take(struct sdp_conn *c)
{
	return atomic_exchange(&c->fb_subst1, 0) - 1;
}

void (*sdp_fb_install_hook)(struct sdp_conn *c, int fd);

int sdp_fallback_fd(struct sdp_conn *c, int fd)
{
	int r = sdp_fallback(c, fd);
	if (sdp_fb_install_hook) {
		sdp_fb_install_hook(c, fd);
		return r;
	}
	int subst = sdp_fallback_subst_take(c);
	if (subst >= 0) {
		int fl = sys_fcntl(fd, F_GETFD, 0);
		syscall(SYS_dup3, subst, fd, fl >= 0 && (fl & FD_CLOEXEC) ? O_CLOEXEC : 0);
		sys_close(subst);
	}
	return r;
}

bool sdp_fallback_pending(struct sdp_conn *c)
{
	return atomic_load_explicit(&c->fb_done, memory_order_relaxed) ||
	       sdp_marked(c, FAB_M_FB | FAB_MY(FAB_M_FB));
}

bool sdp_fallback_by_peer(struct sdp_conn *c)
{
	return sdp_marked(c, FAB_M_FB);
}

bool sdp_fallback_started(struct sdp_conn *c)
{
	return sdp_marked(c, FAB_MY(FAB_M_FB));
}
