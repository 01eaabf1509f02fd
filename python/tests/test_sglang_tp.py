# SPDX-License-Identifier: MIT
"""MLA ranks as separate processes. Eight processes as the TP=8 ranks of one MLA model
(SGLang's is_storage_writer: rank 0 writes, every rank reads): every rank answers
batch_exists alike, loads the same bytes, and the broker holds one copy. Two processes as TP
ranks 0 and 1 running SGLang's own radix cache and controller over a gloo group: rank 0's
write is the one copy, and a second instance on the same ranks finds the prefix through
SGLang's prefetch (hit counts MIN-reduced across the ranks) and loads it byte for byte.

The ranks are forked from the test process, which has imported SGLang already (a spawned
rank would import it again: seconds each on a small machine); each makes its own host pool
and kvbroker client after the fork, as an SGLang rank does.
"""

from __future__ import annotations

import sglang_support as S  # first: imports SGLang (see there)

# isort: split

import datetime
import hashlib
import multiprocessing as mp
import os
import socket
from typing import Any

import torch
from sglang.srt.mem_cache.utils import get_hash_str

import kvbroker as kvb
from conftest import Broker

PAGE = 16
TP = 8
NPAGES = 8
MODEL = "tp8/Kimi-K2.5-test"


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


def test_tp8_mla_one_writer_all_readers_one_copy(broker: Broker) -> None:
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
    assert [r[1] for r in res] == [True] + [False] * (TP - 1)  # only rank 0 writes
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


def _radix_rank(rank: int, port: int, sock: str, tokens: list[int], q: Any) -> None:
    """One TP rank: its own UnifiedRadixCache (instance 1) writes the prefix, then a second
    instance on the same ranks prefetches it from kvbroker."""
    try:
        import torch.distributed as dist
        from sglang.srt.runtime_context import get_parallel

        torch.set_num_threads(1)
        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
        # A rank that fails leaves its peer in a collective: the group's timeout ends the
        # wait with an error instead of gloo's default half hour.
        dist.init_process_group("gloo", rank=rank, world_size=2,
                                timeout=datetime.timedelta(seconds=60))
        with get_parallel().override(tp_rank=rank, tp_size=2, pp_rank=0, pp_size=1,
                                     attn_dcp_size=1, attn_dcp_rank=0):
            g = dist.group.WORLD
            a, alloc, dev = S.radix_cache(sock, g, model=RADIX_MODEL, tp_size=2)
            # MLA: every rank's latent KV is the same bytes (same seed)
            want = S.write_prefix(a, alloc, dev, tokens, "write_through", seed=11, group=g)
            hashes = get_hash_str(tokens, None, page_size=PAGE)
            hits = S.backend(a).batch_exists(hashes)
            writer = S.backend(a).storage_config.is_storage_writer
            b, _, _ = S.radix_cache(sock, g, model=RADIX_MODEL, tp_size=2)
            S.read_prefix(b, tokens, "req-2", want, group=g)
            S.shut(a)
            S.shut(b)
        dist.destroy_process_group()
        q.put((rank, writer, hits, None))
    except BaseException as e:
        import traceback

        q.put((rank, None, None, traceback.format_exc() + repr(e)))


RADIX_MODEL = "tp2/DeepSeek-radix-test"


def _rank_server(rank: int, tasks: Any, q: Any) -> None:
    args = tasks.get()  # (port, socket, tokens), or None: the test did not run
    if args is not None:
        port, sock, tokens = args
        _radix_rank(rank, port, sock, tokens, q)


# The two rank processes are forked when this module is collected, before any test of the
# session has made a torch process group in this process: a group leaves gloo's threads
# behind, and a child forked with a copy of their locks can hang in its own group. They
# wait for the test's arguments; daemons, so a run that deselects the test ends them.
_FORK = mp.get_context("fork")
_TASKS = [_FORK.Queue() for _ in range(2)]
_RESULTS = _FORK.Queue()
_RANKS = [_FORK.Process(target=_rank_server, args=(r, _TASKS[r], _RESULTS), daemon=True)
          for r in range(2)]
for _p in _RANKS:
    _p.start()


def test_tp2_mla_radix_caches_one_copy_and_prefetch(broker: Broker) -> None:
    tokens = list(range(9000, 9000 + NPAGES * PAGE))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = _RANKS
    for t in _TASKS:
        t.put((port, broker.socket, tokens))
    try:
        res = sorted(_RESULTS.get(timeout=120) for _ in range(2))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():  # stuck: never leave it behind the test run
                p.kill()
                p.join()
    assert [r[3] for r in res] == [None, None], res
    assert [p.exitcode for p in procs] == [0, 0]
    assert [r[1] for r in res] == [True, False]  # rank 0 is SGLang's storage writer
    assert [r[2] for r in res] == [NPAGES, NPAGES]  # batch_exists alike on both ranks
    with kvb.connect(broker.socket, control=True) as c:
        st = c.stats()
    ns = [n for n in st["namespaces"] if n["model"] == "deepseek-radix-test"]
    assert len(ns) == 1 and ns[0]["pages"] == NPAGES and ns[0]["puts"] == NPAGES
