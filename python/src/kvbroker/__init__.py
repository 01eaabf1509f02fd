# SPDX-License-Identifier: MIT
"""kvbroker: the Python client of kvbrokerd, the node-local KV-cache page store.

::

    import kvbroker as kvb

    with kvb.connect() as c:                       # $KVB_SOCKET, or socket="/run/..."
        ns = c.ns_open(kvb.Layout("kimi-k2.5", kvb.MLA, 64, [kvb.Component("kv", 61, 1152)]))
        keys = kvb.page_keys(token_ids, 64)        # SHA-256 chain, as SGLang's get_hash_str
        buf = c.alloc_host(ns.page_bytes)          # broker-shared memory: zero-copy
        ns.put(keys[0], buf)                       # True stored, False already there
        hits = ns.lookup(keys)                     # leading pages stored
        ns.get_into(keys[0], buf)                  # False: not stored

Every call that waits on the broker releases the GIL. Failures raise :class:`Error` (an
OSError with the C API's errno and kvb_strerror's text; a failed connect's names the socket,
the cause and the fix: :class:`NoBroker` says where it looked and how to start a broker, a
permission refused says which uid and group the broker admits and how to join); a page that
is not stored is an answer (None / False), never an exception. The socket is ``socket=``,
else $KVB_SOCKET, else /run/kvbroker/kvbroker.sock (:func:`socket_path`), as for kvbctl.
Importing this package imports neither numpy nor torch.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, NamedTuple

from . import _kvbroker
from ._kvbroker import (
    CQEF_EXISTED,
    OP_ACQUIRE,
    OP_DELETE,
    OP_GET,
    OP_NOP,
    OP_PREFETCH,
    OP_PUT,
    OP_RELEASE,
    OPF_ASYNC,
    OPF_PARENT,
    OPF_VIEW,
    TIER_DISK,
    TIER_NONE,
    TIER_RAM,
    TIER_REMOTE,
    BrokerGone,
    ClientClosed,
    Error,
    ForkedClient,
    GpuBuffer,
    HostBuffer,
    Lease,
    Namespace,
    NoBroker,
    PoolFull,
    Timeout,
    View,
    key_chain,
    key_chain_eagle,
    page_keys,
    page_keys_eagle,
    socket_path,
    strerror,
)
from ._layout import DTYPES, MHA, MLA, Component, Layout, dtype_code

__all__ = [
    "CQEF_EXISTED", "DTYPES", "MHA", "MLA", "OPF_ASYNC", "OPF_PARENT", "OPF_VIEW",
    "OP_ACQUIRE", "OP_DELETE", "OP_GET", "OP_NOP", "OP_PREFETCH", "OP_PUT", "OP_RELEASE",
    "TIER_DISK", "TIER_NONE", "TIER_RAM", "TIER_REMOTE",
    "BrokerGone", "Client", "ClientClosed", "Completion", "Component", "Error", "ForkedClient",
    "GpuBuffer", "HostBuffer", "Layout", "Lease", "Namespace", "NoBroker", "Op", "PoolFull",
    "Timeout", "View", "ViewPart", "connect", "dtype_code", "key_chain", "key_chain_eagle",
    "key_from_hex", "key_hex", "page_keys", "page_keys_eagle", "page_keys_hex", "socket_path",
    "strerror", "version",
]

# kvbroker's one version (include/kvbroker.h), from the library compiled into the extension.
__version__: str = _kvbroker.version()


def version() -> str:
    """The version of the libkvbroker compiled into this package, "major.minor.patch": the
    same as __version__, the package metadata's, and kvbrokerd --version's of the same build.
    """
    return _kvbroker.version()


class Op(NamedTuple):
    """One low-level operation for :meth:`Client.submit` (``struct kvb_op``).

    buf is a buffer id (HostBuffer.id, GpuBuffer.id) and off a byte offset in it, or with
    ``flags=OPF_VIEW`` a view id and a token slot; for RELEASE off is the lease id.
    ``OPF_ASYNC`` leaves the op to the broker where submit() could copy it itself (a view GET
    of a page the pool directory lists): for callers that work while it loads.
    user_data comes back in the Completion (below 2**63: the top bit is the package's).
    """

    opcode: int
    flags: int = 0
    ns: int = 0
    buf: int = 0
    key: bytes = bytes(32)
    off: int = 0
    layer_first: int = 0
    layer_count: int = 0
    user_data: int = 0
    parent: bytes | None = None  # a PUT's parent key: sets OPF_PARENT (chains kept whole)


class Completion(NamedTuple):
    """A reaped completion: res >= 0 success, else a negative errno; lease for ACQUIRE."""

    user_data: int
    res: int
    flags: int
    lease: Lease | None


class ViewPart(NamedTuple):
    """Where one (component, layer) of a view lives: token slot s at ``buf + base +
    (s // tokens_per_page) * page_stride + (s % tokens_per_page) * stride`` (page_stride 0:
    tokens_per_page * stride).
    """

    buf: HostBuffer | GpuBuffer | int
    stride: int
    base: int = 0
    page_stride: int = 0


class Client(_kvbroker.Client):
    """A connection to the node's kvbrokerd (``kvb_connect``); see :func:`connect`.

    Client(socket=None, *, name=None, gpu_busid=None, numa_node=None, sq_entries=0,
    control=False, reconnect=True, reconnect_ms=0). socket None means $KVB_SOCKET, then
    /run/kvbroker/kvbroker.sock (:func:`socket_path`). gpu_busid (as cudaDeviceGetPCIBusId
    writes it) or numa_node place this client's new pages in the nearest NUMA arena. A context
    manager; close() is idempotent and waits for calls other threads have in flight. Threads may
    share a client (calls are serialized in the C library; open one client per thread for
    parallel I/O). After fork() the child must connect again: the parent's client raises
    ForkedClient there.

    Broker restarts (a crash, a hand-over): the call in progress raises BrokerGone; a later
    call reconnects by itself (backoff 1 ms to 200 ms) and re-opens the namespaces, buffers
    (host and GPU) and views, which keep their ids and Python objects; pages the new broker
    adopted are served again. While no broker answers, calls raise BrokerGone at once, or
    with reconnect_ms keep trying for up to that many milliseconds first (holding the
    client: other threads' calls on it wait too). reconnect=False: every call after the loss
    raises BrokerGone (connect a new Client). See include/kvbroker.h "Broker restarts".
    """

    def stats(self) -> dict[str, Any]:
        """The broker's statistics (kvb_stats_json) as a dict."""
        result: dict[str, Any] = json.loads(self.stats_json())
        return result

    def submit(self, ops: Sequence[Op | tuple[Any, ...]]) -> int:
        """Queues ops and rings the broker once; returns how many were queued."""
        return super().submit(ops)

    def reap(self, max: int = 64, min: int = 1, timeout_ms: int = -1) -> list[Completion]:
        """Up to max completions of submitted ops, waiting for min of them (GIL released);
        after timeout_ms what has come (maybe none). Reapers take turns: while one waits,
        batches (put_many, get_many, views') of other threads on this client wait too.
        """
        return [Completion(*t) for t in super().reap(max, min, timeout_ms)]

    def __repr__(self) -> str:
        """Shows whether the client is open."""
        return f"<kvbroker.Client {'closed' if self.closed else 'open'}>"


def connect(socket: str | None = None, *, name: str | None = None,
            gpu_busid: str | None = None, numa_node: int | None = None,
            sq_entries: int = 0, control: bool = False, reconnect: bool = True,
            reconnect_ms: int = 0) -> Client:
    """Connects to the broker: ``Client(...)``, usable as ``with kvb.connect() as c:``."""
    return Client(socket, name=name, gpu_busid=gpu_busid, numa_node=numa_node,
                  sq_entries=sq_entries, control=control, reconnect=reconnect,
                  reconnect_ms=reconnect_ms)


def key_hex(key: bytes) -> str:
    """A key as SGLang's get_hash_str() writes it: 64 lowercase hex digits."""
    if len(key) != 32:
        raise ValueError("a key is exactly 32 bytes")
    return bytes(key).hex()


def key_from_hex(s: str) -> bytes:
    """The 32-byte key of a 64-digit hex string (SGLang's hash strings)."""
    k = bytes.fromhex(s)
    if len(k) != 32:
        raise ValueError("a key is 64 hex digits")
    return k


def page_keys_hex(tokens: Any, tokens_per_page: int, parent: bytes | str | None = None,
                  ) -> list[str]:
    """:func:`page_keys` as SGLang hash strings; parent may be a hash string too."""
    if isinstance(parent, str):
        parent = key_from_hex(parent)
    return [k.hex() for k in page_keys(tokens, tokens_per_page, parent)]
