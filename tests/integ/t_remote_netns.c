// SPDX-License-Identifier: MIT
/*
 * t_remote_netns.c - a real network partition of one node of the remote tier. Each of three
 * nodes is a network namespace holding one redis-server (a cluster master) and one kvbrokerd
 * with --remote; the nodes are joined by veth pairs to a bridge in a fourth namespace (the
 * switch), so nothing here touches the machine's own interfaces. Node C's link is cut (its
 * switch port set down: packets vanish, TCP connections stay up with nothing coming back),
 * and then restored:
 *
 *   - local hits on every node are unaffected (median GET latency within a bound), C's too;
 *   - fetches of pages on C's shard from node B time out by --remote-timeout (the first ones:
 *     the connection looks up) and are misses, then are refused at once while the shard is
 *     backed off; pages on the other shards still hit; C's own fetches from the far shards
 *     time out and miss too;
 *   - B logs the back-off of C's shard once, however many retries fail;
 *   - once the link is back the cluster heals, every broker reaches every shard again, and
 *     the pages on C's shard (never lost: only the network was cut) hit again;
 *   - every page served, at any time, is byte-exact.
 *
 * Needs root (CAP_NET_ADMIN and CAP_SYS_ADMIN: `ip netns add`, veth, bridge; `ip` is from
 * iproute2, tools/deps.sh) and redis-server. Where namespaces cannot be made the test FAILS,
 * saying so, unless KVB_TEST_NO_NETNS=1 is set, which makes it skip (77): an explicit opt-out
 * for a machine known to lack them, never a silent one.
 */
#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rtier.h"

#define N 24 /* pages A publishes */
#define L 16 /* pages C holds locally */
#define NS_PREFIX "kvbrt"

static char sw[32], node_ns[RT_NODES][32];
static int made_sw, made[RT_NODES];

/* Runs a shell command line; its exit status (0: it worked). */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
	char cmd[512];
	va_list ap;
	int st;

	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	st = system(cmd);
	if (st)
		harness_log("`%s` failed (status %d)", cmd, st);
	return st;
}

static void netns_cleanup(void)
{
	for (int i = 0; i < RT_NODES; i++)
		if (made[i] && !sh("ip netns del %s", node_ns[i]))
			made[i] = 0;
	if (made_sw && !sh("ip netns del %s", sw))
		made_sw = 0;
}

/* Namespaces of earlier runs that died before cleaning up (their pid is gone). */
static void netns_reap_stale(void)
{
	DIR *d = opendir("/run/netns");
	struct dirent *e;

	if (!d)
		return;
	while ((e = readdir(d))) {
		char *end;
		long pid;

		if (strncmp(e->d_name, NS_PREFIX, strlen(NS_PREFIX)))
			continue;
		pid = strtol(e->d_name + strlen(NS_PREFIX), &end, 10);
		if (pid > 0 && end != e->d_name + strlen(NS_PREFIX) && kill((pid_t)pid, 0) &&
		    pid != getpid())
			sh("ip netns del %s", e->d_name);
	}
	closedir(d);
}

/* The switch and the three nodes; 0, or the step that failed. */
static const char *netns_setup(void)
{
	pid_t me = getpid();

	if (system("ip -V >/dev/null 2>&1"))
		return "ip (iproute2) is not installed: tools/deps.sh installs it";
	netns_reap_stale();
	snprintf(sw, sizeof(sw), NS_PREFIX "%ds", (int)me);
	if (sh("ip netns add %s", sw))
		return "ip netns add";
	made_sw = 1;
	if (sh("ip -n %s link add br0 type bridge && ip -n %s link set br0 up", sw, sw))
		return "a bridge in the switch namespace";
	for (int i = 0; i < RT_NODES; i++) {
		struct rt_node *n = &rt.n[i];
		char path[128]; /* gcc bounds node_ns[i] by the whole array */

		snprintf(node_ns[i], sizeof(node_ns[i]), NS_PREFIX "%dn%d", (int)me, i);
		if (sh("ip netns add %s", node_ns[i]))
			return "ip netns add";
		made[i] = 1;
		/* Addresses of this run's own namespaces: no route leads anywhere else. */
		snprintf(n->addr, sizeof(n->addr), "10.218.0.%d", i + 1);
		if (sh("ip -n %s link add p%d type veth peer name e0 netns %s && "
		       "ip -n %s link set p%d master br0 up && "
		       "ip -n %s addr add %s/24 dev e0 && ip -n %s link set e0 up && "
		       "ip -n %s link set lo up",
		       sw, i, node_ns[i], sw, i, node_ns[i], n->addr, node_ns[i], node_ns[i]))
			return "a veth pair to the switch";
		snprintf(path, sizeof(path), "/run/netns/%s", node_ns[i]);
		n->netns = open(path, O_RDONLY | O_CLOEXEC);
		if (n->netns < 0)
			return "opening /run/netns";
		n->port = 6379;
		n->bus = 16379;
	}
	return NULL;
}

/* Lines of node's broker log that contain both a and b. */
static int log_count(int node, const char *a, const char *b)
{
	FILE *f = fopen(rt.n[node].bk->log, "r");
	char line[1024];
	int k = 0;

	if (!f)
		return -1;
	while (fgets(line, sizeof(line), f))
		k += strstr(line, a) && strstr(line, b);
	fclose(f);
	return k;
}

static void cut(int node, int down)
{
	CHECK_EQ(sh("ip -n %s link set p%d %s", sw, node, down ? "down" : "up"), 0);
}

int main(int argc, char **argv)
{
	kvb_key keys[N], local[L];
	int owner[N], on_c = 0, hits = 0;
	uint8_t *buf;
	const char *why;
	char c_addr[40];
	double a_before, a_during, c_before, c_during;
	uint64_t slowest = 0, t_first = 0, timeouts;

	harness_init(argc, argv);
	rt_init();
	atexit(netns_cleanup);
	why = netns_setup();
	if (why && getenv("KVB_TEST_NO_NETNS") && !strcmp(getenv("KVB_TEST_NO_NETNS"), "1"))
		harness_skip("network namespaces unavailable (%s); KVB_TEST_NO_NETNS=1", why);
	CHECKF(!why,
	       "network namespaces unavailable: %s (root with CAP_NET_ADMIN is needed; set "
	       "KVB_TEST_NO_NETNS=1 to skip this test where they cannot work)",
	       why);
	for (int i = 0; i < RT_NODES; i++)
		rt_redis_start(i);
	rt_cluster_create();
	harness_log("cluster up in namespaces %s..%s", node_ns[0], node_ns[RT_NODES - 1]);
	rt_brokers_start(NULL);
	buf = malloc(rt.page_bytes);
	CHECK(buf);

	/* A publishes N pages; C holds L of its own; which shard holds each of A's. */
	harness_key_chain(keys, N, 16, 701);
	harness_key_chain(local, L, 16, 702);
	rt_put_pages(0, keys, N, 701);
	rt_put_pages(2, local, L, 702);
	rt_publish_wait(0, N);
	rt_publish_wait(2, L);
	for (int i = 0; i < N; i++) {
		owner[i] = rt_key_owner(&keys[i], NULL, 0);
		CHECK_GE(owner[i], 0);
		on_c += owner[i] == 2;
	}
	CHECK_GT(on_c, 0);
	CHECK_LT(on_c, N);
	a_before = rt_local_get_us(0, keys, N, 701, buf);
	c_before = rt_local_get_us(2, local, L, 702, buf);

	harness_log("cutting node C's link (%d of %d pages on its shard)", on_c, N);
	cut(2, 1);
	timeouts = rt_stat(1, "remote.timeouts");
	for (int i = 0; i < N; i++) {
		uint64_t t0 = harness_now_ms(), dt;
		int h = rt_get_page(1, &keys[i], 701, buf);

		dt = harness_now_ms() - t0;
		CHECKF(h == (owner[i] != 2), "B, key %d on shard %d: %s", i, owner[i],
		       h ? "hit" : "miss");
		if (owner[i] == 2 && !t_first)
			t_first = dt;
		if (dt > slowest)
			slowest = dt;
		hits += h;
	}
	harness_log("B: %d hits, %d misses; the first fetch from C's shard took %llu ms, the "
		    "slowest GET %llu ms (--remote-timeout %d ms)",
		    hits, on_c, (unsigned long long)t_first, (unsigned long long)slowest, rt.tmo);
	/* The first waited for its deadline (nothing came back), none much past it. */
	CHECK_GE(t_first + 50, (uint64_t)rt.tmo);
	CHECK_LE(slowest, (uint64_t)rt.tmo + 300);
	CHECK_GT(rt_stat(1, "remote.timeouts"), timeouts);
	/* C's own view: the far shards are gone; its local hits are not. */
	for (int i = 0; i < N; i++) {
		uint64_t t0 = harness_now_ms();

		hits = rt_get_page(2, &keys[i], 701, buf);
		CHECK_LE(harness_now_ms() - t0, (uint64_t)rt.tmo + 300);
		CHECKF(!hits || owner[i] == 2, "C, key %d on shard %d: a hit across the cut", i,
		       owner[i]);
	}
	a_during = rt_local_get_us(0, keys, N, 701, buf);
	c_during = rt_local_get_us(2, local, L, 702, buf);
	harness_log("local GET median: A %.0f -> %.0f us, C %.0f -> %.0f us (link cut)", a_before,
		    a_during, c_before, c_during);
	CHECK_LT(a_during, a_before * 3 + 500);
	CHECK_LT(c_during, c_before * 3 + 500);
	/* Backed off, and retried (connects that time out) more than once: logged once. */
	CHECK_LT(harness_stat_wait(rt.n[1].cl, "remote.shards_reachable", RT_NODES - 1, 5000),
		 RT_NODES);
	CHECK_GE(harness_stat_wait(rt.n[1].cl, "remote.backoffs", 3, 10000), 3);
	snprintf(c_addr, sizeof(c_addr), "%s:%u", rt.n[2].addr, rt.n[2].port);
	CHECK_EQ(log_count(1, c_addr, "unreachable"), 1);
	for (int i = 0; i < N; i++)
		if (owner[i] == 2)
			CHECK_EQ(rt_get_page(1, &keys[i], 701, buf), 0);

	harness_log("restoring the link (%llu back-offs on B)",
		    (unsigned long long)rt_stat(1, "remote.backoffs"));
	cut(2, 0);
	rt_cluster_wait_ok(20000);
	for (int i = 0; i < RT_NODES; i++)
		rt_reachable_wait(i, 20000);
	for (int i = 0; i < N; i++)
		if (owner[i] == 2)
			CHECK_EQ(rt_get_page(1, &keys[i], 701, buf), 1);
	CHECK_GE(rt_stat(1, "remote.recoveries"), 1);
	CHECK_EQ(log_count(1, c_addr, "is back"), 1);
	CHECK_EQ(log_count(1, c_addr, "unreachable"), 1);
	harness_log("recovered: B fetched C's pages again, %llu recoveries",
		    (unsigned long long)rt_stat(1, "remote.recoveries"));
	free(buf);
	rt_finish();
	return H_PASS;
}
