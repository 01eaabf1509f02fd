// SPDX-License-Identifier: MIT
/*
 * tenant.c - tenants and their pool partitions [tenant-part].
 *
 * The trust boundary is the tenant: a uid (--tenants uid) or a primary gid (--tenants gid),
 * taken from SO_PEERCRED, which the peer cannot forge. Everything a tenant stores is its own:
 *   - namespace identity hashes the tenant key (ns.c), so the same model opened by two tenants
 *     is two namespaces: LOOKUP, GET, ACQUIRE, DELETE and PUT of one never reach the other's
 *     pages, and a PUT can never be answered "already stored" by another tenant's bytes;
 *   - its pages live in its own partition of the pool, separate memfds (pool.h), and its
 *     clients are handed only those: a read-only map of one memfd cannot show another's bytes;
 *   - placement and eviction stay inside the partition (store.c): another tenant's flood
 *     evicts only its own pages, and takes no memory from a tenant below its guarantee.
 * Within one tenant every client is trusted alike: the first writer of a key wins, as before.
 *
 * Why a credential and not a token: processes of one uid can ptrace one another and read each
 * other's memory, fds and token files, so no attach-time secret can separate them; a gid
 * groups several uids into one tenant (one job's engines under per-rank users). Engines that
 * must not trust one another run under different uids.
 *
 * [tenant-lend] Shares are guarantees, not walls. There are POOL_MAX_PARTS partitions, each
 * virtually the whole pool (sparse memfds: pool.h); memory is what the store's slabs take from
 * one budget, the pool's size, and give back when they empty (store.c). A tenant's share
 * (--tenant ID=SIZE for named ones, bound at start-up; --tenant-share, by default a quarter of
 * the rest, for the others from their first attach; kvbctl tenant-share at run time) is what it
 * can always reclaim: its guarantee, the share scaled down in proportion while the shares of
 * the tenants bound and not released add up to more than the budget. Memory nobody uses is
 * lent: a tenant stores beyond its guarantee while the budget has room, and a tenant under its
 * guarantee takes a borrower's slabs back (oldest page's first) when it has none. A tenant
 * whose last client left --tenant-idle ago is released (guarantee 0): its pages stay while
 * the pool has room and are the first taken when anyone needs memory; it finds its partition
 * again when it comes back. Why lending needs no copy of a tenant's page into another's memory:
 * what moves between partitions is the budget, a page stays in its own memfd.
 *
 * [tenant-rebind] A partition stays its tenant's, released or not, until a new tenant finds
 * all POOL_MAX_PARTS bound: it then takes the released one idle longest (tenant_rebind_pick;
 * not one named by --tenant or given a share at run time), in fresh memfds (rebind.c): a
 * client that detached may still map the old ones, so another tenant's pages must never lie
 * in them. The old tenant's pages and namespaces go; if it comes back it binds a partition as
 * a new tenant does. A partition with anything in use (a pinned page, an open namespace, a
 * previous broker's client leasing there) is not taken; with none to take, a new tenant is
 * refused -EUSERS (the log names the cause); root and the broker's uid still attach, for
 * inspection, and never take a released tenant's partition.
 *
 * [tenant-disk] A partition owns a share of the disk tier too (--tenant ID=RAM,DISK,
 * --tenant-share RAM,DISK; by default the disk in proportion to RAM): its own region of every
 * cache path, a log of its own (tier.c), so a tenant over its disk share wraps over its own
 * oldest pages and a flood cannot drop another tenant's disk pages.
 */
#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "clock.h"
#include "log.h"
#include "parse.h"
#include "size.h"
#include "store.h"
#include "tenant.h"
#include "text.h"

const char *tenant_mode_name(int mode)
{
	return mode == TENANTS_UID ? "uid" : mode == TENANTS_GID ? "gid" : "none";
}

int tenant_parse_mode(const char *arg, int *mode)
{
	if (!strcmp(arg, "none"))
		*mode = TENANTS_NONE;
	else if (!strcmp(arg, "uid"))
		*mode = TENANTS_UID;
	else if (!strcmp(arg, "gid"))
		*mode = TENANTS_GID;
	else
		return -EINVAL;
	return 0;
}

/* "N%" of a whole, or a size. */
static int parse_amount(const char *arg, uint64_t *bytes, double *frac)
{
	size_t n = strlen(arg);
	uint32_t pct;

	*bytes = 0;
	*frac = 0;
	if (n > 1 && arg[n - 1] == '%') {
		char tmp[16];

		if (n > sizeof(tmp))
			return -EINVAL;
		memcpy(tmp, arg, n - 1);
		tmp[n - 1] = '\0';
		if (parse_u32(tmp, &pct) || !pct || pct > 100)
			return -EINVAL;
		*frac = pct / 100.0;
		return 0;
	}
	return size_parse(arg, bytes) || !*bytes ? -EINVAL : 0;
}

int tenant_parse_amount(const char *arg, uint64_t *bytes, double *frac)
{
	return parse_amount(arg, bytes, frac);
}

/* "RAM" or "RAM,DISK": each N% or a size; no DISK leaves *disk and *disk_frac 0. */
static int parse_ram_disk(const char *arg, uint64_t *bytes, double *frac, uint64_t *disk,
			  double *disk_frac)
{
	char buf[64];
	char *comma;

	*disk = 0;
	*disk_frac = 0;
	if (snprintf(buf, sizeof(buf), "%s", arg) >= (int)sizeof(buf))
		return -EINVAL;
	comma = strchr(buf, ',');
	if (comma) {
		*comma = '\0';
		if (parse_amount(comma + 1, disk, disk_frac))
			return -EINVAL;
	}
	return parse_amount(buf, bytes, frac);
}

int tenant_parse_share(const char *arg, struct tenant_cfg *c)
{
	return parse_ram_disk(arg, &c->share, &c->share_frac, &c->share_disk, &c->share_disk_frac);
}

uint32_t tenant_key(int mode, uid_t uid, gid_t gid)
{
	/* + 1: key 0 is "no tenants", whose identities every existing cache already holds. */
	return mode == TENANTS_UID   ? (uint32_t)uid + 1
	       : mode == TENANTS_GID ? (uint32_t)gid + 1
				     : 0;
}

/* The uid or gid an entry names: a number or a user (group) name. */
static int resolve_id(int mode, const char *name, uint32_t *id)
{
	if (!parse_u32(name, id))
		return 0;
	if (mode == TENANTS_UID) {
		struct passwd *pw = getpwnam(name);

		if (!pw)
			return -ENOENT;
		*id = pw->pw_uid;
	} else {
		struct group *g = getgrnam(name);

		if (!g)
			return -ENOENT;
		*id = g->gr_gid;
	}
	return 0;
}

int tenant_resolve(int mode, const char *name, uint32_t *id)
{
	return resolve_id(mode, name, id);
}

int tenant_plan(const struct tenant_cfg *c, uint64_t pool_bytes, struct pool_cfg *pc,
		struct tenant_table *tt)
{
	uint64_t used = 0, rest, share;
	uint32_t n = 0;

	memset(tt, 0, sizeof(*tt));
	tt->mode = c->mode;
	tt->idle_s = c->idle_s; /* options.c defaults it to TENANT_IDLE_DEFAULT */
	tt->budget = pool_bytes;
	pc->nparts = 0;
	pc->sparse = 0;
	if (c->mode == TENANTS_NONE) {
		if (c->nlisted || c->share || c->share_frac || c->share_disk ||
		    c->share_disk_frac) {
			fprintf(stderr, "kvbrokerd: --tenant and --tenant-share need --tenants\n");
			return -EINVAL;
		}
		tt->n = 1;
		tt->t[0].used = 1;
		tt->t[0].share = tt->t[0].guarantee = pool_bytes;
		return 0;
	}
	for (uint32_t i = 0; i < c->nlisted; i++) {
		char buf[128], *eq;
		uint64_t bytes, disk;
		double frac, disk_frac;
		uint32_t id;

		snprintf(buf, sizeof(buf), "%s", c->listed_arg[i]);
		eq = strchr(buf, '=');
		if (!eq || eq == buf) {
			fprintf(stderr,
				"kvbrokerd: --tenant %s: want ID=RAM[,DISK], each SIZE or N%%\n",
				buf);
			return -EINVAL;
		}
		*eq = '\0';
		if (parse_ram_disk(eq + 1, &bytes, &frac, &disk, &disk_frac)) {
			fprintf(stderr, "kvbrokerd: --tenant %s: bad size '%s'\n", buf, eq + 1);
			return -EINVAL;
		}
		if (resolve_id(c->mode, buf, &id)) {
			fprintf(stderr, "kvbrokerd: --tenant: no %s '%s'\n",
				c->mode == TENANTS_UID ? "user" : "group", buf);
			return -EINVAL;
		}
		bytes = frac ? (uint64_t)(frac * (double)pool_bytes) : bytes;
		for (uint32_t j = 0; j < n; j++) {
			if (tt->t[j].key == tenant_key(c->mode, id, id)) {
				fprintf(stderr, "kvbrokerd: --tenant %s listed twice\n", buf);
				return -EINVAL;
			}
		}
		if (bytes < TENANT_MIN_BYTES) {
			fprintf(stderr, "kvbrokerd: --tenant %s: a share below %llu MiB\n", buf,
				(unsigned long long)(TENANT_MIN_BYTES >> 20));
			return -EINVAL;
		}
		tt->t[n] = (struct tenant){
			.key = tenant_key(c->mode, id, id), .listed = 1, .used = 1, .share = bytes};
		tt->disk_bytes[n] = disk;
		tt->disk_frac[n] = disk_frac;
		n++;
		used += bytes;
	}
	if (used > pool_bytes) {
		fprintf(stderr, "kvbrokerd: --tenant shares exceed --pool\n");
		return -EINVAL;
	}
	rest = pool_bytes - used;
	share = c->share_frac ? (uint64_t)(c->share_frac * (double)pool_bytes) : c->share;
	if (share && share < TENANT_MIN_BYTES) {
		fprintf(stderr, "kvbrokerd: --tenant-share: a share below %llu MiB\n",
			(unsigned long long)(TENANT_MIN_BYTES >> 20));
		return -EINVAL;
	}
	if (share > pool_bytes) {
		fprintf(stderr, "kvbrokerd: --tenant-share exceeds --pool\n");
		return -EINVAL;
	}
	/* [tenant-lend] By default the rest in TENANT_SLOTS_DEFAULT shares; more tenants than
	 * that still attach, their guarantees scaled down (tenant_guarantees). */
	if (!share)
		share = rest / TENANT_SLOTS_DEFAULT;
	if (share < TENANT_MIN_BYTES)
		share = pool_bytes < TENANT_MIN_BYTES ? pool_bytes : TENANT_MIN_BYTES;
	tt->share_default = share;
	/*
	 * [tenant-lend] Every partition there can be, each virtually the size of the pool: its
	 * memory is taken slab by slab from the budget (store.c), so a partition costs nothing
	 * until its tenant stores.
	 */
	for (uint32_t i = 0; i < POOL_MAX_PARTS; i++) {
		if (i >= n) {
			tt->disk_bytes[i] = c->share_disk;
			tt->disk_frac[i] = c->share_disk_frac;
			tt->t[i].share = share;
		}
		pc->part_size[i] = pool_bytes;
		pc->part_share[i] = tt->t[i].share;
	}
	pc->nparts = POOL_MAX_PARTS;
	pc->sparse = 1;
	tt->n = POOL_MAX_PARTS;
	tenant_guarantees(tt, 0);
	return 0;
}

int tenant_guarantees(struct tenant_table *tt, double now)
{
	uint64_t sum = 0;
	int changed = 0;

	if (tt->mode == TENANTS_NONE)
		return 0;
	for (uint32_t p = 0; p < tt->n; p++) {
		struct tenant *t = &tt->t[p];

		if (t->used && !t->released && !t->clients && t->left_at && now > 0 &&
		    now - t->left_at >= tt->idle_s) {
			t->released = 1;
			log_info("tenant %s %u: no client for %.0f s (--tenant-idle): its share is "
				 "released; its pages stay while the pool has room and are evicted "
				 "first when another tenant needs it",
				 tenant_mode_name(tt->mode), t->key - 1, now - t->left_at);
		}
		if (t->used && !t->released)
			sum += t->share;
	}
	for (uint32_t p = 0; p < tt->n; p++) {
		struct tenant *t = &tt->t[p];
		uint64_t g = 0;

		if (t->used && !t->released)
			g = sum > tt->budget ? (uint64_t)((double)t->share * (double)tt->budget /
							  (double)sum)
					     : t->share;
		changed |= g != t->guarantee;
		t->guarantee = g;
	}
	return changed;
}

int tenant_set_share(struct tenant_table *tt, uint32_t key, uint64_t bytes)
{
	uint32_t p, free_part = tt->n;

	if (bytes && bytes < TENANT_MIN_BYTES)
		return -EINVAL;
	for (p = 0; p < tt->n; p++) {
		if (tt->t[p].used && tt->t[p].key == key)
			break;
		if (!tt->t[p].used && free_part == tt->n)
			free_part = p;
	}
	if (p == tt->n) {
		if (free_part == tt->n)
			return -EUSERS;
		p = free_part;
		/* Bound now, as --tenant binds at start-up: its first client finds it here. */
		tt->t[p] = (struct tenant){.key = key, .used = 1, .listed = 1};
	}
	tt->t[p].share = bytes ? bytes : tt->share_default;
	tt->t[p].share_set = bytes != 0;
	return (int)p;
}

int tenant_attach(struct tenant_table *tt, uint32_t key, int *released)
{
	uint32_t free_part = tt->n;

	*released = 0;
	for (uint32_t p = 0; p < tt->n; p++) {
		if (tt->t[p].used && tt->t[p].key == key) {
			tt->t[p].clients++;
			tt->t[p].attaches++;
			tt->t[p].left_at = 0;
			/* [tenant-lend] Back: its partition (and what is left of its pages) and its
			 * guarantee again. */
			tt->t[p].released = 0;
			return (int)p;
		}
		if (!tt->t[p].used && free_part == tt->n)
			free_part = p;
		*released |= tt->t[p].released;
	}
	if (free_part == tt->n)
		return -EUSERS;
	return tenant_bind(tt, free_part, key);
}

int tenant_bind(struct tenant_table *tt, uint32_t part, uint32_t key)
{
	/* A free partition keeps the share planned for it; a re-bound one had the default. */
	uint64_t share = tt->t[part].share ? tt->t[part].share : tt->share_default;

	tt->t[part] = (struct tenant){
		.key = key, .used = 1, .clients = 1, .attaches = 1, .share = share, .guarantee = 0};
	return (int)part;
}

int tenant_rebind_pick(const struct tenant_table *tt, uint32_t skip)
{
	int best = -1;

	for (uint32_t p = 0; p < tt->n; p++) {
		const struct tenant *t = &tt->t[p];

		/* The operator's word stays with its tenant: a share named at start-up or set at
		 * run time keeps its partition. */
		if (!t->used || !t->released || t->clients || t->listed || t->share_set ||
		    (skip & (1u << p)))
			continue;
		if (best < 0 || t->left_at < tt->t[best].left_at)
			best = (int)p;
	}
	return best;
}

void tenant_apply(const struct tenant_table *tt, struct pool *p, struct store *s)
{
	if (!p->sparse)
		return;
	for (uint32_t i = 0; i < tt->n && i < p->nparts; i++) {
		p->part[i].size = tt->t[i].share;
		s->part[i].guarantee = tt->t[i].guarantee;
	}
}

#define TENANT_TICK_S 0.25
#define TENANT_SCRUB_S 1.0 /* eight fstat calls */

void tenant_tick(struct tenant_table *tt, struct pool *p, struct store *s, double now)
{
	if (!p->sparse || now - tt->ticked_at < TENANT_TICK_S)
		return;
	tt->ticked_at = now;
	if (tenant_guarantees(tt, now))
		tenant_apply(tt, p, s);
	if (now - tt->scrubbed_at >= TENANT_SCRUB_S) {
		tt->scrubbed_at = now;
		(void)store_sparse_scrub(s);
	}
}

void tenant_detach(struct tenant_table *tt, uint32_t part)
{
	if (part < tt->n && tt->t[part].clients && !--tt->t[part].clients)
		tt->t[part].left_at = clock_now(); /* idle from now: kvbctl tenants shows it */
}

void tenant_put_refused(struct tenant_table *tt, uint32_t part, uint32_t ns, uint64_t ns_limit,
			uint64_t ns_bytes, uint64_t share_bytes, uint64_t pinned_bytes)
{
	static struct log_throttle lt;
	const struct tenant *t = &tt->t[part];
	char who[40], a[32], b[32];

	if (part >= tt->n)
		return;
	tt->t[part].refused++;
	if (tt->mode == TENANTS_NONE)
		snprintf(who, sizeof(who), "the pool");
	else
		snprintf(who, sizeof(who), "tenant %s %u's guarantee", tenant_mode_name(tt->mode),
			 t->key - 1);
	if (ns_limit && ns_bytes >= ns_limit)
		log_throttled(
			&lt,
			"PUT refused (-ENOSPC): namespace %u is at its --ns-limit cap of %s and "
			"none of its pages can be evicted now (leased or being copied); "
			"release leases, or raise the cap (kvbctl ns-limit)",
			ns, text_bytes((double)ns_limit, a, sizeof(a)));
	else
		log_throttled(&lt,
			      "PUT refused (-ENOSPC): %s (%s) is full and none of its pages can be "
			      "evicted now: %s leased or being copied; release leases (kvbctl "
			      "clients, kvbctl drop) or give it a larger share",
			      who, text_bytes((double)share_bytes, a, sizeof(a)),
			      text_bytes((double)pinned_bytes, b, sizeof(b)));
}
