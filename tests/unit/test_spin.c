/*
 * test_spin.c - the runnable count a spin reads from /proc/loadavg to
 * tell whether more tasks want the CPUs than there are (spin.c: a yield
 * that ran nothing then ends the spin). Real lines of Linux's format, and
 * lines that must give "unknown" (-1) so that a host with another format
 * never stops a spin on a misread number. Also this host's own file, when
 * it has one: its count is at least 1 (the reader itself).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "sdp/spin.h"

static int fails;
#define CHECK(c, ...) do { if (!(c)) { fprintf(stderr, __VA_ARGS__); fputc('\n', stderr); \
	fails++; } } while (0)

int main(void)
{
	static const struct { const char *line; int want; } cases[] = {
		{ "0.52 0.58 0.59 3/765 4242\n", 3 },
		{ "12.00 8.31 4.02 17/2048 99999\n", 17 },
		{ "0.00 0.00 0.00 1/1 1", 1 },
		{ "0.00 0.00 0.00 0/64 7\n", 0 },
		{ "0.52 0.58 0.59 3765 4242\n", -1 },   /* no '/' */
		{ "0.52 0.58 3/765 4242\n", -1 },       /* a field missing */
		{ "0.52 0.58 0.59 /765 4242\n", -1 },   /* no digits */
		{ "0.52  0.58 0.59 3/765\n", -1 },      /* two spaces */
		{ "", -1 },
		{ "garbage", -1 },
	};
	for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
		int got = sdp_loadavg_runnable(cases[i].line);
		CHECK(got == cases[i].want, "\"%s\": %d, expected %d", cases[i].line, got,
		      cases[i].want);
	}
	int fd = open("/proc/loadavg", O_RDONLY);
	if (fd >= 0) {
		char buf[128];
		ssize_t r = read(fd, buf, sizeof buf - 1);
		close(fd);
		CHECK(r > 0, "/proc/loadavg: nothing read");
		if (r > 0) {
			buf[r] = 0;
			int n = sdp_loadavg_runnable(buf);
			CHECK(n >= 1, "/proc/loadavg \"%s\": runnable %d (the reader runs)", buf, n);
		}
	}
	if (fails)
		return 1;
	printf("test_spin: loadavg lines parsed as expected\n");
	return 0;
}
