// SPDX-License-Identifier: MIT
/*
 * t_odd_bytes.c - bytes a client chose (its name, a model name) reach operators only in safe
 * form. Regressions: the STATS JSON carried raw non-UTF-8 bytes of model names (Python's
 * json.load refused the whole document), and kvbctl ns printed newlines and ESC sequences from
 * model names straight to the terminal (a forged table row, a cleared screen).
 *
 * A client named "evil\x1b[31m\xff" opens a namespace whose model holds invalid UTF-8 (\xff,
 * a cut sequence, a surrogate), ESC [2J, a newline, DEL, a C1 CSI (\xc2\x9b) and valid é's, one
 * where the table's model column ends.
 * Checked: the stats document, from the library and from `kvbctl status --json`, is valid
 * UTF-8 by glibc's own decoder (mbrtowc in C.UTF-8, not our validator) and parses; the model
 * keeps é and carries U+FFFD for the bad bytes; `kvbctl ns`, `clients` and `status` print valid
 * UTF-8 with no control character but newline, no DEL, no C1, and exactly one ns row.
 */
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <wchar.h>

#include <cjson/cJSON.h>

#include "harness.h"

/* The bad bytes become 7 U+FFFD (21 bytes with the bars), so the table's 24-byte model column
 * ends inside the é after "ab": kvbctl must cut at a character boundary. */
#define MODEL                                                                                      \
	"m\xff\xe6\x97|\xed\xa0\x80|ab\xc3\xa9\x1b[2J\nrow\x7f\xc2\x9b"                            \
	"1m|caf\xc3\xa9"

/* 0 when s is valid UTF-8 by glibc; else the offset of the first bad byte, plus one. */
static size_t bad_utf8(const char *s)
{
	mbstate_t st;
	size_t i = 0, n = strlen(s);

	memset(&st, 0, sizeof(st));
	while (i < n) {
		wchar_t wc;
		size_t k = mbrtowc(&wc, s + i, n - i, &st);

		if (k == (size_t)-1 || k == (size_t)-2 || k == 0)
			return i + 1;
		i += k;
	}
	return 0;
}

/* Fails unless out is valid UTF-8 and holds no control character but '\n' (C0, DEL, C1). */
static void check_terminal_safe(const char *what, const char *out)
{
	size_t bad = bad_utf8(out);

	CHECKF(!bad, "%s: invalid UTF-8 at byte %zu of: %s", what, bad - 1, out);
	for (const unsigned char *p = (const unsigned char *)out; *p; p++) {
		CHECKF(*p >= 0x20 || *p == '\n', "%s: control byte 0x%02x at %zu", what, *p,
		       (size_t)(p - (const unsigned char *)out));
		CHECKF(*p != 0x7f, "%s: DEL at %zu", what,
		       (size_t)(p - (const unsigned char *)out));
		CHECKF(!(p[0] == 0xc2 && p[1] >= 0x80 && p[1] < 0xa0), "%s: C1 control at %zu",
		       what, (size_t)(p - (const unsigned char *)out));
	}
}

static char *kvbctl(const struct harness_broker *b, const char *cmd)
{
	char args[200], *out;
	int rc;

	snprintf(args, sizeof(args), "--socket %s %s", b->sock, cmd);
	rc = harness_run_tool("kvbctl", args, &out);
	CHECKF(rc == 0, "kvbctl %s: exit %d: %s", cmd, rc, out);
	return out;
}

static void check_doc(const char *what, const char *json)
{
	const cJSON *nss, *ns, *model;
	cJSON *root;
	size_t bad = bad_utf8(json);

	CHECKF(!bad, "%s: stats JSON is not UTF-8 at byte %zu", what, bad - 1);
	root = cJSON_Parse(json);
	CHECKF(root != NULL, "%s: stats JSON does not parse", what);
	nss = cJSON_GetObjectItemCaseSensitive(root, "namespaces");
	ns = cJSON_GetArrayItem(nss, 0);
	model = cJSON_GetObjectItemCaseSensitive(ns, "model");
	CHECK(cJSON_IsString(model));
	CHECKF(strstr(model->valuestring, "caf\xc3\xa9") &&
		       strstr(model->valuestring, "\xef\xbf\xbd"),
	       "%s: model %s", what, model->valuestring);
	cJSON_Delete(root);
}

int main(int argc, char **argv)
{
	struct harness_broker *b;
	struct kvb_opts o = {0};
	struct kvb_layout l;
	kvb_client *c;
	uint32_t ns;
	char *json, *out, *p;
	int rows = 0;

	harness_init(argc, argv);
	if (!setlocale(LC_CTYPE, "C.UTF-8"))
		harness_skip("no C.UTF-8 locale for glibc's UTF-8 decoder");
	b = harness_broker_start("--pool", "64M");
	o.socket_path = b->sock;
	o.name = "evil\x1b[31m\xff";
	CHECK_OK(kvb_connect(&o, &c));
	harness_layout(&l, MODEL, KVB_LAYOUT_MLA, 16, 1, 0, 2, 256);
	CHECK_OK(kvb_ns_open(c, &l, &ns, NULL));

	json = harness_stats(c);
	check_doc("kvb_stats_json", json);
	free(json);
	out = kvbctl(b, "status --json");
	check_doc("kvbctl status --json", out);
	free(out);

	out = kvbctl(b, "ns");
	check_terminal_safe("kvbctl ns", out);
	CHECKF(strstr(out, "m\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd|") != NULL, "kvbctl ns: %s", out);
	for (p = out; (p = strchr(p, '\n')); p++)
		rows++;
	CHECKF(rows == 2, "kvbctl ns printed %d lines (a header and one row): %s", rows, out);
	free(out);
	out = kvbctl(b, "clients");
	check_terminal_safe("kvbctl clients", out);
	CHECKF(strstr(out, "evil?[31m\xef\xbf\xbd") != NULL, "kvbctl clients: %s", out);
	free(out);
	out = kvbctl(b, "status");
	check_terminal_safe("kvbctl status", out);
	free(out);
	kvb_close(c);
	harness_broker_stop(b);
	return H_PASS;
}
