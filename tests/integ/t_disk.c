// SPDX-License-Identifier: MIT
/*
 * t_disk.c - the NVMe tier end to end, on a 512 MiB cache file on the real file system (next to
 * the test binary, not tmpfs) behind a 64 MiB pool:
 *   1. 300 MiB of 1 MiB pages are PUT (demotion keeps up: every PUT succeeds) and every one
 *      reads back byte-exact, through GET into a registered buffer and through ACQUIRE;
 *      LOOKUP reports pages on disk as KVB_TIER_DISK;
 *   2. two GETs of one disk page in one batch, and two processes fetching another one at the
 *      same moment, cause one disk read each (the second joins the first);
 *   3. after SIGTERM (which writes what was only in RAM) a new broker on the same file rebuilds
 *      its index from the slot headers and serves all 300 pages again;
 *   4. a byte flipped inside one slot's payload while the broker is stopped: that page is a
 *      miss (and counted corrupt), every other page is served;
 *   5. the file cut inside its last slot (a torn write): that page is a miss (counted torn),
 *      every other page is served.
 */
#include <fcntl.h>
#include <isa-l/crc.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
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

#define NPAGES 300
#define PAGE (1u << 20)
#define SEED 4242
#define DATA_OFF (1u << 20)
#define BLK 4096u

static kvb_key keys[NPAGES];
static uint32_t crcs[NPAGES]; /* of each page's content: a sanitizer-cheap byte-exact check */
static uint8_t *base;	      /* harness_fill content shared by every page ... */

/* ... with page i's index and key stamped into every 64 KiB, so no two pages are alike. */
static void make_page(uint8_t *p, int i)
{
	memcpy(p, base, PAGE);
	for (uint32_t o = 0; o < PAGE; o += 65536) {
		memcpy(p + o, &i, sizeof(i));
		memcpy(p + o + 4, keys[i].b, sizeof(keys[i].b));
	}
}

/* 0 when p holds page i, else prints the first difference and returns -1. */
static int check_page(const uint8_t *p, int i, const char *what)
{
	static uint8_t want[PAGE];

	if (crc32_iscsi((unsigned char *)(uintptr_t)p, (int)PAGE, ~0u) == crcs[i])
		return 0;
	make_page(want, i);
	for (uint32_t o = 0; o < PAGE; o++) {
		if (p[o] != want[o]) {
			printf("%s: byte %u is 0x%02x, want 0x%02x\n", what, o, p[o], want[o]);
			return -1;
		}
	}
	return 0;
}
static char cache[PATH_MAX], sock[108];
static struct kvb_layout lay;

static int reput = -1; /* deleted and put again: two valid slots on disk (deletes are not
			  * written), so it cannot be the page the torn write takes away */

static struct harness_broker *start(void)
{
	return harness_broker_start("--pool", "64M", "--disk", cache, "--disk-size", "512M",
				    "--socket", sock);
}

static int key_index(const uint8_t *k)
{
	for (int i = 0; i < NPAGES; i++)
		if (!memcmp(keys[i].b, k, 32))
			return i;
	return -1;
}

/*
 * Walks the cache file like the broker's scan does, block by block, and returns the offset of
 * the slot header of page `want` (or, want < 0, of the valid slot at the highest offset other
 * than page `skip`), with its page index in *which. -1 when not found.
 */
static long long find_slot(int want, int skip, int *which)
{
	int fd = open(cache, O_RDONLY);
	struct stat st;
	uint8_t h[128];
	long long best = -1;

	CHECK(fd >= 0);
	CHECK(fstat(fd, &st) == 0);
	for (off_t off = DATA_OFF; off + BLK <= st.st_size; off += BLK) {
		uint64_t magic;
		uint32_t len;
		int k;

		CHECK(pread(fd, h, sizeof(h), off) == (ssize_t)sizeof(h));
		memcpy(&magic, h, 8);
		if (magic != 0x31544f4c5342564bull) /* "KVBSLOT1" */
			continue;
		memcpy(&len, h + 104, 4);
		k = key_index(h + 72);
		if (k < 0 || len != PAGE)
			continue;
		if ((want >= 0 && k == want) ||
		    (want < 0 && k != skip && k != reput && off > best)) {
			best = off;
			*which = k;
			if (want >= 0)
				break;
		}
		off += len; /* the payload; the loop adds the header block */
	}
	close(fd);
	return best;
}

/* Reads every page back: byte-exact, or a miss for the pages listed in gone[]. */
static void read_all(kvb_client *c, uint32_t ns, uint8_t *reg, uint8_t *plain, const int *gone,
		     int ngone, const char *when)
{
	for (int i = 0; i < NPAGES; i++) {
		uint8_t *dst = i % 2 ? reg : plain; /* GET into a registered buffer, or ACQUIRE */
		int rc = kvb_get(c, ns, keys[i], dst, PAGE), miss = 0;
		char what[64];

		for (int g = 0; g < ngone; g++)
			miss |= gone[g] == i;
		snprintf(what, sizeof(what), "%s: page %d", when, i);
		if (miss) {
			CHECKF(rc == -ENOENT, "%s: want a miss, got %d", what, rc);
			continue;
		}
		CHECKF(rc == (int)PAGE, "%s: get returned %d (%s)", what, rc, harness_strerror(rc));
		CHECK(check_page(dst, i, what) == 0);
	}
}

static kvb_client *attach(struct harness_broker *b, uint32_t *ns)
{
	kvb_client *c = harness_connect(b, "t_disk", 0);
	size_t pb;

	CHECK_OK(kvb_ns_open(c, &lay, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

/* A page that is on disk only right now (LOOKUP says so), other than `not`. */
static int disk_only_page(kvb_client *c, uint32_t ns, int not )
{
	uint8_t tiers[NPAGES];
	size_t hits;

	CHECK_OK(kvb_lookup_tiers(c, ns, keys, NPAGES, &hits, tiers));
	CHECK_EQ(hits, NPAGES);
	for (int i = 0; i < NPAGES; i++)
		if (tiers[i] == KVB_TIER_DISK && i != not )
			return i;
	harness_fail(__FILE__, __LINE__, "no page on disk only");
}

static int fetch_child(int idx, void *arg)
{
	int k = *(int *)arg;
	struct harness_broker hb;
	kvb_client *c;
	uint32_t ns;
	uint8_t *buf = malloc(PAGE);

	(void)idx;
	memset(&hb, 0, sizeof(hb));
	snprintf(hb.sock, sizeof(hb.sock), "%s", sock);
	c = attach(&hb, &ns);
	CHECK(buf != NULL);
	CHECK_RC(kvb_get(c, ns, keys[k], buf, PAGE), PAGE);
	CHECK(check_page(buf, k, "page fetched by two processes") == 0);
	kvb_close(c);
	free(buf);
	return 0;
}

static void shared_reads(kvb_client *c, uint32_t ns, uint8_t *reg, uint32_t buf)
{
	struct kvb_op ops[3];
	struct kvb_completion cq[3];
	uint64_t reads, joined;
	int k = disk_only_page(c, ns, -1), k2, got = 0;

	/* One batch: both GETs reach the broker in one poll, the second joins the first read. */
	reads = harness_stat(c, "disk.reads");
	joined = harness_stat(c, "disk.joined");
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < 2; i++) {
		ops[i].opcode = KVB_OP_GET;
		ops[i].ns = ns;
		ops[i].buf = buf;
		ops[i].key = keys[k];
		ops[i].off = (uint64_t)i * PAGE;
		ops[i].user_data = (uint64_t)i;
	}
	CHECK_RC(kvb_submit(c, ops, 2), 2);
	while (got < 2) {
		int n = kvb_reap(c, cq + got, (size_t)(2 - got), 1, 10000);

		CHECK_GT(n, 0);
		got += n;
	}
	for (int i = 0; i < 2; i++) {
		CHECK_RC(cq[i].res, PAGE);
		CHECK(check_page(reg + cq[i].user_data * PAGE, k, "batched GET of a disk page") ==
		      0);
	}
	CHECK_EQ(harness_stat(c, "disk.reads"), reads + 1);
	CHECK_EQ(harness_stat(c, "disk.joined"), joined + 1);

	/* Two processes at once: one read, whoever comes second joins it or finds it in RAM. */
	k2 = disk_only_page(c, ns, k);
	reads = harness_stat(c, "disk.reads");
	CHECK_EQ(harness_run_children(2, fetch_child, &k2, 20000), 0);
	CHECK_EQ(harness_stat(c, "disk.reads"), reads + 1);
	harness_log("two GETs in a batch and two processes: one disk read each");

	/* PREFETCH, DELETE and PUT of one disk page in one batch: the PUT stores it anew. */
	k = reput = disk_only_page(c, ns, -1);
	memset(ops, 0, sizeof(ops));
	make_page(reg, k);
	for (int i = 0; i < 3; i++) {
		ops[i].opcode = i == 0 ? KVB_OP_PREFETCH : i == 1 ? KVB_OP_DELETE : KVB_OP_PUT;
		ops[i].ns = ns;
		ops[i].buf = buf;
		ops[i].key = keys[k];
		ops[i].user_data = (uint64_t)i;
	}
	CHECK_RC(kvb_submit(c, ops, 3), 3);
	for (got = 0; got < 3;) {
		int n = kvb_reap(c, cq + got, (size_t)(3 - got), 1, 10000);

		CHECK_GT(n, 0);
		got += n;
	}
	for (int i = 0; i < 3; i++) {
		CHECKF(cq[i].res == 0 || (cq[i].user_data == 0 && cq[i].res == -ENOENT),
		       "op %llu of prefetch-delete-put: %d", (unsigned long long)cq[i].user_data,
		       cq[i].res);
		if (cq[i].user_data == 2)
			CHECK_EQ(cq[i].flags & KVB_CQEF_EXISTED, 0);
	}
	CHECK_RC(kvb_get(c, ns, keys[k], reg + PAGE, PAGE), PAGE);
	CHECK(check_page(reg + PAGE, k, "page put again after a delete") == 0);
}

static void remove_cache(void)
{
	unlink(cache);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct statfs sf;
	kvb_client *c;
	uint32_t ns, rbuf;
	uint8_t *reg, *plain = malloc(PAGE), *page = malloc(PAGE);
	char dir[PATH_MAX], *json;
	int gone[2], which = -1;
	long long off;

	harness_init(argc, argv);
	need_io_uring();
	alarm(110); /* 1.2 GB of disk I/O on a shared machine: more than the default 90 s */
	CHECK(plain && page);
	snprintf(dir, sizeof(dir), "%s", argv[0]);
	snprintf(cache, sizeof(cache), "%s/t_disk.%d.cache", dirname(dir), (int)getpid());
	snprintf(sock, sizeof(sock), "/tmp/kvbt-disk-%d.sock", (int)getpid());
	atexit(remove_cache);
	harness_layout(&lay, "test/disk", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024);
	for (int i = 0; i < NPAGES; i++)
		keys[i] = harness_key(SEED, (uint64_t)i);
	/* One harness_fill (slow under the sanitizers), then memcpy and crc32c (not). */
	base = malloc(PAGE);
	CHECK(base != NULL);
	harness_fill(base, PAGE, &keys[0], SEED);

	b = start();
	CHECK(statfs(cache, &sf) == 0);
	if (sf.f_type == 0x01021994) /* TMPFS_MAGIC: t_disk_tmpfs covers that */
		harness_skip("the build directory is on tmpfs");
	c = attach(b, &ns);
	reg = kvb_buf_alloc_host(c, 2 * PAGE, &rbuf);
	CHECK(reg != NULL);
	for (int i = 0; i < NPAGES; i++) {
		make_page(page, i);
		crcs[i] = crc32_iscsi(page, (int)PAGE, ~0u);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	json = harness_stats(c);
	harness_log("put %d pages: %llu demotions, %llu pages on disk, %llu parked", NPAGES,
		    (unsigned long long)harness_stat_u64(json, "disk.demotions"),
		    (unsigned long long)harness_stat_u64(json, "disk.pages"),
		    (unsigned long long)harness_stat_u64(json, "disk.parked"));
	CHECK_GE(harness_stat_u64(json, "disk.demotions"), NPAGES - 64);
	CHECK_EQ(harness_stat_u64(json, "disk.dropped"), 0);
	CHECK_EQ(harness_stat_u64(json, "disk.errors"), 0);
	CHECK(strstr(json, "\"direct\":true") != NULL);
	free(json);
	read_all(c, ns, reg, plain, NULL, 0, "first run");
	CHECK_GT(harness_stat(c, "disk.promotions"), NPAGES - 64 - 1);
	shared_reads(c, ns, reg, rbuf);
	kvb_close(c);
	harness_broker_stop(b);

	/* Warm restart: everything comes back from the file. */
	b = start();
	CHECK(harness_broker_log_has(b, "warm restart"));
	c = attach(b, &ns);
	reg = kvb_buf_alloc_host(c, 2 * PAGE, &rbuf);
	CHECK(reg != NULL);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "disk.pages"), NPAGES);
	CHECK_EQ(harness_stat_u64(json, "disk.corrupt"), 0);
	CHECK_EQ(harness_stat_u64(json, "disk.torn"), 0);
	CHECK(harness_stat_f64(json, "disk.scan_seconds") > 0);
	harness_log("warm restart: scan %.3f s", harness_stat_f64(json, "disk.scan_seconds"));
	free(json);
	read_all(c, ns, reg, plain, NULL, 0, "after a restart");
	kvb_close(c);
	harness_broker_stop(b);

	/* A byte flipped inside one slot's payload. */
	off = find_slot(17, -1, &which);
	CHECK_GE(off, 0);
	{
		int fd = open(cache, O_RDWR);
		uint8_t x;

		CHECK(fd >= 0);
		CHECK(pread(fd, &x, 1, off + BLK + 12345) == 1);
		x ^= 0x40;
		CHECK(pwrite(fd, &x, 1, off + BLK + 12345) == 1);
		close(fd);
	}
	gone[0] = 17;
	b = start();
	c = attach(b, &ns);
	reg = kvb_buf_alloc_host(c, 2 * PAGE, &rbuf);
	CHECK(reg != NULL);
	CHECK_EQ(harness_stat(c, "disk.corrupt"), 1);
	read_all(c, ns, reg, plain, gone, 1, "after a flipped byte");
	kvb_close(c);
	harness_broker_stop(b);

	/* The file cut inside its last slot: a torn write. */
	off = find_slot(-1, 17, &which);
	CHECK_GE(off, 0);
	harness_log("cutting the file inside page %d's slot at %lld", which, off);
	CHECK(truncate(cache, off + BLK + PAGE / 2) == 0);
	gone[1] = which;
	b = start();
	c = attach(b, &ns);
	reg = kvb_buf_alloc_host(c, 2 * PAGE, &rbuf);
	CHECK(reg != NULL);
	CHECK_EQ(harness_stat(c, "disk.torn"), 1);
	CHECK_EQ(harness_stat(c, "disk.corrupt"), 1);
	read_all(c, ns, reg, plain, gone, 2, "after a torn write");
	kvb_close(c);
	harness_broker_stop(b);
	free(plain);
	free(page);
	free(base);
	return H_PASS;
}
