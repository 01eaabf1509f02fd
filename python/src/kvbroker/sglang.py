# SPDX-License-Identifier: MIT
r"""kvbroker.sglang: kvbroker as SGLang HiCache's storage tier (L3), for sglang==0.5.23.

SGLang loads it through its dynamic backend::

    --enable-hierarchical-cache --hicache-mem-layout page_first_direct \\
    --hicache-storage-backend dynamic --hicache-storage-backend-extra-config \\
    '{"backend_name":"kvbroker","module_path":"kvbroker.sglang",
      "class_name":"KVBrokerStorage","interface_v1":1,"allocator":"shm"}'

StorageBackendFactory constructs ``KVBrokerStorage(storage_config, kwargs)`` and the
HiCacheController hands over its host pool with ``register_mem_pool_host``; from then on the
controller's prefetch thread calls ``batch_exists`` and ``batch_get_v1`` and its backup thread
``batch_set_v1``, 128 pages (STORAGE_BATCH_SIZE) at a time.

Pages: SGLang's page hashes (hex SHA-256 chains of get_hash_str) are kvbroker keys bit for
bit; everything else that decides whether two processes' pages are the same bytes goes into
the namespace (model, MLA/MHA, tokens per page, dtype, TP rank for MHA, PP, CP), never into
the key. Whatever the host layout (page_first_direct, layer_first, page_first, page_unified
with one head group), the bytes stored are kvbroker's canonical page,
[component][layer][token][bytes] with one component "kv" for MLA and "k", "v" for MHA
(docs/protocol.md): a view over the host pool does the reordering in the broker's copy, so a
page written by one layout reads into another, and by vLLM. page_head (and page_unified with
several head groups) keep a token's heads apart: their pages are head-major, a namespace of
their own (PoolGeometry). With SGLang's tp_lcm_size a page_head page is stored as one page per
virtual TP rank, so instances of different TP sizes share them. Host pools and layouts this
backend cannot store byte for byte are refused at registration (pool_geometries).

SGLang's buffer_only host memory mode (--hicache-host-memory-mode buffer_only) needs nothing
more of a backend: its host pool stages pages on their way to and from these same calls.

Zero copy: with ``"allocator": "shm"`` SGLang's host pool is a memfd. The broker copies
straight between its pool and that memory once the fd is registered. SGLang 0.5.23 creates
the memfd without MFD_ALLOW_SEALING, and the broker only accepts fds sealed against
shrinking (a shrunk file would SIGBUS it), so at registration this backend moves the host
pool onto a sealable memfd of its own at the same address (``"shm_adopt"``, on by default;
see _adopt_memfd). When the pool cannot be moved (already in use, or shm_adopt off) the
broker is given SGLang's own memfd to pread/pwrite (fdcopy: still one copy, a kernel one).
Without an fd it falls back to copying each page through a registered staging buffer and
says so in the log: one extra memcpy per page.

Extra pools (register_mem_host_pool_v2: indexer, draft, state sidecars) get a namespace each
and move through the v2 calls with HiCacheFile's hit policies (see batch_exists_v2).

Failure: no broker at start-up is one warning and SGLang runs without L3 (``"required":
true`` makes it a start-up error instead); a broker that dies mid-run makes the calls return
misses and failed writes at once (the v1 calls never raise and never return None, which
would kill SGLang's storage threads), and the backend reconnects, at most every
``retry_interval_s``, when the broker is back. A page that failed is reported as failed: a
miss, never a page that is partly there.

Extra-config keys (besides SGLang's own backend_name, module_path, class_name,
interface_v1, allocator): socket (default $KVB_SOCKET, then the library's default path),
client_name (default "sglang-tp<rank>"), namespace (overrides the namespace's model name,
verbatim), model (model name before normalisation), dtype (logical KV dtype name, e.g.
"fp8_e4m3" when the host pool stores uint8), required (bool, default false),
retry_interval_s (default 2.0), shm_adopt (bool, default true), staging_mb (staging buffer
of the copy path, default 64).
"""

from __future__ import annotations

import errno
import hashlib
import logging
import mmap
import os
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
)

import kvbroker as kvb
from kvbroker import _kvbroker
from kvbroker._layout import model_ns_name

logger = logging.getLogger(__name__)

__all__ = ["KVBrokerStorage", "PoolGeometry", "model_ns_name", "pool_geometries",
           "pool_geometry"]

_TORCH_DTYPES = {
    torch.bfloat16: "bf16",
    torch.float16: "fp16",
    torch.float32: "fp32",
    torch.float8_e4m3fn: "fp8_e4m3",
    torch.float8_e5m2: "fp8_e5m2",
    torch.uint8: "uint8",
}


@dataclass(frozen=True)
class PoolGeometry:
    """Where one kvbroker page of a host pool lies, in bytes from the start of its kv_buffer.

    Part (c, h, l) of component c, head run h, layer l: token slot s at ``base + c *
    comp_stride + h * head_stride + l * layer_stride + (s // tokens_per_page) * page_stride +
    (s % tokens_per_page) * stride`` (kvbroker ViewPart semantics), bytes_per_token_layer
    bytes each, and slot s is SGLang's host index. The stored page is these parts in that
    order: [component][layer][token][bytes], kvbroker's canonical page, when head_runs is 1
    (every layout but page_head and grouped page_unified, whose heads of one token are not
    adjacent); [component][head run][layer][token][bytes] ("head-major", one namespace
    layer per head run and layer) otherwise. With tp_lcm_size a page_head pool's page is
    split into several such pages, one per virtual TP rank (base selects its heads).
    """

    kind: str
    layout: str
    components: tuple[str, ...]
    num_layers: int
    tokens_per_page: int
    bytes_per_token_layer: int
    comp_stride: int
    layer_stride: int
    stride: int
    page_stride: int
    nbytes: int
    head_runs: int = 1
    head_stride: int = 0
    base: int = 0

    @property
    def page_bytes(self) -> int:
        """Bytes of one stored page."""
        return len(self.components) * self.head_runs * self.num_layers * \
            self.tokens_per_page * self.bytes_per_token_layer

    @property
    def page_format(self) -> str:
        """The namespace's page_format: "" for the canonical byte order."""
        return "" if self.head_runs == 1 else "head-major"

    def parts(self, buf: Any) -> list[kvb.ViewPart]:
        """The ViewParts of a view over buf (component-major, as the broker wants them)."""
        return [kvb.ViewPart(buf, self.stride, self.base + c * self.comp_stride +
                             h * self.head_stride + i * self.layer_stride, self.page_stride)
                for c in range(len(self.components)) for h in range(self.head_runs)
                for i in range(self.num_layers)]

    def page_offset(self, slot: int) -> int:
        """Byte offset of token slot `slot` (a page's first token) in part (0, 0, 0)."""
        p, t = divmod(slot, self.tokens_per_page)
        return self.base + p * self.page_stride + t * self.stride

    def canonical(self, flat_u8: torch.Tensor, slot: int) -> torch.Tensor:
        """A [component][head run][layer][token][bytes] uint8 view of the page at `slot` of
        the pool whose bytes are flat_u8 (no copy; .contiguous() gives the stored bytes).
        """
        return flat_u8.as_strided(
            (len(self.components), self.head_runs, self.num_layers, self.tokens_per_page,
             self.bytes_per_token_layer),
            (self.comp_stride, self.head_stride, self.layer_stride, self.stride, 1),
            flat_u8.storage_offset() + self.page_offset(slot))


# The host pool classes and layouts of sglang 0.5.23 this backend maps (pool_geometries).
# Everything else is refused at start-up with the reason: page_first_kv_split keeps K and V
# (and the indexer) in separate buffers (Ascend NPU), the allocator-only MLA pool has no
# bytes, and the other host pool classes carry scales or state this page format does not.
_POOLS = {"MLATokenToKVPoolHost": ("layer_first", "page_first", "page_first_direct",
                                   "page_unified"),
          "MHATokenToKVPoolHost": ("layer_first", "page_first", "page_first_direct",
                                   "page_head", "page_unified")}


def pool_geometries(pool: Any, split: int = 1) -> list[PoolGeometry]:
    """The kvbroker pages of one SGLang page of `pool`: one geometry, or `split` of them
    (page_head with tp_lcm_size: one per virtual TP rank, heads [i * H/split, (i+1) *
    H/split) each). ValueError naming the cause and the fix for a pool or layout this
    backend cannot store byte for byte.
    """
    cls = type(pool).__name__
    layout = getattr(pool, "layout", None)
    ok = _POOLS.get(cls)
    supported = "; ".join(f"{c}: {', '.join(v)}" for c, v in _POOLS.items())
    if ok is None:
        raise ValueError(f"kvbroker cannot store SGLang host pool {cls} (supported: "
                         f"{supported})")
    if layout not in ok:
        raise ValueError(f"kvbroker cannot store {cls} with --hicache-mem-layout {layout} "
                         f"(use one of {', '.join(ok)})")
    kv = getattr(pool, "kv_buffer", None)
    if not isinstance(kv, torch.Tensor) or not kv.is_contiguous() or kv.device.type != "cpu":
        raise ValueError(f"{cls} ({layout}) has no contiguous CPU kv_buffer (an "
                         "allocator-only or device-resident host pool): nothing to store")
    es = kv.element_size()
    st = [s * es for s in kv.stride()]
    P = pool.page_size
    runs, hs = 1, 0
    comps: tuple[str, ...]
    if cls == "MLATokenToKVPoolHost":  # one latent row per token and layer
        kind, comps, cs, row = "mla", ("kv",), 0, kv.shape[-1] * es
        if layout in ("page_first_direct", "page_unified"):  # [page][layer][token]([1])[dim]
            L, ls, ts, ps = kv.shape[1], st[1], st[2], st[0]
        elif layout == "layer_first":  # [layer][token][1][dim]
            L, ls, ts, ps = kv.shape[0], st[0], st[1], P * st[1]
        else:  # page_first: [token][layer][1][dim]
            L, ls, ts, ps = kv.shape[1], st[1], st[0], P * st[0]
    else:  # MHA: K and V of equal widths in one buffer
        if getattr(pool, "v_head_dim", pool.head_dim) != pool.head_dim:
            raise ValueError(f"{cls}: K and V widths differ ({pool.head_dim} vs "
                             f"{pool.v_head_dim}): not supported by kvbroker")
        kind, comps = "mha", ("k", "v")
        H, D = pool.head_num, pool.head_dim
        row = H * D * es
        if layout == "page_first_direct":  # [2][page][layer][token][head][dim]
            L, cs, ls, ts, ps = kv.shape[2], st[0], st[2], st[3], st[1]
        elif layout == "layer_first":  # [2][layer][token][head][dim]
            L, cs, ls, ts, ps = kv.shape[1], st[0], st[1], st[2], P * st[2]
        elif layout == "page_first":  # [2][token][layer][head][dim]
            L, cs, ls, ts, ps = kv.shape[2], st[0], st[2], st[1], P * st[1]
        elif layout == "page_head":  # [2][page][head][token][layer][dim]
            L, cs, ls, ts, ps = kv.shape[4], st[0], st[4], st[3], st[1]
            runs, hs, row = H, st[2], D * es
        else:  # page_unified: [page][head group][layer][2][token][heads of group][dim]
            G = kv.shape[1]
            L, cs, ls, ts, ps = kv.shape[2], st[3], st[2], st[4], st[0]
            runs, hs, row = G, st[1], (H // G) * D * es
    if split > 1 and (layout != "page_head" or runs % split):
        raise ValueError(f"tp_lcm_size splits a page into {split} head groups: needs "
                         f"page_head and a multiple of {split} KV heads per rank, not "
                         f"{layout} with {runs} head runs")
    per = runs // split
    return [PoolGeometry(kind, layout, comps, L, P, row, cs, ls, ts, ps, kv.numel() * es,
                         per, hs, i * per * hs) for i in range(split)]


def pool_geometry(pool: Any) -> PoolGeometry:
    """The geometry of the one kvbroker page of each SGLang page of `pool` (see
    pool_geometries; ValueError for a pool or layout that cannot be stored).
    """
    return pool_geometries(pool)[0]


def _logical_dtype(pool: Any, cfg: dict[str, Any]) -> str:
    if cfg.get("dtype"):
        return str(cfg["dtype"])
    name = _TORCH_DTYPES.get(pool.dtype)
    if name is None:
        raise ValueError(f"KV dtype {pool.dtype} has no kvbroker name: set extra config dtype")
    if name == "uint8":
        # SGLang keeps fp8 KV in uint8 tensors; the logical type is what identifies pages.
        name = "fp8_e4m3"
    return name


# ---- moving an unsealable shm host pool onto a sealable memfd (see _adopt_memfd) ----


def _adopt_memfd(pool: Any, old_fd: int) -> int:
    """Moves the bytes of pool.kv_buffer (SGLang's MAP_SHARED mapping of old_fd, made by
    alloc_shm without MFD_ALLOW_SEALING) onto a new memfd that can be sealed, at the same
    addresses (the C extension's remap_onto_memfd: one mremap, never a moment unmapped), so
    every tensor and pointer table SGLang holds stays valid. The old file's pages are then
    punched out, so the pool is not held twice. Returns the new fd (owned by the caller).
    CUDA-pinned pools are unregistered and registered again around the switch
    (cudaHostRegister pins physical pages, which the switch replaces). Must run before the
    pool carries traffic: register_mem_pool_host checks the pool is empty.
    """
    kv = pool.kv_buffer
    addr = kv.data_ptr()
    size = os.fstat(old_fd).st_size
    if addr % mmap.PAGESIZE or size < kv.numel() * kv.element_size():
        raise OSError(errno.EINVAL, "host pool is not one page-aligned mapping of its fd")
    ranges = getattr(kv, "_sglang_cuda_host_registered_ranges", None) \
        if getattr(pool, "pin_memory", False) and torch.cuda.is_available() else None
    cudart: Any = torch.cuda.cudart() if ranges else None  # type: ignore[no-untyped-call]
    for ptr, _ in ranges or ():
        cudart.cudaHostUnregister(ptr)
    try:
        fd = _kvbroker.remap_onto_memfd(addr, size, "kvbroker_sglang_host_pool")
    finally:
        for ptr, n in ranges or ():
            rc = int(cudart.cudaHostRegister(ptr, n, 0))
            if rc != 0:
                raise RuntimeError(f"cudaHostRegister after the memfd switch failed: {rc}")
    try:
        _kvbroker.punch_hole(old_fd, 0, size)
    except OSError as e:  # the pool works; only its old pages stay allocated
        logger.warning("kvbroker: could not free the host pool's old memfd pages: %s", e)
    return fd


def _keys(keys: list[str]) -> list[bytes]:
    """SGLang's hex page hashes as 32-byte kvbroker keys (ValueError on a malformed one)."""
    blob = bytes.fromhex("".join(keys))
    if len(blob) != 32 * len(keys):
        raise ValueError("SGLang page keys must be 64 hex digits")
    return [blob[i:i + 32] for i in range(0, len(blob), 32)]


def _parents(kb: list[bytes], extra_info: HiCacheStorageExtraInfo | None) -> list[bytes | None]:
    """The parent key of each page of a batch: SGLang's keys are one chain (prefix_keys +
    keys, HiCacheStorageExtraInfo), so page i continues page i - 1, and the first continues
    the last prefix key (None: the batch starts its sequence, or SGLang did not say).
    """
    pk = extra_info.prefix_keys if extra_info is not None else None
    first = bytes.fromhex(pk[-1]) if pk else None
    if first is not None and len(first) != 32:
        first = None
    return [first, *kb[:-1]] if kb else []


class _Stats:
    """What get_stats() hands SGLang: per-operation page counts and GB/s since the last
    call (SGLang's StorageMetrics), plus running totals for logs and tests.
    """

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.prefetch_pgs: list[int] = []
        self.backup_pgs: list[int] = []
        self.prefetch_bw: list[float] = []
        self.backup_bw: list[float] = []
        self.totals = dict(get_pages=0, get_hits=0, set_pages=0, set_stored=0, errors=0,
                           reconnects=0)

    def op(self, kind: str, pages: int, nbytes: int, secs: float) -> None:
        with self.lock:
            (self.prefetch_pgs if kind == "get" else self.backup_pgs).append(pages)
            (self.prefetch_bw if kind == "get" else self.backup_bw).append(
                nbytes / max(secs, 1e-9) / 1e9)

    def add(self, **kw: int) -> None:
        with self.lock:
            for k, v in kw.items():
                self.totals[k] += v


class KVBrokerStorage(HiCacheStorage):  # type: ignore[misc]
    """SGLang HiCacheStorage backed by the node's kvbrokerd (see the module docstring)."""

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Any = None) -> None:
        # Imported by the constructor, not at module import (it pulls SGLang's model configs,
        # and with them torchvision) nor in get_stats() (its first import takes about 0.1 s,
        # which SGLang's first metrics poll would pay on the scheduler thread).
        from sglang.srt.observability.metrics_collector import StorageMetrics

        self._metrics_cls = StorageMetrics
        self.storage_config = storage_config
        self.cfg = dict(storage_config.extra_config or {})
        self.socket: str | None = self.cfg.get("socket") or None
        self.client_name = str(self.cfg.get("client_name")
                               or f"sglang-tp{storage_config.tp_rank}")
        self.retry_interval = float(self.cfg.get("retry_interval_s", 2.0))
        self.required = bool(self.cfg.get("required", False))
        self.is_mla = bool(storage_config.is_mla_model)
        self.mem_pool_host: Any = None
        self.geometry: PoolGeometry | None = None  # the first (usually only) shard's
        self.shards: list[PoolGeometry] = []  # the kvbroker pages of one SGLang page
        self.layouts: list[kvb.Layout] = []  # their namespaces
        self.zero_copy = False
        self.stats = _Stats()
        self._lock = threading.Lock()
        # The staging buffer is one: SGLang's prefetch and backup threads take turns on it.
        self._staging_lock = threading.Lock()
        self._gen = 0
        self._client: kvb.Client | None = None
        self._ns: tuple[kvb.Namespace, ...] | None = None  # one per shard
        self._view: tuple[kvb.View | None, ...] | None = None
        self._staging: tuple[kvb.HostBuffer, torch.Tensor, int] | None = None
        self._fd: int | None = None  # the fd the broker copies to and from
        self._fdcopy = False  # _fd is SGLang's unsealable memfd: broker pread/pwrite
        self._own_fd: int | None = None  # a memfd this backend made (shm_adopt)
        self._extra: dict[str, Any] = {}  # v2 pool name -> (session gen, Namespace, Layout)
        self._retry_at = 0.0
        self._down_logged = False
        self._closed = False
        try:
            self._client = kvb.connect(self.socket, name=self.client_name)
        except kvb.Error as e:
            if self.required:
                raise RuntimeError(f"kvbroker: {e.strerror}; extra config required=true, "
                                   "so SGLang stops") from e
            # strerror names the socket and the fix: "no broker at PATH (...): start one...".
            logger.warning("kvbroker: %s: SGLang runs without the L3 tier; retrying every "
                           "%.0f s", e.strerror, self.retry_interval)
            self._down_logged = True
            self._retry_at = time.monotonic() + self.retry_interval

    def _g(self) -> PoolGeometry:
        """The registered pool's geometry (register_mem_pool_host sets it)."""
        if self.geometry is None:
            raise RuntimeError("kvbroker: no host pool registered")
        return self.geometry

    def _where(self) -> str:
        try:
            return kvb.socket_path(self.socket)  # the library's rule, as connect() uses it
        except kvb.Error:  # longer than a socket path may be: connect() said so already
            return self.socket or os.environ.get("KVB_SOCKET", "")

    # ---- set-up ----

    def register_mem_pool_host(self, mem_pool_host: Any) -> None:
        """Takes the host pool: its geometry fixes the namespace, and with the shm allocator
        its memfd becomes the broker's zero-copy buffer.
        """
        super().register_mem_pool_host(mem_pool_host)
        sc = self.storage_config
        # SGLang sets should_split_heads for an MHA page_head pool whose tp_lcm_size exceeds
        # its TP size: each page goes to storage as tp_lcm_size / tp_size head groups, one
        # per virtual rank, so instances of different TP sizes share them.
        split = sc.tp_lcm_size // sc.tp_size if getattr(sc, "should_split_heads", False) \
            and sc.tp_lcm_size else 1
        try:
            self.shards = pool_geometries(mem_pool_host, split)
        except ValueError as e:
            raise ValueError(f"kvbroker: {e}") from e
        self.geometry = self.shards[0]
        if not self.cfg.get("interface_v1") and (split > 1 or self.geometry.head_runs > 1
                                                 or self.geometry.layout == "page_unified"):
            raise ValueError(f"kvbroker: --hicache-mem-layout {self.geometry.layout} needs "
                             "the zero-copy calls: add \"interface_v1\": 1 to the storage "
                             "backend extra config")
        self.layouts = [self._layout(g, i, split) for i, g in enumerate(self.shards)]
        self.layout = self.layouts[0]
        fd = getattr(mem_pool_host, "fd", None)
        if fd is None and self.cfg.get("allocator") == "shm":
            logger.warning("kvbroker: allocator=shm but the host pool has no fd")
        if fd is not None:  # even without a broker yet: the pool can only be moved while empty
            self._fd = self._usable_fd(fd)
        if self._fd is None:
            logger.warning(
                "kvbroker: host pool is not shared memory (start SGLang with extra config "
                "\"allocator\": \"shm\" for zero copy); pages go through a staging buffer: "
                "one extra memcpy of %.1f MB per 128-page batch",
                self._g().page_bytes * 128 / 1e6)
        if self._client is not None:
            try:
                self._open_ns(self._client)
            except (kvb.BrokerGone, kvb.NoBroker, kvb.Timeout) as e:
                self._broken(e)
            except kvb.Error as e:
                # The broker is there and refuses this layout (a page larger than it takes,
                # too many namespaces...): a configuration error, not an outage.
                raise RuntimeError(f"kvbroker: the broker refuses namespace {self.layout}: "
                                   f"{e.strerror}") from e
        logger.info("kvbroker: %s namespace %r, %s, %d-token pages of %d bytes%s, %s",
                    self.layout.kind, self.layout.model, self._g().layout,
                    self._g().tokens_per_page, self._g().page_bytes,
                    f" x {split} head groups (tp_lcm_size {sc.tp_lcm_size})" if split > 1
                    else "",
                    "staging copy" if self._fd is None else
                    "zero copy (registered memfd, broker pread/pwrite)" if self._fdcopy else
                    "zero copy (registered memfd)")

    def _usable_fd(self, fd: int) -> int | None:
        """The fd the broker is to copy to and from for this pool: SGLang's own when it is
        sealable; else a sealable memfd the pool is moved onto (shm_adopt: the broker maps
        it, the fastest path); else SGLang's unsealable fd itself, which the broker reads and
        writes with pread/pwrite instead of mapping it (_fdcopy: slower, still one copy).
        """
        import fcntl

        self._fdcopy = False
        try:
            if not fcntl.fcntl(fd, fcntl.F_GET_SEALS) & fcntl.F_SEAL_SEAL:
                return fd
        except OSError:
            pass
        pool = self.mem_pool_host
        why = None
        if not self.cfg.get("shm_adopt", True):
            why = "shm_adopt is off"
        elif hasattr(pool, "available_size") and pool.available_size() != pool.size:
            why = "the host pool is already in use"
        else:
            try:
                self._own_fd = _adopt_memfd(pool, fd)
            except Exception as e:
                why = f"moving it failed ({e})"
        if why is None:
            logger.info("kvbroker: SGLang's shm memfd has no MFD_ALLOW_SEALING; host pool "
                        "moved onto a sealable memfd at the same address (%.1f MB)",
                        self._g().nbytes / 1e6)
            return self._own_fd
        logger.warning("kvbroker: SGLang's shm memfd cannot be sealed and %s: the broker "
                       "copies it with pread/pwrite (about 0.6-0.7x of the mapped path)", why)
        self._fdcopy = True
        return fd

    def _layout(self, g: PoolGeometry, shard: int = 0, split: int = 1) -> kvb.Layout:
        """Shard `shard`'s namespace: MHA shards of a split page are TP ranks tp_rank * split
        + shard of tp_size * split (SGLang's virtual ranks of tp_lcm_size).
        """
        sc = self.storage_config
        name = self.cfg.get("namespace")
        if not name:
            name = model_ns_name(str(self.cfg.get("model") or sc.model_name or "model"))
        mla = g.kind == "mla"
        cp_size = max(sc.attn_cp_size, sc.dcp_size)
        cp_rank = sc.attn_cp_rank if sc.attn_cp_size > 1 else sc.dcp_rank
        return kvb.Layout(
            model=name, kind=kvb.MLA if mla else kvb.MHA, tokens_per_page=g.tokens_per_page,
            components=[kvb.Component(c, g.head_runs * g.num_layers, g.bytes_per_token_layer)
                        for c in g.components],
            tp_size=sc.tp_size * split, tp_rank=sc.tp_rank * split + shard,
            dtype=_logical_dtype(self.mem_pool_host, self.cfg),
            pp_size=sc.pp_size, pp_rank=sc.pp_rank, cp_size=cp_size, cp_rank=cp_rank,
            dp_size=1 if mla else sc.dp_rank + 1, dp_rank=0 if mla else sc.dp_rank,
            page_format=g.page_format)

    def _open_ns(self, client: kvb.Client) -> None:
        """Namespace, buffer and view on a (new) client; sets the handles ops use."""
        g = self._g()
        nss = tuple(client.ns_open(lay) for lay in self.layouts)
        views: tuple[kvb.View | None, ...] = (None,) * len(nss)
        staging = None
        if self._fd is not None:
            kv = self.mem_pool_host.kv_buffer
            try:
                buf = client.register_host_fd(self._fd, g.nbytes, 0, seal=True, mapped=kv,
                                              fdcopy=self._fdcopy)
            except kvb.Error as e:
                if e.errno not in (errno.EINVAL, errno.EOPNOTSUPP, errno.EPERM, errno.EBADF,
                                   errno.EMEDIUMTYPE):
                    raise
                logger.warning("kvbroker: the broker refused the host pool's fd (%s): "
                               "staging copy instead", e.strerror)
                self._fd = None
                self.zero_copy = False
            else:
                views = tuple(ns.view(sh.parts(buf)) for ns, sh in zip(nss, self.shards,
                                                                       strict=True))
                self.zero_copy = True
        if self._fd is None:
            npages = max(1, min(128, int(self.cfg.get("staging_mb", 64)) * 2**20
                                // g.page_bytes))
            hb = client.alloc_host(npages * g.page_bytes)
            staging = (hb, torch.frombuffer(hb, dtype=torch.uint8), npages)
        with self._lock:
            self._ns, self._view, self._staging = nss, views, staging
            self._gen += 1

    def _handles(self) -> tuple[int, tuple[kvb.Namespace, ...], Any, Any] | None:
        """The live (generation, namespace, view, staging), reconnecting when the broker was
        gone and retry_interval_s has passed; None while there is no broker.
        """
        with self._lock:
            if self._ns is not None:
                return self._gen, self._ns, self._view, self._staging
            if self._closed or self.geometry is None or time.monotonic() < self._retry_at:
                return None
            self._retry_at = time.monotonic() + self.retry_interval
        client = None
        try:
            client = kvb.connect(self.socket, name=self.client_name)
            if self._fd is None and self._own_fd is None and \
                    getattr(self.mem_pool_host, "fd", None) is not None:
                self._fd = self._usable_fd(self.mem_pool_host.fd)
            self._open_ns(client)
        except (kvb.Error, OSError) as e:
            if client is not None:
                client.close()
            if not self._down_logged:
                logger.warning("kvbroker: broker at %s unavailable (%s); L3 off until it is "
                               "back", self._where(), getattr(e, "strerror", e))
                self._down_logged = True
            return None
        with self._lock:
            old, self._client = self._client, client
        if old is not None:
            old.close()
        if self._down_logged:
            logger.warning("kvbroker: connected to the broker at %s: L3 tier on", self._where())
            self.stats.add(reconnects=1)
        self._down_logged = False
        with self._lock:
            if self._ns is None:  # dropped again by another thread meanwhile
                return None
            return self._gen, self._ns, self._view, self._staging

    def _broken(self, e: BaseException, gen: int | None = None) -> None:
        """An op failed: a broker gone or stuck drops the session (the next call after
        retry_interval_s reconnects); other errors only count.
        """
        self.stats.add(errors=1)
        gone = isinstance(e, (kvb.BrokerGone, kvb.NoBroker, kvb.Timeout, kvb.ClientClosed,
                              kvb.ForkedClient)) or \
            getattr(e, "errno", None) in (errno.ECONNRESET, errno.EPIPE, errno.ENOTCONN)
        if not gone:
            logger.warning("kvbroker: %s", e)
            return
        with self._lock:
            if gen is not None and gen != self._gen:
                return  # another thread already dropped this session
            self._ns = self._view = self._staging = None
            self._retry_at = time.monotonic() + min(self.retry_interval, 0.05)
            client, self._client = self._client, None
        if client is not None:
            client.close()
        if not self._down_logged:
            logger.warning("kvbroker: lost the broker at %s (%s); L3 misses until it is back",
                           self._where(), getattr(e, "strerror", e))
            self._down_logged = True

    # ---- the v1 zero-copy interface (interface_v1) ----

    def _slots(self, keys: list[str], host_indices: torch.Tensor) -> list[int]:
        P = self._g().tokens_per_page
        if host_indices.numel() < len(keys) * P:
            raise ValueError(f"{host_indices.numel()} host indices for {len(keys)} pages")
        return host_indices[::P][: len(keys)].tolist()

    def batch_exists(self, keys: list[str],
                     extra_info: HiCacheStorageExtraInfo | None = None) -> int:
        """How many leading keys are stored (one broker round trip); 0 without a broker.
        Every MLA rank asks the same namespace, so every rank gets the same answer.
        """
        if not keys:
            return 0
        h = self._handles()
        if h is None:
            return 0
        try:
            # One bytes object of n * 32 bytes: the cheapest form lookup() takes. A page
            # split into head groups is there when all of its groups are.
            blob = bytes.fromhex("".join(keys))
            return min(ns.lookup(blob) for ns in h[1])
        except kvb.Error as e:
            self._broken(e, h[0])
            return 0

    def batch_get_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Loads pages into the host pool at host_indices; per key True when the page is
        there in full. Never raises: a failure is a miss.
        """
        return self._batch_v1(False, keys, host_indices, extra_info)

    def batch_set_v1(self, keys: list[str], host_indices: torch.Tensor,
                     extra_info: HiCacheStorageExtraInfo | None = None) -> list[bool]:
        """Stores the host pool's pages at host_indices; True per page stored or already
        there (another rank, instance or job stored it). Never raises. Each page names the
        one before it as its parent (the last of extra_info.prefix_keys for the first), so
        the broker evicts these chains tail first and never strands a stored prefix's tail.
        """
        return self._batch_v1(True, keys, host_indices, extra_info)

    def _batch_v1(self, put: bool, keys: list[str], host_indices: torch.Tensor,
                  extra_info: HiCacheStorageExtraInfo | None) -> list[bool]:
        """batch_set_v1 (put) and batch_get_v1: one batch through the view over the host
        pool, or through the staging buffer; all False on a failure.
        """
        n = len(keys)
        if n == 0:
            return []
        t0 = time.perf_counter()
        h = self._handles()
        if h is None:
            return [False] * n
        gen, nss, views, staging = h
        try:
            kb = _keys(keys)
            slots = self._slots(keys, host_indices)
            par = _parents(kb, extra_info) if put else None
            done = [True] * n
            # A page split into head groups (tp_lcm_size) is loaded when every group is.
            for ns, view, g in zip(nss, views, self.shards, strict=True):
                if view is not None:
                    got = view.put_many(kb, slots, par) if put else view.get_many(kb, slots)
                else:
                    with self._staging_lock:
                        got = self._staged(ns, g, staging, kb, slots, parents=par)
                done = [a and bool(b) for a, b in zip(done, got, strict=True)]
        except Exception as e:
            if put and isinstance(e, kvb.PoolFull):
                logger.warning("kvbroker: pool full of leased pages: %s", e)
                self.stats.add(errors=1)
            else:
                self._broken(e, gen)
            return [False] * n
        dt, pb = time.perf_counter() - t0, self._g().page_bytes * len(self.shards)
        if put:
            self.stats.add(set_pages=n, set_stored=sum(done))
            self.stats.op("set", n, n * pb, dt)
            return [True] * n
        hits = sum(done)
        self.stats.add(get_pages=n, get_hits=hits)
        self.stats.op("get", hits, hits * pb, dt)
        return done

    def _flat(self) -> torch.Tensor:
        kv: torch.Tensor = self.mem_pool_host.kv_buffer
        return kv.view(-1).view(torch.uint8)

    def _staged(self, ns: kvb.Namespace, g: PoolGeometry, staging: Any, kb: list[bytes],
                slots: list[int], *, parents: list[bytes | None] | None) -> list[bool]:
        """The copy path: pages of shard g through the staging buffer, cap at a time; a PUT
        batch when parents is given (one per key, or None each), else a GET batch.
        """
        hb, st, cap = staging
        flat, pb = self._flat(), g.page_bytes
        mv, shape = memoryview(hb), g.canonical(flat, 0).shape
        out: list[bool] = []
        for i in range(0, len(kb), cap):
            chunk = slots[i:i + cap]
            bufs = [mv[j * pb:(j + 1) * pb] for j in range(len(chunk))]
            if parents is not None:
                for j, s in enumerate(chunk):
                    st[j * pb:(j + 1) * pb].view(shape).copy_(g.canonical(flat, s))
                out += ns.put_many(kb[i:i + cap], bufs, parents[i:i + cap])
                continue
            got = ns.get_many(kb[i:i + cap], bufs)
            for j, s in enumerate(chunk):
                if got[j]:  # a miss leaves the host page untouched
                    g.canonical(flat, s).copy_(st[j * pb:(j + 1) * pb].view(shape))
            out += got
        return out

    # ---- the v0 interface (flat pages in the host layout's own byte order) ----

    def _to_canonical(self, page: torch.Tensor) -> torch.Tensor:
        """A flat page of get_data_page() (host layout order) as canonical bytes."""
        g = self._g()
        u8 = page.contiguous().view(-1).view(torch.uint8)
        if g.layout != "page_first":
            return u8
        C, L, P, B = len(g.components), g.num_layers, g.tokens_per_page, \
            g.bytes_per_token_layer
        return u8.view(C, P, L, B).transpose(1, 2).contiguous().view(-1)

    def _from_canonical(self, data: torch.Tensor, out: torch.Tensor) -> None:
        g = self._g()
        dst = out.view(-1).view(torch.uint8)
        if g.layout != "page_first":
            dst.copy_(data)
            return
        C, L, P, B = len(g.components), g.num_layers, g.tokens_per_page, \
            g.bytes_per_token_layer
        dst.view(C, P, L, B).copy_(data.view(C, L, P, B).transpose(1, 2))

    def get(self, key: str, target_location: Any | None = None,
            target_sizes: Any | None = None) -> torch.Tensor | None:
        """One page into target_location (a flat page as get_dummy_flat_data_page());
        None when not stored or no broker.
        """
        r = self.batch_get([key], [target_location])
        return r[0]

    def batch_get(self, keys: list[str], target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> list[torch.Tensor | None]:
        """get() of many pages; None for each page not stored (all None without a broker)."""
        h = self._handles()
        if h is None or self.geometry is None:
            return [None] * len(keys)
        out: list[torch.Tensor | None] = []
        buf = torch.empty(self._g().page_bytes, dtype=torch.uint8)
        try:
            for k, t in zip(keys, target_locations or [None] * len(keys), strict=True):
                if t is None or not h[1][0].get_into(bytes.fromhex(k), buf.numpy()):
                    out.append(None)
                    continue
                self._from_canonical(buf, t)
                out.append(t)
        except Exception as e:
            self._broken(e, h[0])
            return [None] * len(keys)
        return out

    def set(self, key: str, value: Any | None = None, target_location: Any | None = None,
            target_sizes: Any | None = None) -> bool:
        """Stores one flat page (get_data_page(flat=True)); True when stored or already
        there.
        """
        return self.batch_set([key], [value])

    def batch_set(self, keys: list[str], values: Any | None = None,
                  target_locations: Any | None = None,
                  target_sizes: Any | None = None) -> bool:
        """set() of many pages; True when every page was stored or already there."""
        h = self._handles()
        if h is None or self.geometry is None or values is None:
            return False
        try:
            # Each page's parent: the one before it in this call (v0 names no prefix).
            parent: bytes | None = None
            for k, v in zip(keys, values, strict=True):
                kb = bytes.fromhex(k)
                h[1][0].put(kb, self._to_canonical(v).numpy(), parent)
                parent = kb
        except Exception as e:
            self._broken(e, h[0])
            return False
        return True

    def exists(self, key: str) -> bool:
        """Whether one page is stored (False without a broker)."""
        return self.batch_exists([key]) == 1

    # ---- the v2 calls: extra host pools (indexer, draft, state sidecars) ----

    def register_mem_host_pool_v2(self, host_pool: Any, host_pool_name: Any) -> None:
        """An extra pool SGLang moves with the KV pages (PoolTransfer.name). Each gets a
        namespace of its own (the model's, with one component named after the pool) holding
        SGLang's flat page bytes (get_data_page) under the KV page's key; "kv" is the main
        pool and its namespace.
        """
        super().register_mem_host_pool_v2(host_pool, host_pool_name)
        self._extra.pop(str(host_pool_name), None)

    def _extra_ns(self, name: str) -> kvb.Namespace | None:
        """The namespace of extra pool `name` on the live client (None without a broker)."""
        h = self._handles()
        if h is None:
            return None
        extra = self._extra
        got = extra.get(name)
        if got is not None and got[0] == h[0]:
            return got[1]  # type: ignore[no-any-return]
        pool = getattr(self, "registered_pools", {})[name]
        page = pool.get_dummy_flat_data_page()
        nbytes = page.numel() * page.element_size()
        tpp = self._g().tokens_per_page
        comp = name if len(name.encode()) < 16 else \
            name.encode()[:6].decode(errors="ignore") + "-" + \
            hashlib.sha256(name.encode()).hexdigest()[:8]
        base = self.layout
        # As HiCacheFile keys them: with a rank-replicated (MLA) model every pool is shared
        # by the ranks (rank 0 writes them all) except Mamba state, which is TP-sharded.
        shared = self.is_mla and name != "mamba"
        fmt = f"sglang:{getattr(pool, 'layout', '')}"[:31]
        lay = kvb.Layout(model=base.model, kind=kvb.MLA if shared else kvb.MHA,
                         tokens_per_page=tpp,
                         components=[kvb.Component(comp, 1, max(1, nbytes // tpp))],
                         tp_size=self.storage_config.tp_size,
                         tp_rank=self.storage_config.tp_rank,
                         dtype=_TORCH_DTYPES.get(pool.dtype),
                         pp_size=base.pp_size, pp_rank=base.pp_rank, cp_size=base.cp_size,
                         cp_rank=base.cp_rank, page_format=fmt)
        if lay.page_bytes != nbytes:
            raise ValueError(f"extra pool {name}: {nbytes}-byte pages do not split into "
                             f"{tpp} tokens")
        ns = self._client.ns_open(lay) if self._client is not None else None
        if ns is None:
            return None
        extra[name] = (h[0], ns, lay)
        return ns

    def _is_kv(self, name: Any) -> bool:
        return str(name) in ("kv", "__default__")

    def batch_exists_v2(self, keys: list[str], pool_transfers: Any = None,
                        extra_info: Any = None) -> Any:
        """HiCacheFile's semantics: the longest KV prefix stored, cut by each extra pool's
        hit policy (ALL_PAGES: every page of the prefix; TRAILING_PAGES: the last
        len(transfer.keys) pages of it).
        """
        from sglang.srt.mem_cache.hicache_storage import PoolHitPolicy, PoolTransferResult

        kv_pages = self.batch_exists(keys, extra_info)
        hit_count: dict[str, int] = {"kv": kv_pages} if kv_pages else {}
        restorable = list(range(1, kv_pages + 1))
        for t in pool_transfers or []:
            if not restorable:
                break
            name = str(t.name)
            try:
                ns = self._extra_ns(name)
                present = [False] * kv_pages
                if ns is not None and kv_pages:
                    _, tiers = ns.lookup_tiers(_keys(keys[:kv_pages]))
                    present = [x != kvb.TIER_NONE for x in tiers]
            except Exception as e:
                self._broken(e)
                present = [False] * kv_pages
            if t.hit_policy == PoolHitPolicy.ALL_PAGES:
                boundary = next((i for i in range(kv_pages) if not present[i]), kv_pages)
                ok = set(range(1, boundary + 1))
            elif t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
                trailing = max(1, len(t.keys) if t.keys else 1)
                ok = {n for n in range(1, kv_pages + 1)
                      if all(present[max(0, n - trailing):n])}
                boundary = max(ok, default=0)
            else:
                raise ValueError(f"Unsupported pool hit policy: {t.hit_policy}")
            if boundary:
                hit_count[name] = boundary
            restorable = [n for n in restorable if n in ok]
        return PoolTransferResult(restorable[-1] if restorable else 0, hit_count, restorable)

    def _io_v2(self, transfers: Any, write: bool) -> dict[str, list[bool]]:
        out: dict[str, list[bool]] = {}
        for t in transfers:
            name, keys = str(t.name), list(t.keys or [])
            if self._is_kv(name):
                fn = self.batch_set_v1 if write else self.batch_get_v1
                out[t.name] = fn(keys, t.host_indices) if keys else []
                continue
            pool = getattr(self, "registered_pools", {}).get(name)
            ps = getattr(pool, "page_size", 1) or 1
            idx = t.host_indices
            if pool is None or idx is None or idx.numel() != len(keys) * ps:
                out[t.name] = [False] * len(keys)
                continue
            try:
                ns = self._extra_ns(name)
                if ns is None:
                    out[t.name] = [False] * len(keys)
                    continue
                res = []
                for k, i in zip(_keys(keys), idx[::ps].tolist(), strict=True):
                    if write:
                        page = pool.get_data_page(i, flat=True).contiguous()
                        ns.put(k, page.view(torch.uint8).numpy())
                        res.append(True)
                    else:
                        page = pool.get_dummy_flat_data_page()
                        ok = ns.get_into(k, page.view(torch.uint8).numpy())
                        if ok:
                            pool.set_from_flat_data_page(i, page)
                        res.append(bool(ok))
                out[t.name] = res
            except Exception as e:
                self._broken(e)
                out[t.name] = [False] * len(keys)
        return out

    def batch_get_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, list[bool]]:
        """Loads each PoolTransfer's pages (the KV pool through batch_get_v1). All or
        nothing per page: a page any pool of the call missed is reported missing for every
        pool that names it, so SGLang never restores a page's KV without its sidecars (or
        the other way round).
        """
        out = self._io_v2(transfers, write=False)
        ok: dict[str, bool] = {}
        for t in transfers:
            for k, r in zip(list(t.keys or []), out.get(t.name, []), strict=False):
                ok[k] = ok.get(k, True) and bool(r)
        for t in transfers:
            out[t.name] = [bool(r) and ok.get(k, False)
                           for k, r in zip(list(t.keys or []), out.get(t.name, []),
                                           strict=False)]
        return out

    def batch_set_v2(self, transfers: Any, extra_info: Any = None) -> dict[str, list[bool]]:
        """Stores each PoolTransfer's pages (the KV pool through batch_set_v1)."""
        return self._io_v2(transfers, write=True)

    # ---- the rest of HiCacheStorage ----

    def clear(self) -> bool:
        """Leaves the broker's pool alone: its pages are shared with other ranks, instances
        and jobs, so one engine's flush must not drop them (the broker evicts by LRU).
        Returns True so SGLang's flush goes on.
        """
        logger.info("kvbroker: clear() keeps the shared pool (drop pages with kvbctl)")
        return True

    def get_stats(self) -> Any:
        """SGLang's StorageMetrics since the last call (it polls every scheduler tick: this
        swaps four lists and asks nothing of the broker).
        """
        m = self._metrics_cls()
        s = self.stats
        with s.lock:
            m.prefetch_pgs, s.prefetch_pgs = s.prefetch_pgs, []
            m.backup_pgs, s.backup_pgs = s.backup_pgs, []
            m.prefetch_bandwidth, s.prefetch_bw = s.prefetch_bw, []
            m.backup_bandwidth, s.backup_bw = s.backup_bw, []
        return m

    def close(self) -> None:
        """Drops the session; the host pool (and a memfd this backend moved it onto) stays
        valid for SGLang.
        """
        with self._lock:
            self._closed = True
            client, self._client = self._client, None
            self._ns = self._view = self._staging = None
            own, self._own_fd = self._own_fd, None
        if client is not None:
            client.close()
        if own is not None:  # the pool stays mapped; the fd only served registrations
            os.close(own)
            if self._fd == own:
                self._fd = None
