"""Whatever a core or gate raises, the relay ends that one connection: both sides get the
protocol's internal error, one rate-limited line says why, both sockets close and the
connection leaves the live set (floodwall/io/relay.py ``_core_failed``).

The cores raise only their protocol errors for any input (tests/amqp091, tests/amqp10); this
is the net under a bug. The fault is injected with a core that raises on a marker frame, in
front of a TCP sink that stands in for the broker and records what it is sent."""

from __future__ import annotations

import asyncio
import logging
import struct
from typing import Any

import pytest
from pamqp import commands, frame

from floodwall.io import relay
from floodwall.io.relay import RelayedConnection, RelaySettings
from floodwall.io.upstreams import Upstreams
from floodwall.ops.logs import LogLimiter
from floodwall.ops.metrics import RelayStats
from floodwall.wire.amqp091.connection import Connection as Amqp091Connection
from floodwall.wire.amqp10.connection import Connection as Amqp10Connection
from floodwall.wire.detect import Detected
from tests.integration.support import close_condition, split_frames10

AMQP091 = b"AMQP\x00\x00\x09\x01"
AMQP10 = b"AMQP\x00\x01\x00\x00"
BURST = LogLimiter().burst  # lines a kind may log in a window
BOOM = struct.pack(">BHI", 8, 0, 0) + b"\xce"  # a heartbeat: the marker the faulty core trips on


class Faulty091(Amqp091Connection):
    def receive_from_client(self, data: bytes, now: float) -> None:
        if BOOM in data:
            raise struct.error("unpack_from requires a buffer of at least 14 bytes")
        super().receive_from_client(data, now)


class Faulty10(Amqp10Connection):
    def receive_from_client(self, data: bytes, now: float) -> None:
        if BOOM in data:
            raise IndexError("index out of range")
        super().receive_from_client(data, now)


def faulty_make_core(detected: Detected, header: bytes, conn_id: int = 0,
                     settings: RelaySettings | None = None) -> tuple[Any, None]:
    if detected is Detected.AMQP091:
        return Faulty091(None, conn_id), None
    return Faulty10(header), None


class Sink:
    """A TCP server standing in for the broker: keeps what each connection sent until EOF."""

    def __init__(self) -> None:
        self.received: list[bytes] = []
        self.ended = asyncio.Event()
        self.server: asyncio.Server | None = None

    async def start(self) -> int:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        return int(self.server.sockets[0].getsockname()[1])

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.received.append(await reader.read())  # until EOF: the relay closed its side
        writer.close()
        self.ended.set()


async def relay_once(monkeypatch: pytest.MonkeyPatch, first: bytes, later: bytes = b"",
                     stats: RelayStats | None = None) -> tuple[bytes, bytes, RelayStats]:
    """One client through a relay with the faulty core: ``first`` as its first packet,
    ``later`` once the upstream is connected; what the client and the sink got."""
    monkeypatch.setattr(relay, "make_core", faulty_make_core)
    sink = Sink()
    port = await sink.start()
    stats = stats if stats is not None else RelayStats()
    settings = RelaySettings(Upstreams([("127.0.0.1", port)]), handshake_timeout=5.0)
    ids = iter(range(1, 100))
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: RelayedConnection(settings, stats, next(ids)), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(first)
    if later:
        await asyncio.sleep(0)
        for _ in range(200):  # until the relay has its upstream (the live set shows it)
            conns = [c for c in stats.live if isinstance(c, RelayedConnection)]
            if conns and conns[0].upstream is not None:
                break
            await asyncio.sleep(0.01)
        writer.write(later)
    got = await asyncio.wait_for(reader.read(), 10)  # EOF: the relay closed the client
    await asyncio.wait_for(sink.ended.wait(), 10)
    writer.close()
    server.close()
    assert sink.server is not None
    sink.server.close()
    return got, sink.received[0], stats


def close_of(data: bytes) -> commands.Connection.Close:
    _, channel, value = frame.unmarshal(data)
    assert channel == 0 and isinstance(value, commands.Connection.Close)
    return value


@pytest.mark.parametrize("when", ["first packet", "after connecting"])
def test_a_core_that_raises_closes_that_connection_on_both_sides_091(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, when: str) -> None:
    first, later = (AMQP091 + BOOM, b"") if when == "first packet" else (AMQP091, BOOM)
    with caplog.at_level(logging.INFO, logger="floodwall.relay"):
        got, upstream, stats = asyncio.run(relay_once(monkeypatch, first, later))
    to_client = close_of(got)
    assert to_client.reply_code == 541
    assert "floodwall could not relay this connection (error)" in to_client.reply_text
    assert upstream.startswith(AMQP091)
    assert close_of(upstream[len(AMQP091):]).reply_code == 541
    assert not stats.live
    assert stats.internal_errors["amqp091"] == 1
    lines = [r for r in caplog.records if r.getMessage() == "relay_internal_error"]
    assert len(lines) == 1
    line = lines[0].__dict__
    assert line["where"] == ("upstream_connected" if when == "first packet"
                             else "receive_from_client")
    assert line["error"] == "error: unpack_from requires a buffer of at least 14 bytes"
    assert not any(r.exc_info for r in caplog.records if r.levelno >= logging.INFO)


def test_a_core_that_raises_closes_a_10_connection_with_internal_error(
        monkeypatch: pytest.MonkeyPatch) -> None:
    got, upstream, stats = asyncio.run(relay_once(monkeypatch, AMQP10 + BOOM))
    assert not stats.live and stats.internal_errors["amqp10"] == 1
    # The broker's header and open have not passed: the client gets them from the proxy,
    # as the spec wants an open before a close.
    assert got.startswith(AMQP10)
    _, frames = split_frames10(got[len(AMQP10):])
    assert [f.performative for f in frames] == ["open", "close"]
    assert close_condition(frames) == "amqp:internal-error"
    assert upstream == AMQP10  # the client's open never went: no close for the broker


def test_internal_errors_are_logged_once_a_kind_every_10_seconds(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    stats = RelayStats()

    async def many() -> None:
        for _ in range(BURST + 3):
            await relay_once(monkeypatch, AMQP091 + BOOM, stats=stats)

    with caplog.at_level(logging.INFO, logger="floodwall.relay"):
        asyncio.run(many())
    lines = [r for r in caplog.records if r.getMessage() == "relay_internal_error"]
    assert len(lines) == BURST
    assert stats.internal_errors["amqp091"] == BURST + 3 and not stats.live
    assert stats.log_limits.suppressed == {"relay_internal_error": 3}
