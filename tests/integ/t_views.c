// SPDX-License-Identifier: MIT
/*
 * t_views.c - page ops on views: the broker gathers a page from an engine's KV cache layout and
 * scatters it back into another. The namespace has two components with different layer counts
 * (kv: 6 layers x 64 B, idx: 3 layers x 24 B, 16 tokens per page), and two views describe two
 * different cache layouts in registered host buffers:
 *   view A: layer-major, one buffer per component, stride > bytes_per_token_layer (padding);
 *   view B: token-major, one buffer, every part at its own offset in a 480-byte token record.
 * A view PUT from A must store exactly the canonical page ([component][layer][token][bytes]),
 * checked with a plain GET; a view GET into B must write exactly the page's bytes into B's slots
 * and nothing else (padding, neighbouring slots, other layers stay as they were); layer ranges
 * [0,k) then [k,n) load a page in two steps; errors: unknown key, slots past the buffer, a range
 * that selects no layer, destroyed views, malformed views.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define TPP 16
#define NSLOTS 256
#define KV_LAYERS 6
#define KV_BPT 64
#define KV_STRIDE 96
#define IX_LAYERS 3
#define IX_BPT 24
#define IX_STRIDE 40
#define NPARTS (KV_LAYERS + IX_LAYERS)
#define REC 480 /* view B token record: 6 x 64 + 3 x 24 = 456 bytes of KV, then padding */
#define SENTINEL 0xee
#define SEED 66

static uint32_t ns;
static size_t pb;
static uint32_t bpt[NPARTS], part_off[NPARTS], layer_of[NPARTS];

struct view {
	uint32_t id;
	struct kvb_view_part parts[NPARTS];
	uint8_t *map[NPARTS]; /* base of each part's buffer in our address space */
	uint8_t *bufs[2];
	size_t lens[2];
};

static struct view va, vb;

static void page_geometry(void)
{
	uint32_t off = 0;

	for (uint32_t p = 0; p < NPARTS; p++) {
		bpt[p] = p < KV_LAYERS ? KV_BPT : IX_BPT;
		layer_of[p] = p < KV_LAYERS ? p : p - KV_LAYERS;
		part_off[p] = off;
		off += TPP * bpt[p];
	}
	CHECK_EQ(off, pb);
}

/* Address of token slot s of part p in our mapping of the view's buffer. */
static uint8_t *slot_addr(const struct view *v, uint32_t p, uint64_t s)
{
	return v->map[p] + v->parts[p].base + s * v->parts[p].stride;
}

static void make_view_a(kvb_client *c)
{
	uint32_t kvbuf, ixbuf;

	va.lens[0] = (size_t)KV_LAYERS * NSLOTS * KV_STRIDE + 128;
	va.lens[1] = (size_t)IX_LAYERS * NSLOTS * IX_STRIDE;
	va.bufs[0] = kvb_buf_alloc_host(c, va.lens[0], &kvbuf);
	va.bufs[1] = kvb_buf_alloc_host(c, va.lens[1], &ixbuf);
	CHECK(va.bufs[0] && va.bufs[1]);
	for (uint32_t p = 0; p < NPARTS; p++) {
		int kv = p < KV_LAYERS;

		va.parts[p].buf = kv ? kvbuf : ixbuf;
		va.parts[p].stride = kv ? KV_STRIDE : IX_STRIDE;
		va.parts[p].base = kv ? 128 + (uint64_t)layer_of[p] * NSLOTS * KV_STRIDE
				      : (uint64_t)layer_of[p] * NSLOTS * IX_STRIDE;
		va.map[p] = kv ? va.bufs[0] : va.bufs[1];
	}
	CHECK_OK(kvb_view_create(c, ns, va.parts, NPARTS, &va.id));
}

static void make_view_b(kvb_client *c)
{
	uint32_t buf;
	uint64_t off = 0;

	vb.lens[0] = (size_t)NSLOTS * REC;
	vb.bufs[0] = kvb_buf_alloc_host(c, vb.lens[0], &buf);
	CHECK(vb.bufs[0] != NULL);
	for (uint32_t p = 0; p < NPARTS; p++) {
		vb.parts[p].buf = buf;
		vb.parts[p].stride = REC;
		vb.parts[p].base = off;
		vb.map[p] = vb.bufs[0];
		off += bpt[p];
	}
	CHECK_LE(off, REC);
	CHECK_OK(kvb_view_create(c, ns, vb.parts, NPARTS, &vb.id));
}

static void clear_view(struct view *v)
{
	for (int i = 0; i < 2; i++)
		if (v->bufs[i])
			memset(v->bufs[i], SENTINEL, v->lens[i]);
}

/* Writes the (key, seed) page into slots [slot, slot + TPP) of a view, as an engine would. */
static void write_slots(struct view *v, const kvb_key *k, uint64_t seed, uint64_t slot)
{
	uint8_t *page = malloc(pb);

	CHECK(page != NULL);
	harness_fill(page, pb, k, seed);
	for (uint32_t p = 0; p < NPARTS; p++)
		for (uint32_t t = 0; t < TPP; t++)
			memcpy(slot_addr(v, p, slot + t), page + part_off[p] + t * bpt[p], bpt[p]);
	free(page);
}

/*
 * Checks a whole view against: the (key, seed) page in slots [slot, slot + TPP) for the parts
 * whose layer is in [lfirst, lfirst + lcount) (lcount 0: all), and SENTINEL everywhere else.
 */
static void check_view(const struct view *v, const kvb_key *k, uint64_t seed, uint64_t slot,
		       uint32_t lfirst, uint32_t lcount, const char *what)
{
	uint8_t *want[2];
	uint8_t *page = malloc(pb);

	CHECK(page != NULL);
	harness_fill(page, pb, k, seed);
	for (int i = 0; i < 2; i++) {
		want[i] = v->bufs[i] ? malloc(v->lens[i]) : NULL;
		if (want[i])
			memset(want[i], SENTINEL, v->lens[i]);
	}
	for (uint32_t p = 0; p < NPARTS; p++) {
		int b = v->map[p] == v->bufs[0] ? 0 : 1;

		if (lcount && (layer_of[p] < lfirst || layer_of[p] >= lfirst + lcount))
			continue;
		for (uint32_t t = 0; t < TPP; t++)
			memcpy(want[b] + (slot_addr(v, p, slot + t) - v->bufs[b]),
			       page + part_off[p] + t * bpt[p], bpt[p]);
	}
	for (int i = 0; i < 2; i++) {
		if (!v->bufs[i])
			continue;
		for (size_t off = 0; off < v->lens[i]; off++) {
			if (v->bufs[i][off] == want[i][off])
				continue;
			harness_fail(__FILE__, __LINE__,
				     "%s: buffer %d offset %zu (slot %zu): got 0x%02x want 0x%02x",
				     what, i, off, off / (v == &vb ? REC : 1), v->bufs[i][off],
				     want[i][off]);
		}
		free(want[i]);
	}
	free(page);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_view_part bad[NPARTS];
	kvb_client *c;
	kvb_key k1 = harness_key(SEED, 1), k2 = harness_key(SEED, 2), k3 = harness_key(SEED, 3);
	uint8_t *page;
	uint32_t v;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "t_views", 0);
	harness_layout(&l, "test/views", KVB_LAYOUT_MLA, TPP, 1, 0, KV_LAYERS, KV_BPT);
	harness_layout_add(&l, "idx", IX_LAYERS, IX_BPT);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, TPP * (KV_LAYERS * KV_BPT + IX_LAYERS * IX_BPT));
	page_geometry();
	page = malloc(pb);
	CHECK(page != NULL);
	make_view_a(c);
	make_view_b(c);

	/* View PUT gathers exactly the canonical page. */
	clear_view(&va);
	write_slots(&va, &k1, SEED, 37);
	CHECK_RC(kvb_view_put(c, va.id, k1, 37), 0);
	CHECK_RC(kvb_view_put(c, va.id, k1, 37), 1);
	CHECK_RC(kvb_get(c, ns, k1, page, pb), (long long)pb);
	CHECK(harness_verify(page, pb, &k1, SEED, "page gathered from view A") == 0);

	/* View GET scatters it into another layout, touching nothing else. */
	clear_view(&vb);
	CHECK_RC(kvb_view_get(c, vb.id, k1, 100, 0, 0), (long long)pb);
	check_view(&vb, &k1, SEED, 100, 0, 0, "view B after a full GET");

	/* And back: view B to view A at another slot. */
	write_slots(&vb, &k2, SEED, 3);
	CHECK_RC(kvb_view_put(c, vb.id, k2, 3), 0);
	clear_view(&va);
	CHECK_RC(kvb_view_get(c, va.id, k2, NSLOTS - TPP, 0, 0), (long long)pb);
	check_view(&va, &k2, SEED, NSLOTS - TPP, 0, 0, "view A, last slots, from a B put");

	/* Layer ranges: [0, 2) then [2, 6); idx has only 3 layers, so it splits 2 + 1. */
	clear_view(&vb);
	CHECK_RC(kvb_view_get(c, vb.id, k2, 64, 0, 2), (long long)pb);
	check_view(&vb, &k2, SEED, 64, 0, 2, "view B, layers [0,2)");
	CHECK_RC(kvb_view_get(c, vb.id, k2, 64, 2, KV_LAYERS - 2), (long long)pb);
	check_view(&vb, &k2, SEED, 64, 0, 0, "view B, layers [0,2) + [2,6)");
	clear_view(&va);
	CHECK_RC(kvb_view_get(c, va.id, k2, 0, 5, 1), (long long)pb);
	check_view(&va, &k2, SEED, 0, 5, 1, "view A, layer 5 only (kv only)");

	/* A plain PUT read through a view, and a view PUT read through a lease. */
	harness_fill(page, pb, &k3, SEED);
	CHECK_RC(kvb_put(c, ns, k3, page, pb), 0);
	clear_view(&va);
	CHECK_RC(kvb_view_get(c, va.id, k3, 17, 0, 0), (long long)pb);
	check_view(&va, &k3, SEED, 17, 0, 0, "view A from a plain put");
	{
		struct kvb_lease lease;

		CHECK_OK(kvb_acquire(c, ns, k2, &lease));
		CHECK(harness_verify(lease.data, pb, &k2, SEED, "lease of a view put") == 0);
		CHECK_OK(kvb_release(c, &lease));
	}

	/* Errors, each leaving the view untouched. */
	clear_view(&vb);
	CHECK_RC(kvb_view_get(c, vb.id, harness_key(SEED, 99), 0, 0, 0), -ENOENT);
	CHECK_RC(kvb_view_get(c, vb.id, k1, NSLOTS - TPP + 1, 0, 0), -EFAULT);
	CHECK_RC(kvb_view_get(c, vb.id, k1, UINT64_MAX / REC, 0, 0), -EFAULT);
	CHECK_RC(kvb_view_put(c, vb.id, harness_key(SEED, 98), NSLOTS), -EFAULT);
	CHECK_RC(kvb_view_get(c, vb.id, k1, 0, KV_LAYERS, 1), -EINVAL);
	CHECK_RC(kvb_view_get(c, 12345, k1, 0, 0, 0), -EBADF);
	CHECK_RC(kvb_view_put(c, 12345, k1, 0), -EBADF);
	check_view(&vb, &k1, SEED, 0, 7, 1, "view B after failed ops (all sentinel)");

	/* Malformed views. */
	memcpy(bad, va.parts, sizeof(bad));
	CHECK_RC(kvb_view_create(c, ns, bad, NPARTS - 1, &v), -EINVAL);
	bad[2].stride = KV_BPT - 1;
	CHECK_RC(kvb_view_create(c, ns, bad, NPARTS, &v), -EINVAL);
	memcpy(bad, va.parts, sizeof(bad));
	bad[NPARTS - 1].buf = 4242;
	CHECK_RC(kvb_view_create(c, ns, bad, NPARTS, &v), -EBADF);
	CHECK_RC(kvb_view_create(c, ns + 1000, va.parts, NPARTS, &v), -EBADF);

	/* Destroyed views are gone; the pages they stored are not. */
	CHECK_OK(kvb_view_destroy(c, va.id));
	CHECK_RC(kvb_view_put(c, va.id, harness_key(SEED, 97), 0), -EBADF);
	CHECK_RC(kvb_view_get(c, va.id, k1, 0, 0, 0), -EBADF);
	CHECK_RC(kvb_view_destroy(c, va.id), -EBADF);
	CHECK_OK(kvb_view_destroy(c, vb.id));
	CHECK_RC(kvb_get(c, ns, k1, page, pb), (long long)pb);
	CHECK(harness_verify(page, pb, &k1, SEED, "page after its view was destroyed") == 0);
	CHECK_EQ(harness_stat(c, "pool.pages"), 3);

	free(page);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
