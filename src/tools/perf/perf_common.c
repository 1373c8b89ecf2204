/*
 * perf_common.c - helpers shared by the load generators.
 */
#include "perf_common.h"

#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void ru_split(const struct rusage *ru, double *user, double *sys)
{
	*user = (double)ru->ru_utime.tv_sec + (double)ru->ru_utime.tv_usec / 1e6;
	*sys = (double)ru->ru_stime.tv_sec + (double)ru->ru_stime.tv_usec / 1e6;
}

void cpu_self(double *user, double *sys)
{
	struct rusage ru;
	getrusage(RUSAGE_SELF, &ru);
	ru_split(&ru, user, sys);
}

void cpu_children(double *user, double *sys)
{
	struct rusage ru;
	getrusage(RUSAGE_CHILDREN, &ru);
	ru_split(&ru, user, sys);
}

void busy_us(uint32_t us)
{
	if (!us)
		return;
	uint64_t end = now_ns() + (uint64_t)us * 1000ull;
	volatile uint64_t x = 0;
	while (now_ns() < end) {
		for (int i = 0; i < 64; i++)
			x += (uint64_t)i;
	}
}

uint64_t parse_size(const char *s)
{
	char *end = NULL;
	double v = strtod(s, &end);
	if (end == s || v < 0)
		return 0;
	uint64_t mul = 1;
	switch (toupper((unsigned char)*end)) {
	case 'K': mul = 1024ull; end++; break;
	case 'M': mul = 1024ull * 1024; end++; break;
	case 'G': mul = 1024ull * 1024 * 1024; end++; break;
	default: break;
	}
	if (*end == 'i' || *end == 'I')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return 0;
	return (uint64_t)(v * (double)mul);
}

static int cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;
	return (x > y) - (x < y);
}

void sort_doubles(double *v, size_t n)
{
	qsort(v, n, sizeof(*v), cmp_double);
}

double percentile_sorted(const double *v, size_t n, double p)
{
	if (!n)
		return NAN;
	if (n == 1)
		return v[0];
	double rank = p / 100.0 * (double)(n - 1);
	size_t lo = (size_t)floor(rank);
	size_t hi = lo + 1 < n ? lo + 1 : lo;
	double frac = rank - (double)lo;
	return v[lo] + (v[hi] - v[lo]) * frac;
}

static void jw_put(struct jw *j, const char *fmt, ...)
{
	va_list ap;
	if (j->len >= sizeof(j->buf))
		return;
	va_start(ap, fmt);
	int n = vsnprintf(j->buf + j->len, sizeof(j->buf) - j->len, fmt, ap);
	va_end(ap);
	if (n > 0)
		j->len += (size_t)n;
	if (j->len > sizeof(j->buf) - 1)
		j->len = sizeof(j->buf) - 1;
}

void jw_begin(struct jw *j)
{
	j->len = 0;
	j->first = 1;
	jw_put(j, "{");
}

void jw_key(struct jw *j, const char *k)
{
	if (!j->first)
		jw_put(j, ",");
	j->first = 0;
	jw_put(j, "\"%s\":", k);
}

void jw_str(struct jw *j, const char *k, const char *v)
{
	jw_key(j, k);
	jw_put(j, "\"");
	for (const char *p = v; *p; p++) {
		if (*p == '"' || *p == '\\')
			jw_put(j, "\\%c", *p);
		else if ((unsigned char)*p < 0x20)
			jw_put(j, "\\u%04x", (unsigned char)*p);
		else
			jw_put(j, "%c", *p);
	}
	jw_put(j, "\"");
}

void jw_num(struct jw *j, const char *k, double v)
{
	jw_key(j, k);
	if (isnan(v) || isinf(v))
		jw_put(j, "null");
	else
		jw_put(j, "%.9g", v);
}

void jw_int(struct jw *j, const char *k, int64_t v)
{
	jw_key(j, k);
	jw_put(j, "%lld", (long long)v);
}

void jw_raw(struct jw *j, const char *k, const char *raw)
{
	jw_key(j, k);
	jw_put(j, "%s", raw);
}

void jw_obj_begin(struct jw *j, const char *k)
{
	jw_key(j, k);
	jw_put(j, "{");
	j->first = 1;
}

void jw_obj_end(struct jw *j)
{
	jw_put(j, "}");
	j->first = 0;
}

void jw_end_print(struct jw *j, FILE *f)
{
	jw_put(j, "}");
	fprintf(f, "%.*s\n", (int)j->len, j->buf);
	fflush(f);
}
