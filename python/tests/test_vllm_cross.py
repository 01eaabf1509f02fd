# SPDX-License-Identifier: MIT
"""Pages shared between kvbroker.vllm and other engines: the canonical page bytes.

What vLLM's connector stores must be kvbroker's canonical page, [component][layer][token]
[bytes] (MLA: one component "kv"; MHA: "k" then "v"), under the SGLang get_hash_str chain
keys, in the namespace SGLang's backend opens for the same model; and a canonical page some
other engine stored must land byte-exact in vLLM's own KV layout. test_vllm_sglang.py does the
same through SGLang's real backend and host pools.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, cast

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local config.json; nothing downloads
pytest.importorskip("vllm")

import torch

import kvbroker as kvb
import vllm_support as vs
from conftest import Broker
from kvbroker.vllm import model_ns_name, namespace_layouts, storage_namespace_seed

BS = 16


def canonical_page(mla: bool, tokens: list[int], page: int) -> bytes:
    """The canonical bytes of page `page` of tokens, with vs.kv_value's KV."""
    pos = torch.arange(page * BS, (page + 1) * BS)
    tok = torch.tensor(tokens[page * BS:(page + 1) * BS], dtype=torch.int64)
    out = []
    halves = [0] if mla else [0, 1]
    width = vs.MLA_DIM * 2 if mla else vs.HEADS * vs.HEAD_DIM * 2
    for h in halves:  # component-major
        for layer in range(vs.NUM_LAYERS):
            out.append(vs.kv_value(layer * 2 + h, pos, tok, width).flatten())
    return torch.cat(out).numpy().tobytes()


def _tokens(seed: int, n: int) -> list[int]:
    return [(seed * 104729 + i * 17) % 30000 + 1 for i in range(n)]


def test_names_and_seed_match_sglang_rules() -> None:
    assert model_ns_name("moonshotai/Kimi-K2.5") == "kimi-k2.5"
    assert model_ns_name("/models/Kimi-K2.5/") == "kimi-k2.5"
    long = model_ns_name("x" * 100)
    assert len(long) == 63 and long.startswith("x" * 46 + "-")
    assert storage_namespace_seed(None, None) is None
    # SGLang 0.5.23 mem_cache.utils.storage_namespace_seed, by hand: presence + length + bytes.
    import hashlib
    h = hashlib.sha256(b"sglang-cache-namespace-v1")
    h.update(b"\x00" + b"\x01" + (4).to_bytes(8, "little") + b"salt")
    assert storage_namespace_seed(None, "salt") == h.digest()


@pytest.mark.parametrize("mla", [True, False])
def test_other_engine_pages_load_into_vllm(tmp_path: Path, broker: Broker, mla: bool) -> None:
    extra = {"model": f"cross-in-{mla}"}
    e = vs.MiniEngine(tmp_path, broker.socket, mla=mla, extra=extra)
    plan = namespace_layouts(e.vc, e.kcc)[0]
    tokens = _tokens(1 + mla, 10 * BS + 3)
    keys = kvb.page_keys(tokens, BS)
    with kvb.connect(broker.socket) as c:
        ns = c.ns_open(kvb.Layout(model_ns_name(f"cross-in-{mla}"), kvb.MLA if mla else kvb.MHA, BS,
                                  list(plan.layout.components), dtype="bf16"))
        assert ns.page_bytes == plan.layout.page_bytes
        for i, k in enumerate(keys):
            assert ns.put(k, canonical_page(mla, tokens, i))
    e.run([vs.make_request("r", tokens, BS, max_tokens=2)])
    assert e.bad == [] and e.invalid_reports == []
    assert e.computed_tokens == len(tokens) + 1 - 10 * BS  # the 10 pages came from the broker


@pytest.mark.parametrize("mla", [True, False])
def test_vllm_pages_are_canonical(tmp_path: Path, broker: Broker, mla: bool) -> None:
    extra = {"model": f"cross-out-{mla}"}
    e = vs.MiniEngine(tmp_path, broker.socket, mla=mla, extra=extra)
    tokens = _tokens(5 + mla, 6 * BS + 1)
    e.run([vs.make_request("r", tokens, BS, max_tokens=2)])
    plan = namespace_layouts(e.vc, e.kcc)[0]
    with kvb.connect(broker.socket) as c:
        ns = c.ns_open(plan.layout)
        for i, k in enumerate(kvb.page_keys(tokens, BS)):
            got = ns.get(k)
            assert got is not None, f"page {i} not stored"
            assert bytes(got) == canonical_page(mla, tokens, i), f"page {i} not canonical"


def test_salted_requests_use_sglang_seed(tmp_path: Path, broker: Broker) -> None:
    extra = {"model": "cross-salt"}
    e = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra)
    tokens = _tokens(9, 4 * BS + 2)
    e.run([vs.make_request("r", tokens, BS, max_tokens=2, cache_salt="tenant-a")])
    plan = namespace_layouts(e.vc, e.kcc)[0]
    seeded = kvb.page_keys(tokens, BS, storage_namespace_seed(None, "tenant-a"))
    with kvb.connect(broker.socket) as c:
        ns = c.ns_open(plan.layout)
        assert ns.lookup(seeded) == 4
        assert ns.lookup(kvb.page_keys(tokens, BS)) == 0  # unsalted keys: nothing


def _spec(heads: int, dim: int, bs: int) -> Any:
    from vllm.v1.kv_cache_interface import FullAttentionSpec

    return FullAttentionSpec(block_size=bs, num_kv_heads=heads, head_size=dim,
                             dtype=torch.bfloat16)


def _canonical_of(k: torch.Tensor, v: torch.Tensor, block: int) -> bytes:
    """Canonical bytes of one block, from logical [blocks, N, H, D] K and V tensors."""
    return b"".join(bytes(x[block].contiguous().view(torch.uint8).numpy().tobytes())
                    for x in (k, v))


@pytest.mark.parametrize("kind", ["packed-nhd", "packed-hnd", "split-hnd", "split-nhd"])
def test_layouts_map_onto_the_canonical_page(kind: str) -> None:
    """Each vLLM KV tensor layout, built here with its physical order, reads back through
    kv_views in canonical order ([token][head][dim] per component), whatever the strides."""
    from types import SimpleNamespace

    from kvbroker.vllm.layouts import kv_views, token_range

    nb, bs, h, d = 5, 16, 4, 8
    g = torch.Generator().manual_seed(3)
    k = torch.randn((nb, bs, h, d), generator=g).to(torch.bfloat16)
    v = torch.randn((nb, bs, h, d), generator=g).to(torch.bfloat16)
    if kind.startswith("packed"):
        cells = torch.cat([k, v], -1)  # [B, N, H, 2D]
        # vLLM hands the logical [B, H, N, 2D] view whatever the physical order.
        t = cells.contiguous().transpose(1, 2) if kind == "packed-nhd" else \
            cells.transpose(1, 2).contiguous()
    else:
        kv = torch.stack([k, v], 1)  # [B, 2, N, H, D]
        t = kv.contiguous() if kind == "split-nhd" else \
            kv.transpose(2, 3).contiguous().transpose(2, 3)  # physical [B, 2, H, N, D]
    cfg = SimpleNamespace()
    lk = kv_views(cfg, cast(Any, SimpleNamespace(mla=False)), "layer.0", t,
                  spec=_spec(h, d, bs), num_blocks=nb)
    assert len(lk.views) == 2
    for b in range(nb):
        got = b"".join(bytes(x[b].contiguous().numpy().tobytes()) for x in lk.views)
        assert got == _canonical_of(k, v, b), (kind, b)
    # Only NHD split halves have token rows a broker view can address.
    assert (token_range(lk.views[0]) is not None) == (kind == "split-nhd")


def test_unknown_layout_refused_naming_it() -> None:
    from types import SimpleNamespace

    from kvbroker.vllm import LayoutError
    from kvbroker.vllm.layouts import kv_views

    t = torch.zeros((5, 3, 16, 4, 8), dtype=torch.bfloat16)  # no K/V dimension of 2
    with pytest.raises(LayoutError, match=r"not supported.*\(5, 3, 16, 4, 8\)"):
        kv_views(SimpleNamespace(), cast(Any, SimpleNamespace(mla=False)), "layer.0", t,
                 spec=_spec(4, 8, 16), num_blocks=5)
