"""Hostile 0-9-1 input against the core and its gate: short content headers, the frame limit
from both tunes, frames announced larger than it; bytes in, commands out, whole and one byte at
a time."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from pamqp import body as pamqp_body
from pamqp import commands, frame, header

from floodwall.control.memory import MemoryBudget
from floodwall.enforce import events as ev
from floodwall.spool.manager import SpoolManager
from floodwall.wire.amqp091.connection import Connection
from floodwall.wire.amqp091.framing import FRAME_MIN_SIZE
from floodwall.wire.relaycore import Side
from tests.amqp091.test_flow import Setup, _spool_setup
from tests.amqp091.wire import (
    CH,
    FRAME_MAX,
    B,
    C,
    client_handshake,
    decode_all,
    method,
    publish,
    raw_frame,
    server_handshake,
)

CF = commands.Confirm

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


# -- spool captures: bounded before they are assembled --------------------------------------

def spool_setup(tmp_path: Path, max_bytes: str = "1MiB") -> tuple[Setup, SpoolManager]:
    s, manager = _spool_setup(tmp_path, max_bytes)
    s.core.receive_from_client(method(CF.Select(), 1), s.clock.t)
    s.core.data_for_server()
    s.trip()
    return s, manager


def announce(queue: str, body_size: int) -> bytes:
    """A publish and a content header announcing ``body_size``, no body yet."""
    return method(B.Publish(exchange="", routing_key=queue), 1) + frame.marshal(
        header.ContentHeader(0, body_size, B.Properties()), 1)


def fell_back(s: Setup) -> list[ev.SpoolFellBack]:
    return [e for e in s.core.events() if isinstance(e, ev.SpoolFellBack)]


@BYTES
def test_a_2_to_the_40_body_to_a_spooling_queue_is_held_not_assembled(
        tmp_path: Path, one_byte: bool) -> None:
    s, manager = spool_setup(tmp_path)
    fed(s.core, announce("capped", 1 << 40), one_byte)
    (why,) = fell_back(s)
    assert why.queue == "capped" and why.action == "held"
    assert why.reason.startswith("spool of 'capped' is at its limit (1048576 bytes): no room "
                                 "for 10995116278")  # 2**40 and its method and header
    assert s.gate.holding and s.counters.held_messages == 1
    assert s.counters.held_bytes < 200  # what arrived: its method and header
    # its body, as it comes, is held and counted: the relay stops reading past the budget
    body = frame.marshal(pamqp_body.ContentBody(b"b" * 100_000), 1)
    for _ in range(90):
        s.core.receive_from_client(body, s.clock.t)
    assert s.counters.held_bytes == s.gate.held_bytes > s.gate.hold_budget
    assert s.gate.over_budget
    assert manager.spool(("/orders", "capped")).empty and s.core.failure is None


@BYTES
def test_a_capture_counts_as_held_until_it_is_spooled(tmp_path: Path, one_byte: bool) -> None:
    s, manager = spool_setup(tmp_path)
    frames = publish(1, b"s" * 300_000, routing_key="capped")
    data, head = b"".join(frames), len(frames[0] + frames[1])
    fed(s.core, data[:head], one_byte)
    assert not fell_back(s)
    reserved = s.counters.held_bytes
    assert reserved == s.gate.held_bytes >= 300_000  # the whole announced message, at once
    fed(s.core, data[head:-1], one_byte)
    assert s.counters.held_bytes >= reserved  # its frames: no more than their overhead
    fed(s.core, data[-1:], one_byte)
    assert s.counters.held_bytes == 0 and s.gate.held_bytes == 0 and not s.gate.holding
    assert s.counters.spooled_records == 1
    manager.sync()
    (record,) = manager.spool(("/orders", "capped")).records()
    assert record.body == b"s" * 300_000


def test_a_capture_larger_than_the_hold_budget_is_held(tmp_path: Path) -> None:
    s, _ = spool_setup(tmp_path, max_bytes="64MiB")
    s.gate.ctx.hold_budget = 256 * 1024
    s.core.receive_from_client(announce("capped", 300_000), s.clock.t)
    (why,) = fell_back(s)
    assert "does not fit the connection's hold budget (262144 bytes, 0 held)" in why.reason
    assert s.counters.held_messages == 1


def test_a_capture_that_does_not_fit_the_memory_budget_is_held(tmp_path: Path) -> None:
    s, _ = spool_setup(tmp_path, max_bytes="64MiB")
    s.board.enforcement.memory = MemoryBudget(1 << 20)  # resume: 896 KiB
    s.core.receive_from_client(announce("capped", 900 * 1024), s.clock.t)
    (why,) = fell_back(s)
    assert "does not fit the memory budget (1048576 bytes, 0 held)" in why.reason
    chunk = frame.marshal(pamqp_body.ContentBody(b"m" * 100 * 1024), 1)
    s.core.receive_from_client(chunk * 9, s.clock.t)  # its body, held as it comes
    assert s.core.failure is None and s.gate.held_bytes > 900 * 1024
    s.core.receive_from_client(announce("capped", 500 * 1024), s.clock.t)
    assert s.core.failure is None
    assert not fell_back(s)  # behind the held one on its channel: held, never captured
    assert s.counters.held_messages == 2


@BYTES
@pytest.mark.parametrize("amid", ["publish", "ack", "header"])
def test_a_frame_amid_a_held_publishs_content_is_refused_505(tmp_path: Path, one_byte: bool,
                                                             amid: str) -> None:
    """A held publish's body is due on its channel: any other frame there breaks the spec's
    content order. The proxy answers it as the broker would (505), relays once what came
    before it, and keeps nothing."""
    s, _ = spool_setup(tmp_path, max_bytes="64MiB")
    s.board.enforcement.memory = MemoryBudget(1 << 20)
    s.core.receive_from_client(announce("capped", 900 * 1024), s.clock.t)  # held, body due
    assert fell_back(s) and s.core.failure is None
    before = s.core.data_for_server()
    wrong = {"publish": announce("capped", 10),
             "ack": method(B.Ack(delivery_tag=1), 1),
             "header": frame.marshal(header.ContentHeader(0, 10, B.Properties()), 1)}[amid]
    free = b"".join(publish(2, b"f" * 10, "free"))  # another channel's: it goes, once
    fed(s.core, free + wrong + free, one_byte)
    failure = s.core.failure
    assert failure is not None and failure.condition == "505 UNEXPECTED_FRAME"
    assert "on channel 1 while its publish's content body is due" in failure.reason
    assert before + s.core.data_for_server() == free


def test_a_capture_that_outgrows_the_hold_budget_in_tiny_frames_becomes_a_hold(
        tmp_path: Path) -> None:
    s, manager = spool_setup(tmp_path, max_bytes="64MiB")
    s.gate.ctx.hold_budget = 64 * 1024
    s.core.receive_from_client(announce("capped", 32 * 1024), s.clock.t)
    assert not fell_back(s)
    tiny = frame.marshal(pamqp_body.ContentBody(b"t"), 1)  # 9 bytes a body byte
    s.core.receive_from_client(tiny * 5000, s.clock.t)
    (why,) = fell_back(s)
    assert why.reason == ("it outgrew the connection's hold budget while assembled for the "
                          "spool") and why.action == "held"
    assert s.counters.held_messages == 1 and manager.spool(("/orders", "capped")).empty
    assert s.gate.held_bytes == s.counters.held_bytes  # exactly what it keeps now
    s.sample("capped", 0)  # released: what was held leaves, the rest passes in place
    assert s.core.data_for_server()
    s.core.receive_from_client(tiny * (32 * 1024 - 5000), s.clock.t)
    assert s.counters.held_bytes == 0 and not s.gate.holding
