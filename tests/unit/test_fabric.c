/*
 * test_fabric.c - the fabric registry (src/fabric/fabric.c): which
 * provider fab_choose() gives for a peer address and a policy preference,
 * fab_by_id() for a hello's provider id, fab_fits() for a ring geometry,
 * and the preference names the policy parser uses.
 * Exit status 0 when every check passes, 1 otherwise.
 */
#include "fabric/fabric.h"
#include "fabric/shm_layout.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>

static int failures, checks;

#define CHECK(cond) do {						\
	checks++;							\
	if (!(cond)) {							\
		failures++;						\
		fprintf(stderr, "%s:%d: check failed: %s\n",		\
			__FILE__, __LINE__, #cond);			\
	}								\
} while (0)

static const struct fab_ops *choose4(const char *ip, enum fab_pref pref)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(80) };
	inet_pton(AF_INET, ip, &a.sin_addr);
	return fab_choose((struct sockaddr *)&a, sizeof a, pref);
}

static const struct fab_ops *choose6(const char *ip, enum fab_pref pref)
{
	struct sockaddr_in6 a = { .sin6_family = AF_INET6, .sin6_port = htons(80) };
	inet_pton(AF_INET6, ip, &a.sin6_addr);
	return fab_choose((struct sockaddr *)&a, sizeof a, pref);
}

int main(void)
{
	struct fab_params p = { .region_cache = 8 };
	fab_init(&p);
	const struct fab_ops *shm = &fab_shm_ops;

	/* shm reaches this host: loopback, v4-mapped loopback, ::1 */
	CHECK(choose4("127.0.0.1", FAB_PREF_ANY) == shm);
	CHECK(choose4("127.1.2.3", FAB_PREF_SHM) == shm);
	CHECK(choose6("::1", FAB_PREF_ANY) == shm);
	CHECK(choose6("::ffff:127.0.0.1", FAB_PREF_ANY) == shm);
	/* ... not another host (TEST-NET addresses are never configured) */
	CHECK(choose4("192.0.2.1", FAB_PREF_ANY) == NULL);
	CHECK(choose6("2001:db8::1", FAB_PREF_ANY) == NULL);
	/* a preference no provider meets, or plain TCP: none */
	CHECK(choose4("127.0.0.1", FAB_PREF_OFI) == NULL);
	CHECK(choose4("127.0.0.1", FAB_PREF_TCP) == NULL);
	CHECK(fab_choose(NULL, 0, FAB_PREF_ANY) == NULL);
	struct sockaddr un = { .sa_family = AF_UNIX };
	CHECK(fab_choose(&un, sizeof un, FAB_PREF_ANY) == NULL);

	/* the ids a hello may carry */
	CHECK(fab_by_id(FAB_ID_SHM) == shm);
	CHECK(fab_by_id(0) == NULL);
	CHECK(fab_by_id(0xEE) == NULL);

	/* geometry: what a peer can map */
	CHECK(fab_fits(64, 32768));
	CHECK(fab_fits(4096, 1u << 20));
	CHECK(!fab_fits(4096, 4u << 20));

	/* the policy's names */
	enum fab_pref f;
	CHECK(fab_pref_parse("shm", &f) == 0 && f == FAB_PREF_SHM);
	CHECK(fab_pref_parse("ofi", &f) == 0 && f == FAB_PREF_OFI);
	CHECK(fab_pref_parse("tcp", &f) == 0 && f == FAB_PREF_TCP);
	CHECK(fab_pref_parse("any", &f) == 0 && f == FAB_PREF_ANY);
	CHECK(fab_pref_parse("rdma", &f) < 0);
	CHECK(fab_pref_parse("", &f) < 0);
	CHECK(!strcmp(fab_pref_name(FAB_PREF_SHM), "shm"));

	/* every provider fills its whole table (a NULL entry would crash the
	 * engine at its first use) */
	const void *const *op = (const void *const *)((const char *)shm +
						      offsetof(struct fab_ops, init));
	size_t n = (sizeof(struct fab_ops) - offsetof(struct fab_ops, init)) / sizeof(void *);
	for (size_t i = 0; i < n; i++)
		CHECK(op[i] != NULL);

	printf("test_fabric: %d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
