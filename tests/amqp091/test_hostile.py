"""Hostile 0-9-1 input against the core and its gate: short content headers, the frame limit
from both tunes, frames announced larger than it; bytes in, commands out, whole and one byte at
a time."""

from __future__ import annotations

import struct

import pytest

from floodwall.wire.amqp091.connection import Connection
from floodwall.wire.amqp091.framing import FRAME_MIN_SIZE
from floodwall.wire.relaycore import Side
from tests.amqp091.test_flow import Setup
from tests.amqp091.wire import (
    CH,
    FRAME_MAX,
    B,
    C,
    client_handshake,
    decode_all,
    method,
    raw_frame,
    server_handshake,
)

GIB4 = 0xFFFFFFF0  # a payload size announcing 4 GiB


def fed(core: Connection, data: bytes, one_byte: bool, side: Side = Side.CLIENT) -> None:
    """Feed ``data`` whole or one byte at a time, stopping at the first failure."""
    receive = core.receive_from_client if side is Side.CLIENT else core.receive_from_server
    chunks = [data[i:i + 1] for i in range(len(data))] if one_byte else [data]
    for chunk in chunks:
        receive(chunk, 0.0)
        if core.failure is not None:
            return


def the_close(data: bytes) -> C.Close:
    frames = decode_all(data)
    assert frames, "no close was queued"
    channel, close = frames[-1]
    assert channel == 0 and isinstance(close, C.Close)
    return close


BYTES = pytest.mark.parametrize("one_byte", [False, True], ids=["whole", "bytes"])


# -- short content headers ------------------------------------------------------------------

@BYTES
@pytest.mark.parametrize("size", [0, 4, 13])
def test_a_short_content_header_after_a_publish_is_a_frame_error_for_the_gate(
        one_byte: bool, size: int) -> None:
    s = Setup()
    data = method(B.Publish(exchange="", routing_key="capped"), 1) + raw_frame(2, 1, b"h" * size)
    fed(s.core, data, one_byte)
    failure = s.core.failure
    assert failure is not None and failure.side is Side.CLIENT
    assert failure.condition == "501 FRAME_ERROR"
    assert f"has a {size}-byte payload, shorter than the 14 bytes" in failure.reason
    close = the_close(s.core.data_for_client())
    assert close.reply_code == 501 and "content header frame on channel 1" in close.reply_text


@BYTES
def test_a_short_content_header_while_the_channel_is_held_is_a_frame_error(
        one_byte: bool) -> None:
    """The slow path (a channel read frame by frame) reads the header in the gate too."""
    s = Setup()
    s.sample("capped", 10_000)  # tripped: the next publish is held
    s.core.receive_from_client(b"".join([method(B.Publish(exchange="", routing_key="capped"), 1),
                                         raw_frame(2, 1, b"\x00" * 14)]), s.clock.t)
    assert s.core.failure is None and s.gate.holding
    data = method(B.Publish(exchange="", routing_key="capped"), 1) + raw_frame(2, 1, b"abcd")
    fed(s.core, data, one_byte)
    assert s.core.failure is not None and s.core.failure.condition == "501 FRAME_ERROR"


@BYTES
def test_a_short_content_header_before_login_is_a_frame_error(one_byte: bool) -> None:
    """Sent in the first packet, before any handshake: no gate state needed to refuse it."""
    core = Connection()
    data = method(B.Publish(exchange="", routing_key="q"), 1) + raw_frame(2, 1, b"abcd")
    fed(core, data, one_byte)
    assert core.failure is not None and core.failure.condition == "501 FRAME_ERROR"
    assert the_close(core.data_for_client()).reply_code == 501


def test_a_content_header_of_exactly_14_bytes_passes() -> None:
    core = Connection()
    data = method(B.Publish(exchange="", routing_key="q"), 1) + raw_frame(2, 1, bytes(14))
    core.receive_from_client(data, 0.0)
    assert core.failure is None and core.data_for_server() == data


def test_a_short_content_header_from_the_broker_closes_both_sides() -> None:
    core = Connection()
    core.receive_from_server(raw_frame(2, 1, b"abc"), 0.0)
    assert core.failure is not None and core.failure.side is Side.SERVER
    assert the_close(core.data_for_server()).reply_code == 501
    assert the_close(core.data_for_client()).reply_code == 541


# -- the frame limit: the lower of both tunes ---------------------------------------------

def handshaken(client_frame_max: int, server_frame_max: int = FRAME_MAX) -> Connection:
    core = Connection()
    core.receive_from_server(b"".join(server_handshake(server_frame_max)), 0.0)
    core.receive_from_client(b"".join(client_handshake(client_frame_max)), 0.0)
    core.data_for_server(), core.data_for_client()
    return core


@BYTES
def test_tune_ok_frame_max_zero_is_held_to_the_brokers_frame_max(one_byte: bool) -> None:
    core = handshaken(0)
    assert core.failure is None and core.frame_max == 0
    fits = raw_frame(3, 1, b"a" * (FRAME_MAX - 8))
    fed(core, fits, one_byte)
    assert core.failure is None and core.data_for_server() == fits
    fed(core, struct.pack(">BHI", 3, 1, GIB4), one_byte)
    assert core.failure is not None and core.failure.condition == "501 FRAME_ERROR"
    assert f"exceeds frame_max {FRAME_MAX}" in core.failure.reason
    assert core.pending_from_client == 0  # refused from its header: nothing of it held


@BYTES
def test_a_tune_ok_above_the_brokers_frame_max_is_refused_530(one_byte: bool) -> None:
    core = Connection()
    core.receive_from_server(b"".join(server_handshake(FRAME_MAX)), 0.0)
    fed(core, b"".join(client_handshake(FRAME_MAX * 2)), one_byte)
    failure = core.failure
    assert failure is not None and failure.side is Side.CLIENT
    assert failure.condition == "530 NOT_ALLOWED"
    assert failure.reason == (f"connection.tune-ok frame_max {FRAME_MAX * 2} is above the "
                              f"broker's frame_max {FRAME_MAX}")
    close = the_close(core.data_for_client())
    assert (close.reply_code, close.class_id, close.method_id) == (530, 10, 31)
    # the start-ok before it went to the broker; the tune-ok did not
    assert len(decode_all(core.data_for_server())) == 1


def test_a_tune_ok_below_the_brokers_frame_max_is_the_limit() -> None:
    core = handshaken(8192)
    core.receive_from_client(raw_frame(3, 1, b"a" * (8192 - 8)), 0.0)
    assert core.failure is None
    core.receive_from_client(raw_frame(3, 1, b"a" * (8192 - 7)), 0.0)
    assert core.failure is not None and "exceeds frame_max 8192" in core.failure.reason


def test_the_brokers_frame_max_zero_leaves_the_clients() -> None:
    core = handshaken(FRAME_MAX, server_frame_max=0)
    assert core.failure is None
    core.receive_from_client(struct.pack(">BHI", 3, 1, FRAME_MAX), 0.0)
    assert core.failure is not None and f"exceeds frame_max {FRAME_MAX}" in core.failure.reason


@BYTES
def test_everything_pipelined_before_the_brokers_tune_is_held_to_frame_min_size(
        one_byte: bool) -> None:
    """A client that sends start-ok (any password), tune-ok frame_max=0, open and a body
    frame announcing 4 GiB before the broker has answered: the 4 GiB frame is refused from
    its header, nothing of it held."""
    core = Connection()
    login = b"".join(client_handshake(0)) + method(CH.Open(), 1)
    fed(core, login + struct.pack(">BHI", 3, 1, GIB4), one_byte)
    assert core.failure is not None and core.failure.condition == "501 FRAME_ERROR"
    assert f"exceeds frame_max {FRAME_MIN_SIZE}" in core.failure.reason
    assert core.pending_from_client == 0
    assert core.data_for_server() == login


def test_a_pipelined_tune_ok_takes_effect_with_the_brokers_tune() -> None:
    core = Connection()
    core.receive_from_client(b"".join(client_handshake(0)), 0.0)
    core.receive_from_client(raw_frame(3, 1, b"a" * 5000), 0.0)
    assert core.failure is not None  # still FRAME_MIN_SIZE: the broker has not tuned
    core = Connection()
    core.receive_from_client(b"".join(client_handshake(0)), 0.0)
    core.receive_from_server(b"".join(server_handshake(FRAME_MAX)), 0.0)
    fits = raw_frame(3, 1, b"a" * (FRAME_MAX - 8))
    core.receive_from_client(fits, 0.0)
    assert core.failure is None
    core.receive_from_client(raw_frame(3, 1, b"a" * (FRAME_MAX - 7)), 0.0)
    assert core.failure is not None and f"exceeds frame_max {FRAME_MAX}" in core.failure.reason
