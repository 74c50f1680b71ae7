"""Realistic AMQP 0-9-1 byte streams for the tests, built with pamqp."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

from pamqp import body, commands, frame, header, heartbeat
from pamqp.base import Frame
from pamqp.common import FieldTable

C = commands.Connection
CH = commands.Channel
B = commands.Basic

HEARTBEAT = heartbeat.Heartbeat().marshal()
FRAME_MAX = 131072
CLIENT_PROPERTIES: FieldTable = {
    "product": "pytest-client",
    "version": "1.2.3",
    "platform": "Python 3.11",
    "information": "https://example.invalid/",
    "capabilities": {"publisher_confirms": True, "connection.blocked": True},
}


def method(value: Frame, channel: int = 0) -> bytes:
    """One method frame."""
    return frame.marshal(value, channel)


def raw_frame(ftype: int, channel: int, payload: bytes, end: int = 0xCE) -> bytes:
    """Any frame, valid or not, built by hand."""
    return struct.pack(">BHI", ftype, channel, len(payload)) + payload + bytes([end])


def content(channel: int, payload: bytes, frame_max: int = FRAME_MAX) -> list[bytes]:
    """A content header frame and the body frames carrying ``payload`` under ``frame_max``."""
    frames = [
        frame.marshal(header.ContentHeader(0, len(payload), B.Properties(delivery_mode=2)), channel)
    ]
    step = frame_max - 8
    for start in range(0, len(payload), step):
        frames.append(frame.marshal(body.ContentBody(payload[start : start + step]), channel))
    return frames


def publish(channel: int, payload: bytes, routing_key: str = "q") -> list[bytes]:
    """A Basic.Publish and its content: 2 + ceil(len / (frame_max - 8)) frames."""
    return [
        method(B.Publish(exchange="", routing_key=routing_key), channel),
        *content(channel, payload),
    ]


@dataclass
class Conversation:
    """Frames each peer sends in a whole connection, in order."""

    client: list[bytes] = field(default_factory=list)
    server: list[bytes] = field(default_factory=list)

    @property
    def client_bytes(self) -> bytes:
        return b"".join(self.client)

    @property
    def server_bytes(self) -> bytes:
        return b"".join(self.server)


def client_handshake(frame_max: int = FRAME_MAX) -> list[bytes]:
    return [
        method(
            C.StartOk(
                client_properties=CLIENT_PROPERTIES, mechanism="PLAIN", response="\0guest\0guest"
            )
        ),
        method(C.TuneOk(channel_max=2047, frame_max=frame_max, heartbeat=60)),
        method(C.Open(virtual_host="/orders")),
    ]


def server_handshake(frame_max: int = FRAME_MAX) -> list[bytes]:
    return [
        method(C.Start(server_properties={"product": "RabbitMQ", "version": "3.13.0"})),
        method(C.Tune(channel_max=2047, frame_max=frame_max, heartbeat=60)),
        method(C.OpenOk()),
    ]


def conversation() -> Conversation:
    """A full connection: handshake, two channels, publishes (one body split over
    frame_max), a delivery, heartbeats both ways, channel and connection close."""
    talk = Conversation(client_handshake(), server_handshake())
    talk.client += [method(CH.Open(), 1), method(CH.Open(), 2)]
    talk.server += [method(CH.OpenOk(), 1), method(CH.OpenOk(), 2)]
    for n in range(5):
        talk.client += publish(1, bytes([n]) * 1024)
    talk.client += publish(2, b"")  # no body frame at all
    talk.client += publish(1, bytes(range(256)) * 1200)  # 307200 bytes: 3 body frames
    talk.client += [HEARTBEAT]
    talk.client += [method(B.Consume(queue="q", consumer_tag="ctag"), 2)]
    talk.server += [method(B.ConsumeOk(consumer_tag="ctag"), 2), HEARTBEAT]
    talk.server += [
        method(B.Deliver("ctag", 1, False, "", "q"), 2),
        *content(2, b"hello" * 100),
    ]
    talk.client += [method(B.Ack(delivery_tag=1), 2)]
    talk.client += [method(CH.Close(200, "bye", 0, 0), 1)]
    talk.server += [method(CH.CloseOk(), 1)]
    talk.client += [method(C.Close(200, "Goodbye", 0, 0))]
    talk.server += [method(C.CloseOk())]
    return talk


def decode_all(data: bytes) -> list[tuple[int, object]]:
    """(channel, pamqp frame object) for every frame in ``data``."""
    frames: list[tuple[int, object]] = []
    while data:
        used, channel, value = frame.unmarshal(data)
        frames.append((channel, value))
        data = data[used:]
    return frames
