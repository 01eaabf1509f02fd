/* SPDX-License-Identifier: MIT */
/*
 * memcap.h - how much memory the broker can have, and whether a planned pool fits in it:
 * MemAvailable, the tightest memory cgroup over the broker, RLIMIT_AS, less a headroom, with
 * the arenas that hugetlb pages will back set apart. Start-up checks a new pool with it before
 * any arena exists (main.c start_pool); an adopted pool is not checked (its memory is already
 * taken). See memcap.c.
 */
#ifndef KVB_BROKER_MEMCAP_H
#define KVB_BROKER_MEMCAP_H

#include <stddef.h>
#include <stdint.h>

#include "hugepage.h"
#include "numa_topo.h"

#define MEMCAP_NONE UINT64_MAX /* no limit from that source (or it could not be read) */

/* [headroom] What the broker keeps beside its pool: MEMCAP_HEADROOM_MIN + pool / 32. */
#define MEMCAP_HEADROOM_MIN (256ull << 20)
#define MEMCAP_HEADROOM_DIV 32u

/* What the machine lets the broker take now, source by source. */
struct memcap {
	char root[256];	     /* "" or the directory /proc and /sys were read under (tests) */
	uint64_t avail;	     /* MemAvailable; MEMCAP_NONE when /proc/meminfo has none */
	int cg_version;	     /* the memory controller's hierarchy: 2 or 1; 0 none found */
	char cg_path[512];   /* the tightest level as /proc/self/cgroup names it, else ours */
	const char *cg_file; /* its limit: "memory.max", "memory.high" or "memory.limit_in_bytes";
				NULL: no level has a limit */
	uint64_t cg_limit;   /* that limit, bytes */
	uint64_t cg_room;    /* limit - usage + the file pages it can reclaim; MEMCAP_NONE none */
	uint64_t as_limit;   /* RLIMIT_AS; MEMCAP_NONE unlimited */
	uint64_t as_room;    /* RLIMIT_AS less the address space in use; MEMCAP_NONE unlimited */
};

/* What a planned pool takes (memcap_need). */
struct memcap_need {
	uint64_t total;	  /* bytes of every arena */
	uint64_t hugetlb; /* of them, on hugetlb pages: set aside already, not in MemAvailable */
	uint64_t hugetlb_free; /* free hugetlb pages of the sizes --hugepages allows, bytes */
};

/*
 * Reads every source under root ("": the real /proc and /sys) into m. Never fails: a file that
 * is missing or unreadable means no limit from it (a kernel without cgroups, a test root
 * without one). A few small files: cheap enough for every start.
 */
void memcap_probe(const char *root, struct memcap *m);

/* The root memcap_probe reads under: "", or $KVB_TEST_MEMCAP_ROOT in builds with test hooks. */
const char *memcap_root(void);

/*
 * What the arenas of plan[0..nplans) (pool_plan) take, with which of them hugetlb pages back
 * under mode: the rule of hugepage_pick over the free pages on each arena's node (read under
 * m->root), pages one arena takes no longer free for the next.
 */
void memcap_need(const struct memcap *m, enum hp_mode mode, const struct numa_plan *plan,
		 uint32_t nplans, struct memcap_need *need);

/* [headroom] Bytes the broker needs beside a pool of pool bytes. */
uint64_t memcap_headroom(uint64_t pool);

/*
 * The largest pool that fits, need->hugetlb bytes of it on hugetlb pages: the pool less those,
 * plus its headroom, within the tightest of MemAvailable and the cgroup's room; all of it plus
 * its headroom within RLIMIT_AS. MEMCAP_NONE when no source gives a limit. A pool fits when
 * need->total is at most this.
 */
uint64_t memcap_max_pool(const struct memcap *m, const struct memcap_need *need);

/*
 * The sources for a message, e.g. "MemAvailable 21.8 GiB; cgroup /system.slice/x memory.max
 * unlimited; headroom 917.0 MiB", the headroom being that of a pool of max bytes (the answer
 * of memcap_max_pool), into out. Returns out.
 */
char *memcap_explain(const struct memcap *m, const struct memcap_need *need, uint64_t max,
		     char *out, size_t len);

#endif /* KVB_BROKER_MEMCAP_H */
