/* SPDX-License-Identifier: MIT */
/*
 * store.h - the page store: slab allocator, page records, index and eviction over the pool.
 * See store.c for the states and the eviction policy. Loop thread only.
 */
#ifndef KVB_BROKER_STORE_H
#define KVB_BROKER_STORE_H

#include <stdint.h>

#include "dir.h"
#include "hist.h"
#include "index.h"
#include "kvbroker.h"
#include "list.h"
#include "pool.h"

struct waitq;
#define STORE_MAX_CLASSES 64
#define STORE_MAX_NS 8192  /* namespaces alive at once; ids of freed ones are reused */
#define STORE_SLOT_BITS 20 /* slots per slab < 2^20 */
#define STORE_MAX_SLABS ((1u << (32 - STORE_SLOT_BITS)) - 1) /* slab ids fit in the rest */
#define STORE_SLOT_ALIGN 4096u
#define STORE_MAX_PAGE (16ull << 20) /* pages up to this size whatever --slab says */

enum page_state {
	PAGE_FREE = 0,
	PAGE_WRITING = 1, /* allocated, being filled: not served, not evictable */
	PAGE_READY = 2,	  /* complete and immutable */
};

struct page {
	union {
		struct ixnode ixn; /* its entry in the store's index: chain, key, namespace */
		struct {
			struct ixnode *ixn_next_;
			kvb_key key;
			uint32_t ns;
		};
	};
	uint32_t id;	  /* slab << STORE_SLOT_BITS | slot */
	uint32_t gen;	  /* from store->gen at allocation, 0 when free: stale lease ids fail */
	uint32_t pins;	  /* leases + in-flight copies; > 0 means not evictable */
	uint8_t state;	  /* enum page_state */
	uint8_t unlinked; /* dropped from the index while pinned: freed at the last unpin */
	uint16_t cls;
	uint8_t clean;	  /* a complete copy is on disk: evicting it loses nothing */
	uint8_t demoting; /* being written to disk: READY, pinned by the tier */
	uint8_t rflags;	  /* the remote tier's (remote.c): being fetched, published */
	uint8_t held;	  /* [chain] off the LRUs: met at their cold end with kids > 0 */
	/*
	 * [chain] The page this one continues (PUT with a parent key): its id and generation, so
	 * that a parent freed and its slot reused is never mistaken for it (parent_gen 0: none).
	 */
	uint32_t parent;
	uint32_t parent_gen;
	uint32_t kids;	  /* indexed pages naming this one as parent: evicted after them */
	uint32_t born;	  /* [hist] when it became READY: tenths of a second after store_init */
	struct list lru;  /* its partition's LRU: on it iff READY, unpinned, linked, not held */
	struct list clru; /* its class's LRU, same condition */
	struct list nlru; /* its namespace's LRU, same condition (--ns-limit) */
	struct waitq *waiters; /* ops parked until its next state change (ops.c), NULL: none */
};

struct slab {
	uint32_t arena;
	int32_t cls;  /* -1: record unused */
	uint64_t off; /* byte offset in the arena */
	uint64_t len; /* nslots * its class's slot_bytes, exactly */
	uint32_t nslots;
	uint32_t used;
	uint32_t nfree;	  /* entries in free_stack */
	uint32_t pinned;  /* its pages with pins > 0 (leased, being written, copy in flight) */
	uint32_t writing; /* its pages in PAGE_WRITING (kvbctl map's in-flight cells) */
	uint32_t *free_stack;
	struct page *pages; /* nslots records, allocated when assigned to a class */
	struct list link;   /* its class's partial list in its arena, when it has a free slot */
	struct list elink;  /* [tenant-lend] the store's empty slabs, while it has no page */
};

struct store_class {
	uint64_t slot_bytes;
	uint32_t slots_per_slab; /* of a full slab: about --slab bytes, at least one slot */
	uint32_t slabs;
	struct list partial[POOL_MAX_ARENAS]; /* per arena: slabs of this class with a free slot */
	struct list lru[POOL_MAX_PARTS];      /* per partition: its evictable pages, coldest last */
};

/* A free range of an arena (store.c keeps them sorted by offset, coalesced). */
struct store_ext {
	uint64_t off, len;
};

struct store_arena {
	struct store_ext *ext;
	uint32_t next, cap;
	uint64_t free_bytes;
	uint64_t resident; /* [tenant-lend] sparse: bytes of its slabs */
};

/* A tenant partition's share of the store [tenant-part]: its own LRU, usage and watermarks. */
struct store_part {
	struct list lru; /* its evictable pages, coldest at the tail */
	uint64_t bytes_total, bytes_used, high_bytes, low_bytes;
	uint64_t pinned_bytes;	 /* slot bytes of its pages with pins > 0 */
	uint64_t demoting_bytes; /* slot bytes being written to disk, freed when written */
	uint64_t pages, evictions;
	const struct page *warmed; /* [evict-prefetch] the coldest page last prefetched */
	/*
	 * [tenant-lend] In a sparse pool: bytes of its slabs (the memory it holds), and what it can
	 * always reclaim from partitions above theirs (tenant.c sets it). Above its guarantee it
	 * borrows: its slabs are the first taken back when a partition under its guarantee needs
	 * memory (oldest page's slab first), and with a guarantee of 0 (a released tenant) before
	 * any other partition evicts its own pages.
	 */
	uint64_t resident, guarantee;
	uint64_t lent_back; /* slabs of it reclaimed for another partition */
	int ahead_cls;	    /* [evict-ahead] class + 1 of the last PUT that evicted, or 0 */
};

struct store_stats {
	uint64_t bytes_used; /* slot bytes in use */
	uint64_t pages;	     /* records not FREE */
	uint64_t evictions;
	uint64_t slabs_free;
	uint64_t pinned; /* pages with pins > 0 */
	/* [chain] */
	uint64_t chain_links;  /* PUTs linked to a parent in RAM */
	uint64_t held;	       /* parents taken off the LRUs because they still had kids */
	uint64_t chain_cuts;   /* parents evicted with kids (slab reclaim with nothing else left) */
	uint64_t ns_evictions; /* pages a namespace over its --ns-limit evicted of its own */
	uint64_t lend_reclaims; /* [tenant-lend] borrowers' slabs taken back */
	uint64_t resident;	/* [tenant-lend] bytes of slabs in a sparse pool */
	uint64_t alloc_failed;	/* [tenant-lend] slabs whose memory the kernel refused */
	uint64_t pin_failed;	/* [slab-pin] slabs the GPU driver would not register */
	uint64_t empty_bytes;	/* [tenant-lend] bytes of empty slabs kept (store.c) */
};

struct store {
	struct pool *pool;
	uint64_t slab_bytes; /* --slab: the size a class's slabs aim at */
	uint64_t max_page;   /* the largest page a class may hold */
	uint32_t nslabs;     /* slab records ever used: slabs[0, nslabs) */
	struct slab *slabs;  /* STORE_MAX_SLABS records */
	uint32_t *rec_free;  /* unused record ids below nslabs */
	uint32_t nrec_free;
	struct store_arena ar[POOL_MAX_ARENAS];
	struct store_part part[POOL_MAX_PARTS];
	/* [tenant-lend] Sparse pool: slab bytes in the i-th arena of every partition together,
	 * at most pool->budget[i]. */
	uint64_t resident[KVB_MAX_ARENAS];
	struct list empty; /* [tenant-lend] empty slabs kept with their memory, oldest first */
	uint8_t ns_part[STORE_MAX_NS]; /* the partition each namespace's pages go to */
	struct store_class cls[STORE_MAX_CLASSES];
	uint32_t ncls;
	struct index ix;
	uint32_t gen; /* last generation handed out */
	uint64_t high_bytes, low_bytes;
	struct store_stats st;
	/*
	 * [hist] Page age at eviction from RAM, unless hist_off. t0: store_init's clock; now: the
	 * loop's, set at each of its ticks (a few ms stale at most), so that stamping a page and
	 * timing an eviction read no clock on the data path.
	 */
	struct hist evict_age;
	uint8_t hist_off;
	double t0, now;
	uint64_t ns_pages[STORE_MAX_NS];
	/*
	 * [ns-limit] Per namespace: slot bytes in RAM, the cap (0: none; set when it opens, from
	 * --ns-limit), bytes being demoted (they count as gone), and its LRU, coldest last.
	 */
	uint64_t ns_bytes[STORE_MAX_NS];
	uint64_t ns_limit[STORE_MAX_NS];
	uint64_t ns_demoting[STORE_MAX_NS];
	struct list ns_lru[STORE_MAX_NS];
	/*
	 * [tier-seam] The disk tier (tier.c). evict() offers it every page without a copy on
	 * disk: it returns 1 when it starts writing the page (which stays READY and readable,
	 * pinned, until store_demote_done), 0 to have it dropped (no usable disk), -EBUSY to
	 * leave it where it is for now (I/O queue full).
	 */
	int (*demote)(void *arg, struct page *pg);
	void *demote_arg;
	/*
	 * The remote tier (remote.c, --remote-publish evict): evict() offers it every page about
	 * to leave RAM (dropped or demoted), READY and unpinned, its bytes still there.
	 */
	void (*leaving)(void *arg, struct page *pg);
	void *leaving_arg;
	/*
	 * [page-wake] Every change of a page's state that someone may wait for (commit, abort,
	 * demotion done, freed) calls wake(wake_arg, pg) when pg->waiters is set: ops.c moves
	 * its waiters to the run queue (never runs them from inside the store).
	 */
	void (*wake)(void *arg, struct page *pg);
	void *wake_arg;
	/*
	 * [told-lru] Before the store picks pages to evict by their age: what clients told us
	 * and we have not read yet (reads through the directory and their hazard tables warm
	 * their pages, RELEASEs unpin them), session.c. Returns 1 when that unpinned a page.
	 */
	int (*told)(void *arg);
	void *told_arg;
	/*
	 * [hazard] A READY page left the index and the directory (unindex): ops.c may pin it for
	 * the clients reading it under their hazard tables (wire.h). Whoever frees the slot then
	 * checks pins first (evict, store_drop, the unpin that frees an unlinked page).
	 */
	void (*withdrawn)(void *arg, struct page *pg);
	void *withdrawn_arg;
	/* [ns-free] The last page of namespace ns left RAM (ns_pages[ns] is 0 now). */
	void (*ns_empty)(void *arg, uint32_t ns);
	void *ns_empty_arg;
	/*
	 * [slab-pin] A sparse pool's slabs registered with the GPU copy engine (xfer.c sets these
	 * through store_pin_hooks): pin(pin_arg, base, len) right after a slab's memory is taken,
	 * where a failure makes the slab not made (as a failed fallocate: the PUT evicts or is
	 * refused), and unpin before its memory is given back: a hole punched under a
	 * registration would leave the GPU the old pages. Only slabs are ever registered; the
	 * free ranges that the scrub and the adopter punch never are. NULL: nothing to pin.
	 */
	int (*pin)(void *arg, void *base, uint64_t len);
	void (*unpin)(void *arg, void *base, uint64_t len);
	void *pin_arg;
	uint64_t demoting_bytes; /* slot bytes being written to disk, freed when written */
	/* [dir] Each partition's directory (dir.c), in the bytes its first arena reserves for it
	 * (pool_arena.dir_bytes): committed pages enter it, pages leaving the index leave it. */
	struct dir dir[POOL_MAX_PARTS];
};

/*
 * Sets the store up over the pool; classes' slabs aim at slab_bytes. Watermarks are fractions
 * of each partition. -EINVAL for a slab size that is not a 4 KiB multiple.
 */
int store_init(struct store *s, struct pool *p, uint64_t slab_bytes, double high, double low);

/*
 * Pages a partition of these arena sizes holds when filled with pages of one size (slabs of
 * about slab_bytes): what store_alloc achieves, for kvbctl plan (common/plan.c computes the
 * same) and the tests.
 */
uint64_t store_capacity(const uint64_t *arena_bytes, uint32_t narenas, uint64_t slab_bytes,
			uint64_t page_bytes);
void store_fini(struct store *s);

/* The class of a page size (created on first use). -E2BIG above max_page, -EMFILE when every
 * class slot is taken. */
int store_class_get(struct store *s, uint64_t page_bytes);

/* The record of (ns, key) in any state but FREE, or NULL. */
struct page *store_find(struct store *s, uint32_t ns, const kvb_key *key);

/*
 * Where a new page should go: arenas in order of preference (nearest NUMA node first), all of
 * them (numa_order). A page goes to the first arena with a free slot of its class or a free
 * slab; only when every arena is full is the coldest page evicted, wherever it is.
 */
struct store_pref {
	uint32_t n;
	uint8_t arena[KVB_MAX_ARENAS];
};

/* The partition of a page (its slab's arena's). */
uint32_t store_part_of(const struct store *s, const struct page *pg);

/*
 * Allocates a slot of class cls for (ns, key), evicting the coldest evictable pages of the
 * namespace's partition (ns_part) when needed, and indexes it WRITING with one pin held by the
 * caller. The caller checked (ns, key) is absent. pref NULL: the partition's arenas in index
 * order; arenas of other partitions in pref are skipped. -ENOSPC when nothing can be evicted.
 */
int store_alloc_pref(struct store *s, int cls, uint32_t ns, const kvb_key *key,
		     const struct store_pref *pref, struct page **out);
static inline int store_alloc(struct store *s, int cls, uint32_t ns, const kvb_key *key,
			      struct page **out)
{
	return store_alloc_pref(s, cls, ns, key, (const struct store_pref *)0, out);
}

/*
 * [chain] Links a page just allocated (WRITING, from store_alloc, not linked yet) to its parent:
 * the indexed page of (pg's namespace, parent) in RAM, READY or still being written. The parent
 * is not evicted while pg is indexed. Links only ever point at pages allocated before the one
 * linking (the generation check makes a freed parent's reused slot no parent), so chains have
 * no cycles. Returns 1 linked, 0 no parent in RAM (or parent == pg's own key).
 */
int store_link_parent(struct store *s, struct page *pg, const kvb_key *parent);

/* [chain] The parent pg links to, NULL when none (never linked, or freed since). */
struct page *store_parent(struct store *s, const struct page *pg);

/* [ns-limit] Caps namespace ns at bytes of slots in RAM (0: no cap). */
void store_ns_limit(struct store *s, uint32_t ns, uint64_t bytes);
/*
 * [ns-limit] Evicts namespace ns's coldest pages (demoting them where there is a disk tier)
 * until it is within its cap, as its next PUT would: after the cap was lowered at run time.
 * 0, or -ENOSPC when what is left over it is pinned (trimmed by its next PUTs).
 */
int store_ns_trim(struct store *s, uint32_t ns);

/* The arena a page's slot is in. */
uint32_t store_arena(const struct store *s, const struct page *pg);

/* WRITING -> READY, drops the writer's pin. */
void store_commit(struct store *s, struct page *pg);
/* The same, with the slot's crc32c already computed (by its copy worker), or NULL. */
void store_commit_crc(struct store *s, struct page *pg, const uint32_t *crc);
/*
 * store_commit_crc in two steps ([cqe-first], xfer.c): the slot's header first, which a broker
 * adopting the pool after a crash trusts, then the rest (READY, the directory, waiters).
 */
void store_seal(struct store *s, struct page *pg, const uint32_t *crc);
void store_commit_sealed(struct store *s, struct page *pg);

/* A failed write: unindex and free (drops the writer's pin). */
void store_abort(struct store *s, struct page *pg);

void store_touch(struct store *s, struct page *pg);
void store_pin(struct store *s, struct page *pg);
void store_unpin(struct store *s, struct page *pg);

/* Unindexes; the slot is freed now, or at the last unpin. */
void store_drop(struct store *s, struct page *pg);

/* Evicts coldest pages of each partition above its high watermark, down to its low one, at
 * most max pages per call (so the loop stays responsive). Returns pages evicted. */
uint32_t store_evict_watermark(struct store *s, uint32_t max);

/*
 * [evict-prefetch] Asks for what evicting each partition's coldest page touches (its index
 * bucket and directory bucket): for the loop while it waits for work.
 */
void store_prefetch_victims(struct store *s);
/* [evict-ahead] While idle: one free slot for the next PUT of a full partition. */
void store_evict_ahead(struct store *s);

/*
 * [tenant-lend] A sparse pool's memory, checked against the slabs (once a second,
 * on the loop's tick): an arena holding more than its slabs and directory (a client's read of
 * a stale location faults a page into a hole: tmpfs fills holes on faults) has its free ranges
 * punched again. Returns the bytes given back.
 */
uint64_t store_sparse_scrub(struct store *s);

/*
 * [tenant-rebind] Drops every page of partition part (index, directory, side table) and gives
 * every slab of it back, so that its arenas hold nothing but their directory. -EBUSY, with
 * nothing dropped, when a page of it is pinned or being written; -EBUSY too when a client's
 * hazard table pinned a page as it left (that page goes at its last unpin: try again later).
 */
int store_part_clear(struct store *s, uint32_t part);
/* [tenant-rebind] Partition part's directory made again, empty, in its (new) first arena. */
void store_part_dir_reset(struct store *s, uint32_t part);

/* [tenant-lend] Bytes the memfd of arena a holds now (st_blocks), for stats and the tests. */
uint64_t store_arena_rss(const struct store *s, uint32_t a);

/*
 * The disk tier finished writing a page it took from evict(). ok: the copy on disk is complete;
 * the page leaves RAM now, unless a lease or a copy pinned it meanwhile (then it stays, clean).
 * Not ok: it stays, dirty, and becomes evictable again. Drops the tier's pin.
 */
void store_demote_done(struct store *s, struct page *pg, int ok);

/*
 * [adopt] Installs a page an adopted pool holds (adopt.c): slot slot of slab sid, of class ci,
 * READY and evictable, at the hot end of the LRU (adopt coldest first), in the slab's
 * partition. -EINVAL for a slab of another class or a slot past its end, -EEXIST for a slot
 * taken. The caller checked that (ns, key) is absent. After the last page, store_adopt_done()
 * rebuilds the slabs' free slots and records.
 */
/*
 * [adopt] Carves slab record sid exactly where the side table says it was: [off, off + len) of
 * arena a, slots of class ci (before its pages, store_adopt_page). -EEXIST when the record or
 * any of those bytes is taken, -EINVAL for a geometry that does not fit, -ENOMEM.
 */
int store_adopt_slab(struct store *s, uint32_t sid, uint32_t a, uint64_t off, uint64_t len, int ci);
int store_adopt_page(struct store *s, uint32_t sid, int ci, uint32_t slot, uint32_t ns,
		     const kvb_key *key, uint32_t gen);
void store_adopt_done(struct store *s);

/*
 * [slab-pin] Registers every slab of a sparse pool with pin (the adopted ones, at start-up), then
 * sets the hooks so that every slab made or given back from now on is. 0, or the first
 * failure's errno with nothing left registered and no hook set. A pool that is not sparse: 0,
 * nothing done (its engine registers the arenas whole).
 */
int store_pin_hooks(struct store *s, int (*pin)(void *arg, void *base, uint64_t len),
		    void (*unpin)(void *arg, void *base, uint64_t len), void *arg);

/* Page record by id, NULL when the id names no allocated slot (ids come from clients). */
struct page *store_by_id(struct store *s, uint32_t id);

void *store_addr(const struct store *s, const struct page *pg);
uint64_t store_loc(const struct store *s, const struct page *pg);

static inline uint64_t store_lease_id(const struct page *pg)
{
	return ((uint64_t)pg->gen << 32) | pg->id;
}

/*
 * The wait queue of pg's next state change (committed, aborted, freed), made at the first
 * waiter; NULL without memory. A tier answers "wait on it" (waitq.h); the store wakes it
 * through its wake hook.
 */
struct waitq *store_waiters(struct page *pg);

#endif /* KVB_BROKER_STORE_H */
