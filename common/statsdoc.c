// SPDX-License-Identifier: MIT
/*
 * statsdoc.c - typed access to the STATS document and the per-node figures kvbctl and the
 * metrics generator both show. See statsdoc.h. Pure functions, any thread.
 */
#include <string.h>

#include "statsdoc.h"
#include "text.h"

void sdoc_printable(cJSON *o)
{
	for (cJSON *c = o ? o->child : NULL; c; c = c->next) {
		if (c->string)
			text_printable(c->string);
		if (cJSON_IsString(c) && c->valuestring)
			text_printable(c->valuestring);
		sdoc_printable(c);
	}
}

double sdoc_num(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsNumber(v) ? v->valuedouble : 0.0;
}

int sdoc_has(const cJSON *o, const char *name)
{
	return cJSON_IsNumber(cJSON_GetObjectItemCaseSensitive(o, name));
}

const char *sdoc_str(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsString(v) && v->valuestring ? v->valuestring : "";
}

const cJSON *sdoc_arr(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsArray(v) ? v : NULL;
}

const cJSON *sdoc_obj(const cJSON *o, const char *name)
{
	const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, name);

	return cJSON_IsObject(v) ? v : NULL;
}

const cJSON *sdoc_disk(const cJSON *root)
{
	const cJSON *d = sdoc_obj(root, "disk");
	const char *st = sdoc_str(d, "state");

	return d && *st && strcmp(st, "off") ? d : NULL;
}

const cJSON *sdoc_remote(const cJSON *root)
{
	const cJSON *d = sdoc_obj(root, "remote");
	const char *st = sdoc_str(d, "state");

	return d && *st && strcmp(st, "off") ? d : NULL;
}

int sdoc_nodes(const cJSON *root, struct sdoc_node *out, int max)
{
	const cJSON *pool = sdoc_obj(root, "pool"), *a;
	int n = 0;

	cJSON_ArrayForEach(a, sdoc_arr(pool, "arenas"))
	{
		int nd = (int)sdoc_num(a, "node"), i = 0;

		while (i < n && out[i].node != nd)
			i++;
		if (i == n) {
			if (n == max)
				continue;
			out[n++] = (struct sdoc_node){.node = nd,
						      .page_size = sdoc_str(a, "page_size")};
		}
		out[i].arenas++;
		out[i].total += sdoc_num(a, "bytes_total");
		out[i].used += sdoc_num(a, "bytes_used");
	}
	if (!n && max > 0 && sdoc_has(pool, "bytes_total"))
		out[n++] = (struct sdoc_node){.node = -1,
					      .arenas = 1,
					      .total = sdoc_num(pool, "bytes_total"),
					      .used = sdoc_num(pool, "bytes_used"),
					      .page_size = ""};
	return n;
}
