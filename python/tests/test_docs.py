# SPDX-License-Identifier: MIT
"""The python blocks of README.md and docs/*.md marked runnable run as written, with this
interpreter (which has the package and numpy), against a broker of this build:
tests/docs/run.sh --lang python, whose header gives the convention. tests/integ/t_docs.c runs
every block, sh and python, where it finds such a Python."""

from __future__ import annotations

import os
import subprocess
import sys

from conftest import ROOT, build_dir


def test_runnable_python_blocks() -> None:
    env = dict(os.environ, KVB_PYTHON=sys.executable)
    r = subprocess.run(["sh", str(ROOT / "tests" / "docs" / "run.sh"), str(build_dir()),
                        "--lang", "python"], env=env, capture_output=True, text=True,
                       timeout=120, check=False)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out
    assert "python block(s) skipped" in out and " 0 python block(s) skipped" in out, out
    assert "# 0 block(s) run" not in out, "no runnable python block found:\n" + out
