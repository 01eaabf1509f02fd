#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/run.sh - the test runner behind make test / unit / integ.
#
#   sh tests/run.sh BUILD_DIR [unit|integ|all]
#
# Runs BUILD_DIR/tests/test_* (cmocka units) and BUILD_DIR/tests/t_* (integration tests against
# a real kvbrokerd), one at a time, each under a hard timeout, and prints one line per test and
# a final "N passed, N failed, N skipped". A test's exit status means: 0 pass, 77 skip, anything
# else fail; a test killed by the timeout is reported as TIMEOUT and counted as failed. Each
# test's stdout and stderr go to BUILD_DIR/tests/logs/NAME.log, which is printed when it fails.
# The exit status is non-zero when anything failed.
#
# Environment:
#   KVB_TEST_TIMEOUT  seconds per test (default 120)
#   KVB_TEST_FILTER   run only tests whose name contains this string
#   KVB_TEST_VERBOSE  1: print every test's log, not only the failures'
#
# POSIX sh on purpose (make runs it with sh, which is dash on Debian). Tests run one at a time:
# the integration tests start a busy-polling broker each, and on a 2-core machine running them
# side by side only makes their timings noisier.

set -u

if [ $# -lt 1 ] || [ $# -gt 2 ]; then
	echo "usage: $0 BUILD_DIR [unit|integ|all]" >&2
	exit 2
fi
B=$1
WHICH=${2:-all}
TMO=${KVB_TEST_TIMEOUT:-120}
FILTER=${KVB_TEST_FILTER:-}
VERBOSE=${KVB_TEST_VERBOSE:-0}
LOGS=$B/tests/logs

case $WHICH in
unit) patterns="test_*" ;;
integ) patterns="t_*" ;;
all) patterns="test_* t_*" ;;
*)
	echo "$0: unknown suite '$WHICH' (unit, integ or all)" >&2
	exit 2
	;;
esac

if [ ! -d "$B/tests" ]; then
	echo "$0: no tests under $B/tests: build them first" >&2
	exit 2
fi
mkdir -p "$LOGS" || exit 2

# Wall-clock seconds with millisecond resolution (GNU date), for the per-test timing column.
now_ms() {
	d=$(date +%s%3N 2>/dev/null)
	case $d in
	*N*|'') echo $(($(date +%s) * 1000)) ;;
	*) echo "$d" ;;
	esac
}

npass=0
nfail=0
nskip=0
failed=""
t_all=$(now_ms)

for pat in $patterns; do
	for t in "$B"/tests/$pat; do
		if [ ! -f "$t" ] || [ ! -x "$t" ]; then
			continue
		fi
		name=${t##*/}
		case $name in
		*.d|*.o|*.log) continue ;;
		esac
		if [ -n "$FILTER" ]; then
			case $name in
			*"$FILTER"*) ;;
			*) continue ;;
			esac
		fi
		log=$LOGS/$name.log
		t0=$(now_ms)
		# -k: a test that ignores SIGTERM is killed 5 s later. timeout signals the whole
		# process group it creates, so brokers and children a test forked go with it.
		timeout -k 5 "$TMO" "$t" >"$log" 2>&1 </dev/null
		rc=$?
		t1=$(now_ms)
		ms=$((t1 - t0))
		secs=$(printf '%d.%02d' $((ms / 1000)) $((ms % 1000 / 10)))
		case $rc in
		0)
			status=PASS
			npass=$((npass + 1))
			;;
		77)
			status=SKIP
			nskip=$((nskip + 1))
			;;
		124|137)
			# 137 is timeout's own SIGKILL after -k, or a test killed by SIGKILL; either
			# way it did not finish. Tell them apart by the clock.
			if [ "$rc" -eq 124 ] || [ "$ms" -ge $((TMO * 1000)) ]; then
				status=TIMEOUT
			else
				status="FAIL (killed by SIGKILL)"
			fi
			nfail=$((nfail + 1))
			failed="$failed $name"
			;;
		*)
			if [ "$rc" -gt 128 ]; then
				status="FAIL (signal $((rc - 128)))"
			else
				status="FAIL (exit $rc)"
			fi
			nfail=$((nfail + 1))
			failed="$failed $name"
			;;
		esac
		printf '%-8s %-28s %7ss\n' "${status%% *}" "$name" "$secs"
		case $status in
		SKIP)
			# Say why: a skipping test prints its reason as its last line.
			reason=$(tail -n 1 "$log" 2>/dev/null)
			[ -n "$reason" ] && echo "         $reason"
			;;
		PASS) ;;
		*)
			[ "$status" = TIMEOUT ] && echo "         killed after ${TMO}s"
			[ "${status#FAIL (}" != "$status" ] && echo "         ${status#FAIL }"
			echo "-------- $log --------"
			cat "$log"
			echo "-------- end of $name --------"
			;;
		esac
		if [ "$VERBOSE" = 1 ] && [ "$status" = PASS ]; then
			cat "$log"
		fi
	done
done

t_end=$(now_ms)
total=$((npass + nfail + nskip))
if [ "$total" -eq 0 ]; then
	echo "no tests found under $B/tests matching: $patterns${FILTER:+ (filter: $FILTER)}" >&2
fi
ms=$((t_end - t_all))
echo "# $total tests in $((ms / 1000)).$((ms % 1000 / 100)) s; logs in $LOGS${failed:+; failed:$failed}"
echo "$npass passed, $nfail failed, $nskip skipped"
[ "$nfail" -eq 0 ]
