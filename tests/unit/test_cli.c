// SPDX-License-Identifier: MIT
/*
 * test_cli.c - common/cli.c: long options are taken by their full name only ("--pol" is not
 * --poll-us), every refusal is two lines on stderr (the cause with the nearest valid names,
 * then where help is), a missing or unwanted value is named, exact names, "--name=value",
 * separate values, short options and argv permutation work as getopt_long() has them, and the
 * edit distance and the nearest-name rules behind the suggestions.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "cli.h"

enum { O_POOL = 256, O_POLL, O_POOL_NAME, O_MAXC, O_MAXCTL, O_MAXNS, O_JSON, O_SOCKET };

static const struct option lo[] = {
	{"pool", required_argument, NULL, O_POOL},
	{"poll-us", required_argument, NULL, O_POLL},
	{"pool-name", required_argument, NULL, O_POOL_NAME},
	{"max-clients", required_argument, NULL, O_MAXC},
	{"max-control", required_argument, NULL, O_MAXCTL},
	{"max-ns", required_argument, NULL, O_MAXNS},
	{"json", no_argument, NULL, O_JSON},
	{"socket", required_argument, NULL, 's'},
	{NULL, 0, NULL, 0},
};

struct run {
	int codes[16]; /* what cli_getopt() returned, up to -1 */
	const char *args[16];
	int n;
	char err[1024]; /* what it printed on stderr */
};

/* Parses args (NULL-terminated) to the end or the first refusal, stderr captured. */
static void parse(struct run *r, const char *spec, const char *const *args)
{
	static char words[16][64];
	char *argv[17];
	FILE *tmp = tmpfile();
	int argc = 0, saved = dup(2), c;
	size_t len;

	memset(r, 0, sizeof(*r));
	/* Writable copies: getopt_long() permutes argv, and optarg points into it. */
	for (; args[argc]; argc++) {
		assert_true(argc < 16 && strlen(args[argc]) < sizeof(words[0]));
		argv[argc] = strcpy(words[argc], args[argc]);
	}
	argv[argc] = NULL;
	assert_non_null(tmp);
	fflush(stderr);
	assert_int_equal(dup2(fileno(tmp), 2), 2);
	optind = 0; /* glibc: start over, a new argv */
	do {
		c = cli_getopt(argc, argv, spec, lo, "prog");
		r->args[r->n] = c > 0 && c != '?' ? optarg : NULL;
		r->codes[r->n++] = c;
	} while (c != -1 && c != '?' && r->n < 16);
	fflush(stderr);
	dup2(saved, 2);
	close(saved);
	rewind(tmp);
	len = fread(r->err, 1, sizeof(r->err) - 1, tmp);
	r->err[len] = '\0';
	fclose(tmp);
}

#define ARGV(...) ((const char *const[]){"prog", __VA_ARGS__, NULL})

/* Exactly two lines: the cause, then the help line. */
static void assert_two_lines(const struct run *r, const char *cause)
{
	char want[512];

	snprintf(want, sizeof(want), "prog: %s\nTry 'prog --help' for more information.\n", cause);
	assert_string_equal(r->err, want);
}

static void test_cli_exact_names_parse(void **state)
{
	struct run r;

	(void)state;
	parse(&r, "hs:",
	      ARGV("--pool", "1G", "--poll-us=5", "--json", "-s", "/x", "pos", "--socket", "/y"));
	assert_string_equal(r.err, "");
	assert_int_equal(r.n, 6);
	assert_int_equal(r.codes[0], O_POOL);
	assert_string_equal(r.args[0], "1G");
	assert_int_equal(r.codes[1], O_POLL);
	assert_string_equal(r.args[1], "5");
	assert_int_equal(r.codes[2], O_JSON);
	assert_int_equal(r.codes[3], 's');
	assert_string_equal(r.args[3], "/x");
	assert_int_equal(r.codes[4], 's'); /* after a non-option: argv is permuted */
	assert_string_equal(r.args[4], "/y");
	assert_int_equal(r.codes[5], -1);
}

static void test_cli_typo_suggests_nearest(void **state)
{
	struct run r;

	(void)state;
	/* getopt_long() alone takes "--pol" for --poll-us, and "1G" as its value. */
	parse(&r, "h", ARGV("--pol", "1G"));
	assert_int_equal(r.n, 1);
	assert_int_equal(r.codes[0], '?');
	assert_two_lines(&r, "unknown option --pol; did you mean --pool?");
	parse(&r, "h", ARGV("--sokcet=/x"));
	assert_two_lines(&r, "unknown option --sokcet; did you mean --socket?");
	parse(&r, "h", ARGV("--jsn"));
	assert_two_lines(&r, "unknown option --jsn; did you mean --json?");
	parse(&r, "h", ARGV("--frobnicate"));
	assert_two_lines(&r, "unknown option --frobnicate");
}

static void test_cli_abbreviation_refused(void **state)
{
	struct run r;

	(void)state;
	/* A unique prefix: getopt_long() would take it; refused, the whole name suggested. */
	parse(&r, "h", ARGV("--max-cl", "3"));
	assert_int_equal(r.codes[0], '?');
	assert_two_lines(&r, "unknown option --max-cl; did you mean --max-clients?");
	parse(&r, "h", ARGV("--soc=/x"));
	assert_two_lines(&r, "unknown option --soc; did you mean --socket?");
	/* A prefix of several. */
	parse(&r, "h", ARGV("--max-c", "3"));
	assert_two_lines(&r, "ambiguous option --max-c; did you mean --max-clients or "
			     "--max-control?");
	/* Whole words of several names, and one edit from another. */
	parse(&r, "h", ARGV("--max", "3"));
	assert_two_lines(&r, "ambiguous option --max; did you mean --max-clients, --max-control "
			     "or --max-ns?");
	parse(&r, "h", ARGV("--poll", "3"));
	assert_two_lines(&r, "unknown option --poll; did you mean --pool or --poll-us?");
	/* A prefix with a missing value is the prefix's fault, not the value's. */
	parse(&r, "h", ARGV("--max-cl"));
	assert_two_lines(&r, "unknown option --max-cl; did you mean --max-clients?");
}

static void test_cli_values(void **state)
{
	struct run r;

	(void)state;
	parse(&r, "h", ARGV("--json", "--pool"));
	assert_int_equal(r.codes[0], O_JSON);
	assert_int_equal(r.codes[1], '?');
	assert_two_lines(&r, "option --pool needs a value");
	parse(&r, "h", ARGV("--json=yes"));
	assert_two_lines(&r, "option --json takes no value");
	parse(&r, "hs:", ARGV("-s"));
	assert_two_lines(&r, "option -s needs a value");
	parse(&r, "hs:", ARGV("-x"));
	assert_two_lines(&r, "unknown option -x");
	/* An unknown letter in a cluster after a long option is the letter's fault. */
	parse(&r, "hs:j", ARGV("--json", "-jx"));
	assert_int_equal(r.codes[0], O_JSON);
	assert_int_equal(r.codes[1], 'j');
	assert_two_lines(&r, "unknown option -x");
	/* "--" ends the options; what follows is an argument. */
	parse(&r, "h", ARGV("--", "--pol"));
	assert_int_equal(r.codes[0], -1);
	assert_string_equal(r.err, "");
}

static void test_cli_distance_osa(void **state)
{
	(void)state;
	assert_int_equal(cli_distance("pool", 4, "pool"), 0);
	assert_int_equal(cli_distance("pol", 3, "pool"), 1);
	assert_int_equal(cli_distance("pol", 3, "poll-us"), 4);
	assert_int_equal(cli_distance("stauts", 6, "status"), 1); /* a transposition */
	assert_int_equal(cli_distance("", 0, "json"), 4);
	assert_int_equal(cli_distance("kitten", 6, "sitting"), 3);
	assert_int_equal(cli_distance("pool=1G", 4, "pool"), 0); /* only alen bytes count */
	{
		char big[CLI_NAME_MAX + 2];

		memset(big, 'a', sizeof(big) - 1);
		big[sizeof(big) - 1] = '\0';
		assert_int_equal(cli_distance(big, strlen(big), "a"), CLI_FAR);
		assert_int_equal(cli_distance("a", 1, big), CLI_FAR);
	}
}

static void test_cli_nearest_rules(void **state)
{
	static const char *const cmds[] = {"status",  "clients", "ns",	 "map",
					   "metrics", "top",	 "plan", "drop"};
	const char *out[4];

	(void)state;
	assert_int_equal(cli_nearest("stauts", 6, cmds, 8, out, 4), 1);
	assert_string_equal(out[0], "status");
	assert_int_equal(cli_nearest("metric", 6, cmds, 8, out, 4), 1);
	assert_string_equal(out[0], "metrics");
	assert_int_equal(cli_nearest("client", 6, cmds, 8, out, 4), 1);
	assert_string_equal(out[0], "clients");
	assert_int_equal(cli_nearest("xyzzy", 5, cmds, 8, out, 4), 0);
	/* One edit: several at once, in table order ("mop" is one from map and top). */
	assert_int_equal(cli_nearest("mop", 3, cmds, 8, out, 4), 2);
	assert_string_equal(out[0], "map");
	assert_string_equal(out[1], "top");
	/* Two edits from 2..8 characters; three from 9 up. */
	assert_int_equal(cli_nearest("stat", 4, cmds, 8, out, 4), 1); /* a prefix */
	assert_int_equal(cli_nearest("cleints", 7, cmds, 8, out, 4), 1);
	assert_int_equal(cli_nearest("clxxnts", 7, cmds, 8, out, 4), 1);
	assert_int_equal(cli_nearest("cxxxnts", 7, cmds, 8, out, 4), 0);
	/* More than max: the count, and max of them. */
	{
		static const char *const many[] = {"max-a", "max-b", "max-c", "max-d", "max-e"};

		assert_int_equal(cli_nearest("max", 3, many, 5, out, 2), 5);
		assert_string_equal(out[0], "max-a");
		assert_string_equal(out[1], "max-b");
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_cli_exact_names_parse),
		cmocka_unit_test(test_cli_typo_suggests_nearest),
		cmocka_unit_test(test_cli_abbreviation_refused),
		cmocka_unit_test(test_cli_values),
		cmocka_unit_test(test_cli_distance_osa),
		cmocka_unit_test(test_cli_nearest_rules),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
