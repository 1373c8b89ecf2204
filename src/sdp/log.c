/*
 * log.c - the library's diagnostics (log.h): one line per message on
 * stderr, written with the raw system call so that logging never enters
 * the switch (stderr may itself be a socket the switch watches); and the
 * reason a socket stays on TCP, kept per thread until the switch logs it.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "sdp/log.h"

int sdp_log_level;

void sdp_logf(const char *fmt, ...)
{
	char buf[1024];
	int n = snprintf(buf, sizeof buf, "sdp[%d]: ", (int)getpid());
	va_list ap;
	va_start(ap, fmt);
	n += vsnprintf(buf + n, sizeof buf - (size_t)n - 1, fmt, ap);
	va_end(ap);
	if (n > (int)sizeof buf - 2)
		n = (int)sizeof buf - 2;
	buf[n++] = '\n';
	ssize_t w = syscall(SYS_write, 2, buf, (size_t)n);
	(void)w;
}

/* sdp_log for code that has no access to the level (providers, through
 * struct fab_params). */
void sdp_log_at(int level, const char *fmt, ...)
{
	if (level > sdp_log_level)
		return;
	char buf[900];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	sdp_logf("%s", buf);
}

static __thread char why_buf[200];

void sdp_whyf(const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(why_buf, sizeof why_buf, fmt, ap);
	va_end(ap);
}

const char *sdp_why_take(void)
{
	static __thread char taken[sizeof why_buf];
	if (!why_buf[0])
		return NULL;
	memcpy(taken, why_buf, sizeof taken);
	why_buf[0] = 0;
	return taken;
}
