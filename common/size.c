// SPDX-License-Identifier: MIT
/*
 * size.c - sizes on command lines and in config files (size.h has the grammar). Integer
 * arithmetic only: a double would round 2^63 + 1 and take "0.1K" for 102 bytes silently.
 * Pure functions, any thread.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "size.h"

/* Multiplies *v by m; -EINVAL on overflow. */
static int mul_ok(uint64_t *v, uint64_t m)
{
	if (m && *v > UINT64_MAX / m)
		return -EINVAL;
	*v *= m;
	return 0;
}

int size_parse_end(const char *s, uint64_t *out, const char **endp)
{
	static const char units[] = "kmgtp";
	uint64_t whole = 0, frac = 0, frac_div = 1, mult = 1, v;
	const char *p = s, *u;
	int digits = 0, si = 0, power;

	for (; *p >= '0' && *p <= '9'; p++, digits++)
		if (mul_ok(&whole, 10) || whole > UINT64_MAX - (uint64_t)(*p - '0'))
			return -EINVAL;
		else
			whole += (uint64_t)(*p - '0');
	if (*p == '.') {
		p++;
		/* 19 fraction digits at most: 10^19 still fits the divisor. */
		for (int n = 0; *p >= '0' && *p <= '9'; p++, digits++, n++) {
			if (n >= 19)
				return -EINVAL;
			frac = frac * 10 + (uint64_t)(*p - '0');
			frac_div *= 10;
		}
	}
	if (!digits)
		return -EINVAL;
	u = *p ? strchr(units, *p | 0x20) : NULL;
	if (u) {
		power = (int)(u - units) + 1;
		p++;
		if (*p == 'i' || *p == 'I') {
			p++;
			if (*p == 'B' || *p == 'b')
				p++;
		} else if (*p == 'B' || *p == 'b') {
			p++;
			si = 1;
		}
		for (int i = 0; i < power; i++)
			mult *= si ? 1000 : 1024;
	} else if (*p == 'B' || *p == 'b') {
		p++;
	}
	if (!endp && *p)
		return -EINVAL;
	v = whole;
	if (mul_ok(&v, mult))
		return -EINVAL;
	if (frac) {
		/* frac / frac_div of mult must be whole bytes: frac * mult fits (both < 10^19
		 * and mult <= 2^50 would not, so divide by the common factor first). */
		uint64_t num = frac, den = frac_div, m = mult, g, a, b;

		for (a = num, b = den; b;)
			g = a % b, a = b, b = g;
		num /= a, den /= a;
		for (a = m, b = den; b;)
			g = a % b, a = b, b = g;
		m /= a, den /= a;
		if (den != 1 || mul_ok(&num, m) || v > UINT64_MAX - num)
			return -EINVAL;
		v += num;
	}
	if (endp)
		*endp = p;
	*out = v;
	return 0;
}

const char *size_format(uint64_t bytes, char *buf, size_t len)
{
	static const char units[] = "KMGTP";
	int u = -1;

	while (bytes && u < 4 && !(bytes & 1023)) {
		bytes >>= 10;
		u++;
	}
	if (u < 0)
		snprintf(buf, len, "%llu", (unsigned long long)bytes);
	else
		snprintf(buf, len, "%llu%c", (unsigned long long)bytes, units[u]);
	return buf;
}
