# SPDX-License-Identifier: MIT
"""Four processes as the TP=4 ranks of one MLA model (SGLang's is_storage_writer: rank 0
writes, every rank reads): every rank answers batch_exists alike, loads the same bytes, and
the broker holds one copy.

The ranks are forked from the test process, which has imported SGLang already (a spawned
rank would import it again: seconds each on a small machine); each makes its own host pool
and kvbroker client after the fork, as an SGLang rank does.
"""

from __future__ import annotations

import sglang_support as S  # first: imports SGLang (see there)

# isort: split

import hashlib
import multiprocessing as mp
from typing import Any

import torch
from sglang.srt.mem_cache.utils import get_hash_str

import kvbroker as kvb
from conftest import Broker

PAGE = 16
TP = 4
NPAGES = 8
MODEL = "tp4/Kimi-K2.5-test"


def _rank(rank: int, sock: str, keys: list[str], barrier: Any, q: Any) -> None:
    try:
        torch.set_num_threads(1)
        pool = S.mla_host_pool("page_first_direct", "shm", page=PAGE, tokens=256)
        b = S.kvbroker_backend(pool, sock, mla=True, tp_rank=rank, tp_size=TP, model=MODEL)
        writer = b.storage_config.is_storage_writer  # SGLang's own rule
        flat = pool.kv_buffer.view(-1).view(torch.uint8)
        if writer:
            S.fill(pool, 1234)
            ok = b.batch_set_v1(keys, S.indices(list(range(1, NPAGES + 1)), PAGE))
            assert ok == [True] * NPAGES
        barrier.wait(30)
        hits = b.batch_exists(keys)
        got = b.batch_get_v1(keys, S.indices(list(range(10, 10 + NPAGES)), PAGE))
        digests = [hashlib.sha256(b.geometry.canonical(flat, (10 + i) * PAGE)
                                  .contiguous().numpy().tobytes()).hexdigest()
                   for i in range(NPAGES)]
        q.put((rank, writer, hits, got, digests, b.layout.model, None))
        barrier.wait(30)
        b.close()
    except BaseException as e:
        q.put((rank, None, None, None, None, None, repr(e)))


def test_tp4_mla_one_writer_all_readers_one_copy(broker: Broker) -> None:
    tokens = list(range(5000, 5000 + NPAGES * PAGE))
    keys = get_hash_str(tokens, None, page_size=PAGE)
    ctx = mp.get_context("fork")
    barrier, q = ctx.Barrier(TP), ctx.Queue()
    procs = [ctx.Process(target=_rank, args=(r, broker.socket, keys, barrier, q))
             for r in range(TP)]
    for p in procs:
        p.start()
    res = sorted(q.get(timeout=60) for _ in range(TP))
    for p in procs:
        p.join(30)
        assert p.exitcode == 0
    assert [r[6] for r in res] == [None] * TP, res
    assert [r[1] for r in res] == [True, False, False, False]  # only rank 0 writes
    assert [r[2] for r in res] == [NPAGES] * TP  # identical batch_exists on every rank
    assert all(r[3] == [True] * NPAGES for r in res)
    assert len({tuple(r[4]) for r in res}) == 1  # the same bytes on every rank
    # the writer's own bytes: rebuild rank 0's pool content here
    pool = S.mla_host_pool("page_first_direct", "default", page=PAGE, tokens=256)
    S.fill(pool, 1234)
    from kvbroker.sglang import pool_geometry

    geo = pool_geometry(pool)
    flat = pool.kv_buffer.view(-1).view(torch.uint8)
    want = [hashlib.sha256(geo.canonical(flat, (1 + i) * PAGE).contiguous().numpy()
                           .tobytes()).hexdigest() for i in range(NPAGES)]
    assert res[0][4] == want
    # one copy in the broker's pool: the namespace holds NPAGES pages, stored once
    with kvb.connect(broker.socket, control=True) as c:
        st = c.stats()
    ns = [n for n in st["namespaces"] if n["model"] == res[0][5]]
    assert len(ns) == 1, st["namespaces"]
    assert ns[0]["pages"] == NPAGES and ns[0]["puts"] == NPAGES
