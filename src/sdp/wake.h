/*
 * wake.h - the process's wake descriptor (wake.c): a local
 * shutdown(SHUT_RD) wakes this process's threads asleep on the socket.
 */
#ifndef SDP_WAKE_H
#define SDP_WAKE_H

#include <stdbool.h>
#include <stdint.h>

struct sdp_conn;

/* Descriptors at once: one sleeps take, the others written and not yet
 * left by every sleep that watched them. */
#define SDP_WAKE_SLOTS 16

/* The process has (or may have) another thread: its sleeps watch a wake
 * descriptor from now on (the switch's pthread_create). */
void sdp_wake_threads(void);
/* Has the process (or may it have) another thread? */
bool sdp_wake_threaded(void);
/* Before the last look that precedes a sleep: the slot (>= 0) whose
 * descriptor *fd the sleep also watches for POLLIN (then: look again), with
 * its id (changes when the slot's descriptor is made anew: epoll sets
 * register by it), or -1: none (one thread, or none to be had). A slot
 * taken is given back with sdp_wake_drop after the sleep. */
int  sdp_wake_hold(int *fd, uint32_t *id);
void sdp_wake_drop(int slot);
/* A local shutdown(SHUT_RD) of c, after rx_shut is set: wakes every sleep
 * of this process that holds the current descriptor. True if it wrote. */
bool sdp_wake_all(struct sdp_conn *c);
/* A sleep saw revents on the slot's descriptor: fine if a shutdown wrote
 * it; POLLNVAL, or readable while still the one sleeps take, means the
 * application closed our number: no more wake descriptors (logged). */
void sdp_wake_woke(int slot, short revents);
void sdp_wake_atfork_child(void);

#endif
