// SPDX-License-Identifier: MIT
/*
 * t_rel_ring_race.c - promise 3 (docs/reliability.md): ring contents are untrusted, and they
 * change while the broker reads them.
 *
 * A hostile raw client runs a thread that, in a tight loop, rewrites every SQE slot (valid
 * PUT/GET/ACQUIRE/RELEASE/LOOKUP/DELETE descriptors with random keys, offsets and counts, and
 * random bytes), the LOOKUP keys in the argument area and the CQE slots, while advancing the SQ
 * tail as far as the ring allows (never to an impossible value) and consuming every CQE.
 * The broker must consume on (it copies each SQE once and validates the copy, so a torn SQE is
 * just another request), never crash, and an honest client in the same namespace must read
 * every one of its pages back byte-exact meanwhile. At the end the hostile thread publishes an
 * impossible tail and must be disconnected with a logged reason. Runs under ASan and TSan too
 * (make asan / make tsan: the broker instrumented, the scribbler one thread so that TSan sees no
 * race inside this process; the cross-process race is the point).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reliab.h"

#define SEED 61
#define BUFLEN (256 * 1024)

static struct harness_broker *b;
static struct harness_raw r;
static uint32_t ns;
static uint64_t pb;
static _Atomic int stop;
static uint64_t rewrites, consumed;

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static void random_sqe(struct kvb_sqe *q, uint64_t *s)
{
	static const uint8_t ops[] = {KVB_OP_PUT,     KVB_OP_GET,     KVB_OP_ACQUIRE,
				      KVB_OP_RELEASE, KVB_OP_LOOKUP,  KVB_OP_DELETE,
				      KVB_OP_NOP,     KVB_OP_PREFETCH};
	uint64_t x = rnd(s);
	kvb_key k = harness_key(SEED + 100, x % 64);

	if ((x >> 8) % 8 == 0) { /* pure garbage */
		for (size_t i = 0; i < sizeof(*q); i += 8) {
			uint64_t v = rnd(s);

			memcpy((uint8_t *)q + i, &v, 8);
		}
		return;
	}
	memset(q, 0, sizeof(*q));
	q->opcode = ops[(x >> 12) % sizeof(ops)];
	q->ns = (x >> 20) % 16 ? ns : (uint32_t)rnd(s);
	q->user_data = x;
	if (q->opcode == KVB_OP_LOOKUP) {
		q->batch.arg_off = (uint32_t)((x >> 24) % 64) * 32;
		q->batch.count = (uint32_t)((x >> 32) % 40);
		q->batch.out_off = 8192 + (uint32_t)((x >> 40) % 64);
		if ((x >> 48) % 16 == 0)
			q->batch.count = (uint32_t)rnd(s); /* out of bounds */
		return;
	}
	memcpy(q->key, k.b, 32);
	q->buf = (x >> 24) % 16 ? 0 : (uint32_t)(x >> 28) % 4;
	q->off = (x >> 32) % 8 ? ((x >> 36) % (BUFLEN / 4096)) * 4096 : rnd(s);
	if (q->opcode == KVB_OP_RELEASE)
		q->off = rnd(s) % 4 ? (x >> 40) : 0;
}

/* The hostile thread: rewrites descriptors, arguments and CQEs; moves the tail and CQ head. */
static void *scribbler(void *arg)
{
	uint64_t s = 0x9e3779b97f4a7c15ull, n = 0;
	uint32_t entries = r.hdr.sq_entries, cq_entries = r.hdr.cq_entries;
	kvb_atomic_u32 *sq_tail = harness_raw_word(&r, r.hdr.sq_tail_off);
	kvb_atomic_u32 *sq_head = harness_raw_word(&r, r.hdr.sq_head_off);
	kvb_atomic_u32 *cq_tail = harness_raw_word(&r, r.hdr.cq_tail_off);
	kvb_atomic_u32 *cq_head = harness_raw_word(&r, r.hdr.cq_head_off);
	uint8_t *region = r.region, *argp = region + r.hdr.arg_off;
	uint32_t tail = kvb_load_relaxed(sq_tail), head0 = kvb_load_acquire(sq_head);

	(void)arg;
	while (!stop) {
		struct kvb_sqe q;
		uint32_t head = kvb_load_acquire(sq_head), slot = (uint32_t)rnd(&s) % entries;
		uint64_t v = rnd(&s);

		/* Any slot, including the ones the broker is copying right now. */
		random_sqe(&q, &s);
		memcpy(region + r.hdr.sqes_off + (size_t)slot * sizeof(q), &q, sizeof(q));
		memcpy(argp + (v % 256) * 32, harness_key(SEED + 100, v % 64).b, 32);
		memcpy(region + r.hdr.cqes_off + (size_t)((v >> 8) % cq_entries) * 32, &v, 8);
		/* Advance the tail as far as the (possibly stale) head allows: never impossible. */
		if (tail - head < entries)
			tail += 1 + (uint32_t)(v >> 20) % (entries - (tail - head));
		kvb_store_release(sq_tail, tail);
		kvb_store_release(cq_head, kvb_load_acquire(cq_tail));
		if ((++n & 255) == 0 && kvb_ring_needs_wakeup(&r.sq, KVB_SQ_NEED_WAKEUP))
			harness_raw_doorbell(&r);
	}
	rewrites = n;
	consumed = kvb_load_acquire(sq_head) - head0;
	return NULL;
}

int main(int argc, char **argv)
{
	struct kvb_layout l;
	kvb_client *c;
	pthread_t th;
	uint32_t buf;
	void *map;
	size_t hpb;
	uint8_t *page;
	int secs = (int)rel_pick(2, 5, 60), rounds = 0, npages = 16;
	uint64_t end;

	harness_init(argc, argv);
	rel_deadline((unsigned)secs + 60);
	b = harness_broker_start("--pool", "64M", "--max-leases", "64");
	c = harness_connect(b, "honest", 0);
	harness_layout(&l, "test/ring-race", KVB_LAYOUT_MLA, 16, 1, 0, 2, 512); /* 16 KiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, &hpb));
	page = malloc(hpb);
	CHECK(page != NULL);
	for (int i = 0; i < npages; i++) {
		kvb_key k = harness_key(SEED, (uint64_t)i);

		harness_fill(page, hpb, &k, SEED);
		CHECK(kvb_put(c, ns, k, page, hpb) >= 0);
	}

	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 64));
	CHECK_OK(harness_raw_ns_open(&r, &l, &ns, &pb));
	CHECK_OK(harness_raw_buf_reg(&r, BUFLEN, &buf, &map));
	CHECK_EQ(buf, 0);
	memset(map, 0x5a, BUFLEN);
	CHECK_OK(pthread_create(&th, NULL, scribbler, NULL));

	/* The honest client, meanwhile: every page back, byte-exact. */
	end = harness_now_ms() + (uint64_t)secs * 1000;
	while (harness_now_ms() < end) {
		for (int i = 0; i < npages; i++) {
			kvb_key k = harness_key(SEED, (uint64_t)i);
			int rc = kvb_get(c, ns, k, page, hpb);

			/* The hostile client may DELETE nothing of ours: its keys are other keys. */
			CHECK_RC(rc, (long long)hpb);
			CHECK(harness_verify(page, hpb, &k, SEED, "honest page during the race") ==
			      0);
		}
		rounds++;
	}
	stop = 1;
	CHECK_OK(pthread_join(th, NULL));
	CHECKF(!harness_raw_hung_up(&r, 10), "the broker ended the hostile session although every "
					     "index it published was possible");
	CHECK(harness_broker_alive(b));
	rel_figure("%ds: %llu SQE rewrites raced %llu SQEs the broker consumed; honest client "
		   "verified %d x %d pages, 0 mismatches",
		   secs, (unsigned long long)rewrites, (unsigned long long)consumed, rounds,
		   npages);
	CHECK_GT(consumed, 1000);

	/* Finally an impossible tail: this session ends, with the reason in the log. */
	kvb_store_release(harness_raw_word(&r, r.hdr.sq_tail_off),
			  kvb_load_acquire(harness_raw_word(&r, r.hdr.sq_head_off)) +
				  r.hdr.sq_entries + 1);
	harness_raw_doorbell(&r);
	CHECK(harness_raw_hung_up(&r, 2000));
	CHECK(harness_broker_log_has(b, "impossible submission-queue tail"));
	harness_raw_close(&r);
	CHECK_EQ(harness_stat_wait(c, "leases", 0, 2000), 0);
	CHECK_OK(kvb_nop(c));
	free(page);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
