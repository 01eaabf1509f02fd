# SPDX-License-Identifier: MIT
"""SGLang 0.5.23's other host layouts through kvbroker.sglang: page_head (heads outermost in
a page) and page_unified (head groups, MLA and MHA), byte for byte and shared with the
generic layouts where the bytes are the same; page_head with tp_lcm_size, so instances of
two TP sizes share pages; the layouts and set-ups it cannot store, refused at start-up with
the reason; v2 side pools, where a hit is all or nothing.
"""

from __future__ import annotations

import sglang_support as S  # first: imports SGLang (see there)

# isort: split

import os
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.utils import get_hash_str

from conftest import Broker
from kvbroker.sglang import KVBrokerStorage

PAGE = 16
_seq = [0]


def hkeys(n: int) -> list[str]:
    _seq[0] += 1
    base = (_seq[0] * 7919 + os.getpid()) % 100000
    keys: list[str] = get_hash_str(list(range(base, base + n * PAGE)), None, page_size=PAGE)
    return keys


def backend(pool: object, broker: Broker, model: str, **kw: Any) -> KVBrokerStorage:
    b: KVBrokerStorage = S.kvbroker_backend(pool, broker.socket, mla=False, model=model,
                                            interface_v1=1, **kw)
    return b


def test_page_head_and_page_unified_byte_exact(broker: Broker) -> None:
    """page_head stores each KV head's [layer][token] run (head-major page); page_unified
    with one head group is the canonical page, so it shares pages with page_first."""
    keys = hkeys(3)
    ph = S.mha_host_pool("page_head", heads=2)
    S.fill(ph, 61)
    a = backend(ph, broker, "layouts/ph")
    assert a.layout.page_format == "head-major" and a.zero_copy
    kv = ph.kv_buffer  # [2][page][head][token][layer][dim]
    want = kv[:, 1:4].clone()
    assert a.batch_set_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
    kv.zero_()
    assert a.batch_get_v1(keys, S.indices([1, 2, 3], PAGE)) == [True] * 3
    assert torch.equal(kv[:, 1:4].view(torch.uint8), want.view(torch.uint8))
    a.close()
    # page_unified (one head group) and page_first: one namespace, the same bytes
    keys = hkeys(2)
    pu, pf = S.mha_host_pool("page_unified"), S.mha_host_pool("page_first", "default")
    S.fill(pu, 62)
    u = backend(pu, broker, "layouts/pu")
    f = backend(pf, broker, "layouts/pu")
    assert u.layout.page_format == "" and u.layout == f.layout
    assert u.batch_set_v1(keys, S.indices([2, 5], PAGE)) == [True, True]
    assert f.batch_get_v1(keys, S.indices([0, 1], PAGE)) == [True, True]
    fl_u, fl_f = (p.kv_buffer.view(-1).view(torch.uint8) for p in (pu, pf))
    assert u.geometry is not None and f.geometry is not None
    for su, sf in ((2, 0), (5, 1)):
        assert torch.equal(u.geometry.canonical(fl_u, su * PAGE).contiguous(),
                           f.geometry.canonical(fl_f, sf * PAGE).contiguous())
    # page_unified MLA is page_first_direct's bytes
    mu, md = S.mla_host_pool("page_unified"), S.mla_host_pool("page_first_direct")
    S.fill(mu, 63)
    x = S.kvbroker_backend(mu, broker.socket, mla=True, model="layouts/mla", interface_v1=1)
    y = S.kvbroker_backend(md, broker.socket, mla=True, model="layouts/mla", interface_v1=1)
    keys = hkeys(2)
    assert x.batch_set_v1(keys, S.indices([3, 4], PAGE)) == [True, True]
    assert y.batch_get_v1(keys, S.indices([3, 4], PAGE)) == [True, True]
    assert torch.equal(mu.kv_buffer[3:5].reshape(-1).view(torch.uint8),
                       md.kv_buffer[3:5].reshape(-1).view(torch.uint8))
    for b in (u, f, x, y):
        b.close()


def test_page_head_tp_lcm_size_shares_across_tp_sizes(broker: Broker) -> None:
    """4 KV heads, tp_lcm_size 4: a TP=2 instance (2 heads a rank) stores each page as two
    one-head pages, virtual ranks 2r and 2r+1, which are what a TP=4 instance's ranks store
    and load; and the other way round. Bytes checked head by head."""
    model, lcm = "layouts/lcm", 4
    tp2 = [S.mha_host_pool("page_head", heads=2) for _ in range(2)]
    tp4 = [S.mha_host_pool("page_head", heads=1) for _ in range(4)]
    b2 = [backend(p, broker, model, tp_rank=r, tp_size=2, tp_lcm_size=lcm)
          for r, p in enumerate(tp2)]
    b4 = [backend(p, broker, model, tp_rank=r, tp_size=4, tp_lcm_size=lcm)
          for r, p in enumerate(tp4)]
    assert len(b2[0].shards) == 2 and len(b4[0].shards) == 1
    assert [lay.tp_rank for lay in b2[1].layouts] == [2, 3]
    assert b2[1].layouts[1] == b4[3].layout
    for p in tp2 + tp4:
        S.fill(p, id(p) % 1000)
    # TP=2 writes, TP=4 reads: rank r of TP=4 holds head r % 2 of TP=2's rank r // 2
    keys = hkeys(2)
    for b in b2:
        assert b.batch_set_v1(keys, S.indices([1, 2], PAGE)) == [True, True]
    for r, b in enumerate(b4):
        assert b.batch_exists(keys) == 2
        assert b.batch_get_v1(keys, S.indices([5, 6], PAGE)) == [True, True]
        src = tp2[r // 2].kv_buffer[:, 1:3, r % 2]
        assert torch.equal(tp4[r].kv_buffer[:, 5:7, 0].view(torch.uint8),
                           src.view(torch.uint8))
    # TP=4 writes, TP=2 reads both of its halves; a page with one half missing is a miss
    keys = hkeys(2)
    for b in b4[:3]:  # rank 3 has not stored yet
        assert b.batch_set_v1(keys, S.indices([7, 8], PAGE)) == [True, True]
    assert b2[1].batch_exists(keys) == 0 and b2[0].batch_exists(keys) == 2
    assert b2[1].batch_get_v1(keys, S.indices([9, 10], PAGE)) == [False, False]
    assert b4[3].batch_set_v1(keys, S.indices([7, 8], PAGE)) == [True, True]
    for r, b in enumerate(b2):
        assert b.batch_get_v1(keys, S.indices([11, 12], PAGE)) == [True, True]
        for h in range(2):
            assert torch.equal(tp2[r].kv_buffer[:, 11:13, h].view(torch.uint8),
                               tp4[2 * r + h].kv_buffer[:, 7:9, 0].view(torch.uint8))
    for b in b2 + b4:
        b.close()


def test_unsupported_set_ups_refused_at_start(broker: Broker) -> None:
    """What the backend cannot store byte for byte stops SGLang at start-up with the cause
    and the fix, never later as wrong pages."""
    with pytest.raises(ValueError, match="interface_v1"):
        S.kvbroker_backend(S.mha_host_pool("page_head"), broker.socket, mla=False,
                           model="layouts/v0", interface_v1=0)
    with pytest.raises(ValueError, match="tp_lcm_size splits a page into 4"):
        S.kvbroker_backend(S.mha_host_pool("page_head", heads=2), broker.socket, mla=False,
                           model="layouts/bad", tp_size=2, tp_lcm_size=8, interface_v1=1)
    with pytest.raises(ValueError, match="cannot store SGLang host pool"):
        from kvbroker.sglang import pool_geometries

        class MambaPoolHost:  # the class name SGLang's Mamba state host pool has
            layout = "layer_first"

        pool_geometries(MambaPoolHost())


def test_v2_side_pool_hit_is_all_or_nothing(broker: Broker) -> None:
    """An extra pool registered as SGLang registers it (register_mem_host_pool_v2): a
    page whose KV or side-pool part is missing is restored for neither."""
    from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolName, PoolTransfer

    main, side = S.mla_host_pool("page_first_direct"), S.mha_host_pool("layer_first")
    S.fill(main, 71)
    S.fill(side, 72)
    b = S.kvbroker_backend(main, broker.socket, mla=True, model="layouts/v2", interface_v1=1)
    b.register_mem_host_pool_v2(side, PoolName.DRAFT)
    keys = hkeys(4)

    def xfer(ks: list[str], pages: list[int], name: object) -> PoolTransfer:
        return PoolTransfer(name=name, host_indices=S.indices(pages, PAGE), keys=ks,
                            hit_policy=PoolHitPolicy.ALL_PAGES)

    # KV pages 0..3 stored; draft pages for 0, 1 and 3 (2 is missing)
    assert b.batch_set_v2([xfer(keys, [1, 2, 3, 4], PoolName.KV)]) == \
        {PoolName.KV: [True] * 4}
    assert b.batch_set_v2([xfer(keys[:2], [1, 2], PoolName.DRAFT)]) == \
        {PoolName.DRAFT: [True, True]}
    assert b.batch_set_v2([xfer(keys[3:], [4], PoolName.DRAFT)]) == {PoolName.DRAFT: [True]}
    r = b.batch_exists_v2(keys, [xfer(keys, [1, 2, 3, 4], PoolName.DRAFT)])
    # the KV prefix is 4 pages, the restorable one 2: SGLang restores only those
    assert r.extra_pool_hit_pages == {"kv": 4, "draft": 2}
    assert r.kv_hit_pages == 2 and r.restorable_prefix_pages == [1, 2]
    u8 = side.kv_buffer.view(torch.uint8)  # [2][layer][token][bytes]
    before = u8[:, :, 12 * PAGE:13 * PAGE].clone()
    got = b.batch_get_v2([xfer(keys, [10, 11, 12, 13], PoolName.KV),
                          xfer(keys, [10, 11, 12, 13], PoolName.DRAFT)])
    assert got == {PoolName.KV: [True, True, False, True],
                   PoolName.DRAFT: [True, True, False, True]}
    assert torch.equal(u8[:, :, 12 * PAGE:13 * PAGE], before)  # the miss wrote nothing
    for dst, src in ((10, 1), (11, 2), (13, 4)):
        assert torch.equal(u8[:, :, dst * PAGE:(dst + 1) * PAGE],
                           u8[:, :, src * PAGE:(src + 1) * PAGE])
    b.close()
