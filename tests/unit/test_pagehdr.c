// SPDX-License-Identifier: MIT
/*
 * test_pagehdr.c - the pool's side table (pagehdr.c): a superblock checks only as written and
 * sized; the scan keeps a sealed header over intact bytes, and discards a header whose payload
 * changed (counted torn), a half-written header, one of an unknown namespace and one whose class
 * disagrees with its slab's. Slabs vary in size and place (store.c's extents): headers are
 * found by the 4 KiB unit a slot starts at, slab records only check when they fit their arena.
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
#define ARENA (3u * SLAB)
#define UNITS (ARENA / PHDR_UNIT)
#define SLOT 65536u

static uint8_t *arena;

/* Three slabs of the kinds store.c carves: full, short at an odd offset, one big slot. */
static struct pmeta_scan_slab slabs[3] = {
	{.unit = 0, .slot_bytes = SLOT, .nslots = 16},
	{.unit = (SLAB + PHDR_UNIT) / PHDR_UNIT, .slot_bytes = 3 * PHDR_UNIT, .nslots = 10},
	{.unit = 2 * SLAB / PHDR_UNIT, .slot_bytes = SLAB / 2, .nslots = 1},
};

static void *meta_new(void)
{
	uint64_t size = pmeta_size(UNITS);
	struct pmeta_super *sb = calloc(1, size);
	struct kvb_layout l = {.model = "m", .kind = KVB_LAYOUT_MLA, .tokens_per_page = 1};
	struct kvb_ns_ident idf = {0};
	uint8_t ident[32] = {7};

	assert_non_null(sb);
	sb->narenas = 1;
	sb->slab_bytes = SLAB;
	sb->arena[0].size = ARENA;
	pmeta_super_init(sb, size);
	pmeta_ns_write(sb, 0, 0, SLOT, ident, &l, &idf);
	for (uint32_t k = 0; k < 3; k++) {
		slabs[k].base = (const char *)arena + slabs[k].unit * PHDR_UNIT;
		pmeta_slab_write(sb, k, 0, slabs[k].unit * PHDR_UNIT,
				 (uint64_t)slabs[k].nslots * slabs[k].slot_bytes,
				 slabs[k].slot_bytes);
	}
	return sb;
}

static struct pmeta_hdr *hdr(void *meta, uint32_t k, uint32_t slot)
{
	return pmeta_hdr_at(meta,
			    slabs[k].unit + (uint64_t)slot * (slabs[k].slot_bytes / PHDR_UNIT));
}

static void put(void *meta, uint32_t k, uint32_t slot, uint16_t ns, uint32_t slot_bytes,
		uint8_t fill)
{
	struct pmeta_hdr h = {.ns = ns, .slot_bytes = slot_bytes, .len = slot_bytes, .gen = 9};
	uint8_t *p = arena + slabs[k].unit * PHDR_UNIT + (uint64_t)slot * slabs[k].slot_bytes;

	memset(p, fill, slot_bytes);
	memset(h.key.b, fill, sizeof(h.key.b));
	pmeta_hdr_seal(&h, p);
	*hdr(meta, k, slot) = h;
}

static void test_pagehdr_super(void **state)
{
	void *m;
	uint64_t size = pmeta_size(UNITS);

	(void)state;
	arena = calloc(1, ARENA);
	assert_non_null(arena);
	m = meta_new();
	assert_int_equal(pmeta_super_check(m, size), 0);
	assert_int_equal(pmeta_super_check(m, size + 4096), -EINVAL);
	for (uint32_t k = 0; k < 3; k++)
		assert_non_null(pmeta_slab_get(m, k));
	assert_null(pmeta_slab_get(m, 3));
	pmeta_slab_write(m, 3, 0, 2 * SLAB + PHDR_UNIT, SLAB, SLAB); /* past the arena's end */
	assert_null(pmeta_slab_get(m, 3));
	pmeta_slab_write(m, 4, 1, 0, SLOT, SLOT); /* no such arena */
	assert_null(pmeta_slab_get(m, 4));
	pmeta_slab_clear(m, 2);
	assert_null(pmeta_slab_get(m, 2));
	((uint8_t *)m)[20] ^= 1;
	assert_int_equal(pmeta_super_check(m, size), -EINVAL);
	free(m);
	free(arena);
}

static void test_pagehdr_scan_discards(void **state)
{
	void *m;
	uint64_t torn, kept;

	(void)state;
	arena = calloc(1, ARENA);
	assert_non_null(arena);
	m = meta_new();
	put(m, 0, 0, 0, SLOT, 1); /* kept */
	put(m, 0, 1, 0, SLOT, 2); /* payload changed after the seal: torn */
	arena[SLOT + 100] ^= 0xff;
	put(m, 0, 2, 0, SLOT, 3); /* header half written */
	hdr(m, 0, 2)->gen = 10;
	put(m, 0, 3, 5, SLOT, 4);	   /* unknown namespace */
	put(m, 0, 4, 0, 2 * SLOT, 5);	   /* disagrees with its slab's class */
	put(m, 0, 15, 0, SLOT, 6);	   /* the last slot of slab 0: kept */
	put(m, 1, 9, 0, 3 * PHDR_UNIT, 7); /* the last slot of the short slab: kept */
	put(m, 2, 0, 0, SLAB / 2, 8);	   /* one big slot: kept */
	kept = pmeta_scan(m, slabs, 3, &torn);
	assert_int_equal(kept, 4);
	assert_int_equal(torn, 1);
	assert_int_equal(slabs[0].kept, 2);
	assert_int_equal(slabs[1].kept, 1);
	assert_int_equal(slabs[2].kept, 1);
	assert_int_equal(hdr(m, 0, 0)->magic, PHDR_MAGIC);
	for (uint32_t j = 1; j <= 4; j++)
		assert_int_equal(hdr(m, 0, j)->magic, 0);
	assert_int_equal(hdr(m, 1, 9)->magic, PHDR_MAGIC);
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
