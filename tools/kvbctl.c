// SPDX-License-Identifier: MIT
/*
 * kvbctl - inspect and operate a running kvbrokerd.
 *
 * kvbctl opens a control-only connection (KVB_CONNECT_CONTROL: no rings, no pool mapping, not
 * counted as a client, so looking at the broker does not change what it reports), fetches the
 * broker's statistics as JSON with kvb_stats_json() and renders them: `status` as a readable
 * summary, `clients` and `ns` as tables, `map` as a grid of the pool, `metrics` as Prometheus
 * text (common/metrics.c, the generator the broker's HTTP endpoint uses too), `top` as a live
 * view (kvbctl_top.c). `plan` (kvbctl_plan.c) needs no broker: it is the capacity planner.
 *
 * The --json output is for scripts, so it promises a shape: every field that scripts read
 * (pool.bytes_total/bytes_used/pages, clients, leases, namespaces[].id/model/kind/page_bytes/
 * pages, counters.puts/gets/hits/misses/dedup/evictions/errors) is present. A field the broker
 * did not send is added as 0 (or "" / []) with a warning on stderr, so a script never breaks on
 * a missing key while a person still sees that the broker is short of its contract. Fields
 * other work adds (pool.arenas[].page_size, the "disk" object) are shown only when present.
 *
 * Single-threaded; only the public API (kvbroker.h), cJSON and common/ (statsdoc, metrics).
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "cli.h"
#include "kvbctl.h"
#include "kvbroker.h"
#include "metrics.h"
#include "text.h"

const char *ctl_prog = "kvbctl";

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvbctl [--socket PATH] COMMAND [--json] [options]\n"
		"\n"
		"Inspect and operate a running kvbrokerd.\n"
		"\n"
		"commands:\n"
		"  status     pool use per tier and NUMA node, clients, leases, namespaces,\n"
		"             dedup savings, evictions, disk tier\n"
		"  top        live view, refreshed every --interval seconds (default 1); q quits\n"
		"  clients    one line per attached client\n"
		"  ns         one line per namespace\n"
		"  map        the pool as a grid of cells per arena: free, used, leased, in "
		"flight\n"
		"  metrics    Prometheus text exposition (what kvbrokerd --metrics-listen serves)\n"
		"  plan       capacity planner; no broker needed (kvbctl plan --help)\n"
		"  drop ID    end client ID's session (see clients): its leases are released\n"
		"             and it must reconnect; for the broker's uid or root\n"
		"  tenants    each tenant partition: clients, RAM used against its share, hits,\n"
		"             evictions\n"
		"  ns-limit [MODEL=SIZE|MODEL=N%%|MODEL=none]\n"
		"             the namespace caps by model; with an argument sets (or removes)\n"
		"             one on the running broker, at once (--ns-limit's syntax); setting\n"
		"             is for the broker's uid or root\n"
		"  tenant-share [ID=SIZE|ID=N%%|ID=none]\n"
		"             the tenants' shares; with an argument sets tenant ID's share (a\n"
		"             guarantee: what it always reclaims) at once (--tenant's syntax; "
		"none:\n"
		"             the default); for the broker's uid or root\n"
		"\n"
		"options:\n"
		"  --socket PATH   control socket (default: $KVB_SOCKET, else\n"
		"                  " KVB_SOCKET_DEFAULT "; nothing else, $XDG_RUNTIME_DIR\n"
		"                  included, moves it)\n"
		"  --json          JSON for scripts: status/metrics the whole stats document,\n"
		"                  clients/ns/map their part, top one sample of the rates\n"
		"  --interval S    top: seconds between refreshes (default 1)\n"
		"  --stats-file F  render a saved `status --json` document instead of asking a\n"
		"                  broker (all commands but top)\n"
		"  --version       print the version (kvbrokerd's, the library's and the Python\n"
		"                  package's are the same; status shows the broker's) and exit\n"
		"  -h, --help      this text\n"
		"\n"
		"exit status: 0 ok, 1 broker not reachable or bad reply, 2 usage error\n");
}

/*
 * The socket: --socket, else the library's rule (kvb_socket_path: $KVB_SOCKET, else
 * KVB_SOCKET_DEFAULT), resolved here so that output and errors can name it. 0 or -ENAMETOOLONG.
 */
static int socket_path(const char *flag, char *buf, size_t len)
{
	int rc = kvb_socket_path(flag && *flag ? flag : NULL, buf, len);

	if (rc < 0)
		fprintf(stderr, "%s: %s\n", ctl_prog,
			kvb_connect_error(rc, flag && *flag ? flag : NULL, buf, len));
	return rc;
}

int ctl_connect(struct ctl *x, int quiet)
{
	struct kvb_opts opts;
	char msg[1024];
	int rc;

	memset(&opts, 0, sizeof(opts));
	opts.socket_path = x->path;
	opts.name = "kvbctl";
	opts.flags = KVB_CONNECT_CONTROL;
	rc = kvb_connect(&opts, &x->c);
	if (rc < 0) {
		x->c = NULL;
		if (!quiet)
			fprintf(stderr, "%s: %s\n", ctl_prog,
				kvb_connect_error(rc, x->path, msg, sizeof(msg)));
	}
	return rc;
}

void ctl_disconnect(struct ctl *x)
{
	kvb_close(x->c);
	x->c = NULL;
}

int ctl_fetch(struct ctl *x, cJSON **root, int quiet)
{
	char *text = NULL;
	int rc = kvb_stats_json(x->c, &text);

	*root = NULL;
	if (rc < 0) {
		if (!quiet)
			fprintf(stderr, "%s: stats request to %s failed: %s\n", ctl_prog, x->path,
				kvb_strerror(rc));
		return rc;
	}
	*root = cJSON_Parse(text);
	free(text);
	if (!cJSON_IsObject(*root)) {
		if (!quiet)
			fprintf(stderr, "%s: broker at %s sent stats that are not a JSON object\n",
				ctl_prog, x->path);
		cJSON_Delete(*root);
		*root = NULL;
		return -EPROTO;
	}
	return 0;
}

const char *fmt_pct(double num, double den, char *buf, size_t len)
{
	if (den <= 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%.1f%%", 100.0 * num / den);
	return buf;
}

/* ---- the --json shape guarantee ---- */

static void need(cJSON *o, const char *where, const char *name, int type)
{
	cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);
	int ok;

	switch (type) {
	case cJSON_Number:
		ok = cJSON_IsNumber(v);
		break;
	case cJSON_String:
		ok = cJSON_IsString(v);
		break;
	case cJSON_Array:
		ok = cJSON_IsArray(v);
		break;
	default:
		ok = cJSON_IsObject(v);
		break;
	}
	if (ok)
		return;
	fprintf(stderr, "%s: warning: broker stats lack %s%s; reported as empty\n", ctl_prog, where,
		name);
	if (v)
		cJSON_DeleteItemFromObjectCaseSensitive(o, name);
	switch (type) {
	case cJSON_Number:
		cJSON_AddNumberToObject(o, name, 0);
		break;
	case cJSON_String:
		cJSON_AddStringToObject(o, name, "");
		break;
	case cJSON_Array:
		cJSON_AddArrayToObject(o, name);
		break;
	default:
		cJSON_AddObjectToObject(o, name);
		break;
	}
}

/* Makes sure root has at least the shape promised to scripts (the file's header). */
static void ensure_shape(cJSON *root)
{
	static const char *const pool_f[] = {"bytes_total", "bytes_used", "pages"};
	static const char *const ns_num[] = {"id", "page_bytes", "pages"};
	static const char *const ctr_f[] = {"puts",  "gets",	  "hits",  "misses",
					    "dedup", "evictions", "errors"};
	cJSON *pool, *ctr, *ns;
	size_t i;

	need(root, "", "pool", cJSON_Object);
	pool = cJSON_GetObjectItemCaseSensitive(root, "pool");
	for (i = 0; i < sizeof(pool_f) / sizeof(pool_f[0]); i++)
		need(pool, "pool.", pool_f[i], cJSON_Number);
	need(root, "", "clients", cJSON_Number);
	need(root, "", "leases", cJSON_Number);
	need(root, "", "namespaces", cJSON_Array);
	cJSON_ArrayForEach(ns, cJSON_GetObjectItemCaseSensitive(root, "namespaces"))
	{
		if (!cJSON_IsObject(ns))
			continue;
		for (i = 0; i < sizeof(ns_num) / sizeof(ns_num[0]); i++)
			need(ns, "namespaces[].", ns_num[i], cJSON_Number);
		need(ns, "namespaces[].", "model", cJSON_String);
		need(ns, "namespaces[].", "kind", cJSON_String);
	}
	need(root, "", "counters", cJSON_Object);
	ctr = cJSON_GetObjectItemCaseSensitive(root, "counters");
	for (i = 0; i < sizeof(ctr_f) / sizeof(ctr_f[0]); i++)
		need(ctr, "counters.", ctr_f[i], cJSON_Number);
}

/* ---- text renderings ---- */

/* Bytes not stored twice: the broker's figure, or dedup hits x page size from an older one. */
static double dedup_saved(const cJSON *root)
{
	const cJSON *ctr = sdoc_obj(root, "counters"), *ns;
	double saved = 0;

	if (cJSON_GetObjectItemCaseSensitive(ctr, "dedup_bytes"))
		return sdoc_num(ctr, "dedup_bytes");
	cJSON_ArrayForEach(ns, sdoc_arr(root, "namespaces"))
	{
		saved += sdoc_num(ns, "dedup") * sdoc_num(ns, "page_bytes");
	}
	return saved;
}

static double ns_saved(const cJSON *ns)
{
	return cJSON_GetObjectItemCaseSensitive(ns, "dedup_bytes")
		       ? sdoc_num(ns, "dedup_bytes")
		       : sdoc_num(ns, "dedup") * sdoc_num(ns, "page_bytes");
}

/*
 * s cut to at most w bytes at a character boundary, for a %-W.Ws column: printf counts bytes
 * and would cut a UTF-8 sequence in two (invalid output, a terminal's odd glyph).
 */
static const char *clip(const char *s, size_t w, char *buf, size_t len)
{
	size_t n = 0, k;

	while (n < len - 1 && s[n]) {
		k = text_utf8_seq((const unsigned char *)s + n, strlen(s + n));
		if (!k || n + k > w || n + k > len - 1)
			break;
		n += k;
	}
	memcpy(buf, s, n);
	buf[n] = '\0';
	return buf;
}

/* "remote: off", or the remote tier's shards and figures (--remote). */
static void print_remote(const cJSON *root)
{
	const cJSON *r = sdoc_remote(root);
	char a[32], b[32], c[32];

	if (!r) {
		printf("remote: off\n");
		return;
	}
	printf("remote     %s  %s %s, %.0f of %.0f shards reachable, publish %s\n",
	       sdoc_str(r, "state"), sdoc_str(r, "backend"), sdoc_str(r, "seeds"),
	       sdoc_num(r, "shards_reachable"), sdoc_num(r, "shards"), sdoc_str(r, "publish"));
	printf("           published %.0f (%s, %.0f there already)  fetched %.0f of %.0f (%s, "
	       "hit rate %s)\n",
	       sdoc_num(r, "published"), text_bytes(sdoc_num(r, "publish_bytes"), a, sizeof(a)),
	       sdoc_num(r, "publish_existed"), sdoc_num(r, "fetched"), sdoc_num(r, "fetches"),
	       text_bytes(sdoc_num(r, "fetch_bytes"), b, sizeof(b)),
	       fmt_pct(sdoc_num(r, "fetched"), sdoc_num(r, "fetches"), c, sizeof(c)));
	printf("           in flight %s  errors %.0f  timeouts %.0f  corrupt %.0f  wrong key %.0f  "
	       "other version %.0f  back-offs %.0f  recoveries %.0f\n",
	       text_bytes(sdoc_num(r, "bytes_in_flight"), a, sizeof(a)), sdoc_num(r, "errors"),
	       sdoc_num(r, "timeouts"), sdoc_num(r, "corrupt"), sdoc_num(r, "wrong_key"),
	       sdoc_num(r, "other_version"), sdoc_num(r, "backoffs"), sdoc_num(r, "recoveries"));
}

/* "disk: off", or the disk tier's state and figures (fields of the disk-tier work). */
static void print_disk(const cJSON *root)
{
	const cJSON *d = sdoc_disk(root), *p;
	char a[32], b[32], c[32], e[32];
	int first = 1;

	if (!d) {
		printf("disk: off\n");
		return;
	}
	printf("disk       %s  %s used of %s (%s), %.0f pages%s\n", sdoc_str(d, "state"),
	       text_bytes(sdoc_num(d, "bytes_used"), a, sizeof(a)),
	       text_bytes(sdoc_num(d, "bytes_total"), b, sizeof(b)),
	       fmt_pct(sdoc_num(d, "bytes_used"), sdoc_num(d, "bytes_total"), c, sizeof(c)),
	       sdoc_num(d, "pages"),
	       cJSON_IsTrue(cJSON_GetObjectItem(d, "direct")) ? ", O_DIRECT" : "");
	printf("           paths");
	cJSON_ArrayForEach(p, sdoc_arr(d, "paths"))
	{
		if (cJSON_IsString(p))
			printf("%s%s", first ? " " : ", ", p->valuestring);
		first = 0;
	}
	printf("%s\n", first ? " -" : "");
	printf("           reads %.0f (%s)  writes %.0f (%s)  demotions %.0f  promotions %.0f\n",
	       sdoc_num(d, "reads"), text_bytes(sdoc_num(d, "read_bytes"), a, sizeof(a)),
	       sdoc_num(d, "writes"), text_bytes(sdoc_num(d, "write_bytes"), e, sizeof(e)),
	       sdoc_num(d, "demotions"), sdoc_num(d, "promotions"));
	printf("           errors %.0f  corrupt %.0f  torn %.0f  dropped %.0f  scan %.2f s\n",
	       sdoc_num(d, "errors"), sdoc_num(d, "corrupt"), sdoc_num(d, "torn"),
	       sdoc_num(d, "dropped"), sdoc_num(d, "scan_seconds"));
}

/* The settings not at their default, and where each came from (the whole list: --json). */
static void print_config(const cJSON *root)
{
	const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config"), *o;
	int n = 0;

	if (!cJSON_IsObject(cfg))
		return; /* an older broker, or a tenant's view */
	cJSON_ArrayForEach(o, cfg)
	{
		const char *src = sdoc_str(o, "source");
		char *v;

		if (!strcmp(src, "default"))
			continue;
		v = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(o, "value"));
		printf("%s%s = %s  (%s)\n", n++ ? "           " : "config     ", o->string,
		       v ? v : "?", src);
		free(v);
	}
	if (!n)
		printf("config     defaults only\n");
}

static void print_status(const cJSON *root, const char *path, int from_file)
{
	const cJSON *pool = sdoc_obj(root, "pool");
	const cJSON *ctr = sdoc_obj(root, "counters");
	const cJSON *nss = sdoc_arr(root, "namespaces");
	const cJSON *ns;
	struct sdoc_node nodes[SDOC_MAX_NODES];
	double total = sdoc_num(pool, "bytes_total"), used = sdoc_num(pool, "bytes_used");
	double hits = sdoc_num(ctr, "hits"), misses = sdoc_num(ctr, "misses");
	char a[32], b[32], c[32], d[32];
	int nn = sdoc_nodes(root, nodes, SDOC_MAX_NODES);

	printf("kvbrokerd %s  pid %.0f  up %.1f s  %s %s\n", sdoc_str(root, "version"),
	       sdoc_num(root, "pid"), sdoc_num(root, "uptime_s"), from_file ? "file" : "socket",
	       path);
	if (*sdoc_str(root, "metrics_listen"))
		printf("metrics    http://%s/metrics\n", sdoc_str(root, "metrics_listen"));
	printf("ram        %s used of %s (%s), %.0f pages, %.0f pinned",
	       text_bytes(used, a, sizeof(a)), text_bytes(total, b, sizeof(b)),
	       fmt_pct(used, total, c, sizeof(c)), sdoc_num(pool, "pages"),
	       sdoc_num(pool, "pinned_pages"));
	if (sdoc_has(pool, "slabs_total"))
		printf(", slabs %.0f free of %.0f x %s", sdoc_num(pool, "slabs_free"),
		       sdoc_num(pool, "slabs_total"),
		       text_bytes(sdoc_num(pool, "slab_bytes"), d, sizeof(d)));
	printf("\n");
	for (int i = 0; i < nn; i++) {
		char nd[16];

		snprintf(nd, sizeof(nd), nodes[i].node < 0 ? "-" : "%d", nodes[i].node);
		printf("  node %-3s %s used of %s (%s), %d arena%s%s%s\n", nd,
		       text_bytes(nodes[i].used, a, sizeof(a)),
		       text_bytes(nodes[i].total, b, sizeof(b)),
		       fmt_pct(nodes[i].used, nodes[i].total, c, sizeof(c)), nodes[i].arenas,
		       nodes[i].arenas == 1 ? "" : "s", *nodes[i].page_size ? ", pages " : "",
		       nodes[i].page_size);
	}
	if (cJSON_GetObjectItemCaseSensitive(pool, "high_watermark")) {
		double hw = sdoc_num(pool, "high_watermark"), lw = sdoc_num(pool, "low_watermark");

		/* The broker may report watermarks as fractions or as percentages. */
		if (hw <= 1.0 && lw <= 1.0) {
			hw *= 100;
			lw *= 100;
		}
		printf("           eviction above %.0f%% down to %.0f%%\n", hw, lw);
	}
	if (sdoc_has(pool, "restart_safe")) {
		if (sdoc_num(pool, "restart_safe"))
			printf("           survives a broker crash: kept by %s",
			       sdoc_str(pool, "kept_by"));
		else
			printf("           AT RISK: a broker crash loses the pool (kept by %s)",
			       sdoc_str(pool, "kept_by"));
		if (sdoc_num(pool, "keeper_pid"))
			printf(" (pid %.0f)", sdoc_num(pool, "keeper_pid"));
		if (sdoc_num(pool, "keeper_deaths"))
			printf(", %.0f keeper(s) died, %.0f restarted",
			       sdoc_num(pool, "keeper_deaths"), sdoc_num(pool, "keeper_starts"));
		printf("\n");
	}
	print_disk(root);
	print_remote(root);
	printf("clients    %.0f   leases %.0f   namespaces %d\n", sdoc_num(root, "clients"),
	       sdoc_num(root, "leases"), nss ? cJSON_GetArraySize(nss) : 0);

	if (nss && cJSON_GetArraySize(nss) > 0) {
		printf("\n%4s  %-24s %-4s %6s %10s %8s %10s %8s %8s %8s %10s\n", "ns", "model",
		       "kind", "tokens", "page", "pages", "bytes", "hit rate", "puts", "dedup",
		       "saved");
		cJSON_ArrayForEach(ns, nss)
		{
			double h = sdoc_num(ns, "hits"), m = sdoc_num(ns, "misses");
			char e[32], mb[32];

			printf("%4.0f  %-24.24s %-4s %6.0f %10s %8.0f %10s %8s %8.0f %8.0f %10s\n",
			       sdoc_num(ns, "id"), clip(sdoc_str(ns, "model"), 24, mb, sizeof(mb)),
			       sdoc_str(ns, "kind"), sdoc_num(ns, "tokens_per_page"),
			       text_bytes(sdoc_num(ns, "page_bytes"), a, sizeof(a)),
			       sdoc_num(ns, "pages"),
			       text_bytes(sdoc_num(ns, "bytes"), b, sizeof(b)),
			       fmt_pct(h, h + m, c, sizeof(c)), sdoc_num(ns, "puts"),
			       sdoc_num(ns, "dedup"), text_bytes(ns_saved(ns), e, sizeof(e)));
		}
	}

	printf("\ncounters   puts %.0f  gets %.0f  hits %.0f  misses %.0f  (hit rate %s)\n",
	       sdoc_num(ctr, "puts"), sdoc_num(ctr, "gets"), hits, misses,
	       fmt_pct(hits, hits + misses, a, sizeof(a)));
	printf("           dedup %.0f  evictions %.0f  errors %.0f\n", sdoc_num(ctr, "dedup"),
	       sdoc_num(ctr, "evictions"), sdoc_num(ctr, "errors"));
	printf("           acquires %.0f  releases %.0f  lookups %.0f (%.0f keys)  deletes %.0f  "
	       "nops %.0f\n",
	       sdoc_num(ctr, "acquires"), sdoc_num(ctr, "releases"), sdoc_num(ctr, "lookups"),
	       sdoc_num(ctr, "lookup_keys"), sdoc_num(ctr, "deletes"), sdoc_num(ctr, "nops"));
	printf("           in %s  out %s  disconnects %.0f  protocol errors %.0f\n",
	       text_bytes(sdoc_num(ctr, "bytes_in"), a, sizeof(a)),
	       text_bytes(sdoc_num(ctr, "bytes_out"), b, sizeof(b)), sdoc_num(ctr, "disconnects"),
	       sdoc_num(ctr, "protocol_errors"));
	printf("dedup      %s not stored twice: PUTs that found the page already stored by "
	       "another rank or engine\n",
	       text_bytes(dedup_saved(root), a, sizeof(a)));
	print_config(root);
}

/* "0,3" from a client's namespace ids, "-" when none or an older broker. */
const char *ctl_ns_list(const cJSON *cl, char *buf, size_t len)
{
	const cJSON *id;
	size_t n = 0;

	buf[0] = '\0';
	cJSON_ArrayForEach(id, sdoc_arr(cl, "ns"))
	{
		int w = snprintf(buf + n, len - n, "%s%.0f", n ? "," : "", id->valuedouble);

		if (w < 0 || (size_t)w >= len - n)
			break;
		n += (size_t)w;
	}
	if (!n)
		snprintf(buf, len, "-");
	return buf;
}

static void print_clients(const cJSON *root)
{
	const cJSON *list = sdoc_arr(root, "client_list");
	const cJSON *cl;

	if (!list || cJSON_GetArraySize(list) == 0) {
		printf("no clients attached (%.0f reported)\n", sdoc_num(root, "clients"));
		return;
	}
	printf("%6s %8s %6s  %-24s %-12s %7s %12s %10s %10s %10s %10s\n", "id", "pid", "uid",
	       "name", "ns", "leases", "ops", "puts", "gets", "in", "out");
	cJSON_ArrayForEach(cl, list)
	{
		char nsb[64], a[32], b[32], nm[32];

		printf("%6.0f %8.0f %6.0f  %-24.24s %-12.12s %7.0f %12.0f %10.0f %10.0f %10s "
		       "%10s\n",
		       sdoc_num(cl, "id"), sdoc_num(cl, "pid"), sdoc_num(cl, "uid"),
		       clip(sdoc_str(cl, "name"), 24, nm, sizeof(nm)),
		       ctl_ns_list(cl, nsb, sizeof(nsb)), sdoc_num(cl, "leases"),
		       sdoc_num(cl, "ops"), sdoc_num(cl, "puts"), sdoc_num(cl, "gets"),
		       text_bytes(sdoc_num(cl, "bytes_in"), a, sizeof(a)),
		       text_bytes(sdoc_num(cl, "bytes_out"), b, sizeof(b)));
	}
}

static void print_ns(const cJSON *root)
{
	const cJSON *nss = sdoc_arr(root, "namespaces");
	const cJSON *ns;
	char a[32], b[32], c[32], d[32];

	if (!nss || cJSON_GetArraySize(nss) == 0) {
		printf("no namespaces\n");
		return;
	}
	printf("%4s  %-24s %-4s %6s %5s %5s %7s %10s %8s %10s %8s %8s %8s %8s %10s\n", "ns",
	       "model", "kind", "tokens", "tp", "comps", "clients", "page", "pages", "bytes",
	       "hit rate", "hits", "puts", "dedup", "saved");
	cJSON_ArrayForEach(ns, nss)
	{
		double h = sdoc_num(ns, "hits"), m = sdoc_num(ns, "misses");
		char tp[16], mb[32];

		snprintf(tp, sizeof(tp), "%.0f/%.0f", sdoc_num(ns, "tp_rank"),
			 sdoc_num(ns, "tp_size"));
		/* MLA namespaces are shared by all ranks: the rank is no part of them. */
		if (!strcmp(sdoc_str(ns, "kind"), "mla"))
			snprintf(tp, sizeof(tp), "%.0f", sdoc_num(ns, "tp_size"));
		printf("%4.0f  %-24.24s %-4s %6.0f %5s %5.0f %7.0f %10s %8.0f %10s %8s %8.0f %8.0f "
		       "%8.0f %10s\n",
		       sdoc_num(ns, "id"), clip(sdoc_str(ns, "model"), 24, mb, sizeof(mb)),
		       sdoc_str(ns, "kind"), sdoc_num(ns, "tokens_per_page"), tp,
		       sdoc_num(ns, "components"), sdoc_num(ns, "clients"),
		       text_bytes(sdoc_num(ns, "page_bytes"), a, sizeof(a)), sdoc_num(ns, "pages"),
		       text_bytes(sdoc_num(ns, "bytes"), b, sizeof(b)),
		       fmt_pct(h, h + m, c, sizeof(c)), h, sdoc_num(ns, "puts"),
		       sdoc_num(ns, "dedup"), text_bytes(ns_saved(ns), d, sizeof(d)));
	}
}

/* ---- map ---- */

/*
 * One character per cell: in flight wins over leased wins over how full it is, so the pages
 * that cannot move stand out.
 */
static char map_cell(double used, double pinned, double writing, double cap)
{
	if (writing > 0)
		return 'W';
	if (pinned > writing)
		return 'L';
	if (used <= 0)
		return '.';
	if (used < cap / 2)
		return ':';
	return used < cap ? '+' : '#';
}

#define MAP_COLS 64

static void print_map(const cJSON *root)
{
	const cJSON *map = sdoc_arr(root, "map"), *a;
	char x[32], y[32];

	if (!map || !cJSON_GetArraySize(map)) {
		printf("this broker sends no pool map (an older kvbrokerd)\n");
		return;
	}
	cJSON_ArrayForEach(a, map)
	{
		const cJSON *used = sdoc_arr(a, "used"), *pinned = sdoc_arr(a, "pinned");
		const cJSON *writing = sdoc_arr(a, "writing");
		double slab = sdoc_num(a, "slab_bytes"), slabs = sdoc_num(a, "slabs");
		double per = sdoc_num(a, "slabs_per_cell");
		int n = cJSON_GetArraySize(used);

		printf("arena %.0f  node %.0f  %s in %.0f slabs of %s, %.0f slab%s per cell\n",
		       sdoc_num(a, "arena"), sdoc_num(a, "node"),
		       text_bytes(slab * slabs, x, sizeof(x)), slabs,
		       text_bytes(slab, y, sizeof(y)), per, per == 1 ? "" : "s");
		for (int i = 0; i < n; i++) {
			double left = slabs - i * per;
			double cap = (left < per ? left : per) * slab;
			const cJSON *u = cJSON_GetArrayItem(used, i);
			const cJSON *p = cJSON_GetArrayItem(pinned, i);
			const cJSON *w = cJSON_GetArrayItem(writing, i);

			if (i % MAP_COLS == 0)
				printf("  ");
			putchar(map_cell(u ? u->valuedouble : 0, p ? p->valuedouble : 0,
					 w ? w->valuedouble : 0, cap));
			if (i % MAP_COLS == MAP_COLS - 1 || i == n - 1)
				putchar('\n');
		}
	}
	printf("legend: . free  : under half used  + over half  # full  "
	       "L holds leased pages  W a page in flight\n");
}

int ctl_print_json(const cJSON *v)
{
	char *s = cJSON_Print(v);

	if (!s) {
		fprintf(stderr, "%s: out of memory\n", ctl_prog);
		return 1;
	}
	printf("%s\n", s);
	free(s);
	return 0;
}

static int print_metrics(const cJSON *root)
{
	char *t = metrics_text(root);

	if (!t) {
		fprintf(stderr, "%s: out of memory\n", ctl_prog);
		return 1;
	}
	fputs(t, stdout);
	free(t);
	return 0;
}

/* The part of the document a table command prints as JSON (an empty array when absent). */
static int print_part(const cJSON *root, const char *name)
{
	const cJSON *v = sdoc_arr(root, name);
	cJSON *empty = cJSON_CreateArray();
	int ret = ctl_print_json(v ? v : empty);

	cJSON_Delete(empty);
	return ret;
}

static const char *const commands[] = {"status",  "clients",  "ns",	     "map",
				       "metrics", "top",      "plan",	     "drop",
				       "tenants", "ns-limit", "tenant-share"};
#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

/* kvbctl drop ID: one DROP message (the operator's answer to a client pinning the pool). */
static int ctl_drop(struct ctl *x, const char *arg)
{
	char *end;
	unsigned long id = strtoul(arg, &end, 10);
	int err;

	if (!*arg || *end || id > UINT32_MAX)
		return cli_usage_error(ctl_prog,
				       "drop: want a client id (kvbctl clients), not '%s'", arg);
	if (ctl_connect(x, 0) < 0)
		return 1;
	err = kvb_drop_client(x->c, (uint32_t)id);
	if (err < 0) {
		fprintf(stderr, "%s: drop %lu: %s\n", ctl_prog, id,
			err == -ENOENT	 ? "no such client"
			: err == -EPERM	 ? "only the broker's uid or root may drop clients"
			: err == -EINVAL ? "that is this connection"
					 : strerror(-err));
		return 1;
	}
	printf("dropped client %lu\n", id);
	return 0;
}

struct cli {
	const char *sock, *file;
	int json;
	double interval;
};

/*
 * kvbctl's options, before the command (spec "+...": stop at it) and after it. Returns -1 to
 * go on, else the exit status (0 after --help, 2 on a usage error).
 */
static int parse_opts(int argc, char **argv, const char *spec, struct cli *o)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{"interval", required_argument, NULL, 'i'},
		{"stats-file", required_argument, NULL, 'f'},
		{"help", no_argument, NULL, 'h'},
		{"version", no_argument, NULL, 'V'},
		{NULL, 0, NULL, 0},
	};
	char *end;
	int opt;

	while ((opt = cli_getopt(argc, argv, spec, lopts, ctl_prog)) != -1) {
		switch (opt) {
		case 's':
			o->sock = optarg;
			break;
		case 'f':
			o->file = optarg;
			break;
		case 'j':
			o->json = 1;
			break;
		case 'i':
			o->interval = strtod(optarg, &end);
			if (*end || !(o->interval >= 0.05 && o->interval <= 3600))
				return cli_usage_error(ctl_prog,
						       "--interval: seconds, 0.05 to 3600");
			break;
		case 'h':
			usage(stdout);
			return 0;
		case 'V':
			cli_version(ctl_prog);
			return 0;
		default: /* cli_getopt() said what */
			return CLI_USAGE;
		}
	}
	return -1;
}

/* A stats document saved earlier (status --json), for rendering it offline. */
static cJSON *read_stats_file(const char *path)
{
	FILE *f = fopen(path, "r");
	size_t cap = 1 << 16, len = 0, n;
	char *buf = malloc(cap);
	cJSON *root = NULL;

	if (!f || !buf) {
		fprintf(stderr, "%s: %s: %s\n", ctl_prog, path,
			f ? "out of memory" : strerror(errno));
		goto out;
	}
	while ((n = fread(buf + len, 1, cap - len - 1, f)) > 0) {
		len += n;
		if (len == cap - 1) {
			char *nb = realloc(buf, cap * 2);

			if (!nb)
				goto out;
			buf = nb;
			cap *= 2;
		}
	}
	buf[len] = '\0';
	root = cJSON_Parse(buf);
	if (!cJSON_IsObject(root)) {
		fprintf(stderr, "%s: %s is not a stats document (JSON object)\n", ctl_prog, path);
		cJSON_Delete(root);
		root = NULL;
	}
out:
	if (f)
		fclose(f);
	free(buf);
	return root;
}

int main(int argc, char **argv)
{
	struct cli o = {.interval = 1.0};
	struct ctl x = {0};
	const char *cmd = NULL;
	cJSON *root = NULL;
	int ret, known = 0;

	/* Options before the command, then the command; plan parses the rest itself. */
	ret = parse_opts(argc, argv, "+s:jhf:", &o);
	if (ret >= 0)
		return ret;
	if (optind < argc)
		cmd = argv[optind];
	for (size_t i = 0; cmd && i < NCOMMANDS; i++)
		known |= !strcmp(cmd, commands[i]);
	if (!cmd)
		return cli_usage_error(ctl_prog,
				       "no command: status, top, clients, ns, map, metrics, "
				       "tenants, ns-limit, tenant-share, plan or drop");
	if (!known) {
		const char *near[1];

		if (cli_nearest(cmd, strlen(cmd), commands, NCOMMANDS, near, 1) == 1)
			return cli_usage_error(ctl_prog, "unknown command '%s'; did you mean %s?",
					       cmd, near[0]);
		return cli_usage_error(ctl_prog, "unknown command '%s'", cmd);
	}
	if (!strcmp(cmd, "plan"))
		return ctl_plan(argc - optind, argv + optind, o.json);
	/* Options after the command too ("kvbctl status --json"). */
	argc -= optind;
	argv += optind;
	optind = 1;
	ret = parse_opts(argc, argv, "s:jhf:", &o);
	if (ret >= 0)
		return ret;
	if (!strcmp(cmd, "drop")) {
		if (optind + 1 != argc)
			return cli_usage_error(ctl_prog, "drop takes one client id (kvbctl clients "
							 "lists them)");
		if (socket_path(o.sock, x.path, sizeof(x.path)) < 0)
			return 1;
		ret = ctl_drop(&x, argv[optind]);
		ctl_disconnect(&x);
		return ret;
	}
	if (!strcmp(cmd, "ns-limit") && optind < argc) {
		if (optind + 1 != argc || o.file)
			return cli_usage_error(ctl_prog, "ns-limit takes one MODEL=SIZE|N%%|none "
							 "(none: show them)");
		if (socket_path(o.sock, x.path, sizeof(x.path)) < 0)
			return 1;
		ret = ctl_ns_limit_set(&x, argv[optind]);
		ctl_disconnect(&x);
		return ret;
	}
	if (!strcmp(cmd, "tenant-share") && optind < argc) {
		if (optind + 1 != argc || o.file)
			return cli_usage_error(ctl_prog, "tenant-share takes one ID=SIZE|N%%|none "
							 "(none: show them)");
		if (socket_path(o.sock, x.path, sizeof(x.path)) < 0)
			return 1;
		ret = ctl_tenant_share_set(&x, argv[optind]);
		ctl_disconnect(&x);
		return ret;
	}
	if (optind < argc)
		return cli_usage_error(ctl_prog, "unexpected argument '%s'", argv[optind]);
	ret = 1;
	if (!o.file && socket_path(o.sock, x.path, sizeof(x.path)) < 0)
		return 1;
	if (o.file) {
		if (!strcmp(cmd, "top"))
			return cli_usage_error(ctl_prog,
					       "top needs a live broker, not --stats-file");
		snprintf(x.path, sizeof(x.path), "%s", o.file);
		root = read_stats_file(o.file);
		if (!root)
			return 1;
	} else {
		if (ctl_connect(&x, 0) < 0)
			return 1;
		if (!strcmp(cmd, "top")) {
			ret = o.json ? ctl_top_json(&x, o.interval) : ctl_top(&x, o.interval);
			goto out;
		}
		if (ctl_fetch(&x, &root, 0) < 0)
			goto out;
	}
	ensure_shape(root);
	/* Tables go to a terminal; JSON is escaped by cJSON, metrics escape their labels. */
	if (!o.json && strcmp(cmd, "metrics"))
		sdoc_printable(root);

	if (!strcmp(cmd, "status"))
		ret = o.json ? ctl_print_json(root)
			     : (print_status(root, x.path, o.file != NULL), 0);
	else if (!strcmp(cmd, "clients"))
		ret = o.json ? print_part(root, "client_list") : (print_clients(root), 0);
	else if (!strcmp(cmd, "ns"))
		ret = o.json ? print_part(root, "namespaces") : (print_ns(root), 0);
	else if (!strcmp(cmd, "map"))
		ret = o.json ? print_part(root, "map") : (print_map(root), 0);
	else if (!strcmp(cmd, "tenants") || !strcmp(cmd, "tenant-share"))
		ret = o.json ? print_part(root, "tenants") : (ctl_print_tenants(root), 0);
	else if (!strcmp(cmd, "ns-limit"))
		ret = o.json ? print_part(root, "ns_limits") : (ctl_print_limits(root), 0);
	else
		ret = o.json ? ctl_print_json(root) : print_metrics(root);
out:
	cJSON_Delete(root);
	ctl_disconnect(&x);
	return ret;
}
