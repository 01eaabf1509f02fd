#!/bin/sh
# SPDX-License-Identifier: MIT
#
# pyvenv.sh VENV PYTHON - the Python test venv behind `make pytest` and `make lint`.
#
# Creates VENV with PYTHON (3.11 or later: the package's limited API) and installs
# python/requirements/*.txt into it with pip's resolver, then python/requirements/*-nodeps.txt
# with --no-deps (the engines, whose own pins would pull CUDA builds of torch). On a Debian
# Python without ensurepip or headers it installs python3-venv and python3-dev first when run
# as root, and says what to run otherwise.
set -eu

VENV=$1
PY=${2:-python3}

if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
	echo "pyvenv: $PY is missing or older than 3.11 (make PYTHON=python3.11 ...)" >&2
	exit 1
fi
need=""
"$PY" -c 'import ensurepip' 2>/dev/null || need="python3-venv"
inc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
[ -f "$inc/Python.h" ] || need="$need python3-dev"
if [ -n "$need" ]; then
	if [ "$(id -u)" -eq 0 ] && command -v apt-get >/dev/null; then
		apt-get install -y $need >/dev/null || { apt-get update && apt-get install -y $need; }
	else
		echo "pyvenv: $PY lacks$need: run: sudo apt-get install$need" >&2
		exit 1
	fi
fi
# The venv takes about 3.5 GB (torch's CPU build and the engines' imports): say so up front
# rather than let pip stop half way with "No space left on device".
rm -rf "$VENV"
parent=$(dirname "$VENV")
mkdir -p "$parent"
free_mb=$(df -Pk "$parent" 2>/dev/null | awk 'NR == 2 { print int($4 / 1024) }')
if [ -n "$free_mb" ] && [ "$free_mb" -lt 4500 ]; then
	echo "pyvenv: only $free_mb MB free under $parent; the venv needs about 4500 MB" >&2
	exit 1
fi
"$PY" -m venv "$VENV"
set --
for r in python/requirements/*.txt; do
	case $r in
	*-nodeps.txt) ;;
	*) set -- "$@" -r "$r" ;;
	esac
done
"$VENV/bin/pip" install -q "$@"
for r in python/requirements/*-nodeps.txt; do
	[ -f "$r" ] || continue
	"$VENV/bin/pip" install -q --no-deps -r "$r"
done
