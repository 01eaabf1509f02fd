// SPDX-License-Identifier: MIT
/*
 * t_remote_reshard.c - the remote tier while slots move between the cluster's nodes, moved by
 * hand the way `redis-cli --cluster reshard` moves them (CLUSTER SETSLOT IMPORTING on the
 * target, MIGRATING on the source, MIGRATE of its keys, SETSLOT NODE on every node), with the
 * brokers publishing and fetching meanwhile:
 *
 *   - a fetch of a key already migrated out of a slot being migrated follows ASK (ASKING, then
 *     GET on the target): byte-exact;
 *   - a publish into that slot (its key not on the source) is answered ASK: the broker sends it
 *     once more, from the page in RAM, after ASKING to the target, which stores it;
 *   - once the slot moved, a broker with the old map follows MOVED for fetches and publishes
 *     (the publish resent once as well), its slot map refreshes, and its next fetch goes
 *     straight to the new owner (no redirection);
 *   - slots moved in bulk while a client of another node fetches pages of them over and over
 *     and the first node publishes new ones: every hit byte-exact, every publish stored, every
 *     page fetched byte-exact after.
 *
 * Key slots are computed here (CRC16/XMODEM of the store's name, no hash tags), checked against
 * CLUSTER KEYSLOT. Three masters on loopback and their brokers (rtier.c); a few seconds.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "rtier.h"

#define NSLOTS 16384

static char ident[128];	       /* the namespace identity in the store's names (hex) */
static char ids[RT_NODES][48]; /* the nodes' cluster ids */
static int slot_owner[NSLOTS];

/* Bit by bit, as the cluster spec defines it: an oracle apart from cslot.c's table. */
static uint16_t crc16(const char *p, size_t n)
{
	uint16_t c = 0;

	while (n--) {
		c ^= (uint16_t)((uint8_t)*p++ << 8);
		for (int b = 0; b < 8; b++)
			c = c & 0x8000 ? (uint16_t)((c << 1) ^ 0x1021) : (uint16_t)(c << 1);
	}
	return c;
}

static void name_of(const kvb_key *k, char *out, size_t len)
{
	int o = snprintf(out, len, "t:%s:", ident);

	for (int i = 0; i < 32 && o + 3 < (int)len; i++)
		o += snprintf(out + o, len - (size_t)o, "%02x", k->b[i]);
}

static int slot_of(const kvb_key *k)
{
	char name[256];

	name_of(k, name, sizeof(name));
	return crc16(name, strlen(name)) & (NSLOTS - 1);
}

static void ok_cmd(int node, const char *what, redisReply *r)
{
	CHECKF(r && r->type == REDIS_REPLY_STATUS, "node %d: %s: %s", node, what,
	       r && r->str ? r->str : "no reply");
	freeReplyObject(r);
}

/* Slot s from node `from` to node `to`: both sides marked; keys move with key_move. */
static void slot_begin(int s, int from, int to)
{
	ok_cmd(to, "SETSLOT IMPORTING",
	       rt_cmd(to, "CLUSTER SETSLOT %d IMPORTING %s", s, ids[from]));
	ok_cmd(from, "SETSLOT MIGRATING",
	       rt_cmd(from, "CLUSTER SETSLOT %d MIGRATING %s", s, ids[to]));
}

static void key_move(int from, int to, const char *name)
{
	redisReply *r = rt_cmd(from, "MIGRATE %s %u %s 0 5000 KEYS %s", rt.n[to].addr,
			       rt.n[to].port, "", name);

	CHECKF(r && r->type == REDIS_REPLY_STATUS, "MIGRATE %s: %s", name,
	       r && r->str ? r->str : "no reply");
	freeReplyObject(r);
}

/* What is left of slot s on `from` moves, then every node learns that `to` owns it. */
static void slot_end(int s, int from, int to)
{
	redisReply *r = rt_cmd(from, "CLUSTER GETKEYSINSLOT %d 100", s);

	CHECK(r && r->type == REDIS_REPLY_ARRAY);
	for (size_t i = 0; i < r->elements; i++)
		key_move(from, to, r->element[i]->str);
	freeReplyObject(r);
	/* The target first, then the source, then the rest (as redis-cli does). */
	ok_cmd(to, "SETSLOT NODE", rt_cmd(to, "CLUSTER SETSLOT %d NODE %s", s, ids[to]));
	ok_cmd(from, "SETSLOT NODE", rt_cmd(from, "CLUSTER SETSLOT %d NODE %s", s, ids[to]));
	for (int i = 0; i < RT_NODES; i++)
		if (i != from && i != to)
			ok_cmd(i, "SETSLOT NODE",
			       rt_cmd(i, "CLUSTER SETSLOT %d NODE %s", s, ids[to]));
	slot_owner[s] = to;
}

/* n fresh keys whose names fall in slot s (seed: where the search starts). */
static void keys_in_slot(int s, kvb_key *out, int n, uint64_t seed)
{
	for (uint64_t i = 0; n; i++) {
		kvb_key k = harness_key(seed, i);

		if (slot_of(&k) == s) {
			*out++ = k;
			n--;
		}
	}
}

static void learn_cluster(void)
{
	kvb_key k = harness_key(900, 0);
	char name[256];
	size_t len;
	redisReply *r;

	for (int i = 0; i < RT_NODES; i++) {
		r = rt_cmd(i, "CLUSTER MYID");
		CHECK(r && r->type == REDIS_REPLY_STRING && r->len < (int)sizeof(ids[i]));
		snprintf(ids[i], sizeof(ids[i]), "%s", r->str);
		freeReplyObject(r);
	}
	for (int s = 0; s < NSLOTS; s++)
		slot_owner[s] = s * RT_NODES / NSLOTS; /* rt_cluster_create's thirds */
	rt_put_pages(0, &k, 1, 900);
	rt_publish_wait(0, 1);
	CHECK_GE(rt_key_owner(&k, name, sizeof(name)), 0);
	len = strlen(name);
	CHECK(len > 2 + 1 + 64 && len - 67 < sizeof(ident));
	memcpy(ident, name + 2, len - 67);
	ident[len - 67] = 0;
	r = rt_cmd(0, "CLUSTER KEYSLOT %s", name);
	CHECK(r && r->type == REDIS_REPLY_INTEGER);
	CHECK_EQ(r->integer, slot_of(&k));
	freeReplyObject(r);
}

/*
 * One slot moved in steps, its four pages: k[0] and k[1] published before, k[0] migrated
 * (ASK for B's fetch), k[2] PUT on A while the slot migrates (ASK for A's publish), the slot
 * moved, k[3] PUT on A with its old map (MOVED for the publish), then C fetches them all
 * (MOVED) and, its map refreshed, fetches again with no redirection.
 */
static void case_one_slot(void)
{
	kvb_key k[4];
	char name[4][256];
	uint8_t *buf = malloc(rt.page_bytes);
	uint64_t red, pub, refreshes;
	int s, from, to;

	harness_log("one slot moved in steps: ASK and MOVED for fetches and publishes");
	k[0] = harness_key(910, 0);
	s = slot_of(&k[0]); /* any slot; from its owner to the next node */
	from = slot_owner[s];
	to = (from + 1) % RT_NODES;
	keys_in_slot(s, k, 4, 910);
	for (int i = 0; i < 4; i++)
		name_of(&k[i], name[i], sizeof(name[i]));
	pub = rt_settled(0);
	rt_put_pages(0, k, 2, 910);
	rt_publish_wait(0, pub + 2);
	CHECK_EQ(rt_key_owner(&k[0], NULL, 0), from);
	CHECK_EQ(rt_key_owner(&k[1], NULL, 0), from);

	slot_begin(s, from, to);
	key_move(from, to, name[0]);
	red = rt_stat(1, "remote.redirects");
	CHECK_EQ(rt_get_page_reg(1, &k[0], 910), 1); /* ASK: on the target */
	CHECK_GE(rt_stat(1, "remote.redirects"), red + 1);
	CHECK_EQ(rt_get_page_reg(1, &k[1], 910), 1); /* still on the source */

	pub = rt_settled(0);
	rt_put_pages(0, &k[2], 1, 910);
	rt_publish_wait(0, pub + 1);
	CHECK_EQ(rt_key_owner(&k[2], NULL, 0), to);
	CHECK_GE(rt_stat(0, "remote.publish_redirected"), 1);
	CHECK_GE(rt_stat(0, "remote.publish_resent"), 1);

	slot_end(s, from, to);
	CHECK_EQ(rt_key_owner(&k[1], NULL, 0), to);
	pub = rt_settled(0);
	rt_put_pages(0, &k[3], 1, 910);
	rt_publish_wait(0, pub + 1); /* MOVED (A's map still names the source), resent */
	CHECK_EQ(rt_key_owner(&k[3], NULL, 0), to);
	CHECK_GE(rt_stat(0, "remote.publish_resent"), 2);
	CHECK_EQ(rt_stat(0, "remote.publish_lost"), 0);

	refreshes = rt_stat(2, "remote.slot_refreshes");
	red = rt_stat(2, "remote.redirects");
	for (int i = 0; i < 4; i++)
		CHECK_EQ(i % 2 ? rt_get_page_reg(2, &k[i], 910) : rt_get_page(2, &k[i], 910, buf),
			 1);
	CHECK_GE(rt_stat(2, "remote.redirects"), red + 1);
	/* A MOVED makes the map refresh soon (REFRESH_GAP), not at the 10 s period. */
	for (int t = 0; t < 300 && rt_stat(2, "remote.slot_refreshes") == refreshes; t++)
		usleep(10000);
	CHECK_GT(rt_stat(2, "remote.slot_refreshes"), refreshes);
	red = rt_stat(2, "remote.redirects");
	for (int i = 0; i < 4; i++) {
		CHECK_OK(kvb_delete(rt.n[2].cl, rt.n[2].ns, k[i])); /* fetched again, not in RAM */
		CHECK_EQ(rt_get_page_reg(2, &k[i], 910), 1);
	}
	CHECK_EQ(rt_stat(2, "remote.redirects"), red);
	free(buf);
}

enum { BULK = 24 };

static struct {
	kvb_key keys[BULK];
	int stop;
	uint64_t hits, misses, rounds;
	struct harness_gate ready;
} * sh;

/* Node B's client: fetches every page again and again (each deleted from RAM after). */
static int fetcher(int idx, void *arg)
{
	struct kvb_opts o = {.name = "fetcher"};
	struct kvb_layout l;
	kvb_client *c = NULL;
	uint8_t *buf;
	uint32_t ns, id;
	size_t pb;

	(void)idx;
	(void)arg;
	o.socket_path = rt.n[1].bk->sock;
	CHECK_OK(kvb_connect(&o, &c));
	rt_layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	buf = kvb_buf_alloc_host(c, pb, &id);
	CHECK(buf);
	harness_gate_open(&sh->ready, 1);
	while (!__atomic_load_n(&sh->stop, __ATOMIC_ACQUIRE)) {
		for (int i = 0; i < BULK; i++) {
			int rc = kvb_get(c, ns, sh->keys[i], buf, pb);

			if (rc == -ENOENT) {
				sh->misses++;
				continue;
			}
			CHECK_RC(rc, (long long)pb);
			CHECK(harness_verify(buf, pb, &sh->keys[i], 920,
					     "page during resharding") == 0);
			sh->hits++;
			CHECK_OK(kvb_delete(c, ns, sh->keys[i]));
		}
		sh->rounds++;
	}
	kvb_close(c);
	return H_PASS;
}

/*
 * Every slot of node 2's that holds one of BULK pages moves to node 0, key by key, while B's
 * client fetches them all over and over; A publishes a new page into each slot while it
 * migrates (ASK), and another into each once all moved (MOVED: A's map is stale).
 */
static void case_bulk(void)
{
	kvb_key fresh[2 * BULK];
	int moved[BULK] = {0}, nmoved = 0;
	uint64_t pub, lost = rt_stat(0, "remote.publish_lost");
	uint64_t redirected = rt_stat(0, "remote.publish_redirected");
	pid_t pid;

	harness_log("slots moved in bulk while B fetches and A publishes");
	sh = harness_shared(sizeof(*sh));
	harness_gate_init(&sh->ready);
	harness_key_chain(sh->keys, BULK, 16, 920);
	pub = rt_settled(0);
	rt_put_pages(0, sh->keys, BULK, 920);
	rt_publish_wait(0, pub + BULK);
	for (int i = 0; i < BULK; i++) {
		int s = slot_of(&sh->keys[i]), seen = 0;

		for (int j = 0; j < nmoved; j++)
			seen |= moved[j] == s;
		if (slot_owner[s] == 2 && !seen)
			moved[nmoved++] = s;
	}
	CHECK_GT(nmoved, 0);
	for (int j = 0; j < nmoved; j++)
		keys_in_slot(moved[j], &fresh[2 * j], 2, 921);
	pid = harness_fork(fetcher, 0, NULL);
	harness_gate_wait(&sh->ready, 10000);
	pub = rt_settled(0);
	for (int j = 0; j < nmoved; j++) {
		slot_begin(moved[j], 2, 0);
		rt_put_pages(0, &fresh[2 * j], 1, 921); /* ASK: the key is not on the source */
		rt_publish_wait(0, pub + (uint64_t)j + 1);
		usleep(20000); /* a few of B's fetches meet the slot half-moved */
		slot_end(moved[j], 2, 0);
	}
	for (int j = 0; j < nmoved; j++)
		rt_put_pages(0, &fresh[2 * j + 1], 1, 921); /* MOVED: A's map names node 2 */
	rt_publish_wait(0, pub + 2 * (uint64_t)nmoved);
	usleep(100000);
	__atomic_store_n(&sh->stop, 1, __ATOMIC_RELEASE);
	CHECK_EQ(harness_wait(&pid, 1, 20000, NULL), 0);
	harness_log("%d slots moved; B: %llu rounds, %llu hits, %llu misses; A: %llu publishes "
		    "redirected, %llu resent",
		    nmoved, (unsigned long long)sh->rounds, (unsigned long long)sh->hits,
		    (unsigned long long)sh->misses,
		    (unsigned long long)rt_stat(0, "remote.publish_redirected"),
		    (unsigned long long)rt_stat(0, "remote.publish_resent"));
	CHECK_GT(sh->hits, 0);
	CHECK_EQ(rt_stat(0, "remote.publish_lost"), lost);
	CHECK_GE(rt_stat(0, "remote.publish_redirected"), redirected + (uint64_t)nmoved);
	for (int i = 0; i < BULK; i++) {
		CHECK_EQ(rt_key_owner(&sh->keys[i], NULL, 0), slot_owner[slot_of(&sh->keys[i])]);
		CHECK_EQ(rt_get_page_reg(2, &sh->keys[i], 920), 1);
	}
	for (int i = 0; i < 2 * nmoved; i++) {
		CHECK_EQ(rt_key_owner(&fresh[i], NULL, 0), 0);
		CHECK_EQ(rt_get_page_reg(2, &fresh[i], 921), 1);
	}
}

int main(int argc, char **argv)
{
	harness_init(argc, argv);
	rt_cluster_start();
	rt_brokers_start(NULL);
	learn_cluster();
	case_one_slot();
	case_bulk();
	rt_finish();
	return H_PASS;
}
