// SPDX-License-Identifier: MIT
/*
 * t_flood_tail.c - promise 9 (docs/reliability.md): an honest client's tail latency next to
 * floods of long legal ops.
 *
 * An honest client times closed-loop 64 KiB GETs through the broker for 2 s (1 s under the
 * sanitizers) three times: alone (A), next to NFLOOD raw clients keeping their SQs full of
 * LOOKUPs of LOOKUP_KEYS keys each through the argument area (B), and next to NFLOOD clients
 * keeping VIEW_INFLIGHT view GETs and PUTs of a page of VIEW_LAYERS x VIEW_TPP one-byte tokens
 * in flight, through views of kvb_view_create2 strided so that nothing merges: a million
 * segments per op (C). Each phase reports the GETs' p50, p99 and max; how often the broker's
 * loop ran for over 1, 4 and 16 ms of its CPU time without a look at epoll (STATS
 * loop_stretches_over_ms, loop.c [stretch]), which is the broker's own part of any wait; and
 * what the scheduler gave the loop thread and the honest client (/proc schedstat: time run,
 * and time runnable but waiting for a CPU, the client's own sched_yield() spins included).
 *
 * Checked outside the sanitizers (KVB_SCALE small, where every unit of work costs 5-20x more):
 * next to either flood the loop ran for over 4 ms at most STRETCH_NOISE times. Before the
 * view ops' segment lists were mapped rather than doubled on the heap (ops.c [seg-list]) it did
 * 6-46 times a phase, up to 70 ms each; a few stretches are the kernel's (interrupts are
 * charged to the thread they interrupt where IRQ time accounting is off: 4-14 ms now and then,
 * alone too). Where the machine has a CPU for every thread here (TAIL_CPUS), also each flood's
 * p99 within P99_FACTOR of the quiet one plus the flooders' turns (NFLOOD x TURN_US, the
 * round's budget, ops.h OPS_ROUND_WORK): on the shared 2-vCPU development machines the
 * busy-polling loop, two copy workers, the flooders, the honest client and other builds share
 * two cores, and a p99 there is the scheduler's (docs/reliability.md, promise 9, has the
 * figures). A missed check is measured again, quiet phase included, up to ATTEMPTS times.
 *
 * Every client here asks the broker for every page (KVB_CLIENT_DIR=0): through the pool
 * directory the library copies pages itself and the broker would not be measured.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "reliab.h"

#define SEED 4242
#define NFLOOD 2	  /* flooders of each kind */
#define NKEYS 64	  /* the honest client's stored pages */
#define LOOKUP_KEYS 30000 /* keys per LOOKUP */
#define VIEW_LAYERS 1024  /* view flood: parts */
#define VIEW_TPP 1024	  /* ... tokens per page, one byte each: 1M segments per op */
#define VIEW_INFLIGHT 16
#define MAX_SAMPLES (1u << 20)
#define STRETCH_IDX 1	/* the broker's part: its loop's stretches over 4 ms of CPU ... */
#define STRETCH_NOISE 2 /* ... at most this many a phase (the kernel's) */
#define TAIL_CPUS 8	/* CPUs for the loop, 2 workers, 4 flooders and us: p99 checked */
#define P99_FACTOR 10
#define TURN_US 205 /* a turn's budget: OPS_ROUND_WORK units of ~50 ns */
#define ATTEMPTS 3

struct shared {
	volatile int stop;
	uint64_t ops[NFLOOD]; /* ops each flooder completed */
};

static struct harness_broker *br;
static struct shared *sh;
static double lat[MAX_SAMPLES];

struct figures {
	double p50, p99, max; /* us */
	uint64_t n;	      /* GETs timed */
	uint64_t over[3];     /* the loop's stretches over 1, 4 and 16 ms meanwhile */
	double sched[4];      /* ms the loop ran and waited for a CPU, and we */
};

/* A raw client keeping its SQ full of LOOKUPs of LOOKUP_KEYS keys each. */
static int lookup_flood(int idx, void *arg)
{
	struct harness_raw r;
	struct kvb_layout l;
	struct kvb_sqe sqes[64];
	struct kvb_cqe cqes[64];
	uint64_t pbytes;
	uint32_t ns, inflight = 0;
	uint8_t *area;

	(void)arg;
	CHECK_OK(harness_raw_hello(&r, br->sock, KVB_ABI_MAJOR, 64));
	harness_layout(&l, "test/flood-honest", KVB_LAYOUT_MLA, 16, 1, 0, 1, 4096);
	CHECK_OK(harness_raw_ns_open(&r, &l, &ns, &pbytes));
	CHECK_GE(r.hdr.arg_size, LOOKUP_KEYS * (sizeof(kvb_key) + 1));
	area = (uint8_t *)r.region + r.hdr.arg_off;
	/* The honest client's keys among others: every lookup walks the index for real. */
	for (uint32_t i = 0; i < LOOKUP_KEYS; i++) {
		kvb_key k = i % 2 ? harness_key(SEED + 1 + (uint64_t)idx, i)
				  : harness_key(SEED, i / 2 % NKEYS);

		memcpy(area + (size_t)i * sizeof(k), k.b, sizeof(k));
	}
	for (int i = 0; i < 64; i++) {
		memset(&sqes[i], 0, sizeof(sqes[i]));
		sqes[i].opcode = KVB_OP_LOOKUP;
		sqes[i].ns = ns;
		sqes[i].batch.count = LOOKUP_KEYS;
		sqes[i].batch.out_off = LOOKUP_KEYS * sizeof(kvb_key);
	}
	while (!sh->stop) {
		int n = harness_raw_submit(&r, sqes, 64 - inflight);

		CHECK_GE(n, 0);
		inflight += (uint32_t)n;
		n = harness_raw_reap(&r, cqes, 64, 1, 100);
		CHECK_GE(n, 0);
		for (int i = 0; i < n; i++)
			CHECK_GE(cqes[i].res, 0);
		inflight -= (uint32_t)n;
		sh->ops[idx] += (uint64_t)n;
	}
	harness_raw_close(&r);
	return 0;
}

/*
 * Views of VIEW_LAYERS parts of one-byte tokens, two bytes apart: a million segments per op.
 * VIEW_INFLIGHT ops in flight, each on a page slot of its own (two copies into one slot would
 * race in our memory): GETs of one stored page, and PUTs of fresh keys.
 */
static int view_flood(int idx, void *arg)
{
	static struct kvb_view_part2 parts[VIEW_LAYERS];
	struct kvb_op ops[VIEW_INFLIGHT];
	struct kvb_completion cs[VIEW_INFLIGHT];
	kvb_key k = harness_key(SEED + 10 + (uint64_t)idx, 0);
	size_t region = (size_t)VIEW_TPP * 2 * VIEW_INFLIGHT, len = (size_t)VIEW_LAYERS * region;
	uint32_t ns, buf, view, busy = 0; /* bit i: slot i's op in flight */
	uint64_t fresh = 1;
	struct kvb_layout l;
	kvb_client *c;
	uint8_t *mem;
	size_t pb;

	(void)arg;
	c = harness_connect(br, "view-flood", 64);
	harness_layout(&l, "test/flood-view", KVB_LAYOUT_MLA, VIEW_TPP, 1, 0, VIEW_LAYERS, 1);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	mem = kvb_buf_alloc_host(c, len, &buf);
	CHECK(mem != NULL);
	memset(mem, 0x5a, len);
	for (uint32_t p = 0; p < VIEW_LAYERS; p++)
		parts[p] = (struct kvb_view_part2){.buf = buf, .stride = 2, .base = p * region};
	CHECK_OK(kvb_view_create2(c, ns, parts, VIEW_LAYERS, 0, &view));
	CHECK_GE(kvb_view_put(c, view, k, 0), 0); /* 1: stored by an earlier attempt */
	while (!sh->stop) {
		uint32_t n = 0;
		int got;

		for (uint32_t i = 0; i < VIEW_INFLIGHT; i++) {
			if (busy & (1u << i))
				continue;
			ops[n++] = (struct kvb_op){
				.opcode = i % 2 ? KVB_OP_PUT : KVB_OP_GET,
				.flags = KVB_OPF_VIEW,
				.buf = view,
				.key = i % 2 ? harness_key(SEED + 20 + (uint64_t)idx, fresh++) : k,
				.off = (uint64_t)i * VIEW_TPP,
				.user_data = i};
		}
		got = n ? kvb_submit(c, ops, n) : 0;
		CHECK_GE(got, 0);
		for (int i = 0; i < got; i++)
			busy |= 1u << ops[i].user_data;
		got = kvb_reap(c, cs, VIEW_INFLIGHT, 1, 1000);
		if (got == -ETIMEDOUT)
			continue; /* a million segments take a while under the sanitizers */
		CHECK_GE(got, 0);
		for (int i = 0; i < got; i++) {
			CHECK_GE(cs[i].res, 0);
			busy &= ~(1u << cs[i].user_data);
		}
		sh->ops[idx] += (uint64_t)got;
	}
	kvb_close(c);
	return 0;
}

/* A thread's CPU time and time waiting for a CPU so far, in ms (/proc/.../schedstat). */
static void sched_ms(const char *path, double *run, double *wait)
{
	unsigned long long r = 0, w = 0;
	FILE *f = fopen(path, "r");

	if (f) {
		if (fscanf(f, "%llu %llu", &r, &w) != 2)
			r = w = 0;
		fclose(f);
	}
	*run = (double)r / 1e6;
	*wait = (double)w / 1e6;
}

/* What the scheduler gave the broker's loop (its main thread) and us, in ms so far. */
static void sched_now(double v[4])
{
	char path[64];

	snprintf(path, sizeof(path), "/proc/%d/task/%d/schedstat", (int)br->pid, (int)br->pid);
	sched_ms(path, &v[0], &v[1]);
	sched_ms("/proc/thread-self/schedstat", &v[2], &v[3]);
}

/* How many of the loop's stretches so far took more than 1, 4 and 16 ms of its CPU. */
static void stretches(kvb_client *c, uint64_t over[3])
{
	char *js = harness_stats(c);

	over[0] = harness_stat_u64(js, "loop_stretches_over_ms.1");
	over[1] = harness_stat_u64(js, "loop_stretches_over_ms.4");
	over[2] = harness_stat_u64(js, "loop_stretches_over_ms.16");
	free(js);
}

/* Closed-loop 64 KiB GETs of the stored keys for ms: their latencies' figures. */
static struct figures honest(kvb_client *c, uint32_t ns, size_t pb, uint8_t *dst, unsigned ms)
{
	uint64_t end, i = 0, before[3], after[3];
	struct figures f = {0};
	double s0[4], s1[4];

	stretches(c, before);
	sched_now(s0);
	end = harness_now_ns() + (uint64_t)ms * 1000000;
	for (uint64_t t0 = harness_now_ns(); t0 < end && i < MAX_SAMPLES; i++) {
		uint64_t t1;

		CHECK_RC(kvb_get(c, ns, harness_key(SEED, i % NKEYS), dst, pb), (long long)pb);
		t1 = harness_now_ns();
		lat[i] = (double)(t1 - t0) / 1e3;
		t0 = t1;
	}
	sched_now(s1);
	stretches(c, after);
	for (int k = 0; k < 4; k++)
		f.sched[k] = s1[k] - s0[k];
	for (int k = 0; k < 3; k++)
		f.over[k] = after[k] - before[k];
	f.n = i;
	f.max = rel_pct(lat, i, 100);
	f.p50 = rel_pct(lat, i, 50);
	f.p99 = rel_pct(lat, i, 99);
	return f;
}

static struct figures next_to(int (*flood)(int, void *), const char *what, kvb_client *c,
			      uint32_t ns, size_t pb, uint8_t *dst, unsigned ms)
{
	pid_t pids[NFLOOD];
	uint64_t before = 0, after = 0;
	struct figures f;

	sh->stop = 0;
	memset(sh->ops, 0, sizeof(sh->ops));
	for (int i = 0; i < NFLOOD; i++)
		pids[i] = harness_fork(flood, i, NULL);
	/* Going: every flooder completed a few ops (the view's first PUT included). */
	for (int i = 0; i < NFLOOD; i++) {
		for (int t = 0; t < 3000 && sh->ops[i] < 2; t++)
			rel_sleep_ms(10);
		CHECKF(sh->ops[i] >= 2, "%s flooder %d never got going", what, i);
		before += sh->ops[i];
	}
	f = honest(c, ns, pb, dst, ms);
	for (int i = 0; i < NFLOOD; i++)
		after += sh->ops[i];
	sh->stop = 1;
	CHECK_EQ(harness_wait(pids, NFLOOD, 30000, NULL), 0);
	harness_log("%s flood: %llu flood ops meanwhile", what,
		    (unsigned long long)(after - before));
	return f;
}

static void report(const char *phase, const struct figures *f, const struct figures *quiet)
{
	rel_figure(
		"64 KiB GET %s: p50 %.0f us, p99 %.0f us (%.1fx alone), max %.1f ms, %llu GETs; "
		"the broker's loop ran over 1/4/16 ms of CPU without a look at epoll "
		"%llu/%llu/%llu "
		"times; the loop ran %.0f ms and waited %.0f ms for a CPU, the honest client ran "
		"%.0f ms and waited %.0f ms (its yields included)",
		phase, f->p50, f->p99, f->p99 / quiet->p99, f->max / 1e3, (unsigned long long)f->n,
		(unsigned long long)f->over[0], (unsigned long long)f->over[1],
		(unsigned long long)f->over[2], f->sched[0], f->sched[1], f->sched[2], f->sched[3]);
}

/* The broker's part: its loop did not run for over 4 ms of CPU (but for the kernel's few). */
static int loop_ok(const struct figures *f)
{
	return f->over[STRETCH_IDX] <= STRETCH_NOISE;
}

static int tail_ok(const struct figures *f, const struct figures *quiet)
{
	return f->p99 <= P99_FACTOR * quiet->p99 + NFLOOD * TURN_US;
}

int main(int argc, char **argv)
{
	unsigned ms = (unsigned)rel_pick(1000, 2000, 2000);
	int timed = rel_scale() != REL_SMALL;
	int tail = timed && sysconf(_SC_NPROCESSORS_ONLN) >= TAIL_CPUS;
	struct figures quiet, lk, vw;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns, buf;
	uint8_t *mem;
	size_t pb;

	harness_init(argc, argv);
	/* Every page through the broker, the flooders' (forked below) too. */
	setenv("KVB_CLIENT_DIR", "0", 1);
	sh = harness_shared(sizeof(*sh));
	br = harness_broker_start("--pool", "512M");
	c = harness_connect(br, "honest", 0);
	harness_layout(&l, "test/flood-honest", KVB_LAYOUT_MLA, 16, 1, 0, 1, 4096);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, 65536);
	mem = kvb_buf_alloc_host(c, 2 * pb, &buf);
	CHECK(mem != NULL);
	for (uint32_t i = 0; i < NKEYS; i++) {
		kvb_key k = harness_key(SEED, i);

		harness_fill(mem, pb, &k, SEED);
		CHECK_OK(kvb_put(c, ns, k, mem, pb));
	}
	(void)honest(c, ns, pb, mem + pb, 200); /* warm-up */
	for (int a = 1;; a++) {
		int ok;

		quiet = honest(c, ns, pb, mem + pb, ms);
		lk = next_to(lookup_flood, "LOOKUP", c, ns, pb, mem + pb, ms);
		vw = next_to(view_flood, "view-segment", c, ns, pb, mem + pb, ms);
		harness_log("attempt %d", a);
		report("alone", &quiet, &quiet);
		report("beside LOOKUP floods", &lk, &quiet);
		report("beside view-segment floods", &vw, &quiet);
		ok = !timed || (loop_ok(&lk) && loop_ok(&vw) &&
				(!tail || (tail_ok(&lk, &quiet) && tail_ok(&vw, &quiet))));
		if (ok || a == ATTEMPTS)
			break;
	}
	CHECK_GT(lk.n, 0);
	CHECK_GT(vw.n, 0);
	if (timed) {
		CHECKF(loop_ok(&lk), "LOOKUP flood: the loop ran %llu times for over 4 ms",
		       (unsigned long long)lk.over[STRETCH_IDX]);
		CHECKF(loop_ok(&vw), "view flood: the loop ran %llu times for over 4 ms",
		       (unsigned long long)vw.over[STRETCH_IDX]);
	}
	if (tail) {
		CHECKF(tail_ok(&lk, &quiet), "LOOKUP flood: p99 %.0f us against %.0f us alone",
		       lk.p99, quiet.p99);
		CHECKF(tail_ok(&vw, &quiet), "view flood: p99 %.0f us against %.0f us alone",
		       vw.p99, quiet.p99);
	}
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}
