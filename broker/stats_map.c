// SPDX-License-Identifier: MIT
/*
 * stats_map.c - the "map" member of the STATS document: each arena of the pool as a row of at
 * most MAP_CELLS cells, for `kvbctl map`.
 *
 * A cell is a fixed share of one arena: slabs_per_cell consecutive slabs (one slab per cell
 * while an arena has at most MAP_CELLS slabs). For each cell the document gives the slot bytes
 * in use, the slot bytes of pinned pages (leased or with a copy in flight) and of pages being
 * written (in flight), so a cell reads as free, used, leased or in flight. The figures come
 * from per-slab counters the store keeps up to date (struct slab.used/pinned/writing), so
 * building the map walks the slabs once (at most 4096, STORE_SLOT_BITS) and never a page
 * record: cheap enough for `kvbctl top`'s once-a-second STATS. Loop thread.
 */
#include <cjson/cJSON.h>

#include "broker.h"

#define MAP_CELLS 256 /* cells per arena at most: four rows of a 64-column map */

static cJSON *bytes_array(const uint64_t *v, uint32_t n)
{
	cJSON *a = cJSON_CreateArray();

	for (uint32_t i = 0; a && i < n; i++)
		cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
	return a;
}

static cJSON *arena_map(const struct broker *b, uint32_t arena)
{
	static uint64_t used[MAP_CELLS], pinned[MAP_CELLS], writing[MAP_CELLS];
	const struct store *st = &b->store;
	uint64_t size = b->pool.arena[arena].size, unit = st->slab_bytes, cell;
	uint32_t per, ncells, nslabs = 0;
	cJSON *o = cJSON_CreateObject();

	/* Cells are ranges of the arena, a whole number of --slab units each; slabs differ in
	 * size (store.c [packing]), so each is counted in the cell its first byte is in. */
	per = (uint32_t)((size / unit + MAP_CELLS - 1) / MAP_CELLS);
	if (!per)
		per = 1;
	cell = (uint64_t)per * unit;
	ncells = (uint32_t)((size + cell - 1) / cell);
	if (ncells > MAP_CELLS)
		ncells = MAP_CELLS;
	for (uint32_t c = 0; c < ncells; c++)
		used[c] = pinned[c] = writing[c] = 0;
	for (uint32_t i = 0; i < st->nslabs; i++) {
		const struct slab *sl = &st->slabs[i];
		uint64_t slot, c;

		if (sl->cls < 0 || sl->arena != arena)
			continue;
		nslabs++;
		slot = st->cls[sl->cls].slot_bytes;
		c = sl->off / cell < ncells ? sl->off / cell : ncells - 1;
		used[c] += (uint64_t)sl->used * slot;
		pinned[c] += (uint64_t)sl->pinned * slot;
		writing[c] += (uint64_t)sl->writing * slot;
	}
	cJSON_AddNumberToObject(o, "arena", arena);
	cJSON_AddNumberToObject(o, "node", b->pool.arena[arena].node);
	cJSON_AddNumberToObject(o, "slab_bytes", (double)st->slab_bytes);
	cJSON_AddNumberToObject(o, "slabs", (double)(size / unit));
	cJSON_AddNumberToObject(o, "slabs_in_use", nslabs);
	cJSON_AddNumberToObject(o, "slabs_per_cell", per);
	cJSON_AddNumberToObject(o, "cell_bytes", (double)cell);
	cJSON_AddItemToObject(o, "used", bytes_array(used, ncells));
	cJSON_AddItemToObject(o, "pinned", bytes_array(pinned, ncells));
	cJSON_AddItemToObject(o, "writing", bytes_array(writing, ncells));
	return o;
}

cJSON *stats_map_json(const struct broker *b, int part)
{
	cJSON *arr = cJSON_CreateArray();

	for (uint32_t a = 0; arr && a < b->pool.narenas; a++)
		if (part < 0 || b->pool.arena[a].part == (uint32_t)part)
			cJSON_AddItemToArray(arr, arena_map(b, a));
	return arr;
}
