#!/bin/sh
# SPDX-License-Identifier: MIT
#
# fresh-check.sh [ROOT] - proves the README's two commands on a machine as new as one can be
# made here: a minimal Debian of this host's release (debootstrap --variant=minbase: no
# compiler, no -dev packages, no Python, no git), a fresh `git clone` of this tree's HEAD in it,
# and there, as root, `apt-get install make` (the README's one prerequisite: a Makefile cannot
# install make), then `make demo` and `make test`, each run once, the way a new user types
# them. Both must pass the first time. A manual check, not part of make test: run it in every
# session that touches the build, tools/deps.sh or the README, and say so in the notes.
#
#   sudo sh tools/fresh-check.sh                 # chroots /var/tmp/kvb-fresh{,-wheel}, removed after
#   KVB_FRESH_KEEP=1 sudo sh tools/fresh-check.sh  # keep it for a look (chroot /var/tmp/...)
#
# Needs root on the host (debootstrap, chroot, mounts) and the Debian mirror (the chroot's
# apt-get; debootstrap's downloads are cached in /var/cache/kvb-fresh/debs). Nothing is removed
# from or installed into the host but debootstrap itself. The chroot runs in a private mount
# namespace (unshare -m): its /proc, /sys, /dev, /dev/shm (a fresh tmpfs) and /tmp (tmpfs)
# vanish with it and never reach the host's mount table, so removing ROOT afterwards cannot
# touch the host's /dev or /sys (checked anyway before rm -rf).
#
# What a new machine here has besides Debian, the chroot gets too: pip's configuration
# (/etc/xdg/pip, PIP_FIND_LINKS, the CA file of PIP_CERT) and the wheels it points at
# (/opt/wheels, bound read-only), so that make pytest's venv reaches the registry and takes
# the CPU torch on disk as it would on the host.
#
# Then the wheel: the chroot builds it (make wheel, after make test); a second minimal Debian
# (ROOT-wheel) gets only python3 and python3-venv, none of the C libraries the programs link
# (minbase's apt brings libgnutls30, Debian's python3 libssl3 and libncursesw6: the report
# lists which are there, and the wheel's programs load their own copies, which the ldd test
# checks), and runs tests/wheel/test_wheel.py
# of the clone there: pip installs the wheel into a fresh venv, kvbrokerd --help, a broker,
# kvbctl status --json, ldd of every ELF file, the README's blocks, kvbroker.sglang and
# kvbroker.vllm against the pinned engines (the first chroot's build/venv, bound read-only at
# the same path, reached through a .pth line; kvbroker itself from the wheel).
#
# What is not as on a new machine, and said in the report: the kernel is the host's (io_uring,
# loop devices, NUMA, hugepages are what the host has: tests that need what it lacks skip, and
# the report lists every SKIP line); /dev is the host's (t_disk_blockdev and t_disk_nospace use
# loop devices); there is no CUDA toolkit in the chroot, so the build is the -nocuda one and the
# GPU tests that need it skip. The clone is of HEAD: uncommitted changes are not checked.
#
# Output: build/fresh-check/{debootstrap,demo,test,wheel}.log and report.txt in this tree (a
# copy of the report on stdout). Exit 0 when both commands and the wheel's tests passed.
set -eu

here=$(cd "$(dirname "$0")/.." && pwd)
ROOT=${1:-/var/tmp/kvb-fresh}
WROOT=$ROOT-wheel
CACHE=/var/cache/kvb-fresh/debs
OUT=$here/build/fresh-check
KEEP=${KVB_FRESH_KEEP:-0}
. /etc/os-release
SUITE=${KVB_FRESH_SUITE:-$VERSION_CODENAME}
MIRROR=${KVB_FRESH_MIRROR:-http://deb.debian.org/debian}

if [ "$(id -u)" -ne 0 ]; then
	echo "fresh-check: needs root (debootstrap, chroot, mounts)" >&2
	exit 1
fi
case $ROOT in
/ | /usr* | /etc* | /dev* | /proc* | /sys* | /root | /home | /work*)
	echo "fresh-check: refusing ROOT $ROOT" >&2
	exit 1
	;;
esac
mkdir -p "$OUT" "$CACHE"

# Mounts under a chroot in the host's namespace: there must never be any (ours are private).
mounted_under() {
	awk -v r="$1" '$5 == r || index($5, r "/") == 1 { n++ } END { print n + 0 }' \
		/proc/self/mountinfo
}

# remove_root [DIR]: DIR (default ROOT), only when it is a chroot of ours without mounts.
remove_root() {
	r=${1:-$ROOT}
	[ -d "$r" ] || return 0
	if [ "$(mounted_under "$r")" != 0 ]; then
		echo "fresh-check: $r has mounts in the host namespace; not removing it" >&2
		return 1
	fi
	if [ ! -f "$r/.kvb-fresh" ]; then
		echo "fresh-check: $r exists and is not a fresh-check chroot; not removing it" >&2
		return 1
	fi
	rm -rf "$r"
}

now() { date +%s; }

t0=$(now)
command -v debootstrap >/dev/null || {
	echo "fresh-check: installing debootstrap on the host"
	DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >/dev/null
}
remove_root
remove_root "$WROOT"
commit=$(git -C "$here" rev-parse --short HEAD)
dirty=$(git -C "$here" status --porcelain | head -n 1)

echo "fresh-check: debootstrap $SUITE (minbase) into $ROOT"
mkdir -p "$ROOT"
touch "$ROOT/.kvb-fresh"
if ! debootstrap --variant=minbase --cache-dir="$CACHE" "$SUITE" "$ROOT" "$MIRROR" \
	>"$OUT/debootstrap.log" 2>&1; then
	tail -n 20 "$OUT/debootstrap.log" >&2
	exit 1
fi
t1=$(now)
cp /etc/resolv.conf "$ROOT/etc/resolv.conf"
# What a new machine of this workplace has besides Debian: pip's configuration (the cap on
# torch releases) and the wheels on disk it points at (the CPU torch that make pytest's venv
# takes; without them pip would fetch a CUDA build of several GB). Bound in read-only below.
if [ -d /etc/xdg/pip ]; then
	mkdir -p "$ROOT/etc/xdg"
	cp -r /etc/xdg/pip "$ROOT/etc/xdg/pip"
fi
# And the certificate authorities pip trusts here (PIP_CERT): the registry may be reached
# through a proxy whose CA Debian's bundle in the chroot does not have.
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
	cp "$PIP_CERT" "$ROOT/etc/kvb-fresh-pip-ca.crt"
	PIP_CERT=/etc/kvb-fresh-pip-ca.crt
	export PIP_CERT
fi
# What a new user has: the tree, cloned. (Host git: the minbase chroot has none yet.)
git clone -q --no-local "$here" "$ROOT/root/kvbroker"
printf '%s\n' "$commit" >"$ROOT/root/kvbroker.commit"

# Inside: make demo, then make test, each timed, in a private mount namespace.
cat >"$ROOT/root/fresh-run.sh" <<'EOF'
#!/bin/sh
# The one prerequisite the README names: make itself (a Makefile cannot install it).
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/root/make.log 2>&1
apt-get install -y -qq --no-install-recommends make >>/root/make.log 2>&1
echo "make-install $? 0" >/root/results
cd /root/kvbroker
s=$(date +%s)
make demo >/root/demo.log 2>&1
echo "demo $? $(($(date +%s) - s))" >>/root/results
s=$(date +%s)
make test >/root/test.log 2>&1
echo "test $? $(($(date +%s) - s))" >>/root/results
# The wheel for the second chroot: make test built it already, unless it stopped early.
make wheel >/root/wheel-build.log 2>&1
echo "wheel-build $?" >>/root/results
EOF
echo "fresh-check: make demo, then make test, in the chroot (commit $commit)"
unshare -m --propagation private sh -c '
	set -e
	R=$1
	# The root a mount point of its own, as on a machine: `ip netns exec` and `ip -n` make
	# / a slave mount and fail on a chroot that is only a directory (t_remote_netns).
	mount --bind "$R" "$R"
	mount -t proc proc "$R/proc"
	mount --rbind /sys "$R/sys"
	mount --rbind /dev "$R/dev"
	mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
	mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
	if [ -d /opt/wheels ]; then
		mkdir -p "$R/opt/wheels"
		mount --bind -o ro /opt/wheels "$R/opt/wheels"
	fi
	chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
		PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
		${PIP_FIND_LINKS:+PIP_FIND_LINKS=$PIP_FIND_LINKS} ${PIP_CERT:+PIP_CERT=$PIP_CERT} \
		nice -n 10 sh /root/fresh-run.sh
' fresh "$ROOT"
t2=$(now)
cp "$ROOT/root/demo.log" "$OUT/demo.log"
cp "$ROOT/root/test.log" "$OUT/test.log"

# The wheel, in a second minimal Debian that has Python and nothing else.
wheel_rc=1
wheel_file=$(ls "$ROOT"/root/kvbroker/build/wheel/kvbroker-*-manylinux_*.whl 2>/dev/null |
	head -n 1 || true)
cp "$ROOT/root/wheel-build.log" "$OUT/wheel.log" 2>/dev/null || : >"$OUT/wheel.log"
if [ -z "$wheel_file" ]; then
	echo "fresh-check: make wheel built no build/wheel/kvbroker-*-manylinux_*.whl" \
		>>"$OUT/wheel.log"
else
	echo "fresh-check: debootstrap $SUITE (minbase) into $WROOT: the wheel without the build"
	mkdir -p "$WROOT"
	touch "$WROOT/.kvb-fresh"
	if debootstrap --variant=minbase --cache-dir="$CACHE" "$SUITE" "$WROOT" "$MIRROR" \
		>>"$OUT/wheel.log" 2>&1; then
		cp /etc/resolv.conf "$WROOT/etc/resolv.conf"
		mkdir -p "$WROOT/root/kvbroker"
		cat >"$WROOT/root/wheel-run.sh" <<'EOF'
#!/bin/sh
# Python only (Debian's python3 and python3-venv: what `pip install` needs), then the wheel's
# tests from the first chroot's clone, bound read-only at /root/kvbroker.
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq >/root/apt.log 2>&1
apt-get install -y -qq --no-install-recommends python3 python3-venv >>/root/apt.log 2>&1 || {
	cat /root/apt.log
	exit 1
}
echo "runtime libraries installed here (the wheel carries its own copies):"
for p in liburing2 libnuma1 libcjson1 libisal2 libhiredis0.14 libhiredis1.1.0 \
	libmicrohttpd12 libncursesw6 libssl3 libgnutls30; do
	if dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'ok installed'; then
		echo "  $p (already here: minbase or python3 brought it)"
	fi
done
for p in gcc cc make pkg-config; do
	if command -v "$p" >/dev/null; then
		echo "  $p is here: this is not a machine without the build"
	fi
done
cd /root/kvbroker || exit 1
KVB_WHEEL_DIR=/root/kvbroker/build/wheel timeout -k 5 600 build/venv/bin/python -B -m pytest \
	-v -p no:cacheprovider --rootdir tests/wheel tests/wheel/test_wheel.py
EOF
		unshare -m --propagation private sh -c '
			set -e
			R=$1
			A=$2
			mount --bind "$R" "$R"
			mount -t proc proc "$R/proc"
			mount --rbind /sys "$R/sys"
			mount --rbind /dev "$R/dev"
			mount -t tmpfs -o mode=1777 tmpfs "$R/dev/shm"
			mount -t tmpfs -o mode=1777 tmpfs "$R/tmp"
			mount --bind "$A/root/kvbroker" "$R/root/kvbroker"
			mount -o remount,bind,ro "$R/root/kvbroker"
			chroot "$R" /usr/bin/env -i HOME=/root TERM=dumb LANG=C.UTF-8 \
				PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
				nice -n 10 sh /root/wheel-run.sh
		' fresh "$WROOT" "$ROOT" >>"$OUT/wheel.log" 2>&1 && wheel_rc=0 || wheel_rc=$?
	fi
fi
t3=$(now)

demo_rc=$(awk '$1 == "demo" { print $2 }' "$ROOT/root/results")
demo_s=$(awk '$1 == "demo" { print $3 }' "$ROOT/root/results")
test_rc=$(awk '$1 == "test" { print $2 }' "$ROOT/root/results")
test_s=$(awk '$1 == "test" { print $3 }' "$ROOT/root/results")
verdict() { [ "$1" = 0 ] && echo PASS || echo "FAIL (exit $1)"; }
{
	echo "fresh-check of kvbroker $commit${dirty:+ (HEAD; the worktree has uncommitted changes, not checked)}"
	echo "machine: debootstrap --variant=minbase $SUITE, host kernel $(uname -r), as root"
	echo "debootstrap: $((t1 - t0)) s; both commands: $((t2 - t1)) s"
	echo "make demo (first run: installs the packages, builds, runs the demo): $(verdict "$demo_rc") in ${demo_s} s"
	echo "make test (second command): $(verdict "$test_rc") in ${test_s} s"
	grep -E '^[0-9]+ passed' "$OUT/test.log" | tail -n 1 | sed 's/^/  suite: /'
	grep -E '^(PASS|FAIL) +fuzz_' "$OUT/test.log" | sed 's/^/  /'
	echo "apt-get install make: $(verdict "$(awk '$1 == "make-install" { print $2 }' "$ROOT/root/results")")"
	echo "the wheel (${wheel_file##*/}) in a minimal Debian with python3 only: $(verdict "$wheel_rc") in $((t3 - t2)) s"
	grep -E '^  .*(already here|is here)' "$OUT/wheel.log" | sed 's/^/  /' || true
	grep -E '^=+ .*(passed|failed)|^FAILED|SKIPPED' "$OUT/wheel.log" | sed 's/^/  /' || true
	echo "  skipped here (the host's kernel or devices, or no CUDA toolkit):"
	skips=$(grep -E -A1 '^SKIP' "$OUT/test.log" | grep -v '^--' || true)
	[ -n "$skips" ] && printf '%s\n' "$skips" | sed 's/^/    /' || echo "    none"
	grep -E '^(FAIL|TIMEOUT)' "$OUT/test.log" | sed 's/^/  /' || true
	grep -q 'undefined reference' "$OUT/demo.log" && echo "  demo.log: undefined references (link before the packages)"
	echo "logs: $OUT/{debootstrap,demo,test,wheel}.log"
} >"$OUT/report.txt"
cat "$OUT/report.txt"
if [ "$KEEP" = 1 ]; then
	echo "fresh-check: kept $ROOT and $WROOT (remove them with rm -rf, after checking they have no mounts)"
else
	remove_root
	remove_root "$WROOT"
fi
[ "$demo_rc" = 0 ] && [ "$test_rc" = 0 ] && [ "$wheel_rc" = 0 ]
