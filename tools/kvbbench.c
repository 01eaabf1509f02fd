// SPDX-License-Identifier: MIT
/*
 * kvbbench - load generator for kvbrokerd: latency and throughput of each data-path operation,
 * next to a plain memcpy baseline measured the same way.
 *
 * One invocation measures one MODE at one page size with --procs client processes. The parent
 * builds the layout, pre-populates the working set when the mode reads pages (and checks it is
 * resident, so a too-small pool is an error and not a silent miss rate), closes its connection,
 * then forks the workers. Each worker opens its own connection (a kvb_client must not cross a
 * fork), sets up its buffers, warms up (one untimed pass over the working set by default, so the
 * page faults of fresh mappings - the client's view of the pool, the broker's view of a new
 * registered buffer - stay out of the figures), reports ready and spins until the parent says
 * go, so the processes start within ~50 us of each other. Workers time every operation with CLOCK_MONOTONIC
 * (one clock read per op: the end of one op is the start of the next) into a log-linear
 * histogram (64 sub-buckets per power of two, <1.6% error) that lives in a shared anonymous
 * mapping; the parent merges the histograms for percentiles and sums each worker's own
 * ops/elapsed for throughput, so a straggler does not dilute the aggregate.
 *
 * Working sets default to at least 128 MiB (four times this machine's 32 MiB LLC) and every
 * copy walks a destination of the same size, so GET, ACQUIRE and the memcpy baseline all move
 * cold data into cold data and their ratio means something.
 *
 * Keys are 256 random-looking bits from splitmix64 (the broker hashes keys as uniformly random
 * SHA-256 output). Working-set keys depend only on the page size, so repeated runs against one
 * broker find their pages already stored; PUT keys include a per-run nonce so every PUT stores.
 *
 * Only the public API (kvbroker.h); no threads; every process single-threaded.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kvbroker.h"

enum mode { M_NOP, M_PUT, M_PUT_USER, M_GET, M_GET_USER, M_ACQUIRE, M_LOOKUP, M_MEMCPY };

static const struct {
	const char *name;
	int broker;   /* needs a connection */
	int populate; /* reads the working set: pre-populate it */
	const char *what;
} modes[] = {
	[M_NOP] = {"nop", 1, 0, "kvb_nop round trip through the rings"},
	[M_PUT] = {"put", 1, 0, "kvb_put of new keys from a registered host buffer"},
	[M_PUT_USER] = {"put-user", 1, 0, "kvb_put of new keys from malloc'd memory"},
	[M_GET] = {"get", 1, 1, "kvb_get into a registered host buffer (broker copies)"},
	[M_GET_USER] = {"get-user", 1, 1, "kvb_get into malloc'd memory (client copies)"},
	[M_ACQUIRE] = {"acquire", 1, 1, "kvb_acquire + read every byte + kvb_release"},
	[M_LOOKUP] = {"lookup", 1, 1, "kvb_lookup of --batch stored keys"},
	[M_MEMCPY] = {"memcpy", 0, 0, "memcpy of one page between buffers larger than the LLC"},
};
#define NMODES (sizeof(modes) / sizeof(modes[0]))

struct cfg {
	const char *socket;
	int json;
	enum mode mode;
	uint64_t page_req; /* --page */
	int kimi;	   /* --layout kimi */
	uint64_t pages;	   /* working set */
	int procs;
	double seconds;
	uint64_t iters; /* 0: run for seconds */
	uint32_t batch;
	uint64_t warmup;
	int read_sum; /* acquire: sum instead of copy */
	double timeout;
	size_t page_bytes;
	struct kvb_layout layout;
	uint64_t ws_seed, put_seed;
};

/* ---- latency histogram: log-linear, 64 sub-buckets per power of two of nanoseconds ---- */

#define H_SUB_BITS 6
#define H_SUB (1u << H_SUB_BITS)
#define H_BUCKETS ((64 - H_SUB_BITS + 1) * H_SUB)

static unsigned h_index(uint64_t v)
{
	unsigned e;

	if (v < H_SUB)
		return (unsigned)v;
	e = 63 - (unsigned)__builtin_clzll(v);
	return (e - H_SUB_BITS + 1) * H_SUB + (unsigned)((v >> (e - H_SUB_BITS)) & (H_SUB - 1));
}

/* Midpoint of a bucket, in ns: the error is at most half a bucket (0.8%). */
static double h_value(unsigned idx)
{
	unsigned e, sub;

	if (idx < H_SUB)
		return idx;
	e = idx / H_SUB + H_SUB_BITS - 1;
	sub = idx % H_SUB;
	return (double)((uint64_t)(H_SUB + sub) << (e - H_SUB_BITS)) +
	       (double)(1ull << (e - H_SUB_BITS)) / 2.0;
}

static double h_quantile(const uint64_t *h, double q)
{
	uint64_t total = 0, want, acc = 0;
	unsigned i;

	for (i = 0; i < H_BUCKETS; i++)
		total += h[i];
	if (!total)
		return 0;
	want = (uint64_t)ceil(q * (double)total);
	if (want < 1)
		want = 1;
	for (i = 0; i < H_BUCKETS; i++) {
		acc += h[i];
		if (acc >= want)
			return h_value(i);
	}
	return h_value(H_BUCKETS - 1);
}

/* ---- what the workers share with the parent (MAP_SHARED | MAP_ANONYMOUS, before fork) ---- */

struct slot {
	int rc; /* 0 ok, else failed: see err */
	uint64_t ops;
	uint64_t bytes;
	uint64_t dedup; /* PUTs that found the key stored */
	uint64_t sink;	/* acquire --read sum: keeps the reads alive */
	double elapsed;
	char err[160];
	uint64_t hist[H_BUCKETS];
};

struct shared {
	atomic_int ready; /* workers that finished set-up and warm-up */
	atomic_int go;	  /* 1 start, -1 abort */
	struct slot slot[];
};

static double now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static uint64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static uint64_t mix64(uint64_t x)
{
	x += 0x9e3779b97f4a7c15ull;
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
	x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
	return x ^ (x >> 31);
}

static kvb_key mk_key(uint64_t seed, uint64_t stream, uint64_t i)
{
	uint64_t h = mix64(seed ^ mix64(stream * 0x100000001b3ull ^ mix64(i)));
	kvb_key k;
	unsigned w;

	for (w = 0; w < 4; w++) {
		h = mix64(h + w);
		memcpy(k.b + 8 * w, &h, 8);
	}
	return k;
}

/* "64K", "1M", "4.5M", "1048576": binary multiples. 0 on garbage. */
static uint64_t parse_size(const char *s)
{
	static const char suffix[] = "kKmMgGtT";
	char *end;
	double v = strtod(s, &end);
	double mul = 1;

	if (end == s || v < 0)
		return 0;
	if (*end) {
		const char *u = strchr(suffix, *end);

		if (u) {
			mul = ldexp(1.0, 10 * (int)((u - suffix) / 2 + 1));
			end++;
		}
	}
	if (*end == 'i')
		end++;
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end)
		return 0;
	return (uint64_t)(v * mul + 0.5);
}

static const char *fmt_bytes(double b, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
	unsigned u = 0;

	while (b >= 1024.0 && u < 4) {
		b /= 1024.0;
		u++;
	}
	snprintf(buf, len, u ? "%.4g %s" : "%.0f %s", b, unit[u]);
	return buf;
}

/*
 * A one-component layout whose page is exactly cfg->page_req bytes: 64 tokens of page/64 bytes
 * in one layer when that divides, else one token of the whole page. --layout kimi instead takes
 * Kimi-K2.5's real MLA page: 61 layers x 1152 B (576 bf16 latent+rope) x 64 tokens = 4,497,408 B.
 */
static int build_layout(struct cfg *cfg)
{
	struct kvb_layout *l = &cfg->layout;
	uint64_t pb = cfg->page_req;

	memset(l, 0, sizeof(*l));
	l->kind = KVB_LAYOUT_MLA;
	l->tp_size = 1;
	l->ncomponents = 1;
	snprintf(l->comp[0].name, sizeof(l->comp[0].name), "kv");
	if (cfg->kimi) {
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
	cfg->page_bytes = (size_t)l->tokens_per_page * l->comp[0].num_layers *
			  l->comp[0].bytes_per_token_layer;
	return 0;
}

/* Page content: a fixed pattern with the key in the first 32 bytes, so reads can be checked. */
static void fill_page(uint8_t *p, size_t len, const kvb_key *k)
{
	size_t i;

	for (i = 0; i < len; i += 4096)
		memset(p + i, (int)(0xa5 ^ (i >> 12)), len - i < 4096 ? len - i : 4096);
	memcpy(p, k->b, len < 32 ? len : 32);
}

static int check_page(const uint8_t *p, size_t len, const kvb_key *k)
{
	return memcmp(p, k->b, len < 32 ? len : 32) ? -EBADMSG : 0;
}

static void *alloc_touched(size_t len)
{
	void *p = NULL;

	if (posix_memalign(&p, 4096, len))
		return NULL;
	memset(p, 0x5a, len); /* fault every page in before timing */
	return p;
}

static int connect_ns(const struct cfg *cfg, const char *name, kvb_client **c, uint32_t *ns)
{
	struct kvb_opts o;
	size_t pb = 0;
	int rc;

	memset(&o, 0, sizeof(o));
	o.socket_path = cfg->socket;
	o.name = name;
	rc = kvb_connect(&o, c);
	if (rc < 0)
		return rc;
	if (cfg->mode == M_NOP)
		return 0;
	rc = kvb_ns_open(*c, &cfg->layout, ns, &pb);
	if (rc == 0 && pb != cfg->page_bytes)
		rc = -EPROTO;
	if (rc < 0) {
		kvb_close(*c);
		*c = NULL;
	}
	return rc;
}

/* kvb_strerror() speaks of pages; a failed connect deserves words about sockets. */
static const char *connect_error(int rc)
{
	switch (rc) {
	case -ENOENT:
		return "no broker socket there";
	case -ECONNREFUSED:
		return "socket exists but no broker listens";
	case -EACCES:
	case -EPERM:
		return "permission denied by the broker";
	default:
		return kvb_strerror(rc);
	}
}

/*
 * Connects once in the parent, before any fork, so that a missing broker or a layout it refuses
 * is one clear line rather than a failure per worker.
 */
static int probe(const struct cfg *cfg)
{
	kvb_client *c = NULL;
	uint32_t ns;
	int rc = connect_ns(cfg, "kvbbench-probe", &c, &ns);

	if (rc < 0)
		fprintf(stderr, "kvbbench: cannot use the broker at %s: %s\n",
			cfg->socket ? cfg->socket : "the default socket", connect_error(rc));
	kvb_close(c);
	return rc;
}

/*
 * Stores the working set (keys that depend only on the layout) and checks that every page is
 * resident afterwards: when the pool cannot hold it, eviction would turn reads into misses.
 */
static int populate(const struct cfg *cfg, char *err, size_t errlen)
{
	kvb_client *c = NULL;
	uint32_t ns = 0, buf;
	uint64_t i, stored = 0;
	kvb_key *keys = NULL;
	uint8_t *page;
	size_t hits;
	int rc;

	rc = connect_ns(cfg, "kvbbench-populate", &c, &ns);
	if (rc < 0) {
		snprintf(err, errlen, "connect: %s", kvb_strerror(rc));
		return rc;
	}
	page = kvb_buf_alloc_host(c, cfg->page_bytes, &buf);
	keys = calloc(cfg->pages, sizeof(*keys));
	if (!page || !keys) {
		snprintf(err, errlen, "cannot allocate a %zu-byte host buffer", cfg->page_bytes);
		rc = -ENOMEM;
		goto out;
	}
	for (i = 0; i < cfg->pages; i++) {
		keys[i] = mk_key(cfg->ws_seed, 0, i);
		fill_page(page, cfg->page_bytes, &keys[i]);
		rc = kvb_put(c, ns, keys[i], page, cfg->page_bytes);
		if (rc < 0) {
			snprintf(err, errlen, "populate: put of page %" PRIu64 ": %s", i,
				 kvb_strerror(rc));
			goto out;
		}
		stored += rc == 0;
	}
	for (i = 0; i < cfg->pages; i += cfg->batch) {
		size_t n = cfg->pages - i < cfg->batch ? cfg->pages - i : cfg->batch;

		rc = kvb_lookup(c, ns, keys + i, n, &hits);
		if (rc < 0) {
			snprintf(err, errlen, "populate: lookup of %zu keys: %s", n,
				 kvb_strerror(rc));
			goto out;
		}
		if (hits != n) {
			snprintf(err, errlen,
				 "working set of %" PRIu64 " pages does not stay resident (%zu of "
				 "%zu keys at %" PRIu64 " found): use fewer --pages or a "
				 "larger pool",
				 cfg->pages, hits, n, i);
			rc = -ENOSPC;
			goto out;
		}
	}
	rc = 0;
out:
	free(keys);
	kvb_close(c); /* also unmaps the host buffer */
	return rc;
}

/* A worker's state: its connection, buffers and where it starts in the working set. */
struct wstate {
	const struct cfg *cfg;
	kvb_client *c;
	uint32_t ns;
	int idx;
	uint8_t *buf;	/* source (put) or destination (get, get-user, acquire, memcpy) */
	uint8_t *src;	/* memcpy source */
	uint64_t slots; /* pages that fit in buf */
	uint64_t start; /* this worker's first working-set page */
	kvb_key *keys;	/* lookup: the working-set keys */
	uint64_t dedup, sink;
	int verify;
};

/* The i-th operation of a worker. Returns the page bytes it moved (>= 0) or a negative errno. */
static int64_t do_op(struct wstate *w, uint64_t i)
{
	const struct cfg *cfg = w->cfg;
	size_t pb = cfg->page_bytes;
	uint8_t *slot = w->buf ? w->buf + (i % w->slots) * pb : NULL;
	struct kvb_lease lease;
	kvb_key key;
	size_t hits;
	int rc;

	switch (cfg->mode) {
	case M_NOP:
		rc = kvb_nop(w->c);
		return rc < 0 ? rc : 0;
	case M_PUT:
	case M_PUT_USER:
		key = mk_key(cfg->put_seed, (uint64_t)w->idx + 1, i);
		rc = kvb_put(w->c, w->ns, key, slot, pb);
		if (rc < 0)
			return rc;
		w->dedup += rc == 1;
		return (int64_t)pb;
	case M_GET:
	case M_GET_USER:
		key = mk_key(cfg->ws_seed, 0, (w->start + i) % cfg->pages);
		rc = kvb_get(w->c, w->ns, key, slot, pb);
		if (rc < 0)
			return rc;
		if ((size_t)rc != pb)
			return -EPROTO;
		if (w->verify && check_page(slot, pb, &key))
			return -EBADMSG;
		return (int64_t)pb;
	case M_ACQUIRE:
		key = mk_key(cfg->ws_seed, 0, (w->start + i) % cfg->pages);
		rc = kvb_acquire(w->c, w->ns, key, &lease);
		if (rc < 0)
			return rc;
		if (lease.len != pb) {
			kvb_release(w->c, &lease);
			return -EPROTO;
		}
		if (cfg->read_sum) {
			const uint64_t *p = lease.data;
			uint64_t s = 0;
			size_t k;

			for (k = 0; k < pb / 8; k++)
				s += p[k];
			w->sink += s;
		} else {
			memcpy(slot, lease.data, pb);
		}
		if (w->verify && check_page(lease.data, pb, &key)) {
			kvb_release(w->c, &lease);
			return -EBADMSG;
		}
		rc = kvb_release(w->c, &lease);
		return rc < 0 ? rc : (int64_t)pb;
	case M_LOOKUP: {
		uint64_t span = cfg->pages - cfg->batch + 1;
		uint64_t off = (w->start + i * 97) % span;

		rc = kvb_lookup(w->c, w->ns, w->keys + off, cfg->batch, &hits);
		if (rc < 0)
			return rc;
		return hits == cfg->batch ? 0 : -ENOENT;
	}
	case M_MEMCPY:
		memcpy(slot, w->src + ((i + w->slots / 2) % w->slots) * pb, pb);
		return (int64_t)pb;
	}
	return -EINVAL;
}

static void fail(struct slot *s, int rc, const char *what)
{
	s->rc = rc ? rc : -EIO;
	snprintf(s->err, sizeof(s->err), "%s: %s", what, kvb_strerror(rc));
}

/* A worker process: set up, warm up, wait for go, measure. Never returns. */
static void worker(const struct cfg *cfg, struct shared *sh, int idx)
{
	struct slot *s = &sh->slot[idx];
	uint64_t ws_bytes = cfg->pages * cfg->page_bytes, i, n, t0, t1, deadline;
	struct wstate w;
	char name[32];
	uint32_t buf;
	double start;
	int64_t r;
	int go, rc, ok = 0;

	memset(&w, 0, sizeof(w));
	w.cfg = cfg;
	w.idx = idx;
	w.start = cfg->pages * (uint64_t)idx / (uint64_t)cfg->procs;
	w.slots = cfg->pages;
	snprintf(name, sizeof(name), "kvbbench-%d", idx);
	if (modes[cfg->mode].broker) {
		rc = connect_ns(cfg, name, &w.c, &w.ns);
		if (rc < 0) {
			fail(s, rc, "connect");
			goto out;
		}
	}
	switch (cfg->mode) {
	case M_PUT:
	case M_GET:
		w.buf = kvb_buf_alloc_host(w.c, ws_bytes, &buf);
		if (w.buf)
			memset(w.buf, 0x3c, ws_bytes);
		ok = w.buf != NULL;
		break;
	case M_PUT_USER:
	case M_GET_USER:
	case M_ACQUIRE:
		w.buf = alloc_touched(ws_bytes);
		ok = w.buf != NULL;
		break;
	case M_MEMCPY:
		w.buf = alloc_touched(ws_bytes);
		w.src = alloc_touched(ws_bytes);
		ok = w.buf && w.src;
		break;
	case M_LOOKUP:
		w.keys = calloc(cfg->pages, sizeof(*w.keys));
		for (i = 0; w.keys && i < cfg->pages; i++)
			w.keys[i] = mk_key(cfg->ws_seed, 0, i);
		ok = w.keys != NULL;
		break;
	case M_NOP:
		ok = 1;
		break;
	}
	if (!ok) {
		fail(s, -ENOMEM, "buffers");
		goto out;
	}

	/* Warm-up, also the correctness check: every page read here must carry its key. */
	w.verify = 1;
	for (i = 0; i < cfg->warmup; i++) {
		r = do_op(&w, i);
		if (r < 0) {
			fail(s, (int)r, "warm-up");
			goto out;
		}
	}
	w.verify = 0;
	n = cfg->warmup; /* put: warm-up keys are not reused */
	if (cfg->mode != M_PUT && cfg->mode != M_PUT_USER)
		n = 0;

	atomic_fetch_add(&sh->ready, 1);
	while ((go = atomic_load(&sh->go)) == 0)
		usleep(50);
	if (go < 0)
		goto out;

	start = now_s();
	t0 = now_ns();
	deadline = cfg->iters ? UINT64_MAX : t0 + (uint64_t)(cfg->seconds * 1e9);
	for (i = 0; cfg->iters ? i < cfg->iters : 1; i++) {
		r = do_op(&w, n + i);
		t1 = now_ns();
		if (r < 0) {
			fail(s, (int)r, modes[cfg->mode].name);
			break;
		}
		s->hist[h_index(t1 - t0)]++;
		s->ops++;
		s->bytes += (uint64_t)r;
		t0 = t1;
		if (t1 >= deadline)
			break;
	}
	s->elapsed = now_s() - start;
	s->dedup = w.dedup;
	s->sink = w.sink;
out:
	if (s->rc)
		atomic_fetch_add(&sh->ready, 1); /* do not leave the parent waiting */
	/* Closing also unmaps a buffer from kvb_buf_alloc_host. */
	kvb_close(w.c);
	if (cfg->mode != M_PUT && cfg->mode != M_GET)
		free(w.buf);
	free(w.src);
	free(w.keys);
	_exit(s->rc ? 1 : 0);
}

static void usage(FILE *f)
{
	size_t i;

	fprintf(f, "usage: kvbbench [options] MODE\n"
		   "\n"
		   "modes:\n");
	for (i = 0; i < NMODES; i++)
		fprintf(f, "  %-9s %s\n", modes[i].name, modes[i].what);
	fprintf(f,
		"\n"
		"options:\n"
		"  --socket PATH   broker socket (default $KVB_SOCKET, then the default path)\n"
		"  --page SIZE     page size, K/M/G suffixes, fractions allowed (default 1M)\n"
		"  --layout kimi   Kimi-K2.5 MLA page: 61 layers x 1152 B x 64 tokens\n"
		"  --pages N       working set in pages (default: >= 128 MiB, 4x the LLC)\n"
		"  --procs N       client processes, each with its own connection (default 1)\n"
		"  --seconds S     measure for S seconds (default 2)\n"
		"  --iters N       measure N ops per process instead\n"
		"  --warmup N      untimed ops per process first (default: nop 1000, else N\n"
		"                  = --pages, one pass over the working set)\n"
		"  --batch N       lookup: keys per kvb_lookup (default 1024)\n"
		"  --read sum|copy acquire: sum the page as uint64 or copy it out (default copy)\n"
		"  --timeout S     give up after S seconds (default 60 + 2 x --seconds)\n"
		"  --json          one JSON object instead of text\n"
		"  -h, --help      this text\n"
		"\n"
		"GB/s are 1e9 bytes of page data per second; latencies are per op, all processes\n"
		"merged; ops/s and GB/s are summed over processes.\n");
}

static int parse_args(int argc, char **argv, struct cfg *cfg)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"page", required_argument, NULL, 'p'},
		{"layout", required_argument, NULL, 'L'},
		{"pages", required_argument, NULL, 'n'},
		{"procs", required_argument, NULL, 'P'},
		{"seconds", required_argument, NULL, 'S'},
		{"iters", required_argument, NULL, 'i'},
		{"warmup", required_argument, NULL, 'w'},
		{"batch", required_argument, NULL, 'b'},
		{"read", required_argument, NULL, 'r'},
		{"timeout", required_argument, NULL, 'T'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	long long warm = -1;
	size_t i;
	int opt;

	memset(cfg, 0, sizeof(*cfg));
	cfg->page_req = 1 << 20;
	cfg->procs = 1;
	cfg->seconds = 2;
	cfg->batch = 1024;
	while ((opt = getopt_long(argc, argv, "h", lopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			cfg->socket = optarg;
			break;
		case 'p':
			cfg->page_req = parse_size(optarg);
			break;
		case 'L':
			if (strcmp(optarg, "kimi")) {
				fprintf(stderr, "kvbbench: --layout: only 'kimi' is known\n");
				return -1;
			}
			cfg->kimi = 1;
			break;
		case 'n':
			cfg->pages = strtoull(optarg, NULL, 0);
			break;
		case 'P':
			cfg->procs = atoi(optarg);
			break;
		case 'S':
			cfg->seconds = atof(optarg);
			break;
		case 'i':
			cfg->iters = strtoull(optarg, NULL, 0);
			break;
		case 'w':
			warm = atoll(optarg);
			break;
		case 'b':
			cfg->batch = (uint32_t)strtoul(optarg, NULL, 0);
			break;
		case 'r':
			if (strcmp(optarg, "sum") && strcmp(optarg, "copy")) {
				fprintf(stderr, "kvbbench: --read takes sum or copy\n");
				return -1;
			}
			cfg->read_sum = !strcmp(optarg, "sum");
			break;
		case 'T':
			cfg->timeout = atof(optarg);
			break;
		case 'j':
			cfg->json = 1;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			return -1;
		}
	}
	if (optind != argc - 1) {
		fprintf(stderr, "kvbbench: exactly one MODE expected\n");
		return -1;
	}
	for (i = 0; i < NMODES; i++)
		if (!strcmp(argv[optind], modes[i].name))
			break;
	if (i == NMODES) {
		fprintf(stderr, "kvbbench: unknown mode '%s'\n", argv[optind]);
		return -1;
	}
	cfg->mode = (enum mode)i;
	if (build_layout(cfg) < 0 || cfg->page_bytes < 32) {
		fprintf(stderr, "kvbbench: bad --page (32 B .. 4 GiB)\n");
		return -1;
	}
	if (cfg->procs < 1 || cfg->procs > 256 || cfg->seconds <= 0 || cfg->batch < 1) {
		fprintf(stderr, "kvbbench: --procs 1..256, --seconds > 0, --batch >= 1\n");
		return -1;
	}
	if (!cfg->pages) {
		cfg->pages = ((128ull << 20) + cfg->page_bytes - 1) / cfg->page_bytes;
		if (cfg->pages < 8)
			cfg->pages = 8;
		if (cfg->mode == M_LOOKUP && cfg->pages < cfg->batch)
			cfg->pages = cfg->batch;
	}
	if (cfg->mode == M_LOOKUP && cfg->pages < cfg->batch) {
		fprintf(stderr, "kvbbench: lookup needs --pages >= --batch\n");
		return -1;
	}
	if (warm >= 0)
		cfg->warmup = (uint64_t)warm;
	else if (cfg->mode == M_NOP)
		cfg->warmup = 1000;
	else
		cfg->warmup = cfg->pages; /* one pass: faults of fresh mappings go untimed */
	if (cfg->timeout <= 0)
		cfg->timeout = 60 + 2 * cfg->seconds;
	cfg->ws_seed = mix64(0x6b76626265ull ^ cfg->page_bytes ^ ((uint64_t)cfg->kimi << 40));
	cfg->put_seed = mix64(now_ns() ^ ((uint64_t)getpid() << 32));
	return 0;
}

/* Waits for every worker, killing them all once the deadline passes. Returns failures. */
static int reap(pid_t *pids, int n, double deadline)
{
	int left = n, bad = 0, st, i, killed = 0;

	while (left > 0) {
		for (i = 0; i < n; i++) {
			if (pids[i] <= 0 || waitpid(pids[i], &st, WNOHANG) != pids[i])
				continue;
			pids[i] = 0;
			left--;
			if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
				bad++;
		}
		if (left > 0 && !killed && now_s() > deadline) {
			fprintf(stderr, "kvbbench: timed out; killing workers\n");
			for (i = 0; i < n; i++)
				if (pids[i] > 0)
					kill(pids[i], SIGKILL);
			killed = 1;
		}
		if (left > 0)
			usleep(2000);
	}
	return bad + killed;
}

int main(int argc, char **argv)
{
	struct cfg cfg;
	struct shared *sh;
	size_t shsize;
	pid_t *pids;
	uint64_t *hist, ops = 0, bytes = 0, dedup = 0;
	double deadline, seconds = 0, ops_s = 0, bytes_s = 0, p50, p90, p99, p999;
	char err[256], a[32], b[64];
	int i, j, bad, started, ret = 1;

	if (parse_args(argc, argv, &cfg) < 0) {
		usage(stderr);
		return 2;
	}
	if (modes[cfg.mode].broker && probe(&cfg) < 0)
		return 1;
	if (modes[cfg.mode].populate && populate(&cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "kvbbench: %s\n", err);
		return 1;
	}

	shsize = sizeof(*sh) + (size_t)cfg.procs * sizeof(struct slot);
	sh = mmap(NULL, shsize, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	pids = calloc((size_t)cfg.procs, sizeof(*pids));
	hist = calloc(H_BUCKETS, sizeof(*hist));
	if (sh == MAP_FAILED || !pids || !hist) {
		fprintf(stderr, "kvbbench: out of memory\n");
		goto out;
	}
	fflush(NULL);
	for (i = 0; i < cfg.procs; i++) {
		pids[i] = fork();
		if (pids[i] < 0) {
			fprintf(stderr, "kvbbench: fork: %s\n", strerror(errno));
			atomic_store(&sh->go, -1);
			reap(pids, i, now_s() + cfg.timeout);
			goto out;
		}
		if (pids[i] == 0)
			worker(&cfg, sh, i);
	}

	/* Start together: a worker that failed set-up counts as ready and makes us abort. */
	deadline = now_s() + cfg.timeout;
	while ((started = atomic_load(&sh->ready)) < cfg.procs && now_s() < deadline)
		usleep(200);
	for (i = 0; i < cfg.procs; i++)
		if (sh->slot[i].rc)
			started = -1;
	atomic_store(&sh->go, started == cfg.procs ? 1 : -1);
	bad = reap(pids, cfg.procs, deadline + cfg.seconds);

	for (i = 0; i < cfg.procs; i++) {
		struct slot *s = &sh->slot[i];

		if (s->rc)
			fprintf(stderr, "kvbbench: worker %d: %s\n", i, s->err);
		ops += s->ops;
		bytes += s->bytes;
		dedup += s->dedup;
		if (s->elapsed > seconds)
			seconds = s->elapsed;
		if (s->elapsed > 0) {
			ops_s += (double)s->ops / s->elapsed;
			bytes_s += (double)s->bytes / s->elapsed;
		}
		for (j = 0; j < (int)H_BUCKETS; j++)
			hist[j] += s->hist[j];
	}
	if (bad || started != cfg.procs) {
		fprintf(stderr, "kvbbench: %s failed (%d worker(s))\n", modes[cfg.mode].name,
			bad ? bad : cfg.procs);
		goto out;
	}
	p50 = h_quantile(hist, 0.50) / 1e3;
	p90 = h_quantile(hist, 0.90) / 1e3;
	p99 = h_quantile(hist, 0.99) / 1e3;
	p999 = h_quantile(hist, 0.999) / 1e3;

	if (cfg.json) {
		printf("{\"mode\":\"%s\",\"page_bytes\":%zu,\"procs\":%d,\"pages\":%" PRIu64
		       ",\"batch\":%u,\"ops\":%" PRIu64 ",\"seconds\":%.6f,\"ops_per_s\":%.1f,"
		       "\"gb_per_s\":%.4f,\"keys_per_s\":%.1f,\"p50_us\":%.3f,\"p90_us\":%.3f,"
		       "\"p99_us\":%.3f,\"p999_us\":%.3f,\"dedup\":%" PRIu64
		       ",\"layout\":\"%s\"}\n",
		       modes[cfg.mode].name, cfg.page_bytes, cfg.procs, cfg.pages,
		       cfg.mode == M_LOOKUP ? cfg.batch : 0, ops, seconds, ops_s, bytes_s / 1e9,
		       cfg.mode == M_LOOKUP ? ops_s * cfg.batch : 0.0, p50, p90, p99, p999, dedup,
		       cfg.kimi ? "kimi" : "flat");
		ret = 0;
		goto out;
	}
	if (cfg.mode == M_NOP)
		snprintf(b, sizeof(b), "no page");
	else
		snprintf(b, sizeof(b), "page %s (%zu B)",
			 fmt_bytes((double)cfg.page_bytes, a, sizeof(a)), cfg.page_bytes);
	printf("%s: %s, %d proc%s, %" PRIu64 " ops in %.2f s\n", modes[cfg.mode].name, b, cfg.procs,
	       cfg.procs > 1 ? "s" : "", ops, seconds);
	if (cfg.mode == M_NOP)
		printf("  %.0f ops/s\n", ops_s);
	else if (cfg.mode == M_LOOKUP)
		printf("  %.0f lookups/s of %u keys = %.2f M keys/s\n", ops_s, cfg.batch,
		       ops_s * cfg.batch / 1e6);
	else
		printf("  %.0f ops/s, %.2f GB/s, working set %" PRIu64 " pages (%s)%s\n", ops_s,
		       bytes_s / 1e9, cfg.pages,
		       fmt_bytes((double)(cfg.pages * cfg.page_bytes), b, sizeof(b)),
		       dedup ? ", some PUTs found their key stored" : "");
	printf("  latency us: p50 %.2f  p90 %.2f  p99 %.2f  p99.9 %.2f\n", p50, p90, p99, p999);
	ret = 0;
out:
	free(hist);
	free(pids);
	if (sh != MAP_FAILED)
		munmap(sh, shsize);
	return ret;
}
