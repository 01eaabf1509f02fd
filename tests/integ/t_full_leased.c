// SPDX-License-Identifier: MIT
/*
 * t_full_leased.c - a pool full of leased pages cannot evict anything: the next PUT must fail
 * with -ENOSPC at once (well under a second; no waiting for space that will never come), from
 * this client and from another, while GET, LOOKUP, NOP and stats keep working. Releasing a few
 * leases makes PUTs succeed again.
 *
 * Run twice: first with the watermarks at 100% (only a PUT that finds no free slot evicts), then
 * with the defaults (95/90), where the watermark evictor also runs. In both the pool must reach
 * the point where every page is leased: a page that a PUT has just stored must still be there
 * for the ACQUIRE that follows it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MAXPAGES 200
#define SEED 4711

static void run(const char *high, const char *low)
{
	struct harness_broker *b;
	struct kvb_layout l;
	static struct kvb_lease leases[MAXPAGES];
	kvb_client *c, *c2;
	uint32_t ns, ns2;
	size_t pb, hits;
	uint8_t *page;
	int n = 0, rc;
	uint64_t t0, dt, worst = 0;
	kvb_key k;
	char *json;

	if (high)
		b = harness_broker_start("--pool", "64M", "--max-leases", "100000",
					 "--max-lease-bytes", "100%", "--max-pinned", "100",
					 "--high-watermark", high, "--low-watermark", low);
	else
		b = harness_broker_start("--pool", "64M", "--max-leases", "100000",
					 "--max-lease-bytes", "100%", "--max-pinned", "100");
	c = harness_connect(b, "t_full_leased", 0);
	harness_layout(&l, "test/full", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024); /* 1 MiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	page = malloc(pb);
	CHECK(page != NULL);

	/* Fill: put and lease every page until the pool says no. */
	for (;;) {
		CHECKF(n < MAXPAGES, "%d pages of 1 MiB stored and leased in a 64 MiB pool", n);
		k = harness_key(SEED, (uint64_t)n);
		harness_fill(page, pb, &k, SEED);
		t0 = harness_now_ns();
		rc = kvb_put(c, ns, k, page, pb);
		dt = harness_now_ns() - t0;
		if (rc == -ENOSPC)
			break;
		CHECKF(rc == 0, "put %d: %d (%s)", n, rc, harness_strerror(rc));
		rc = kvb_acquire(c, ns, k, &leases[n]);
		if (rc) {
			printf("stats: %s\n", json = harness_stats(c));
			free(json);
		}
		CHECKF(rc == 0,
		       "acquire of page %d right after its put returned 0: %d (%s); watermarks "
		       "%s/%s "
		       "(evicted as the only unleased page?)",
		       n, rc, harness_strerror(rc), high ? high : "default", low ? low : "default");
		n++;
	}
	harness_log("pool full after %d leased pages; the refused put took %llu us", n,
		    (unsigned long long)dt / 1000);
	CHECK_GE(n, 32);
	CHECK_LE(n, 64);
	CHECKF(dt < 250000000ull, "-ENOSPC took %llu ms", (unsigned long long)dt / 1000000);

	/* Refused again and again, promptly; nothing was half-stored. */
	for (int i = 0; i < 20; i++) {
		k = harness_key(SEED + 1, (uint64_t)i);
		t0 = harness_now_ns();
		CHECK_RC(kvb_put(c, ns, k, page, pb), -ENOSPC);
		dt = harness_now_ns() - t0;
		worst = dt > worst ? dt : worst;
		CHECK_OK(kvb_lookup(c, ns, &k, 1, &hits));
		CHECK_EQ(hits, 0);
	}
	harness_log("20 more refused puts, the slowest %llu us", (unsigned long long)worst / 1000);
	CHECKF(worst < 250000000ull, "-ENOSPC took %llu ms", (unsigned long long)worst / 1000000);

	/* Everything else still works, for this client and another. */
	CHECK_OK(kvb_nop(c));
	k = harness_key(SEED, 3);
	CHECK_RC(kvb_get(c, ns, k, page, pb), (long long)pb);
	CHECK(harness_verify(page, pb, &k, SEED, "leased page while full") == 0);
	c2 = harness_connect(b, "second", 0);
	CHECK_OK(kvb_ns_open(c2, &l, &ns2, &pb));
	CHECK_EQ(ns2, ns);
	k = harness_key(SEED + 2, 0);
	harness_fill(page, pb, &k, SEED);
	t0 = harness_now_ns();
	CHECK_RC(kvb_put(c2, ns2, k, page, pb), -ENOSPC);
	CHECKF(harness_now_ns() - t0 < 250000000ull, "-ENOSPC for a second client took %llu ms",
	       (unsigned long long)(harness_now_ns() - t0) / 1000000);
	/* A PUT of a key that is already stored needs no room. */
	k = harness_key(SEED, 7);
	harness_fill(page, pb, &k, SEED);
	CHECK_RC(kvb_put(c2, ns2, k, page, pb), 1);

	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "leases"), n);
	CHECK_EQ(harness_stat_u64(json, "pool.pages"), n);
	CHECK_EQ(harness_stat_u64(json, "counters.evictions"), 0);
	CHECK_GE(harness_stat_u64(json, "counters.errors"), 21);
	free(json);

	/* Release five: puts work again, by evicting the released pages. */
	for (int i = 0; i < 5; i++)
		CHECK_OK(kvb_release(c, &leases[i]));
	for (int i = 0; i < 10; i++) {
		k = harness_key(SEED + 3, (uint64_t)i);
		harness_fill(page, pb, &k, SEED + 3);
		CHECK_RC(kvb_put(i % 2 ? c2 : c, ns, k, page, pb), 0);
		CHECK_RC(kvb_get(c, ns, k, page, pb), (long long)pb);
		CHECK(harness_verify(page, pb, &k, SEED + 3, "put after release") == 0);
	}
	CHECK_GE(harness_stat(c, "counters.evictions"), 5);
	/* The still-leased pages were not touched. */
	for (int i = 5; i < n; i++) {
		k = harness_key(SEED, (uint64_t)i);
		CHECK(harness_verify(leases[i].data, pb, &k, SEED, "still leased") == 0);
		CHECK_OK(kvb_release(c, &leases[i]));
	}
	CHECK_EQ(harness_stat(c, "leases"), 0);

	free(page);
	kvb_close(c2);
	kvb_close(c);
	harness_broker_stop(b);
}

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	harness_log("watermarks 100/100: a PUT evicts only when it finds no free slot");
	run("100", "100");
	harness_log("default watermarks");
	run(NULL, NULL);
	return H_PASS;
}
