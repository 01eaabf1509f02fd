// SPDX-License-Identifier: MIT
/*
 * t_handover.c - planned hand-over under load: "kvbrokerd --takeover" on the socket
 * of a running broker while 8 client processes PUT and GET, over and over.
 *
 * Each client opens a namespace, registers a host buffer and a view over it, and loops: PUT a
 * new page from the buffer (kvb_put of a registered address), GET it back through the view,
 * compare. It connects with reconnect_ms (include/kvbroker.h "Broker restarts"), so a call
 * during the gap waits for the new broker; the one call in progress when the old broker goes
 * returns -ECONNRESET and is repeated (PUT and GET are idempotent). Each cycle:
 *   - the old broker exits 0 and the new one adopts the pool ("adopt: " in its log);
 *   - no call fails with anything but that one -ECONNRESET per client and hand-over; every
 *     client reconnects (ids of namespace, buffer and view keep working);
 *   - afterwards every page any client had stored is served byte-exact (0 pages lost);
 *   - the pause (the longest call of each client across the hand-over) is reported, p50/p99;
 *   - no client holds more fds or memfd mappings after the hand-overs than before them.
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
#define NCLI 8
#define PER_CLI 90 /* 8 x 90 x 64 KiB: within the 64 MiB pool, nothing evicted */
#define MAXCYC 64

struct shared {
	char sock[108];
	_Atomic int stop;
	_Atomic uint32_t ready;
	_Atomic uint32_t done[NCLI];   /* pages stored: keys [0, done) */
	_Atomic uint32_t resets[NCLI]; /* calls that returned -ECONNRESET */
	_Atomic uint32_t errors[NCLI]; /* any other failure */
	_Atomic int cycle;
	double pause_ms[MAXCYC][NCLI]; /* longest call of the client in that cycle */
	int fd_grow[NCLI], map_grow[NCLI];
	char why[NCLI][160];
};

static struct shared *sh;

/* Runs call until it returns something but -ECONNRESET; counts the resets. */
#define RETRY(idx, rc, call)                                                                       \
	do {                                                                                       \
		(rc) = (call);                                                                     \
		if ((rc) != -ECONNRESET)                                                           \
			break;                                                                     \
		sh->resets[idx]++;                                                                 \
	} while (!sh->stop)

static int client(int idx, void *arg)
{
	struct kvb_opts o = {.socket_path = sh->sock, .reconnect_ms = 20000};
	struct kvb_layout l;
	struct kvb_view_part part;
	uint8_t *buf, *out = malloc(PAGE);
	uint32_t ns, bid, view;
	kvb_client *c;
	int fd0, maps0;

	(void)arg;
	harness_layout(&l, "handover", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
	if (!out || kvb_connect(&o, &c) || kvb_ns_open(c, &l, &ns, NULL)) {
		free(out);
		return 1;
	}
	buf = kvb_buf_alloc_host(c, 2 * PAGE, &bid);
	part = (struct kvb_view_part){.buf = bid, .stride = PAGE / 64, .base = PAGE};
	if (!buf || kvb_view_create(c, ns, &part, 1, &view)) {
		free(out);
		return 1;
	}
	fd0 = rel_fd_count(getpid(), NULL, 0);
	maps0 = harness_memfd_maps();
	sh->ready++;
	for (uint32_t n = 0; !sh->stop; n++) {
		uint32_t i = n % PER_CLI; /* new pages first, then reads of them */
		kvb_key k = harness_key(5000 + (uint64_t)idx, i);
		uint64_t t0 = harness_now_ns();
		int rc, cyc = sh->cycle;
		double ms;

		if (n < PER_CLI) {
			harness_fill(buf, PAGE, &k, 5);
			RETRY(idx, rc, kvb_put(c, ns, k, buf, PAGE));
			if (rc < 0) {
				snprintf(sh->why[idx], sizeof(sh->why[idx]), "put %u: %d", i, rc);
				sh->errors[idx]++;
				break;
			}
			sh->done[idx] = i + 1;
		}
		memset(buf + PAGE, 0, PAGE);
		RETRY(idx, rc, kvb_view_get(c, view, k, 0, 0, 0));
		if (rc < 0 || harness_verify(buf + PAGE, PAGE, &k, 5, "read back")) {
			snprintf(sh->why[idx], sizeof(sh->why[idx]), "view get %u: %d", i, rc);
			sh->errors[idx]++;
			break;
		}
		ms = (double)(harness_now_ns() - t0) / 1e6;
		if (cyc < MAXCYC && ms > sh->pause_ms[cyc][idx])
			sh->pause_ms[cyc][idx] = ms;
		if (n % 16 == 15)
			rel_sleep_ms(1); /* leave the CPUs some air: two cores, nine processes */
	}
	while (!sh->stop)
		rel_sleep_ms(1);
	sh->fd_grow[idx] = rel_fd_count(getpid(), NULL, 0) - fd0;
	sh->map_grow[idx] = harness_memfd_maps() - maps0;
	kvb_close(c);
	free(out);
	return 0;
}

int main(int argc, char **argv)
{
	int cycles = (int)rel_pick(1, 3, 50);
	struct harness_broker *b, *nb;
	pid_t cli[NCLI];
	int status[NCLI];
	double pauses[MAXCYC * NCLI];
	size_t np = 0;
	uint64_t pages = 0;

	harness_init(argc, argv);
	rel_deadline((unsigned)cycles * 10 + 60);
	sh = harness_shared(sizeof(*sh));
	b = harness_broker_start("--pool", "64M", "--slab", "8M");
	snprintf(sh->sock, sizeof(sh->sock), "%s", b->sock);
	for (int i = 0; i < NCLI; i++)
		cli[i] = harness_fork(client, i, NULL);
	for (uint64_t end = harness_now_ms() + 10000; sh->ready < NCLI && harness_now_ms() < end;)
		rel_sleep_ms(1);
	CHECK_EQ(sh->ready, NCLI);

	for (int cyc = 0; cyc < cycles; cyc++) {
		sh->cycle = cyc;
		rel_sleep_ms(150); /* load before */
		nb = harness_broker_start("--socket", sh->sock, "--pool", "64M", "--slab", "8M",
					  "--takeover");
		for (int i = 0; i < 500 && harness_broker_alive(b); i++)
			rel_sleep_ms(10);
		CHECKF(!harness_broker_alive(b), "cycle %d: the old broker still runs", cyc);
		CHECKF(WIFEXITED(b->status) && WEXITSTATUS(b->status) == 0,
		       "cycle %d: the old broker exited 0x%x", cyc, b->status);
		/* The harness's readiness check may have reached the old broker: wait for ours. */
		for (int i = 0; i < 1000 && !harness_broker_log_has(nb, " ready in "); i++)
			rel_sleep_ms(10);
		CHECKF(harness_broker_log_has(nb, "adopt: "), "cycle %d: nothing adopted", cyc);
		b = nb;
		/*
		 * Every client must meet this hand-over before the next one: a client that tried
		 * while no broker listened backs off up to 200 ms between tries, longer than the
		 * load-after window on a loaded machine, and would meet two hand-overs as one.
		 */
		for (uint64_t end = harness_now_ms() + 10000; harness_now_ms() < end;) {
			int met = 0;

			for (int i = 0; i < NCLI; i++)
				met += sh->resets[i] >= (uint32_t)cyc + 1;
			if (met == NCLI)
				break;
			rel_sleep_ms(5);
		}
		rel_sleep_ms(150); /* load after */
		sh->cycle = cyc + 1 < MAXCYC ? cyc + 1 : MAXCYC - 1;
	}
	sh->stop = 1;
	CHECK_EQ(harness_wait(cli, NCLI, 10000, status), 0);
	for (int i = 0; i < NCLI; i++) {
		CHECKF(sh->errors[i] == 0, "client %d: %u errors (%s)", i, sh->errors[i],
		       sh->why[i]);
		CHECKF(sh->resets[i] >= (uint32_t)cycles && sh->resets[i] <= (uint32_t)cycles * 2,
		       "client %d: %u resets in %d hand-overs", i, sh->resets[i], cycles);
		CHECKF(sh->fd_grow[i] == 0 && sh->map_grow[i] == 0,
		       "client %d: %d more fds, %d more pool mappings after the hand-overs", i,
		       sh->fd_grow[i], sh->map_grow[i]);
		for (int cyc = 0; cyc < cycles && cyc < MAXCYC; cyc++)
			pauses[np++] = sh->pause_ms[cyc][i];
	}
	/* 0 pages lost: everything stored is served by the last broker. */
	{
		kvb_client *c = harness_connect(b, "verify", 0);
		struct kvb_layout l;
		uint8_t *page = malloc(PAGE);
		uint32_t ns;

		CHECK(page != NULL);
		harness_layout(&l, "handover", KVB_LAYOUT_MLA, 64, 1, 0, 1, PAGE / 64);
		CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
		for (int i = 0; i < NCLI; i++) {
			for (uint32_t j = 0; j < sh->done[i]; j++) {
				kvb_key k = harness_key(5000 + (uint64_t)i, j);

				CHECK_RC(kvb_get(c, ns, k, page, PAGE), (int)PAGE);
				CHECK_OK(harness_verify(page, PAGE, &k, 5, "page after hand-over"));
				pages++;
			}
		}
		free(page);
		kvb_close(c);
	}
	rel_figure("%d planned hand-overs (--takeover) under load from %d processes: %llu pages, 0 "
		   "lost, 0 errors beyond one -ECONNRESET per client and hand-over; pause (longest "
		   "PUT+GET across it) p50 %.1f ms, p99 %.1f ms, max %.1f ms; client fds and pool "
		   "mappings constant",
		   cycles, NCLI, (unsigned long long)pages, rel_pct(pauses, np, 50),
		   rel_pct(pauses, np, 99), rel_pct(pauses, np, 100));
	harness_broker_stop(b);
	return H_PASS;
}
