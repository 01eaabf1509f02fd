# SPDX-License-Identifier: MIT
"""Build of kvbroker._kvbroker: the CPython extension with libkvbroker compiled in.

libkvbroker (the repository's client/ and proto/ sources) is compiled into the extension
itself, so the wheel stands alone; -fvisibility=hidden keeps every kvb_* symbol local, so an
engine that also loads libkvbroker.so sees no clash. Only libcrypto (SHA-256 of page keys) is
linked dynamically; CUDA is loaded at run time (dlopen of libcuda.so.1) when $CUDA_HOME
(default /usr/local/cuda) has cuda.h at build time. The extension uses the limited API of
CPython 3.11: one cp311-abi3 wheel serves every later CPython.

The package builds from this repository (pip install ./python, or pip install -e ./python):
the C sources are found one directory up, and so is its version (include/kvbroker.h), which
kvbroker.__version__ reads back from the extension: the package cannot disagree with the
library compiled into it or with the programs built from the same tree.
"""

from __future__ import annotations

import glob
import os
import re

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


def _lib_sources() -> list[str]:
    lib = sorted(glob.glob(os.path.join(ROOT, "client", "*.c")))
    lib += sorted(glob.glob(os.path.join(ROOT, "proto", "*.c")))
    if not lib:
        raise SystemExit(f"kvbroker: libkvbroker sources not found under {ROOT}")
    return lib


class BuildExt(build_ext):
    """Compiles libkvbroker's sources (outside this directory, which setup() arguments may
    not name) with the extension's flags, and links their objects in."""

    def build_extension(self, ext: Extension) -> None:
        objs = self.compiler.compile(
            _lib_sources(), output_dir=self.build_temp, macros=ext.define_macros,
            include_dirs=ext.include_dirs, extra_postargs=ext.extra_compile_args,
            depends=glob.glob(os.path.join(ROOT, "include", "*.h")))
        ext.extra_objects = list(objs)
        super().build_extension(ext)


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
    # common/ for the header-only helpers the library shares with every program (clock.h).
    include_dirs=[os.path.join(ROOT, "include"), os.path.join(ROOT, "proto"),
                  os.path.join(ROOT, "common"), "csrc"],
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
             + glob.glob(os.path.join(ROOT, "common", "clock.h"))
             + glob.glob(os.path.join(ROOT, "client", "*.h"))
             + glob.glob(os.path.join(HERE, "csrc", "*.h"))],
)

setup(version=_version(), ext_modules=[ext], cmdclass={"build_ext": BuildExt},
      options={"bdist_wheel": {"py_limited_api": "cp311"}})
