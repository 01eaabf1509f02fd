// SPDX-License-Identifier: MIT
/*
 * modes_broker.c - kvbbench's kvbroker modes and the memcpy limit they are measured against.
 *
 * Each mode is set-up (untimed: connect, namespace, buffers), one timed op, tear-down. Read
 * modes need their working set stored first: prepare() stores it from the parent before any
 * fork and checks it is resident (or, with --misses ok|fill, reports how much is), so a pool too
 * small for the working set is an error and not a silent miss rate.
 *
 * Working-set keys depend only on the page size, so repeated runs against one broker find their
 * pages stored; PUT keys include a per-run nonce, so every PUT stores (and evicts once the pool
 * is full, which is part of what is timed).
 *
 * engine: one op is one request of an inference engine: the keys of its token prefix (a system
 * prompt shared by many requests, one of several conversation branches under it, and pages of
 * its own), one LOOKUP for all of them, the pages found loaded in kvb_submit batches and the
 * pages that were not written back the same way. Keys are real SHA-256 chains (kvb_key_chain)
 * over synthetic tokens. --tp makes each engine several TP ranks (processes or threads) that
 * serve the same requests; --rate makes arrivals open-loop; load latency (arrival to the last
 * page loaded) and write-back time are reported apart from the request's whole time; --layers
 * puts the KV buffer in an engine's layer-first layout behind a view and loads layer groups.
 *
 * mla-tp: --procs ranks of one MLA model (TP=procs) store the same pages and load them back,
 * through the broker (one shared namespace: the first PUT of a page copies it, the others find
 * it stored) or, with --private, into a private pool per rank as engines do today. Reports the
 * copies made and the memory they take.
 *
 * Only the public API (kvbroker.h).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "fastcopy.h"
#include "kvbbench.h"

/* Connects and, unless l is NULL, opens l's namespace (checking its page size). */
static int connect_ns(const struct kvbb_cfg *cfg, const struct kvb_layout *l, const char *name,
		      kvb_client **c, uint32_t *ns)
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
	if (!l)
		return 0;
	rc = kvb_ns_open(*c, l, ns, &pb);
	if (rc == 0 && pb != cfg->page_bytes)
		rc = -EPROTO;
	if (rc < 0) {
		kvb_close(*c);
		*c = NULL;
	}
	return rc;
}

/* nop needs no namespace. */
static const struct kvb_layout *layout_of(const struct kvbb_cfg *cfg)
{
	return strcmp(cfg->mode->name, "nop") ? &cfg->layout : NULL;
}

/* One clear line from the parent, before any fork, for a missing broker or a refused layout. */
static int prep_probe(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	kvb_client *c = NULL;
	uint32_t ns;
	int rc = connect_ns(cfg, NULL, "kvbbench-probe", &c, &ns);

	/* A failed connect deserves words about sockets; a refused layout, about pages. */
	if (rc < 0) {
		kvb_connect_error(rc, cfg->socket, err, errlen);
		return rc;
	}
	kvb_close(c);
	c = NULL;
	rc = connect_ns(cfg, layout_of(cfg), "kvbbench-probe", &c, &ns);
	if (rc < 0)
		snprintf(err, errlen, "the broker refuses this layout: %s", kvb_strerror(rc));
	kvb_close(c);
	return rc;
}

/*
 * Stores the working set and checks that every page is resident afterwards (any tier: LOOKUP
 * counts pages on disk too). With --misses the check only reports.
 */
static int prep_populate(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	kvb_client *c = NULL;
	uint32_t ns = 0, buf;
	uint64_t i, found = 0;
	kvb_key *keys = NULL;
	uint8_t *page;
	size_t hits;
	int rc;

	rc = prep_probe(cfg, err, errlen);
	if (rc < 0)
		return rc;
	rc = connect_ns(cfg, &cfg->layout, "kvbbench-populate", &c, &ns);
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
		keys[i] = kvbb_key(cfg->ws_seed, 0, i);
		kvbb_fill_page(page, cfg->page_bytes, &keys[i]);
		rc = kvb_put(c, ns, keys[i], page, cfg->page_bytes);
		if (rc < 0) {
			snprintf(err, errlen, "populate: put of page %" PRIu64 ": %s", i,
				 kvb_strerror(rc));
			goto out;
		}
	}
	for (i = 0; i < cfg->pages; i++) {
		rc = kvb_lookup(c, ns, keys + i, 1, &hits);
		if (rc < 0) {
			snprintf(err, errlen, "populate: lookup: %s", kvb_strerror(rc));
			goto out;
		}
		found += hits;
	}
	rc = 0;
	if (found != cfg->pages && !cfg->miss_ok && !cfg->miss_fill) {
		snprintf(err, errlen,
			 "working set of %" PRIu64 " pages does not stay resident (%" PRIu64
			 " found): use fewer --pages, a larger pool, or --misses ok|fill",
			 cfg->pages, found);
		rc = -ENOSPC;
	}
out:
	free(keys);
	kvb_close(c); /* also unmaps the host buffer */
	return rc;
}

/* ---- per-thread set-up ---- */

static int setup_conn_as(struct kvbb_w *w, const struct kvb_layout *l, char *err, size_t errlen)
{
	char name[32];
	int rc;

	snprintf(name, sizeof(name), "kvbbench-%d", w->idx);
	rc = connect_ns(w->cfg, l, name, &w->c, &w->ns);
	if (rc < 0)
		snprintf(err, errlen, "connect: %s", kvb_strerror(rc));
	return rc;
}

static int setup_conn(struct kvbb_w *w, char *err, size_t errlen)
{
	return setup_conn_as(w, layout_of(w->cfg), err, errlen);
}

/* --host-buf memfd / fdcopy: a memfd of our own, registered by fd, mapped here. */
static int own_memfd(struct kvbb_w *w, size_t len, char *err, size_t errlen)
{
	int fdcopy = w->cfg->host_buf == KVBB_BUF_FDCOPY, rc;
	int fd = memfd_create("kvbbench", MFD_CLOEXEC | (fdcopy ? 0 : MFD_ALLOW_SEALING));
	void *p;

	if (fd < 0 || ftruncate(fd, (off_t)len) < 0) {
		rc = -errno;
		snprintf(err, errlen, "memfd of %zu bytes: %s", len, strerror(errno));
		if (fd >= 0)
			close(fd);
		return rc;
	}
	p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
	if (p == MAP_FAILED) {
		rc = -errno;
		snprintf(err, errlen, "mmap of the memfd: %s", strerror(errno));
		close(fd);
		return rc;
	}
	rc = kvb_buf_register_host_fd(w->c, fd, 0, len, p, fdcopy ? KVB_BUF_FDCOPY : KVB_BUF_SEAL,
				      &w->bufid);
	close(fd);
	if (rc) {
		snprintf(err, errlen, "kvb_buf_register_host_fd: %s", kvb_strerror(rc));
		munmap(p, len);
		return rc;
	}
	w->buf = p;
	w->buf_reg = 1;
	w->buf_own = len;
	memset(w->buf, 0x3c, len);
	return 0;
}

static int alloc_reg(struct kvbb_w *w, char *err, size_t errlen)
{
	size_t len = w->slots * w->cfg->page_bytes;

	if (w->cfg->host_buf == KVBB_BUF_USER) {
		w->buf = kvbb_alloc_touched(len); /* freed by teardown: not buf_reg */
		if (!w->buf) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
		return 0;
	}
	if (w->cfg->host_buf != KVBB_BUF_ALLOC)
		return own_memfd(w, len, err, errlen);
	w->buf = kvb_buf_alloc_host(w->c, len, &w->bufid);
	if (!w->buf) {
		snprintf(err, errlen, "kvb_buf_alloc_host of %zu bytes failed", len);
		return -ENOMEM;
	}
	w->buf_reg = 1;
	memset(w->buf, 0x3c, len);
	return 0;
}

static int setup_reg(struct kvbb_w *w, char *err, size_t errlen)
{
	int rc = setup_conn(w, err, errlen);

	return rc < 0 ? rc : alloc_reg(w, err, errlen);
}

static int setup_user(struct kvbb_w *w, char *err, size_t errlen)
{
	int rc = setup_conn(w, err, errlen);

	if (rc < 0)
		return rc;
	w->buf = kvbb_alloc_touched(w->slots * w->cfg->page_bytes);
	if (!w->buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static int setup_memcpy(struct kvbb_w *w, char *err, size_t errlen)
{
	size_t len = w->slots * w->cfg->page_bytes;

	w->buf = kvbb_alloc_touched(len);
	w->src = kvbb_alloc_touched(len);
	if (!w->buf || !w->src) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return 0;
}

static int setup_lookup(struct kvbb_w *w, char *err, size_t errlen)
{
	uint64_t i;
	int rc = setup_conn(w, err, errlen);

	if (rc < 0)
		return rc;
	w->keys = calloc(w->cfg->pages, sizeof(*w->keys));
	if (!w->keys) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (i = 0; i < w->cfg->pages; i++)
		w->keys[i] = kvbb_key(w->cfg->ws_seed, 0, i);
	return 0;
}

static int setup_nop(struct kvbb_w *w, char *err, size_t errlen)
{
	return setup_conn(w, err, errlen);
}

static void teardown(struct kvbb_w *w)
{
	kvb_close(w->c); /* also unmaps a buffer from kvb_buf_alloc_host */
	w->c = NULL;
	if (w->buf_own)
		munmap(w->buf, w->buf_own); /* the broker let go of it at kvb_close */
	else if (!w->buf_reg)
		free(w->buf);
	w->buf = NULL;
	free(w->src);
	free(w->keys);
	free(w->req);
	free(w->tok);
}

/* ---- ops ---- */

static uint8_t *slot_of(struct kvbb_w *w, uint64_t i)
{
	return w->buf + (i % w->slots) * w->cfg->page_bytes;
}

/*
 * Where the i-th read lands: the rotating slot, or with --dst hot always the first, so that
 * the copy writes into cache-hot memory (an engine reusing one staging page) instead of a
 * destination larger than the LLC.
 */
static uint8_t *dst_of(struct kvbb_w *w, uint64_t i)
{
	return w->cfg->dst_hot ? w->buf : slot_of(w, i);
}

static int64_t op_nop(struct kvbb_w *w, uint64_t i)
{
	int rc = kvb_nop(w->c);

	(void)i;
	return rc < 0 ? rc : 0;
}

static int64_t put_new(struct kvbb_w *w, uint64_t i)
{
	kvb_key key = kvbb_key(w->cfg->put_seed, (uint64_t)w->idx + 1, i);
	int rc = kvb_put(w->c, w->ns, key, slot_of(w, i), w->cfg->page_bytes);

	if (rc < 0)
		return rc;
	w->s->dedup += rc == 1;
	w->s->stored += rc == 0;
	return (int64_t)w->cfg->page_bytes;
}

/*
 * Hands n ops to the broker (kvb_submit, as often as the SQ takes them) and reaps all n
 * completions into comp[], in the order they came; at[], when not NULL, gets the time each
 * was reaped.
 */
static int submit_all(struct kvbb_w *w, const struct kvb_op *ops, size_t n,
		      struct kvb_completion *comp, uint64_t *at)
{
	size_t sent = 0, done = 0;
	int rc;

	while (done < n) {
		if (sent < n) {
			rc = kvb_submit(w->c, ops + sent, n - sent);
			if (rc < 0)
				return rc;
			sent += (size_t)rc;
		}
		rc = kvb_reap(w->c, comp + done, n - done, 1, 10000);
		if (rc < 0)
			return rc;
		if (at) {
			uint64_t t = clock_ns();

			for (int j = 0; j < rc; j++)
				at[done + (size_t)j] = t;
		}
		done += (size_t)rc;
	}
	return 0;
}

static void count_put(struct kvbb_w *w, uint32_t flags)
{
	w->s->dedup += (flags & KVB_CQEF_EXISTED) != 0;
	w->s->stored += (flags & KVB_CQEF_EXISTED) == 0;
}

/*
 * --qd N (get, put): one op is N GETs or PUTs handed to the broker with one kvb_submit and all
 * reaped before the next op, which is how an engine moves the pages of one request. Pages
 * i*N .. i*N+N-1 of the thread's sequence, each in its own slot of the registered buffer.
 */
static int64_t batch_io(struct kvbb_w *w, uint64_t i, int put)
{
	const struct kvbb_cfg *cfg = w->cfg;
	struct kvb_op ops[KVBB_MAX_QD];
	struct kvb_completion comp[KVBB_MAX_QD];
	size_t pb = cfg->page_bytes, n = cfg->qd, j;
	int64_t moved = 0;
	int rc;

	memset(ops, 0, n * sizeof(ops[0]));
	for (j = 0; j < n; j++) {
		uint64_t idx = i * n + j;

		ops[j].opcode = put ? KVB_OP_PUT : KVB_OP_GET;
		ops[j].ns = w->ns;
		ops[j].buf = w->bufid;
		ops[j].key = put ? kvbb_key(cfg->put_seed, (uint64_t)w->idx + 1, idx)
				 : kvbb_key(cfg->ws_seed, 0, kvbb_pick(w, idx));
		ops[j].off = (put || !cfg->dst_hot ? idx % w->slots : j) * pb;
		ops[j].user_data = j;
	}
	rc = submit_all(w, ops, n, comp, NULL);
	if (rc < 0)
		return rc;
	for (j = 0; j < n; j++) {
		int32_t res = comp[j].res;

		if (res == -ENOENT && !put && (cfg->miss_ok || cfg->miss_fill)) {
			w->s->misses++;
			continue;
		}
		if (res < 0)
			return res;
		if (put)
			count_put(w, comp[j].flags);
		moved += (int64_t)pb;
	}
	for (j = 0; w->verify && !put && j < n; j++)
		if (kvbb_check_page(w->buf + ops[j].off, pb, &ops[j].key) && !cfg->miss_ok &&
		    !cfg->miss_fill)
			return -EBADMSG;
	return moved;
}

static int64_t op_put(struct kvbb_w *w, uint64_t i)
{
	w->kind = K_PUT;
	if (w->cfg->qd > 1 && w->buf_reg)
		return batch_io(w, i, 1);
	return put_new(w, i);
}

/* A read that found nothing: an error, a counted miss, or a counted miss that stores the page. */
static int64_t on_miss(struct kvbb_w *w, kvb_key key, uint8_t *slot)
{
	const struct kvbb_cfg *cfg = w->cfg;
	int rc;

	if (!cfg->miss_ok && !cfg->miss_fill)
		return -ENOENT;
	w->s->misses++;
	if (!cfg->miss_fill)
		return 0;
	memcpy(slot, key.b, sizeof(key.b));
	rc = kvb_put(w->c, w->ns, key, slot, cfg->page_bytes);
	if (rc < 0)
		return rc;
	w->s->stored += rc == 0;
	return (int64_t)cfg->page_bytes;
}

static int64_t op_get(struct kvbb_w *w, uint64_t i)
{
	size_t pb = w->cfg->page_bytes;
	uint8_t *slot = dst_of(w, i);
	kvb_key key = kvbb_key(w->cfg->ws_seed, 0, kvbb_pick(w, i));
	int rc;

	w->kind = K_GET;
	if (w->cfg->qd > 1 && w->buf_reg)
		return batch_io(w, i, 0);
	rc = kvb_get(w->c, w->ns, key, slot, pb);
	if (rc == -ENOENT)
		return on_miss(w, key, slot);
	if (rc < 0)
		return rc;
	if ((size_t)rc != pb)
		return -EPROTO;
	if (w->verify && kvbb_check_page(slot, pb, &key))
		return -EBADMSG;
	return (int64_t)pb;
}

/* A lease of a page read whole: summed (--read sum), or copied by the library's or glibc's copy. */
static int64_t acquire_read(struct kvbb_w *w, uint64_t i, int libcopy)
{
	const struct kvbb_cfg *cfg = w->cfg;
	size_t pb = cfg->page_bytes;
	kvb_key key = kvbb_key(cfg->ws_seed, 0, kvbb_pick(w, i));
	struct kvb_lease lease;
	int rc;

	w->kind = K_ACQUIRE;
	rc = kvb_acquire(w->c, w->ns, key, &lease);
	if (rc == -ENOENT && (cfg->miss_ok || cfg->miss_fill)) {
		w->s->misses++;
		return 0;
	}
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
		w->s->sink += s;
	} else if (libcopy) {
		rc = kvb_lease_copy(&lease, 0, dst_of(w, i), pb);
		if (rc < 0) {
			kvb_release(w->c, &lease);
			return rc;
		}
	} else {
		memcpy(dst_of(w, i), lease.data, pb);
	}
	/* --verify: what was copied, where a copy was made (the lease itself when summed). */
	if (w->verify && kvbb_check_page(cfg->read_sum ? lease.data : dst_of(w, i), pb, &key)) {
		kvb_release(w->c, &lease);
		return -EBADMSG;
	}
	rc = kvb_release(w->c, &lease);
	return rc < 0 ? rc : (int64_t)pb;
}

static int64_t op_acquire(struct kvbb_w *w, uint64_t i)
{
	return acquire_read(w, i, 0);
}

static int64_t op_acquire_copy(struct kvbb_w *w, uint64_t i)
{
	return acquire_read(w, i, 1);
}

static int64_t op_lookup(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	uint64_t span = cfg->pages - cfg->batch + 1, off;
	size_t hits;
	int rc;

	w->kind = K_LOOKUP;
	if (cfg->dist == D_SEQ)
		off = (w->start + i * 97) % span;
	else
		off = kvbb_pick(w, i) % span;
	rc = kvb_lookup(w->c, w->ns, w->keys + off, cfg->batch, &hits);
	if (rc < 0)
		return rc;
	if (hits != cfg->batch) {
		if (!cfg->miss_ok && !cfg->miss_fill)
			return -ENOENT;
		w->s->misses += cfg->batch - hits;
	}
	return 0;
}

static int64_t op_memcpy(struct kvbb_w *w, uint64_t i)
{
	size_t pb = w->cfg->page_bytes;

	memcpy(dst_of(w, i), w->src + ((i + w->slots / 2) % w->slots) * pb, pb);
	return (int64_t)pb;
}

/* memcpy-nt: the same copy with kvb_copy() (streaming stores from KVB_COPY_NT_MIN up). */
static int64_t op_memcpy_nt(struct kvbb_w *w, uint64_t i)
{
	size_t pb = w->cfg->page_bytes;

	kvb_copy(dst_of(w, i), w->src + ((i + w->slots / 2) % w->slots) * pb, pb);
	return (int64_t)pb;
}

/*
 * memcpy-stream: streaming stores at every size (kvb_copy_nt), as the broker writes a PUT into
 * the pool: the bound of a PUT, and, paired, how --pair treats an op that leaves no dirty lines
 * for the memcpy after it to write back (docs/benchmarks.md, verdict runs 29-30).
 */
static int64_t op_memcpy_stream(struct kvbb_w *w, uint64_t i)
{
	size_t pb = w->cfg->page_bytes;

	kvb_copy_nt(dst_of(w, i), w->src + ((i + w->slots / 2) % w->slots) * pb, pb);
	return (int64_t)pb;
}

/* mix: draws the kind of each op from the --mix weights. */
static int64_t op_mix(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	unsigned r = (unsigned)(kvbb_rand(&w->rng) % cfg->mix_total), k;

	for (k = K_GET; k < K_NMIX - 1 && r >= cfg->mix[k]; k++)
		r -= cfg->mix[k];
	switch (k) {
	case K_PUT:
		return op_put(w, i);
	case K_LOOKUP:
		return op_lookup(w, i);
	case K_ACQUIRE:
		return op_acquire(w, i);
	default:
		return op_get(w, i);
	}
}

static int setup_mix(struct kvbb_w *w, char *err, size_t errlen)
{
	int rc = setup_reg(w, err, errlen);
	uint64_t i;

	if (rc < 0)
		return rc;
	w->keys = calloc(w->cfg->pages, sizeof(*w->keys));
	if (!w->keys) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (i = 0; i < w->cfg->pages; i++)
		w->keys[i] = kvbb_key(w->cfg->ws_seed, 0, i);
	return 0;
}

/* ---- engine: requests over a tree of shared prefixes ---- */

static uint32_t req_pages(const struct kvbb_cfg *cfg)
{
	return cfg->prefix_pages + cfg->branch_pages + cfg->suffix_pages;
}

static void tokens_of(const struct kvbb_cfg *cfg, uint32_t *tok, uint64_t a, uint64_t b, uint64_t c)
{
	uint64_t h = kvbb_mix64(a ^ kvbb_mix64(b ^ kvbb_mix64(c)));
	uint32_t t;

	for (t = 0; t < cfg->layout.tokens_per_page; t++) {
		h = kvbb_mix64(h + t);
		tok[t] = (uint32_t)(h % 200000); /* a vocabulary-sized id */
	}
}

/* Chains the keys of every prefix and branch once, in the parent. */
static int prep_engine(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	uint32_t per = cfg->prefix_pages + cfg->branches * cfg->branch_pages, p, k, b;
	uint32_t *tok = calloc(cfg->layout.tokens_per_page, sizeof(*tok));
	int rc = prep_probe(cfg, err, errlen);

	if (rc < 0 || !tok) {
		free(tok);
		return rc < 0 ? rc : -ENOMEM;
	}
	cfg->tree_keys = calloc((size_t)cfg->prefixes * per, sizeof(kvb_key));
	if (!cfg->tree_keys) {
		free(tok);
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (p = 0; p < cfg->prefixes; p++) {
		kvb_key *row = cfg->tree_keys + (size_t)p * per;

		for (k = 0; k < cfg->prefix_pages; k++) {
			tokens_of(cfg, tok, cfg->ws_seed, p, k);
			row[k] = kvb_key_chain(k ? &row[k - 1] : NULL, tok,
					       cfg->layout.tokens_per_page);
		}
		for (b = 0; b < cfg->branches; b++) {
			kvb_key *br = row + cfg->prefix_pages + (size_t)b * cfg->branch_pages;

			for (k = 0; k < cfg->branch_pages; k++) {
				const kvb_key *parent = k ? &br[k - 1]
							: cfg->prefix_pages
								? &row[cfg->prefix_pages - 1]
								: NULL;

				tokens_of(cfg, tok, cfg->ws_seed + 1 + b, p, k);
				br[k] = kvb_key_chain(parent, tok, cfg->layout.tokens_per_page);
			}
		}
	}
	free(tok);
	return 0;
}

/*
 * --layers: the rank's KV buffer laid out as an engine's (SGLang's and vLLM's per-layer KV
 * tensors: one region per component and layer, token slots bytes_per_token_layer apart), handed
 * to the broker as a view, so that a load can move a range of layers of every page.
 */
static int engine_view(struct kvbb_w *w, char *err, size_t errlen)
{
	const struct kvb_layout *l = &w->cfg->layout;
	uint64_t tokens = w->slots * l->tokens_per_page, base = 0;
	struct kvb_view_part *parts;
	uint32_t c, k, n = 0;
	int rc;

	for (c = 0; c < l->ncomponents; c++)
		n += l->comp[c].num_layers;
	parts = calloc(n, sizeof(*parts));
	if (!parts) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	for (c = 0, n = 0; c < l->ncomponents; c++) {
		for (k = 0; k < l->comp[c].num_layers; k++, n++) {
			parts[n].buf = w->bufid;
			parts[n].stride = l->comp[c].bytes_per_token_layer;
			parts[n].base = base;
			base += tokens * parts[n].stride;
		}
	}
	rc = kvb_view_create(w->c, w->ns, parts, n, &w->view);
	free(parts);
	if (rc < 0)
		snprintf(err, errlen, "kvb_view_create: %s", kvb_strerror(rc));
	return rc;
}

static int setup_engine(struct kvbb_w *w, char *err, size_t errlen)
{
	struct kvb_layout l = w->cfg->layout;
	int rc;

	if (w->slots < req_pages(w->cfg))
		w->slots = req_pages(w->cfg);
	/* --tp: each rank opens the namespace as itself (MLA ranks resolve to one). */
	l.tp_rank = (uint32_t)w->idx % l.tp_size;
	rc = setup_conn_as(w, &l, err, errlen);
	if (rc < 0)
		return rc;
	rc = alloc_reg(w, err, errlen);
	if (rc < 0)
		return rc;
	w->req = calloc(req_pages(w->cfg), sizeof(*w->req));
	w->tok = calloc(w->cfg->layout.tokens_per_page, sizeof(*w->tok));
	if (!w->req || !w->tok) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	return w->cfg->layer_groups ? engine_view(w, err, errlen) : 0;
}

/* Where page slot i of the rank's KV buffer is, for an op: a buffer offset, or a view's slot. */
static void engine_target(const struct kvbb_w *w, struct kvb_op *op, uint64_t i)
{
	i %= w->slots;
	if (w->cfg->layer_groups) {
		op->flags = KVB_OPF_VIEW;
		op->buf = w->view;
		op->off = i * w->cfg->layout.tokens_per_page;
	} else {
		op->buf = w->bufid;
		op->off = i * w->cfg->page_bytes;
	}
}

/*
 * Every layer of a computed page carries a mark: its key, the layer folded into the first
 * byte, at the start of that layer's tokens (in the view's region of the layer, or in the
 * page's [layer][token] run; kvbbench's layouts have one component). A write-back stamps them;
 * the warm-up wipes them before a load and checks each layer came back with its own, so a
 * load that skipped, misplaced or cut short a layer fails it.
 */
enum { MARK_STAMP, MARK_WIPE, MARK_CHECK };

static int engine_marks(struct kvbb_w *w, uint64_t i, const kvb_key *key, int what)
{
	const struct kvb_layout *l = &w->cfg->layout;
	size_t run = (size_t)l->tokens_per_page * l->comp[0].bytes_per_token_layer;
	size_t len = run < sizeof(*key) ? run : sizeof(*key);

	i %= w->slots;
	for (uint32_t layer = 0; layer < l->comp[0].num_layers; layer++) {
		uint8_t *at = w->buf + (w->cfg->layer_groups
						? (layer * w->slots + i) * run
						: i * w->cfg->page_bytes + layer * run);
		kvb_key mark = *key;

		mark.b[0] ^= (uint8_t)layer;
		if (what == MARK_STAMP)
			memcpy(at, mark.b, len);
		else if (what == MARK_WIPE)
			memset(at, 0, len);
		else if (memcmp(at, mark.b, len))
			return -EBADMSG;
	}
	return 0;
}

/*
 * --layers G: the request's hits loaded as an engine that computes layer by layer loads them:
 * G layer groups in layer order, every page's group g before any page's group g + 1, up to --qd
 * view GETs in flight and never a wait between groups. The first group loaded is when layer 0
 * can start computing (load_first); a page missing in any group lowers *first_miss to it.
 */
static int engine_load_layers(struct kvbb_w *w, uint32_t hits, uint64_t base, uint32_t *first_miss)
{
	const struct kvbb_cfg *cfg = w->cfg;
	uint32_t groups = cfg->layer_groups, layers = cfg->layout.comp[0].num_layers;
	uint32_t qd = cfg->qd ? cfg->qd : KVBB_MAX_QD, left0 = hits;
	uint64_t total = (uint64_t)groups * hits, sent = 0, done = 0;
	struct kvb_op ops[KVBB_MAX_QD];
	struct kvb_completion comp[KVBB_MAX_QD];
	int rc;

	while (done < total) {
		uint32_t n = 0;

		while (sent + n < total && sent + n - done < qd) {
			uint64_t k = sent + n;
			uint32_t g = (uint32_t)(k / hits), p = (uint32_t)(k % hits);
			uint32_t lf = g * layers / groups;

			memset(&ops[n], 0, sizeof(ops[n]));
			ops[n].opcode = KVB_OP_GET;
			ops[n].key = w->req[p];
			engine_target(w, &ops[n], base + p);
			ops[n].layer_first = (uint16_t)lf;
			ops[n].layer_count = (uint16_t)((g + 1) * layers / groups - lf);
			ops[n].user_data = k;
			n++;
		}
		if (n) {
			rc = kvb_submit(w->c, ops, n);
			if (rc < 0)
				return rc;
			sent += (uint64_t)rc;
		}
		rc = kvb_reap(w->c, comp, KVBB_MAX_QD, 1, 10000);
		if (rc < 0)
			return rc;
		for (int j = 0; j < rc; j++) {
			uint64_t k = comp[j].user_data;

			if (comp[j].res == -ENOENT) {
				if (k % hits < *first_miss)
					*first_miss = (uint32_t)(k % hits);
			} else if (comp[j].res < 0) {
				return comp[j].res;
			}
			if (k < hits && !--left0)
				kvbb_record(w, K_FIRST, clock_ns() - w->t_start);
		}
		done += (uint64_t)rc;
	}
	return 0;
}

/*
 * One kvb_submit of n page ops (GETs or PUTs, page j of the request in slot base + j), all
 * reaped. A GET that finds nothing (evicted since the LOOKUP) lowers *first_miss to its page;
 * PUTs count what they stored.
 */
static int engine_batch(struct kvbb_w *w, const kvb_key *keys, uint32_t from, uint32_t n,
			uint64_t base, int put, uint32_t *first_miss)
{
	struct kvb_op ops[KVBB_MAX_QD];
	struct kvb_completion comp[KVBB_MAX_QD];
	uint32_t j;
	int rc;

	memset(ops, 0, n * sizeof(ops[0]));
	for (j = 0; j < n; j++) {
		ops[j].opcode = put ? KVB_OP_PUT : KVB_OP_GET;
		ops[j].ns = w->ns;
		ops[j].key = keys[from + j];
		engine_target(w, &ops[j], base + from + j);
		ops[j].user_data = from + j;
	}
	rc = submit_all(w, ops, n, comp, NULL);
	for (j = 0; !rc && j < n; j++) {
		if (!put && comp[j].res == -ENOENT) {
			if (comp[j].user_data < *first_miss)
				*first_miss = (uint32_t)comp[j].user_data;
			continue;
		}
		if (comp[j].res < 0)
			return comp[j].res;
		if (put)
			count_put(w, comp[j].flags);
	}
	return rc;
}

/*
 * One request, as an engine serves it: LOOKUP of its chain, the pages found loaded in batches
 * of --qd (kvb_submit into the registered KV buffer), then the pages computed (here: stamped)
 * written back in batches. Load latency (arrival to the last page loaded: what delays the
 * first token) and write-back time go to histograms of their own. With --tp every rank of an
 * engine runs the same request (same keys, same arrival): MLA ranks each load every page into
 * their own buffer, and their PUTs of one page make one copy (the rest find it stored).
 */
static int64_t op_engine(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	uint32_t n = req_pages(cfg), per = cfg->prefix_pages + cfg->branches * cfg->branch_pages;
	uint32_t qd = cfg->qd ? cfg->qd : KVBB_MAX_QD, *tok = w->tok, j, hits32, miss;
	size_t pb = cfg->page_bytes, hits = 0;
	uint64_t p, b, base = i * n, t_load;
	const kvb_key *row;
	int rc;

	if (cfg->dist == D_ZIPF)
		p = kvbb_zipf_draw(&cfg->zipf, &w->rng);
	else if (cfg->dist == D_UNIFORM)
		p = kvbb_rand(&w->rng) % cfg->prefixes;
	else
		p = ((uint64_t)w->group + i) % cfg->prefixes;
	b = cfg->branches ? kvbb_rand(&w->rng) % cfg->branches : 0;
	row = cfg->tree_keys + p * per;
	memcpy(w->req, row, cfg->prefix_pages * sizeof(kvb_key));
	if (cfg->branch_pages)
		memcpy(w->req + cfg->prefix_pages, row + cfg->prefix_pages + b * cfg->branch_pages,
		       cfg->branch_pages * sizeof(kvb_key));
	for (j = cfg->prefix_pages + cfg->branch_pages; j < n; j++) {
		tokens_of(cfg, tok, cfg->put_seed, ((uint64_t)w->group << 40) ^ i, j);
		w->req[j] = kvb_key_chain(j ? &w->req[j - 1] : NULL, tok,
					  cfg->layout.tokens_per_page);
	}
	rc = kvb_lookup(w->c, w->ns, w->req, n, &hits);
	if (rc < 0)
		return rc;
	w->s->pg_hits += hits;
	w->s->pg_total += n;
	hits32 = (uint32_t)hits;
	miss = hits32;
	for (j = 0; w->verify && j < hits32; j++)
		engine_marks(w, base + j, &w->req[j], MARK_WIPE);
	if (cfg->layer_groups && hits32) {
		rc = engine_load_layers(w, hits32, base, &miss);
		if (rc < 0)
			return rc;
	}
	for (j = 0; !cfg->layer_groups && j < hits32; j += qd) {
		rc = engine_batch(w, w->req, j, hits32 - j < qd ? hits32 - j : qd, base, 0, &miss);
		if (rc < 0)
			return rc;
	}
	if (miss < hits32) { /* evicted since the lookup: recomputed and stored from there on */
		w->s->misses += hits32 - miss;
		hits32 = miss;
	}
	t_load = clock_ns();
	kvbb_record(w, K_LOAD, t_load - w->t_start);
	for (j = 0; j < n; j++) {
		if (j >= hits32)
			engine_marks(w, base + j, &w->req[j], MARK_STAMP);
		else if (w->verify && engine_marks(w, base + j, &w->req[j], MARK_CHECK))
			return -EBADMSG;
	}
	for (j = hits32; j < n; j += qd) {
		rc = engine_batch(w, w->req, j, n - j < qd ? n - j : qd, base, 1, &miss);
		if (rc < 0)
			return rc;
	}
	if (hits32 < n)
		kvbb_record(w, K_WRITE, clock_ns() - t_load);
	return (int64_t)(n * pb);
}

/* ---- mla-tp: TP ranks storing the same pages ---- */

static int prep_tp(struct kvbb_cfg *cfg, char *err, size_t errlen)
{
	uint32_t *tok = calloc(cfg->layout.tokens_per_page, sizeof(*tok));
	uint64_t k;

	if (!tok)
		return -ENOMEM;
	cfg->tree_keys = calloc(cfg->pages, sizeof(kvb_key));
	if (!cfg->tree_keys) {
		free(tok);
		return -ENOMEM;
	}
	/* Fresh keys per run (put_seed): every run starts from pages nobody stored. */
	for (k = 0; k < cfg->pages; k++) {
		tokens_of(cfg, tok, cfg->put_seed, 7, k);
		cfg->tree_keys[k] = kvb_key_chain(k ? &cfg->tree_keys[k - 1] : NULL, tok,
						  cfg->layout.tokens_per_page);
	}
	free(tok);
	if (cfg->private_pools)
		return 0;
	return prep_probe(cfg, err, errlen);
}

/*
 * Waits (at most 10 s) until the broker's background thread has no job left (STATS bg_jobs):
 * it populates the broker's mapping of each buffer just registered, 10-50 ms of CPU per rank's
 * 69 MiB, and a timed run that started meanwhile measured that thread beside the copies (on
 * 2 vCPUs, more CPU inside the load phase than the copies themselves). An engine registers its
 * buffers at start-up, long before its first load. Each rank waits after its own
 * registration, so when the last is ready every populate is done. A broker that does not
 * report the figure (older, or a tenant's view) is not waited for.
 */
static void bg_settle(struct kvbb_w *w)
{
	for (int i = 0; i < 2000; i++) {
		char *js = NULL;
		cJSON *root, *n;
		double left = 0;

		if (kvb_stats_json(w->c, &js) < 0)
			return;
		root = cJSON_Parse(js);
		free(js);
		n = root ? cJSON_GetObjectItem(root, "bg_jobs") : NULL;
		if (cJSON_IsNumber(n))
			left = n->valuedouble;
		cJSON_Delete(root);
		if (left <= 0)
			return;
		usleep(5000);
	}
}

static int setup_tp(struct kvbb_w *w, char *err, size_t errlen)
{
	const struct kvbb_cfg *cfg = w->cfg;
	struct kvb_layout l = cfg->layout;
	uint64_t k;
	int rc;

	w->slots = cfg->pages;
	if (cfg->private_pools) {
		/* The engine's private host pool, pinned and touched up front as engines do. */
		w->src = kvbb_alloc_touched(cfg->pages * cfg->page_bytes);
		w->buf = kvbb_alloc_touched(cfg->pages * cfg->page_bytes);
		if (!w->src || !w->buf) {
			snprintf(err, errlen, "out of memory");
			return -ENOMEM;
		}
	} else {
		/* Each rank opens the namespace as itself: MLA ranks must resolve to one. */
		l.tp_rank = (uint32_t)w->idx % l.tp_size;
		rc = setup_conn_as(w, &l, err, errlen);
		if (rc < 0)
			return rc;
		rc = alloc_reg(w, err, errlen);
		if (rc < 0)
			return rc;
	}
	for (k = 0; k < cfg->pages; k++)
		kvbb_fill_page(slot_of(w, k), cfg->page_bytes, &cfg->tree_keys[k]);
	if (!cfg->private_pools)
		bg_settle(w);
	return 0;
}

/*
 * mla-tp --qd N: the b-th batch of the load phase, pages b*N .. b*N+N-1 loaded as an engine
 * loads a request's pages, all at once: one kvb_submit of N GETs into the registered buffer
 * (private pools: the same N memcpys). The batch is the op (kind "load": what delays the
 * request's first token); each page is also recorded as a "get" sample, timed from the batch's
 * start to its own completion (when its layers could be used).
 */
static int64_t tp_load_batch(struct kvbb_w *w, uint64_t b)
{
	const struct kvbb_cfg *cfg = w->cfg;
	struct kvb_op ops[KVBB_MAX_QD];
	struct kvb_completion comp[KVBB_MAX_QD];
	uint64_t at[KVBB_MAX_QD];
	size_t pb = cfg->page_bytes, n = cfg->qd, j;
	uint64_t k0 = b * n, t0 = clock_ns();
	int rc;

	if (k0 + n > cfg->pages)
		n = (size_t)(cfg->pages - k0);
	w->kind = K_LOAD;
	if (!b)
		w->s->load_t0 = t0;
	if (cfg->private_pools) {
		for (j = 0; j < n; j++) {
			memcpy(slot_of(w, k0 + j), w->src + (k0 + j) * pb, pb);
			kvbb_record(w, K_GET, clock_ns() - t0);
		}
		goto check;
	}
	memset(ops, 0, n * sizeof(ops[0]));
	for (j = 0; j < n; j++) {
		ops[j].opcode = KVB_OP_GET;
		ops[j].ns = w->ns;
		ops[j].buf = w->bufid;
		ops[j].key = cfg->tree_keys[k0 + j];
		ops[j].off = (k0 + j) * pb;
		ops[j].user_data = j;
	}
	rc = submit_all(w, ops, n, comp, at);
	if (rc < 0)
		return rc;
	for (j = 0; j < n; j++) {
		if (comp[j].res < 0)
			return comp[j].res;
		if ((size_t)comp[j].res != pb)
			return -EPROTO;
		kvbb_record(w, K_GET, at[j] - t0);
	}
check:
	w->s->load_t1 = clock_ns();
	for (j = 0; j < n; j++)
		if (kvbb_check_page(slot_of(w, k0 + j), pb, &cfg->tree_keys[k0 + j]))
			return -EBADMSG;
	return (int64_t)(n * pb);
}

static int64_t op_tp(struct kvbb_w *w, uint64_t i)
{
	const struct kvbb_cfg *cfg = w->cfg;
	size_t pb = cfg->page_bytes;
	uint64_t k = i % cfg->pages;
	const kvb_key *key = &cfg->tree_keys[k];
	uint8_t *slot = slot_of(w, k);
	int rc;

	if (i < cfg->pages) { /* store the rank's page, then wipe its marks for the load's check */
		w->kind = K_PUT;
		if (cfg->private_pools) {
			memcpy(w->src + k * pb, slot, pb);
			w->s->stored++;
		} else {
			rc = kvb_put(w->c, w->ns, *key, slot, pb);
			if (rc < 0)
				return rc;
			w->s->stored += rc == 0;
			w->s->dedup += rc == 1;
		}
		kvbb_clobber_page(slot, pb);
		return (int64_t)pb;
	}
	if (cfg->qd > 1)
		return tp_load_batch(w, i - cfg->pages);
	w->kind = K_GET; /* load it back */
	if (!k)
		w->s->load_t0 = clock_ns();
	if (cfg->private_pools) {
		memcpy(slot, w->src + k * pb, pb);
	} else {
		rc = kvb_get(w->c, w->ns, *key, slot, pb);
		if (rc < 0)
			return rc;
	}
	w->s->load_t1 = clock_ns();
	return kvbb_check_page(slot, pb, key) ? -EBADMSG : (int64_t)pb;
}

/* The broker's own account of the namespace: pages and bytes it holds. */
static void ns_usage(const struct kvbb_cfg *cfg, double *pages, double *bytes)
{
	kvb_client *c = NULL;
	struct kvb_opts o;
	char *js = NULL;
	cJSON *root, *arr, *it;

	*pages = *bytes = -1;
	memset(&o, 0, sizeof(o));
	o.socket_path = cfg->socket;
	o.name = "kvbbench-stats";
	o.flags = KVB_CONNECT_CONTROL;
	if (kvb_connect(&o, &c) < 0)
		return;
	if (kvb_stats_json(c, &js) == 0 && (root = cJSON_Parse(js))) {
		arr = cJSON_GetObjectItem(root, "namespaces");
		cJSON_ArrayForEach(it, arr)
		{
			cJSON *m = cJSON_GetObjectItem(it, "model");

			if (cJSON_IsString(m) && !strcmp(m->valuestring, cfg->layout.model)) {
				*pages = cJSON_GetNumberValue(cJSON_GetObjectItem(it, "pages"));
				*bytes = cJSON_GetNumberValue(cJSON_GetObjectItem(it, "bytes"));
			}
		}
		cJSON_Delete(root);
	}
	free(js);
	kvb_close(c);
}

static void finish_tp(const struct kvbb_cfg *cfg, const struct kvbb_slot *t, char *json,
		      size_t jlen, char *text, size_t tlen)
{
	double pages, bytes, ideal = (double)cfg->pages * (double)cfg->page_bytes;

	if (cfg->private_pools) {
		pages = (double)cfg->pages * cfg->nslots;
		bytes = pages * (double)cfg->page_bytes;
	} else {
		ns_usage(cfg, &pages, &bytes);
	}
	double load_ms = t->load_t1 > t->load_t0 ? (double)(t->load_t1 - t->load_t0) / 1e6 : 0;

	/* load_ms: the load phase, first rank's first GET to last rank's last (one clock). */
	snprintf(json, jlen,
		 "\"tp\":%d,\"pool\":\"%s\",\"prefix_pages\":%" PRIu64 ",\"copies\":%" PRIu64
		 ",\"dedup_puts\":%" PRIu64 ",\"pages_held\":%.0f,\"mem_bytes\":%.0f,"
		 "\"mem_x_one_copy\":%.3f,\"load_ms\":%.3f",
		 cfg->nslots, cfg->private_pools ? "private" : "kvbroker", cfg->pages, t->stored,
		 t->dedup, pages, bytes, bytes / ideal, load_ms);
	snprintf(text, tlen,
		 "  TP=%d ranks stored %" PRIu64 " pages each: %" PRIu64 " copies made, %" PRIu64
		 " PUTs found the page stored; %.0f pages held in %.1f MiB (%.2fx one copy);"
		 " load phase %.1f ms\n",
		 cfg->nslots, cfg->pages, t->stored, t->dedup, pages, bytes / 1048576,
		 bytes / ideal, load_ms);
}

static void finish_engine(const struct kvbb_cfg *cfg, const struct kvbb_slot *t, char *json,
			  size_t jlen, char *text, size_t tlen)
{
	double hr = t->pg_total ? (double)t->pg_hits / (double)t->pg_total : 0;

	snprintf(json, jlen,
		 "\"request_pages\":%u,\"request_bytes\":%zu,\"pages_asked\":%" PRIu64
		 ",\"pages_hit\":%" PRIu64 ",\"page_hit_ratio\":%.4f,\"pages_stored\":%" PRIu64
		 ",\"engines\":%d,\"tp\":%u,\"layer_groups\":%u",
		 req_pages(cfg), req_pages(cfg) * cfg->page_bytes, t->pg_total, t->pg_hits, hr,
		 t->stored, cfg->nslots / (int)cfg->tp, cfg->tp, cfg->layer_groups);
	snprintf(text, tlen,
		 "  %d engine(s) of TP=%u, %u pages per request, %.1f%% of pages found stored%s\n",
		 cfg->nslots / (int)cfg->tp, cfg->tp, req_pages(cfg), 100 * hr,
		 cfg->layer_groups ? ", loaded in layer groups through a view" : "");
}

const struct kvbb_mode kvbb_broker_modes[] = {
	{"memcpy", "memcpy of one page between private buffers larger than the LLC", MF_DATA, NULL,
	 setup_memcpy, op_memcpy, teardown, NULL, 0},
	{"memcpy-nt", "memcpy as the data path copies (kvb_copy: streaming stores >= 256 KiB)",
	 MF_DATA, NULL, setup_memcpy, op_memcpy_nt, teardown, NULL, 0},
	{"memcpy-stream", "memcpy with streaming stores at every size, as a PUT into the pool",
	 MF_DATA, NULL, setup_memcpy, op_memcpy_stream, teardown, NULL, 0},
	{"nop", "kvb_nop round trip through the rings", MF_BROKER, prep_probe, setup_nop, op_nop,
	 teardown, NULL, 1000},
	{"put", "kvb_put of new keys from a registered host buffer", MF_BROKER | MF_DATA,
	 prep_probe, setup_reg, op_put, teardown, NULL, 0},
	{"put-user", "kvb_put of new keys from malloc'd memory", MF_BROKER | MF_DATA, prep_probe,
	 setup_user, op_put, teardown, NULL, 0},
	{"get", "kvb_get into a registered host buffer (broker copies)", MF_BROKER | MF_DATA,
	 prep_populate, setup_reg, op_get, teardown, NULL, 0},
	{"get-user", "kvb_get into malloc'd memory (client copies)", MF_BROKER | MF_DATA,
	 prep_populate, setup_user, op_get, teardown, NULL, 0},
	{"acquire", "kvb_acquire + memcpy (or --read sum) + kvb_release", MF_BROKER | MF_DATA,
	 prep_populate, setup_user, op_acquire, teardown, NULL, 0},
	{"acquire-copy", "kvb_acquire + kvb_lease_copy + kvb_release", MF_BROKER | MF_DATA,
	 prep_populate, setup_user, op_acquire_copy, teardown, NULL, 0},
	{"lookup", "kvb_lookup of --batch stored keys", MF_BROKER, prep_populate, setup_lookup,
	 op_lookup, teardown, NULL, 0},
	{"mix", "--mix of get, put, lookup, acquire (registered buffer)", MF_BROKER | MF_DATA,
	 prep_populate, setup_mix, op_mix, teardown, NULL, 0},
	{"engine", "engine requests over shared prefixes: LOOKUP, GET hits, PUT misses",
	 MF_BROKER | MF_DATA, prep_engine, setup_engine, op_engine, teardown, finish_engine, 100},
	{"mla-tp", "--procs MLA ranks PUT then GET the same pages (--private: own pools)",
	 MF_BROKER | MF_DATA, prep_tp, setup_tp, op_tp, teardown, finish_tp, 0},
	{NULL, NULL, 0, NULL, NULL, NULL, NULL, NULL, 0},
};
