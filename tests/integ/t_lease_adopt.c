// SPDX-License-Identifier: MIT
/*
 * t_lease_adopt.c - a lease holds across a broker crash and a takeover, though the next broker
 * adopts the pool and reuses every page nobody leases (broker/orphan.c, client/conn.c
 * [retire]).
 *
 * Two holder processes lease pages: one takes every lease from the broker (KVB_CLIENT_DIR=0:
 * ids in the broker's ledger), the other through the pool directory (its hazard table). Then:
 *   1. the broker is SIGKILLed and restarted; before either holder calls the library again, a
 *      filler writes four pools' worth of new pages, so every page not held is reused. Every
 *      leased page must still read its own bytes. Then each holder makes a call (the library
 *      finds its broker gone, takes private copies of its leases and says so in its old
 *      region), and the filler writes the pool over again: the leases still read their bytes,
 *      the new broker has let go of every page it held for them (pool.orphans 0,
 *      pool.orphan_pins 0), and kvb_release() of each returns 0;
 *   2. the same with kvbrokerd --takeover in place of the crash;
 *   3. a holder that exits without calling again after a crash: its pages are let go at its exit;
 *   4. the keeper is killed first (the broker starts another, which must get every session's
 *      record), then the broker: the leases hold as in 1.
 * Before the ledger, the records and the copies, the leased pages held other pages' bytes after
 * the fill and kvb_release() returned 0 all the same.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reliab.h"

#define PAGE (64u * 1024)
#define POOL "32M"
#define NLEASE 24  /* per holder: within the 32 entries of a hazard table */
#define NFILL 2048 /* 128 MiB of new pages: four pools */

struct shared {
	char sock[108];
	_Atomic int step;    /* the test's: 1 leases taken, 2 check, 3 call, 4 check, 5 release */
	_Atomic int done[2]; /* each holder's last step done */
	_Atomic int bad[2];  /* pages read wrong */
	_Atomic int errors[2];
};

static struct shared *sh;
static struct kvb_layout lay;

static int bad_leases(const struct kvb_lease *l, uint64_t seed)
{
	int bad = 0;

	for (int i = 0; i < NLEASE; i++) {
		kvb_key k = harness_key(seed, (uint64_t)i);

		bad += harness_verify(l[i].data, PAGE, &k, seed, "lease") != 0;
	}
	return bad;
}

static void wait_step(int want)
{
	while (sh->step < want)
		rel_sleep_ms(1);
}

/* Holder idx: leases NLEASE pages of its own, then checks them at each step the test sets. */
static int holder(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .reconnect_ms = 10000};
	struct kvb_lease l[NLEASE];
	uint64_t seed = 100 + (uint64_t)idx + 10 * (uint64_t)(uintptr_t)arg;
	uint8_t *page = malloc(PAGE);
	kvb_client *c;
	uint32_t ns;
	long long rc;

	if (idx == 0)
		setenv("KVB_CLIENT_DIR", "0", 1); /* every lease the broker's */
	if (!page || kvb_connect(&o, &c) || kvb_ns_open(c, &lay, &ns, NULL))
		return 1;
	for (int i = 0; i < NLEASE; i++) {
		kvb_key k = harness_key(seed, (uint64_t)i);

		harness_fill(page, PAGE, &k, seed);
		if (kvb_put(c, ns, k, page, PAGE) < 0 || kvb_acquire(c, ns, k, &l[i]) < 0)
			return 2;
	}
	sh->done[idx] = 1;
	wait_step(2);
	sh->bad[idx] += bad_leases(l, seed); /* before any call: the library knows nothing yet */
	sh->done[idx] = 2;
	wait_step(3);
	if (arg) /* case 3: exit without a word */
		return 0;
	rc = kvb_get(c, ns, harness_key(seed, 0), page, PAGE);
	if (rc == -ECONNRESET)
		rc = kvb_get(c, ns, harness_key(seed, 0), page, PAGE);
	sh->errors[idx] += rc < 0;
	sh->done[idx] = 3;
	wait_step(4);
	sh->bad[idx] += bad_leases(l, seed);
	sh->done[idx] = 4;
	wait_step(5);
	for (int i = 0; i < NLEASE; i++)
		sh->errors[idx] += kvb_release(c, &l[i]) != 0;
	kvb_close(c);
	free(page);
	sh->done[idx] = 5;
	return 0;
}

static void wait_done(int want)
{
	uint64_t t0 = harness_now_ms();

	while (sh->done[0] < want || sh->done[1] < want) {
		CHECKF(harness_now_ms() - t0 < 20000, "holders stuck before step %d", want);
		rel_sleep_ms(1);
	}
}

/* Writes NFILL new pages: every slot nobody holds is reused. */
static void fill(uint64_t seed)
{
	struct kvb_opts o = {.socket_path = sh->sock, .reconnect_ms = 10000};
	uint8_t *page = malloc(PAGE);
	kvb_client *c;
	uint32_t ns;

	CHECK(page != NULL);
	CHECK_OK(kvb_connect(&o, &c));
	CHECK_OK(kvb_ns_open(c, &lay, &ns, NULL));
	for (uint64_t i = 0; i < NFILL; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(page, PAGE, &k, seed);
		CHECK_OK(kvb_put(c, ns, k, page, PAGE) < 0 ? -1 : 0);
	}
	kvb_close(c);
	free(page);
}

static void set_step(int s)
{
	sh->step = s;
}

/* One case: holders lease, the broker goes (how), the checks. Returns the broker that runs. */
static struct harness_broker *run_case(struct harness_broker *b, const char *how, int exits)
{
	pid_t pids[2];
	kvb_client *obs = NULL;
	struct kvb_opts o = {.socket_path = sh->sock, .reconnect_ms = 10000};
	int st[2];

	memset((char *)sh + sizeof(sh->sock), 0, sizeof(*sh) - sizeof(sh->sock));
	for (int i = 0; i < 2; i++)
		pids[i] = harness_fork(holder, i, (void *)(uintptr_t)exits);
	wait_done(1);
	if (!strcmp(how, "keeper, then kill")) {
		/* The keeper dies first: the one that replaces it must get every record. */
		CHECK_OK(kvb_connect(&o, &obs));
		CHECK_EQ(kill((pid_t)harness_stat(obs, "pool.keeper_pid"), SIGKILL), 0);
		CHECK_EQ(harness_stat_wait(obs, "pool.keeper_starts", 1, 5000), 1);
		CHECK_EQ(harness_stat_wait(obs, "pool.restart_safe", 1, 5000), 1);
		kvb_close(obs);
		obs = NULL;
	}
	if (strcmp(how, "takeover")) {
		CHECK_EQ(kill(b->pid, SIGKILL), 0);
		for (int i = 0; i < 500 && harness_broker_alive(b); i++)
			rel_sleep_ms(10);
		b = harness_broker_start("--socket", sh->sock, "--pool", POOL);
	} else {
		struct harness_broker *old = b;

		b = harness_broker_start("--socket", sh->sock, "--pool", POOL, "--takeover");
		for (int i = 0; i < 1000 && harness_broker_alive(old); i++)
			rel_sleep_ms(10); /* it answered until it handed over */
		CHECK(!harness_broker_alive(old));
	}
	for (int i = 0; i < 500 && kvb_connect(&o, &obs) == -EAGAIN; i++)
		rel_sleep_ms(10); /* a takeover: the new broker is adopting the pool */
	CHECK(obs != NULL);
	CHECK_EQ(harness_stat(obs, "pool.orphans"), 2);
	harness_log("%s: the new broker holds %llu page(s) for 2 clients of the old one", how,
		    (unsigned long long)harness_stat(obs, "pool.orphan_pins"));
	CHECK_EQ(harness_stat(obs, "pool.orphan_pins"), 2 * NLEASE);
	fill(1000);
	set_step(2);
	wait_done(2);
	CHECKF(sh->bad[0] + sh->bad[1] == 0,
	       "%s: %d + %d leased pages read other bytes after the fill", how, sh->bad[0],
	       sh->bad[1]);
	set_step(3);
	if (exits) {
		CHECK_EQ(harness_wait(pids, 2, 10000, st), 0);
		CHECK_EQ(harness_stat_wait(obs, "pool.orphans", 0, 5000), 0);
		CHECK_EQ(harness_stat(obs, "pool.orphan_pins"), 0);
		kvb_close(obs);
		return b;
	}
	wait_done(3);
	CHECK_EQ(harness_stat_wait(obs, "pool.orphans", 0, 5000), 0);
	CHECK_EQ(harness_stat(obs, "pool.orphan_pins"), 0);
	fill(2000);
	set_step(4);
	wait_done(4);
	CHECKF(sh->bad[0] + sh->bad[1] == 0, "%s: %d + %d leases read other bytes once copied", how,
	       sh->bad[0], sh->bad[1]);
	set_step(5);
	wait_done(5);
	CHECK_EQ(sh->errors[0] + sh->errors[1], 0);
	CHECK_EQ(harness_wait(pids, 2, 10000, st), 0);
	CHECK_EQ(harness_stat(obs, "pool.pinned_pages"), 0);
	rel_figure("%s: 2 x %d leases (broker's and hazard table's) intact through a fill of %d "
		   "pages, let go once copied",
		   how, NLEASE, NFILL);
	kvb_close(obs);
	return b;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;

	harness_init(argc, argv);
	sh = harness_shared(sizeof(*sh));
	harness_layout(&lay, "lease-adopt", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	b = harness_broker_start("--pool", POOL);
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	b = run_case(b, "kill", 0);
	b = run_case(b, "takeover", 0);
	b = run_case(b, "kill", 1);
	b = run_case(b, "keeper, then kill", 0);
	harness_broker_stop(b);
	return 0;
}
