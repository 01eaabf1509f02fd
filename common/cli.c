// SPDX-License-Identifier: MIT
/*
 * cli.c - command lines (cli.h): full-name long options on top of getopt_long(), two-line
 * usage errors, the names nearest to a misspelt one, and --version.
 *
 * getopt_long() takes any unambiguous prefix of a long option for the option: a typo such as
 * "--pol 1G" became --poll-us 1G (and was then refused as a bad poll time, the real mistake
 * unnamed), and a script that abbreviates breaks the day an option sharing the prefix is added.
 * cli_getopt() lets getopt_long() parse, then looks at the word it consumed: when the name
 * typed is not the option's whole name, the option is refused as unknown. The word is found
 * from optind, which getopt_long() leaves just past the option (and past its separate value);
 * it permutes argv only at the start of its next call, so the word is still where it was.
 * Single-threaded, as getopt_long() is; pure functions otherwise.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "kvbroker.h"

int cli_usage_error(const char *prog, const char *fmt, ...)
{
	va_list ap;

	fprintf(stderr, "%s: ", prog);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fprintf(stderr, "\nTry '%s --help' for more information.\n", prog);
	return CLI_USAGE;
}

void cli_version(const char *prog)
{
	printf("%s %s\n", prog, KVB_VERSION_STRING);
}

unsigned cli_distance(const char *a, size_t alen, const char *b)
{
	/* Three rows of the dynamic programme: i - 2, i - 1 and i (transpositions look back 2). */
	unsigned rows[3][CLI_NAME_MAX + 1];
	size_t blen = strlen(b);

	if (alen > CLI_NAME_MAX || blen > CLI_NAME_MAX)
		return CLI_FAR;
	for (size_t j = 0; j <= blen; j++)
		rows[0][j] = (unsigned)j;
	for (size_t i = 1; i <= alen; i++) {
		unsigned *cur = rows[i % 3], *prev = rows[(i - 1) % 3], *pp = rows[(i + 1) % 3];

		cur[0] = (unsigned)i;
		for (size_t j = 1; j <= blen; j++) {
			unsigned cost = a[i - 1] != b[j - 1];
			unsigned d = prev[j] + 1;

			if (cur[j - 1] + 1 < d)
				d = cur[j - 1] + 1;
			if (prev[j - 1] + cost < d)
				d = prev[j - 1] + cost;
			if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1] &&
			    pp[j - 2] + 1 < d)
				d = pp[j - 2] + 1;
			cur[j] = d;
		}
	}
	return rows[alen % 3][blen];
}

/* Does name start with typed[0..len)? Also "as whole words": the name goes on with a '-'. */
static int starts(const char *name, const char *typed, size_t len, int words)
{
	return len && !strncmp(name, typed, len) && name[len] && (!words || name[len] == '-');
}

size_t cli_nearest(const char *typed, size_t len, const char *const *names, size_t n,
		   const char **out, size_t max)
{
	unsigned best = CLI_FAR, limit = len >= 9 ? 3 : 2;
	size_t k = 0;

	for (size_t i = 0; i < n; i++)
		if (cli_distance(typed, len, names[i]) <= 1 || starts(names[i], typed, len, 1))
			k += k < max ? (out[k] = names[i], 1) : 1;
	if (k)
		return k;
	for (size_t i = 0; i < n; i++)
		if (starts(names[i], typed, len, 0))
			k += k < max ? (out[k] = names[i], 1) : 1;
	if (k)
		return k;
	for (size_t i = 0; i < n; i++) {
		unsigned d = cli_distance(typed, len, names[i]);

		if (d < best)
			best = d;
	}
	for (size_t i = 0; best <= limit && i < n; i++)
		if (cli_distance(typed, len, names[i]) == best)
			k += k < max ? (out[k] = names[i], 1) : 1;
	return k;
}

#define CLI_SUGGEST 4	 /* names a message lists at most */
#define CLI_OPTS_MAX 128 /* options a table may have for suggestions (kvbrokerd has ~50) */

/* "unknown option --pol; did you mean --pool?" for the long option named typed[0..len). */
static void unknown_long(const char *prog, const char *typed, size_t len, const struct option *lo)
{
	const char *names[CLI_OPTS_MAX], *near[CLI_SUGGEST];
	char list[CLI_SUGGEST * (CLI_NAME_MAX + 8) + 16];
	size_t n = 0, k, used = 0;
	int ambiguous;

	while (n < CLI_OPTS_MAX && lo[n].name) {
		names[n] = lo[n].name;
		n++;
	}
	k = cli_nearest(typed, len, names, n, near, CLI_SUGGEST);
	ambiguous = k >= 2;
	for (size_t i = 0; i < k && i < CLI_SUGGEST && used < sizeof(list); i++) {
		ambiguous &= starts(near[i], typed, len, 0);
		used += (size_t)snprintf(list + used, sizeof(list) - used, "%s--%s",
					 !i		   ? ""
					 : k > CLI_SUGGEST ? ", "
					 : i == k - 1	   ? " or "
							   : ", ",
					 near[i]);
	}
	if (k > CLI_SUGGEST && used < sizeof(list))
		snprintf(list + used, sizeof(list) - used, ", ...");
	if (!k)
		cli_usage_error(prog, "unknown option --%.*s", (int)len, typed);
	else
		cli_usage_error(prog, "%s option --%.*s; did you mean %s%s?",
				ambiguous ? "ambiguous" : "unknown", (int)len, typed,
				k > CLI_SUGGEST ? "one of " : "", list);
}

/* The option lo[] whose name is exactly typed[0..len), or NULL. */
static const struct option *exact(const struct option *lo, const char *typed, size_t len)
{
	for (; lo->name; lo++)
		if (!strncmp(lo->name, typed, len) && !lo->name[len])
			return lo;
	return NULL;
}

/* getopt_long() refused something (returned '?' or ':'): say what, as a usage error. */
static void refused(int argc, char *const argv[], const char *shortopts, const struct option *lo,
		    const char *prog)
{
	const char *word = optind >= 2 && optind <= argc ? argv[optind - 1] : "";
	int is_long = word[0] == '-' && word[1] == '-' && word[2] && word[2] != '=';
	const char *name = is_long ? word + 2 : "", *sc;
	size_t len = strcspn(name, "=");
	const struct option *o;

	/*
	 * A long option: unknown or ambiguous (optopt 0), or a prefix of one, or one whose value
	 * is missing or not allowed (optopt its val). Otherwise optopt is a short option's letter
	 * (an unknown letter inside "-xj" leaves optind on the word before it).
	 */
	if (is_long && optopt) {
		is_long = 0;
		for (o = lo; o->name; o++)
			is_long |= o->val == optopt && !strncmp(o->name, name, len);
	}
	if (is_long) {
		o = exact(lo, name, len);
		if (!o)
			unknown_long(prog, name, len, lo);
		else if (name[len] == '=')
			cli_usage_error(prog, "option --%s takes no value", o->name);
		else
			cli_usage_error(prog, "option --%s needs a value", o->name);
		return;
	}
	sc = optopt > 0 && optopt != ':' && optopt != '+' && optopt != '-'
		     ? strchr(shortopts, optopt)
		     : NULL;
	if (sc && sc[1] == ':')
		cli_usage_error(prog, "option -%c needs a value", optopt);
	else if (optopt > 32 && optopt < 127)
		cli_usage_error(prog, "unknown option -%c", optopt);
	else
		cli_usage_error(prog, "unknown option '%s'", word);
}

int cli_getopt(int argc, char *const argv[], const char *shortopts, const struct option *lo,
	       const char *prog)
{
	int idx = -1, saved = opterr, c;
	const char *word, *name;
	size_t len;

	opterr = 0;
	c = getopt_long(argc, argv, shortopts, lo, &idx);
	opterr = saved;
	if (c == '?' || c == ':') {
		refused(argc, argv, shortopts, lo, prog);
		return '?';
	}
	if (c == -1 || idx < 0)
		return c;
	/* A long option matched: was its whole name typed? The word is just before optind, or
	 * before its separate value. */
	word = optind >= 2 && optind <= argc ? argv[optind - 1] : NULL;
	if (word && optarg && word == optarg && optind >= 3)
		word = argv[optind - 2];
	if (!word || word[0] != '-' || word[1] != '-')
		return c;
	name = word + 2;
	len = strcspn(name, "=");
	if (exact(lo, name, len) == &lo[idx])
		return c;
	unknown_long(prog, name, len, lo);
	return '?';
}
