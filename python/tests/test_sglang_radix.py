# SPDX-License-Identifier: MIT
"""SGLang 0.5.23's hierarchical radix cache with kvbroker as its L3, built and driven as its
scheduler does: a UnifiedRadixCache (FULL component, the Rust tree core SGLang picks) with
init_hicache, which builds SGLang's HybridCacheController, its host pool group and the
"dynamic" storage backend = kvbroker.sglang. The test calls what the scheduler calls:
insert (the finished request's prefix), match_prefix, evict, check_hicache_events every
tick, prefetch_from_storage and check_prefetch_progress, init_load_back and
ready_to_load_host_cache; every write policy and every prefetch policy, and buffer_only host
memory.

GPU step: the device<->host copy of the direct I/O backend is two sgl-kernel CUDA ops
(transfer_kv_all_layer_direct_lf_pf, transfer_kv_per_layer_direct_pf_lf) that have no CPU
build, and host pools pin their memory with cudaHostRegister. sglang_support.cpu_l2_transfers
binds those two op names to torch row copies and allocates the pools unpinned; nothing else
of SGLang is replaced. The device pool's bytes are checked end to end: random KV rows of the
writer's device pool are the reader's device rows after L3 -> host -> device.
"""

from __future__ import annotations

import sglang_support as S  # first: imports SGLang (see there)

# isort: split

import logging
from array import array
from pathlib import Path
from typing import Any

import pytest
import torch
from sglang.srt.mem_cache.base_prefix_cache import (
    CacheRequestHandle,
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.radix_cache import RadixKey
from sglang.srt.mem_cache.utils import get_hash_str

from conftest import Broker

PAGE = 16
NPAGES = 4


def read_staged(cache: Any, tokens: list[int], rid: str, want: list[torch.Tensor]) -> None:
    """buffer_only: SGLang's prefetch stages the storage hit in the host buffer, and the
    request's admission (PrefillAdder: prepare_staged_prefetch, init_load_back under the
    prefix lock) moves it to the device; the rows are the writer's bytes."""
    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.sampling.sampling_params import SamplingParams

    n = len(tokens)
    key = RadixKey(array("q", tokens))
    m = cache.match_prefix(MatchPrefixParams(key=key))
    h = CacheRequestHandle(rid, 0)
    cache.prefetch_from_storage(h, m.last_host_node, array("q", tokens))
    S.pump(cache, lambda: bool(cache.check_prefetch_progress(h)), "prefetch did not finish")
    pipe = cache.buffer_pipeline
    assert pipe.has_staged(h)
    req = Req(rid=rid, origin_input_text="", origin_input_ids=array("q", tokens),
              sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    cache.req_to_token_pool.alloc([req])
    req.cache_request_handle = h
    req.extra_key = req.cache_salt = None
    m = cache.match_prefix(MatchPrefixParams(key=key))
    req.prefix_len, req.last_node = m.device_prefix_len, m.last_device_node
    assert pipe.prepare_staged_prefetch(req)
    lock = cache.lock(req.last_node)
    try:
        loaded = cache.init_load_back(InitLoadBackParams(
            best_match_node=None, host_hit_length=req.host_hit_length, req=req))
    finally:
        cache.unlock(lock)
    assert loaded is not None and loaded[0] == n
    cache.ready_to_load_host_cache()
    S.pump(cache, lambda: not pipe.ongoing_buffer_load_back, "staged load did not commit")
    m = cache.match_prefix(MatchPrefixParams(key=key))
    assert m.device_prefix_len == n
    got = S.device_rows(cache.token_to_kv_pool_allocator.get_kvcache(),
                      cache.path_device_indices(m.last_device_node))
    assert all(torch.equal(x, w) for x, w in zip(got, want, strict=True))
    host = cache.cache_controller.mem_pool_host
    assert host.available_size() == host.size  # staging freed at the H2D ack


@pytest.mark.parametrize(("write_policy", "prefetch_policy"), [
    ("write_through", "best_effort"), ("write_through_selective", "wait_complete"),
    ("write_back", "timeout")])
def test_radix_cache_writes_and_prefetches_through_kvbroker(
        gloo: Any, broker: Broker, write_policy: str, prefetch_policy: str) -> None:
    """Instance A backs a prefix up through its write policy (write_back: by evicting it
    to host), instance B (its own pools and client) finds it with SGLang's prefetch under
    a prefetch policy and loads it to its device byte for byte."""
    model = f"radix/{write_policy}"
    a, a_alloc, a_dev = S.radix_cache(broker.socket, gloo, write_policy=write_policy,
                                      prefetch_policy=prefetch_policy, model=model)
    b, _, _ = S.radix_cache(broker.socket, gloo, write_policy=write_policy,
                            prefetch_policy=prefetch_policy, model=model)
    try:
        assert S.backend(a).zero_copy and S.backend(b).zero_copy
        tokens = list(range(1000, 1000 + NPAGES * PAGE))
        want = S.write_prefix(a, a_alloc, a_dev, tokens, write_policy, seed=3)
        S.read_prefix(b, tokens, "req-b", want, prefetch_policy)
        # SGLang's metrics poll reads the backend's counters each tick
        assert sum(S.backend(b).get_stats().prefetch_pgs) in (0, NPAGES)
    finally:
        S.shut(a)
        S.shut(b)


def test_radix_cache_buffer_only(gloo: Any, broker: Broker) -> None:
    """--hicache-host-memory-mode buffer_only: the host pool only stages; a prefix evicted
    from the device leaves no host copy, its one copy is kvbroker's, and the next instance
    loads it from there."""
    a, a_alloc, a_dev = S.radix_cache(broker.socket, gloo, host_memory_mode="buffer_only",
                                      model="radix/buffer-only")
    b, _, _ = S.radix_cache(broker.socket, gloo, host_memory_mode="buffer_only",
                            model="radix/buffer-only")
    try:
        assert a.buffer_pipeline is not None
        tokens = list(range(5000, 5000 + NPAGES * PAGE))
        want = S.write_prefix(a, a_alloc, a_dev, tokens, "write_through", seed=5)
        key = RadixKey(array("q", tokens))
        assert a.evict(EvictParams(num_tokens=len(tokens))).num_tokens_evicted == len(tokens)
        S.ticks(a)
        m = a.match_prefix(MatchPrefixParams(key=key))
        assert (m.device_prefix_len, m.host_hit_length) == (0, 0)  # no host copy kept
        host = a.cache_controller.mem_pool_host
        assert host.available_size() == host.size  # the staging buffer is empty again
        assert S.backend(a).batch_exists(get_hash_str(tokens, None, page_size=PAGE)) == NPAGES
        read_staged(b, tokens, "req-buf", want)
    finally:
        S.shut(a)
        S.shut(b)


def test_radix_cache_without_broker(gloo: Any, tmp_path: Path,
                                    caplog: pytest.LogCaptureFixture) -> None:
    """No broker on the socket: SGLang starts and serves from its device and host tiers,
    kvbroker says so in one log line, the backups to storage fail without an exception and
    a prefetch finds nothing."""
    sock = str(tmp_path / "none.sock")
    with caplog.at_level(logging.INFO):
        a, alloc, dev = S.radix_cache(sock, gloo, model="radix/no-broker",
                                      retry_interval_s=0.05)
        try:
            tokens = list(range(7000, 7000 + NPAGES * PAGE))
            key = RadixKey(array("q", tokens))
            v = alloc.alloc(len(tokens))
            want = S.fill_device(dev, v, 9)
            a.insert(InsertParams(key=key, value=v))  # write_through: to host, L3 fails
            S.ticks(a, 20)
            assert a.evict(EvictParams(num_tokens=len(tokens))).num_tokens_evicted
            m = a.match_prefix(MatchPrefixParams(key=key))
            assert (m.device_prefix_len, m.host_hit_length) == (0, len(tokens))  # L2 works
            other = list(range(8000, 8000 + NPAGES * PAGE))
            m2 = a.match_prefix(MatchPrefixParams(key=RadixKey(array("q", other))))
            h = CacheRequestHandle("req-none", 0)
            a.prefetch_from_storage(h, m2.last_host_node, array("q", other))
            S.pump(a, lambda: bool(a.check_prefetch_progress(h)), "prefetch hung")
            m2 = a.match_prefix(MatchPrefixParams(key=RadixKey(array("q", other))))
            assert m2.host_hit_length == 0
            assert len(want) == dev.layer_num
        finally:
            S.shut(a)
    ours = [r.getMessage() for r in caplog.records
            if r.name == "kvbroker.sglang" and r.levelno >= logging.WARNING]
    assert len(ours) == 1 and "no broker" in ours[0] and "without the L3 tier" in ours[0]
