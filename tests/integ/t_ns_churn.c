// SPDX-License-Identifier: MIT
/*
 * t_ns_churn.c - [ns-free] namespaces come and go, and STATS of any size:
 *   - 2,048 namespaces opened by 32 short-lived clients of 64 models each, none storing a page:
 *     each goes with its client (the table held 1,024 for the broker's life before, and the
 *     17th client's models were -EMFILE);
 *   - 5,056 namespaces kept alive by a page each: the STATS document (megabytes) is read page
 *     by page by the library and by `kvbctl ns`, where one datagram held ~944 namespaces.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

static void open_models(const struct harness_broker *b, int round, int put)
{
	kvb_client *c = harness_connect(b, "churn", 0);
	uint8_t page[4096];

	for (int i = 0; i < 64; i++) {
		struct kvb_layout l;
		char model[64];
		uint32_t ns;
		size_t pb;

		snprintf(model, sizeof(model), "churn/%s/r%d/m%d", put ? "kept" : "gone", round, i);
		harness_layout(&l, model, KVB_LAYOUT_MLA, 16, 1, 0, 1, 256);
		CHECKF(kvb_ns_open(c, &l, &ns, &pb) == 0, "round %d model %d: %s", round, i,
		       harness_strerror(kvb_ns_open(c, &l, &ns, &pb)));
		if (put) {
			kvb_key k = harness_key((uint64_t)round, (uint64_t)i);

			harness_fill(page, pb, &k, 1);
			CHECK_RC(kvb_put(c, ns, k, page, pb), 0);
		}
	}
	kvb_close(c);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	kvb_client *c;
	char *js, *out = NULL, args[300];
	int n = 0, lines = 0;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "observer", 0);
	for (int r = 0; r < 32; r++)
		open_models(b, r, 0);
	CHECK_EQ(harness_stat_wait(c, "namespaces_freed", 2048, 5000), 2048);
	harness_log("2048 namespaces came and went");

	for (int r = 0; r < 79; r++)
		open_models(b, r, 1);
	js = harness_stats(c); /* kvb_stats_json, paged */
	for (const char *p = js; (p = strstr(p, "\"model\":\"churn/kept/")); p++)
		n++;
	harness_log("STATS with %d namespaces: %zu bytes", n, strlen(js));
	CHECK_EQ(n, 79 * 64);
	free(js);
	snprintf(args, sizeof(args), "--socket %s ns", b->sock);
	CHECK_EQ(harness_run_tool("kvbctl", args, &out), 0);
	for (const char *p = out; (p = strstr(p, "churn/kept/")); p++)
		lines++;
	CHECK_EQ(lines, 79 * 64);
	free(out);
	kvb_close(c);
	harness_broker_stop(b);
	return 0;
}
