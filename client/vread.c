// SPDX-License-Identifier: MIT
/*
 * vread.c - [vdir] view GETs through the pool directory: a page the directory lists is copied
 * by the library itself, from its read-only pool map into the view's host buffers, with no
 * round trip and no broker copy, as kvb_get() does for a page into plain memory (ops.c
 * dir_get). An engine that loads a request layer group by layer group sends one view GET per
 * page and group (a Kimi-K2.5 request in 61 groups: 7,320 of 72 KiB per rank), which the broker
 * copied on its loop thread, one after another for every rank (kvbbench engine --layers 61:
 * 2.5x the memcpy time of the bytes); each rank now copies its own, side by side.
 *
 * The copy plan of a view (where each (component, layer) part of a page lies in the page and in
 * the caller's buffers) is built from the namespace's layout and the view's parts, once, and
 * kept with the view until a buffer is unregistered (buf_gen). A view over any buffer the
 * library may not write as the broker would (kvbc_buf_direct: a GPU buffer, a caller's file
 * that may shrink under us or whose mapping buf.c could not check) has no plan: its ops go to
 * the broker, as do ops whose slot or layer range the broker would refuse (it gives the
 * error), pages the directory does not list, ops behind an async DELETE or PUT of ours that
 * the broker runs first (ring.c submit_local), and reads whose entry changed while we copied
 * (the destination may then hold anything; the broker's GET writes it again). The broker hears
 * of each read afterwards, in the note ring, as a directory read of the page, to count it and
 * keep the page warm.
 */
#include <stdlib.h>
#include <string.h>

#include "fastcopy.h"
#include "internal.h"

/* One (component, layer) of the page: its bytes in the page and its slots in the buffer. */
struct vpart {
	uint8_t *base;	      /* the buffer's address + the part's base */
	uint64_t lim;	      /* bytes of the buffer from base on */
	uint64_t page_stride; /* bytes between pages of slots */
	uint64_t src;	      /* offset of the part in the page */
	uint32_t stride;      /* bytes between slots within a page */
	uint32_t bpt;	      /* bytes per token of the part */
	uint32_t layer;
};

#define VREAD_MAX_SEGS (1u << 20) /* broker/ops.c OPS_MAX_SEGS */

struct kvbc_vplan {
	uint64_t gen;  /* c->buf_gen it was built at */
	int ok;	       /* 0: no plan, the broker serves this view */
	uint32_t ns;   /* the caller's namespace id */
	uint32_t tpp;  /* tokens per page */
	uint32_t maxl; /* layers of the deepest component */
	uint32_t nparts;
	struct vpart part[];
};

static const struct kvbc_buf *host_buf(const struct kvb_client *c, uint32_t id)
{
	for (const struct kvbc_buf *b = c->bufs; b; b = b->next)
		if (b->id == id)
			return kvbc_buf_direct(b) ? b : NULL;
	return NULL;
}

/* A plan from the view's creation message, or one with ok 0 where the broker must serve it. */
static struct kvbc_vplan *plan_build(struct kvb_client *c, const struct kvbc_view *v)
{
	const struct kvb_msg_view_create *h1 = v->msg;
	const struct kvb_msg_view_create2 *h2 = v->msg;
	uint32_t nsid = v->type == KVB_MSG_VIEW_CREATE ? h1->ns : h2->ns;
	uint32_t np = v->type == KVB_MSG_VIEW_CREATE ? h1->nparts : h2->nparts;
	const struct kvbc_ns *n = kvbc_ns_find(c, nsid);
	const struct kvb_layout *l = n ? (const void *)n->msg : NULL;
	struct kvbc_vplan *p = calloc(1, sizeof(*p) + (size_t)np * sizeof(p->part[0]));
	uint64_t src = 0;
	uint32_t i = 0;

	if (!p)
		return NULL;
	p->gen = c->buf_gen;
	/* The broker refuses views of more (part, token) segments than OPS_MAX_SEGS: -E2BIG. */
	if (!n || np != n->nparts || (uint64_t)np * n->tpp > VREAD_MAX_SEGS)
		return p;
	p->ns = nsid;
	p->tpp = l->tokens_per_page;
	p->nparts = np;
	for (uint32_t ci = 0; ci < l->ncomponents; ci++) {
		const struct kvb_component *cp = &l->comp[ci];

		if (cp->num_layers > p->maxl)
			p->maxl = cp->num_layers;
		for (uint32_t li = 0; li < cp->num_layers; li++, i++) {
			struct vpart *q = &p->part[i];
			const struct kvbc_buf *b;
			uint64_t base;
			uint32_t buf;

			if (v->type == KVB_MSG_VIEW_CREATE) {
				const struct kvb_view_part *vp = (const void *)(h1 + 1);

				buf = vp[i].buf;
				q->stride = vp[i].stride;
				base = vp[i].base;
				q->page_stride = (uint64_t)p->tpp * vp[i].stride;
			} else {
				const struct kvb_view_part2 *vp = (const void *)(h2 + 1);

				buf = vp[i].buf;
				q->stride = vp[i].stride;
				base = vp[i].base;
				q->page_stride = vp[i].page_stride
							 ? vp[i].page_stride
							 : (uint64_t)p->tpp * vp[i].stride;
			}
			b = host_buf(c, buf);
			if (!b || base > b->len)
				return p;
			q->base = (uint8_t *)b->addr + base;
			q->lim = b->len - base;
			q->src = src;
			q->bpt = cp->bytes_per_token_layer;
			q->layer = li;
			src += (uint64_t)p->tpp * q->bpt;
		}
	}
	p->ok = i == np;
	return p;
}

void kvbc_vplan_free(struct kvbc_view *v)
{
	free(v->plan);
	v->plan = NULL;
}

/* The offset of token slot t in part q, as the broker computes it (ops.c view_off): 0 overflow. */
static int slot_off(const struct vpart *q, uint64_t t, uint32_t tpp, uint64_t *off)
{
	uint64_t a, b;

	return !__builtin_mul_overflow(t / tpp, q->page_stride, &a) &&
	       !__builtin_mul_overflow(t % tpp, (uint64_t)q->stride, &b) &&
	       !__builtin_add_overflow(a, b, off);
}

/*
 * Whether every part's slots [slot, slot + tpp) lie in its buffer, as the broker checks every
 * part whatever the layer range (ops.c view_check): the same ops fail the same way.
 */
static int slots_ok(const struct kvbc_vplan *p, uint64_t slot)
{
	for (uint32_t i = 0; i < p->nparts; i++) {
		const struct vpart *q = &p->part[i];
		uint64_t first, last, end;

		if (__builtin_add_overflow(slot, (uint64_t)(p->tpp - 1), &last) ||
		    !slot_off(q, slot, p->tpp, &first) || !slot_off(q, last, p->tpp, &last) ||
		    __builtin_add_overflow(last, (uint64_t)q->bpt, &end) || end > q->lim)
			return 0;
	}
	return 1;
}

/* Copies part q of the page at page into slots [slot, slot + tpp); total: the op's bytes. */
static void copy_part(const struct vpart *q, const uint8_t *page, uint64_t slot, uint32_t tpp,
		      uint64_t total)
{
	const uint8_t *src = page + q->src;
	uint64_t off = 0;

	if (q->stride == q->bpt && slot % tpp == 0) {
		/* The page's tokens are one run in the buffer: one copy. */
		(void)slot_off(q, slot, tpp, &off);
		kvb_copy_part(q->base + off, src, (size_t)tpp * q->bpt, total);
		return;
	}
	for (uint32_t t = 0; t < tpp; t++) {
		(void)slot_off(q, slot + t, tpp, &off);
		memcpy(q->base + off, src + (uint64_t)t * q->bpt, q->bpt);
	}
}

int kvbc_view_dir_find(struct kvb_client *c, uint32_t view, const kvb_key *key, uint64_t slot,
		       uint32_t lfirst, uint32_t lcount, struct kvbc_vread *r)
{
	const struct kvbc_ns *n;
	struct kvbc_view *v = NULL;
	struct kvbc_vplan *p;
	const void *page;
	uint64_t loc;
	uint32_t len;

	if (!kvbc_dir_readable(c))
		return 0;
	for (uint32_t i = 0; i < c->nviews && !v; i++)
		if (c->views[i].id == view)
			v = &c->views[i];
	if (!v || v->bid == UINT32_MAX) /* lost in a reconnect: its ops fail -EBADF (conn.c) */
		return 0;
	if (v->plan && v->plan->gen != c->buf_gen)
		kvbc_vplan_free(v);
	if (!v->plan)
		v->plan = plan_build(c, v);
	p = v->plan;
	if (!p || !p->ok || !slots_ok(p, slot))
		return 0;
	/* The broker's layer range rule (ops.c layers_ok); one that selects nothing is its error. */
	if (lcount && (uint64_t)lfirst + lcount > p->maxl)
		return 0;
	*r = (struct kvbc_vread){.p = p,
				 .slot = slot,
				 .lfirst = lcount ? lfirst : 0,
				 .lend = lcount ? lfirst + lcount : p->maxl};
	n = kvbc_ns_find(c, p->ns);
	if (!n)
		return 0;
	for (uint32_t i = 0; i < p->nparts; i++)
		if (p->part[i].layer >= r->lfirst && p->part[i].layer < r->lend)
			r->total += (uint64_t)p->tpp * p->part[i].bpt;
	/*
	 * As kvb_get() into a buffer of ours (ops.c): from 1 MiB the broker's copy threads,
	 * which split the copy, unless our own copy is the rule for these pages (self_get).
	 */
	if (!r->total || (r->total >= KVBC_DIR_GET_BUF_MAX && !n->self_get))
		return 0;
	r->e = kvb_dir_find(c->dir, c->dir_nbuckets, c->dir_epoch, n->bid, key, &r->seq, &loc,
			    &len);
	if (!r->e || len < n->page_bytes || kvbc_lease_map(c, loc, n->page_bytes, &page))
		return 0;
	r->page = page;
	r->page_bytes = (uint32_t)n->page_bytes;
	return 1;
}

int kvbc_view_dir_copy(struct kvb_client *c, const kvb_key *key, const struct kvbc_vread *r)
{
	const struct kvbc_vplan *p = r->p;

	for (uint32_t i = 0; i < p->nparts; i++)
		if (p->part[i].layer >= r->lfirst && p->part[i].layer < r->lend)
			copy_part(&p->part[i], r->page, r->slot, p->tpp, r->total);
	if (!kvb_dir_still(c->dir, r->e, r->seq, c->dir_epoch))
		return 0;
	kvbc_dir_read_note(c, p->ns, key);
	return (int)r->page_bytes;
}
