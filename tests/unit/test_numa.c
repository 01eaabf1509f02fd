// SPDX-License-Identifier: MIT
/*
 * test_numa.c - the multi-node logic on a simulated machine: libnuma and mbind are replaced
 * with the linker's --wrap (see TEST_LDFLAGS_numa in the Makefile) by a topology of four
 * nodes, one of them memoryless. Covers the topology probe, arena sizing for every --numa
 * form, the nearest-arena order, the GPU's node from sysfs, each arena bound to its node before
 * its first touch (and prefault threads run on it), and the store filling the nearest arena
 * first and falling back to the others when it is full.
 */
#include <errno.h>
#include <numa.h>
#include <numaif.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "numa_topo.h"
#include "pool.h"
#include "store.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

/* ---- the simulated machine ---- */

#define SIM_NODES 4
static int sim_numa = 1; /* numa_available() succeeds */
static const long long sim_mem[SIM_NODES] = {64 * GiB, 32 * GiB, 0, 32 * GiB};
/* Nodes 0,1 on one socket, 2,3 on the other. */
static const int sim_dist[SIM_NODES][SIM_NODES] = {
	{10, 12, 32, 32}, {12, 10, 32, 32}, {32, 32, 10, 12}, {32, 32, 12, 10}};

struct mbind_call {
	uint64_t len;
	int mode;
	unsigned long mask;
};
static struct mbind_call mbinds[16];
static int nmbinds;
static int mbind_errno; /* mbind fails with this when set (a seccomp filter) */
static pthread_mutex_t sim_lock = PTHREAD_MUTEX_INITIALIZER;
static unsigned long ran_on; /* nodes numa_run_on_node was called for, a mask */

int __wrap_numa_available(void);
int __wrap_numa_max_node(void);
long long __wrap_numa_node_size64(int node, long long *freep);
int __wrap_numa_distance(int a, int b);
int __wrap_numa_node_to_cpus(int node, struct bitmask *mask);
int __wrap_numa_run_on_node(int node);
void __wrap_numa_set_localalloc(void);
long __wrap_mbind(void *start, unsigned long len, int mode, const unsigned long *nmask,
		  unsigned long maxnode, unsigned flags);

int __wrap_numa_available(void)
{
	return sim_numa ? 0 : -1;
}

int __wrap_numa_max_node(void)
{
	return SIM_NODES - 1;
}

long long __wrap_numa_node_size64(int node, long long *freep)
{
	if (freep)
		*freep = node >= 0 && node < SIM_NODES ? sim_mem[node] : 0;
	return node >= 0 && node < SIM_NODES ? sim_mem[node] : -1;
}

int __wrap_numa_distance(int a, int b)
{
	return a >= 0 && a < SIM_NODES && b >= 0 && b < SIM_NODES ? sim_dist[a][b] : 0;
}

int __wrap_numa_node_to_cpus(int node, struct bitmask *mask)
{
	numa_bitmask_clearall(mask);
	numa_bitmask_setbit(mask, (unsigned)(2 * node));
	numa_bitmask_setbit(mask, (unsigned)(2 * node + 1));
	return 0;
}

int __wrap_numa_run_on_node(int node)
{
	pthread_mutex_lock(&sim_lock);
	ran_on |= 1ul << node;
	pthread_mutex_unlock(&sim_lock);
	return 0;
}

void __wrap_numa_set_localalloc(void)
{
}

long __wrap_mbind(void *start, unsigned long len, int mode, const unsigned long *nmask,
		  unsigned long maxnode, unsigned flags)
{
	(void)start;
	(void)maxnode;
	(void)flags;
	if (mbind_errno) {
		errno = mbind_errno;
		return -1;
	}
	if (nmbinds < 16)
		mbinds[nmbinds++] = (struct mbind_call){len, mode, nmask[0]};
	return 0;
}

static int reset(void **state)
{
	(void)state;
	sim_numa = 1;
	mbind_errno = 0;
	nmbinds = 0;
	ran_on = 0;
	return 0;
}

/* ---- topology and plans ---- */

static void test_numa_topo_skips_memoryless_nodes(void **state)
{
	struct numa_topo t;

	(void)state;
	numa_topo_probe(&t);
	assert_int_equal(t.n, 3);
	assert_int_equal(t.node[0], 0);
	assert_int_equal(t.node[1], 1);
	assert_int_equal(t.node[2], 3);
	assert_int_equal(t.mem[2], 32 * GiB);
}

static void test_numa_plan_auto_in_proportion(void **state)
{
	struct numa_topo t;
	struct numa_plan p;

	(void)state;
	numa_topo_probe(&t);
	assert_int_equal(numa_plan_make(&t, "auto", 4 * GiB, 2 * MiB, &p), 0);
	assert_int_equal(p.n, 3);
	assert_int_equal(p.interleave, 0);
	assert_int_equal(p.node[0], 0);
	assert_int_equal(p.size[0], 2 * GiB);
	assert_int_equal(p.node[1], 1);
	assert_int_equal(p.size[1], GiB);
	assert_int_equal(p.node[2], 3);
	assert_int_equal(p.size[2], GiB);
	/* Rounded up to the alignment, never below one unit. */
	assert_int_equal(numa_plan_make(&t, "auto", 3 * MiB, 2 * MiB, &p), 0);
	assert_int_equal(p.size[0], 2 * MiB);
	assert_int_equal(p.size[2], 2 * MiB);
}

static void test_numa_plan_lists(void **state)
{
	struct numa_topo t;
	struct numa_plan p;

	(void)state;
	numa_topo_probe(&t);
	assert_int_equal(numa_plan_make(&t, "3,0", 3 * GiB, 2 * MiB, &p), 0);
	assert_int_equal(p.n, 2);
	assert_int_equal(p.node[0], 3);
	assert_int_equal(p.size[0], GiB);
	assert_int_equal(p.node[1], 0);
	assert_int_equal(p.size[1], 2 * GiB);
	assert_int_equal(numa_plan_make(&t, "0:1G,3:511M", 64 * GiB, 2 * MiB, &p), 0);
	assert_int_equal(p.n, 2);
	assert_int_equal(p.size[0], GiB);
	assert_int_equal(p.size[1], 512 * MiB);
	assert_int_equal(numa_plan_make(&t, "2", GiB, 2 * MiB, &p), -ENODEV); /* memoryless */
	assert_int_equal(numa_plan_make(&t, "7", GiB, 2 * MiB, &p), -ENODEV);
	assert_int_equal(numa_plan_make(&t, "0,0", GiB, 2 * MiB, &p), -EINVAL);
	assert_int_equal(numa_plan_make(&t, "0:1G,3", GiB, 2 * MiB, &p), -EINVAL);
	assert_int_equal(numa_plan_make(&t, "0,3:1G", GiB, 2 * MiB, &p), -EINVAL);
	assert_int_equal(numa_plan_make(&t, "0,", GiB, 2 * MiB, &p), -EINVAL);
	assert_int_equal(numa_plan_make(&t, "0:", GiB, 2 * MiB, &p), -EINVAL);
	assert_int_equal(numa_plan_make(&t, "x", GiB, 2 * MiB, &p), -EINVAL);
	assert_int_equal(numa_plan_make(&t, "-1", GiB, 2 * MiB, &p), -EINVAL);
}

static void test_numa_plan_off_and_interleave(void **state)
{
	struct numa_topo t;
	struct numa_plan p;

	(void)state;
	numa_topo_probe(&t);
	assert_int_equal(numa_plan_make(&t, "off", GiB, 2 * MiB, &p), 0);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.node[0], -1);
	assert_int_equal(p.interleave, 0);
	assert_int_equal(numa_plan_make(&t, "interleave", GiB, 2 * MiB, &p), 0);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.node[0], -1);
	assert_int_equal(p.interleave, 1);
	assert_int_equal(p.size[0], GiB);
}

static void test_numa_plan_without_numa_support(void **state)
{
	struct numa_topo t;
	struct numa_plan p;

	(void)state;
	sim_numa = 0;
	numa_topo_probe(&t);
	assert_int_equal(t.n, 0);
	assert_int_equal(numa_plan_make(&t, "auto", GiB, 2 * MiB, &p), 0);
	assert_int_equal(p.n, 1);
	assert_int_equal(p.node[0], -1);
	assert_int_equal(numa_plan_make(&t, "interleave", GiB, 2 * MiB, &p), -ENODEV);
	assert_int_equal(numa_plan_make(&t, "0", GiB, 2 * MiB, &p), -ENODEV);
	assert_int_equal(numa_bind_thread(0), 0); /* nothing to bind to */
}

/* ---- nearest arena ---- */

static void test_numa_order_nearest_first(void **state)
{
	const int nodes[3] = {0, 1, 3}, unbound[2] = {-1, 1};
	uint8_t o[3];

	(void)state;
	numa_order(nodes, 3, 3, o); /* node 3: itself, then 0 and 1 (equally far) by index */
	assert_int_equal(o[0], 2);
	assert_int_equal(o[1], 0);
	assert_int_equal(o[2], 1);
	numa_order(nodes, 3, 1, o); /* node 1: itself, its socket's node 0, then node 3 */
	assert_int_equal(o[0], 1);
	assert_int_equal(o[1], 0);
	assert_int_equal(o[2], 2);
	numa_order(nodes, 3, 2, o); /* memoryless node 2: its socket's node 3 first */
	assert_int_equal(o[0], 2);
	numa_order(nodes, 3, -1, o); /* unknown: index order */
	assert_int_equal(o[0], 0);
	assert_int_equal(o[2], 2);
	numa_order(unbound, 2, 0, o); /* an unbound arena comes after every bound one */
	assert_int_equal(o[0], 1);
	assert_int_equal(o[1], 0);
}

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void test_numa_pci_node_from_sysfs(void **state)
{
	char root[] = "/tmp/kvb-test-numa-XXXXXX", path[256];

	(void)state;
	assert_non_null(mkdtemp(root));
	snprintf(path, sizeof(path), "%s/bus", root);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/bus/pci", root);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/bus/pci/devices", root);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:3b:00.0", root);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:3b:00.0/numa_node", root);
	put_file(path, "1\n");
	snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:5e:00.0", root);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/bus/pci/devices/0000:5e:00.0/numa_node", root);
	put_file(path, "-1\n");

	assert_int_equal(numa_pci_node(root, "0000:3B:00.0"), 1);     /* as CUDA writes it */
	assert_int_equal(numa_pci_node(root, "00000000:3b:00.0"), 1); /* as nvidia-smi does */
	assert_int_equal(numa_pci_node(root, "0000:5e:00.0"), -1);    /* no node */
	/* No such device (the list exists): refused, not taken for "no node". */
	assert_int_equal(numa_pci_node(root, "0000:af:00.0"), -ENODEV);
	assert_int_equal(numa_pci_node(root, "../../../etc/pa"), -EINVAL);
	assert_int_equal(numa_pci_node(root, "0000:3b:00.0/x"), -EINVAL);
	assert_int_equal(numa_pci_node(root, ""), -EINVAL);

	/* No PCI device list at all (no sysfs): unknown, not refused. */
	snprintf(path, sizeof(path), "%s/nosys", root);
	assert_int_equal(numa_pci_node(path, "0000:af:00.0"), -1);

	snprintf(path, sizeof(path), "rm -rf '%s'", root);
	assert_int_equal(system(path), 0);
}

/* ---- the pool and the store on the simulated machine ---- */

static void test_numa_pool_binds_each_arena_before_touch(void **state)
{
	struct pool_cfg cfg = {.name = "kvb-test-numa",
			       .size = 64 * MiB,
			       .numa = "auto",
			       .hugepage = HP_MODE_OFF,
			       .prefault = 1};
	struct pool p;

	(void)state;
	assert_int_equal(pool_create(&p, &cfg), 0);
	assert_int_equal(p.narenas, 3);
	assert_int_equal(nmbinds, 3);
	for (int i = 0; i < 3; i++) {
		assert_int_equal(mbinds[i].mode, MPOL_BIND);
		assert_int_equal(mbinds[i].mask, 1ul << p.arena[i].node);
		assert_int_equal(mbinds[i].len, p.arena[i].size);
	}
	assert_int_equal(p.arena[0].size, 32 * MiB);
	assert_int_equal(p.arena[2].node, 3);
	assert_int_equal(p.arena[2].size, 16 * MiB);
	assert_int_equal(pool_prefault(&p), 0);
	assert_int_equal(ran_on, (1ul << 0) | (1ul << 1) | (1ul << 3));
	pool_close(&p);

	nmbinds = 0;
	cfg.numa = "interleave";
	assert_int_equal(pool_create(&p, &cfg), 0);
	assert_int_equal(p.narenas, 1);
	assert_int_equal(nmbinds, 1);
	assert_int_equal(mbinds[0].mode, MPOL_INTERLEAVE);
	assert_int_equal(mbinds[0].mask, (1ul << 0) | (1ul << 1) | (1ul << 3));
	pool_close(&p);
}

/* Where mbind is refused: --numa auto runs unbound, a named node list fails. */
static void test_numa_pool_without_mbind(void **state)
{
	struct pool_cfg cfg = {.name = "kvb-test-numa",
			       .size = 64 * MiB,
			       .numa = "auto",
			       .hugepage = HP_MODE_OFF,
			       .prefault = 0};
	struct pool p;

	(void)state;
	mbind_errno = EPERM;
	assert_int_equal(pool_create(&p, &cfg), 0);
	assert_int_equal(p.narenas, 3);
	for (uint32_t i = 0; i < p.narenas; i++)
		assert_int_equal(p.arena[i].node, -1);
	pool_close(&p);
	cfg.numa = "0,1";
	assert_int_equal(pool_create(&p, &cfg), -EPERM);
	assert_int_equal(p.narenas, 0);
}

static kvb_key key_of(uint32_t i)
{
	kvb_key k;

	memset(&k, 0, sizeof(k));
	memcpy(k.b, &i, sizeof(i));
	return k;
}

static void test_numa_store_nearest_arena_then_fallback(void **state)
{
	struct pool_cfg cfg = {.name = "kvb-test-numa",
			       .size = 64 * MiB, /* arenas of 32, 16, 16 MiB on nodes 0, 1, 3 */
			       .numa = "auto",
			       .hugepage = HP_MODE_OFF,
			       .prefault = 0};
	const int nodes[3] = {0, 1, 3};
	struct store_pref pref = {.n = 3};
	struct pool p;
	struct store s;
	struct page *pg;
	int cls;

	(void)state;
	assert_int_equal(pool_create(&p, &cfg), 0);
	assert_int_equal(store_init(&s, &p, 4 * MiB, 1.0, 1.0), 0); /* 8 + 4 + 4 slabs */
	cls = store_class_get(&s, 4 * MiB);
	numa_order(nodes, 3, 3, pref.arena); /* a client on node 3 */
	for (uint32_t i = 0; i < 16; i++) {
		kvb_key k = key_of(i);

		assert_int_equal(store_alloc_pref(&s, cls, 1, &k, &pref, &pg), 0);
		store_commit(&s, pg);
		/* Its own node's arena, then node 0's (nearer by index among equals), then 1's. */
		assert_int_equal(store_arena(&s, pg), i < 4 ? 2 : i < 12 ? 0 : 1);
	}
	/* Every arena full: the coldest page goes, wherever it is (key 0, in arena 2). */
	{
		kvb_key k = key_of(100), k0 = key_of(0);

		assert_int_equal(store_alloc_pref(&s, cls, 1, &k, &pref, &pg), 0);
		assert_int_equal(store_arena(&s, pg), 2);
		assert_null(store_find(&s, 1, &k0));
		store_commit(&s, pg);
	}
	/* A slot free in arena 0 and in arena 2: the client on node 3 gets arena 2's, a client
	 * without a preference arena 0's (index order). */
	{
		kvb_key k1 = key_of(1), k5 = key_of(5), a = key_of(200), b = key_of(201);

		store_drop(&s, store_find(&s, 1, &k1)); /* arena 2 */
		store_drop(&s, store_find(&s, 1, &k5)); /* arena 0 */
		assert_int_equal(store_alloc(&s, cls, 1, &a, &pg), 0);
		assert_int_equal(store_arena(&s, pg), 0);
		store_commit(&s, pg);
		store_drop(&s, pg);
		assert_int_equal(store_alloc_pref(&s, cls, 1, &b, &pref, &pg), 0);
		assert_int_equal(store_arena(&s, pg), 2);
		store_commit(&s, pg);
	}
	store_fini(&s);
	pool_close(&p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_numa_topo_skips_memoryless_nodes, reset),
		cmocka_unit_test_setup(test_numa_plan_auto_in_proportion, reset),
		cmocka_unit_test_setup(test_numa_plan_lists, reset),
		cmocka_unit_test_setup(test_numa_plan_off_and_interleave, reset),
		cmocka_unit_test_setup(test_numa_plan_without_numa_support, reset),
		cmocka_unit_test_setup(test_numa_order_nearest_first, reset),
		cmocka_unit_test_setup(test_numa_pci_node_from_sysfs, reset),
		cmocka_unit_test_setup(test_numa_pool_binds_each_arena_before_touch, reset),
		cmocka_unit_test_setup(test_numa_pool_without_mbind, reset),
		cmocka_unit_test_setup(test_numa_store_nearest_arena_then_fallback, reset),
	};

	return cmocka_run_group_tests_name("numa", tests, NULL, NULL);
}
