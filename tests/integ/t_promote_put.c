// SPDX-License-Identifier: MIT
/*
 * t_promote_put.c - a PUT of a page that is being promoted from disk completes (regression: it
 * parked on the promotion's WRITING page, and a promotion's commit woke nobody, so the PUT hung
 * and its session was never freed once the client went away). Both patterns engines produce:
 *
 *   1. one client's batch: a GET and a PUT of the same disk-only key, for 200 keys, in one
 *      kvb_submit; all 400 complete, the PUTs with EXISTED, the GETs byte-exact;
 *   2. two engines on one prefix: engine A PREFETCHes 100 disk-only pages while engine B stores
 *      the same pages with synchronous kvb_put() (latest first, so they meet the reads in
 *      flight); every PUT returns within 10 s;
 *
 * and after the clients closed no session is left draining and no page stays pinned. Also
 * RAM first: GETs and ACQUIREs of RAM-resident pages never probe the disk index
 * (disk.index_lookups stays put).
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#include "harness.h"

#define PAGE (256u << 10)
#define NKEYS 600 /* 150 MiB through a 32 MiB pool: the first ~450 live on disk only */
#define BATCH 200
#define PREFIX 100
#define SEED 7171

static struct harness_broker *br;
static char cache[PATH_MAX + 64];
static kvb_key keys[NKEYS];
static size_t pb;

static void remove_cache(void)
{
	unlink(cache);
}

static void need_io_uring(void)
{
	struct io_uring r;
	int err = io_uring_queue_init(2, &r, 0);

	if (err)
		harness_skip("io_uring unavailable here: %s", strerror(-err));
	io_uring_queue_exit(&r);
}

static kvb_client *attach(const char *name, uint32_t *ns)
{
	kvb_client *c = harness_connect(br, name, 1024);
	struct kvb_layout l;

	harness_layout(&l, "test/promote-put", KVB_LAYOUT_MLA, 64, 1, 0, 4, 1024);
	CHECK_OK(kvb_ns_open(c, &l, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

/* How many of keys[from, from + n) are on disk and not in RAM. */
static size_t disk_only(kvb_client *c, uint32_t ns, int from, int n)
{
	uint8_t tiers[NKEYS];
	size_t hits, cnt = 0;

	CHECK_OK(kvb_lookup_tiers(c, ns, &keys[from], (size_t)n, &hits, tiers));
	for (int i = 0; i < n; i++)
		cnt += tiers[i] == KVB_TIER_DISK;
	return cnt;
}

/* Pattern 1: GET + PUT of one disk-only key in one batch, BATCH keys at once. */
static void one_batch(kvb_client *c, uint32_t ns, int from)
{
	static struct kvb_op ops[2 * BATCH];
	static struct kvb_completion cs[2 * BATCH];
	uint32_t buf;
	uint8_t *reg = kvb_buf_alloc_host(c, (size_t)(BATCH + 1) * PAGE, &buf);
	int got = 0, existed = 0;

	CHECK(reg != NULL);
	CHECK_EQ(disk_only(c, ns, from, BATCH), BATCH);
	/* The PUT's source is the same content: engines store what they computed. */
	harness_fill(reg + (size_t)BATCH * PAGE, PAGE, &keys[from], SEED);
	for (int i = 0; i < BATCH; i++) {
		ops[2 * i] = (struct kvb_op){.opcode = KVB_OP_GET,
					     .ns = ns,
					     .buf = buf,
					     .key = keys[from + i],
					     .off = (uint64_t)i * PAGE,
					     .user_data = 2 * (uint64_t)i};
		ops[2 * i + 1] = (struct kvb_op){.opcode = KVB_OP_PUT,
						 .ns = ns,
						 .buf = buf,
						 .key = keys[from + i],
						 .off = (uint64_t)BATCH * PAGE,
						 .user_data = 2 * (uint64_t)i + 1};
	}
	for (int done = 0; done < 2 * BATCH;) {
		int n = kvb_submit(c, ops + done, (size_t)(2 * BATCH - done));

		CHECK_GE(n, 0);
		done += n;
		if (done < 2 * BATCH) {
			int r = kvb_reap(c, cs + got, (size_t)(2 * BATCH - got), 1, 10000);

			CHECKF(r > 0, "reap while submitting: %d (%d completions so far)", r, got);
			got += r;
		}
	}
	while (got < 2 * BATCH) {
		int r = kvb_reap(c, cs + got, (size_t)(2 * BATCH - got), 1, 10000);

		CHECKF(r > 0,
		       "%d of %d completions of GET+PUT batches on disk-only keys never came "
		       "(reap: %d)",
		       2 * BATCH - got, 2 * BATCH, r);
		got += r;
	}
	for (int i = 0; i < got; i++) {
		uint64_t k = cs[i].user_data / 2;

		if (cs[i].user_data % 2) {
			CHECKF(cs[i].res == 0, "PUT %llu: %d", (unsigned long long)k, cs[i].res);
			existed += !!(cs[i].flags & KVB_CQEF_EXISTED);
		} else {
			CHECK_RC(cs[i].res, (long long)PAGE);
			CHECK(harness_verify(reg + k * PAGE, PAGE, &keys[from + k], SEED,
					     "promoted GET") == 0);
		}
	}
	harness_log("batch: %d GET+PUT pairs complete, %d PUTs EXISTED", BATCH, existed);
	CHECK_EQ(existed, BATCH);
}

static struct harness_gate go;

/* Pattern 2, engine A: PREFETCH the prefix from disk (one batch). */
static int prefetcher(int idx, void *arg)
{
	struct kvb_op ops[PREFIX];
	struct kvb_completion cs[PREFIX];
	kvb_client *c;
	uint32_t ns;
	int got = 0, from = *(int *)arg;

	(void)idx;
	c = attach("engine-a", &ns);
	for (int i = 0; i < PREFIX; i++)
		ops[i] = (struct kvb_op){.opcode = KVB_OP_PREFETCH,
					 .ns = ns,
					 .key = keys[from + i],
					 .user_data = (uint64_t)i};
	CHECK_EQ(kvb_submit(c, ops, PREFIX), PREFIX);
	harness_gate_open(&go, 1);
	while (got < PREFIX) {
		int r = kvb_reap(c, cs + got, (size_t)(PREFIX - got), 1, 10000);

		CHECKF(r > 0, "prefetches: %d of %d came back", got, PREFIX);
		got += r;
	}
	for (int i = 0; i < PREFIX; i++)
		CHECKF(cs[i].res == 0, "PREFETCH %llu: %d", (unsigned long long)cs[i].user_data,
		       cs[i].res);
	kvb_close(c);
	return 0;
}

/* Pattern 2, engine B: synchronous PUTs of the same pages, latest first. */
static int storer(int idx, void *arg)
{
	uint8_t *page = malloc(PAGE);
	kvb_client *c;
	uint32_t ns;
	int from = *(int *)arg;

	(void)idx;
	CHECK(page != NULL);
	c = attach("engine-b", &ns);
	harness_gate_wait(&go, 10000);
	for (int i = PREFIX - 1; i >= 0; i--) {
		uint64_t t0 = harness_now_ms();
		int r;

		harness_fill(page, PAGE, &keys[from + i], SEED);
		r = kvb_put(c, ns, keys[from + i], page, PAGE);
		CHECKF(r == 0 || r == 1, "PUT %d: %d", i, r);
		CHECKF(harness_now_ms() - t0 < 10000, "PUT %d took %llu ms", i,
		       (unsigned long long)(harness_now_ms() - t0));
	}
	kvb_close(c);
	free(page);
	return 0;
}

int main(int argc, char **argv)
{
	char dir[PATH_MAX];
	uint8_t *page;
	kvb_client *c;
	uint32_t ns, buf;
	uint64_t probes;
	uint8_t *reg;
	pid_t pids[2];
	int from = 0, st[2];

	harness_init(argc, argv);
	need_io_uring();
	snprintf(dir, sizeof(dir), "%s", argv[0]);
	snprintf(cache, sizeof(cache), "%s/t_promote_put.%d.cache", dirname(dir), (int)getpid());
	atexit(remove_cache);
	for (int i = 0; i < NKEYS; i++)
		keys[i] = harness_key(SEED, (uint64_t)i);
	br = harness_broker_start("--pool", "32M", "--disk", cache, "--disk-size", "512M");
	c = attach("filler", &ns);
	page = malloc(PAGE);
	CHECK(page != NULL);
	for (int i = 0; i < NKEYS; i++) {
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	harness_log("stored %d pages: %llu demotions, %zu of the first %d on disk only", NKEYS,
		    (unsigned long long)harness_stat(c, "disk.demotions"),
		    disk_only(c, ns, 0, BATCH + PREFIX), BATCH + PREFIX);

	harness_log("1. GET and PUT of one disk-only key in one batch, %d keys", BATCH);
	one_batch(c, ns, 0);

	harness_log("2. engine A prefetches %d pages while engine B stores them", PREFIX);
	from = BATCH;
	CHECK_EQ(disk_only(c, ns, from, PREFIX), PREFIX);
	harness_gate_init(&go);
	pids[0] = harness_fork(prefetcher, 0, &from);
	pids[1] = harness_fork(storer, 1, &from);
	CHECK_EQ(harness_wait(pids, 2, 30000, st), 0);

	harness_log("RAM first: GETs of RAM-resident pages leave the disk index alone");
	reg = kvb_buf_alloc_host(c, PAGE, &buf);
	CHECK(reg != NULL);
	CHECK_RC(kvb_get(c, ns, keys[NKEYS - 1], reg, PAGE), (long long)PAGE);
	probes = harness_stat(c, "disk.index_lookups");
	for (int r = 0; r < 5; r++) {
		struct kvb_lease l;

		CHECK_RC(kvb_get(c, ns, keys[NKEYS - 1], reg, PAGE), (long long)PAGE);
		CHECK_RC(kvb_get(c, ns, keys[NKEYS - 1], page, PAGE), (long long)PAGE);
		CHECK_OK(kvb_acquire(c, ns, keys[NKEYS - 1], &l));
		CHECK_OK(kvb_release(c, &l));
	}
	CHECK_EQ(harness_stat(c, "disk.index_lookups"), probes);

	harness_log("nothing left behind once the clients are gone");
	kvb_close(c);
	c = harness_connect(br, "observer", 0);
	CHECK_EQ(harness_stat_wait(c, "copy.sessions_draining", 0, 5000), 0);
	CHECK_EQ(harness_stat_wait(c, "pool.pinned_pages", 0, 5000), 0);
	CHECK_EQ(harness_stat(c, "ops.parked"), 0);
	kvb_close(c);
	harness_broker_stop(br);
	free(page);
	return H_PASS;
}
