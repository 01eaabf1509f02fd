/* SPDX-License-Identifier: MIT */
/*
 * tier.h - the NVMe tier: demotion of cold pages to disk, promotion on GET/ACQUIRE/PREFETCH,
 * the disk index and warm restart. See tier.c for the policy essay. Loop thread only.
 */
#ifndef KVB_BROKER_TIER_H
#define KVB_BROKER_TIER_H

#include <stdint.h>

#include "disk.h"
#include "kvbroker.h"
#include "wire.h"

struct broker;
struct session;
struct ns;
struct op;
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
 * disk yet (so a restart finds the whole cache), waits for all I/O, completes parked ops and
 * closes. Blocks; no-op without a tier.
 */
void tier_close(struct broker *b);
/* [ns-free] Namespace id was freed: its identity's pages on disk stay, found again by identity. */
void tier_ns_forget(struct broker *b, uint32_t id);

/* rounds.c: submits prepared I/O and reaps completions without blocking; returns how many. */
uint32_t tier_poll(struct broker *b);

/*
 * ops.c, GET/ACQUIRE/PREFETCH of (op->n, op->key) that found no READY page in RAM (pg: the
 * WRITING page of the key, or NULL): returns 1 when the page is on disk and the op was parked
 * until it is in RAM (its read issued or joined, or waiting for RAM or room in the disk
 * queue): it runs again from ops_poll and finds the page, or misses. 0: a miss.
 */
int tier_promote(struct broker *b, struct op *op, struct page *pg);

/*
 * ops.c: store_alloc answered -ENOSPC. Returns 1 when the op was parked until disk I/O in
 * flight (demotions) completes and frees RAM, then it runs again; 0 when nothing is in flight.
 */
int tier_park_alloc(struct broker *b, struct op *op);

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
