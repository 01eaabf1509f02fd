# SPDX-License-Identifier: MIT
"""The programs, the shared library and the header the package carries, and the console
scripts that start the programs.

A wheel (``make wheel``) holds kvbrokerd, kvbctl and kvbbench in ``kvbroker/_bin``,
libkvbroker.so in ``kvbroker/lib`` and kvbroker.h in ``kvbroker/include``: the release build
of the same tree as the extension, with the C libraries they link vendored beside them by
auditwheel. pip puts a console script for each program on the environment's ``bin/``; it
replaces itself with the program (exec: same pid, signals and exit status, as systemd's
``Type=notify`` and ``kill`` need).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import NoReturn

PACKAGE = Path(__file__).resolve().parent
BIN = PACKAGE / "_bin"
LIB = PACKAGE / "lib"
INCLUDE = PACKAGE / "include"
PROGRAMS = ("kvbrokerd", "kvbctl", "kvbbench")


def program(name: str) -> Path:
    """The path of one of the package's programs (``kvbrokerd``, ``kvbctl``, ``kvbbench``)."""
    if name not in PROGRAMS:
        raise ValueError(f"kvbroker: no program {name!r}: the package has {', '.join(PROGRAMS)}")
    path = BIN / name
    if not os.access(path, os.X_OK):
        raise FileNotFoundError(
            f"kvbroker: {path} is missing: this kvbroker package was installed without its "
            "programs; install the wheel (make wheel, then pip install build/wheel/kvbroker-*.whl)"
            " or use the programs of a make build (build/release/bin)")
    return path


def _exec(name: str) -> NoReturn:
    try:
        path = program(name)
    except FileNotFoundError as e:
        print(e, file=sys.stderr)
        sys.exit(127)
    os.execv(path, [name, *sys.argv[1:]])


def kvbrokerd() -> NoReturn:
    """Console script: kvbrokerd, the broker."""
    _exec("kvbrokerd")


def kvbctl() -> NoReturn:
    """Console script: kvbctl, the broker's control and inspection tool."""
    _exec("kvbctl")


def kvbbench() -> NoReturn:
    """Console script: kvbbench, the load generator."""
    _exec("kvbbench")
