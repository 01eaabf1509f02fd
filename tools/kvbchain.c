// SPDX-License-Identifier: MIT
/*
 * kvbchain.c - prefix-lookup hit rate of a Zipf workload of shared prefixes larger than the
 * pool, with parent keys on PUT (chains evicted tail first) against plain LRU (the
 * same PUTs without parents), in one run, same seed, same broker, one after the other.
 *
 * The workload: G system prompts of S pages each; P prompts, prompt p continuing system prompt
 * p % G with O pages of its own, so a chain of S + O pages (real SHA-256 chain keys,
 * kvb_key_chain). E engine instances share the broker as their L3, each with its own cache
 * (GPU and host memory) of the chains of its last K prompts. A request picks a prompt by
 * Zipf(s) over P and an engine at random; the engine matches what it holds itself (the whole
 * chain: the broker is not asked; another prompt of the same system prompt: the shared S
 * pages), LOOKUPs the rest of the chain in the broker, GETs the leading hits and PUTs what
 * is still missing, in order, one batch (write-through: kvb_submit_parents, each PUT naming
 * the page before it, or kvb_submit without). Every --restart-every requests one engine
 * starts afresh with an empty cache (a restart, a new instance), and its requests need chains
 * from their heads. This is the pattern that hurts plain LRU in an L3 (SGLang's complaint):
 * the hot shared prefixes are served from the engines' own caches, so the broker never sees
 * them read, they look cold, LRU evicts them first and strands every branch stored under
 * them, exactly when a fresh engine needs them. The hit rate is the leading hits over the
 * pages asked of the broker: the share of tokens it served contiguously from the first page
 * asked. Requests of the first fifth only warm the pool up and are not counted.
 *
 * Stranding: a page stored while a page before it in its chain is not is dead weight (a
 * prefix lookup never reaches it). Every --check-every requests, and for every prompt at the
 * end, the whole chain is looked up (kvb_lookup_tiers) and such pages counted. With parents
 * there must be none: --assert exits 1 when there is any, or when the hit rate with parents
 * is below plain LRU's.
 *
 * Between the two runs every page of the first is deleted, so each starts from an empty pool.
 * Output: one JSON object (default) or a markdown table (--md).
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli.h"
#include "clock.h"
#include "kvbroker.h"

struct cfg {
	const char *socket;
	uint32_t prompts, groups, shared, own, requests, tpp, check_every;
	uint32_t engines, local; /* engine instances; prompts each holds in its own cache */
	uint32_t restart_every;	 /* requests between two engine restarts (0: never) */
	uint64_t page_bytes;
	double zipf;
	uint64_t seed;
	int md, assert_ok;
};

struct result {
	uint64_t lead, asked;	    /* counted requests: leading hits, pages asked */
	uint64_t stranded_seen;	    /* stranded pages found by the periodic checks */
	uint64_t stranded_end;	    /* stranded pages of all prompts at the end */
	uint64_t stored_end;	    /* pages of the workload stored at the end */
	uint64_t puts, put_existed; /* PUT completions: stored, already stored */
	double secs;
};

static uint64_t rng_state;

static uint64_t rng(void)
{
	uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return z ^ (z >> 31);
}

static void die(const char *what, int err)
{
	fprintf(stderr, "kvbchain: %s: %s\n", what, kvb_strerror(err));
	exit(2);
}

/* Keys of every prompt's chain: keys[p * len + j]. */
static kvb_key *chain_keys(const struct cfg *c)
{
	uint32_t len = c->shared + c->own;
	kvb_key *keys = calloc((size_t)c->prompts * len, sizeof(*keys));
	kvb_key *sys = calloc((size_t)c->groups * c->shared + 1, sizeof(*sys));
	uint32_t *tok = calloc(c->tpp, sizeof(*tok));

	if (!keys || !sys || !tok)
		die("keys", -ENOMEM);
	for (uint32_t g = 0; g < c->groups; g++)
		for (uint32_t j = 0; j < c->shared; j++) {
			for (uint32_t t = 0; t < c->tpp; t++)
				tok[t] = (uint32_t)(c->seed * 7919 + g * 131 + j * 17 + t);
			sys[g * c->shared + j] = kvb_key_chain(
				j ? &sys[g * c->shared + j - 1] : NULL, tok, c->tpp);
		}
	for (uint32_t p = 0; p < c->prompts; p++) {
		kvb_key *k = &keys[(size_t)p * len];

		for (uint32_t j = 0; j < c->shared; j++)
			k[j] = sys[(p % c->groups) * c->shared + j];
		for (uint32_t j = c->shared; j < len; j++) {
			for (uint32_t t = 0; t < c->tpp; t++)
				tok[t] = (uint32_t)(1000003u * (p + 1) + j * 31 + t + c->seed);
			k[j] = kvb_key_chain(j ? &k[j - 1] : NULL, tok, c->tpp);
		}
	}
	free(sys);
	free(tok);
	return keys;
}

/* Pages of chain k (len) stored after its first missing one. */
static uint64_t stranded(kvb_client *cl, uint32_t ns, const kvb_key *k, uint32_t len, uint32_t from,
			 uint8_t *tiers, uint64_t *stored)
{
	uint64_t n = 0;
	size_t hits;
	int gone = 0, err = kvb_lookup_tiers(cl, ns, k, len, &hits, tiers);

	if (err)
		die("lookup", err);
	for (uint32_t j = 0; j < len; j++) {
		if (tiers[j] == KVB_TIER_NONE)
			gone = 1;
		else {
			n += gone;
			if (stored && j >= from)
				(*stored)++;
		}
	}
	return n;
}

/*
 * The engine's own cache (GPU and host memory) holds the chains of its n most recent prompts
 * (lru[0] the newest): the pages of prompt p it matches locally, L all of them, the shared
 * prefix when it holds another prompt of p's system prompt, else none. Then p is the newest.
 */
static uint32_t local_match(const struct cfg *c, uint32_t *lru, uint32_t p)
{
	uint32_t n = c->local, i = 0, m = 0;

	while (i < n && lru[i] != p) {
		if (lru[i] != UINT32_MAX && lru[i] % c->groups == p % c->groups)
			m = c->shared;
		i++;
	}
	if (i < n)
		m = c->shared + c->own;
	else
		i = n - 1;
	memmove(&lru[1], &lru[0], i * sizeof(*lru));
	lru[0] = p;
	return m;
}

static void run(const struct cfg *c, kvb_client *cl, int parents, const double *cdf,
		const kvb_key *keys, struct result *r)
{
	uint32_t len = c->shared + c->own, warm = c->requests / 5, ns, buf;
	struct kvb_layout l;
	struct kvb_op *ops = calloc(len, sizeof(*ops));
	kvb_key *par = calloc(len, sizeof(*par));
	uint8_t *tiers = malloc(len), *mem;
	struct kvb_completion *done = calloc(len, sizeof(*done));
	uint32_t *gpu = malloc((size_t)c->engines * c->local * sizeof(*gpu) + 1);
	size_t pb;
	double t0 = clock_now();
	int err;

	if (!ops || !par || !tiers || !done || !gpu)
		die("memory", -ENOMEM);
	for (uint32_t i = 0; i < c->engines * c->local; i++)
		gpu[i] = UINT32_MAX;
	memset(r, 0, sizeof(*r));
	memset(&l, 0, sizeof(l));
	snprintf(l.model, sizeof(l.model), "kvbchain/%s", parents ? "parent" : "plain");
	l.kind = KVB_LAYOUT_MLA;
	l.tokens_per_page = c->tpp;
	l.tp_size = 1;
	l.ncomponents = 1;
	snprintf(l.comp[0].name, sizeof(l.comp[0].name), "kv");
	l.comp[0].num_layers = 1;
	l.comp[0].bytes_per_token_layer = (uint32_t)(c->page_bytes / c->tpp);
	err = kvb_ns_open(cl, &l, &ns, &pb);
	if (err)
		die("ns_open", err);
	mem = kvb_buf_alloc_host(cl, (size_t)len * pb, &buf);
	if (!mem)
		die("buf_alloc_host", -ENOMEM);
	for (size_t i = 0; i < (size_t)len * pb; i++)
		mem[i] = (uint8_t)(i * 131 + 7);
	rng_state = c->seed;
	for (uint32_t q = 0; q < c->requests; q++) {
		double u = (double)(rng() >> 11) * 0x1.0p-53;
		uint32_t lo = 0, hi = c->prompts - 1, p, n = 0, e, m;
		const kvb_key *k;
		size_t hits = 0;

		while (lo < hi) { /* the first prompt whose cumulative weight reaches u */
			uint32_t mid = (lo + hi) / 2;

			if (cdf[mid] < u)
				lo = mid + 1;
			else
				hi = mid;
		}
		p = lo;
		k = &keys[(size_t)p * len];
		/* Every --restart-every requests an engine starts afresh, its own cache empty. */
		if (c->restart_every && q % c->restart_every == c->restart_every - 1) {
			uint32_t *lru = &gpu[(q / c->restart_every % c->engines) * c->local];

			for (uint32_t i = 0; i < c->local; i++)
				lru[i] = UINT32_MAX;
		}
		/* The engine asks the broker for what it does not hold itself: from m on. */
		e = (uint32_t)(rng() % c->engines);
		m = local_match(c, &gpu[e * c->local], p);
		if (m == len)
			continue;
		err = kvb_lookup(cl, ns, k + m, len - m, &hits);
		if (err)
			die("lookup", err);
		/*
		 * A page evicted since the LOOKUP ends the prefix there: the engine computes it
		 * again and writes it back, so that what it PUTs continues a page that is stored.
		 */
		for (uint32_t j = m; j < m + hits; j++) {
			err = kvb_get(cl, ns, k[j], mem + (size_t)j * pb, pb);
			if (err == -ENOENT) {
				hits = j - m;
				break;
			}
			if (err < 0)
				die("get", err);
		}
		if (q >= warm) {
			r->lead += hits;
			r->asked += len - m;
		}
		for (uint32_t j = m + (uint32_t)hits; j < len; j++) {
			ops[n] = (struct kvb_op){.opcode = KVB_OP_PUT,
						 .ns = ns,
						 .buf = buf,
						 .key = k[j],
						 .off = (uint64_t)j * pb,
						 .user_data = j};
			if (parents && j) {
				ops[n].flags = KVB_OPF_PARENT;
				par[n] = k[j - 1];
			}
			n++;
		}
		for (uint32_t sent = 0; sent < n;) {
			int nq = kvb_submit_parents(cl, ops + sent, parents ? par + sent : NULL,
						    n - sent);
			int got;

			if (nq < 0)
				die("submit", nq);
			sent += (uint32_t)nq;
			got = kvb_reap(cl, done, len, (size_t)nq, 10000);
			if (got < nq)
				die("reap", got < 0 ? got : -ETIMEDOUT);
			for (int i = 0; i < got; i++) {
				if (done[i].res < 0)
					die("put", done[i].res);
				r->puts++;
				r->put_existed += !!(done[i].flags & KVB_CQEF_EXISTED);
			}
		}
		if (c->check_every && q % c->check_every == 0)
			r->stranded_seen += stranded(cl, ns, k, len, 0, tiers, NULL);
	}
	r->secs = clock_now() - t0;
	for (uint32_t p = 0; p < c->prompts; p++)
		r->stranded_end += stranded(cl, ns, &keys[(size_t)p * len], len,
					    p < c->groups ? 0 : c->shared, tiers, &r->stored_end);
	/* Empty the pool for the next run (shared prefixes are deleted once, then -ENOENT). */
	for (size_t i = 0; i < (size_t)c->prompts * len; i++) {
		err = kvb_delete(cl, ns, keys[i]);
		if (err && err != -ENOENT)
			die("delete", err);
	}
	kvb_buf_unregister(cl, buf);
	free(ops);
	free(par);
	free(tiers);
	free(done);
	free(gpu);
}

static void usage(void)
{
	printf("usage: kvbchain --socket PATH [--prompts N] [--groups G] [--shared S] [--own O]\n"
	       "                [--requests R] [--zipf S] [--page BYTES] [--tpp T] [--seed N]\n"
	       "                [--check-every K] [--engines E] [--local K] [--restart-every R]\n"
	       "                [--md] [--assert] [--version]\n");
}

int main(int argc, char **argv)
{
	struct cfg c = {.prompts = 3000,
			.groups = 16,
			.shared = 32,
			.own = 8,
			.requests = 12000,
			.tpp = 16,
			.check_every = 16,
			.page_bytes = 16384,
			.zipf = 0.9,
			.seed = 1,
			.engines = 8,
			.local = 64,
			.restart_every = 1500};
	static const struct option lo[] = {{"socket", required_argument, NULL, 'S'},
					   {"prompts", required_argument, NULL, 'p'},
					   {"groups", required_argument, NULL, 'g'},
					   {"shared", required_argument, NULL, 's'},
					   {"own", required_argument, NULL, 'o'},
					   {"requests", required_argument, NULL, 'r'},
					   {"zipf", required_argument, NULL, 'z'},
					   {"page", required_argument, NULL, 'b'},
					   {"tpp", required_argument, NULL, 't'},
					   {"seed", required_argument, NULL, 'e'},
					   {"check-every", required_argument, NULL, 'k'},
					   {"engines", required_argument, NULL, 'E'},
					   {"local", required_argument, NULL, 'G'},
					   {"restart-every", required_argument, NULL, 'R'},
					   {"md", no_argument, NULL, 'm'},
					   {"assert", no_argument, NULL, 'a'},
					   {"help", no_argument, NULL, 'h'},
					   {"version", no_argument, NULL, 'V'},
					   {NULL, 0, NULL, 0}};
	struct kvb_opts o = {0};
	struct result res[2];
	kvb_client *cl;
	kvb_key *keys;
	double *cdf, sum = 0;
	int opt, err, bad = 0;

	while ((opt = cli_getopt(argc, argv, "", lo, "kvbchain")) != -1) {
		switch (opt) {
		case 'S':
			c.socket = optarg;
			break;
		case 'p':
			c.prompts = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'g':
			c.groups = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 's':
			c.shared = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'o':
			c.own = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'r':
			c.requests = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'z':
			c.zipf = strtod(optarg, NULL);
			break;
		case 'b':
			c.page_bytes = strtoull(optarg, NULL, 0);
			break;
		case 't':
			c.tpp = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'e':
			c.seed = strtoull(optarg, NULL, 0);
			break;
		case 'k':
			c.check_every = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'E':
			c.engines = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'G':
			c.local = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'R':
			c.restart_every = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'm':
			c.md = 1;
			break;
		case 'a':
			c.assert_ok = 1;
			break;
		case 'h':
			usage();
			return 0;
		case 'V':
			cli_version("kvbchain");
			return 0;
		default: /* cli_getopt() said what */
			return CLI_USAGE;
		}
	}
	if (!c.prompts || !c.groups || !c.own || !c.requests || !c.tpp || !c.engines || !c.local ||
	    c.page_bytes % c.tpp || !c.page_bytes)
		return cli_usage_error("kvbchain", "--prompts, --groups, --own, --requests, --tpp, "
						   "--engines and --local take N > 0, --page a "
						   "multiple of --tpp");
	if (optind < argc)
		return cli_usage_error("kvbchain", "unexpected argument '%s'", argv[optind]);
	o.socket_path = c.socket;
	o.name = "kvbchain";
	err = kvb_connect(&o, &cl);
	if (err)
		die("connect", err);
	cdf = malloc(c.prompts * sizeof(*cdf));
	if (!cdf)
		die("memory", -ENOMEM);
	for (uint32_t i = 0; i < c.prompts; i++)
		cdf[i] = sum += pow((double)i + 1, -c.zipf);
	for (uint32_t i = 0; i < c.prompts; i++)
		cdf[i] /= sum;
	keys = chain_keys(&c);
	run(&c, cl, 1, cdf, keys, &res[0]);
	run(&c, cl, 0, cdf, keys, &res[1]);
	kvb_close(cl);
	if (c.md) {
		printf("| eviction | prefix hit rate | stranded pages (checks / end) | pages "
		       "stored at end | PUTs | run s |\n|---|---|---|---|---|---|\n");
		for (int i = 0; i < 2; i++)
			printf("| %s | %.1f%% | %llu / %llu | %llu | %llu | %.1f |\n",
			       i ? "plain LRU" : "chains, tail first (parent keys)",
			       100.0 * (double)res[i].lead / (double)res[i].asked,
			       (unsigned long long)res[i].stranded_seen,
			       (unsigned long long)res[i].stranded_end,
			       (unsigned long long)res[i].stored_end,
			       (unsigned long long)(res[i].puts - res[i].put_existed), res[i].secs);
	} else {
		printf("{");
		for (int i = 0; i < 2; i++)
			printf("%s\"%s\": {\"hit_rate\": %.6f, \"lead\": %llu, \"asked\": %llu, "
			       "\"stranded_seen\": %llu, \"stranded_end\": %llu, \"stored_end\": "
			       "%llu, "
			       "\"puts\": %llu, \"put_existed\": %llu, \"secs\": %.3f}",
			       i ? ", " : "", i ? "plain" : "parent",
			       (double)res[i].lead / (double)res[i].asked,
			       (unsigned long long)res[i].lead, (unsigned long long)res[i].asked,
			       (unsigned long long)res[i].stranded_seen,
			       (unsigned long long)res[i].stranded_end,
			       (unsigned long long)res[i].stored_end,
			       (unsigned long long)res[i].puts,
			       (unsigned long long)res[i].put_existed, res[i].secs);
		printf("}\n");
	}
	if (c.assert_ok) {
		if (res[0].stranded_seen || res[0].stranded_end) {
			fprintf(stderr, "kvbchain: %llu + %llu pages stranded with parent keys\n",
				(unsigned long long)res[0].stranded_seen,
				(unsigned long long)res[0].stranded_end);
			bad = 1;
		}
		if (res[0].lead * res[1].asked < res[1].lead * res[0].asked) {
			fprintf(stderr, "kvbchain: hit rate with parents below plain LRU's\n");
			bad = 1;
		}
	}
	free(cdf);
	free(keys);
	return bad;
}
