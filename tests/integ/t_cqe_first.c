// SPDX-License-Identifier: MIT
/*
 * t_cqe_first.c - [cqe-first] an inline PUT's CQE goes out before its commit (xfer.c), and so
 * does a filled PUT's (a PUT from plain memory, whose last step runs in its session's turn),
 * so what its client does next must still find the page, byte-exact: a GET by another client
 * the moment the PUT returns (another session, polled after the writer's in the same round or
 * the next), a GET behind the PUT in the same kvb_submit batch (the same session's next op),
 * the writer's own ACQUIRE, and a control request. A commit left pending would show as a miss
 * (the page still WRITING), as stale bytes, or as the page still pinned.
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define ROUNDS 3000
#define SEED 7

/* Every check but the batch's (a registered buffer's own) from src: registered or plain. */
static void from(kvb_client *w, kvb_client *r, uint32_t nsw, uint32_t nsr, size_t pb, uint8_t *src,
		 uint64_t seed)
{
	uint8_t *dst = malloc(pb);

	CHECK(dst != NULL);
	/* 3,000 pages into a pool of about 1,000: every PUT after the first thousand evicts. */
	for (uint64_t i = 0; i < ROUNDS; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(src, pb, &k, seed);
		CHECK_RC(kvb_put(w, nsw, k, src, pb), 0);
		memset(dst, 0, pb);
		CHECKF(kvb_get(r, nsr, k, dst, pb) == (int)pb,
		       "page %llu missed right after its PUT", (unsigned long long)i);
		CHECKF(harness_verify(dst, pb, &k, seed, "read") == 0, "page %llu read back wrong",
		       (unsigned long long)i);
	}
	/* The writer's own lease of the page it just stored. */
	for (uint64_t i = 0; i < 200; i++) {
		kvb_key k = harness_key(seed + 2, i);
		struct kvb_lease lease;

		harness_fill(src, pb, &k, seed + 2);
		CHECK_RC(kvb_put(w, nsw, k, src, pb), 0);
		CHECK_OK(kvb_acquire(w, nsw, k, &lease));
		CHECK(harness_verify(lease.data, pb, &k, seed + 2, "lease") == 0);
		CHECK_OK(kvb_release(w, &lease));
	}
	/*
	 * Nothing waits for a next op: a request on the control socket (not an op) right after
	 * the PUT finds it committed, the writer's pin gone.
	 */
	for (uint64_t i = 0; i < 50; i++) {
		kvb_key k = harness_key(seed + 3, i);

		harness_fill(src, pb, &k, seed + 3);
		CHECK_RC(kvb_put(w, nsw, k, src, pb), 0);
		CHECK_EQ(harness_stat(w, "pool.pinned_pages"), 0);
	}
	free(dst);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	kvb_client *w, *r;
	struct kvb_layout l;
	uint32_t nsw, nsr, buf;
	uint64_t fills;
	size_t pb;
	uint8_t *src, *plain;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	w = harness_connect(b, "writer", 0);
	r = harness_connect(b, "reader", 0);
	harness_layout(&l, "test/cqe-first", KVB_LAYOUT_MLA, 64, 1, 0, 1, 1024); /* 64 KiB */
	CHECK_OK(kvb_ns_open(w, &l, &nsw, &pb));
	CHECK_OK(kvb_ns_open(r, &l, &nsr, &pb));
	CHECK_EQ(pb, 65536);
	/* A registered source: the broker copies it inline, the path that posts its CQE first. */
	src = kvb_buf_alloc_host(w, 2 * pb, &buf);
	CHECK(src != NULL);
	from(w, r, nsw, nsr, pb, src, SEED);

	/* PUT then GET of the same key in one batch: the GET runs after the PUT's commit. */
	for (uint64_t i = 0; i < 200; i++) {
		kvb_key k = harness_key(SEED + 1, i);
		struct kvb_op ops[2] = {
			{.opcode = KVB_OP_PUT,
			 .ns = nsw,
			 .buf = buf,
			 .key = k,
			 .off = 0,
			 .user_data = 1},
			{.opcode = KVB_OP_GET,
			 .ns = nsw,
			 .buf = buf,
			 .key = k,
			 .off = pb,
			 .user_data = 2},
		};
		struct kvb_completion comp[2];

		harness_fill(src, pb, &k, SEED + 1);
		memset(src + pb, 0, pb);
		CHECK_EQ(kvb_submit(w, ops, 2), 2);
		harness_reap_n(w, comp, 2);
		for (int j = 0; j < 2; j++)
			CHECKF(comp[j].res == (comp[j].user_data == 1 ? 0 : (int32_t)pb),
			       "batch %llu op %llu: %d", (unsigned long long)i,
			       (unsigned long long)comp[j].user_data, comp[j].res);
		CHECK(harness_verify(src + pb, pb, &k, SEED + 1, "batch") == 0);
	}

	/* Plain memory: filled PUTs (64 KiB is the library's least), every one of them. */
	plain = malloc(pb);
	CHECK(plain != NULL);
	fills = harness_stat(w, "copy.fill_puts");
	from(w, r, nsw, nsr, pb, plain, SEED + 10);
	CHECK_EQ(harness_stat(w, "copy.fill_puts") - fills, ROUNDS + 250);
	CHECK_EQ(harness_stat(w, "counters.errors"), 0);
	free(plain);
	kvb_close(r);
	kvb_close(w);
	harness_broker_stop(b);
	return 0;
}
