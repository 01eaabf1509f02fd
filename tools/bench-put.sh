#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-put.sh A B REPS SECS "PAGES": the PUT paths of two builds side by side, interleaved
# (the filled PUT). A and B are build directories (before and after); each gets its own
# kvbrokerd --pool 1G. Every repetition measures, per page size, memcpy (B's kvbbench), then
# put (registered buffer) and put-user (plain memory) on A and on B, and put-user on B with
# KVB_CLIENT_FILL_KB=0 (B's library without filled PUTs: copy, then PUT). Prints per page
# memcpy's median GB/s and p50, then each mode's median as a ratio to memcpy twice: by
# throughput (GB/s, which a loaded machine's tail of slow ops drags down) and by p50 latency
# (memcpy p50 / mode p50, what one page costs when nothing else intervenes). PAGES: sizes for
# --page, or "kimi" for --layout kimi. PIN=1: brokers on CPU 1 and every client on CPU 0
# (taskset), so that the two copies of a filled PUT can overlap even on a loaded machine.
set -eu
A=$1 B=$2 REPS=$3 SECS=$4 PAGES=$5
tmp=$(mktemp -d /tmp/kvbput.XXXXXX)
bt="" ct=""
[ "${PIN:-0}" = 1 ] && bt="taskset -c 1" ct="taskset -c 0"
# shellcheck disable=SC2086
$bt "$A/bin/kvbrokerd" --socket "$tmp/a.sock" --pool 1G --log-level warn &
ap=$!
# shellcheck disable=SC2086
$bt "$B/bin/kvbrokerd" --socket "$tmp/b.sock" --pool 1G --log-level warn &
bp=$!
trap 'kill $ap $bp 2>/dev/null || true; rm -rf "$tmp"' EXIT
sleep 2
q='import json, sys; d = json.load(sys.stdin); print(d["gb_per_s"], d["p50_us"])'
run() { # label, then env and command
	label=$1
	shift
	# shellcheck disable=SC2086
	r=$($ct "$@" --json | python3 -c "$q") || r="0 0"
	echo "$p $label $r" >>"$tmp/res"
}
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
for _ in $(seq "$REPS"); do
	for p in $PAGES; do
		pa="--page $p"
		[ "$p" = kimi ] && pa="--layout kimi"
		# shellcheck disable=SC2086
		run memcpy "$B/bin/kvbbench" --seconds "$SECS" $pa memcpy
		for m in put put-user; do
			for side in a b; do
				bin=$A
				[ "$side" = b ] && bin=$B
				# shellcheck disable=SC2086
				run "$side:$m" "$bin/bin/kvbbench" --socket "$tmp/$side.sock" \
					--seconds "$SECS" $pa "$m"
			done
		done
		# shellcheck disable=SC2086
		run b:put-user-nofill env KVB_CLIENT_FILL_KB=0 "$B/bin/kvbbench" \
			--socket "$tmp/b.sock" --seconds "$SECS" $pa put-user
	done
done
python3 - "$tmp/res" <<'PY'
import collections, statistics as st, sys
g, l = collections.defaultdict(list), collections.defaultdict(list)
for line in open(sys.argv[1]):
    p, m, gb, p50 = line.split()
    g[(p, m)].append(float(gb))
    l[(p, m)].append(float(p50))
for p in dict.fromkeys(k[0] for k in g):
    mg, ml = st.median(g[(p, "memcpy")]), st.median(l[(p, "memcpy")])
    print("%s memcpy %.2f GB/s p50 %.1f us" % (p, mg, ml))
    for (pp, m), v in g.items():
        if pp == p and m != "memcpy":
            lm = st.median(l[(p, m)])
            print("  %-18s GB/s x%.2f  p50 x%.2f (%.1f us)"
                  % (m, st.median(v) / mg, ml / lm if lm else 0, lm))
PY
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
