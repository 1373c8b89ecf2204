/*
 * ofi_cm.c - the ofi provider's connection set-up and tear-down.
 *
 * The engine decides SDP or TCP before the SYN, as on one host: the
 * client's hello reached the server's kernel through the network
 * rendezvous (sdp/hello_net.c) before the application's connection
 * existed, so at accept() "no hello" is final. What follows is the
 * fabric's own connection (PROTOCOL.md section 14):
 *
 *   client  offer: its region, CQ and wait descriptor; its passive
 *           endpoint (one per process and local address) is where the
 *           server connects. The hello's TCP socket (chan) is kept.
 *   server  accept (inside accept()): its region and endpoint; answers
 *           'Y' on chan, and fi_connect()s to the client's passive
 *           endpoint with the token, the offer's secret and where to
 *           write its control block. It does not wait.
 *   client  (any later call: a send, a receive, poll) reads the answer,
 *           takes the connection request whose token and secret match,
 *           fi_accept()s with its own control block's place.
 *   both    FI_CONNECTED: up (ofi_up), chan closed.
 *
 * Until a side is up it has no credits: nothing is ever sent over the
 * fabric before both ends agreed. So whatever fails before that - no 'Y'
 * (a server of another protocol version drops the hello and closes
 * chan), no request within OFI_ANSWER_MS, a refused or failed connection
 * - leaves both ends on plain TCP with nothing to hand over (the peer's
 * fallback marks at position 0, ofi_marks). After it, a failure resets
 * the connection.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fabric/ofi.h"
#include "sdp/sys.h"

static void atfork_child(void)
{
	ofi_p.pid = (pid_t)syscall(SYS_getpid);
	pthread_mutex_init(&ofi_p.lock, NULL);
	pthread_mutex_init(&ofi_p.bklock, NULL);
	ofi_p.nbk = 0;                        /* the parent's connections */
}

void ofi_init(const struct fab_params *p)
{
	static bool once;
	if (!once) {
		once = true;
		pthread_atfork(NULL, NULL, atfork_child);
	}
	ofi_p.pid = (pid_t)syscall(SYS_getpid);
	ofi_p.log = p->log;
	ofi_p.port_offset = p->ofi_port_offset;
	ofi_p.hello_ms = p->ofi_hello_ms;
	ofi_p.want = p->ofi_provider && *p->ofi_provider ? p->ofi_provider : NULL;
}

/* Hosts on the networks of the fabric (ofi_lib.c); peer NULL: is there a
 * fabric at all. Loads libfabric the first time. */
static bool ofi_reaches_in(const struct sockaddr *peer, socklen_t len);

bool ofi_reaches(const struct sockaddr *peer, socklen_t len)
{
	fab_private++;
	bool r_ = ofi_reaches_in(peer, len);
	fab_private--;
	return r_;
}

static bool ofi_reaches_in(const struct sockaddr *peer, socklen_t len)
{
	/* Loading libfabric runs every provider's start-up, which may leave
	 * errno set: the application's errno is not ours to change. */
	int saved = errno;
	pthread_mutex_lock(&ofi_p.lock);
	/* Before libfabric is loaded, a peer is "maybe" if it is on one of
	 * our interfaces' networks (ofi_on_local_net): the client loads it
	 * only once the peer's network rendezvous answered (hello_net.c), so
	 * a connect to a host without the library, or behind a router, does
	 * not wait for libfabric's start-up. */
	bool ok = peer && !ofi_p.tried ? ofi_on_local_net(peer, len) :
		  ofi_load() && (!peer || ofi_in_nets(peer, len));
	pthread_mutex_unlock(&ofi_p.lock);
	errno = saved;
	return ok;
}


/* ---- one connection's resources ------------------------------------------ */

static int epoll_add(int epfd, int fd)
{
	struct epoll_event ev = { .events = EPOLLIN, .data.fd = fd };
	return (int)syscall(SYS_epoll_ctl, epfd, EPOLL_CTL_ADD, fd, &ev);
}



/* Connections closed less than a few seconds ago: a thread that looked
 * the connection up just before the last close may still read a field.
 * Their completion queues are closed (nothing can name them any more), so
 * a full list frees its oldest at once. */
#define GRAVE_MAX 256
#define GRAVE_NS (5ull * 1000000000ull)
static struct ofi_conn *grave[GRAVE_MAX];
static int ngrave;

static void grave_free(int i)
{
	struct ofi_conn *g = grave[i];
	grave[i] = grave[--ngrave];
	pthread_mutex_destroy(&g->cqlock);
	free(g->order);
	free(g->rxop);
	free(g->txop);
	free(g->miscop);
	free(g);
}

static void conn_bury(struct ofi_conn *oc)
{
	uint64_t now = ofi_now_ns();
	for (int i = ngrave - 1; i >= 0; i--)
		if (now - grave[i]->died_ns > GRAVE_NS)
			grave_free(i);
	if (ngrave == GRAVE_MAX) {
		int old = 0;
		for (int i = 1; i < ngrave; i++)
			if (grave[i]->died_ns < grave[old]->died_ns)
				old = i;
		grave_free(old);
	}
	oc->died_ns = now;
	grave[ngrave++] = oc;
}

static void conn_free(struct ofi_conn *oc)
{
	atomic_store(&oc->dead, true);
	ofi_bk_forget(oc);
	if (oc->ep)
		fi_close(&oc->ep->fid);
	if (oc->cq) {
		/* The endpoint is closed: drop what it left queued, then the
		 * queue; no completion can name this connection after it. */
		pthread_mutex_lock(&oc->cqlock);
		ofi_reap(oc, true);
		fi_close(&oc->cq->fid);
		oc->cq = NULL;
		pthread_mutex_unlock(&oc->cqlock);
	}
	if (oc->mr)
		fi_close(&oc->mr->fid);
	if (oc->wfd >= 0)
		sys_close_kept(oc->wfd);
	if (oc->evfd >= 0)
		sys_close_kept(oc->evfd);
	ofi_chan_close(oc);
	ofi_mr_drop(oc);
	if (oc->mem)
		munmap(oc->mem, oc->memlen);
	oc->mem = NULL;
	conn_bury(oc);                        /* under ofi_p.lock */
}

/* Region, registration, CQ and wait descriptor for nslots x slot_size. */
static struct ofi_conn *conn_new(struct ofi_dom *d, int side, uint32_t nslots,
				 uint32_t slot_size)
{
	struct ofi_conn *oc = calloc(1, sizeof *oc);
	if (!oc)
		return NULL;
	oc->owner = ofi_p.pid;
	oc->side = side;
	oc->dom = d;
	oc->wfd = oc->chan = oc->tcp_added = oc->evfd = oc->cq_fd = -1;
	oc->fsock = -2;
	pthread_mutex_init(&oc->plock, NULL);
	pthread_mutex_init(&oc->cqlock, NULL);
	pthread_mutex_init(&oc->wlock, NULL);
	pthread_mutex_init(&oc->chlock, NULL);
	oc->nslots = nslots;
	oc->slot_size = slot_size;
	oc->nbufs = nslots + OFI_KICKS;
	size_t ring = (size_t)nslots * slot_size, rxb = (size_t)oc->nbufs * slot_size;
	oc->memlen = (ring + rxb + 2 * sizeof(struct ofi_ctl) + 4096 + 4095) & ~(size_t)4095;
	oc->mem = mmap(NULL, oc->memlen, PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (oc->mem == MAP_FAILED) {
		oc->mem = NULL;
		goto fail;
	}
	/* Registered memory is not for a forked child (verbs: its pages
	 * would be copied away from under the device). */
	madvise(oc->mem, oc->memlen, MADV_DONTFORK);
	oc->me = (struct ofi_ctl *)oc->mem;
	oc->peer = oc->me + 1;
	oc->kick = (struct ofi_kick *)(oc->mem + 2 * sizeof(struct ofi_ctl));
	oc->tx = oc->mem + 4096;
	oc->rx = oc->tx + ring;
	oc->order = calloc(oc->nbufs, sizeof *oc->order);
	oc->rxop = calloc(oc->nbufs, sizeof *oc->rxop);
	oc->txop = calloc(nslots, sizeof *oc->txop);
	oc->miscop = calloc(OFI_MISC_CTX, sizeof *oc->miscop);
	if (!oc->order || !oc->rxop || !oc->txop || !oc->miscop)
		goto fail;
	if (ofi_reg(d, oc->mem, oc->memlen, FI_SEND | FI_RECV | FI_READ | FI_WRITE |
		    FI_REMOTE_WRITE | FI_REMOTE_READ, &oc->mr, &oc->key))
		goto fail;
	oc->desc = fi_mr_desc(oc->mr);
	for (uint32_t i = 0; i < oc->nbufs; i++)
		oc->rxop[i].oc = oc;
	for (uint32_t i = 0; i < nslots; i++)
		oc->txop[i].oc = oc;
	for (uint32_t i = 0; i < OFI_MISC_CTX; i++)
		oc->miscop[i].oc = oc;
	/* Our own completion queue: sends, receives, RDMA of this endpoint
	 * only (every buffer posted, every send slot, the misc contexts). */
	struct fi_cq_attr ca = { .format = FI_CQ_FORMAT_MSG, .wait_obj = FI_WAIT_FD,
				 .size = oc->nbufs + nslots + OFI_MISC_CTX + 16 };
	if (fi_cq_open(d->domain, &ca, &oc->cq, NULL) ||
	    fi_control(&oc->cq->fid, FI_GETWAIT, &oc->cq_fd)) {
		OFI_LOG(1, "ofi: cannot open a completion queue");
		goto fail;
	}
	oc->wfd = sys_fd_keep((int)syscall(SYS_epoll_create1, EPOLL_CLOEXEC), -1);
	oc->evfd = sys_fd_keep((int)syscall(SYS_eventfd2, 0, EFD_NONBLOCK | EFD_CLOEXEC), -1);
	if (oc->wfd < 0 || oc->evfd < 0 || epoll_add(oc->wfd, oc->evfd) ||
	    epoll_add(oc->wfd, oc->cq_fd))
		goto fail;
	/* Until it is up, every domain's connection events wake it (set-up
	 * of a peer in this process may need them; ofi_dom_added adds later
	 * domains); ofi_up takes them out again. */
	oc->eqs_in_wfd = true;
	for (int i = 0; i < OFI_MAX_DOMAINS; i++)
		if (ofi_p.dom[i].used && epoll_add(oc->wfd, ofi_p.dom[i].eq_fd))
			goto fail;
	return oc;
fail:
	conn_free(oc);
	return NULL;
}

/* Endpoint from info (the server's, or a connection request's), bound to
 * the domain's EQ and the connection's CQ, receive buffers posted. */
static int conn_ep(struct ofi_conn *oc, struct fi_info *info)
{
	int r = fi_endpoint(oc->dom->domain, info, &oc->ep, oc);
	if (r)
		return r;
	if ((r = fi_ep_bind(oc->ep, &oc->dom->eq->fid, 0)) ||
	    (r = fi_ep_bind(oc->ep, &oc->cq->fid, FI_TRANSMIT | FI_RECV)) ||
	    (r = fi_enable(oc->ep)))
		return r;
	for (uint32_t i = 0; i < oc->nbufs; i++)
		if ((r = ofi_post_recv(oc, i)))
			return r;
	return 0;
}

static void cm_data_mine(struct ofi_conn *oc, struct ofi_cm_data *cd, bool request)
{
	memset(cd, 0, sizeof *cd);
	cd->token = oc->token;
	cd->secret = request ? oc->secret : 0;
	/* by virtual address, or by offset in the region */
	cd->ctl_addr = (uint64_t)(uintptr_t)oc->peer -
		       ((oc->dom->mr_mode & FI_MR_VIRT_ADDR) ? 0 : (uint64_t)(uintptr_t)oc->mem);
	cd->ctl_key = oc->key;
	cd->nslots = oc->nslots;
	cd->slot_size = oc->slot_size;
}

/* Under ofi_p.lock: the domain's passive endpoint, made on first use. */
static int dom_pep(struct ofi_dom *d)
{
	if (d->pep)
		return 0;
	struct fi_info *info = ofi_fi.dupinfo(d->info);
	if (!info)
		return -ENOMEM;
	int r = fi_passive_ep(d->fabric, info, &d->pep, d);
	ofi_fi.freeinfo(info);
	if (r)
		return r;
	size_t len = sizeof d->pep_addr;
	if ((r = fi_pep_bind(d->pep, &d->eq->fid, 0)) || (r = fi_listen(d->pep)) ||
	    (r = fi_getname(&d->pep->fid, &d->pep_addr, &len))) {
		fi_close(&d->pep->fid);
		d->pep = NULL;
		return r;
	}
	size_t cm = 0, cl = sizeof cm;
	if (fi_getopt(&d->pep->fid, FI_OPT_ENDPOINT, FI_OPT_CM_DATA_SIZE, &cm, &cl) == 0)
		d->cm_data = cm;
	return 0;
}

static uint32_t clamp_slots(struct ofi_dom *d, uint32_t nslots)
{
	/* Every receive buffer stays posted: the queues must hold them. */
	size_t q = d->rxq < d->txq ? d->rxq : d->txq;
	if (q > OFI_KICKS + 2 && nslots > q - OFI_KICKS - 2)
		nslots = (uint32_t)(q - OFI_KICKS - 2);
	return nslots < 2 ? 2 : nslots;
}

static void ep_fill(struct fab_ep *ep, struct ofi_conn *oc, int side)
{
	extern const struct fab_ops fab_ofi_ops;
	ep->ops = &fab_ofi_ops;
	ep->side = (uint32_t)side;
	ep->nslots = oc->nslots;
	ep->slot_size = oc->slot_size;
	ep->flags = 0;
	ep->base = oc;
	ep->len = oc->memlen;
	const char *l = ofi_p.label[0] ? ofi_p.label : "ofi";
	size_t n = strnlen(l, sizeof ep->label - 1);
	memcpy(ep->label, l, n);
	ep->label[n] = 0;
	ep->mr_hits = ep->mr_misses = 0;
}

/* ---- client ------------------------------------------------------------------ */

static int ofi_offer_in(struct fab_ep *ep, const struct fab_setup *s, struct fab_offer *o);

int ofi_offer(struct fab_ep *ep, const struct fab_setup *s, struct fab_offer *o)
{
	fab_private++;
	int r_ = ofi_offer_in(ep, s, o);
	fab_private--;
	return r_;
}

static int ofi_offer_in(struct fab_ep *ep, const struct fab_setup *s, struct fab_offer *o)
{
	if (!s->local || s->chan < 0)
		return -EINVAL;
	pthread_mutex_lock(&ofi_p.lock);
	int r = -ENODEV;
	struct ofi_dom *d = ofi_dom_for(s->local, s->local_len);
	if (!d || (r = dom_pep(d)) != 0) {
		pthread_mutex_unlock(&ofi_p.lock);
		OFI_LOG(1, "ofi: no passive endpoint for this address (%d)", r);
		return r < 0 ? r : -ENODEV;
	}
	uint32_t slot = s->slot_size & ~63u, nslots = s->nslots;
	if (s->geometry_default && slot < OFI_SLOT_DEFAULT) {
		/* Fewer, larger messages for the same ring bytes: each one
		 * is a message of the provider's (over its tcp provider, a
		 * send of its socket). Across veth (AMD EPYC VM, quick
		 * runs), 32 KiB x 64 / 64 KiB x 32 / 128 KiB x 16: 64 KiB
		 * stream 11.5 / 14.4 / 19.7 Gbit/s (kernel TCP ~16), 64 KiB
		 * ping-pong p50 49.4 / 38.4 / 75.9 us (p99 70 / 56 / 868;
		 * TCP 35). 64 KiB is best for both. */
		uint64_t ring = (uint64_t)nslots * slot;
		nslots = (uint32_t)(ring / OFI_SLOT_DEFAULT);
		if (nslots < OFI_SLOTS_MIN)
			nslots = OFI_SLOTS_MIN;
		slot = OFI_SLOT_DEFAULT;
	}
	struct ofi_conn *oc = conn_new(d, 0, clamp_slots(d, nslots), slot);
	if (!oc) {
		pthread_mutex_unlock(&ofi_p.lock);
		return -ENOMEM;
	}
	oc->token = s->token;
	if (getrandom(&oc->secret, sizeof oc->secret, 0) != sizeof oc->secret ||
	    !oc->secret) {
		conn_free(oc);
		pthread_mutex_unlock(&ofi_p.lock);
		return -EIO;
	}
	oc->chan = s->chan;
	oc->answer_by = ofi_now_ns() + OFI_ANSWER_MS * 1000000ull;
	epoll_add(oc->wfd, oc->chan);
	atomic_store(&oc->state, OFI_ST_ANSWER);
	ofi_conn_add(oc);
	pthread_mutex_unlock(&ofi_p.lock);

	struct ofi_offer of;
	memset(&of, 0, sizeof of);
	of.version = OFI_OFFER_VERSION;
	if (d->pep_addr.in.sin_family == AF_INET) {
		of.family = AF_INET;
		of.port = d->pep_addr.in.sin_port;
		memcpy(of.addr, &d->pep_addr.in.sin_addr, 4);
	} else {
		of.family = AF_INET6;
		of.port = d->pep_addr.in6.sin6_port;
		memcpy(of.addr, &d->pep_addr.in6.sin6_addr, 16);
	}
	of.nslots = oc->nslots;
	of.slot_size = oc->slot_size;
	of.secret = oc->secret;
	memcpy(of.prov, ofi_p.prov, strnlen(ofi_p.prov, sizeof of.prov - 1));
	memcpy(o->data, &of, sizeof of);
	o->len = sizeof of;
	o->nfds = 0;
	o->close_after = 0;
	o->reused = false;
	ep_fill(ep, oc, 0);
	return 0;
}

/* The client's side of a request (under ofi_p.lock): accept it. */
static void take_request(struct ofi_dom *d, struct fi_eq_cm_entry *e, size_t dlen)
{
	struct ofi_cm_data cd;
	struct ofi_conn *oc = NULL;
	if (dlen >= sizeof cd) {
		memcpy(&cd, e->data, sizeof cd);
		for (int i = 0; i < ofi_p.nconns && !oc; i++) {
			struct ofi_conn *c = ofi_p.conns[i];
			int st = atomic_load(&c->state);
			if (c->side == 0 && c->dom == d && c->token == cd.token &&
			    c->secret == cd.secret && (st == OFI_ST_ANSWER || st == OFI_ST_WAITREQ))
				oc = c;
		}
	}
	if (!oc || cd.nslots != oc->nslots || cd.slot_size != oc->slot_size) {
		/* Not ours, or given up: the server stays on TCP. */
		fi_reject(d->pep, e->info->handle, NULL, 0);
		return;
	}
	oc->peer_ctl_addr = cd.ctl_addr;
	oc->peer_ctl_key = cd.ctl_key;
	struct ofi_cm_data mine;
	cm_data_mine(oc, &mine, false);
	int r = conn_ep(oc, e->info);
	if (!r)
		r = fi_accept(oc->ep, &mine, sizeof mine);
	if (r) {
		fi_reject(d->pep, e->info->handle, NULL, 0);
		ofi_fail(oc, r, "accepting the server's fabric connection");
		return;
	}
	/* Another thread may have given up on it meanwhile (no answer in
	 * time, ofi_fail): that stands, and the server hears it. */
	int st = atomic_load(&oc->state);
	if ((st != OFI_ST_ANSWER && st != OFI_ST_WAITREQ) ||
	    !atomic_compare_exchange_strong(&oc->state, &st, OFI_ST_CONNECTING))
		fi_shutdown(oc->ep, 0);
}

/* Read the domain's events without blocking (under ofi_p.lock). The
 * passive endpoint accepts inside it: the sockets libfabric makes there
 * are its own (fab_private), whichever call of ours got here. */
static void cm_progress_in(struct ofi_dom *d);

void ofi_cm_progress(struct ofi_dom *d)
{
	fab_private++;
	cm_progress_in(d);
	fab_private--;
}

static void cm_progress_in(struct ofi_dom *d)
{
	if (!d || !d->eq)
		return;
	union {
		struct fi_eq_cm_entry e;
		char buf[sizeof(struct fi_eq_cm_entry) + 256];
	} u;
	for (int k = 0; k < 64; k++) {
		uint32_t ev = 0;
		ssize_t n = fi_eq_read(d->eq, &ev, &u, sizeof u, 0);
		if (n == -FI_EAGAIN)
			return;
		if (n == -FI_EAVAIL) {
			struct fi_eq_err_entry ee;
			memset(&ee, 0, sizeof ee);
			if (fi_eq_readerr(d->eq, &ee, 0) < 0)
				return;
			struct ofi_conn *oc = ee.fid ? ee.fid->context : NULL;
			if (oc && ofi_conn_live(oc))
				ofi_fail(oc, -(ee.err ? ee.err : EIO),
					 "the fabric's connection failed");
			continue;
		}
		if (n < 0)
			return;
		size_t dlen = (size_t)n > sizeof u.e ? (size_t)n - sizeof u.e : 0;
		OFI_LOG(3, "ofi: event %u (%zu bytes of data)", ev, dlen);
		if (ev == FI_CONNREQ) {
			if (u.e.info) {
				take_request(d, &u.e, dlen);
				ofi_fi.freeinfo(u.e.info);
			}
			continue;
		}
		struct ofi_conn *oc = u.e.fid ? u.e.fid->context : NULL;
		if (!oc || !ofi_conn_live(oc))
			continue;
		if (ev == FI_CONNECTED) {
			int st = atomic_load(&oc->state);
			if (st != OFI_ST_CONNECTING)
				continue;
			if (oc->side == 1) {
				struct ofi_cm_data cd;
				if (dlen < sizeof cd) {
					ofi_fail(oc, -EPROTO, "the client's acceptance is short");
					continue;
				}
				memcpy(&cd, u.e.data, sizeof cd);
				if (cd.token != oc->token) {
					ofi_fail(oc, -EPROTO, "the client's acceptance names "
						 "another connection");
					continue;
				}
				oc->peer_ctl_addr = cd.ctl_addr;
				oc->peer_ctl_key = cd.ctl_key;
			}
			ofi_up(oc);
		} else if (ev == FI_SHUTDOWN) {
			/* The peer's endpoint is gone: its TCP socket tells
			 * whether it closed or died (the engine reads it). */
			if (atomic_load(&oc->state) == OFI_ST_UP && ofi_timed_out(oc)) {
				ofi_fail(oc, -ETIMEDOUT, "the fabric's connection");
				continue;
			}
			oc->peer_shut = true;
			if (atomic_load(&oc->state) != OFI_ST_UP ||
			    atomic_load(&oc->peer->vers_head) == 0)
				ofi_fail(oc, -ECONNREFUSED, "the peer closed the fabric's "
					 "connection");
		}
	}
}

void ofi_chan_close(struct ofi_conn *oc)
{
	pthread_mutex_lock(&oc->chlock);
	int ch = oc->chan;
	oc->chan = -1;
	pthread_mutex_unlock(&oc->chlock);
	if (ch >= 0)
		sys_close_kept(ch);
}

/* Client: the server's answer on the hello's socket. */
void ofi_chan_progress(struct ofi_conn *oc)
{
	int st = atomic_load(&oc->state);
	if (oc->side != 0 || (st != OFI_ST_ANSWER && st != OFI_ST_WAITREQ))
		return;
	/* Another thread looking at it, or closing it: theirs to handle. */
	if (pthread_mutex_trylock(&oc->chlock))
		return;
	if (oc->chan < 0) {
		pthread_mutex_unlock(&oc->chlock);
		return;
	}
	char a;
	ssize_t r = sys_recvfrom(oc->chan, &a, 1, MSG_DONTWAIT);
	int e = errno;
	pthread_mutex_unlock(&oc->chlock);
	errno = e;
	OFI_LOG(3, "ofi: answer %zd", r);
	if (r == 1 && a == OFI_ANSWER_YES && st == OFI_ST_ANSWER) {
		/* (the request may have been taken meanwhile: no step back) */
		atomic_compare_exchange_strong(&oc->state, &st, OFI_ST_WAITREQ);
		return;
	}
	if (r < 0 && (errno == EAGAIN || errno == EINTR)) {
		if (st == OFI_ST_ANSWER && ofi_now_ns() > oc->answer_by)
			ofi_fail_if(oc, OFI_ST_ANSWER, -ETIMEDOUT,
				    "no answer from the server's library");
		return;
	}
	/* EOF or anything else before the request: the server did not take
	 * the hello (another protocol version, no resources, TCP), or gave
	 * up on the fabric - unless the request came meanwhile (the server
	 * closes its end once up). */
	st = atomic_load(&oc->state);
	if (st != OFI_ST_ANSWER && st != OFI_ST_WAITREQ)
		return;
	ofi_fail_if(oc, st, r == 0 ? -ECONNREFUSED : r < 0 ? -errno : -EPROTO,
		    st == OFI_ST_ANSWER ? "the server did not take the hello" :
		    "the server gave up before connecting");
}

/* ---- server -------------------------------------------------------------------- */

static int ofi_accept_in(struct fab_ep *ep, const struct fab_setup *s, const struct fab_offer *o);

int ofi_accept(struct fab_ep *ep, const struct fab_setup *s, const struct fab_offer *o)
{
	fab_private++;
	int r_ = ofi_accept_in(ep, s, o);
	fab_private--;
	return r_;
}

static int ofi_accept_in(struct fab_ep *ep, const struct fab_setup *s, const struct fab_offer *o)
{
	struct ofi_offer of;
	if (o->len != sizeof of || o->nfds != 1 || !s->local || !s->remote)
		return -EPROTO;
	memcpy(&of, o->data, sizeof of);
	const struct sockaddr_in *r4 = (const void *)s->remote;
	const struct sockaddr_in6 *r6 = (const void *)s->remote;
	/* The passive endpoint must be on the client's own address: a hello
	 * cannot send the stream to a third host. */
	bool same = of.family == AF_INET ?
		    s->remote->sa_family == AF_INET && !memcmp(of.addr, &r4->sin_addr, 4) :
		    of.family == AF_INET6 && s->remote->sa_family == AF_INET6 &&
		    !memcmp(of.addr, &r6->sin6_addr, 16);
	if (of.version != OFI_OFFER_VERSION || !same || !of.port || !of.secret ||
	    of.nslots < 2 || of.nslots > 4096 || of.slot_size < 1024 ||
	    of.slot_size > (4u << 20) || (of.slot_size & 63) || of.reserved ||
	    memchr(of.prov, 0, sizeof of.prov) == NULL)
		return -EPROTO;
	pthread_mutex_lock(&ofi_p.lock);
	struct ofi_dom *d = ofi_dom_for(s->local, s->local_len);
	if (!d || strcmp(of.prov, ofi_p.prov)) {
		pthread_mutex_unlock(&ofi_p.lock);
		OFI_LOG(1, "ofi: the client uses libfabric provider %s, this process %s",
			of.prov, ofi_p.prov[0] ? ofi_p.prov : "none");
		return -EPROTO;
	}
	if (clamp_slots(d, of.nslots) != of.nslots) {
		pthread_mutex_unlock(&ofi_p.lock);
		return -EPROTO;
	}
	struct ofi_conn *oc = conn_new(d, 1, of.nslots, of.slot_size);
	if (!oc) {
		pthread_mutex_unlock(&ofi_p.lock);
		return -ENOMEM;
	}
	oc->token = s->token;
	oc->secret = of.secret;
	oc->chan = sys_fd_keep(sys_fcntl(o->fds[0], F_DUPFD_CLOEXEC, 0), -1);
	struct fi_info *info = ofi_fi.dupinfo(d->info);
	int r = -ENOMEM;
	if (info) {
		free(info->dest_addr);
		if (of.family == AF_INET) {
			struct sockaddr_in *a = calloc(1, sizeof *a);
			if (a) {
				a->sin_family = AF_INET;
				a->sin_port = of.port;
				memcpy(&a->sin_addr, of.addr, 4);
			}
			info->dest_addr = a;
			info->dest_addrlen = sizeof *a;
		} else {
			struct sockaddr_in6 *a = calloc(1, sizeof *a);
			if (a) {
				a->sin6_family = AF_INET6;
				a->sin6_port = of.port;
				memcpy(&a->sin6_addr, of.addr, 16);
			}
			info->dest_addr = a;
			info->dest_addrlen = sizeof *a;
		}
		/* the endpoint's own address: any port */
		free(info->src_addr);
		info->src_addr = NULL;
		info->src_addrlen = 0;
		r = info->dest_addr ? conn_ep(oc, info) : -ENOMEM;
	}
	if (r == 0) {
		/* 'Y' first: the client's wait ends at the answer or the
		 * request, whichever it reads first. */
		char yes = OFI_ANSWER_YES;
		if (oc->chan < 0 || sys_send(oc->chan, &yes, 1, MSG_DONTWAIT | MSG_NOSIGNAL) != 1)
			r = -EPROTO;              /* the client gave up: it uses TCP */
	}
	if (r == 0) {
		struct ofi_cm_data cd;
		cm_data_mine(oc, &cd, true);
		r = fi_connect(oc->ep, info->dest_addr, &cd, sizeof cd);
	}
	if (info)
		ofi_fi.freeinfo(info);
	if (r) {
		conn_free(oc);
		pthread_mutex_unlock(&ofi_p.lock);
		OFI_LOG(1, "ofi: cannot connect to the client's fabric address (%d)", r);
		return r == -EPROTO ? -EPROTO : -ENOMEM;
	}
	epoll_add(oc->wfd, oc->chan);
	atomic_store(&oc->state, OFI_ST_CONNECTING);
	ofi_conn_add(oc);
	pthread_mutex_unlock(&ofi_p.lock);
	ep_fill(ep, oc, 1);
	return 0;
}

/* ---- both ----------------------------------------------------------------------- */

void ofi_connected(struct fab_ep *ep, int err)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (oc && err)
		ofi_fail(oc, err, "the TCP connect failed");
}

int ofi_wait_fd(struct fab_ep *ep, int tcpfd)
{
	struct ofi_conn *oc = ofi_of(ep);
	if (!oc)
		return tcpfd;
	if (tcpfd >= 0 && oc->tcp_added != tcpfd) {
		/* The TCP socket's FIN or RST wakes a sleeper too. */
		epoll_add(oc->wfd, tcpfd);
		oc->tcp_added = tcpfd;
	}
	return oc->wfd;
}

/* Last holder: let what we wrote reach the peer, then close. */
static void ofi_detach_in(struct fab_ep *ep);

void ofi_detach(struct fab_ep *ep)
{
	fab_private++;
	ofi_detach_in(ep);
	fab_private--;
}

static void ofi_detach_in(struct fab_ep *ep)
{
	struct ofi_conn *oc = ofi_of(ep);
	ep->base = NULL;
	ep->ops = NULL;
	if (!oc)
		return;                       /* a forked copy: the owner closes */
	uint64_t until = ofi_now_ns() + 200000000ull;
	while (atomic_load(&oc->state) == OFI_ST_UP && atomic_load(&oc->misc_busy) &&
	       ofi_now_ns() < until)
		ofi_progress(oc);
	pthread_mutex_lock(&ofi_p.lock);
	ofi_conn_del(oc);
	conn_free(oc);
	pthread_mutex_unlock(&ofi_p.lock);
}

/* Another process still holds it: with private endpoints that cannot
 * happen after a fork (the switch hands them back first); nothing to do. */
void ofi_unmap(struct fab_ep *ep)
{
	(void)ep;
}
