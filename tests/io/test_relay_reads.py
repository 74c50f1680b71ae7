"""How the relay reads its sockets (``floodwall.io.relay``): libuv reads into the buffer of
``READ_SIZE`` both protocols hand it (``get_buffer``; of a client, ``EARLY_READ_SIZE`` of
it before its upstream is there and ``GATED_READ_SIZE`` when a gate may hold what it reads),
and each read reaches the core as bytes of its own, copied out at once, or, large and for a
connection that lends (a core that takes views, no gate), as a read-only view of a buffer no
later read goes into: the next read, on this connection or another, changes nothing the core
keeps."""

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

    def data_received(self, data: bytes | memoryview) -> None:
        self.got.append(data)

    def server_data(self, data: bytes | memoryview) -> None:
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


def test_a_large_read_is_lent_to_a_connection_that_lends_and_no_later_read_changes_it() -> None:
    lending, other = Recording(), Recording()
    lending._lend = True  # as _detect sets it: a 0-9-1 core, no gate
    lending.upstream = other.upstream = cast(asyncio.Transport, object())
    upstream = UpstreamSide(lending)
    _read(lending, b"\x05" * READ_SIZE)
    _read(upstream, b"\x06" * (READ_SIZE // 2))  # the broker's side lends too
    _read(other, b"\x07" * READ_SIZE)  # a connection that does not: copied
    _read(lending, b"\x08" * 100)  # small: copied
    first, small = lending.got
    (from_server,) = lending.server
    assert type(first) is memoryview and first.readonly
    assert type(from_server) is memoryview and from_server.readonly
    assert first.obj is not from_server.obj  # each lent read has a buffer of its own
    assert bytes(first) == b"\x05" * READ_SIZE
    assert bytes(from_server) == b"\x06" * (READ_SIZE // 2)
    assert other.got == [b"\x07" * READ_SIZE] and small == b"\x08" * 100
