// SPDX-License-Identifier: MIT
/*
 * t_disk_blockdev.c - a block device as the cache (--disk /dev/loopN) is used with O_DIRECT.
 * The device node lives on devtmpfs, whose statfs f_type is tmpfs's: the broker once took that
 * for a tmpfs file and ran the device with buffered I/O (page-cache double buffering, write
 * errors reported late or never). A loop device over a sparse file in /var/tmp stands in for an
 * NVMe namespace: the log must say O_DIRECT, the stats "direct": true, and pages demoted to it
 * must come back exact. Needs root and a working losetup; skipped otherwise (test_disk checks
 * the classification itself everywhere).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <liburing.h>

#include "harness.h"

#define NPAGES 120
#define PAGE (1u << 20)
#define SEED 4242

static char img[PATH_MAX], dev[64];
static kvb_key keys[NPAGES];

static void cleanup(void)
{
	char cmd[PATH_MAX + 64];

	if (dev[0]) {
		snprintf(cmd, sizeof(cmd), "losetup -d %s 2>/dev/null", dev);
		if (system(cmd) != 0)
			fprintf(stderr, "# losetup -d %s failed\n", dev);
	}
	if (img[0])
		unlink(img);
}

/* Attaches a loop device over a fresh sparse file of bytes; skips the test when it cannot. */
static void loop_attach(uint64_t bytes)
{
	char cmd[PATH_MAX + 64];
	FILE *p;

	if (geteuid() != 0)
		harness_skip("not root: no loop device");
	snprintf(img, sizeof(img), "/var/tmp/kvbt-blockdev-%d.img", (int)getpid());
	snprintf(cmd, sizeof(cmd), "truncate -s %llu %s", (unsigned long long)bytes, img);
	if (system(cmd) != 0)
		harness_skip("cannot create %s", img);
	snprintf(cmd, sizeof(cmd), "losetup -f --show %s 2>/dev/null", img);
	p = popen(cmd, "r");
	if (!p || !fgets(dev, sizeof(dev), p) || strncmp(dev, "/dev/loop", 9)) {
		dev[0] = '\0';
		if (p)
			pclose(p);
		harness_skip("losetup cannot attach a loop device here");
	}
	pclose(p);
	dev[strcspn(dev, "\n")] = '\0';
	harness_log("cache device %s over %s", dev, img);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct io_uring r;
	kvb_client *c;
	uint32_t ns;
	uint8_t *page = malloc(PAGE);
	char *json;

	harness_init(argc, argv);
	CHECK(page != NULL);
	if (io_uring_queue_init(2, &r, 0))
		harness_skip("io_uring unavailable here");
	io_uring_queue_exit(&r);
	atexit(cleanup);
	loop_attach(160u << 20);

	b = harness_broker_start("--pool", "64M", "--disk", dev, "--disk-size", "160M");
	CHECK(harness_broker_log_has(b, "O_DIRECT"));
	CHECK(!harness_broker_log_has(b, "buffered I/O"));
	c = harness_connect(b, "t_disk_blockdev", 0);
	json = harness_stats(c);
	CHECKF(strstr(json, "\"direct\":true") != NULL, "a block device without O_DIRECT: %s",
	       json);
	free(json);
	harness_layout(&l, "test/blockdev", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (int i = 0; i < NPAGES; i++) {
		keys[i] = harness_key(SEED, (uint64_t)i);
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	for (int i = 0; i < NPAGES; i++) {
		CHECK_RC(kvb_get(c, ns, keys[i], page, PAGE), PAGE);
		CHECK(harness_verify(page, PAGE, &keys[i], SEED, "page from the block device") ==
		      0);
	}
	CHECK_GT(harness_stat(c, "disk.demotions"), 0);
	CHECK_GT(harness_stat(c, "disk.promotions"), 0);
	CHECK_EQ(harness_stat(c, "disk.errors"), 0);
	kvb_close(c);
	harness_broker_stop(b);
	free(page);
	return H_PASS;
}
