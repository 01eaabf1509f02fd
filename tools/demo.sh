#!/bin/sh
# SPDX-License-Identifier: MIT
#
# demo.sh B - `make demo`: start a kvbrokerd from build dir B with its embedded defaults on a
# private socket (modest pool; the pool is made of memfds, private to the broker, so it never
# meets another broker's pool), run kvbdemo
# (two simulated engines sharing a system prompt), print the broker's status, stop the broker
# with SIGTERM and check it exited 0. The trap stops the broker and removes the temp dir on
# every exit path; the broker's log is shown only when something failed.
set -eu

B=${1:-build/release}
POOL=${KVB_DEMO_POOL:-512M}

for p in kvbrokerd kvbdemo kvbctl; do
	if [ ! -x "$B/bin/$p" ]; then
		echo "demo: $B/bin/$p missing; run: make MODE=${B##*/}" >&2
		exit 1
	fi
done

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvbdemo.XXXXXX")
sock="$tmp/kvbroker.sock"
log="$tmp/kvbrokerd.log"
pid=""
ok=0

cleanup() {
	if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null; then
		kill -TERM "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	fi
	if [ "$ok" -ne 1 ] && [ -s "$log" ]; then
		echo "--- kvbrokerd log ($log) ---" >&2
		tail -n 40 "$log" >&2
	fi
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

echo "demo: starting $B/bin/kvbrokerd --socket $sock --pool $POOL"
"$B/bin/kvbrokerd" --socket "$sock" --pool "$POOL" --log-level info 2>"$log" &
pid=$!

# Ready when a client can connect: poll for up to 10 s, noticing a broker that died.
i=0
until "$B/bin/kvbctl" --socket "$sock" status >/dev/null 2>&1; do
	if ! kill -0 "$pid" 2>/dev/null; then
		wait "$pid" && rc=0 || rc=$?
		pid=""
		echo "demo: kvbrokerd exited with status $rc before accepting connections" >&2
		exit 1
	fi
	i=$((i + 1))
	if [ "$i" -ge 100 ]; then
		echo "demo: kvbrokerd not accepting connections at $sock after 10 s" >&2
		exit 1
	fi
	sleep 0.1
done
echo

demo_rc=0
"$B/bin/kvbdemo" --socket "$sock" || demo_rc=$?

echo
echo "demo: kvbctl status"
"$B/bin/kvbctl" --socket "$sock" status || demo_rc=1

kill -TERM "$pid"
broker_rc=0
wait "$pid" || broker_rc=$?
pid=""
echo
if [ "$broker_rc" -ne 0 ]; then
	echo "demo: kvbrokerd exited with status $broker_rc after SIGTERM (0 expected)" >&2
	exit 1
fi
if [ "$demo_rc" -ne 0 ]; then
	echo "demo: FAILED (kvbdemo exit status $demo_rc)" >&2
	exit 1
fi
ok=1
echo "demo: ok (broker stopped cleanly)"
