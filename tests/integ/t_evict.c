// SPDX-License-Identifier: MIT
/*
 * t_evict.c - eviction under pressure in a 64 MiB pool of 1 MiB pages. Writing 200 pages into
 * room for about 60 must succeed every time (PUT evicts the coldest unleased pages), leave
 * exactly the most recently used pages (LRU by last PUT/GET/ACQUIRE: a page read late in the run
 * survives although it was written early), all byte-exact, and count evictions. A page leased
 * before the run survives all of it, readable through its lease; once released it is evictable
 * like any other.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NPUT 200
#define TOUCH_AT 180 /* while putting key 180 ... */
#define TOUCHED 140  /* ... read key 140, making it newer than keys 141..180 */
#define SEED 31337

static kvb_key keys[NPUT + 100], leased_key;

static int present(kvb_client *c, uint32_t ns, const kvb_key *k)
{
	size_t hits = 99;

	CHECK_OK(kvb_lookup(c, ns, k, 1, &hits));
	CHECK(hits <= 1);
	return (int)hits;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c;
	uint32_t ns;
	size_t pb;
	uint8_t *page;
	char *json;
	uint64_t pages, evictions, total;
	int order[NPUT], norder = 0, npresent = 0, is_present[NPUT];

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "t_evict", 0);
	harness_layout(&l, "test/evict", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024); /* 1 MiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, 1 << 20);
	page = malloc(pb);
	CHECK(page != NULL);
	for (int i = 0; i < NPUT + 100; i++)
		keys[i] = harness_key(SEED, (uint64_t)i);
	leased_key = harness_key(SEED, 1000000);

	/* The first page, leased for the whole run. */
	harness_fill(page, pb, &leased_key, SEED);
	CHECK_RC(kvb_put(c, ns, leased_key, page, pb), 0);
	CHECK_OK(kvb_acquire(c, ns, leased_key, &lease));

	for (int i = 0; i < NPUT; i++) {
		harness_fill(page, pb, &keys[i], SEED);
		CHECKF(kvb_put(c, ns, keys[i], page, pb) == 0, "put %d of %d failed under pressure",
		       i, NPUT);
		if (i == TOUCH_AT) {
			int rc = kvb_get(c, ns, keys[TOUCHED], page, pb);

			CHECKF(rc == (int)pb,
			       "key %d should still be stored when key %d is put: get %d (%s)",
			       TOUCHED, TOUCH_AT, rc, harness_strerror(rc));
			CHECK(harness_verify(page, pb, &keys[TOUCHED], SEED, "touched page") == 0);
		}
	}
	/* Recency order, oldest first: 0..180 without 140, then 140, then 181..199. */
	for (int i = 0; i < NPUT; i++) {
		if (i != TOUCHED)
			order[norder++] = i;
		if (i == TOUCH_AT)
			order[norder++] = TOUCHED;
	}

	json = harness_stats(c);
	pages = harness_stat_u64(json, "pool.pages");
	evictions = harness_stat_u64(json, "counters.evictions");
	total = harness_stat_u64(json, "pool.bytes_total");
	harness_log("after %d puts: %llu pages stored, %llu evictions", NPUT,
		    (unsigned long long)pages, (unsigned long long)evictions);
	CHECK_GT(evictions, 0);
	CHECK_EQ(evictions + pages, NPUT + 1);
	CHECK_LE(harness_stat_u64(json, "pool.bytes_used"), total);
	CHECK_EQ(harness_stat_u64(json, "pool.bytes_used"), pages * pb);
	CHECK_LE(pages * pb, total);
	CHECK_GE(pages, 16); /* a 64 MiB pool keeps far more than 16 MiB of 1 MiB pages */
	CHECK_EQ(harness_stat_u64(json, "leases"), 1);
	free(json);

	/* Exactly the pages - 1 most recently used unleased pages are left. */
	for (int i = 0; i < NPUT; i++) {
		is_present[i] = present(c, ns, &keys[i]);
		npresent += is_present[i];
	}
	if ((uint64_t)npresent + 1 != pages) {
		harness_fail(__FILE__, __LINE__, "lookup finds %d pages + 1 leased, stats say %llu",
			     npresent, (unsigned long long)pages);
	}
	for (int j = 0; j < NPUT; j++) {
		int k = order[j], want = j >= NPUT - npresent;

		if (is_present[k] != want) {
			printf("present (in recency order, oldest first):\n");
			for (int q = 0; q < NPUT; q++)
				printf("%d%s", is_present[order[q]], q % 50 == 49 ? "\n" : "");
			harness_fail(__FILE__, __LINE__,
				     "key %d (recency rank %d of %d) is %s; with %d pages left the "
				     "newest %d should be there and no other",
				     k, j, NPUT, is_present[k] ? "present" : "gone", npresent,
				     npresent);
		}
	}
	for (int j = NPUT - npresent; j < NPUT; j++) {
		char what[32];

		snprintf(what, sizeof(what), "key %d", order[j]);
		CHECK_RC(kvb_get(c, ns, keys[order[j]], page, pb), (long long)pb);
		CHECK(harness_verify(page, pb, &keys[order[j]], SEED, what) == 0);
	}

	/* The leased page survived all of it, and reads back through the lease and a GET. */
	CHECK_EQ(present(c, ns, &leased_key), 1);
	CHECK(harness_verify(lease.data, pb, &leased_key, SEED, "leased page") == 0);
	CHECK_RC(kvb_get(c, ns, leased_key, page, pb), (long long)pb);
	CHECK(harness_verify(page, pb, &leased_key, SEED, "leased page by GET") == 0);

	/* Released, it is just a page: enough new pages push it out. */
	CHECK_OK(kvb_release(c, &lease));
	for (int i = NPUT; i < NPUT + 100; i++) {
		harness_fill(page, pb, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, pb), 0);
	}
	CHECK_EQ(present(c, ns, &leased_key), 0);
	CHECK_EQ(present(c, ns, &keys[NPUT + 99]), 1);
	CHECK_EQ(harness_stat(c, "leases"), 0);

	free(page);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
