#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-disk.sh B - the NVMe tier against fio on the same file, in the same run, and the
# warm-restart scan. Prints a markdown table (and keeps the raw numbers in B/bench/disk.txt).
#
# For each page size (1M and 4.5M):
#   fio write     io_uring, O_DIRECT, bs = page, iodepth = QD, sequential (demotion writes the
#                 log sequentially), on the cache file itself, before and after the broker
#   fio randread  same engine, bs, iodepth, random offsets, before and after the broker (the
#                 reference is the mean of the two: the shared virtual disks throttle with
#                 burst credits, so whoever runs first after a pause would win)
#   demotion      kvbdisk fill: PUTs of a working set of 4 x pool into a broker with
#                 --disk-qd QD; past 1.25 x pool every PUT waits for a demotion, so the PUT
#                 rate is the demotion rate (it includes the client's PUT copy); then SIGTERM
#                 writes the dirty pool with no client in the way: "flush" (from the log)
#   warm restart  the broker is stopped (it writes what is only in RAM) and restarted on the
#                 file: the scan's seconds and GB/s (stats disk.scan_seconds / scan_bytes), next
#                 to fio reading the file sequentially with bs 4M, iodepth 16 (what the scan
#                 issues)
#   promotion     kvbdisk prefetch: QD PREFETCHes in flight over the pages in random order,
#                 into the empty RAM of the restarted broker: disk.read_bytes per second
#
# Knobs (environment): KVB_BENCH_DISK_DIR (B/bench: must be a real file system, not tmpfs),
# KVB_BENCH_QD (8), KVB_BENCH_DISK_SIZE (4G), KVB_BENCH_POOL (512M), KVB_BENCH_SECONDS (5),
# KVB_BENCH_PAGES ("1M 4.5M"), KVB_BENCH_REPS (3; the report gives medians and ranges). Needs
# fio and python3. About 5 minutes on the 2-core machines.
set -eu

B=${1:-build/release}
DIR=${KVB_BENCH_DISK_DIR:-$B/bench}
QD=${KVB_BENCH_QD:-8}
DISK=${KVB_BENCH_DISK_SIZE:-4G}
POOL=${KVB_BENCH_POOL:-512M}
SECS=${KVB_BENCH_SECONDS:-5}
PAGES=${KVB_BENCH_PAGES:-"1M 4.5M"}
REPS=${KVB_BENCH_REPS:-3}

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
# Repetitions are the outer loop, so slow drift of a shared machine spreads over every figure.
r=1
while [ "$r" -le "$REPS" ]; do
	for pg in $PAGES; do
		pb=$(bytes "$pg")
		bs=$((pb / 1024))k
		ws=$((4 * pool_bytes / pb))
		# fio brackets the broker (before and after, averaged): the virtual disks of these
		# machines throttle with burst credits, so whoever runs first after a pause wins.
		rm -f "$F"
		fw1=$(fio_run write "$bs" "$QD" --io_size=2G)
		fr1=$(fio_run randread "$bs" "$QD" --runtime="$SECS" --time_based)
		rm -f "$F"
		start
		"$B/bin/kvbdisk" --socket "$sock" --page "$pg" --pages "$ws" fill >"$tmp/fill.json"
		dm=$(json "$tmp/fill.json" "round(d['mb_per_s'])")
		: >"$log"
		stop # writes the dirty pool: demotion with no client in the way
		df=$(python3 -c "import re, sys
m = re.search(r'wrote (\d+) pages at shutdown in ([0-9.]+) s', open(sys.argv[1]).read())
print(round(int(m.group(1)) * $pb / float(m.group(2)) / 1e6) if m else 0)" "$log")
		start # warm: every page on disk, RAM empty
		stats "$tmp/s.json"
		ss=$(json "$tmp/s.json" "d['disk']['scan_seconds']")
		sb=$(json "$tmp/s.json" "d['disk']['scan_bytes']")
		sp=$(json "$tmp/s.json" "d['disk']['pages']")
		"$B/bin/kvbdisk" --socket "$sock" --page "$pg" --pages "$ws" --qd "$QD" \
			--seconds "$SECS" prefetch >"$tmp/pre.json"
		pr=$(json "$tmp/pre.json" "round(d['mb_per_s'])")
		stop
		fr2=$(fio_run randread "$bs" "$QD" --runtime="$SECS" --time_based)
		fs=$(fio_run read 4m 16)
		rm -f "$F"
		fw2=$(fio_run write "$bs" "$QD" --io_size=2G)
		fw=$(((fw1 + fw2) / 2))
		fr=$(((fr1 + fr2) / 2))
		echo "rep=$r page=$pg fio_write=$fw demotion=$dm flush=$df fio_randread=$fr promotion=$pr" \
			"fio_write_before=$fw1 fio_write_after=$fw2 fio_randread_before=$fr1 fio_randread_after=$fr2" \
			"scan_s=$ss scan_bytes=$sb pages=$sp fio_read_4m=$fs" | tee -a "$raw"
	done
	r=$((r + 1))
done

echo
echo "NVMe tier vs fio (io_uring, O_DIRECT, same file, same run), median of $REPS interleaved"
echo "runs (range in brackets); MB/s = 1e6 bytes/s; file system $(stat -f -c %T "$DIR"),"
echo "$(nproc) CPUs, load average $(cut -d' ' -f1-3 /proc/loadavg), pool $POOL, working set 4 x pool, cache $DISK"
echo
python3 - "$raw" "$QD" "$DISK" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    kv = dict(f.split("=", 1) for f in line.split())
    rows.setdefault(kv["page"], []).append(kv)
qd, disk = sys.argv[2], sys.argv[3]
def med(rs, k, scale=1.0):
    v = [float(r[k]) * scale for r in rs]
    return statistics.median(v), min(v), max(v)
def fmt(t, p=0):
    return "%.*f [%.*f-%.*f]" % (p, t[0], p, t[1], p, t[2])
print("| page | QD | fio write MB/s | demotion (PUT-bound) MB/s | ratio | demotion (flush) MB/s | ratio | fio randread MB/s | promotion MB/s | ratio |")
print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for pg, rs in rows.items():
    fw, dm, df, fr, pr = (med(rs, k) for k in ("fio_write", "demotion", "flush", "fio_randread", "promotion"))
    print("| %s | %s | %s | %s | %.0f%% | %s | %.0f%% | %s | %s | %.0f%% |" % (pg, qd, fmt(fw), fmt(dm),
          100 * dm[0] / fw[0], fmt(df), 100 * df[0] / fw[0], fmt(fr), fmt(pr), 100 * pr[0] / fr[0]))
print()
print("| warm-restart scan | pages | read GiB | seconds | GB/s | fio seq read 4M QD16 GB/s |")
print("| --- | ---: | ---: | ---: | ---: | ---: |")
for pg, rs in rows.items():
    gbs = [float(r["scan_bytes"]) / float(r["scan_s"]) / 1e9 for r in rs]
    print("| %s file, %s pages | %s | %.2f | %s | %s | %s |" % (disk, pg, rs[0]["pages"],
          float(rs[0]["scan_bytes"]) / 2**30, fmt(med(rs, "scan_s"), 2),
          fmt((statistics.median(gbs), min(gbs), max(gbs)), 2), fmt(med(rs, "fio_read_4m", 1e-3), 2)))
PY
