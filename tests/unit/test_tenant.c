// SPDX-License-Identifier: MIT
/*
 * test_tenant.c - how tenant.c reads the shares [tenant-part] [tenant-disk]:
 *   - --tenant ID=RAM and ID=RAM,DISK (DISK a size or N% of the disk) and --tenant-share
 *     RAM[,DISK]: each partition's RAM and the disk share it asked for (0: the disk left over,
 *     which tier.c splits in proportion to RAM);
 *   - malformed entries and shares that do not fit are refused;
 *   - tenant_attach binds free partitions and keeps the disk asks of each.
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

	(void)state;
	assert_int_equal(tenant_parse_share("16M,5%", &c), 0);
	assert_int_equal(plan(&c, 256 * MiB, &pc, &tt), 0);
	/* Listed first, in order; then 16 MiB shares of the rest, up to the partition limit. */
	assert_int_equal(pc.part_size[0], 64 * MiB);
	assert_int_equal(pc.part_size[1], 64 * MiB);
	assert_int_equal(pc.part_size[2], 32 * MiB);
	assert_int_equal(pc.nparts, POOL_MAX_PARTS);
	assert_int_equal(pc.part_size[3], 16 * MiB);
	assert_int_equal(tt.disk_bytes[0], 20 * GiB);
	assert_true(tt.disk_frac[0] == 0);
	assert_true(tt.disk_frac[1] == 0.10);
	assert_int_equal(tt.disk_bytes[2], 0); /* the disk left over, by RAM */
	assert_true(tt.disk_frac[2] == 0);
	for (uint32_t p = 3; p < pc.nparts; p++)
		assert_true(tt.disk_frac[p] == 0.05);
	/* A tenant bound at first attach keeps its partition's disk ask. */
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 77, 77)), 3);
	assert_true(tt.disk_frac[3] == 0.05);
	assert_int_equal(tenant_attach(&tt, tenant_key(TENANTS_UID, 0, 0)), 0);
}

static void test_tenant_default_disk(void **state)
{
	struct tenant_cfg c = {.mode = TENANTS_GID};
	struct tenant_table tt;
	struct pool_cfg pc;

	(void)state;
	assert_int_equal(plan(&c, GiB, &pc, &tt), 0);
	assert_int_equal(pc.nparts, TENANT_SLOTS_DEFAULT);
	for (uint32_t p = 0; p < pc.nparts; p++) {
		assert_int_equal(pc.part_size[p], GiB / TENANT_SLOTS_DEFAULT);
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

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tenant_disk_shares),
		cmocka_unit_test(test_tenant_default_disk),
		cmocka_unit_test(test_tenant_refused),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
