#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-disk.sh B - the NVMe tier against fio on the same file, in the same run, and the
# warm-restart scan. Prints a markdown table (and keeps the raw numbers in B/bench/disk.txt).
#
# For each page size (1M and 4.5M):
#   fio write     io_uring, O_DIRECT, bs = page, iodepth = QD, sequential (demotion writes the
#                 log sequentially), on the cache file itself before the broker opens it
#   demotion      kvbbench put of new keys into a pool full of pages (working set 4 x pool):
#                 every PUT waits for a demotion, so PUT GB/s is the demotion rate
#   fio randread  same engine, bs, iodepth, random offsets
#   promotion     kvbbench get with QD client processes (each GET is synchronous) of a working
#                 set 4 x pool: disk.read_bytes over the timed seconds
# Then the broker is stopped (it writes what is only in RAM) and restarted on the cache file:
# the scan's seconds and GB/s (stats disk.scan_seconds / scan_bytes), next to fio reading the
# file sequentially with bs 4M, iodepth 16 (what the scan issues).
#
# Knobs (environment): KVB_BENCH_DISK_DIR (B/bench: must be a real file system, not tmpfs),
# KVB_BENCH_QD (8), KVB_BENCH_DISK_SIZE (4G), KVB_BENCH_POOL (512M), KVB_BENCH_SECONDS (5),
# KVB_BENCH_PAGES ("1M 4.5M"). Needs fio and python3. About 2 minutes on the 2-core machines.
set -eu

B=${1:-build/release}
DIR=${KVB_BENCH_DISK_DIR:-$B/bench}
QD=${KVB_BENCH_QD:-8}
DISK=${KVB_BENCH_DISK_SIZE:-4G}
POOL=${KVB_BENCH_POOL:-512M}
SECS=${KVB_BENCH_SECONDS:-5}
PAGES=${KVB_BENCH_PAGES:-"1M 4.5M"}

for t in fio python3; do
	command -v $t >/dev/null || { echo "bench-disk: $t is needed" >&2; exit 1; }
done
for p in kvbrokerd kvbbench kvbctl; do
	[ -x "$B/bin/$p" ] || { echo "bench-disk: $B/bin/$p missing: make first" >&2; exit 1; }
done
mkdir -p "$DIR"
F=$(cd "$DIR" && pwd)/kvb-bench.cache
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvbdisk.XXXXXX")
sock=$tmp/sock
log=$tmp/kvbrokerd.log
raw=$B/bench/disk.txt
mkdir -p "$B/bench"
: >"$raw"
pid=""

cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	rm -rf "$tmp"
	rm -f "$F"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

bytes() { # 1M, 4.5M, 4G -> bytes
	python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}
print(int(float(s[:-1])*m[s[-1]]) if s[-1] in m else int(s))" "$1"
}
json() { # json FILE EXPR: evaluate EXPR on the parsed document d
	python3 -c "import json,sys; d=json.load(open(sys.argv[1])); print($2)" "$1"
}

start() {
	"$B/bin/kvbrokerd" --socket "$sock" --pool "$POOL" --disk "$F" --disk-size "$DISK" \
		--disk-qd "$QD" 2>>"$log" &
	pid=$!
	i=0
	until "$B/bin/kvbctl" --socket "$sock" status >/dev/null 2>&1; do
		if ! kill -0 "$pid" 2>/dev/null || [ "$i" -ge 600 ]; then
			echo "bench-disk: kvbrokerd did not come up:" >&2
			cat "$log" >&2
			exit 1
		fi
		i=$((i + 1))
		sleep 0.1
	done
}
stop() {
	kill -TERM "$pid"
	wait "$pid" || true
	pid=""
}
stats() { "$B/bin/kvbctl" --socket "$sock" status --json >"$1"; }

fio_run() { # fio_run RW BS DEPTH [extra] -> MB/s (1e6 bytes/s)
	rw=$1 bs=$2 depth=$3
	shift 3
	fio --name=kvb --filename="$F" --ioengine=io_uring --direct=1 --rw="$rw" --bs="$bs" \
		--iodepth="$depth" --size="$DISK" --output-format=json "$@" >"$tmp/fio.json" 2>/dev/null
	key=read
	case $rw in *write*) key=write ;; esac
	json "$tmp/fio.json" "round(d['jobs'][0]['$key']['bw_bytes'] / 1e6)"
}

pool_bytes=$(bytes "$POOL")
rows=""
for pg in $PAGES; do
	pb=$(bytes "$pg")
	bs=$((pb / 1024))k
	ws=$((4 * pool_bytes / pb))
	rm -f "$F"
	fw=$(fio_run write "$bs" "$QD" --io_size=2G)
	fr=$(fio_run randread "$bs" "$QD" --runtime="$SECS" --time_based)
	rm -f "$F"
	start
	"$B/bin/kvbbench" --socket "$sock" --page "$pg" --pages "$ws" --seconds "$SECS" --json \
		put >"$tmp/put.json"
	dm=$(json "$tmp/put.json" "round(d['gb_per_s'] * 1000)")
	stats "$tmp/s0.json"
	"$B/bin/kvbbench" --socket "$sock" --page "$pg" --pages "$ws" --procs "$QD" --warmup 0 \
		--seconds "$SECS" --json get >"$tmp/get.json"
	stats "$tmp/s1.json"
	secs=$(json "$tmp/get.json" "d['seconds']")
	rb0=$(json "$tmp/s0.json" "d['disk']['read_bytes']")
	rb1=$(json "$tmp/s1.json" "d['disk']['read_bytes']")
	pr=$(python3 -c "print(round(($rb1 - $rb0) / $secs / 1e6))")
	stop
	echo "$pg fio_write=$fw demotion=$dm fio_randread=$fr promotion=$pr" | tee -a "$raw"
	rows="$rows| $pg | $QD | $fw | $dm | $(python3 -c "print('%.0f%%' % (100 * $dm / $fw))") | $fr | $pr | $(python3 -c "print('%.0f%%' % (100 * $pr / $fr))") |
"
done

# Warm restart: the last cache file, written through, scanned by a new broker.
start
stats "$tmp/s2.json"
stop
ss=$(json "$tmp/s2.json" "d['disk']['scan_seconds']")
sb=$(json "$tmp/s2.json" "d['disk']['scan_bytes']")
sp=$(json "$tmp/s2.json" "d['disk']['pages']")
fs=$(fio_run read 4m 16)
echo "scan seconds=$ss bytes=$sb pages=$sp fio_read_4m_qd16=$fs" | tee -a "$raw"

echo
echo "NVMe tier vs fio (io_uring, O_DIRECT, same file, same run); MB/s = 1e6 bytes/s; file system $(stat -f -c %T "$DIR"), $(nproc) CPUs"
echo
echo "| page | QD | fio write MB/s | demotion MB/s | ratio | fio randread MB/s | promotion MB/s | ratio |"
echo "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"
printf '%s' "$rows"
echo
python3 -c "
ss, sb, fs = float('$ss'), float('$sb'), float('$fs')
print('| warm-restart scan | file | pages | seconds | GB/s | fio seq read 4M QD16 GB/s |')
print('| --- | ---: | ---: | ---: | ---: | ---: |')
print('| %s cache file | %.2f GiB | $sp | %.2f | %.2f | %.2f |' % ('$DISK', sb / 2**30, ss, sb / ss / 1e9, fs / 1e3))
"
