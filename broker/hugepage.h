/* SPDX-License-Identifier: MIT */
/*
 * hugepage.h - what backs the pool's arenas (--hugepages): hugetlb pages when the hugetlb pool
 * has enough free ones, else transparent huge pages for shared memory where the kernel gives
 * them, else 4 KiB pages. See hugepage.c.
 */
#ifndef KVB_BROKER_HUGEPAGE_H
#define KVB_BROKER_HUGEPAGE_H

#include <stdint.h>

#define HP_2M (2ull << 20)
#define HP_1G (1ull << 30)

/*
 * HP_MODE_COLLAPSE: no hugetlb; transparent huge pages made at start-up with MADV_COLLAPSE
 * (Linux 6.1), which shmem_enabled=never does not forbid ([collapse], pool.c).
 */
enum hp_mode { HP_MODE_AUTO = 0, HP_MODE_2M, HP_MODE_1G, HP_MODE_OFF, HP_MODE_COLLAPSE };

/* How an arena is backed. */
enum hp_backing {
	HP_BACK_PAGES = 0, /* tmpfs memfd, 4 KiB pages */
	HP_BACK_THP,	   /* tmpfs memfd with MADV_HUGEPAGE: 2 MiB where the kernel manages */
	HP_BACK_HUGETLB,   /* MFD_HUGETLB memfd of page_size pages */
};

/* "auto", "2M", "1G", "off", "collapse" -> enum hp_mode; -EINVAL otherwise. */
int hugepage_parse(const char *s);

/*
 * Free hugetlb pages of page_size on node (node < 0: in the whole system, less those already
 * reserved), read under root ("": the real /sys; memcap.c's tests fabricate one). 0 when the
 * size is not supported or sysfs cannot be read.
 */
uint64_t hugepage_free(const char *root, uint64_t page_size, int node);

/* 1 when shared memory advised with MADV_HUGEPAGE gets transparent huge pages
 * (/sys/kernel/mm/transparent_hugepage/shmem_enabled, and the 2 MiB size's own setting). */
int hugepage_thp_shmem(void);

/*
 * The hugetlb page sizes to try for an arena of size bytes under mode, best first, into sizes
 * (at most 2), given free[0] free 1 GiB pages and free[1] free 2 MiB pages where it goes. A
 * size is listed only when size is a multiple of it (1G) and enough of its pages are free.
 * Returns the count (0: no hugetlb; then THP or 4 KiB pages). The one rule for both the arenas
 * (hugepage_candidates) and the start-up check that predicts them (memcap.c).
 */
int hugepage_pick(enum hp_mode mode, uint64_t size, const uint64_t free[2], uint64_t *sizes);

/* hugepage_pick over the free pages on node now (node < 0: in the whole system). */
int hugepage_candidates(enum hp_mode mode, uint64_t size, int node, uint64_t *sizes);

/* "4k", "2M", "1G" for a page size. */
const char *hugepage_name(uint64_t page_size);

/* "shmem", "thp", "hugetlb" for an enum hp_backing (log and stats). */
const char *hugepage_backing_name(int backing);

#endif /* KVB_BROKER_HUGEPAGE_H */
