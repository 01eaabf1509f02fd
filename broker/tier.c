// SPDX-License-Identifier: MIT
/*
 * tier.c - the NVMe tier: what leaves RAM for disk, what comes back, and the disk index.
 *
 * Placement. Each path is a circular log of slots (format: slot.c). A demotion writes its slot
 * at the head of the next path in turn (pages are striped across paths); when the head meets
 * the oldest slots, they are dropped: on disk, the page written longest ago goes first. A page
 * on disk is only ever read by promoting it, and a page is demoted because it was the coldest
 * in RAM, so write order is recency order for pages that live on disk only. (A page promoted and
 * demoted again without being rewritten keeps its old place: its recency on disk is that of its
 * first write. That is the price of clean demotions, which cost no I/O at all.)
 *
 * Tenant regions [tenant-disk]. With --tenants every path is cut into one region per pool
 * partition (cut_disk: the same fraction of each path, in partition order), and each region is
 * a circular log of its own: a page is demoted into its partition's region, so the oldest data
 * its head overwrites is always its own tenant's, and the scan reads each region as a log. The
 * slot format knows nothing of it; the cut follows from the flags. Without tenants there is
 * one region per path, the whole slot area.
 *
 * Records. A slot on disk is a struct dslot: its path, offset, length, payload crc, generation,
 * the namespace identity (an index into the dns table: namespace ids are per-run numbers, the
 * disk knows identities, and a namespace opened later finds its pages by identity) and key.
 * States:
 *
 *     (evict) --demote--> WRITING --both writes ok, page still wanted--> ON DISK (indexed)
 *                            |                                             |   ^
 *                            +--error / page deleted: slot forgotten       |   | read done
 *                                                                  promote v   |
 *                                                                         READING
 *
 * A slot is in its path's log list (oldest first) from the moment its space is taken, and in
 * the index (ns identity, key) while ON DISK or READING. dead marks a slot dropped while its
 * read was in flight: it leaves the index at once and is freed when the read completes.
 *
 * Demotion (store.c evict() -> tier_demote). The page stays READY in RAM and readable, pinned,
 * while its payload and then its header are written (two linked writes: the header commits the
 * slot). When both completed the page's RAM is freed (store_demote_done) unless a lease or copy
 * took it meanwhile: then it stays, "clean" (its copy on disk is complete, so evicting it later
 * is free). On a write error it stays in RAM, dirty. Background demotion runs from the high
 * watermark down to the low one (defaults 90/80 with a disk); an allocation that finds the pool
 * full frees a clean page, else starts demotions of the coldest pages and parks its op until one
 * completed (tier_wait_alloc): PUTs then run at the disk's write speed instead of losing data.
 * Only when no demotion can be started (no disk, tier failed) does the coldest page get dropped,
 * and only once no colder page is still being demoted (a failed write returns its page to the
 * cold end, to be dropped first).
 *
 * Promotion (ops.c -> tier_promote). A GET, ACQUIRE or PREFETCH that found no READY page in
 * RAM (RAM first: the disk index is not consulted on a RAM hit) and whose page is on disk
 * allocates a RAM slot (WRITING, so never served), reads the payload into it and answers "wait
 * on that page" (pg->waiters: the request engine parks the op there, waitq.h); ops for the
 * same page meanwhile, PUTs of the key included, wait on it too (a GET joins the read). When
 * the read completed and the payload's crc32c matches the one in the header, the page is
 * committed READY (clean); a failed or short read, or a checksum mismatch (counted as
 * corrupt), aborts the RAM slot and forgets the disk copy. Either state change wakes every op
 * parked on the page ([page-wake], store.h): they run again through the request engine's one
 * resume path and find the page in RAM, or miss (a PUT then stores it). Never a partial or
 * wrong page.
 *
 * Failure. Every I/O error is counted; after TIER_FAIL_AFTER in a row the tier is marked failed:
 * no more demotions (evictions drop again) and no more promotions (disk pages are misses); the
 * broker keeps serving from RAM.
 *
 * Recovery. A failed tier is probed after a back-off (TIER_PROBE_FIRST, doubling with every
 * failed probe up to TIER_PROBE_MAX), once no I/O is in flight: on each path a block of a fresh
 * pattern is written to the probe block (SLOT_PROBE_OFF, inside the superblock's MiB, never
 * data) and read back, linked. When every path wrote and read it back intact, the tier is ok
 * again: demotions and promotions resume, and the slots indexed before the failure are served
 * again (each read is still checked against its payload crc, so a slot the failure damaged is
 * a miss, never a wrong page). A tier that fails again within TIER_STABLE of recovering keeps
 * its back-off (a flapping device is probed ever less often); later failures start afresh.
 * The probe runs through the ring like any I/O, so a device that hangs never blocks the loop.
 *
 * Warm restart. On paths whose superblocks match, each region of each path is read in large
 * chunks and every 4 KiB block is checked for a slot header; a valid header whose payload crc
 * matches becomes a slot ON DISK (of two copies of a key, the higher generation wins). Torn
 * slots (a header that does not check, or a slot that runs past the end of a file cut short)
 * and corrupt ones (payload crc mismatch) are counted and skipped; an old slot partly
 * overwritten by a newer one is skipped silently. Each log's head is placed after its newest
 * slot. At shutdown (tier_close) every page without a disk copy is written first, so a restart
 * finds the whole cache.
 *
 * Loop thread only; the only other actor is the kernel, through the ring.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/mman.h>

#include "broker.h"
#include "log.h"
#include "slot.h"
#include "text.h"
#include "tier.h"

#define TIER_FAIL_AFTER 8	/* consecutive I/O errors that fail the tier */
#define TIER_MAX_DNS 4096	/* namespace identities the disk may know */
#define SCAN_CHUNK (4u << 20)	/* bytes per read while scanning */
#define SCAN_REGION (32u << 20) /* bytes per scan buffer: one is read while the other is parsed */
#define REAP_MAX 256		/* completions per tier_poll */
#define TIER_PROBE_FIRST 1.0	/* seconds from a failure to the first probe */
#define TIER_PROBE_MAX 60.0	/* longest back-off between two probes */
#define TIER_STABLE 600.0	/* ok this long after a recovery: the next failure starts afresh */

enum { DS_WRITING = 1, DS_ONDISK = 2, DS_READING = 3 };
/* ud of an I/O: a dslot (or, for probes, the tier) | what; both are malloc'd, 16-byte aligned. */
enum { UD_PAYLOAD = 1, UD_HEADER = 2, UD_READ = 3, UD_PROBE_W = 4, UD_PROBE_R = 5, UD_MASK = 7 };
enum { TIER_OK = 0, TIER_FAILED = 1 };

struct dslot {
	union {
		struct ixnode ixn; /* its entry in the tier's index: chain, key, dns (index.h) */
		struct {
			struct ixnode *ixn_next_;
			kvb_key key;
			uint32_t dns;
		};
	};
	struct list log; /* its path's log, oldest first */
	struct page *pg; /* RAM page written from or read into while I/O is in flight */
	uint64_t off;	 /* of the header block in its path */
	uint64_t gen;
	uint32_t len; /* payload bytes */
	uint32_t crc; /* payload crc32c */
	uint8_t path;
	uint8_t state;
	uint8_t indexed;
	uint8_t dead;
	uint8_t pending; /* CQEs still owed */
	uint8_t part;	 /* [tenant-disk] the partition whose region of the path holds it */
	uint32_t hdr;	 /* header block while writing */
	int32_t err;	 /* first error of the I/O in flight */
	uint32_t rd_us;	 /* [hist] a promotion's read submitted: clock_now() in us, mod 2^32 */
};

struct tlog {
	uint64_t start, end; /* slot area: a partition's region of the path [tenant-disk] */
	uint64_t head;	     /* next slot goes here (or at start, if it does not fit) */
	uint64_t used;	     /* bytes of live slots */
	struct list slots;   /* oldest first */
};

struct dns_ent {
	uint8_t ident[32];
	int32_t ns; /* namespace id in this run, -1 while not opened */
};

struct tier_stats {
	uint64_t reads, writes, read_bytes, write_bytes, errors, corrupt, torn, dropped, demotions,
		promotions, joined, parked, scan_bytes, index_lookups;
	double scan_seconds;
};

struct tier {
	struct broker *b;
	struct disk d;
	int state;
	const char *fail_why;
	struct tlog log[DISK_MAX_PATHS][POOL_MAX_PARTS]; /* per path, per partition's region */
	uint32_t nparts;				 /* regions of each path */
	uint32_t next_path[POOL_MAX_PARTS];		 /* each partition stripes on its own */
	uint64_t part_used[POOL_MAX_PARTS];		 /* bytes of live slots per partition */
	uint64_t part_slots[POOL_MAX_PARTS];		 /* live slots per partition */
	struct index ix; /* (dns, key) -> slot ON DISK or READING: index.c, as the store's */
	uint64_t bytes_used;
	struct dns_ent *dns;
	uint32_t ndns;
	int32_t ns2dns[STORE_MAX_NS];
	uint32_t *free_hdrs, nfree_hdrs;
	uint32_t writes, reads; /* page I/Os in flight */
	uint32_t qd;		/* page I/Os in flight at most */
	uint32_t errors_in_row;
	uint64_t gen;
	struct waitq wait;	 /* ops waiting for RAM or ring room, woken at each completion */
	struct loop_fd on_event; /* the ring's eventfd in the loop */
	struct tier_stats st;
	/* recovery of a failed tier (see the essay) */
	double failed_at, recovered_at, probe_at, backoff;
	uint8_t *probe_mem;	 /* SLOT_BLOCK written, then one read back per path */
	uint32_t probe_pending;	 /* probe CQEs still owed */
	int32_t probe_err;	 /* first error of the probe in flight */
	uint64_t probe_seq;	 /* probes started: the pattern of each is new */
	uint64_t recoveries;	 /* failed -> ok */
	uint64_t probe_failures; /* probes that found the device still failing */
#ifdef KVB_TEST_HOOKS
	/* KVB_DISK_FAULTS: fail every Nth write / read, only the first `until` of each when set,
	 * and the first `probes` probes; one completion reaped every `slow` us at most */
	uint32_t fault_w, fault_r, nw, nr, fault_until, fault_probes, fault_slow;
	double next_reap;
#endif
};

/* ---- namespace identities ---- */

/* The dns index of namespace n, adding its identity when create; -1 when unknown or full. */
static int dns_of(struct tier *t, const struct ns *n, int create)
{
	if (t->ns2dns[n->id] >= 0)
		return t->ns2dns[n->id];
	for (uint32_t i = 0; i < t->ndns; i++) {
		if (!memcmp(t->dns[i].ident, n->ident, sizeof(n->ident))) {
			t->dns[i].ns = (int32_t)n->id;
			t->ns2dns[n->id] = (int32_t)i;
			return (int)i;
		}
	}
	if (!create || t->ndns == TIER_MAX_DNS)
		return -1;
	memcpy(t->dns[t->ndns].ident, n->ident, sizeof(n->ident));
	t->dns[t->ndns].ns = (int32_t)n->id;
	t->ns2dns[n->id] = (int32_t)t->ndns;
	return (int)t->ndns++;
}

/* The dns index of an identity read from disk, added when new; -1 when the table is full. */
static int dns_ident(struct tier *t, const uint8_t ident[32])
{
	for (uint32_t i = 0; i < t->ndns; i++)
		if (!memcmp(t->dns[i].ident, ident, 32))
			return (int)i;
	if (t->ndns == TIER_MAX_DNS)
		return -1;
	memcpy(t->dns[t->ndns].ident, ident, 32);
	t->dns[t->ndns].ns = -1;
	return (int)t->ndns++;
}

/* ---- the index: (dns, key) -> slot ON DISK or READING ---- */

static struct dslot *dfind(struct tier *t, uint32_t dns, const kvb_key *key)
{
	struct ixnode *n = index_find(&t->ix, dns, key);

	return n ? list_entry(n, struct dslot, ixn) : NULL;
}

static void dinsert(struct tier *t, struct dslot *d)
{
	index_insert(&t->ix, &d->ixn);
	d->indexed = 1;
}

static void dremove(struct tier *t, struct dslot *d)
{
	if (!d->indexed)
		return;
	index_remove(&t->ix, &d->ixn);
	d->indexed = 0;
}

/* The slot of (n, key) on disk, or NULL (also when the tier failed). */
static struct dslot *lookup(struct tier *t, const struct ns *n, const kvb_key *key)
{
	int dns;

	if (!t || t->state != TIER_OK)
		return NULL;
	t->st.index_lookups++;
	dns = dns_of(t, n, 0);
	return dns < 0 ? NULL : dfind(t, (uint32_t)dns, key);
}

/* ---- slots and logs ---- */

static uint64_t stride_of(const struct dslot *d)
{
	return slot_stride(d->len);
}

/*
 * Forgets a slot: out of the index and its log (its space is reused when the head comes by).
 * dropped: the disk ran full, count it, and if the page is in RAM it is dirty again.
 * A slot with a read in flight is only marked dead; its completion frees it.
 */
static void forget(struct tier *t, struct dslot *d, int dropped)
{
	int32_t ns = t->dns[d->dns].ns;
	struct page *pg = ns >= 0 ? store_find(&t->b->store, (uint32_t)ns, &d->key) : NULL;

	if (pg && pg->state == PAGE_READY)
		pg->clean = 0; /* its copy on disk is gone */
	else if (dropped && d->indexed)
		t->st.dropped++;
	dremove(t, d);
	if (list_linked(&d->log)) {
		list_del(&d->log);
		t->log[d->path][d->part].used -= stride_of(d);
		t->part_used[d->part] -= stride_of(d);
		t->part_slots[d->part]--;
		t->bytes_used -= stride_of(d);
	}
	if (d->state == DS_READING || d->state == DS_WRITING) {
		d->dead = 1;
		return;
	}
	free(d);
}

/*
 * Room for a slot of stride bytes at the head of partition part's region of path pi. What lies
 * in the way is the oldest data of that region, which is the partition's own [tenant-disk]: it
 * is dropped. -EBUSY when a slot in the way has I/O in flight.
 */
static int log_alloc(struct tier *t, uint32_t pi, uint32_t part, uint64_t stride, uint64_t *off)
{
	struct tlog *l = &t->log[pi][part];
	uint64_t head = l->head;

	if (stride > l->end - l->start)
		return -E2BIG;
	if (head + stride > l->end) {
		/* Wrap: the slots between the head and the end are the oldest; they go first. */
		while (!list_empty(&l->slots)) {
			struct dslot *o = list_entry(l->slots.next, struct dslot, log);

			if (o->off < head)
				break;
			if (o->state != DS_ONDISK)
				return -EBUSY;
			forget(t, o, 1);
		}
		head = l->start;
	}
	while (!list_empty(&l->slots)) {
		struct dslot *o = list_entry(l->slots.next, struct dslot, log);

		if (o->off >= head + stride || o->off + stride_of(o) <= head)
			break;
		if (o->state != DS_ONDISK)
			return -EBUSY;
		forget(t, o, 1);
	}
	l->head = head + stride;
	*off = head;
	return 0;
}

static void log_add(struct tier *t, struct dslot *d)
{
	list_add_tail(&t->log[d->path][d->part].slots, &d->log);
	t->log[d->path][d->part].used += stride_of(d);
	t->part_used[d->part] += stride_of(d);
	t->part_slots[d->part]++;
	t->bytes_used += stride_of(d);
}

/* ---- I/O completion ---- */

static void fail_tier(struct tier *t, const char *why)
{
	double now = clock_now();

	if (t->state == TIER_FAILED)
		return;
	t->state = TIER_FAILED;
	t->fail_why = why;
	t->failed_at = now;
	/* A device that failed again soon after it recovered keeps its back-off. */
	if (!t->backoff || now - t->recovered_at > TIER_STABLE)
		t->backoff = TIER_PROBE_FIRST;
	t->probe_at = now + t->backoff;
	log_error("disk: tier failed (%s): serving from RAM only; probing the disk again in "
		  "%.0f s",
		  why, t->backoff);
}

/* ---- recovery: the probe ---- */

/* Writes a fresh pattern to every path's probe block, each linked to its read-back. */
static void probe_start(struct tier *t)
{
	uint64_t *w = (uint64_t *)(void *)t->probe_mem;
	uint32_t n = 0;

	t->probe_seq++;
	t->probe_err = 0;
	for (uint32_t i = 0; i < SLOT_BLOCK / 8; i++)
		w[i] = t->probe_seq * 0x9e3779b97f4a7c15ull ^ i;
	memcpy(t->probe_mem, "KVBPROBE", 8);
	for (uint32_t p = 0; p < t->d.npaths; p++) {
		uint8_t *back = t->probe_mem + (uint64_t)(p + 1) * SLOT_BLOCK;

		memset(back, 0, SLOT_BLOCK);
		/* Room for both SQEs: submit what is prepared and try again once. */
		if (disk_space(&t->d) < 2)
			disk_submit(&t->d);
		if (disk_space(&t->d) < 2) {
			t->probe_err = -EBUSY;
			break;
		}
		disk_prep(&t->d, 1, p, SLOT_PROBE_OFF, t->probe_mem, SLOT_BLOCK,
			  (uint64_t)(uintptr_t)t | UD_PROBE_W, IOSQE_IO_LINK);
		disk_prep(&t->d, 0, p, SLOT_PROBE_OFF, back, SLOT_BLOCK,
			  (uint64_t)(uintptr_t)t | UD_PROBE_R, 0);
		n += 2;
	}
	t->probe_pending = n;
	if (disk_submit(&t->d) && !t->probe_err)
		t->probe_err = -EIO;
	log_debug("disk: probe %llu of the failed tier", (unsigned long long)t->probe_seq);
}

/* Every probe CQE is in: the tier is ok again, or the next probe waits twice as long. */
static void probe_done(struct tier *t)
{
	double now = clock_now();
	int err = t->probe_err;

	for (uint32_t p = 0; !err && p < t->d.npaths; p++)
		if (memcmp(t->probe_mem, t->probe_mem + (uint64_t)(p + 1) * SLOT_BLOCK, SLOT_BLOCK))
			err = -EIO; /* read back other bytes than written */
	if (!err) {
		t->state = TIER_OK;
		t->fail_why = NULL;
		t->errors_in_row = 0;
		t->recoveries++;
		t->recovered_at = now;
		log_info("disk: tier recovered after %.1f s: probe write and read-back ok on %u "
			 "path(s); demotions and promotions resume",
			 now - t->failed_at, t->d.npaths);
		return;
	}
	t->probe_failures++;
	t->backoff = t->backoff * 2 < TIER_PROBE_MAX ? t->backoff * 2 : TIER_PROBE_MAX;
	t->probe_at = now + t->backoff;
	/* One line per probe, at most one a minute once the back-off has grown. */
	log_warn("disk: probe %llu of the failed tier: %s; next in %.0f s",
		 (unsigned long long)t->probe_seq, strerror(-err), t->backoff);
}

static void probe_cqe(struct tier *t, unsigned what, int32_t res)
{
#ifdef KVB_TEST_HOOKS
	if (what == UD_PROBE_W && t->probe_seq <= t->fault_probes)
		res = -EIO;
	if (what == UD_PROBE_W && t->fault_w && ++t->nw % t->fault_w == 0 &&
	    (!t->fault_until || t->nw <= t->fault_until))
		res = -EIO;
#else
	(void)what;
#endif
	if (res != (int32_t)SLOT_BLOCK && !t->probe_err)
		t->probe_err = res < 0 ? res : -EIO;
	if (!--t->probe_pending)
		probe_done(t);
}

/* Counts an I/O's outcome; returns 1 when its error deserves a log line (rate-limited). */
static int count_io(struct tier *t, int err)
{
	if (!err) {
		t->errors_in_row = 0;
		return 0;
	}
	t->st.errors++;
	if (++t->errors_in_row == TIER_FAIL_AFTER)
		fail_tier(t, "repeated I/O errors");
	return t->st.errors <= 16 || !(t->st.errors % 1024);
}

static void write_done(struct tier *t, struct dslot *d)
{
	struct page *pg = d->pg;
	int ok = !d->err;

	t->writes--;
	t->free_hdrs[t->nfree_hdrs++] = d->hdr;
	if (count_io(t, d->err))
		log_warn("disk %s: write of %u bytes at %llu: %s (%llu errors so far)",
			 t->d.path[d->path].name, d->len, (unsigned long long)d->off,
			 strerror(-d->err), (unsigned long long)t->st.errors);
	if (ok) {
		t->st.writes++;
		t->st.write_bytes += stride_of(d);
	}
	d->pg = NULL;
	d->state = DS_ONDISK;
	/* A page deleted meanwhile is not worth indexing; its RAM goes at the unpin. */
	if (ok && !d->dead && !pg->unlinked) {
		dinsert(t, d);
		t->st.demotions++;
	} else {
		ok = 0;
		if (d->dead)
			free(d);
		else
			forget(t, d, 0);
	}
	store_demote_done(&t->b->store, pg, ok);
}

static void read_done(struct tier *t, struct dslot *d)
{
	struct page *pg = d->pg;
	int ok = !d->err, err = d->err;

	t->reads--;
	if (count_io(t, err))
		log_warn("disk %s: read of %u bytes at %llu: %s (%llu errors so far)",
			 t->d.path[d->path].name, d->len, (unsigned long long)d->off,
			 strerror(-err), (unsigned long long)t->st.errors);
	if (ok) {
		t->st.reads++;
		t->st.read_bytes += stride_of(d) - SLOT_BLOCK;
		if (slot_crc32c(store_addr(&t->b->store, pg), d->len) != d->crc) {
			t->st.corrupt++;
			ok = 0;
			log_warn("disk %s: slot at %llu: payload checksum mismatch: not served",
				 t->d.path[d->path].name, (unsigned long long)d->off);
		}
	}
	d->pg = NULL;
	d->state = DS_ONDISK;
	if (ok && !d->dead) {
		pg->clean = 1;
		store_commit(&t->b->store, pg);
		t->st.promotions++;
		if (!t->b->obs.off)
			hist_observe(&t->b->obs.h[HIST_PROMOTE], hist_bounds_of(HIST_PROMOTE),
				     (uint32_t)((uint64_t)(clock_now() * 1e6) - d->rd_us) * 1e-6);
	} else if (pg->unlinked) {
		store_unpin(&t->b->store, pg); /* DELETEd meanwhile (tier_delete): frees it */
	} else {
		store_abort(&t->b->store, pg);
	}
	/*
	 * The commit or abort above woke what waits on the page ([page-wake]); it runs again
	 * at the request engine's next poll, once the slot is settled: it finds the page in RAM,
	 * or misses.
	 */
	if (d->dead)
		free(d);
	else if (!ok)
		forget(t, d, 0); /* a copy that cannot be read is no copy */
}

static void on_cqe(void *arg, uint64_t ud, int32_t res)
{
	struct tier *t = arg;
	struct dslot *d = (struct dslot *)(uintptr_t)(ud & ~(uint64_t)UD_MASK);
	unsigned what = (unsigned)(ud & UD_MASK);
	int32_t want;

	if (what == UD_PROBE_W || what == UD_PROBE_R) {
		probe_cqe(t, what, res);
		return;
	}
	want = what == UD_HEADER ? (int32_t)SLOT_BLOCK : (int32_t)(stride_of(d) - SLOT_BLOCK);
#ifdef KVB_TEST_HOOKS
	/* Fault injection (test builds only): the I/O happened, its result is replaced. */
	if (what == UD_READ && t->fault_r && ++t->nr % t->fault_r == 0 &&
	    (!t->fault_until || t->nr <= t->fault_until)) {
		/* Alternately an error and a short read that left garbage behind it. */
		res = (t->nr / t->fault_r) % 2 ? -EIO : want / 2;
		if (res > 0)
			memset((uint8_t *)store_addr(&t->b->store, d->pg) + res, 0xee,
			       (size_t)(want - res));
	}
#endif
	if (res != want && !d->err)
		d->err = res < 0 ? res : -EIO;
	if (--d->pending)
		return;
#ifdef KVB_TEST_HOOKS
	/*
	 * A write fault fails the whole slot when its last write completes, so the Nth injected
	 * fault is the Nth failed slot in the order write_done() counts them: "the first K writes
	 * fail" then means K failed slots in a row, whatever order the payload and header CQEs
	 * of different slots arrive in (counted per payload CQE, a good slot could complete
	 * between two failed ones and reset errors_in_row).
	 */
	if (what != UD_READ && t->fault_w && ++t->nw % t->fault_w == 0 &&
	    (!t->fault_until || t->nw <= t->fault_until) && !d->err)
		d->err = -EIO;
#endif
	if (what == UD_READ)
		read_done(t, d);
	else
		write_done(t, d);
}

/* ---- demotion and promotion ---- */

/* store.c's evict() offers a page without a disk copy: start writing it (see tier.h). */
static int demote(void *arg, struct page *pg)
{
	struct broker *b = arg;
	struct tier *t = b->tier;
	struct ns *n = ns_get(&b->nst, pg->ns);
	struct slot_hdr *h;
	struct dslot *d;
	uint64_t stride, off = 0;
	int dns, err = -EBUSY;
	uint32_t pi, part;

	if (t->state != TIER_OK || !n)
		return 0;
	part = store_part_of(&b->store, pg);
	if (part >= t->nparts)
		return 0; /* cannot happen: every partition has a region */
	if (t->writes + t->reads >= t->qd || !t->nfree_hdrs || disk_space(&t->d) < 2)
		return -EBUSY;
	dns = dns_of(t, n, 1);
	if (dns < 0)
		return 0;
	stride = slot_stride(n->page_bytes);
	for (uint32_t i = 0; i < t->d.npaths && err == -EBUSY; i++) {
		pi = (t->next_path[part] + i) % t->d.npaths;
		err = log_alloc(t, pi, part, stride, &off);
	}
	if (err)
		return err == -EBUSY ? -EBUSY : 0;
	t->next_path[part] = (pi + 1) % t->d.npaths;
	d = calloc(1, sizeof(*d));
	if (!d)
		return -EBUSY;
	d->key = pg->key;
	d->off = off;
	d->gen = ++t->gen;
	d->len = (uint32_t)n->page_bytes;
	d->crc = slot_crc32c(store_addr(&b->store, pg), n->page_bytes);
	d->dns = (uint32_t)dns;
	d->path = (uint8_t)pi;
	d->part = (uint8_t)part;
	d->state = DS_WRITING;
	d->pg = pg;
	d->pending = 2;
	d->hdr = t->free_hdrs[--t->nfree_hdrs];
	h = disk_hdr(&t->d, d->hdr);
	memset(h, 0, SLOT_BLOCK);
	memcpy(h->cache_id, t->d.cache_id, sizeof(h->cache_id));
	h->gen = d->gen;
	memcpy(h->ns_ident, n->ident, sizeof(h->ns_ident));
	memcpy(h->key, d->key.b, sizeof(h->key));
	h->len = d->len;
	h->payload_crc = d->crc;
	slot_hdr_seal(h);
	log_add(t, d);
	/* Payload, then (linked: only once the payload is written) the header that commits it. */
	disk_prep(&t->d, 1, pi, off + SLOT_BLOCK, store_addr(&b->store, pg),
		  (uint32_t)(stride - SLOT_BLOCK), (uint64_t)(uintptr_t)d | UD_PAYLOAD,
		  IOSQE_IO_LINK);
	disk_prep(&t->d, 1, pi, off, h, SLOT_BLOCK, (uint64_t)(uintptr_t)d | UD_HEADER, 0);
	t->writes++;
	return 1;
}

int tier_promote(struct broker *b, const struct ns *n, const kvb_key *key, struct page *pg,
		 struct wait_on *w)
{
	struct tier *t = b->tier;
	struct dslot *d;
	struct waitq *q;
	int err;

	if (!t)
		return 0;
	d = lookup(t, n, key);
	/* The identity fixes the page size; a slot that disagrees would overrun the RAM slot. */
	if (!d || d->len != n->page_bytes)
		return 0;
	if (pg) {
		/* WRITING: our own promotion's page is joined; a PUT's is not served until done. */
		if (d->state != DS_READING || d->pg != pg)
			return 0;
		q = store_waiters(pg);
		if (!q)
			return 0; /* out of memory: a miss */
		t->st.joined++;
		return wait_on_page(w, q, pg, "a promotion from disk");
	}
	if (t->writes + t->reads >= t->qd || !disk_space(&t->d)) {
		t->st.parked++;
		return wait_on(w, &t->wait, "room in the disk queue");
	}
	/*
	 * The slot is held (READING) across the allocation: store_alloc may evict, and a page it
	 * demotes takes its room at the log head, which drops the oldest slots in the way; this
	 * slot may be one of them (a read sweeping the log oldest first meets the head). Held, it
	 * stops the head (log_alloc: -EBUSY) instead of being freed under us.
	 */
	d->state = DS_READING;
	err = store_alloc(&b->store, n->cls, n->id, key, &pg);
	if (err)
		d->state = DS_ONDISK;
	if (err == -ENOSPC && t->writes + t->reads) {
		t->st.parked++;
		return wait_on(w, &t->wait, "RAM for a promotion (demotions in flight)");
	}
	if (err)
		return 0;
	q = store_waiters(pg);
	if (!q) {
		d->state = DS_ONDISK;
		store_abort(&b->store, pg);
		return 0;
	}
	d->pg = pg;
	d->pending = 1;
	d->err = 0;
	d->rd_us = (uint32_t)(uint64_t)(clock_now() * 1e6);
	disk_prep(&t->d, 0, d->path, d->off + SLOT_BLOCK, store_addr(&b->store, pg),
		  (uint32_t)(stride_of(d) - SLOT_BLOCK), (uint64_t)(uintptr_t)d | UD_READ, 0);
	t->reads++;
	return wait_on_page(w, q, pg, "a promotion from disk");
}

int tier_wait_alloc(struct broker *b, struct wait_on *w)
{
	struct tier *t = b->tier;

	/* Also when the tier failed: the writes still in flight free RAM or return their pages to
	 * the cold end of the LRU, to be dropped before anything newer (store.c evict). */
	if (!t || !(t->writes + t->reads))
		return 0;
	t->st.parked++;
	return wait_on(w, &t->wait, "RAM (demotions in flight)");
}

int tier_has(struct broker *b, const struct ns *n, const kvb_key *key)
{
	return lookup(b->tier, n, key) != NULL;
}

int tier_delete(struct broker *b, const struct ns *n, const kvb_key *key)
{
	struct dslot *d = lookup(b->tier, n, key);

	if (!d)
		return 0;
	/* A promotion in flight: its RAM slot leaves the index now, so a new PUT of the key is
	 * stored instead of being answered "exists" by a page that is about to be aborted. */
	if (d->state == DS_READING)
		store_drop(&b->store, d->pg);
	forget(b->tier, d, 0);
	return 1;
}

uint32_t tier_poll(struct broker *b)
{
	struct tier *t = b->tier;
	uint32_t n, max = REAP_MAX;
	int err;

	if (!t)
		return 0;
#ifdef KVB_TEST_HOOKS
	if (t->fault_slow && t->writes + t->reads) {
		double now = clock_now();

		if (now < t->next_reap)
			return 1; /* I/O pending: the loop polls on instead of sleeping */
		t->next_reap = now + t->fault_slow * 1e-6;
		max = 1;
	}
#endif
	err = disk_submit(&t->d);
	n = disk_reap(&t->d, max, 0, on_cqe, t);
	if (n) {
		/* I/O completed: RAM or ring room may be free for the ops that waited. */
		waitq_wake(&t->wait, &b->runq);
		err = disk_submit(&t->d);
	}
	if (err)
		fail_tier(t, "the ring refused a submission");
	/* A failed tier is probed once its back-off ran out and its last I/O completed. */
	if (t->state == TIER_FAILED && !t->probe_pending && !(t->writes + t->reads) &&
	    clock_now() >= t->probe_at)
		probe_start(t);
	return n;
}

/* The ring's eventfd was readable: completions are reaped by tier_poll in the next round. */
static void on_disk_event(void *arg)
{
	struct tier *t = arg;

	disk_ack_event(&t->d);
}

/* ---- warm restart ---- */

/*
 * The scan reads a path region by region into two buffers in turn, so that one region is being
 * read while the other is parsed. Each buffer has room in front of its region for the start of
 * a slot that straddles two regions (the carry, at most the largest slot).
 */
struct scan_buf {
	uint8_t *mem;  /* carry room, then the region */
	uint64_t off;  /* file offset of the region */
	uint64_t len;  /* region bytes */
	uint32_t want; /* reads issued */
	uint32_t done; /* reads completed */
	int32_t err;   /* first error */
};

static void scan_cqe(void *arg, uint64_t ud, int32_t res)
{
	struct scan_buf *sb = (struct scan_buf *)arg + ud;

	sb->done++;
	if (res < 0 && !sb->err)
		sb->err = res;
}

/* Issues the reads of [off, off + len) into sb's region, SCAN_CHUNK bytes each. */
static int scan_submit(struct tier *t, uint32_t pi, struct scan_buf *bufs, uint32_t i,
		       uint64_t carry_room, uint64_t off, uint64_t len)
{
	struct scan_buf *sb = &bufs[i];

	sb->off = off;
	sb->len = len;
	sb->want = sb->done = 0;
	sb->err = 0;
	for (uint64_t o = 0; o < len; o += SCAN_CHUNK) {
		uint32_t n = (uint32_t)(len - o < SCAN_CHUNK ? len - o : SCAN_CHUNK);

		while (disk_prep(&t->d, 0, pi, off + o, sb->mem + carry_room + o, n, i, 0)) {
			/* SQ full: submit and make room (the other buffer's reads may be in it). */
			if (disk_submit(&t->d))
				return -EIO;
			disk_reap(&t->d, 64, 1, scan_cqe, bufs);
		}
		sb->want++;
	}
	t->st.scan_bytes += len;
	return disk_submit(&t->d) ? -EIO : 0;
}

static int scan_wait(struct tier *t, struct scan_buf *bufs, uint32_t i)
{
	while (bufs[i].done < bufs[i].want)
		disk_reap(&t->d, 64, 1, scan_cqe, bufs);
	return bufs[i].err;
}

/* A valid header whose payload checks: the slot goes into the index (newest copy wins). */
static void scan_found(struct tier *t, uint32_t pi, uint32_t part, uint64_t off,
		       const struct slot_hdr *h)
{
	int dns = dns_ident(t, h->ns_ident);
	struct dslot *d, *old;

	if (dns < 0)
		return;
	d = calloc(1, sizeof(*d));
	if (!d)
		return;
	memcpy(d->key.b, h->key, sizeof(d->key.b));
	d->off = off;
	d->gen = h->gen;
	d->len = h->len;
	d->crc = h->payload_crc;
	d->dns = (uint32_t)dns;
	d->path = (uint8_t)pi;
	d->part = (uint8_t)part;
	d->state = DS_ONDISK;
	old = dfind(t, d->dns, &d->key);
	if (old && old->gen > d->gen) {
		free(d);
		return;
	}
	if (old)
		forget(t, old, 0);
	dinsert(t, d);
	log_add(t, d);
	if (d->gen > t->gen)
		t->gen = d->gen;
}

/* Does a newer valid header start inside [from, to) of the buffer? (Overwritten, not corrupt.) */
static int overwritten(struct tier *t, const uint8_t *from, const uint8_t *to, uint64_t gen,
		       uint64_t max_len)
{
	for (const uint8_t *p = from; p < to; p += SLOT_BLOCK) {
		struct slot_hdr h;

		if (slot_hdr_check(p, t->d.cache_id, max_len) != SLOT_VALID)
			continue;
		memcpy(&h, p, sizeof(h));
		if (h.gen > gen)
			return 1;
	}
	return 0;
}

/*
 * Parses [*pos, limit) of the region in sb (the file offset o is at sb->mem + room + o -
 * sb->off, and the carry sits just before the region). Stops at a slot that runs past limit
 * when more of the path follows; *pos is then where the next region's carry starts.
 */
static void scan_region(struct tier *t, uint32_t pi, uint32_t part, const struct scan_buf *sb,
			uint64_t room, uint64_t *pos, uint64_t *newest, uint64_t max_len)
{
	struct tlog *l = &t->log[pi][part];
	uint64_t limit = sb->off + sb->len;

	while (*pos + SLOT_BLOCK <= limit) {
		const uint8_t *p = sb->mem + room + *pos - sb->off;
		enum slot_verdict v = slot_hdr_check(p, t->d.cache_id, max_len);
		struct slot_hdr h;
		uint64_t stride;

		if (v != SLOT_VALID) {
			t->st.torn += v == SLOT_TORN;
			*pos += SLOT_BLOCK;
			continue;
		}
		memcpy(&h, p, sizeof(h));
		stride = slot_stride(h.len);
		if (*pos + stride > l->end) {
			/* Cannot be a whole slot of this geometry (or of this cut [tenant-disk]). */
			t->st.torn++;
			*pos += SLOT_BLOCK;
			continue;
		}
		if (*pos + stride > limit)
			return; /* carried into the next region */
		if (slot_crc32c(p + SLOT_BLOCK, h.len) != h.payload_crc) {
			if (*pos + stride > t->d.path[pi].eof)
				t->st.torn++; /* the file was cut inside it */
			else if (!overwritten(t, p + SLOT_BLOCK, p + stride, h.gen, max_len))
				t->st.corrupt++;
			*pos += SLOT_BLOCK;
			continue;
		}
		scan_found(t, pi, part, *pos, &h);
		if (h.gen >= *newest) {
			*newest = h.gen;
			l->head = *pos + stride;
		}
		*pos += stride;
	}
}

/* Scans partition part's region of path pi [tenant-disk]: each region is a log of its own. */
static int scan_path(struct tier *t, uint32_t pi, uint32_t part, struct scan_buf *bufs,
		     uint64_t room, uint64_t region, uint64_t max_len)
{
	struct tlog *l = &t->log[pi][part];
	uint64_t pos = l->start, newest = 0, n = 0, next = l->start;
	uint32_t cur = 0;
	int err;

	if (l->end <= l->start)
		return 0; /* an empty region */
	err = scan_submit(t, pi, bufs, 0, room, next,
			  region < l->end - next ? region : l->end - next);
	next += bufs[0].len;
	while (!err) {
		struct scan_buf *sb = &bufs[cur], *other = &bufs[cur ^ 1];
		uint64_t carry = sb->off - pos;

		err = scan_wait(t, bufs, cur);
		if (err)
			break;
		/* The previous region's unparsed tail goes in front of this one. */
		if (carry)
			memcpy(sb->mem + room - carry, other->mem + room + (pos - other->off),
			       carry);
		if (next < l->end) {
			err = scan_submit(t, pi, bufs, cur ^ 1, room, next,
					  region < l->end - next ? region : l->end - next);
			next += other->len;
		}
		scan_region(t, pi, part, sb, room, &pos, &newest, max_len);
		if (sb->off + sb->len >= l->end)
			break;
		cur ^= 1;
	}
	if (err) {
		/* Let the other buffer's reads finish before the buffers go. */
		scan_wait(t, bufs, 0);
		scan_wait(t, bufs, 1);
		return err;
	}
	/* Log order is address order from the head on: the slots before it are the newest. */
	for (struct list *it = l->slots.next; it != &l->slots; it = it->next)
		n++;
	while (n--) {
		struct dslot *d = list_entry(l->slots.next, struct dslot, log);

		if (d->off >= l->head)
			break;
		list_del(&d->log);
		list_add_tail(&l->slots, &d->log);
	}
	return 0;
}

static int scan(struct tier *t, uint64_t slab_bytes)
{
	uint64_t max_len = slab_bytes, room = slot_stride(max_len), region = SCAN_REGION;
	struct scan_buf bufs[2] = {{0}, {0}};
	double t0 = clock_now();
	int err = 0;

	if (region < room)
		region = room;
	for (int i = 0; i < 2; i++) {
		bufs[i].mem = mmap(NULL, room + region, PROT_READ | PROT_WRITE,
				   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
		if (bufs[i].mem == MAP_FAILED)
			err = -ENOMEM;
	}
	for (uint32_t i = 0; i < t->d.npaths && !err; i++)
		for (uint32_t p = 0; p < t->nparts && !err; p++)
			err = scan_path(t, i, p, bufs, room, region, max_len);
	for (int i = 0; i < 2; i++)
		if (bufs[i].mem != MAP_FAILED)
			munmap(bufs[i].mem, room + region);
	t->st.scan_seconds = clock_now() - t0;
	if (err) {
		log_error("disk: scan: %s", strerror(-err));
		return err;
	}
	log_info("disk: warm restart: scanned %.2f GiB in %.2f s (%.2f GB/s): %llu pages of %u "
		 "namespaces, %llu torn, %llu corrupt slots discarded",
		 (double)t->st.scan_bytes / (1 << 30), t->st.scan_seconds,
		 t->st.scan_seconds > 0 ? (double)t->st.scan_bytes / t->st.scan_seconds / 1e9 : 0.0,
		 (unsigned long long)t->ix.count, t->ndns, (unsigned long long)t->st.torn,
		 (unsigned long long)t->st.corrupt);
	return 0;
}

/* ---- life cycle ---- */

static const char *state_name(const struct tier *t)
{
	return !t ? "off" : t->state == TIER_OK ? "ok" : "failed";
}

#ifdef KVB_TEST_HOOKS
/*
 * KVB_DISK_FAULTS="write=N,read=M,until=K,probes=P,slow=U" (test builds; any subset, any
 * order): every Nth page write (probe writes included) and every Mth read fails; with until,
 * only among the first K writes and K reads (the device then heals); the first P recovery probes
 * fail; with slow, one completion is reaped every U microseconds at most, so that they trickle
 * in between ops as from a slow device instead of all in one round.
 */
static void faults_parse(struct tier *t)
{
	const char *f = getenv("KVB_DISK_FAULTS");

	while (f && *f) {
		unsigned v = 0;

		if (sscanf(f, "write=%u", &v) == 1)
			t->fault_w = v;
		else if (sscanf(f, "read=%u", &v) == 1)
			t->fault_r = v;
		else if (sscanf(f, "until=%u", &v) == 1)
			t->fault_until = v;
		else if (sscanf(f, "probes=%u", &v) == 1)
			t->fault_probes = v;
		else if (sscanf(f, "slow=%u", &v) == 1)
			t->fault_slow = v;
		f = strchr(f, ',');
		f = f ? f + 1 : NULL;
	}
	if (t->fault_w || t->fault_r || t->fault_probes || t->fault_slow)
		log_warn("disk: fault injection: every %u-th write, every %u-th read fails (until "
			 "%u), the first %u probes fail, one completion every %u us",
			 t->fault_w, t->fault_r, t->fault_until, t->fault_probes, t->fault_slow);
}
#endif

/* Frees every slot (each is on exactly one log; no I/O may be in flight) and the tables. */
static void tier_free(struct tier *t)
{
	for (uint32_t i = 0; i < DISK_MAX_PATHS; i++) {
		for (uint32_t p = 0; p < POOL_MAX_PARTS; p++) {
			struct tlog *l = &t->log[i][p];

			while (l->slots.next && !list_empty(&l->slots)) {
				struct dslot *d = list_entry(l->slots.next, struct dslot, log);

				list_del(&d->log);
				free(d);
			}
		}
	}
	index_fini(&t->ix);
	free(t->probe_mem);
	free(t->free_hdrs);
	free(t->dns);
	free(t);
}

/*
 * [tenant-disk] Cuts every path's slot area into one region per tenant partition, in partition
 * order, each the same fraction of every path: the fraction asked for (--tenant ID=RAM,DISK,
 * --tenant-share RAM,DISK: bytes of the whole disk or N% of it), the disk left over split in
 * proportion to RAM among the partitions that asked for none. The cut is a function of the
 * flags alone, never stored: a restart with the same flags finds every slot in its region.
 * -EINVAL when the shares asked for exceed the disk.
 */
static int cut_disk(struct tier *t)
{
	const struct broker *b = t->b;
	uint64_t area = 0, asked = 0, ram_rest = 0, want[POOL_MAX_PARTS] = {0};
	uint32_t np = b->pool.nparts ? b->pool.nparts : 1;

	t->nparts = np;
	for (uint32_t i = 0; i < t->d.npaths; i++) {
		uint64_t end = t->d.path[i].bytes & ~(uint64_t)(SLOT_BLOCK - 1);

		area += end > SLOT_DATA_OFF ? end - SLOT_DATA_OFF : 0;
	}
	for (uint32_t p = 0; p < np; p++) {
		want[p] = b->tt.disk_frac[p] ? (uint64_t)(b->tt.disk_frac[p] * (double)area)
					     : b->tt.disk_bytes[p];
		asked += want[p];
		if (!want[p])
			ram_rest += np > 1 ? b->pool.part[p].size : 1;
	}
	if (asked > area) {
		log_error("disk: the tenants' disk shares (%llu MiB) exceed the disk (%llu MiB)",
			  (unsigned long long)(asked >> 20), (unsigned long long)(area >> 20));
		return -EINVAL;
	}
	for (uint32_t p = 0; p < np; p++)
		if (!want[p] && ram_rest)
			want[p] = (uint64_t)((double)(area - asked) *
					     (double)(np > 1 ? b->pool.part[p].size : 1) /
					     (double)ram_rest);
	for (uint32_t i = 0; i < t->d.npaths; i++) {
		uint64_t end = t->d.path[i].bytes & ~(uint64_t)(SLOT_BLOCK - 1), at = SLOT_DATA_OFF;
		uint64_t parea = end > at ? end - at : 0;

		for (uint32_t p = 0; p < np; p++) {
			struct tlog *l = &t->log[i][p];
			uint64_t len = area ? (uint64_t)((double)parea * (double)want[p] /
							 (double)area)
					    : 0;

			len &= ~(uint64_t)(SLOT_BLOCK - 1);
			if (p == np - 1 && asked + (ram_rest ? area - asked : 0) >= area)
				len = end - at; /* the last region takes the rounding */
			l->start = l->head = at;
			l->end = at + len > end ? end : at + len;
			list_init(&l->slots);
			at = l->end;
		}
	}
	for (uint32_t p = 0; np > 1 && p < np; p++)
		log_info("disk: tenant partition %u: %llu MiB of the disk", p,
			 (unsigned long long)(want[p] >> 20));
	return 0;
}

int tier_open(struct broker *b, const struct disk_cfg *c)
{
	struct tier *t = calloc(1, sizeof(*t));
	int err = -ENOMEM;

	if (!t)
		return err;
	t->b = b;
	waitq_init(&t->wait);
	for (uint32_t i = 0; i < STORE_MAX_NS; i++)
		t->ns2dns[i] = -1;
	t->qd = c->qd;
	t->dns = calloc(TIER_MAX_DNS, sizeof(*t->dns));
	t->free_hdrs = calloc(c->qd, sizeof(*t->free_hdrs));
	/* One bucket per 256 KiB of disk, grown past load 2 like the store's. */
	if (!t->dns || !t->free_hdrs || index_init(&t->ix, c->size / (256u << 10)) ||
	    posix_memalign((void **)&t->probe_mem, SLOT_BLOCK, (DISK_MAX_PATHS + 1) * SLOT_BLOCK))
		goto err_free;
	for (uint32_t i = 0; i < c->qd; i++)
		t->free_hdrs[t->nfree_hdrs++] = i;
	/* SQ: a page write is two SQEs (payload, header), so twice the page I/O depth. */
	{
		struct disk_cfg dc = *c;

		dc.qd = 2 * c->qd;
		err = disk_open(&t->d, &dc, &b->pool, b->cfg.slab_bytes, c->qd);
	}
	if (err)
		goto err_free;
	err = cut_disk(t);
	if (err)
		goto err_close;
#ifdef KVB_TEST_HOOKS
	faults_parse(t);
#endif
	if (t->d.warm) {
		err = scan(t, b->store.max_page);
		if (err)
			goto err_close;
	}
	t->on_event = (struct loop_fd){.fn = on_disk_event, .arg = t};
	err = loop_add(&b->loop, t->d.efd, &t->on_event);
	if (err)
		goto err_close;
	b->tier = t;
	b->store.demote = demote;
	b->store.demote_arg = b;
	log_info("disk: %u path(s), %llu MiB, %s I/O, queue depth %u%s, fixed buffers %s",
		 t->d.npaths, (unsigned long long)(c->size >> 20),
		 t->d.direct ? "O_DIRECT" : "buffered", t->qd, t->d.sqpoll ? ", SQPOLL" : "",
		 t->d.fixed_bufs ? "on" : "off");
	return 0;
err_close:
	disk_undo(&t->d);
	disk_close(&t->d);
err_free:
	tier_free(t);
	return err;
}

void tier_ns_forget(struct broker *b, uint32_t id)
{
	struct tier *t = b->tier;

	if (!t || id >= STORE_MAX_NS || t->ns2dns[id] < 0)
		return;
	t->dns[t->ns2dns[id]].ns = -1;
	t->ns2dns[id] = -1;
}

void tier_part_forget(struct broker *b, uint32_t part)
{
	struct tier *t = b->tier;
	struct list *pos, *tmp;

	if (!t || part >= t->nparts)
		return;
	/* Only partition part's pages are demoted into its region: all its previous tenant's. */
	for (uint32_t pi = 0; pi < t->d.npaths; pi++)
		list_for_each_safe (pos, tmp, &t->log[pi][part].slots)
			forget(t, list_entry(pos, struct dslot, log), 0);
}

void tier_close(struct broker *b, uint32_t (*resume)(struct broker *b))
{
	struct tier *t = b->tier;
	struct store *s = &b->store;
	uint64_t before, written;
	double t0 = clock_now();

	if (!t)
		return;
	/* Everything goes, so everything without a copy on disk is written first. */
	before = t->st.demotions;
	s->high_bytes = s->low_bytes = 0;
	for (;;) {
		uint32_t n = store_evict_watermark(s, REAP_MAX);

		disk_submit(&t->d);
		/* A probe in flight reads into probe_mem: it must land before that is freed. */
		if (!n && !(t->writes + t->reads + t->probe_pending))
			break;
		if (t->writes + t->reads + t->probe_pending)
			disk_reap(&t->d, REAP_MAX, 1, on_cqe, t);
		waitq_wake(&t->wait, &b->runq);
		if (resume)
			resume(b);
	}
	written = t->st.demotions - before;
	if (written)
		log_info("disk: wrote %llu pages at shutdown in %.2f s",
			 (unsigned long long)written, clock_now() - t0);
	waitq_wake(&t->wait, &b->runq);
	if (resume)
		resume(b);
	log_info("disk: %s, %llu pages on disk, %llu demotions, %llu promotions, %llu errors, "
		 "%llu corrupt, %llu dropped",
		 state_name(t), (unsigned long long)t->ix.count,
		 (unsigned long long)t->st.demotions, (unsigned long long)t->st.promotions,
		 (unsigned long long)t->st.errors, (unsigned long long)t->st.corrupt,
		 (unsigned long long)t->st.dropped);
	b->store.demote = NULL;
	disk_close(&t->d);
	tier_free(t);
	b->tier = NULL;
}

/* ---- stats ---- */

struct cJSON *tier_json(const struct broker *b)
{
	const struct tier *t = b->tier;
	static const struct tier_stats zero;
	const struct tier_stats *st = t ? &t->st : &zero;
	cJSON *o = cJSON_CreateObject(), *paths = cJSON_CreateArray();
	uint64_t total = 0;

	cJSON_AddStringToObject(o, "state", state_name(t));
	if (t && t->fail_why)
		cJSON_AddStringToObject(o, "failed_because", t->fail_why);
	if (t && t->state == TIER_FAILED)
		cJSON_AddNumberToObject(o, "next_probe_s",
					t->probe_at > clock_now() ? t->probe_at - clock_now() : 0);
	cJSON_AddNumberToObject(o, "recoveries", t ? (double)t->recoveries : 0);
	cJSON_AddNumberToObject(o, "probe_failures", t ? (double)t->probe_failures : 0);
	cJSON_AddBoolToObject(o, "direct", t && t->d.direct);
	for (uint32_t i = 0; t && i < t->d.npaths; i++) {
		const struct disk_path *p = &t->d.path[i];
		char name[3 * sizeof(p->name) + 1];

		/* The stats document is valid UTF-8 throughout (protocol.md §7). */
		text_utf8(name, sizeof(name), p->name, sizeof(p->name));
		cJSON_AddItemToArray(paths, cJSON_CreateString(name));
		for (uint32_t j = 0; j < t->nparts; j++)
			total += t->log[i][j].end - t->log[i][j].start;
	}
	cJSON_AddItemToObject(o, "paths", paths);
	cJSON_AddNumberToObject(o, "bytes_total", (double)total);
	cJSON_AddNumberToObject(o, "bytes_used", t ? (double)t->bytes_used : 0);
	cJSON_AddNumberToObject(o, "pages", t ? (double)t->ix.count : 0);
	cJSON_AddNumberToObject(o, "reads", (double)st->reads);
	cJSON_AddNumberToObject(o, "writes", (double)st->writes);
	cJSON_AddNumberToObject(o, "read_bytes", (double)st->read_bytes);
	cJSON_AddNumberToObject(o, "write_bytes", (double)st->write_bytes);
	cJSON_AddNumberToObject(o, "errors", (double)st->errors);
	cJSON_AddNumberToObject(o, "corrupt", (double)st->corrupt);
	cJSON_AddNumberToObject(o, "torn", (double)st->torn);
	cJSON_AddNumberToObject(o, "dropped", (double)st->dropped);
	cJSON_AddNumberToObject(o, "demotions", (double)st->demotions);
	cJSON_AddNumberToObject(o, "promotions", (double)st->promotions);
	cJSON_AddNumberToObject(o, "scan_seconds", st->scan_seconds);
	cJSON_AddNumberToObject(o, "scan_bytes", (double)st->scan_bytes);
	cJSON_AddNumberToObject(o, "joined", (double)st->joined);
	cJSON_AddNumberToObject(o, "parked", (double)st->parked);
	cJSON_AddNumberToObject(o, "index_lookups", (double)st->index_lookups);
	cJSON_AddNumberToObject(o, "queue_depth", t ? t->qd : 0);
	cJSON_AddNumberToObject(o, "reads_inflight", t ? t->reads : 0);
	cJSON_AddNumberToObject(o, "writes_inflight", t ? t->writes : 0);
	cJSON_AddBoolToObject(o, "fixed_buffers", t && t->d.fixed_bufs);
	cJSON_AddBoolToObject(o, "sqpoll", t && t->d.sqpoll);
	cJSON_AddBoolToObject(o, "warm", t && t->d.warm);
	return o;
}

uint32_t tier_nparts(const struct broker *b)
{
	return b->tier ? b->tier->nparts : 0;
}

struct cJSON *tier_part_json(const struct broker *b, uint32_t part)
{
	const struct tier *t = b->tier;
	cJSON *o = cJSON_CreateObject();
	uint64_t total = 0;

	for (uint32_t i = 0; t && part < t->nparts && i < t->d.npaths; i++)
		total += t->log[i][part].end - t->log[i][part].start;
	cJSON_AddNumberToObject(o, "partition", part);
	cJSON_AddNumberToObject(o, "bytes_total", (double)total);
	cJSON_AddNumberToObject(o, "bytes_used",
				t && part < t->nparts ? (double)t->part_used[part] : 0);
	cJSON_AddNumberToObject(o, "pages",
				t && part < t->nparts ? (double)t->part_slots[part] : 0);
	return o;
}
