# SPDX-License-Identifier: MIT
"""Page keys against SGLang's get_hash_str.

Two references: vectors computed by SGLang 0.5.23's own get_hash_str over its native module
(the same table tests/unit/test_key.c checks the C library against), and the pure-Python
get_hash_str below, copied from SGLang (sglang/srt/mem_cache/hicache_storage.py before the
native module replaced it; Apache-2.0, Copyright SGLang Team), which covers random inputs.
"""

from __future__ import annotations

import array
import hashlib
import random

import numpy as np
import pytest

import kvbroker as kvb


# ---- copied from SGLang (hicache_storage.py), unchanged but for type hints ----
def get_hash_str(token_ids: list[int] | list[tuple[int, int]], prior_hash: str | None = None,
                 ) -> str:
    hasher = hashlib.sha256()

    if prior_hash:
        hasher.update(bytes.fromhex(prior_hash))

    for t in token_ids:
        if isinstance(t, tuple):
            # EAGLE bigram mode: hash both elements to uniquely identify the bigram
            for elem in t:
                hasher.update(elem.to_bytes(4, byteorder="little", signed=False))
        else:
            # Regular mode: single integer token
            hasher.update(t.to_bytes(4, byteorder="little", signed=False))

    return hasher.hexdigest()
# ---- end of the copy ----


# SGLang 0.5.23 get_hash_str(RadixKey(array("q", raw), is_bigram=True), prior); see test_key.c.
EG1 = "f721fe42aac11dcbfd1a17f24cc5765a0d5b6bc264d1c0b6581d775a7344c11f"  # [1..5]
EG2 = "c35ad698917936a474f7e55f3a4855eaee20585cd0bf156b1ae3a62666ba7220"  # EG1, [5..9]
EG_BIG = "cee38e1f701d4ab1c28671ad5fe29cc974c2375a36274d6f8b0a7f28ce3786c7"
EG_LONG = "d73ed1868af6e791c8a200db26eeb04a02a890d75c1d1c6999ad2222dfb96622"
SGL_PLAIN = "cf97adeedb59e05bfd73a2b4c2a8885708c4f4f70c84c64b27120e72ab733b72"  # [1, 2, 3, 4]


def test_sglang_vectors() -> None:
    assert kvb.key_hex(kvb.key_chain([1, 2, 3, 4])) == SGL_PLAIN
    k1 = kvb.key_chain_eagle([1, 2, 3, 4, 5])
    assert kvb.key_hex(k1) == EG1
    assert kvb.key_hex(kvb.key_chain_eagle([5, 6, 7, 8, 9], k1)) == EG2
    assert kvb.page_keys_hex.__doc__
    assert [kvb.key_hex(k) for k in kvb.page_keys_eagle(list(range(1, 10)), 4)] == [EG1, EG2]
    assert kvb.key_hex(kvb.key_chain_eagle([4294967295, 0, 123456789, 7])) == EG_BIG
    lng = [(i * 7919) % 151936 for i in range(101)]
    assert kvb.key_hex(kvb.key_chain_eagle(lng)) == EG_LONG


def test_against_get_hash_str_random() -> None:
    rng = random.Random(13)
    for _ in range(50):
        tpp = rng.choice([1, 16, 64])
        toks = [rng.randrange(1 << 32) for _ in range(tpp * rng.randrange(0, 5) + rng.randrange(3))]
        prior = kvb.key_chain([rng.randrange(1000)]) if rng.random() < 0.5 else None
        want: list[str] = []
        h = prior.hex() if prior else None
        for p in range(len(toks) // tpp):
            h = get_hash_str(toks[p * tpp:(p + 1) * tpp], h)
            want.append(h)
        assert kvb.page_keys_hex(toks, tpp, prior) == want
        assert kvb.page_keys_hex(toks, tpp, prior.hex() if prior else None) == want
        if toks:
            assert kvb.key_chain(toks, prior).hex() == get_hash_str(
                toks, prior.hex() if prior else None)
        # EAGLE: position i is the pair (t[i], t[i+1]).
        if len(toks) > 1:
            pairs = list(zip(toks, toks[1:], strict=False))
            assert kvb.key_chain_eagle(toks, prior).hex() == get_hash_str(
                pairs, prior.hex() if prior else None)
            got = kvb.page_keys_eagle(toks, tpp, prior)
            h = prior.hex() if prior else None
            for p, k in enumerate(got):
                h = get_hash_str(pairs[p * tpp:(p + 1) * tpp], h)
                assert k.hex() == h


def test_token_containers() -> None:
    toks = list(range(100, 164))
    want = kvb.key_chain(toks)
    assert kvb.key_chain(tuple(toks)) == want
    assert kvb.key_chain(array.array("I", toks)) == want
    assert kvb.key_chain(array.array("q", toks)) == want
    assert kvb.key_chain(np.array(toks, np.int64)) == want
    assert kvb.key_chain(np.array(toks, np.uint32)) == want
    assert kvb.key_chain(np.array(toks, np.int32)) == want
    assert kvb.key_chain(range(100, 164)) == want
    torch = pytest.importorskip("torch")
    assert kvb.key_chain(torch.tensor(toks).numpy()) == want


def test_key_errors() -> None:
    with pytest.raises(OverflowError):
        kvb.key_chain([1 << 32])
    with pytest.raises(OverflowError):
        kvb.key_chain([-1])
    with pytest.raises(OverflowError):
        kvb.key_chain(np.array([-1], np.int64))
    with pytest.raises(TypeError):
        kvb.key_chain(b"bytes are not tokens")
    with pytest.raises(TypeError):
        kvb.key_chain(["a"])
    with pytest.raises(ValueError):
        kvb.key_chain([1], b"short parent")
    with pytest.raises(ValueError):
        kvb.page_keys([1, 2], 0)
    with pytest.raises(ValueError):
        kvb.key_chain_eagle([])
    with pytest.raises(ValueError):
        kvb.key_from_hex("abcd")
    with pytest.raises(ValueError):
        kvb.key_hex(b"x")
    k = kvb.key_chain([])
    assert kvb.key_from_hex(kvb.key_hex(k)) == k
    assert kvb.page_keys(list(range(10)), 4) == kvb.page_keys(list(range(8)), 4)  # full pages
