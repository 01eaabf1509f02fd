/* SPDX-License-Identifier: MIT */
/*
 * index.h - hash table from (namespace, key) to page record. Chained through page->hnext; the
 * bucket array doubles when the load passes 2 (a full rehash: sized up front from the pool so
 * that it stays rare).
 *
 * Keys come from clients, and nothing proves that a key is the SHA-256 of real tokens: a
 * hostile client could choose keys that share a bucket and turn every lookup into a walk of one
 * long chain on the loop thread. So the bucket hash is keyed with a secret drawn at start-up:
 * pairwise multiply-add over the key's four 64-bit words (a universal hash family), which costs
 * a few multiplications instead of a full SipHash on the LOOKUP hot path. Loop thread only.
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
	uint64_t seed[6]; /* secret, from getrandom() */
};

int index_init(struct index *ix, uint64_t expected);
void index_fini(struct index *ix);

static inline uint64_t index_hash(const struct index *ix, uint32_t ns, const kvb_key *key)
{
	uint64_t w[4], h;

	__builtin_memcpy(w, key->b, sizeof(w));
	h = (w[0] + ix->seed[0]) * (w[1] + ix->seed[1]) +
	    (w[2] + ix->seed[2]) * (w[3] + ix->seed[3]) +
	    ((uint64_t)ns + ix->seed[4]) * ix->seed[5];
	/*
	 * Multiply-add hashing puts its entropy in the high bits and buckets take the low ones:
	 * a murmur3-style finalizer (a bijection) folds the former into the latter.
	 */
	h ^= h >> 33;
	h *= 0xff51afd7ed558ccdull;
	return h ^ (h >> 33);
}

struct page *index_find(const struct index *ix, uint32_t ns, const kvb_key *key);
/* Inserts; the caller has checked that (ns, key) is absent. Never fails (growth is best effort). */
void index_insert(struct index *ix, struct page *pg);
void index_remove(struct index *ix, struct page *pg);

#endif /* KVB_BROKER_INDEX_H */
