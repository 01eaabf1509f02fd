// SPDX-License-Identifier: MIT
/*
 * test_tier.c - the NVMe tier's policy (broker/tier.c) over an in-memory disk: disk_open,
 * disk_prep, disk_submit, disk_reap, disk_space and disk_close are wrapped (-Wl,--wrap) so
 * that every I/O lands in a memory image the test can read, corrupt and hold back, with the
 * real store and pool on top and no session or request engine: the test asks the tier as the
 * request engine does (RAM first, then tier_promote) and holds its own waiters on the queues
 * the tier answers with, checking that they are woken onto the run queue and then find the
 * page in RAM, byte-exact, or miss:
 *
 *   - demotion then promotion, byte-exact;
 *   - joined and parked promotions: three requests and a PUT of one key while its read is
 *     held in flight all wait on the promotion's page and are woken at its commit (the PUT
 *     then finds the page stored: the regression of a PUT that hung on a promoted page); with
 *     a queue depth of one, a second key's promotion waits for disk-queue room and then goes;
 *     an allocation that finds RAM full waits for the demotions in flight (tier_wait_alloc);
 *   - a crc mismatch: the read is aborted, the waiters are woken and miss, the disk copy is
 *     forgotten;
 *   - the log wraps: the oldest slots are dropped, the newest still promote;
 *   - a promotion of the slot the log head is about to drop, with RAM full of dirty pages;
 *   - warm restart: a slot that straddles two 32 MiB scan regions is found whole;
 *   - [tenant-rebind] a partition's regions forgotten: its pages miss, new ones promote.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker.h"
#include "waitq.h"
#include "disk.h"
#include "slot.h"
#include "tier.h"

#define MiB (1ull << 20)
#define KiB 1024ull
#define MAXIO 1024

/* ---- the in-memory disk ---- */

struct fio {
	int write;
	uint32_t pi;
	uint64_t off;
	void *mem;
	uint32_t len;
	uint64_t ud;
};

static struct {
	uint8_t *img[2];
	uint64_t bytes[2];
	uint32_t npaths;
	int warm; /* the next disk_open finds matching superblocks */
	int hold; /* completions stay in flight */
	uint32_t qd;
	struct fio pend[MAXIO], fly[MAXIO];
	uint32_t npend, nfly;
} D;

int __wrap_disk_open(struct disk *d, const struct disk_cfg *c, const struct pool *p,
		     uint64_t slab_bytes, uint32_t nhdrs);
int __wrap_disk_open(struct disk *d, const struct disk_cfg *c, const struct pool *p,
		     uint64_t slab_bytes, uint32_t nhdrs)
{
	(void)slab_bytes;
	memset(d, 0, sizeof(*d));
	d->npaths = D.npaths;
	for (uint32_t i = 0; i < D.npaths; i++) {
		snprintf(d->path[i].name, sizeof(d->path[i].name), "mem%u", i);
		d->path[i].bytes = d->path[i].eof = D.bytes[i];
		d->path[i].fd = -1;
	}
	memset(d->cache_id, 0x42, sizeof(d->cache_id));
	d->warm = D.warm;
	d->direct = 1;
	d->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	d->qd = c->qd;
	d->pool = p;
	d->hdrs = aligned_alloc(SLOT_BLOCK, (size_t)nhdrs * SLOT_BLOCK);
	d->nhdrs = nhdrs;
	D.qd = c->qd;
	D.npend = D.nfly = 0;
	return d->efd < 0 || !d->hdrs ? -ENOMEM : 0;
}

void __wrap_disk_close(struct disk *d);
void __wrap_disk_close(struct disk *d)
{
	assert_int_equal(D.nfly + D.npend, 0);
	close(d->efd);
	free(d->hdrs);
}

int __wrap_disk_prep(struct disk *d, int write, uint32_t pi, uint64_t off, void *mem, uint32_t len,
		     uint64_t ud, unsigned flags);
int __wrap_disk_prep(struct disk *d, int write, uint32_t pi, uint64_t off, void *mem, uint32_t len,
		     uint64_t ud, unsigned flags)
{
	(void)d;
	(void)flags; /* the payload write and its header are done in order: link or not */
	if (D.npend >= D.qd)
		return -EBUSY;
	assert_true(pi < D.npaths && off + len <= D.bytes[pi]);
	D.pend[D.npend++] = (struct fio){write, pi, off, mem, len, ud};
	return 0;
}

uint32_t __wrap_disk_space(struct disk *d);
uint32_t __wrap_disk_space(struct disk *d)
{
	(void)d;
	return D.qd - D.npend;
}

int __wrap_disk_submit(struct disk *d);
int __wrap_disk_submit(struct disk *d)
{
	(void)d;
	assert_true(D.nfly + D.npend <= MAXIO);
	memcpy(D.fly + D.nfly, D.pend, D.npend * sizeof(D.pend[0]));
	D.nfly += D.npend;
	D.npend = 0;
	return 0;
}

uint32_t __wrap_disk_reap(struct disk *d, uint32_t max, int wait,
			  void (*fn)(void *arg, uint64_t ud, int32_t res), void *arg);
uint32_t __wrap_disk_reap(struct disk *d, uint32_t max, int wait,
			  void (*fn)(void *arg, uint64_t ud, int32_t res), void *arg)
{
	uint32_t n = 0;

	(void)d;
	(void)wait; /* nothing blocks here: what is in flight completes now */
	while (!D.hold && n < max && D.nfly) {
		struct fio io = D.fly[0];

		memmove(D.fly, D.fly + 1, --D.nfly * sizeof(D.fly[0]));
		if (io.write)
			memcpy(D.img[io.pi] + io.off, io.mem, io.len);
		else
			memcpy(io.mem, D.img[io.pi] + io.off, io.len);
		fn(arg, io.ud, (int32_t)io.len);
		n++;
	}
	return n;
}

void __wrap_disk_ack_event(struct disk *d);
void __wrap_disk_ack_event(struct disk *d)
{
	(void)d;
}

/* ---- fixture: a broker with an 8 MiB pool and a tier over the memory disk; no session ---- */

static struct {
	struct broker b;
	struct ns *n;
	uint64_t pb;
	uint8_t *mem; /* where requests copy pages: 4 slots */
	char name[64];
} F;

/* A request waiting where the tier said (the request engine's op, reduced to its link). */
struct waiter {
	struct list link;
	struct waitq *q;
	const char *why;
	struct page *pg; /* the page the tier brings, NULL when it waits for room or RAM */
};

/* The store's [page-wake] hook, as ops.c has it: a page's waiters go to the run queue. */
static void page_woken(void *arg, struct page *pg)
{
	struct waitq *q = pg->waiters;

	(void)arg;
	pg->waiters = NULL;
	waitq_wake(q, &F.b.runq);
	free(q);
}

static void start(uint64_t page, uint64_t disk, uint32_t qd)
{
	struct disk_cfg dc = {.paths = "mem0", .size = disk, .qd = qd};
	struct kvb_layout l;

	memset(&F.b, 0, sizeof(F.b));
	snprintf(F.name, sizeof(F.name), "/kvb-test-tier-%d", (int)getpid());
	assert_int_equal(pool_open(&F.b.pool, F.name, 8 * MiB, 1), 0);
	assert_int_equal(store_init(&F.b.store, &F.b.pool, MiB, 1.0, 1.0), 0);
	waitq_init(&F.b.runq);
	F.b.store.wake = page_woken;
	F.b.cfg.slab_bytes = MiB;
	F.b.loop.epfd = epoll_create1(EPOLL_CLOEXEC); /* the tier's eventfd is watched there */
	assert_true(F.b.loop.epfd >= 0);
	if (!D.img[0]) {
		D.npaths = 1;
		D.bytes[0] = disk;
		D.img[0] = calloc(1, disk);
		assert_non_null(D.img[0]);
	}
	assert_int_equal(tier_open(&F.b, &dc), 0);
	memset(&l, 0, sizeof(l));
	strcpy(l.model, "test/tier");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = 16;
	l.tp_size = 1;
	l.ncomponents = 1;
	strcpy(l.comp[0].name, "kv");
	l.comp[0].num_layers = 1;
	l.comp[0].bytes_per_token_layer = (uint32_t)(page / 16);
	assert_int_equal(ns_open(&F.b.nst, &F.b.store, &l, 0, &F.n), 0);
	F.pb = page;
	F.mem = calloc(4, page);
	assert_non_null(F.mem);
}

static void stop(int keep_image)
{
	assert_true(list_empty(&F.b.runq.ops)); /* every woken waiter was run */
	tier_close(&F.b, NULL);
	free(F.mem);
	ns_table_fini(&F.b.nst);
	store_fini(&F.b.store);
	pool_close(&F.b.pool);
	close(F.b.loop.epfd);
	if (!keep_image) {
		free(D.img[0]);
		D.img[0] = NULL;
		D.warm = 0;
	}
}

static kvb_key key_of(uint32_t i)
{
	kvb_key k;

	memset(&k, 0, sizeof(k));
	memcpy(k.b, &i, sizeof(i));
	k.b[31] = 0x33;
	return k;
}

static uint8_t byte_of(uint32_t key, uint64_t off)
{
	return (uint8_t)(key * 131 + off * 7 + (off >> 12));
}

/* Stores page `key` straight into the store (READY, dirty). */
static void store_page(uint32_t key)
{
	kvb_key k = key_of(key);
	struct page *pg;
	uint8_t *a;

	assert_int_equal(store_alloc(&F.b.store, F.n->cls, F.n->id, &k, &pg), 0);
	a = store_addr(&F.b.store, pg);
	for (uint64_t o = 0; o < F.pb; o++)
		a[o] = byte_of(key, o);
	store_commit(&F.b.store, pg);
}

/* Demotes every READY page and lets the writes land: they leave RAM. */
static void demote_all(void)
{
	uint64_t hi = F.b.store.high_bytes, lo = F.b.store.low_bytes;

	F.b.store.high_bytes = F.b.store.low_bytes = 0;
	for (int i = 0; i < 1000; i++) {
		uint32_t n = store_evict_watermark(&F.b.store, 256);

		if (!n && !tier_poll(&F.b) && !D.nfly && !D.npend)
			break;
		tier_poll(&F.b);
	}
	F.b.store.high_bytes = hi;
	F.b.store.low_bytes = lo;
}

static double tstat(const char *field)
{
	cJSON *o = tier_json(&F.b);
	double v = cJSON_GetNumberValue(cJSON_GetObjectItem(o, field));

	cJSON_Delete(o);
	return v;
}

static int in_ram(uint32_t key)
{
	kvb_key k = key_of(key);
	struct page *pg = store_find(&F.b.store, F.n->id, &k);

	return pg && pg->state == PAGE_READY;
}

/*
 * A read of `key` into slot, as the request engine runs one: RAM first, then the tier.
 * Returns 1 (found: copied), 0 (a miss) or -1: waiting on the queue the tier answered with.
 */
static int ask(uint32_t key, uint32_t slot, struct waiter *w)
{
	kvb_key k = key_of(key);
	struct page *pg = store_find(&F.b.store, F.n->id, &k);
	struct wait_on on = {NULL, NULL, NULL};

	if (pg && pg->state == PAGE_READY) {
		memcpy(F.mem + slot * F.pb, store_addr(&F.b.store, pg), F.pb);
		return 1;
	}
	if (!tier_promote(&F.b, F.n, &k, pg, &on))
		return 0;
	assert_non_null(on.q);
	assert_non_null(on.why);
	list_add_tail(&on.q->ops, &w->link);
	w->q = on.q;
	w->why = on.why;
	w->pg = on.pg;
	if (on.pg) /* the page's own queue, the page being read (WRITING) */
		assert_true(on.pg->waiters == on.q && on.pg->state == PAGE_WRITING);
	return -1;
}

/* Was w woken (moved to the run queue)? Then it is taken off it, as the engine runs it. */
static int woken(struct waiter *w)
{
	for (struct list *p = F.b.runq.ops.next; p != &F.b.runq.ops; p = p->next)
		if (p == &w->link) {
			list_del(&w->link);
			return 1;
		}
	return 0;
}

/* Runs the tier until nothing moves. */
static void settle(void)
{
	for (int i = 0; i < 100; i++)
		if (!tier_poll(&F.b))
			break;
}

/* A read to its end: each "wait" must be woken by the tier; then found (1) or missed (0). */
static int fetch(uint32_t key, uint32_t slot)
{
	struct waiter w;
	int r, rounds = 0;

	while ((r = ask(key, slot, &w)) < 0) {
		settle();
		if (!woken(&w))
			fail_msg("key %u: waited on '%s' and was never woken", key, w.why);
		assert_true(++rounds < 10);
	}
	return r;
}

static void check_slot(uint32_t slot, uint32_t key)
{
	for (uint64_t o = 0; o < F.pb; o++)
		assert_int_equal(F.mem[slot * F.pb + o], byte_of(key, o));
}

/* ---- tests ---- */

static void test_tier_demote_then_promote(void **state)
{
	struct waiter w;

	(void)state;
	start(64 * KiB, 16 * MiB, 8);
	for (uint32_t i = 0; i < 8; i++)
		store_page(i);
	demote_all();
	assert_int_equal(tstat("demotions"), 8);
	assert_int_equal(tstat("pages"), 8);
	assert_false(in_ram(3));
	assert_int_equal(ask(3, 0, &w), -1); /* waits on its promotion's page */
	assert_false(woken(&w));
	settle();
	assert_true(woken(&w));
	assert_int_equal(ask(3, 0, &w), 1);
	check_slot(0, 3);
	assert_true(in_ram(3));
	assert_int_equal(tstat("promotions"), 1);
	/* RAM first: a read of the page now in RAM leaves the disk index alone. */
	{
		double probes = tstat("index_lookups");

		assert_int_equal(ask(3, 1, &w), 1);
		assert_int_equal(tstat("index_lookups"), probes);
	}
	/* Not on disk, not in RAM: a miss, and nothing waits. */
	assert_int_equal(ask(99, 2, &w), 0);
	stop(0);
}

/* [tenant-rebind] A partition's regions forgotten whole: its pages miss; the log goes on. */
static void test_tier_part_forget(void **state)
{
	struct waiter w;

	(void)state;
	start(64 * KiB, 16 * MiB, 8);
	for (uint32_t i = 0; i < 8; i++)
		store_page(i);
	demote_all();
	assert_int_equal(tstat("pages"), 8);
	tier_part_forget(&F.b, 0);
	assert_int_equal(tstat("pages"), 0);
	assert_false(in_ram(3));
	assert_int_equal(ask(3, 0, &w), 0); /* a miss: nothing waits */
	store_page(20);
	demote_all();
	assert_int_equal(tstat("pages"), 1);
	assert_false(in_ram(20));
	assert_int_equal(ask(20, 0, &w), -1);
	settle();
	assert_true(woken(&w));
	assert_int_equal(ask(20, 0, &w), 1);
	check_slot(0, 20);
	stop(0);
}

static void test_tier_joined_and_parked_promotions(void **state)
{
	struct waiter w[5];
	struct wait_on on;
	kvb_key k1 = key_of(1);
	struct page *pg;

	(void)state;
	start(64 * KiB, 16 * MiB, 1);
	for (uint32_t i = 0; i < 4; i++)
		store_page(i);
	demote_all();
	D.hold = 1;
	assert_int_equal(ask(1, 0, &w[0]), -1); /* issues the read */
	assert_int_equal(ask(1, 1, &w[1]), -1); /* joins it */
	assert_int_equal(ask(1, 0, &w[2]), -1); /* joins it */
	assert_true(w[1].q == w[0].q && w[2].q == w[0].q);
	/* A PUT of the key meanwhile waits on the promotion's page too (ops.c [page-wake]). */
	pg = store_find(&F.b.store, F.n->id, &k1);
	assert_non_null(pg);
	assert_int_equal(pg->state, PAGE_WRITING);
	assert_true(store_waiters(pg) == w[0].q);
	list_add_tail(&w[0].q->ops, &w[3].link);
	assert_int_equal(ask(2, 2, &w[4]), -1); /* queue depth 1: waits for room */
	assert_true(w[4].q != w[0].q);
	assert_non_null(w[0].pg); /* a promotion: a hit after it is the disk's ([hist]) */
	assert_null(w[4].pg);	  /* no promotion yet: room first */
	assert_int_equal(tstat("joined"), 2);
	assert_int_equal(tstat("parked"), 1);
	/* RAM is not full, but demotions in flight would make room: an allocation may wait. */
	assert_int_equal(tier_wait_alloc(&F.b, &on), 1);
	assert_true(on.q == w[4].q);
	D.hold = 0;
	settle();
	for (int i = 0; i < 5; i++)
		assert_true(woken(&w[i]));
	assert_int_equal(ask(1, 0, &w[0]), 1);
	check_slot(0, 1);
	assert_int_equal(ask(1, 1, &w[1]), 1);
	check_slot(1, 1);
	assert_true(in_ram(1)); /* the PUT finds it stored: EXISTED, no hang */
	assert_int_equal(fetch(2, 2), 1);
	check_slot(2, 2);
	assert_int_equal(tstat("promotions"), 2);
	assert_int_equal(tstat("reads"), 2);
	/* Nothing in flight: an allocation does not wait. */
	assert_int_equal(tier_wait_alloc(&F.b, &on), 0);
	stop(0);
}

static void test_tier_crc_mismatch_misses(void **state)
{
	struct waiter w[2];
	kvb_key k = key_of(5);

	(void)state;
	start(64 * KiB, 16 * MiB, 8);
	store_page(5);
	demote_all();
	/* Its payload follows its header block at the log's start. */
	D.img[0][SLOT_DATA_OFF + SLOT_BLOCK + 100] ^= 0x01;
	assert_int_equal(ask(5, 0, &w[0]), -1);
	assert_int_equal(ask(5, 1, &w[1]), -1); /* joins */
	settle();
	assert_true(woken(&w[0]) && woken(&w[1]));
	assert_int_equal(tstat("corrupt"), 1);
	assert_false(in_ram(5));	       /* aborted: never a wrong page */
	assert_false(tier_has(&F.b, F.n, &k)); /* a copy that cannot be read is no copy */
	assert_int_equal(ask(5, 0, &w[0]), 0); /* so both miss */
	assert_int_equal(ask(5, 1, &w[1]), 0);
	stop(0);
}

static void test_tier_log_wraps(void **state)
{
	uint64_t stride = slot_stride(64 * KiB), room = 2 * MiB - SLOT_DATA_OFF;
	uint32_t fit = (uint32_t)(room / stride), n = fit + 6;

	(void)state;
	/* A 2 MiB path: 1 MiB of superblock, room for `fit` slots after it. */
	start(64 * KiB, 2 * MiB, 8);
	for (uint32_t i = 0; i < n; i += 4) {
		for (uint32_t j = i; j < i + 4 && j < n; j++)
			store_page(j);
		demote_all();
	}
	assert_int_equal(tstat("demotions"), n);
	assert_true(tstat("dropped") >= 6);
	assert_true(tstat("pages") <= fit);
	/* The oldest went first; the newest are there. */
	assert_int_equal(fetch(0, 0), 0);
	assert_int_equal(fetch(n - 1, 1), 1);
	check_slot(1, n - 1);
	stop(0);
}

/*
 * A promotion whose RAM allocation demotes a page while the log head sits on the very slot
 * being promoted (a read sweeping the log oldest first, RAM full of dirty pages): the slot is
 * held across the allocation, so the head stops at it instead of freeing it under the
 * promotion (a use-after-free that hijacked the new demotion's slot: t_disk_tmpfs lost a
 * recent page under load). Its promotion misses (nothing can make room but dropping it); the
 * next slot's promotion waits for the demotion and is served exact.
 */
static void test_tier_promote_at_log_head(void **state)
{
	uint64_t stride = slot_stride(64 * KiB), room = 2 * MiB - SLOT_DATA_OFF;
	uint32_t fit = (uint32_t)(room / stride), ram = (uint32_t)(8 * MiB / (64 * KiB));

	(void)state;
	start(64 * KiB, 2 * MiB, 8);
	for (uint32_t i = 0; i < fit; i++)
		store_page(i);
	demote_all();
	assert_int_equal(tstat("pages"), fit);
	assert_int_equal(tstat("dropped"), 0);
	for (uint32_t i = 0; i < ram; i++) /* RAM full, every page dirty */
		store_page(100 + i);
	assert_int_equal(fetch(0, 0), 0);
	assert_int_equal(fetch(1, 1), 1);
	check_slot(1, 1);
	assert_int_equal(tstat("corrupt"), 0);
	settle(); /* the demotions the allocations started land before the tier closes */
	stop(0);
}

static void test_tier_scan_slot_straddles_regions(void **state)
{
	uint64_t page = 256 * KiB, stride = slot_stride(page);
	/*
	 * Slots follow one another from SLOT_DATA_OFF, and the scan reads 32 MiB regions from
	 * there: slot `cross` starts in the first region and ends in the second.
	 */
	uint32_t cross = (uint32_t)((32 * MiB) / stride), n = cross + 4;

	(void)state;
	assert_true(cross * stride < 32 * MiB && (cross + 1) * stride > 32 * MiB);
	start(page, 48 * MiB, 8);
	for (uint32_t i = 0; i < n; i += 8) {
		for (uint32_t j = i; j < i + 8 && j < n; j++)
			store_page(j);
		demote_all();
	}
	assert_int_equal(tstat("demotions"), n);
	stop(1);

	D.warm = 1;
	start(page, 48 * MiB, 8);
	assert_int_equal(tstat("pages"), n);
	assert_int_equal(tstat("torn"), 0);
	assert_int_equal(tstat("corrupt"), 0);
	assert_int_equal(fetch(cross, 0), 1);
	assert_int_equal(fetch(n - 1, 1), 1);
	check_slot(0, cross);
	check_slot(1, n - 1);
	stop(0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_tier_demote_then_promote),
		cmocka_unit_test(test_tier_part_forget),
		cmocka_unit_test(test_tier_joined_and_parked_promotions),
		cmocka_unit_test(test_tier_crc_mismatch_misses),
		cmocka_unit_test(test_tier_log_wraps),
		cmocka_unit_test(test_tier_promote_at_log_head),
		cmocka_unit_test(test_tier_scan_slot_straddles_regions),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
