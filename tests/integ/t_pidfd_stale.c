// SPDX-License-Identifier: MIT
/*
 * t_pidfd_stale.c - a client process's exit after its session ended must not reach the next
 * session. Regression: the keeper holds a dup of each session's pidfd in the session's record,
 * so closing the broker's own did not take it out of the epoll set; when the socket's hang-up
 * ended the session before the process had finished exiting, the exit then named the freed
 * session, or the new one calloc gave the same memory, which was ended before its HELLO: a
 * client connecting right after another one exited got -ECONNRESET from kvb_connect() (about
 * one run in four of t_flood_tail), and AddressSanitizer would see a use after free.
 *
 * ROUNDS rounds: two children attach and exit at once (their sockets hang up before their
 * exit completes), then two more attach, each checked with a NOP, and exit too. Every attach
 * must succeed and the broker must still serve the test's own client afterwards.
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "harness.h"

#define ROUNDS 100
#define PAIR 2

static struct harness_broker *br;

/* Attaches, checks the ring with a NOP (check), and exits without kvb_close(). */
static int attach_exit(int idx, void *arg)
{
	struct kvb_op op = {.opcode = KVB_OP_NOP, .user_data = 7};
	struct kvb_completion cs;
	kvb_client *c = harness_connect(br, "attach-exit", 8);

	(void)idx;
	if (arg) {
		CHECK_RC(kvb_submit(c, &op, 1), 1);
		CHECK_RC(kvb_reap(c, &cs, 1, 1, 5000), 1);
		CHECK_EQ(cs.user_data, 7);
	}
	_exit(0);
}

int main(int argc, char **argv)
{
	kvb_client *c;

	harness_init(argc, argv);
	br = harness_broker_start("--pool", "64M");
	c = harness_connect(br, "watcher", 0);
	for (int r = 0; r < ROUNDS; r++) {
		pid_t pids[PAIR];

		for (int i = 0; i < PAIR; i++)
			pids[i] = harness_fork(attach_exit, i, NULL);
		CHECK_EQ(harness_wait(pids, PAIR, 10000, NULL), 0);
		for (int i = 0; i < PAIR; i++)
			pids[i] = harness_fork(attach_exit, i, (void *)1);
		CHECKF(harness_wait(pids, PAIR, 10000, NULL) == 0, "round %d: an attach failed", r);
	}
	CHECK_EQ(harness_stat(c, "counters.protocol_errors"), 0);
	kvb_close(c);
	harness_broker_stop(br);
	return H_PASS;
}
