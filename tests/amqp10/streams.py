"""Builders of realistic AMQP 1.0 byte streams and a driver that relays them through the core."""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from floodwall.wire.amqp10.connection import Connection
from floodwall.wire.amqp10.framing import AMQP_FRAME, AMQP_HEADER, SASL_FRAME, SASL_HEADER, frame
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SASL_INIT,
    SASL_MECHANISMS,
    SASL_OUTCOME,
    SOURCE,
    TARGET,
    TRANSFER,
    composite_fields,
    encode_performative,
    performative,
)
from floodwall.wire.amqp10.types import (
    Array,
    Described,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
    decode_value,
    encode,
)
from floodwall.wire.relaycore import Side

EMPTY_FRAME = frame(b"")
ACCEPTED = Described(ULong(0x24), [])


def sasl(code: int, /, **fields: object) -> bytes:
    return frame(encode_performative(code, **fields), 0, SASL_FRAME)


def amqp(code: int, channel: int = 0, payload: bytes = b"", /, **fields: object) -> bytes:
    return frame(encode_performative(code, **fields) + payload, channel, AMQP_FRAME)


def data_section(body: bytes) -> bytes:
    return encode(Described(ULong(0x75), body))


def open_(container: str, max_frame_size: int | None = None, **fields: object) -> bytes:
    mfs = None if max_frame_size is None else UInt(max_frame_size)
    return amqp(OPEN, container_id=container, max_frame_size=mfs, **fields)


def begin(channel: int, remote_channel: int | None = None) -> bytes:
    remote = None if remote_channel is None else UShort(remote_channel)
    return amqp(
        BEGIN,
        channel,
        remote_channel=remote,
        next_outgoing_id=UInt(0),
        incoming_window=UInt(2048),
        outgoing_window=UInt(2048),
    )


def attach(channel: int, name: str, handle: int, receiver: bool, address: str) -> bytes:
    """A sender attaches with a target address, a receiver with a source address."""
    source = performative(SOURCE, address=None if not receiver else address)
    target = performative(TARGET, address=address if not receiver else None)
    return amqp(
        ATTACH,
        channel,
        name=name,
        handle=UInt(handle),
        role=receiver,
        snd_settle_mode=UByte(0),
        rcv_settle_mode=UByte(0),
        source=source,
        target=target,
        initial_delivery_count=None if receiver else UInt(0),
    )


def flow(channel: int, handle: int, credit: int) -> bytes:
    return amqp(
        FLOW,
        channel,
        next_incoming_id=UInt(0),
        incoming_window=UInt(2048),
        next_outgoing_id=UInt(0),
        outgoing_window=UInt(2048),
        handle=UInt(handle),
        delivery_count=UInt(0),
        link_credit=UInt(credit),
    )


def transfer(channel: int, handle: int, delivery: int, payload: bytes, more: bool = False) -> bytes:
    return amqp(
        TRANSFER,
        channel,
        payload,
        handle=UInt(handle),
        delivery_id=UInt(delivery),
        delivery_tag=delivery.to_bytes(4, "big"),
        message_format=UInt(0),
        more=more or None,
    )


def continuation(channel: int, handle: int, payload: bytes, more: bool) -> bytes:
    """A later frame of a multi-frame delivery: only the handle (and ``more``)."""
    return amqp(TRANSFER, channel, payload, handle=UInt(handle), more=more or None)


def disposition(channel: int, receiver: bool, first: int, last: int) -> bytes:
    return amqp(
        DISPOSITION,
        channel,
        role=receiver,
        first=UInt(first),
        last=UInt(last),
        settled=True,
        state=ACCEPTED,
    )


def detach(channel: int, handle: int) -> bytes:
    return amqp(DETACH, channel, handle=UInt(handle), closed=True)


def end(channel: int) -> bytes:
    return amqp(END, channel)


def close() -> bytes:
    return amqp(CLOSE)


@dataclass(frozen=True)
class Conversation:
    """A whole connection as the ordered byte blocks each peer sends."""

    first_header: bytes
    events: tuple[tuple[Side, bytes], ...]

    def sent_by(self, side: Side) -> bytes:
        return b"".join(data for who, data in self.events if who is side)


def conversation(use_sasl: bool = True, server_max_frame: int = 16384) -> Conversation:
    """SASL PLAIN, open, begin, a sender and a receiver link, transfers (one multi-frame),
    heartbeats, dispositions, then detach, end and close from both sides."""
    mechanisms = Array(0xA3, (Symbol("PLAIN"), Symbol("ANONYMOUS")))
    message = data_section(b"hello")
    big = data_section(bytes(range(256)) * 8)  # 2 KiB: three frames
    pieces = [big[:800], big[800:1600], big[1600:]]
    events: list[tuple[Side, bytes]] = []
    if use_sasl:
        events += [
            (Side.SERVER, SASL_HEADER + sasl(SASL_MECHANISMS, sasl_server_mechanisms=mechanisms)),
            (
                Side.CLIENT,
                sasl(
                    SASL_INIT,
                    mechanism=Symbol("PLAIN"),
                    initial_response=b"\x00guest\x00guest",
                    hostname="broker",
                ),
            ),
            (Side.SERVER, sasl(SASL_OUTCOME, code=UByte(0))),
            (Side.CLIENT, AMQP_HEADER),
        ]
    events += [
        (
            Side.CLIENT,
            open_("client-1", 65536, channel_max=UShort(255), idle_time_out=UInt(30000))
            + begin(0)
            + attach(0, "orders-sender", 0, False, "orders")
            + attach(0, "replies-receiver", 1, True, "replies"),
        ),
        (
            Side.SERVER,
            AMQP_HEADER
            + open_("broker-1", server_max_frame, channel_max=UShort(64))
            + begin(3, remote_channel=0)
            + attach(3, "orders-sender", 7, True, "orders")
            + attach(3, "replies-receiver", 8, False, "replies")
            + flow(3, 7, 100),
        ),
        (Side.CLIENT, flow(0, 1, 10)),
        (
            Side.CLIENT,
            transfer(0, 0, 0, message)
            + transfer(0, 0, 1, pieces[0], more=True)
            + continuation(0, 0, pieces[1], more=True)
            + EMPTY_FRAME
            + continuation(0, 0, pieces[2], more=False),
        ),
        (Side.SERVER, disposition(3, True, 0, 1) + EMPTY_FRAME),
        (Side.SERVER, transfer(3, 8, 0, message)),
        (Side.CLIENT, disposition(0, True, 0, 0) + EMPTY_FRAME),
        (Side.CLIENT, detach(0, 0) + detach(0, 1) + end(0) + close()),
        (Side.SERVER, detach(3, 7) + detach(3, 8) + end(3) + close()),
    ]
    return Conversation(SASL_HEADER if use_sasl else AMQP_HEADER, tuple(events))


Chunker = Callable[[bytes], Iterator[bytes]]


def whole(data: bytes) -> Iterator[bytes]:
    yield data


def bytewise(data: bytes) -> Iterator[bytes]:
    for i in range(len(data)):
        yield data[i : i + 1]


def random_chunks(seed: int, largest: int = 64) -> Chunker:
    rng = random.Random(seed)

    def chunks(data: bytes) -> Iterator[bytes]:
        pos = 0
        while pos < len(data):
            step = rng.randint(1, largest)
            yield data[pos : pos + step]
            pos += step

    return chunks


@dataclass
class Relayed:
    """What the core handed to each peer."""

    to_server: bytes
    to_client: bytes


def relay(conn: Connection, events: Sequence[tuple[Side, bytes]], chunker: Chunker) -> Relayed:
    """Feed each event through the core in chunks; collect what it hands each peer."""
    to_server: list[bytes] = []
    to_client: list[bytes] = []
    for side, data in events:
        for chunk in chunker(data):
            if side is Side.CLIENT:
                conn.receive_from_client(chunk)
            else:
                conn.receive_from_server(chunk)
            to_server.append(conn.data_for_server())
            to_client.append(conn.data_for_client())
    return Relayed(b"".join(to_server), b"".join(to_client))


def split_frames(data: bytes) -> list[tuple[int, int, object]]:
    """(type, channel, decoded performative or None) for each frame in ``data``, headers skipped."""
    out: list[tuple[int, int, object]] = []
    pos = 0
    while pos < len(data):
        if data[pos : pos + 4] == b"AMQP":
            pos += 8
            continue
        size = int.from_bytes(data[pos : pos + 4], "big")
        doff, ftype = data[pos + 4], data[pos + 5]
        channel = int.from_bytes(data[pos + 6 : pos + 8], "big")
        body = pos + doff * 4
        value = decode_value(data, body, pos + size)[0] if body < pos + size else None
        out.append((ftype, channel, value))
        pos += size
    return out


def performatives(data: bytes) -> list[tuple[int, list[object]]]:
    """(code, fields) of every non-empty frame in ``data``."""
    return [composite_fields(value) for _, _, value in split_frames(data) if value is not None]
