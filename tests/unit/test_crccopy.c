// SPDX-License-Identifier: MIT
/*
 * test_crccopy.c - [crc-fused] crc_copy() (broker/crccopy.c) copies byte-exact and returns
 * exactly slot_crc32c_more() of what it stored: at every size around its block sizes (128 and
 * 256 bytes) and the destination's 64-byte boundary, at every alignment of either side, with
 * any running crc (chunk by chunk equals all at once, as a filled PUT uses it), writing
 * nothing outside [dst, dst + n). Each loop the CPU has (512-bit, 256-bit, the plain copy then
 * ISA-L) is checked on its own. The folding constants are derived again here, bit by bit, and
 * crc_shift() joins parts' checksums computed apart, in any order, into the whole's.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "crccopy.h"
#include "kernels/crc32c_gf.h"
#include "slot.h"

#define GUARD 128
#define POLY 0x82f63b78u /* Castagnoli, bit-reflected */

/* a * b mod P, both bit-reflected: the schoolbook way, one bit of b at a time. */
static uint32_t gf_mul(uint32_t a, uint32_t b)
{
	uint32_t r = 0;

	for (int i = 0; i < 32; i++) {
		if (b & 0x80000000u)
			r ^= a;
		b <<= 1;
		a = (a >> 1) ^ ((a & 1) ? POLY : 0);
	}
	return r;
}

/* x^e mod P, bit-reflected: x^0 is bit 31, x^1 bit 30. */
static uint32_t x_pow(uint64_t e)
{
	uint32_t r = 0x80000000u, sq = 0x40000000u;

	for (; e; e >>= 1) {
		if (e & 1)
			r = gf_mul(r, sq);
		sq = gf_mul(sq, sq);
	}
	return r;
}

static void test_crccopy_constants(void **state)
{
	(void)state;
	/* x^32 mod P is P itself (reflected): the derivation's own check. */
	assert_int_equal(x_pow(32), POLY);
	assert_int_equal(x_pow(2111), CRC_X2111);
	assert_int_equal(x_pow(2047), CRC_X2047);
	assert_int_equal(x_pow(1087), CRC_X1087);
	assert_int_equal(x_pow(1023), CRC_X1023);
}

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 131u + (i >> 9) + 7u);
}

/* One copy of n bytes at level lvl, src offset so, dst offset dso, running crc init. */
static void check_one(int lvl, size_t n, size_t so, size_t dso, uint32_t init)
{
	uint8_t *src = malloc(n + so + 1), *raw = NULL, *dst;
	uint32_t crc;

	assert_non_null(src);
	assert_int_equal(posix_memalign((void **)&raw, 64, n + dso + 2 * GUARD + 64), 0);
	dst = raw + GUARD + dso;
	for (size_t i = 0; i < n + so; i++)
		src[i] = pattern(i ^ init);
	memset(raw, 0xa5, n + dso + 2 * GUARD);
	crc = crc_copy_at(lvl, dst, src + so, n, init);
	if (crc != slot_crc32c_more(init, src + so, n))
		fail_msg("level %d: %zu bytes, src +%zu, dst +%zu, init %08x: crc %08x, want %08x",
			 lvl, n, so, dso, init, crc, slot_crc32c_more(init, src + so, n));
	if (n)
		assert_memory_equal(dst, src + so, n);
	for (size_t i = 0; i < GUARD + dso; i++)
		assert_int_equal(raw[i], 0xa5);
	for (size_t i = 0; i < GUARD; i++)
		assert_int_equal(dst[n + i], 0xa5);
	free(src);
	free(raw);
}

static int levels(void)
{
	int l = crc_copy_level();

	assert_in_range(l, 0, 2);
	return l;
}

static void test_crccopy_sizes(void **state)
{
	static const size_t sizes[] = {0,   1,	 4,    63,   64,   65,	  127,	 128,	129,
				       191, 255, 256,  257,  319,  320,	  383,	 384,	511,
				       512, 513, 4095, 4096, 4097, 65536, 65600, 96000, 98304};
	static const size_t offs[] = {0, 1, 7, 31, 32, 63};
	(void)state;

	for (int lvl = 0; lvl <= levels(); lvl++)
		for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
			for (size_t d = 0; d < sizeof(offs) / sizeof(offs[0]); d++) {
				check_one(lvl, sizes[i], offs[d], offs[d], 0);
				check_one(lvl, sizes[i], (offs[d] + 3) % 64, offs[d], 0x9e3779b9u);
			}
	/* A Kimi-K2.5 page, a MiB and some. */
	for (int lvl = 0; lvl <= levels(); lvl++) {
		check_one(lvl, 4497408, 0, 0, 0);
		check_one(lvl, (1u << 20) + 13, 5, 17, 0xffffffffu);
	}
}

/* Chunk by chunk (a filled PUT's steps, of any size) gives the crc of all of it. */
static void test_crccopy_chunks(void **state)
{
	size_t n = 96000, steps[] = {16384, 1, 32768, 255, 4096, 9000};
	uint8_t *src = malloc(n), *dst = NULL;
	(void)state;

	assert_non_null(src);
	assert_int_equal(posix_memalign((void **)&dst, 4096, n), 0);
	for (size_t i = 0; i < n; i++)
		src[i] = pattern(i);
	for (int lvl = 0; lvl <= levels(); lvl++) {
		uint32_t crc = 0;
		size_t done = 0;

		memset(dst, 0, n);
		for (size_t k = 0; done < n; k++) {
			size_t c = steps[k % 6] < n - done ? steps[k % 6] : n - done;

			crc = crc_copy_at(lvl, dst + done, src + done, c, crc);
			done += c;
		}
		assert_int_equal(crc, slot_crc32c(src, n));
		assert_memory_equal(dst, src, n);
	}
	free(src);
	free(dst);
}

/* crc_shift: parts' raw crcs, moved to their places and xored in any order, give the whole's. */
static void test_crccopy_shift_parts(void **state)
{
	size_t n = 3000000, cut[] = {0, 4096, 1000001, 1000002, 2999000, 3000000};
	uint8_t *buf = malloc(n);
	uint32_t x = 0;
	(void)state;

	assert_non_null(buf);
	for (size_t i = 0; i < n; i++)
		buf[i] = pattern(i * 3);
	for (int k = 4; k >= 0; k--) { /* last part first */
		uint32_t r = ~slot_crc32c_more(~0u, buf + cut[k], cut[k + 1] - cut[k]);

		x ^= crc_shift(r, n - cut[k + 1]);
	}
	assert_int_equal(x ^ crc_shift(~0u, n) ^ ~0u, slot_crc32c(buf, n));
	assert_int_equal(crc_shift(0x12345678u, 0), 0x12345678u);
	free(buf);
}

/*
 * [gpu-crc] crc32c_gf.h, which the GPU's checksum kernel runs: KVB_X8POW derived again by
 * squaring, its tables and its 4-bytes-at-a-time loop against ISA-L, and crc_slot_finish.
 */
static void test_crccopy_gf_header(void **state)
{
	static const unsigned pw[KVB_X8POW_N] = KVB_X8POW;
	unsigned tab[4 * 256];
	size_t n = 70000;
	uint8_t *buf = malloc(n);
	uint32_t r = 0, x;
	(void)state;

	assert_non_null(buf);
	for (int k = 0; k < 64; k++)
		assert_int_equal(pw[k % KVB_X8POW_N], kvb_gf_x8n(1ull << k));
	assert_int_equal(kvb_gf_x8n_tab(pw, 123456789), kvb_gf_x8n(123456789));
	assert_int_equal(kvb_gf_x8n_tab(pw, ~0ull), kvb_gf_x8n(~0ull));
	for (unsigned i = 0; i < 256; i++)
		kvb_crc_tab4(tab, i);
	for (size_t i = 0; i < n; i++)
		buf[i] = pattern(i * 5);
	for (size_t i = 0; i + 4 <= 65536; i += 4) {
		uint32_t w;

		memcpy(&w, buf + i, 4);
		r = kvb_crc_word4(tab, r, w);
	}
	for (size_t i = 65536; i < n - 100; i++)
		r = kvb_crc_byte(tab, r, buf[i]);
	assert_int_equal(r, ~slot_crc32c_more(~0u, buf, n - 100));
	/* The slot: those bytes as one part, and 100 more read from the slot by the finish. */
	x = kvb_gf_mul(r, kvb_gf_x8n_tab(pw, 100));
	assert_int_equal(crc_slot_finish(x, buf, n - 100, n), slot_crc32c(buf, n));
	free(buf);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_crccopy_constants),
		cmocka_unit_test(test_crccopy_sizes),
		cmocka_unit_test(test_crccopy_chunks),
		cmocka_unit_test(test_crccopy_shift_parts),
		cmocka_unit_test(test_crccopy_gf_header),
	};

	printf("# crc_copy level on this CPU: %d\n", crc_copy_level());
	return cmocka_run_group_tests(tests, NULL, NULL);
}
