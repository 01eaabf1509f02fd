// SPDX-License-Identifier: MIT
/*
 * t_drain_log.c - the request engine's gauges and the drain log. A client whose copies take
 * 7 s each (--copy-inline 0 --copy-delay-us 7000000) submits two PUTs of one key (the second
 * parks on the first's page) and dies:
 *
 *   - while it is alive, ops.parked is 1 and ops.inflight 2;
 *   - once it is gone, its parked PUT is cancelled at once (ops.parked 0) and the session
 *     drains: ops.sessions_draining 1, the Prometheus gauges say the same;
 *   - after SESSION_DRAIN_WARN (5 s) the log names it and what its op waits for;
 *   - when the copy finished the session is freed: nothing draining, nothing pinned.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "metrics.h"

static struct harness_broker *br;
static struct harness_gate submitted, die;

static int victim(int idx, void *arg)
{
	kvb_client *c = harness_connect(br, "victim", 0);
	struct kvb_layout l;
	struct kvb_op ops[2];
	uint32_t ns, buf;
	size_t pb;
	kvb_key k = harness_key(77, 1);

	(void)idx;
	(void)arg;
	harness_layout(&l, "test/drain", KVB_LAYOUT_MLA, 16, 1, 0, 1, 1024);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK(kvb_buf_alloc_host(c, pb, &buf) != NULL);
	for (int i = 0; i < 2; i++)
		ops[i] = (struct kvb_op){
			.opcode = KVB_OP_PUT, .ns = ns, .buf = buf, .key = k, .user_data = 1};
	CHECK_EQ(kvb_submit(c, ops, 2), 2);
	harness_gate_open(&submitted, 1);
	harness_gate_wait(&die, 20000);
	_exit(0); /* gone with both PUTs in flight */
}

int main(int argc, char **argv)
{
	kvb_client *obs;
	pid_t pid;
	char *json, *text;

	harness_init(argc, argv);
	br = harness_broker_start("--pool", "32M", "--copy-inline", "0", "--copy-delay-us",
				  "7000000");
	obs = harness_connect(br, "observer", 0);
	harness_gate_init(&submitted);
	harness_gate_init(&die);
	pid = harness_fork(victim, 0, NULL);
	harness_gate_wait(&submitted, 10000);
	CHECK_EQ(harness_stat_wait(obs, "ops.parked", 1, 5000), 1);
	CHECK_EQ(harness_stat(obs, "ops.inflight"), 2);
	harness_gate_open(&die, 1);
	CHECK_EQ(harness_wait(&pid, 1, 10000, NULL), 0);

	harness_log("gone: its parked PUT is cancelled, its copy drains");
	CHECK_EQ(harness_stat_wait(obs, "ops.sessions_draining", 1, 5000), 1);
	CHECK_EQ(harness_stat_wait(obs, "ops.parked", 0, 5000), 0);
	CHECK_EQ(harness_stat(obs, "ops.inflight"), 1);
	json = harness_stats(obs);
	text = metrics_from_json(json);
	CHECK(text != NULL);
	CHECKF(strstr(text, "kvbroker_sessions_draining 1\n") &&
		       strstr(text, "kvbroker_ops_parked 0\n") &&
		       strstr(text, "kvbroker_ops_inflight 1\n"),
	       "gauges missing:\n%s", text);
	free(text);
	free(json);

	harness_log("draining past 5 s is logged with what it waits for");
	for (int i = 0; i < 80 && !harness_broker_log_has(br, "still draining"); i++)
		usleep(100000);
	CHECK(harness_broker_log_has(br, "still draining: 1 ops in flight: op 1 (a host copy"));

	harness_log("the copy ends: the session is freed");
	CHECK_EQ(harness_stat_wait(obs, "ops.sessions_draining", 0, 10000), 0);
	CHECK_EQ(harness_stat(obs, "ops.inflight"), 0);
	CHECK_EQ(harness_stat(obs, "pool.pinned_pages"), 0);
	CHECK_EQ(harness_stat(obs, "pool.pages"), 1); /* a dead client's PUT is still stored */
	kvb_close(obs);
	harness_broker_stop(br);
	return H_PASS;
}
