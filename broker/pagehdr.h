/* SPDX-License-Identifier: MIT */
/*
 * pagehdr.h - the pool's side table: what lets a broker adopt a dead (or retiring) broker's RAM
 * pool. One broker-private memfd (never sent to a client) next to the arenas, holding the
 * pool's geometry, the namespace table and one header per page slot. See pagehdr.c for the
 * format and what a crash can leave.
 */
#ifndef KVB_BROKER_PAGEHDR_H
#define KVB_BROKER_PAGEHDR_H

#include <assert.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbroker.h"
#include "wire.h"

#define PMETA_MAGIC 0x314154454d42564bull /* "KVBMETA1" little-endian */
/* 3: pmeta_arena.dir_units [dir]; a version 2 table (no directory, and what a pool without one
 * is still written as) is adopted too, and a broker that knows only 2 refuses a 3, so it never
 * writes slots under a directory it ignores. */
#define PMETA_VERSION 3
#define PMETA_VERSION_NODIR 2  /* what a pool without a directory is still written as */
#define PHDR_MAGIC 0x5048564bu /* "KVHP" */
#define PHDR_UNIT 4096u	       /* one header per 4 KiB of the pool: every slot starts on one */
#define PMETA_NS_MAX 8192u     /* STORE_MAX_NS (store.c checks they agree) */
#define PMETA_SLABS_MAX 4096u  /* > STORE_MAX_SLABS (store.c checks) */
#define PMETA_MAX_ARENAS (KVB_MAX_ARENAS * 8u) /* POOL_MAX_ARENAS (pool.c checks) */

/* One arena as the superblock records it: enough to map and place it again. */
struct pmeta_arena {
	uint64_t size;	    /* bytes (the memfd's size) */
	uint64_t page_size; /* 4096, 2 MiB or 1 GiB */
	int32_t node;	    /* NUMA node, -1 none */
	uint32_t backing;   /* enum hp_backing */
	uint32_t tenant;    /* its tenant partition (pool_arena.part) [tenant-part] */
	uint32_t dir_units; /* [dir] its first dir_units * 4 KiB are its partition's directory */
};

/* Block 0 of the side table. Written once at creation, before any header. */
struct pmeta_super {
	uint64_t magic;	     /* PMETA_MAGIC */
	uint32_t version;    /* PMETA_VERSION */
	uint32_t narenas;    /* arenas handed over with it, in this order */
	uint64_t slab_bytes; /* the store's --slab (slab extents are recorded, not derived) */
	uint64_t ns_off;     /* byte offset of the namespace table */
	uint64_t slab_off;   /* byte offset of the slab table */
	uint64_t hdr_off;    /* byte offset of the slot headers */
	uint64_t size;	     /* bytes of the side table */
	uint8_t pool_id[16]; /* random at creation: logs tell pools apart */
	uint64_t created;    /* unix seconds */
	struct pmeta_arena arena[PMETA_MAX_ARENAS];
	uint32_t resv[5]; /* resv[0]: PMETA_SPARSE or 0; the rest 0 */
	uint32_t crc;	  /* crc32c of the bytes before it */
};
#define PMETA_SPARSE 1u /* [tenant-lend] partitions whose memory the slabs take (pool.h) */

/* A namespace, written when it is first opened (ns.c); its index is its id. */
struct pmeta_ns {
	uint32_t magic;	 /* PHDR_MAGIC when in use */
	uint32_t tenant; /* as passed to ns_open2 */
	uint64_t page_bytes;
	uint8_t ident[32]; /* ns.c's identity: checked again on adoption */
	struct kvb_layout layout;
	struct kvb_ns_ident idf;
	uint32_t resv[3]; /* 0 */
	uint32_t crc;	  /* crc32c of the bytes before it */
};

/*
 * A slab as the store carved it (its record id is its index): slabs vary in size and place
 * (store.c's extents), so an adopter re-carves each one exactly where it was. Written before
 * any header of it, cleared when the slab goes back to its arena.
 */
struct pmeta_slab {
	uint32_t magic; /* PHDR_MAGIC when in use */
	uint32_t arena;
	uint64_t off; /* byte offset in the arena, 4 KiB-aligned */
	uint64_t len; /* nslots * slot_bytes */
	uint32_t slot_bytes;
	uint32_t crc; /* crc32c of the bytes before it */
};
static_assert(sizeof(struct pmeta_slab) == 32, "slab record layout");

/*
 * The header of the slot that starts at 4 KiB unit u of the pool (units numbered arena by
 * arena: unit0 of arena a + offset / 4096): written at commit, when the page's bytes are
 * complete, and cleared when the slot is freed.
 */
struct pmeta_hdr {
	uint32_t magic;	     /* PHDR_MAGIC; 0 for a slot that holds no committed page */
	uint16_t ns;	     /* namespace id (index in the namespace table) */
	uint16_t resv0;	     /* 0 */
	uint32_t slot_bytes; /* the slab's class when written: its slab record must agree */
	uint32_t len;	     /* bytes the payload crc covers (slot_bytes) */
	uint64_t gen;	     /* the page's generation: of two copies of a key the newer wins */
	kvb_key key;
	uint32_t crc;	  /* crc32c of the len bytes of the slot */
	uint32_t hdr_crc; /* crc32c of the bytes before it */
};
static_assert(sizeof(struct pmeta_hdr) == 64, "page header layout");
static_assert(offsetof(struct pmeta_hdr, hdr_crc) == 60, "page header layout");

/* Bytes of a side table for a pool of units 4 KiB units. */
uint64_t pmeta_size(uint64_t units);

/* Fills and seals the superblock at meta (the caller filled narenas, arena[], slab_bytes). */
void pmeta_super_init(void *meta, uint64_t size);
/* 0 when the superblock at meta (size bytes mapped) is intact and consistent, else -EINVAL. */
int pmeta_super_check(const void *meta, uint64_t size);

static inline struct pmeta_hdr *pmeta_hdr_at(void *meta, uint64_t unit)
{
	const struct pmeta_super *sb = meta;

	return (struct pmeta_hdr *)((char *)meta + sb->hdr_off) + unit;
}

/* Records slab record sid (the caller checked sid < PMETA_SLABS_MAX). */
void pmeta_slab_write(void *meta, uint32_t sid, uint32_t arena, uint64_t off, uint64_t len,
		      uint32_t slot_bytes);
void pmeta_slab_clear(void *meta, uint32_t sid);
/* Slab record sid, NULL when none or damaged. */
const struct pmeta_slab *pmeta_slab_get(const void *meta, uint32_t sid);

/* Records namespace id (tenant, layout, identity fields as normalised, identity). */
void pmeta_ns_write(void *meta, uint32_t id, uint32_t tenant, uint64_t page_bytes,
		    const uint8_t ident[32], const struct kvb_layout *l,
		    const struct kvb_ns_ident *idf);
/* The record of namespace id, NULL when none or damaged. */
const struct pmeta_ns *pmeta_ns_get(const void *meta, uint32_t id);

/* Seals h over the payload at page (h's other fields filled by the caller). */
void pmeta_hdr_seal(struct pmeta_hdr *h, const void *page);
/* The same with the payload's crc32c computed already (by the copy worker that wrote it). */
void pmeta_hdr_seal_crc(struct pmeta_hdr *h, uint32_t crc);

/* One slab for pmeta_scan: its bytes, the unit of its slot 0, its geometry; kept: out. */
struct pmeta_scan_slab {
	const char *base;
	uint64_t unit;
	uint32_t slot_bytes, nslots;
	uint32_t kept;
};

/*
 * Scans the slot headers of n slabs in parallel (threads up to the CPUs, at most 16) and clears
 * each one that does not vouch for its slot: bad magic or crc, a slot_bytes its slab disagrees
 * with, an unknown namespace, a payload whose crc fails. Afterwards every header left at a slot
 * of those slabs is a committed, intact page. Returns pages kept; *torn gets headers cleared for
 * a failed crc (a page cut short).
 */
uint64_t pmeta_scan(void *meta, struct pmeta_scan_slab *sl, uint64_t n, uint64_t *torn);

#endif /* KVB_BROKER_PAGEHDR_H */
