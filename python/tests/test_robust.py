# SPDX-License-Identifier: MIT
"""Failure modes and concurrency: dead brokers, fork, threads, and proof of zero-copy."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvbroker as kvb
from conftest import SMALL, Broker, fresh_keys, page


def test_broker_killed_mid_batch_raises(tmp_path: Path) -> None:
    # Every copy runs on a worker that first sleeps 50 ms: a batch of 64 GETs takes seconds,
    # and the broker is SIGKILLed in the middle of it.
    b = Broker(tmp_path, "--copy-inline", "0", "--copy-delay-us", "50000", "--copy-threads", "1")
    try:
        c = kvb.connect(b.socket)
        ns = c.ns_open(SMALL)
        buf = c.alloc_host(64 * ns.page_bytes)
        mv = memoryview(buf)
        keys = fresh_keys(64)
        slices = [mv[i * ns.page_bytes:(i + 1) * ns.page_bytes] for i in range(64)]
        ns.put_many(keys[:2], slices[:2])
        killer = threading.Timer(0.3, b.kill)
        killer.start()
        t0 = time.monotonic()
        with pytest.raises(kvb.BrokerGone) as ei:
            ns.put_many(keys, slices)
        assert time.monotonic() - t0 < 10
        assert ei.value.errno == 104 and isinstance(ei.value, ConnectionResetError)
        killer.join()
        with pytest.raises(kvb.BrokerGone):  # every later call fails the same way
            c.nop()
        with pytest.raises(kvb.BrokerGone):
            ns.get(keys[0])
        del slices, mv
        c.close()
    finally:
        b.stop()


def test_broker_gone_sync_call(own_broker: Broker) -> None:
    c = kvb.connect(own_broker.socket)
    ns = c.ns_open(SMALL)
    own_broker.kill()
    with pytest.raises(kvb.BrokerGone):
        for _ in range(100):  # the hang-up may take a round trip to be seen
            ns.put(fresh_keys(1)[0], page(ns, 1))
            time.sleep(0.01)
    c.close()


def test_fork_child_raises_parent_unharmed(client: kvb.Client, ns: kvb.Namespace) -> None:
    (k,) = fresh_keys(1)
    ns.put(k, page(ns, 3))
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: every call raises; close() and exit leave the rings alone
        code = 0
        try:
            try:
                client.nop()
                code = 1
            except kvb.ForkedClient as e:
                code = 0 if e.errno == 10 else 2
            try:
                ns.get(k)
                code = 3
            except kvb.ForkedClient:
                pass
            client.close()
        except BaseException:
            code = 4
        os.write(w, bytes([code]))
        os._exit(0)
    os.close(w)
    got = os.read(r, 1)
    os.close(r)
    os.waitpid(pid, 0)
    assert got == b"\x00"
    for _ in range(10):  # the parent's rings are intact
        client.nop()
    assert ns.get(k) == page(ns, 3)


def test_threads_share_one_client(client: kvb.Client, ns: kvb.Namespace) -> None:
    nthreads, rounds = 6, 40
    buf = client.alloc_host(nthreads * 4 * ns.page_bytes)
    mv = memoryview(buf)
    errors: list[BaseException] = []

    def work(t: int) -> None:
        try:
            mine = mv[t * 4 * ns.page_bytes:(t + 1) * 4 * ns.page_bytes]
            slots = [mine[i * ns.page_bytes:(i + 1) * ns.page_bytes] for i in range(4)]
            for r in range(rounds):
                keys = fresh_keys(4)
                data = page(ns, t * 1000 + r)
                for s in slots[:2]:
                    s[:] = data
                if r % 3 == 0:
                    assert ns.put_many(keys[:2], slots[:2]) == [True, True]
                    assert ns.get_many(keys[:2], slots[2:]) == [True, True]
                else:
                    assert ns.put(keys[0], data) and ns.put(keys[1], slots[0])
                    assert ns.get_into(keys[1], slots[2]) and ns.get(keys[0]) == data
                assert bytes(slots[2]) == data
                assert ns.lookup(keys) == 2
                client.nop()
                with ns.acquire(keys[0]) as lease_mv:  # type: ignore[union-attr]
                    assert bytes(lease_mv) == data
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(nthreads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert not errors, errors
    assert all(not th.is_alive() for th in threads)


def test_close_waits_for_other_threads(broker: Broker) -> None:
    c = kvb.connect(broker.socket)
    ns = c.ns_open(SMALL)
    stop = threading.Event()
    seen: list[BaseException] = []

    def spin() -> None:
        while not stop.is_set():
            try:
                ns.put(fresh_keys(1)[0], bytes(ns.page_bytes))
            except kvb.ClientClosed:
                return
            except BaseException as e:
                seen.append(e)
                return

    th = threading.Thread(target=spin)
    th.start()
    time.sleep(0.1)
    c.close()
    stop.set()
    th.join(10)
    assert not seen and c.closed


BIG = kvb.Layout("test/py-big", kvb.MLA, 64, [kvb.Component("kv", 16, 4096)])
"""64 tokens x 16 layers x 4 KiB: 4 MiB pages, copies long enough to race."""


def test_lease_copy_into_races_release_and_close(broker: Broker) -> None:
    # Lease.copy_into() drops the GIL for its copy: a release() or close() from another thread
    # meanwhile must refuse (BufferError) rather than take the page from under the copy, and a
    # copy that ran copied the whole page. A close that unmapped the pool mid-copy would crash
    # the test process.
    c = kvb.connect(broker.socket)
    ns = c.ns_open(BIG)
    (k,) = fresh_keys(1)
    data = bytes(range(256)) * (ns.page_bytes // 256)
    ns.put(k, data)
    refused = {"release": 0, "close": 0}
    for what in ("release", "close"):
        for _ in range(20):
            lease = ns.acquire(k)
            assert lease is not None
            stop, copying = threading.Event(), threading.Event()
            whole: list[bool] = []

            def copier(lease: kvb.Lease = lease, stop: threading.Event = stop,
                       copying: threading.Event = copying, whole: list[bool] = whole) -> None:
                out = np.empty(ns.page_bytes, np.uint8)
                while not stop.is_set():
                    copying.set()
                    try:
                        lease.copy_into(out)
                    except ValueError:
                        return  # released or closed between two copies
                    whole.append(out.tobytes() == data)

            th = threading.Thread(target=copier)
            th.start()
            assert copying.wait(10)
            end = (lease.release if what == "release" else c.close)
            try:
                end()  # lands mid-copy (refused) or between copies (done)
            except BufferError:
                refused[what] += 1
                stop.set()
                th.join(10)
                end()  # nothing is copying now
            th.join(10)
            assert not th.is_alive() and all(whole)
            if what == "close" or refused[what] >= 3:
                break
        if what == "close":
            break
    assert refused["release"] and c.closed


def test_zero_copy_get_lands_in_registered_buffer(broker: Broker,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    # The broker's path: with the pool directory off (kvb_get of a small page into a buffer
    # the library may write is its own copy out of the pool map otherwise, next test), the
    # broker writes the registered buffer, one copy job per GET.
    monkeypatch.setenv("KVB_CLIENT_DIR", "0")
    with kvb.connect(broker.socket, name="pytest") as client:
        ns = client.ns_open(SMALL)
        keys = fresh_keys(4)
        for i, k in enumerate(keys):
            ns.put(k, page(ns, 40 + i))
        buf = client.alloc_host(4 * ns.page_bytes)
        arr = buf.numpy().reshape(4, ns.page_bytes)
        before = client.stats()
        for i, k in enumerate(keys):
            assert ns.get_into(k, arr[i])
        assert ns.get_many(keys, list(arr)) == [True] * 4
        after = client.stats()
        # Every kvb_get counts as a GET, whichever path served it, so the copy jobs are what
        # tell them apart.
        assert after["counters"]["gets"] - before["counters"]["gets"] == 8
        assert copy_jobs(after) - copy_jobs(before) == 8
        for i in range(4):
            assert arr[i].tobytes() == page(ns, 40 + i)
        # Unregistered memory takes the lease path: the client copies (the C API's one
        # memcpy), the broker copies nothing.
        assert ns.get_into(keys[0], np.zeros(ns.page_bytes, np.uint8))
        last = client.stats()
        assert last["counters"]["gets"] == after["counters"]["gets"] + 1
        assert copy_jobs(last) == copy_jobs(after)


def test_directory_get_into_registered_buffer(own_broker: Broker) -> None:
    # [dir] A 4 KiB page into a registered buffer: the library's one copy out of the pool map,
    # told to the broker afterwards (a directory GET), with no broker copy and no round trip.
    # A broker of its own: the directory holds one entry per 32 KiB of pool, so the module's
    # broker, full of earlier tests' 4 KiB pages, leaves some pages unlisted (asked for).
    client = kvb.connect(own_broker.socket)
    ns = client.ns_open(SMALL)
    keys = fresh_keys(4)
    for i, k in enumerate(keys):
        ns.put(k, page(ns, 60 + i))
    arr = client.alloc_host(4 * ns.page_bytes).numpy().reshape(4, ns.page_bytes)
    before = client.stats()
    for i, k in enumerate(keys):
        assert ns.get_into(k, arr[i])
    after = client.stats()
    assert after["counters"]["dir_gets"] - before["counters"]["dir_gets"] == 4
    assert after["counters"]["gets"] - before["counters"]["gets"] == 4
    assert copy_jobs(after) == copy_jobs(before)
    for i in range(4):
        assert arr[i].tobytes() == page(ns, 60 + i)
    client.close()


def copy_jobs(stats: dict[str, Any]) -> int:
    return int(stats["copy"]["inline_jobs"]) + int(stats["copy"]["queued_jobs"])


def test_zero_copy_put_uses_no_staging(tmp_path: Path) -> None:
    # With room for exactly one registered buffer per client, a PUT that needed the library's
    # staging buffer would fail to register it: PUTs from the HostBuffer never do.
    b = Broker(tmp_path, "--max-bufs", "1")
    try:
        with kvb.connect(b.socket) as c:
            ns = c.ns_open(SMALL)
            buf = c.alloc_host(2 * ns.page_bytes)
            mv = memoryview(buf)
            keys = fresh_keys(3)
            assert ns.put(keys[0], mv[: ns.page_bytes])
            assert ns.put_many(keys[1:], [mv[: ns.page_bytes], mv[ns.page_bytes:]]) == [
                True, True]
            with pytest.raises(kvb.Error) as ei:
                ns.put(fresh_keys(1)[0], bytes(ns.page_bytes))  # needs staging: refused
            assert ei.value.errno == 24  # EMFILE: too many buffers
            del mv
    finally:
        b.stop()


def test_gpu_fake_driver(tmp_path: Path) -> None:
    from conftest import build_dir

    fake = build_dir() / "tests" / "fake"
    if not (fake / "libcuda.so.1").exists():
        pytest.skip("built without the CUDA headers: no fake libcuda.so.1")
    env = dict(os.environ, LD_LIBRARY_PATH=str(fake), KVB_FAKE_CUDA=str(fake),
               KVB_TMP=str(tmp_path))
    script = Path(__file__).with_name("gpu_fake_child.py")
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "gpu fake: ok" in r.stdout
