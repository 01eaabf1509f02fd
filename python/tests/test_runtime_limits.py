# SPDX-License-Identifier: MIT
"""Namespace caps changed on a running broker (kvbctl ns-limit): lowering one evicts only that
model's coldest pages, down to the cap, and every page that fits stays byte for byte; raising
or removing one loses nothing; the change is logged and shown in status and metrics; and
kvbctl tenants shows each tenant's use against its share.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvbroker as kvb
from conftest import Broker, build_dir, fresh_keys, page

A = kvb.Layout("limit/a", kvb.MLA, 16, [kvb.Component("kv", 4, 64)])
B = kvb.Layout("limit/b", kvb.MLA, 16, [kvb.Component("kv", 4, 64)])


def kvbctl(b: Broker, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(build_dir() / "bin" / "kvbctl"), "--socket", b.socket, *args],
                          capture_output=True, text=True, timeout=30)


def ns_stats(b: Broker, model: str) -> dict[str, float]:
    out = kvbctl(b, "ns", "--json")
    assert out.returncode == 0, out.stderr
    (ns,) = [n for n in json.loads(out.stdout) if n["model"] == model]
    return {k: v for k, v in ns.items() if isinstance(v, (int, float))}


@pytest.fixture
def limited(tmp_path: Path) -> Iterator[Broker]:
    b = Broker(tmp_path)
    yield b
    b.stop()


def test_ns_limit_at_run_time(limited: Broker) -> None:
    with kvb.connect(limited.socket, name="limits") as c:
        na, nb = c.ns_open(A), c.ns_open(B)
        ka, kb = fresh_keys(1000), fresh_keys(200)
        for i, k in enumerate(ka):
            assert na.put(k, page(na, i))
        for i, k in enumerate(kb):
            assert nb.put(k, page(nb, 5000 + i))
        slot = ns_stats(limited, "limit/a")["bytes"] / 1000

        # Lowered to 300 slots: the 300 newest pages of A stay, intact; B is not touched.
        out = kvbctl(limited, "ns-limit", f"limit/a={int(300 * slot)}")
        assert out.returncode == 0, out.stderr
        a = ns_stats(limited, "limit/a")
        assert a["pages"] == 300 and a["limit_bytes"] == int(300 * slot)
        for i, k in enumerate(ka):
            got = na.get(k)
            assert got == (page(na, i) if i >= 700 else None), i
        for i, k in enumerate(kb):
            assert nb.get(k) == page(nb, 5000 + i), i
        assert "ns-limit limit/a:" in limited.log_text()

        # Shown in status and metrics.
        st = json.loads(kvbctl(limited, "status", "--json").stdout)
        assert st["ns_limits"] == [{"model": "limit/a", "bytes": int(300 * slot)}]
        met = kvbctl(limited, "metrics").stdout
        want = f'kvbroker_ns_limit_bytes{{ns="{na.id}",model="limit/a",kind="mla"}}'
        assert f"{want} {int(300 * slot)}" in met
        shown = kvbctl(limited, "ns-limit")
        assert shown.returncode == 0 and "limit/a" in shown.stdout

        # Raised to 50%, then removed: every page stays, and new ones fit past the old cap.
        assert kvbctl(limited, "ns-limit", "limit/a=50%").returncode == 0
        assert ns_stats(limited, "limit/a")["pages"] == 300
        assert kvbctl(limited, "ns-limit", "limit/a=none").returncode == 0
        assert ns_stats(limited, "limit/a")["limit_bytes"] == 0
        more = fresh_keys(500)
        for i, k in enumerate(more):
            assert na.put(k, page(na, 9000 + i))
        assert ns_stats(limited, "limit/a")["pages"] == 800
        for i, k in enumerate(ka[700:]):
            assert na.get(k) == page(na, 700 + i)

    # Errors name their cause.
    gone = kvbctl(limited, "ns-limit", "limit/a=none")
    assert gone.returncode == 1 and "no limit is set" in gone.stderr
    bad = kvbctl(limited, "ns-limit", "limit/a=lots")
    assert bad.returncode == 2 and "not a size" in bad.stderr
    bad = kvbctl(limited, "ns-limit", "limit/a=101%")
    assert bad.returncode == 2


def test_tenants_table(limited: Broker) -> None:
    with kvb.connect(limited.socket, name="t") as c:
        ns = c.ns_open(A)
        (k,) = fresh_keys(1)
        ns.put(k, page(ns, 1))
        assert ns.get(k) == page(ns, 1)
        out = kvbctl(limited, "tenants", "--json")
        assert out.returncode == 0, out.stderr
        (t,) = json.loads(out.stdout)
        assert t["mode"] == "none" and t["clients"] == 1 and t["hits"] == 1
        assert 0 < t["bytes_used"] <= t["share_bytes"]
        text = kvbctl(limited, "tenants").stdout
        assert "all" in text and "share" in text


def test_refused_put_says_why(limited: Broker) -> None:
    with kvb.connect(limited.socket, name="refused") as c:
        ns = c.ns_open(A)
        keys = fresh_keys(5)
        for i, k in enumerate(keys[:4]):
            assert ns.put(k, page(ns, i))
        slot = ns_stats(limited, "limit/a")["bytes"] / 4
        assert kvbctl(limited, "ns-limit", f"limit/a={int(4 * slot)}").returncode == 0
        leases = [ns.acquire(k) for k in keys[:4]]  # nothing of its own evictable
        with pytest.raises(kvb.Error) as e:
            ns.put(keys[4], page(ns, 4))
        assert e.value.errno == 28  # ENOSPC
        for lease in leases:
            assert lease is not None
            lease.release()
        assert ns.put(keys[4], page(ns, 4))  # released: the coldest goes, the PUT fits
    assert "PUT refused (-ENOSPC): namespace" in limited.log_text()
    assert "kvbctl ns-limit" in limited.log_text()
    met = kvbctl(limited, "metrics").stdout
    assert 'kvbroker_tenant_put_refused_total{partition="0",tenant="all"} 1' in met
