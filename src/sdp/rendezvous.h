/*
 * rendezvous.h - the listening side of the rendezvous, shared by hello.c
 * (taking hellos at accept) and group.c (SO_REUSEPORT groups: one
 * rendezvous joined by every listener of an address and port, and the
 * records of connections that cannot be served). Private to src/sdp/.
 */
#ifndef SDP_RENDEZVOUS_H
#define SDP_RENDEZVOUS_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "fabric/fabric.h"
#include "sdp/proto.h"

struct key {                       /* normalized address: v4-mapped -> v4 */
	uint16_t family;
	uint8_t  addr[16];
	uint16_t port;                 /* network order */
};

struct pending {
	struct sdp_hello h;            /* h.pid: the sender as SO_PEERCRED says */
	int fds[FAB_OFFER_FDS];        /* the offer's descriptors (h.nfds), ours */
	uint64_t rx_ns;                /* when we took it (our clock, not theirs) */
};

/* A connection whose hello was read but that cannot be served here: the
 * process that accepts the TCP connection resets it (the client is
 * committed to SDP), or drops it unseen (the wake-up connection of a
 * listener joining the group). Kept in the shared block so that
 * whichever process of the group accepts the connection finds it. */
enum tomb_kind { TOMB_FREE = 0, TOMB_RESET = 1, TOMB_WAKE = 2 };
struct tomb {
	uint32_t kind;                 /* enum tomb_kind */
	int32_t  err;                  /* why (errno), for the log */
	uint64_t t_ns;                 /* recorded at (CLOCK_MONOTONIC ns) */
	struct key l, p;               /* the TCP connection: listening side, peer */
};
#define TOMB_MAX 256
#define TOMB_TTL_NS (120ull * 1000000000ull)

/* Shared by every process that takes hellos from one rendezvous: those
 * forked after listen(), and the listeners of a SO_REUSEPORT group that
 * joined it (group.c). A sealed memfd for groups (it is passed to joining
 * listeners), anonymous shared memory otherwise. */
#define LSH_MAGIC   0x53445047u    /* "SDPG" */
#define LSH_VERSION 2
/* The put-back queue (hello.c): hellos a process of the group read while
 * looking for another connection's go there, and it is read before the
 * rendezvous - but only by an accept whose connection the index names. */
#define PB_MAX 1024
struct pb_key {
	struct key l, p;               /* the hello's TCP connection */
};
struct lshared {
	uint32_t magic;                /* LSH_MAGIC */
	uint32_t version;              /* LSH_VERSION */
	uint32_t size;                 /* sizeof(struct lshared) */
	uint32_t pad;
	pthread_mutex_t lock;          /* robust, process-shared: taking hellos */
	_Atomic uint32_t nproc;        /* processes holding the rendezvous */
	uint32_t has_pb;               /* the group has a put-back queue: every
					* member holds it (sdp_listener.pb) */
	uint64_t secret;               /* proves a put-back hello is a sibling's */
	struct tomb tomb[TOMB_MAX];    /* under lock */
	/* Index of the put-back queue, under lock: the connections of its
	 * hellos in queue order (a ring, pb_head first). Pushed before the
	 * send, popped after the receive: it may name a hello more than the
	 * queue holds (a process killed in between), never fewer; an empty
	 * queue found empties it. */
	uint32_t pb_head, pb_n;
	struct pb_key pb[PB_MAX];
};

#define SILENT_MAX 32
struct silent {                    /* rendezvous connections with no hello yet */
	int fd;
	uint64_t since_ns;
};

#define WIDER_MAX 2
struct sdp_listener {
	int rv;                        /* rendezvous socket (abstract, listening);
					* -1 while joining a group */
	int net1;                      /* network rendezvous (hello_net.c) + 1;
					* 0: none */
	enum fab_pref pref;            /* the policy's choice of provider */
	struct sockaddr_un name;
	socklen_t namelen;
	uid_t uid;                     /* the only uid we take hellos from */
	struct lshared *sh;            /* NULL while joining */
	int shfd;                      /* memfd of sh (groups: passed to joiners), or -1 */
	int pb[2];                     /* the put-back queue (a SOCK_SEQPACKET
					* socketpair, shared like sh): [0] read,
					* [1] write; -1 when the group has none */
	struct pending *pend;
	int npend, cap;
	struct silent silent[SILENT_MAX];
	int nsilent;
	/* network rendezvous connections whose hello is still on its way
	 * (its client connected, then set up its endpoint): kept SILENT_NS,
	 * looked at again by the next drains */
	struct silent netsilent[SILENT_MAX];
	int nnetsilent;
	/* SO_REUSEPORT groups (group.c) */
	bool group;                    /* others may join this rendezvous */
	bool want_withdraw;            /* withdraw it as soon as we have it */
	bool lost;                     /* rv was closed under us (a raw close
					* system call): no SDP offered any more */
	int join;                      /* joining: our connection to the group's
					* rendezvous awaiting the answer, or -1 */
	int32_t join_pid;              /* the process that sent that request */
	uint64_t join_nonce;
	uint64_t join_retry_ns;        /* no new request before then */
	struct key k;                  /* the address the name stands for */
	struct sockaddr_storage addr;  /* the listening socket's own address, when
					* bound to one (not a wildcard): every
					* connection it accepts has it (getsockname
					* of the listener); addrlen 0 otherwise */
	socklen_t addrlen;
	struct sdp_listener *wider[WIDER_MAX];  /* less specific names of our
					* port whose clients' SYNs we may get */
	int nwider;
	uint32_t refs;                 /* fd owner (1) + listeners naming it wider */
	bool fd_owned;
	struct sdp_listener *reg_next; /* this process's open listeners */
};

/* hello.c */
#define RV_FDS_MAX 4               /* descriptors rv_send passes at most (a
				    * join answer's; an offer has FAB_OFFER_FDS) */
int  rv_key_of(const struct sockaddr *sa, socklen_t len, struct key *k);
bool rv_intact(struct sdp_listener *l);   /* hello.c: rv still ours */
socklen_t rv_name_of(struct sockaddr_un *un, uid_t uid, const struct key *k);
int  rv_send(int s, const void *msg, size_t len, const int *fds, int nfds);
void listener_free(struct sdp_listener *l);

/* group.c */
int  lshared_init(struct sdp_listener *l, bool passable);
void lshared_drop(struct sdp_listener *l);
int  group_open(int fd, const struct key *k, bool offer, struct sdp_listener **out);
void group_close(struct sdp_listener *l);
void group_fork(struct sdp_listener *l, int delta);
void group_withdraw(struct sdp_listener *l);
/* A JOIN request taken from l's rendezvous on connection s (verified
 * sender uid): answer it. Records its wake-up connection. */
void group_answer_join(struct sdp_listener *l, int s, const struct sdp_hello *h);
/* Finish a pending join if its answer came: true when joined. */
bool group_join_poll(struct sdp_listener *l);
void tomb_add(struct lshared *sh, uint32_t kind, int err, const struct key *l,
	      const struct key *p);
uint32_t tomb_take(struct lshared *sh, const struct key *l, const struct key *p,
		   int *err);

#endif
