// SPDX-License-Identifier: MIT
/*
 * rebind.c - a released tenant partition bound to a new tenant [tenant-rebind].
 *
 * There are POOL_MAX_PARTS partitions; tenants come and go for months (a uid per job), so a
 * new tenant that finds every partition bound takes the one released longest ago, when nothing
 * of it is in use. Its memory must never show the new tenant's bytes to the old one: a process
 * of the old tenant may still map its memfds (and hold their fds), which no broker can take
 * away. So the partition gets fresh memfds, in this order, each step safe if the broker dies
 * after it (a restart adopts what the keeper, or systemd's fd store, holds, with the side
 * table; adopt.c checks every page against its crc):
 *   1. nothing of it pinned (leased, being written, demoted or copied), no namespace of it
 *      open, no client of the previous broker leasing there (orphan.c): else it is not
 *      eligible now, and the next released one is tried;
 *   2. its pages are dropped (index, directory, side table) and its slabs given back (each
 *      unregistered from the GPU copy engine first, store.c [slab-pin]: no registration is
 *      left on the old file's pages): the old tenant's pages, which a released share lets go
 *      first anyway. Its namespaces go too (none has a page left), so that none of them
 *      points at the partition again: the old tenant coming back opens them anew, in the
 *      partition it then binds;
 *   3. per arena, a fresh memfd (pool_arena_fresh), handed first to the keeper, which answers
 *      once it holds it (keeper_swap), and to the fd store (sdn_swap_arena): from here a
 *      restart adopts the new, empty file, which the side table describes as well (its slabs
 *      are clear);
 *   4. the old file emptied whole, the new one mapped over the broker's mapping of the old
 *      (the same base, every pointer stays valid), the old fd closed (pool_arena_switch);
 *   5. the partition's directory made anew in the new file, its disk regions' slots (the old
 *      tenant's pages) forgotten, and the tenant record bound to the new tenant.
 * A keeper that cannot take the new file (one of an earlier version, which does not know the
 * request) leaves the partition to its old tenant, emptied: nothing is re-bound while that
 * keeper runs.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "broker.h"
#include "clock.h"
#include "keeper.h"
#include "log.h"
#include "ns.h"
#include "orphan.h"
#include "pool.h"
#include "rebind.h"
#include "sdnotify.h"
#include "store.h"
#include "tenant.h"
#include "tier.h"

static int keeper_cannot; /* the keeper did not take a new file: no re-binding with it */

/* Steps 1 and 2: partition p holds nothing of its old tenant's; -EBUSY when in use. */
static int part_empty(struct broker *b, uint32_t p, const char **why)
{
	if (orphan_in_part(b, p)) {
		*why = "a client of the previous broker still leases there";
		return -EBUSY;
	}
	for (uint32_t id = 0; id < b->nst.count; id++) {
		const struct ns *n = ns_get(&b->nst, id);

		if (n && b->store.ns_part[id] == p && n->opens) {
			*why = "a namespace of it is open";
			return -EBUSY;
		}
	}
	if (store_part_clear(&b->store, p)) {
		*why = "a page of it is leased, being written or being copied";
		return -EBUSY;
	}
	for (uint32_t id = 0; id < b->nst.count; id++) {
		if (!ns_get(&b->nst, id) || b->store.ns_part[id] != p)
			continue;
		if (!ns_release(&b->nst, &b->store, id)) {
			*why = "a namespace of it is still in use";
			return -EBUSY;
		}
		tier_ns_forget(b, id);
	}
	return 0;
}

/* Steps 3 and 4 for every arena of partition p. */
static int part_swap(struct broker *b, uint32_t p, const char **why)
{
	const struct pool_part *pt = &b->pool.part[p];

	for (uint32_t i = 0; i < pt->narenas; i++) {
		uint32_t a = pt->first + i;
		int fd, err = pool_arena_fresh(&b->pool, a, &fd);

		if (err) {
			*why = "no new memory file (memfd_create)";
			return err;
		}
		if (b->keeper && b->kl.fd >= 0) {
			err = keeper_swap(&b->kl, 1 + a, fd);
			if (err == -ETIMEDOUT) {
				/* One that does not know the request (or took it too late to
				 * say so): a restart would adopt the file it holds. */
				log_error("pool keeper: no answer to taking the new file of arena "
					  "%u: released partitions are not bound to new tenants "
					  "while it runs (a keeper of an earlier version: stop the "
					  "broker, kvbrokerd --free-pool, start it again)",
					  a);
				keeper_cannot = 1;
			}
			if (err) {
				close(fd);
				*why = "the pool keeper did not take the new file";
				return err;
			}
		}
		if (b->fdstore && sdn_swap_arena(a, fd))
			log_error("systemd's fd store did not take the new file of arena %u: a "
				  "restart through the fd store finds the pool incomplete and "
				  "starts a new one",
				  a);
		err = pool_arena_switch(&b->pool, a, fd);
		if (err) {
			/* The keeper and the fd store hold the new, empty file, which the side
			 * table describes: a restart adopts the pool whole. This broker's map of
			 * the arena is not the pool's any more: it must not serve another page. */
			log_error("pool: %s: cannot map the new file over the old one (mmap: %s): "
				  "stopping; the pool is kept for the next broker",
				  b->pool.arena[a].name, strerror(-err));
			abort();
		}
	}
	return 0;
}

int part_rebind(struct broker *b, uint32_t key)
{
	uint32_t skip = 0;
	int p;

	if (!b->pool.sparse || keeper_cannot)
		return -EUSERS;
	while ((p = tenant_rebind_pick(&b->tt, skip)) >= 0) {
		const struct tenant old = b->tt.t[p];
		const char *why = "";
		int err = part_empty(b, (uint32_t)p, &why);

		if (!err)
			err = part_swap(b, (uint32_t)p, &why);
		if (err) {
			log_info("tenant partition %u (%s %u, released): not bound to a new tenant "
				 "now: %s",
				 p, tenant_mode_name(b->tt.mode), old.key - 1, why);
			skip |= 1u << p;
			continue;
		}
		store_part_dir_reset(&b->store, (uint32_t)p);
		tier_part_forget(b, (uint32_t)p);
		tenant_bind(&b->tt, (uint32_t)p, key);
		log_info("tenant %s %u: bound to partition %u, released by %s %u (no client for "
			 "%.0f s): its pages dropped, new memory files in place of the old ones",
			 tenant_mode_name(b->tt.mode), key - 1, p, tenant_mode_name(b->tt.mode),
			 old.key - 1, clock_now() - old.left_at);
		return p;
	}
	return -EUSERS;
}
