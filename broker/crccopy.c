// SPDX-License-Identifier: MIT
/*
 * crccopy.c - [crc-fused] a PUT's copy into the pool that computes the slot's crc32c (the page
 * header a restarted broker checks, pagehdr.c) from the very registers it stores, so that the
 * checksum costs almost nothing on top of the copy.
 *
 * Why: a synchronous 64 KiB PUT waits for the copy, then the checksum, then the commit. ISA-L's
 * crc32c of the source, still in the cache after the copy ([crc-src], xfer.c), took 1.1-1.8 us
 * against a 4-4.6 us streaming copy; the same crc read back from the slot later (a "seal
 * later" on the loop) 3.6-4.3 us, since streaming stores leave the slot in DRAM. Folding the
 * crc into the copy loop costs 0.1-0.2 us with 512-bit vectors and 0.7-1.0 us with 256-bit
 * ones on this project's AMD EPYC (64 KiB, rotating 256 MiB source and destination, figures in
 * docs/benchmarks.md): the folds run while the loads wait for DRAM. A fused loop with the
 * crc32 instruction (three interleaved streams) was slower than copy + ISA-L (7.4 against
 * 6.3 us), so was one with 128-bit pclmul folds (6.5): not kept.
 *
 * How (the carry-less folding of Intel's "Fast CRC Computation for Generic Polynomials Using
 * PCLMULQDQ", for the bit-reflected Castagnoli polynomial P = 0x82f63b78): the message is a
 * polynomial over GF(2) and its crc is M(x) * x^32 mod P, so any M' = M mod P has the same crc.
 * The state is the first 256 (512-bit loop) or 128 (256-bit loop) bytes, eight or four 128-bit
 * lanes with the initial crc xored into the first four bytes (a reflected crc with init c is
 * the crc with init 0 of the message whose first 32 bits are xored with c). Each further block
 * of that size moves the state forward: each 128-bit lane, a polynomial H * x^64 + L of its two
 * 64-bit halves, is replaced by H * (x^(D+64) mod P) + L * (x^D mod P) (D: the block size in
 * bits, so the lane lands where the new block's lane of the same index is) xored with that
 * lane of the new block. The products have at most 96 bits, so they fit the lane. With
 * reflected operands pclmulqdq's product comes out one bit off the lane's scale, which the
 * constants absorb: they are x^(D+63) and x^(D-1) mod P in the upper 32 bits of a quadword.
 * After the last block the state is congruent to the message and its crc (crc32 instructions,
 * 32 or 16 of them) is the message's. test_crccopy.c derives the constants again bit by bit.
 *
 * Bytes before the destination's first 64-byte boundary and after the last whole block are
 * copied with ordinary stores and checksummed from the destination (just written, in the
 * cache), so at levels 1 and 2 the checksum is of exactly the bytes stored, whatever a client
 * does to its source meanwhile. Level 0 (no VPCLMULQDQ, or not x86) copies and then takes
 * ISA-L's crc of the source, as [crc-src] did. Any thread.
 */
#include <string.h>

#include "crccopy.h"
#include "fastcopy.h"
#include "kernels/crc32c_gf.h"
#include "slot.h"

#if defined(__x86_64__) && !defined(KVB_NO_NT)
#include <immintrin.h>

/* The crc (init 0, not inverted, as the crc32 instruction keeps it) of the state's bytes. */
__attribute__((target("sse4.2"))) static uint32_t state_crc(const uint64_t *w, size_t nw)
{
	uint64_t r = 0;

	for (size_t i = 0; i < nw; i++)
		r = _mm_crc32_u64(r, w[i]);
	return (uint32_t)r;
}

/* n: a multiple of 256, at least 256; d 64-byte aligned. */
__attribute__((target("avx512f,vpclmulqdq,sse4.2"))) static uint32_t fold512(uint8_t *d,
									     const uint8_t *s,
									     size_t n, uint32_t crc)
{
	const __m512i k = _mm512_set4_epi64(
		(long long)(CRC_X2047 << 32), (long long)(CRC_X2111 << 32),
		(long long)(CRC_X2047 << 32), (long long)(CRC_X2111 << 32));
	__m512i x0 = _mm512_loadu_si512(s), x1 = _mm512_loadu_si512(s + 64);
	__m512i x2 = _mm512_loadu_si512(s + 128), x3 = _mm512_loadu_si512(s + 192);
	uint64_t w[32];

	_mm512_stream_si512((void *)d, x0);
	_mm512_stream_si512((void *)(d + 64), x1);
	_mm512_stream_si512((void *)(d + 128), x2);
	_mm512_stream_si512((void *)(d + 192), x3);
	x0 = _mm512_xor_si512(x0, _mm512_zextsi128_si512(_mm_cvtsi32_si128((int)~crc)));
	for (size_t o = 256; o < n; o += 256) {
		__m512i y0 = _mm512_loadu_si512(s + o), y1 = _mm512_loadu_si512(s + o + 64);
		__m512i y2 = _mm512_loadu_si512(s + o + 128), y3 = _mm512_loadu_si512(s + o + 192);

		_mm512_stream_si512((void *)(d + o), y0);
		_mm512_stream_si512((void *)(d + o + 64), y1);
		_mm512_stream_si512((void *)(d + o + 128), y2);
		_mm512_stream_si512((void *)(d + o + 192), y3);
		/* 0x96: a ^ b ^ c */
		x0 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x0, k, 0x00),
					       _mm512_clmulepi64_epi128(x0, k, 0x11), y0, 0x96);
		x1 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x1, k, 0x00),
					       _mm512_clmulepi64_epi128(x1, k, 0x11), y1, 0x96);
		x2 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x2, k, 0x00),
					       _mm512_clmulepi64_epi128(x2, k, 0x11), y2, 0x96);
		x3 = _mm512_ternarylogic_epi64(_mm512_clmulepi64_epi128(x3, k, 0x00),
					       _mm512_clmulepi64_epi128(x3, k, 0x11), y3, 0x96);
	}
	_mm512_storeu_si512(w, x0);
	_mm512_storeu_si512(w + 8, x1);
	_mm512_storeu_si512(w + 16, x2);
	_mm512_storeu_si512(w + 24, x3);
	return ~state_crc(w, 32);
}

/* n: a multiple of 128, at least 128; d 32-byte aligned. */
__attribute__((target("avx2,vpclmulqdq,sse4.2"))) static uint32_t fold256(uint8_t *d,
									  const uint8_t *s,
									  size_t n, uint32_t crc)
{
	const __m256i k = _mm256_set_epi64x(
		(long long)(CRC_X1023 << 32), (long long)(CRC_X1087 << 32),
		(long long)(CRC_X1023 << 32), (long long)(CRC_X1087 << 32));
	__m256i x0 = _mm256_loadu_si256((const __m256i *)s);
	__m256i x1 = _mm256_loadu_si256((const __m256i *)(s + 32));
	__m256i x2 = _mm256_loadu_si256((const __m256i *)(s + 64));
	__m256i x3 = _mm256_loadu_si256((const __m256i *)(s + 96));
	uint64_t w[16];

	_mm256_stream_si256((__m256i *)d, x0);
	_mm256_stream_si256((__m256i *)(d + 32), x1);
	_mm256_stream_si256((__m256i *)(d + 64), x2);
	_mm256_stream_si256((__m256i *)(d + 96), x3);
	x0 = _mm256_xor_si256(x0, _mm256_set_epi32(0, 0, 0, 0, 0, 0, 0, (int)~crc));
	for (size_t o = 128; o < n; o += 128) {
		__m256i y0 = _mm256_loadu_si256((const __m256i *)(s + o));
		__m256i y1 = _mm256_loadu_si256((const __m256i *)(s + o + 32));
		__m256i y2 = _mm256_loadu_si256((const __m256i *)(s + o + 64));
		__m256i y3 = _mm256_loadu_si256((const __m256i *)(s + o + 96));

		_mm256_stream_si256((__m256i *)(d + o), y0);
		_mm256_stream_si256((__m256i *)(d + o + 32), y1);
		_mm256_stream_si256((__m256i *)(d + o + 64), y2);
		_mm256_stream_si256((__m256i *)(d + o + 96), y3);
		x0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x0, k, 0x00),
						       _mm256_clmulepi64_epi128(x0, k, 0x11)),
				      y0);
		x1 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x1, k, 0x00),
						       _mm256_clmulepi64_epi128(x1, k, 0x11)),
				      y1);
		x2 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x2, k, 0x00),
						       _mm256_clmulepi64_epi128(x2, k, 0x11)),
				      y2);
		x3 = _mm256_xor_si256(_mm256_xor_si256(_mm256_clmulepi64_epi128(x3, k, 0x00),
						       _mm256_clmulepi64_epi128(x3, k, 0x11)),
				      y3);
	}
	_mm256_storeu_si256((__m256i *)w, x0);
	_mm256_storeu_si256((__m256i *)(w + 4), x1);
	_mm256_storeu_si256((__m256i *)(w + 8), x2);
	_mm256_storeu_si256((__m256i *)(w + 12), x3);
	return ~state_crc(w, 16);
}

int crc_copy_level(void)
{
	if (!__builtin_cpu_supports("vpclmulqdq") || !__builtin_cpu_supports("sse4.2"))
		return 0;
	if (__builtin_cpu_supports("avx512f"))
		return 2;
	return __builtin_cpu_supports("avx2") ? 1 : 0;
}

/* fence 0: the streaming stores are left for crc_copy_fence() ([cqe-first]). */
static uint32_t copy_at(int max, int fence, void *dst, const void *src, size_t n, uint32_t crc)
{
	uint8_t *d = dst;
	const uint8_t *s = src;
	int lvl = crc_copy_level();
	size_t blk, head, body;

	if (lvl > max)
		lvl = max;
	blk = lvl == 2 ? 256 : 128;
	head = (64 - ((uintptr_t)d & 63)) & 63;
	if (lvl <= 0 || n < head + blk) {
		kvb_copy_nt(d, s, n);
		return slot_crc32c_more(crc, s, n);
	}
	/* The unaligned head and the tail through the cache, checksummed where they were put. */
	memcpy(d, s, head);
	crc = slot_crc32c_more(crc, d, head);
	body = (n - head) / blk * blk;
	crc = lvl == 2 ? fold512(d + head, s + head, body, crc)
		       : fold256(d + head, s + head, body, crc);
	/* Streaming stores are weakly ordered: fenced before anyone is told the page is there. */
	if (fence)
		_mm_sfence();
	memcpy(d + head + body, s + head + body, n - head - body);
	return slot_crc32c_more(crc, d + head + body, n - head - body);
}

void crc_copy_fence(void)
{
	_mm_sfence();
}
#else
int crc_copy_level(void)
{
	return 0;
}

static uint32_t copy_at(int max, int fence, void *dst, const void *src, size_t n, uint32_t crc)
{
	(void)max;
	(void)fence;
	kvb_copy_nt(dst, src, n);
	return slot_crc32c_more(crc, src, n);
}

void crc_copy_fence(void)
{
}
#endif

uint32_t crc_copy_at(int max, void *dst, const void *src, size_t n, uint32_t crc)
{
	return copy_at(max, 1, dst, src, n, crc);
}

uint32_t crc_copy_unfenced(void *dst, const void *src, size_t n, uint32_t crc)
{
	return copy_at(2, 0, dst, src, n, crc);
}

static const unsigned x8pow[KVB_X8POW_N] = KVB_X8POW;

uint32_t crc_shift(uint32_t r, uint64_t n)
{
	return kvb_gf_mul(r, kvb_gf_x8n_tab(x8pow, n));
}

uint32_t crc_slot_finish(uint32_t x, const void *slot, uint64_t covered, uint64_t slot_len)
{
	if (slot_len > covered)
		x ^= ~slot_crc32c_more(~0u, (const uint8_t *)slot + covered, slot_len - covered);
	return x ^ crc_shift(~0u, slot_len) ^ ~0u;
}

uint32_t crc_copy(void *dst, const void *src, size_t n, uint32_t crc)
{
	return crc_copy_at(2, dst, src, n, crc);
}
