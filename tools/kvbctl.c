// SPDX-License-Identifier: MIT
/*
 * kvbctl - inspect a running kvbrokerd.
 *
 * kvbctl opens a control-only connection (KVB_CONNECT_CONTROL: no rings, no pool mapping, not
 * counted as a client, so looking at the broker does not change what it reports), fetches the
 * broker's statistics as JSON with kvb_stats_json() and renders them: `status` as a readable
 * summary, `clients` and `ns` as tables, and any of them re-emitted as pretty JSON with --json.
 *
 * The --json output is for scripts, so it promises a shape: every field that issue 2 names
 * (pool.bytes_total/bytes_used/pages, clients, leases, namespaces[].id/model/kind/page_bytes/
 * pages, counters.puts/gets/hits/misses/dedup/evictions/errors) is present. A field the broker
 * did not send is added as 0 (or "" / []) with a warning on stderr, so a script never breaks on
 * a missing key while a person still sees that the broker is short of its contract.
 *
 * Single-threaded; only the public API (kvbroker.h) and cJSON.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kvbroker.h"

static const char *prog = "kvbctl";

static void usage(FILE *f)
{
	fprintf(f,
		"usage: kvbctl [--socket PATH] COMMAND [--json]\n"
		"\n"
		"Inspect a running kvbrokerd.\n"
		"\n"
		"commands:\n"
		"  status     pool occupancy, clients, leases, namespaces, counters, dedup\n"
		"  clients    one line per attached client\n"
		"  ns         one line per namespace\n"
		"\n"
		"options:\n"
		"  --socket PATH  control socket (default: $KVB_SOCKET, else\n"
		"                 $XDG_RUNTIME_DIR/kvbroker.sock, else\n"
		"                 /run/kvbroker/kvbroker.sock)\n"
		"  --json         print the broker's statistics as JSON (pretty) instead of text\n"
		"  -h, --help     this text\n"
		"\n"
		"exit status: 0 ok, 1 broker not reachable or bad reply, 2 usage error\n");
}

/* The path the library will try, resolved the same way, so an error can say where we looked. */
static void socket_path(const char *flag, char *buf, size_t len)
{
	const char *env = getenv("KVB_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");

	if (flag && *flag)
		snprintf(buf, len, "%s", flag);
	else if (env && *env)
		snprintf(buf, len, "%s", env);
	else if (xdg && *xdg)
		snprintf(buf, len, "%s/kvbroker.sock", xdg);
	else
		snprintf(buf, len, "/run/kvbroker/kvbroker.sock");
}

/* kvb_strerror() speaks of pages; a failed connect deserves words about sockets. */
static const char *connect_error(int rc)
{
	switch (rc) {
	case -ENOENT:
		return "no socket there";
	case -ECONNREFUSED:
		return "socket exists but no broker listens: a stale file?";
	case -EACCES:
	case -EPERM:
		return "permission denied: not the broker's uid or --group";
	case -EPROTO:
		return "broker speaks another protocol version";
	default:
		return kvb_strerror(rc);
	}
}

/* ---- JSON access: absent or mistyped fields read as 0 / "" rather than crashing. ---- */

static double jnum(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

static const char *jstr(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
}

static const cJSON *jarr(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsArray(v) ? v : NULL;
}

/* Binary units for sizes (what the pool is configured in), one decimal. */
static const char *fmt_bytes(double b, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	unsigned u = 0;

	while (fabs(b) >= 1024.0 && u < 5) {
		b /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%.0f B", b);
	else
		snprintf(buf, len, "%.1f %s", b, unit[u]);
	return buf;
}

static const char *fmt_pct(double num, double den, char *buf, size_t len)
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
	fprintf(stderr, "%s: warning: broker stats lack %s%s; reported as empty\n", prog, where,
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

/* Makes sure root has at least the shape issue 2 promises to scripts. */
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

static void print_status(const cJSON *root, const char *path)
{
	const cJSON *pool = cJSON_GetObjectItemCaseSensitive(root, "pool");
	const cJSON *ctr = cJSON_GetObjectItemCaseSensitive(root, "counters");
	const cJSON *nss = jarr(root, "namespaces");
	const cJSON *ns;
	double total = jnum(pool, "bytes_total"), used = jnum(pool, "bytes_used");
	double saved = 0, hits = jnum(ctr, "hits"), misses = jnum(ctr, "misses");
	char a[32], b[32], c[32], d[32];

	printf("kvbrokerd %s  pid %.0f  up %.1f s  socket %s\n", jstr(root, "version"),
	       jnum(root, "pid"), jnum(root, "uptime_s"), path);
	printf("pool       %s used of %s (%s), %.0f pages", fmt_bytes(used, a, sizeof(a)),
	       fmt_bytes(total, b, sizeof(b)), fmt_pct(used, total, c, sizeof(c)),
	       jnum(pool, "pages"));
	if (cJSON_GetObjectItemCaseSensitive(pool, "slabs_total"))
		printf(", slabs %.0f free of %.0f x %s", jnum(pool, "slabs_free"),
		       jnum(pool, "slabs_total"),
		       fmt_bytes(jnum(pool, "slab_bytes"), d, sizeof(d)));
	printf("\n");
	if (cJSON_GetObjectItemCaseSensitive(pool, "high_watermark")) {
		double hw = jnum(pool, "high_watermark"), lw = jnum(pool, "low_watermark");

		/* The broker may report watermarks as fractions or as percentages. */
		if (hw <= 1.0 && lw <= 1.0) {
			hw *= 100;
			lw *= 100;
		}
		printf("           eviction above %.0f%% down to %.0f%%\n", hw, lw);
	}
	if (cJSON_IsObject(cJSON_GetObjectItemCaseSensitive(root, "disk"))) {
		const cJSON *dk = cJSON_GetObjectItemCaseSensitive(root, "disk");

		/* One line for the NVMe tier; "off" when the broker has no --disk. */
		if (strcmp(jstr(dk, "state"), "off"))
			printf("disk       %s, %s used of %s, %.0f pages, %s, %.0f demotions, "
			       "%.0f promotions, %.0f errors, %.0f corrupt\n",
			       jstr(dk, "state"), fmt_bytes(jnum(dk, "bytes_used"), a, sizeof(a)),
			       fmt_bytes(jnum(dk, "bytes_total"), b, sizeof(b)), jnum(dk, "pages"),
			       cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(dk, "direct"))
				       ? "O_DIRECT"
				       : "buffered",
			       jnum(dk, "demotions"), jnum(dk, "promotions"), jnum(dk, "errors"),
			       jnum(dk, "corrupt"));
		else
			printf("disk       off\n");
	}
	printf("clients    %.0f   leases %.0f   namespaces %d\n", jnum(root, "clients"),
	       jnum(root, "leases"), nss ? cJSON_GetArraySize(nss) : 0);

	if (nss && cJSON_GetArraySize(nss) > 0) {
		printf("\n%4s  %-24s %-4s %10s %8s %10s %8s %8s %8s %10s\n", "ns", "model", "kind",
		       "page", "pages", "bytes", "hit rate", "puts", "dedup", "saved");
		cJSON_ArrayForEach(ns, nss)
		{
			double pb = jnum(ns, "page_bytes");
			double dd = jnum(ns, "dedup");
			double h = jnum(ns, "hits"), m = jnum(ns, "misses");
			char e[32];

			saved += dd * pb;
			printf("%4.0f  %-24.24s %-4s %10s %8.0f %10s %8s %8.0f %8.0f %10s\n",
			       jnum(ns, "id"), jstr(ns, "model"), jstr(ns, "kind"),
			       fmt_bytes(pb, a, sizeof(a)), jnum(ns, "pages"),
			       fmt_bytes(jnum(ns, "bytes"), b, sizeof(b)),
			       fmt_pct(h, h + m, c, sizeof(c)), jnum(ns, "puts"), dd,
			       fmt_bytes(dd * pb, e, sizeof(e)));
		}
	}

	printf("\ncounters   puts %.0f  gets %.0f  hits %.0f  misses %.0f  (hit rate %s)\n",
	       jnum(ctr, "puts"), jnum(ctr, "gets"), hits, misses,
	       fmt_pct(hits, hits + misses, a, sizeof(a)));
	printf("           dedup %.0f  evictions %.0f  errors %.0f\n", jnum(ctr, "dedup"),
	       jnum(ctr, "evictions"), jnum(ctr, "errors"));
	printf("           acquires %.0f  releases %.0f  lookups %.0f (%.0f keys)  deletes %.0f  "
	       "nops %.0f\n",
	       jnum(ctr, "acquires"), jnum(ctr, "releases"), jnum(ctr, "lookups"),
	       jnum(ctr, "lookup_keys"), jnum(ctr, "deletes"), jnum(ctr, "nops"));
	printf("           in %s  out %s  disconnects %.0f  protocol errors %.0f\n",
	       fmt_bytes(jnum(ctr, "bytes_in"), a, sizeof(a)),
	       fmt_bytes(jnum(ctr, "bytes_out"), b, sizeof(b)), jnum(ctr, "disconnects"),
	       jnum(ctr, "protocol_errors"));
	printf("dedup      %s not stored twice (dedup hits x page size, all namespaces)\n",
	       fmt_bytes(saved, a, sizeof(a)));
}

static void print_clients(const cJSON *root)
{
	const cJSON *list = jarr(root, "client_list");
	const cJSON *cl;

	if (!list || cJSON_GetArraySize(list) == 0) {
		printf("no clients attached (%.0f reported)\n", jnum(root, "clients"));
		return;
	}
	printf("%6s %8s %6s  %-24s %7s %12s %4s\n", "id", "pid", "uid", "name", "leases", "ops",
	       "ns");
	cJSON_ArrayForEach(cl, list)
	{
		printf("%6.0f %8.0f %6.0f  %-24.24s %7.0f %12.0f %4.0f\n", jnum(cl, "id"),
		       jnum(cl, "pid"), jnum(cl, "uid"), jstr(cl, "name"), jnum(cl, "leases"),
		       jnum(cl, "ops"), jnum(cl, "namespaces"));
	}
}

static void print_ns(const cJSON *root)
{
	const cJSON *nss = jarr(root, "namespaces");
	const cJSON *ns;
	char a[32], b[32], c[32], d[32];

	if (!nss || cJSON_GetArraySize(nss) == 0) {
		printf("no namespaces\n");
		return;
	}
	printf("%4s  %-24s %-4s %6s %5s %5s %10s %8s %10s %8s %8s %8s %8s %10s\n", "ns", "model",
	       "kind", "tokens", "tp", "comps", "page", "pages", "bytes", "hit rate", "hits",
	       "puts", "dedup", "saved");
	cJSON_ArrayForEach(ns, nss)
	{
		double pb = jnum(ns, "page_bytes"), dd = jnum(ns, "dedup");
		double h = jnum(ns, "hits"), m = jnum(ns, "misses");
		char tp[16];

		snprintf(tp, sizeof(tp), "%.0f/%.0f", jnum(ns, "tp_rank"), jnum(ns, "tp_size"));
		/* MLA namespaces are shared by all ranks: the rank is no part of them. */
		if (!strcmp(jstr(ns, "kind"), "mla"))
			snprintf(tp, sizeof(tp), "%.0f", jnum(ns, "tp_size"));
		printf("%4.0f  %-24.24s %-4s %6.0f %5s %5.0f %10s %8.0f %10s %8s %8.0f %8.0f %8.0f "
		       "%10s\n",
		       jnum(ns, "id"), jstr(ns, "model"), jstr(ns, "kind"),
		       jnum(ns, "tokens_per_page"), tp, jnum(ns, "components"),
		       fmt_bytes(pb, a, sizeof(a)), jnum(ns, "pages"),
		       fmt_bytes(jnum(ns, "bytes"), b, sizeof(b)), fmt_pct(h, h + m, c, sizeof(c)),
		       h, jnum(ns, "puts"), dd, fmt_bytes(dd * pb, d, sizeof(d)));
	}
}

static int print_json(const cJSON *v)
{
	char *s = cJSON_Print(v);

	if (!s) {
		fprintf(stderr, "%s: out of memory\n", prog);
		return 1;
	}
	printf("%s\n", s);
	free(s);
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option lopts[] = {
		{"socket", required_argument, NULL, 's'},
		{"json", no_argument, NULL, 'j'},
		{"help", no_argument, NULL, 'h'},
		{NULL, 0, NULL, 0},
	};
	const char *sock_flag = NULL, *cmd = NULL;
	struct kvb_opts opts;
	kvb_client *c = NULL;
	char path[512], *text = NULL;
	cJSON *root = NULL;
	int json = 0, opt, rc, ret = 1;

	/* "+" would stop at the command; we want options on either side of it. */
	while ((opt = getopt_long(argc, argv, "s:jh", lopts, NULL)) != -1) {
		switch (opt) {
		case 's':
			sock_flag = optarg;
			break;
		case 'j':
			json = 1;
			break;
		case 'h':
			usage(stdout);
			return 0;
		default:
			usage(stderr);
			return 2;
		}
	}
	if (optind < argc)
		cmd = argv[optind++];
	if (!cmd || optind < argc ||
	    (strcmp(cmd, "status") && strcmp(cmd, "clients") && strcmp(cmd, "ns"))) {
		if (cmd)
			fprintf(stderr, "%s: unknown command '%s'\n", prog, cmd);
		usage(stderr);
		return 2;
	}

	socket_path(sock_flag, path, sizeof(path));
	memset(&opts, 0, sizeof(opts));
	opts.socket_path = path;
	opts.name = "kvbctl";
	opts.flags = KVB_CONNECT_CONTROL;
	rc = kvb_connect(&opts, &c);
	if (rc < 0) {
		fprintf(stderr,
			"%s: no broker reachable at %s (%s); start one with: "
			"kvbrokerd --socket %s\n",
			prog, path, connect_error(rc), path);
		return 1;
	}
	rc = kvb_stats_json(c, &text);
	if (rc < 0) {
		fprintf(stderr, "%s: stats request to %s failed: %s\n", prog, path,
			kvb_strerror(rc));
		goto out;
	}
	root = cJSON_Parse(text);
	if (!cJSON_IsObject(root)) {
		fprintf(stderr, "%s: broker at %s sent stats that are not a JSON object\n", prog,
			path);
		goto out;
	}
	ensure_shape(root);

	if (!strcmp(cmd, "status")) {
		if (json)
			ret = print_json(root);
		else {
			print_status(root, path);
			ret = 0;
		}
	} else if (!strcmp(cmd, "clients")) {
		if (json) {
			const cJSON *l = jarr(root, "client_list");
			cJSON *empty = cJSON_CreateArray();

			ret = print_json(l ? l : empty);
			cJSON_Delete(empty);
		} else {
			print_clients(root);
			ret = 0;
		}
	} else {
		if (json)
			ret = print_json(cJSON_GetObjectItemCaseSensitive(root, "namespaces"));
		else {
			print_ns(root);
			ret = 0;
		}
	}
out:
	cJSON_Delete(root);
	free(text);
	kvb_close(c);
	return ret;
}
