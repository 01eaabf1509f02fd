#!/bin/sh
# SPDX-License-Identifier: MIT
#
# gpu-libs.sh - copies the shared libraries that BUILD_DIR's broker, GPU check and kvbctl load
# (all but glibc's own) into DIR, for `PREBUILT=1 sh tools/gpu-check.sh` on a GPU machine that
# lacks the build's packages and cannot fetch them: carry BUILD_DIR/bin and DIR there and run
# with LD_LIBRARY_PATH=DIR.
#
#   sh tools/gpu-libs.sh [BUILD_DIR] [DIR]      (defaults build/release, .gpu/lib)
set -eu

B=${1:-build/release}
D=${2:-.gpu/lib}
cd "$(dirname "$0")/.."
bins="$B/bin/kvbrokerd $B/bin/kvbgpucheck $B/bin/kvbctl"
for f in $bins; do
	[ -x "$f" ] || { echo "gpu-libs: $f missing: build first (make)" >&2; exit 1; }
done
mkdir -p "$D"
# ldd's "name => /path (addr)" lines; glibc's libraries are the GPU machine's own.
# shellcheck disable=SC2086
ldd $bins | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
	while read -r name path; do
		case $name in
		libc.so.* | libm.so.* | libdl.so.* | libpthread.so.* | librt.so.* | ld-linux*) ;;
		*) cp -L "$path" "$D/$name" ;;
		esac
	done
echo "gpu-libs: $(ls "$D" | wc -l) libraries in $D ($(du -sh "$D" | cut -f1))"
