// SPDX-License-Identifier: MIT
/*
 * t_fairness.c - one client's legal ops must not stall another's (regression: the per-round
 * budget counted copied bytes only, so LOOKUPs of 31,000 keys took an honest client's put+get
 * p50 from 84 us to 95 ms, and view GETs of 1M one-byte segments to 149 ms).
 *
 * An honest client times synchronous put+get pairs of a 16 KiB page (p50, p99) three times:
 * alone, next to a LOOKUP flood (a raw client keeping its SQ full of LOOKUPs of 31,000 keys
 * each), and next to a view-segment flood (view GETs of a 1 MiB page of 1,024 layers x 1,024
 * tokens of one byte, strided so nothing merges: 1M segments per op). The figures are printed
 * (the target is a p99 within 2x of the quiet one). The checks leave room for the scheduler of
 * a shared 2-vCPU machine, where the busy-polling loop, a copy worker and two clients share two
 * cores with whatever else runs, and a p99 is a scheduler tick or two: a flood's p50 within
 * P50_FACTOR of the quiet p50 plus P50_SLACK_US, its p99 within 2x the quiet p99 plus
 * P99_SLACK_US. Before the fix the p50s were 95 ms and 149 ms. Under the sanitizers (KVB_SCALE
 * small) every unit of work costs 5-20x more, and so does a turn: the slack is 10x, and the
 * figures are printed all the same. A failed comparison is measured again, quiet figure
 * included, up to ATTEMPTS times: the regression this guards against fails every attempt by
 * 50-100x, while a busy machine (load 10 on 2 vCPUs: p99 44 ms against 2 ms quiet, once, in a
 * fresh-check chroot) rarely misses twice in a row.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "reliab.h"

#define ITERS 1500 /* put+get pairs per figure; a fifth under the sanitizers */
#define SEED 3131
#define LOOKUP_KEYS 31000
#define VIEW_LAYERS 1024
#define VIEW_TPP 1024
#define P50_FACTOR 4
#define P50_SLACK_US 1000
#define P99_SLACK_US 30000
#define ATTEMPTS 3 /* a regression fails every one; a scheduler hiccup rarely twice */

static struct harness_broker *br;
static volatile int *stop;  /* shared: the flooders run until it is set */
static uint64_t *flood_ops; /* shared: ops each flooder completed */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;

	return x < y ? -1 : x > y;
}

struct figures {
	double p50_us, p99_us;
};

/* ITERS put+get pairs of fresh keys (seed picks them); their latencies' p50 and p99. */
static struct figures honest(kvb_client *c, uint32_t ns, size_t pb, uint8_t *reg, uint64_t seed)
{
	static uint64_t lat[ITERS];
	uint64_t end = harness_now_ms() + 10000;
	int iters = rel_scale() == REL_SMALL ? ITERS / 5 : ITERS, n = 0;
	struct figures f;

	/* At most 10 s: a broker that stalls us shows in the figures without eating the deadline. */
	for (int i = 0; i < iters && harness_now_ms() < end; i++, n++) {
		kvb_key k = harness_key(seed, (uint64_t)i);
		uint64_t t0 = harness_now_ns();

		CHECK_RC(kvb_put(c, ns, k, reg, pb), 0);
		CHECK_RC(kvb_get(c, ns, k, reg + pb, pb), (long long)pb);
		lat[i] = harness_now_ns() - t0;
	}
	qsort(lat, (size_t)n, sizeof(lat[0]), cmp_u64);
	f.p50_us = (double)lat[n / 2] / 1e3;
	f.p99_us = (double)lat[n * 99 / 100] / 1e3;
	return f;
}

/* A raw client keeping its SQ full of LOOKUPs of LOOKUP_KEYS keys each. */
static int lookup_flood(int idx, void *arg)
{
	struct harness_raw r;
	struct kvb_layout l;
	struct kvb_sqe sqes[64];
	struct kvb_cqe cqes[64];
	uint64_t pbytes;
	uint32_t ns, inflight = 0;
	uint8_t *arg_area;

	(void)arg;
	CHECK_OK(harness_raw_hello(&r, br->sock, KVB_ABI_MAJOR, 64));
	harness_layout(&l, "test/fair-lookup", KVB_LAYOUT_MLA, 16, 1, 0, 1, 1024);
	CHECK_OK(harness_raw_ns_open(&r, &l, &ns, &pbytes));
	CHECK_GE(r.hdr.arg_size, LOOKUP_KEYS * (sizeof(kvb_key) + 1));
	arg_area = (uint8_t *)r.region + r.hdr.arg_off;
	for (uint32_t i = 0; i < LOOKUP_KEYS; i++) {
		kvb_key k = harness_key(SEED + 1, i);

		memcpy(arg_area + (size_t)i * sizeof(k), k.b, sizeof(k));
	}
	for (int i = 0; i < 64; i++) {
		memset(&sqes[i], 0, sizeof(sqes[i]));
		sqes[i].opcode = KVB_OP_LOOKUP;
		sqes[i].ns = ns;
		sqes[i].batch.arg_off = 0;
		sqes[i].batch.count = LOOKUP_KEYS;
		sqes[i].batch.out_off = LOOKUP_KEYS * sizeof(kvb_key);
	}
	while (!*stop) {
		int n = harness_raw_submit(&r, sqes, 64 - inflight);

		CHECK_GE(n, 0);
		inflight += (uint32_t)n;
		n = harness_raw_reap(&r, cqes, 64, 1, 100);
		CHECK_GE(n, 0);
		for (int i = 0; i < n; i++)
			CHECK_EQ(cqes[i].res, 0); /* the keys are not stored */
		inflight -= (uint32_t)n;
		flood_ops[idx] += (uint64_t)n;
	}
	harness_raw_close(&r);
	return 0;
}

/*
 * View GETs of a page of VIEW_LAYERS x VIEW_TPP one-byte tokens, strided: 1M segments each, 16 in
 * flight, each into a page slot of its own. (Into one slot, two copy workers wrote the same
 * bytes at once, the parts of two GETs: a race in the client's memory that ThreadSanitizer
 * reported in the broker, and whose report took its exit past the 5 s deadline.)
 */
#define VIEW_INFLIGHT 16
static int view_flood(int idx, void *arg)
{
	static struct kvb_view_part parts[VIEW_LAYERS];
	struct kvb_op ops[VIEW_INFLIGHT];
	struct kvb_completion cs[VIEW_INFLIGHT];
	kvb_client *c = harness_connect(br, "view-flood", 64);
	kvb_key k = harness_key(SEED + 2, 0);
	struct kvb_layout l;
	size_t pb, region = (size_t)VIEW_TPP * 2 * VIEW_INFLIGHT,
		   len = (size_t)VIEW_LAYERS * region;
	uint32_t ns, buf, view, busy = 0; /* bit i: slot i's GET in flight */
	uint8_t *mem;

	(void)arg;
	harness_layout(&l, "test/fair-view", KVB_LAYOUT_MLA, VIEW_TPP, 1, 0, VIEW_LAYERS, 1);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	mem = kvb_buf_alloc_host(c, len, &buf);
	CHECK(mem != NULL);
	memset(mem, 0x5a, len);
	for (uint32_t p = 0; p < VIEW_LAYERS; p++)
		parts[p] = (struct kvb_view_part){.buf = buf, .stride = 2, .base = p * region};
	CHECK_OK(kvb_view_create(c, ns, parts, VIEW_LAYERS, &view));
	/* 1 (stored already) when a missed bound made this a second attempt. */
	CHECK_GE(kvb_view_put(c, view, k, 0), 0);
	while (!*stop) {
		uint32_t n = 0;
		int got;

		for (uint32_t i = 0; i < VIEW_INFLIGHT; i++)
			if (!(busy & (1u << i)))
				ops[n++] = (struct kvb_op){.opcode = KVB_OP_GET,
							   .flags = KVB_OPF_VIEW,
							   .buf = view,
							   .key = k,
							   .off = (uint64_t)i * VIEW_TPP,
							   .user_data = i};
		got = n ? kvb_submit(c, ops, n) : 0;
		CHECK_GE(got, 0);
		for (int i = 0; i < got; i++)
			busy |= 1u << ops[i].user_data;
		got = kvb_reap(c, cs, VIEW_INFLIGHT, 1, 1000);
		if (got == -ETIMEDOUT)
			continue; /* a million segments take a while under the sanitizers */
		CHECK_GE(got, 0);
		for (int i = 0; i < got; i++) {
			CHECK_RC(cs[i].res, (long long)pb);
			busy &= ~(1u << cs[i].user_data);
		}
		flood_ops[idx] += (uint64_t)got;
	}
	kvb_close(c);
	return 0;
}

static struct figures next_to(int (*flood)(int, void *), int idx, const char *what, kvb_client *c,
			      uint32_t ns, size_t pb, uint8_t *reg, uint64_t seed)
{
	struct figures f;
	pid_t pid;
	uint64_t before;

	*stop = 0;
	pid = harness_fork(flood, idx, NULL);
	/* Let it get going: its first ops (and the view's 1M-segment PUT) come first. */
	for (int i = 0; i < 3000 && flood_ops[idx] < 4; i++)
		usleep(10000);
	CHECKF(flood_ops[idx] > 0, "the %s flood never got going", what);
	before = flood_ops[idx];
	f = honest(c, ns, pb, reg, seed);
	*stop = 1;
	CHECK_EQ(harness_wait(&pid, 1, 20000, NULL), 0);
	harness_log("next to a %s flood: p50 %.0f us, p99 %.0f us (%llu flood ops meanwhile)", what,
		    f.p50_us, f.p99_us, (unsigned long long)(flood_ops[idx] - before));
	return f;
}

/* The bounds of the checks below, as one predicate for deciding whether to measure again. */
static int within(const struct figures *f, const struct figures *quiet, double slack)
{
	return f->p50_us <= P50_FACTOR * quiet->p50_us + slack * P50_SLACK_US &&
	       f->p99_us <= 2 * quiet->p99_us + slack * P99_SLACK_US;
}

int main(int argc, char **argv)
{
	struct figures quiet, lk, vw;
	double slack = rel_scale() == REL_SMALL ? 10 : 1;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns, buf;
	size_t pb;
	uint8_t *reg;

	harness_init(argc, argv);
	stop = harness_shared(sizeof(*stop));
	flood_ops = harness_shared(2 * sizeof(*flood_ops));
	br = harness_broker_start("--pool", "256M");
	c = harness_connect(br, "honest", 0);
	harness_layout(&l, "test/fair-honest", KVB_LAYOUT_MLA, 16, 1, 0, 1, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	reg = kvb_buf_alloc_host(c, 2 * pb, &buf);
	CHECK(reg != NULL);
	harness_fill(reg, pb, &(kvb_key){{0}}, SEED);

	(void)honest(c, ns, pb, reg, SEED + 100); /* warm-up */
	for (int a = 1;; a++) {
		uint64_t seed = SEED + 101 + 10 * (uint64_t)a;
		int ok;

		quiet = honest(c, ns, pb, reg, seed);
		harness_log("attempt %d: quiet: p50 %.0f us, p99 %.0f us", a, quiet.p50_us,
			    quiet.p99_us);
		lk = next_to(lookup_flood, 0, "LOOKUP", c, ns, pb, reg, seed + 1);
		vw = next_to(view_flood, 1, "view-segment", c, ns, pb, reg, seed + 2);
		printf("fairness (attempt %d): quiet p50 %.0f p99 %.0f us; LOOKUP flood p50 %.0f "
		       "p99 %.0f us (%.1fx); view flood p50 %.0f p99 %.0f us (%.1fx)\n",
		       a, quiet.p50_us, quiet.p99_us, lk.p50_us, lk.p99_us,
		       lk.p99_us / quiet.p99_us, vw.p50_us, vw.p99_us, vw.p99_us / quiet.p99_us);
		ok = within(&lk, &quiet, slack) && within(&vw, &quiet, slack);
		if (ok || a == ATTEMPTS)
			break;
	}
	CHECKF(lk.p50_us <= P50_FACTOR * quiet.p50_us + slack * P50_SLACK_US,
	       "LOOKUP flood: p50 %.0f us against %.0f us quiet", lk.p50_us, quiet.p50_us);
	CHECKF(vw.p50_us <= P50_FACTOR * quiet.p50_us + slack * P50_SLACK_US,
	       "view flood: p50 %.0f us against %.0f us quiet", vw.p50_us, quiet.p50_us);
	CHECKF(lk.p99_us <= 2 * quiet.p99_us + slack * P99_SLACK_US,
	       "LOOKUP flood: p99 %.0f us against %.0f us quiet", lk.p99_us, quiet.p99_us);
	CHECKF(vw.p99_us <= 2 * quiet.p99_us + slack * P99_SLACK_US,
	       "view flood: p99 %.0f us against %.0f us quiet", vw.p99_us, quiet.p99_us);
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}
