# SPDX-License-Identifier: MIT
"""A kvbroker.Client rides through a broker restart: kill -9 of a real broker whose
pool a keeper holds, a new broker on the same socket; calls in the gap fail fast with
BrokerGone (or wait with reconnect_ms), afterwards the same objects work and the pages are
intact."""

from __future__ import annotations

import errno
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import pytest

import kvbroker as kvb
from conftest import SMALL, Broker, fresh_keys, page

T = TypeVar("T")


def _until_back(call: Callable[[], T], timeout: float = 10.0) -> T:
    """call() repeated while it raises BrokerGone (the client's backoff), up to timeout."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return call()
        except kvb.BrokerGone:
            assert time.monotonic() < deadline, "the client did not reconnect"
            time.sleep(0.01)


def test_client_rides_through_kill9(tmp_path: Path) -> None:
    b = Broker(tmp_path)
    try:
        c = kvb.connect(b.socket, name="rider")
        ns = c.ns_open(SMALL)
        hb = c.alloc_host(2 * ns.page_bytes)
        mv = memoryview(hb)
        keys = fresh_keys(6)
        for i, k in enumerate(keys[:4]):
            assert ns.put(k, page(ns, 40 + i))
        mv[:ns.page_bytes] = page(ns, 44)
        assert ns.put(keys[4], mv[:ns.page_bytes])  # from the registered host buffer
        ns_id = ns.id

        b.kill()
        # A page the dead broker's pool directory lists is still read without it: nobody
        # writes the pool until a broker adopts it, and that one invalidates the directory.
        assert ns.get(keys[0]) == page(ns, 40)
        t = time.monotonic()
        for _ in range(3):  # the gap: each call fails at once, with a clear exception
            with pytest.raises(kvb.BrokerGone) as ei:
                ns.lookup(keys[:1])
            assert ei.value.errno == errno.ECONNRESET
            assert isinstance(ei.value, ConnectionResetError)
            assert ei.value.strerror
        assert time.monotonic() - t < 1.0

        b = Broker(tmp_path)  # same socket: it adopts the pool the keeper held
        got = _until_back(lambda: ns.get(keys[0]))
        assert got == page(ns, 40)
        for i, k in enumerate(keys[:4]):
            assert ns.get(k) == page(ns, 40 + i)
        assert ns.id == ns_id
        mv[ns.page_bytes:] = bytes(ns.page_bytes)
        assert ns.get_into(keys[4], mv[ns.page_bytes:])  # into the re-registered buffer
        assert bytes(mv[ns.page_bytes:]) == page(ns, 44)
        assert ns.put(keys[5], page(ns, 45)) and ns.get(keys[5]) == page(ns, 45)
        assert ns.lookup(keys[:4]) == 4
        del mv
        c.close()
    finally:
        b.stop()


def test_reconnect_ms_waits_for_the_broker(tmp_path: Path) -> None:
    b = Broker(tmp_path)
    try:
        c = kvb.connect(b.socket, reconnect_ms=8000)
        ns = c.ns_open(SMALL)
        (k,) = fresh_keys(1)
        assert ns.put(k, page(ns, 7))
        b.kill()
        boxes: list[Broker] = []
        starter = threading.Timer(0.3, lambda: boxes.append(Broker(tmp_path)))
        t = time.monotonic()
        starter.start()
        try:
            # The first call may see the hang-up itself (and raise); the next one waits.
            try:
                got = ns.get(k)
            except kvb.BrokerGone:
                got = ns.get(k)
        finally:
            starter.join()
            b = boxes[0] if boxes else b
        assert got == page(ns, 7)
        assert 0.2 < time.monotonic() - t < 8.0
        c.close()
    finally:
        b.stop()


def test_reconnect_off(tmp_path: Path) -> None:
    b = Broker(tmp_path)
    try:
        c = kvb.connect(b.socket, reconnect=False)
        ns = c.ns_open(SMALL)
        (k,) = fresh_keys(1)
        assert ns.put(k, page(ns, 9))
        b.kill()
        b = Broker(tmp_path)
        for _ in range(3):
            with pytest.raises(kvb.BrokerGone):
                ns.get(k)
            time.sleep(0.05)
        c.close()
        with kvb.connect(b.socket) as c2:  # a new client sees the adopted page
            assert c2.ns_open(SMALL).get(k) == page(ns, 9)
    finally:
        b.stop()


def test_aio_batch_to_a_dead_broker(tmp_path: Path) -> None:
    """An AsyncClient batch with no broker fails fast, whole, and leaves nothing waiting;
    with a broker back on the socket the same AsyncClient works again."""
    import asyncio

    from kvbroker.aio import AsyncClient

    b = Broker(tmp_path)
    try:
        c = kvb.connect(b.socket)
        ns = c.ns_open(SMALL)
        (k,) = fresh_keys(1)
        assert ns.put(k, page(ns, 5))
        buf = c.alloc_host(ns.page_bytes)

        async def main() -> None:
            aio = AsyncClient(c)
            try:
                b.kill()
                t = time.monotonic()
                with pytest.raises(kvb.BrokerGone):
                    await aio.nop()
                assert time.monotonic() - t < 2.0
                assert not aio._waiting  # nothing left waiting
                b2 = Broker(tmp_path)
                try:
                    deadline = time.monotonic() + 10
                    while True:
                        try:
                            assert await aio.get_into(ns, k, memoryview(buf))
                            break
                        except kvb.BrokerGone:
                            assert time.monotonic() < deadline, "no reconnect"
                            await asyncio.sleep(0.01)
                    assert bytes(buf) == page(ns, 5)
                finally:
                    b2.stop()
            finally:
                aio.close()

        asyncio.run(main())
        c.close()
    finally:
        b.stop()
