// SPDX-License-Identifier: MIT
/*
 * test_remote.c - the remote tier's policy (broker/remote.c) over a fake store behind the
 * backend seam ([remote-seam]): the test holds every call the tier submits and answers it as
 * a backend would, with the real store and pool below and no session or request engine. The
 * test asks as the request engine does (struct remote_ask, answers "miss" or "wait on this
 * queue") and checks:
 *
 *   - a fetch: the request waits on the page, is woken at the commit, and the page is in RAM
 *     byte for byte; a second request joins it; a request asks the store once;
 *   - a value landed in place (pieces, remote_call_landed) also fills the asking GET's
 *     destination and marks it filled; one whose request ended first leaves that memory alone;
 *   - a damaged value, another key's value and a deadline passed: the page is aborted, the
 *     waiters are woken and miss, never a wrong page;
 *   - a LOOKUP: only the keys asked, woken when all answered, found keys marked remote and
 *     the leading run extended.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker.h"
#include "remote.h"
#include "slot.h"
#include "waitq.h"

#define MiB (1ull << 20)
#define PAGE (64 * 1024ull)
#define MAXC 64

/* ---- the fake store: calls held until the test answers them ---- */

static struct {
	struct remote_call *c[MAXC];
	uint32_t n;
	int open;
} FS;

static int fs_open(struct remote *r, const struct remote_cfg *cfg, struct loop *l, void **be)
{
	(void)r, (void)cfg, (void)l;
	FS.n = 0;
	FS.open = 1;
	*be = &FS;
	return 0;
}

static int fs_take(void *be, struct remote_call *c)
{
	(void)be;
	assert_true(FS.n < MAXC);
	list_init(&c->blink);
	FS.c[FS.n++] = c;
	return 0;
}

/* Answers held call i (then forgotten). */
static void fs_done(uint32_t i, int res, const void *val, size_t len)
{
	struct remote_call *c = FS.c[i];

	FS.c[i] = NULL;
	remote_call_done(c, res, val, len);
}

static void fs_close(void *be)
{
	(void)be;
	for (uint32_t i = 0; i < FS.n; i++)
		if (FS.c[i])
			fs_done(i, -ECANCELED, NULL, 0);
	FS.open = 0;
}

static int fs_publish(void *be, struct remote_call *c, const struct remote_hdr *h, const void *page,
		      size_t len)
{
	(void)h, (void)page, (void)len;
	return fs_take(be, c);
}

static void fs_health(void *be, struct remote_health *h)
{
	(void)be;
	memset(h, 0, sizeof(*h));
}

static uint32_t fs_poll(void *be, double now)
{
	(void)be, (void)now;
	return 0;
}

static void fs_json(void *be, struct cJSON *o)
{
	(void)be, (void)o;
}

static const struct remote_backend fake_store = {
	.name = "fake",
	.open = fs_open,
	.close = fs_close,
	.lookup = fs_take,
	.fetch = fs_take,
	.publish = fs_publish,
	.health = fs_health,
	.poll = fs_poll,
	.json = fs_json,
};

/* ---- fixture: a broker with an 8 MiB pool and the tier over the fake store ---- */

static struct {
	struct broker b;
	struct ns *n;
	char name[64];
	uint8_t dst[PAGE]; /* a GET's destination */
} F;

struct waiter {
	struct list link;
	struct waitq *q;
};

static void page_woken(void *arg, struct page *pg)
{
	struct waitq *q = pg->waiters;

	(void)arg;
	pg->waiters = NULL;
	waitq_wake(q, &F.b.runq);
	free(q);
}

static int setup(void **state)
{
	struct remote_cfg rc = {.url = "fake://",
				.timeout = 60,
				.max_inflight = 64 * MiB,
				.publish = REMOTE_PUB_NEVER};
	struct kvb_layout l;

	(void)state;
	memset(&F.b, 0, sizeof(F.b));
	strcpy(rc.prefix, "kvb:");
	snprintf(F.name, sizeof(F.name), "/kvb-test-remote-%d", (int)getpid());
	assert_int_equal(pool_open(&F.b.pool, F.name, 8 * MiB, 1), 0);
	assert_int_equal(store_init(&F.b.store, &F.b.pool, MiB, 1.0, 1.0), 0);
	waitq_init(&F.b.runq);
	F.b.store.wake = page_woken;
	assert_int_equal(remote_open_backend(&F.b, &rc, &fake_store), 0);
	memset(&l, 0, sizeof(l));
	strcpy(l.model, "test/remote");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = 16;
	l.tp_size = 1;
	l.ncomponents = 1;
	strcpy(l.comp[0].name, "kv");
	l.comp[0].num_layers = 1;
	l.comp[0].bytes_per_token_layer = (uint32_t)(PAGE / 16);
	assert_int_equal(ns_open(&F.b.nst, &F.b.store, &l, 0, &F.n), 0);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	assert_true(list_empty(&F.b.runq.ops));
	remote_close(&F.b);
	assert_false(FS.open);
	ns_table_fini(&F.b.nst);
	store_fini(&F.b.store);
	pool_close(&F.b.pool);
	return 0;
}

static kvb_key key_of(uint32_t i)
{
	kvb_key k;

	memset(&k, 0, sizeof(k));
	memcpy(k.b, &i, sizeof(i));
	k.b[31] = 0x5a;
	return k;
}

static uint8_t byte_of(uint32_t key, uint64_t off)
{
	return (uint8_t)(key * 37 + off * 11 + (off >> 9));
}

/* The value the store holds for `key` (as stored under `as`): header then page. */
static uint8_t *value_of(uint32_t key, uint32_t as, size_t *len)
{
	uint8_t *v = malloc(sizeof(struct remote_hdr) + PAGE), *p = v + sizeof(struct remote_hdr);
	kvb_key k = key_of(as);
	struct remote_hdr h;

	assert_non_null(v);
	for (uint64_t o = 0; o < PAGE; o++)
		p[o] = byte_of(key, o);
	remote_value_seal(&h, F.n->ident, &k, PAGE, slot_crc32c(p, PAGE));
	memcpy(v, &h, sizeof(h));
	*len = sizeof(h) + PAGE;
	return v;
}

static struct page *page_of(uint32_t key)
{
	kvb_key k = key_of(key);

	return store_find(&F.b.store, F.n->id, &k);
}

static int in_ram_exact(uint32_t key)
{
	struct page *pg = page_of(key);
	const uint8_t *a;

	if (!pg || pg->state != PAGE_READY)
		return 0;
	a = store_addr(&F.b.store, pg);
	for (uint64_t o = 0; o < PAGE; o++)
		if (a[o] != byte_of(key, o))
			return 0;
	return 1;
}

/* Asks for `key` as a GET that missed in RAM and on disk; waits on the answer (1) or not. */
static int ask(struct remote_ask *ra, uint32_t key, uint8_t *dst, struct waiter *w)
{
	kvb_key k = key_of(key);
	struct page *pg = page_of(key);
	struct wait_on on = {NULL, NULL, NULL};

	if (pg && pg->state == PAGE_READY)
		pg = NULL; /* not asked then: the request found it */
	if (!remote_promote(&F.b, ra, F.n, &k, pg, dst, &on))
		return 0;
	assert_non_null(on.q);
	assert_non_null(on.why);
	assert_true(on.pg == page_of(key)); /* it waits on the page being fetched */
	list_add_tail(&on.q->ops, &w->link);
	w->q = on.q;
	return 1;
}

static int woken(struct waiter *w)
{
	for (struct list *p = F.b.runq.ops.next; p != &F.b.runq.ops; p = p->next)
		if (p == &w->link) {
			list_del(&w->link);
			return 1;
		}
	return 0;
}

static double rstat(const char *field)
{
	cJSON *o = remote_json(&F.b);
	double v = cJSON_GetNumberValue(cJSON_GetObjectItem(o, field));

	cJSON_Delete(o);
	return v;
}

/* ---- tests ---- */

static void test_remote_fetch_joined_once(void **state)
{
	struct remote_ask a = {0}, b = {0};
	struct waiter wa, wb;
	uint8_t *v;
	size_t len;

	(void)state;
	assert_int_equal(ask(&a, 1, NULL, &wa), 1);
	assert_int_equal(FS.n, 1);
	assert_int_equal(FS.c[0]->kind, RC_FETCH);
	assert_int_equal(page_of(1)->state, PAGE_WRITING); /* never served while it fills */
	assert_int_equal(ask(&b, 1, NULL, &wb), 1);	   /* joins: no second call */
	assert_int_equal(FS.n, 1);
	assert_true(wb.q == wa.q);
	v = value_of(1, 1, &len);
	fs_done(0, 1, v, len);
	free(v);
	assert_true(woken(&wa) && woken(&wb));
	assert_true(in_ram_exact(1));
	assert_int_equal(rstat("fetched"), 1);
	/* Asked once: a request that asks again (its page went meanwhile) misses. */
	{
		kvb_key k = key_of(1);
		struct wait_on on;

		assert_int_equal(remote_promote(&F.b, &a, F.n, &k, NULL, NULL, &on), 0);
	}
	remote_ask_end(&a);
	remote_ask_end(&b);
}

static void test_remote_refused_values_miss(void **state)
{
	struct remote_ask a = {0}, b = {0}, c = {0};
	struct waiter wa, wb, wc;
	uint8_t *v;
	size_t len;

	(void)state;
	FS.n = 0;
	/* Damaged on the way: one bit of the page. */
	assert_int_equal(ask(&a, 2, NULL, &wa), 1);
	v = value_of(2, 2, &len);
	v[sizeof(struct remote_hdr) + 500] ^= 0x10;
	fs_done(0, 1, v, len);
	free(v);
	assert_true(woken(&wa));
	assert_null(page_of(2)); /* aborted: never a wrong page */
	assert_int_equal(rstat("corrupt"), 1);
	/* Intact, but another key's value (copied or swapped in the store). */
	assert_int_equal(ask(&b, 3, NULL, &wb), 1);
	v = value_of(4, 4, &len);
	fs_done(1, 1, v, len);
	free(v);
	assert_true(woken(&wb));
	assert_null(page_of(3));
	assert_int_equal(rstat("wrong_key"), 1);
	/* Not in the store. */
	assert_int_equal(ask(&c, 5, NULL, &wc), 1);
	fs_done(2, 0, NULL, 0);
	assert_true(woken(&wc));
	assert_null(page_of(5));
	remote_ask_end(&a);
	remote_ask_end(&b);
	remote_ask_end(&c);
}

/* Lands value v of a fetch in place, in pieces, as the Redis backend does. */
static void land(uint32_t i, const uint8_t *v, size_t len)
{
	struct remote_call *c = FS.c[i];
	size_t off = sizeof(struct remote_hdr);

	memcpy(&c->vhdr, v, sizeof(c->vhdr));
	assert_int_equal(remote_call_header(c), 0);
	while (off < len) {
		size_t n = len - off < 4096 ? len - off : 4096;

		memcpy(c->dst + c->got, v + off, n);
		remote_call_landed(c, n);
		off += n;
	}
	c->landed = 1;
	fs_done(i, 1, NULL, len);
}

static void test_remote_landing_fills_destination(void **state)
{
	struct remote_ask a = {0}, b = {0};
	struct waiter wa, wb;
	uint8_t *v;
	size_t len;

	(void)state;
	FS.n = 0;
	memset(F.dst, 0xee, sizeof(F.dst));
	assert_int_equal(ask(&a, 6, F.dst, &wa), 1);
	assert_non_null(a.call);
	v = value_of(6, 6, &len);
	land(0, v, len);
	free(v);
	assert_true(woken(&wa));
	assert_true(a.filled); /* the GET completes with no copy of its own */
	assert_true(in_ram_exact(6));
	for (uint64_t o = 0; o < PAGE; o++)
		assert_int_equal(F.dst[o], byte_of(6, o));
	remote_ask_end(&a);
	/* A GET that ended before its fetch (its client died): its memory is not touched. */
	memset(F.dst, 0xee, sizeof(F.dst));
	assert_int_equal(ask(&b, 7, F.dst, &wb), 1);
	list_del(&wb.link); /* the request is gone */
	remote_ask_end(&b);
	assert_null(b.call);
	v = value_of(7, 7, &len);
	land(1, v, len);
	free(v);
	for (uint64_t o = 0; o < PAGE; o++)
		assert_int_equal(F.dst[o], 0xee);
	assert_true(in_ram_exact(7)); /* the page itself is stored all the same */
}

static void test_remote_deadline_misses(void **state)
{
	struct remote_ask a = {0};
	struct waiter wa;
	uint8_t *v;
	size_t len;

	(void)state;
	FS.n = 0;
	assert_int_equal(ask(&a, 8, NULL, &wa), 1);
	FS.c[0]->deadline = 0; /* long past */
	remote_tick(&F.b);
	assert_true(woken(&wa));
	assert_null(page_of(8));
	/* The answer that comes later finds its call settled: dropped, nothing stored. */
	v = value_of(8, 8, &len);
	fs_done(0, 1, v, len);
	free(v);
	assert_null(page_of(8));
	remote_ask_end(&a);
}

static void test_remote_lookup(void **state)
{
	uint8_t keys[4 * sizeof(kvb_key)],
		tiers[4] = {KVB_TIER_RAM, KVB_TIER_NONE, KVB_TIER_NONE, KVB_TIER_NONE};
	struct remote_ask a = {0};
	struct wait_on on;
	struct waiter w;

	(void)state;
	FS.n = 0;
	for (uint32_t i = 0; i < 4; i++) {
		kvb_key k = key_of(20 + i);

		memcpy(keys + i * sizeof(kvb_key), k.b, sizeof(k.b));
	}
	assert_int_equal(remote_lookup(&F.b, &a, F.n, keys, tiers, 4, &on), 1);
	list_add_tail(&on.q->ops, &w.link);
	assert_int_equal(FS.n, 3); /* only the keys found nowhere here */
	for (uint32_t i = 0; i < 3; i++)
		assert_int_equal(FS.c[i]->kind, RC_LOOKUP);
	fs_done(0, 1, NULL, 0);
	fs_done(2, 1, NULL, 0);
	assert_false(woken(&w)); /* one answer to come */
	fs_done(1, 0, NULL, 0);
	assert_true(woken(&w));
	/* The RAM key leads; key 1 is remote, key 2 nowhere, key 3 remote. */
	assert_int_equal(remote_lookup_apply(&a, tiers, 1), 2);
	assert_int_equal(tiers[1], KVB_TIER_REMOTE);
	assert_int_equal(tiers[2], KVB_TIER_NONE);
	assert_int_equal(tiers[3], KVB_TIER_REMOTE);
	assert_null(a.lq);
	/* Asked once. */
	assert_int_equal(remote_lookup(&F.b, &a, F.n, keys, tiers, 4, &on), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_remote_fetch_joined_once),
		cmocka_unit_test(test_remote_refused_values_miss),
		cmocka_unit_test(test_remote_landing_fills_destination),
		cmocka_unit_test(test_remote_deadline_misses),
		cmocka_unit_test(test_remote_lookup),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
