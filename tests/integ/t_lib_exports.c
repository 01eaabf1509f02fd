// SPDX-License-Identifier: MIT
/*
 * t_lib_exports.c - libkvbroker exports exactly the API of include/kvbroker.h, in both forms:
 * libkvbroker.so's dynamic symbols (its version script, client/libkvbroker.map) and the
 * objects of libkvbroker.a (-fvisibility=hidden, client/api.h), whose other globals (proto's
 * kvb_msg_*, kvb_layout_* ..., client's kvbc_*) must be hidden, so that an engine linking the
 * archive into its own shared object exports nothing of ours but the API. Every function the
 * header declares is exported by both, and the version script names the same set. Reads the
 * build with readelf (binutils); skips (77) without it.
 */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#define MAXN 256

struct names {
	char *v[MAXN];
	int n;
};

static void add(struct names *s, const char *p, size_t len)
{
	for (int i = 0; i < s->n; i++)
		if (strlen(s->v[i]) == len && !strncmp(s->v[i], p, len))
			return;
	CHECK(s->n < MAXN);
	s->v[s->n++] = strndup(p, len);
}

static void drop(struct names *s)
{
	while (s->n)
		free(s->v[--s->n]);
}

static int has(const struct names *s, const char *name)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->v[i], name))
			return 1;
	return 0;
}

static char *slurp(const char *path)
{
	FILE *f = fopen(path, "r");
	char *buf;
	long n;

	if (!f)
		harness_fail(__FILE__, __LINE__, "%s: cannot open (run from the repository root)",
			     path);
	fseek(f, 0, SEEK_END);
	n = ftell(f);
	rewind(f);
	buf = calloc(1, (size_t)n + 1);
	CHECK(buf && fread(buf, 1, (size_t)n, f) == (size_t)n);
	fclose(f);
	return buf;
}

/* The functions include/kvbroker.h declares: "kvb_x(" outside comments and #define lines. */
static void header_api(struct names *api)
{
	char *h = slurp("include/kvbroker.h"), *p = h;

	while (*p) {
		if (p[0] == '/' && p[1] == '*') {
			char *e = strstr(p + 2, "*/");

			p = e ? e + 2 : p + strlen(p);
		} else if (p[0] == '#' && (p == h || p[-1] == '\n')) {
			while (*p && !(*p == '\n' && p[-1] != '\\'))
				p++;
		} else if (!strncmp(p, "kvb_", 4) &&
			   (p == h || !(isalnum(p[-1]) || p[-1] == '_'))) {
			char *e = p;

			while (isalnum(*e) || *e == '_')
				e++;
			if (*e == '(')
				add(api, p, (size_t)(e - p));
			p = e;
		} else {
			p++;
		}
	}
	free(h);
}

/* The global names the version script exports. */
static void map_names(struct names *m)
{
	char *t = slurp("client/libkvbroker.map"), *p = t;

	while ((p = strstr(p, "kvb_"))) {
		char *e = p;

		while (isalnum(*e) || *e == '_')
			e++;
		if (*e == ';')
			add(m, p, (size_t)(e - p));
		p = e;
	}
	free(t);
}

/*
 * Defined global symbols of a file by readelf; dyn: the dynamic table. Returns how many are
 * DEFAULT-visible ones outside api; each is printed. Fills *vis with the DEFAULT ones.
 */
static int exported(const char *path, int dyn, const struct names *api, struct names *vis)
{
	char cmd[1200], line[512];
	FILE *f;
	int bad = 0;

	snprintf(cmd, sizeof(cmd), "readelf -sW %s '%s'", dyn ? "--dyn-syms" : "", path);
	f = popen(cmd, "r");
	CHECK(f);
	while (fgets(line, sizeof(line), f)) {
		char bind[32], type[32], vis_[32], ndx[32], name[256];
		unsigned num;

		if (sscanf(line, " %u: %*s %*s %31s %31s %31s %31s %255s", &num, type, bind, vis_,
			   ndx, name) != 6)
			continue;
		if ((strcmp(bind, "GLOBAL") && strcmp(bind, "WEAK")) || !strcmp(ndx, "UND") ||
		    strcmp(vis_, "DEFAULT"))
			continue;
		name[strcspn(name, "@")] = '\0';
		if (!strcmp(ndx, "ABS") && !strncmp(name, "KVBROKER_", 9))
			continue; /* the version nodes of the .so */
		if (!has(api, name)) {
			printf("%s exports %s, which include/kvbroker.h does not declare\n", path,
			       name);
			bad++;
		}
		add(vis, name, strlen(name));
	}
	CHECK(pclose(f) == 0);
	return bad;
}

int main(int argc, char **argv)
{
	struct names api = {0}, map = {0}, so = {0}, ar = {0};
	char bin[1024], lib[1100];
	int bad = 0;

	harness_init(argc, argv);
	if (system("readelf --version >/dev/null 2>&1"))
		harness_skip("readelf (binutils) not found");
	header_api(&api);
	map_names(&map);
	CHECK(api.n >= 30); /* the parse found the API */
	harness_bin_path("kvbrokerd", bin, sizeof(bin));
	/* BUILD/bin/kvbrokerd -> BUILD/lib/ */
	*strrchr(bin, '/') = '\0';
	*strrchr(bin, '/') = '\0';
	snprintf(lib, sizeof(lib), "%s/lib/libkvbroker.so", bin);
	bad += exported(lib, 1, &api, &so);
	snprintf(lib, sizeof(lib), "%s/lib/libkvbroker.a", bin);
	bad += exported(lib, 0, &api, &ar);
	for (int i = 0; i < api.n; i++) {
		if (!has(&so, api.v[i]))
			printf("libkvbroker.so does not export %s\n", api.v[i]), bad++;
		if (!has(&ar, api.v[i]))
			printf("libkvbroker.a does not define %s visibly\n", api.v[i]), bad++;
		if (!has(&map, api.v[i]))
			printf("client/libkvbroker.map does not name %s\n", api.v[i]), bad++;
	}
	for (int i = 0; i < map.n; i++)
		if (!has(&api, map.v[i]))
			printf("client/libkvbroker.map names %s, not in the header\n", map.v[i]),
				bad++;
	printf("# API %d functions; .so exports %d, .a %d visible; %d problems\n", api.n, so.n,
	       ar.n, bad);
	drop(&api);
	drop(&map);
	drop(&so);
	drop(&ar);
	return bad ? 1 : 0;
}
