// SPDX-License-Identifier: MIT
/*
 * orphan.c - leases that outlive their broker: a page a client leased from a broker that died
 * (or handed over) is never reused under that client.
 *
 * A lease is a pointer into the client's map of the pool. The pool survives the broker (the
 * keeper, keeper.c) and the next broker adopts it (adopt.c), so the client's map and the new
 * broker's pool are the same memory: a slot the new broker reused would show the lease another
 * page's bytes, with no error anywhere. So the new broker must learn, before it frees or
 * rewrites any slot, which pages the old one's clients still lease, and hold them until each
 * client has let go.
 *
 * [records] What a session's leases are is kept outside the broker, by the keeper: at attach,
 * a record of the session (tag: this broker's run id and the session's id; its partition) with
 * three fds: its ring region (its hazard table: leases the client took itself, wire.h
 * [hazard]), its ledger (a memfd of our own that mirrors the ids of the leases we granted it:
 * word 0 the count, then the ids, written entry first and count last, so a crash between the
 * two leaves at worst an id twice, an extra pin, never a missing one) and its pidfd (whether
 * its process lives). The record is deleted when the session ends, except when the broker
 * hands over (--takeover): then its clients' leases must hold for the next broker too.
 *
 * [orphans] A broker that adopts the pool lists the records before it installs any page; a
 * record whose process lives becomes an orphan: every page it names (by lease id in the
 * ledger, which carries the page's generation; by location in the hazard table, within its
 * partition only) is pinned as it is installed, so it is neither evicted, nor freed as an older
 * copy of its key, nor rewritten. The orphan lets go, and its pins go, when its process exits
 * (its pidfd, in the loop) or when the client library has taken private copies of its leases
 * (client/conn.c [retire]: it writes KVB_RETIRED_MAGIC into the old region's
 * KVB_REGION_RETIRED word once every lease it held of the old broker reads from memory of its
 * own), looked at every tick. Only then is its record deleted from the keeper, so a crash of
 * this broker too hands the orphan on. A client that scribbles on its region can only pin
 * pages of its own partition, at most KVB_HZ_ENTRIES by its table and --max-leases by the
 * ledger, which is ours.
 *
 * Under systemd the fd store holds the pool instead of a keeper, and the records too
 * (sdnotify.c: three fds per session, named for its tag); with --no-pool-keep the pool is not
 * adopted, so no lease of the dead broker's can meet a page of the next one's.
 *
 * Loop thread, and the start-up thread before the loop runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "broker.h"
#include "log.h"
#include "orphan.h"
#include "proto.h"
#include "sdnotify.h"

/* A lease of an old broker that a page may answer to, and the orphan that holds it. */
struct want {
	uint64_t key; /* a lease id (ledger), or part << 56 ^ loc | 1 (hazard entry) */
	struct orphan *o;
};

struct orphan {
	struct list link;
	uint64_t tag;
	uint32_t part;
	int pidfd;
	struct loop_fd on_pid;
	struct broker *b;
	void *region;
	uint64_t region_size;
	const kvb_atomic_u32 *retired;
	int fds[2]; /* its region and ledger, for a keeper that replaces one */
	int kept;   /* the current keeper (or fd store) has its record */
	struct page **pins;
	uint32_t npins, cap;
};

static struct {
	struct want *w;
	uint32_t n, cap;
} wants;

static uint64_t hz_key(uint32_t part, uint64_t loc_or1)
{
	return ((uint64_t)part << 56) ^ loc_or1 ^ (1ull << 63);
}

static int want_cmp(const void *a, const void *b)
{
	const struct want *x = a, *y = b;

	return x->key < y->key ? -1 : x->key > y->key;
}

static void want_add(uint64_t key, struct orphan *o)
{
	if (wants.n == wants.cap) {
		uint32_t cap = wants.cap ? 2 * wants.cap : 256;
		struct want *w = realloc(wants.w, cap * sizeof(*w));

		if (!w)
			return; /* counted below as a lease we could not hold */
		wants.w = w;
		wants.cap = cap;
	}
	wants.w[wants.n++] = (struct want){key, o};
}

/* ---- the sessions of this broker [records] ---- */

static uint64_t session_tag(const struct broker *b, const struct session *s)
{
	return (uint64_t)b->run_id << 32 | s->id;
}

/* [records] Kept by the keeper, or by systemd's fd store when it holds the pool. */
static int rec_add(struct broker *b, uint64_t tag, uint32_t part, const int *fds, uint32_t n)
{
	if (b->fdstore)
		return sdn_store_record(tag, part, fds, n);
	return keeper_rec_add(&b->kl, tag, part, fds, n);
}

static void rec_del(struct broker *b, uint64_t tag, uint32_t part)
{
	if (b->fdstore)
		sdn_remove_record(tag, part);
	else
		(void)keeper_rec_del(&b->kl, tag);
}

static uint64_t ledger_bytes(const struct broker *b)
{
	return (uint64_t)(1 + b->cfg.max_leases) * sizeof(uint64_t);
}

/* [records] Whether a keeper (or the fd store) takes records now. */
static int rec_holder(const struct broker *b)
{
	return b->fdstore || (b->keeper && b->kl.fd >= 0);
}

/* [records] Sends s's record to the current holder; counts it pending when it cannot. */
static void session_send(struct broker *b, struct session *s)
{
	int fds[KEEPER_REC_FDS] = {s->rec_fd[0], s->rec_fd[1], s->pidfd};
	uint32_t n = s->pidfd >= 0 ? 3 : 2;
	int was = s->rec_kept;

	s->rec_kept = rec_holder(b) && !rec_add(b, session_tag(b, s), s->part, fds, n);
	if (was != s->rec_kept) {
		if (s->rec_kept)
			b->orphan_st.pending--;
		else
			b->orphan_st.pending++;
	}
}

void orphan_session_keep(struct broker *b, struct session *s, int region_fd)
{
	int lfd;
	uint64_t *l;

	s->rec_fd[0] = s->rec_fd[1] = -1;
	if (!b->cfg.keep)
		return; /* nobody adopts this pool: its leases die with it */
	lfd = memfd_create("kvbroker-ledger", MFD_CLOEXEC);
	if (lfd < 0)
		goto fail;
	if (ftruncate(lfd, (off_t)ledger_bytes(b)) < 0)
		goto fail_close;
	l = mmap(NULL, ledger_bytes(b), PROT_READ | PROT_WRITE, MAP_SHARED, lfd, 0);
	if (l == MAP_FAILED)
		goto fail_close;
	s->rec_fd[0] = fcntl(region_fd, F_DUPFD_CLOEXEC, 3);
	if (s->rec_fd[0] < 0) {
		munmap(l, ledger_bytes(b));
		goto fail_close;
	}
	s->rec_fd[1] = lfd;
	s->ledger = l;
	/* Kept by us too, so that a keeper that replaces a dead one gets it (watch.c). */
	b->orphan_st.pending++;
	session_send(b, s);
	return;
fail_close:
	close(lfd);
fail:
	b->orphan_st.unkept++;
	log_warn("client %u: its leases would not outlive this broker (%s): a broker that "
		 "adopts the pool after a crash may reuse what it leases",
		 s->id, strerror(errno));
}

void orphan_ledger(struct broker *b, struct session *s, uint32_t i)
{
	kvb_atomic_u64 *l = (kvb_atomic_u64 *)s->ledger;

	(void)b;
	if (!l)
		return;
	if (i < s->nleases)
		kvb_store64_relaxed(&l[1 + i], s->leases[i]);
	/* After the entry: a crash between the two leaves an id twice, never one missing. */
	kvb_store64_release(&l[0], s->nleases);
}

void orphan_session_drop(struct broker *b, struct session *s)
{
	if (!s->ledger)
		return;
	/* [records] Handed over: the next broker holds what our clients lease. */
	if (!b->handover && s->rec_kept)
		rec_del(b, session_tag(b, s), s->part);
	if (!s->rec_kept)
		b->orphan_st.pending--;
	s->rec_kept = 0;
	bg_unmap(b->bg, s->ledger, ledger_bytes(b)); /* as its region: off the loop */
	s->ledger = NULL;
	for (int i = 0; i < 2; i++)
		if (s->rec_fd[i] >= 0)
			close(s->rec_fd[i]);
	s->rec_fd[0] = s->rec_fd[1] = -1;
}

/* ---- the sessions of the broker before [orphans] ---- */

static void orphan_free(struct broker *b, struct orphan *o, const char *why)
{
	for (uint32_t i = 0; i < o->npins; i++)
		store_unpin(&b->store, o->pins[i]);
	b->orphan_st.pins -= o->npins;
	if (why)
		log_info("orphan %llx: %s: its %u leased page(s) are free again",
			 (unsigned long long)o->tag, why, o->npins);
	if (!b->handover && o->kept)
		rec_del(b, o->tag, o->part);
	if (!o->kept)
		b->orphan_st.pending--;
	for (int i = 0; i < 2; i++)
		if (o->fds[i] >= 0)
			close(o->fds[i]);
	if (o->pidfd >= 0) {
		if (b->loop.epfd >= 0)
			loop_del(&b->loop, o->pidfd);
		close(o->pidfd);
	}
	if (o->region)
		munmap(o->region, o->region_size);
	list_del(&o->link);
	b->orphan_st.live--;
	free(o->pins);
	free(o);
}

static int process_gone(int pidfd)
{
	struct pollfd p = {.fd = pidfd, .events = POLLIN};

	return pidfd >= 0 && poll(&p, 1, 0) > 0;
}

/* The ids of the ledger and the entries of the hazard table, as wants. */
static void orphan_wants(struct orphan *o, int lfd, uint32_t max_leases)
{
	struct kvb_region_hdr h;
	struct stat st;

	if (lfd >= 0 && fstat(lfd, &st) == 0 && st.st_size >= (off_t)sizeof(uint64_t)) {
		uint64_t *l = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, lfd, 0);

		if (l != MAP_FAILED) {
			uint64_t n = l[0], room = (uint64_t)st.st_size / sizeof(uint64_t) - 1;

			if (n > room)
				n = room;
			if (n > max_leases)
				n = max_leases;
			for (uint64_t i = 0; i < n; i++)
				want_add(l[1 + i], o);
			munmap(l, (size_t)st.st_size);
		}
	}
	if (!o->region)
		return;
	/* The region is the client's to write: read its header once, and check it. */
	memcpy(&h, o->region, sizeof(h));
	if (kvb_region_check(&h, o->region_size) || !(h.features & KVB_FEAT_HAZARDS))
		return;
	for (uint32_t i = 0; i < KVB_HZ_ENTRIES; i++) {
		const kvb_atomic_u64 *e =
			(const kvb_atomic_u64 *)(const void *)((const char *)o->region +
							       kvb_region_hz_off(&h) +
							       KVB_HZ_TABLE) +
			i;
		uint64_t v = kvb_load64_relaxed(e);

		if (v & 1)
			want_add(hz_key(o->part, v), o);
	}
}

static void on_record(void *arg, uint64_t tag, uint32_t part, int *fds, uint32_t n)
{
	struct broker *b = arg;
	struct orphan *o = calloc(1, sizeof(*o));
	struct stat st;
	int pidfd = n > 2 ? fds[2] : -1;

	if (!o || n < 2 || process_gone(pidfd)) {
		/* Nobody is left to read what it leased (or we cannot tell: kept, see below). */
		if (o && n >= 2 && process_gone(pidfd))
			rec_del(b, tag, part);
		else if (o)
			b->orphan_st.unkept++;
		for (uint32_t i = 0; i < n; i++)
			close(fds[i]);
		free(o);
		return;
	}
	o->b = b;
	o->tag = tag;
	o->part = part;
	o->pidfd = pidfd;
	o->fds[0] = fds[0];
	o->fds[1] = fds[1];
	o->kept = 1; /* the holder we listed it from keeps it */
	if (fstat(fds[0], &st) == 0 && st.st_size > 0) {
		o->region = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fds[0], 0);
		if (o->region == MAP_FAILED)
			o->region = NULL;
		else
			o->region_size = (uint64_t)st.st_size;
	}
	if (o->region && o->region_size >= KVB_REGION_RETIRED + sizeof(uint32_t))
		o->retired = (const kvb_atomic_u32 *)(const void *)((const char *)o->region +
								    KVB_REGION_RETIRED);
	orphan_wants(o, fds[1], b->cfg.max_leases ? b->cfg.max_leases : UINT32_MAX);
	list_add_tail(&b->orphans, &o->link);
	b->orphan_st.live++;
}

/* [records] Of a pool that was not adopted: nobody can read what they leased any more. */
static void drop_record(void *arg, uint64_t tag, uint32_t part, int *fds, uint32_t n)
{
	(void)arg;
	sdn_remove_record(tag, part); /* only the store's are left to drop: a keeper's went */
	while (n)
		close(fds[--n]);
}

int orphan_load(struct broker *b)
{
	int n;

	if (!b->pool.adopted) {
		(void)sdn_records(drop_record, b);
		return 0;
	}
	if (b->fdstore)
		n = sdn_records(on_record, b);
	else if (b->kl.fd >= 0)
		n = keeper_rec_list(&b->kl, on_record, b);
	else
		return 0;
	if (n < 0) {
		log_warn("adopt: the keeper's session records: %s: leases of the previous "
			 "broker's clients are not held",
			 strerror(-n));
		return n;
	}
	if (wants.n)
		qsort(wants.w, wants.n, sizeof(*wants.w), want_cmp);
	if (b->orphan_st.live)
		log_info("adopt: %u client(s) of the previous broker live on, with %u lease(s) "
			 "to hold until they let go",
			 b->orphan_st.live, wants.n);
	return 0;
}

static void pin_for(struct broker *b, struct orphan *o, struct page *pg)
{
	if (o->npins == o->cap) {
		uint32_t cap = o->cap ? 2 * o->cap : 16;
		struct page **p = realloc(o->pins, cap * sizeof(*p));

		if (!p)
			return;
		o->pins = p;
		o->cap = cap;
	}
	store_pin(&b->store, pg);
	o->pins[o->npins++] = pg;
	b->orphan_st.pins++;
}

static void pin_wanted(struct broker *b, uint64_t key, struct page *pg)
{
	struct want k = {key, NULL}, *w;

	if (!wants.n)
		return;
	w = bsearch(&k, wants.w, wants.n, sizeof(*w), want_cmp);
	if (!w)
		return;
	while (w > wants.w && w[-1].key == key)
		w--;
	for (; w < wants.w + wants.n && w->key == key; w++)
		pin_for(b, w->o, pg);
}

void orphan_adopted(struct broker *b, struct page *pg)
{
	pin_wanted(b, store_lease_id(pg), pg);
	pin_wanted(b, hz_key(store_part_of(&b->store, pg), store_loc(&b->store, pg) | 1), pg);
}

static void on_orphan_pid(void *arg)
{
	struct orphan *o = arg;

	orphan_free(o->b, o, "its process exited");
}

void orphan_start(struct broker *b)
{
	struct list *pos, *tmp;

	free(wants.w);
	wants.w = NULL;
	wants.n = wants.cap = 0;
	list_for_each_safe (pos, tmp, &b->orphans) {
		struct orphan *o = list_entry(pos, struct orphan, link);

		if (!o->npins) {
			orphan_free(b, o, NULL); /* it leased nothing we adopted */
			continue;
		}
		o->on_pid = (struct loop_fd){.fn = on_orphan_pid, .arg = o};
		if (o->pidfd >= 0 && loop_add(&b->loop, o->pidfd, &o->on_pid) < 0) {
			close(o->pidfd); /* watched by the tick's look at its word only */
			o->pidfd = -1;
		}
	}
	orphan_tick(b);
}

void orphan_tick(struct broker *b)
{
	struct list *pos, *tmp;

	list_for_each_safe (pos, tmp, &b->orphans) {
		struct orphan *o = list_entry(pos, struct orphan, link);

		if (process_gone(o->pidfd))
			orphan_free(b, o, "its process exited");
		else if (o->retired && kvb_load_acquire(o->retired) == KVB_RETIRED_MAGIC)
			orphan_free(b, o, "the client holds copies of its leases now");
	}
}

void orphan_fini(struct broker *b)
{
	while (!list_empty(&b->orphans))
		orphan_free(b, list_entry(b->orphans.next, struct orphan, link), NULL);
	free(wants.w);
	wants.w = NULL;
	wants.n = wants.cap = 0;
}

void orphan_holder_lost(struct broker *b)
{
	struct list *pos;

	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->ledger && s->rec_kept) {
			s->rec_kept = 0;
			b->orphan_st.pending++;
		}
	}
	list_for_each (pos, &b->orphans) {
		struct orphan *o = list_entry(pos, struct orphan, link);

		if (o->kept) {
			o->kept = 0;
			b->orphan_st.pending++;
		}
	}
}

void orphan_resend(struct broker *b)
{
	struct list *pos;

	list_for_each (pos, &b->sessions) {
		struct session *s = list_entry(pos, struct session, link);

		if (s->ledger && !s->rec_kept)
			session_send(b, s);
	}
	list_for_each (pos, &b->orphans) {
		struct orphan *o = list_entry(pos, struct orphan, link);
		int fds[KEEPER_REC_FDS] = {o->fds[0], o->fds[1], o->pidfd};

		if (o->kept || !rec_holder(b))
			continue;
		o->kept = !rec_add(b, o->tag, o->part, fds, o->pidfd >= 0 ? 3 : 2);
		if (o->kept)
			b->orphan_st.pending--;
	}
}

int orphan_in_part(struct broker *b, uint32_t part)
{
	struct list *pos;

	list_for_each (pos, &b->orphans)
		if (list_entry(pos, struct orphan, link)->part == part)
			return 1;
	return 0;
}

uint32_t orphan_run_id(void)
{
	uint32_t id = 0;

	while (!id && getrandom(&id, sizeof(id), 0) != (ssize_t)sizeof(id))
		;
	return id ? id : 1;
}
