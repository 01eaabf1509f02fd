/* SPDX-License-Identifier: MIT */
/*
 * parse.h - command-line value parsers shared by main.c and the --numa list (numa_topo.c).
 */
#ifndef KVB_BROKER_PARSE_H
#define KVB_BROKER_PARSE_H

#include <stdint.h>

/* "64M" -> bytes (K/M/G/T, optionally followed by i and/or B); -EINVAL on garbage or overflow.
 * With end NULL the whole string must be a size; otherwise *end gets what follows it. */
int parse_size_end(const char *s, uint64_t *out, const char **end);
static inline int parse_size(const char *s, uint64_t *out)
{
	return parse_size_end(s, out, (const char **)0);
}

/* Decimal uint32; -EINVAL on garbage or overflow. */
int parse_u32(const char *s, uint32_t *out);

#endif /* KVB_BROKER_PARSE_H */
