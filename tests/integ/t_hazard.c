// SPDX-License-Identifier: MIT
/*
 * t_hazard.c - leases of the client's own hazard table [hazard] (proto/wire.h): kvb_acquire()
 * of a page the pool directory lists takes no round trip, and the page's bytes still hold for
 * as long as the lease does.
 *
 * 1. Churn: a writer PUTs 64 KiB pages through a 32 MiB pool (every slot rewritten many times
 *    over) while two readers lease up to 16 of the coldest recent keys at a time, check them,
 *    hold them 300 us, check them again and release them. Every held page must stay byte-exact
 *    to its release; the leases must have been the clients' own (counters.dir_acquires); at
 *    the end no lease and no pin is left, and acquires equal releases. The broker reads the
 *    readers' notes before it evicts ([told-lru], store.c), so it mostly pins their pages as
 *    told; the withdrawal that finds a lease it was not told of yet (counters.hazard_pins) is
 *    left to the moment between a hazard entry and its note here, and is part 4's.
 * 2. Semantics, one client: the leases count in STATS (leases, lease_bytes, pinned pages once
 *    told); --max-lease-bytes
 *    bounds them (the 17th of 1 MiB in 64 KiB pages is -EDQUOT from the broker); a page deleted
 *    while leased keeps its bytes until the release, and its slot comes back after it; a second
 *    release and an async RELEASE's leftover are -EINVAL; an async RELEASE completes 0.
 *    With leases of the broker's held, the table takes only what the limits leave.
 * 3. kill -9 of a client whose leased pages were deleted meanwhile: their pins go with it.
 * 4. A hostile table: a raw client names real pages (and garbage) in all 32 entries with a
 *    wrong count; another client's PUTs through the whole pool all succeed, at most those pages
 *    stay pinned, and they are unpinned when the entries are cleared.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "proto.h"
#include "reliab.h"

#define PB (64u * 1024)
#define SEED 7373
#define CHURN_MS 2000
#define RECENT 480 /* of the pool's ~500 slots: the readers lease pages about to be evicted */
#define HOLD 16

struct shared {
	volatile uint64_t written;
	volatile int stop;
	uint64_t held[2], wrong[2], missed[2];
	struct harness_gate ready, go;
};

static struct harness_broker *broker;

static void layout_of(struct kvb_layout *l)
{
	harness_layout(l, "test/hazard", KVB_LAYOUT_MLA, 64, 1, 0, 1, PB / 64);
}

static kvb_client *open_client(const char *name, uint32_t *ns)
{
	kvb_client *c = harness_connect(broker, name, 0);
	struct kvb_layout l;

	layout_of(&l);
	CHECK_OK(kvb_ns_open(c, &l, ns, NULL));
	return c;
}

static void put_keys(kvb_client *c, uint32_t ns, uint64_t seed, uint64_t n)
{
	uint8_t *page = malloc(PB);

	CHECK(page != NULL);
	for (uint64_t i = 0; i < n; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(page, PB, &k, SEED);
		CHECK_RC(kvb_put(c, ns, k, page, PB), 0);
	}
	free(page);
}

static int writer(int idx, void *arg)
{
	struct shared *sh = arg;
	uint8_t *page = malloc(PB);
	uint32_t ns;
	kvb_client *c = open_client("writer", &ns);

	(void)idx;
	CHECK(page != NULL);
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

static int reader(int idx, void *arg)
{
	struct shared *sh = arg;
	struct kvb_lease l[HOLD];
	kvb_key k[HOLD];
	uint64_t seed = (uint64_t)idx * 7919 + 1;
	uint32_t ns;
	kvb_client *c = open_client("reader", &ns);

	while (!sh->stop) {
		uint64_t w = __atomic_load_n(&sh->written, __ATOMIC_ACQUIRE);
		int n = 0;

		if (w < RECENT)
			continue;
		for (int j = 0; j < HOLD; j++) {
			int rc;

			seed = seed * 6364136223846793005ull + 1442695040888963407ull;
			/* the older half of the recent keys: the next to be evicted */
			k[n] = harness_key(SEED, w - RECENT + (seed >> 33) % (RECENT / 2));
			rc = kvb_acquire(c, ns, k[n], &l[n]);
			if (rc == -ENOENT) {
				sh->missed[idx]++;
				continue;
			}
			CHECK_RC(rc, 0);
			if (harness_verify(l[n].data, PB, &k[n], SEED, "page when leased"))
				sh->wrong[idx]++;
			n++;
		}
		usleep(300); /* the writer evicts meanwhile */
		for (int j = 0; j < n; j++) {
			if (harness_verify(l[j].data, PB, &k[j], SEED, "page at its release"))
				sh->wrong[idx]++;
			CHECK_OK(kvb_release(c, &l[j]));
		}
		sh->held[idx] += (uint64_t)n;
	}
	kvb_close(c);
	return 0;
}

static void churn(void)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	pid_t pids[3];
	kvb_client *c;
	char *json;

	broker = harness_broker_start("--pool", "32M", "--slab", "4M");
	pids[0] = harness_fork(writer, 0, sh);
	pids[1] = harness_fork(reader, 0, sh);
	pids[2] = harness_fork(reader, 1, sh);
	for (uint64_t t0 = harness_now_ms(); __atomic_load_n(&sh->written, __ATOMIC_ACQUIRE) < 2000;
	     usleep(10000))
		CHECKF(harness_broker_alive(broker) && harness_now_ms() - t0 < 30000,
		       "the writer stalled at %llu pages", (unsigned long long)sh->written);
	usleep(CHURN_MS * 1000);
	sh->stop = 1;
	CHECK_EQ(harness_wait(pids, 3, 30000, NULL), 0);
	c = harness_connect(broker, "stats", 0);
	json = harness_stats(c);
	harness_log("%llu pages written through a 32 MiB pool; %llu + %llu leases held 300 us "
		    "(%llu + %llu keys gone first); %llu leases the readers' own, %llu pages "
		    "kept for them",
		    (unsigned long long)sh->written, (unsigned long long)sh->held[0],
		    (unsigned long long)sh->held[1], (unsigned long long)sh->missed[0],
		    (unsigned long long)sh->missed[1],
		    (unsigned long long)harness_stat_u64(json, "counters.dir_acquires"),
		    (unsigned long long)harness_stat_u64(json, "counters.hazard_pins"));
	CHECKF(sh->wrong[0] + sh->wrong[1] == 0, "%llu leased pages changed under their lease",
	       (unsigned long long)(sh->wrong[0] + sh->wrong[1]));
	CHECK(sh->held[0] > 1000 && sh->held[1] > 1000);
	CHECK(sh->written > 4 * (32u << 20) / PB);
	CHECK_GE(harness_stat_u64(json, "counters.dir_acquires"), (sh->held[0] + sh->held[1]) / 2);
	/* Every ACQUIRE counted, a miss too; every lease released once. */
	CHECK_EQ(harness_stat_u64(json, "counters.acquires"),
		 sh->held[0] + sh->held[1] + sh->missed[0] + sh->missed[1]);
	CHECK_EQ(harness_stat_u64(json, "counters.releases"), sh->held[0] + sh->held[1]);
	CHECK_EQ(harness_stat_u64(json, "leases"), 0);
	CHECK_EQ(harness_stat_u64(json, "pool.pinned_pages"), 0);
	free(json);
	kvb_close(c);
	harness_broker_stop(broker);
}

static void semantics(void)
{
	struct kvb_lease l[HOLD + 1], extra;
	struct kvb_completion cq;
	struct kvb_op op;
	uint32_t ns;
	size_t hits;
	kvb_client *c;
	char *json;

	broker = harness_broker_start("--pool", "32M", "--slab", "4M", "--max-lease-bytes", "1M");
	c = open_client("semantics", &ns);
	put_keys(c, ns, SEED + 1, 64);
	for (int i = 0; i < HOLD; i++)
		CHECK_OK(kvb_acquire(c, ns, harness_key(SEED + 1, (uint64_t)i), &l[i]));
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "counters.dir_acquires"), HOLD);
	CHECK_EQ(harness_stat_u64(json, "leases"), HOLD);
	/* Told, and so pinned as the broker's own leases are (the map, eviction see them). */
	CHECK_EQ(harness_stat_u64(json, "pool.pinned_pages"), HOLD);
	CHECK_EQ(harness_stat_u64(json, "client_list[name=semantics].lease_bytes"), HOLD * PB);
	free(json);
	/* Past the budget the library asks the broker, which counts these leases too. */
	CHECK_RC(kvb_acquire(c, ns, harness_key(SEED + 1, HOLD), &l[HOLD]), -EDQUOT);

	/* Deleted under a lease: gone for everyone else, intact for the holder. */
	CHECK_OK(kvb_delete(c, ns, harness_key(SEED + 1, 0)));
	{
		kvb_key k0 = harness_key(SEED + 1, 0);

		CHECK_OK(kvb_lookup(c, ns, &k0, 1, &hits));
	}
	CHECK_EQ(hits, 0);
	/* The whole pool over: every held page is kept. */
	put_keys(c, ns, SEED + 2, 600);
	CHECK_EQ(harness_stat(c, "pool.pinned_pages"), HOLD);
	for (int i = 0; i < HOLD; i++) {
		kvb_key k = harness_key(SEED + 1, (uint64_t)i);

		CHECK_OK(harness_verify(l[i].data, PB, &k, SEED, "a held page under pressure"));
	}
	CHECK_OK(kvb_release(c, &l[0]));
	CHECK_EQ(harness_stat(c, "pool.pinned_pages"), HOLD - 1);
	CHECK_RC(kvb_release(c, &l[0]), -EINVAL);

	/* An async RELEASE completes 0, and leaves nothing for kvb_release(). */
	memset(&op, 0, sizeof(op));
	op.opcode = KVB_OP_RELEASE;
	op.off = l[1].id;
	op.user_data = 42;
	CHECK_RC(kvb_submit(c, &op, 1), 1);
	CHECK_RC(kvb_reap(c, &cq, 1, 1, 2000), 1);
	CHECK_EQ(cq.user_data, 42);
	CHECK_EQ(cq.res, 0);
	extra = l[1];
	CHECK_RC(kvb_release(c, &extra), -EINVAL);
	for (int i = 2; i < HOLD; i++)
		CHECK_OK(kvb_release(c, &l[i]));
	/*
	 * Acquired and at once released async, 40 times, no STATS between: the RELEASE (on the
	 * SQ) must not overtake its ACQUIRE (in the note ring) and leave a lease counted.
	 */
	put_keys(c, ns, SEED + 6, 1);
	for (int j = 0; j < 40; j++) {
		struct kvb_lease t;

		CHECK_OK(kvb_acquire(c, ns, harness_key(SEED + 6, 0), &t));
		op.off = t.id;
		CHECK_RC(kvb_submit(c, &op, 1), 1);
		CHECK_RC(kvb_reap(c, &cq, 1, 1, 2000), 1);
		CHECK_EQ(cq.res, 0);
	}
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "leases"), 0);
	CHECK_EQ(harness_stat_u64(json, "pool.pinned_pages"), 0);
	CHECK_EQ(harness_stat_u64(json, "client_list[name=semantics].lease_bytes"), 0);
	free(json);
	kvb_close(c);
	harness_broker_stop(broker);
}

/*
 * 2b. The limits hold for both kinds together (--max-leases 8): with 3 leases of the broker's
 * (async ACQUIREs, which the library never takes under its table), the table takes 5, and the
 * 9th lease is -EDQUOT. While the broker wrote KVB_HZ_MAX once, the table took 8 more.
 */
static void both_kinds(void)
{
	struct kvb_completion cq[3];
	struct kvb_lease l[6];
	struct kvb_op op[3];
	uint32_t ns;
	kvb_client *c;
	char *json;

	broker = harness_broker_start("--pool", "32M", "--slab", "4M", "--max-leases", "8");
	c = open_client("both", &ns);
	put_keys(c, ns, SEED + 7, 16);
	memset(op, 0, sizeof(op));
	for (int i = 0; i < 3; i++) {
		op[i].opcode = KVB_OP_ACQUIRE;
		op[i].ns = ns;
		op[i].key = harness_key(SEED + 7, (uint64_t)i);
		op[i].user_data = (uint64_t)i;
	}
	CHECK_RC(kvb_submit(c, op, 3), 3);
	harness_reap_n(c, cq, 3);
	for (int i = 0; i < 3; i++)
		CHECK_EQ(cq[i].res, 0);
	for (int i = 0; i < 5; i++)
		CHECK_OK(kvb_acquire(c, ns, harness_key(SEED + 7, (uint64_t)(3 + i)), &l[i]));
	CHECK_RC(kvb_acquire(c, ns, harness_key(SEED + 7, 8), &l[5]), -EDQUOT);
	json = harness_stats(c);
	CHECK_EQ(harness_stat_u64(json, "counters.dir_acquires"), 5);
	CHECK_EQ(harness_stat_u64(json, "leases"), 8);
	free(json);
	/* One of the broker's released (its RELEASE may still be on its way): one more, by
	 * either path. */
	CHECK_OK(kvb_release(c, &cq[0].lease));
	CHECK_OK(kvb_acquire(c, ns, harness_key(SEED + 7, 8), &l[5]));
	CHECK_EQ(harness_stat(c, "leases"), 8);
	kvb_close(c);
	harness_broker_stop(broker);
}

static int holder(int idx, void *arg)
{
	struct shared *sh = arg;
	struct kvb_lease l[8];
	uint32_t ns;
	kvb_client *c = open_client("holder", &ns);

	(void)idx;
	for (int i = 0; i < 8; i++)
		CHECK_OK(kvb_acquire(c, ns, harness_key(SEED + 3, (uint64_t)i), &l[i]));
	harness_gate_open(&sh->ready, 1);
	harness_gate_wait(&sh->go, 10000);
	pause(); /* until SIGKILL */
	return 0;
}

static void killed(void)
{
	struct shared *sh = harness_shared(sizeof(*sh));
	uint32_t ns;
	kvb_client *c;
	pid_t pid;
	int status;

	broker = harness_broker_start("--pool", "32M", "--slab", "4M");
	c = open_client("killer", &ns);
	put_keys(c, ns, SEED + 3, 8);
	harness_gate_init(&sh->ready);
	harness_gate_init(&sh->go);
	pid = harness_fork(holder, 0, sh);
	harness_gate_wait(&sh->ready, 10000);
	CHECK_EQ(harness_stat(c, "pool.pinned_pages"), 8);
	for (int i = 0; i < 8; i++)
		CHECK_OK(kvb_delete(c, ns, harness_key(SEED + 3, (uint64_t)i)));
	CHECK_EQ(harness_stat(c, "pool.pinned_pages"), 8);
	CHECK_EQ(harness_stat(c, "leases"), 8);
	harness_gate_open(&sh->go, 1);
	CHECK_EQ(kill(pid, SIGKILL), 0);
	CHECK_EQ(waitpid(pid, &status, 0), pid);
	CHECK_EQ(harness_stat_wait(c, "pool.pinned_pages", 0, 2000), 0);
	CHECK_EQ(harness_stat(c, "leases"), 0);
	CHECK_EQ(harness_stat(c, "pool.pages"), 0);
	kvb_close(c);
	harness_broker_stop(broker);
}

static void hostile(void)
{
	struct harness_raw r;
	struct kvb_layout l;
	kvb_atomic_u64 *hz;
	uint32_t ns, rns;
	kvb_client *c;
	char *json;

	broker = harness_broker_start("--pool", "32M", "--slab", "4M");
	c = open_client("honest", &ns);
	put_keys(c, ns, SEED + 4, 8);
	CHECK_OK(harness_raw_hello(&r, broker->sock, KVB_ABI_MAJOR, 8));
	CHECK(r.hdr.features & KVB_FEAT_HAZARDS);
	layout_of(&l);
	CHECK_OK(harness_raw_ns_open(&r, &l, &rns, NULL));
	hz = (kvb_atomic_u64 *)(void *)((char *)r.region + kvb_region_hz_off(&r.hdr) +
					KVB_HZ_TABLE);
	/* Eight real pages' locs (from the broker's own ACQUIREs, released again), then garbage. */
	for (uint32_t i = 0; i < 8; i++) {
		kvb_key k = harness_key(SEED + 4, i);
		struct kvb_sqe sqe = {.opcode = KVB_OP_ACQUIRE, .ns = rns, .user_data = i};
		struct kvb_cqe cqe;

		memcpy(sqe.key, k.b, sizeof(sqe.key));
		CHECK_EQ(harness_raw_submit(&r, &sqe, 1), 1);
		CHECK_EQ(harness_raw_reap(&r, &cqe, 1, 1, 2000), 1);
		CHECK_EQ(cqe.res, 0);
		kvb_store64_relaxed(&hz[i], cqe.loc | 1);
		sqe = (struct kvb_sqe){.opcode = KVB_OP_RELEASE, .off = cqe.lease};
		CHECK_EQ(harness_raw_submit(&r, &sqe, 1), 1);
		CHECK_EQ(harness_raw_reap(&r, &cqe, 1, 1, 2000), 1);
		CHECK_EQ(cqe.res, 0);
	}
	for (uint32_t i = 8; i < KVB_HZ_ENTRIES; i++)
		kvb_store64_relaxed(&hz[i], (uint64_t)i * 0x123456789abcdefull);
	kvb_store_relaxed((kvb_atomic_u32 *)(void *)((char *)r.region + kvb_region_hz_off(&r.hdr) +
						     KVB_HZ_COUNT),
			  0xffffffffu);
	/* Three pools' worth of PUTs: all succeed, and at most the eight named pages stay. */
	put_keys(c, ns, SEED + 5, 1500);
	json = harness_stats(c);
	CHECK_LE(harness_stat_u64(json, "pool.pinned_pages"), 8);
	CHECK_GE(harness_stat_u64(json, "counters.hazard_pins"), 1);
	free(json);
	for (uint32_t i = 0; i < KVB_HZ_ENTRIES; i++)
		kvb_store64_relaxed(&hz[i], 0);
	CHECK_EQ(harness_stat(c, "pool.pinned_pages"), 0);
	CHECK_EQ(harness_raw_hung_up(&r, 100), 0);
	harness_raw_close(&r);
	kvb_close(c);
	harness_broker_stop(broker);
}

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	harness_log("churn: leased pages held under eviction");
	churn();
	harness_log("semantics: counts, limits, delete under a lease, releases");
	semantics();
	harness_log("the lease limits for both kinds together");
	both_kinds();
	harness_log("kill -9 of a holder of deleted pages");
	killed();
	harness_log("a hostile hazard table");
	hostile();
	return H_PASS;
}
