# SPDX-License-Identifier: MIT
"""Fixtures: a real kvbrokerd on a private socket, and clients of it.

The broker binary comes from $KVB_BUILD_DIR (what `make pytest` passes: build/release, or
build/release-nocuda without the CUDA headers), else the first of those that exists.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

import kvbroker as kvb

ROOT = Path(__file__).resolve().parents[2]


def build_dir() -> Path:
    env = os.environ.get("KVB_BUILD_DIR")
    if env:
        return Path(env).resolve()  # relative to the working directory
    for name in ("build/release", "build/release-nocuda"):
        if (ROOT / name / "bin" / "kvbrokerd").exists():
            return ROOT / name
    pytest.exit("kvbrokerd not built: run make first", returncode=2)


class Broker:
    """A kvbrokerd child process on its own socket; stop() or kill() ends it."""

    def __init__(self, tmp: Path, *args: str, env: dict[str, str] | None = None) -> None:
        self.socket = str(tmp / "kvb.sock")
        self.log = tmp / "kvbrokerd.log"
        cmd = [str(build_dir() / "bin" / "kvbrokerd"), "--socket", self.socket,
               "--pool", "64M", "--log-level", "warn", *args]
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         env=env, start_new_session=True)
        deadline = time.monotonic() + 30
        while True:
            try:
                kvb.connect(self.socket, control=True).close()
                break
            except kvb.Error:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError("kvbrokerd did not start:\n" + self.log_text()) from None
                time.sleep(0.02)

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.kill()
        # A killed broker leaves its pool keeper waiting for the next one (keeper.c); it
        # exits within a second once its socket file is gone. A clean exit already freed it.
        Path(self.socket + ".keep").unlink(missing_ok=True)


@pytest.fixture(scope="module")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Broker]:
    b = Broker(tmp_path_factory.mktemp("broker"))
    yield b
    b.stop()


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[Broker]:
    """A broker for one test (which may kill it)."""
    b = Broker(tmp_path)
    yield b
    b.stop()


@pytest.fixture
def client(broker: Broker) -> Iterator[kvb.Client]:
    with kvb.connect(broker.socket, name="pytest") as c:
        yield c


SMALL = kvb.Layout("test/py", kvb.MLA, 16, [kvb.Component("kv", 4, 64)])
"""16 tokens x 4 layers x 64 bytes: 4 KiB pages."""


@pytest.fixture
def ns(client: kvb.Client) -> kvb.Namespace:
    return client.ns_open(SMALL)


_seq = [0]


def fresh_keys(n: int) -> list[bytes]:
    """Keys no other test used (page keys of a counter)."""
    _seq[0] += 1
    return kvb.page_keys([_seq[0], os.getpid(), *range(n * 16)], 16)[:n] if n else []


def page(ns: kvb.Namespace, seed: int) -> bytes:
    """Deterministic page content."""
    return bytes((seed * 31 + i * 7) & 0xFF for i in range(ns.page_bytes))


def prefix_stored(ns: kvb.Namespace, keys: Sequence[bytes] | bytes) -> int:
    """How many pages of a chain are stored; fails the test when a stored page follows a
    missing one (stranded: a prefix lookup never reaches it). keys: the chain, in order."""
    _, tiers = ns.lookup_tiers(keys)
    stored = [t != kvb.TIER_NONE for t in tiers]
    n = sum(stored)
    assert stored == [True] * n + [False] * (len(stored) - n), stored
    return n


@pytest.fixture(scope="module")
def gloo() -> Iterator[Any]:
    """A single-rank gloo process group with SGLang's parallel context set to TP rank 0 of 1,
    as SGLang's scheduler sets it before it builds its caches.
    """
    import socket

    import torch.distributed as dist
    from sglang.srt.runtime_context import get_parallel

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=0, world_size=1)
    with get_parallel().override(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1,
                                 attn_dcp_size=1, attn_dcp_rank=0):
        yield dist.group.WORLD
    dist.destroy_process_group()
