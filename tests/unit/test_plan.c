// SPDX-License-Identifier: MIT
/*
 * test_plan.c - the capacity planner's arithmetic (common/plan.c) against hand-computed cases:
 * Kimi-K2.5 at TP=8 (the case: MLA sharing multiplies host capacity by 8), GQA split
 * and replicated across ranks, a GPU budget from memory and mem-fraction, 4 KiB slot rounding,
 * and the inputs it refuses.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "plan.h"

#define GiB (1024ull * 1024 * 1024)

/*
 * Kimi-K2.5, TP=8, 116,171 GPU tokens, 300 GiB host RAM, 4,096-token requests, 64-token pages.
 *   per rank and token: 61 x 576 x 2 = 70,272 B; a page 64 x 70,272 = 4,497,408 B (4 KiB x 1098)
 *   private: 300 GiB / 8 = 40,265,318,400 B per rank -> 8,953 pages -> 572,992 tokens
 *   shared:  322,122,547,200 B -> 71,624 pages -> 4,583,936 tokens (8 x)
 *   requests: GPU 116,171 / 4,096 = 28; private (116,171 + 572,992) / 4,096 = 168;
 *   shared (116,171 + 4,583,936) / 4,096 = 1,147
 */
static void test_plan_kimi_mla_shares_across_ranks(void **state)
{
	struct plan_in in = {.tp = 8,
			     .gpu_tokens = 116171,
			     .host_bytes = 300 * GiB,
			     .req_tokens = 4096,
			     .page_tokens = 64};
	struct plan_out o;

	(void)state;
	assert_non_null(plan_preset("Kimi-K2.5"));
	in.m = *plan_preset("kimi-k2.5");
	assert_int_equal(plan_compute(&in, &o), 0);
	assert_int_equal(o.bytes_token_rank, 70272);
	assert_int_equal(o.bytes_token_engine, 8 * 70272);
	assert_int_equal(o.bytes_token_unique, 70272);
	assert_int_equal(o.share, 8);
	assert_int_equal(o.slot_bytes, 4497408);
	assert_int_equal(o.gpu.tokens, 116171);
	assert_int_equal(o.gpu.requests, 28);
	assert_int_equal(o.priv_host.pages, 8 * 8953);
	assert_int_equal(o.priv_host.tokens, 572992);
	assert_int_equal(o.priv_host.requests, 139);
	assert_int_equal(o.shared_host.pages, 71624);
	assert_int_equal(o.shared_host.tokens, 4583936);
	assert_int_equal(o.shared_host.requests, 1119);
	assert_int_equal(o.priv_requests, 168);
	assert_int_equal(o.shared_requests, 1147);
	assert_true(o.host_gain > 7.999 && o.host_gain < 8.001);
	assert_int_equal(o.shared_disk.tokens, 0);
}

/*
 * Llama-3.1-70B (GQA, 80 layers, 8 KV heads of 128, bf16) at TP=4: 2 heads per rank,
 * 80 x 2 x 2 x 128 x 2 = 81,920 B per token and rank, a page 5 MiB. GPU: 80 GB x 0.9 -
 * 141.1 GB / 4 = 36.725 GB -> 448,303 tokens. Host 256 GiB: 64 GiB per rank -> 13,107 pages
 * -> 838,848 tokens, the same for a shared pool (MHA ranks hold different heads). Disk 1 TiB:
 * 256 GiB per rank -> 52,428 pages -> 3,355,392 tokens.
 */
static void test_plan_gqa_gains_nothing_across_ranks(void **state)
{
	struct plan_in in = {.tp = 4,
			     .gpu_bytes = 80000000000ull,
			     .mem_fraction = 0.9,
			     .host_bytes = 256 * GiB,
			     .disk_bytes = 1024 * GiB,
			     .req_tokens = 8192,
			     .page_tokens = 64};
	struct plan_out o;

	(void)state;
	in.m = *plan_preset("llama-3.1-70b");
	assert_int_equal(plan_compute(&in, &o), 0);
	assert_int_equal(o.heads_rank, 2);
	assert_int_equal(o.bytes_token_rank, 81920);
	assert_int_equal(o.bytes_token_unique, 4 * 81920);
	assert_int_equal(o.share, 1);
	assert_int_equal(o.slot_bytes, 5u << 20);
	assert_int_equal(o.gpu.tokens, 448303);
	assert_int_equal(o.gpu.requests, 54);
	assert_int_equal(o.priv_host.tokens, 838848);
	assert_int_equal(o.shared_host.tokens, 838848);
	assert_int_equal(o.shared_host.pages, 4 * 13107);
	assert_int_equal(o.priv_disk.tokens, 3355392);
	assert_int_equal(o.shared_disk.tokens, 3355392);
	assert_int_equal(o.priv_requests, (448303 + 838848 + 3355392) / 8192);
	assert_true(o.host_gain > 0.999 && o.host_gain < 1.001);
}

/* TP above the KV head count replicates heads: one head per rank, 32 x 2 x 128 x 2 B. */
static void test_plan_gqa_replicated_heads(void **state)
{
	struct plan_in in = {.tp = 16, .gpu_tokens = 1000, .req_tokens = 100, .page_tokens = 16};
	struct plan_out o;

	(void)state;
	in.m = *plan_preset("llama-3.1-8b");
	assert_int_equal(plan_compute(&in, &o), 0);
	assert_int_equal(o.heads_rank, 1);
	assert_int_equal(o.bytes_token_rank, 16384);
	assert_int_equal(o.gpu.requests, 10);
}

/* An explicit MLA model whose page is not 4 KiB-aligned: 3 x 100 x 1 x 16 = 4,800 B -> 8 KiB. */
static void test_plan_explicit_model_slot_rounding(void **state)
{
	struct plan_in in = {.m = {.name = "x",
				   .attn = PLAN_MLA,
				   .layers = 3,
				   .latent_dim = 100,
				   .dtype_bytes = 1},
			     .tp = 2,
			     .gpu_tokens = 64,
			     .host_bytes = 2u << 20, /* the broker's arenas are 2 MiB multiples */
			     .req_tokens = 32,
			     .page_tokens = 16};
	struct plan_out o;

	(void)state;
	assert_int_equal(plan_compute(&in, &o), 0);
	assert_int_equal(o.slot_bytes, 8192);
	assert_int_equal(o.priv_host.pages, 2 * 128); /* 1 MiB per rank / 8 KiB */
	assert_int_equal(o.priv_host.tokens, 128 * 16);
	assert_int_equal(o.shared_host.pages, 256);
	assert_int_equal(o.shared_host.tokens, 256 * 16);
	assert_int_equal(o.shared_requests, (64 + 4096) / 32);
}

/*
 * [packing] The pool holds at least 98% of floor(pool / page) pages for every page size from
 * 4 KiB to 16 MiB and every pool from 64 MiB up (the store's own fill test holds the store to
 * these figures).
 */
static void test_plan_pool_packs(void **state)
{
	static const uint64_t pages[] = {4096,	    5000,      16384,	 100000,   1u << 20,
					 3u << 20,  4497408,   5u << 20, 7u << 20, 9u << 20,
					 12u << 20, 15u << 20, 16u << 20};
	static const uint64_t pools[] = {64ull << 20,  66ull << 20, 100ull << 20, 250ull << 20,
					 1ull << 30,   3ull << 30,  10ull << 30,  100ull << 30,
					 300ull << 30, 1ull << 40,  2ull << 40};

	(void)state;
	for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++) {
		for (size_t j = 0; j < sizeof(pages) / sizeof(pages[0]); j++) {
			uint64_t slot = (pages[j] + 4095) / 4096 * 4096;
			uint64_t got = plan_pool_pages(pools[i], 1, 0, pages[j]);
			uint64_t ideal = pools[i] / slot, slab = plan_default_slab(pools[i]);

			if (got * 100 < ideal * 98)
				fail_msg("pool %llu page %llu: %llu of %llu",
					 (unsigned long long)pools[i], (unsigned long long)pages[j],
					 (unsigned long long)got, (unsigned long long)ideal);
			/* Full slabs stay few enough for 12-bit slab ids, with room for short ones. */
			assert_true(pools[i] / slab <= PLAN_SLABS_DEFAULT_MAX);
		}
	}
}

static void test_plan_refuses_bad_input(void **state)
{
	struct plan_in in = {.tp = 8, .gpu_tokens = 1, .req_tokens = 1, .page_tokens = 64};
	struct plan_out o;

	(void)state;
	assert_null(plan_preset("no-such-model"));
	in.m = *plan_preset("deepseek-v3");
	assert_int_equal(plan_compute(&in, &o), 0);
	in.tp = 0;
	assert_int_equal(plan_compute(&in, &o), -EINVAL);
	in.tp = 8;
	in.req_tokens = 0;
	assert_int_equal(plan_compute(&in, &o), -EINVAL);
	in.req_tokens = 1;
	in.m.attn = 7;
	assert_int_equal(plan_compute(&in, &o), -EINVAL);
	/* The weights alone exceed the GPU budget: 689 GB / 8 > 80 GB x 0.9. */
	in.m = *plan_preset("deepseek-v3");
	in.gpu_tokens = 0;
	in.gpu_bytes = 80000000000ull;
	in.mem_fraction = 0.9;
	assert_int_equal(plan_compute(&in, &o), -EINVAL);
	in.mem_fraction = 1.5;
	assert_int_equal(plan_compute(&in, &o), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_plan_kimi_mla_shares_across_ranks),
		cmocka_unit_test(test_plan_pool_packs),
		cmocka_unit_test(test_plan_gqa_gains_nothing_across_ranks),
		cmocka_unit_test(test_plan_gqa_replicated_heads),
		cmocka_unit_test(test_plan_explicit_model_slot_rounding),
		cmocka_unit_test(test_plan_refuses_bad_input),
	};

	return cmocka_run_group_tests_name("plan", tests, NULL, NULL);
}
