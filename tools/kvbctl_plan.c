// SPDX-License-Identifier: MIT
/*
 * kvbctl_plan.c - `kvbctl plan`: the capacity planner's command line and report. The
 * arithmetic is common/plan.c's (unit-tested there); this file parses flags and prints
 * private per-rank pools and one shared kvbroker pool side by side, or both as JSON.
 * Needs no broker.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "kvbctl.h"
#include "plan.h"
#include "size.h"

static void plan_usage(FILE *f)
{
	fprintf(f,
		"usage: kvbctl plan [--model NAME | --attention mla|mha --layers N ...] [options]\n"
		"\n"
		"How much KV cache each tier holds and how many requests fit, for per-rank "
		"private\n"
		"host pools (what engines do alone) and for one shared kvbroker pool.\n"
		"\n"
		"model:\n"
		"  --model NAME        a preset (--list), e.g. kimi-k2.5, llama-3.1-70b\n"
		"  --attention KIND    mla (latent KV, the same on every TP rank) or mha/gqa\n"
		"  --layers N          layers with a KV cache\n"
		"  --kv-dim N          mla: elements per token per layer (kv_lora_rank + rope "
		"dim)\n"
		"  --kv-heads N        mha/gqa: key/value heads\n"
		"  --head-dim N        mha/gqa: elements per head\n"
		"  --dtype T           KV cache type: bf16, fp16, fp8, fp32 (default bf16)\n"
		"  --weights SIZE      model weights, all ranks (with --gpu-mem; presets know it)\n"
		"                      (these flags override a preset's values)\n"
		"deployment:\n"
		"  --tp N              tensor-parallel ranks per engine (default 1)\n"
		"  --gpu-tokens N      KV tokens one GPU holds (as the engine logs it), or:\n"
		"  --gpu-mem SIZE      memory of one GPU, with --mem-fraction (default 0.85)\n"
		"  --host-ram SIZE     host RAM for KV on the node\n"
		"  --disk SIZE         disk for KV on the node (default none)\n"
		"  --req-len N         average request length in tokens, prompt + output (default "
		"4096)\n"
		"  --page-tokens N     tokens per page (default 64)\n"
		"  --slab SIZE         the broker's --slab (default: its default for the pool)\n"
		"  --numa-nodes N      NUMA nodes the pool is split over (default 1)\n"
		"                      (the shared pool's pages are what kvbrokerd packs into\n"
		"                      --host-ram with these: kvbctl plan is its allocator's\n"
		"                      arithmetic, not bytes / page)\n"
		"  --json              the inputs and results as JSON\n"
		"  --list              the presets\n"
		"\n"
		"Bytes per token per rank is what one TP rank stores for a token: with MLA the\n"
		"whole latent (layers x kv-dim x dtype), the same bytes on every rank, never a\n"
		"1/TP share; with MHA/GQA the rank's KV heads. A naive per-rank estimate, host\n"
		"RAM / TP / bytes per token per GPU, matches the private column only with that\n"
		"figure (Kimi-K2.5: 70,272 B on every rank), and its tokens are the same tokens\n"
		"on every MLA rank, not TP times as many; the plan's last lines reconcile the\n"
		"two for the inputs given.\n"
		"\n"
		"SIZE: 300G (or 300GiB) is 300 GiB, 300GB is 300 x 10^9 bytes, as everywhere in\n"
		"kvbroker (docs/operations.md, \"Sizes and durations\").\n"
		"example: kvbctl plan --model kimi-k2.5 --tp 8 --gpu-tokens 116171 --host-ram "
		"300G\n");
}

static int parse_u64(const char *s, uint64_t *out)
{
	char *end;

	errno = 0;
	*out = strtoull(s, &end, 10);
	return errno || end == s || *end || *s == '-' ? -EINVAL : 0;
}

/* 1234567 -> "1,234,567" */
static const char *fmt_count(uint64_t v, char *buf, size_t len)
{
	char tmp[32];
	int n = snprintf(tmp, sizeof(tmp), "%llu", (unsigned long long)v), o = 0;

	for (int i = 0; i < n && (size_t)o + 2 < len; i++) {
		if (i && (n - i) % 3 == 0)
			buf[o++] = ',';
		buf[o++] = tmp[i];
	}
	buf[o] = '\0';
	return buf;
}

static const char *attn_name(uint32_t a)
{
	return a == PLAN_MLA ? "mla" : "mha";
}

static void tier_json(cJSON *o, const char *name, const struct plan_tier *t)
{
	cJSON *j = cJSON_AddObjectToObject(o, name);

	cJSON_AddNumberToObject(j, "bytes", (double)t->bytes);
	cJSON_AddNumberToObject(j, "pages", (double)t->pages);
	cJSON_AddNumberToObject(j, "tokens", (double)t->tokens);
	cJSON_AddNumberToObject(j, "requests", (double)t->requests);
}

static int plan_json(const struct plan_in *in, const struct plan_out *o)
{
	cJSON *r = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(r, "model");
	cJSON *priv, *shared;
	int ret;

	cJSON_AddStringToObject(m, "name", in->m.name ? in->m.name : "");
	cJSON_AddStringToObject(m, "attention", attn_name(in->m.attn));
	cJSON_AddNumberToObject(m, "layers", in->m.layers);
	if (in->m.attn == PLAN_MLA) {
		cJSON_AddNumberToObject(m, "kv_dim", in->m.latent_dim);
	} else {
		cJSON_AddNumberToObject(m, "kv_heads", in->m.kv_heads);
		cJSON_AddNumberToObject(m, "head_dim", in->m.head_dim);
	}
	cJSON_AddNumberToObject(m, "dtype_bytes", in->m.dtype_bytes);
	cJSON_AddNumberToObject(r, "tp", in->tp);
	cJSON_AddNumberToObject(r, "req_tokens", (double)in->req_tokens);
	cJSON_AddNumberToObject(r, "page_tokens", in->page_tokens);
	cJSON_AddNumberToObject(r, "bytes_per_token_rank", (double)o->bytes_token_rank);
	cJSON_AddNumberToObject(r, "bytes_per_token_engine", (double)o->bytes_token_engine);
	cJSON_AddNumberToObject(r, "bytes_per_token_unique", (double)o->bytes_token_unique);
	cJSON_AddNumberToObject(r, "ranks_sharing_a_page", o->share);
	cJSON_AddNumberToObject(r, "slot_bytes", (double)o->slot_bytes);
	tier_json(r, "gpu", &o->gpu);
	priv = cJSON_AddObjectToObject(r, "private");
	tier_json(priv, "host", &o->priv_host);
	tier_json(priv, "disk", &o->priv_disk);
	cJSON_AddNumberToObject(priv, "requests", (double)o->priv_requests);
	shared = cJSON_AddObjectToObject(r, "shared");
	tier_json(shared, "host", &o->shared_host);
	tier_json(shared, "disk", &o->shared_disk);
	cJSON_AddNumberToObject(shared, "requests", (double)o->shared_requests);
	cJSON_AddNumberToObject(r, "host_gain", o->host_gain);
	ret = ctl_print_json(r);
	cJSON_Delete(r);
	return ret;
}

/* One row: label, then the private and the shared column. */
static void row(const char *label, const char *priv, const char *shared)
{
	printf("  %-26s %-30s %s\n", label, priv, shared);
}

static void tier_rows(const char *name, const struct plan_tier *p, const struct plan_tier *s,
		      uint32_t tp)
{
	char a[64], b[64], c[32], d[32], lab[64];

	if (!p->bytes)
		return;
	snprintf(lab, sizeof(lab), "%s %s", name, text_bytes((double)p->bytes, c, sizeof(c)));
	snprintf(a, sizeof(a), "%u x %s", tp, text_bytes((double)p->bytes / tp, d, sizeof(d)));
	row(lab, a, "one pool");
	snprintf(a, sizeof(a), "%u x %s", tp, fmt_count(p->pages / tp, c, sizeof(c)));
	row("  pages stored", a, fmt_count(s->pages, b, sizeof(b)));
	row("  tokens held", fmt_count(p->tokens, a, sizeof(a)),
	    fmt_count(s->tokens, b, sizeof(b)));
	row("  requests that fit", fmt_count(p->requests, a, sizeof(a)),
	    fmt_count(s->requests, b, sizeof(b)));
}

/*
 * How the host columns meet a naive per-rank estimate, host RAM / TP / bytes per token per
 * GPU: they do when that figure is the rank's own (MLA: the whole latent on every rank), and
 * an MLA engine's ranks hold the same tokens, so the private figure is not TP times larger;
 * the shared pool holds each token once for all of them.
 */
static void naive_line(const struct plan_in *in, const struct plan_out *o)
{
	char a[32], b[32], c[32], d[32], e[32];

	if (!in->host_bytes)
		return;
	text_bytes((double)in->host_bytes / in->tp, a, sizeof(a));
	fmt_count(o->bytes_token_rank, b, sizeof(b));
	fmt_count(o->priv_host.tokens, c, sizeof(c));
	fmt_count(o->shared_host.tokens, d, sizeof(d));
	fmt_count(o->gpu.tokens, e, sizeof(e));
	printf("\nagainst a naive per-rank estimate (host RAM / TP / bytes per token per GPU): ");
	if (in->m.attn == PLAN_MLA && in->tp > 1)
		printf("with MLA each\n"
		       "  rank stores the whole latent, %s B per token, so %s per rank holds %s "
		       "tokens,\n"
		       "  the same on all %u ranks; one shared pool holds each once: %s (GPU: %s "
		       "more).\n",
		       b, a, c, in->tp, d, e);
	else
		printf("each rank\n"
		       "  stores %s B per token, so %s per rank holds %s tokens, private or "
		       "shared\n"
		       "  alike (GPU: %s more).\n",
		       b, a, c, e);
}

static void plan_text(const struct plan_in *in, const struct plan_out *o)
{
	const struct plan_model *m = &in->m;
	char a[64], b[64], c[32], d[32];

	if (m->attn == PLAN_MLA)
		printf("model      %s: MLA, %u layers x %u latent elements x %u B per token\n",
		       m->name ? m->name : "custom", m->layers, m->latent_dim, m->dtype_bytes);
	else
		printf("model      %s: MHA/GQA, %u layers x 2 x %u KV heads x %u x %u B per "
		       "token\n",
		       m->name ? m->name : "custom", m->layers, m->kv_heads, m->head_dim,
		       m->dtype_bytes);
	printf("engine     TP=%u, KV per token: %s B per rank, %s B across the ranks, %s B "
	       "distinct\n",
	       in->tp, fmt_count(o->bytes_token_rank, a, sizeof(a)),
	       fmt_count(o->bytes_token_engine, b, sizeof(b)),
	       fmt_count(o->bytes_token_unique, c, sizeof(c)));
	printf("page       %u tokens = %s B per rank (%s slot)\n", in->page_tokens,
	       fmt_count(o->bytes_token_rank * in->page_tokens, a, sizeof(a)),
	       text_bytes((double)o->slot_bytes, d, sizeof(d)));
	printf("requests   %s tokens on average\n\n", fmt_count(in->req_tokens, a, sizeof(a)));
	printf("  %-26s %-30s %s\n", "", "private per-rank pools", "one shared kvbroker pool");
	snprintf(a, sizeof(a), "%s tokens", fmt_count(o->gpu.tokens, c, sizeof(c)));
	row("GPU KV (each rank)", a, a);
	row("  requests that fit", fmt_count(o->gpu.requests, a, sizeof(a)), a);
	tier_rows("host RAM", &o->priv_host, &o->shared_host, in->tp);
	tier_rows("disk", &o->priv_disk, &o->shared_disk, in->tp);
	row("all tiers: requests", fmt_count(o->priv_requests, a, sizeof(a)),
	    fmt_count(o->shared_requests, b, sizeof(b)));
	printf("\n");
	if (m->attn == PLAN_MLA && in->tp > 1)
		printf("host capacity x%.2f: with MLA every TP rank holds the same latent KV, so "
		       "%u\n"
		       "private pools store each page %u times; one shared pool stores it once "
		       "and\n"
		       "all %u ranks read it.\n",
		       o->host_gain, in->tp, in->tp, in->tp);
	else
		printf("host capacity x%.2f: %s, so a shared pool saves nothing across\n"
		       "ranks; it still shares prefixes across engines and jobs "
		       "(workload-dependent).\n",
		       o->host_gain,
		       m->attn == PLAN_MLA ? "one rank" : "MHA/GQA ranks hold different KV heads");
	naive_line(in, o);
}

/* Explicit model flags (non-zero fields of o) over a preset's values. */
static void override(struct plan_model *m, const struct plan_model *o)
{
	if (o->attn)
		m->attn = o->attn;
	if (o->layers)
		m->layers = o->layers;
	if (o->latent_dim)
		m->latent_dim = o->latent_dim;
	if (o->kv_heads)
		m->kv_heads = o->kv_heads;
	if (o->head_dim)
		m->head_dim = o->head_dim;
	if (o->dtype_bytes)
		m->dtype_bytes = o->dtype_bytes;
	if (o->weight_bytes)
		m->weight_bytes = o->weight_bytes;
}

int ctl_plan(int argc, char **argv, int json)
{
	enum {
		O_MODEL = 256,
		O_ATTN,
		O_LAYERS,
		O_KVDIM,
		O_HEADS,
		O_HDIM,
		O_DTYPE,
		O_WEIGHTS,
		O_TP,
		O_GPUTOK,
		O_GPUMEM,
		O_FRAC,
		O_HOST,
		O_DISK,
		O_REQ,
		O_PAGE,
		O_JSON,
		O_LIST,
		O_HELP,
		O_SLAB,
		O_ARENAS
	};
	static const struct option opts[] = {
		{"model", required_argument, NULL, O_MODEL},
		{"attention", required_argument, NULL, O_ATTN},
		{"layers", required_argument, NULL, O_LAYERS},
		{"kv-dim", required_argument, NULL, O_KVDIM},
		{"kv-heads", required_argument, NULL, O_HEADS},
		{"head-dim", required_argument, NULL, O_HDIM},
		{"dtype", required_argument, NULL, O_DTYPE},
		{"weights", required_argument, NULL, O_WEIGHTS},
		{"tp", required_argument, NULL, O_TP},
		{"gpu-tokens", required_argument, NULL, O_GPUTOK},
		{"gpu-mem", required_argument, NULL, O_GPUMEM},
		{"mem-fraction", required_argument, NULL, O_FRAC},
		{"host-ram", required_argument, NULL, O_HOST},
		{"disk", required_argument, NULL, O_DISK},
		{"req-len", required_argument, NULL, O_REQ},
		{"page-tokens", required_argument, NULL, O_PAGE},
		{"json", no_argument, NULL, O_JSON},
		{"list", no_argument, NULL, O_LIST},
		{"help", no_argument, NULL, O_HELP},
		{"slab", required_argument, NULL, O_SLAB},
		{"numa-nodes", required_argument, NULL, O_ARENAS},
		{NULL, 0, NULL, 0},
	};
	struct plan_in in = {.tp = 1, .mem_fraction = 0.85, .req_tokens = 4096, .page_tokens = 64};
	struct plan_model over = {0}; /* explicit flags, over the preset whatever their order */
	const struct plan_model *preset = NULL;
	struct plan_out out;
	uint64_t v;
	char *end;
	int o, err = 0;

	optind = 1;
	while ((o = cli_getopt(argc, argv, "h", opts, "kvbctl plan")) != -1) {
		switch (o) {
		case O_MODEL: {
			const struct plan_model *p = plan_preset(optarg);

			if (!p)
				return cli_usage_error(
					"kvbctl plan",
					"no preset '%s' (kvbctl plan --list names them)", optarg);
			preset = p;
			break;
		}
		case O_ATTN:
			if (!strcmp(optarg, "mla"))
				over.attn = PLAN_MLA;
			else if (!strcmp(optarg, "mha") || !strcmp(optarg, "gqa") ||
				 !strcmp(optarg, "mqa"))
				over.attn = PLAN_MHA;
			else
				err = -EINVAL;
			break;
		case O_DTYPE:
			over.dtype_bytes = !strcmp(optarg, "bf16") || !strcmp(optarg, "fp16") ? 2
					   : !strcmp(optarg, "fp8")			      ? 1
					   : !strcmp(optarg, "fp32")			      ? 4
											      : 0;
			err = over.dtype_bytes ? 0 : -EINVAL;
			break;
		case O_LAYERS:
		case O_KVDIM:
		case O_HEADS:
		case O_HDIM:
		case O_TP:
		case O_PAGE:
			err = parse_u64(optarg, &v);
			if (!err && (!v || v > UINT32_MAX))
				err = -EINVAL;
			*(o == O_LAYERS	 ? &over.layers
			  : o == O_KVDIM ? &over.latent_dim
			  : o == O_HEADS ? &over.kv_heads
			  : o == O_HDIM	 ? &over.head_dim
			  : o == O_TP	 ? &in.tp
					 : &in.page_tokens) = (uint32_t)v;
			break;
		case O_GPUTOK:
			err = parse_u64(optarg, &in.gpu_tokens);
			break;
		case O_REQ:
			err = parse_u64(optarg, &in.req_tokens);
			break;
		case O_WEIGHTS:
			err = size_parse(optarg, &over.weight_bytes);
			break;
		case O_GPUMEM:
			err = size_parse(optarg, &in.gpu_bytes);
			break;
		case O_HOST:
			err = size_parse(optarg, &in.host_bytes);
			break;
		case O_DISK:
			err = size_parse(optarg, &in.disk_bytes);
			break;
		case O_SLAB:
			err = size_parse(optarg, &in.slab_bytes);
			break;
		case O_ARENAS:
			err = parse_u64(optarg, &v);
			if (!err && (!v || v > 8))
				err = -EINVAL;
			in.arenas = (uint32_t)v;
			break;
		case O_FRAC:
			in.mem_fraction = strtod(optarg, &end);
			err = *end || in.mem_fraction <= 0 || in.mem_fraction > 1 ? -EINVAL : 0;
			break;
		case O_JSON:
			json = 1;
			break;
		case O_LIST:
			for (const struct plan_model *p = plan_presets; p->name; p++)
				printf("%-16s %s, %u layers, %s\n", p->name, attn_name(p->attn),
				       p->layers,
				       p->attn == PLAN_MLA ? "latent KV shared by all TP ranks"
							   : "KV heads split across TP ranks");
			return 0;
		case O_HELP:
		case 'h':
			plan_usage(stdout);
			return 0;
		default: /* cli_getopt() said what */
			return CLI_USAGE;
		}
		if (err)
			return cli_usage_error("kvbctl plan", "bad value '%s' for --%s", optarg,
					       opts[o - O_MODEL].name);
	}
	if (optind < argc)
		return cli_usage_error("kvbctl plan", "unexpected argument '%s'", argv[optind]);
	if (preset)
		in.m = *preset;
	else
		in.m.dtype_bytes = 2;
	override(&in.m, &over);
	if (!in.m.attn || !in.m.layers)
		return cli_usage_error("kvbctl plan",
				       "name a --model, or give --attention and --layers");
	if (!in.gpu_tokens && !in.gpu_bytes)
		return cli_usage_error("kvbctl plan",
				       "give --gpu-tokens, or --gpu-mem (and --mem-fraction)");
	if (plan_compute(&in, &out))
		return cli_usage_error(
			"kvbctl plan",
			"inconsistent inputs (mla needs --kv-dim, mha --kv-heads and "
			"--head-dim; with --gpu-mem the weights per rank must fit in "
			"gpu-mem x mem-fraction)");
	if (json)
		return plan_json(&in, &out);
	plan_text(&in, &out);
	return 0;
}
