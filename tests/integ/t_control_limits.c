// SPDX-License-Identifier: MIT
/*
 * t_control_limits.c - control-only connections (kvbctl, KVB_CONNECT_CONTROL) are bounded apart
 * from engines and expire when idle; silent connects lock nobody out; refusals say -EUSERS.
 * Regressions: idle control connections used to count against --max-clients + 64 and never
 * expire, so 64 of them (next to a full --max-clients) locked kvbctl and every new engine out
 * for good, and the refused got -ECONNRESET ("broker connection lost"); 200 connects that never
 * sent HELLO locked everyone out for 5 s; every refusal wrote a log line.
 *
 * Against a broker with --max-clients 3 --max-control 4 --control-idle 2:
 *   1. 4 control connections held by a child process: a 5th, and kvbctl, get -EUSERS (kvbctl
 *      says so); engines still attach, up to --max-clients, the 4th gets -EUSERS;
 *   2. 30 more refusals write at most 2 log lines (throttled);
 *   3. the idle control connections are closed after ~2 s (counters.expired), the child's next
 *      call says -ECONNRESET, and kvbctl works again;
 *   4. 200 silent connects from a child: an engine and kvbctl are served at once regardless.
 */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "harness.h"

#define MAXC 3
#define MAXCTL 4
#define NSILENT 200

static struct harness_broker *b;
static struct harness_gate held, done;

static int control_connect(kvb_client **c, const char *name)
{
	struct kvb_opts o = {.socket_path = b->sock, .name = name, .flags = KVB_CONNECT_CONTROL};

	*c = NULL;
	return kvb_connect(&o, c);
}

static int engine_connect(kvb_client **c)
{
	struct kvb_opts o = {.socket_path = b->sock, .name = "engine", .sq_entries = 8};

	*c = NULL;
	return kvb_connect(&o, c);
}

/* A kvbctl-style process: holds MAXCTL control connections and never speaks again. */
static int holder(int idx, void *arg)
{
	kvb_client *c[MAXCTL];
	char *js = NULL;

	(void)idx;
	(void)arg;
	for (int i = 0; i < MAXCTL; i++)
		CHECK_OK(control_connect(&c[i], "idle-ctl"));
	harness_gate_open(&held, 1);
	harness_gate_wait(&done, 30000);
	/* The broker closed them meanwhile: the next call says so. */
	for (int i = 0; i < MAXCTL; i++) {
		CHECK_RC(kvb_stats_json(c[i], &js), -ECONNRESET);
		kvb_close(c[i]);
	}
	return 0;
}

/* NSILENT connects that never say HELLO. */
static int silent(int idx, void *arg)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	static int fds[NSILENT];

	(void)idx;
	(void)arg;
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", b->sock);
	for (int i = 0; i < NSILENT; i++) {
		fds[i] = socket(AF_UNIX, SOCK_SEQPACKET, 0);
		CHECK(fds[i] >= 0);
		CHECK_OK(connect(fds[i], (struct sockaddr *)&sa, sizeof(sa)));
	}
	harness_gate_open(&held, 1);
	harness_gate_wait(&done, 30000);
	for (int i = 0; i < NSILENT; i++)
		close(fds[i]);
	return 0;
}

/* Occurrences of text in the broker's log. */
static int log_count(const char *text)
{
	FILE *f = fopen(b->log, "r");
	char line[1024];
	int n = 0;

	CHECK(f != NULL);
	while (fgets(line, sizeof(line), f))
		n += strstr(line, text) != NULL;
	fclose(f);
	return n;
}

static int kvbctl_status(char **out)
{
	char args[200];

	snprintf(args, sizeof(args), "--socket %s status", b->sock);
	return harness_run_tool("kvbctl", args, out);
}

int main(int argc, char **argv)
{
	kvb_client *e[MAXC + 1], *x, *probe;
	char *out, *js;
	pid_t pid;
	int rc, lines;
	uint64_t t0;

	harness_init(argc, argv);
	harness_gate_init(&held);
	harness_gate_init(&done);
	b = harness_broker_start("--pool", "64M", "--max-clients", "3", "--max-control", "4",
				 "--control-idle", "2");

	/* 1. The control connections are full; engines are not. */
	pid = harness_fork(holder, 0, NULL);
	harness_gate_wait(&held, 10000);
	CHECK_RC(control_connect(&x, "fifth"), -EUSERS);
	rc = kvbctl_status(&out);
	CHECKF(rc != 0 && strstr(out, "too many clients"), "kvbctl with control full: %d %s", rc,
	       out);
	free(out);
	for (int i = 0; i < MAXC; i++)
		CHECK_OK(engine_connect(&e[i]));
	CHECK_RC(engine_connect(&e[MAXC]), -EUSERS);
	CHECK_EQ(harness_stat(e[0], "control_clients"), MAXCTL);
	CHECK_EQ(harness_stat(e[0], "clients"), MAXC);

	/* 2. Refusals are throttled: the first was logged, 30 more add at most one line. */
	lines = log_count("refused");
	for (int i = 0; i < 30; i++)
		CHECK_RC(control_connect(&x, "flood"), -EUSERS);
	CHECKF(log_count("refused") <= lines + 1, "%d refusal lines for 30 refusals",
	       log_count("refused") - lines);
	CHECK_EQ(harness_stat(e[0], "counters.protocol_errors"), 0);
	CHECK_GE(harness_stat(e[0], "counters.refused"), 32);

	/* 3. Idle control connections expire; kvbctl works again. */
	CHECK_EQ(harness_stat_wait(e[0], "control_clients", 0, 6000), 0);
	CHECK_GE(harness_stat(e[0], "counters.expired"), MAXCTL);
	harness_gate_open(&done, 1);
	CHECK_EQ(harness_wait(&pid, 1, 10000, NULL), 0);
	rc = kvbctl_status(&out);
	CHECKF(rc == 0, "kvbctl after the idle ones expired: %d %s", rc, out);
	free(out);

	/* 4. 200 silent connects: an engine and kvbctl are served at once all the same. */
	kvb_close(e[0]);
	CHECK_EQ(harness_stat_wait(e[1], "clients", MAXC - 1, 2000), MAXC - 1);
	harness_gate_init(&held);
	harness_gate_init(&done);
	pid = harness_fork(silent, 1, NULL);
	harness_gate_wait(&held, 10000);
	t0 = harness_now_ms();
	CHECK_OK(engine_connect(&e[0]));
	CHECK_OK(kvb_nop(e[0]));
	CHECK_OK(control_connect(&probe, "probe"));
	CHECK_OK(kvb_stats_json(probe, &js));
	free(js);
	kvb_close(probe);
	rc = kvbctl_status(&out);
	CHECKF(rc == 0, "kvbctl next to %d silent connects: %d %s", NSILENT, rc, out);
	free(out);
	harness_log("engine, control client and kvbctl served in %llu ms next to %d silent "
		    "connects",
		    (unsigned long long)(harness_now_ms() - t0), NSILENT);
	/* The old lockout lasted 5 s; 4 s leaves room for a kvbctl exec under TSan on a loaded
	 * 2-vCPU machine (2.2 s seen) and still fails that lockout. */
	CHECKF(harness_now_ms() - t0 < 4000, "took %llu ms",
	       (unsigned long long)(harness_now_ms() - t0));
	CHECK_LE(harness_stat(e[0], "handshakes"), 64);
	CHECKF(log_count("no HELLO in time") <= 2, "%d 'no HELLO' lines",
	       log_count("no HELLO in time"));
	harness_gate_open(&done, 1);
	CHECK_EQ(harness_wait(&pid, 1, 10000, NULL), 0);
	for (int i = 0; i < MAXC; i++)
		kvb_close(e[i]);
	CHECK(harness_broker_alive(b));
	harness_broker_stop(b);
	return H_PASS;
}
