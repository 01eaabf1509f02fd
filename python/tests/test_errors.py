# SPDX-License-Identifier: MIT
"""A failed connect names the socket, the cause and the fix (kvb_connect_error), and the
socket is found by the one rule: socket=, else $KVB_SOCKET, else /run/kvbroker/kvbroker.sock,
whatever $XDG_RUNTIME_DIR says. tests/integ/t_messages.c checks the same from C and kvbctl.
"""

from __future__ import annotations

import grp
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvbroker as kvb
from conftest import Broker

FOREIGN_UID = 4242


def test_no_broker_names_the_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "none.sock")
    with pytest.raises(kvb.NoBroker) as ei:
        kvb.connect(path)
    assert ei.value.errno == 2
    assert (ei.value.strerror or "").startswith(f"no broker at {path} (no socket there): start "
                                                f"one with: kvbrokerd --socket {path}")
    assert path in str(ei.value)


def test_no_broker_default_socket_named(monkeypatch: pytest.MonkeyPatch,
                                        tmp_path: Path) -> None:
    monkeypatch.setenv("KVB_SOCKET", str(tmp_path / "env.sock"))
    with pytest.raises(kvb.NoBroker) as ei:
        kvb.connect()
    assert f"no broker at {tmp_path / 'env.sock'} " in (ei.value.strerror or "")


def test_stale_socket(tmp_path: Path) -> None:
    path = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    s.bind(path)  # bound, never listening: a broker that died without removing it
    s.close()
    with pytest.raises(kvb.NoBroker) as ei:
        kvb.connect(path)
    assert ei.value.errno == 111
    msg = ei.value.strerror or ""
    assert "nobody listens" in msg and f"kvbrokerd --socket {path}" in msg


def test_socket_rule_ignores_xdg(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_RUNTIME_DIR", "/run/user/4242")
    monkeypatch.delenv("KVB_SOCKET", raising=False)
    assert kvb.socket_path() == "/run/kvbroker/kvbroker.sock"
    monkeypatch.setenv("KVB_SOCKET", "")  # empty counts as unset
    assert kvb.socket_path() == "/run/kvbroker/kvbroker.sock"
    monkeypatch.setenv("KVB_SOCKET", "/srv/kvb.sock")
    assert kvb.socket_path() == "/srv/kvb.sock"
    assert kvb.socket_path("/given.sock") == "/given.sock"


@pytest.fixture
def open_dir() -> Iterator[Path]:
    """A directory any uid may traverse (pytest's tmp_path is 0700)."""
    d = Path(tempfile.mkdtemp(prefix="kvbpy-perm-"))
    d.chmod(0o711)
    yield d
    shutil.rmtree(d, ignore_errors=True)


def run_as_foreign(code: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    return subprocess.run(["setpriv", f"--reuid={FOREIGN_UID}", f"--regid={FOREIGN_UID}",
                           "--clear-groups", sys.executable, "-c", code],
                          capture_output=True, text=True, env=env, timeout=60)


def test_permission_names_the_group(open_dir: Path) -> None:
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("needs root and setpriv to run a client as another uid")
    try:
        grp.getgrnam("users")
    except KeyError:
        pytest.skip("no group 'users'")
    if run_as_foreign("import kvbroker").returncode:
        pytest.skip(f"uid {FOREIGN_UID} cannot import this kvbroker (its files are private)")
    b = Broker(open_dir, "--group", "users")
    try:
        code = ("import kvbroker as kvb\n"
                "try:\n"
                f"    kvb.connect({b.socket!r})\n"
                "except kvb.Error as e:\n"
                "    print(e.errno, e.strerror)\n")
        out = run_as_foreign(code)
    finally:
        b.stop()
    assert out.returncode == 0, out.stderr
    errno, msg = out.stdout.strip().split(" ", 1)
    assert errno == "13"
    # The socket itself refuses (0660, group users): its owner, group and mode, and the fix.
    assert msg.startswith(f"permission denied at {b.socket}: a broker is running there, but "
                          f"{b.socket} (owner root, group users, mode 0660) admits only uid "
                          "0 (root) and group users"), msg
    assert "usermod -aG users " in msg and "log in again" in msg, msg
    assert "start one" not in msg
