// SPDX-License-Identifier: MIT
/*
 * t_version.c - one version everywhere. include/kvbroker.h's KVB_VERSION_* is its only home;
 * this test fails when any two of these disagree: KVB_VERSION_STRING, kvb_version() of the
 * library linked, `--version` of every program (kvbrokerd, kvbctl, kvbbench, kvbdemo, kvbdisk,
 * kvbchain, kvbfetch, kvbgpucheck), a running broker's stats document ("version"), its
 * "ready" log line, `kvbctl status` and the kvbroker_info metric (`kvbctl metrics`). The
 * Python package's __version__ and metadata are checked against kvbrokerd --version by
 * python/tests/test_version.py.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

int main(int argc, char **argv)
{
	static const char *const progs[] = {"kvbrokerd", "kvbctl",   "kvbbench", "kvbdemo",
					    "kvbdisk",	 "kvbchain", "kvbfetch", "kvbgpucheck"};
	const char *v = KVB_VERSION_STRING;
	struct harness_broker *b;
	char want[128], args[256], *out, *json;
	unsigned lib = kvb_version();
	kvb_client *c;

	harness_init(argc, argv);
	snprintf(want, sizeof(want), "%u.%u.%u", lib >> 16, (lib >> 8) & 0xff, lib & 0xff);
	CHECKF(!strcmp(want, v), "kvb_version() says %s, KVB_VERSION_STRING %s", want, v);
	snprintf(want, sizeof(want), "%d.%d.%d", KVB_VERSION_MAJOR, KVB_VERSION_MINOR,
		 KVB_VERSION_PATCH);
	CHECKF(!strcmp(want, v), "KVB_VERSION_* say %s, KVB_VERSION_STRING %s", want, v);

	for (size_t i = 0; i < sizeof(progs) / sizeof(progs[0]); i++) {
		snprintf(want, sizeof(want), "%s %s\n", progs[i], v);
		CHECK_EQ(harness_run_tool(progs[i], "--version", &out), 0);
		CHECKF(!strcmp(out, want), "%s --version printed '%s', want '%s'", progs[i], out,
		       want);
		free(out);
	}

	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "version", 0);
	json = harness_stats(c);
	snprintf(want, sizeof(want), "\"version\":\"%s\"", v);
	CHECKF(strstr(json, want), "stats document without %s:\n%.300s", want, json);
	free(json);
	kvb_close(c);
	snprintf(want, sizeof(want), "kvbrokerd %s ready in", v);
	CHECKF(harness_broker_log_has(b, want), "the broker's log lacks '%s'", want);

	snprintf(args, sizeof(args), "--socket %s status", b->sock);
	CHECK_EQ(harness_run_tool("kvbctl", args, &out), 0);
	snprintf(want, sizeof(want), "kvbrokerd %s ", v);
	CHECKF(!strncmp(out, want, strlen(want)), "kvbctl status starts '%.60s', want '%s'", out,
	       want);
	free(out);
	snprintf(args, sizeof(args), "--socket %s metrics", b->sock);
	CHECK_EQ(harness_run_tool("kvbctl", args, &out), 0);
	snprintf(want, sizeof(want), "\nkvbroker_info{version=\"%s\",", v);
	CHECKF(strstr(out, want), "kvbctl metrics lacks %s", want + 1);
	free(out);
	harness_broker_stop(b);
	harness_log("version %s everywhere", v);
	return H_PASS;
}
