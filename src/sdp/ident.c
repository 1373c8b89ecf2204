/*
 * ident.c - may this process be trusted as our peer for Cross Memory
 * Attach?
 *
 * A zero-copy advertisement names the process whose memory is to be read
 * or written (the "key"). At set-up the kernel told us one peer pid
 * (SO_PEERCRED of the rendezvous or of the hello). But the process that
 * uses the other end may be another one: a pre-fork worker that accepted
 * on its master's listener, or a child forked after the connection was
 * made. A key is never taken from the peer's word alone - that would let
 * a peer point us at any process we may debug, ourselves included - so a
 * key other than the set-up pid is verified with the kernel:
 *
 *   1. sock_diag (NETLINK_SOCK_DIAG, an exact 4-tuple lookup) gives the
 *      inode of the far end's TCP socket;
 *   2. the claimed process must hold that socket: one of its descriptors
 *      in /proc/PID/fd is "socket:[inode]".
 *
 * Reading /proc/PID/fd needs the same ptrace permission as Cross Memory
 * Attach itself, so this proves nothing a debugger could not see. It costs
 * a netlink round trip and a directory scan, once per process and
 * connection (the answer is cached by the caller).
 */
#include <dirent.h>
#include <errno.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

#include "sdp/conn.h"
#include "sdp/sys.h"

/* One socket of the kernel's TCP tables by its 4-tuple (ports in network
 * order, addresses of 4 or 16 bytes by family), asked on the sock_diag
 * netlink socket nl. The kernel answers the lookup within the send: one
 * message, or an error. 1: found (*d), 0: no such socket, -errno: no
 * answer. */
int sdp_diag_one(int nl, int family, const void *src, uint16_t sport,
		 const void *dst, uint16_t dport, struct sdp_diag *d)
{
	struct {
		struct nlmsghdr n;
		struct inet_diag_req_v2 r;
	} req;
	memset(&req, 0, sizeof req);
	req.n.nlmsg_len = sizeof req;
	req.n.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.n.nlmsg_flags = NLM_F_REQUEST;
	req.r.sdiag_family = (uint8_t)family;
	req.r.sdiag_protocol = IPPROTO_TCP;
	req.r.idiag_states = ~0u;
	req.r.id.idiag_sport = sport;
	req.r.id.idiag_dport = dport;
	size_t n = family == AF_INET ? 4 : 16;
	memcpy(req.r.id.idiag_src, src, n);
	memcpy(req.r.id.idiag_dst, dst, n);
	req.r.id.idiag_cookie[0] = req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	if (syscall(SYS_sendto, nl, &req, sizeof req, 0, NULL, 0) < 0)
		return -errno;
	union {
		struct nlmsghdr n;
		char b[2048];
	} buf;
	ssize_t got = sys_recvfrom(nl, buf.b, sizeof buf.b, MSG_DONTWAIT);
	if (got < 0)
		return -errno;
	for (struct nlmsghdr *h = &buf.n; NLMSG_OK(h, (size_t)got); h = NLMSG_NEXT(h, got)) {
		if (h->nlmsg_type == NLMSG_ERROR) {
			const struct nlmsgerr *e = NLMSG_DATA(h);
			if (h->nlmsg_len < NLMSG_LENGTH(sizeof *e))
				return -EIO;
			return e->error == -ENOENT ? 0 : e->error ? e->error : -EIO;
		}
		if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY ||
		    h->nlmsg_len < NLMSG_LENGTH(sizeof(struct inet_diag_msg)))
			continue;
		const struct inet_diag_msg *m = NLMSG_DATA(h);
		*d = (struct sdp_diag){ .ino = m->idiag_inode, .state = m->idiag_state,
					.sport = m->id.idiag_sport, .dport = m->id.idiag_dport };
		return 1;
	}
	return -EIO;
}

/* Inode of the TCP socket whose local address is `local` and remote
 * address `remote` (both from our socket's point of view reversed). */
static int far_inode(const union sdp_addr *far_local, const union sdp_addr *far_remote,
		     uint64_t *ino)
{
	const void *src, *dst;
	uint16_t sport, dport;
	int family = far_local->sa.sa_family;
	if (family == AF_INET) {
		src = &far_local->in.sin_addr;
		dst = &far_remote->in.sin_addr;
		sport = far_local->in.sin_port;
		dport = far_remote->in.sin_port;
	} else if (family == AF_INET6) {
		src = &far_local->in6.sin6_addr;
		dst = &far_remote->in6.sin6_addr;
		sport = far_local->in6.sin6_port;
		dport = far_remote->in6.sin6_port;
	} else {
		return -EAFNOSUPPORT;
	}
	int s = sys_socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);
	if (s < 0)
		return -errno;
	struct sdp_diag d;
	int r = sdp_diag_one(s, family, src, sport, dst, dport, &d);
	sys_close(s);
	if (r < 0)
		return r;
	if (r == 0 || !d.ino)
		return -ENOENT;
	*ino = d.ino;
	return 0;
}

/* Does process pid hold a descriptor of socket inode ino? hint: the
 * number the process says it holds it under (its claim, checked first:
 * one readlink where a server with thousands of descriptors costs as
 * many), or -1. */
static int holds_socket(pid_t pid, uint64_t ino, int hint)
{
	char dir[64], want[48];
	snprintf(dir, sizeof dir, "/proc/%d/fd", (int)pid);
	int wl = snprintf(want, sizeof want, "socket:[%llu]", (unsigned long long)ino);
	if (hint >= 0) {
		char path[96], link[64];
		snprintf(path, sizeof path, "%s/%d", dir, hint);
		ssize_t n = readlink(path, link, sizeof link);
		if (n == wl && !memcmp(link, want, (size_t)wl))
			return 1;
	}
	DIR *d = opendir(dir);
	if (!d) {
		int e = errno;
		/* No such process (it died): it holds nothing. A process we
		 * may not see (hidepid) stays "cannot tell". */
		if (e == ENOENT && kill(pid, 0) < 0 && errno == ESRCH)
			return 0;
		return -e;
	}
	int r = 0;
	struct dirent *e;
	while (!r && (e = readdir(d))) {
		if (e->d_name[0] == '.')
			continue;
		char path[384], link[64];
		snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
		ssize_t n = readlink(path, link, sizeof link);
		if (n == wl && !memcmp(link, want, (size_t)wl))
			r = 1;
	}
	closedir(d);
	return r;
}

/* The same endpoint in the other family: IPv4 <-> IPv4-mapped IPv6 (the
 * far socket may be a dual-stack one, or plain IPv4 while ours is not). */
static bool other_family(const union sdp_addr *a, union sdp_addr *o)
{
	memset(o, 0, sizeof *o);
	if (a->sa.sa_family == AF_INET) {
		o->in6.sin6_family = AF_INET6;
		o->in6.sin6_port = a->in.sin_port;
		o->in6.sin6_addr.s6_addr[10] = 0xff;
		o->in6.sin6_addr.s6_addr[11] = 0xff;
		memcpy(&o->in6.sin6_addr.s6_addr[12], &a->in.sin_addr, 4);
		return true;
	}
	if (a->sa.sa_family == AF_INET6 && IN6_IS_ADDR_V4MAPPED(&a->in6.sin6_addr)) {
		o->in.sin_family = AF_INET;
		o->in.sin_port = a->in6.sin6_port;
		memcpy(&o->in.sin_addr, &a->in6.sin6_addr.s6_addr[12], 4);
		return true;
	}
	return false;
}

/* 1: process pid holds the far end of TCP socket fd; 0: it does not;
 * -errno: cannot tell (treated as "no" by callers). */
int sdp_ident_holds_peer(int fd, pid_t pid, int hint)
{
	if (pid <= 0)
		return 0;
	union sdp_addr local, remote;
	socklen_t ll = sizeof local, rl = sizeof remote;
	if (sys_getsockname(fd, &local, &ll) < 0 || sys_getpeername(fd, &remote, &rl) < 0)
		return -errno;
	uint64_t ino;
	int r = far_inode(&remote, &local, &ino);
	union sdp_addr ol, orem;
	if (r < 0 && other_family(&local, &ol) && other_family(&remote, &orem))
		r = far_inode(&orem, &ol, &ino);
	if (r == -ENOENT)
		return 0;                     /* the far end is closed: nobody holds it */
	if (r < 0)
		return r;
	return holds_socket(pid, ino, hint);
}
