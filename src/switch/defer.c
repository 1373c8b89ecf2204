/*
 * defer.c - TCP_DEFER_ACCEPT on listeners that offer SDP.
 *
 * With TCP_DEFER_ACCEPT the kernel hands a connection to accept() only
 * once the client's first bytes arrive, or when the deferral runs out. The
 * bytes of an SDP client never travel on its TCP socket, so on such a
 * listener every SDP connection would wait out the whole deferral (MooseFS
 * sets 1 s on all its listeners, and its clients give up first). While a
 * listener offers SDP the option is therefore kept off its kernel socket:
 * the value the application set is remembered as the kernel rounds it
 * (seconds -> SYN-ACK retransmissions -> seconds), getsockopt reports it,
 * and it goes back to the kernel when the listener stops offering SDP
 * (exec, SCM_RIGHTS). A plain TCP client of such a listener may then be
 * accepted before its first bytes, which the deferral never excluded
 * either: it runs out into an accept without data.
 *
 * The value lives in the fd table entry (struct fdent.defer_s), copied by
 * dup and fork; a change made through one of several fds naming the
 * listener is reported by that fd only.
 */
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <string.h>

#include "switch/switch.h"
#include "sdp/sys.h"

static struct fdent *managed(int fd)
{
	struct fdent *e = fd_get(fd);
	if (!e || atomic_load(&e->kind) != FDK_LISTEN || !e->l ||
	    atomic_load(&e->defer_s) < 0)
		return NULL;
	return e;
}

/* Move the kernel's current deferral of fd into e; the kernel's becomes 0. */
static void take(int fd, struct fdent *e)
{
	int v = 0;
	socklen_t vl = sizeof v;
	if (sys_getsockopt(fd, SOL_TCP, TCP_DEFER_ACCEPT, &v, &vl) < 0 || v < 0)
		v = 0;
	atomic_store(&e->defer_s, v);
	if (v > 0) {
		int zero = 0;
		sys_setsockopt(fd, SOL_TCP, TCP_DEFER_ACCEPT, &zero, sizeof zero);
	}
}

void listen_defer_take(int fd, bool offered)
{
	struct fdent *e = fd_get(fd);
	if (!e)
		return;
	/* A listener on TCP only (policy, a withdrawn SO_REUSEPORT group)
	 * keeps the option in the kernel. */
	atomic_store(&e->defer_s, offered ? 0 : -1);
	if (!managed(fd))
		return;
	take(fd, e);
	int v = atomic_load(&e->defer_s);
	if (v > 0)
		sdp_log(2, "listen fd %d: TCP_DEFER_ACCEPT %d s kept off the kernel socket "
			"(SDP clients send nothing over TCP)", fd, v);
}

void listen_defer_restore(int fd)
{
	struct fdent *e = managed(fd);
	if (!e)
		return;
	int v = atomic_exchange(&e->defer_s, -1);
	if (v > 0)
		sys_setsockopt(fd, SOL_TCP, TCP_DEFER_ACCEPT, &v, sizeof v);
}

bool listen_defer_set(int fd, const void *val, socklen_t len, int *r)
{
	struct fdent *e = managed(fd);
	if (!e)
		return false;
	/* The kernel checks and rounds the value; then it is taken back. */
	*r = sys_setsockopt(fd, SOL_TCP, TCP_DEFER_ACCEPT, val, len);
	if (*r == 0)
		take(fd, e);
	return true;
}

bool listen_defer_get(int fd, void *val, socklen_t *len, int *r)
{
	struct fdent *e = managed(fd);
	if (!e)
		return false;
	*r = -1;
	if (!len || !val) {
		errno = EFAULT;
		return true;
	}
	if ((int)*len < 0) {
		errno = EINVAL;
		return true;
	}
	int v = atomic_load(&e->defer_s);
	socklen_t n = *len < sizeof v ? *len : sizeof v;
	memcpy(val, &v, n);
	*len = n;
	*r = 0;
	return true;
}
