# SPDX-License-Identifier: MIT
"""One version: the package's __version__, its metadata, the library compiled into it, the
programs of the same build (kvbrokerd, kvbctl --version) and a running broker's stats all say
include/kvbroker.h's KVB_VERSION_*. (tests/integ/t_version.c checks the C side among itself.)
"""

from __future__ import annotations

import importlib.metadata
import re
import subprocess

import kvbroker as kvb
from conftest import ROOT, build_dir


def header_version() -> str:
    text = (ROOT / "include" / "kvbroker.h").read_text()
    parts = [re.search(rf"^#define KVB_VERSION_{p} (\d+)$", text, re.M) for p in
             ("MAJOR", "MINOR", "PATCH")]
    assert all(parts), "include/kvbroker.h lacks KVB_VERSION_MAJOR/MINOR/PATCH"
    return ".".join(m.group(1) for m in parts if m)


def program_version(name: str) -> str:
    out = subprocess.run([str(build_dir() / "bin" / name), "--version"], capture_output=True,
                         text=True, check=True, timeout=10).stdout
    prog, version = out.split()
    assert prog == name
    return version


def test_one_version_everywhere(broker) -> None:  # type: ignore[no-untyped-def]
    with kvb.connect(broker.socket, control=True) as c:
        running = c.stats()["version"]
    from kvbroker import _kvbroker

    found = {
        "include/kvbroker.h": header_version(),
        "kvbroker.__version__": kvb.__version__,
        "kvbroker.version()": kvb.version(),
        "VERSION_MAJOR/MINOR/PATCH": (f"{_kvbroker.VERSION_MAJOR}.{_kvbroker.VERSION_MINOR}."
                                      f"{_kvbroker.VERSION_PATCH}"),
        "package metadata": importlib.metadata.version("kvbroker"),
        "kvbrokerd --version": program_version("kvbrokerd"),
        "kvbctl --version": program_version("kvbctl"),
        "the broker's stats": running,
    }
    assert len(set(found.values())) == 1, found
