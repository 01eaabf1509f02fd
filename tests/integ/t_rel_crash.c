// SPDX-License-Identifier: MIT
/*
 * t_rel_crash.c - the crash contract (docs/reliability.md, promise 7), tried as hard as a test on
 * one machine can: kill -9 of the broker, or of the keeper that holds its pool, at a random
 * moment under a mixed load on every tier, then a model of what must be true checked against
 * everything the restarted broker serves.
 *
 * The contract. A PUT that returned survives any crash byte-identical, or is gone (a miss). A
 * GET, a lease (ACQUIRE) and a LOOKUP never see another key's bytes, a torn page, or a page of
 * another namespace, and a key nobody PUT is never found. A PUT cut by the crash is byte-exact
 * or absent afterwards.
 *
 * The world. One broker with a 16 MiB pool (1 MiB slabs), a 24 MiB cache file on the real file
 * system (--disk) and, where redis-server is installed, a Redis Cluster of three masters behind
 * it (--remote, rtier.c; without redis-server that tier is left out and the log says so). Two
 * namespaces of different page sizes (64 KiB and 20 KiB) share one key space: 64 chains of 8
 * keys (kvb_key_chain), of which chains 0, 3, 6, ... are PUT in both namespaces, 1, 4, ... in
 * the first only, 2, 5, ... in the second only, and the last 4 in neither. A page's bytes are a
 * pure function of its key and its namespace (harness_fill with a seed per namespace), so any
 * byte served can be judged, and a page of the other namespace under the same key is wrong
 * bytes, not a hit. About 26 MiB of distinct pages for a 16 MiB pool: eviction and demotion
 * never stop.
 *
 * The model, in shared memory: per namespace and key, STARTED (set before the PUT is sent) and
 * DONE (set once it returned). Never reset: a key DONE in round 1 must still be byte-exact or
 * gone in round 20. A hit on a key not STARTED in that namespace is a phantom.
 *
 * A round. Five client processes run a mix: PUTs from private memory (the staging and filled
 * paths) and from a kvb_buf_alloc_host() buffer, chains PUT in order with kvb_put_child(), GETs
 * into private and registered memory, LOOKUPs of whole chains (with tiers), synchronous and
 * asynchronous ACQUIREs; keys never PUT and keys of the other namespace are among those read.
 * Every hit is checked byte for byte where it happens. After a random 80-500 ms the test
 * SIGKILLs the broker; in one round in four it first SIGKILLs the keeper (pool.keeper_pid)
 * and the broker 0-200 ms later, so that the broker dies with or without a new keeper holding
 * its pool. A broker is started on the same socket with the same flags (in one round in five
 * that one is SIGKILLed too, 0-80 ms in, while it adopts, scans or has just begun to serve, and
 * another started). The clients reconnect by themselves (the call in flight returns
 * -ECONNRESET and is repeated, but for a PUT, which is recorded as cut by the kill), run on,
 * then fill the pool with 24 MiB of new pages. Then, with the clients gone, the test GETs every
 * key of the model in both namespaces, after a LOOKUP of its chain: each is byte-exact or a
 * miss; a miss of a DONE key counts as gone; a LOOKUP hit that the GET then misses is allowed
 * only when the broker evicted, dropped or lost something meanwhile (its counters say so), or,
 * for a page in the remote tier that the broker did not even try to fetch (no free RAM while
 * its evictions were demotions in flight), when a GET asked again serves it.
 *
 * Leases across the crash. Each client holds up to 4 leases (taken both ways) when the broker
 * dies, and reads their bytes again at the crash before its next call, after its next call once
 * the new broker is up, and after the clients filled the new broker's pool: each time they must
 * be the page's bytes. KVB_CRASH_LEASES=0 leaves this out (leases are then released at once).
 *
 * Every decision (kill delay, victim, each client's operations) comes from one seed, logged;
 * KVB_CRASH_SEED=<seed> replays them (the scheduling is the machine's). Rounds: 3 under the
 * sanitizers, 20 in make test, 1000 in make soak (ending early once KVB_SOAK_SECONDS passed).
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <liburing.h>

#include "reliab.h"
#include "rtier.h"

#define NCLI 5
#define CH 8	  /* pages per chain */
#define NCHAIN 60 /* chains the clients PUT */
#define NGHOST 4  /* chains nobody ever PUTs */
#define NCHT (NCHAIN + NGHOST)
#define NIDS (NCHT * CH)
#define TPP 16
#define BIG (64u << 10)	  /* namespace A's pages */
#define SMALL (20u << 10) /* namespace B's */
#define MAXHELD 4	  /* leases a client holds when the broker dies */
#define MAXINFL 1024
#define FILL_BYTES (24u << 20) /* new pages after a restart: one and a half pools */
#define FILL_SALT 0xf111f111f111ull
#define WHY 512 /* a description of wrong bytes */

static_assert(NIDS < (1 << 15), "an id and its namespace fit 16 bits");

enum { ST_STARTED = 1, ST_DONE = 2 };
enum { PH_RUN, PH_FILL, PH_CHECK };
/* Where a lease held across the crash is read again. */
enum { LC_CRASH, LC_RECONNECT, LC_FILLED, LC_N };
static const char *const lc_name[LC_N] = {
	"at the crash, before the client's next call",
	"after the client's next call, with the new broker up",
	"after the clients filled the new broker's pool",
};

struct shared {
	char sock[108];
	uint64_t seed; /* the run's: KVB_CRASH_SEED */
	int leases;    /* hold leases across the kill */
	_Atomic uint8_t st[2][NIDS];
	/* this round */
	uint64_t rseed;
	uint32_t round;
	_Atomic int phase;
	_Atomic int killing; /* the broker is about to die: -ECONNRESET is expected from now */
	_Atomic int dead;    /* it is dead */
	_Atomic int up;	     /* its successor is ready */
	_Atomic int filled;  /* clients done filling */
	_Atomic uint64_t ops[NCLI];
	_Atomic uint32_t ninfl;
	uint16_t infl[MAXINFL]; /* PUTs cut by the kill: ns << 15 | id */
	/* the run */
	_Atomic uint64_t verified, resets, errors, wrong, phantom, puts, lookups, fills;
	_Atomic uint64_t held_at_kill, lease_checks[LC_N], lease_bad[LC_N], lease_live_bad;
	_Atomic int lease_first_set[LC_N];
	char lease_first[LC_N][WHY + 128];
	struct harness_gate ready, go;
};

static struct shared *sh;
static kvb_key keys[NIDS];
static struct kvb_layout lay[2];
static const size_t page_len[2] = {BIG, SMALL};

static uint64_t mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

/* The content seed of a namespace: the same key has other bytes in the other one. */
static uint64_t cseed(int ns)
{
	return sh->seed * 2 + (uint64_t)ns;
}

/* Which namespaces a chain is PUT in: bit 0 A, bit 1 B. */
static int chain_ns(int chain)
{
	static const int m[3] = {3, 1, 2};

	return chain >= NCHAIN ? 0 : m[chain % 3];
}

static kvb_key fill_key(uint32_t round, int idx, int i)
{
	return harness_key(sh->seed ^ FILL_SALT,
			   (uint64_t)round << 32 | (uint64_t)idx << 16 | (uint64_t)i);
}

/* ---- judging bytes ---- */

static void bytes_at(const kvb_key *k, uint64_t seed, size_t off, uint8_t w[8])
{
	for (int i = 0; i < 8; i++)
		w[i] = harness_byte(k, seed, off + (size_t)i);
}

/*
 * Names the page whose bytes p holds at off (8 bytes, off a multiple of 8), as far as known: a
 * page of the model or of this round's fill, seen from any 4 KiB boundary of it (slots are
 * 4 KiB aligned, and a slab that changed page size holds pages at other offsets).
 */
static void whose(const uint8_t *p, size_t off, char *out, size_t len)
{
	uint8_t w[8], zero[8] = {0}, poison[8];

	memset(poison, 0xee, sizeof(poison));
	if (!memcmp(p + off, zero, 8)) {
		snprintf(out, len, "zeros");
		return;
	}
	if (!memcmp(p + off, poison, 8)) {
		snprintf(out, len, "the reader's poison (never written)");
		return;
	}
	for (size_t d = off % 4096; d < BIG; d += 4096) {
		for (int s = 0; s < 2; s++) {
			if (d >= page_len[s])
				continue;
			for (int id = 0; id < NIDS; id++) {
				bytes_at(&keys[id], cseed(s), d, w);
				if (!memcmp(p + off, w, 8)) {
					snprintf(out, len,
						 "key %d (chain %d page %d) of namespace %c, its "
						 "byte %zu",
						 id, id / CH, id % CH, 'A' + s, d);
					return;
				}
			}
			for (int idx = 0; idx < NCLI; idx++)
				for (int i = 0; i < 512; i++) {
					kvb_key k = fill_key(sh->round, idx, i);

					bytes_at(&k, cseed(s), d, w);
					if (!memcmp(p + off, w, 8)) {
						snprintf(out, len,
							 "fill page %d of client %d in namespace "
							 "%c (this round), its byte %zu",
							 i, idx, 'A' + s, d);
						return;
					}
				}
		}
	}
	snprintf(out, len, "bytes of no page of this round (%02x%02x%02x%02x%02x%02x%02x%02x)",
		 p[off], p[off + 1], p[off + 2], p[off + 3], p[off + 4], p[off + 5], p[off + 6],
		 p[off + 7]);
}

/*
 * 0 when p (len bytes) is exactly key id's page of namespace ns; otherwise -1 with what is
 * wrong and whose bytes are there instead in why. want is a scratch page.
 */
static int page_ok(const uint8_t *p, size_t len, int ns, const kvb_key *k, uint8_t *want, char *why,
		   size_t wl)
{
	size_t first = SIZE_MAX, nbad = 0;
	char at0[160], atbad[160];

	harness_fill(want, len, k, cseed(ns));
	if (!memcmp(p, want, len))
		return 0;
	for (size_t i = 0; i < len; i++)
		if (p[i] != want[i]) {
			first = first == SIZE_MAX ? i : first;
			nbad++;
		}
	whose(p, 0, at0, sizeof(at0));
	if (first < 8) {
		snprintf(why, wl, "%zu of %zu bytes differ; it holds %s", nbad, len, at0);
		return -1;
	}
	whose(p, first & ~(size_t)7, atbad, sizeof(atbad));
	snprintf(why, wl,
		 "%zu of %zu bytes differ from offset %zu; at offset 0 it holds %s, at %zu %s",
		 nbad, len, first, at0, first & ~(size_t)7, atbad);
	return -1;
}

/* ---- the clients ---- */

struct held {
	struct kvb_lease l;
	int ns, id, async;
};

struct cli {
	int idx;
	kvb_client *c;
	uint32_t ns[2];
	uint32_t bid;
	uint8_t *reg, *priv, *want;
	uint64_t rng;
	int crash_seen, reconnect_checked;
	struct held held[MAXHELD];
	int nheld;
};

static void cli_error(struct cli *k, const char *what, int ns, int id, int rc)
{
	printf("client %d: %s of key %d in namespace %c: %d (%s)\n", k->idx, what, id, 'A' + ns, rc,
	       harness_strerror(rc));
	sh->errors++;
}

/* Reads every held lease again; cp: an LC_* checkpoint after the crash, or -1 before it. */
static void check_leases(struct cli *k, int cp)
{
	for (int i = 0; i < k->nheld; i++) {
		struct held *h = &k->held[i];
		char why[WHY];

		if (cp >= 0)
			sh->lease_checks[cp]++;
		if (!page_ok(h->l.data, h->l.len, h->ns, &keys[h->id], k->want, why, sizeof(why)))
			continue;
		printf("client %d: round %u: a lease (%s) on key %d of namespace %c read %s: %s\n",
		       k->idx, sh->round, h->async ? "async ACQUIRE" : "kvb_acquire", h->id,
		       'A' + h->ns, cp >= 0 ? lc_name[cp] : "before the crash", why);
		if (cp < 0) {
			sh->lease_live_bad++;
			continue;
		}
		sh->lease_bad[cp]++;
		if (!atomic_exchange(&sh->lease_first_set[cp], 1))
			snprintf(sh->lease_first[cp], sizeof(sh->lease_first[cp]),
				 "client %d, %s lease on key %d of namespace %c: %s", k->idx,
				 h->async ? "async" : "sync", h->id, 'A' + h->ns, why);
	}
}

/* The broker is gone: first time here, the held leases are read before anything else. */
static void crash_noticed(struct cli *k)
{
	if (k->crash_seen)
		return;
	CHECKF(sh->killing, "client %d: -ECONNRESET while the broker was alive", k->idx);
	k->crash_seen = 1;
	sh->held_at_kill += (uint64_t)k->nheld;
	check_leases(k, LC_CRASH);
}

/* A call returned something other than -ECONNRESET. */
static void after_call(struct cli *k)
{
	sh->ops[k->idx]++;
	if (k->crash_seen && !k->reconnect_checked && sh->up) {
		k->reconnect_checked = 1;
		check_leases(k, LC_RECONNECT);
	}
}

/* A call repeated while the broker is away (the library reconnects on the next call). */
#define CALL(k, rc, expr)                                                                          \
	do {                                                                                       \
		uint64_t t_ = harness_now_ms();                                                    \
		while (((rc) = (expr)) == -ECONNRESET) {                                           \
			sh->resets++;                                                              \
			crash_noticed(k);                                                          \
			CHECKF(harness_now_ms() - t_ < 60000,                                      \
			       "client %d: no broker to reconnect to for 60 s", (k)->idx);         \
			rel_sleep_ms(1);                                                           \
		}                                                                                  \
		after_call(k);                                                                     \
	} while (0)

/* A hit of key id in ns: judged (phantom, bytes), counted. */
static void judge_hit(struct cli *k, int ns, int id, const uint8_t *p, int rc, const char *what)
{
	char why[WHY];

	if (!(sh->st[ns][id] & ST_STARTED)) {
		printf("client %d: round %u: %s served key %d of namespace %c, which nobody PUT "
		       "there\n",
		       k->idx, sh->round, what, id, 'A' + ns);
		sh->phantom++;
	}
	if (rc != (int)page_len[ns]) {
		printf("client %d: round %u: %s of key %d returned %d, want %zu\n", k->idx,
		       sh->round, what, id, rc, page_len[ns]);
		sh->wrong++;
		return;
	}
	if (page_ok(p, page_len[ns], ns, &keys[id], k->want, why, sizeof(why))) {
		printf("client %d: round %u: %s of key %d in namespace %c: %s\n", k->idx, sh->round,
		       what, id, 'A' + ns, why);
		sh->wrong++;
		return;
	}
	sh->verified++;
}

/* A PUT is not repeated when the kill cuts it: the model keeps it STARTED, not DONE. */
static int put_one(struct cli *k, int ns, int id, const kvb_key *parent, int reg)
{
	uint8_t *src = reg ? k->reg : k->priv;
	int rc;

	harness_fill(src, page_len[ns], &keys[id], cseed(ns));
	atomic_fetch_or(&sh->st[ns][id], ST_STARTED);
	if (parent)
		rc = kvb_put_child(k->c, k->ns[ns], keys[id], parent, src, page_len[ns]);
	else
		rc = kvb_put(k->c, k->ns[ns], keys[id], src, page_len[ns]);
	if (rc == -ECONNRESET) {
		uint32_t n = sh->ninfl++;

		sh->resets++;
		crash_noticed(k);
		if (n < MAXINFL)
			sh->infl[n] = (uint16_t)(ns << 15 | id);
		return rc;
	}
	if (rc < 0) {
		cli_error(k, parent ? "PUT (child)" : "PUT", ns, id, rc);
		return rc;
	}
	atomic_fetch_or(&sh->st[ns][id], ST_DONE);
	sh->puts++;
	after_call(k);
	return 0;
}

static int pick_id(struct cli *k, int ns)
{
	for (;;) {
		int id = (int)(rnd(&k->rng) % (NCHAIN * CH));

		if (chain_ns(id / CH) & (1 << ns))
			return id;
	}
}

static int acquire_async(struct cli *k, int ns, int id, struct kvb_lease *out)
{
	struct kvb_op op = {.opcode = KVB_OP_ACQUIRE, .ns = k->ns[ns], .key = keys[id]};
	struct kvb_completion cq;
	int rc = kvb_submit(k->c, &op, 1);

	if (rc < 0)
		return rc; /* -ECONNRESET: nothing queued */
	CHECK_EQ(rc, 1);
	/* The reap that finds the broker gone says so; the failed op comes with the next. */
	for (int tries = 0; (rc = kvb_reap(k->c, &cq, 1, 1, 10000)) != 1; tries++) {
		CHECKF(rc == -ECONNRESET && tries < 100, "client %d: reap of an ACQUIRE: %d (%s)",
		       k->idx, rc, harness_strerror(rc));
		crash_noticed(k);
	}
	if (cq.res == 0)
		*out = cq.lease;
	return cq.res;
}

/* A RELEASE cut by the kill leaves the lease held: sent again (the library answers it then). */
static int release_async(struct cli *k, uint64_t id)
{
	struct kvb_op op = {.opcode = KVB_OP_RELEASE, .off = id};
	struct kvb_completion cq;
	int rc = kvb_submit(k->c, &op, 1);

	if (rc < 0)
		return rc;
	CHECK_EQ(rc, 1);
	for (int tries = 0; (rc = kvb_reap(k->c, &cq, 1, 1, 10000)) != 1; tries++) {
		CHECKF(rc == -ECONNRESET && tries < 100, "client %d: reap of a RELEASE: %d (%s)",
		       k->idx, rc, harness_strerror(rc));
		crash_noticed(k);
	}
	return cq.res;
}

static void release(struct cli *k, struct held *h)
{
	int rc;

	if (h->async)
		CALL(k, rc, release_async(k, h->l.id));
	else
		CALL(k, rc, kvb_release(k->c, &h->l));
	if (rc)
		cli_error(k, "RELEASE", h->ns, h->id, rc);
}

static void op_acquire(struct cli *k, int ns, int async)
{
	int id = pick_id(k, ns), rc;
	struct held h = {.ns = ns, .id = id, .async = async};

	if (async)
		CALL(k, rc, acquire_async(k, ns, id, &h.l));
	else
		CALL(k, rc, kvb_acquire(k->c, k->ns[ns], keys[id], &h.l));
	if (rc == -ENOENT)
		return;
	if (rc < 0) {
		cli_error(k, async ? "async ACQUIRE" : "ACQUIRE", ns, id, rc);
		return;
	}
	judge_hit(k, ns, id, h.l.data, (int)h.l.len, async ? "async ACQUIRE" : "ACQUIRE");
	/* Held across the kill only when asked, and only leases of the broker that dies. */
	if (sh->leases && !sh->killing && k->nheld < MAXHELD) {
		k->held[k->nheld++] = h;
		return;
	}
	release(k, &h);
}

static void op_get(struct cli *k, int ns, int id, int reg)
{
	uint8_t *dst = reg ? k->reg + BIG : k->priv;
	int rc;

	memset(dst, 0xee, page_len[ns]);
	CALL(k, rc, kvb_get(k->c, k->ns[ns], keys[id], dst, page_len[ns]));
	if (rc == -ENOENT)
		return;
	if (rc < 0) {
		cli_error(k, "GET", ns, id, rc);
		return;
	}
	judge_hit(k, ns, id, dst, rc, reg ? "GET (registered)" : "GET");
}

/* LOOKUP of a whole chain: no tier for a key nobody PUT; the first hit is then read. */
static void op_lookup(struct cli *k, int ns)
{
	int chain = (int)(rnd(&k->rng) % NCHT), base = chain * CH, rc, first = -1;
	uint8_t tiers[CH];
	size_t hits;

	CALL(k, rc, kvb_lookup_tiers(k->c, k->ns[ns], &keys[base], CH, &hits, tiers));
	if (rc < 0) {
		cli_error(k, "LOOKUP", ns, base, rc);
		return;
	}
	sh->lookups++;
	for (int j = 0; j < CH; j++) {
		if (tiers[j] == KVB_TIER_NONE)
			continue;
		first = first < 0 ? j : first;
		if (!(sh->st[ns][base + j] & ST_STARTED)) {
			printf("client %d: round %u: LOOKUP found key %d of namespace %c in "
			       "tier %u, where nobody PUT it\n",
			       k->idx, sh->round, base + j, 'A' + ns, tiers[j]);
			sh->phantom++;
		}
	}
	if (first >= 0)
		op_get(k, ns, base + first, first % 2);
}

static void one_op(struct cli *k)
{
	uint64_t x = rnd(&k->rng);
	int ns = (int)(x & 1), op = (int)((x >> 8) % 100);

	if (op < 20) {
		put_one(k, ns, pick_id(k, ns), NULL, 0);
	} else if (op < 30) {
		put_one(k, ns, pick_id(k, ns), NULL, 1);
	} else if (op < 40) { /* a chain prefix, in order, each page naming its parent */
		int base = pick_id(k, ns) / CH * CH, n = 1 + (int)((x >> 40) % CH);

		for (int j = 0; j < n; j++)
			if (put_one(k, ns, base + j, j ? &keys[base + j - 1] : NULL, 1) < 0)
				break;
	} else if (op < 65) { /* any key, never-PUT ones and the other namespace's included */
		op_get(k, ns, (int)((x >> 24) % NIDS), (int)(x >> 50) & 1);
	} else if (op < 80) {
		op_lookup(k, ns);
	} else {
		op_acquire(k, ns, op >= 90);
	}
}

/* One and a half pools of new pages, both namespaces: every slot of the adopted pool reused. */
static void fill(struct cli *k)
{
	uint64_t bytes = 0;

	for (int i = 0; bytes < FILL_BYTES / NCLI; i++) {
		int ns = i & 1, rc;
		kvb_key key = fill_key(sh->round, k->idx, i);

		CHECK(i < 512);
		harness_fill(k->priv, page_len[ns], &key, cseed(ns));
		CALL(k, rc, kvb_put(k->c, k->ns[ns], key, k->priv, page_len[ns]));
		if (rc < 0)
			cli_error(k, "fill PUT", ns, i, rc);
		bytes += page_len[ns];
		sh->fills++;
	}
}

static int client(int idx, void *arg)
{
	struct cli k = {.idx = idx};
	char name[32];
	struct kvb_opts o = {.socket_path = sh->sock, .name = name, .reconnect_ms = 20000};
	uint64_t n = 0;

	(void)arg;
	snprintf(name, sizeof(name), "crash-%d", idx);
	k.rng = mix(sh->rseed + (uint64_t)idx) | 1;
	CHECK_OK(kvb_connect(&o, &k.c));
	for (int ns = 0; ns < 2; ns++) {
		size_t pb;

		CHECK_OK(kvb_ns_open(k.c, &lay[ns], &k.ns[ns], &pb));
		CHECK_EQ(pb, page_len[ns]);
	}
	k.reg = kvb_buf_alloc_host(k.c, 2 * BIG, &k.bid);
	k.priv = malloc(BIG);
	k.want = malloc(BIG);
	CHECK(k.reg && k.priv && k.want);
	harness_gate_open(&sh->ready, 1);
	harness_gate_wait(&sh->go, 30000);
	while (sh->phase == PH_RUN) {
		if (sh->dead)
			crash_noticed(&k);
		one_op(&k);
		if (++n % 16 == 0 && !sh->killing)
			check_leases(&k, -1);
	}
	crash_noticed(&k);
	fill(&k);
	sh->filled++;
	while (sh->phase != PH_CHECK)
		rel_sleep_ms(1);
	check_leases(&k, LC_FILLED);
	for (int i = 0; i < k.nheld; i++)
		release(&k, &k.held[i]);
	kvb_close(k.c);
	free(k.priv);
	free(k.want);
	return 0;
}

/* ---- the broker and its restarts ---- */

static struct harness_broker *bk;
static char brokerd[PATH_MAX + 32];
static const char *bargs[40];
static int nbargs;
static char cache[PATH_MAX + 64];

static void remove_cache(void)
{
	if (cache[0])
		unlink(cache);
}

/* The disk tier needs io_uring; some sandboxes forbid it (seccomp, io_uring_disabled). */
static int have_io_uring(void)
{
	struct io_uring r;
	int err = io_uring_queue_init(2, &r, 0);

	if (err)
		return 0;
	io_uring_queue_exit(&r);
	return 1;
}

static int control_connect(kvb_client **c)
{
	struct kvb_opts o = {.socket_path = sh->sock, .flags = KVB_CONNECT_CONTROL};

	return kvb_connect(&o, c);
}

static uint64_t stat_now(const char *path)
{
	kvb_client *c = NULL;
	uint64_t v;

	CHECK_OK(control_connect(&c));
	v = harness_stat(c, path);
	kvb_close(c);
	return v;
}

static off_t log_size(void)
{
	struct stat st;

	return stat(bk->log, &st) ? 0 : st.st_size;
}

/* Does the broker log, from offset from on, contain text? */
static int log_has_since(off_t from, const char *text)
{
	char line[1024];
	FILE *f = fopen(bk->log, "re");
	int found = 0;

	if (!f)
		return 0;
	fseeko(f, from, SEEK_SET);
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, text) != NULL;
	fclose(f);
	return found;
}

/* The number of pages of the broker's "adopt: N pages (...)" line after offset from. */
static int log_pages_adopted(off_t from, unsigned long long *pages)
{
	char line[1024];
	FILE *f = fopen(bk->log, "re");
	int found = 0;

	if (!f)
		return 0;
	fseeko(f, from, SEEK_SET);
	while (!found && fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "adopt: ");

		int n = 0;

		found = p && sscanf(p, "adopt: %llu pages (%n", pages, &n) == 1 && n > 0;
	}
	fclose(f);
	return found;
}

/*
 * The broker again, on the same socket with the same flags, its log appended to the first
 * one's (harness_fail dumps it; the harness stops the broker at exit through bk->pid).
 */
static void spawn(void)
{
	pid_t parent = getpid(), pid;
	const char *argv[48];
	int a = 0;

	argv[a++] = brokerd;
	argv[a++] = "--socket";
	argv[a++] = sh->sock;
	for (int i = 0; i < nbargs; i++)
		argv[a++] = bargs[i];
	argv[a] = NULL;
	fflush(stdout);
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		int fd = open(bk->log, O_WRONLY | O_APPEND | O_CLOEXEC);

		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (getppid() != parent || fd < 0)
			_exit(127);
		dup2(fd, 1);
		dup2(fd, 2);
		execv(brokerd, (char *const *)(uintptr_t)argv);
		_exit(127);
	}
	bk->pid = pid;
}

/*
 * A successor that refuses to start because the lock file of a broker this test killed and
 * reaped is still locked: a child the dead broker forked (keeper.c, keeper_spawn, while it
 * replaced a keeper) holds a copy of the lock's fd until it execs. Counted, and started again.
 */
static int lock_outlived(off_t from)
{
	char line[1024];
	FILE *f = fopen(bk->log, "re");
	int found = 0;

	if (!f)
		return 0;
	fseeko(f, from, SEEK_SET);
	while (!found && fgets(line, sizeof(line), f)) {
		const char *p = strstr(line, "another kvbrokerd owns it (lock file ");
		int pid = 0;

		p = p ? strstr(p, ", pid ") : NULL;
		found = p && sscanf(p, ", pid %d)", &pid) == 1 && pid > 0 && kill(pid, 0) < 0 &&
			errno == ESRCH;
	}
	fclose(f);
	return found;
}

/* Starts the broker again and waits until it answers; returns how often it refused first. */
static int restart(void)
{
	uint64_t t0 = harness_now_ms();
	int rc = -1, refused = 0;
	off_t off = log_size();

	spawn();
	while (harness_now_ms() - t0 < 60000) {
		kvb_client *c = NULL;

		if (waitpid(bk->pid, &bk->status, WNOHANG) == bk->pid) {
			bk->pid = 0;
			CHECKF(WIFEXITED(bk->status) && WEXITSTATUS(bk->status) == 1 &&
				       lock_outlived(off) && ++refused < 50,
			       "the restarted kvbrokerd exited during start-up: status 0x%x",
			       bk->status);
			rel_sleep_ms(10);
			off = log_size();
			spawn();
			continue;
		}
		rc = control_connect(&c);
		if (rc == 0) {
			kvb_close(c);
			break;
		}
		rel_sleep_ms(5);
	}
	CHECKF(rc == 0, "the restarted kvbrokerd was not ready in 60 s: %d (%s)", rc,
	       harness_strerror(rc));
	return refused;
}

/* ---- the check after each restart ---- */

struct tally {
	uint64_t gets, served, gone, infl, infl_served, lookup_lost, refetched;
};

/* The checker's client, and what it knows of this round. */
struct checker {
	kvb_client *c;
	uint32_t ns[2];
	uint8_t *reg, *priv, *want;
	uint8_t cut[2][NIDS]; /* PUTs cut by the kill */
	uint64_t loss0;	      /* losses() before the LOOKUP */
	struct tally *t;
};

static uint64_t stat1(kvb_client *c, const char *path)
{
	char *j = harness_stats(c);
	uint64_t v = harness_stat_u64(j, path);

	free(j);
	return v;
}

/* Broker counters that rise whenever a page it had can no longer be served. */
static uint64_t losses(kvb_client *c)
{
	static const char *const path[] = {
		"counters.evictions", "disk.dropped",	     "disk.errors",	"disk.corrupt",
		"disk.torn",	      "remote.fetch_misses", "remote.timeouts", "remote.corrupt",
		"remote.unreachable", "remote.busy",
	};
	char *j = harness_stats(c);
	uint64_t n = 0;

	for (size_t i = 0; i < sizeof(path) / sizeof(path[0]); i++)
		if (harness_stat_has(j, path[i]))
			n += harness_stat_u64(j, path[i]);
	free(j);
	return n;
}

/*
 * GET of key id in namespace s, which the LOOKUP just before placed in tier (KVB_TIER_NONE:
 * nowhere): a miss, or exactly its page; a LOOKUP hit then missed only with a loss counted.
 */
static void check_key(struct checker *ck, int s, int id, uint8_t tier)
{
	int st = sh->st[s][id], chain = id / CH, page = id % CH, rc;
	uint8_t *dst = id % 2 ? ck->reg : ck->priv;
	const char *mem = id % 2 ? "registered" : "private";
	uint64_t fetches0 = tier == KVB_TIER_REMOTE ? stat1(ck->c, "remote.fetches") : 0;
	char why[WHY];

	CHECKF(tier == KVB_TIER_NONE || (st & ST_STARTED),
	       "round %u: LOOKUP finds key %d (chain %d page %d) in namespace %c (tier %u), where "
	       "nobody PUT it",
	       sh->round, id, chain, page, 'A' + s, tier);
	memset(dst, 0xee, page_len[s]);
	rc = kvb_get(ck->c, ck->ns[s], keys[id], dst, page_len[s]);
	ck->t->gets++;
	ck->t->infl += ck->cut[s][id];
	if (rc == -ENOENT && tier == KVB_TIER_REMOTE &&
	    stat1(ck->c, "remote.fetches") == fetches0) {
		/*
		 * Found in the remote tier, missed without asking it: the broker had no free RAM
		 * slot to fetch into while the pool's evictions were demotions in flight
		 * (remote.c, remote_promote; a promotion from disk waits there instead). Asked
		 * again once they landed, the GET must serve the page.
		 */
		for (int i = 0; i < 100 && rc == -ENOENT; i++) {
			rel_sleep_ms(5);
			rc = kvb_get(ck->c, ck->ns[s], keys[id], dst, page_len[s]);
		}
		CHECKF(rc != -ENOENT || losses(ck->c) > ck->loss0,
		       "round %u: LOOKUP finds key %d (chain %d page %d) of namespace %c in the "
		       "remote tier, 101 GETs in 0.5 s miss it, and the broker lost nothing",
		       sh->round, id, chain, page, 'A' + s);
		ck->t->refetched += rc != -ENOENT;
	} else if (rc == -ENOENT && tier != KVB_TIER_NONE) {
		CHECKF(losses(ck->c) > ck->loss0,
		       "round %u: LOOKUP finds key %d (chain %d page %d) of namespace %c in tier "
		       "%u, the GET right after misses, and the broker evicted, dropped or lost "
		       "nothing",
		       sh->round, id, chain, page, 'A' + s, tier);
		ck->t->lookup_lost++;
	}
	if (rc == -ENOENT) {
		ck->t->gone += (st & ST_DONE) != 0;
		return;
	}
	CHECKF(rc == (int)page_len[s], "round %u: GET of key %d in namespace %c: %d (%s)",
	       sh->round, id, 'A' + s, rc, harness_strerror(rc));
	if (!(st & ST_STARTED)) {
		whose(dst, 0, why, sizeof(why));
		harness_fail(__FILE__, __LINE__,
			     "round %u: a phantom: GET serves key %d (chain %d page %d) in "
			     "namespace %c, where nobody PUT it; it holds %s",
			     sh->round, id, chain, page, 'A' + s, why);
	}
	if (page_ok(dst, page_len[s], s, &keys[id], ck->want, why, sizeof(why)))
		harness_fail(__FILE__, __LINE__,
			     "round %u: wrong bytes: GET of key %d (chain %d page %d, %s) in "
			     "namespace %c into %s memory: %s",
			     sh->round, id, chain, page,
			     st & ST_DONE ? "its PUT returned" : "its PUT was cut by the kill",
			     'A' + s, mem, why);
	ck->t->served++;
	ck->t->infl_served += ck->cut[s][id];
}

/*
 * Every key of the model in both namespaces, with the clients gone: a LOOKUP of its chain
 * (tiers), then a GET of each key into private or registered memory poisoned first. Fails the
 * test at the first violation, naming whose bytes were served.
 */
static void verify_model(struct tally *t)
{
	struct kvb_opts o = {.socket_path = sh->sock, .name = "crash-check"};
	static uint8_t priv[BIG], want[BIG];
	static struct checker ck;
	uint32_t bid;

	memset(&ck, 0, sizeof(ck));
	ck.t = t;
	ck.priv = priv;
	ck.want = want;
	for (uint32_t i = 0; i < sh->ninfl && i < MAXINFL; i++)
		ck.cut[sh->infl[i] >> 15][sh->infl[i] & 0x7fff] = 1;
	CHECK_OK(kvb_connect(&o, &ck.c));
	for (int s = 0; s < 2; s++)
		CHECK_OK(kvb_ns_open(ck.c, &lay[s], &ck.ns[s], NULL));
	ck.reg = kvb_buf_alloc_host(ck.c, BIG, &bid);
	CHECK(ck.reg != NULL);
	for (int s = 0; s < 2; s++) {
		for (int chain = 0; chain < NCHT; chain++) {
			uint8_t tiers[CH];
			size_t hits;

			ck.loss0 = losses(ck.c);
			CHECK_OK(kvb_lookup_tiers(ck.c, ck.ns[s], &keys[chain * CH], CH, &hits,
						  tiers));
			for (int j = 0; j < CH; j++)
				check_key(&ck, s, chain * CH + j, tiers[j]);
		}
	}
	kvb_close(ck.c);
}

/* ---- the rounds ---- */

/* Fails the test when a client exited before its time (it printed why); leaves it to reap. */
static void clients_alive(const pid_t *pids, int round)
{
	for (int i = 0; i < NCLI; i++) {
		siginfo_t si = {0};

		if (waitid(P_PID, (id_t)pids[i], &si, WEXITED | WNOHANG | WNOWAIT) == 0 &&
		    si.si_pid == pids[i])
			harness_fail(__FILE__, __LINE__,
				     "round %d: client %d ended early (status %d, its lines above)",
				     round, i, si.si_status);
	}
}

int main(int argc, char **argv)
{
	int rounds = (int)rel_pick(3, 20, 1000), disk, remote, done = 0;
	int bkills = 0, kkills = 0, skills = 0, adopted = 0, warm = 0, refusals = 0,
	    keeper_lost = 0;
	unsigned budget = rel_scale() == REL_FULL ? rel_soak_seconds(600) : 0;
	uint64_t adopted_pages = 0, t_start, max_restart = 0, cut = 0;
	struct tally t = {0};
	char tmp[PATH_MAX], url[128], tmo[16], leases[160], *d;
	const char *env;
	pid_t pids[NCLI];

	harness_init(argc, argv);
	rel_deadline(budget ? budget + 300 : 110);
	sh = harness_shared(sizeof(*sh));
	env = getenv("KVB_CRASH_SEED");
	sh->seed = env && *env ? strtoull(env, NULL, 0)
			       : mix(harness_now_ns() ^ (uint64_t)getpid() << 32) & 0xffffffffffull;
	env = getenv("KVB_CRASH_LEASES");
	sh->leases = !(env && !strcmp(env, "0"));
	harness_log("seed %#llx (KVB_CRASH_SEED=%#llx replays these choices); leases held across "
		    "the crash: %s",
		    (unsigned long long)sh->seed, (unsigned long long)sh->seed,
		    sh->leases ? "yes" : "no (KVB_CRASH_LEASES=0)");
	harness_gate_init(&sh->ready);
	harness_gate_init(&sh->go);
	harness_layout(&lay[0], "test/crash-a", KVB_LAYOUT_MLA, TPP, 1, 0, 4, BIG / TPP / 4);
	harness_layout(&lay[1], "test/crash-b", KVB_LAYOUT_MLA, TPP, 1, 0, 5, SMALL / TPP / 5);
	for (int chain = 0; chain < NCHT; chain++)
		harness_key_chain(&keys[chain * CH], CH, TPP, sh->seed * 1000 + (uint64_t)chain);

	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	d = dirname(tmp);
	snprintf(brokerd, sizeof(brokerd), "%s/../bin/kvbrokerd", d);
	if (getenv("KVB_BROKERD"))
		snprintf(brokerd, sizeof(brokerd), "%s", getenv("KVB_BROKERD"));
	bargs[nbargs++] = "--pool";
	bargs[nbargs++] = "16M";
	bargs[nbargs++] = "--slab";
	bargs[nbargs++] = "1M";
	disk = have_io_uring();
	if (disk) {
		/* Next to the binary: the real file system, where /tmp may be tmpfs. */
		snprintf(cache, sizeof(cache), "%s/t_rel_crash.%d.cache", d, (int)getpid());
		atexit(remove_cache);
		bargs[nbargs++] = "--disk";
		bargs[nbargs++] = cache;
		bargs[nbargs++] = "--disk-size";
		bargs[nbargs++] = "24M";
	} else {
		harness_log("io_uring is unavailable here: the disk tier is left out");
	}
	remote = !system("redis-server --version >/dev/null 2>&1");
	if (remote) {
		rt_cluster_start();
		snprintf(url, sizeof(url), "redis://%s:%u", rt.n[0].addr, rt.n[0].port);
		snprintf(tmo, sizeof(tmo), "%d", rt.tmo);
		bargs[nbargs++] = "--remote";
		bargs[nbargs++] = url;
		bargs[nbargs++] = "--remote-timeout";
		bargs[nbargs++] = tmo;
		bargs[nbargs++] = "--remote-prefix";
		bargs[nbargs++] = "crash:";
		harness_log("remote tier: a Redis Cluster on ports %u %u %u", rt.n[0].port,
			    rt.n[1].port, rt.n[2].port);
	} else {
		harness_log("redis-server is not installed: the remote tier is left out "
			    "(tools/deps.sh installs it)");
	}
	bargs[nbargs] = NULL;
	bk = harness_broker_startv(bargs);
	snprintf(sh->sock, sizeof(sh->sock), "%s", bk->sock);
	if (remote) {
		kvb_client *c = harness_connect(bk, "crash-wait", 0);

		CHECK_EQ(harness_stat_wait(c, "remote.shards_reachable", RT_NODES, 10000),
			 RT_NODES);
		kvb_close(c);
	}

	t_start = harness_now_ms();
	for (int r = 0; r < rounds; r++) {
		uint64_t rs = mix(sh->seed + (uint64_t)r) | 1, delay, t0, tr, ops0[NCLI];
		int keeper = r % 4 == 2, again = r % 5 == 1; /* each once in 3 rounds */
		int keepers = -1, st[NCLI], adopt, refused;
		unsigned long long pages = 0;
		pid_t kp = 0;
		off_t off, off0 = log_size();

		if (budget && harness_now_ms() - t_start > (uint64_t)budget * 1000) {
			harness_log("the soak's %u s are over after %d rounds", budget, r);
			break;
		}
		sh->rseed = rnd(&rs);
		sh->round = (uint32_t)r;
		sh->phase = PH_RUN;
		sh->killing = sh->dead = sh->up = sh->filled = 0;
		sh->ninfl = 0;
		delay = 80 + rnd(&rs) % 420;
		for (int i = 0; i < NCLI; i++) {
			sh->ops[i] = 0;
			pids[i] = harness_fork(client, i, NULL);
		}
		for (int i = 0; i < NCLI; i++)
			harness_gate_wait(&sh->ready, 30000);
		harness_gate_open(&sh->go, NCLI);
		rel_sleep_ms((unsigned)delay);
		clients_alive(pids, r);

		if (keeper) {
			kp = (pid_t)stat_now("pool.keeper_pid");
			if (kp > 0) {
				kill(kp, SIGKILL);
				kkills++;
				rel_sleep_ms((unsigned)(rnd(&rs) % 200));
				keepers = harness_keepers(sh->sock);
			}
		}
		sh->killing = 1;
		rel_kill(bk->pid);
		bk->pid = 0;
		sh->dead = 1;
		bkills++;
		tr = harness_now_ms();
		if (again) { /* its successor too, while it starts: adopts, scans, or serves */
			spawn();
			rel_sleep_ms((unsigned)(rnd(&rs) % 80));
			rel_kill(bk->pid);
			bk->pid = 0;
			skills++;
		}
		off = log_size();
		refused = restart();
		refusals += refused;
		keeper_lost += log_has_since(off0, "another keeper answers");
		tr = harness_now_ms() - tr;
		max_restart = tr > max_restart ? tr : max_restart;
		sh->up = 1;
		adopt = log_has_since(off, "adopt: ");
		adopted += adopt;
		if (adopt && log_pages_adopted(off, &pages))
			adopted_pages += pages;
		warm += log_has_since(off, "disk: warm restart");
		harness_log(
			"round %d: %s after %llu ms%s; %u PUTs cut; restarted in %llu ms%s%s, %s",
			r, kp > 0 ? "keeper and broker SIGKILLed" : "broker SIGKILLed",
			(unsigned long long)delay,
			kp <= 0	      ? ""
			: keepers > 0 ? " (a new keeper ran at the broker's kill)"
				      : " (no keeper ran at the broker's kill)",
			(unsigned)sh->ninfl, (unsigned long long)tr,
			again ? " (its first successor SIGKILLed while starting)" : "",
			refused ? " (refused first: the dead broker's lock was still held)" : "",
			adopt ? "the pool adopted" : "a new pool");

		/* The clients run on against the new broker a little, then fill its pool. */
		for (int i = 0; i < NCLI; i++)
			ops0[i] = sh->ops[i];
		t0 = harness_now_ms();
		for (int i = 0; i < NCLI; i++) {
			while (sh->ops[i] < ops0[i] + 10 && harness_now_ms() - t0 < 30000) {
				clients_alive(pids, r);
				rel_sleep_ms(1);
			}
			CHECKF(sh->ops[i] >= ops0[i] + 10,
			       "round %d: client %d made %llu calls in 30 s after the restart", r,
			       i, (unsigned long long)(sh->ops[i] - ops0[i]));
		}
		sh->phase = PH_FILL;
		while (sh->filled < NCLI && harness_now_ms() - t0 < 60000) {
			clients_alive(pids, r);
			rel_sleep_ms(2);
		}
		CHECKF(sh->filled == NCLI, "round %d: %d of %d clients filled the pool in 60 s", r,
		       sh->filled, NCLI);
		sh->phase = PH_CHECK;
		CHECK_EQ(harness_wait(pids, NCLI, 30000, st), 0);
		CHECKF(sh->errors == 0 && sh->wrong == 0 && sh->phantom == 0 &&
			       sh->lease_live_bad == 0,
		       "round %d: %llu errors, %llu wrong pages, %llu phantoms, %llu leases wrong "
		       "before the crash, in the clients (their lines above)",
		       r, (unsigned long long)sh->errors, (unsigned long long)sh->wrong,
		       (unsigned long long)sh->phantom, (unsigned long long)sh->lease_live_bad);
		cut += sh->ninfl;
		verify_model(&t);
		CHECKF(harness_broker_alive(bk), "round %d: the broker died during the checks", r);
		if (sh->lease_bad[0] + sh->lease_bad[1] + sh->lease_bad[2]) {
			for (int cp = 0; cp < LC_N; cp++)
				printf("leases held across the crash, read %s: %llu of %llu "
				       "wrong%s%s\n",
				       lc_name[cp], (unsigned long long)sh->lease_bad[cp],
				       (unsigned long long)sh->lease_checks[cp],
				       sh->lease_bad[cp] ? "; the first: " : "",
				       sh->lease_first[cp]);
			harness_fail(__FILE__, __LINE__,
				     "round %d: leases held across the crash did not keep their "
				     "pages' bytes (above; KVB_CRASH_LEASES=0 leaves them out)",
				     r);
		}
		done++;
	}
	harness_broker_stop(bk);
	for (int i = 0; i < 200 && harness_keepers(sh->sock); i++)
		rel_sleep_ms(10);
	CHECK_EQ(harness_keepers(sh->sock), 0);
	if (sh->leases)
		snprintf(leases, sizeof(leases),
			 "%llu leases held across a kill, read %llu times after it, 0 wrong",
			 (unsigned long long)sh->held_at_kill,
			 (unsigned long long)(sh->lease_checks[0] + sh->lease_checks[1] +
					      sh->lease_checks[2]));
	else
		snprintf(leases, sizeof(leases),
			 "no lease held across a kill (KVB_CRASH_LEASES=0)");
	rel_figure("%d rounds, %d broker SIGKILLs (%d after a SIGKILL of its keeper, %d more of "
		   "a successor while it started), tiers RAM%s%s; %llu PUTs returned, %llu cut by "
		   "a kill; after the restarts %llu GETs of the model: %llu pages byte-exact, %llu "
		   "gone, 0 wrong, 0 phantom; %llu keys whose PUT a kill cut: %llu byte-exact, the "
		   "rest absent; clients verified %llu reads, 0 wrong, 0 phantom; %llu LOOKUP hits "
		   "then GET misses, each with a loss counted, %llu more served by a second GET "
		   "(remote fetch, pool full); pool adopted %d times (%llu pages), disk warm %d "
		   "times, slowest restart %llu ms; a killed keeper not replaced %d times (another "
		   "keeper answers), a successor refused %d times (the dead broker's lock still "
		   "held); %s",
		   done, bkills, kkills, skills, disk ? "+disk" : "", remote ? "+remote" : "",
		   (unsigned long long)sh->puts, (unsigned long long)cut,
		   (unsigned long long)t.gets, (unsigned long long)t.served,
		   (unsigned long long)t.gone, (unsigned long long)t.infl,
		   (unsigned long long)t.infl_served, (unsigned long long)sh->verified,
		   (unsigned long long)t.lookup_lost, (unsigned long long)t.refetched, adopted,
		   (unsigned long long)adopted_pages, warm, (unsigned long long)max_restart,
		   keeper_lost, refusals, leases);
	if (remote)
		rt_redis_kill_all();
	return H_PASS;
}
