/*
 * copy.c - candidate routines for the Buffer Copy data path (copy.h).
 *
 * Each is a plain forward copy of non-overlapping buffers. The vector
 * loops use unaligned loads and stores aligned on the destination, four
 * vectors per iteration, and finish with one (overlapping) last vector, so
 * they never touch a byte outside [dst, dst + n). Below 256 bytes every
 * routine hands over to libc's memcpy, which is best for small sizes
 * everywhere. Which routine is used is decided in calib.c.
 */
#include <stdint.h>
#include <string.h>

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

static void copy_sse2(void *dst, const void *src, size_t n)
{
	if (n < SMALL) {
		memcpy(dst, src, n);
		return;
	}
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
		_mm_store_si128((__m128i *)d, a);
		_mm_store_si128((__m128i *)(d + 16), b);
		_mm_store_si128((__m128i *)(d + 32), c);
		_mm_store_si128((__m128i *)(d + 48), e);
		d += 64;
		s += 64;
		n -= 64;
	}
	while (n >= 16) {
		_mm_store_si128((__m128i *)d, _mm_loadu_si128((const __m128i *)s));
		d += 16;
		s += 16;
		n -= 16;
	}
	_mm_storeu_si128((__m128i *)(d + n - 16), last);
	_mm_storeu_si128((__m128i *)dst, first);
}

__attribute__((target("avx2")))
static void copy_avx2(void *dst, const void *src, size_t n)
{
	if (n < SMALL) {
		memcpy(dst, src, n);
		return;
	}
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
		_mm256_store_si256((__m256i *)d, a);
		_mm256_store_si256((__m256i *)(d + 32), b);
		_mm256_store_si256((__m256i *)(d + 64), c);
		_mm256_store_si256((__m256i *)(d + 96), e);
		d += 128;
		s += 128;
		n -= 128;
	}
	while (n >= 32) {
		_mm256_store_si256((__m256i *)d, _mm256_loadu_si256((const __m256i *)s));
		d += 32;
		s += 32;
		n -= 32;
	}
	_mm256_storeu_si256((__m256i *)(d + n - 32), last);
	_mm256_storeu_si256((__m256i *)dst, first);
	_mm256_zeroupper();
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

#else

static const struct sdp_copy_impl impls[] = {
	{ "libc", copy_libc, always },
};

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
