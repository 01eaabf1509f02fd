#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-ab.sh A B REPS SECS "PAGES" "MODES" [kvbbench args...]: two builds' data paths side by
# side, interleaved. A and B are build directories (build/release of two trees: before and
# after a change); each gets its own kvbrokerd --pool 1G, and every repetition measures memcpy
# (B's kvbbench) then each mode on A then on B, so the machine's drift spreads over both.
# Prints per page size memcpy's median GB/s and p50, then per mode and build the median ratio
# to memcpy (with the range over repetitions) and the median p50 (with its excess over
# memcpy's), then the load average. PAGES: sizes for --page, or "kimi" for --layout kimi. A
# mode may carry its own arguments joined by '+' ("get+--qd+8"). Used for the data path's A/B
# figures; on a shared machine, prefer it to two separate runs. Per mode it also prints
# "b/a": B's GB/s over A's, taken per repetition (the two ran back to back) and then the median
# with its range. A directory whose bin/ holds links to programs elsewhere works as A or B
# (tools/bench.sh: the wheel's kvbrokerd against the build's).
set -eu
A=$1 B=$2 REPS=$3 SECS=$4 PAGES=$5 MODES=$6
shift 6
tmp=$(mktemp -d /tmp/kvbab.XXXXXX)
# KVB_AB_BROKER_ARGS: more kvbrokerd options for both, e.g. "--hugepages collapse" (pools of
# 2 MiB pages: two 4 KiB pools' physical layouts differ from start to start, and so does
# their copy speed, which would hide a difference of a few percent between A and B).
# shellcheck disable=SC2086
"$A/bin/kvbrokerd" --socket "$tmp/a.sock" --pool 1G --log-level error ${KVB_AB_BROKER_ARGS:-} &
ap=$!
# shellcheck disable=SC2086
"$B/bin/kvbrokerd" --socket "$tmp/b.sock" --pool 1G --log-level error ${KVB_AB_BROKER_ARGS:-} &
bp=$!
trap 'kill $ap $bp 2>/dev/null || true; rm -rf "$tmp"' EXIT
sleep 2
[ -z "${KVB_AB_BROKER_ARGS:-}" ] || sleep 3  # collapse: ~1 s a GiB
ex='import json, sys; d = json.load(sys.stdin); print(d["gb_per_s"], d["p50_us"])'
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for r in $(seq "$REPS"); do
	for p in $PAGES; do
		pa="--page $p"
		[ "$p" = kimi ] && pa="--layout kimi"
		# shellcheck disable=SC2086
		echo "$p memcpy $("$B/bin/kvbbench" --json --seconds "$SECS" $pa "$@" memcpy | python3 -c "$ex")" >>"$tmp/res"
		for m in $MODES; do
			for side in a b; do
				bin=$A
				[ "$side" = b ] && bin=$B
				# shellcheck disable=SC2086
				g=$("$bin/bin/kvbbench" --socket "$tmp/$side.sock" --json --seconds "$SECS" $pa "$@" $(echo "$m" | tr '+' ' ') | python3 -c "$ex") || g="0 0"
				echo "$p $side:$m $g" >>"$tmp/res"
			done
		done
	done
done
python3 - "$tmp/res" <<'PY'
import collections, statistics as st, sys
d = collections.defaultdict(list)
for line in open(sys.argv[1]):
    p, m, g, l = line.split()
    d[(p, m)].append((float(g), float(l)))
for p in dict.fromkeys(k[0] for k in d):
    mc = st.median(x[0] for x in d[(p, "memcpy")])
    ml = st.median(x[1] for x in d[(p, "memcpy")])
    print("%s memcpy %.2f GB/s p50 %.2f us" % (p, mc, ml))
    for (pp, m), v in d.items():
        if pp != p or m == "memcpy":
            continue
        r = [x[0] / mc for x in v]
        l = st.median(x[1] for x in v)
        print("  %-16s %.2f (%.2f-%.2f)  p50 %.2f us (%+.2f)" % (m, st.median(r), min(r), max(r), l, l - ml))
    for (pp, m), v in d.items():
        if pp != p or not m.startswith("a:") or (p, "b:" + m[2:]) not in d:
            continue
        r = [b[0] / a[0] for a, b in zip(v, d[(p, "b:" + m[2:])]) if a[0] > 0]
        if r:
            print("  %-16s %.3f (%.3f-%.3f)" % ("b/a " + m[2:], st.median(r), min(r), max(r)))
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
