/* SPDX-License-Identifier: MIT */
/*
 * remote.h - the remote tier: pages shared across nodes through a distributed store (Redis
 * Cluster today), below RAM and disk. See remote.c for the policy essay. Loop thread only.
 *
 * [remote-seam] The tier is generic; what talks to the store is a backend, a struct of
 * function pointers (struct remote_backend below): lookup, fetch, publish and health, plus
 * open/close/poll. remote_redis.c is the Redis Cluster backend; a Mooncake Store backend is
 * another such struct where its C library exists. docs/design.md names this seam.
 */
#ifndef KVB_BROKER_REMOTE_H
#define KVB_BROKER_REMOTE_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "kvbroker.h"
#include "list.h"
#include "remote_value.h"
#include "waitq.h"

struct broker;
struct page;
struct ns;
struct cJSON;
struct loop;

enum remote_publish {
	REMOTE_PUB_PUT = 0,
	REMOTE_PUB_NEVER = 1,
	REMOTE_PUB_REUSE = 2,
	REMOTE_PUB_EVICT = 3
};

struct remote_cfg {
	const char *url;       /* --remote: redis://host:port[,host:port...]; NULL: tier off */
	char prefix[32];       /* --remote-prefix: every key starts with it (no '{' or '}') */
	double timeout;	       /* --remote-timeout (seconds): the deadline of each lookup/fetch */
	uint64_t max_inflight; /* --remote-inflight: value bytes on the wire at most */
	int publish;	       /* --remote-publish: enum remote_publish */
};

#define REMOTE_KEY_MAX 192

/* struct page rflags */
#define REMOTE_PG_FETCHING 1u  /* WRITING, being filled by a fetch of this tier */
#define REMOTE_PG_PUBLISHED 2u /* sent to the store, or came from it: never (again) */
#define REMOTE_PG_QUEUED 4u    /* waiting in the publish queue */

enum remote_kind { RC_LOOKUP = 1, RC_FETCH = 2, RC_PUBLISH = 3 };

/*
 * What one request asked of the remote tier: the request engine keeps one in each op and
 * hands it to every call below, so that the tier knows nothing of ops. It asks the cluster at
 * most once per request (asked); a LOOKUP's questions (lq) and a GET's fetch that lands in its
 * destination too (call, then filled) are the tier's until remote_ask_end().
 */
struct remote_ask {
	struct remote_lq *lq;	  /* LOOKUP: its questions, while asked */
	struct remote_call *call; /* GET: the fetch landing in its destination too */
	uint8_t asked;		  /* the cluster was asked (once per request) */
	uint8_t filled;		  /* GET: that fetch checked and committed: dst holds the page */
};

/*
 * One request to the backend, owned by the tier. A backend that accepted it (its function
 * returned 0) calls remote_call_done() for it exactly once, later, never from inside the call
 * that submitted it. A call whose deadline passed is settled by the tier (a miss) and only
 * freed when the backend is done with it.
 */
struct remote_call {
	struct list link;  /* the tier's calls in flight, oldest first */
	struct list blink; /* the backend's (its connection's FIFO) */
	struct remote *r;
	uint8_t kind;	 /* enum remote_kind */
	uint8_t settled; /* its outcome was applied (deadline or answer) */
	uint8_t redirects;
	double deadline;
	double sent;
	char key[REMOTE_KEY_MAX];
	uint32_t klen;
	char *cmd; /* the request, formatted by the backend (kept for redirections) */
	size_t cmdlen;
	uint64_t bytes;	     /* counted in the tier's bytes in flight */
	struct page *pg;     /* RC_FETCH: the WRITING page it fills */
	uint64_t page_bytes; /* RC_FETCH */
	/*
	 * RC_FETCH, landing in place: a backend may write the value's header into vhdr and its
	 * page bytes, in order, straight into dst (the WRITING slot), calling remote_call_landed()
	 * after each piece, then set landed and call remote_call_done() with val NULL. dst is
	 * NULL (and stays so) once the tier settled the call early: the rest is read and dropped.
	 */
	uint8_t *dst;
	uint64_t got; /* page bytes landed in dst */
	uint32_t crc; /* their crc32c so far */
	uint8_t landed;
	uint8_t verdict; /* enum remote_verdict of a value refused on its header as it came */
	struct remote_hdr vhdr;
	/*
	 * RC_FETCH for a plain GET into a registered host buffer (the request that issued it): each
	 * piece that lands is also copied into that GET's destination while it is in the cache, so
	 * the GET completes without a copy of its own once the check passed (remote.c, "Fetch").
	 * Both NULL once that request ended or the call settled: nothing is written there after.
	 */
	struct remote_ask *mra; /* the request whose destination mdst this fetch also fills */
	uint8_t *mdst;
	struct remote_lq *lq; /* RC_LOOKUP: the LOOKUP it answers */
	uint32_t lq_idx;      /* RC_LOOKUP: which of its keys */
	/*
	 * The page: RC_FETCH, what its value's header must name (remote_value.c); RC_PUBLISH,
	 * how it is found again for a resend. route (RC_PUBLISH): set by a backend that is done
	 * with REMOTE_REDIRECTED, where the page now goes (its own encoding, never 0); a call
	 * with route set on submission is that one resend and goes there.
	 */
	uint32_t pns;
	uint8_t ident[32]; /* RC_FETCH: the namespace identity */
	kvb_key pkey;
	uint32_t route;
	uint8_t resend;
};

/*
 * A publish answered with a redirection (MOVED, ASK: its slot moved, or is moving): the
 * backend keeps no copy of the value, so the tier sends it again once, from the page still in
 * RAM, to c->route (remote.c, "Publish").
 */
#define REMOTE_REDIRECTED (-EXDEV)

/* What the backend says of its health (stats). */
struct remote_health {
	uint32_t shards, reachable; /* nodes that own slots, and those of them connected */
	uint64_t backoffs, recoveries, errors, redirects, refreshes;
};

struct remote_backend {
	const char *name;
	/* Connects to the seeds of cfg->url (without blocking); *be is its state. 0 or -errno. */
	int (*open)(struct remote *r, const struct remote_cfg *cfg, struct loop *l, void **be);
	/* Frees everything; calls still in flight are done with -ECANCELED first. */
	void (*close)(void *be);
	/* Submit c (c->key, c->klen): 0 accepted, -errno refused (no done will follow). */
	int (*lookup)(void *be, struct remote_call *c);
	int (*fetch)(void *be, struct remote_call *c);
	/* The value is hdr then page (len bytes), copied before it returns: nothing stays pinned. */
	int (*publish)(void *be, struct remote_call *c, const struct remote_hdr *hdr,
		       const void *page, size_t len);
	void (*health)(void *be, struct remote_health *h);
	/* Deadlines of its connections, reconnects after back-off; returns work done. */
	uint32_t (*poll)(void *be, double now);
	/* Its members of the "remote" stats object. */
	void (*json)(void *be, struct cJSON *o);
};

extern const struct remote_backend remote_redis_backend;

/*
 * The backend's answer to c: res >= 0 with the value (val, len; NULL for none) for a fetch;
 * 1/0 (exists or not) for a lookup; 1 stored, 0 already there for a publish; -errno on error
 * (-ECONNRESET, -ETIMEDOUT, -EHOSTUNREACH...). val is valid only during the call; a fetch that
 * landed in place (c->landed) passes val NULL and len, the value's length. Frees c.
 */
void remote_call_done(struct remote_call *c, int res, const void *val, size_t len);

/*
 * Fetch c's value header landed in c->vhdr, before any of its page: 0 when it is the header of
 * the page c asked for, so the page may land in c->dst; else the call is settled now (a miss,
 * counted) and c->dst is NULL: the backend reads the rest of the value and drops it, so not
 * one byte of a value of another key reaches the slot or a GET's destination.
 */
int remote_call_header(struct remote_call *c);

/*
 * The next n page bytes of fetch c landed at c->dst + c->got: checksummed now, while they are
 * in the cache (the crc is fused with the landing, not a pass over the whole page later).
 */
void remote_call_landed(struct remote_call *c, size_t n);

/* main.c: opens the tier when cfg->url is set (b->remote). 0 or -errno. */
int remote_open(struct broker *b, const struct remote_cfg *cfg);
/* The same over backend be ([remote-seam]; the tests' fake store). */
int remote_open_backend(struct broker *b, const struct remote_cfg *cfg,
			const struct remote_backend *be);
void remote_close(struct broker *b);

/*
 * A GET/ACQUIRE/PREFETCH of (n, key) that missed in RAM and on disk (pg: the key's WRITING
 * page, or NULL): 1, "wait" with *w on the page being fetched (the fetch issued or joined),
 * or 0, a miss. A request asks the cluster once (ra->asked): asked again, it misses if the
 * fetch did. dst: a plain GET's destination in a registered host buffer (NULL for the others:
 * views, GPU and fd buffers, ACQUIRE, PREFETCH); a fetch it issues also lands there, and
 * ra->filled says, when it asks RAM again, that its page was checked and is in dst already.
 */
int remote_promote(struct broker *b, struct remote_ask *ra, const struct ns *n, const kvb_key *key,
		   struct page *pg, uint8_t *dst, struct wait_on *w);

/*
 * A LOOKUP of namespace n whose local pass is done: asks the cluster about its keys that were
 * NONE (tiers[i]) and answers 1, "wait" with *w until the answers or the deadline came, or 0
 * when nothing was asked. Then remote_lookup_apply marks the keys found KVB_TIER_REMOTE and
 * returns the new leading count.
 */
int remote_lookup(struct broker *b, struct remote_ask *ra, const struct ns *n, const uint8_t *keys,
		  const uint8_t *tiers, uint32_t count, struct wait_on *w);
uint32_t remote_lookup_apply(struct remote_ask *ra, uint8_t *tiers, uint32_t lead);

/* At every request's end: lets go of what it held in the tier. */
void remote_ask_end(struct remote_ask *ra);

/* xfer.c: a PUT committed page pg of namespace n: publish it (once; --remote-publish put). */
void remote_on_put(struct broker *b, const struct ns *n, struct page *pg);
/* ops.c: a GET or ACQUIRE hit page pg in RAM: publish it (once; --remote-publish reuse). */
void remote_on_hit(struct broker *b, const struct ns *n, struct page *pg);

/* rounds.c: deadlines, the publish queue, the backend's own upkeep. Returns work done. */
uint32_t remote_tick(struct broker *b);
/* rounds.c: how long the loop may sleep (ms) before remote_tick must run; -1: no limit. */
int remote_sleep_ms(struct broker *b);

/* stats.c: the "remote" object (state "off" without the tier). */
struct cJSON *remote_json(const struct broker *b);

#endif /* KVB_BROKER_REMOTE_H */
