// SPDX-License-Identifier: MIT
/*
 * stats_clients.c - who uses the pool, for kvbctl clients/ns/top: each client's counters and
 * namespaces, each namespace's clients, and the bytes dedup saved. Parts of the STATS document
 * (stats.c) and docs/protocol.md §7.
 *
 * Per-client counters are credited by the request engine when each op completes (ops.c
 * op_account), whichever way it completed. Loop thread only.
 */
#include <cjson/cJSON.h>
#include <string.h>

#include "broker.h"

/*
 * The next namespace id >= from that session s opened, or STORE_MAX_NS. Skips empty bytes of
 * the bitmap, so walking a client's namespaces costs its 128 bytes plus one step per id.
 */
static uint32_t next_opened(const struct session *s, uint32_t from)
{
	for (uint32_t ns = from; ns < STORE_MAX_NS; ns++) {
		if (!(ns % 8) && !s->ns_opened[ns / 8]) {
			ns += 7;
			continue;
		}
		if (s->ns_opened[ns / 8] & (1u << (ns % 8)))
			return ns;
	}
	return STORE_MAX_NS;
}

#define for_each_opened(ns, s)                                                                     \
	for (ns = next_opened(s, 0); ns < STORE_MAX_NS; ns = next_opened(s, ns + 1))

void stats_ns_clients(const struct broker *b, uint32_t count[STORE_MAX_NS])
{
	struct list *pos;
	uint32_t ns;

	memset(count, 0, STORE_MAX_NS * sizeof(count[0]));
	list_for_each (pos, &b->sessions) {
		const struct session *s = list_entry(pos, struct session, link);

		for_each_opened(ns, s)
		{
			count[ns]++;
		}
	}
}

uint64_t stats_dedup_bytes(const struct broker *b)
{
	uint64_t saved = b->nst.dedup_bytes_freed;

	for (uint32_t i = 0; i < b->nst.count; i++)
		if (b->nst.ns[i])
			saved += b->nst.ns[i]->c.dedup * b->nst.ns[i]->page_bytes;
	return saved;
}

void stats_client_json(struct cJSON *o, const struct session *s)
{
	cJSON *ids = cJSON_AddArrayToObject(o, "ns");
	uint32_t ns;

	for_each_opened(ns, s)
	{
		cJSON_AddItemToArray(ids, cJSON_CreateNumber(ns));
	}
	cJSON_AddNumberToObject(o, "puts", (double)s->c.puts);
	cJSON_AddNumberToObject(o, "gets", (double)s->c.gets);
	cJSON_AddNumberToObject(o, "hits", (double)s->c.hits);
	cJSON_AddNumberToObject(o, "misses", (double)s->c.misses);
	cJSON_AddNumberToObject(o, "dedup", (double)s->c.dedup);
	cJSON_AddNumberToObject(o, "errors", (double)s->c.errors);
	cJSON_AddNumberToObject(o, "bytes_in", (double)s->c.bytes_in);
	cJSON_AddNumberToObject(o, "bytes_out", (double)s->c.bytes_out);
}
