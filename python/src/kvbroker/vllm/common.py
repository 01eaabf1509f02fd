# SPDX-License-Identifier: MIT
"""What both roles of the vLLM connector share: the step's metadata (scheduler -> workers),
the statistics handed to vLLM, and the broker connection (connect lazily, fail fast, retry
later).
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any, ClassVar

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorMetadata
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import (
    KVConnectorPromMetrics,
    KVConnectorStats,
)

import kvbroker as kvb
from kvbroker.vllm.layouts import _GroupPlan

logger = logging.getLogger("kvbroker.vllm")

@dataclass
class _Transfer:
    req_id: str
    keys: list[bytes]
    block_ids: list[list[int]]  # [group index in plans][page index]
    # The key of the page before keys[0] in the request's chain (None: keys[0] is its head):
    # a store names each page's parent, so the broker evicts the chain tail first.
    parent: bytes | None = None
    # A load vLLM waits for outside the step ((n, True) from get_num_new_matched_tokens):
    # the request runs once get_finished reported it in finished_recving.
    async_load: bool = False


@dataclass
class KVBrokerMetadata(KVConnectorMetadata):
    """What the workers move in one step: pages to load, pages to store, requests whose
    blocks vLLM keeps until their finishing stores are done, and requests preempted in this
    step (their blocks go to others before the forward).
    """

    loads: list[_Transfer] = field(default_factory=list)
    saves: list[_Transfer] = field(default_factory=list)
    finish_req_ids: list[str] = field(default_factory=list)
    preempted: list[str] = field(default_factory=list)


_STAT_KEYS = ("lookups", "lookup_tokens", "hit_tokens", "local_hit_tokens", "loaded_pages",
              "load_errors",
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
        "local_hit_tokens": "Prompt tokens vLLM's own prefix cache held (not asked of kvbroker)",
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
        """Adds an interval's counters to the engine's Prometheus counters."""
        for k, children in self._children.items():
            v = transfer_stats_data.get(k, 0)
            if v and engine_idx in children:
                children[engine_idx].inc(v)




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
        self._told = False  # the current outage has been logged

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
            self._told = False
        except (kvb.Error, OSError) as e:
            self._drop()
            # Once per outage: the retries every reconnect_s would flood the log.
            if not self._told:
                logger.warning("kvbroker: broker unavailable (%s); serving without it, "
                               "retrying every %.1f s", e, self.reconnect_s)
                self._told = True
            else:
                logger.debug("kvbroker: broker still unavailable (%s)", e)
            return None
        return self.client

    def fail(self, err: BaseException, retry_now: bool = False, keep: bool = False) -> None:
        """The broker went away mid-operation: drop the client, retry after reconnect_s
        (retry_now: the next get() may try at once, e.g. a broker that restarted). keep:
        the caller took the client over (a fence waiting for its ops) and closes it.
        """
        logger.warning("kvbroker: broker connection lost (%s); recomputing until it is back",
                       err)
        self.down_events += 1
        self._told = True  # this warning is the outage's one line
        if keep:
            self.client, self.ns = None, []
        else:
            self._drop()
        self._next_try = 0.0 if retry_now else time.monotonic() + self.reconnect_s

    def _drop(self) -> None:
        c, self.client, self.ns = self.client, None, []
        if c is not None:
            with contextlib.suppress(Exception):  # a dead broker may fail the close too
                c.close()

    def close(self) -> None:
        self._drop()


