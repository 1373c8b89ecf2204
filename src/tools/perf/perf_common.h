/*
 * perf_common.h - small helpers shared by sdp-perf and sdp-rawbench:
 * clocks, CPU accounting, percentiles, size parsing and a tiny JSON writer.
 */
#ifndef PERF_COMMON_H
#define PERF_COMMON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Monotonic clock in nanoseconds (system wide, comparable across processes). */
uint64_t now_ns(void);

/* CPU seconds (user, system) of this process, all threads. */
void cpu_self(double *user, double *sys);
/* CPU seconds (user, system) of reaped children. */
void cpu_children(double *user, double *sys);

/* Busy loop (no syscalls) for the given number of microseconds. */
void busy_us(uint32_t us);

/* Parse "64", "64K", "1M", "1G" (binary units). Returns 0 on error. */
uint64_t parse_size(const char *s);

/* Sorts v in place; returns the p-th percentile (0..100), nearest rank
 * with linear interpolation between neighbours. */
double percentile_sorted(const double *v, size_t n, double p);
void sort_doubles(double *v, size_t n);

/* Minimal JSON object writer onto a memory buffer. */
struct jw {
	char buf[16384];
	size_t len;
	int first;
};
void jw_begin(struct jw *j);
void jw_key(struct jw *j, const char *k);
void jw_str(struct jw *j, const char *k, const char *v);
void jw_num(struct jw *j, const char *k, double v);
void jw_int(struct jw *j, const char *k, int64_t v);
void jw_raw(struct jw *j, const char *k, const char *raw);
void jw_obj_begin(struct jw *j, const char *k);
void jw_obj_end(struct jw *j);
void jw_end_print(struct jw *j, FILE *f);

#endif
