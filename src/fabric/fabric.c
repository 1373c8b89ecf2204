/*
 * fabric.c - the registry of providers: which one carries a connection.
 *
 * The engine never names a provider. At set-up it asks fab_choose() for
 * the provider able to reach the peer's address, as the policy prefers
 * (a policy rule may force one: "use sdp client * 10.0.0.0/8:* ofi"), and
 * the accepting side finds the one the hello names with fab_by_id(). The
 * table below is in order of preference: the first provider that reaches
 * the peer is chosen: the shared-memory provider for the processes of
 * this host, then (built where libfabric's headers were found, used where
 * libfabric.so.1 loads) the ofi provider for hosts on a fabric's network.
 */
#include <stddef.h>

#include "fabric/fabric.h"
#include "fabric/shm_layout.h"
#ifdef SDP_HAVE_OFI
extern const struct fab_ops fab_ofi_ops;
#endif

__thread int fab_private;

static const struct {
	const struct fab_ops *ops;
	enum fab_pref pref;               /* the policy name that forces it */
} providers[] = {
	{ &fab_shm_ops, FAB_PREF_SHM },
#ifdef SDP_HAVE_OFI
	{ &fab_ofi_ops, FAB_PREF_OFI },
#endif
};
#define NPROV (sizeof providers / sizeof providers[0])

#ifndef SDP_HAVE_OFI
/* Built without the ofi provider: no provider ever holds sends, so every
 * sleep keeps its own timeout (fabric.h). */
int fab_held_ms(int ms)
{
	return ms;
}

void fab_held_push(void)
{
}
#endif

void fab_init(const struct fab_params *p)
{
	for (size_t i = 0; i < NPROV; i++)
		providers[i].ops->init(p);
}

const struct fab_ops *fab_choose(const struct sockaddr *peer, socklen_t len,
				 enum fab_pref pref)
{
	if (pref == FAB_PREF_TCP || !peer)
		return NULL;
	for (size_t i = 0; i < NPROV; i++) {
		if (pref != FAB_PREF_ANY && providers[i].pref != pref)
			continue;
		if (providers[i].ops->reaches(peer, len))
			return providers[i].ops;
	}
	return NULL;                          /* none: plain TCP */
}

bool fab_fits(uint32_t nslots, uint32_t slot_size)
{
	for (size_t i = 0; i < NPROV; i++)
		if (!providers[i].ops->fits(nslots, slot_size))
			return false;
	return true;
}

const struct fab_ops *fab_by_id(unsigned id)
{
	for (size_t i = 0; i < NPROV; i++)
		if (providers[i].ops->id == id)
			return providers[i].ops;
	return NULL;
}

const struct fab_ops *fab_remote(void)
{
	for (size_t i = 0; i < NPROV; i++)
		if (providers[i].ops->traits & FAB_T_REMOTE)
			return providers[i].ops;
	return NULL;
}
