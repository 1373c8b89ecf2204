/*
 * pool.h - layout of a process's connection pool, shared with `sdp stat`.
 *
 * The pool is one memfd named "sdp-pool" per process image, mapped
 * MAP_SHARED so forked children share it. `sdp stat` finds it through
 * /proc/PID/fd and maps it read-only.
 */
#ifndef SDP_POOL_H
#define SDP_POOL_H

#include "sdp/conn.h"

#define SDP_POOL_MAGIC    0x5344504cu     /* "SDPL" */
#define SDP_POOL_VERSION  3
#define SDP_POOL_NAME     "sdp-pool"
#define SDP_POOL_PROCS    256
#define SDP_POOL_CONNS    16384

struct sdp_proc {                  /* one per process using the pool */
	_Atomic int32_t pid;           /* 0 = free */
	char     comm[20];
	_Atomic uint64_t sdp_conns;    /* connections that went over SDP */
	_Atomic uint64_t tcp_conns;    /* stream connections left on TCP */
	_Atomic uint64_t tx_bytes;     /* SDP stream bytes sent */
	_Atomic uint64_t rx_bytes;
	/* connection memory (fabric/shm_region.c): [0] regions we created
	 * as the connecting side, [1] regions we mapped as the accepting
	 * side; "reused" of them came from an earlier connection */
	_Atomic uint64_t regions[2];
	_Atomic uint64_t regions_reused[2];
	/* of the SDP connections and bytes above, those a network fabric
	 * carried (FAB_T_REMOTE: ofi), not shared memory; TCP: none */
	_Atomic uint64_t net_conns;
	_Atomic uint64_t net_tx_bytes;
	_Atomic uint64_t net_rx_bytes;
};

struct sdp_pool_hdr {
	uint32_t magic;
	uint32_t version;
	uint32_t nprocs;               /* SDP_POOL_PROCS */
	uint32_t nconns;               /* SDP_POOL_CONNS */
	uint32_t conn_size;            /* sizeof(struct sdp_conn) */
	uint32_t procs_off;            /* offset of struct sdp_proc[nprocs] */
	uint32_t conns_off;            /* offset of struct sdp_conn[nconns] */
	_Atomic uint32_t hint;         /* next slot to try when the process has
					* none it freed: after the one taken last */
};

static inline size_t sdp_pool_size(void)
{
	size_t procs = 4096;
	size_t conns = procs + ((SDP_POOL_PROCS * sizeof(struct sdp_proc) + 4095) & ~4095ul);
	return conns + (size_t)SDP_POOL_CONNS * sizeof(struct sdp_conn);
}

#endif
