# SPDX-License-Identifier: MIT
"""Build of the kvbroker package: the CPython extension, and the programs, the shared library
and the header of the same C tree.

kvbroker._kvbroker is the CPython extension with libkvbroker compiled in: -fvisibility=hidden
keeps every kvb_* symbol local, so an engine that also loads libkvbroker.so sees no clash.
Only libcrypto (SHA-256 of page keys) is linked dynamically; CUDA is loaded at run time
(dlopen of libcuda.so.1) when $CUDA_HOME (default /usr/local/cuda) has cuda.h at build time.
The extension uses the limited API of CPython 3.11: one cp311-abi3 wheel serves every later
CPython.

Beside it the package carries kvbrokerd, kvbctl and kvbbench (kvbroker/_bin/, started by the
console scripts of the same names), libkvbroker.so (kvbroker/lib/) and kvbroker.h
(kvbroker/include/), built by the repository's Makefile (`make native-stage`): the same
release build, flags and objects as `make`, never a second recipe that could drift from it.
`make wheel` then vendors the C libraries they link with auditwheel.

The C tree is the repository one directory up (pip install ./python, make wheel), or, in an
sdist, its copy in native/ (the sdist command below puts it there): an sdist builds outside
the repository and never reads ../. The version is include/kvbroker.h's, which
kvbroker.__version__ reads back from the extension: the package cannot disagree with the
library compiled into it or with the programs built from the same tree.
"""

from __future__ import annotations

import glob
import os
import re
import shutil
import subprocess

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext
from setuptools.command.sdist import sdist

HERE = os.path.dirname(os.path.abspath(__file__))

# What of the C tree an sdist carries (relative to the repository's root): what `make
# native-stage` compiles, the Makefile and the script it runs at parse time.
NATIVE_FILES = ("Makefile", "tools/deps.sh", "include/*.h", "proto/*.[ch]", "common/*.[ch]",
                "client/*.[ch]", "client/libkvbroker.map", "client/kvbroker.pc.in",
                "broker/*.[ch]", "broker/kernels/*.cu", "broker/kernels/*.h", "tools/*.[ch]",
                "tools/kvbbench/*.[ch]", "tools/kernels/*.cu")


def _root() -> str:
    """The C tree: native/ in an unpacked sdist, else the repository around python/."""
    for root in (os.path.join(HERE, "native"), os.path.dirname(HERE)):
        if os.path.isfile(os.path.join(root, "include", "kvbroker.h")):
            return root
    raise SystemExit(f"kvbroker: the C sources are neither in {HERE}/native (an sdist) nor one "
                     "directory up (a clone of the repository): build from either")


ROOT = _root()


def _lib_sources() -> list[str]:
    lib = sorted(glob.glob(os.path.join(ROOT, "client", "*.c")))
    lib += sorted(glob.glob(os.path.join(ROOT, "proto", "*.c")))
    if not lib:
        raise SystemExit(f"kvbroker: libkvbroker sources not found under {ROOT}")
    return lib


def _make_native(pkg_dir: str) -> None:
    """Builds the programs, libkvbroker.so and the header into pkg_dir with the Makefile."""
    make = os.environ.get("MAKE", "make")
    if shutil.which(make) is None:
        raise SystemExit("kvbroker: building the programs needs make (apt-get install make)")
    cmd = [make, "-C", ROOT, "--no-print-directory", "MODE=release",
           f"KVB_NATIVE_OUT={os.path.abspath(pkg_dir)}", "native-stage"]
    # Run from make (make wheel) the jobserver is inherited; standalone, use every core.
    if "MAKEFLAGS" not in os.environ:
        cmd.insert(1, f"-j{os.cpu_count() or 1}")
    try:
        subprocess.run(cmd, check=True)
    except subprocess.CalledProcessError as e:
        raise SystemExit(f"kvbroker: {' '.join(cmd)} failed (exit {e.returncode}); its output "
                         "above names the cause (tools/deps.sh lists the Debian packages "
                         "the build needs)") from e


class BuildExt(build_ext):
    """Compiles libkvbroker's sources (outside this directory, which setup() arguments may
    not name) with the extension's flags and links their objects in; then has the Makefile
    put the programs, the library and the header beside the extension."""

    def build_extension(self, ext: Extension) -> None:
        objs = self.compiler.compile(
            _lib_sources(), output_dir=self.build_temp, macros=ext.define_macros,
            include_dirs=ext.include_dirs, extra_postargs=ext.extra_compile_args,
            depends=glob.glob(os.path.join(ROOT, "include", "*.h")))
        ext.extra_objects = list(objs)
        super().build_extension(ext)

    def run(self) -> None:
        super().run()
        # The package's directory in the build (or in src/ for pip install -e).
        _make_native(os.path.dirname(self.get_ext_fullpath("kvbroker._kvbroker")))


class SDist(sdist):
    """Copies the C tree into the sdist as native/, so that it builds anywhere."""

    def make_release_tree(self, base_dir: str, files: list[str]) -> None:
        super().make_release_tree(base_dir, files)
        if os.path.join(HERE, "native") == ROOT:
            shutil.copytree(ROOT, os.path.join(base_dir, "native"), dirs_exist_ok=True,
                            ignore=shutil.ignore_patterns("build"))
            return
        for pattern in NATIVE_FILES:
            found = glob.glob(pattern, root_dir=ROOT)
            if not found:
                raise SystemExit(f"kvbroker: sdist: nothing matches {pattern} under {ROOT}")
            for rel in sorted(found):
                dst = os.path.join(base_dir, "native", rel)
                os.makedirs(os.path.dirname(dst), exist_ok=True)
                shutil.copy2(os.path.join(ROOT, rel), dst)


def _version() -> str:
    """kvbroker's one version: KVB_VERSION_MAJOR/MINOR/PATCH of include/kvbroker.h."""
    with open(os.path.join(ROOT, "include", "kvbroker.h")) as f:
        text = f.read()
    parts = [re.search(rf"^#define KVB_VERSION_{p} (\d+)$", text, re.M) for p in
             ("MAJOR", "MINOR", "PATCH")]
    if not all(parts):
        raise SystemExit("kvbroker: no KVB_VERSION_MAJOR/MINOR/PATCH in include/kvbroker.h")
    return ".".join(m.group(1) for m in parts if m)


def _cuda_flags() -> tuple[list[str], list[str]]:
    home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    if os.path.exists(os.path.join(home, "include", "cuda.h")):
        return ["KVB_HAVE_CUDA"], ["-isystem", os.path.join(home, "include")]
    return [], []


cuda_macros, cuda_args = _cuda_flags()
# CI=true makes warnings errors, as the Makefile does for the C tree.
werror = ["-Werror"] if os.environ.get("CI") else []
ext = Extension(
    "kvbroker._kvbroker",
    sources=sorted(glob.glob("csrc/*.c", root_dir=HERE)),
    include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "proto"), "csrc"],
    define_macros=[("_GNU_SOURCE", None), ("Py_LIMITED_API", "0x030B0000")]
    + [(m, "1") for m in cuda_macros],
    extra_compile_args=["-std=gnu11", "-pthread", "-fvisibility=hidden", "-O2",
                        "-Wall", "-Wextra", "-Wno-unused-parameter",
                        "-Wno-missing-field-initializers"] + cuda_args + werror,
    extra_link_args=["-pthread"],
    libraries=["crypto", "dl"],
    py_limited_api=True,
    # The library's sources and headers: an edit there rebuilds the extension.
    depends=[os.path.relpath(p, HERE) for p in _lib_sources()
             + glob.glob(os.path.join(ROOT, "include", "*.h"))
             + glob.glob(os.path.join(ROOT, "proto", "*.h"))
             + glob.glob(os.path.join(ROOT, "client", "*.h"))
             + glob.glob(os.path.join(HERE, "csrc", "*.h"))],
)

setup(version=_version(), ext_modules=[ext],
      cmdclass={"build_ext": BuildExt, "sdist": SDist},
      options={"bdist_wheel": {"py_limited_api": "cp311"}})
