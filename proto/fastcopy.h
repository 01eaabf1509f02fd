/* SPDX-License-Identifier: MIT */
/*
 * fastcopy.h - kvb_copy(): the page copy of the data path (the broker's host copies, the
 * client's copy out of a lease and into its staging buffer).
 *
 * Copies of at least KVB_COPY_NT_MIN bytes use non-temporal (streaming) stores: a page copy
 * writes MiBs that nobody reads back soon (the pool, a GPU staging buffer, an engine's KV
 * buffer), and streaming stores neither read the destination's lines first nor evict the
 * source out of the cache. Measured on this project's AMD EPYC (AVX2, 32 MiB L3, 2 vCPUs,
 * `kvbbench memcpy` against `kvbbench memcpy-nt`): 1 MiB and 4.29 MiB copies 7.7 -> 11.1 GB/s
 * with rotating destinations, and no slower with one reused destination; 64 KiB was faster
 * with rotating destinations but slower with a reused one. So from KVB_COPY_NT_FRESH (64 KiB)
 * to KVB_COPY_NT_MIN, and on to half the L2 where that is larger, the choice follows the
 * destination [nt-fresh]: the one this thread's previous kvb_copy() wrote is most likely still
 * in the cache (an engine reusing one staging page; 64 KiB out of a 1 MiB L2) and gets glibc's
 * memcpy, any other gets streaming stores (64 KiB, rotating destinations, shared memory on
 * both sides: 5.3-5.8 -> 3.8-4.2 us). Smaller copies always keep memcpy. AVX2 when the CPU has
 * it (checked once), SSE2 otherwise (every x86-64); other architectures always use memcpy.
 *
 * kvb_copy_part() decides by the whole copy's size instead, for one segment of many: a view
 * GET or PUT of a page is one segment per layer (a Kimi-K2.5 page: 61 of 72 KiB), which glibc
 * copied with ordinary stores, 1.45x slower than the same page in one run (kvbbench engine
 * with --layers 1 against without, docs/benchmarks.md). Segments under KVB_COPY_SEG_NT_MIN keep
 * memcpy: a streaming copy's partial lines at both ends would cost more than it saves.
 */
#ifndef KVB_PROTO_FASTCOPY_H
#define KVB_PROTO_FASTCOPY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#define KVB_COPY_NT_MIN (256u << 10)
#define KVB_COPY_NT_FRESH (64u << 10)
#define KVB_COPY_SEG_NT_MIN (4u << 10)

/*
 * [nt-fresh] The largest reused destination that plain stores write faster: half the L2, so
 * that the destination and the source streaming past it both fit (sysconf, read once), and at
 * least KVB_COPY_NT_MIN - 1. On an Intel Xeon (model 207, 2 MiB L2) a reused 256 KiB or 1 MiB
 * destination took 8.6-9.1 GB/s with glibc's memcpy, 6.7-8.2 streaming, 2 MiB 7.7-8.4 either
 * way (a kvb_get into it: 0.75-0.81 -> 0.92-1.01 of memcpy at 256 KiB, 0.87-0.92 -> 0.91-0.97 at
 * 1 MiB); on an AMD EPYC (1 MiB L2) a reused 1 MiB destination was no slower streaming.
 */
static inline size_t kvb_copy_hot_max(void)
{
	static size_t hot;
	size_t h = __atomic_load_n(&hot, __ATOMIC_RELAXED);

	if (!h) {
		long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);

		h = l2 > 0 && (size_t)l2 / 2 >= KVB_COPY_NT_MIN ? (size_t)l2 / 2
								: KVB_COPY_NT_MIN - 1;
		__atomic_store_n(&hot, h, __ATOMIC_RELAXED);
	}
	return h;
}

#if defined(__x86_64__) && !defined(KVB_NO_NT)
#include <immintrin.h>

/* dst..dst+n with streaming stores, any alignment of either side. */
__attribute__((target("avx2"))) static inline void kvb_copy_nt_avx2(uint8_t *dst,
								    const uint8_t *src, size_t n)
{
	size_t head = (32 - ((uintptr_t)dst & 31)) & 31;

	memcpy(dst, src, head); /* n >= 256 > 32 */
	dst += head;
	src += head;
	n -= head;
	for (; n >= 128; n -= 128, dst += 128, src += 128) {
		__m256i a = _mm256_loadu_si256((const __m256i *)src);
		__m256i b = _mm256_loadu_si256((const __m256i *)(src + 32));
		__m256i c = _mm256_loadu_si256((const __m256i *)(src + 64));
		__m256i d = _mm256_loadu_si256((const __m256i *)(src + 96));

		_mm256_stream_si256((__m256i *)dst, a);
		_mm256_stream_si256((__m256i *)(dst + 32), b);
		_mm256_stream_si256((__m256i *)(dst + 64), c);
		_mm256_stream_si256((__m256i *)(dst + 96), d);
	}
	/* Streaming stores are weakly ordered: fence before anyone is told the copy is done. */
	_mm_sfence();
	memcpy(dst, src, n);
}

static inline void kvb_copy_nt_sse2(uint8_t *dst, const uint8_t *src, size_t n)
{
	size_t head = (16 - ((uintptr_t)dst & 15)) & 15;

	memcpy(dst, src, head);
	dst += head;
	src += head;
	n -= head;
	for (; n >= 64; n -= 64, dst += 64, src += 64) {
		__m128i a = _mm_loadu_si128((const __m128i *)src);
		__m128i b = _mm_loadu_si128((const __m128i *)(src + 16));
		__m128i c = _mm_loadu_si128((const __m128i *)(src + 32));
		__m128i d = _mm_loadu_si128((const __m128i *)(src + 48));

		_mm_stream_si128((__m128i *)dst, a);
		_mm_stream_si128((__m128i *)(dst + 16), b);
		_mm_stream_si128((__m128i *)(dst + 32), c);
		_mm_stream_si128((__m128i *)(dst + 48), d);
	}
	_mm_sfence();
	memcpy(dst, src, n);
}

static inline void kvb_copy_stream(void *dst, const void *src, size_t n)
{
	if (__builtin_cpu_supports("avx2"))
		kvb_copy_nt_avx2((uint8_t *)dst, (const uint8_t *)src, n);
	else
		kvb_copy_nt_sse2((uint8_t *)dst, (const uint8_t *)src, n);
}

/* [nt-fresh] Where this thread's last kvb_copy() of KVB_COPY_NT_FRESH or more wrote. */
static _Thread_local const void *kvb_copy_last_dst;

static inline void kvb_copy(void *dst, const void *src, size_t n)
{
	const void *last;

	if (n < KVB_COPY_NT_FRESH) {
		memcpy(dst, src, n);
		return;
	}
	last = kvb_copy_last_dst;
	kvb_copy_last_dst = dst;
	if (dst == last && n <= kvb_copy_hot_max())
		memcpy(dst, src, n);
	else
		kvb_copy_stream(dst, src, n);
}

/*
 * n bytes of a copy of total bytes in all (n <= total). The whole copy in one run goes by
 * kvb_copy()'s rules ([nt-fresh]: a 64 KiB GET or PUT the copy engine runs).
 */
static inline void kvb_copy_part(void *dst, const void *src, size_t n, uint64_t total)
{
	if (n == total)
		kvb_copy(dst, src, n);
	else if (total < KVB_COPY_NT_MIN || n < KVB_COPY_SEG_NT_MIN)
		memcpy(dst, src, n);
	else
		kvb_copy_stream(dst, src, n);
}

/*
 * Streaming stores whatever the size (from 256 bytes): for a destination this CPU does not read
 * soon whose caller knows it, such as a filled PUT's chunks (16-256 KiB) into a fresh pool
 * slot, where plain stores first read every destination line from DRAM, and into a staging
 * page the broker reads them from on its own CPU (client/ops.c [fill-ring]).
 */
static inline void kvb_copy_nt(void *dst, const void *src, size_t n)
{
	if (n < 256)
		memcpy(dst, src, n);
	else
		kvb_copy_stream(dst, src, n);
}
#else
static inline void kvb_copy_part(void *dst, const void *src, size_t n, uint64_t total)
{
	(void)total;
	memcpy(dst, src, n);
}

static inline void kvb_copy(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}

static inline void kvb_copy_nt(void *dst, const void *src, size_t n)
{
	memcpy(dst, src, n);
}
#endif

#endif /* KVB_PROTO_FASTCOPY_H */
