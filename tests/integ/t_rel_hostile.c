// SPDX-License-Identifier: MIT
/*
 * t_rel_hostile.c - promise 4 (docs/reliability.md): a violation costs only the violator.
 *
 * Two phases of the same length on one broker. Phase A: 8 honest client processes run a
 * verified PUT/GET/LOOKUP load (every page's bytes are a function of its key; every GET is
 * checked) and record each op's latency. Phase B: the same 8 honest clients, plus 8 hostile
 * raw clients that send malformed descriptors - bad opcodes, reserved bits, unknown namespaces
 * and buffers, out-of-range and overflowing offsets, LOOKUPs past the argument area, forged
 * leases - paced to send their quota (1,000,000 in all under make soak, 100,000 in make test,
 * 10,000 under the sanitizers) over the phase; every 50th batch (from the 3rd) instead
 * commits a violation that must end its session (an impossible SQ tail or CQ head, a garbage
 * datagram), and the client reconnects. Checked: the broker never dies; every malformed
 * descriptor got an error CQE or its session was ended with a reason in the broker's log;
 * honest clients saw 0 mismatches and 0 unexpected errors. Reported (not asserted: this
 * 2-core machine is shared and noisy): honest p50/p99 in both phases, and the p99 ratio (the
 * promise: within +25%).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "reliab.h"

#define NHONEST 8
#define NHOSTILE 8
#define SEED 808
#define NKEYS 2000
#define NBUCKETS 1400
#define BUFLEN (64 * 1024)

struct shared {
	char sock[108];
	_Atomic int phase; /* 0 A, 1 B, 2 stop */
	_Atomic uint64_t hist[2][NBUCKETS];
	_Atomic uint64_t ops[2], mismatches, errors;
	_Atomic uint64_t bad_sent, bad_rejected, bad_unanswered, violations, reconnects;
	_Atomic int hostile_done;
	uint64_t quota;	 /* malformed descriptors per hostile client */
	uint64_t gap_us; /* pause between its batches */
	struct harness_gate go;
};

static struct shared *sh;

static int bucket(double us)
{
	int i = us <= 1 ? 0 : (int)(log(us) / log(1.02));

	return i < NBUCKETS ? i : NBUCKETS - 1;
}

static double bucket_us(int i)
{
	return pow(1.02, i + 0.5);
}

static double hist_pct(int ph, double p)
{
	uint64_t total = 0, acc = 0;

	for (int i = 0; i < NBUCKETS; i++)
		total += sh->hist[ph][i];
	for (int i = 0; i < NBUCKETS; i++) {
		acc += sh->hist[ph][i];
		if (total && (double)acc >= p / 100.0 * (double)total)
			return bucket_us(i);
	}
	return 0;
}

static uint64_t rnd(uint64_t *s)
{
	*s ^= *s << 13;
	*s ^= *s >> 7;
	*s ^= *s << 17;
	return *s;
}

static int honest(int idx, void *arg)
{
	char name[32];
	struct kvb_opts o = {.socket_path = sh->sock, .name = name};
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns, bid;
	size_t pb;
	uint8_t *buf;
	uint64_t s = (uint64_t)idx + 77;

	(void)arg;
	snprintf(name, sizeof(name), "honest-%d", idx);
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, "test/hostile", KVB_LAYOUT_MLA, 16, 1, 0, 2, 512); /* 16 KiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	buf = kvb_buf_alloc_host(c, 2 * pb, &bid);
	CHECK(buf != NULL);
	harness_gate_wait(&sh->go, 30000);
	while (sh->phase < 2) {
		int ph = sh->phase, rc;
		uint64_t x = rnd(&s), t0;
		kvb_key k = harness_key(SEED, x % NKEYS);
		size_t hits;

		if (x % 3 == 0)
			harness_fill(buf, pb, &k, SEED);
		t0 = harness_now_ns();
		switch (x % 3) {
		case 0:
			rc = kvb_put(c, ns, k, buf, pb);
			rc = rc > 0 ? 0 : rc;
			break;
		case 1:
			rc = kvb_get(c, ns, k, buf + pb, pb);
			break;
		default:
			rc = kvb_lookup(c, ns, &k, 1, &hits);
			break;
		}
		sh->hist[ph][bucket((double)(harness_now_ns() - t0) / 1e3)]++;
		sh->ops[ph]++;
		if (x % 3 == 1 && rc == (int)pb) {
			if (harness_verify(buf + pb, pb, &k, SEED, "honest GET"))
				sh->mismatches++;
		} else if (rc < 0 && rc != -ENOENT) {
			printf("honest-%d: %d (%s)\n", idx, rc, harness_strerror(rc));
			sh->errors++;
		}
	}
	kvb_close(c);
	return 0;
}

/* One malformed SQE of kind i (each must be answered with an error CQE). */
static void bad_sqe(struct kvb_sqe *q, uint64_t x, uint32_t ns, uint64_t pb, uint32_t arg_size)
{
	memset(q, 0, sizeof(*q));
	q->user_data = x;
	q->ns = ns;
	q->opcode = KVB_OP_GET;
	switch (x % 10) {
	case 0:
		q->opcode = (uint8_t)(KVB_OP__COUNT + x % 200);
		break;
	case 1:
		q->opcode = KVB_OP_NOP;
		q->resv0 = (uint16_t)(1 + x % 100);
		break;
	case 2:
		q->ns = 5000 + (uint32_t)(x % 1000);
		break;
	case 3:
		q->buf = 7 + (uint32_t)(x % 200);
		break;
	case 4:
		q->off = BUFLEN - pb + 1 + x % 4096;
		break;
	case 5: /* a stored key (the honest clients'), from outside the buffer */
		q->opcode = KVB_OP_PUT;
		memcpy(q->key, harness_key(SEED, x % 64).b, 32);
		q->off = x % 2 ? UINT64_MAX - x % 1000 : BUFLEN - 8;
		break;
	case 6:
		q->opcode = KVB_OP_LOOKUP;
		q->batch.count = arg_size / 32 + 1 + (uint32_t)(x % 1000);
		break;
	case 7:
		q->opcode = KVB_OP_RELEASE;
		q->ns = 0;
		q->off = x | 1ull << 62;
		break;
	case 8:
		q->flags = 0x80; /* KVB_SQEF_GET: only on a GET that names no buffer */
		q->buf = 1;
		break;
	default:
		q->layer_count = 3; /* a layer range on a buffer GET */
		break;
	}
}

static int hostile(int idx, void *arg)
{
	struct harness_raw r;
	struct kvb_layout l;
	uint64_t s = (uint64_t)idx * 1234567 + 1, sent = 0, batches = 0;
	uint32_t ns = 0, buf;
	uint64_t pb = 0;
	void *map;
	int connected = 0;

	(void)arg;
	harness_layout(&l, "test/hostile", KVB_LAYOUT_MLA, 16, 1, 0, 2, 512);
	while (sh->phase < 1)
		rel_sleep_ms(1);
	while (sent < sh->quota && sh->phase < 2) {
		struct kvb_sqe q[64];
		struct kvb_cqe cqe[64];
		uint32_t n = 64;
		int got = 0, rc;

		if (!connected) {
			CHECK_OK(harness_raw_hello(&r, sh->sock, KVB_ABI_MAJOR, 64));
			CHECK_OK(harness_raw_ns_open(&r, &l, &ns, &pb));
			CHECK_OK(harness_raw_buf_reg(&r, BUFLEN, &buf, &map));
			connected = 1;
		}
		if (++batches % 50 == 3) {
			/* A violation that must end the session. */
			uint64_t x = rnd(&s);

			if (x % 3 == 0) {
				kvb_store_release(
					harness_raw_word(&r, r.hdr.sq_tail_off),
					kvb_load_acquire(harness_raw_word(&r, r.hdr.sq_head_off)) +
						r.hdr.sq_entries + 1 + (uint32_t)(x >> 8) % 1000);
				harness_raw_doorbell(&r);
			} else if (x % 3 == 1) {
				struct kvb_sqe nop = {.opcode = KVB_OP_NOP};

				kvb_store_release(
					harness_raw_word(&r, r.hdr.cq_head_off),
					kvb_load_acquire(harness_raw_word(&r, r.hdr.cq_tail_off)) +
						1 + (uint32_t)(x >> 8) % 5000);
				harness_raw_submit(&r, &nop, 1);
				harness_raw_doorbell(&r);
			} else {
				uint8_t junk[64];

				for (size_t i = 0; i < sizeof(junk); i++)
					junk[i] = (uint8_t)rnd(&s);
				harness_raw_send(&r, junk, sizeof(junk));
			}
			CHECKF(harness_raw_hung_up(&r, 5000),
			       "hostile-%d still connected 5 s "
			       "after a violation",
			       idx);
			harness_raw_close(&r);
			connected = 0;
			sh->violations++;
			sh->reconnects++;
			continue;
		}
		if (n > sh->quota - sent)
			n = (uint32_t)(sh->quota - sent);
		for (uint32_t i = 0; i < n; i++)
			bad_sqe(&q[i], rnd(&s), ns, pb, r.hdr.arg_size);
		rc = harness_raw_submit(&r, q, n);
		CHECK_GE(rc, 0);
		sent += (uint64_t)rc;
		sh->bad_sent += (uint64_t)rc;
		while (got < rc) {
			int k = harness_raw_reap(&r, cqe, 64, 1, 5000);

			CHECKF(k > 0, "hostile-%d: no CQE for its malformed SQEs within 5 s: %d",
			       idx, k);
			for (int i = 0; i < k; i++) {
				if (cqe[i].res < 0)
					sh->bad_rejected++;
				else
					harness_fail(
						__FILE__, __LINE__,
						"a malformed SQE (kind %llu) succeeded: res %d",
						(unsigned long long)(cqe[i].user_data % 10),
						cqe[i].res);
			}
			got += k;
		}
		if (sh->gap_us)
			usleep((useconds_t)sh->gap_us);
	}
	if (connected)
		harness_raw_close(&r);
	sh->hostile_done++;
	return 0;
}

/*
 * Regression: a PUT whose source lies outside its buffer failed only when the key was new; for
 * a stored key it "succeeded" (EXISTED) without the source ever being checked.
 */
static void put_existing_bad_source(struct harness_broker *b, kvb_client *c)
{
	struct harness_raw r;
	struct kvb_layout l;
	struct kvb_sqe q = {.opcode = KVB_OP_PUT, .user_data = 1};
	struct kvb_cqe cqe;
	kvb_key k = harness_key(SEED, 0);
	uint8_t *page;
	uint32_t ns, buf;
	uint64_t pb;
	size_t hpb;
	void *map;

	harness_layout(&l, "test/hostile", KVB_LAYOUT_MLA, 16, 1, 0, 2, 512);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &hpb));
	page = malloc(hpb);
	CHECK(page != NULL);
	harness_fill(page, hpb, &k, SEED);
	CHECK(kvb_put(c, ns, k, page, hpb) >= 0);
	free(page);
	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 8));
	CHECK_OK(harness_raw_ns_open(&r, &l, &ns, &pb));
	CHECK_OK(harness_raw_buf_reg(&r, BUFLEN, &buf, &map));
	q.ns = ns;
	q.buf = buf;
	memcpy(q.key, k.b, 32);
	for (int i = 0; i < 3; i++) {
		q.off = i == 0 ? BUFLEN - 8 : i == 1 ? UINT64_MAX - 5 : 0;
		q.buf = i == 2 ? 99 : buf;
		CHECK_EQ(harness_raw_submit(&r, &q, 1), 1);
		CHECK_EQ(harness_raw_reap(&r, &cqe, 1, 1, 5000), 1);
		CHECKF(cqe.res == (i == 2 ? -EBADF : -EFAULT) && !(cqe.flags & KVB_CQEF_EXISTED),
		       "PUT of a stored key from a bad source %d: res %d flags %u", i, cqe.res,
		       cqe.flags);
	}
	harness_raw_close(&r);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	pid_t hon[NHONEST], hos[NHOSTILE];
	unsigned secs = (unsigned)rel_pick(2, 5, 30);
	uint64_t total = (uint64_t)rel_pick(10000, 100000, 1000000), batches;
	double a50, a99, b50, b99;
	kvb_client *c;
	char *json;

	harness_init(argc, argv);
	rel_deadline(2 * secs + 120);
	b = harness_broker_start("--pool", "128M");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->go);
	sh->quota = total / NHOSTILE;
	batches = sh->quota / 64 + 1;
	sh->gap_us = (uint64_t)secs * 1000000 * 8 / 10 / batches;
	c = harness_connect(b, "monitor", 0);
	put_existing_bad_source(b, c);
	for (int i = 0; i < NHONEST; i++)
		hon[i] = harness_fork(honest, i, NULL);
	for (int i = 0; i < NHOSTILE; i++)
		hos[i] = harness_fork(hostile, i, NULL);
	harness_gate_open(&sh->go, NHONEST);
	harness_log("phase A: %d honest clients, %u s", NHONEST, secs);
	rel_sleep_ms(secs * 1000);
	harness_log("phase B: plus %d hostile clients, %llu malformed descriptors", NHOSTILE,
		    (unsigned long long)total);
	sh->phase = 1;
	rel_sleep_ms(secs * 1000);
	/* The hostile clients finish their quota (on a slow sanitizer build they may lag). */
	for (int i = 0; i < 600 && sh->hostile_done < NHOSTILE; i++)
		rel_sleep_ms(100);
	sh->phase = 2;
	CHECK_EQ(harness_wait(hos, NHOSTILE, 30000, NULL), 0);
	CHECK_EQ(harness_wait(hon, NHONEST, 30000, NULL), 0);
	CHECK(harness_broker_alive(b));
	CHECK_EQ(sh->mismatches, 0);
	CHECK_EQ(sh->errors, 0);
	CHECK_EQ(sh->bad_sent, total);
	CHECK_EQ(sh->bad_rejected, sh->bad_sent);
	json = harness_stats(c);
	CHECK_GE(harness_stat_u64(json, "counters.protocol_errors"), sh->violations);
	free(json);
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 5000), 1);
	CHECK_EQ(harness_stat(c, "leases"), 0);
	{
		/* Every ended session says why in the broker's log. */
		FILE *f = fopen(b->log, "re");
		char line[1024];
		uint64_t logged = 0;

		CHECK(f != NULL);
		while (fgets(line, sizeof(line), f))
			logged += strstr(line, "disconnected: ") &&
				  (strstr(line, "impossible") || strstr(line, "malformed"));
		fclose(f);
		CHECKF(logged == sh->violations, "%llu violations, %llu logged with a reason",
		       (unsigned long long)sh->violations, (unsigned long long)logged);
	}
	a50 = hist_pct(0, 50);
	a99 = hist_pct(0, 99);
	b50 = hist_pct(1, 50);
	b99 = hist_pct(1, 99);
	rel_figure("%llu malformed descriptors from %d hostile clients: %llu rejected with an "
		   "error CQE, %llu sessions ended for index/datagram violations (all logged), "
		   "broker up; honest: %llu + %llu ops, 0 mismatches; honest p50 %.1f -> %.1f us, "
		   "p99 %.1f -> %.1f us (%+.0f%%; promise +25%%, not asserted here)",
		   (unsigned long long)sh->bad_sent, NHOSTILE, (unsigned long long)sh->bad_rejected,
		   (unsigned long long)sh->violations, (unsigned long long)sh->ops[0],
		   (unsigned long long)sh->ops[1], a50, b50, a99, b99,
		   a99 > 0 ? (b99 / a99 - 1) * 100 : 0.0);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
