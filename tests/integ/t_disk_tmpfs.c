// SPDX-License-Identifier: MIT
/*
 * t_disk_tmpfs.c - a cache file on tmpfs (/dev/shm), where O_DIRECT is refused or pointless:
 * the broker falls back to buffered I/O, says so in its log and in the stats ("direct": false),
 * and demotion, promotion and a warm restart (with an SQPOLL ring) work the same. Then the disk
 * runs full: its oldest pages are dropped (counted), the newest read back exact, and no page is
 * ever served wrong.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statfs.h>
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

#define NPAGES 120
#define NMORE 260 /* into a 192 MiB disk that already holds NPAGES: it wraps */
#define PAGE (1u << 20)
#define SEED 99

static kvb_key keys[NPAGES + NMORE];
static char cache[PATH_MAX], sock[108];

static void remove_cache(void)
{
	unlink(cache);
}

static void read_all(kvb_client *c, uint32_t ns, uint8_t *page)
{
	for (int i = 0; i < NPAGES; i++) {
		CHECK_RC(kvb_get(c, ns, keys[i], page, PAGE), PAGE);
		CHECK(harness_verify(page, PAGE, &keys[i], SEED, "page from tmpfs") == 0);
	}
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct statfs sf;
	kvb_client *c;
	uint32_t ns;
	uint8_t *page = malloc(PAGE);
	char *json;

	harness_init(argc, argv);
	need_io_uring();
	CHECK(page != NULL);
	if (statfs("/dev/shm", &sf) < 0 || sf.f_type != 0x01021994)
		harness_skip("/dev/shm is not tmpfs");
	snprintf(cache, sizeof(cache), "/dev/shm/kvbt-tmpfs-%d.cache", (int)getpid());
	snprintf(sock, sizeof(sock), "/tmp/kvbt-tmpfs-%d.sock", (int)getpid());
	atexit(remove_cache);
	harness_layout(&l, "test/tmpfs", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	for (int i = 0; i < NPAGES; i++)
		keys[i] = harness_key(SEED, (uint64_t)i);

	b = harness_broker_start("--pool", "64M", "--disk", cache, "--disk-size", "192M",
				 "--socket", sock);
	CHECK(harness_broker_log_has(b, "buffered I/O"));
	c = harness_connect(b, "t_disk_tmpfs", 0);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	json = harness_stats(c);
	CHECK(strstr(json, "\"direct\":false") != NULL);
	free(json);
	for (int i = 0; i < NPAGES; i++) {
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	read_all(c, ns, page);
	CHECK_GT(harness_stat(c, "disk.promotions"), 0);
	kvb_close(c);
	harness_broker_stop(b);

	/* The restart also runs the ring with SQPOLL. */
	b = harness_broker_start("--pool", "64M", "--disk", cache, "--disk-size", "192M",
				 "--socket", sock, "--disk-sqpoll");
	CHECK(harness_broker_log_has(b, "warm restart"));
	CHECK(harness_broker_log_has(b, "SQPOLL"));
	c = harness_connect(b, "t_disk_tmpfs", 0);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	CHECK_EQ(harness_stat(c, "disk.pages"), NPAGES);
	read_all(c, ns, page);

	/* Disk full: the log head overwrites the oldest slots. */
	for (int i = NPAGES; i < NPAGES + NMORE; i++) {
		keys[i] = harness_key(SEED, (uint64_t)i);
		harness_fill(page, PAGE, &keys[i], SEED);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	CHECK_GT(harness_stat(c, "disk.dropped"), 0);
	for (int i = 0; i < NPAGES + NMORE; i++) {
		int rc = kvb_get(c, ns, keys[i], page, PAGE);

		CHECKF(rc == (int)PAGE || (rc == -ENOENT && i < NPAGES + NMORE - 150),
		       "page %d of %d after the disk ran full: %d", i, NPAGES + NMORE, rc);
		if (rc == (int)PAGE)
			CHECK(harness_verify(page, PAGE, &keys[i], SEED, "page after wrap") == 0);
	}
	CHECK_EQ(harness_stat(c, "disk.errors"), 0);
	kvb_close(c);
	harness_broker_stop(b);
	free(page);
	return H_PASS;
}
