/* SPDX-License-Identifier: MIT */
/*
 * metrics.h - the Prometheus text exposition of the broker's statistics, generated in this one
 * place from the STATS JSON document (docs/protocol.md §7) for both `kvbctl metrics` and
 * kvbrokerd's `--metrics-listen` HTTP endpoint. Pure functions, any thread.
 */
#ifndef KVB_COMMON_METRICS_H
#define KVB_COMMON_METRICS_H

#include <stddef.h>

struct cJSON;

/* [ns-cap] Namespaces exported with labels of their own; the rest are summed as ns="_other". */
#define METRICS_NS_MAX 32

/* The exposition format's content type, for HTTP. */
#define METRICS_CONTENT_TYPE "text/plain; version=0.0.4; charset=utf-8"

/*
 * Renders a parsed STATS document as Prometheus text format 0.0.4: every metric family with
 * one HELP and one TYPE line, then its samples; counters end in _total. Families whose source
 * fields the document lacks are left out (older brokers; the disk tier when there is none).
 * Returns malloc()ed NUL-terminated text, or NULL when out of memory or stats is not an object.
 */
char *metrics_text(const struct cJSON *stats);

/* The same from the JSON text; NULL also when it does not parse. */
char *metrics_from_json(const char *json);

/*
 * Checks text against the exposition format as Prometheus parses it: every line a comment or
 * a sample "name{label="v",...} value [timestamp]" with valid names, escapes and a float
 * value; TYPE declared at most once per family and before its samples; a family's samples
 * contiguous; no sample (name and labels) twice; counters named *_total; a final newline.
 * Returns 0, or -1 with the first problem (and its line number) in err.
 */
int metrics_check(const char *text, char *err, size_t errlen);

#endif /* KVB_COMMON_METRICS_H */
