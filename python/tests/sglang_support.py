# SPDX-License-Identifier: MIT
"""SGLang 0.5.23 on the CPU for the kvbroker.sglang tests and bench: imports, host pools,
storage configs. Imported before anything from sglang.

SGLang's memory-pool module imports sglang.srt.configs, whose multimodal configs import
torchvision at module level; PyPI's torchvision does not load beside the CPU torch
("operator torchvision::nms does not exist"), and HiCache never uses it. So when torchvision
is absent, transformers is asked first (it caches "no torchvision") and then a module that
only names the two transforms symbols those configs import stands in for it. Nothing else
of SGLang is replaced: the storage, host-pool, hash and controller code under test is
SGLang's own.
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys
import time
import types
from collections.abc import Callable
from typing import Any

_IMPORT = {"seconds": 0.0}


def _torchvision_stand_in() -> None:
    if importlib.util.find_spec("torchvision") is not None:
        return
    from transformers.utils import import_utils

    import_utils.is_torchvision_available()  # lru_cached False before the stand-in exists
    import_utils.is_torchvision_v2_available()

    class _Names:
        def __getattr__(self, name: str) -> str:
            return name

    def unavailable(*args: Any, **kwargs: Any) -> Any:
        raise RuntimeError("torchvision is not installed (CPU test venv)")

    mods: dict[str, Any] = {}
    for name in ("torchvision", "torchvision.transforms", "torchvision.transforms.functional"):
        m = types.ModuleType(name)
        m.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mods[name] = sys.modules[name] = m
    mods["torchvision"].transforms = mods["torchvision.transforms"]
    tr = mods["torchvision.transforms"]
    tr.functional = mods["torchvision.transforms.functional"]
    tr.InterpolationMode = tr.functional.InterpolationMode = _Names()
    for n in ("Compose", "Lambda", "Resize", "ToTensor", "Normalize", "CenterCrop"):
        setattr(tr, n, unavailable)


def import_sglang() -> float:
    """Imports the SGLang modules the tests use; returns the seconds it took (once)."""
    if _IMPORT["seconds"]:
        return _IMPORT["seconds"]
    t = time.monotonic()
    # get_hash_str JIT-builds a C++ extension with torch's cpp_extension: ninja from the venv.
    bindir = os.path.dirname(sys.executable)
    if bindir not in os.environ.get("PATH", "").split(os.pathsep):
        os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")
    import warnings

    warnings.filterwarnings("ignore", module="sglang|transformers|gguf|requests")
    _torchvision_stand_in()
    import sglang.srt.managers.cache_controller
    import sglang.srt.mem_cache.hicache_storage
    import sglang.srt.mem_cache.memory_pool
    import sglang.srt.mem_cache.pool_host.mha
    import sglang.srt.mem_cache.pool_host.mla
    import sglang.srt.mem_cache.storage.backend_factory
    import sglang.srt.mem_cache.utils  # noqa: F401

    _IMPORT["seconds"] = time.monotonic() - t
    return _IMPORT["seconds"]


IMPORT_SECONDS = import_sglang()

import torch  # noqa: E402
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.storage.backend_factory import StorageBackendFactory  # noqa: E402

BACKEND: dict[str, Any] = {"backend_name": "kvbroker", "module_path": "kvbroker.sglang",
           "class_name": "KVBrokerStorage", "interface_v1": 1}


def mla_host_pool(layout: str = "page_first_direct", allocator: str = "shm", *,
                  layers: int = 3, page: int = 16, tokens: int = 256,
                  kv_lora_rank: int = 512, rope: int = 64,
                  dtype: torch.dtype = torch.bfloat16,
                  host_tokens: int | None = None) -> MLATokenToKVPoolHost:
    """SGLang's MLA host pool on the CPU, built as SGLang builds it from a device pool
    (hybrid_pool_assembler._build_mha_mla_host_pool), the device pool on "cpu" too.
    host_tokens: the host pool's size (SGLang's host_token_capacity); default twice the
    device pool's (--hicache-ratio 2)."""
    dev = MLATokenToKVPool(size=tokens, page_size=page, dtype=dtype, kv_lora_rank=kv_lora_rank,
                           qk_rope_head_dim=rope, layer_num=layers, device="cpu",
                           enable_memory_saver=False, start_layer=0, end_layer=layers)
    return MLATokenToKVPoolHost(
        dev.get_device_pool_infos()[0].buffer_info, host_to_device_ratio=2.0, host_size=0,
        page_size=page, layout=layout, pin_memory=False, device="cpu",
        allocator_type=allocator, device_capacity_tokens=dev.size,
        start_layer=dev.start_layer, end_layer=dev.end_layer, target_layer_num=dev.layer_num,
        override_kv_cache_dim=dev.kv_cache_dim, host_token_capacity=host_tokens)


def mha_host_pool(layout: str = "page_first_direct", allocator: str = "shm", *,
                  layers: int = 3, page: int = 16, tokens: int = 256, heads: int = 2,
                  head_dim: int = 64, dtype: torch.dtype = torch.float16,
                  head_group_num: int = 1) -> MHATokenToKVPoolHost:
    """SGLang's MHA host pool on the CPU, as its aibrix unit test and the assembler build it."""
    dev = MHATokenToKVPool(tokens, page, dtype, heads, head_dim, layers, "cpu", False,
                           start_layer=0, end_layer=layers)
    return MHATokenToKVPoolHost(
        dev.get_device_pool_infos()[0].buffer_info, 2.0, 0, page, layout, pin_memory=False,
        device="cpu", allocator_type=allocator, device_capacity_tokens=dev.size,
        start_layer=dev.start_layer, end_layer=dev.end_layer,
        write_back_staging=dev.hicache_write_back_staging, head_group_num=head_group_num)


def storage_config(*, mla: bool, tp_rank: int = 0, tp_size: int = 1, model: str = "test/Model",
                   layout: str = "page_first_direct", **extra: Any) -> HiCacheStorageConfig:
    """HiCacheStorageConfig as HiCacheController._generate_storage_config fills it
    (tp_lcm_size popped from the extra config; heads split for an MHA page_head pool whose
    tp_lcm_size exceeds its TP size)."""
    lcm = extra.pop("tp_lcm_size", None)
    return HiCacheStorageConfig(
        tp_rank=tp_rank, tp_size=tp_size, pp_rank=0, pp_size=1, attn_cp_rank=0,
        attn_cp_size=1, is_mla_model=mla, enable_storage_metrics=True,
        is_page_first_layout=layout == "page_first", model_name=model,
        tp_lcm_size=lcm,
        should_split_heads=bool(lcm) and not mla and layout == "page_head" and lcm > tp_size,
        extra_config=dict(extra))


def kvbroker_backend(pool: Any, socket: str, *, mla: bool, tp_rank: int = 0,
                     tp_size: int = 1, **extra: Any) -> Any:
    """The backend as SGLang makes it: StorageBackendFactory, "dynamic", then
    register_mem_pool_host (HiCacheController.attach_storage_backend)."""
    cfg = storage_config(mla=mla, tp_rank=tp_rank, tp_size=tp_size, layout=pool.layout,
                         socket=socket, **{**BACKEND, **extra})
    if pool.allocator.__class__.__name__ == "ShmHostTensorAllocator":
        cfg.extra_config["allocator"] = "shm"
    backend = StorageBackendFactory.create_backend("dynamic", cfg, pool)
    backend.register_mem_pool_host(pool)
    return backend


def fill(pool: Any, seed: int) -> None:
    """Random bytes in the whole host pool."""
    g = torch.Generator().manual_seed(seed)
    flat = pool.kv_buffer.view(-1).view(torch.uint8)
    flat.copy_(torch.randint(0, 256, flat.shape, dtype=torch.uint8, generator=g))


def indices(pages: list[int], page: int) -> torch.Tensor:
    """Host indices of whole pages, as the controller passes them (int64, page-aligned)."""
    return torch.cat([torch.arange(p * page, (p + 1) * page) for p in pages])


# ---- SGLang's radix cache (UnifiedRadixCache + HybridCacheController) on the CPU ----

def _direct_lf_pf(src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                  src_indices: torch.Tensor, dst_indices: torch.Tensor,
                  page_size: int) -> None:
    """sgl-kernel's transfer_kv_all_layer_direct_lf_pf on CPU tensors: device rows
    src_ptrs[c * L + l][src_indices] of every component c and layer l into the
    page_first_direct host buffer dst_ptrs[c] ([page][layer][token]...) at dst_indices."""
    n = len(src_ptrs) // len(dst_ptrs)
    hp, ht = dst_indices // page_size, dst_indices % page_size
    for c, dst in enumerate(dst_ptrs):
        for layer in range(n):
            dst[hp, layer, ht] = src_ptrs[c * n + layer][src_indices]


def _direct_pf_lf(src_ptrs: list[torch.Tensor], dst_ptrs: list[torch.Tensor],
                  src_indices: torch.Tensor, dst_indices: torch.Tensor, layer_id: int,
                  page_size: int) -> None:
    """sgl-kernel's transfer_kv_per_layer_direct_pf_lf on CPU tensors: layer layer_id of
    the page_first_direct host buffers at src_indices into the device rows dst_indices."""
    hp, ht = src_indices // page_size, src_indices % page_size
    for src, dst in zip(src_ptrs, dst_ptrs, strict=True):
        dst[dst_indices] = src[hp, layer_id, ht]


def cpu_l2_transfers() -> None:
    """What SGLang's device<->host (L2) copy needs of a GPU, made to run on the CPU, and
    nothing else: (1) the two sgl-kernel ops its page_first_direct/direct path calls
    (transfer_kv_all_layer_direct_lf_pf, transfer_kv_per_layer_direct_pf_lf: CUDA ops,
    sgl-kernel has no CPU build) as torch index copies of the same rows, bound in SGLang's
    MLA and MHA host-pool modules; (2) host pools allocated without cudaHostRegister (the
    pin of a GPU this machine lacks), through SGLang's own alloc_with_host_register. The
    radix cache, the controller, the host pools, the threads, the policies and the storage
    backend are SGLang's and kvbroker's own code; tests check the bytes end to end, so a
    wrong stand-in copy would fail them."""
    import sglang.srt.mem_cache.pool_host.mha as mha
    import sglang.srt.mem_cache.pool_host.mla as mla
    from sglang.srt.mem_cache.pool_host import common

    for mod in (mla, mha):
        mod.transfer_kv_all_layer_direct_lf_pf = _direct_lf_pf
        mod.transfer_kv_per_layer_direct_pf_lf = _direct_pf_lf

    def unpinned(dims: tuple[int, ...], dtype: torch.dtype, device: str, pin_memory: bool,
                 allocator: Any, registration_granularity_bytes: int | None = None
                 ) -> torch.Tensor:
        t: torch.Tensor = common.alloc_with_host_register(
            dims, dtype, device, False, allocator, registration_granularity_bytes)
        return t

    common.ALLOC_MEMORY_FUNCS["cpu"] = unpinned


def radix_cache(sock: str, group: Any, *, write_policy: str = "write_through",
                prefetch_policy: str = "wait_complete", host_memory_mode: str = "cache",
                model: str = "radix/Model", page: int = 16, tokens: int = 256,
                layers: int = 3, tp_size: int = 1, **extra: Any) -> tuple[Any, Any, Any]:
    """SGLang's hierarchical radix cache as the scheduler builds it (registry: a
    UnifiedRadixCache with the FULL component, then init_hicache with the server args):
    an MLA model on the CPU, page_first_direct host pool with the direct I/O backend, L3 =
    kvbroker through the "dynamic" backend. Returns (cache, allocator, device pool)."""
    import json

    from sglang.srt.mem_cache.allocator.paged import PagedTokenToKVPoolAllocator
    from sglang.srt.mem_cache.cache_init_params import CacheInitParams
    from sglang.srt.mem_cache.memory_pool import ReqToTokenPool
    from sglang.srt.mem_cache.unified_cache.components import ComponentType
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    cpu_l2_transfers()
    # model_path "dummy": ServerArgs reads a real path's HF config; the namespace's model
    # name comes from the backend's "model" key instead.
    cfg = dict(BACKEND, socket=sock, allocator="shm", prefetch_threshold=page, model=model,
               **extra)
    args = ServerArgs(model_path="dummy", page_size=page, tp_size=tp_size,
                      enable_hierarchical_cache=True,
                      hicache_io_backend="direct", hicache_mem_layout="page_first_direct",
                      hicache_write_policy=write_policy, hicache_storage_backend="dynamic",
                      hicache_storage_backend_extra_config=json.dumps(cfg),
                      hicache_storage_prefetch_policy=prefetch_policy, hicache_ratio=2.0,
                      hicache_host_memory_mode=host_memory_mode)
    set_global_server_args_for_scheduler(args)
    dev = MLATokenToKVPool(size=tokens, page_size=page, dtype=torch.bfloat16,
                           kv_lora_rank=512, qk_rope_head_dim=64, layer_num=layers,
                           device="cpu", enable_memory_saver=False, start_layer=0,
                           end_layer=layers)
    alloc = PagedTokenToKVPoolAllocator(tokens, page, torch.bfloat16, "cpu", dev,
                                        need_sort=False)
    rtp = ReqToTokenPool(size=8, max_context_len=4096, device="cpu", enable_memory_saver=False)
    params = CacheInitParams(disable=False, req_to_token_pool=rtp,
                             token_to_kv_pool_allocator=alloc, page_size=page,
                             tp_cache_group=group, tree_components=(ComponentType.FULL,))
    cache = UnifiedRadixCache(params)
    cache.init_hicache(args, params)
    return cache, alloc, dev


def pump(cache: Any, done: Callable[[], bool], what: str, timeout: float = 20,
         group: Any = None) -> None:
    """Scheduler ticks (check_hicache_events) until done(). With a TP group of several
    ranks the ranks tick in lockstep (the tick's collectives need every rank) and stop when
    done() holds on all of them."""
    import torch.distributed as dist

    deadline = time.monotonic() + timeout
    while True:
        cache.check_hicache_events()
        ok = bool(done())
        if group is not None and dist.get_world_size(group) > 1:
            t = torch.tensor(int(ok or time.monotonic() > deadline), dtype=torch.int)
            dist.all_reduce(t, op=dist.ReduceOp.MIN, group=group)
            stop = bool(t.item())
        else:
            stop = ok
        if stop:
            assert ok, what
            return
        assert time.monotonic() < deadline, what
        time.sleep(0.005)


def ticks(cache: Any, n: int = 10) -> None:
    """n scheduler ticks (every rank of a TP group ticks n times)."""
    for _ in range(n):
        cache.check_hicache_events()
        time.sleep(0.005)


def fill_device(dev: Any, idx: torch.Tensor, seed: int) -> list[torch.Tensor]:
    """Random bytes in rows idx of every layer (the forward pass's KV); returns them."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for buf in dev.kv_buffer:
        rows = buf[idx].view(torch.uint8)
        new = torch.randint(0, 256, rows.shape, dtype=torch.uint8, generator=g)
        buf[idx] = new.view(buf.dtype).view(buf[idx].shape)
        out.append(new)
    return out


def device_rows(dev: Any, idx: torch.Tensor) -> list[torch.Tensor]:
    return [buf[idx].view(torch.uint8) for buf in dev.kv_buffer]


def backend(cache: Any) -> Any:
    """The cache's storage backend: kvbroker.sglang's KVBrokerStorage."""
    from kvbroker.sglang import KVBrokerStorage

    b = cache.cache_controller.storage_backend
    assert isinstance(b, KVBrokerStorage)
    return b


def shut(cache: Any) -> None:
    """What the scheduler's shutdown does for the cache (and no atexit pin)."""
    import atexit

    atexit.unregister(cache.shutdown)
    cache.cache_controller.detach_storage_backend()
    cache.release_host_resources()


def write_prefix(cache: Any, alloc: Any, dev: Any, tokens: list[int], policy: str,
                 seed: int, group: Any = None) -> list[torch.Tensor]:
    """A finished request's prefix into the tree, then what the write policy does with
    it, until its pages are in kvbroker (on a TP group: rank 0's write, every rank's ack).
    Returns the device bytes written."""
    from array import array

    from sglang.srt.mem_cache.base_prefix_cache import (
        EvictParams,
        InsertParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.mem_cache.utils import get_hash_str

    n, page = len(tokens), cache.page_size
    hashes = get_hash_str(tokens, None, page_size=page)
    key = RadixKey(array("q", tokens))
    v = alloc.alloc(n)
    want = fill_device(dev, v, seed)
    cache.insert(InsertParams(key=key, value=v))
    b = backend(cache)
    if policy != "write_through":
        # write_through_selective backs up a prefix on its second hit, write_back when the
        # device evicts it: one insert alone reaches neither host nor storage.
        ticks(cache)
        assert b.batch_exists(hashes) == 0
    if policy == "write_through_selective":
        cache.insert(InsertParams(key=key, value=v))  # the same prefix finished again
    if policy == "write_back":
        assert cache.evict(EvictParams(num_tokens=n)).num_tokens_evicted == n
        m = cache.match_prefix(MatchPrefixParams(key=key))
        host = 0 if cache.host_memory_mode == "buffer_only" else n
        assert (m.device_prefix_len, m.host_hit_length) == (0, host)  # evicted to host
    pump(cache, lambda: b.batch_exists(hashes) == len(hashes) and not cache.ongoing_backup,
         f"{policy}: pages never reached kvbroker", group=group)
    return want


def read_prefix(cache: Any, tokens: list[int], rid: str, want: list[torch.Tensor],
                policy: str = "wait_complete", group: Any = None) -> None:
    """Another instance's request for the prefix: a tree miss, SGLang's prefetch from
    storage (on a TP group: hits and progress MIN-reduced across the ranks), the host hit
    it leaves, the load back to the device; the device rows are the writer's bytes."""
    from array import array

    from sglang.srt.managers.schedule_batch import Req
    from sglang.srt.mem_cache.base_prefix_cache import (
        CacheRequestHandle,
        InitLoadBackParams,
        MatchPrefixParams,
    )
    from sglang.srt.mem_cache.radix_cache import RadixKey
    from sglang.srt.sampling.sampling_params import SamplingParams

    n = len(tokens)
    key = RadixKey(array("q", tokens))
    m = cache.match_prefix(MatchPrefixParams(key=key))
    assert (m.device_prefix_len, m.host_hit_length) == (0, 0)
    h = CacheRequestHandle(rid, 0)
    cache.prefetch_from_storage(h, m.last_host_node, array("q", tokens))
    b = backend(cache)
    pages = n // cache.page_size
    if policy == "best_effort":
        # best_effort takes what has arrived when the request is scheduled: let the
        # prefetch finish first, then the progress check ends it at once.
        pump(cache, lambda: b.stats.totals["get_hits"] >= pages, "prefetch never loaded",
             group=group)
        ticks(cache, 3)
        assert cache.check_prefetch_progress(h)
    else:
        pump(cache, lambda: bool(cache.check_prefetch_progress(h)),
             f"{policy}: prefetch did not finish", group=group)
    m = cache.match_prefix(MatchPrefixParams(key=key))
    assert (m.device_prefix_len, m.host_hit_length) == (0, n)
    req = Req(rid=rid, origin_input_text="", origin_input_ids=array("q", tokens),
              sampling_params=SamplingParams(temperature=0, max_new_tokens=1))
    cache.req_to_token_pool.alloc([req])
    req.prefix_len, req.last_node = m.device_prefix_len, m.last_device_node
    req.last_host_node, req.host_hit_length = m.last_host_node, m.host_hit_length
    loaded = cache.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                     host_hit_length=n, req=req))
    assert loaded is not None and loaded[0] == n
    cache.ready_to_load_host_cache()
    pump(cache, lambda: not cache.ongoing_load_back, "load back did not finish", group=group)
    m = cache.match_prefix(MatchPrefixParams(key=key))
    assert m.device_prefix_len == n
    got = device_rows(cache.token_to_kv_pool_allocator.get_kvcache(),
                      cache.path_device_indices(m.last_device_node))
    assert all(torch.equal(a, w) for a, w in zip(got, want, strict=True))
