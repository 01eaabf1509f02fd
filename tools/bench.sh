#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench.sh B - `make bench`: kvbroker side by side with the limits of the machine and with what
# users would pick instead; writes a report, B/bench/report.md, and its plots, B/bench/plots/*.png.
# docs/benchmarks.md quotes the figures of such reports with their dates and machines; it is
# written by hand, so a run never overwrites it.
#
# In one go, at page sizes 64K, 1M and 4.5M and with 1, 2 and 4 client processes:
#   limits    memcpy (1 process up to all cores), fio io_uring + O_DIRECT on a file next to the
#             disk tier's (random reads and writes, page-sized blocks, one job per client, qd 1)
#   kvbroker  PUT, GET into a registered buffer, ACQUIRE + copy out + RELEASE; NOP busy-polled and
#             with the broker asleep; LOOKUP of 1 and of 1024 keys
#   peers     Redis (started here, TCP on 127.0.0.1 and a unix socket) and memcached (TCP): SET
#             and GET of the same pages through hiredis and libmemcached (kvbbench-peers, the
#             same driver and timing as kvbbench)
#   capacity  8 MLA ranks storing the same pages through kvbroker vs 8 private pools
#   workloads engine requests over shared prefixes (zipf), a GET/PUT/LOOKUP/ACQUIRE mix
#   disk tier when `kvbrokerd --help` mentions --disk: PUT then GET of a working set 4x the pool
#             at 1M and 4.5M, against fio with the same block size and queue depth, same directory
#   sglang    tools/bench_sglang.py in build/venv: kvbroker.sglang's batch_get_v1 and
#             batch_exists against memcpy and SGLang's HiCacheFile on tmpfs
#   vllm      tools/bench_vllm.py in build/venv: kvbroker.vllm's scheduler-side match of a
#             32K-token request and its worker-side store/load on CPU tensors against memcpy
#   wheel     the wheel's kvbrokerd (build/wheel, make wheel) against B's: GET and PUT through
#             tools/bench-ab.sh, same client, interleaved; wheel/make per repetition
#   chains    kvbchain: prefix hit rate of a Zipf workload of shared prefixes larger than the
#             pool, PUTs with parent keys (chains evicted tail first) vs plain LRU, same run
#   hooks     tools/bench-startup.sh B SIZE (start-up figures; SIZE 1G quick, else up to 16G as
#             memory allows, or KVB_BENCH_STARTUP_SIZE), tools/bench-datapath.sh B (the data
#             path's table: GET, get-user, ACQUIRE, PUT against memcpy with rotating and cache-hot
#             destinations, 2 and 4 processes, one CPU, TP=8 load) and, with the disk tier,
#             tools/bench-disk.sh B (its own QD-8 figures and the warm-restart scan), when
#             present: each prints markdown on stdout, which goes into the report as is; a
#             non-zero exit is reported as a failure
# Every measurement runs REPS times, interleaved (the repetition is the outer loop, so drift of
# the machine spreads over all rows); the report gives medians and ranges, ratios and a
# "met / MISSED" column for every target (tools/bench-report.py), computed, never hand-written.
# Every server started here is stopped on exit (trap EXIT), whatever happens.
#
# Knobs (environment): KVB_BENCH_QUICK=1 (make bench QUICK=1: 0.3 s per case, 1 repetition,
# 32 MiB working sets: a smoke run of every path in a few minutes, figures not to be quoted),
# KVB_BENCH_SECONDS (1), KVB_BENCH_REPS (3), KVB_BENCH_PAGES ("64K 1M 4.5M"), KVB_BENCH_PROCS
# ("1 2 4"), KVB_BENCH_POOL (2G), KVB_BENCH_WS (working set per page size, 128M),
# KVB_BENCH_DISK_DIR (B/bench/disk: must be a real file system, not tmpfs), KVB_BENCH_DISK_POOL
# (256M), KVB_BENCH_MODES (kvbroker data modes, "put get acquire"; get-user, put-user exist too),
# KVB_BENCH_OUT (B/bench/report.md), KVB_BENCH_PLOTS (B/bench/plots).
# Raw results: B/bench/results.jsonl. Exit 1 when any run failed (the report is written anyway
# and lists the failures); a MISSED target is a finding, not a failure.
set -eu

B=${1:-build/release}
QUICK=${KVB_BENCH_QUICK:-0}
[ "$QUICK" = 1 ] || QUICK=0
if [ "$QUICK" = 1 ]; then
	SECS=${KVB_BENCH_SECONDS:-0.3}
	REPS=${KVB_BENCH_REPS:-1}
	WS=${KVB_BENCH_WS:-32M}
	DPOOL=${KVB_BENCH_DISK_POOL:-64M}
	POOL=${KVB_BENCH_POOL:-1G}
else
	SECS=${KVB_BENCH_SECONDS:-1}
	REPS=${KVB_BENCH_REPS:-3}
	WS=${KVB_BENCH_WS:-128M}
	DPOOL=${KVB_BENCH_DISK_POOL:-256M}
	POOL=${KVB_BENCH_POOL:-2G}
fi
PAGES=${KVB_BENCH_PAGES:-"64K 1M 4.5M"}
PROCS=${KVB_BENCH_PROCS:-"1 2 4"}
OUT=${KVB_BENCH_OUT:-$B/bench/report.md}
PLOTS=${KVB_BENCH_PLOTS:-$B/bench/plots}
DISK_DIR=${KVB_BENCH_DISK_DIR:-$B/bench/disk}
KVB_MODES=${KVB_BENCH_MODES:-"put get acquire"}
NCPU=$(nproc)

for p in kvbrokerd kvbbench kvbctl; do
	if [ ! -x "$B/bin/$p" ]; then
		echo "bench: $B/bin/$p missing; run: make MODE=${B##*/}" >&2
		exit 1
	fi
done
command -v python3 >/dev/null || { echo "bench: python3 needed for the report" >&2; exit 1; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvbbench.XXXXXX")
res="$B/bench/results.jsonl"
fails="$B/bench/failures.txt"
meta="$B/bench/meta.txt"
extra="$B/bench/sections"
mkdir -p "$B/bench" "$DISK_DIR" "$extra"
: >"$res"
: >"$fails"
: >"$meta"
rm -f "$extra"/*.md
pids=""

# Stops every server this script started; SIGTERM, then SIGKILL after 5 s.
stop_servers() {
	for p in $pids; do
		kill -TERM "$p" 2>/dev/null || true
	done
	for p in $pids; do
		i=0
		while kill -0 "$p" 2>/dev/null && [ "$i" -lt 50 ]; do
			sleep 0.1
			i=$((i + 1))
		done
		kill -KILL "$p" 2>/dev/null || true
	done
	pids=""
}

cleanup() {
	stop_servers
	rm -rf "$tmp"
	rm -f "$DISK_DIR/fio.dat" "$DISK_DIR/kvb.cache"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# meta KEY VALUE: one line the report reads.
meta() {
	printf '%s\t%s\n' "$1" "$2" >>"$meta"
}

fail() {
	echo "$*" >>"$fails"
	echo "  FAILED: $*" >&2
}

free_port() {
	python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

# wait_for CMD...: retries CMD for up to 30 s (a loaded machine prefaults a pool slowly).
wait_for() {
	i=0
	until "$@" >/dev/null 2>&1; do
		[ "$i" -ge 300 ] && return 1
		i=$((i + 1))
		sleep 0.1
	done
}

port_open() {
	python3 -c 'import socket, sys; socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)' "$1"
}

# start_broker NAME ARGS...: a kvbrokerd on $tmp/NAME.sock; sets $sock.
start_broker() {
	name=$1
	shift
	sock="$tmp/$name.sock"
	cmd="$B/bin/kvbrokerd --socket $sock $* --log-level warn"
	echo "bench: $cmd"
	# shellcheck disable=SC2086
	$cmd 2>"$tmp/$name.log" &
	bpid=$!
	pids="$pids $bpid"
	if ! wait_for "$B/bin/kvbctl" --socket "$sock" status; then
		echo "bench: kvbrokerd did not come up; its log:" >&2
		cat "$tmp/$name.log" >&2
		return 1
	fi
	meta "cmd_$name" "$cmd"
}

stop_pid() {
	kill -TERM "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}

# ---- progress: one line per measurement with its number, the total and the time left ----
nrun=0
total_runs=0
t_start=$(date +%s)
progress() {
	nrun=$((nrun + 1))
	el=$(($(date +%s) - t_start))
	left="?"
	[ "$nrun" -gt 1 ] && [ "$total_runs" -gt 0 ] &&
		left=$(((el * total_runs / (nrun - 1) - el + 30) / 60))
	printf '[%d/%d, %ss, ~%s min left] %s\n' "$nrun" "$total_runs" "$el" "$left" "$*"
}

# record FIG REP JSON: appends one measurement, labelled.
record() {
	echo "$3" | sed "s/^{/{\"fig\":\"$1\",\"rep\":$2,/" >>"$res"
}

summary='import json, sys
r = json.load(sys.stdin)
print("%.3g ops/s  %.3g GB/s  p50 %.3g us" % (r["ops_per_s"], r["gb_per_s"], r["p50_us"]))'

# kvb FIG REP BIN ARGS...: one kvbbench(-peers) measurement.
kvb() {
	fig=$1 rep=$2 bin=$3
	shift 3
	progress "$fig $*"
	if out=$("$B/bin/$bin" --json --seconds "$SECS" "$@" 2>"$tmp/err"); then
		record "$fig" "$rep" "$out"
		echo "    $(echo "$out" | python3 -c "$summary")"
	else
		fail "$fig $*: $(tr '\n' ' ' <"$tmp/err")"
	fi
}

# fio_run FIG REP RW BS JOBS FILE [QD]: one fio run, converted to kvbbench's JSON fields.
fio_run() {
	fig=$1 rep=$2 rw=$3 bs=$4 jobs=$5 file=$6 qd=${7:-1}
	progress "$fig $rw bs $bs jobs $jobs qd $qd"
	if ! command -v fio >/dev/null; then
		fail "$fig: fio not installed (sh tools/deps.sh bench)"
		return 0
	fi
	bytes=$(python3 -c 'import sys
u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
s = sys.argv[1]
print(int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s))' "$bs")
	ms=$(python3 -c 'import sys; print(max(100, int(float(sys.argv[1]) * 1000)))' "$SECS")
	if fio --name=limit --filename="$file" --size="$FIO_SIZE" --ioengine=io_uring --direct=1 \
		--rw="$rw" --bs="$bytes" --iodepth="$qd" --numjobs="$jobs" --group_reporting \
		--time_based --runtime="${ms}ms" --percentile_list=50:90:99:99.9 \
		--output-format=json --output="$tmp/fio.json" >"$tmp/err" 2>&1; then
		out=$(python3 - "$tmp/fio.json" "$bytes" "$jobs" "$rw" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]
d = j["read"] if "read" in sys.argv[4] else j["write"]
p = d["clat_ns"]["percentile"]
def pct(k):
    for key, v in p.items():
        if abs(float(key) - k) < 1e-6:
            return v / 1e3
    return 0
print(json.dumps({"mode": "fio-" + sys.argv[4], "page_bytes": int(sys.argv[2]),
                  "procs": int(sys.argv[3]), "threads": 1, "ops_per_s": d["iops"],
                  "gb_per_s": d["bw_bytes"] / 1e9, "p50_us": pct(50), "p90_us": pct(90),
                  "p99_us": pct(99), "p999_us": pct(99.9), "seconds": j["job_runtime"] / 1e3}))
EOF
)
		record "$fig" "$rep" "$out"
		echo "    $(echo "$out" | python3 -c "$summary")"
	else
		fail "$fig fio $rw bs $bs jobs $jobs qd $qd: $(tail -n 3 "$tmp/err" | tr '\n' ' ')"
	fi
}

load_start=$(cut -d' ' -f1-3 /proc/loadavg)
case $load_start in
0.[0-4]*) ;;
*) echo "bench: warning: load average $load_start before the run; figures will be noisy" >&2 ;;
esac

fstype=$(stat -f -c %T "$DISK_DIR" 2>/dev/null || echo unknown)
case $fstype in
tmpfs | ramfs) echo "bench: warning: $DISK_DIR is on $fstype; fio and the disk tier need a real file system (KVB_BENCH_DISK_DIR)" >&2 ;;
esac
FIO_SIZE=$(python3 -c 'import sys
u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
s = sys.argv[1]
print(4 * (int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s)))' "$DPOOL")

# ---- servers ----
start_broker main --pool "$POOL"
msock=$sock
peers=1
if [ ! -x "$B/bin/kvbbench-peers" ]; then
	fail "peers: $B/bin/kvbbench-peers not built (make $B/bin/kvbbench-peers, needs hiredis and libmemcached)"
	peers=0
fi
rport=$(free_port)
mport=$(free_port)
redis=0
memc=0
if [ "$peers" = 1 ] && command -v redis-server >/dev/null; then
	rcmd="redis-server --port $rport --bind 127.0.0.1 --unixsocket $tmp/redis.sock --unixsocketperm 700 --save '' --appendonly no --dir $tmp"
	redis-server --port "$rport" --bind 127.0.0.1 --unixsocket "$tmp/redis.sock" \
		--unixsocketperm 700 --save '' --appendonly no --dir "$tmp" \
		--logfile "$tmp/redis.log" --daemonize no &
	pids="$pids $!"
	if wait_for port_open "$rport"; then
		redis=1
		meta cmd_redis "$rcmd"
		meta redis_version "$(redis-server --version | sed 's/ sha=.*//')"
	else
		fail "redis-server did not come up: $(tail -n 3 "$tmp/redis.log" | tr '\n' ' ')"
	fi
else
	[ "$peers" = 1 ] && fail "redis-server not installed (sh tools/deps.sh bench)"
fi
if [ "$peers" = 1 ] && command -v memcached >/dev/null; then
	user=""
	[ "$(id -u)" -eq 0 ] && user="-u root"
	# -I above the largest page; -m above every working set; the default 4 threads.
	mcmd="memcached -l 127.0.0.1 -p $mport -U 0 -m 2048 -I 8m -t 4 $user"
	# shellcheck disable=SC2086
	$mcmd >"$tmp/memcached.log" 2>&1 &
	pids="$pids $!"
	if wait_for port_open "$mport"; then
		memc=1
		meta cmd_memcached "$mcmd"
		meta memcached_version "$(memcached -V)"
	else
		fail "memcached did not come up: $(tail -n 3 "$tmp/memcached.log" | tr '\n' ' ')"
	fi
else
	[ "$peers" = 1 ] && fail "memcached not installed (sh tools/deps.sh bench)"
fi

# ---- the plan: count the runs for the progress line ----
all_procs=$PROCS
case " $PROCS " in *" $NCPU "*) ;; *) all_procs="$PROCS $NCPU" ;; esac
np_n=$(echo "$PROCS" | wc -w)
pg_n=$(echo "$PAGES" | wc -w)
mode_n=$(echo "$KVB_MODES" | wc -w)
per_rep=$(($(echo "$all_procs" | wc -w) * pg_n + np_n * pg_n * (mode_n + 6 + 2) + np_n * 5 + 5 + pg_n))
total_runs=$((per_rep * REPS))
disk=0
if "$B/bin/kvbrokerd" --help 2>&1 | grep -q -- '--disk'; then
	disk=1
	total_runs=$((total_runs + REPS * 2 * (4 * np_n + 2)))
fi

rep=1
while [ "$rep" -le "$REPS" ]; do
	echo "bench: repetition $rep of $REPS"
	for pg in $PAGES; do
		for np in $all_procs; do
			kvb memcpy "$rep" kvbbench --page "$pg" --procs "$np" --ws "$WS" memcpy
		done
	done
	for np in $PROCS; do
		for pg in $PAGES; do
			for m in $KVB_MODES; do
				kvb "kvb-$m" "$rep" kvbbench --socket "$msock" --page "$pg" --procs "$np" --ws "$WS" "$m"
			done
			for m in get set; do
				if [ "$redis" = 1 ]; then
					kvb "redis-tcp-$m" "$rep" kvbbench-peers --server "127.0.0.1:$rport" --page "$pg" --procs "$np" --ws "$WS" "redis-$m"
					kvb "redis-unix-$m" "$rep" kvbbench-peers --server "$tmp/redis.sock" --page "$pg" --procs "$np" --ws "$WS" "redis-$m"
				fi
				proto=ascii
				[ "$m" = set ] && proto=binary
				[ "$memc" = 1 ] &&
					kvb "memcached-$m" "$rep" kvbbench-peers --server "127.0.0.1:$mport" --proto "$proto" --page "$pg" --procs "$np" --ws "$WS" "memc-$m"
			done
			fio_run fio-read "$rep" randread "$pg" "$np" "$DISK_DIR/fio.dat"
			fio_run fio-write "$rep" randwrite "$pg" "$np" "$DISK_DIR/fio.dat"
		done
		if [ "$np" = 1 ]; then
			# How an engine loads a request's pages: 8 GETs per kvb_submit.
			for pg in $PAGES; do
				kvb kvb-get-qd8 "$rep" kvbbench --socket "$msock" --page "$pg" --ws "$WS" --qd 8 get
			done
		fi
		kvb nop-poll "$rep" kvbbench --socket "$msock" --procs "$np" nop
		# 1 ms between ops: longer than the broker's 200 us poll window, so every op wakes it.
		kvb nop-sleep "$rep" kvbbench --socket "$msock" --procs "$np" --gap-us 1000 nop
		kvb lookup-1 "$rep" kvbbench --socket "$msock" --procs "$np" --page 64K --pages 4096 --batch 1 --dist uniform lookup
		kvb lookup-1024 "$rep" kvbbench --socket "$msock" --procs "$np" --page 64K --pages 4096 --batch 1024 lookup
		kvb engine "$rep" kvbbench --socket "$msock" --procs "$np" --layout kimi --prefixes 8 \
			--prefix-pages 4 --branches 4 --branch-pages 2 --suffix-pages 2 engine
	done
	# The smallest round trip each peer has: a GET of a 32-byte value.
	[ "$memc" = 1 ] &&
		kvb memcached-probe "$rep" kvbbench-peers --server "127.0.0.1:$mport" --page 32 --pages 1024 memc-get
	[ "$redis" = 1 ] &&
		kvb redis-probe "$rep" kvbbench-peers --server "127.0.0.1:$rport" --page 32 --pages 1024 redis-get
	kvb mix "$rep" kvbbench --socket "$msock" --page 64K --ws "$WS" --dist zipf --mix get=80,put=10,lookup=5,acquire=5 mix
	kvb mla-kvbroker "$rep" kvbbench --socket "$msock" --procs 8 --pages 16 mla-tp
	kvb mla-private "$rep" kvbbench --procs 8 --pages 16 --private mla-tp
	rep=$((rep + 1))
done
# The Python package against kvbbench, same broker, its own interleaved repetitions.
if [ -x build/venv/bin/python ]; then
	echo "bench: tools/bench_python.py"
	build/venv/bin/python tools/bench_python.py --socket "$msock" --build "$B" --seconds "$SECS" \
		--reps "$REPS" >"$extra/python.md" 2>"$tmp/hook.err" ||
		fail "tools/bench_python.py: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
else
	fail "python: build/venv missing (make python)"
fi
"$B/bin/kvbctl" --socket "$msock" status >"$B/bench/broker-status.txt" 2>&1 || true
# Nothing of ours runs while the disk tier and the start-up are measured.
stop_servers

# ---- disk tier: a second broker with a small pool and the disk behind it ----
if [ "$disk" = 1 ]; then
	dsize=$(python3 -c 'import sys
u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
s = sys.argv[1]
v = int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s)
print("%dM" % (8 * v >> 20))' "$DPOOL")
	dws=$(python3 -c 'import sys
u = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
s = sys.argv[1]
v = int(float(s[:-1]) * u[s[-1]]) if s[-1] in u else int(s)
print("%dM" % (4 * v >> 20))' "$DPOOL")
	meta disk_ws "$dws"
	if start_broker disk --pool "$DPOOL" --disk "$DISK_DIR/kvb.cache" --disk-size "$dsize"; then
		dsock=$sock
		rep=1
		while [ "$rep" -le "$REPS" ]; do
			for pg in 1M 4.5M; do
				for np in $PROCS; do
					kvb disk-put "$rep" kvbbench --socket "$dsock" --page "$pg" --procs "$np" --ws "$dws" put
					kvb disk-get "$rep" kvbbench --socket "$dsock" --page "$pg" --procs "$np" --ws "$dws" --warmup 4 get
					fio_run disk-fio-write "$rep" randwrite "$pg" "$np" "$DISK_DIR/fio.dat"
					fio_run disk-fio-read "$rep" randread "$pg" "$np" "$DISK_DIR/fio.dat"
				done
				# Queue depth 4: 4 GETs per kvb_submit against fio at iodepth 4.
				kvb disk-get-qd4 "$rep" kvbbench --socket "$dsock" --page "$pg" --ws "$dws" --warmup 4 --qd 4 get
				fio_run disk-fio-read-qd4 "$rep" randread "$pg" 1 "$DISK_DIR/fio.dat" 4
			done
			rep=$((rep + 1))
		done
		"$B/bin/kvbctl" --socket "$dsock" status >"$B/bench/disk-broker-status.txt" 2>&1 || true
	else
		fail "disk tier: kvbrokerd --disk did not start: $(tail -n 3 "$tmp/disk.log" | tr '\n' ' ')"
	fi
	stop_servers
	# The disk tier's own script: its figures at its queue depth and the warm-restart scan.
	if [ -f tools/bench-disk.sh ]; then
		echo "bench: tools/bench-disk.sh"
		quickenv=""
		[ "$QUICK" = 1 ] && quickenv="KVB_BENCH_SECONDS=1 KVB_BENCH_POOL=128M KVB_BENCH_DISK_SIZE=1G"
		hrc=0
		# Its knobs share names with ours: it gets its own defaults, not our values.
		# shellcheck disable=SC2086
		env -u KVB_BENCH_SECONDS -u KVB_BENCH_POOL -u KVB_BENCH_PAGES -u KVB_BENCH_QD \
			-u KVB_BENCH_DISK_SIZE KVB_BENCH_DISK_DIR="$DISK_DIR" $quickenv \
			sh tools/bench-disk.sh "$B" >"$extra/disk-own.md" 2>"$tmp/hook.err" || hrc=$?
		[ "$hrc" -eq 0 ] ||
			fail "tools/bench-disk.sh exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
	fi
fi
meta disk_tier "$disk"

# ---- start-up figures of the NUMA work, when its script exists ----
if [ -f tools/bench-startup.sh ]; then
	# Its pool size: KVB_BENCH_STARTUP_SIZE, else 1G quick, else 16G or what memory allows.
	ssize=${KVB_BENCH_STARTUP_SIZE:-$(awk -v q="$QUICK" '/^MemAvailable/ {
		g = int($2 / 1048576) - 4; if (g > 16) g = 16; if (g < 1 || q == 1) g = 1
		printf "%dG", g }' /proc/meminfo)}
	echo "bench: tools/bench-startup.sh $B $ssize"
	hrc=0
	KVB_BENCH_QUICK=$QUICK sh tools/bench-startup.sh "$B" "$ssize" >"$extra/startup.md" \
		2>"$tmp/hook.err" || hrc=$?
	[ "$hrc" -eq 0 ] ||
		fail "tools/bench-startup.sh exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
fi

# ---- what the histograms cost: GET and PUT with and without them, side by side ----
echo "bench: tools/bench-hist.sh $B"
hrc=0
KVB_BENCH_QUICK=$QUICK sh tools/bench-hist.sh "$B" >"$extra/hist.md" 2>"$tmp/hook.err" || hrc=$?
[ "$hrc" -eq 0 ] ||
	fail "tools/bench-hist.sh exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"

# ---- the data-path table (ratios to memcpy, cache-hot, TP=8), when its script exists ----
if [ -f tools/bench-datapath.sh ]; then
	echo "bench: tools/bench-datapath.sh $B"
	hrc=0
	KVB_BENCH_QUICK=$QUICK sh tools/bench-datapath.sh "$B" >"$extra/datapath.md" \
		2>"$tmp/hook.err" || hrc=$?
	[ "$hrc" -eq 0 ] ||
		fail "tools/bench-datapath.sh exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
fi

# ---- kvbroker.sglang as SGLang's HiCache L3 tier, when the Python venv has SGLang ----
# (build/venv: `make python` with python/requirements/sglang*.txt.) Its own broker: 2 GiB
# holds the 128 Kimi-K2.5 pages it reads plus those it writes.
PYV=${KVB_BENCH_PYTHON:-build/venv/bin/python}
if [ -x "$PYV" ] && "$PYV" -c 'import kvbroker, sglang' 2>/dev/null; then
	start_broker sglang --pool 2G
	echo "bench: tools/bench_sglang.py"
	hrc=0
	reps=5
	[ "$QUICK" = 1 ] && reps=1
	"$PYV" -W ignore tools/bench_sglang.py --socket "$sock" --reps "$reps" \
		>"$extra/sglang.md" 2>"$tmp/hook.err" || hrc=$?
	[ "$hrc" -eq 0 ] ||
		fail "tools/bench_sglang.py exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
	stop_servers
else
	fail "sglang: $PYV cannot import kvbroker and sglang (make python)"
fi

# ---- kvbroker.vllm: scheduler-side match and worker save/load, its own broker ----
if [ -x "$PYV" ] && "$PYV" -c 'import kvbroker.vllm' 2>/dev/null; then
	start_broker vllm --pool 2G
	echo "bench: tools/bench_vllm.py"
	hrc=0
	vq=""
	reps=5
	[ "$QUICK" = 1 ] && vq="--quick" && reps=2
	"$PYV" -W ignore tools/bench_vllm.py --socket "$sock" --reps "$reps" $vq \
		>"$extra/vllm.md" 2>"$tmp/hook.err" || hrc=$?
	[ "$hrc" -eq 0 ] ||
		fail "tools/bench_vllm.py exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
	stop_servers
else
	fail "vllm: $PYV cannot import kvbroker.vllm (make python)"
fi

# ---- the wheel's kvbrokerd against this build's: GET and PUT, same client, same run ----
# (make bench builds the wheel: make wheel.) The wheel installed into a venv of its own and
# started by its console script, as users start it; kvbbench is this build's on both sides, so
# only the broker differs. tools/bench-ab.sh interleaves the two; "b/a" is wheel over make.
WHEEL=$(ls build/wheel/kvbroker-*-manylinux_*.whl 2>/dev/null | head -n 1 || true)
if [ -n "$WHEEL" ] && [ -x "$PYV" ]; then
	echo "bench: the wheel's kvbrokerd vs $B's (tools/bench-ab.sh)"
	wv="$tmp/wheel-venv"
	wb="$tmp/wheel-build"
	hrc=0
	wpages="64K 1M"
	{
		wpy=$("$PYV" -c 'import sys; print(getattr(sys, "_base_executable", sys.executable))') &&
			"$wpy" -m venv --without-pip "$wv" &&
			"$PYV" -m pip --python "$wv/bin/python" install -q --no-index --no-deps "$WHEEL" &&
			mkdir -p "$wb/bin" && ln -s "$wv/bin/kvbrokerd" "$wb/bin/kvbrokerd" &&
			ln -s "$(cd "$B/bin" && pwd)/kvbbench" "$wb/bin/kvbbench"
	} >"$tmp/hook.err" 2>&1 || hrc=$?
	if [ "$hrc" -eq 0 ]; then
		KVB_AB_BROKER_ARGS="--hugepages collapse" \
			sh tools/bench-ab.sh "$B" "$wb" "$REPS" "$SECS" "$wpages" "get put" --ws "$WS" \
			>"$tmp/wheel-ab.txt" 2>"$tmp/hook.err" || hrc=$?
	fi
	if [ "$hrc" -eq 0 ]; then
		{
			echo "## The wheel's kvbrokerd against the make build's"
			echo
			echo "\`${WHEEL##*/}\` (\`make wheel\`: this build's programs, the C libraries"
			echo "they link vendored by auditwheel) installed into a venv of its own, the broker"
			echo "started by its console script; a: \`$B/bin/kvbrokerd\`, b: the wheel's, each"
			echo "\`--pool 1G --hugepages collapse\` (2 MiB pages: 4 KiB pools differ in speed from"
			echo "start to start), the same \`$B/bin/kvbbench\` against both, interleaved, $REPS"
			echo "repetitions of $SECS s. Rows: GB/s over memcpy's (range), p50; \`b/a\`: the"
			echo "wheel's GB/s over the build's, per repetition. Target: b/a >= 0.97 for GET"
			echo "and PUT. Command:"
			echo "\`KVB_AB_BROKER_ARGS='--hugepages collapse' sh tools/bench-ab.sh $B WHEELDIR $REPS $SECS \"$wpages\" \"get put\" --ws $WS\`"
			echo "(WHEELDIR/bin: the wheel's kvbrokerd, $B's kvbbench)."
			echo
			echo '```'
			cat "$tmp/wheel-ab.txt"
			echo '```'
			echo
			awk '$2 == "memcpy" { page = $1 }
				$1 == "b/a" { v = $3 + 0; printf "- %s %s, wheel/make: %.3f, %s\n", page, \
					toupper($2), v, (v >= 0.97 ? "met" : "MISSED") }' "$tmp/wheel-ab.txt"
		} >"$extra/wheel.md"
	else
		fail "the wheel's kvbrokerd A/B exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
	fi
else
	fail "wheel: no build/wheel/kvbroker-*-manylinux_*.whl or no $PYV (make wheel)"
fi

# ---- eviction that keeps prefixes whole: prefix hit rate, parent keys vs plain LRU ----
# tools/kvbchain.c runs the same Zipf workload twice on one 64 MiB broker (4096 pages of 16 KiB,
# a working set of 24,512 pages), same seed: PUTs naming their parents, then plain PUTs.
if [ -x "$B/bin/kvbchain" ]; then
	start_broker chain --pool 64M
	creq=12000
	[ "$QUICK" = 1 ] && creq=6000
	echo "bench: kvbchain --requests $creq"
	hrc=0
	{
		echo "## Prefix hit rate: chains evicted tail first vs plain LRU (\`tools/kvbchain.c\`)"
		echo
		echo "One broker, \`--pool 64M\` (4,096 pages of 16 KiB); 3,000 prompts (Zipf 0.9) of 16"
		echo "system prompts of 32 pages plus 8 pages of their own (24,512 distinct pages, 6.0x the"
		echo "pool); 8 engines, each holding its last 64 prompts itself and asking the broker for"
		echo "the rest of a chain (LOOKUP, GET of the leading hits, PUT of the rest), one engine"
		echo "restarted cold every 1,500 requests; $creq requests, the first fifth warm-up. The"
		echo "same run and seed with parent keys on the PUTs, then without. Hit rate: leading"
		echo "pages served over pages asked. Stranded: pages stored after a missing page of their"
		echo "chain (useless to a prefix lookup), at checks every 16 requests and over all"
		echo "prompts at the end. Command: \`kvbchain --socket S --requests $creq --md\`."
		echo
		"$B/bin/kvbchain" --socket "$sock" --requests "$creq" --md --assert
	} >"$extra/chain.md" 2>"$tmp/hook.err" || hrc=$?
	[ "$hrc" -eq 0 ] ||
		fail "kvbchain exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
	stop_servers
fi

# ---- the remote tier (--remote): fetch vs hiredis GET, local hits with the tier on/off ----
if [ -f tools/bench-remote.sh ]; then
	echo "bench: tools/bench-remote.sh"
	hrc=0
	KVB_BENCH_QUICK=$QUICK sh tools/bench-remote.sh "$B" >"$extra/remote.md" \
		2>"$tmp/hook.err" || hrc=$?
	[ "$hrc" -eq 0 ] ||
		fail "tools/bench-remote.sh exited $hrc: $(tail -n 3 "$tmp/hook.err" | tr '\n' ' ')"
fi

elapsed=$(($(date +%s) - t_start))
load_end=$(cut -d' ' -f1-3 /proc/loadavg)
cpu=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
mem=$(awk '/^MemTotal/ { printf "%.1f GiB", $2 / 1048576 }' /proc/meminfo)
llc=$(lscpu 2>/dev/null | sed -n 's/^L3 cache:[[:space:]]*//p' | head -n 1)
dev=$(df -P "$DISK_DIR" | awk 'NR == 2 { print $1 }')
meta machine "$NCPU CPUs, ${cpu:-unknown CPU}, ${mem} RAM, L3 ${llc:-unknown}, Linux $(uname -r)"
meta disk "$DISK_DIR on $dev ($fstype)"
meta load "load average $load_start before the run, $load_end after it"
meta date "$(date -u '+%Y-%m-%d %H:%M UTC')"
meta elapsed "$elapsed"
meta reps "$REPS"
meta ncpu "$NCPU"
meta secs "$SECS"
meta quick "$QUICK"
meta ws "$WS"
meta pool "$POOL"
meta dpool "$DPOOL"
cmdline="sh tools/bench.sh $B"
[ "$QUICK" = 1 ] && cmdline="KVB_BENCH_QUICK=1 $cmdline"
for v in KVB_BENCH_SECONDS KVB_BENCH_REPS KVB_BENCH_PAGES KVB_BENCH_PROCS KVB_BENCH_POOL \
	KVB_BENCH_WS KVB_BENCH_DISK_DIR KVB_BENCH_DISK_POOL KVB_BENCH_MODES; do
	eval "val=\${$v:-}"
	# shellcheck disable=SC2154
	[ -n "$val" ] && cmdline="$v='$val' $cmdline"
done
meta command "$cmdline"
meta make "make bench$([ "$QUICK" = 1 ] && echo " QUICK=1")"

cleanup
trap - EXIT
mkdir -p "$PLOTS"
python3 tools/bench-report.py "$res" "$fails" "$meta" "$extra" "$OUT" "$PLOTS"

if [ -s "$fails" ]; then
	echo "bench: some runs failed, see $OUT" >&2
	exit 1
fi
