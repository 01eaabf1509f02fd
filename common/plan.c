// SPDX-License-Identifier: MIT
/*
 * plan.c - the capacity planner's arithmetic.
 *
 * KV bytes of one token on one TP rank:
 *   MLA  layers x (kv_lora_rank + rope dim) x dtype          every rank holds the same bytes
 *   MHA  layers x 2 (K, V) x heads_rank x head_dim x dtype   heads_rank = kv_heads / tp, or 1
 *                                                            when tp > kv_heads (replicated)
 * A page is page_tokens tokens of one rank's KV, stored in a slot rounded up to 4 KiB (the
 * broker's slot alignment), so a tier of B bytes holds floor(B / slot) pages; the shared pool
 * holds what the broker's store actually packs into it (plan_pool_pages: whole slabs of n
 * slots, then a short one per arena, each arena rounded up to 2 MiB), which is at most one slot
 * per arena less.
 *
 * Private per-rank host pools (each engine rank spills to its own share of host RAM, as
 * engines do today): every rank gets host/tp and stores its own copy of each page it spills,
 * so the engine keeps floor(host/tp / slot) x page_tokens tokens there, whatever the layout.
 *
 * One shared kvbroker pool: a page is stored once for all ranks that hold the same bytes. With
 * MLA that is every rank (one namespace for the whole engine), so the pool keeps
 * floor(host / slot) x page_tokens tokens: tp times the private figure. MHA ranks hold
 * different heads (one namespace per rank) and gain nothing across ranks; what they can share
 * is prefixes across engines and jobs, which depends on the workload and is not counted here.
 * The disk tier is the same arithmetic with disk bytes.
 *
 * Requests that fit = tokens / req_tokens, floored, per tier and over all tiers together
 * (GPU + host + disk): how many requests of that length can keep their KV resident somewhere
 * on the node rather than be recomputed.
 */
#include <errno.h>
#include <strings.h>

#include "plan.h"

#define SLOT_ALIGN 4096u
#define ARENA_ALIGN (2ull << 20)
#define SLOT_BITS 20 /* broker/store.h STORE_SLOT_BITS */

uint64_t plan_default_slab(uint64_t pool_bytes)
{
	uint64_t v = pool_bytes / 32,
		 min = (pool_bytes + PLAN_SLABS_DEFAULT_MAX - 1) / PLAN_SLABS_DEFAULT_MAX;

	v = v < (8u << 20) ? (8u << 20) : v > (64u << 20) ? (64u << 20) : v;
	if (v < min)
		v = min;
	return (v + (1u << 20) - 1) & ~((1ull << 20) - 1);
}

uint64_t plan_arena_pages(uint64_t arena_bytes, uint64_t slab_bytes, uint64_t slot)
{
	uint64_t n, slab, full;

	if (!slot || !slab_bytes)
		return 0;
	n = slab_bytes / slot;
	if (!n)
		n = 1;
	if (n >= (1u << SLOT_BITS))
		n = (1u << SLOT_BITS) - 1;
	slab = n * slot;
	full = arena_bytes / slab;
	return full * n + (arena_bytes - full * slab) / slot;
}

uint64_t plan_pool_pages(uint64_t pool_bytes, uint32_t arenas, uint64_t slab_bytes,
			 uint64_t page_bytes)
{
	uint64_t slot = (page_bytes + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN, per;

	if (!arenas)
		arenas = 1;
	if (!slab_bytes)
		slab_bytes = plan_default_slab(pool_bytes);
	per = (pool_bytes / arenas + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
	return arenas * plan_arena_pages(per, slab_bytes, slot);
}

/*
 * Layer counts, KV widths and attention kinds from the models' published configs. Weights
 * are approximate checkpoint sizes, only used to turn --gpu-mem into KV tokens.
 */
const struct plan_model plan_presets[] = {
	/* MLA: 61 layers, kv_lora_rank 512 + qk_rope_head_dim 64; ~1.04T params, INT4 experts */
	{"kimi-k2.5", PLAN_MLA, 61, 576, 0, 0, 2, 595000000000ull},
	/* MLA, same KV shape; 671B params in FP8 */
	{"deepseek-v3", PLAN_MLA, 61, 576, 0, 0, 2, 689000000000ull},
	/* GQA, 8 KV heads of 128, bf16 */
	{"llama-3.1-8b", PLAN_MHA, 32, 0, 8, 128, 2, 16100000000ull},
	{"llama-3.1-70b", PLAN_MHA, 80, 0, 8, 128, 2, 141100000000ull},
	{"llama-3.1-405b", PLAN_MHA, 126, 0, 8, 128, 2, 812000000000ull},
	{"qwen2.5-72b", PLAN_MHA, 80, 0, 8, 128, 2, 145400000000ull},
	{NULL, 0, 0, 0, 0, 0, 0, 0},
};

const struct plan_model *plan_preset(const char *name)
{
	for (const struct plan_model *m = plan_presets; m->name; m++)
		if (!strcasecmp(m->name, name))
			return m;
	return 0;
}

static void tier(struct plan_tier *t, uint64_t bytes, uint64_t slot, uint32_t page_tokens,
		 uint64_t req_tokens)
{
	t->bytes = bytes;
	t->pages = bytes / slot;
	t->tokens = t->pages * page_tokens;
	t->requests = t->tokens / req_tokens;
}

int plan_compute(const struct plan_in *in, struct plan_out *o)
{
	const struct plan_model *m = &in->m;
	uint64_t page;

	*o = (struct plan_out){0};
	if (!m->layers || !m->dtype_bytes || !in->tp || !in->req_tokens || !in->page_tokens)
		return -EINVAL;
	if (m->attn == PLAN_MLA) {
		if (!m->latent_dim)
			return -EINVAL;
		o->bytes_token_rank = (uint64_t)m->layers * m->latent_dim * m->dtype_bytes;
		o->share = in->tp;
	} else if (m->attn == PLAN_MHA) {
		if (!m->kv_heads || !m->head_dim)
			return -EINVAL;
		o->heads_rank = m->kv_heads >= in->tp ? (m->kv_heads + in->tp - 1) / in->tp : 1;
		o->bytes_token_rank = (uint64_t)m->layers * 2 * o->heads_rank * m->head_dim *
				      m->dtype_bytes;
		o->share = 1;
	} else {
		return -EINVAL;
	}
	o->bytes_token_engine = o->bytes_token_rank * in->tp;
	o->bytes_token_unique = o->bytes_token_engine / o->share;
	page = o->bytes_token_rank * in->page_tokens;
	o->slot_bytes = (page + SLOT_ALIGN - 1) / SLOT_ALIGN * SLOT_ALIGN;

	if (in->gpu_tokens) {
		o->gpu.tokens = in->gpu_tokens;
		o->gpu.bytes = in->gpu_tokens * o->bytes_token_rank;
	} else {
		double budget = (double)in->gpu_bytes * in->mem_fraction -
				(double)m->weight_bytes / in->tp;

		if (!in->gpu_bytes || in->mem_fraction <= 0 || in->mem_fraction > 1 || budget <= 0)
			return -EINVAL;
		o->gpu.bytes = (uint64_t)budget;
		o->gpu.tokens = o->gpu.bytes / o->bytes_token_rank;
	}
	o->gpu.pages = o->gpu.tokens / in->page_tokens;
	o->gpu.requests = o->gpu.tokens / in->req_tokens;

	/* Private pools: tp of them, host/tp each; the engine's tokens are one rank's count. */
	tier(&o->priv_host, in->host_bytes / in->tp, o->slot_bytes, in->page_tokens,
	     in->req_tokens);
	tier(&o->priv_disk, in->disk_bytes / in->tp, o->slot_bytes, in->page_tokens,
	     in->req_tokens);
	o->priv_host.bytes = in->host_bytes;
	o->priv_disk.bytes = in->disk_bytes;
	o->priv_host.pages *= in->tp;
	o->priv_disk.pages *= in->tp;

	/* One pool: a page serves `share` ranks, so a token-page costs tp/share slots. */
	tier(&o->shared_host, in->host_bytes / (in->tp / o->share), o->slot_bytes, in->page_tokens,
	     in->req_tokens);
	tier(&o->shared_disk, in->disk_bytes / (in->tp / o->share), o->slot_bytes, in->page_tokens,
	     in->req_tokens);
	o->shared_host.bytes = in->host_bytes;
	o->shared_disk.bytes = in->disk_bytes;
	o->shared_host.pages *= in->tp / o->share;
	if (in->host_bytes) {
		/* The pool holds what the store packs, not floor(bytes / slot) [packing]; each
		 * token-page takes tp/share of those pages. */
		uint64_t k = in->tp / o->share;
		uint64_t all = plan_pool_pages(in->host_bytes, in->arenas, in->slab_bytes,
					       o->slot_bytes);

		o->shared_host.pages = all / k * k;
		o->shared_host.tokens = all / k * in->page_tokens;
		o->shared_host.requests = o->shared_host.tokens / in->req_tokens;
	}
	o->shared_disk.pages *= in->tp / o->share;

	o->priv_requests = (o->gpu.tokens + o->priv_host.tokens + o->priv_disk.tokens) /
			   in->req_tokens;
	o->shared_requests = (o->gpu.tokens + o->shared_host.tokens + o->shared_disk.tokens) /
			     in->req_tokens;
	o->host_gain = o->priv_host.tokens
			       ? (double)o->shared_host.tokens / (double)o->priv_host.tokens
			       : 0.0;
	return 0;
}
