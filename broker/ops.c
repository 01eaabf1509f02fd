// SPDX-License-Identifier: MIT
/*
 * ops.c - executes page operations for a session: one SQE in, one CQE out.
 *
 * The SQE was copied out of shared memory and its static shape checked (kvb_sqe_check) by the
 * caller; here every reference into broker state is checked against this session's own
 * bookkeeping: the namespace must be one it opened, the buffer or view one it registered, and
 * every byte range must lie inside the registered length, computed without overflow. A lease id
 * is only honoured when this session holds it and the slot's generation still matches.
 *
 * Copies go through the copy engine as jobs (xfer.c) with the page pinned, so neither eviction
 * nor a DELETE can free the slot underneath a copy; PUT and GET may complete later
 * (OPS_DEFERRED) when the engine queued the copy. Loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "proto.h"
#include "tier.h"

/* cqe->res of an op the disk tier parked: ops_exec returns OPS_DEFERRED (never posted). */
#define OPS_PARKED INT32_MIN

/* Scratch segment list, reused across ops (loop thread only). */
static struct copy_seg *segs;
static uint32_t segs_cap;

static int segs_reserve(uint64_t n)
{
	struct copy_seg *ns;

	if (n <= segs_cap)
		return 0;
	/* 1M segments (24 MiB) covers 1,024 layers x 1,024 strided tokens. */
	if (n > (1u << 20))
		return -E2BIG;
	ns = realloc(segs, n * sizeof(*segs));
	if (!ns)
		return -ENOMEM;
	segs = ns;
	segs_cap = (uint32_t)n;
	return 0;
}

static struct ns *session_ns(struct broker *b, struct session *s, uint32_t id)
{
	if (id >= STORE_MAX_NS || !(s->ns_opened[id / 8] & (1u << (id % 8))))
		return NULL;
	return ns_get(&b->nst, id);
}

/*
 * [off, off + len) inside buffer id of this session? Returns its base or NULL (err set), and
 * the buffer's device into *dev (COPY_HOST, or the CUDA device of a GPU buffer).
 */
static uint8_t *buf_range(struct session *s, uint32_t id, uint64_t off, uint64_t len, int32_t *dev,
			  int *err)
{
	struct sbuf *sb;

	if (id >= SESSION_MAX_BUFS || !s->bufs[id].base || s->bufs[id].closing) {
		*err = -EBADF;
		return NULL;
	}
	sb = &s->bufs[id];
	if (off > sb->len || len > sb->len - off) {
		*err = -EFAULT;
		return NULL;
	}
	*dev = sb->dev;
	return (uint8_t *)sb->base + off;
}

/*
 * Offset of token slot t of view part vp from its buffer's start: base + (t / tpp) * page_stride
 * + (t % tpp) * stride (page_stride was normalised at view creation: never 0). 0 on overflow.
 */
static int view_off(const struct kvb_view_part2 *vp, uint64_t t, uint32_t tpp, uint64_t *off)
{
	uint64_t a, b;

	return !__builtin_mul_overflow(t / tpp, vp->page_stride, &a) &&
	       !__builtin_mul_overflow(t % tpp, (uint64_t)vp->stride, &b) &&
	       !__builtin_add_overflow(a, b, &a) && !__builtin_add_overflow(a, vp->base, off);
}

/*
 * The client address of token slot `slot` of view part vp, after checking that the page's
 * tokens_per_page slots lie inside the part's buffer. NULL with *err set otherwise. Slot
 * addresses grow with the slot (view creation made page_stride >= (tpp - 1) * stride + bpt),
 * so the first and the last token bound the range.
 */
static uint8_t *view_part(struct session *s, const struct kvb_view_part2 *vp, uint64_t slot,
			  uint32_t tpp, uint32_t bpt, int32_t *dev, int *err)
{
	uint64_t first, last, span;

	if (__builtin_add_overflow(slot, (uint64_t)(tpp - 1), &last) ||
	    !view_off(vp, slot, tpp, &first) || !view_off(vp, last, tpp, &last) ||
	    __builtin_add_overflow(last - first, (uint64_t)bpt, &span)) {
		*err = -EFAULT;
		return NULL;
	}
	return buf_range(s, vp->buf, first, span, dev, err);
}

/*
 * Checks every part of a view slot without copying anything. All parts of one op must live on
 * one device (or all in host memory): a job goes to one copy engine. *dev receives it.
 */
static int view_check(struct session *s, const struct sview *v, uint64_t slot, int32_t *dev)
{
	int err = 0;

	for (uint32_t p = 0; p < v->nparts; p++) {
		int32_t d;

		if (!view_part(s, &v->parts[p], slot, v->ns->layout.tokens_per_page,
			       v->ns->part_bpt[p], &d, &err))
			return err;
		if (p && d != *dev)
			return -EINVAL;
		*dev = d;
	}
	return 0;
}

/* A GET's layer range [lfirst, lfirst + lcount) (lcount 0: all) within the deepest component? */
static int layers_ok(const struct ns *n, uint32_t lfirst, uint32_t lcount)
{
	uint32_t maxl = 0;

	for (uint32_t c = 0; c < n->layout.ncomponents; c++)
		if (n->layout.comp[c].num_layers > maxl)
			maxl = n->layout.comp[c].num_layers;
	return !lcount || lfirst + lcount <= maxl;
}

/*
 * Builds the segments between a page and a view slot: one per (part, token), merged whenever
 * both sides are contiguous. to_page selects the direction. Parts whose layer is outside
 * [lfirst, lfirst + lcount) are skipped (lcount 0: all). Returns the segment count or -errno.
 */
static int view_segs(struct session *s, const struct sview *v, uint8_t *page, uint64_t slot,
		     uint32_t lfirst, uint32_t lcount, int to_page)
{
	const struct ns *n = v->ns;
	uint32_t tpp = n->layout.tokens_per_page, cnt = 0;
	int err = segs_reserve((uint64_t)n->nparts * tpp);

	if (err)
		return err;
	for (uint32_t p = 0; p < v->nparts; p++) {
		const struct kvb_view_part2 *vp = &v->parts[p];
		uint32_t bpt = n->part_bpt[p];
		uint32_t r = (uint32_t)(slot % tpp);
		int32_t dev;
		uint8_t *cl, *run;

		if (lcount && (n->part_layer[p] < lfirst || n->part_layer[p] >= lfirst + lcount))
			continue;
		cl = view_part(s, vp, slot, tpp, bpt, &dev, &err);
		if (!cl)
			return err;
		/*
		 * view_part checked the whole run. Within a page, slots are stride apart; at a page
		 * boundary the next slot is page_stride past the page's slot 0 (run).
		 */
		run = cl - (uint64_t)r * vp->stride;
		for (uint32_t t = 0; t < tpp; t++) {
			uint8_t *pg = page + n->part_off[p] + (uint64_t)t * bpt;

			cnt = to_page ? copy_seg_add(segs, cnt, pg, cl, bpt)
				      : copy_seg_add(segs, cnt, cl, pg, bpt);
			if (++r == tpp) {
				r = 0;
				run += vp->page_stride;
				cl = run;
			} else {
				cl += vp->stride;
			}
		}
	}
	return cnt ? (int)cnt : -EINVAL;
}

static struct sview *session_view(struct session *s, uint32_t id)
{
	return id < SESSION_MAX_VIEWS ? s->views[id] : NULL;
}

/* Resolves the namespace of a page op: the view's, or the SQE's. */
static struct ns *op_ns(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
			struct sview **v)
{
	*v = NULL;
	if (sqe->flags & KVB_OPF_VIEW) {
		*v = session_view(s, sqe->buf);
		return *v ? (*v)->ns : NULL;
	}
	return session_ns(b, s, sqe->ns);
}

/*
 * PUT: dedup first (a stored key copies nothing), then check the source, take a WRITING slot
 * and copy into it; the page is committed when the copy completed (xfer.c). A PUT of a key
 * another PUT is still writing waits for that one (xfer_park_put): see xfer.c [XFER-PARK].
 */
static int op_put(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
		  struct kvb_cqe *cqe)
{
	kvb_key key;
	struct sview *v;
	struct ns *n = op_ns(b, s, sqe, &v);
	struct page *pg;
	uint8_t *src = NULL;
	int32_t dev = COPY_HOST;
	int err = 0, nsegs = 1;

	b->ctr.puts++;
	if (!n) {
		cqe->res = -EBADF;
		return OPS_DONE;
	}
	n->c.puts++;
	/*
	 * Check the source first: a bad request must not evict anything, and must fail the same
	 * whether or not the key is stored (t_rel_hostile: put_existing_bad_source).
	 */
	if (v)
		err = view_check(s, v, sqe->off, &dev);
	else
		src = buf_range(s, sqe->buf, sqe->off, n->page_bytes, &dev, &err);
	if (err) {
		cqe->res = err;
		return OPS_DONE;
	}
	memcpy(key.b, sqe->key, sizeof(key.b));
	pg = store_find(&b->store, n->id, &key);
	if (pg && pg->state == PAGE_WRITING)
		return xfer_park_put(b, s, sqe, pg, cqe);
	if (pg || tier_has(b, n, &key)) {
		/* Another rank or engine stored it: content keys make it equal. */
		xfer_existed(b, n, cqe);
		if (pg)
			store_touch(&b->store, pg);
		return OPS_DONE;
	}
	err = store_alloc_pref(&b->store, n->cls, n->id, &key, s->pref.n ? &s->pref : NULL, &pg);
	if (err == -ENOSPC && tier_park_alloc(b, s, sqe))
		return OPS_DEFERRED; /* runs again once a demotion freed RAM */
	if (err) {
		cqe->res = err;
		return OPS_DONE;
	}
	if (v) {
		nsegs = view_segs(s, v, store_addr(&b->store, pg), sqe->off, 0, 0, 1);
	} else {
		err = segs_reserve(1);
		if (!err)
			segs[0] = (struct copy_seg){store_addr(&b->store, pg), src, n->page_bytes};
		nsegs = err ? err : 1;
	}
	if (nsegs < 0) {
		store_abort(&b->store, pg);
		cqe->res = nsegs;
		return OPS_DONE;
	}
	return xfer_start(b, s, n, pg, dev, COPY_TO_POOL, segs, (uint32_t)nsegs, cqe);
}

/* A READY page of (ns, key), counted as a hit or a miss. */
/* The READY page of (ns, key bytes), or NULL; the key is copied once (it may be shared memory). */
static struct page *page_ready(struct broker *b, const struct ns *n, const uint8_t *key)
{
	struct page *pg;
	kvb_key k;

	memcpy(k.b, key, sizeof(k.b));
	pg = store_find(&b->store, n->id, &k);
	return pg && pg->state == PAGE_READY ? pg : NULL;
}

static struct page *find_ready(struct broker *b, struct ns *n, const uint8_t key[32])
{
	struct page *pg = page_ready(b, n, key);

	if (!pg) {
		b->ctr.misses++;
		n->c.misses++;
		return NULL;
	}
	b->ctr.hits++;
	n->c.hits++;
	return pg;
}

static int op_get(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
		  struct kvb_cqe *cqe)
{
	struct sview *v;
	struct ns *n = op_ns(b, s, sqe, &v);
	struct page *pg;
	uint8_t *dst = NULL;
	int32_t dev = COPY_HOST;
	int err = 0, nsegs;

	b->ctr.gets++;
	if (!n) {
		cqe->res = -EBADF;
		return OPS_DONE;
	}
	n->c.gets++;
	if (v && !layers_ok(n, sqe->layer_first, sqe->layer_count))
		err = -EINVAL; /* names layers that do not exist */
	else if (v)
		err = view_check(s, v, sqe->off, &dev);
	else
		dst = buf_range(s, sqe->buf, sqe->off, n->page_bytes, &dev, &err);
	if (err) {
		cqe->res = err;
		return OPS_DONE;
	}
	if (tier_park(b, s, sqe, n))
		return OPS_DEFERRED; /* on disk: promoted first, then this op runs again */
	pg = find_ready(b, n, sqe->key);
	if (!pg) {
		cqe->res = -ENOENT;
		return OPS_DONE;
	}
	if (v) {
		nsegs = view_segs(s, v, store_addr(&b->store, pg), sqe->off, sqe->layer_first,
				  sqe->layer_count, 0);
	} else {
		err = segs_reserve(1);
		if (!err)
			segs[0] = (struct copy_seg){dst, store_addr(&b->store, pg), n->page_bytes};
		nsegs = err ? err : 1;
	}
	if (nsegs < 0) {
		cqe->res = nsegs;
		return OPS_DONE;
	}
	/* Pinned for the copy's duration: neither eviction nor DELETE frees it underneath. */
	store_pin(&b->store, pg);
	return xfer_start(b, s, n, pg, dev, COPY_FROM_POOL, segs, (uint32_t)nsegs, cqe);
}

static int lease_push(struct broker *b, struct session *s, uint64_t id)
{
	if (s->nleases >= b->cfg.max_leases)
		return -EDQUOT;
	if (s->nleases == s->cap_leases) {
		uint32_t cap = s->cap_leases ? 2 * s->cap_leases : 64;
		uint64_t *nl = realloc(s->leases, cap * sizeof(*nl));

		if (!nl)
			return -ENOMEM;
		s->leases = nl;
		s->cap_leases = cap;
	}
	s->leases[s->nleases++] = id;
	b->leases++;
	return 0;
}

/* Removes one instance of id from the session's leases; the newest are the likeliest. */
static int lease_pop(struct broker *b, struct session *s, uint64_t id)
{
	for (uint32_t i = s->nleases; i-- > 0;) {
		if (s->leases[i] == id) {
			s->leases[i] = s->leases[--s->nleases];
			b->leases--;
			return 0;
		}
	}
	return -EINVAL;
}

static void op_acquire(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
		       struct kvb_cqe *cqe)
{
	struct ns *n = session_ns(b, s, sqe->ns);
	struct page *pg;
	int err;

	b->ctr.acquires++;
	if (!n) {
		cqe->res = -EBADF;
		return;
	}
	if (tier_park(b, s, sqe, n)) {
		cqe->res = OPS_PARKED;
		return;
	}
	pg = find_ready(b, n, sqe->key);
	if (!pg) {
		cqe->res = -ENOENT;
		return;
	}
	err = lease_push(b, s, store_lease_id(pg));
	if (err) {
		cqe->res = err;
		return;
	}
	store_pin(&b->store, pg);
	store_touch(&b->store, pg);
	cqe->lease = store_lease_id(pg);
	cqe->loc = store_loc(&b->store, pg);
	b->ctr.bytes_out += n->page_bytes;
}

static void op_release(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
		       struct kvb_cqe *cqe)
{
	struct page *pg;

	b->ctr.releases++;
	/* The session's own list decides: ids are capabilities, not pointers. */
	if (lease_pop(b, s, sqe->off)) {
		cqe->res = -EINVAL;
		return;
	}
	pg = store_by_id(&b->store, (uint32_t)sqe->off);
	/* A held lease pins its slot, so it cannot have been freed and reused. */
	if (pg && store_lease_id(pg) == sqe->off)
		store_unpin(&b->store, pg);
}

void ops_release_all(struct broker *b, struct session *s)
{
	for (uint32_t i = 0; i < s->nleases; i++) {
		struct page *pg = store_by_id(&b->store, (uint32_t)s->leases[i]);

		if (pg && store_lease_id(pg) == s->leases[i])
			store_unpin(&b->store, pg);
	}
	b->leases -= s->nleases;
	s->nleases = 0;
	free(s->leases);
	s->leases = NULL;
	s->cap_leases = 0;
}

static void op_delete(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
		      struct kvb_cqe *cqe)
{
	struct ns *n = session_ns(b, s, sqe->ns);
	struct page *pg;

	b->ctr.deletes++;
	if (!n) {
		cqe->res = -EBADF;
		return;
	}
	pg = page_ready(b, n, sqe->key);
	if (!tier_delete(b, n, (const kvb_key *)sqe->key) && !pg) {
		cqe->res = -ENOENT;
		return;
	}
	if (pg)
		store_drop(&b->store, pg);
}

static void op_prefetch(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
			struct kvb_cqe *cqe)
{
	struct ns *n = session_ns(b, s, sqe->ns);

	b->ctr.prefetches++;
	if (!n) {
		cqe->res = -EBADF;
		return;
	}
	/* A page on disk is promoted first; then this op runs again and finds it in RAM. */
	if (tier_park(b, s, sqe, n))
		cqe->res = OPS_PARKED;
	else
		cqe->res = page_ready(b, n, sqe->key) ? 0 : -ENOENT;
}

static void op_lookup(struct broker *b, struct session *s, const struct kvb_sqe *sqe,
		      struct kvb_cqe *cqe)
{
	struct ns *n = session_ns(b, s, sqe->ns);
	const uint8_t *keys = s->arg + sqe->batch.arg_off;
	uint8_t *tiers = s->arg + sqe->batch.out_off;
	uint32_t count = sqe->batch.count, lead = 0;
	int leading = 1;

	b->ctr.lookups++;
	if (!n) {
		cqe->res = -EBADF;
		return;
	}
	b->ctr.lookup_keys += count;
	for (uint32_t i = 0; i < count; i++) {
		const uint8_t *k = keys + (uint64_t)i * sizeof(kvb_key);
		kvb_key key;

		memcpy(key.b, k, sizeof(key.b)); /* shared memory: read once */
		if (page_ready(b, n, key.b)) {
			tiers[i] = KVB_TIER_RAM;
			lead += leading;
		} else if (tier_has(b, n, &key)) {
			tiers[i] = KVB_TIER_DISK;
			lead += leading;
		} else {
			tiers[i] = KVB_TIER_NONE;
			leading = 0;
		}
	}
	cqe->res = (int32_t)lead;
}

int ops_exec(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct kvb_cqe *cqe)
{
	int ret = OPS_DONE;

	memset(cqe, 0, sizeof(*cqe));
	cqe->user_data = sqe->user_data;
	s->ops++;
	cqe->res = kvb_sqe_check(sqe, s->arg_size);
	if (cqe->res)
		goto out;
	switch (sqe->opcode) {
	case KVB_OP_NOP:
		b->ctr.nops++;
		break;
	case KVB_OP_PUT:
		ret = op_put(b, s, sqe, cqe);
		break;
	case KVB_OP_GET:
		ret = op_get(b, s, sqe, cqe);
		break;
	case KVB_OP_ACQUIRE:
		op_acquire(b, s, sqe, cqe);
		break;
	case KVB_OP_RELEASE:
		op_release(b, s, sqe, cqe);
		break;
	case KVB_OP_DELETE:
		op_delete(b, s, sqe, cqe);
		break;
	case KVB_OP_LOOKUP:
		op_lookup(b, s, sqe, cqe);
		break;
	case KVB_OP_PREFETCH:
		op_prefetch(b, s, sqe, cqe);
		break;
	}
out:
	if (cqe->res == OPS_PARKED)
		return OPS_DEFERRED;
	if (ret == OPS_DONE && cqe->res < 0 && cqe->res != -ENOENT)
		b->ctr.errors++;
	return ret;
}

void ops_resume(struct broker *b, struct session *s, const struct kvb_sqe *sqe)
{
	struct kvb_cqe cqe = {.user_data = sqe->user_data, .res = -ECANCELED};
	struct sview *v;
	struct ns *n;

	if (s->dead) {
		session_complete(b, s, &cqe); /* no new work for a dead client */
		return;
	}
	/* Its first run counted the request; this one must not count it again. */
	n = sqe->opcode == KVB_OP_PUT || sqe->opcode == KVB_OP_GET ? op_ns(b, s, sqe, &v)
								   : session_ns(b, s, sqe->ns);
	s->ops--;
	switch (sqe->opcode) {
	case KVB_OP_PUT:
		b->ctr.puts--;
		if (n)
			n->c.puts--;
		break;
	case KVB_OP_GET:
		b->ctr.gets--;
		if (n)
			n->c.gets--;
		break;
	case KVB_OP_ACQUIRE:
		b->ctr.acquires--;
		break;
	case KVB_OP_PREFETCH:
		b->ctr.prefetches--;
		break;
	}
	if (ops_exec(b, s, sqe, &cqe) == OPS_DONE)
		session_complete(b, s, &cqe);
}
