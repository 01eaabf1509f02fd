// SPDX-License-Identifier: MIT
/*
 * test_ops.c - the request engine (broker/ops.c) over a real store and pool, with a fake copy
 * engine whose jobs complete when the test says so and session_complete() wrapped
 * (-Wl,--wrap=session_complete) to record completions. Park and wake on every path:
 *
 *   - a PUT whose copy is queued completes later, counted once (globally, namespace, client);
 *   - a PUT of a key being written parks on the page and is woken by the commit (EXISTED) or
 *     by the abort (runs again and writes it itself), counted once either way;
 *   - page state changes wake their waiters: commit, abort, free; never from inside the store
 *     (woken ops wait on the run queue for ops_poll);
 *   - a LOOKUP of more keys than a step yields and resumes on its session's turns;
 *   - a view GET of many segments is built in steps, the page pinned meanwhile; its mapped
 *     segment list is kept for the next such op, and unmapped after a second idle;
 *   - a session that dies with ops parked or yielded gets them cancelled at once, pages
 *     unpinned; one with a copy in flight keeps it until the engine finishes;
 *   - an ACQUIRE/RELEASE pair flagged KVB_SQEF_GET counts as one GET.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker.h"

#define MiB (1ull << 20)
#define TPP 16
#define BPT 256
#define LAYERS 4
#define PB (TPP * BPT * LAYERS)
#define MAXC 64

/* ---- a copy engine the test drives ---- */

struct fake_engine {
	struct copy_engine e;
	int queue; /* 1: every job is queued until fake_finish */
	int fail;  /* result of the jobs finished next */
	struct copy_job *jobs[MAXC];
	uint32_t njobs;
};

static int fake_submit(struct copy_engine *e, struct copy_job *j)
{
	struct fake_engine *f = (struct fake_engine *)e;

	if (!f->queue) {
		for (uint32_t i = 0; i < j->nsegs; i++)
			memcpy(j->segs[i].dst, j->segs[i].src, j->segs[i].len);
		j->res = 0;
		return COPY_DONE;
	}
	assert_true(f->njobs < MAXC);
	f->jobs[f->njobs++] = j;
	e->inflight++;
	return COPY_QUEUED;
}

static uint32_t fake_poll(struct copy_engine *e)
{
	(void)e;
	return 0;
}

/* Completes the oldest queued job with res (copying when 0). */
static void fake_finish(struct fake_engine *f, int32_t res)
{
	struct copy_job *j;

	assert_true(f->njobs > 0);
	j = f->jobs[0];
	memmove(f->jobs, f->jobs + 1, --f->njobs * sizeof(f->jobs[0]));
	f->e.inflight--;
	if (!res)
		for (uint32_t i = 0; i < j->nsegs; i++)
			memcpy(j->segs[i].dst, j->segs[i].src, j->segs[i].len);
	j->res = res;
	j->done(j);
}

/* ---- completions, through the wrapped session_complete ---- */

static struct kvb_cqe done[MAXC];
static uint32_t ndone;

void __wrap_session_complete(struct broker *b, struct session *s, const struct kvb_cqe *cqe);
void __wrap_session_complete(struct broker *b, struct session *s, const struct kvb_cqe *cqe)
{
	(void)b;
	s->inflight--;
	assert_true(ndone < MAXC);
	done[ndone++] = *cqe;
}

/* ---- fixture ---- */

struct fx {
	struct broker b;
	struct fake_engine eng;
	struct session *s;
	struct ns *n;
	uint8_t *mem; /* buffer 0 of the session: 16 pages */
	char name[64];
};

static struct fx F;

static int setup(void **state)
{
	struct kvb_layout l;
	struct fx *f = &F;

	memset(f, 0, sizeof(*f));
	ndone = 0;
	snprintf(f->name, sizeof(f->name), "/kvb-test-ops-%d", (int)getpid());
	assert_int_equal(pool_open(&f->b.pool, f->name, 8 * MiB, 1), 0);
	assert_int_equal(store_init(&f->b.store, &f->b.pool, MiB, 1.0, 1.0), 0);
	ops_init(&f->b);
	list_init(&f->b.sessions);
	list_init(&f->b.graveyard);
	f->b.cfg.max_leases = 64;
	f->b.cfg.max_bufs = 8;
	f->eng.e = (struct copy_engine){
		.name = "fake", .efd = -1, .submit = fake_submit, .poll = fake_poll};
	f->b.copy = &f->eng.e;
	memset(&l, 0, sizeof(l));
	strcpy(l.model, "test/ops");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = TPP;
	l.tp_size = 1;
	l.ncomponents = 1;
	strcpy(l.comp[0].name, "kv");
	l.comp[0].num_layers = LAYERS;
	l.comp[0].bytes_per_token_layer = BPT;
	assert_int_equal(ns_open(&f->b.nst, &f->b.store, &l, 0, &f->n), 0);
	f->s = calloc(1, sizeof(*f->s));
	assert_non_null(f->s);
	session_init(&f->b, f->s);
	f->s->id = 1;
	f->s->ns_opened[f->n->id / 8] |= (uint8_t)(1u << (f->n->id % 8));
	f->n->opens++; /* as on_ns_open counts it [ns-free] */
	f->mem = calloc(16, PB);
	assert_non_null(f->mem);
	f->s->bufs[0] = (struct sbuf){.base = f->mem, .len = 16 * PB, .dev = COPY_HOST};
	f->s->arg_size = 1u << 20;
	f->s->arg = calloc(1, f->s->arg_size);
	assert_non_null(f->s->arg);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	assert_int_equal(f->b.ops_parked, 0);
	assert_int_equal(f->s->nops, 0);
	for (uint32_t i = 0; i < SESSION_MAX_VIEWS; i++)
		if (f->s->views[i])
			sview_put(f->s->views[i]);
	free(f->s->arg);
	free(f->s->leases);
	free(f->s);
	free(f->mem);
	ops_fini(&f->b);
	ns_table_fini(&f->b.nst);
	store_fini(&f->b.store);
	pool_close(&f->b.pool);
	return 0;
}

static kvb_key key_of(uint32_t i)
{
	kvb_key k;

	memset(&k, 0, sizeof(k));
	memcpy(k.b, &i, sizeof(i));
	k.b[31] = 0x77;
	return k;
}

static struct kvb_sqe sqe_of(uint8_t op, const struct fx *f, uint32_t key, uint64_t off,
			     uint64_t ud)
{
	struct kvb_sqe q;
	kvb_key k = key_of(key);

	memset(&q, 0, sizeof(q));
	q.opcode = op;
	q.ns = f->n->id;
	q.user_data = ud;
	memcpy(q.key, k.b, sizeof(q.key));
	q.buf = 0;
	q.off = off;
	return q;
}

/* Submits like session_poll does: 1 deferred (a CQ slot held), 0 done with *cqe. */
static int submit(struct fx *f, const struct kvb_sqe *q, struct kvb_cqe *cqe)
{
	uint64_t w;
	int r = ops_submit(&f->b, f->s, q, cqe, &w);

	assert_true(w >= 1);
	if (r == OPS_DEFERRED)
		f->s->inflight++;
	return r == OPS_DEFERRED;
}

static struct page *page_of(struct fx *f, uint32_t key)
{
	kvb_key k = key_of(key);

	return store_find(&f->b.store, f->n->id, &k);
}

/* ---- tests ---- */

static void test_ops_put_deferred_counted_at_completion(void **state)
{
	struct fx *f = *state;
	struct kvb_sqe q = sqe_of(KVB_OP_PUT, f, 1, 0, 11);
	struct kvb_cqe c;

	f->eng.queue = 1;
	memset(f->mem, 0xab, PB);
	assert_int_equal(submit(f, &q, &c), 1);
	assert_int_equal(f->b.ctr.puts, 0); /* not yet: counted when it completes */
	assert_int_equal(page_of(f, 1)->state, PAGE_WRITING);
	fake_finish(&f->eng, 0);
	assert_int_equal(ndone, 1);
	assert_int_equal(done[0].user_data, 11);
	assert_int_equal(done[0].res, 0);
	assert_int_equal(page_of(f, 1)->state, PAGE_READY);
	assert_int_equal(f->b.ctr.puts, 1);
	assert_int_equal(f->b.ctr.bytes_in, PB);
	assert_int_equal(f->s->c.puts, 1);
	assert_int_equal(f->s->c.bytes_in, PB);
	assert_int_equal(f->n->c.puts, 1);
	assert_int_equal(f->s->ops, 1);
}

static void test_ops_put_parked_on_writer_commit(void **state)
{
	struct fx *f = *state;
	struct kvb_sqe a = sqe_of(KVB_OP_PUT, f, 2, 0, 1), b = sqe_of(KVB_OP_PUT, f, 2, PB, 2);
	struct kvb_cqe c;

	f->eng.queue = 1;
	assert_int_equal(submit(f, &a, &c), 1);
	assert_int_equal(submit(f, &b, &c), 1);
	assert_int_equal(f->b.ops_parked, 1);
	assert_non_null(page_of(f, 2)->waiters);
	fake_finish(&f->eng, 0);
	/* The commit woke it onto the run queue; it has not run inside the store. */
	assert_int_equal(ndone, 1);
	assert_null(page_of(f, 2)->waiters);
	assert_int_equal(ops_poll(&f->b), 1);
	assert_int_equal(ndone, 2);
	assert_int_equal(done[1].user_data, 2);
	assert_int_equal(done[1].res, 0);
	assert_true(done[1].flags & KVB_CQEF_EXISTED);
	assert_int_equal(f->b.ctr.puts, 2);
	assert_int_equal(f->b.ctr.dedup, 1);
	assert_int_equal(f->s->c.dedup, 1);
	assert_int_equal(f->eng.njobs, 0); /* one copy for two PUTs */
}

static void test_ops_put_parked_on_writer_abort(void **state)
{
	struct fx *f = *state;
	struct kvb_sqe a = sqe_of(KVB_OP_PUT, f, 3, 0, 1), b = sqe_of(KVB_OP_PUT, f, 3, PB, 2);
	struct kvb_cqe c;

	f->eng.queue = 1;
	assert_int_equal(submit(f, &a, &c), 1);
	assert_int_equal(submit(f, &b, &c), 1);
	fake_finish(&f->eng, -EIO);
	assert_int_equal(ndone, 1);
	assert_int_equal(done[0].res, -EIO);
	assert_null(page_of(f, 3));
	/* Runs again: the first writer is gone, so it becomes the writer (its copy queued). */
	assert_int_equal(ops_poll(&f->b), 1);
	assert_int_equal(ndone, 1);
	assert_int_equal(f->eng.njobs, 1);
	assert_int_equal(page_of(f, 3)->state, PAGE_WRITING);
	fake_finish(&f->eng, 0);
	assert_int_equal(ndone, 2);
	assert_int_equal(done[1].res, 0);
	assert_false(done[1].flags & KVB_CQEF_EXISTED);
	assert_int_equal(f->b.ctr.puts, 2); /* not 3: a re-run is not a new request */
	assert_int_equal(f->b.ctr.errors, 1);
	assert_int_equal(f->s->c.errors, 1);
	assert_int_equal(f->b.xs.errors, 1);
}

/* Parks a NOP-like op on a page by hand (the PUT path), then changes the page's state. */
static void test_ops_page_changes_wake(void **state)
{
	struct fx *f = *state;
	struct kvb_sqe a = sqe_of(KVB_OP_PUT, f, 4, 0, 1), b = sqe_of(KVB_OP_PUT, f, 4, PB, 2);
	struct kvb_cqe c;
	kvb_key k = key_of(5);
	struct page *pg;

	/* Abort without a copy engine's help: store_abort wakes. */
	f->eng.queue = 1;
	assert_int_equal(submit(f, &a, &c), 1);
	assert_int_equal(submit(f, &b, &c), 1);
	pg = page_of(f, 4);
	assert_non_null(pg->waiters);
	store_pin(&f->b.store, pg); /* a second pin: the abort unindexes, the free comes later */
	fake_finish(&f->eng, -EIO);
	assert_null(pg->waiters);
	assert_int_equal(ops_poll(&f->b), 1); /* B becomes the writer */
	store_unpin(&f->b.store, pg);	      /* the old slot is freed now: nobody waits on it */
	fake_finish(&f->eng, 0);
	assert_int_equal(ndone, 2);

	/* Free wakes too: an op parked on a page that is dropped and freed. */
	assert_int_equal(store_alloc(&f->b.store, f->n->cls, f->n->id, &k, &pg), 0);
	{
		struct kvb_sqe q = sqe_of(KVB_OP_PUT, f, 5, 0, 3);

		assert_int_equal(submit(f, &q, &c), 1); /* parks: the page is WRITING */
	}
	assert_int_equal(f->b.ops_parked, 1);
	store_abort(&f->b.store, pg); /* unindexed and freed at once */
	assert_int_equal(ops_poll(&f->b), 1);
	fake_finish(&f->eng, 0);
	assert_int_equal(ndone, 3);
	assert_int_equal(done[2].res, 0);
	assert_int_equal(page_of(f, 5)->state, PAGE_READY);
}

static void test_ops_lookup_yields_in_steps(void **state)
{
	struct fx *f = *state;
	uint32_t count = 3 * OPS_STEP_WORK + 5, turns = 0;
	struct kvb_sqe q;
	struct kvb_cqe c;

	f->eng.queue = 0;
	for (uint32_t i = 0; i < 3; i++) {
		struct kvb_sqe p = sqe_of(KVB_OP_PUT, f, 100 + i, 0, 0);

		assert_int_equal(submit(f, &p, &c), 0);
		assert_int_equal(c.res, 0);
	}
	for (uint32_t i = 0; i < count; i++) {
		kvb_key k = key_of(100 + i);

		memcpy(f->s->arg + (size_t)i * 32, k.b, 32);
	}
	memset(&q, 0, sizeof(q));
	q.opcode = KVB_OP_LOOKUP;
	q.ns = f->n->id;
	q.user_data = 9;
	q.batch.count = count;
	q.batch.out_off = count * 32;
	assert_int_equal(submit(f, &q, &c), 1);
	assert_int_equal(f->b.ops_parked, 1);
	assert_int_equal(f->b.ctr.lookups, 0);
	while (!ndone) {
		uint64_t w = ops_run_yielded(&f->b, f->s, OPS_ROUND_WORK);

		assert_true(w > 0 && w <= OPS_STEP_WORK + 1);
		turns++;
	}
	assert_int_equal(turns, 3);
	assert_int_equal(done[0].res, 3);
	assert_int_equal(f->s->arg[count * 32 + 2], KVB_TIER_RAM);
	assert_int_equal(f->s->arg[count * 32 + 3], KVB_TIER_NONE);
	assert_int_equal(f->b.ctr.lookups, 1);
	assert_int_equal(f->b.ctr.lookup_keys, count);
}

/* A view of 4 layers x TPP tokens, strided so nothing merges, over buffer 0. */
static uint32_t make_view(struct fx *f)
{
	struct sview *v = calloc(1, sizeof(*v) + LAYERS * sizeof(v->parts[0]));

	assert_non_null(v);
	v->refs = 1;
	v->ns = f->n;
	v->nparts = LAYERS;
	for (uint32_t p = 0; p < LAYERS; p++)
		v->parts[p] = (struct kvb_view_part2){.buf = 0,
						      .stride = 2 * BPT,
						      .base = (uint64_t)p * TPP * 2 * BPT,
						      .page_stride = (uint64_t)TPP * 2 * BPT};
	f->s->views[0] = v;
	return 0;
}

static void test_ops_view_ops_and_dead_session(void **state)
{
	struct fx *f = *state;
	struct kvb_sqe q;
	struct kvb_cqe c;
	struct page *pg;

	/* A view GET copies LAYERS * TPP segments: under a step, so it runs at once. */
	f->eng.queue = 0;
	make_view(f);
	q = sqe_of(KVB_OP_PUT, f, 7, 0, 1);
	assert_int_equal(submit(f, &q, &c), 0);
	q = sqe_of(KVB_OP_GET, f, 7, 0, 2);
	q.flags = KVB_OPF_VIEW;
	assert_int_equal(submit(f, &q, &c), 0);
	assert_int_equal(c.res, PB);

	/* Queued: the op holds the page and the view; a VIEW_DESTROY meanwhile frees nothing. */
	f->eng.queue = 1;
	assert_int_equal(submit(f, &q, &c), 1);
	pg = page_of(f, 7);
	assert_int_equal(pg->pins, 1);
	assert_int_equal(f->s->views[0]->refs, 2);
	sview_put(f->s->views[0]);
	f->s->views[0] = NULL;
	/* The session dies: the copy in flight finishes, then the page is unpinned. */
	f->s->dead = 1;
	ops_session_dead(&f->b, f->s);
	assert_int_equal(ndone, 0);
	fake_finish(&f->eng, 0);
	assert_int_equal(ndone, 1);
	assert_int_equal(pg->pins, 0);

	/* A parked op of a dead session is cancelled at once. */
	f->s->dead = 0;
	q = sqe_of(KVB_OP_PUT, f, 8, 0, 3);
	assert_int_equal(submit(f, &q, &c), 1);
	q.user_data = 4;
	assert_int_equal(submit(f, &q, &c), 1);
	assert_int_equal(f->b.ops_parked, 1);
	f->s->dead = 1;
	ops_session_dead(&f->b, f->s);
	assert_int_equal(ndone, 2);
	assert_int_equal(done[1].user_data, 4);
	assert_int_equal(done[1].res, -ECANCELED);
	assert_int_equal(f->b.ops_parked, 0);
	fake_finish(&f->eng, 0);
	assert_int_equal(ndone, 3);
}

static void test_ops_long_view_yields_and_cancels(void **state)
{
	struct fx *f = *state;
	struct kvb_layout l;
	struct sview *v;
	struct ns *n;
	struct kvb_sqe q;
	struct kvb_cqe c;
	struct page *pg;
	kvb_key k = key_of(9);
	uint32_t tpp = 4 * OPS_STEP_WORK, turns = 0; /* one layer: one part of 4 steps */

	memset(&l, 0, sizeof(l));
	strcpy(l.model, "test/ops-long");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = tpp;
	l.tp_size = 1;
	l.ncomponents = 1;
	strcpy(l.comp[0].name, "kv");
	l.comp[0].num_layers = 1;
	l.comp[0].bytes_per_token_layer = 1;
	assert_int_equal(ns_open(&f->b.nst, &f->b.store, &l, 0, &n), 0);
	n->opens++;
	f->s->ns_opened[n->id / 8] |= (uint8_t)(1u << (n->id % 8));
	v = calloc(1, sizeof(*v) + sizeof(v->parts[0]));
	assert_non_null(v);
	*v = (struct sview){.refs = 1, .ns = n, .nparts = 1};
	v->parts[0] = (struct kvb_view_part2){.buf = 0, .stride = 2, .page_stride = 2ull * tpp};
	f->s->views[1] = v;
	assert_int_equal(store_alloc(&f->b.store, n->cls, n->id, &k, &pg), 0);
	for (uint32_t i = 0; i < tpp; i++)
		((uint8_t *)store_addr(&f->b.store, pg))[i] = (uint8_t)(i * 7);
	store_commit(&f->b.store, pg);

	f->eng.queue = 0;
	memset(&q, 0, sizeof(q));
	q.opcode = KVB_OP_GET;
	q.flags = KVB_OPF_VIEW;
	q.buf = 1;
	memcpy(q.key, k.b, 32);
	assert_int_equal(submit(f, &q, &c), 1); /* its first step, then it yields */
	assert_int_equal(pg->pins, 1);
	while (!ndone) {
		ops_run_yielded(&f->b, f->s, 1);
		turns++;
	}
	assert_int_equal(turns, 3);
	assert_int_equal(done[0].res, tpp);
	for (uint32_t i = 0; i < tpp; i++)
		assert_int_equal(f->mem[2 * i], (uint8_t)(i * 7));
	assert_int_equal(pg->pins, 0);
	assert_int_equal(f->b.ctr.gets, 1);
	assert_int_equal(f->b.ctr.hits, 1);
	/* [seg-list] Its list of tpp segments (past the heap's) is kept for the next op. */
	assert_int_equal(f->b.seg_ncached, 1);
	assert_true(f->b.seg_cache[0].cap >= tpp);

	/* Dying between steps: cancelled, the page unpinned. */
	assert_int_equal(submit(f, &q, &c), 1);
	assert_int_equal(pg->pins, 1);
	assert_int_equal(f->b.seg_ncached, 1); /* a first step's segments fit the heap's */
	ops_run_yielded(&f->b, f->s, 1);
	assert_int_equal(f->b.seg_ncached, 0); /* its second step took the kept list */
	f->s->dead = 1;
	ops_session_dead(&f->b, f->s);
	assert_int_equal(ndone, 2);
	assert_int_equal(done[1].res, -ECANCELED);
	assert_int_equal(pg->pins, 0);
	assert_int_equal(f->b.seg_ncached, 1);
	/* Kept while it may serve the next op; unmapped once idle for a second. */
	ops_tick(&f->b, f->b.seg_used + 0.5);
	assert_int_equal(f->b.seg_ncached, 1);
	ops_tick(&f->b, f->b.seg_used + 1.5);
	assert_int_equal(f->b.seg_ncached, 0);
}

static void test_ops_kvb_get_pair_is_one_get(void **state)
{
	struct fx *f = *state;
	struct kvb_sqe q = sqe_of(KVB_OP_PUT, f, 10, 0, 1);
	struct kvb_cqe c;

	f->eng.queue = 0;
	assert_int_equal(submit(f, &q, &c), 0);
	q = sqe_of(KVB_OP_ACQUIRE, f, 10, 0, 2);
	q.flags = KVB_SQEF_GET;
	assert_int_equal(submit(f, &q, &c), 0);
	assert_int_equal(c.res, 0);
	q = sqe_of(KVB_OP_RELEASE, f, 0, c.lease, 3);
	memset(q.key, 0, sizeof(q.key));
	q.flags = KVB_SQEF_GET;
	assert_int_equal(submit(f, &q, &c), 0);
	assert_int_equal(c.res, 0);
	assert_int_equal(f->b.ctr.gets, 1);
	assert_int_equal(f->b.ctr.hits, 1);
	assert_int_equal(f->b.ctr.acquires, 0);
	assert_int_equal(f->b.ctr.releases, 0);
	assert_int_equal(f->n->c.gets, 1);
	/* A plain ACQUIRE is still one. */
	q = sqe_of(KVB_OP_ACQUIRE, f, 10, 0, 4);
	assert_int_equal(submit(f, &q, &c), 0);
	assert_int_equal(f->b.ctr.acquires, 1);
	assert_int_equal(f->b.ctr.gets, 1);
	ops_release_all(&f->b, f->s);
	/* The flag is refused on other ops. */
	q = sqe_of(KVB_OP_PUT, f, 11, 0, 5);
	q.flags = KVB_SQEF_GET;
	assert_int_equal(submit(f, &q, &c), 0);
	assert_int_equal(c.res, -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_ops_put_deferred_counted_at_completion, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_ops_put_parked_on_writer_commit, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_ops_put_parked_on_writer_abort, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_ops_page_changes_wake, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ops_lookup_yields_in_steps, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ops_view_ops_and_dead_session, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_ops_long_view_yields_and_cancels, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_ops_kvb_get_pair_is_one_get, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
