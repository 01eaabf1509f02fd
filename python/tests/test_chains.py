# SPDX-License-Identifier: MIT
"""Parent keys through the Python API: Namespace.put/put_many, View.put/put_many and
low-level Op(parent=...) all reach the broker, which then evicts chains tail first.

Each test stores chains head first (so the heads are the coldest pages: plain LRU would evict
them first and strand every tail), floods the pool until chain pages go, and checks that what
is left of each chain is a whole prefix.
"""

from __future__ import annotations

from collections.abc import Callable

import kvbroker as kvb
from conftest import Broker, prefix_stored

PAGE = 1 << 20  # 1 MiB pages: 64 in the test broker's 64 MiB pool
LEN = 10


def layout(model: str) -> kvb.Layout:
    return kvb.Layout(model, kvb.MLA, 64, [kvb.Component("kv", 16, 1024)])


def chain(seed: int) -> list[bytes]:
    return kvb.page_keys([seed * 1000 + i for i in range(LEN * 64)], 64)


def flood_and_check(c: kvb.Client, ns: kvb.Namespace, chains: list[list[bytes]],
                    src: kvb.HostBuffer) -> None:
    """PUTs fresh pages until the chains lost about half their pages, checking all the way."""
    total = len(chains) * LEN
    for i in range(400):
        ns.put(kvb.key_chain([7, i, 7]), memoryview(src)[:PAGE])
        left = sum(prefix_stored(ns, k) for k in chains)
        if left <= total // 2:
            break
    assert left <= total // 2
    assert any(prefix_stored(ns, k) for k in chains)  # the newest chains' heads are still there


def store(put: Callable[[list[bytes]], None], n: int, seed: int) -> list[list[bytes]]:
    out = []
    for s in range(n):
        keys = chain(seed + s)
        put(keys)
        out.append(keys)
    return out


def test_put_and_put_many_name_parents(own_broker: Broker) -> None:
    with kvb.connect(own_broker.socket) as c:
        ns = c.ns_open(layout("chain/api"))
        src = c.alloc_host(LEN * PAGE)
        pages = [memoryview(src)[i * PAGE:(i + 1) * PAGE] for i in range(LEN)]

        def one_by_one(keys: list[bytes]) -> None:
            for i, k in enumerate(keys):
                assert ns.put(k, pages[i], keys[i - 1] if i else None)

        def batch(keys: list[bytes]) -> None:
            assert ns.put_many(keys, pages, [None, *keys[:-1]]) == [True] * LEN

        chains = store(one_by_one, 2, 10) + store(batch, 2, 20)
        assert all(prefix_stored(ns, k) == LEN for k in chains)
        flood_and_check(c, ns, chains, src)


def test_views_and_low_level_ops_name_parents(own_broker: Broker) -> None:
    with kvb.connect(own_broker.socket) as c:
        ns = c.ns_open(layout("chain/view"))
        src = c.alloc_host(LEN * PAGE)
        # Layer l's token slot s at l * LEN * 64 KiB + s KiB: LEN pages of 64 tokens.
        v = ns.view([kvb.ViewPart(src, 1024, base=layer * LEN * 64 * 1024)
                     for layer in range(16)])

        def view_puts(keys: list[bytes]) -> None:
            assert v.put(keys[0], 0)
            for i in range(1, LEN // 2):
                assert v.put(keys[i], i * 64, keys[i - 1])
            rest = list(range(LEN // 2, LEN))
            assert v.put_many([keys[i] for i in rest], [i * 64 for i in rest],
                              [keys[i - 1] for i in rest]) == [True] * len(rest)

        def ops(keys: list[bytes]) -> None:
            batch = [kvb.Op(kvb.OP_PUT, 0, ns.id, src.id, k, i * PAGE, 0, 0, i,
                            keys[i - 1] if i else None) for i, k in enumerate(keys)]
            assert c.submit(batch) == LEN
            got: list[kvb.Completion] = []
            while len(got) < LEN:
                got += c.reap(LEN, 1, 10000)
            assert all(x.res == 0 for x in got)

        chains = store(view_puts, 2, 30) + store(ops, 2, 40)
        assert all(prefix_stored(ns, k) == LEN for k in chains)
        flood_and_check(c, ns, chains, src)
        v.destroy()
