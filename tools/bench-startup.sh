#!/bin/sh
# SPDX-License-Identifier: MIT
#
# bench-startup.sh B [SIZE] - kvbrokerd start-up time per phase against a plain first touch of
# the same amount of memory, measured in the same run; prints a markdown table.
#
#   sh tools/bench-startup.sh build/release 16G
#
# Runs, one after the other (never two big allocations at once):
#   1. memset of SIZE of anonymous memory (4 KiB pages, one thread): the plain first touch;
#   2. memset of a SIZE memfd (shared memory, 4 KiB pages), the kind of memory the pool is;
#   3. kvbrokerd --pool SIZE with its defaults (--numa auto, --hugepages auto, prefault on),
#      timed from exec to the first successful kvbctl, and by its own phase timings (stats
#      "startup": reserve, prefault, pin, ready);
#   4. the anonymous memset again (the machine warms up: the fastest touch is the reference);
#   5. with KVB_BENCH_HUGETLB=1 (root): 2 MiB hugetlb pages are reserved for SIZE
#      (/proc/sys/vm/nr_hugepages, restored afterwards), then a memset of a hugetlb memfd and
#      kvbrokerd --hugepages 2M.
# The target: the broker ready in at most 1.2x the fastest plain first touch of step 1, 2 or 4
# (and 5 where it runs). SIZE defaults to 16G; the run refuses to start when MemAvailable is
# below SIZE + 1 GiB. Needs python3. Exit 0 when every run worked (whether or not the target
# was met: the table says).
set -eu

B=${1:-build/release}
SIZE=${2:-16G}
for p in kvbrokerd kvbctl; do
	if [ ! -x "$B/bin/$p" ]; then
		echo "bench-startup: $B/bin/$p missing; run: make" >&2
		exit 1
	fi
done
command -v python3 >/dev/null || { echo "bench-startup: python3 needed" >&2; exit 1; }

exec python3 - "$B" "$SIZE" "${KVB_BENCH_HUGETLB:-0}" <<'EOF'
import ctypes, json, mmap, os, signal, subprocess, sys, tempfile, time

B, size_arg, hugetlb = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
units = {"K": 10, "M": 20, "G": 30, "T": 40}
size = int(size_arg[:-1]) << units[size_arg[-1].upper()] if size_arg[-1].isalpha() else int(size_arg)
gib = size / (1 << 30)
NR = "/proc/sys/vm/nr_hugepages"


def avail():
    for line in open("/proc/meminfo"):
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def need_memory(what):
    if avail() < size + (1 << 30):
        sys.exit("bench-startup: %s: MemAvailable %.1f GiB < %.1f GiB + 1 GiB; use a smaller SIZE"
                 % (what, avail() / (1 << 30), gib))


def memset_run(kind):
    """Seconds for one memset of size bytes over a fresh mapping of this kind."""
    need_memory("memset " + kind)
    fd = -1
    if kind == "anon":
        m = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    else:
        flags = os.MFD_HUGETLB | getattr(os, "MFD_HUGE_2MB", 21 << 26) if kind == "hugetlb" else 0
        fd = os.memfd_create("bench-" + kind, flags)
        os.ftruncate(fd, size)
        m = mmap.mmap(fd, size, flags=mmap.MAP_SHARED)
    buf = ctypes.c_char.from_buffer(m)
    t0 = time.monotonic()
    ctypes.memset(ctypes.addressof(buf), 1, size)
    t = time.monotonic() - t0
    del buf
    m.close()
    if fd >= 0:
        os.close(fd)
    return t


def broker_run(extra):
    need_memory("kvbrokerd")
    d = tempfile.mkdtemp(prefix="kvb-startup-")
    sock, log = d + "/sock", d + "/log"
    cmd = [B + "/bin/kvbrokerd", "--socket", sock, "--pool", size_arg] + extra
    with open(log, "w") as lf:
        t0 = time.monotonic()
        p = subprocess.Popen(cmd, stderr=lf)
        st = None
        while st is None:
            if p.poll() is not None:
                sys.exit("bench-startup: %s exited %d:\n%s" % (" ".join(cmd), p.returncode,
                                                                 open(log).read()))
            r = subprocess.run([B + "/bin/kvbctl", "--socket", sock, "status", "--json"],
                               capture_output=True, text=True)
            if r.returncode == 0:
                wall = time.monotonic() - t0
                st = json.loads(r.stdout)
            else:
                time.sleep(0.01)
        p.send_signal(signal.SIGTERM)
        p.wait()
    lines = [l.split(": ", 1)[-1].strip() for l in open(log) if "pool:" in l or "ready in" in l]
    os.unlink(log)
    os.rmdir(d)
    a = st["pool"]["arenas"]
    backing = ", ".join("node %d: %s %s" % (x["node"], x.get("page_size", "?"),
                                             x.get("backing", "")) for x in a)
    return {"cmd": " ".join(cmd[:1] + cmd[3:]), "wall": wall, "startup": st["startup"],
            "backing": backing, "log": lines}


rows, brokers = [], []


def row(name, backing, wall, su=None):
    rows.append((name, backing, wall, su))
    print("# %-28s %7.2f s" % (name, wall), file=sys.stderr, flush=True)


row("memset, anonymous", "4k", memset_run("anon"))
row("memset, memfd (shmem)", "4k", memset_run("shmem"))
r = broker_run([])
brokers.append(r)
row("kvbrokerd (defaults)", r["backing"], r["wall"], r["startup"])
row("memset, anonymous (again)", "4k", memset_run("anon"))

saved = None
if hugetlb:
    saved = int(open(NR).read())
    want = saved + size // (2 << 20)
    open(NR, "w").write("%d\n" % want)
    try:
        if int(open(NR).read()) < want:
            print("# could not reserve %d hugetlb pages" % want, file=sys.stderr)
        else:
            row("memset, hugetlb memfd", "2M", memset_run("hugetlb"))
            r = broker_run(["--hugepages", "2M"])
            brokers.append(r)
            row("kvbrokerd --hugepages 2M", r["backing"], r["wall"], r["startup"])
    finally:
        open(NR, "w").write("%d\n" % saved)

touch = min(w for n, _, w, su in rows if su is None)
print("Start-up of a %s pool (%s), %s, on %d CPUs; reference: the fastest plain first "
      "touch, %.2f s.\n" % (size_arg, time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
                           os.uname().release, os.cpu_count(), touch))
print("| run | pages | reserve s | prefault s | pin s | ready s | wall s | s/GiB | vs touch |")
print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
for name, backing, wall, su in rows:
    if su:
        print("| %s | %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f | %.2fx |" % (
            name, backing, su["reserve_s"], su["prefault_s"], su["pin_s"], su["ready_s"], wall,
            su["ready_s"] / gib, su["ready_s"] / touch))
    else:
        print("| %s | %s | | | | | %.3f | %.3f | %.2fx |" % (name, backing, wall, wall / gib,
                                                          wall / touch))
print()
for r in brokers:
    ready = r["startup"]["ready_s"]
    print("- `%s`: ready in %.2f s = %.2fx the fastest first touch (target <= 1.2x: %s); "
          "wall %.2f s from exec to the first answer." % (
              r["cmd"], ready, ready / touch, "met" if ready <= 1.2 * touch else "NOT met",
              r["wall"]))
    for l in r["log"]:
        print("  - log: %s" % l)
EOF
