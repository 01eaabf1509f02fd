#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-remote.sh B - the remote tier (--remote), for `make bench` (tools/bench.sh runs it and
# puts its markdown, printed on stdout, into docs/benchmarks.md). Progress goes to stderr.
#
#   fetch     node A PUTs N Kimi-K2.5 pages (4.29 MiB), published to Redis; node B GETs each
#             once: every GET is a remote fetch (GET over TCP, checked, committed). Against it,
#             in the same run and on the same server, kvbbench-peers redis-get: hiredis GETs of
#             values of the same size into the client's memory. Target: >= 80% of it. Repeated
#             in KVB_REMOTE_ROUNDS (5) rounds on fresh keys, each a ratio; the median decides.
#   publish   PUT rates with the tier off, publishing at PUT and at first reuse, and the cost of
#             that first reuse (GETs that publish) against a second one.
#   local     GET latency of pages B holds in RAM: with the remote tier on, with the Redis
#             server stopped (SIGSTOP: a partition) and killed, and on a broker without it.
#             Target: unchanged.
#
# One Redis server (not a cluster: both sides then talk to the same single process, the only
# fair pairing for a client that is not cluster-aware); the tier's cluster routing is tested by
# t_remote. Knobs: KVB_BENCH_QUICK=1 (fewer pages, shorter runs), KVB_REMOTE_PAGES (48),
# KVB_REMOTE_ROUNDS (5), KVB_REMOTE_PUBLISH_ROUNDS (3; 0 skips the publish moments),
# KVB_REMOTE_BROKERD (another kvbrokerd for every broker), KVB_REMOTE_BASE (a baseline
# kvbrokerd, e.g. an older build: a broker B0 of it fetches the same pages in every round, the
# order of B and B0 alternating by round, and its ratio is reported beside B's).
set -eu

B=${1:-build/release}
QUICK=${KVB_BENCH_QUICK:-0}
N=${KVB_REMOTE_PAGES:-48}
ROUNDS=${KVB_REMOTE_ROUNDS:-5}
PROUNDS=${KVB_REMOTE_PUBLISH_ROUNDS:-3}
BASE=${KVB_REMOTE_BASE:-}
SECS=2
[ "$QUICK" = 1 ] && N=16 && SECS=0.5 && ROUNDS=2 && PROUNDS=1
BENCH=$B/bin/kvbbench
PEERS=$B/bin/kvbbench-peers
D=$(mktemp -d "${TMPDIR:-/tmp}/kvb-bench-remote-XXXXXX")
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=""
cleanup() {
	for p in $pids; do
		kill -CONT "$p" 2>/dev/null || true
		kill "$p" 2>/dev/null || true
	done
	wait 2>/dev/null || true
	rm -rf "$D"
}
trap cleanup EXIT

command -v redis-server >/dev/null || { echo "redis-server missing (tools/deps.sh bench)" >&2; exit 1; }
redis-server --port "$PORT" --bind 127.0.0.1 --save "" --appendonly no --maxmemory 2gb \
	--maxmemory-policy allkeys-lru --dir "$D" --logfile "$D/redis.log" &
rpid=$!
pids="$pids $rpid"
for _ in $(seq 100); do redis-cli -p "$PORT" ping >/dev/null 2>&1 && break; sleep 0.05; done

BD=${KVB_REMOTE_BROKERD:-$B/bin/kvbrokerd}
broker() { # name args...: starts kvbrokerd ($BD) on $D/$1.sock
	n=$1
	shift
	"$BD" --socket "$D/$n.sock" --pool 512M "$@" 2>"$D/$n.log" &
	pids="$pids $!"
	eval "pid_$n=$!"
	for _ in $(seq 200); do [ -S "$D/$n.sock" ] && break; sleep 0.05; done
}
cpu_ns() { # pid: CPU time of all its threads so far (ns; schedstat, not the machine's load)
	cat /proc/"$1"/task/*/schedstat | awk '{ s += $1 } END { printf "%.0f\n", s }'
}
field() { # json-file key: a number from kvbbench --json
	python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))[sys.argv[2]])' "$1" "$2"
}
row() { # label file
	printf '| %s | %.2f | %.0f | %.0f | %.0f |\n' "$1" "$(field "$2" gb_per_s)" "$(field "$2" ops_per_s)" \
		"$(field "$2" p50_us)" "$(field "$2" p99_us)"
}

URL=redis://127.0.0.1:$PORT
broker a --remote "$URL"
broker b --remote "$URL" --remote-publish never
broker c
if [ -n "$BASE" ]; then
	BD0=$BD
	BD=$BASE
	broker o --remote "$URL" --remote-publish never
	BD=$BD0
fi
if [ "$PROUNDS" -gt 0 ]; then
	broker d --remote "$URL" --remote-publish reuse
	# Publish on eviction needs PUTs that evict: E and its tier-off twin F hold 64 MiB (14
	# pages), so past the first pages every PUT evicts one (and on E publishes it).
	broker e --pool 64M --remote "$URL" --remote-publish evict
	broker f --pool 64M
fi
published() { # socket: publishes settled (stored or there already)
	"$B/bin/kvbctl" --socket "$1" status --json |
		python3 -c 'import json,sys; r=json.load(sys.stdin)["remote"]; print(r["published"] + r["publish_existed"])'
}
# Rounds of the same fetch on fresh keys, each paired with hiredis GETs run right after it:
# the machine's load moves both between rounds, so each round is a ratio and the verdict is
# their median.
r=0
while [ "$r" -lt "$ROUNDS" ]; do
	first=$((r * N))
	echo "bench-remote: round $r: $N pages PUT on A (published)" >&2
	"$B/bin/kvbfetch" put "$D/a.sock" "$N" "$first" >"$D/put-$r.json"
	for _ in $(seq 600); do
		[ "$(published "$D/a.sock")" -ge $((first + N)) ] && break
		sleep 0.05
	done
	fetch() { # name pid out-suffix: that broker GETs each page of the round once
		echo "bench-remote: round $r: $1 fetches each once" >&2
		c0=$(cpu_ns "$2")
		"$B/bin/kvbfetch" get "$D/$1.sock" "$N" "$first" >"$D/fetch$3-$r.json"
		echo $(($(cpu_ns "$2") - c0)) >"$D/cpu$3-$r"
	}
	# Same pages, same depth (one GET at a time) for B and the baseline B0; who goes first
	# alternates, so neither always finds the server's (and the machine's) caches warmer.
	if [ -n "$BASE" ] && [ $((r % 2)) = 1 ]; then
		fetch o "$pid_o" -base
		fetch b "$pid_b" ""
	else
		fetch b "$pid_b" ""
		[ -n "$BASE" ] && fetch o "$pid_o" -base
	fi
	if [ -x "$PEERS" ]; then
		echo "bench-remote: round $r: hiredis GETs of the same size" >&2
		"$PEERS" --server "127.0.0.1:$PORT" --layout kimi --pages "$N" --seconds "$SECS" \
			--json redis-get >"$D/redis-$r.json" || rm -f "$D/redis-$r.json"
	fi
	r=$((r + 1))
done
rstat() { # socket key: a member of the broker's "remote" stats
	"$B/bin/kvbctl" --socket "$1" status --json |
		python3 -c 'import json,sys; print(json.load(sys.stdin)["remote"].get(sys.argv[1], "n/a"))' "$2"
}
fetched=$(rstat "$D/b.sock" fetched)
in_place=$(rstat "$D/b.sock" fetched_in_place)
"$B/bin/kvbctl" --socket "$D/a.sock" status | grep -A2 '^remote' >&2
"$B/bin/kvbctl" --socket "$D/b.sock" status | grep -A2 '^remote' >&2
# Publish moments, in rounds on fresh keys: PUTs on C (tier off), A (publish at PUT) and D
# (publish at first reuse), then D's first GETs of its pages (each one publishes) and its
# second GETs (plain hits). Between two cases the publishes in flight settle.
settle() { # socket: until its publishes stop moving
	last=-1
	for _ in $(seq 400); do
		now=$(published "$1")
		[ "$now" = "$last" ] && break
		last=$now
		sleep 0.1
	done
}
r=0
while [ "$r" -lt "$PROUNDS" ]; do
	first=$((1000000 + r * N))
	echo "bench-remote: publish round $r" >&2
	"$B/bin/kvbfetch" put "$D/c.sock" "$N" "$first" >"$D/pub-off-$r.json"
	c0=$(cpu_ns "$pid_a")
	"$B/bin/kvbfetch" put "$D/a.sock" "$N" $((first + 100000)) >"$D/pub-put-$r.json"
	settle "$D/a.sock"
	echo $(($(cpu_ns "$pid_a") - c0)) >"$D/pub-cpu-$r"
	"$B/bin/kvbfetch" put "$D/d.sock" "$N" $((first + 200000)) >"$D/pub-reuse-$r.json"
	"$B/bin/kvbfetch" get "$D/d.sock" "$N" $((first + 200000)) >"$D/pub-get1-$r.json"
	settle "$D/d.sock"
	"$B/bin/kvbfetch" get "$D/d.sock" "$N" $((first + 200000)) >"$D/pub-get2-$r.json"
	"$B/bin/kvbfetch" put "$D/f.sock" "$N" $((first + 300000)) >"$D/pub-off64-$r.json"
	"$B/bin/kvbfetch" put "$D/e.sock" "$N" $((first + 400000)) >"$D/pub-evict-$r.json"
	settle "$D/e.sock"
	r=$((r + 1))
done
if [ "$PROUNDS" -gt 0 ]; then
	d_published=$(rstat "$D/d.sock" published)
	e_published=$(rstat "$D/e.sock" published)
fi
echo "bench-remote: local hits on B (tier on), C (tier off)" >&2
lat() { # socket out
	"$BENCH" --socket "$1" --layout kimi --pages "$N" --seconds "$SECS" --json get >"$2"
}
lat "$D/b.sock" "$D/on.json"
lat "$D/c.sock" "$D/off.json"
kill -STOP "$rpid"
lat "$D/b.sock" "$D/stopped.json"
kill -CONT "$rpid"
kill "$rpid"
wait "$rpid" 2>/dev/null || true
lat "$D/b.sock" "$D/down.json"

echo "### Remote tier (\`tools/bench-remote.sh\`): Kimi-K2.5 pages (4.29 MiB), one Redis server on loopback"
echo
echo "Fetch: node B GETs $N pages node A published, each a remote fetch, in $ROUNDS rounds on fresh"
echo "keys ($fetched fetched, $in_place of them landed in place); each round's hiredis GETs ran right"
echo "after its fetches:"
echo
if [ -x "$PEERS" ]; then
	python3 - "$D" "$ROUNDS" "$BASE" <<'EOF'
import json, os, statistics, sys
d, rounds, base = sys.argv[1], int(sys.argv[2]), sys.argv[3]
hb = " | baseline B0 GB/s (p50 us), hits | B0 CPU per fetch | B0 / GET" if base else ""
print("| round | remote fetch GB/s (p50 us), hits | broker B CPU per fetch | hiredis GET GB/s (p50 us) | fetch / GET%s |" % hb)
print("| --- | --- | --- | --- | ---%s |" % (" | --- | --- | ---" if base else ""))
cpus, ratios, bcpus, bratios = [], [], [], []
for r in range(rounds):
    f = json.load(open(os.path.join(d, "fetch-%d.json" % r)))
    p = os.path.join(d, "redis-%d.json" % r)
    if not os.path.exists(p):
        continue
    g = json.load(open(p))
    ratios.append(f["gb_per_s"] / g["gb_per_s"])
    cpus.append(int(open(os.path.join(d, "cpu-%d" % r)).read()) / 1e6 / max(f["hits"], 1))
    line = "| %d | %.2f (%.0f), %d | %.2f ms | %.2f (%.0f) | %.0f%%" % (r, f["gb_per_s"],
           f["p50_us"], f["hits"], cpus[-1], g["gb_per_s"], g["p50_us"], 100 * ratios[-1])
    if base:
        o = json.load(open(os.path.join(d, "fetch-base-%d.json" % r)))
        bratios.append(o["gb_per_s"] / g["gb_per_s"])
        bcpus.append(int(open(os.path.join(d, "cpu-base-%d" % r)).read()) / 1e6 /
                     max(o["hits"], 1))
        line += " | %.2f (%.0f), %d | %.2f ms | %.0f%%" % (o["gb_per_s"], o["p50_us"], o["hits"],
                                                         bcpus[-1], 100 * bratios[-1])
    print(line + " |")
print("\nBroker B's CPU time (all its threads, from schedstat) per page fetched: median %.2f ms." %
      statistics.median(cpus))
if base:
    print("\nBaseline B0 (`%s`): fetch at %.0f%% of hiredis GET (median; range %.0f-%.0f%%), "
          "CPU per fetch median %.2f ms." % (base, 100 * statistics.median(bratios),
          100 * min(bratios), 100 * max(bratios), statistics.median(bcpus)))
m = statistics.median(ratios)
print("\nFetch at %.0f%% of hiredis GET, median of %d rounds (range %.0f-%.0f%%; target >= 80%%: %s).\n"
      % (100 * m, len(ratios), 100 * min(ratios), 100 * max(ratios), "met" if m >= 0.8 else "MISSED"))
EOF
else
	echo "| case | GB/s | ops/s | p50 us | p99 us |"
	echo "| --- | --- | --- | --- | --- |"
	row "remote fetch through kvbrokerd B (round 0)" "$D/fetch-0.json"
	echo
	echo "(kvbbench-peers not built: no hiredis GET row; \`make bench\` builds it.)"
	echo
fi
if [ "$PROUNDS" -gt 0 ]; then
	echo "Publish moments: kvbfetch PUTs of new pages on a broker with the tier off (C), publishing at"
	echo "PUT (A, the default) and at first reuse (D, \`--remote-publish reuse\`), then D's first GETs of"
	echo "its pages (each publishes it) and its second; then PUTs on two brokers of 64 MiB (every"
	echo "PUT past the first few evicts a page): F with the tier off, E publishing each page it evicts"
	echo "(\`--remote-publish evict\`); ops/s, median of $PROUNDS rounds [range] (D published"
	echo "$d_published pages, one per page reused; E $e_published, one per page evicted):"
	echo
	python3 - "$D" "$PROUNDS" <<'EOF'
import json, os, statistics, sys
d, rounds = sys.argv[1], int(sys.argv[2])
cases = [("PUT, tier off (C)", "off"), ("PUT, publish at PUT (A)", "put"),
         ("PUT, publish at reuse (D)", "reuse"), ("GET, first reuse: publishes (D)", "get1"),
         ("GET, second reuse (D)", "get2"), ("PUT, 64 MiB pool, tier off (F)", "off64"),
         ("PUT, 64 MiB pool, publish at eviction (E)", "evict")]
print("| case | ops/s | GB/s | p50 us | p99 us |")
print("| --- | --- | --- | --- | --- |")
for label, k in cases:
    js = [json.load(open(os.path.join(d, "pub-%s-%d.json" % (k, r)))) for r in range(rounds)]
    ops = [j["ops_per_s"] for j in js]
    med = lambda f: statistics.median(j[f] for j in js)
    print("| %s | %.0f [%.0f-%.0f] | %.2f | %.0f | %.0f |" % (label, statistics.median(ops), min(ops),
          max(ops), med("gb_per_s"), med("p50_us"), med("p99_us")))
cpu = [int(open(os.path.join(d, "pub-cpu-%d" % r)).read()) / 1e6 for r in range(rounds)]
n = json.load(open(os.path.join(d, "pub-put-0.json")))["hits"]
print("\nBroker A's CPU time (all its threads) per page PUT and published: median %.2f ms." %
      (statistics.median(cpu) / n))
EOF
	echo
fi
echo "Local hits (GET of pages in B's RAM, registered buffer):"
echo
echo "| case | GB/s | ops/s | p50 us | p99 us |"
echo "| --- | --- | --- | --- | --- |"
row "tier off (broker C)" "$D/off.json"
row "tier on, Redis up (broker B)" "$D/on.json"
row "tier on, Redis stopped (SIGSTOP)" "$D/stopped.json"
row "tier on, Redis killed" "$D/down.json"
python3 - "$D/off.json" "$D/on.json" "$D/stopped.json" "$D/down.json" <<'EOF'
import json, sys
off, *rest = (json.load(open(p))["p50_us"] for p in sys.argv[1:])
worst = max(rest)
print("\nLocal-hit p50 with the tier on is at most %.2fx the tier off (target unchanged: %s)." %
      (worst / off, "met" if worst <= 1.1 * off else "MISSED"))
EOF
