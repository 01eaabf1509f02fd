// SPDX-License-Identifier: MIT
/*
 * t_release_post.c - kvb_release() of a lease the client holds posts its RELEASE without
 * waiting for the answer (client/ops.c [release-post]), and that changes nothing anyone can
 * see:
 *
 *   - the client's own next control request (stats) sees the lease gone, also when the broker
 *     slept and wakes for the doorbell and the request together (session.c runs the ring
 *     first);
 *   - another client's next request sees the page unpinned and the RELEASE counted, the
 *     broker asleep or not (loop.c runs the rings before it answers requests);
 *   - a lease held twice (two ACQUIREs of one page) takes two releases; a third, a forged id
 *     and another client's id are -EINVAL as before (they wait for the broker);
 *   - an async RELEASE through kvb_submit() of a lease leaves nothing for kvb_release(),
 *     which then fails -EINVAL;
 *   - a client that releases and exits at once leaves no lease and no pinned page behind.
 * These are the broker's leases (--no-directory); t_hazard has the client's own.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reliab.h"

#define PAGE (64u * 1024)
#define SEED 919

static uint32_t ns;

static void put(kvb_client *c, uint8_t *page, uint64_t i)
{
	kvb_key k = harness_key(SEED, i);

	harness_fill(page, PAGE, &k, SEED);
	CHECK(kvb_put(c, ns, k, page, PAGE) >= 0);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_lease l1, l2;
	kvb_key k0 = harness_key(SEED, 0);
	uint8_t *page = malloc(PAGE);
	kvb_client *a, *o;
	uint64_t rel;
	pid_t pid;
	int st;

	harness_init(argc, argv);
	CHECK(page != NULL);
	/* The broker's own leases: without a directory no lease is the client's ([hazard]). */
	b = harness_broker_start("--pool", "64M", "--slab", "8M", "--no-directory");
	a = harness_connect(b, "holder", 0);
	o = harness_connect(b, "other", 0);
	harness_layout(&l, "test/release-post", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(a, &l, &ns, NULL));
	CHECK_OK(kvb_ns_open(o, &l, &ns, NULL));
	put(a, page, 0);

	harness_log("own stats right after the release, the broker awake and asleep");
	for (int i = 0; i < 40; i++) {
		CHECK_OK(kvb_acquire(a, ns, k0, &l1));
		if (i % 2)
			rel_sleep_ms(3); /* past the poll window: the broker sleeps */
		CHECK_OK(kvb_release(a, &l1));
		CHECK(l1.data == NULL && l1.len == 0);
		CHECK_EQ(harness_stat(a, "leases"), 0);
	}

	harness_log("another client's next request sees the page unpinned");
	rel = harness_stat(o, "counters.releases");
	for (int i = 0; i < 20; i++) {
		CHECK_OK(kvb_acquire(a, ns, k0, &l1));
		CHECK_EQ(harness_stat(o, "pool.pinned_pages"), 1);
		if (i % 2)
			rel_sleep_ms(3);
		CHECK_OK(kvb_release(a, &l1));
		/* At once, no retry: the broker runs rings before requests (loop.c). */
		CHECK_EQ(harness_stat(o, "pool.pinned_pages"), 0);
		CHECK_EQ(harness_stat(o, "counters.releases"), rel + (uint64_t)i + 1);
	}

	harness_log("two leases on one page, then ids not held");
	CHECK_OK(kvb_acquire(a, ns, k0, &l1));
	CHECK_OK(kvb_acquire(a, ns, k0, &l2));
	CHECK_EQ(l1.id, l2.id);
	{
		struct kvb_lease f = {.id = l1.id};

		CHECK_RC(kvb_release(o, &f), -EINVAL); /* another client's */
		f.id = l1.id ^ (1ull << 40);
		CHECK_RC(kvb_release(a, &f), -EINVAL); /* forged */
	}
	CHECK_OK(kvb_release(a, &l1));
	CHECK_EQ(harness_stat(a, "leases"), 1);
	{
		struct kvb_lease again = {.id = l2.id};

		CHECK_OK(kvb_release(a, &l2));
		CHECK_RC(kvb_release(a, &again), -EINVAL); /* the third */
	}
	CHECK_EQ(harness_stat(a, "leases"), 0);

	harness_log("an async RELEASE leaves nothing for kvb_release");
	{
		struct kvb_op op = {.opcode = KVB_OP_RELEASE};
		struct kvb_completion cqe;

		CHECK_OK(kvb_acquire(a, ns, k0, &l1));
		op.off = l1.id;
		CHECK_RC(kvb_submit(a, &op, 1), 1);
		CHECK_RC(kvb_reap(a, &cqe, 1, 1, 5000), 1);
		CHECK_RC(cqe.res, 0);
		CHECK_RC(kvb_release(a, &l1), -EINVAL);
		CHECK_EQ(harness_stat(a, "leases"), 0);
	}

	harness_log("a client that releases and exits at once");
	pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		struct kvb_opts opt = {.socket_path = b->sock};
		kvb_client *c;
		uint32_t cns;

		if (kvb_connect(&opt, &c) || kvb_ns_open(c, &l, &cns, NULL))
			_exit(1);
		for (int i = 0; i < 50; i++) {
			if (kvb_acquire(c, cns, k0, &l1) || kvb_release(c, &l1))
				_exit(2);
		}
		if (kvb_acquire(c, cns, k0, &l1) || kvb_release(c, &l1))
			_exit(2);
		_exit(0); /* no kvb_close: the last RELEASE may still be in the ring */
	}
	CHECK_EQ(waitpid(pid, &st, 0), pid);
	CHECK(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	CHECK_EQ(harness_stat_wait(o, "leases", 0, 3000), 0);
	CHECK_EQ(harness_stat_wait(o, "pool.pinned_pages", 0, 3000), 0);
	CHECK_RC(kvb_get(o, ns, k0, page, PAGE), (long long)PAGE);
	CHECK_OK(harness_verify(page, PAGE, &k0, SEED, "page after all releases"));

	rel_figure("release without waiting: the client's own and another client's next stats "
		   "request saw it every time (40 + 20 tries, the broker awake and asleep)");
	kvb_close(o);
	kvb_close(a);
	harness_broker_stop(b);
	free(page);
	return H_PASS;
}
