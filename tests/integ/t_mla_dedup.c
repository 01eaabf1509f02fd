// SPDX-License-Identifier: MIT
/*
 * t_mla_dedup.c - the point of kvbroker: eight TP ranks of one MLA engine (eight processes, each
 * its own kvb_connect, tp_size 8, tp_rank 0..7) resolve to one namespace, and when they all PUT
 * the same keys at the same time the pool keeps one copy: pool.pages == nkeys,
 * pool.bytes_used == nkeys x slot, exactly one PUT per key stores (returns 0) and the other seven
 * report EXISTED (return 1, counted in counters.dedup == 7 x nkeys). Then every rank reads every
 * page back byte-exact, through both GET paths and a lease.
 *
 * The ranks start together behind a gate and each walks the keys from a different starting
 * point, so PUTs of one key from several ranks really do race inside the broker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NRANKS 8
#define NKEYS 48
#define SEED 8080

/* A small MLA page: 64 tokens x 8 layers x 576 B (kv_lora 512 + rope 64, 8-bit) = 288 KiB. */
#define TPP 64
#define LAYERS 8
#define BPTL 576
#define PAGE ((uint64_t)TPP * LAYERS * BPTL)

struct shared {
	uint32_t ns; /* opened by the parent first */
	uint32_t child_ns[NRANKS];
	int stored[NRANKS];   /* PUTs that returned 0 */
	int existed[NRANKS];  /* PUTs that returned 1 */
	int stored_by[NKEYS]; /* rank + 1 of the PUT that stored each key */
	kvb_key keys[NKEYS];
	struct harness_gate go, ready;
	char sock[108];
};

static struct shared *sh;

static void layout(struct kvb_layout *l, uint32_t rank)
{
	harness_layout(l, "deepseek-ai/DeepSeek-V3-test", KVB_LAYOUT_MLA, TPP, NRANKS, rank, LAYERS,
		       BPTL);
}

static kvb_client *connect_rank(int rank)
{
	struct kvb_opts o = {.socket_path = sh->sock};
	char name[32];
	kvb_client *c = NULL;
	int rc;

	snprintf(name, sizeof(name), "rank%d", rank);
	o.name = name;
	rc = kvb_connect(&o, &c);
	CHECKF(rc == 0, "rank %d: kvb_connect: %d (%s)", rank, rc, harness_strerror(rc));
	return c;
}

static int put_rank(int rank, void *arg)
{
	struct kvb_layout l;
	kvb_client *c;
	uint8_t *page;
	size_t pb;
	uint32_t ns;

	(void)arg;
	c = connect_rank(rank);
	layout(&l, (uint32_t)rank);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PAGE);
	sh->child_ns[rank] = ns;
	page = malloc(pb);
	CHECK(page != NULL);
	harness_gate_open(&sh->ready, 1);
	harness_gate_wait(&sh->go, 10000);
	for (int j = 0; j < NKEYS; j++) {
		/* Rank r starts at key r * NKEYS / NRANKS: every key is raced by some ranks. */
		int k = (j + rank * NKEYS / NRANKS) % NKEYS;
		int rc;

		harness_fill(page, pb, &sh->keys[k], SEED);
		rc = kvb_put(c, ns, sh->keys[k], page, pb);
		CHECKF(rc == 0 || rc == 1, "rank %d: put of key %d returned %d (%s)", rank, k, rc,
		       harness_strerror(rc));
		if (rc == 0) {
			int prev = __atomic_exchange_n(&sh->stored_by[k], rank + 1,
						       __ATOMIC_SEQ_CST);

			sh->stored[rank]++;
			CHECKF(prev == 0, "key %d stored twice (by rank %d and rank %d)", k,
			       prev - 1, rank);
		} else {
			sh->existed[rank]++;
		}
	}
	free(page);
	kvb_close(c);
	return H_PASS;
}

static int get_rank(int rank, void *arg)
{
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c;
	uint8_t *page, *hb;
	uint32_t ns, hbuf;
	size_t pb, hits = 0;
	char what[64];

	(void)arg;
	c = connect_rank(rank);
	layout(&l, (uint32_t)rank);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(ns, sh->ns);
	CHECK_OK(kvb_lookup(c, ns, sh->keys, NKEYS, &hits));
	CHECK_EQ(hits, NKEYS);
	page = malloc(pb);
	hb = kvb_buf_alloc_host(c, pb, &hbuf);
	CHECK(page && hb);
	harness_gate_wait(&sh->go, 10000);
	for (int j = 0; j < NKEYS; j++) {
		int k = (j + rank * 5) % NKEYS;

		snprintf(what, sizeof(what), "rank %d key %d", rank, k);
		memset(page, 0, pb);
		CHECK_RC(kvb_get(c, ns, sh->keys[k], page, pb), (long long)pb);
		CHECK(harness_verify(page, pb, &sh->keys[k], SEED, what) == 0);
		memset(hb, 0, pb);
		CHECK_RC(kvb_get(c, ns, sh->keys[k], hb, pb), (long long)pb);
		CHECK(harness_verify(hb, pb, &sh->keys[k], SEED, what) == 0);
		CHECK_OK(kvb_acquire(c, ns, sh->keys[k], &lease));
		CHECK(harness_verify(lease.data, pb, &sh->keys[k], SEED, what) == 0);
		CHECK_OK(kvb_release(c, &lease));
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
	int total_stored = 0, total_existed = 0;
	size_t pb;
	char *json, path[96];

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "128M");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->go);
	harness_gate_init(&sh->ready);
	for (int i = 0; i < NKEYS; i++)
		sh->keys[i] = harness_key(SEED, (uint64_t)i);

	/* The parent is an observer: it opens the namespace (rank 0's identity) and reads stats. */
	c = harness_connect(b, "observer", 0);
	layout(&l, 0);
	CHECK_OK(kvb_ns_open(c, &l, &sh->ns, &pb));
	CHECK_EQ(pb, PAGE);

	harness_log("phase 1: %d ranks put the same %d keys of %llu bytes", NRANKS, NKEYS,
		    (unsigned long long)PAGE);
	for (int r = 0; r < NRANKS; r++)
		pids[r] = harness_fork(put_rank, r, NULL);
	for (int r = 0; r < NRANKS; r++)
		harness_gate_wait(&sh->ready, 10000);
	CHECK_EQ(harness_stat(c, "clients"), NRANKS + 1);
	harness_gate_open(&sh->go, NRANKS);
	CHECK_EQ(harness_wait(pids, NRANKS, 30000, NULL), 0);

	for (int r = 0; r < NRANKS; r++) {
		CHECKF(sh->child_ns[r] == sh->ns,
		       "rank %d got ns %u, rank 0 ns %u: MLA ranks must share", r, sh->child_ns[r],
		       sh->ns);
		harness_log("rank %d: stored %d, existed %d", r, sh->stored[r], sh->existed[r]);
		total_stored += sh->stored[r];
		total_existed += sh->existed[r];
	}
	CHECK_EQ(total_stored, NKEYS);
	CHECK_EQ(total_existed, (NRANKS - 1) * NKEYS);
	for (int k = 0; k < NKEYS; k++)
		CHECKF(sh->stored_by[k] != 0, "key %d never stored", k);

	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "pool.pages"), NKEYS);
	CHECK_EQ(harness_stat_u64(json, "pool.bytes_used"), NKEYS * harness_slot_bytes(PAGE));
	CHECK_EQ(harness_stat_u64(json, "counters.dedup"), (NRANKS - 1) * NKEYS);
	CHECK_EQ(harness_stat_u64(json, "counters.evictions"), 0);
	snprintf(path, sizeof(path), "namespaces[id=%u].pages", sh->ns);
	CHECK_EQ(harness_stat_u64(json, path), NKEYS);
	snprintf(path, sizeof(path), "namespaces[id=%u].dedup", sh->ns);
	CHECK_EQ(harness_stat_u64(json, path), (NRANKS - 1) * NKEYS);
	snprintf(path, sizeof(path), "namespaces[id=%u].kind", sh->ns);
	CHECK(harness_stat_has(json, path));
	/* One namespace only: the observer's open and eight ranks' opens all landed on it. */
	CHECK(!harness_stat_has(json, "namespaces[1]"));
	free(json);

	harness_log("phase 2: every rank reads every page");
	for (int r = 0; r < NRANKS; r++)
		pids[r] = harness_fork(get_rank, r, NULL);
	harness_gate_open(&sh->go, NRANKS);
	CHECK_EQ(harness_wait(pids, NRANKS, 30000, NULL), 0);

	/* The ranks are gone: the broker notices their hang-ups. */
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 2000), 1);
	CHECK_EQ(harness_stat_wait(c, "leases", 0, 2000), 0);
	CHECK_EQ(harness_stat(c, "pool.pages"), NKEYS);

	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
