// SPDX-License-Identifier: MIT
/*
 * t_paged_views.c - pages made of several ranges, moved by one op: views with page strides
 * (kvb_view_create2). An MHA namespace (components k and v, LAYERS layers each) is viewed in
 * the engines' real host layouts, each addressed here from its own tensor shape (not from the
 * broker's formula):
 *   A. SGLang page_first_direct, one buffer [2][page][layer][ps][head*dim]: a page is 2 x LAYERS
 *      separate ranges;
 *   B. vLLM, one buffer per layer [block][2][block_size][head*dim]: K and V of a block
 *      interleave, blocks are 2 x block_size tokens apart;
 *   C. SGLang layer_first [2][layer][slot][head*dim] with page_stride 0 (what a plain view is).
 * One PUT from A stores the canonical page ([component][layer][token][bytes], checked with a
 * plain GET); GETs scatter it byte-exact into B and C, touching nothing else; a slot that is not
 * page-aligned straddles two blocks exactly as the formula says; layer-range GETs; the same
 * through kvb_submit() with every copy on the copy engine (--copy-inline 0); and malformed
 * views (overlapping pages, flags, reserved words) are refused.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define PS 16 /* tokens per page = SGLang page_size = vLLM block_size */
#define LAYERS 4
#define T 128	 /* head_num * head_dim * dtype size: bytes per token per layer */
#define NPAGES 8 /* pages (blocks) each host buffer holds */
#define NPARTS (2 * LAYERS)
#define PB (2 * LAYERS * PS * T) /* 16 KiB */
#define SENTINEL 0xee
#define SEED 717

static uint32_t ns;

/* Canonical offset of (component c, layer l, token t) inside a page. */
static size_t canon(uint32_t c, uint32_t l, uint32_t t)
{
	return (((size_t)c * LAYERS + l) * PS + t) * T;
}

enum lay { SGL_PFD, VLLM, SGL_LF };

struct host {
	enum lay lay;
	uint8_t *buf[LAYERS]; /* VLLM: one per layer; others: buf[0] */
	uint32_t id[LAYERS];
	size_t len;
	int nbufs;
	uint32_t view;
};

/* Where token slot s of (c, l) lives, from the tensor's shape. */
static uint8_t *at(const struct host *h, uint32_t c, uint32_t l, uint64_t s)
{
	uint64_t p = s / PS, i = s % PS;

	switch (h->lay) {
	case SGL_PFD: /* [2][NPAGES][LAYERS][PS][T] */
		return h->buf[0] + ((((c * NPAGES + p) * LAYERS + l) * PS + i) * T);
	case VLLM: /* per layer [NPAGES][2][PS][T] */
		return h->buf[l] + (((p * 2 + c) * PS + i) * T);
	default: /* SGL_LF: [2][LAYERS][NPAGES * PS][T] */
		return h->buf[0] + (((uint64_t)c * LAYERS + l) * NPAGES * PS + s) * T;
	}
}

static void make_host(kvb_client *c, struct host *h, enum lay lay)
{
	struct kvb_view_part2 parts[NPARTS];

	memset(h, 0, sizeof(*h));
	h->lay = lay;
	h->nbufs = lay == VLLM ? LAYERS : 1;
	h->len = lay == VLLM ? (size_t)NPAGES * 2 * PS * T : (size_t)NPAGES * PB;
	for (int b = 0; b < h->nbufs; b++) {
		h->buf[b] = kvb_buf_alloc_host(c, h->len, &h->id[b]);
		CHECK(h->buf[b] != NULL);
	}
	memset(parts, 0, sizeof(parts));
	for (uint32_t cc = 0; cc < 2; cc++) {
		for (uint32_t l = 0; l < LAYERS; l++) {
			struct kvb_view_part2 *p = &parts[cc * LAYERS + l];

			p->stride = T;
			switch (lay) {
			case SGL_PFD:
				p->buf = h->id[0];
				p->base = ((uint64_t)cc * NPAGES * LAYERS + l) * PS * T;
				p->page_stride = (uint64_t)LAYERS * PS * T;
				break;
			case VLLM:
				p->buf = h->id[l];
				p->base = (uint64_t)cc * PS * T;
				p->page_stride = 2ull * PS * T;
				break;
			case SGL_LF:
				p->buf = h->id[0];
				p->base = ((uint64_t)cc * LAYERS + l) * NPAGES * PS * T;
				p->page_stride = 0; /* tokens_per_page * stride */
				break;
			}
			/* The shape-derived address agrees with the view at slot 0. */
			CHECK(at(h, cc, l, 0) == h->buf[h->nbufs > 1 ? l : 0] + p->base);
		}
	}
	CHECK_OK(kvb_view_create2(c, ns, parts, NPARTS, 0, &h->view));
}

static void clear(struct host *h)
{
	for (int b = 0; b < h->nbufs; b++)
		memset(h->buf[b], SENTINEL, h->len);
}

/* Writes page content (key, SEED) into slots [s, s + PS), as the engine's kernels would. */
static void write_page(struct host *h, const kvb_key *k, uint64_t s)
{
	uint8_t page[PB];

	harness_fill(page, PB, k, SEED);
	for (uint32_t c = 0; c < 2; c++)
		for (uint32_t l = 0; l < LAYERS; l++)
			for (uint32_t t = 0; t < PS; t++)
				memcpy(at(h, c, l, s + t), page + canon(c, l, t), T);
}

/*
 * Checks that slots [s, s + PS) of layers [lf, lf + lc) (lc 0: all) hold the page and that every
 * other byte of the buffers is still SENTINEL.
 */
static void check_host(const struct host *h, const kvb_key *k, uint64_t s, uint32_t lf, uint32_t lc,
		       const char *what)
{
	uint8_t page[PB];
	uint64_t want = 0, seen = 0;

	harness_fill(page, PB, k, SEED);
	for (uint32_t c = 0; c < 2; c++) {
		for (uint32_t l = 0; l < LAYERS; l++) {
			if (lc && (l < lf || l >= lf + lc))
				continue;
			for (uint32_t t = 0; t < PS; t++) {
				CHECKF(!memcmp(at(h, c, l, s + t), page + canon(c, l, t), T),
				       "%s: component %u layer %u token %u differs", what, c, l, t);
				want += T;
			}
		}
	}
	for (int b = 0; b < h->nbufs; b++)
		for (size_t i = 0; i < h->len; i++)
			seen += h->buf[b][i] != SENTINEL;
	/* A page byte may equal SENTINEL by chance: the count of non-sentinel bytes is <= want. */
	CHECKF(seen <= want && seen + want / 64 >= want, "%s: %llu bytes changed, %llu written",
	       what, (unsigned long long)seen, (unsigned long long)want);
}

static void async_ops(kvb_client *c, struct host *src, struct host *dst, const kvb_key *keys)
{
	struct kvb_op ops[NPAGES];
	struct kvb_completion out[NPAGES];
	int got = 0;

	for (uint32_t p = 0; p < NPAGES; p++) {
		write_page(src, &keys[p], (uint64_t)p * PS);
		ops[p] = (struct kvb_op){.opcode = KVB_OP_PUT,
					 .flags = KVB_OPF_VIEW,
					 .buf = src->view,
					 .key = keys[p],
					 .off = (uint64_t)p * PS,
					 .user_data = p};
	}
	CHECK_RC(kvb_submit(c, ops, NPAGES), NPAGES);
	while (got < NPAGES) {
		int n = kvb_reap(c, out, NPAGES, 1, 10000);

		CHECK(n > 0);
		for (int i = 0; i < n; i++)
			CHECK_EQ(out[i].res, 0);
		got += n;
	}
	clear(dst);
	/* Pages land reversed: page p into slot (NPAGES - 1 - p) * PS. */
	for (uint32_t p = 0; p < NPAGES; p++)
		ops[p] = (struct kvb_op){.opcode = KVB_OP_GET,
					 .flags = KVB_OPF_VIEW,
					 .buf = dst->view,
					 .key = keys[p],
					 .off = (uint64_t)(NPAGES - 1 - p) * PS,
					 .user_data = p};
	CHECK_RC(kvb_submit(c, ops, NPAGES), NPAGES);
	for (got = 0; got < NPAGES;) {
		int n = kvb_reap(c, out, NPAGES, 1, 10000);

		CHECK(n > 0);
		for (int i = 0; i < n; i++)
			CHECK_EQ(out[i].res, PB);
		got += n;
	}
	for (uint32_t p = 0; p < NPAGES; p++) {
		uint8_t page[PB], want[PB];

		/* Gather slot by slot from the shape, compare with the canonical page. */
		for (uint32_t cc = 0; cc < 2; cc++)
			for (uint32_t l = 0; l < LAYERS; l++)
				for (uint32_t t = 0; t < PS; t++)
					memcpy(page + canon(cc, l, t),
					       at(dst, cc, l, (uint64_t)(NPAGES - 1 - p) * PS + t),
					       T);
		harness_fill(want, PB, &keys[p], SEED);
		CHECK(!memcmp(page, want, PB));
	}
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct host a, v, lf;
	kvb_key k1 = harness_key(SEED, 1), k2 = harness_key(SEED, 2), keys[NPAGES];
	uint8_t page[PB];
	kvb_client *c;
	size_t pb;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M", "--copy-inline", "0", "--copy-threads", "2");
	c = harness_connect(b, "t_paged_views", 0);
	harness_layout(&l, "test/paged-views", KVB_LAYOUT_MHA, PS, 2, 1, LAYERS, T);
	strcpy(l.comp[0].name, "k");
	harness_layout_add(&l, "v", LAYERS, T);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PB);
	make_host(c, &a, SGL_PFD);
	make_host(c, &v, VLLM);
	make_host(c, &lf, SGL_LF);

	/* One PUT of 2 x LAYERS ranges from SGLang's page_first_direct: the canonical page. */
	clear(&a);
	write_page(&a, &k1, 3 * PS);
	CHECK_RC(kvb_view_put(c, a.view, k1, 3 * PS), 0);
	CHECK_RC(kvb_get(c, ns, k1, page, PB), PB);
	CHECK(harness_verify(page, PB, &k1, SEED, "canonical page of a page_first_direct PUT") ==
	      0);

	/* GETs scatter it into the other layouts, and back into page_first_direct elsewhere. */
	clear(&v);
	CHECK_RC(kvb_view_get(c, v.view, k1, 5 * PS, 0, 0), PB);
	check_host(&v, &k1, 5 * PS, 0, 0, "vLLM block 5");
	clear(&lf);
	CHECK_RC(kvb_view_get(c, lf.view, k1, 2 * PS, 0, 0), PB);
	check_host(&lf, &k1, 2 * PS, 0, 0, "layer_first page 2");
	clear(&a);
	CHECK_RC(kvb_view_get(c, a.view, k1, 7 * PS, 0, 0), PB);
	check_host(&a, &k1, 7 * PS, 0, 0, "page_first_direct page 7");

	/* A slot that is not page-aligned: tokens 0..10 in block 1 from 5, 11..15 in block 2. */
	clear(&v);
	CHECK_RC(kvb_view_get(c, v.view, k1, PS + 5, 0, 0), PB);
	check_host(&v, &k1, PS + 5, 0, 0, "vLLM slot 21 (straddles blocks 1 and 2)");
	CHECK_EQ(*at(&v, 0, 0, PS + 4), SENTINEL);
	CHECK_EQ(*at(&v, 1, LAYERS - 1, 2 * PS + 5), SENTINEL);

	/* And a vLLM PUT reads back through page_first_direct. */
	clear(&v);
	write_page(&v, &k2, 6 * PS);
	CHECK_RC(kvb_view_put(c, v.view, k2, 6 * PS), 0);
	CHECK_RC(kvb_view_put(c, v.view, k2, 6 * PS), 1); /* stored: nothing copied */
	clear(&a);
	CHECK_RC(kvb_view_get(c, a.view, k2, 0, 0, 0), PB);
	check_host(&a, &k2, 0, 0, 0, "page_first_direct page 0 from a vLLM PUT");

	/* Layer ranges: [0, 1) then [1, LAYERS). */
	clear(&a);
	CHECK_RC(kvb_view_get(c, a.view, k2, 4 * PS, 0, 1), PB);
	check_host(&a, &k2, 4 * PS, 0, 1, "page_first_direct, layer 0");
	CHECK_RC(kvb_view_get(c, a.view, k2, 4 * PS, 1, LAYERS - 1), PB);
	check_host(&a, &k2, 4 * PS, 0, 0, "page_first_direct, layers 0 + [1, 4)");

	/* Out of the buffer: the last page of A, one slot on, is past the end of its V range. */
	CHECK_RC(kvb_view_get(c, a.view, k2, (NPAGES - 1) * PS + 1, 0, 0), -EFAULT);
	CHECK_RC(kvb_view_get(c, a.view, k2, NPAGES * PS, 0, 0), -EFAULT);
	CHECK_RC(kvb_view_get(c, a.view, k2, UINT64_MAX - 3, 0, 0), -EFAULT);

	/* Many pages through kvb_submit(), every copy on the copy engine's threads. */
	harness_key_chain(keys, NPAGES, PS, SEED);
	async_ops(c, &a, &v, keys);
	harness_log("async view PUT (page_first_direct) / GET (vLLM) of %d pages ok", NPAGES);
	CHECK_EQ(harness_stat(c, "copy.inline_jobs"), 0);

	/* Malformed views. */
	{
		struct kvb_view_part2 bad[NPARTS];
		uint32_t id;

		memset(bad, 0, sizeof(bad));
		for (int p = 0; p < NPARTS; p++)
			bad[p] = (struct kvb_view_part2){.buf = a.id[0],
							 .stride = T,
							 .base = (uint64_t)p * PB,
							 .page_stride = (PS - 1) * T + T};
		CHECK_OK(kvb_view_create2(c, ns, bad, NPARTS, 0, &id)); /* pages just touch */
		CHECK_OK(kvb_view_destroy(c, id));
		bad[3].page_stride = (PS - 1) * T + T - 1; /* overlap by one byte */
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS, 0, &id), -EINVAL);
		bad[3].page_stride = 0;
		bad[3].flags = 1;
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS, 0, &id), -EINVAL);
		bad[3].flags = 0;
		bad[3].resv = 1;
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS, 0, &id), -EINVAL);
		bad[3].resv = 0;
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS, 1, &id), -EINVAL);
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS - 1, 0, &id), -EINVAL);
		bad[3].stride = T - 1;
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS, 0, &id), -EINVAL);
		bad[3].stride = T;
		bad[3].buf = 4242;
		CHECK_RC(kvb_view_create2(c, ns, bad, NPARTS, 0, &id), -EBADF);
		CHECK_RC(kvb_view_create2(c, ns + 99, bad, NPARTS, 0, &id), -EBADF);
	}
	CHECK_OK(kvb_view_destroy(c, a.view));
	CHECK_OK(kvb_view_destroy(c, v.view));
	CHECK_OK(kvb_view_destroy(c, lf.view));
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
