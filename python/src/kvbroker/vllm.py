# SPDX-License-Identifier: MIT
"""kvbroker as vLLM's KV offload tier: a v1 KV connector for vllm==0.33.0.

Launch vLLM with::

    --kv-transfer-config '{"kv_connector": "KVBrokerConnector",
                           "kv_connector_module_path": "kvbroker.vllm",
                           "kv_role": "kv_both",
                           "kv_connector_extra_config": {"socket": "/run/kvbroker/kvb.sock"}}'

Pages are keyed by kvbroker chain keys of the request's token ids, one per full vLLM block
(SGLang HiCache's get_hash_str chain), not by vLLM's own block hashes, so a vLLM and an SGLang
instance serving the same model with the same page size, KV dtype and parallel layout find
each other's pages. Everything else that decides whether two pages are the same bytes (model,
MLA/MHA, dtype, TP/PP ranks, components) is the namespace identity, not part of the key.

Scheduler side: one batched LOOKUP per request gives the number of leading blocks the broker
holds (get_num_new_matched_tokens); loads are synchronous to the step (the worker runs them
while the model computes, layer group by layer group), so the scheduler never waits.
Prompt blocks are stored in the step that computes them; at request_finished the remaining
full, computed blocks (the generated ones) are stored before vLLM frees them.

Worker side: vLLM's KV tensors are described to the broker as views (one part per component
and layer: token slot = block_id * block_size + offset), so the broker itself copies between
its pool and vLLM's memory: GPU tensors through GPU registration (the broker DMAs), CPU
tensors by moving them once into a sealed memfd that the broker maps (zero-copy from then
on). Where neither works the connector copies through a broker buffer (slower, same bytes).

Failures never become wrong data: a miss, an error or a broker that died makes the blocks
"load errors" (get_block_ids_with_load_errors), which vLLM recomputes (the connector sets
kv_load_failure_policy to "recompute"). Without a broker vLLM serves as if no connector were
configured, and the connector reconnects by itself (at most every ``reconnect_s`` seconds).

kv_connector_extra_config keys (all optional):
  socket        broker socket (default $KVB_SOCKET, then kvbroker's default path)
  model         namespace model name (default: basename of the served model path)
  layer_groups  layer groups a load is split into, waited for one by one (default 4; 1: all
                layers at once before the first layer runs)
  op_timeout_ms how long to wait for the broker before a transfer counts as failed (10000)
  reconnect_s   least time between two reconnection attempts (1.0)
  zero_copy     false: never register or move vLLM's memory, copy through a buffer (true)
  save_prompt   false: store only at request end (true: prompt blocks as they are computed)
  keep_load_failure_policy  true: leave kv_load_failure_policy as configured (false)
  early_lookup  false: no LOOKUP at admission (on_new_request), only in the match (true)
  lookup_wait_ms     how long the match waits for an early LOOKUP still running before it
                     asks vLLM to come back next step (2)
  lookup_max_age_ms  an early answer older than this is asked again (500)
  tp_rank / tp_size  override the tensor-parallel rank/size (tests; default: vLLM's)
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import ctypes
import hashlib
import logging
import mmap
import os
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)
from vllm.v1.kv_cache_interface import AttentionSpec, MLAAttentionSpec

import kvbroker as kvb
from kvbroker._layout import model_ns_name

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

__all__ = [
    "KVBrokerConnector",
    "KVBrokerMetadata",
    "KVBrokerStats",
    "model_ns_name",
    "namespace_layouts",
]

logger = logging.getLogger("kvbroker.vllm")

_USER_DATA_MASK = (1 << 62) - 1

# cache_dtype values whose elements are a plain dtype kvbroker names; any other quantized
# cache format goes into the namespace's page_format so it never shares with a plain one.
_CACHE_DTYPES = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "fp8_e5m2": "fp8_e5m2",
                 "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}


# ---------------------------------------------------------------------------------------------
# Namespace identity: computed from the KV cache config, identically in the scheduler and in
# every worker (and by SGLang's backend for the same model: docs/vllm.md says what must match).
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _GroupPlan:
    """One prefix-cacheable KV cache group and the namespace its pages live in."""

    group_id: int
    layer_names: tuple[str, ...]
    mla: bool
    # (component name, bytes per token and layer, which half of an MHA layer: 0 K, 1 V, -1 MLA)
    components: tuple[tuple[str, int, int], ...]
    layout: kvb.Layout


def _model_name(vllm_config: VllmConfig, extra: dict[str, Any]) -> str:
    if extra.get("namespace"):
        return str(extra["namespace"])  # verbatim
    name = extra.get("model")
    if not name:
        mc = vllm_config.model_config
        served = getattr(mc, "served_model_name", None)
        if isinstance(served, (list, tuple)):
            served = served[0] if served else None
        name = served or mc.model
    return model_ns_name(str(name))


def _dtype_and_format(vllm_config: VllmConfig, spec: AttentionSpec) -> tuple[str, str]:
    cache_dtype = str(vllm_config.cache_config.cache_dtype)
    if cache_dtype == "auto":
        return str(spec.dtype).removeprefix("torch."), ""
    if cache_dtype in _CACHE_DTYPES:
        return _CACHE_DTYPES[cache_dtype], ""
    return "", ("vllm:" + cache_dtype)[:31]


def namespace_layouts(vllm_config: VllmConfig, kv_cache_config: KVCacheConfig,
                      tp_rank: int = 0, tp_size: int | None = None,
                      pp_rank: int = 0) -> list[_GroupPlan]:
    """The namespaces of a vLLM configuration: one per prefix-cacheable KV cache group.

    Group 0's namespace is the model's (what SGLang uses for the same model); further
    groups (HMA: e.g. an indexer cache) get "<model>/g<id>". MLA groups carry no TP identity
    (every rank holds the same latent KV), MHA groups carry the TP rank and size.
    """
    ktc = vllm_config.kv_transfer_config
    extra = (ktc.kv_connector_extra_config if ktc is not None else None) or {}
    par = vllm_config.parallel_config
    if tp_size is None:
        tp_size = int(par.tensor_parallel_size)
    model = _model_name(vllm_config, extra)
    plans = []
    for gid in kv_cache_config.prefix_cacheable_group_ids:
        group = kv_cache_config.kv_cache_groups[gid]
        spec = group.kv_cache_spec
        if not isinstance(spec, AttentionSpec):
            raise ValueError(f"kvbroker: KV cache group {gid} is {type(spec).__name__}, "
                             "only attention caches can be stored")
        if getattr(spec, "sliding_window", None) or getattr(spec, "attention_chunk_size", None):
            raise ValueError(f"kvbroker: KV cache group {gid} is windowed attention")
        mla = isinstance(spec, MLAAttentionSpec)
        esize = torch.empty((), dtype=spec.dtype).element_size()
        nheads = spec.num_heads
        if mla:
            comps: tuple[tuple[str, int, int], ...] = (("kv", nheads * spec.head_size * esize, -1),)
        else:
            comps = (("k", nheads * spec.head_size * esize, 0),
                     ("v", nheads * spec.head_size_v * esize, 1))
        dtype, page_format = _dtype_and_format(vllm_config, spec)
        nlayers = len(group.layer_names)
        name = model if gid == kv_cache_config.prefix_cacheable_group_ids[0] else \
            f"{model[:56]}/g{gid}"
        layout = kvb.Layout(
            name, kvb.MLA if mla else kvb.MHA, spec.block_size,
            [kvb.Component(c, nlayers, b) for c, b, _ in comps],
            tp_size=1 if mla else tp_size, tp_rank=0 if mla else tp_rank, dtype=dtype,
            pp_size=int(par.pipeline_parallel_size), pp_rank=pp_rank, page_format=page_format,
            # DP replicas of MLA hold the same pages; MHA states its DP group (not identity
            # for the broker, but what SGLang states too).
            dp_size=1 if mla else int(par.data_parallel_size),
            dp_rank=0 if mla else int(par.data_parallel_rank))
        plans.append(_GroupPlan(gid, tuple(group.layer_names), mla, comps, layout))
    if not plans:
        raise ValueError("kvbroker: no prefix-cacheable KV cache group")
    if len({p.layout.tokens_per_page for p in plans}) != 1:
        raise ValueError("kvbroker: KV cache groups of different block sizes")
    return plans


def storage_namespace_seed(extra_key: str | None, cache_salt: str | None) -> bytes | None:
    """The parent of a chain's first page for requests namespaced by a salt, byte for byte
    SGLang 0.5.23's mem_cache.utils.storage_namespace_seed (so a salted request finds what a
    SGLang request with the same cache_salt stored): None without either part.
    """
    if extra_key is None and cache_salt is None:
        return None
    h = hashlib.sha256(b"sglang-cache-namespace-v1")
    for part in (extra_key, cache_salt):
        if part is None:
            h.update(b"\x00")
            continue
        enc = part.encode("utf-8")
        h.update(b"\x01" + len(enc).to_bytes(8, "little") + enc)
    return h.digest()


def _salt_parent(request: Request) -> bytes | None:
    """The chain's parent for requests whose KV depends on more than their tokens: a cache
    salt (SGLang's seed, shared) or a LoRA adapter (an extra key only vLLM uses: the same
    adapter name in SGLang is not known to be the same weights).
    """
    lora = getattr(request, "lora_request", None)
    extra_key = None if lora is None else \
        "vllm-lora:" + str(getattr(lora, "lora_name", None) or getattr(lora, "name", lora))
    return storage_namespace_seed(extra_key, getattr(request, "cache_salt", None))


def _owner(key: bytes, n: int) -> int:
    """Which of n ranks stores a page of a namespace all ranks share (MLA)."""
    return int.from_bytes(key[:4], "little") % n if n > 1 else 0


# ---------------------------------------------------------------------------------------------
# Metadata (scheduler -> workers) and statistics
# ---------------------------------------------------------------------------------------------


@dataclass
class _Transfer:
    req_id: str
    keys: list[bytes]
    block_ids: list[list[int]]  # [group index in plans][page index]
    # The key of the page before keys[0] in the request's chain (None: keys[0] is its head):
    # a store names each page's parent, so the broker evicts the chain tail first.
    parent: bytes | None = None


@dataclass
class KVBrokerMetadata(KVConnectorMetadata):
    """What the workers move in one step: pages to load, pages to store, requests whose
    blocks vLLM keeps until their finishing stores are done.
    """

    loads: list[_Transfer] = field(default_factory=list)
    saves: list[_Transfer] = field(default_factory=list)
    finish_req_ids: list[str] = field(default_factory=list)


_STAT_KEYS = ("lookups", "lookup_tokens", "hit_tokens", "loaded_pages", "load_errors",
              "stored_pages", "existed_pages", "store_errors", "loaded_bytes", "stored_bytes",
              "load_s", "store_s", "broker_down")


@dataclass
class KVBrokerStats(KVConnectorStats):
    """Counters of one interval (summed over workers and the scheduler)."""

    def __post_init__(self) -> None:
        for k in _STAT_KEYS:
            self.data.setdefault(k, 0)

    def reset(self) -> None:
        """Zeroes every counter."""
        self.data = {k: 0 for k in _STAT_KEYS}

    def aggregate(self, other: KVConnectorStats) -> KVBrokerStats:
        """Adds another interval's (or worker's) counters into these."""
        for k, v in other.data.items():
            self.data[k] = self.data.get(k, 0) + v
        return self

    def reduce(self) -> dict[str, int | float]:
        """The counters for vLLM's log line, with GB/s where time was spent."""
        d = dict(self.data)
        if d["load_s"] > 0:
            d["load_GBps"] = round(d["loaded_bytes"] / d["load_s"] / 1e9, 2)
        if d["store_s"] > 0:
            d["store_GBps"] = round(d["stored_bytes"] / d["store_s"] / 1e9, 2)
        return d

    def is_empty(self) -> bool:
        """True when nothing was counted."""
        return not any(self.data.values())


class KVBrokerPromMetrics(KVConnectorPromMetrics):
    """vllm:kvbroker_* counters, one child per engine."""

    _COUNTERS: ClassVar[dict[str, str]] = {
        "hit_tokens": "Prompt tokens found in kvbroker",
        "lookup_tokens": "Prompt tokens looked up in kvbroker",
        "loaded_pages": "Pages loaded from kvbroker",
        "stored_pages": "Pages stored into kvbroker",
        "existed_pages": "Pages another process had already stored",
        "load_errors": "Pages that failed to load (recomputed)",
        "store_errors": "Pages that failed to store",
        "loaded_bytes": "Bytes loaded from kvbroker",
        "stored_bytes": "Bytes stored into kvbroker",
        "broker_down": "Transfers or lookups skipped or failed because the broker was away",
    }

    def __init__(self, vllm_config: Any, metric_types: Any, labelnames: list[str],
                 per_engine_labelvalues: dict[int, list[object]]) -> None:
        super().__init__(vllm_config, metric_types, labelnames, per_engine_labelvalues)
        self._children: dict[str, dict[int, Any]] = {}
        for k, doc in self._COUNTERS.items():
            metric = self._counter_cls(name=f"vllm:kvbroker_{k}", documentation=doc,
                                       labelnames=labelnames)
            self._children[k] = {i: metric.labels(*v) for i, v in per_engine_labelvalues.items()}

    def observe(self, transfer_stats_data: dict[str, Any], engine_idx: int = 0) -> None:
        for k, children in self._children.items():
            v = transfer_stats_data.get(k, 0)
            if v and engine_idx in children:
                children[engine_idx].inc(v)


# ---------------------------------------------------------------------------------------------
# The broker connection, shared by both roles: connect lazily, fail fast, retry later.
# ---------------------------------------------------------------------------------------------


class _Link:
    """A client and the namespaces of the plans; None while the broker is away."""

    def __init__(self, socket: str | None, name: str, plans: list[_GroupPlan],
                 reconnect_s: float, on_connect: Any = None) -> None:
        self.socket = socket
        self.name = name
        self.plans = plans
        self.reconnect_s = reconnect_s
        self.on_connect = on_connect
        self.client: kvb.Client | None = None
        self.ns: list[kvb.Namespace] = []
        self._next_try = 0.0
        self.down_events = 0
        self.lock = threading.RLock()

    def get(self) -> kvb.Client | None:
        if self.client is not None:
            return self.client
        now = time.monotonic()
        if now < self._next_try:
            return None
        self._next_try = now + self.reconnect_s
        try:
            c = kvb.connect(self.socket, name=self.name)
            self.ns = [c.ns_open(p.layout) for p in self.plans]
            self.client = c
            if self.on_connect is not None:
                self.on_connect(c)
            logger.info("kvbroker: connected (%s)", self.name)
        except (kvb.Error, OSError) as e:
            self._drop()
            logger.warning("kvbroker: broker unavailable (%s); serving without it", e)
            return None
        return self.client

    def fail(self, err: BaseException) -> None:
        """The broker went away mid-operation: drop the client, retry after reconnect_s."""
        logger.warning("kvbroker: broker connection lost (%s); recomputing until it is back",
                       err)
        self.down_events += 1
        self._drop()
        self._next_try = time.monotonic() + self.reconnect_s

    def _drop(self) -> None:
        c, self.client, self.ns = self.client, None, []
        if c is not None:
            with contextlib.suppress(Exception):  # a dead broker may fail the close too
                c.close()

    def close(self) -> None:
        self._drop()


# ---------------------------------------------------------------------------------------------
# Worker side: where vLLM's KV lives, as view parts over registered memory
# ---------------------------------------------------------------------------------------------


@dataclass
class _Region:
    """One storage (allocation) holding KV tensors, and how the broker reaches it."""

    storage: Any  # torch.UntypedStorage
    ptr: int
    nbytes: int
    cuda: bool
    memfd: int = -1
    mapping: Any = None
    u8: torch.Tensor | None = None  # the whole storage as bytes (copy path)


@dataclass
class _Part:
    region: _Region
    base: int  # bytes from the region's start to block 0, token 0
    stride: int  # bytes between tokens of a block
    page_stride: int  # bytes between blocks
    nbytes: int  # bytes per token


def _token_geometry(t: torch.Tensor, block_size: int, num_blocks: int,
                    bpt: int) -> tuple[int, int, int]:
    """(byte offset of block 0, token stride, block stride) of a [blocks, tokens, ...] tensor
    whose per-token bytes are contiguous; raises ValueError for anything else (HND).
    """
    es = t.element_size()
    if t.dim() < 2:
        raise ValueError(f"KV tensor of shape {tuple(t.shape)}")
    inner = t.shape[2:]
    expect = es
    for d in range(t.dim() - 1, 1, -1):
        if t.shape[d] != 1 and t.stride(d) * es != expect:
            raise ValueError(f"per-token bytes not contiguous (shape {tuple(t.shape)}, "
                             f"stride {t.stride()}): use the NHD layout")
        expect *= t.shape[d]
    per_token = es
    for n in inner:
        per_token *= n
    if per_token < bpt:
        raise ValueError(f"{per_token} bytes per token, the cache spec says {bpt}")
    nb, kb = t.shape[0], t.shape[1]
    s0, s1 = t.stride(0) * es, t.stride(1) * es
    if kb == block_size and nb >= num_blocks:
        return 0, s1, s0
    # Kernel blocks smaller than vLLM's block: a block is block_size / kb consecutive kernel
    # blocks, a page one range only when kernel blocks lie back to back.
    if block_size % kb == 0 and nb * kb >= num_blocks * block_size and s0 == kb * s1:
        return 0, s1, block_size * s1
    raise ValueError(f"KV tensor shape {tuple(t.shape)} does not match block size "
                     f"{block_size} x {num_blocks} blocks")


# Loads through the view are the broker's to copy, even of pages the library could copy from the
# pool directory inside submit(): vLLM computes layer groups while the later ones load, and
# that overlap needs the copies off the worker's thread (CPU KV tensors, tools/bench_vllm.py:
# load 0.6 -> 0.8-0.9 of memcpy with the Python work overlapped; GPU tensors are the broker's
# anyway).
_LOAD_FLAGS = kvb.OPF_VIEW | kvb.OPF_ASYNC


class _Pump:
    """Submits ops to a client as the rings allow and reaps their completions."""

    def __init__(self, client: kvb.Client, timeout_ms: int) -> None:
        self.client = client
        self.timeout_ms = timeout_ms
        self.queue: deque[tuple[Any, ...]] = deque()
        self.inflight = 0

    def add(self, ops: Iterable[tuple[Any, ...]]) -> None:
        self.queue.extend(ops)

    def step(self, block: bool) -> list[Any]:
        """Submits what fits, reaps what came (waiting for one when block). Raises
        kvb.Error when the broker fails, TimeoutError when it stops answering.
        """
        if self.queue:
            batch = list(self.queue) if len(self.queue) <= 1024 else \
                [self.queue[i] for i in range(1024)]
            n = self.client.submit(batch)
            for _ in range(n):
                self.queue.popleft()
            self.inflight += n
        if not self.inflight:
            return []
        comps = self.client.reap(512, 1 if block else 0, self.timeout_ms if block else 0)
        if block and not comps:
            raise TimeoutError(f"broker did not answer in {self.timeout_ms} ms")
        self.inflight -= len(comps)
        return comps

    @property
    def busy(self) -> bool:
        return bool(self.queue) or self.inflight > 0


class _Worker:
    """The worker role: registers vLLM's KV memory, runs the step's loads and stores."""

    def __init__(self, conn: KVBrokerConnector) -> None:
        self.conn = conn
        self.plans = conn.plans
        self.block_size = conn.block_size
        self.tp_rank, self.tp_size = conn.tp_rank, conn.tp_size
        self.layer_groups = max(1, int(conn.extra.get("layer_groups", 4)))
        self.zero_copy = bool(conn.extra.get("zero_copy", True))
        self.timeout_ms = int(conn.extra.get("op_timeout_ms", 10000))
        self.parts: list[list[_Part]] = []  # [plan][component-major (component, layer)]
        self.regions: list[_Region] = []
        self.views: list[kvb.View | None] = []
        self.bufs: list[Any] = []
        self.staging: Any = None
        self.staging_t: torch.Tensor | None = None
        self.copy_mode = False
        self.cuda = False
        # layer name -> (plan index, layer index)
        self.layer_index: dict[str, tuple[int, int]] = {}
        for pi, p in enumerate(self.plans):
            for li, name in enumerate(p.layer_names):
                self.layer_index[name] = (pi, li)
        self.chunks: list[list[tuple[int, int]]] = []  # [plan] -> layer ranges
        for p in self.plans:
            n = len(p.layer_names)
            g = min(self.layer_groups, n)
            edges = [round(i * n / g) for i in range(g + 1)]
            self.chunks.append([(edges[i], edges[i + 1] - edges[i]) for i in range(g)])
        self.link = _Link(conn.socket, f"vllm-worker-{self.tp_rank}", self.plans,
                          conn.reconnect_s, self._attach)
        self.pump: _Pump | None = None
        # In-step load state: ops by user_data, remaining ops per (plan, chunk).
        self.load_ops: dict[int, tuple[int, int, int]] = {}  # ud -> (plan, chunk, block id)
        self.load_left: dict[tuple[int, int], int] = {}
        self.load_errors: set[int] = set()
        self.finished_sending: set[str] = set()
        self.stats = KVBrokerStats()  # this interval's, handed to vLLM and reset
        self.stats_total: dict[str, float] = dict.fromkeys(_STAT_KEYS, 0)
        self.registered = False
        self.lock = threading.Lock()

    # -- registration ------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        regions: dict[int, _Region] = {}
        num_blocks = self.conn._kv_cache_config.num_blocks
        parts: list[list[_Part]] = []
        for p in self.plans:
            comp_parts: list[list[_Part]] = [[] for _ in p.components]
            for name in p.layer_names:
                if name not in kv_caches:
                    raise ValueError(f"kvbroker: no KV tensor for layer {name}")
                t = kv_caches[name]
                st = t.untyped_storage()
                key = st.data_ptr()
                if key not in regions:
                    regions[key] = _Region(st, st.data_ptr(), st.nbytes(), t.is_cuda)
                reg = regions[key]
                for ci, (_, bpt, half) in enumerate(p.components):
                    tt = t
                    if half >= 0:
                        tt = self._kv_half(t, half, num_blocks)
                    base, stride, pstride = _token_geometry(tt, self.block_size, num_blocks,
                                                            bpt)
                    base += tt.data_ptr() - reg.ptr
                    comp_parts[ci].append(_Part(reg, base, stride, pstride, bpt))
            parts.append([x for cp in comp_parts for x in cp])
        self.parts = parts
        self.regions = list(regions.values())
        self.cuda = any(r.cuda for r in self.regions)
        if self.zero_copy:
            for r in self.regions:
                if not r.cuda:
                    self._rehome(r, kv_caches)
        for r in self.regions:
            r.u8 = torch.empty(0, dtype=torch.uint8, device=r.storage.device).set_(r.storage)
        self.registered = True
        self.link.get()

    @staticmethod
    def _kv_half(t: torch.Tensor, half: int, num_blocks: int) -> torch.Tensor:
        """K (0) or V (1) of an MHA layer tensor: [2, blocks, ...] or [blocks, 2, ...]."""
        if t.shape[0] == 2 and (t.dim() < 2 or t.shape[1] != 2 or num_blocks != 2):
            return t[half]
        if t.dim() > 1 and t.shape[1] == 2:
            return t[:, half]
        raise ValueError(f"kvbroker: MHA KV tensor of shape {tuple(t.shape)} has no K/V dim")

    def _rehome(self, r: _Region, kv_caches: dict[str, torch.Tensor]) -> None:
        """Moves a CPU storage into a sealed memfd the broker can map, in place: every tensor
        over the old storage is re-pointed at the same offsets of the new one, so vLLM's
        references (attention layers, the runner's list) keep working, now zero-copy.
        """
        try:
            fd = os.memfd_create("kvbroker-vllm-kv", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        except (AttributeError, OSError) as e:
            logger.warning("kvbroker: no memfd (%s): CPU KV moves by copies", e)
            return
        size = (r.nbytes + mmap.PAGESIZE - 1) // mmap.PAGESIZE * mmap.PAGESIZE
        os.ftruncate(fd, size)
        mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        new = torch.frombuffer(mm, dtype=torch.uint8)
        old = torch.empty(0, dtype=torch.uint8).set_(r.storage)
        new[: r.nbytes].copy_(old)
        new_st = new.untyped_storage()
        for t in kv_caches.values():
            if t.untyped_storage().data_ptr() == r.ptr:
                t.set_(new_st, t.storage_offset(), t.size(), t.stride())
        r.storage, r.ptr, r.nbytes = new_st, new_st.data_ptr(), size
        r.memfd, r.mapping = fd, mm

    def _attach(self, client: kvb.Client) -> None:
        """(Re)registers the KV memory on a new client and builds the views."""
        self.views, self.bufs = [], []
        self.pump = _Pump(client, self.timeout_ms)
        if not self.registered:
            return
        bufs: dict[int, Any] = {}
        for r in self.regions:
            buf: Any = None
            if self.zero_copy:
                try:
                    if r.cuda:
                        buf = client.register_gpu(r.ptr, r.nbytes)
                    elif r.memfd >= 0:
                        buf = client.register_host_fd(r.memfd, r.nbytes, seal=True,
                                                      mapped=r.mapping)
                except kvb.Error as e:
                    logger.warning("kvbroker: cannot register KV memory (%s): copying", e)
            if buf is not None:
                bufs[r.ptr] = buf
                self.bufs.append(buf)
        for pi, plan_parts in enumerate(self.parts):
            view = None
            if all(pt.region.ptr in bufs for pt in plan_parts):
                view = self.link.ns[pi].view([
                    kvb.ViewPart(bufs[pt.region.ptr], pt.stride, pt.base, pt.page_stride)
                    for pt in plan_parts])
            self.views.append(view)
        self.copy_mode = any(v is None for v in self.views)
        if self.copy_mode:
            self.staging = client.alloc_host(max(ns.page_bytes for ns in self.link.ns))
            self.staging_t = None

    # -- copies without a view (the fallback) -------------------------------------------------

    def _page_parts(self, pi: int, block: int) -> list[tuple[_Part, int, torch.Tensor | None]]:
        """(part, address of the block's first token, strided tensor or None) per part: a
        CPU part whose tokens lie back to back is one range for memmove (no torch kernel,
        no OpenMP threads woken for 100 KiB), anything else a torch copy.
        """
        out: list[tuple[_Part, int, torch.Tensor | None]] = []
        bs = self.block_size
        for pt in self.parts[pi]:
            off = pt.base + block * pt.page_stride
            if not pt.region.cuda and pt.stride == pt.nbytes:
                out.append((pt, pt.region.ptr + off, None))
                continue
            assert pt.region.u8 is not None
            out.append((pt, 0, torch.as_strided(pt.region.u8, (bs, pt.nbytes),
                                                 (pt.stride, 1), off)))
        return out

    def _staging_tensor(self) -> torch.Tensor:
        if self.staging_t is None:
            self.staging_t = torch.frombuffer(self.staging, dtype=torch.uint8)
        return self.staging_t

    def _copy_put(self, pi: int, key: bytes, block: int, parent: bytes | None) -> bool:
        ns = self.link.ns[pi]
        base = self.staging.address
        n = self.block_size
        off = 0
        for pt, addr, t in self._page_parts(pi, block):
            size = n * pt.nbytes
            if t is None:
                ctypes.memmove(base + off, addr, size)
            else:
                self._staging_tensor()[off:off + size].view(t.shape).copy_(t)
            off += size
        return ns.put(key, memoryview(self.staging)[: ns.page_bytes], parent)

    def _copy_get(self, pi: int, key: bytes, block: int, first: int, count: int) -> bool:
        ns = self.link.ns[pi]
        if not ns.get_into(key, memoryview(self.staging)[: ns.page_bytes]):
            return False
        base = self.staging.address
        nl = len(self.plans[pi].layer_names)
        n = self.block_size
        off = 0
        for i, (pt, addr, t) in enumerate(self._page_parts(pi, block)):
            size = n * pt.nbytes
            if count == 0 or first <= i % nl < first + count:
                if t is None:
                    ctypes.memmove(addr, base + off, size)
                else:
                    t.copy_(self._staging_tensor()[off:off + size].view(t.shape))
            off += size
        return True

    # -- loads --------------------------------------------------------------------------------

    def start_load(self, meta: KVBrokerMetadata) -> None:
        self.load_ops.clear()
        self.load_left.clear()
        if not meta.loads:
            return
        client = self.link.get()
        if client is None or self.pump is None:
            self._fail_loads(meta.loads)
            return
        t0 = time.perf_counter()
        ops: list[Any] = []
        ud = 0
        bs = self.block_size
        # Layer group by layer group, so the first layers' pages arrive first.
        for pi in range(len(self.plans)):
            # The copy path fetches whole pages: splitting them into layer groups would
            # fetch each page once per group.
            chunks = [(0, 0)] if self.copy_mode else self.chunks[pi]
            for ci, (first, count) in enumerate(chunks):
                for tr in meta.loads:
                    for key, block in zip(tr.keys, tr.block_ids[pi], strict=True):
                        ud += 1
                        self.load_ops[ud] = (pi, ci, block)
                        self.load_left[(pi, ci)] = self.load_left.get((pi, ci), 0) + 1
                        view = self.views[pi]
                        if self.copy_mode or view is None:
                            ops.append((pi, key, block, first, count, ud))
                        else:
                            ops.append(kvb.Op(kvb.OP_GET, _LOAD_FLAGS, 0, view.id, key,
                                              block * bs, first, count, ud))
        if self.copy_mode:
            self._copy_loads(ops)
        else:
            self.pump.add(ops)
            self._drive_loads(None)
        self._inc("load_s", time.perf_counter() - t0)

    def _copy_loads(self, ops: list[Any]) -> None:
        try:
            for pi, key, block, first, count, ud in ops:
                ok = self._copy_get(pi, key, block, first, count)
                self._load_done(ud, 0 if ok else -2)
        except (kvb.Error, OSError) as e:
            self.link.fail(e)
            self._fail_pending_loads()

    def _load_done(self, ud: int, res: int) -> None:
        info = self.load_ops.pop(ud, None)
        if info is None:
            return
        pi, ci, block = info
        self.load_left[(pi, ci)] -= 1
        if res < 0:
            self.load_errors.add(block)
            self._inc("load_errors", 1)
        elif ci == 0:
            self._inc("loaded_pages", 1)
            self._inc("loaded_bytes", self.link.ns[pi].page_bytes if self.link.ns
                else 0)

    def _fail_loads(self, loads: list[_Transfer]) -> None:
        for tr in loads:
            for ids in tr.block_ids:
                self.load_errors.update(ids)
            self._inc("load_errors", len(tr.keys))
        self._inc("broker_down", 1)

    def _fail_pending_loads(self) -> None:
        for pi, ci, block in self.load_ops.values():
            self.load_errors.add(block)
            self.load_left[(pi, ci)] -= 1
        self._inc("load_errors", len(self.load_ops))
        self.load_ops.clear()

    def _drive_loads(self, until: tuple[int, int] | None) -> None:
        """Pumps load ops: until the layer group `until` (and those before it) is done, or
        (None) only what completes without waiting.
        """
        pump = self.pump
        if pump is None:
            return
        try:
            while pump.busy:
                if until is not None and all(
                        self.load_left.get((until[0], c), 0) == 0 for c in range(until[1] + 1)):
                    return
                for ud, res, _flags, _lease in pump.step(block=until is not None):
                    self._load_done(ud, res)
                if until is None:
                    return
        except (kvb.Error, OSError, TimeoutError) as e:
            self.link.fail(e)
            self.pump = None
            self._fail_pending_loads()

    def wait_layer(self, layer_name: str) -> None:
        if not self.load_ops:
            return
        idx = self.layer_index.get(layer_name)
        if idx is None:
            return
        pi, li = idx
        ci = next(i for i, (f, n) in enumerate(self.chunks[pi]) if f <= li < f + n)
        t0 = time.perf_counter()
        self._drive_loads((pi, ci))
        self._inc("load_s", time.perf_counter() - t0)

    def finish_loads(self) -> None:
        if not self.load_ops:
            return
        t0 = time.perf_counter()
        last = [(pi, len(self.chunks[pi]) - 1) for pi in range(len(self.plans))]
        for u in last:
            self._drive_loads(u)
        self._inc("load_s", time.perf_counter() - t0)

    # -- stores -------------------------------------------------------------------------------

    def save(self, meta: KVBrokerMetadata) -> None:
        if meta.saves:
            self._save(meta.saves)
        self.finished_sending.update(meta.finish_req_ids)

    def _save(self, saves: list[_Transfer]) -> None:
        # (group, key, block, parent): vLLM's block hashes chain, and so do our keys; an MLA
        # page's parent may be another rank's to store (then it links once both are there).
        mine = [(pi, key, block, parent)
                for tr in saves
                for pi in range(len(self.plans))
                for key, block, parent in zip(tr.keys, tr.block_ids[pi],
                                              [tr.parent, *tr.keys[:-1]], strict=True)
                if not self.plans[pi].mla or _owner(key, self.tp_size) == self.tp_rank]
        if not mine:
            return
        client = self.link.get()
        if client is None or self.pump is None:
            self._inc("broker_down", 1)
            return
        if self.cuda:
            # The step's kernels wrote these blocks asynchronously; the broker reads them
            # from another process, so they must have landed.
            torch.cuda.current_stream().synchronize()
        t0 = time.perf_counter()
        bs = self.block_size
        try:
            if self.copy_mode:
                for pi, key, block, parent in mine:
                    self._count_store(pi, 0 if self._copy_put(pi, key, block, parent) else 1)
            else:
                pump = self.pump
                info = {}
                for ud, (pi, key, block, parent) in enumerate(mine, 1):
                    info[ud] = pi
                    view = self.views[pi]
                    assert view is not None
                    pump.add([kvb.Op(kvb.OP_PUT, kvb.OPF_VIEW, 0, view.id, key, block * bs,
                                     0, 0, ud, parent)])
                while pump.busy:
                    for ud, res, flags, _lease in pump.step(block=True):
                        pi = info.pop(ud, 0)
                        if res < 0:
                            self._count_store(pi, -1)
                        else:
                            self._count_store(pi, 1 if flags & kvb.CQEF_EXISTED else 0)
        except (kvb.Error, OSError, TimeoutError) as e:
            self.link.fail(e)
            self.pump = None
            self._inc("store_errors", 1)
        self._inc("store_s", time.perf_counter() - t0)

    def _count_store(self, pi: int, res: int) -> None:
        if res < 0:
            self._inc("store_errors", 1)
        elif res == 1:
            self._inc("existed_pages", 1)
        else:
            self._inc("stored_pages", 1)
            self._inc("stored_bytes", self.link.ns[pi].page_bytes if self.link.ns
                else 0)

    def _inc(self, key: str, value: float) -> None:
        self.stats.data[key] += value
        self.stats_total[key] += value

    def take_errors(self) -> set[int]:
        errs, self.load_errors = self.load_errors, set()
        return errs

    def close(self) -> None:
        self.link.close()
        for r in self.regions:
            if r.memfd >= 0:
                os.close(r.memfd)
                r.memfd = -1


# ---------------------------------------------------------------------------------------------
# The connector
# ---------------------------------------------------------------------------------------------


@dataclass
class _ReqState:
    request: Request
    parent: bytes | None
    keys: list[bytes] = field(default_factory=list)
    local_tokens: int = 0  # the local prefix hit get_num_new_matched_tokens saw
    hit_blocks: int = 0  # leading blocks the broker had at the last lookup
    stored_blocks: int = 0  # leading blocks stored or known stored
    skip: bool = False
    early: concurrent.futures.Future[tuple[int, int, float]] | None = None


class KVBrokerConnector(KVConnectorBase_V1, SupportsHMA):
    """kvbroker's vLLM v1 KV connector (scheduler and worker roles)."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole,
                 kv_cache_config: KVCacheConfig) -> None:
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        ktc = self._kv_transfer_config
        self.extra: dict[str, Any] = dict(ktc.kv_connector_extra_config or {})
        if not self.extra.get("keep_load_failure_policy") and \
                ktc.kv_load_failure_policy != "recompute":
            # A page can vanish between LOOKUP and GET (eviction, a broker restart); vLLM's
            # default policy would fail the request, recomputing the blocks is what a cache
            # miss means.
            logger.info("kvbroker: kv_load_failure_policy set to 'recompute'")
            ktc.kv_load_failure_policy = "recompute"
        self.socket = self.extra.get("socket") or os.environ.get("KVB_SOCKET") or None
        self.reconnect_s = float(self.extra.get("reconnect_s", 1.0))
        self.tp_size = int(self.extra.get("tp_size",
                                          vllm_config.parallel_config.tensor_parallel_size))
        self.tp_rank = int(self.extra.get("tp_rank", self._vllm_tp_rank(role)))
        self.pp_rank = int(self.extra.get("pp_rank", self._vllm_pp_rank(role)))
        self.plans = namespace_layouts(vllm_config, kv_cache_config, self.tp_rank, self.tp_size,
                                       self.pp_rank)
        self.block_size = self.plans[0].layout.tokens_per_page
        self.load_enabled = bool(ktc.is_kv_consumer)
        self.save_enabled = bool(ktc.is_kv_producer)
        self.save_prompt = bool(self.extra.get("save_prompt", True))
        self._worker: _Worker | None = None
        self._reqs: dict[str, _ReqState] = {}
        self._loads: list[_Transfer] = []
        self._saves: list[_Transfer] = []
        self._finishing: list[str] = []
        self._stats = KVBrokerStats()
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.lookup_wait_s = float(self.extra.get("lookup_wait_ms", 2.0)) / 1e3
        self.lookup_max_age_s = float(self.extra.get("lookup_max_age_ms", 500.0)) / 1e3
        if role == KVConnectorRole.WORKER:
            self._worker = _Worker(self)
            self._link = self._worker.link
        else:
            # The scheduler only looks up: MHA namespaces are per TP rank, rank 0's stands
            # for all (every rank stores every page of its shard).
            plans0 = namespace_layouts(vllm_config, kv_cache_config, 0, self.tp_size)
            self._link = _Link(self.socket, "vllm-scheduler", plans0, self.reconnect_s)
            self._link.get()
            if self.extra.get("early_lookup", True):
                self._pool = concurrent.futures.ThreadPoolExecutor(
                    1, thread_name_prefix="kvb-lookup")

    @staticmethod
    def _vllm_tp_rank(role: KVConnectorRole) -> int:
        if role != KVConnectorRole.WORKER:
            return 0
        try:
            from vllm.distributed.parallel_state import (
                get_tensor_model_parallel_rank,
                model_parallel_is_initialized,
            )
            if model_parallel_is_initialized():  # type: ignore[no-untyped-call]
                return int(get_tensor_model_parallel_rank())
        except Exception:
            pass
        return 0

    @staticmethod
    def _vllm_pp_rank(role: KVConnectorRole) -> int:
        if role != KVConnectorRole.WORKER:
            return 0
        try:
            from vllm.distributed.parallel_state import (
                get_pipeline_model_parallel_rank,
                model_parallel_is_initialized,
            )
            if model_parallel_is_initialized():  # type: ignore[no-untyped-call]
                return int(get_pipeline_model_parallel_rank())
        except Exception:
            pass
        return 0

    # ---------------------------------------------------------------- scheduler side --------

    def _state(self, request: Request) -> _ReqState:
        st = self._reqs.get(request.request_id)
        if st is None:
            st = _ReqState(request, _salt_parent(request))
            # Token ids do not capture images or embeddings: such requests neither load nor
            # store (vLLM's own prefix cache still serves them).
            st.skip = bool(getattr(request, "mm_features", None)) or \
                getattr(request, "prompt_embeds", None) is not None
            self._reqs[request.request_id] = st
        st.request = request
        return st

    def _keys(self, st: _ReqState, nblocks: int) -> list[bytes]:
        have = len(st.keys)
        if nblocks > have:
            bs = self.block_size
            toks = st.request.all_token_ids[have * bs: nblocks * bs]
            parent = st.keys[-1] if st.keys else st.parent
            st.keys.extend(kvb.page_keys(list(toks), bs, parent))
        return st.keys[:nblocks]

    def _lookup(self, keys: list[bytes]) -> int:
        with self._link.lock:  # the early-lookup thread shares the link
            client = self._link.get()
            if client is None:
                self._stats.data["broker_down"] += 1
                return 0
            try:
                hits = len(keys)
                for ns in self._link.ns:
                    hits = min(hits, ns.lookup(keys[:hits]))
                    if not hits:
                        break
                return hits
            except (kvb.Error, OSError) as e:
                self._link.fail(e)
                self._stats.data["broker_down"] += 1
                return 0

    def on_new_request(self, request: Request) -> None:
        """Computes the request's keys and starts its LOOKUP when vLLM admits it
        (Scheduler.add_request), on a helper thread: by the time the scheduler asks
        get_num_new_matched_tokens the answer is usually there, so the scheduler's loop
        pays neither the hashing nor the broker's round trip.
        """
        if not self.load_enabled or self._pool is None:
            return
        st = self._state(request)
        nfull = (request.num_tokens - 1) // self.block_size
        if st.skip or nfull <= 0:
            return
        keys = self._keys(st, nfull)
        st.early = self._pool.submit(self._timed_lookup, keys)

    def _timed_lookup(self, keys: list[bytes]) -> tuple[int, int, float]:
        return len(keys), self._lookup(keys), time.monotonic()

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens past num_computed_tokens the broker holds (whole blocks, leaving one
        token to compute); None: the early LOOKUP is still out, ask again next step.
        """
        st = self._state(request)
        st.local_tokens = num_computed_tokens
        if st.skip or not self.load_enabled:
            return 0, False
        bs = self.block_size
        # At least one token must be computed (it produces the next token's logits).
        nfull = (request.num_tokens - 1) // bs
        if nfull * bs <= num_computed_tokens:
            return 0, False
        keys = self._keys(st, nfull)
        hits = -1
        fut, st.early = st.early, None
        if fut is not None:
            # The early LOOKUP: used when it covers these keys and is fresh (pages come and
            # go; an old answer would miss pages stored since). If it is still running, wait
            # a little, then tell vLLM to ask again next step rather than stall the loop.
            try:
                n, h, t_done = fut.result(timeout=self.lookup_wait_s)
                if n >= nfull and time.monotonic() - t_done <= self.lookup_max_age_s:
                    hits = min(h, nfull)
            except concurrent.futures.TimeoutError:
                st.early = fut
                return None, False
        if hits < 0:
            hits = self._lookup(keys)
        st.hit_blocks = hits
        st.stored_blocks = max(st.stored_blocks, hits)
        self._stats.data["lookups"] += 1
        self._stats.data["lookup_tokens"] += nfull * bs - num_computed_tokens
        ext = hits * bs - num_computed_tokens
        if ext <= 0:
            return 0, False
        self._stats.data["hit_tokens"] += ext
        return ext, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        """Plans the load of the matched blocks into the blocks vLLM just allocated."""
        st = self._state(request)
        if num_external_tokens <= 0:
            return
        bs = self.block_size
        first = st.local_tokens // bs
        last = (st.local_tokens + num_external_tokens) // bs
        ids = blocks.get_block_ids()
        self._loads.append(_Transfer(
            request.request_id, self._keys(st, last)[first:last],
            [list(ids[p.group_id][first:last]) for p in self.plans]))

    def _block_ids(self, req_id: str) -> tuple[list[int], ...] | None:
        mgr = self._kv_cache_manager
        if mgr is None:
            return None
        try:
            return mgr.get_block_ids(req_id)
        except (KeyError, AssertionError):
            return None

    def _save_upto(self, st: _ReqState, nblocks: int,
                   block_ids: Sequence[Sequence[int]] | None) -> _Transfer | None:
        first = st.stored_blocks
        if nblocks <= first or block_ids is None:
            return None
        if any(len(block_ids[p.group_id]) < nblocks for p in self.plans):
            return None
        keys = self._keys(st, nblocks)[first:nblocks]
        ids = [list(block_ids[p.group_id][first:nblocks]) for p in self.plans]
        if any(b == 0 for g in ids for b in g):  # vLLM's null block: nothing there
            return None
        st.stored_blocks = nblocks
        parent = st.keys[first - 1] if first else None  # computed by _keys() above
        return _Transfer(st.request.request_id, keys, ids, parent)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads, stores (prompt blocks computed by this step, finishing
        requests' blocks) and finishing requests, for the workers.
        """
        meta = KVBrokerMetadata(self._loads, self._saves, self._finishing)
        self._loads, self._saves, self._finishing = [], [], []
        if self.save_enabled and self.save_prompt and self._link.client is not None:
            spec = scheduler_output.scheduled_spec_decode_tokens
            computed = {r.req_id: r.num_computed_tokens
                        for r in scheduler_output.scheduled_new_reqs}
            cached = scheduler_output.scheduled_cached_reqs
            computed.update(zip(cached.req_ids, cached.num_computed_tokens, strict=True))
            for req_id, n in scheduler_output.num_scheduled_tokens.items():
                st = self._reqs.get(req_id)
                if st is None or st.skip:
                    continue
                done = computed.get(req_id, st.request.num_computed_tokens) + n - \
                    len(spec.get(req_id, ()))
                nblocks = min(done, st.request.num_prompt_tokens) // self.block_size
                tr = self._save_upto(st, nblocks, self._block_ids(req_id))
                if tr is not None:
                    meta.saves.append(tr)
        return meta

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """request_finished_all_groups for the single-group (non-HMA) path."""
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...],
                                    ) -> tuple[bool, dict[str, Any] | None]:
        """Stores the request's computed full blocks not stored yet; True keeps vLLM's
        blocks until every worker reported the stores done (get_finished).
        """
        st = self._reqs.pop(request.request_id, None)
        if st is None or st.skip or not self.save_enabled or self._link.client is None:
            return False, None
        st.request = request
        computed = min(request.num_computed_tokens, request.num_tokens)
        tr = self._save_upto(st, computed // self.block_size, block_ids)
        if tr is None:
            return False, None
        # vLLM keeps the blocks until every worker reports the stores done (get_finished).
        self._saves.append(tr)
        self._finishing.append(request.request_id)
        return True, None

    def get_kv_connector_stats(self) -> KVBrokerStats | None:
        """The interval's counters (None when there were none); resets them."""
        src = self._worker.stats if self._worker is not None else self._stats
        if src.is_empty():
            return None
        out = KVBrokerStats(dict(src.data))
        src.reset()
        return out

    @classmethod
    def build_kv_connector_stats(cls, data: dict[str, Any] | None = None
                                 ) -> KVConnectorStats | None:
        """KVBrokerStats over aggregated counters (vLLM's logging side)."""
        return KVBrokerStats(dict(data)) if data is not None else KVBrokerStats()

    @classmethod
    def build_prom_metrics(cls, vllm_config: Any, metric_types: Any, labelnames: list[str],
                           per_engine_labelvalues: dict[int, list[object]]) -> Any:
        """The vllm:kvbroker_* Prometheus counters."""
        return KVBrokerPromMetrics(vllm_config, metric_types, labelnames,
                                   per_engine_labelvalues)

    @classmethod
    def get_required_kvcache_layout(cls, vllm_config: VllmConfig) -> str | None:
        """NHD: a token's K (or V) bytes of a layer in one range, what views need."""
        # Views need each token's K (or V) bytes of a layer in one range: NHD.
        return "NHD"

    @classmethod
    def requires_piecewise_for_cudagraph(cls, extra_config: dict[str, Any]) -> bool:
        """True with layer-group loads: wait_for_layer_load must run between layers."""
        # wait_for_layer_load runs between layers; a captured graph would skip it.
        return int(extra_config.get("layer_groups", 4)) > 1

    @property
    def requires_kv_delivery(self) -> bool:
        """False: a store that did not happen is a future miss, nothing more."""
        return False  # a store that did not happen is a future miss, nothing more

    # ---------------------------------------------------------------- worker side -----------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Describes vLLM's KV tensors to the broker (views over registered memory)."""
        assert self._worker is not None
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Submits this step's loads, layer group by layer group."""
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVBrokerMetadata)
        self._worker.start_load(meta)

    def wait_for_layer_load(self, layer_name: str) -> None:
        """Waits until the layer's group of pages has landed (or failed)."""
        if self._worker is not None:
            self._worker.wait_layer(layer_name)

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata: AttentionMetadata, **kwargs: Any) -> None:
        """Nothing per layer: a page is stored whole, in wait_for_save."""
        # A page is stored whole (every layer at once, so no reader sees half of one):
        # the stores run in wait_for_save, after the last layer.
        return

    def wait_for_save(self) -> None:
        """Finishes the step's loads and runs its stores (synchronously)."""
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVBrokerMetadata)
        self._worker.finish_loads()
        self._worker.save(meta)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        """Finishing requests whose stores this worker has done."""
        if self._worker is None or not self._worker.finished_sending:
            return None, None
        done, self._worker.finished_sending = self._worker.finished_sending, set()
        return done, None

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load missed or failed this step: vLLM recomputes them."""
        if self._worker is None:
            return set()
        self._worker.finish_loads()
        return self._worker.take_errors()

    def shutdown(self) -> None:
        """Closes the broker connection (and the KV memfds' descriptors)."""
        if self._worker is not None:
            self._worker.close()
        else:
            if self._pool is not None:
                self._pool.shutdown(wait=True, cancel_futures=True)
            self._link.close()
