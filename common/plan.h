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
 * Fills out from in. -EINVAL when a field is missing or out of range (no layers, no tp, no
 * request length, a GPU budget that the weights already exceed, ...).
 */
int plan_compute(const struct plan_in *in, struct plan_out *out);

#endif /* KVB_COMMON_PLAN_H */
