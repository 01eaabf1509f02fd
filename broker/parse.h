/* SPDX-License-Identifier: MIT */
/*
 * parse.h - command-line value parsers shared by main.c and tenant.c (sizes: common/size.h).
 */
#ifndef KVB_BROKER_PARSE_H
#define KVB_BROKER_PARSE_H

#include <stdint.h>

/* Decimal uint32; -EINVAL on garbage or overflow. */
int parse_u32(const char *s, uint32_t *out);

#endif /* KVB_BROKER_PARSE_H */
