# SPDX-License-Identifier: MIT
"""Namespace identity and KV memory layouts of the vLLM connector (both roles).

Identity: which namespace each prefix-cacheable KV cache group's pages live in, computed
from the KV cache config identically in the scheduler and in every worker (and by SGLang's
backend for the same model). Full-attention groups store every block; sliding-window and
chunked-local groups store every block they computed too (each block's KV is a function of
the token prefix), but vLLM keeps only the blocks their window still reads, so a hit needs
only those (_GroupPlan.first_kept); each group's pages live in a namespace of their own.
Mamba/state groups hold one running state, not per-block KV: a model with one is not served
from kvbroker (vLLM recomputes its requests).

Memory: where a layer's K and V (or MLA latent) of one vLLM block lie, read from the layer's
attention backend and the tensor vLLM hands the connector, never guessed from a shape
alone. Every layout maps to the canonical page (docs/protocol.md): per component (K, V or
the latent) and layer, block_size token rows of [head][head_dim] elements. :func:`kv_views`
returns, per (component, layer), a torch view of shape [num_blocks, ...] whose trailing
dimensions read back in canonical order; the worker moves pages through the broker's views
where every token's row is one byte range (NHD) and through a converting copy elsewhere (HND,
head-packed, vLLM-CPU's kernel-private block format).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.kv_cache_interface import (
    AttentionSpec,
    ChunkedLocalAttentionSpec,
    FullAttentionSpec,
    MLAAttentionSpec,
    SlidingWindowSpec,
)

import kvbroker as kvb
from kvbroker._layout import model_ns_name

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger("kvbroker.vllm")

# cache_dtype values whose elements are a plain dtype kvbroker names; any other quantized
# cache format goes into the namespace's page_format so it never shares with a plain one.
_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
                 "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


@dataclass(frozen=True)
class _GroupPlan:
    """One stored KV cache group and the namespace its pages live in."""

    group_id: int
    layer_names: tuple[str, ...]
    mla: bool
    # (component name, bytes per token and layer, which half of an MHA layer: 0 K, 1 V, -1 MLA)
    components: tuple[tuple[str, int, int], ...]
    layout: kvb.Layout
    # A sliding-window group (vLLM's SlidingWindowManager): the window and the tokens it
    # retains below it; a chunked-local group: the chunk. 0: a full-attention group.
    window: int = 0
    retained: int = 0
    chunk: int = 0

    def first_kept(self, ntokens: int) -> int:
        """The first block vLLM keeps for this group once ntokens are computed (blocks
        before it are its null block), what the group's get_num_skipped_tokens() skips:
        a hit of ntokens needs this group's pages from there on, and only those.
        """
        if self.window:
            return max(0, ntokens - self.window + 1 - self.retained) // \
                self.layout.tokens_per_page
        if self.chunk:
            return ntokens // self.chunk * self.chunk // self.layout.tokens_per_page
        return 0


def _model_name(vllm_config: VllmConfig, extra: dict[str, Any]) -> str:
    if extra.get("namespace"):
        return str(extra["namespace"])  # verbatim
    name = extra.get("model")
    if not name:
        mc = vllm_config.model_config
        served = getattr(mc, "served_model_name", None)
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        name = served or mc.model
    return model_ns_name(str(name))


def _dtype_and_format(vllm_config: VllmConfig, spec: AttentionSpec) -> tuple[str, str]:
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype == "auto":
        return str(spec.dtype).removeprefix("torch."), ""
    if cache_dtype in _CACHE_DTYPES:
        return _CACHE_DTYPES[cache_dtype], ""
    return "", ("vllm:" + cache_dtype)[:31]


def skip_reason(spec: Any) -> str | None:
    """Why a KV cache group's pages are not stored (None: they are). A block's page is
    stored where it is a pure function of the token prefix: full attention (MHA or MLA,
    including a sliding-window layer vLLM allocates as full attention when its hybrid
    allocator is off), and sliding-window and chunked-local attention (per block; vLLM frees
    the blocks behind the window, see _GroupPlan.first_kept). A Mamba/state group holds one
    running state instead of per-token KV: no page is defined.
    """
    if not isinstance(spec, AttentionSpec):
        return f"{type(spec).__name__} (a running state, no per-block KV)"
    if int(getattr(spec, "tokens_per_state", 1) or 1) != 1:
        return "compressed states (tokens_per_state != 1)"
    if type(spec) in (SlidingWindowSpec, ChunkedLocalAttentionSpec):
        return None
    if not isinstance(spec, (FullAttentionSpec, MLAAttentionSpec)):
        return f"{type(spec).__name__}"
    if type(spec) not in (FullAttentionSpec, MLAAttentionSpec) and \
            (getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size",
                                                              None)):
        return f"{type(spec).__name__} with a window"  # a variant of its own: not known
    return None


def namespace_layouts(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig,
                      tp_rank: int = 0, tp_size: int | None = None,
                      pp_rank: int = 0) -> list[_GroupPlan]:
    """The namespaces of a vLLM configuration: one per stored KV cache group.

    The first full-attention group's namespace is the model's (what SGLang uses for the
    same model); every other group gets one of its own, "<model>/g<id>" ("w<window>" or
    "c<chunk>" appended for sliding-window and chunked-local groups), so one group's pages
    are never read as another's. MLA groups carry no TP identity (every rank holds the same
    latent KV), MHA groups carry the TP rank and size. Groups skip_reason() names are left
    out; a model with no storable group raises ValueError.
    """
    ktc = vllm_config.kv_transfer_config
    extra = (ktc.kv_connector_extra_config if ktc is not None else None) or {}
    par = vllm_config.parallel_config
    if tp_size is None:
        tp_size = int(par.tensor_parallel_size)
    model = _model_name(vllm_config, extra)
    plans: list[_GroupPlan] = []
    skipped: list[str] = []
    cacheable = list(kv_cache_config.prefix_cacheable_group_ids)
    for gid in cacheable:
        group = kv_cache_config.kv_cache_groups[gid]
        spec = group.kv_cache_spec
        why = skip_reason(spec)
        if why is not None or not isinstance(spec, AttentionSpec):
            skipped.append(f"group {gid}: {why}")
            continue
        mla = isinstance(spec, MLAAttentionSpec)
        esize = torch.empty((), dtype=spec.dtype).element_size()
        nheads = spec.num_kv_heads
        if mla:
            comps: tuple[tuple[str, int, int], ...] = (("kv", nheads * spec.head_size * esize, -1),)
        else:
            comps = (("k", nheads * spec.head_size * esize, 0),
                     ("v", nheads * spec.head_size_v * esize, 1))
        dtype, page_format = _dtype_and_format(vllm_config, spec)
        nlayers = len(group.layer_names)
        window = int(spec.sliding_window) if isinstance(spec, SlidingWindowSpec) else 0
        chunk = int(spec.attention_chunk_size) \
            if isinstance(spec, ChunkedLocalAttentionSpec) else 0
        if not window and not chunk and not any(not (p.window or p.chunk) for p in plans):
            name = model
        else:
            suffix = f"/g{gid}" + (f"w{window}" if window else f"c{chunk}" if chunk else "")
            name = model[:63 - len(suffix)] + suffix
        layout = kvb.Layout(
            name, kvb.MLA if mla else kvb.MHA, spec.block_size,
            [kvb.Component(c, nlayers, b) for c, b, _ in comps],
            tp_size=1 if mla else tp_size, tp_rank=0 if mla else tp_rank, dtype=dtype,
            pp_size=int(par.pipeline_parallel_size), pp_rank=pp_rank, page_format=page_format,
            # DP replicas of MLA hold the same pages; MHA states its DP group (not identity
            # for the broker, but what SGLang states too).
            dp_size=1 if mla else int(par.data_parallel_size),
            dp_rank=0 if mla else int(par.data_parallel_rank))
        plans.append(_GroupPlan(gid, tuple(group.layer_names), mla, comps, layout,
                                window=window, chunk=chunk,
                                retained=int(getattr(spec, "extra_retained_tokens", 0) or 0)))
    if not plans:
        raise ValueError("kvbroker: no KV cache group kvbroker can store (" +
                         ("; ".join(skipped) or "no prefix-cacheable group") + ")")
    if skipped:  # the connector says what this means for the model, once
        logger.debug("kvbroker: not stored: %s", "; ".join(skipped))
    if len({p.layout.tokens_per_page for p in plans}) != 1:
        raise ValueError("kvbroker: stored KV cache groups of different block sizes")
    return plans


def storage_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The parent of a chain's first page for requests namespaced by a salt, byte for byte
    SGLang 0.5.23's mem_cache.utils.storage_namespace_seed (so a salted request finds what a
    SGLang request with the same cache_salt stored): None without either part.
    """
    if extra_key is None and cache_salt is None:
        return None
    h = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
            continue
        enc = part.encode("utf-8")
        h.update(b"\x01" + len(enc).to_bytes(8, "little") + enc)
    return h.digest()


def _salt_parent(request: Request) -> bytes | None:
    """The chain's parent for requests whose KV depends on more than their tokens: a cache
    salt (SGLang's seed, shared) or a LoRA adapter (an extra key only vLLM uses: the same
    adapter name in SGLang is not known to be the same weights).
    """
    lora = getattr(request, "lora_request", None)
    extra_key = None if lora is None else \
        "vllm-lora:" + str(getattr(lora, "lora_name", None) or getattr(lora, "name", lora))
    return storage_namespace_seed(extra_key, getattr(request, "cache_salt", None))


def _owner(key: bytes, n: int) -> int:
    """Which of n ranks stores a page of a namespace all ranks share (MLA)."""
    return int.from_bytes(key[:4], "little") % n if n > 1 else 0


# ---------------------------------------------------------------------------------------------
# KV memory: vLLM's tensor of one layer -> canonical views per component
# ---------------------------------------------------------------------------------------------


class LayoutError(ValueError):
    """vLLM handed the connector a KV layout kvbroker does not know how to map."""


def _backend_of(vllm_config: Any, layer_name: str) -> tuple[str, Any]:
    """(attention backend name, the layer module) of a layer, ("", None) where vLLM has no
    forward context for it (the connector driven outside a model runner).
    """
    try:
        ctx = vllm_config.compilation_config.static_forward_context
        layer = ctx.get(layer_name)
    except AttributeError:
        return "", None
    if layer is None:
        return "", None
    backend = getattr(layer, "attn_backend", None)
    if backend is None and hasattr(layer, "get_attn_backend"):
        backend = layer.get_attn_backend()
    name = ""
    if backend is not None:
        try:
            name = str(backend.get_name())
        except Exception:
            name = type(backend).__name__
    return name, layer


def _u8(t: torch.Tensor) -> torch.Tensor:
    """The tensor's elements as bytes (a view): one more trailing dimension of element_size."""
    es = t.element_size()
    return torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage(), t.storage_offset() * es, (*t.shape, es),
        (*(s * es for s in t.stride()), 1))


def _split_halves(t: torch.Tensor, num_blocks: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """K and V of a split-layout tensor: [2, blocks, N, H, D] (FlashAttention) or
    [blocks, 2, N, H, D] (FlashInfer), in logical order with the physical strides.
    """
    if t.dim() != 5:
        return None
    if t.shape[0] == 2 and t.shape[1] >= num_blocks and not (t.shape[1] == 2 and num_blocks == 2):
        return t[0], t[1]
    if t.shape[1] == 2 and t.shape[0] >= num_blocks:
        return t[:, 0], t[:, 1]
    return None


def _to_blocks(t: torch.Tensor, num_blocks: int, block_size: int) -> torch.Tensor:
    """[kernel blocks, kb, ...] -> [blocks, block_size / kb, kb, ...] where vLLM splits its
    blocks into smaller kernel blocks (a view; kernel blocks of a block are consecutive).
    """
    kb = t.shape[1]
    if kb == block_size:
        return t[:num_blocks]
    if block_size % kb or t.shape[0] < num_blocks * (block_size // kb):
        raise LayoutError(f"KV tensor shape {tuple(t.shape)} does not hold {num_blocks} "
                          f"blocks of {block_size} tokens")
    out: torch.Tensor = t[: num_blocks * (block_size // kb)].unflatten(  # type: ignore[no-untyped-call]
        0, (num_blocks, block_size // kb))
    return out


@dataclass
class LayerKV:
    """One layer's KV as canonical views: views[c] is [num_blocks, ...] whose trailing
    dimensions, read in order, are the component's canonical bytes of a block
    (block_size rows of [head][head_dim] elements, as bytes). ``how`` names the layout.
    """

    views: list[torch.Tensor]
    how: str


def _cpu_probe(layer: Any, spec: AttentionSpec, vllm_config: Any) -> torch.Tensor:
    """Where vLLM-CPU's own kernel puts each K element of a block: runs the backend's
    do_kv_cache_update on a scratch block with K = each of (token, head, dim) in turn and
    returns idx[t, h, d] = the element offset of K[t, h, d] in the block's [H, N, 2D] cells
    (V likewise at idx2 after them). Raises LayoutError where the kernel's placement is not
    a permutation (e.g. a quantized cache).
    """
    bs, nh, hd = spec.block_size, spec.num_kv_heads, spec.head_size
    dtype = spec.dtype
    impl = layer.impl
    if getattr(layer, "isa", None) is None:
        from vllm.v1.attention.backends import cpu_attn
        layer.isa = cpu_attn._get_attn_isa(dtype, bs, hd, vllm_config.cache_config.cache_dtype)
    n = bs * nh * hd
    coords = torch.stack(torch.meshgrid(torch.arange(bs), torch.arange(nh), torch.arange(hd),
                                        indexing="ij"), -1).reshape(-1, 3)
    flat = coords[:, 0] * nh * hd + coords[:, 1] * hd + coords[:, 2]  # canonical index
    # Encode the canonical index in base 128 digits (exact in bf16/fp16), one pass each.
    digits = []
    base, x = 128, flat.clone()
    while True:
        digits.append(x % base)
        x = x // base
        if not bool(x.any()):
            break
    slots = torch.arange(bs, dtype=torch.int64)
    pos = []
    for which in (0, 1):  # K, V
        canon = torch.zeros(nh * bs * 2 * hd, dtype=torch.int64)
        mask = None
        for i, dig in enumerate(digits):
            scratch = torch.zeros((1, nh, bs, 2 * hd), dtype=dtype)
            vals = (dig + 1).to(dtype).reshape(bs, nh, hd)
            zero = torch.zeros_like(vals)
            key, val = (vals, zero) if which == 0 else (zero, vals)
            impl.do_kv_cache_update(layer, key, val, scratch, slots)
            got = scratch.reshape(-1).to(torch.int64)
            m = got > 0
            if mask is None:
                mask = m
            if bool((got > base).any()) or int(m.sum()) != n or not torch.equal(m, mask):
                raise LayoutError("vLLM-CPU's KV kernel did not store each element once "
                                  f"(cache dtype {vllm_config.cache_config.cache_dtype})")
            canon += torch.where(m, got - 1, 0) * (base ** i)
        assert mask is not None
        at = torch.nonzero(mask).flatten()  # element offsets holding this component
        inv = torch.full((n,), -1, dtype=torch.int64)
        inv[canon[at]] = at
        if bool((inv < 0).any()):
            raise LayoutError("vLLM-CPU's KV kernel placement is not a permutation")
        pos.append(inv)
    return torch.stack(pos)


def _affine(pos: torch.Tensor, shape: tuple[int, ...]) -> tuple[int, tuple[int, ...]] | None:
    """(offset, strides) when pos (canonical-order flat -> element offset) is affine over
    the canonical shape, else None.
    """
    p = pos.reshape(shape)
    off = int(p.flatten()[0])
    strides = []
    for d in range(len(shape)):
        idx = [0] * len(shape)
        if shape[d] > 1:
            idx[d] = 1
            strides.append(int(p[tuple(idx)]) - off)
        else:
            strides.append(0)
    grids = torch.meshgrid(*[torch.arange(s) for s in shape], indexing="ij")
    expect = torch.full(shape, off, dtype=torch.int64)
    for g, s in zip(grids, strides, strict=True):
        expect += g * s
    if not torch.equal(expect, p):
        return None
    return off, tuple(strides)


_PROBES: dict[tuple[Any, ...], tuple[int, tuple[int, ...], int, tuple[int, ...]]] = {}


def kv_views(vllm_config: Any, plan: _GroupPlan, name: str, t: torch.Tensor, *,
             spec: AttentionSpec, num_blocks: int) -> LayerKV:
    """The canonical views of one layer's KV tensor (see LayerKV). Raises LayoutError naming
    the layout where it is not one kvbroker maps.
    """
    bs = spec.block_size
    backend, layer = _backend_of(vllm_config, name)
    if plan.mla:
        # [blocks, N, C] latent rows (every backend: one row per token, no heads).
        tt = t if t.dim() == 3 else (t.squeeze(1) if t.dim() == 4 and t.shape[1] == 1 else None)
        if tt is None:
            raise LayoutError(f"MLA KV tensor of layer {name} has shape {tuple(t.shape)} "
                              f"(backend {backend or 'unknown'}); expected [blocks, N, C]")
        return LayerKV([_to_blocks(_u8(tt), num_blocks, bs).flatten(-2)], "mla")
    nh, hd, hdv = spec.num_kv_heads, spec.head_size, spec.head_size_v
    if backend == "CPU_ATTN":
        # vLLM-CPU: [blocks, H, N, 2D] cells, but its kernel stores K and V in a block
        # format of its own ([H][2N][D] rows with K and V per head in kernel order):
        # probed through the backend's own update, then read as a strided view of the
        # canonical order where the placement is affine.
        if tuple(t.shape[1:]) != (nh, bs, 2 * hd) or not t.is_contiguous():
            raise LayoutError(f"vLLM-CPU KV tensor of layer {name}: shape {tuple(t.shape)}, "
                              f"stride {t.stride()}; expected contiguous [blocks, {nh}, {bs}, "
                              f"{2 * hd}]")
        key = (nh, bs, hd, spec.dtype, getattr(layer, "isa", None),
               str(vllm_config.cache_config.cache_dtype))
        if key not in _PROBES:
            pos = _cpu_probe(layer, spec, vllm_config)
            ak = _affine(pos[0], (bs, nh, hd))
            av = _affine(pos[1], (bs, nh, hd))
            if ak is None or av is None:
                raise LayoutError("vLLM-CPU's block format (ISA "
                                  f"{getattr(layer, 'isa', '?')}) is not a strided "
                                  "permutation of the canonical page")
            _PROBES[key] = (*ak, *av)
        ko, ks, vo, vs = _PROBES[key]
        blk = t.stride(0)
        views = [torch.as_strided(t, (num_blocks, bs, nh, hd), (blk, *s), t.storage_offset() + o)
                 for o, s in ((ko, ks), (vo, vs))]
        return LayerKV([_u8(v) for v in views], f"vllm-cpu K{ks} V{vs}")
    halves = _split_halves(t, num_blocks)
    if halves is not None and tuple(halves[0].shape[2:]) == (nh, hd):
        # [blocks, N, H, D] each (the strides say NHD or HND).
        views = [_to_blocks(_u8(h), num_blocks, bs) for h in halves]
        return LayerKV(views, "split")
    if t.dim() == 4 and tuple(t.shape[1:]) == (nh, t.shape[2], hd + hdv) and \
            backend not in _PRIVATE_FORMATS:
        # Packed [blocks, H, N, K|V] cells (vLLM's dense K/V content): K and V are the two
        # halves of each cell.
        tt = t.transpose(1, 2)  # [blocks, N, H, D+Dv]
        views = [_to_blocks(_u8(tt[..., :hd]), num_blocks, bs),
                 _to_blocks(_u8(tt[..., hd:]), num_blocks, bs)]
        return LayerKV(views, "packed")
    raise LayoutError(f"KV layout of layer {name} not supported: backend "
                      f"{backend or 'unknown'}, tensor shape {tuple(t.shape)}, stride "
                      f"{t.stride()}, {nh} KV heads of {hd}; kvbroker maps split "
                      "[2, blocks, N, H, D] / [blocks, 2, N, H, D], packed [blocks, H, N, 2D], "
                      "MLA [blocks, N, C] and vLLM-CPU's block format")


# Backends whose packed cells are not plain K|V rows (a kernel-private interior): they need
# their own probe; until then, refused rather than read wrong.
_PRIVATE_FORMATS = frozenset({"CPU_ATTN", "TURBOQUANT_ATTN", "ULTRAQUANT_ATTN"})


def token_range(v: torch.Tensor) -> tuple[int, int, int] | None:
    """(byte offset of block 0 token 0 in its storage, token stride, block stride) when every
    token row of the canonical view v ([blocks, N, ...] bytes) is one contiguous byte range,
    i.e. what a broker view part can address; None otherwise (converting copy).
    """
    if v.dim() < 3:
        return None
    expect = 1
    for d in range(v.dim() - 1, 1, -1):
        if v.shape[d] != 1 and v.stride(d) != expect:
            return None
        expect *= v.shape[d]
    if v.shape[1] > 1 and v.stride(1) < expect:
        return None
    return int(v.storage_offset()), int(v.stride(1)), int(v.stride(0))
