// SPDX-License-Identifier: MIT
/*
 * dir.c - the broker's writes to the pool directory (format and protocol: proto/pooldir.h [dir]).
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

uint64_t dir_bytes_for(uint64_t part_bytes)
{
	uint64_t want = part_bytes / DIR_BYTES_PER_ENTRY / KVB_DIR_WAYS;
	uint32_t nb = 8;

	while (nb < want && nb < (1u << 30))
		nb <<= 1;
	/* At most 1/64 of the partition, so that a small pool is not all directory. */
	return kvb_dir_bytes(nb) <= part_bytes / 64 ? kvb_dir_bytes(nb) : 0;
}

/* [D1] Entry e becomes what fill writes: odd seq, release fence, the fields, even seq. */
static void ent_begin(struct kvb_dir_ent *e)
{
	kvb_store_relaxed(&e->seq, kvb_load_relaxed(&e->seq) + 1);
	kvb_fence_release(); /* [D1] a reader that sees any field below sees the odd seq too */
}

static void ent_end(struct kvb_dir_ent *e)
{
	kvb_store_release(&e->seq, kvb_load_relaxed(&e->seq) + 1);
}

static void ent_clear(struct kvb_dir_ent *e)
{
	ent_begin(e);
	kvb_store_relaxed(&e->ns, 0);
	ent_end(e);
}

void dir_open(struct dir *d, void *mem, uint64_t bytes, int adopted)
{
	struct kvb_dir_hdr *h = mem;
	struct kvb_dir_ent *e;
	uint64_t n;

	memset(d, 0, sizeof(*d));
	if (adopted && !kvb_dir_check(h, bytes)) {
		uint32_t epoch = kvb_load_relaxed(&h->epoch) + 1;

		/* First the epoch: an old client's copy now fails its check whatever it read. */
		kvb_store_release(&h->epoch, epoch ? epoch : 1);
		kvb_fence_full();
		e = kvb_dir_ents(h);
		n = (uint64_t)h->nbuckets * KVB_DIR_WAYS;
		for (uint64_t i = 0; i < n; i++)
			if (kvb_load_relaxed(&e[i].ns))
				ent_clear(&e[i]);
	} else {
		uint32_t nb = 8;

		/* A fresh arena reads as zeros; a damaged header is rebuilt with a new epoch. */
		while (kvb_dir_bytes(nb * 2) <= bytes && nb < (1u << 30))
			nb *= 2;
		if (kvb_dir_bytes(nb) > bytes)
			return;
		n = adopted ? kvb_load_relaxed(&h->epoch) + 1 : 1;
		memset(mem, 0, kvb_dir_bytes(nb));
		h->magic = KVB_DIR_MAGIC;
		h->version = KVB_DIR_VERSION;
		h->nbuckets = nb;
		h->ways = KVB_DIR_WAYS;
		kvb_store_release(&h->epoch, n && n <= UINT32_MAX ? (uint32_t)n : 1);
	}
	d->h = h;
	d->nbuckets = h->nbuckets;
}

int dir_put(struct dir *d, uint32_t ns, const kvb_key *key, uint32_t len, uint64_t loc)
{
	struct kvb_dir_ent *e, *slot = NULL;
	uint32_t k[8];

	if (!d->h)
		return 0;
	memcpy(k, key->b, sizeof(k));
	e = kvb_dir_ents(d->h) + (uint64_t)kvb_dir_bucket(ns, key, d->nbuckets) * KVB_DIR_WAYS;
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

void dir_del(struct dir *d, uint32_t ns, const kvb_key *key)
{
	struct kvb_dir_ent *e;
	uint32_t k[8];

	if (!d->h)
		return;
	memcpy(k, key->b, sizeof(k));
	e = kvb_dir_ents(d->h) + (uint64_t)kvb_dir_bucket(ns, key, d->nbuckets) * KVB_DIR_WAYS;
	for (uint32_t w = 0; w < KVB_DIR_WAYS; w++) {
		int i = 0;

		if (kvb_load_relaxed(&e[w].ns) != ns + 1)
			continue;
		while (i < 8 && kvb_load_relaxed(&e[w].key[i]) == k[i])
			i++;
		if (i == 8) {
			ent_clear(&e[w]);
			d->entries--;
			return;
		}
	}
}
