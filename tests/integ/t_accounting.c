// SPDX-License-Identifier: MIT
/*
 * t_accounting.c - every op is counted once, at completion, whichever way it completed:
 * globally (counters), per namespace and per client (client_list). Regressions:
 *
 *   1. ops that complete later (--copy-inline 0: every copy on a worker) were missed by the
 *      per-client counters: 10 PUTs and 10 GETs of 64 KiB must show bytes_in and bytes_out of
 *      640 KiB each for the client, and puts/gets/hits 10;
 *   2. a parked PUT that ran again was counted again (--copy-fail-every 1: two PUTs of one key
 *      in one batch both fail and must count as 2 puts and 2 errors, not 3);
 *   3. kvb_get() into plain memory (ACQUIRE, memcpy, RELEASE inside the library) counted as an
 *      ACQUIRE and a RELEASE: it is a GET (counters.gets, the namespace's gets and the client's
 *      gets, with its hit), and acquires/releases stay put; a real kvb_acquire() still counts
 *      as an ACQUIRE.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define SEED 5151
#define NOPS 10

static size_t pb;

static kvb_client *attach(struct harness_broker *br, const char *name, uint32_t *ns)
{
	kvb_client *c = harness_connect(br, name, 0);
	struct kvb_layout l;

	harness_layout(&l, "test/accounting", KVB_LAYOUT_MLA, 16, 1, 0, 4, 1024);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, 64u << 10);
	return c;
}

static uint64_t cstat(kvb_client *obs, const char *client, const char *field)
{
	char path[128];

	snprintf(path, sizeof(path), "client_list[name=%s].%s", client, field);
	return harness_stat(obs, path);
}

int main(int argc, char **argv)
{
	struct harness_broker *br;
	kvb_client *c, *obs;
	uint32_t ns, buf;
	uint8_t *reg, *plain;
	char path[128];

	harness_init(argc, argv);

	harness_log("1. deferred copies are credited to their client");
	br = harness_broker_start("--pool", "32M", "--no-directory", "--copy-inline", "0",
				  "--copy-delay-us", "2000");
	c = attach(br, "deferred", &ns);
	obs = harness_connect(br, "observer", 0);
	reg = kvb_buf_alloc_host(c, (NOPS + 1) * pb, &buf);
	CHECK(reg != NULL);
	for (int i = 0; i < NOPS; i++) {
		kvb_key k = harness_key(SEED, (uint64_t)i);

		harness_fill(reg + (size_t)i * pb, pb, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, reg + (size_t)i * pb, pb), 0);
	}
	for (int i = 0; i < NOPS; i++) {
		kvb_key k = harness_key(SEED, (uint64_t)i);

		CHECK_RC(kvb_get(c, ns, k, reg + (size_t)NOPS * pb, pb), (long long)pb);
		CHECK(harness_verify(reg + (size_t)NOPS * pb, pb, &k, SEED, "deferred GET") == 0);
	}
	CHECK_EQ(harness_stat(obs, "copy.queued_jobs"), 2 * NOPS);
	CHECK_EQ(cstat(obs, "deferred", "puts"), NOPS);
	CHECK_EQ(cstat(obs, "deferred", "gets"), NOPS);
	CHECK_EQ(cstat(obs, "deferred", "hits"), NOPS);
	CHECK_EQ(cstat(obs, "deferred", "bytes_in"), NOPS * pb);
	CHECK_EQ(cstat(obs, "deferred", "bytes_out"), NOPS * pb);
	CHECK_EQ(cstat(obs, "deferred", "errors"), 0);
	CHECK_EQ(harness_stat(obs, "counters.bytes_in"), NOPS * pb);
	CHECK_EQ(harness_stat(obs, "counters.bytes_out"), NOPS * pb);
	snprintf(path, sizeof(path), "namespaces[id=%u].puts", ns);
	CHECK_EQ(harness_stat(obs, path), NOPS);
	snprintf(path, sizeof(path), "namespaces[id=%u].gets", ns);
	CHECK_EQ(harness_stat(obs, path), NOPS);

	harness_log("3. kvb_get into plain memory is a GET");
	plain = malloc(pb);
	CHECK(plain != NULL);
	{
		uint64_t gets = harness_stat(obs, "counters.gets");
		uint64_t acq = harness_stat(obs, "counters.acquires");
		uint64_t rel = harness_stat(obs, "counters.releases");
		uint64_t hits = harness_stat(obs, "counters.hits");
		kvb_key k = harness_key(SEED, 0), miss = harness_key(SEED, 999);
		struct kvb_lease l;

		CHECK_RC(kvb_get(c, ns, k, plain, pb), (long long)pb);
		CHECK(harness_verify(plain, pb, &k, SEED, "plain GET") == 0);
		CHECK_RC(kvb_get(c, ns, miss, plain, pb), -ENOENT);
		CHECK_OK(kvb_nop(c)); /* the deferred RELEASE ran before this */
		CHECK_EQ(harness_stat(obs, "counters.gets"), gets + 2);
		CHECK_EQ(harness_stat(obs, "counters.hits"), hits + 1);
		CHECK_EQ(harness_stat(obs, "counters.acquires"), acq);
		CHECK_EQ(harness_stat(obs, "counters.releases"), rel);
		CHECK_EQ(harness_stat(obs, path), NOPS + 2);
		CHECK_EQ(cstat(obs, "deferred", "gets"), NOPS + 2);
		CHECK_EQ(cstat(obs, "deferred", "misses"), 1);
		CHECK_OK(kvb_acquire(c, ns, k, &l));
		CHECK_OK(kvb_release(c, &l));
		CHECK_EQ(harness_stat(obs, "counters.acquires"), acq + 1);
		CHECK_EQ(harness_stat(obs, "counters.releases"), rel + 1);
		CHECK_EQ(harness_stat(obs, "counters.gets"), gets + 2);
	}
	kvb_close(c);
	kvb_close(obs);
	harness_broker_stop(br);

	harness_log("2. a PUT that waited for a failed writer is counted once");
	br = harness_broker_start("--pool", "32M", "--no-directory", "--copy-inline", "0",
				  "--copy-delay-us", "2000", "--copy-fail-every", "1");
	c = attach(br, "failing", &ns);
	obs = harness_connect(br, "observer", 0);
	reg = kvb_buf_alloc_host(c, pb, &buf);
	CHECK(reg != NULL);
	{
		kvb_key k = harness_key(SEED, 77);
		struct kvb_op ops[2];
		struct kvb_completion cs[2];
		int got = 0;

		for (int i = 0; i < 2; i++)
			ops[i] = (struct kvb_op){.opcode = KVB_OP_PUT,
						 .ns = ns,
						 .buf = buf,
						 .key = k,
						 .user_data = (uint64_t)i};
		CHECK_EQ(kvb_submit(c, ops, 2), 2);
		while (got < 2) {
			int r = kvb_reap(c, cs + got, (size_t)(2 - got), 1, 10000);

			CHECK_GT(r, 0);
			got += r;
		}
		CHECK_RC(cs[0].res, -EIO);
		CHECK_RC(cs[1].res, -EIO);
	}
	CHECK_EQ(harness_stat(obs, "counters.puts"), 2);
	CHECK_EQ(harness_stat(obs, "counters.errors"), 2);
	CHECK_EQ(cstat(obs, "failing", "puts"), 2);
	CHECK_EQ(cstat(obs, "failing", "errors"), 2);
	snprintf(path, sizeof(path), "namespaces[id=%u].puts", ns);
	CHECK_EQ(harness_stat(obs, path), 2);
	CHECK_EQ(harness_stat(obs, "ops.parked"), 0);
	kvb_close(c);
	kvb_close(obs);
	harness_broker_stop(br);
	free(plain);
	return H_PASS;
}
