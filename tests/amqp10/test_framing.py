"""The AMQP 1.0 frame scanner: frame checks, NEED_DATA, performative peeks, offsets on errors."""

from __future__ import annotations

import pytest

from floodwall.wire.amqp10.errors import DecodeError, FramingError
from floodwall.wire.amqp10.framing import (
    AMQP_FRAME,
    MIN_MAX_FRAME_SIZE,
    NEED_DATA,
    SASL_FRAME,
    Frame,
    NeedData,
    frame,
    next_frame,
    peek_performative,
    scan_frames,
)
from floodwall.wire.amqp10.performatives import ATTACH, CLOSE, DISPOSITION, FLOW, OPEN, TRANSFER
from tests.amqp10.streams import EMPTY_FRAME, amqp, attach, close, flow, open_, transfer

LIMIT = 1 << 20


class Recorder:
    """An on_frame handler that records what it is given."""

    def __init__(self, stop_on: frozenset[int] = frozenset()) -> None:
        self.seen: list[tuple[int, int, bytes]] = []
        self.stop_on = stop_on

    def __call__(self, code: int, channel: int, buf: bytes, start: int, body: int, end: int
                 ) -> bool:
        self.seen.append((code, channel, buf[body:end]))
        return code in self.stop_on


def test_hot_performatives_and_heartbeats_are_skipped_rare_ones_reported() -> None:
    stream = (
        open_("c")
        + flow(1, 0, 5)
        + transfer(1, 0, 0, b"payload")
        + EMPTY_FRAME
        + amqp(DISPOSITION, 1, role=True, first=0)
        + attach(1, "l", 2, False, "q")
        + close()
    )
    seen = Recorder()
    assert scan_frames(stream, 0, LIMIT, AMQP_FRAME, seen) == (len(stream), 7, 8)
    reported = [(code, channel) for code, channel, _ in seen.seen]
    assert reported == [(OPEN, 0), (ATTACH, 1), (CLOSE, 0)]
    assert seen.seen[1][2] == attach(1, "l", 2, False, "q")[8:]


def test_scan_stops_after_a_frame_when_asked() -> None:
    stream = open_("c") + close()
    seen = Recorder(stop_on=frozenset({OPEN}))
    assert scan_frames(stream, 0, LIMIT, AMQP_FRAME, seen) == (len(open_("c")), 1, 0)


@pytest.mark.parametrize("cut", [1, 7, 8, 10, 11, 20])
def test_incomplete_frames_return_their_start_and_need(cut: int) -> None:
    whole = transfer(0, 0, 1, b"x" * 40)
    stream = whole + whole[:cut]
    stop, frames, need = scan_frames(stream, 0, LIMIT, AMQP_FRAME, Recorder())
    assert (stop, frames) == (len(whole), 1)
    assert need == (8 if cut < 8 else len(whole))
    assert next_frame(stream, stop, LIMIT, AMQP_FRAME) is NEED_DATA


def test_need_data_is_a_singleton_and_not_an_error() -> None:
    assert NeedData() is NEED_DATA
    assert repr(NEED_DATA) == "NEED_DATA"
    assert next_frame(b"", 0, LIMIT, AMQP_FRAME) is NEED_DATA


def test_next_frame_describes_one_frame() -> None:
    stream = transfer(3, 0, 1, b"p") + EMPTY_FRAME
    first = next_frame(stream, 0, LIMIT, AMQP_FRAME)
    assert first == Frame(0, len(stream) - 8, 8, AMQP_FRAME, 3, TRANSFER)
    assert next_frame(stream, len(stream) - 8, LIMIT, AMQP_FRAME) == Frame(
        len(stream) - 8, len(stream), len(stream), AMQP_FRAME, 0, None
    )


@pytest.mark.parametrize(
    ("header", "limit", "frame_type", "message"),
    [
        (b"\x00\x00\x00\x07\x02\x00\x00\x00", LIMIT, AMQP_FRAME, "smaller than the 8-byte"),
        (b"\x00\x00\x00\x10\x00\x00\x00\x00", LIMIT, AMQP_FRAME, "data offset 0"),
        (b"\x00\x00\x00\x0c\x04\x00\x00\x00", LIMIT, AMQP_FRAME, "beyond the frame size 12"),
        (b"\x00\x00\x02\x01\x02\x00\x00\x00", 512, AMQP_FRAME, "513 exceeds the max-frame-size"),
        (b"\x00\x00\x00\x08\x02\x01\x00\x00", LIMIT, AMQP_FRAME, "SASL frame where an AMQP"),
        (b"\x00\x00\x00\x08\x02\x00\x00\x00", 512, SASL_FRAME, "AMQP frame where an SASL"),
        (b"\x00\x00\x00\x08\x02\x01\x00\x00", 512, SASL_FRAME, "empty SASL frame"),
    ],
)
def test_bad_frames_raise_framing_error_with_offset(
    header: bytes, limit: int, frame_type: int, message: str
) -> None:
    good = EMPTY_FRAME if frame_type == AMQP_FRAME else b""
    stream = good + good + header + b"\x00" * 16
    with pytest.raises(FramingError, match=message) as caught:
        scan_frames(stream, 0, limit, frame_type, Recorder())
    assert caught.value.offset == len(good) * 2
    assert caught.value.frames_before == (2 if good else 0)
    with pytest.raises(FramingError, match=message):
        next_frame(header + b"\x00" * 16, 0, limit, frame_type)


def test_an_oversize_frame_is_refused_as_soon_as_its_header_arrives() -> None:
    with pytest.raises(FramingError):
        scan_frames(b"\x00\x10\x00\x00\x02\x00\x00\x00", 0, MIN_MAX_FRAME_SIZE, 0, Recorder())


def test_frames_of_exactly_the_limit_pass() -> None:
    body = b"\x00\x53\x14\x45" + b"\x00" * (MIN_MAX_FRAME_SIZE - 12)
    assert len(frame(body)) == MIN_MAX_FRAME_SIZE
    assert scan_frames(frame(body), 0, MIN_MAX_FRAME_SIZE, 0, Recorder())[1] == 1


@pytest.mark.parametrize(
    ("body", "code"),
    [
        (b"\x00\x53\x13\x45", FLOW),
        (b"\x00\x80\x00\x00\x00\x00\x00\x00\x00\x14\x45", TRANSFER),
        (b"\x00\xa3\x0eamqp:open:list\x45", OPEN),
        (b"\x00\xb3\x00\x00\x00\x0famqp:close:list\x45", CLOSE),
        (b"\x00\xa3\x03foo\x45", -1),
        (b"\x00\x44\x45", 0),
        (b"\x00\x80\x00\x00\x00\x01\x00\x00\x00\x10\x45", 0x100000010),
    ],
)
def test_peek_reads_every_descriptor_form(body: bytes, code: int) -> None:
    assert peek_performative(body, 0, len(body)) == code


@pytest.mark.parametrize(
    "body",
    [b"\x45", b"\x00", b"\x00\x53", b"\x00\x80\x00\x00", b"\x00\xa1\x01x\x45", b"\x00\xa3\x09abc"],
)
def test_peek_refuses_what_is_not_a_performative(body: bytes) -> None:
    with pytest.raises(DecodeError):
        peek_performative(body, 0, len(body))


def test_decode_errors_from_the_handler_carry_the_frame_offset() -> None:
    def refuse(code: int, channel: int, buf: bytes, start: int, body: int, end: int) -> bool:
        raise DecodeError("no")

    stream = transfer(0, 0, 1, b"") + attach(0, "l", 0, False, "q")
    with pytest.raises(DecodeError) as caught:
        scan_frames(stream, 0, LIMIT, AMQP_FRAME, refuse)
    assert caught.value.offset == len(transfer(0, 0, 1, b""))
    assert caught.value.frames_before == 1


def test_sasl_frames_all_go_to_the_handler() -> None:
    fake_flow = frame(b"\x00\x53\x13\x45", 0, SASL_FRAME)
    seen = Recorder()
    scan_frames(fake_flow, 0, 512, SASL_FRAME, seen)
    assert [code for code, _, _ in seen.seen] == [FLOW]


def test_short_usual_frames_fall_back_to_the_general_path() -> None:
    tiny = frame(b"\x00\x53")  # 10 bytes: descriptor cut short
    with pytest.raises(DecodeError):
        scan_frames(tiny + EMPTY_FRAME, 0, LIMIT, AMQP_FRAME, Recorder())
    skipped = frame(b"\x00\x53\x14")  # 11 bytes: a transfer with no fields is passed by size
    assert scan_frames(skipped, 0, LIMIT, AMQP_FRAME, Recorder())[:2] == (11, 1)
