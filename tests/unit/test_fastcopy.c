// SPDX-License-Identifier: MIT
/*
 * test_fastcopy.c - the data path's memory helpers. kvb_copy() (proto/fastcopy.h) is byte-exact
 * at every size around its streaming thresholds and the vector widths, at every alignment of
 * either side, into a reused destination and a fresh one, and writes nothing outside
 * [dst, dst + n); so is kvb_copy_nt() from 256 bytes, and kvb_copy_part() as one segment of
 * a large copy; the SSE2 and AVX2 loops are checked one by one. The background thread
 * (broker/bg.c) populates a mapping (every page resident after it, its bytes unchanged) and
 * unmaps only after an earlier populate of the same range, and does both inline-or-not without
 * a thread (NULL). loop_hold() keeps the loop's deadline monotonic and clamped.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "bg.h"
#include "clock.h"
#include "fastcopy.h"
#include "loop.h"

#define GUARD 256

static uint8_t pattern(size_t i)
{
	return (uint8_t)(i * 131u + (i >> 9) + 7u);
}

/* Copies n bytes at src offset so and dst offset dso with fn, checks the result and guards. */
static void check_copy(void (*fn)(void *, const void *, size_t), size_t n, size_t so, size_t dso)
{
	uint8_t *src = malloc(n + so + 64), *dst = malloc(n + dso + 2 * GUARD + 64);

	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < n + so; i++)
		src[i] = pattern(i);
	memset(dst, 0xa5, n + dso + 2 * GUARD);
	fn(dst + GUARD + dso, src + so, n);
	for (size_t i = 0; i < GUARD + dso; i++)
		assert_int_equal(dst[i], 0xa5);
	assert_memory_equal(dst + GUARD + dso, src + so, n);
	for (size_t i = 0; i < GUARD; i++)
		assert_int_equal(dst[GUARD + dso + n + i], 0xa5);
	free(src);
	free(dst);
}

#if defined(__x86_64__) && !defined(KVB_NO_NT)
static void copy_sse2(void *d, const void *s, size_t n)
{
	kvb_copy_nt_sse2(d, s, n);
}

static void copy_avx2(void *d, const void *s, size_t n)
{
	kvb_copy_nt_avx2(d, s, n);
}
#endif

static const size_t sizes[] = {0,
			       1,
			       63,
			       4096,
			       KVB_COPY_NT_FRESH - 1,
			       KVB_COPY_NT_FRESH,
			       KVB_COPY_NT_FRESH + 33,
			       KVB_COPY_NT_MIN - 1,
			       KVB_COPY_NT_MIN,
			       KVB_COPY_NT_MIN + 1,
			       KVB_COPY_NT_MIN + 127,
			       KVB_COPY_NT_MIN + 4097,
			       (1u << 20) + 33,
			       4498944 + 7};

static void test_copy_sizes_alignments(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++)
		for (size_t so = 0; so < 3; so++)
			for (size_t dso = 0; dso < 3; dso++)
				check_copy(kvb_copy, sizes[i], so * 17, dso * 13);
	/* Every destination alignment within a vector, at one size above the threshold. */
	for (size_t dso = 0; dso < 64; dso++)
		check_copy(kvb_copy, KVB_COPY_NT_MIN + 100, 5, dso);
}

/*
 * [nt-fresh] The same destination twice in a row (plain stores the second time) and then a
 * new one (streaming stores), each byte-exact: the choice changes speed, never the bytes.
 */
static void check_fresh_and_reused(size_t n)
{
	uint8_t *src = malloc(2 * n), *dst = malloc(2 * n + GUARD);

	assert_non_null(src);
	assert_non_null(dst);
	for (size_t i = 0; i < 2 * n; i++)
		src[i] = pattern(i);
	for (int round = 0; round < 3; round++) {
		uint8_t *d = dst + (round == 2 ? n : 0) + 3;

		memset(dst, 0xa5, 2 * n + GUARD);
		kvb_copy(d, src + (size_t)round * 7, n);
		assert_memory_equal(d, src + (size_t)round * 7, n);
		assert_int_equal(d[-1], 0xa5);
		assert_int_equal(d[n], 0xa5);
	}
	free(src);
	free(dst);
}

/* Under KVB_COPY_NT_MIN, and above it up to half the L2 (kvb_copy_hot_max()) and past that. */
static void test_copy_fresh_and_reused(void **state)
{
	size_t hot = kvb_copy_hot_max();

	(void)state;
	assert_true(hot >= KVB_COPY_NT_MIN - 1);
	check_fresh_and_reused(KVB_COPY_NT_FRESH + 4097);
	check_fresh_and_reused(hot);
	check_fresh_and_reused(hot + 4097);
}

/* kvb_copy_nt(): streaming stores from 256 bytes, any alignment, nothing written outside. */
static void test_copy_nt_any_size(void **state)
{
	static const size_t nt_sizes[] = {0, 1, 255, 256, 257, 4096 + 3, 16384, 65536 + 65};

	(void)state;
	for (size_t i = 0; i < sizeof(nt_sizes) / sizeof(nt_sizes[0]); i++)
		for (size_t dso = 0; dso < 40; dso += 13)
			check_copy(kvb_copy_nt, nt_sizes[i], 5, dso);
}

/* One segment of a copy of 4 MiB in all: streaming stores from KVB_COPY_SEG_NT_MIN up. */
static void copy_seg_of_big(void *d, const void *s, size_t n)
{
	kvb_copy_part(d, s, n, 4u << 20);
}

static void test_copy_part_segments(void **state)
{
	static const size_t seg[] = {0,
				     33,
				     KVB_COPY_SEG_NT_MIN - 1,
				     KVB_COPY_SEG_NT_MIN,
				     KVB_COPY_SEG_NT_MIN + 1,
				     72u * 1024 + 3};

	(void)state;
	for (size_t i = 0; i < sizeof(seg) / sizeof(seg[0]); i++)
		for (size_t dso = 0; dso < 40; dso += 13)
			check_copy(copy_seg_of_big, seg[i], 7, dso);
}

static void test_copy_each_kernel(void **state)
{
	(void)state;
#if defined(__x86_64__) && !defined(KVB_NO_NT)
	for (size_t dso = 0; dso < 40; dso += 7) {
		check_copy(copy_sse2, KVB_COPY_NT_MIN + 65, 3, dso);
		if (__builtin_cpu_supports("avx2"))
			check_copy(copy_avx2, KVB_COPY_NT_MIN + 129, 3, dso);
	}
#else
	skip();
#endif
}

static size_t resident(void *p, size_t len)
{
	long pg = sysconf(_SC_PAGESIZE);
	size_t n = (len + (size_t)pg - 1) / (size_t)pg, r = 0;
	unsigned char *v = malloc(n);

	assert_non_null(v);
	assert_int_equal(mincore(p, len, v), 0);
	for (size_t i = 0; i < n; i++)
		r += v[i] & 1;
	free(v);
	return r;
}

static void test_bg_populate_unmap(void **state)
{
	const size_t len = 8u << 20;
	long pg = sysconf(_SC_PAGESIZE);
	struct bg *g = bg_start();
	uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	uint8_t *q;

	(void)state;
	assert_non_null(g);
	assert_ptr_not_equal(p, MAP_FAILED);
	p[3 * pg] = 42;
	bg_populate(g, p, len);
	/* Behind the populate in the queue: runs only after it (FIFO, one thread). */
	q = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	assert_ptr_not_equal(q, MAP_FAILED);
	bg_populate(g, q, len);
	bg_unmap(g, q, len);
	for (int i = 0; i < 2000 && bg_pending(g); i++)
		usleep(1000);
	assert_int_equal(bg_pending(g), 0);
	assert_int_equal(resident(p, len), len / (size_t)pg);
	assert_int_equal(p[3 * pg], 42);
	assert_int_equal(p[5 * pg], 0);
	bg_stop(g);
	/* The unmapped range is gone: mincore fails on it. */
	{
		unsigned char v;

		assert_int_equal(mincore(q, (size_t)pg, &v), -1);
	}
	/* No thread: unmap is inline, populate a no-op. */
	bg_populate(NULL, p, len);
	bg_unmap(NULL, p, len);
	{
		unsigned char v;

		assert_int_equal(mincore(p, (size_t)pg, &v), -1);
	}
	assert_int_equal(bg_pending(NULL), 0);
	bg_stop(NULL);
}

static void test_loop_hold(void **state)
{
	struct loop l = {0};
	double t0 = clock_now();

	(void)state;
	loop_hold(&l, 1.0); /* clamped */
	assert_true(l.hold_until <= clock_now() + LOOP_HOLD_MAX);
	assert_true(l.hold_until >= t0 + LOOP_HOLD_MAX * 0.5);
	double h = l.hold_until;

	loop_hold(&l, 0); /* never moves it back */
	assert_true(l.hold_until == h);
	loop_hold_bytes(&l, 0);
	assert_true(l.hold_until == h);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_copy_sizes_alignments),
		cmocka_unit_test(test_copy_each_kernel),
		cmocka_unit_test(test_copy_fresh_and_reused),
		cmocka_unit_test(test_copy_nt_any_size),
		cmocka_unit_test(test_copy_part_segments),
		cmocka_unit_test(test_bg_populate_unmap),
		cmocka_unit_test(test_loop_hold),
	};

	setvbuf(stdout, NULL, _IOLBF, 0);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
