/* SPDX-License-Identifier: MIT */
/*
 * text.h - text for operators: client-supplied strings (model names, client names) made safe
 * for the two places they reach operators, JSON documents, which must be valid UTF-8, and
 * terminals, which must not receive control characters (a newline forges a table row, ESC
 * sequences rewrite the screen); and sizes written in binary units, as the pool is configured.
 * Pure functions, any thread; shared by the broker and the tools.
 */
#ifndef KVB_COMMON_TEXT_H
#define KVB_COMMON_TEXT_H

#include <stddef.h>

/*
 * Length of the valid UTF-8 sequence at s (at most n bytes), 1-4, or 0 when s does not start
 * one: a stray continuation byte, an overlong form, a surrogate (U+D800-DFFF), a code point
 * past U+10FFFF, or a sequence cut short by n.
 */
size_t text_utf8_seq(const unsigned char *s, size_t n);

/*
 * Copies src (up to its NUL or n bytes) into dst (cap bytes, always NUL-terminated when cap >
 * 0) as valid UTF-8: each byte that starts no valid sequence becomes U+FFFD. A sequence that
 * does not fit whole is left out. cap = 3 * n + 1 always holds the result. Returns dst.
 */
char *text_utf8(char *dst, size_t cap, const char *src, size_t n);

/*
 * For a terminal, in place: C0 controls (newline and ESC included), DEL, C1 controls
 * (U+0080-009F) and bytes that start no valid UTF-8 sequence each become '?'. The result is
 * never longer. Returns s.
 */
char *text_printable(char *s);

/* b bytes in binary units with one decimal ("1.5 GiB", "512 B") into buf; returns buf. */
const char *text_bytes(double b, char *buf, size_t len);

#endif /* KVB_COMMON_TEXT_H */
