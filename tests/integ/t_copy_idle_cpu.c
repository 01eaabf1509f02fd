// SPDX-License-Identifier: MIT
/*
 * t_copy_idle_cpu.c - an idle broker sleeps after copies on its workers. Regression: when a
 * worker copy finished between the loop's read() of the copy engine's eventfd and its taking
 * the done-queue lock, the job completed but the eventfd stayed readable; poll() drained it only
 * while copies were in flight, so the level-triggered epoll returned it at once, forever: an
 * idle broker at 100% of a CPU until the next worker copy (seen after 1 in 4-10 eight-rank runs).
 * Every copy goes to the two workers here (--copy-inline 0); after each of ROUNDS bursts of
 * async PUTs and GETs the broker's CPU time (/proc/PID/stat utime + stime) over 200 ms of
 * idleness must stay under 15% of one CPU (the old broker failed 2 runs in 3, at rounds 13 and
 * 21). test_copy_host holds the race window open to catch it every time; this test catches
 * what reaches a real broker.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"

#define ROUNDS 24
#define BURST 64
#define PAGE (64u << 10)

/* utime + stime of pid, in clock ticks. */
static long long cpu_ticks(pid_t pid)
{
	char path[64], buf[1024], *p;
	unsigned long long ut = 0, st = 0;
	FILE *f;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)pid);
	f = fopen(path, "r");
	CHECK(f != NULL);
	CHECK(fgets(buf, sizeof(buf), f) != NULL);
	fclose(f);
	p = strrchr(buf, ')'); /* the comm field may hold spaces */
	CHECK(p != NULL);
	/* After ") ": state ppid pgrp session tty tpgid flags, 4 fault counts, utime, stime. */
	CHECK(sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %llu %llu", &ut, &st) ==
	      2);
	return (long long)(ut + st);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_op ops[BURST];
	struct kvb_completion done[BURST];
	kvb_client *c;
	uint32_t ns, bid;
	uint8_t *buf;
	long hz = sysconf(_SC_CLK_TCK);
	double worst = 0;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M", "--copy-inline", "0", "--copy-threads", "2");
	c = harness_connect(b, "t_copy_idle_cpu", 0);
	harness_layout(&l, "test/idle-cpu", KVB_LAYOUT_MLA, 16, 1, 0, 4, 1024); /* 64 KiB */
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	buf = kvb_buf_alloc_host(c, (size_t)BURST * PAGE, &bid);
	CHECK(buf != NULL);
	for (int round = 0; round < ROUNDS; round++) {
		long long t0;
		double pct;
		int got = 0;

		memset(ops, 0, sizeof(ops));
		for (int i = 0; i < BURST; i++) {
			ops[i].opcode = round % 2 ? KVB_OP_GET : KVB_OP_PUT;
			ops[i].ns = ns;
			ops[i].buf = bid;
			ops[i].off = (uint64_t)i * PAGE;
			ops[i].key = harness_key(7, (uint64_t)(round / 2 * BURST + i));
		}
		CHECK_RC(kvb_submit(c, ops, BURST), BURST);
		while (got < BURST) {
			int k = kvb_reap(c, done, BURST, 1, 5000);

			CHECKF(k > 0, "round %d: reap %d", round, k);
			for (int i = 0; i < k; i++)
				CHECKF(done[i].res >= 0, "round %d: op failed %d", round,
				       done[i].res);
			got += k;
		}
		usleep(30 * 1000); /* past the busy-poll window */
		t0 = cpu_ticks(b->pid);
		usleep(200 * 1000);
		pct = 100.0 * (double)(cpu_ticks(b->pid) - t0) / (double)hz / 0.2;
		if (pct > worst)
			worst = pct;
		CHECKF(pct < 15,
		       "round %d: the idle broker used %.0f%% of a CPU after worker copies", round,
		       pct);
	}
	harness_log("%d bursts of %d worker copies: idle broker at most %.0f%% of a CPU", ROUNDS,
		    BURST, worst);
	CHECK_GT(harness_stat(c, "copy.queued_jobs"), 0);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
