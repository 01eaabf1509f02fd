/* SPDX-License-Identifier: MIT */
/*
 * index.h - hash table from (namespace, key) to page record. Chained through page->hnext;
 * the bucket array doubles when the load passes 2 (a full rehash: sized up front from the pool
 * so that it stays rare). Keys are SHA-256 outputs, so their first 8 bytes are already uniform;
 * the namespace is mixed in. Loop thread only.
 */
#ifndef KVB_BROKER_INDEX_H
#define KVB_BROKER_INDEX_H

#include <stdint.h>

#include "kvbroker.h"

struct page;

struct index {
	struct page **buckets;
	uint64_t mask;
	uint64_t count;
};

int index_init(struct index *ix, uint64_t expected);
void index_fini(struct index *ix);

static inline uint64_t index_hash(uint32_t ns, const kvb_key *key)
{
	uint64_t h;

	__builtin_memcpy(&h, key->b, sizeof(h));
	return (h ^ ((uint64_t)ns * 0x9e3779b97f4a7c15ull));
}

struct page *index_find(const struct index *ix, uint32_t ns, const kvb_key *key);
/* Inserts; the caller has checked that (ns, key) is absent. Never fails (growth is best effort). */
void index_insert(struct index *ix, struct page *pg);
void index_remove(struct index *ix, struct page *pg);

#endif /* KVB_BROKER_INDEX_H */
