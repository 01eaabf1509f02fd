// SPDX-License-Identifier: MIT
/*
 * store.c - slab allocator, page records and eviction.
 *
 * Memory: every arena is cut into slabs of slab_bytes. A slab is free or belongs to one size
 * class (a page size rounded up to 4 KiB, so slots stay O_DIRECT-aligned for the disk tier) and
 * is cut into that class's slots. Several models with different page sizes share the pool; a
 * slab whose last page goes away returns to the free list, which is how memory moves between
 * classes under pressure (memcached's slab rebalancing, done eagerly).
 *
 * Page states:
 *
 *     FREE --store_alloc--> WRITING --store_commit--> READY --store_drop/evict--> FREE
 *                              |                        ^  |
 *                              +--store_abort--> FREE   |  +--pin--> (pinned READY) --unpin--+
 *
 * A page is evictable iff it is READY, unpinned and still indexed; exactly those pages are on
 * the global LRU and on their class's LRU (coldest at the tail). Pinned pages (leases, copies in
 * flight) are off the lists, so finding a victim never scans them and "every page leased" is an
 * empty LRU: -ENOSPC at once. A dropped page that is still pinned leaves the index at once (a
 * new PUT of the key gets a fresh slot) and its slot is freed at the last unpin.
 *
 * Victim choice (store_alloc_pref): a free slot of the class, else a free slab, in each arena in
 * the client's order of preference (nearest NUMA node first; free and partial slabs are kept
 * per arena), else the globally coldest evictable page decides. If it is of our class it goes
 * and hands us its slot. If it belongs to another class, its whole slab is reclaimed: every
 * evictable page in it goes, and the slab, once empty, changes class (memcached's slab
 * reassignment). A slab that still holds pinned pages cannot be emptied; after RECLAIM_TRIES
 * such slabs the coldest page of our own class goes instead. So a single class is exact LRU,
 * and memory moves between page sizes in LRU order of slabs, with bounded work per allocation
 * (RECLAIM_TRIES slabs).
 *
 * With a disk tier [tier-seam], evict() frees a "clean" page (its copy on disk is complete) at
 * once and hands any other to the tier (tier.c), which writes it while it stays READY and
 * pinned, and frees it through store_demote_done(). An allocation that found no slot then
 * returns -ENOSPC with demotions in flight, and its op waits for them (tier_park_alloc).
 *
 * Whoever waits for a page's next state (a PUT of a key being written or promoted) is woken
 * at every change: commit, abort, demotion done, free ([page-wake], store.h).
 *
 * Generations make lease ids capabilities: (gen << 32 | id), with gen drawn from a store-wide
 * counter at each allocation and cleared at free, never names a page other than the one leased,
 * even after its slab changed class.
 *
 * [pagehdr] With a kept pool (pool.c [keep]) every commit writes the slot's header into the
 * pool's side table (pagehdr.c: namespace, key, generation, crc32c of the slot) and every free
 * clears it, so that another broker can adopt the pool and rebuild this store from it
 * (store_adopt_page, adopt.c); a page being written has no header. Loop thread only.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "log.h"
#include "pagehdr.h"
#include "store.h"

static_assert(STORE_MAX_NS == PMETA_NS_MAX, "the side table holds every namespace");

#define RECLAIM_TRIES 8

static struct slab *slab_of(const struct store *s, const struct page *pg)
{
	return &s->slabs[pg->id >> STORE_SLOT_BITS];
}

static uint32_t slot_of(const struct page *pg)
{
	return pg->id & ((1u << STORE_SLOT_BITS) - 1);
}

int store_init(struct store *s, struct pool *p, uint64_t slab_bytes, double high, double low)
{
	uint32_t n = 0, k = 0;
	int err;

	memset(s, 0, sizeof(*s));
	if (slab_bytes < STORE_SLOT_ALIGN || slab_bytes % STORE_SLOT_ALIGN)
		return -EINVAL;
	s->pool = p;
	s->slab_bytes = slab_bytes;
	for (uint32_t a = 0; a < p->narenas; a++)
		n += (uint32_t)(p->arena[a].size / slab_bytes);
	if (!n || n >= (1u << (32 - STORE_SLOT_BITS)))
		return -EINVAL;
	s->slabs = calloc(n, sizeof(*s->slabs));
	if (!s->slabs)
		return -ENOMEM;
	for (uint32_t a = 0; a < KVB_MAX_ARENAS; a++)
		list_init(&s->free_slabs[a]);
	list_init(&s->lru);
	for (uint32_t a = 0; a < p->narenas; a++) {
		for (uint64_t off = 0; off + slab_bytes <= p->arena[a].size; off += slab_bytes) {
			struct slab *sl = &s->slabs[k++];

			sl->arena = a;
			sl->off = off;
			sl->cls = -1;
			list_init(&sl->link);
			list_add_tail(&s->free_slabs[a], &sl->link);
		}
	}
	s->nslabs = n;
	s->st.slabs_free = n;
	s->high_bytes = (uint64_t)(high * (double)((uint64_t)n * slab_bytes));
	s->low_bytes = (uint64_t)(low * (double)((uint64_t)n * slab_bytes));
	/* Sized for 64 KiB pages: the index rarely grows even with small pages. */
	err = index_init(&s->ix, (uint64_t)n * slab_bytes / 65536);
	if (err) {
		free(s->slabs);
		s->slabs = NULL;
	}
	return err;
}

void store_fini(struct store *s)
{
	for (uint32_t i = 0; i < s->nslabs; i++) {
		free(s->slabs[i].pages);
		free(s->slabs[i].free_stack);
	}
	free(s->slabs);
	index_fini(&s->ix);
	memset(s, 0, sizeof(*s));
}

int store_class_get(struct store *s, uint64_t page_bytes)
{
	uint64_t slot = (page_bytes + STORE_SLOT_ALIGN - 1) & ~(uint64_t)(STORE_SLOT_ALIGN - 1);

	if (!page_bytes || slot > s->slab_bytes)
		return -E2BIG;
	for (uint32_t i = 0; i < s->ncls; i++)
		if (s->cls[i].slot_bytes == slot)
			return (int)i;
	if (s->ncls == STORE_MAX_CLASSES)
		return -EMFILE;
	struct store_class *c = &s->cls[s->ncls];

	c->slot_bytes = slot;
	c->slots_per_slab = (uint32_t)(s->slab_bytes / slot);
	if (c->slots_per_slab >= (1u << STORE_SLOT_BITS))
		c->slots_per_slab = (1u << STORE_SLOT_BITS) - 1;
	for (uint32_t a = 0; a < KVB_MAX_ARENAS; a++)
		list_init(&c->partial[a]);
	list_init(&c->lru);
	return (int)s->ncls++;
}

/* Gives a free slab to class ci: its records and free-slot stack. */
static int slab_assign(struct store *s, struct slab *sl, int ci)
{
	struct store_class *c = &s->cls[ci];
	uint32_t sid = (uint32_t)(sl - s->slabs);

	sl->pages = calloc(c->slots_per_slab, sizeof(*sl->pages));
	sl->free_stack = malloc(c->slots_per_slab * sizeof(*sl->free_stack));
	if (!sl->pages || !sl->free_stack) {
		free(sl->pages);
		free(sl->free_stack);
		sl->pages = NULL;
		sl->free_stack = NULL;
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < c->slots_per_slab; i++) {
		struct page *pg = &sl->pages[i];

		pg->id = (sid << STORE_SLOT_BITS) | i;
		pg->cls = (uint16_t)ci;
		list_init(&pg->lru);
		list_init(&pg->clru);
		/* Pop order = ascending offsets: neighbours stay neighbours in memory. */
		sl->free_stack[c->slots_per_slab - 1 - i] = i;
	}
	sl->nslots = c->slots_per_slab;
	sl->nfree = c->slots_per_slab;
	sl->used = 0;
	sl->cls = ci;
	list_del(&sl->link);
	list_add_tail(&c->partial[sl->arena], &sl->link);
	c->slabs++;
	s->st.slabs_free--;
	return 0;
}

static void slab_release(struct store *s, struct slab *sl)
{
	s->cls[sl->cls].slabs--;
	free(sl->pages);
	free(sl->free_stack);
	sl->pages = NULL;
	sl->free_stack = NULL;
	sl->nslots = sl->nfree = sl->used = 0;
	sl->cls = -1;
	list_del(&sl->link);
	list_add_tail(&s->free_slabs[sl->arena], &sl->link);
	s->st.slabs_free++;
}

static void lru_unlink(struct page *pg)
{
	if (list_linked(&pg->lru)) {
		list_del(&pg->lru);
		list_del(&pg->clru);
	}
}

static void lru_link(struct store *s, struct page *pg)
{
	list_add_head(&s->lru, &pg->lru);
	list_add_head(&s->cls[pg->cls].lru, &pg->clru);
}

/* [page-wake] pg changed state: whoever waits on it runs again (store.h). */
static void page_changed(struct store *s, struct page *pg)
{
	if (pg->waiters && s->wake)
		s->wake(s->wake_arg, pg);
}

static struct pmeta_hdr *hdr_of(const struct store *s, const struct page *pg)
{
	return pmeta_hdr_at(s->pool->meta, pg->id >> STORE_SLOT_BITS, slot_of(pg), s->slab_bytes);
}

/* [pagehdr] The page's bytes are complete: vouch for them in the side table. */
static void hdr_seal(struct store *s, const struct page *pg)
{
	struct pmeta_hdr h = {.ns = (uint16_t)pg->ns,
			      .slot_bytes = (uint32_t)s->cls[pg->cls].slot_bytes,
			      .len = (uint32_t)s->cls[pg->cls].slot_bytes,
			      .gen = pg->gen,
			      .key = pg->key};

	if (!s->pool->meta || pg->ns >= STORE_MAX_NS)
		return;
	pmeta_hdr_seal(&h, store_addr(s, pg));
	*hdr_of(s, pg) = h;
}

/* Returns a slot to its slab; an emptied slab returns to the free list. */
static void slot_free(struct store *s, struct page *pg)
{
	struct slab *sl = slab_of(s, pg);
	struct store_class *c = &s->cls[sl->cls];

	/* [pagehdr] Before anyone can write the slot again: its old header must not vouch for
	 * the new bytes. */
	if (s->pool->meta)
		memset(hdr_of(s, pg), 0, sizeof(struct pmeta_hdr));
	page_changed(s, pg);
	lru_unlink(pg);
	s->st.bytes_used -= c->slot_bytes;
	s->st.pages--;
	if (pg->ns < STORE_MAX_NS)
		s->ns_pages[pg->ns]--;
	pg->state = PAGE_FREE;
	pg->unlinked = 0;
	pg->gen = 0;
	sl->free_stack[sl->nfree++] = slot_of(pg);
	sl->used--;
	if (sl->nfree == 1) /* was full: back on the partial list */
		list_add_tail(&c->partial[sl->arena], &sl->link);
	if (!sl->used)
		slab_release(s, sl);
}

/*
 * Evicts an evictable page (READY, unpinned, indexed): the one place pages leave RAM. With a
 * disk tier a page that has no copy on disk is demoted instead: it stays READY and pinned
 * until its write completed (store_demote_done). Returns 1 freed, 0 demotion started, -EBUSY
 * the tier cannot take it now (the page stays evictable).
 */
static int evict(struct store *s, struct page *pg)
{
	if (!pg->clean && s->demote) {
		int r = s->demote(s->demote_arg, pg);

		if (r < 0)
			return r;
		if (r > 0) {
			pg->demoting = 1;
			s->demoting_bytes += s->cls[pg->cls].slot_bytes;
			store_pin(s, pg);
			return 0;
		}
	}
	index_remove(&s->ix, &pg->ixn);
	s->st.evictions++;
	slot_free(s, pg);
	return 1;
}

/* Takes a free slot of class ci in arena a if one exists without evicting. */
static struct page *slot_take_in(struct store *s, int ci, uint32_t a)
{
	struct list *partial = &s->cls[ci].partial[a];
	struct slab *sl;
	struct page *pg;

	if (list_empty(partial)) {
		if (list_empty(&s->free_slabs[a]))
			return NULL;
		if (slab_assign(s, list_entry(s->free_slabs[a].next, struct slab, link), ci))
			return NULL;
	}
	sl = list_entry(partial->next, struct slab, link);
	pg = &sl->pages[sl->free_stack[--sl->nfree]];
	sl->used++;
	if (!sl->nfree)
		list_del(&sl->link);
	return pg;
}

/* A free slot of class ci in the first arena of the preference order that has one. */
static struct page *slot_take(struct store *s, int ci, const struct store_pref *pref)
{
	struct page *pg = NULL;
	uint32_t n = pref ? pref->n : s->pool->narenas;

	for (uint32_t i = 0; !pg && i < n; i++) {
		uint32_t a = pref ? pref->arena[i] : i;

		if (a < s->pool->narenas)
			pg = slot_take_in(s, ci, a);
	}
	return pg;
}

struct page *store_find(struct store *s, uint32_t ns, const kvb_key *key)
{
	struct ixnode *n = index_find(&s->ix, ns, key);

	return n ? list_entry(n, struct page, ixn) : NULL;
}

/* Evicts every evictable page of a slab; the slab is freed when nothing pinned remains. */
static void slab_reclaim(struct store *s, struct slab *sl)
{
	for (uint32_t i = 0; i < sl->nslots && sl->cls >= 0; i++)
		if (list_linked(&sl->pages[i].lru) && evict(s, &sl->pages[i]) < 0)
			break;
}

int store_alloc_pref(struct store *s, int ci, uint32_t ns, const kvb_key *key,
		     const struct store_pref *pref, struct page **out)
{
	struct store_class *c = &s->cls[ci];
	struct page *pg = slot_take(s, ci, pref);

	for (int tries = RECLAIM_TRIES; !pg && tries > 0 && !list_empty(&s->lru); tries--) {
		struct page *cold = list_entry(s->lru.prev, struct page, lru);

		if (cold->cls == ci) {
			if (evict(s, cold) < 0)
				break;
		} else {
			slab_reclaim(s, slab_of(s, cold));
		}
		pg = slot_take(s, ci, pref);
	}
	if (!pg && !list_empty(&c->lru)) {
		evict(s, list_entry(c->lru.prev, struct page, clru));
		pg = slot_take(s, ci, pref);
	}
	if (!pg)
		return -ENOSPC;
	pg->key = *key;
	pg->ns = ns;
	pg->gen = ++s->gen ? s->gen : ++s->gen; /* 0 is never a live generation */
	pg->state = PAGE_WRITING;
	pg->pins = 1;
	pg->unlinked = 0;
	pg->clean = 0;
	pg->demoting = 0;
	pg->rflags = 0;
	pg->waiters = NULL;
	index_insert(&s->ix, &pg->ixn);
	s->st.bytes_used += c->slot_bytes;
	s->st.pages++;
	s->st.pinned++;
	slab_of(s, pg)->pinned++;
	slab_of(s, pg)->writing++;
	if (ns < STORE_MAX_NS)
		s->ns_pages[ns]++;
	*out = pg;
	return 0;
}

void store_pin(struct store *s, struct page *pg)
{
	if (!pg->pins++) {
		lru_unlink(pg);
		s->st.pinned++;
		slab_of(s, pg)->pinned++;
	}
}

void store_unpin(struct store *s, struct page *pg)
{
	if (--pg->pins)
		return;
	s->st.pinned--;
	slab_of(s, pg)->pinned--;
	if (pg->unlinked)
		slot_free(s, pg);
	else if (pg->state == PAGE_READY)
		lru_link(s, pg);
}

void store_commit(struct store *s, struct page *pg)
{
	hdr_seal(s, pg);
	pg->state = PAGE_READY;
	slab_of(s, pg)->writing--;
	page_changed(s, pg);
	store_unpin(s, pg);
}

void store_abort(struct store *s, struct page *pg)
{
	index_remove(&s->ix, &pg->ixn);
	pg->unlinked = 1;
	slab_of(s, pg)->writing--;
	page_changed(s, pg);
	store_unpin(s, pg);
}

void store_touch(struct store *s, struct page *pg)
{
	if (list_linked(&pg->lru)) {
		lru_unlink(pg);
		lru_link(s, pg);
	}
}

void store_drop(struct store *s, struct page *pg)
{
	if (pg->unlinked)
		return;
	index_remove(&s->ix, &pg->ixn);
	if (pg->pins)
		pg->unlinked = 1;
	else
		slot_free(s, pg);
}

uint32_t store_evict_watermark(struct store *s, uint32_t max)
{
	uint32_t n = 0;

	if (s->st.bytes_used <= s->high_bytes)
		return 0;
	/* Pages being demoted count as gone: their RAM is freed when their writes complete. */
	while (n < max && s->st.bytes_used - s->demoting_bytes > s->low_bytes &&
	       !list_empty(&s->lru)) {
		if (evict(s, list_entry(s->lru.prev, struct page, lru)) < 0)
			break;
		n++;
	}
	return n;
}

void store_demote_done(struct store *s, struct page *pg, int ok)
{
	pg->demoting = 0;
	s->demoting_bytes -= s->cls[pg->cls].slot_bytes;
	page_changed(s, pg);
	if (ok) {
		pg->clean = 1;
		if (pg->pins == 1 && !pg->unlinked) {
			index_remove(&s->ix, &pg->ixn);
			pg->unlinked = 1; /* freed by the unpin below */
		}
	}
	store_unpin(s, pg);
	if (!ok && list_linked(&pg->lru)) {
		/* Still the coldest it was, not the newest: back to the cold end of the LRU. */
		lru_unlink(pg);
		list_add_tail(&s->lru, &pg->lru);
		list_add_tail(&s->cls[pg->cls].lru, &pg->clru);
	}
}

int store_adopt_page(struct store *s, uint32_t sid, int ci, uint32_t slot, uint32_t ns,
		     const kvb_key *key, uint32_t gen)
{
	struct slab *sl;
	struct page *pg;
	int err;

	if (sid >= s->nslabs || ci < 0 || (uint32_t)ci >= s->ncls || ns >= STORE_MAX_NS)
		return -EINVAL;
	sl = &s->slabs[sid];
	if (sl->cls < 0) {
		err = slab_assign(s, sl, ci);
		if (err)
			return err;
	}
	if (sl->cls != ci || slot >= sl->nslots)
		return -EINVAL;
	pg = &sl->pages[slot];
	if (pg->state != PAGE_FREE)
		return -EEXIST;
	pg->key = *key;
	pg->ns = ns;
	pg->gen = gen;
	pg->state = PAGE_READY;
	pg->pins = 0;
	pg->unlinked = pg->clean = pg->demoting = 0;
	pg->waiters = NULL;
	index_insert(&s->ix, &pg->ixn);
	lru_link(s, pg);
	sl->used++;
	s->st.bytes_used += s->cls[ci].slot_bytes;
	s->st.pages++;
	s->ns_pages[ns]++;
	if (gen > s->gen)
		s->gen = gen;
	return 0;
}

void store_adopt_done(struct store *s)
{
	for (uint32_t k = 0; k < s->nslabs; k++) {
		struct slab *sl = &s->slabs[k];

		if (sl->cls < 0)
			continue;
		if (!sl->used) { /* assigned for a page that then lost to a newer copy */
			slab_release(s, sl);
			continue;
		}
		sl->nfree = 0;
		for (uint32_t i = sl->nslots; i-- > 0;) /* pop order: ascending offsets */
			if (sl->pages[i].state == PAGE_FREE)
				sl->free_stack[sl->nfree++] = i;
		if (!sl->nfree)
			list_del(&sl->link); /* full: off its class's partial list */
	}
}

struct page *store_by_id(struct store *s, uint32_t id)
{
	uint32_t sid = id >> STORE_SLOT_BITS, slot = id & ((1u << STORE_SLOT_BITS) - 1);
	struct slab *sl;

	if (sid >= s->nslabs)
		return NULL;
	sl = &s->slabs[sid];
	if (sl->cls < 0 || slot >= sl->nslots || sl->pages[slot].state == PAGE_FREE)
		return NULL;
	return &sl->pages[slot];
}

void *store_addr(const struct store *s, const struct page *pg)
{
	const struct slab *sl = slab_of(s, pg);

	return (char *)s->pool->arena[sl->arena].base + sl->off +
	       (uint64_t)slot_of(pg) * s->cls[sl->cls].slot_bytes;
}

uint32_t store_arena(const struct store *s, const struct page *pg)
{
	return slab_of(s, pg)->arena;
}

uint64_t store_loc(const struct store *s, const struct page *pg)
{
	const struct slab *sl = slab_of(s, pg);

	return KVB_LOC(sl->arena, sl->off + (uint64_t)slot_of(pg) * s->cls[sl->cls].slot_bytes);
}
