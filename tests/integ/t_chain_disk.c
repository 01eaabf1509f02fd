// SPDX-License-Identifier: MIT
/*
 * t_chain_disk.c - chains stay whole across the RAM and disk tiers. A 64 MiB pool
 * of 1 MiB pages over a 128 MiB disk tier on tmpfs: 4 chains of 12 pages PUT with their
 * parents (48 pages: all in RAM, below the 80 % low watermark), their tails read so that the
 * heads are the coldest pages, then 300 unrelated pages flood both tiers (the disk log wraps
 * twice). Demotion takes leaves first, so a chain's tail is written to disk before its head,
 * and the log, which drops its oldest slots first, drops tails before heads: at every check,
 * over both tiers, what is left of each chain is a whole prefix (a page stored in RAM or on
 * disk after one stored nowhere is a failure). Not covered, because not kept: a page promoted
 * from disk and demoted again takes a newer slot than its parent's (docs/design.md).
 */
#include <liburing.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/vfs.h>
#include <unistd.h>

#include "harness.h"

#define CHAINS 4
#define LEN 12
#define FLOOD 300
#define PAGE (1u << 20)
#define SEED 2021

static kvb_key keys[CHAINS][LEN];
static char cache[PATH_MAX];

static void remove_cache(void)
{
	unlink(cache);
}

/* Pages of chain i stored in any tier; fails on one stored after a missing one. */
static int whole(kvb_client *c, uint32_t ns, int i, int *on_disk)
{
	uint8_t tiers[LEN];
	size_t hits;
	int n = 0;

	CHECK_OK(kvb_lookup_tiers(c, ns, keys[i], LEN, &hits, tiers));
	for (int j = 0; j < LEN; j++) {
		if (tiers[j] == KVB_TIER_NONE)
			continue;
		CHECKF(n == j, "chain %d: page %d stored (tier %u) after page %d is gone", i, j,
		       tiers[j], n);
		n++;
		*on_disk += tiers[j] == KVB_TIER_DISK;
	}
	return n;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct io_uring r;
	struct statfs sf;
	kvb_client *c;
	uint32_t ns;
	uint8_t *page = malloc(PAGE);
	int left = 0, disk = 0;

	harness_init(argc, argv);
	if (io_uring_queue_init(2, &r, 0))
		harness_skip("io_uring unavailable here");
	io_uring_queue_exit(&r);
	if (statfs("/dev/shm", &sf) < 0 || sf.f_type != 0x01021994)
		harness_skip("/dev/shm is not tmpfs");
	CHECK(page != NULL);
	snprintf(cache, sizeof(cache), "/dev/shm/kvbt-chain-%d.cache", (int)getpid());
	atexit(remove_cache);
	b = harness_broker_start("--pool", "64M", "--disk", cache, "--disk-size", "128M");
	c = harness_connect(b, "t_chain_disk", 0);
	harness_layout(&l, "test/chain-disk", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (int i = 0; i < CHAINS; i++) {
		harness_key_chain(keys[i], LEN, 64, SEED + (uint64_t)i);
		for (int j = 0; j < LEN; j++) {
			harness_fill(page, PAGE, &keys[i][j], SEED);
			CHECK_RC(kvb_put_child(c, ns, keys[i][j], j ? &keys[i][j - 1] : NULL, page,
					       PAGE),
				 0);
		}
	}
	for (int i = 0; i < CHAINS; i++)
		for (int j = LEN / 2; j < LEN; j++) {
			uint8_t t;
			size_t h;

			CHECK_OK(kvb_lookup_tiers(c, ns, &keys[i][j], 1, &h, &t));
			CHECK_EQ(t, KVB_TIER_RAM); /* read from RAM: nothing promoted */
			CHECK_RC(kvb_get(c, ns, keys[i][j], page, PAGE), PAGE);
		}
	for (int f = 0; f < FLOOD; f++) {
		kvb_key k = harness_key(SEED + 100, (uint64_t)f);

		harness_fill(page, PAGE, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, page, PAGE), 0);
		if (f % 10 == 9) {
			left = disk = 0;
			for (int i = 0; i < CHAINS; i++)
				left += whole(c, ns, i, &disk);
			if (f % 50 == 49)
				harness_log(
					"after %d pages: %d chain pages left, %d of them on disk",
					f + 1, left, disk);
		}
	}
	/* A head that survived reads back byte-exact, from whichever tier holds it. */
	for (int i = 0; i < CHAINS; i++) {
		int d = 0;

		if (whole(c, ns, i, &d)) {
			CHECK_RC(kvb_get(c, ns, keys[i][0], page, PAGE), PAGE);
			CHECK(harness_verify(page, PAGE, &keys[i][0], SEED, "chain head") == 0);
		}
	}
	free(page);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
