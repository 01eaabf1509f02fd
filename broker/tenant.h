/* SPDX-License-Identifier: MIT */
/*
 * tenant.h - tenants (--tenants none|uid|gid): who a client is for isolation, and the pool
 * partition its tenant owns. See tenant.c for the model. Start-up thread, then loop thread.
 */
#ifndef KVB_BROKER_TENANT_H
#define KVB_BROKER_TENANT_H

#include <stdint.h>
#include <sys/types.h>

#include "pool.h"

enum tenant_mode {
	TENANTS_NONE = 0, /* one tenant: every admitted client (the default) */
	TENANTS_UID = 1,  /* a tenant per uid (SO_PEERCRED) */
	TENANTS_GID = 2,  /* a tenant per primary gid */
};

struct tenant_cfg {
	int mode;	  /* enum tenant_mode */
	uint32_t nlisted; /* --tenant ID=RAM[,DISK] entries */
	char *listed_arg[POOL_MAX_PARTS];
	uint64_t share;	     /* --tenant-share bytes; 0: the rest split in TENANT_SLOTS_DEFAULT */
	double share_frac;   /* --tenant-share N%: of the pool */
	uint64_t share_disk; /* --tenant-share RAM,DISK: bytes of disk; 0: see tenant_table */
	double share_disk_frac; /* ... or N% of the disk */
	double idle_s;		/* --tenant-idle: a share is released this long after its last
				 * client left [tenant-lend] */
};

#define TENANT_SLOTS_DEFAULT 4u
#define TENANT_MIN_BYTES (8ull << 20)
#define TENANT_IDLE_DEFAULT 600.0 /* --tenant-idle: 10 minutes */

/* One partition's tenant: listed ones are bound at start-up, the others at first attach. */
struct tenant {
	uint32_t key;	  /* ns identity's tenant: 0 none, uid + 1 or gid + 1 */
	uint8_t listed;	  /* named by --tenant */
	uint8_t used;	  /* bound to key */
	uint32_t clients; /* ring clients attached now */
	uint64_t attaches;
	uint64_t hits, misses; /* [hist] its GETs and ACQUIREs, while bound to key */
	uint64_t refused;      /* PUTs refused -ENOSPC: its share full, nothing of it evictable */
	double left_at;	       /* when its last client detached (clock_now), 0 while attached */
	uint8_t released;      /* [tenant-lend] idle past --tenant-idle: guarantee 0 */
	uint8_t share_set;     /* its share set at run time (kvbctl tenant-share) */
	uint64_t share;	       /* [tenant-lend] its share as configured (bytes) */
	uint64_t guarantee;    /* what it can always reclaim now: see tenant_guarantees */
};

/*
 * [tenant-disk] Each partition's share of the disk tier, asked by --tenant ID=RAM,DISK or
 * --tenant-share RAM,DISK: bytes or a fraction of the disk; both 0: the disk left over, split
 * in proportion to the partitions' RAM (tier.c cuts the disk; these survive tenant_attach).
 */
struct tenant_table {
	int mode;
	uint32_t n;		       /* partitions, = pool.nparts */
	uint64_t budget;	       /* [tenant-lend] RAM the partitions' slabs may hold in all */
	uint64_t share_default;	       /* the share of a tenant not listed, at its first attach */
	double idle_s;		       /* --tenant-idle */
	double ticked_at, scrubbed_at; /* tenant_tick's last run and last scrub */
	struct tenant t[POOL_MAX_PARTS];
	uint64_t disk_bytes[POOL_MAX_PARTS];
	double disk_frac[POOL_MAX_PARTS];
};

/* Parses --tenants; -EINVAL for anything but none, uid, gid. */
int tenant_parse_mode(const char *arg, int *mode);
/* Parses --tenant-share SIZE or N%, optionally ",DISK" (SIZE or N% of the disk tier). */
int tenant_parse_share(const char *arg, struct tenant_cfg *c);
/* "N%" (1..100) into *frac, or a non-zero size into *bytes (the other 0); -EINVAL. */
int tenant_parse_amount(const char *arg, uint64_t *bytes, double *frac);

/*
 * Cuts pool_bytes into partitions per c (listed tenants first, then equal shares of the rest),
 * filling pc->nparts and part_size[], and binds the listed tenants in tt. -EINVAL (with a line
 * on stderr) for an unknown user or group, a malformed entry, or shares that do not fit.
 */
int tenant_plan(const struct tenant_cfg *c, uint64_t pool_bytes, struct pool_cfg *pc,
		struct tenant_table *tt);

/*
 * [tenant-lend] Recomputes every tenant's guarantee at time now: its share while bound and not
 * released (idle past --tenant-idle, said in the log once), scaled down in proportion while
 * the shares of those tenants add up to more than the budget. Returns 1 when any changed.
 */
int tenant_guarantees(struct tenant_table *tt, double now);

/*
 * [tenant-lend] Sets the share of the tenant with key to bytes (0: back to the default share),
 * binding a free partition to it when it has none (it then attaches to that one). -EUSERS when
 * it has none and none is free, -EINVAL for a share below TENANT_MIN_BYTES.
 */
int tenant_set_share(struct tenant_table *tt, uint32_t key, uint64_t bytes);

struct store;
/*
 * [tenant-lend] Hands the shares and guarantees to the pool (pool_part.size: the share ops and
 * stats size a tenant's limits by) and the store (store_part.guarantee). After every change.
 */
void tenant_apply(const struct tenant_table *tt, struct pool *p, struct store *s);

/*
 * [tenant-lend] The loop's tick: releases shares idle past --tenant-idle and checks the sparse
 * pool's memory (store_sparse_scrub). Memory is taken back from borrowers only when a tenant
 * under its guarantee needs it (store_alloc_pref), never ahead: until then lending is free.
 */
void tenant_tick(struct tenant_table *tt, struct pool *p, struct store *s, double now);

/* The uid or gid (mode) a tenant name or number names; -ENOENT none. */
int tenant_resolve(int mode, const char *name, uint32_t *id);

/* The tenant key of a peer under mode. */
uint32_t tenant_key(int mode, uid_t uid, gid_t gid);

/*
 * The partition of a ring client's tenant, binding a free partition to it at first attach;
 * -EUSERS when every partition is bound to another tenant (*released then says whether one of
 * them is only released: tenant_rebind_pick and part_rebind (rebind.c) may free it).
 */
int tenant_attach(struct tenant_table *tt, uint32_t key, int *released);
/* Binds partition part to tenant key with one client attached (its share: the one planned for
 * it, or the default); returns part. */
int tenant_bind(struct tenant_table *tt, uint32_t part, uint32_t key);
/*
 * [tenant-rebind] The released partition idle longest whose tenant was not named by --tenant
 * nor given a share at run time, leaving out those in the skip mask; -1 none.
 */
int tenant_rebind_pick(const struct tenant_table *tt, uint32_t skip);
void tenant_detach(struct tenant_table *tt, uint32_t part);

const char *tenant_mode_name(int mode);

/*
 * A PUT of namespace ns in partition part was refused -ENOSPC: counts it and logs (throttled)
 * why, in the terms an operator acts on: the namespace's own cap (ns_limit, 0 none, of which
 * ns_bytes are used) or its tenant's share (share_bytes) is full, and what is pinned there
 * (leased or being copied) cannot be evicted.
 */
void tenant_put_refused(struct tenant_table *tt, uint32_t part, uint32_t ns, uint64_t ns_limit,
			uint64_t ns_bytes, uint64_t share_bytes, uint64_t pinned_bytes);

#endif /* KVB_BROKER_TENANT_H */
