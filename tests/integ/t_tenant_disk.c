// SPDX-License-Identifier: MIT
/*
 * t_tenant_disk.c - per-tenant disk shares and per-tenant STATS, as real processes of two uids
 * (setpriv, as t_tenants does), with --tenants uid and a disk tier:
 *   - shares: A (listed: --tenant A=32M,64M) stores most of the pool (it borrows the idle
 *     shares), and B, taking its own guarantee back, pushes A's oldest pages to A's 64 MiB
 *     region of the disk; B floods RAM and disk (its region, the disk left over
 *     in proportion to the shares of all eight partitions, wraps several times:
 *     disk.dropped > 0; its oldest page is gone, its newest 24 are served); every page of A is still
 *     served, byte-exact, and A's region still holds its pages;
 *   - views: B's `kvbctl status --json` before B ever attached shows nothing of A; A's STATS (kvb_stats_json and `kvbctl ns`, `kvbctl clients` run as uid A) show
 *     A's namespace and client and none of B's (model name, client name), A's partition of
 *     the pool and its region of the disk, and no node-wide I/O counters; the operator (root)
 *     sees both tenants and every partition's region;
 *   - restart with the same flags: the scan finds A's pages in A's region (each region is a
 *     log of its own) and serves them exact;
 *   - restart with another cut (A's region now 16 MiB): nothing is served wrong; a page is
 *     exact or a miss, and B still sees none of A's.
 * Root only (setpriv); skipped elsewhere.
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <liburing.h>

#include "harness.h"

#define KVBCTL_ENV "KVBT_KVBCTL"

#define UID_A 4242
#define UID_B 4243
#define NA 48  /* A's pages: most of the 64 MiB pool, borrowed, until B takes its share back */
#define NB 200 /* B's flood: about five times its RAM and disk */
#define SEED_A 300
#define SEED_B 400
#define PAGE (1u << 20) /* 16 layers x 1 KiB x 64 tokens */

static kvb_client *attach(const char *sock, const char *name, const char *model, uint32_t *ns)
{
	struct kvb_opts o = {.socket_path = sock, .name = name};
	struct kvb_layout l;
	kvb_client *c = NULL;
	size_t pb;

	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, model, KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

static void put_range(kvb_client *c, uint32_t ns, uint64_t seed, uint64_t n, uint8_t *buf)
{
	for (uint64_t i = 0; i < n; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(buf, PAGE, &k, seed);
		CHECK_RC(kvb_put(c, ns, k, buf, PAGE), 0);
	}
}

static int mode_a_put(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-a", "tenants/model-a", &ns);

	put_range(c, ns, SEED_A, NA, buf);
	kvb_close(c);
	free(buf);
	return 0;
}

static int mode_b_flood(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-b", "tenants/model-b", &ns);

	put_range(c, ns, SEED_B, NB, buf);
	/* Over its share B lost its own oldest pages; its newest are there (newest first: a
	 * promotion demotes a RAM page, which overwrites B's oldest slots, not these): what its
	 * 21 MiB guarantee (less pages still being written out) and its 36 MiB region hold. */
	CHECK_RC(kvb_get(c, ns, harness_key(SEED_B, 0), buf, PAGE), -ENOENT);
	for (uint64_t i = NB; i-- > NB - 24;) {
		kvb_key k = harness_key(SEED_B, i);

		CHECKF(kvb_get(c, ns, k, buf, PAGE) == (int)PAGE, "B's page %llu of %d gone",
		       (unsigned long long)i, NB);
		CHECK(harness_verify(buf, PAGE, &k, SEED_B, "B's newest page") == 0);
	}
	kvb_close(c);
	free(buf);
	return 0;
}

/* Stays attached (its client and namespace in the stats) until killed. */
static int mode_b_idle(const char *sock)
{
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-b-idle", "tenants/model-b", &ns);

	for (int i = 0; i < 1200; i++) {
		CHECK_OK(kvb_nop(c));
		usleep(25000);
	}
	kvb_close(c);
	return 0;
}

/* B probes A's keys: never served to B, whatever cut the disk has. */
static int mode_b_probe(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-b", "tenants/model-a", &ns);

	for (uint64_t i = 0; i < NA; i++)
		CHECK_RC(kvb_get(c, ns, harness_key(SEED_A, i), buf, PAGE), -ENOENT);
	kvb_close(c);
	free(buf);
	return 0;
}

/* B's kvbctl before B ever attached: a tenant with no partition sees nothing of A. */
static int mode_b_unbound(const char *sock)
{
	char args[300], *out = NULL;

	snprintf(args, sizeof(args), "--socket %s status --json", sock);
	CHECK_EQ(harness_run_tool(getenv(KVBCTL_ENV), args, &out), 0);
	CHECKF(harness_stat_f64(out, "partition") == -1 && !harness_stat_has(out, "map[0]") &&
		       !strstr(out, "tenant-a") && !strstr(out, "tenants/model-a"),
	       "kvbctl status --json of a tenant without a partition:\n%s", out);
	free(out);
	return 0;
}

/* Every page of A, exact; with lenient, a miss is allowed. Returns how many were served. */
static int check_a(kvb_client *c, uint32_t ns, uint8_t *buf, int lenient)
{
	int served = 0;

	for (uint64_t i = 0; i < NA; i++) {
		kvb_key k = harness_key(SEED_A, i);
		int rc = kvb_get(c, ns, k, buf, PAGE);

		CHECKF(rc == (int)PAGE || (lenient && rc == -ENOENT), "A's page %llu: %d (%s)",
		       (unsigned long long)i, rc, harness_strerror(rc));
		if (rc == (int)PAGE) {
			CHECK(harness_verify(buf, PAGE, &k, SEED_A, "A's page") == 0);
			served++;
		}
	}
	return served;
}

/* A's own view of the stats: its namespace, client and shares; nothing of B. */
static void check_view(kvb_client *c, const char *sock)
{
	char *js = harness_stats(c), args[300], *out = NULL;

	CHECKF(strstr(js, "\"view\":\"tenant\""), "A's stats are not a tenant view: %s", js);
	CHECKF(strstr(js, "tenants/model-a"), "A does not see its own namespace: %s", js);
	CHECKF(!strstr(js, "tenants/model-b"), "A sees B's model name: %s", js);
	CHECKF(!strstr(js, "tenant-b"), "A sees B's client: %s", js);
	CHECK_EQ(harness_stat_u64(js, "clients"), 1);
	/* Its share and guarantee; the RAM it may hold, borrowing, is the pool's [tenant-lend]. */
	CHECK_EQ(harness_stat_u64(js, "pool.share_bytes"), 32u << 20);
	/* A third of the pool less its directories: A, root and B share it. */
	CHECK_EQ(harness_stat_u64(js, "pool.guarantee_bytes"),
		 harness_stat_u64(js, "pool.bytes_total") / 3);
	CHECK(harness_stat_u64(js, "pool.bytes_total") > (60u << 20));
	CHECK(harness_stat_u64(js, "pool.bytes_total") < (64u << 20));
	CHECK(harness_stat_u64(js, "namespaces[0].pages") + harness_stat_u64(js, "disk.pages") >=
	      NA);
	CHECK(harness_stat_u64(js, "disk.bytes_total") > (63u << 20));
	CHECK(harness_stat_u64(js, "disk.bytes_total") <= (64u << 20));
	CHECK(!harness_stat_has(js, "disk.writes") && !harness_stat_has(js, "copy") &&
	      !harness_stat_has(js, "ops"));
	free(js);
	snprintf(args, sizeof(args), "--socket %s ns", sock);
	CHECK_EQ(harness_run_tool(getenv(KVBCTL_ENV), args, &out), 0);
	CHECKF(strstr(out, "tenants/model-a") && !strstr(out, "tenants/model-b"),
	       "kvbctl ns as A:\n%s", out);
	free(out);
	snprintf(args, sizeof(args), "--socket %s clients", sock);
	CHECK_EQ(harness_run_tool(getenv(KVBCTL_ENV), args, &out), 0);
	CHECKF(!strstr(out, "tenant-b") && strstr(out, "tenant-a"), "kvbctl clients as A:\n%s",
	       out);
	free(out);
	/* The tenant view has every field kvbctl promises (no "stats lack" warning). */
	snprintf(args, sizeof(args), "--socket %s status", sock);
	CHECK_EQ(harness_run_tool(getenv(KVBCTL_ENV), args, &out), 0);
	CHECKF(!strstr(out, "warning") && !strstr(out, "tenants/model-b"),
	       "kvbctl status as A:\n%s", out);
	free(out);
}

static int mode_a_check(const char *sock, int view, int lenient)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-a", "tenants/model-a", &ns);
	int served = check_a(c, ns, buf, lenient);

	if (view)
		check_view(c, sock);
	kvb_close(c);
	free(buf);
	return served == NA ? 0 : 100 + served % 100;
}

static int client_main(const char *mode, const char *sock)
{
	alarm(60);
	if (!strcmp(mode, "a-put"))
		return mode_a_put(sock);
	if (!strcmp(mode, "b-flood"))
		return mode_b_flood(sock);
	if (!strcmp(mode, "b-idle"))
		return mode_b_idle(sock);
	if (!strcmp(mode, "b-unbound"))
		return mode_b_unbound(sock);
	if (!strcmp(mode, "b-probe"))
		return mode_b_probe(sock);
	if (!strcmp(mode, "a-check"))
		return mode_a_check(sock, 0, 0);
	if (!strcmp(mode, "a-view"))
		return mode_a_check(sock, 1, 0);
	if (!strcmp(mode, "a-lenient"))
		return mode_a_check(sock, 0, 1);
	return 99;
}

static char dir[128], rundir[160], sockp[200], cache[200], ctl[200];

/*
 * The tenants run kvbctl as their own uids, and the build tree may be where they cannot go (a
 * checkout under /root, mode 0700): they run a copy in our 0711 directory (kvbctl links
 * libkvbroker statically), named by KVBCTL_ENV for children that setpriv exec'd.
 */
static void copy_kvbctl(void)
{
	char src[4096], *cmd;

	harness_bin_path("kvbctl", src, sizeof(src));
	snprintf(ctl, sizeof(ctl), "%s/kvbctl", dir);
	CHECK(asprintf(&cmd, "cp '%s' '%s' && chmod 0755 '%s'", src, ctl, ctl) > 0);
	CHECK_EQ(system(cmd), 0);
	free(cmd);
	CHECK_OK(setenv(KVBCTL_ENV, ctl, 1));
}

static void remove_dirs(void)
{
	unlink(sockp);
	unlink(cache);
	unlink(ctl);
	rmdir(rundir);
	rmdir(dir);
}

static pid_t start_as(uid_t uid, gid_t gid, const char *mode)
{
	return harness_start_as(uid, gid, mode, sockp, client_main);
}

static int run_as(uid_t uid, gid_t gid, const char *mode)
{
	return harness_wait_exit(start_as(uid, gid, mode));
}

static struct harness_broker *start(const char *group, const char *a_share)
{
	return harness_broker_start("--pool", "64M", "--tenants", "uid", "--tenant", a_share,
				    "--tenant-share", "32M", "--group", group, "--socket", sockp,
				    "--disk", cache, "--disk-size", "320M");
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct group *g = getgrnam("users");
	struct io_uring r;
	uint64_t a_pages, dropped;
	kvb_client *c;
	pid_t idle;
	char *js;

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	/* A disk share with no disk tier would never apply: refused at start-up, not ignored. */
	for (int i = 0; i < 2; i++) {
		char *out;
		int st = harness_run_tool(
			"kvbrokerd",
			i ? "--socket /tmp/kvbt-nodisk.sock --pool 64M --tenants uid "
			    "--tenant-share 8M,1G"
			  : "--socket /tmp/kvbt-nodisk.sock --pool 64M --tenants uid "
			    "--tenant 0=32M,64M",
			&out);

		CHECKF(st == 2 && strstr(out, "needs --disk"), "exit %d:\n%s", st, out);
		free(out);
	}
	if (geteuid() != 0)
		harness_skip("needs root to run clients as two uids");
	if (io_uring_queue_init(2, &r, 0))
		harness_skip("io_uring unavailable here");
	io_uring_queue_exit(&r);
	if (!g)
		g = getgrnam("nogroup");
	if (!g)
		harness_skip("no group 'users' or 'nogroup' to admit");
	snprintf(dir, sizeof(dir), "/tmp/kvbt-tenant-disk-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	snprintf(rundir, sizeof(rundir), "%s/run", dir);
	snprintf(sockp, sizeof(sockp), "%s/sock", rundir);
	snprintf(cache, sizeof(cache), "%s/cache", dir);
	copy_kvbctl();

	/* A: 32 MiB of RAM, 64 MiB of disk; shares of 32 MiB for root, B and five spare
	 * partitions, each (319 - 64) / 7 MiB of disk. A, root and B bound: each guaranteed a
	 * third of the pool. */
	b = start(g->gr_name, "4242=32M,64M");
	CHECK(harness_broker_log_has(b, "tenant partition 0: 64 MiB of the disk"));
	c = harness_connect(b, "operator", 0);

	harness_log("A stores %d pages: most of the pool, borrowed", NA);
	CHECK_EQ(run_as(UID_A, g->gr_gid, "a-put"), 0);
	js = harness_stats(c);
	a_pages = harness_stat_u64(js, "disk.partitions[partition=0].pages");
	free(js);
	CHECK_EQ(run_as(UID_B, g->gr_gid, "b-unbound"), 0);
	harness_log("B floods RAM and disk: %d pages", NB);
	CHECK_EQ(run_as(UID_B, g->gr_gid, "b-flood"), 0);
	js = harness_stats(c);
	/* B took its guarantee back from A: A's oldest pages went to A's region. */
	CHECKF(harness_stat_u64(js, "disk.partitions[partition=0].pages") >= 1,
	       "only %llu of A's pages went to disk",
	       (unsigned long long)harness_stat_u64(js, "disk.partitions[partition=0].pages"));
	dropped = harness_stat_u64(js, "disk.dropped");
	CHECKF(dropped >= 50, "B's flood dropped %llu disk pages: its region did not wrap",
	       (unsigned long long)dropped);
	CHECK(harness_stat_u64(js, "disk.partitions[partition=0].pages") >= a_pages);
	harness_log("A's region holds %llu pages (%llu before B's flood); B's dropped %llu",
		    (unsigned long long)harness_stat_u64(js, "disk.partitions[partition=0].pages"),
		    (unsigned long long)a_pages, (unsigned long long)dropped);
	free(js);

	harness_log("A: every page served exact; its view shows none of B");
	idle = start_as(UID_B, g->gr_gid, "b-idle");
	CHECK_EQ(harness_stat_wait(c, "clients", 2, 5000), 2); /* the operator and B idle */
	CHECK_EQ(run_as(UID_A, g->gr_gid, "a-view"), 0);
	CHECK_GT(harness_stat(c, "disk.promotions"), 0);
	/* The operator sees both tenants. */
	js = harness_stats(c);
	CHECK(strstr(js, "tenants/model-a") && strstr(js, "tenants/model-b") &&
	      strstr(js, "tenant-b-idle") && strstr(js, "\"view\":\"all\""));
	free(js);
	kill(idle, SIGTERM);
	harness_wait_exit(idle);
	kvb_close(c);
	harness_broker_stop(b);

	harness_log("restart, same flags: A's region scanned, its pages served exact");
	b = start(g->gr_name, "4242=32M,64M");
	CHECK(harness_broker_log_has(b, "warm restart"));
	CHECK_EQ(run_as(UID_A, g->gr_gid, "a-check"), 0);
	harness_broker_stop(b);

	harness_log("restart with A's region cut to 16 MiB: exact or a miss, never B's");
	b = start(g->gr_name, "4242=32M,16M");
	CHECK_EQ(run_as(UID_B, g->gr_gid, "b-probe"), 0);
	{
		int rc = run_as(UID_A, g->gr_gid, "a-lenient");

		CHECKF(rc == 0 || (rc >= 100 && rc < 100 + NA), "A after the re-cut: exit %d", rc);
	}
	harness_broker_stop(b);
	return H_PASS;
}
