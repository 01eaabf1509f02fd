# SPDX-License-Identifier: MIT
"""``python -m kvbroker``: where this package's socket, programs, library and header are.

``--path NAME`` prints one of them alone, for scripts: ``cc -I"$(python -m kvbroker --path
include)" ... "$(python -m kvbroker --path lib)"``; ``--json`` prints them all as an object.
"""

from __future__ import annotations

import argparse
import json
import sys

from . import __version__, socket_path
from ._native import INCLUDE, LIB, PROGRAMS, program


def _paths() -> dict[str, str]:
    out = {"version": __version__, "socket": socket_path()}
    for name in PROGRAMS:
        try:
            out[name] = str(program(name))
        except FileNotFoundError:
            out[name] = ""
    out["lib"] = str(LIB / "libkvbroker.so")
    out["include"] = str(INCLUDE)
    out["header"] = str(INCLUDE / "kvbroker.h")
    return out


def main(argv: list[str] | None = None) -> int:
    """Prints the paths; returns the exit status (1 when a program is missing)."""
    ap = argparse.ArgumentParser(
        prog="python -m kvbroker",
        description="Where the broker's socket (--socket, else $KVB_SOCKET, else "
        "/run/kvbroker/kvbroker.sock), this package's programs, library and header are.")
    ap.add_argument("--json", action="store_true", help="all of them as one JSON object")
    ap.add_argument("--path", choices=["socket", *PROGRAMS, "lib", "include", "header"],
                    help="print this one path alone")
    args = ap.parse_args(argv)
    paths = _paths()
    missing = [p for p in PROGRAMS if not paths[p]]
    if args.path:
        if not paths[args.path]:
            print(f"kvbroker: this package has no {args.path} (installed without its "
                  "programs: install the wheel)", file=sys.stderr)
            return 1
        print(paths[args.path])
        return 0
    if args.json:
        print(json.dumps(paths, indent=2))
    else:
        for k, v in paths.items():
            print(f"{k:<10} {v or '(not in this installation: install the wheel)'}")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
