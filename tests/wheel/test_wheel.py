# SPDX-License-Identifier: MIT
"""The wheel (make wheel) installed into venvs of its own, as a user's pip install does.

Run by `make wheel-test` (part of make test) with $KVB_WHEEL_DIR, the directory of the repaired
wheel. The venvs live in a temporary directory outside the repository and see nothing of the
build: no PYTHONPATH, no LD_LIBRARY_PATH, the build's bin/ not on PATH. kvbrokerd, kvbctl and
kvbbench are the wheel's console scripts, the library and header its own. One venv holds the
wheel alone; a second one also reaches build/venv's site-packages (a .pth line, after its own)
for numpy and the pinned engines, so that the README's Python and kvbroker.sglang/.vllm run
against them while kvbroker itself still comes from the wheel (asserted).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import zipfile
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# What a manylinux wheel may leave to the system: glibc's libraries, libgcc_s, the loader.
BASE_LIBS = {"libc.so.6", "libm.so.6", "libpthread.so.0", "libdl.so.2", "librt.so.1",
             "libgcc_s.so.1", "ld-linux-x86-64.so.2", "linux-vdso.so.1"}
# The C libraries the programs link, which the wheel must carry itself.
VENDORED = ("liburing", "libnuma", "libcjson", "libisal", "libhiredis", "libmicrohttpd",
            "libncursesw", "libcrypto")
PROGRAMS = ("kvbrokerd", "kvbctl", "kvbbench")


def _wheel() -> Path:
    d = os.environ.get("KVB_WHEEL_DIR")
    if not d:
        pytest.exit("KVB_WHEEL_DIR is not set: run make wheel-test", returncode=2)
    found = sorted(Path(d).glob("kvbroker-*-manylinux_*.whl"))
    if len(found) != 1:
        pytest.exit(f"want one repaired wheel in {d}, found {found}: run make wheel", returncode=2)
    return found[0]


def _version() -> str:
    text = (ROOT / "include" / "kvbroker.h").read_text()
    return ".".join(re.search(rf"^#define KVB_VERSION_{p} (\d+)$", text, re.M).group(1)  # type: ignore[union-attr]
                    for p in ("MAJOR", "MINOR", "PATCH"))


class Venv:
    """A venv in a directory of its own with the wheel installed by pip."""

    def __init__(self, path: Path, wheel: Path) -> None:
        self.path = path
        base = getattr(sys, "_base_executable", sys.executable)  # build/venv's interpreter
        subprocess.run([base, "-m", "venv", "--without-pip", str(path)],
                       check=True)
        # build/venv's pip installs into it (--python): the same pip, no download of one.
        subprocess.run([sys.executable, "-m", "pip", "--python", str(self.python), "install",
                        "-q", "--no-index", "--no-deps", str(wheel)], check=True)
        purelib = subprocess.run([str(self.python), "-c",
                                  "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                                 check=True, capture_output=True, text=True).stdout.strip()
        self.site = Path(purelib)

    @property
    def bin(self) -> Path:
        return self.path / "bin"

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def env(self, **extra: str) -> dict[str, str]:
        """An environment with nothing of the build in it."""
        env = {"PATH": f"{self.bin}:/usr/local/bin:/usr/bin:/bin", "HOME": str(self.path),
               "LANG": "C.UTF-8", "TMPDIR": os.environ.get("TMPDIR", "/tmp")}
        env.update(extra)
        return env

    def run(self, *cmd: str, cwd: Path | None = None, check: bool = True,
            **extra: str) -> subprocess.CompletedProcess[str]:
        r = subprocess.run(list(cmd), cwd=cwd or self.path, env=self.env(**extra),
                           capture_output=True, text=True, timeout=120)
        if check and r.returncode != 0:
            raise AssertionError(f"{cmd} exited {r.returncode}:\n{r.stdout}\n{r.stderr}")
        return r


@pytest.fixture(scope="session")
def wheel() -> Path:
    return _wheel()


@pytest.fixture(scope="session")
def venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    return Venv(tmp_path_factory.mktemp("wheel") / "venv", wheel)


@pytest.fixture(scope="session")
def engine_venv(tmp_path_factory: pytest.TempPathFactory, wheel: Path) -> Venv:
    v = Venv(tmp_path_factory.mktemp("wheel-engines") / "venv", wheel)
    build_site = Path(sysconfig.get_paths()["purelib"])  # build/venv's: numpy, the engines
    assert not str(build_site).startswith(str(v.path))
    (v.site / "zz_build_venv.pth").write_text(f"{build_site}\n")
    return v


class Broker:
    """kvbrokerd started by the venv's console script, on a socket of its own."""

    def __init__(self, v: Venv, sock: Path) -> None:
        self.sock = str(sock)
        self.log = sock.with_suffix(".log")
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(v.bin / "kvbrokerd"), "--socket", self.sock, "--pool", "64M",
                 "--log-level", "warn"], env=v.env(), cwd=v.path, stdout=log,
                stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 30
        while v.run("kvbctl", "--socket", self.sock, "status", check=False).returncode != 0:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise AssertionError("kvbrokerd did not start:\n" + self.log.read_text())
            time.sleep(0.05)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()


@pytest.fixture(scope="session")
def broker(venv: Venv) -> Iterator[Broker]:
    b = Broker(venv, venv.path.parent / "kvb.sock")
    yield b
    b.stop()


def _elf_files(root: Path) -> list[Path]:
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            with open(p, "rb") as f:
                if f.read(4) == b"\x7fELF":
                    out.append(p)
    return out


def test_wheel_is_manylinux_and_holds_everything(wheel: Path) -> None:
    assert re.fullmatch(rf"kvbroker-{re.escape(_version())}-cp311-abi3-manylinux_2_\d+_x86_64"
                        r"\.whl", wheel.name), wheel.name
    names = set(zipfile.ZipFile(wheel).namelist())
    for want in ("kvbroker/__init__.py", "kvbroker/sglang.py", "kvbroker/vllm/__init__.py",
                 "kvbroker/vllm/connector.py",
                 "kvbroker/__main__.py", "kvbroker/_kvbroker.abi3.so",
                 "kvbroker/lib/libkvbroker.so", "kvbroker/lib/libkvbroker.so.0",
                 "kvbroker/include/kvbroker.h", *(f"kvbroker/_bin/{p}" for p in PROGRAMS)):
        assert want in names, f"{want} missing from {wheel.name}"
    libs = [n for n in names if n.startswith("kvbroker.libs/")]
    for lib in VENDORED:
        assert any(n.startswith(f"kvbroker.libs/{lib}-") for n in libs), (lib, libs)
    # CUDA is loaded at run time, never linked: a wheel with libcuda in it would break GPUs.
    assert not any("libcuda" in n for n in names)


def test_every_elf_needs_only_base_libraries(venv: Venv) -> None:
    files = _elf_files(venv.site / "kvbroker") + _elf_files(venv.site / "kvbroker.libs")
    assert len(files) >= len(PROGRAMS) + 3 + len(VENDORED), files
    for f in files:
        out = subprocess.run(["ldd", str(f)], capture_output=True, text=True, check=True).stdout
        for raw in out.splitlines():
            line = raw.strip()
            assert "not found" not in line, f"{f}: {line}"
            name = line.split()[0]
            target = line.split("=>")[1].split("(")[0].strip() if "=>" in line else name
            if target.startswith(str(venv.site)):
                continue
            assert os.path.basename(name) in BASE_LIBS, f"{f} needs {line} from the system"


def test_package_comes_from_the_wheel(venv: Venv) -> None:
    r = venv.run("python", "-c", "import kvbroker, kvbroker._kvbroker as k; "
                 "print(kvbroker.__file__); print(k.__file__); print(kvbroker.__version__)")
    pkg, ext, version = r.stdout.split()
    assert pkg.startswith(str(venv.site)) and ext.startswith(str(venv.site)), r.stdout
    assert version == _version()
    info = json.loads(venv.run("python", "-m", "kvbroker", "--json",
                               KVB_SOCKET="/tmp/x/kvb.sock").stdout)
    assert info["socket"] == "/tmp/x/kvb.sock"
    assert info["version"] == _version()
    for k in (*PROGRAMS, "lib", "header"):
        assert info[k].startswith(str(venv.site)) and os.path.isfile(info[k]), (k, info[k])
    assert venv.run("python", "-m", "kvbroker", "--path", "header").stdout.strip() == \
        info["header"]
    # Without $KVB_SOCKET: the one default every client and the broker use.
    assert venv.run("python", "-m", "kvbroker", "--path", "socket").stdout.strip() == \
        "/run/kvbroker/kvbroker.sock"


def test_programs_run_from_the_venv(venv: Venv) -> None:
    r = venv.run("kvbrokerd", "--help")
    assert "--pool" in r.stdout + r.stderr
    for p in PROGRAMS:
        assert venv.run(p, "--version").stdout.split()[-1] == _version(), p
    # A mistyped option: the program's own exit status comes back through the console script.
    bad = venv.run("kvbrokerd", "--pol", "1G", check=False)
    assert bad.returncode == 2 and "did you mean --pool?" in bad.stderr, bad


def test_broker_status_json(venv: Venv, broker: Broker) -> None:
    # The console script replaced itself with the program: same pid, the wheel's binary.
    exe = os.readlink(f"/proc/{broker.proc.pid}/exe")
    assert exe == str(venv.site / "kvbroker" / "_bin" / "kvbrokerd"), exe
    st = json.loads(venv.run("kvbctl", "--socket", broker.sock, "status", "--json").stdout)
    assert st["version"] == _version()
    plan = venv.run("kvbctl", "plan", "--model", "kimi-k2.5", "--tp", "8", "--gpu-tokens",
                    "116171", "--host-ram", "300G")
    assert "pool" in plan.stdout


def test_c_library_and_header(venv: Venv, broker: Broker, tmp_path: Path) -> None:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    info = json.loads(venv.run("python", "-m", "kvbroker", "--json").stdout)
    src = tmp_path / "hello.c"
    src.write_text("""
#include <stdio.h>
#include <kvbroker.h>
int main(void)
{
    kvb_client *c;
    int err = kvb_connect(NULL, &c);
    if (err) {
        fprintf(stderr, "kvb_connect: %s\\n", kvb_strerror(err));
        return 1;
    }
    printf("%u.%u.%u\\n", kvb_version() >> 16, (kvb_version() >> 8) & 0xff,
           kvb_version() & 0xff);
    kvb_close(c);
    return 0;
}
""")
    exe = tmp_path / "hello"
    libdir = os.path.dirname(info["lib"])
    subprocess.run([cc, "-std=gnu11", "-o", str(exe), str(src), f"-I{info['include']}",
                    f"-L{libdir}", f"-Wl,-rpath,{libdir}", "-lkvbroker"], check=True)
    r = venv.run(str(exe), KVB_SOCKET=broker.sock)
    assert r.stdout.strip() == _version()


def test_broker_stops_cleanly(venv: Venv, tmp_path: Path) -> None:
    b = Broker(venv, tmp_path / "kvb.sock")
    assert b.stop() == 0, (tmp_path / "kvb.log").read_text()


def test_readme_from_the_wheel(engine_venv: Venv) -> None:
    # The README's runnable blocks (broker, kvbctl, kvbbench, the Python example) with the
    # wheel's programs on PATH and its Python.
    r = subprocess.run(["sh", str(ROOT / "tests" / "docs" / "run.sh"), str(engine_venv.path),
                        "--lang", "all", str(ROOT / "README.md")],
                       env=engine_venv.env(KVB_PYTHON=str(engine_venv.python)),
                       cwd=engine_venv.path, capture_output=True, text=True, timeout=180)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SKIP" not in r.stdout, r.stdout
    assert "1 True" in r.stdout, r.stdout  # the Python example's own output


def test_engine_adapters_against_pinned_engines(engine_venv: Venv) -> None:
    code = """
import sys
import kvbroker, kvbroker.sglang, kvbroker.vllm
import sglang, vllm
print(kvbroker.__file__, kvbroker.sglang.__file__, kvbroker.vllm.__file__)
print(sglang.__version__, vllm.__version__)
print(kvbroker.sglang.KVBrokerStorage.__mro__[1].__module__,
      kvbroker.vllm.KVBrokerConnector.__mro__[1].__module__)
"""
    r = engine_venv.run("python", "-W", "ignore", "-c", code)
    lines = r.stdout.strip().splitlines()
    for f in lines[-3].split():
        assert f.startswith(str(engine_venv.site)), f"{f} is not the wheel's"
    assert lines[-2].split() == ["0.5.23", "0.33.0"], lines[-2]
    # The adapters subclass the engines' own interfaces, not stand-ins.
    bases = lines[-1].split()
    assert bases[0].startswith("sglang.") and bases[1].startswith("vllm."), bases
