// SPDX-License-Identifier: MIT
/*
 * t_async.c - kvb_submit() / kvb_reap(): batches of PUT, GET, ACQUIRE and NOP with user_data
 * round trips, on a client with the smallest SQ (8 entries), so that every batch is larger than
 * the ring: submit queues what fits and returns the count, the caller reaps and continues. Every
 * op completes exactly once with its own user_data; results are byte-exact; per-op errors
 * (-ENOENT, -EFAULT, -EBADF) arrive in their own completions without disturbing the others; a
 * malformed op refuses the whole batch up front; a synchronous call made while async ops are in
 * flight does not steal their completions; reaping with nothing in flight times out.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define NPAGES 64
#define SEED 777
#define UD(kind, i) (((uint64_t)(kind) << 56) | 0x00a5a5a500000000ull | (uint64_t)(i))
#define UD_KIND(ud) ((int)((ud) >> 56))
#define UD_IDX(ud) ((int)((ud)&0xffffffffu))

enum { K_PUT = 1, K_NOP, K_GET, K_DUP, K_ERR, K_ACQ };

static kvb_client *c;
static uint32_t ns;
static size_t pb;
static kvb_key keys[NPAGES];

struct result {
	int count;
	int32_t res;
	uint32_t flags;
	struct kvb_lease lease;
};

/*
 * Submits all n ops, reaping whenever the ring is full, then reaps the rest. Every completion
 * is recorded in res[] by its position in ops[] (found through user_data). Returns how many ops
 * the first kvb_submit() call accepted.
 */
static int run_batch(const struct kvb_op *ops, int n, struct result *res)
{
	struct kvb_completion comp[32];
	int sent = 0, done = 0, first = -1, rounds = 0;

	memset(res, 0, (size_t)n * sizeof(*res));
	while (done < n) {
		if (sent < n) {
			int rc = kvb_submit(c, ops + sent, (size_t)(n - sent));

			CHECKF(rc >= 0, "kvb_submit of %d ops: %d (%s)", n - sent, rc,
			       harness_strerror(rc));
			if (first < 0)
				first = rc;
			sent += rc;
			if (sent < n)
				CHECKF(rc > 0 || done < sent,
				       "kvb_submit accepted nothing with nothing in flight");
		}
		{
			int rc = kvb_reap(c, comp, 32, 1, 5000);

			CHECKF(rc > 0, "kvb_reap: %d (%s); %d of %d done, %d sent", rc,
			       harness_strerror(rc), done, n, sent);
			for (int j = 0; j < rc; j++) {
				int i = -1;

				for (int q = 0; q < n; q++)
					if (ops[q].user_data == comp[j].user_data)
						i = q;
				CHECKF(i >= 0, "completion with unknown user_data 0x%llx",
				       (unsigned long long)comp[j].user_data);
				CHECKF(res[i].count == 0, "two completions for op %d", i);
				res[i].count = 1;
				res[i].res = comp[j].res;
				res[i].flags = comp[j].flags;
				res[i].lease = comp[j].lease;
			}
			done += rc;
			CHECK_LE(done, sent);
		}
		CHECK(++rounds < 10000);
	}
	return first;
}

static struct kvb_op op(uint32_t opcode, uint32_t ns_, const kvb_key *k, uint32_t buf, uint64_t off,
			uint64_t ud)
{
	struct kvb_op o;

	memset(&o, 0, sizeof(o));
	o.opcode = opcode;
	o.ns = ns_;
	if (k)
		o.key = *k;
	o.buf = buf;
	o.off = off;
	o.user_data = ud;
	return o;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_op ops[128];
	struct result res[128];
	struct kvb_completion comp[8];
	uint8_t *src, *dst;
	uint32_t sbuf, dbuf;
	kvb_key unknown = harness_key(SEED, 5000);
	uint64_t t0, dt;
	int n, first;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "t_async", 8);
	harness_layout(&l, "test/async", KVB_LAYOUT_MLA, 32, 1, 0, 4, 512); /* 64 KiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	src = kvb_buf_alloc_host(c, NPAGES * pb, &sbuf);
	dst = kvb_buf_alloc_host(c, NPAGES * pb, &dbuf);
	CHECK(src && dst);
	for (int i = 0; i < NPAGES; i++) {
		keys[i] = harness_key(SEED, (uint64_t)i);
		harness_fill(src + (size_t)i * pb, pb, &keys[i], SEED);
	}

	/* Nothing in flight: reap times out, after about the time asked. */
	t0 = harness_now_ms();
	CHECK_RC(kvb_reap(c, comp, 8, 1, 50), -ETIMEDOUT);
	dt = harness_now_ms() - t0;
	CHECKF(dt >= 40 && dt < 2000, "kvb_reap(timeout 50 ms) returned after %llu ms",
	       (unsigned long long)dt);
	CHECK_RC(kvb_reap(c, comp, 8, 0, 0), 0);

	/* Batch 1: 64 PUTs and 16 NOPs, interleaved; ten times what the SQ holds. */
	n = 0;
	for (int i = 0; i < NPAGES; i++) {
		ops[n++] = op(KVB_OP_PUT, ns, &keys[i], sbuf, (uint64_t)i * pb, UD(K_PUT, i));
		if (i % 4 == 3)
			ops[n++] = op(KVB_OP_NOP, 0, NULL, 0, 0, UD(K_NOP, i));
	}
	first = run_batch(ops, n, res);
	harness_log("batch 1: %d ops, the first submit took %d", n, first);
	CHECK_GT(first, 0);
	CHECK_LT(first, n);
	CHECK_LE(first, 8); /* the SQ's size */
	for (int i = 0; i < n; i++) {
		CHECKF(res[i].res == 0, "op %d (kind %d): res %d (%s)", i,
		       UD_KIND(ops[i].user_data), res[i].res, harness_strerror(res[i].res));
		CHECKF(res[i].flags == 0, "op %d: flags 0x%x", i, res[i].flags);
	}
	CHECK_EQ(harness_stat(c, "pool.pages"), NPAGES);

	/* Batch 2: GETs, duplicate PUTs, errors and ACQUIREs. */
	n = 0;
	memset(dst, 0, NPAGES * pb);
	for (int i = 0; i < NPAGES; i++) {
		int j = (i * 7) % NPAGES; /* out of order */

		ops[n++] = op(KVB_OP_GET, ns, &keys[j], dbuf, (uint64_t)j * pb, UD(K_GET, j));
		if (i % 8 == 0)
			ops[n++] = op(KVB_OP_PUT, ns, &keys[j], sbuf, (uint64_t)j * pb,
				      UD(K_DUP, j));
	}
	ops[n++] = op(KVB_OP_GET, ns, &unknown, dbuf, 0, UD(K_ERR, 0));
	ops[n++] = op(KVB_OP_PUT, ns, &unknown, sbuf, NPAGES * pb - pb + 1, UD(K_ERR, 1));
	ops[n++] = op(KVB_OP_GET, ns, &keys[0], dbuf, UINT64_MAX - 4096, UD(K_ERR, 2));
	ops[n++] = op(KVB_OP_GET, ns + 100, &keys[0], dbuf, 0, UD(K_ERR, 3));
	ops[n++] = op(KVB_OP_PUT, ns, &unknown, 999, 0, UD(K_ERR, 4));
	ops[n++] = op(KVB_OP_ACQUIRE, ns, &keys[1], 0, 0, UD(K_ACQ, 1));
	ops[n++] = op(KVB_OP_ACQUIRE, ns, &keys[2], 0, 0, UD(K_ACQ, 2));
	first = run_batch(ops, n, res);
	harness_log("batch 2: %d ops, the first submit took %d", n, first);
	for (int i = 0; i < n; i++) {
		int kind = UD_KIND(ops[i].user_data), idx = UD_IDX(ops[i].user_data);

		switch (kind) {
		case K_GET:
			CHECKF(res[i].res == (int)pb, "GET %d: res %d (%s)", idx, res[i].res,
			       harness_strerror(res[i].res));
			break;
		case K_DUP:
			CHECKF(res[i].res == 0 && (res[i].flags & KVB_CQEF_EXISTED),
			       "duplicate PUT %d: res %d flags 0x%x, want 0 with EXISTED", idx,
			       res[i].res, res[i].flags);
			break;
		case K_ACQ:
			CHECKF(res[i].res >= 0, "ACQUIRE %d: %d (%s)", idx, res[i].res,
			       harness_strerror(res[i].res));
			CHECK_EQ(res[i].lease.len, pb);
			CHECK(harness_verify(res[i].lease.data, pb, &keys[idx], SEED,
					     "async lease") == 0);
			CHECK_OK(kvb_release(c, &res[i].lease));
			break;
		case K_ERR: {
			/* unknown key, past the buffer, overflowing offset, unknown ns, unknown buf */
			static const int err_want[] = {-ENOENT, -EFAULT, -EFAULT, -EBADF, -EBADF};
			int want = err_want[idx];

			CHECKF(res[i].res == want, "error op %d: res %d (%s), want %d (%s)", i,
			       res[i].res, harness_strerror(res[i].res), want,
			       harness_strerror(want));
			break;
		}
		default:
			CHECKF(0, "op %d: unexpected kind %d", i, kind);
		}
	}
	for (int j = 0; j < NPAGES; j++) {
		char what[32];

		snprintf(what, sizeof(what), "async GET %d", j);
		CHECK(harness_verify(dst + (size_t)j * pb, pb, &keys[j], SEED, what) == 0);
	}
	CHECK_EQ(harness_stat(c, "pool.pages"), NPAGES);
	CHECK_EQ(harness_stat(c, "leases"), 0);

	/* A malformed op refuses the whole batch; nothing is queued. */
	ops[0] = op(KVB_OP_NOP, 0, NULL, 0, 0, 1);
	ops[1] = op(KVB_OP_LOOKUP, ns, NULL, 0, 0, 2);
	CHECK_RC(kvb_submit(c, ops, 2), -EINVAL);
	ops[1] = op(KVB_OP__COUNT, ns, NULL, 0, 0, 2);
	CHECK_RC(kvb_submit(c, ops, 2), -EINVAL);
	ops[1] = op(KVB_OP_NOP, 0, NULL, 0, 0, 2);
	ops[1].resv = 1;
	CHECK_RC(kvb_submit(c, ops, 2), -EINVAL);
	CHECK_RC(kvb_reap(c, comp, 8, 1, 50), -ETIMEDOUT);

	/* Synchronous calls in the middle of async ops leave the async completions alone. */
	memset(dst, 0, NPAGES * pb);
	for (int i = 0; i < 4; i++)
		ops[i] = op(KVB_OP_GET, ns, &keys[i], dbuf, (uint64_t)i * pb, UD(K_GET, i));
	CHECK_RC(kvb_submit(c, ops, 4), 4);
	CHECK_OK(kvb_nop(c));
	CHECK_RC(kvb_get(c, ns, keys[10], dst + 10 * pb, pb), (long long)pb);
	{
		int got = 0;

		while (got < 4) {
			int rc = kvb_reap(c, comp + got, (size_t)(8 - got), 1, 2000);

			CHECKF(rc > 0, "reap after sync calls: %d (%s), %d of 4", rc,
			       harness_strerror(rc), got);
			got += rc;
		}
		CHECK_EQ(got, 4);
		for (int i = 0; i < 4; i++) {
			CHECK_EQ(UD_KIND(comp[i].user_data), K_GET);
			CHECK_EQ(comp[i].res, pb);
		}
	}
	for (int j = 0; j < 4; j++)
		CHECK(harness_verify(dst + (size_t)j * pb, pb, &keys[j], SEED, "GET around sync") ==
		      0);
	CHECK(harness_verify(dst + 10 * pb, pb, &keys[10], SEED, "sync GET") == 0);
	CHECK_RC(kvb_reap(c, comp, 8, 1, 20), -ETIMEDOUT);

	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
