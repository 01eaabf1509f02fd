#!/bin/sh
# SPDX-License-Identifier: MIT
# Checks the Debian packages kvbroker builds and tests with; installs the missing ones when run
# as root (apt-get), otherwise prints the exact command and fails. `deps.sh bench` checks the
# packages only `make bench` needs instead (the peers it compares with, fio, gnuplot, and
# tcmalloc, which vLLM's CPU engines run with).
set -eu
# Build and test: the libraries, clang's libFuzzer (make test runs each fuzzer briefly),
# setpriv (util-linux) for the foreign-uid tests, libmicrohttpd (--metrics-listen) and ncurses
# (kvbctl top); what CI runs besides (.ci/run: make lint needs clang-format and cppcheck, and
# fails without them); Python 3 with venv and headers for the Python package's tests (a venv
# under build/, a C extension); e2fsprogs (mkfs.ext4) for t_disk_nospace; git to clone;
# redis-server and hiredis for the remote tier, iproute2 (ip netns, veth) for t_remote_netns.
need="build-essential pkg-config liburing-dev libnuma-dev libcmocka-dev libssl-dev libcjson-dev
	libisal-dev libmicrohttpd-dev libncurses-dev python3 clang libclang-rt-dev util-linux
	clang-format cppcheck python3-venv python3-dev e2fsprogs git libhiredis-dev redis-server
	redis-tools iproute2"
if [ "${1:-}" = bench ]; then
	need="redis-server redis-tools memcached libhiredis-dev libmemcached-dev fio gnuplot-nox
		python3 libtcmalloc-minimal4"
fi
missing=""
for p in $need; do
	dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed' || missing="$missing $p"
done
[ -z "$missing" ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
	echo "kvbroker needs:$missing" >&2
	echo "run: sudo apt-get install -y$missing" >&2
	exit 1
fi
echo "installing:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq || true
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing >/dev/null
