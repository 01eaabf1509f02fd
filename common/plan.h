/* SPDX-License-Identifier: MIT */
/*
 * plan.h - the capacity planner's arithmetic (`kvbctl plan`): how many tokens and requests of
 * KV cache each tier holds, for per-rank private host pools and for one shared kvbroker pool.
 * Pure functions; see plan.c for the model.
 */
#ifndef KVB_COMMON_PLAN_H
#define KVB_COMMON_PLAN_H

#include <stddef.h>
#include <stdint.h>

enum plan_attn {
	PLAN_MLA = 1, /* latent KV, the same on every TP rank (DeepSeek-V3, Kimi-K2.5) */
	PLAN_MHA = 2, /* K and V per head, heads split across TP ranks (GQA/MQA: fewer KV heads) */
};

struct plan_model {
	const char *name;
	uint32_t attn;	       /* enum plan_attn */
	uint32_t layers;       /* layers with a KV cache */
	uint32_t latent_dim;   /* MLA: kv_lora_rank + qk_rope_head_dim elements per token */
	uint32_t kv_heads;     /* MHA: key/value heads */
	uint32_t head_dim;     /* MHA: elements per head */
	uint32_t dtype_bytes;  /* KV cache element size: 2 bf16/fp16, 1 fp8, 4 fp32 */
	uint64_t weight_bytes; /* all ranks' weights (approximate), for a --gpu-mem budget */
};

/* The presets, NULL-name terminated; plan_preset() finds one by name, case-insensitively. */
extern const struct plan_model plan_presets[];
const struct plan_model *plan_preset(const char *name);

struct plan_in {
	struct plan_model m;
	uint32_t tp;	      /* tensor-parallel ranks of one engine */
	uint64_t gpu_tokens;  /* KV tokens each GPU holds; 0: derive from gpu_bytes */
	uint64_t gpu_bytes;   /* memory of one GPU, with mem_fraction and m.weight_bytes */
	double mem_fraction;  /* share of gpu_bytes for weights + KV (SGLang's mem-fraction) */
	uint64_t host_bytes;  /* host RAM for KV on the node, all ranks together */
	uint64_t disk_bytes;  /* disk for KV on the node (0: none) */
	uint64_t req_tokens;  /* average request length, prompt + output */
	uint32_t page_tokens; /* tokens per page */
	uint64_t slab_bytes;  /* the broker's --slab; 0: its default for host_bytes */
	uint32_t arenas;      /* NUMA arenas the pool is split over (0: 1) */
};

/* What one tier holds. */
struct plan_tier {
	uint64_t bytes;	   /* its capacity (per rank for the GPU, all ranks for the rest) */
	uint64_t pages;	   /* pages it stores, all ranks together (GPU: one rank's) */
	uint64_t tokens;   /* tokens of KV the engine can keep there */
	uint64_t requests; /* tokens / req_tokens */
};

struct plan_out {
	uint64_t bytes_token_rank;   /* KV bytes of one token on one rank */
	uint64_t bytes_token_engine; /* ... summed over the engine's ranks */
	uint64_t bytes_token_unique; /* distinct bytes of one token (MLA: one rank's) */
	uint32_t heads_rank;	     /* MHA: KV heads per rank (replicated when tp > kv_heads) */
	uint32_t share;		     /* ranks that store the same page: tp for MLA, else 1 */
	uint64_t slot_bytes;  /* one rank's page, rounded up to 4 KiB as the pool stores it */
	struct plan_tier gpu; /* per rank */
	struct plan_tier priv_host, priv_disk;	   /* tp private pools of host/tp (disk/tp) each */
	struct plan_tier shared_host, shared_disk; /* one kvbroker pool of host (disk) */
	uint64_t priv_requests, shared_requests;   /* resident requests, all tiers together */
	double host_gain;			   /* shared_host.tokens / priv_host.tokens */
};

/*
 * The broker's default --slab for a pool of pool_bytes: pool / 32 within 8..64 MiB, in MiB, and
 * large enough that the pool needs at most PLAN_SLABS_DEFAULT_MAX full slabs (slab ids are
 * 12 bits; the rest stay free for the short slabs that packing uses).
 */
#define PLAN_SLABS_DEFAULT_MAX 2048u
uint64_t plan_default_slab(uint64_t pool_bytes);

/*
 * Pages of slot bytes that the broker's store holds in one arena of arena_bytes with slabs of
 * about slab_bytes: full slabs of max(1, slab / slot) slots, then a short slab of what is left
 * (broker/store.c [packing]). Equals store_capacity() there.
 */
uint64_t plan_arena_pages(uint64_t arena_bytes, uint64_t slab_bytes, uint64_t slot);

/*
 * What a pool of pool_bytes split over arenas NUMA arenas (each rounded up to 2 MiB, as the
 * broker does) holds in pages of page_bytes (rounded up to 4 KiB); slab_bytes 0: the default.
 */
uint64_t plan_pool_pages(uint64_t pool_bytes, uint32_t arenas, uint64_t slab_bytes,
			 uint64_t page_bytes);

/*
 * Fills out from in. -EINVAL when a field is missing or out of range (no layers, no tp, no
 * request length, a GPU budget that the weights already exceed, ...).
 */
int plan_compute(const struct plan_in *in, struct plan_out *out);

#endif /* KVB_COMMON_PLAN_H */
