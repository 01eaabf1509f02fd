# SPDX-License-Identifier: MIT
"""The worker role of the vLLM connector: where vLLM's KV lives, and the step's loads and
stores.

Each layer's KV is first mapped onto canonical views (layouts.kv_views, from the layer's
attention backend). Where every token row of every view is one byte range (NHD layouts) the
KV memory is described to the broker as view parts, so the broker itself copies between its
pool and vLLM's memory: GPU tensors through GPU registration (the broker DMAs), CPU tensors by
moving them once into a sealed memfd that the broker maps (zero-copy from then on). Every
other layout (HND, head-packed cells, vLLM-CPU's block format), and any memory the broker
cannot reach, moves by a converting copy through a broker buffer in canonical order: same
page bytes, one copy more.
"""

from __future__ import annotations

import contextlib
import itertools
import logging
import mmap
import os
import select
import socket
import struct
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from vllm.v1.kv_cache_interface import AttentionSpec

import kvbroker as kvb
from kvbroker import _kvbroker
from kvbroker.vllm.common import (
    _STAT_KEYS,
    KVBrokerMetadata,
    KVBrokerStats,
    _Link,
    _Transfer,
)
from kvbroker.vllm.layouts import _owner, kv_views, token_range

if TYPE_CHECKING:
    from kvbroker.vllm.connector import KVBrokerConnector

logger = logging.getLogger("kvbroker.vllm")

# user_data of stores starts here, loads count from 1: one pump reaps both.
_SAVE_UD = 1 << 40
_ALOAD_UD = 1 << 41  # asynchronous loads


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


# Loads through the view are the broker's to copy, even of pages the library could copy from the
# pool directory inside submit(): vLLM computes layer groups while the later ones load, and
# that overlap needs the copies off the worker's thread (CPU KV tensors, tools/bench_vllm.py:
# load 0.6 -> 0.8-0.9 of memcpy with the Python work overlapped; GPU tensors are the broker's
# anyway).
_LOAD_FLAGS = kvb.OPF_VIEW | kvb.OPF_ASYNC

_WIDE = ((8, torch.int64), (4, torch.int32), (2, torch.int16))


def _wide(v: torch.Tensor) -> torch.Tensor:
    """A canonical byte view (layouts.kv_views: trailing bytes contiguous) over the same
    memory as elements of the widest integer type its strides and alignment allow, so a
    converting copy moves whole elements instead of single bytes through the layout's
    strides (vLLM-CPU's transposed K: about 4x faster, tools/bench_vllm.py); integers, so
    every bit pattern is copied as it is. The view itself when no wider type fits.
    """
    if v.dtype != torch.uint8 or v.dim() < 2 or v.stride(-1) != 1:
        return v
    for es, dt in _WIDE:
        if v.shape[-1] % es == 0 and v.data_ptr() % es == 0 and \
                v.untyped_storage().data_ptr() % es == 0 and \
                all(st % es == 0 for st in v.stride()[:-1]):
            return torch.empty(0, dtype=dt, device=v.device).set_(
                v.untyped_storage(), v.storage_offset() // es,
                (*v.shape[:-1], v.shape[-1] // es), (*(st // es for st in v.stride()[:-1]), 1))
    return v


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


@dataclass
class _Fence:
    """A client given up on (an op timed out) whose ops may still run: a broker that was only
    slow or stopped (SIGSTOP, overload), not dead, runs its queued ops when it resumes, and a
    GET through a view writes vLLM's block, a PUT through one reads it. Until every op the
    broker took has completed, or the broker is gone (the library then completes each with
    -ECONNRESET), the blocks of `reqs` stay held: their finishing is not reported in
    finished_sending, nor the asynchronous loads of `recving` in finished_recving, so vLLM
    neither frees nor reuses them.
    """

    pump: _Pump
    reqs: set[str]
    recving: set[str]
    keep: tuple[Any, ...]  # the client's views and buffers: alive until it is closed
    pidfd: int = -1  # the broker process (_broker_pidfd): readable once it exited


def _broker_pidfd(client: kvb.Client, sock: str | None) -> int:
    """A pidfd of the broker process behind client, or -1 when that cannot be told for sure.
    The pid the broker reports (stats) is its own pid namespace's; the kernel's SO_PEERCRED
    of its socket is ours, but names whoever listen()ed (the first broker, after a
    hand-over). Only when both agree is the pid surely this broker's, in our namespace.
    """
    try:
        pid = int(client.stats().get("pid", 0))
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as s:
            s.settimeout(1.0)
            s.connect(kvb.socket_path(sock))
            cred = s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if pid <= 0 or struct.unpack("3i", cred)[0] != pid:
            return -1
        return os.pidfd_open(pid)
    except (OSError, ValueError, AttributeError):  # kvb.Error is an OSError
        return -1


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
        # After a timeout, move CPU KV onto a fresh memfd (one copy of the KV memory) so
        # late writes of a stopped broker land in the old file: see _privatize.
        self.retire = bool(conn.extra.get("retire_on_timeout", True))
        self.parts: list[list[_Part]] = []  # [plan][component-major (component, layer)]
        # [plan][component-major (component, layer)]: canonical views (layouts.kv_views)
        self.cviews: list[list[torch.Tensor]] = []
        # The same views as whole elements (_wide): what converting copies move.
        self.wviews: list[list[torch.Tensor]] = []
        self.how: set[str] = set()
        self.regions: list[_Region] = []
        self.views: list[kvb.View | None] = []
        self.bufs: list[Any] = []
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
        # ud -> (plan, chunk, block id, request)
        self.load_ops: dict[int, tuple[int, int, int, str]] = {}
        self.load_left: dict[tuple[int, int], int] = {}
        self.load_errors: set[int] = set()
        self.finished_sending: set[str] = set()
        # Stores in flight: ud -> (plan, request, ring slot or -1 for a view PUT).
        self.save_ops: dict[int, tuple[int, str, int]] = {}
        self.save_ud = itertools.count(_SAVE_UD)
        self.req_pending: dict[str, int] = {}  # request -> its PUTs in flight
        self.finish_wait: set[str] = set()  # finishing requests waiting for those
        self.view_saves_pending = False
        # Asynchronous loads in flight: ud -> (request, plan, block, ring slot or -1).
        self.aload_ops: dict[int, tuple[str, int, int, int]] = {}
        self.aload_ud = itertools.count(_ALOAD_UD)
        self.aload_pending: dict[str, int] = {}
        self.aload_progress = 0.0  # the last submission or completion of one
        self.finished_recving: set[str] = set()
        # Requests with a failed asynchronous load: vLLM's failed_recving, how load errors
        # are reported with several KV cache groups (block ids are per group there).
        self.failed_recving: set[str] = set()
        # In-step converting-copy loads: queued for a ring slot, and ud -> slot in flight.
        self.copy_q: deque[tuple[Any, ...]] = deque()
        self.cload_slot: dict[int, int] = {}
        # Completed converting-copy GETs whose pages wait in their ring slots for the
        # batch's scatter: (plan, block, slot).
        self.scatter_q: list[tuple[int, int, int]] = []
        # Converting copies: a ring of page slots in a broker buffer, PUT from there.
        # Sized in bytes (save_ring_mb, 64 MiB): enough for the pages of a few long
        # prefills in flight, so a step rarely waits for a slot.
        self.ring_bytes = max(1, int(float(conn.extra.get("save_ring_mb", 64)) * 2**20))
        self.ring_pages = 1
        self.ring: Any = None
        self.ring_t: torch.Tensor | None = None
        self.ring_page = 0
        self.ring_free: list[int] = []
        self.stats = KVBrokerStats()  # this interval's, handed to vLLM and reset
        self.stats_total: dict[str, float] = dict.fromkeys(_STAT_KEYS, 0)
        self.registered = False
        self.lock = threading.Lock()
        self.fences: list[_Fence] = []
        self.pidfd = -1  # the connected broker's (_broker_pidfd)
        self.fenced: set[str] = set()  # the requests of every fence

    # -- registration ------------------------------------------------------------------------

    def register(self, kv_caches: dict[str, torch.Tensor]) -> None:
        """Maps every stored layer's KV onto canonical views (raises LayoutError naming an
        unknown layout), then decides per plan between broker views and converting copies.
        """
        kcc = self.conn._kv_cache_config
        num_blocks = kcc.num_blocks
        self.how = set()

        def build() -> list[list[torch.Tensor]]:
            cviews: list[list[torch.Tensor]] = []
            for p in self.plans:
                spec = kcc.kv_cache_groups[p.group_id].kv_cache_spec
                assert isinstance(spec, AttentionSpec)  # namespace_layouts() skips others
                comp: list[list[torch.Tensor]] = [[] for _ in p.components]
                for name in p.layer_names:
                    if name not in kv_caches:
                        raise ValueError(f"kvbroker: no KV tensor for layer {name}")
                    lk = kv_views(self.conn._vllm_config, p, name, kv_caches[name],
                                  spec=spec, num_blocks=num_blocks)
                    self.how.add(lk.how)
                    for ci, v in enumerate(lk.views):
                        comp[ci].append(v)
                cviews.append([v for c in comp for v in c])
            return cviews

        cviews = build()
        regions: dict[int, _Region] = {}
        for t in kv_caches.values():
            st = t.untyped_storage()
            if st.data_ptr() not in regions:
                regions[st.data_ptr()] = _Region(st, st.data_ptr(), st.nbytes(), t.is_cuda)
        self.regions = list(regions.values())
        self.cuda = any(r.cuda for r in self.regions)
        viewable = all(token_range(v) is not None for vs in cviews for v in vs)
        stray: set[int] = set()
        if self.zero_copy and viewable:
            # Only a view needs the broker to reach the memory: moving CPU KV into a memfd
            # for converting copies would cost its page faults for nothing.
            stray = self._stray_holders(kv_caches)
            for r in self.regions:
                if not r.cuda and r.ptr not in stray:
                    self._rehome(r, kv_caches)
            cviews = build()  # over the moved storage
        self.cviews = cviews
        self.wviews = [[_wide(v) for v in vs] for vs in cviews]
        parts: list[list[_Part]] = []
        if viewable:
            by_ptr = {r.ptr: r for r in self.regions}
            for vs in cviews:
                pp = []
                for v in vs:
                    tr = token_range(v)
                    assert tr is not None
                    reg = by_ptr[v.untyped_storage().data_ptr()]
                    pp.append(_Part(reg, tr[0], tr[1], tr[2], v[0, 0].numel()))
                parts.append(pp)
        self.parts = parts
        logger.info("kvbroker: KV layout %s: %s", ", ".join(sorted(self.how)),
                    "broker views" if viewable and self.zero_copy and not stray
                    else "converting copies")
        self.registered = True
        self.link.get()

    def _stray_holders(self, kv_caches: dict[str, torch.Tensor]) -> set[int]:
        """Storages (data_ptr) _rehome must not move: an attention layer holds its KV through
        a tensor object other than the one handed to the connector (vLLM-CPU's MLA layers
        do), which set_() cannot re-point, so vLLM would go on computing into the old
        memory while the broker read and wrote the new: zero or stale pages stored, loads
        vLLM never sees. Those move by converting copies, over the memory vLLM uses.
        """
        try:
            ctx = self.conn._vllm_config.compilation_config.static_forward_context
        except AttributeError:
            return set()
        stray: set[int] = set()
        for name, t in kv_caches.items():
            held = getattr(ctx.get(name), "kv_cache", None)
            for h in held if isinstance(held, (list, tuple)) else [held]:
                if isinstance(h, torch.Tensor) and h is not t and \
                        h.untyped_storage().data_ptr() == t.untyped_storage().data_ptr():
                    stray.add(t.untyped_storage().data_ptr())
        if stray:
            logger.info("kvbroker: vLLM holds its KV through tensors the connector cannot "
                        "re-point: converting copies, not broker views")
        return stray

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
        if self.pidfd >= 0:
            os.close(self.pidfd)
        self.pidfd = _broker_pidfd(client, self.link.socket)
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
        for pi in range(len(self.plans)):
            plan_parts = self.parts[pi] if self.parts else []
            view = None
            if plan_parts and all(pt.region.ptr in bufs for pt in plan_parts):
                view = self.link.ns[pi].view([
                    kvb.ViewPart(bufs[pt.region.ptr], pt.stride, pt.base, pt.page_stride)
                    for pt in plan_parts])
            self.views.append(view)
        self.copy_mode = any(v is None for v in self.views)
        if self.copy_mode:
            self.ring_page = max(ns.page_bytes for ns in self.link.ns)
            self.ring_pages = max(4, self.ring_bytes // self.ring_page)
            self.ring = client.alloc_host(self.ring_pages * self.ring_page)
            self.ring_t = None
        self.ring_free = list(range(self.ring_pages))
        self.save_ops.clear()
        self.req_pending.clear()
        self.aload_ops.clear()
        self.copy_q.clear()
        self.cload_slot.clear()
        # (Always flushed before a hook returns; were one left, its block was never written.)
        self.load_errors.update(block for _pi, block, _slot in self.scatter_q)
        self.scatter_q.clear()

    # -- loads --------------------------------------------------------------------------------

    def start_load(self, meta: KVBrokerMetadata) -> None:
        self.load_ops.clear()
        self.load_left.clear()
        if any(tr.async_load for tr in meta.loads):
            self._start_async_loads([tr for tr in meta.loads if tr.async_load])
            meta = KVBrokerMetadata([tr for tr in meta.loads if not tr.async_load])
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
                        if block < 0:  # a window group's block vLLM does not keep
                            continue
                        ud += 1
                        self.load_ops[ud] = (pi, ci, block, tr.req_id)
                        self.load_left[(pi, ci)] = self.load_left.get((pi, ci), 0) + 1
                        view = self.views[pi]
                        if self.copy_mode or view is None:
                            ops.append((pi, key, block, first, count, ud))
                        else:
                            ops.append(kvb.Op(kvb.OP_GET, _LOAD_FLAGS, 0, view.id, key,
                                              block * bs, first, count, ud))
        if self.copy_mode:
            # Through ring slots: the broker copies pages into the slots while earlier ones
            # are scattered into vLLM's blocks (converting copies), instead of one round trip
            # per page.
            self.copy_q.extend(ops)
            self._feed_copy_loads()
            self._drive_loads(None)
        else:
            self.pump.add(ops)
            self._drive_loads(None)
        self._inc("load_s", time.perf_counter() - t0)

    def _feed_copy_loads(self) -> None:
        """Submits queued converting-copy loads as ring slots free up."""
        if self.pump is None:
            return
        ops = []
        while self.copy_q and self.ring_free:
            pi, key, _block, _first, _count, ud = self.copy_q.popleft()
            slot = self.ring_free.pop()
            self.cload_slot[ud] = slot
            ops.append(kvb.Op(kvb.OP_GET, kvb.OPF_ASYNC, self.link.ns[pi].id, self.ring.id, key,
                              slot * self.ring_page, 0, 0, ud))
        if ops:
            self.pump.add(ops)

    def _load_done(self, ud: int, res: int) -> None:
        info = self.load_ops.pop(ud, None)
        if info is None:
            return
        pi, ci, block, _req = info
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
                self.load_errors.update(b for b in ids if b >= 0)
            if tr.async_load:
                self.failed_recving.add(tr.req_id)
            self._inc("load_errors", len(tr.keys))
        self._inc("broker_down", 1)

    def _fail_pending_loads(self) -> None:
        self.copy_q.clear()
        self.ring_free.extend(self.cload_slot.values())
        self.cload_slot.clear()
        for pi, ci, block, _req in self.load_ops.values():
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
            while pump.busy or self.copy_q:
                if until is not None and all(
                        self.load_left.get((until[0], c), 0) == 0 for c in range(until[1] + 1)):
                    return
                self._feed_copy_loads()
                for ud, res, flags, _lease in pump.step(block=until is not None):
                    self._complete(ud, res, flags)
                self._flush_scatter()
                if until is None:
                    return
        except (kvb.Error, OSError, TimeoutError) as e:
            self._lost(e)

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

    # -- asynchronous loads ---------------------------------------------------------------
    #
    # vLLM waits for these outside the step: the GETs are submitted here and reaped by later
    # hooks; a request is reported in finished_recving once all its pages landed or failed
    # (failed blocks are load errors, which vLLM recomputes). Views land in vLLM's blocks
    # directly; converting copies land in a ring slot first and are scattered into the
    # block when reaped (the blocks are the waiting request's alone until then).

    def _start_async_loads(self, loads: list[_Transfer]) -> None:
        client = self.link.get()
        if client is None or self.pump is None:
            self._fail_loads(loads)
            self.finished_recving.update(tr.req_id for tr in loads)
            return
        t0 = time.perf_counter()
        bs = self.block_size
        for tr in loads:
            n = 0
            for pi in range(len(self.plans)):
                view = self.views[pi] if self.views else None
                for key, block in zip(tr.keys, tr.block_ids[pi], strict=True):
                    if block < 0:  # a window group's block vLLM does not keep
                        continue
                    ud = next(self.aload_ud)
                    if view is not None:
                        self.aload_ops[ud] = (tr.req_id, pi, block, -1)
                        op = kvb.Op(kvb.OP_GET, _LOAD_FLAGS, 0, view.id, key, block * bs, 0, 0,
                                    ud)
                    else:
                        slot = self._ring_slot()
                        if slot < 0 or self.pump is None:
                            self.load_errors.add(block)
                            self.failed_recving.add(tr.req_id)
                            self._inc("load_errors", 1)
                            continue
                        self.aload_ops[ud] = (tr.req_id, pi, block, slot)
                        op = kvb.Op(kvb.OP_GET, kvb.OPF_ASYNC, self.link.ns[pi].id,
                                    self.ring.id, key, slot * self.ring_page, 0, 0, ud)
                    assert self.pump is not None
                    self.pump.add([op])
                    n += 1
            if n:
                self.aload_pending[tr.req_id] = self.aload_pending.get(tr.req_id, 0) + n
            else:
                self.finished_recving.add(tr.req_id)
        self.aload_progress = time.monotonic()
        self._pump_step(False)
        self._inc("load_s", time.perf_counter() - t0)

    def _aload_done(self, ud: int, res: int) -> None:
        info = self.aload_ops.pop(ud, None)
        if info is None:
            return
        req_id, pi, block, slot = info
        self.aload_progress = time.monotonic()
        if res < 0:
            self.load_errors.add(block)
            self.failed_recving.add(req_id)
            self._inc("load_errors", 1)
        else:
            if slot >= 0:
                self.scatter_q.append((pi, block, slot))
                slot = -1  # freed by _flush_scatter
            self._inc("loaded_pages", 1)
            self._inc("loaded_bytes", self.link.ns[pi].page_bytes if self.link.ns else 0)
        if slot >= 0:
            self.ring_free.append(slot)
        left = self.aload_pending.get(req_id, 1) - 1
        if left > 0:
            self.aload_pending[req_id] = left
        else:
            self.aload_pending.pop(req_id, None)
            self.finished_recving.add(req_id)

    def _flush_scatter(self) -> None:
        """The pages of a batch of completed converting-copy GETs, from their ring slots
        into vLLM's blocks (batched: _ring_copy), then the slots freed. Called after each
        batch of completions, before anything is reported to vLLM or a slot reused.
        """
        if not self.scatter_q:
            return
        q, self.scatter_q = self.scatter_q, []
        for pi in sorted({it[0] for it in q}):
            mine = [it for it in q if it[0] == pi]
            blocks = [it[1] for it in mine]
            if len(set(blocks)) == len(blocks):
                self._ring_copy(pi, blocks, [it[2] for it in mine], save=False)
            else:  # one block twice (not from vLLM's tables): in arrival order
                for _pi, block, slot in mine:
                    self._ring_copy(pi, [block], [slot], save=False)
        if self.cuda:
            torch.cuda.current_stream().synchronize()  # the slots are reused next
        self.ring_free.extend(it[2] for it in q)

    def _drop_async_loads(self) -> None:
        for req_id, _pi, block, _slot in self.aload_ops.values():
            self.load_errors.add(block)
            self.failed_recving.add(req_id)
            if req_id not in self.fenced:  # else once its fence is settled
                self.finished_recving.add(req_id)
        self._inc("load_errors", len(self.aload_ops))
        self.aload_ops.clear()
        self.aload_pending.clear()

    # -- stores -------------------------------------------------------------------------------
    #
    # Asynchronous: the step submits its PUTs and returns; completions are reaped by later
    # hooks (the next step's loads, get_finished). What makes that safe is what the broker
    # reads: a converting copy snapshots the page into a ring slot of a broker buffer inside
    # the step, so vLLM may reuse the block at once; a view PUT reads vLLM's block itself, so
    # the next step's start_load (which runs before its forward writes any block) first waits
    # for them. A finishing request's blocks stay vLLM's until its PUTs completed
    # (finished_sending).

    def _complete(self, ud: int, res: int, flags: int) -> None:
        if ud < _SAVE_UD:
            slot = self.cload_slot.pop(ud, -1)
            if slot >= 0:
                load = self.load_ops.get(ud)
                if res >= 0 and load is not None:
                    self.scatter_q.append((load[0], load[2], slot))
                else:
                    self.ring_free.append(slot)
            self._load_done(ud, res)
            return
        if ud >= _ALOAD_UD:
            self._aload_done(ud, res)
            return
        info = self.save_ops.pop(ud, None)
        if info is None:
            return
        pi, req_id, slot = info
        if slot >= 0:
            self.ring_free.append(slot)
        if res < 0:
            self._count_store(pi, -1)
        else:
            self._count_store(pi, 1 if flags & kvb.CQEF_EXISTED else 0)
        self._req_done(req_id)

    def _req_done(self, req_id: str) -> None:
        left = self.req_pending.get(req_id, 0) - 1
        if left > 0:
            self.req_pending[req_id] = left
            return
        self.req_pending.pop(req_id, None)
        if req_id in self.finish_wait and req_id not in self.fenced:
            self.finish_wait.discard(req_id)
            self.finished_sending.add(req_id)

    def _drop_saves(self) -> None:
        """The broker went away: pending PUTs will never complete (the pages are future
        misses); their requests' blocks are vLLM's again.
        """
        self._drop_async_loads()
        self._inc("store_errors", len(self.save_ops))
        self.save_ops.clear()
        self.req_pending.clear()
        self.ring_free = list(range(self.ring_pages))
        self.finished_sending |= self.finish_wait - self.fenced
        self.finish_wait &= self.fenced

    def _pump_step(self, block: bool) -> None:
        """One submit/reap round for loads and stores; a broker failure fails both."""
        pump = self.pump
        if pump is None or not pump.busy:
            return
        try:
            for ud, res, flags, _lease in pump.step(block=block):
                self._complete(ud, res, flags)
            self._flush_scatter()
        except (kvb.Error, OSError, TimeoutError) as e:
            self._lost(e)

    def _lost(self, e: BaseException) -> None:
        """A broker failure or timeout: the step goes on without the broker (loads become
        load errors, stores future misses). Ops the broker took that write or read vLLM's
        blocks (views: GETs into them, PUTs from them) may still run if it was only slow, so
        their client is kept and fenced (_Fence) instead of closed, and their requests'
        blocks stay held until it is settled. Converting copies touch only the client's own
        ring, never reused once it is dropped: nothing to fence.
        """
        self._flush_scatter()  # pages that did arrive, while the ring is still mapped
        pump, self.pump = self.pump, None
        reqs: set[str] = set()
        recving: set[str] = set()
        view_puts = False
        if pump is not None and pump.inflight:
            for ud, (_pi, _ci, _block, req) in self.load_ops.items():
                if ud not in self.cload_slot:
                    reqs.add(req)
            for req, _pi, _block, slot in self.aload_ops.values():
                if slot < 0:
                    reqs.add(req)
                    recving.add(req)
            for _pi, req, slot in self.save_ops.values():
                if slot < 0:
                    reqs.add(req)
                    view_puts = True
        if pump is not None and reqs and self._privatize(keep_old=view_puts):
            reqs.clear()  # late writes land in memory vLLM no longer sees
        if pump is not None and reqs:
            pump.queue.clear()  # never submitted: the broker cannot run them
            self.link.fail(e, keep=True)
            self.fences.append(_Fence(pump, reqs, recving,
                                      (self.views, self.bufs, self.ring), self.pidfd))
            self.pidfd = -1
            self.fenced |= reqs
            logger.warning("kvbroker: %d ops in flight on the dropped connection may still "
                           "touch the KV blocks of %d requests: they stay held until the "
                           "broker completes them or is gone", pump.inflight, len(reqs))
        else:
            self.link.fail(e)
        self._fail_pending_loads()
        self._drop_saves()

    def _privatize(self, keep_old: bool) -> bool:
        """Moves every KV region, in place, onto a new memfd (remap_onto_memfd: a copy of the
        region, then one mremap over the same addresses, so vLLM's tensors stay valid); the
        broker's mapping keeps the old file, so whatever it still writes lands where vLLM no
        longer reads, even into blocks vLLM frees without telling the connector (a
        preemption), and what it still reads is what the blocks held. Cost, on this failure
        path only: one copy of the KV memory (about 0.8 s per GiB on a loaded 2-core
        machine) and, while the broker keeps the old file mapped, its pages. Those are
        punched out at once unless keep_old: PUTs through the view in flight would read
        zeros there and store them as the pages (test_broker_stopped_mid_save_stores_no_
        wrong_page); the file then lasts until the broker unmaps it. Not for GPU memory (a
        fence holds those blocks instead).
        Returns whether every region was moved.
        """
        if not self.retire or not self.regions or \
                any(r.cuda or r.memfd < 0 for r in self.regions):
            return False
        t0 = time.perf_counter()
        for r in self.regions:
            try:
                fd = _kvbroker.remap_onto_memfd(r.ptr, r.nbytes, "kvbroker-vllm-kv")
            except OSError as e:
                logger.warning("kvbroker: cannot move the KV memory off the broker's file "
                               "(%s): fencing its blocks instead", e)
                return False
            old, r.memfd = r.memfd, fd
            if not keep_old:
                try:
                    _kvbroker.punch_hole(old, 0, r.nbytes)
                except OSError as e:  # sealed against writes: freed when the broker unmaps it
                    logger.debug("kvbroker: old KV memfd kept: %s", e)
            os.close(old)
        logger.warning("kvbroker: KV memory moved off the unresponsive broker's file in "
                       "%.2f s", time.perf_counter() - t0)
        return True

    def _reap_fences(self) -> None:
        """Reaps the fenced clients' completions without waiting; releases the requests of
        each one that is settled (every op it had in flight completed, or the broker gone).
        """
        for f in list(self.fences):
            try:
                while f.pump.inflight > 0:
                    comps = f.pump.client.reap(512, 0, 0)
                    if not comps:
                        break
                    f.pump.inflight -= len(comps)
            except (kvb.BrokerGone, kvb.NoBroker):
                f.pump.inflight = 0  # the broker is gone: nothing of it writes any more
            except (kvb.Error, OSError) as e:
                # Not proof that the broker stopped: keep holding (a leak, never a wrong page).
                logger.debug("kvbroker: fenced connection: %s", e)
                continue
            if f.pump.inflight > 0 and f.pidfd >= 0 and select.select([f.pidfd], [], [], 0)[0]:
                f.pump.inflight = 0  # the broker process exited: nothing of it writes now
            if f.pump.inflight > 0:
                continue
            self.fences.remove(f)
            if f.pidfd >= 0:
                os.close(f.pidfd)
            with contextlib.suppress(Exception):
                f.pump.client.close()
            self.fenced = set().union(*(g.reqs for g in self.fences))
            for req in f.recving - self.fenced:
                self.finished_recving.add(req)
            for req in f.reqs - self.fenced:
                if req in self.finish_wait and self.req_pending.get(req, 0) <= 0:
                    self.finish_wait.discard(req)
                    self.finished_sending.add(req)
            logger.info("kvbroker: fenced connection settled: %d requests' blocks released",
                        len(f.reqs))

    def settle_preempted(self, preempted: set[str]) -> None:
        """Settles the fences of requests preempted in this step: vLLM frees their blocks
        without asking the connector and hands them to others before the forward. A fence
        (ops of a connection given up on that read or write blocks through a view; there is
        one only where the KV memory could not move off the broker's file: GPU memory,
        retire_on_timeout off) holding such a request's blocks makes this step wait until
        the broker completed those ops or is gone. A stopped broker stalls the engine here,
        never a wrong page.
        """
        if not any(f.reqs & preempted for f in self.fences):
            return
        t0 = last = time.monotonic()
        while True:
            self._reap_fences()
            if not any(f.reqs & preempted for f in self.fences):
                return
            if time.monotonic() - last >= 10:
                last = time.monotonic()
                logger.warning("kvbroker: a preempted request's blocks wait %.0f s for the "
                               "ops of an unresponsive broker (it must answer or exit)",
                               last - t0)
            time.sleep(0.01)

    def settle_view_saves(self) -> None:
        """Waits for view PUTs still reading vLLM's blocks (before a forward writes any)."""
        if not self.view_saves_pending:
            return
        t0 = time.perf_counter()
        while self.pump is not None and any(i[2] < 0 for i in self.save_ops.values()):
            self._pump_step(True)
        self.view_saves_pending = False
        self._inc("store_s", time.perf_counter() - t0)

    def poll(self) -> None:
        """Reaps what completed without waiting (stores, asynchronous loads, fences)."""
        if self.save_ops or self.aload_ops:
            self._pump_step(False)
        if self.aload_ops and self.pump is not None and \
                time.monotonic() - self.aload_progress > self.timeout_ms / 1e3:
            # Asynchronous loads are reaped only without waiting: without this a broker
            # that stopped answering would keep their requests waiting for ever. Their
            # blocks stay held where the broker may still write them (_lost, _Fence).
            self._lost(TimeoutError(f"asynchronous loads: no completion in "
                                    f"{self.timeout_ms} ms"))
        if self.fences:
            self._reap_fences()

    def save(self, meta: KVBrokerMetadata) -> None:
        if meta.saves:
            self._save(meta.saves)
            if self.view_saves_pending and any(p.window or p.chunk for p in self.plans):
                # vLLM frees a window group's blocks behind the window when it schedules
                # the next step and may hand them to a request whose blocks the runner
                # zeroes before start_load: view PUTs reading them finish in this step.
                self.settle_view_saves()
        for req_id in meta.finish_req_ids:
            if self.req_pending.get(req_id, 0) > 0 or req_id in self.fenced:
                self.finish_wait.add(req_id)
            else:
                self.finished_sending.add(req_id)
        self.poll()

    def _ring_slot(self) -> int:
        while not self.ring_free and self.pump is not None and (self.save_ops or
                                                                 self.aload_ops):
            self._pump_step(True)  # backpressure: the ring is full of PUTs in flight
        return self.ring_free.pop() if self.ring_free else -1

    def _save(self, saves: list[_Transfer]) -> None:
        # (group, key, block, parent, request): vLLM's block hashes chain, and so do our
        # keys; an MLA page's parent may be another rank's to store (then it links once both
        # are there).
        mine = [(pi, key, block, parent, tr.req_id)
                for tr in saves
                for pi in range(len(self.plans))
                for key, block, parent in zip(tr.keys, tr.block_ids[pi],
                                              [tr.parent, *tr.keys[:-1]], strict=True)
                if block >= 0  # a window group's block vLLM no longer holds: skipped
                and (not self.plans[pi].mla or _owner(key, self.tp_size) == self.tp_rank)]
        if not mine:
            return
        client = self.link.get()
        if client is None or self.pump is None:
            self._inc("broker_down", 1)
            return
        if self.cuda:
            # The step's kernels wrote these blocks asynchronously; the broker (or the
            # converting copy) reads them, so they must have landed.
            torch.cuda.current_stream().synchronize()
        t0 = time.perf_counter()
        bs = self.block_size
        # Ring saves wait here for their snapshot, taken for all of them at once (a few
        # large copies per (component, layer), not one small copy per page and part).
        pending: list[tuple[int, bytes, int, bytes | None, str, int]] = []

        def flush() -> None:
            if pending and self.pump is not None:
                self._snapshot_many(pending)
                for pi, key, _block, parent, req_id, slot in pending:
                    ud = next(self.save_ud)
                    self.save_ops[ud] = (pi, req_id, slot)
                    self.req_pending[req_id] = self.req_pending.get(req_id, 0) + 1
                    self.pump.add([kvb.Op(kvb.OP_PUT, 0, self.link.ns[pi].id, self.ring.id,
                                          key, slot * self.ring_page, 0, 0, ud, parent)])
                self._pump_step(False)
            elif pending:
                self._inc("store_errors", len(pending))
            pending.clear()

        for pi, key, block, parent, req_id in mine:
            if self.pump is None:
                self._inc("store_errors", 1)
                continue
            view = self.views[pi] if self.views else None
            if view is not None:
                ud = next(self.save_ud)
                self.save_ops[ud] = (pi, req_id, -1)
                self.view_saves_pending = True
                self.req_pending[req_id] = self.req_pending.get(req_id, 0) + 1
                self.pump.add([kvb.Op(kvb.OP_PUT, kvb.OPF_VIEW, 0, view.id, key, block * bs,
                                      0, 0, ud, parent)])
                continue
            if not self.ring_free:
                flush()  # its PUTs free the slots the rest waits for
            slot = self._ring_slot()
            if slot < 0 or self.pump is None:
                self._inc("store_errors", 1)
                continue
            pending.append((pi, key, block, parent, req_id, slot))
        flush()
        self._pump_step(False)  # submit; completions come later
        self._inc("store_s", time.perf_counter() - t0)

    def _snapshot_many(self, items: list[tuple[int, bytes, int, bytes | None, str, int]]
                       ) -> None:
        """The blocks' pages in canonical bytes into their ring slots (converting copies):
        per plan and (component, layer), one gather of every block and one scatter into
        the slots' rows.
        """
        for pi in {it[0] for it in items}:
            mine = [it for it in items if it[0] == pi]
            self._ring_copy(pi, [it[2] for it in mine], [it[5] for it in mine], save=True)

    def _ring_copy(self, pi: int, blocks: list[int], slots: list[int], save: bool) -> None:
        """Converting copies of plan pi between vLLM's blocks and ring slots (canonical
        pages), block i <-> slot i: per (component, layer) one gather (index_select, in
        whole elements) and one scatter (index_copy_), not one small copy per page.
        save: blocks -> slots, else slots -> blocks (distinct blocks, as vLLM's are).
        """
        rows = self._ring_tensor()[: self.ring_pages * self.ring_page].view(
            self.ring_pages, self.ring_page)
        n = len(blocks)
        slot_t = torch.tensor(slots, dtype=torch.int64)
        off = 0
        for cv, wv in zip(self.cviews[pi], self.wviews[pi], strict=True):
            size = cv[0].numel()
            ring = rows[:, off:off + size]
            # A part at an offset of the page its elements do not divide: bytes.
            v = cv if off % wv.element_size() or self.ring_page % wv.element_size() else wv
            block_t = torch.tensor(blocks, dtype=torch.int64, device=v.device)
            if v.element_size() > 1:
                ring = ring.view(v.dtype)
            if save:
                src = v.index_select(0, block_t).reshape(n, -1)
                ring.index_copy_(0, slot_t, src.cpu() if src.is_cuda else src)
            else:
                src = ring.index_select(0, slot_t).view(n, *v.shape[1:])
                v.index_copy_(0, block_t, src.to(v.device) if v.is_cuda else src)
            off += size

    def _ring_tensor(self) -> torch.Tensor:
        if self.ring_t is None:
            self.ring_t = torch.frombuffer(self.ring, dtype=torch.uint8)
        return self.ring_t

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
        for f in self.fences:
            with contextlib.suppress(Exception):
                f.pump.client.close()
            if f.pidfd >= 0:
                os.close(f.pidfd)
        self.fences.clear()
        if self.pidfd >= 0:
            os.close(self.pidfd)
            self.pidfd = -1
        self.link.close()
        for r in self.regions:
            if r.memfd >= 0:
                os.close(r.memfd)
                r.memfd = -1


