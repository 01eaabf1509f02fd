/* SPDX-License-Identifier: MIT */
/*
 * statsdoc.h - reading the broker's STATS document (docs/protocol.md §7), for kvbctl and the
 * metrics generator: typed member access where an absent or mistyped member reads as 0, "" or
 * NULL (the document only ever gains fields, and older brokers send fewer), and the figures
 * both derive from it. Pure functions, any thread.
 */
#ifndef KVB_COMMON_STATSDOC_H
#define KVB_COMMON_STATSDOC_H

#include <cjson/cJSON.h>

double sdoc_num(const cJSON *o, const char *name);	 /* 0 when absent */
int sdoc_has(const cJSON *o, const char *name);		 /* a number is there */
const char *sdoc_str(const cJSON *o, const char *name);	 /* "" when absent */
const cJSON *sdoc_arr(const cJSON *o, const char *name); /* NULL when absent */
const cJSON *sdoc_obj(const cJSON *o, const char *name); /* NULL when absent */

/*
 * For a terminal: every string (and member name) in the document, in place, through
 * text_printable(): strings come from clients (model and client names) and from files
 * (--stats-file), and must not carry control characters or ESC sequences to the operator.
 */
void sdoc_printable(cJSON *o);

/* The "disk" object when the broker has a disk tier that is not off, else NULL. */
const cJSON *sdoc_disk(const cJSON *root);
/* The "remote" object when the remote tier is on, else NULL (absent or state "off"). */
const cJSON *sdoc_remote(const cJSON *root);

/* RAM per NUMA node, summed over pool.arenas[] (a broker without arenas: one node, -1). */
#define SDOC_MAX_NODES 64
struct sdoc_node {
	int node; /* -1: no NUMA node */
	int arenas;
	double total, used;
	const char *page_size; /* "4k", "2M", "1G", or "" when the broker does not say */
};
/* Fills out[] (at most max) in order of first appearance; returns the count. */
int sdoc_nodes(const cJSON *root, struct sdoc_node *out, int max);

#endif /* KVB_COMMON_STATSDOC_H */
