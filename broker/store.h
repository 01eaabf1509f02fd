/* SPDX-License-Identifier: MIT */
/*
 * store.h - the page store: slab allocator, page records, index and eviction over the pool.
 * See store.c for the states and the eviction policy. Loop thread only.
 */
#ifndef KVB_BROKER_STORE_H
#define KVB_BROKER_STORE_H

#include <stdint.h>

#include "index.h"
#include "kvbroker.h"
#include "list.h"
#include "pool.h"

struct waitq;
#define STORE_MAX_CLASSES 64
#define STORE_MAX_NS 1024
#define STORE_SLOT_BITS 20 /* slots per slab < 2^20 */
#define STORE_SLOT_ALIGN 4096u

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
	uint8_t resv;
	struct list lru;       /* global LRU: on it iff READY, unpinned, linked */
	struct list clru;      /* its class's LRU, same condition */
	struct waitq *waiters; /* ops parked until its next state change (ops.c), NULL: none */
};

struct slab {
	uint32_t arena;
	int32_t cls;  /* -1 when free */
	uint64_t off; /* byte offset in the arena */
	uint32_t nslots;
	uint32_t used;
	uint32_t nfree;	  /* entries in free_stack */
	uint32_t pinned;  /* its pages with pins > 0 (leased, being written, copy in flight) */
	uint32_t writing; /* its pages in PAGE_WRITING (kvbctl map's in-flight cells) */
	uint32_t *free_stack;
	struct page *pages; /* nslots records, allocated when assigned to a class */
	struct list link;   /* its arena's free-slab list, or its class's partial list there */
};

struct store_class {
	uint64_t slot_bytes;
	uint32_t slots_per_slab;
	uint32_t slabs;
	struct list partial[KVB_MAX_ARENAS]; /* per arena: slabs of this class with a free slot */
	struct list lru;		     /* its evictable pages, coldest at the tail */
};

struct store_stats {
	uint64_t bytes_used; /* slot bytes in use */
	uint64_t pages;	     /* records not FREE */
	uint64_t evictions;
	uint64_t slabs_free;
	uint64_t pinned; /* pages with pins > 0 */
};

struct store {
	struct pool *pool;
	uint64_t slab_bytes;
	uint32_t nslabs;
	struct slab *slabs;
	struct list free_slabs[KVB_MAX_ARENAS]; /* per arena */
	struct store_class cls[STORE_MAX_CLASSES];
	uint32_t ncls;
	struct list lru; /* every evictable page, coldest at the tail */
	struct index ix;
	uint32_t gen; /* last generation handed out */
	uint64_t high_bytes, low_bytes;
	struct store_stats st;
	uint64_t ns_pages[STORE_MAX_NS];
	/*
	 * [tier-seam] The disk tier (tier.c). evict() offers it every page without a copy on
	 * disk: it returns 1 when it starts writing the page (which stays READY and readable,
	 * pinned, until store_demote_done), 0 to have it dropped (no usable disk), -EBUSY to
	 * leave it where it is for now (I/O queue full).
	 */
	int (*demote)(void *arg, struct page *pg);
	void *demote_arg;
	/*
	 * [page-wake] Every change of a page's state that someone may wait for (commit, abort,
	 * demotion done, freed) calls wake(wake_arg, pg) when pg->waiters is set: ops.c moves
	 * its waiters to the run queue (never runs them from inside the store).
	 */
	void (*wake)(void *arg, struct page *pg);
	void *wake_arg;
	uint64_t demoting_bytes; /* slot bytes being written to disk, freed when written */
};

/* Carves the pool into slabs of slab_bytes. Watermarks are fractions of the pool. */
int store_init(struct store *s, struct pool *p, uint64_t slab_bytes, double high, double low);
void store_fini(struct store *s);

/* The class of a page size (created on first use). -E2BIG above the slab size, -EMFILE when
 * every class slot is taken. */
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

/*
 * Allocates a slot of class cls for (ns, key), evicting the coldest evictable pages when needed,
 * and indexes it WRITING with one pin held by the caller. The caller checked (ns, key) is absent.
 * pref NULL: arenas in index order. -ENOSPC when nothing can be evicted.
 */
int store_alloc_pref(struct store *s, int cls, uint32_t ns, const kvb_key *key,
		     const struct store_pref *pref, struct page **out);
static inline int store_alloc(struct store *s, int cls, uint32_t ns, const kvb_key *key,
			      struct page **out)
{
	return store_alloc_pref(s, cls, ns, key, (const struct store_pref *)0, out);
}

/* The arena a page's slot is in. */
uint32_t store_arena(const struct store *s, const struct page *pg);

/* WRITING -> READY, drops the writer's pin. */
void store_commit(struct store *s, struct page *pg);

/* A failed write: unindex and free (drops the writer's pin). */
void store_abort(struct store *s, struct page *pg);

void store_touch(struct store *s, struct page *pg);
void store_pin(struct store *s, struct page *pg);
void store_unpin(struct store *s, struct page *pg);

/* Unindexes; the slot is freed now, or at the last unpin. */
void store_drop(struct store *s, struct page *pg);

/* Evicts coldest pages while usage is above the high watermark, down to the low one, at most
 * max pages per call (so the loop stays responsive). Returns pages evicted. */
uint32_t store_evict_watermark(struct store *s, uint32_t max);

/*
 * The disk tier finished writing a page it took from evict(). ok: the copy on disk is complete;
 * the page leaves RAM now, unless a lease or a copy pinned it meanwhile (then it stays, clean).
 * Not ok: it stays, dirty, and becomes evictable again. Drops the tier's pin.
 */
void store_demote_done(struct store *s, struct page *pg, int ok);

/*
 * [adopt] Installs a page an adopted pool holds (adopt.c): slot slot of slab sid, of class ci,
 * READY and evictable, at the hot end of the LRU (adopt coldest first). The slab is given to
 * class ci if free. -EINVAL for a slab of another class or a slot past its end, -EEXIST for a
 * slot taken, -ENOMEM. The caller checked that (ns, key) is absent. After the last page,
 * store_adopt_done() rebuilds the slabs' free slots.
 */
int store_adopt_page(struct store *s, uint32_t sid, int ci, uint32_t slot, uint32_t ns,
		     const kvb_key *key, uint32_t gen);
void store_adopt_done(struct store *s);

/* Page record by id, NULL when the id names no allocated slot (ids come from clients). */
struct page *store_by_id(struct store *s, uint32_t id);

void *store_addr(const struct store *s, const struct page *pg);
uint64_t store_loc(const struct store *s, const struct page *pg);

static inline uint64_t store_lease_id(const struct page *pg)
{
	return ((uint64_t)pg->gen << 32) | pg->id;
}

#endif /* KVB_BROKER_STORE_H */
