// SPDX-License-Identifier: MIT
/*
 * t_putget.c - byte-exact PUT, GET and ACQUIRE of pages of several sizes against a real broker:
 * 4 KiB, 64 KiB, 1 MiB, a Kimi-K2.5 MLA page (61 layers x 1152 B x 64 tokens = 4,497,408 B), a
 * page that is not a multiple of 4 KiB, and a two-component page (main KV plus a sparse-attention
 * indexer cache). Each goes through a plain buffer and a kvb_buf_alloc_host() buffer in both
 * directions, and each lease is copied out by kvb_lease_copy(). Also: a second PUT reports
 * EXISTED (returns 1), unknown keys give -ENOENT, a deleted page is gone (and a leased one stays
 * readable until released), LOOKUP counts leading hits and reports each key's tier, a page
 * larger than a slab is refused with -E2BIG, and the pool's accounting matches what is stored,
 * 4 KiB-rounded slot by slot.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

struct size_case {
	const char *name;
	uint32_t tpp, layers, bytes;
	const char *comp2; /* second component, or NULL */
	uint32_t layers2, bytes2;
	uint64_t page_bytes; /* expected */
};

static const struct size_case cases[] = {
	{"4k", 16, 1, 256, NULL, 0, 0, 4096},
	{"64k", 32, 4, 512, NULL, 0, 0, 65536},
	{"1m", 64, 16, 1024, NULL, 0, 0, 1u << 20},
	{"kimi-k2.5", 64, 61, 1152, NULL, 0, 0, 4497408},
	{"odd", 7, 3, 100, NULL, 0, 0, 2100},
	{"kimi+indexer", 64, 61, 1152, "indexer", 61, 132, 64ull * 61 * (1152 + 132)},
};
#define NCASES (sizeof(cases) / sizeof(cases[0]))
#define NKEYS 6

static uint64_t stored_pages, stored_bytes, dedups;

static void run_case(kvb_client *c, const struct size_case *sc, uint64_t seed)
{
	struct kvb_layout l;
	kvb_key keys[NKEYS], unknown = harness_key(seed, 999);
	struct kvb_lease lease, lease2;
	uint8_t tiers[5];
	kvb_key lk[5];
	uint32_t ns, hbuf;
	size_t pb = 0, hits = 99;
	uint8_t *src, *dst, *hb;
	char what[64], model[64], *json;

	snprintf(model, sizeof(model), "test/putget-%s", sc->name);
	harness_layout(&l, model, KVB_LAYOUT_MLA, sc->tpp, 1, 0, sc->layers, sc->bytes);
	if (sc->comp2)
		harness_layout_add(&l, sc->comp2, sc->layers2, sc->bytes2);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, sc->page_bytes);
	harness_log("%s: ns %u, page %zu bytes", sc->name, ns, pb);
	harness_key_chain(keys, NKEYS, sc->tpp, seed);

	src = malloc(pb);
	dst = malloc(pb + 4096);
	CHECK(src && dst);

	/* Plain buffer in, plain buffer out; bytes past the page untouched. */
	harness_fill(src, pb, &keys[0], seed);
	CHECK_RC(kvb_put(c, ns, keys[0], src, pb), 0);
	CHECK_RC(kvb_put(c, ns, keys[0], src, pb), 1); /* EXISTED: nothing copied */
	dedups++;
	memset(dst, 0xcc, pb + 4096);
	CHECK_RC(kvb_get(c, ns, keys[0], dst, pb + 4096), (long long)pb);
	snprintf(what, sizeof(what), "%s: plain get", sc->name);
	CHECK(harness_verify(dst, pb, &keys[0], seed, what) == 0);
	for (size_t i = pb; i < pb + 4096; i++)
		CHECKF(dst[i] == 0xcc, "%s: get wrote past the page at +%zu", sc->name, i - pb);

	/* Wrong lengths. */
	CHECK_RC(kvb_put(c, ns, keys[1], src, pb - 1), -EINVAL);
	CHECK_RC(kvb_put(c, ns, keys[1], src, pb + 1), -EINVAL);
	{
		int rc = kvb_get(c, ns, keys[0], dst, pb - 1);

		CHECKF(rc < 0, "%s: get into a buffer one byte short returned %d", sc->name, rc);
	}

	/* A registered host buffer: get into it, put from it (at offset 0 and in the middle). */
	hb = kvb_buf_alloc_host(c, 2 * pb, &hbuf);
	CHECKF(hb != NULL, "%s: kvb_buf_alloc_host(%zu) failed", sc->name, 2 * pb);
	memset(hb, 0, 2 * pb);
	CHECK_RC(kvb_get(c, ns, keys[0], hb + pb, pb), (long long)pb);
	snprintf(what, sizeof(what), "%s: get into host buffer", sc->name);
	CHECK(harness_verify(hb + pb, pb, &keys[0], seed, what) == 0);
	harness_fill(hb, pb, &keys[1], seed);
	CHECK_RC(kvb_put(c, ns, keys[1], hb, pb), 0);
	harness_fill(hb + pb, pb, &keys[2], seed);
	CHECK_RC(kvb_put(c, ns, keys[2], hb + pb, pb), 0);
	memset(dst, 0, pb);
	CHECK_RC(kvb_get(c, ns, keys[1], dst, pb), (long long)pb);
	snprintf(what, sizeof(what), "%s: put from host buffer", sc->name);
	CHECK(harness_verify(dst, pb, &keys[1], seed, what) == 0);
	memset(hb, 0, 2 * pb);
	CHECK_RC(kvb_get(c, ns, keys[2], hb, pb), (long long)pb);
	snprintf(what, sizeof(what), "%s: host buffer to host buffer", sc->name);
	CHECK(harness_verify(hb, pb, &keys[2], seed, what) == 0);
	CHECK_RC(kvb_put(c, ns, keys[2], hb + pb, pb), 1);
	dedups++;

	/* Zero-copy: the lease maps the page itself. */
	memset(&lease, 0, sizeof(lease));
	CHECK_OK(kvb_acquire(c, ns, keys[0], &lease));
	CHECK(lease.data != NULL);
	CHECK_EQ(lease.len, pb);
	snprintf(what, sizeof(what), "%s: lease", sc->name);
	CHECK(harness_verify(lease.data, pb, &keys[0], seed, what) == 0);
	/*
	 * Copied out by the library: twice into one destination (the second by memcpy where the
	 * first streamed, kvb_copy [nt-fresh]), a tail from an odd offset, nothing outside.
	 */
	for (int rep = 0; rep < 2; rep++) {
		memset(dst, 0, pb);
		CHECK_OK(kvb_lease_copy(&lease, 0, dst, pb));
		snprintf(what, sizeof(what), "%s: kvb_lease_copy %d", sc->name, rep);
		CHECK(harness_verify(dst, pb, &keys[0], seed, what) == 0);
	}
	memset(dst, 0, pb);
	CHECK_OK(kvb_lease_copy(&lease, pb / 2 + 1, dst, pb - pb / 2 - 1));
	CHECK(memcmp(dst, (const uint8_t *)lease.data + pb / 2 + 1, pb - pb / 2 - 1) == 0);
	CHECK_RC(kvb_lease_copy(&lease, pb, dst, 0), 0);
	CHECK_RC(kvb_lease_copy(&lease, pb + 1, dst, 0), -EINVAL);
	CHECK_RC(kvb_lease_copy(&lease, 1, dst, pb), -EINVAL);
	CHECK_RC(kvb_lease_copy(&lease, 8, dst, SIZE_MAX), -EINVAL);
	CHECK_OK(kvb_release(c, &lease));
	CHECK_RC(kvb_release(c, &lease), -EINVAL);
	CHECK_RC(kvb_lease_copy(&lease, 0, dst, pb), -EINVAL);

	/* Misses. */
	CHECK_RC(kvb_get(c, ns, unknown, dst, pb), -ENOENT);
	CHECK_RC(kvb_acquire(c, ns, unknown, &lease), -ENOENT);
	CHECK_RC(kvb_delete(c, ns, unknown), -ENOENT);

	/* LOOKUP: k0 k1 k2 stored, k3 not, k4 stored: 3 leading hits, each key's own tier. */
	harness_fill(src, pb, &keys[4], seed);
	CHECK_RC(kvb_put(c, ns, keys[4], src, pb), 0);
	memcpy(lk, keys, sizeof(lk));
	memset(tiers, 0x55, sizeof(tiers));
	CHECK_OK(kvb_lookup_tiers(c, ns, lk, 5, &hits, tiers));
	CHECK_EQ(hits, 3);
	CHECK_EQ(tiers[0], KVB_TIER_RAM);
	CHECK_EQ(tiers[1], KVB_TIER_RAM);
	CHECK_EQ(tiers[2], KVB_TIER_RAM);
	CHECK_EQ(tiers[3], KVB_TIER_NONE);
	CHECK_EQ(tiers[4], KVB_TIER_RAM);
	hits = 99;
	CHECK_OK(kvb_lookup(c, ns, lk, 5, &hits));
	CHECK_EQ(hits, 3);
	CHECK_OK(kvb_lookup(c, ns, &lk[3], 2, &hits));
	CHECK_EQ(hits, 0);
	CHECK_OK(kvb_lookup(c, ns, lk, 0, &hits));
	CHECK_EQ(hits, 0);

	/* DELETE: gone at once for lookups and gets; a second delete misses. */
	CHECK_OK(kvb_delete(c, ns, keys[2]));
	CHECK_RC(kvb_get(c, ns, keys[2], dst, pb), -ENOENT);
	CHECK_RC(kvb_delete(c, ns, keys[2]), -ENOENT);
	CHECK_OK(kvb_lookup(c, ns, lk, 5, &hits));
	CHECK_EQ(hits, 2);

	/* DELETE under a lease: the lease still reads the page until released. */
	CHECK_OK(kvb_acquire(c, ns, keys[1], &lease2));
	CHECK_OK(kvb_delete(c, ns, keys[1]));
	CHECK_RC(kvb_get(c, ns, keys[1], dst, pb), -ENOENT);
	snprintf(what, sizeof(what), "%s: lease of a deleted page", sc->name);
	CHECK(harness_verify(lease2.data, pb, &keys[1], seed, what) == 0);
	CHECK_OK(kvb_release(c, &lease2));
	/* And it can be stored again. */
	harness_fill(src, pb, &keys[1], seed);
	CHECK_RC(kvb_put(c, ns, keys[1], src, pb), 0);
	CHECK_RC(kvb_get(c, ns, keys[1], dst, pb), (long long)pb);
	CHECK(harness_verify(dst, pb, &keys[1], seed, "re-put after delete") == 0);

	/* Stored now: k0, k1, k4. */
	stored_pages += 3;
	stored_bytes += 3 * harness_slot_bytes(pb);
	json = harness_stats(c);
	{
		char path[96];

		snprintf(path, sizeof(path), "namespaces[id=%u].page_bytes", ns);
		CHECK_EQ(harness_stat_u64(json, path), pb);
		snprintf(path, sizeof(path), "namespaces[id=%u].pages", ns);
		CHECK_EQ(harness_stat_u64(json, path), 3);
		snprintf(path, sizeof(path), "namespaces[id=%u].components", ns);
		CHECK_EQ(harness_stat_u64(json, path), sc->comp2 ? 2 : 1);
	}
	free(json);

	CHECK_OK(kvb_buf_unregister(c, hbuf));
	CHECK_RC(kvb_buf_unregister(c, hbuf), -EBADF);
	free(src);
	free(dst);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;
	size_t pb;
	char *json;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "256M");
	c = harness_connect(b, "t_putget", 0);

	for (size_t i = 0; i < NCASES; i++)
		run_case(c, &cases[i], 100 + i);

	/* Larger than the largest page (16 MiB, --slab when larger): refused when it opens. */
	harness_layout(&l, "test/putget-too-big", KVB_LAYOUT_MLA, 64, 1, 0, 128, 4096);
	CHECK_RC(kvb_ns_open(c, &l, &ns, &pb), -E2BIG);

	/* Accounting: slot bytes of exactly what is stored. Freeing after a release may lag. */
	CHECK_EQ(harness_stat_wait(c, "pool.bytes_used", stored_bytes, 1000), stored_bytes);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "pool.pages"), stored_pages);
	CHECK_EQ(harness_stat_u64(json, "counters.dedup"), dedups);
	CHECK_GE(harness_stat_u64(json, "counters.puts"), NCASES * 5);
	CHECK_GE(harness_stat_u64(json, "counters.misses"), 1);
	CHECK_GE(harness_stat_u64(json, "counters.deletes"), NCASES * 2);
	CHECK_EQ(harness_stat_u64(json, "leases"), 0);
	CHECK_EQ(harness_stat_u64(json, "clients"), 1);
	CHECK_EQ(harness_stat_u64(json, "pool.arenas[0].bytes_used"),
		 harness_stat_u64(json, "pool.bytes_used"));
	CHECK_LE(harness_stat_u64(json, "pool.bytes_used"),
		 harness_stat_u64(json, "pool.bytes_total"));
	CHECK_EQ(harness_stat_u64(json, "pool.bytes_total") +
			 harness_stat_u64(json, "pool.dir_bytes"),
		 256ull << 20);
	free(json);

	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
