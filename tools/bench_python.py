#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench_python.py - the Python package against kvbbench's C figures, in one run.

usage: bench_python.py --socket SOCK [--build B] [--seconds S] [--reps N]

Against one broker, interleaved per repetition (so drift spreads over both sides):

  GET of a Kimi-K2.5 page (61 layers x 1152 B x 64 tokens, 4.29 MiB) into a registered
      HostBuffer (numpy) vs `kvbbench --layout kimi get` (target >= 90%);
  GET into an arbitrary numpy array vs `kvbbench --layout kimi get-user`, the same C path
      (lease + one memcpy) (target >= 85%; the ratio to C's registered GET is shown too);
  LOOKUP of 1024 stored keys per call vs `kvbbench lookup --batch 1024` (keys/s, >= 50%);
  NOP round trip p50 vs `kvbbench nop` p50 (<= 2 us above C).

Both sides walk a working set of >= 128 MiB of pages in order, destinations slot by slot in a
buffer as large, as kvbbench does. Prints a markdown section (medians and ranges, verdicts)
on stdout, which tools/bench.sh puts into docs/benchmarks.md; exit 1 when a run failed.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

import kvbroker as kvb

KIMI = kvb.Layout("bench/kimi-k2.5-py", kvb.MLA, 64, [kvb.Component("kv", 61, 1152)])
WS = 128 << 20


def kvbbench(build: Path, sock: str, secs: float, *args: str) -> dict[str, float]:
    """One kvbbench measurement, its JSON."""
    out = subprocess.run([str(build / "bin" / "kvbbench"), "--socket", sock, "--json",
                          "--seconds", str(secs), *args], capture_output=True, text=True,
                         check=True, timeout=300)
    result: dict[str, float] = json.loads(out.stdout)
    return result


def timed(secs: float, op: Callable[[int], object]) -> tuple[float, int]:
    """Runs op(i) for secs; returns (elapsed, ops)."""
    n = 0
    t0 = time.perf_counter()
    end = t0 + secs
    while True:
        for _ in range(16):
            op(n)
            n += 1
        t = time.perf_counter()
        if t >= end:
            return t - t0, n


def main() -> int:
    """Measures and prints the section."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--build", default="build/release")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--reps", type=int, default=3)
    a = ap.parse_args()
    build = Path(a.build)

    c = kvb.connect(a.socket, name="bench-python")
    ns = c.ns_open(KIMI)
    pb = ns.page_bytes
    slots = -(-WS // pb)
    keys = kvb.page_keys(list(range(slots * 64)), 64, kvb.key_chain([0xB0B]))
    reg = c.alloc_host(slots * pb)
    reg_arr = reg.numpy().reshape(slots, pb)
    reg_arr[:] = 0x3C
    user_arr = np.full((slots, pb), 0x3C, np.uint8)
    for i, k in enumerate(keys):
        reg_arr[i] = i & 0xFF
        ns.put(k, reg_arr[i])
    small = c.ns_open(kvb.Layout("bench/lookup-py", kvb.MLA, 16, [kvb.Component("kv", 1, 256)]))
    lkeys = kvb.page_keys(list(range(1024 * 16)), 16)
    lbuf = c.alloc_host(small.page_bytes)
    small.put_many(lkeys, [lbuf] * len(lkeys))
    assert small.lookup(lkeys) == 1024

    res: dict[str, list[float]] = {k: [] for k in (
        "c_get", "c_get_user", "py_get_reg", "py_get_np", "c_lookup", "py_lookup",
        "py_lookup_bytes", "c_nop", "py_nop")}
    joined = b"".join(lkeys)
    secs = a.seconds
    # Warm-up pass: fault in every destination page once.
    for i, k in enumerate(keys):
        ns.get_into(k, reg_arr[i])
        ns.get_into(k, user_arr[i])
    for _rep in range(a.reps):
        r = kvbbench(build, a.socket, secs, "--layout", "kimi", "get")
        res["c_get"].append(r["gb_per_s"])
        r = kvbbench(build, a.socket, secs, "--layout", "kimi", "get-user")
        res["c_get_user"].append(r["gb_per_s"])
        dt, n = timed(secs, lambda i: ns.get_into(keys[i % slots], reg_arr[i % slots]))
        res["py_get_reg"].append(n * pb / dt / 1e9)
        dt, n = timed(secs, lambda i: ns.get_into(keys[i % slots], user_arr[i % slots]))
        res["py_get_np"].append(n * pb / dt / 1e9)
        r = kvbbench(build, a.socket, secs, "--page", "64K", "--pages", "4096", "--batch",
                     "1024", "lookup")
        res["c_lookup"].append(r["ops_per_s"] * 1024)
        dt, n = timed(secs, lambda i: small.lookup(lkeys) and None)
        res["py_lookup"].append(n * 1024 / dt)
        dt, n = timed(secs, lambda i: small.lookup(joined) and None)
        res["py_lookup_bytes"].append(n * 1024 / dt)
        r = kvbbench(build, a.socket, secs, "nop")
        res["c_nop"].append(r["p50_us"])
        lat = []
        end = time.perf_counter() + secs
        nop, clock = c.nop, time.perf_counter_ns
        while time.perf_counter() < end:
            for _ in range(256):
                t0 = clock()
                nop()
                lat.append(clock() - t0)
        res["py_nop"].append(statistics.median(lat) / 1e3)
    c.close()

    def med(k: str) -> float:
        return statistics.median(res[k])

    def cell(k: str, fmt: str) -> str:
        v = res[k]
        return f"{fmt % med(k)} [{fmt % min(v)}-{fmt % max(v)}]"

    def verdict(ok: bool) -> str:
        return "met" if ok else "**MISSED**"

    g_reg = med("py_get_reg") / med("c_get")
    g_np = med("py_get_np") / med("c_get_user")
    g_np_reg = med("py_get_np") / med("c_get")
    lk = med("py_lookup") / med("c_lookup")
    nop_d = med("py_nop") - med("c_nop")
    print("## Python package (`tools/bench_python.py`)\n")
    print(f"`tools/bench_python.py`: the `kvbroker` package against kvbbench in the same run and "
          f"on the same broker, {a.reps} interleaved repetitions of {secs:g} s; medians "
          f"[range]. Kimi-K2.5 pages ({pb} B), a working set of {slots} pages walked in "
          f"order. Python {sys.version.split()[0]}, numpy {np.__version__}.\n")
    print("| target | Python | C (kvbbench) | ratio | verdict |")
    print("| --- | --- | --- | ---: | --- |")
    print(f"| GET into a registered numpy buffer >= 90% of C GET | "
          f"{cell('py_get_reg', '%.2f')} GB/s | {cell('c_get', '%.2f')} GB/s | "
          f"{100 * g_reg:.0f}% | {verdict(g_reg >= 0.9)} |")
    print(f"| GET into an arbitrary numpy array >= 85% of C (get-user, same path) | "
          f"{cell('py_get_np', '%.2f')} GB/s | {cell('c_get_user', '%.2f')} GB/s | "
          f"{100 * g_np:.0f}% | {verdict(g_np >= 0.85)} |")
    print(f"| (the same against C's registered GET) | | {cell('c_get', '%.2f')} GB/s | "
          f"{100 * g_np_reg:.0f}% | {verdict(g_np_reg >= 0.85)} |")
    print(f"| LOOKUP of 1024 keys >= 50% of C keys/s (list of bytes) | "
          f"{cell('py_lookup', '%.3g')} keys/s | {cell('c_lookup', '%.3g')} keys/s | "
          f"{100 * lk:.0f}% | {verdict(lk >= 0.5)} |")
    lkb = med("py_lookup_bytes") / med("c_lookup")
    print(f"| (keys as one joined bytes object) | {cell('py_lookup_bytes', '%.3g')} keys/s | "
          f"| {100 * lkb:.0f}% | {verdict(lkb >= 0.5)} |")
    print(f"| NOP round trip p50 <= 2 us above C | {cell('py_nop', '%.2f')} us | "
          f"{cell('c_nop', '%.2f')} us | {nop_d:+.2f} us | {verdict(nop_d <= 2.0)} |")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
