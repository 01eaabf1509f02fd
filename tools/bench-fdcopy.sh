#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-fdcopy.sh [B] - what KVB_BUF_FDCOPY costs: GET and PUT of one Kimi-K2.5 MLA page
# (61 layers x 1152 B x 64 tokens = 4.29 MiB) with the client's buffer registered three ways,
# against plain memcpy of the same page, in one run on one broker:
#   alloc   kvb_buf_alloc_host (the library's sealed memfd, mapped by the broker: memcpy)
#   memfd   the client's own sealed memfd, kvb_buf_register_host_fd (mapped: memcpy)
#   fdcopy  an unsealable memfd as SGLang 0.5.23's alloc_shm makes it, KVB_BUF_FDCOPY (the
#           broker copies with preadv/pwritev on the file)
# Every case runs REPS times, interleaved (the repetition is the outer loop, so the machine's
# drift spreads over all of them); prints the median, min and max GB/s and the ratios of the
# medians. Knobs (environment): KVB_FDC_REPS (5), KVB_FDC_SECONDS (2), KVB_FDC_PAGES (working
# set in pages, 48: 206 MiB, beyond the LLC), KVB_FDC_POOL (768M), KVB_FDC_ARGS (extra
# kvbrokerd arguments, e.g. "--copy-threads 2").
set -eu

B=${1:-build/release}
REPS=${KVB_FDC_REPS:-5}
SECS=${KVB_FDC_SECONDS:-2}
PAGES=${KVB_FDC_PAGES:-48}
POOL=${KVB_FDC_POOL:-768M}
DIR=$(mktemp -d)
PID=
cleanup() {
	[ -n "$PID" ] && kill "$PID" 2>/dev/null && wait "$PID" 2>/dev/null
	rm -rf "$DIR"
}
trap cleanup EXIT

# shellcheck disable=SC2086
"$B/bin/kvbrokerd" --socket "$DIR/sock" --pool "$POOL" ${KVB_FDC_ARGS:-} >"$DIR/log" 2>&1 &
PID=$!
i=0
while [ ! -S "$DIR/sock" ] && [ $i -lt 100 ]; do
	sleep 0.1
	i=$((i + 1))
done
"$B/bin/kvbctl" --socket "$DIR/sock" stats >/dev/null 2>&1 || sleep 1

for r in $(seq "$REPS"); do
	for c in "memcpy" "get alloc" "get memfd" "get fdcopy" "put alloc" "put memfd" "put fdcopy"; do
		set -- $c
		if [ "$1" = memcpy ]; then
			extra=
		else
			extra="--host-buf $2"
		fi
		# shellcheck disable=SC2086
		"$B/bin/kvbbench" --socket "$DIR/sock" --layout kimi --pages "$PAGES" \
			--seconds "$SECS" --json $1 $extra |
			sed "s/^{/{\"case\":\"$c\",\"rep\":$r,/" >>"$DIR/results.jsonl"
	done
done

python3 - "$DIR/results.jsonl" <<'EOF'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
by = {}
for r in rows:
    by.setdefault(r["case"], []).append(r["gb_per_s"])
med = {c: statistics.median(v) for c, v in by.items()}
print("| case | GB/s median | min | max | runs |")
print("|---|---|---|---|---|")
for c, v in by.items():
    print(f"| {c} | {med[c]:.2f} | {min(v):.2f} | {max(v):.2f} | {len(v)} |")
print()
for op in ("get", "put"):
    f, m, a = med[f"{op} fdcopy"], med[f"{op} memfd"], med[f"{op} alloc"]
    print(f"- {op}: fdcopy / memfd (sealed, mapped) = {f / m:.2f}, fdcopy / alloc = "
          f"{f / a:.2f}, fdcopy / memcpy = {f / med['memcpy']:.2f}")
EOF
