/*
 * copy.c - candidate routines for the Buffer Copy data path (copy.h).
 *
 * Each is a plain forward copy of non-overlapping buffers. The vector
 * loops use unaligned loads and stores aligned on the destination, four
 * vectors per iteration, and finish with one (overlapping) last vector, so
 * they never touch a byte outside [dst, dst + n). Below 256 bytes every
 * routine hands over to libc's memcpy, which is best for small sizes
 * everywhere. Which routine is used is decided in calib.c.
 *
 * Copies into a buffer that the peer's CPU reads in place (the shm ring:
 * sdp_copy_shared) may instead use streaming stores, which write to
 * memory without first taking the line from whichever cache holds it.
 * Whether they pay depends on where the reader runs, which changes while
 * a process runs (a VM's vCPUs move between the host's cores and caches),
 * so each thread learns it from a sample of its own copies (below).
 */
#include <stdint.h>
#include <string.h>
#include <time.h>

#include "sdp/copy.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

#define SMALL 256

static void copy_libc(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

static bool always(void) { return true; }

sdp_copy_fn sdp_copy_cur = copy_libc;
static const char *cur_name = "libc";

#if defined(__x86_64__)

static void copy_movsb(void *dst, const void *src, size_t n)
{
	if (n < SMALL) {
		memcpy(dst, src, n);
		return;
	}
	__asm__ volatile("rep movsb" : "+D"(dst), "+S"(src), "+c"(n) : : "memory");
}

/* The vector loops, with plain or (stream: a constant, so each use is
 * compiled apart) streaming stores. Streaming (non-temporal) stores write
 * to memory without taking the line into the cache first (copy.h: when
 * the reader is far); the fence makes them visible before the caller
 * publishes the bytes, which a release store of the ring's index does not
 * order. The first and last vectors are plain stores of the same bytes. */
static inline __attribute__((always_inline))
void sse2_loop(void *dst, const void *src, size_t n, bool stream)
{
	char *d = dst;
	const char *s = src;
	__m128i first = _mm_loadu_si128((const __m128i *)s);
	__m128i last = _mm_loadu_si128((const __m128i *)(s + n - 16));
	size_t head = 16 - ((uintptr_t)d & 15);      /* align the stores */
	d += head;
	s += head;
	n -= head;
	while (n >= 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)s);
		__m128i b = _mm_loadu_si128((const __m128i *)(s + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(s + 32));
		__m128i e = _mm_loadu_si128((const __m128i *)(s + 48));
		if (stream) {
			_mm_stream_si128((__m128i *)d, a);
			_mm_stream_si128((__m128i *)(d + 16), b);
			_mm_stream_si128((__m128i *)(d + 32), c);
			_mm_stream_si128((__m128i *)(d + 48), e);
		} else {
			_mm_store_si128((__m128i *)d, a);
			_mm_store_si128((__m128i *)(d + 16), b);
			_mm_store_si128((__m128i *)(d + 32), c);
			_mm_store_si128((__m128i *)(d + 48), e);
		}
		d += 64;
		s += 64;
		n -= 64;
	}
	while (n >= 16) {
		if (stream)
			_mm_stream_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
		else
			_mm_store_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
		d += 16;
		s += 16;
		n -= 16;
	}
	if (stream)
		_mm_sfence();
	_mm_storeu_si128((__m128i *)(d + n - 16), last);
	_mm_storeu_si128((__m128i *)dst, first);
}

static void copy_sse2(void *dst, const void *src, size_t n)
{
	if (n < SMALL)
		memcpy(dst, src, n);
	else
		sse2_loop(dst, src, n, false);
}

static void stream_sse2(void *dst, const void *src, size_t n)
{
	sse2_loop(dst, src, n, true);
}

__attribute__((target("avx2"))) static inline __attribute__((always_inline))
void avx2_loop(void *dst, const void *src, size_t n, bool stream)
{
	char *d = dst;
	const char *s = src;
	__m256i first = _mm256_loadu_si256((const __m256i *)s);
	__m256i last = _mm256_loadu_si256((const __m256i *)(s + n - 32));
	size_t head = 32 - ((uintptr_t)d & 31);
	d += head;
	s += head;
	n -= head;
	while (n >= 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)s);
		__m256i b = _mm256_loadu_si256((const __m256i *)(s + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(s + 64));
		__m256i e = _mm256_loadu_si256((const __m256i *)(s + 96));
		if (stream) {
			_mm256_stream_si256((__m256i *)d, a);
			_mm256_stream_si256((__m256i *)(d + 32), b);
			_mm256_stream_si256((__m256i *)(d + 64), c);
			_mm256_stream_si256((__m256i *)(d + 96), e);
		} else {
			_mm256_store_si256((__m256i *)d, a);
			_mm256_store_si256((__m256i *)(d + 32), b);
			_mm256_store_si256((__m256i *)(d + 64), c);
			_mm256_store_si256((__m256i *)(d + 96), e);
		}
		d += 128;
		s += 128;
		n -= 128;
	}
	while (n >= 32) {
		if (stream)
			_mm256_stream_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
		else
			_mm256_store_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
		d += 32;
		s += 32;
		n -= 32;
	}
	if (stream)
		_mm_sfence();
	_mm256_storeu_si256((__m256i *)(d + n - 32), last);
	_mm256_storeu_si256((__m256i *)dst, first);
	_mm256_zeroupper();
}

__attribute__((target("avx2")))
static void copy_avx2(void *dst, const void *src, size_t n)
{
	if (n < SMALL)
		memcpy(dst, src, n);
	else
		avx2_loop(dst, src, n, false);
}

__attribute__((target("avx2")))
static void stream_avx2(void *dst, const void *src, size_t n)
{
	avx2_loop(dst, src, n, true);
}

__attribute__((target("avx512f")))
static void copy_avx512(void *dst, const void *src, size_t n)
{
	if (n < SMALL) {
		memcpy(dst, src, n);
		return;
	}
	char *d = dst;
	const char *s = src;
	__m512i first = _mm512_loadu_si512((const void *)s);
	__m512i last = _mm512_loadu_si512((const void *)(s + n - 64));
	size_t head = 64 - ((uintptr_t)d & 63);
	d += head;
	s += head;
	n -= head;
	while (n >= 256) {
		__m512i a = _mm512_loadu_si512((const void *)s);
		__m512i b = _mm512_loadu_si512((const void *)(s + 64));
		__m512i c = _mm512_loadu_si512((const void *)(s + 128));
		__m512i e = _mm512_loadu_si512((const void *)(s + 192));
		_mm512_store_si512((void *)d, a);
		_mm512_store_si512((void *)(d + 64), b);
		_mm512_store_si512((void *)(d + 128), c);
		_mm512_store_si512((void *)(d + 192), e);
		d += 256;
		s += 256;
		n -= 256;
	}
	while (n >= 64) {
		_mm512_store_si512((void *)d, _mm512_loadu_si512((const void *)s));
		d += 64;
		s += 64;
		n -= 64;
	}
	_mm512_storeu_si512((void *)(d + n - 64), last);
	_mm512_storeu_si512((void *)dst, first);
	_mm256_zeroupper();
}

static bool has_avx2(void) { return __builtin_cpu_supports("avx2"); }
static bool has_avx512(void) { return __builtin_cpu_supports("avx512f"); }
static bool has_erms(void)
{
	unsigned a, b, c, d;
	__asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
	return (b >> 9) & 1;                 /* CPUID.7.0:EBX[9] ERMS */
}

static const struct sdp_copy_impl impls[] = {
	{ "libc",   copy_libc,   always },
	{ "avx2",   copy_avx2,   has_avx2 },
	{ "avx512", copy_avx512, has_avx512 },
	{ "sse2",   copy_sse2,   always },
	{ "movsb",  copy_movsb,  has_erms },
};

static sdp_copy_fn stream_fn(void)
{
	return has_avx2() ? stream_avx2 : stream_sse2;
}

#else

static const struct sdp_copy_impl impls[] = {
	{ "libc", copy_libc, always },
};

static sdp_copy_fn stream_fn(void)
{
	return NULL;
}

#endif

_Static_assert(sizeof impls / sizeof impls[0] <= SDP_COPY_MAX, "SDP_COPY_MAX");

const struct sdp_copy_impl *sdp_copy_impls(int *n)
{
	*n = (int)(sizeof impls / sizeof impls[0]);
	return impls;
}

const struct sdp_copy_impl *sdp_copy_find(const char *name)
{
	for (size_t i = 0; i < sizeof impls / sizeof impls[0]; i++)
		if (!strcmp(impls[i].name, name))
			return &impls[i];
	return NULL;
}

bool sdp_copy_use(const char *name)
{
	const struct sdp_copy_impl *c = sdp_copy_find(name);
	if (!c || !c->usable())
		return false;
	sdp_copy_cur = c->fn;
	cur_name = c->name;
	return true;
}

const char *sdp_copy_name(void)
{
	return cur_name;
}

/* ---- copies the peer's CPU reads in place -------------------------------- */

int sdp_copy_stream_mode;                    /* SDP_COPY_STREAM: 0 auto, 1 on, 2 off */
static double stream_ref = SDP_STREAM_REF_GBPS;

bool sdp_copy_stream_set(const char *name)
{
	if (!strcmp(name, "on"))
		sdp_copy_stream_mode = 1;
	else if (!strcmp(name, "off"))
		sdp_copy_stream_mode = 2;
	else
		return false;
	return true;
}

void sdp_copy_stream_ref(double gbps)
{
	if (gbps > 0)
		stream_ref = gbps;
}

enum sdp_stream_act sdp_stream_next(struct sdp_stream_pick *p)
{
	if (p->gbps <= 0 || ++p->n >= (p->on ? SDP_STREAM_PROBE_ON : SDP_STREAM_PROBE_OFF)) {
		p->n = 0;
		return SDP_ST_TIMED;
	}
	return p->on ? SDP_ST_STREAM : SDP_ST_PLAIN;
}

void sdp_stream_learn(struct sdp_stream_pick *p, size_t bytes, uint64_t ns, double ref)
{
	if (ns > 1000000)                  /* preempted or faulting: says nothing */
		return;
	double g = (double)bytes / (double)(ns ? ns : 1);   /* bytes/ns = GB/s */
	p->gbps = p->gbps <= 0 ? g : p->gbps + (g - p->gbps) / 4;
	double slow = ref * SDP_STREAM_SLOW, fast = ref * SDP_STREAM_FAST;
	if (slow > SDP_STREAM_SLOW_GBPS)
		slow = SDP_STREAM_SLOW_GBPS;
	if (fast > SDP_STREAM_FAST_GBPS)
		fast = SDP_STREAM_FAST_GBPS;
	if (!p->on && p->gbps < slow)
		p->on = true;
	else if (p->on && p->gbps > fast)
		p->on = false;
}

static uint64_t now_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_MONOTONIC, &t);
	return (uint64_t)t.tv_sec * 1000000000u + (uint64_t)t.tv_nsec;
}

static _Thread_local struct sdp_stream_pick pick;

bool sdp_copy_shared(void *dst, const void *src, size_t n)
{
	sdp_copy_fn st = stream_fn();
	if (n < SDP_STREAM_MIN || !st || sdp_copy_stream_mode == 2) {
		sdp_copy_cur(dst, src, n);
		return false;
	}
	if (sdp_copy_stream_mode == 1) {
		st(dst, src, n);
		return true;
	}
	switch (sdp_stream_next(&pick)) {
	case SDP_ST_STREAM:
		st(dst, src, n);
		return true;
	case SDP_ST_TIMED: {
		uint64_t t0 = now_ns();
		sdp_copy_cur(dst, src, n);
		sdp_stream_learn(&pick, n, now_ns() - t0, stream_ref);
		return false;
	}
	case SDP_ST_PLAIN:
		break;
	}
	sdp_copy_cur(dst, src, n);
	return false;
}

void sdp_copy_streaming(void *dst, const void *src, size_t n)
{
	sdp_copy_fn st = stream_fn();
	if (n < 64 || !st)
		memcpy(dst, src, n);
	else
		st(dst, src, n);
}
