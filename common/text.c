// SPDX-License-Identifier: MIT
/*
 * text.c - UTF-8 validation and the two sanitizers of text.h. The validator follows the
 * Unicode table of well-formed byte sequences (Unicode 15, table 3-7): the second byte's range
 * depends on the first byte, which is what rules out overlong forms, surrogates and code points
 * past U+10FFFF. Pure functions, any thread.
 */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "text.h"

size_t text_utf8_seq(const unsigned char *s, size_t n)
{
	unsigned char c = s[0], lo = 0x80, hi = 0xbf;
	size_t len;

	if (!n)
		return 0;
	if (c < 0x80)
		return 1;
	if (c < 0xc2 || c > 0xf4)
		return 0; /* continuation byte, overlong 2-byte lead, or past U+10FFFF */
	len = c < 0xe0 ? 2 : c < 0xf0 ? 3 : 4;
	if (c == 0xe0)
		lo = 0xa0; /* overlong 3-byte */
	else if (c == 0xed)
		hi = 0x9f; /* surrogates */
	else if (c == 0xf0)
		lo = 0x90; /* overlong 4-byte */
	else if (c == 0xf4)
		hi = 0x8f; /* past U+10FFFF */
	if (n < len || s[1] < lo || s[1] > hi)
		return 0;
	for (size_t i = 2; i < len; i++)
		if (s[i] < 0x80 || s[i] > 0xbf)
			return 0;
	return len;
}

char *text_utf8(char *dst, size_t cap, const char *src, size_t n)
{
	const unsigned char *s = (const unsigned char *)src;
	size_t i = 0, o = 0, end = strnlen(src, n);

	if (!cap)
		return dst;
	while (i < end) {
		size_t k = text_utf8_seq(s + i, end - i);
		const char *out = k ? (const char *)s + i : "\xef\xbf\xbd";
		size_t olen = k ? k : 3;

		if (o + olen >= cap)
			break;
		memcpy(dst + o, out, olen);
		o += olen;
		i += k ? k : 1;
	}
	dst[o] = '\0';
	return dst;
}

char *text_printable(char *s)
{
	unsigned char *p = (unsigned char *)s, *o = p;
	size_t n = strlen(s);

	while (n) {
		size_t k = text_utf8_seq(p, n);

		/* U+0080-009F are C2 80 - C2 9F: C1 controls (0x9b is CSI, like ESC [). */
		if (!k || (k == 1 && (*p < 0x20 || *p == 0x7f)) ||
		    (k == 2 && p[0] == 0xc2 && p[1] < 0xa0)) {
			*o++ = '?';
			k = k ? k : 1;
		} else {
			memmove(o, p, k);
			o += k;
		}
		p += k;
		n -= k;
	}
	*o = '\0';
	return s;
}

const char *text_bytes(double b, char *buf, size_t len)
{
	static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
	unsigned u = 0;

	while (fabs(b) >= 1024.0 && u < 5) {
		b /= 1024.0;
		u++;
	}
	if (u == 0)
		snprintf(buf, len, "%.0f B", b);
	else
		snprintf(buf, len, "%.1f %s", b, unit[u]);
	return buf;
}
