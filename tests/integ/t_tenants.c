// SPDX-License-Identifier: MIT
/*
 * t_tenants.c - two tenants (--tenants uid) as real processes of two uids (setpriv, as
 * t_rel_peer does), and every attack on tenant isolation tried by tenant B against tenant A:
 *   - scan: B reads every memfd mapping it has (its read-only pool map included): none of A's
 *     pages is there (B's own page is, so the scan is real);
 *   - guess / probe / delete: GET of A's key -ENOENT, LOOKUP of A's keys 0 hits, DELETE -ENOENT;
 *   - poison: B stores garbage under a key A stores later; A's PUT then stores (0, not 1
 *     "already stored") and A's GET returns A's bytes;
 *   - flood: B PUTs four times its share, the whole pool: it borrows the idle shares, then
 *     evicts its own pages; every page of A is still there (its guarantee held);
 *   - pinning: B leases until refused: -EDQUOT after --max-lease-bytes (1/8 of its share),
 *     while its other client still PUTs; the operator drops a client holding leases (kvbctl
 *     drop), whose leases go, whose next call fails -ECONNRESET and whose stale lease pointer
 *     then faults (the library unmapped the pool).
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

#include "harness.h"

#define UID_A 4242
#define UID_B 4243
#define NA 8 /* A's pages */
#define SEED_A 100
#define SEED_B 200
#define POISON 100	/* index of the key B plants before A stores it */
#define PAGE (1u << 20) /* 16 layers x 1 KiB x 64 tokens */

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "tenants/shared-model", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
}

static kvb_client *attach(const char *sock, const char *name, uint32_t *ns)
{
	struct kvb_opts o = {.socket_path = sock, .name = name};
	struct kvb_layout l;
	kvb_client *c = NULL;
	size_t pb;

	CHECK_OK(kvb_connect(&o, &c));
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

static void put_seeded(kvb_client *c, uint32_t ns, uint64_t seed, uint64_t i, uint8_t *buf,
		       long long want)
{
	kvb_key k = harness_key(seed, i);

	harness_fill(buf, PAGE, &k, seed);
	CHECK_RC(kvb_put(c, ns, k, buf, PAGE), want);
}

static int mode_a_put(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-a", &ns);

	for (uint64_t i = 0; i < NA; i++)
		put_seeded(c, ns, SEED_A, i, buf, 0);
	kvb_close(c);
	free(buf);
	return 0;
}

/* How many of these pages (a 256-byte window of each) appear in our read-only memfd maps
 * (the pool: the library's own writable staging buffer holds what we sent). */
static int scan_maps(uint64_t seed, uint64_t n, uint8_t *buf)
{
	FILE *f = fopen("/proc/self/maps", "r");
	char line[512];
	int found = 0;

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f)) {
		unsigned long lo, hi;
		char perms[8];

		if (getenv("TT_DEBUG"))
			fprintf(stderr, "map: %s", line);
		if (!strstr(line, "/memfd:") || sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) != 3 ||
		    perms[0] != 'r' || perms[1] == 'w')
			continue;
		for (uint64_t i = 0; i < n; i++) {
			kvb_key k = harness_key(seed, i);

			harness_fill(buf, PAGE, &k, seed);
			if (memmem((void *)lo, hi - lo, buf + 4096, 256))
				found++;
		}
	}
	fclose(f);
	return found;
}

static int mode_b_attack(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	kvb_key keys[NA];
	struct kvb_lease lease;
	uint32_t ns;
	size_t hits = 99;
	kvb_client *c = attach(sock, "tenant-b", &ns);
	kvb_key k;

	/* Our own page, leased: the pool is mapped and the scan must find it. */
	put_seeded(c, ns, SEED_B, 0, buf, 0);
	k = harness_key(SEED_B, 0);
	CHECK_OK(kvb_acquire(c, ns, k, &lease));
	CHECKF(scan_maps(SEED_B, 1, buf) == 1, "the scan does not see our own page");
	CHECKF(scan_maps(SEED_A, NA, buf) == 0, "tenant B sees tenant A's bytes in its mapping");
	CHECK_OK(kvb_release(c, &lease));

	/* Keys are public (SHA-256 of token ids): guess, probe, delete. */
	for (uint64_t i = 0; i < NA; i++)
		keys[i] = harness_key(SEED_A, i);
	CHECK_RC(kvb_get(c, ns, keys[0], buf, PAGE), -ENOENT);
	CHECK_OK(kvb_lookup(c, ns, keys, NA, &hits));
	CHECK_EQ(hits, 0);
	CHECK_RC(kvb_delete(c, ns, keys[1]), -ENOENT);

	/* Poison: garbage under the key of a prefix A stores later. */
	k = harness_key(SEED_A, POISON);
	memset(buf, 0xEE, PAGE);
	CHECK_RC(kvb_put(c, ns, k, buf, PAGE), 0);

	/* Flood: four times our share (64 MiB), the whole pool: only our own pages go. */
	for (uint64_t i = 1; i <= 256; i++)
		put_seeded(c, ns, SEED_B, i, buf, 0);
	kvb_close(c);
	free(buf);
	return 0;
}

static int mode_a_check(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	uint32_t ns;
	kvb_client *c = attach(sock, "tenant-a", &ns);

	for (uint64_t i = 0; i < NA; i++) {
		kvb_key k = harness_key(SEED_A, i);

		CHECKF(kvb_get(c, ns, k, buf, PAGE) == PAGE, "A's page %llu gone after B's flood",
		       (unsigned long long)i);
		CHECK(harness_verify(buf, PAGE, &k, SEED_A, "A's page after B's attacks") == 0);
	}
	/* B planted this key first: A's PUT still stores A's bytes. */
	put_seeded(c, ns, SEED_A, POISON, buf, 0);
	{
		kvb_key k = harness_key(SEED_A, POISON);

		CHECK_RC(kvb_get(c, ns, k, buf, PAGE), PAGE);
		CHECK(harness_verify(buf, PAGE, &k, SEED_A, "A's page B tried to poison") == 0);
	}
	kvb_close(c);
	free(buf);
	return 0;
}

/* Leases until refused; a second client of the same tenant still PUTs. Exit: leases held. */
static int mode_b_pin(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	struct kvb_lease lease;
	uint32_t ns, ns2;
	kvb_client *c = attach(sock, "pinner", &ns), *c2;
	int n = 0, rc;

	for (;;) {
		kvb_key k = harness_key(SEED_B + 1, (uint64_t)n);

		put_seeded(c, ns, SEED_B + 1, (uint64_t)n, buf, 0);
		rc = kvb_acquire(c, ns, k, &lease);
		if (rc)
			break;
		CHECK(++n < 64);
	}
	CHECKF(rc == -EDQUOT, "lease %d refused with %d (%s), want -EDQUOT", n, rc,
	       harness_strerror(rc));
	c2 = attach(sock, "pinner-2", &ns2);
	for (uint64_t i = 0; i < 80; i++)
		put_seeded(c2, ns2, SEED_B + 2, i, buf, 0);
	kvb_close(c2);
	kvb_close(c);
	free(buf);
	return n;
}

/* Holds leases until the operator drops it; then its lease pointer must fault. */
static int mode_b_hold(const char *sock)
{
	uint8_t *buf = malloc(PAGE);
	struct kvb_lease lease;
	uint32_t ns;
	kvb_client *c = attach(sock, "holder", &ns);
	int rc = 0;

	for (uint64_t i = 0; i < 4; i++) {
		kvb_key k = harness_key(SEED_B + 3, i);

		put_seeded(c, ns, SEED_B + 3, i, buf, 0);
		CHECK_OK(kvb_acquire(c, ns, k, &lease));
	}
	for (int i = 0; i < 400 && !rc; i++) {
		usleep(25000);
		rc = kvb_nop(c);
	}
	CHECKF(rc == -ECONNRESET, "after the drop: %d (%s), want -ECONNRESET", rc,
	       harness_strerror(rc));
	signal(SIGSEGV, SIG_DFL);
	/* The pool is unmapped: this faults rather than reading a page someone else has now. */
	rc = ((const volatile uint8_t *)lease.data)[0];
	return 10 + (rc & 1);
}

static int client_main(const char *mode, const char *sock)
{
	alarm(30);
	if (!strcmp(mode, "a-put"))
		return mode_a_put(sock);
	if (!strcmp(mode, "b-attack"))
		return mode_b_attack(sock);
	if (!strcmp(mode, "a-check"))
		return mode_a_check(sock);
	if (!strcmp(mode, "b-pin"))
		return mode_b_pin(sock);
	if (!strcmp(mode, "b-hold"))
		return mode_b_hold(sock);
	return 99;
}

static char dir[128], rundir[160], sockp[200];

static void remove_dirs(void)
{
	unlink(sockp);
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

/* The id of the attached client named name, from the stats document; 0 when none. */
static uint32_t client_id(kvb_client *c, const char *name)
{
	char *js = harness_stats(c), *p, want[96];
	unsigned id = 0;

	snprintf(want, sizeof(want), "\"name\":\"%s\"", name);
	p = strstr(js, want);
	/* client_list entries: ..."id":N,"pid":...,"name":"..." */
	while (p && p > js && strncmp(p, "\"id\":", 5))
		p--;
	if (p && p > js)
		sscanf(p, "\"id\":%u", &id);
	free(js);
	return id;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct group *g = getgrnam("users");
	char arg[300], *out = NULL;
	kvb_client *c;
	uint32_t id;
	pid_t holder;
	int rc;

	if (argc == 4 && !strcmp(argv[1], "--client"))
		return client_main(argv[2], argv[3]);
	harness_init(argc, argv);
	if (geteuid() != 0)
		harness_skip("needs root to run clients as two uids");
	if (!g)
		g = getgrnam("nogroup");
	if (!g)
		harness_skip("no group 'users' or 'nogroup' to admit");
	snprintf(dir, sizeof(dir), "/tmp/kvbt-tenants-XXXXXX");
	CHECK(mkdtemp(dir) != NULL);
	atexit(remove_dirs);
	CHECK_OK(chmod(dir, 0711));
	snprintf(rundir, sizeof(rundir), "%s/run", dir);
	snprintf(sockp, sizeof(sockp), "%s/sock", rundir);
	/* Four shares of 64 MiB: root (this process), A, B and one spare. */
	b = harness_broker_start("--pool", "256M", "--tenants", "uid", "--tenant-share", "64M",
				 "--group", g->gr_name, "--socket", sockp, "--copy-inline", "0");
	c = harness_connect(b, "operator", 0);

	harness_log("A stores %d pages", NA);
	CHECK_EQ(run_as(UID_A, g->gr_gid, "a-put"), 0);
	harness_log("B: scan its mapping, guess, probe, delete, poison, flood");
	CHECK_EQ(run_as(UID_B, g->gr_gid, "b-attack"), 0);
	harness_log("A: every page there and its own, its PUT of the poisoned key stored");
	CHECK_EQ(run_as(UID_A, g->gr_gid, "a-check"), 0);
	/* B's own: 258 MiB of PUTs into what the pool has left after A's slab and the
	 * directories (B borrowed the idle shares meanwhile: capacity is lent). */
	CHECK_GE(harness_stat(c, "counters.evictions"), 2);

	harness_log("B pins: bounded by --max-lease-bytes (1/8 of 64 MiB)");
	rc = run_as(UID_B, g->gr_gid, "b-pin");
	CHECKF(rc == 8, "pinner held %d leases of 1 MiB, want 8", rc);

	harness_log("the operator drops a client holding leases");
	holder = start_as(UID_B, g->gr_gid, "b-hold");
	for (int i = 0; i < 200; i++) {
		id = client_id(c, "holder");
		if (id && harness_stat(c, "leases") == 4)
			break;
		usleep(25000);
	}
	CHECKF(id != 0, "the holder never attached");
	CHECK_EQ(harness_stat(c, "leases"), 4);
	snprintf(arg, sizeof(arg), "--socket %s drop %u", sockp, id);
	CHECK_EQ(harness_run_tool("kvbctl", arg, &out), 0);
	free(out);
	CHECK_EQ(harness_stat_wait(c, "leases", 0, 2000), 0);
	rc = harness_wait_exit(holder);
	CHECKF(rc == 128 + SIGSEGV, "the dropped client's lease pointer: exit %d, want SIGSEGV",
	       rc);
	/* Not an operator: a tenant cannot drop anyone (kvb_drop_client as uid B). */
	CHECKF(harness_broker_log_has(b, "dropped by client"), "no drop line in the log");

	kvb_close(c);
	harness_broker_stop(b);
	return 0;
}
