// SPDX-License-Identifier: MIT
/*
 * test_ns.c - namespace identity (MLA shared across TP ranks, MHA per rank, tenants and every
 * layout field separate), the namespace table, and page part offsets of multi-component layouts.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "ns.h"

static struct kvb_layout mla(uint32_t tp_size, uint32_t tp_rank)
{
	struct kvb_layout l;

	memset(&l, 0, sizeof(l));
	strcpy(l.model, "kimi-k2.5");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = 64;
	l.tp_size = tp_size;
	l.tp_rank = tp_rank;
	l.ncomponents = 1;
	strcpy(l.comp[0].name, "kv");
	l.comp[0].num_layers = 61;
	l.comp[0].bytes_per_token_layer = 1152;
	return l;
}

static int same(const struct kvb_layout *a, uint32_t ta, const struct kvb_layout *b, uint32_t tb)
{
	uint8_t x[32], y[32];

	ns_identity(a, ta, x);
	ns_identity(b, tb, y);
	return !memcmp(x, y, sizeof(x));
}

static void test_ns_identity_rules(void **state)
{
	struct kvb_layout a = mla(8, 0), b = mla(8, 5), c = mla(4, 1), d;

	(void)state;
	/* MLA: every rank, any TP size, one namespace. */
	assert_true(same(&a, 0, &b, 0));
	assert_true(same(&a, 0, &c, 0));
	/* Tenants never share. */
	assert_false(same(&a, 0, &a, 1));
	/* MHA: per rank. */
	a.kind = b.kind = KVB_LAYOUT_MHA;
	assert_false(same(&a, 0, &b, 0));
	d = a;
	assert_true(same(&a, 0, &d, 0));
	/* Each layout field is part of the identity. */
	d = mla(8, 0);
	d.tokens_per_page = 32;
	a = mla(8, 0);
	assert_false(same(&a, 0, &d, 0));
	d = mla(8, 0);
	d.comp[0].num_layers = 60;
	assert_false(same(&a, 0, &d, 0));
	d = mla(8, 0);
	strcpy(d.model, "kimi-k2.6");
	assert_false(same(&a, 0, &d, 0));
	d = mla(8, 0);
	d.ncomponents = 2;
	strcpy(d.comp[1].name, "indexer");
	d.comp[1].num_layers = 61;
	d.comp[1].bytes_per_token_layer = 132;
	assert_false(same(&a, 0, &d, 0));
}

static void test_ns_table_and_parts(void **state)
{
	static struct ns_table t;
	struct pool p;
	static struct store s;
	struct kvb_layout l = mla(8, 0), r3 = mla(8, 3), big = mla(1, 0);
	struct ns *n, *m;
	char name[64];

	(void)state;
	snprintf(name, sizeof(name), "/kvb-test-ns-%d", (int)getpid());
	assert_int_equal(pool_open(&p, name, 64u << 20, 1), 0);
	assert_int_equal(store_init(&s, &p, 8u << 20, 1.0, 1.0), 0);
	l.ncomponents = 2;
	strcpy(l.comp[1].name, "indexer");
	l.comp[1].num_layers = 61;
	l.comp[1].bytes_per_token_layer = 132;
	r3.ncomponents = 2;
	r3.comp[1] = l.comp[1];
	assert_int_equal(ns_open(&t, &s, &l, 0, &n), 0);
	assert_int_equal(ns_open(&t, &s, &r3, 0, &m), 0);
	assert_ptr_equal(n, m);
	assert_int_equal(t.count, 1);
	assert_int_equal(n->page_bytes, 64ull * 61 * (1152 + 132));
	assert_int_equal(n->nparts, 122);
	/* [component][layer][token][bytes]: indexer layer 0 starts after all main layers. */
	assert_int_equal(n->part_off[1], 64 * 1152);
	assert_int_equal(n->part_off[61], 61ull * 64 * 1152);
	assert_int_equal(n->part_off[62], 61ull * 64 * 1152 + 64 * 132);
	assert_int_equal(n->part_layer[62], 1);
	assert_int_equal(n->part_bpt[62], 132);
	/* A page larger than a slab is refused; malformed layouts too. */
	big.comp[0].bytes_per_token_layer = 1u << 20;
	assert_int_equal(ns_open(&t, &s, &big, 0, &m), -E2BIG);
	big = mla(1, 0);
	big.tp_rank = 1;
	assert_int_equal(ns_open(&t, &s, &big, 0, &m), -EINVAL);
	assert_int_equal(t.count, 1);
	ns_table_fini(&t);
	store_fini(&s);
	pool_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_ns_identity_rules),
		cmocka_unit_test(test_ns_table_and_parts),
	};

	return cmocka_run_group_tests_name("ns", tests, NULL, NULL);
}
