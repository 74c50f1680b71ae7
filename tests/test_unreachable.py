"""What a client hears when the broker cannot be reached (floodwall.wire.unreachable), fed
whole and one byte at a time; decoded with pamqp and proton (outside implementations)."""

from __future__ import annotations

import struct

import pytest
from pamqp import commands, frame

from floodwall.wire.detect import Detected
from floodwall.wire.unreachable import UnreachableAnswer
from tests.integration.support import (
    AMQP091_HEADER,
    AMQP10_HEADER,
    AMQP10_SASL_HEADER,
    close_condition,
    split_frames10,
)

REASON = "[Errno 111] Connection refused"
TEXT = f"floodwall: broker unreachable: {REASON}"


def feed(answer: UnreachableAnswer, data: bytes, one_at_a_time: bool) -> bytes:
    if not one_at_a_time:
        return answer.receive(data)
    return b"".join(answer.receive(data[i:i + 1]) for i in range(len(data)))


def frames091(data: bytes) -> list[object]:
    out = []
    while data:
        consumed, _, value = frame.unmarshal(data)
        out.append(value)
        data = data[consumed:]
    return out


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_amqp091_start_then_close_320(one_at_a_time: bool) -> None:
    answer = UnreachableAnswer(Detected.AMQP091, REASON)
    first = feed(answer, AMQP091_HEADER, one_at_a_time)
    (start,) = frames091(first)
    assert isinstance(start, commands.Connection.Start) and not answer.done
    start_ok = frame.marshal(commands.Connection.StartOk(
        client_properties={"product": "t"}, mechanism="PLAIN", response="\0u\0p"), 0)
    assert feed(answer, start_ok[:-1], one_at_a_time) == b""  # a partial frame: wait
    (close,) = frames091(feed(answer, start_ok[-1:], one_at_a_time))
    assert isinstance(close, commands.Connection.Close)
    assert (close.reply_code, close.reply_text) == (320, TEXT)
    assert answer.done and answer.receive(b"more") == b""


@pytest.mark.parametrize("one_at_a_time", [False, True])
def test_amqp10_with_sasl_then_open_and_close_with_an_error(one_at_a_time: bool) -> None:
    answer = UnreachableAnswer(Detected.AMQP10, REASON)
    headers, frames = split_frames10(feed(answer, AMQP10_SASL_HEADER, one_at_a_time))
    assert headers == [AMQP10_SASL_HEADER] and [f.performative for f in frames] == [
        "sasl-mechanisms"]
    assert "PLAIN" in str(frames[0].fields[0]) and "ANONYMOUS" in str(frames[0].fields[0])
    init_body = _sasl_init()
    out = feed(answer, init_body + AMQP10_HEADER, one_at_a_time)
    headers, frames = split_frames10(out)
    assert [f.performative for f in frames] == ["sasl-outcome", "open", "close"]
    assert frames[0].fields[0] == 0  # ok: the connection ends right after anyway
    assert headers == [AMQP10_HEADER]
    assert close_condition(frames) == "amqp:connection:forced"
    assert TEXT in str(frames[2].fields[0])
    assert answer.done


def test_amqp10_without_sasl_gets_open_and_close_at_once() -> None:
    answer = UnreachableAnswer(Detected.AMQP10, REASON)
    headers, frames = split_frames10(answer.receive(AMQP10_HEADER))
    assert headers == [AMQP10_HEADER] and [f.performative for f in frames] == ["open", "close"]
    assert close_condition(frames) == "amqp:connection:forced" and answer.done


def test_a_client_that_sends_too_much_is_let_go() -> None:
    answer = UnreachableAnswer(Detected.AMQP091, REASON)
    answer.receive(AMQP091_HEADER)
    answer.receive(b"\x01\x00\x00" + struct.pack(">I", 10**6) + b"x" * 70_000)
    assert answer.done


def _sasl_init() -> bytes:
    """A sasl-init (PLAIN) as proton encodes it."""
    import proton

    data = proton.Data()
    data.put_object(proton.Described(proton.ulong(0x41), [proton.symbol("PLAIN"),
                                                         b"\0guest\0guest"]))
    body = data.encode()
    return struct.pack(">IBBH", 8 + len(body), 2, 1, 0) + body


def test_log_limiter_lets_a_burst_through_then_counts() -> None:
    from floodwall.ops.logs import LogLimiter

    limiter = LogLimiter(interval=10.0, burst=3)
    assert [limiter.allow("x", 100.0 + i) for i in range(5)] == [0, 0, 0, None, None]
    assert limiter.allow("y", 104.0) == 0  # each kind has its own window
    assert limiter.allow("x", 109.9) is None
    assert limiter.allow("x", 110.0) == 3  # a new window: the first line says 3 were left out
    assert limiter.allow("x", 110.1) == 0
    assert limiter.suppressed_total == 3
