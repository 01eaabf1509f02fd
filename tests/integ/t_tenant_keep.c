// SPDX-License-Identifier: MIT
/*
 * t_tenant_keep.c - a pool cut into tenant partitions survives a SIGKILL of the broker
 * (the kept pool and tenants together: keeper.c, adopt.c, [tenant-part]).
 *
 * A broker with --tenants uid and 16 MiB shares; this process's tenant stores pages of two
 * sizes (64 KiB and 12 KiB: slabs of two lengths, carved from the partition's extents one after
 * the other), with a third of the 12 KiB ones deleted again (slabs with holes). The broker is
 * SIGKILLed and started again with the same command line:
 *   - it adopts the pool with its eight (sparse) partitions, every arena with its partition,
 *     and every page that was stored and not deleted is served byte-exact, none of the
 *     deleted ones; the memory counted is the adopted slabs' [tenant-lend];
 *   - the tenant lands in the partition its pages are in, so new PUTs of both sizes work, and
 *     a restart with another share adopts the pool too (a share is a guarantee, not a cut),
 *     its pages still there; so does a planned hand-over (--takeover) of the sparse pool.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "reliab.h"

#define BIG (64u * 1024)
#define SMALL (12u * 1024)
#define NBIG 60
#define NSMALL 240
#define SEED 7100

static const char *const args[] = {"--pool",	     "64M", "--slab", "1M", "--tenants", "uid",
				   "--tenant-share", "16M", NULL};

static void layouts(struct kvb_layout *big, struct kvb_layout *small)
{
	harness_layout(big, "tkeep-big", KVB_LAYOUT_MLA, 64, 1, 0, 1, BIG / 64);
	harness_layout(small, "tkeep-small", KVB_LAYOUT_MLA, 64, 1, 0, 1, SMALL / 64);
}

static struct harness_broker *start_how(const char *sock, const char *share, int takeover)
{
	const char *a[16] = {"--socket", sock};
	int n = 2;

	for (const char *const *p = args; *p; p++)
		a[n++] = share && !strcmp(*p, "16M") ? share : *p;
	if (takeover)
		a[n++] = "--takeover";
	a[n] = NULL;
	return harness_broker_startv(a);
}

static struct harness_broker *start(const char *sock, const char *share)
{
	return start_how(sock, share, 0);
}

/* Every page of (seed, size) below n served exact, deleted ones (i % 3 == 1 when del) not. */
static void check(kvb_client *c, uint32_t ns, uint64_t seed, uint32_t size, uint32_t n, int del)
{
	uint8_t *page = malloc(size);

	CHECK(page != NULL);
	for (uint32_t i = 0; i < n; i++) {
		kvb_key k = harness_key(seed, i);
		int rc = kvb_get(c, ns, k, page, size);

		if (del && i % 3 == 1) {
			CHECKF(rc == -ENOENT, "deleted page %u of %u bytes: get %d", i, size, rc);
			continue;
		}
		CHECKF(rc == (int)size, "page %u of %u bytes: get %d (%s)", i, size, rc,
		       harness_strerror(rc));
		CHECK_OK(harness_verify(page, size, &k, seed, "adopted page"));
	}
	free(page);
}

static void put_all(kvb_client *c, uint32_t ns, uint64_t seed, uint32_t size, uint32_t from,
		    uint32_t n)
{
	uint8_t *page = malloc(size);

	CHECK(page != NULL);
	for (uint32_t i = from; i < n; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(page, size, &k, seed);
		CHECK_RC(kvb_put(c, ns, k, page, size), 0);
	}
	free(page);
}

int main(int argc, char **argv)
{
	struct kvb_layout big, small;
	struct harness_broker *b;
	uint32_t nb, ns;
	char sock[108];
	kvb_client *c;

	harness_init(argc, argv);
	layouts(&big, &small);
	b = harness_broker_startv((const char *const[]){"--pool", "64M", "--slab", "1M",
							"--tenants", "uid", "--tenant-share", "16M",
							NULL});
	snprintf(sock, sizeof(sock), "%s", b->sock);
	c = harness_connect(b, "writer", 0);
	CHECK_OK(kvb_ns_open(c, &big, &nb, NULL));
	CHECK_OK(kvb_ns_open(c, &small, &ns, NULL));
	/* Interleaved: the two classes' slabs alternate in the partition's extents. */
	for (uint32_t r = 0; r < 4; r++) {
		put_all(c, nb, SEED, BIG, r * NBIG / 4, (r + 1) * NBIG / 4);
		put_all(c, ns, SEED + 1, SMALL, r * NSMALL / 4, (r + 1) * NSMALL / 4);
	}
	for (uint32_t i = 1; i < NSMALL; i += 3)
		CHECK_OK(kvb_delete(c, ns, harness_key(SEED + 1, i)));
	kvb_close(c);

	harness_log("SIGKILL, then the same command line");
	rel_kill(b->pid);
	b->pid = 0;
	b = start(sock, NULL);
	CHECKF(harness_broker_log_has(b, "adopt: "), "no adoption logged");
	CHECKF(harness_broker_log_has(b, "in 8 tenant partition(s)"),
	       "the partitions did not come back");
	c = harness_connect(b, "reader", 0);
	CHECK_OK(kvb_ns_open(c, &big, &nb, NULL));
	CHECK_OK(kvb_ns_open(c, &small, &ns, NULL));
	check(c, nb, SEED, BIG, NBIG, 0);
	check(c, ns, SEED + 1, SMALL, NSMALL, 1);
	harness_log("new pages of both sizes next to the adopted ones");
	put_all(c, nb, SEED + 2, BIG, 0, 20);
	put_all(c, ns, SEED + 3, SMALL, 0, 60);
	check(c, nb, SEED + 2, BIG, 20, 0);
	check(c, ns, SEED + 3, SMALL, 60, 0);
	check(c, nb, SEED, BIG, NBIG, 0);
	kvb_close(c);

	harness_log("another share: adopted all the same, every page there");
	rel_kill(b->pid);
	b->pid = 0;
	b = start(sock, "32M");
	CHECKF(harness_broker_log_has(b, "in 8 tenant partition(s)"), "not adopted");
	c = harness_connect(b, "reader2", 0);
	CHECK_OK(kvb_ns_open(c, &big, &nb, NULL));
	CHECK_OK(kvb_ns_open(c, &small, &ns, NULL));
	check(c, nb, SEED + 2, BIG, 20, 0);
	check(c, nb, SEED, BIG, NBIG, 0);
	/* The memory counted is the slabs adopted: 60 + 20 pages of 64 KiB at least, and no
	 * more than the pool. */
	CHECK_GE(harness_stat(c, "pool.resident_bytes"), (NBIG + 20) * (uint64_t)BIG);
	CHECK(harness_stat(c, "pool.resident_bytes") <= 64ull << 20);
	kvb_close(c);

	harness_log("a planned hand-over (--takeover): the sparse pool moves, every page there");
	{
		struct harness_broker *old = b;

		b = start_how(sock, "32M", 1);
		for (int i = 0; i < 1000 && harness_broker_alive(old); i++)
			rel_sleep_ms(10); /* it answered until it handed over */
		CHECK(!harness_broker_alive(old));
	}
	{
		struct kvb_opts o = {.socket_path = sock, .name = "reader3"};

		c = NULL;
		for (int i = 0; i < 500 && kvb_connect(&o, &c) == -EAGAIN; i++)
			rel_sleep_ms(10); /* the new broker is adopting the pool */
		CHECK(c != NULL);
	}
	CHECKF(harness_broker_log_has(b, "in 8 tenant partition(s)"), "not handed over");
	CHECK_OK(kvb_ns_open(c, &big, &nb, NULL));
	check(c, nb, SEED + 2, BIG, 20, 0);
	check(c, nb, SEED, BIG, NBIG, 0);
	CHECK_GE(harness_stat(c, "pool.resident_bytes"), (NBIG + 20) * (uint64_t)BIG);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
