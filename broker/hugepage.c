// SPDX-License-Identifier: MIT
/*
 * hugepage.c - choosing what backs an arena, from what the kernel offers.
 *
 * First touch of a pool is dominated by page faults and zeroing: with 4 KiB pages a fault per
 * 4 KiB, with 2 MiB pages one per 2 MiB (and TLB reach for every later copy grows alike). So:
 *   1. hugetlb (MFD_HUGETLB memfd): only when the hugetlb pool (/proc/sys/vm/nr_hugepages,
 *      per node in /sys/devices/system/node/nodeN/hugepages) has enough free pages on the
 *      arena's node; the mmap then reserves them, so a fault can never find the pool empty.
 *      --hugepages 1G and auto try 1 GiB pages first where the arena is a multiple of 1 GiB
 *      (size the pool or the --numa list so), then 2 MiB;
 *   2. THP for shared memory: a tmpfs memfd advised MADV_HUGEPAGE, when shmem_enabled is
 *      always, within_size, advise or force;
 *   3. 4 KiB pages; with --hugepages collapse, made into 2 MiB ones at start-up (pool.c
 *      [collapse]).
 * The choice per arena goes to the log and the stats. Start-up thread only.
 */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>

#include "hugepage.h"

int hugepage_parse(const char *s)
{
	if (!strcmp(s, "auto"))
		return HP_MODE_AUTO;
	if (!strcmp(s, "2M") || !strcmp(s, "2m"))
		return HP_MODE_2M;
	if (!strcmp(s, "1G") || !strcmp(s, "1g"))
		return HP_MODE_1G;
	if (!strcmp(s, "off"))
		return HP_MODE_OFF;
	if (!strcmp(s, "collapse"))
		return HP_MODE_COLLAPSE;
	return -EINVAL;
}

static uint64_t read_u64(const char *path)
{
	unsigned long long v = 0;
	FILE *f = fopen(path, "re");

	if (!f)
		return 0;
	if (fscanf(f, "%llu", &v) != 1)
		v = 0;
	fclose(f);
	return v;
}

uint64_t hugepage_free(const char *root, uint64_t page_size, int node)
{
	char path[PATH_MAX];
	uint64_t kb = page_size >> 10, free, resv;

	if (node >= 0) {
		snprintf(path, sizeof(path),
			 "%s/sys/devices/system/node/node%d/hugepages/hugepages-%llukB/"
			 "free_hugepages",
			 root, node, (unsigned long long)kb);
		return read_u64(path);
	}
	snprintf(path, sizeof(path), "%s/sys/kernel/mm/hugepages/hugepages-%llukB/free_hugepages",
		 root, (unsigned long long)kb);
	free = read_u64(path);
	snprintf(path, sizeof(path), "%s/sys/kernel/mm/hugepages/hugepages-%llukB/resv_hugepages",
		 root, (unsigned long long)kb);
	resv = read_u64(path);
	return free > resv ? free - resv : 0;
}

/* The bracketed word of a sysfs selector file ("always [madvise] never"), or "". */
static void selected(const char *path, char *out, size_t len)
{
	char buf[256], *l, *r;
	FILE *f = fopen(path, "re");

	out[0] = '\0';
	if (!f)
		return;
	if (fgets(buf, sizeof(buf), f) && (l = strchr(buf, '[')) && (r = strchr(l, ']'))) {
		*r = '\0';
		snprintf(out, len, "%s", l + 1);
	}
	fclose(f);
}

int hugepage_thp_shmem(void)
{
	char mode[32];

	selected("/sys/kernel/mm/transparent_hugepage/hugepages-2048kB/shmem_enabled", mode,
		 sizeof(mode));
	if (!mode[0] || !strcmp(mode, "inherit"))
		selected("/sys/kernel/mm/transparent_hugepage/shmem_enabled", mode, sizeof(mode));
	return !strcmp(mode, "always") || !strcmp(mode, "within_size") || !strcmp(mode, "advise") ||
	       !strcmp(mode, "force");
}

int hugepage_pick(enum hp_mode mode, uint64_t size, const uint64_t free[2], uint64_t *sizes)
{
	const uint64_t order[2] = {HP_1G, HP_2M};
	int n = 0;

	if (mode == HP_MODE_OFF || mode == HP_MODE_COLLAPSE)
		return 0;
	for (int i = 0; i < 2; i++) {
		uint64_t ps = order[i];

		if (ps == HP_1G && mode == HP_MODE_2M)
			continue;
		if (size % ps || free[i] < size / ps)
			continue;
		sizes[n++] = ps;
	}
	return n;
}

int hugepage_candidates(enum hp_mode mode, uint64_t size, int node, uint64_t *sizes)
{
	uint64_t free[2] = {0, 0};

	if (mode == HP_MODE_OFF || mode == HP_MODE_COLLAPSE)
		return 0;
	free[0] = hugepage_free("", HP_1G, node);
	free[1] = hugepage_free("", HP_2M, node);
	return hugepage_pick(mode, size, free, sizes);
}

const char *hugepage_name(uint64_t page_size)
{
	return page_size >= HP_1G ? "1G" : page_size >= HP_2M ? "2M" : "4k";
}

const char *hugepage_backing_name(int backing)
{
	return backing == HP_BACK_HUGETLB ? "hugetlb" : backing == HP_BACK_THP ? "thp" : "shmem";
}
