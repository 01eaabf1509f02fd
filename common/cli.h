/* SPDX-License-Identifier: MIT */
/*
 * cli.h - what every program's command line shares: long options matched by their full name
 * only, usage errors of two lines (the cause, then where help is), the nearest valid name
 * suggested for a misspelt one, and --version. kvbrokerd, kvbctl (and its subcommands), kvbbench,
 * kvbdemo, kvbdisk, kvbchain, kvbgpucheck and kvbfetch use it; one implementation, so every
 * program refuses, suggests and prints alike. Single-threaded, as getopt_long() is.
 */
#ifndef KVB_COMMON_CLI_H
#define KVB_COMMON_CLI_H

#include <getopt.h>
#include <stddef.h>

/* The exit status of a usage error, in every program. */
#define CLI_USAGE 2

/*
 * getopt_long() without its prefix matching: "--pol" is not taken for --poll-us, and "--max-c"
 * is not refused as merely ambiguous but as unknown, with the options it may have meant. An
 * option is its full name, "--name", "--name=value" or "--name value"; short options and the
 * rest behave as getopt_long(), which does the parsing (argv permutation and "+" included).
 * prog names the program in messages ("kvbctl plan"); its help is "prog --help".
 * Returns what getopt_long() returns, or '?' after printing a usage error (cli_usage_error()):
 * an unknown option, with the valid names nearest to it; an abbreviated one; a missing value;
 * a value given to an option that takes none. The caller then exits CLI_USAGE. Leaves opterr
 * as it found it.
 */
int cli_getopt(int argc, char *const argv[], const char *shortopts, const struct option *lo,
	       const char *prog);

/*
 * A usage error on stderr in two lines: "prog: MESSAGE" and "Try 'prog --help' for more
 * information." (prog: the program and subcommand, as for cli_getopt()). Returns CLI_USAGE.
 */
int cli_usage_error(const char *prog, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* "prog X.Y.Z" on stdout: KVB_VERSION_STRING of include/kvbroker.h, the one version. */
void cli_version(const char *prog);

/* Longest name cli_distance() measures; longer ones are at distance CLI_FAR. */
#define CLI_NAME_MAX 64
#define CLI_FAR 1000u

/*
 * Edit distance between a[0..alen) and b (NUL-terminated): insertions, deletions,
 * substitutions and transpositions of two adjacent characters each count 1 (the optimal string
 * alignment distance, so "stauts" is 1 from "status"). CLI_FAR when either is longer than
 * CLI_NAME_MAX.
 */
unsigned cli_distance(const char *a, size_t alen, const char *b);

/*
 * The names a user who typed typed[0..len) probably meant, best first as far as the rules
 * tell, else in names[] order:
 *   1. names one edit away, and names that start with typed as whole words ("poll" of
 *      "poll-us", "max" of "max-clients": typed ends where the name has a '-');
 *   2. failing those, names that start with typed ("max-c": max-clients, max-control);
 *   3. failing those, the names nearest to it, if at most 2 edits away (3 from 9 characters up).
 * Writes at most max of them into out[]; returns how many there are (may be more than max).
 */
size_t cli_nearest(const char *typed, size_t len, const char *const *names, size_t n,
		   const char **out, size_t max);

#endif /* KVB_COMMON_CLI_H */
