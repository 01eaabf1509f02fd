/* SPDX-License-Identifier: MIT */
/*
 * tier.h - the NVMe tier: demotion of cold pages to disk, promotion on GET/ACQUIRE/PREFETCH,
 * the disk index and warm restart. See tier.c for the policy essay. Loop thread only.
 */
#ifndef KVB_BROKER_TIER_H
#define KVB_BROKER_TIER_H

#include <stdint.h>

#include "disk.h"
#include "waitq.h"
#include "kvbroker.h"
#include "wire.h"

struct broker;
struct ns;
struct page;
struct cJSON;

/*
 * main.c: opens the paths, adopts or formats the cache (rebuilding the index from the slot
 * headers when it adopts one), hooks demotion into the store and the ring's eventfd into the
 * loop. Sets b->tier. 0 or a negative errno.
 */
int tier_open(struct broker *b, const struct disk_cfg *c);

/*
 * main.c, at shutdown after every session was destroyed: writes every page that has no copy on
 * disk yet (so a restart finds the whole cache), waits for all I/O and closes. Whatever waited
 * on the tier is woken onto b->runq, and resume(b) (the request engine's ops_poll, NULL: none)
 * runs it after each batch of completions. Blocks; no-op without a tier.
 */
void tier_close(struct broker *b, uint32_t (*resume)(struct broker *b));
/* [ns-free] Namespace id was freed: its identity's pages on disk stay, found again by identity. */
void tier_ns_forget(struct broker *b, uint32_t id);
/*
 * [tenant-rebind] Partition part is bound to a new tenant: every slot of its regions (its old
 * tenant's pages) is forgotten, their space the new tenant's log. Slots found again by a later
 * start's scan are indexed under their own (the old tenant's) identity only.
 */
void tier_part_forget(struct broker *b, uint32_t part);

/* rounds.c: submits prepared I/O and reaps completions without blocking; returns how many. */
uint32_t tier_poll(struct broker *b);

/*
 * A request for (n, key) found no READY page in RAM (pg: the key's WRITING page, or NULL).
 * Returns 0, a miss (not on disk, or no memory to bring it), or 1, "wait" with *w set (waitq.h):
 * on the page's queue while its read from disk, issued now or joined, is in flight, or on the
 * tier's queue while the disk queue is full or RAM waits for demotions. Whoever waited on w->q
 * then asks RAM again and finds the page, or misses. The tier parks nothing (ops.c does).
 */
int tier_promote(struct broker *b, const struct ns *n, const kvb_key *key, struct page *pg,
		 struct wait_on *w);

/*
 * store_alloc answered -ENOSPC. Returns 1, "wait on w" until disk I/O in flight (demotions)
 * completes and frees RAM, or 0 when nothing is in flight (the allocation fails).
 */
int tier_wait_alloc(struct broker *b, struct wait_on *w);

/* Is (n, key) stored on disk (LOOKUP, PUT's dedup)? */
int tier_has(struct broker *b, const struct ns *n, const kvb_key *key);

/* DELETE: drops the disk copy of (n, key). Returns 1 when there was one. */
int tier_delete(struct broker *b, const struct ns *n, const kvb_key *key);

/* stats.c: the "disk" object (state "off" without a tier). */
struct cJSON *tier_json(const struct broker *b);
/* [tenant-disk] Regions of each path (the tenant partitions), 0 without a tier. */
uint32_t tier_nparts(const struct broker *b);
/* stats.c: one partition's region of the disk: partition, bytes_total, bytes_used, pages. */
struct cJSON *tier_part_json(const struct broker *b, uint32_t part);

#endif /* KVB_BROKER_TIER_H */
