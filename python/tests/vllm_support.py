# SPDX-License-Identifier: MIT
"""vLLM's real scheduler and connector plumbing on CPU, for the kvbroker.vllm tests.

As vLLM's own connector unit tests do (tests/v1/kv_connector/unit/utils.py in its source,
which the wheel does not ship), this builds a real VllmConfig from a tiny local model config
(HF_HUB_OFFLINE=1, nothing downloaded), a real Scheduler whose connector the real
KVConnectorFactory loads from kv_connector_module_path, and a worker-role connector over CPU KV
tensors. MiniEngine stands in for the model runner: it calls the worker connector exactly as
vllm/v1/worker/kv_connector_model_runner_mixin.py and the attention layers'
maybe_transfer_kv_layer do, and "computes" each token's KV as a deterministic function of
(layer, position, token), so two engines computing the same prefix hold the same bytes.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any, Literal, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")

import torch
from vllm.config import (
    CacheConfig,
    DeviceConfig,
    KVTransferConfig,
    ModelConfig,
    SchedulerConfig,
    VllmConfig,
)
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole
from vllm.sampling_params import SamplingParams
from vllm.utils.hashing import sha256
from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import (
    FullAttentionSpec,
    KVCacheConfig,
    KVCacheGroupSpec,
    MLAAttentionSpec,
)
from vllm.v1.outputs import KVConnectorOutput, ModelRunnerOutput
from vllm.v1.request import Request
from vllm.v1.structured_output import StructuredOutputManager

from kvbroker.vllm import KVBrokerConnector
from kvbroker.vllm.worker import _Worker

MLA_DIM = 576  # DeepSeek-V3 / Kimi-K2.5: kv_lora_rank 512 + rope 64
NUM_LAYERS = 4
HEADS, HEAD_DIM = 2, 16


def write_model(tmp: Path) -> Path:
    """A tiny Llama config.json: enough for ModelConfig (no weights, no tokenizer)."""
    d = tmp / "tiny-model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 64,
        "intermediate_size": 128, "num_attention_heads": 4, "num_key_value_heads": HEADS,
        "head_dim": HEAD_DIM, "num_hidden_layers": NUM_LAYERS, "vocab_size": 1024,
        "max_position_embeddings": 65536, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))
    return d


def make_config(tmp: Path, socket: str, *, block_size: int = 16, extra: dict[str, Any] | None
                = None, max_num_batched_tokens: int = 256, max_model_len: int = 8192,
                kv_role: Literal["kv_producer", "kv_both", "kv_consumer"] = "kv_both",
                ) -> VllmConfig:
    model = write_model(tmp)
    mc = ModelConfig(model=str(model), skip_tokenizer_init=True, dtype="bfloat16",
                     max_model_len=max_model_len, seed=42)
    sc = SchedulerConfig(max_num_seqs=16, max_num_batched_tokens=max_num_batched_tokens,
                         max_model_len=max_model_len, enable_chunked_prefill=True,
                         is_encoder_decoder=False)
    cc = CacheConfig(block_size=block_size, cache_dtype="auto", enable_prefix_caching=True)
    kt = KVTransferConfig(kv_connector="KVBrokerConnector",
                          kv_connector_module_path="kvbroker.vllm", kv_role=kv_role,
                          kv_connector_extra_config={"socket": socket, "model": "tiny-test",
                                                     "reconnect_s": 0.0, "lookup_wait_ms": 5000,
                                                     **(extra or {})})
    return VllmConfig(model_config=mc, scheduler_config=sc, cache_config=cc,
                      kv_transfer_config=kt, device_config=DeviceConfig("cpu"))


def make_kv_cache_config(block_size: int, num_blocks: int, mla: bool,
                         num_layers: int = NUM_LAYERS) -> KVCacheConfig:
    layers = [f"model.layers.{i}.self_attn.attn" for i in range(num_layers)]
    if mla:
        spec: FullAttentionSpec = MLAAttentionSpec(
            block_size=block_size, num_kv_heads=1, head_size=MLA_DIM, dtype=torch.bfloat16,
            cache_dtype_str="auto")
    else:
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=HEADS, head_size=HEAD_DIM,
                                 dtype=torch.bfloat16)
    return KVCacheConfig(num_blocks=num_blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(layers, spec)])


def make_scheduler(vc: VllmConfig, kcc: KVCacheConfig) -> Scheduler:
    vc.cache_config.num_gpu_blocks = kcc.num_blocks
    return Scheduler(vllm_config=vc, kv_cache_config=kcc,
                     structured_output_manager=StructuredOutputManager(vc),
                     block_size=vc.cache_config.block_size, log_stats=True)


_hasher_ready: list[bool] = []


def wk(conn: KVBrokerConnector) -> _Worker:
    """The worker-role state of a connector (what the tests inspect)."""
    assert conn._worker is not None
    return conn._worker


def make_request(req_id: str, tokens: list[int], block_size: int, max_tokens: int = 4,
                 cache_salt: str | None = None) -> Request:
    if not _hasher_ready:
        init_none_hash(sha256)
        _hasher_ready.append(True)
    return Request(request_id=req_id, prompt_token_ids=list(tokens),
                   sampling_params=SamplingParams(max_tokens=max_tokens, ignore_eos=True),
                   pooling_params=None, cache_salt=cache_salt,
                   block_hasher=get_request_block_hasher(block_size, sha256))


def kv_value(layer: int, pos: torch.Tensor, tok: torch.Tensor, width: int) -> torch.Tensor:
    """Deterministic KV bytes of tokens: [n, width] uint8 from (layer, position, token)."""
    j = torch.arange(width, dtype=torch.int64)
    v = (pos[:, None] * 131 + tok[:, None] * 31 + layer * 7 + j[None, :] * 13) % 251
    return v.to(torch.uint8)


class MiniEngine:
    """One vLLM "engine": the real Scheduler (scheduler-role connector inside) and a
    worker-role connector over CPU KV tensors, stepped like vLLM's engine core."""

    def __init__(self, tmp: Path, socket: str, *, mla: bool, block_size: int = 16,
                 num_blocks: int = 256, extra: dict[str, Any] | None = None,
                 layout: str = "flash", max_num_batched_tokens: int = 256,
                 tp_size: int = 1, kcc: KVCacheConfig | None = None) -> None:
        self.block_size = block_size
        self.mla = mla
        extra = dict(extra or {})
        self.vc = make_config(tmp, socket, block_size=block_size, extra=extra,
                              max_num_batched_tokens=max_num_batched_tokens)
        # kcc: several KV cache groups (a hybrid model) in vLLM's hybrid allocator.
        self.kcc = kcc or make_kv_cache_config(block_size, num_blocks, mla)
        if kcc is not None:
            self.vc.scheduler_config.disable_hybrid_kv_cache_manager = False
        self.sched = make_scheduler(self.vc, self.kcc)
        # layer name -> its KV cache group; layers in model order (their index is the layer)
        self.group_of = {n: g for g, grp in enumerate(self.kcc.kv_cache_groups)
                         for n in grp.layer_names}
        self.layers = sorted(self.group_of, key=lambda n: int(n.split(".")[2]))
        self.num_blocks = num_blocks
        self.layout = layout
        # One worker-role connector per TP rank, each over its own KV tensors (MLA: every
        # rank holds the same latent KV).
        self.workers: list[KVBrokerConnector] = []
        self.kvs: list[dict[str, torch.Tensor]] = []
        for rank in range(tp_size):
            wextra = dict(extra, tp_rank=rank, tp_size=tp_size)
            wvc = make_config(tmp, socket, block_size=block_size, extra=wextra,
                              max_num_batched_tokens=max_num_batched_tokens)
            wvc.scheduler_config.disable_hybrid_kv_cache_manager = \
                self.vc.scheduler_config.disable_hybrid_kv_cache_manager
            w = cast(KVBrokerConnector,
                     KVConnectorFactory.create_connector(wvc, KVConnectorRole.WORKER, self.kcc))
            kv = self._alloc()
            w.register_kv_caches(kv)
            self.workers.append(w)
            self.kvs.append(kv)
        self.worker, self.kv = self.workers[0], self.kvs[0]
        self.computed_tokens = 0  # tokens this engine computed itself (not loaded)
        self.bad: list[str] = []
        self.last_stats: Any = None  # requests whose computed prefix held wrong bytes
        self.invalid_reports: list[set[int]] = []
        self.outputs: dict[str, list[int]] = {}

    def _alloc(self) -> dict[str, torch.Tensor]:
        """The KV tensors, one allocation for all layers as vLLM's KVCacheTensor backing does,
        filled with 0xAB so a page nobody wrote never passes for a right one."""
        nl, nb, bs = len(self.layers), self.num_blocks, self.block_size
        if self.mla:
            raw = torch.full((nl, nb, bs, MLA_DIM * 2), 0xAB, dtype=torch.uint8)
        elif self.layout == "flash":  # FlashAttention: [2, blocks, block_size, heads, dim]
            raw = torch.full((nl, 2, nb, bs, HEADS, HEAD_DIM * 2), 0xAB, dtype=torch.uint8)
        else:  # FlashInfer: [blocks, 2, block_size, heads, head_dim]
            raw = torch.full((nl, nb, 2, bs, HEADS, HEAD_DIM * 2), 0xAB, dtype=torch.uint8)
        raw = raw.view(torch.bfloat16)
        return {n: raw[i] for i, n in enumerate(self.layers)}

    # -- the "model" ---------------------------------------------------------------------------

    def _slots(self, req_id: str, start: int, n: int, group: int = 0,
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        req = self.sched.requests[req_id]
        ids = self.sched.kv_cache_manager.get_block_ids(req_id)[group]
        pos = torch.arange(start, start + n)
        tok = torch.tensor(list(req.all_token_ids[start:start + n]), dtype=torch.int64)
        blocks = torch.tensor([ids[p // self.block_size] for p in range(start, start + n)])
        return pos, tok, blocks

    def _layer_bytes(self, name: str, rank: int = 0) -> list[torch.Tensor]:
        """The layer's KV as [blocks, block_size, bytes] uint8 tensors (K and V for MHA)."""
        t = self.kvs[rank][name]
        if self.mla:
            return [t.view(torch.uint8)]
        if t.shape[0] == 2:
            return [t[0].view(torch.uint8).flatten(2), t[1].view(torch.uint8).flatten(2)]
        return [t[:, 0].view(torch.uint8).flatten(2), t[:, 1].view(torch.uint8).flatten(2)]

    def compute(self, layer: int, name: str, work: list[tuple[str, int, int]]) -> None:
        for req_id, start, n in work:
            pos, tok, blocks = self._slots(req_id, start, n, self.group_of[name])
            assert bool((blocks != 0).all()), "a token computed into vLLM's null block"
            off = pos % self.block_size
            for rank in range(len(self.workers)):
                for h, part in enumerate(self._layer_bytes(name, rank)):
                    part[blocks, off] = kv_value(layer * 2 + h, pos, tok, part.shape[-1])

    def expected_ok(self, req_id: str, ntokens: int) -> bool:
        """Whether the engine's blocks hold the right bytes for the request's first tokens
        (a window group's: those in the blocks vLLM keeps, not its null block)."""
        for rank in range(len(self.workers)):
            for li, name in enumerate(self.layers):
                pos, tok, blocks = self._slots(req_id, 0, ntokens, self.group_of[name])
                kept = blocks != 0
                pos, tok, blocks = pos[kept], tok[kept], blocks[kept]
                off = pos % self.block_size
                for h, part in enumerate(self._layer_bytes(name, rank)):
                    if not torch.equal(part[blocks, off], kv_value(li * 2 + h, pos, tok,
                                                                   part.shape[-1])):
                        return False
        return True

    # -- one engine step -----------------------------------------------------------------------

    def step(self, kill: Any = None) -> Any:
        out = self.sched.schedule()
        if kill is not None:  # after the lookups, before the loads
            kill()
        work = []
        for r in out.scheduled_new_reqs:
            work.append((r.req_id, r.num_computed_tokens, out.num_scheduled_tokens[r.req_id]))
        c = out.scheduled_cached_reqs
        for req_id, ncomp in zip(c.req_ids, c.num_computed_tokens, strict=True):
            work.append((req_id, ncomp, out.num_scheduled_tokens[req_id]))
        meta = out.kv_connector_metadata
        assert meta is not None
        for w in self.workers:
            w.bind_connector_metadata(meta)
            w.start_load_kv(cast(Any, None))  # the connector reads its metadata only
        for li, name in enumerate(self.layers):
            for w in self.workers:
                w.wait_for_layer_load(name)
            self.compute(li, name, work)
            for w, kv in zip(self.workers, self.kvs, strict=True):
                w.save_kv_layer(name, kv[name], cast(Any, None))
        sending: set[str] | None = None
        recving: set[str] | None = None
        failed: set[str] = set()
        invalid: set[int] = set()
        stats = None
        for w in self.workers:
            w.wait_for_save()
            tr = w.get_transfer_results(out.finished_req_ids)
            snd, rcv = tr.finished_sending, tr.finished_recving
            failed |= tr.failed_recving
            # vLLM's KVOutputAggregator: a request is done when every worker said so.
            sending = set(snd or ()) if sending is None else sending & set(snd or ())
            recving = set(rcv or ()) if recving is None else recving & set(rcv or ())
            invalid |= w.get_block_ids_with_load_errors()
            st = w.get_kv_connector_stats()
            if st is not None:
                stats = st if stats is None else stats.aggregate(st)
            w.clear_connector_metadata()
        if invalid:
            self.invalid_reports.append(set(invalid))
        self.last_stats = stats
        self.computed_tokens += sum(n for _, _, n in work)
        req_ids = [r for r, _, _ in work]
        sampled = []
        for req_id, start, n in work:
            req = self.sched.requests[req_id]
            done = start + n >= req.num_tokens
            sampled.append([100 + (start + n) % 50] if done else [])
        mro = ModelRunnerOutput(
            req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
            sampled_token_ids=sampled,
            kv_connector_output=KVConnectorOutput(
                finished_sending=sending or None, finished_recving=recving or None,
                failed_recving=failed, invalid_block_ids=invalid, kv_connector_stats=stats))
        res = self.sched.update_from_output(out, mro)
        # Every token vLLM now counts as computed must hold its right bytes, loaded or not.
        for req in self.sched.running:
            if req.num_computed_tokens and not self.expected_ok(req.request_id,
                                                                req.num_computed_tokens):
                self.bad.append(req.request_id)
        return out, res

    def run(self, requests: list[Request], max_steps: int = 200, kill_at: int | None = None,
            kill: Any = None) -> None:
        for r in requests:
            self.sched.add_request(r)
        steps = 0
        while self.sched.has_requests():
            out, _ = self.step(kill if steps == kill_at else None)
            steps += 1
            if not out.total_num_scheduled_tokens:
                # Only waiting for transfers (asynchronous loads): a step takes no time
                # then, and 200 of them can pass before a busy broker answered.
                time.sleep(0.005)
            assert steps < max_steps, "engine did not finish its requests"
