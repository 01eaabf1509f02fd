// SPDX-License-Identifier: MIT
/*
 * test_ns.c - namespace identity (MLA shared across TP ranks, MHA per rank, tenants and every
 * layout field separate), the namespace table, and page part offsets of multi-component layouts;
 * the ABI 1.2 identity fields (struct kvb_ns_ident): the default keeps every 1.1 identity (a
 * golden value: pages on disk are found by it), dtype, page format, pp and cp separate, dp and
 * (for MLA) tp do not, and malformed fields are refused.
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
#include "proto.h"

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

static int same2(const struct kvb_layout *a, const struct kvb_ns_ident *ia,
		 const struct kvb_layout *b, const struct kvb_ns_ident *ib)
{
	uint8_t x[32], y[32];

	ns_identity2(a, ia, 0, x);
	ns_identity2(b, ib, 0, y);
	return !memcmp(x, y, sizeof(x));
}

static void test_ns_ident_fields(void **state)
{
	/*
	 * ns_identity(mla(8, 0), tenant 0) as ABI 1.0 defined it: sha256("kvb-ns-v1" NUL, le32(tenant,
	 * kind, tpp, ncomponents) name[16] le32(layers, bpt) model[64]), checked with Python.
	 */
	static const char golden[] =
		"6a88e28252a8cb3172fc5b18e9bf14c1457849dc5791e0106e13b1a946259cb3";
	struct kvb_layout a = mla(8, 0), b = mla(8, 5), h0 = mla(8, 0), h1 = mla(8, 1);
	struct kvb_ns_ident z = {0}, i, j;
	uint8_t x[32];
	char hex[65];

	(void)state;
	ns_identity(&a, 0, x);
	for (int k = 0; k < 32; k++)
		snprintf(hex + 2 * k, 3, "%02x", x[k]);
	assert_string_equal(hex, golden);
	/* The default, however spelled, is the 1.1 identity; dp never matters. */
	assert_true(same2(&a, NULL, &a, &z));
	i = z;
	i.pp_size = i.cp_size = i.dp_size = 1;
	assert_true(same2(&a, NULL, &a, &i));
	i.dp_size = 4;
	i.dp_rank = 3;
	assert_true(same2(&a, NULL, &a, &i));
	assert_true(kvb_ident_is_default(&i));
	/* dtype: fp16 and bf16 differ, and stating one differs from not stating it. */
	i = z;
	i.dtype[0] = KVB_DTYPE_FP16;
	j = z;
	j.dtype[0] = KVB_DTYPE_BF16;
	assert_false(kvb_ident_is_default(&i));
	assert_false(same2(&a, &i, &a, &j));
	assert_false(same2(&a, &i, &a, NULL));
	/* MLA stays shared across TP ranks with any identity; dp replicas share too. */
	j = i;
	j.dp_size = 2;
	j.dp_rank = 1;
	assert_true(same2(&a, &i, &b, &j));
	/* pp rank, pp size, cp rank, page format separate, MLA included. */
	j = i;
	j.pp_size = 2;
	assert_false(same2(&a, &i, &a, &j));
	i.pp_size = 2;
	j.pp_rank = 1;
	assert_false(same2(&a, &i, &a, &j));
	j = i;
	j.cp_size = 2;
	j.cp_rank = 1;
	assert_false(same2(&a, &i, &a, &j));
	j = i;
	strcpy(j.page_format, "sglang:page_first");
	assert_false(same2(&a, &i, &a, &j));
	/* MHA: tp ranks still separate with identity fields. */
	h0.kind = h1.kind = KVB_LAYOUT_MHA;
	assert_false(same2(&h0, &i, &h1, &i));
	assert_true(same2(&h0, &i, &h0, &i));

	/* Validation. */
	assert_int_equal(kvb_ident_check(&a, &z), 0);
	assert_int_equal(kvb_ident_check(&a, &i), 0);
	j = z;
	j.pp_rank = 1; /* pp_size 0 means 1 */
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.cp_size = 2;
	j.cp_rank = 2;
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.dp_size = 1;
	j.dp_rank = 1;
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.dtype[1] = KVB_DTYPE_BF16; /* a has one component */
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.dtype[0] = KVB_DTYPE__COUNT;
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.flags = 1;
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.resv[4] = 1;
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	strcpy(j.page_format, "has space");
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	j.page_format[5] = 'x'; /* garbage after the NUL */
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
	j = z;
	memset(j.page_format, 'a', sizeof(j.page_format)); /* not terminated */
	assert_int_equal(kvb_ident_check(&a, &j), -EINVAL);
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
		cmocka_unit_test(test_ns_ident_fields),
		cmocka_unit_test(test_ns_table_and_parts),
	};

	return cmocka_run_group_tests_name("ns", tests, NULL, NULL);
}
