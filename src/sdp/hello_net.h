/*
 * hello_net.h - the rendezvous between hosts (hello_net.c), for hello.c.
 */
#ifndef SDP_HELLO_NET_H
#define SDP_HELLO_NET_H

#include "sdp/conn.h"
#include "sdp/proto.h"

/* Listener fd may serve clients of other hosts: the network rendezvous
 * socket (listening on the port plus ofi_port_offset), or -1. */
int sdp_net_listen(int fd, enum fab_pref pref);
/* Read one hello from an accepted network rendezvous socket s without
 * blocking: 1 (h filled, h->nfds = 1: the socket goes with it), 0 (not all
 * there yet), -1 (bad or gone: close s). */
int sdp_net_take(int s, struct sdp_hello *h);
/* sdp_hello_connect for a destination that only a remote provider (ops)
 * reaches. */
struct sdp_conn *sdp_net_connect(int fd, const struct sockaddr *dst, socklen_t len,
				 const struct fab_ops *ops, struct sdp_connect_state *cs);

#endif
