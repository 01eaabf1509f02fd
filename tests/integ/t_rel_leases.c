// SPDX-License-Identifier: MIT
/*
 * t_rel_leases.c - promise 5 (docs/reliability.md): leases are capabilities (slot, generation).
 *
 *   - a lease released twice: the second RELEASE fails -EINVAL and releases nothing else (two
 *     leases on one page are two capabilities: each releases once);
 *   - a lease presented by another client: -EINVAL, the holder's lease intact;
 *   - a lease used after its page was evicted and its slot reused by another page: -EINVAL, and
 *     the new occupant's own leases and bytes are untouched; the API clears lease.data at
 *     release, so a stale read is a NULL dereference, never another page's bytes;
 *   - a page DELETEd while leased stays intact for the holder until the release;
 *   - forged ids in bulk (random, and every generation of a live slot near the real one):
 *     all -EINVAL, the lease count never moves.
 * These are the broker's leases (--no-directory); t_hazard has the client's own.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reliab.h"

#define PAGE (1u << 20)
#define SEED 505

static kvb_client *a, *e;
static uint32_t ns;
static uint8_t *page;

static int release_id(kvb_client *c, uint64_t id)
{
	struct kvb_lease l = {.id = id};

	return kvb_release(c, &l);
}

static void put(uint64_t seed, uint64_t i)
{
	kvb_key k = harness_key(seed, i);

	harness_fill(page, PAGE, &k, seed);
	CHECK(kvb_put(a, ns, k, page, PAGE) >= 0);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_lease l1, l2, old, occ[64];
	kvb_key k0 = harness_key(SEED, 0);
	uint64_t s = 99, forged = 0, nforge = (uint64_t)rel_pick(2000, 20000, 200000);
	int nocc = 0, found = -1;

	harness_init(argc, argv);
	/* The broker's own leases: without a directory no lease is the client's ([hazard]). */
	b = harness_broker_start("--pool", "64M", "--slab", "8M", "--no-directory");
	a = harness_connect(b, "holder", 0);
	e = harness_connect(b, "thief", 0);
	page = malloc(PAGE);
	CHECK(page != NULL);
	harness_layout(&l, "test/leases-cap", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(a, &l, &ns, NULL));
	CHECK_OK(kvb_ns_open(e, &l, &ns, NULL));

	harness_log("double release");
	put(SEED, 0);
	CHECK_OK(kvb_acquire(a, ns, k0, &l1));
	CHECK_OK(kvb_acquire(a, ns, k0, &l2));
	CHECK_EQ(l1.id, l2.id);
	CHECK_EQ(harness_stat(a, "leases"), 2);
	CHECK_OK(kvb_release(a, &l1));
	CHECK(l1.data == NULL && l1.len == 0);
	CHECK_OK(release_id(a, l2.id)); /* the second capability on the page */
	CHECK_RC(release_id(a, l2.id), -EINVAL);
	CHECK_RC(kvb_release(a, &l1), -EINVAL);
	CHECK_EQ(harness_stat(a, "leases"), 0);

	harness_log("another client's lease");
	CHECK_OK(kvb_acquire(a, ns, k0, &l1));
	CHECK_RC(release_id(e, l1.id), -EINVAL);
	CHECK_EQ(harness_stat(a, "client_list[name=holder].leases"), 1);
	CHECK_OK(harness_verify(l1.data, l1.len, &k0, SEED, "holder's page"));

	harness_log("DELETE while leased");
	CHECK_OK(kvb_delete(e, ns, k0));
	CHECK_RC(kvb_get(e, ns, k0, page, PAGE), -ENOENT);
	CHECK_OK(harness_verify(l1.data, l1.len, &k0, SEED, "deleted page, still leased"));
	old = l1;
	CHECK_OK(kvb_release(a, &l1));

	harness_log("use after eviction and slot reuse");
	/* Fill the pool twice over: the deleted page's slot is reused. */
	for (int i = 1; i <= 120; i++)
		put(SEED + 1, (uint64_t)i);
	for (int i = 1; i <= 120 && nocc < 64; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		if (kvb_acquire(a, ns, k, &occ[nocc]) == 0) {
			if ((occ[nocc].id & 0xffffffffu) == (old.id & 0xffffffffu))
				found = nocc;
			nocc++;
		}
	}
	CHECK_GT(nocc, 0);
	CHECK_RC(release_id(a, old.id), -EINVAL);
	CHECK_EQ(harness_stat(a, "leases"), nocc);
	if (found >= 0) {
		harness_log("slot 0x%llx reused: old lease gen %llu, occupant gen %llu",
			    (unsigned long long)(old.id & 0xffffffffu),
			    (unsigned long long)(old.id >> 32),
			    (unsigned long long)(occ[found].id >> 32));
		CHECK_NE(occ[found].id, old.id);
	}

	harness_log("%llu forged lease ids", (unsigned long long)nforge);
	for (uint64_t i = 0; i < nforge; i++) {
		uint64_t id;

		s ^= s << 13;
		s ^= s >> 7;
		s ^= s << 17;
		/* Half random, half every other generation of a slot a live lease holds. */
		id = i % 2 ? s : (occ[i % (uint64_t)nocc].id ^ ((s % 0xffff + 1) << 32));
		if (release_id(e, id) == -EINVAL)
			forged++;
		/* Generations never reach 2^31 here: not one of the holder's ids either. */
		if (i % 1000 == 0 && release_id(a, s | (1ull << 63)) != -EINVAL)
			harness_fail(__FILE__, __LINE__, "a forged id was honoured");
	}
	CHECK_EQ(forged, nforge);
	CHECK_EQ(harness_stat(a, "leases"), nocc);
	for (int i = 0; i < nocc; i++)
		CHECK_OK(kvb_release(a, &occ[i]));
	CHECK_EQ(harness_stat(a, "leases"), 0);
	CHECK_EQ(harness_stat(a, "pool.pinned_pages"), 0);
	rel_figure("double release, foreign release, release after eviction with the slot reused "
		   "(%s), %llu forged ids: all -EINVAL; leases never moved",
		   found >= 0 ? "same slot, new generation" : "slot not reused this run",
		   (unsigned long long)nforge);
	free(page);
	kvb_close(a);
	kvb_close(e);
	harness_broker_stop(b);
	return H_PASS;
}
