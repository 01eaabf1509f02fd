// SPDX-License-Identifier: MIT
/*
 * t_tenant_lend.c - tenant shares that lend, are released, and change at run time
 * [tenant-lend], as real processes of six uids (setpriv, as t_tenants does) and root, with
 * --tenants uid and the default shares (a quarter of a 64 MiB pool each):
 *   - six uids and root all attach (seven tenants, four shares' worth: every guarantee scaled
 *     down in proportion, shown in the stats);
 *   - four tenants leave: past --tenant-idle (1 s) their shares are released (logged, in the
 *     stats), their pages kept while the pool has room;
 *   - B writes into the idle capacity far beyond its share: every PUT stored, every page
 *     served; writing on past the pool's end, the released tenants' pages go first, none of
 *     B's own;
 *   - A (the owner of a share) comes back and fills its share: B's oldest pages are evicted
 *     (its newest stay), every page of A is kept, and B's partition gives the memory back to
 *     the machine (its memfd's blocks, fstat, drop);
 *   - 0 bytes across tenants: A's GETs and LOOKUPs of B's keys miss;
 *   - shares set at run time (kvb_tenant_share): a tenant may not (-EPERM); lowering B's share
 *     loses no page; raising A's lets A store that much more, all of it kept, taken from B;
 *   - hugetlb pages cannot be lent: --tenants with --hugepages 2M is refused at start-up.
 * Root only (setpriv); skipped elsewhere.
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "harness.h"

#define UID0 4401 /* A, B = UID0 + 1, then four that leave */
#define NUIDS 6
#define PAGE (256u * 1024) /* 16 tokens x 4 layers x 4 KiB */
#define NB1 200		   /* B's first write: 50 MiB, beyond its 16 MiB share */
#define NB2 40		   /* B's second: past the end of the pool */
#define NA1 60		   /* A's first: its share, less its first page */
#define NA2 80		   /* A's second, after its share was raised to 40 MiB */
#define MiB (1ull << 20)

static char dir[128], rundir[160], sockp[200];

static void remove_dirs(void)
{
	unlink(sockp);
	rmdir(rundir);
	rmdir(dir);
}

static kvb_client *attach(const char *sock, const char *name, uint32_t *ns)
{
	struct kvb_opts o = {.socket_path = sock, .name = name};
	struct kvb_layout l;
	kvb_client *c = NULL;
	size_t pb;

	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "lend/model", KVB_LAYOUT_MLA, 16, 1, 0, 4, 4096);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

/* Stores keys [from, to) of this uid's seed; each stored (0), none "already there". */
static void put_range(kvb_client *c, uint32_t ns, uint64_t from, uint64_t to, uint8_t *buf)
{
	for (uint64_t i = from; i < to; i++) {
		kvb_key k = harness_key(getuid(), i);

		harness_fill(buf, PAGE, &k, getuid());
		CHECKF(kvb_put(c, ns, k, buf, PAGE) == 0, "PUT %llu of uid %d refused",
		       (unsigned long long)i, (int)getuid());
	}
}

/* Every key of [from, to) of uid's seed served exact. */
static void check_range(kvb_client *c, uint32_t ns, uid_t uid, uint64_t from, uint64_t to,
			uint8_t *buf)
{
	for (uint64_t i = from; i < to; i++) {
		kvb_key k = harness_key(uid, i);

		CHECKF(kvb_get(c, ns, k, buf, PAGE) == (int)PAGE, "uid %d's page %llu gone",
		       (int)uid, (unsigned long long)i);
		CHECK(harness_verify(buf, PAGE, &k, uid, "a tenant's page") == 0);
	}
}

/*
 * How many of uid's pages [from, to) (a 256-byte window of each) this process's read-only memfd
 * maps (its pool partition) show. Reading the whole map faults pages into its holes: the
 * broker gives them back (store_sparse_scrub).
 */
static int scan_maps(uid_t uid, uint64_t from, uint64_t to, uint8_t *buf)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int found = 0;

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];

		if (!strstr(line, "/memfd:") || sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 ||
		    perms[0] != 'r' || perms[1] == 'w')
			continue;
		for (uint64_t i = from; i < to; i++) {
			kvb_key k = harness_key(uid, i);

			harness_fill(buf, PAGE, &k, uid);
			if (memmem((void *)lo, hi - lo, buf + 4096, 256))
				found++;
		}
	}
	fclose(f);
	return found;
}

/*
 * hold: store page 0 and stay until killed. b1, b2: B's writes, then all of B's pages there.
 * a1, a2: A's writes, then every page of A there, and none of B's in A's view. check-b: B's
 * oldest gone, its newest there. scan-b: B's whole mapping holds none of A's bytes (and its
 * own newest page). share: a tenant setting a share: -EPERM.
 */
static int client_main(const char *mode, const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	size_t hits = 1;
	kvb_client *c = attach(sock, mode, &ns);

	CHECK(buf != NULL);
	if (!strcmp(mode, "hold")) {
		put_range(c, ns, 0, 1, buf);
		for (;;)
			pause();
	}
	if (!strcmp(mode, "b1")) {
		put_range(c, ns, 1, 1 + NB1, buf);
		check_range(c, ns, getuid(), 0, 1 + NB1, buf);
	} else if (!strcmp(mode, "b2")) {
		put_range(c, ns, 1 + NB1, 1 + NB1 + NB2, buf);
		check_range(c, ns, getuid(), 0, 1 + NB1 + NB2, buf);
	} else if (!strcmp(mode, "a1") || !strcmp(mode, "a2")) {
		uint64_t end = 1 + NA1 + (mode[1] == '2' ? NA2 : 0);
		kvb_key bk = harness_key(UID0 + 1, NB1);

		put_range(c, ns, mode[1] == '2' ? 1 + NA1 : 1, end, buf);
		check_range(c, ns, getuid(), 0, end, buf);
		/* 0 bytes across tenants: B's newest page is there, in B's namespace only. */
		CHECK_RC(kvb_get(c, ns, bk, buf, PAGE), -ENOENT);
		CHECK_OK(kvb_lookup(c, ns, &bk, 1, &hits));
		CHECK_EQ(hits, 0);
	} else if (!strcmp(mode, "check-b")) {
		kvb_key k = harness_key(getuid(), 1);

		CHECK_RC(kvb_get(c, ns, k, buf, PAGE), -ENOENT);
		check_range(c, ns, getuid(), 1 + NB1, 1 + NB1 + NB2, buf);
	} else if (!strcmp(mode, "scan-b")) {
		kvb_key k = harness_key(getuid(), NB1 + NB2);
		struct kvb_lease lease;

		CHECK_OK(kvb_acquire(c, ns, k, &lease)); /* the pool is mapped: the scan is real */
		CHECKF(scan_maps(getuid() - 1, 0, 1 + NA1, buf) == 0,
		       "B sees A's bytes in its map");
		harness_fill(buf, PAGE, &k, getuid());
		CHECKF(memmem(lease.data, PAGE, buf + 4096, 256) != NULL,
		       "B's lease is not its page");
		CHECKF(scan_maps(getuid(), NB1 + NB2, 1 + NB1 + NB2, buf) == 1,
		       "the scan misses B's own page");
		CHECK_OK(kvb_release(c, &lease));
	} else if (!strcmp(mode, "share")) {
		CHECK_RC(kvb_tenant_share(c, "4401", 60 * MiB, 0), -EPERM);
	} else {
		return 9;
	}
	kvb_close(c);
	free(buf);
	return 0;
}

static int run_as(uid_t uid, gid_t gid, const char *mode)
{
	return harness_wait_exit(harness_start_as(uid, gid, mode, sockp, client_main));
}

/* The stats path of tenant uid's figure. */
static uint64_t tstat(kvb_client *c, uid_t uid, const char *what)
{
	char path[96];

	snprintf(path, sizeof(path), "tenants[id=%d].%s", (int)uid, what);
	return harness_stat(c, path);
}

/* Bytes the memfd of tenant uid's partition holds now (st_blocks, as the broker reads it). */
static uint64_t part_rss(kvb_client *c, uid_t uid)
{
	char path[96];

	snprintf(path, sizeof(path), "pool.arenas[partition=%llu].rss_bytes",
		 (unsigned long long)tstat(c, uid, "partition"));
	return harness_stat(c, path);
}

int main(int argc, char **argv)
{
	const uid_t A = UID0, B = UID0 + 1;
	struct harness_broker *b;
	struct group *g = getgrnam("users");
	struct kvb_opts o = {.socket_path = sockp, .name = "operator"};
	pid_t hold[NUIDS];
	kvb_client *ctl, *root;
	uint64_t budget, pages, rss_b;
	char args[300], *out = NULL;

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	if (geteuid() != 0)
		harness_skip("needs root to run clients as six uids");
	if (!g)
		g = getgrnam("nogroup");
	if (!g)
		harness_skip("no group 'users' or 'nogroup' to admit");
	snprintf(dir, sizeof(dir), "/tmp/kvbt-lend-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	snprintf(rundir, sizeof(rundir), "%s/run", dir);
	snprintf(sockp, sizeof(sockp), "%s/sock", rundir);
	snprintf(args, sizeof(args),
		 "--socket %s/refused.sock --pool 64M --tenants uid --hugepages 2M", dir);
	CHECK(harness_run_tool("kvbrokerd", args, &out) != 0);
	CHECKF(strstr(out, "hugetlb pages") && strstr(out, "--hugepages auto or off"),
	       "--tenants with --hugepages 2M: %s", out);
	free(out);
	b = harness_broker_start("--pool", "64M", "--slab", "1M", "--tenants", "uid",
				 "--tenant-idle", "1s", "--group", g->gr_name, "--socket", sockp);
	o.flags = KVB_CONNECT_CONTROL;
	CHECK_OK(kvb_connect(&o, &ctl));

	harness_log("six uids and root attach with the default (four) shares");
	for (int i = 0; i < NUIDS; i++)
		hold[i] = harness_start_as(UID0 + i, g->gr_gid, "hold", sockp, client_main);
	CHECK_EQ(harness_stat_wait(ctl, "pool.pages", NUIDS, 10000), NUIDS);
	root = harness_connect(b, "root", 0);
	CHECK_EQ(harness_stat(ctl, "clients"), NUIDS + 1);
	CHECK(!harness_broker_log_has(b, "every tenant share is taken"));
	budget = harness_stat(ctl, "pool.bytes_total");
	CHECK(budget > 60 * MiB && budget <= 64 * MiB);
	/* Seven shares of 16 MiB in a pool of four: each guarantee scaled by 4/7. */
	for (int i = 0; i < NUIDS; i++) {
		uint64_t want = (uint64_t)(16.0 * MiB * (double)budget / (7.0 * 16 * MiB));

		CHECK_EQ(tstat(ctl, UID0 + i, "share_bytes"), 16 * MiB);
		CHECK(tstat(ctl, UID0 + i, "guarantee_bytes") + 1 >= want &&
		      tstat(ctl, UID0 + i, "guarantee_bytes") <= want + 1);
	}
	CHECK_EQ(tstat(ctl, 0, "bound"), 1); /* root's own partition */

	harness_log("four leave: released after --tenant-idle, their pages kept");
	for (int i = 2; i < NUIDS; i++) {
		kill(hold[i], SIGKILL);
		harness_wait_exit(hold[i]);
	}
	for (int i = 2; i < NUIDS; i++) {
		char path[64];

		snprintf(path, sizeof(path), "tenants[id=%d].released", UID0 + i);
		CHECK_EQ(harness_stat_wait(ctl, path, 1, 5000), 1);
	}
	for (int i = 2; i < NUIDS; i++) {
		CHECK_EQ(tstat(ctl, UID0 + i, "released"), 1);
		CHECK_EQ(tstat(ctl, UID0 + i, "guarantee_bytes"), 0);
		CHECK_EQ(tstat(ctl, UID0 + i, "pages"), 1);
	}
	CHECK(harness_broker_log_has(b, "its share is released"));
	CHECK_EQ(tstat(ctl, A, "guarantee_bytes"), 16 * MiB); /* three left: 48 of 64 MiB */

	harness_log("B writes 50 MiB into the idle capacity: all stored, all served");
	CHECK_EQ(run_as(B, g->gr_gid, "b1"), 0);
	CHECK(tstat(ctl, B, "resident_bytes") >= (NB1 + 1) * (uint64_t)PAGE);
	CHECK_EQ(tstat(ctl, B, "evictions"), 0);
	harness_log("past the pool's end: the released tenants' pages go first");
	CHECK_EQ(run_as(B, g->gr_gid, "b2"), 0);
	pages = 0;
	for (int i = 2; i < NUIDS; i++)
		pages += tstat(ctl, UID0 + i, "pages");
	CHECK(pages < NUIDS - 2);
	CHECK_EQ(tstat(ctl, B, "evictions"), 0);
	CHECK(harness_stat(ctl, "pool.lend_reclaims") >= 1);
	rss_b = part_rss(ctl, B);
	CHECK(rss_b >= (NB1 + NB2) * (uint64_t)PAGE);

	harness_log("A comes back and fills its share: B's oldest go, every page of A stays");
	CHECK_EQ(run_as(A, g->gr_gid, "a1"), 0);
	CHECK(tstat(ctl, B, "evictions") > 0);
	CHECK_EQ(tstat(ctl, A, "evictions"), 0);
	CHECK(tstat(ctl, A, "resident_bytes") >= (NA1 + 1) * (uint64_t)PAGE);
	CHECK_EQ(run_as(B, g->gr_gid, "check-b"), 0);
	/* Given back to the machine, not only to the store: B's memfd holds less. */
	CHECKF(part_rss(ctl, B) + 8 * MiB <= rss_b, "B's partition holds %llu bytes, %llu before",
	       (unsigned long long)part_rss(ctl, B), (unsigned long long)rss_b);
	CHECK(harness_stat(ctl, "pool.resident_bytes") <= budget);

	harness_log("B scans its whole mapping: none of A's bytes; what the reads faulted in goes");
	CHECK_EQ(run_as(B, g->gr_gid, "scan-b"), 0);
	/* Its memfd holds its slabs and directory again within a scrub or two (one a second). */
	for (int i = 0; i < 1200 && part_rss(ctl, B) > tstat(ctl, B, "resident_bytes") + 2 * MiB;
	     i++)
		usleep(10000);
	CHECKF(part_rss(ctl, B) <= tstat(ctl, B, "resident_bytes") + 2 * MiB,
	       "B's memfd holds %llu bytes, its slabs %llu", (unsigned long long)part_rss(ctl, B),
	       (unsigned long long)tstat(ctl, B, "resident_bytes"));
	CHECK(harness_broker_log_has(b, "faulted into free ranges by clients' reads given back"));

	harness_log("shares at run time: not for tenants; lowering loses nothing");
	CHECK_EQ(run_as(A, g->gr_gid, "share"), 0);
	pages = harness_stat(ctl, "pool.pages");
	CHECK_OK(kvb_tenant_share(ctl, "4402", 8 * MiB, 0));
	CHECK_EQ(tstat(ctl, B, "share_bytes"), 8 * MiB);
	CHECK_EQ(tstat(ctl, B, "share_set"), 1);
	CHECK_EQ(harness_stat(ctl, "pool.pages"), pages);
	CHECK(harness_broker_log_has(b, "tenant-share uid 4402: 8.0 MiB"));
	CHECK_RC(kvb_tenant_share(ctl, "no-such-user-kvbt", 8 * MiB, 0), -ENOENT);
	CHECK_RC(kvb_tenant_share(ctl, "4401", MiB, 0), -EINVAL);

	harness_log("raising A's share: A stores 20 MiB more, all kept, taken from B");
	CHECK_OK(kvb_tenant_share(ctl, "4401", 40 * MiB, 0));
	CHECK(tstat(ctl, A, "guarantee_bytes") > 36 * MiB);
	CHECK_EQ(run_as(A, g->gr_gid, "a2"), 0);
	CHECK_EQ(tstat(ctl, A, "evictions"), 0);
	CHECK_EQ(tstat(ctl, A, "pages"), 1 + NA1 + NA2);
	CHECK_OK(kvb_tenant_share(ctl, "4401", 0, 0)); /* back to the default */
	CHECK_EQ(tstat(ctl, A, "share_bytes"), 16 * MiB);
	CHECK_EQ(tstat(ctl, A, "pages"), 1 + NA1 + NA2); /* nothing evicted by lowering */

	harness_log("kvbctl tenant-share: sets, and shows shares, guarantees, released tenants");
	snprintf(args, sizeof(args), "--socket %s tenant-share 4402=12M", sockp);
	CHECK_EQ(harness_run_tool("kvbctl", args, &out), 0);
	CHECKF(strstr(out, "tenant-share 4402: 12.0 MiB") != NULL, "kvbctl said: %s", out);
	free(out);
	CHECK_EQ(tstat(ctl, B, "share_bytes"), 12 * MiB);
	snprintf(args, sizeof(args), "--socket %s tenant-share", sockp);
	CHECK_EQ(harness_run_tool("kvbctl", args, &out), 0);
	CHECKF(strstr(out, "guarantee") && strstr(out, "uid 4402") && strstr(out, "released"),
	       "kvbctl said: %s", out);
	free(out);
	snprintf(args, sizeof(args), "--socket %s tenant-share 4402=lots", sockp);
	CHECK(harness_run_tool("kvbctl", args, &out) != 0);
	free(out);

	kill(hold[0], SIGKILL);
	kill(hold[1], SIGKILL);
	harness_wait_exit(hold[0]);
	harness_wait_exit(hold[1]);
	kvb_close(root);
	kvb_close(ctl);
	harness_broker_stop(b);
	return 0;
}
