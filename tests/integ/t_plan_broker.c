// SPDX-License-Identifier: MIT
/*
 * t_plan_broker.c - [packing] `kvbctl plan` against a started broker: for Kimi-K2.5 pages
 * (4.29 MiB, MLA: one page for all TP ranks) at several pool sizes, a broker filled past
 * capacity holds what the planner says, within 1% (the arithmetic is the store's own, so in
 * practice exactly), and at least 98% of floor(pool / slot): the pool packs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

/* shared.host.pages from `kvbctl plan --json`. */
static uint64_t plan_pages(const char *pool)
{
	char args[256], *out = NULL, *p;
	unsigned long long pages = 0;

	snprintf(args, sizeof(args),
		 "plan --model kimi-k2.5 --tp 8 --gpu-tokens 1000 --host-ram %s --json", pool);
	CHECK_EQ(harness_run_tool("kvbctl", args, &out), 0);
	p = strstr(out, "\"shared\"");
	CHECKF(p != NULL, "no shared tier in: %s", out);
	p = strstr(p, "\"pages\":");
	CHECK(p != NULL && sscanf(p, "\"pages\":%llu", &pages) == 1);
	free(out);
	return pages;
}

static void one_pool(const char *pool, uint64_t pool_bytes)
{
	struct harness_broker *b = harness_broker_start("--pool", pool, "--no-prefault",
							"--copy-inline", "0");
	kvb_client *c = harness_connect(b, "t_plan_broker", 0);
	uint64_t want = plan_pages(pool), held, ideal;
	struct kvb_layout l;
	uint32_t ns;
	size_t pb;
	uint8_t *page;

	harness_layout(&l, "moonshotai/Kimi-K2.5", KVB_LAYOUT_MLA, 64, 1, 0, 61, 1152);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, 4497408);
	ideal = pool_bytes / harness_slot_bytes(pb);
	page = malloc(pb);
	CHECK(page != NULL);
	memset(page, 0x5a, pb);
	for (uint64_t i = 0; i < want + want / 10 + 2; i++) {
		kvb_key k = harness_key(9, i);

		CHECK_RC(kvb_put(c, ns, k, page, pb), 0);
	}
	held = harness_stat(c, "pool.pages");
	harness_log("--pool %s: broker holds %llu Kimi-K2.5 pages, plan says %llu, ideal %llu",
		    pool, (unsigned long long)held, (unsigned long long)want,
		    (unsigned long long)ideal);
	CHECKF(held * 100 >= want * 99 && held * 100 <= want * 101,
	       "broker %llu vs plan %llu pages", (unsigned long long)held,
	       (unsigned long long)want);
	CHECKF(held * 100 >= ideal * 98, "packing: %llu of %llu pages", (unsigned long long)held,
	       (unsigned long long)ideal);
	free(page);
	kvb_close(c);
	harness_broker_stop(b);
}

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	one_pool("64M", 64ull << 20);
	one_pool("300M", 300ull << 20);
	one_pool("1G", 1ull << 30);
	return 0;
}
