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
 *     slab_off          PMETA_SLABS_MAX struct pmeta_slab: slab record id -> arena, offset,
 *                       length, slot size (slabs vary in size and place: store.c's extents)
 *     hdr_off           one struct pmeta_hdr of 64 bytes per 4 KiB unit of the pool, arena by
 *                       arena: the header of a slot is the entry of the unit it starts at
 *                       (every slot is 4 KiB-aligned)
 *
 * Only the entries of slot starts are ever written, and tmpfs allocates a page of the side
 * table only when it is first written: the table costs 64 bytes per page slot in use (rounded
 * up to 4 KiB), 1/64 of the pool at worst (a pool of 4 KiB pages), 1/1024 of it for 64 KiB
 * pages.
 *
 * Commit order (store.c): a PUT fills its slot while the page is WRITING and its header is
 * zero; at commit, when every byte of the page is there, the broker writes the header with the
 * crc32c of the slot (hdr_crc last); when a slot is freed (evicted, deleted, aborted) its
 * header is cleared before the slot can be handed out again. The crc is computed before the
 * commit, never after it: by the copy loop itself from the bytes it stores (crccopy.c
 * [crc-fused]: an inline PUT, a filled PUT's chunks), by the worker that copied (copy.h
 * [crc-worker]), or from the copy's source (xfer.c [crc-src]). So a committed page is
 * adoptable from its commit on, and a crash loses none of them; sealing later, off the PUT's
 * critical path, was measured and not kept (a slot's crc read back from DRAM costs more than
 * the fused copy adds: docs/benchmarks.md). What a broker that dies (SIGKILL,
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

static uint64_t round_unit(uint64_t n)
{
	return (n + PHDR_UNIT - 1) & ~(uint64_t)(PHDR_UNIT - 1);
}

#define NS_BYTES round_unit(PMETA_NS_MAX * sizeof(struct pmeta_ns))
#define SLAB_BYTES round_unit(PMETA_SLABS_MAX * sizeof(struct pmeta_slab))

uint64_t pmeta_size(uint64_t units)
{
	return PHDR_UNIT + NS_BYTES + SLAB_BYTES + units * sizeof(struct pmeta_hdr);
}

void pmeta_super_init(void *meta, uint64_t size)
{
	struct pmeta_super *sb = meta;

	sb->magic = PMETA_MAGIC;
	/* [dir] Version 3 only where a directory needs it: a broker that knows only 2 can still
	 * take over a pool run --no-directory. */
	sb->version = PMETA_VERSION_NODIR;
	for (uint32_t i = 0; i < sb->narenas && i < PMETA_MAX_ARENAS; i++)
		if (sb->arena[i].dir_units)
			sb->version = PMETA_VERSION;
	sb->ns_off = PHDR_UNIT;
	sb->slab_off = PHDR_UNIT + NS_BYTES;
	sb->hdr_off = sb->slab_off + SLAB_BYTES;
	sb->size = size;
	sb->created = (uint64_t)time(NULL);
	if (getrandom(sb->pool_id, sizeof(sb->pool_id), 0) != (ssize_t)sizeof(sb->pool_id))
		memcpy(sb->pool_id, &sb->created, sizeof(sb->created));
	sb->crc = slot_crc32c(sb, offsetof(struct pmeta_super, crc));
}

int pmeta_super_check(const void *meta, uint64_t size)
{
	const struct pmeta_super *sb = meta;
	uint64_t units = 0;

	if (size < PHDR_UNIT || sb->magic != PMETA_MAGIC ||
	    (sb->version != PMETA_VERSION && sb->version != PMETA_VERSION_NODIR) ||
	    sb->crc != slot_crc32c(sb, offsetof(struct pmeta_super, crc)) || sb->size != size ||
	    !sb->narenas || sb->narenas > PMETA_MAX_ARENAS || !sb->slab_bytes ||
	    sb->slab_bytes % PHDR_UNIT || sb->ns_off != PHDR_UNIT ||
	    sb->slab_off != PHDR_UNIT + NS_BYTES || sb->hdr_off != sb->slab_off + SLAB_BYTES)
		return -EINVAL;
	for (uint32_t i = 0; i < sb->narenas; i++) {
		if (sb->arena[i].size % PHDR_UNIT ||
		    (sb->version == PMETA_VERSION_NODIR && sb->arena[i].dir_units) ||
		    (uint64_t)sb->arena[i].dir_units * PHDR_UNIT >= sb->arena[i].size)
			return -EINVAL;
		units += sb->arena[i].size / PHDR_UNIT;
	}
	if (pmeta_size(units) != size)
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

void pmeta_slab_write(void *meta, uint32_t sid, uint32_t arena, uint64_t off, uint64_t len,
		      uint32_t slot_bytes)
{
	const struct pmeta_super *sb = meta;
	struct pmeta_slab *r = (struct pmeta_slab *)((char *)meta + sb->slab_off) + sid;
	struct pmeta_slab n = {.magic = PHDR_MAGIC,
			       .arena = arena,
			       .off = off,
			       .len = len,
			       .slot_bytes = slot_bytes};

	if (sid >= PMETA_SLABS_MAX)
		return;
	n.crc = slot_crc32c(&n, offsetof(struct pmeta_slab, crc));
	*r = n;
}

void pmeta_slab_clear(void *meta, uint32_t sid)
{
	const struct pmeta_super *sb = meta;

	if (sid < PMETA_SLABS_MAX)
		memset((struct pmeta_slab *)((char *)meta + sb->slab_off) + sid, 0,
		       sizeof(struct pmeta_slab));
}

const struct pmeta_slab *pmeta_slab_get(const void *meta, uint32_t sid)
{
	const struct pmeta_super *sb = meta;
	const struct pmeta_slab *r;

	if (sid >= PMETA_SLABS_MAX)
		return NULL;
	r = (const struct pmeta_slab *)((const char *)meta + sb->slab_off) + sid;
	if (r->magic != PHDR_MAGIC || r->crc != slot_crc32c(r, offsetof(struct pmeta_slab, crc)) ||
	    r->arena >= sb->narenas || !r->slot_bytes || r->slot_bytes % PHDR_UNIT ||
	    r->off % PHDR_UNIT || !r->len || r->len % r->slot_bytes ||
	    r->off + r->len > sb->arena[r->arena].size || r->off + r->len < r->off)
		return NULL;
	return r;
}

void pmeta_hdr_seal(struct pmeta_hdr *h, const void *page)
{
	pmeta_hdr_seal_crc(h, slot_crc32c(page, h->len));
}

void pmeta_hdr_seal_crc(struct pmeta_hdr *h, uint32_t crc)
{
	h->magic = PHDR_MAGIC;
	h->resv0 = 0;
	h->crc = crc;
	h->hdr_crc = slot_crc32c(h, offsetof(struct pmeta_hdr, hdr_crc));
}

struct scan_job {
	pthread_t tid;
	void *meta;
	struct pmeta_scan_slab *sl;
	uint64_t first, end; /* slabs [first, end) */
	uint64_t kept, torn;
};

/* Whether h, in its own right, can be a committed page of a slab of slot_bytes slots. */
static int hdr_sane(const void *meta, const struct pmeta_hdr *h, uint32_t slot_bytes)
{
	if (h->magic != PHDR_MAGIC ||
	    h->hdr_crc != slot_crc32c(h, offsetof(struct pmeta_hdr, hdr_crc)))
		return 0;
	if (h->slot_bytes != slot_bytes || h->len != h->slot_bytes)
		return 0;
	return pmeta_ns_get(meta, h->ns) != NULL;
}

static void *scan_thread(void *arg)
{
	struct scan_job *j = arg;

	for (uint64_t k = j->first; k < j->end; k++) {
		struct pmeta_scan_slab *sl = &j->sl[k];
		uint64_t step = sl->slot_bytes / PHDR_UNIT;

		sl->kept = 0;
		for (uint32_t i = 0; i < sl->nslots; i++) {
			struct pmeta_hdr *h = pmeta_hdr_at(j->meta, sl->unit + i * step);

			if (!h->magic)
				continue;
			/* A header of another slot size is from an earlier life of these bytes
			 * whose clear was lost. */
			if (!hdr_sane(j->meta, h, sl->slot_bytes)) {
				memset(h, 0, sizeof(*h));
				continue;
			}
			if (slot_crc32c(sl->base + (uint64_t)i * sl->slot_bytes, h->len) !=
			    h->crc) {
				memset(h, 0, sizeof(*h));
				j->torn++;
				continue;
			}
			sl->kept++;
			j->kept++;
		}
	}
	return NULL;
}

uint64_t pmeta_scan(void *meta, struct pmeta_scan_slab *sl, uint64_t nslabs, uint64_t *torn)
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

		*j = (struct scan_job){
			.meta = meta, .sl = sl, .first = i * per < nslabs ? i * per : nslabs};
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
