#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_sglang.py - kvbroker as SGLang 0.5.23's HiCache L3 tier, against memcpy and against
SGLang's own HiCacheFile on tmpfs, in one run.

usage: bench_sglang.py --socket SOCK [--reps N] [--pages 128] [--tmpfs /dev/shm]

Kimi-K2.5 pages (MLA, 61 layers, kv_lora 512 + rope 64 in bf16 = 1152 B per token and layer,
64 tokens: 4.29 MiB) in SGLang's own MLATokenToKVPoolHost, page_first_direct layout, shm
allocator (the zero-copy path), on the CPU:

  batch_get_v1 of 128 pages (one STORAGE_BATCH_SIZE batch) into the host pool, GB/s, against
      a single-threaded memcpy of the same 128 pages from a private buffer into the same host
      pages, measured in the same repetitions (target >= 85%); also the staging path (default
      allocator) for what the zero copy saves;
  batch_exists of 128 stored keys, p50 and p99 (target p50 <= 100 us);
  the same two through HiCacheFile in a tmpfs directory, driven as HiCacheController drives a
      v0 backend (batch_get of flat pages, then set_from_flat_data_page), side by side.

Repetitions are interleaved (the repetition is the outer loop). Prints a markdown section on
stdout (medians and ranges, verdicts computed here), which tools/bench.sh puts into
docs/benchmarks.md; exit 1 when a run failed.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "python" / "tests"))
import sglang_support as S  # first: imports SGLang (see there)

# isort: split
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile
from sglang.srt.mem_cache.utils import get_hash_str

PAGE = 64
LAYERS = 61


def kimi_pool(alloc: str, npages: int) -> Any:
    """SGLang's MLA host pool with room for 2 * npages Kimi-K2.5 pages."""
    return S.mla_host_pool("page_first_direct", alloc, layers=LAYERS, page=PAGE,
                           tokens=4 * PAGE, kv_lora_rank=512, rope=64,
                           host_tokens=2 * npages * PAGE)


def med_rng(xs: list[float]) -> tuple[float, float, float]:
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs: list[float], unit: str = "", scale: float = 1.0, prec: int = 2) -> str:
    m, lo, hi = med_rng([x * scale for x in xs])
    return f"{m:.{prec}f} [{lo:.{prec}f}-{hi:.{prec}f}]{unit}"


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument("--exists-iters", type=int, default=2000)
    ap.add_argument("--tmpfs", default="/dev/shm")
    a = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    torch.set_num_threads(1)
    n = a.pages
    load0 = Path("/proc/loadavg").read_text().split()[:3]

    tokens = list(range(100000, 100000 + n * PAGE))
    keys = get_hash_str(tokens, None, page_size=PAGE)
    zc_pool, st_pool = kimi_pool("shm", n), kimi_pool("default", n)
    fc_pool = kimi_pool("shm", n)
    S.fill(zc_pool, 1)
    st_pool.kv_buffer.copy_(zc_pool.kv_buffer)
    fc = S.kvbroker_backend(fc_pool, a.socket, mla=True, model="bench/Kimi-K2.5-bench",
                            client_name="bench-fdcopy", shm_adopt=False)
    zc = S.kvbroker_backend(zc_pool, a.socket, mla=True, model="bench/Kimi-K2.5-bench")
    st = S.kvbroker_backend(st_pool, a.socket, mla=True, model="bench/Kimi-K2.5-bench",
                            client_name="bench-staging")
    if not zc.zero_copy or not fc._fdcopy:
        print("bench_sglang: the shm pool did not get the zero-copy path", file=sys.stderr)
        return 1
    pb = zc.geometry.page_bytes
    src_idx = S.indices(list(range(n)), PAGE)  # pages 0..n-1 are the source
    dst_idx = S.indices(list(range(n, 2 * n)), PAGE)  # n..2n-1 the destination
    assert zc.batch_set_v1(keys, src_idx) == [True] * n

    # memcpy: the same bytes, one page at a time, from a private (warm) buffer into the same
    # host pages batch_get_v1 fills; single-threaded as the broker's copy of one batch is.
    private = torch.empty(n * pb, dtype=torch.uint8)
    private.copy_(zc_pool.kv_buffer.view(-1).view(torch.uint8)[: n * pb])
    dst_ptrs = [zc_pool.kv_buffer.data_ptr() + zc.geometry.page_offset(int(s))
                for s in dst_idx[::PAGE]]
    src_base = private.data_ptr()

    tmpdir = tempfile.mkdtemp(prefix="hicache-bench-", dir=a.tmpfs)
    fpool = st_pool  # its pages 0..n-1 hold the same bytes; n..2n-1 are overwritten anyway
    hf = HiCacheFile(S.storage_config(mla=True, model="bench/Kimi-K2.5-bench",
                                      file_storage_path=tmpdir))
    for i in range(n):
        assert hf.set(keys[i], fpool.get_data_page(i * PAGE))

    res: dict[str, list[float]] = {k: [] for k in (
        "memcpy", "zc_get", "fc_get", "st_get", "file_get", "zc_set", "zc_ex_p50", "zc_ex_p99",
        "file_ex_p50", "file_ex_p99", "zc_ex1ms_p50", "zc_ex1ms_p99", "zc_stats")}
    failed = []
    for _ in range(a.reps):
        t = time.perf_counter()
        for i, d in enumerate(dst_ptrs):
            ctypes.memmove(d, src_base + i * pb, pb)
        res["memcpy"].append(n * pb / (time.perf_counter() - t) / 1e9)

        t = time.perf_counter()
        got = zc.batch_get_v1(keys, dst_idx)
        res["zc_get"].append(n * pb / (time.perf_counter() - t) / 1e9)
        if got != [True] * n:
            failed.append("zero-copy batch_get_v1 missed")

        t = time.perf_counter()
        got = fc.batch_get_v1(keys, dst_idx)
        res["fc_get"].append(n * pb / (time.perf_counter() - t) / 1e9)
        if got != [True] * n:
            failed.append("pread/pwrite batch_get_v1 missed")

        t = time.perf_counter()
        got = st.batch_get_v1(keys, dst_idx)
        res["st_get"].append(n * pb / (time.perf_counter() - t) / 1e9)
        if got != [True] * n:
            failed.append("staging batch_get_v1 missed")

        t = time.perf_counter()
        pages = hf.batch_get(keys, [fpool.get_dummy_flat_data_page() for _ in keys])
        for i, p in enumerate(pages):
            fpool.set_from_flat_data_page((n + i) * PAGE, p)
        res["file_get"].append(n * pb / (time.perf_counter() - t) / 1e9)

        # a PUT that copies (new keys each repetition), zero copy
        k2 = get_hash_str(tokens, keys[len(res["zc_set"])], page_size=PAGE)
        t = time.perf_counter()
        zc.batch_set_v1(k2, src_idx)
        res["zc_set"].append(n * pb / (time.perf_counter() - t) / 1e9)

        for name, be in (("zc", zc), ("file", hf)):
            lat = []
            for _ in range(a.exists_iters if name == "zc" else max(50, a.exists_iters // 10)):
                t = time.perf_counter()
                h = be.batch_exists(keys)
                lat.append(time.perf_counter() - t)
                if h != n:
                    failed.append(f"{name} batch_exists gave {h}")
                    break
            res[f"{name}_ex_p50"].append(pct(lat, 0.5))
            res[f"{name}_ex_p99"].append(pct(lat, 0.99))
        # as SGLang calls it: once per new request, the broker's busy-poll window (200 us)
        # long over, so each call pays the broker's wake-up
        lat = []
        for _ in range(200):
            time.sleep(0.001)
            t = time.perf_counter()
            zc.batch_exists(keys)
            lat.append(time.perf_counter() - t)
        res["zc_ex1ms_p50"].append(pct(lat, 0.5))
        res["zc_ex1ms_p99"].append(pct(lat, 0.99))
        # get_stats, which SGLang polls on every scheduler tick with storage metrics on: the
        # thread's CPU time (a loaded machine's preemptions are not the call's cost)
        t = time.thread_time()
        for _ in range(2000):
            zc.get_stats()
        res["zc_stats"].append((time.thread_time() - t) / 2000)
    # byte check of what the last zero-copy get loaded
    flat = zc_pool.kv_buffer.view(-1).view(torch.uint8)
    if not all(torch.equal(zc.geometry.canonical(flat, (n + i) * PAGE),
                           zc.geometry.canonical(flat, i * PAGE)) for i in range(n)):
        failed.append("zero-copy batch_get_v1 bytes differ")
    shutil.rmtree(tmpdir, ignore_errors=True)
    zc.close()
    fc.close()
    st.close()

    ratio = [g / m for g, m in zip(res["zc_get"], res["memcpy"], strict=True)]
    ex50 = statistics.median(res["zc_ex_p50"]) * 1e6
    ex50s = statistics.median(res["zc_ex1ms_p50"]) * 1e6
    L = []
    L.append("## SGLang HiCache L3 backend (`kvbroker.sglang`, from `tools/bench_sglang.py`)\n")
    L.append(f"SGLang {__import__('sglang').__version__}'s own `MLATokenToKVPoolHost` "
             f"(page_first_direct) on the CPU, {n} Kimi-K2.5 pages per call "
             f"({LAYERS} layers x 1152 B x {PAGE} tokens = {pb / 2**20:.2f} MiB, "
             f"{n * pb / 2**20:.0f} MiB per batch), {a.reps} interleaved repetitions, "
             "medians [min-max]. memcpy: one thread, page by page, from a private buffer "
             "into the same host pages. HiCacheFile: SGLang's file backend in a directory "
             f"on {a.tmpfs} (tmpfs), driven as HiCacheController drives a v0 backend. "
             f"Importing SGLang's modules took {S.IMPORT_SECONDS:.1f} s. Load average "
             f"{' '.join(load0)} before, {' '.join(Path('/proc/loadavg').read_text().split()[:3])} "
             f"after ({os.cpu_count()} CPUs): the copies compete with whatever else runs.\n")
    L.append("| what | GB/s | vs memcpy |")
    L.append("|---|---|---|")
    mm = statistics.median(res["memcpy"])
    for label, k in (("memcpy, same bytes and destination", "memcpy"),
                     ("kvbroker batch_get_v1, shm allocator (zero copy)", "zc_get"),
                     ("kvbroker batch_get_v1, shm allocator, shm_adopt off (broker "
                      "pread/pwrite of SGLang's memfd)", "fc_get"),
                     ("kvbroker batch_get_v1, default allocator (staging copy)", "st_get"),
                     ("HiCacheFile on tmpfs, batch_get + set_from_flat_data_page", "file_get"),
                     ("kvbroker batch_set_v1 of new pages, zero copy", "zc_set")):
        L.append(f"| {label} | {fmt(res[k])} | {statistics.median(res[k]) / mm:.0%} |")
    L.append("")
    L.append("| batch_exists of 128 stored keys | p50 us | p99 us |")
    L.append("|---|---|---|")
    L.append(f"| kvbroker, back to back (one LOOKUP round trip) | "
             f"{fmt(res['zc_ex_p50'], '', 1e6, 1)} | {fmt(res['zc_ex_p99'], '', 1e6, 1)} |")
    L.append(f"| kvbroker, 1 ms apart (broker asleep: its wake-up included) | "
             f"{fmt(res['zc_ex1ms_p50'], '', 1e6, 1)} | {fmt(res['zc_ex1ms_p99'], '', 1e6, 1)} |")
    L.append(f"| HiCacheFile on tmpfs (one stat per key) | {fmt(res['file_ex_p50'], '', 1e6, 1)}"
             f" | {fmt(res['file_ex_p99'], '', 1e6, 1)} |")
    L.append("")
    L.append(f"get_stats (SGLang's per-tick metrics poll): {fmt(res['zc_stats'], ' us', 1e6, 2)}"
             " CPU per call (mean of 2,000), no broker round trip.\n")
    fg = statistics.median(res["file_get"])
    fe = statistics.median(res["file_ex_p50"]) * 1e6
    L.append("| target | measured | verdict |")
    L.append("|---|---|---|")
    L.append(f"| batch_get_v1 of 128 pages >= 85% of memcpy | {statistics.median(ratio):.0%} "
             f"[{min(ratio):.0%}-{max(ratio):.0%}] | "
             f"{'met' if statistics.median(ratio) >= 0.85 else 'MISSED'} |")
    L.append(f"| batch_exists of 128 keys p50 <= 100 us | {ex50:.1f} us back to back, "
             f"{ex50s:.1f} us 1 ms apart | {'met' if max(ex50, ex50s) <= 100 else 'MISSED'} |")
    L.append(f"| vs HiCacheFile on tmpfs (what a user compares) | get "
             f"{statistics.median(res['zc_get']) / fg:.1f}x, exists {fe / ex50:.1f}x faster | "
             "- |")
    L.append("")
    if failed:
        L.append("Failures: " + "; ".join(sorted(set(failed))) + "\n")
    print("\n".join(L))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
