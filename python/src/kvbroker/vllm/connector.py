# SPDX-License-Identifier: MIT
"""KVBrokerConnector: vLLM's KV connector class, one object per role; the scheduler role's
work is in scheduler.py, the worker role's in worker.py.
"""

from __future__ import annotations

import logging
import os
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    KVConnectorTransferResults,
    SupportsHMA,
)
from vllm.distributed.kv_transfer.kv_connector.v1.metrics import KVConnectorStats

from kvbroker.vllm.common import KVBrokerMetadata, KVBrokerPromMetrics, KVBrokerStats
from kvbroker.vllm.layouts import namespace_layouts, skip_reason
from kvbroker.vllm.scheduler import _Scheduler
from kvbroker.vllm.worker import _Worker

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.attention.backend import AttentionMetadata
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

logger = logging.getLogger("kvbroker.vllm")


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
        self.skipped = {g: skip_reason(kv_cache_config.kv_cache_groups[g].kv_cache_spec)
                        for g in kv_cache_config.prefix_cacheable_group_ids
                        if g not in {p.group_id for p in self.plans}}
        if self.skipped:
            # A hit must give vLLM every group's state at the hit's end: a Mamba/state
            # group's is one running state, not a page per block, so no request can get a
            # hit and storing would only fill the broker. vLLM computes as without kvbroker.
            self.load_enabled = self.save_enabled = False
            if role != KVConnectorRole.WORKER:  # one line per engine
                logger.warning(
                    "kvbroker: KV cache groups with no per-block page (%s): this model is "
                    "served without kvbroker (no loads, no stores)",
                    "; ".join(f"group {g}: {why}" for g, why in self.skipped.items()))
        elif any(p.window or p.chunk for p in self.plans) and role != KVConnectorRole.WORKER:
            logger.info("kvbroker: hybrid model: full-attention groups %s stored and loaded "
                        "whole, window groups %s the blocks vLLM keeps",
                        [p.group_id for p in self.plans if not (p.window or p.chunk)],
                        [p.group_id for p in self.plans if p.window or p.chunk])
        # vLLM maps block-level load errors back to requests only with one KV cache group;
        # with several, failed loads are reported per request (failed_recving), which it
        # takes for asynchronous loads only: those models always load asynchronously.
        self.multi_group = len(kv_cache_config.kv_cache_groups) > 1
        self.save_prompt = bool(self.extra.get("save_prompt", True))
        self._worker: _Worker | None = None
        self._sched: _Scheduler | None = None
        if role == KVConnectorRole.WORKER:
            self._worker = _Worker(self)
            self._link = self._worker.link
        else:
            self._sched = _Scheduler(self)
            self._link = self._sched._link

    @property
    def _reqs(self) -> dict[str, Any]:
        """The scheduler's per-request states (tools/bench_vllm.py reads them)."""
        assert self._sched is not None
        return self._sched._reqs

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

    def on_new_request(self, request: Request) -> None:
        """Starts the request's LOOKUP at admission (scheduler.py)."""
        if self._sched is not None:
            self._sched.on_new_request(request)

    def get_num_new_matched_tokens(self, request: Request,
                                   num_computed_tokens: int) -> tuple[int | None, bool]:
        """Tokens past num_computed_tokens the broker holds (whole blocks)."""
        assert self._sched is not None
        return self._sched.get_num_new_matched_tokens(request, num_computed_tokens)

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks,
                                 num_external_tokens: int) -> None:
        """Plans the load of the matched blocks into the blocks vLLM just allocated."""
        assert self._sched is not None
        self._sched.update_state_after_alloc(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KVConnectorMetadata:
        """The step's loads, stores and finishing requests, for the workers."""
        assert self._sched is not None
        return self._sched.build_connector_meta(scheduler_output)

    def update_connector_output(self, connector_output: Any) -> None:
        """Notes the loads the workers finished (finished_recving) or failed."""
        if self._sched is not None:
            self._sched.update_connector_output(
                connector_output.finished_recving,
                getattr(connector_output, "failed_recving", None),
                getattr(connector_output, "invalid_block_ids", None))

    def request_finished(self, request: Request,
                         block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        """request_finished_all_groups for the single-group (non-HMA) path."""
        return self.request_finished_all_groups(request, (block_ids,))

    def request_finished_all_groups(self, request: Request, block_ids: tuple[list[int], ...],
                                    ) -> tuple[bool, dict[str, Any] | None]:
        """Stores the request's computed full blocks not stored yet; True keeps vLLM's
        blocks until every worker reported the stores done (get_finished).
        """
        assert self._sched is not None
        return self._sched.request_finished_all_groups(request, block_ids)

    def take_events(self) -> list[Any]:
        """KV events (medium "kvbroker"): BlockStored for blocks handed to kvbroker to
        store, BlockRemoved for announced ones found gone.
        """
        return self._sched.take_events() if self._sched is not None else []

    def get_kv_connector_stats(self) -> KVBrokerStats | None:
        """The interval's counters (None when there were none); resets them."""
        src = self._worker.stats if self._worker is not None else self._sched_stats()
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

    def handle_preemptions(self, kv_connector_metadata: KVConnectorMetadata) -> None:
        """Called first in every step, before the runner touches any block: it may zero the
        blocks it hands out or copy into them (copy-on-write), and a block freed by a
        preemption or behind a sliding window may be one of them. View PUTs of earlier steps
        still read vLLM's blocks: they finish now, so a block is never stored after another
        request's data (or zeros) went into it. Nor may ops of a connection given up on (a
        fence) still touch the blocks of a request preempted now.
        """
        if self._worker is not None:
            self._worker.settle_view_saves()
            if isinstance(kv_connector_metadata, KVBrokerMetadata):
                self._worker.settle_preempted(set(kv_connector_metadata.preempted))

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        """Submits this step's loads, layer group by layer group."""
        if self._worker is None:
            return
        # Before this step's forward writes any block (handle_preemptions did, where the
        # model runner calls it): the previous step's view PUTs must be done.
        self._worker.settle_view_saves()
        if not self.has_connector_metadata():
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
        """Finishes the step's loads and submits its stores (completed in the background)."""
        if self._worker is None or not self.has_connector_metadata():
            return
        meta = self._get_connector_metadata()
        assert isinstance(meta, KVBrokerMetadata)
        self._worker.finish_loads()
        self._worker.save(meta)

    def get_finished(self, finished_req_ids: set[str]
                     ) -> tuple[set[str] | None, set[str] | None]:
        """Finishing requests whose stores this worker has done, and requests whose
        asynchronous loads landed (or failed: their blocks are load errors).
        """
        if self._worker is None:
            return None, None
        w = self._worker
        w.poll()
        done, w.finished_sending = w.finished_sending, set()
        recv, w.finished_recving = w.finished_recving, set()
        return done or None, recv or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> KVConnectorTransferResults:
        """get_finished's sets, and (several KV cache groups) the requests among those
        finished receiving whose asynchronous load failed: vLLM recomputes them.
        """
        done, recv = self.get_finished(finished_req_ids)
        failed: set[str] = set()
        if self._worker is not None:
            w = self._worker
            if self.multi_group:
                failed = w.failed_recving & set(recv or ())
                w.failed_recving -= failed
            else:  # one group: the failed blocks themselves (get_block_ids_with_load_errors)
                w.failed_recving.clear()
        return KVConnectorTransferResults(finished_sending=set(done or ()),
                                          finished_recving=set(recv or ()),
                                          failed_recving=failed)

    def get_block_ids_with_load_errors(self) -> set[int]:
        """Blocks whose load missed or failed this step: vLLM recomputes them. None with
        several KV cache groups (block ids are per group; get_transfer_results reports
        those requests instead).
        """
        if self._worker is None:
            return set()
        self._worker.finish_loads()
        errors = self._worker.take_errors()
        return set() if self.multi_group else errors

    def shutdown(self) -> None:
        """Closes the broker connection (and the KV memfds' descriptors)."""
        if self._worker is not None:
            self._worker.close()
        elif self._sched is not None:
            self._sched.close()

    def _sched_stats(self) -> KVBrokerStats:
        assert self._sched is not None
        return self._sched._stats

