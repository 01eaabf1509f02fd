// SPDX-License-Identifier: MIT
/*
 * remote.c - the remote tier: pages computed on one node serve every node, through a
 * distributed store reached by a backend ([remote-seam], remote.h; remote_redis.c for Redis
 * Cluster). Engines only ever talk to their local broker; brokers talk to the store.
 *
 * Names and values. A page is stored under prefix + hex(namespace identity) + ":" + hex(key):
 * the identity (ns.c) is the same on every node for the same model, layout and tenant, and the
 * key is the engine's content hash, so equal names mean equal bytes. No hash tags: pages spread
 * over every shard by the key's own slot. A value is a header that names the page again
 * (remote_value.c: magic, format version, namespace identity, key, page length, crc32c of the
 * page and of the header) followed by the page: a value copied or swapped onto another name,
 * which anyone who can write to the store can do, is intact but not the page asked for.
 *
 * Publish (at PUT, or at first reuse). When a PUT commits a page it stored (not a dedup), the
 * page is published with SET NX: the first node's copy wins, a second one is answered "exists"
 * and stores nothing. A page is published at most once from a node: pages fetched from the
 * store are never published, and a small table of the keys published (PUB_FP slots, direct
 * mapped) keeps a page evicted and PUT again from being sent twice. Why at PUT by default: in a
 * fleet behind a router the next request for a prefix often lands on another node right away,
 * and the page is hottest (in cache, just written) then; the cost is the bandwidth of pages
 * nobody reuses, and on a small machine the PUT rate (docs/benchmarks.md). --remote-publish
 * reuse publishes instead at a page's first GET or ACQUIRE hit on this node (remote_on_hit;
 * a page promoted from disk counts, it was this node's own): PUTs then cost nothing more, and
 * only pages reused cross the network. --remote-publish evict publishes a page as it leaves
 * RAM (dropped or demoted to disk: the store's leaving hook, on_leaving), at once, since its
 * bytes are gone by the next round: only pages that lived their time here cross the network,
 * and the cost moves to the allocation that evicted them. --remote-publish never makes a node
 * a reader only. The value
 * is copied into the request when it is sent, so nothing stays pinned. Publishes go through a
 * bounded queue (by key: a page evicted meanwhile is skipped; REMOTE_PG_QUEUED keeps a page
 * hit again from being queued twice), drained after each loop round (so the op's completion is
 * posted before the page is checksummed and copied) while --remote-inflight allows. A publish
 * answered with a redirection (MOVED, ASK: its slot moved, or is moving, during a reshard)
 * goes back into that queue once, with the backend's route to the new owner, and is sent again
 * from the page in RAM; redirected again, or its page gone meanwhile, it is counted lost
 * (publish_lost): that page is not shared, nothing worse.
 *
 * Fetch (GET, ACQUIRE, PREFETCH that missed in RAM and on disk). As a promotion from disk
 * (tier.c): a RAM slot is allocated WRITING (never served), the op parks on it (pg->waiters),
 * and ops for the same key join it. The backend lands the value in place (c->dst: the slot
 * itself, no whole-value buffer in between) and the crc32c is computed piece by piece as the
 * bytes land, while they are in the cache (remote_call_landed); a reply it could not land is
 * copied into the slot and checked there. Either way the check (header, length, crc32c of the
 * bytes as they are in the slot) comes before the commit; anything else aborts the slot: a
 * miss, never a wrong page. A landing value's header is checked as it lands, before its page:
 * one of another key or namespace (wrong_key) or of another format version (other_version)
 * lands nothing at all (remote_call_header); one whose bytes do not check counts corrupt. The
 * GET that issued the fetch, when its destination is a plain registered host buffer
 * (c->mdst), gets each piece copied there too as it lands, while the piece is in the cache
 * from the kernel's copy: once the check passed it completes with no copy of its own and no
 * hand-off to a copy worker (op->rfilled). Its completion still comes only after the check,
 * so nothing unchecked is ever reported as a page; a miss whose page fails its crc may leave
 * bytes in that destination (kvb_get's dst is unspecified after -ENOENT, kvbroker.h). Views,
 * GPU and fd buffers, ACQUIRE, PREFETCH and the ops that joined a fetch copy after the commit
 * as any hit; a GET that ends first (its client died) detaches, and nothing lands there
 * after. Each fetch has a deadline (--remote-timeout): past it the slot is aborted and the ops
 * miss; a reply that comes later finds its call settled and is dropped. An op asks
 * the store once (op->remote): run again after a failed fetch, it misses.
 *
 * Lookup. A LOOKUP first answers from RAM and disk; the keys it found nowhere (at most
 * REMOTE_LOOKUP_MAX of them) are asked of the store (EXISTS), the op parks until every answer
 * or its deadline, and the keys found are reported KVB_TIER_REMOTE. Only keys that missed
 * locally cross the network, so a local hit never waits for the cluster.
 *
 * Faults. The backend knows its shards: one that refuses, resets or stalls is backed off
 * (its slots are misses at once, without waiting for a deadline) and retried later; the tier
 * just sees -EHOSTUNREACH for those keys. Loop thread only.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "fastcopy.h"
#include "log.h"
#include "remote.h"
#include "slot.h"

#define REMOTE_LOOKUP_MAX 1024 /* keys of one LOOKUP asked of the store */
#define PUBQ_CAP 4096	       /* publishes waiting for room on the wire */
#define PUB_FP (1u << 16)      /* keys remembered as published */
#define TICK_GAP 0.001	       /* seconds between two full upkeeps while busy */
#define IDLE_SLEEP_MS 100      /* the longest sleep while the tier is on (reconnects) */

/* A LOOKUP's questions: the op holds one reference, each call in flight one. */
struct remote_lq {
	uint32_t refs;
	uint32_t pending; /* calls not settled */
	uint32_t n;	  /* keys asked */
	uint32_t end;	  /* the first key after idx[n - 1] that was NONE and not asked, or count */
	struct op *op;	  /* NULL once the op ended */
	struct waitq wq;
	uint32_t *idx;	/* which keys of the LOOKUP */
	uint8_t *found; /* the answer per key asked */
};

struct pubq_ent {
	uint32_t ns;
	uint32_t route; /* a redirected publish's one resend: where to (0: the slot map) */
	kvb_key key;
};

struct remote_stats {
	uint64_t lookups, lookup_found, fetches, fetched, fetched_in_place, fetched_direct,
		fetch_misses, fetch_bytes, corrupt, wrong_key, other_version, timeouts, errors,
		unreachable, busy, published, existed, publish_bytes, publish_queued,
		publish_dropped, publish_skipped, publish_redirected, publish_resent, publish_lost;
};

struct remote {
	struct broker *b;
	const struct remote_backend *be_ops;
	void *be;
	struct remote_cfg cfg;
	char url[256];
	struct list calls; /* lookups and fetches in flight, oldest (earliest deadline) first */
	uint64_t inflight; /* bytes of values on the wire, both ways */
	uint32_t ncalls;   /* every call in flight, publishes included */
	struct pubq_ent *pubq;
	uint32_t pq_head, pq_len;
	uint64_t *pub_fp;
	double tick_at;
	struct remote_stats st;
	struct log_throttle lt_corrupt, lt_wrong, lt_version, lt_err;
};

static const char *const publish_name[] = {"put", "never", "reuse",
					   "evict"}; /* enum remote_publish */

/* ---- names and values ---- */

static void hex(char *out, const uint8_t *p, size_t n)
{
	static const char d[] = "0123456789abcdef";

	for (size_t i = 0; i < n; i++) {
		out[2 * i] = d[p[i] >> 4];
		out[2 * i + 1] = d[p[i] & 15];
	}
}

/* The store's name of (n, key) into c->key. */
static void make_key(const struct remote *r, const struct ns *n, const kvb_key *key,
		     struct remote_call *c)
{
	size_t pl = strlen(r->cfg.prefix);

	memcpy(c->key, r->cfg.prefix, pl);
	hex(c->key + pl, n->ident, sizeof(n->ident));
	c->key[pl + 2 * sizeof(n->ident)] = ':';
	hex(c->key + pl + 2 * sizeof(n->ident) + 1, key->b, sizeof(key->b));
	c->klen = (uint32_t)(pl + 2 * sizeof(n->ident) + 1 + 2 * sizeof(key->b));
}

/* A 64-bit digest of (identity, key), never 0 (an empty slot): every key byte counts. */
static uint64_t fp_of(const struct ns *n, const kvb_key *key)
{
	uint64_t h, w;

	memcpy(&h, n->ident, sizeof(h));
	for (size_t i = 0; i < sizeof(key->b); i += sizeof(w)) {
		memcpy(&w, key->b + i, sizeof(w));
		h = (h ^ w) * 0x9e3779b97f4a7c15ull;
		h ^= h >> 29;
	}
	return h ? h : 1;
}

/* ---- calls ---- */

static struct remote_call *call_new(struct remote *r, int kind)
{
	struct remote_call *c = calloc(1, sizeof(*c));

	if (!c)
		return NULL;
	c->r = r;
	c->kind = (uint8_t)kind;
	list_init(&c->link);
	list_init(&c->blink);
	c->deadline = clock_now() + r->cfg.timeout;
	return c;
}

static void lq_put(struct remote_lq *lq)
{
	if (--lq->refs)
		return;
	free(lq);
}

/* The GET whose destination fetch c also fills lets go of it: nothing lands there after. */
static void mirror_detach(struct remote_call *c)
{
	if (c->mop)
		c->mop->rcall = NULL;
	c->mop = NULL;
	c->mdst = NULL;
}

/*
 * The verdict on fetch c's value (res > 0): the header against what c asked for, then the page
 * as it is in the slot. A value that landed in place was checksummed as it landed; one the
 * backend could not land (it came behind others) is copied into the slot once its header
 * checks, and checksummed there: what is served is what was checked.
 */
static enum remote_verdict fetch_verdict(struct remote *r, struct remote_call *c, struct page *pg,
					 const void *val, size_t len)
{
	enum remote_verdict v;
	uint8_t *dst;

	if (c->verdict)
		return (enum remote_verdict)c->verdict; /* refused as its header landed */
	if (c->landed) {
		v = remote_value_check(&c->vhdr, len, c->ident, &c->pkey, c->page_bytes);
		if (v == REMOTE_VALUE_OK && (c->got != c->page_bytes || c->crc != c->vhdr.crc))
			v = REMOTE_VALUE_CORRUPT;
		return v;
	}
	if (!val || len < sizeof(c->vhdr))
		return REMOTE_VALUE_CORRUPT;
	memcpy(&c->vhdr, val, sizeof(c->vhdr));
	v = remote_value_check(&c->vhdr, len, c->ident, &c->pkey, c->page_bytes);
	if (v != REMOTE_VALUE_OK)
		return v;
	dst = store_addr(&r->b->store, pg);
	memcpy(dst, (const uint8_t *)val + sizeof(c->vhdr), c->page_bytes);
	return slot_crc32c(dst, c->page_bytes) == c->vhdr.crc ? REMOTE_VALUE_OK
							      : REMOTE_VALUE_CORRUPT;
}

/* A value refused: counted by why, logged (rate-limited), never served. */
static void fetch_refused(struct remote *r, const struct remote_call *c, enum remote_verdict v,
			  size_t len)
{
	switch (v) {
	case REMOTE_VALUE_WRONG_KEY:
		r->st.wrong_key++;
		log_throttled(&r->lt_wrong,
			      "remote: %.*s...: the value is another key's or namespace's (moved "
			      "or copied in the store): not served",
			      24, c->key);
		break;
	case REMOTE_VALUE_OTHER_VERSION:
		r->st.other_version++;
		log_throttled(&r->lt_version,
			      "remote: %.*s...: a value of another format version (%u; this "
			      "broker's is %u): ignored",
			      24, c->key, c->vhdr.version, REMOTE_VERSION);
		break;
	default:
		r->st.corrupt++;
		log_throttled(&r->lt_corrupt,
			      "remote: %.*s...: damaged value (%zu bytes): not served", 24, c->key,
			      len);
		break;
	}
}

/* A fetch's outcome: the page committed when the value checks, else aborted (a miss). */
static void fetch_settle(struct remote *r, struct remote_call *c, int res, const void *val,
			 size_t len)
{
	struct store *s = &r->b->store;
	struct page *pg = c->pg;
	struct op *mop = c->mop;
	uint8_t *mdst = c->mdst;
	int ok = 0;

	c->pg = NULL;
	c->dst = NULL; /* the backend lands nothing more in the slot, whatever comes */
	mirror_detach(c);
	pg->rflags &= (uint8_t)~REMOTE_PG_FETCHING;
	if (res > 0) {
		enum remote_verdict v = fetch_verdict(r, c, pg, val, len);

		ok = v == REMOTE_VALUE_OK;
		if (!ok)
			fetch_refused(r, c, v, len);
	} else if (res == 0) {
		r->st.fetch_misses++;
	}
	if (ok) {
		pg->rflags |= REMOTE_PG_PUBLISHED; /* it came from there: never sent back */
		/*
		 * Every byte that landed in the slot went to the issuing GET's destination as it
		 * landed: checked now, that GET completes with no copy of its own (ops.c).
		 */
		if (mop && mdst && c->landed) {
			mop->rfilled = 1;
			r->st.fetched_direct++;
		}
		store_commit(s, pg);
		r->st.fetched++;
		if (!r->b->obs.off && c->sent)
			hist_observe(&r->b->obs.h[HIST_FETCH], hist_bounds_of(HIST_FETCH),
				     clock_now() - c->sent);
		r->st.fetched_in_place += c->landed;
		r->st.fetch_bytes += c->page_bytes;
	} else if (pg->unlinked) {
		store_unpin(s, pg);
	} else {
		store_abort(s, pg); /* wakes the ops parked on it: they miss */
	}
}

static void lookup_settle(struct remote *r, struct remote_call *c, int res)
{
	struct remote_lq *lq = c->lq;

	lq->found[c->lq_idx] = res > 0;
	r->st.lookup_found += res > 0;
	if (!--lq->pending && lq->op)
		ops_wake(r->b, &lq->wq);
}

/*
 * A publish redirected (its slot moved): sent once more, from the page still in RAM, where
 * the backend says (through the queue, after this round: not from inside its reply). A
 * second redirection, a page gone meanwhile or a full queue: that page is not published.
 */
static void publish_redirected(struct remote *r, const struct remote_call *c)
{
	struct page *pg;

	r->st.publish_redirected++;
	pg = c->resend || !c->route || r->pq_len == PUBQ_CAP
		     ? NULL
		     : store_find(&r->b->store, c->pns, &c->pkey);
	if (!pg || pg->state != PAGE_READY) {
		r->st.publish_lost++;
		return;
	}
	pg->rflags |= REMOTE_PG_QUEUED;
	r->pubq[(r->pq_head + r->pq_len++) % PUBQ_CAP] = (struct pubq_ent){
		.ns = c->pns, .route = c->route, .key = c->pkey};
}

/* Applies an outcome once: the answer, or the deadline (-ETIMEDOUT) before it. */
static void settle(struct remote *r, struct remote_call *c, int res, const void *val, size_t len)
{
	if (c->settled)
		return;
	c->settled = 1;
	list_del(&c->link);
	if (res == REMOTE_REDIRECTED && c->kind == RC_PUBLISH) {
		publish_redirected(r, c);
		return;
	}
	if (res < 0 && c->kind == RC_PUBLISH && c->resend)
		r->st.publish_lost++; /* its one resend failed too */
	if (res < 0 && res != -EHOSTUNREACH && res != -ETIMEDOUT) {
		r->st.errors++;
		log_throttled(&r->lt_err, "remote: %s of %.*s...: %s",
			      c->kind == RC_PUBLISH ? "publish"
			      : c->kind == RC_FETCH ? "fetch"
						    : "lookup",
			      24, c->key, strerror(-res));
	} else if (res == -EHOSTUNREACH) {
		r->st.unreachable++;
	}
	switch (c->kind) {
	case RC_FETCH:
		fetch_settle(r, c, res, val, len);
		break;
	case RC_LOOKUP:
		lookup_settle(r, c, res);
		break;
	case RC_PUBLISH:
		if (res > 0)
			r->st.published++;
		else if (res == 0)
			r->st.existed++;
		break;
	}
}

int remote_call_header(struct remote_call *c)
{
	size_t len = sizeof(c->vhdr) + c->page_bytes;
	enum remote_verdict v = remote_value_check(&c->vhdr, len, c->ident, &c->pkey,
						   c->page_bytes);

	if (v == REMOTE_VALUE_OK)
		return 0;
	/* Settled now: its ops miss without waiting for a page that is not theirs. */
	c->verdict = (uint8_t)v;
	settle(c->r, c, 1, NULL, len);
	return -EBADMSG;
}

void remote_call_landed(struct remote_call *c, size_t n)
{
	c->crc = slot_crc32c_more(c->crc, c->dst + c->got, n);
	/* Still in the cache from the kernel's copy: the GET's copy costs no pass of its own. */
	if (c->mdst)
		kvb_copy(c->mdst + c->got, c->dst + c->got, n);
	c->got += n;
}

void remote_call_done(struct remote_call *c, int res, const void *val, size_t len)
{
	struct remote *r = c->r;

	r->inflight -= c->bytes;
	r->ncalls--;
	list_del(&c->blink);
	settle(r, c, res, val, len);
	if (c->lq)
		lq_put(c->lq);
	free(c->cmd);
	free(c);
}

/* Hands c to the backend; counted in flight when it took it. */
static int call_submit(struct remote *r, struct remote_call *c, const struct remote_hdr *h,
		       const void *page)
{
	int err;

	switch (c->kind) {
	case RC_LOOKUP:
		err = r->be_ops->lookup(r->be, c);
		break;
	case RC_FETCH:
		err = r->be_ops->fetch(r->be, c);
		break;
	default:
		err = r->be_ops->publish(r->be, c, h, page, (size_t)h->len);
		break;
	}
	if (err) {
		free(c->cmd);
		c->cmd = NULL;
		if (err == -EHOSTUNREACH)
			r->st.unreachable++;
		else
			r->st.errors++;
		return err;
	}
	r->inflight += c->bytes;
	r->ncalls++;
	if (c->kind != RC_PUBLISH)
		list_add_tail(&r->calls, &c->link);
	return 0;
}

/* ---- fetch ---- */

int remote_promote(struct broker *b, struct op *op, struct page *pg, uint8_t *dst)
{
	struct remote *r = b->remote;
	const struct ns *n = op->n;
	struct remote_call *c;
	int err;

	if (!r)
		return 0;
	if (pg) {
		/* WRITING: a fetch of ours is joined; a PUT's or a promotion's is not ours. */
		if (!(pg->rflags & REMOTE_PG_FETCHING) || op->remote)
			return 0;
		op->remote = 1;
		if (ops_park_page(b, op, pg, "a fetch from the remote tier") != OPS_DEFERRED) {
			op->cqe.res = 0;
			return 0;
		}
		return 1;
	}
	if (op->remote)
		return 0;
	op->remote = 1;
	if (r->inflight + n->page_bytes > r->cfg.max_inflight) {
		r->st.busy++;
		return 0;
	}
	c = call_new(r, RC_FETCH);
	if (!c)
		return 0;
	make_key(r, n, &op->key, c);
	memcpy(c->ident, n->ident, sizeof(c->ident));
	c->pkey = op->key;
	c->page_bytes = n->page_bytes;
	c->bytes = n->page_bytes + sizeof(struct remote_hdr);
	err = store_alloc(&b->store, n->cls, n->id, &op->key, &pg);
	if (err) {
		free(c);
		return 0; /* no RAM to fetch into: a miss */
	}
	c->pg = pg;
	c->dst = store_addr(&b->store, pg);
	r->st.fetches++;
	if (call_submit(r, c, NULL, NULL)) {
		store_abort(&b->store, pg);
		free(c);
		return 0;
	}
	pg->rflags |= REMOTE_PG_FETCHING;
	if (ops_park_page(b, op, pg, "a fetch from the remote tier") != OPS_DEFERRED) {
		op->cqe.res = 0; /* out of memory: this op misses; the fetch goes on */
		return 0;
	}
	if (dst) {
		c->mop = op;
		c->mdst = dst;
		op->rcall = c;
	}
	return 1;
}

/* ---- lookup ---- */

int remote_lookup(struct broker *b, struct op *op, const uint8_t *keys, const uint8_t *tiers,
		  uint32_t count)
{
	struct remote *r = b->remote;
	struct remote_lq *lq;
	uint32_t nq = 0, i;

	if (!r || op->remote)
		return 0;
	op->remote = 1;
	for (i = 0; i < count && nq < REMOTE_LOOKUP_MAX; i++)
		nq += tiers[i] == KVB_TIER_NONE;
	if (!nq)
		return 0;
	lq = calloc(1, sizeof(*lq) + nq * (sizeof(uint32_t) + 1));
	if (!lq)
		return 0;
	lq->idx = (uint32_t *)(lq + 1);
	lq->found = (uint8_t *)(lq->idx + nq);
	lq->refs = 1;
	lq->end = count;
	waitq_init(&lq->wq);
	for (i = 0; i < count; i++) {
		struct remote_call *c;

		if (tiers[i] != KVB_TIER_NONE)
			continue;
		if (lq->n == nq) {
			lq->end = i;
			break;
		}
		lq->idx[lq->n] = i;
		c = call_new(r, RC_LOOKUP);
		if (c) {
			kvb_key k;

			memcpy(k.b, keys + (uint64_t)i * sizeof(kvb_key), sizeof(k.b));
			make_key(r, op->n, &k, c);
			c->lq = lq;
			c->lq_idx = lq->n;
			r->st.lookups++;
			if (!call_submit(r, c, NULL, NULL)) {
				lq->refs++;
				lq->pending++;
			} else {
				c->lq = NULL;
				free(c);
			}
		}
		lq->n++;
	}
	if (!lq->pending) {
		free(lq);
		return 0;
	}
	lq->op = op;
	op->rlq = lq;
	ops_park(b, op, &lq->wq, "a lookup in the remote tier");
	return 1;
}

uint32_t remote_lookup_apply(struct broker *b, struct op *op, uint8_t *tiers, uint32_t lead)
{
	struct remote_lq *lq = op->rlq;
	int leading = lead == lq->idx[0];

	(void)b;
	/* Keys between two asked ones were found locally: a run of answers extends the lead. */
	for (uint32_t j = 0; j < lq->n; j++) {
		if (lq->found[j])
			tiers[lq->idx[j]] = KVB_TIER_REMOTE;
		if (leading && lq->found[j])
			lead = j + 1 < lq->n ? lq->idx[j + 1] : lq->end;
		else
			leading = 0;
	}
	remote_op_end(op);
	return lead;
}

void remote_op_end(struct op *op)
{
	struct remote_lq *lq = op->rlq;

	/* A GET ending (its client died, say) before its fetch did: its buffer is not ours. */
	if (op->rcall)
		mirror_detach(op->rcall);
	if (!lq)
		return;
	op->rlq = NULL;
	lq->op = NULL;
	lq_put(lq);
}

/* ---- publish ---- */

/*
 * Sends page pg of n (READY) with SET NX; route: the one resend of a redirected publish
 * (where to), 0 a first send. 0, or -errno when the backend refused it.
 */
static int publish_page(struct remote *r, const struct ns *n, struct page *pg, uint32_t route)
{
	struct remote_hdr h;
	const void *page = store_addr(&r->b->store, pg);
	uint64_t fp = fp_of(n, &pg->key);
	struct remote_call *c;
	int err;

	pg->rflags |= REMOTE_PG_PUBLISHED;
	if (!route && r->pub_fp[fp % PUB_FP] == fp) {
		r->st.publish_skipped++; /* sent before, evicted, PUT again: not twice */
		return 0;
	}
	c = call_new(r, RC_PUBLISH);
	if (!c)
		return -ENOMEM;
	make_key(r, n, &pg->key, c);
	c->pns = n->id;
	c->pkey = pg->key;
	c->route = route;
	c->resend = route != 0;
	remote_value_seal(&h, n->ident, &pg->key, n->page_bytes, slot_crc32c(page, n->page_bytes));
	c->bytes = n->page_bytes + sizeof(h);
	err = call_submit(r, c, &h, page);
	if (err) {
		r->st.publish_lost += route != 0;
		free(c);
		return err;
	}
	r->pub_fp[fp % PUB_FP] = fp;
	r->st.publish_bytes += n->page_bytes;
	r->st.publish_resent += route != 0;
	return 0;
}

/*
 * Queued, sent from remote_tick after this round: the op's completion is posted first, so the
 * checksum and the copy into the request never add to the PUT's (or the GET's) latency.
 */
static void pubq_add(struct remote *r, const struct ns *n, struct page *pg)
{
	if (pg->rflags & (REMOTE_PG_PUBLISHED | REMOTE_PG_QUEUED))
		return;
	if (r->pq_len == PUBQ_CAP) {
		r->st.publish_dropped++;
		return;
	}
	pg->rflags |= REMOTE_PG_QUEUED;
	r->pubq[(r->pq_head + r->pq_len++) % PUBQ_CAP] = (struct pubq_ent){
		.ns = n->id, .route = 0, .key = pg->key};
}

void remote_on_put(struct broker *b, const struct ns *n, struct page *pg)
{
	if (b->remote && b->remote->cfg.publish == REMOTE_PUB_PUT)
		pubq_add(b->remote, n, pg);
}

void remote_on_hit(struct broker *b, const struct ns *n, struct page *pg)
{
	/* A page fetched from the store is marked published: only this node's own are sent. */
	if (b->remote && b->remote->cfg.publish == REMOTE_PUB_REUSE)
		pubq_add(b->remote, n, pg);
}

/*
 * [store leaving] --remote-publish evict: page pg leaves RAM now (dropped, or demoted to disk),
 * its bytes still in the slot: sent at once (the copy into the request is made before this
 * returns), not queued, since the page is gone by the next round. Over --remote-inflight it
 * is not published (publish_dropped): eviction never waits for the network.
 */
static void on_leaving(void *arg, struct page *pg)
{
	struct broker *b = arg;
	struct remote *r = b->remote;
	const struct ns *n;

	if (!r || (pg->rflags & REMOTE_PG_PUBLISHED))
		return;
	n = ns_get(&b->nst, pg->ns);
	if (!n)
		return;
	if (r->inflight + n->page_bytes > r->cfg.max_inflight) {
		pg->rflags |= REMOTE_PG_PUBLISHED;
		r->st.publish_dropped++;
		return;
	}
	publish_page(r, n, pg, 0);
}

/* Publishes what waited while there is room on the wire; a page gone meanwhile is skipped. */
static uint32_t pubq_drain(struct remote *r)
{
	uint32_t n = 0;

	while (r->pq_len) {
		struct pubq_ent *e = &r->pubq[r->pq_head];
		const struct ns *ns = ns_get(&r->b->nst, e->ns);
		struct page *pg;

		if (ns && r->inflight + ns->page_bytes > r->cfg.max_inflight)
			break;
		r->pq_head = (r->pq_head + 1) % PUBQ_CAP;
		r->pq_len--;
		pg = ns ? store_find(&r->b->store, e->ns, &e->key) : NULL;
		if (pg)
			pg->rflags &= (uint8_t)~REMOTE_PG_QUEUED;
		if (!pg || pg->state != PAGE_READY ||
		    (!e->route && (pg->rflags & REMOTE_PG_PUBLISHED))) {
			/* A resend whose page went is lost; a first send's, dropped. */
			if (!pg || pg->state != PAGE_READY) {
				r->st.publish_dropped += !e->route;
				r->st.publish_lost += e->route != 0;
			}
			continue;
		}
		if (r->inflight)
			r->st.publish_queued++; /* it waited for room, or behind others */
		publish_page(r, ns, pg, e->route);
		n++;
	}
	return n;
}

/* ---- upkeep ---- */

uint32_t remote_tick(struct broker *b)
{
	struct remote *r = b->remote;
	double now;
	uint32_t n = 0;

	if (!r)
		return 0;
	now = clock_now();
	/* Deadlines: oldest first, and all calls have the same timeout, so the head decides. */
	while (!list_empty(&r->calls)) {
		struct remote_call *c = list_entry(r->calls.next, struct remote_call, link);

		if (c->deadline > now)
			break;
		r->st.timeouts++;
		settle(r, c, -ETIMEDOUT, NULL, 0);
		n++;
	}
	if (r->pq_len)
		n += pubq_drain(r);
	if (now - r->tick_at < TICK_GAP)
		return n;
	r->tick_at = now;
	n += r->be_ops->poll(r->be, now);
	return n;
}

int remote_sleep_ms(struct broker *b)
{
	struct remote *r = b->remote;
	double left;

	if (!r)
		return -1;
	if (r->pq_len && r->inflight < r->cfg.max_inflight)
		return 1; /* publishes to send */
	if (list_empty(&r->calls))
		return IDLE_SLEEP_MS;
	left = list_entry(r->calls.next, struct remote_call, link)->deadline - clock_now();
	return left <= 0 ? 1 : left * 1000 < IDLE_SLEEP_MS ? (int)(left * 1000) + 1 : IDLE_SLEEP_MS;
}

/* ---- life ---- */

/* The tier's own memory (the backend's is its close's to free). */
static void remote_free(struct remote *r)
{
	free(r->pub_fp);
	free(r->pubq);
	free(r);
}

int remote_open(struct broker *b, const struct remote_cfg *cfg)
{
	struct remote *r = calloc(1, sizeof(*r));
	int err;

	if (!r)
		return -ENOMEM;
	r->b = b;
	r->cfg = *cfg;
	snprintf(r->url, sizeof(r->url), "%s", cfg->url);
	r->cfg.url = r->url;
	list_init(&r->calls);
	r->be_ops = &remote_redis_backend;
	r->pubq = calloc(PUBQ_CAP, sizeof(*r->pubq));
	r->pub_fp = calloc(PUB_FP, sizeof(*r->pub_fp));
	err = r->pubq && r->pub_fp ? r->be_ops->open(r, &r->cfg, &b->loop, &r->be) : -ENOMEM;
	if (err) {
		remote_free(r);
		return err;
	}
	b->remote = r;
	if (r->cfg.publish == REMOTE_PUB_EVICT) {
		b->store.leaving = on_leaving;
		b->store.leaving_arg = b;
	}
	log_info("remote tier: %s %s, prefix \"%s\", timeout %.0f ms, %llu MiB in flight, "
		 "publish %s",
		 r->be_ops->name, r->url, r->cfg.prefix, r->cfg.timeout * 1e3,
		 (unsigned long long)(r->cfg.max_inflight >> 20), publish_name[r->cfg.publish]);
	return 0;
}

void remote_close(struct broker *b)
{
	if (b->remote) {
		b->store.leaving = NULL;
		/* Every call in flight is done (cancelled) first, while the tier still exists. */
		b->remote->be_ops->close(b->remote->be);
		remote_free(b->remote);
		b->remote = NULL;
	}
}

/* The tier's counters in its stats object (and so in kvbroker_remote_* metrics). */
#define RSTAT(name, field)                                                                         \
	{                                                                                          \
		name, offsetof(struct remote_stats, field)                                         \
	}
static const struct {
	const char *name;
	size_t off;
} stat_json[] = {
	RSTAT("lookups", lookups),
	RSTAT("lookup_found", lookup_found),
	RSTAT("fetches", fetches),
	RSTAT("fetched", fetched),
	RSTAT("fetched_in_place", fetched_in_place),
	RSTAT("fetched_direct", fetched_direct),
	RSTAT("fetch_misses", fetch_misses),
	RSTAT("fetch_bytes", fetch_bytes),
	RSTAT("published", published),
	RSTAT("publish_existed", existed),
	RSTAT("publish_bytes", publish_bytes),
	RSTAT("publish_queued", publish_queued),
	RSTAT("publish_dropped", publish_dropped),
	RSTAT("publish_skipped", publish_skipped),
	RSTAT("publish_redirected", publish_redirected),
	RSTAT("publish_resent", publish_resent),
	RSTAT("publish_lost", publish_lost),
	RSTAT("corrupt", corrupt),
	RSTAT("wrong_key", wrong_key),
	RSTAT("other_version", other_version),
	RSTAT("timeouts", timeouts),
	RSTAT("unreachable", unreachable),
	RSTAT("busy", busy),
};

static void num(cJSON *o, const char *k, double v)
{
	cJSON_AddNumberToObject(o, k, v);
}

cJSON *remote_json(const struct broker *b)
{
	const struct remote *r = b->remote;
	cJSON *o = cJSON_CreateObject();
	struct remote_health h = {0};

	if (!r) {
		cJSON_AddStringToObject(o, "state", "off");
		return o;
	}
	r->be_ops->health(r->be, &h);
	cJSON_AddStringToObject(o, "state",
				!h.reachable		 ? "down"
				: h.reachable < h.shards ? "degraded"
							 : "ok");
	cJSON_AddStringToObject(o, "backend", r->be_ops->name);
	cJSON_AddStringToObject(o, "seeds", r->url);
	cJSON_AddStringToObject(o, "prefix", r->cfg.prefix);
	cJSON_AddStringToObject(o, "publish", publish_name[r->cfg.publish]);
	num(o, "timeout_ms", r->cfg.timeout * 1e3);
	num(o, "shards", h.shards);
	num(o, "shards_reachable", h.reachable);
	num(o, "bytes_in_flight", (double)r->inflight);
	num(o, "max_in_flight", (double)r->cfg.max_inflight);
	num(o, "calls_in_flight", r->ncalls);
	for (size_t i = 0; i < sizeof(stat_json) / sizeof(stat_json[0]); i++) {
		uint64_t v;

		memcpy(&v, (const char *)&r->st + stat_json[i].off, sizeof(v));
		num(o, stat_json[i].name, (double)v);
	}
	num(o, "hit_rate", r->st.fetches ? (double)r->st.fetched / (double)r->st.fetches : 0);
	num(o, "publish_waiting", r->pq_len);
	num(o, "errors", (double)(r->st.errors + h.errors));
	num(o, "backoffs", (double)h.backoffs);
	num(o, "recoveries", (double)h.recoveries);
	num(o, "redirects", (double)h.redirects);
	num(o, "slot_refreshes", (double)h.refreshes);
	r->be_ops->json(r->be, o);
	return o;
}
