// SPDX-License-Identifier: MIT
/*
 * store.c - slab allocator, page records and eviction.
 *
 * Memory [packing]: each arena is a list of free extents (sorted, coalesced) from which slabs
 * are carved. A slab belongs to one size class (a page size rounded up to 4 KiB, so slots stay
 * O_DIRECT-aligned for the disk tier) and is exactly n of its slots, n = --slab / slot (at
 * least one): a slab never wastes a byte inside. A class takes a full slab from the first
 * extent that fits; when none fits it takes a short slab, as many slots as the largest extent
 * holds. So a pool filled with one page size holds every page the arenas can hold but for less
 * than one slot per arena (store_capacity, which kvbctl plan mirrors), for every page size up
 * to STORE_MAX_PAGE, where fixed slabs lost up to a slot per slab (a 4.29 MiB page in an 8 MiB
 * slab: 46%). Several models with different page sizes share the pool; a slab whose last page
 * goes away returns its range to the free extents, which is how memory moves between classes
 * under pressure (memcached's slab rebalancing, done eagerly). Why extents and not a buddy
 * allocator: slabs of n exact slots are not powers of two, and a buddy allocator would round
 * each up, losing what this is for; the extent list stays short (at most one per slab).
 *
 * Tenant partitions [tenant-part]: each arena belongs to one partition of the pool (pool.h), and
 * each namespace to one partition (ns_part). A page is placed, and a victim chosen, only within
 * its namespace's partition, each of which has its own LRU, usage and watermarks: one tenant's
 * flood evicts only its own pages, and its clients map only its arenas. [tenant-lend] In a
 * sparse pool (pool.h) the partitions share one memory budget: slab_new takes a slab's memory
 * (fallocate) while the budget has room, slab_release gives it back (hole punched); with the
 * budget spent, a partition under its guarantee takes a borrower's slab back (lend_take)
 * before anyone evicts their own.
 *
 * Page states:
 *
 *     FREE --store_alloc--> WRITING --store_commit--> READY --store_drop/evict--> FREE
 *                              |                        ^  |
 *                              +--store_abort--> FREE   |  +--pin--> (pinned READY) --unpin--+
 *
 * A page is evictable iff it is READY, unpinned and still indexed; exactly those pages, but for
 * held parents [chain], are on their partition's, class's and namespace's LRUs (coldest at the
 * tail). Pinned pages (leases, copies in flight) are off the lists, so finding a victim never
 * scans them and "every page leased" is an empty LRU: -ENOSPC at once. A dropped page that is still pinned leaves the index at once (a
 * new PUT of the key gets a fresh slot) and its slot is freed at the last unpin.
 *
 * Victim choice (store_alloc_pref): a free slot of the class, else a new slab, in each arena in
 * the client's order of preference (nearest NUMA node first; extents and partial slabs are kept
 * per arena), else the coldest evictable page of the partition decides. If it is of our class it goes
 * and hands us its slot. If it belongs to another class, its whole slab is reclaimed: every
 * evictable page in it goes, and the slab, once empty, changes class (memcached's slab
 * reassignment). A slab that still holds pinned pages cannot be emptied; after RECLAIM_TRIES
 * such slabs the coldest page of our own class goes instead. So a single class is exact LRU,
 * and memory moves between page sizes in LRU order of slabs, with bounded work per allocation
 * (RECLAIM_TRIES slabs).
 *
 * Chains [chain]: a PUT may name its parent (store_link_parent: the page it continues, by id and
 * generation; the parent counts its kids). Every victim is the coldest page with no kids
 * (coldest(): parents met at the cold end are held off the LRUs until their last kid leaves,
 * then come back at the cold end), so chains leave RAM tail first and a prefix lookup never
 * finds a head evicted under a stored tail. Links point only back in allocation order (no
 * cycles). A page leaving the index lets go of its parent (chain_detach); a parent freed with
 * kids (DELETE, or a slab reclaim with nothing else left: chain_cuts) leaves them roots, their
 * stale links failing the generation check. Namespace caps [ns-limit] (ns_room) evict the
 * capped namespace's own coldest leaves, from its own LRU.
 *
 * With a disk tier [tier-seam], evict() frees a "clean" page (its copy on disk is complete) at
 * once and hands any other to the tier (tier.c), which writes it while it stays READY and
 * pinned, and frees it through store_demote_done(). An allocation that found no slot then
 * returns -ENOSPC with demotions in flight, and its op waits for them (tier_wait_alloc).
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
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "clock.h"
#include "log.h"
#include "pagehdr.h"
#include "store.h"
#include "waitq.h"

static_assert(STORE_MAX_NS == PMETA_NS_MAX, "the side table holds every namespace");
static_assert(STORE_MAX_SLABS < PMETA_SLABS_MAX, "the side table records every slab");

#define RECLAIM_TRIES 8

static struct slab *slab_of(const struct store *s, const struct page *pg)
{
	return &s->slabs[pg->id >> STORE_SLOT_BITS];
}

static uint32_t slot_of(const struct page *pg)
{
	return pg->id & ((1u << STORE_SLOT_BITS) - 1);
}

static struct store_part *part_of(struct store *s, const struct page *pg)
{
	return &s->part[s->pool->arena[slab_of(s, pg)->arena].part];
}

uint32_t store_part_of(const struct store *s, const struct page *pg)
{
	return s->pool->arena[slab_of(s, pg)->arena].part;
}

static uint32_t slots_per_slab(uint64_t slab_bytes, uint64_t slot)
{
	uint64_t n = slab_bytes / slot;

	if (!n)
		n = 1;
	if (n >= (1u << STORE_SLOT_BITS))
		n = (1u << STORE_SLOT_BITS) - 1;
	return (uint32_t)n;
}

uint64_t store_capacity(const uint64_t *arena_bytes, uint32_t narenas, uint64_t slab_bytes,
			uint64_t page_bytes)
{
	uint64_t slot = (page_bytes + STORE_SLOT_ALIGN - 1) & ~(uint64_t)(STORE_SLOT_ALIGN - 1);
	uint64_t pages = 0;

	if (!slot)
		return 0;
	/* Full slabs of n slots, then a short one: every whole slot of the arena (store.c). */
	for (uint32_t a = 0; a < narenas; a++) {
		uint64_t n = slots_per_slab(slab_bytes, slot), slab = n * slot;
		uint64_t full = arena_bytes[a] / slab, rest = arena_bytes[a] - full * slab;

		pages += full * n + rest / slot;
	}
	return pages;
}

/* Returns [off, off + len) to arena a's free extents, merged with its neighbours. */
static void ext_free(struct store *s, uint32_t a, uint64_t off, uint64_t len)
{
	struct store_arena *ar = &s->ar[a];
	uint32_t i = 0;

	while (i < ar->next && ar->ext[i].off < off)
		i++;
	ar->free_bytes += len;
	if (i > 0 && ar->ext[i - 1].off + ar->ext[i - 1].len == off) {
		ar->ext[i - 1].len += len;
		if (i < ar->next && off + len == ar->ext[i].off) {
			ar->ext[i - 1].len += ar->ext[i].len;
			memmove(&ar->ext[i], &ar->ext[i + 1],
				(ar->next - i - 1) * sizeof(*ar->ext));
			ar->next--;
		}
		return;
	}
	if (i < ar->next && off + len == ar->ext[i].off) {
		ar->ext[i].off = off;
		ar->ext[i].len += len;
		return;
	}
	/* cap >= the number of slabs that fit plus one: a new extent always has room. */
	memmove(&ar->ext[i + 1], &ar->ext[i], (ar->next - i) * sizeof(*ar->ext));
	ar->ext[i] = (struct store_ext){off, len};
	ar->next++;
}

/*
 * Carves a slab of up to want bytes (a multiple of slot) from arena a: first fit for the full
 * size, else (short) the largest extent's whole slots. Returns its length, 0 when nothing fits.
 */
static uint64_t ext_take(struct store *s, uint32_t a, uint64_t want, uint64_t slot, int short_ok,
			 uint64_t *off)
{
	struct store_arena *ar = &s->ar[a];
	uint32_t best = ar->next;
	uint64_t len;

	for (uint32_t i = 0; i < ar->next; i++) {
		if (ar->ext[i].len >= want) {
			best = i;
			break;
		}
		if (short_ok && ar->ext[i].len >= slot &&
		    (best == ar->next || ar->ext[i].len > ar->ext[best].len))
			best = i;
	}
	if (best == ar->next || (!short_ok && ar->ext[best].len < want))
		return 0;
	len = ar->ext[best].len >= want ? want : ar->ext[best].len / slot * slot;
	*off = ar->ext[best].off;
	ar->ext[best].off += len;
	ar->ext[best].len -= len;
	ar->free_bytes -= len;
	if (!ar->ext[best].len) {
		memmove(&ar->ext[best], &ar->ext[best + 1],
			(ar->next - best - 1) * sizeof(*ar->ext));
		ar->next--;
	}
	return len;
}

static void free_count(struct store *s)
{
	uint64_t f = 0;

	for (uint32_t a = 0; a < s->pool->narenas; a++)
		f += s->ar[a].free_bytes;
	s->st.slabs_free = f / s->slab_bytes;
}

int store_init(struct store *s, struct pool *p, uint64_t slab_bytes, double high, double low)
{
	uint64_t total = 0, smallest = UINT64_MAX;
	int err = -ENOMEM;

	memset(s, 0, sizeof(*s));
	if (slab_bytes < STORE_SLOT_ALIGN || slab_bytes % STORE_SLOT_ALIGN || !p->narenas)
		return -EINVAL;
	s->pool = p;
	s->slab_bytes = slab_bytes;
	s->t0 = s->now = clock_now();
	s->slabs = calloc(STORE_MAX_SLABS, sizeof(*s->slabs));
	s->rec_free = calloc(STORE_MAX_SLABS, sizeof(*s->rec_free));
	if (!s->slabs || !s->rec_free)
		goto err_free;
	for (uint32_t i = 0; i < POOL_MAX_PARTS; i++)
		list_init(&s->part[i].lru);
	list_init(&s->empty);
	for (uint32_t i = 0; i < STORE_MAX_NS; i++)
		list_init(&s->ns_lru[i]);
	for (uint32_t a = 0; a < p->narenas; a++) {
		struct store_arena *ar = &s->ar[a];
		uint64_t size = p->arena[a].size & ~(uint64_t)(STORE_SLOT_ALIGN - 1), off = 0;

		/* Every slab is at least a slot of 4 KiB: extents never outnumber them. */
		ar->cap = (uint32_t)(size / STORE_SLOT_ALIGN < STORE_MAX_SLABS
					     ? size / STORE_SLOT_ALIGN + 1
					     : STORE_MAX_SLABS + 1);
		ar->ext = calloc(ar->cap, sizeof(*ar->ext));
		if (!ar->ext)
			goto err_free;
		/* [dir] The partition's directory comes first in its first arena. */
		if (p->arena[a].dir_bytes && p->arena[a].dir_bytes < size) {
			struct dir *d = &s->dir[p->arena[a].part];

			/* Opened (an adopted one wiped) even when unused: its old clients must stop. */
			dir_open(d, p->arena[a].base, p->arena[a].dir_bytes, p->adopted);
			if (p->no_dir)
				d->h = NULL;
			off = p->arena[a].dir_bytes;
		}
		size -= off;
		if (size)
			ext_free(s, a, off, size);
		s->part[p->arena[a].part].bytes_total += size;
		total += size;
		if (size < smallest)
			smallest = size;
	}
	if (!total)
		goto err_inval;
	s->max_page = slab_bytes > STORE_MAX_PAGE ? slab_bytes : STORE_MAX_PAGE;
	if (s->max_page > smallest)
		s->max_page = smallest;
	free_count(s);
	s->high_bytes = (uint64_t)(high * (double)total);
	s->low_bytes = (uint64_t)(low * (double)total);
	/*
	 * Two buckets per 64 KiB of pool: a pool full of 64 KiB pages (the smallest a model
	 * makes) has chains half a page long, so a PUT's lookup of a new key, which walks its
	 * chain whole, mostly finds an empty bucket rather than a page struct in DRAM: index_find
	 * and index_remove 7.9% -> 5.2% of a loop storing 64 KiB pages (about 0.1 us a PUT). 16
	 * bytes per 64 KiB; growth (index.c, at two nodes a bucket) still waits for small pages.
	 */
	/* [tenant-lend] A sparse pool's partitions share the pool's memory: sized by that. */
	err = index_init(&s->ix, (p->sparse ? p->total : total) / 32768);
	if (!err)
		return 0;
	goto err_free;
err_inval:
	err = -EINVAL;
err_free:
	for (uint32_t a = 0; a < POOL_MAX_ARENAS; a++)
		free(s->ar[a].ext);
	free(s->slabs);
	free(s->rec_free);
	memset(s, 0, sizeof(*s));
	return err;
}

void store_fini(struct store *s)
{
	for (uint32_t i = 0; i < s->nslabs; i++) {
		free(s->slabs[i].pages);
		free(s->slabs[i].free_stack);
	}
	for (uint32_t a = 0; a < POOL_MAX_ARENAS; a++)
		free(s->ar[a].ext);
	free(s->slabs);
	free(s->rec_free);
	if (s->ix.buckets)
		index_fini(&s->ix);
	memset(s, 0, sizeof(*s));
}

int store_class_get(struct store *s, uint64_t page_bytes)
{
	uint64_t slot = (page_bytes + STORE_SLOT_ALIGN - 1) & ~(uint64_t)(STORE_SLOT_ALIGN - 1);

	if (!page_bytes || slot > s->max_page)
		return -E2BIG;
	for (uint32_t i = 0; i < s->ncls; i++)
		if (s->cls[i].slot_bytes == slot)
			return (int)i;
	if (s->ncls == STORE_MAX_CLASSES)
		return -EMFILE;
	struct store_class *c = &s->cls[s->ncls];

	c->slot_bytes = slot;
	c->slots_per_slab = slots_per_slab(s->slab_bytes, slot);
	for (uint32_t a = 0; a < POOL_MAX_ARENAS; a++)
		list_init(&c->partial[a]);
	for (uint32_t i = 0; i < POOL_MAX_PARTS; i++)
		list_init(&c->lru[i]);
	return (int)s->ncls++;
}

/*
 * [pagehdr] Records slab sid in the side table, before any page of it can commit, and clears
 * the headers at its slot starts: these bytes may have been slots of another size before, and
 * a header of that life must not vouch for a slot being written now.
 */
static void slab_record(struct store *s, uint32_t sid, const struct slab *sl, uint32_t slot_bytes)
{
	uint64_t unit;

	if (!s->pool->meta)
		return;
	unit = s->pool->arena[sl->arena].unit0 + sl->off / PHDR_UNIT;
	for (uint32_t i = 0; i < sl->nslots; i++)
		memset(pmeta_hdr_at(s->pool->meta, unit + (uint64_t)i * (slot_bytes / PHDR_UNIT)),
		       0, sizeof(struct pmeta_hdr));
	pmeta_slab_write(s->pool->meta, sid, sl->arena, sl->off, sl->len, slot_bytes);
}

/* A slab's page records (free, off every list) and its free stack, unfilled; -ENOMEM. */
static int slab_pages_alloc(struct slab *sl, uint32_t sid, int ci, uint32_t n)
{
	sl->pages = calloc(n, sizeof(*sl->pages));
	sl->free_stack = malloc(n * sizeof(*sl->free_stack));
	if (!sl->pages || !sl->free_stack) {
		free(sl->pages);
		free(sl->free_stack);
		sl->pages = NULL;
		sl->free_stack = NULL;
		return -ENOMEM;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct page *pg = &sl->pages[i];

		pg->id = (sid << STORE_SLOT_BITS) | i;
		pg->cls = (uint16_t)ci;
		list_init(&pg->lru);
		list_init(&pg->clru);
		list_init(&pg->nlru);
	}
	return 0;
}

/* [tenant-lend] The i-th arena of its partition: the budget it counts against. */
static uint32_t arena_slot(const struct store *s, uint32_t a)
{
	return a - s->pool->part[s->pool->arena[a].part].first;
}

/* [tenant-lend] Room left in budget slot i. */
static uint64_t budget_room_at(const struct store *s, uint32_t i)
{
	return s->resident[i] < s->pool->budget[i] ? s->pool->budget[i] - s->resident[i] : 0;
}

/* [tenant-lend] Bytes a new slab in arena a may take from the budget; no limit unless sparse. */
static uint64_t budget_room(const struct store *s, uint32_t a)
{
	return s->pool->sparse ? budget_room_at(s, arena_slot(s, a)) : UINT64_MAX;
}

/* [tenant-lend] Memory for [off, off + len) of sparse arena a, counted; 0 or -errno. */
static int slab_back(struct store *s, uint32_t a, uint64_t off, uint64_t len)
{
	static struct log_throttle lt;

	/* fallocate, not the first touch: memory the machine lacks is this slab not made
	 * (the PUT evicts or is refused), never a SIGBUS in the broker or a client. */
	if (fallocate(s->pool->arena[a].fd, 0, (off_t)off, (off_t)len) < 0) {
		int e = errno;

		s->st.alloc_failed++;
		log_throttled(
			&lt,
			"pool: %s: no memory for a slab of %llu KiB (fallocate: %s): the "
			"machine has less free than the pool's budget; the PUT evicts instead",
			s->pool->arena[a].name, (unsigned long long)(len >> 10), strerror(e));
		return -e;
	}
	s->resident[arena_slot(s, a)] += len;
	s->part[s->pool->arena[a].part].resident += len;
	s->ar[a].resident += len;
	s->st.resident += len;
	return 0;
}

static void *slab_base(const struct store *s, uint32_t a, uint64_t off)
{
	return (uint8_t *)s->pool->arena[a].base + off;
}

/* [tenant-lend] [off, off + len) of sparse arena a back to the machine ([slab-pin]: the caller
 * unregistered it). */
static void slab_unback(struct store *s, uint32_t a, uint64_t off, uint64_t len)
{
	static struct log_throttle lt;

	if (fallocate(s->pool->arena[a].fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
		      (off_t)len) < 0)
		log_throttled(&lt, "pool: %s: cannot return %llu KiB (fallocate: %s)",
			      s->pool->arena[a].name, (unsigned long long)(len >> 10),
			      strerror(errno));
	s->resident[arena_slot(s, a)] -= len;
	s->part[s->pool->arena[a].part].resident -= len;
	s->ar[a].resident -= len;
	s->st.resident -= len;
}

static void slab_release(struct store *s, struct slab *sl);

/* [slab-pin] A sparse slab's memory, just taken, registered for GPU copies; on failure it is
 * given back and the slab is not made (its PUT evicts or is refused, as without memory). */
static int slab_pin(struct store *s, uint32_t a, uint64_t off, uint64_t len)
{
	static struct log_throttle lt;
	int err;

	if (!s->pin)
		return 0;
	err = s->pin(s->pin_arg, slab_base(s, a, off), len);
	if (!err)
		return 0;
	s->st.pin_failed++;
	log_throttled(&lt,
		      "pool: %s: the GPU driver would not register a slab of %llu KiB (%s): the "
		      "slab is not made and the PUT evicts instead; the machine's pinned memory "
		      "is short (ulimit -l, or other processes pinning)",
		      s->pool->arena[a].name, (unsigned long long)(len >> 10), strerror(-err));
	slab_unback(s, a, off, len);
	return err;
}

/*
 * [tenant-lend] Budget for want bytes in budget slot i (arena_slot) from the empty slabs kept
 * (slot_free), oldest first, any partition's: an empty slab is memory no page uses. Returns the
 * room there now.
 */
static uint64_t empty_release(struct store *s, uint32_t i, uint64_t want)
{
	struct list *pos = s->empty.next;

	while (pos != &s->empty && budget_room_at(s, i) < want) {
		struct slab *sl = list_entry(pos, struct slab, elink);

		pos = pos->next;
		if (arena_slot(s, sl->arena) == i)
			slab_release(s, sl);
	}
	return budget_room_at(s, i);
}

/* Carves a new slab of class ci in arena a (short_ok: fewer slots than a full one). */
static struct slab *slab_new(struct store *s, int ci, uint32_t a, int short_ok)
{
	struct store_class *c = &s->cls[ci];
	uint64_t off, len, want = (uint64_t)c->slots_per_slab * c->slot_bytes;
	uint64_t room = budget_room(s, a);
	uint32_t sid, n;
	struct slab *sl;

	if (!s->nrec_free && s->nslabs == STORE_MAX_SLABS)
		return NULL;
	if (room < want && !list_empty(&s->empty))
		room = empty_release(s, arena_slot(s, a), want);
	if (room < want) { /* [tenant-lend] the budget is spent, or all but a short slab */
		if (!short_ok || room < c->slot_bytes)
			return NULL;
		want = room / c->slot_bytes * c->slot_bytes;
	}
	len = ext_take(s, a, want, c->slot_bytes, short_ok, &off);
	if (!len)
		return NULL;
	n = (uint32_t)(len / c->slot_bytes);
	sid = s->nrec_free ? s->rec_free[--s->nrec_free] : s->nslabs++;
	sl = &s->slabs[sid];
	if (slab_pages_alloc(sl, sid, ci, n)) {
		s->rec_free[s->nrec_free++] = sid;
		ext_free(s, a, off, len);
		return NULL;
	}
	if (s->pool->sparse && (slab_back(s, a, off, len) || slab_pin(s, a, off, len))) {
		free(sl->pages);
		free(sl->free_stack);
		sl->pages = NULL;
		sl->free_stack = NULL;
		sl->cls = -1;
		s->rec_free[s->nrec_free++] = sid;
		ext_free(s, a, off, len);
		return NULL;
	}
	for (uint32_t i = 0; i < n; i++)
		sl->free_stack[n - 1 - i] = i; /* pop order = ascending offsets: neighbours stay */
	sl->arena = a;
	sl->off = off;
	sl->len = len;
	sl->nslots = n;
	slab_record(s, sid, sl, (uint32_t)c->slot_bytes);
	sl->nfree = n;
	sl->used = 0;
	sl->pinned = sl->writing = 0;
	sl->cls = ci;
	list_init(&sl->link);
	list_init(&sl->elink);
	list_add_tail(&c->partial[a], &sl->link);
	c->slabs++;
	free_count(s);
	return sl;
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
	if (list_linked(&sl->elink)) {
		list_del(&sl->elink);
		s->st.empty_bytes -= sl->len;
	}
	if (s->pool->meta)
		pmeta_slab_clear(s->pool->meta, (uint32_t)(sl - s->slabs));
	if (s->pool->sparse && s->unpin) /* [slab-pin] never a hole under a registration */
		s->unpin(s->pin_arg, slab_base(s, sl->arena, sl->off), sl->len);
	if (s->pool->sparse) /* after the record: an adopter never trusts a hole */
		slab_unback(s, sl->arena, sl->off, sl->len);
	ext_free(s, sl->arena, sl->off, sl->len);
	sl->len = 0;
	s->rec_free[s->nrec_free++] = (uint32_t)(sl - s->slabs);
	free_count(s);
}

static void lru_unlink(struct page *pg)
{
	if (list_linked(&pg->lru)) {
		list_del(&pg->lru);
		list_del(&pg->clru);
		if (list_linked(&pg->nlru))
			list_del(&pg->nlru);
	}
}

/* Onto its partition's, class's and namespace's LRUs: at the hot end, or the cold one. */
static void lru_link_at(struct store *s, struct page *pg, int cold)
{
	uint32_t pt = store_part_of(s, pg);
	void (*add)(struct list *, struct list *) = cold ? list_add_tail : list_add_head;

	add(&s->part[pt].lru, &pg->lru);
	add(&s->cls[pg->cls].lru[pt], &pg->clru);
	if (pg->ns < STORE_MAX_NS)
		add(&s->ns_lru[pg->ns], &pg->nlru);
}

static void lru_link(struct store *s, struct page *pg)
{
	lru_link_at(s, pg, 0);
}

/* The three LRUs a page is on (lru_link_at), for coldest(). */
enum { LRU_PART, LRU_CLASS, LRU_NS };

static struct page *lru_page(struct list *n, int which)
{
	if (which == LRU_PART)
		return list_entry(n, struct page, lru);
	if (which == LRU_CLASS)
		return list_entry(n, struct page, clru);
	return list_entry(n, struct page, nlru);
}

/*
 * [chain] The coldest leaf of an LRU: the page to evict. A page met at the cold end that still
 * has kids is held, taken off every LRU, and the next is tried: the leaf that goes is the
 * least recently used of the pages no stored page continues, so a chain leaves RAM tail first
 * and its head, which every lookup of it needs, last. Bounded work: a page is held at most
 * once per time it was linked, and each link (commit, unpin, touch) is one op's O(1), so the
 * holding is paid for by the ops that linked those pages; nothing ever scans the LRU. A held
 * page comes back when its last kid left (chain_detach, at the cold end: it was the coldest
 * when held and no one touched it since) or when it is touched or pinned.
 */
static struct page *coldest(struct store *s, struct list *head, int which)
{
	while (!list_empty(head)) {
		struct page *pg = lru_page(head->prev, which);

		if (!pg->kids)
			return pg;
		lru_unlink(pg);
		pg->held = 1;
		s->st.held++;
	}
	return NULL;
}

/* [chain] Page id with generation gen, NULL when that page is gone (freed, slot reused). */
static struct page *page_at(struct store *s, uint32_t id, uint32_t gen)
{
	uint32_t sid = id >> STORE_SLOT_BITS, slot = id & ((1u << STORE_SLOT_BITS) - 1);
	struct slab *sl;

	if (!gen || sid >= s->nslabs)
		return NULL;
	sl = &s->slabs[sid];
	if (sl->cls < 0 || !sl->pages || slot >= sl->nslots || sl->pages[slot].gen != gen)
		return NULL;
	return &sl->pages[slot];
}

/* [chain] pg leaves the index: its parent has one kid fewer, and may be evicted once a leaf. */
static void chain_detach(struct store *s, struct page *pg)
{
	struct page *p = page_at(s, pg->parent, pg->parent_gen);

	pg->parent_gen = 0;
	if (!p || !p->kids || --p->kids || !p->held)
		return;
	p->held = 0;
	lru_link_at(s, p, 1);
}

static void publish(struct store *s, const struct page *pg);

/*
 * [dir] Out of the directory, before the slot can be freed, so before anything can write it
 * again; then [hazard] pinned for the clients reading it under their hazard tables, if any.
 * 1 when it had an entry (a full bucket may have left it without one).
 */
static int withdraw(struct store *s, struct page *pg)
{
	struct dir *d = &s->dir[store_part_of(s, pg)];
	int had;

	if (pg->state != PAGE_READY || !d->h)
		return 0; /* nobody can have found it without a directory */
	had = dir_del(d, pg->ns, &pg->key);
	if (s->withdrawn)
		s->withdrawn(s->withdrawn_arg, pg);
	return had;
}

/* Out of the index, and out of its chain (the directory already withdrawn). */
static void unindex_withdrawn(struct store *s, struct page *pg)
{
	index_remove(&s->ix, &pg->ixn);
	chain_detach(s, pg);
}

/* Out of the directory, the index, and its chain. */
static void unindex(struct store *s, struct page *pg)
{
	withdraw(s, pg);
	unindex_withdrawn(s, pg);
}

int store_link_parent(struct store *s, struct page *pg, const kvb_key *parent)
{
	struct page *p = store_find(s, pg->ns, parent);

	/*
	 * Only to a page allocated before this one (generations grow with every allocation):
	 * links then always point back in time and can never close a cycle, whatever keys a
	 * client sends (a cycle would keep its pages in RAM for ever).
	 */
	if (!p || p->unlinked || p->gen >= pg->gen || pg->parent_gen)
		return 0;
	pg->parent = p->id;
	pg->parent_gen = p->gen;
	p->kids++;
	s->st.chain_links++;
	return 1;
}

struct page *store_parent(struct store *s, const struct page *pg)
{
	return page_at(s, pg->parent, pg->parent_gen);
}

void store_ns_limit(struct store *s, uint32_t ns, uint64_t bytes)
{
	if (ns < STORE_MAX_NS)
		s->ns_limit[ns] = bytes;
}

/* [page-wake] pg changed state: whoever waits on it runs again (store.h). */
static void page_changed(struct store *s, struct page *pg)
{
	if (pg->waiters && s->wake)
		s->wake(s->wake_arg, pg);
}

static struct pmeta_hdr *hdr_of(const struct store *s, const struct page *pg)
{
	const struct slab *sl = slab_of(s, pg);

	return pmeta_hdr_at(s->pool->meta,
			    s->pool->arena[sl->arena].unit0 +
				    (sl->off + (uint64_t)slot_of(pg) * s->cls[sl->cls].slot_bytes) /
					    PHDR_UNIT);
}

/* [pagehdr] The page's bytes are complete: vouch for them in the side table (crc: its crc32c
 * when the copy worker computed it, else NULL). */
static void hdr_seal(struct store *s, const struct page *pg, const uint32_t *crc)
{
	struct pmeta_hdr h = {.ns = (uint16_t)pg->ns,
			      .slot_bytes = (uint32_t)s->cls[pg->cls].slot_bytes,
			      .len = (uint32_t)s->cls[pg->cls].slot_bytes,
			      .gen = pg->gen,
			      .key = pg->key};

	if (!s->pool->meta || pg->ns >= STORE_MAX_NS)
		return;
	if (crc)
		pmeta_hdr_seal_crc(&h, *crc);
	else
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
	part_of(s, pg)->bytes_used -= c->slot_bytes;
	part_of(s, pg)->pages--;
	if (pg->ns < STORE_MAX_NS)
		s->ns_bytes[pg->ns] -= c->slot_bytes;
	if (pg->ns < STORE_MAX_NS && !--s->ns_pages[pg->ns] && s->ns_empty)
		s->ns_empty(s->ns_empty_arg, pg->ns);
	pg->state = PAGE_FREE;
	pg->unlinked = 0;
	pg->gen = 0;
	pg->kids = 0; /* kids still naming it find a generation of 0: no parent */
	pg->held = 0;
	pg->parent_gen = 0;
	sl->free_stack[sl->nfree++] = slot_of(pg);
	sl->used--;
	if (sl->nfree == 1) /* was full: back on the partial list */
		list_add_tail(&c->partial[sl->arena], &sl->link);
	if (sl->used)
		return;
	/*
	 * [tenant-lend] In a sparse pool an empty slab keeps its memory, and its class's next PUT
	 * reuses it (a slab made again would take its memory again: zeroed, mapped page by page,
	 * which halved PUT throughput under DELETE churn); slab_new gives empty slabs back, oldest
	 * first, when the budget is spent, before anything is evicted.
	 */
	if (s->pool->sparse) {
		list_add_tail(&s->empty, &sl->elink);
		s->st.empty_bytes += sl->len;
	} else {
		slab_release(s, sl);
	}
}

/*
 * Evicts an evictable page (READY, unpinned, indexed): the one place pages leave RAM. With a
 * disk tier a page that has no copy on disk is demoted instead: it stays READY and pinned
 * until its write completed (store_demote_done). Returns 1 freed, 0 demotion started,
 * EVICT_KEPT a client reads it under its hazard table (pinned for it now, so off the LRUs: the
 * caller tries the next), -EBUSY the tier cannot take it now, or colder pages are still being
 * demoted (the page stays evictable).
 */
#define EVICT_KEPT 2
static int evict(struct store *s, struct page *pg)
{
	int had;

	if (s->leaving)
		s->leaving(s->leaving_arg, pg);
	if (!pg->clean && s->demote) {
		int r = s->demote(s->demote_arg, pg);

		if (r < 0)
			return r;
		if (r > 0) {
			pg->demoting = 1;
			s->demoting_bytes += s->cls[pg->cls].slot_bytes;
			part_of(s, pg)->demoting_bytes += s->cls[pg->cls].slot_bytes;
			if (pg->ns < STORE_MAX_NS)
				s->ns_demoting[pg->ns] += s->cls[pg->cls].slot_bytes;
			store_pin(s, pg);
			return 0;
		}
		/*
		 * No demotion now (the tier failed, say). The pages still being demoted were taken
		 * from the cold end, so they are colder than this one, and a failed write puts them
		 * back there: they go first. Dropping this one instead would keep old pages and
		 * lose the newest (the op waits for the writes: tier_wait_alloc).
		 */
		if (s->demoting_bytes)
			return -EBUSY;
	}
	/*
	 * [hazard] A page a client reads under its hazard table stays, pinned for it, as a leased
	 * one would (off the LRUs until the client's entry moves on): back into the directory.
	 */
	had = withdraw(s, pg);
	if (pg->pins) {
		/* Its entry back where it was; one a full bucket refused is not asked for (and
		 * counted in dir_full) again. */
		if (had)
			publish(s, pg);
		return EVICT_KEPT;
	}
	unindex_withdrawn(s, pg);
	s->st.evictions++;
	part_of(s, pg)->evictions++;
	if (!s->hist_off)
		hist_observe(&s->evict_age, hist_bounds_of(HIST_EVICT_AGE),
			     s->now - s->t0 - pg->born * 0.1);
	slot_free(s, pg);
	return 1;
}

/* Takes a free slot of class ci in arena a if one exists without evicting. */
static struct page *slot_take_in(struct store *s, int ci, uint32_t a, int short_ok)
{
	struct list *partial = &s->cls[ci].partial[a];
	struct slab *sl;
	struct page *pg;

	if (list_empty(partial) && !slab_new(s, ci, a, short_ok))
		return NULL;
	sl = list_entry(partial->next, struct slab, link);
	pg = &sl->pages[sl->free_stack[--sl->nfree]];
	if (!sl->used++ && list_linked(&sl->elink)) { /* [tenant-lend] not empty any more */
		list_del(&sl->elink);
		s->st.empty_bytes -= sl->len;
	}
	if (!sl->nfree)
		list_del(&sl->link);
	return pg;
}

/*
 * A free slot of class ci in the first arena of the preference order (partition part only) that
 * has one or room for a full slab; failing that, a short slab in the first that has room for one.
 */
static struct page *slot_take(struct store *s, int ci, uint32_t part, const struct store_pref *pref)
{
	const struct pool_part *pt = &s->pool->part[part];
	struct page *pg = NULL;
	uint32_t n = pref ? pref->n : pt->narenas;

	for (int short_ok = 0; !pg && short_ok < 2; short_ok++) {
		for (uint32_t i = 0; !pg && i < n; i++) {
			uint32_t a = pref ? pref->arena[i] : pt->first + i;

			if (a < s->pool->narenas && s->pool->arena[a].part == part)
				pg = slot_take_in(s, ci, a, short_ok);
		}
	}
	return pg;
}

struct page *store_find(struct store *s, uint32_t ns, const kvb_key *key)
{
	struct ixnode *n = index_find(&s->ix, ns, key);

	return n ? list_entry(n, struct page, ixn) : NULL;
}

/*
 * Evicts every evictable page of a slab; the slab is freed when nothing pinned remains. [chain]
 * Pages with kids stay unless cut: last in the slab first, since a chain's pages are allocated
 * in order, so a page whose kids were all in this slab is a leaf again by the time the walk
 * reaches it. cut: parents go too (their kids elsewhere stay, cut from them, counted).
 */
static void slab_reclaim(struct store *s, struct slab *sl, int cut)
{
	for (uint32_t i = sl->nslots; i-- > 0 && sl->cls >= 0;) {
		struct page *pg = &sl->pages[i];
		int kids = pg->kids != 0, r;

		if (!list_linked(&pg->lru) && !pg->held)
			continue;
		if (kids && !cut)
			continue;
		r = evict(s, pg);
		if (r < 0)
			break;
		s->st.chain_cuts += kids && r != EVICT_KEPT; /* kept for a reader: not cut */
	}
}

/*
 * [told-lru] A client reads pages through the directory or its hazard table and tells us in its
 * note ring, which we read when we sleep, at each tick, before its own ACQUIREs and RELEASEs:
 * up to a millisecond later while busy. A page it had just read was still the coldest then, and
 * its PUT right after evicted it: a chain's last page read as a prefix, the first PUT's parent,
 * so the chain was stored past a hole (kvbchain in t_chain, once). So whatever evicts by age
 * reads what clients told first. 1 when that unpinned a page (a RELEASE not read yet).
 */
static int lru_told(struct store *s)
{
	return s->told ? s->told(s->told_arg) : 0;
}

static int ns_over(const struct store *s, uint32_t ns, uint64_t slot)
{
	return s->ns_bytes[ns] - s->ns_demoting[ns] + slot > s->ns_limit[ns];
}

/*
 * [ns-limit] Makes room for one more slot of slot bytes under namespace ns's cap by evicting its
 * own coldest leaves. 0 when it fits, -ENOSPC when nothing of it is evictable (a PUT then waits
 * for its demotions, or fails like one into a pool full of leased pages).
 */
static int ns_room(struct store *s, uint32_t ns, uint64_t slot)
{
	if (ns >= STORE_MAX_NS || !s->ns_limit[ns])
		return 0;
	if (ns_over(s, ns, slot))
		(void)lru_told(s);
	while (ns_over(s, ns, slot)) {
		struct page *v = coldest(s, &s->ns_lru[ns], LRU_NS);
		int r = v ? evict(s, v) : -ENOSPC;

		if (r < 0)
			return -ENOSPC;
		s->st.ns_evictions += r != EVICT_KEPT;
	}
	return 0;
}

int store_ns_trim(struct store *s, uint32_t ns)
{
	return ns_room(s, ns, 0);
}

#define AHEAD_MIN_PAGES 1024 /* [evict-ahead] */

/*
 * [tenant-lend] The partition to take memory back from for partition part, which needs a
 * slab, or -1: one above its guarantee with an evictable page. A released
 * tenant's (guarantee 0) whoever asks, before anyone evicts their own; any other borrower only
 * for a partition still under its guarantee. Of those, the one furthest above its guarantee.
 */
static int lend_victim(struct store *s, uint32_t part)
{
	const struct store_part *me = &s->part[part];
	/* Below its guarantee by any amount: a slab more may take it past by less than a slab,
	 * rather than leave it short of it by as much. */
	int under = me->resident < me->guarantee, best = -1, best_rel = 0;
	uint64_t best_over = 0;

	for (uint32_t q = 0; q < s->pool->nparts; q++) {
		const struct store_part *pt = &s->part[q];
		int rel = pt->guarantee == 0;
		/* Pages being written to disk are as good as gone: their slabs come back. */
		uint64_t held = pt->resident - (pt->demoting_bytes < pt->resident
							? pt->demoting_bytes
							: pt->resident),
			 over;

		if (q == part || held <= pt->guarantee || list_empty(&pt->lru) || (!under && !rel))
			continue;
		over = held - pt->guarantee;
		if (best < 0 || rel > best_rel || (rel == best_rel && over > best_over)) {
			best = (int)q;
			best_rel = rel;
			best_over = over;
		}
	}
	return best;
}

/*
 * [tenant-lend] Takes a borrower's slab back (lend_victim): the slab of its coldest page, every
 * evictable page in it (pinned ones stay, and keep the slab). 1 when a slab's worth of
 * eviction was started, 0 when there is no borrower to take from.
 */
static int lend_take(struct store *s, uint32_t part)
{
	int q = lend_victim(s, part);
	struct page *cold;

	if (q < 0)
		return 0;
	cold = coldest(s, &s->part[q].lru, LRU_PART);
	if (!cold)
		return 1; /* its cold end was held parents, off the LRU now: ask again */
	slab_reclaim(s, slab_of(s, cold), 0);
	s->st.lend_reclaims++;
	s->part[q].lent_back++;
	return 1;
}

uint64_t store_arena_rss(const struct store *s, uint32_t a)
{
	struct stat st;

	return fstat(s->pool->arena[a].fd, &st) < 0 ? 0 : (uint64_t)st.st_blocks * 512;
}

uint64_t store_sparse_scrub(struct store *s)
{
	uint64_t back = 0;

	if (!s->pool->sparse)
		return 0;
	for (uint32_t a = 0; a < s->pool->narenas; a++) {
		const struct store_arena *ar = &s->ar[a];
		uint64_t rss = store_arena_rss(s, a),
			 mine = ar->resident + s->pool->arena[a].dir_bytes;

		if (rss <= mine)
			continue;
		for (uint32_t i = 0; i < ar->next; i++)
			(void)fallocate(s->pool->arena[a].fd,
					FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					(off_t)ar->ext[i].off, (off_t)ar->ext[i].len);
		back += rss - mine;
	}
	if (back)
		log_info("pool: %llu KiB faulted into free ranges by clients' reads given back",
			 (unsigned long long)(back >> 10));
	return back;
}

/* [tenant-rebind] Whether a slab record is a live slab of partition part. */
static int slab_in_part(const struct store *s, const struct slab *sl, uint32_t part)
{
	return sl->cls >= 0 && s->pool->arena[sl->arena].part == part;
}

int store_part_clear(struct store *s, uint32_t part)
{
	/* Nothing of it pinned (leased, being written, demoted or copied): checked whole before
	 * a page goes, so that a partition that cannot be emptied keeps its pages. */
	for (uint32_t i = 0; i < s->nslabs; i++) {
		const struct slab *sl = &s->slabs[i];

		if (slab_in_part(s, sl, part) && (sl->pinned || sl->writing))
			return -EBUSY;
	}
	for (uint32_t i = 0; i < s->nslabs; i++) {
		struct slab *sl = &s->slabs[i];

		for (uint32_t k = 0; slab_in_part(s, sl, part) && k < sl->nslots; k++)
			if (sl->pages[k].state != PAGE_FREE)
				store_drop(s, &sl->pages[k]); /* a hazard reader may pin it */
	}
	for (uint32_t i = 0; i < s->nslabs; i++) {
		struct slab *sl = &s->slabs[i];

		if (!slab_in_part(s, sl, part))
			continue;
		if (sl->used)
			return -EBUSY; /* freed at its last unpin; the next try finds it empty */
		slab_release(s, sl);
	}
	return 0;
}

void store_part_dir_reset(struct store *s, uint32_t part)
{
	const struct pool_arena *a = &s->pool->arena[s->pool->part[part].first];
	struct dir *d = &s->dir[part];

	if (!d->h)
		return; /* none (--no-directory, or too small a pool) */
	dir_open(d, a->base, a->dir_bytes, 0);
}

int store_alloc_pref(struct store *s, int ci, uint32_t ns, const kvb_key *key,
		     const struct store_pref *pref, struct page **out)
{
	struct store_class *c = &s->cls[ci];
	uint32_t part = ns < STORE_MAX_NS ? s->ns_part[ns] : 0;
	struct list *lru = &s->part[part].lru;
	struct page *pg;

	struct page *cold = NULL;
	int err;

	if (part >= s->pool->nparts)
		return -ENOSPC;
	err = ns_room(s, ns, c->slot_bytes);
	if (err)
		return err;
	pg = slot_take(s, ci, part, pref);
	/* [evict-ahead] Full: from now on the idle loop frees this class's next slot ahead
	 * (partitions of AHEAD_MIN_PAGES pages or more). */
	if (!pg && s->part[part].pages >= AHEAD_MIN_PAGES)
		s->part[part].ahead_cls = ci + 1;
	if (!pg && lru_told(s)) /* [told-lru] */
		pg = slot_take(s, ci, part, pref);
	/*
	 * [tenant-lend] The budget spent: borrowers give back before anyone evicts their own. A
	 * slab whose pages are being written to disk comes back when they are written: while any
	 * are, the PUT waits (-ENOSPC with demotions in flight) rather than take more slabs, or
	 * its own pages, meanwhile (a wait ends at each page written, not at each slab).
	 */
	for (int tries = RECLAIM_TRIES; !pg && s->pool->sparse && tries > 0; tries--) {
		uint64_t before = s->demoting_bytes;

		if (before && lend_victim(s, part) >= 0)
			return -ENOSPC; /* slabs on their way back: wait for them, take no more */
		if (!lend_take(s, part))
			break;
		pg = slot_take(s, ci, part, pref);
		if (!pg && s->demoting_bytes > before)
			return -ENOSPC;
	}
	for (int tries = RECLAIM_TRIES; !pg && tries > 0 && (cold = coldest(s, lru, LRU_PART));
	     tries--) {
		if (cold->cls == ci) {
			int r = evict(s, cold);

			if (r < 0)
				break;
			tries += r == EVICT_KEPT; /* a page off the LRU for good: not a try */
		} else {
			slab_reclaim(s, slab_of(s, cold), 0);
		}
		pg = slot_take(s, ci, part, pref);
	}
	while (!pg && (cold = coldest(s, &c->lru[part], LRU_CLASS))) {
		if (evict(s, cold) != EVICT_KEPT) {
			pg = slot_take(s, ci, part, pref);
			break;
		}
	}
	/*
	 * [chain] Memory held by chains of other page sizes whose slabs cannot be emptied leaf by
	 * leaf: the one case where a chain is cut rather than this PUT refused.
	 */
	if (!pg && (cold = coldest(s, lru, LRU_PART)) && cold->cls != ci) {
		slab_reclaim(s, slab_of(s, cold), 1);
		pg = slot_take(s, ci, part, pref);
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
	pg->parent_gen = 0;
	pg->kids = 0;
	pg->held = 0;
	index_insert(&s->ix, &pg->ixn);
	/*
	 * [put-prefetch] What its commit writes, the slot's header and its directory bucket,
	 * asked for now: the copy runs meanwhile, and the commit, on a synchronous PUT's
	 * critical path, no longer waits for DRAM there.
	 */
	if (s->pool->meta)
		__builtin_prefetch(hdr_of(s, pg), 1);
	dir_prefetch(&s->dir[part], ns, key);
	s->st.bytes_used += c->slot_bytes;
	s->st.pages++;
	s->st.pinned++;
	s->part[part].bytes_used += c->slot_bytes;
	s->part[part].pages++;
	s->part[part].pinned_bytes += c->slot_bytes;
	slab_of(s, pg)->pinned++;
	slab_of(s, pg)->writing++;
	if (ns < STORE_MAX_NS) {
		s->ns_pages[ns]++;
		s->ns_bytes[ns] += c->slot_bytes;
	}
	*out = pg;
	return 0;
}

void store_pin(struct store *s, struct page *pg)
{
	if (!pg->pins++) {
		lru_unlink(pg);
		pg->held = 0; /* back on the LRUs at its unpin */
		s->st.pinned++;
		slab_of(s, pg)->pinned++;
		part_of(s, pg)->pinned_bytes += s->cls[pg->cls].slot_bytes;
	}
}

void store_unpin(struct store *s, struct page *pg)
{
	if (--pg->pins)
		return;
	s->st.pinned--;
	slab_of(s, pg)->pinned--;
	part_of(s, pg)->pinned_bytes -= s->cls[pg->cls].slot_bytes;
	if (pg->unlinked)
		slot_free(s, pg);
	else if (pg->state == PAGE_READY)
		lru_link(s, pg);
}

void store_commit(struct store *s, struct page *pg)
{
	store_commit_crc(s, pg, NULL);
}

/* [dir] A READY, indexed page: readers may find it without asking (proto/pooldir.h). */
static void publish(struct store *s, const struct page *pg)
{
	dir_put(&s->dir[store_part_of(s, pg)], pg->ns, &pg->key,
		(uint32_t)s->cls[pg->cls].slot_bytes, store_loc(s, pg));
}

void store_commit_crc(struct store *s, struct page *pg, const uint32_t *crc)
{
	hdr_seal(s, pg, crc);
	store_commit_sealed(s, pg);
}

void store_seal(struct store *s, struct page *pg, const uint32_t *crc)
{
	hdr_seal(s, pg, crc);
}

void store_commit_sealed(struct store *s, struct page *pg)
{
	pg->state = PAGE_READY;
	if (!s->hist_off)
		pg->born = (uint32_t)((s->now - s->t0) * 10);
	if (!pg->unlinked)
		publish(s, pg);
	slab_of(s, pg)->writing--;
	page_changed(s, pg);
	store_unpin(s, pg);
}

void store_abort(struct store *s, struct page *pg)
{
	unindex(s, pg);
	pg->unlinked = 1;
	slab_of(s, pg)->writing--;
	page_changed(s, pg);
	store_unpin(s, pg);
}

void store_touch(struct store *s, struct page *pg)
{
	if (list_linked(&pg->lru) || pg->held) {
		lru_unlink(pg);
		pg->held = 0;
		lru_link(s, pg);
	}
}

void store_drop(struct store *s, struct page *pg)
{
	if (pg->unlinked)
		return;
	unindex(s, pg);
	if (pg->pins)
		pg->unlinked = 1;
	else
		slot_free(s, pg);
}

uint32_t store_evict_watermark(struct store *s, uint32_t max)
{
	uint64_t total = 0;
	uint32_t n = 0;

	for (uint32_t p = 0; p < s->pool->nparts; p++)
		total += s->part[p].bytes_total;
	/* Each partition against its share of the watermarks (high_bytes/low_bytes: the pool's). */
	for (uint32_t p = 0; p < s->pool->nparts && total; p++) {
		struct store_part *pt = &s->part[p];
		double f = (double)pt->bytes_total / (double)total;
		uint64_t high = (uint64_t)(f * (double)s->high_bytes);
		uint64_t low = (uint64_t)(f * (double)s->low_bytes);

		if (pt->bytes_used <= high)
			continue;
		/* Pages being demoted count as gone: their RAM is freed when their writes end. */
		while (n < max && pt->bytes_used - pt->demoting_bytes > low) {
			struct page *cold = coldest(s, &pt->lru, LRU_PART);

			if (!cold || evict(s, cold) < 0)
				break;
			n++;
		}
	}
	return n;
}

/* [evict-ahead] A free slot of class ci in partition part, or room for a new slab of it. */
static int slot_ready(const struct store *s, int ci, uint32_t part)
{
	const struct pool_part *pp = &s->pool->part[part];
	uint64_t slab = (uint64_t)s->cls[ci].slots_per_slab * s->cls[ci].slot_bytes;

	for (uint32_t a = pp->first; a < pp->first + pp->narenas && a < s->pool->narenas; a++)
		if (!list_empty(&s->cls[ci].partial[a]) || s->ar[a].free_bytes >= slab)
			return 1;
	return 0;
}

/*
 * [evict-ahead] A PUT into a full partition takes its slot by evicting the coldest page first:
 * a failed slot_take, the victim's directory entry, index chain, header and slab (a 64 KiB
 * PUT's slot took 1,200-1,400 cycles on the loop that way, 450-600 found free,
 * docs/benchmarks.md). The loop is idle between
 * a client's PUTs anyway, so it evicts that page there and the next PUT finds its slot free.
 * Only the page LRU order would evict next, of the class a PUT last had to evict for, one at
 * a time; only where the partition holds AHEAD_MIN_PAGES or more, so that the slot kept free
 * is at most 0.1% of its pages (a pool of few, large pages keeps every page it can, and a
 * large page's copy dwarfs its eviction anyway); never while demotions are in flight (an
 * evicted page with no copy on disk is written first, and its slot is free only when that
 * write ends: a second would follow at the next idle round).
 */
void store_evict_ahead(struct store *s)
{
	if (s->demoting_bytes)
		return;
	for (uint32_t p = 0; p < s->pool->nparts; p++) {
		struct store_part *pt = &s->part[p];
		int ci = pt->ahead_cls - 1;
		struct page *cold;

		if (ci < 0 || slot_ready(s, ci, p))
			continue;
		if (lru_told(s) && slot_ready(s, ci, p)) /* [told-lru] */
			continue;
		cold = coldest(s, &pt->lru, LRU_PART);
		/* Another class's page (the PUT reclaims its slab) or a tier that cannot take the
		 * page now: left to the next PUT, which asks again. */
		if (!cold || cold->cls != ci || evict(s, cold) < 0)
			pt->ahead_cls = 0;
	}
}

/*
 * [evict-prefetch] A PUT into a full partition evicts its coldest page, and that page's index
 * chain and directory bucket missed DRAM on the PUT's critical path (index_remove and dir_del:
 * 7% of a loop running 64 KiB PUTs, about 0.4 us a PUT). The loop waits for the next PUT
 * anyway; once per page that reaches the cold end.
 */
#define PREFETCH_DEPTH 4

void store_prefetch_victims(struct store *s)
{
	for (uint32_t p = 0; p < s->pool->nparts; p++) {
		struct store_part *pt = &s->part[p];
		const struct page *v = NULL;
		struct list *n = pt->lru.prev;

		/* [chain] A page with kids at the cold end is held, not evicted (coldest()): the
		 * victim is the first leaf after it, looked for a few pages deep. */
		for (int i = 0; n != &pt->lru && i < PREFETCH_DEPTH; i++, n = n->prev) {
			v = lru_page(n, LRU_PART);
			if (!v->kids)
				break;
		}
		if (!v || v->kids || v == pt->warmed)
			continue;
		pt->warmed = v;
		index_prefetch(&s->ix, v->ns, &v->key);
		dir_prefetch(&s->dir[p], v->ns, &v->key);
	}
}

void store_demote_done(struct store *s, struct page *pg, int ok)
{
	pg->demoting = 0;
	s->demoting_bytes -= s->cls[pg->cls].slot_bytes;
	part_of(s, pg)->demoting_bytes -= s->cls[pg->cls].slot_bytes;
	if (pg->ns < STORE_MAX_NS)
		s->ns_demoting[pg->ns] -= s->cls[pg->cls].slot_bytes;
	page_changed(s, pg);
	if (ok) {
		pg->clean = 1;
		/* [chain] A kid PUT while it was being written keeps it in RAM, clean. */
		if (pg->pins == 1 && !pg->unlinked && !pg->kids) {
			unindex(s, pg);
			pg->unlinked = 1; /* freed by the unpin below */
		}
	}
	store_unpin(s, pg);
	if (!ok && list_linked(&pg->lru)) {
		/* Still the coldest it was, not the newest: back to the cold end of the LRU. */
		lru_unlink(pg);
		lru_link_at(s, pg, 1);
	}
}

int store_adopt_page(struct store *s, uint32_t sid, int ci, uint32_t slot, uint32_t ns,
		     const kvb_key *key, uint32_t gen)
{
	struct slab *sl;
	struct page *pg;

	if (sid >= s->nslabs || ci < 0 || (uint32_t)ci >= s->ncls || ns >= STORE_MAX_NS)
		return -EINVAL;
	sl = &s->slabs[sid];
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
	pg->parent_gen = pg->kids = 0; /* [chain] links are not kept: adopted pages are roots */
	pg->held = 0;
	index_insert(&s->ix, &pg->ixn);
	publish(s, pg);
	lru_link(s, pg);
	sl->used++;
	s->st.bytes_used += s->cls[ci].slot_bytes;
	s->st.pages++;
	part_of(s, pg)->bytes_used += s->cls[ci].slot_bytes;
	part_of(s, pg)->pages++;
	s->ns_pages[ns]++;
	s->ns_bytes[ns] += s->cls[ci].slot_bytes;
	if (gen > s->gen)
		s->gen = gen;
	return 0;
}

/* Takes [off, off + len) out of arena a's free extents; -EEXIST when any of it is not free. */
static int ext_take_at(struct store *s, uint32_t a, uint64_t off, uint64_t len)
{
	struct store_arena *ar = &s->ar[a];

	for (uint32_t i = 0; i < ar->next; i++) {
		struct store_ext *e = &ar->ext[i];

		if (e->off > off || e->off + e->len < off + len)
			continue;
		if (e->off == off) {
			e->off += len;
			e->len -= len;
			if (!e->len) {
				memmove(e, e + 1, (ar->next - i - 1) * sizeof(*e));
				ar->next--;
			}
		} else if (e->off + e->len == off + len) {
			e->len -= len;
		} else { /* a hole in the middle: the tail becomes an extent of its own */
			struct store_ext tail = {off + len, e->off + e->len - off - len};

			if (ar->next == ar->cap)
				return -ENOSPC;
			e->len = off - e->off;
			memmove(e + 2, e + 1, (ar->next - i - 1) * sizeof(*e));
			e[1] = tail;
			ar->next++;
		}
		ar->free_bytes -= len;
		return 0;
	}
	return -EEXIST;
}

int store_adopt_slab(struct store *s, uint32_t sid, uint32_t a, uint64_t off, uint64_t len, int ci)
{
	struct store_class *c;
	struct slab *sl;
	uint32_t n;
	int err;

	if (sid >= STORE_MAX_SLABS || a >= s->pool->narenas || ci < 0 || (uint32_t)ci >= s->ncls)
		return -EINVAL;
	c = &s->cls[ci];
	n = (uint32_t)(len / c->slot_bytes);
	if (!n || len % c->slot_bytes || off % STORE_SLOT_ALIGN || n >= 1u << STORE_SLOT_BITS)
		return -EINVAL;
	sl = &s->slabs[sid];
	if (sid < s->nslabs && sl->cls >= 0)
		return -EEXIST;
	err = ext_take_at(s, a, off, len);
	if (err)
		return err;
	if (slab_pages_alloc(sl, sid, ci, n)) {
		ext_free(s, a, off, len);
		return -ENOMEM;
	}
	for (uint32_t k = s->nslabs; k < sid; k++)
		s->slabs[k].cls = -1; /* records skipped over: unused */
	if (sid >= s->nslabs)
		s->nslabs = sid + 1;
	/* [slab-pin] Hooks are set after adoption (store_pin_hooks registers these), but a slab
	 * adopted with them set is registered as a made one is. */
	if (s->pool->sparse && s->pin && s->pin(s->pin_arg, slab_base(s, a, off), len)) {
		s->st.pin_failed++;
		free(sl->pages);
		free(sl->free_stack);
		sl->pages = NULL;
		sl->free_stack = NULL;
		sl->cls = -1; /* unused: store_adopt_done lists it free */
		ext_free(s, a, off, len);
		return -ENOMEM;
	}
	if (s->pool->sparse) { /* [tenant-lend] its memory is there: counted again */
		s->resident[arena_slot(s, a)] += len;
		s->part[s->pool->arena[a].part].resident += len;
		s->ar[a].resident += len;
		s->st.resident += len;
	}
	sl->arena = a;
	sl->off = off;
	sl->len = len;
	sl->nslots = n;
	sl->nfree = 0; /* store_adopt_done fills the free stack */
	sl->used = 0;
	sl->pinned = sl->writing = 0;
	sl->cls = ci;
	list_init(&sl->link);
	list_init(&sl->elink);
	list_add_tail(&c->partial[a], &sl->link);
	c->slabs++;
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
	s->nrec_free = 0; /* slab_release above pushed some: rebuilt whole */
	for (uint32_t k = s->nslabs; k-- > 0;)
		if (s->slabs[k].cls < 0)
			s->rec_free[s->nrec_free++] = k;
	free_count(s);
	/* [tenant-lend] Memory outside the adopted slabs (a slab its broker had not recorded yet
	 * when it died) goes back: what is resident is exactly what is counted. */
	for (uint32_t a = 0; s->pool->sparse && a < s->pool->narenas; a++)
		for (uint32_t i = 0; i < s->ar[a].next; i++)
			(void)fallocate(s->pool->arena[a].fd,
					FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
					(off_t)s->ar[a].ext[i].off, (off_t)s->ar[a].ext[i].len);
}

int store_pin_hooks(struct store *s, int (*pin)(void *arg, void *base, uint64_t len),
		    void (*unpin)(void *arg, void *base, uint64_t len), void *arg)
{
	if (!s->pool->sparse)
		return 0;
	for (uint32_t k = 0; k < s->nslabs; k++) {
		const struct slab *sl = &s->slabs[k];
		int err;

		if (sl->cls < 0 || !sl->len)
			continue;
		err = pin(arg, slab_base(s, sl->arena, sl->off), sl->len);
		if (!err)
			continue;
		s->st.pin_failed++;
		while (k-- > 0) {
			sl = &s->slabs[k];
			if (sl->cls >= 0 && sl->len)
				unpin(arg, slab_base(s, sl->arena, sl->off), sl->len);
		}
		return err;
	}
	s->pin = pin;
	s->unpin = unpin;
	s->pin_arg = arg;
	return 0;
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
	/* Clients map only their partition's arenas, numbered from 0 there [tenant-part]. */
	uint32_t local = sl->arena - s->pool->part[s->pool->arena[sl->arena].part].first;

	return KVB_LOC(local, sl->off + (uint64_t)slot_of(pg) * s->cls[sl->cls].slot_bytes);
}

struct waitq *store_waiters(struct page *pg)
{
	if (!pg->waiters) {
		pg->waiters = malloc(sizeof(*pg->waiters));
		if (!pg->waiters)
			return NULL;
		waitq_init(pg->waiters);
	}
	return pg->waiters;
}
