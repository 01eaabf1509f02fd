/* SPDX-License-Identifier: MIT */
/*
 * ns.h - namespaces: a model's KV layout plus its tenant, identified by a SHA-256 of its
 * canonical description. MLA layouts leave tp_size/tp_rank out of the identity (every rank holds
 * the same latent KV), MHA layouts put them in. Loop thread only.
 */
#ifndef KVB_BROKER_NS_H
#define KVB_BROKER_NS_H

#include <stdint.h>

#include "kvbroker.h"
#include "store.h"

struct ns_counters {
	uint64_t puts, dedup, gets, hits, misses;
};

struct ns {
	uint32_t id;
	int cls; /* store size class of its pages */
	uint64_t page_bytes;
	struct kvb_layout layout; /* as first opened (tp fields of the first MLA rank) */
	struct kvb_ns_ident idf;  /* identity fields as first opened, sizes of 0 made 1 */
	uint8_t ident[32];
	uint32_t nparts;      /* (component, layer) parts of a page */
	uint64_t *part_off;   /* byte offset of each part inside a page */
	uint32_t *part_len;   /* tokens_per_page * bytes_per_token_layer of the part */
	uint32_t *part_bpt;   /* bytes_per_token_layer of the part */
	uint32_t *part_layer; /* layer index of the part within its component */
	struct ns_counters c;
	uint32_t opens; /* sessions that opened it, until their last op completed */
};

/*
 * [ns-free] A namespace lives while a session has it open or the store holds a page of it; then
 * its id is free for the next new identity (ns_release). Ids are below count; ns[id] is NULL
 * for a free one.
 */
struct ns_table {
	struct ns *ns[STORE_MAX_NS];
	uint32_t count;			   /* ids in use are below this */
	uint32_t live;			   /* namespaces alive */
	uint64_t freed, dedup_bytes_freed; /* namespaces released, and what they had saved */
};

/* Frees namespace id when no session has it open and the store holds none of its pages; 1
 * when it was freed. */
int ns_release(struct ns_table *t, struct store *s, uint32_t id);

/* Canonical identity of a layout for a tenant. The layout must have passed kvb_layout_check. */
void ns_identity(const struct kvb_layout *l, uint32_t tenant, uint8_t out[32]);
/* The same with ABI 1.2 identity fields (checked by kvb_ident_check; NULL: the default). */
void ns_identity2(const struct kvb_layout *l, const struct kvb_ns_ident *id, uint32_t tenant,
		  uint8_t out[32]);

/*
 * Finds the namespace of a (checked) layout and tenant or creates it, taking its page class
 * from the store. -E2BIG page larger than a slab, -EMFILE table full, -ENOMEM.
 */
int ns_open(struct ns_table *t, struct store *s, const struct kvb_layout *l, uint32_t tenant,
	    struct ns **out);
/* ns_open() with identity fields (validated here: -EINVAL); NULL is the default identity. */
int ns_open2(struct ns_table *t, struct store *s, const struct kvb_layout *l,
	     const struct kvb_ns_ident *ident, uint32_t tenant, struct ns **out);

static inline struct ns *ns_get(const struct ns_table *t, uint32_t id)
{
	return id < STORE_MAX_NS ? t->ns[id] : NULL;
}

void ns_table_fini(struct ns_table *t);

/*
 * [ns-limit] --ns-limit MODEL=SIZE|N%: the namespaces of one model (its layout's model name,
 * every tenant's and identity's alike) hold at most SIZE bytes of slots in RAM, or N% of their
 * tenant's partition, each. Over its cap a namespace's PUT evicts its own coldest pages
 * (store.c ns_room), so capping one model never evicts another's.
 */
#define NS_LIMITS_MAX 16
struct ns_limit {
	char model[64]; /* NUL-terminated, compared with the layout's model */
	uint64_t bytes; /* or */
	double frac;	/* of the partition */
};

/* Parses MODEL=SIZE|N% into *l; -EINVAL. */
int ns_limit_parse(const char *arg, struct ns_limit *l);
/*
 * The cap of namespace n in a partition of part_bytes under limits l[0, nl): 0 when no entry
 * names its model; never below one page (a smaller cap would refuse every PUT).
 */
uint64_t ns_limit_of(const struct ns_limit *l, uint32_t nl, const struct ns *n, uint64_t part_bytes,
		     uint64_t slot_bytes);

#endif /* KVB_BROKER_NS_H */
