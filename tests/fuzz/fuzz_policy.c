/*
 * fuzz_policy.c - the policy file parser (src/switch/policy.c) on any text:
 * parse, then match a few sockets against the rules and read the settings.
 * Invariants: no crash, no leak (ASan), every reported line is
 * "NAME:LINE: reason" with a line number within the text, and matching
 * returns one of the three answers.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "switch/policy.h"

struct errs {
	unsigned long lines;           /* lines in the text */
	int n;
};

static void on_err(const char *msg, void *arg)
{
	struct errs *e = arg;
	const char *p = strchr(msg, ':');
	unsigned long line = p ? strtoul(p + 1, NULL, 10) : 0;
	if (strncmp(msg, "fuzz:", 5) || line == 0 || line > e->lines) {
		fprintf(stderr, "bad report: %s (text has %lu lines)\n", msg, e->lines);
		abort();
	}
	e->n++;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char *text = malloc(size + 1);
	if (!text)
		return 0;
	memcpy(text, data, size);
	text[size] = 0;
	size_t len = strlen(text);     /* the API takes a C string */
	struct errs e = { 1, 0 };
	for (size_t i = 0; i < len; i++)
		if (text[i] == '\n' && i + 1 < len)
			e.lines++;
	struct sdp_policy *p = sdp_policy_parse(text, "fuzz", on_err, &e);
	if (p) {
		struct sockaddr_in in = { .sin_family = AF_INET, .sin_port = htons(80) };
		inet_pton(AF_INET, "127.0.0.1", &in.sin_addr);
		struct sockaddr_in6 in6 = { .sin6_family = AF_INET6, .sin6_port = htons(6379) };
		inet_pton(AF_INET6, "::ffff:10.1.2.3", &in6.sin6_addr);
		struct sockaddr_in6 lo6 = { .sin6_family = AF_INET6, .sin6_port = htons(1) };
		lo6.sin6_addr = in6addr_loopback;
		const char *progs[] = { "", "nginx", "redis-server", "a*b" };
		for (int r = SDP_ROLE_SERVER; r <= SDP_ROLE_CLIENT; r++)
			for (int i = 0; i < 4; i++) {
				enum sdp_use u[3] = {
					sdp_policy_match(p, r, progs[i], (void *)&in, sizeof in),
					sdp_policy_match(p, r, progs[i], (void *)&in6, sizeof in6),
					sdp_policy_match(p, r, progs[i], (void *)&lo6, sizeof lo6),
				};
				for (int k = 0; k < 3; k++)
					if (u[k] != SDP_USE_TCP && u[k] != SDP_USE_SDP &&
					    u[k] != SDP_USE_BOTH)
						abort();
			}
		const char *v = NULL;
		const char *names[] = { "spin_us", "zcopy_thresh", "nslots", "x" };
		for (int i = 0; i < 4; i++)
			if (sdp_policy_setting(p, names[i], &v) == 0 && !v)
				abort();
		if (sdp_policy_nrules(p) < 0)
			abort();
		sdp_policy_free(p);
	}
	free(text);
	return 0;
}
