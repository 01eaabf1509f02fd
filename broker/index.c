// SPDX-License-Identifier: MIT
/*
 * index.c - the chained, intrusive hash table of the store and the disk tier; see index.h.
 * Lookups compare the namespace and all 32 key bytes: a hash collision never returns another
 * page.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "index.h"

int index_init(struct index *ix, uint64_t expected)
{
	uint64_t n = 1024;

	while (n < expected && n < (1ull << 32))
		n <<= 1;
	if (getrandom(ix->seed, sizeof(ix->seed), 0) != sizeof(ix->seed))
		return -EIO;
	ix->seed[5] |= 1; /* an odd multiplier keeps the namespace term a bijection */
	ix->buckets = calloc(n, sizeof(*ix->buckets));
	if (!ix->buckets)
		return -ENOMEM;
	ix->mask = n - 1;
	ix->count = 0;
	ix->old = NULL;
	ix->old_mask = ix->moved = 0;
	return 0;
}

void index_fini(struct index *ix)
{
	free(ix->buckets);
	free(ix->old);
	ix->buckets = ix->old = NULL;
}

struct ixnode *index_find(const struct index *ix, uint32_t ns, const kvb_key *key)
{
	struct ixnode *n = *index_bucket(ix, ns, key);

	for (; n; n = n->next)
		if (n->ns == ns && !memcmp(n->key.b, key->b, sizeof(key->b)))
			return n;
	return NULL;
}

/*
 * [rehash] Moves REHASH_STEP of the old array's buckets (more, up to REHASH_EMPTY, where they
 * are empty) into the new one; frees the old array after its last. A step is a few chains of
 * two nodes each, a microsecond at worst; the old array, half the new one, is gone after
 * (old buckets / REHASH_STEP) inserts and removes, long before the load could reach 2 again.
 */
#define REHASH_STEP 4
#define REHASH_EMPTY 64

static void rehash_step(struct index *ix)
{
	uint32_t full = 0, seen = 0;

	while (ix->moved <= ix->old_mask && full < REHASH_STEP && seen++ < REHASH_EMPTY) {
		struct ixnode *n = ix->old[ix->moved], *next;

		full += n != NULL;
		for (; n; n = next) {
			uint64_t h = index_hash(ix, n->ns, &n->key) & ix->mask;

			next = n->next;
			n->next = ix->buckets[h];
			ix->buckets[h] = n;
		}
		ix->old[ix->moved++] = NULL;
	}
	if (ix->moved > ix->old_mask) {
		free(ix->old);
		ix->old = NULL;
	}
}

/* Starts doubling the bucket array; without the memory, chains just grow longer. */
static void index_grow(struct index *ix)
{
	uint64_t nb = (ix->mask + 1) * 2;
	struct ixnode **b = calloc(nb, sizeof(*b));

	if (!b)
		return; /* longer chains, still correct */
	ix->old = ix->buckets;
	ix->old_mask = ix->mask;
	ix->moved = 0;
	ix->buckets = b;
	ix->mask = nb - 1;
}

void index_insert(struct index *ix, struct ixnode *n)
{
	struct ixnode **b;

	if (ix->old)
		rehash_step(ix);
	else if (ix->count >= 2 * (ix->mask + 1))
		index_grow(ix);
	b = index_bucket(ix, n->ns, &n->key);
	n->next = *b;
	*b = n;
	ix->count++;
}

void index_remove(struct index *ix, struct ixnode *n)
{
	struct ixnode **pp = index_bucket(ix, n->ns, &n->key);

	for (; *pp; pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			n->next = NULL;
			ix->count--;
			break;
		}
	}
	if (ix->old)
		rehash_step(ix);
}
