// SPDX-License-Identifier: MIT
/*
 * test_chain.c - the store's chain bookkeeping [chain] and namespace caps [ns-limit], over a
 * real shared-memory pool: parents outlive their kids (chains leave RAM tail first), LRU among
 * leaves, held parents coming back on a touch or when their last kid goes, links that survive
 * nothing they should not (DELETE, abort, a freed parent's reused slot), no cycles whatever
 * keys name, parents gaining a kid while demoted stay in RAM, slab reclaim across page sizes
 * walking chains, and a capped namespace evicting only its own pages.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "pool.h"
#include "store.h"

#define MiB (1ull << 20)

struct fx {
	struct pool pool;
	struct store st;
	char name[64];
};

static kvb_key key_of(uint32_t i)
{
	kvb_key k;

	memset(&k, 0, sizeof(k));
	memcpy(k.b, &i, sizeof(i));
	k.b[31] = 0xc4;
	return k;
}

/* 8 slabs of 1 MiB, watermarks out of the way unless a test sets them. */
static int setup(void **state)
{
	static struct fx f;

	memset(&f, 0, sizeof(f));
	snprintf(f.name, sizeof(f.name), "/kvb-test-chain-%d", (int)getpid());
	if (pool_open(&f.pool, f.name, 8 * MiB, 1))
		return -1;
	if (store_init(&f.st, &f.pool, MiB, 1.0, 1.0))
		return -1;
	*state = &f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;

	store_fini(&f->st);
	pool_close(&f->pool);
	return 0;
}

/* PUT of key i in ns, child of key parent (UINT32_MAX: none), committed. */
static struct page *put(struct store *s, int cls, uint32_t ns, uint32_t i, uint32_t parent)
{
	kvb_key k = key_of(i), pk = key_of(parent);
	struct page *pg;

	if (store_alloc(s, cls, ns, &k, &pg))
		return NULL;
	if (parent != UINT32_MAX)
		store_link_parent(s, pg, &pk);
	store_commit(s, pg);
	return pg;
}

static int stored(struct store *s, uint32_t ns, uint32_t i)
{
	kvb_key k = key_of(i);

	return store_find(s, ns, &k) != NULL;
}

/* Chain c of len pages: keys c * 100 + j, each the child of the one before. */
static void put_chain(struct store *s, int cls, uint32_t ns, uint32_t c, uint32_t len)
{
	for (uint32_t j = 0; j < len; j++)
		assert_non_null(put(s, cls, ns, c * 100 + j, j ? c * 100 + j - 1 : UINT32_MAX));
}

/* No stored page of chain c (len pages) after a missing one: the chain is never stranded. */
static void assert_whole(struct store *s, uint32_t ns, uint32_t c, uint32_t len)
{
	int gone = 0;

	for (uint32_t j = 0; j < len; j++) {
		if (!stored(s, ns, c * 100 + j))
			gone = 1;
		else if (gone)
			fail_msg("chain %u: page %u stored after a missing one", c, j);
	}
}

static void test_chain_evicts_tail_first(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024); /* 32 pages in the pool */

	/* 4 chains of 8, in PUT order: plain LRU would evict chain 0's head first. */
	for (uint32_t c = 0; c < 4; c++)
		put_chain(&f->st, cls, 1, c, 8);
	assert_int_equal(f->st.st.chain_links, 4 * 7);
	{
		kvb_key k0 = key_of(0), k1 = key_of(1);

		assert_null(store_parent(&f->st, store_find(&f->st, 1, &k0)));
		assert_ptr_equal(store_parent(&f->st, store_find(&f->st, 1, &k1)),
				 store_find(&f->st, 1, &k0));
	}
	/* 12 more pages: chain 0 goes whole, tail first, then chain 1's tail half. */
	for (uint32_t i = 0; i < 12; i++)
		assert_non_null(put(&f->st, cls, 1, 1000 + i, UINT32_MAX));
	for (uint32_t c = 0; c < 4; c++)
		assert_whole(&f->st, 1, c, 8);
	assert_false(stored(&f->st, 1, 0));
	assert_true(stored(&f->st, 1, 100) && stored(&f->st, 1, 103) && !stored(&f->st, 1, 104));
	assert_true(stored(&f->st, 1, 207) && stored(&f->st, 1, 307));
	assert_true(f->st.st.held > 0);
	assert_int_equal(f->st.st.chain_cuts, 0);
}

static void test_chain_lru_among_leaves(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);
	kvb_key k;

	for (uint32_t c = 0; c < 4; c++)
		put_chain(&f->st, cls, 1, c, 8);
	/* A GET of chain 0 (pin, unpin each, head first) makes it the hottest. */
	for (uint32_t j = 0; j < 8; j++) {
		struct page *pg;

		k = key_of(j);
		pg = store_find(&f->st, 1, &k);
		store_pin(&f->st, pg);
		store_unpin(&f->st, pg);
	}
	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(put(&f->st, cls, 1, 1000 + i, UINT32_MAX));
	assert_true(stored(&f->st, 1, 7));    /* chain 0 whole */
	assert_false(stored(&f->st, 1, 100)); /* chain 1 went, tail first */
	for (uint32_t c = 0; c < 4; c++)
		assert_whole(&f->st, 1, c, 8);
	/* Held parents come back at a touch: chain 2's head touched, its tail is still a leaf. */
	k = key_of(200);
	store_touch(&f->st, store_find(&f->st, 1, &k));
	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(put(&f->st, cls, 1, 2000 + i, UINT32_MAX));
	for (uint32_t c = 0; c < 4; c++)
		assert_whole(&f->st, 1, c, 8);
	/* 207..201 went tail first; 200, touched, stayed; then chain 3's tail. */
	assert_true(stored(&f->st, 1, 200) && !stored(&f->st, 1, 201));
	assert_true(stored(&f->st, 1, 306) && !stored(&f->st, 1, 307));
}

static void test_chain_delete_abort_and_reuse(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);
	struct page *p, *kid, *w;
	kvb_key k = key_of(1), pk = key_of(0);

	p = put(&f->st, cls, 1, 0, UINT32_MAX);
	kid = put(&f->st, cls, 1, 1, 0);
	assert_ptr_equal(store_parent(&f->st, kid), p);
	assert_int_equal(p->kids, 1);
	/* DELETE of the kid: the parent is a leaf again. */
	store_drop(&f->st, kid);
	assert_int_equal(p->kids, 0);
	/* An aborted write lets go of its parent too. */
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &w), 0);
	assert_int_equal(store_link_parent(&f->st, w, &pk), 1);
	assert_int_equal(p->kids, 1);
	store_abort(&f->st, w);
	assert_int_equal(p->kids, 0);
	/* DELETE of a parent: its kid stays, a root now; the slot reused is no one's parent. */
	kid = put(&f->st, cls, 1, 1, 0);
	store_drop(&f->st, p);
	assert_null(store_parent(&f->st, kid));
	w = put(&f->st, cls, 1, 50, UINT32_MAX);
	assert_ptr_equal(w, p); /* the same slot, a new generation */
	assert_int_equal(w->kids, 0);
	store_drop(&f->st, kid); /* finds no parent: touches nothing */
	assert_int_equal(w->kids, 0);
	/* A parent absent, or the page itself: no link. */
	k = key_of(60);
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &w), 0);
	assert_int_equal(store_link_parent(&f->st, w, &k), 0);
	pk = key_of(61);
	assert_int_equal(store_link_parent(&f->st, w, &pk), 0);
	store_commit(&f->st, w);
}

static void test_chain_never_cycles(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);
	struct page *a = put(&f->st, cls, 1, 0, UINT32_MAX);
	struct page *b = put(&f->st, cls, 1, 1, 0);
	kvb_key kb = key_of(1);

	/* a naming b (a dedup PUT of a with parent b) would close a cycle: refused. */
	assert_int_equal(store_link_parent(&f->st, a, &kb), 0);
	assert_int_equal(a->kids, 1);
	assert_int_equal(b->kids, 0);
	/* Everything evicts: 32 new pages take every slot. */
	for (uint32_t i = 0; i < 32; i++)
		assert_non_null(put(&f->st, cls, 1, 100 + i, UINT32_MAX));
	assert_false(stored(&f->st, 1, 0) || stored(&f->st, 1, 1));
}

/* The disk tier's seam: every page "demoted" at once, completed by hand. */
static struct page *demoted[64];
static uint32_t ndemoted;

static int fake_demote(void *arg, struct page *pg)
{
	(void)arg;
	demoted[ndemoted++] = pg;
	return 1;
}

static void test_chain_demotion(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, MiB); /* 8 pages */
	struct page *p, *six;
	kvb_key k = key_of(500), k2 = key_of(501);

	put_chain(&f->st, cls, 1, 0, 8);
	f->st.demote = fake_demote;
	ndemoted = 0;
	/* Only the tail is a leaf: demotion starts there, not at the coldest (the head). */
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &p), -ENOSPC);
	assert_int_equal(ndemoted, 1);
	assert_true(stored(&f->st, 1, 7) && demoted[0]->demoting);
	/* Written: the tail leaves RAM, its parent is the next leaf. */
	store_demote_done(&f->st, demoted[0], 1);
	assert_false(stored(&f->st, 1, 7));
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &p), 0);
	store_commit(&f->st, p);
	/* The next leaves: 6, then page 500 (the only other one). */
	assert_int_equal(store_alloc(&f->st, cls, 1, &k2, &p), -ENOSPC);
	assert_int_equal(ndemoted, 3);
	six = demoted[1];
	assert_true(stored(&f->st, 1, 6) && six->demoting);
	assert_ptr_equal(demoted[2], store_find(&f->st, 1, &k));
	/* A kid PUT while 6 is written keeps 6 in RAM, clean, when the write completes. */
	store_demote_done(&f->st, demoted[2], 1); /* room for the kid */
	assert_non_null(put(&f->st, cls, 1, 7, 6));
	store_demote_done(&f->st, six, 1);
	assert_true(stored(&f->st, 1, 6));
	assert_true(six->clean);
	f->st.demote = NULL;
	assert_whole(&f->st, 1, 0, 8);
}

static void test_chain_reclaim_across_classes(void **state)
{
	struct fx *f = *state;
	int small = store_class_get(&f->st, 256 * 1024), big = store_class_get(&f->st, MiB);
	struct page *pg;

	/* Two chains of 16 small pages fill the pool (4 slabs each, chains across slabs). */
	put_chain(&f->st, small, 1, 0, 16);
	put_chain(&f->st, small, 1, 1, 16);
	/* Big pages take the slabs over, chain by chain from the tails: nothing stranded. */
	for (uint32_t i = 0; i < 4; i++) {
		pg = put(&f->st, big, 2, 900 + i, UINT32_MAX);
		assert_non_null(pg);
		assert_whole(&f->st, 1, 0, 16);
		assert_whole(&f->st, 1, 1, 16);
	}
	assert_false(stored(&f->st, 1, 0));
	assert_true(stored(&f->st, 1, 100));
	assert_int_equal(f->st.st.chain_cuts, 0);
	/* Everything to big pages: still no cut, every small page evicted leaves first. */
	for (uint32_t i = 4; i < 8; i++)
		assert_non_null(put(&f->st, big, 2, 900 + i, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[1], 0);
	assert_int_equal(f->st.st.chain_cuts, 0);
}

static void test_ns_limit_evicts_own_pages(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);

	store_ns_limit(&f->st, 2, MiB); /* namespace 2: at most 4 pages */
	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(put(&f->st, cls, 1, i, UINT32_MAX));
	put_chain(&f->st, cls, 2, 1, 4);
	assert_int_equal(f->st.ns_pages[2], 4);
	assert_int_equal(f->st.ns_bytes[2], MiB);
	/* Its next page evicts one of its own (its chain's tail: it is the only leaf)... */
	assert_non_null(put(&f->st, cls, 2, 50, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[2], 4);
	assert_int_equal(f->st.ns_pages[1], 8);
	assert_int_equal(f->st.st.ns_evictions, 1);
	assert_false(stored(&f->st, 2, 103));
	assert_whole(&f->st, 2, 1, 4);
	/* ... while namespace 1, uncapped, keeps growing into the rest of the pool. */
	for (uint32_t i = 8; i < 28; i++)
		assert_non_null(put(&f->st, cls, 1, i, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[1], 28);
	assert_int_equal(f->st.ns_pages[2], 4);
	/* Everything of namespace 2 pinned: over its cap a PUT is refused, not served by ns 1. */
	for (uint32_t j = 0; j < 3; j++) {
		kvb_key k = key_of(100 + j);

		store_pin(&f->st, store_find(&f->st, 2, &k));
	}
	{
		kvb_key k = key_of(50);

		store_pin(&f->st, store_find(&f->st, 2, &k));
	}
	assert_null(put(&f->st, cls, 2, 60, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[1], 28);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_chain_evicts_tail_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_lru_among_leaves, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_delete_abort_and_reuse, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_never_cycles, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_demotion, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_reclaim_across_classes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ns_limit_evicts_own_pages, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
