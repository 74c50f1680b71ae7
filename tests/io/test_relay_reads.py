"""How the relay reads its sockets (``floodwall.io.relay``): libuv reads into the one buffer
of ``READ_SIZE`` both protocols hand it (``get_buffer``; of a client, ``EARLY_READ_SIZE`` of
it before its upstream is there and ``GATED_READ_SIZE`` when a gate may hold what it reads),
and each read reaches the core as bytes of its own, copied out at once, so the next read into
the same buffer, on this connection or another, changes nothing the core keeps."""

from __future__ import annotations

import asyncio
from typing import cast

from floodwall.enforce.shared import ConnectionGate
from floodwall.io.relay import (
    EARLY_READ_SIZE,
    GATED_READ_SIZE,
    READ_SIZE,
    RelayedConnection,
    RelaySettings,
    UpstreamSide,
)
from floodwall.io.upstreams import Upstreams
from floodwall.ops.metrics import RelayStats


class Recording(RelayedConnection):
    """A connection that keeps what reaches its core from each side."""

    def __init__(self) -> None:
        super().__init__(RelaySettings(Upstreams([("127.0.0.1", 5672)])), RelayStats(), 1)
        self.got: list[object] = []
        self.server: list[object] = []

    def data_received(self, data: bytes) -> None:
        self.got.append(data)

    def server_data(self, data: bytes) -> None:
        self.server.append(data)


def _read(protocol: asyncio.BufferedProtocol, data: bytes) -> None:
    """What libuv does for one read: a buffer from the protocol, the bytes into it."""
    buf = protocol.get_buffer(-1)
    assert len(buf) >= len(data)
    buf[: len(data)] = data
    protocol.buffer_updated(len(data))


def test_each_read_reaches_the_core_as_bytes_of_its_own() -> None:
    client, other = Recording(), Recording()
    upstream = UpstreamSide(client)
    # before its upstream is there, what a client sends waits in the proxy: a small read
    assert len(client.get_buffer(-1)) == EARLY_READ_SIZE < READ_SIZE
    client.upstream = other.upstream = cast(asyncio.Transport, object())
    assert len(client.get_buffer(-1)) == READ_SIZE
    # with policies its gate may hold what it reads: the budgets count a read of this
    gated = Recording()
    gated.upstream = client.upstream
    gated.gate = cast(ConnectionGate, object())
    assert len(gated.get_buffer(-1)) == GATED_READ_SIZE < READ_SIZE
    assert len(UpstreamSide(gated).get_buffer(-1)) == READ_SIZE  # the broker's side: whole
    assert client.get_buffer(-1).obj is upstream.get_buffer(-1).obj  # one buffer for all
    _read(client, b"\x01" * 1000)
    _read(other, b"\x02" * 10)  # another connection's read, into the same buffer
    _read(upstream, b"\x03" * 50)
    _read(client, b"\x04" * READ_SIZE)  # a whole buffer's read
    assert client.got == [b"\x01" * 1000, b"\x04" * READ_SIZE]
    assert other.got == [b"\x02" * 10] and client.server == [b"\x03" * 50]
    assert all(type(x) is bytes for x in (*client.got, *other.got, *client.server))
