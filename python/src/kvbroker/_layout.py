# SPDX-License-Identifier: MIT
"""Layouts and namespace identity: what decides whether two processes' pages are the same bytes.

A :class:`Layout` is the Python side of ``struct kvb_layout`` plus ``struct kvb_ns_ident``
(kvbroker.h): the model, MLA or MHA, tokens per page, TP rank and size, up to four components
(main KV, indexer cache, draft KV...), and the identity fields engines fold into their keys:
KV dtype per component, the page byte format of whole-page puts, pipeline, context and
data-parallel rank and size. Validation happens here, so a bad layout fails with a message
naming the field before anything reaches the broker.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final

MLA: Final = "mla"
"""Latent KV, identical on every TP rank: one namespace per model, shared by all ranks."""
MHA: Final = "mha"
"""Per-rank KV shards: tp_size and tp_rank are part of the identity."""

_KINDS: Final = {MLA: 1, MHA: 2}

# enum kvb_dtype; each name and its torch spelling.
DTYPES: Final[dict[str, int]] = {
    "": 0,
    "fp16": 1, "float16": 1, "half": 1,
    "bf16": 2, "bfloat16": 2,
    "fp32": 3, "float32": 3, "float": 3,
    "fp8_e4m3": 4, "float8_e4m3fn": 4,
    "fp8_e5m2": 5, "float8_e5m2": 5,
    "fp8_e4m3fnuz": 6, "float8_e4m3fnuz": 6,
    "int8": 7,
    "uint8": 8,
    "fp4_e2m1": 9, "float4_e2m1fn_x2": 9,
}
"""dtype names (kvbroker's and torch's) and their ``enum kvb_dtype`` numbers."""


def dtype_code(dtype: object) -> int:
    """The ``enum kvb_dtype`` number of a dtype name or a ``torch.dtype`` ("" is unstated)."""
    if dtype is None:
        return 0
    name = str(dtype).lower()
    name = name.removeprefix("torch.")
    try:
        return DTYPES[name]
    except KeyError:
        raise ValueError(f"unknown KV dtype {dtype!r}; known: {sorted(DTYPES)}") from None


def _check_rank(what: str, size: int, rank: int) -> None:
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"{what}: need size >= 1 and 0 <= rank < size, got {rank}/{size}")


@dataclass(frozen=True)
class Component:
    """One KV component of a layout: ``num_layers`` layers of ``bytes_per_token_layer``."""

    name: str
    num_layers: int
    bytes_per_token_layer: int
    dtype: object = None
    """Element type of this component (a name or torch.dtype); None: the Layout's dtype."""

    def __post_init__(self) -> None:
        """Validates the fields."""
        if not self.name or len(self.name.encode()) >= 16:
            raise ValueError("Component.name: 1 to 15 bytes")
        if self.num_layers < 1 or self.bytes_per_token_layer < 1:
            raise ValueError("Component: num_layers and bytes_per_token_layer must be >= 1")
        if self.dtype is not None:
            dtype_code(self.dtype)


@dataclass(frozen=True)
class Layout:
    """A namespace's KV layout and identity (``struct kvb_layout`` + ``struct kvb_ns_ident``).

    Page bytes are ``[component][layer][token][bytes_per_token_layer]``, so
    ``page_bytes = tokens_per_page * sum(num_layers * bytes_per_token_layer)``. Two processes
    share pages only when every identity field agrees: for MLA the TP rank and size are not
    identity (all ranks share), for MHA they are; dp_rank/dp_size never are (DP replicas of a
    node share). ``page_format`` names the byte order of whole pages moved by put()/get()
    (e.g. "sglang:page_first"); leave it "" when pages move only through views.
    """

    model: str
    kind: str | int
    tokens_per_page: int
    components: Sequence[Component]
    tp_size: int = 1
    tp_rank: int = 0
    dtype: object = None
    """KV element type of every component without its own (name or torch.dtype)."""
    pp_size: int = 1
    pp_rank: int = 0
    cp_size: int = 1
    cp_rank: int = 0
    dp_size: int = 1
    dp_rank: int = 0
    page_format: str = ""
    byte_layout: str = field(default="", repr=False)
    """Deprecated alias of page_format (the first draft of the API named it so)."""

    def __post_init__(self) -> None:
        """Validates and normalizes (kind to "mla"/"mha", components to a tuple)."""
        kind = self.kind
        if isinstance(kind, int) and not isinstance(kind, bool):
            kind = {1: MLA, 2: MHA}.get(kind, "")
        kind = str(kind).lower()
        if kind not in _KINDS:
            raise ValueError(f"Layout.kind: 'mla' or 'mha', not {self.kind!r}")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "components", tuple(self.components))
        if self.byte_layout and not self.page_format:
            object.__setattr__(self, "page_format", self.byte_layout)
        if not self.model or len(self.model.encode()) >= 64:
            raise ValueError("Layout.model: 1 to 63 bytes")
        if not 1 <= len(self.components) <= 4:
            raise ValueError("Layout.components: 1 to 4 components")
        if self.tokens_per_page < 1:
            raise ValueError("Layout.tokens_per_page must be >= 1")
        if len(self.page_format.encode()) >= 32 or not self.page_format.isascii():
            raise ValueError("Layout.page_format: printable ASCII, at most 31 bytes")
        _check_rank("tp", self.tp_size, self.tp_rank)
        _check_rank("pp", self.pp_size, self.pp_rank)
        _check_rank("cp", self.cp_size, self.cp_rank)
        _check_rank("dp", self.dp_size, self.dp_rank)
        dtype_code(self.dtype)

    @property
    def page_bytes(self) -> int:
        """Bytes of one page of this layout."""
        return self.tokens_per_page * sum(
            c.num_layers * c.bytes_per_token_layer for c in self.components)

    @property
    def nparts(self) -> int:
        """(component, layer) pairs: how many ViewParts a view of it has."""
        return sum(c.num_layers for c in self.components)

    def _c_args(self) -> tuple[Any, ...]:
        comps = tuple(
            (c.name, c.num_layers, c.bytes_per_token_layer,
             dtype_code(c.dtype if c.dtype is not None else self.dtype))
            for c in self.components)
        # Size 1 goes as 0, so a default identity is all-zero: kvb_ns_open()'s namespace, which
        # brokers before ABI 1.2 serve too.
        def size(n: int) -> int:
            return n if n > 1 else 0

        return (self.model, _KINDS[str(self.kind)], self.tokens_per_page, self.tp_size,
                self.tp_rank, comps, self.page_format, size(self.pp_size), self.pp_rank,
                size(self.cp_size), self.cp_rank, size(self.dp_size), self.dp_rank)


def model_ns_name(name: str) -> str:
    """The namespace model name of an engine's model name, the rule every engine adapter
    follows so that SGLang and vLLM share pages: last path component, lowercase, at most 63
    bytes ("moonshotai/Kimi-K2.5" and "/models/Kimi-K2.5/" -> "kimi-k2.5"); a longer name
    keeps 46 bytes and a 16-digit SHA-256 suffix.
    """
    base = name.rstrip("/").rsplit("/", 1)[-1].lower() or "model"
    if len(base.encode()) <= 63:
        return base
    digest = hashlib.sha256(base.encode()).hexdigest()[:16]
    return base.encode()[:46].decode(errors="ignore") + "-" + digest
