"""Qpid Proton as an independent oracle: its bytes through our codec and core, ours through it."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import proton
import pytest
from proton import Collector, Data, Delivery, Event, Message, Transport

from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import HEADER_SIZE
from floodwall.wire.amqp10.performatives import TRANSFER, Role
from floodwall.wire.amqp10.types import (
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode,
    encode,
)
from floodwall.wire.relaycore import Side
from tests.amqp10.streams import Chunker, bytewise, random_chunks, split_frames, whole

# -- the codec against proton.Data ------------------------------------------------------------

# (our value, the same value as proton's Python types)
SAME_VALUES: list[tuple[object, object]] = [
    (None, None),
    (True, True),
    (UByte(200), proton.ubyte(200)),
    (UShort(60000), proton.ushort(60000)),
    (UInt(4_000_000_000), proton.uint(4_000_000_000)),
    (ULong(2**63), proton.ulong(2**63)),
    (Byte(-100), proton.byte(-100)),
    (Short(-30000), proton.short(-30000)),
    (Int(-2_000_000_000), proton.int32(-2_000_000_000)),
    (-(2**62), -(2**62)),
    (Float32(0.5), proton.float32(0.5)),
    (1e300, 1e300),
    (Decimal32(b"\x00\x00\x00\x07"), proton.decimal32(7)),
    (Decimal64(b"\x00" * 7 + b"\x08"), proton.decimal64(8)),
    (Decimal128(b"1" * 16), proton.decimal128(b"1" * 16)),
    (Char("\u00e9"), proton.char("\u00e9")),
    (Timestamp(1_700_000_000_000), proton.timestamp(1_700_000_000_000)),
    (uuid.UUID(int=12345), uuid.UUID(int=12345)),
    (b"\x00\xff" * 200, b"\x00\xff" * 200),
    ("snowman \u2603" * 40, "snowman \u2603" * 40),
    (Symbol("amqp:open:list"), proton.symbol("amqp:open:list")),
    ([UInt(1), "two", [None]], [proton.uint(1), "two", [None]]),
    ({Symbol("k"): {"n": 1}}, {proton.symbol("k"): {"n": 1}}),
    (
        Array(0xA3, (Symbol("PLAIN"), Symbol("ANONYMOUS"))),
        proton.Array(
            proton.UNDESCRIBED,  # type: ignore[arg-type]
            Data.SYMBOL,
            proton.symbol("PLAIN"),
            proton.symbol("ANONYMOUS"),
        ),
    ),
    (
        Described(ULong(0x10), ["container", None, UInt(512)]),
        proton.Described(proton.ulong(0x10), ["container", None, proton.uint(512)]),
    ),
]


def _to_ours(value: Any) -> object:
    """Proton's decoded Python value in our types, for comparison."""
    conversions: dict[type, Callable[[Any], object]] = {
        proton.ubyte: UByte,
        proton.ushort: UShort,
        proton.uint: UInt,
        proton.ulong: ULong,
        proton.byte: Byte,
        proton.short: Short,
        proton.int32: Int,
        proton.float32: Float32,
        proton.decimal32: lambda v: Decimal32(int(v).to_bytes(4, "big")),
        proton.decimal64: lambda v: Decimal64(int(v).to_bytes(8, "big")),
        proton.decimal128: Decimal128,
        proton.char: Char,
        proton.timestamp: Timestamp,
        proton.symbol: Symbol,
        memoryview: bytes,
    }
    if type(value) in conversions:
        return conversions[type(value)](value)
    if isinstance(value, list):
        return [_to_ours(item) for item in value]
    if isinstance(value, dict):
        return {_to_ours(k): _to_ours(v) for k, v in value.items()}
    if isinstance(value, proton.Described):
        return Described(_to_ours(value.descriptor), _to_ours(value.value))
    if isinstance(value, proton.Array):
        return Array(0xA3, tuple(_to_ours(item) for item in value.elements))
    return value


def _loose(value: object) -> object:
    """Arrays compared by element type, not width: proton always writes sym32, we sym8."""
    if isinstance(value, Array):
        return Array(value.code & 0xAF, value.items, value.descriptor)
    if isinstance(value, list):
        return [_loose(item) for item in value]
    if isinstance(value, dict):
        return {key: _loose(item) for key, item in value.items()}
    if isinstance(value, Described):
        return Described(value.descriptor, _loose(value.value))
    return value


def _proton_encode(value: object) -> bytes:
    data = Data()
    data.put_object(value)
    return bytes(data.encode())


def _proton_decode(wire: bytes) -> object:
    data = Data()
    data.decode(wire)
    data.rewind()
    data.next()
    return _to_ours(data.get_object())  # while ``data`` lives: binaries are views into it


@pytest.mark.parametrize(("ours", "theirs"), SAME_VALUES)
def test_we_decode_what_proton_encodes(ours: object, theirs: object) -> None:
    assert _loose(decode(_proton_encode(theirs))) == _loose(ours)


@pytest.mark.parametrize(("ours", "theirs"), SAME_VALUES)
def test_proton_decodes_what_we_encode(ours: object, theirs: object) -> None:
    assert _loose(_proton_decode(encode(ours))) == _loose(ours)


# -- the relay core between two proton endpoints -----------------------------------------------


class ProtonPair:
    """A proton client and server, each side's bytes relayed through our core."""

    def __init__(self, chunker: Chunker, server_max_frame: int = 32768) -> None:
        self.chunker = chunker
        self.client = proton.Connection()
        self.client.container = "proton-client"
        self.client.hostname = "broker"
        self.client_transport = Transport()
        self.client_transport.max_frame_size = 4096
        self.client_transport.sasl().allowed_mechs("ANONYMOUS")
        self.client_transport.bind(self.client)
        self.server = proton.Connection()
        self.server.container = "proton-server"
        self.server_events = Collector()
        self.server.collect(self.server_events)
        self.server_transport = Transport(Transport.SERVER)
        self.server_transport.max_frame_size = server_max_frame
        self.server_transport.sasl().allowed_mechs("ANONYMOUS")
        self.server_transport.bind(self.server)
        self.core: Connection | None = None
        self.sent = {Side.CLIENT: b"", Side.SERVER: b""}
        self.relayed = {Side.CLIENT: b"", Side.SERVER: b""}
        self.received: list[bytes] = []

    def pump(self) -> None:
        moved = True
        while moved:
            moved = self._move(Side.CLIENT) | self._move(Side.SERVER)
            self._serve()

    def _move(self, side: Side) -> bool:
        source = self.client_transport if side is Side.CLIENT else self.server_transport
        pending = source.pending()
        if pending <= 0:
            return False
        data = bytes(source.peek(pending) or b"")
        source.pop(pending)
        if self.core is None:  # what the I/O layer does with the client's first 8 bytes
            assert side is Side.CLIENT
            self.core = Connection(data[:HEADER_SIZE])
            self.server_transport.push(data[:HEADER_SIZE])
            data = data[HEADER_SIZE:]
        self.sent[side] += data
        for chunk in self.chunker(data):
            if side is Side.CLIENT:
                self.core.receive_from_client(chunk)
            else:
                self.core.receive_from_server(chunk)
            self._deliver()
        return True

    def _deliver(self) -> None:
        assert self.core is not None
        to_server, to_client = self.core.data_for_server(), self.core.data_for_client()
        if to_server:
            self.relayed[Side.CLIENT] += to_server
            self.server_transport.push(to_server)
        if to_client:
            self.relayed[Side.SERVER] += to_client
            self.client_transport.push(to_client)

    def _serve(self) -> None:
        """The server side's application: accept everything, give credit, read messages."""
        event: Any = self.server_events.peek()  # proton's stubs make every attribute optional
        while event is not None:
            if event.type == Event.CONNECTION_REMOTE_OPEN:
                event.connection.open()
            elif event.type == Event.SESSION_REMOTE_OPEN:
                event.session.open()
            elif event.type == Event.LINK_REMOTE_OPEN:
                link = event.link
                link.source.copy(link.remote_source)
                link.target.copy(link.remote_target)
                link.open()
                if link.is_receiver:
                    link.flow(10)
            elif event.type == Event.DELIVERY:
                delivery = event.delivery
                if delivery.link.is_receiver and not delivery.partial:
                    self.received.append(bytes(delivery.link.recv(delivery.pending)))
                    delivery.update(Delivery.ACCEPTED)
                    delivery.settle()
                    delivery.link.advance()
            elif event.type == Event.CONNECTION_REMOTE_CLOSE:
                event.connection.close()
            self.server_events.pop()
            event = self.server_events.peek()


CHUNKERS = [whole, bytewise, random_chunks(11, 50)]


@pytest.mark.parametrize("chunker", CHUNKERS, ids=["whole", "bytewise", "random"])
def test_a_real_proton_conversation_passes_unchanged(chunker: Chunker) -> None:
    pair = ProtonPair(chunker, server_max_frame=512)
    pair.client.open()
    session = pair.client.session()
    session.open()
    sender = session.sender("orders-sender")
    sender.target.address = "orders"
    sender.open()
    receiver = session.receiver("replies-receiver")
    receiver.source.address = "replies"
    receiver.open()
    pair.pump()
    assert sender.credit == 10
    body = bytes(range(256)) * 12  # 3 KiB: several 512-byte frames with more=true
    delivery = sender.delivery("tag-1")
    sender.send(Message(body=body).encode())
    sender.advance()
    pair.pump()
    assert delivery.remote_state == Delivery.ACCEPTED
    sender.close()
    receiver.close()
    session.close()
    pair.client.close()
    pair.pump()

    core = pair.core
    assert core is not None and core.failure is None
    assert pair.relayed == pair.sent  # byte-exact, in order, both directions
    message = Message()
    message.decode(pair.received[0])
    assert message.body == body
    assert pair.client.remote_condition is None
    assert not (pair.client.state & proton.Endpoint.REMOTE_ACTIVE)

    assert core.client.sasl_mechanism == "ANONYMOUS" and core.server.sasl_outcome == 0
    assert core.client.open is not None and core.server.open is not None
    assert core.client.open.container_id == "proton-client"
    assert core.client.open.max_frame_size == 4096
    assert core.server.open.max_frame_size == 512
    assert core.client.close is not None and core.server.close is not None
    transfers = [v for _, _, v in split_frames(pair.sent[Side.CLIENT]) if _is(v, TRANSFER)]
    assert len(transfers) >= 7  # the message was split across frames
    assert core.from_client.bytes == len(pair.sent[Side.CLIENT])


def test_links_seen_in_a_proton_conversation() -> None:
    pair = ProtonPair(whole)
    pair.client.open()
    session = pair.client.session()
    session.open()
    sender = session.sender("s")
    sender.target.address = "orders"
    sender.open()
    pair.pump()
    assert pair.core is not None
    ((channel, link),) = list(pair.core.client.links())
    assert (link.name, link.role, link.target_address) == ("s", Role.SENDER, "orders")
    ((_, mirror),) = list(pair.core.server.links())
    assert mirror.role is Role.RECEIVER
    assert pair.core.server.sessions[0].remote_channel == channel


def test_proton_understands_our_close_after_a_client_framing_error() -> None:
    pair = ProtonPair(whole)
    pair.client.open()
    pair.pump()
    core = pair.core
    assert core is not None
    core.receive_from_client(b"\x00\x00\x00\x03\x02\x00\x00\x00")  # a bad frame "from" it
    pair.client_transport.push(core.data_for_client())
    pair.server_transport.push(core.data_for_server())
    assert core.failure is not None and core.failure.side is Side.CLIENT
    assert pair.client.remote_condition is not None
    assert pair.client.remote_condition.name == "amqp:connection:framing-error"
    assert "smaller than the 8-byte" in (pair.client.remote_condition.description or "")
    pair._serve()
    assert pair.server.remote_condition is not None
    assert pair.server.remote_condition.name == "amqp:connection:forced"


def test_proton_accepts_our_open_and_close_before_the_servers_open() -> None:
    pair = ProtonPair(whole)
    pair.client.open()
    # Let SASL finish and the client's Open through, but hold the server's Open back.
    for _ in range(6):
        pair._move(Side.CLIENT)
        if pair.core is not None and pair.core.client.open is not None:
            break
        pair._move(Side.SERVER)
    core = pair.core
    assert core is not None and core.client.open is not None and core.server.open is None
    core.receive_from_client(b"\x00\x00\x00\x0c\x02\x00\x00\x00\x00\x53\x12\x45")  # bad attach
    pair.client_transport.push(core.data_for_client())
    assert core.failure is not None and core.failure.condition == "amqp:decode-error"
    assert pair.client.remote_container == "floodwall"
    assert pair.client.remote_condition is not None
    assert pair.client.remote_condition.name == "amqp:decode-error"


def _is(value: object, code: int) -> bool:
    return isinstance(value, Described) and value.descriptor == code
