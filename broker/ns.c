// SPDX-License-Identifier: MIT
/*
 * ns.c - namespace identity and the namespace table.
 *
 * Identity = SHA-256 over a canonical, fixed-width encoding: "kvb-ns-v1", tenant, kind,
 * tokens_per_page, ncomponents, each component's (name padded to 16 bytes, layers, bytes per
 * token per layer), the model padded to 64 bytes, and for MHA only tp_size and tp_rank. The
 * layout was validated (kvb_layout_check), so unused bytes are zero and the encoding is unique.
 * Ids are small table indices handed to clients; the identity is what decides sharing.
 *
 * ABI 1.2 identity fields (struct kvb_ns_ident) extend the encoding only when they are not the
 * default, so every namespace an ABI 1.1 client opened, and every page the disk tier holds for
 * one, keeps its identity: "kvb-ns-v1" encoding as above, then "kvb-ns-id2", the four dtypes,
 * the 32-byte page format, pp_size, pp_rank, cp_size, cp_rank (sizes of 0 made 1). The data-
 * parallel rank and size are not encoded: replicas compute the same bytes for a prefix.
 */
#include <errno.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>

#include "ns.h"
#include "pagehdr.h"
#include "tenant.h"
#include "proto.h"

static uint8_t *put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
	return p + 4;
}

static uint8_t *put_bytes(uint8_t *p, const void *src, size_t n)
{
	memcpy(p, src, n);
	return p + n;
}

void ns_identity2(const struct kvb_layout *l, const struct kvb_ns_ident *id, uint32_t tenant,
		  uint8_t out[32])
{
	static const char tag[] = "kvb-ns-v1";
	static const char tag2[] = "kvb-ns-id2";
	uint8_t buf[sizeof(tag) + 4 * 4 + KVB_MAX_COMPONENTS * (KVB_COMP_NAME_MAX + 8) +
		    KVB_MODEL_MAX + 8 + sizeof(tag2) + KVB_MAX_COMPONENTS * 4 +
		    KVB_PAGE_FORMAT_MAX + 4 * 4];
	uint8_t *p = buf;

	p = put_bytes(p, tag, sizeof(tag));
	p = put32(p, tenant);
	p = put32(p, l->kind);
	p = put32(p, l->tokens_per_page);
	p = put32(p, l->ncomponents);
	for (uint32_t i = 0; i < l->ncomponents && i < KVB_MAX_COMPONENTS; i++) {
		p = put_bytes(p, l->comp[i].name, sizeof(l->comp[i].name));
		p = put32(p, l->comp[i].num_layers);
		p = put32(p, l->comp[i].bytes_per_token_layer);
	}
	p = put_bytes(p, l->model, sizeof(l->model));
	if (l->kind == KVB_LAYOUT_MHA) {
		p = put32(p, l->tp_size);
		p = put32(p, l->tp_rank);
	}
	if (!kvb_ident_is_default(id)) {
		struct kvb_ns_ident n;

		kvb_ident_norm(id, &n);
		p = put_bytes(p, tag2, sizeof(tag2));
		for (uint32_t i = 0; i < KVB_MAX_COMPONENTS; i++)
			p = put32(p, n.dtype[i]);
		p = put_bytes(p, n.page_format, sizeof(n.page_format));
		p = put32(p, n.pp_size);
		p = put32(p, n.pp_rank);
		p = put32(p, n.cp_size);
		p = put32(p, n.cp_rank);
	}
	EVP_Digest(buf, (size_t)(p - buf), out, NULL, EVP_sha256(), NULL);
}

void ns_identity(const struct kvb_layout *l, uint32_t tenant, uint8_t out[32])
{
	ns_identity2(l, NULL, tenant, out);
}

static void ns_free(struct ns *n)
{
	if (!n)
		return;
	free(n->part_off);
	free(n->part_len);
	free(n->part_bpt);
	free(n->part_layer);
	free(n);
}

/* Part offsets, component-major then layer-major: [component][layer][token][bytes]. */
static int ns_parts(struct ns *n)
{
	const struct kvb_layout *l = &n->layout;
	uint64_t off = 0;
	uint32_t p = 0;

	n->nparts = kvb_layout_parts(l);
	n->part_off = calloc(n->nparts, sizeof(*n->part_off));
	n->part_len = calloc(n->nparts, sizeof(*n->part_len));
	n->part_bpt = calloc(n->nparts, sizeof(*n->part_bpt));
	n->part_layer = calloc(n->nparts, sizeof(*n->part_layer));
	if (!n->part_off || !n->part_len || !n->part_bpt || !n->part_layer)
		return -ENOMEM;
	for (uint32_t c = 0; c < l->ncomponents; c++) {
		for (uint32_t i = 0; i < l->comp[c].num_layers; i++, p++) {
			n->part_off[p] = off;
			n->part_bpt[p] = l->comp[c].bytes_per_token_layer;
			n->part_len[p] = l->tokens_per_page * l->comp[c].bytes_per_token_layer;
			n->part_layer[p] = i;
			off += n->part_len[p];
		}
	}
	return 0;
}

int ns_open(struct ns_table *t, struct store *s, const struct kvb_layout *l, uint32_t tenant,
	    struct ns **out)
{
	return ns_open2(t, s, l, NULL, tenant, out);
}

int ns_open2(struct ns_table *t, struct store *s, const struct kvb_layout *l,
	     const struct kvb_ns_ident *ident, uint32_t tenant, struct ns **out)
{
	uint8_t id[32];
	uint64_t page_bytes;
	struct ns *n;
	int cls, err;

	err = kvb_layout_check(l, &page_bytes);
	if (!err && ident)
		err = kvb_ident_check(l, ident);
	if (err)
		return err;
	ns_identity2(l, ident, tenant, id);
	uint32_t free_id = t->count;

	for (uint32_t i = 0; i < t->count; i++) {
		if (!t->ns[i]) {
			if (free_id == t->count)
				free_id = i;
			continue;
		}
		if (!memcmp(t->ns[i]->ident, id, sizeof(id))) {
			*out = t->ns[i];
			return 0;
		}
	}
	if (free_id == STORE_MAX_NS)
		return -EMFILE;
	cls = store_class_get(s, page_bytes);
	if (cls < 0)
		return cls;
	n = calloc(1, sizeof(*n));
	if (!n)
		return -ENOMEM;
	n->layout = *l;
	kvb_ident_norm(ident, &n->idf);
	memcpy(n->ident, id, sizeof(id));
	n->page_bytes = page_bytes;
	n->cls = cls;
	err = ns_parts(n);
	if (err) {
		ns_free(n);
		return err;
	}
	n->id = free_id;
	t->ns[free_id] = n;
	if (free_id == t->count)
		t->count++;
	t->live++;
	/* [pagehdr] Before any page of it can commit: an adopter re-opens it from this (a reused
	 * id's record is overwritten: the old namespace has no page left in RAM). */
	if (s->pool && s->pool->meta)
		pmeta_ns_write(s->pool->meta, n->id, tenant, page_bytes, id, l, &n->idf);
	*out = n;
	return 0;
}

int ns_release(struct ns_table *t, struct store *s, uint32_t id)
{
	struct ns *n = ns_get(t, id);

	if (!n || n->opens || s->ns_pages[id])
		return 0;
	t->dedup_bytes_freed += n->c.dedup * n->page_bytes;
	t->ns[id] = NULL;
	t->live--;
	t->freed++;
	while (t->count && !t->ns[t->count - 1])
		t->count--;
	s->ns_part[id] = 0;
	s->ns_limit[id] = 0; /* [ns-limit] the next namespace of this id sets its own */
	ns_free(n);
	return 1;
}

int ns_limit_parse(const char *arg, struct ns_limit *l)
{
	const char *eq = strrchr(arg, '=');
	size_t n;

	memset(l, 0, sizeof(*l));
	if (!eq || eq == arg)
		return -EINVAL;
	n = (size_t)(eq - arg);
	if (n >= sizeof(l->model))
		return -EINVAL;
	memcpy(l->model, arg, n);
	return tenant_parse_amount(eq + 1, &l->bytes, &l->frac);
}

uint64_t ns_limit_of(const struct ns_limit *l, uint32_t nl, const struct ns *n, uint64_t part_bytes,
		     uint64_t slot_bytes)
{
	char model[sizeof(n->layout.model) + 1];
	uint64_t cap;

	memcpy(model, n->layout.model, sizeof(n->layout.model));
	model[sizeof(n->layout.model)] = '\0';
	for (uint32_t i = 0; i < nl; i++) {
		if (strcmp(l[i].model, model))
			continue;
		cap = l[i].bytes ? l[i].bytes : (uint64_t)(l[i].frac * (double)part_bytes);
		return cap < slot_bytes ? slot_bytes : cap;
	}
	return 0;
}

void ns_table_fini(struct ns_table *t)
{
	for (uint32_t i = 0; i < t->count; i++)
		ns_free(t->ns[i]); /* NULL for a freed id */
	memset(t, 0, sizeof(*t));
}
