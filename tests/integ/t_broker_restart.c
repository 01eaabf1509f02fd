// SPDX-License-Identifier: MIT
/*
 * t_broker_restart.c - the broker is killed with SIGKILL while a client holds a lease:
 * the client's next call fails fast with -ECONNRESET (no hang, no SIGPIPE, no SIGBUS), its
 * leased page stays readable and intact, and a new broker on the same socket starts at once (the
 * dead one's lock died with it) and adopts the pool its keeper held (keeper.c): the page is
 * served again. A broker started with --no-pool-keep after the next SIGKILL starts cold instead
 * and frees the kept pool. A second broker next to a live one refuses to run (the lock file). A
 * clean stop leaves nothing behind.
 */
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define PAGE (256u * 1024)

int main(int argc, char **argv)
{
	struct harness_broker *b1, *b3;
	char cmd[PATH_MAX + 256], out[4096], self[PATH_MAX];
	FILE *p;
	size_t n;
	int st;
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c, *d;
	kvb_key k = harness_key(11, 1);
	uint8_t *page = malloc(PAGE);
	uint64_t t0;
	uint32_t ns;
	char sock[108];

	harness_init(argc, argv);
	snprintf(self, sizeof(self), "%s", argv[0]);
	CHECK(page != NULL);
	b1 = harness_broker_start("--pool", "64M");
	snprintf(sock, sizeof(sock), "%s", b1->sock);
	c = harness_connect(b1, "survivor", 0);
	harness_layout(&l, "restart", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	harness_fill(page, PAGE, &k, 11);
	CHECK_OK(kvb_put(c, ns, k, page, PAGE));
	CHECK_OK(kvb_acquire(c, ns, k, &lease));

	/* A second broker on the same socket and pool refuses to run while the first lives. */
	snprintf(cmd, sizeof(cmd), "%s/../bin/kvbrokerd --socket %s --pool 64M 2>&1", dirname(self),
		 sock);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	n = fread(out, 1, sizeof(out) - 1, p);
	out[n] = '\0';
	st = pclose(p);
	CHECKF(WIFEXITED(st) && WEXITSTATUS(st) == 1 && strstr(out, "another kvbrokerd"),
	       "a second broker next to a live one: status 0x%x, said:\n%s", st, out);

	CHECK_OK(kill(b1->pid, SIGKILL));
	t0 = harness_now_ms();
	while (harness_broker_alive(b1))
		usleep(1000);
	CHECK_RC(kvb_nop(c), -ECONNRESET);
	CHECKF(harness_now_ms() - t0 < 1000, "noticed the broker's death after %llu ms",
	       (unsigned long long)(harness_now_ms() - t0));
	CHECK_RC(kvb_nop(c), -ECONNRESET); /* and stays so */
	CHECK_OK(harness_verify(lease.data, lease.len, &k, 11, "lease after the broker died"));

	b3 = harness_broker_start("--pool", "64M", "--socket", sock);
	d = harness_connect(b3, "newcomer", 0);
	CHECK_EQ(harness_stat(d, "pool.reclaimed_orphans"), 0);
	CHECK_OK(kvb_ns_open(d, &l, &ns, NULL));
	/* Adopted: the RAM pool outlived the broker. */
	CHECK_RC(kvb_get(d, ns, k, page, PAGE), PAGE);
	CHECK_OK(harness_verify(page, PAGE, &k, 11, "page adopted by the new broker"));
	/* The old client's mapping was not touched by the new broker. */
	CHECK_OK(harness_verify(lease.data, lease.len, &k, 11, "old lease after the restart"));
	kvb_close(c);
	kvb_close(d);
	/* Killed again, and restarted with --no-pool-keep: cold, and the kept pool is freed. */
	CHECK_OK(kill(b3->pid, SIGKILL));
	while (harness_broker_alive(b3))
		usleep(1000);
	b3 = harness_broker_start("--pool", "64M", "--socket", sock, "--no-pool-keep");
	CHECKF(harness_broker_log_has(b3, "freeing the pool a previous broker left"),
	       "--no-pool-keep did not free the kept pool");
	d = harness_connect(b3, "cold", 0);
	CHECK_OK(kvb_ns_open(d, &l, &ns, NULL));
	CHECK_RC(kvb_get(d, ns, k, page, PAGE), -ENOENT); /* cold start: pages died with it */
	CHECK_OK(kvb_put(d, ns, k, page, PAGE));
	CHECK_RC(kvb_get(d, ns, k, page, PAGE), PAGE);
	CHECK_OK(harness_verify(page, PAGE, &k, 11, "page in the new broker"));
	kvb_close(d);
	snprintf(cmd, sizeof(cmd), "%s.keep", sock);
	CHECKF(access(cmd, F_OK) != 0, "keeper socket %s left by --no-pool-keep", cmd);
	harness_broker_stop(b3);
	CHECKF(access(sock, F_OK) != 0, "socket %s left behind", sock);
	snprintf(cmd, sizeof(cmd), "%s.lock", sock);
	CHECKF(access(cmd, F_OK) != 0, "lock file %s left behind", cmd);
	free(page);
	return H_PASS;
}
