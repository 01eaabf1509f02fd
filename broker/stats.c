// SPDX-License-Identifier: MIT
/*
 * stats.c - the broker's statistics as one JSON document (the STATS control reply, read by
 * kvbctl). The shape is documented in docs/protocol.md; fields are only ever added. Loop thread.
 *
 * [tenant-stats] Under --tenants uid|gid a client that is neither root nor the broker's uid
 * reads its own tenant's view: its namespaces, its clients, its partition of the pool and of
 * the disk, counters summed over those; and of the node only what its configuration says
 * (engine, slab size, watermarks, disk and remote state). Left out: other tenants'
 * namespaces (model names), clients (pids, names, GPUs), and every node-wide activity figure
 * (copy engine, disk I/O and remote counters, the request engine, handshakes), which would
 * show another tenant's traffic. The operator (root or the broker's uid) reads everything,
 * as does --metrics-listen, which only the operator can enable.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "options.h"
#include "watch.h"
#include "text.h"

/* Who reads the document [tenant-stats]. */
struct stats_view {
	int all;	 /* the operator: everything */
	uint32_t tenant; /* else this tenant key's view */
	int part;	 /* its partition, -1 while it holds none */
};

static int ns_visible(const struct broker *b, const struct stats_view *v, uint32_t id)
{
	return v->all || (v->part >= 0 && b->store.ns_part[id] == (uint32_t)v->part);
}

static int client_visible(const struct stats_view *v, const struct session *s)
{
	return v->all || (s->tenant_bound && s->tenant == v->tenant);
}

/* The members of src named in keys (NULL-terminated), copied: a tenant's part of an object. */
static cJSON *pick(cJSON *src, const char *const keys[])
{
	cJSON *o = cJSON_CreateObject();

	for (uint32_t i = 0; keys[i]; i++) {
		cJSON *it = cJSON_GetObjectItemCaseSensitive(src, keys[i]);

		if (it)
			cJSON_AddItemToObject(o, keys[i], cJSON_Duplicate(it, 1));
	}
	cJSON_Delete(src);
	return o;
}

static void num(cJSON *o, const char *k, double v)
{
	cJSON_AddNumberToObject(o, k, v);
}

/*
 * A string a client chose (model, name, GPU bus id), as valid UTF-8: the document must be
 * (json.load and every strict parser refuse it otherwise); invalid bytes become U+FFFD. cJSON
 * escapes the control characters.
 */
static void add_text(cJSON *o, const char *key, const char *s, size_t n)
{
	char buf[3 * 256 + 1];

	cJSON_AddStringToObject(o, key, text_utf8(buf, sizeof(buf), s, n < 256 ? n : 256));
}

/* [dir] Bytes of partition part's first arena its directory takes (not pool.bytes_total's). */
static uint64_t dir_bytes_of(const struct broker *b, uint32_t part)
{
	return b->store.dir[part].h ? b->pool.arena[b->pool.part[part].first].dir_bytes : 0;
}

/* [dir] Pages in every partition's directory now (0), or ever left out of one (1). */
static uint64_t stats_dir_sum(const struct broker *b, int full)
{
	uint64_t n = 0;

	for (uint32_t p = 0; p < POOL_MAX_PARTS; p++)
		n += full ? b->store.dir[p].full : b->store.dir[p].entries;
	return n;
}

/* [tenant-lend] What a sparse pool's slabs may hold in all. */
static uint64_t pool_budget(const struct broker *b)
{
	uint64_t t = 0;

	for (uint32_t i = 0; i < KVB_MAX_ARENAS; i++)
		t += b->pool.budget[i];
	return t;
}

/* Bytes of pages in each arena's slabs. */
static void arenas_used(const struct store *st, uint64_t used[POOL_MAX_ARENAS])
{
	for (uint32_t i = 0; i < st->nslabs; i++) {
		const struct slab *sl = &st->slabs[i];

		if (sl->cls >= 0)
			used[sl->arena] += (uint64_t)sl->used * st->cls[sl->cls].slot_bytes;
	}
}

static cJSON *arena_json(const struct broker *b, uint32_t i, uint64_t used)
{
	cJSON *a = cJSON_CreateObject();

	num(a, "id", i);
	num(a, "node", b->pool.arena[i].node);
	num(a, "bytes_total", (double)b->pool.arena[i].size);
	num(a, "bytes_used", (double)used);
	num(a, "partition", b->pool.arena[i].part);
	if (b->pool.sparse) { /* [tenant-lend] counted, and what the memfd holds */
		num(a, "resident_bytes", (double)b->store.ar[i].resident);
		num(a, "rss_bytes", (double)store_arena_rss(&b->store, i));
	}
	cJSON_AddStringToObject(a, "page_size", hugepage_name(b->pool.arena[i].page_size));
	cJSON_AddStringToObject(a, "backing", hugepage_backing_name(b->pool.arena[i].backing));
	return a;
}

/* A tenant's pool: its partition's figures and arenas, and the node's configuration. */
static cJSON *pool_part_json(const struct broker *b, int part)
{
	const struct store *st = &b->store;
	const struct store_part *sp = part >= 0 ? &st->part[part] : NULL;
	cJSON *p = cJSON_CreateObject(), *arenas = cJSON_CreateArray();
	uint64_t used[POOL_MAX_ARENAS] = {0};

	arenas_used(st, used);
	/* [tenant-lend] A sparse partition may hold up to the pool: that is its total. */
	num(p, "bytes_total",
	    !sp		     ? 0
	    : b->pool.sparse ? (double)pool_budget(b)
			     : (double)sp->bytes_total);
	if (sp && b->pool.sparse) {
		num(p, "share_bytes", (double)b->pool.part[part].size);
		num(p, "guarantee_bytes", (double)sp->guarantee);
		num(p, "resident_bytes", (double)sp->resident);
	}
	num(p, "dir_bytes", part >= 0 ? (double)dir_bytes_of(b, (uint32_t)part) : 0);
	num(p, "bytes_used", sp ? (double)sp->bytes_used : 0);
	num(p, "pages", sp ? (double)sp->pages : 0);
	num(p, "pinned_bytes", sp ? (double)sp->pinned_bytes : 0);
	num(p, "slab_bytes", (double)st->slab_bytes);
	num(p, "max_page_bytes", (double)st->max_page);
	num(p, "high_watermark", b->cfg.high_wm);
	num(p, "low_watermark", b->cfg.low_wm);
	num(p, "partition", part);
	for (uint32_t i = 0; i < b->pool.narenas; i++) {
		if (part < 0 || b->pool.arena[i].part != (uint32_t)part)
			continue;
		cJSON_AddItemToArray(arenas, arena_json(b, i, used[i]));
	}
	cJSON_AddItemToObject(p, "arenas", arenas);
	cJSON_AddStringToObject(p, "numa", b->pool.interleave ? "interleave" : b->cfg.numa);
	return p;
}

/* [owner] Who keeps the pool for the next broker, and whether a crash now would lose it. */
static void keep_json(const struct broker *b, cJSON *p)
{
	cJSON_AddStringToObject(p, "kept_by",
				b->fdstore		? "systemd"
				: watch_restart_safe(b) ? "keeper"
				: b->cfg.keep		? "nobody (keeper lost)"
							: "nobody (--no-pool-keep)");
	num(p, "restart_safe", watch_restart_safe(b));
	num(p, "keeper_pid", b->keeper && b->kl.fd >= 0 ? (double)b->kl.pid : 0);
	num(p, "keeper_deaths", (double)b->watch.keeper_deaths);
	num(p, "keeper_starts", (double)b->watch.keeper_starts);
	num(p, "files_remade", (double)b->watch.files_made);
	num(p, "orphans", b->orphan_st.live);
	num(p, "orphan_pins", (double)b->orphan_st.pins);
	num(p, "unkept_sessions", (double)b->orphan_st.unkept);
	num(p, "records_pending", b->orphan_st.pending);
}

static cJSON *pool_json(const struct broker *b)
{
	const struct store *st = &b->store;
	cJSON *p = cJSON_CreateObject(), *arenas = cJSON_CreateArray();
	uint64_t used[POOL_MAX_ARENAS] = {0}, total = 0, dir = 0;

	arenas_used(st, used);
	for (uint32_t i = 0; i < b->pool.nparts; i++) {
		total += st->part[i].bytes_total;
		dir += dir_bytes_of(b, i);
	}
	if (b->pool.sparse) /* [tenant-lend] the partitions share the pool's memory */
		total = pool_budget(b);
	num(p, "sparse", b->pool.sparse);
	num(p, "resident_bytes", (double)st->st.resident);
	num(p, "lend_reclaims", (double)st->st.lend_reclaims);
	num(p, "slab_alloc_failed", (double)st->st.alloc_failed);
	num(p, "slab_pin_failed", (double)st->st.pin_failed); /* [slab-pin] */
	num(p, "empty_slab_bytes", (double)st->st.empty_bytes);
	num(p, "bytes_total", (double)total);
	num(p, "dir_bytes", (double)dir);
	num(p, "dir_entries", (double)stats_dir_sum(b, 0));
	num(p, "bytes_used", (double)st->st.bytes_used);
	num(p, "pages", (double)st->st.pages);
	num(p, "pinned_pages", (double)st->st.pinned);
	num(p, "slab_bytes", (double)st->slab_bytes);
	num(p, "slabs_total", (double)(total / st->slab_bytes));
	num(p, "slabs", (double)(st->nslabs - st->nrec_free));
	num(p, "max_page_bytes", (double)st->max_page);
	num(p, "slabs_free", (double)st->st.slabs_free);
	num(p, "high_watermark", b->cfg.high_wm);
	num(p, "low_watermark", b->cfg.low_wm);
	num(p, "reclaimed_orphans", b->pool.reclaimed);
	keep_json(b, p);
	for (uint32_t i = 0; i < b->pool.narenas; i++) {
		cJSON_AddItemToArray(arenas, arena_json(b, i, used[i]));
	}
	cJSON_AddItemToObject(p, "arenas", arenas);
	cJSON_AddStringToObject(p, "numa", b->pool.interleave ? "interleave" : b->cfg.numa);
	return p;
}

static cJSON *startup_json(const struct broker *b)
{
	cJSON *o = cJSON_CreateObject();

	num(o, "reserve_s", b->startup.reserve_s);
	num(o, "prefault_s", b->startup.prefault_s);
	num(o, "pin_s", b->startup.pin_s);
	num(o, "ready_s", b->startup.ready_s);
	return o;
}

/* ABI 1.2 identity fields of a namespace (defaults for one an ABI 1.1 client opened). */
static void ident_json(cJSON *o, const struct ns *n)
{
	static const char *const names[KVB_DTYPE__COUNT] = {
		"unspec",   "fp16",	    "bf16", "fp32",  "fp8_e4m3",
		"fp8_e5m2", "fp8_e4m3fnuz", "int8", "uint8", "fp4_e2m1"};
	cJSON *dt = cJSON_AddArrayToObject(o, "dtype");

	for (uint32_t i = 0; i < n->layout.ncomponents && i < KVB_MAX_COMPONENTS; i++)
		cJSON_AddItemToArray(dt, cJSON_CreateString(n->idf.dtype[i] < KVB_DTYPE__COUNT
								    ? names[n->idf.dtype[i]]
								    : "?"));
	cJSON_AddStringToObject(o, "page_format", n->idf.page_format);
	num(o, "pp_size", n->idf.pp_size);
	num(o, "pp_rank", n->idf.pp_rank);
	num(o, "cp_size", n->idf.cp_size);
	num(o, "cp_rank", n->idf.cp_rank);
}

static cJSON *ns_json(const struct broker *b, const struct stats_view *v)
{
	cJSON *arr = cJSON_CreateArray();
	static uint32_t clients[STORE_MAX_NS];

	stats_ns_clients(b, clients);

	for (uint32_t i = 0; i < b->nst.count; i++) {
		const struct ns *n = b->nst.ns[i];
		const struct kvb_layout *l;
		cJSON *o;
		uint64_t pages;

		if (!n || !ns_visible(b, v, i))
			continue; /* freed [ns-free], or another tenant's [tenant-stats] */
		l = &n->layout;
		o = cJSON_CreateObject();
		pages = b->store.ns_pages[n->id];

		num(o, "id", n->id);
		add_text(o, "model", l->model, sizeof(l->model));
		cJSON_AddStringToObject(o, "kind", l->kind == KVB_LAYOUT_MLA ? "mla" : "mha");
		num(o, "tokens_per_page", l->tokens_per_page);
		num(o, "tp_size", l->tp_size);
		num(o, "tp_rank", l->tp_rank);
		num(o, "components", l->ncomponents);
		ident_json(o, n);
		num(o, "page_bytes", (double)n->page_bytes);
		num(o, "pages", (double)pages);
		num(o, "bytes", (double)(pages * b->store.cls[n->cls].slot_bytes));
		num(o, "hits", (double)n->c.hits);
		num(o, "misses", (double)n->c.misses);
		num(o, "puts", (double)n->c.puts);
		num(o, "dedup", (double)n->c.dedup);
		num(o, "gets", (double)n->c.gets);
		/* A PUT that found its key stored neither copied nor stored its page again. */
		num(o, "dedup_bytes", (double)(n->c.dedup * n->page_bytes));
		num(o, "clients", clients[n->id]);
		num(o, "limit_bytes", (double)b->store.ns_limit[n->id]); /* [ns-limit] 0: none */
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

/* A tenant's counters: over its namespaces, its clients and its partition [tenant-stats]. */
static cJSON *tenant_counters_json(const struct broker *b, const struct stats_view *v)
{
	struct ns_counters c = {0};
	uint64_t dedup_bytes = 0, errors = 0, in = 0, out = 0;
	cJSON *o = cJSON_CreateObject();
	struct list *pos;

	for (uint32_t i = 0; i < b->nst.count; i++) {
		const struct ns *n = b->nst.ns[i];

		if (!n || !ns_visible(b, v, i))
			continue;
		c.puts += n->c.puts;
		c.gets += n->c.gets;
		c.hits += n->c.hits;
		c.misses += n->c.misses;
		c.dedup += n->c.dedup;
		dedup_bytes += n->c.dedup * n->page_bytes;
	}
	list_for_each (pos, &b->sessions) {
		const struct session *s = list_entry(pos, struct session, link);

		if (!s->hello_done || s->control_only || !client_visible(v, s))
			continue;
		errors += s->c.errors;
		in += s->c.bytes_in;
		out += s->c.bytes_out;
	}
	num(o, "dedup_bytes", (double)dedup_bytes);
	num(o, "puts", (double)c.puts);
	num(o, "gets", (double)c.gets);
	num(o, "hits", (double)c.hits);
	num(o, "misses", (double)c.misses);
	num(o, "dedup", (double)c.dedup);
	num(o, "evictions", v->part >= 0 ? (double)b->store.part[v->part].evictions : 0);
	num(o, "errors", (double)errors);
	num(o, "bytes_in", (double)in);
	num(o, "bytes_out", (double)out);
	return o;
}

static cJSON *counters_json(const struct broker *b)
{
	const struct counters *c = &b->ctr;
	cJSON *o = cJSON_CreateObject();

	num(o, "dedup_bytes", (double)stats_dedup_bytes(b));
	num(o, "puts", (double)c->puts);
	num(o, "gets", (double)c->gets);
	num(o, "hits", (double)c->hits);
	num(o, "misses", (double)c->misses);
	num(o, "dedup", (double)c->dedup);
	num(o, "evictions", (double)b->store.st.evictions);
	num(o, "hits_ram", (double)b->obs.tier_hits[0]); /* [hist] */
	num(o, "hits_disk", (double)b->obs.tier_hits[1]);
	num(o, "hits_remote", (double)b->obs.tier_hits[2]);
	num(o, "chain_links", (double)b->store.st.chain_links);
	num(o, "chain_held", (double)b->store.st.held);
	num(o, "chain_cuts", (double)b->store.st.chain_cuts);
	num(o, "ns_evictions", (double)b->store.st.ns_evictions);
	num(o, "errors", (double)c->errors);
	num(o, "acquires", (double)c->acquires);
	num(o, "releases", (double)c->releases);
	num(o, "dir_gets", (double)c->dir_gets);
	num(o, "dir_acquires", (double)c->dir_acquires);
	num(o, "hazard_pins", (double)c->hazard_pins);
	num(o, "dir_full", (double)stats_dir_sum(b, 1));
	num(o, "lookups", (double)c->lookups);
	num(o, "lookup_keys", (double)c->lookup_keys);
	num(o, "deletes", (double)c->deletes);
	num(o, "prefetches", (double)c->prefetches);
	num(o, "nops", (double)c->nops);
	num(o, "bytes_in", (double)c->bytes_in);
	num(o, "bytes_out", (double)c->bytes_out);
	num(o, "disconnects", (double)c->disconnects);
	num(o, "protocol_errors", (double)c->protocol_errors);
	num(o, "refused", (double)c->refused);
	num(o, "expired", (double)c->expired);
	return o;
}

/* [hist] name: le (bounds), counts (per bucket, +Inf last, not cumulative), sum, count. */
static void hist_json(cJSON *o, const char *name, const struct hist *h, struct hist_bounds bd)
{
	cJSON *e = cJSON_AddObjectToObject(o, name);
	cJSON *le = cJSON_AddArrayToObject(e, "le"), *n = cJSON_AddArrayToObject(e, "counts");

	for (uint32_t i = 0; i <= bd.n; i++) {
		if (i < bd.n)
			cJSON_AddItemToArray(le, cJSON_CreateNumber(bd.le[i]));
		cJSON_AddItemToArray(n, cJSON_CreateNumber((double)h->n[i]));
	}
	num(e, "sum", h->sum);
	num(e, "count", (double)h->count);
}

/*
 * [hist] The timings (empty while KVB_BROKER_NO_HISTOGRAMS is set): op latency by opcode as
 * the broker sees it, disk promotion, remote fetch, page age at eviction.
 */
static cJSON *histograms_json(const struct broker *b)
{
	static const char *const names[HIST__COUNT] = {[HIST_GET] = "get",
						       [HIST_PUT] = "put",
						       [HIST_LOOKUP] = "lookup",
						       [HIST_ACQUIRE] = "acquire",
						       [HIST_PROMOTE] = "promote",
						       [HIST_FETCH] = "fetch",
						       [HIST_EVICT_AGE] = "evict_age"};
	cJSON *o = cJSON_CreateObject();

	if (b->obs.off)
		return o;
	for (int i = 0; i < HIST__COUNT; i++)
		hist_json(o, names[i], i == HIST_EVICT_AGE ? &b->store.evict_age : &b->obs.h[i],
			  hist_bounds_of((enum hist_id)i));
	return o;
}

/*
 * [hist] Each tenant partition: whose it is, its share of RAM and what it holds, its
 * evictions and its clients' hits and misses (uid or gid: the tenant key less one; -1 for a
 * partition no tenant holds, "none" mode's one partition is tenant "all").
 */
static cJSON *tenants_json(const struct broker *b)
{
	cJSON *arr = cJSON_CreateArray();

	for (uint32_t p = 0; p < b->tt.n; p++) {
		const struct tenant *t = &b->tt.t[p];
		const struct store_part *sp = &b->store.part[p];
		cJSON *o = cJSON_CreateObject();

		num(o, "partition", p);
		cJSON_AddStringToObject(o, "mode", tenant_mode_name(b->tt.mode));
		num(o, "id", t->used && t->key ? (double)t->key - 1 : -1);
		num(o, "bound", t->used);
		num(o, "listed", t->listed);
		num(o, "clients", t->clients);
		/* [tenant-lend] In a sparse pool: its share as set, what it can reclaim now
		 * (0 released), and the memory its slabs hold (above the guarantee: lent). */
		num(o, "share_bytes",
		    (double)(b->pool.sparse ? b->pool.part[p].size : sp->bytes_total));
		num(o, "guarantee_bytes",
		    (double)(b->pool.sparse ? sp->guarantee : sp->bytes_total));
		num(o, "resident_bytes", (double)(b->pool.sparse ? sp->resident : sp->bytes_total));
		num(o, "released", t->released);
		num(o, "share_set", t->share_set);
		num(o, "lent_back", (double)sp->lent_back);
		num(o, "bytes_used", (double)sp->bytes_used);
		num(o, "pages", (double)sp->pages);
		num(o, "evictions", (double)sp->evictions);
		num(o, "hits", (double)t->hits);
		num(o, "misses", (double)t->misses);
		num(o, "put_refused", (double)t->refused);
		/* Seconds since its last client left (0: attached, or never bound). */
		num(o, "idle_s",
		    t->used && !t->clients && t->left_at ? clock_now() - t->left_at : 0);
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

/* [ns-limit] The caps by model, as --ns-limit set them or kvbctl ns-limit since. */
static cJSON *ns_limits_json(const struct broker *b)
{
	cJSON *arr = cJSON_CreateArray();

	for (uint32_t i = 0; i < b->cfg.n_ns_limits; i++) {
		const struct ns_limit *l = &b->cfg.ns_limits[i];
		cJSON *o = cJSON_CreateObject();

		cJSON_AddStringToObject(o, "model", l->model);
		if (l->bytes)
			num(o, "bytes", (double)l->bytes);
		else
			num(o, "percent", l->frac * 100);
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

/* [stretch] How many of the loop's stretches (loop.c) passed each threshold, by its ms. */
static cJSON *stretches_json(const struct loop *l)
{
	cJSON *o = cJSON_CreateObject();
	char name[16];

	for (unsigned i = 0; i < LOOP_NSTRETCH; i++) {
		snprintf(name, sizeof(name), "%u", loop_stretch_ms[i]);
		num(o, name, (double)l->stretches[i]);
	}
	return o;
}

/* The request engine now: ops waiting, ops in flight, dead sessions still draining. */
static cJSON *ops_json(const struct broker *b)
{
	cJSON *o = cJSON_CreateObject();
	struct list *pos;
	uint64_t inflight = 0, draining = 0;

	list_for_each (pos, &b->sessions)
		inflight += ((const struct session *)list_entry(pos, struct session, link))->nops;
	list_for_each (pos, &b->graveyard) {
		inflight += ((const struct session *)list_entry(pos, struct session, link))->nops;
		draining++;
	}
	num(o, "parked", (double)b->ops_parked);
	num(o, "inflight", (double)inflight);
	num(o, "sessions_draining", (double)draining);
	return o;
}

static cJSON *clients_json(const struct broker *b, const struct stats_view *v)
{
	cJSON *arr = cJSON_CreateArray();
	struct list *pos;

	list_for_each (pos, &b->sessions) {
		const struct session *s = list_entry(pos, struct session, link);
		cJSON *o;

		if (!s->hello_done || s->control_only || !client_visible(v, s))
			continue;
		o = cJSON_CreateObject();
		stats_client_json(o, s);
		num(o, "id", s->id);
		num(o, "pid", s->pid);
		num(o, "uid", s->uid);
		num(o, "partition", s->part); /* its tenant's [tenant-part] */
		num(o, "lease_bytes", (double)(s->lease_bytes + s->hz_held));
		add_text(o, "name", s->name, sizeof(s->name));
		num(o, "leases", s->nleases + s->hz_leases);
		num(o, "ops", (double)s->ops);
		num(o, "namespaces", s->nns);
		num(o, "node", s->node);
		add_text(o, "gpu", s->gpu, sizeof(s->gpu));
		cJSON_AddItemToArray(arr, o);
	}
	return arr;
}

/* A tenant's view [tenant-stats]: see the file's header for what it leaves out. */
static void tenant_doc(const struct broker *b, const struct stats_view *v, cJSON *root)
{
	static const char *const disk_keys[] = {
		"state",       "failed_because", "next_probe_s", "direct", "paths",
		"queue_depth", "fixed_buffers",	 "sqpoll",	 "warm",   NULL};
	static const char *const remote_keys[] = {"state", "backend", "publish", NULL};
	uint32_t nclients = 0;
	uint64_t leases = 0;
	struct list *pos;
	cJSON *disk, *part;

	cJSON_AddStringToObject(root, "view", "tenant");
	num(root, "partition", v->part);
	cJSON_AddItemToObject(root, "pool", pool_part_json(b, v->part));
	cJSON_AddItemToObject(root, "startup", startup_json(b));
	disk = pick(tier_json(b), disk_keys);
	part = tier_nparts(b) && v->part >= 0 ? tier_part_json(b, (uint32_t)v->part) : NULL;
	num(disk, "bytes_total",
	    part ? cJSON_GetNumberValue(cJSON_GetObjectItem(part, "bytes_total")) : 0);
	num(disk, "bytes_used",
	    part ? cJSON_GetNumberValue(cJSON_GetObjectItem(part, "bytes_used")) : 0);
	num(disk, "pages", part ? cJSON_GetNumberValue(cJSON_GetObjectItem(part, "pages")) : 0);
	cJSON_Delete(part);
	cJSON_AddItemToObject(root, "disk", disk);
	cJSON_AddItemToObject(root, "remote", pick(remote_json(b), remote_keys));
	list_for_each (pos, &b->sessions) {
		const struct session *s = list_entry(pos, struct session, link);

		if (s->hello_done && !s->control_only && client_visible(v, s)) {
			nclients++;
			leases += s->nleases + s->hz_leases;
		}
	}
	num(root, "clients", nclients);
	num(root, "leases", (double)leases);
	cJSON_AddItemToObject(root, "namespaces", ns_json(b, v));
	cJSON_AddItemToObject(root, "counters", tenant_counters_json(b, v));
	cJSON_AddItemToObject(root, "client_list", clients_json(b, v));
	/* -1 is every arena to stats_map_json: a tenant without a partition has none. */
	cJSON_AddItemToObject(root, "map",
			      v->part >= 0 ? stats_map_json(b, v->part) : cJSON_CreateArray());
}

static char *render(const struct broker *b, const struct stats_view *v)
{
	cJSON *root = cJSON_CreateObject();
	cJSON *disk;
	char *out;

	if (!root)
		return NULL;
	cJSON_AddStringToObject(root, "version", KVB_VERSION_STRING);
	num(root, "pid", getpid());
	num(root, "uptime_s", clock_now() - b->start_time);
	cJSON_AddStringToObject(root, "copy_engine", b->copy->name);
	if (!v->all) {
		tenant_doc(b, v, root);
		goto out;
	}
	cJSON_AddStringToObject(root, "view", "all");
	cJSON_AddItemToObject(root, "copy", xfer_stats_json(b));
	cJSON_AddItemToObject(root, "pool", pool_json(b));
	cJSON_AddItemToObject(root, "startup", startup_json(b));
	cJSON_AddItemToObject(root, "config", options_json(&b->cfg)); /* the operator's only */
	disk = tier_json(b);
	if (tier_nparts(b) > 1) {
		/* [tenant-disk] each partition's region of the disk */
		cJSON *parts = cJSON_AddArrayToObject(disk, "partitions");

		for (uint32_t p = 0; p < tier_nparts(b); p++)
			cJSON_AddItemToArray(parts, tier_part_json(b, p));
	}
	cJSON_AddItemToObject(root, "disk", disk);
	cJSON_AddItemToObject(root, "remote", remote_json(b));
	num(root, "clients", b->nsessions);
	num(root, "control_clients", b->ncontrol);
	num(root, "handshakes", b->npending);
	num(root, "bg_jobs", (double)bg_pending(b->bg));
	num(root, "loop_sleeps", (double)b->loop.sleeps);
	num(root, "loop_stretch_max_us", (double)(uint64_t)(b->loop.stretch_max * 1e6));
	cJSON_AddItemToObject(root, "loop_stretches_over_ms", stretches_json(&b->loop));
	num(root, "leases", (double)b->leases);
	cJSON_AddItemToObject(root, "namespaces", ns_json(b, v));
	num(root, "namespaces_freed", (double)b->nst.freed); /* [ns-free] */
	cJSON_AddItemToObject(root, "counters", counters_json(b));
	cJSON_AddItemToObject(root, "ops", ops_json(b));
	cJSON_AddItemToObject(root, "histograms", histograms_json(b));
	cJSON_AddItemToObject(root, "ns_limits", ns_limits_json(b));
	cJSON_AddItemToObject(root, "tenants", tenants_json(b));
	cJSON_AddItemToObject(root, "client_list", clients_json(b, v));
	cJSON_AddItemToObject(root, "map", stats_map_json(b, -1));
	if (b->metrics_addr[0])
		cJSON_AddStringToObject(root, "metrics_listen", b->metrics_addr);
out:
	out = cJSON_PrintUnformatted(root);
	cJSON_Delete(root);
	return out;
}

char *stats_json(const struct broker *b)
{
	static const struct stats_view all = {.all = 1, .part = -1};

	return render(b, &all);
}

char *stats_json_for(const struct broker *b, const struct session *s)
{
	struct stats_view v = {.tenant = s->tenant, .part = -1};

	v.all = b->tt.mode == TENANTS_NONE || s->uid == geteuid() || s->uid == 0;
	if (s->tenant_bound)
		v.part = (int)s->part;
	for (uint32_t p = 0; v.part < 0 && p < b->tt.n; p++)
		if (b->tt.t[p].used && b->tt.t[p].key == s->tenant)
			v.part = (int)p;
	return render(b, &v);
}
