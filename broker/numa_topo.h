/* SPDX-License-Identifier: MIT */
/*
 * numa_topo.h - the machine's NUMA topology as the pool sees it: which nodes have memory, how the
 * pool is split into one arena per node (--numa), which arena is nearest to a client, and
 * binding threads and memory to a node. See numa_topo.c. (Not "numa.h": that is libnuma's.)
 *
 * libnuma's own functions are numa_* too; ours are numa_topo_*, numa_plan_*, numa_order,
 * numa_bind_thread, numa_bind_memory and numa_pci_node, none of which libnuma defines.
 */
#ifndef KVB_BROKER_NUMA_TOPO_H
#define KVB_BROKER_NUMA_TOPO_H

#include <stdint.h>

#include "wire.h"

#define NUMA_NODES_MAX KVB_MAX_ARENAS /* nodes with memory the pool uses, one arena each */

struct numa_topo {
	uint32_t n;		      /* nodes with memory; 0: no NUMA support (one arena) */
	int node[NUMA_NODES_MAX];     /* their ids, ascending */
	uint64_t mem[NUMA_NODES_MAX]; /* their memory, bytes */
	uint32_t skipped;	      /* nodes with memory beyond NUMA_NODES_MAX, not used */
};

/* Fills t from libnuma. Never fails: without NUMA support t->n is 0. */
void numa_topo_probe(struct numa_topo *t);

/* How the pool is laid out: one arena per entry. */
struct numa_plan {
	uint32_t n;
	int node[NUMA_NODES_MAX];      /* node an arena is bound to; -1: not bound */
	uint64_t size[NUMA_NODES_MAX]; /* bytes, multiples of align */
	int interleave;		       /* one arena interleaved over every node of the topology */
	int strict; /* asked for by name (a list, interleave): binding must work */
};

/*
 * The arenas for a --numa spec over pool bytes, each a multiple of align:
 *   "off"        one arena, no policy (node -1);
 *   "auto"       one arena per node with memory, sized in proportion to the node's memory
 *                (one unbound arena without NUMA support);
 *   "interleave" one arena interleaved over every node with memory (node -1);
 *   "LIST"       "0,1" (in proportion) or "0:64G,1:32G" (as given: the sizes then replace pool;
 *                every entry has a size or none has).
 * -EINVAL for a malformed spec, -ENODEV for a listed node without memory (or without NUMA
 * support), -E2BIG for more than NUMA_NODES_MAX nodes.
 */
int numa_plan_make(const struct numa_topo *t, const char *spec, uint64_t pool, uint64_t align,
		   struct numa_plan *p);

/*
 * The order in which a client on node `from` should fill arenas: nearest first by
 * numa_distance (ties by arena index; unbound arenas last). from < 0: index order.
 * arena_node[i] is arena i's node. Writes n indices into order.
 */
void numa_order(const int *arena_node, uint32_t n, int from, uint8_t *order);

/*
 * Binds the calling thread to node's CPUs and makes its allocations node-local. For worker
 * threads that touch one arena (prefault, copy workers): call it first thing in the thread with
 * the arena's node (struct pool_arena.node). node < 0 or no NUMA support: does nothing.
 * Returns 0 or a negative errno.
 */
int numa_bind_thread(int node);

/*
 * Sets the memory policy of [base, base + len), a shared mapping, before its first touch:
 * MPOL_BIND to node, or with interleave MPOL_INTERLEAVE over the topology's nodes. On a tmpfs
 * memfd the policy is the file's (every mapping, fallocate and fault follow it). node < 0
 * without interleave: does nothing. Returns 0 or a negative errno.
 */
int numa_bind_memory(void *base, uint64_t len, int node, int interleave, const struct numa_topo *t);

/*
 * The NUMA node of a PCI device from <sysfs>/bus/pci/devices/<busid>/numa_node ("/sys" when
 * sysfs is NULL). busid as CUDA prints it ("0000:3B:00.0", also with an 8-digit domain);
 * case does not matter. Returns the node; -1 when the device has no node, or when there is no
 * PCI device list to look in; -ENODEV when the list has no such device; -EINVAL for a
 * malformed bus id.
 */
int numa_pci_node(const char *sysfs, const char *busid);

/* Number of CPUs of node (all online CPUs for node < 0 or without NUMA support), at least 1. */
uint32_t numa_node_cpus(int node);

#endif /* KVB_BROKER_NUMA_TOPO_H */
