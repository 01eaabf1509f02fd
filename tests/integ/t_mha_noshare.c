// SPDX-License-Identifier: MIT
/*
 * t_mha_noshare.c - MHA KV is sharded across TP ranks, so ranks must NOT share: four processes
 * (tp_size 4, tp_rank 0..3) of one model get four different namespaces, PUT the same keys with
 * different (per-rank) content, and each reads back its own bytes. The pool holds 4 x nkeys
 * pages and nothing is deduplicated. A second engine's rank 2 (same model, same tp) does share
 * with the first engine's rank 2, which is what identity by layout promises.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NRANKS 4
#define NKEYS 24
#define TPP 32
#define LAYERS 4
#define BPTL 1024 /* K and V of 2 heads x 128 dims x bf16 per rank */
#define PAGE ((uint64_t)TPP * LAYERS * BPTL)

struct shared {
	uint32_t ns[NRANKS];
	kvb_key keys[NKEYS];
	struct harness_gate go;
	char sock[108];
};

static struct shared *sh;

static void layout(struct kvb_layout *l, uint32_t rank)
{
	harness_layout(l, "meta-llama/Llama-3.1-70B-test", KVB_LAYOUT_MHA, TPP, NRANKS, rank,
		       LAYERS, BPTL);
}

static int rank_main(int rank, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .name = "mha-rank"};
	struct kvb_layout l;
	kvb_client *c = NULL;
	uint8_t *page;
	uint32_t ns;
	size_t pb;
	char what[64];

	(void)arg;
	CHECK_OK(kvb_connect(&o, &c));
	layout(&l, (uint32_t)rank);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PAGE);
	sh->ns[rank] = ns;
	page = malloc(pb);
	CHECK(page != NULL);
	harness_gate_wait(&sh->go, 10000);
	for (int k = 0; k < NKEYS; k++) {
		harness_fill(page, pb, &sh->keys[k], (uint64_t)rank);
		CHECK_RC(kvb_put(c, ns, sh->keys[k], page, pb), 0); /* never EXISTED */
	}
	for (int k = 0; k < NKEYS; k++) {
		snprintf(what, sizeof(what), "rank %d key %d", rank, k);
		memset(page, 0, pb);
		CHECK_RC(kvb_get(c, ns, sh->keys[k], page, pb), (long long)pb);
		CHECK(harness_verify(page, pb, &sh->keys[k], (uint64_t)rank, what) == 0);
	}
	free(page);
	kvb_close(c);
	return H_PASS;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c;
	pid_t pids[NRANKS];
	uint32_t ns2;
	size_t pb;
	uint8_t *page;
	char *json, path[96];

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->go);
	for (int i = 0; i < NKEYS; i++)
		sh->keys[i] = harness_key(4242, (uint64_t)i);

	for (int r = 0; r < NRANKS; r++)
		pids[r] = harness_fork(rank_main, r, NULL);
	harness_gate_open(&sh->go, NRANKS);
	CHECK_EQ(harness_wait(pids, NRANKS, 30000, NULL), 0);

	for (int r = 0; r < NRANKS; r++)
		for (int q = 0; q < r; q++)
			CHECKF(sh->ns[r] != sh->ns[q], "MHA ranks %d and %d share ns %u", q, r,
			       sh->ns[r]);

	c = harness_connect(b, "observer", 0);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "pool.pages"), NRANKS * NKEYS);
	CHECK_EQ(harness_stat_u64(json, "pool.bytes_used"),
		 NRANKS * NKEYS * harness_slot_bytes(PAGE));
	CHECK_EQ(harness_stat_u64(json, "counters.dedup"), 0);
	for (int r = 0; r < NRANKS; r++) {
		snprintf(path, sizeof(path), "namespaces[id=%u].pages", sh->ns[r]);
		CHECK_EQ(harness_stat_u64(json, path), NKEYS);
		snprintf(path, sizeof(path), "namespaces[id=%u].tp_rank", sh->ns[r]);
		CHECK_EQ(harness_stat_u64(json, path), r);
		snprintf(path, sizeof(path), "namespaces[id=%u].tp_size", sh->ns[r]);
		CHECK_EQ(harness_stat_u64(json, path), NRANKS);
	}
	free(json);

	/* Another engine's rank 2 is the same shard: it shares rank 2's pages. */
	layout(&l, 2);
	CHECK_OK(kvb_ns_open(c, &l, &ns2, &pb));
	CHECK_EQ(ns2, sh->ns[2]);
	page = malloc(pb);
	CHECK(page != NULL);
	CHECK_RC(kvb_get(c, ns2, sh->keys[5], page, pb), (long long)pb);
	CHECK(harness_verify(page, pb, &sh->keys[5], 2, "second engine's rank 2") == 0);
	harness_fill(page, pb, &sh->keys[5], 2);
	CHECK_RC(kvb_put(c, ns2, sh->keys[5], page, pb), 1);
	/* Same model and rank but another tp_size is another shard. */
	l.tp_size = 8;
	CHECK_OK(kvb_ns_open(c, &l, &ns2, &pb));
	for (int r = 0; r < NRANKS; r++)
		CHECK_NE(ns2, sh->ns[r]);
	CHECK_RC(kvb_get(c, ns2, sh->keys[5], page, pb), -ENOENT);
	free(page);

	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
