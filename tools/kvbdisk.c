// SPDX-License-Identifier: MIT
/*
 * kvbdisk.c - the NVMe tier's load generator for tools/bench-disk.sh: what kvbbench's
 * synchronous ops cannot do, keep a fixed number of promotions in flight.
 *
 *   kvbdisk [--socket PATH] --page SIZE --pages N fill
 *       PUTs pages 0..N-1 (one process, one op at a time) and prints the PUT rate of the pages
 *       after the first 1.25 x pool (by then every PUT waits for a demotion: the demotion rate).
 *   kvbdisk [--socket PATH] --page SIZE --pages N --qd Q [--seconds S] prefetch
 *       keeps Q PREFETCHes in flight over a random permutation of pages 0..N-1 and prints the
 *       promotion rate: disk.read_bytes over the elapsed time.
 *
 * Output: one JSON object. Keys are (seed, i) in the first 16 bytes, so a second run (after a
 * broker restart) names the same pages.
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "clock.h"
#include "size.h"
#include "kvbroker.h"

#define KVBDISK_USAGE                                                                              \
	"usage: kvbdisk [--socket P] --page SIZE (a multiple of 64) --pages N [--qd 1..255] "      \
	"[--seconds S] fill|prefetch"

static kvb_key key_of(uint64_t i)
{
	kvb_key k;
	uint64_t seed = 0x6b76626469736bull; /* "kvbdisk" */

	memset(&k, 0, sizeof(k));
	memcpy(k.b, &i, sizeof(i));
	memcpy(k.b + 8, &seed, sizeof(seed));
	return k;
}

/* A number out of the stats JSON: "name":value inside the object "obj". */
static double stat_of(kvb_client *c, const char *obj, const char *name)
{
	char *js = NULL, pat[64];
	const char *p;
	double v = -1;

	if (kvb_stats_json(c, &js))
		return -1;
	snprintf(pat, sizeof(pat), "\"%s\":{", obj);
	p = strstr(js, pat);
	snprintf(pat, sizeof(pat), "\"%s\":", name);
	p = p ? strstr(p, pat) : NULL;
	if (p)
		v = strtod(p + strlen(pat), NULL);
	free(js);
	return v;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{"socket", required_argument, NULL, 's'},  {"page", required_argument, NULL, 'p'},
		{"pages", required_argument, NULL, 'n'},   {"qd", required_argument, NULL, 'q'},
		{"seconds", required_argument, NULL, 'S'}, {"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},	   {NULL, 0, NULL, 0}};
	struct kvb_opts co = {.name = "kvbdisk"};
	struct kvb_layout l = {.model = "kvbdisk",
			       .kind = KVB_LAYOUT_MLA,
			       .tokens_per_page = 64,
			       .tp_size = 1,
			       .ncomponents = 1};
	uint64_t page = 1 << 20, n = 1024, qd = 8;
	double secs = 5;
	const char *mode;
	kvb_client *c;
	uint32_t ns, buf;
	size_t pb;
	uint8_t *mem;
	int o, rc;

	while ((o = cli_getopt(argc, argv, "", opts, "kvbdisk")) != -1) {
		switch (o) {
		case 's':
			co.socket_path = optarg;
			break;
		case 'p':
			if (size_parse(optarg, &page) || !page)
				return cli_usage_error("kvbdisk", "bad size '%s' for --page",
						       optarg);
			break;
		case 'n':
			n = strtoull(optarg, NULL, 10);
			break;
		case 'q':
			qd = strtoull(optarg, NULL, 10);
			break;
		case 'S':
			secs = strtod(optarg, NULL);
			break;
		case 'h':
			printf("%s\n", KVBDISK_USAGE);
			return 0;
		case 'V':
			cli_version("kvbdisk");
			return 0;
		default: /* cli_getopt() said what */
			return CLI_USAGE;
		}
	}
	if (optind != argc - 1 || page % 64 || !n || !qd || qd > 255)
		return cli_usage_error("kvbdisk", "%s", KVBDISK_USAGE);
	mode = argv[optind];
	snprintf(l.comp[0].name, sizeof(l.comp[0].name), "kv");
	l.comp[0].num_layers = 1;
	l.comp[0].bytes_per_token_layer = (uint32_t)(page / 64);
	rc = kvb_connect(&co, &c);
	if (rc) {
		char msg[1024];

		fprintf(stderr, "kvbdisk: %s\n",
			kvb_connect_error(rc, co.socket_path, msg, sizeof(msg)));
		return 1;
	}
	rc = kvb_ns_open(c, &l, &ns, &pb);
	if (rc) {
		fprintf(stderr, "kvbdisk: %s\n", kvb_strerror(rc));
		return 1;
	}
	if (!strcmp(mode, "fill")) {
		double pool = stat_of(c, "pool", "bytes_total"), t0 = 0, t1;
		uint64_t from = (uint64_t)(1.25 * pool / (double)pb);

		mem = kvb_buf_alloc_host(c, pb, &buf);
		if (!mem || from >= n) {
			fprintf(stderr, "kvbdisk: no buffer, or --pages not above 1.25 x pool\n");
			return 1;
		}
		for (uint64_t i = 0; i < n; i++) {
			memset(mem, (int)i, 4096); /* distinct content, cheap */
			if (i == from)
				t0 = clock_now();
			rc = kvb_put(c, ns, key_of(i), mem, pb);
			if (rc < 0) {
				fprintf(stderr, "kvbdisk: put %llu: %s\n", (unsigned long long)i,
					kvb_strerror(rc));
				return 1;
			}
		}
		t1 = clock_now();
		printf("{\"mode\":\"fill\",\"page\":%zu,\"pages\":%llu,\"timed_pages\":%llu,"
		       "\"seconds\":%.3f,\"mb_per_s\":%.1f}\n",
		       pb, (unsigned long long)n, (unsigned long long)(n - from), t1 - t0,
		       (double)(n - from) * (double)pb / (t1 - t0) / 1e6);
	} else if (!strcmp(mode, "prefetch")) {
		uint64_t *perm = malloc(n * sizeof(*perm)), next = 0, inflight = 0, done = 0;
		struct kvb_completion cq[256];
		double rb0 = stat_of(c, "disk", "read_bytes"), t0 = clock_now(), t1, rb1;

		if (!perm)
			return 1;
		srand(12345);
		for (uint64_t i = 0; i < n; i++)
			perm[i] = i;
		for (uint64_t i = n - 1; i > 0; i--) {
			uint64_t j = (uint64_t)rand() % (i + 1), x = perm[i];

			perm[i] = perm[j];
			perm[j] = x;
		}
		while (inflight || (next < n && clock_now() - t0 < secs)) {
			struct kvb_op ops[256];
			uint32_t k = 0;

			while (inflight + k < qd && next < n && clock_now() - t0 < secs) {
				memset(&ops[k], 0, sizeof(ops[k]));
				ops[k].opcode = KVB_OP_PREFETCH;
				ops[k].ns = ns;
				ops[k].key = key_of(perm[next++]);
				k++;
			}
			if (k) {
				rc = kvb_submit(c, ops, k);
				if (rc < 0) {
					fprintf(stderr, "kvbdisk: submit: %s\n", kvb_strerror(rc));
					return 1;
				}
				next -= k - (uint32_t)rc;
				inflight += (uint64_t)rc;
			}
			rc = kvb_reap(c, cq, 256, 1, 10000);
			if (rc < 0) {
				fprintf(stderr, "kvbdisk: reap: %s\n", kvb_strerror(rc));
				return 1;
			}
			inflight -= (uint64_t)rc;
			done += (uint64_t)rc;
		}
		t1 = clock_now();
		rb1 = stat_of(c, "disk", "read_bytes");
		printf("{\"mode\":\"prefetch\",\"page\":%zu,\"qd\":%llu,\"prefetches\":%llu,"
		       "\"seconds\":%.3f,\"read_bytes\":%.0f,\"mb_per_s\":%.1f}\n",
		       pb, (unsigned long long)qd, (unsigned long long)done, t1 - t0, rb1 - rb0,
		       (rb1 - rb0) / (t1 - t0) / 1e6);
		free(perm);
	} else {
		fprintf(stderr, "kvbdisk: unknown mode '%s'\n", mode);
		return 2;
	}
	kvb_close(c);
	return 0;
}
