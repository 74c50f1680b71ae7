"""One port, two protocols: detection, unsupported headers, and malformed input from clients."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import pika
import pytest
from pamqp import commands
from pamqp.heartbeat import Heartbeat
from proton import Message
from proton.utils import BlockingConnection

from floodwall.dev.devbroker import BrokerEndpoint
from floodwall.dev.devproxy import ProxyProcess
from tests.conftest import wait_for
from tests.integration.support import (
    AMQP091_HEADER,
    AMQP10_HEADER,
    AMQP10_SASL_HEADER,
    Raw091,
    amqp10_login,
    close_condition,
    encode_performative,
    lines_naming,
    log_lines,
    payload,
    pika_connection,
    read_until_eof,
    split_frames10,
    temp_queue,
)

pytestmark = [pytest.mark.broker, pytest.mark.timeout(60), pytest.mark.load_tolerant]


# -- detection -----------------------------------------------------------------------------
def test_amqp091_and_amqp10_clients_share_the_port(floodwall: ProxyProcess) -> None:
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as pc:
        proton_conn = BlockingConnection(f"amqp://guest:guest@127.0.0.1:{floodwall.port}",
                                         timeout=15, allowed_mechs="PLAIN")
        try:
            live = floodwall.state()["connections"]
            assert isinstance(live, list)
            assert {c["protocol"] for c in live} >= {"amqp091", "amqp10"}
            assert floodwall.metric("floodwall_connections", protocol="amqp091") >= 1
            assert floodwall.metric("floodwall_connections", protocol="amqp10") >= 1
            # 1.0 in, 0-9-1 out and back: both cores relay on the same listener
            sender = proton_conn.create_sender(f"/amq/queue/{queue}")
            body = payload(70_000, seed=1)
            sender.send(Message(body=body))
            sender.link.detach()
            ch = pc.channel()
            method, _props, got = ch.basic_get(queue, auto_ack=True)
            # the 1.0 plugin hands 0-9-1 consumers the encoded 1.0 sections: a data section
            # carrying the payload bytes unchanged
            assert method is not None and body in got
            ch.basic_publish("", queue, b"from 0-9-1")
            receiver = proton_conn.create_receiver(f"/amq/queue/{queue}", credit=1)
            msg = receiver.receive(timeout=15)
            receiver.accept()
            assert bytes(msg.body) == b"from 0-9-1"
            receiver.link.detach()
        finally:
            proton_conn.close()


def test_header_arriving_one_byte_at_a_time(floodwall: ProxyProcess) -> None:
    raw = Raw091.connect(floodwall.port)
    try:
        for byte in AMQP091_HEADER:
            raw.send(bytes([byte]))
            time.sleep(0.01)  # force separate segments; the outcome is awaited below
        start = raw.expect(commands.Connection.Start)
        assert (start.version_major, start.version_minor) == (0, 9)
    finally:
        raw.close()


UNSUPPORTED = [
    (b"HTTP/1.1", AMQP091_HEADER),
    (b"GET / HTTP/1.1\r\nHost: floodwall\r\n\r\n", AMQP091_HEADER),
    (b"AMQP\x01\x01\x00\x09", AMQP091_HEADER),  # 0-9 as old clients wrote it
    (b"AMQP\x01\x01\x08\x00", AMQP091_HEADER),  # 0-8
    (b"AMQP\x00\x00\x09\x00", AMQP091_HEADER),  # 0-9-0
    (b"AMQP\x00\x01\x00\x01", AMQP10_HEADER),  # 1.0, unknown revision
    (b"AMQP\x02\x01\x00\x00", AMQP10_SASL_HEADER),  # 1.0 over TLS, which we do not speak
    (b"\x16\x03\x01\x02\x00\x01\x00\x01", AMQP091_HEADER),  # a TLS ClientHello
]


@pytest.mark.parametrize(("request_bytes", "reply"), UNSUPPORTED,
                         ids=[repr(h[:8]) for h, _ in UNSUPPORTED])
def test_unsupported_header_gets_a_supported_one_and_is_closed(
        floodwall: ProxyProcess, request_bytes: bytes, reply: bytes) -> None:
    before = floodwall.metric("floodwall_unsupported_headers_total")
    with socket.create_connection(("127.0.0.1", floodwall.port), timeout=10) as sock:
        sock.sendall(request_bytes)
        assert read_until_eof(sock) == reply
    assert floodwall.metric("floodwall_unsupported_headers_total") == before + 1


# -- malformed input -----------------------------------------------------------------------
@pytest.fixture
def bystander(floodwall: ProxyProcess) -> Iterator[pika.BlockingConnection]:
    """A pika connection on the same proxy, open before the bad client and checked after it."""
    with temp_queue(floodwall.port) as queue, pika_connection(floodwall.port) as conn:
        ch = conn.channel()
        ch.queue_declare(queue, passive=True)
        yield conn
        ch.basic_publish("", queue, b"still here")
        method, _props, body = ch.basic_get(queue, auto_ack=True)
        assert method is not None and body == b"still here"
        assert conn.is_open


def _errors(proxy: ProxyProcess, protocol: str) -> float:
    return proxy.metric("floodwall_protocol_errors_total", protocol=protocol, side="client")


def _one_log_line(proxy: ProxyProcess, peer: str) -> str:
    lines = wait_for(lambda: lines_naming(log_lines(proxy.logfile, "protocol_error"), peer), 5,
                     what=f"a protocol_error log line for {peer}")
    assert isinstance(lines, list)
    assert len(lines) == 1, lines
    assert "reason=" in lines[0]
    return lines[0]


def _frame(ftype: int, channel: int, payload_bytes: bytes, end: int = 0xCE) -> bytes:
    return struct.pack(">BHI", ftype, channel, len(payload_bytes)) + payload_bytes + bytes([end])


CHANNEL_OPEN = b"\x00\x14\x00\x0a\x00"  # channel.open (20, 10), reserved shortstr ""

BAD_091 = {
    # what to send once the connection is open: (frame_max, bytes)
    "bad-frame-end": (131072, _frame(1, 1, CHANNEL_OPEN, end=0x00)),
    "oversize-frame": (4096, _frame(3, 1, b"\x00" * 9000)),
    "garbage": (131072, b"\xde\xad\xbe\xef" * 8),
    "unknown-frame-type": (131072, _frame(9, 0, b"")),
    "heartbeat-on-a-channel": (131072, _frame(8, 5, b"")),
}


@pytest.mark.parametrize("case", sorted(BAD_091))
def test_amqp091_malformed_frame_gets_501_and_disconnect(
        floodwall: ProxyProcess, bystander: Any, case: str) -> None:
    frame_max, bad = BAD_091[case]
    before = _errors(floodwall, "amqp091")
    raw = Raw091.connect(floodwall.port)
    try:
        raw.handshake(name=f"bad-{case}", frame_max=frame_max)
        peer = raw.local_address
        try:
            raw.send(bad)
        except OSError:
            pass  # the proxy may already have closed; what it sent is still readable
        frames = [v for _, v in raw.frames_until_eof() if not isinstance(v, Heartbeat)]
    finally:
        raw.close()
    closes = [f for f in frames if isinstance(f, commands.Connection.Close)]
    assert closes, f"no connection.close before disconnect, got {frames}"
    assert closes[0].reply_code == 501, closes[0]
    wait_for(lambda: _errors(floodwall, "amqp091") == before + 1, 5,
             what="floodwall_protocol_errors to count it")
    _one_log_line(floodwall, peer)


def test_amqp091_garbage_right_after_the_header(floodwall: ProxyProcess, bystander: Any) -> None:
    before = _errors(floodwall, "amqp091")
    raw = Raw091.connect(floodwall.port)
    try:
        raw.send(AMQP091_HEADER)
        raw.expect(commands.Connection.Start)
        peer = raw.local_address
        raw.send(b"\x01\x00\x00\xff\xff\xff\xff\x00garbage")
        frames = [v for _, v in raw.frames_until_eof()]
    finally:
        raw.close()
    closes = [f for f in frames if isinstance(f, commands.Connection.Close)]
    assert closes and closes[0].reply_code == 501, frames
    wait_for(lambda: _errors(floodwall, "amqp091") == before + 1, 5, what="the error count")
    _one_log_line(floodwall, peer)


def _amqp10_open(container: str = "fw-it-raw") -> bytes:
    # open: container-id, hostname, max-frame-size, channel-max
    from proton import uint, ushort

    return encode_performative(0x10, [container, "localhost", uint(65536), ushort(16)])


BAD_10 = {
    "frame-size-below-8": struct.pack(">IBBH", 4, 2, 0, 0),
    "data-offset-below-2": struct.pack(">IBBH", 12, 1, 0, 0) + b"\x00" * 4,
    "oversize-frame": struct.pack(">IBBH", (2 << 20) + 8, 2, 0, 0) + b"\x00" * (2 << 20),
    "undecodable-body": struct.pack(">IBBH", 16, 2, 0, 0) + b"\x00\x53\x12\xff\xff\xff\xff\xff",
}


@pytest.mark.parametrize("case", sorted(BAD_10))
def test_amqp10_malformed_frame_gets_close_with_error(
        floodwall: ProxyProcess, broker: BrokerEndpoint, bystander: Any, case: str) -> None:
    before = _errors(floodwall, "amqp10")
    with socket.create_connection(("127.0.0.1", floodwall.port), timeout=10) as sock:
        host, port = sock.getsockname()[:2]
        amqp10_login(sock, broker)  # RabbitMQ 4 wants SASL first
        sock.sendall(AMQP10_HEADER)
        head = b""
        while len(head) < 8:
            chunk = sock.recv(8 - len(head))
            assert chunk, "closed before the broker's protocol header"
            head += chunk
        assert head == AMQP10_HEADER
        sock.sendall(_amqp10_open())
        try:
            sock.sendall(BAD_10[case])
        except OSError:
            pass
        data = read_until_eof(sock)
    _headers, frames = split_frames10(data)
    condition = close_condition(frames)
    assert condition in ("amqp:connection:framing-error", "amqp:decode-error"), (
        f"close condition {condition!r}; frames {[f.performative for f in frames]}")
    wait_for(lambda: _errors(floodwall, "amqp10") == before + 1, 5, what="the error count")
    _one_log_line(floodwall, f"{host}:{port}")


def test_amqp10_garbage_in_the_sasl_layer_disconnects(floodwall: ProxyProcess,
                                                      bystander: Any) -> None:
    before = _errors(floodwall, "amqp10")
    with socket.create_connection(("127.0.0.1", floodwall.port), timeout=10) as sock:
        sock.sendall(AMQP10_SASL_HEADER)
        sock.sendall(struct.pack(">IBBH", 3, 2, 1, 0))  # a SASL frame shorter than its header
        data = read_until_eof(sock)
    # the broker's SASL header may or may not have arrived first; an AMQP (type 0) frame,
    # such as a close performative, has no place in the SASL layer
    headers, frames = split_frames10(data)
    assert headers in ([], [AMQP10_SASL_HEADER]) and all(f.type == 1 for f in frames), data
    wait_for(lambda: _errors(floodwall, "amqp10") == before + 1, 5, what="the error count")
