// SPDX-License-Identifier: MIT
/*
 * test_size.c - common/size.c and common/duration.c: every row of the table in
 * docs/operations.md ("Sizes and durations") parses to the bytes it states or is refused as it
 * says, so the docs and the one parser of every program cannot drift; IEC for a letter alone
 * or with i/iB, SI only for a letter followed by B; fractions only when whole bytes; the
 * overflow edge; the list form (--numa 0:64G,1:32G); size_format() reads back; durations in
 * the option's unit or their own.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "duration.h"
#include "size.h"

#define DOC "docs/operations.md"

/* Checks one table row: "| `a`, `b` | 1,024 | ... |" or "| `x` | refused | ... |". */
static int check_row(const char *line)
{
	const char *cell2 = strchr(line + 1, '|'), *p = line;
	char want_txt[64], tok[64];
	uint64_t want = 0, got;
	int refused, n = 0, k = 0;

	assert_non_null(cell2);
	/* Second cell: digits with commas, or "refused". */
	for (const char *q = cell2 + 1; *q && *q != '|' && k < 63; q++)
		if (*q != ',' && *q != ' ')
			want_txt[k++] = *q;
	want_txt[k] = '\0';
	refused = !strcmp(want_txt, "refused");
	if (!refused) {
		char *end;

		want = strtoull(want_txt, &end, 10);
		assert_true(*end == '\0' && k > 0);
	}
	/* First cell: every `token`. */
	while ((p = strchr(p, '`')) && p < cell2) {
		const char *e = strchr(p + 1, '`');

		assert_non_null(e);
		assert_true((size_t)(e - p - 1) < sizeof(tok));
		memcpy(tok, p + 1, (size_t)(e - p - 1));
		tok[e - p - 1] = '\0';
		got = 12345;
		if (refused) {
			if (size_parse(tok, &got) != -EINVAL || got != 12345)
				fail_msg("%s: '%s' should be refused (got %llu)", DOC, tok,
					 (unsigned long long)got);
		} else if (size_parse(tok, &got) || got != want) {
			fail_msg("%s: '%s' should be %llu bytes (got %llu)", DOC, tok,
				 (unsigned long long)want, (unsigned long long)got);
		}
		n++;
		p = e + 1;
	}
	return n;
}

static void test_size_docs_table(void **state)
{
	FILE *f = fopen(DOC, "r");
	char line[512];
	int in = 0, rows = 0, tokens = 0;

	(void)state;
	if (!f) {
		fail_msg("%s: %s (run from the repository root, as tests/run.sh does)", DOC,
			 strerror(errno));
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		if (strstr(line, "<!-- size-table -->")) {
			in = 1;
			continue;
		}
		if (strstr(line, "<!-- /size-table -->"))
			break;
		if (!in || line[0] != '|' || !strchr(line + 1, '`'))
			continue;
		tokens += check_row(line);
		rows++;
	}
	fclose(f);
	/* The table is there and has the cases that matter: IEC, SI, fraction, refusals. */
	assert_true(rows >= 10);
	assert_true(tokens >= 20);
}

static void test_size_iec_si(void **state)
{
	uint64_t v;

	(void)state;
	assert_int_equal(size_parse("300G", &v), 0);
	assert_true(v == 300ull << 30);
	assert_int_equal(size_parse("300gib", &v), 0);
	assert_true(v == 300ull << 30);
	assert_int_equal(size_parse("300GB", &v), 0);
	assert_true(v == 300000000000ull);
	assert_int_equal(size_parse("300gb", &v), 0);
	assert_true(v == 300000000000ull);
	assert_int_equal(size_parse("1Ti", &v), 0);
	assert_true(v == 1ull << 40);
	assert_int_equal(size_parse("0", &v), 0);
	assert_true(v == 0);
	assert_int_equal(size_parse("1.5K", &v), 0);
	assert_true(v == 1536);
	assert_int_equal(size_parse("1.5KB", &v), 0);
	assert_true(v == 1500);
	assert_int_equal(size_parse("0.5", &v), -EINVAL);
	assert_int_equal(size_parse("", &v), -EINVAL);
	assert_int_equal(size_parse(".", &v), -EINVAL);
	assert_int_equal(size_parse("1.K", &v), 0);
	assert_true(v == 1024);
	assert_int_equal(size_parse(" 1G", &v), -EINVAL);
	assert_int_equal(size_parse("+1G", &v), -EINVAL);
	assert_int_equal(size_parse("1G ", &v), -EINVAL);
	assert_int_equal(size_parse("1iB", &v), -EINVAL);
}

static void test_size_overflow_edge(void **state)
{
	uint64_t v;

	(void)state;
	assert_int_equal(size_parse("18446744073709551615", &v), 0);
	assert_true(v == UINT64_MAX);
	assert_int_equal(size_parse("18446744073709551616", &v), -EINVAL);
	assert_int_equal(size_parse("16383P", &v), 0);
	assert_true(v == 16383ull << 50);
	assert_int_equal(size_parse("16384P", &v), -EINVAL);
	assert_int_equal(size_parse("18446744073709551PB", &v), -EINVAL);
	assert_int_equal(size_parse("15.9999999999999999999P", &v), -EINVAL);
}

static void test_size_list(void **state)
{
	const char *s = "0:64G,1:32GB", *end;
	uint64_t v;

	(void)state;
	assert_int_equal(size_parse_end(s + 2, &v, &end), 0);
	assert_true(v == 64ull << 30);
	assert_string_equal(end, ",1:32GB");
	assert_int_equal(size_parse_end(end + 3, &v, &end), 0);
	assert_true(v == 32000000000ull);
	assert_string_equal(end, "");
}

static void test_size_format_reads_back(void **state)
{
	static const uint64_t vals[] = {0,	    1,		1023,	      1024,
					1536,	    4ull << 20, 300ull << 30, 300000000000ull,
					1ull << 50, 3ull << 60, UINT64_MAX};
	char buf[32];
	uint64_t v;

	(void)state;
	assert_string_equal(size_format(4ull << 30, buf, sizeof(buf)), "4G");
	assert_string_equal(size_format(1536, buf, sizeof(buf)), "1536");
	assert_string_equal(size_format(3ull << 60, buf, sizeof(buf)), "3072P");
	for (size_t i = 0; i < sizeof(vals) / sizeof(vals[0]); i++) {
		assert_int_equal(size_parse(size_format(vals[i], buf, sizeof(buf)), &v), 0);
		assert_true(v == vals[i]);
	}
}

static void test_duration_units(void **state)
{
	uint64_t ns;

	(void)state;
	assert_int_equal(duration_parse("200", DUR_US, &ns), 0);
	assert_true(ns == 200000);
	assert_int_equal(duration_parse("200", DUR_MS, &ns), 0);
	assert_true(ns == 200000000);
	assert_int_equal(duration_parse("600", DUR_S, &ns), 0);
	assert_true(ns == 600 * DUR_S);
	assert_int_equal(duration_parse("10m", DUR_S, &ns), 0);
	assert_true(ns == 600 * DUR_S);
	assert_int_equal(duration_parse("0.5s", DUR_MS, &ns), 0);
	assert_true(ns == 500 * DUR_MS);
	assert_int_equal(duration_parse("1ms", DUR_US, &ns), 0);
	assert_true(ns == DUR_MS);
	assert_int_equal(duration_parse("1.5h", DUR_S, &ns), 0);
	assert_true(ns == 5400 * DUR_S);
	assert_int_equal(duration_parse("250ns", DUR_S, &ns), 0);
	assert_true(ns == 250);
	assert_int_equal(duration_parse("0", DUR_S, &ns), 0);
	assert_true(ns == 0);
	ns = 7;
	assert_int_equal(duration_parse("0.5ns", DUR_S, &ns), -EINVAL);
	assert_int_equal(duration_parse("1x", DUR_S, &ns), -EINVAL);
	assert_int_equal(duration_parse("1 s", DUR_S, &ns), -EINVAL);
	assert_int_equal(duration_parse("-1", DUR_S, &ns), -EINVAL);
	assert_int_equal(duration_parse("s", DUR_S, &ns), -EINVAL);
	assert_int_equal(duration_parse("", DUR_S, &ns), -EINVAL);
	assert_int_equal(duration_parse("99999999999h", DUR_S, &ns), -EINVAL);
	assert_true(ns == 7);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_size_docs_table),
		cmocka_unit_test(test_size_iec_si),
		cmocka_unit_test(test_size_overflow_edge),
		cmocka_unit_test(test_size_list),
		cmocka_unit_test(test_size_format_reads_back),
		cmocka_unit_test(test_duration_units),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
