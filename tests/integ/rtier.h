/* SPDX-License-Identifier: MIT */
/*
 * rtier.h - the remote-tier tests' cluster (t_remote on loopback, t_remote_netns in network
 * namespaces): RT_NODES nodes, each one redis-server in cluster mode (a master, no replicas,
 * cluster-require-full-coverage no, allkeys-lru) plus one kvbrokerd with --remote seeded with
 * its own node, and one client per broker with the test layout's namespace open.
 *
 * A node with a network namespace (netns >= 0) runs its redis-server and its broker there; the
 * test process itself stays in its own, and reaches them through unix sockets (the brokers)
 * and TCP connections opened from inside the node's namespace (the shards: rt_cmd).
 */
#ifndef KVB_TESTS_RTIER_H
#define KVB_TESTS_RTIER_H

#include <hiredis/hiredis.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "harness.h"

#define RT_NODES 3

struct rt_node {
	char addr[16]; /* what its redis-server binds and announces */
	uint16_t port, bus;
	pid_t pid; /* its redis-server; 0: not running */
	int netns; /* fd of its network namespace, -1: the test's own */
	redisContext *rc;
	struct harness_broker *bk;
	kvb_client *cl;
	uint32_t ns;
	uint8_t *reg; /* rt_get_page_reg's buffer, registered with bk */
};

struct rt {
	struct rt_node n[RT_NODES];
	char dir[256];
	size_t page_bytes;
	/*
	 * The brokers' --remote-timeout (ms): 500 (a loaded 2-vCPU machine saw 1 MiB fetches from
	 * live shards pass 200 ms), or 1000 under the sanitizers (KVB_SCALE=small), whose loops
	 * run 5-20x slower: a 1 MiB publish there outlived the 1 s stall bound of a 200 ms timeout.
	 */
	int tmo;
};

extern struct rt rt;

/* Skips without redis-server; a scratch directory; everything stopped at exit. */
void rt_init(void);
/* Runs the calling thread in node i's namespace (or leaves it as it is), and back. */
void rt_enter(int i);
void rt_leave(void);
/* A loopback port nothing listens on now, distinct from those taken before. */
uint16_t rt_free_port(void);
/* Starts node i's redis-server and waits until it answers. */
void rt_redis_start(int i);
/* SIGKILLs every redis-server still running (SIGCONT first: a stopped one too). */
void rt_redis_kill_all(void);
/* A command on node i's shard; the reply, or NULL (reconnected for the next one). */
redisReply *rt_cmd(int i, const char *fmt, ...);
/* Three masters, a third of the slots each, met by hand (no redis-cli --cluster needed). */
void rt_cluster_create(void);
/* rt_init, free ports for every node, its redis-server started, the cluster created. */
void rt_cluster_start(void);
void rt_cluster_wait_ok(int timeout_ms);
/* The node holding the value of key k and its name there, or -1. */
int rt_key_owner(const kvb_key *k, char *name, size_t len);
long long rt_dbsize(void);
/* The test layout: MLA, 16 tokens x 16 layers x 4 KiB, 1 MiB pages. */
void rt_layout(struct kvb_layout *l);
/* Starts the brokers (extra: more kvbrokerd arguments, NULL-terminated or NULL). */
void rt_brokers_start(const char *const *extra);
void rt_reachable_wait(int node, int timeout_ms);
void rt_put_pages(int node, const kvb_key *keys, int n, uint64_t seed);
uint64_t rt_stat(int node, const char *path);
/* Publishes of node answered so far (stored, or there already), and a wait for want of them. */
uint64_t rt_settled(int node);
void rt_publish_wait(int node, uint64_t want);
/* GET of k on node: 1 byte-exact hit, 0 miss; any wrong byte fails the test. */
int rt_get_page(int node, const kvb_key *k, uint64_t seed, uint8_t *buf);
/*
 * The same into a buffer registered with node's broker (allocated at the first call): the
 * broker writes it, and a remote fetch lands there as it arrives (remote.c, fetched_direct),
 * where rt_get_page's plain buffer goes through a lease.
 */
int rt_get_page_reg(int node, const kvb_key *k, uint64_t seed);
/* Median microseconds of a GET of pages node holds in RAM (keys[0..n), filled with seed). */
double rt_local_get_us(int node, const kvb_key *keys, int n, uint64_t seed, uint8_t *buf);
/* Clients closed, brokers stopped (each must exit 0), shards killed, the directory removed. */
void rt_finish(void);

#endif /* KVB_TESTS_RTIER_H */
