// SPDX-License-Identifier: MIT
/*
 * main.c - kvbbench's driver: options, client processes and threads, the start barrier, the
 * timed loop, the progress line and the report (text or --json).
 *
 * One invocation measures one MODE at one page size with --procs processes of --threads threads.
 * The parent parses options, runs the mode's prepare() (probe the server, store the working set
 * a read mode needs) and forks the workers. Each thread opens its own connection (a kvb_client
 * must not cross a fork, and one client per thread is how parallel I/O is done), sets up its
 * buffers, warms up (one untimed pass over the working set by default, so the page faults of
 * fresh mappings stay out of the figures, and every page read is checked to carry its key),
 * reports ready and spins until the parent says go, so all threads start within ~50 us of each
 * other. Threads time every operation with CLOCK_MONOTONIC (one clock read per op: the end of
 * one op is the start of the next; with --gap-us the untimed sleep between ops is excluded) into
 * a log-linear histogram per kind of op, in a shared anonymous mapping; the parent merges them
 * for percentiles and sums each thread's own ops/elapsed for throughput, so a straggler does
 * not dilute the aggregate.
 *
 * Open loop (--rate R): ops arrive at R per second in all, as a Poisson process per thread
 * (R / threads each), whether or not the previous one finished; an op is timed from its
 * arrival, so a backlog shows up in the latency (what a request waiting for a busy engine
 * sees) instead of slowing the arrivals down (closed loop: the default).
 *
 * Working sets default to at least 128 MiB (four times this machine's 32 MiB LLC) and every
 * copy walks a destination of the same size, so GET, ACQUIRE, the peers and the memcpy limit
 * all move cold data into cold data and their ratios mean something.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "kvbbench.h"

struct shared {
	atomic_int ready; /* threads that finished set-up and warm-up (or failed) */
	atomic_int go;	  /* 1 start, -1 abort */
	atomic_int ended; /* mla-tp: threads past their timed ops (the end barrier) */
	struct kvbb_slot slot[];
};

static struct kvbb_cfg cfg;
static struct shared *sh;

static void sleep_us(unsigned us)
{
	struct timespec ts = {us / 1000000, (long)(us % 1000000) * 1000};

	while (nanosleep(&ts, &ts) && errno == EINTR)
		;
}

/*
 * --pair: after each op, the memcpy mode's copy of the same size (private source; with
 * --dst hot into a reused destination of its own, else a private rotating one), timed apart.
 * Op after op in one process, the two see the same machine: on a shared VM memcpy alone moves
 * by 10-30% between processes and from one second to the next, more than the gaps the issue's
 * targets are about (docs/benchmarks.md, 2026-12-04). Not the op's reused destination: from
 * half the L2 kvb_copy's streaming stores leave it out of the cache, and a memcpy into it
 * after them would run slower than memcpy --dst hot does.
 */
static int pair_setup(struct kvbb_w *w)
{
	size_t len = cfg.pages * cfg.page_bytes;
	int hot = cfg.dst_hot && strncmp(cfg.mode->name, "put", 3) != 0;

	w->pair_src = kvbb_alloc_touched(len);
	w->pair_dst = kvbb_alloc_touched(hot ? cfg.page_bytes : len);
	w->pair_hot = hot;
	return w->pair_src && w->pair_dst ? 0 : -ENOMEM;
}

/* The ops' own time: a paired mode records each op once, under one kind, and nothing else. */
static uint64_t ops_ns(const struct kvbb_slot *s)
{
	uint64_t ns = 0;

	for (unsigned k = 0; k < NKIND; k++)
		ns += s->kns[k];
	return ns;
}

static void pair_copy(struct kvbb_w *w, uint64_t i)
{
	uint64_t n = cfg.pages;
	uint8_t *dst = w->pair_dst + (w->pair_hot ? 0 : (i % n) * cfg.page_bytes);

	memcpy(dst, w->pair_src + ((i + n / 2) % n) * cfg.page_bytes, cfg.page_bytes);
}

/* One thread: set up, warm up, wait for go, measure, tear down. */
static void thread_run(int idx)
{
	const struct kvbb_mode *m = cfg.mode;
	struct kvbb_slot *s = &sh->slot[idx];
	uint64_t i, t0, t1, deadline;
	struct kvbb_w w;
	char err[160] = "";
	double start, gap_ns = 0;
	uint64_t arr_rng = 0;
	int64_t r;
	int go, rc;

	memset(&w, 0, sizeof(w));
	w.cfg = &cfg;
	w.s = s;
	w.idx = idx;
	w.slots = cfg.pages;
	w.start = cfg.pages * (uint64_t)idx / (uint64_t)cfg.nslots;
	/* engine --tp: the ranks of one engine see the same requests in the same order. */
	w.group = cfg.tp > 1 ? idx / (int)cfg.tp : idx;
	w.rng = kvbb_mix64(cfg.put_seed ^ ((uint64_t)w.group << 20));
	rc = m->setup(&w, err, sizeof(err));
	if (rc < 0) {
		s->rc = rc;
		snprintf(s->err, sizeof(s->err), "set-up: %.150s", err);
		goto out;
	}
	if (cfg.pair && pair_setup(&w) < 0) {
		kvbb_fail(s, -ENOMEM, "--pair buffers");
		goto out;
	}

	/* Warm-up, also the correctness check: every page read here must carry its key. */
	w.verify = 1;
	for (i = 0; i < cfg.warmup; i++) {
		r = m->op(&w, i);
		if (r < 0) {
			kvbb_fail(s, (int)r, "warm-up");
			goto out;
		}
	}
	w.verify = 0;
	memset(s->hist, 0, sizeof(s->hist));
	memset(s->kops, 0, sizeof(s->kops));
	memset(s->kns, 0, sizeof(s->kns));
	s->dedup = s->stored = s->misses = s->pg_hits = s->pg_total = 0;
	s->load_t0 = s->load_t1 = 0;

	atomic_fetch_add(&sh->ready, 1);
	while ((go = atomic_load(&sh->go)) == 0)
		usleep(50);
	if (go < 0)
		goto out;

	start = clock_now();
	t0 = clock_ns();
	deadline = cfg.iters ? UINT64_MAX : t0 + (uint64_t)(cfg.seconds * 1e9);
	if (cfg.rate > 0) {
		/* Per arrival stream (a thread, or an engine's ranks together): its share of R. */
		int streams = cfg.tp > 1 ? cfg.nslots / (int)cfg.tp : cfg.nslots;

		gap_ns = 1e9 * streams / cfg.rate;
		arr_rng = kvbb_mix64(cfg.put_seed ^ 0x617272ull ^ ((uint64_t)w.group << 24));
	}
	for (i = 0; !cfg.iters || i < cfg.iters; i++) {
		if (gap_ns > 0) {
			/* Exponential gaps: -ln(U) x mean, U in (0, 1]. */
			double u = (double)((kvbb_rand(&arr_rng) >> 11) + 1) / 9007199254740992.0;
			uint64_t now = clock_ns();

			t0 += (uint64_t)(-log(u) * gap_ns);
			if (t0 >= deadline && !cfg.iters)
				break;
			if (t0 > now)
				sleep_us((unsigned)((t0 - now) / 1000));
			else
				s->late++;
		}
		w.kind = K_MAIN;
		w.t_start = t0;
		r = m->op(&w, cfg.warmup + i);
		t1 = clock_ns();
		if (r < 0) {
			kvbb_fail(s, (int)r, m->name);
			break;
		}
		s->hist[w.kind][kvbb_h_index(t1 - t0)]++;
		s->kops[w.kind]++;
		s->kns[w.kind] += t1 - t0;
		if (cfg.pair) {
			uint64_t p0 = t1;

			pair_copy(&w, cfg.warmup + i);
			t1 = clock_ns();
			s->pair_ns += t1 - p0;
		}
		s->ops++;
		s->bytes += (uint64_t)r;
		atomic_store_explicit(&s->prog_ops, s->ops, memory_order_relaxed);
		atomic_store_explicit(&s->prog_bytes, s->bytes, memory_order_relaxed);
		if (t1 >= deadline)
			break;
		if (gap_ns > 0)
			continue; /* the next op's start is its arrival, not our end */
		if (cfg.gap_us) {
			sleep_us(cfg.gap_us);
			t1 = clock_ns();
		}
		t0 = t1;
	}
	s->elapsed = clock_now() - start;
	/*
	 * mla-tp: TP ranks stay attached until every rank has loaded, as an engine's do. A rank
	 * that tore down as soon as its own pages were in (the broker serves the first ranks'
	 * batches first) had its buffers unmapped and freed, by itself and by the broker, while
	 * the others still loaded: 10-20 ms of CPU per rank inside their load phase on 2 vCPUs,
	 * which no engine pays and the private pools, whose ranks all end together, did not.
	 */
	if (!strcmp(m->name, "mla-tp") && !cfg.leave_early) {
		double until = clock_now() + cfg.timeout;

		atomic_fetch_add(&sh->ended, 1);
		while (atomic_load(&sh->ended) < cfg.nslots && clock_now() < until)
			sleep_us(200);
	}
out:
	if (s->rc && !atomic_load(&sh->go))
		atomic_fetch_add(&sh->ready, 1); /* do not leave the parent waiting */
	if (m->teardown)
		m->teardown(&w);
	free(w.pair_src);
	free(w.pair_dst);
}

static void *thread_main(void *arg)
{
	thread_run((int)(intptr_t)arg);
	return NULL;
}

/* A worker process: --threads threads, the first on the process's own stack. Never returns. */
static void worker(int proc)
{
	pthread_t *tids = calloc((size_t)cfg.threads, sizeof(*tids));
	int t, base = proc * cfg.threads, bad = 0;

	for (t = 1; tids && t < cfg.threads; t++)
		if (pthread_create(&tids[t], NULL, thread_main, (void *)(intptr_t)(base + t))) {
			kvbb_fail(&sh->slot[base + t], -EAGAIN, "pthread_create");
			atomic_fetch_add(&sh->ready, 1);
			tids[t] = 0;
		}
	thread_run(base);
	for (t = 1; tids && t < cfg.threads; t++)
		if (tids[t])
			pthread_join(tids[t], NULL);
	for (t = 0; t < cfg.threads; t++)
		bad |= sh->slot[base + t].rc != 0;
	_exit(bad);
}

static void usage(FILE *f)
{
	const struct kvbb_mode *const *set, *m;

	fprintf(f, "usage: %s [options] MODE\n\nmodes:\n", kvbb_progname);
	for (set = kvbb_sets; *set; set++)
		for (m = *set; m->name; m++)
			fprintf(f, "  %-10s %s\n", m->name, m->what);
	fprintf(f,
		"\n"
		"options:\n"
		"  --socket PATH     broker socket (default $KVB_SOCKET, then the default path)\n"
		"  --server ADDR     redis-*/memc-*: HOST:PORT or /path/to/unix.sock\n"
		"  --proto P         memc-*: ascii (default) or binary protocol\n"
		"  --page SIZE       page size, K/M/G suffixes, fractions allowed (default 1M)\n"
		"  --layout kimi     Kimi-K2.5 MLA page: 61 layers x 1152 B x 64 tokens (4.29 "
		"MiB)\n"
		"  --pages N         working set in pages (default: >= 128 MiB, 4x the LLC)\n"
		"  --ws SIZE         working set in bytes instead (may exceed the pool)\n"
		"  --procs N         client processes (default 1); mla-tp: the TP ranks\n"
		"  --threads N       threads per process, one connection each (default 1)\n"
		"  --seconds S       measure for S seconds (default 2)\n"
		"  --iters N         measure N ops per thread instead\n"
		"  --warmup N        untimed ops per thread first (default: one pass over the\n"
		"                    working set; nop 1000, engine 100)\n"
		"  --gap-us N        sleep N us between ops, untimed (lets the broker sleep)\n"
		"  --rate R          open loop: R ops per second in all (engine: requests; "
		"Poisson\n"
		"                    arrivals), each op timed from its arrival (default: closed "
		"loop)\n"
		"  --dst rotate|hot  get, get-user, acquire(-copy), memcpy: copies land in a "
		"destination\n"
		"                    larger than the LLC (rotate, default) or in one reused page "
		"(hot)\n"
		"  --pair            get, get-user, acquire(-copy), put, put-user, memcpy(-*):\n"
		"                    each op followed by memcpy mode's copy of a page, timed\n"
		"                    apart: pair_ratio is the op's throughput over memcpy's,\n"
		"                    measured op by op (memcpy --pair: the method's own error)\n"
		"  --dist D          keys: seq (default), uniform, zipf or zipf:S (S default "
		"0.99);\n"
		"                    engine: how requests pick their prefix (default zipf)\n"
		"  --misses ok|fill  reads of pages not stored are counted, not errors; fill\n"
		"                    also PUTs the page (a cache fill)\n"
		"  --mix SPEC        mix: weights, e.g. get=80,put=10,lookup=5,acquire=5\n"
		"  --batch N         lookup: keys per kvb_lookup (default 1024)\n"
		"  --qd N            get, put: one op is N pages in one kvb_submit, all reaped\n"
		"                    before the next (latency is per batch; default 1); engine:\n"
		"                    pages per kvb_submit of a request's loads (default %d);\n"
		"                    mla-tp: each rank loads its pages N at a time (\"load\" is\n"
		"                    per batch, \"get\" per page from its batch's start)\n"
		"  --read sum|copy   acquire(-copy): sum the page as uint64 or copy it out "
		"(default "
		"copy)\n"
		"  --host-buf B      get, put, mix: the registered buffer: alloc "
		"(kvb_buf_alloc_host,\n"
		"                    default), memfd (own sealed memfd, registered by fd: mapped)\n"
		"                    or fdcopy (SGLang's unsealable memfd, KVB_BUF_FDCOPY);\n"
		"                    user: none, malloc'd memory (mla-tp: PUTs via staging)\n"
		"  --prefixes N      engine: system prompts (default 16)\n"
		"  --prefix-pages N  engine: pages per system prompt (default 8)\n"
		"  --branches N      engine: conversation branches under each prompt (default 4)\n"
		"  --branch-pages N  engine: pages per branch (default 4)\n"
		"  --suffix-pages N  engine: pages of each request's own (default 4)\n"
		"  --tp N            engine: N TP ranks per engine (--procs x --threads / N "
		"engines),\n"
		"                    MLA: each rank loads every page of the request into its "
		"buffer\n"
		"                    (a Kimi-K2.5 8K-token context: --layout kimi, 128 pages in "
		"all)\n"
		"  --layers G        engine: the KV buffer in an engine's layer-first layout, a "
		"view;\n"
		"                    loads are layer-range GETs of G groups in layer order, all "
		"in\n"
		"                    flight (--qd at a time); load_first: arrival to group 0 "
		"loaded\n"
		"  --private         mla-tp: each rank keeps its own pool (what engines do today)\n"
		"  --leave-early     mla-tp: ranks tear down once their own loads are done\n"
		"                    (default: once every rank's are, as an engine's ranks stay)\n"
		"  --timeout S       give up after S seconds (default 60 + 2 x --seconds)\n"
		"  --progress        a progress line on stderr every second (default: when stderr\n"
		"                    is a terminal and the run is 5 s or longer)\n"
		"  --json            one JSON object instead of text\n"
		"  --version         print the version and exit\n"
		"  -h, --help        this text\n"
		"\n"
		"GB/s are 1e9 bytes of page data per second; latencies are per op, all threads\n"
		"merged; ops/s and GB/s are summed over threads.\n",
		KVBB_MAX_QD);
}

static const struct kvbb_mode *find_mode(const char *name)
{
	const struct kvbb_mode *const *set, *m;

	for (set = kvbb_sets; *set; set++)
		for (m = *set; m->name; m++)
			if (!strcmp(name, m->name))
				return m;
	return NULL;
}

/*
 * A one-component layout whose page is exactly cfg.page_req bytes: 64 tokens of page/64 bytes
 * in one layer when that divides, else one token of the whole page. --layout kimi instead takes
 * Kimi-K2.5's real MLA page: 61 layers x 1152 B (576 bf16 latent+rope) x 64 tokens = 4,497,408 B.
 */
static int build_layout(void)
{
	struct kvb_layout *l = &cfg.layout;
	uint64_t pb = cfg.page_req;

	memset(l, 0, sizeof(*l));
	l->kind = KVB_LAYOUT_MLA;
	l->tp_size = 1;
	l->ncomponents = 1;
	snprintf(l->comp[0].name, sizeof(l->comp[0].name), "kv");
	if (cfg.kimi) {
		snprintf(l->model, sizeof(l->model), "kimi-k2.5-bench");
		l->tokens_per_page = 64;
		l->comp[0].num_layers = 61;
		l->comp[0].bytes_per_token_layer = 1152;
	} else {
		if (pb == 0 || pb > UINT32_MAX)
			return -EINVAL;
		snprintf(l->model, sizeof(l->model), "kvbbench-%" PRIu64, pb);
		l->tokens_per_page = pb % 64 == 0 ? 64 : 1;
		l->comp[0].num_layers = 1;
		l->comp[0].bytes_per_token_layer = (uint32_t)(pb / l->tokens_per_page);
	}
	cfg.page_bytes = (size_t)l->tokens_per_page * l->comp[0].num_layers *
			 l->comp[0].bytes_per_token_layer;
	return 0;
}

/* "get=80,put=20": weights of the mix. */
static int parse_mix(const char *spec)
{
	char *dup = strdup(spec), *save = NULL, *tok;
	int rc = 0;

	memset(cfg.mix, 0, sizeof(cfg.mix));
	cfg.mix_total = 0;
	for (tok = strtok_r(dup, ",", &save); tok && !rc; tok = strtok_r(NULL, ",", &save)) {
		char *eq = strpbrk(tok, "=:");
		unsigned k;

		rc = -1;
		if (!eq)
			break;
		*eq = 0;
		for (k = K_GET; k < K_NMIX; k++)
			if (!strcmp(tok, kvbb_kind_name[k])) {
				cfg.mix[k] = (unsigned)strtoul(eq + 1, NULL, 10);
				cfg.mix_total += cfg.mix[k];
				rc = 0;
			}
	}
	free(dup);
	return rc || !cfg.mix_total ? -1 : 0;
}

enum {
	O_SOCKET = 256,
	O_SERVER,
	O_PAGE,
	O_LAYOUT,
	O_PAGES,
	O_WS,
	O_PROCS,
	O_THREADS,
	O_SECONDS,
	O_ITERS,
	O_WARMUP,
	O_GAP,
	O_DIST,
	O_MISSES,
	O_MIX,
	O_BATCH,
	O_READ,
	O_PREFIXES,
	O_PREFIX_PAGES,
	O_BRANCHES,
	O_BRANCH_PAGES,
	O_SUFFIX_PAGES,
	O_PRIVATE,
	O_LEAVE_EARLY,
	O_TIMEOUT,
	O_PROGRESS,
	O_JSON,
	O_PROTO,
	O_QD,
	O_HOST_BUF,
	O_RATE,
	O_DST,
	O_PAIR,
	O_TP,
	O_LAYERS,
	O_VERSION,
};

static int parse_args(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, O_SOCKET},
		{"server", required_argument, NULL, O_SERVER},
		{"page", required_argument, NULL, O_PAGE},
		{"layout", required_argument, NULL, O_LAYOUT},
		{"pages", required_argument, NULL, O_PAGES},
		{"ws", required_argument, NULL, O_WS},
		{"procs", required_argument, NULL, O_PROCS},
		{"threads", required_argument, NULL, O_THREADS},
		{"seconds", required_argument, NULL, O_SECONDS},
		{"iters", required_argument, NULL, O_ITERS},
		{"warmup", required_argument, NULL, O_WARMUP},
		{"gap-us", required_argument, NULL, O_GAP},
		{"dist", required_argument, NULL, O_DIST},
		{"misses", required_argument, NULL, O_MISSES},
		{"mix", required_argument, NULL, O_MIX},
		{"batch", required_argument, NULL, O_BATCH},
		{"read", required_argument, NULL, O_READ},
		{"prefixes", required_argument, NULL, O_PREFIXES},
		{"prefix-pages", required_argument, NULL, O_PREFIX_PAGES},
		{"branches", required_argument, NULL, O_BRANCHES},
		{"branch-pages", required_argument, NULL, O_BRANCH_PAGES},
		{"suffix-pages", required_argument, NULL, O_SUFFIX_PAGES},
		{"private", no_argument, NULL, O_PRIVATE},
		{"leave-early", no_argument, NULL, O_LEAVE_EARLY},
		{"timeout", required_argument, NULL, O_TIMEOUT},
		{"progress", no_argument, NULL, O_PROGRESS},
		{"json", no_argument, NULL, O_JSON},
		{"proto", required_argument, NULL, O_PROTO},
		{"host-buf", required_argument, NULL, O_HOST_BUF},
		{"qd", required_argument, NULL, O_QD},
		{"rate", required_argument, NULL, O_RATE},
		{"dst", required_argument, NULL, O_DST},
		{"pair", no_argument, NULL, O_PAIR},
		{"tp", required_argument, NULL, O_TP},
		{"layers", required_argument, NULL, O_LAYERS},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, O_VERSION},
		{NULL, 0, NULL, 0},
	};
	long long warm = -1;
	uint64_t ws = 0;
	int opt, page_given = 0, dist_given = 0;
	char word[32];
	const char *mix = "get=80,put=10,lookup=5,acquire=5";

	memset(&cfg, 0, sizeof(cfg));
	cfg.page_req = 1 << 20;
	cfg.procs = 1;
	cfg.threads = 1;
	cfg.seconds = 2;
	cfg.batch = 1024;
	cfg.zipf_s = 0.99;
	cfg.prefixes = 16;
	cfg.prefix_pages = 8;
	cfg.branches = 4;
	cfg.branch_pages = 4;
	cfg.suffix_pages = 4;
	cfg.progress = -1;
	cfg.tp = 1;
	while ((opt = cli_getopt(argc, argv, "h", lopts, kvbb_progname)) != -1) {
		switch (opt) {
		case O_SOCKET:
			cfg.socket = optarg;
			break;
		case O_SERVER:
			cfg.server = optarg;
			break;
		case O_PAGE:
			if (size_parse(optarg, &cfg.page_req) || !cfg.page_req) {
				cli_usage_error(kvbb_progname, "bad size '%s' for --page", optarg);
				return -1;
			}
			page_given = 1;
			break;
		case O_LAYOUT:
			if (strcmp(optarg, "kimi")) {
				fprintf(stderr, "kvbbench: --layout: only 'kimi' is known\n");
				return -1;
			}
			cfg.kimi = 1;
			break;
		case O_PAGES:
			cfg.pages = strtoull(optarg, NULL, 0);
			break;
		case O_WS:
			if (size_parse(optarg, &ws) || !ws) {
				cli_usage_error(kvbb_progname, "bad size '%s' for --ws", optarg);
				return -1;
			}
			break;
		case O_PROCS:
			cfg.procs = atoi(optarg);
			break;
		case O_THREADS:
			cfg.threads = atoi(optarg);
			break;
		case O_SECONDS:
			cfg.seconds = atof(optarg);
			break;
		case O_ITERS:
			cfg.iters = strtoull(optarg, NULL, 0);
			break;
		case O_WARMUP:
			warm = atoll(optarg);
			break;
		case O_GAP:
			cfg.gap_us = (unsigned)strtoul(optarg, NULL, 0);
			break;
		case O_DIST:
			dist_given = 1;
			if (!strcmp(optarg, "seq")) {
				cfg.dist = D_SEQ;
			} else if (!strcmp(optarg, "uniform")) {
				cfg.dist = D_UNIFORM;
			} else if (!strncmp(optarg, "zipf", 4)) {
				cfg.dist = D_ZIPF;
				if (optarg[4] == ':')
					cfg.zipf_s = atof(optarg + 5);
			} else {
				fprintf(stderr, "kvbbench: --dist seq|uniform|zipf[:S]\n");
				return -1;
			}
			break;
		case O_MISSES:
			if (!strcmp(optarg, "ok")) {
				cfg.miss_ok = 1;
			} else if (!strcmp(optarg, "fill")) {
				cfg.miss_fill = 1;
			} else {
				fprintf(stderr, "kvbbench: --misses ok|fill\n");
				return -1;
			}
			break;
		case O_MIX:
			mix = optarg;
			break;
		case O_BATCH:
			cfg.batch = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_HOST_BUF:
			if (!strcmp(optarg, "alloc")) {
				cfg.host_buf = KVBB_BUF_ALLOC;
			} else if (!strcmp(optarg, "memfd")) {
				cfg.host_buf = KVBB_BUF_MEMFD;
			} else if (!strcmp(optarg, "fdcopy")) {
				cfg.host_buf = KVBB_BUF_FDCOPY;
			} else if (!strcmp(optarg, "user")) {
				cfg.host_buf = KVBB_BUF_USER;
			} else {
				fprintf(stderr, "kvbbench: --host-buf takes alloc, memfd, fdcopy "
						"or user\n");
				return -1;
			}
			break;
		case O_READ:
			if (strcmp(optarg, "sum") && strcmp(optarg, "copy")) {
				fprintf(stderr, "kvbbench: --read takes sum or copy\n");
				return -1;
			}
			cfg.read_sum = !strcmp(optarg, "sum");
			break;
		case O_PREFIXES:
			cfg.prefixes = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_PREFIX_PAGES:
			cfg.prefix_pages = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_BRANCHES:
			cfg.branches = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_BRANCH_PAGES:
			cfg.branch_pages = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_SUFFIX_PAGES:
			cfg.suffix_pages = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_LEAVE_EARLY:
			cfg.leave_early = 1;
			break;
		case O_PRIVATE:
			cfg.private_pools = 1;
			break;
		case O_TIMEOUT:
			cfg.timeout = atof(optarg);
			break;
		case O_PROGRESS:
			cfg.progress = 1;
			break;
		case O_JSON:
			cfg.json = 1;
			break;
		case O_QD:
			cfg.qd = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_RATE:
			cfg.rate = atof(optarg);
			break;
		case O_DST:
			if (strcmp(optarg, "hot") && strcmp(optarg, "rotate")) {
				fprintf(stderr, "kvbbench: --dst takes rotate or hot\n");
				return -1;
			}
			cfg.dst_hot = !strcmp(optarg, "hot");
			break;
		case O_PAIR:
			cfg.pair = 1;
			break;
		case O_TP:
			cfg.tp = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case O_LAYERS:
			cfg.layer_groups = (uint32_t)strtoul(optarg, NULL, 0);
			if (!cfg.layer_groups) {
				fprintf(stderr, "kvbbench: --layers takes a group count >= 1\n");
				return -1;
			}
			break;
		case O_PROTO:
			if (strcmp(optarg, "binary") && strcmp(optarg, "ascii")) {
				fprintf(stderr, "kvbbench: --proto ascii|binary\n");
				return -1;
			}
			cfg.binary = !strcmp(optarg, "binary");
			break;
		case 'h':
			usage(stdout);
			exit(0);
		case O_VERSION:
			cli_version(kvbb_progname);
			exit(0);
		default: /* cli_getopt() said what, and where help is */
			return -2;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, "kvbbench: exactly one MODE expected\n");
		return -1;
	}
	cfg.mode = find_mode(argv[optind]);
	if (!cfg.mode) {
		fprintf(stderr, "kvbbench: unknown mode '%s'\n", argv[optind]);
		return -1;
	}
	if (cfg.mode->op == NULL)
		return -1;
	/* --pair: one page per op, as the memcpy it is paired with, timed back to back. */
	snprintf(word, sizeof(word), " %s ", cfg.mode->name);
	if (cfg.pair && (!strstr(" get get-user acquire acquire-copy put put-user memcpy memcpy-nt "
				 "memcpy-stream ",
				 word) ||
			 cfg.qd > 1 || cfg.rate > 0)) {
		fprintf(stderr, "kvbbench: --pair is for get, get-user, acquire(-copy), put, "
				"put-user and memcpy(-*), without --qd or --rate\n");
		return -1;
	}
	if (!strcmp(cfg.mode->name, "mla-tp") && !page_given)
		cfg.kimi = 1;
	if (build_layout() < 0 || cfg.page_bytes < 32) {
		fprintf(stderr, "kvbbench: bad --page (32 B .. 4 GiB)\n");
		return -1;
	}
	if (cfg.procs < 1 || cfg.procs > 256 || cfg.threads < 1 || cfg.threads > 64 ||
	    cfg.seconds <= 0 || cfg.batch < 1) {
		fprintf(stderr, "kvbbench: --procs 1..256, --threads 1..64, --seconds > 0, "
				"--batch >= 1\n");
		return -1;
	}
	if (!strcmp(cfg.mode->name, "mix") && parse_mix(mix) < 0) {
		fprintf(stderr, "kvbbench: --mix: KIND=WEIGHT,... with kinds get, put, lookup, "
				"acquire\n");
		return -1;
	}
	cfg.put_seed = kvbb_mix64(clock_ns() ^ ((uint64_t)getpid() << 32));
	cfg.ws_seed = kvbb_mix64(0x6b76626265ull ^ cfg.page_bytes ^ ((uint64_t)cfg.kimi << 40));
	if (ws)
		cfg.pages = (ws + cfg.page_bytes - 1) / cfg.page_bytes;
	if (!strcmp(cfg.mode->name, "mla-tp")) {
		/* Every rank stores then loads each page once; a fresh model per run. */
		if (!cfg.pages)
			cfg.pages = 16;
		cfg.threads = 1;
		/* --qd N: the load phase in batches of N pages (modes_broker.c, tp_load_batch). */
		if (cfg.qd > 1 && cfg.host_buf == KVBB_BUF_USER && !cfg.private_pools) {
			fprintf(stderr, "kvbbench: mla-tp --qd needs a registered buffer, not "
					"--host-buf user\n");
			return -1;
		}
		cfg.iters = cfg.pages +
			    (cfg.qd > 1 ? (cfg.pages + cfg.qd - 1) / cfg.qd : cfg.pages);
		warm = 0;
		cfg.layout.tp_size = (uint32_t)cfg.procs;
		snprintf(cfg.layout.model, sizeof(cfg.layout.model), "kimi-k2.5-tp-%016" PRIx64,
			 cfg.put_seed);
	}
	if (cfg.layer_groups && strcmp(cfg.mode->name, "engine")) {
		fprintf(stderr, "kvbbench: --layers is for engine\n");
		return -1;
	}
	if (!strcmp(cfg.mode->name, "engine")) {
		if (!dist_given)
			cfg.dist = D_ZIPF;
		if (cfg.tp < 1 || (cfg.procs * cfg.threads) % (int)cfg.tp) {
			fprintf(stderr, "kvbbench: --tp must divide --procs x --threads\n");
			return -1;
		}
		cfg.layout.tp_size = cfg.tp; /* MLA: the ranks of an engine share its pages */
		if (cfg.layer_groups > cfg.layout.comp[0].num_layers ||
		    (cfg.layer_groups && cfg.host_buf == KVBB_BUF_USER)) {
			fprintf(stderr,
				"kvbbench: --layers: at most the layout's %u layers, and a "
				"registered buffer (not --host-buf user)\n",
				cfg.layout.comp[0].num_layers);
			return -1;
		}
		if (!cfg.prefixes || !cfg.prefix_pages || (cfg.branch_pages && !cfg.branches)) {
			fprintf(stderr, "kvbbench: engine needs --prefixes and --prefix-pages >= 1 "
					"(and --branches with --branch-pages)\n");
			return -1;
		}
	}
	if (!cfg.pages) {
		cfg.pages = ((128ull << 20) + cfg.page_bytes - 1) / cfg.page_bytes;
		if (cfg.pages < 8)
			cfg.pages = 8;
		if (!strcmp(cfg.mode->name, "lookup") && cfg.pages < cfg.batch)
			cfg.pages = cfg.batch;
	}
	if (!strcmp(cfg.mode->name, "mix") && cfg.batch > cfg.pages)
		cfg.batch = (uint32_t)cfg.pages;
	if (!strcmp(cfg.mode->name, "lookup") && cfg.pages < cfg.batch) {
		fprintf(stderr, "kvbbench: lookup needs --pages >= --batch\n");
		return -1;
	}
	if (cfg.qd > KVBB_MAX_QD || (cfg.qd > cfg.pages && strcmp(cfg.mode->name, "engine"))) {
		fprintf(stderr, "kvbbench: --qd at most %d and at most --pages\n", KVBB_MAX_QD);
		return -1;
	}
	if (warm >= 0)
		cfg.warmup = (uint64_t)warm;
	else if (cfg.qd > 1 && !cfg.mode->warmup)
		cfg.warmup = (cfg.pages + cfg.qd - 1) / cfg.qd;
	else if (cfg.mode->warmup)
		cfg.warmup = cfg.mode->warmup;
	else
		cfg.warmup = cfg.pages; /* one pass: faults of fresh mappings go untimed */
	if (cfg.timeout <= 0)
		cfg.timeout = 60 + 2 * cfg.seconds;
	if (cfg.dist == D_ZIPF) {
		uint64_t n = !strcmp(cfg.mode->name, "engine") ? cfg.prefixes : cfg.pages;

		if (kvbb_zipf_init(&cfg.zipf, n, cfg.zipf_s) < 0) {
			fprintf(stderr, "kvbbench: out of memory\n");
			return -1;
		}
	}
	cfg.nslots = cfg.procs * cfg.threads;
	if (cfg.progress < 0)
		cfg.progress = isatty(2) && (cfg.iters || cfg.seconds >= 5);
	return 0;
}

static void progress_line(double t0)
{
	uint64_t ops = 0, bytes = 0;
	double el = clock_now() - t0;
	int i;

	for (i = 0; i < cfg.nslots; i++) {
		ops += atomic_load_explicit(&sh->slot[i].prog_ops, memory_order_relaxed);
		bytes += atomic_load_explicit(&sh->slot[i].prog_bytes, memory_order_relaxed);
	}
	if (cfg.iters)
		fprintf(stderr, "\r%s: %s %.0f s, %" PRIu64 " of %" PRIu64 " ops", kvbb_progname,
			cfg.mode->name, el, ops, cfg.iters * (uint64_t)cfg.nslots);
	else
		fprintf(stderr, "\r%s: %s %.0f/%.0f s, %.3g ops/s, %.2f GB/s   ", kvbb_progname,
			cfg.mode->name, el, cfg.seconds, (double)ops / el,
			(double)bytes / el / 1e9);
	fflush(stderr);
}

/* Waits for every worker, killing them all once the deadline passes. Returns failures. */
static int reap(pid_t *pids, int n, double deadline, double t0)
{
	int left = n, bad = 0, st, i, killed = 0;
	double next = t0 + 1;

	while (left > 0) {
		for (i = 0; i < n; i++) {
			if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i])
				continue;
			pids[i] = 0;
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
				bad++;
		}
		if (left > 0 && !killed && clock_now() > deadline) {
			fprintf(stderr, "%s: timed out; killing workers\n", kvbb_progname);
			for (i = 0; i < n; i++)
				if (pids[i] > 0)
					kill(pids[i], SIGKILL);
			killed = 1;
		}
		if (cfg.progress && t0 > 0 && clock_now() >= next) {
			progress_line(t0);
			next += 1;
		}
		if (left > 0)
			usleep(2000);
	}
	if (cfg.progress && t0 > 0)
		fputc('\n', stderr);
	return bad + killed;
}

static const char *dist_name(void)
{
	static char b[32];

	switch (cfg.dist) {
	case D_UNIFORM:
		return "uniform";
	case D_ZIPF:
		snprintf(b, sizeof(b), "zipf:%.2f", cfg.zipf_s);
		return b;
	default:
		return "seq";
	}
}

static void print_json(const struct kvbb_slot *t, const uint64_t *hall, double seconds,
		       double ops_s, double bytes_s, const char *extra)
{
	unsigned k, nk = 0;

	printf("{\"mode\":\"%s\",\"page_bytes\":%zu,\"procs\":%d,\"threads\":%d,\"pages\":%" PRIu64
	       ",\"ws_bytes\":%" PRIu64
	       ",\"dist\":\"%s\",\"batch\":%u,\"qd\":%u,\"gap_us\":%u,\"ops\":%" PRIu64
	       ",\"seconds\":%.6f,\"ops_per_s\":%.1f,\"gb_per_s\":%.4f,\"keys_per_s\":%.1f,"
	       "\"p50_us\":%.3f,\"p90_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"dedup\":%" PRIu64
	       ",\"stored\":%" PRIu64 ",\"misses\":%" PRIu64 ",\"layout\":\"%s\",\"server\":\"%s\"",
	       cfg.mode->name, cfg.page_bytes, cfg.procs, cfg.threads, cfg.pages,
	       cfg.pages * (uint64_t)cfg.page_bytes, dist_name(),
	       !strcmp(cfg.mode->name, "lookup") ? cfg.batch : 0, cfg.qd ? cfg.qd : 1, cfg.gap_us,
	       t->ops, seconds, ops_s, bytes_s / 1e9,
	       !strcmp(cfg.mode->name, "lookup") ? ops_s * cfg.batch : 0.0,
	       kvbb_h_quantile(hall, 0.50) / 1e3, kvbb_h_quantile(hall, 0.90) / 1e3,
	       kvbb_h_quantile(hall, 0.99) / 1e3, kvbb_h_quantile(hall, 0.999) / 1e3, t->dedup,
	       t->stored, t->misses, cfg.kimi ? "kimi" : "flat", cfg.server ? cfg.server : "");
	for (k = 0; k < NKIND; k++)
		nk += t->kops[k] != 0;
	if (nk > 1) {
		printf(",\"kinds\":{");
		for (k = 0, nk = 0; k < NKIND; k++) {
			if (!t->kops[k])
				continue;
			printf("%s\"%s\":{\"ops\":%" PRIu64
			       ",\"p50_us\":%.3f,\"p99_us\":%.3f,\"mean_us\":%.3f}",
			       nk++ ? "," : "", kvbb_kind_name[k], t->kops[k],
			       kvbb_h_quantile(t->hist[k], 0.50) / 1e3,
			       kvbb_h_quantile(t->hist[k], 0.99) / 1e3,
			       (double)t->kns[k] / (double)t->kops[k] / 1e3);
		}
		printf("}");
	}
	if (cfg.rate > 0)
		printf(",\"rate\":%.1f,\"late\":%" PRIu64, cfg.rate, t->late);
	printf(",\"dst\":\"%s\"", cfg.dst_hot ? "hot" : "rotate");
	if (cfg.pair && ops_ns(t) && t->pair_ns)
		printf(",\"pair_ratio\":%.4f,\"pair_memcpy_gb_per_s\":%.4f",
		       (double)t->pair_ns / (double)ops_ns(t),
		       (double)t->ops * (double)cfg.page_bytes / (double)t->pair_ns);
	if (extra[0])
		printf(",%s", extra);
	printf("}\n");
}

static void print_text(const struct kvbb_slot *t, const uint64_t *hall, double seconds,
		       double ops_s, double bytes_s, const char *extra)
{
	const char *name = cfg.mode->name;
	char a[32], b[64];
	unsigned k;

	if (!(cfg.mode->flags & MF_DATA) && strcmp(name, "lookup"))
		snprintf(b, sizeof(b), "no page");
	else
		snprintf(b, sizeof(b), "page %s (%zu B)",
			 kvbb_fmt_bytes((double)cfg.page_bytes, a, sizeof(a)), cfg.page_bytes);
	printf("%s: %s, %d proc%s x %d thread%s, %" PRIu64 " ops in %.2f s\n", name, b, cfg.procs,
	       cfg.procs > 1 ? "s" : "", cfg.threads, cfg.threads > 1 ? "s" : "", t->ops, seconds);
	if (!strcmp(name, "lookup"))
		printf("  %.0f lookups/s of %u keys = %.2f M keys/s\n", ops_s, cfg.batch,
		       ops_s * cfg.batch / 1e6);
	else if (!(cfg.mode->flags & MF_DATA))
		printf("  %.0f ops/s\n", ops_s);
	else
		printf("  %.0f ops/s, %.2f GB/s, working set %" PRIu64 " pages (%s), dist %s\n",
		       ops_s, bytes_s / 1e9, cfg.pages,
		       kvbb_fmt_bytes((double)(cfg.pages * cfg.page_bytes), b, sizeof(b)),
		       dist_name());
	if (t->misses)
		printf("  %" PRIu64 " misses\n", t->misses);
	if (t->dedup && strcmp(name, "mla-tp"))
		printf("  %" PRIu64 " PUTs found their key stored\n", t->dedup);
	printf("  latency us: p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f\n",
	       kvbb_h_quantile(hall, 0.50) / 1e3, kvbb_h_quantile(hall, 0.90) / 1e3,
	       kvbb_h_quantile(hall, 0.99) / 1e3, kvbb_h_quantile(hall, 0.999) / 1e3);
	if (cfg.rate > 0)
		printf("  open loop at %.1f ops/s: %" PRIu64 " ops started late (a backlog)\n",
		       cfg.rate, t->late);
	if (cfg.pair && ops_ns(t) && t->pair_ns)
		printf("  paired memcpy %.2f GB/s: %s at %.3f of memcpy, op by op\n",
		       (double)t->ops * (double)cfg.page_bytes / (double)t->pair_ns, name,
		       (double)t->pair_ns / (double)ops_ns(t));
	if (!strcmp(name, "mix") || !strcmp(name, "engine") || !strcmp(name, "mla-tp"))
		for (k = K_GET; k < NKIND; k++)
			if (t->kops[k])
				printf("    %-8s %" PRIu64 " ops  p50 %.2f  p99 %.2f\n",
				       kvbb_kind_name[k], t->kops[k],
				       kvbb_h_quantile(t->hist[k], 0.50) / 1e3,
				       kvbb_h_quantile(t->hist[k], 0.99) / 1e3);
	fputs(extra, stdout);
}

int main(int argc, char **argv)
{
	static struct kvbb_slot total;
	static uint64_t hall[H_BUCKETS];
	static char xjson[1024], xtext[1024];
	size_t shsize;
	pid_t *pids = NULL;
	double deadline, seconds = 0, ops_s = 0, bytes_s = 0, t0, el;
	char err[1024] = "";
	int i, j, k, bad, started, ret = 1;

	i = parse_args(argc, argv);
	if (i < 0) {
		/* -1: the cause is printed; one more line says where help is. */
		if (i == -1)
			fprintf(stderr, "Try '%s --help' for more information.\n", kvbb_progname);
		return CLI_USAGE;
	}
	if (cfg.mode->prepare && cfg.mode->prepare(&cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "%s: %s\n", kvbb_progname, err[0] ? err : "set-up failed");
		return 1;
	}

	shsize = sizeof(*sh) + (size_t)cfg.nslots * sizeof(struct kvbb_slot);
	sh = mmap(NULL, shsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pids = calloc((size_t)cfg.procs, sizeof(*pids));
	if (sh == MAP_FAILED || !pids) {
		fprintf(stderr, "%s: out of memory\n", kvbb_progname);
		goto out;
	}
	fflush(NULL);
	for (i = 0; i < cfg.procs; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			fprintf(stderr, "%s: fork: %s\n", kvbb_progname, strerror(errno));
			atomic_store(&sh->go, -1);
			reap(pids, i, clock_now() + cfg.timeout, 0);
			goto out;
		}
		if (pids[i] == 0)
			worker(i);
	}

	/* Start together: a thread that failed set-up counts as ready and makes us abort. */
	deadline = clock_now() + cfg.timeout;
	while ((started = atomic_load(&sh->ready)) < cfg.nslots && clock_now() < deadline)
		usleep(200);
	for (i = 0; i < cfg.nslots; i++)
		if (sh->slot[i].rc)
			started = -1;
	t0 = clock_now();
	atomic_store(&sh->go, started == cfg.nslots ? 1 : -1);
	bad = reap(pids, cfg.procs, deadline + (cfg.iters ? cfg.timeout : cfg.seconds),
		   started == cfg.nslots ? t0 : 0);

	for (i = 0; i < cfg.nslots; i++) {
		struct kvbb_slot *s = &sh->slot[i];

		if (s->rc)
			fprintf(stderr, "%s: thread %d: %s\n", kvbb_progname, i, s->err);
		total.ops += s->ops;
		total.bytes += s->bytes;
		total.dedup += s->dedup;
		total.stored += s->stored;
		total.misses += s->misses;
		total.pg_hits += s->pg_hits;
		total.pg_total += s->pg_total;
		total.late += s->late;
		total.pair_ns += s->pair_ns;
		if (s->load_t0 && (!total.load_t0 || s->load_t0 < total.load_t0))
			total.load_t0 = s->load_t0;
		if (s->load_t1 > total.load_t1)
			total.load_t1 = s->load_t1;
		if (s->elapsed > seconds)
			seconds = s->elapsed;
		/* --pair: the ops' own time, without the memcpys between them */
		el = cfg.pair && ops_ns(s) ? (double)ops_ns(s) / 1e9 : s->elapsed;
		if (el > 0) {
			ops_s += (double)s->ops / el;
			bytes_s += (double)s->bytes / el;
		}
		for (k = 0; k < NKIND; k++) {
			total.kops[k] += s->kops[k];
			total.kns[k] += s->kns[k];
			for (j = 0; j < (int)H_BUCKETS; j++) {
				total.hist[k][j] += s->hist[k][j];
				if (k < K_NMIX) /* load, write_back: parts of ops, not ops */
					hall[j] += s->hist[k][j];
			}
		}
	}
	if (bad || started != cfg.nslots) {
		fprintf(stderr, "%s: %s failed (%d worker process(es))\n", kvbb_progname,
			cfg.mode->name, bad ? bad : cfg.procs);
		goto out;
	}
	if (cfg.mode->finish)
		cfg.mode->finish(&cfg, &total, xjson, sizeof(xjson), xtext, sizeof(xtext));
	if (cfg.json)
		print_json(&total, hall, seconds, ops_s, bytes_s, xjson);
	else
		print_text(&total, hall, seconds, ops_s, bytes_s, xtext);
	ret = 0;
out:
	free(pids);
	if (sh != MAP_FAILED && sh)
		munmap(sh, shsize);
	return ret;
}
