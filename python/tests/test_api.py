# SPDX-License-Identifier: MIT
"""Every call of the package against a real kvbrokerd."""

from __future__ import annotations

import array
import sys

import numpy as np
import pytest

import kvbroker as kvb
from conftest import SMALL, fresh_keys, page


def test_import_pulls_in_no_numpy_or_torch() -> None:
    import subprocess

    code = "import sys, kvbroker; print([m for m in ('numpy', 'torch') if m in sys.modules])"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_version() -> None:
    assert kvb.version().count(".") == 2
    assert kvb.strerror(-2).startswith("not stored")


def test_connect_context_manager(broker) -> None:  # type: ignore[no-untyped-def]
    with kvb.connect(broker.socket, name="ctx", numa_node=0) as c:
        assert not c.closed
        c.nop()
    assert c.closed
    c.close()  # idempotent
    with pytest.raises(kvb.ClientClosed) as ei:
        c.nop()
    assert ei.value.errno == 9 and isinstance(ei.value, OSError)


def test_connect_env_socket(broker, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("KVB_SOCKET", broker.socket)
    with kvb.Client() as c:
        c.nop()


def test_no_broker(tmp_path) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(kvb.NoBroker) as ei:
        kvb.connect(str(tmp_path / "nothing.sock"))
    assert ei.value.errno in (2, 111)
    assert isinstance(ei.value, kvb.Error) and isinstance(ei.value, ConnectionError)
    # kvb_connect_error()'s text: the socket tried and how to start a broker there.
    msg = ei.value.strerror or ""
    assert str(tmp_path / "nothing.sock") in msg and "kvbrokerd --socket" in msg


def test_bad_gpu_busid(broker) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(kvb.Error) as ei:
        kvb.connect(broker.socket, gpu_busid="not a bus id")
    assert ei.value.errno == 22


def test_stats_is_a_dict(client: kvb.Client) -> None:
    s = client.stats()
    assert s["clients"] >= 1 and "counters" in s


def test_control_client(broker) -> None:  # type: ignore[no-untyped-def]
    with kvb.connect(broker.socket, control=True) as c:
        assert "pool" in c.stats()
        with pytest.raises(kvb.Error) as ei:
            c.nop()
        assert ei.value.errno == 95


def test_put_get_roundtrip(ns: kvb.Namespace) -> None:
    assert ns.page_bytes == 4096 == SMALL.page_bytes
    (k,) = fresh_keys(1)
    data = page(ns, 1)
    assert ns.get(k) is None
    assert ns.put(k, data) is True
    assert ns.put(k, bytearray(data)) is False  # already stored: nothing copied
    assert ns.get(k) == data
    out = bytearray(ns.page_bytes + 10)
    assert ns.get(k, out) is out and out[: ns.page_bytes] == data
    arr = np.zeros(ns.page_bytes, np.uint8)
    assert ns.get_into(k, arr) and arr.tobytes() == data
    assert ns.get_into(fresh_keys(1)[0], arr) is False


@pytest.mark.parametrize("kind", ["bytes", "bytearray", "memoryview", "array", "numpy", "torch"])
def test_any_buffer_is_a_source_and_destination(ns: kvb.Namespace, kind: str) -> None:
    (k,) = fresh_keys(1)
    data = page(ns, 7)
    src: object
    dst: object
    if kind == "bytes":
        src, dst = data, None
    elif kind == "bytearray":
        src, dst = bytearray(data), bytearray(ns.page_bytes)
    elif kind == "memoryview":
        src, dst = memoryview(data), memoryview(bytearray(ns.page_bytes))
    elif kind == "array":
        src, dst = array.array("B", data), array.array("B", bytes(ns.page_bytes))
    elif kind == "numpy":
        src = np.frombuffer(data, np.uint8).view(np.float16).reshape(64, 32)
        dst = np.zeros((64, 32), np.float16)
    else:
        torch = pytest.importorskip("torch")
        src = torch.frombuffer(bytearray(data), dtype=torch.bfloat16)
        dst = torch.zeros(ns.page_bytes // 2, dtype=torch.bfloat16)
    assert ns.put(k, src)
    if dst is None:
        assert ns.get(k) == data
        return
    assert ns.get_into(k, dst)
    if kind == "torch":
        assert dst.view(torch.uint8).numpy().tobytes() == data  # type: ignore[attr-defined]
    else:
        assert bytes(memoryview(dst).cast("B")) == data  # type: ignore[arg-type]


def test_bad_sizes_and_keys(ns: kvb.Namespace) -> None:
    (k,) = fresh_keys(1)
    with pytest.raises(ValueError, match="4096"):
        ns.put(k, bytes(ns.page_bytes - 1))
    with pytest.raises(ValueError, match="4096"):
        ns.put(k, bytes(ns.page_bytes + 1))
    with pytest.raises(ValueError):
        ns.get_into(k, bytearray(ns.page_bytes - 1))
    with pytest.raises(BufferError):
        ns.get_into(k, bytes(ns.page_bytes))  # read-only destination
    with pytest.raises(ValueError, match="32 bytes"):
        ns.put(b"short", bytes(ns.page_bytes))
    with pytest.raises(TypeError):
        ns.put("a str is not a key", bytes(ns.page_bytes))  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        ns.put(k, 12345)
    with pytest.raises(ValueError):
        ns.get_into(k, np.zeros((64, 128), np.uint8)[:, ::2])  # not contiguous


def test_lookup_and_tiers(ns: kvb.Namespace) -> None:
    keys = fresh_keys(6)
    for k in keys[:4]:
        ns.put(k, page(ns, 3))
    assert ns.lookup(keys) == 4
    assert ns.lookup(b"".join(keys)) == 4  # one bytes object of n * 32 bytes
    assert ns.lookup([]) == 0
    hits, tiers = ns.lookup_tiers(keys)
    assert hits == 4 and tiers == [kvb.TIER_RAM] * 4 + [kvb.TIER_NONE] * 2
    ns.delete(keys[1])
    assert ns.lookup(keys) == 1
    assert ns.lookup_tiers(keys)[1][2] == kvb.TIER_RAM  # tiers of every key, past the miss
    with pytest.raises(ValueError):
        ns.lookup(b"x" * 33)


def test_lookup_many_keys(ns: kvb.Namespace) -> None:
    keys = fresh_keys(1024)
    ns.put_many(keys[:1000], [page(ns, 5)] * 1000)
    assert ns.lookup(keys) == 1000


def test_delete(ns: kvb.Namespace) -> None:
    (k,) = fresh_keys(1)
    assert ns.delete(k) is False
    ns.put(k, page(ns, 2))
    assert ns.delete(k) is True
    assert ns.get(k) is None


def test_prefetch(ns: kvb.Namespace) -> None:
    keys = fresh_keys(3)
    ns.put(keys[0], page(ns, 4))
    ns.prefetch(keys)  # missing keys are skipped, not errors


def test_nop(client: kvb.Client) -> None:
    for _ in range(100):
        client.nop()


def test_acquire_is_a_readonly_memoryview(ns: kvb.Namespace) -> None:
    (k,) = fresh_keys(1)
    assert ns.acquire(k) is None
    data = page(ns, 9)
    ns.put(k, data)
    lease = ns.acquire(k)
    assert lease is not None and lease.held and lease.nbytes == ns.page_bytes
    with lease as mv:
        assert mv.readonly and bytes(mv) == data
        with pytest.raises(TypeError):
            mv[0] = 1
    assert not lease.held
    with pytest.raises(ValueError):
        mv.tobytes()  # released with the block
    lease.release()  # idempotent


def test_lease_copy_into(ns: kvb.Namespace) -> None:
    (k,) = fresh_keys(1)
    data = page(ns, 12)
    ns.put(k, data)
    lease = ns.acquire(k)
    assert lease is not None
    whole = np.zeros(ns.page_bytes, np.uint8)
    assert lease.copy_into(whole) == ns.page_bytes and whole.tobytes() == data
    tail = bytearray(100)
    assert lease.copy_into(tail, offset=ns.page_bytes - 100) == 100
    assert bytes(tail) == data[-100:]
    with pytest.raises(ValueError):
        lease.copy_into(tail, offset=ns.page_bytes - 99)
    with pytest.raises(ValueError):
        lease.copy_into(tail, offset=-1)
    with pytest.raises(TypeError):
        lease.copy_into(b"read-only")
    lease.release()  # nothing left exported by the copies
    with pytest.raises(ValueError):
        lease.copy_into(tail)


def test_lease_refuses_release_while_referenced(ns: kvb.Namespace) -> None:
    (k,) = fresh_keys(1)
    ns.put(k, page(ns, 10))
    lease = ns.acquire(k)
    assert lease is not None
    arr = np.frombuffer(memoryview(lease), np.uint8)
    with pytest.raises(BufferError):
        lease.release()
    del arr
    lease.release()
    assert not lease.held


def test_close_refuses_while_lease_data_referenced(broker) -> None:  # type: ignore[no-untyped-def]
    c = kvb.connect(broker.socket)
    ns = c.ns_open(SMALL)
    (k,) = fresh_keys(1)
    ns.put(k, page(ns, 11))
    lease = ns.acquire(k)
    assert lease is not None
    view = lease.data
    with pytest.raises(BufferError):
        c.close()
    assert not c.closed
    view.release()
    c.close()
    assert c.closed and not lease.held
    lease.release()  # no-op after close


def test_host_buffer(client: kvb.Client, ns: kvb.Namespace) -> None:
    buf = client.alloc_host(3 * ns.page_bytes)
    assert buf.registered and buf.nbytes == 3 * ns.page_bytes and len(buf) == buf.nbytes
    arr = buf.numpy()
    assert arr.flags.writeable and arr.nbytes == buf.nbytes
    mv = memoryview(buf)
    assert not mv.readonly
    keys = fresh_keys(3)
    for i, k in enumerate(keys):
        arr[i * ns.page_bytes:(i + 1) * ns.page_bytes] = i + 1
        assert ns.put(k, mv[i * ns.page_bytes:(i + 1) * ns.page_bytes])
    arr[:] = 0
    assert ns.get_into(keys[2], mv[0:ns.page_bytes])
    assert (arr[: ns.page_bytes] == 3).all() and (arr[ns.page_bytes:] == 0).all()
    assert client.locate(mv[ns.page_bytes:]) == (buf.id, ns.page_bytes, 2 * ns.page_bytes)
    assert client.locate(bytearray(8)) is None
    f32 = buf.numpy(np.float32)
    assert f32.dtype == np.float32
    buf.unregister()
    assert not buf.registered
    arr[0] = 42  # the memory is the buffer's: still usable after unregister
    assert client.locate(mv) is None
    buf.unregister()  # idempotent


def test_host_buffer_outlives_client(broker) -> None:  # type: ignore[no-untyped-def]
    c = kvb.connect(broker.socket)
    buf = c.alloc_host(4096)
    arr = buf.numpy()
    c.close()  # does not refuse: the memory is ours, not the library's
    arr[:] = 7
    assert not buf.registered and bytes(memoryview(buf))[:2] == b"\x07\x07"


def test_register_host_fd(client: kvb.Client, ns: kvb.Namespace, tmp_path) -> None:  # type: ignore[no-untyped-def]
    import mmap
    import os

    fd = os.memfd_create("engine-pool", os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, 4 * ns.page_bytes)
        # Unsealed: refused unless the package may seal it.
        with pytest.raises(kvb.Error) as ei:
            client.register_host_fd(fd, 2 * ns.page_bytes, ns.page_bytes)
        if ei.value.errno == 95:
            pytest.skip("broker without register-by-fd (ABI < 1.2)")
        assert ei.value.errno == 1  # EPERM: F_SEAL_SHRINK missing
        engine_map = mmap.mmap(fd, 4 * ns.page_bytes)
        buf = client.register_host_fd(fd, 2 * ns.page_bytes, ns.page_bytes, seal=True,
                                      mapped=memoryview(engine_map)[ns.page_bytes:])
        (k,) = fresh_keys(1)
        engine_map[ns.page_bytes:2 * ns.page_bytes] = page(ns, 12)
        assert ns.put(k, memoryview(engine_map)[ns.page_bytes:2 * ns.page_bytes])
        assert ns.get_into(k, memoryview(engine_map)[2 * ns.page_bytes:3 * ns.page_bytes])
        assert engine_map[2 * ns.page_bytes:3 * ns.page_bytes] == page(ns, 12)
        # A second registration mapped by the package itself.
        own = client.register_host_fd(fd, ns.page_bytes, 3 * ns.page_bytes)
        assert bytes(memoryview(own)[:4]) == bytes(4)
        own.unregister()
        buf.unregister()
        del buf
        with pytest.raises(kvb.Error) as ei:
            client.register_host_fd(fd, 8 * ns.page_bytes)  # past the file's end
        assert ei.value.errno == 14
    finally:
        os.close(fd)


def test_register_unsealable_fd_with_fdcopy(client: kvb.Client, ns: kvb.Namespace) -> None:
    import mmap
    import os

    fd = os.memfd_create("sglang-like")  # no MFD_ALLOW_SEALING: can never be sealed
    try:
        os.ftruncate(fd, 4 * ns.page_bytes)
        with pytest.raises(kvb.Error) as ei:
            client.register_host_fd(fd, 4 * ns.page_bytes, seal=True)
        assert ei.value.errno == 1  # EPERM: cannot be sealed
        engine_map = mmap.mmap(fd, 4 * ns.page_bytes)
        mv = memoryview(engine_map)
        try:
            buf = client.register_host_fd(fd, 4 * ns.page_bytes, seal=True, fdcopy=True,
                                          mapped=mv)
        except kvb.Error as e:
            if e.errno == 22:
                pytest.skip("library without KVB_BUF_FDCOPY")
            raise
        keys = fresh_keys(2)
        mv[: ns.page_bytes] = page(ns, 21)
        assert ns.put(keys[0], mv[: ns.page_bytes])  # the broker preads the file
        assert ns.put_many([keys[1]], [mv[: ns.page_bytes]]) == [True]
        assert ns.get_into(keys[0], mv[ns.page_bytes:2 * ns.page_bytes])  # and pwrites it
        assert ns.get_many([keys[1]], [mv[2 * ns.page_bytes:3 * ns.page_bytes]]) == [True]
        assert bytes(mv[ns.page_bytes:2 * ns.page_bytes]) == page(ns, 21)
        assert bytes(mv[2 * ns.page_bytes:3 * ns.page_bytes]) == page(ns, 21)
        buf.unregister()
        del buf
        mv.release()
        engine_map.close()
    finally:
        os.close(fd)


def test_batches(client: kvb.Client, ns: kvb.Namespace) -> None:
    n = 12
    keys = fresh_keys(n)
    buf = client.alloc_host(n * ns.page_bytes)
    arr = buf.numpy().reshape(n, ns.page_bytes)
    for i in range(n):
        arr[i] = i
    mv = memoryview(buf)
    srcs: list[object] = [mv[i * ns.page_bytes:(i + 1) * ns.page_bytes] for i in range(n)]
    srcs[3] = bytes([3]) * ns.page_bytes  # unregistered members go the synchronous way
    assert ns.put_many(keys, srcs) == [True] * n
    assert ns.put_many(keys[:2], srcs[:2]) == [False, False]
    arr[:] = 0
    outs: list[object] = [*srcs[:-1], bytearray(ns.page_bytes)]
    outs[3] = bytearray(ns.page_bytes)
    missing = fresh_keys(1)[0]
    assert ns.get_many([*keys[:-1], missing], outs) == [True] * (n - 1) + [False]
    for i in range(n - 1):
        if i != 3:
            assert (arr[i] == i).all()
    with pytest.raises(ValueError):
        ns.put_many(keys, srcs[:-1])
    with pytest.raises(ValueError):
        ns.put_many(keys[:1], [b"x"])
    assert ns.put_many([], []) == []


def test_views_with_layer_ranges(client: kvb.Client) -> None:
    layout = kvb.Layout("test/py-view", kvb.MHA, 16, [kvb.Component("k", 4, 64),
                                                      kvb.Component("v", 4, 64)],
                        tp_size=2, tp_rank=1)
    ns = client.ns_open(layout)
    slots = 64
    bufs = [client.alloc_host(slots * 64) for _ in range(layout.nparts)]
    parts = [kvb.ViewPart(b, 64) for b in bufs]
    arrs = [b.numpy().reshape(slots, 64) for b in bufs]
    with pytest.raises(ValueError):
        ns.view(parts[:-1])
    with ns.view(parts) as view:
        for p, a in enumerate(arrs):
            a[0:16] = p + 1
        keys = fresh_keys(2)
        assert view.put(keys[0], 0)
        assert view.put(keys[0], 0) is False
        assert view.put_many([keys[1]], [0]) == [True]
        # The page in canonical order, read whole.
        got = ns.get(keys[0])
        assert got is not None and got[:64] == bytes([1]) * 64 and got[-1] == 8
        assert view.get(keys[0], 16, layers=range(1, 3))
        assert (arrs[0][16:32] == 0).all() and (arrs[1][16:32] == 2).all()
        assert (arrs[3][16:32] == 0).all() and (arrs[5][16:32] == 6).all()
        assert view.get_many(keys, [32, 48]) == [True, True]
        assert (arrs[7][48:64] == 8).all()
        assert view.get(fresh_keys(1)[0], 0) is False
        with pytest.raises(ValueError):
            view.get(keys[0], 0, layers=range(2, 2))
        with pytest.raises(kvb.Error):
            view.get(keys[0], 0, layers=range(0, 9))
    with pytest.raises(kvb.Error):
        view.put(keys[0], 0)  # destroyed


def test_view_page_stride(client: kvb.Client) -> None:
    layout = kvb.Layout("test/py-pstride", kvb.MLA, 4, [kvb.Component("kv", 2, 32)])
    ns = client.ns_open(layout)
    buf = client.alloc_host(8192)
    # vLLM-like: [block][layer][token][32]: layer l of page p at p * 256 + l * 128.
    parts = [kvb.ViewPart(buf, 32, base=l * 128, page_stride=256) for l in range(2)]
    try:
        view = ns.view(parts)
    except kvb.Error as e:
        if e.errno == 95:
            pytest.skip("broker without page_stride views (ABI < 1.2)")
        raise
    arr = buf.numpy()
    arr[256:512] = np.arange(256, dtype=np.uint8)
    (k,) = fresh_keys(1)
    assert view.put(k, 4)  # slot 4: page 1 of the buffer
    got = ns.get(k)
    assert got == bytes(arr[256:512])
    view.destroy()


def test_low_level_submit_reap(client: kvb.Client, ns: kvb.Namespace) -> None:
    buf = client.alloc_host(2 * ns.page_bytes)
    keys = fresh_keys(2)
    buf.numpy()[:] = 5
    ops = [kvb.Op(kvb.OP_PUT, ns=ns.id, buf=buf.id, key=keys[0], user_data=1),
           kvb.Op(kvb.OP_NOP, user_data=2)]
    assert client.submit(ops) == 2
    got = sorted(client.reap(8, 2))
    assert [(c.user_data, c.res) for c in got] == [(1, 0), (2, 0)]
    client.submit([kvb.Op(kvb.OP_ACQUIRE, ns=ns.id, key=keys[0], user_data=3),
                   kvb.Op(kvb.OP_GET, ns=ns.id, buf=buf.id, key=keys[1],
                          off=ns.page_bytes, user_data=4)])
    done = {c.user_data: c for c in client.reap(8, 2, timeout_ms=5000)}
    assert done[4].res == -2
    lease = done[3].lease
    assert lease is not None and bytes(lease.data)[:3] == b"\x05\x05\x05"
    lease.release()
    assert client.reap(8, 0, 0) == []
    assert client.reap(8, 1, timeout_ms=10) == []  # timed out: nothing lost, nothing came
    with pytest.raises(ValueError):
        client.submit([kvb.Op(kvb.OP_NOP, user_data=1 << 63)])
    with pytest.raises(kvb.Error):
        client.submit([kvb.Op(99)])


def test_completion_fd_with_asyncio(client: kvb.Client, ns: kvb.Namespace) -> None:
    import asyncio

    from kvbroker.aio import AsyncClient

    try:
        fd = client.completion_fd()
    except kvb.Error as e:
        if e.errno == 95:
            pytest.skip("library without the completion fd")
        raise
    assert fd >= 0 and client.completion_fd() == fd
    buf = client.alloc_host(2 * ns.page_bytes)
    keys = fresh_keys(2)

    async def main() -> list[bool]:
        aio = AsyncClient(client)
        try:
            mv = memoryview(buf)
            mv[: ns.page_bytes] = page(ns, 13)
            assert await aio.put(ns, keys[0], mv[: ns.page_bytes])
            res = await asyncio.gather(aio.get_into(ns, keys[0], mv[ns.page_bytes:]),
                                       aio.get_into(ns, keys[1], mv[ns.page_bytes:]),
                                       aio.nop())
            return [bool(r) for r in res[:2]]
        finally:
            aio.close()

    assert asyncio.run(main()) == [True, False]
    assert bytes(memoryview(buf)[ns.page_bytes:]) == page(ns, 13)


def test_layout_validation() -> None:
    with pytest.raises(ValueError):
        kvb.Layout("m", "gqa", 16, [kvb.Component("kv", 1, 1)])
    with pytest.raises(ValueError):
        kvb.Layout("m", kvb.MLA, 16, [])
    with pytest.raises(ValueError):
        kvb.Layout("m", kvb.MLA, 16, [kvb.Component("kv", 1, 1)], tp_size=2, tp_rank=2)
    with pytest.raises(ValueError):
        kvb.Layout("m", kvb.MLA, 16, [kvb.Component("kv", 1, 1)], dtype="fp13")
    with pytest.raises(ValueError):
        kvb.Component("a-name-that-is-too-long", 1, 1)
    lay = kvb.Layout("m", 1, 16, [kvb.Component("kv", 2, 8)], byte_layout="x:y")
    assert lay.kind == kvb.MLA and lay.page_format == "x:y" and lay.page_bytes == 256
    assert kvb.dtype_code("torch.bfloat16") == kvb.dtype_code("bf16") == 2


def test_identity_separates_namespaces(client: kvb.Client) -> None:
    base = kvb.Layout("test/py-ident", kvb.MLA, 16, [kvb.Component("kv", 4, 64)])
    a = client.ns_open(base)
    same_tp = client.ns_open(kvb.Layout("test/py-ident", kvb.MLA, 16,
                                        [kvb.Component("kv", 4, 64)], tp_size=8, tp_rank=3))
    assert a.id == same_tp.id  # MLA: shared across TP ranks
    try:
        other = client.ns_open(kvb.Layout("test/py-ident", kvb.MLA, 16,
                                          [kvb.Component("kv", 4, 64)], dtype="bf16"))
        pp = client.ns_open(kvb.Layout("test/py-ident", kvb.MLA, 16,
                                       [kvb.Component("kv", 4, 64)], pp_size=2, pp_rank=1))
        dp = client.ns_open(kvb.Layout("test/py-ident", kvb.MLA, 16,
                                       [kvb.Component("kv", 4, 64)], dp_size=2, dp_rank=1))
    except kvb.Error as e:
        if e.errno == 95:
            pytest.skip("broker without identity fields (ABI < 1.2)")
        raise
    assert other.id != a.id and pp.id != a.id and pp.id != other.id
    assert dp.id == a.id  # DP replicas share
    assert a.layout is base and a.client is client


def test_disk_tier_tiers_and_prefetch(tmp_path) -> None:  # type: ignore[no-untyped-def]
    import time

    from conftest import Broker

    b = Broker(tmp_path, "--pool", "32M", "--disk", str(tmp_path / "cache"),
               "--disk-size", "128M")
    try:
        with kvb.connect(b.socket) as c:
            lay = kvb.Layout("test/py-disk", kvb.MLA, 16, [kvb.Component("kv", 4, 1024)])
            ns = c.ns_open(lay)
            keys = kvb.page_keys(list(range(16 * 600)), 16)
            buf = c.alloc_host(ns.page_bytes)
            assert all(ns.put_many(keys, [buf] * len(keys)))
            deadline = time.monotonic() + 10
            while True:  # demotion runs in the background
                hits, tiers = ns.lookup_tiers(keys)
                if kvb.TIER_DISK in tiers or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            assert hits == len(keys) and kvb.TIER_DISK in tiers
            cold = [k for k, t in zip(keys, tiers, strict=True) if t == kvb.TIER_DISK][:8]
            before = c.stats()["disk"]["promotions"]
            ns.prefetch(cold)
            assert ns.lookup_tiers(cold)[1] == [kvb.TIER_RAM] * len(cold)
            assert c.stats()["disk"]["promotions"] >= before + len(cold)
            out = bytearray(ns.page_bytes)
            assert ns.get_into(cold[0], out)
    finally:
        b.stop()


def test_every_public_name_has_a_docstring() -> None:
    import inspect

    import kvbroker.aio

    missing = []
    for mod in (kvb, kvbroker.aio):
        names = getattr(mod, "__all__", None) or [n for n in dir(mod) if not n.startswith("_")]
        for name in names:
            obj = getattr(mod, name)
            if isinstance(obj, int | str | dict):
                continue  # constants
            if not (obj.__doc__ or "").strip():
                missing.append(f"{mod.__name__}.{name}")
            if inspect.isclass(obj) and not issubclass(obj, BaseException):
                for attr, member in vars(obj).items():
                    if attr.startswith("_") or attr in ("count", "index"):
                        continue
                    if not callable(member) and not inspect.isdatadescriptor(member):
                        continue  # dataclass field defaults: documented in the class
                    if not (getattr(member, "__doc__", None) or "").strip():
                        missing.append(f"{mod.__name__}.{name}.{attr}")
    assert not missing, missing


def test_everything_raises_after_close(broker) -> None:  # type: ignore[no-untyped-def]
    c = kvb.connect(broker.socket, sq_entries=64)
    ns = c.ns_open(SMALL)
    buf = c.alloc_host(ns.page_bytes)
    (k,) = fresh_keys(1)
    assert ns.put(k, buf)
    lease = ns.acquire(k)
    assert lease is not None
    c.close()
    assert not buf.registered and lease is not None and not lease.held
    for call in (lambda: ns.put(k, buf), lambda: ns.get(k), lambda: ns.lookup([k]),
                 lambda: ns.delete(k), lambda: ns.acquire(k), lambda: ns.prefetch([k]),
                 lambda: ns.put_many([k], [buf]), lambda: c.alloc_host(4096),
                 lambda: c.ns_open(SMALL), c.stats, lambda: c.reap(1, 0, 0),
                 lambda: c.submit([kvb.Op(kvb.OP_NOP)]), c.completion_fd):
        with pytest.raises(kvb.ClientClosed):
            call()
    buf.unregister()  # no-ops now
    lease.release()
    with pytest.raises(kvb.Error):
        kvb.connect(broker.socket, sq_entries=3)  # not a power of two
