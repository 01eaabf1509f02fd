// SPDX-License-Identifier: MIT
/*
 * t_tenant_rebind.c - tenants that come and go for good: a released partition is bound to a new
 * tenant in fresh memory files [tenant-rebind], as real processes of eleven uids (setpriv, as
 * t_tenant_lend does), --tenants uid, --tenant-idle 1s, a kept pool (keeper):
 *   - eight uids take the eight partitions, store and leave; the first keeps its map of its
 *     partition after its client closed (moved aside, so the client's unmap misses it), seeing
 *     its own pages there;
 *   - a ninth, tenth and eleventh uid attach, each given the partition released longest ago,
 *     and store and read their pages; the ninth's is the first uid's old partition;
 *   - the first uid's kept map holds none of the ninth's bytes: every byte of it is zero (the
 *     old file was emptied); the ninth's map holds none of the first's;
 *   - the first uid comes back: a partition of its own again, none of its old pages, none of
 *     the ninth's, and it stores again;
 *   - the broker SIGKILLed and started again adopts the pool from the keeper: the ninth's and
 *     the first's new pages are all there, byte-exact, in the new files.
 * Root only (setpriv); skipped elsewhere.
 */
#include <errno.h>
#include <grp.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "reliab.h"

#define UID0 4501 /* eight first tenants: UID0 .. UID0 + 7, then three new ones */
#define NFIRST 8
#define PAGE (256u * 1024) /* 16 tokens x 4 layers x 4 KiB */
#define NP 8		   /* pages each tenant stores */
#define MAXKEPT 16

static char dir[128], rundir[160], sockp[200];
static volatile sig_atomic_t go;

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
	harness_layout(&l, "rebind/model", KVB_LAYOUT_MLA, 16, 1, 0, 4, 4096);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

/* Keys [from, to) of this uid's seed (with salt), stored: none "already there". */
static void put_range(kvb_client *c, uint32_t ns, uint64_t salt, uint8_t *buf)
{
	for (uint64_t i = 0; i < NP; i++) {
		kvb_key k = harness_key(getuid() + salt, i);

		harness_fill(buf, PAGE, &k, getuid() + salt);
		CHECKF(kvb_put(c, ns, k, buf, PAGE) == 0, "PUT %llu of uid %d refused",
		       (unsigned long long)i, (int)getuid());
	}
}

/* Every key of uid's seed (with salt) served exact, or (want 0) none served. */
static void check_range(kvb_client *c, uint32_t ns, uint64_t seed, int want, uint8_t *buf)
{
	for (uint64_t i = 0; i < NP; i++) {
		kvb_key k = harness_key(seed, i);
		int rc = kvb_get(c, ns, k, buf, PAGE);

		if (!want) {
			CHECKF(rc == -ENOENT, "page %llu of seed %llu served (%d)",
			       (unsigned long long)i, (unsigned long long)seed, rc);
			continue;
		}
		CHECKF(rc == (int)PAGE, "page %llu of seed %llu: get %d", (unsigned long long)i,
		       (unsigned long long)seed, rc);
		CHECK(harness_verify(buf, PAGE, &k, seed, "a tenant's page") == 0);
	}
}

/* How many pages of seed (a 256-byte window of each) [lo, hi) shows. */
static int scan_range(const uint8_t *lo, size_t len, uint64_t seed, uint8_t *buf)
{
	int found = 0;

	for (uint64_t i = 0; i < NP; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(buf, PAGE, &k, seed);
		if (memmem(lo, len, buf + 4096, 256))
			found++;
	}
	return found;
}

/* The same over every read-only memfd map of this process (its pool partition). */
static int scan_maps(uint64_t seed, uint8_t *buf)
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
		found += scan_range((const uint8_t *)lo, hi - lo, seed, buf);
	}
	fclose(f);
	return found;
}

struct kept {
	uint8_t *base;
	size_t len;
};

/*
 * Moves every read-only memfd map (the pool partition's) aside, so that kvb_close() unmaps
 * nothing of it: what a process that keeps its map after its client closed holds.
 */
static uint32_t keep_maps(struct kept *k)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	unsigned long lo[MAXKEPT], hi[MAXKEPT];
	uint32_t n = 0;

	CHECK(f != NULL);
	while (n < MAXKEPT && fgets(line, sizeof(line), f)) {
		char perms[8];

		if (strstr(line, "/memfd:") && !strstr(line, "ring") &&
		    sscanf(line, "%lx-%lx %7s", &lo[n], &hi[n], perms) == 3 && perms[0] == 'r' &&
		    perms[1] != 'w')
			n++;
	}
	fclose(f);
	for (uint32_t i = 0; i < n; i++) {
		size_t len = hi[i] - lo[i];
		void *to = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);

		CHECK(to != MAP_FAILED);
		k[i].base = mremap((void *)lo[i], len, len, MREMAP_MAYMOVE | MREMAP_FIXED, to);
		CHECK(k[i].base != MAP_FAILED);
		k[i].len = len;
	}
	return n;
}

static void on_usr1(int sig)
{
	(void)sig;
	go = 1;
}

/*
 * put: store this uid's pages and leave. keep: the same, keeping the map aside; on SIGUSR1,
 * every byte of it must be zero. new: a new tenant stores and reads its pages, and its map
 * shows none of the first uid's. back: the first uid again: none of its old pages, none of the
 * ninth's, new ones stored. check-new, check-back: after the restart, those pages there.
 * arg: the socket (a client is this binary run again: it has none of main's globals).
 */
static int client_main(const char *mode, const char *arg)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c;
	struct kept k[MAXKEPT];
	uint32_t nk = 0;

	CHECK(buf != NULL);
	if (!strcmp(mode, "keep"))
		signal(SIGUSR1, on_usr1);
	c = attach(arg, mode, &ns);
	if (!strcmp(mode, "put") || !strcmp(mode, "keep") || !strcmp(mode, "new")) {
		put_range(c, ns, 0, buf);
		check_range(c, ns, getuid(), 1, buf);
	}
	if (!strcmp(mode, "new"))
		CHECKF(scan_maps(UID0, buf) == 0, "a new tenant sees the old one's bytes");
	if (!strcmp(mode, "keep")) {
		uint64_t own = 0;

		nk = keep_maps(k);
		CHECK(nk >= 1);
		for (uint32_t i = 0; i < nk; i++)
			own += (uint64_t)scan_range(k[i].base, k[i].len, getuid(), buf);
		CHECKF(own == NP, "the kept map shows %llu of its own %u pages",
		       (unsigned long long)own, NP);
		kvb_close(c);
		while (!go)
			pause();
		for (uint32_t i = 0; i < nk; i++) {
			uint64_t nz = 0;

			CHECKF(scan_range(k[i].base, k[i].len, UID0 + NFIRST, buf) == 0,
			       "the old tenant's kept map shows the new tenant's bytes");
			for (size_t j = 0; j < k[i].len; j++)
				nz += k[i].base[j] != 0;
			CHECKF(nz == 0, "the old tenant's kept map holds %llu non-zero bytes",
			       (unsigned long long)nz);
		}
		free(buf);
		return 0;
	}
	if (!strcmp(mode, "back")) {
		check_range(c, ns, getuid(), 0, buf);
		check_range(c, ns, UID0 + NFIRST, 0, buf);
		put_range(c, ns, 1000, buf);
		check_range(c, ns, getuid() + 1000, 1, buf);
		CHECKF(scan_maps(UID0 + NFIRST, buf) == 0,
		       "the old tenant sees the new one's bytes");
	} else if (!strcmp(mode, "check-new")) {
		check_range(c, ns, getuid(), 1, buf);
	} else if (!strcmp(mode, "check-back")) {
		check_range(c, ns, getuid() + 1000, 1, buf);
	} else if (strcmp(mode, "put") && strcmp(mode, "new")) {
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

static uint64_t tstat(kvb_client *c, uid_t uid, const char *what)
{
	char path[96];

	snprintf(path, sizeof(path), "tenants[id=%d].%s", (int)uid, what);
	return harness_stat(c, path);
}

/* Waits until uid's share is released (--tenant-idle 1s). */
static void wait_released(kvb_client *ctl, uid_t uid)
{
	char path[96];

	snprintf(path, sizeof(path), "tenants[id=%d].released", (int)uid);
	CHECK_EQ(harness_stat_wait(ctl, path, 1, 5000), 1);
}

static kvb_client *control(void)
{
	struct kvb_opts o = {.socket_path = sockp, .name = "operator"};
	kvb_client *ctl = NULL;

	o.flags = KVB_CONNECT_CONTROL;
	CHECK_OK(kvb_connect(&o, &ctl));
	return ctl;
}

int main(int argc, char **argv)
{
	const uid_t NEW = UID0 + NFIRST;
	struct group *g = getgrnam("users");
	const char *args[16] = {"--pool", "64M",	   "--slab", "1M",     "--tenants",
				"uid",	  "--tenant-idle", "1s",     "--group"};
	struct harness_broker *b;
	uint64_t part0;
	kvb_client *ctl;
	pid_t keeper;
	int n = 9;

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	if (geteuid() != 0)
		harness_skip("needs root to run clients as eleven uids");
	if (!g)
		g = getgrnam("nogroup");
	if (!g)
		harness_skip("no group 'users' or 'nogroup' to admit");
	snprintf(dir, sizeof(dir), "/tmp/kvbt-rebind-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	snprintf(rundir, sizeof(rundir), "%s/run", dir);
	snprintf(sockp, sizeof(sockp), "%s/sock", rundir);
	args[n++] = g->gr_name;
	args[n++] = "--socket";
	args[n++] = sockp;
	args[n] = NULL;
	b = harness_broker_startv(args);
	ctl = control();

	harness_log("eight uids take the eight partitions and leave; the first keeps its map");
	keeper = harness_start_as(UID0, g->gr_gid, "keep", sockp, client_main);
	CHECK_EQ(harness_stat_wait(ctl, "pool.pages", NP, 10000), NP);
	CHECK_EQ(harness_stat_wait(ctl, "clients", 0, 10000), 0);
	part0 = tstat(ctl, UID0, "partition");
	for (uid_t u = UID0 + 1; u < UID0 + NFIRST; u++)
		CHECK_EQ(run_as(u, g->gr_gid, "put"), 0);
	for (uid_t u = UID0; u < UID0 + NFIRST; u++)
		wait_released(ctl, u);
	CHECK_EQ(harness_stat(ctl, "pool.pages"), NFIRST * NP);

	harness_log("a ninth uid: the first's partition, in new memory files");
	CHECK_EQ(run_as(NEW, g->gr_gid, "new"), 0);
	CHECK_EQ(tstat(ctl, NEW, "partition"), part0);
	CHECK(harness_broker_log_has(b, "new memory files in place of the old ones"));
	CHECK_EQ(harness_stat(ctl, "pool.pages"), NFIRST * NP); /* UID0's 8 gone, NEW's 8 */

	harness_log("the first uid's kept map: none of the ninth's bytes, all zero");
	CHECK_OK(kill(keeper, SIGUSR1));
	CHECK_EQ(harness_wait_exit(keeper), 0);

	harness_log("a tenth and an eleventh uid attach too");
	wait_released(ctl, NEW);
	CHECK_EQ(run_as(NEW + 1, g->gr_gid, "put"), 0);
	CHECK_EQ(run_as(NEW + 2, g->gr_gid, "put"), 0);

	harness_log("the first uid comes back: none of its old pages, none of the ninth's");
	CHECK_EQ(run_as(UID0, g->gr_gid, "back"), 0);
	CHECK(tstat(ctl, UID0, "partition") != part0);
	kvb_close(ctl);

	harness_log("SIGKILL, then the same command line: the new files adopted");
	rel_kill(b->pid);
	b->pid = 0;
	b = harness_broker_startv(args);
	CHECKF(harness_broker_log_has(b, "adopt: "), "no adoption logged");
	CHECK_EQ(run_as(NEW, g->gr_gid, "check-new"), 0);
	CHECK_EQ(run_as(UID0, g->gr_gid, "check-back"), 0);
	harness_broker_stop(b);
	return H_PASS;
}
