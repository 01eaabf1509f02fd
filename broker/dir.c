// SPDX-License-Identifier: MIT
/*
 * dir.c - the broker's writes to the pool directory (format and protocol: proto/pooldir.h
 * [dir]).
 *
 * One directory per tenant partition, sized at one entry per 32 KiB of the partition (half
 * full with 64 KiB pages, the smallest a model makes; far emptier with MiB pages), in buckets
 * of eight that a reader scans whole. A page whose bucket is full is simply not published: its
 * readers ask the broker, as without a directory, and dir->full counts it. Loop thread only:
 * every entry has one writer, which is what lets readers in other processes use a seqlock.
 */
#include <string.h>

#include "dir.h"

#define DIR_BYTES_PER_ENTRY (32u << 10)
#define DIR_MAX_BUCKETS (1u << 30)

/* The most buckets bytes hold (0: not even the fewest, 8). */
static uint32_t buckets_in(uint64_t bytes)
{
	uint32_t nb = 8;

	if (kvb_dir_bytes(nb) > bytes)
		return 0;
	while (nb < DIR_MAX_BUCKETS && kvb_dir_bytes(nb * 2) <= bytes)
		nb *= 2;
	return nb;
}

uint64_t dir_bytes_for(uint64_t part_bytes)
{
	uint64_t want = part_bytes / DIR_BYTES_PER_ENTRY / KVB_DIR_WAYS;
	uint32_t nb = 8;

	while (nb < want && nb < DIR_MAX_BUCKETS)
		nb <<= 1;
	/* At most 1/64 of the partition, so that a small pool is not all directory. */
	return kvb_dir_bytes(nb) <= part_bytes / 64 ? kvb_dir_bytes(nb) : 0;
}

/* [D1] Entry e becomes what the caller writes next: odd seq, release fence, then ent_end(). */
static void ent_begin(struct kvb_dir_ent *e)
{
	kvb_store_relaxed(&e->seq, kvb_load_relaxed(&e->seq) + 1);
	kvb_fence_release(); /* [D1] a reader that sees any field written next sees the odd seq */
}

static void ent_end(struct kvb_dir_ent *e)
{
	kvb_store_release(&e->seq, kvb_load_relaxed(&e->seq) + 1);
}

void dir_open(struct dir *d, void *mem, uint64_t bytes, int adopted)
{
	struct kvb_dir_hdr *h = mem;
	uint32_t epoch = 1, nb;

	memset(d, 0, sizeof(*d));
	if (adopted && !kvb_dir_check(h, bytes)) {
		nb = h->nbuckets;
		epoch = kvb_load_relaxed(&h->epoch) + 1;
		/* First the epoch: an old client's copy now fails its check whatever it read. */
		kvb_store_release(&h->epoch, epoch ? epoch : 1);
		kvb_fence_full();
		memset(kvb_dir_ents(h), 0, (size_t)nb * KVB_DIR_WAYS * sizeof(struct kvb_dir_ent));
	} else {
		/* A fresh arena reads as zeros; a damaged header is rebuilt with a new epoch. */
		nb = buckets_in(bytes);
		if (!nb)
			return;
		if (adopted)
			epoch = kvb_load_relaxed(&h->epoch) + 1;
		memset(mem, 0, kvb_dir_bytes(nb));
		h->magic = KVB_DIR_MAGIC;
		h->version = KVB_DIR_VERSION;
		h->nbuckets = nb;
		h->ways = KVB_DIR_WAYS;
		kvb_store_release(&h->epoch, epoch ? epoch : 1);
	}
	d->h = h;
	d->nbuckets = nb;
}

int dir_put(struct dir *d, uint32_t ns, const kvb_key *key, uint32_t len, uint64_t loc)
{
	struct kvb_dir_ent *e, *slot = NULL;
	uint32_t k[8];

	if (!d->h)
		return 0;
	memcpy(k, key->b, sizeof(k));
	e = kvb_dir_bucket_of(d->h, d->nbuckets, ns, key);
	for (uint32_t w = 0; w < KVB_DIR_WAYS && !slot; w++)
		if (!kvb_load_relaxed(&e[w].ns))
			slot = &e[w];
	if (!slot) {
		d->full++;
		return -ENOSPC;
	}
	ent_begin(slot);
	kvb_store_relaxed(&slot->len, len);
	kvb_store_relaxed(&slot->loc[0], (uint32_t)loc);
	kvb_store_relaxed(&slot->loc[1], (uint32_t)(loc >> 32));
	for (int i = 0; i < 8; i++)
		kvb_store_relaxed(&slot->key[i], k[i]);
	kvb_store_relaxed(&slot->ns, ns + 1);
	ent_end(slot);
	d->entries++;
	return 0;
}

int dir_del(struct dir *d, uint32_t ns, const kvb_key *key)
{
	struct kvb_dir_ent *e;
	uint32_t k[8];

	if (!d->h)
		return 0;
	memcpy(k, key->b, sizeof(k));
	e = kvb_dir_bucket_of(d->h, d->nbuckets, ns, key);
	for (uint32_t w = 0; w < KVB_DIR_WAYS; w++) {
		if (!kvb_dir_names(&e[w], ns, k))
			continue;
		ent_begin(&e[w]);
		kvb_store_relaxed(&e[w].ns, 0);
		ent_end(&e[w]);
		d->entries--;
		return 1;
	}
	return 0;
}

void dir_prefetch(const struct dir *d, uint32_t ns, const kvb_key *key)
{
	const struct kvb_dir_ent *e;

	if (!d->h)
		return;
	e = kvb_dir_bucket_of(d->h, d->nbuckets, ns, key);
	for (uint32_t w = 0; w < KVB_DIR_WAYS; w++)
		__builtin_prefetch(&e[w], 1);
}
