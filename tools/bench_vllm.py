# SPDX-License-Identifier: MIT
"""bench_vllm.py - kvbroker.vllm figures for `make bench` (markdown on stdout).

  match   the scheduler-side connector's get_num_new_matched_tokens for a 32K-token request
          against a warm broker (all its pages stored): chain keys of the token ids plus one
          batched LOOKUP, on a fresh vLLM Request each time (nothing cached), at vLLM block
          sizes 16 and 64. Target: p50 <= 1 ms.
  worker  the worker-role connector storing (wait_for_save) and loading (start_load_kv +
          wait_for_layer_load per layer) MLA pages between CPU KV tensors (zero-copy: the
          tensors moved into a registered memfd, the broker copies) and the broker, and the
          copy path (zero_copy=false); against memcpy (one memmove, one thread) of the same
          bytes in the same process and run.

usage: bench_vllm.py --socket SOCK [--reps N] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))

t_import = time.perf_counter()
import torch  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory  # noqa: E402
from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402

import kvbroker as kvb  # noqa: E402
import vllm_support as vs  # noqa: E402
from kvbroker.vllm import (  # noqa: E402
    KVBrokerConnector,
    KVBrokerMetadata,
    namespace_layouts,
)
from kvbroker.vllm.common import _Transfer  # noqa: E402

IMPORT_S = time.perf_counter() - t_import


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def bench_match(tmp: Path, sock: str, bs: int, n: int, early: bool,
                ) -> tuple[float, float, float, int]:
    vc = vs.make_config(tmp, sock, block_size=bs, extra={"model": f"bench-match-{bs}",
                                                         "early_lookup": early},
                        max_model_len=40000)
    kcc = vs.make_kv_cache_config(bs, 4096, mla=True, num_layers=2)
    conn = cast(KVBrokerConnector,
                KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc))
    tokens = [(i * 7919 + bs) % 150000 for i in range(32768)]
    keys = kvb.page_keys(tokens, bs)
    with kvb.connect(sock) as c:
        ns = c.ns_open(namespace_layouts(vc, kcc)[0].layout)
        page = bytes(ns.page_bytes)
        for k in keys:
            ns.put(k, page)
    times = []
    ktimes = []
    got: int | None = 0
    for i in range(n):
        req = vs.make_request(f"m{i}", tokens, bs)
        if early:
            # As Scheduler.add_request does; the scheduler's next step comes later.
            t0 = time.perf_counter()
            conn.on_new_request(req)
            ktimes.append(time.perf_counter() - t0)
            time.sleep(0.002)
        t0 = time.perf_counter()
        got, _ = conn.get_num_new_matched_tokens(req, 0)
        times.append(time.perf_counter() - t0)
        conn._reqs.clear()
    if not early:
        for _ in range(n):
            t0 = time.perf_counter()
            kvb.page_keys(tokens, bs)
            ktimes.append(time.perf_counter() - t0)
    conn.shutdown()
    return pct(times, 0.5), pct(times, 0.99), statistics.median(ktimes), int(got or 0)


def bench_worker(tmp: Path, sock: str, zero_copy: bool, *, reps: int, nblocks: int,
                 layers: int) -> dict[str, float]:
    bs = 64
    vc = vs.make_config(tmp, sock, block_size=bs,
                        extra={"model": "bench-worker", "zero_copy": zero_copy,
                               "layer_groups": 4})
    kcc = vs.make_kv_cache_config(bs, nblocks, mla=True, num_layers=layers)
    w = cast(KVBrokerConnector,
             KVConnectorFactory.create_connector(vc, KVConnectorRole.WORKER, kcc))
    names = list(kcc.kv_cache_groups[0].layer_names)
    raw = torch.randint(0, 255, (layers, nblocks, bs, vs.MLA_DIM * 2), dtype=torch.uint8)
    kv = {n: raw[i].view(torch.bfloat16) for i, n in enumerate(names)}
    w.register_kv_caches(kv)
    page_bytes = namespace_layouts(vc, kcc)[0].layout.page_bytes
    total = page_bytes * nblocks
    blocks = list(range(1, nblocks))  # block 0 is vLLM's null block
    out: dict[str, list[float]] = {"save": [], "load": [], "memcpy": []}
    src = torch.randint(0, 255, (total,), dtype=torch.uint8)
    dst = torch.empty_like(src)
    dst.fill_(0)  # fault its pages in before the timed copies
    for r in range(reps):
        # New pages every repetition (a page already stored is not copied again).
        keys = kvb.page_keys([r * 1000003 + i for i in range(len(blocks) * bs)], bs,
                             os.urandom(32))
        tr = _Transfer("r", keys, [blocks])
        w.bind_connector_metadata(KVBrokerMetadata(saves=[tr]))
        t0 = time.perf_counter()
        w.wait_for_save()
        out["save"].append(time.perf_counter() - t0)
        w.clear_connector_metadata()
        w.bind_connector_metadata(KVBrokerMetadata(loads=[tr]))
        t0 = time.perf_counter()
        w.start_load_kv(cast(Any, None))  # the connector reads its metadata only
        for n in names:
            w.wait_for_layer_load(n)
        w.wait_for_save()
        errs = w.get_block_ids_with_load_errors()
        existed = vs.wk(w).stats_total["existed_pages"]
        out["load"].append(time.perf_counter() - t0)
        w.clear_connector_metadata()
        if errs or existed:
            raise SystemExit(f"bench_vllm: {len(errs)} load errors, {existed} pages stored "
                             "already (pool too small?)")
        t0 = time.perf_counter()
        ctypes.memmove(dst.data_ptr(), src.data_ptr(), total)
        out["memcpy"].append(time.perf_counter() - t0)
    w.shutdown()
    moved = page_bytes * len(blocks)
    return {k: moved / statistics.median(v) / 1e9 if k != "memcpy" else
            total / statistics.median(v) / 1e9 for k, v in out.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    n = 50 if a.quick else 300
    print("## vLLM connector (`tools/bench_vllm.py`)\n")
    print(f"vllm==0.33.0 on the CPU torch {torch.__version__}; importing vllm + kvbroker.vllm "
          f"took {IMPORT_S:.1f} s.\n")
    print("### Scheduler-side match of a 32K-token request, warm broker\n")
    print("`get_num_new_matched_tokens(request, 0)` of the scheduler-role connector on a new "
          "vLLM `Request` of 32768 tokens whose every full block is stored: kvbroker chain "
          f"keys of all its blocks plus one batched LOOKUP; {n} calls.\n")
    print("Early LOOKUP on (the default): `on_new_request` (called by `Scheduler.add_request`)"
          " computes the keys and starts the LOOKUP on a helper thread; the match 2 ms later "
          "reads the answer. Off: the match hashes and looks up itself. The keys column is the "
          "hashing alone (median), in `on_new_request` or in the match.\n")
    print("| vLLM block size | keys | early LOOKUP | match p50 | match p99 | keys (median) "
          "| matched tokens | target p50 <= 1 ms |")
    print("|---|---|---|---|---|---|---|---|")
    for bs in (16, 64):
        for early in (True, False):
            p50, p99, kmed, got = bench_match(tmp, a.socket, bs, n, early)
            ok = "met" if p50 <= 1e-3 else "MISSED"
            print(f"| {bs} | {32768 // bs} | {'on' if early else 'off'} | "
                  f"{p50 * 1e3:.3f} ms | {p99 * 1e3:.3f} ms | {kmed * 1e3:.3f} ms | {got} | "
                  f"{ok} |")
    nblocks = 64 if a.quick else 192
    layers = 8
    print("\n### Worker-side store and load, CPU KV tensors\n")
    print(f"MLA pages of 64 tokens x {layers} layers x 1152 bytes "
          f"({64 * layers * 1152 // 1024} KiB), {nblocks - 1} pages a step; store = "
          "`wait_for_save`, load = `start_load_kv` + `wait_for_layer_load` of every layer "
          f"(4 layer groups); medians of {a.reps}; memcpy = one memmove of "
          f"{nblocks * 64 * layers * 1152 >> 20} MiB in the same process, same run.\n")
    print("| path | store GB/s | load GB/s | memcpy GB/s | load / memcpy |")
    print("|---|---|---|---|---|")
    for zc in (True, False):
        r = bench_worker(tmp, a.socket, zc, reps=a.reps, nblocks=nblocks, layers=layers)
        name = "zero-copy (memfd view, the broker copies)" if zc else "copy path (zero_copy=false)"
        print(f"| {name} | {r['save']:.2f} | {r['load']:.2f} | {r['memcpy']:.2f} | "
              f"{r['load'] / r['memcpy']:.2f} |")
    print()


if __name__ == "__main__":
    main()
