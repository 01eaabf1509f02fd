# SPDX-License-Identifier: MIT
"""The broker's Prometheus metrics as a scraper sees them, parsed by the Prometheus client
library: the latency, promotion, fetch and eviction-age histograms and the hit attribution
(by tier, tenant and namespace) after a mixed run; namespace series bounded under a flood;
and the Grafana dashboard and alert rules in deploy/ naming only metrics the broker exports.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

import kvbroker as kvb
from conftest import ROOT, Broker, build_dir, fresh_keys, page

HISTOGRAMS: dict[str, list[str | None] | None] = {
    "kvbroker_op_latency_seconds": ["get", "put", "lookup", "acquire"],
    "kvbroker_disk_promote_seconds": None,
    "kvbroker_remote_fetch_seconds": None,
    "kvbroker_evicted_page_age_seconds": None,
}
NS_CAP = 32  # METRICS_NS_MAX (common/metrics.h)
DASHBOARD = ROOT / "deploy" / "grafana" / "kvbroker.json"
RULES = ROOT / "deploy" / "prometheus" / "kvbroker-rules.yml"


def scrape(b: Broker) -> str:
    out = subprocess.run([str(build_dir() / "bin" / "kvbctl"), "--socket", b.socket, "metrics"],
                         check=True, capture_output=True, text=True, timeout=30)
    return out.stdout


def samples(text: str) -> dict[str, list[tuple[dict[str, str], float]]]:
    """Every sample by its name (a histogram's _bucket, _sum, _count apart), as the client
    library parses the exposition; it raises on anything malformed."""
    by: dict[str, list[tuple[dict[str, str], float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            by.setdefault(s.name, []).append((dict(s.labels), s.value))
    return by


def types(text: str) -> dict[str, str]:
    return {f.name: f.type for f in text_string_to_metric_families(text)}


@pytest.fixture
def small_broker(tmp_path: Path) -> Iterator[Broker]:
    """16 MiB of 4 KiB pages: a few thousand pages evict."""
    b = Broker(tmp_path, "--pool", "16M")
    yield b
    b.stop()


SMALL = kvb.Layout("test/metrics", kvb.MLA, 16, [kvb.Component("kv", 4, 64)])


def mixed_run(b: Broker) -> None:
    with kvb.connect(b.socket, name="metrics") as c:
        ns = c.ns_open(SMALL)
        keys = fresh_keys(6000)  # 24 MiB of pages into 16 MiB: the oldest are evicted
        data = page(ns, 7)
        ns.put_many(keys, [data] * len(keys))
        assert ns.get(keys[-1]) == data  # a hit
        assert ns.get(fresh_keys(1)[0]) is None  # a miss
        assert ns.lookup(keys[-10:]) == 10
        lease = ns.acquire(keys[-2])
        assert lease is not None
        lease.release()


def test_histograms_and_attribution_after_a_mixed_run(small_broker: Broker) -> None:
    mixed_run(small_broker)
    text = scrape(small_broker)
    by, ty = samples(text), types(text)
    for name, ops in HISTOGRAMS.items():
        assert ty[name] == "histogram", name
        for label_sets in (by[name + "_bucket"], by[name + "_count"], by[name + "_sum"]):
            assert label_sets, name
        buckets = by[name + "_bucket"]
        for op in ops or [None]:
            mine = [(lab, v) for lab, v in buckets if op is None or lab.get("op") == op]
            les = [lab["le"] for lab, _ in mine]
            assert les[-1] == "+Inf" and len(les) > 10, (name, op)
            values = [v for _, v in mine]
            assert values == sorted(values), (name, op)  # cumulative
            (count,) = [v for lab, v in by[name + "_count"] if op is None or lab.get("op") == op]
            assert values[-1] == count, (name, op)
            if ops:
                assert count > 0, (name, op)  # each op ran at least once
    (evicted,) = [v for _, v in by["kvbroker_evictions_total"]]
    (aged,) = [v for _, v in by["kvbroker_evicted_page_age_seconds_count"]]
    assert evicted > 0 and aged == evicted  # every eviction's age is in the histogram
    tiers = {lab["tier"]: v for lab, v in by["kvbroker_tier_hits_total"]}
    assert set(tiers) == {"ram", "disk", "remote"}
    (hits,) = [v for _, v in by["kvbroker_hits_total"]]
    assert tiers["ram"] == hits >= 2 and tiers["disk"] == tiers["remote"] == 0
    tenants = by["kvbroker_tenant_hits_total"]
    assert [lab["tenant"] for lab, _ in tenants] == ["all"] and tenants[0][1] == hits
    (share,) = [v for _, v in by["kvbroker_tenant_share_bytes"]]
    (used,) = [v for _, v in by["kvbroker_tenant_bytes_used"]]
    assert 0 < used <= share
    ns_hits = by["kvbroker_ns_hits_total"]
    assert [lab["model"] for lab, _ in ns_hits] == ["test/metrics"] and ns_hits[0][1] == hits


def test_namespace_flood_keeps_the_label_set_bounded(broker: Broker) -> None:
    n = NS_CAP * 3
    for first in range(0, n, 16):  # a session opens at most --max-ns namespaces
        with kvb.connect(broker.socket, name="flood") as c:
            for i in range(first, first + 16):
                lay = kvb.Layout(f"flood/{i}", kvb.MLA, 16, [kvb.Component("kv", 4, 64)])
                ns = c.ns_open(lay)
                for k in fresh_keys(1 + i % 4):
                    ns.put(k, page(ns, i))
    by = samples(scrape(broker))
    pages = by["kvbroker_ns_pages"]
    labels = {lab["ns"] for lab, _ in pages}
    assert len(pages) == NS_CAP + 1 and "_other" in labels
    (total,) = [v for lab, v in by["kvbroker_pool_pages"] if lab["tier"] == "ram"]
    assert sum(v for _, v in pages) == total  # summed, nothing dropped
    # The biggest keep their own series: the 24 namespaces of 4 pages, then 8 of the 3-page ones.
    kept = [v for lab, v in pages if lab["ns"] != "_other"]
    assert sorted(kept) == [3] * 8 + [4] * 24


def metric_names(text: str) -> set[str]:
    """kvbroker_* names a PromQL text uses (recording rules' names have colons: not these)."""
    return set(re.findall(r"(?<![\w:])kvbroker_[a-z0-9_]+(?![\w:])", text))


def test_dashboard_and_rules_use_only_exported_metrics(small_broker: Broker) -> None:
    mixed_run(small_broker)
    exported = set(samples(scrape(small_broker)))
    dash = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p["targets"]]
    assert exprs and all(metric_names(e) for e in exprs)
    used = set().union(*(metric_names(e) for e in exprs)) | metric_names(RULES.read_text())
    used.discard("kvbroker_info")  # the templating's label_values() source
    assert "kvbroker_info" in exported
    missing = sorted(used - exported)
    assert not missing, f"deploy/ names metrics the broker does not export: {missing}"
    for want in ("KvbrokerPoolNotRestartSafe", "KvbrokerDiskTierFailed",
                 "KvbrokerRemoteUnreachable", "KvbrokerHitRatioCollapse"):
        assert f"alert: {want}" in RULES.read_text()


def test_rules_pass_promtool() -> None:
    promtool = shutil.which("promtool")
    if not promtool:
        pytest.skip("promtool not installed (Debian package prometheus): rule file not checked")
    out = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_disk_hits_and_promotion_latency(tmp_path: Path) -> None:
    import time

    b = Broker(tmp_path, "--pool", "32M", "--disk", str(tmp_path / "cache"),
               "--disk-size", "128M")
    try:
        with kvb.connect(b.socket, name="disk") as c:
            lay = kvb.Layout("test/metrics-disk", kvb.MLA, 16, [kvb.Component("kv", 4, 1024)])
            ns = c.ns_open(lay)
            keys = fresh_keys(1000)  # 64 MiB into 32 MiB of RAM: the oldest go to disk, all fit it
            data = page(ns, 3)
            ns.put_many(keys, [data] * len(keys))
            deadline = time.monotonic() + 10
            while True:  # demotion runs in the background
                _, tiers = ns.lookup_tiers(keys)
                if kvb.TIER_DISK in tiers or time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            cold = [k for k, t in zip(keys, tiers, strict=True) if t == kvb.TIER_DISK][:16]
            assert cold
            for k in cold:
                assert ns.get(k) == data  # promoted for this GET: a disk hit
        by = samples(scrape(b))
        tiers_ = {lab["tier"]: v for lab, v in by["kvbroker_tier_hits_total"]}
        assert tiers_["disk"] >= len(cold)
        (hits,) = [v for _, v in by["kvbroker_hits_total"]]
        assert tiers_["ram"] + tiers_["disk"] + tiers_["remote"] == hits
        (promoted,) = [v for _, v in by["kvbroker_disk_promote_seconds_count"]]
        assert promoted >= len(cold)
    finally:
        b.stop()
