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

#include "orphan.h"
#include "broker.h"
#include "log.h"
#include "pagehdr.h"
#include "slot.h"
#include "tenant.h"

struct adopt_ent {
	uint64_t gen;
	uint32_t slab, slot;
	uint64_t unit;
};

static int ent_cmp(const void *a, const void *b)
{
	const struct adopt_ent *x = a, *y = b;

	return x->gen < y->gen ? -1 : x->gen > y->gen;
}

/* Re-opens the side table's namespaces; map[old id] = new id, or UINT32_MAX when lost. */
static void adopt_namespaces(struct broker *b, uint32_t *map, uint32_t *tenant)
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
		tenant[n->id] = rec.tenant;
	}
}

/*
 * Re-carves every slab the side table records, at its exact place (slabs vary in size: store.c's
 * extents); fills sl[] for the scan and sid[] with their record ids. Returns how many.
 */
static uint32_t adopt_slabs(struct broker *b, struct pmeta_scan_slab *sl, uint32_t *sid)
{
	struct store *s = &b->store;
	uint32_t n = 0;

	for (uint32_t k = 0; k < STORE_MAX_SLABS; k++) {
		const struct pmeta_slab *r = pmeta_slab_get(b->pool.meta, k);
		const struct pool_arena *a;
		int ci, err;

		if (!r) {
			pmeta_slab_clear(b->pool.meta, k); /* damaged or unused: no record */
			continue;
		}
		a = &b->pool.arena[r->arena];
		ci = store_class_get(s, r->slot_bytes);
		err = ci < 0 ? ci : store_adopt_slab(s, k, r->arena, r->off, r->len, ci);
		if (err) {
			log_warn("adopt: slab %u (arena %u at %llu MiB): %s: its pages are dropped",
				 k, r->arena, (unsigned long long)(r->off >> 20), strerror(-err));
			pmeta_slab_clear(b->pool.meta, k);
			continue;
		}
		sl[n] = (struct pmeta_scan_slab){.base = (const char *)a->base + r->off,
						 .unit = a->unit0 + r->off / PHDR_UNIT,
						 .slot_bytes = r->slot_bytes,
						 .nslots = (uint32_t)(r->len / r->slot_bytes)};
		sid[n++] = k;
	}
	return n;
}

/*
 * [tenant-part] Whose partition is whose comes back from the pages: a namespace's pages are all
 * in its tenant's partition, so the partition of its first page binds the tenant to it.
 */
static void adopt_tenant(struct broker *b, uint32_t nsid, uint32_t key, uint32_t part)
{
	struct tenant_table *tt = &b->tt;

	b->store.ns_part[nsid] = (uint8_t)part;
	if (tt->mode == TENANTS_NONE || part >= tt->n)
		return;
	if (!tt->t[part].used) {
		/* [tenant-lend] Idle from now: released after --tenant-idle unless it comes back. */
		tt->t[part] = (struct tenant){
			.key = key, .used = 1, .share = tt->t[part].share, .left_at = clock_now()};
	} else if (tt->t[part].key != key)
		log_warn("adopt: partition %u holds pages of tenant %u and %u", part,
			 tt->t[part].key, key);
}

int adopt_pool(struct broker *b)
{
	struct store *s = &b->store;
	uint64_t kept, torn = 0, n = 0, installed = 0, dup = 0, bytes = 0;
	uint32_t *map = calloc(PMETA_NS_MAX, sizeof(*map));
	uint32_t *tenant = calloc(STORE_MAX_NS, sizeof(*tenant));
	uint8_t *seen = calloc(STORE_MAX_NS, 1);
	struct pmeta_scan_slab *sl = calloc(STORE_MAX_SLABS, sizeof(*sl));
	uint32_t *sid = calloc(STORE_MAX_SLABS, sizeof(*sid)), nsl;
	struct adopt_ent *ents = NULL;
	double t = clock_now(), scan_s;
	int err = -ENOMEM;

	if (!map || !tenant || !seen || !sl || !sid)
		goto out;
	adopt_namespaces(b, map, tenant);
	nsl = adopt_slabs(b, sl, sid);
	kept = pmeta_scan(b->pool.meta, sl, nsl, &torn);
	scan_s = clock_now() - t;
	ents = malloc((kept ? kept : 1) * sizeof(*ents));
	if (!ents)
		goto out;
	for (uint32_t k = 0; k < nsl; k++) {
		uint64_t step = sl[k].slot_bytes / PHDR_UNIT;

		for (uint32_t j = 0; sl[k].kept && j < sl[k].nslots && n < kept; j++) {
			uint64_t u = sl[k].unit + j * step;
			const struct pmeta_hdr *h = pmeta_hdr_at(b->pool.meta, u);

			if (h->magic == PHDR_MAGIC)
				ents[n++] = (struct adopt_ent){h->gen, sid[k], j, u};
		}
	}
	qsort(ents, n, sizeof(*ents), ent_cmp);
	for (uint64_t i = 0; i < n; i++) {
		struct pmeta_hdr *h = pmeta_hdr_at(b->pool.meta, ents[i].unit);
		uint32_t nsid = map[h->ns], part;
		struct ns *ns = nsid == UINT32_MAX ? NULL : ns_get(&b->nst, nsid);
		struct page *old;

		if (!ns || s->cls[ns->cls].slot_bytes != h->slot_bytes) {
			memset(h, 0, sizeof(*h));
			continue;
		}
		part = b->pool.arena[s->slabs[ents[i].slab].arena].part;
		if (seen[nsid] && s->ns_part[nsid] != part) { /* one tenant, one partition */
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
		/* [orphans] Leased by a client of the broker before: pinned before an older or
		 * newer copy of its key can drop it (store_drop keeps a pinned page's slot). */
		orphan_adopted(b, &s->slabs[ents[i].slab].pages[ents[i].slot]);
		if (!seen[nsid]) {
			seen[nsid] = 1;
			adopt_tenant(b, nsid, tenant[nsid], part);
		}
		if (h->ns != nsid) { /* the namespace moved: the header follows it */
			h->ns = (uint16_t)nsid;
			h->hdr_crc = slot_crc32c(h, offsetof(struct pmeta_hdr, hdr_crc));
		}
		installed++;
		bytes += h->slot_bytes;
	}
	store_adopt_done(s);
	for (uint32_t id = 0; id < b->nst.count; id++) /* [ns-free] none of its pages came back */
		ns_release(&b->nst, s, id);
	b->startup.adopt_s = clock_now() - t;
	b->startup.adopted_pages = installed;
	b->startup.adopt_torn = torn;
	log_info("adopt: %llu pages (%llu MiB) in %u namespace(s), %u slab(s) in %.3f s (header "
		 "and crc scan of %llu MiB in %.3f s, %.2f GiB/s); %llu torn or unfinished pages "
		 "discarded, %llu older copies",
		 (unsigned long long)installed, (unsigned long long)(bytes >> 20), b->nst.live, nsl,
		 b->startup.adopt_s, (unsigned long long)(b->pool.total >> 20), scan_s,
		 (double)bytes / (1 << 30) / (scan_s + 1e-9), (unsigned long long)torn,
		 (unsigned long long)dup);
	err = 0;
out:
	free(ents);
	free(sid);
	free(sl);
	free(seen);
	free(tenant);
	free(map);
	return err;
}
