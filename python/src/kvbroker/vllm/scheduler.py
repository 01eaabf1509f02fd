# SPDX-License-Identifier: MIT
"""The scheduler role of the vLLM connector: lookups, the step's load and store plans.

One batched LOOKUP per request gives the number of leading blocks the broker holds
(get_num_new_matched_tokens), started early at admission on a helper thread; loads run in the
worker during the step (layer group by layer group, so the model computes while later groups
land). Prompt blocks are stored in the step that computes them; at request_finished the
remaining full, computed blocks (the generated ones) are stored before vLLM frees them.

Hybrid models (several KV cache groups): every group's pages go to the group's own
namespace. A hit of n blocks needs every full-attention group's pages 0..n-1 and each
window group's pages from _GroupPlan.first_kept(n) on (vLLM's null block stands for the
ones before); a load writes exactly the blocks vLLM allocated, a store skips the null ones.

KV events: BlockStored for blocks handed to the workers to store, BlockRemoved for those
found gone (a lookup that misses one, or a bounded re-check on the lookup thread: the
broker evicts on its own and tells nobody).
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import kvbroker as kvb
from kvbroker.vllm.common import KVBrokerMetadata, KVBrokerStats, _Link, _Transfer
from kvbroker.vllm.layouts import _GroupPlan, _salt_parent, namespace_layouts

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from kvbroker.vllm.connector import KVBrokerConnector

logger = logging.getLogger("kvbroker.vllm")

# vLLM's null block (BlockPool takes block 0 for it): a window group's place-holder for
# blocks outside its window. _NO_BLOCK marks them in a _Transfer: the workers skip them.
_NULL_BLOCK_ID = 0
_NO_BLOCK = -1


def _spec_kind(p: _GroupPlan) -> str:
    """KVCacheSpecKind's value of a stored group, for KV events."""
    if p.window:
        return "sliding_window"
    if p.chunk:
        return "chunked_local_attention"
    return "mla_attention" if p.mla else "full_attention"


@dataclass
class _ReqState:
    request: Request
    parent: bytes | None
    keys: list[bytes] = field(default_factory=list)
    local_tokens: int = 0  # the local prefix hit get_num_new_matched_tokens saw
    hit_blocks: int = 0  # leading blocks the broker had at the last lookup
    stored_blocks: int = 0  # leading blocks stored or known stored
    skip: bool = False
    counted: bool = False  # its local prefix hit is in the stats
    # A load or store of its blocks was planned: the workers may hold its blocks after it
    # finishes (request_finished_all_groups).
    touched: bool = False
    early: concurrent.futures.Future[tuple[int, int, float]] | None = None
    # Its load from kvbroker failed: vLLM recomputes it and, after a failed asynchronous
    # load, asks again; a second answer from the same broker state would fail the same way.
    load_failed: bool = False



class _Scheduler:
    """The scheduler role's state: per-request keys and lookups, the next step's plans."""

    def __init__(self, conn: KVBrokerConnector) -> None:
        self.conn = conn
        self.plans = conn.plans
        self.block_size = conn.block_size
        self.load_enabled = conn.load_enabled
        self.save_enabled = conn.save_enabled
        self.save_prompt = conn.save_prompt
        # Loads inside the step that needs them, layer group by layer group while the model
        # computes the first layers (the default: the lowest time to first token for a lone
        # request), or outside it ("async_load": true: (n, True), the request waits in
        # WAITING_FOR_REMOTE_KVS and the steps of other requests never wait for a load).
        self.async_load = bool(conn.extra.get("async_load", False))
        self.lookup_wait_s = float(conn.extra.get("lookup_wait_ms", 2.0)) / 1e3
        self.lookup_max_age_s = float(conn.extra.get("lookup_max_age_ms", 500.0)) / 1e3
        self._reqs: dict[str, _ReqState] = {}
        self._loads: list[_Transfer] = []
        self._saves: list[_Transfer] = []
        self._finishing: list[str] = []
        self._stats = KVBrokerStats()
        self._events: list[Any] = []
        self._aloading: set[str] = set()  # requests with asynchronous loads in flight
        self._loading: dict[str, set[int]] = {}  # request -> blocks of its last load
        # The scheduler only looks up: MHA namespaces are per TP rank, rank 0's stands
        # for all (every rank stores every page of its shard).
        plans0 = namespace_layouts(conn._vllm_config, conn._kv_cache_config, 0, conn.tp_size)
        self._link = _Link(conn.socket, "vllm-scheduler", plans0, conn.reconnect_s)
        self._link.get()

        # A hit of n blocks must end on this many blocks (the hybrid allocator's hit
        # alignment: the least common multiple of the groups' block sizes).
        align = int(getattr(conn._kv_cache_config, "cache_hit_alignment_tokens", 0) or 0)
        self.align_blocks = max(1, align // self.block_size)
        self.multi_group = bool(getattr(conn, "multi_group", False))
        if self.multi_group:
            # vLLM reports per-request load failures only for asynchronous loads
            # (failed_recving) when there are several KV cache groups.
            self.async_load = True
        # KV events: every (plan index, key) announced in a BlockStored and not yet found
        # gone, least recently checked first, at most events_tracked of them (the oldest
        # are forgotten: their removal is never announced, memory stays bounded).
        # Re-checked events_recheck_n at a time, at most every events_recheck_s, on the
        # lookup thread.
        # The value: when it was announced. A page announced less than events_grace_s ago
        # may still be on its way to the broker (its PUT in flight): not yet taken as gone.
        self._announced: OrderedDict[tuple[int, bytes], float] = OrderedDict()
        self._grace_s = float(conn.extra.get("events_grace_s", 2.0))
        self._announced_max = int(conn.extra.get("events_tracked", 65536))
        self._recheck_s = float(conn.extra.get("events_recheck_s", 1.0))
        self._recheck_n = int(conn.extra.get("events_recheck_n", 256))
        self._recheck_at = time.monotonic() + self._recheck_s
        self._recheck_fut: concurrent.futures.Future[None] | None = None
        self._ev_lock = threading.Lock()  # _events and _announced (the lookup thread)
        self._early = bool(conn.extra.get("early_lookup", True))
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kvb-lookup")

    @property
    def _kv_cache_manager(self) -> Any:
        return self.conn._kv_cache_manager

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)
        self._link.close()

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

    def _lookup(self, keys: list[bytes], local_blocks: int = 0) -> int:
        """The longest hit in blocks (at most len(keys)) the broker can serve with the first
        local_blocks blocks in vLLM already: every full-attention group's pages up to it,
        each window group's from first_kept() on.
        """
        with self._link.lock:  # the lookup thread shares the link
            # Two tries: a broker that restarted since the last call shows up as a dead
            # connection first; the second try reconnects at once.
            for _ in range(2):
                client = self._link.get()
                if client is None:
                    break
                try:
                    return self._hits(keys, local_blocks)
                except (kvb.Error, OSError) as e:
                    self._link.fail(e, retry_now=True)
            self._stats.data["broker_down"] += 1
            return 0

    def _hits(self, keys: list[bytes], local_blocks: int) -> int:
        hits = len(keys)
        for pi, p in enumerate(self.plans):
            if not (p.window or p.chunk) and hits:
                got = self._link.ns[pi].lookup(keys[:hits])
                if got < hits:
                    self._gone(pi, keys[got])
                hits = got
        hits -= hits % self.align_blocks
        windows = [(pi, p) for pi, p in enumerate(self.plans) if p.window or p.chunk]
        # vLLM's SlidingWindowManager.find_longest_cache_hit, against the broker: from the
        # longest candidate down, a page missing at block m rules out every hit that needs
        # it, so the next candidate ends at m. Each round is one LOOKUP per window group and
        # lowers the candidate; the bound keeps a pathological pattern from costing more.
        for _ in range(32 if windows else 0):
            n = hits
            for pi, p in windows:
                first = max(p.first_kept(n * self.block_size), local_blocks)
                if first < n:
                    got = self._link.ns[pi].lookup(keys[first:n])
                    if got < n - first:
                        self._gone(pi, keys[first + got])
                        n = first + got
            n -= n % self.align_blocks
            if n == hits or n <= local_blocks:
                return n
            hits = n
        return 0 if windows else hits

    def on_new_request(self, request: Request) -> None:
        """Computes the request's keys and starts its LOOKUP when vLLM admits it
        (Scheduler.add_request), on a helper thread: by the time the scheduler asks
        get_num_new_matched_tokens the answer is usually there, so the scheduler's loop
        pays neither the hashing nor the broker's round trip.
        """
        if not self.load_enabled or not self._early:
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
        if st.skip or not self.load_enabled or st.load_failed:
            return 0, False
        if not st.counted:
            # Where the request's prefix came from: vLLM's own prefix cache (local), kvbroker
            # (hit_tokens, below), or neither (computed).
            st.counted = True
            self._stats.data["local_hit_tokens"] += num_computed_tokens
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
            hits = self._lookup(keys, num_computed_tokens // bs)
        st.hit_blocks = hits
        st.stored_blocks = max(st.stored_blocks, hits)
        self._stats.data["lookups"] += 1
        self._stats.data["lookup_tokens"] += nfull * bs - num_computed_tokens
        ext = hits * bs - num_computed_tokens
        if ext <= 0:
            return 0, False
        self._stats.data["hit_tokens"] += ext
        return ext, self.async_load

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        """Plans the load of the matched blocks into the blocks vLLM just allocated (a
        window group's blocks vLLM left null, before its window, are not loaded).
        """
        st = self._state(request)
        if num_external_tokens <= 0:
            return
        bs = self.block_size
        first = st.local_tokens // bs
        last = (st.local_tokens + num_external_tokens) // bs
        st.touched = True
        self._loads.append(_Transfer(
            request.request_id, self._keys(st, last)[first:last],
            [[_NO_BLOCK if b.is_null else b.block_id
              for b in blocks.blocks[p.group_id][first:last]] for p in self.plans],
            async_load=self.async_load))
        self._loading[request.request_id] = {b for g in self._loads[-1].block_ids for b in g
                                             if b >= 0}
        if self.async_load:
            self._aloading.add(request.request_id)

    def update_connector_output(self, finished_recving: set[str] | None,
                                failed_recving: set[str] | None = None,
                                invalid_block_ids: set[int] | None = None) -> None:
        """Loads the workers reported done, and which of them failed (a request's failed
        load is not offered again: vLLM recomputes it).
        """
        for req_id, blocks in list(self._loading.items()):
            if req_id in (failed_recving or ()) or blocks & (invalid_block_ids or set()):
                st = self._reqs.get(req_id)
                if st is not None:
                    st.load_failed = True
            if req_id not in self._aloading or req_id in (finished_recving or ()):
                del self._loading[req_id]  # (in-step loads: reported in their step)
        for req_id in finished_recving or ():
            self._aloading.discard(req_id)

    def _block_ids(self, req_id: str) -> tuple[list[int], ...] | None:
        mgr = self._kv_cache_manager
        if mgr is None:
            return None
        try:
            return tuple(mgr.get_block_ids(req_id))
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
        ids = [[_NO_BLOCK if b == _NULL_BLOCK_ID else b
                for b in block_ids[p.group_id][first:nblocks]] for p in self.plans]
        if any(b == _NO_BLOCK for p, g in zip(self.plans, ids, strict=True)
               if not (p.window or p.chunk) for b in g):
            return None  # a full-attention block vLLM does not hold: nothing to store
        # A window group's blocks vLLM already freed behind its window (null) are skipped:
        # their pages are missing, which costs only hits that would need them.
        st.stored_blocks = nblocks
        st.touched = True
        parent = st.keys[first - 1] if first else None  # computed by _keys() above
        self._event_stored(st, first, keys, parent, ids)
        return _Transfer(st.request.request_id, keys, ids, parent)

    def _event_stored(self, st: _ReqState, first: int, keys: list[bytes],
                      parent: bytes | None, ids: list[list[int]]) -> None:
        """KV events (take_events) for blocks handed to the workers to store: hashes are
        kvbroker's page keys (what any engine sharing the namespace looks up), medium
        "kvbroker"; with several KV cache groups one event per group (group_idx, its kind).
        """
        try:
            from vllm.distributed.kv_events import BlockStored
        except ImportError:  # events are optional
            return
        bs = self.block_size
        toks = list(st.request.all_token_ids[first * bs: (first + len(keys)) * bs])
        now = time.monotonic()
        with self._ev_lock:
            for pi, p in enumerate(self.plans):
                mine = [i for i, b in enumerate(ids[pi]) if b != _NO_BLOCK]
                if not mine:
                    continue
                hashes: list[bytes | int] = []
                for i in mine:
                    self._announced[(pi, keys[i])] = now
                    self._announced.move_to_end((pi, keys[i]))
                    hashes.append(keys[i])
                multi = self.multi_group
                contiguous = mine == list(range(mine[0], len(keys)))
                self._events.append(BlockStored(
                    block_hashes=hashes,
                    parent_block_hash=(keys[mine[0] - 1] if mine[0] else parent)
                    if contiguous else None,
                    token_ids=toks[mine[0] * bs:] if contiguous else
                    [t for i in mine for t in toks[i * bs:(i + 1) * bs]],
                    block_size=bs, lora_id=None, medium="kvbroker", lora_name=None,
                    group_idx=p.group_id if multi else None,
                    kv_cache_spec_kind=_spec_kind(p) if multi else None,
                    kv_cache_spec_sliding_window=(p.window or None) if multi else None))
            while len(self._announced) > self._announced_max:
                self._announced.popitem(last=False)

    def _gone(self, pi: int, key: bytes) -> None:
        """A page found missing: BlockRemoved if it was announced stored."""
        with self._ev_lock:
            t = self._announced.get((pi, key))
            if t is None or time.monotonic() - t < self._grace_s:
                return
            del self._announced[(pi, key)]
            try:
                from vllm.distributed.kv_events import BlockRemoved
            except ImportError:
                return
            self._events.append(BlockRemoved(
                block_hashes=[key], medium="kvbroker",
                group_idx=self.plans[pi].group_id if self.multi_group else None))

    def _maybe_recheck(self) -> None:
        """Starts a re-check of the announced pages least recently checked on the lookup
        thread, at most every events_recheck_s and only when the last one is done (never on
        the step's path), at most events_recheck_n of them and none announced in the last
        events_grace_s.
        """
        now = time.monotonic()
        if now < self._recheck_at or not self._announced or \
                (self._recheck_fut is not None and not self._recheck_fut.done()):
            return
        self._recheck_at = now + self._recheck_s
        with self._ev_lock:
            batch = []
            # Checked ones go to the end (round robin); the order is the last check's, so
            # the grace test reads the time each was announced, not its place.
            for item, t in list(itertools.islice(self._announced.items(), self._recheck_n)):
                if now - t < self._grace_s:
                    continue
                self._announced.move_to_end(item)
                batch.append(item)
        if not batch:
            return
        self._recheck_fut = self._pool.submit(self._recheck, batch)

    def _recheck(self, batch: list[tuple[int, bytes]]) -> None:
        """Which of batch the broker no longer holds (BlockRemoved for each): consecutive
        keys of one namespace in one LOOKUP while they are all there (announced keys come in
        chain order), one more per missing key.
        """
        runs: list[tuple[int, list[bytes]]] = []
        for pi, key in batch:
            if runs and runs[-1][0] == pi:
                runs[-1][1].append(key)
            else:
                runs.append((pi, [key]))
        with self._link.lock:
            if self._link.get() is None:
                return
            try:
                for pi, keys in runs:
                    i = 0
                    while i < len(keys):
                        i += self._link.ns[pi].lookup(keys[i:])
                        if i < len(keys):
                            self._gone(pi, keys[i])
                            i += 1
            except (kvb.Error, OSError) as e:
                self._link.fail(e)

    def take_events(self) -> list[Any]:
        """KV events since the last call (the scheduler calls this every step)."""
        with self._ev_lock:
            ev, self._events = self._events, []
        return ev

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads, stores (prompt blocks computed by this step, finishing
        requests' blocks) and finishing requests, for the workers.
        """
        meta = KVBrokerMetadata(self._loads, self._saves, self._finishing,
                                sorted(getattr(scheduler_output, "preempted_req_ids", None)
                                       or ()))
        self._loads, self._saves, self._finishing = [], [], []
        self._maybe_recheck()
        if self.save_enabled and self.save_prompt and self._link.get() is not None:
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

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...],
                                    ) -> tuple[bool, dict[str, Any] | None]:
        """Stores the request's computed full blocks not stored yet; True keeps vLLM's
        blocks until every worker reported the stores done (get_finished).
        """
        st = self._reqs.pop(request.request_id, None)
        self._loading.pop(request.request_id, None)
        if request.request_id in self._aloading:
            # Aborted while its pages are still landing in its blocks: vLLM itself keeps
            # the blocks of a request in WAITING_FOR_REMOTE_KVS until finished_recving.
            return False, None
        tr = None
        if st is not None and not st.skip and self.save_enabled and \
                self._link.get() is not None:
            st.request = request
            computed = min(request.num_computed_tokens, request.num_tokens)
            tr = self._save_upto(st, computed // self.block_size, block_ids)
        if tr is not None:
            self._saves.append(tr)
        elif st is None or not st.touched:
            return False, None
        # vLLM keeps the blocks until every worker reports them done (get_finished): their
        # stores, and the ops a worker gave up on after a timeout, which a broker that was
        # only slow may still run against these blocks (worker.py, _Fence). The blocks of a
        # request the broker never touched go back at once.
        self._finishing.append(request.request_id)
        return True, None
