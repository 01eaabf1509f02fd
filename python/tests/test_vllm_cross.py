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
