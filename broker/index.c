// SPDX-License-Identifier: MIT
/*
 * index.c - chained hash table of page records; see index.h. Lookups compare the namespace and
 * all 32 key bytes: a hash collision never returns another page.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "index.h"
#include "store.h"

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

struct page *index_find(const struct index *ix, uint32_t ns, const kvb_key *key)
{
	struct page *pg = ix->buckets[index_hash(ix, ns, key) & ix->mask];

	for (; pg; pg = pg->hnext)
		if (pg->ns == ns && !memcmp(pg->key.b, key->b, sizeof(key->b)))
			return pg;
	return NULL;
}

static void index_grow(struct index *ix)
{
	uint64_t n = (ix->mask + 1) * 2;
	struct page **nb = calloc(n, sizeof(*nb));

	if (!nb)
		return; /* longer chains, still correct */
	for (uint64_t i = 0; i <= ix->mask; i++) {
		struct page *pg = ix->buckets[i], *next;

		for (; pg; pg = next) {
			uint64_t b = index_hash(ix, pg->ns, &pg->key) & (n - 1);

			next = pg->hnext;
			pg->hnext = nb[b];
			nb[b] = pg;
		}
	}
	free(ix->buckets);
	ix->buckets = nb;
	ix->mask = n - 1;
}

void index_insert(struct index *ix, struct page *pg)
{
	uint64_t b;

	if (ix->count >= 2 * (ix->mask + 1))
		index_grow(ix);
	b = index_hash(ix, pg->ns, &pg->key) & ix->mask;
	pg->hnext = ix->buckets[b];
	ix->buckets[b] = pg;
	ix->count++;
}

void index_remove(struct index *ix, struct page *pg)
{
	struct page **pp = &ix->buckets[index_hash(ix, pg->ns, &pg->key) & ix->mask];

	for (; *pp; pp = &(*pp)->hnext) {
		if (*pp == pg) {
			*pp = pg->hnext;
			pg->hnext = NULL;
			ix->count--;
			return;
		}
	}
}
