"""A fault-injecting TCP relay for the chaos tests: put it between floodwall and the broker
(or its management API) and make the path slow, silent, cut or answer HTTP 500.

Runs its own event loop in a thread, so the tests (plain threads, blocking clients) drive it
with plain calls. No netem, no privileges.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
from collections.abc import Coroutine
from enum import Enum
from typing import Any

HTTP_500 = (b"HTTP/1.1 500 Internal Server Error\r\nContent-Type: application/json\r\n"
            b"Content-Length: 2\r\nConnection: close\r\n\r\n{}")


class Mode(Enum):
    PASS = "pass"  # relay everything
    SILENT = "silent"  # keep connections, forward nothing (a black hole)
    REFUSE = "refuse"  # new connections are closed at once (what a dead port looks like)
    HTTP_500 = "http_500"  # answer every HTTP request with 500


class FaultyRelay:
    """Listens on 127.0.0.1:``port``, relays to ``host:port`` as ``mode`` says; ``delay``
    seconds are added to every chunk in each direction (a slow network)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self.mode = Mode.PASS
        self.delay = 0.0
        self.connections = 0  # accepted so far
        self._loop = asyncio.new_event_loop()
        self._writers: set[asyncio.StreamWriter] = set()
        self._server: asyncio.Server | None = None
        self._flowing = asyncio.Event()  # set unless SILENT (touched on the relay's loop)
        self._flowing.set()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._thread.start()
        self.port = self._call(self._start())

    def _call(self, coro: Coroutine[Any, Any, Any]) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    async def _start(self) -> int:
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        sock: socket.socket = self._server.sockets[0]
        return int(sock.getsockname()[1])

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set(self, mode: Mode, delay: float | None = None) -> None:
        self.mode = mode
        if delay is not None:
            self.delay = delay
        flowing = mode is not Mode.SILENT
        self._loop.call_soon_threadsafe(self._flowing.set if flowing else self._flowing.clear)

    def cut(self) -> None:
        """Close every connection relayed now (both sides), as a network reset would."""
        async def cut_all() -> None:
            for w in list(self._writers):
                with contextlib.suppress(Exception):
                    w.transport.abort()
            self._writers.clear()
        self._call(cut_all())

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        if self.mode is Mode.REFUSE:
            writer.transport.abort()
            return
        if self.mode is Mode.HTTP_500:
            with contextlib.suppress(Exception):
                await reader.readuntil(b"\r\n\r\n")
                writer.write(HTTP_500)
                await writer.drain()
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(*self.target)
        except OSError:
            writer.transport.abort()
            return
        self._writers.update((writer, up_writer))
        await asyncio.gather(self._pipe(reader, up_writer), self._pipe(up_reader, writer),
                             return_exceptions=True)
        for w in (writer, up_writer):
            self._writers.discard(w)
            w.close()

    async def _pipe(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                data = await reader.read(65536)
                if not data:
                    break
                await self._flowing.wait()
                if self.delay:
                    await asyncio.sleep(self.delay)
                writer.write(data)
                await writer.drain()
        finally:
            with contextlib.suppress(Exception):
                writer.transport.abort() if self.mode is Mode.REFUSE else writer.close()

    def close(self) -> None:
        async def stop() -> None:
            if self._server is not None:
                self._server.close()
            for w in list(self._writers):
                w.transport.abort()
        with contextlib.suppress(Exception):
            self._call(stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
