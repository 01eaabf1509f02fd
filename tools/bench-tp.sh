#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-tp.sh REPS "QDS" SIDE=BUILD[:VAR=VALUE] ... - MLA TP=8 Kimi loads (kvbbench --procs 8
# --layout kimi mla-tp) of several builds side by side, interleaved: every repetition runs each
# --qd of QDS on each side in turn, so the machine's drift spreads over all of them. A side is a
# build directory (its kvbrokerd and kvbbench), with an optional VAR=VALUE given to both
# (KVB_BG_NICE=0: the same build, one knob turned); the side named "private" runs that build's
# kvbbench --private (each rank its own pool, no broker). Each broker side gets a fresh
# kvbrokerd --pool 1G per run. KVB_BENCH_TP_ARGS adds kvbbench arguments (--leave-early).
# Prints, per --qd and side, medians of: the GET p50, mean and p99 (qd 1: each kvb_get; qd N:
# each page, from its batch's start), the batch p50 (qd N: what delays a request's first
# token), the load phase and the whole run, then each run's load phase; and the load average.
# Used for the TP=8 A/B figures of the data path.
set -eu
REPS=$1 QDS=$2
shift 2
XARGS=${KVB_BENCH_TP_ARGS:-}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvbtp.XXXXXX")
bp=""
trap '[ -n "$bp" ] && kill "$bp" 2>/dev/null; rm -rf "$tmp"' EXIT
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$REPS"); do
	for qd in $QDS; do
		for sb in "$@"; do
			side=${sb%%=*}
			B=${sb#*=}
			E=""
			case $B in *:*)
				E=${B#*:}
				B=${B%%:*}
				;;
			esac
			K="$B/bin/kvbbench"
			if [ "$side" = private ]; then
				# shellcheck disable=SC2086
				env $E "$K" --procs 8 --layout kimi --qd "$qd" --json --private $XARGS \
					mla-tp >"$tmp/o" 2>"$tmp/e" || echo "$side: $(tail -n 1 "$tmp/e")" >&2
			else
				# shellcheck disable=SC2086
				env $E "$B/bin/kvbrokerd" --socket "$tmp/b.sock" --pool 1G \
					--log-level warn &
				bp=$!
				i=0
				until "$K" --socket "$tmp/b.sock" --iters 1 --warmup 0 nop >/dev/null 2>&1; do
					i=$((i + 1))
					if [ $i -ge 300 ] || ! kill -0 "$bp" 2>/dev/null; then
						echo "bench-tp: $side: the broker did not start" >&2
						exit 1
					fi
					sleep 0.1
				done
				# shellcheck disable=SC2086
				env $E "$K" --socket "$tmp/b.sock" --procs 8 --layout kimi --qd "$qd" --json \
					$XARGS mla-tp >"$tmp/o" 2>"$tmp/e" || echo "$side: $(tail -n 1 "$tmp/e")" >&2
				kill "$bp" 2>/dev/null || true
				wait "$bp" 2>/dev/null || true
				bp=""
			fi
			[ -s "$tmp/o" ] && echo "$qd $side $(cat "$tmp/o")" >>"$tmp/res"
			: >"$tmp/o"
		done
	done
done
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
python3 - "$tmp/res" <<'PY'
import collections, json, os, statistics as st, sys

d = collections.defaultdict(list)
for line in open(sys.argv[1]) if os.path.exists(sys.argv[1]) else ():
    qd, side, js = line.split(" ", 2)
    d[(qd, side)].append(json.loads(js))
med = lambda v: st.median(v) if v else float("nan")
for (qd, side), v in d.items():
    g = [x["kinds"]["get"] for x in v]
    batch = [x["kinds"]["load"]["p50_us"] / 1e3 for x in v if "load" in x["kinds"]]
    print("qd %-3s %-8s n=%d  GET p50 %.2f mean %.2f p99 %.2f ms  batch p50 %s  load phase "
          "%.1f ms  wall %.1f ms  [load phases %s]" % (
              qd, side, len(v), med([k["p50_us"] / 1e3 for k in g]),
              med([k["mean_us"] / 1e3 for k in g if "mean_us" in k]),
              med([k["p99_us"] / 1e3 for k in g]),
              "%.2f ms" % med(batch) if batch else "-", med([x["load_ms"] for x in v]),
              med([x["seconds"] * 1e3 for x in v]),
              " ".join("%.0f" % x["load_ms"] for x in v)))
PY
