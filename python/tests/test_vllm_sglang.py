# SPDX-License-Identifier: MIT
"""One page store for two engines: SGLang 0.5.23's HiCache through kvbroker.sglang and vLLM
0.33.0 through kvbroker.vllm, same model (name), page size, KV dtype and per-token layout.

SGLang -> vLLM: pages SGLang's host pool holds are stored with the backend's batch_set_v1
under SGLang's own get_hash_str keys; vLLM's real Scheduler matches them and its worker
loads them, byte-exact, into vLLM's KV tensors (MiniEngine checks every computed token).
vLLM -> SGLang: what vLLM stored, batch_exists finds and batch_get_v1 loads into SGLang's
host pool, byte-exact against the canonical page of the same KV.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
pytest.importorskip("vllm")
pytest.importorskip("sglang")

# isort: off
import sglang_support as S  # SGLang first (see there)

# isort: on

import torch
from sglang.srt.mem_cache.utils import get_hash_str

import vllm_support as vs
from conftest import Broker
from kvbroker.sglang import KVBrokerStorage
from test_vllm_cross import canonical_page

BS = 16
POOL_PAGES = 16


def _pool(mla: bool) -> Any:
    if mla:
        return S.mla_host_pool("page_first_direct", layers=vs.NUM_LAYERS, page=BS,
                               tokens=POOL_PAGES * BS, dtype=torch.bfloat16)
    return S.mha_host_pool("page_first_direct", layers=vs.NUM_LAYERS, page=BS,
                           tokens=POOL_PAGES * BS, heads=vs.HEADS, head_dim=vs.HEAD_DIM,
                           dtype=torch.bfloat16)


def _canon(b: KVBrokerStorage, page: int) -> torch.Tensor:
    flat = b.mem_pool_host.kv_buffer.view(-1).view(torch.uint8)
    assert b.geometry is not None
    return b.geometry.canonical(flat, page * BS)


def _tokens(seed: int, n: int) -> list[int]:
    return [(seed * 7919 + i * 31) % 20000 + 1 for i in range(n)]


@pytest.mark.parametrize("mla", [True, False])
def test_sglang_stores_vllm_loads(tmp_path: Path, broker: Broker, mla: bool) -> None:
    model = f"shared/Cross-{'MLA' if mla else 'MHA'}-In"
    pool = _pool(mla)
    b = S.kvbroker_backend(pool, broker.socket, mla=mla, model=model)
    tokens = _tokens(3 + mla, 6 * BS + 4)
    keys = get_hash_str(tokens[: len(tokens) // BS * BS], None, page_size=BS)
    assert len(keys) == 6
    slots = list(range(1, 7))
    for i, p in enumerate(slots):  # SGLang's pool holds the KV of these tokens
        _canon(b, p).copy_(torch.frombuffer(bytearray(canonical_page(mla, tokens, i)),
                                            dtype=torch.uint8).view(_canon(b, p).shape))
    assert b.batch_set_v1(keys, S.indices(slots, BS)) == [True] * 6
    e = vs.MiniEngine(tmp_path, broker.socket, mla=mla, extra={"model": model})
    assert e.worker.plans[0].layout.model == b.layout.model
    e.run([vs.make_request("r", tokens, BS, max_tokens=2)])
    assert e.bad == [] and e.invalid_reports == []
    assert e.computed_tokens == len(tokens) + 1 - 6 * BS  # six pages came from SGLang
    b.close()


@pytest.mark.parametrize("mla", [True, False])
def test_vllm_stores_sglang_loads(tmp_path: Path, broker: Broker, mla: bool) -> None:
    model = f"shared/Cross-{'MLA' if mla else 'MHA'}-Out"
    e = vs.MiniEngine(tmp_path, broker.socket, mla=mla, extra={"model": model})
    tokens = _tokens(9 + mla, 5 * BS + 2)
    e.run([vs.make_request("r", tokens, BS, max_tokens=2)])
    pool = _pool(mla)
    S.fill(pool, 1)
    b = S.kvbroker_backend(pool, broker.socket, mla=mla, model=model)
    keys = get_hash_str(tokens[: len(tokens) // BS * BS], None, page_size=BS)
    assert b.batch_exists(keys) == 5
    slots = [2, 4, 6, 8, 10]
    assert b.batch_get_v1(keys, S.indices(slots, BS)) == [True] * 5
    for i, p in enumerate(slots):
        got = _canon(b, p).contiguous().numpy().tobytes()
        assert got == canonical_page(mla, tokens, i), f"page {i}"
    b.close()
