// SPDX-License-Identifier: MIT
/*
 * t_disk_faults.c - injected disk errors (KVB_DISK_FAULTS, compiled into the test broker
 * kvbrokerd-hooks only) never crash the broker and never serve a partial or wrong page:
 *   1. every 3rd page write and every 2nd read fails (the reads alternately with -EIO and with
 *      a short read that left garbage in the RAM slot): every PUT succeeds, every GET returns
 *      the exact page or a miss, and errors are counted;
 *   2. every write fails, on a slow device (completions trickle in while PUTs go on): after
 *      repeated errors the tier is marked failed and the broker goes on serving from RAM (PUTs
 *      still succeed, and the newest pages read back: the pages whose writes were still in
 *      flight at the failure are older, and are the ones dropped); the recovery probes fail
 *      too, so it stays failed;
 *   3. the first 8 writes fail, then the device heals: the tier fails, its first probe (after
 *      1 s) is made to fail, the second (2 s later) succeeds and the tier is ok again: pages
 *      PUT after the recovery are demoted and promoted back exact.
 */
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#include "harness.h"

/* The disk tier needs io_uring; some sandboxes forbid it (seccomp, io_uring_disabled). */
static void need_io_uring(void)
{
	struct io_uring r;
	int err = io_uring_queue_init(2, &r, 0);

	if (err)
		harness_skip("io_uring unavailable here: %s", strerror(-err));
	io_uring_queue_exit(&r);
}

#define NPAGES 150
#define PAGE (1u << 20)
#define SEED 777

static kvb_key keys[NPAGES];
static char cache[PATH_MAX + 64];

static void remove_cache(void)
{
	unlink(cache);
}

static void run(const char *faults, int phase)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;
	uint8_t *page = malloc(PAGE);
	int misses = 0, first = phase == 2 ? NPAGES - 30 : 0;
	char *json;

	CHECK(page != NULL);
	unlink(cache);
	CHECK_OK(setenv("KVB_DISK_FAULTS", faults, 1));
	b = harness_broker_start("--pool", "64M", "--disk", cache, "--disk-size", "256M");
	CHECK(harness_broker_log_has(b, "fault injection"));
	c = harness_connect(b, "t_disk_faults", 0);
	harness_layout(&l, "test/faults", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (int i = 0; i < NPAGES; i++) {
		keys[i] = harness_key(SEED + (uint64_t)phase, (uint64_t)i);
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	for (int i = first; i < NPAGES; i++) {
		char what[48];
		int rc = kvb_get(c, ns, keys[i], page, PAGE);

		snprintf(what, sizeof(what), "phase %d page %d", phase, i);
		if (rc == -ENOENT) {
			misses++;
			continue;
		}
		CHECKF(rc == (int)PAGE, "%s: get returned %d (%s)", what, rc, harness_strerror(rc));
		CHECK(harness_verify(page, PAGE, &keys[i], SEED, what) == 0);
	}
	json = harness_stats(c);
	harness_log("faults %s: %d misses, disk errors %llu, state %s", faults, misses,
		    (unsigned long long)harness_stat_u64(json, "disk.errors"),
		    strstr(json, "\"state\":\"failed\"") ? "failed" : "ok");
	CHECK_GT(harness_stat_u64(json, "disk.errors"), 0);
	if (phase == 1) {
		CHECK(strstr(json, "\"state\":\"ok\"") != NULL);
		CHECK_GT(harness_stat_u64(json, "disk.promotions"), 0);
	} else {
		CHECK(strstr(json, "\"state\":\"failed\"") != NULL);
		CHECK(harness_broker_log_has(b, "tier failed"));
		CHECK_EQ(misses, 0); /* the newest pages are in RAM */
	}
	free(json);
	kvb_close(c);
	CHECK(harness_broker_alive(b));
	harness_broker_stop(b);
	free(page);
}

/* Phase 3: a failed tier comes back by itself once the device works again. */
static void recover(void)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;
	uint8_t *page = malloc(PAGE);
	uint64_t t0, demoted;
	char *json = NULL;
	int ok = 0;

	CHECK(page != NULL);
	unlink(cache);
	CHECK_OK(setenv("KVB_DISK_FAULTS", "write=1,until=8,probes=1", 1));
	b = harness_broker_start("--pool", "64M", "--disk", cache, "--disk-size", "256M");
	c = harness_connect(b, "t_disk_faults", 0);
	harness_layout(&l, "test/faults", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (int i = 0; i < NPAGES; i++) {
		keys[i] = harness_key(SEED + 3, (uint64_t)i);
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	CHECK(harness_broker_log_has(b, "tier failed"));
	t0 = harness_now_ms();
	while (!ok && harness_now_ms() - t0 < 15000) {
		free(json);
		json = harness_stats(c);
		ok = strstr(json, "\"state\":\"ok\"") != NULL;
		if (!ok)
			usleep(50 * 1000);
	}
	CHECKF(ok, "the tier did not recover within 15 s: %s", json);
	harness_log("tier recovered %llu ms after the PUTs",
		    (unsigned long long)(harness_now_ms() - t0));
	CHECK_EQ(harness_stat_u64(json, "disk.recoveries"), 1);
	CHECK_EQ(harness_stat_u64(json, "disk.probe_failures"), 1);
	demoted = harness_stat_u64(json, "disk.demotions");
	free(json);
	CHECK(harness_broker_log_has(b, "tier recovered"));
	/* Demotions and promotions work again. */
	for (int i = 0; i < NPAGES; i++) {
		keys[i] = harness_key(SEED + 4, (uint64_t)i);
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	CHECK_GT(harness_stat(c, "disk.demotions"), demoted);
	for (int i = 0; i < NPAGES; i++) {
		CHECK_RC(kvb_get(c, ns, keys[i], page, PAGE), PAGE);
		CHECK(harness_verify(page, PAGE, &keys[i], SEED, "page after the recovery") == 0);
	}
	CHECK_GT(harness_stat(c, "disk.promotions"), 0);
	kvb_close(c);
	CHECK(harness_broker_alive(b));
	harness_broker_stop(b);
	free(page);
}

int main(int argc, char **argv)
{
	char dir[PATH_MAX], hooks[PATH_MAX + 32], *d;

	harness_init(argc, argv);
	need_io_uring();
	snprintf(dir, sizeof(dir), "%s", argv[0]);
	d = dirname(dir);
	snprintf(hooks, sizeof(hooks), "%s/kvbrokerd-hooks", d);
	if (access(hooks, X_OK) < 0)
		harness_fail(__FILE__, __LINE__, "%s not built", hooks);
	CHECK_OK(setenv("KVB_BROKERD", hooks, 1));
	snprintf(cache, sizeof(cache), "%s/t_disk_faults.%d.cache", d, (int)getpid());
	atexit(remove_cache);
	run("write=3,read=2", 1);
	run("write=1,slow=2000", 2);
	recover();
	return H_PASS;
}
