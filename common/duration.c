// SPDX-License-Identifier: MIT
/*
 * duration.c - time spans on command lines and in config files (duration.h has the grammar).
 * Integer arithmetic, as size.c, so "0.1s" is exactly 100 ms. Pure functions, any thread.
 */
#include <errno.h>
#include <string.h>

#include "duration.h"

static const struct {
	const char *name;
	uint64_t ns;
} units[] = {
	{"ns", 1},    {"us", DUR_US},	 {"ms", DUR_MS},
	{"s", DUR_S}, {"m", 60 * DUR_S}, {"h", 3600 * DUR_S},
};

int duration_parse(const char *s, uint64_t unit_ns, uint64_t *ns)
{
	uint64_t whole = 0, frac = 0, frac_div = 1, mult = unit_ns, v;
	const char *p = s;
	int digits = 0;

	for (; *p >= '0' && *p <= '9'; p++, digits++) {
		if (whole > (UINT64_MAX - 9) / 10)
			return -EINVAL;
		whole = whole * 10 + (uint64_t)(*p - '0');
	}
	if (*p == '.') {
		p++;
		for (int n = 0; *p >= '0' && *p <= '9'; p++, digits++, n++) {
			if (n >= 18)
				return -EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
			frac_div *= 10;
		}
	}
	if (!digits || !unit_ns)
		return -EINVAL;
	if (*p) {
		size_t i;

		for (i = 0; i < sizeof(units) / sizeof(units[0]); i++)
			if (!strcmp(p, units[i].name))
				break;
		if (i == sizeof(units) / sizeof(units[0]))
			return -EINVAL;
		mult = units[i].ns;
	}
	if (whole > UINT64_MAX / mult)
		return -EINVAL;
	v = whole * mult;
	if (frac) {
		/* mult <= 3.6e12 and frac < 10^18: divide first where it is exact. */
		unsigned __int128 f = (unsigned __int128)frac * mult;

		if (f % frac_div || f / frac_div > UINT64_MAX - v)
			return -EINVAL;
		v += (uint64_t)(f / frac_div);
	}
	*ns = v;
	return 0;
}
