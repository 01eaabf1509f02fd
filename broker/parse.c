// SPDX-License-Identifier: MIT
/*
 * parse.c - command-line value parsers: sizes with K/M/G/T suffixes and plain counts. Pure
 * functions, any thread.
 */
#include <errno.h>
#include <stdlib.h>

#include "parse.h"

int parse_size_end(const char *s, uint64_t *out, const char **endp)
{
	char *end;
	unsigned long long v;
	int shift = 0;

	if (*s < '0' || *s > '9')
		return -EINVAL;
	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k':
	case 'K':
		shift = 10;
		end++;
		break;
	case 'm':
	case 'M':
		shift = 20;
		end++;
		break;
	case 'g':
	case 'G':
		shift = 30;
		end++;
		break;
	case 't':
	case 'T':
		shift = 40;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'i' || *end == 'B' || *end == 'b')
		end++;
	if (*end == 'B')
		end++;
	if ((!endp && *end) || (shift && v > (UINT64_MAX >> shift)))
		return -EINVAL;
	if (endp)
		*endp = end;
	*out = (uint64_t)v << shift;
	return 0;
}

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
