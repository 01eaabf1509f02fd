// SPDX-License-Identifier: MIT
/*
 * test_options.c - broker/options.c, table-driven: for every setting of kvbrokerd, a good
 * value on the command line and the same in a config file give the same value in the
 * "config" section of the STATS document (kvbctl status), with its source; a bad value is
 * refused naming the option (or FILE:LINE), the cause and what a good one looks like; --help
 * lists it unless it is a test-only knob, which --help-all lists. The cases must cover every
 * setting options_json() reports, so a new option without a case fails here. Then the file's
 * own rules: comments, "--name=value", flags, unknown names with a suggestion, commands
 * refused in a file, the command line over the file, repeatable settings adding up.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "broker.h"
#include "log.h"
#include "options.h"

struct ocase {
	const char *name;
	const char *good;  /* NULL: a flag */
	const char *want;  /* the JSON of its value in "config" */
	const char *bad;   /* NULL: no value is refused by the option itself */
	const char *extra; /* another option it needs */
	int test_only;	   /* hidden from --help */
};

static const struct ocase cases[] = {
	{"socket", "/tmp/kvbt-opt.sock", "\"/tmp/kvbt-opt.sock\"", "", NULL, 0},
	{"pool", "64M", "67108864", "1X", NULL, 0},
	{"pool-overcommit", NULL, "true", NULL, NULL, 0},
	{"pool-name", "/kvbt", "\"/kvbt\"", "a/b", NULL, 0},
	{"numa", "off", "\"off\"", "", NULL, 0},
	{"hugepages", "off", "\"off\"", "sometimes", NULL, 0},
	{"slab", "8M", "\"8M\"", "1000", NULL, 0},
	{"high-watermark", "95", "\"95\"", "0", NULL, 0},
	{"low-watermark", "50", "\"50\"", "101", NULL, 0},
	{"disk", "/tmp/kvbt-disk", "\"/tmp/kvbt-disk\"", "", "--disk-size=1G", 0},
	{"disk-size", "1G", "1073741824", "0", NULL, 0},
	{"disk-qd", "8", "8", "4097", NULL, 0},
	{"disk-sqpoll", NULL, "true", NULL, NULL, 0},
	{"remote", "redis://h:1", "\"redis://h:1\"", "", NULL, 0},
	{"remote-prefix", "p:", "\"p:\"", "a{b}", NULL, 0},
	{"remote-timeout", "0.5s", "500", "0", NULL, 0},
	{"remote-inflight", "1M", "1048576", "0", NULL, 0},
	{"remote-publish", "never", "\"never\"", "sometimes", NULL, 0},
	{"poll-us", "1ms", "1000", "0.5us", NULL, 0},
	{"metrics-listen", "9464", "\"9464\"", "", NULL, 0},
	{"max-clients", "10", "10", "0", NULL, 0},
	{"max-control", "3", "3", "0", NULL, 0},
	{"control-idle", "3m", "180", "-1", NULL, 0},
	{"max-leases", "0", "0", "x", NULL, 0},
	{"max-lease-bytes", "5%", "\"5%\"", "0%", NULL, 0},
	{"max-pinned", "30", "\"30\"", "200", NULL, 0},
	{"lease-lifetime", "1h", "3600", "1y", NULL, 0},
	{"tenants", "uid", "\"uid\"", "everyone", NULL, 0},
	{"tenant", "0=32M", "[\"0=32M\"]", NULL, "--tenants=uid", 0},
	{"tenant-share", "10%", "\"10%\"", "x", "--tenants=uid", 0},
	{"tenant-idle", "5m", "300", "1y", NULL, 0},
	{"ns-limit", "m=1G", "[\"m=1G\"]", "nolimit", NULL, 0},
	{"arg-size", "64K", "65536", "1K", NULL, 0},
	{"max-buf-bytes", "1G", "1073741824", "1Q", NULL, 0},
	{"max-sq-entries", "1024", "1024", "1000", NULL, 0},
	{"max-bufs", "8", "8", "257", NULL, 0},
	{"max-ns", "8", "8", "65", NULL, 0},
	{"max-inflight", "100", "100", "0", NULL, 0},
	{"no-prefault", NULL, "true", NULL, NULL, 0},
	{"no-directory", NULL, "true", NULL, NULL, 0},
	{"group", "root", "\"root\"", "no-such-group-kvbt", NULL, 0},
	{"copy-threads", "3", "3", "65", NULL, 0},
	{"copy-inline", "0", "0", "x", NULL, 0},
	{"copy-delay-us", "5", "5", "x", NULL, 1},
	{"copy-fail-every", "7", "7", "x", NULL, 1},
	{"no-gpu", NULL, "true", NULL, NULL, 0},
	{"gpu-path", "kernel", "\"kernel\"", "warp", NULL, 0},
	{"no-pool-keep", NULL, "true", NULL, NULL, 0},
	{"log-level", "debug", "\"debug\"", "loud", NULL, 0},
};

/* The end of parse()'s words. */
#define END ((const char *)NULL)

#define NCASES (sizeof(cases) / sizeof(cases[0]))

static struct config cfg;
static char err_text[4096];
static char conf_path[64];

/* Runs options_parse() on the words given (NULL-terminated), stderr captured in err_text. */
static int parse(const char *w0, ...)
{
	char *argv[16] = {strdup("kvbrokerd")};
	int argc = 1, rc, saved = dup(2), saved_out = dup(1), null = open("/dev/null", O_WRONLY);
	FILE *tmp = tmpfile();
	va_list ap;
	size_t n;

	va_start(ap, w0);
	for (const char *w = w0; w && argc < 15; w = va_arg(ap, const char *))
		argv[argc++] = strdup(w);
	va_end(ap);
	argv[argc] = NULL;
	assert_non_null(tmp);
	fflush(stderr);
	dup2(fileno(tmp), 2);
	fflush(stdout);
	dup2(null, 1); /* --help's text: test_options_help reads it through options_help() */
	options_free(&cfg);
	optind = 0; /* getopt_long() starts over */
	rc = options_parse(argc, argv, &cfg);
	fflush(stderr);
	fflush(stdout);
	dup2(saved, 2);
	dup2(saved_out, 1);
	close(saved);
	close(saved_out);
	close(null);
	for (int i = 0; i < argc; i++)
		free(argv[i]);
	rewind(tmp);
	n = fread(err_text, 1, sizeof(err_text) - 1, tmp);
	err_text[n] = '\0';
	fclose(tmp);
	return rc;
}

static void write_conf(const char *text)
{
	FILE *f = fopen(conf_path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

/* The "config" section's entry for name: its value as JSON text, and its source. */
static void entry(const char *name, char *val, size_t vlen, char *src, size_t slen)
{
	cJSON *root = options_json(&cfg), *e, *v;
	char *t;

	assert_non_null(root);
	e = cJSON_GetObjectItemCaseSensitive(root, name);
	if (!e)
		fail_msg("config has no '%s'", name);
	v = cJSON_GetObjectItemCaseSensitive(e, "value");
	t = cJSON_PrintUnformatted(v);
	snprintf(val, vlen, "%s", t);
	snprintf(src, slen, "%s", cJSON_GetObjectItemCaseSensitive(e, "source")->valuestring);
	free(t);
	cJSON_Delete(root);
}

static int setup(void **state)
{
	int fd;

	(void)state;
	snprintf(conf_path, sizeof(conf_path), "/tmp/kvbt-opt-XXXXXX");
	fd = mkstemp(conf_path);
	assert_true(fd >= 0);
	close(fd);
	unsetenv("KVB_SOCKET");
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	unlink(conf_path);
	options_free(&cfg);
	log_min_level = LOG_INFO;
	return 0;
}

/* Every setting status reports has a case, and every case is a setting. */
static void test_options_cases_cover_table(void **state)
{
	cJSON *root, *e;
	int n = 0;

	(void)state;
	assert_int_equal(parse(END), 0);
	root = options_json(&cfg);
	cJSON_ArrayForEach(e, root)
	{
		size_t i;

		for (i = 0; i < NCASES && strcmp(cases[i].name, e->string); i++)
			;
		if (i == NCASES)
			fail_msg("setting '%s' has no case in test_options.c", e->string);
		n++;
	}
	cJSON_Delete(root);
	assert_int_equal(n, NCASES);
}

static void test_options_command_line(void **state)
{
	char arg[256], val[256], src[256];

	(void)state;
	for (size_t i = 0; i < NCASES; i++) {
		const struct ocase *k = &cases[i];

		snprintf(arg, sizeof(arg), "--%s%s%s", k->name, k->good ? "=" : "",
			 k->good ? k->good : "");
		if (parse(arg, k->extra, END))
			fail_msg("%s refused: %s", arg, err_text);
		entry(k->name, val, sizeof(val), src, sizeof(src));
		if (strcmp(val, k->want))
			fail_msg("%s: config shows %s, want %s", arg, val, k->want);
		assert_string_equal(src, "command line");
	}
}

static void test_options_bad_values(void **state)
{
	char arg[256], want[512];

	(void)state;
	for (size_t i = 0; i < NCASES; i++) {
		const struct ocase *k = &cases[i];

		if (!k->bad)
			continue;
		snprintf(arg, sizeof(arg), "--%s=%s", k->name, k->bad);
		if (parse(arg, k->extra, END) != -EINVAL)
			fail_msg("%s was taken", arg);
		if (!strcmp(k->name, "group"))
			snprintf(want, sizeof(want), "kvbrokerd: --group: no group '%s'\n", k->bad);
		else
			snprintf(want, sizeof(want), "kvbrokerd: bad value '%s' for --%s: ", k->bad,
				 k->name);
		if (strncmp(err_text, want, strlen(want)) ||
		    !strstr(err_text, "Try 'kvbrokerd --help' for more information.\n"))
			fail_msg("%s: said '%s', want it to start '%s'", arg, err_text, want);
	}
}

static void test_options_config_file(void **state)
{
	char line[256], val[256], src[256], where[128];

	(void)state;
	snprintf(where, sizeof(where), "%s:3", conf_path);
	for (size_t i = 0; i < NCASES; i++) {
		const struct ocase *k = &cases[i];

		snprintf(line, sizeof(line), "# kvbrokerd\n\n%s%s%s\n", k->name,
			 k->good ? " = " : "", k->good ? k->good : "");
		write_conf(line);
		if (parse("--config", conf_path, k->extra, END))
			fail_msg("%s: %s refused: %s", conf_path, line, err_text);
		entry(k->name, val, sizeof(val), src, sizeof(src));
		if (strcmp(val, k->want))
			fail_msg("file '%s': config shows %s, want %s", k->name, val, k->want);
		assert_string_equal(src, where);
		if (!k->bad)
			continue;
		snprintf(line, sizeof(line), "# kvbrokerd\n\n%s = %s\n", k->name, k->bad);
		write_conf(line);
		if (parse("--config", conf_path, k->extra, END) != -EINVAL)
			fail_msg("file '%s = %s' was taken", k->name, k->bad);
		if (!strstr(err_text, where) || !strstr(err_text, k->name))
			fail_msg("file '%s = %s': said '%s', without %s", k->name, k->bad, err_text,
				 where);
	}
}

static void test_options_help(void **state)
{
	char *text, *all, name[80];
	size_t len;
	FILE *f;

	(void)state;
	f = open_memstream(&text, &len);
	options_help(f, 0);
	fclose(f);
	f = open_memstream(&all, &len);
	options_help(f, 1);
	fclose(f);
	for (size_t i = 0; i < NCASES; i++) {
		snprintf(name, sizeof(name), "\n  --%s%s", cases[i].name, cases[i].good ? " " : "");
		if (!strstr(all, name))
			fail_msg("--help-all lacks %s", cases[i].name);
		if (!!strstr(text, name) == cases[i].test_only)
			fail_msg("--help %s %s", cases[i].test_only ? "shows" : "lacks",
				 cases[i].name);
	}
	/* Every line fits a terminal. */
	for (char *p = all; *p;) {
		char *e = strchr(p, '\n');

		assert_non_null(e);
		assert_true(e - p < 80);
		p = e + 1;
	}
	assert_non_null(strstr(text, "--help-all"));
	free(text);
	free(all);
	assert_int_equal(parse("--help-all", END), 1);
	assert_int_equal(parse("-h", END), 1);
}

static void test_options_file_rules(void **state)
{
	char val[256], src[256], want[256];

	(void)state;
	/* "--name=value", "name value", quotes, trailing blanks, flags as yes/no. */
	write_conf("--pool=64M\nslab 8M  \nremote-prefix = \"x:\"\nno-gpu = no\nno-prefault = "
		   "yes\n");
	assert_int_equal(parse("--config", conf_path, END), 0);
	assert_true(cfg.pool_bytes == 64ull << 20 && cfg.slab_bytes == 8ull << 20);
	assert_string_equal(cfg.remote.prefix, "x:");
	assert_int_equal(cfg.gpu, 1);
	assert_int_equal(cfg.prefault, 0);
	/* The command line wins, wherever --config stands. */
	assert_int_equal(parse("--pool=96M", "--config", conf_path, END), 0);
	entry("pool", val, sizeof(val), src, sizeof(src));
	assert_string_equal(val, "100663296");
	assert_string_equal(src, "command line");
	/* Repeatable settings add up. */
	write_conf("tenants = uid\ntenant = 0=32M\n");
	assert_int_equal(parse("--config", conf_path, "--tenant=1=16M", END), 0);
	entry("tenant", val, sizeof(val), src, sizeof(src));
	assert_string_equal(val, "[\"0=32M\",\"1=16M\"]");
	assert_int_equal(cfg.tenants.nlisted, 2);
	/* Unknown names get a suggestion and the line. */
	write_conf("pool = 64M\npol = 1G\n");
	assert_int_equal(parse("--config", conf_path, END), -EINVAL);
	snprintf(want, sizeof(want), "%s:2: unknown setting 'pol'; did you mean 'pool'", conf_path);
	if (!strstr(err_text, want))
		fail_msg("said '%s'", err_text);
	/* Commands stay on the command line. */
	write_conf("takeover\n");
	assert_int_equal(parse("--config", conf_path, END), -EINVAL);
	assert_non_null(strstr(err_text, "give --takeover on the command line"));
	write_conf("no-gpu = maybe\n");
	assert_int_equal(parse("--config", conf_path, END), -EINVAL);
	assert_non_null(strstr(err_text, "is a flag"));
	write_conf("pool =\n");
	assert_int_equal(parse("--config", conf_path, END), -EINVAL);
	assert_non_null(strstr(err_text, "'pool' needs a value"));
	/* A file that is not there is named. */
	assert_int_equal(parse("--config", "/nonexistent/kvb.conf", END), -EINVAL);
	assert_non_null(strstr(err_text, "--config /nonexistent/kvb.conf: No such file"));
	/* Settings checked against each other still are. */
	write_conf("disk = /tmp/kvbt-disk\n");
	assert_int_equal(parse("--config", conf_path, END), -EINVAL);
	assert_non_null(strstr(err_text, "--disk needs --disk-size"));
}

/* The defaults the broker ran with before the table, unchanged. */
static void test_options_defaults(void **state)
{
	char val[256], src[256];

	(void)state;
	assert_int_equal(parse(END), 0);
	assert_int_equal(cfg.poll_us, 200);
	assert_true(cfg.control_idle == 120 && cfg.lease_lifetime == 600);
	assert_true(cfg.remote.timeout > 0.1999 && cfg.remote.timeout < 0.2001);
	assert_true(cfg.high_wm == 1.0 && cfg.low_wm == 0.9);
	assert_int_equal(cfg.max_clients, 1024);
	assert_int_equal(cfg.disk.qd, 64);
	assert_true(cfg.prefault && cfg.dir && cfg.keep && cfg.gpu);
	entry("high-watermark", val, sizeof(val), src, sizeof(src));
	assert_string_equal(val, "100");
	assert_string_equal(src, "default");
	entry("remote-timeout", val, sizeof(val), src, sizeof(src));
	assert_string_equal(val, "200");
	assert_int_equal(parse("--disk=/tmp/kvbt-disk", "--disk-size=1G", END), 0);
	assert_true(cfg.high_wm == 0.9 && cfg.low_wm == 0.8);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_options_cases_cover_table),
		cmocka_unit_test(test_options_command_line),
		cmocka_unit_test(test_options_bad_values),
		cmocka_unit_test(test_options_config_file),
		cmocka_unit_test(test_options_help),
		cmocka_unit_test(test_options_file_rules),
		cmocka_unit_test(test_options_defaults),
	};

	return cmocka_run_group_tests(tests, setup, teardown);
}
