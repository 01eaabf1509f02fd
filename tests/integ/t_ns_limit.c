// SPDX-License-Identifier: MIT
/*
 * t_ns_limit.c - --ns-limit MODEL=SIZE|N% caps one model's namespaces: in a 64 MiB
 * pool of 1 MiB pages, a model capped at 8M (then at 25%) that PUTs 40 pages keeps at most 8
 * (16) of them, its newest, evicting only its own, while an uncapped model's 20 pages, stored
 * first and never touched again (the coldest in the pool), all stay. Another namespace of the
 * capped model (the other tp rank of an MHA layout) has a cap of its own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SEED 4242

static int present(kvb_client *c, uint32_t ns, uint64_t seed, int n)
{
	int found = 0;

	for (int i = 0; i < n; i++) {
		kvb_key k = harness_key(seed, (uint64_t)i);
		size_t hits;

		CHECK_OK(kvb_lookup(c, ns, &k, 1, &hits));
		found += (int)hits;
	}
	return found;
}

static void run(const char *limit, int cap)
{
	struct harness_broker *b = harness_broker_start("--pool", "64M", "--ns-limit", limit);
	kvb_client *c = harness_connect(b, "t_ns_limit", 0);
	struct kvb_layout l;
	uint32_t free_ns, capped, capped1;
	uint8_t *page;
	size_t pb;

	harness_layout(&l, "test/free", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &free_ns, &pb));
	harness_layout(&l, "test/capped", KVB_LAYOUT_MHA, 64, 2, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &capped, &pb));
	harness_layout(&l, "test/capped", KVB_LAYOUT_MHA, 64, 2, 1, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &capped1, &pb));
	CHECK_EQ(pb, 1 << 20);
	page = malloc(pb);
	CHECK(page != NULL);
	for (int i = 0; i < 20; i++) {
		kvb_key k = harness_key(SEED, (uint64_t)i);

		harness_fill(page, pb, &k, SEED);
		CHECK_RC(kvb_put(c, free_ns, k, page, pb), 0);
	}
	for (int i = 0; i < 40; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		harness_fill(page, pb, &k, SEED + 1);
		CHECK_RC(kvb_put(c, capped, k, page, pb), 0);
		CHECK_LE(present(c, capped, SEED + 1, i + 1), cap);
	}
	for (int i = 0; i < 4; i++) {
		kvb_key k = harness_key(SEED + 2, (uint64_t)i);

		CHECK_RC(kvb_put(c, capped1, k, page, pb), 0);
	}
	harness_log("%s: capped model keeps %d of 40, rank 1 %d of 4, free model %d of 20", limit,
		    present(c, capped, SEED + 1, 40), present(c, capped1, SEED + 2, 4),
		    present(c, free_ns, SEED, 20));
	CHECK_EQ(present(c, capped, SEED + 1, 40), cap);
	CHECK_EQ(present(c, capped1, SEED + 2, 4), 4);
	CHECK_EQ(present(c, free_ns, SEED, 20), 20);
	/* Its newest pages, byte-exact. */
	for (int i = 40 - cap; i < 40; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		CHECK_RC(kvb_get(c, capped, k, page, pb), (int)pb);
		CHECK(harness_verify(page, pb, &k, SEED + 1, "capped page") == 0);
	}
	free(page);
	kvb_close(c);
	harness_broker_stop(b);
}

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	run("test/capped=8M", 8);
	run("test/capped=25%", 16);
	return H_PASS;
}
