#!/bin/sh
# SPDX-License-Identifier: MIT
#
# gpu-check.sh - the GPU check of the CUDA copy engine, on a machine with a GPU and its driver.
# No network needed. Finishes in a few minutes on one H200 (budget: 8).
#
#   sh tools/gpu-check.sh [BUILD_DIR]      (default build/release)
#
# 1. Builds (make -j) with the CUDA headers at $CUDA_HOME (default /usr/local/cuda) and nvcc.
# 2. Probes the GPU; without one it stops here with exit 2 and the reason.
# 3. For each copy path (auto: measured per page shape; copy: cuMemcpyAsync per part; kernel:
#    the gather/scatter kernel): starts kvbrokerd with --gpu-path PATH, then
#    - correctness: process A (cuMemAlloc, one buffer per layer) fills KIMI_PAGES pages of the
#      Kimi-K2.5 MLA layout (61 layers x 576 bf16 x 64 tokens) on the device and PUTs them;
#      process B (CUDA virtual-memory API, one cuMemCreate allocation exported as a POSIX fd)
#      GETs them into other slots, layer groups in order, and compares on the device;
#    - the PUTs' checksums, computed on the GPU: the broker is killed (-9), a new one adopts
#      the pool (every page's checksum checked against its bytes: none may be dropped), and the
#      pages are read back and compared again;
#    - throughput: broker DMA D2H (PUT) and H2D (GET) GB/s of BENCH_PAGES pages x ROUNDS,
#      against cuMemcpyAsync of the same bytes as one contiguous block from pinned memory
#      in one process, measured in the same run.
# 4. Prints a summary; exit 0 when every byte matched and every figure reached TARGET_PCT of
#    its baseline, 1 when data was wrong or anything failed, 3 when only throughput missed.
#
# Knobs: KIMI_PAGES (64), BENCH_PAGES (256: 1.15 GB per round), ROUNDS (4), POOL (8G),
# PATHS ("auto copy kernel"), TARGET_PCT (90), MAKEFLAGS_EXTRA.
#
# PREBUILT=1 skips step 1 and runs the binaries already in BUILD_DIR: for a GPU machine without
# the build's packages (liburing, libnuma, ...) or without network. Build where they are (the
# kernels are embedded in the binaries), then `sh tools/gpu-libs.sh` (copies of the libraries
# the binaries load, into .gpu/lib); carry BUILD_DIR/bin and .gpu there and run
#   LD_LIBRARY_PATH=$PWD/.gpu/lib PREBUILT=1 sh tools/gpu-check.sh
set -u

B=${1:-build/release}
KIMI_PAGES=${KIMI_PAGES:-64}
BENCH_PAGES=${BENCH_PAGES:-256}
ROUNDS=${ROUNDS:-4}
POOL=${POOL:-8G}
PATHS=${PATHS:-"auto copy kernel"}
TARGET_PCT=${TARGET_PCT:-90}
CUDA_HOME=${CUDA_HOME:-/usr/local/cuda}

say() { echo "gpu-check: $*"; }
fail() {
	echo "gpu-check: FAILED: $*" >&2
	exit 1
}

cd "$(dirname "$0")/.." || exit 1
if [ "${PREBUILT:-0}" = 1 ]; then
	say "prebuilt binaries in $B"
else
	if [ ! -f "$CUDA_HOME/include/cuda.h" ]; then
		fail "no CUDA headers at $CUDA_HOME/include (set CUDA_HOME)"
	fi
	if [ ! -x "$CUDA_HOME/bin/nvcc" ]; then
		fail "no nvcc at $CUDA_HOME/bin: the check needs the kernels"
	fi
	say "building ($B)"
	jobs=$(nproc 2>/dev/null || echo 4)
	# shellcheck disable=SC2086
	if ! make -j"$jobs" CUDA_HOME="$CUDA_HOME" ${MAKEFLAGS_EXTRA:-} \
		>/tmp/kvb-gpu-check-build.log 2>&1; then
		tail -n 40 /tmp/kvb-gpu-check-build.log
		fail "build (log: /tmp/kvb-gpu-check-build.log)"
	fi
fi
CHK=$B/bin/kvbgpucheck
BROKERD=$B/bin/kvbrokerd
if [ ! -x "$CHK" ] || [ ! -x "$BROKERD" ] || [ ! -x "$B/bin/kvbctl" ]; then
	fail "$CHK, $BROKERD or $B/bin/kvbctl missing"
fi
missing=$(ldd "$BROKERD" "$CHK" "$B/bin/kvbctl" 2>/dev/null | grep "not found" | sort -u)
if [ -n "$missing" ]; then
	echo "$missing" >&2
	fail "shared libraries missing (set LD_LIBRARY_PATH to copies of them)"
fi

if ! "$CHK" probe; then
	echo "gpu-check: no usable GPU on this machine (see above): nothing to check" >&2
	exit 2
fi

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvb-gpu-check.XXXXXX")
sock=$tmp/kvbroker.sock
pid=""
cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null
		wait "$pid" 2>/dev/null
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_broker() { # $1: path
	log=$tmp/kvbrokerd-$1.log
	"$BROKERD" --socket "$sock" --pool "$POOL" --gpu-path "$1" 2>"$log" &
	pid=$!
	i=0
	while ! grep -q " ready in " "$log" 2>/dev/null; do
		i=$((i + 1))
		if [ $i -gt 600 ] || ! kill -0 "$pid" 2>/dev/null; then
			cat "$log"
			fail "kvbrokerd did not start"
		fi
		sleep 0.1
	done
	if ! grep -q "GPU copies on" "$log"; then
		cat "$log"
		fail "the broker has GPU copies off"
	fi
	grep -E "cuda: pinned|GPU copies on" "$log" | sed 's/^/  broker: /'
}

stop_broker() {
	kill -TERM "$pid" 2>/dev/null
	wait "$pid" 2>/dev/null
	rc=$?
	pid=""
	[ "$rc" -eq 0 ] || { cat "$log"; fail "kvbrokerd exited with $rc"; }
	grep -E "cuda: device .* pages of" "$log" | sed 's/^/  broker: /'
}

# The broker's STATS into $tmp/stats.json; crc_gpu: PUTs it had the GPU checksum.
stats() { "$B/bin/kvbctl" --socket "$sock" status --json >"$tmp/stats.json" 2>/dev/null; }
crc_gpu() {
	n=$(grep -oE '"crc_gpu":[[:space:]]*[0-9]+' "$tmp/stats.json" | grep -oE '[0-9]+$')
	echo "${n:-0}"
}

status=0
summary=$tmp/summary
: >"$summary"
for path in $PATHS; do
	say "=== --gpu-path $path"
	start_broker "$path"
	say "correctness: $KIMI_PAGES Kimi-K2.5 pages, cuMemAlloc buffers -> broker -> cuMemCreate buffers"
	"$CHK" put --socket "$sock" --pages "$KIMI_PAGES" --alloc legacy || {
		cat "$log"
		fail "put ($path)"
	}
	"$CHK" get --socket "$sock" --pages "$KIMI_PAGES" --alloc vmm || {
		cat "$log"
		fail "get ($path): data differs or an op failed"
	}
	# [gpu-crc] Each page's header carries the checksum computed on the GPU (else the loop
	# computed it, and adoption would prove nothing of the kernel); adoption checks every one
	# against the slot's bytes and drops what does not match.
	stats
	[ "$(crc_gpu)" -ge "$KIMI_PAGES" ] ||
		fail "the GPU computed $(crc_gpu) of $KIMI_PAGES PUTs' checksums ($path): see $log"
	say "adoption: kill -9; a new broker adopts the pool, checking every page's checksum"
	kill -KILL "$pid"
	wait "$pid" 2>/dev/null
	pid=""
	start_broker "$path"
	grep -E "adopt: .* pages" "$log" | sed 's/^/  broker: /'
	grep -qE "adopt: $KIMI_PAGES pages .* 0 torn" "$log" ||
		fail "the adopting broker did not find every page intact ($path): checksums wrong?"
	"$CHK" get --socket "$sock" --pages "$KIMI_PAGES" --alloc legacy || {
		cat "$log"
		fail "get after adoption ($path): data differs or an op failed"
	}
	say "throughput: $BENCH_PAGES pages x $ROUNDS rounds each way"
	"$CHK" bench --socket "$sock" --pages "$BENCH_PAGES" --rounds "$ROUNDS" --label "$path" \
		>"$tmp/bench-$path" || { cat "$tmp/bench-$path" "$log"; fail "bench ($path)"; }
	grep RESULT "$tmp/bench-$path" >>"$summary"
	grep RESULT "$tmp/bench-$path" | sed 's/^/  /'
	# Which path the jobs really took (a kernel that failed to load falls back to copies).
	stats
	grep -oE '"(jobs_copy|jobs_kernel|crc_gpu|pin_seconds)":[[:space:]]*[0-9.e+-]+' \
		"$tmp/stats.json" | tr '\n\t' '  ' | sed 's/^/  broker stats: /'
	echo
	stop_broker
done

echo
echo "gpu-check summary (GB/s; baseline: cuMemcpyAsync of one contiguous block from pinned memory)"
printf '%-8s %10s %10s %6s %10s %10s %6s\n' path D2H base % H2D base %
v() { echo "$line" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
while read -r line; do
	printf '%-8s %10s %10s %6s %10s %10s %6s\n' "$(v label)" "$(v d2h)" "$(v base_d2h)" \
		"$(v d2h_pct)" "$(v h2d)" "$(v base_h2d)" "$(v h2d_pct)"
	for pct in $(v d2h_pct) $(v h2d_pct); do
		[ "$pct" -ge "$TARGET_PCT" ] || status=3
	done
done <"$summary"
echo
if [ "$status" -eq 0 ]; then
	say "PASS: data byte-exact on every path; every figure at least $TARGET_PCT% of its baseline"
else
	say "data byte-exact on every path, but some figure is below $TARGET_PCT% of its baseline"
fi
exit "$status"
