// SPDX-License-Identifier: MIT
/*
 * t_hugepages.c - the pool on hugetlb pages, for real, and the fallback when there are none.
 *
 * As root the test reserves 2 MiB hugetlb pages (/proc/sys/vm/nr_hugepages, restored at exit
 * whatever happens), starts a broker with --hugepages 2M and checks that the arena is a hugetlb
 * memfd (stats page_size "2M", backing "hugetlb"), that the pages were taken from the hugetlb
 * pool, that the start-up check counted them as hugetlb pages rather than RAM, and that pages
 * round-trip through them. Then, with
 * a pool larger than the free hugetlb pages, --hugepages 2M falls back (transparent huge pages
 * or 4 KiB pages), says so in the log and still serves. Without root, only the fallback runs.
 * --hugepages collapse makes the 4 KiB pages of a pool into 2 MiB ones where the kernel can.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "harness.h"

#define NR_PATH "/proc/sys/vm/nr_hugepages"
#define FREE_PATH "/sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages"
#define PAGE (256u * 1024)
#define WANT 48 /* 96 MiB of hugetlb pages for a 64 MiB pool */

static long saved_nr = -1;

static long read_long(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -1;

	if (!f)
		return -1;
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return v;
}

static int write_long(const char *path, long v)
{
	FILE *f = fopen(path, "w");
	int ok;

	if (!f)
		return -1;
	ok = fprintf(f, "%ld\n", v) > 0;
	return fclose(f) == 0 && ok ? 0 : -1;
}

static void restore_nr(void)
{
	if (saved_nr >= 0)
		write_long(NR_PATH, saved_nr);
}

static void roundtrip(struct harness_broker *b, uint64_t seed)
{
	kvb_client *c = harness_connect(b, "huge", 0);
	struct kvb_layout l;
	struct kvb_lease lease;
	uint8_t *page = malloc(PAGE);
	uint32_t ns;

	CHECK(page != NULL);
	harness_layout(&l, "hugepages", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (uint32_t i = 0; i < 64; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(page, PAGE, &k, seed);
		CHECK_OK(kvb_put(c, ns, k, page, PAGE));
	}
	for (uint32_t i = 0; i < 64; i++) {
		kvb_key k = harness_key(seed, i);

		CHECK_RC(kvb_get(c, ns, k, page, PAGE), PAGE);
		CHECK_OK(harness_verify(page, PAGE, &k, seed, "page"));
		CHECK_OK(kvb_acquire(c, ns, k, &lease));
		CHECK_OK(harness_verify(lease.data, lease.len, &k, seed, "lease"));
		CHECK_OK(kvb_release(c, &lease));
	}
	free(page);
	kvb_close(c);
}

/* kB of shared memory process pid maps with 2 MiB entries (smaps ShmemPmdMapped, summed). */
static long pmd_mapped_kb(pid_t pid)
{
	char path[64], line[256];
	long kb = 0, v;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/smaps", (int)pid);
	f = fopen(path, "r");
	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "ShmemPmdMapped: %ld kB", &v) == 1)
			kb += v;
	fclose(f);
	return kb;
}

static char *stats_of(struct harness_broker *b)
{
	kvb_client *c = harness_connect(b, "stats", 0);
	char *js = harness_stats(c);

	kvb_close(c);
	return js;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	char *js, big[32];
	long free0, free1;

	harness_init(argc, argv);
	saved_nr = read_long(NR_PATH);
	if (saved_nr >= 0 && geteuid() == 0 && write_long(NR_PATH, saved_nr + WANT) == 0) {
		atexit(restore_nr);
		free0 = read_long(FREE_PATH);
		harness_log("nr_hugepages %ld -> %ld, %ld free", saved_nr, saved_nr + WANT, free0);
	} else {
		saved_nr = -1;
		free0 = -1;
	}
	if (free0 >= 32) {
		b = harness_broker_start("--pool", "64M", "--hugepages", "2M", "--numa", "off");
		js = stats_of(b);
		CHECKF(strstr(js, "\"page_size\":\"2M\",\"backing\":\"hugetlb\"") != NULL,
		       "not on hugetlb pages: %s", js);
		free(js);
		free1 = read_long(FREE_PATH);
		CHECKF(free0 - free1 >= 32,
		       "free hugetlb pages %ld -> %ld: the pool is not on them", free0, free1);
		CHECK(harness_broker_log_has(b, "2M pages (hugetlb)"));
		/* The start-up check (memcap.c) foresaw it: the pool is not RAM to be found. */
		CHECK(harness_broker_log_has(b, "hugetlb pages back 64.0 MiB of the pool"));
		roundtrip(b, 1);
		harness_broker_stop(b);
	} else {
		harness_log("cannot reserve hugetlb pages here (not root?): fallback only");
	}

	/*
	 * More than the free hugetlb pages: --hugepages 2M falls back and says so. 256M is more
	 * than WANT; a machine with pages of its own reserved needs more.
	 */
	free1 = read_long(FREE_PATH);
	snprintf(big, sizeof(big), "%ldM", free1 >= 128 ? 2 * (free1 + 1) : 256);
	b = harness_broker_start("--pool", big, "--hugepages", "2M", "--numa", "off");
	CHECK(harness_broker_log_has(b, "not enough free hugetlb pages"));
	js = stats_of(b);
	CHECKF(strstr(js, "\"backing\":\"hugetlb\"") == NULL, "hugetlb without the pages: %s", js);
	free(js);
	roundtrip(b, 2);
	harness_broker_stop(b);

	/*
	 * collapse: 4 KiB pages made into 2 MiB ones at the prefault, whatever shmem_enabled
	 * says, where the kernel can (Linux 6.1, THP built in): the broker's map of the arena is
	 * then all huge pages, and pages round-trip. Elsewhere it says why, and serves on 4 KiB.
	 */
	b = harness_broker_start("--pool", "64M", "--hugepages", "collapse", "--numa", "off");
	js = stats_of(b);
	if (harness_broker_log_has(b, "collapsed into 2 MiB pages")) {
		long kb = pmd_mapped_kb(b->pid);

		CHECKF(strstr(js, "\"page_size\":\"2M\",\"backing\":\"thp\"") != NULL, "%s", js);
		CHECKF(kb >= 64 * 1024, "%ld kB of the pool in huge pages", kb);
	} else {
		CHECK(harness_broker_log_has(b, "MADV_COLLAPSE"));
		CHECKF(strstr(js, "\"page_size\":\"4k\",\"backing\":\"shmem\"") != NULL, "%s", js);
		harness_log("this kernel does not collapse shared memory: fallback checked");
	}
	free(js);
	roundtrip(b, 3);
	harness_broker_stop(b);

	/* off: plain pages even where huge ones are free. */
	b = harness_broker_start("--pool", "64M", "--hugepages", "off");
	js = stats_of(b);
	CHECKF(strstr(js, "\"page_size\":\"4k\",\"backing\":\"shmem\"") != NULL, "%s", js);
	free(js);
	harness_broker_stop(b);
	return H_PASS;
}
