// SPDX-License-Identifier: MIT
/*
 * kvbdemo - two simulated inference engines sharing one kvbrokerd, for `make demo`.
 *
 * Engine A serves model "kimi-k2.5-demo" (MLA) at TP=4, engine B the same model at TP=2; each
 * TP rank is its own process with its own connection, as in a real engine. Every request's
 * prompt is a shared system prompt (SYS_PAGES pages) followed by request-specific tokens. For each
 * request every rank does what an engine with a host KV tier does: kvb_lookup() the key chain of
 * the prompt (the stored prefix need not be recomputed), then kvb_put() the pages it computed.
 * MLA latent KV is identical on every rank, so all ranks of both engines resolve to one
 * namespace: the first PUT of a page stores it, the others complete as dedup hits, and engine B
 * finds the system prompt engine A stored. Engine B's last request repeats engine A's first
 * prompt and so finds its whole prefix.
 *
 * Ranks of one engine move in lock step through a process-shared barrier (lookup, barrier, put,
 * barrier), so the numbers printed are the same on every run: every rank looks up before any
 * rank of its engine stores that request's pages. Page bytes are derived from the key, so the
 * final check (kvb_get through both copy paths, and kvb_acquire) can verify them exactly.
 *
 * The layout is smaller than the real Kimi-K2.5 page (61 x 1152 B x 64 tokens = 4.3 MiB) so the
 * demo is quick; the output says so. Exit status: 0 when everything checked out, 1 otherwise.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvbroker.h"

#define MODEL "kimi-k2.5-demo"
#define LAYERS 61
#define BYTES_PER_TOKEN_LAYER 576
#define TOKENS_PER_PAGE 16
#define SYS_PAGES 8 /* the shared system prompt */
#define REQ_PAGES 4 /* request-specific pages after it */
#define NPAGES (SYS_PAGES + REQ_PAGES)
#define NREQ 3 /* requests per engine */
#define MAX_TP 4
#define TIMEOUT_S 60

struct engine {
	const char *name;
	int tp;
	int prompt[NREQ]; /* prompt id of each request; equal ids are equal prompts */
};

/* Engine B's third request is engine A's first prompt again (a popular question). */
static const struct engine engines[2] = {
	{"A", 4, {1, 2, 3}},
	{"B", 2, {4, 5, 1}},
};
#define DISTINCT_PROMPTS 5

struct req_res {
	uint32_t hits;	 /* leading pages found by kvb_lookup */
	uint32_t puts;	 /* pages this rank computed and PUT */
	uint32_t stored; /* PUT returned 0 */
	uint32_t dedup;	 /* PUT returned 1: another rank or engine had stored it */
};

struct rank_res {
	int rc;
	char err[160];
	uint32_t ns;
	uint64_t page_bytes;
	struct req_res req[NREQ];
};

struct shared {
	pthread_barrier_t barrier;
	struct rank_res rank[MAX_TP];
};

static const char *sock;

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static void layout(struct kvb_layout *l, int tp, int rank)
{
	memset(l, 0, sizeof(*l));
	snprintf(l->model, sizeof(l->model), "%s", MODEL);
	l->kind = KVB_LAYOUT_MLA;
	l->tokens_per_page = TOKENS_PER_PAGE;
	l->tp_size = (uint32_t)tp;
	l->tp_rank = (uint32_t)rank;
	l->ncomponents = 1;
	snprintf(l->comp[0].name, sizeof(l->comp[0].name), "kv");
	l->comp[0].num_layers = LAYERS;
	l->comp[0].bytes_per_token_layer = BYTES_PER_TOKEN_LAYER;
}

/* The prompt's token ids: the system prompt, then tokens that depend on the prompt id. */
static void prompt_tokens(int prompt, uint32_t *tok)
{
	int i;

	for (i = 0; i < SYS_PAGES * TOKENS_PER_PAGE; i++)
		tok[i] = (uint32_t)(mix64(0x5359535445ull + (uint64_t)i) % 150000);
	for (; i < NPAGES * TOKENS_PER_PAGE; i++)
		tok[i] = (uint32_t)(mix64(((uint64_t)prompt << 32) + (uint64_t)i) % 150000);
}

static void prompt_keys(int prompt, kvb_key *keys)
{
	uint32_t tok[NPAGES * TOKENS_PER_PAGE];
	int p;

	prompt_tokens(prompt, tok);
	for (p = 0; p < NPAGES; p++)
		keys[p] = kvb_key_chain(p ? &keys[p - 1] : NULL, tok + p * TOKENS_PER_PAGE,
					TOKENS_PER_PAGE);
}

/* "Computed" KV: bytes that follow from the key alone, so any reader can check them. */
static void page_bytes_for(const kvb_key *k, uint8_t *p, size_t len)
{
	uint64_t x, w;
	size_t i;

	memcpy(&x, k->b, 8);
	for (i = 0; i + 8 <= len; i += 8) {
		x = x * 6364136223846793005ull + 1442695040888963407ull;
		w = x ^ (x >> 29);
		memcpy(p + i, &w, 8);
	}
	for (; i < len; i++)
		p[i] = (uint8_t)(x >> (i % 8));
}

static int rank_connect(const char *name, int tp, int rank, kvb_client **c, uint32_t *ns,
			size_t *pb)
{
	struct kvb_layout l;
	struct kvb_opts o;
	int rc;

	memset(&o, 0, sizeof(o));
	o.socket_path = sock;
	o.name = name;
	rc = kvb_connect(&o, c);
	if (rc < 0)
		return rc;
	layout(&l, tp, rank);
	rc = kvb_ns_open(*c, &l, ns, pb);
	if (rc < 0) {
		kvb_close(*c);
		*c = NULL;
	}
	return rc;
}

/* One TP rank of one engine: serve every request of the engine. Never returns. */
static void rank_main(const struct engine *e, int rank, struct shared *sh)
{
	struct rank_res *res = &sh->rank[rank];
	kvb_key keys[NPAGES];
	kvb_client *c = NULL;
	uint8_t *page = NULL;
	char name[32];
	size_t pb = 0, hits;
	uint32_t buf;
	int q, p, rc;

	snprintf(name, sizeof(name), "engine%s-tp%d", e->name, rank);
	rc = rank_connect(name, e->tp, rank, &c, &res->ns, &pb);
	if (rc < 0) {
		snprintf(res->err, sizeof(res->err), "connect/ns_open: %s", kvb_strerror(rc));
		goto out;
	}
	res->page_bytes = pb;
	/* A registered buffer: the broker copies the page straight out of it. */
	page = kvb_buf_alloc_host(c, pb, &buf);
	if (!page) {
		rc = -ENOMEM;
		snprintf(res->err, sizeof(res->err), "kvb_buf_alloc_host(%zu) failed", pb);
		goto out;
	}
	for (q = 0; q < NREQ; q++) {
		struct req_res *r = &res->req[q];

		prompt_keys(e->prompt[q], keys);
		pthread_barrier_wait(&sh->barrier);
		rc = kvb_lookup(c, res->ns, keys, NPAGES, &hits);
		if (rc < 0) {
			snprintf(res->err, sizeof(res->err), "request %d: lookup: %s", q + 1,
				 kvb_strerror(rc));
			goto out;
		}
		r->hits = (uint32_t)hits;
		pthread_barrier_wait(&sh->barrier);
		/* Prefill computes the pages after the stored prefix and offers them. */
		for (p = (int)hits; p < NPAGES; p++) {
			page_bytes_for(&keys[p], page, pb);
			rc = kvb_put(c, res->ns, keys[p], page, pb);
			if (rc < 0) {
				snprintf(res->err, sizeof(res->err), "request %d: put page %d: %s",
					 q + 1, p, kvb_strerror(rc));
				goto out;
			}
			r->puts++;
			r->stored += rc == 0;
			r->dedup += rc == 1;
		}
	}
	rc = 0;
out:
	res->rc = rc < 0 ? rc : 0;
	kvb_close(c);
	_exit(rc < 0 ? 1 : 0);
}

/*
 * Runs one engine's ranks to completion. 0, or -1 when a rank failed or hung. A rank that dies
 * leaves its peers waiting at the barrier, so the first failure (or the deadline) kills the rest.
 */
static int run_engine(const struct engine *e, struct shared *sh)
{
	pthread_barrierattr_t ba;
	pid_t pids[MAX_TP];
	time_t deadline = time(NULL) + TIMEOUT_S;
	int i, n, st, left, bad = 0;

	memset(sh, 0, sizeof(*sh));
	pthread_barrierattr_init(&ba);
	pthread_barrierattr_setpshared(&ba, PTHREAD_PROCESS_SHARED);
	pthread_barrier_init(&sh->barrier, &ba, (unsigned)e->tp);
	pthread_barrierattr_destroy(&ba);
	fflush(NULL);
	for (n = 0; n < e->tp; n++) {
		pids[n] = fork();
		if (pids[n] < 0) {
			perror("kvbdemo: fork");
			bad = 1;
			break;
		}
		if (pids[n] == 0)
			rank_main(e, n, sh);
	}
	for (left = n; left > 0; usleep(1000)) {
		if (bad || time(NULL) > deadline) {
			for (i = 0; i < n; i++)
				if (pids[i] > 0)
					kill(pids[i], SIGKILL);
			if (!bad)
				printf("  FAIL: engine %s timed out after %d s\n", e->name,
				       TIMEOUT_S);
			bad = 1;
		}
		for (i = 0; i < n; i++) {
			if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i])
				continue;
			pids[i] = 0;
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st))
				bad = 1;
		}
	}
	pthread_barrier_destroy(&sh->barrier);
	return bad ? -1 : 0;
}

/* Prints what one engine did; checks its ranks agree. Returns the pages it stored. */
static int report_engine(const struct engine *e, const struct shared *sh, uint32_t *ns_out,
			 int *fail)
{
	int q, r, total_stored = 0, total_dedup = 0, total_hits = 0;

	for (r = 0; r < e->tp; r++)
		if (sh->rank[r].rc || sh->rank[r].err[0])
			printf("  rank %d failed: %s\n", r, sh->rank[r].err);
	printf("engine %s: %s, MLA, TP=%d (%d rank processes), namespace %u\n", e->name, MODEL,
	       e->tp, e->tp, sh->rank[0].ns);
	for (r = 1; r < e->tp; r++) {
		if (sh->rank[r].ns != sh->rank[0].ns) {
			printf("  FAIL: rank %d opened namespace %u, rank 0 namespace %u\n", r,
			       sh->rank[r].ns, sh->rank[0].ns);
			*fail = 1;
		}
	}
	*ns_out = sh->rank[0].ns;
	for (q = 0; q < NREQ; q++) {
		int stored = 0, dedup = 0, hits = (int)sh->rank[0].req[q].hits;
		const char *why = "";

		for (r = 0; r < e->tp; r++) {
			stored += (int)sh->rank[r].req[q].stored;
			dedup += (int)sh->rank[r].req[q].dedup;
			if ((int)sh->rank[r].req[q].hits != hits)
				printf("  note: rank %d found %u prefix pages, rank 0 %d\n", r,
				       sh->rank[r].req[q].hits, hits);
		}
		if (hits == NPAGES)
			why = "  (whole prompt found: nothing to compute)";
		else if (hits >= SYS_PAGES && !strcmp(e->name, "B") && q == 0)
			why = "  (engine A's system prompt)";
		else if (hits >= SYS_PAGES)
			why = "  (system prompt)";
		printf("  request %s%d: prefix hits %2d/%d  stored %2d  dedup hits %2d%s\n",
		       e->name, q + 1, hits, NPAGES, stored, dedup, why);
		if (stored != NPAGES - hits) {
			printf("  FAIL: %d new pages, but %d stored (one copy expected)\n",
			       NPAGES - hits, stored);
			*fail = 1;
		}
		total_stored += stored;
		total_dedup += dedup;
		total_hits += hits;
	}
	printf("  engine %s total: %d pages stored, %d dedup hits, %d prefix-hit pages\n\n",
	       e->name, total_stored, total_dedup, total_hits);
	if (!strcmp(e->name, "B") && sh->rank[0].req[0].hits < SYS_PAGES) {
		printf("  FAIL: engine B did not find engine A's %d system-prompt pages\n",
		       SYS_PAGES);
		*fail = 1;
	}
	return total_stored;
}

/*
 * Reads back a few pages through every read path and compares them byte for byte.
 * Returns the number of mismatches or failed reads.
 */
static int verify(kvb_client *c, uint32_t ns, size_t pb)
{
	/* (prompt, page): both ends of the system prompt and pages of every request. */
	static const int check[][2] = {
		{1, 0},		 {1, SYS_PAGES - 1}, {1, NPAGES - 1},
		{2, NPAGES - 1}, {4, SYS_PAGES},     {5, NPAGES - 1},
	};
	uint8_t *want = malloc(pb), *got = malloc(pb), *reg;
	struct kvb_lease lease;
	kvb_key keys[NPAGES], absent;
	uint32_t buf, tok = 7;
	size_t i;
	int bad = 0, rc, n = 0;

	reg = kvb_buf_alloc_host(c, pb, &buf);
	if (!want || !got || !reg) {
		printf("  FAIL: cannot allocate verification buffers\n");
		free(want);
		free(got);
		return 1;
	}
	for (i = 0; i < sizeof(check) / sizeof(check[0]); i++) {
		prompt_keys(check[i][0], keys);
		page_bytes_for(&keys[check[i][1]], want, pb);

		/* 1: into malloc'd memory (the library copies under a lease) */
		memset(got, 0, pb);
		rc = kvb_get(c, ns, keys[check[i][1]], got, pb);
		bad += rc != (int)pb || memcmp(got, want, pb);
		/* 2: into a registered buffer (the broker copies) */
		memset(reg, 0, pb);
		rc = kvb_get(c, ns, keys[check[i][1]], reg, pb);
		bad += rc != (int)pb || memcmp(reg, want, pb);
		/* 3: zero-copy, straight from the read-only pool mapping */
		rc = kvb_acquire(c, ns, keys[check[i][1]], &lease);
		if (rc < 0 || lease.len != pb || memcmp(lease.data, want, pb))
			bad++;
		if (rc >= 0 && kvb_release(c, &lease) < 0)
			bad++;
		n += 3;
		if (bad) {
			printf("  FAIL: page %d of prompt %d does not read back intact\n",
			       check[i][1], check[i][0]);
			break;
		}
	}
	absent = kvb_key_chain(NULL, &tok, 1);
	rc = kvb_get(c, ns, absent, got, pb);
	if (rc != -ENOENT) {
		printf("  FAIL: GET of a key never stored returned %d, not -ENOENT\n", rc);
		bad++;
	}
	if (!bad)
		printf("verify: %zu pages read back byte-exact %d times each (GET into malloc'd\n"
		       "  memory, GET into registered memory, ACQUIRE); an absent key: -ENOENT\n",
		       sizeof(check) / sizeof(check[0]),
		       n / (int)(sizeof(check) / sizeof(check[0])));
	kvb_buf_unregister(c, buf);
	free(want);
	free(got);
	return bad;
}

static double jnum(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* Pool occupancy from the broker's stats; checks the namespace holds one copy per page. */
static int report_pool(kvb_client *c, uint32_t ns, size_t pb, int unique, int private_pages)
{
	const cJSON *pool, *nss, *it, *mine = NULL;
	char *text = NULL;
	cJSON *root;
	double used, total, pages;
	int rc, bad = 0;

	rc = kvb_stats_json(c, &text);
	if (rc < 0) {
		printf("  FAIL: kvb_stats_json: %s\n", kvb_strerror(rc));
		return 1;
	}
	root = cJSON_Parse(text);
	free(text);
	pool = cJSON_GetObjectItemCaseSensitive(root, "pool");
	nss = cJSON_GetObjectItemCaseSensitive(root, "namespaces");
	cJSON_ArrayForEach(it, nss)
	{
		if (jnum(it, "id") == ns)
			mine = it;
	}
	if (!pool || !mine) {
		printf("  FAIL: stats lack the pool or namespace %u\n", ns);
		cJSON_Delete(root);
		return 1;
	}
	used = jnum(pool, "bytes_used");
	total = jnum(pool, "bytes_total");
	pages = jnum(mine, "pages");
	printf("pool: %.1f MiB used of %.1f MiB (%.1f%%), %.0f pages in all;\n"
	       "  namespace %u (%s) holds %.0f pages, %.1f MiB\n",
	       used / 1048576, total / 1048576, total > 0 ? 100 * used / total : 0,
	       jnum(pool, "pages"), ns, MODEL, pages, jnum(mine, "bytes") / 1048576);
	printf("sharing: %d distinct pages, held once; private per-rank pools would hold %d\n"
	       "  (%.1f MiB), %.1fx as much\n",
	       unique, private_pages, (double)private_pages * (double)pb / 1048576,
	       (double)private_pages / unique);
	if (pages != unique) {
		printf("  FAIL: the namespace holds %.0f pages, %d expected (one copy each)\n",
		       pages, unique);
		bad = 1;
	}
	cJSON_Delete(root);
	return bad;
}

static void usage(FILE *f)
{
	fprintf(f, "usage: kvbdemo [--socket PATH] [--version]\n"
		   "\n"
		   "Two simulated engines (MLA TP=4 and TP=2 of one model) share a system prompt\n"
		   "through a running kvbrokerd; prints pages stored, dedup and prefix hits, pool\n"
		   "occupancy, and verifies pages byte for byte. Exit 0 when all checks pass.\n");
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	struct shared *sh;
	kvb_client *c = NULL;
	uint32_t ns[2] = {0, 0}, vns = 0;
	size_t pb = 0;
	int opt, i, rc, fail = 0, private_pages = 0;

	while ((opt = cli_getopt(argc, argv, "s:h", lopts, "kvbdemo")) != -1) {
		switch (opt) {
		case 's':
			sock = optarg;
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			cli_version("kvbdemo");
			return 0;
		default: /* cli_getopt() said what */
			return CLI_USAGE;
		}
	}
	if (optind != argc)
		return cli_usage_error("kvbdemo", "unexpected argument '%s'", argv[optind]);

	/*
	 * Connect first: a missing broker is one clear line, not six failing ranks. Closed again
	 * before the ranks fork, so no child inherits a connection it must not use.
	 */
	rc = rank_connect("kvbdemo", 1, 0, &c, &vns, &pb);
	if (rc < 0) {
		char msg[1024];

		fprintf(stderr, "kvbdemo: %s\n", kvb_connect_error(rc, sock, msg, sizeof(msg)));
		return 1;
	}
	kvb_close(c);
	c = NULL;
	printf("kvbdemo: model %s, MLA, page = %d tokens x %d layers x %d B = %zu B (%.0f KiB)\n",
	       MODEL, TOKENS_PER_PAGE, LAYERS, BYTES_PER_TOKEN_LAYER, pb, pb / 1024.0);
	printf("  (the real Kimi-K2.5 page is 64 tokens x 61 layers x 1152 B = 4.3 MiB; smaller\n"
	       "  here so the demo is quick)\n");
	printf("every prompt: system prompt (%d pages) + %d request-specific pages. Each rank\n"
	       "looks up the prompt's key chain, then PUTs the pages after the stored prefix.\n"
	       "  prefix hits: leading pages kvb_lookup found stored (no need to recompute)\n"
	       "  stored:      PUTs that stored a page (one copy per page, whatever the rank)\n"
	       "  dedup hits:  PUTs of a page another rank or engine had stored (no copy)\n\n",
	       SYS_PAGES, REQ_PAGES);

	sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (sh == MAP_FAILED) {
		perror("kvbdemo: mmap");
		return 1;
	}
	for (i = 0; i < 2; i++) {
		const struct engine *e = &engines[i];

		if (run_engine(e, sh) < 0)
			fail = 1;
		report_engine(e, sh, &ns[i], &fail);
		/* A private pool per rank would hold the system prompt plus every own prompt. */
		private_pages += e->tp * (SYS_PAGES + NREQ * REQ_PAGES);
		if (fail)
			break;
	}
	if (!fail && ns[0] != ns[1]) {
		printf("  FAIL: engines opened namespaces %u and %u (one shared MLA namespace "
		       "expected)\n",
		       ns[0], ns[1]);
		fail = 1;
	}
	if (!fail) {
		size_t pb2 = 0;

		rc = rank_connect("kvbdemo-verify", 1, 0, &c, &vns, &pb2);
		if (rc < 0 || pb2 != pb || vns != ns[0]) {
			printf("  FAIL: reconnect for verification: %s (ns %u, page %zu B)\n",
			       kvb_strerror(rc), vns, pb2);
			kvb_close(c);
			return 1;
		}
		fail |= verify(c, vns, pb) != 0;
		fail |= report_pool(c, vns, pb, SYS_PAGES + DISTINCT_PROMPTS * REQ_PAGES,
				    private_pages) != 0;
	}
	kvb_close(c);
	printf("kvbdemo: %s\n", fail ? "FAILED" : "ok");
	return fail ? 1 : 0;
}
