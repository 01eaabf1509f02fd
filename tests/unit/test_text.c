// SPDX-License-Identifier: MIT
/*
 * test_text.c - common/text.c: the UTF-8 validator accepts exactly the well-formed sequences
 * (1-4 bytes; no overlongs, surrogates, code points past U+10FFFF, stray continuations or cut
 * sequences), text_utf8() keeps valid text and turns each bad byte into U+FFFD within its
 * buffer, text_printable() leaves no C0/C1 control, DEL or invalid byte for a terminal, and
 * text_bytes() writes sizes in binary units.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "text.h"

static size_t seq(const char *s)
{
	return text_utf8_seq((const unsigned char *)s, strlen(s));
}

static void test_text_utf8_seq_table(void **state)
{
	(void)state;
	assert_int_equal(seq("a"), 1);
	assert_int_equal(seq("\xc3\xa9"), 2);	      /* é */
	assert_int_equal(seq("\xe6\x97\xa5"), 3);     /* 日 */
	assert_int_equal(seq("\xf0\x9f\x98\x80"), 4); /* U+1F600 */
	assert_int_equal(seq("\xf4\x8f\xbf\xbf"), 4); /* U+10FFFF */
	assert_int_equal(seq("\xed\x9f\xbf"), 3);     /* U+D7FF */
	assert_int_equal(seq("\xc2\x80"), 2);	      /* U+0080: valid, a C1 control */
	assert_int_equal(seq("\x80"), 0);	      /* stray continuation */
	assert_int_equal(seq("\xc0\xaf"), 0);	      /* overlong '/' */
	assert_int_equal(seq("\xc1\xbf"), 0);
	assert_int_equal(seq("\xe0\x80\xaf"), 0);     /* overlong 3-byte */
	assert_int_equal(seq("\xf0\x80\x80\xaf"), 0); /* overlong 4-byte */
	assert_int_equal(seq("\xed\xa0\x80"), 0);     /* surrogate U+D800 */
	assert_int_equal(seq("\xf4\x90\x80\x80"), 0); /* U+110000 */
	assert_int_equal(seq("\xf5\x80\x80\x80"), 0);
	assert_int_equal(seq("\xff"), 0);
	assert_int_equal(seq("\xe6\x97"), 0);	  /* cut short */
	assert_int_equal(seq("\xe6\x41\xa5"), 0); /* not a continuation */
	assert_int_equal(text_utf8_seq((const unsigned char *)"\xc3\xa9", 1), 0);
}

static void test_text_utf8_replaces_bad_bytes(void **state)
{
	char out[64];

	(void)state;
	assert_string_equal(text_utf8(out, sizeof(out), "plain/model-7b", 64), "plain/model-7b");
	assert_string_equal(text_utf8(out, sizeof(out), "caf\xc3\xa9 \xe6\x97\xa5", 64),
			    "caf\xc3\xa9 \xe6\x97\xa5");
	assert_string_equal(text_utf8(out, sizeof(out),
				      "a\xff"
				      "b",
				      64),
			    "a\xef\xbf\xbd"
			    "b");
	assert_string_equal(text_utf8(out, sizeof(out), "\xe6\x97", 64),
			    "\xef\xbf\xbd\xef\xbf\xbd");
	assert_string_equal(text_utf8(out, sizeof(out), "\xed\xa0\x80", 64),
			    "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
	/* n bounds the source (a fixed field without NUL); cap bounds the result. */
	assert_string_equal(text_utf8(out, sizeof(out), "abcdef", 3), "abc");
	assert_string_equal(text_utf8(out, 4, "\xff\xff", 2), "\xef\xbf\xbd");
	assert_string_equal(text_utf8(out, 3, "\xc3\xa9\xc3\xa9", 4), "\xc3\xa9");
	/* 3n + 1 always holds the result, and every result validates. */
	{
		char src[16], big[3 * sizeof(src) + 1];

		for (int seed = 0; seed < 2000; seed++) {
			size_t n = 0;

			for (size_t i = 0; i < sizeof(src); i++)
				src[i] = (char)((seed * 131 + (int)i * 197) % 255 + 1);
			text_utf8(big, sizeof(big), src, sizeof(src));
			assert_int_equal(strnlen(big, sizeof(big)) < sizeof(big), 1);
			for (size_t i = 0, len = strlen(big); i < len; i += n) {
				n = text_utf8_seq((const unsigned char *)big + i, len - i);
				assert_int_not_equal(n, 0);
			}
		}
	}
}

static void test_text_printable_for_terminals(void **state)
{
	char s[64];

	(void)state;
	strcpy(s, "ok model/\xc3\xa9-7b");
	assert_string_equal(text_printable(s), "ok model/\xc3\xa9-7b");
	strcpy(s, "a\nb\rc\td\x1b[2Je\x7f");
	assert_string_equal(text_printable(s), "a?b?c?d?[2Je?");
	strcpy(s, "x\xc2\x9b"
		  "31m\xc2\x85y"); /* C1 CSI and NEL as UTF-8 */
	assert_string_equal(text_printable(s), "x?31m?y");
	strcpy(s, "\xff\xfe\xe6\x97");
	assert_string_equal(text_printable(s), "????");
	strcpy(s, "\xc2\xa0nbsp"); /* U+00A0 is printable */
	assert_string_equal(text_printable(s), "\xc2\xa0nbsp");
}

static void test_text_bytes_binary_units(void **state)
{
	char b[32];

	(void)state;
	assert_string_equal(text_bytes(512, b, sizeof(b)), "512 B");
	assert_string_equal(text_bytes(1536, b, sizeof(b)), "1.5 KiB");
	assert_string_equal(text_bytes(256.0 * (1 << 20), b, sizeof(b)), "256.0 MiB");
	assert_string_equal(text_bytes(1024.0 * (1ull << 30), b, sizeof(b)), "1.0 TiB");
	assert_string_equal(text_bytes(-3.0 * (1 << 30), b, sizeof(b)), "-3.0 GiB");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_text_utf8_seq_table),
		cmocka_unit_test(test_text_utf8_replaces_bad_bytes),
		cmocka_unit_test(test_text_printable_for_terminals),
		cmocka_unit_test(test_text_bytes_binary_units),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
