/*
 * ofi.h - the ofi provider's own declarations (nothing outside
 * src/fabric/ofi*.c includes this): a fabric provider on libfabric for
 * peers on other hosts.
 *
 * Files: ofi_lib.c (loading libfabric.so.1 with dlopen, choosing a
 * libfabric provider, per-address domains, what `sdp check` lists),
 * ofi_cm.c (connection set-up: offer, the server's answer, the fabric's
 * connection manager, tear-down, the wait object), ofi_chan.c (message
 * channel, control words, wake-ups, marks, fallback; the ops table),
 * ofi_mr.c (the registration cache, RDMA Read / Write, the probe).
 *
 * One connection = one FI_EP_MSG endpoint with its own completion queue
 * (whose wait object only that endpoint's traffic wakes, and whose reading
 * progresses only that endpoint: the tcp provider walks every endpoint
 * bound to a queue each time it is read), and a private region of
 * registered memory (PROTOCOL.md section 14):
 *
 *   tx ring   nslots send buffers: message seq is in buffer seq % nslots
 *             until the peer consumed it (FI_MSG sends from here; read
 *             again by a fallback to TCP)
 *   rx bufs   nslots + OFI_KICKS receive buffers, all posted (fi_recv):
 *             the peer's messages land in whichever comes first in the
 *             queue; `arrived` keeps their order
 *   ctl[0]    our control block (struct ofi_ctl): written by us, copied
 *             into the peer's ctl[1] with an RDMA Write after each change
 *   ctl[1]    the peer's control block, as its last RDMA Write left it
 *   kick      the 8-byte wake-up message (struct ofi_kick) we send
 *
 * The engine reads the peer's state lock-free from ctl[1], exactly as it
 * reads the peer's half of a shared region on shm; only what arrives
 * needs the completion queue reaped (ofi_progress).
 */
#ifndef SDP_OFI_H
#define SDP_OFI_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <netinet/in.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>
#include <rdma/fi_eq.h>
#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include "fabric/fabric.h"
#include "sdp/proto.h"

#define OFI_KICKS      4       /* receive buffers beyond nslots: wake-ups
				* (struct ofi_kick) in flight at most */
#define OFI_SLOT_DEFAULT (64u << 10)  /* bytes per buffer unless the user
				       * set SDP_SLOT_SIZE or SDP_NSLOTS */
#define OFI_SLOTS_MIN  8       /* ... and at least this many */
#define OFI_MISC_CTX   128     /* contexts of control writes, kicks, reads */
#define OFI_OFFER_VERSION 1
#define OFI_ANSWER_YES 'Y'     /* the server took the hello (PROTOCOL.md 14.2) */
#define OFI_ANSWER_MS  10000   /* longest wait for the server's answer */
#define OFI_MAX_DOMAINS 8

/* ---- libfabric, loaded at run time (ofi_lib.c) --------------------------- */

struct ofi_lib {
	void *h;                       /* dlopen("libfabric.so.1") */
	int  (*getinfo)(uint32_t, const char *, const char *, uint64_t,
			const struct fi_info *, struct fi_info **);
	void (*freeinfo)(struct fi_info *);
	struct fi_info *(*dupinfo)(const struct fi_info *);
	int  (*fabric)(struct fi_fabric_attr *, struct fid_fabric **, void *);
	const char *(*strerror)(int);
};
extern struct ofi_lib ofi_fi;

/* A fabric, domain and event queue for one local address (the domain a
 * connection of that address uses), and the passive endpoint the servers
 * of this process's client connections connect to. */
struct ofi_dom {
	bool used;
	union { struct sockaddr_in in; struct sockaddr_in6 in6; struct sockaddr sa; } ip;
	struct fi_info *info;          /* fi_getinfo's choice for ip */
	struct fid_fabric *fabric;
	struct fid_domain *domain;
	struct fid_eq *eq;             /* FI_WAIT_FD: every endpoint's CM events
					* (in the wait descriptor of connections
					* still setting up only) */
	int eq_fd;
	struct fid_pep *pep;           /* client side: where servers connect */
	union { struct sockaddr_in in; struct sockaddr_in6 in6; } pep_addr;
	uint64_t mr_mode;              /* FI_MR_* the provider asks of us */
	uint64_t mode;                 /* FI_CONTEXT ... */
	size_t   inject;               /* inject_size */
	size_t   txq, rxq;             /* queue sizes */
	size_t   cm_data;              /* bytes of connect/accept data */
	uint8_t  key_bytes;            /* mr_key_size */
};

struct ofi_proc {
	pthread_mutex_t lock;          /* domains, the table of connections, the EQs */
	bool tried, ok;                /* libfabric loaded and usable */
	pid_t pid;                     /* this process (atfork keeps it current) */
	const char *want;              /* provider name wanted, NULL = any */
	char prov[32];                 /* the provider in use ("tcp", "verbs") */
	char label[40];                /* "ofi:tcp" */
	struct ofi_dom dom[OFI_MAX_DOMAINS];
	char nets[16][48];             /* the fabrics' networks ("10.0.0.0/24") */
	int nnets;
	void (*log)(int level, const char *fmt, ...);
	uint32_t port_offset, hello_ms;
	/* every live connection of the process (EQ events name them) */
	struct ofi_conn **conns;
	int nconns, capconns;
	_Atomic uint64_t mr_hits, mr_misses;   /* registration cache */
	/* Connections whose sends the fabric may still hold (the tcp
	 * provider moves a connection's bytes only when its own queue is
	 * read, where the kernel would move TCP's by itself): any
	 * connection's progress that found nothing for itself, and every
	 * sleep, reads their queues too (ofi_backlog). */
	pthread_mutex_t bklock;
	struct ofi_conn *bk[256];
	_Atomic int nbk;               /* read without the lock: non-zero makes
					* every sleep of the process short
					* (fab_held_ms) */
	_Atomic uint64_t bk_tick;      /* fab_clock before which no walk starts
					* (the last one's end + 8x its length) */
	int bk_next;                   /* where the next walk starts in bk[]
					* (round robin; under bklock) */
};
extern struct ofi_proc ofi_p;

#define OFI_LOG(l, ...) do { if (ofi_p.log) ofi_p.log((l), __VA_ARGS__); } while (0)

/* ---- wire ------------------------------------------------------------------ */

/*
 * The provider's offer in the hello (64 bytes at most), little-endian.
 *
 *  off len field      meaning
 *   0   1  version    OFI_OFFER_VERSION
 *   1   1  family     AF_INET or AF_INET6 of addr
 *   2   2  port       the client's passive endpoint (network order)
 *   4   4  nslots     receive buffers per direction wanted
 *   8   4  slot_size  bytes per receive buffer wanted
 *  12   4  reserved   zero
 *  16   8  secret     random: the server's connection request must carry it
 *  24  16  addr       the passive endpoint's address (= the hello's src_addr)
 *  40  16  prov       libfabric provider name, NUL-padded ("tcp")
 */
struct ofi_offer {
	uint8_t  version;
	uint8_t  family;
	uint16_t port;
	uint32_t nslots;
	uint32_t slot_size;
	uint32_t reserved;
	uint64_t secret;
	uint8_t  addr[16];
	char     prov[16];
};
_Static_assert(sizeof(struct ofi_offer) == 56, "ofi offer is 56 bytes");

/*
 * Connection data of the fabric's connection request (server -> client)
 * and of its acceptance (client -> server), 40 bytes.
 *
 *  off len field     meaning
 *   0   8  token     the hello's token
 *   8   8  secret    the offer's secret (request) / zero (acceptance)
 *  16   8  ctl_addr  where the peer writes its control block (our ctl[1]):
 *                    an address (FI_MR_VIRT_ADDR) or the offset in the region
 *  24   8  ctl_key   the region's key
 *  32   4  nslots    the geometry in use (request: the server's answer)
 *  36   4  slot_size
 */
struct ofi_cm_data {
	uint64_t token;
	uint64_t secret;
	uint64_t ctl_addr;
	uint64_t ctl_key;
	uint32_t nslots;
	uint32_t slot_size;
};
_Static_assert(sizeof(struct ofi_cm_data) == 40, "ofi connection data is 40 bytes");

/*
 * The control block each side writes and copies to its peer (256 bytes),
 * little-endian. Every field is written by its side only and only grows
 * or is set once, so a copy caught mid-way by a newer one is never
 * inconsistent per word; the version at both ends tells a reader that a
 * copy may be only partly placed (then the older of the two counts).
 *
 *  off len field         meaning
 *    0 128 zc            the zero-copy control words (struct sdp_zctl)
 *  128   8 vers_head     bumped with every change copied (first word)
 *  136   8 cons          the peer's messages we consumed (credits)
 *  144   8 rx_bytes      stream bytes our application consumed
 *  152   8 fin_seq       with FIN: messages we posted before it
 *  160   8 fb_rx_cons    fallback: our position in the peer's messages
 *  168   8 seen          the peer's version when we last armed
 *  176   8 kicks_reaped  the peer's wake-ups we took (their flow control)
 *  184   4 marks         enum fab_mark bits we set
 *  188   4 fb_rx_off     fallback: bytes of the next message consumed
 *  192   4 armed         enum fab_wait we sleep for
 *  196   4 arm_seq       bumped with each arm
 *  200   4 rcvbuf        SO_RCVBUF, 0 = not set
 *  204   4 tx_limited    our sends are byte-limited
 *  208   4 linger0       1: our socket closes with a reset (SO_LINGER 0 s)
 *  212  36 reserved      zero
 *  248   8 vers_tail     = vers_head (last word)
 */
struct ofi_ctl {
	struct sdp_zctl zc;
	_Atomic uint64_t vers_head;
	_Atomic uint64_t cons;
	_Atomic uint64_t rx_bytes;
	_Atomic uint64_t fin_seq;
	_Atomic uint64_t fb_rx_cons;
	_Atomic uint64_t seen;
	_Atomic uint64_t kicks_reaped;
	_Atomic uint32_t marks;
	_Atomic uint32_t fb_rx_off;
	_Atomic uint32_t armed;
	_Atomic uint32_t arm_seq;
	_Atomic uint32_t rcvbuf;
	_Atomic uint32_t tx_limited;
	_Atomic uint32_t linger0;
	uint8_t reserved[36];
	_Atomic uint64_t vers_tail;
};
_Static_assert(sizeof(struct ofi_ctl) == 256, "ofi control block is 256 bytes");
_Static_assert(offsetof(struct ofi_ctl, vers_head) == 128, "vers_head at 128");
_Static_assert(offsetof(struct ofi_ctl, marks) == 184, "marks at 184");
_Static_assert(offsetof(struct ofi_ctl, vers_tail) == 248, "vers_tail last");

/* A wake-up: 8 bytes, told from an engine message (at least a BSDH, 16
 * bytes) by its length. */
struct ofi_kick {
	uint32_t magic;                /* OFI_KICK_MAGIC */
	uint32_t seq;                  /* kicks sent so far */
};
#define OFI_KICK_MAGIC 0x4b49434bu    /* "KICK" */

/* ---- one connection ------------------------------------------------------ */

enum ofi_state {
	OFI_ST_ANSWER = 1,   /* client: hello sent, the server's answer awaited */
	OFI_ST_WAITREQ,      /* client: the server took it; its request awaited */
	OFI_ST_CONNECTING,   /* server: requested / client: accepted, not up yet */
	OFI_ST_UP,           /* connected: messages flow */
	OFI_ST_TCP,          /* never up, nothing sent: both ends use TCP */
	OFI_ST_DOWN,         /* failed after coming up (or after the answer): reset */
};

/* What a context pointer of a completion names (fi_context first, as
 * FI_CONTEXT asks). */
struct ofi_conn;
struct ofi_op {
	struct fi_context ctx;
	struct ofi_conn *oc;           /* whose */
	uint8_t kind;                  /* OFI_OP_* */
	uint32_t idx;                  /* buffer index */
};
enum { OFI_OP_RECV = 1, OFI_OP_SEND, OFI_OP_MISC, OFI_OP_READ };

struct ofi_mrc {                   /* one cached registration */
	uintptr_t base;                /* page-aligned */
	size_t len;
	struct fid_mr *mr;
	uint64_t key;
	void *desc;
	uint64_t access;
	uint64_t used;                 /* tick of the last use (LRU) */
};
#define OFI_MRC_MAX 32

struct ofi_conn {
	pid_t owner;                   /* the process whose libfabric objects these are */
	_Atomic bool dead;             /* detached: completions still queued for it
					* are dropped (its contexts live on a while) */
	uint64_t died_ns;
	int side;                      /* 0 client, 1 server */
	_Atomic int state;             /* enum ofi_state */
	_Atomic int err;               /* why DOWN or TCP (-errno): the first
					* failure's */
	bool peer_shut;                /* the peer's endpoint closed (FI_SHUTDOWN) */
	struct ofi_dom *dom;
	struct fid_ep *ep;
	struct fid_cq *cq;             /* ours alone (FI_WAIT_FD) */
	int cq_fd;                     /* its wait object, in wfd */
	pthread_mutex_t cqlock;        /* one reader of cq at a time */
	_Atomic uint64_t reaps;        /* completions reaped from cq (sdp stat:
					* a completion wakes its own connection) */
	_Atomic uint32_t tx_out;       /* sends handed to the fabric, not completed */
	_Atomic uint64_t inj_hi;       /* 1 + seq of our last injected message:
					* no completion says it left libfabric,
					* the peer's consumption does */
	_Atomic bool in_bk;            /* on ofi_p's backlog list */
	_Atomic uint64_t reap_tick;    /* fab_clock when cq was last read to its
					* end (0: read it at the next progress) */
	bool eqs_in_wfd;               /* the domains' EQs are in wfd (until up) */
	int wfd;                       /* our epoll: our CQ, the domains' EQs
					* until up, chan, the TCP socket */
	int tcp_added;                 /* TCP fd number added to wfd, or -1 */
	int evfd;                      /* eventfd in wfd: a completion of ours
					* that another thread reaped, while we
					* may sleep (local_armed) */
	_Atomic uint32_t local_armed;  /* enum fab_wait our sleepers wait for */
	int chan;                      /* the hello's TCP socket until up, or -1;
					* used and taken only under chlock (a
					* number closed twice may be another
					* connection's descriptor by then) */
	pthread_mutex_t chlock;
	/* The application's TCP_USER_TIMEOUT (ms; 0 = the kernel's default)
	 * as copied onto libfabric's own socket of this endpoint (tcp
	 * provider), so a cut link fails the fabric connection as it would
	 * fail TCP's; looked at (opt_ns, fab clock ns) at most every 200 ms
	 * before a sleep. fsock: that socket once found, -1 none, -2 not
	 * looked for yet. */
	int utmo_ms;
	int fsock;
	_Atomic uint64_t opt_ns;
	uint64_t token, secret;
	uint32_t nslots, slot_size, nbufs;   /* nbufs = nslots + OFI_KICKS */
	/* memory (mmap, MADV_DONTFORK) */
	char *mem;
	size_t memlen;
	char *tx, *rx;
	struct ofi_ctl *me, *peer;     /* ctl[0], ctl[1] */
	struct ofi_kick *kick;
	struct fid_mr *mr;
	void *desc;
	uint64_t key;
	uint64_t peer_ctl_addr, peer_ctl_key;
	/* message channel */
	_Atomic uint64_t tx_prod;      /* our messages posted */
	_Atomic uint64_t arrived;      /* the peer's messages reaped */
	_Atomic uint64_t cons;         /* ... consumed (= me->cons) */
	_Atomic uint64_t peer_cons;    /* the peer's consumption of ours, as we know it
					* (its ctl copy, or a BSDH's mseq_ack) */
	_Atomic uint64_t published;    /* me->cons as last copied to the peer */
	struct sdp_zctl zc_sent;       /* our zero-copy words as last copied whole
					* (a change needs the full block) */
	_Atomic uint64_t since;        /* fab_clock when the queue became non-empty */
	uint32_t *order;               /* arrived seq % nbufs -> buffer index */
	struct ofi_op *rxop, *txop, *miscop;
	_Atomic uint32_t misc_next;
	_Atomic uint32_t misc_busy;    /* misc operations in flight */
	_Atomic uint32_t kicks_sent;
	_Atomic uint32_t kicked_for;   /* the peer's arm_seq we last kicked */
	_Atomic uint64_t kicks_reaped; /* = me->kicks_reaped */
	/* the registration cache (ofi_mr.c) and an RDMA Read in flight */
	struct ofi_mrc *mrc;
	uint32_t nmrc;
	uint64_t mrc_tick;
	_Atomic uint32_t reads_done;
	_Atomic int read_err;
	pthread_mutex_t plock;         /* posting: sends before the connection is
					* up wait in the ring (tx_flushed) */
	uint64_t tx_flushed;           /* messages handed to the fabric */
	pthread_mutex_t wlock;         /* the RDMA Read a caller waits for */
	uint64_t answer_by;            /* client: give up waiting for the answer */
};

/* ---- ofi_lib.c ------------------------------------------------------------- */
bool ofi_load(void);                         /* once: dlopen and a provider */
struct ofi_dom *ofi_dom_for(const struct sockaddr *local, socklen_t len);
bool ofi_on_local_net(const struct sockaddr *peer, socklen_t len);  /* before loading */
bool ofi_in_nets(const struct sockaddr *peer, socklen_t len);
uint64_t ofi_now_ns(void);
void ofi_conn_add(struct ofi_conn *oc);
void ofi_conn_del(struct ofi_conn *oc);
bool ofi_conn_live(struct ofi_conn *oc);

/* ---- ofi_cm.c -------------------------------------------------------------- */
int  ofi_offer(struct fab_ep *ep, const struct fab_setup *s, struct fab_offer *o);
int  ofi_accept(struct fab_ep *ep, const struct fab_setup *s, const struct fab_offer *o);
void ofi_connected(struct fab_ep *ep, int err);
void ofi_detach(struct fab_ep *ep);
void ofi_unmap(struct fab_ep *ep);
int  ofi_wait_fd(struct fab_ep *ep, int tcpfd);
void ofi_cm_progress(struct ofi_dom *d);     /* the EQ, without blocking */
void ofi_dom_added(struct ofi_dom *d);       /* a new domain's EQ wakes every connection */
void ofi_chan_progress(struct ofi_conn *oc); /* client: the server's answer */
void ofi_chan_close(struct ofi_conn *oc);    /* closes chan once, whoever calls */
/* ofi_fail, only while the state is still expect (a failure of the set-up
 * step the caller saw, not of a connection that moved on since). */
void ofi_fail_if(struct ofi_conn *oc, int expect, int err, const char *why);
void ofi_init(const struct fab_params *p);
bool ofi_reaches(const struct sockaddr *peer, socklen_t len);

/* ---- ofi_chan.c ------------------------------------------------------------ */
struct ofi_conn *ofi_of(struct fab_ep *ep);  /* NULL: not this process's */
void ofi_progress(struct ofi_conn *oc);      /* reap the CQ (and the set-up) */
bool ofi_reap(struct ofi_conn *oc, bool dying);   /* under oc->cqlock; true:
							 * read to its end */
void ofi_progress_now(struct ofi_conn *oc);
void ofi_backlog(struct ofi_conn *self);     /* read the backlog's queues */
void ofi_bk_forget(struct ofi_conn *oc);     /* freeing it: off the list for sure */
void ofi_bk_del(struct ofi_conn *oc);        /* off the backlog list */  /* ofi_progress, not throttled */
int  ofi_post_recv(struct ofi_conn *oc, uint32_t buf);
int  ofi_publish(struct ofi_conn *oc);       /* copy our block to the peer */
struct ofi_op *ofi_misc_op(struct ofi_conn *oc);
void ofi_misc_done(struct ofi_conn *oc);
void ofi_fail(struct ofi_conn *oc, int err, const char *why);
bool ofi_timed_out(struct ofi_conn *oc);     /* its socket's TCP_USER_TIMEOUT ran out */
void ofi_up(struct ofi_conn *oc);            /* the connection came up */
void ofi_wake(struct ofi_conn *oc);          /* make wfd readable if someone sleeps */

/* ---- ofi_mr.c -------------------------------------------------------------- */
uint64_t ofi_mr_key(struct fab_ep *ep, const void *addr, size_t len);
void *ofi_mr_desc(struct ofi_dom *d, const void *addr, size_t len);  /* local */
ssize_t ofi_rdma_read(struct fab_ep *ep, const struct iovec *local, int nlocal,
		      uint64_t raddr, size_t len, uint64_t rkey);
ssize_t ofi_rdma_write(struct fab_ep *ep, const struct iovec *local, int nlocal,
		       uint64_t raddr, size_t len, uint64_t rkey);
uint64_t ofi_probe_addr(struct fab_ep *ep);
int  ofi_probe(struct fab_ep *ep, uint64_t raddr, uint64_t key);
int  ofi_reg(struct ofi_dom *d, void *addr, size_t len, uint64_t access,
	     struct fid_mr **mr, uint64_t *key);
void ofi_mr_drop(struct ofi_conn *oc);       /* the connection's cache */

#endif
