/*
 * upwatch.c - a client committed to SDP whose server never takes the
 * connection up.
 *
 * Once its hello is queued a client is committed: its bytes go into the
 * ring, none on the TCP socket, and it waits for the server to attach (or
 * decline). A kernel TCP client's bytes travel on the connection itself:
 * if the server's end is gone, the server's kernel answers them with a
 * reset. The server's end can go without a word: a connection whose
 * handshake completes while its listening socket is shut down and closed
 * may be dropped by the server's kernel with no reset (plain kernel
 * clients too, on Linux 6.18: 6 to 14 of about 6,000 connections made
 * around 100 listener closes; the client's socket stays ESTABLISHED,
 * having received only the SYN-ACK).
 * A TCP client learns it at its next send; an SDP client, whose sends
 * never touch TCP, would wait for ever.
 *
 * So while a client waits for its server to attach, its sleeps are bounded
 * (SDP_UP_LOOK_MS) and each look asks the kernel (sock_diag, a lookup of
 * one socket) whether the server's end of its TCP connection still exists:
 * a request, a socket in the accept queue or an accepted one. When it does
 * not, the client takes the connection back for TCP (the provider's
 * abandon, the compare-and-swap a close before the attach makes: exactly
 * one of attach, decline and abandon wins) and the engine hands what it
 * posted back on the TCP socket, where the kernel answers as TCP would (a
 * reset). When the kernel cannot be asked (no sock_diag: a sandbox; or
 * this thread is in another network namespace than the socket) the client
 * takes the connection back after UP_BLIND_MS without an attach: correct
 * either way, a server that attaches later finds it abandoned and serves
 * it on TCP. A server that is only slow to accept is never given up on
 * while its end exists.
 */
#include <errno.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>
#include <sys/socket.h>

#include "sdp/conn.h"
#include "sdp/rendezvous.h"
#include "sdp/sys.h"
#include "sdp/log.h"

#define UP_LOOK_NS  ((uint64_t)SDP_UP_LOOK_MS * 1000000ull)
#define UP_BLIND_MS 2000      /* no way to look: give up on the attach after */

void sdp_up_watch(struct sdp_conn *c)
{
	const struct fab_ops *o = c->ep.ops;
	if (!o || !o->abandon || !o->peer_up || o->peer_up(&c->ep))
		return;
	uint64_t now = sdp_now_ns();
	atomic_store(&c->up_look_ns, now + UP_LOOK_NS);
	atomic_store(&c->up_wait_ns, now);
}

/* One socket of the kernel's TCP tables, by its 4-tuple (local l, peer p):
 * 1 there (not a listener), 0 not there, -errno no answer. */
static int diag_one(int nl, const struct key *l, const struct key *p)
{
	struct sdp_diag d;
	int r = sdp_diag_one(nl, l->family, l->addr, l->port, p->addr, p->port, &d);
	if (r <= 0)
		return r;
	/* A lookup that finds no connection may find the listener of the
	 * port: not the end we ask about. */
	return d.state != TCP_LISTEN && d.sport == l->port && d.dport == p->port;
}

/* Does the server's end of c's TCP connection exist? 1 yes, 0 no, -errno
 * cannot tell. Our own end is looked up first: the kernel answers from
 * this thread's network namespace, which need not be the socket's. */
static int server_end(struct sdp_conn *c)
{
	struct key me, peer;
	if (rv_key_of(&c->local.sa, sizeof c->local, &me) < 0 ||
	    rv_key_of(&c->remote.sa, sizeof c->remote, &peer) < 0 ||
	    me.family != peer.family)
		return -EAFNOSUPPORT;
	int nl = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (nl < 0)
		return -errno;
	int r = diag_one(nl, &me, &peer);
	if (r == 0)
		r = -EXDEV;                   /* ours not found: another namespace */
	if (r > 0)
		r = diag_one(nl, &peer, &me);
	sys_close(nl);
	return r;
}

bool sdp_up_check(struct sdp_conn *c, int fd)
{
	uint64_t since = atomic_load_explicit(&c->up_wait_ns, memory_order_relaxed);
	if (!since)
		return false;
	struct fab_ep *ep = &c->ep;
	if (!ep->ops || !ep->ops->peer_up || !ep->ops->abandon ||
	    ep->ops->peer_up(ep) || sdp_is_reset(c) ||
	    atomic_load_explicit(&c->fb_done, memory_order_relaxed) ||
	    ep->ops->marks(ep, FAB_M_FB | FAB_MY(FAB_M_FB))) {
		atomic_store(&c->up_wait_ns, 0);   /* up, or settled otherwise */
		return false;
	}
	uint64_t now = sdp_now_ns(), at = atomic_load(&c->up_look_ns);
	if (now < at || !atomic_compare_exchange_strong(&c->up_look_ns, &at,
							 now + UP_LOOK_NS))
		return true;                  /* not due, or another thread looks */
	int r = server_end(c);
	if (r > 0)
		return true;
	uint64_t waited_ms = (now - since) / 1000000;
	if (r < 0 && waited_ms < UP_BLIND_MS)
		return true;
	if (!ep->ops->abandon(ep) || ep->ops->peer_up(ep)) {
		atomic_store(&c->up_wait_ns, 0);   /* the server attached meanwhile */
		return false;
	}
	atomic_store(&c->up_wait_ns, 0);
	if (r == 0)
		sdp_log(1, "fd %d: the server's end of the TCP connection is gone and "
			"the server never took the connection up (its kernel dropped it "
			"without a reset, as when the listener closes): back to TCP, "
			"whose answer is the kernel's", fd);
	else
		sdp_log(1, "fd %d: the server has not taken the connection up in %llu ms "
			"and whether its end exists cannot be asked (%s): back to TCP",
			fd, (unsigned long long)waited_ms, strerror(-r));
	sdp_wake_waiters(c);
	return false;
}
