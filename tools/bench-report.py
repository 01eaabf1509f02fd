#!/usr/bin/env python3
# SPDX-License-Identifier: MIT
"""bench-report.py - turns the raw results of tools/bench.sh into docs/benchmarks.md and plots.

usage: bench-report.py RESULTS.jsonl FAILURES.txt META.txt SECTIONS_DIR OUT.md PLOTS_DIR

RESULTS.jsonl holds one JSON object per measurement (kvbbench --json, or fio converted to the
same fields), each labelled by bench.sh with "fig" (what it is) and "rep". Every figure in the
document is a median over repetitions with its range; every ratio divides medians of the same
run; every target row's verdict ("met" / "MISSED") is computed here from those medians.
Plots: clustered bars through tools/plot-bars.gp (gnuplot, PNG), each stamped with the run's
date, machine and command under its title and again in its caption; skipped with a note when
gnuplot is missing.
"""
import json
import os
import re
import shutil
import statistics
import subprocess
import sys

res, fails, metaf, sections, out, plots = sys.argv[1:7]
rows = [json.loads(l) for l in open(res) if l.strip()]
failures = [l.strip() for l in open(fails) if l.strip()]
meta = {}
for l in open(metaf):
    if "\t" in l:
        k, v = l.rstrip("\n").split("\t", 1)
        meta[k] = v
quick = meta.get("quick") == "1"

groups = {}
for r in rows:
    groups.setdefault((r["fig"], r.get("page_bytes", 0), r.get("procs", 1)), []).append(r)


def get(fig, pb=None, np=None):
    """The repetitions of one figure; pb/np None match anything (small ops)."""
    out = []
    for (f, p, n), g in groups.items():
        if f == fig and (pb is None or p == pb) and (np is None or n == np):
            out.extend(g)
    return out


def med(g, f):
    v = [r[f] for r in g if f in r]
    return statistics.median(v) if v else None


def rng(g, f):
    v = [r[f] for r in g if f in r]
    return (min(v), max(v)) if v else (None, None)


def page(b):
    for u, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return "%g %s" % (round(b / n, 2), u)
    return "%d B" % b


def num(x):
    if x is None:
        return "-"
    if x >= 1e6:
        return "%.2f M" % (x / 1e6)
    if x >= 1e4:
        return "%.1f k" % (x / 1e3)
    if x >= 100:
        return "%.0f" % x
    return "%.3g" % x


def us(x):
    if x is None:
        return "-"
    return "%.2f" % x if x < 10 else "%.1f" % x if x < 1000 else "%.0f" % x


def ratio(a, b):
    return a / b if a is not None and b else None


def fx(x):
    return "-" if x is None else "%.2f" % x


pages = sorted({pb for (f, pb, n) in groups if f.startswith("kvb-") or f == "memcpy"})
procs = sorted({n for (f, pb, n) in groups if f.startswith("kvb-")})
ncpu = int(meta.get("ncpu", "0")) or max([n for (f, pb, n) in groups if f == "memcpy"] or [1])

what = {
    "memcpy": "memcpy (limit)",
    "fio-read": "fio random read, O_DIRECT (limit)",
    "fio-write": "fio random write, O_DIRECT (limit)",
    "kvb-put": "kvbroker PUT from registered buffer",
    "kvb-get": "kvbroker GET into registered buffer",
    "kvb-get-user": "kvbroker GET into malloc'd buffer",
    "kvb-get-qd8": "kvbroker GET, 8 per kvb_submit",
    "kvb-acquire": "kvbroker ACQUIRE + copy out + RELEASE",
    "kvb-put-user": "kvbroker PUT from malloc'd buffer",
    "redis-tcp-get": "Redis GET, TCP 127.0.0.1",
    "redis-unix-get": "Redis GET, unix socket",
    "memcached-get": "memcached GET, TCP 127.0.0.1",
    "redis-tcp-set": "Redis SET, TCP 127.0.0.1",
    "redis-unix-set": "Redis SET, unix socket",
    "memcached-set": "memcached SET, TCP 127.0.0.1, binary protocol",
}
# Rows with peer ratios. Not the batched GET: the peers were measured one GET at a time (their
# multi-get was not), so that ratio would compare a batch with single round trips.
reads = ["kvb-get", "kvb-get-user", "kvb-acquire"]
writes = ["kvb-put", "kvb-put-user"]
order = ["memcpy", "fio-read", "fio-write", "kvb-put", "kvb-put-user", "kvb-get", "kvb-get-qd8",
         "kvb-get-user", "kvb-acquire", "memcached-get", "redis-tcp-get", "redis-unix-get",
         "memcached-set", "redis-tcp-set", "redis-unix-set"]


def gbps(fig, pb, np):
    return med(get(fig, pb, np), "gb_per_s")


def redis_best(op, pb, np):
    """The faster Redis transport: the ratio a Redis user would see at best."""
    v = [x for x in (gbps("redis-tcp-" + op, pb, np), gbps("redis-unix-" + op, pb, np)) if x]
    return max(v) if v else None


L = []
title = "# kvbroker benchmarks"
L.append(title + "\n")
if quick:
    L.append("> **Quick run** (`make bench QUICK=1`): %s s per case, one repetition, small working "
             "sets. A smoke test of every path; do not quote these figures - run `make bench` "
             "on a quiet machine.\n" % meta.get("secs"))
L.append("""kvbroker side by side with the limits of this machine (memcpy, fio on the disk) and with
what users would pick instead (Redis, memcached), all measured in one run of `make bench` by the
same load generator: `kvbbench` for kvbroker and memcpy, `kvbbench-peers` (the same driver and
timing loop, with hiredis and libmemcached modes) for the peers, fio for the disk. Each row is
the median of %s repetitions of %s s, interleaved (so drift of the machine spreads over all rows),
with the range in brackets. This machine's run-to-run noise is 10-30%%: read the ranges.

- Pages: page-sized values (64 KiB, 1 MiB, 4.5 MiB), a working set of %s per page size (four
  times the LLC in a full run), pre-populated before reads and checked resident, walked in
  order; destinations are private buffers of the same size, so every copy is cold memory to
  cold memory for every system alike.
- **kvbroker GET**: `kvb_get` into a buffer from `kvb_buf_alloc_host` (the broker copies from its
  pool). **GET, 8 per kvb_submit**: the same GETs handed over 8 at a time with `kvb_submit`
  and reaped together, as an engine loads the pages of a request (latency is per batch of 8). **ACQUIRE**: `kvb_acquire`, copy the page out, `kvb_release`. **PUT**: `kvb_put` of new
  keys from a registered buffer; once the pool is full every PUT evicts, which is timed.
- **Redis / memcached GET**: a GET with the client library, then a memcpy of the value into the
  destination buffer (the library's reply buffer is not the engine's memory; kvbroker's GET
  writes there directly). **SET**: overwrites pages of the working set (neither server is
  configured to evict, so new keys would only grow it). Servers: Debian's packages with their
  defaults (memcached with -I and -m raised to hold the pages), started by the script.
  memcached GETs use libmemcached's default text protocol, its SETs the binary protocol: a
  text-protocol SET of a 64 KiB value stalls ~40 ms in most round trips on these machines,
  which would make memcached look far worse than it is.
- **memcpy**: the same page-sized copies between two private buffers, N processes; the row with
  as many processes as CPUs is the all-core limit. Every "x memcpy" divides by memcpy with the
  same page size and process count.
- **fio**: io_uring, O_DIRECT, random reads or writes of page-sized blocks, one job per client
  process at queue depth 1 (what a synchronous client has in flight), on a file in the disk
  tier's directory.
- Latencies: every operation timed with `CLOCK_MONOTONIC`, histograms of all processes merged;
  ops/s and GB/s (10^9 bytes of page data per second) summed over processes. On this 2-CPU
  machine kvbroker's loop thread busy-polls a CPU while clients are active (200 us window):
  with 2 and 4 client processes, clients, broker and servers all compete for 2 CPUs.
""" % (meta.get("reps"), meta.get("secs"), meta.get("ws")))
L.append("To reproduce: `make bench` (all of this, about 35 minutes here including the disk and start-up sections) or "
         "`make bench QUICK=1` (a smoke run of every path in a few minutes); the knobs are in "
         "the header of `tools/bench.sh`, every measurement's raw JSON in the file named at the "
         "end.\n")
L.append("Machine: %s; %s.  " % (meta.get("machine", "?"), meta.get("load", "")))
L.append("Disk: %s.  " % meta.get("disk", "?"))
L.append("Date: %s; the run took %s s.  " % (meta.get("date", "?"), meta.get("elapsed", "?")))
L.append("Command: `%s` (what `%s` runs).  " % (meta.get("command", "?"), meta.get("make", "make bench")))
for k, name in (("cmd_main", "Broker"), ("cmd_disk", "Disk-tier broker"),
                ("cmd_redis", "Redis (%s)" % meta.get("redis_version", "?")),
                ("cmd_memcached", "memcached (%s)" % meta.get("memcached_version", "?"))):
    if k in meta:
        L.append("%s: `%s`.  " % (name, meta[k]))
L.append("")

# ---- targets ----
T = []


def target(name, measured, ok, note=None):
    if ok is None:
        verdict = note or "not measured"
    else:
        verdict = "met" if ok else "**MISSED**"
    T.append("| %s | %s | %s |" % (name, measured, verdict))


def ratio_target(name, a, b, want, fmt="%.2fx (%.2f vs %.2f GB/s)"):
    r = ratio(a, b)
    target(name, fmt % (r, a, b) if r is not None else "-", None if r is None else r >= want)


for pb, xm, xr in ((65536, 3, 5), (1 << 20, 1.5, 2)):
    g = gbps("kvb-get", pb, 1)
    ratio_target("GET at %s >= %gx memcached GET (1 process)" % (page(pb), xm), g,
                 gbps("memcached-get", pb, 1), xm)
    ratio_target("GET at %s >= %gx Redis GET, faster transport (1 process)" % (page(pb), xr), g,
                 redis_best("get", pb, 1), xr)
for pb in pages:
    g, m = gbps("kvb-get", pb, 1), gbps("memcpy", pb, 1)
    r = ratio(g, m)
    target("GET at %s >= 80%% of memcpy (1 process)" % page(pb),
           "%.0f%% (%.2f of %.2f GB/s)" % (100 * r, g, m) if r else "-",
           None if r is None else r >= 0.8)
v = med(get("nop-poll", None, 1), "p50_us")
target("NOP round trip p50 <= 1 us, busy-polled (1 process)", us(v) + " us" if v else "-",
       None if v is None else v <= 1.0)
v = med(get("nop-sleep", None, 1), "p50_us")
target("NOP round trip p50 <= 20 us, broker asleep (1 process, 1 ms between ops)",
       us(v) + " us" if v else "-", None if v is None else v <= 20.0)
lk = med(get("lookup-1", None, 1), "p50_us")
for fig, pb, name in (("memcached-get", 65536, "a memcached GET of a 64 KiB page"),
                      ("memcached-probe", None, "a memcached GET of a 32-byte value")):
    mg = med(get(fig, pb, 1), "p50_us")
    r = ratio(mg, lk)
    target("LOOKUP of one page >= 20x faster than %s (p50, 1 process)" % name,
           "%.0fx (%s vs %s us)" % (r, us(lk), us(mg)) if r else "-",
           None if r is None else r >= 20)
disk_built = meta.get("disk_tier") == "1"
for pb in (1 << 20, 4718592):
    for op, fio in (("get", "read"), ("put", "write")):
        a, b = gbps("disk-" + op, pb, 1), gbps("disk-fio-" + fio, pb, 1)
        r = ratio(a, b)
        name = "disk tier %s at %s >= 90%% of fio %s (1 process, qd 1)" % (op.upper(), page(pb), fio)
        if not disk_built:
            target(name, "-", None, "not built")
        else:
            target(name, "%.0f%% (%.2f of %.2f GB/s)" % (100 * r, a, b) if r else "-",
                   None if r is None else r >= 0.9)
mk = get("mla-kvbroker")
if mk:
    copies, pp = med(mk, "copies"), med(mk, "prefix_pages")
    target("MLA at TP=8 stores one copy, not eight",
           "%d copies of %d pages, %.2fx one copy in memory" % (copies, pp, med(mk, "mem_x_one_copy")),
           copies == pp and med(mk, "mem_x_one_copy") <= 1.05)
else:
    target("MLA at TP=8 stores one copy, not eight", "-", None)

L.append("## Targets\n")
L.append("Verdicts computed by `tools/bench-report.py` from the medians below.%s\n" %
         (" Quick run: noisy, indicative only." if quick else ""))
L.append("| target | measured (median) | verdict |")
L.append("| --- | --- | --- |")
L.extend(T)
L.append("")

# ---- data path ----
L.append("## Data path\n")
L.append("x memcpy: against memcpy with the same page size and processes. x memcached and x Redis "
         "(the faster of TCP and unix socket): a kvbroker read against that server's GET, a "
         "kvbroker PUT against its SET, same page size and processes.\n")
for pb in pages:
    L.append("### %s pages\n" % page(pb))
    L.append("| figure | procs | GB/s median [range] | x memcpy | x memcached | x Redis | ops/s "
             "| p50 us | p90 us | p99 us | p99.9 us |")
    L.append("| --- | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for np in sorted({n for (f, p, n) in groups if p == pb and f in order}):
        for f in order:
            g = get(f, pb, np)
            if not g:
                continue
            gb = med(g, "gb_per_s")
            lo, hi = rng(g, "gb_per_s")
            xm = xr = None
            if f in reads:
                xm, xr = ratio(gb, gbps("memcached-get", pb, np)), ratio(gb, redis_best("get", pb, np))
            elif f in writes:
                xm, xr = ratio(gb, gbps("memcached-set", pb, np)), ratio(gb, redis_best("set", pb, np))
            label = what.get(f, f)
            if f == "memcpy" and np == ncpu:
                label += ", all %d cores" % ncpu
            L.append("| %s | %d | %.2f [%.2f-%.2f] | %s | %s | %s | %s | %s | %s | %s | %s |" % (
                label, np, gb, lo, hi,
                "-" if f.startswith("fio") else fx(ratio(gb, gbps("memcpy", pb, np))), fx(xm), fx(xr),
                num(med(g, "ops_per_s")), us(med(g, "p50_us")), us(med(g, "p90_us")),
                us(med(g, "p99_us")), us(med(g, "p999_us"))))
    L.append("")

# ---- small ops ----
L.append("## Small operations\n")
L.append("| figure | procs | rate median [range] | p50 us | p90 us | p99 us | p99.9 us |")
L.append("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
small = (("nop-poll", "kvbroker NOP, busy-polled", "ops_per_s", "ops/s"),
         ("nop-sleep", "kvbroker NOP, broker asleep (1 ms between ops)", "ops_per_s", "ops/s"),
         ("lookup-1", "kvbroker LOOKUP, 1 key per call", "ops_per_s", "lookups/s"),
         ("lookup-1024", "kvbroker LOOKUP, 1024 keys per call", "keys_per_s", "keys/s"),
         ("memcached-probe", "memcached GET of a 32-byte value", "ops_per_s", "ops/s"),
         ("redis-probe", "Redis GET of a 32-byte value, TCP", "ops_per_s", "ops/s"))
for fig, name, f, unit in small:
    for np in sorted({n for (ff, p, n) in groups if ff == fig}):
        g = get(fig, None, np)
        lo, hi = rng(g, f)
        L.append("| %s | %d | %s %s [%s-%s] | %s | %s | %s | %s |" % (
            name, np, num(med(g, f)), unit, num(lo), num(hi), us(med(g, "p50_us")),
            us(med(g, "p90_us")), us(med(g, "p99_us")), us(med(g, "p999_us"))))
L.append("")

# ---- capacity ----
L.append("## Capacity: MLA at TP=8\n")
L.append("Eight rank processes of one MLA model (Kimi-K2.5 pages: 61 layers x 1152 B x 64 tokens "
         "= 4.29 MiB) each store the same prefix pages, then load them back. Through kvbroker "
         "all ranks resolve to one namespace: the first PUT of a page copies it, the other seven "
         "find it stored. With private pools (what engines do today) every rank copies every "
         "page into its own pinned host memory. Memory is what the broker reports holding for "
         "the namespace, or the eight private pools.\n")
L.append("| pools | ranks | pages per rank | copies made | PUTs that found the page | memory held "
         "| x one copy | store p50 us | load p50 us |")
L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for fig, name in (("mla-kvbroker", "one kvbroker pool"), ("mla-private", "8 private pools")):
    g = get(fig)
    if not g:
        continue
    kinds = [r.get("kinds", {}) for r in g]
    sp = statistics.median([k["put"]["p50_us"] for k in kinds if "put" in k] or [0])
    lp = statistics.median([k["get"]["p50_us"] for k in kinds if "get" in k] or [0])
    L.append("| %s | %d | %d | %d | %d | %.1f MiB | %.2f | %s | %s |" % (
        name, med(g, "tp"), med(g, "prefix_pages"), med(g, "copies"), med(g, "dedup_puts"),
        med(g, "mem_bytes") / 1048576, med(g, "mem_x_one_copy"), us(sp), us(lp)))
L.append("")

# ---- workloads ----
eng = [n for (f, p, n) in groups if f == "engine"]
if eng or get("mix"):
    L.append("## Workloads\n")
    L.append("**engine**: each op is one request of an inference engine over a tree of shared "
             "prefixes: 8 system prompts of 4 pages (picked by Zipf 0.99), 4 conversation "
             "branches of 2 pages under each, 2 pages of its own; Kimi-K2.5 pages (4.29 MiB), "
             "real SHA-256 chain keys. One LOOKUP of all 8 keys, the pages found loaded with one "
             "`kvb_submit` of GETs, the pages not found written back with one of PUTs; load p50 "
             "is arrival to the last page loaded (what delays the first token). **mix**: 64 KiB "
             "pages, Zipf 0.99 keys, 80% GET, 10% PUT of new pages, 5% LOOKUP, 5% ACQUIRE.\n")
    L.append("| workload | procs | ops/s median | GB/s | pages found | p50 us | p99 us | p99.9 us |")
    L.append("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for np in sorted(set(eng)):
        g = get("engine", None, np)
        lp = [r["kinds"]["load"]["p50_us"] for r in g if "load" in r.get("kinds", {})]
        L.append("| engine requests (load p50 %s) | %d | %s | %.2f | %.0f%% | %s | %s | %s |" % (
            us(statistics.median(lp)) if lp else "-", np, num(med(g, "ops_per_s")),
            med(g, "gb_per_s"), 100 * med(g, "page_hit_ratio"), us(med(g, "p50_us")),
            us(med(g, "p99_us")), us(med(g, "p999_us"))))
    g = get("mix")
    if g:
        kinds = g[len(g) // 2].get("kinds", {})
        detail = ", ".join("%s p50 %s" % (k, us(v["p50_us"])) for k, v in kinds.items())
        L.append("| mix (%s) | %d | %s | %.2f | - | %s | %s | %s |" % (
            detail, g[0]["procs"], num(med(g, "ops_per_s")), med(g, "gb_per_s"),
            us(med(g, "p50_us")), us(med(g, "p99_us")), us(med(g, "p999_us"))))
    L.append("")

# ---- disk tier ----
L.append("## Disk tier\n")
if not disk_built:
    L.append("**Not built**: `kvbrokerd --help` of this build does not mention `--disk`, so the "
             "disk-tier section did not run. The fio limits above show what the disk can do.\n")
else:
    L.append("A broker with a %s pool and `--disk` on a file in the same directory as fio's; "
             "working set %s (4x the pool). PUT: new pages, so every PUT past the pool demotes one "
             "to disk. GET: the working set walked in order, so nearly every page comes from "
             "disk. Against fio with the same block size, one job per client process, queue "
             "depth 1 (and 4: 4 GETs per kvb_submit against fio at iodepth 4).\n" % (meta.get("dpool"), meta.get("disk_ws")))
    L.append("| figure | page | procs | GB/s median [range] | x fio | ops/s | p50 us | p99 us |")
    L.append("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |")
    for pb in sorted({p for (f, p, n) in groups if f.startswith("disk-")}):
        for np in sorted({n for (f, p, n) in groups if f.startswith("disk-") and p == pb}):
            for f, name, ref in (("disk-fio-write", "fio random write", None),
                                 ("disk-put", "kvbroker PUT, demoting", "disk-fio-write"),
                                 ("disk-fio-read", "fio random read", None),
                                 ("disk-get", "kvbroker GET, promoting", "disk-fio-read"),
                                 ("disk-fio-read-qd4", "fio random read, iodepth 4", None),
                                 ("disk-get-qd4", "kvbroker GET, 4 per kvb_submit",
                                  "disk-fio-read-qd4")):
                g = get(f, pb, np)
                if not g:
                    continue
                lo, hi = rng(g, "gb_per_s")
                gb = med(g, "gb_per_s")
                L.append("| %s | %s | %d | %.2f [%.2f-%.2f] | %s | %s | %s | %s |" % (
                    name, page(pb), np, gb, lo, hi,
                    fx(ratio(gb, gbps(ref, pb, np))) if ref else "-", num(med(g, "ops_per_s")),
                    us(med(g, "p50_us")), us(med(g, "p99_us"))))
    L.append("")
p = os.path.join(sections, "disk-own.md")
if os.path.exists(p) and os.path.getsize(p):
    L.append("### From `tools/bench-disk.sh`: its queue depth and the warm-restart scan\n")
    # Its raw "name=value" lines (also in its own log) are not for the document.
    own = [l for l in open(p).read().strip().splitlines() if not re.match(r"^(\S+ )?(\w+=\S+\s*)+$", l)]
    L.append("\n".join(own).strip() + "\n")
for name in ("python.md", "sglang.md", "vllm.md", "chain.md", "remote.md", "wheel.md"):
    p = os.path.join(sections, name)
    if os.path.exists(p) and os.path.getsize(p):
        L.append(open(p).read().strip() + "\n")
p = os.path.join(sections, "datapath.md")
if os.path.exists(p) and os.path.getsize(p):
    L.append("## Data path against memcpy (from `tools/bench-datapath.sh`)\n")
    L.append(open(p).read().strip() + "\n")
p = os.path.join(sections, "startup.md")
if os.path.exists(p) and os.path.getsize(p):
    L.append("## Start-up (from `tools/bench-startup.sh`)\n")
    L.append(open(p).read().strip() + "\n")

# ---- plots ----
def bars(name, title, ylabel, header, table, logy=False):
    """One clustered-bar PNG from rows [label, v1, v2...]; None values are left out."""
    if not table or not shutil.which("gnuplot"):
        return None
    dat = os.path.join(plots, name + ".dat")
    with open(dat, "w") as f:
        f.write(" ".join('"%s"' % h for h in header) + "\n")
        for row in table:
            f.write('"%s" ' % row[0] + " ".join("NaN" if v is None else "%.6g" % v
                                                for v in row[1:]) + "\n")
    png = os.path.join(plots, name + ".png")
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "plot-bars.gp")
    rc = subprocess.run(["gnuplot", "-e", "data='%s'; out='%s'; ttl='%s'; stamp='%s'; ylab='%s'; "
                         "ncols=%d; logy=%d" % (dat, png, title, stamp.replace("'", ""), ylabel,
                                                len(header), int(logy)), script],
                        capture_output=True, text=True)
    os.unlink(dat)
    if rc.returncode:
        failures.append("gnuplot %s: %s" % (name, rc.stderr.strip().replace("\n", " ")))
        return None
    return png


# Every plot carries its run: date, machine and command, under its title and in its caption.
stamp = "%s, %s; %s" % (meta.get("date", "?"), meta.get("machine", "?"),
                        meta.get("make", "make bench"))
imgs = []
sysg = [("memcpy", "memcpy"), ("kvb-get", "kvbroker GET"), ("kvb-acquire", "kvbroker ACQUIRE"),
        ("memcached-get", "memcached GET"), ("redis-tcp-get", "Redis GET TCP"),
        ("redis-unix-get", "Redis GET unix")]
sysp = [("memcpy", "memcpy"), ("kvb-put", "kvbroker PUT"), ("memcached-set", "memcached SET"),
        ("redis-tcp-set", "Redis SET TCP"), ("redis-unix-set", "Redis SET unix")]
imgs.append(bars("get-gbps", "Reads, 1 client process", "GB/s", ["page"] + [n for f, n in sysg],
                 [[page(pb)] + [gbps(f, pb, 1) for f, n in sysg] for pb in pages]))
imgs.append(bars("put-gbps", "Writes, 1 client process", "GB/s", ["page"] + [n for f, n in sysp],
                 [[page(pb)] + [gbps(f, pb, 1) for f, n in sysp] for pb in pages]))
if 1 << 20 in pages:
    imgs.append(bars("scaling-1m", "Reads of 1 MiB pages by client processes", "GB/s",
                     ["processes"] + [n for f, n in sysg],
                     [[str(np)] + [gbps(f, 1 << 20, np) for f, n in sysg] for np in procs]))
lat = [(n, med(get(f, 65536, 1), "p50_us"), med(get(f, 65536, 1), "p99_us"))
       for f, n in sysg[1:]]
lat += [("kvbroker LOOKUP 1 key", med(get("lookup-1", None, 1), "p50_us"),
         med(get("lookup-1", None, 1), "p99_us")),
        ("kvbroker NOP", med(get("nop-poll", None, 1), "p50_us"),
         med(get("nop-poll", None, 1), "p99_us")),
        ("memcached 32 B GET", med(get("memcached-probe", None, 1), "p50_us"),
         med(get("memcached-probe", None, 1), "p99_us"))]
imgs.append(bars("latency-64k", "Latency of one op, 64 KiB pages, 1 client process",
                 "microseconds (log scale)", ["op", "p50", "p99"],
                 [[n, a, b] for n, a, b in lat if a], logy=True))
cap = [(n, med(get(f), "mem_bytes")) for f, n in (("mla-kvbroker", "kvbroker"),
                                                   ("mla-private", "8 private pools"))]
imgs.append(bars("capacity-mla-tp8", "Host memory for the same 16 pages, MLA TP=8", "MiB",
                 ["pools", "memory held"], [[n, v / 1048576] for n, v in cap if v]))
imgs = [i for i in imgs if i]
if imgs:
    L.append("## Plots\n")
    rel = os.path.relpath(plots, os.path.dirname(os.path.abspath(out)))
    for i in imgs:
        L.append("![%s](%s/%s)\n" % (os.path.basename(i)[:-4], rel, os.path.basename(i)))
        L.append("*%s.*\n" % stamp)
elif not shutil.which("gnuplot"):
    L.append("Plots skipped: gnuplot not installed (`sh tools/deps.sh bench`).\n")

if failures:
    L.append("## Failed runs\n")
    L.extend("- `%s`" % f.replace("`", "'")[:400] for f in failures)
    L.append("")
L.append("Raw results of this run: `%s` (one JSON object per measurement).\n" % res)
open(out, "w").write("\n".join(L))
print("bench: wrote %s and %d plots (%d measurements, %d failures)" % (out, len(imgs), len(rows),
                                                                       len(failures)))
