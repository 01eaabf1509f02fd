// SPDX-License-Identifier: MIT
/*
 * t_vdir.c - [vdir] view GETs of pages the pool directory lists are copied by the library
 * itself (client/vread.c), synchronous and through kvb_submit(), and must be exactly what the
 * broker's copy writes. The namespace has two components (kv: 4 layers x 512 B, rope: 2 x 64
 * B, 16 tokens per page); two views describe an engine's layer-first cache (each page's tokens
 * one run: one copy per part) and a token-major one (one copy per token and part).
 *   - Every view GET, whole pages and layer ranges, sync and async, at slots on and off a page
 *     boundary, leaves the same bytes as the broker's copy into a second client's identical
 *     views (KVB_CLIENT_DIR=0), and nothing else changed; each is one directory read in the
 *     broker's counters, and the broker copied nothing for them.
 *   - Ordering: a DELETE of ours earlier in the batch, or in flight, makes the GET the broker's
 *     (-ENOENT), as the broker runs SQEs in order.
 *   - Errors stay the broker's: a slot past the buffer -EFAULT, a layer range past the deepest
 *     component -EINVAL, a page never stored -ENOENT.
 *   - A batch the library answered itself wakes a completion fd; a view GET with
 *     KVB_OPF_ASYNC is the broker's.
 *   - A view destroyed and its buffer unregistered, a new one over a new buffer is read right.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define TPP 16
#define NPAGES 8
#define NSLOTS (NPAGES * TPP + TPP) /* one spare page of slots for the unaligned reads */
#define KV_LAYERS 4
#define KV_BPT 512
#define RO_LAYERS 2
#define RO_BPT 64
#define NPARTS (KV_LAYERS + RO_LAYERS)
#define REC (KV_LAYERS * KV_BPT + RO_LAYERS * RO_BPT + 64) /* token-major record, padded */
#define LOAD_OPS (NPAGES / 2 + 2 + NPAGES)		   /* view GETs of one load() */
#define SENTINEL 0xa5
#define SEED 77

static uint32_t bpt[NPARTS];
static size_t pb;

struct views {
	uint32_t lf, tm; /* layer-first, token-major */
	uint8_t *lf_buf, *tm_buf;
	uint32_t lf_bid, tm_bid;
	size_t lf_len, tm_len;
};

static void make_views(kvb_client *c, uint32_t ns, struct views *v)
{
	struct kvb_view_part lf[NPARTS], tm[NPARTS];
	uint64_t off = 0, rec = 0;

	v->lf_len = 0;
	for (uint32_t p = 0; p < NPARTS; p++)
		v->lf_len += (size_t)NSLOTS * bpt[p];
	v->tm_len = (size_t)NSLOTS * REC;
	v->lf_buf = kvb_buf_alloc_host(c, v->lf_len, &v->lf_bid);
	v->tm_buf = kvb_buf_alloc_host(c, v->tm_len, &v->tm_bid);
	CHECK(v->lf_buf && v->tm_buf);
	for (uint32_t p = 0; p < NPARTS; p++) {
		lf[p] = (struct kvb_view_part){.buf = v->lf_bid, .stride = bpt[p], .base = off};
		tm[p] = (struct kvb_view_part){.buf = v->tm_bid, .stride = REC, .base = rec};
		off += (uint64_t)NSLOTS * bpt[p];
		rec += bpt[p];
	}
	CHECK_OK(kvb_view_create(c, ns, lf, NPARTS, &v->lf));
	CHECK_OK(kvb_view_create(c, ns, tm, NPARTS, &v->tm));
	memset(v->lf_buf, SENTINEL, v->lf_len);
	memset(v->tm_buf, SENTINEL, v->tm_len);
}

static void same_bytes(const struct views *a, const struct views *b, const char *what)
{
	CHECKF(memcmp(a->lf_buf, b->lf_buf, a->lf_len) == 0,
	       "%s: the layer-first views differ from the broker's copy", what);
	CHECKF(memcmp(a->tm_buf, b->tm_buf, a->tm_len) == 0,
	       "%s: the token-major views differ from the broker's copy", what);
}

/* Copies the broker ran, on its loop or its copy threads. */
static uint64_t broker_copies(kvb_client *c)
{
	return harness_stat(c, "copy.inline_jobs") + harness_stat(c, "copy.queued_jobs");
}

/* A page op on a view slot, for kvb_submit(). */
static struct kvb_op view_op(uint32_t opcode, uint32_t view, kvb_key key, uint64_t slot,
			     uint64_t user_data)
{
	return (struct kvb_op){.opcode = opcode,
			       .flags = KVB_OPF_VIEW,
			       .buf = view,
			       .key = key,
			       .off = slot,
			       .user_data = user_data};
}

/* The same view GETs, sync then async, by a client: the ops the two clients must agree on. */
static void load(kvb_client *c, const struct views *v, const kvb_key *k)
{
	struct kvb_op ops[2 * NPAGES];
	struct kvb_completion comp[2 * NPAGES];
	uint32_t n = 0;

	/* Sync: whole pages at page boundaries, a layer range at an unaligned slot. */
	for (uint32_t i = 0; i < NPAGES / 2; i++)
		CHECK_RC(kvb_view_get(c, v->lf, k[i], (uint64_t)i * TPP, 0, 0), (long long)pb);
	CHECK_RC(kvb_view_get(c, v->tm, k[0], 5, 1, 2), (long long)pb);
	CHECK_RC(kvb_view_get(c, v->lf, k[1], NPAGES * TPP + 3, 0, 1), (long long)pb);
	/* Async: the other pages layer by layer into the layer-first view, whole into the other. */
	for (uint32_t i = NPAGES / 2; i < NPAGES; i++) {
		ops[n] = view_op(KVB_OP_GET, v->lf, k[i], (uint64_t)i * TPP, n);
		ops[n].layer_first = (uint16_t)(i % KV_LAYERS);
		ops[n].layer_count = 1;
		n++;
		ops[n] = view_op(KVB_OP_GET, v->tm, k[i], (uint64_t)i * TPP + 1, n);
		n++;
	}
	CHECK_RC(kvb_submit(c, ops, n), (long long)n);
	harness_reap_n(c, comp, n);
	for (uint32_t i = 0; i < n; i++)
		CHECKF(comp[i].res == (int32_t)pb, "async view GET %llu: %d",
		       (unsigned long long)comp[i].user_data, comp[i].res);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct views va, vb;
	struct kvb_op ops[2];
	struct kvb_completion comp[2];
	struct pollfd pfd;
	kvb_client *c, *d;
	kvb_key k[NPAGES], none = harness_key(SEED, 999);
	uint64_t dir0, gets0, copies0;
	uint32_t ns, nsd, old_tm;
	uint8_t *page;
	int cfd;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "vdir", 0);
	setenv("KVB_CLIENT_DIR", "0", 1); /* d: every page through the broker */
	d = harness_connect(b, "broker-copies", 0);
	unsetenv("KVB_CLIENT_DIR");
	harness_layout(&l, "test/vdir", KVB_LAYOUT_MLA, TPP, 1, 0, KV_LAYERS, KV_BPT);
	harness_layout_add(&l, "rope", RO_LAYERS, RO_BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_OK(kvb_ns_open(d, &l, &nsd, NULL));
	for (uint32_t p = 0; p < NPARTS; p++)
		bpt[p] = p < KV_LAYERS ? KV_BPT : RO_BPT;
	page = malloc(pb);
	CHECK(page != NULL);
	for (uint32_t i = 0; i < NPAGES; i++) {
		k[i] = harness_key(SEED, i);
		harness_fill(page, pb, &k[i], SEED);
		CHECK_OK(kvb_put(c, ns, k[i], page, pb));
	}
	make_views(c, ns, &va);
	make_views(d, nsd, &vb);

	/* The same reads both ways: the same bytes; ours are directory reads, no broker copy. */
	dir0 = harness_stat(c, "counters.dir_gets");
	gets0 = harness_stat(c, "counters.gets");
	copies0 = broker_copies(c);
	load(c, &va, k);
	CHECK_EQ(harness_stat(c, "counters.dir_gets"), dir0 + LOAD_OPS);
	CHECK_EQ(harness_stat(c, "counters.gets"), gets0 + LOAD_OPS);
	CHECK_EQ(broker_copies(c), copies0);
	load(d, &vb, k);
	CHECK_EQ(harness_stat(c, "counters.dir_gets"), dir0 + LOAD_OPS);
	CHECK_EQ(harness_stat(c, "counters.gets"), gets0 + 2 * LOAD_OPS);
	CHECK(broker_copies(c) >= copies0 + LOAD_OPS);
	same_bytes(&va, &vb, "sync and async view GETs");

	/* Errors are the broker's. */
	CHECK_RC(kvb_view_get(c, va.lf, k[0], 4 * NSLOTS, 0, 0), -EFAULT);
	CHECK_RC(kvb_view_get(d, vb.lf, k[0], 4 * NSLOTS, 0, 0), -EFAULT);
	CHECK_RC(kvb_view_get(c, va.lf, k[0], 0, KV_LAYERS - 1, 2), -EINVAL);
	CHECK_RC(kvb_view_get(d, vb.lf, k[0], 0, KV_LAYERS - 1, 2), -EINVAL);
	CHECK_RC(kvb_view_get(c, va.lf, none, 0, 0, 0), -ENOENT);
	/* Slots up to and past the end of the buffers: each answered as the broker answers it. */
	for (uint64_t slot = NSLOTS - TPP - 2; slot < NSLOTS + 80; slot++) {
		int rc = kvb_view_get(c, va.tm, k[6], slot, 0, 0);

		CHECK_RC(kvb_view_get(d, vb.tm, k[6], slot, 0, 0), rc);
		rc = kvb_view_get(c, va.lf, k[7], slot, 2, 1);
		CHECK_RC(kvb_view_get(d, vb.lf, k[7], slot, 2, 1), rc);
	}
	same_bytes(&va, &vb, "view GETs at the end of the buffers");

	/* A completion fd wakes for a batch we answered ourselves. */
	cfd = kvb_completion_fd(c);
	CHECK(cfd >= 0);
	ops[0] = view_op(KVB_OP_GET, va.lf, k[2], 2 * TPP, 41);
	dir0 = harness_stat(c, "counters.dir_gets");
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	pfd = (struct pollfd){.fd = cfd, .events = POLLIN};
	CHECKF(poll(&pfd, 1, 2000) == 1, "the completion fd did not wake for a local completion");
	harness_reap_n(c, comp, 1);
	CHECK_EQ(comp[0].user_data, 41);
	CHECK_RC(comp[0].res, (long long)pb);
	CHECK_EQ(harness_stat(c, "counters.dir_gets"), dir0 + 1);

	/* KVB_OPF_ASYNC: the broker copies it, no directory read; the bytes are the same. */
	ops[0] = view_op(KVB_OP_GET, va.tm, k[2], 9, 42);
	ops[0].flags |= KVB_OPF_ASYNC;
	copies0 = broker_copies(c);
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	harness_reap_n(c, comp, 1);
	CHECK_RC(comp[0].res, (long long)pb);
	CHECK_EQ(harness_stat(c, "counters.dir_gets"), dir0 + 1);
	CHECK_EQ(broker_copies(c), copies0 + 1);
	CHECK_RC(kvb_view_get(d, vb.tm, k[2], 9, 0, 0), (long long)pb);
	same_bytes(&va, &vb, "a view GET with KVB_OPF_ASYNC");

	/* A DELETE earlier in the batch: the GET after it is the broker's, and finds nothing. */
	ops[0] = (struct kvb_op){.opcode = KVB_OP_DELETE, .ns = ns, .key = k[3], .user_data = 1};
	ops[1] = view_op(KVB_OP_GET, va.lf, k[3], 3 * TPP, 2);
	CHECK_RC(kvb_submit(c, ops, 2), 2);
	harness_reap_n(c, comp, 2);
	for (int i = 0; i < 2; i++)
		CHECK_RC(comp[i].res, comp[i].user_data == 1 ? 0 : -ENOENT);
	/* A DELETE in flight from an earlier batch: the same. */
	ops[0].key = k[4];
	ops[1].key = k[4];
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	CHECK_RC(kvb_submit(c, ops + 1, 1), 1);
	harness_reap_n(c, comp, 2);
	for (int i = 0; i < 2; i++)
		CHECK_RC(comp[i].res, comp[i].user_data == 1 ? 0 : -ENOENT);

	/* ... and for a synchronous GET while it is still in flight. */
	ops[0].key = k[5];
	CHECK_RC(kvb_submit(c, ops, 1), 1);
	CHECK_RC(kvb_view_get(c, va.lf, k[5], 5 * TPP, 0, 0), -ENOENT);
	harness_reap_n(c, comp, 1);
	CHECK_RC(comp[0].res, 0);

	/*
	 * A PUT from slots the next GET of the batch writes (an engine evicting a page and loading
	 * another into its slots): the PUT stores what the slots held before the GET.
	 */
	{
		kvb_key kn = harness_key(SEED, 500);
		uint8_t *got = malloc(pb);

		CHECK(got != NULL);
		CHECK_RC(kvb_view_get(c, va.lf, k[6], 6 * TPP, 0, 0), (long long)pb);
		ops[0] = view_op(KVB_OP_PUT, va.lf, kn, 6 * TPP, 1);
		ops[1] = view_op(KVB_OP_GET, va.lf, k[7], 6 * TPP, 2);
		CHECK_RC(kvb_submit(c, ops, 2), 2);
		harness_reap_n(c, comp, 2);
		for (int i = 0; i < 2; i++)
			CHECK_RC(comp[i].res, comp[i].user_data == 1 ? 0 : (long long)pb);
		CHECK_RC(kvb_get(c, ns, kn, got, pb), (long long)pb);
		CHECK_OK(
			harness_verify(got, pb, &k[6], SEED, "a page PUT from slots a GET reused"));
		free(got);
	}

	/* A view gone with its buffer; a new one over a new buffer is read right, by us. */
	old_tm = va.tm;
	CHECK_OK(kvb_view_destroy(c, va.tm));
	CHECK_OK(kvb_buf_unregister(c, va.tm_bid));
	CHECK_OK(kvb_view_destroy(c, va.lf));
	CHECK_OK(kvb_buf_unregister(c, va.lf_bid));
	CHECK_RC(kvb_view_get(c, old_tm, k[0], 0, 0, 0), -EBADF);
	make_views(c, ns, &va);
	memset(vb.tm_buf, SENTINEL, vb.tm_len);
	dir0 = harness_stat(c, "counters.dir_gets");
	CHECK_RC(kvb_view_get(c, va.tm, k[2], 7, 0, 0), (long long)pb);
	CHECK_RC(kvb_view_get(d, vb.tm, k[2], 7, 0, 0), (long long)pb);
	CHECK_EQ(harness_stat(c, "counters.dir_gets"), dir0 + 1);
	CHECKF(memcmp(va.tm_buf, vb.tm_buf, va.tm_len) == 0,
	       "a view over a new buffer differs from the broker's copy");

	kvb_close(c);
	kvb_close(d);
	harness_broker_stop(b);
	free(page);
	return H_PASS;
}
