# SPDX-License-Identifier: MIT
"""kvbroker.vllm in the scheduler role, inside vLLM 0.33.0's real Scheduler.

The real KVConnectorFactory loads the connector from kv_connector_module_path; pages are put
into a real kvbrokerd under the keys SGLang would use (kvb.page_keys of the token ids), then the
Scheduler must admit requests with exactly the broker's leading hits as computed tokens.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local config.json; nothing downloads
pytest.importorskip("vllm")

from vllm.config import VllmConfig
from vllm.distributed.kv_transfer.kv_connector.factory import KVConnectorFactory
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorRole,
    SupportsHMA,
    supports_hma,
)
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.kv_cache_interface import KVCacheConfig
from vllm.v1.request import Request

import kvbroker as kvb
import vllm_support as vs
from conftest import Broker
from kvbroker.vllm import KVBrokerConnector, namespace_layouts

BS = 16


def _fill(socket: str, vc: VllmConfig, kcc: KVCacheConfig, tokens: list[int],
          nblocks: int) -> list[bytes]:
    """Stores the first nblocks pages of tokens, as another engine would have."""
    plan = namespace_layouts(vc, kcc)[0]
    keys = kvb.page_keys(tokens, BS)[:nblocks]
    with kvb.connect(socket) as c:
        ns = c.ns_open(plan.layout)
        page = bytes(ns.page_bytes)
        for k in keys:
            ns.put(k, page)
    return keys


def _admitted(sched: Scheduler, req: Request) -> int:
    """num_computed_tokens the Scheduler admits the request with (local + external)."""
    sched.add_request(req)
    out = sched.schedule()
    new = [r for r in out.scheduled_new_reqs if r.req_id == req.request_id]
    assert new, "request not scheduled"
    return int(new[0].num_computed_tokens)


def test_factory_loads_connector(tmp_path: Path, broker: Broker) -> None:
    vc = vs.make_config(tmp_path, broker.socket)
    kcc = vs.make_kv_cache_config(BS, 64, mla=True)
    ktc = vc.kv_transfer_config
    assert ktc is not None
    cls = KVConnectorFactory.get_connector_class(ktc)
    assert cls is KVBrokerConnector
    assert issubclass(cls, KVConnectorBase_V1) and issubclass(cls, SupportsHMA)
    assert supports_hma(cls) and KVConnectorFactory.supports_hma_config(ktc)
    # With the hybrid KV cache manager on (the default on GPUs; the CPU platform turns it
    # off), the factory refuses connectors that do not subclass SupportsHMA: not this one.
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc)
    assert isinstance(conn, KVBrokerConnector)
    assert ktc.kv_load_failure_policy == "recompute"
    plan = conn.plans[0]
    assert plan.layout.kind == kvb.MLA and plan.layout.tokens_per_page == BS
    assert plan.layout.components[0].bytes_per_token_layer == vs.MLA_DIM * 2
    assert plan.layout.model == "tiny-test"
    conn.shutdown()


@pytest.mark.parametrize("mla", [True, False])
def test_scheduler_matches_shared_prefixes(tmp_path: Path, broker: Broker, mla: bool) -> None:
    vc = vs.make_config(tmp_path, broker.socket, extra={"model": f"sched-{mla}"})
    kcc = vs.make_kv_cache_config(BS, 512, mla=mla)
    prefix = [1000 + i for i in range(BS * 12)]
    _fill(broker.socket, vc, kcc, prefix, 12)
    sched = vs.make_scheduler(vc, kcc)
    assert isinstance(sched.connector, KVBrokerConnector)
    # The whole stored prefix and a tail: 12 blocks come from the broker.
    assert _admitted(sched, vs.make_request("full", prefix + [5, 6, 7], BS)) == 12 * BS
    # Shares 7 blocks, then diverges: the chain keys differ from block 7 on.
    other = prefix[: 7 * BS + 3] + [9] * (5 * BS)
    assert _admitted(sched, vs.make_request("part", other, BS)) == 7 * BS
    # Unrelated tokens: nothing.
    assert _admitted(sched, vs.make_request("none", list(range(50, 50 + 6 * BS)), BS)) == 0
    # The same tokens under a cache salt are a different KV: nothing shared.
    assert _admitted(sched, vs.make_request("salted", prefix + [1], BS, cache_salt="s")) == 0
    # A prompt of exactly the stored blocks: one token is left to compute (its logits).
    got = _admitted(sched, vs.make_request("exact", prefix[: 4 * BS], BS))
    assert got == 3 * BS


def test_scheduler_without_broker(tmp_path: Path) -> None:
    vc = vs.make_config(tmp_path, str(tmp_path / "nobody.sock"))
    kcc = vs.make_kv_cache_config(BS, 128, mla=True)
    sched = vs.make_scheduler(vc, kcc)
    assert _admitted(sched, vs.make_request("a", list(range(BS * 4)), BS)) == 0
    assert sched.connector is not None
    st = sched.connector.get_kv_connector_stats()
    assert st is not None and st.data["broker_down"] >= 1


def _hybrid_kcc(spec: str = "swa") -> KVCacheConfig:
    """Full attention on layers 0 and 2, a window group on 1 and 3 (a Gemma-style hybrid):
    a sliding window of 2 blocks, a chunked-local chunk of 4 blocks, or a Mamba state."""
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheGroupSpec,
        MambaSpec,
        SlidingWindowSpec,
    )

    full = FullAttentionSpec(block_size=BS, num_kv_heads=vs.HEADS, head_size=vs.HEAD_DIM,
                             dtype=torch.bfloat16)
    other: Any
    if spec == "swa":
        other = SlidingWindowSpec(block_size=BS, num_kv_heads=vs.HEADS, head_size=vs.HEAD_DIM,
                                  dtype=torch.bfloat16, sliding_window=2 * BS)
    elif spec == "chunk":
        other = ChunkedLocalAttentionSpec(block_size=BS, num_kv_heads=vs.HEADS,
                                          head_size=vs.HEAD_DIM, dtype=torch.bfloat16,
                                          attention_chunk_size=4 * BS)
    else:
        other = MambaSpec(block_size=BS, shapes=((4, 8),), dtypes=(torch.bfloat16,))
    return KVCacheConfig(num_blocks=256, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in (0, 2)], full),
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in (1, 3)], other)])


def _matched(sched: Scheduler, req: Request) -> tuple[int | None, bool]:
    """What the connector answers the Scheduler for a new request with nothing in vLLM's
    prefix cache (hybrid models load asynchronously: such a request waits outside the step,
    it is not admitted with its tokens)."""
    conn = sched.connector
    assert isinstance(conn, KVBrokerConnector)
    return conn.get_num_new_matched_tokens(req, 0)


def _recorded(conn: KVBrokerConnector) -> list[Any]:
    """The KV events the Scheduler takes from the connector (it drains them every step)."""
    got: list[Any] = []
    take = conn.take_events

    def rec() -> list[Any]:
        ev = take()
        got.extend(ev)
        return ev

    conn.take_events = rec  # type: ignore[method-assign]
    return got


def test_scheduler_hybrid_full_and_sliding_window(tmp_path: Path, broker: Broker) -> None:
    """A hybrid model (full attention + a sliding window of 2 blocks) in vLLM's hybrid KV
    cache manager with the real Scheduler: engine 1 computes a 10-block prompt and stores
    every group's blocks, each group in its own namespace; a fresh engine gets the 10 blocks
    from kvbroker (all full-attention pages, only the 2 window pages vLLM keeps before the
    hit's end) and holds the right bytes in every block vLLM reads; a missing window page
    shortens the hit exactly as vLLM's own window rule does; a page deleted between lookup
    and load fails the request's load (failed_recving), vLLM recomputes it.
    """
    from vllm.distributed.kv_events import BlockStored

    def engine(name: str) -> vs.MiniEngine:
        (tmp_path / name).mkdir()
        return vs.MiniEngine(tmp_path / name, broker.socket, mla=False, kcc=_hybrid_kcc(),
                             extra={"model": "hybrid-swa"}, max_num_batched_tokens=4 * BS)

    e1 = engine("e1")
    plans = namespace_layouts(e1.vc, e1.kcc)
    assert [(p.group_id, p.window) for p in plans] == [(0, 0), (1, 2 * BS)]
    assert plans[0].layout.model == "hybrid-swa"
    assert plans[1].layout.model == f"hybrid-swa/g1w{2 * BS}"
    assert [p.first_kept(n * BS) for p in plans for n in (1, 2, 10)] == [0, 0, 0, 0, 0, 8]
    prompt = [3000 + i for i in range(BS * 10 + 3)]
    keys = kvb.page_keys(prompt, BS)[:10]
    conn = e1.sched.connector
    assert isinstance(conn, KVBrokerConnector) and conn.load_enabled and conn.save_enabled
    events = _recorded(conn)
    e1.run([vs.make_request("a", prompt, BS, max_tokens=2)])
    assert e1.computed_tokens >= len(prompt) and not e1.bad
    stored = {(e.group_idx, k) for e in events if isinstance(e, BlockStored)
              for k in e.block_hashes}
    # Every prompt block of both groups: computed 4 blocks a step, each stored in its step.
    assert stored == {(g, k) for g in (0, 1) for k in keys}
    with kvb.connect(broker.socket) as c:
        ns = [c.ns_open(p.layout) for p in plans]
        assert [n.lookup(keys) for n in ns] == [10, 10]
        full_page = ns[0].get(keys[0])
        assert full_page is not None and ns[1].get(keys[0]) != full_page  # never mixed
        for k in keys[:6]:  # window pages no hit of 10 blocks needs
            assert ns[1].delete(k)

    e2 = engine("e2")
    e2.run([vs.make_request("b", prompt, BS, max_tokens=2)])
    # Computed: the 3 tokens after the 10 loaded blocks and 1 decode; every block vLLM
    # reads (all full-attention blocks, window blocks 8 and 9) held the right bytes.
    assert e2.computed_tokens == 3 + 2 - 1 and not e2.bad, e2.bad
    with kvb.connect(broker.socket) as c:
        assert c.ns_open(plans[1].layout).delete(keys[9])
    # Window pages 6..8 remain: a hit of 9 blocks (window pages 7 and 8), no more.
    assert _matched(e2.sched, vs.make_request("c", prompt, BS)) == (9 * BS, True)
    # A page deleted after the lookup: the asynchronous load fails, vLLM recomputes (in
    # e2 again, its prefix cache emptied).
    assert e2.sched.reset_prefix_cache()
    e2.computed_tokens = 0

    def delete() -> None:
        with kvb.connect(broker.socket) as c:
            assert c.ns_open(plans[0].layout).delete(keys[4])

    e2.run([vs.make_request("d", prompt, BS, max_tokens=2)], kill_at=0, kill=delete)
    assert not e2.bad and e2.computed_tokens >= len(prompt)


def test_scheduler_hybrid_chunked_local(tmp_path: Path, broker: Broker) -> None:
    """Chunked-local attention (chunks of 4 blocks): a hit of n blocks needs the window
    group's pages of n's chunk only."""
    vc = vs.make_config(tmp_path, broker.socket, extra={"model": "hybrid-chunk"})
    kcc = _hybrid_kcc("chunk")
    plans = namespace_layouts(vc, kcc)
    assert [plans[1].first_kept(n * BS) for n in (3, 4, 9, 11)] == [0, 4, 8, 8]
    prompt = [5000 + i for i in range(BS * 11 + 2)]
    keys = kvb.page_keys(prompt, BS)[:11]
    with kvb.connect(broker.socket) as c:
        ns = [c.ns_open(p.layout) for p in plans]
        for k in keys:
            ns[0].put(k, bytes(ns[0].page_bytes))
        for k in keys[8:]:
            ns[1].put(k, bytes(ns[1].page_bytes))
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    sched = vs.make_scheduler(vc, kcc)
    assert _matched(sched, vs.make_request("c", prompt + [1], BS)) == (11 * BS, True)
    with kvb.connect(broker.socket) as c:
        assert c.ns_open(plans[1].layout).delete(keys[9])
    # Window page 9 gone: a hit of 10 or 11 blocks needs it; one of 9 blocks needs only
    # page 8 of its chunk (blocks 8..11).
    assert _matched(sched, vs.make_request("d", prompt, BS)) == (9 * BS, True)


def test_sliding_window_as_full_attention_is_stored(tmp_path: Path) -> None:
    """With vLLM's hybrid manager off, a sliding-window layer is allocated as full attention
    (FullAttentionSpec with its window recorded): every block is kept, so it is a full
    group: stored and loaded whole."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheGroupSpec

    vc = vs.make_config(tmp_path, "unused", extra={"model": "swa-as-full"})
    spec = FullAttentionSpec(block_size=BS, num_kv_heads=vs.HEADS, head_size=vs.HEAD_DIM,
                             dtype=torch.bfloat16, sliding_window=2 * BS)
    kcc = KVCacheConfig(num_blocks=64, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec([f"model.layers.{i}.self_attn.attn" for i in range(4)], spec)])
    (plan,) = namespace_layouts(vc, kcc)
    assert plan.window == 0 and plan.first_kept(10 * BS) == 0
    assert plan.layout.model == "swa-as-full"


def test_scheduler_hybrid_state_group_served_without_kvbroker(
        tmp_path: Path, broker: Broker, caplog: pytest.LogCaptureFixture) -> None:
    """A Mamba/state group has no per-block page: the model is served without kvbroker
    (vLLM computes every request), said once at start-up with the reason."""
    vc = vs.make_config(tmp_path, broker.socket, extra={"model": "hybrid-mamba"})
    vc.scheduler_config.disable_hybrid_kv_cache_manager = False
    kcc = _hybrid_kcc("mamba")
    assert [p.group_id for p in namespace_layouts(vc, kcc)] == [0]
    with caplog.at_level("WARNING", logger="kvbroker.vllm"):
        conn = KVConnectorFactory.create_connector(vc, KVConnectorRole.SCHEDULER, kcc)
    assert isinstance(conn, KVBrokerConnector)
    assert not conn.load_enabled and not conn.save_enabled
    lines = [r.getMessage() for r in caplog.records if "no per-block page" in r.getMessage()]
    assert len(lines) == 1 and "MambaSpec" in lines[0], lines
    conn.shutdown()


def test_scheduler_kv_events_and_hit_sources(tmp_path: Path, broker: Broker) -> None:
    """take_events reports the blocks handed to kvbroker (its page keys, chained); the stats
    attribute prompt tokens to kvbroker (hit_tokens) and to vLLM's own prefix cache."""
    from vllm.distributed.kv_events import BlockStored

    vc = vs.make_config(tmp_path, broker.socket, extra={"model": "events"})
    kcc = vs.make_kv_cache_config(BS, 256, mla=False)
    prefix = [7000 + i for i in range(BS * 5)]
    keys = _fill(broker.socket, vc, kcc, prefix, 3)
    sched = vs.make_scheduler(vc, kcc)
    conn = sched.connector
    assert isinstance(conn, KVBrokerConnector)
    assert _admitted(sched, vs.make_request("e", prefix + [1], BS)) == 3 * BS
    ev = [e for e in conn.take_events() if isinstance(e, BlockStored)]
    stored = [h for e in ev for h in e.block_hashes]
    # Blocks 3 and 4 are computed this step and stored: keys chained after the loaded ones.
    assert stored == kvb.page_keys(prefix, BS)[3:5]
    assert ev[0].parent_block_hash == keys[2] and ev[0].medium == "kvbroker"
    assert ev[0].token_ids == prefix[3 * BS: 5 * BS]
    assert list(conn.take_events()) == []
    st = conn.get_kv_connector_stats()
    assert st is not None and st.data["hit_tokens"] == 3 * BS
    assert st.data["local_hit_tokens"] == 0
    conn.shutdown()


def test_scheduler_kv_events_block_removed(tmp_path: Path, broker: Broker) -> None:
    """The broker evicts on its own: blocks announced stored (BlockStored) and found gone
    are announced removed (BlockRemoved), by a lookup that misses one (not within
    events_grace_s of its announcement: its store may still be in flight) and by the
    background re-check of announced pages; what is tracked stays bounded."""
    from vllm.distributed.kv_events import BlockRemoved, BlockStored

    e = vs.MiniEngine(tmp_path, broker.socket, mla=False,
                      extra={"model": "events-removed", "events_grace_s": 0.0,
                             "events_recheck_s": 3600.0, "events_tracked": 10})
    conn = e.sched.connector
    assert isinstance(conn, KVBrokerConnector) and conn._sched is not None
    sch = conn._sched
    events = _recorded(conn)
    prompt = [9000 + i for i in range(BS * 6 + 1)]
    keys = kvb.page_keys(prompt, BS)[:6]
    e.run([vs.make_request("a", prompt, BS, max_tokens=1)])
    assert [k for ev in events if isinstance(ev, BlockStored) for k in ev.block_hashes] == keys
    plan = namespace_layouts(e.vc, e.kcc)[0]
    with kvb.connect(broker.socket) as c:  # "evicted"
        ns = c.ns_open(plan.layout)
        assert ns.delete(keys[1]) and ns.delete(keys[4])

    def removed() -> list[bytes | int]:
        return [k for ev in conn.take_events() if isinstance(ev, BlockRemoved)
                for k in ev.block_hashes]

    # A lookup misses block 1; within the grace period nothing is said, after it BlockRemoved.
    sch._grace_s = 3600.0
    assert conn.get_num_new_matched_tokens(vs.make_request("b", prompt, BS), 0) == (BS, False)
    assert removed() == []
    sch._grace_s = 0.0
    assert conn.get_num_new_matched_tokens(vs.make_request("c", prompt, BS), 0) == (BS, False)
    assert removed() == [keys[1]]
    # The re-check (on the lookup thread, started by a step's build_connector_meta) finds
    # block 4 gone, and only it; announced keys found gone are not announced twice.
    sch._recheck_at = 0.0
    e.sched.schedule()
    assert sch._recheck_fut is not None
    sch._recheck_fut.result(timeout=10)
    assert removed() == [keys[4]]
    sch._recheck_at = 0.0
    e.sched.schedule()
    assert sch._recheck_fut is not None
    sch._recheck_fut.result(timeout=10)
    assert removed() == []
    # Bounded: 4 still tracked, 8 more announced, at most events_tracked (10) kept.
    other = [11000 + i for i in range(BS * 8 + 1)]
    e.run([vs.make_request("d", other, BS, max_tokens=1)])
    assert len(sch._announced) == 10
    conn.shutdown()


def test_docs_launch_line_parses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """docs/vllm.md's `vllm serve` line, flag by flag, through vllm 0.33.0's own parser."""
    import re
    import shlex

    import vllm.platforms
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.platforms.cpu import CpuPlatform
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    # The parser's defaults need a platform; this machine has no accelerator vLLM's GPU
    # build detects, so it parses as the CPU platform would.
    monkeypatch.setattr(vllm.platforms, "_current_platform", CpuPlatform())

    doc = (Path(__file__).resolve().parents[2] / "docs" / "vllm.md").read_text()
    block = re.search(r"^vllm serve .*?\n(?=```)", doc, re.S | re.M)
    assert block, "no vllm serve line in docs/vllm.md"
    argv = shlex.split(block.group(0).replace("\\\n", " "))[2:]
    # The model itself is not what is checked: a local config.json stands in for it.
    d = vs.write_model(tmp_path)
    parser = AsyncEngineArgs.add_cli_args(FlexibleArgumentParser())  # type: ignore[no-untyped-call]
    args = AsyncEngineArgs.from_cli_args(parser.parse_args(["--model", str(d), *argv[1:]]))
    ktc = args.kv_transfer_config
    assert ktc is not None and ktc.kv_connector == "KVBrokerConnector"
    assert ktc.kv_connector_module_path == "kvbroker.vllm" and ktc.kv_role == "kv_both"
    assert ktc.kv_load_failure_policy == "recompute"
    assert args.kv_events_config is not None and args.kv_events_config.enable_kv_cache_events
    assert args.block_size == 64 and args.tensor_parallel_size == 8
