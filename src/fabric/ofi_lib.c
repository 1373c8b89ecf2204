/*
 * ofi_lib.c - the ofi provider's link to libfabric: loading it, choosing
 * one of its providers, and the per-address fabric objects.
 *
 * libsdp does not link against libfabric: it is opened with dlopen the
 * first time a connection might use it, so libsdp loads and works (shm and
 * TCP) where libfabric is not installed. libfabric's calls to socket,
 * connect, poll, close ... still come through the switch (RTLD_DEEPBIND
 * would avoid that, but gives libfabric libc's malloc beside an
 * application's own - jemalloc in redis - and a free of the other's
 * memory aborts): every call of the provider into libfabric that may make
 * a socket runs with fab_private raised, and the switch leaves such
 * sockets alone (FDK_NONE).
 *
 * A libfabric provider is usable when it offers FI_EP_MSG endpoints with
 * FI_MSG and FI_RMA (verbs, tcp, sockets; efa offers only reliable
 * datagrams, FI_EP_RDM, and is not); its memory-registration modes
 * (FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_ALLOCATED, FI_MR_PROV_KEY) and
 * FI_CONTEXT are taken as fi_getinfo reports them. Which hosts the fabric
 * reaches: those on the networks its fabrics are named after (the tcp
 * provider names a fabric after an interface's subnet, "10.0.0.0/24").
 *
 * This file is also linked into the `sdp` tool (ofi_list_providers).
 */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <time.h>
#include <sys/epoll.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "fabric/ofi.h"

struct ofi_lib ofi_fi;
/* The tool links this file alone; the library's definition is fabric.c's. */
__attribute__((weak)) __thread int fab_private;
struct ofi_proc ofi_p = { .lock = PTHREAD_MUTEX_INITIALIZER,
			  .bklock = PTHREAD_MUTEX_INITIALIZER };

#define OFI_API FI_VERSION(1, 9)

uint64_t ofi_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static bool lib_open(void)
{
	if (ofi_fi.h)
		return true;
	fab_private++;
	void *h = dlopen("libfabric.so.1", RTLD_NOW | RTLD_LOCAL);
	fab_private--;
	if (!h)
		return false;
	ofi_fi.getinfo = (void *)dlsym(h, "fi_getinfo");
	ofi_fi.freeinfo = (void *)dlsym(h, "fi_freeinfo");
	ofi_fi.dupinfo = (void *)dlsym(h, "fi_dupinfo");
	ofi_fi.fabric = (void *)dlsym(h, "fi_fabric");
	ofi_fi.strerror = (void *)dlsym(h, "fi_strerror");
	if (!ofi_fi.getinfo || !ofi_fi.freeinfo || !ofi_fi.dupinfo || !ofi_fi.fabric ||
	    !ofi_fi.strerror) {
		dlclose(h);
		return false;
	}
	ofi_fi.h = h;
	return true;
}

/* Utility providers that only layer on others (ofi_rxm ...), and
 * providers that never leave the host. */
static bool skip_prov(const char *name)
{
	return !strncmp(name, "ofi_", 4) || !strcmp(name, "shm") || !strcmp(name, "udp");
}

/* The hints SDP asks with: FI_EP_MSG, FI_MSG + FI_RMA, every MR mode and
 * FI_CONTEXT we can honour. */
static struct fi_info *hints(const char *prov)
{
	struct fi_info *h = ofi_fi.dupinfo(NULL);
	if (!h)
		return NULL;
	h->caps = FI_MSG | FI_RMA;
	h->mode = FI_CONTEXT;
	h->ep_attr->type = FI_EP_MSG;
	h->domain_attr->mr_mode = FI_MR_LOCAL | FI_MR_VIRT_ADDR | FI_MR_ALLOCATED |
				  FI_MR_PROV_KEY;
	h->domain_attr->threading = FI_THREAD_SAFE;
	h->tx_attr->msg_order = FI_ORDER_SAS | FI_ORDER_WAS | FI_ORDER_SAW | FI_ORDER_WAW;
	h->rx_attr->msg_order = FI_ORDER_SAS | FI_ORDER_WAS | FI_ORDER_SAW | FI_ORDER_WAW;
	if (prov)
		h->fabric_attr->prov_name = strdup(prov);
	return h;
}

static int list_providers(struct fab_prov_info *out, int max);

int fab_list_libfabric(struct fab_prov_info *out, int max)
{
	fab_private++;
	int n = list_providers(out, max);
	fab_private--;
	return n;
}

static void mr_names(uint64_t m, char *out, size_t n)
{
	static const struct { uint64_t bit; const char *name; } names[] = {
		{ FI_MR_LOCAL, "FI_MR_LOCAL" }, { FI_MR_VIRT_ADDR, "FI_MR_VIRT_ADDR" },
		{ FI_MR_ALLOCATED, "FI_MR_ALLOCATED" }, { FI_MR_PROV_KEY, "FI_MR_PROV_KEY" },
		{ FI_MR_ENDPOINT, "FI_MR_ENDPOINT" }, { FI_MR_RAW, "FI_MR_RAW" },
	};
	size_t k = 0;
	out[0] = 0;
	for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
		if ((m & names[i].bit) && k < n)
			k += (size_t)snprintf(out + k, n - k, "%s\"%s\"", k ? ", " : "",
					      names[i].name);
}

static int list_providers(struct fab_prov_info *out, int max)
{
	if (!lib_open())
		return -1;
	struct fi_info *all = NULL;
	if (ofi_fi.getinfo(OFI_API, NULL, NULL, 0, NULL, &all) != 0 || !all)
		return 0;
	int n = 0;
	for (struct fi_info *i = all; i && n < max; i = i->next) {
		const char *pn = i->fabric_attr->prov_name;
		bool dup = false;
		for (int k = 0; k < n; k++)
			if (!strcmp(out[k].name, pn) && !strcmp(out[k].fabric, i->fabric_attr->name))
				dup = true;
		if (dup)
			continue;
		/* One line per provider and fabric: does any of its entries
		 * have what SDP needs? */
		struct fab_prov_info *p = &out[n];
		uint64_t mm = 0;
		memset(p, 0, sizeof *p);
		snprintf(p->name, sizeof p->name, "%s", pn);
		snprintf(p->fabric, sizeof p->fabric, "%s", i->fabric_attr->name);
		snprintf(p->domain, sizeof p->domain, "%s",
			 i->domain_attr->name ? i->domain_attr->name : "");
		for (struct fi_info *j = all; j; j = j->next) {
			if (strcmp(j->fabric_attr->prov_name, pn) ||
			    strcmp(j->fabric_attr->name, i->fabric_attr->name))
				continue;
			if (j->ep_attr->type == FI_EP_MSG) {
				p->msg_ep = true;
				p->msg |= (j->caps & FI_MSG) != 0;
				p->rma |= (j->caps & FI_RMA) != 0;
				mm |= (uint64_t)j->domain_attr->mr_mode;
			}
		}
		mr_names(mm, p->mr_mode, sizeof p->mr_mode);
		p->usable = p->msg_ep && p->msg && p->rma && !skip_prov(pn);
		if (!p->msg_ep)
			snprintf(p->why, sizeof p->why, "no FI_EP_MSG endpoints");
		else if (!p->msg || !p->rma)
			snprintf(p->why, sizeof p->why, "FI_EP_MSG without %s",
				 !p->msg ? "FI_MSG" : "FI_RMA");
		else if (skip_prov(pn))
			snprintf(p->why, sizeof p->why, "a utility or host-local provider");
		n++;
	}
	ofi_fi.freeinfo(all);
	return n;
}

/* "10.0.0.0/24" -> family, address bytes and prefix length. */
static int parse_net(const char *s, uint8_t a[16], int *bits)
{
	char buf[64];
	snprintf(buf, sizeof buf, "%s", s);
	char *slash = strchr(buf, '/');
	if (!slash)
		return 0;
	*slash = 0;
	*bits = atoi(slash + 1);
	if (inet_pton(AF_INET, buf, a) == 1)
		return *bits >= 0 && *bits <= 32 ? AF_INET : 0;
	if (inet_pton(AF_INET6, buf, a) == 1)
		return *bits >= 0 && *bits <= 128 ? AF_INET6 : 0;
	return 0;
}

static int addr_bytes(const struct sockaddr *sa, socklen_t len, uint8_t a[16])
{
	if (sa->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
		memcpy(a, &((const struct sockaddr_in *)(const void *)sa)->sin_addr, 4);
		return AF_INET;
	}
	if (sa->sa_family == AF_INET6 && len >= sizeof(struct sockaddr_in6)) {
		const struct in6_addr *i6 =
			&((const struct sockaddr_in6 *)(const void *)sa)->sin6_addr;
		if (IN6_IS_ADDR_V4MAPPED(i6)) {
			memcpy(a, &i6->s6_addr[12], 4);
			return AF_INET;
		}
		memcpy(a, i6, 16);
		return AF_INET6;
	}
	return 0;
}

/*
 * Is peer on a network one of this host's interfaces (up, not loopback)
 * is directly on? A fabric's networks are its interfaces' (ofi_in_nets
 * compares with them), so a peer elsewhere - behind a router, on the
 * internet - is TCP's without asking libfabric, whose loading runs every
 * provider's start-up: about 0.3 s of CPU in each process, which a plain
 * TCP connect to a remote host would otherwise wait for. When the
 * interfaces cannot be listed: true (libfabric decides).
 */
bool ofi_on_local_net(const struct sockaddr *peer, socklen_t len)
{
	uint8_t a[16];
	int fam = addr_bytes(peer, len, a);
	if (!fam)
		return false;
	struct ifaddrs *ifs;
	if (getifaddrs(&ifs) < 0)
		return true;
	bool on = false;
	for (struct ifaddrs *i = ifs; i && !on; i = i->ifa_next) {
		uint8_t ia[16], im[16];
		if (!i->ifa_addr || !i->ifa_netmask || !(i->ifa_flags & IFF_UP) ||
		    (i->ifa_flags & IFF_LOOPBACK))
			continue;
		socklen_t sl = i->ifa_addr->sa_family == AF_INET6 ? sizeof(struct sockaddr_in6) :
								   sizeof(struct sockaddr_in);
		if (addr_bytes(i->ifa_addr, sl, ia) != fam ||
		    addr_bytes(i->ifa_netmask, sl, im) != fam)
			continue;
		on = true;
		for (int b = 0; b < (fam == AF_INET ? 4 : 16) && on; b++)
			on = ((a[b] ^ ia[b]) & im[b]) == 0;
	}
	freeifaddrs(ifs);
	return on;
}

bool ofi_in_nets(const struct sockaddr *peer, socklen_t len)
{
	uint8_t a[16];
	int fam = addr_bytes(peer, len, a);
	if (!fam)
		return false;
	for (int i = 0; i < ofi_p.nnets; i++) {
		uint8_t n[16];
		int bits;
		if (parse_net(ofi_p.nets[i], n, &bits) != fam)
			continue;
		if (fam == AF_INET && a[0] == 127)
			continue;             /* the host's own: shm's */
		bool same = true;
		for (int b = 0; b < bits && same; b++)
			same = ((a[b / 8] ^ n[b / 8]) & (0x80 >> (b % 8))) == 0;
		if (same)
			return true;
	}
	return false;
}

/* Once per process (under ofi_p.lock): load libfabric, pick the first
 * usable provider (or the one asked for), note its networks. */
bool ofi_load(void)
{
	if (ofi_p.tried)
		return ofi_p.ok;
	ofi_p.tried = true;
	if (!lib_open()) {
		OFI_LOG(2, "ofi: libfabric.so.1 not found: no fabric between hosts");
		return false;
	}
	struct fi_info *h = hints(ofi_p.want), *all = NULL;
	if (!h)
		return false;
	int r = ofi_fi.getinfo(OFI_API, NULL, NULL, 0, h, &all);
	ofi_fi.freeinfo(h);
	if (r || !all) {
		OFI_LOG(2, "ofi: no libfabric provider with FI_EP_MSG, FI_MSG and FI_RMA%s%s",
			ofi_p.want ? " named " : "", ofi_p.want ? ofi_p.want : "");
		return false;
	}
	const char *chosen = NULL;
	for (struct fi_info *i = all; i; i = i->next) {
		const char *pn = i->fabric_attr->prov_name;
		if (skip_prov(pn))
			continue;
		if (!chosen)
			chosen = pn;
		if (strcmp(pn, chosen))
			continue;
		if (ofi_p.nnets < 16 && i->fabric_attr->name)
			snprintf(ofi_p.nets[ofi_p.nnets++], sizeof ofi_p.nets[0], "%s",
				 i->fabric_attr->name);
	}
	if (chosen) {
		snprintf(ofi_p.prov, sizeof ofi_p.prov, "%s", chosen);
		snprintf(ofi_p.label, sizeof ofi_p.label, "ofi:%s", chosen);
		ofi_p.ok = true;
		OFI_LOG(2, "ofi: libfabric provider %s, %d network(s)", chosen, ofi_p.nnets);
	}
	ofi_fi.freeinfo(all);
	return ofi_p.ok;
}

/* The fabric objects for connections of local address `local` (under
 * ofi_p.lock): fi_getinfo with that source address finds the domain
 * (for verbs: the device that owns the address). */
struct ofi_dom *ofi_dom_for(const struct sockaddr *local, socklen_t len)
{
	uint8_t a[16];
	int fam = addr_bytes(local, len, a);
	if (!fam || !ofi_load())
		return NULL;
	for (int i = 0; i < OFI_MAX_DOMAINS; i++) {
		struct ofi_dom *d = &ofi_p.dom[i];
		uint8_t b[16];
		if (d->used && addr_bytes(&d->ip.sa, sizeof d->ip, b) == fam &&
		    !memcmp(a, b, fam == AF_INET ? 4 : 16))
			return d;
	}
	struct ofi_dom *d = NULL;
	for (int i = 0; i < OFI_MAX_DOMAINS && !d; i++)
		if (!ofi_p.dom[i].used)
			d = &ofi_p.dom[i];
	if (!d)
		return NULL;
	memset(d, 0, sizeof *d);
	d->eq_fd = -1;
	if (fam == AF_INET) {
		d->ip.in.sin_family = AF_INET;
		memcpy(&d->ip.in.sin_addr, a, 4);
	} else {
		d->ip.in6.sin6_family = AF_INET6;
		memcpy(&d->ip.in6.sin6_addr, a, 16);
	}
	struct fi_info *h = hints(ofi_p.prov);
	if (!h)
		return NULL;
	h->addr_format = fam == AF_INET ? FI_SOCKADDR_IN : FI_SOCKADDR_IN6;
	h->src_addrlen = fam == AF_INET ? sizeof d->ip.in : sizeof d->ip.in6;
	h->src_addr = malloc(h->src_addrlen);
	if (!h->src_addr) {
		ofi_fi.freeinfo(h);
		return NULL;
	}
	memcpy(h->src_addr, &d->ip, h->src_addrlen);
	struct fi_info *info = NULL;
	int r = ofi_fi.getinfo(OFI_API, NULL, NULL, 0, h, &info);
	ofi_fi.freeinfo(h);
	if (r || !info) {
		OFI_LOG(1, "ofi: no %s domain for this local address (%s)", ofi_p.prov,
			r ? ofi_fi.strerror(-r) : "none");
		return NULL;
	}
	struct fid_fabric *fab = NULL;
	struct fid_domain *dom = NULL;
	struct fid_eq *eq = NULL;
	struct fi_eq_attr ea = { .size = 256, .wait_obj = FI_WAIT_FD };
	if ((r = ofi_fi.fabric(info->fabric_attr, &fab, NULL)) ||
	    (r = fi_domain(fab, info, &dom, NULL)) ||
	    (r = fi_eq_open(fab, &ea, &eq, NULL)) ||
	    (r = fi_control(&eq->fid, FI_GETWAIT, &d->eq_fd))) {
		OFI_LOG(1, "ofi: cannot open the %s fabric: %s", ofi_p.prov,
			ofi_fi.strerror(-r));
		if (eq)
			fi_close(&eq->fid);
		if (dom)
			fi_close(&dom->fid);
		if (fab)
			fi_close(&fab->fid);
		ofi_fi.freeinfo(info);
		return NULL;
	}
	d->info = info;
	d->fabric = fab;
	d->domain = dom;
	d->eq = eq;
	d->mr_mode = (uint64_t)info->domain_attr->mr_mode;
	d->mode = info->mode;
	d->inject = info->tx_attr->inject_size;
	d->txq = info->tx_attr->size;
	d->rxq = info->rx_attr->size;
	d->key_bytes = (uint8_t)info->domain_attr->mr_key_size;
	d->used = true;
	ofi_dom_added(d);
	return d;
}

/* ---- the process's connections (EQ events name them) ----------------------- */

/* A new domain's connection events wake the connections still setting
 * up (those that are up have their own completion queue to wait on). */
void ofi_dom_added(struct ofi_dom *d)
{
	for (int i = 0; i < ofi_p.nconns; i++) {
		struct epoll_event ev = { .events = EPOLLIN, .data.fd = d->eq_fd };
		if (ofi_p.conns[i]->eqs_in_wfd)
			syscall(SYS_epoll_ctl, ofi_p.conns[i]->wfd, EPOLL_CTL_ADD, d->eq_fd,
				&ev);
	}
}

void ofi_conn_add(struct ofi_conn *oc)
{
	if (ofi_p.nconns == ofi_p.capconns) {
		int nc = ofi_p.capconns ? ofi_p.capconns * 2 : 32;
		struct ofi_conn **v = realloc(ofi_p.conns, (size_t)nc * sizeof *v);
		if (!v)
			return;
		ofi_p.conns = v;
		ofi_p.capconns = nc;
	}
	ofi_p.conns[ofi_p.nconns++] = oc;
}

void ofi_conn_del(struct ofi_conn *oc)
{
	for (int i = 0; i < ofi_p.nconns; i++)
		if (ofi_p.conns[i] == oc) {
			ofi_p.conns[i] = ofi_p.conns[--ofi_p.nconns];
			return;
		}
}

bool ofi_conn_live(struct ofi_conn *oc)
{
	for (int i = 0; i < ofi_p.nconns; i++)
		if (ofi_p.conns[i] == oc)
			return true;
	return false;
}
