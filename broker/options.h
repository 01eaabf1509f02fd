/* SPDX-License-Identifier: MIT */
/*
 * options.h - kvbrokerd's settings, declared once in a table (options.c) from which come the
 * command line, --help (the user's options) and --help-all (with the test-only knobs), the
 * config file (--config FILE: the same names), and the "config" section of the STATS document
 * (kvbctl status). Start-up only (main thread), but options_json(), which the loop calls.
 */
#ifndef KVB_BROKER_OPTIONS_H
#define KVB_BROKER_OPTIONS_H

#include <stdio.h>

struct config;
struct cJSON;

/* What set a setting, for options_json(): kept per option in struct config's seen[]. */
struct opt_seen {
	char **vals; /* the values given, in order (a repeatable option may have several) */
	unsigned n;  /* how many; 0: the default */
	char *from;  /* "command line" or "FILE:LINE" of the last one */
};

/*
 * Fills c from defaults, then --config FILE (if given, wherever on the command line), then the
 * rest of the command line (which wins over the file), and checks the settings against each
 * other. Returns 0 to run, 1 when it printed what was asked (--help, --help-all, --version)
 * and the program should exit 0, or -EINVAL after a usage error on stderr (exit CLI_USAGE):
 * the option or FILE:LINE, the cause, and the fix. c owns what it allocated: options_free().
 */
int options_parse(int argc, char **argv, struct config *c);

/* The help text: the user's options, or every option (all: --help-all). */
void options_help(FILE *f, int all);

/*
 * The settings as a JSON object, one member per option that is a setting (not a command):
 * {"value": what the broker runs with, "source": "default", "command line" or "FILE:LINE"}.
 * NULL on allocation failure.
 */
struct cJSON *options_json(const struct config *c);

/* Frees what options_parse() allocated in c. */
void options_free(struct config *c);

#endif /* KVB_BROKER_OPTIONS_H */
