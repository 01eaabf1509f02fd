// SPDX-License-Identifier: MIT
/*
 * kvbfetch.c - the remote tier's bench client (tools/bench-remote.sh): `kvbfetch put SOCK N
 * [FIRST]` stores N Kimi-K2.5 pages (4.29 MiB, distinct keys FIRST..FIRST+N-1) on one broker;
 * `kvbfetch get SOCK N [FIRST]` GETs each once from another, into a registered buffer, so
 * every GET is a remote fetch, and prints {"gb_per_s", "ops_per_s", "p50_us", "p99_us",
 * "hits"} as JSON. kvbbench cannot do the second half: its GET modes store their working set
 * first. FIRST lets one run repeat the fetch on fresh keys, round after round.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "clock.h"
#include "kvbroker.h"

static int cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
	struct kvb_opts o = {0};
	struct kvb_layout l;
	kvb_client *c = NULL;
	uint32_t ns, buf;
	size_t pb;
	uint8_t *page;
	double *t, t0, total;
	long n, first = 0;
	int put, rc, hits = 0;

	if (argc == 2 && !strcmp(argv[1], "--version")) {
		cli_version("kvbfetch");
		return 0;
	}
	if (argc == 2 && !strcmp(argv[1], "--help")) {
		printf("usage: kvbfetch put|get SOCKET N [FIRST]\n");
		return 0;
	}
	if (argc < 4 || argc > 5 || (strcmp(argv[1], "put") && strcmp(argv[1], "get")) ||
	    (n = strtol(argv[3], NULL, 10)) <= 0 ||
	    (argc == 5 && (first = strtol(argv[4], NULL, 10)) < 0))
		return cli_usage_error("kvbfetch", "usage: kvbfetch put|get SOCKET N [FIRST]");
	put = !strcmp(argv[1], "put");
	o.socket_path = argv[2];
	o.name = "kvbfetch";
	memset(&l, 0, sizeof(l));
	snprintf(l.model, sizeof(l.model), "kimi-k2.5-remote-bench");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = 64;
	l.tp_size = 1;
	l.ncomponents = 1;
	snprintf(l.comp[0].name, sizeof(l.comp[0].name), "kv");
	l.comp[0].num_layers = 61;
	l.comp[0].bytes_per_token_layer = 1152;
	rc = kvb_connect(&o, &c);
	if (rc) {
		char msg[1024];

		fprintf(stderr, "kvbfetch: %s\n", kvb_connect_error(rc, argv[2], msg, sizeof(msg)));
		return 1;
	}
	rc = kvb_ns_open(c, &l, &ns, &pb);
	if (rc) {
		fprintf(stderr, "kvbfetch: %s: %s\n", argv[2], kvb_strerror(rc));
		return 1;
	}
	page = kvb_buf_alloc_host(c, pb, &buf);
	t = calloc((size_t)n, sizeof(*t));
	if (!page || !t)
		return 1;
	total = clock_now();
	for (long i = first; i < first + n; i++) {
		kvb_key k;

		memset(&k, 0, sizeof(k));
		memcpy(k.b, &i, sizeof(i));
		k.b[31] = 0x5a;
		if (put)
			memset(page, (int)(i * 7 + 1), pb);
		t0 = clock_now();
		rc = put ? kvb_put(c, ns, k, page, pb) : kvb_get(c, ns, k, page, pb);
		t[i - first] = (clock_now() - t0) * 1e6;
		if (rc < 0 && rc != -ENOENT) {
			fprintf(stderr, "kvbfetch: %s %ld: %s\n", argv[1], i, kvb_strerror(rc));
			return 1;
		}
		if (!put && rc == (int)pb) {
			if (page[0] != (uint8_t)(i * 7 + 1) || page[pb - 1] != page[0]) {
				fprintf(stderr, "kvbfetch: page %ld: wrong bytes\n", i);
				return 1;
			}
			hits++;
		}
	}
	total = clock_now() - total;
	qsort(t, (size_t)n, sizeof(*t), cmp);
	printf("{\"gb_per_s\":%.3f,\"ops_per_s\":%.1f,\"p50_us\":%.1f,\"p99_us\":%.1f,\"hits\":%d}"
	       "\n",
	       (double)pb * (double)n / total / 1e9, (double)n / total, t[n / 2],
	       t[(n * 99) / 100 < n ? (n * 99) / 100 : n - 1], put ? (int)n : hits);
	free(t);
	kvb_close(c);
	return 0;
}
