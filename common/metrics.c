// SPDX-License-Identifier: MIT
/*
 * metrics.c - Prometheus text exposition (format 0.0.4) of the STATS JSON document, and a
 * checker for that format.
 *
 * The one generator of kvbroker's metrics: `kvbctl metrics` feeds it the document it fetched,
 * kvbrokerd's HTTP endpoint (broker/metrics_http.c) the snapshot its loop published. Working
 * from the JSON rather than from broker structures keeps it one code path, testable with a
 * hand-written document (a disk tier before there is one), and free of broker internals.
 *
 * Naming follows the Prometheus conventions: prefix kvbroker_, base units (bytes, seconds),
 * counters end in _total, one family per quantity with labels for its dimensions
 * (kvbroker_pool_bytes{tier="ram",node="0",state="used"}). A family is emitted only when the
 * document has its source field, so the output grows with the document (fields are only ever
 * added) and an absent disk tier is just kvbroker_disk_state{state="off"} 1. Node "-1" is an
 * arena with no NUMA node (the value the JSON uses). Per-client series carry the client id
 * (pid and name as labels); clients come and go, so their series do too.
 *
 * Pure functions on their arguments; any thread.
 */
#include <ctype.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "metrics.h"
#include "statsdoc.h"

/* ---- output buffer ---- */

struct mbuf {
	char *p;
	size_t len, cap;
	int oom;
};

static void put(struct mbuf *m, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void put(struct mbuf *m, const char *fmt, ...)
{
	va_list ap;
	int n;

	for (;;) {
		if (m->oom)
			return;
		va_start(ap, fmt);
		n = vsnprintf(m->p + m->len, m->cap - m->len, fmt, ap);
		va_end(ap);
		if (n < 0) {
			m->oom = 1;
			return;
		}
		if ((size_t)n < m->cap - m->len) {
			m->len += (size_t)n;
			return;
		}
		char *np = realloc(m->p, m->cap * 2 + (size_t)n);

		if (!np) {
			m->oom = 1;
			return;
		}
		m->p = np;
		m->cap = m->cap * 2 + (size_t)n;
	}
}

/* ---- families and samples ---- */

static void family(struct mbuf *m, const char *name, const char *type, const char *help)
{
	put(m, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Integers print exactly (counters are < 2^53 in a double); everything else as %g. */
static void value(struct mbuf *m, double v)
{
	if (isnan(v))
		put(m, "NaN\n");
	else if (isinf(v))
		put(m, "%sInf\n", v > 0 ? "+" : "-");
	else if (v == floor(v) && fabs(v) < 9007199254740992.0)
		put(m, "%.0f\n", v);
	else
		put(m, "%.9g\n", v);
}

/*
 * A label value with \\, \" and \n escaped, as the format requires. Client names and model
 * names come from clients: any other control byte or non-ASCII byte becomes '?', so no name
 * can make the exposition invalid UTF-8 and fail the whole scrape.
 */
static void label_value(struct mbuf *m, const char *s)
{
	for (; *s; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '\\' || c == '"')
			put(m, "\\%c", c);
		else if (c == '\n')
			put(m, "\\n");
		else
			put(m, "%c", c >= 0x20 && c < 0x7f ? c : '?');
	}
}

/*
 * One sample. labels: NULL, or alternating names and values ending with NULL
 * ("tier", "ram", "node", "0", NULL).
 */
static void sample(struct mbuf *m, const char *name, const char *const *labels, double v)
{
	put(m, "%s", name);
	if (labels && labels[0]) {
		put(m, "{");
		for (int i = 0; labels[i]; i += 2) {
			put(m, "%s%s=\"", i ? "," : "", labels[i]);
			label_value(m, labels[i + 1]);
			put(m, "\"");
		}
		put(m, "}");
	}
	put(m, " ");
	value(m, v);
}

#define L(...) ((const char *const[]){__VA_ARGS__, NULL})

/* A family of one unlabelled sample from o.field, when present. */
static void single(struct mbuf *m, const cJSON *o, const char *field, const char *name,
		   const char *type, const char *help)
{
	if (!sdoc_has(o, field))
		return;
	family(m, name, type, help);
	sample(m, name, NULL, sdoc_num(o, field));
}

/* A family with one sample per (label value, field) pair present in o. */
struct pair {
	const char *label_value, *field;
};

static void labelled(struct mbuf *m, const cJSON *o, const char *name, const char *type,
		     const char *help, const char *label, const struct pair *p, size_t n)
{
	int any = 0;

	for (size_t i = 0; i < n; i++)
		any |= sdoc_has(o, p[i].field);
	if (!any)
		return;
	family(m, name, type, help);
	for (size_t i = 0; i < n; i++)
		if (sdoc_has(o, p[i].field))
			sample(m, name, L(label, p[i].label_value), sdoc_num(o, p[i].field));
}

/* ---- the pool ---- */

/* RAM per NUMA node (arenas summed), then the disk tier. */
static void pool_bytes(struct mbuf *m, const cJSON *root, const cJSON *disk)
{
	struct sdoc_node nodes[SDOC_MAX_NODES];
	const cJSON *pool = sdoc_obj(root, "pool");
	int n = sdoc_nodes(root, nodes, SDOC_MAX_NODES);

	family(m, "kvbroker_pool_bytes", "gauge",
	       "Pool memory by tier, NUMA node (-1: none) and state (used = slot bytes of stored "
	       "pages, free = the rest).");
	for (int i = 0; i < n; i++) {
		char nd[16];

		snprintf(nd, sizeof(nd), "%d", nodes[i].node);
		sample(m, "kvbroker_pool_bytes", L("tier", "ram", "node", nd, "state", "used"),
		       nodes[i].used);
		sample(m, "kvbroker_pool_bytes", L("tier", "ram", "node", nd, "state", "free"),
		       nodes[i].total - nodes[i].used);
	}
	if (disk) {
		double t = sdoc_num(disk, "bytes_total"), u = sdoc_num(disk, "bytes_used");

		sample(m, "kvbroker_pool_bytes", L("tier", "disk", "state", "used"), u);
		sample(m, "kvbroker_pool_bytes", L("tier", "disk", "state", "free"), t - u);
	}
	family(m, "kvbroker_pool_pages", "gauge", "Pages stored, by tier.");
	sample(m, "kvbroker_pool_pages", L("tier", "ram"), sdoc_num(pool, "pages"));
	if (disk)
		sample(m, "kvbroker_pool_pages", L("tier", "disk"), sdoc_num(disk, "pages"));
	single(m, pool, "pinned_pages", "kvbroker_pool_pinned_pages", "gauge",
	       "RAM pages that cannot be evicted now: leased or with a copy in flight.");
	single(m, pool, "restart_safe", "kvbroker_pool_restart_safe", "gauge",
	       "1 when the RAM pool survives a crash of the broker (a keeper process or systemd's "
	       "fd store holds it), 0 when a crash now would lose it.");
	single(m, pool, "keeper_deaths", "kvbroker_pool_keeper_deaths_total", "counter",
	       "Pool keepers that died under this broker (each replaced at once when it can be).");
	if (sdoc_has(pool, "slabs_total")) {
		family(m, "kvbroker_pool_slabs", "gauge", "RAM pool slabs, free or holding pages.");
		sample(m, "kvbroker_pool_slabs", L("state", "free"), sdoc_num(pool, "slabs_free"));
		sample(m, "kvbroker_pool_slabs", L("state", "used"),
		       sdoc_num(pool, "slabs_total") - sdoc_num(pool, "slabs_free"));
	}
	labelled(m, pool, "kvbroker_pool_watermark_ratio", "gauge",
		 "Eviction watermarks as a fraction of the RAM pool.", "level",
		 (const struct pair[]){{"high", "high_watermark"}, {"low", "low_watermark"}}, 2);
}

/* ---- the disk tier ---- */

static void disk_metrics(struct mbuf *m, const cJSON *disk, const char *state)
{
	static const char *const states[] = {"off", "ok", "failed"};
	static const struct {
		const char *field, *name, *help;
	} ctr[] = {
		{"reads", "kvbroker_disk_reads_total", "Page reads from the disk tier."},
		{"writes", "kvbroker_disk_writes_total", "Page writes to the disk tier."},
		{"errors", "kvbroker_disk_errors_total", "Disk I/O errors."},
		{"corrupt", "kvbroker_disk_corrupt_total",
		 "Disk slots whose checksum did not match (dropped, never served)."},
		{"torn", "kvbroker_disk_torn_total",
		 "Torn disk writes found by the start-up scan."},
		{"dropped", "kvbroker_disk_dropped_total",
		 "Pages dropped from the disk tier to make room."},
		{"demotions", "kvbroker_disk_demotions_total", "Pages demoted from RAM to disk."},
		{"promotions", "kvbroker_disk_promotions_total",
		 "Pages promoted from disk to RAM."},
	};

	family(m, "kvbroker_disk_state", "gauge",
	       "Disk tier state: 1 for the current one of off, ok, failed.");
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		sample(m, "kvbroker_disk_state", L("state", states[i]), !strcmp(state, states[i]));
	if (!disk)
		return;
	for (size_t i = 0; i < sizeof(ctr) / sizeof(ctr[0]); i++)
		single(m, disk, ctr[i].field, ctr[i].name, "counter", ctr[i].help);
	labelled(m, disk, "kvbroker_disk_bytes_total", "counter",
		 "Bytes read from and written to the disk tier.", "direction",
		 (const struct pair[]){{"read", "read_bytes"}, {"write", "write_bytes"}}, 2);
	single(m, disk, "scan_seconds", "kvbroker_disk_scan_seconds", "gauge",
	       "Seconds the start-up scan of the disk tier took.");
}

/* ---- the remote tier ---- */

static void remote_metrics(struct mbuf *m, const cJSON *rem)
{
	static const char *const states[] = {"off", "ok", "degraded", "down"};
	static const struct {
		const char *field, *name, *type, *help;
	} one[] = {
		{"shards", "kvbroker_remote_shards", "gauge",
		 "Remote store shards that own slots."},
		{"shards_reachable", "kvbroker_remote_shards_reachable", "gauge",
		 "Remote store shards connected and answering."},
		{"published", "kvbroker_remote_published_total", "counter",
		 "Pages published to the remote tier (stored there by this node)."},
		{"publish_existed", "kvbroker_remote_publish_existed_total", "counter",
		 "Publishes answered: another node stored the page first."},
		{"publish_lost", "kvbroker_remote_publish_lost_total", "counter",
		 "Publishes redirected (slots moving) and not stored after their one resend."},
		{"fetches", "kvbroker_remote_fetches_total", "counter",
		 "Fetches asked of the remote tier (local misses)."},
		{"fetched", "kvbroker_remote_fetched_total", "counter",
		 "Pages fetched from the remote tier, checked and served."},
		{"corrupt", "kvbroker_remote_corrupt_total", "counter",
		 "Remote values whose header or checksum did not match (never served)."},
		{"wrong_key", "kvbroker_remote_wrong_key_total", "counter",
		 "Remote values intact but of another key or namespace (never served)."},
		{"other_version", "kvbroker_remote_other_version_total", "counter",
		 "Remote values of another format version (ignored: misses)."},
		{"timeouts", "kvbroker_remote_timeouts_total", "counter",
		 "Remote lookups and fetches past their deadline (misses)."},
		{"errors", "kvbroker_remote_errors_total", "counter", "Remote tier errors."},
		{"backoffs", "kvbroker_remote_backoffs_total", "counter",
		 "Times a remote shard was backed off after a failure."},
		{"recoveries", "kvbroker_remote_recoveries_total", "counter",
		 "Remote shards back after a failure."},
		{"bytes_in_flight", "kvbroker_remote_bytes_in_flight", "gauge",
		 "Value bytes on the wire to and from the remote tier."},
	};
	const char *state = rem ? sdoc_str(rem, "state") : "off";

	family(m, "kvbroker_remote_state", "gauge",
	       "Remote tier state: 1 for the current one of off, ok, degraded, down.");
	for (size_t i = 0; i < sizeof(states) / sizeof(states[0]); i++)
		sample(m, "kvbroker_remote_state", L("state", states[i]),
		       !strcmp(state, states[i]));
	if (!rem)
		return;
	for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++)
		single(m, rem, one[i].field, one[i].name, one[i].type, one[i].help);
	labelled(m, rem, "kvbroker_remote_bytes_total", "counter",
		 "Page bytes fetched from and published to the remote tier.", "direction",
		 (const struct pair[]){{"fetch", "fetch_bytes"}, {"publish", "publish_bytes"}}, 2);
}

/* ---- per namespace and per client ---- */

struct series {
	const char *field, *name, *type, *help;
};

/* One family per field, one sample per element of arr that has it. lab() builds its labels. */
static void per_element(struct mbuf *m, const cJSON *arr, const struct series *s, size_t n,
			void (*lab)(const cJSON *e, char (*buf)[128], const char **labels))
{
	for (size_t i = 0; i < n; i++) {
		const cJSON *e;
		int first = 1;

		cJSON_ArrayForEach(e, arr)
		{
			char buf[4][128];
			const char *labels[9];

			if (!sdoc_has(e, s[i].field))
				continue;
			if (first)
				family(m, s[i].name, s[i].type, s[i].help);
			first = 0;
			lab(e, buf, labels);
			sample(m, s[i].name, labels, sdoc_num(e, s[i].field));
		}
	}
}

static void ns_labels(const cJSON *e, char (*buf)[128], const char **l)
{
	if (sdoc_has(e, "id"))
		snprintf(buf[0], sizeof(buf[0]), "%.0f", sdoc_num(e, "id"));
	else
		snprintf(buf[0], sizeof(buf[0]), "_other"); /* [ns-cap] */
	l[0] = "ns";
	l[1] = buf[0];
	l[2] = "model";
	l[3] = sdoc_str(e, "model");
	l[4] = "kind";
	l[5] = sdoc_str(e, "kind");
	l[6] = NULL;
}

static void client_labels(const cJSON *e, char (*buf)[128], const char **l)
{
	snprintf(buf[0], sizeof(buf[0]), "%.0f", sdoc_num(e, "id"));
	snprintf(buf[1], sizeof(buf[1]), "%.0f", sdoc_num(e, "pid"));
	l[0] = "client";
	l[1] = buf[0];
	l[2] = "pid";
	l[3] = buf[1];
	l[4] = "name";
	l[5] = sdoc_str(e, "name");
	l[6] = NULL;
}

static const struct series ns_series[] = {
	{"pages", "kvbroker_ns_pages", "gauge", "RAM pages stored in the namespace."},
	{"bytes", "kvbroker_ns_bytes", "gauge", "RAM slot bytes the namespace's pages occupy."},
	{"clients", "kvbroker_ns_clients", "gauge", "Attached clients that opened the namespace."},
	{"limit_bytes", "kvbroker_ns_limit_bytes", "gauge",
	 "The namespace's cap on RAM slot bytes (--ns-limit, kvbctl ns-limit); 0: none."},
	{"puts", "kvbroker_ns_puts_total", "counter", "PUTs into the namespace."},
	{"gets", "kvbroker_ns_gets_total", "counter", "GETs from the namespace."},
	{"hits", "kvbroker_ns_hits_total", "counter", "GETs and ACQUIREs that found the page."},
	{"misses", "kvbroker_ns_misses_total", "counter", "GETs and ACQUIREs that did not."},
	{"dedup", "kvbroker_ns_dedup_total", "counter",
	 "PUTs that found the page already stored (by another rank or engine)."},
	{"dedup_bytes", "kvbroker_ns_dedup_bytes_total", "counter",
	 "Page bytes not stored again because another rank or engine had stored them."},
};

static const struct series client_series[] = {
	{"ops", "kvbroker_client_ops_total", "counter", "Ring operations a client submitted."},
	{"leases", "kvbroker_client_leases", "gauge", "Leases a client holds."},
	{"puts", "kvbroker_client_puts_total", "counter", "PUTs by a client."},
	{"gets", "kvbroker_client_gets_total", "counter", "GETs and ACQUIREs by a client."},
	{"hits", "kvbroker_client_hits_total", "counter", "A client's GETs and ACQUIREs that hit."},
	{"misses", "kvbroker_client_misses_total", "counter",
	 "A client's GETs and ACQUIREs that missed."},
	{"bytes_in", "kvbroker_client_bytes_in_total", "counter", "Page bytes a client stored."},
	{"bytes_out", "kvbroker_client_bytes_out_total", "counter", "Page bytes a client read."},
};

/* ---- histograms, tiers and tenants [hist] ---- */

/*
 * One classic histogram's series from a STATS histogram (le, counts per bucket with +Inf last,
 * sum, count): cumulative _bucket per bound, +Inf, _sum, _count. labels: name, value or NULL.
 */
static void hist_series(struct mbuf *m, const char *name, const cJSON *h, const char *lname,
			const char *lval)
{
	const cJSON *le = cJSON_GetObjectItemCaseSensitive(h, "le");
	const cJSON *cn = cJSON_GetObjectItemCaseSensitive(h, "counts");
	char full[128], bound[32];
	double cum = 0;
	int nb = cJSON_GetArraySize(le);

	if (!cJSON_IsArray(le) || !cJSON_IsArray(cn) || cJSON_GetArraySize(cn) != nb + 1)
		return;
	snprintf(full, sizeof(full), "%s_bucket", name);
	for (int i = 0; i <= nb; i++) {
		cum += cJSON_GetArrayItem(cn, i)->valuedouble;
		if (i < nb)
			snprintf(bound, sizeof(bound), "%g",
				 cJSON_GetArrayItem(le, i)->valuedouble);
		else
			snprintf(bound, sizeof(bound), "+Inf");
		sample(m, full, lname ? L(lname, lval, "le", bound) : L("le", bound), cum);
	}
	snprintf(full, sizeof(full), "%s_sum", name);
	sample(m, full, lname ? L(lname, lval) : NULL, sdoc_num(h, "sum"));
	snprintf(full, sizeof(full), "%s_count", name);
	sample(m, full, lname ? L(lname, lval) : NULL, sdoc_num(h, "count"));
}

static void histograms(struct mbuf *m, const cJSON *hs)
{
	static const char *const ops[] = {"get", "put", "lookup", "acquire"};
	static const struct {
		const char *field, *name, *help;
	} one[] = {
		{"promote", "kvbroker_disk_promote_seconds",
		 "Disk tier promotions: from the read's submission to the page checked in RAM."},
		{"fetch", "kvbroker_remote_fetch_seconds",
		 "Remote tier fetches: from the request sent to the page checked in RAM."},
		{"evict_age", "kvbroker_evicted_page_age_seconds",
		 "Age of RAM pages when evicted: since they were stored or promoted."},
	};
	int any = 0;

	if (!hs)
		return;
	for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		any |= sdoc_obj(hs, ops[i]) != NULL;
	if (any) {
		family(m, "kvbroker_op_latency_seconds", "histogram",
		       "Ring operations as the broker sees them: from the SQE taken off the ring "
		       "to "
		       "its completion, by opcode.");
		for (size_t i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
			if (sdoc_obj(hs, ops[i]))
				hist_series(m, "kvbroker_op_latency_seconds", sdoc_obj(hs, ops[i]),
					    "op", ops[i]);
	}
	for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++) {
		if (!sdoc_obj(hs, one[i].field))
			continue;
		family(m, one[i].name, "histogram", one[i].help);
		hist_series(m, one[i].name, sdoc_obj(hs, one[i].field), NULL, NULL);
	}
}

/* A tenant's labels: its partition, and its uid or gid ("-" while unbound, "all" untenanted). */
static void tenant_labels(const cJSON *e, char (*buf)[128], const char **l)
{
	snprintf(buf[0], sizeof(buf[0]), "%.0f", sdoc_num(e, "partition"));
	if (!strcmp(sdoc_str(e, "mode"), "none"))
		snprintf(buf[1], sizeof(buf[1]), "all");
	else if (sdoc_num(e, "id") < 0)
		snprintf(buf[1], sizeof(buf[1]), "-");
	else
		snprintf(buf[1], sizeof(buf[1]), "%s:%.0f", sdoc_str(e, "mode"), sdoc_num(e, "id"));
	l[0] = "partition";
	l[1] = buf[0];
	l[2] = "tenant";
	l[3] = buf[1];
	l[4] = NULL;
}

static const struct series tenant_series[] = {
	{"share_bytes", "kvbroker_tenant_share_bytes", "gauge",
	 "A tenant's share of RAM (--tenant, --tenant-share, kvbctl tenant-share)."},
	{"guarantee_bytes", "kvbroker_tenant_guarantee_bytes", "gauge",
	 "RAM a tenant can always reclaim now: its share, scaled down while bound shares exceed "
	 "the pool, 0 once released (--tenant-idle)."},
	{"resident_bytes", "kvbroker_tenant_resident_bytes", "gauge",
	 "RAM a tenant's partition holds (its slabs); above its guarantee it is borrowed."},
	{"released", "kvbroker_tenant_released", "gauge",
	 "1 while a tenant's share is released (no client for --tenant-idle)."},
	{"lent_back", "kvbroker_tenant_reclaimed_slabs_total", "counter",
	 "Slabs of a tenant's partition taken back for a tenant under its guarantee."},
	{"bytes_used", "kvbroker_tenant_bytes_used", "gauge",
	 "RAM slot bytes of the pages a tenant stores."},
	{"pages", "kvbroker_tenant_pages", "gauge", "RAM pages a tenant stores."},
	{"clients", "kvbroker_tenant_clients", "gauge", "A tenant's attached ring clients."},
	{"evictions", "kvbroker_tenant_evictions_total", "counter",
	 "Pages evicted from a tenant's partition."},
	{"hits", "kvbroker_tenant_hits_total", "counter",
	 "A tenant's GETs and ACQUIREs that found the page."},
	{"misses", "kvbroker_tenant_misses_total", "counter",
	 "A tenant's GETs and ACQUIREs that did not."},
	{"idle_s", "kvbroker_tenant_idle_seconds", "gauge",
	 "Seconds since a bound tenant's last client detached (0 while one is attached): its "
	 "share stays bound, unused."},
	{"put_refused", "kvbroker_tenant_put_refused_total", "counter",
	 "A tenant's PUTs refused: its share (or the namespace's cap) full of pages that cannot "
	 "be evicted (leased or being copied)."},
};

/*
 * [ns-cap] Namespaces come and go with the models clients open (and a tenant can open many),
 * so their series are bounded: the METRICS_NS_MAX holding the most RAM keep their own labels,
 * and the rest are summed into one element labelled ns="_other". Returns a new array for
 * per_element (elements duplicated), or NULL when arr is within the cap (use it as is).
 */
static cJSON *ns_capped(const cJSON *arr)
{
	int n = cJSON_GetArraySize(arr), k = 0;
	const cJSON **v, *e;
	cJSON *out, *other;

	if (!cJSON_IsArray(arr) || n <= METRICS_NS_MAX)
		return NULL;
	v = malloc(sizeof(*v) * (size_t)n);
	out = cJSON_CreateArray();
	other = cJSON_CreateObject();
	if (!v || !out || !other)
		goto fail;
	cJSON_ArrayForEach(e, arr) v[k++] = e;
	/* Partial selection: the METRICS_NS_MAX largest by bytes, ties by id (stable labels). */
	for (int i = 0; i < METRICS_NS_MAX; i++) {
		int best = i;

		for (int j = i + 1; j < n; j++) {
			double bj = sdoc_num(v[j], "bytes"), bb = sdoc_num(v[best], "bytes");

			if (bj > bb || (bj == bb && sdoc_num(v[j], "id") < sdoc_num(v[best], "id")))
				best = j;
		}
		e = v[i];
		v[i] = v[best];
		v[best] = e;
		cJSON_AddItemToArray(out, cJSON_Duplicate(v[i], 1));
	}
	cJSON_AddStringToObject(other, "model", "_other");
	cJSON_AddStringToObject(other, "kind", "_other");
	for (size_t f = 0; f < sizeof(ns_series) / sizeof(ns_series[0]); f++) {
		double sum = 0;

		if (!strcmp(ns_series[f].field, "limit_bytes"))
			continue; /* caps do not add up */
		for (int j = METRICS_NS_MAX; j < n; j++)
			sum += sdoc_num(v[j], ns_series[f].field);
		cJSON_AddNumberToObject(other, ns_series[f].field, sum);
	}
	cJSON_AddItemToArray(out, other);
	free(v);
	return out;
fail:
	free(v);
	cJSON_Delete(out);
	cJSON_Delete(other);
	return NULL;
}

/* ---- the document ---- */

static void counters(struct mbuf *m, const cJSON *c)
{
	static const struct pair ops[] = {
		{"put", "puts"},
		{"get", "gets"},
		{"acquire", "acquires"},
		{"release", "releases"},
		{"lookup", "lookups"},
		{"delete", "deletes"},
		{"prefetch", "prefetches"},
		{"nop", "nops"},
	};
	static const struct series one[] = {
		{"lookup_keys", "kvbroker_lookup_keys_total", "counter", "Keys looked up."},
		{"hits", "kvbroker_hits_total", "counter",
		 "GETs and ACQUIREs that found the page."},
		{"misses", "kvbroker_misses_total", "counter", "GETs and ACQUIREs that did not."},
		{"dedup", "kvbroker_dedup_total", "counter",
		 "PUTs that found the page already stored (by another rank or engine)."},
		{"dedup_bytes", "kvbroker_dedup_bytes_total", "counter",
		 "Page bytes not stored again because another rank or engine had stored them."},
		{"evictions", "kvbroker_evictions_total", "counter", "Pages evicted from RAM."},
		{"chain_links", "kvbroker_chain_links_total", "counter",
		 "PUTs linked to their parent page in RAM (eviction keeps chains whole)."},
		{"chain_held", "kvbroker_chain_held_total", "counter",
		 "Times the coldest page was kept because pages continuing it were in RAM."},
		{"chain_cuts", "kvbroker_chain_cuts_total", "counter",
		 "Parents evicted while pages continuing them stayed (slab reclaim, last resort)."},
		{"ns_evictions", "kvbroker_ns_evictions_total", "counter",
		 "Pages a namespace over its --ns-limit evicted of its own."},
		{"errors", "kvbroker_errors_total", "counter",
		 "Failed operations (misses excluded)."},
		{"disconnects", "kvbroker_disconnects_total", "counter", "Connections closed."},
		{"protocol_errors", "kvbroker_protocol_errors_total", "counter",
		 "Sessions ended for a protocol violation."},
		{"refused", "kvbroker_refused_connections_total", "counter",
		 "Connections refused (credentials, --max-clients, --max-control, out of fds)."},
		{"expired", "kvbroker_expired_connections_total", "counter",
		 "Connections closed for silence (no HELLO in time, idle control connections)."},
	};

	if (!c)
		return;
	labelled(m, c, "kvbroker_ops_total", "counter", "Ring operations, by opcode.", "op", ops,
		 sizeof(ops) / sizeof(ops[0]));
	for (size_t i = 0; i < sizeof(one) / sizeof(one[0]); i++)
		single(m, c, one[i].field, one[i].name, one[i].type, one[i].help);
	labelled(m, c, "kvbroker_tier_hits_total", "counter",
		 "GETs and ACQUIREs that found the page, by the tier that held it (disk: promoted, "
		 "remote: fetched).",
		 "tier",
		 (const struct pair[]){
			 {"ram", "hits_ram"}, {"disk", "hits_disk"}, {"remote", "hits_remote"}},
		 3);
	labelled(m, c, "kvbroker_transfer_bytes_total", "counter",
		 "Page bytes copied into (PUT) and out of (GET, ACQUIRE) the pool.", "direction",
		 (const struct pair[]){{"in", "bytes_in"}, {"out", "bytes_out"}}, 2);
}

char *metrics_text(const cJSON *st)
{
	struct mbuf m = {.cap = 16384};
	const cJSON *pool = sdoc_obj(st, "pool"), *disk = sdoc_disk(st);
	const char *dstate = disk ? sdoc_str(disk, "state") : "off";
	cJSON *capped;

	if (!cJSON_IsObject(st))
		return NULL;
	m.p = malloc(m.cap);
	if (!m.p)
		return NULL;
	m.p[0] = '\0';
	family(&m, "kvbroker_info", "gauge", "Always 1; the broker's version and copy engine.");
	sample(&m, "kvbroker_info",
	       L("version", sdoc_str(st, "version"), "copy_engine", sdoc_str(st, "copy_engine")),
	       1);
	single(&m, st, "uptime_s", "kvbroker_uptime_seconds", "gauge", "Seconds since start-up.");
	if (pool)
		pool_bytes(&m, st, disk);
	disk_metrics(&m, disk, dstate);
	remote_metrics(&m, sdoc_remote(st));
	single(&m, st, "clients", "kvbroker_clients", "gauge", "Attached ring clients.");
	single(&m, st, "control_clients", "kvbroker_control_clients", "gauge",
	       "Control-only connections (kvbctl).");
	single(&m, st, "leases", "kvbroker_leases", "gauge", "Leases held by all clients.");
	if (sdoc_arr(st, "namespaces")) {
		family(&m, "kvbroker_namespaces", "gauge", "Namespaces (model, layout, tenant).");
		sample(&m, "kvbroker_namespaces", NULL,
		       cJSON_GetArraySize(sdoc_arr(st, "namespaces")));
	}
	counters(&m, sdoc_obj(st, "counters"));
	if (sdoc_obj(st, "ops")) {
		const cJSON *ops = sdoc_obj(st, "ops");

		single(&m, ops, "parked", "kvbroker_ops_parked", "gauge",
		       "Ops waiting now: for a page being written or promoted, RAM, room in the "
		       "disk queue, or their session's next turn.");
		single(&m, ops, "inflight", "kvbroker_ops_inflight", "gauge",
		       "Ops taken from the rings and not completed yet.");
		single(&m, ops, "sessions_draining", "kvbroker_sessions_draining", "gauge",
		       "Clients gone whose ops in flight have not completed yet.");
	}
	histograms(&m, sdoc_obj(st, "histograms"));
	per_element(&m, sdoc_arr(st, "tenants"), tenant_series,
		    sizeof(tenant_series) / sizeof(tenant_series[0]), tenant_labels);
	capped = ns_capped(sdoc_arr(st, "namespaces"));
	per_element(&m, capped ? capped : sdoc_arr(st, "namespaces"), ns_series,
		    sizeof(ns_series) / sizeof(ns_series[0]), ns_labels);
	cJSON_Delete(capped);
	per_element(&m, sdoc_arr(st, "client_list"), client_series,
		    sizeof(client_series) / sizeof(client_series[0]), client_labels);
	if (m.oom) {
		free(m.p);
		return NULL;
	}
	return m.p;
}

char *metrics_from_json(const char *json)
{
	cJSON *st = cJSON_Parse(json);
	char *t = metrics_text(st);

	cJSON_Delete(st);
	return t;
}

/* ---- the checker ---- */

static int name_char(int c, int first)
{
	return isalpha(c) || c == '_' || c == ':' || (!first && isdigit(c));
}

/* Length of a metric (colons allowed) or label name at s, 0 when none. */
static size_t name_len(const char *s, int colons)
{
	size_t n = 0;

	while (s[n] && name_char((unsigned char)s[n], n == 0) && (colons || s[n] != ':'))
		n++;
	return n;
}

struct seen {
	char **v;
	size_t n, cap;
};

static int seen_add(struct seen *s, const char *p, size_t len)
{
	for (size_t i = 0; i < s->n; i++)
		if (strlen(s->v[i]) == len && !memcmp(s->v[i], p, len))
			return 1;
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 64;
		char **nv = realloc(s->v, cap * sizeof(*nv));

		if (!nv)
			return -1;
		s->v = nv;
		s->cap = cap;
	}
	s->v[s->n] = strndup(p, len);
	return s->v[s->n++] ? 0 : -1;
}

static void seen_free(struct seen *s)
{
	for (size_t i = 0; i < s->n; i++)
		free(s->v[i]);
	free(s->v);
}

/* Parses "{a="x",b="y"}" at *p (advanced past it); -1 on malformed. */
static int parse_labels(const char **p)
{
	const char *s = *p;

	if (*s != '{')
		return 0;
	s++;
	while (*s != '}') {
		size_t n = name_len(s, 0);

		if (!n || s[n] != '=' || s[n + 1] != '"')
			return -1;
		s += n + 2;
		while (*s != '"') {
			if (!*s || *s == '\n')
				return -1;
			if (*s == '\\') {
				if (s[1] != '\\' && s[1] != '"' && s[1] != 'n')
					return -1;
				s++;
			}
			s++;
		}
		s++;
		if (*s == ',')
			s++;
		else if (*s != '}')
			return -1;
	}
	*p = s + 1;
	return 0;
}

static int parse_value(const char *s, const char *end)
{
	char buf[64], *e;
	size_t n = (size_t)(end - s);

	if (!n || n >= sizeof(buf))
		return -1;
	memcpy(buf, s, n);
	buf[n] = '\0';
	if (!strcmp(buf, "NaN") || !strcmp(buf, "+Inf") || !strcmp(buf, "-Inf"))
		return 0;
	strtod(buf, &e);
	return *e ? -1 : 0;
}

/*
 * Whether a sample named p[0, n) belongs to family cur: the name itself, or for a histogram
 * (summary) the name plus _bucket, _sum or _count.
 */
static int family_sample(const char *cur, int hist, const char *p, size_t n)
{
	static const char *const sfx[] = {"_bucket", "_sum", "_count"};
	size_t c = strlen(cur);

	if (n == c && !memcmp(cur, p, n))
		return !hist;
	if (!hist || n <= c || memcmp(cur, p, c))
		return 0;
	for (size_t i = 0; i < sizeof(sfx) / sizeof(sfx[0]); i++)
		if (n - c == strlen(sfx[i]) && !memcmp(p + c, sfx[i], n - c))
			return 1;
	return 0;
}

int metrics_check(const char *text, char *err, size_t errlen)
{
	struct seen types = {0}, samples = {0};
	char cur[128] = "";
	int cur_hist = 0; /* cur is a histogram or summary: its samples carry suffixes */
	const char *line = text, *why = NULL;
	int ln = 0, rc = -1;

	if (!*text || text[strlen(text) - 1] != '\n') {
		why = "text does not end with a newline";
		goto out;
	}
	for (; *line; line = strchr(line, '\n') + 1) {
		const char *eol = strchr(line, '\n'), *p = line, *sp;
		size_t n;

		ln++;
		if (*p == '#') {
			char kw[8], nm[128], ty[16];

			if (sscanf(p, "# %7s %127s %15s", kw, nm, ty) == 3 && !strcmp(kw, "TYPE")) {
				if (strcmp(ty, "counter") && strcmp(ty, "gauge") &&
				    strcmp(ty, "histogram") && strcmp(ty, "summary") &&
				    strcmp(ty, "untyped")) {
					why = "unknown TYPE";
					goto out;
				}
				if (seen_add(&types, nm, strlen(nm))) {
					why = "TYPE declared twice";
					goto out;
				}
				if (!strcmp(ty, "counter") &&
				    (strlen(nm) < 6 || strcmp(nm + strlen(nm) - 6, "_total"))) {
					why = "counter not named *_total";
					goto out;
				}
				/* Samples must follow their TYPE: declared once, so contiguous. */
				snprintf(cur, sizeof(cur), "%s", nm);
				cur_hist = !strcmp(ty, "histogram") || !strcmp(ty, "summary");
			}
			continue;
		}
		if (p == eol) {
			why = "empty line";
			goto out;
		}
		n = name_len(p, 1);
		if (!n) {
			why = "sample line without a metric name";
			goto out;
		}
		if (!family_sample(cur, cur_hist, p, n)) {
			/* A new family without TYPE, or samples away from their family. */
			why = "sample outside its family (no TYPE before it, or not contiguous)";
			goto out;
		}
		p += n;
		if (parse_labels(&p)) {
			why = "malformed labels";
			goto out;
		}
		if (seen_add(&samples, line, (size_t)(p - line))) {
			why = "sample (name and labels) appears twice";
			goto out;
		}
		if (*p != ' ') {
			why = "no space before the value";
			goto out;
		}
		p++;
		sp = memchr(p, ' ', (size_t)(eol - p));
		if (parse_value(p, sp ? sp : eol)) {
			why = "value is not a float";
			goto out;
		}
		if (sp) {
			char *e;

			strtoll(sp + 1, &e, 10);
			if (e != eol || e == sp + 1) {
				why = "timestamp is not an integer";
				goto out;
			}
		}
	}
	rc = 0;
out:
	if (rc && err)
		snprintf(err, errlen, "line %d: %s", ln, why ? why : "out of memory");
	seen_free(&types);
	seen_free(&samples);
	return rc;
}
