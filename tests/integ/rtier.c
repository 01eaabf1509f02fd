// SPDX-License-Identifier: MIT
/*
 * rtier.c - the remote-tier tests' cluster and brokers (rtier.h): redis-server processes in
 * cluster mode started, met and stopped by the test, one kvbrokerd per node, and the page
 * helpers t_remote and t_remote_netns share. Namespaces are entered with setns(2) around a
 * fork or a connect: a child and a socket keep the namespace they were made in.
 */
#include "rtier.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

struct rt rt;
static int own_ns = -1, entered;

static void rt_atexit(void)
{
	char cmd[300];

	rt_redis_kill_all();
	if (!rt.dir[0])
		return;
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", rt.dir);
	if (system(cmd))
		harness_log("could not remove %s", rt.dir);
	rt.dir[0] = 0;
}

void rt_init(void)
{
	const char *tmp = getenv("TMPDIR");

	rt.tmo = getenv("KVB_SCALE") && !strcmp(getenv("KVB_SCALE"), "small") ? 1000 : 500;
	for (int i = 0; i < RT_NODES; i++) {
		rt.n[i].netns = -1;
		snprintf(rt.n[i].addr, sizeof(rt.n[i].addr), "127.0.0.1");
	}
	if (system("redis-server --version >/dev/null 2>&1"))
		harness_skip("redis-server is not installed (tools/deps.sh installs it)");
	own_ns = open("/proc/self/ns/net", O_RDONLY | O_CLOEXEC);
	CHECK(own_ns >= 0);
	snprintf(rt.dir, sizeof(rt.dir), "%s/kvb-remote-XXXXXX", tmp ? tmp : "/tmp");
	CHECK(mkdtemp(rt.dir));
	atexit(rt_atexit);
}

void rt_enter(int i)
{
	if (rt.n[i].netns < 0)
		return;
	CHECKF(!setns(rt.n[i].netns, CLONE_NEWNET), "setns into node %d: %s", i, strerror(errno));
	entered = 1;
}

void rt_leave(void)
{
	if (!entered)
		return;
	CHECKF(!setns(own_ns, CLONE_NEWNET), "setns back: %s", strerror(errno));
	entered = 0;
}

uint16_t rt_free_port(void)
{
	static uint16_t taken[4 * RT_NODES];
	static int ntaken;
	uint16_t port;
	int again;

	do {
		struct sockaddr_in a = {.sin_family = AF_INET,
					.sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
		socklen_t len = sizeof(a);
		int fd = socket(AF_INET, SOCK_STREAM, 0);

		CHECK(fd >= 0);
		CHECK(!bind(fd, (struct sockaddr *)&a, sizeof(a)));
		CHECK(!getsockname(fd, (struct sockaddr *)&a, &len));
		close(fd);
		port = ntohs(a.sin_port);
		again = 0;
		for (int i = 0; i < ntaken; i++)
			again |= taken[i] == port;
	} while (again);
	if (ntaken < (int)(sizeof(taken) / sizeof(taken[0])))
		taken[ntaken++] = port;
	return port;
}

static redisContext *rconnect(int i)
{
	struct timeval tv = {1, 0};
	redisContext *c;

	rt_enter(i);
	c = redisConnectWithTimeout(rt.n[i].addr, rt.n[i].port, tv);
	rt_leave();
	if (c && !c->err) {
		redisSetTimeout(c, tv);
		return c;
	}
	if (c)
		redisFree(c);
	return NULL;
}

redisReply *rt_cmd(int i, const char *fmt, ...)
{
	struct rt_node *n = &rt.n[i];
	redisReply *r;
	va_list ap;

	if (!n->rc)
		n->rc = rconnect(i);
	if (!n->rc)
		return NULL;
	va_start(ap, fmt);
	r = redisvCommand(n->rc, fmt, ap);
	va_end(ap);
	if (!r) {
		redisFree(n->rc);
		n->rc = NULL;
	}
	return r;
}

void rt_redis_kill_all(void)
{
	for (int i = 0; i < RT_NODES; i++) {
		if (rt.n[i].pid > 0) {
			kill(rt.n[i].pid, SIGCONT);
			kill(rt.n[i].pid, SIGKILL);
			waitpid(rt.n[i].pid, NULL, 0);
			rt.n[i].pid = 0;
		}
	}
}

void rt_redis_start(int i)
{
	struct rt_node *n = &rt.n[i];
	char port[8], bus[8], conf[300], log[300];
	pid_t pid;

	snprintf(port, sizeof(port), "%u", n->port);
	snprintf(bus, sizeof(bus), "%u", n->bus);
	snprintf(conf, sizeof(conf), "%s/nodes-%d.conf", rt.dir, i);
	snprintf(log, sizeof(log), "%s/redis-%d.log", rt.dir, i);
	rt_enter(i);
	pid = fork();
	if (!pid) {
		prctl(PR_SET_PDEATHSIG, SIGKILL);
		execlp("redis-server", "redis-server", "--port", port, "--bind", n->addr,
		       "--cluster-enabled", "yes", "--cluster-port", bus, "--cluster-config-file",
		       conf, "--cluster-require-full-coverage", "no", "--cluster-node-timeout",
		       "2000", "--maxmemory", "64mb", "--maxmemory-policy", "allkeys-lru", "--save",
		       "", "--appendonly", "no", "--dir", rt.dir, "--logfile", log,
		       "--protected-mode", "no", (char *)NULL);
		_exit(127);
	}
	rt_leave();
	CHECK(pid > 0);
	n->pid = pid;
	for (int t = 0; t < 500; t++) {
		redisReply *r = rt_cmd(i, "PING");

		if (r) {
			freeReplyObject(r);
			return;
		}
		usleep(10000);
	}
	harness_fail(__FILE__, __LINE__, "redis-server on %s:%u did not start", n->addr, n->port);
}

/* Node i says cluster_state:ok. */
static int cluster_ok(int i)
{
	redisReply *r = rt_cmd(i, "CLUSTER INFO");
	int ok = r && r->type == REDIS_REPLY_STRING && strstr(r->str, "cluster_state:ok");

	if (r)
		freeReplyObject(r);
	return ok;
}

void rt_cluster_wait_ok(int timeout_ms)
{
	uint64_t until = harness_now_ms() + (uint64_t)timeout_ms;
	int ok = 0;

	while (!ok && harness_now_ms() < until) {
		ok = 1;
		for (int i = 0; i < RT_NODES; i++)
			ok &= cluster_ok(i);
		if (!ok)
			usleep(50000);
	}
	CHECKF(ok, "the cluster did not reach cluster_state:ok in %d ms", timeout_ms);
}

void rt_cluster_start(void)
{
	rt_init();
	for (int i = 0; i < RT_NODES; i++) {
		rt.n[i].port = rt_free_port();
		rt.n[i].bus = rt_free_port();
	}
	for (int i = 0; i < RT_NODES; i++)
		rt_redis_start(i);
	rt_cluster_create();
}

void rt_cluster_create(void)
{
	for (int i = 0; i < RT_NODES; i++) {
		int first = i * 16384 / RT_NODES, last = (i + 1) * 16384 / RT_NODES - 1;
		redisReply *r = rt_cmd(i, "CLUSTER ADDSLOTSRANGE %d %d", first, last);

		CHECKF(r && r->type == REDIS_REPLY_STATUS, "ADDSLOTSRANGE on node %d: %s", i,
		       r && r->str ? r->str : "no reply");
		freeReplyObject(r);
		r = rt_cmd(i, "CLUSTER SET-CONFIG-EPOCH %d", i + 1);
		if (r)
			freeReplyObject(r);
	}
	for (int i = 1; i < RT_NODES; i++) {
		redisReply *r = rt_cmd(0, "CLUSTER MEET %s %u %u", rt.n[i].addr, rt.n[i].port,
				       rt.n[i].bus);

		CHECKF(r && r->type == REDIS_REPLY_STATUS, "CLUSTER MEET: %s",
		       r && r->str ? r->str : "no reply");
		freeReplyObject(r);
	}
	rt_cluster_wait_ok(10000);
}

int rt_key_owner(const kvb_key *k, char *name, size_t len)
{
	char hex[65];

	for (int i = 0; i < 32; i++)
		sprintf(hex + 2 * i, "%02x", k->b[i]);
	for (int i = 0; i < RT_NODES; i++) {
		redisReply *r = rt_cmd(i, "KEYS *:%s", hex);
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

long long rt_dbsize(void)
{
	long long n = 0;

	for (int i = 0; i < RT_NODES; i++) {
		redisReply *r = rt_cmd(i, "DBSIZE");

		CHECK(r && r->type == REDIS_REPLY_INTEGER);
		n += r->integer;
		freeReplyObject(r);
	}
	return n;
}

void rt_layout(struct kvb_layout *l)
{
	/* 16 tokens x 16 layers x 4 KiB: 1 MiB pages. */
	harness_layout(l, "test/remote", KVB_LAYOUT_MLA, 16, 1, 0, 16, 4096);
}

void rt_reachable_wait(int node, int timeout_ms)
{
	char *j;

	if (harness_stat_wait(rt.n[node].cl, "remote.shards_reachable", RT_NODES, timeout_ms) ==
	    RT_NODES)
		return;
	j = harness_stats(rt.n[node].cl);
	printf("node %c: %s\n", 'A' + node, strstr(j, "\"remote\"") ? strstr(j, "\"remote\"") : j);
	free(j);
	harness_fail(__FILE__, __LINE__, "node %c does not reach all %d shards", 'A' + node,
		     RT_NODES);
}

void rt_brokers_start(const char *const *extra)
{
	for (int i = 0; i < RT_NODES; i++) {
		const char *args[32];
		char url[128], name[16], tmo[16];
		struct kvb_layout l;
		int a = 0;

		snprintf(tmo, sizeof(tmo), "%d", rt.tmo);
		/* Each broker's seed is its own node; it learns the rest from CLUSTER SLOTS. */
		snprintf(url, sizeof(url), "redis://%s:%u", rt.n[i].addr, rt.n[i].port);
		args[a++] = "--pool";
		args[a++] = "160M";
		args[a++] = "--remote";
		args[a++] = url;
		args[a++] = "--remote-timeout";
		args[a++] = tmo;
		args[a++] = "--remote-prefix";
		args[a++] = "t:";
		args[a++] = "--log-level";
		args[a++] = getenv("T_REMOTE_DEBUG") ? "debug" : "info";
		for (int e = 0; extra && extra[e] && a < 31; e++)
			args[a++] = extra[e];
		args[a] = NULL;
		rt_enter(i);
		rt.n[i].bk = harness_broker_startv(args);
		rt_leave();
		snprintf(name, sizeof(name), "node%c", 'A' + i);
		rt.n[i].cl = harness_connect(rt.n[i].bk, name, 0);
		rt_layout(&l);
		CHECK_OK(kvb_ns_open(rt.n[i].cl, &l, &rt.n[i].ns, &rt.page_bytes));
	}
	for (int i = 0; i < RT_NODES; i++)
		rt_reachable_wait(i, 10000);
}

void rt_put_pages(int node, const kvb_key *keys, int n, uint64_t seed)
{
	uint8_t *buf = malloc(rt.page_bytes);

	CHECK(buf);
	for (int i = 0; i < n; i++) {
		harness_fill(buf, rt.page_bytes, &keys[i], seed);
		CHECK_RC(kvb_put(rt.n[node].cl, rt.n[node].ns, keys[i], buf, rt.page_bytes), 0);
	}
	free(buf);
}

uint64_t rt_stat(int node, const char *path)
{
	return harness_stat(rt.n[node].cl, path);
}

uint64_t rt_settled(int node)
{
	return rt_stat(node, "remote.published") + rt_stat(node, "remote.publish_existed");
}

void rt_publish_wait(int node, uint64_t want)
{
	uint64_t until = harness_now_ms() + 10000, got = 0;

	while (harness_now_ms() < until) {
		char *j = harness_stats(rt.n[node].cl);

		got = harness_stat_u64(j, "remote.published") +
		      harness_stat_u64(j, "remote.publish_existed");
		free(j);
		if (got >= want)
			return;
		usleep(10000);
	}
	CHECK_GE(got, want);
}

int rt_get_page(int node, const kvb_key *k, uint64_t seed, uint8_t *buf)
{
	int rc = kvb_get(rt.n[node].cl, rt.n[node].ns, *k, buf, rt.page_bytes);

	if (rc == -ENOENT)
		return 0;
	CHECK_RC(rc, (long long)rt.page_bytes);
	CHECK(harness_verify(buf, rt.page_bytes, k, seed, "remote page") == 0);
	return 1;
}

int rt_get_page_reg(int node, const kvb_key *k, uint64_t seed)
{
	struct rt_node *n = &rt.n[node];
	uint32_t id;
	int rc;

	if (!n->reg) {
		n->reg = kvb_buf_alloc_host(n->cl, rt.page_bytes, &id);
		CHECK(n->reg);
	}
	/* Poisoned first: a hit must have written every byte. */
	memset(n->reg, 0xee, rt.page_bytes);
	rc = kvb_get(n->cl, n->ns, *k, n->reg, rt.page_bytes);
	if (rc == -ENOENT)
		return 0;
	CHECK_RC(rc, (long long)rt.page_bytes);
	CHECK(harness_verify(n->reg, rt.page_bytes, k, seed, "remote page (registered)") == 0);
	return 1;
}

double rt_local_get_us(int node, const kvb_key *keys, int n, uint64_t seed, uint8_t *buf)
{
	double t[64];

	for (int i = 0; i < 64; i++) {
		uint64_t t0 = harness_now_ns();

		CHECK_EQ(rt_get_page(node, &keys[i % n], seed, buf), 1);
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

void rt_finish(void)
{
	for (int i = 0; i < RT_NODES; i++) {
		kvb_close(rt.n[i].cl); /* frees rt_get_page_reg's buffer too */
		rt.n[i].cl = NULL;
		rt.n[i].reg = NULL;
		harness_broker_stop(rt.n[i].bk);
	}
	rt_atexit();
}
