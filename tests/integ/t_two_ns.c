// SPDX-License-Identifier: MIT
/*
 * t_two_ns.c - two namespaces with different page sizes (16 KiB and 1.5 MiB) share one pool:
 * the same keys stored in both are two different pages, PUTs interleaved from one client and
 * from a second process at the same time all read back byte-exact, a DELETE in one namespace
 * leaves the other alone, and the accounting adds up slot size by slot size.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NKEYS 32
#define SEED_A 1
#define SEED_B 2

struct shared {
	kvb_key keys[2 * NKEYS];
	char sock[108];
	struct harness_gate go;
};

static struct shared *sh;

static void layout_a(struct kvb_layout *l)
{
	harness_layout(l, "test/small-pages", KVB_LAYOUT_MLA, 16, 1, 0, 2, 512); /* 16 KiB */
}

static void layout_b(struct kvb_layout *l)
{
	harness_layout(l, "test/big-pages", KVB_LAYOUT_MLA, 64, 1, 0, 24, 1024); /* 1.5 MiB */
}

/* A second process writing keys NKEYS..2*NKEYS-1 of both namespaces while the parent writes. */
static int writer(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .name = "writer"};
	struct kvb_layout la, lb;
	kvb_client *c = NULL;
	uint32_t nsa, nsb;
	size_t pa, pb;
	uint8_t *a, *bb;

	(void)idx;
	(void)arg;
	CHECK_OK(kvb_connect(&o, &c));
	layout_a(&la);
	layout_b(&lb);
	CHECK_OK(kvb_ns_open(c, &lb, &nsb, &pb));
	CHECK_OK(kvb_ns_open(c, &la, &nsa, &pa));
	a = malloc(pa);
	bb = malloc(pb);
	CHECK(a && bb);
	harness_gate_wait(&sh->go, 10000);
	for (int i = NKEYS; i < 2 * NKEYS; i++) {
		harness_fill(bb, pb, &sh->keys[i], SEED_B);
		CHECK_RC(kvb_put(c, nsb, sh->keys[i], bb, pb), 0);
		harness_fill(a, pa, &sh->keys[i], SEED_A);
		CHECK_RC(kvb_put(c, nsa, sh->keys[i], a, pa), 0);
	}
	free(a);
	free(bb);
	kvb_close(c);
	return H_PASS;
}

static void verify_all(kvb_client *c, uint32_t nsa, size_t pa, uint32_t nsb, size_t pb, int from,
		       int to)
{
	uint8_t *buf = malloc(pb > pa ? pb : pa);
	char what[64];

	CHECK(buf != NULL);
	for (int i = from; i < to; i++) {
		snprintf(what, sizeof(what), "ns A key %d", i);
		CHECK_RC(kvb_get(c, nsa, sh->keys[i], buf, pa), (long long)pa);
		CHECK(harness_verify(buf, pa, &sh->keys[i], SEED_A, what) == 0);
		snprintf(what, sizeof(what), "ns B key %d", i);
		CHECK_RC(kvb_get(c, nsb, sh->keys[i], buf, pb), (long long)pb);
		CHECK(harness_verify(buf, pb, &sh->keys[i], SEED_B, what) == 0);
	}
	free(buf);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout la, lb;
	kvb_client *c;
	uint32_t nsa, nsb;
	size_t pa, pb;
	uint8_t *a, *bb;
	pid_t pid;
	char *json, path[96];
	uint64_t used;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "192M");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->go);
	for (int i = 0; i < 2 * NKEYS; i++)
		sh->keys[i] = harness_key(77, (uint64_t)i);

	c = harness_connect(b, "t_two_ns", 0);
	layout_a(&la);
	layout_b(&lb);
	CHECK_OK(kvb_ns_open(c, &la, &nsa, &pa));
	CHECK_OK(kvb_ns_open(c, &lb, &nsb, &pb));
	CHECK_NE(nsa, nsb);
	CHECK_EQ(pa, 16384);
	CHECK_EQ(pb, 1572864);
	a = malloc(pa);
	bb = malloc(pb);
	CHECK(a && bb);

	pid = harness_fork(writer, 0, NULL);
	harness_gate_open(&sh->go, 1);
	/* Interleaved: A then B for each key; the same key in both namespaces is two pages. */
	for (int i = 0; i < NKEYS; i++) {
		harness_fill(a, pa, &sh->keys[i], SEED_A);
		CHECK_RC(kvb_put(c, nsa, sh->keys[i], a, pa), 0);
		harness_fill(bb, pb, &sh->keys[i], SEED_B);
		CHECK_RC(kvb_put(c, nsb, sh->keys[i], bb, pb), 0);
		if (i % 8 == 7)
			verify_all(c, nsa, pa, nsb, pb, 0, i + 1);
	}
	CHECK_EQ(harness_wait(&pid, 1, 30000, NULL), 0);
	verify_all(c, nsa, pa, nsb, pb, 0, 2 * NKEYS);

	json = harness_stats(c);
	snprintf(path, sizeof(path), "namespaces[id=%u].pages", nsa);
	CHECK_EQ(harness_stat_u64(json, path), 2 * NKEYS);
	snprintf(path, sizeof(path), "namespaces[id=%u].pages", nsb);
	CHECK_EQ(harness_stat_u64(json, path), 2 * NKEYS);
	snprintf(path, sizeof(path), "namespaces[id=%u].page_bytes", nsa);
	CHECK_EQ(harness_stat_u64(json, path), pa);
	snprintf(path, sizeof(path), "namespaces[id=%u].page_bytes", nsb);
	CHECK_EQ(harness_stat_u64(json, path), pb);
	used = 2 * NKEYS * (harness_slot_bytes(pa) + harness_slot_bytes(pb));
	CHECK_EQ(harness_stat_u64(json, "pool.pages"), 4 * NKEYS);
	CHECK_EQ(harness_stat_u64(json, "pool.bytes_used"), used);
	CHECK_EQ(harness_stat_u64(json, "counters.dedup"), 0);
	CHECK_EQ(harness_stat_u64(json, "counters.evictions"), 0);
	/* Two page sizes cannot share a slab. */
	CHECK_GE(harness_stat_u64(json, "pool.slabs_total") -
			 harness_stat_u64(json, "pool.slabs_free"),
		 2);
	free(json);

	/* A delete in A leaves B's page under the same key alone. */
	CHECK_OK(kvb_delete(c, nsa, sh->keys[3]));
	CHECK_RC(kvb_get(c, nsa, sh->keys[3], a, pa), -ENOENT);
	CHECK_RC(kvb_get(c, nsb, sh->keys[3], bb, pb), (long long)pb);
	CHECK(harness_verify(bb, pb, &sh->keys[3], SEED_B, "B after delete in A") == 0);
	CHECK_EQ(harness_stat_wait(c, "pool.bytes_used", used - harness_slot_bytes(pa), 1000),
		 used - harness_slot_bytes(pa));

	free(a);
	free(bb);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
