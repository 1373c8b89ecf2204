/*
 * epoll_int.h - what the two halves of the switch's epoll share: the
 * shadow set of an epoll instance and its members (epoll.c: create, ctl,
 * fork, the readiness queues) and the scan and wait over them
 * (epoll_wait.c).
 */
#ifndef SDP_EPOLL_INT_H
#define SDP_EPOLL_INT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/epoll.h>

#include "sdp/wake.h"

struct sdp_conn;
struct fab_ops;

#define TAG      0x5344500000000000ull      /* "SDP" in the top bytes */
#define TAGQ     0x5344510000000000ull      /* "SDQ": a readiness queue */
#define TAGW     0x5344570000000000ull      /* "SDW": a wake descriptor */
#define TAG_MASK 0xffffff0000000000ull
#define EP_QMAX  8                          /* queues one set reads */
/* Token members from which a set looks at them only with news (lazy):
 * below, a look at each in every scan costs less than the token per
 * message that news while awake costs their peers. */
#define EP_LAZY_MIN 32
#define Q_IDX(q) ((unsigned)(q) & 0xffu)    /* fabric.h q_bind: low byte */

/* A readiness queue of the provider's (fabric.h q_bind) that this set reads
 * the wake-ups of some members from: one descriptor in the kernel set
 * (edge-triggered, tagged) for all of them. */
struct ep_queue {
	const struct fab_ops *ops;    /* NULL: free entry */
	int q;                        /* the provider's id */
	int fd;                       /* its descriptor, in the kernel set */
	int members;                  /* entries of the set on it */
	bool dead;                    /* gone: its members use tokens */
	bool proxy;                   /* we count one sleeper on it for waiters
				       * that may sleep uncounted on it (it was
				       * taken during their sleep, or a wait
				       * went to the kernel without the shadow):
				       * kicks ring its bell, in the kernel set */
};

struct ep_ent {
	int fd;
	struct sdp_conn *c;
	uint32_t events;              /* as the application asked */
	epoll_data_t data;
	bool disabled;                /* one-shot fired */
	bool connecting;              /* kernel registration includes EPOLLOUT */
	bool watching;                /* we are its watcher during this sleep */
	bool pending;                 /* undecided socket (c == NULL): the kernel
				       * has the application's registration */
	uint64_t last_arrived, last_acked;
	uint32_t last_ev;
	uint64_t seen;                /* fab_clock of the first scan that found it
				       * ready without a stamp, 0 = not ready */
	uint64_t rep;                 /* fab_clock of the scan that last reported it,
				       * or of epoll_ctl ADD/MOD (TCP: (re-)queued at
				       * the ready list's tail then) */
	uint8_t q1;                   /* 1 + index of its queue in the set's qs;
				       * 0: its wake-ups are tokens */
	bool looked;                  /* looked at since its last arm (a queue
				       * arm stays until a kick takes it) */
	bool tok_ok;                  /* on tokens, and its tokens arrive on its
				       * own socket (not a provider's wait
				       * descriptor): may be lazy (set at look) */
	bool parked;                  /* deleted by the application, still in
				       * the kernel set with our registration:
				       * not reported, armed nor watched, and its
				       * next EPOLL_CTL_ADD makes no system call
				       * (park(), unpark()) */
	uint32_t gen;                 /* the partial scan that listed it */
};

/* A ready member found by a scan: when it became ready, its events, and
 * the ET state to keep if it is reported. */
struct ep_cand {
	uint64_t key;
	int i;
	uint32_t ev;
	uint64_t arrived, acked;
	uint32_t cur_ev;
};

struct ep_shadow {
	pthread_mutex_t lock;
	int epfd;
	struct ep_ent *v;
	int n, cap;
	int npending;                 /* of the n, pending entries (no member) */
	struct ep_cand *cand;         /* scan(): ready members, cap entries */
	_Atomic uint32_t spin_cur, spin_waits;   /* adaptive spin (wait.c) */
	struct ep_queue qs[EP_QMAX];  /* readiness queues it reads */
	/* What a scan looks at when not at every member (scan()): */
	int *check;                   /* members with news (popped keys, kernel
				       * events of their sockets), cap entries */
	int ncheck;
	int *hot;                     /* members the last scan found ready */
	int nhot;
	int nqueued;                  /* members on a live queue of ours */
	_Atomic bool kernel_owed;     /* a wait returned a full array of SDP
				       * members without asking the kernel:
				       * the next one asks it first */
	bool full;                    /* next scan looks at every member */
	uint64_t full_at;             /* and one at the latest then (ns) */
	uint32_t gen;
	int *kmap;                    /* queue key -> 1 + member index (a hint,
				       * checked), kcap entries */
	uint32_t kcap;
	bool kmap_inexact;            /* a queue member's key could not be mapped */
	int *fmap;                    /* fd -> 1 + member index: exact for every
				       * member unless fmap_inexact */
	uint32_t fcap;
	bool fmap_inexact;            /* a member's fd could not be mapped */
	bool reap;                    /* some member left SDP: remove it */
	bool token_shared;            /* a queue member's token had another
				       * watcher: sleep in slices */
	bool lazy;                    /* token members are looked at only with
				       * news, like queue members (EP_LAZY_MIN) */
	int nwatching;                /* members we watch during this sleep */
	int nsleep;                   /* waiters asleep in the kernel now, from
				       * their count on the queues to the end
				       * of the sleep (ep_queues_sleep/wake) */
	bool counted;                 /* every wait since the last full wake
				       * went through the shadow (a wait while
				       * the set had no members is the kernel's
				       * own, counted on nothing: raw_begin in
				       * epoll_wait.c) */
	uint32_t epoch;               /* local_changes at the last scan */
	pid_t qpid;                   /* the process they belong to (a forked
				       * child's copy of the set uses tokens) */
	pid_t owner;                  /* the process that made the shadow: only
				       * it parks members (a forked child
				       * sharing the kernel set must not remove
				       * the registrations its parent keeps) */
	uint64_t owed_ns;             /* when queue members last got kick_owed */
	uint32_t wk_ids[SDP_WAKE_SLOTS]; /* wake descriptors in the kernel set
				       * (edge-triggered), by their id; atomic
				       * (two sleeps may register one: EEXIST) */
	struct ep_shadow *next;
};


/* The queues a sleeper counted itself on (and holds), to count itself off
 * the same ones (the set may drop or gain queues meanwhile). */
struct q_sleep {
	const struct fab_ops *ops[EP_QMAX];
	int q[EP_QMAX];
	int n;
};

/* epoll.c: the sets and their members */
extern _Atomic uint32_t ep_local_changes;  /* bumped by epoll_local_change */
struct ep_shadow *ep_shadow_of(int epfd, bool create);
int  ep_find(struct ep_shadow *s, int fd);           /* member index, or -1 */
bool ep_on_queue(const struct ep_shadow *s, const struct ep_ent *e);
/* Looked at only with news, armed after a look, watched by no sleep. */
bool ep_by_news(const struct ep_shadow *s, const struct ep_ent *e);
void ep_note_check(struct ep_shadow *s, int i);      /* the next scan looks */
void ep_remove_at(struct ep_shadow *s, int i);
void ep_unpark(struct ep_shadow *s, int i);
void ep_arm(struct ep_shadow *s, struct ep_ent *e, bool owed);
void ep_raw_sleep(struct ep_shadow *s);
void ep_wait_fd_ctl(int epfd, int op, int fd, struct sdp_conn *c);
uint64_t ep_arrived(struct sdp_conn *c);
uint64_t ep_acked(struct sdp_conn *c);
/* the set's readiness queues */
bool ep_queues_ours(const struct ep_shadow *s);
int  ep_queue_take(struct ep_shadow *s, int i);
bool ep_queues_sleep(struct ep_shadow *s, struct q_sleep *z);
void ep_queues_wake(struct ep_shadow *s, struct q_sleep *z);

#endif
