# SPDX-License-Identifier: MIT
"""The scheduler role of the vLLM connector: lookups, the step's load and store plans.

One batched LOOKUP per request gives the number of leading blocks the broker holds
(get_num_new_matched_tokens), started early at admission on a helper thread; loads run in the
worker during the step (layer group by layer group, so the model computes while later groups
land). Prompt blocks are stored in the step that computes them; at request_finished the
remaining full, computed blocks (the generated ones) are stored before vLLM frees them.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import kvbroker as kvb
from kvbroker.vllm.common import KVBrokerMetadata, KVBrokerStats, _Link, _Transfer
from kvbroker.vllm.layouts import _salt_parent, namespace_layouts

if TYPE_CHECKING:
    from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.request import Request

    from kvbroker.vllm.connector import KVBrokerConnector

logger = logging.getLogger("kvbroker.vllm")


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
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        # The scheduler only looks up: MHA namespaces are per TP rank, rank 0's stands
        # for all (every rank stores every page of its shard).
        plans0 = namespace_layouts(conn._vllm_config, conn._kv_cache_config, 0, conn.tp_size)
        self._link = _Link(conn.socket, "vllm-scheduler", plans0, conn.reconnect_s)
        self._link.get()
        if conn.extra.get("early_lookup", True):
            self._pool = concurrent.futures.ThreadPoolExecutor(
                1, thread_name_prefix="kvb-lookup")

    @property
    def _kv_cache_manager(self) -> Any:
        return self.conn._kv_cache_manager

    def close(self) -> None:
        if self._pool is not None:
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

    def _lookup(self, keys: list[bytes]) -> int:
        with self._link.lock:  # the early-lookup thread shares the link
            # Two tries: a broker that restarted since the last call shows up as a dead
            # connection first; the second try reconnects at once.
            for _ in range(2):
                client = self._link.get()
                if client is None:
                    break
                try:
                    hits = len(keys)
                    for ns in self._link.ns:
                        hits = min(hits, ns.lookup(keys[:hits]))
                        if not hits:
                            break
                    return hits
                except (kvb.Error, OSError) as e:
                    self._link.fail(e, retry_now=True)
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
            hits = self._lookup(keys)
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
        """Plans the load of the matched blocks into the blocks vLLM just allocated."""
        st = self._state(request)
        if num_external_tokens <= 0:
            return
        bs = self.block_size
        first = st.local_tokens // bs
        last = (st.local_tokens + num_external_tokens) // bs
        ids = blocks.get_block_ids()
        st.touched = True
        self._loads.append(_Transfer(
            request.request_id, self._keys(st, last)[first:last],
            [list(ids[p.group_id][first:last]) for p in self.plans],
            async_load=self.async_load))
        if self.async_load:
            self._aloading.add(request.request_id)

    def update_connector_output(self, finished_recving: set[str] | None) -> None:
        """Asynchronous loads the workers reported done."""
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
        ids = [list(block_ids[p.group_id][first:nblocks]) for p in self.plans]
        if any(b == 0 for g in ids for b in g):  # vLLM's null block: nothing there
            return None
        st.stored_blocks = nblocks
        st.touched = True
        parent = st.keys[first - 1] if first else None  # computed by _keys() above
        self._event_stored(st, first, nblocks, keys, parent)
        return _Transfer(st.request.request_id, keys, ids, parent)

    def _event_stored(self, st: _ReqState, first: int, nblocks: int, keys: list[bytes],
                      parent: bytes | None) -> None:
        """A KV event (take_events) for blocks handed to the workers to store: hashes are
        kvbroker's page keys (what any engine sharing the namespace looks up), medium
        "kvbroker".
        """
        try:
            from vllm.distributed.kv_events import BlockStored
        except ImportError:  # events are optional
            return
        bs = self.block_size
        toks = list(st.request.all_token_ids[first * bs: nblocks * bs])
        self._events.append(BlockStored(
            block_hashes=list(keys), parent_block_hash=parent, token_ids=toks, block_size=bs,
            lora_id=None, medium="kvbroker", lora_name=None))

    def take_events(self) -> list[Any]:
        """KV events since the last call (the scheduler calls this every step)."""
        ev, self._events = self._events, []
        return ev

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads, stores (prompt blocks computed by this step, finishing
        requests' blocks) and finishing requests, for the workers.
        """
        meta = KVBrokerMetadata(self._loads, self._saves, self._finishing)
        self._loads, self._saves, self._finishing = [], [], []
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
