// SPDX-License-Identifier: MIT
/*
 * t_chain.c - chains evicted tail first against a real broker.
 *
 * 1. By hand: 1 MiB pages in a 64 MiB pool, four chains of 12 stored through every path that
 *    carries a parent (kvb_put_child from a registered buffer and from plain memory, which
 *    is a filled PUT, kvb_submit_parents, a view's kvb_view_put_child, and one
 *    naming a parent never stored, which is no error); their tails are read, so the heads are
 *    the coldest pages of the pool; a flood of unrelated pages then evicts, and no chain may
 *    have a page stored after a missing one. The same pages PUT without parents in a second namespace show what plain LRU does
 *    (heads gone first); that is printed, not required.
 * 2. The Zipf workload of tools/kvbchain.c, small: with parent keys no chain is ever stranded
 *    and the hit rate is not below plain LRU's in the same run.
 */
#include <cjson/cJSON.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define CHAINS 4
#define LEN 12
#define FLOOD 40
#define SEED 2020

static kvb_key keys[2][CHAINS][LEN];

/* Pages of a chain stored after its first missing one; *stored counts the stored ones. */
static int stranded(kvb_client *c, uint32_t ns, const kvb_key *k, int *stored)
{
	uint8_t tiers[LEN];
	size_t hits;
	int gone = 0, n = 0;

	CHECK_OK(kvb_lookup_tiers(c, ns, k, LEN, &hits, tiers));
	*stored = 0;
	for (int j = 0; j < LEN; j++) {
		if (tiers[j] == KVB_TIER_NONE) {
			gone = 1;
			continue;
		}
		(*stored)++;
		n += gone;
	}
	return n;
}

static void by_hand(struct harness_broker *b)
{
	kvb_client *c = harness_connect(b, "t_chain", 0);
	struct kvb_layout l;
	uint32_t ns[2], buf, view;
	struct kvb_view_part part[16];
	struct kvb_op ops[LEN];
	kvb_key par[LEN];
	struct kvb_completion done[LEN];
	uint8_t *mem, *plain;
	size_t pb;
	int lost_plain = 0;
	char *json;

	for (int m = 0; m < 2; m++) {
		harness_layout(&l, m ? "test/chain-plain" : "test/chain", KVB_LAYOUT_MLA, 64, 1, 0,
			       16, 1024); /* 1 MiB */
		CHECK_OK(kvb_ns_open(c, &l, &ns[m], &pb));
		for (int i = 0; i < CHAINS; i++)
			harness_key_chain(keys[m][i], LEN, 64, SEED + (uint64_t)i);
	}
	mem = kvb_buf_alloc_host(c, LEN * pb, &buf);
	plain = malloc(pb);
	CHECK(mem != NULL && plain != NULL);
	for (int j = 0; j < LEN; j++)
		harness_fill(mem + (size_t)j * pb, pb, &keys[0][0][j], SEED);
	/* A view over the same buffer: layer L's token slot s at L * LEN * 64 KiB + s KiB. */
	for (int L = 0; L < 16; L++)
		part[L] = (struct kvb_view_part){
			.buf = buf, .stride = 1024, .base = (uint64_t)L * LEN * 64 * 1024};
	CHECK_OK(kvb_view_create(c, ns[0], part, 16, &view));

	for (int m = 0; m < 2; m++) {
		for (int i = 0; i < CHAINS; i++) {
			const kvb_key *k = keys[m][i];

			if (i == 1) { /* async, one batch */
				for (int j = 0; j < LEN; j++) {
					ops[j] = (struct kvb_op){.opcode = KVB_OP_PUT,
								 .ns = ns[m],
								 .buf = buf,
								 .key = k[j],
								 .off = (uint64_t)j * pb};
					if (j && !m) {
						ops[j].flags = KVB_OPF_PARENT;
						par[j] = k[j - 1];
					}
				}
				CHECK_RC(kvb_submit_parents(c, ops, m ? NULL : par, LEN), LEN);
				CHECK_RC(kvb_reap(c, done, LEN, LEN, 10000), LEN);
				for (int j = 0; j < LEN; j++)
					CHECK_RC(done[j].res, 0);
				continue;
			}
			for (int j = 0; j < LEN; j++) {
				/* Chain 3's head names a parent that was never stored. */
				kvb_key ghost = harness_key(SEED, 999);
				const kvb_key *p = m	    ? NULL
						   : j	    ? &k[j - 1]
						   : i == 3 ? &ghost
							    : NULL;

				if (i == 2 && !m) {
					CHECK_RC(kvb_view_put_child(c, view, k[j], p,
								    (uint64_t)j * 64),
						 0);
				} else if (i == 0) {
					/* From plain memory: a filled PUT (ABI 1.4) names it too. */
					memcpy(plain, mem + (size_t)j * pb, pb);
					CHECK_RC(kvb_put_child(c, ns[m], k[j], p, plain, pb), 0);
				} else
					CHECK_RC(kvb_put_child(c, ns[m], k[j], p,
							       mem + (size_t)j * pb, pb),
						 0);
			}
		}
		/* KVB_OPF_PARENT without parents, or on a GET: refused before anything queues. */
		ops[0] = (struct kvb_op){.opcode = KVB_OP_PUT,
					 .flags = KVB_OPF_PARENT,
					 .ns = ns[m],
					 .buf = buf,
					 .key = keys[m][0][0]};
		CHECK_RC(kvb_submit(c, ops, 1), -EINVAL);
		ops[0].opcode = KVB_OP_GET;
		CHECK_RC(kvb_submit_parents(c, ops, par, 1), -EINVAL);
		/*
		 * The engine holds the heads itself and reads only the tails from the broker, so
		 * the heads look the coldest: plain LRU evicts them first and strands the tails.
		 */
		for (int i = 0; i < CHAINS; i++)
			for (int j = LEN / 2; j < LEN; j++)
				CHECK_RC(kvb_get(c, ns[m], keys[m][i][j], mem, pb), (int)pb);
		/* 48 chain pages and the flood in a pool of 64: about half of the chains go. */
		for (int f = 0; f < FLOOD; f++) {
			kvb_key k = harness_key(SEED + 1 + (uint64_t)m, (uint64_t)f);

			CHECK_RC(kvb_put(c, ns[m], k, mem, pb), 0);
		}
		for (int i = 0; i < CHAINS; i++) {
			int st, n = stranded(c, ns[m], keys[m][i], &st);

			harness_log("%s chain %d: %d of %d stored, %d stranded",
				    m ? "plain" : "parent", i, st, LEN, n);
			if (m)
				lost_plain += n;
			else
				CHECKF(n == 0, "chain %d: %d pages stored after a missing one", i,
				       n);
		}
	}
	harness_log("plain LRU stranded %d pages", lost_plain);
	/* Every page but a head linked to its parent (chain 3's ghost is no parent); the flood met
	 * parents with kids at the cold end and kept them. */
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "counters.chain_links"), CHAINS * (LEN - 1));
	CHECK_GT(harness_stat_u64(json, "counters.chain_held"), 0);
	CHECK_EQ(harness_stat_u64(json, "counters.chain_cuts"), 0);
	free(json);
	CHECK_OK(kvb_view_destroy(c, view));
	free(plain);
	kvb_close(c);
}

static void zipf(struct harness_broker *b, const char *argv0)
{
	char tmp[PATH_MAX], cmd[2 * PATH_MAX + 256], out[4096];
	cJSON *root, *par, *plain;
	size_t len;
	FILE *p;
	int st;

	snprintf(tmp, sizeof(tmp), "%s", argv0);
	snprintf(cmd, sizeof(cmd),
		 "%s/../bin/kvbchain --socket %s --prompts 1500 --requests 6000 --assert 2>&1",
		 dirname(tmp), b->sock);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	len = fread(out, 1, sizeof(out) - 1, p);
	out[len] = '\0';
	st = pclose(p);
	harness_log("kvbchain: %s", out);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 0, "kvbchain failed:\n%s", out);
	root = cJSON_Parse(out);
	CHECKF(root != NULL, "kvbchain printed no JSON:\n%s", out);
	par = cJSON_GetObjectItemCaseSensitive(root, "parent");
	plain = cJSON_GetObjectItemCaseSensitive(root, "plain");
	CHECK(par && plain);
	CHECK_EQ(cJSON_GetObjectItemCaseSensitive(par, "stranded_seen")->valuedouble, 0);
	CHECK_EQ(cJSON_GetObjectItemCaseSensitive(par, "stranded_end")->valuedouble, 0);
	CHECK(cJSON_GetObjectItemCaseSensitive(par, "hit_rate")->valuedouble >=
	      cJSON_GetObjectItemCaseSensitive(plain, "hit_rate")->valuedouble);
	cJSON_Delete(root);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	by_hand(b);
	zipf(b, argv[0]);
	harness_broker_stop(b);
	return H_PASS;
}
