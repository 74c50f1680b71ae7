"""The client's protocol header and what it pipelined behind it reach the broker in one write.

RabbitMQ 4 answers an AMQP 1.0 header without SASL with its own SASL header and resets the
socket at once. Had the proxy written the header, then the client's open in a second write,
a reset arriving between the two would fail that write and end the upstream before the
broker's answer was read: the client saw its connection cut (python-qpid-proton: "no
protocol header found (connection aborted)") instead of the broker's answer, in 5-12 % of
connections on a loaded machine. The proxy's writes to the broker are recorded here, in
front of a broker that answers the way RabbitMQ 4 does."""

from __future__ import annotations

import asyncio
import socket
import struct
from typing import Any

import pytest

from floodwall.io import relay
from floodwall.io.relay import RelayedConnection, RelaySettings
from floodwall.io.upstreams import Upstreams
from floodwall.ops.metrics import RelayStats
from tests.amqp10.streams import open_

AMQP10 = b"AMQP\x00\x01\x00\x00"
SASL10 = b"AMQP\x03\x01\x00\x00"


class RecordedWrites:
    """An upstream transport that records each write the relay makes, and makes it."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.writes: list[bytes] = []

    def write(self, data: Any) -> None:
        self.writes.append(bytes(data))
        self.inner.write(data)

    def writelines(self, pieces: Any) -> None:
        pieces = list(pieces)
        self.writes.append(b"".join(bytes(p) for p in pieces))
        self.inner.writelines(pieces)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


async def through_the_relay(monkeypatch: pytest.MonkeyPatch, first: bytes
                            ) -> tuple[bytes, list[bytes]]:
    """A client sends ``first`` in one packet to a relay in front of a broker that answers
    any header with the SASL header and resets; what the client read until the end, and the
    relay's writes to the broker."""
    recorded: list[RecordedWrites] = []
    made = relay.UpstreamSide.connection_made

    def recording(self: relay.UpstreamSide, transport: Any) -> None:
        recorded.append(RecordedWrites(transport))
        made(self, recorded[-1])

    monkeypatch.setattr(relay.UpstreamSide, "connection_made", recording)

    async def refuse(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.readexactly(8)
        writer.write(SASL10)
        await writer.drain()
        sock = writer.get_extra_info("socket")
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        writer.transport.abort()  # a reset, as RabbitMQ's

    broker = await asyncio.start_server(refuse, "127.0.0.1", 0)
    port = int(broker.sockets[0].getsockname()[1])
    settings = RelaySettings(Upstreams([("127.0.0.1", port)]), handshake_timeout=5.0)
    stats = RelayStats()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: RelayedConnection(settings, stats, 1),
                                      "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection(
        "127.0.0.1", server.sockets[0].getsockname()[1])
    writer.write(first)
    got = await asyncio.wait_for(reader.read(), 10)  # until the relay closes
    writer.close()
    server.close()
    broker.close()
    assert len(recorded) == 1
    return got, recorded[0].writes


def test_the_header_and_the_pipelined_open_go_to_the_broker_in_one_write(
        monkeypatch: pytest.MonkeyPatch) -> None:
    first = AMQP10 + open_("client")
    got, writes = asyncio.run(through_the_relay(monkeypatch, first))
    assert writes[0] == first
    assert got == SASL10  # the broker's answer reached the client


def test_a_header_alone_goes_as_it_is(monkeypatch: pytest.MonkeyPatch) -> None:
    got, writes = asyncio.run(through_the_relay(monkeypatch, AMQP10))
    assert writes == [AMQP10]
    assert got == SASL10
