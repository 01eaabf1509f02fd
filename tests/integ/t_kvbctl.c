// SPDX-License-Identifier: MIT
/*
 * t_kvbctl.c - every kvbctl subcommand against a real broker whose content the test created:
 * `status --json` (every number the JSON shape names), `clients --json` (a client's
 * namespaces and counters), `ns --json` (dedup bytes, clients), `map --json` and the map grid
 * (used, leased), `metrics` (the exposition format, checked line by line, and its values),
 * `top --json` (rates), `plan --json` (the Kimi-K2.5 case at TP=8, and its reconciliation with
 * a naive per-rank estimate) and the text views.
 * kvbctl must not count as a client, and with no broker every command says where it looked and
 * exits 1.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "metrics.h"

#define PAGE (64u * 1024)

/* Runs kvbctl with args; returns its exit code and its stdout+stderr in *out (free it). */
static int run(const char *args, char **out)
{
	return harness_run_tool("kvbctl", args, out);
}

/* kvbctl ARGS as JSON; fails the test unless it exits 0 and prints JSON. cJSON_Delete it. */
static cJSON *run_json(const char *sock, const char *args)
{
	char cmd[512], *out;
	cJSON *j;

	snprintf(cmd, sizeof(cmd), "--socket %s %s", sock, args);
	CHECKF(run(cmd, &out) == 0, "kvbctl %s failed:\n%s", args, out);
	j = cJSON_Parse(out);
	CHECKF(j != NULL, "kvbctl %s printed no JSON:\n%s", args, out);
	free(out);
	return j;
}

/* Sum of the values of the metric lines that start with prefix and contain part. */
static double metric_sum(const char *text, const char *prefix, const char *part)
{
	double t = 0;

	for (const char *l = text; l && *l; l = strchr(l, '\n'), l = l ? l + 1 : NULL) {
		const char *end = strchr(l, '\n'), *sp;

		if (strncmp(l, prefix, strlen(prefix)))
			continue;
		sp = memchr(l, ' ', (size_t)((end ? end : l + strlen(l)) - l));
		if (sp && memmem(l, (size_t)(sp - l), part, strlen(part)))
			t += strtod(sp + 1, NULL);
	}
	return t;
}

/* Sum of a numeric array (map cells). */
static double sum(const cJSON *arr)
{
	const cJSON *v;
	double t = 0;

	CHECK(cJSON_IsArray(arr));
	cJSON_ArrayForEach(v, arr) t += v->valuedouble;
	return t;
}

static double num(const cJSON *root, const char *a, const char *b)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, a);

	if (b)
		o = cJSON_GetObjectItemCaseSensitive(o, b);
	CHECKF(cJSON_IsNumber(o), "%s.%s missing or not a number", a, b ? b : "");
	return o->valuedouble;
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_layout l;
	struct kvb_lease lease;
	kvb_client *c;
	kvb_key keys[10];
	uint8_t *page;
	uint32_t ns;
	size_t pb;
	char args[256], *out;
	cJSON *root, *nss, *n0;

	harness_init(argc, argv);
	b = harness_broker_start("--pool", "64M");
	c = harness_connect(b, "ctl-test", 0);
	harness_layout(&l, "ctl-model", KVB_LAYOUT_MLA, 64, 8, 3, 1, PAGE / 64);
	CHECK_OK(kvb_ns_open(c, &l, &ns, &pb));
	CHECK_EQ(pb, PAGE);
	page = malloc(PAGE);
	CHECK(page != NULL);
	for (int i = 0; i < 10; i++) {
		keys[i] = harness_key(7, (uint64_t)i);
		harness_fill(page, PAGE, &keys[i], 7);
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 0);
	}
	for (int i = 0; i < 3; i++)
		CHECK_RC(kvb_put(c, ns, keys[i], page, PAGE), 1);
	CHECK_RC(kvb_get(c, ns, keys[4], page, PAGE), PAGE);
	CHECK_RC(kvb_get(c, ns, harness_key(8, 0), page, PAGE), -ENOENT);
	CHECK_OK(kvb_acquire(c, ns, keys[5], &lease));

	snprintf(args, sizeof(args), "--socket %s status --json", b->sock);
	CHECK_EQ(run(args, &out), 0);
	root = cJSON_Parse(out);
	CHECKF(root != NULL, "kvbctl status --json printed no JSON:\n%s", out);
	/* [dir] The directory's bytes are the pool's, not the pages'. */
	CHECK_EQ(num(root, "pool", "bytes_total") + num(root, "pool", "dir_bytes"), 64u << 20);
	CHECK(num(root, "pool", "dir_bytes") > 0);
	CHECK_EQ(num(root, "pool", "bytes_used"), 10 * PAGE);
	CHECK_EQ(num(root, "pool", "pages"), 10);
	CHECK_EQ(num(root, "clients", NULL), 1); /* kvbctl itself is not a client */
	CHECK_EQ(num(root, "leases", NULL), 1);
	CHECK_EQ(num(root, "counters", "puts"), 13);
	CHECK_EQ(num(root, "counters", "dedup"), 3);
	CHECK_EQ(num(root, "counters", "evictions"), 0);
	CHECK_GE(num(root, "counters", "hits"), 2); /* the GET, the ACQUIRE */
	CHECK_GE(num(root, "counters", "misses"), 1);
	CHECK_EQ(num(root, "counters", "errors"), 0);
	/*
	 * kvb_get into plain memory is ACQUIRE + copy + RELEASE in the library, counted as the
	 * GET it is (KVB_SQEF_GET): the two plain GETs are gets, the kvb_acquire an acquire.
	 */
	CHECK_EQ(num(root, "counters", "acquires"), 1);
	CHECK_EQ(num(root, "counters", "gets"), 2);
	CHECK_EQ(num(root, "counters", "releases"), 0);
	nss = cJSON_GetObjectItemCaseSensitive(root, "namespaces");
	CHECK(cJSON_IsArray(nss));
	CHECK_EQ(cJSON_GetArraySize(nss), 1);
	n0 = cJSON_GetArrayItem(nss, 0);
	CHECK_EQ(num(n0, "id", NULL), ns);
	CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(n0, "model")), "ctl-model"));
	CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(n0, "kind")), "mla"));
	CHECK_EQ(num(n0, "page_bytes", NULL), PAGE);
	CHECK_EQ(num(n0, "pages", NULL), 10);
	cJSON_Delete(root);
	free(out);

	/* The text views run and name what is there. */
	snprintf(args, sizeof(args), "--socket %s status", b->sock);
	CHECK_EQ(run(args, &out), 0);
	CHECKF(strstr(out, "ctl-model") != NULL, "status text lacks the model:\n%s", out);
	free(out);
	snprintf(args, sizeof(args), "--socket %s clients", b->sock);
	CHECK_EQ(run(args, &out), 0);
	CHECKF(strstr(out, "ctl-test") != NULL, "clients table lacks the client:\n%s", out);
	free(out);
	snprintf(args, sizeof(args), "--socket %s ns", b->sock);
	CHECK_EQ(run(args, &out), 0);
	CHECKF(strstr(out, "ctl-model") != NULL, "ns table lacks the namespace:\n%s", out);
	free(out);

	/* clients --json: the client's namespaces and what its ops did. */
	root = run_json(b->sock, "clients --json");
	CHECK(cJSON_IsArray(root));
	CHECK_EQ(cJSON_GetArraySize(root), 1);
	n0 = cJSON_GetArrayItem(root, 0);
	CHECK(!strcmp(cJSON_GetStringValue(cJSON_GetObjectItem(n0, "name")), "ctl-test"));
	CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(n0, "ns")), 1);
	CHECK_EQ(cJSON_GetArrayItem(cJSON_GetObjectItem(n0, "ns"), 0)->valuedouble, ns);
	CHECK_EQ(num(n0, "namespaces", NULL), 1);
	CHECK_EQ(num(n0, "leases", NULL), 1);
	CHECK_EQ(num(n0, "puts", NULL), 13);
	CHECK_EQ(num(n0, "dedup", NULL), 3);
	CHECK_EQ(num(n0, "gets", NULL), 3); /* two kvb_get (ACQUIREs), one kvb_acquire */
	CHECK_EQ(num(n0, "hits", NULL), 2);
	CHECK_EQ(num(n0, "misses", NULL), 1);
	CHECK_EQ(num(n0, "bytes_in", NULL), 10 * PAGE);
	CHECK_EQ(num(n0, "errors", NULL), 0);
	CHECK_GE(num(n0, "ops", NULL), 13 + 3);
	cJSON_Delete(root);

	/* ns --json: dedup savings and who has it open. */
	root = run_json(b->sock, "ns --json");
	CHECK_EQ(cJSON_GetArraySize(root), 1);
	n0 = cJSON_GetArrayItem(root, 0);
	CHECK_EQ(num(n0, "dedup_bytes", NULL), 3 * PAGE);
	CHECK_EQ(num(n0, "clients", NULL), 1);
	cJSON_Delete(root);
	root = run_json(b->sock, "status --json");
	CHECK_EQ(num(root, "counters", "dedup_bytes"), 3 * PAGE);
	CHECK(!cJSON_GetObjectItem(root, "disk") ||
	      !strcmp(cJSON_GetStringValue(
			      cJSON_GetObjectItem(cJSON_GetObjectItem(root, "disk"), "state")),
		      "off"));
	cJSON_Delete(root);

	/*
	 * map --json: one entry per arena (one per NUMA node where the pool is split); together
	 * they cover the pool, and their cells hold the 10 pages, one of them leased.
	 */
	root = run_json(b->sock, "map --json");
	CHECK_GE(cJSON_GetArraySize(root), 1);
	{
		double bytes = 0, used = 0, pinned = 0, writing = 0;

		cJSON_ArrayForEach(n0, root)
		{
			bytes += num(n0, "slabs", NULL) * num(n0, "slab_bytes", NULL);
			CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(n0, "used")),
				 ceil(num(n0, "slabs", NULL) / num(n0, "slabs_per_cell", NULL)));
			used += sum(cJSON_GetObjectItem(n0, "used"));
			pinned += sum(cJSON_GetObjectItem(n0, "pinned"));
			writing += sum(cJSON_GetObjectItem(n0, "writing"));
		}
		CHECK_LE(bytes, 64u << 20);
		CHECK_GE(bytes, 56u << 20); /* arenas may leave less than a slab uncut */
		CHECK_EQ(used, 10 * PAGE);
		CHECK_EQ(pinned, PAGE);
		CHECK_EQ(writing, 0);
	}
	cJSON_Delete(root);
	snprintf(args, sizeof(args), "--socket %s map", b->sock);
	CHECK_EQ(run(args, &out), 0);
	CHECKF(strstr(out, "arena 0") && strchr(out, 'L') && strstr(out, "......."),
	       "map should show arena 0, a leased cell and free cells:\n%s", out);
	free(out);

	/* metrics: the exposition format, line by line, and the state we made. */
	snprintf(args, sizeof(args), "--socket %s metrics", b->sock);
	CHECK_EQ(run(args, &out), 0);
	{
		char err[256], line[256];

		CHECKF(metrics_check(out, err, sizeof(err)) == 0, "metrics: %s:\n%s", err, out);
		CHECKF(metric_sum(out, "kvbroker_pool_bytes{tier=\"ram\",", "state=\"used\"}") ==
			       10 * PAGE,
		       "metrics: RAM used over the nodes is not %u:\n%s", 10 * PAGE, out);
		snprintf(line, sizeof(line),
			 "kvbroker_ns_dedup_bytes_total{ns=\"%u\","
			 "model=\"ctl-model\",kind=\"mla\"} %u\n",
			 ns, 3 * PAGE);
		CHECKF(strstr(out, line), "metrics lack %s:\n%s", line, out);
		CHECKF(strstr(out, "kvbroker_pool_pages{tier=\"ram\"} 10\n") &&
			       strstr(out, "kvbroker_ops_total{op=\"put\"} 13\n") &&
			       strstr(out, "kvbroker_leases 1\n") &&
			       strstr(out, "kvbroker_disk_state{state=\"off\"} 1\n") &&
			       strstr(out, "name=\"ctl-test\"} "),
		       "metrics lack the state the test made:\n%s", out);
	}
	free(out);

	/* top --json: one sample of the rates over a short interval. */
	root = run_json(b->sock, "top --json --interval 0.2");
	CHECK_GE(num(root, "interval_s", NULL), 0.1);
	CHECK_EQ(num(root, "puts_per_s", NULL), 0);
	CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(root, "clients")), 1);
	/* Hits by tier, the eviction age (null: nothing evicted), each tenant against its share. */
	CHECK(cJSON_IsObject(cJSON_GetObjectItem(root, "hits_per_s_by_tier")));
	CHECK_EQ(num(cJSON_GetObjectItem(root, "hits_per_s_by_tier"), "ram", NULL), 0);
	CHECK(cJSON_IsNull(cJSON_GetObjectItem(root, "evict_age_median_s")) ||
	      cJSON_IsNumber(cJSON_GetObjectItem(root, "evict_age_median_s")));
	CHECK_EQ(cJSON_GetArraySize(cJSON_GetObjectItem(root, "tenants")), 1);
	CHECK_GT(num(cJSON_GetArrayItem(cJSON_GetObjectItem(root, "tenants"), 0), "share_bytes",
		     NULL),
		 0);
	cJSON_Delete(root);

	/* status text: per node, disk off, dedup. */
	snprintf(args, sizeof(args), "--socket %s status", b->sock);
	CHECK_EQ(run(args, &out), 0);
	CHECKF(strstr(out, "\n  node ") && strstr(out, "disk: off") &&
		       strstr(out, "192.0 KiB not "),
	       "status text lacks node, disk or dedup lines:\n%s", out);
	free(out);

	/* A second rank of the same MLA engine shares the namespace; its counters are its own. */
	{
		kvb_client *c2 = harness_connect(b, "ctl-test-2", 0);
		uint32_t ns2;
		const cJSON *cl;
		int seen = 0;

		harness_layout(&l, "ctl-model", KVB_LAYOUT_MLA, 64, 8, 4, 1, PAGE / 64);
		CHECK_OK(kvb_ns_open(c2, &l, &ns2, &pb));
		CHECK_EQ(ns2, ns);
		harness_fill(page, PAGE, &keys[0], 7);
		CHECK_RC(kvb_put(c2, ns, keys[0], page, PAGE), 1);
		root = run_json(b->sock, "clients --json");
		CHECK_EQ(cJSON_GetArraySize(root), 2);
		cJSON_ArrayForEach(cl, root)
		{
			const char *name = cJSON_GetStringValue(cJSON_GetObjectItem(cl, "name"));

			if (strcmp(name, "ctl-test-2"))
				continue;
			seen = 1;
			CHECK_EQ(num(cl, "puts", NULL), 1);
			CHECK_EQ(num(cl, "dedup", NULL), 1);
			CHECK_EQ(num(cl, "bytes_in", NULL), 0);
			CHECK_EQ(cJSON_GetArrayItem(cJSON_GetObjectItem(cl, "ns"), 0)->valuedouble,
				 ns);
		}
		CHECK(seen);
		cJSON_Delete(root);
		root = run_json(b->sock, "ns --json");
		CHECK_EQ(num(cJSON_GetArrayItem(root, 0), "clients", NULL), 2);
		CHECK_EQ(num(cJSON_GetArrayItem(root, 0), "dedup_bytes", NULL), 4 * PAGE);
		cJSON_Delete(root);
		kvb_close(c2);
	}

	CHECK_OK(kvb_release(c, &lease));
	kvb_close(c);
	harness_broker_stop(b);

	/* No broker: one clear line naming the path and how to start one, exit 1. */
	{
		static const char *const cmds[] = {"status", "clients", "ns",
						   "map",    "metrics", "top"};

		for (size_t i = 0; i < sizeof(cmds) / sizeof(cmds[0]); i++) {
			snprintf(args, sizeof(args), "--socket %s %s", b->sock, cmds[i]);
			CHECK_EQ(run(args, &out), 1);
			CHECKF(strstr(out, b->sock) != NULL && strstr(out, "kvbrokerd --socket") &&
				       strchr(out, '\n') == out + strlen(out) - 1,
			       "%s without a broker: want one line naming the socket and how to "
			       "start one:\n%s",
			       cmds[i], out);
			free(out);
		}
	}
	CHECK_EQ(run("bogus", &out), 2);
	free(out);

	/* plan: the case, Kimi-K2.5 at TP=8, 116,171 GPU tokens, 300 GiB host RAM. */
	root = run_json("/nonexistent", "plan --model kimi-k2.5 --tp 8 --gpu-tokens 116171 "
					"--host-ram 300G --req-len 4096 --json");
	CHECK_EQ(num(root, "bytes_per_token_rank", NULL), 70272);
	CHECK_EQ(num(root, "ranks_sharing_a_page", NULL), 8);
	CHECK_EQ(num(cJSON_GetObjectItem(root, "private"), "host", "tokens"), 572992);
	CHECK_EQ(num(cJSON_GetObjectItem(root, "shared"), "host", "tokens"), 4583936);
	CHECK_EQ(num(root, "gpu", "requests"), 28);
	CHECK_EQ(num(root, "private", "requests"), 168);
	CHECK_EQ(num(root, "shared", "requests"), 1147);
	CHECK_EQ(num(root, "host_gain", NULL), 8);
	cJSON_Delete(root);
	CHECK_EQ(run("plan --model kimi-k2.5 --tp 8 --gpu-tokens 116171 --host-ram 300G", &out), 0);
	CHECKF(strstr(out, "4,583,936") && strstr(out, "x8.00"),
	       "plan text should show the shared pool's tokens and the 8x:\n%s", out);
	/* Reconciled with a naive per-rank estimate: the bytes per token per rank, the same
	 * tokens on every rank. */
	CHECKF(strstr(out,
		      "\nagainst a naive per-rank estimate (host RAM / TP / bytes per token "
		      "per GPU): with MLA each\n  rank stores the whole latent, 70,272 B per "
		      "token, so 37.5 GiB per rank holds 572,992 tokens,\n  the same on all 8 "
		      "ranks; one shared pool holds each once: 4,583,936 (GPU: 116,171 more).\n"),
	       "plan text should reconcile itself with a naive per-rank estimate:\n%s", out);
	free(out);
	CHECK_EQ(run("plan --help", &out), 0);
	CHECKF(strstr(out, "A naive per-rank estimate") && strstr(out, "70,272 B on every rank"),
	       "plan --help should say what bytes per token per rank means:\n%s", out);
	free(out);

	/*
	 * --stats-file: a saved document renders offline. This one has what other work adds (two
	 * NUMA nodes with page sizes, a disk tier), which no broker here can produce yet.
	 */
	{
		static const char doc[] =
			"{\"version\":\"0.1.0\",\"pid\":1,\"uptime_s\":5,\"pool\":{\"bytes_total\":"
			"4194304,\"bytes_used\":1048576,\"pages\":16,\"arenas\":[{\"id\":0,"
			"\"node\":0,"
			"\"bytes_total\":2097152,\"bytes_used\":1048576,\"page_size\":\"2M\"},{"
			"\"id\":1,"
			"\"node\":1,\"bytes_total\":2097152,\"bytes_used\":0,\"page_size\":\"2M\"}]"
			"},"
			"\"disk\":{\"state\":\"ok\",\"direct\":true,\"paths\":[\"/nvme0/"
			"kvb.cache\"],"
			"\"bytes_total\":1073741824,\"bytes_used\":536870912,\"pages\":128,"
			"\"reads\":7,"
			"\"writes\":9,\"read_bytes\":100,\"write_bytes\":200,\"errors\":0,"
			"\"corrupt\":0,"
			"\"torn\":1,\"dropped\":2,\"demotions\":9,\"promotions\":7,\"scan_"
			"seconds\":0.5},"
			"\"clients\":0,\"leases\":0,\"namespaces\":[],\"counters\":{\"puts\":1,"
			"\"gets\":0,"
			"\"hits\":0,\"misses\":0,\"dedup\":0,\"evictions\":3,\"errors\":0},"
			"\"client_list\":[]}";
		char path[PATH_MAX + 16], cmd[PATH_MAX + 64], err[256];
		FILE *f;

		snprintf(path, sizeof(path), "%s/stats.json", b->dir);
		f = fopen(path, "w");
		CHECK(f != NULL && fputs(doc, f) >= 0 && fclose(f) == 0);
		snprintf(cmd, sizeof(cmd), "--stats-file %s status", path);
		CHECK_EQ(run(cmd, &out), 0);
		CHECKF(strstr(out, "node 0   1.0 MiB used of 2.0 MiB (50.0%), 1 arena, pages 2M") &&
			       strstr(out, "node 1") &&
			       strstr(out, "disk       ok  512.0 MiB used of 1.0 GiB (50.0%), 128 "
					   "pages, O_DIRECT") &&
			       strstr(out, "/nvme0/kvb.cache") && strstr(out, "torn 1"),
		       "status of a saved document with NUMA nodes and a disk tier:\n%s", out);
		free(out);
		snprintf(cmd, sizeof(cmd), "--stats-file %s metrics", path);
		CHECK_EQ(run(cmd, &out), 0);
		CHECKF(metrics_check(out, err, sizeof(err)) == 0, "metrics: %s:\n%s", err, out);
		CHECKF(strstr(out,
			      "kvbroker_pool_bytes{tier=\"disk\",state=\"used\"} 536870912\n") &&
			       strstr(out,
				      "kvbroker_pool_bytes{tier=\"ram\",node=\"1\",state=\"free\"} "
				      "2097152\n") &&
			       strstr(out, "kvbroker_disk_state{state=\"ok\"} 1\n"),
		       "metrics of the saved document:\n%s", out);
		free(out);
		snprintf(cmd, sizeof(cmd), "--stats-file %s top", path);
		CHECK_EQ(run(cmd, &out), 2);
		free(out);
	}
	free(page);
	return H_PASS;
}
