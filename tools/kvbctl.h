/* SPDX-License-Identifier: MIT */
/*
 * kvbctl.h - what kvbctl's files share: the connection to the broker, reading the stats
 * document, number formatting, and the subcommands that live in their own files.
 * Single-threaded.
 */
#ifndef KVB_TOOLS_KVBCTL_H
#define KVB_TOOLS_KVBCTL_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "kvbroker.h"
#include "statsdoc.h"
#include "text.h"

extern const char *ctl_prog;

struct ctl {
	char path[512]; /* the socket, resolved as the library does */
	kvb_client *c;	/* control-only connection, NULL when not connected */
};

/* Connects (control-only); on failure prints one line unless quiet. 0 or a negative errno. */
int ctl_connect(struct ctl *x, int quiet);
/* Fetches and parses the stats document; on failure prints one line unless quiet. */
int ctl_fetch(struct ctl *x, cJSON **root, int quiet);
void ctl_disconnect(struct ctl *x);

/* A percentage or "-" when den <= 0 (sizes: text_bytes, text.h). */
const char *fmt_pct(double num, double den, char *buf, size_t len);

/* A client's namespace ids as "0,3", "-" when none. */
const char *ctl_ns_list(const cJSON *client, char *buf, size_t len);

/* Prints pretty JSON; 0 or 1 (out of memory). */
int ctl_print_json(const cJSON *v);

/* kvbctl_top.c: the live view; interval in seconds. */
int ctl_top(struct ctl *x, double interval);
/* kvbctl_top.c: top --json, one sample of the rates over interval. */
int ctl_top_json(struct ctl *x, double interval);
/* kvbctl_limits.c: ns-limit MODEL=SIZE|N%|none on the broker; exit status. */
int ctl_ns_limit_set(struct ctl *x, const char *arg);
/* kvbctl tenant-share ID=SIZE|N%|none: one TENANT_SHARE message. */
int ctl_tenant_share_set(struct ctl *x, const char *arg);
/* kvbctl_limits.c: the ns-limit and tenants tables from a stats document. */
void ctl_print_limits(const cJSON *root);
void ctl_print_tenants(const cJSON *root);
/* kvbctl_plan.c: argv[0] is "plan". */
int ctl_plan(int argc, char **argv, int json);

#endif /* KVB_TOOLS_KVBCTL_H */
