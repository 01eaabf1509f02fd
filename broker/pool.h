/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the page pool's memory: one arena per NUMA node (one arena until the NUMA issue),
 * each a named POSIX shared-memory object owned by the broker. See pool.c for the lifecycle.
 */
#ifndef KVB_BROKER_POOL_H
#define KVB_BROKER_POOL_H

#include <stdint.h>

#include "wire.h"

struct pool_arena {
	int fd;	    /* O_RDWR, flock(LOCK_EX) held for the broker's life */
	int node;   /* NUMA node, -1 unknown */
	void *base; /* MAP_SHARED read-write in the broker */
	uint64_t size;
	char name[96]; /* shm_open name */
};

struct pool {
	struct pool_arena arena[KVB_MAX_ARENAS];
	uint32_t narenas;
	uint64_t total;
	int reclaimed; /* arenas whose orphan (a crashed broker's) was found and reclaimed */
};

/*
 * Creates or reclaims the arenas "<name>.<i>" of size bytes in all. -EBUSY when another live
 * broker holds them, -EPERM when an existing object is not ours, else a negative errno.
 */
int pool_open(struct pool *p, const char *name, uint64_t size, uint32_t narenas);

/*
 * Maps every page of every arena so that PUTs never pay first-touch faults (the memory itself
 * is reserved by pool_open). Single thread per arena; parallel, NUMA-bound prefault is the
 * NUMA issue's.
 */
void pool_prefault(struct pool *p);

/* A fresh read-only fd of arena i for a client (caller closes it), or a negative errno. */
int pool_ro_fd(const struct pool *p, uint32_t i);

/* Unmaps, unlinks and closes (which drops the lock). */
void pool_close(struct pool *p);

#endif /* KVB_BROKER_POOL_H */
