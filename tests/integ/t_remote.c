// SPDX-License-Identifier: MIT
/*
 * t_remote.c - the remote tier across three nodes on this machine: a Redis Cluster of three
 * masters (redis-server in cluster mode, no replicas, cluster-require-full-coverage no,
 * allkeys-lru) on free loopback ports, and one kvbrokerd per node with --remote.
 *
 *   - a page PUT on node A is found by LOOKUP (KVB_TIER_REMOTE) and fetched byte-exact by a
 *     client of node B, which then holds it in RAM;
 *   - two brokers publishing the same pages at once leave one copy of each in the cluster;
 *   - --remote-publish reuse: nothing at PUT, each page at its first GET/ACQUIRE hit, once;
 *   - --remote-publish evict: nothing at PUT, each page as it leaves RAM;
 *   - fetches into registered buffers land there as they arrive (fetched_direct), and still
 *     complete only once checked;
 *   - a value damaged in Redis behind the brokers' back (SETRANGE) is never served: a miss;
 *   - a client killed while its GET's fetch lands in its buffer: nothing written there after,
 *     the fetch completes into RAM;
 *   - eviction under the shards' memory limit: misses, and every hit byte-exact;
 *   - one shard killed: local hits unaffected, misses on its slots only (at once, not after a
 *     deadline each), recovery once it is back;
 *   - a stopped shard (SIGSTOP: the connection stays up, nothing answers): misses on its
 *     slots within the deadline, local hits unaffected, recovery after SIGCONT.
 *
 * A real partition, a node's link cut in network namespaces, is t_remote_netns. The cluster
 * and broker helpers are rtier.c. Skips (77) when redis-server is not installed (tools/deps.sh
 * installs it).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "../../broker/remote_value.h"
#include "rtier.h"

#define NNODES RT_NODES

/* ---- the cases ---- */

/*
 * --remote-publish reuse on a fourth broker: a PUT publishes nothing; the first GET (or
 * ACQUIRE) hit of a page publishes it, once; node B then fetches exactly the pages reused.
 */
static void case_publish_reuse(void)
{
	enum { K = 6 };
	char url[128], tmo[16];
	struct harness_broker *d;
	struct kvb_layout l;
	kvb_client *c;
	kvb_key keys[K], other;
	uint8_t *buf = malloc(rt.page_bytes);
	uint32_t ns;
	size_t pb;
	struct kvb_lease lease;
	char *j;

	harness_log("--remote-publish reuse: published at the first hit, not at PUT");
	snprintf(url, sizeof(url), "redis://%s:%u", rt.n[0].addr, rt.n[0].port);
	snprintf(tmo, sizeof(tmo), "%d", rt.tmo);
	/* D's values all go through hiredis's reader, then are copied: that path is checked too. */
	setenv("KVB_TEST_REMOTE_COPY", "1", 1);
	d = harness_broker_start("--pool", "64M", "--remote", url, "--remote-timeout", tmo,
				 "--remote-prefix", "t:", "--remote-publish", "reuse");
	unsetenv("KVB_TEST_REMOTE_COPY");
	c = harness_connect(d, "nodeD", 0);
	rt_layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK(harness_stat_wait(c, "remote.shards_reachable", NNODES, 10000) == NNODES);
	harness_key_chain(keys, K, 16, 808);
	for (int i = 0; i < K; i++) {
		harness_fill(buf, pb, &keys[i], 808);
		CHECK_RC(kvb_put(c, ns, keys[i], buf, pb), 0);
	}
	usleep(200000);
	CHECK_EQ(harness_stat(c, "remote.published"), 0);
	/* Pages 0 and 1 reused (page 0 twice: still one publish), page 2 by an ACQUIRE. */
	CHECK_RC(kvb_get(c, ns, keys[0], buf, pb), (long long)pb);
	CHECK_RC(kvb_get(c, ns, keys[0], buf, pb), (long long)pb);
	CHECK_RC(kvb_get(c, ns, keys[1], buf, pb), (long long)pb);
	CHECK_OK(kvb_acquire(c, ns, keys[2], &lease));
	CHECK_OK(kvb_release(c, &lease));
	CHECK_EQ(harness_stat_wait(c, "remote.published", 3, 10000), 3);
	/* A page of node A's, fetched the copying way: byte-exact, and not published back. */
	harness_key_chain(&other, 1, 16, 101);
	CHECK_RC(kvb_get(c, ns, other, buf, pb), (long long)pb);
	CHECK(harness_verify(buf, pb, &other, 101, "copied fetch") == 0);
	CHECK_EQ(harness_stat(c, "remote.fetched"), 1);
	CHECK_EQ(harness_stat(c, "remote.fetched_in_place"), 0);
	CHECK_RC(kvb_get(c, ns, other, buf, pb), (long long)pb);
	usleep(100000);
	CHECK_EQ(harness_stat(c, "remote.published") + harness_stat(c, "remote.publish_existed"),
		 3);
	for (int i = 0; i < K; i++)
		CHECK_EQ(rt_get_page(1, &keys[i], 808, buf), i < 3);
	j = harness_stats(c);
	CHECK(strstr(j, "\"publish\":\"reuse\"") || strstr(j, "\"publish\": \"reuse\""));
	free(j);
	kvb_close(c);
	harness_broker_stop(d);
	free(buf);
}

/*
 * --remote-publish evict on a broker with a 16 MiB pool: a PUT publishes nothing; the pages
 * pushed out of RAM by later PUTs are published as they leave, and node B fetches those.
 */
static void case_publish_evict(void)
{
	enum { K = 40 };
	char url[128], tmo[16];
	struct harness_broker *e;
	struct kvb_layout l;
	kvb_client *c;
	kvb_key keys[K];
	uint8_t *buf = malloc(rt.page_bytes);
	uint64_t evicted;
	uint32_t ns;
	size_t pb;
	int hits = 0;

	harness_log("--remote-publish evict: published as pages leave RAM, not at PUT");
	snprintf(url, sizeof(url), "redis://%s:%u", rt.n[0].addr, rt.n[0].port);
	snprintf(tmo, sizeof(tmo), "%d", rt.tmo);
	e = harness_broker_start("--pool", "16M", "--remote", url, "--remote-timeout", tmo,
				 "--remote-prefix", "t:", "--remote-publish", "evict");
	c = harness_connect(e, "nodeE", 0);
	rt_layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK(harness_stat_wait(c, "remote.shards_reachable", NNODES, 10000) == NNODES);
	harness_key_chain(keys, K, 16, 909);
	for (int i = 0; i < 4; i++) {
		harness_fill(buf, pb, &keys[i], 909);
		CHECK_RC(kvb_put(c, ns, keys[i], buf, pb), 0);
	}
	usleep(100000);
	CHECK_EQ(harness_stat(c, "remote.published"), 0);
	for (int i = 4; i < K; i++) {
		harness_fill(buf, pb, &keys[i], 909);
		CHECK_RC(kvb_put(c, ns, keys[i], buf, pb), 0);
	}
	evicted = harness_stat(c, "counters.evictions");
	harness_log("%llu pages evicted", (unsigned long long)evicted);
	CHECK_GT(evicted, 0);
	CHECK_EQ(harness_stat_wait(c, "remote.published", evicted, 10000), evicted);
	/* The first pages left E's RAM (published); the last are still there (not). */
	for (int i = 0; i < K; i++) {
		int h = rt_get_page(1, &keys[i], 909, buf);

		CHECK(i > 0 || h);
		CHECK(i < K - 1 || !h);
		hits += h;
	}
	CHECK_EQ(hits, (int)evicted);
	kvb_close(c);
	harness_broker_stop(e);
	free(buf);
}

static void case_put_a_get_b(void)
{
	enum { N = 24 };
	kvb_key keys[N];
	uint8_t tiers[N], *buf = malloc(rt.page_bytes);
	size_t hits = 0;

	harness_log("a page PUT on node A, found and fetched by node B");
	harness_key_chain(keys, N, 16, 101);
	rt_put_pages(0, keys, N, 101);
	rt_publish_wait(0, N);
	CHECK_EQ(rt_stat(0, "remote.published"), N);
	CHECK_OK(kvb_lookup_tiers(rt.n[1].cl, rt.n[1].ns, keys, N, &hits, tiers));
	CHECK_EQ(hits, N);
	for (int i = 0; i < N; i++)
		CHECK_EQ(tiers[i], KVB_TIER_REMOTE);
	/* Odd pages into a registered buffer: they land in the GET's destination as they come. */
	for (int i = 0; i < N; i++)
		CHECK_EQ(i % 2 ? rt_get_page_reg(1, &keys[i], 101)
			       : rt_get_page(1, &keys[i], 101, buf),
			 1);
	CHECK_EQ(rt_stat(1, "remote.fetched"), N);
	/* [hist] Each fetch timed, each GET's hit the remote tier's. */
	CHECK_EQ(rt_stat(1, "histograms.fetch.count"), N);
	CHECK_EQ(rt_stat(1, "counters.hits_remote"), N);
	CHECK_EQ(rt_stat(1, "counters.hits_disk"), 0);
	/* One at a time, each value lands in its slot (a reply behind another may be copied). */
	CHECK_GT(rt_stat(1, "remote.fetched_in_place"), N / 2);
	CHECK_GT(rt_stat(1, "remote.fetched_direct"), N / 4);
	CHECK_LE(rt_stat(1, "remote.fetched_direct"), N / 2);
	CHECK_OK(kvb_lookup_tiers(rt.n[1].cl, rt.n[1].ns, keys, N, &hits, tiers));
	CHECK_EQ(hits, N);
	for (int i = 0; i < N; i++)
		CHECK_EQ(tiers[i], KVB_TIER_RAM);
	/* Fetched pages are never published back. */
	CHECK_EQ(rt_stat(1, "remote.published") + rt_stat(1, "remote.publish_existed"), 0);
	CHECK_EQ(rt_dbsize(), N);
	free(buf);
}

static struct {
	kvb_key keys[16];
	struct harness_gate go;
} * race;

static int racer(int idx, void *arg)
{
	struct kvb_opts o = {.name = "racer"};
	struct kvb_layout l;
	kvb_client *c = NULL;
	uint8_t *buf;
	uint32_t ns;
	size_t pb;

	(void)arg;
	o.socket_path = rt.n[1 + idx].bk->sock;
	CHECK_OK(kvb_connect(&o, &c));
	rt_layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	buf = malloc(pb);
	CHECK(buf);
	harness_gate_wait(&race->go, 10000);
	for (int i = 0; i < 16; i++) {
		harness_fill(buf, pb, &race->keys[i], 202);
		CHECK_RC(kvb_put(c, ns, race->keys[i], buf, pb), 0);
	}
	free(buf);
	kvb_close(c);
	return H_PASS;
}

static void case_publish_race(void)
{
	long long before = rt_dbsize();
	pid_t pids[2];

	harness_log("two brokers publish the same 16 pages at once");
	race = harness_shared(sizeof(*race));
	harness_key_chain(race->keys, 16, 16, 202);
	harness_gate_init(&race->go);
	for (int i = 0; i < 2; i++)
		pids[i] = harness_fork(racer, i, NULL);
	harness_gate_open(&race->go, 2);
	CHECK_EQ(harness_wait(pids, 2, 20000, NULL), 0);
	rt_publish_wait(1, 16);
	rt_publish_wait(2, 16);
	CHECK_EQ(rt_stat(1, "remote.published") + rt_stat(2, "remote.published"), 16);
	CHECK_EQ(rt_stat(1, "remote.publish_existed") + rt_stat(2, "remote.publish_existed"), 16);
	CHECK_EQ(rt_dbsize(), before + 16);
}

static void case_damaged(void)
{
	kvb_key k;
	char name[256];
	uint8_t *buf = malloc(rt.page_bytes);
	uint64_t corrupt = rt_stat(2, "remote.corrupt");
	int owner;
	redisReply *r;

	harness_log("a value damaged in the cluster is never served");
	uint64_t pub = rt_settled(0);

	harness_key_chain(&k, 1, 16, 303);
	rt_put_pages(0, &k, 1, 303);
	rt_publish_wait(0, pub + 1);
	owner = rt_key_owner(&k, name, sizeof(name));
	CHECK_GE(owner, 0);
	/* One byte of the page (past the value header) changed behind every broker's back. */
	r = rt_cmd(owner, "SETRANGE %s %d %b", name, (int)sizeof(struct remote_hdr) + 4096, "\x5a",
		   (size_t)1);
	CHECK(r && r->type == REDIS_REPLY_INTEGER);
	freeReplyObject(r);
	CHECK_EQ(rt_get_page(2, &k, 303, buf), 0);
	CHECK_EQ(rt_stat(2, "remote.corrupt"), corrupt + 1);
	/* Landing in a registered destination as it comes: still a miss, never a hit. */
	CHECK_EQ(rt_get_page_reg(2, &k, 303), 0);
	CHECK_EQ(rt_stat(2, "remote.corrupt"), corrupt + 2);
	/* And a header cut short. */
	r = rt_cmd(owner, "SET %s %b", name, "KVBR", (size_t)4);
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	CHECK_EQ(rt_get_page(2, &k, 303, buf), 0);
	CHECK_EQ(rt_stat(2, "remote.corrupt"), corrupt + 3);
	free(buf);
}

static void case_eviction(void)
{
	enum { N = 48 };
	kvb_key *keys = malloc(N * sizeof(*keys));
	uint8_t *buf = malloc(rt.page_bytes);
	int hits = 0;

	harness_log("eviction under the shards' memory limit: misses, never wrong bytes");
	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rt_cmd(i, "CONFIG SET maxmemory 12mb");

		CHECK(r && r->type == REDIS_REPLY_STATUS);
		freeReplyObject(r);
	}
	uint64_t pub = rt_settled(0);

	harness_key_chain(keys, N, 16, 404);
	rt_put_pages(0, keys, N, 404);
	rt_publish_wait(0, pub + N);
	for (int i = 0; i < N; i++)
		hits += rt_get_page(1, &keys[i], 404, buf);
	harness_log("%d of %d pages still in the cluster", hits, N);
	CHECK_GT(hits, 0);
	CHECK_LT(hits, N);
	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rt_cmd(i, "CONFIG SET maxmemory 64mb");

		CHECK(r && r->type == REDIS_REPLY_STATUS);
		freeReplyObject(r);
	}
	free(keys);
	free(buf);
}

static int dying_getter(int idx, void *arg)
{
	struct kvb_opts o = {.name = "dying"};
	struct kvb_layout l;
	kvb_client *c = NULL;
	const kvb_key *k = arg;
	uint8_t *buf;
	uint32_t ns, id;
	size_t pb;

	(void)idx;
	o.socket_path = rt.n[2].bk->sock;
	CHECK_OK(kvb_connect(&o, &c));
	rt_layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	buf = kvb_buf_alloc_host(c, pb, &id);
	CHECK(buf);
	kvb_get(c, ns, *k, buf, pb); /* killed while its fetch waits on a stopped shard */
	return H_FAIL;
}

/*
 * A client dies while its GET's fetch is in flight, the fetch landing in its registered
 * buffer: the broker lets go of that buffer (unmapped with the session) and writes nothing
 * there after; the fetch itself completes into RAM and serves the next GET byte-exact.
 */
static void case_client_dies(void)
{
	kvb_key k;
	uint64_t pub = rt_settled(0), fetches, fetched, direct;
	uint8_t *buf = malloc(rt.page_bytes);
	int owner;
	pid_t pid;

	harness_log("a client dies while its GET's fetch lands in its buffer");
	harness_key_chain(&k, 1, 16, 707);
	rt_put_pages(0, &k, 1, 707);
	rt_publish_wait(0, pub + 1);
	owner = rt_key_owner(&k, NULL, 0);
	CHECK_GE(owner, 0);
	fetches = rt_stat(2, "remote.fetches");
	fetched = rt_stat(2, "remote.fetched");
	direct = rt_stat(2, "remote.fetched_direct");
	kill(rt.n[owner].pid, SIGSTOP); /* the GET's reply waits */
	pid = harness_fork(dying_getter, 0, &k);
	CHECK_EQ(harness_stat_wait(rt.n[2].cl, "remote.fetches", fetches + 1, 5000), fetches + 1);
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	usleep(100000); /* its session is gone (and its buffer unmapped) before the reply */
	kill(rt.n[owner].pid, SIGCONT);
	CHECK_EQ(harness_stat_wait(rt.n[2].cl, "remote.fetched", fetched + 1, 5000), fetched + 1);
	CHECK_EQ(rt_stat(2, "remote.fetched_direct"), direct);
	CHECK_EQ(rt_get_page(2, &k, 707, buf), 1);
	CHECK_EQ(rt_stat(2, "remote.fetched"), fetched + 1); /* from RAM now */
	free(buf);
}

/*
 * Fresh pages PUT on A (all published), then a fault on shard `down` (kill or stop): on C the
 * pages of that shard miss and the others hit; B's local hits are as fast as before.
 */
static void case_fault(int down, int stop, uint64_t seed)
{
	enum { N = 24 };
	kvb_key keys[N], local[24];
	int owner[N], on_down = 0, hits = 0;
	uint8_t *buf = malloc(rt.page_bytes);
	double before, during;
	uint64_t t0, worst = 0;

	harness_log("shard %d %s", down, stop ? "stopped (SIGSTOP)" : "killed");
	harness_key_chain(local, 24, 16, 101);
	uint64_t pub = rt_settled(0);

	harness_key_chain(keys, N, 16, seed);
	rt_put_pages(0, keys, N, seed);
	rt_publish_wait(0, pub + N);
	for (int i = 0; i < N; i++) {
		owner[i] = rt_key_owner(&keys[i], NULL, 0);
		CHECK_GE(owner[i], 0);
		on_down += owner[i] == down;
	}
	CHECK_GT(on_down, 0);
	before = rt_local_get_us(1, local, 24, 101, buf);
	kill(rt.n[down].pid, stop ? SIGSTOP : SIGKILL);
	if (!stop) {
		waitpid(rt.n[down].pid, NULL, 0);
		rt.n[down].pid = 0;
	}
	during = rt_local_get_us(1, local, 24, 101, buf);
	harness_log("local GET median %.0f us before, %.0f us with the shard down", before, during);
	CHECK_LT(during, before * 3 + 500);
	for (int i = 0; i < N; i++) {
		int h;

		t0 = harness_now_ms();
		h = i % 2 ? rt_get_page_reg(2, &keys[i], seed)
			  : rt_get_page(2, &keys[i], seed, buf);
		if (harness_now_ms() - t0 > worst)
			worst = harness_now_ms() - t0;
		CHECKF(h == (owner[i] != down), "key %d on shard %d: %s", i, owner[i],
		       h ? "hit" : "miss");
		hits += h;
	}
	harness_log("%d hits, %d misses on the lost shard, slowest GET %llu ms", hits, on_down,
		    (unsigned long long)worst);
	CHECK_LE(worst, (uint64_t)rt.tmo + 300);
	CHECK_LT(rt_stat(2, "remote.shards_reachable"), NNODES);
	/* Back: the shard rejoins; its pages are lost (killed) or still there (stopped). */
	if (stop)
		kill(rt.n[down].pid, SIGCONT);
	else
		rt_redis_start(down);
	rt_cluster_wait_ok(15000);
	for (int i = 0; i < NNODES; i++)
		rt_reachable_wait(i, 15000);
	if (stop) {
		for (int i = 0; i < N; i++)
			if (owner[i] == down)
				CHECK_EQ(rt_get_page(2, &keys[i], seed, buf), 1);
	} else {
		kvb_key fresh[8];

		pub = rt_settled(0);
		harness_key_chain(fresh, 8, 16, seed + 1);
		rt_put_pages(0, fresh, 8, seed + 1);
		rt_publish_wait(0, pub + 8);
		for (int i = 0; i < 8; i++)
			CHECK_EQ(rt_get_page(2, &fresh[i], seed + 1, buf), 1);
	}
	harness_log("recovered: %llu back-offs, %llu recoveries on node C",
		    (unsigned long long)rt_stat(2, "remote.backoffs"),
		    (unsigned long long)rt_stat(2, "remote.recoveries"));
	CHECK_GE(rt_stat(2, "remote.recoveries"), 1);
	free(buf);
}

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	rt_cluster_start();
	harness_log("cluster up on ports %u %u %u", rt.n[0].port, rt.n[1].port, rt.n[2].port);
	rt_brokers_start(NULL);
	case_put_a_get_b();
	case_publish_race();
	case_publish_reuse();
	case_publish_evict();
	case_damaged();
	case_client_dies();
	case_eviction();
	case_fault(2, 0, 505);
	case_fault(1, 1, 606);
	rt_finish();
	return H_PASS;
}
