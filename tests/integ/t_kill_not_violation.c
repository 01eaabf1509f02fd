// SPDX-License-Identifier: MIT
/*
 * t_kill_not_violation.c - a client that dies, however abruptly, broke no protocol: SIGKILL at
 * any point (attached and idle, in the middle of a stream of ops, inside kvb_connect(), in a
 * loop of stats requests) must leave counters.protocol_errors at 0 and the session reclaimed.
 * Regression: a SIGKILLed client was counted as a protocol error (operators alerting on
 * kvbroker_protocol_errors_total were paged for every OOM-killed engine).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "harness.h"

#define PAGE 4096u

static struct harness_broker *b;

static void layout(struct kvb_layout *l)
{
	harness_layout(l, "test/kill", KVB_LAYOUT_MLA, 16, 1, 0, 1, 256); /* 4 KiB */
}

/* mode 0: attach, then sleep; 1: PUT/GET forever; 2: connect/close forever; 3: stats forever. */
static int victim(int mode, void *arg)
{
	struct kvb_opts o = {.socket_path = b->sock, .name = "victim"};
	struct kvb_layout l;
	uint8_t page[PAGE];
	kvb_client *c;
	uint32_t ns;
	char *js;

	(void)arg;
	layout(&l);
	if (mode == 3)
		o.flags = KVB_CONNECT_CONTROL;
	for (uint64_t i = 0;; i++) {
		kvb_key k = harness_key(11, i % 512);

		if (mode == 2 || i == 0) {
			CHECK_OK(kvb_connect(&o, &c));
			if (mode != 3)
				CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));
		}
		if (mode == 0)
			pause();
		if (mode == 1) {
			harness_fill(page, sizeof(page), &k, 11);
			CHECK(kvb_put(c, ns, k, page, sizeof(page)) >= 0);
			CHECK(kvb_get(c, ns, k, page, sizeof(page)) >= 0);
		}
		if (mode == 2)
			kvb_close(c);
		if (mode == 3) {
			CHECK_OK(kvb_stats_json(c, &js));
			free(js);
		}
	}
	return 0;
}

int main(int argc, char **argv)
{
	static const char *const what[] = {"idle", "streaming ops", "connecting", "asking stats"};
	kvb_client *probe;
	int kills = 0;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	probe = harness_connect(b, "probe", 0);
	for (int mode = 0; mode < 4; mode++) {
		for (int i = 0; i < 10; i++) {
			pid_t pid = harness_fork(victim, mode, NULL);
			int st;

			usleep((useconds_t)(20000 + (i * 7919) % 30000));
			CHECK_OK(kill(pid, SIGKILL));
			CHECK_EQ(waitpid(pid, &st, 0), pid);
			CHECKF(WIFSIGNALED(st), "victim (%s) exited on its own: %d", what[mode],
			       st);
			kills++;
			CHECK_EQ(harness_stat_wait(probe, "clients", 1, 3000), 1);
			CHECKF(harness_stat(probe, "counters.protocol_errors") == 0,
			       "SIGKILL of a client %s (kill %d) counted as a protocol error",
			       what[mode], kills);
		}
	}
	/* Control connections and handshakes of the dead are gone too. */
	CHECK_EQ(harness_stat_wait(probe, "control_clients", 0, 6000), 0);
	CHECK_EQ(harness_stat_wait(probe, "handshakes", 0, 6000), 0);
	CHECK_EQ(harness_stat(probe, "leases"), 0);
	harness_log("%d SIGKILLed clients, 0 protocol errors", kills);
	kvb_close(probe);
	harness_broker_stop(b);
	return H_PASS;
}
