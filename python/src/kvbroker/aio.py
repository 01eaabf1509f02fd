# SPDX-License-Identifier: MIT
"""asyncio front end: page ops awaited on the client's completion fd, no thread per wait.

One reader on :meth:`Client.completion_fd` (level-triggered) reaps every completion and
resolves the future of its op by user_data, so any number of coroutines can have ops in
flight on one client. Ops need registered memory (HostBuffer, GpuBuffer, or memory inside
them: the broker addresses it by buffer id and offset); any other memory runs the
synchronous call in the loop's default executor instead, with the GIL released there too.

Use it from the thread that runs the loop; one AsyncClient per client and loop. Give it a
client of its own when other threads run put_many()/get_many()/views' batches: a batch that
reaps an AsyncClient op's completion keeps it for reap() (nothing is lost), but the
completion fd does not see it, so the loop would only notice it at its next wake-up.
"""

from __future__ import annotations

import asyncio
import errno as _errno
import itertools
from collections.abc import Sequence
from typing import Any

from . import (
    CQEF_EXISTED,
    OP_GET,
    OP_NOP,
    OP_PUT,
    BrokerGone,
    Client,
    Completion,
    Error,
    Namespace,
    Op,
    PoolFull,
    Timeout,
    strerror,
)

__all__ = ["AsyncClient", "error_of"]

_TYPES: dict[int, type[Error]] = {
    _errno.ECONNRESET: BrokerGone,
    _errno.ENOSPC: PoolFull,
    _errno.ETIMEDOUT: Timeout,
}


def error_of(res: int) -> Error:
    """The exception for a completion's negative errno, as the synchronous calls raise it."""
    err = -res
    return _TYPES.get(err, Error)(err, strerror(err))


class AsyncClient:
    """Awaitable page ops over a :class:`~kvbroker.Client`'s completion fd."""

    def __init__(self, client: Client, loop: asyncio.AbstractEventLoop | None = None) -> None:
        """Adds a reader for the client's completion fd to loop (default: the running one)."""
        self.client = client
        self.loop = loop or asyncio.get_running_loop()
        self._fd = client.completion_fd()
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[Completion]] = {}
        self.loop.add_reader(self._fd, self._on_readable)

    def close(self) -> None:
        """Removes the reader; ops still in flight fail with ClientClosed-like Error."""
        self.loop.remove_reader(self._fd)
        for fut in self._waiting.values():
            if not fut.done():
                fut.set_exception(Error(_errno.ECANCELED, "AsyncClient closed"))
        self._waiting.clear()

    def _on_readable(self) -> None:
        try:
            while True:
                done = self.client.reap(64, 0, 0)
                if not done:
                    return
                for c in done:
                    fut = self._waiting.pop(c.user_data, None)
                    if fut is not None and not fut.done():
                        fut.set_result(c)
        except Error as e:
            for fut in self._waiting.values():
                if not fut.done():
                    fut.set_exception(e)
            self._waiting.clear()

    async def run(self, ops: Sequence[Op]) -> list[Completion]:
        """Submits ops (their user_data replaced) and waits for all their completions."""
        futs: list[asyncio.Future[Completion]] = []
        tagged = []
        for op in ops:
            ud = next(self._ids)
            fut: asyncio.Future[Completion] = self.loop.create_future()
            self._waiting[ud] = fut
            futs.append(fut)
            tagged.append(op._replace(user_data=ud))
        try:
            while tagged:
                n = self.client.submit(tagged)
                tagged = tagged[n:]
                if tagged:
                    await asyncio.sleep(0)  # ring full: let completions drain
        except BaseException:
            # Nobody waits for this batch now: what was not queued will never complete, and
            # what was finds its future cancelled.
            for op in tagged:
                self._waiting.pop(op.user_data, None)
            for f in futs:
                f.cancel()
            raise
        return list(await asyncio.gather(*futs))

    async def _one(self, op: Op) -> Completion:
        (c,) = await self.run([op])
        return c

    async def nop(self) -> None:
        """A round trip through the rings."""
        c = await self._one(Op(OP_NOP))
        if c.res < 0:
            raise error_of(c.res)

    async def put(self, ns: Namespace, key: bytes, src: Any) -> bool:
        """:meth:`Namespace.put`, awaited: True stored, False already stored."""
        loc = self.client.locate(src)
        if loc is None:
            return await self.loop.run_in_executor(None, ns.put, key, src)
        if loc[2] != ns.page_bytes:
            raise ValueError(f"src is {loc[2]} bytes; a page is {ns.page_bytes}")
        c = await self._one(Op(OP_PUT, ns=ns.id, buf=loc[0], key=key, off=loc[1]))
        if c.res < 0:
            raise error_of(c.res)
        return not c.flags & CQEF_EXISTED

    async def get_into(self, ns: Namespace, key: bytes, out: Any) -> bool:
        """:meth:`Namespace.get_into`, awaited: False when the page is not stored."""
        loc = self.client.locate(out)
        if loc is None:
            return await self.loop.run_in_executor(None, ns.get_into, key, out)
        if loc[2] < ns.page_bytes:
            raise ValueError(f"out is {loc[2]} bytes; a page is {ns.page_bytes}")
        c = await self._one(Op(OP_GET, ns=ns.id, buf=loc[0], key=key, off=loc[1]))
        if c.res == -_errno.ENOENT:
            return False
        if c.res < 0:
            raise error_of(c.res)
        return True
