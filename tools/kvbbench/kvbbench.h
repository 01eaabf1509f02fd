/* SPDX-License-Identifier: MIT */
/*
 * kvbbench.h - what the files of the load generator share.
 *
 * kvbbench is one driver (main.c: options, processes and threads, the start barrier, timing,
 * histograms, progress line, text and JSON reports) and a set of MODES, each a table entry with
 * a per-thread set-up, one timed operation and a tear-down. The driver knows nothing about what
 * an operation does, so every mode - kvbroker's ops, the memcpy limit, and the Redis and
 * memcached peers of kvbbench-peers - is timed by the very same loop and reported the same way,
 * which is what makes their figures comparable.
 *
 * Two binaries: kvbbench (table.c: kvbroker and memcpy modes) is built by `make`;
 * kvbbench-peers (table_peers.c: those plus redis-* and memc-*) only by `make bench`, so
 * building and testing kvbroker never needs hiredis or libmemcached.
 *
 * Threads: the parent sets up and forks --procs workers; each runs --threads threads, each
 * thread with its own connection and its own struct slot (nothing else is shared between
 * threads, so modes need no locks).
 */
#ifndef KVBBENCH_H
#define KVBBENCH_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "clock.h" /* clock_ns(), clock_now(): every timing */
#include "size.h"  /* size_parse(): --page, --working-set */
#include "kvbroker.h"

/* ---- latency histogram: log-linear, 64 sub-buckets per power of two of nanoseconds ---- */

#define H_SUB_BITS 6
#define H_SUB (1u << H_SUB_BITS)
#define H_BUCKETS ((64 - H_SUB_BITS + 1) * H_SUB)

unsigned kvbb_h_index(uint64_t v);
double kvbb_h_quantile(const uint64_t *h, double q);

/*
 * Kinds of op inside one mode: "mix" uses get..acquire; "engine" adds samples of the parts of
 * its requests (load, write_back, and with --layers load_first: arrival to the first layer group
 * of every page loaded), which are not ops of their own (not in the overall figures).
 */
enum kvbb_kind { K_MAIN, K_GET, K_PUT, K_LOOKUP, K_ACQUIRE, K_LOAD, K_WRITE, K_FIRST, NKIND };
#define K_NMIX (K_ACQUIRE + 1) /* the kinds --mix draws from */
extern const char *const kvbb_kind_name[NKIND];

enum kvbb_dist { D_SEQ, D_UNIFORM, D_ZIPF };

#define KVBB_MAX_QD 128

/* Zipf(s) over 0..n-1 by inverse CDF: rank 0 is the hottest. */
struct kvbb_zipf {
	uint64_t n;
	double *cdf;
};

int kvbb_zipf_init(struct kvbb_zipf *z, uint64_t n, double s);
uint64_t kvbb_zipf_draw(const struct kvbb_zipf *z, uint64_t *rng);

struct kvbb_mode;

struct kvbb_cfg {
	const char *socket; /* kvbroker socket */
	const char *server; /* peers: host:port or /path/to/unix.sock */
	int binary;	    /* memc-*: binary protocol */
	const struct kvbb_mode *mode;
	int json;
	int progress;
	uint64_t page_req; /* --page */
	int kimi;	   /* --layout kimi */
	uint64_t pages;	   /* working set in pages */
	int procs;
	int threads;
	double seconds;
	uint64_t iters; /* 0: run for seconds */
	uint32_t batch;
	uint32_t qd; /* get, put: ops per kvb_submit, all reaped before the next */
	uint64_t warmup;
	int read_sum; /* acquire: sum instead of copy */
	int host_buf; /* get, put, mix: KVBB_BUF_* (where the registered buffer comes from) */
	double timeout;
	unsigned gap_us; /* sleep between ops, untimed: lets the broker fall asleep */
	double rate;	 /* > 0: open loop, ops (engine: requests) per second in all (--rate) */
	int dst_hot;	 /* --dst hot: every copy lands in one reused (cache-hot) destination */
	int pair;	 /* --pair: each op followed by a memcpy of its bytes, timed apart */
	uint32_t tp;	 /* engine: TP ranks per engine (--tp) */
	uint32_t layer_groups; /* engine --layers: loads through a view, in layer groups */
	enum kvbb_dist dist;
	double zipf_s;
	struct kvbb_zipf zipf; /* over the working set, or over prefixes in engine mode */
	int miss_ok;	       /* get: a miss is counted, not an error */
	int miss_fill;	       /* get: a miss is counted and the page PUT (cache fill) */
	unsigned mix[NKIND];   /* mix: weights per kind */
	unsigned mix_total;
	/* engine: requests over a tree of shared prefixes */
	uint32_t prefixes, prefix_pages, branches, branch_pages, suffix_pages;
	kvb_key *tree_keys; /* [prefix][prefix_pages + branches * branch_pages] */
	/* mla-tp */
	int private_pools;
	int leave_early; /* --leave-early: no end barrier */
	size_t page_bytes;
	struct kvb_layout layout;
	uint64_t ws_seed, put_seed;
	int nslots; /* procs * threads */
};

/* What one thread reports; lives in a shared mapping the parent reads. */
struct kvbb_slot {
	_Atomic uint64_t prog_ops; /* for the progress line, relaxed */
	_Atomic uint64_t prog_bytes;
	int rc; /* 0 ok, else failed: see err */
	uint64_t ops;
	uint64_t bytes;
	uint64_t dedup;	   /* PUTs that found the key stored */
	uint64_t stored;   /* PUTs that stored */
	uint64_t misses;   /* reads that found no page */
	uint64_t pg_hits;  /* engine: pages found by LOOKUP */
	uint64_t pg_total; /* engine: pages asked for */
	uint64_t sink;	   /* acquire --read sum: keeps the reads alive */
	uint64_t load_t0;  /* mla-tp: CLOCK_MONOTONIC ns of the first GET's start, */
	uint64_t load_t1;  /* and of the last GET's end (the load phase) */
	uint64_t late;	   /* open loop: ops that started after their arrival time */
	uint64_t pair_ns;  /* --pair: the paired memcpys' time */
	double elapsed;
	char err[160];
	uint64_t kops[NKIND];
	uint64_t kns[NKIND]; /* summed latencies, ns: the mean beside the quantiles */
	uint64_t hist[NKIND][H_BUCKETS];
};

/*
 * --host-buf: the registered host buffer of get/put/mix. ALLOC: kvb_buf_alloc_host (the
 * library's sealed memfd); MEMFD: our own memfd, sealed, kvb_buf_register_host_fd (the broker
 * maps it); FDCOPY: a memfd made as SGLang 0.5.23's alloc_shm makes it (unsealable),
 * registered with KVB_BUF_FDCOPY (the broker copies with pread/pwrite). USER: no registered
 * buffer, plain memory (kvb_put through staging: a filled PUT; kvb_get through a lease), so
 * that mla-tp's ranks PUT as an engine with its own host memory does.
 */
enum { KVBB_BUF_ALLOC = 0, KVBB_BUF_MEMFD, KVBB_BUF_FDCOPY, KVBB_BUF_USER };

/* A thread's state. */
struct kvbb_w {
	const struct kvbb_cfg *cfg;
	struct kvbb_slot *s;
	int idx; /* slot index, 0..nslots-1 */
	kvb_client *c;
	uint32_t ns, bufid;
	uint32_t view;	   /* engine --layers: the view over buf, an engine's layer-first layout */
	uint8_t *buf;	   /* registered or private destination/source ring */
	int buf_reg;	   /* buf came from kvb_buf_alloc_host (kvb_close unmaps it) */
	size_t buf_own;	   /* > 0: buf is our own memfd mapping of this many bytes (--host-buf) */
	uint8_t *src;	   /* memcpy source, private pool */
	uint8_t *pair_src; /* --pair: the paired memcpys' private source and destination */
	uint8_t *pair_dst;
	int pair_hot;	/* --pair --dst hot: pair_dst is one page, reused */
	uint64_t slots; /* pages that fit in buf */
	uint64_t start; /* this thread's first working-set page */
	kvb_key *keys;	/* lookup: the working-set keys */
	kvb_key *req;	/* engine: one request's keys */
	uint32_t *tok;	/* engine: one page's token ids */
	uint64_t rng;
	int verify;
	int kind;  /* set by op(): which histogram */
	int group; /* engine --tp: which engine this rank belongs to (ranks share requests) */
	uint64_t t_start; /* the driver's start of this op (its arrival time, open loop), ns */
	void *peer;
};

#define MF_BROKER 1u /* connects to kvbrokerd: probe first */
#define MF_DATA 2u   /* moves page data: GB/s means something */

struct kvbb_mode {
	const char *name;
	const char *what;
	unsigned flags;
	/* In the parent before fork (probe, populate); may be NULL. */
	int (*prepare)(struct kvbb_cfg *cfg, char *err, size_t errlen);
	/* Per thread, untimed. */
	int (*setup)(struct kvbb_w *w, char *err, size_t errlen);
	/* The i-th timed op: page bytes moved (>= 0) or a negative errno. */
	int64_t (*op)(struct kvbb_w *w, uint64_t i);
	void (*teardown)(struct kvbb_w *w);
	/* In the parent after the run: extra JSON members ("a":1,"b":2, no braces) and text. */
	void (*finish)(const struct kvbb_cfg *cfg, const struct kvbb_slot *total, char *json,
		       size_t jlen, char *text, size_t tlen);
	/* Default warm-up when --warmup is not given; 0 means one pass over the working set. */
	uint64_t warmup;
};

/* table.c or table_peers.c: every mode this binary has, NULL-terminated lists of modes, each
 * list ending with an entry whose name is NULL. */
extern const struct kvbb_mode *const kvbb_sets[];
extern const char kvbb_progname[];

extern const struct kvbb_mode kvbb_broker_modes[];
extern const struct kvbb_mode kvbb_redis_modes[];
extern const struct kvbb_mode kvbb_memc_modes[];

/* ---- helpers (util.c) ---- */

uint64_t kvbb_mix64(uint64_t x);
uint64_t kvbb_rand(uint64_t *state);
kvb_key kvbb_key(uint64_t seed, uint64_t stream, uint64_t i);
const char *kvbb_fmt_bytes(double b, char *buf, size_t len);
void kvbb_fill_page(uint8_t *p, size_t len, const kvb_key *k);
int kvbb_check_page(const uint8_t *p, size_t len, const kvb_key *k);
/* Wipes what kvbb_check_page() looks at: a page read back into the same memory is then checked. */
void kvbb_clobber_page(uint8_t *p, size_t len);
void *kvbb_alloc_touched(size_t len);
/* The working-set page the i-th read of this thread touches, by --dist. */
uint64_t kvbb_pick(struct kvbb_w *w, uint64_t i);
void kvbb_fail(struct kvbb_slot *s, int rc, const char *what);
/* One sample of a kind of its own inside an op (engine: load and write-back apart). */
void kvbb_record(struct kvbb_w *w, enum kvbb_kind kind, uint64_t ns);
/* Peers name pages by text keys: "kvbb:<page bytes>:<index>". Returns the length. */
int kvbb_text_key(char *out, size_t len, size_t page_bytes, uint64_t i);

#endif /* KVBBENCH_H */
