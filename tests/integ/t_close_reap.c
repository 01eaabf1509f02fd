// SPDX-License-Identifier: MIT
/*
 * t_close_reap.c - kvb_close() while other threads wait in kvb_reap(-1) on the same client.
 * Regression: the reaper slept in poll() on the client's doorbell without the lock, kvb_close()
 * took the free lock, closed the fds and freed the client under it: the reaper blocked forever
 * (closing an fd does not wake a poll() on it) or woke into freed memory. Now every reaper wakes
 * and returns -ESHUTDOWN, and kvb_close() returns only after they left (so no thread touches
 * freed memory: run it under ASan/TSan too).
 * Rounds: one reaper (the poller, in poll()); three reapers (one poller, two on the condition
 * variable); two reapers with async GETs in flight that complete meanwhile; each round must
 * finish within 3 s, every reaper's result -ESHUTDOWN.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"

#define MAXR 3

struct reaper {
	kvb_client *c;
	pthread_t t;
	_Atomic int started, done;
	int rc;
};

static void *reap_forever(void *arg)
{
	struct reaper *r = arg;
	struct kvb_completion out[8];
	int rc;

	r->started = 1;
	/* Keep reaping until the client is closed: completions may arrive meanwhile. */
	do
		rc = kvb_reap(r->c, out, 8, 8, -1);
	while (rc >= 0);
	r->rc = rc;
	r->done = 1;
	return NULL;
}

static void round_of(struct harness_broker *b, int nreapers, int inflight)
{
	struct reaper r[MAXR];
	struct kvb_layout l;
	kvb_client *c = harness_connect(b, "t_close_reap", 0);
	uint64_t t0;
	uint32_t ns, bid;
	uint8_t *buf;

	memset(r, 0, sizeof(r));
	harness_layout(&l, "test/close-reap", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256); /* 4 KiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	buf = kvb_buf_alloc_host(c, 64 * 4096, &bid);
	CHECK(buf != NULL);
	for (int i = 0; i < nreapers; i++) {
		r[i].c = c;
		CHECK_OK(pthread_create(&r[i].t, NULL, reap_forever, &r[i]));
	}
	for (int i = 0; i < nreapers; i++)
		while (!r[i].started)
			usleep(1000);
	usleep(100 * 1000); /* asleep in poll() or on the condition variable by now */
	if (inflight) {
		struct kvb_op ops[16];

		memset(ops, 0, sizeof(ops));
		for (int i = 0; i < 16; i++) {
			ops[i].opcode = KVB_OP_GET;
			ops[i].ns = ns;
			ops[i].buf = bid;
			ops[i].off = (uint64_t)i * 4096;
			ops[i].key = harness_key(5, (uint64_t)i);
		}
		CHECK_RC(kvb_submit(c, ops, 16), 16); /* misses: 16 completions, 8 + 8 reaped */
		usleep(20 * 1000);
	}
	t0 = harness_now_ms();
	kvb_close(c);
	for (int i = 0; i < nreapers; i++) {
		struct timespec ts;

		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 3;
		CHECKF(pthread_timedjoin_np(r[i].t, NULL, &ts) == 0,
		       "%d reapers, %d in flight: reaper %d still blocked 3 s after kvb_close()",
		       nreapers, inflight, i);
		CHECKF(r[i].rc == -ESHUTDOWN, "reaper %d returned %d (%s)", i, r[i].rc,
		       harness_strerror(r[i].rc));
	}
	harness_log("%d reaper(s), %s: kvb_close() and every reaper done in %llu ms", nreapers,
		    inflight ? "ops in flight" : "idle",
		    (unsigned long long)(harness_now_ms() - t0));
}

int main(int argc, char **argv)
{
	struct harness_broker *b;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	for (int rep = 0; rep < 5; rep++) {
		round_of(b, 1, 0);
		round_of(b, 3, 0);
		round_of(b, 2, 1);
	}
	CHECK(strstr(kvb_strerror(-ESHUTDOWN), "kvb_close") != NULL);
	harness_broker_stop(b);
	return H_PASS;
}
