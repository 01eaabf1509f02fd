// SPDX-License-Identifier: MIT
/*
 * test_memcap.c - broker/memcap.c on fabricated machines: each test writes the /proc and /sys
 * files a kernel would show into a temporary root and reads them back through memcap_probe.
 * Covers MemAvailable, cgroup v2 with a limit and with "max", the tightest of nested levels
 * (and memory.high tighter than memory.max), reclaimable file pages, cgroup v1 alone (also
 * as a container sees it, mounted at its own cgroup), an escaped mount point, a cgroup
 * outside the namespace (not walked), a machine without any of it, hugetlb pages backing the
 * arenas they fit (per node, one arena's pages not free for the next), the largest pool that
 * fits with its headroom, and the message.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "memcap.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static char root[64];

/* Writes root/rel (creating its directories) with text. */
static void put(const char *rel, const char *text)
{
	char path[512], *p;
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", root, rel);
	for (p = path + strlen(root) + 1; (p = strchr(p, '/')); p++) {
		*p = '\0';
		mkdir(path, 0700);
		*p = '/';
	}
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static int setup(void **state)
{
	(void)state;
	snprintf(root, sizeof(root), "/tmp/kvb-test-memcap-XXXXXX");
	assert_non_null(mkdtemp(root));
	put("proc/meminfo", "MemTotal:       24683784 kB\n"
			    "MemFree:        20000000 kB\n"
			    "MemAvailable:    8388608 kB\n"
			    "HugePages_Free:        0\n");
	return 0;
}

static int teardown(void **state)
{
	char cmd[128];

	(void)state;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	assert_int_equal(system(cmd), 0);
	return 0;
}

/* A cgroup v2 host: the unified hierarchy at /sys/fs/cgroup with the memory controller. */
static void v2_host(const char *self)
{
	char line[256];

	snprintf(line, sizeof(line), "0::%s\n", self);
	put("proc/self/cgroup", line);
	put("proc/self/mountinfo",
	    "22 1 8:1 / / rw,relatime shared:1 - ext4 /dev/sda1 rw\n"
	    "35 22 0:30 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:9 - cgroup2 "
	    "cgroup2 rw,nsdelegate,memory_recursiveprot\n");
	put("sys/fs/cgroup/cgroup.controllers", "cpuset cpu io memory hugetlb pids rdma misc\n");
}

static void test_memcap_meminfo_only(void **state)
{
	struct memcap m;
	struct memcap_need need = {.total = GiB};
	char msg[512];

	(void)state;
	memcap_probe(root, &m);
	assert_true(m.avail == 8 * GiB);
	assert_int_equal(m.cg_version, 0); /* no /proc/self/cgroup */
	assert_true(m.cg_room == MEMCAP_NONE);
	/* 8 GiB less 256 MiB, over 1 + 1/32. */
	assert_true(memcap_max_pool(&m, &need) == (8 * GiB - 256 * MiB) / 33 * 32);
	memcap_explain(&m, &need, memcap_max_pool(&m, &need), msg, sizeof(msg));
	assert_string_equal(msg, "MemAvailable 8.0 GiB; no memory cgroup; headroom 496.5 MiB");
}

static void test_memcap_v2_limit(void **state)
{
	struct memcap m;
	struct memcap_need need = {.total = 512 * MiB};
	char msg[512];

	(void)state;
	v2_host("/kvb.slice/kvbrokerd.service");
	put("sys/fs/cgroup/kvb.slice/kvbrokerd.service/memory.max", "268435456\n");
	put("sys/fs/cgroup/kvb.slice/kvbrokerd.service/memory.high", "max\n");
	put("sys/fs/cgroup/kvb.slice/kvbrokerd.service/memory.current", "16777216\n");
	/* 6 MiB of page cache it can reclaim; shmem (the "file" total) is not. */
	put("sys/fs/cgroup/kvb.slice/kvbrokerd.service/memory.stat",
	    "anon 1048576\nfile 12582912\nshmem 6291456\nactive_file 4194304\n"
	    "inactive_file 2097152\n");
	put("sys/fs/cgroup/kvb.slice/memory.max", "max\n");
	memcap_probe(root, &m);
	assert_int_equal(m.cg_version, 2);
	assert_string_equal(m.cg_path, "/kvb.slice/kvbrokerd.service");
	assert_string_equal(m.cg_file, "memory.max");
	assert_true(m.cg_limit == 256 * MiB);
	assert_true(m.cg_room == 246 * MiB);
	/* The cgroup's room, not MemAvailable, is the bound: less than the fixed headroom. */
	assert_true(memcap_max_pool(&m, &need) == 0);
	memcap_explain(&m, &need, 0, msg, sizeof(msg));
	assert_string_equal(msg, "MemAvailable 8.0 GiB; cgroup /kvb.slice/kvbrokerd.service "
				 "memory.max 256.0 MiB, 246.0 MiB of it free; headroom 256.0 MiB");
}

static void test_memcap_v2_max_is_unlimited(void **state)
{
	struct memcap m;
	struct memcap_need need = {.total = GiB};
	char msg[512];

	(void)state;
	v2_host("/system.slice/x.service");
	put("sys/fs/cgroup/system.slice/x.service/memory.max", "max\n");
	put("sys/fs/cgroup/system.slice/x.service/memory.high", "max\n");
	put("sys/fs/cgroup/system.slice/memory.max", "max\n");
	memcap_probe(root, &m);
	assert_int_equal(m.cg_version, 2);
	assert_null(m.cg_file);
	assert_true(m.cg_room == MEMCAP_NONE);
	assert_string_equal(m.cg_path, "/system.slice/x.service");
	memcap_explain(&m, &need, memcap_max_pool(&m, &need), msg, sizeof(msg));
	assert_string_equal(msg, "MemAvailable 8.0 GiB; cgroup /system.slice/x.service memory.max "
				 "unlimited; headroom 496.5 MiB");
}

static void test_memcap_v2_tightest_ancestor(void **state)
{
	struct memcap m;

	(void)state;
	v2_host("/a/b/c");
	put("sys/fs/cgroup/a/b/c/memory.max", "max\n");
	put("sys/fs/cgroup/a/b/c/memory.current", "104857600\n");
	put("sys/fs/cgroup/a/b/memory.max", "4294967296\n"); /* 4 GiB, 3 GiB used: 1 GiB room */
	put("sys/fs/cgroup/a/b/memory.current", "3221225472\n");
	put("sys/fs/cgroup/a/memory.max", "2147483648\n"); /* 2 GiB, 100 MiB used */
	put("sys/fs/cgroup/a/memory.current", "104857600\n");
	memcap_probe(root, &m);
	assert_string_equal(m.cg_path, "/a/b");
	assert_string_equal(m.cg_file, "memory.max");
	assert_true(m.cg_room == GiB);

	/* memory.high below memory.max, deeper down, is tighter still. */
	put("sys/fs/cgroup/a/b/c/memory.high", "536870912\n");
	memcap_probe(root, &m);
	assert_string_equal(m.cg_path, "/a/b/c");
	assert_string_equal(m.cg_file, "memory.high");
	assert_true(m.cg_room == 412 * MiB);

	/* Over its limit already (usage can pass memory.high): no room, not a wrapped number. */
	put("sys/fs/cgroup/a/b/c/memory.current", "1073741824\n");
	memcap_probe(root, &m);
	assert_true(m.cg_room == 0);
}

static void test_memcap_v2_without_memory_controller_uses_v1(void **state)
{
	struct memcap m;

	(void)state;
	/* A hybrid host: cgroup2 mounted with hugetlb only, memory in its v1 hierarchy. */
	put("proc/self/cgroup", "9:name=systemd:/\n4:memory:/process_api/37c5\n1:cpu:/\n0::/\n");
	put("proc/self/mountinfo",
	    "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
	    "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
	    "35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory\n"
	    "41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw\n");
	put("sys/fs/cgroup/unified/cgroup.controllers", "hugetlb\n");
	put("sys/fs/cgroup/memory/memory.limit_in_bytes", "9223372036854771712\n");
	put("sys/fs/cgroup/memory/process_api/memory.limit_in_bytes", "9223372036854771712\n");
	put("sys/fs/cgroup/memory/process_api/37c5/memory.limit_in_bytes", "9223372036854771712\n");
	memcap_probe(root, &m);
	assert_int_equal(m.cg_version, 1);
	assert_null(m.cg_file); /* v1's "unlimited" is a number */
	assert_string_equal(m.cg_path, "/process_api/37c5");

	put("sys/fs/cgroup/memory/process_api/37c5/memory.limit_in_bytes", "268435456\n");
	put("sys/fs/cgroup/memory/process_api/37c5/memory.usage_in_bytes", "20971520\n");
	/* v1's usage is hierarchical: so are the total_ file counts, not the local ones. */
	put("sys/fs/cgroup/memory/process_api/37c5/memory.stat",
	    "cache 0\nactive_file 1\ninactive_file 1\ntotal_active_file 1048576\n"
	    "total_inactive_file 3145728\n");
	memcap_probe(root, &m);
	assert_string_equal(m.cg_file, "memory.limit_in_bytes");
	assert_true(m.cg_limit == 256 * MiB);
	assert_true(m.cg_room == 256 * MiB - 16 * MiB);
}

static void test_memcap_v1_container_mount(void **state)
{
	struct memcap m;

	(void)state;
	/* A container without a cgroup namespace: its own cgroup is mounted as the root. */
	put("proc/self/cgroup", "5:memory:/docker/abc\n");
	put("proc/self/mountinfo", "40 31 0:32 /docker/abc /sys/fs/cgroup/memory ro,nosuid - "
				   "cgroup cgroup rw,memory\n");
	put("sys/fs/cgroup/memory/memory.limit_in_bytes", "1073741824\n");
	put("sys/fs/cgroup/memory/memory.usage_in_bytes", "0\n");
	memcap_probe(root, &m);
	assert_int_equal(m.cg_version, 1);
	assert_string_equal(m.cg_path, "/docker/abc");
	assert_true(m.cg_room == GiB);
}

static void test_memcap_escaped_mount_point(void **state)
{
	struct memcap m;

	(void)state;
	put("proc/self/cgroup", "0::/x\n");
	put("proc/self/mountinfo", "35 22 0:30 / /cg\\040root rw - cgroup2 cgroup2 rw\n");
	put("cg root/cgroup.controllers", "memory\n");
	put("cg root/x/memory.max", "1073741824\n");
	memcap_probe(root, &m);
	assert_int_equal(m.cg_version, 2);
	assert_true(m.cg_room == GiB);
}

static void test_memcap_outside_namespace_not_walked(void **state)
{
	struct memcap m;

	(void)state;
	/* Another namespace's cgroup: a path through ".." must not lead to a file out there. */
	v2_host("/../../elsewhere");
	put("elsewhere/memory.max", "1048576\n");
	memcap_probe(root, &m);
	assert_int_equal(m.cg_version, 0);
	assert_true(m.cg_room == MEMCAP_NONE);
}

static void test_memcap_nothing_readable(void **state)
{
	struct memcap m;
	struct memcap_need need = {.total = GiB};
	char path[128];

	(void)state;
	snprintf(path, sizeof(path), "%s/none", root);
	memcap_probe(path, &m);
	assert_true(m.avail == MEMCAP_NONE);
	assert_int_equal(m.cg_version, 0);
	assert_true(memcap_max_pool(&m, &need) == MEMCAP_NONE); /* no limit known: no refusal */
}

/* One plan of n arenas of size bytes on node (-1: unbound). */
static struct numa_plan plan_of(uint32_t n, uint64_t size, int node)
{
	struct numa_plan p = {.n = n};

	for (uint32_t i = 0; i < n; i++) {
		p.node[i] = node;
		p.size[i] = size;
	}
	return p;
}

static void test_memcap_hugetlb_free(void **state)
{
	struct memcap m;
	struct memcap_need need;
	struct numa_plan p = plan_of(1, 512 * MiB, -1), two[2];
	char msg[512];

	(void)state;
	put("sys/kernel/mm/hugepages/hugepages-2048kB/free_hugepages", "600\n"); /* 1200 MiB */
	put("sys/kernel/mm/hugepages/hugepages-2048kB/resv_hugepages", "88\n");	 /* 1024 free */
	put("sys/kernel/mm/hugepages/hugepages-1048576kB/free_hugepages", "1\n");
	memcap_probe(root, &m);

	memcap_need(&m, HP_MODE_AUTO, &p, 1, &need);
	assert_true(need.total == 512 * MiB);
	assert_true(need.hugetlb == 512 * MiB);
	memcap_need(&m, HP_MODE_OFF, &p, 1, &need);
	assert_true(need.hugetlb == 0 && need.hugetlb_free == 0);
	memcap_need(&m, HP_MODE_COLLAPSE, &p, 1, &need);
	assert_true(need.hugetlb == 0);

	/* 1 GiB arena: one free 1 GiB page backs it under auto; --hugepages 2M takes 2 MiB ones. */
	p = plan_of(1, GiB, -1);
	memcap_need(&m, HP_MODE_AUTO, &p, 1, &need);
	assert_true(need.hugetlb == GiB);
	memcap_need(&m, HP_MODE_2M, &p, 1, &need);
	assert_true(need.hugetlb == GiB);
	assert_true(need.hugetlb_free == GiB); /* the 1 GiB page is not --hugepages 2M's */

	/* Hugetlb pages are not in MemAvailable: the pool may be larger by what they back. */
	assert_true(memcap_max_pool(&m, &need) == (8 * GiB + GiB - 256 * MiB) / 33 * 32);

	/* Too big for the free pages: all of it is RAM, and the message says so. */
	p = plan_of(1, 4 * GiB, -1);
	memcap_need(&m, HP_MODE_AUTO, &p, 1, &need);
	assert_true(need.hugetlb == 0);
	assert_true(need.hugetlb_free == 2 * GiB);
	memcap_explain(&m, &need, memcap_max_pool(&m, &need), msg, sizeof(msg));
	assert_non_null(strstr(msg, "; hugetlb pages free 2.0 GiB, too few for an arena;"));

	/* Per node: two partitions' arenas on node 0, room for one in its free pages. */
	put("sys/devices/system/node/node0/hugepages/hugepages-2048kB/free_hugepages", "300\n");
	two[0] = plan_of(1, 512 * MiB, 0);
	two[1] = plan_of(1, 512 * MiB, 0);
	memcap_need(&m, HP_MODE_2M, two, 2, &need);
	assert_true(need.total == GiB);
	assert_true(need.hugetlb == 512 * MiB);
	memcap_explain(&m, &need, memcap_max_pool(&m, &need), msg, sizeof(msg));
	assert_non_null(strstr(msg, "; hugetlb pages back 512.0 MiB of the pool;"));
	/* Node 1 has none. */
	two[1] = plan_of(1, 512 * MiB, 1);
	memcap_need(&m, HP_MODE_2M, two, 2, &need);
	assert_true(need.hugetlb == 512 * MiB);
}

static void test_memcap_max_pool_and_headroom(void **state)
{
	struct memcap m = {.avail = 100 * GiB,
			   .cg_room = MEMCAP_NONE,
			   .as_limit = MEMCAP_NONE,
			   .as_room = MEMCAP_NONE};
	struct memcap_need need = {.total = 300 * GiB};
	uint64_t max;

	(void)state;
	assert_true(memcap_headroom(0) == 256 * MiB);
	assert_true(memcap_headroom(300 * GiB) == 256 * MiB + 300 * GiB / 32);
	max = memcap_max_pool(&m, &need);
	/* The answer fits with its headroom, and a pool 1 MiB larger would not. */
	assert_true(max + memcap_headroom(max) <= m.avail);
	assert_true(max + MiB + memcap_headroom(max + MiB) > m.avail);

	/* The tightest source wins: the cgroup's room... */
	m.cg_room = 10 * GiB;
	assert_true(memcap_max_pool(&m, &need) == (10 * GiB - 256 * MiB) / 33 * 32);
	/* ...or RLIMIT_AS, which counts hugetlb arenas too. */
	m.as_limit = 12 * GiB;
	m.as_room = 4 * GiB;
	assert_true(memcap_max_pool(&m, &need) == (4 * GiB - 256 * MiB) / 33 * 32);
	need.hugetlb = 8 * GiB; /* not RAM, but address space all the same */
	assert_true(memcap_max_pool(&m, &need) == (4 * GiB - 256 * MiB) / 33 * 32);
	/* Not even the headroom: nothing fits. */
	m.cg_room = 100 * MiB;
	m.as_room = MEMCAP_NONE;
	need.hugetlb = 0;
	assert_true(memcap_max_pool(&m, &need) == 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup_teardown(test_memcap_meminfo_only, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_v2_limit, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_v2_max_is_unlimited, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_v2_tightest_ancestor, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_v2_without_memory_controller_uses_v1,
						setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_v1_container_mount, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_escaped_mount_point, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_outside_namespace_not_walked, setup,
						teardown),
		cmocka_unit_test_setup_teardown(test_memcap_nothing_readable, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_hugetlb_free, setup, teardown),
		cmocka_unit_test_setup_teardown(test_memcap_max_pool_and_headroom, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
