// SPDX-License-Identifier: MIT
/*
 * test_tenant.c - how tenant.c reads the shares [tenant-part] [tenant-disk]:
 *   - --tenant ID=RAM and ID=RAM,DISK (DISK a size or N% of the disk) and --tenant-share
 *     RAM[,DISK]: each partition's RAM and the disk share it asked for (0: the disk left over,
 *     which tier.c splits in proportion to RAM);
 *   - malformed entries and shares that do not fit are refused;
 *   - tenant_attach binds free partitions and keeps the disk asks of each;
 *   - [tenant-lend] every partition is virtually the pool; guarantees are the shares of the
 *     tenants bound and not released, scaled down while they add up to more than the pool;
 *     a tenant idle past --tenant-idle is released (guarantee 0) and gets it back when it
 *     attaches again; six tenants attach with the default four shares; shares set at run time;
 *   - [tenant-rebind] the released partition idle longest is the one a new tenant takes.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "tenant.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

static int plan(struct tenant_cfg *c, uint64_t pool, struct pool_cfg *pc, struct tenant_table *tt)
{
	memset(pc, 0, sizeof(*pc));
	return tenant_plan(c, pool, pc, tt);
}

static void test_tenant_disk_shares(void **state)
{
	char a0[] = "0=64M,20G", a1[] = "1=25%,10%", a2[] = "2=32M";
	struct tenant_cfg c = {.mode = TENANTS_UID, .nlisted = 3, .listed_arg = {a0, a1, a2}};
	struct tenant_table tt;
	struct pool_cfg pc;
	int rel;

	(void)state;
	assert_int_equal(tenant_parse_share("16M,5%", &c), 0);
	assert_int_equal(plan(&c, 256 * MiB, &pc, &tt), 0);
	/* Listed first, in order; then 16 MiB shares, up to the partition limit; every
	 * partition virtually the pool [tenant-lend]. */
	assert_int_equal(pc.part_share[0], 64 * MiB);
	assert_int_equal(pc.part_share[1], 64 * MiB);
	assert_int_equal(pc.part_share[2], 32 * MiB);
	assert_int_equal(pc.nparts, POOL_MAX_PARTS);
	assert_int_equal(pc.part_share[3], 16 * MiB);
	assert_true(pc.sparse);
	for (uint32_t p = 0; p < pc.nparts; p++)
		assert_int_equal(pc.part_size[p], 256 * MiB);
	assert_int_equal(tt.disk_bytes[0], 20 * GiB);
	assert_true(tt.disk_frac[0] == 0);
	assert_true(tt.disk_frac[1] == 0.10);
	assert_int_equal(tt.disk_bytes[2], 0); /* the disk left over, by RAM */
	assert_true(tt.disk_frac[2] == 0);
	for (uint32_t p = 3; p < pc.nparts; p++)
		assert_true(tt.disk_frac[p] == 0.05);
	/* A tenant bound at first attach keeps its partition's disk ask. */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 77, 77), &rel), 3);
	assert_true(tt.disk_frac[3] == 0.05);
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 0, 0), &rel), 0);
}

static void test_tenant_default_disk(void **state)
{
	struct tenant_cfg c = {.mode = TENANTS_GID};
	struct tenant_table tt;
	struct pool_cfg pc;

	(void)state;
	assert_int_equal(plan(&c, GiB, &pc, &tt), 0);
	assert_int_equal(pc.nparts, POOL_MAX_PARTS);
	for (uint32_t p = 0; p < pc.nparts; p++) {
		assert_int_equal(pc.part_share[p], GiB / TENANT_SLOTS_DEFAULT);
		assert_int_equal(tt.disk_bytes[p], 0);
		assert_true(tt.disk_frac[p] == 0);
	}
}

static void test_tenant_refused(void **state)
{
	char bad_disk[] = "0=64M,lots", bad_pct[] = "0=64M,0%", no_eq[] = "0", big[] = "0=2G";
	struct tenant_cfg c = {.mode = TENANTS_UID, .nlisted = 1};
	struct tenant_cfg none = {.mode = TENANTS_NONE};
	struct tenant_table tt;
	struct pool_cfg pc;

	(void)state;
	c.listed_arg[0] = bad_disk;
	assert_int_equal(plan(&c, GiB, &pc, &tt), -EINVAL);
	c.listed_arg[0] = bad_pct;
	assert_int_equal(plan(&c, GiB, &pc, &tt), -EINVAL);
	c.listed_arg[0] = no_eq;
	assert_int_equal(plan(&c, GiB, &pc, &tt), -EINVAL);
	c.listed_arg[0] = big;
	assert_int_equal(plan(&c, GiB, &pc, &tt), -EINVAL);
	assert_int_equal(tenant_parse_share("16M,", &c), -EINVAL);
	assert_int_equal(tenant_parse_share("16M,101%", &c), -EINVAL);
	/* Shares without --tenants are refused, the disk one too. */
	assert_int_equal(tenant_parse_share("16M,10G", &none), 0);
	none.share = 0;
	assert_int_equal(plan(&none, GiB, &pc, &tt), -EINVAL);
}

/* [tenant-lend] Six tenants, four default shares: all bound, each guaranteed pool * 4 / 6 / 4. */
static void test_tenant_guarantees(void **state)
{
	struct tenant_cfg c = {.mode = TENANTS_UID, .idle_s = 60};
	struct tenant_table tt;
	struct pool_cfg pc;
	int rel;

	(void)state;
	assert_int_equal(plan(&c, GiB, &pc, &tt), 0);
	for (uint32_t u = 0; u < 6; u++)
		assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 1000 + u, 0), &rel),
				 (int)u);
	assert_int_equal(tenant_guarantees(&tt, 100), 1);
	for (uint32_t u = 0; u < 6; u++)
		assert_int_equal(tt.t[u].guarantee, GiB / 6);
	for (uint32_t u = 6; u < POOL_MAX_PARTS; u++)
		assert_int_equal(tt.t[u].guarantee, 0);
	/* Two leave: idle, then released past --tenant-idle; the four left hold a quarter each. */
	tt.t[4].clients = tt.t[5].clients = 0;
	tt.t[4].left_at = tt.t[5].left_at = 100;
	assert_int_equal(tenant_guarantees(&tt, 159), 0);
	assert_int_equal(tenant_guarantees(&tt, 160), 1);
	assert_true(tt.t[4].released && tt.t[5].released);
	assert_int_equal(tt.t[4].guarantee, 0);
	assert_int_equal(tt.t[0].guarantee, GiB / 4);
	/* One comes back: its partition (and guarantee) again. */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 1004, 0), &rel), 4);
	assert_false(tt.t[4].released);
	assert_int_equal(tenant_guarantees(&tt, 161), 1);
	assert_int_equal(tt.t[4].guarantee, GiB / 5);
	/* Two more bind the last partitions; a ninth tenant finds none (uid 1005's is only
	 * released: it is said). */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 2000, 0), &rel), 6);
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 2001, 0), &rel), 7);
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 2002, 0), &rel), -EUSERS);
	assert_true(rel);
}

/*
 * [tenant-rebind] With every partition bound, the released one idle longest is picked for a new
 * tenant (then the next, skipping those that cannot be emptied); not one named by --tenant or
 * given a share at run time, nor one attached again; re-bound, it is the new tenant's with the
 * default share, its counters fresh.
 */
static void test_tenant_rebind_pick(void **state)
{
	char arg[] = "500=128M";
	struct tenant_cfg c = {.mode = TENANTS_UID, .idle_s = 1, .nlisted = 1, .listed_arg = {arg}};
	struct tenant_table tt;
	struct pool_cfg pc;
	int rel;

	(void)state;
	assert_int_equal(plan(&c, GiB, &pc, &tt), 0);
	assert_int_equal(tt.t[0].key, tenant_key(TENANTS_UID, 500, 0));
	assert_int_equal(tenant_rebind_pick(&tt, 0), -1); /* none released */
	for (uint32_t u = 1; u < POOL_MAX_PARTS; u++)
		assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 1000 + u, 0), &rel),
				 (int)u);
	assert_int_equal(tenant_set_share(&tt, tenant_key(TENANTS_UID, 1002, 0), 64 * MiB), 2);
	/* All leave, at different times: partition 0 (listed) and 2 (share set) first. */
	tt.t[0].attaches = 1;
	for (uint32_t p = 0; p < POOL_MAX_PARTS; p++) {
		tt.t[p].clients = 0;
		tt.t[p].left_at = 10 + (p == 0 || p == 2 ? 0 : 10 - p); /* 7 left first */
	}
	assert_int_equal(tenant_rebind_pick(&tt, 0), -1); /* not released yet */
	(void)tenant_guarantees(&tt, 100);
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 3000, 0), &rel), -EUSERS);
	assert_true(rel);
	assert_int_equal(tenant_rebind_pick(&tt, 0), 7);
	assert_int_equal(tenant_rebind_pick(&tt, 1u << 7), 6);
	/* 6 comes back: attached, not released, not picked. */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 1006, 0), &rel), 6);
	assert_int_equal(tenant_rebind_pick(&tt, 1u << 7), 5);
	tt.t[7].hits = 9;
	assert_int_equal(tenant_bind(&tt, 7, tenant_key(TENANTS_UID, 3000, 0)), 7);
	assert_int_equal(tt.t[7].key, tenant_key(TENANTS_UID, 3000, 0));
	assert_true(tt.t[7].used && !tt.t[7].released && tt.t[7].clients == 1);
	assert_int_equal(tt.t[7].hits, 0);
	assert_int_equal(tt.t[7].share, tt.share_default);
	/* The old tenant of 7 is a new tenant now: it finds no partition of its own. */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 1007, 0), &rel), -EUSERS);
	assert_int_equal(tenant_rebind_pick(&tt, 0), 5);
}

/* [tenant-lend] Shares at run time: raised, lowered, back to the default; bound if new. */
static void test_tenant_set_share(void **state)
{
	struct tenant_cfg c = {.mode = TENANTS_UID, .idle_s = 60};
	struct tenant_table tt;
	struct pool_cfg pc;
	int rel;

	(void)state;
	assert_int_equal(plan(&c, GiB, &pc, &tt), 0);
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 7, 0), &rel), 0);
	assert_int_equal(tenant_set_share(&tt, tenant_key(TENANTS_UID, 7, 0), 512 * MiB), 0);
	(void)tenant_guarantees(&tt, 1);
	assert_int_equal(tt.t[0].guarantee, 512 * MiB);
	assert_int_equal(tenant_set_share(&tt, tenant_key(TENANTS_UID, 8, 0), 768 * MiB), 1);
	assert_true(tt.t[1].used && tt.t[1].listed);
	(void)tenant_guarantees(&tt, 1);
	/* 512 + 768 > 1024: both scaled by 1024 / 1280. */
	assert_int_equal(tt.t[0].guarantee, 512 * MiB * 4 / 5);
	assert_int_equal(tt.t[1].guarantee, 768 * MiB * 4 / 5);
	assert_int_equal(tenant_set_share(&tt, tenant_key(TENANTS_UID, 7, 0), 0), 0);
	assert_int_equal(tt.t[0].share, GiB / 4);
	assert_int_equal(tenant_set_share(&tt, tenant_key(TENANTS_UID, 7, 0), MiB), -EINVAL);
	/* The one bound by the share attaches to it. */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 8, 0), &rel), 1);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tenant_guarantees),
		cmocka_unit_test(test_tenant_set_share),
		cmocka_unit_test(test_tenant_rebind_pick),
		cmocka_unit_test(test_tenant_disk_shares),
		cmocka_unit_test(test_tenant_default_disk),
		cmocka_unit_test(test_tenant_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
