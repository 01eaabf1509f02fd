#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-hist.sh B: what the broker's histograms and hit attribution cost on the data path.
# Two kvbrokerd of build B side by side, the same but for KVB_BROKER_NO_HISTOGRAMS=1 on the
# second (no op timing, no eviction age: the switch exists for this measurement only); every
# repetition runs GET then PUT of each page size against one then the other (order swapped
# each repetition), so the machine's drift spreads over both. Prints a markdown table on
# stdout: per mode and page size the median GB/s of each and their ratio (target >= 0.98).
# Environment: KVB_BENCH_QUICK=1 (short), KVB_HIST_REPS, KVB_HIST_SECS, KVB_HIST_PAGES.
set -eu
B=$1
QUICK=${KVB_BENCH_QUICK:-0}
REPS=${KVB_HIST_REPS:-7}
SECS=${KVB_HIST_SECS:-2}
PAGES=${KVB_HIST_PAGES:-"64K 1M"}
if [ "$QUICK" = 1 ]; then
	REPS=2
	SECS=1
fi
tmp=$(mktemp -d /tmp/kvbhist.XXXXXX)
"$B/bin/kvbrokerd" --socket "$tmp/on.sock" --pool 1G --log-level error &
on=$!
KVB_BROKER_NO_HISTOGRAMS=1 "$B/bin/kvbrokerd" --socket "$tmp/off.sock" --pool 1G --log-level error &
off=$!
trap 'kill $on $off 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$tmp"' EXIT
for s in on off; do
	i=0
	until "$B/bin/kvbctl" --socket "$tmp/$s.sock" status >/dev/null 2>&1; do
		i=$((i + 1))
		[ "$i" -lt 100 ] || { echo "bench-hist: kvbrokerd ($s) did not start" >&2; exit 1; }
		sleep 0.1
	done
done
# The switch took: the "off" broker's STATS has no histograms.
"$B/bin/kvbctl" --socket "$tmp/off.sock" metrics | grep -q kvbroker_op_latency_seconds &&
	{ echo "bench-hist: KVB_BROKER_NO_HISTOGRAMS had no effect" >&2; exit 1; }
ex='import json, sys; print(json.load(sys.stdin)["gb_per_s"])'
r=1
while [ "$r" -le "$REPS" ]; do
	order="on off"
	[ $((r % 2)) = 0 ] && order="off on"
	for pg in $PAGES; do
		for m in get put; do
			for s in $order; do
				g=$("$B/bin/kvbbench" --socket "$tmp/$s.sock" --json --seconds "$SECS" \
					--page "$pg" --ws 256M "$m" | python3 -c "$ex")
				echo "$pg $m $s $g" >>"$tmp/res"
			done
		done
	done
	r=$((r + 1))
done
echo "## Histograms and hit attribution: data-path cost"
echo
echo "Same build, one kvbbench process, $REPS interleaved repetitions of ${SECS} s; the second"
echo "broker runs with KVB_BROKER_NO_HISTOGRAMS=1. Load average: $(cut -d' ' -f1-3 /proc/loadavg)."
echo
python3 - "$tmp/res" <<'PY'
import collections, statistics as st, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    pg, m, s, g = line.split()
    d[(pg, m, s)].append(float(g))
print("| op | page | with (GB/s) | without (GB/s) | ratio (range) | >= 0.98 |")
print("|---|---|---|---|---|---|")
for (pg, m) in dict.fromkeys((k[0], k[1]) for k in d):
    on, off = d[(pg, m, "on")], d[(pg, m, "off")]
    rs = [a / b for a, b in zip(on, off) if b > 0]
    r = st.median(on) / st.median(off)
    print("| %s | %s | %.2f | %.2f | %.3f (%.3f-%.3f) | %s |" % (
        m.upper(), pg, st.median(on), st.median(off), r, min(rs), max(rs),
        "met" if r >= 0.98 else "MISSED"))
PY
