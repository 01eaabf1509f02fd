// SPDX-License-Identifier: MIT
/*
 * pagehdr.c - the pool's side table, the record that lets a RAM pool outlive its broker.
 *
 * Why a side table and not a header in front of each page: clients map the arenas and read
 * pages at the offsets the broker gives them, views gather and scatter whole 4 KiB-aligned
 * slots, and the disk tier writes slots with O_DIRECT; a header inside the slot would shift
 * every page off its alignment or cost a whole 4 KiB block per page. So the headers live in a
 * memfd of their own, which only brokers ever map (it is never sent to a client, so a client
 * cannot forge one), and the arenas stay exactly what clients see.
 *
 * Layout (fields little-endian, as the host):
 *
 *     offset 0          struct pmeta_super (in a 4 KiB block): geometry of every arena, the
 *                       slab size, where the other parts start, a random pool id, crc32c
 *     ns_off            PMETA_NS_MAX struct pmeta_ns: namespace id -> tenant, layout, identity
 *     hdr_off           per slab (store order: arena by arena, slab by slab), slab_bytes / 4096
 *                       struct pmeta_hdr of 64 bytes, one per possible slot; the header of
 *                       slot j of slab k is entry k * (slab_bytes / 4096) + j
 *
 * Only the first slab_bytes / slot_bytes entries of a slab are ever written, and tmpfs
 * allocates a page of the side table only when it is first written: the table costs 64 bytes
 * per page slot in use (rounded up to 4 KiB per slab), 1/64 of the pool at worst (a pool of
 * 4 KiB pages), 1/1024 of it for 64 KiB pages.
 *
 * Commit order (store.c): a PUT fills its slot while the page is WRITING and its header is
 * zero; at commit, when every byte of the page is there, the broker computes the crc32c of the
 * slot and writes the header (hdr_crc last); when a slot is freed (evicted, deleted, aborted) its
 * header is cleared before the slot can be handed out again. What a broker that dies (SIGKILL,
 * a crash; the memory itself survives, it is the kernel's) can leave:
 *   - a page being written: no header (its slot was free, so its header was cleared): not
 *     adopted, its slot is free again;
 *   - a header half written: hdr_crc fails: cleared;
 *   - a header that vouches for other bytes than the slot holds (a slot freed and rewritten
 *     with the clear lost, or bytes changed behind the broker's back): the payload crc fails:
 *     cleared and counted torn.
 * So an adopted page is one whose header and bytes both check, and a page that was being written
 * when the broker died is never served afterwards. Adoption (adopt.c) then rebuilds the index
 * from what is left: the newest generation of each (namespace, key) wins.
 *
 * A kernel crash or a power cut loses the RAM itself: only the disk tier survives those. The
 * table is touched by the loop thread (commit, free) and, before the loop runs, by the adoption
 * threads (pmeta_scan), each on its own slabs.
 */
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include "pagehdr.h"
#include "slot.h"

static_assert(sizeof(struct pmeta_super) <= PHDR_UNIT, "superblock fits its block");

#define SCAN_MAX_THREADS 16u

uint64_t pmeta_size(uint64_t nslabs, uint64_t slab_bytes)
{
	uint64_t ns = (PMETA_NS_MAX * sizeof(struct pmeta_ns) + PHDR_UNIT - 1) & ~(uint64_t)4095;

	return PHDR_UNIT + ns + nslabs * (slab_bytes / PHDR_UNIT) * sizeof(struct pmeta_hdr);
}

void pmeta_super_init(void *meta, uint64_t size)
{
	struct pmeta_super *sb = meta;

	sb->magic = PMETA_MAGIC;
	sb->version = PMETA_VERSION;
	sb->ns_off = PHDR_UNIT;
	sb->hdr_off = PHDR_UNIT + ((PMETA_NS_MAX * sizeof(struct pmeta_ns) + PHDR_UNIT - 1) &
				   ~(uint64_t)(PHDR_UNIT - 1));
	sb->size = size;
	sb->created = (uint64_t)time(NULL);
	if (getrandom(sb->pool_id, sizeof(sb->pool_id), 0) != (ssize_t)sizeof(sb->pool_id))
		memcpy(sb->pool_id, &sb->created, sizeof(sb->created));
	sb->crc = slot_crc32c(sb, offsetof(struct pmeta_super, crc));
}

int pmeta_super_check(const void *meta, uint64_t size)
{
	const struct pmeta_super *sb = meta;
	uint64_t slabs = 0;

	if (size < PHDR_UNIT || sb->magic != PMETA_MAGIC || sb->version != PMETA_VERSION ||
	    sb->crc != slot_crc32c(sb, offsetof(struct pmeta_super, crc)) || sb->size != size ||
	    !sb->narenas || sb->narenas > KVB_MAX_ARENAS || !sb->slab_bytes ||
	    sb->slab_bytes % PHDR_UNIT)
		return -EINVAL;
	for (uint32_t i = 0; i < sb->narenas; i++)
		slabs += sb->arena[i].size / sb->slab_bytes;
	if (pmeta_size(slabs, sb->slab_bytes) != size)
		return -EINVAL;
	return 0;
}

void pmeta_ns_write(void *meta, uint32_t id, uint32_t tenant, uint64_t page_bytes,
		    const uint8_t ident[32], const struct kvb_layout *l,
		    const struct kvb_ns_ident *idf)
{
	const struct pmeta_super *sb = meta;
	struct pmeta_ns *r = (struct pmeta_ns *)((char *)meta + sb->ns_off) + id, n;

	if (id >= PMETA_NS_MAX)
		return;
	memset(&n, 0, sizeof(n));
	n.magic = PHDR_MAGIC;
	n.tenant = tenant;
	n.page_bytes = page_bytes;
	memcpy(n.ident, ident, sizeof(n.ident));
	n.layout = *l;
	n.idf = *idf;
	n.crc = slot_crc32c(&n, offsetof(struct pmeta_ns, crc));
	*r = n;
}

const struct pmeta_ns *pmeta_ns_get(const void *meta, uint32_t id)
{
	const struct pmeta_super *sb = meta;
	const struct pmeta_ns *r;

	if (id >= PMETA_NS_MAX)
		return NULL;
	r = (const struct pmeta_ns *)((const char *)meta + sb->ns_off) + id;
	if (r->magic != PHDR_MAGIC || r->crc != slot_crc32c(r, offsetof(struct pmeta_ns, crc)))
		return NULL;
	return r;
}

void pmeta_hdr_seal(struct pmeta_hdr *h, const void *page)
{
	h->magic = PHDR_MAGIC;
	h->resv0 = 0;
	h->crc = slot_crc32c(page, h->len);
	h->hdr_crc = slot_crc32c(h, offsetof(struct pmeta_hdr, hdr_crc));
}

struct scan_job {
	pthread_t tid;
	void *meta;
	uint64_t first, end; /* slabs [first, end) */
	const void *(*slab_base)(void *, uint64_t);
	void *arg;
	uint32_t *cls_bytes;
	uint64_t kept, torn;
};

/* Whether h, in its own right, can be a committed page of a slab of slab_bytes. */
static int hdr_sane(const void *meta, const struct pmeta_hdr *h, uint32_t slot,
		    uint64_t slab_bytes)
{
	if (h->magic != PHDR_MAGIC || h->hdr_crc != slot_crc32c(h, offsetof(struct pmeta_hdr,
									      hdr_crc)))
		return 0;
	if (!h->slot_bytes || h->slot_bytes % PHDR_UNIT || h->slot_bytes > slab_bytes ||
	    h->len != h->slot_bytes || (uint64_t)(slot + 1) * h->slot_bytes > slab_bytes)
		return 0;
	return pmeta_ns_get(meta, h->ns) != NULL;
}

static void *scan_thread(void *arg)
{
	struct scan_job *j = arg;
	const struct pmeta_super *sb = j->meta;
	uint32_t per = (uint32_t)(sb->slab_bytes / PHDR_UNIT);

	for (uint64_t k = j->first; k < j->end; k++) {
		const char *base = j->slab_base(j->arg, k);
		uint32_t cls = 0;

		for (uint32_t i = 0; i < per; i++) {
			struct pmeta_hdr *h = pmeta_hdr_at(j->meta, k, i, sb->slab_bytes);

			if (!h->magic)
				continue;
			/* The first sane header names the slab's class; a disagreeing one is
			 * from an earlier life of the slab whose clear was lost. */
			if (!hdr_sane(j->meta, h, i, sb->slab_bytes) ||
			    (cls && h->slot_bytes != cls)) {
				memset(h, 0, sizeof(*h));
				continue;
			}
			if (slot_crc32c(base + (uint64_t)i * h->slot_bytes, h->len) != h->crc) {
				memset(h, 0, sizeof(*h));
				j->torn++;
				continue;
			}
			cls = h->slot_bytes;
			j->kept++;
		}
		j->cls_bytes[k] = cls;
	}
	return NULL;
}

uint64_t pmeta_scan(void *meta, uint64_t nslabs, const void *(*slab_base)(void *, uint64_t),
		    void *arg, uint32_t *cls_bytes, uint64_t *torn)
{
	struct scan_job jobs[SCAN_MAX_THREADS];
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	uint32_t n = cpus < 1 ? 1 : cpus > SCAN_MAX_THREADS ? SCAN_MAX_THREADS : (uint32_t)cpus;
	uint64_t kept = 0, per;

	if (n > nslabs)
		n = nslabs ? (uint32_t)nslabs : 1;
	per = (nslabs + n - 1) / n;
	*torn = 0;
	for (uint32_t i = 0; i < n; i++) {
		struct scan_job *j = &jobs[i];

		*j = (struct scan_job){.meta = meta,
				       .first = i * per < nslabs ? i * per : nslabs,
				       .slab_base = slab_base,
				       .arg = arg,
				       .cls_bytes = cls_bytes};
		j->end = j->first + per < nslabs ? j->first + per : nslabs;
		if (i == 0 || pthread_create(&j->tid, NULL, scan_thread, j)) {
			j->tid = 0; /* the first share runs here; so does one without a thread */
		}
	}
	for (uint32_t i = 0; i < n; i++)
		if (!jobs[i].tid)
			scan_thread(&jobs[i]);
	for (uint32_t i = 0; i < n; i++) {
		if (jobs[i].tid)
			pthread_join(jobs[i].tid, NULL);
		kept += jobs[i].kept;
		*torn += jobs[i].torn;
	}
	return kept;
}
