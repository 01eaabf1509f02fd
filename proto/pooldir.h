/* SPDX-License-Identifier: MIT */
/*
 * pooldir.h - the pool directory [dir] (ABI 1.5): where a client finds a RAM-resident
 * page by itself, so that kvb_get() into host memory reads it with no round trip to the broker.
 *
 * Place. A tenant partition's directory is the first dir_units * 4 KiB of the partition's
 * first arena (the HELLO reply's dir_units; 0: none). A client maps it with the pool,
 * read-only like every pool byte (rule 2, docs/design.md), and a broker that takes the pool
 * over finds it where the side table says (pagehdr.h, pmeta_arena.dir_units).
 *
 * Format. A 64-byte header, then nbuckets buckets of KVB_DIR_WAYS 64-byte entries:
 *   header: magic "KVBDIR1\0", version, nbuckets (a power of two), ways, epoch (never 0)
 *   entry:  seq, ns + 1 (0: empty), len (the slot's bytes, >= the page's), loc (KVB_LOC, as an
 *           ACQUIRE's), key (8 words)
 * A page's entry is in bucket kvb_dir_bucket(ns, key) or nowhere: a full bucket leaves the page
 * out, and a reader that does not find a key asks the broker as before. A reader looks at one
 * bucket, eight entries, at most.
 *
 * Writer: the broker's loop thread, alone. An entry changes as a seqlock: seq + 1 (odd), release
 * fence [D1], the fields, store-release seq + 2. A page enters when it is committed (its bytes
 * complete: store.c) and leaves when it leaves the index, which is always before its slot is
 * freed, so before anything (a copy worker, io_uring, a DMA) can write the slot again. A broker
 * that adopts the pool stores a new epoch before it frees or writes any slot, then zeroes every
 * entry (a dead broker may have left one half-written, its seq odd: zero is even again).
 *
 * Reader (client/ops.c): loads seq (acquire [D1 pairs]; odd: skip), the fields, acquire fence
 * [D2], seq again: unchanged means the fields are one entry's; then the epoch, which must be
 * the one it attached with. It copies the page out of its pool map and, after another acquire
 * fence [D2], loads seq and the epoch once more: both unchanged mean the slot held that page
 * for the whole copy (a removal's seq store comes before any write of the slot's next bytes: a
 * copy that saw one of them sees the new seq too). Anything else: the copy is thrown away and
 * the page asked of the broker. The epoch keeps a client of a broker that died from trusting
 * what the broker that adopted the pool writes: it reconnects first (conn.c [RECONNECT]).
 *
 * Trust: a client cannot write any of it; it still checks every loc against its maps, as a
 * lease's, and keeps its own copy of the geometry it checked at attach.
 */
#ifndef KVB_PROTO_POOLDIR_H
#define KVB_PROTO_POOLDIR_H

#include <assert.h>
#include <errno.h>
#include <stddef.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "kvbroker.h"
#include "ring.h"

#define KVB_DIR_MAGIC 0x003152494442564bull /* "KVBDIR1\0" little-endian */
#define KVB_DIR_VERSION 1u
#define KVB_DIR_WAYS 8u
#define KVB_DIR_UNIT 4096u /* dir_units count these */

struct kvb_dir_hdr {
	uint64_t magic;	      /* KVB_DIR_MAGIC */
	uint32_t version;     /* KVB_DIR_VERSION */
	uint32_t nbuckets;    /* a power of two */
	uint32_t ways;	      /* KVB_DIR_WAYS */
	kvb_atomic_u32 epoch; /* a new one whenever a broker takes the pool over; never 0 */
	uint32_t resv[10];    /* 0 */
};
static_assert(sizeof(struct kvb_dir_hdr) == 64, "directory header");

struct kvb_dir_ent {
	kvb_atomic_u32 seq;    /* even: stable; odd: being written */
	kvb_atomic_u32 ns;     /* broker namespace id + 1; 0: empty */
	kvb_atomic_u32 len;    /* bytes of the slot */
	kvb_atomic_u32 loc[2]; /* KVB_LOC, low word first */
	kvb_atomic_u32 key[8]; /* the page key's bytes, as 8 words of the host's order */
	uint32_t resv[3];      /* 0 */
};
static_assert(sizeof(struct kvb_dir_ent) == 64, "directory entry");
static_assert(offsetof(struct kvb_dir_ent, ns) == 4 && offsetof(struct kvb_dir_ent, len) == 8 &&
		      offsetof(struct kvb_dir_ent, loc) == 12 &&
		      offsetof(struct kvb_dir_ent, key) == 20 &&
		      offsetof(struct kvb_dir_ent, resv) == 52,
	      "directory entry layout");
static_assert(offsetof(struct kvb_dir_hdr, nbuckets) == 12 &&
		      offsetof(struct kvb_dir_hdr, epoch) == 20,
	      "directory header layout");

/* Bytes of a directory of nbuckets buckets, in whole units. */
static inline uint64_t kvb_dir_bytes(uint32_t nbuckets)
{
	uint64_t b = sizeof(struct kvb_dir_hdr) +
		     (uint64_t)nbuckets * KVB_DIR_WAYS * sizeof(struct kvb_dir_ent);

	return (b + KVB_DIR_UNIT - 1) & ~(uint64_t)(KVB_DIR_UNIT - 1);
}

/* 0 when h (bytes mapped) is a directory both sides can use, else -EPROTO. */
static inline int kvb_dir_check(const struct kvb_dir_hdr *h, uint64_t bytes)
{
	if (bytes < sizeof(*h) || h->magic != KVB_DIR_MAGIC || h->version != KVB_DIR_VERSION ||
	    h->ways != KVB_DIR_WAYS || !h->nbuckets || (h->nbuckets & (h->nbuckets - 1)) ||
	    kvb_dir_bytes(h->nbuckets) > bytes)
		return -EPROTO;
	return 0;
}

/* The bucket of (ns, key): keys are hashes already, mixed with ns so namespaces spread. */
static inline uint32_t kvb_dir_bucket(uint32_t ns, const kvb_key *key, uint32_t nbuckets)
{
	uint64_t h;

	memcpy(&h, key->b, sizeof(h));
	h ^= (uint64_t)(ns + 1) * 0x9e3779b97f4a7c15ull;
	h *= 0xff51afd7ed558ccdull;
	h ^= h >> 33;
	return (uint32_t)h & (nbuckets - 1);
}

static inline struct kvb_dir_ent *kvb_dir_ents(const struct kvb_dir_hdr *h)
{
	return (struct kvb_dir_ent *)(uintptr_t)(h + 1);
}

/* The first of the KVB_DIR_WAYS entries of (ns, key)'s bucket. */
static inline struct kvb_dir_ent *kvb_dir_bucket_of(const struct kvb_dir_hdr *h, uint32_t nbuckets,
						    uint32_t ns, const kvb_key *key)
{
	return kvb_dir_ents(h) + (uint64_t)kvb_dir_bucket(ns, key, nbuckets) * KVB_DIR_WAYS;
}

/* Whether entry e names (ns, key) (key as 8 words, memcpy'd from its bytes); relaxed loads. */
static inline int kvb_dir_names(const struct kvb_dir_ent *e, uint32_t ns, const uint32_t key[8])
{
	uint32_t k = 0;

	if (kvb_load_relaxed(&e->ns) != ns + 1)
		return 0;
	while (k < 8 && kvb_load_relaxed(&e->key[k]) == key[k])
		k++;
	return k == 8;
}

/* Whether entry e, read at seq, still holds what it held then, in the same epoch ([D2]). */
static inline int kvb_dir_still(const struct kvb_dir_hdr *h, const struct kvb_dir_ent *e,
				uint32_t seq, uint32_t epoch)
{
	kvb_fence_acquire(); /* [D2] every read before it, of the entry or of the page, is done */
	return kvb_load_relaxed(&e->seq) == seq && kvb_load_relaxed(&h->epoch) == epoch;
}

/*
 * The entry of (ns, key) in the directory at h of nbuckets buckets (the reader's checked copy),
 * in epoch: returns it with its seq, loc and len, or NULL (absent, being written, another epoch).
 */
static inline const struct kvb_dir_ent *kvb_dir_find(const struct kvb_dir_hdr *h, uint32_t nbuckets,
						     uint32_t epoch, uint32_t ns,
						     const kvb_key *key, uint32_t *seq,
						     uint64_t *loc, uint32_t *len)
{
	const struct kvb_dir_ent *e = kvb_dir_bucket_of(h, nbuckets, ns, key);
	uint32_t want[8];

	memcpy(want, key->b, sizeof(want));
	for (uint32_t w = 0; w < KVB_DIR_WAYS; w++, e++) {
		uint32_t s = kvb_load_acquire(&e->seq); /* [D1] pairs with the writer's release */

		if ((s & 1) || !kvb_dir_names(e, ns, want))
			continue;
		*len = kvb_load_relaxed(&e->len);
		*loc = kvb_load_relaxed(&e->loc[0]) | (uint64_t)kvb_load_relaxed(&e->loc[1]) << 32;
		if (!kvb_dir_still(h, e, s, epoch))
			return NULL; /* changed under us: the broker is the safe answer */
		*seq = s;
		return e;
	}
	return NULL;
}

#endif /* KVB_PROTO_POOLDIR_H */
