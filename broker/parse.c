// SPDX-License-Identifier: MIT
/*
 * parse.c - command-line value parsers of the broker: plain counts (sizes: common/size.c).
 * Pure functions, any thread.
 */
#include <errno.h>
#include <stdlib.h>

#include "parse.h"

int parse_u32(const char *s, uint32_t *out)
{
	char *end;
	unsigned long v;

	errno = 0;
	v = strtoul(s, &end, 10);
	if (errno || end == s || *end || v > UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}
