// SPDX-License-Identifier: MIT
/*
 * t_remote.c - the remote tier across three nodes on this machine: a Redis Cluster of three
 * masters (redis-server in cluster mode, no replicas, cluster-require-full-coverage no,
 * allkeys-lru) on free loopback ports, and one kvbrokerd per node with --remote.
 *
 *   - a page PUT on node A is found by LOOKUP (KVB_TIER_REMOTE) and fetched byte-exact by a
 *     client of node B, which then holds it in RAM;
 *   - two brokers publishing the same pages at once leave one copy of each in the cluster;
 *   - a value damaged in Redis behind the brokers' back (SETRANGE) is never served: a miss;
 *   - eviction under the shards' memory limit: misses, and every hit byte-exact;
 *   - one shard killed: local hits unaffected, misses on its slots only (at once, not after a
 *     deadline each), recovery once it is back;
 *   - a partition of one shard, simulated with SIGSTOP (the connection stays up, nothing
 *     answers: what a partition looks like from the broker): misses on its slots within the
 *     deadline, local hits unaffected, recovery after SIGCONT.
 *
 * Network namespaces (ip netns + veth) would make the partition real; they need
 * CAP_NET_ADMIN, which CI containers often lack, so the stopped shard stands in for it here.
 * Skips (77) when redis-server is not installed (tools/deps.sh installs it).
 */
#include <arpa/inet.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NNODES 3
#define PAGE_LAYERS 16 /* 16 tokens x 16 layers x 4 KiB: 1 MiB pages */

struct rnode {
	uint16_t port, bus;
	pid_t pid;
	redisContext *rc;
};

static struct rnode nodes[NNODES];
static char dir[256];
static struct harness_broker *bk[NNODES];
static kvb_client *cl[NNODES];
static uint32_t nsid[NNODES];
static size_t page_bytes;
/*
 * The brokers' --remote-timeout: 500 ms (a loaded 2-vCPU machine saw 1 MiB fetches from live
 * shards pass 200 ms), or 1 s under the sanitizers (KVB_SCALE=small), whose loops run 5-20x
 * slower: a 1 MiB publish there outlived the 1 s stall bound of a 200 ms timeout.
 */
static int remote_tmo = 500;

static void redis_kill_all(void)
{
	for (int i = 0; i < NNODES; i++) {
		if (nodes[i].pid > 0) {
			kill(nodes[i].pid, SIGCONT);
			kill(nodes[i].pid, SIGKILL);
			waitpid(nodes[i].pid, NULL, 0);
			nodes[i].pid = 0;
		}
	}
}

/* A port nothing listens on now (the kernel's pick), distinct from those taken before. */
static uint16_t free_port(void)
{
	struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	CHECK(fd >= 0);
	CHECK(!bind(fd, (struct sockaddr *)&a, sizeof(a)));
	CHECK(!getsockname(fd, (struct sockaddr *)&a, &len));
	close(fd);
	return ntohs(a.sin_port);
}

static redisContext *rconnect(uint16_t port)
{
	struct timeval tv = {1, 0};
	redisContext *c = redisConnectWithTimeout("127.0.0.1", port, tv);

	if (c && !c->err) {
		redisSetTimeout(c, tv);
		return c;
	}
	if (c)
		redisFree(c);
	return NULL;
}

/* A command on node i; the reply, or NULL (connection reset: reconnected for the next one). */
static redisReply *rcmd(int i, const char *fmt, ...)
{
	redisReply *r;
	va_list ap;

	if (!nodes[i].rc)
		nodes[i].rc = rconnect(nodes[i].port);
	if (!nodes[i].rc)
		return NULL;
	va_start(ap, fmt);
	r = redisvCommand(nodes[i].rc, fmt, ap);
	va_end(ap);
	if (!r) {
		redisFree(nodes[i].rc);
		nodes[i].rc = NULL;
	}
	return r;
}

static void redis_start(int i)
{
	char port[8], bus[8], conf[300], log[300];
	pid_t pid;

	snprintf(port, sizeof(port), "%u", nodes[i].port);
	snprintf(bus, sizeof(bus), "%u", nodes[i].bus);
	snprintf(conf, sizeof(conf), "%s/nodes-%d.conf", dir, i);
	snprintf(log, sizeof(log), "%s/redis-%d.log", dir, i);
	pid = fork();
	CHECK(pid >= 0);
	if (!pid) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execlp("redis-server", "redis-server", "--port", port, "--bind", "127.0.0.1",
		       "--cluster-enabled", "yes", "--cluster-port", bus, "--cluster-config-file",
		       conf, "--cluster-require-full-coverage", "no", "--cluster-node-timeout",
		       "2000", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", "--save",
		       "", "--appendonly", "no", "--dir", dir, "--logfile", log, "--protected-mode",
		       "no", (char *)NULL);
		_exit(127);
	}
	nodes[i].pid = pid;
	for (int t = 0; t < 500; t++) {
		redisReply *r = rcmd(i, "PING");

		if (r) {
			freeReplyObject(r);
			return;
		}
		usleep(10000);
	}
	harness_fail(__FILE__, __LINE__, "redis-server on port %u did not start", nodes[i].port);
}

/* Node i says cluster_state:ok. */
static int cluster_ok(int i)
{
	redisReply *r = rcmd(i, "CLUSTER INFO");
	int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");

	if (r)
		freeReplyObject(r);
	return ok;
}

static void cluster_wait_ok(int timeout_ms)
{
	uint64_t until = harness_now_ms() + (uint64_t)timeout_ms;
	int ok = 0;

	while (!ok && harness_now_ms() < until) {
		ok = 1;
		for (int i = 0; i < NNODES; i++)
			ok &= cluster_ok(i);
		if (!ok)
			usleep(50000);
	}
	CHECKF(ok, "the cluster did not reach cluster_state:ok in %d ms", timeout_ms);
}

/* Three masters, a third of the slots each, met by hand (no redis-cli --cluster needed). */
static void cluster_create(void)
{
	static const int first[NNODES] = {0, 5461, 10923}, last[NNODES] = {5460, 10922, 16383};

	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rcmd(i, "CLUSTER ADDSLOTSRANGE %d %d", first[i], last[i]);

		CHECKF(r && r->type == REDIS_REPLY_STATUS, "ADDSLOTSRANGE on node %d: %s", i,
		       r && r->str ? r->str : "no reply");
		freeReplyObject(r);
		r = rcmd(i, "CLUSTER SET-CONFIG-EPOCH %d", i + 1);
		if (r)
			freeReplyObject(r);
	}
	for (int i = 1; i < NNODES; i++) {
		redisReply *r = rcmd(0, "CLUSTER MEET 127.0.0.1 %u %u", nodes[i].port,
				     nodes[i].bus);

		CHECKF(r && r->type == REDIS_REPLY_STATUS, "CLUSTER MEET: %s",
		       r && r->str ? r->str : "no reply");
		freeReplyObject(r);
	}
	cluster_wait_ok(10000);
}

/* 64 hex digits of a key, as the broker names it in the cluster. */
static void key_hex(const kvb_key *k, char out[65])
{
	for (int i = 0; i < 32; i++)
		sprintf(out + 2 * i, "%02x", k->b[i]);
}

/* The node holding the value of key k and its name there, or -1. */
static int key_owner(const kvb_key *k, char *name, size_t len)
{
	char hex[65];

	key_hex(k, hex);
	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rcmd(i, "KEYS *:%s", hex);
		int found = r && r->type == REDIS_REPLY_ARRAY && r->elements == 1;

		if (found && name)
			snprintf(name, len, "%s", r->element[0]->str);
		if (r)
			freeReplyObject(r);
		if (found)
			return i;
	}
	return -1;
}

static long long dbsize_all(void)
{
	long long n = 0;

	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rcmd(i, "DBSIZE");

		CHECK(r && r->type == REDIS_REPLY_INTEGER);
		n += r->integer;
		freeReplyObject(r);
	}
	return n;
}

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "test/remote", KVB_LAYOUT_MLA, 16, 1, 0, PAGE_LAYERS, 4096);
}

/* Waits until node's broker reaches every shard; prints its remote object when it does not. */
static void reachable_wait(int node, int timeout_ms)
{
	char *j;

	if (harness_stat_wait(cl[node], "remote.shards_reachable", NNODES, timeout_ms) == NNODES)
		return;
	j = harness_stats(cl[node]);
	printf("node %c: %s\n", 'A' + node, strstr(j, "\"remote\"") ? strstr(j, "\"remote\"") : j);
	free(j);
	harness_fail(__FILE__, __LINE__, "node %c does not reach all %d shards", 'A' + node,
		     NNODES);
}

static void brokers_start(void)
{
	for (int i = 0; i < NNODES; i++) {
		char url[128], name[16], tmo[16];
		struct kvb_layout l;

		snprintf(tmo, sizeof(tmo), "%d", remote_tmo);

		/* Each broker's seed is its own node; it learns the rest from CLUSTER SLOTS. */
		snprintf(url, sizeof(url), "redis://127.0.0.1:%u", nodes[i].port);
		bk[i] = harness_broker_start("--pool", "160M", "--remote", url, "--remote-timeout",
					     tmo, "--remote-prefix", "t:", "--log-level",
					     getenv("T_REMOTE_DEBUG") ? "debug" : "info");
		snprintf(name, sizeof(name), "node%c", 'A' + i);
		cl[i] = harness_connect(bk[i], name, 0);
		layout(&l);
		CHECK_OK(kvb_ns_open(cl[i], &l, &nsid[i], &page_bytes));
	}
	for (int i = 0; i < NNODES; i++)
		reachable_wait(i, 10000);
}

static void put_pages(int node, const kvb_key *keys, int n, uint64_t seed)
{
	uint8_t *buf = malloc(page_bytes);

	CHECK(buf);
	for (int i = 0; i < n; i++) {
		harness_fill(buf, page_bytes, &keys[i], seed);
		CHECK_RC(kvb_put(cl[node], nsid[node], keys[i], buf, page_bytes), 0);
	}
	free(buf);
}

static uint64_t stat_of(int node, const char *path)
{
	return harness_stat(cl[node], path);
}

/* Publishes of node answered so far: stored, or found there already. */
static uint64_t settled(int node)
{
	return stat_of(node, "remote.published") + stat_of(node, "remote.publish_existed");
}

/* Waits until node's publishes settled (stored + already there + errors) reach want. */
static void publish_wait(int node, uint64_t want)
{
	uint64_t until = harness_now_ms() + 10000, got = 0;

	while (harness_now_ms() < until) {
		char *j = harness_stats(cl[node]);

		got = harness_stat_u64(j, "remote.published") +
		      harness_stat_u64(j, "remote.publish_existed");
		free(j);
		if (got >= want)
			return;
		usleep(10000);
	}
	CHECK_GE(got, want);
}

/* GET of keys[i] on node: 1 byte-exact hit, 0 miss; any wrong byte fails the test. */
static int get_page(int node, const kvb_key *k, uint64_t seed, uint8_t *buf)
{
	int rc = kvb_get(cl[node], nsid[node], *k, buf, page_bytes);

	if (rc == -ENOENT)
		return 0;
	CHECK_RC(rc, (long long)page_bytes);
	CHECK(harness_verify(buf, page_bytes, k, seed, "remote page") == 0);
	return 1;
}

/* ---- the cases ---- */

static void case_put_a_get_b(void)
{
	enum { N = 24 };
	kvb_key keys[N];
	uint8_t tiers[N], *buf = malloc(page_bytes);
	size_t hits = 0;

	harness_log("a page PUT on node A, found and fetched by node B");
	harness_key_chain(keys, N, 16, 101);
	put_pages(0, keys, N, 101);
	publish_wait(0, N);
	CHECK_EQ(stat_of(0, "remote.published"), N);
	CHECK_OK(kvb_lookup_tiers(cl[1], nsid[1], keys, N, &hits, tiers));
	CHECK_EQ(hits, N);
	for (int i = 0; i < N; i++)
		CHECK_EQ(tiers[i], KVB_TIER_REMOTE);
	for (int i = 0; i < N; i++)
		CHECK_EQ(get_page(1, &keys[i], 101, buf), 1);
	CHECK_EQ(stat_of(1, "remote.fetched"), N);
	CHECK_OK(kvb_lookup_tiers(cl[1], nsid[1], keys, N, &hits, tiers));
	CHECK_EQ(hits, N);
	for (int i = 0; i < N; i++)
		CHECK_EQ(tiers[i], KVB_TIER_RAM);
	/* Fetched pages are never published back. */
	CHECK_EQ(stat_of(1, "remote.published") + stat_of(1, "remote.publish_existed"), 0);
	CHECK_EQ(dbsize_all(), N);
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
	o.socket_path = bk[1 + idx]->sock;
	CHECK_OK(kvb_connect(&o, &c));
	layout(&l);
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
	long long before = dbsize_all();
	pid_t pids[2];

	harness_log("two brokers publish the same 16 pages at once");
	race = harness_shared(sizeof(*race));
	harness_key_chain(race->keys, 16, 16, 202);
	harness_gate_init(&race->go);
	for (int i = 0; i < 2; i++)
		pids[i] = harness_fork(racer, i, NULL);
	harness_gate_open(&race->go, 2);
	CHECK_EQ(harness_wait(pids, 2, 20000, NULL), 0);
	publish_wait(1, 16);
	publish_wait(2, 16);
	CHECK_EQ(stat_of(1, "remote.published") + stat_of(2, "remote.published"), 16);
	CHECK_EQ(stat_of(1, "remote.publish_existed") + stat_of(2, "remote.publish_existed"), 16);
	CHECK_EQ(dbsize_all(), before + 16);
}

static void case_damaged(void)
{
	kvb_key k;
	char name[256];
	uint8_t *buf = malloc(page_bytes);
	uint64_t corrupt = stat_of(2, "remote.corrupt");
	int owner;
	redisReply *r;

	harness_log("a value damaged in the cluster is never served");
	uint64_t pub = settled(0);

	harness_key_chain(&k, 1, 16, 303);
	put_pages(0, &k, 1, 303);
	publish_wait(0, pub + 1);
	owner = key_owner(&k, name, sizeof(name));
	CHECK_GE(owner, 0);
	/* One byte of the page (past the 24-byte header) changed behind every broker's back. */
	r = rcmd(owner, "SETRANGE %s %d %b", name, 24 + 4096, "\x5a", (size_t)1);
	CHECK(r && r->type == REDIS_REPLY_INTEGER);
	freeReplyObject(r);
	CHECK_EQ(get_page(2, &k, 303, buf), 0);
	CHECK_EQ(stat_of(2, "remote.corrupt"), corrupt + 1);
	/* And a header cut short. */
	r = rcmd(owner, "SET %s %b", name, "KVBR", (size_t)4);
	CHECK(r && r->type == REDIS_REPLY_STATUS);
	freeReplyObject(r);
	CHECK_EQ(get_page(2, &k, 303, buf), 0);
	CHECK_EQ(stat_of(2, "remote.corrupt"), corrupt + 2);
	free(buf);
}

static void case_eviction(void)
{
	enum { N = 48 };
	kvb_key *keys = malloc(N * sizeof(*keys));
	uint8_t *buf = malloc(page_bytes);
	int hits = 0;

	harness_log("eviction under the shards' memory limit: misses, never wrong bytes");
	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rcmd(i, "CONFIG SET maxmemory 12mb");

		CHECK(r && r->type == REDIS_REPLY_STATUS);
		freeReplyObject(r);
	}
	uint64_t pub = settled(0);

	harness_key_chain(keys, N, 16, 404);
	put_pages(0, keys, N, 404);
	publish_wait(0, pub + N);
	for (int i = 0; i < N; i++)
		hits += get_page(1, &keys[i], 404, buf);
	harness_log("%d of %d pages still in the cluster", hits, N);
	CHECK_GT(hits, 0);
	CHECK_LT(hits, N);
	for (int i = 0; i < NNODES; i++) {
		redisReply *r = rcmd(i, "CONFIG SET maxmemory 64mb");

		CHECK(r && r->type == REDIS_REPLY_STATUS);
		freeReplyObject(r);
	}
	free(keys);
	free(buf);
}

/* Median microseconds of a GET of pages node B holds in RAM. */
static double local_get_us(const kvb_key *keys, int n, uint8_t *buf)
{
	double t[64];

	for (int i = 0; i < 64; i++) {
		uint64_t t0 = harness_now_ns();

		CHECK_EQ(get_page(1, &keys[i % n], 101, buf), 1);
		t[i] = (double)(harness_now_ns() - t0) / 1e3;
	}
	for (int i = 1; i < 64; i++)
		for (int j = i; j > 0 && t[j - 1] > t[j]; j--) {
			double x = t[j];

			t[j] = t[j - 1];
			t[j - 1] = x;
		}
	return t[32];
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
	uint8_t *buf = malloc(page_bytes);
	double before, during;
	uint64_t t0, worst = 0;

	harness_log("shard %d %s", down, stop ? "partitioned (SIGSTOP)" : "killed");
	harness_key_chain(local, 24, 16, 101);
	uint64_t pub = settled(0);

	harness_key_chain(keys, N, 16, seed);
	put_pages(0, keys, N, seed);
	publish_wait(0, pub + N);
	for (int i = 0; i < N; i++) {
		owner[i] = key_owner(&keys[i], NULL, 0);
		CHECK_GE(owner[i], 0);
		on_down += owner[i] == down;
	}
	CHECK_GT(on_down, 0);
	before = local_get_us(local, 24, buf);
	kill(nodes[down].pid, stop ? SIGSTOP : SIGKILL);
	if (!stop) {
		waitpid(nodes[down].pid, NULL, 0);
		nodes[down].pid = 0;
	}
	during = local_get_us(local, 24, buf);
	harness_log("local GET median %.0f us before, %.0f us with the shard down", before, during);
	CHECK_LT(during, before * 3 + 500);
	for (int i = 0; i < N; i++) {
		int h;

		t0 = harness_now_ms();
		h = get_page(2, &keys[i], seed, buf);
		if (harness_now_ms() - t0 > worst)
			worst = harness_now_ms() - t0;
		CHECKF(h == (owner[i] != down), "key %d on shard %d: %s", i, owner[i],
		       h ? "hit" : "miss");
		hits += h;
	}
	harness_log("%d hits, %d misses on the lost shard, slowest GET %llu ms", hits, on_down,
		    (unsigned long long)worst);
	CHECK_LE(worst, (uint64_t)remote_tmo + 300);
	CHECK_LT(stat_of(2, "remote.shards_reachable"), NNODES);
	/* Back: the shard rejoins; its pages are lost (killed) or still there (stopped). */
	if (stop)
		kill(nodes[down].pid, SIGCONT);
	else
		redis_start(down);
	cluster_wait_ok(15000);
	for (int i = 0; i < NNODES; i++)
		reachable_wait(i, 15000);
	if (stop) {
		for (int i = 0; i < N; i++)
			if (owner[i] == down)
				CHECK_EQ(get_page(2, &keys[i], seed, buf), 1);
	} else {
		kvb_key fresh[8];

		pub = settled(0);
		harness_key_chain(fresh, 8, 16, seed + 1);
		put_pages(0, fresh, 8, seed + 1);
		publish_wait(0, pub + 8);
		for (int i = 0; i < 8; i++)
			CHECK_EQ(get_page(2, &fresh[i], seed + 1, buf), 1);
	}
	harness_log("recovered: %llu back-offs, %llu recoveries on node C",
		    (unsigned long long)stat_of(2, "remote.backoffs"),
		    (unsigned long long)stat_of(2, "remote.recoveries"));
	CHECK_GE(stat_of(2, "remote.recoveries"), 1);
	free(buf);
}

int main(int argc, char **argv)
{
	const char *tmp = getenv("TMPDIR");

	harness_init(argc, argv);
	if (getenv("KVB_SCALE") && !strcmp(getenv("KVB_SCALE"), "small"))
		remote_tmo = 1000;
	if (system("redis-server --version >/dev/null 2>&1"))
		harness_skip("redis-server is not installed (tools/deps.sh installs it)");
	snprintf(dir, sizeof(dir), "%s/kvb-remote-XXXXXX", tmp ? tmp : "/tmp");
	CHECK(mkdtemp(dir));
	atexit(redis_kill_all);
	for (int i = 0; i < NNODES; i++) {
		nodes[i].port = free_port();
		do
			nodes[i].bus = free_port();
		while (nodes[i].bus == nodes[i].port);
	}
	for (int i = 0; i < NNODES; i++)
		redis_start(i);
	cluster_create();
	harness_log("cluster up on ports %u %u %u", nodes[0].port, nodes[1].port, nodes[2].port);
	brokers_start();
	case_put_a_get_b();
	case_publish_race();
	case_damaged();
	case_eviction();
	case_fault(2, 0, 505);
	case_fault(1, 1, 606);
	for (int i = 0; i < NNODES; i++) {
		kvb_close(cl[i]);
		harness_broker_stop(bk[i]);
	}
	redis_kill_all();
	{
		char cmd[300];

		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
		if (system(cmd))
			harness_log("could not remove %s", dir);
	}
	return H_PASS;
}
