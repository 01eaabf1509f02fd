# SPDX-License-Identifier: MIT
"""kvbroker.vllm's worker role on CPU KV tensors, driven by vLLM 0.33.0's real Scheduler.

Engine A computes and stores; engine B (its own scheduler, connectors and KV tensors) must
load the shared prefix byte-exact and compute only the rest. MiniEngine checks after every
step that each token vLLM counts as computed holds its right bytes, so a load that went wrong
can only show up as load errors that vLLM recomputes, never as garbage.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, cast

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a local config.json; nothing downloads
pytest.importorskip("vllm")

from vllm.v1.request import RequestStatus

import vllm_support as vs
from conftest import Broker, prefix_stored

BS = 16


def _prompt(seed: int, nblocks: int, tail: int = 5) -> list[int]:
    return [(seed * 7919 + i * 13) % 1000 + 1 for i in range(nblocks * BS + tail)]


@pytest.mark.parametrize("mla,layout,zero_copy,async_load", [
    (True, "flash", True, False),
    (False, "flash", True, False),
    (False, "flashinfer", True, False),
    (True, "flash", False, False),
    (False, "flash", True, True),
    (True, "flash", False, True),
])
def test_save_then_load_byte_exact(tmp_path: Path, broker: Broker, mla: bool, layout: str,
                                   zero_copy: bool, async_load: bool) -> None:
    """async_load: the load runs outside the step ((n, True), finished_recving)."""
    extra = {"model": f"w-{mla}-{layout}-{zero_copy}-{async_load}", "zero_copy": zero_copy,
             "async_load": async_load}
    prompt = _prompt(1 + mla + 2 * zero_copy + (layout == "flash"), 20)
    a = vs.MiniEngine(tmp_path, broker.socket, mla=mla, layout=layout, extra=extra)
    a.run([vs.make_request("a", prompt, BS, max_tokens=3)])
    assert a.bad == [] and a.computed_tokens == len(prompt) + 2
    assert vs.wk(a.worker).copy_mode is (not zero_copy)

    b = vs.MiniEngine(tmp_path, broker.socket, mla=mla, layout=layout, extra=extra)
    # Same prefix, then its own tokens: 20 blocks load, only the rest is computed.
    b.run([vs.make_request("b", prompt + [3, 1, 4, 1, 5], BS, max_tokens=3)])
    assert b.bad == [] and b.invalid_reports == []
    assert b.computed_tokens == len(prompt) + 5 + 2 - 20 * BS
    # An unrelated request loads nothing.
    c = vs.MiniEngine(tmp_path, broker.socket, mla=mla, layout=layout, extra=extra)
    other = _prompt(99, 6)
    c.run([vs.make_request("c", other, BS, max_tokens=2)])
    assert c.computed_tokens == len(other) + 1 and c.bad == []


def test_mla_tp_stores_spread_every_rank_loads(tmp_path: Path, broker: Broker) -> None:
    extra = {"model": "w-mla-tp"}
    prompt = _prompt(7, 16)
    a = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra, tp_size=4)
    a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
    stored = [vs.wk(w).stats_total["stored_pages"] for w in a.workers]
    # One namespace for all ranks; each page stored once, by one rank, spread over all.
    assert sum(stored) == 16 and all(n > 0 for n in stored), stored
    b = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra, tp_size=4)
    b.run([vs.make_request("b", prompt, BS, max_tokens=2)])
    assert b.bad == [] and b.computed_tokens == len(prompt) + 1 - 16 * BS
    assert all(vs.wk(w).stats_total["loaded_pages"] == 16 for w in b.workers)


def test_generated_blocks_stored_at_finish(tmp_path: Path, broker: Broker) -> None:
    extra = {"model": "w-finish"}
    prompt = _prompt(11, 3, tail=10)  # 58 tokens
    a = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra)
    # 58 + 40 generated tokens: KV for 97 tokens -> 6 full blocks, 3 of them prompt-only.
    req = vs.make_request("a", prompt, BS, max_tokens=40)
    a.run([req])
    assert vs.wk(a.worker).stats_total["stored_pages"] == 6
    assert a.bad == []


def test_broker_killed_before_load_recomputes(tmp_path: Path) -> None:
    broker = Broker(tmp_path)
    extra = {"model": "w-kill", "op_timeout_ms": 3000}
    prompt = _prompt(5, 24)
    try:
        a = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra)
        a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
        b = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra,
                          max_num_batched_tokens=1024)
        t0 = time.monotonic()
        # The broker dies after the scheduler found the pages, before the worker loads
        # them: the loads fail, vLLM recomputes those blocks, nothing is wrong, nothing hangs.
        b.run([vs.make_request("b", prompt, BS, max_tokens=2)], kill_at=0, kill=broker.kill)
        assert time.monotonic() - t0 < 10
        assert b.invalid_reports, "a dead broker must produce load errors"
        assert b.bad == []
        assert b.computed_tokens > len(prompt) + 1 - 24 * BS
        # It keeps serving without the broker ...
        other = _prompt(6, 4)
        before = b.computed_tokens
        b.run([vs.make_request("c", other, BS, max_tokens=2)])
        assert b.bad == [] and b.computed_tokens - before == len(other) + 1
    finally:
        broker.stop()
    # ... and reconnects when a broker is back on the socket.
    broker2 = Broker(tmp_path)
    try:
        prompt2 = _prompt(8, 24)
        b.run([vs.make_request("d", prompt2, BS, max_tokens=2)])  # stores into the new one
        c = vs.MiniEngine(tmp_path, broker2.socket, mla=True, extra=extra)
        c.run([vs.make_request("e", prompt2, BS, max_tokens=2)])
        assert c.bad == [] and c.computed_tokens == len(prompt2) + 1 - 24 * BS
    finally:
        broker2.stop()


def test_no_broker_serves(tmp_path: Path) -> None:
    e = vs.MiniEngine(tmp_path, str(tmp_path / "none.sock"), mla=False, extra={"model": "x"})
    prompt = _prompt(3, 5)
    t0 = time.monotonic()
    e.run([vs.make_request("a", prompt, BS, max_tokens=2),
           vs.make_request("b", prompt, BS, max_tokens=2)])
    assert time.monotonic() - t0 < 10 and e.bad == []


def test_stats_and_prometheus(tmp_path: Path, broker: Broker) -> None:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    from kvbroker.vllm import KVBrokerConnector, KVBrokerStats

    extra = {"model": "w-stats"}
    prompt = _prompt(21, 8)
    a = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra)
    a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
    b = vs.MiniEngine(tmp_path, broker.socket, mla=True, extra=extra)
    b.sched.add_request(vs.make_request("b", prompt, BS, max_tokens=2))
    b.step()
    st = b.last_stats  # what the worker handed vLLM in KVConnectorOutput.kv_connector_stats
    assert isinstance(st, KVBrokerStats) and st.data["loaded_pages"] == 8
    red = KVBrokerStats(dict(st.data)).reduce()
    assert red["loaded_bytes"] > 0
    reg = CollectorRegistry()

    def counter(*args: Any, **kw: Any) -> Counter:
        kw["registry"] = reg
        return Counter(*args, **kw)

    prom = KVBrokerConnector.build_prom_metrics(
        b.vc, {Gauge: Gauge, Counter: counter, Histogram: Histogram}, ["model_name", "engine"],
        {0: ["tiny", "0"]})
    prom.observe(st.data, 0)
    assert reg.get_sample_value("vllm:kvbroker_loaded_pages_total",
                                {"model_name": "tiny", "engine": "0"}) == 8


def test_stores_name_parents_chains_evicted_tail_first(tmp_path: Path,
                                                       own_broker: Broker) -> None:
    """vLLM's block hashes chain, and so do the stores: each page names the one before it,
    across the scheduler's transfers too (a 20-block prompt is stored 16 + 4 blocks, over two
    steps). Stored head first, the chain's head is its coldest page, which plain LRU would
    evict first; a flood evicts the chain tail first instead, leaving a whole prefix."""
    import kvbroker as kvb

    extra = {"model": "w-chain"}
    prompt = _prompt(21, 20)
    a = vs.MiniEngine(tmp_path, own_broker.socket, mla=True, extra=extra)
    a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
    assert a.bad == []
    ns = vs.wk(a.worker).link.ns[0]
    keys = kvb.page_keys(prompt[:20 * BS], BS)
    assert ns.lookup(keys) == 20
    with kvb.connect(own_broker.socket) as c:
        flood = c.ns_open(kvb.Layout("w-chain-flood", kvb.MLA, 1,
                                     [kvb.Component("kv", 1, ns.page_bytes)]))
        page = bytes(ns.page_bytes)
        n = 20
        for i in range(100000):
            flood.put(kvb.key_chain([i, 424242]), page)
            n = prefix_stored(ns, keys)
            if n < 15:
                break
        assert 0 < n < 15


def test_async_load_aborted_request_holds_blocks(tmp_path: Path, broker: Broker) -> None:
    """A request aborted while its asynchronous load is in flight: vLLM keeps its blocks (the
    broker may still be writing them) until the workers report the load done
    (finished_recving), then frees them; nothing else is disturbed."""
    from vllm.v1.request import RequestStatus

    extra = {"model": "w-abort", "async_load": True}
    prompt = _prompt(33, 12)
    a = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
    a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
    b = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
    pool = b.sched.kv_cache_manager.block_pool
    free0 = pool.get_num_free_blocks()
    b.sched.add_request(vs.make_request("b", prompt, BS, max_tokens=2))
    out = b.sched.schedule()  # matched: blocks allocated, the load planned
    assert out.kv_connector_metadata is not None
    b.worker.bind_connector_metadata(out.kv_connector_metadata)
    b.worker.start_load_kv(cast(Any, None))  # the load is in flight
    b.worker.clear_connector_metadata()
    b.sched.finish_requests("b", RequestStatus.FINISHED_ABORTED)
    assert pool.get_num_free_blocks() < free0  # held: the broker may still be writing
    # Another request drives steps (vLLM returns freed blocks to the pool after a step).
    b.run([vs.make_request("c", _prompt(34, 2), BS, max_tokens=2)])
    assert pool.get_num_free_blocks() >= free0  # freed once the workers reported the load
    assert b.bad == []


@pytest.mark.parametrize("retire", [False, True])
def test_broker_stopped_mid_save_stores_no_wrong_page(tmp_path: Path, retire: bool) -> None:
    """A broker that stops (SIGSTOP) with PUTs through the view queued: the worker times out
    and drops the connection (retire: moving the KV memory off the broker's file first), but
    the stopped broker still holds those PUTs and runs them when it resumes, reading the
    blocks through its own mapping. What it stores then must be the pages the blocks held,
    never the bytes of a file given up meanwhile: another engine loads byte-exact pages, or
    misses and recomputes."""
    import signal

    broker = Broker(tmp_path)
    extra = {"model": f"w-stop-put-{retire}", "op_timeout_ms": 300, "reconnect_s": 60,
             "retire_on_timeout": retire}
    prompt = _prompt(43, 12)
    stopped = False

    def stop() -> None:
        nonlocal stopped
        broker.proc.send_signal(signal.SIGSTOP)
        stopped = True

    try:
        a = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        assert not vs.wk(a.worker).copy_mode  # PUTs read vLLM's blocks themselves
        # Stopped before the step's PUTs go out; the next step's handle_preemptions waits
        # for them and times out. The request finishes meanwhile.
        a.sched.add_request(vs.make_request("a", prompt, BS, max_tokens=3))
        a.step(kill=stop)
        for _ in range(20):
            if not a.sched.get_num_unfinished_requests():
                break
            a.step()
        assert a.bad == [] and not a.sched.get_num_unfinished_requests()
        assert vs.wk(a.worker).link.get() is None
        broker.proc.send_signal(signal.SIGCONT)
        stopped = False
        # The late PUTs run; without retire their blocks were held until then (a fence).
        deadline = time.monotonic() + 5
        while a.sched.has_requests() and time.monotonic() < deadline:
            a.step()
            time.sleep(0.01)
        assert not a.sched.has_requests()
        time.sleep(0.3)
        b = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        b.run([vs.make_request("b", prompt, BS, max_tokens=2)])
        assert b.bad == [], "a page stored from memory vLLM had given up"
    finally:
        if stopped:
            broker.proc.send_signal(signal.SIGCONT)
        broker.stop()


@pytest.mark.parametrize("retire", [False, True])
def test_fenced_puts_of_a_preempted_request_store_no_wrong_page(tmp_path: Path,
                                                                 retire: bool) -> None:
    """PUTs through the view queued at a broker that stops (SIGSTOP): the worker times out
    and fences them, the request goes on running, and then vLLM preempts it, handing its
    blocks to another request in the same step, before the forward. When the broker resumes
    and runs those PUTs, they must not read the new owner's bytes: the step waits for the
    fence to settle (retire off), or the KV memory moves off the broker's file first."""
    import signal
    import threading

    broker = Broker(tmp_path)
    extra = {"model": f"w-preempt-{retire}", "op_timeout_ms": 300, "reconnect_s": 60,
             "retire_on_timeout": retire}
    # 15 usable blocks: "c" (2 blocks) then "a" (12 blocks + its tail) fill the pool, and
    # the next step preempts "a" (the last one running) to give "c" a block.
    a = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra, num_blocks=16)
    assert not vs.wk(a.worker).copy_mode
    prompt = _prompt(47, 12, tail=0)
    resumed = threading.Event()

    def resume() -> None:
        broker.proc.send_signal(signal.SIGCONT)
        resumed.set()

    timer = threading.Timer(1.5, resume)
    written: list[int] = []

    def new_owner(out: Any) -> None:  # the runner's writes into the blocks it hands out
        if "a" in (out.preempted_req_ids or ()):
            for name in a.layers:
                for p in a._layer_bytes(name):
                    p[blocks] = 0x5A
            written.append(len(blocks))

    try:
        a.sched.add_request(vs.make_request("c", _prompt(48, 2, tail=0), BS, max_tokens=40))
        a.step()
        a.sched.add_request(vs.make_request("a", prompt, BS, max_tokens=40))
        a.step(kill=lambda: broker.proc.send_signal(signal.SIGSTOP))  # its PUTs queue
        blocks = list(a.sched.kv_cache_manager.get_block_ids("a")[0][:12])
        a.before_load = new_owner
        timer.start()
        out, _ = a.step()  # times out, fences the PUTs, preempts "a"
        assert "a" in out.preempted_req_ids and written == [12]
        # Settled before the runner wrote: the broker ran the PUTs (retire off: the step
        # waited for it), or they read the file vLLM no longer uses.
        assert resumed.is_set() is (not retire)
        resumed.wait(5)
        time.sleep(0.3)  # the late PUTs run
        b = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        b.run([vs.make_request("b", prompt + [1, 2, 3], BS, max_tokens=2)])
        assert b.bad == [], "a page stored from blocks another request had written"
    finally:
        timer.cancel()
        broker.proc.send_signal(signal.SIGCONT)
        broker.stop()


@pytest.mark.parametrize("retire,resume", [(False, "cont"), (True, "cont"), (False, "kill")])
def test_broker_stopped_mid_load_fences_blocks(tmp_path: Path, retire: bool,
                                               resume: str) -> None:
    """A broker that stops (SIGSTOP) while GETs through the view are in flight: the worker
    times out and vLLM recomputes, but the stopped broker still holds those GETs and runs
    them when it resumes. No other request's KV, written into blocks freed meanwhile, may
    be overwritten by the late pages: the request's blocks stay held (no finished_sending)
    until those GETs completed or the broker died (kill), or (retire) the KV memory moved
    off the broker's file."""
    import signal

    broker = Broker(tmp_path)
    # A long reconnect_s: the worker must not try to reconnect to the stopped broker.
    extra = {"model": "w-fence", "op_timeout_ms": 300, "reconnect_s": 60,
             "retire_on_timeout": retire}
    prompt = _prompt(41, 12)
    stopped = False
    try:
        a = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
        b = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        w = vs.wk(b.worker)
        assert not w.copy_mode  # GETs write vLLM's blocks themselves
        pool = b.sched.kv_cache_manager.block_pool
        free0 = pool.get_num_free_blocks()

        def stop() -> None:
            nonlocal stopped
            broker.proc.send_signal(signal.SIGSTOP)
            stopped = True

        b.sched.add_request(vs.make_request("b", prompt, BS, max_tokens=2))
        b.step(kill=stop)  # the GETs go out, the broker stops, the worker times out
        for _ in range(20):  # vLLM recomputes, "b" finishes
            if not b.sched.get_num_unfinished_requests():
                break
            b.step()
        assert b.invalid_reports and b.bad == []
        assert not b.sched.get_num_unfinished_requests()
        for _ in range(3):  # vLLM keeps stepping for requests in delayed cleanup
            if b.sched.has_requests():
                b.step()
        held = "b" in b.sched.requests  # finished, its blocks held
        free_held = pool.get_num_free_blocks()
        # The engine goes on: every free block gets a new owner that writes its KV.
        free = [blk.block_id for blk in pool.free_block_queue.get_all_free_blocks()
                if blk.block_id != 0]
        parts = [p for name in b.layers for p in b._layer_bytes(name)]
        for p in parts:
            p[free] = 0x5A
        if resume == "kill":
            broker.kill()
        broker.proc.send_signal(signal.SIGCONT) if resume == "cont" else None
        stopped = False
        # The late GETs land; the fence settles once the broker completed them, and the
        # next step reports "b" in finished_sending: vLLM frees its blocks.
        deadline = time.monotonic() + 5
        while b.sched.has_requests() and time.monotonic() < deadline:
            b.step()
            time.sleep(0.01)
        assert not b.sched.has_requests() and "b" not in b.sched.requests
        time.sleep(0.2)  # (without the fence: time for the late GETs to land)
        changed = sum(int((p[free] != 0x5A).sum()) for p in parts)
        assert changed == 0, f"{changed} bytes of other requests' blocks overwritten"
        if retire:  # nothing to hold: the late writes land in the old file
            assert not held and free_held == free0
        else:
            assert held and free_held < free0
        assert pool.get_num_free_blocks() == free0
        assert not getattr(w, "fences", [])
        if resume == "kill":
            return
        # Reconnected (the moved memory registered anew), the worker loads byte-exact again.
        w.link._next_try = 0.0
        assert b.sched.kv_cache_manager.reset_prefix_cache()  # (the sentinels are no KV)
        b.run([vs.make_request("c", prompt, BS, max_tokens=2)])
        assert b.bad == [] and vs.wk(b.worker).stats_total["loaded_pages"] >= 12
    finally:
        if stopped:
            broker.proc.send_signal(signal.SIGCONT)
        broker.stop()


@pytest.mark.parametrize("case", ["vllm-cpu", "odd-parts", "fp8"])
def test_converting_copy_batched_byte_exact(case: str) -> None:
    """The batched converting copy (_ring_copy: whole elements, one gather and one scatter
    per part) against the page built byte by byte from the canonical views: every block to
    its slot (out of order, not consecutive), and back into other blocks; nothing else
    written. vllm-cpu: vLLM-CPU's block format (K [head][dim][token], V [head][token][dim]);
    odd-parts: a part whose page offset its elements do not divide (bytes then); fp8: 1-byte
    elements.
    """
    import torch

    from kvbroker.vllm.layouts import _u8
    from kvbroker.vllm.worker import _wide, _Worker

    nb, n, h, d = 12, 4, 2, 6
    dt = torch.uint8 if case == "fp8" else torch.bfloat16
    g = torch.Generator().manual_seed(7)
    t = torch.randint(0, 255, (nb, h, n, 2 * d * (1 if dt == torch.uint8 else 2)),
                      dtype=torch.uint8, generator=g).view(dt)
    o = t.storage_offset()
    views = [torch.as_strided(t, (nb, n, h, d), (h * n * 2 * d, 1, 2 * n * d, n), o),
             torch.as_strided(t, (nb, n, h, d), (h * n * 2 * d, d, 2 * n * d, 1), o + n * d)]
    cviews = [_u8(v) for v in views]
    if case == "odd-parts":  # a 3-byte first part: the next starts at an odd offset
        cviews.insert(0, _u8(t).flatten(1)[:, :3].unsqueeze(-1))
    page = sum(cv[0].numel() for cv in cviews)
    w = _Worker.__new__(_Worker)
    w.cviews, w.wviews = [cviews], [[_wide(cv) for cv in cviews]]
    if case == "vllm-cpu":
        assert [wv.dtype for wv in w.wviews[0]] == [torch.int16, torch.int16]
    w.ring_pages, w.ring_page = 9, page
    w.ring_t = torch.zeros(w.ring_pages * page, dtype=torch.uint8)
    blocks, slots = [5, 1, 9, 2], [7, 0, 3, 8]
    w._ring_copy(0, blocks, slots, save=True)
    rows = w.ring_t.view(w.ring_pages, page)
    for b, s in zip(blocks, slots, strict=True):
        want = torch.cat([cv[b].reshape(-1) for cv in cviews])
        assert torch.equal(rows[s, :want.numel()], want)
    assert int(rows[[1, 2, 4, 5, 6]].count_nonzero()) == 0
    before = t.view(torch.uint8).clone()
    dst = [10, 0, 4, 7]
    w._ring_copy(0, dst, slots, save=False)
    after = t.view(torch.uint8)
    for src, b in zip(blocks, dst, strict=True):
        assert torch.equal(after[b], before[src])
    untouched = [i for i in range(nb) if i not in dst]
    assert torch.equal(after[untouched], before[untouched])


@pytest.mark.parametrize("resume", ["cont", "kill"])
def test_broker_stopped_mid_async_load_fences_blocks(tmp_path: Path, resume: str) -> None:
    """Asynchronous loads ((n, True)) through the view into a broker that stops (SIGSTOP)
    after the lookup: with no completion for op_timeout_ms the worker gives up on them, but
    the stopped broker still holds the GETs. The request's blocks stay held: vLLM waits for
    finished_recving, which comes only once the broker ran those GETs (SIGCONT) or exited
    (kill); then vLLM recomputes it. No other request's KV, written meanwhile into the free
    blocks, is overwritten by the late pages."""
    import signal

    broker = Broker(tmp_path)
    extra = {"model": "w-afence", "op_timeout_ms": 300, "reconnect_s": 60,
             "retire_on_timeout": False, "async_load": True}
    prompt = _prompt(43, 12)
    stopped = False
    try:
        a = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
        b = vs.MiniEngine(tmp_path, broker.socket, mla=False, extra=extra)
        w = vs.wk(b.worker)
        assert not w.copy_mode
        pool = b.sched.kv_cache_manager.block_pool
        free0 = pool.get_num_free_blocks()

        def stop() -> None:
            nonlocal stopped
            broker.proc.send_signal(signal.SIGSTOP)
            stopped = True

        b.sched.add_request(vs.make_request("b", prompt, BS, max_tokens=2))
        b.step(kill=stop)  # the lookup found 12 blocks; the GETs go out, the broker stops
        req = b.sched.requests["b"]
        t0 = time.monotonic()
        while not w.fences and time.monotonic() - t0 < 5:
            b.step()  # get_finished polls; past op_timeout_ms the loads are given up
            time.sleep(0.02)
        assert w.fences and time.monotonic() - t0 >= 0.3
        for _ in range(5):  # held: no finished_recving while the broker may still write
            b.step()
        assert req.status == RequestStatus.WAITING_FOR_REMOTE_KVS
        assert pool.get_num_free_blocks() < free0
        free = [blk.block_id for blk in pool.free_block_queue.get_all_free_blocks()
                if blk.block_id != 0]
        parts = [p for name in b.layers for p in b._layer_bytes(name)]
        for p in parts:
            p[free] = 0x5A
        if resume == "kill":
            broker.kill()
        else:
            broker.proc.send_signal(signal.SIGCONT)
        stopped = False
        # The late GETs land (cont) or the broker is gone (kill); then the fence settles
        # and that step reports "b" in finished_recving.
        deadline = time.monotonic() + 10
        while w.fences and time.monotonic() < deadline:
            b.step()
            time.sleep(0.01)
        assert not w.fences
        # Checked before "b" is computed again (into free blocks, as vLLM may).
        changed = sum(int((p[free] != 0x5A).sum()) for p in parts)
        assert changed == 0, f"{changed} bytes of other requests' blocks overwritten"
        while b.sched.has_requests() and time.monotonic() < deadline:
            b.step()
        # The loads were load errors: "b" is computed in full, not offered the same load
        # again, with the right bytes.
        assert not b.sched.has_requests()
        assert b.invalid_reports and b.bad == []
        assert b.computed_tokens == len(prompt) + 1
        assert pool.get_num_free_blocks() == free0
    finally:
        if stopped:
            broker.proc.send_signal(signal.SIGCONT)
        broker.stop()



def test_blocks_written_before_the_loads_never_stored(tmp_path: Path) -> None:
    """The model runner may write blocks before start_load_kv (it zeroes the blocks it hands
    out on mixed-precision caches, copies into copy-on-write ones), and a block freed by a
    preemption may be among them while a view PUT of the step before still reads it. Those
    PUTs finish in handle_preemptions, which the runner calls first: with the broker's copies
    slowed so that they are surely still in flight, zeroing every block right after it
    leaves every stored page right (a second engine loads them byte-exact)."""
    b = Broker(tmp_path, "--copy-inline", "0", "--copy-delay-us", "20000")
    try:
        extra = {"model": "w-written-before-load"}
        prompt = _prompt(13, 6)
        a = vs.MiniEngine(tmp_path, b.socket, mla=False, extra=extra)

        def zero_all(out: Any) -> None:
            for t in a.kv.values():
                t.zero_()

        a.before_load = zero_all
        a.run([vs.make_request("a", prompt, BS, max_tokens=2)])
        assert vs.wk(a.worker).stats_total["stored_pages"] == 6
        c = vs.MiniEngine(tmp_path, b.socket, mla=False, extra=extra)
        c.run([vs.make_request("c", prompt + [7], BS, max_tokens=2)])
        assert c.computed_tokens == len(prompt) + 1 + 1 - 6 * BS
        assert c.bad == [], c.bad
    finally:
        b.stop()
