/*
 * t_epoll_queue's rounds with 40 connections per client thread. The
 * client set whose members are on tokens (the other one reads the queue
 * their connections share) now has more of them than EP_LAZY_MIN (32):
 * it looks at a member only with news - an event of its socket - and arms
 * it only after a look, as it does queue members, instead of looking at
 * every member in every scan. A reply whose token were missed shows as a
 * hang (watchdog), a misrouted one as a wrong byte; EPOLL_CTL_MOD must
 * still look at a member without news. The harness runs it with
 * SDP_SPIN_US=0, so every wake-up is needed.
 */
#define PER 40
#define ROUNDS 160
#include "t_epoll_queue.c"
