// SPDX-License-Identifier: MIT
/*
 * t_pool_owner.c - one pool, one broker, whatever happens to the files; and a keeper that dies
 * is replaced (keeper.c [owner], watch.c).
 *
 * 1. Files removed under a running broker: its socket and lock file are deleted (a tmp cleaner,
 *    an operator). A second kvbrokerd started on the same path then must not adopt the pool the
 *    first one writes (before the owner guard it did, and a third of the GETs on both returned
 *    another key's bytes): it exits 1 naming the owner's pid. The first broker makes its socket
 *    and lock file again within a few seconds; a new client reaches it there and reads every
 *    page byte-exact, and the old client never noticed.
 * 2. The same with --takeover: the second broker asks the owner (found through the keeper, as
 *    the lock file is gone) to hand the pool over, and serves every page byte-exact.
 * 3. The keeper is SIGKILLed: the broker logs it at once, starts a new keeper, and the stats say
 *    the pool is restart-safe again; then the broker is SIGKILLed, and the next one adopts the
 *    pool from the new keeper: every page byte-exact (before the watch, that crash lost the
 *    whole pool).
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define PAGE (64u * 1024)
#define NPAGES 64

static struct kvb_layout lay;

static kvb_client *attach(const char *sock, const char *name, uint32_t *ns)
{
	struct kvb_opts o = {.socket_path = sock, .name = name};
	kvb_client *c = NULL;
	int rc;

	/* -EAGAIN: a broker that took over is still adopting the pool. */
	for (int i = 0; (rc = kvb_connect(&o, &c)) == -EAGAIN && i < 500; i++)
		usleep(10000);
	CHECK_OK(rc);
	CHECK_OK(kvb_ns_open(c, &lay, ns, NULL));
	return c;
}

static void put_all(kvb_client *c, uint32_t ns, uint64_t seed)
{
	uint8_t *page = malloc(PAGE);

	CHECK(page != NULL);
	for (uint64_t i = 0; i < NPAGES; i++) {
		kvb_key k = harness_key(seed, i);

		harness_fill(page, PAGE, &k, seed);
		CHECK_OK(kvb_put(c, ns, k, page, PAGE));
	}
	free(page);
}

/* Every page of seed served byte-exact through c. */
static void check_all(kvb_client *c, uint32_t ns, uint64_t seed, const char *when)
{
	uint8_t *page = malloc(PAGE);
	int bad = 0, missing = 0;

	CHECK(page != NULL);
	for (uint64_t i = 0; i < NPAGES; i++) {
		kvb_key k = harness_key(seed, i);
		long long rc = kvb_get(c, ns, k, page, PAGE);

		if (rc == -ECONNRESET) /* the broker went: the call in progress fails, once */
			rc = kvb_get(c, ns, k, page, PAGE);

		if (rc == -ENOENT)
			missing++;
		else if (rc < 0)
			CHECKF(0, "%s: GET %llu: %s", when, (unsigned long long)i,
			       harness_strerror(rc));
		else if (harness_verify(page, PAGE, &k, seed, when))
			bad++;
	}
	harness_log("%s: %d pages, %d wrong, %d missing", when, NPAGES, bad, missing);
	CHECKF(bad == 0 && missing == 0, "%s: %d wrong, %d missing of %d", when, bad, missing,
	       NPAGES);
	free(page);
}

/* Runs kvbrokerd with args on sock; its exit status and what it said in out. */
static int run_second(const char *self_dir, const char *sock, const char *extra, char *out,
		      size_t len)
{
	char cmd[PATH_MAX + 512];
	FILE *p;
	size_t n;

	if (getenv("KVB_BROKERD")) /* the harness's broker, as for every other start */
		snprintf(cmd, sizeof(cmd),
			 "timeout 10 %s --socket %s --pool 64M %s 2>&1 </dev/null",
			 getenv("KVB_BROKERD"), sock, extra);
	else
		snprintf(cmd, sizeof(cmd),
			 "timeout 10 %s/../bin/kvbrokerd --socket %s --pool 64M %s 2>&1 </dev/null",
			 self_dir, sock, extra);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	n = fread(out, 1, len - 1, p);
	out[n] = '\0';
	return pclose(p);
}

static void remove_files(const char *sock)
{
	char lock[128];

	snprintf(lock, sizeof(lock), "%s.lock", sock);
	CHECK_EQ(unlink(sock), 0);
	CHECK_EQ(unlink(lock), 0);
}

/* Waits until path exists again; the milliseconds it took. */
static uint64_t wait_file(const char *path, int timeout_ms)
{
	uint64_t t0 = harness_now_ms();
	struct stat st;

	while (stat(path, &st) < 0) {
		CHECKF(harness_now_ms() - t0 < (uint64_t)timeout_ms, "%s not made again in %d ms",
		       path, timeout_ms);
		usleep(10000);
	}
	return harness_now_ms() - t0;
}

int main(int argc, char **argv)
{
	struct harness_broker *b1, *b2, *b3;
	char self_dir[PATH_MAX], sock[108], lock[128], out[8192], pidtext[32];
	kvb_client *c, *d;
	uint32_t ns, ns2;
	uint64_t pid1, kpid, kpid2, ms;
	int st;

	harness_init(argc, argv);
	snprintf(self_dir, sizeof(self_dir), "%s", argv[0]);
	*strrchr(self_dir, '/') = '\0';
	harness_layout(&lay, "owner", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);

	/* 1. Files removed: a second broker is refused by the keeper, the first makes them again. */
	b1 = harness_broker_start("--pool", "64M");
	snprintf(sock, sizeof(sock), "%s", b1->sock);
	snprintf(lock, sizeof(lock), "%s.lock", sock);
	c = attach(sock, "first", &ns);
	put_all(c, ns, 1);
	pid1 = harness_stat(c, "pid");
	remove_files(sock);
	st = run_second(self_dir, sock, "", out, sizeof(out));
	snprintf(pidtext, sizeof(pidtext), "pid %llu", (unsigned long long)pid1);
	harness_log("second broker on removed files: status 0x%x, said: %s", st, out);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, pidtext) &&
		       strstr(out, "--takeover"),
	       "second broker: status 0x%x, said:\n%s", st, out);
	CHECK(harness_broker_alive(b1));
	CHECK_EQ(harness_keepers(sock), 1);
	CHECK_EQ(harness_stat(c, "pool.restart_safe"), 1);
	ms = wait_file(sock, 5000);
	wait_file(lock, 5000);
	harness_log(
		"# FIGURE owner: socket and lock file made again %llu ms after the refused start",
		(unsigned long long)ms);
	CHECK(harness_broker_log_has(b1, "was removed"));
	d = attach(sock, "after", &ns2);
	CHECK_EQ(harness_stat(d, "pid"), pid1);
	check_all(d, ns2, 1, "new client of the first broker");
	check_all(c, ns, 1, "old client of the first broker");
	kvb_close(d);

	/* 2. Files removed again, and a --takeover: a clean hand-over through the keeper. */
	remove_files(sock);
	b2 = harness_broker_start("--socket", sock, "--pool", "64M", "--takeover");
	for (int i = 0; i < 500 && harness_broker_alive(b1); i++)
		usleep(10000);
	CHECK(!harness_broker_alive(b1));
	d = attach(sock, "taken-over", &ns2);
	CHECK_NE(harness_stat(d, "pid"), pid1);
	check_all(d, ns2, 1, "after a takeover on removed files");
	check_all(c, ns, 1, "the old client, reconnected");
	CHECK_EQ(harness_keepers(sock), 1);

	/* 3. The keeper dies: replaced at once; a broker crash after that keeps the pool. */
	kpid = harness_stat(d, "pool.keeper_pid");
	CHECK_NE(kpid, 0);
	CHECK_EQ(kill((pid_t)kpid, SIGKILL), 0);
	CHECK_EQ(harness_stat_wait(d, "pool.keeper_starts", 1, 5000), 1);
	kpid2 = harness_stat(d, "pool.keeper_pid");
	CHECK_NE(kpid2, 0);
	CHECK_NE(kpid2, kpid);
	CHECK_EQ(harness_stat(d, "pool.keeper_deaths"), 1);
	CHECK_EQ(harness_stat(d, "pool.restart_safe"), 1);
	CHECK(harness_broker_log_has(b2, "died"));
	CHECK_EQ(harness_keepers(sock), 1);
	CHECK_EQ(kill(b2->pid, SIGKILL), 0);
	for (int i = 0; i < 500 && harness_broker_alive(b2); i++)
		usleep(10000);
	b3 = harness_broker_start("--socket", sock, "--pool", "64M");
	check_all(d, ns2, 1, "after the keeper and then the broker died");
	CHECK(harness_broker_log_has(b3, "adopt:"));
	kvb_close(d);
	kvb_close(c);
	harness_broker_stop(b3);
	CHECK_EQ(harness_keepers(sock), 0);
	return 0;
}
