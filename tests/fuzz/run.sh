#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/fuzz/run.sh - runs every libFuzzer target built under FUZZ_BUILD_DIR.
#
#   sh tests/fuzz/run.sh FUZZ_BUILD_DIR SECONDS smoke|grow
#
# For each target fuzz_NAME: first every input in tests/fuzz/regress/NAME/ once (each a crash
# found earlier; they must pass forever), then SECONDS of fuzzing starting from the seed corpus
# tests/fuzz/corpus/NAME/. "smoke" (make test) keeps what it finds in a throw-away directory;
# "grow" (make fuzz) keeps it in FUZZ_BUILD_DIR/corpus/NAME, to be minimised into the seed
# corpus by hand (-merge=1). Crashes land in FUZZ_BUILD_DIR/crashes/ as NAME-crash-<sha1>: add
# each to tests/fuzz/regress/NAME/ with the fix. One line per target; non-zero exit on failure.

set -u
FB=$1
SECS=$2
MODE=${3:-smoke}
SRC=$(dirname "$0")
fail=0
mkdir -p "$FB/crashes" "$FB/logs" || exit 2

for t in "$FB"/fuzz_*; do
	[ -x "$t" ] && [ -f "$t" ] || continue
	name=${t##*/fuzz_}
	log=$FB/logs/$name.log
	: >"$log"
	# Regression inputs: each must run clean.
	if ls "$SRC/regress/$name"/* >/dev/null 2>&1; then
		if ! "$t" -runs=1 "$SRC/regress/$name"/* >>"$log" 2>&1; then
			echo "FAIL     fuzz_$name (a regression input crashes again)"
			tail -n 40 "$log"
			fail=1
			continue
		fi
	fi
	if [ "$MODE" = grow ]; then
		work=$FB/corpus/$name
		mkdir -p "$work"
	else
		work=$(mktemp -d "${TMPDIR:-/tmp}/kvbfuzz-$name-XXXXXX")
	fi
	t0=$(date +%s)
	"$t" -max_total_time="$SECS" -timeout=10 -rss_limit_mb=2048 -print_final_stats=1 \
		-artifact_prefix="$FB/crashes/$name-" "$work" "$SRC/corpus/$name" >>"$log" 2>&1
	rc=$?
	[ "$MODE" = grow ] || rm -rf "$work"
	execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
	cov=$(grep -o 'cov: [0-9]*' "$log" | tail -n 1)
	if [ "$rc" -eq 0 ]; then
		printf 'PASS     fuzz_%-22s %4ss, %s runs, %s\n' "$name" "$(($(date +%s) - t0))" \
			"${execs:-?}" "${cov:-cov: ?}"
	else
		echo "FAIL     fuzz_$name (exit $rc); log $log, inputs in $FB/crashes/"
		grep -A 30 'ERROR\|invariant\|deadly' "$log" | head -n 60
		fail=1
	fi
done
exit $fail
