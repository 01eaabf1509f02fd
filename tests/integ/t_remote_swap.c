// SPDX-License-Identifier: MIT
/*
 * t_remote_swap.c - values moved between names behind the brokers' back are never served. A
 * value in the cluster is bound to its page key and namespace by its own header (remote_value.c),
 * not only by the name it is stored under: anyone who can reach the cluster can copy a value
 * onto another name, and a crc of the page alone finds nothing wrong with it.
 *
 * Node A PUTs N pages of namespace 1 and one of namespace 2 (all published). Then, directly in
 * the cluster, as an operator with redis-cli could:
 *   - SWAP_PAIRS pairs of keys swap values (GET a, GET b, SET a <b's>, SET b <a's>);
 *   - one key's value is copied onto another key (the source stays as it was);
 *   - the namespace 2 page gets the value of the same content key in namespace 1 (same key,
 *     same page size, another namespace);
 *   - one key gets an old-format value: its own page behind a version 1 header with valid
 *     crcs, as a broker of the previous release published it (a rolling upgrade).
 * Node B, which never held these pages, GETs every key (every other one into a registered
 * buffer: the value lands in the GET's destination as it arrives), then broker D, which reads
 * every value through hiredis and copies it (KVB_TEST_REMOTE_COPY), does the same. On both:
 * every untouched key a byte-exact hit, every tampered key a miss, 0 wrong bytes served, and
 * the counters say why (remote.wrong_key, remote.other_version; remote.corrupt stays 0).
 *
 * The cluster and broker helpers are rtier.c. Skips (77) without redis-server.
 */
#include <errno.h>
#include <isa-l/crc.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rtier.h"

#define N 24	     /* pages of namespace 1 */
#define SWAP_PAIRS 6 /* keys 0..11 swapped in pairs */
#define COPY_FROM 12 /* its value copied onto COPY_TO; itself untouched */
#define COPY_TO 13
#define OLD_KEY 14 /* an old-format value of its own page */
#define NS2_KEY 23 /* also a page of namespace 2, overwritten with namespace 1's value */
#define SEED 1111
#define SEED2 2222
#define TAMPERED (2 * SWAP_PAIRS + 3)
#define WRONG_KEY (2 * SWAP_PAIRS + 2) /* swapped, copied, from the other namespace */

/* The value header brokers before format version 2 wrote (24 bytes, not bound to a key). */
struct v1_hdr {
	uint32_t magic;	  /* "KVBR" */
	uint16_t version; /* 1 */
	uint16_t hdr_len; /* 24 */
	uint64_t len;	  /* page bytes */
	uint32_t crc;	  /* crc32c of the page */
	uint32_t hcrc;	  /* crc32c of the 20 bytes above */
};

static uint32_t crc32c(const void *p, size_t len)
{
	return ~crc32_iscsi((unsigned char *)(uintptr_t)p, (int)len, ~0u);
}

static void hex(char *out, const kvb_key *k)
{
	for (int i = 0; i < 32; i++)
		sprintf(out + 2 * i, "%02x", k->b[i]);
}

/* The node holding a name for key k other than `not` (NULL: any), and the name; or -1. */
static int find_name(const kvb_key *k, const char * not, char *name, size_t len)
{
	char h[65];

	hex(h, k);
	for (int i = 0; i < RT_NODES; i++) {
		redisReply *r = rt_cmd(i, "KEYS *:%s", h);

		CHECK(r && r->type == REDIS_REPLY_ARRAY);
		for (size_t e = 0; e < r->elements; e++) {
			if (not &&!strcmp(r->element[e]->str, not ))
				continue;
			snprintf(name, len, "%s", r->element[e]->str);
			freeReplyObject(r);
			return i;
		}
		freeReplyObject(r);
	}
	return -1;
}

/* The value stored under name on node (malloc'd; *len its bytes). */
static char *get_value(int node, const char *name, size_t *len)
{
	redisReply *r = rt_cmd(node, "GET %s", name);
	char *v;

	CHECKF(r && r->type == REDIS_REPLY_STRING, "GET %s on node %d", name, node);
	v = malloc(r->len);
	CHECK(v);
	memcpy(v, r->str, r->len);
	*len = r->len;
	freeReplyObject(r);
	return v;
}

static void set_value(int node, const char *name, const void *v, size_t len)
{
	redisReply *r = rt_cmd(node, "SET %s %b", name, v, len);

	CHECKF(r && r->type == REDIS_REPLY_STATUS, "SET %s on node %d", name, node);
	freeReplyObject(r);
}

struct where {
	int node;
	char name[256];
};

static void swap_values(const struct where *a, const struct where *b)
{
	size_t la, lb;
	char *va = get_value(a->node, a->name, &la), *vb = get_value(b->node, b->name, &lb);

	set_value(a->node, a->name, vb, lb);
	set_value(b->node, b->name, va, la);
	free(va);
	free(vb);
}

/*
 * One GET into dst: 1 a byte-exact hit, 0 a miss, -1 a hit with wrong bytes (printed). dst is
 * poisoned first; *touched is set when a miss left anything else there.
 */
static int get_one(kvb_client *c, uint32_t ns, const kvb_key *k, uint64_t seed, uint8_t *dst,
		   const char *what, int *touched)
{
	int rc;

	memset(dst, 0xee, rt.page_bytes);
	rc = kvb_get(c, ns, *k, dst, rt.page_bytes);
	if (rc == -ENOENT) {
		for (size_t i = 0; i < rt.page_bytes; i++)
			*touched |= dst[i] != 0xee;
		return 0;
	}
	CHECK_RC(rc, (long long)rt.page_bytes);
	return harness_verify(dst, rt.page_bytes, k, seed, what) ? -1 : 1;
}

/*
 * Every key of both namespaces through c (ns1, ns2 open): the tampered ones must miss, the
 * others hit byte-exact. Any wrong page served fails the test, once all were asked. A
 * tampered value refused as its header landed wrote nothing into a registered destination:
 * the bytes of another key's page never reach a GET's buffer.
 */
static void get_all(const char *who, kvb_client *c, uint32_t ns1, uint32_t ns2, const kvb_key *keys,
		    uint8_t *plain, uint8_t *reg)
{
	int hits = 0, misses = 0, wrong = 0, unexpected = 0, touched = 0;

	for (int i = 0; i <= N; i++) {
		int tampered = i < 2 * SWAP_PAIRS || i == COPY_TO || i == OLD_KEY || i == N;
		const kvb_key *k = &keys[i < N ? i : NS2_KEY];
		uint8_t *dst = reg && i % 2 ? reg : plain;
		int h = get_one(c, i < N ? ns1 : ns2, k, i < N ? SEED : SEED2, dst, who, &touched);

		if (h < 0)
			harness_log("%s: key %d (%s) served another page's bytes", who, i,
				    tampered ? "tampered" : "untouched");
		wrong += h < 0;
		hits += h > 0;
		misses += !h;
		unexpected += tampered ? h != 0 : h != 1;
	}
	harness_log("%s: %d hits, %d misses, %d wrong pages served", who, hits, misses, wrong);
	CHECKF(!wrong, "%s: %d wrong pages served", who, wrong);
	CHECKF(!unexpected, "%s: %d keys neither a miss (tampered) nor a hit (untouched)", who,
	       unexpected);
	CHECKF(!touched, "%s: a refused value wrote into the GET's buffer", who);
	harness_log("%s: wrong_key %llu, other_version %llu, corrupt %llu, fetched %llu of %llu",
		    who, (unsigned long long)harness_stat(c, "remote.wrong_key"),
		    (unsigned long long)harness_stat(c, "remote.other_version"),
		    (unsigned long long)harness_stat(c, "remote.corrupt"),
		    (unsigned long long)harness_stat(c, "remote.fetched"),
		    (unsigned long long)harness_stat(c, "remote.fetches"));
	CHECK_EQ(hits, N + 1 - TAMPERED);
}

static void check_counters(kvb_client *c)
{
	CHECK_EQ(harness_stat(c, "remote.fetches"), N + 1);
	CHECK_EQ(harness_stat(c, "remote.fetched"), N + 1 - TAMPERED);
	CHECK_EQ(harness_stat(c, "remote.wrong_key"), WRONG_KEY);
	CHECK_EQ(harness_stat(c, "remote.other_version"), 1);
	CHECK_EQ(harness_stat(c, "remote.wrong_key") + harness_stat(c, "remote.other_version") +
			 harness_stat(c, "remote.corrupt"),
		 TAMPERED);
	CHECK_EQ(harness_stat(c, "remote.corrupt"), 0);
}

static void layout2(struct kvb_layout *l)
{
	/* rt_layout's geometry (the same page size) under another model: another namespace. */
	harness_layout(l, "test/remote-swap", KVB_LAYOUT_MLA, 16, 1, 0, 16, 4096);
}

int main(int argc, char **argv)
{
	struct where w[N], w2;
	kvb_key keys[N];
	struct kvb_layout l;
	struct harness_broker *d;
	kvb_client *dc;
	uint32_t ns2a, ns2b, ns1d, ns2d, id;
	size_t pb, vlen;
	uint8_t *plain, *reg;
	char url[128], tmo[16], *v;
	uint64_t pub;

	harness_init(argc, argv);
	rt_cluster_start();
	rt_brokers_start(NULL);

	harness_log("node A publishes %d pages of namespace 1 and one of namespace 2", N);
	harness_key_chain(keys, N, 16, SEED);
	rt_put_pages(0, keys, N, SEED);
	rt_publish_wait(0, N);
	for (int i = 0; i < N; i++)
		CHECK_GE(w[i].node = find_name(&keys[i], NULL, w[i].name, sizeof(w[i].name)), 0);
	layout2(&l);
	CHECK_OK(kvb_ns_open(rt.n[0].cl, &l, &ns2a, &pb));
	CHECK_EQ(pb, rt.page_bytes);
	plain = malloc(pb);
	CHECK(plain);
	harness_fill(plain, pb, &keys[NS2_KEY], SEED2);
	pub = rt_settled(0);
	CHECK_RC(kvb_put(rt.n[0].cl, ns2a, keys[NS2_KEY], plain, pb), 0);
	rt_publish_wait(0, pub + 1);
	CHECK_GE(w2.node = find_name(&keys[NS2_KEY], w[NS2_KEY].name, w2.name, sizeof(w2.name)), 0);
	CHECK_EQ(rt_dbsize(), N + 1);

	harness_log("in the cluster: %d pairs swapped, one value copied onto another key, one "
		    "namespace's value onto the other's name, one old-format value",
		    SWAP_PAIRS);
	for (int p = 0; p < SWAP_PAIRS; p++)
		swap_values(&w[2 * p], &w[2 * p + 1]);
	v = get_value(w[COPY_FROM].node, w[COPY_FROM].name, &vlen);
	set_value(w[COPY_TO].node, w[COPY_TO].name, v, vlen);
	free(v);
	v = get_value(w[NS2_KEY].node, w[NS2_KEY].name, &vlen);
	set_value(w2.node, w2.name, v, vlen);
	free(v);
	{
		struct v1_hdr h = {.magic = 0x5242564bu, .version = 1, .hdr_len = 24, .len = pb};
		char *old = malloc(sizeof(h) + pb);

		CHECK(old);
		harness_fill(old + sizeof(h), pb, &keys[OLD_KEY], SEED);
		h.crc = crc32c(old + sizeof(h), pb);
		h.hcrc = crc32c(&h, offsetof(struct v1_hdr, hcrc));
		memcpy(old, &h, sizeof(h));
		set_value(w[OLD_KEY].node, w[OLD_KEY].name, old, sizeof(h) + pb);
		free(old);
	}

	harness_log("node B GETs every key (%d tampered of %d)", TAMPERED, N + 1);
	CHECK_OK(kvb_ns_open(rt.n[1].cl, &l, &ns2b, &pb));
	reg = kvb_buf_alloc_host(rt.n[1].cl, pb, &id);
	CHECK(reg);
	get_all("node B", rt.n[1].cl, rt.n[1].ns, ns2b, keys, plain, reg);
	check_counters(rt.n[1].cl);
	/* The registered half landed in place: the in-place path refused its tampered values. */
	CHECK_GT(harness_stat(rt.n[1].cl, "remote.fetched_direct"), 0);

	harness_log("broker D, every value through hiredis and copied, GETs every key");
	snprintf(url, sizeof(url), "redis://%s:%u", rt.n[0].addr, rt.n[0].port);
	snprintf(tmo, sizeof(tmo), "%d", rt.tmo);
	setenv("KVB_TEST_REMOTE_COPY", "1", 1);
	d = harness_broker_start("--pool", "64M", "--remote", url, "--remote-timeout", tmo,
				 "--remote-prefix", "t:");
	unsetenv("KVB_TEST_REMOTE_COPY");
	dc = harness_connect(d, "nodeD", 0);
	rt_layout(&l);
	CHECK_OK(kvb_ns_open(dc, &l, &ns1d, &pb));
	layout2(&l);
	CHECK_OK(kvb_ns_open(dc, &l, &ns2d, &pb));
	CHECK(harness_stat_wait(dc, "remote.shards_reachable", RT_NODES, 10000) == RT_NODES);
	get_all("broker D", dc, ns1d, ns2d, keys, plain, NULL);
	check_counters(dc);
	CHECK_EQ(harness_stat(dc, "remote.fetched_in_place"), 0);

	kvb_close(dc);
	harness_broker_stop(d);
	free(plain);
	rt_finish();
	return H_PASS;
}
