// SPDX-License-Identifier: MIT
/*
 * t_leases_kill.c - a client's death releases everything it held (rule 5, docs/design.md). A child
 * acquires leases on every page (one page twice) and is killed with SIGKILL; another exits
 * without kvb_close(). Within 2 s the broker has dropped both clients and their leases, while
 * the lease the test itself holds is untouched; and the pages are really unpinned: pressure
 * evicts every one of them except the page the test still leases.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define NKEYS 20
#define SEED 555

struct shared {
	kvb_key keys[NKEYS];
	char sock[108];
	struct harness_gate ready;
};

static struct shared *sh;

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "test/leases", KVB_LAYOUT_MLA, 64, 1, 0, 16, 1024); /* 1 MiB */
}

/* idx 0: acquire and wait to be killed; idx 1: acquire and _exit without closing. */
static int holder(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .name = idx ? "exiter" : "victim"};
	struct kvb_layout l;
	struct kvb_lease lease, extra;
	kvb_client *c = NULL;
	uint32_t ns;
	size_t pb;

	(void)arg;
	CHECK_OK(kvb_connect(&o, &c));
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	for (int k = 0; k < NKEYS; k++) {
		CHECK_OK(kvb_acquire(c, ns, sh->keys[k], &lease));
		CHECK(harness_verify(lease.data, pb, &sh->keys[k], SEED, "holder lease") == 0);
	}
	CHECK_OK(kvb_acquire(c, ns, sh->keys[0], &extra)); /* a second lease on one page */
	harness_gate_open(&sh->ready, 1);
	if (idx == 1)
		_exit(0); /* no kvb_close(): the hang-up alone must release */
	for (;;)
		pause();
	return H_FAIL;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_lease mine;
	kvb_client *c;
	uint32_t ns;
	size_t pb, hits;
	uint8_t *page;
	pid_t victim, exiter;
	int status;
	uint64_t t0, leases;
	char *json;

	harness_init(argc, argv);
	/* Lease limits off: the point is a killed client holding many leases. */
	b = harness_broker_start("--pool", "64M", "--max-lease-bytes", "100%", "--max-pinned",
				 "100");
	sh = harness_shared(sizeof(*sh));
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	harness_gate_init(&sh->ready);
	c = harness_connect(b, "t_leases_kill", 0);
	layout(&l);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	page = malloc(pb);
	CHECK(page != NULL);
	for (int k = 0; k < NKEYS; k++) {
		sh->keys[k] = harness_key(SEED, (uint64_t)k);
		harness_fill(page, pb, &sh->keys[k], SEED);
		CHECK_RC(kvb_put(c, ns, sh->keys[k], page, pb), 0);
	}
	CHECK_OK(kvb_acquire(c, ns, sh->keys[NKEYS - 1], &mine));

	victim = harness_fork(holder, 0, NULL);
	harness_gate_wait(&sh->ready, 10000);
	exiter = harness_fork(holder, 1, NULL);
	harness_gate_wait(&sh->ready, 10000);
	CHECK_EQ(harness_wait(&exiter, 1, 10000, NULL), 0);

	json = harness_stats(c);
	leases = harness_stat_u64(json, "leases");
	harness_log("before the kill: %llu leases, %llu clients", (unsigned long long)leases,
		    (unsigned long long)harness_stat_u64(json, "clients"));
	/* The exiter's may already be gone; the victim's 21 and ours must be there. */
	CHECK_GE(leases, NKEYS + 2);
	CHECK_LE(leases, 2 * (NKEYS + 1) + 1);
	CHECK_EQ(harness_stat_u64(json, "client_list[name=victim].leases"), NKEYS + 1);
	free(json);

	CHECK_EQ(kill(victim, SIGKILL), 0);
	CHECK_EQ(waitpid(victim, &status, 0), victim);
	CHECK(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
	t0 = harness_now_ms();
	leases = harness_stat_wait(c, "leases", 1, 2000);
	CHECKF(leases == 1, "%llu leases 2 s after the holders died; want 1 (the test's own)",
	       (unsigned long long)leases);
	harness_log("leases released %llu ms after SIGKILL",
		    (unsigned long long)(harness_now_ms() - t0));
	CHECK_EQ(harness_stat_wait(c, "clients", 1, 2000), 1);
	json = harness_stats(c);
	CHECK(!harness_stat_has(json, "client_list[name=victim]"));
	CHECK(!harness_stat_has(json, "client_list[name=exiter]"));
	CHECK_GE(harness_stat_u64(json, "counters.disconnects"), 2);
	free(json);

	/* The pages are evictable again: 100 new 1 MiB pages push all but ours out. */
	for (int k = 0; k < 100; k++) {
		kvb_key nk = harness_key(SEED + 1, (uint64_t)k);

		harness_fill(page, pb, &nk, SEED);
		CHECK_RC(kvb_put(c, ns, nk, page, pb), 0);
	}
	for (int k = 0; k < NKEYS - 1; k++) {
		CHECK_OK(kvb_lookup(c, ns, &sh->keys[k], 1, &hits));
		CHECKF(hits == 0, "key %d survived the pressure after its holders died", k);
	}
	CHECK_OK(kvb_lookup(c, ns, &sh->keys[NKEYS - 1], 1, &hits));
	CHECKF(hits == 1, "the page the test still leases was evicted");
	CHECK(harness_verify(mine.data, pb, &sh->keys[NKEYS - 1], SEED, "own lease") == 0);
	CHECK_OK(kvb_release(c, &mine));
	CHECK_EQ(harness_stat(c, "leases"), 0);

	free(page);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
