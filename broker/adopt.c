// SPDX-License-Identifier: MIT
/*
 * adopt.c - a broker takes over the RAM pool of a broker that died or handed it over: its
 * namespaces and its index are rebuilt from the pool's side table (pagehdr.c), before the
 * socket listens.
 *
 * In order: the namespace table is re-opened record by record (ids stay what clients of the
 * old broker were given, unless a record is damaged: then the headers that name a moved id are
 * rewritten); every slot header is checked against its slot's bytes, in parallel over the
 * slabs (pmeta_scan: crc32c at memory speed on every core), and what does not check is
 * cleared; the pages left are installed, oldest generation first, so that the LRU comes back in
 * the order of the pages' writes (a key written twice keeps its newest copy). Start-up thread,
 * before the loop runs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "broker.h"
#include "log.h"
#include "pagehdr.h"
#include "slot.h"

struct adopt_ent {
	uint64_t gen;
	uint32_t slab, slot;
};

static int ent_cmp(const void *a, const void *b)
{
	const struct adopt_ent *x = a, *y = b;

	return x->gen < y->gen ? -1 : x->gen > y->gen;
}

static const void *slab_base(void *arg, uint64_t k)
{
	const struct store *s = arg;
	const struct slab *sl = &s->slabs[k];

	return (const char *)s->pool->arena[sl->arena].base + sl->off;
}

/* Re-opens the side table's namespaces; map[old id] = new id, or UINT32_MAX when lost. */
static void adopt_namespaces(struct broker *b, uint32_t *map)
{
	for (uint32_t id = 0; id < PMETA_NS_MAX; id++) {
		const struct pmeta_ns *r = pmeta_ns_get(b->pool.meta, id);
		struct pmeta_ns rec;
		struct ns *n;
		int err;

		map[id] = UINT32_MAX;
		if (!r)
			continue;
		rec = *r; /* ns_open2 rewrites the table */
		err = ns_open2(&b->nst, &b->store, &rec.layout, &rec.idf, rec.tenant, &n);
		if (!err && memcmp(n->ident, rec.ident, sizeof(rec.ident)))
			err = -EBADMSG;
		if (err) {
			log_warn("adopt: namespace %u (%s): %s: its pages are dropped", id,
				 rec.layout.model, strerror(-err));
			continue;
		}
		map[id] = n->id;
	}
}

int adopt_pool(struct broker *b)
{
	struct store *s = &b->store;
	uint64_t kept, torn = 0, n = 0, installed = 0, dup = 0, bytes = 0;
	uint32_t *map = calloc(PMETA_NS_MAX, sizeof(*map));
	uint32_t *cls = calloc(s->nslabs, sizeof(*cls));
	struct adopt_ent *ents = NULL;
	double t = clock_now(), scan_s;
	int err = -ENOMEM;

	if (!map || !cls)
		goto out;
	adopt_namespaces(b, map);
	kept = pmeta_scan(b->pool.meta, s->nslabs, slab_base, s, cls, &torn);
	scan_s = clock_now() - t;
	ents = malloc((kept ? kept : 1) * sizeof(*ents));
	if (!ents)
		goto out;
	for (uint32_t k = 0; k < s->nslabs; k++) {
		for (uint32_t j = 0; cls[k] && j < s->slab_bytes / cls[k] && n < kept; j++) {
			const struct pmeta_hdr *h = pmeta_hdr_at(b->pool.meta, k, j, s->slab_bytes);

			if (h->magic == PHDR_MAGIC)
				ents[n++] = (struct adopt_ent){h->gen, k, j};
		}
	}
	qsort(ents, n, sizeof(*ents), ent_cmp);
	for (uint64_t i = 0; i < n; i++) {
		struct pmeta_hdr *h = pmeta_hdr_at(b->pool.meta, ents[i].slab, ents[i].slot,
						   s->slab_bytes);
		uint32_t nsid = map[h->ns];
		struct ns *ns = nsid == UINT32_MAX ? NULL : ns_get(&b->nst, nsid);
		struct page *old;

		if (!ns || s->cls[ns->cls].slot_bytes != h->slot_bytes) {
			memset(h, 0, sizeof(*h));
			continue;
		}
		old = store_find(s, nsid, &h->key);
		if (old) { /* an older copy of the key: the newer wins */
			bytes -= s->cls[old->cls].slot_bytes;
			store_drop(s, old);
			dup++;
			installed--;
		}
		if (store_adopt_page(s, ents[i].slab, ns->cls, ents[i].slot, nsid, &h->key,
				     (uint32_t)h->gen)) {
			memset(h, 0, sizeof(*h));
			continue;
		}
		if (h->ns != nsid) { /* the namespace moved: the header follows it */
			h->ns = (uint16_t)nsid;
			h->hdr_crc = slot_crc32c(h, offsetof(struct pmeta_hdr, hdr_crc));
		}
		installed++;
		bytes += h->slot_bytes;
	}
	store_adopt_done(s);
	b->startup.adopt_s = clock_now() - t;
	b->startup.adopted_pages = installed;
	b->startup.adopt_torn = torn;
	log_info("adopt: %llu pages (%llu MiB) in %u namespace(s) in %.3f s (header and crc scan of "
		 "%llu MiB in %.3f s, %.2f GiB/s); %llu torn or unfinished pages discarded, %llu "
		 "older copies",
		 (unsigned long long)installed, (unsigned long long)(bytes >> 20), b->nst.count,
		 b->startup.adopt_s, (unsigned long long)(b->pool.total >> 20), scan_s,
		 (double)bytes / (1 << 30) / (scan_s + 1e-9), (unsigned long long)torn,
		 (unsigned long long)dup);
	err = 0;
out:
	free(ents);
	free(cls);
	free(map);
	return err;
}
