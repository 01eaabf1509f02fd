// SPDX-License-Identifier: MIT
/*
 * t_pool_keep.c - the RAM pool survives a SIGKILL of the broker (keeper.c, adopt.c).
 *
 * Cycles of: client processes PUT RAM-only pages (no disk tier) as fast as they can; the broker
 * is SIGKILLed under that load; a broker started with the same command line adopts the pool the
 * keeper held. Each cycle:
 *   - every page committed before the kill (its kvb_put returned) that is served is byte-exact,
 *     and at least 99% of them are served (all of them, in fact: nothing was evicted);
 *   - the page whose PUT was in flight at the kill is served byte-exact or not at all;
 *   - the restarted broker holds as many fds and pool mappings as the first one did, one
 *     keeper (not one per cycle) holds the pool, and the test's own fds do not grow.
 * Then a PUT whose copy is still sleeping in a copy worker (--copy-delay-us) when the broker is
 * killed: the page it was writing is never served afterwards. Last, a clean stop frees the
 * pool: the keeper exits and its socket file goes; --free-pool frees a dead broker's pool.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "reliab.h"

#define PAGE (64u * 1024)
#define NCLI 4
#define PER_CLI 120 /* 4 x 120 x 64 KiB = 30 MiB per cycle in a 64 MiB pool */
#define MAXCYC 64

struct shared {
	char sock[108];
	_Atomic uint32_t done[NCLI]; /* PUTs returned: keys [0, done) are committed */
	_Atomic uint32_t total;
	_Atomic uint32_t ready; /* loaders attached */
	_Atomic int stop;
	uint64_t seed;
};

static struct shared *sh;

static int loader(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock};
	uint8_t *page = malloc(PAGE);
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;

	(void)arg;
	harness_layout(&l, "keep", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	if (!page || kvb_connect(&o, &c) || kvb_ns_open(c, &l, &ns, NULL))
		return 1;
	sh->ready++;
	while (sh->ready < NCLI && !sh->stop)
		rel_sleep_ms(1);
	for (uint32_t i = 0; i < PER_CLI && !sh->stop; i++) {
		kvb_key k = harness_key(sh->seed + (uint64_t)idx, i);
		int rc;

		harness_fill(page, PAGE, &k, sh->seed);
		rc = kvb_put(c, ns, k, page, PAGE);
		if (rc < 0)
			break; /* the broker is gone */
		sh->done[idx] = i + 1;
		sh->total++;
	}
	/* Stay attached until killed or told: the broker dies with clients attached. */
	while (!sh->stop)
		rel_sleep_ms(1);
	kvb_close(c);
	free(page);
	return 0;
}

/* Mappings of pid whose name has text. */
static int maps_count(pid_t pid, const char *text)
{
	char p[64], line[512];
	FILE *f;
	int n = 0;

	snprintf(p, sizeof(p), "/proc/%d/maps", (int)pid);
	f = fopen(p, "r");
	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	fclose(f);
	return n;
}

/* Every committed page served byte-exact; returns pages found of those committed. */
static uint32_t verify(kvb_client *c, uint32_t ns, uint32_t *committed, uint32_t *inflight_hit)
{
	uint8_t *page = malloc(PAGE);
	uint32_t found = 0;

	CHECK(page != NULL);
	*committed = 0;
	*inflight_hit = 0;
	for (int idx = 0; idx < NCLI; idx++) {
		uint32_t done = sh->done[idx];

		for (uint32_t i = 0; i <= done && i < PER_CLI; i++) {
			kvb_key k = harness_key(sh->seed + (uint64_t)idx, i);
			int rc = kvb_get(c, ns, k, page, PAGE);

			CHECKF(rc == (int)PAGE || rc == -ENOENT, "client %d key %u: get %d (%s)",
			       idx, i, rc, harness_strerror(rc));
			if (rc == (int)PAGE)
				CHECK_OK(harness_verify(page, PAGE, &k, sh->seed, "adopted page"));
			if (i < done) {
				(*committed)++;
				found += rc == (int)PAGE;
			} else {
				*inflight_hit += rc == (int)PAGE;
			}
		}
	}
	free(page);
	return found;
}

static struct harness_broker *restart(const char *sock, const char *const *extra)
{
	const char *args[16] = {"--socket", sock, "--pool", "64M", "--slab", "8M"};
	int n = 6;

	for (; extra && *extra; extra++)
		args[n++] = *extra;
	args[n] = NULL;
	return harness_broker_startv(args);
}

/* A PUT whose copy sleeps in a worker when the broker dies is never served. */
static void unfinished_put(const char *sock)
{
	static const char *const slow[] = {"--copy-inline", "0", "--copy-delay-us", "400000", NULL};
	struct harness_broker *b = restart(sock, slow);
	kvb_key k = harness_key(777, 1);
	struct kvb_layout l;
	size_t hits = 9;
	uint8_t *page = malloc(PAGE);
	kvb_client *c;
	uint32_t ns;
	pid_t writer;
	int st;

	CHECK(page != NULL);
	harness_layout(&l, "keep", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	writer = fork();
	CHECK(writer >= 0);
	if (writer == 0) {
		struct kvb_opts o = {.socket_path = sock};

		uint8_t *reg;
		uint32_t bid;

		/* From a registered buffer: the broker's copy worker does the copy and sleeps in
		 * it (from plain memory it would be a filled PUT, copied on the loop thread). */
		if (kvb_connect(&o, &c) || kvb_ns_open(c, &l, &ns, NULL) ||
		    !(reg = kvb_buf_alloc_host(c, PAGE, &bid)))
			_exit(1);
		harness_fill(reg, PAGE, &k, 777);
		kvb_put(c, ns, k, reg, PAGE); /* dies with the broker */
		_exit(0);
	}
	c = harness_connect(b, "watcher", 0);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	/* The PUT has its slot (WRITING) once the broker counts it in flight. */
	for (int i = 0; i < 200 && harness_stat(c, "pool.pinned_pages") == 0; i++)
		rel_sleep_ms(5);
	CHECKF(harness_stat(c, "pool.pinned_pages") > 0, "the slow PUT never took its slot");
	kvb_close(c);
	rel_kill(b->pid);
	b->pid = 0;
	waitpid(writer, &st, 0);
	b = restart(sock, NULL);
	c = harness_connect(b, "after", 0);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
	CHECK_RC(kvb_get(c, ns, k, page, PAGE), -ENOENT);
	CHECK_OK(kvb_lookup(c, ns, &k, 1, &hits));
	CHECK_EQ(hits, 0);
	kvb_close(c);
	rel_kill(b->pid); /* leave it to the --free-pool check */
	b->pid = 0;
	free(page);
}

int main(int argc, char **argv)
{
	int cycles = (int)rel_pick(2, 6, 50), fd0, fd1, bfd0 = -1, maps0 = -1;
	uint64_t committed_all = 0, found_all = 0, inflight_hits = 0;
	char fdl0[4096], fdl1[4096], keep[120];
	struct harness_broker *b;
	struct stat st;

	harness_init(argc, argv);
	rel_deadline((unsigned)cycles * 6 + 60);
	sh = harness_shared(sizeof(*sh));
	b = harness_broker_start("--pool", "64M", "--slab", "8M");
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	snprintf(keep, sizeof(keep), "%s.keep", b->sock);
	CHECKF(stat(keep, &st) == 0, "no keeper socket %s", keep);
	CHECK_EQ(harness_keepers(sh->sock), 1);
	fd0 = rel_fd_count(getpid(), fdl0, sizeof(fdl0));

	for (int cyc = 0; cyc < cycles; cyc++) {
		pid_t cli[NCLI];
		int status[NCLI];
		uint32_t committed, inflight, found, ns;
		struct kvb_layout l;
		kvb_client *c;
		uint64_t end;

		sh->seed = 1000 + (uint64_t)cyc * 16;
		sh->stop = 0;
		sh->total = 0;
		sh->ready = 0;
		for (int i = 0; i < NCLI; i++)
			sh->done[i] = 0;
		for (int i = 0; i < NCLI; i++)
			cli[i] = harness_fork(loader, i, NULL);
		/* Kill mid-load: after a third to two thirds of the cycle's pages. */
		end = harness_now_ms() + 10000;
		while (sh->total <
			       (uint32_t)(NCLI * PER_CLI / 3 + cyc * 29 % (NCLI * PER_CLI / 3)) &&
		       harness_now_ms() < end)
			rel_sleep_ms(1);
		rel_kill(b->pid);
		b->pid = 0;
		sh->stop = 1;
		CHECK_EQ(harness_wait(cli, NCLI, 5000, status), 0);

		b = restart(sh->sock, NULL);
		CHECKF(harness_broker_log_has(b, "adopt: "), "cycle %d: no adoption logged", cyc);
		CHECK_EQ(harness_keepers(sh->sock), 1);
		c = harness_connect(b, "verify", 0);
		harness_layout(&l, "keep", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
		CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
		found = verify(c, ns, &committed, &inflight);
		kvb_close(c);
		CHECKF(committed > 0, "cycle %d: nothing committed before the kill", cyc);
		CHECKF(found * 100 >= committed * 99, "cycle %d: %u of %u committed pages served",
		       cyc, found, committed);
		committed_all += committed;
		found_all += found;
		inflight_hits += inflight;
		/* Nothing accumulates in the broker from one adoption to the next. */
		{
			int bfd, maps;

			/* The broker sees the verifier's hang-up on its own time. */
			if (bfd0 < 0)
				rel_sleep_ms(300);
			for (int i = 0; i < 200; i++) {
				bfd = rel_fd_count(b->pid, NULL, 0);
				maps = maps_count(b->pid, "memfd:");
				if (bfd0 < 0 || (bfd == bfd0 && maps == maps0))
					break;
				rel_sleep_ms(10);
			}
			if (bfd0 < 0) {
				bfd0 = bfd;
				maps0 = maps;
			}
			CHECKF(bfd == bfd0 && maps == maps0,
			       "cycle %d: broker fds %d (first %d), memfd mappings %d (first %d)",
			       cyc, bfd, bfd0, maps, maps0);
		}
	}
	fd1 = rel_fd_count(getpid(), fdl1, sizeof(fdl1));
	CHECKF(fd1 == fd0, "test process fds: %d before, %d after\nbefore:\n%safter:\n%s", fd0, fd1,
	       fdl0, fdl1);
	rel_figure("%d SIGKILL+adopt cycles under load from %d processes, RAM only: %llu of %llu "
		   "committed pages served byte-exact after the restart (%.2f%%), %llu in-flight "
		   "PUTs found committed; broker fds and memfd mappings constant, one keeper",
		   cycles, NCLI, (unsigned long long)found_all, (unsigned long long)committed_all,
		   100.0 * (double)found_all / (double)(committed_all ? committed_all : 1),
		   (unsigned long long)inflight_hits);

	/* A clean stop frees the pool: its keeper exits, its socket file goes. */
	harness_broker_stop(b);
	for (int i = 0; i < 200 && (harness_keepers(sh->sock) || stat(keep, &st) == 0); i++)
		rel_sleep_ms(10);
	CHECK_EQ(harness_keepers(sh->sock), 0);
	CHECKF(stat(keep, &st) < 0, "%s left after a clean stop", keep);

	/* The page being written at the kill, then --free-pool on the dead broker's pool. */
	unfinished_put(sh->sock);
	CHECK_EQ(harness_keepers(sh->sock), 1);
	{
		char cmdargs[300], *out = NULL;

		snprintf(cmdargs, sizeof(cmdargs), "--socket %s --free-pool", sh->sock);
		CHECK_EQ(harness_run_tool("kvbrokerd", cmdargs, &out), 0);
		free(out);
	}
	for (int i = 0; i < 200 && harness_keepers(sh->sock); i++)
		rel_sleep_ms(10);
	CHECK_EQ(harness_keepers(sh->sock), 0);
	return H_PASS;
}
