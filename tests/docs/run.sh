#!/bin/sh
# SPDX-License-Identifier: MIT
#
# tests/docs/run.sh - runs the command blocks of README.md and docs/*.md that are marked
# runnable, so that every such command works as written (tests/integ/t_docs.c runs it in
# `make test`).
#
#   sh tests/docs/run.sh BUILD_DIR [--lang sh|python|all] [FILE.md ...]
#
# The convention, for whoever writes the docs:
#
#   - A block is runnable when the line right before its opening fence is an HTML comment,
#     which GitHub does not render:
#
#         <!-- runnable -->              the block runs against a broker on $KVB_SOCKET; when
#                                        none answers there, the runner starts one first
#                                        (kvbrokerd --pool 256M)
#         <!-- runnable: no-broker -->   no broker runs on $KVB_SOCKET when the block starts
#                                        (the runner stops its own); the block starts its own
#
#     and its fence is ```sh or ```python. Other blocks are left alone.
#   - The runner sets, and the blocks use:
#         KVB_SOCKET   the socket of the broker: a fresh path in a temporary directory, so
#                      every command names it (--socket "$KVB_SOCKET") and none depends on a
#                      default path
#         KVB_BIN      BUILD_DIR/bin, also first on PATH: blocks call kvbrokerd, kvbctl and
#                      kvbbench by name, as a user with the programs on PATH does
#         KVB_SRC      the repository's root
#     and runs them in a fresh temporary directory (the working directory), one shell per
#     file: the sh blocks of one file run in order in one `sh -e` session, so a block sees
#     what the blocks before it set and started. Whatever a file's blocks leave running in
#     the background is stopped (SIGTERM) when the file is done.
#   - sh blocks: one command per line (a line ending in \ continues it; a compound command
#     stays on one line). Each command is echoed as "+ FILE:LINE: COMMAND" before it runs;
#     the first that fails ends the file with "FAIL FILE:LINE: COMMAND (exit N)".
#   - python blocks run with $KVB_PYTHON, by default build/venv/bin/python (`make python`)
#     when it imports kvbroker and numpy; without one they are skipped, and the runner says
#     so. A traceback names the doc's own file and line numbers.
#
# Exit status: 0 when every block ran (or was skipped for want of Python), 1 when one failed,
# 2 on a usage error. POSIX sh and awk, as tests/run.sh.

set -u

usage() {
	echo "usage: $0 BUILD_DIR [--lang sh|python|all] [FILE.md ...]" >&2
	exit 2
}
[ $# -ge 1 ] || usage
B=$1
shift
LANGS=all
if [ "${1:-}" = --lang ]; then
	[ $# -ge 2 ] || usage
	LANGS=$2
	shift 2
fi
case $LANGS in sh | python | all) ;; *) usage ;; esac

SRC=$(cd "$(dirname "$0")/../.." && pwd) || exit 2
BIN=$(cd "$B/bin" 2>/dev/null && pwd) || {
	echo "$0: no $B/bin: build first (make)" >&2
	exit 2
}
for p in kvbrokerd kvbctl; do
	[ -x "$BIN/$p" ] || {
		echo "$0: $BIN/$p missing" >&2
		exit 2
	}
done
if [ $# -eq 0 ]; then
	set -- "$SRC/README.md" "$SRC"/docs/*.md
fi

# The Python for python blocks: one that has the package and numpy, or none.
PY=${KVB_PYTHON:-$SRC/build/venv/bin/python}
if [ "$LANGS" = sh ] || ! "$PY" -c 'import kvbroker, numpy' >/dev/null 2>&1; then
	PY=
fi

TMP=$(mktemp -d "${TMPDIR:-/tmp}/kvb-docs.XXXXXX") || exit 2
trap 'rm -rf "$TMP"' EXIT
trap 'exit 143' TERM
trap 'exit 130' INT

# The helpers every generated script sources: the broker the runner starts, the echo before
# each command, and the report and clean-up at exit.
cat >"$TMP/lib.sh" <<'EOF'
__kvbdocs_loc=
__kvbdocs_cmd=
__kvbdocs_broker=
# Prints and remembers the command about to run.
__kvbdocs_at() {
	__kvbdocs_loc=$1
	__kvbdocs_cmd=$2
	printf '+ %s: %s\n' "$1" "$2"
}
# A broker on $KVB_SOCKET: the one already answering there, or one started here.
__kvbdocs_broker_up() {
	"$KVB_BIN/kvbctl" --socket "$KVB_SOCKET" status >/dev/null 2>&1 && return 0
	"$KVB_BIN/kvbrokerd" --socket "$KVB_SOCKET" --pool 256M --log-level warn &
	__kvbdocs_broker=$!
	__i=0
	until "$KVB_BIN/kvbctl" --socket "$KVB_SOCKET" status >/dev/null 2>&1; do
		if ! kill -0 "$__kvbdocs_broker" 2>/dev/null || [ "$__i" -ge 200 ]; then
			echo "FAIL $__kvbdocs_loc: the runner's broker did not start"
			exit 1
		fi
		__i=$((__i + 1))
		sleep 0.1
	done
}
# No broker on $KVB_SOCKET: stops the runner's own; another one still there is a failure.
__kvbdocs_broker_down() {
	if [ -n "$__kvbdocs_broker" ]; then
		kill "$__kvbdocs_broker" 2>/dev/null || :
		wait "$__kvbdocs_broker" 2>/dev/null || :
		__kvbdocs_broker=
	fi
	if "$KVB_BIN/kvbctl" --socket "$KVB_SOCKET" status >/dev/null 2>&1; then
		echo "FAIL $__kvbdocs_loc: a broker of an earlier block still runs on \$KVB_SOCKET"
		exit 1
	fi
}
__kvbdocs_exit() {
	__rc=$?
	set +e
	if [ "$__rc" -ne 0 ]; then
		echo "FAIL $__kvbdocs_loc: $__kvbdocs_cmd (exit $__rc)"
	fi
	jobs -p >"$KVBDOCS_TMP/jobs"
	for __p in $(cat "$KVBDOCS_TMP/jobs"); do
		kill "$__p" 2>/dev/null
	done
	wait
	exit "$__rc"
}
trap __kvbdocs_exit EXIT
trap 'exit 143' TERM
trap 'exit 130' INT
EOF

nfail=0
nrun=0
nskip=0
for f in "$@"; do
	[ -f "$f" ] || {
		echo "$0: $f: no such file" >&2
		exit 2
	}
	name=${f#"$SRC"/}
	work="$TMP/work"
	rm -rf "$work" "$TMP/py"
	mkdir -p "$work" "$TMP/py"
	# One script per file. awk turns each marked block into: the broker step its marker
	# asks for, then per command an __kvbdocs_at line (location and text, single-quoted)
	# and the command itself; a python block into a file of its own, padded with empty
	# lines so that its line numbers are the doc's, and one command that runs it.
	awk -v name="$name" -v langs="$LANGS" -v py="$PY" -v pydir="$TMP/py" '
	function q(s) { gsub(/\047/, "\047\\\047\047", s); return "\047" s "\047" }
	BEGIN { mode = ""; inblock = 0; n = 0; skipped = 0 }
	inblock && /^```[ \t]*$/ {
		if (lang == "python" && run) {
			close(pyfile)
			print "__kvbdocs_at " q(name ":" start) " " q("python block, lines " start + 1 "-" NR - 1)
			print "\"$KVB_PYTHON\" " q(pyfile)
		}
		if (lang == "sh" && cont != "") {
			print "__kvbdocs_at " q(name ":" cstart) " " q("the block ends inside a command") "; exit 1"
		}
		inblock = 0
		next
	}
	inblock {
		if (!run)
			next
		if (lang == "python") {
			print $0 > pyfile
			next
		}
		if (cont == "") {
			if ($0 ~ /^[ \t]*(#.*)?$/) { print; next }
			cstart = NR
		}
		cont = cont (cont == "" ? "" : " ") $0
		body = body $0 "\n"
		if ($0 ~ /\\$/) { sub(/\\$/, "", cont); next }
		print "__kvbdocs_at " q(name ":" cstart) " " q(cont)
		printf "%s", body
		cont = ""; body = ""
		next
	}
	/^```/ && mark != "" && mline == NR - 1 {
		lang = substr($0, 4); gsub(/[ \t]/, "", lang)
		inblock = 1; start = NR; cont = ""; body = ""
		run = (lang == "sh" || lang == "python") && (langs == "all" || langs == lang)
		if (run && lang == "python" && py == "") { run = 0; skipped++
			print "echo " q("SKIP " name ":" NR ": python block: no Python with kvbroker and numpy (make python, or set KVB_PYTHON)") }
		if (run) {
			n++
			print "__kvbdocs_at " q(name ":" mline) " " q(mark)
			print (mark ~ /no-broker/ ? "__kvbdocs_broker_down" : "__kvbdocs_broker_up")
			if (lang == "python") {
				# pydir/LINE/NAME: a traceback names the doc and its own lines.
				pyfile = pydir "/" NR "/" name
				d = pyfile; sub(/\/[^\/]*$/, "", d)
				system("mkdir -p " q(d))
				for (i = 1; i <= NR; i++) print "" > pyfile
			}
		}
		mark = ""
		next
	}
	/^```/ { inblock = 1; run = 0; lang = ""; mark = ""; next }
	/^<!-- runnable(: no-broker)? -->[ \t]*$/ { mark = $0; mline = NR; next }
	/^<!-- runnable/ { print "__kvbdocs_at " q(name ":" NR) " " q("unknown marker: " $0) "; exit 1"; n++; next }
	{ mark = "" }
	END {
		print "# blocks " n " skipped " skipped
	}' "$f" >"$TMP/script.sh" || exit 2
	nb=$(sed -n 's/^# blocks \([0-9]*\) skipped \([0-9]*\)$/\1/p' "$TMP/script.sh")
	ns=$(sed -n 's/^# blocks \([0-9]*\) skipped \([0-9]*\)$/\2/p' "$TMP/script.sh")
	nskip=$((nskip + ns))
	if [ "$nb" -eq 0 ]; then
		[ "$ns" -eq 0 ] || echo "# $name: $ns python block(s) skipped: no Python with kvbroker and numpy"
		continue
	fi
	nrun=$((nrun + nb))
	echo "# $name: $nb runnable block(s)"
	(
		cd "$work" || exit 1
		export KVB_SOCKET="$TMP/kvb.sock" KVB_BIN="$BIN" KVB_SRC="$SRC" KVB_PYTHON="$PY" \
			KVBDOCS_TMP="$TMP" PATH="$BIN:$PATH"
		{
			echo ". \"$TMP/lib.sh\""
			cat "$TMP/script.sh"
		} >"$TMP/run.sh"
		exec sh -e "$TMP/run.sh"
	)
	rc=$?
	if [ "$rc" -ne 0 ]; then
		nfail=$((nfail + 1))
		echo "# $name: FAILED (exit $rc)"
	fi
done
echo "# $nrun block(s) run, $nskip python block(s) skipped, $nfail file(s) failed"
[ "$nfail" -eq 0 ]
