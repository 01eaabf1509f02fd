/* SPDX-License-Identifier: MIT */
/*
 * index.h - the broker's one hash table: (namespace, key) -> entry, intrusive. The store indexes
 * its page records with it (namespace ids), the disk tier its slots (namespace identities by
 * index): both embed a struct ixnode and get back what they put in. Chained through
 * ixnode.next; the bucket array doubles when the load passes 2 (sized up front from the pool or
 * the disk so that it stays rare). The doubling is incremental [rehash]: the old array's
 * chains move over a few buckets per insert and remove, and lookups look in both meanwhile.
 * All at once, 4 million entries held the loop thread for 0.4 s, every client with it (a disk
 * tier of 64 KiB pages grows at 32 million).
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

/*
 * An entry, embedded in what is indexed (struct page, the tier's struct dslot), which reach its
 * fields under their own names through an anonymous union (see struct page).
 */
struct ixnode {
	struct ixnode *next;
	kvb_key key;
	uint32_t ns; /* namespace id (store) or identity index (tier) */
};

struct index {
	struct ixnode **buckets;
	uint64_t mask;
	uint64_t count;
	uint64_t seed[6]; /* secret, from getrandom() */
	/* [rehash] While growing: the old array, whose buckets below moved are empty. */
	struct ixnode **old;
	uint64_t old_mask, moved;
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

struct ixnode *index_find(const struct index *ix, uint32_t ns, const kvb_key *key);

/* [rehash] The bucket that holds (ns, key) now: the old array's until that bucket moved. */
static inline struct ixnode **index_bucket(const struct index *ix, uint32_t ns, const kvb_key *key)
{
	uint64_t h = index_hash(ix, ns, key);

	if (ix->old && (h & ix->old_mask) >= ix->moved)
		return &ix->old[h & ix->old_mask];
	return &ix->buckets[h & ix->mask];
}

/* Asks for the bucket head of (ns, key) ahead of an index_find() or index_remove() there. */
static inline void index_prefetch(const struct index *ix, uint32_t ns, const kvb_key *key)
{
	__builtin_prefetch(index_bucket(ix, ns, key), 1);
}
/* Inserts; the caller has checked that (ns, key) is absent. Never fails (growth is best effort). */
void index_insert(struct index *ix, struct ixnode *n);
/* Removes n, which must be in ix. */
void index_remove(struct index *ix, struct ixnode *n);

#endif /* KVB_BROKER_INDEX_H */
