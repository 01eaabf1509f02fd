// SPDX-License-Identifier: MIT
/*
 * test_metrics.c - the Prometheus generator (common/metrics.c) fed hand-written STATS
 * documents: one with a disk tier and two NUMA nodes (which no integration test can create
 * yet), one from an old broker with few fields, and label escaping; plus the format checker
 * itself, which must reject what Prometheus would.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "metrics.h"

static const char full_doc[] =
	"{\"version\":\"0.1.0\",\"pid\":7,\"uptime_s\":12.5,\"copy_engine\":\"host\","
	"\"pool\":{\"bytes_total\":3000,\"bytes_used\":1200,\"pages\":3,\"pinned_pages\":1,"
	"\"slab_bytes\":1000,\"slabs_total\":3,\"slabs_free\":1,\"high_watermark\":0.95,"
	"\"low_watermark\":0.9,\"arenas\":["
	"{\"id\":0,\"node\":0,\"bytes_total\":1000,\"bytes_used\":400,\"page_size\":\"2M\"},"
	"{\"id\":1,\"node\":1,\"bytes_total\":1000,\"bytes_used\":800,\"page_size\":\"2M\"},"
	"{\"id\":2,\"node\":1,\"bytes_total\":1000,\"bytes_used\":0,\"page_size\":\"2M\"}]},"
	"\"disk\":{\"state\":\"ok\",\"direct\":true,\"paths\":[\"/nvme0/kvb.cache\"],"
	"\"bytes_total\":10000,\"bytes_used\":2500,\"pages\":5,\"reads\":11,\"writes\":13,"
	"\"read_bytes\":1100,\"write_bytes\":1300,\"errors\":1,\"corrupt\":2,\"torn\":3,"
	"\"dropped\":4,\"demotions\":13,\"promotions\":6,\"scan_seconds\":0.25},"
	"\"clients\":1,\"leases\":1,"
	"\"namespaces\":[{\"id\":0,\"model\":\"kimi \\\"k2.5\\\"\\\\x\",\"kind\":\"mla\","
	"\"pages\":3,\"bytes\":1200,\"hits\":5,\"misses\":1,\"puts\":9,\"dedup\":6,\"gets\":6,"
	"\"dedup_bytes\":2400,\"clients\":8}],"
	"\"counters\":{\"puts\":9,\"gets\":6,\"hits\":5,\"misses\":1,\"dedup\":6,\"evictions\":2,"
	"\"errors\":0,\"bytes_in\":1200,\"bytes_out\":2400,\"dedup_bytes\":2400},"
	"\"client_list\":[{\"id\":3,\"pid\":99,\"name\":\"rank\\n0\",\"leases\":1,\"ops\":20,"
	"\"puts\":9,\"gets\":6},{\"id\":4,\"pid\":98,\"name\":\"bad\\u0001\xff\",\"ops\":1}]}";

static char *render(const char *doc)
{
	char *t = metrics_from_json(doc);
	char err[128];

	assert_non_null(t);
	if (metrics_check(t, err, sizeof(err))) {
		printf("%s\n---\n%s\n", err, t);
		fail();
	}
	return t;
}

static void has(const char *text, const char *line)
{
	if (!strstr(text, line)) {
		printf("missing: %s\n---\n%s\n", line, text);
		fail();
	}
}

static void test_metrics_disk_and_numa(void **state)
{
	char *t = render(full_doc);

	(void)state;
	has(t, "# TYPE kvbroker_pool_bytes gauge\n");
	has(t, "kvbroker_pool_bytes{tier=\"ram\",node=\"0\",state=\"used\"} 400\n");
	has(t, "kvbroker_pool_bytes{tier=\"ram\",node=\"0\",state=\"free\"} 600\n");
	/* Two arenas on node 1 add up. */
	has(t, "kvbroker_pool_bytes{tier=\"ram\",node=\"1\",state=\"used\"} 800\n");
	has(t, "kvbroker_pool_bytes{tier=\"ram\",node=\"1\",state=\"free\"} 1200\n");
	has(t, "kvbroker_pool_bytes{tier=\"disk\",state=\"used\"} 2500\n");
	has(t, "kvbroker_pool_bytes{tier=\"disk\",state=\"free\"} 7500\n");
	has(t, "kvbroker_pool_pages{tier=\"disk\"} 5\n");
	has(t, "kvbroker_disk_state{state=\"ok\"} 1\n");
	has(t, "kvbroker_disk_state{state=\"off\"} 0\n");
	has(t, "# TYPE kvbroker_disk_reads_total counter\nkvbroker_disk_reads_total 11\n");
	has(t, "kvbroker_disk_bytes_total{direction=\"write\"} 1300\n");
	has(t, "kvbroker_disk_torn_total 3\n");
	has(t, "kvbroker_disk_scan_seconds 0.25\n");
	has(t, "kvbroker_uptime_seconds 12.5\n");
	has(t, "kvbroker_pool_watermark_ratio{level=\"high\"} 0.95\n");
	has(t, "kvbroker_ops_total{op=\"put\"} 9\n");
	has(t, "kvbroker_dedup_bytes_total 2400\n");
	has(t, "kvbroker_transfer_bytes_total{direction=\"out\"} 2400\n");
	/* Label values escaped: quote, backslash, newline. */
	has(t, "kvbroker_ns_dedup_bytes_total{ns=\"0\",model=\"kimi \\\"k2.5\\\"\\\\x\","
	       "kind=\"mla\"} 2400\n");
	has(t, "kvbroker_ns_clients{ns=\"0\"");
	has(t, "kvbroker_client_ops_total{client=\"3\",pid=\"99\",name=\"rank\\n0\"} 20\n");
	/* Control and non-ASCII bytes of a client-chosen name cannot break the scrape. */
	has(t, "kvbroker_client_ops_total{client=\"4\",pid=\"98\",name=\"bad??\"} 1\n");
	/* Families whose source fields are absent are left out. */
	assert_null(strstr(t, "kvbroker_client_bytes_in_total"));
	free(t);
}

/* The remote tier: its state, shards and counters; "off" gives the state family alone. */
static void test_metrics_remote(void **state)
{
	char *t = render("{\"version\":\"0.0.1\",\"remote\":{\"state\":\"degraded\","
			 "\"shards\":3,\"shards_reachable\":2,\"published\":5,\"fetched\":4,"
			 "\"fetch_bytes\":4096,\"publish_bytes\":8192,\"bytes_in_flight\":7,"
			 "\"publish_lost\":3,\"corrupt\":1,\"wrong_key\":14,\"other_version\":2}}");

	(void)state;
	has(t, "kvbroker_remote_state{state=\"degraded\"} 1\n");
	has(t, "kvbroker_remote_state{state=\"ok\"} 0\n");
	has(t, "kvbroker_remote_shards_reachable 2\n");
	has(t, "kvbroker_remote_published_total 5\n");
	has(t, "kvbroker_remote_publish_lost_total 3\n");
	has(t, "kvbroker_remote_corrupt_total 1\n");
	has(t, "kvbroker_remote_wrong_key_total 14\n");
	has(t, "kvbroker_remote_other_version_total 2\n");
	has(t, "kvbroker_remote_bytes_total{direction=\"fetch\"} 4096\n");
	has(t, "kvbroker_remote_bytes_in_flight 7\n");
	free(t);
	t = render("{\"version\":\"0.0.1\",\"remote\":{\"state\":\"off\"}}");
	has(t, "kvbroker_remote_state{state=\"off\"} 1\n");
	assert_null(strstr(t, "kvbroker_remote_shards"));
	free(t);
}

/* A disk object that says "off" and an old broker's sparse document. */
static void test_metrics_disk_off_and_sparse(void **state)
{
	char *t = render("{\"version\":\"0.0.1\",\"pool\":{\"bytes_total\":100,\"bytes_used\":10,"
			 "\"pages\":1},\"disk\":{\"state\":\"off\"},\"clients\":0,"
			 "\"counters\":{\"puts\":1}}");

	(void)state;
	has(t, "kvbroker_pool_bytes{tier=\"ram\",node=\"-1\",state=\"used\"} 10\n");
	has(t, "kvbroker_disk_state{state=\"off\"} 1\n");
	assert_null(strstr(t, "tier=\"disk\""));
	assert_null(strstr(t, "kvbroker_disk_reads_total"));
	has(t, "kvbroker_ops_total{op=\"put\"} 1\n");
	assert_null(strstr(t, "op=\"get\""));
	assert_null(strstr(t, "kvbroker_ns_"));
	free(t);
	assert_null(metrics_from_json("not json"));
	assert_null(metrics_from_json("[1,2]"));
}

static void bad(const char *text, const char *why)
{
	char err[128];

	if (!metrics_check(text, err, sizeof(err))) {
		printf("accepted (%s):\n%s\n", why, text);
		fail();
	}
}

static void test_metrics_check_rejects(void **state)
{
	char err[128];

	(void)state;
	assert_int_equal(metrics_check("# TYPE a_total counter\na_total{x=\"1\"} 1\n"
				       "a_total{x=\"2\"} 2.5e3 1700000000000\n",
				       err, sizeof(err)),
			 0);
	bad("# TYPE a gauge\na 1", "no final newline");
	bad("# TYPE a gauge\n# TYPE a gauge\na 1\n", "TYPE twice");
	bad("a 1\n", "no TYPE");
	bad("# TYPE a gauge\n# TYPE b gauge\nb 1\na 1\n", "not contiguous");
	bad("# TYPE a gauge\na 1\na 2\n", "duplicate sample");
	bad("# TYPE a gauge\na{x=\"1} 1\n", "unterminated label");
	bad("# TYPE a gauge\na{x=\"\\q\"} 1\n", "bad escape");
	bad("# TYPE a gauge\na{1x=\"1\"} 1\n", "bad label name");
	bad("# TYPE a gauge\na one\n", "bad value");
	bad("# TYPE a gauge\na 1 soon\n", "bad timestamp");
	bad("# TYPE a_total countr\na_total 1\n", "unknown type");
	bad("# TYPE a counter\na 1\n", "counter without _total");
	bad("# TYPE a gauge\n\na 1\n", "empty line");
	/* A histogram's samples carry its suffixes; a gauge's may not. */
	assert_int_equal(metrics_check("# TYPE h histogram\nh_bucket{le=\"1\"} 1\n"
				       "h_bucket{le=\"+Inf\"} 2\nh_sum 3\nh_count 2\n",
				       err, sizeof(err)),
			 0);
	bad("# TYPE h histogram\nh 1\n", "histogram sample without suffix");
	bad("# TYPE h gauge\nh_bucket{le=\"1\"} 1\n", "gauge with _bucket");
	bad("# TYPE h histogram\nh_total 1\n", "histogram with another suffix");
}

/* STATS histograms (per-bucket counts, +Inf last) become cumulative classic histograms. */
static void test_metrics_histograms_and_tenants(void **state)
{
	static const char doc[] =
		"{\"version\":\"1\",\"copy_engine\":\"host\","
		"\"counters\":{\"hits\":7,\"misses\":1,\"hits_ram\":4,\"hits_disk\":2,"
		"\"hits_remote\":1},"
		"\"histograms\":{\"get\":{\"le\":[0.001,0.01],\"counts\":[3,1,1],\"sum\":0.5,"
		"\"count\":5},\"evict_age\":{\"le\":[1,60],\"counts\":[0,2,0],\"sum\":70,"
		"\"count\":2}},"
		"\"tenants\":[{\"partition\":0,\"mode\":\"uid\",\"id\":1001,\"share_bytes\":100,"
		"\"bytes_used\":40,\"pages\":4,\"clients\":1,\"evictions\":2,\"hits\":7,"
		"\"misses\":1},{\"partition\":1,\"mode\":\"uid\",\"id\":-1,\"share_bytes\":100,"
		"\"bytes_used\":0,\"pages\":0,\"clients\":0,\"evictions\":0,\"hits\":0,"
		"\"misses\":0}]}";
	char *t = render(doc);

	(void)state;
	has(t, "# TYPE kvbroker_op_latency_seconds histogram\n");
	has(t, "kvbroker_op_latency_seconds_bucket{op=\"get\",le=\"0.001\"} 3\n");
	has(t, "kvbroker_op_latency_seconds_bucket{op=\"get\",le=\"0.01\"} 4\n");
	has(t, "kvbroker_op_latency_seconds_bucket{op=\"get\",le=\"+Inf\"} 5\n");
	has(t, "kvbroker_op_latency_seconds_sum{op=\"get\"} 0.5\n");
	has(t, "kvbroker_op_latency_seconds_count{op=\"get\"} 5\n");
	has(t, "kvbroker_evicted_page_age_seconds_bucket{le=\"60\"} 2\n");
	has(t, "kvbroker_evicted_page_age_seconds_count 2\n");
	has(t, "kvbroker_tier_hits_total{tier=\"disk\"} 2\n");
	has(t, "kvbroker_tenant_share_bytes{partition=\"0\",tenant=\"uid:1001\"} 100\n");
	has(t, "kvbroker_tenant_hits_total{partition=\"1\",tenant=\"-\"} 0\n");
	assert_null(strstr(t, "kvbroker_disk_promote_seconds")); /* not in the document */
	free(t);
}

/* [ns-cap] Past METRICS_NS_MAX namespaces, the smallest are summed into ns="_other". */
static void test_metrics_ns_cap(void **state)
{
	char *doc = malloc(1 << 20), *t;
	size_t n = 0;
	int total = 0;

	(void)state;
	n += (size_t)sprintf(doc + n, "{\"namespaces\":[");
	for (int i = 0; i < 3 * METRICS_NS_MAX; i++) {
		n += (size_t)sprintf(doc + n,
				     "%s{\"id\":%d,\"model\":\"m%d\",\"kind\":\"mha\",\"pages\":%d,"
				     "\"bytes\":%d,\"limit_bytes\":7}",
				     i ? "," : "", i, i, i, i * 10);
		total += i < 2 * METRICS_NS_MAX ? i : 0;
	}
	sprintf(doc + n, "]}");
	t = render(doc);
	/* The largest keep their series, the rest add up in one. */
	has(t, "kvbroker_ns_pages{ns=\"95\",model=\"m95\",kind=\"mha\"} 95\n");
	assert_null(strstr(t, "model=\"m63\""));
	{
		char want[128];

		snprintf(want, sizeof(want),
			 "kvbroker_ns_pages{ns=\"_other\",model=\"_other\",kind=\"_other\"} %d\n",
			 total);
		has(t, want);
	}
	assert_null(strstr(t, "kvbroker_ns_limit_bytes{ns=\"_other\""));
	{
		int series = 0;

		for (const char *p = t; (p = strstr(p, "\nkvbroker_ns_pages{")); p++)
			series++;
		assert_int_equal(series, METRICS_NS_MAX + 1);
	}
	free(t);
	free(doc);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_metrics_disk_and_numa),
		cmocka_unit_test(test_metrics_disk_off_and_sparse),
		cmocka_unit_test(test_metrics_remote),
		cmocka_unit_test(test_metrics_check_rejects),
		cmocka_unit_test(test_metrics_histograms_and_tenants),
		cmocka_unit_test(test_metrics_ns_cap),
	};

	return cmocka_run_group_tests_name("metrics", tests, NULL, NULL);
}
