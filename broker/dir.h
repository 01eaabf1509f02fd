/* SPDX-License-Identifier: MIT */
/*
 * dir.h - the broker's side of the pool directory (proto/pooldir.h [dir]): one per tenant
 * partition, in the first bytes of its first arena, written by the loop thread only.
 */
#ifndef KVB_BROKER_DIR_H
#define KVB_BROKER_DIR_H

#include <stdint.h>

#include "pooldir.h"

struct dir {
	struct kvb_dir_hdr *h; /* NULL: the partition has none */
	uint32_t nbuckets;
	uint64_t entries; /* pages in it now */
	uint64_t full;	  /* pages left out because their bucket was full */
};

/* Bytes of the directory of a partition of part_bytes (0: too small to have one). */
uint64_t dir_bytes_for(uint64_t part_bytes);

/*
 * Takes bytes of memory at mem as directory d: formats it (fresh: nothing there yet) or, for a
 * pool taken over from another broker (adopted), stores a new epoch and zeroes every entry,
 * so that no client of the old broker trusts an entry past this point (proto/pooldir.h).
 */
void dir_open(struct dir *d, void *mem, uint64_t bytes, int adopted);

/* Publishes the page of (ns, key) at loc in a slot of len bytes. 0, or -ENOSPC (bucket full). */
int dir_put(struct dir *d, uint32_t ns, const kvb_key *key, uint32_t len, uint64_t loc);

/* Takes (ns, key) out, if it is in: 1 when it was. */
int dir_del(struct dir *d, uint32_t ns, const kvb_key *key);

/*
 * [put-prefetch] Asks for the lines of (ns, key)'s bucket ahead of its dir_put: a PUT calls it
 * before its copy, so the commit after it finds them in the cache, not in DRAM.
 */
void dir_prefetch(const struct dir *d, uint32_t ns, const kvb_key *key);

#endif /* KVB_BROKER_DIR_H */
