// SPDX-License-Identifier: MIT
/*
 * ops.c - the request engine: every page operation, from its SQE to its counted completion.
 *
 * Life cycle of a request (docs/design.md has it as a table):
 *
 *   SQE --ops_submit: copied once, checked, decoded (key, namespace or view)--> running
 *   running --op_run--> done: CQE now (posted with the batch by session_poll)
 *           |        \-> parked on a waitq: a page being written or promoted (pg->waiters,
 *           |            woken by store.c at commit, abort or free), RAM or disk queue room
 *           |            (the tier's wait, woken at each disk completion), a LOOKUP's question
 *           |            to the remote tier, or its own session's yield queue (a long op's
 *           |            next step, run at the session's next turn)
 *           |        \-> copying: a copy engine holds it (xfer.c), done() completes it
 *   parked --waitq_wake: onto the run queue--> ops_poll --op_run again (same op, same decode)
 *   done --ops_complete / inline: counted once (global, namespace, client), CQE posted
 *
 * Every op is one heap struct op from the ring to its completion, on its session's list of ops
 * in flight (so teardown and the drain log can name them), and on at most one wait list at a
 * time. An op never counts anything while it runs: it records its outcome (hit or miss, dedup,
 * bytes moved) and op_account() counts it exactly once when it completes, however it completed
 * (inline, after a copy, after waiting, cancelled), so a parked op that runs again is not
 * counted twice and a deferred one is not missed. Running again re-validates everything that
 * could have changed while it waited (buffers, the page's state) against the session's current
 * state; what cannot change (the key, the namespace, the view, held by a reference) is decoded
 * once.
 *
 * The SQE's references are checked against this session's own bookkeeping: the namespace must
 * be one it opened, the buffer or view one it registered, and every byte range must lie inside
 * the registered length, computed without overflow. A lease id is only honoured when this
 * session holds it and the slot's generation still matches. RAM comes first: the disk tier, then
 * the remote one, is asked only when RAM has no READY page (a miss, or a page still being
 * written). The tiers only answer, miss or "wait on this queue" (waitq.h); this file alone
 * parks, resumes and completes ops (op_promote), so no tier knows what an op is.
 *
 * Fair rounds: each op reports the work it did (ops.h, OPS_ROUND_WORK); a LOOKUP of many keys
 * or a view op of many segments runs in steps and yields between them. Loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "orphan.h"
#include "broker.h"
#include "clock.h"
#include "log.h"
#include "proto.h"
#include "remote.h"
#include "tier.h"

/* The most segments one view op may build: 1,024 layers x 1,024 strided tokens (24 MiB). */
#define OPS_MAX_SEGS (1u << 20)
/* Segment lists up to this many entries (48 KiB) live on the heap ([seg-list]). */
#define OPS_SEGS_HEAP 2048u

/* [ns-free] A namespace no session has open lost its last page: it goes. */
static void ops_ns_empty(void *arg, uint32_t id)
{
	struct broker *b = arg;

	if (ns_release(&b->nst, &b->store, id))
		tier_ns_forget(b, id);
}

void ops_ns_close(struct broker *b, uint32_t id)
{
	struct ns *n = ns_get(&b->nst, id);

	if (n && n->opens)
		n->opens--;
	ops_ns_empty(b, id);
}

/* [told-lru] Notes and hazard entries read before the store evicts by age (store.c). */
static int store_told(void *arg)
{
	return session_settle(arg);
}

void ops_init(struct broker *b)
{
	waitq_init(&b->runq);
	b->store.wake = ops_page_changed; /* [page-wake] */
	b->store.wake_arg = b;
	b->store.ns_empty = ops_ns_empty;
	b->store.ns_empty_arg = b;
	b->store.withdrawn = session_hz_withdrawn; /* [hazard] */
	b->store.withdrawn_arg = b;
	b->store.told = store_told; /* [told-lru] */
	b->store.told_arg = b;
	b->obs.off = b->store.hist_off = getenv("KVB_BROKER_NO_HISTOGRAMS") != NULL;
}

/*
 * [hist] An op's latency into its opcode's histogram, and a hit to the tier that answered it
 * and to its namespace's tenant.
 */
static void op_observe(struct broker *b, const struct op *op)
{
	static const uint8_t which[] = {
		/* histogram + 1; 0: not timed */
		[KVB_OP_GET] = HIST_GET + 1,
		[KVB_OP_PUT] = HIST_PUT + 1,
		[KVB_OP_LOOKUP] = HIST_LOOKUP + 1,
		[KVB_OP_ACQUIRE] = HIST_ACQUIRE + 1,
	};
	uint8_t opc = op->sqe.opcode;

	if (opc == KVB_OP_PUT && op->cqe.res == -ENOSPC && op->n) {
		uint32_t id = op->n->id, p = b->store.ns_part[id];

		tenant_put_refused(&b->tt, p, id, b->store.ns_limit[id], b->store.ns_bytes[id],
				   b->pool.sparse ? b->store.part[p].guarantee /* [tenant-lend] */
						  : b->store.part[p].bytes_total,
				   b->store.part[p].pinned_bytes);
	}
	if (op->hit >= 0 && op->n) {
		struct tenant *t = &b->tt.t[b->store.ns_part[op->n->id]];

		if (op->hit) {
			b->obs.tier_hits[op->ra.asked ? 2 : op->disk ? 1 : 0]++;
			t->hits++;
		} else {
			t->misses++;
		}
	}
	if (op->t0 && opc < sizeof(which) / sizeof(which[0]) && which[opc]) {
		enum hist_id h = op->as_get ? HIST_GET : (enum hist_id)(which[opc] - 1);

		b->obs.t_end = clock_now();
		hist_observe(&b->obs.h[h], hist_bounds_of(h), b->obs.t_end - op->t0);
	}
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

	if ((uint64_t)v->nparts * v->ns->layout.tokens_per_page > OPS_MAX_SEGS)
		return -E2BIG;
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
 * [seg-list] A view op's segment list grows as its steps build it: one segment per (part,
 * token), fewer where they merge (a layer-first view's page needs one per part). Up to
 * OPS_SEGS_HEAP entries it lives on the heap and doubles. A longer one (a view whose slots
 * never merge: up to OPS_MAX_SEGS entries, 24 MiB) takes, once, a mapping of at least every
 * pair the op has (total): an idle one kept from an earlier op (up to OPS_SEG_CACHE of them,
 * smallest fit first), else a new one, faulted in a step at a time. When the op ends its list
 * goes back among the idle ones, or (no room, or idle for OPS_SEG_IDLE) to the background
 * thread to unmap (bg.c). Doubled on the heap, a step that grew the list copied up to 12 MiB
 * (glibc's realloc, once its mmap threshold had risen past that size) and the op's end freed
 * it: one session's turn of a view-segment flood held the loop for 7-70 ms of CPU instead of
 * its budget (t_flood_tail). Mapped and unmapped for every op, each list's 6,000 pages were
 * faulted in and zeroed again, and the loop's mmap() queued behind the background thread's
 * munmap() for the process's mmap lock, which a niced thread on a busy machine held for
 * milliseconds: the honest client's GETs beside the flood went from a p50 of 3-20 us to 2 ms.
 */
#define OPS_SEG_IDLE 1.0 /* seconds */

static size_t segs_map_len(uint32_t cap)
{
	return ((size_t)cap * sizeof(struct copy_seg) + 4095) & ~(size_t)4095;
}

/* A mapping of at least total entries into *m: an idle one, or a new one. 0 or -ENOMEM. */
static int segs_take(struct broker *b, uint32_t total, struct seg_map *m)
{
	uint32_t best = b->seg_ncached;
	void *at;

	for (uint32_t i = 0; i < b->seg_ncached; i++)
		if (b->seg_cache[i].cap >= total &&
		    (best == b->seg_ncached || b->seg_cache[i].cap < b->seg_cache[best].cap))
			best = i;
	b->seg_used = clock_now();
	if (best < b->seg_ncached) {
		*m = b->seg_cache[best];
		b->seg_cache[best] = b->seg_cache[--b->seg_ncached];
		return 0;
	}
	at = mmap(NULL, segs_map_len(total), PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS,
		  -1, 0);
	if (at == MAP_FAILED)
		return -ENOMEM;
	*m = (struct seg_map){at, total};
	return 0;
}

/* A mapping no op uses any more: kept idle in place of a smaller one, or unmapped. */
static void segs_give(struct broker *b, struct seg_map m)
{
	uint32_t small = 0;

	b->seg_used = clock_now();
	if (b->seg_ncached < OPS_SEG_CACHE) {
		b->seg_cache[b->seg_ncached++] = m;
		return;
	}
	for (uint32_t i = 1; i < b->seg_ncached; i++)
		if (b->seg_cache[i].cap < b->seg_cache[small].cap)
			small = i;
	if (b->seg_cache[small].cap < m.cap) {
		struct seg_map t = b->seg_cache[small];

		b->seg_cache[small] = m;
		m = t;
	}
	bg_unmap(b->bg, m.at, segs_map_len(m.cap));
}

void ops_tick(struct broker *b, double now)
{
	if (!b->seg_ncached || now - b->seg_used < OPS_SEG_IDLE)
		return;
	while (b->seg_ncached) {
		struct seg_map m = b->seg_cache[--b->seg_ncached];

		bg_unmap(b->bg, m.at, segs_map_len(m.cap));
	}
}

/* Room for need entries in op's list of at most total. 0 or -ENOMEM. */
static int segs_room(struct op *op, uint32_t need, uint32_t total)
{
	struct copy_seg *ns;
	uint32_t cap;

	if (need <= op->segs_cap)
		return 0;
	if (need <= OPS_SEGS_HEAP) {
		for (cap = op->segs_cap ? op->segs_cap : 64; cap < need; cap *= 2)
			;
		if (cap > total)
			cap = total;
		ns = realloc(op->segs, (size_t)cap * sizeof(*ns));
		if (!ns)
			return -ENOMEM;
	} else {
		struct seg_map m;

		/* Once: total bounds every segment this op can build. */
		if (segs_take(op->b, total, &m))
			return -ENOMEM;
		ns = m.at;
		if (op->nsegs)
			memcpy(ns, op->segs, (size_t)op->nsegs * sizeof(*ns));
		free(op->segs);
		op->segs_mapped = 1;
		cap = m.cap;
	}
	op->segs = ns;
	op->segs_cap = cap;
	return 0;
}

/* [seg-list] Drops op's segment list. */
static void segs_free(struct broker *b, struct op *op)
{
	if (op->segs_mapped)
		segs_give(b, (struct seg_map){op->segs, op->segs_cap});
	else
		free(op->segs);
	op->segs = NULL;
	op->segs_mapped = 0;
	op->segs_cap = op->nsegs = 0;
}

/*
 * Builds the next step of the segments between a page and a view slot: one per (part, token),
 * merged whenever both sides are contiguous, OPS_STEP_WORK (part, token) pairs at most, from
 * op->cursor on. to_page selects the direction; parts whose layer is outside the SQE's layer
 * range are skipped. Returns 1 when every segment is built, 0 when more steps follow, -errno.
 */
static int view_build(struct op *op, uint8_t *page, int to_page)
{
	const struct sview *v = op->v;
	const struct ns *n = v->ns;
	uint32_t tpp = n->layout.tokens_per_page, total = v->nparts * tpp;
	uint32_t lfirst = op->sqe.layer_first, lcount = op->sqe.layer_count, i = op->cursor;
	uint32_t end = total - i > OPS_STEP_WORK ? i + OPS_STEP_WORK : total;
	int err = 0;

	while (i < end) {
		uint32_t p = i / tpp, t = i % tpp, stop = (p + 1) * tpp < end ? tpp : end - p * tpp;
		const struct kvb_view_part2 *vp = &v->parts[p];
		uint32_t bpt = n->part_bpt[p];
		uint32_t r;
		int32_t dev;
		uint8_t *cl, *run;

		if (!to_page && lcount &&
		    (n->part_layer[p] < lfirst || n->part_layer[p] >= lfirst + lcount)) {
			i = (p + 1) * tpp;
			continue;
		}
		cl = view_part(op->s, vp, op->sqe.off, tpp, bpt, &dev, &err);
		if (!cl)
			return err;
		err = segs_room(op, op->nsegs + (stop - t), total);
		if (err)
			return err;
		/*
		 * view_part checked the whole run. Within a page, slots are stride apart; at a page
		 * boundary the next slot is page_stride past the page's slot 0 (run). A step that
		 * starts inside the part starts from token t's slot.
		 */
		if (t) {
			uint64_t o0 = 0, ot = 0;

			view_off(vp, op->sqe.off, tpp, &o0);
			view_off(vp, op->sqe.off + t, tpp, &ot);
			cl += ot - o0;
		}
		r = (uint32_t)((op->sqe.off + t) % tpp);
		run = cl - (uint64_t)r * vp->stride;
		/* [seg-list] Summed here: xfer_start needs no pass over them. */
		op->seg_bytes += (uint64_t)(stop - t) * bpt;
		for (; t < stop; t++, i++) {
			uint8_t *pg = page + n->part_off[p] + (uint64_t)t * bpt;

			op->nsegs = to_page ? copy_seg_add(op->segs, op->nsegs, pg, cl, bpt)
					    : copy_seg_add(op->segs, op->nsegs, cl, pg, bpt);
			if (++r == tpp) {
				r = 0;
				run += vp->page_stride;
				cl = run;
			} else {
				cl += vp->stride;
			}
		}
	}
	op->work += end - op->cursor;
	op->cursor = i;
	if (i < total)
		return 0;
	return op->nsegs ? 1 : -EINVAL;
}

static struct sview *session_view(struct session *s, uint32_t id)
{
	return id < SESSION_MAX_VIEWS ? s->views[id] : NULL;
}

static int op_fail(struct op *op, int err)
{
	op->cqe.res = err;
	return OPS_DONE;
}

/* A filled PUT whose source we need no more of: its client stops filling (wire.h). */
static void fill_stop(struct op *op)
{
	if (!op->fill || op->fill_stopped)
		return;
	op->fill_stopped = 1;
	kvb_store_release(op->s->fill_stop, op->fill_seq);
}

/* A long op's next step waits for its session's next turn (fair rounds). */
static int op_yield(struct broker *b, struct op *op)
{
	return ops_park(b, op, &op->s->yieldq, "its next step (fair rounds)");
}

/* ---- waiting ---- */

int ops_park(struct broker *b, struct op *op, struct waitq *q, const char *what)
{
	op->waits = what;
	op->parked = 1;
	if (!op->since)
		op->since = clock_now();
	list_add_tail(&q->ops, &op->link);
	b->ops_parked++;
	return OPS_DEFERRED;
}

int ops_park_page(struct broker *b, struct op *op, struct page *pg, const char *what)
{
	struct waitq *q = store_waiters(pg);

	if (!q)
		return op_fail(op, -ENOMEM);
	return ops_park(b, op, q, what);
}

static void ops_wake(struct broker *b, struct waitq *q)
{
	waitq_wake(q, &b->runq); /* they run in the order they parked */
}

void ops_page_changed(void *arg, struct page *pg)
{
	struct broker *b = arg;
	struct waitq *q = pg->waiters;

	if (!q)
		return;
	pg->waiters = NULL;
	ops_wake(b, q);
	free(q);
}

/* ---- completion and accounting ---- */

/* Counts a completed op, once: globally, in its namespace and for its client. */
static void op_account(struct broker *b, const struct op *op)
{
	struct counters *c = &b->ctr;
	struct session_counters *sc = &op->s->c;
	struct ns *n = op->n;
	int32_t res = op->cqe.res;

	op->s->ops++;
	switch (op->sqe.opcode) {
	case KVB_OP_NOP:
		c->nops++;
		break;
	case KVB_OP_PUT:
		c->puts++;
		sc->puts++;
		if (n)
			n->c.puts++;
		break;
	case KVB_OP_ACQUIRE:
		sc->gets++; /* a client's reads, zero-copy or not */
		if (!op->as_get) {
			c->acquires++;
			break;
		}
		c->gets++;
		if (n)
			n->c.gets++;
		break;
	case KVB_OP_GET:
		c->gets++;
		sc->gets++;
		if (n)
			n->c.gets++;
		break;
	case KVB_OP_RELEASE:
		c->releases += !op->as_get; /* the end of a kvb_get() is part of its GET */
		break;
	case KVB_OP_DELETE:
		c->deletes++;
		break;
	case KVB_OP_LOOKUP:
		c->lookups++;
		if (n)
			c->lookup_keys += op->sqe.batch.count;
		break;
	case KVB_OP_PREFETCH:
		c->prefetches++;
		break;
	}
	if (op->hit > 0) {
		c->hits++;
		sc->hits++;
		if (n)
			n->c.hits++;
	} else if (op->hit == 0) {
		c->misses++;
		sc->misses++;
		if (n)
			n->c.misses++;
	}
	if (op->dedup) {
		c->dedup++;
		sc->dedup++;
		if (n)
			n->c.dedup++;
	}
	c->bytes_in += op->bytes_in;
	c->bytes_out += op->bytes_out;
	sc->bytes_in += op->bytes_in;
	sc->bytes_out += op->bytes_out;
	if (res < 0 && res != -ENOENT) {
		c->errors++;
		sc->errors++;
	}
}

/*
 * [op-cache] Every SQE is one struct op (~500 bytes) from the ring to its CQE. glibc serves
 * that size outside its thread cache, and gcc turns malloc + memset into calloc, which
 * bypasses the cache anyway: ~1,150 of a 64 KiB GET's ~2,900 broker instructions outside its
 * copy were malloc's and free's (callgrind). Freed ops are kept on a stack of up to
 * OPS_CACHE for the next SQEs instead; an op is zeroed before its reuse either way. Not under
 * AddressSanitizer, which must see a use of a freed op as one.
 */
#define OPS_CACHE 64u
#if defined(__SANITIZE_ADDRESS__)
#define OPS_CACHE_OFF 1
#else
#define OPS_CACHE_OFF 0
#endif

static struct op *op_alloc(struct broker *b)
{
	struct op *op = b->op_cache;

	if (op) {
		b->op_cache = *(struct op **)(void *)op;
		b->op_ncached--;
	} else {
		op = malloc(sizeof(*op));
	}
	return op;
}

static void op_free(struct broker *b, struct op *op)
{
	if (OPS_CACHE_OFF || b->op_ncached >= OPS_CACHE) {
		free(op);
		return;
	}
	*(struct op **)(void *)op = b->op_cache;
	b->op_cache = op;
	b->op_ncached++;
}

void ops_fini(struct broker *b)
{
	while (b->op_cache)
		free(op_alloc(b));
	while (b->seg_ncached) {
		struct seg_map m = b->seg_cache[--b->seg_ncached];

		munmap(m.at, segs_map_len(m.cap));
	}
}

/* Counts op, drops what it holds and frees it; the CQE is the caller's to post. */
static void op_end(struct broker *b, struct op *op)
{
	op_account(b, op);
	op_observe(b, op);
	remote_ask_end(&op->ra);
	if (op->v)
		sview_put(op->v);
	segs_free(b, op);
	free(op->fds);
	list_del(&op->slink);
	op->s->nops--;
	op_free(b, op);
}

/*
 * A page op's client copies that page (out of its lease, into its staging) before its next op:
 * stay up that long. Every completion, inline or not: an inline ACQUIRE of a 4.29 MiB page
 * without it let the 200 us window run out inside the client's copy, and each page paid a
 * broker sleep and wake-up and the client's (110-220 us a page on 2 vCPUs, nearly every SQE
 * a doorbell write).
 */
static void op_hold(struct broker *b, const struct op *op)
{
	if (!op->v) /* views' clients copy nothing of the page themselves */
		loop_hold_bytes(&b->loop, op->bytes_in + op->bytes_out);
}

void ops_complete(struct broker *b, struct op *op)
{
	struct session *s = op->s;
	struct kvb_cqe cqe = op->cqe;

	op_hold(b, op);
	op_end(b, op);
	session_complete(b, s, &cqe);
}

/* An op of a session that died while it waited: let go of its page, complete it unrun. */
static void op_cancel(struct broker *b, struct op *op)
{
	if (op->pg) {
		if (op->sqe.opcode == KVB_OP_PUT)
			store_abort(&b->store, op->pg);
		else
			store_unpin(&b->store, op->pg);
		op->pg = NULL;
	}
	op->cqe.res = -ECANCELED;
	ops_complete(b, op);
}

void ops_session_dead(struct broker *b, struct session *s)
{
	struct list *pos, *tmp;

	/* Parked ops go now; those a copy engine or the disk holds finish first. */
	list_for_each_safe (pos, tmp, &s->live) {
		struct op *op = list_entry(pos, struct op, slink);

		if (!op->parked)
			continue;
		list_del(&op->link);
		op->parked = 0;
		b->ops_parked--;
		op_cancel(b, op);
	}
}

/* ---- the ops ---- */

/*
 * PUT: check the source, then dedup (a stored key copies nothing), take a WRITING slot and
 * copy into it; the page is committed when the copy completed (xfer.c). A PUT of a key whose
 * page is being written (another PUT's copy, or a promotion from disk) waits for that page's
 * next state: committed, it completes EXISTED; aborted, it runs again and writes it itself.
 *
 * A filled PUT (KVB_SQEF_FILL, xfer.c [fill]) asks first: stored, or being written, its client
 * is told to stop filling at once, so eight TP ranks' PUTs of one page copy it once, into
 * staging and into the pool; one told to stop that must write after all (the page it waited
 * for was aborted) completes -EAGAIN, and its client sends a plain PUT.
 */
static int op_put(struct broker *b, struct op *op)
{
	struct ns *n = op->n;
	struct session *s = op->s;
	struct wait_on w;
	struct page *pg;
	int err = 0;

	if (!n)
		return op_fail(op, -EBADF);
	if (!op->pg) {
		uint8_t *src = NULL;

		/*
		 * Check the source first: a bad request must not evict anything, and must fail
		 * the same whether or not the key is stored (t_rel_hostile:
		 * put_existing_bad_source). Again at every run: a buffer may go while it waits.
		 */
		if (op->v)
			err = view_check(s, op->v, op->sqe.off, &op->dev);
		else
			src = buf_range(s, op->sqe.buf, op->sqe.off, n->page_bytes, &op->dev, &err);
		/* Filled bytes are followed by our own loads: mapped host memory only. */
		if (!err && op->fill && (op->dev != COPY_HOST || s->bufs[op->sqe.buf].fdb))
			err = -EINVAL;
		if (err)
			return op_fail(op, err);
		pg = store_find(&b->store, n->id, &op->key);
		if (pg && pg->state == PAGE_WRITING) {
			b->xs.parked++;
			fill_stop(op);
			return ops_park_page(b, op, pg, "the same page being written");
		}
		if (pg || tier_has(b, n, &op->key)) {
			/* Another rank or engine stored it: content keys make it equal. */
			op->dedup = 1;
			op->cqe.flags |= KVB_CQEF_EXISTED;
			if (pg) {
				/* [chain] One stored plain (or promoted) learns its parent now. */
				if (op->sqe.flags & KVB_OPF_PARENT)
					store_link_parent(&b->store, pg, &op->parent);
				store_touch(&b->store, pg);
			}
			if (op->fill) {
				b->xs.fill_existed++;
				fill_stop(op);
			}
			return OPS_DONE;
		}
		if (op->fill_stopped) {
			b->xs.fill_gaveup++;
			return op_fail(op,
				       -EAGAIN); /* its client stopped filling: a plain PUT now */
		}
		/* [told-lru] It reads what clients told before it evicts (session_settle). */
		err = store_alloc_pref(&b->store, n->cls, n->id, &op->key,
				       s->pref.n ? &s->pref : NULL, &pg);
		if (err == -ENOSPC && tier_wait_alloc(b, &w))
			return ops_park(b, op, w.q,
					w.why); /* runs again once a demotion freed RAM */
		if (err)
			return op_fail(op, err);
		if (op->sqe.flags & KVB_OPF_PARENT)
			store_link_parent(&b->store, pg, &op->parent);
		op->pg = pg;
		op->seg1 = (struct copy_seg){store_addr(&b->store, pg), src, n->page_bytes};
	}
	if (op->fill)
		return xfer_fill(b, op);
	if (op->v) {
		err = view_build(op, store_addr(&b->store, op->pg), 1);
		if (!err)
			return op_yield(b, op);
		if (err < 0) {
			store_abort(&b->store, op->pg);
			op->pg = NULL;
			return op_fail(op, err);
		}
	}
	return xfer_start(b, op, COPY_TO_POOL);
}

/*
 * RAM has no READY page for the op (pg: the key's WRITING page, or NULL): asks the disk tier,
 * then the remote one (whose fetch may also land in dst, a plain host destination). Returns 1
 * with the op parked where a tier said to wait (it runs again from ops_poll and finds the
 * page in RAM, or misses), 0 for a miss. The tiers only answer; parking is done here.
 */
static int op_promote(struct broker *b, struct op *op, struct page *pg, uint8_t *dst)
{
	struct wait_on w;

	if (tier_promote(b, op->n, &op->key, pg, &w)) {
		/* [hist] Waiting on the page itself: its promotion was issued or joined, so a hit
		 * now is the disk tier's (not while it waits for room or RAM). */
		op->disk |= w.pg != NULL;
		ops_park(b, op, w.q, w.why);
		return 1;
	}
	if (remote_promote(b, &op->ra, op->n, &op->key, pg, dst, &w)) {
		ops_park(b, op, w.q, w.why);
		return 1;
	}
	return 0;
}

static int op_get(struct broker *b, struct op *op)
{
	struct ns *n = op->n;
	struct page *pg;
	int err = 0;

	if (!n)
		return op_fail(op, -EBADF);
	if (op->as_get) {
		/*
		 * [dir] The client read the page itself through the directory (wire.h): count the
		 * GET and its hit, and keep the page as warm as a GET of ours would.
		 */
		pg = store_find(&b->store, n->id, &op->key);
		if (pg && pg->state == PAGE_READY) {
			remote_on_hit(b, n, pg);
			store_touch(&b->store, pg);
		}
		op->hit = 1;
		op->bytes_out = n->page_bytes;
		op->cqe.res = (int32_t)n->page_bytes;
		b->ctr.dir_gets++;
		return OPS_DONE;
	}
	if (op->ra.filled) {
		/* A fetch landed in dst as well as in the slot, and was checked: nothing to copy. */
		op->hit = 1;
		op->bytes_out = n->page_bytes;
		op->cqe.res = (int32_t)n->page_bytes;
		return OPS_DONE;
	}
	if (!op->pg) {
		uint8_t *dst = NULL;

		if (op->v && !layers_ok(n, op->sqe.layer_first, op->sqe.layer_count))
			err = -EINVAL; /* names layers that do not exist */
		else if (op->v)
			err = view_check(op->s, op->v, op->sqe.off, &op->dev);
		else
			dst = buf_range(op->s, op->sqe.buf, op->sqe.off, n->page_bytes, &op->dev,
					&err);
		if (err)
			return op_fail(op, err);
		pg = store_find(&b->store, n->id, &op->key);
		if (!pg || pg->state != PAGE_READY) {
			/*
			 * RAM first: only now is the disk tier asked, then the remote one, whose
			 * fetch also lands in a plain host destination (not a view's, a GPU's or
			 * an fd buffer's: those keep the copy after the commit).
			 */
			if (op_promote(b, op, pg,
				       op->dev == COPY_HOST && !op->s->nfdbufs ? dst : NULL))
				return OPS_DEFERRED; /* runs again once the page is in RAM */
			op->hit = 0;
			return op_fail(op, -ENOENT);
		}
		op->hit = 1;
		remote_on_hit(b, n, pg);
		/* Pinned for the copy's duration: neither eviction nor DELETE frees it. */
		store_pin(&b->store, pg);
		op->pg = pg;
		op->seg1 = (struct copy_seg){dst, store_addr(&b->store, pg), n->page_bytes};
	}
	if (op->v) {
		err = view_build(op, store_addr(&b->store, op->pg), 0);
		if (!err)
			return op_yield(b, op);
		if (err < 0) {
			store_unpin(&b->store, op->pg);
			op->pg = NULL;
			return op_fail(op, err);
		}
	}
	return xfer_start(b, op, COPY_FROM_POOL);
}

/*
 * [lease-limits] A lease pins a page until released, so leases are what one client could use
 * to deny everyone else the pool (lease every page, then stop). Three bounds: --max-leases and
 * --max-lease-bytes per client (-EDQUOT), and --max-pinned for all clients of a partition
 * (-EBUSY), which keeps the rest of it evictable so that a PUT always finds room. That cap
 * counts the bytes clients lease (leased_bytes), not every pin: pages the broker pins while it
 * demotes, promotes or copies them come and go on their own, and counting them refused a
 * kvb_get() with -EBUSY whenever slow disk writes kept many demotions in flight (a flake of
 * t_disk_tmpfs under load). A lease held
 * past --lease-lifetime ends its session (rounds.c). A page this client already leases costs
 * nothing more against the pinned cap (it is pinned already).
 */
uint64_t ops_lease_limit(const struct broker *b, uint32_t part)
{
	/* Zero is "no limit" for both (main.c sets the defaults; the unit tests leave them). */
	if (b->cfg.max_lease_bytes || part >= b->pool.nparts)
		return b->cfg.max_lease_bytes;
	/* Fractions are of the partition as sized, its directory included [dir]. */
	return (uint64_t)(b->cfg.max_lease_frac * (double)b->pool.part[part].size);
}

static int lease_push(struct broker *b, struct session *s, const struct page *pg, uint64_t bytes,
		      int as_get)
{
	uint64_t part_bytes = b->pool.part[store_part_of(&b->store, pg)].size;
	uint64_t limit = ops_lease_limit(b, store_part_of(&b->store, pg));
	uint64_t id = store_lease_id(pg);

	if (limit && limit < bytes)
		limit = bytes; /* one lease is always possible */
	/* A kvb_get() leases only while it copies: one page past the limit, not more. */
	if (limit && as_get)
		limit += b->store.max_page;
	/* [hazard] with the leases it holds under its own table, as told */
	if (s->nleases + s->hz_leases >= b->cfg.max_leases ||
	    (limit && s->lease_bytes + s->hz_held + bytes > limit))
		return -EDQUOT;
	if (b->cfg.max_pinned > 0 && !pg->pins &&
	    b->leased_bytes[s->part] + bytes > (uint64_t)(b->cfg.max_pinned * (double)part_bytes))
		return -EBUSY;
	if (s->nleases == s->cap_leases) {
		uint32_t cap = s->cap_leases ? 2 * s->cap_leases : 64;
		uint64_t *nl = realloc(s->leases, cap * sizeof(*nl));
		double *nt;

		if (!nl)
			return -ENOMEM;
		s->leases = nl;
		nt = realloc(s->lease_at, cap * sizeof(*nt));
		if (!nt)
			return -ENOMEM;
		s->lease_at = nt;
		s->cap_leases = cap;
	}
	s->lease_at[s->nleases] = clock_now();
	s->leases[s->nleases++] = id;
	orphan_ledger(b, s, s->nleases - 1); /* [records] */
	s->lease_bytes += bytes;
	b->leased_bytes[s->part] += bytes;
	b->leases++;
	session_hz_allow(b, s);
	return 0;
}

/* Removes one instance of id from the session's leases; the newest are the likeliest. */
static int lease_pop(struct broker *b, struct session *s, uint64_t id)
{
	for (uint32_t i = s->nleases; i-- > 0;) {
		if (s->leases[i] == id) {
			struct page *pg = store_by_id(&b->store, (uint32_t)id);

			--s->nleases;
			s->leases[i] = s->leases[s->nleases];
			s->lease_at[i] = s->lease_at[s->nleases];
			orphan_ledger(b, s, i); /* [records] */
			/* A held lease pins its slot: the record is still the one leased. */
			if (pg && store_lease_id(pg) == id) {
				s->lease_bytes -= b->store.cls[pg->cls].slot_bytes;
				b->leased_bytes[s->part] -= b->store.cls[pg->cls].slot_bytes;
			}
			b->leases--;
			session_hz_allow(b, s);
			return 0;
		}
	}
	return -EINVAL;
}

static int op_acquire(struct broker *b, struct op *op)
{
	struct ns *n = op->n;
	struct page *pg;
	int err;

	if (!n)
		return op_fail(op, -EBADF);
	/* [hazard] Its own leases, told in the note ring, counted before this one. */
	if (!op->note)
		session_notes(b, op->s);
	pg = store_find(&b->store, n->id, &op->key);
	if (op->sqe.flags & KVB_SQEF_HELD) {
		/* [hazard] The client leased it itself (wire.h): count it, warm it, hold it. */
		if (pg && pg->state == PAGE_READY) {
			remote_on_hit(b, n, pg);
			store_touch(&b->store, pg);
		}
		if (pg && pg->state != PAGE_READY)
			pg = NULL;
		/* In slot bytes where the page is known, as the broker's own leases count. */
		session_hz_told(b, op->s, op->sqe.off, pg,
				pg ? b->store.cls[pg->cls].slot_bytes : n->page_bytes);
		op->hit = 1;
		op->bytes_out = n->page_bytes;
		b->ctr.dir_acquires++;
		return OPS_DONE;
	}
	if (!pg || pg->state != PAGE_READY) {
		if (op_promote(b, op, pg, NULL))
			return OPS_DEFERRED;
		op->hit = 0;
		return op_fail(op, -ENOENT);
	}
	op->hit = 1;
	remote_on_hit(b, n, pg);
	err = lease_push(b, op->s, pg, b->store.cls[pg->cls].slot_bytes, op->as_get);
	if (err == -EBUSY && session_settle(b)) {
		/* [notes] Others' RELEASEs not read yet must not count against --max-pinned. */
		err = lease_push(b, op->s, pg, b->store.cls[pg->cls].slot_bytes, op->as_get);
	}
	if (err)
		return op_fail(op, err);
	store_pin(&b->store, pg);
	store_touch(&b->store, pg);
	op->cqe.lease = store_lease_id(pg);
	op->cqe.loc = store_loc(&b->store, pg);
	op->bytes_out = n->page_bytes;
	return OPS_DONE;
}

static int op_release(struct broker *b, struct op *op)
{
	struct page *pg;
	uint64_t id = op->sqe.off;

	/*
	 * [notes] A RELEASE on the SQ comes after what the client told in its note ring (its
	 * second release of one lease must find it released; [hazard] an async RELEASE of its
	 * own lease, after that lease's ACQUIRE): they are read first.
	 */
	if (!op->note)
		session_notes(b, op->s);
	if (op->sqe.flags & KVB_SQEF_HELD) {
		session_hz_told(b, op->s, id, NULL, 0); /* [hazard] the client's own lease */
		return OPS_DONE;
	}
	/* The session's own list decides: ids are capabilities, not pointers. */
	if (lease_pop(b, op->s, id))
		return op_fail(op, -EINVAL);
	pg = store_by_id(&b->store, (uint32_t)id);
	/* A held lease pins its slot, so it cannot have been freed and reused. */
	if (pg && store_lease_id(pg) == id)
		store_unpin(&b->store, pg);
	return OPS_DONE;
}

void ops_release_all(struct broker *b, struct session *s)
{
	for (uint32_t i = 0; i < s->nleases; i++) {
		struct page *pg = store_by_id(&b->store, (uint32_t)s->leases[i]);

		if (pg && store_lease_id(pg) == s->leases[i])
			store_unpin(&b->store, pg);
	}
	b->leases -= s->nleases;
	b->leased_bytes[s->part] -= s->lease_bytes;
	s->nleases = 0;
	if (!b->handover) /* [records] handed over, the next broker holds them */
		orphan_ledger(b, s, 0);
	s->lease_bytes = 0;
	free(s->leases);
	free(s->lease_at);
	s->leases = NULL;
	s->lease_at = NULL;
	s->cap_leases = 0;
}

static int op_delete(struct broker *b, struct op *op)
{
	struct page *pg;

	if (!op->n)
		return op_fail(op, -EBADF);
	pg = store_find(&b->store, op->n->id, &op->key);
	if (pg && pg->state != PAGE_READY)
		pg = NULL;
	if (!tier_delete(b, op->n, &op->key) && !pg)
		return op_fail(op, -ENOENT);
	if (pg)
		store_drop(&b->store, pg);
	return OPS_DONE;
}

static int op_prefetch(struct broker *b, struct op *op)
{
	struct page *pg;

	if (!op->n)
		return op_fail(op, -EBADF);
	pg = store_find(&b->store, op->n->id, &op->key);
	if (pg && pg->state == PAGE_READY)
		return OPS_DONE;
	/* A page on disk is promoted first; then this op runs again and finds it in RAM. */
	if (op_promote(b, op, pg, NULL))
		return OPS_DEFERRED;
	return op_fail(op, -ENOENT);
}

/* LOOKUP: OPS_STEP_WORK keys per step, yielding between steps (fair rounds). */
static int op_lookup(struct broker *b, struct op *op)
{
	struct session *s = op->s;
	const uint8_t *keys = s->arg + op->sqe.batch.arg_off;
	uint8_t *tiers = s->arg + op->sqe.batch.out_off;
	uint32_t count = op->sqe.batch.count, i = op->cursor;
	uint32_t end = count - i > OPS_STEP_WORK ? i + OPS_STEP_WORK : count;
	struct wait_on w;

	if (!op->n)
		return op_fail(op, -EBADF);
	if (op->ra.lq) {
		/* The remote tier answered (or its deadline passed): the keys it has. */
		op->cqe.res = (int32_t)remote_lookup_apply(&op->ra, tiers, op->lead);
		return OPS_DONE;
	}
	if (!i)
		op->leading = 1;
	for (; i < end; i++) {
		struct page *pg;
		kvb_key key;

		memcpy(key.b, keys + (uint64_t)i * sizeof(kvb_key), sizeof(key.b)); /* read once */
		pg = store_find(&b->store, op->n->id, &key);
		if (pg && pg->state == PAGE_READY) {
			tiers[i] = KVB_TIER_RAM;
			op->lead += op->leading;
		} else if (tier_has(b, op->n, &key)) {
			tiers[i] = KVB_TIER_DISK;
			op->lead += op->leading;
		} else {
			tiers[i] = KVB_TIER_NONE;
			op->leading = 0;
		}
	}
	op->work += end - op->cursor;
	op->cursor = end;
	if (end < count)
		return op_yield(b, op);
	/* Only keys found nowhere here cross the network; a LOOKUP of local pages never waits. */
	if (remote_lookup(b, &op->ra, op->n, keys, tiers, count, &w))
		return ops_park(b, op, w.q, w.why);
	op->cqe.res = (int32_t)op->lead;
	return OPS_DONE;
}

/* Runs op (again): OPS_DONE with op->cqe set, or OPS_DEFERRED (parked, yielded or copying). */
static int op_run(struct broker *b, struct op *op)
{
	op->work = 1;
	op->waits = NULL;
	if (op->cqe.res)
		return OPS_DONE; /* refused at decode */
	switch (op->sqe.opcode) {
	case KVB_OP_PUT:
		return op_put(b, op);
	case KVB_OP_GET:
		return op_get(b, op);
	case KVB_OP_ACQUIRE:
		return op_acquire(b, op);
	case KVB_OP_RELEASE:
		return op_release(b, op);
	case KVB_OP_DELETE:
		return op_delete(b, op);
	case KVB_OP_LOOKUP:
		return op_lookup(b, op);
	case KVB_OP_PREFETCH:
		return op_prefetch(b, op);
	}
	return OPS_DONE; /* NOP */
}

/* Decodes an SQE into op, once: its shape, then the namespace or view it names. */
static void op_decode(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct op *op)
{
	op->b = b;
	op->s = s;
	op->sqe = *sqe;
	op->hit = -1;
	op->dev = COPY_HOST;
	op->cqe.user_data = sqe->user_data;
	list_init(&op->link);
	/* Numbered before the check: the client numbers every one it posts (wire.h). */
	if (sqe->flags & KVB_SQEF_FILL)
		op->fill_seq = ++s->fill_seq;
	op->cqe.res = kvb_sqe_check(sqe, s->arg_size);
	if (op->cqe.res)
		return;
	op->as_get = !!(sqe->flags & KVB_SQEF_GET);
	op->fill = !!(sqe->flags & KVB_SQEF_FILL);
	if (sqe->opcode == KVB_OP_LOOKUP || sqe->opcode == KVB_OP_NOP ||
	    sqe->opcode == KVB_OP_RELEASE) {
		if (sqe->opcode == KVB_OP_LOOKUP)
			op->n = session_ns(b, s, sqe->ns);
		return;
	}
	memcpy(op->key.b, sqe->key, sizeof(op->key.b));
	/* [chain] Checked in bounds by kvb_sqe_check; read once, the client may reuse the cell. */
	if (sqe->flags & KVB_OPF_PARENT)
		memcpy(op->parent.b, s->arg + sqe->parent_off, sizeof(op->parent.b));
	if (sqe->flags & KVB_OPF_VIEW) {
		op->v = session_view(s, sqe->buf);
		if (op->v) {
			op->v->refs++; /* a VIEW_DESTROY meanwhile cannot free it under us */
			op->n = op->v->ns;
		}
		return;
	}
	op->n = session_ns(b, s, sqe->ns);
}

/* A decoded op of s on its list of ops in flight, or NULL (out of memory). */
static struct op *op_new(struct broker *b, struct session *s, const struct kvb_sqe *sqe)
{
	struct op *op = op_alloc(b); /* [op-cache] */

	if (!op)
		return NULL;
	memset(op, 0, sizeof(*op));
	op_decode(b, s, sqe, op);
	list_add_tail(&s->live, &op->slink);
	s->nops++;
	return op;
}

int ops_note(struct broker *b, struct session *s, const struct kvb_sqe *sqe)
{
	struct op *op;
	int32_t res;

	/* [told] A directory read or a hazard lease, or a RELEASE of a lease we gave. */
	if (sqe->opcode != KVB_OP_RELEASE && !ops_told(sqe))
		return -EPROTO;
	op = op_new(b, s, sqe);
	if (!op)
		return -ENOMEM; /* left in the ring for the next drain: a RELEASE must not be lost */
	op->note = 1;
	/* Both complete at once (kvb_sqe_check refused any other shape of a directory GET). */
	(void)op_run(b, op);
	res = op->cqe.res;
	op_end(b, op);
	return res < 0 ? -EPROTO : 0;
}

int ops_submit(struct broker *b, struct session *s, const struct kvb_sqe *sqe, struct kvb_cqe *cqe,
	       uint64_t *work)
{
	struct op *op = op_new(b, s, sqe);
	int r;

	if (!op) {
		*cqe = (struct kvb_cqe){.user_data = sqe->user_data, .res = -ENOMEM};
		b->ctr.errors++;
		*work = 1;
		return OPS_DONE;
	}
	op->batch = s->batch_more;
	/* [hist] The next SQE of a batch is taken as the one before it ends: its end is its t0. */
	if (!b->obs.off)
		op->t0 = b->obs.next_s == s ? b->obs.next_t0 : clock_now();
	b->obs.next_s = NULL;
	r = op_run(b, op);
	*work = op->work;
	if (r == OPS_DEFERRED) {
		if (!op->since)
			op->since = op->t0 ? op->t0 : clock_now();
		return OPS_DEFERRED;
	}
	*cqe = op->cqe;
	if (!ops_told(sqe))
		op_hold(b, op);
	b->obs.t_end = 0;
	r = op->batch;
	op_end(b, op);
	if (r && b->obs.t_end) {
		b->obs.next_s = s;
		b->obs.next_t0 = b->obs.t_end;
	}
	return OPS_DONE;
}

/* Runs a woken or yielded op again; a dead session's is completed unrun. Returns its work. */
static uint64_t op_resume(struct broker *b, struct op *op)
{
	uint64_t work;

	list_del(&op->link);
	op->parked = 0;
	b->ops_parked--;
	if (op->s->dead) {
		op_cancel(b, op);
		return 1;
	}
	if (op_run(b, op) == OPS_DEFERRED)
		return op->work;
	work = op->work;
	ops_complete(b, op);
	return work;
}

uint32_t ops_poll(struct broker *b)
{
	struct list mine;
	uint32_t n = 0;

	/* Detached first: what these runs wake goes to the next poll, not into this walk. */
	list_init(&mine);
	list_splice_tail(&mine, &b->runq.ops);
	while (!list_empty(&mine)) {
		op_resume(b, list_entry(mine.next, struct op, link));
		n++;
	}
	return n;
}

uint64_t ops_run_yielded(struct broker *b, struct session *s, uint64_t budget)
{
	struct list mine;
	uint64_t work = 0;

	list_init(&mine);
	list_splice_tail(&mine, &s->yieldq.ops);
	/*
	 * At least one step per turn, so that a session always makes progress. A filled PUT's
	 * last step posts its CQE before its commit ([cqe-first], xfer.c [fill]): committed
	 * before the next op runs and before we return, as session_poll does for its SQEs.
	 */
	b->late_ok = 1;
	while (!list_empty(&mine) && (!work || work < budget)) {
		xfer_commit_late(b);
		work += op_resume(b, list_entry(mine.next, struct op, link));
	}
	b->late_ok = 0;
	xfer_commit_late(b);
	/* What did not get its step this turn stays first in line for the next. */
	list_splice_head(&s->yieldq.ops, &mine);
	return work;
}
