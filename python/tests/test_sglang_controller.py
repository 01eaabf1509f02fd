# SPDX-License-Identifier: MIT
"""SGLang's own HiCacheController on the CPU, storage backend "dynamic" = kvbroker.sglang:
its backup thread writes pages through batch_set_v1, its prefetch threads find them with
batch_exists and load them with batch_get_v1 (interface_v1), end to end.

The test plays the scheduler's part the way UnifiedRadixCache does it: write_storage() and
the ack_backup_queue; prefetch(), then from prefetch_hit_queue allocate host pages and hand
the operation to prefetch_buffer, then read ack_prefetch_queue. A single-rank gloo group and
a ParallelContext override stand in for SGLang's launcher.
"""

from __future__ import annotations

import sglang_support as S  # first: imports SGLang (see there)

# isort: split

import threading
from typing import Any

import torch
from sglang.srt.managers.cache_controller import HiCacheController
from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
from sglang.srt.mem_cache.memory_pool import MLATokenToKVPool
from sglang.srt.mem_cache.utils import get_hash_str

from conftest import Broker
from kvbroker.sglang import KVBrokerStorage

PAGE = 16


def controller(group: Any, sock: str) -> HiCacheController:
    dev = MLATokenToKVPool(size=256, page_size=PAGE, dtype=torch.bfloat16, kv_lora_rank=512,
                           qk_rope_head_dim=64, layer_num=3, device="cpu",
                           enable_memory_saver=False, start_layer=0, end_layer=3)
    alloc = PagedTokenToKVPoolAllocator(256, PAGE, torch.bfloat16, "cpu", dev, need_sort=False)
    host = S.mla_host_pool("page_first_direct", "shm", page=PAGE, tokens=256)
    extra = dict(S.BACKEND, socket=sock, allocator="shm")
    return HiCacheController(alloc, host, PAGE, group, threading.Event(),
                             write_policy="write_through", io_backend="direct",
                             storage_backend="dynamic", prefetch_threshold=PAGE,
                             model_name="ctrl/Model", storage_backend_extra_config=extra)


def test_controller_backup_then_prefetch(gloo: Any, broker: Broker) -> None:
    writer = controller(gloo, broker.socket)
    reader = controller(gloo, broker.socket)  # another instance: its own pool and client
    try:
        assert isinstance(writer.storage_backend, KVBrokerStorage)
        assert writer.page_set_func.__name__ == "_page_set_zero_copy"
        assert writer.storage_backend.zero_copy
        npages = 6
        tokens = list(range(7000, 7000 + npages * PAGE))
        hashes = get_hash_str(tokens, None, page_size=PAGE)
        wpool = writer.mem_pool_host
        S.fill(wpool, 77)
        src = wpool.alloc(npages * PAGE)
        want = [wpool.get_data_page(int(i), flat=True).view(torch.uint8).clone()
                for i in src[::PAGE]]
        writer.write_storage(src, tokens, hash_value=hashes)
        done = writer.ack_backup_queue.get(timeout=20)
        assert done.completed_tokens == npages * PAGE

        op = reader.prefetch("req-1", tokens)
        hit = reader.prefetch_hit_queue.get(timeout=20)
        assert hit is op and op.storage_hit_count == npages * PAGE
        assert op.hash_value == hashes
        dst = reader.alloc_prefetch_host_buffers(op, op.storage_hit_count)
        op.host_indices = dst
        reader.prefetch_buffer.put(op)
        completed = None
        while True:
            ack = reader.ack_prefetch_queue.get(timeout=20)
            if ack.completed_req:
                break
            completed = ack.completed_tokens
        assert completed == npages * PAGE
        rpool = reader.mem_pool_host
        got = [rpool.get_data_page(int(i), flat=True).view(torch.uint8) for i in dst[::PAGE]]
        assert all(torch.equal(a, b) for a, b in zip(got, want, strict=True))
        # SGLang's own metrics poll sees the traffic
        m = reader.storage_backend.get_stats()
        assert sum(m.prefetch_pgs) == npages
        # a prefix that is not stored: no hit, nothing loaded
        op2 = reader.prefetch("req-2", list(range(9000, 9000 + 2 * PAGE)))
        assert reader.prefetch_hit_queue.get(timeout=20).storage_hit_count == 0
        op2.mark_terminate()
    finally:
        for c in (writer, reader):
            c.detach_storage_backend()
