// SPDX-License-Identifier: MIT
/*
 * t_kvbctl.c - `kvbctl status --json` (and the text views) against a real broker whose content
 * the test created: every number the JSON shape names is checked against that state.
 * kvbctl must not count as a client, and with no broker it says where it looked and exits 1.
 */
#include <cjson/cJSON.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

#define PAGE (64u * 1024)

static char kvbctl[PATH_MAX];

/* Runs kvbctl with args; returns its exit code and its stdout+stderr in *out (free it). */
static int run(const char *args, char **out)
{
	char cmd[PATH_MAX + 512];
	size_t cap = 1 << 16, len = 0, n;
	char *buf = malloc(cap);
	FILE *p;
	int st;

	CHECK(buf != NULL);
	snprintf(cmd, sizeof(cmd), "%s %s 2>&1", kvbctl, args);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0) {
		len += n;
		if (len == cap - 1) {
			char *nb = realloc(buf, cap * 2);

			CHECK(nb != NULL);
			buf = nb;
			cap *= 2;
		}
	}
	buf[len] = '\0';
	st = pclose(p);
	*out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
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
	char tmp[PATH_MAX];

	harness_init(argc, argv);
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	snprintf(kvbctl, sizeof(kvbctl), "%s/../bin/kvbctl", dirname(tmp));
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
	CHECK_EQ(num(root, "pool", "bytes_total"), 64u << 20);
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
	/* kvb_get into plain memory is ACQUIRE + copy + RELEASE in the library. */
	CHECK_EQ(num(root, "counters", "acquires"), 3);
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

	CHECK_OK(kvb_release(c, &lease));
	kvb_close(c);
	harness_broker_stop(b);

	/* No broker: one clear line naming the path, exit 1. */
	snprintf(args, sizeof(args), "--socket %s status", b->sock);
	CHECK_EQ(run(args, &out), 1);
	CHECKF(strstr(out, b->sock) != NULL && strstr(out, "kvbrokerd") != NULL,
	       "no-broker message should name the socket and how to start one:\n%s", out);
	free(out);
	free(page);
	return H_PASS;
}
