// SPDX-License-Identifier: MIT
/*
 * test_store.c - the page store over a real shared-memory pool: slot allocation and reuse,
 * size classes sharing slabs, LRU eviction order, pins and leases blocking eviction, delete of
 * a pinned page, lease-id generations, watermark eviction, the pool's seals, and the disk
 * tier's seam in evict() (demotion, clean pages, a busy or failed tier); the chain bookkeeping
 * [chain] (parents outlive their kids: chains leave RAM tail first, LRU among leaves, held
 * parents coming back on a touch or when their last kid goes, links that survive nothing they
 * should not (DELETE, abort, a freed parent's reused slot), no cycles whatever keys name, a
 * parent gaining a kid while demoted stays, slab reclaim across page sizes walking chains) and
 * namespace caps [ns-limit] (a capped namespace evicts only its own pages); a partition
 * emptied and given a new file [tenant-rebind].
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
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

/* A pool of `slabs` slabs of 1 MiB, watermarks out of the way unless a test sets them. */
static int setup_slabs(void **state, uint64_t slabs)
{
	static struct fx f;

	memset(&f, 0, sizeof(f));
	snprintf(f.name, sizeof(f.name), "/kvb-test-store-%d", (int)getpid());
	if (pool_open(&f.pool, f.name, slabs * MiB, 1))
		return -1;
	if (store_init(&f.st, &f.pool, MiB, 1.0, 1.0))
		return -1;
	*state = &f;
	return 0;
}

static int setup(void **state)
{
	return setup_slabs(state, 8);
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
	/* [evict-prefetch] names the page the next eviction takes, and changes nothing. */
	store_prefetch_victims(&f->st);
	k = key_of(1);
	assert_ptr_equal(f->st.part[0].warmed, store_find(&f->st, 1, &k));
	assert_int_equal(f->st.st.pages, 32);
	assert_int_equal(f->st.st.evictions, 0);
	assert_non_null(put(&f->st, cls, 1, 100));
	assert_int_equal(f->st.st.evictions, 1);
	k = key_of(1);
	assert_null(store_find(&f->st, 1, &k));
	store_prefetch_victims(&f->st);
	k = key_of(2);
	assert_ptr_equal(f->st.part[0].warmed, store_find(&f->st, 1, &k));
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
	p.part[0] = (struct pool_part){0, narenas, per * narenas, per * narenas};
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

/*
 * [tenant-rebind] A sparse pool of two 16 MiB partitions (directory on, kept: a side table):
 * partition 1 is emptied (nothing while a page of it is pinned, everything once unpinned;
 * partition 0 untouched), then its arena gets a new file: a client's map of the old one reads
 * zeros and never the bytes written after, the broker's base is the new file's, sealed and 0400,
 * its memory starts at the directory, and the store carves and serves pages in it again;
 * slabs registered for GPU copies [slab-pin] are all unregistered before the file is swapped.
 */
/* [slab-pin] A stand-in GPU engine: bytes registered in [lo, hi), the partition watched. */
static struct {
	const uint8_t *lo, *hi;
	uint64_t bytes;
} reg;

static int count_pin(void *arg, void *base, uint64_t len)
{
	(void)arg;
	if ((const uint8_t *)base >= reg.lo && (const uint8_t *)base < reg.hi)
		reg.bytes += len;
	return 0;
}

static void count_unpin(void *arg, void *base, uint64_t len)
{
	(void)arg;
	if ((const uint8_t *)base >= reg.lo && (const uint8_t *)base < reg.hi)
		reg.bytes -= len;
}

static void test_store_part_rebind(void **state)
{
	struct pool_cfg pc = {.name = "kvb-test-rebind",
			      .size = 16 * MiB,
			      .numa = "off",
			      .hugepage = HP_MODE_OFF,
			      .nparts = 2,
			      .part_size = {16 * MiB, 16 * MiB},
			      .part_share = {8 * MiB, 8 * MiB},
			      .keep = 1,
			      .slab_bytes = MiB,
			      .dir = 1,
			      .sparse = 1};
	static struct pool p;
	static struct store s;
	struct page *pg[8], *pinned;
	uint8_t *old_map, *base;
	int cls, ro, fd;
	uint64_t nz = 0;
	struct stat st;

	(void)state;
	assert_int_equal(pool_create(&p, &pc), 0);
	assert_int_equal(store_init(&s, &p, MiB, 1.0, 1.0), 0);
	reg.lo = p.arena[1].base;
	reg.hi = reg.lo + p.arena[1].size;
	reg.bytes = 0;
	assert_int_equal(store_pin_hooks(&s, count_pin, count_unpin, NULL), 0);
	cls = store_class_get(&s, 64 * 1024);
	assert_true(cls >= 0);
	s.ns_part[1] = 1; /* namespace 0 in partition 0, namespace 1 in partition 1 */
	for (uint32_t i = 0; i < 8; i++) {
		pg[i] = put(&s, cls, i % 2, 100 + i);
		assert_non_null(pg[i]);
		assert_int_equal(store_part_of(&s, pg[i]), i % 2);
	}
	base = p.arena[p.part[1].first].base;
	ro = pool_ro_fd(&p, p.part[1].first);
	assert_true(ro >= 0);
	old_map = mmap(NULL, p.arena[1].size, PROT_READ, MAP_SHARED, ro, 0);
	assert_true(old_map != MAP_FAILED);
	assert_int_equal(old_map[(uint8_t *)store_addr(&s, pg[1]) - base], 101);
	assert_true(reg.bytes > 0);
	assert_int_equal(reg.bytes, s.part[1].resident);
	pinned = pg[3];
	store_pin(&s, pinned);
	assert_int_equal(store_part_clear(&s, 1), -EBUSY);
	for (uint32_t i = 0; i < 8; i++) { /* nothing dropped */
		kvb_key k = key_of(100 + i);

		assert_ptr_equal(store_find(&s, i % 2, &k), pg[i]);
	}
	store_unpin(&s, pinned);
	assert_int_equal(store_part_clear(&s, 1), 0);
	for (uint32_t i = 0; i < 8; i++) {
		kvb_key k = key_of(100 + i);

		if (i % 2)
			assert_null(store_find(&s, 1, &k));
		else
			assert_ptr_equal(store_find(&s, 0, &k), pg[i]);
	}
	assert_int_equal(s.part[1].resident, 0);
	assert_int_equal(reg.bytes, 0); /* no GPU registration left under the file to swap */
	assert_int_equal(s.part[1].pages, 0);
	assert_int_equal(s.part[0].pages, 4);

	assert_int_equal(pool_arena_fresh(&p, p.part[1].first, &fd), 0);
	assert_int_equal(fstat(fd, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0400);
	assert_int_equal((uint64_t)st.st_size, p.arena[1].size);
	assert_int_equal(fcntl(fd, F_GET_SEALS), F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL);
	assert_int_equal(pool_arena_switch(&p, p.part[1].first, fd), 0);
	assert_int_equal(p.arena[1].fd, fd);
	assert_ptr_equal(p.arena[1].base, base);
	store_part_dir_reset(&s, 1);
	assert_int_equal(fstat(ro, &st), 0);
	assert_int_equal(st.st_blocks, 0); /* the old file emptied whole */
	for (uint32_t i = 1; i < 8; i += 2) {
		pg[i] = put(&s, cls, 1, 200 + i);
		assert_non_null(pg[i]);
		assert_int_equal(store_part_of(&s, pg[i]), 1);
		assert_int_equal(*(uint8_t *)store_addr(&s, pg[i]), (200 + i) & 0xff);
	}
	for (uint64_t j = 0; j < p.arena[1].size; j++)
		nz += old_map[j] != 0;
	assert_int_equal(nz, 0); /* the old map: zeros, never the new file's bytes */
	assert_true(s.part[1].resident > 0);
	assert_int_equal(reg.bytes, s.part[1].resident); /* the new slabs registered */
	assert_int_equal(store_arena_rss(&s, 1), s.ar[1].resident + p.arena[1].dir_bytes);
	munmap(old_map, p.arena[1].size);
	close(ro);
	store_fini(&s);
	pool_close(&p);
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

/* ---- [chain] chains evicted tail first, and [ns-limit] namespace caps ---- */

/* PUT of key i in ns, child of key parent (UINT32_MAX: none), committed. */
static struct page *cput(struct store *s, int cls, uint32_t ns, uint32_t i, uint32_t parent)
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
		assert_non_null(cput(s, cls, ns, c * 100 + j, j ? c * 100 + j - 1 : UINT32_MAX));
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
		assert_non_null(cput(&f->st, cls, 1, 1000 + i, UINT32_MAX));
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
		assert_non_null(cput(&f->st, cls, 1, 1000 + i, UINT32_MAX));
	assert_true(stored(&f->st, 1, 7));    /* chain 0 whole */
	assert_false(stored(&f->st, 1, 100)); /* chain 1 went, tail first */
	for (uint32_t c = 0; c < 4; c++)
		assert_whole(&f->st, 1, c, 8);
	/* Held parents come back at a touch: chain 2's head touched, its tail is still a leaf. */
	k = key_of(200);
	store_touch(&f->st, store_find(&f->st, 1, &k));
	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(cput(&f->st, cls, 1, 2000 + i, UINT32_MAX));
	for (uint32_t c = 0; c < 4; c++)
		assert_whole(&f->st, 1, c, 8);
	/* 207..201 went tail first; 200, touched, stayed; then chain 3's tail. */
	assert_true(stored(&f->st, 1, 200) && !stored(&f->st, 1, 201));
	assert_true(stored(&f->st, 1, 306) && !stored(&f->st, 1, 307));
}

/* [evict-prefetch] The page warmed for the next eviction is the one coldest() takes: the first
 * leaf from the cold end, not a held parent. */
static void test_chain_prefetch_warms_the_leaf(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);
	kvb_key k = key_of(2);
	struct page *leaf;

	put_chain(&f->st, cls, 1, 0, 3); /* the LRU from its cold end: 0 and 1 (parents), 2 */
	leaf = store_find(&f->st, 1, &k);
	store_prefetch_victims(&f->st);
	assert_ptr_equal(f->st.part[0].warmed, leaf);
	/* What the pool evicts when full is that page. */
	for (uint32_t i = 0; i < 29; i++)
		assert_non_null(cput(&f->st, cls, 1, 1000 + i, UINT32_MAX));
	assert_true(stored(&f->st, 1, 2));
	assert_non_null(cput(&f->st, cls, 1, 2000, UINT32_MAX));
	assert_false(stored(&f->st, 1, 2));
}

/*
 * [evict-ahead] Once a PUT had to evict, the idle loop frees the next slot: the page LRU order
 * would take next, and only that one, so the next PUT evicts nothing itself. Not in a pool of
 * fewer than 1,024 pages, and not while a free slot waits.
 */
static void test_evict_ahead(void **state)
{
	struct fx *f = *state;
	int small = store_class_get(&f->st, 4096), big = store_class_get(&f->st, 64 * 1024);

	/* 128 pages of 64 KiB fill the pool: too few to keep one free. */
	for (uint32_t i = 0; i < 129; i++)
		assert_non_null(put(&f->st, big, 1, i));
	assert_int_equal(f->st.st.evictions, 1);
	store_evict_ahead(&f->st);
	assert_int_equal(f->st.st.evictions, 1);
	assert_true(stored(&f->st, 1, 1));
	for (uint32_t i = 1; i < 129; i++) {
		kvb_key k = key_of(i);

		store_drop(&f->st, store_find(&f->st, 1, &k));
	}
	/* 2,048 of 4 KiB: nothing goes ahead before a PUT evicted. */
	for (uint32_t i = 0; i < 2048; i++)
		assert_non_null(put(&f->st, small, 2, i));
	store_evict_ahead(&f->st);
	assert_int_equal(f->st.st.evictions, 1);
	assert_non_null(put(&f->st, small, 2, 10000)); /* evicts 0 */
	assert_int_equal(f->st.st.evictions, 2);
	assert_false(stored(&f->st, 2, 0));
	store_evict_ahead(&f->st); /* 1, the next coldest */
	assert_int_equal(f->st.st.evictions, 3);
	assert_false(stored(&f->st, 2, 1));
	assert_true(stored(&f->st, 2, 2));
	store_evict_ahead(&f->st); /* a slot is free: nothing more */
	assert_int_equal(f->st.st.evictions, 3);
	assert_non_null(put(&f->st, small, 2, 10001)); /* takes it */
	assert_int_equal(f->st.st.evictions, 3);
	assert_true(stored(&f->st, 2, 2));
	store_evict_ahead(&f->st);
	assert_int_equal(f->st.st.evictions, 4);
	assert_false(stored(&f->st, 2, 2));
	assert_int_equal(f->st.st.pages, 2047);
}

/* ... looked for PREFETCH_DEPTH pages deep: past that many parents, nothing is warmed. */
static void test_chain_prefetch_depth(void **state)
{
	struct fx *f = *state;

	put_chain(&f->st, store_class_get(&f->st, 256 * 1024), 1, 0, 6);
	store_prefetch_victims(&f->st);
	assert_null(f->st.part[0].warmed);
}

static void test_chain_delete_abort_and_reuse(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);
	struct page *p, *kid, *w;
	kvb_key k = key_of(1), pk = key_of(0);

	p = cput(&f->st, cls, 1, 0, UINT32_MAX);
	kid = cput(&f->st, cls, 1, 1, 0);
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
	kid = cput(&f->st, cls, 1, 1, 0);
	store_drop(&f->st, p);
	assert_null(store_parent(&f->st, kid));
	w = cput(&f->st, cls, 1, 50, UINT32_MAX);
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
	struct page *a = cput(&f->st, cls, 1, 0, UINT32_MAX);
	struct page *b = cput(&f->st, cls, 1, 1, 0);
	kvb_key kb = key_of(1);

	/* a naming b (a dedup PUT of a with parent b) would close a cycle: refused. */
	assert_int_equal(store_link_parent(&f->st, a, &kb), 0);
	assert_int_equal(a->kids, 1);
	assert_int_equal(b->kids, 0);
	/* Everything evicts: 32 new pages take every slot. */
	for (uint32_t i = 0; i < 32; i++)
		assert_non_null(cput(&f->st, cls, 1, 100 + i, UINT32_MAX));
	assert_false(stored(&f->st, 1, 0) || stored(&f->st, 1, 1));
}

/* The disk tier's seam: every page "demoted" at once, completed by hand. */
static struct page *demoted[64];
static uint32_t ndemoted;

static int chain_demote(void *arg, struct page *pg)
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
	f->st.demote = chain_demote;
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
	assert_non_null(cput(&f->st, cls, 1, 7, 6));
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
		pg = cput(&f->st, big, 2, 900 + i, UINT32_MAX);
		assert_non_null(pg);
		assert_whole(&f->st, 1, 0, 16);
		assert_whole(&f->st, 1, 1, 16);
	}
	assert_false(stored(&f->st, 1, 0));
	assert_true(stored(&f->st, 1, 100));
	assert_int_equal(f->st.st.chain_cuts, 0);
	/* Everything to big pages: still no cut, every small page evicted leaves first. */
	for (uint32_t i = 4; i < 8; i++)
		assert_non_null(cput(&f->st, big, 2, 900 + i, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[1], 0);
	assert_int_equal(f->st.st.chain_cuts, 0);
}

/* 16 slabs: more than RECLAIM_TRIES hold leaves, so that a PUT gets to cut a chain. */
static int setup16(void **state)
{
	return setup_slabs(state, 16);
}

static struct page *reader_holds; /* the page a client reads under its hazard table */

/* store.leaving: that page is pinned for its reader as it is about to leave (session.c). */
static void pin_if_read(void *arg, struct page *pg)
{
	if (pg == reader_holds)
		store_pin(arg, pg);
}

/*
 * A chain cut for a page of another size counts the parents that left with kids in RAM: not a
 * page a hazard reader kept (evict() EVICT_KEPT), which neither left nor was cut.
 */
static void test_chain_cut_counts_pages_gone(void **state)
{
	struct fx *f = *state;
	int small = store_class_get(&f->st, 256 * 1024), big = store_class_get(&f->st, MiB);
	struct page *pg;
	kvb_key k;

	/* Slab j: pages 2j and 2j + 1 of one chain, then two pages of their own. */
	for (uint32_t j = 0; j < 16; j++) {
		assert_non_null(cput(&f->st, small, 1, 2 * j, j ? 2 * j - 1 : UINT32_MAX));
		assert_non_null(cput(&f->st, small, 1, 2 * j + 1, 2 * j));
		assert_non_null(cput(&f->st, small, 1, 1000 + 2 * j, UINT32_MAX));
		assert_non_null(cput(&f->st, small, 1, 1001 + 2 * j, UINT32_MAX));
	}
	/* The tail leased: no slab empties leaf by leaf. */
	k = key_of(31);
	store_pin(&f->st, store_find(&f->st, 1, &k));
	k = key_of(17);
	reader_holds = store_find(&f->st, 1, &k);
	f->st.leaving = pin_if_read;
	f->st.leaving_arg = &f->st;
	/*
	 * Slabs 0-7 lose their own pages (RECLAIM_TRIES), then slab 8 is cut: page 17 stays for
	 * its reader, page 16 goes with its kid 17 still in RAM. One cut, and no room.
	 */
	k = key_of(5000);
	assert_int_equal(store_alloc(&f->st, big, 2, &k, &pg), -ENOSPC);
	assert_true(stored(&f->st, 1, 17));
	assert_false(stored(&f->st, 1, 16));
	assert_true(stored(&f->st, 1, 15));
	assert_int_equal(f->st.st.chain_cuts, 1);
	f->st.leaving = NULL;
}

static void test_ns_limit_evicts_own_pages(void **state)
{
	struct fx *f = *state;
	int cls = store_class_get(&f->st, 256 * 1024);

	store_ns_limit(&f->st, 2, MiB); /* namespace 2: at most 4 pages */
	for (uint32_t i = 0; i < 8; i++)
		assert_non_null(cput(&f->st, cls, 1, i, UINT32_MAX));
	put_chain(&f->st, cls, 2, 1, 4);
	assert_int_equal(f->st.ns_pages[2], 4);
	assert_int_equal(f->st.ns_bytes[2], MiB);
	/* Its next page evicts one of its own (its chain's tail: it is the only leaf)... */
	assert_non_null(cput(&f->st, cls, 2, 50, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[2], 4);
	assert_int_equal(f->st.ns_pages[1], 8);
	assert_int_equal(f->st.st.ns_evictions, 1);
	assert_false(stored(&f->st, 2, 103));
	assert_whole(&f->st, 2, 1, 4);
	/* ... while namespace 1, uncapped, keeps growing into the rest of the pool. */
	for (uint32_t i = 8; i < 28; i++)
		assert_non_null(cput(&f->st, cls, 1, i, UINT32_MAX));
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
	assert_null(cput(&f->st, cls, 2, 60, UINT32_MAX));
	assert_int_equal(f->st.ns_pages[1], 28);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_store_alloc_find_commit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_lru_evicts_coldest, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_pins_block_eviction, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_cut_counts_pages_gone, setup16,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_drop_pinned_and_generation, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_classes_share_slabs, setup, teardown),
		cmocka_unit_test_setup_teardown(test_store_big_page_reclaims_a_slab, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_generation_survives_slab_reuse, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_watermark, setup, teardown),
		cmocka_unit_test(test_store_packs_every_page_size),
		cmocka_unit_test(test_store_part_rebind),
		cmocka_unit_test_setup_teardown(test_pool_client_fd_sealed_read_only, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_store_demote_seam, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_evicts_tail_first, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_lru_among_leaves, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_prefetch_warms_the_leaf, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_chain_prefetch_depth, setup, teardown),
		cmocka_unit_test_setup_teardown(test_evict_ahead, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_delete_abort_and_reuse, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_never_cycles, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_demotion, setup, teardown),
		cmocka_unit_test_setup_teardown(test_chain_reclaim_across_classes, setup, teardown),
		cmocka_unit_test_setup_teardown(test_ns_limit_evicts_own_pages, setup, teardown),
	};

	return cmocka_run_group_tests_name("store", tests, NULL, NULL);
}
