// SPDX-License-Identifier: MIT
/*
 * index.c - the chained, intrusive hash table of the store and the disk tier; see index.h.
 * Lookups compare the namespace and all 32 key bytes: a hash collision never returns another
 * page.
 */
#include <errno.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>

#include "index.h"

/*
 * Bucket arrays come from mmap, zeroed by the kernel page by page as they are first written,
 * not from calloc: below glibc's mmap threshold (which rises to 32 MiB as large blocks are
 * freed) calloc can hand back a freed heap block and clear all of it in place, a memset of up
 * to 32 MiB on the loop thread in one go.
 */
static struct ixnode **buckets_alloc(uint64_t n)
{
	void *p = mmap(NULL, n * sizeof(struct ixnode *), PROT_READ | PROT_WRITE,
		       MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

	return p == MAP_FAILED ? NULL : p;
}

static void buckets_free(struct ixnode **b, uint64_t mask)
{
	if (b)
		munmap(b, (mask + 1) * sizeof(*b));
}

int index_init(struct index *ix, uint64_t expected)
{
	uint64_t n = 1024;

	while (n < expected && n < (1ull << 32))
		n <<= 1;
	if (getrandom(ix->seed, sizeof(ix->seed), 0) != sizeof(ix->seed))
		return -EIO;
	ix->seed[5] |= 1; /* an odd multiplier keeps the namespace term a bijection */
	ix->buckets = buckets_alloc(n);
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
	buckets_free(ix->buckets, ix->mask);
	buckets_free(ix->old, ix->old_mask);
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
		buckets_free(ix->old, ix->old_mask);
		ix->old = NULL;
	}
}

/* Starts doubling the bucket array; without the memory, chains just grow longer. */
static void index_grow(struct index *ix)
{
	uint64_t nb = (ix->mask + 1) * 2;
	struct ixnode **b = buckets_alloc(nb);

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
