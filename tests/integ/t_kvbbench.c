// SPDX-License-Identifier: MIT
/*
 * t_kvbbench.c - every kvbbench mode runs against a real broker and its --json says what the
 * mode did: the right number of ops, PUTs that stored, reads without misses, TP ranks that made
 * one copy (also loading in kvb_submit batches, --qd), engine loads in layer groups through a
 * view (--layers), ops paired with memcpy (--pair), a too-small pool refused with a clear
 * message. Small working sets and --iters keep it to a few seconds; the figures themselves are
 * `make bench`'s business, not this test's.
 */
#include <cjson/cJSON.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

#include "harness.h"

static char kvbbench[PATH_MAX];
static struct harness_broker *b;

/* Runs kvbbench with args; returns its exit code and its stdout+stderr in *out (free it). */
static int run(const char *args, char **out)
{
	char cmd[PATH_MAX + 1024];
	size_t cap = 1 << 16, len = 0, n;
	char *buf = malloc(cap);
	FILE *p;
	int st;

	CHECK(buf != NULL);
	snprintf(cmd, sizeof(cmd), "%s --socket %s --timeout 60 %s 2>&1", kvbbench, b->sock, args);
	p = popen(cmd, "r");
	CHECK(p != NULL);
	while ((n = fread(buf + len, 1, cap - len - 1, p)) > 0)
		len += n;
	buf[len] = '\0';
	st = pclose(p);
	*out = buf;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128;
}

/* Runs a mode that must succeed and returns its JSON. */
static cJSON *run_json(const char *args)
{
	char *out;
	int rc = run(args, &out);
	cJSON *root;

	CHECKF(rc == 0, "kvbbench %s: exit %d:\n%s", args, rc, out);
	root = cJSON_Parse(out);
	CHECKF(root != NULL, "kvbbench %s printed no JSON:\n%s", args, out);
	free(out);
	return root;
}

static double num(const cJSON *root, const char *name)
{
	const cJSON *o = cJSON_GetObjectItemCaseSensitive(root, name);

	CHECKF(cJSON_IsNumber(o), "%s missing or not a number", name);
	return o->valuedouble;
}

int main(int argc, char **argv)
{
	static const char *const reads[] = {
		"--page 64K --ws 4M --iters 100 get",
		"--page 64K --ws 4M --iters 100 --procs 2 --threads 2 get",
		"--page 64K --ws 4M --iters 20 --qd 8 get",
		"--page 64K --ws 4M --iters 100 --dist zipf get-user",
		"--page 64K --ws 4M --iters 100 --dist uniform acquire",
		"--page 64K --ws 4M --iters 100 --read sum acquire",
		"--page 64K --ws 4M --iters 100 --dst hot get",
		"--page 64K --ws 4M --iters 20 --qd 4 --dst hot get",
		"--page 64K --ws 4M --iters 100 --dst hot get-user",
		"--page 64K --ws 4M --iters 100 --dst hot acquire",
		"--page 64K --ws 4M --iters 100 acquire-copy",
		"--page 1M --ws 8M --iters 20 --dst hot acquire-copy",
	};
	char tmp[PATH_MAX], *out;
	cJSON *r;
	size_t i;

	harness_init(argc, argv);
	snprintf(tmp, sizeof(tmp), "%s", argv[0]);
	snprintf(kvbbench, sizeof(kvbbench), "%s/../bin/kvbbench", dirname(tmp));
	b = harness_broker_start("--pool", "64M");

	r = run_json("--json --iters 200 nop");
	CHECK_EQ(num(r, "ops"), 200);
	CHECK(num(r, "p50_us") > 0); /* CHECK_GT compares integers: p50 is below 1 us */
	cJSON_Delete(r);

	r = run_json("--json --page 64K --ws 4M --iters 100 put");
	CHECK_EQ(num(r, "ops"), 100);
	CHECK_EQ(num(r, "stored"), 100);
	CHECK_EQ(num(r, "dedup"), 0);
	cJSON_Delete(r);
	r = run_json("--json --page 64K --ws 4M --iters 10 --qd 4 put");
	CHECK_EQ(num(r, "stored"), 40);
	CHECK_EQ(num(r, "qd"), 4);
	cJSON_Delete(r);

	for (i = 0; i < sizeof(reads) / sizeof(reads[0]); i++) {
		char args[256];

		snprintf(args, sizeof(args), "--json %s", reads[i]);
		r = run_json(args);
		CHECKF(num(r, "misses") == 0 && num(r, "gb_per_s") > 0, "kvbbench %s", args);
		cJSON_Delete(r);
	}

	/*
	 * --pair: each op followed by memcpy's copy of a page in the same process, timed apart:
	 * the two rates' ratio comes beside the op's figures. Modes of more than a page per op
	 * (a batch, a lookup) are refused.
	 */
	for (i = 0; i < 3; i++) {
		static const char *const paired[] = {
			"--page 64K --ws 4M --iters 100 --dst hot --pair get-user",
			"--page 64K --ws 4M --iters 100 --pair acquire-copy",
			"--page 64K --ws 4M --iters 100 --pair put-user",
		};
		char args[256];

		snprintf(args, sizeof(args), "--json %s", paired[i]);
		r = run_json(args);
		CHECK_EQ(num(r, "ops"), 100);
		CHECK_EQ(num(r, "misses"), 0);
		CHECKF(num(r, "pair_ratio") > 0.01 && num(r, "pair_ratio") < 100, "kvbbench %s",
		       args);
		CHECK(num(r, "pair_memcpy_gb_per_s") > 0);
		cJSON_Delete(r);
	}
	CHECK_EQ(run("--page 64K --ws 4M --iters 10 --qd 4 --pair get", &out), 2);
	CHECKF(strstr(out, "--pair is for") != NULL, "no clear refusal:\n%s", out);
	free(out);
	CHECK_EQ(run("--pair lookup", &out), 2);
	free(out);

	r = run_json("--json --page 64K --pages 256 --batch 64 --iters 50 lookup");
	CHECK_EQ(num(r, "batch"), 64);
	CHECK_GT(num(r, "keys_per_s"), 0);
	cJSON_Delete(r);

	r = run_json(
		"--json --page 64K --ws 4M --iters 400 --mix get=50,put=30,lookup=10,acquire=10 "
		"mix");
	CHECK_EQ(num(r, "ops"), 400);
	CHECK(cJSON_GetObjectItem(r, "kinds") != NULL);
	cJSON_Delete(r);

	/* 4 prompts x (2 + 2 x 1) pages, requests of 2 + 1 + 1 pages. */
	r = run_json(
		"--json --page 64K --prefixes 4 --prefix-pages 2 --branches 2 --branch-pages 1 "
		"--suffix-pages 1 --warmup 0 --iters 50 engine");
	CHECK_EQ(num(r, "pages_asked"), 200);
	CHECK_GT(num(r, "pages_hit"), 0);   /* the shared prefixes */
	CHECK_LE(num(r, "pages_hit"), 150); /* never the request's own page */
	cJSON_Delete(r);

	/*
	 * Two engines of TP=2 ranks, open loop at 200 requests/s for 0.3 s: each rank runs its
	 * engine's requests (4 pages, loads in batches of 2), load and write-back timed apart.
	 */
	r = run_json("--json --page 64K --procs 2 --threads 2 --tp 2 --prefixes 4 --prefix-pages 2 "
		     "--branches 2 --branch-pages 1 --suffix-pages 1 --qd 2 --warmup 0 --rate 200 "
		     "--seconds 0.3 engine");
	CHECK_EQ(num(r, "engines"), 2);
	CHECK_EQ(num(r, "tp"), 2);
	CHECK_EQ(num(r, "rate"), 200);
	CHECK_GT(num(r, "ops"), 0);
	CHECK_GT(num(r, "dedup"), 0); /* the second rank's write-backs of its engine's pages */
	{
		const cJSON *k = cJSON_GetObjectItem(r, "kinds");

		CHECK(k && cJSON_GetObjectItem(k, "load") && cJSON_GetObjectItem(k, "write_back"));
		CHECK_EQ(num(cJSON_GetObjectItem(k, "load"), "ops"), num(r, "ops"));
	}
	cJSON_Delete(r);

	/*
	 * --layers: Kimi pages (61 layers) loaded through a view in 4 layer groups, 3 view GETs
	 * in flight; the warm-up checks every page loaded carries its key (a group that skipped
	 * a layer fails it), and the time to the first group is reported beside the load.
	 */
	r = run_json("--json --layout kimi --procs 2 --tp 2 --prefixes 2 --prefix-pages 2 "
		     "--branches 1 --branch-pages 1 --suffix-pages 1 --layers 4 --qd 3 --warmup 4 "
		     "--iters 4 engine");
	CHECK_EQ(num(r, "layer_groups"), 4);
	CHECK_GT(num(r, "pages_hit"), 0);
	{
		const cJSON *k = cJSON_GetObjectItem(r, "kinds");
		const cJSON *first = k ? cJSON_GetObjectItem(k, "load_first") : NULL;

		CHECK(first && cJSON_GetObjectItem(k, "load"));
		CHECK_GT(num(first, "ops"), 0);
		CHECK_LE(num(first, "p50_us"), num(cJSON_GetObjectItem(k, "load"), "p50_us"));
	}
	cJSON_Delete(r);
	CHECK_EQ(run("--layers 4 get", &out), 2);
	free(out);

	/* MLA TP=4: one copy through the broker, four with private pools. */
	r = run_json("--json --page 64K --procs 4 --pages 6 mla-tp");
	CHECK_EQ(num(r, "copies"), 6);
	CHECK_EQ(num(r, "dedup_puts"), 18);
	CHECK_EQ(num(r, "pages_held"), 6);
	CHECK_EQ(num(r, "mem_x_one_copy"), 1);
	CHECK(num(r, "load_ms") > 0);
	cJSON_Delete(r);
	r = run_json("--json --page 64K --procs 4 --pages 6 --private mla-tp");
	CHECK_EQ(num(r, "copies"), 24);
	CHECK_EQ(num(r, "mem_x_one_copy"), 4);
	cJSON_Delete(r);
	/*
	 * --qd 4: each rank loads its 6 pages in batches of 4 and 2 (kvb_submit), every page
	 * checked (its marks were wiped after its PUT); "load" is per batch, "get" per page.
	 */
	for (int priv = 0; priv < 2; priv++) {
		const char *a[] = {"--json --page 64K --procs 4 --pages 6 --qd 4 mla-tp",
				   "--json --page 64K --procs 4 --pages 6 --qd 4 --private "
				   "--leave-early mla-tp"};
		const cJSON *k;

		r = run_json(a[priv]);
		k = cJSON_GetObjectItem(r, "kinds");
		CHECK(k && cJSON_GetObjectItem(k, "load") && cJSON_GetObjectItem(k, "get"));
		CHECK_EQ(num(cJSON_GetObjectItem(k, "load"), "ops"), 4 * 2);
		CHECK_EQ(num(cJSON_GetObjectItem(k, "get"), "ops"), 4 * 6);
		CHECK_EQ(num(cJSON_GetObjectItem(k, "put"), "ops"), 4 * 6);
		CHECK_EQ(num(r, "copies"), priv ? 24 : 6);
		CHECK(num(r, "load_ms") > 0);
		cJSON_Delete(r);
	}
	/* --leave-early changes only when ranks disconnect: here, that it runs and loses nothing. */
	r = run_json("--json --page 64K --procs 2 --pages 3 --leave-early mla-tp");
	CHECK_EQ(num(r, "copies"), 3);
	cJSON_Delete(r);

	/* A working set twice the pool: refused, unless misses are what is being measured. */
	CHECK_EQ(run("--page 1M --ws 128M --iters 10 get", &out), 1);
	CHECKF(strstr(out, "does not stay resident") != NULL, "no clear refusal:\n%s", out);
	free(out);
	r = run_json("--json --page 1M --ws 128M --warmup 0 --iters 64 --misses fill get");
	CHECK_GT(num(r, "misses"), 0);
	cJSON_Delete(r);

	CHECK_EQ(run("no-such-mode", &out), 2);
	free(out);
	CHECK(harness_broker_alive(b));
	harness_broker_stop(b);
	return H_PASS;
}
