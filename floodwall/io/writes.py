"""Write batching shared by the proxy's own upstream clients (0-9-1 and AMQP 1.0).

A frame per ``StreamWriter.write`` is a syscall per frame; the spool's replayers send
thousands of small publishes a second. ``BatchedWrites`` gathers what a loop turn writes and
hands it to the socket once at the end of the turn (or at once past ``FLUSH_AT`` bytes).
Every write of a client goes through it, so the frames keep their order.
"""

from __future__ import annotations

import asyncio
import contextlib

FLUSH_AT = 65536


class BatchedWrites:
    """Mixed into a client that has ``_writer`` and ``closed_reason``; call ``_init_writes``
    in its ``__init__``. ``_can_write`` says whether a flush may still write."""

    _writer: asyncio.StreamWriter | None
    closed_reason: str | None

    def _init_writes(self) -> None:
        self._out: list[bytes] = []  # bytes not yet handed to the socket
        self._out_bytes = 0
        self._flush_scheduled = False

    def _can_write(self) -> bool:
        return self._writer is not None and self.closed_reason is None

    def write_buffered(self, data: bytes) -> None:
        """Queue bytes for the socket: written at the end of this loop turn (or at once
        past ``FLUSH_AT``)."""
        self._out.append(data)
        self._out_bytes += len(data)
        if self._out_bytes >= FLUSH_AT:
            self._flush()
        elif not self._flush_scheduled:
            self._flush_scheduled = True
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_scheduled = False
        if not self._out:
            return
        data, self._out, self._out_bytes = b"".join(self._out), [], 0
        if self._writer is not None and self._can_write():
            self._writer.write(data)

    def write_backlog(self) -> int:
        """Bytes written but not yet sent."""
        if self._writer is None:
            return 0
        return self._out_bytes + self._writer.transport.get_write_buffer_size()

    async def drain(self) -> None:
        """Until the socket took what was written (or the connection is gone)."""
        self._flush()
        if self._writer is not None and self.closed_reason is None:
            with contextlib.suppress(OSError, ConnectionError):
                await self._writer.drain()
