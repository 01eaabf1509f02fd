// SPDX-License-Identifier: MIT
/*
 * t_reapers.c - regression for a lost wake-up in kvb_reap(): two threads sleep in kvb_reap()
 * for one completion each while a third submits two NOPs and makes a synchronous call. The
 * first reaper to wake used to drain the shared doorbell and leave the other asleep with its
 * completion queued (a one-second stall in 70% of rounds). Every reaper must get its
 * completion promptly, every round.
 */
#include <pthread.h>
#include <unistd.h>

#include "harness.h"

#define ROUNDS 100

static kvb_client *c;
static uint64_t took_ms[2];
static int got[2];

static void *reaper(void *arg)
{
	long i = (long)arg;
	struct kvb_completion cqe;
	uint64_t t0 = harness_now_ms();

	got[i] = kvb_reap(c, &cqe, 1, 1, 2000);
	took_ms[i] = harness_now_ms() - t0;
	return NULL;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_op ops[2] = {{.opcode = KVB_OP_NOP, .user_data = 1},
				{.opcode = KVB_OP_NOP, .user_data = 2}};

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "reapers", 0);
	for (int r = 0; r < ROUNDS; r++) {
		pthread_t th[2];

		for (long i = 0; i < 2; i++)
			CHECK_OK(pthread_create(&th[i], NULL, reaper, (void *)i));
		usleep(2000); /* both asleep in kvb_reap() */
		CHECK_RC(kvb_submit(c, ops, 2), 2);
		CHECK_OK(kvb_nop(c));
		for (int i = 0; i < 2; i++)
			CHECK_OK(pthread_join(th[i], NULL));
		for (int i = 0; i < 2; i++) {
			CHECKF(got[i] == 1, "round %d: reaper %d got %d", r, i, got[i]);
			CHECKF(took_ms[i] < 500, "round %d: reaper %d waited %llu ms", r, i,
			       (unsigned long long)took_ms[i]);
		}
	}
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
