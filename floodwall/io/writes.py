"""Write batching for the proxy's own upstream clients (0-9-1 and AMQP 1.0).

A frame per ``StreamWriter.write`` is a syscall per frame; the spool's replayers send
thousands of small publishes a second. ``BatchedWrites`` gathers what a loop turn writes and
hands it to the socket once at the end of the turn (or at once past ``FLUSH_AT`` bytes).
Every write of a client goes through it, so the frames keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

FLUSH_AT = 65536


class BatchedWrites:
    """A client's socket and what is written to it, a part each client owns: ``writer`` is
    the socket's once the client connected (None before); ``can_write`` (the client's) says
    whether a flush may still write to it."""

    def __init__(self, can_write: Callable[[], bool]) -> None:
        self.writer: asyncio.StreamWriter | None = None
        self.can_write = can_write
        self._out: list[bytes] = []  # bytes not yet handed to the socket
        self._out_bytes = 0
        self._flush_scheduled = False

    def write(self, data: bytes) -> None:
        """Queue bytes for the socket: written at the end of this loop turn (or at once
        past ``FLUSH_AT``)."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_AT:
            self.flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Hand what is queued to the socket now (dropped when it may not be written)."""
        self._flush_scheduled = False
        if not self._out:
            return
        data, self._out, self._out_bytes = b"".join(self._out), [], 0
        if self.writer is not None and self.can_write():
            self.writer.write(data)

    def backlog(self) -> int:
        """Bytes written but not yet sent."""
        if self.writer is None:
            return 0
        return self._out_bytes + self.writer.transport.get_write_buffer_size()

    async def drain(self, still_open: bool) -> None:
        """Until the socket took what was written (or, not ``still_open``, the connection is
        gone: nothing to wait for)."""
        self.flush()
        if self.writer is not None and still_open:
            with contextlib.suppress(OSError, ConnectionError):
                await self.writer.drain()
