#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench.sh B - `make bench`: measure kvbrokerd with kvbbench and write docs/benchmarks.md.
#
# Starts one broker from build dir B on a private socket (its pool name derives from the socket,
# so it is private too; the pool is big enough for every working set), then runs, for page sizes
# 64K, 1M and 4.5M and 1 and 2 client processes: the single-thread memcpy baseline, put, get,
# get-user and acquire; plus nop and lookup at 1 and 2 processes. Every measurement runs REPS
# times, interleaved (the repetition is the outer loop, so slow drift of the machine spreads
# over all figures instead of biasing one); the report gives the median and the range. Ratios
# divide by the median single-thread memcpy GB/s of the same page size, measured in the same
# run. About 2.5 minutes on a 2-core machine with the defaults.
#
# Knobs (environment): KVB_BENCH_SECONDS (1 per run), KVB_BENCH_REPS (3), KVB_BENCH_PAGES
# ("64K 1M 4.5M"), KVB_BENCH_PROCS ("1 2"), KVB_BENCH_POOL (2G), KVB_BENCH_OUT
# (docs/benchmarks.md). Raw results: B/bench/results.jsonl. Exit 1 when any run failed (the
# report is written anyway and lists the failures).
set -eu

B=${1:-build/release}
SECS=${KVB_BENCH_SECONDS:-1}
REPS=${KVB_BENCH_REPS:-3}
PAGES=${KVB_BENCH_PAGES:-"64K 1M 4.5M"}
PROCS=${KVB_BENCH_PROCS:-"1 2"}
POOL=${KVB_BENCH_POOL:-2G}
OUT=${KVB_BENCH_OUT:-docs/benchmarks.md}
MODES="memcpy put get get-user acquire"

for p in kvbrokerd kvbbench kvbctl; do
	if [ ! -x "$B/bin/$p" ]; then
		echo "bench: $B/bin/$p missing; run: make MODE=${B##*/}" >&2
		exit 1
	fi
done
command -v python3 >/dev/null || { echo "bench: python3 needed for the report" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvbbench.XXXXXX")
sock="$tmp/kvbroker.sock"
log="$tmp/kvbrokerd.log"
res="$B/bench/results.jsonl"
fails="$B/bench/failures.txt"
pid=""
mkdir -p "$B/bench"
: >"$res"
: >"$fails"

cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

broker_cmd="$B/bin/kvbrokerd --socket $sock --pool $POOL --log-level warn"
echo "bench: $broker_cmd"
# shellcheck disable=SC2086
$broker_cmd 2>"$log" &
pid=$!
i=0
until "$B/bin/kvbctl" --socket "$sock" status >/dev/null 2>&1; do
	if ! kill -0 "$pid" 2>/dev/null || [ "$i" -ge 100 ]; then
		echo "bench: kvbrokerd did not come up; its log:" >&2
		cat "$log" >&2
		exit 1
	fi
	i=$((i + 1))
	sleep 0.1
done

nfail=0
# One progress line per measurement, from its JSON.
summary='import json, sys
r = json.load(sys.stdin)
print("%.3g ops/s  %.3g GB/s  p50 %.3g us" % (r["ops_per_s"], r["gb_per_s"], r["p50_us"]))'
# run MODE PAGE PROCS [extra kvbbench args]: one measurement appended to $res.
run() {
	m=$1 pg=$2 np=$3
	shift 3
	if ! kill -0 "$pid" 2>/dev/null; then
		echo "$m page $pg procs $np: kvbrokerd is gone" >>"$fails"
		nfail=$((nfail + 1))
		return 0
	fi
	if out=$("$B/bin/kvbbench" --socket "$sock" --json --seconds "$SECS" --page "$pg" \
		--procs "$np" "$@" "$m" 2>"$tmp/err"); then
		echo "$out" >>"$res"
		line=$(echo "$out" | python3 -c "$summary")
		printf '  %-8s page %-5s procs %s  %s\n' "$m" "$pg" "$np" "$line"
	else
		echo "$m page $pg procs $np: $(tr '\n' ' ' <"$tmp/err")" >>"$fails"
		echo "  $m page $pg procs $np: FAILED: $(tr '\n' ' ' <"$tmp/err")" >&2
		nfail=$((nfail + 1))
	fi
}

# Other work on the machine shows up as noise (and on 2 CPUs, as stalls of the busy-polling
# client and broker): record the load so a reader can judge, and warn when it is high.
load_start=$(cut -d' ' -f1-3 /proc/loadavg)
case $load_start in
0.[0-4]*) ;;
*) echo "bench: warning: load average $load_start before the run; figures will be noisy" >&2 ;;
esac
start=$(date +%s)
rep=1
while [ "$rep" -le "$REPS" ]; do
	echo "bench: repetition $rep of $REPS"
	for np in $PROCS; do
		run nop 64K "$np"
		run lookup 64K "$np" --batch 1024
		for pg in $PAGES; do
			for m in $MODES; do
				run "$m" "$pg" "$np"
			done
		done
	done
	rep=$((rep + 1))
done
elapsed=$(($(date +%s) - start))
load_end=$(cut -d' ' -f1-3 /proc/loadavg)

if kill -0 "$pid" 2>/dev/null; then
	"$B/bin/kvbctl" --socket "$sock" status >"$B/bench/broker-status.txt" 2>&1 || true
	kill -TERM "$pid"
	brc=0
	wait "$pid" || brc=$?
	pid=""
	[ "$brc" -eq 0 ] || echo "broker exited with status $brc after SIGTERM" >>"$fails"
else
	echo "kvbrokerd died during the run; last log lines: $(tail -n 5 "$log" | tr '\n' ' ')" \
		>>"$fails"
fi

cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
llc=$(lscpu 2>/dev/null | sed -n 's/^L3 cache:[[:space:]]*//p' | head -n 1)
machine="$(nproc) CPUs, ${cpu:-unknown CPU}, ${mem} RAM, L3 ${llc:-unknown}, Linux $(uname -r);"
machine="$machine load average $load_start before the run, $load_end after it"
machine="$machine (the run itself keeps about 2 busy)"
cmd="KVB_BENCH_SECONDS=$SECS KVB_BENCH_REPS=$REPS KVB_BENCH_POOL=$POOL sh tools/bench.sh $B"

python3 - "$res" "$fails" "$OUT" "$machine" "$(date -u '+%Y-%m-%d %H:%M UTC')" "$cmd" \
	"$broker_cmd" "$elapsed" "$REPS" "$SECS" <<'EOF'
import json, statistics, sys

res, fails, out, machine, date, cmd, broker_cmd, elapsed, reps, secs = sys.argv[1:11]
rows = [json.loads(l) for l in open(res) if l.strip()]
failures = [l.strip() for l in open(fails) if l.strip()]
groups = {}
for r in rows:
    groups.setdefault((r["mode"], r["page_bytes"], r["procs"]), []).append(r)

def med(g, f):
    return statistics.median(r[f] for r in g)

def rng(g, f):
    v = [r[f] for r in g]
    return min(v), max(v)

def page(b):
    for u, n in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if b >= n:
            return ("%g %s" % (b / n, u))
    return "%d B" % b

def num(x):
    if x >= 1e6:
        return "%.2f M" % (x / 1e6)
    if x >= 1e4:
        return "%.1f k" % (x / 1e3)
    if x >= 100:
        return "%.0f" % x
    return "%.3g" % x

base = {pb: med(g, "gb_per_s") for (m, pb, p), g in groups.items() if m == "memcpy" and p == 1}
order = ["memcpy", "put", "get", "get-user", "acquire"]
what = {
    "nop": "NOP round trip",
    "lookup": "LOOKUP, 1024 keys per call",
    "memcpy": "memcpy baseline",
    "put": "PUT from registered buffer",
    "get": "GET into registered buffer",
    "get-user": "GET into malloc'd buffer",
    "acquire": "ACQUIRE + copy out + RELEASE",
}

L = []
L.append("# kvbroker benchmarks\n")
L.append("""What these figures are: every row is one `kvbbench` mode run against one `kvbrokerd`
that `tools/bench.sh` started for the occasion, repeated %s times (interleaved, so drift of the
machine spreads across all rows) for %s s each; the table gives the median and, in brackets,
the range of the repetitions. This machine's run-to-run noise is 10-30%%, so compare medians and
read the ranges.

- **memcpy baseline**: one process copying page-sized blocks between two private buffers of
  128 MiB or more (four times the last-level cache), so every copy is cold memory to cold
  memory. Every "x memcpy" ratio divides by the single-process memcpy median of the same page
  size from this same run.
- **get**: `kvb_get` into a buffer from `kvb_buf_alloc_host` - the broker copies from the pool
  into the client's registered memory. **get-user**: `kvb_get` into plain `malloc` memory - the
  library acquires the page, copies it from its read-only pool mapping and releases it.
  **acquire**: `kvb_acquire`, copy every byte of the page out to a private buffer, `kvb_release`.
  **put**: `kvb_put` of new keys from a registered buffer; once the pool is full each PUT
  evicts the coldest page on demand, which is part of what is timed. The broker prefaults its
  pool at start-up (`--no-prefault` turns that off), so PUTs never pay first-touch faults.
- Reads walk a working set of at least 128 MiB of stored pages, pre-populated and checked
  resident before timing; destinations cycle through a buffer of the same size.
- **nop**: `kvb_nop` round trip through the shared-memory rings, busy-polled.
  **lookup**: `kvb_lookup` of 1024 stored keys per call; throughput in keys per second.
- Latency: every operation timed with `CLOCK_MONOTONIC`, all processes' histograms merged;
  ops/s and GB/s (10^9 bytes of page data per second) are summed over processes.
- With 2 processes on this 2-CPU machine the clients compete with the broker's own polling
  thread for the CPUs, so 2-process figures show contention as much as scaling.
""" % (reps, secs))
L.append("Machine: %s.  \nDate: %s.  \nCommand: `%s` (what `make bench` runs; %s s in all).  \n"
         "Broker: `%s`.\n" % (machine, date, cmd, elapsed, broker_cmd))

L.append("## Data path (GB/s)\n")
L.append("| figure | page | procs | GB/s median [range] | x memcpy | ops/s | p50 us | p99 us "
         "| p99.9 us |")
L.append("| --- | --- | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
keys = sorted({(pb, p) for (m, pb, p) in groups if m in order})
for pb, p in keys:
    for m in order:
        g = groups.get((m, pb, p))
        if not g:
            continue
        lo, hi = rng(g, "gb_per_s")
        gb = med(g, "gb_per_s")
        ratio = "%.2f" % (gb / base[pb]) if base.get(pb) else "-"
        L.append("| %s | %s | %d | %.2f [%.2f-%.2f] | %s | %s | %.1f | %.1f | %.1f |" % (
            what[m], page(pb), p, gb, lo, hi, ratio, num(med(g, "ops_per_s")),
            med(g, "p50_us"), med(g, "p99_us"), med(g, "p999_us")))
L.append("")

L.append("## Small operations\n")
L.append("| figure | procs | rate median [range] | p50 us | p90 us | p99 us | p99.9 us |")
L.append("| --- | ---: | --- | ---: | ---: | ---: | ---: |")
for m, f, unit in (("nop", "ops_per_s", "ops/s"), ("lookup", "keys_per_s", "keys/s")):
    for p in sorted({p for (mm, pb, p) in groups if mm == m}):
        g = [r for (mm, pb, pp), gg in groups.items() if mm == m and pp == p for r in gg]
        lo, hi = rng(g, f)
        L.append("| %s | %d | %s %s [%s-%s] | %.2f | %.2f | %.2f | %.2f |" % (
            what[m], p, num(med(g, f)), unit, num(lo), num(hi), med(g, "p50_us"),
            med(g, "p90_us"), med(g, "p99_us"), med(g, "p999_us")))
L.append("")

L.append("## Targets of issue 2\n")
L.append("| target | measured (median) | met |")
L.append("| --- | --- | --- |")
def target(name, value, ok):
    L.append("| %s | %s | %s |" % (name, value, "yes" if ok else "**no**"))
g = groups.get(("nop", 65536, 1))
if g:
    v = med(g, "p50_us")
    target("NOP round trip p50 <= 1 us (1 process)", "%.2f us" % v, v <= 1.0)
for m in ("get", "get-user", "acquire"):
    for pb in sorted(base):
        g = groups.get((m, pb, 1))
        if g:
            r = med(g, "gb_per_s") / base[pb]
            target("%s at %s >= 80%% of memcpy (1 process)" % (what[m], page(pb)),
                   "%.0f%% (%.2f of %.2f GB/s)" % (100 * r, med(g, "gb_per_s"), base[pb]),
                   r >= 0.8)
g = groups.get(("lookup", 65536, 1))
if g:
    v = med(g, "keys_per_s")
    target("batched LOOKUP >= 10 M keys/s (1 process)", "%.1f M keys/s" % (v / 1e6), v >= 1e7)
L.append("")

if failures:
    L.append("## Failed runs\n")
    L.extend("- `%s`" % f.replace("`", "'") for f in failures)
    L.append("")
L.append("Raw results of this run: `%s` (one JSON object per measurement).\n" % res)
open(out, "w").write("\n".join(L))
print("bench: wrote %s (%d measurements, %d failures)" % (out, len(rows), len(failures)))
EOF

if [ "$nfail" -ne 0 ] || [ -s "$fails" ]; then
	echo "bench: some runs failed, see $OUT" >&2
	exit 1
fi
