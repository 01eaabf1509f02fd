# SPDX-License-Identifier: MIT
"""kvbroker.sglang against SGLang 0.5.23's own code and a real kvbrokerd.

SGLang's HiCacheStorageConfig and StorageBackendFactory load the backend through "dynamic";
SGLang's MLA and MHA host pool classes (on the CPU) feed batch_set_v1/batch_get_v1; keys come
from SGLang's get_hash_str (EAGLE bigram keys too); HiCacheFile, the reference backend SGLang
ships, answers the same call sequence with the same hits and misses.
"""

from __future__ import annotations

import sglang_support as S  # first: imports SGLang (see there)

# isort: split

import logging
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageExtraInfo
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_hash_str

import kvbroker as kvb
from conftest import Broker, prefix_stored
from kvbroker.sglang import KVBrokerStorage, model_ns_name, pool_geometry

PAGE = 16
LAYOUTS = ["page_first_direct", "layer_first", "page_first"]
_seq = [0]


def hkeys(n: int, salt: int = 0) -> list[str]:
    """n chained page keys of a fresh token sequence, from SGLang's get_hash_str."""
    _seq[0] += 1
    tokens = [(_seq[0] * 1000003 + salt * 7919 + os.getpid() + i) % 150000
              for i in range(n * PAGE)]
    keys: list[str] = get_hash_str(tokens, None, page_size=PAGE)
    return keys


def pool_of(kind: str, layout: str, alloc: str = "shm", **kw: Any) -> Any:
    return (S.mla_host_pool if kind == "mla" else S.mha_host_pool)(layout, alloc, page=PAGE,
                                                                   **kw)


def backend(pool: Any, broker: Broker, kind: str, model: str, **kw: Any) -> KVBrokerStorage:
    b: KVBrokerStorage = S.kvbroker_backend(pool, broker.socket, mla=kind == "mla",
                                            model=model, **kw)
    return b


def sgpage(pool: Any, p: int) -> torch.Tensor:
    """SGLang's own flat page (get_data_page) as bytes: random bf16 bytes hold NaNs, which
    torch.equal would call different."""
    t: torch.Tensor = pool.get_data_page(p * PAGE, flat=True).view(torch.uint8)
    return t


def canon(b: KVBrokerStorage, pages: list[int]) -> list[torch.Tensor]:
    flat = b.mem_pool_host.kv_buffer.view(-1).view(torch.uint8)
    geo = b.geometry
    assert geo is not None
    return [geo.canonical(flat, p * PAGE).clone() for p in pages]


def test_factory_dynamic_loads_backend(broker: Broker) -> None:
    pool = pool_of("mla", "page_first_direct")
    b = backend(pool, broker, "mla", "test/factory")
    assert type(b) is KVBrokerStorage  # no failure injector configured
    assert b.zero_copy
    assert b.layout.model == "factory" and b.layout.kind == kvb.MLA
    assert b.layout.components[0].bytes_per_token_layer == 576 * 2
    b.close()


def test_shm_pool_moved_to_sealable_memfd(broker: Broker) -> None:
    """SGLang's memfd (no MFD_ALLOW_SEALING) is replaced under the same addresses by a sealed
    one, the old file's pages are punched out (the pool is not held twice), and SGLang's
    tensor keeps its bytes."""
    import fcntl

    pool = pool_of("mla", "layer_first", "shm")
    old = pool.fd
    assert fcntl.fcntl(old, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL  # unsealable, as shipped
    S.fill(pool, 17)
    before = pool.kv_buffer.view(torch.uint8).clone()
    addr = pool.kv_buffer.data_ptr()
    assert os.fstat(old).st_blocks > 0
    b = backend(pool, broker, "mla", "adopt/model")
    assert b.zero_copy and b._own_fd is not None and b._own_fd != old
    assert fcntl.fcntl(b._own_fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SHRINK
    assert pool.kv_buffer.data_ptr() == addr
    assert torch.equal(pool.kv_buffer.view(torch.uint8), before)
    assert os.fstat(old).st_blocks == 0
    b.close()


@pytest.mark.parametrize("layout", ["page_first_direct", "page_first"])
def test_unsealable_memfd_without_adopt_is_broker_pread(broker: Broker, layout: str) -> None:
    """shm_adopt off (or a pool already in use): SGLang's own unsealable memfd is registered
    with fdcopy, the broker moves bytes with pread/pwrite; still byte-exact, still one copy."""
    pool = pool_of("mha", layout, "shm")
    S.fill(pool, 23)
    b = backend(pool, broker, "mha", f"fdcopy/{layout}", shm_adopt=False)
    assert b.zero_copy and b._fdcopy and b._own_fd is None
    keys = hkeys(3)
    want = canon(b, [1, 2, 3])
    assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
    assert b.batch_get_v1(keys, S.indices([5, 6, 7], PAGE)) == [True] * 3
    assert all(torch.equal(x, w) for x, w in zip(canon(b, [5, 6, 7]), want, strict=True))
    b.close()


@pytest.mark.parametrize("alloc", ["shm", "default"])
def test_prefetch_and_backup_threads_at_once(broker: Broker, alloc: str) -> None:
    """SGLang's prefetch thread loads while its backup thread stores, on one backend (the
    staging path shares one buffer): every page still byte-exact."""
    import threading

    pool = pool_of("mha", "page_first_direct", alloc, tokens=512)
    S.fill(pool, 41)
    b = backend(pool, broker, "mha", f"threads/{alloc}", staging_mb=1)
    old, new = hkeys(6), hkeys(6)
    assert b.batch_set_v1(old, S.indices(list(range(1, 7)), PAGE)) == [True] * 6
    want_old, want_new = canon(b, list(range(1, 7))), canon(b, list(range(7, 13)))
    errs: list[str] = []

    def getter() -> None:
        for _ in range(20):
            if b.batch_get_v1(old, S.indices(list(range(20, 26)), PAGE)) != [True] * 6:
                errs.append("get missed")

    def setter() -> None:
        for _ in range(20):
            if b.batch_set_v1(new, S.indices(list(range(7, 13)), PAGE)) != [True] * 6:
                errs.append("set failed")

    ts = [threading.Thread(target=getter), threading.Thread(target=setter)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errs
    assert all(torch.equal(x, w) for x, w in zip(canon(b, list(range(20, 26))), want_old,
                                                  strict=True))
    assert b.batch_get_v1(new, S.indices(list(range(30, 36)), PAGE)) == [True] * 6
    assert all(torch.equal(x, w) for x, w in zip(canon(b, list(range(30, 36))), want_new,
                                                  strict=True))
    b.close()


def test_model_name_rule() -> None:
    assert model_ns_name("moonshotai/Kimi-K2.5") == "kimi-k2.5"
    assert model_ns_name("/models/Kimi-K2.5/") == "kimi-k2.5"
    long = model_ns_name("x" * 100)
    assert len(long) == 63 and long.startswith("x" * 46 + "-")


@pytest.mark.parametrize("kind", ["mla", "mha"])
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("alloc", ["shm", "default"])
def test_roundtrip_byte_exact(broker: Broker, kind: str, layout: str, alloc: str) -> None:
    """Host pool -> broker -> host pool, through SGLang's own pool classes, byte for byte,
    on both the zero-copy (shm memfd) and the staging path."""
    pool = pool_of(kind, layout, alloc)
    S.fill(pool, 7)
    b = backend(pool, broker, kind, f"rt/{kind}-{layout}")
    assert b.zero_copy == (alloc == "shm")
    keys = hkeys(5)
    pages = [1, 4, 2, 9, 3]
    want = canon(b, pages)
    sg_want = [sgpage(pool, p).clone() for p in pages]
    assert b.batch_exists(keys) in (0, 5)  # alloc variants share a namespace per layout
    assert b.batch_set_v1(keys, S.indices(pages, PAGE)) == [True] * 5
    assert b.batch_exists(keys) == 5
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(keys, S.indices(pages, PAGE)) == [True] * 5
    assert all(torch.equal(a, w) for a, w in zip(canon(b, pages), want, strict=True))
    # and in SGLang's own terms: get_data_page gives back what it gave before
    assert all(torch.equal(sgpage(pool, p), w)
               for p, w in zip(pages, sg_want, strict=True))
    # pages of other slots stayed untouched (zero)
    assert not sgpage(pool, 0).any()
    b.close()


def test_canonical_bytes_match_sglang_pages() -> None:
    """The geometry's canonical page is SGLang's own page: for page_first_direct and
    layer_first get_data_page() is already [component][layer][token][bytes]; for page_first
    it is [token][layer] and transposes to it."""
    for kind in ("mla", "mha"):
        for layout in LAYOUTS:
            pool = pool_of(kind, layout, "default")
            S.fill(pool, 3)
            g = pool_geometry(pool)
            flat = pool.kv_buffer.view(-1).view(torch.uint8)
            c = g.canonical(flat, 5 * PAGE).contiguous().view(-1)
            sg = pool.get_data_page(5 * PAGE, flat=True).view(torch.uint8)
            if layout == "page_first":
                C, L, B = len(g.components), g.num_layers, g.bytes_per_token_layer
                sg = sg.view(C, PAGE, L, B).transpose(1, 2).contiguous().view(-1)
            assert torch.equal(c, sg), (kind, layout)
            # get_page_buffer_meta's first pointer is part (0, 0) of that page
            ptrs, _ = pool.get_page_buffer_meta(S.indices([5], PAGE))
            assert ptrs[0] - pool.kv_buffer.data_ptr() == g.page_offset(5 * PAGE)


def test_pages_move_between_layouts(broker: Broker) -> None:
    """A page stored from a page_first pool reads into page_first_direct and layer_first
    pools of the same model: one canonical byte order in the broker."""
    keys = hkeys(3)
    src = pool_of("mla", "page_first", "shm")
    S.fill(src, 11)
    a = backend(src, broker, "mla", "xl/model")
    want = canon(a, [2, 5, 7])
    assert a.batch_set_v1(keys, S.indices([2, 5, 7], PAGE)) == [True] * 3
    for layout, alloc in (("page_first_direct", "shm"), ("layer_first", "default")):
        dst = pool_of("mla", layout, alloc)
        b = backend(dst, broker, "mla", "xl/model")
        assert b.batch_get_v1(keys, S.indices([0, 1, 3], PAGE)) == [True] * 3
        assert all(torch.equal(x, w) for x, w in zip(canon(b, [0, 1, 3]), want, strict=True))
        b.close()
    a.close()


def test_keys_are_get_hash_str_including_eagle(broker: Broker) -> None:
    """SGLang's page hashes are kvbroker keys bit for bit: plain chains, seeded chains and
    EAGLE bigram chains (RadixKey.maybe_to_bigram_view, as the radix cache does)."""
    tokens = list(range(1000, 1000 + 4 * PAGE + 1))
    plain = get_hash_str(tokens[: 4 * PAGE], None, page_size=PAGE)
    assert plain == kvb.page_keys_hex(tokens[: 4 * PAGE], PAGE)
    seeded = get_hash_str(tokens[PAGE: 3 * PAGE], plain[0], page_size=PAGE)
    assert seeded == kvb.page_keys_hex(tokens[PAGE: 3 * PAGE], PAGE, plain[0])
    rk, _ = RadixKey(tokens[: 4 * PAGE + 1]).maybe_to_bigram_view(True)
    rk = rk[: 4 * PAGE]
    eagle = get_hash_str(rk, None, page_size=PAGE)
    assert len(eagle) == 4 and eagle != plain
    assert eagle == [k.hex() for k in kvb.page_keys_eagle(tokens[: 4 * PAGE + 1], PAGE)]
    # and they work as storage keys
    pool = pool_of("mla", "page_first_direct")
    S.fill(pool, 5)
    b = backend(pool, broker, "mla", "keys/eagle")
    want = canon(b, [1, 2, 3, 4])
    assert b.batch_set_v1(eagle, S.indices([1, 2, 3, 4], PAGE)) == [True] * 4
    assert b.batch_exists(eagle) == 4 and b.batch_exists(plain) == 0
    pool.kv_buffer.zero_()
    assert b.batch_get_v1(eagle, S.indices([1, 2, 3, 4], PAGE)) == [True] * 4
    assert all(torch.equal(x, w) for x, w in zip(canon(b, [1, 2, 3, 4]), want, strict=True))
    b.close()


def test_mha_ranks_never_share(broker: Broker) -> None:
    keys = hkeys(2)
    p0, p1 = pool_of("mha", "page_first_direct"), pool_of("mha", "page_first_direct")
    S.fill(p0, 1)
    S.fill(p1, 2)
    b0 = backend(p0, broker, "mha", "mha/model", tp_rank=0, tp_size=2)
    b1 = backend(p1, broker, "mha", "mha/model", tp_rank=1, tp_size=2)
    w0, w1 = canon(b0, [3, 4]), canon(b1, [3, 4])
    assert b0.batch_set_v1(keys, S.indices([3, 4], PAGE)) == [True, True]
    assert b1.batch_exists(keys) == 0
    assert b1.batch_get_v1(keys, S.indices([3, 4], PAGE)) == [False, False]
    assert torch.equal(canon(b1, [3])[0], w1[0])  # a miss writes nothing
    assert b1.batch_set_v1(keys, S.indices([3, 4], PAGE)) == [True, True]
    p0.kv_buffer.zero_()
    p1.kv_buffer.zero_()
    assert b0.batch_get_v1(keys, S.indices([3, 4], PAGE)) == [True, True]
    assert b1.batch_get_v1(keys, S.indices([3, 4], PAGE)) == [True, True]
    assert all(torch.equal(x, w) for x, w in zip(canon(b0, [3, 4]), w0, strict=True))
    assert all(torch.equal(x, w) for x, w in zip(canon(b1, [3, 4]), w1, strict=True))
    b0.close()
    b1.close()


def test_second_job_finds_first_jobs_pages(broker: Broker) -> None:
    """Another engine instance (new client, new host pool, other layout) hits the pages."""
    keys = hkeys(4)
    p = pool_of("mla", "page_first_direct")
    S.fill(p, 9)
    job1 = backend(p, broker, "mla", "jobs/Kimi")
    want = canon(job1, [1, 2, 3, 4])
    assert job1.batch_set_v1(keys, S.indices([1, 2, 3, 4], PAGE)) == [True] * 4
    job1.close()
    q = pool_of("mla", "layer_first")
    job2 = backend(q, broker, "mla", "/other/path/to/Kimi/", client_name="job2")
    assert job2.batch_exists(keys) == 4
    assert job2.batch_get_v1(keys, S.indices([5, 6, 7, 8], PAGE)) == [True] * 4
    assert all(torch.equal(x, w) for x, w in zip(canon(job2, [5, 6, 7, 8]), want, strict=True))
    job2.close()


def test_same_hits_and_misses_as_hicachefile(broker: Broker, tmp_path: Path) -> None:
    """One call sequence against SGLang's HiCacheFile and kvbroker: same answers. HiCacheFile
    has no v1 calls (its batch_get_v1 is HiCacheStorage's stub), so it is driven the way
    HiCacheController drives a v0 backend (get_data_page / get_dummy_flat_data_page)."""
    keys = hkeys(6)
    other = hkeys(3)
    pf = pool_of("mla", "page_first_direct", "default")
    pk = pool_of("mla", "page_first_direct", "default")
    S.fill(pf, 4)
    pk.kv_buffer.copy_(pf.kv_buffer)
    cfg = S.storage_config(mla=True, model="ref/model", file_storage_path=str(tmp_path))
    f = HiCacheFile(cfg)
    k = backend(pk, broker, "mla", "ref/model")

    def file_set(ks: list[str], pages: list[int]) -> bool:
        return bool(f.batch_set(ks, [pf.get_data_page(p * PAGE) for p in pages]))

    def file_get(ks: list[str], pages: list[int]) -> list[bool]:
        out = f.batch_get(ks, [pf.get_dummy_flat_data_page() for _ in ks])
        for r, p in zip(out, pages, strict=True):
            if r is not None:
                pf.set_from_flat_data_page(p * PAGE, r)
        return [r is not None for r in out]

    seq: list[tuple[Any, ...]] = [("exists", keys), ("set", keys[:3], [1, 2, 3]), ("exists", keys),
        ("exists", keys[:2]), ("exists", keys[1:]), ("get", keys[:4], [10, 11, 12, 13]),
        ("set", keys[3:5], [4, 5]), ("exists", keys), ("exists", other + keys),
        ("set", other[1:], [6, 7]), ("exists", other), ("exists", other[1:]),
        ("get", other, [14, 15, 16]), ("get", keys, [20, 21, 22, 23, 24, 25])]
    for op in seq:
        if op[0] == "exists":
            assert f.batch_exists(op[1]) == k.batch_exists(op[1]), op
            assert [f.exists(x) for x in op[1]] == [k.exists(x) for x in op[1]], op
        elif op[0] == "set":
            assert file_set(op[1], op[2]) is True
            assert all(k.batch_set_v1(op[1], S.indices(op[2], PAGE)))
        else:
            want = file_get(op[1], op[2])
            assert k.batch_get_v1(op[1], S.indices(op[2], PAGE)) == want, op
    # what both loaded is the same bytes
    assert torch.equal(pf.kv_buffer.view(torch.uint8), pk.kv_buffer.view(torch.uint8))
    # and kvbroker's v0 calls give HiCacheFile's answers too
    page = pk.get_dummy_flat_data_page()
    assert k.get(keys[0], page) is not None
    assert torch.equal(page.view(torch.uint8), sgpage(pf, 1))
    assert k.get(other[0], pk.get_dummy_flat_data_page()) is None
    assert f.get(other[0], pf.get_dummy_flat_data_page()) is None
    k.close()


def test_v2_extra_pool_same_as_hicachefile(broker: Broker, tmp_path: Path) -> None:
    """An extra host pool (a draft MHA pool, registered with register_mem_host_pool_v2) goes
    through batch_set_v2/batch_exists_v2/batch_get_v2 with HiCacheFile's answers, both hit
    policies, and its bytes come back."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    keys = hkeys(4)
    main_f, main_k = pool_of("mla", "page_first_direct", "default"), \
        pool_of("mla", "page_first_direct", "default")
    dr_f, dr_k = pool_of("mha", "layer_first", "default"), pool_of("mha", "layer_first",
                                                                    "default")
    S.fill(main_f, 31)
    main_k.kv_buffer.copy_(main_f.kv_buffer)
    S.fill(dr_f, 32)
    dr_k.kv_buffer.copy_(dr_f.kv_buffer)
    f = HiCacheFile(S.storage_config(mla=True, model="v2/model",
                                     file_storage_path=str(tmp_path)))
    k = backend(main_k, broker, "mla", "v2/model")
    f.register_mem_host_pool_v2(dr_f, PoolName.DRAFT)
    k.register_mem_host_pool_v2(dr_k, PoolName.DRAFT)
    pages = [1, 2, 3, 4]
    assert f.batch_set(keys, [main_f.get_data_page(p * PAGE) for p in pages])
    assert k.batch_set_v1(keys, S.indices(pages, PAGE)) == [True] * 4

    def draft(ks: list[str], pgs: list[int], policy: Any = PoolHitPolicy.ALL_PAGES) -> Any:
        return PoolTransfer(name=PoolName.DRAFT, host_indices=S.indices(pgs, PAGE), keys=ks,
                            hit_policy=policy)

    for be in (f, k):  # draft pages for the first two and the last page only
        assert be.batch_set_v2([draft(keys[:2], [1, 2])]) == {PoolName.DRAFT: [True, True]}
        assert be.batch_set_v2([draft(keys[3:], [4])]) == {PoolName.DRAFT: [True]}
    for transfers in ([draft(keys, pages)], [draft(keys[3:], [4], PoolHitPolicy.TRAILING_PAGES)],
                      [draft(keys[:1], [1], PoolHitPolicy.TRAILING_PAGES)], []):
        a, b = f.batch_exists_v2(keys, transfers), k.batch_exists_v2(keys, transfers)
        assert (a.kv_hit_pages, a.extra_pool_hit_pages, a.restorable_prefix_pages) == \
            (b.kv_hit_pages, b.extra_pool_hit_pages, b.restorable_prefix_pages), transfers
    dr_f.kv_buffer.zero_()
    dr_k.kv_buffer.zero_()
    t = [draft(keys, [10, 11, 12, 13])]
    assert f.batch_get_v2(t) == k.batch_get_v2(t) == {PoolName.DRAFT: [True, True, False, True]}
    assert torch.equal(dr_f.kv_buffer.view(torch.uint8), dr_k.kv_buffer.view(torch.uint8))
    assert dr_k.kv_buffer[:, :, 10 * PAGE:12 * PAGE].any()
    k.close()


def test_v0_calls_page_first(broker: Broker) -> None:
    """v0 set/get move flat pages in the host layout's own order (page_first is
    [token][layer]) and store canonical bytes: a v1 read of a v0 write agrees."""
    pool = pool_of("mha", "page_first", "default")
    S.fill(pool, 21)
    b = backend(pool, broker, "mha", "v0/model")
    keys = hkeys(2)
    assert b.batch_set(keys, [pool.get_data_page(p * PAGE) for p in (2, 3)])
    want = canon(b, [2, 3])
    assert b.batch_get_v1(keys, S.indices([8, 9], PAGE)) == [True, True]
    assert all(torch.equal(x, w) for x, w in zip(canon(b, [8, 9]), want, strict=True))
    out = pool.get_dummy_flat_data_page()
    assert b.get(keys[1], out) is out
    assert out is not None and torch.equal(out.view(torch.uint8), sgpage(pool, 3))
    b.close()


def test_get_stats_is_sglang_storage_metrics(broker: Broker) -> None:
    from sglang.srt.observability.metrics_collector import StorageMetrics

    pool = pool_of("mla", "page_first_direct")
    b = backend(pool, broker, "mla", "stats/model")
    keys = hkeys(3)
    b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE))
    b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE))
    m = b.get_stats()
    assert isinstance(m, StorageMetrics)
    assert m.backup_pgs == [3] and m.prefetch_pgs == [3] and m.prefetch_bandwidth[0] > 0
    assert b.get_stats().prefetch_pgs == []  # since the last call
    t = time.perf_counter()
    for _ in range(1000):
        b.get_stats()
    assert (time.perf_counter() - t) / 1000 < 200e-6  # polled every scheduler tick
    b.close()


def test_no_broker_at_startup(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    sock = str(tmp_path / "none.sock")
    pool = pool_of("mla", "page_first_direct")
    with caplog.at_level(logging.WARNING, logger="kvbroker.sglang"):
        b = S.kvbroker_backend(pool, sock, mla=True, model="nb/model")
    lines = [r.getMessage() for r in caplog.records if "no broker" in r.getMessage()]
    assert len(lines) == 1 and "runs without the L3 tier" in lines[0]
    keys = hkeys(2)
    t = time.perf_counter()
    assert b.batch_exists(keys) == 0
    assert b.batch_set_v1(keys, S.indices([1, 2], PAGE)) == [False, False]
    assert b.batch_get_v1(keys, S.indices([1, 2], PAGE)) == [False, False]
    assert time.perf_counter() - t < 0.5
    b.close()
    with pytest.raises(RuntimeError, match="required=true"):
        S.kvbroker_backend(pool_of("mla", "page_first_direct"), sock, mla=True,
                           model="nb/model", required=True)


def test_broker_killed_then_restarted(tmp_path: Path) -> None:
    """Calls fail fast while the broker is gone (misses, failed writes, no exception, no
    hang) and succeed again once a broker is back on the socket."""
    br = Broker(tmp_path)
    try:
        pool = pool_of("mla", "page_first_direct")
        S.fill(pool, 13)
        b = S.kvbroker_backend(pool, br.socket, mla=True, model="kill/model",
                               retry_interval_s=0.2)
        keys = hkeys(3)
        want = canon(b, [1, 2, 3])
        assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
        flat = pool.kv_buffer.view(-1).view(torch.uint8)
        for p in (4, 5, 6):
            b.geometry.canonical(flat, p * PAGE).zero_()
        br.kill()
        t = time.perf_counter()
        for _ in range(5):
            assert b.batch_exists(keys) == 0
            assert b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE)) == [False] * 3
            assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [False] * 3
        assert time.perf_counter() - t < 1.0
        assert not sgpage(pool, 4).any()  # nothing partial landed
        br = Broker(tmp_path)  # same socket path (it adopts the kept pool)
        deadline = time.monotonic() + 5
        while b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) != [True] * 3:
            assert time.monotonic() < deadline, "no reconnect"
            time.sleep(0.05)
        assert b.batch_exists(keys) == 3
        assert b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE)) == [True] * 3
        assert all(torch.equal(x, w) for x, w in zip(canon(b, [4, 5, 6]), want, strict=True))
        assert b.zero_copy and b.stats.totals["reconnects"] == 1
        b.close()
    finally:
        br.stop()


def test_broker_kill9_pages_survive(tmp_path: Path) -> None:
    """kill -9 of the broker (its keeper holds the pool), a new one on the socket: the
    backend object reconnects by itself and the pages it wrote before are there, byte-exact,
    without writing them again."""
    br = Broker(tmp_path)
    try:
        pool = pool_of("mla", "page_first_direct")
        S.fill(pool, 17)
        b = S.kvbroker_backend(pool, br.socket, mla=True, model="kill9/model",
                               retry_interval_s=0.05)
        keys = hkeys(3)
        want = canon(b, [1, 2, 3])
        assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
        flat = pool.kv_buffer.view(-1).view(torch.uint8)
        for p in (4, 5, 6):
            b.geometry.canonical(flat, p * PAGE).zero_()
        br.kill()
        t = time.perf_counter()
        assert b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE)) == [False] * 3  # fails fast
        assert time.perf_counter() - t < 0.5
        br = Broker(tmp_path)
        deadline = time.monotonic() + 5
        while b.batch_exists(keys) != 3:
            assert time.monotonic() < deadline, "no reconnect, or the pages were lost"
            time.sleep(0.02)
        assert b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE)) == [True] * 3
        assert all(torch.equal(x, w) for x, w in zip(canon(b, [4, 5, 6]), want, strict=True))
        b.close()
    finally:
        br.stop()


def test_broker_stopped_and_started_fresh_no_stale_hits(tmp_path: Path) -> None:
    """A broker stopped with SIGTERM frees its RAM pool; the one started next has none of
    the old pages. The backend reconnects by itself and reports misses for them (its
    namespace, view and buffer are made again on the new broker, nothing cached from the
    old one), and a page stored again under the same key reads back as the new bytes."""
    br = Broker(tmp_path)
    try:
        pool = pool_of("mla", "page_first_direct")
        S.fill(pool, 19)
        b = S.kvbroker_backend(pool, br.socket, mla=True, model="fresh/model",
                               retry_interval_s=0.05)
        keys = hkeys(3)
        old = canon(b, [1, 2, 3])
        assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
        br.stop()
        br = Broker(tmp_path)
        deadline = time.monotonic() + 5
        while b.stats.totals["reconnects"] < 1:
            assert b.batch_exists(keys) == 0  # gone with the old pool, never a stale hit
            assert time.monotonic() < deadline, "no reconnect"
            time.sleep(0.02)
        flat = pool.kv_buffer.view(-1).view(torch.uint8)
        for p in (4, 5, 6):
            b.geometry.canonical(flat, p * PAGE).fill_(0x5A)
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE)) == [False] * 3
        assert all(bool((x == 0x5A).all()) for x in canon(b, [4, 5, 6]))  # nothing written
        S.fill(pool, 20)  # new bytes under the same keys
        new = canon(b, [1, 2, 3])
        assert not any(torch.equal(x, y) for x, y in zip(new, old, strict=True))
        assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
        assert b.batch_get_v1(keys, S.indices([7, 8, 9], PAGE)) == [True] * 3
        assert all(torch.equal(x, w) for x, w in zip(canon(b, [7, 8, 9]), new, strict=True))
        b.close()
    finally:
        br.stop()


def test_get_stats_cost_per_scheduler_tick(broker: Broker) -> None:
    """SGLang calls get_stats() on every scheduler tick with storage metrics on: it swaps
    four lists under a lock and asks nothing of the broker: microseconds (printed by -s),
    after 100 calls' worth of counters."""
    pool = pool_of("mla", "page_first_direct")
    b = backend(pool, broker, "mla", "stats/tick")
    keys = hkeys(2)
    for _ in range(50):
        b.batch_set_v1(keys, S.indices([1, 2], PAGE))
        b.batch_get_v1(keys, S.indices([3, 4], PAGE))
    best = float("inf")
    for _ in range(5):  # CPU time: a loaded machine's preemptions are not the call's cost
        t = time.thread_time()
        for _ in range(2000):
            b.get_stats()
        best = min(best, (time.thread_time() - t) / 2000)
    print(f"get_stats: {best * 1e6:.2f} us CPU per call")
    assert best < 100e-6
    b.close()


def test_import_time_recorded() -> None:
    """Importing SGLang's modules is the slow part of these tests: it is measured (and
    printed by -s) so a regression shows."""
    print(f"sglang import: {S.IMPORT_SECONDS:.2f} s")
    assert S.IMPORT_SECONDS < 60


def test_backups_name_parents_chains_evicted_tail_first(own_broker: Broker) -> None:
    """batch_set_v1 names each page's parent, the first from extra_info.prefix_keys as the
    controller passes them: a chain backed up in two calls is one chain in the broker. Its
    tail is then read (the head stays in the engine's own memory), so its head is the coldest
    page, which plain LRU would evict first and strand the tail; a flood evicts it tail
    first, leaving a whole prefix."""
    pool = pool_of("mla", "page_first_direct")
    S.fill(pool, 5)
    b = backend(pool, own_broker, "mla", "chain/sglang")
    keys = hkeys(16)
    assert b.batch_set_v1(keys[:8], S.indices(list(range(8)), PAGE)) == [True] * 8
    assert b.batch_set_v1(keys[8:], S.indices(list(range(8, 16)), PAGE),
                          HiCacheStorageExtraInfo(prefix_keys=keys[:8])) == [True] * 8
    assert b.batch_get_v1(keys[8:], S.indices(list(range(8)), PAGE)) == [True] * 8
    h = b._handles()
    assert h is not None
    ns, blob = h[1][0], bytes.fromhex("".join(keys))
    for _ in range(2000):  # 2 pages at a time: the chain's end is seen going page by page
        flood = hkeys(2)
        assert b.batch_set_v1(flood, S.indices([20, 21], PAGE)) == [True] * 2
        n = prefix_stored(ns, blob)
        if n < 16:
            break
    assert 0 < n < 16
    b.close()


def test_broker_stopped_get_waits_never_frees_slots(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A broker stopped (SIGSTOP) under a batch_get_v1 into the host pool: the call waits
    (no timeout) instead of reporting misses, since SGLang would free and reuse those slots
    while the stopped broker still holds the writes into them; once it runs again the call
    returns the pages, byte for byte."""
    import signal
    import threading

    # The broker copies every page (the client reads none from the pool directory itself).
    monkeypatch.setenv("KVB_CLIENT_DIR", "0")
    br = Broker(tmp_path)
    stopped = False
    try:
        pool = pool_of("mla", "page_first_direct")
        S.fill(pool, 17)
        b = S.kvbroker_backend(pool, br.socket, mla=True, model="stop/model")
        assert b.zero_copy  # the broker writes the host pool itself
        keys = hkeys(3)
        want = canon(b, [1, 2, 3])
        assert b.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
        flat = pool.kv_buffer.view(-1).view(torch.uint8)
        for p in (4, 5, 6):
            b.geometry.canonical(flat, p * PAGE).zero_()
        br.proc.send_signal(signal.SIGSTOP)
        stopped = True
        got: list[list[bool]] = []
        t = threading.Thread(target=lambda: got.append(
            b.batch_get_v1(keys, S.indices([4, 5, 6], PAGE))))
        t.start()
        t.join(1.0)
        assert t.is_alive() and not got  # no failure while the broker may still write
        br.proc.send_signal(signal.SIGCONT)
        stopped = False
        t.join(10)
        assert got == [[True] * 3]
        assert all(torch.equal(x, w) for x, w in zip(canon(b, [4, 5, 6]), want, strict=True))
        b.close()
    finally:
        if stopped:
            br.proc.send_signal(signal.SIGCONT)
        br.stop()
