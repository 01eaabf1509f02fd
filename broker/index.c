// SPDX-License-Identifier: MIT
/*
 * index.c - the chained, intrusive hash table of the store and the disk tier; see index.h. Lookups compare the namespace and
 * all 32 key bytes: a hash collision never returns another page.
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
	return 0;
}

void index_fini(struct index *ix)
{
	free(ix->buckets);
	ix->buckets = NULL;
}

struct ixnode *index_find(const struct index *ix, uint32_t ns, const kvb_key *key)
{
	struct ixnode *n = ix->buckets[index_hash(ix, ns, key) & ix->mask];

	for (; n; n = n->next)
		if (n->ns == ns && !memcmp(n->key.b, key->b, sizeof(key->b)))
			return n;
	return NULL;
}

static void index_grow(struct index *ix)
{
	uint64_t nb = (ix->mask + 1) * 2;
	struct ixnode **b = calloc(nb, sizeof(*b));

	if (!b)
		return; /* longer chains, still correct */
	for (uint64_t i = 0; i <= ix->mask; i++) {
		struct ixnode *n = ix->buckets[i], *next;

		for (; n; n = next) {
			uint64_t h = index_hash(ix, n->ns, &n->key) & (nb - 1);

			next = n->next;
			n->next = b[h];
			b[h] = n;
		}
	}
	free(ix->buckets);
	ix->buckets = b;
	ix->mask = nb - 1;
}

void index_insert(struct index *ix, struct ixnode *n)
{
	uint64_t h;

	if (ix->count >= 2 * (ix->mask + 1))
		index_grow(ix);
	h = index_hash(ix, n->ns, &n->key) & ix->mask;
	n->next = ix->buckets[h];
	ix->buckets[h] = n;
	ix->count++;
}

void index_remove(struct index *ix, struct ixnode *n)
{
	struct ixnode **pp = &ix->buckets[index_hash(ix, n->ns, &n->key) & ix->mask];

	for (; *pp; pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			n->next = NULL;
			ix->count--;
			return;
		}
	}
}
