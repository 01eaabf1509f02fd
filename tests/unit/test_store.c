// SPDX-License-Identifier: MIT
/*
 * test_store.c - the page store over a real shared-memory pool: slot allocation and reuse,
 * size classes sharing slabs, LRU eviction order, pins and leases blocking eviction, delete of
 * a pinned page, lease-id generations, watermark eviction, the pool's seals, and the disk
 * tier's seam in evict() (demotion, clean pages, a busy or failed tier).
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmocka.h>

#include "plan.h"
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
	k.b[31] = 0x5a;
	return k;
}

/* 8 slabs of 1 MiB, watermarks out of the way unless a test sets them. */
static int setup(void **state)
{
	static struct fx f;

	memset(&f, 0, sizeof(f));
	snprintf(f.name, sizeof(f.name), "/kvb-test-store-%d", (int)getpid());
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

static struct page *put(struct store *s, int cls, uint32_t ns, uint32_t i)
{
	kvb_key k = key_of(i);
	struct page *pg;

	if (store_alloc(s, cls, ns, &k, &pg))
		return NULL;
	memset(store_addr(s, pg), (int)(i & 0xff), s->cls[cls].slot_bytes);
	store_commit(s, pg);
	return pg;
}

static void test_store_alloc_find_commit(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 100000); /* rounds to 102400 */
	struct page *pg;
	kvb_key k = key_of(7);

	assert_true(cls >= 0);
	assert_int_equal(f->st.cls[cls].slot_bytes, 102400);
	assert_int_equal(store_class_get(&f->st, 100000), cls);
	assert_int_equal(store_class_get(&f->st, 9 * MiB), -E2BIG); /* larger than the arena */
	assert_null(store_find(&f->st, 1, &k));
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &pg), 0);
	assert_int_equal(pg->state, PAGE_WRITING);
	assert_ptr_equal(store_find(&f->st, 1, &k), pg);
	assert_null(store_find(&f->st, 2, &k)); /* namespaces are separate */
	store_commit(&f->st, pg);
	assert_int_equal(pg->state, PAGE_READY);
	assert_int_equal(f->st.st.pages, 1);
	assert_int_equal(f->st.st.bytes_used, 102400);
	assert_int_equal(f->st.ns_pages[1], 1);
	/* Slots are 4 KiB aligned and inside the arena. */
	assert_int_equal(KVB_LOC_OFF(store_loc(&f->st, pg)) % 4096, 0);
	store_drop(&f->st, pg);
	assert_null(store_find(&f->st, 1, &k));
	assert_int_equal(f->st.st.pages, 0);
	assert_int_equal(f->st.st.slabs_free, 8); /* the emptied slab went back */
}

static void test_store_lru_evicts_coldest(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024); /* 4 per slab, 32 in the pool */
	kvb_key k;

	for (uint32_t i = 0; i < 32; i++)
		assert_non_null(put(&f->st, cls, 1, i));
	/* Touch page 0 so page 1 is the coldest. */
	k = key_of(0);
	store_touch(&f->st, store_find(&f->st, 1, &k));
	assert_non_null(put(&f->st, cls, 1, 100));
	assert_int_equal(f->st.st.evictions, 1);
	k = key_of(1);
	assert_null(store_find(&f->st, 1, &k));
	k = key_of(0);
	assert_non_null(store_find(&f->st, 1, &k));
	/* Keep writing: the newest 32 are always present. */
	for (uint32_t i = 200; i < 300; i++)
		assert_non_null(put(&f->st, cls, 1, i));
	for (uint32_t i = 268; i < 300; i++) {
		k = key_of(i);
		assert_non_null(store_find(&f->st, 1, &k));
	}
	assert_int_equal(f->st.st.pages, 32);
}

static void test_store_pins_block_eviction(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, MiB); /* one per slab: 8 */
	struct page *pgs[8], *pg;
	kvb_key k = key_of(999);

	for (uint32_t i = 0; i < 8; i++) {
		pgs[i] = put(&f->st, cls, 1, i);
		assert_non_null(pgs[i]);
		store_pin(&f->st, pgs[i]);
	}
	/* Everything leased: -ENOSPC at once, nothing lost. */
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &pg), -ENOSPC);
	assert_int_equal(f->st.st.pages, 8);
	assert_int_equal(f->st.st.evictions, 0);
	/* Unpin page 5: it is the only victim. */
	store_unpin(&f->st, pgs[5]);
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &pg), 0);
	store_commit(&f->st, pg);
	k = key_of(5);
	assert_null(store_find(&f->st, 1, &k));
	for (uint32_t i = 0; i < 8; i++)
		if (i != 5)
			store_unpin(&f->st, pgs[i]);
	assert_int_equal(f->st.st.pinned, 0);
}

static void test_store_drop_pinned_and_generation(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 64 * 1024);
	struct page *pg = put(&f->st, cls, 3, 1), *again;
	uint64_t lease = store_lease_id(pg);
	kvb_key k = key_of(1);

	store_pin(&f->st, pg); /* a client holds a lease */
	store_drop(&f->st, pg);
	/* Gone from the index at once, but the slot stays until the lease is released. */
	assert_null(store_find(&f->st, 3, &k));
	assert_int_equal(f->st.st.pages, 1);
	assert_ptr_equal(store_by_id(&f->st, (uint32_t)lease), pg);
	/* A new PUT of the same key gets a fresh slot. */
	again = put(&f->st, cls, 3, 1);
	assert_non_null(again);
	assert_ptr_not_equal(again, pg);
	store_unpin(&f->st, pg);
	assert_int_equal(f->st.st.pages, 1);
	/* The freed slot's generation moved on: the old lease id no longer matches. */
	assert_int_not_equal(store_lease_id(pg), lease);
	assert_null(store_by_id(&f->st, 0xfffff000u)); /* slab out of range */
}

/*
 * [packing] A store filled with pages of one size holds exactly what plan_pool_pages (kvbctl
 * plan) says, and at least 98% of floor(pool / page), for page sizes from 4 KiB to 16 MiB and
 * pools from 64 MiB up. The arenas have no memory behind them: nothing here writes a page.
 */
static void fill_one_size(uint64_t pool_bytes, uint32_t narenas, uint64_t page)
{
	static struct pool p;
	static struct store s;
	uint64_t slab = plan_default_slab(pool_bytes), per = pool_bytes / narenas, n = 0;
	uint64_t slot = (page + 4095) / 4096 * 4096, want;
	int cls;

	memset(&p, 0, sizeof(p));
	for (uint32_t a = 0; a < narenas; a++)
		p.arena[a] = (struct pool_arena){.fd = -1, .size = per};
	p.narenas = narenas;
	p.part[0] = (struct pool_part){0, narenas, per * narenas};
	p.nparts = 1;
	assert_int_equal(store_init(&s, &p, slab, 1.0, 1.0), 0);
	cls = store_class_get(&s, page);
	assert_true(cls >= 0);
	for (;;) {
		kvb_key k = key_of((uint32_t)n);
		struct page *pg;

		k.b[8] = (uint8_t)(n >> 32);
		if (store_alloc(&s, cls, 1, &k, &pg))
			break;
		store_commit(&s, pg);
		if (s.st.evictions)
			break;
		n++;
	}
	want = 0;
	for (uint32_t a = 0; a < narenas; a++)
		want += plan_arena_pages(per, slab, slot);
	if (n != want || n * 100 < pool_bytes / slot * 98)
		fail_msg("pool %llu MiB x%u, page %llu: held %llu, plan %llu, ideal %llu",
			 (unsigned long long)(pool_bytes >> 20), narenas, (unsigned long long)page,
			 (unsigned long long)n, (unsigned long long)want,
			 (unsigned long long)(pool_bytes / slot));
	store_fini(&s);
}

static void test_store_packs_every_page_size(void **state)
{
	static const uint64_t pages[] = {4096,	   16384,    100000,	1u << 20, 4497408,
					 5u << 20, 7u << 20, 11u << 20, 16u << 20};
	static const uint64_t pools[] = {64 * MiB, 66 * MiB, 100 * MiB, 1024 * MiB, 3000 * MiB};

	(void)state;
	for (size_t i = 0; i < sizeof(pools) / sizeof(pools[0]); i++)
		for (size_t j = 0; j < sizeof(pages) / sizeof(pages[0]); j++)
			if (pools[i] / pages[j] <= 200000) /* keep it fast */
				fill_one_size(pools[i], 1, pages[j]);
	fill_one_size(512 * MiB, 2, 4497408);
	fill_one_size(300ull << 30, 1, 4497408);
}

static void test_store_classes_share_slabs(void **state)
{
	struct fx *f = *state;
	int big = store_class_get(&f->st, MiB), small = store_class_get(&f->st, 64 * 1024);
	kvb_key k;

	/* Fill the pool with big pages, then ask for small ones: big slabs are reclaimed. */
	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(put(&f->st, big, 1, i));
	assert_int_equal(f->st.st.slabs_free, 0);
	for (uint32_t i = 0; i < 64; i++)
		assert_non_null(put(&f->st, small, 2, 1000 + i));
	assert_int_equal(f->st.cls[small].slabs, 4);
	assert_int_equal(f->st.cls[big].slabs, 4);
	/* The oldest big pages went first. */
	for (uint32_t i = 0; i < 4; i++) {
		k = key_of(i);
		assert_null(store_find(&f->st, 1, &k));
	}
	for (uint32_t i = 4; i < 8; i++) {
		k = key_of(i);
		assert_non_null(store_find(&f->st, 1, &k));
	}
	assert_int_equal(f->st.st.bytes_used, 4 * MiB + 64 * 65536);
}

/* Regression: a pool full of small pages must still take a big page (a whole slab moves). */
static void test_store_big_page_reclaims_a_slab(void **state)
{
	struct fx *f = *state;
	int small = store_class_get(&f->st, 64 * 1024), big = store_class_get(&f->st, MiB);
	kvb_key k;

	for (uint32_t i = 0; i < 128; i++) /* 16 per slab: the whole pool */
		assert_non_null(put(&f->st, small, 1, i));
	assert_int_equal(f->st.st.slabs_free, 0);
	assert_non_null(put(&f->st, big, 2, 5000));
	/* The slab of the coldest page (pages 0..15) went, and nothing else. */
	assert_int_equal(f->st.st.evictions, 16);
	for (uint32_t i = 0; i < 128; i++) {
		k = key_of(i);
		if (i < 16)
			assert_null(store_find(&f->st, 1, &k));
		else
			assert_non_null(store_find(&f->st, 1, &k));
	}
}

/* Regression: lease ids must not repeat when a slab is freed and handed out again. */
static void test_store_generation_survives_slab_reuse(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, MiB);
	struct page *a = put(&f->st, cls, 1, 1), *b;
	uint64_t la = store_lease_id(a);

	for (uint32_t i = 2; i <= 8; i++) /* the other seven slabs */
		assert_non_null(put(&f->st, cls, 1, 100 + i));
	store_drop(&f->st, a);	    /* its slab is freed, the only free one */
	b = put(&f->st, cls, 1, 2); /* and reused, same slot id */
	assert_int_equal((uint32_t)store_lease_id(b), (uint32_t)la);
	assert_int_not_equal(store_lease_id(b), la);
}

static void test_store_watermark(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);

	f->st.high_bytes = 6 * MiB;
	f->st.low_bytes = 4 * MiB;
	for (uint32_t i = 0; i < 28; i++) /* 7 MiB */
		assert_non_null(put(&f->st, cls, 1, i));
	assert_int_equal(store_evict_watermark(&f->st, 2), 2); /* bounded per call */
	while (store_evict_watermark(&f->st, 100))
		;
	assert_int_equal(f->st.st.bytes_used, 4 * MiB);
	assert_int_equal(store_evict_watermark(&f->st, 100), 0);
}

/*
 * A client's fd is read-only and the memfd sealed: write, ftruncate, a writable shared mapping
 * and mprotect to PROT_WRITE all fail, while the broker's own mapping (made before the seal)
 * stays writable.
 */
static void test_pool_client_fd_sealed_read_only(void **state)
{
	struct fx *f = *state;
	int fd = pool_ro_fd(&f->pool, 0);
	void *p;

	assert_true(fd >= 0);
	assert_int_equal(write(fd, "x", 1), -1);
	assert_int_equal(ftruncate(fd, 0), -1);
	assert_true(mmap(NULL, 4096, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) == MAP_FAILED);
	p = mmap(NULL, 4096, PROT_READ, MAP_SHARED, fd, 0);
	assert_true(p != MAP_FAILED);
	assert_int_equal(mprotect(p, 4096, PROT_READ | PROT_WRITE), -1);
	/* Even the broker's read-write fd cannot write or resize any more. */
	assert_int_equal(write(f->pool.arena[0].fd, "x", 1), -1);
	assert_int_equal(ftruncate(f->pool.arena[0].fd, 0), -1);
	memset(f->pool.arena[0].base, 0xab, 4096);
	assert_int_equal(((uint8_t *)p)[4095], 0xab);
	munmap(p, 4096);
	close(fd);
}

/* [tier-seam] A stand-in for tier.c: answers evict() with demote_answer, counts the calls. */
static int demote_answer, demote_calls;

static int fake_demote(void *arg, struct page *pg)
{
	(void)arg;
	(void)pg;
	demote_calls++;
	return demote_answer;
}

static void test_store_demote_seam(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, MiB); /* one page per 1 MiB slab: 8 fit */
	struct page *pg[8], *p;
	kvb_key k = key_of(100);

	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(pg[i] = put(&f->st, cls, 1, i));
	f->st.demote = fake_demote;

	/* A busy tier: nothing leaves, the allocation waits (-ENOSPC), nothing is dropped. */
	demote_answer = -EBUSY;
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &p), -ENOSPC);
	assert_true(demote_calls >= 1);
	assert_int_equal(f->st.st.pages, 8);

	/* Demotion: the pages stay READY and findable, pinned, until their writes are done. */
	demote_answer = 1;
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &p), -ENOSPC);
	for (uint32_t i = 0; i < 8; i++) {
		kvb_key ki = key_of(i);

		assert_ptr_equal(store_find(&f->st, 1, &ki), pg[i]);
		assert_int_equal(pg[i]->state, PAGE_READY);
		assert_int_equal(pg[i]->demoting, 1);
	}
	assert_int_equal(f->st.demoting_bytes, 8 * MiB);
	assert_int_equal(f->st.st.evictions, 0);

	/* Written: the RAM goes, and the waiting allocation succeeds. */
	store_demote_done(&f->st, pg[0], 1);
	assert_int_equal(f->st.st.pages, 7);
	assert_int_equal(store_alloc(&f->st, cls, 1, &k, &p), 0);
	store_commit(&f->st, p);

	/* Leased while written: it stays, clean. */
	store_pin(&f->st, pg[1]);
	store_demote_done(&f->st, pg[1], 1);
	assert_int_equal(pg[1]->clean, 1);
	assert_int_equal(pg[1]->state, PAGE_READY);
	store_unpin(&f->st, pg[1]);

	/* A failed write: it stays, dirty, at the cold end of the LRU. */
	store_demote_done(&f->st, pg[2], 0);
	assert_int_equal(pg[2]->clean, 0);
	assert_ptr_equal(list_entry(f->st.part[0].lru.prev, struct page, lru), pg[2]);
	for (int i = 3; i < 8; i++)
		store_demote_done(&f->st, pg[i], 1);
	assert_int_equal(f->st.demoting_bytes, 0);
	assert_int_equal(f->st.st.pages, 3); /* pg[1], pg[2] and the new page */

	/* A failed tier (0: drop). A clean page goes without asking it; dirty ones are dropped. */
	demote_answer = 0;
	demote_calls = 0;
	f->st.high_bytes = f->st.low_bytes = 0;
	assert_int_equal(store_evict_watermark(&f->st, 100), 3);
	assert_int_equal(demote_calls, 2);
	assert_int_equal(f->st.st.pages, 0);
	f->st.demote = NULL;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_store_alloc_find_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_lru_evicts_coldest, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_pins_block_eviction, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_drop_pinned_and_generation, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_classes_share_slabs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_big_page_reclaims_a_slab, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_generation_survives_slab_reuse, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_watermark, setup, teardown),
		cmocka_unit_test(test_store_packs_every_page_size),
		cmocka_unit_test_setup_teardown(test_pool_client_fd_sealed_read_only, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_demote_seam, setup, teardown),
	};

	return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
