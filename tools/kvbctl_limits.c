// SPDX-License-Identifier: MIT
/*
 * kvbctl_limits.c - `kvbctl ns-limit` and `kvbctl tenants`: the caps and shares of a running
 * broker, shown from its stats document, and the namespace caps changed on it.
 *
 *   kvbctl ns-limit                    the caps by model, and each capped namespace's use
 *   kvbctl ns-limit MODEL=SIZE|N%      sets MODEL's cap (as kvbrokerd --ns-limit), at once
 *   kvbctl ns-limit MODEL=none         removes it
 *   kvbctl tenants                     each tenant partition: whose, clients, RAM used
 *                                      against its share, hits, misses, evictions
 *   kvbctl tenant-share                the same table
 *   kvbctl tenant-share ID=SIZE|N%     sets tenant ID's share (as kvbrokerd --tenant), at once
 *   kvbctl tenant-share ID=none        back to the default share (--tenant-share)
 *
 * Setting is for operators (the broker's uid or root); the broker logs every change and shows
 * it in status and metrics. Single-threaded.
 */
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "cli.h"
#include "kvbctl.h"

/*
 * "N%" (1..100) into *pct, or a size ("64M", "1.5GiB", "4096": binary units, as kvbrokerd
 * reads them) into *bytes. -EINVAL for anything else, zero included.
 */
static int parse_amount(const char *s, uint64_t *bytes, uint32_t *pct)
{
	static const char *const units[] = {"", "k", "m", "g", "t"};
	char *end;
	double v = strtod(s, &end);

	*bytes = 0;
	*pct = 0;
	if (end == s || !(v > 0))
		return -EINVAL;
	if (!strcmp(end, "%")) {
		if (v != (uint32_t)v || v > 100)
			return -EINVAL;
		*pct = (uint32_t)v;
		return 0;
	}
	for (size_t i = 0; i < sizeof(units) / sizeof(units[0]); i++) {
		size_t n = strlen(units[i]);
		double mul = (double)(1ull << (10 * i));

		if (strncasecmp(end, units[i], n))
			continue;
		if (end[n] && strcasecmp(end + n, "b") && strcasecmp(end + n, "ib"))
			continue;
		if (i == 0 && end[0])
			continue; /* "b" or "ib" alone */
		if (v * mul >= 18446744073709551615.0 || v * mul < 1)
			return -EINVAL;
		*bytes = (uint64_t)(v * mul);
		return 0;
	}
	return -EINVAL;
}

int ctl_ns_limit_set(struct ctl *x, const char *arg)
{
	const char *eq = strrchr(arg, '=');
	char model[64], a[32];
	uint64_t bytes = 0;
	uint32_t pct = 0;
	int err, remove;

	if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof(model))
		return cli_usage_error(ctl_prog,
				       "ns-limit: want MODEL=SIZE, MODEL=N%% or MODEL=none (the "
				       "model as kvbctl ns shows it, 63 bytes at most), not '%s'",
				       arg);
	memcpy(model, arg, (size_t)(eq - arg));
	model[eq - arg] = '\0';
	remove = !strcmp(eq + 1, "none");
	if (!remove && parse_amount(eq + 1, &bytes, &pct))
		return cli_usage_error(ctl_prog,
				       "ns-limit %s: '%s' is not a size (64M, 2G) nor a "
				       "percentage (1%% to 100%%)",
				       model, eq + 1);
	if (ctl_connect(x, 0) < 0)
		return 1;
	err = kvb_ns_limit(x->c, model, bytes, pct);
	if (err < 0) {
		fprintf(stderr, "%s: ns-limit %s: %s\n", ctl_prog, model,
			err == -EPERM	     ? "only the broker's uid or root may change limits"
			: err == -ENOENT     ? "no limit is set for that model"
			: err == -ENOSPC     ? "the broker's table of limits is full: remove one"
			: err == -EOPNOTSUPP ? "the broker is too old (before ABI 1.7): restart "
					       "it with --ns-limit instead"
					     : strerror(-err));
		return 1;
	}
	if (remove)
		printf("ns-limit %s: removed\n", model);
	else if (bytes)
		printf("ns-limit %s: %s per namespace\n", model,
		       text_bytes((double)bytes, a, sizeof(a)));
	else
		printf("ns-limit %s: %u%% of its tenant's partition per namespace\n", model, pct);
	return 0;
}

int ctl_tenant_share_set(struct ctl *x, const char *arg)
{
	const char *eq = strrchr(arg, '=');
	char id[64], a[32];
	uint64_t bytes = 0;
	uint32_t pct = 0;
	int err, dflt;

	if (!eq || eq == arg || (size_t)(eq - arg) >= sizeof(id))
		return cli_usage_error(ctl_prog,
				       "tenant-share: want ID=SIZE, ID=N%% or ID=none (ID a uid or "
				       "gid, as the broker's --tenants, or a user or group name), "
				       "not '%s'",
				       arg);
	memcpy(id, arg, (size_t)(eq - arg));
	id[eq - arg] = '\0';
	dflt = !strcmp(eq + 1, "none");
	if (!dflt && parse_amount(eq + 1, &bytes, &pct))
		return cli_usage_error(ctl_prog,
				       "tenant-share %s: '%s' is not a size (64M, 2G) nor a "
				       "percentage of the pool (1%% to 100%%)",
				       id, eq + 1);
	if (ctl_connect(x, 0) < 0)
		return 1;
	err = kvb_tenant_share(x->c, id, bytes, pct);
	if (err < 0) {
		fprintf(stderr, "%s: tenant-share %s: %s\n", ctl_prog, id,
			err == -EPERM	     ? "only the broker's uid or root may change shares"
			: err == -ENOENT     ? "no such user or group"
			: err == -EINVAL     ? "a share is 8 MiB at least and the pool at most"
			: err == -EUSERS     ? "every tenant partition is bound to another tenant"
			: err == -EOPNOTSUPP ? "the broker runs without --tenants, or is too old "
					       "(before ABI 1.8)"
					     : strerror(-err));
		return 1;
	}
	if (dflt)
		printf("tenant-share %s: the default share\n", id);
	else if (bytes)
		printf("tenant-share %s: %s\n", id, text_bytes((double)bytes, a, sizeof(a)));
	else
		printf("tenant-share %s: %u%% of the pool\n", id, pct);
	return 0;
}

void ctl_print_limits(const cJSON *root)
{
	const cJSON *l, *ns;
	char a[32], b[32], mb[72];
	int any = 0;

	cJSON_ArrayForEach(l, sdoc_arr(root, "ns_limits"))
	{
		if (!any)
			printf("%-40s %12s\n", "model", "limit");
		any = 1;
		if (sdoc_has(l, "bytes"))
			printf("%-40s %12s\n", sdoc_str(l, "model"),
			       text_bytes(sdoc_num(l, "bytes"), a, sizeof(a)));
		else
			printf("%-40s %11.0f%%\n", sdoc_str(l, "model"), sdoc_num(l, "percent"));
	}
	if (!any) {
		printf("no namespace limits (set one: kvbctl ns-limit MODEL=SIZE|N%%)\n");
		return;
	}
	printf("\n%4s  %-40s %12s %12s %7s\n", "ns", "model", "bytes", "limit", "used");
	cJSON_ArrayForEach(ns, sdoc_arr(root, "namespaces"))
	{
		double lim = sdoc_num(ns, "limit_bytes");
		char pc[16];

		if (lim <= 0)
			continue;
		snprintf(mb, sizeof(mb), "%s", sdoc_str(ns, "model"));
		printf("%4.0f  %-40.40s %12s %12s %7s\n", sdoc_num(ns, "id"), mb,
		       text_bytes(sdoc_num(ns, "bytes"), a, sizeof(a)),
		       text_bytes(lim, b, sizeof(b)),
		       fmt_pct(sdoc_num(ns, "bytes"), lim, pc, sizeof(pc)));
	}
}

void ctl_print_tenants(const cJSON *root)
{
	const cJSON *t;
	int any = 0;

	cJSON_ArrayForEach(t, sdoc_arr(root, "tenants"))
	{
		char who[32], a[32], b[32], g[32], r[32], c[16], d[16], idle[24];
		double h = sdoc_num(t, "hits"), m = sdoc_num(t, "misses");

		if (!any)
			printf("%4s  %-12s %7s %12s %12s %12s %12s %7s %8s %10s %10s %9s\n", "part",
			       "tenant", "clients", "used", "share", "guarantee", "resident",
			       "used%", "hit rate", "hits", "evictions", "idle");
		any = 1;
		if (!strcmp(sdoc_str(t, "mode"), "none"))
			snprintf(who, sizeof(who), "all");
		else if (sdoc_num(t, "id") < 0)
			snprintf(who, sizeof(who), "- (free)");
		else
			snprintf(who, sizeof(who), "%s %.0f", sdoc_str(t, "mode"),
				 sdoc_num(t, "id"));
		if (sdoc_num(t, "released") > 0)
			snprintf(idle, sizeof(idle), "released");
		else if (sdoc_num(t, "idle_s") > 0)
			snprintf(idle, sizeof(idle), "%.0f s", sdoc_num(t, "idle_s"));
		else
			snprintf(idle, sizeof(idle), "-");
		/* [tenant-lend] used% is of the share; resident above the guarantee is lent. */
		printf("%4.0f  %-12s %7.0f %12s %12s %12s %12s %7s %8s %10.0f %10.0f %9s\n",
		       sdoc_num(t, "partition"), who, sdoc_num(t, "clients"),
		       text_bytes(sdoc_num(t, "bytes_used"), a, sizeof(a)),
		       text_bytes(sdoc_num(t, "share_bytes"), b, sizeof(b)),
		       text_bytes(sdoc_num(t, "guarantee_bytes"), g, sizeof(g)),
		       text_bytes(sdoc_num(t, "resident_bytes"), r, sizeof(r)),
		       fmt_pct(sdoc_num(t, "bytes_used"), sdoc_num(t, "share_bytes"), c, sizeof(c)),
		       fmt_pct(h, h + m, d, sizeof(d)), h, sdoc_num(t, "evictions"), idle);
	}
	if (!any)
		printf("no tenant figures (a broker before this kvbctl)\n");
}
