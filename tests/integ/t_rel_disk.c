// SPDX-License-Identifier: MIT
/*
 * t_rel_disk.c - promise 8 (docs/reliability.md), damaged disk slots: whatever is wrong with a
 * slot, it is never served, it is counted, and its space is written again.
 *
 * A 16 MiB pool in front of a cache of four files (striping) on the real file system, next to
 * the test binary (not tmpfs: O_DIRECT). Pages are 60 KiB, so a slot is exactly 64 KiB and each
 * file holds exactly `cap` slots (a multiple of 16: the broker gives each path whole MiB).
 *   1. N pages whose bytes are a function of (key, seed) are PUT and the broker is stopped with
 *      SIGTERM, which writes everything still only in RAM. The test then walks the files like
 *      the broker's scan and finds every page's slot exactly once.
 *   2. With the broker stopped, D = N/2 slots are damaged (D = 1,000 under make soak):
 *        - the last slot of each file: the file truncated inside it (a torn append);
 *        - torn write: the payload's first 1-14 of 15 sectors replaced by another page's bytes,
 *          the rest and the header old (what a crash between the payload and the header
 *          write of a new slot over an old one leaves);
 *        - 1-3 bits flipped in the 128-byte header (magic included);
 *        - 1-3 bits flipped in the payload;
 *        - cut short: the payload's tail from a random sector on zeroed (a write that stopped).
 *   3. Restart: the scan counts every damaged slot - header crc failures and truncated slots as
 *      disk.torn, payload crc failures as disk.corrupt; the test asserts each and their sum D -
 *      indexes the N - D others (disk.pages, disk.bytes_used), and a GET of every page returns
 *      either the exact page or, for exactly the damaged ones, a miss.
 *   4. Reuse: a fresh broker (the damage is still there, same sum: the truncated slots now
 *      count as corrupt, the first start having extended the files again) takes 4 x cap new pages,
 *      exactly one lap of every log. At its SIGTERM it reports disk.dropped = N - D: the live
 *      old slots it wrote over, and not one damaged slot (those held no page). The next scan
 *      finds 0 torn and 0 corrupt slots - every damaged slot was written over - and every new
 *      page is served byte-exact.
 */
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <unistd.h>

#include <liburing.h>

#include "../../broker/slot.h"
#include "reliab.h"

#define PAGE (60u << 10)
#define STRIDE (64u << 10) /* slot_stride(PAGE) */
#define NPATHS 4
#define SEED 8008
#define SEED_NEW 9009

static_assert(STRIDE == SLOT_BLOCK + PAGE, "one header block plus a 4 KiB-aligned payload");

enum { D_NONE, D_TRUNC, D_SECTORS, D_HDRFLIP, D_PAYFLIP, D_SHORT, D__N };
static const char *const kind_name[D__N] = {"none",	   "file truncated", "torn sectors",
					    "header bits", "payload bits",   "cut short"};

struct pg {
	kvb_key key;
	int path;      /* where its slot is, found by walk() */
	long long off; /* -1: not found */
	int kind;      /* damage done to it */
};

static struct pg *pages, *fresh;
static int npages, nfresh, cap;
static char files[NPATHS][PATH_MAX + 64], disks[NPATHS * (PATH_MAX + 65)], sock[108], size[32];
static struct kvb_layout lay;
static uint64_t rng = 0x9e3779b97f4a7c15ull;

static uint64_t next_rand(void)
{
	uint64_t z = (rng += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

/* The disk tier needs io_uring; some sandboxes forbid it (seccomp, io_uring_disabled). */
static void need_io_uring(void)
{
	struct io_uring r;
	int err = io_uring_queue_init(2, &r, 0);

	if (err)
		harness_skip("io_uring unavailable here: %s", strerror(-err));
	io_uring_queue_exit(&r);
}

/* Page content: a stamp (seed, i), then a splitmix64 stream of it. Fast under the sanitizers. */
static void make_page(uint8_t *p, uint64_t seed, int i)
{
	uint64_t s = seed << 32 | (uint32_t)i, w[2] = {s, ~s};

	memcpy(p, w, sizeof(w));
	for (uint32_t o = sizeof(w); o < PAGE; o += 8) {
		uint64_t z = (s += 0x9e3779b97f4a7c15ull);

		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		z ^= z >> 31;
		memcpy(p + o, &z, 8);
	}
}

static void check_page(const uint8_t *got, uint64_t seed, int i, const char *when)
{
	static uint8_t want[PAGE];

	make_page(want, seed, i);
	if (!memcmp(got, want, PAGE))
		return;
	for (uint32_t o = 0; o < PAGE; o++)
		CHECKF(got[o] == want[o], "%s: page %d (seed %llu): byte %u is 0x%02x, want 0x%02x",
		       when, i, (unsigned long long)seed, o, got[o], want[o]);
}

static struct harness_broker *start(void)
{
	return harness_broker_start("--pool", "16M", "--disk", disks, "--disk-size", size,
				    "--socket", sock);
}

static kvb_client *attach(struct harness_broker *b, uint32_t *ns)
{
	kvb_client *c = harness_connect(b, "t_rel_disk", 0);
	size_t pb;

	CHECK_OK(kvb_ns_open(c, &lay, ns, &pb));
	CHECK_EQ(pb, PAGE);
	return c;
}

static int find_key(struct pg *set, int n, const uint8_t *k)
{
	for (int i = 0; i < n; i++)
		if (!memcmp(set[i].key.b, k, 32))
			return i;
	return -1;
}

/* Walks every file block by block as the broker's scan does and records each page's slot. */
static void walk(struct pg *set, int n)
{
	for (int i = 0; i < n; i++)
		set[i].off = -1;
	for (int p = 0; p < NPATHS; p++) {
		int fd = open(files[p], O_RDONLY);
		struct stat st;

		CHECK(fd >= 0);
		CHECK(fstat(fd, &st) == 0);
		for (off_t off = SLOT_DATA_OFF; off + SLOT_BLOCK <= st.st_size; off += SLOT_BLOCK) {
			struct slot_hdr h;
			int k;

			CHECK(pread(fd, &h, sizeof(h), off) == (ssize_t)sizeof(h));
			if (h.magic != SLOT_MAGIC)
				continue;
			k = find_key(set, n, h.key);
			CHECKF(k >= 0 && h.len == PAGE, "%s at %lld: a slot of an unknown page",
			       files[p], (long long)off);
			CHECKF(set[k].off < 0, "page %d has two slots (%d:%lld and %d:%lld)", k,
			       set[k].path, set[k].off, p, (long long)off);
			set[k].path = p;
			set[k].off = off;
			off += PAGE; /* the payload; the loop adds the header block */
		}
		close(fd);
	}
	for (int i = 0; i < n; i++)
		CHECKF(set[i].off >= 0, "page %d has no slot on disk", i);
}

static void pwrite_at(int p, const void *buf, size_t len, long long off)
{
	int fd = open(files[p], O_WRONLY);

	CHECK(fd >= 0);
	CHECK(pwrite(fd, buf, len, off) == (ssize_t)len);
	CHECK(fsync(fd) == 0);
	close(fd);
}

static void flip_bits(int p, long long at, uint32_t span)
{
	int fd = open(files[p], O_RDWR), nb = 1 + (int)(next_rand() % 3);
	uint8_t buf[SLOT_BLOCK];

	CHECK(fd >= 0 && span <= sizeof(buf));
	CHECK(pread(fd, buf, span, at) == (ssize_t)span);
	for (int i = 0; i < nb; i++) {
		uint64_t bit = next_rand() % (span * 8ull);

		buf[bit / 8] ^= (uint8_t)(1u << (bit % 8));
	}
	CHECK(pwrite(fd, buf, span, at) == (ssize_t)span);
	CHECK(fsync(fd) == 0);
	close(fd);
}

static void damage(int i, int kind)
{
	static uint8_t buf[PAGE];
	struct pg *g = &pages[i];
	long long pay = g->off + SLOT_BLOCK;
	uint32_t s;

	g->kind = kind;
	switch (kind) {
	case D_TRUNC:
		/* Anywhere past the header's 128 bytes: the header is intact, the payload cut. */
		CHECK(truncate(files[g->path],
			       g->off + 256 + (off_t)(next_rand() % (STRIDE - 512))) == 0);
		break;
	case D_SECTORS:
		s = 1 + (uint32_t)(next_rand() % (PAGE / SLOT_BLOCK - 1));
		make_page(buf, SEED_NEW + 1, i);
		pwrite_at(g->path, buf, s * SLOT_BLOCK, pay);
		break;
	case D_HDRFLIP:
		flip_bits(g->path, g->off, sizeof(struct slot_hdr));
		break;
	case D_PAYFLIP:
		flip_bits(g->path,
			  pay + (long long)(next_rand() % (PAGE / SLOT_BLOCK)) * SLOT_BLOCK,
			  SLOT_BLOCK);
		break;
	case D_SHORT:
		s = 1 + (uint32_t)(next_rand() % (PAGE / SLOT_BLOCK - 1));
		memset(buf, 0, sizeof(buf));
		pwrite_at(g->path, buf, PAGE - s * SLOT_BLOCK, pay + s * SLOT_BLOCK);
		break;
	}
}

/* The "dropped" figure of the broker's last "disk: ok, ..." line (tier_close). */
static long long log_dropped(const struct harness_broker *b)
{
	FILE *f = fopen(b->log, "re");
	char line[1024];
	long long dropped = -1;

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "disk: ok, ");
		unsigned long long v;

		if (p && (p = strstr(p, " corrupt, ")) &&
		    sscanf(p, " corrupt, %llu dropped", &v) == 1)
			dropped = (long long)v;
	}
	fclose(f);
	return dropped;
}

static void remove_files(void)
{
	for (int p = 0; p < NPATHS; p++)
		if (files[p][0])
			unlink(files[p]);
}

/* Reads every page of set: byte-exact, or a miss when damaged. Returns the pages served. */
static int read_all(kvb_client *c, uint32_t ns, struct pg *set, int n, uint64_t seed,
		    const char *when)
{
	static uint8_t buf[PAGE];
	int served = 0;

	for (int i = 0; i < n; i++) {
		int rc = kvb_get(c, ns, set[i].key, buf, PAGE);

		if (set[i].kind != D_NONE) {
			CHECKF(rc == -ENOENT, "%s: page %d (%s at %d:%lld): want a miss, got %d",
			       when, i, kind_name[set[i].kind], set[i].path, set[i].off, rc);
			continue;
		}
		CHECKF(rc == (int)PAGE, "%s: page %d: get returned %d (%s)", when, i, rc,
		       harness_strerror(rc));
		check_page(buf, seed, i, when);
		served++;
	}
	return served;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct statfs sf;
	kvb_client *c;
	uint32_t ns;
	static uint8_t page[PAGE];
	char dir[PATH_MAX], *json;
	int ndmg, count[D__N] = {0}, served, last[NPATHS];
	long long want_torn, want_corrupt, dropped;
	uint64_t t0;

	harness_init(argc, argv);
	need_io_uring();
	npages = (int)rel_pick(80, 200, 2000);
	ndmg = npages / 2;
	cap = (npages / NPATHS + 4 + 15) / 16 * 16;
	if (cap < 64)
		cap = 64; /* the broker wants at least 5 MiB per path */
	nfresh = NPATHS * cap;
	rel_deadline((unsigned)rel_pick(120, 90, 400));
	pages = calloc((size_t)npages, sizeof(*pages));
	fresh = calloc((size_t)nfresh, sizeof(*fresh));
	CHECK(pages && fresh);
	snprintf(dir, sizeof(dir), "%s", argv[0]);
	dirname(dir);
	atexit(remove_files);
	for (int p = 0; p < NPATHS; p++) {
		snprintf(files[p], sizeof(files[p]), "%s/t_rel_disk.%d.%d.cache", dir,
			 (int)getpid(), p);
		snprintf(disks + strlen(disks), sizeof(disks) - strlen(disks), "%s%s", p ? "," : "",
			 files[p]);
	}
	snprintf(size, sizeof(size), "%llu",
		 (unsigned long long)NPATHS * (SLOT_DATA_OFF + (uint64_t)cap * STRIDE));
	snprintf(sock, sizeof(sock), "/tmp/kvbt-reldisk-%d.sock", (int)getpid());
	harness_layout(&lay, "test/rel-disk", KVB_LAYOUT_MLA, 64, 1, 0, 15, 64);
	for (int i = 0; i < npages; i++)
		pages[i].key = harness_key(SEED, (uint64_t)i);
	for (int i = 0; i < nfresh; i++)
		fresh[i].key = harness_key(SEED_NEW, (uint64_t)i);

	/* 1. Fill, stop (SIGTERM writes the rest), find every slot. */
	t0 = harness_now_ms();
	b = start();
	CHECK(statfs(files[0], &sf) == 0);
	if (sf.f_type == 0x01021994) /* TMPFS_MAGIC */
		harness_skip("the build directory is on tmpfs");
	c = attach(b, &ns);
	for (int i = 0; i < npages; i++) {
		make_page(page, SEED, i);
		CHECK_RC(kvb_put(c, ns, pages[i].key, page, PAGE), 0);
	}
	CHECK_EQ(harness_stat(c, "disk.dropped"), 0);
	kvb_close(c);
	harness_broker_stop(b);
	walk(pages, npages);
	harness_log("%d pages on %d files of %d slots each, in %llu ms", npages, NPATHS, cap,
		    (unsigned long long)(harness_now_ms() - t0));

	/* 2. Damage: the last slot of each file is truncated, ndmg - NPATHS others chosen at
	 * random, each kind in turn. */
	for (int p = 0; p < NPATHS; p++) {
		last[p] = -1;
		for (int i = 0; i < npages; i++)
			if (pages[i].path == p &&
			    (last[p] < 0 || pages[i].off > pages[last[p]].off))
				last[p] = i;
		CHECK_GE(last[p], 0);
		damage(last[p], D_TRUNC);
		count[D_TRUNC]++;
	}
	for (int j = 0, k = D_SECTORS; j < ndmg - NPATHS;) {
		int i = (int)(next_rand() % (uint64_t)npages);

		if (pages[i].kind != D_NONE)
			continue;
		damage(i, k);
		count[k]++;
		k = k == D_SHORT ? D_SECTORS : k + 1;
		j++;
	}
	want_torn = count[D_TRUNC] + count[D_HDRFLIP];
	want_corrupt = count[D_SECTORS] + count[D_PAYFLIP] + count[D_SHORT];
	CHECK_EQ(want_torn + want_corrupt, ndmg);

	/* 3. Restart: every damaged slot counted and not indexed, every page exact or a miss. */
	b = start();
	CHECK(harness_broker_log_has(b, "warm restart"));
	c = attach(b, &ns);
	json = harness_stats(c);
	harness_log("scan: %llu pages, %llu torn, %llu corrupt",
		    (unsigned long long)harness_stat_u64(json, "disk.pages"),
		    (unsigned long long)harness_stat_u64(json, "disk.torn"),
		    (unsigned long long)harness_stat_u64(json, "disk.corrupt"));
	CHECK_EQ(harness_stat_u64(json, "disk.torn"), want_torn);
	CHECK_EQ(harness_stat_u64(json, "disk.corrupt"), want_corrupt);
	CHECK_EQ(harness_stat_u64(json, "disk.pages"), npages - ndmg);
	CHECK_EQ(harness_stat_u64(json, "disk.bytes_used"), (uint64_t)(npages - ndmg) * STRIDE);
	free(json);
	served = read_all(c, ns, pages, npages, SEED, "after the damage");
	CHECK_EQ(served, npages - ndmg);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "disk.corrupt"), want_corrupt); /* none found late */
	CHECK_EQ(harness_stat_u64(json, "disk.errors"), 0);
	CHECK_EQ(harness_stat_u64(json, "disk.promotions"), npages - ndmg);
	free(json);
	kvb_close(c);
	harness_broker_stop(b);

	/* 4. One lap of new pages over every log: the damaged slots' space is written again. */
	b = start();
	c = attach(b, &ns);
	/* Still there. The first start re-extended the truncated files, so from now on their
	 * cut slots are whole-length slots whose payload fails its crc: corrupt, not torn. */
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "disk.torn"), want_torn - NPATHS);
	CHECK_EQ(harness_stat_u64(json, "disk.corrupt"), want_corrupt + NPATHS);
	free(json);
	for (int i = 0; i < nfresh; i++) {
		make_page(page, SEED_NEW, i);
		CHECK_RC(kvb_put(c, ns, fresh[i].key, page, PAGE), 0);
	}
	kvb_close(c);
	harness_broker_stop(b);
	dropped = log_dropped(b);
	CHECKF(dropped == npages - ndmg,
	       "%lld live slots written over in one lap, want the %d undamaged ones", dropped,
	       npages - ndmg);
	b = start();
	c = attach(b, &ns);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "disk.torn"), 0);
	CHECK_EQ(harness_stat_u64(json, "disk.corrupt"), 0);
	CHECK_EQ(harness_stat_u64(json, "disk.pages"), nfresh);
	CHECK_EQ(harness_stat_u64(json, "disk.bytes_used"), (uint64_t)nfresh * STRIDE);
	free(json);
	CHECK_EQ(read_all(c, ns, fresh, nfresh, SEED_NEW, "after one lap"), nfresh);
	kvb_close(c);
	harness_broker_stop(b);
	walk(fresh, nfresh);

	rel_figure("%d pages in %d files, %d slots damaged (%d files truncated, %d torn sectors, "
		   "%d header bit flips, %d payload bit flips, %d cut short): 0 served, scan "
		   "counted torn %lld + corrupt %lld = %d; %d others byte-exact",
		   npages, NPATHS, ndmg, count[D_TRUNC], count[D_SECTORS], count[D_HDRFLIP],
		   count[D_PAYFLIP], count[D_SHORT], want_torn, want_corrupt, ndmg, served);
	rel_figure("reuse: one lap of %d new pages wrote over %lld live slots (dropped) and every "
		   "damaged one; next scan 0 torn, 0 corrupt, %d pages byte-exact; %llu ms in all",
		   nfresh, dropped, nfresh, (unsigned long long)(harness_now_ms() - t0));
	free(pages);
	free(fresh);
	return H_PASS;
}
