// SPDX-License-Identifier: MIT
/*
 * t_rel_overload.c - promise 9 (docs/reliability.md): overload.
 *
 * Per-client limits are flags, each enforced with a clean error: --max-sq-entries (a larger ask
 * is clamped), --max-leases (-EDQUOT), --max-ns (-EMFILE), --max-bufs (-EMFILE),
 * --max-buf-bytes (-ENOMEM), --max-clients (-EUSERS); and a broker started under a soft fd
 * limit of 64 raises it so that --max-clients can attach (it used to refuse clients from
 * about the 15th on, as "out of memory").
 * Then overload: the sustainable rate of one closed-loop client is measured; 10 flooding
 * clients then offer as much as they can (async GETs, never waiting for completions before
 * submitting more) and 2 hostile raw clients fill their rings and never reap. Checked: the
 * flooders meet back-pressure (kvb_submit takes fewer than offered: the ring is full) instead of
 * unbounded queues; the stalled clients hurt nobody; the broker's anonymous memory (RssAnon, so
 * the prefaulted pool's shared pages do not count) stays flat; afterwards an honest client is
 * served at once. Reported: sustainable and achieved rates, back-pressure, memory.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "reliab.h"

#define NFLOOD 10
#define SEED 909
#define NKEYS 64

struct shared {
	char sock[108];
	_Atomic int stop;
	_Atomic uint64_t offered, accepted, completed, errors, busy;
	struct harness_gate ready;
};

static struct shared *sh;

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "test/overload", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256); /* 4 KiB */
}

static int flooder(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .name = "flood", .sq_entries = 64};
	struct kvb_layout l;
	struct kvb_op ops[256];
	struct kvb_completion done[256];
	kvb_client *c;
	uint32_t ns, bid;
	size_t pb;
	uint8_t *buf;
	uint64_t acc = 0, got = 0;

	(void)arg;
	CHECK_OK(kvb_connect(&o, &c));
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	buf = kvb_buf_alloc_host(c, 64 * pb, &bid);
	CHECK(buf != NULL);
	memset(ops, 0, sizeof(ops));
	for (int i = 0; i < 256; i++) {
		ops[i].opcode = KVB_OP_GET;
		ops[i].ns = ns;
		ops[i].buf = bid;
		ops[i].off = (uint64_t)(i % 64) * pb;
		ops[i].key = harness_key(SEED, (uint64_t)(idx + i) % NKEYS);
	}
	harness_gate_open(&sh->ready, 1);
	while (!sh->stop) {
		/* Offer 256 at once, far beyond the ring: the rest is back-pressure. */
		int n = kvb_submit(c, ops, 256), k;

		sh->offered += 256;
		if (n < 0) {
			sh->errors++;
			continue;
		}
		sh->accepted += (uint64_t)n;
		acc += (uint64_t)n;
		if (n < 256)
			sh->busy++;
		k = kvb_reap(c, done, 256, 0, 0);
		if (k > 0) {
			sh->completed += (uint64_t)k;
			got += (uint64_t)k;
			for (int i = 0; i < k; i++)
				if (done[i].res != (int)pb)
					sh->errors++;
		}
	}
	/* Reap what is still in flight: every accepted op completes. */
	while (got < acc) {
		int k = kvb_reap(c, done, 256, 1, 5000);

		CHECKF(k > 0, "flooder %d: %llu ops in flight never completed: %d", idx,
		       (unsigned long long)(acc - got), k);
		sh->completed += (uint64_t)k;
		got += (uint64_t)k;
	}
	kvb_close(c);
	return 0;
}

static void limits(struct harness_broker *b)
{
	struct harness_raw r;
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c = harness_connect(b, "limits", 1024), *more[40];
	uint32_t ns, id;
	uint8_t page[4096];
	kvb_key k = harness_key(SEED, 0);
	int i, n = 0;
	char model[32];

	CHECK_OK(harness_raw_hello(&r, b->sock, KVB_ABI_MAJOR, 1024));
	CHECK_EQ(r.hdr.sq_entries, 64); /* clamped to --max-sq-entries */
	harness_raw_close(&r);
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	harness_fill(page, sizeof(page), &k, SEED);
	CHECK(kvb_put(c, ns, k, page, sizeof(page)) >= 0);
	for (i = 0; i < 32; i++)
		CHECK_OK(kvb_acquire(c, ns, k, &lease));
	CHECK_RC(kvb_acquire(c, ns, k, &lease), -EDQUOT);
	for (i = 1; i < 4; i++) {
		snprintf(model, sizeof(model), "test/overload-%d", i);
		harness_layout(&l, model, KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
		CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	}
	harness_layout(&l, "test/overload-9", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
	CHECK_RC(kvb_ns_open(c, &l, &ns, NULL), -EMFILE);
	/* --max-bufs 4: the library's staging buffer (the PUT above) is one of them. */
	for (i = 0; i < 3; i++)
		CHECK(kvb_buf_alloc_host(c, 4096, &id) != NULL);
	CHECK(kvb_buf_alloc_host(c, 4096, &id) == NULL);
	kvb_close(c);
	c = harness_connect(b, "bytes", 0);
	CHECK(kvb_buf_alloc_host(c, 12u << 20, &id) != NULL);
	CHECK(kvb_buf_alloc_host(c, 8u << 20, &id) == NULL); /* --max-buf-bytes 16M */
	kvb_close(c);
	/* --max-clients 24: the 25th ring client is refused, kvbctl-style control ones are not. */
	for (n = 0; n < 24; n++) {
		struct kvb_opts o = {.socket_path = b->sock, .name = "many", .sq_entries = 8};

		CHECK_OK(kvb_connect(&o, &more[n]));
	}
	{
		struct kvb_opts o = {.socket_path = b->sock, .name = "one-too-many"};
		kvb_client *x = NULL;

		CHECK_RC(kvb_connect(&o, &x), -EUSERS);
	}
	for (i = 0; i < n; i++)
		kvb_close(more[i]);
	c = harness_connect(b, "probe", 0);
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 2000), 1);
	kvb_close(c);
}

/* Regression: the broker raises its soft fd limit to what --max-clients needs. */
static void fd_limit(void)
{
	struct rlimit rl, low;
	struct harness_broker *b;
	kvb_client *c[40];

	CHECK_OK(getrlimit(RLIMIT_NOFILE, &rl));
	if (rl.rlim_max != RLIM_INFINITY && rl.rlim_max < 1024) {
		harness_log("hard fd limit %llu: fd limit check skipped",
			    (unsigned long long)rl.rlim_max);
		return;
	}
	low = rl;
	low.rlim_cur = 64;
	CHECK_OK(setrlimit(RLIMIT_NOFILE, &low));
	b = harness_broker_start("--pool", "64M", "--max-clients", "64", "--arg-size", "4K");
	CHECK_OK(setrlimit(RLIMIT_NOFILE, &rl)); /* ours again: 40 clients need 120 fds here */
	for (int i = 0; i < 40; i++)
		c[i] = harness_connect(b, "fd-limit", 8);
	for (int i = 0; i < 40; i++) {
		CHECK_OK(kvb_nop(c[i]));
		kvb_close(c[i]);
	}
	harness_broker_stop(b);
}

/* Fills its SQ and never reaps: its CQ fills, and the broker stops taking its SQEs. */
static void stalled_client(struct harness_raw *r)
{
	struct kvb_sqe nop[64];

	memset(nop, 0, sizeof(nop));
	CHECK_OK(harness_raw_hello(r, sh->sock, KVB_ABI_MAJOR, 64));
	for (int round = 0; round < 4; round++) {
		CHECK_GE(harness_raw_submit(r, nop, 64), 0);
		rel_sleep_ms(20);
	}
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct harness_raw st1, st2;
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;
	size_t pb;
	uint8_t page[4096];
	pid_t fl[NFLOOD];
	unsigned secs = (unsigned)rel_pick(2, 5, 30);
	uint64_t t0, n1 = 0, t;
	long rss0, rss_max = 0, rss1;
	double r1, offered, done;

	harness_init(argc, argv);
	rel_deadline(secs + 90);
	b = harness_broker_start("--pool", "64M", "--max-leases", "32", "--max-ns", "4",
				 "--max-bufs", "4", "--max-sq-entries", "64", "--max-inflight",
				 "16", "--max-clients", "24", "--max-buf-bytes", "16M");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->ready);
	harness_log("limits");
	limits(b);
	fd_limit();

	c = harness_connect(b, "honest", 0);
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	for (int i = 0; i < NKEYS; i++) {
		kvb_key k = harness_key(SEED, (uint64_t)i);

		harness_fill(page, pb, &k, SEED);
		CHECK(kvb_put(c, ns, k, page, pb) >= 0);
	}
	/* The sustainable rate of one closed-loop client. */
	t0 = harness_now_ns();
	while ((t = harness_now_ns()) - t0 < 1000000000ull) {
		kvb_key k = harness_key(SEED, n1 % NKEYS);

		CHECK_RC(kvb_get(c, ns, k, page, pb), (long long)pb);
		n1++;
	}
	r1 = (double)n1 / ((double)(t - t0) / 1e9);
	rss0 = rel_status_kb(b->pid, "RssAnon");

	harness_log("overload: %d flooders, 2 stalled clients, %u s", NFLOOD, secs);
	stalled_client(&st1);
	stalled_client(&st2);
	for (int i = 0; i < NFLOOD; i++)
		fl[i] = harness_fork(flooder, i, NULL);
	for (int i = 0; i < NFLOOD; i++)
		harness_gate_wait(&sh->ready, 10000);
	t0 = harness_now_ns();
	while (harness_now_ns() - t0 < (uint64_t)secs * 1000000000ull) {
		long kb = rel_status_kb(b->pid, "RssAnon");

		rss_max = kb > rss_max ? kb : rss_max;
		rel_sleep_ms(50);
	}
	sh->stop = 1;
	t = harness_now_ns();
	CHECK_EQ(harness_wait(fl, NFLOOD, 20000, NULL), 0);
	offered = (double)sh->offered / ((double)(t - t0) / 1e9);
	done = (double)sh->completed / ((double)(t - t0) / 1e9);
	/* The honest client is served at once, and the stalled ones hurt nobody. */
	{
		kvb_key k = harness_key(SEED, 1);

		CHECK_RC(kvb_get(c, ns, k, page, pb), (long long)pb);
		CHECK(harness_verify(page, pb, &k, SEED, "after the flood") == 0);
	}
	rss1 = rel_status_kb(b->pid, "RssAnon");
	CHECK(harness_broker_alive(b));
	CHECK_EQ(sh->errors, 0);
	CHECK_GT(sh->busy, 0);
	CHECK_EQ(sh->accepted, sh->completed);
	rel_figure("sustainable %.0f GET/s (1 client); offered %.0f/s (%.1fx) by %d flooders + 2 "
		   "stalled clients: %.0f/s completed, %llu submits cut short by a full ring "
		   "(back-pressure), 0 errors; broker RssAnon %ld -> max %ld -> %ld KiB",
		   r1, offered, offered / r1, NFLOOD, done, (unsigned long long)sh->busy, rss0,
		   rss_max, rss1);
	/* (Sanitizer builds: their shadow and quarantine memory grow on their own.) */
	CHECKF(rss_max - rss0 < 16 * 1024 || rel_scale() == REL_SMALL,
	       "broker anonymous memory grew %ld KiB under overload", rss_max - rss0);
	harness_raw_close(&st1);
	harness_raw_close(&st2);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
