// SPDX-License-Identifier: MIT
/*
 * test_pagehdr.c - the pool's side table (pagehdr.c): a superblock checks only as written and
 * sized; the scan keeps a sealed header over intact bytes, and discards a header whose payload
 * changed (counted torn), a half-written header, one of an unknown namespace, one whose class
 * disagrees with its slab's, and one that would run past its slab.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "pagehdr.h"

#define SLAB (1u << 20)
#define NSLABS 3u
#define SLOT 65536u

static uint8_t *arena;

static const void *base(void *arg, uint64_t k)
{
	(void)arg;
	return arena + k * SLAB;
}

static void *meta_new(void)
{
	uint64_t size = pmeta_size(NSLABS, SLAB);
	struct pmeta_super *sb = calloc(1, size);
	struct kvb_layout l = {.model = "m", .kind = KVB_LAYOUT_MLA, .tokens_per_page = 1};
	struct kvb_ns_ident idf = {0};
	uint8_t ident[32] = {7};

	assert_non_null(sb);
	sb->narenas = 1;
	sb->slab_bytes = SLAB;
	sb->arena[0].size = (uint64_t)NSLABS * SLAB;
	pmeta_super_init(sb, size);
	pmeta_ns_write(sb, 0, 0, SLOT, ident, &l, &idf);
	return sb;
}

static void put(void *meta, uint32_t slab, uint32_t slot, uint16_t ns, uint32_t slot_bytes,
		uint8_t fill)
{
	struct pmeta_hdr h = {.ns = ns, .slot_bytes = slot_bytes, .len = slot_bytes, .gen = 9};
	uint8_t *p = arena + (uint64_t)slab * SLAB + (uint64_t)slot * slot_bytes;

	memset(p, fill, slot_bytes);
	memset(h.key.b, fill, sizeof(h.key.b));
	pmeta_hdr_seal(&h, p);
	*pmeta_hdr_at(meta, slab, slot, SLAB) = h;
}

static void test_pagehdr_super(void **state)
{
	void *m = meta_new();
	uint64_t size = pmeta_size(NSLABS, SLAB);

	(void)state;
	assert_int_equal(pmeta_super_check(m, size), 0);
	assert_int_equal(pmeta_super_check(m, size + 4096), -EINVAL);
	((uint8_t *)m)[20] ^= 1;
	assert_int_equal(pmeta_super_check(m, size), -EINVAL);
	free(m);
}

static void test_pagehdr_scan_discards(void **state)
{
	void *m = meta_new();
	uint32_t cls[NSLABS];
	uint64_t torn, kept;

	(void)state;
	arena = calloc(NSLABS, SLAB);
	assert_non_null(arena);
	put(m, 0, 0, 0, SLOT, 1); /* kept */
	put(m, 0, 1, 0, SLOT, 2); /* payload changed after the seal: torn */
	arena[SLOT + 100] ^= 0xff;
	put(m, 0, 2, 0, SLOT, 3); /* header half written */
	pmeta_hdr_at(m, 0, 2, SLAB)->gen = 10;
	put(m, 0, 3, 5, SLOT, 4);	  /* unknown namespace */
	put(m, 0, 4, 0, 2 * SLOT, 5);	  /* disagrees with slot 0's class */
	put(m, 1, 15, 0, SLOT, 6);	  /* the last slot of slab 1: kept */
	put(m, 2, 0, 0, SLOT, 7);	  /* kept */
	pmeta_hdr_at(m, 2, 16, SLAB)->magic = PHDR_MAGIC; /* past the slab's slots: garbage */
	kept = pmeta_scan(m, NSLABS, base, NULL, cls, &torn);
	assert_int_equal(kept, 3);
	assert_int_equal(torn, 1);
	assert_int_equal(cls[0], SLOT);
	assert_int_equal(cls[1], SLOT);
	assert_int_equal(cls[2], SLOT);
	assert_int_equal(pmeta_hdr_at(m, 0, 0, SLAB)->magic, PHDR_MAGIC);
	for (uint32_t j = 1; j <= 4; j++)
		assert_int_equal(pmeta_hdr_at(m, 0, j, SLAB)->magic, 0);
	assert_int_equal(pmeta_hdr_at(m, 2, 16, SLAB)->magic, 0);
	free(arena);
	free(m);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_pagehdr_super),
		cmocka_unit_test(test_pagehdr_scan_discards),
	};

	return cmocka_run_group_tests_name("pagehdr", tests, NULL, NULL);
}
