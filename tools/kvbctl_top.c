// SPDX-License-Identifier: MIT
/*
 * kvbctl_top.c - `kvbctl top`: a live full-screen view of the broker (ncurses).
 *
 * Every interval (default 1 s) it fetches the stats document and redraws: occupancy bars per
 * tier and NUMA node, rates over the last interval (puts/s, gets/s, bytes/s in and out, hit
 * rate, evictions/s, disk reads and writes/s, hits/s by the tier that held the page), the age
 * of evicted pages (median and p90 from the broker's histogram), each tenant's occupancy
 * against its share, and one row per client (pid, name, namespaces, ops/s, leases). Rates come from two successive documents of the same broker process, divided
 * by the broker's own uptime difference, so a late refresh does not inflate them.
 *
 * A broker that goes away (restart, crash) is shown as "reconnecting" and the view keeps
 * trying to attach once per interval; the first document from the new process starts the
 * rates afresh. q (or Q, or ^C, read as a key in raw mode) quits. `top --json` prints one sample of the rates instead.
 *
 * Single-threaded; waits in getch() with a timeout, so a key is acted on at once.
 */
#include <errno.h>
#include <ncurses.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kvbctl.h"

static double mono(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Decimal units for rates ("1.2 GB/s"), as link speeds are quoted. */
static const char *fmt_rate(double v, const char *unit, char *buf, size_t len)
{
	static const char *const pre[] = {"", "k", "M", "G", "T"};
	unsigned i = 0;

	while (v >= 1000.0 && i < 4) {
		v /= 1000.0;
		i++;
	}
	snprintf(buf, len, i ? "%.1f %s%s" : "%.0f %s%s", v, pre[i], unit);
	return buf;
}

/* Rates between two stats documents of the same broker (per second). */
struct rates {
	double dt;
	double puts, gets, ops, bytes_in, bytes_out, evictions, disk_reads, disk_writes;
	double hit_ratio;    /* over the interval; < 0 when no GET/ACQUIRE happened */
	double tier_hits[3]; /* hits/s by the tier that held the page: RAM, disk, remote */
};

static const char *const tier_field[3] = {"hits_ram", "hits_disk", "hits_remote"};

/*
 * Quantile q of a STATS histogram (le, counts, +Inf last), interpolated linearly inside its
 * bucket as Prometheus's histogram_quantile does; -1 when it is empty or absent. A quantile in
 * the +Inf bucket is the largest bound.
 */
static double hist_quantile(const cJSON *h, double q)
{
	const cJSON *le = sdoc_arr(h, "le"), *cn = sdoc_arr(h, "counts");
	int nb = cJSON_GetArraySize(le);
	double total = 0, cum = 0, lo = 0, rank;

	if (!le || !cn || cJSON_GetArraySize(cn) != nb + 1)
		return -1;
	for (int i = 0; i <= nb; i++)
		total += cJSON_GetArrayItem(cn, i)->valuedouble;
	if (total <= 0)
		return -1;
	rank = q * total;
	for (int i = 0; i < nb; i++) {
		double n = cJSON_GetArrayItem(cn, i)->valuedouble;
		double hi = cJSON_GetArrayItem(le, i)->valuedouble;

		if (cum + n >= rank && n > 0)
			return lo + (hi - lo) * (rank - cum) / n;
		cum += n;
		lo = hi;
	}
	return lo;
}

/* "1.5 s", "12 min", "3.0 h" */
static const char *fmt_age(double s, char *buf, size_t len)
{
	if (s < 0)
		snprintf(buf, len, "-");
	else if (s < 120)
		snprintf(buf, len, "%.1f s", s);
	else if (s < 7200)
		snprintf(buf, len, "%.0f min", s / 60);
	else
		snprintf(buf, len, "%.1f h", s / 3600);
	return buf;
}

/* A tenant's name for the screen: "uid 1001", "-" (partition free), "all" (no tenants). */
static const char *tenant_name(const cJSON *t, char *buf, size_t len)
{
	if (!strcmp(sdoc_str(t, "mode"), "none"))
		snprintf(buf, len, "all");
	else if (sdoc_num(t, "id") < 0)
		snprintf(buf, len, "-");
	else
		snprintf(buf, len, "%s %.0f", sdoc_str(t, "mode"), sdoc_num(t, "id"));
	return buf;
}

/* ops/s of the client with client's id in prev (0 when it is new). */
static double client_ops_rate(const cJSON *prev, const cJSON *client, double dt)
{
	const cJSON *p;

	if (dt <= 0)
		return 0;
	cJSON_ArrayForEach(p, sdoc_arr(prev, "client_list"))
	{
		if (sdoc_num(p, "id") == sdoc_num(client, "id"))
			return (sdoc_num(client, "ops") - sdoc_num(p, "ops")) / dt;
	}
	return 0;
}

static double delta(const cJSON *a, const cJSON *b, const char *name)
{
	return sdoc_num(b, name) - sdoc_num(a, name);
}

/* 0, or -1 when prev is not an earlier document of the same broker process. */
static int rates_between(const cJSON *prev, const cJSON *cur, struct rates *r)
{
	const cJSON *pc = sdoc_obj(prev, "counters"), *cc = sdoc_obj(cur, "counters");
	const cJSON *pd = sdoc_obj(prev, "disk"), *cd = sdoc_obj(cur, "disk"), *cl;
	double h, m;

	memset(r, 0, sizeof(*r));
	r->hit_ratio = -1;
	r->dt = sdoc_num(cur, "uptime_s") - sdoc_num(prev, "uptime_s");
	if (!prev || sdoc_num(prev, "pid") != sdoc_num(cur, "pid") || r->dt <= 0) {
		r->dt = 0;
		return -1;
	}
	r->puts = delta(pc, cc, "puts") / r->dt;
	r->gets = (delta(pc, cc, "gets") + delta(pc, cc, "acquires")) / r->dt;
	r->bytes_in = delta(pc, cc, "bytes_in") / r->dt;
	r->bytes_out = delta(pc, cc, "bytes_out") / r->dt;
	r->evictions = delta(pc, cc, "evictions") / r->dt;
	r->disk_reads = delta(pd, cd, "reads") / r->dt;
	r->disk_writes = delta(pd, cd, "writes") / r->dt;
	for (int i = 0; i < 3; i++)
		r->tier_hits[i] = delta(pc, cc, tier_field[i]) / r->dt;
	h = delta(pc, cc, "hits");
	m = delta(pc, cc, "misses");
	if (h + m > 0)
		r->hit_ratio = h / (h + m);
	cJSON_ArrayForEach(cl, sdoc_arr(cur, "client_list"))
	{
		r->ops += client_ops_rate(prev, cl, r->dt);
	}
	return 0;
}

/* "[#####.....] 45.2%  28.9 MiB / 64.0 MiB" at (y, x), the bar width columns wide. */
static void bar(int y, int x, int width, const char *label, double used, double total)
{
	char a[32], b[32], c[32];
	int fill = total > 0 ? (int)(used / total * width + 0.5) : 0;

	if (fill > width)
		fill = width;
	mvprintw(y, x, "%-12s [", label);
	for (int i = 0; i < width; i++)
		addch(i < fill ? '#' : '.');
	printw("] %6s  %s / %s", fmt_pct(used, total, c, sizeof(c)), text_bytes(used, a, sizeof(a)),
	       text_bytes(total, b, sizeof(b)));
}

static void draw(const struct ctl *x, const cJSON *root, const cJSON *prev, const char *status)
{
	const cJSON *pool = sdoc_obj(root, "pool"), *disk = sdoc_disk(root), *cl;
	const cJSON *rem = sdoc_remote(root);
	struct sdoc_node nodes[SDOC_MAX_NODES];
	struct rates r;
	int rows = LINES, cols = COLS, y = 0, nn, width;
	char a[32], b[32], c[32], d[32];

	erase();
	mvprintw(y++, 0, "kvbctl top  %s  (q quits)", x->path);
	if (!root) {
		mvprintw(y + 1, 0, "%s", status);
		refresh();
		return;
	}
	mvprintw(y++, 0, "kvbrokerd %s  pid %.0f  up %.0f s  clients %.0f  leases %.0f  pages %.0f",
		 sdoc_str(root, "version"), sdoc_num(root, "pid"), sdoc_num(root, "uptime_s"),
		 sdoc_num(root, "clients"), sdoc_num(root, "leases"), sdoc_num(pool, "pages"));
	y++;
	width = cols - 60;
	width = width < 10 ? 10 : width > 50 ? 50 : width;
	bar(y++, 0, width, "ram", sdoc_num(pool, "bytes_used"), sdoc_num(pool, "bytes_total"));
	nn = sdoc_nodes(root, nodes, SDOC_MAX_NODES);
	for (int i = 0; i < nn && nn > 1 && y < rows - 8; i++) {
		char lab[24];

		snprintf(lab, sizeof(lab), "  node %d", nodes[i].node);
		bar(y++, 0, width, lab, nodes[i].used, nodes[i].total);
	}
	if (disk) {
		char lab[24];

		snprintf(lab, sizeof(lab), "disk %s", sdoc_str(disk, "state"));
		bar(y++, 0, width, lab, sdoc_num(disk, "bytes_used"),
		    sdoc_num(disk, "bytes_total"));
	} else {
		mvprintw(y++, 0, "disk: off");
	}
	if (rem)
		mvprintw(y++, 0,
			 "remote %s  shards %.0f/%.0f  published %.0f  fetched %.0f/%.0f  errors "
			 "%.0f"
			 "  in flight %s",
			 sdoc_str(rem, "state"), sdoc_num(rem, "shards_reachable"),
			 sdoc_num(rem, "shards"), sdoc_num(rem, "published"),
			 sdoc_num(rem, "fetched"), sdoc_num(rem, "fetches"),
			 sdoc_num(rem, "errors"),
			 text_bytes(sdoc_num(rem, "bytes_in_flight"), a, sizeof(a)));
	else
		mvprintw(y++, 0, "remote: off");
	y++;
	if (rates_between(prev, root, &r) == 0) {
		mvprintw(y++, 0, "puts/s %-9.0f gets/s %-9.0f ops/s %-9.0f hit rate %s", r.puts,
			 r.gets, r.ops,
			 r.hit_ratio < 0 ? "-" : fmt_pct(r.hit_ratio, 1, a, sizeof(a)));
		mvprintw(y++, 0, "in %-12s out %-12s evictions/s %-7.0f",
			 fmt_rate(r.bytes_in, "B/s", b, sizeof(b)),
			 fmt_rate(r.bytes_out, "B/s", c, sizeof(c)), r.evictions);
		if (disk)
			printw(" disk reads/s %.0f writes/s %.0f", r.disk_reads, r.disk_writes);
		mvprintw(y++, 0, "hits/s by tier: ram %-9.0f disk %-9.0f remote %-9.0f",
			 r.tier_hits[0], r.tier_hits[1], r.tier_hits[2]);
	} else {
		mvprintw(y++, 0, "puts/s -  gets/s -  (rates after the next refresh)");
		y += 2;
	}
	{
		const cJSON *age = sdoc_obj(sdoc_obj(root, "histograms"), "evict_age");

		mvprintw(y++, 0, "evicted page age: median %s  p90 %s",
			 fmt_age(hist_quantile(age, 0.5), a, sizeof(a)),
			 fmt_age(hist_quantile(age, 0.9), b, sizeof(b)));
	}
	mvprintw(y++, 0, "dedup saved %s   evictions %.0f   errors %.0f",
		 text_bytes(sdoc_num(sdoc_obj(root, "counters"), "dedup_bytes"), d, sizeof(d)),
		 sdoc_num(sdoc_obj(root, "counters"), "evictions"),
		 sdoc_num(sdoc_obj(root, "counters"), "errors"));
	if (cJSON_GetArraySize(sdoc_arr(root, "tenants")) > 1) {
		const cJSON *t;

		/* Occupancy against share, one bar per tenant partition. */
		cJSON_ArrayForEach(t, sdoc_arr(root, "tenants"))
		{
			char lab[24], nm[20];

			if (y >= rows - 4)
				break;
			snprintf(lab, sizeof(lab), "%s", tenant_name(t, nm, sizeof(nm)));
			bar(y, 0, width, lab, sdoc_num(t, "bytes_used"),
			    sdoc_num(t, "share_bytes"));
			printw("  clients %.0f", sdoc_num(t, "clients"));
			y++;
		}
	}
	y++;
	attron(A_REVERSE);
	mvprintw(y++, 0, "%6s %8s  %-24s %-12s %10s %7s", "ID", "PID", "NAME", "NS", "OPS/S",
		 "LEASES");
	attroff(A_REVERSE);
	cJSON_ArrayForEach(cl, sdoc_arr(root, "client_list"))
	{
		char nsb[64];

		if (y >= rows - 1)
			break;
		mvprintw(y++, 0, "%6.0f %8.0f  %-24.24s %-12.12s %10.0f %7.0f", sdoc_num(cl, "id"),
			 sdoc_num(cl, "pid"), sdoc_str(cl, "name"),
			 ctl_ns_list(cl, nsb, sizeof(nsb)), client_ops_rate(prev, cl, r.dt),
			 sdoc_num(cl, "leases"));
	}
	if (status[0])
		mvprintw(rows - 1, 0, "%s", status);
	refresh();
}

int ctl_top(struct ctl *x, double interval)
{
	cJSON *root = NULL, *prev = NULL;
	char status[1200] = "";
	double next = 0;
	int ch, ms;

	if (!initscr()) {
		fprintf(stderr, "%s: top needs a terminal\n", ctl_prog);
		return 1;
	}
	raw(); /* ^C arrives as a key (3), so the terminal is always restored */
	noecho();
	curs_set(0);
	keypad(stdscr, TRUE);
	for (;;) {
		double now = mono();

		if (now >= next) {
			next = now + interval;
			if (!x->c && ctl_connect(x, 1) == 0) {
				/* A new broker process: whole-screen repaint, fresh rates. */
				clearok(curscr, TRUE);
				status[0] = '\0';
			}
			cJSON_Delete(prev);
			prev = root;
			root = NULL;
			if (x->c && ctl_fetch(x, &root, 1) < 0)
				ctl_disconnect(x);
			sdoc_printable(root); /* client names reach the screen */
			if (!x->c) {
				cJSON_Delete(prev);
				prev = NULL;
				snprintf(status, sizeof(status),
					 "broker gone: reconnecting to %s every %.1f s "
					 "(start one with: kvbrokerd --socket %s)",
					 x->path, interval, x->path);
			}
			draw(x, root, prev, status);
		}
		ms = (int)((next - mono()) * 1000) + 1;
		timeout(ms > 0 ? ms : 0); /* a negative timeout would block */
		ch = getch();
		if (ch == 'q' || ch == 'Q' || ch == 3)
			break;
		if (ch == KEY_RESIZE)
			draw(x, root, prev, status);
	}
	endwin();
	cJSON_Delete(root);
	cJSON_Delete(prev);
	return 0;
}

int ctl_top_json(struct ctl *x, double interval)
{
	struct timespec ts = {(time_t)interval,
			      (long)((interval - (double)(time_t)interval) * 1e9)};
	cJSON *a = NULL, *b = NULL, *o = NULL, *arr;
	const cJSON *cl;
	struct rates r;
	int ret = 1;

	if (ctl_fetch(x, &a, 0) < 0)
		goto out;
	nanosleep(&ts, NULL);
	if (ctl_fetch(x, &b, 0) < 0)
		goto out;
	if (rates_between(a, b, &r) < 0) {
		fprintf(stderr, "%s: the broker restarted between the two samples\n", ctl_prog);
		goto out;
	}
	o = cJSON_CreateObject();
	cJSON_AddNumberToObject(o, "interval_s", r.dt);
	cJSON_AddNumberToObject(o, "puts_per_s", r.puts);
	cJSON_AddNumberToObject(o, "gets_per_s", r.gets);
	cJSON_AddNumberToObject(o, "ops_per_s", r.ops);
	cJSON_AddNumberToObject(o, "bytes_in_per_s", r.bytes_in);
	cJSON_AddNumberToObject(o, "bytes_out_per_s", r.bytes_out);
	cJSON_AddNumberToObject(o, "evictions_per_s", r.evictions);
	cJSON_AddNumberToObject(o, "disk_reads_per_s", r.disk_reads);
	cJSON_AddNumberToObject(o, "disk_writes_per_s", r.disk_writes);
	if (r.hit_ratio >= 0)
		cJSON_AddNumberToObject(o, "hit_ratio", r.hit_ratio);
	else
		cJSON_AddNullToObject(o, "hit_ratio");
	{
		cJSON *th = cJSON_AddObjectToObject(o, "hits_per_s_by_tier");
		const cJSON *age = sdoc_obj(sdoc_obj(b, "histograms"), "evict_age");
		const cJSON *t;
		double q;

		cJSON_AddNumberToObject(th, "ram", r.tier_hits[0]);
		cJSON_AddNumberToObject(th, "disk", r.tier_hits[1]);
		cJSON_AddNumberToObject(th, "remote", r.tier_hits[2]);
		q = hist_quantile(age, 0.5);
		if (q >= 0)
			cJSON_AddNumberToObject(o, "evict_age_median_s", q);
		else
			cJSON_AddNullToObject(o, "evict_age_median_s");
		arr = cJSON_AddArrayToObject(o, "tenants");
		cJSON_ArrayForEach(t, sdoc_arr(b, "tenants"))
		{
			cJSON *e = cJSON_CreateObject();
			char nm[20];

			cJSON_AddStringToObject(e, "tenant", tenant_name(t, nm, sizeof(nm)));
			cJSON_AddNumberToObject(e, "partition", sdoc_num(t, "partition"));
			cJSON_AddNumberToObject(e, "bytes_used", sdoc_num(t, "bytes_used"));
			cJSON_AddNumberToObject(e, "share_bytes", sdoc_num(t, "share_bytes"));
			cJSON_AddNumberToObject(e, "clients", sdoc_num(t, "clients"));
			cJSON_AddItemToArray(arr, e);
		}
	}
	arr = cJSON_AddArrayToObject(o, "clients");
	cJSON_ArrayForEach(cl, sdoc_arr(b, "client_list"))
	{
		cJSON *c = cJSON_CreateObject();

		cJSON_AddNumberToObject(c, "id", sdoc_num(cl, "id"));
		cJSON_AddNumberToObject(c, "pid", sdoc_num(cl, "pid"));
		cJSON_AddStringToObject(c, "name", sdoc_str(cl, "name"));
		cJSON_AddItemToObject(c, "ns", cJSON_Duplicate(cJSON_GetObjectItem(cl, "ns"), 1));
		cJSON_AddNumberToObject(c, "ops_per_s", client_ops_rate(a, cl, r.dt));
		cJSON_AddNumberToObject(c, "leases", sdoc_num(cl, "leases"));
		cJSON_AddItemToArray(arr, c);
	}
	ret = ctl_print_json(o);
out:
	cJSON_Delete(o);
	cJSON_Delete(a);
	cJSON_Delete(b);
	return ret;
}
