// SPDX-License-Identifier: MIT
/*
 * test_index.c - the (namespace, key) hash table: keys that collide in the bucket hash are told
 * apart by all 32 bytes and the namespace, removal from the middle of a chain, and growth.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "index.h"
#include "store.h"

static void test_index_collisions_and_remove(void **state)
{
	struct index ix;
	struct page p[3];

	(void)state;
	memset(p, 0, sizeof(p));
	assert_int_equal(index_init(&ix, 1), 0);
	/* Same first 8 bytes (same bucket), different tails. */
	for (int i = 0; i < 3; i++) {
		memset(p[i].key.b, 0xab, sizeof(p[i].key.b));
		p[i].key.b[31] = (uint8_t)i;
		p[i].ns = 1;
		index_insert(&ix, &p[i].ixn);
	}
	for (int i = 0; i < 3; i++)
		assert_ptr_equal(index_find(&ix, 1, &p[i].key), &p[i].ixn);
	assert_null(index_find(&ix, 2, &p[0].key));
	index_remove(&ix, &p[1].ixn);
	assert_null(index_find(&ix, 1, &p[1].key));
	assert_ptr_equal(index_find(&ix, 1, &p[0].key), &p[0].ixn);
	assert_ptr_equal(index_find(&ix, 1, &p[2].key), &p[2].ixn);
	assert_int_equal(ix.count, 2);
	index_fini(&ix);
}

static void test_index_grows(void **state)
{
	enum { N = 20000 };
	struct page *p = calloc(N, sizeof(*p));
	struct index ix;

	(void)state;
	assert_non_null(p);
	assert_int_equal(index_init(&ix, 1), 0);
	assert_int_equal(ix.mask + 1, 1024);
	for (uint32_t i = 0; i < N; i++) {
		for (int j = 0; j < 8; j++)
			p[i].key.b[j] = (uint8_t)(i * 2654435761u >> (j * 4));
		memcpy(p[i].key.b + 8, &i, sizeof(i));
		p[i].ns = i % 3;
		index_insert(&ix, &p[i].ixn);
	}
	assert_true(ix.mask + 1 >= N / 2);
	for (uint32_t i = 0; i < N; i++)
		assert_ptr_equal(index_find(&ix, i % 3, &p[i].key), &p[i].ixn);
	index_fini(&ix);
	free(p);
}

static void key_i(kvb_key *k, uint32_t i)
{
	for (int j = 0; j < 8; j++)
		k->b[j] = (uint8_t)(i * 2654435761u >> (j * 4));
	memcpy(k->b + 8, &i, sizeof(i));
}

/*
 * [rehash] The doubling moves a few buckets per insert and remove: right after it starts most
 * entries are still in the old array, and every one is found, removed and found missing
 * wherever it is, until the old array is gone.
 */
static void test_index_grows_incrementally(void **state)
{
	enum { N = 6000 };
	struct page *p = calloc(N, sizeof(*p));
	struct index ix;
	uint32_t i, grew = 0;

	(void)state;
	assert_non_null(p);
	assert_int_equal(index_init(&ix, 1), 0);
	for (i = 0; i < N; i++) {
		key_i(&p[i].key, i);
		p[i].ns = i % 3;
		index_insert(&ix, &p[i].ixn);
		if (ix.old && !grew) {
			grew = i;
			assert_int_equal(ix.moved, 0);
			assert_int_equal(ix.mask + 1, 2 * (ix.old_mask + 1));
		} else if (grew && i == grew + 1) {
			/* One insert's step: a few buckets, not the whole array. */
			assert_true(ix.moved > 0 && ix.moved <= 64);
		}
		if (grew && i == grew + 10)
			break;
	}
	assert_true(grew > 0);
	assert_non_null(ix.old); /* mid-way */
	for (uint32_t j = 0; j <= i; j++)
		assert_ptr_equal(index_find(&ix, j % 3, &p[j].key), &p[j].ixn);
	/* Removes from both arrays, each a step too. */
	for (uint32_t j = 0; j <= i; j += 3)
		index_remove(&ix, &p[j].ixn);
	for (uint32_t j = 0; j <= i; j++)
		assert_ptr_equal(index_find(&ix, j % 3, &p[j].key), j % 3 ? &p[j].ixn : NULL);
	for (i++; i < N && ix.old; i++) {
		key_i(&p[i].key, i);
		p[i].ns = i % 3;
		index_insert(&ix, &p[i].ixn);
	}
	assert_null(ix.old); /* moved over, the old array freed */
	assert_int_equal(ix.moved, ix.old_mask + 1);
	for (uint32_t j = 0; j < i; j++)
		assert_ptr_equal(index_find(&ix, j % 3, &p[j].key),
				 j % 3 || j > grew + 10 ? &p[j].ixn : NULL);
	index_fini(&ix);
	free(p);
}

/* Regression (hash flooding): keys that agree in 24 of 32 bytes must still spread out. */
static void test_index_hash_uses_every_byte(void **state)
{
	static uint8_t used[1024];
	struct index ix;
	uint32_t buckets = 0;

	(void)state;
	assert_int_equal(index_init(&ix, 1), 0);
	for (uint64_t i = 0; i < 4096; i++) {
		kvb_key k;

		memset(k.b, 0x11, sizeof(k.b));
		memcpy(k.b + 24, &i, sizeof(i));
		used[index_hash(&ix, 7, &k) & ix.mask] = 1;
	}
	for (int i = 0; i < 1024; i++)
		buckets += used[i];
	assert_true(buckets > 900); /* ~1006 expected for a uniform hash */
	index_fini(&ix);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_index_collisions_and_remove),
		cmocka_unit_test(test_index_grows),
		cmocka_unit_test(test_index_grows_incrementally),
		cmocka_unit_test(test_index_hash_uses_every_byte),
	};

	return cmocka_run_group_tests_name("index", tests, NULL, NULL);
}
