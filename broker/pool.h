/* SPDX-License-Identifier: MIT */
/*
 * pool.h - the page pool's memory: one arena per NUMA node with memory, each a sealed memfd
 * owned by the broker, bound to its node, backed by huge pages where the machine has them and
 * prefaulted in parallel. See pool.c for the lifecycle.
 */
#ifndef KVB_BROKER_POOL_H
#define KVB_BROKER_POOL_H

#include <stdint.h>

#include "hugepage.h"
#include "numa_topo.h"
#include "wire.h"

/*
 * Tenant partitions [tenant-part]: with --tenants, the pool has POOL_MAX_PARTS partitions, each
 * its own set of arenas (memfds), so a client can be handed only its own tenant's memory: a
 * read-only map of one memfd can never show another memfd's bytes. They are sparse
 * [tenant-lend]: each as large as the pool, holding the memory its slabs took (store.c).
 * Partition 0 is the whole pool without tenants. Arenas record their partition (pool_arena.part) so that whoever takes
 * the pool over (a restart's hand-over) knows whose memory each one is.
 */
#define POOL_MAX_PARTS 8u
#define POOL_MAX_ARENAS (KVB_MAX_ARENAS * POOL_MAX_PARTS)

struct pool_arena {
	int fd;		    /* memfd, O_RDWR, sealed: see pool.c */
	int node;	    /* NUMA node its memory is bound to, -1 none (or interleaved) */
	void *base;	    /* MAP_SHARED read-write in the broker (mapped before the seal) */
	uint64_t size;	    /* bytes, a multiple of page_size */
	uint64_t page_size; /* 4096, HP_2M or HP_1G */
	int backing;	    /* enum hp_backing */
	int collapse;	    /* [collapse] 4 KiB pages to make into 2 MiB ones at the prefault */
	char name[96];	    /* memfd name, shown in /proc/<pid>/maps as /memfd:<name> */
	uint32_t part;	    /* tenant partition it belongs to [tenant-part] */
	uint64_t unit0;	    /* [pagehdr] side-table unit of its byte 0 (4 KiB units, in order) */
	uint64_t dir_bytes; /* [dir] its first bytes hold its partition's directory (store.c) */
};

/* A tenant partition: arenas [first, first + narenas) of the pool, one per NUMA node. */
struct pool_part {
	uint32_t first, narenas;
	uint64_t size;	/* its RAM as the operator sized it: its arenas, or in a sparse pool its
			 * tenant's share (set by tenant.c, at run time too) */
	uint64_t vsize; /* its arenas' bytes */
};

/* What pool_create builds. */
struct pool_cfg {
	const char *name;      /* memfd name prefix; arenas are "<name>.<i>" */
	uint64_t size;	       /* bytes in all (replaced by sizes in a sized --numa list) */
	const char *numa;      /* --numa: auto, off, interleave or a node list (numa_topo.h) */
	enum hp_mode hugepage; /* --hugepages */
	int prefault;	       /* build the page tables at start-up (pool_prefault) */
	uint32_t nparts;       /* 0 or 1: one partition of size; else part_size[] each */
	uint64_t part_size[POOL_MAX_PARTS];
	int keep;	     /* arenas may be adopted by another broker (pool.c [keep]) */
	uint64_t slab_bytes; /* the store's slab size (the side table's geometry) */
	int dir;	     /* [dir] a directory per partition (proto/pooldir.h) */
	int sparse;	     /* [tenant-lend] partitions of size each, memory taken by slabs */
	uint64_t part_share[POOL_MAX_PARTS]; /* sparse: each partition's share (pool_part.size) */
};

struct pool {
	struct pool_arena arena[POOL_MAX_ARENAS];
	uint32_t narenas;
	struct pool_part part[POOL_MAX_PARTS];
	uint32_t nparts;
	uint64_t total;
	int reclaimed; /* always 0: memfd pools leave no orphan (kept for the stats field) */
	int interleave;
	int keep;	/* [keep] built to be handed over: see pool.c */
	int adopted;	/* the arenas came from another broker (pool_adopt) */
	int no_dir;	/* [dir] --no-directory: a directory found in an adopted pool is not used */
	int told_pages; /* the 4 KiB pages notice is logged (arena_back) */
	/*
	 * [tenant-lend] Sparse partitions: each arena is virtually as large as the pool's arena
	 * on its node, holds no memory but its directory until the store's slabs take it
	 * (fallocate), and gives it back when they go (hole punched). budget[i]: what the slabs
	 * in the i-th arena of all partitions together may hold (the pool's arena i less the
	 * directories there). total is then the pool's size, not the arenas'.
	 */
	int sparse;
	uint64_t budget[KVB_MAX_ARENAS];
	int meta_fd; /* the side table (pagehdr.h), -1 none; never sent to clients */
	void *meta;  /* mapped read-write, NULL none */
	uint64_t meta_size;
	struct numa_topo topo;
};

/*
 * The arenas pool_create would make for cfg over topo, one plan per tenant partition into
 * plan[POOL_MAX_PARTS], without making any. Returns how many plans, or numa_plan_make's error.
 */
int pool_plan(const struct pool_cfg *cfg, const struct numa_topo *topo, struct numa_plan *plan);

/*
 * Creates the arenas of cfg: plan (numa_topo.h), then per arena memfd, size, map, mbind, backing
 * (hugepage.h), reserve (fallocate, when not prefaulting) and seal.
 * -EINVAL/-ENODEV/-E2BIG for a bad --numa (numa_plan_make), else a negative errno
 * (-ENOMEM, -ENOSPC: the memory is not there).
 */
int pool_create(struct pool *p, const struct pool_cfg *cfg);

/* narenas unbound arenas of 4 KiB pages, size bytes in all, reserved (tests, tools). */
int pool_open(struct pool *p, const char *name, uint64_t size, uint32_t narenas);

/*
 * Allocates and maps every page of every arena, in parallel: per arena as many threads as its
 * node has CPUs (at most 16, at least 256 MiB each), each bound to the node (numa_bind_thread)
 * and populating its share with MADV_POPULATE_WRITE. Returns 0 or a negative errno (-ENOMEM: the memory is not there; -EFAULT: a hugetlb page was missing).
 */
int pool_prefault(struct pool *p);

/*
 * Builds the side table (pagehdr.h) for a store of slab_bytes slabs over p's arenas, empty.
 * 0 or a negative errno.
 */
int pool_meta_create(struct pool *p, uint64_t slab_bytes);

/*
 * Adopts a pool another broker built: fds[0] its side table, fds[1..n-1] its arenas in the
 * order the table records (the fds become the pool's, closed by pool_close even on failure).
 * Maps everything read-write; prefaulting is not needed (the pages are there). -EINVAL when
 * the table is damaged or disagrees with the fds, -EXDEV when its slab size is not slab_bytes.
 */
int pool_adopt(struct pool *p, int *fds, uint32_t n, uint64_t slab_bytes);

/* The fds to hand the pool over with (side table first, then the arenas); returns how many. */
uint32_t pool_handover_fds(const struct pool *p, int *fds);

/* [tenant-lend] budget[] and total of a sparse pool, from its arenas and directories. */
void pool_sparse_budget(struct pool *p);

/*
 * [tenant-rebind] A new memfd for sparse arena i (same name and size, sealed, 0400), not mapped,
 * into *fd; 0 or a negative errno. pool_arena_switch then punches the old file whole, maps fd
 * over the broker's mapping (same base), binds it to the arena's node and closes the old fd;
 * a failed mmap (a negative errno) leaves the broker's mapping undefined: stop the broker.
 */
int pool_arena_fresh(const struct pool *p, uint32_t i, int *fd);
int pool_arena_switch(struct pool *p, uint32_t i, int fd);

/* A fresh read-only fd of arena i for a client (caller closes it), or a negative errno. */
int pool_ro_fd(const struct pool *p, uint32_t i);

/* Unmaps and closes (the memory goes with the last client mapping). */
void pool_close(struct pool *p);

#endif /* KVB_BROKER_POOL_H */
