// SPDX-License-Identifier: MIT
/*
 * t_dir.c - the pool directory [dir] (proto/pooldir.h): kvb_get() into host memory reads a page
 * by itself, and never serves a wrong or partial one.
 *
 * 1. Churn: a writer PUTs 64 KiB pages through a 32 MiB pool, so that every slot is evicted and
 *    written again many times over, while two readers GET recent keys as fast as they can, into
 *    plain memory and into a registered buffer. Every page a GET returns must be byte-exact;
 *    most of them must have come through the directory (counters.dir_gets), and every one of
 *    those is counted as a GET and a hit.
 * 2. Adoption: a reader attached to a broker that is SIGKILLed keeps its directory map while
 *    the next broker adopts the pool, deletes every page and writes other pages into the same
 *    slots. The old reader must never see those bytes as its keys' pages: the adopter changed
 *    the directory's epoch before it wrote a slot, so the reader asks the broker (and so
 *    reconnects) instead.
 * 3. --no-directory: the same GETs, every one through the broker.
 * 4. [note-early] (client/ring.c): a broker asleep while a client streams reads through the
 *    directory is woken when the client's note ring is three quarters full, not when it is
 *    full, and once: with the broker stopped, 250 reads ring its doorbell once, after the
 *    150th; the broker, running again, counts all 250.
 * 5. [note-nap] (broker/session.c): a broker that is not stopped drains a steady stream of such
 *    notes on its own timer: 3,000 reads 100 us apart ring its doorbell a few times while it
 *    learns their rate (each ring's worth of them did before: 15), and all are counted.
 * 6. [told-lru] (broker/store.c): a read through the directory warms its page before the
 *    broker next evicts by age, though it has not read the note yet. In a full pool, with
 *    the broker stopped, the client reads the coldest page and posts a PUT; the broker, let
 *    go, takes the PUT first (rings before its tick), and must evict the next page, not the
 *    one just read (it did, and a prefix's last page read by an engine went before the PUT
 *    that continued it: kvbchain's stranded chains).
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reliab.h"

#define PB (64u * 1024)
#define SEED 4242
#define CHURN_MS 2500
#define RECENT 1024 /* readers pick among the last RECENT keys written: half are evicted */

struct shared {
	volatile uint64_t written; /* keys 0..written-1 have been PUT */
	volatile int stop;
	uint64_t got[2], wrong[2], missed[2];
};

static struct harness_broker *broker;

static void layout_of(struct kvb_layout *l)
{
	harness_layout(l, "test/dir", KVB_LAYOUT_MLA, 64, 1, 0, 1, PB / 64);
}

static int writer(int idx, void *arg)
{
	struct shared *sh = arg;
	struct kvb_layout l;
	kvb_client *c;
	uint8_t *page = malloc(PB);
	uint32_t ns;

	(void)idx;
	CHECK(page != NULL);
	c = harness_connect(broker, "writer", 0);
	layout_of(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	for (uint64_t i = 0; !sh->stop; i++) {
		kvb_key k = harness_key(SEED, i);

		harness_fill(page, PB, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, page, PB), 0);
		__atomic_store_n(&sh->written, i + 1, __ATOMIC_RELEASE);
	}
	kvb_close(c);
	free(page);
	return 0;
}

/* Reader idx: 0 into plain memory, 1 into a registered buffer (both below 1 MiB: directory). */
static int reader(int idx, void *arg)
{
	struct shared *sh = arg;
	struct kvb_layout l;
	kvb_client *c;
	uint8_t *page;
	uint32_t ns, bid;
	uint64_t seed = (uint64_t)idx * 7919 + 1;

	c = harness_connect(broker, "reader", 0);
	layout_of(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	page = idx ? kvb_buf_alloc_host(c, PB, &bid) : malloc(PB);
	CHECK(page != NULL);
	while (!sh->stop) {
		uint64_t w = __atomic_load_n(&sh->written, __ATOMIC_ACQUIRE), i;
		kvb_key k;
		int rc;

		if (w < RECENT)
			continue;
		seed = seed * 6364136223846793005ull + 1442695040888963407ull;
		i = w - 1 - (seed >> 33) % RECENT;
		k = harness_key(SEED, i);
		rc = kvb_get(c, ns, k, page, PB);
		if (rc == -ENOENT) {
			sh->missed[idx]++;
			continue;
		}
		CHECKF(rc == (int)PB, "reader %d: get of key %llu: %d (%s)", idx,
		       (unsigned long long)i, rc, harness_strerror(rc));
		if (harness_verify(page, PB, &k, SEED, "page read under churn"))
			sh->wrong[idx]++;
		sh->got[idx]++;
	}
	kvb_close(c);
	if (!idx)
		free(page);
	return 0;
}

/* Part 1 (and 3 with nodir): returns counters.dir_gets; checks every read was right. */
static uint64_t churn(int nodir)
{
	struct harness_broker *b;
	struct shared *sh = harness_shared(sizeof(*sh));
	pid_t pids[3];
	kvb_client *c;
	uint64_t dir_gets, gets, hits, got;

	b = nodir ? harness_broker_start("--pool", "32M", "--slab", "4M", "--no-directory")
		  : harness_broker_start("--pool", "32M", "--slab", "4M");
	broker = b; /* the children's */
	pids[0] = harness_fork(writer, 0, sh);
	pids[1] = harness_fork(reader, 0, sh);
	pids[2] = harness_fork(reader, 1, sh);
	for (uint64_t t0 = harness_now_ms(); __atomic_load_n(&sh->written, __ATOMIC_ACQUIRE) < 2000;
	     usleep(10000))
		CHECKF(harness_broker_alive(b) && harness_now_ms() - t0 < 30000,
		       "the writer stalled at %llu pages", (unsigned long long)sh->written);
	usleep(CHURN_MS * 1000);
	sh->stop = 1;
	CHECK_EQ(harness_wait(pids, 3, 30000, NULL), 0);
	got = sh->got[0] + sh->got[1];
	harness_log("%s: %llu pages written through a 32 MiB pool, %llu + %llu read byte-exact "
		    "(%llu + %llu evicted first)",
		    nodir ? "--no-directory" : "directory", (unsigned long long)sh->written,
		    (unsigned long long)sh->got[0], (unsigned long long)sh->got[1],
		    (unsigned long long)sh->missed[0], (unsigned long long)sh->missed[1]);
	CHECKF(sh->wrong[0] + sh->wrong[1] == 0, "%llu pages served wrong",
	       (unsigned long long)(sh->wrong[0] + sh->wrong[1]));
	CHECK(sh->got[0] > 100 && sh->got[1] > 100);
	CHECK(sh->written > 4 * (32u << 20) / PB); /* every slot written four times at least */
	c = harness_connect(b, "stats", 0);
	dir_gets = harness_stat(c, "counters.dir_gets");
	gets = harness_stat(c, "counters.gets");
	hits = harness_stat(c, "counters.hits");
	kvb_close(c);
	/* Every read of the readers is a GET, hit or miss (the readers have closed: all told). */
	CHECKF(gets == got + sh->missed[0] + sh->missed[1], "gets %llu, reads %llu",
	       (unsigned long long)gets, (unsigned long long)(got + sh->missed[0] + sh->missed[1]));
	CHECK_EQ(hits, got);
	harness_broker_stop(b);
	return dir_gets;
}

static void adoption(void)
{
	struct harness_broker *b;
	struct kvb_layout l;
	kvb_client *old, *c;
	uint8_t *page = malloc(PB);
	uint32_t ns, ns2;
	char sock[108];
	uint64_t before;
	enum { N = 64 };

	CHECK(page != NULL);
	b = harness_broker_start("--pool", "32M", "--slab", "4M");
	snprintf(sock, sizeof(sock), "%s", b->sock);
	old = harness_connect(b, "old", 0);
	layout_of(&l);
	CHECK_OK(kvb_ns_open(old, &l, &ns, NULL));
	for (int i = 0; i < N; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		harness_fill(page, PB, &k, SEED);
		CHECK_RC(kvb_put(old, ns, k, page, PB), 0);
	}
	for (int i = 0; i < N; i++) { /* through the directory */
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		CHECK_RC(kvb_get(old, ns, k, page, PB), (int)PB);
		CHECK_OK(harness_verify(page, PB, &k, SEED, "page before the kill"));
	}
	before = harness_stat(old, "counters.dir_gets");
	CHECK_EQ(before, N);
	rel_kill(b->pid);
	b->pid = 0;
	/* The next broker adopts the pool; a client of its own overwrites every slot. */
	b = harness_broker_start("--socket", sock, "--pool", "32M", "--slab", "4M");
	c = harness_connect(b, "new", 0);
	CHECK_OK(kvb_ns_open(c, &l, &ns2, NULL));
	for (int i = 0; i < N; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		CHECK_RC(kvb_delete(c, ns2, k), 0);
	}
	for (int i = 0; i < 4 * N; i++) {
		kvb_key k = harness_key(SEED + 2, (uint64_t)i);

		harness_fill(page, PB, &k, SEED + 2);
		CHECK_RC(kvb_put(c, ns2, k, page, PB), 0);
	}
	/* The old client: its keys are gone, and nothing else may pass for them. */
	for (int i = 0; i < N; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);
		int rc = kvb_get(old, ns, k, page, PB);

		CHECKF(rc < 0, "deleted key %d read back (%d) by a client of the dead broker", i,
		       rc);
	}
	/* Once reconnected it reads the new broker's pages, through the new broker's directory. */
	for (uint64_t t0 = harness_now_ms(); kvb_nop(old); usleep(20000))
		CHECKF(harness_now_ms() - t0 < 20000, "the old client never reconnected");
	for (int i = 0; i < 4 * N; i++) {
		kvb_key k = harness_key(SEED + 2, (uint64_t)i);
		int rc = kvb_get(old, ns, k, page, PB);

		CHECK(rc == (int)PB || rc == -ENOENT);
		if (rc == (int)PB)
			CHECK_OK(harness_verify(page, PB, &k, SEED + 2, "new broker's page"));
	}
	CHECK(harness_stat(c, "counters.dir_gets") > 0);
	kvb_close(old);
	kvb_close(c);
	harness_broker_stop(b);
	free(page);
	harness_log("adoption: the dead broker's client read nothing of the next broker's slots");
}

#define EARLY_READS 250 /* past three quarters of KVB_NOTES_ENTRIES (256), short of all */

/* What the eventfds this process holds count: the writes nobody has read yet. */
static uint64_t eventfd_counts(void)
{
	uint64_t sum = 0;

	for (int fd = 0; fd < 1024; fd++) {
		char path[64], line[128];
		FILE *f;

		snprintf(path, sizeof(path), "/proc/self/fdinfo/%d", fd);
		f = fopen(path, "r");
		if (!f)
			continue;
		while (fgets(line, sizeof(line), f)) {
			unsigned long long n;

			if (sscanf(line, "eventfd-count: %llx", &n) == 1)
				sum += n;
		}
		fclose(f);
	}
	return sum;
}

/* A broker with EARLY_READS pages of 4 KiB (keys of seed) that c reads through the directory. */
static kvb_client *dir_pages(struct harness_broker **b, const char *name, uint64_t seed,
			     uint32_t *ns)
{
	kvb_client *c;
	uint8_t page[4096];
	struct kvb_layout l;
	char lname[64];

	*b = harness_broker_start("--pool", "64M", "--slab", "4M");
	c = harness_connect(*b, name, 0);
	snprintf(lname, sizeof(lname), "test/%s", name);
	harness_layout(&l, lname, KVB_LAYOUT_MLA, 64, 1, 0, 1, sizeof(page) / 64);
	CHECK_OK(kvb_ns_open(c, &l, ns, NULL));
	for (uint64_t i = 0; i < EARLY_READS; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(page, sizeof(page), &k, SEED);
		CHECK_OK(kvb_put(c, *ns, k, page, sizeof(page)));
	}
	CHECK_EQ(harness_stat_wait(c, "bg_jobs", 0, 10000), 0);
	return c;
}

/*
 * The broker asleep, then stopped (SIGSTOP), so that nothing drains the note ring or reads the
 * doorbell: 250 reads through the directory ring it once (the sum of our eventfds' counters
 * grows by one), past 192 of 256 entries; then it runs again and counts all 250.
 */
static void note_early(void)
{
	struct harness_broker *b;
	uint64_t rung, dir;
	uint8_t page[4096];
	uint32_t ns;
	kvb_client *c = dir_pages(&b, "note-early", SEED + 1, &ns);

	/* A broker not asleep yet when stopped needs no doorbell: then again, waiting longer. */
	for (int wait_ms = 50; wait_ms <= 800; wait_ms *= 4) {
		dir = harness_stat(c, "counters.dir_gets");
		usleep((useconds_t)wait_ms * 1000); /* past the poll window STATS opened */
		CHECK_OK(kill(b->pid, SIGSTOP));
		rung = eventfd_counts();
		for (uint64_t i = 0; i < EARLY_READS; i++) {
			kvb_key k = harness_key(SEED + 1, i);

			CHECK_EQ(kvb_get(c, ns, k, page, sizeof(page)), (int)sizeof(page));
			CHECK_OK(harness_verify(page, sizeof(page), &k, SEED, "page read"));
			if (i == EARLY_READS * 3 / 5)
				CHECKF(eventfd_counts() == rung,
				       "a doorbell before 3/4 of the ring");
		}
		rung = eventfd_counts() - rung;
		CHECK_OK(kill(b->pid, SIGCONT));
		/* Every read through the directory, all told: none was a round trip. */
		CHECK_EQ(harness_stat(c, "counters.dir_gets") - dir, EARLY_READS);
		harness_log("note-early: %d reads after %d ms, %llu doorbells", EARLY_READS,
			    wait_ms, (unsigned long long)rung);
		if (rung)
			break;
	}
	CHECKF(rung == 1, "%llu doorbells for %d reads through the directory, not one",
	       (unsigned long long)rung, EARLY_READS);
	kvb_close(c);
	harness_broker_stop(b);
}

#define NAP_READS 3000
#define NAP_GAP_US 100

/* Our write(2)s so far (/proc/self/io syscw): a doorbell is one, and reads make none. */
static uint64_t writes_made(void)
{
	char line[128];
	uint64_t n = 0;
	FILE *f = fopen("/proc/self/io", "r");

	CHECKF(f != NULL, "/proc/self/io: %s", strerror(errno));
	while (fgets(line, sizeof(line), f))
		if (sscanf(line, "syscw: %" SCNu64, &n) == 1)
			break;
	fclose(f);
	return n;
}

/*
 * The broker running: a steady stream of reads through the directory, which it learns the rate
 * of and drains on its own timer, rings its doorbell a few times at most (the old broker: once
 * per 192 notes, 15), and every read is counted.
 */
static void note_nap(void)
{
	struct harness_broker *b;
	uint64_t rung, dir;
	uint8_t page[4096];
	uint32_t ns;
	kvb_client *c = dir_pages(&b, "note-nap", SEED + 2, &ns);

	usleep(50000); /* past the poll window STATS opened: the broker asleep */
	dir = harness_stat(c, "counters.dir_gets");
	rung = writes_made();
	for (uint64_t i = 0; i < NAP_READS; i++) {
		kvb_key k = harness_key(SEED + 2, i % EARLY_READS);

		CHECK_EQ(kvb_get(c, ns, k, page, sizeof(page)), (int)sizeof(page));
		usleep(NAP_GAP_US);
	}
	rung = writes_made() - rung;
	CHECK_EQ(harness_stat(c, "counters.dir_gets") - dir, NAP_READS);
	harness_log("note-nap: %d reads %d us apart, %llu doorbells", NAP_READS, NAP_GAP_US,
		    (unsigned long long)rung);
	CHECKF(rung <= 4, "%llu doorbells for %d steady reads through the directory",
	       (unsigned long long)rung, NAP_READS);
	kvb_close(c);
	harness_broker_stop(b);
}

#define LRU_PAGES 400 /* 64 KiB pages into a 16 MiB pool: about 150 evicted */
#define LRU_ROUNDS 3

static int stored(kvb_client *c, uint32_t ns, uint64_t i)
{
	kvb_key k = harness_key(SEED + 3, i);
	size_t hits = 0;

	CHECK_OK(kvb_lookup(c, ns, &k, 1, &hits));
	return hits == 1;
}

static void told_lru(void)
{
	struct harness_broker *b = harness_broker_start("--pool", "16M", "--slab", "4M");
	kvb_client *c = harness_connect(b, "told-lru", 0);
	uint8_t *src, *page = malloc(PB);
	struct kvb_layout l;
	uint64_t first = 0, dir;
	uint32_t ns, bid;

	CHECK(page != NULL);
	layout_of(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	src = kvb_buf_alloc_host(c, PB, &bid);
	CHECK(src != NULL);
	for (uint64_t i = 0; i < LRU_PAGES; i++) {
		kvb_key k = harness_key(SEED + 3, i);

		harness_fill(src, PB, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, src, PB), 0);
	}
	while (first < LRU_PAGES && !stored(c, ns, first))
		first++;
	CHECKF(first > 0 && first < LRU_PAGES - 10, "pool not full: %llu pages evicted",
	       (unsigned long long)first);
	dir = harness_stat(c, "counters.dir_gets");
	for (uint64_t r = 0; r < LRU_ROUNDS; r++) {
		/* Each round keeps the page it read and evicts the one after it. */
		uint64_t cold = first + 2 * r;
		kvb_key k = harness_key(SEED + 3, cold), nk = harness_key(SEED + 4, r);
		struct kvb_op put = {
			.opcode = KVB_OP_PUT, .ns = ns, .buf = bid, .key = nk, .user_data = r};
		struct kvb_completion done;

		usleep(50000); /* past the poll window: the broker asleep */
		CHECK_OK(kill(b->pid, SIGSTOP));
		CHECK_EQ(kvb_get(c, ns, k, page, PB), (int)PB);
		CHECK_OK(harness_verify(page, PB, &k, SEED, "the coldest page"));
		harness_fill(src, PB, &nk, SEED);
		CHECK_EQ(kvb_submit(c, &put, 1), 1);
		CHECK_OK(kill(b->pid, SIGCONT));
		harness_reap_n(c, &done, 1);
		CHECK_EQ(done.res, 0);
		CHECKF(stored(c, ns, cold), "round %llu: page %llu, just read, was evicted",
		       (unsigned long long)r, (unsigned long long)cold);
		CHECKF(!stored(c, ns, cold + 1),
		       "round %llu: page %llu, the coldest, is still there", (unsigned long long)r,
		       (unsigned long long)cold + 1);
	}
	CHECK_EQ(harness_stat(c, "counters.dir_gets") - dir, LRU_ROUNDS);
	free(page);
	kvb_close(c);
	harness_broker_stop(b);
}

int main(int argc, char **argv)
{
	uint64_t d;

	harness_init(argc, argv);
	d = churn(0);
	CHECKF(d > 0, "no GET went through the directory");
	harness_log("directory: %llu GETs the clients did themselves", (unsigned long long)d);
	CHECK_EQ(churn(1), 0);
	adoption();
	note_early();
	note_nap();
	told_lru();
	return H_PASS;
}
