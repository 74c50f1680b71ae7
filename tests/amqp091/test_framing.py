"""Tests for the 0-9-1 frame scanner: walking, need-data, every frame error, decoding."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from floodwall.wire.amqp091.errors import (
    FrameError,
    MethodSyntaxError,
    ProtocolError,
    UnexpectedFrame,
)
from floodwall.wire.amqp091.framing import (
    FRAME_MIN_SIZE,
    NEED_DATA,
    WATCHED,
    count_frames,
    decode_method,
    frame_at,
    method_ids,
    method_key,
    payload_limit,
    scan,
    scan_watching,
)
from tests.amqp091.wire import CH, HEARTBEAT, C, conversation, method, publish, raw_frame

NOTHING: frozenset[int] = frozenset()


def test_scan_walks_every_complete_frame_to_the_end() -> None:
    talk = conversation()
    data = talk.client_bytes
    assert scan(data, 0, 0, NOTHING) == (len(data), len(talk.client), NEED_DATA)


def test_scan_of_nothing_or_a_partial_header_needs_data() -> None:
    assert scan(b"", 0, 0, NOTHING) == (0, 0, NEED_DATA)
    assert scan(HEARTBEAT[:6], 0, 0, NOTHING) == (0, 0, NEED_DATA)


@pytest.mark.parametrize("cut", [1, 6, 7, 8, 1031])
def test_scan_stops_at_an_incomplete_frame(cut: int) -> None:
    frames = publish(1, b"x" * 1024)
    data = frames[0] + frames[1] + frames[2][:cut]
    assert scan(data, 0, 0, NOTHING) == (len(frames[0]) + len(frames[1]), 2, NEED_DATA)


def test_scan_starts_at_the_offset_given() -> None:
    frames = publish(1, b"abc")
    data = b"".join(frames)
    assert scan(data, len(frames[0]), 0, NOTHING) == (len(data), 2, NEED_DATA)


def test_scan_stops_at_a_method_of_interest_and_resumes_after_it() -> None:
    frames = [HEARTBEAT, method(C.TuneOk(0, FRAME_MIN_SIZE, 0)), HEARTBEAT]
    data = b"".join(frames)
    key = method_key(10, 31)
    assert key == C.TuneOk.index
    assert scan(data, 0, 0, {key}) == (8, 1, key)
    assert scan(data, 8 + len(frames[1]), 0, {key}) == (len(data), 1, NEED_DATA)


def test_method_ids_and_frame_at() -> None:
    data = HEARTBEAT + method(CH.Close(200, "", 0, 0), 7)
    assert frame_at(data, 8) == (1, 7, len(data) - 8 - 8)
    assert method_ids(data, 8) == (20, 40)


def test_count_frames_between_boundaries() -> None:
    talk = conversation()
    data = talk.client_bytes
    second = len(talk.client[0])
    assert count_frames(data, second, len(data)) == len(talk.client) - 1
    assert count_frames(data, 0, 0) == 0


def test_payload_limit() -> None:
    assert payload_limit(4096) == 4088
    assert payload_limit(0) == 0xFFFFFFFF


@pytest.mark.parametrize("frame_max", [FRAME_MIN_SIZE, 131072])
def test_a_frame_of_exactly_frame_max_passes_one_more_byte_fails(frame_max: int) -> None:
    fits = raw_frame(3, 1, b"b" * (frame_max - 8))
    assert len(fits) == frame_max
    assert scan(fits, 0, frame_max, NOTHING) == (frame_max, 1, NEED_DATA)
    over = raw_frame(3, 1, b"b" * (frame_max - 7))
    with pytest.raises(FrameError) as caught:
        scan(HEARTBEAT + over, 0, frame_max, NOTHING, base_offset=100)
    assert caught.value.offset == 8
    assert caught.value.reason == (
        f"content body frame of {frame_max + 1} bytes on channel 1 at offset 108 "
        f"exceeds frame_max {frame_max}"
    )


def test_oversize_is_found_from_the_header_alone() -> None:
    header_only = raw_frame(3, 1, b"b" * 5000)[:7]
    with pytest.raises(FrameError, match="exceeds frame_max 4096"):
        scan(header_only, 0, FRAME_MIN_SIZE, NOTHING)


@pytest.mark.parametrize(
    ("data", "error", "reason"),
    [
        (
            raw_frame(1, 0, b"\x00\x0a\x00\x33", end=0x00),
            FrameError,
            "frame end octet 0x00 at offset 19, expected 0xce (method frame on channel 0 "
            "at offset 8)",
        ),
        (raw_frame(4, 1, b"abc"), FrameError, "unknown frame type 0x04 at offset 8"),
        (b"GET / HTTP/1.1\r\nHost: x\r\n\r\n", FrameError, "unknown frame type 0x47 at offset 8"),
        (raw_frame(1, 0, b"\x00\x0a"), FrameError, "2-byte payload, too short"),
        (raw_frame(8, 3, b""), FrameError, "heartbeat frame on channel 3 at offset 8, must be 0"),
        (raw_frame(8, 0, b"x"), FrameError, "heartbeat frame with a 1-byte payload at offset 8"),
        (raw_frame(3, 0, b"body"), UnexpectedFrame, "content body frame on channel 0 at offset 8"),
        (raw_frame(2, 0, b"x" * 14), UnexpectedFrame, "content header frame on channel 0"),
        # header problems outrank a bad frame end, as they do when the end has not arrived
        (raw_frame(9, 0, b"", end=0x00), FrameError, "unknown frame type 0x09"),
    ],
)
def test_frame_errors_name_the_problem_and_the_bad_frame(
    data: bytes, error: type[ProtocolError], reason: str
) -> None:
    stream = HEARTBEAT + data
    with pytest.raises(error) as caught:
        scan(stream, 0, 0, NOTHING)
    assert type(caught.value) is error
    assert reason in caught.value.reason
    assert caught.value.offset == 8
    # The same error once only the header is in, when the header shows it.
    if error is UnexpectedFrame or "frame end" not in reason:
        with pytest.raises(error) as early:
            scan(stream[:15], 0, 0, NOTHING)
        assert early.value.reason == caught.value.reason


def test_error_codes_and_texts() -> None:
    err = FrameError("frame end octet 0x00 at offset 3, expected 0xce", 0)
    assert (err.reply_code, err.condition) == (501, "501 FRAME_ERROR")
    assert err.reply_text == "FRAME_ERROR - frame end octet 0x00 at offset 3, expected 0xce"
    assert MethodSyntaxError("x", 0).condition == "502 SYNTAX_ERROR"
    assert UnexpectedFrame("x", 0).condition == "505 UNEXPECTED_FRAME"


def test_decode_method_reads_fields() -> None:
    data = HEARTBEAT + method(C.TuneOk(channel_max=7, frame_max=8192, heartbeat=30))
    tune = decode_method(data, 8, C.TuneOk)
    assert (tune.channel_max, tune.frame_max, tune.heartbeat) == (7, 8192, 30)


def test_decode_method_raises_syntax_error_with_the_method_ids() -> None:
    data = HEARTBEAT + raw_frame(1, 0, b"\x00\x0a\x00\x1f\x00\x01")  # tune-ok cut short
    with pytest.raises(MethodSyntaxError) as caught:
        decode_method(data, 8, C.TuneOk, base_offset=50)
    err = caught.value
    assert (err.class_id, err.method_id, err.offset) == (10, 31, 8)
    assert err.reason.startswith("cannot decode Connection.TuneOk on channel 0 at offset 58")


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), frame_max=st.sampled_from([0, 4096, 20]))
def test_scan_of_anything_returns_or_raises_a_protocol_error(data: bytes, frame_max: int) -> None:
    try:
        stop, frames, status = scan(data, 0, frame_max, NOTHING)
    except ProtocolError as err:
        assert 0 <= err.offset < len(data)
    else:
        assert status == NEED_DATA
        assert count_frames(data, 0, stop) == frames
        assert len(data) - stop < 7 or stop + 8 + frame_at(data, stop)[2] > len(data)


# -- scan_watching: a held channel's frames one by one, the others on the scan --------------


def _walk_watching(data: bytes, stop_at: frozenset[int], watched: frozenset[int]
                   ) -> list[tuple[int, int]]:
    """Every stop ``scan_watching`` makes over ``data``, resuming after each: (offset, status)."""
    stops, pos = [], 0
    while True:
        pos, _, status = scan_watching(data, pos, 0, stop_at, watched)
        if status == NEED_DATA:
            return stops
        stops.append((pos, status))
        pos += frame_at(data, pos)[2] + 8


def test_scan_watching_stops_at_every_frame_of_a_watched_channel_only() -> None:
    ch1 = publish(1, b"a" * 10)
    ch2 = publish(2, b"b" * 10)
    frames = [ch1[0], ch2[0], HEARTBEAT, ch2[1], ch1[1], ch2[2], ch1[2]]
    data = b"".join(frames)
    starts = [sum(len(f) for f in frames[:i]) for i in range(len(frames))]
    stops = _walk_watching(data, NOTHING, frozenset({1}))
    assert stops == [(starts[0], WATCHED), (starts[4], WATCHED), (starts[6], WATCHED)]
    # a method of interest on another channel stops as scan would; on a watched one: WATCHED
    key = ch2[0][7:11]
    pub_key = int.from_bytes(key, "big")
    stops = _walk_watching(data, frozenset({pub_key}), frozenset({1}))
    assert stops == [(starts[0], WATCHED), (starts[1], pub_key), (starts[4], WATCHED),
                     (starts[6], WATCHED)]
    # nothing watched: the same stops as scan
    assert _walk_watching(data, frozenset({pub_key}), NOTHING) == [(0, pub_key),
                                                                    (starts[1], pub_key)]


@pytest.mark.parametrize("cut", [1, 6, 7, 8, -1])
def test_scan_watching_waits_for_an_incomplete_frame_even_when_watched(cut: int) -> None:
    frames = publish(2, b"x" * 30) + publish(1, b"y" * 30)
    whole = b"".join(frames)
    at = sum(len(f) for f in frames[:3])
    data = whole[:at + (cut if cut > 0 else len(frames[3]) + cut)]
    assert scan_watching(data, 0, 0, NOTHING, frozenset({1})) == (at, 3, NEED_DATA)


def test_scan_watching_is_the_same_fed_whole_or_one_byte_at_a_time() -> None:
    frames = publish(1, b"a" * 40) + publish(2, b"b" * 40) + [HEARTBEAT] + publish(1, b"c")
    data = b"".join(frames)
    watched = frozenset({2})
    whole = _walk_watching(data, NOTHING, watched)
    # Byte at a time: what is complete of a growing prefix, resumed where it stopped.
    seen: list[tuple[int, int]] = []
    pos = 0
    for n in range(1, len(data) + 1):
        while True:
            pos, _, status = scan_watching(data[:n], pos, 0, NOTHING, watched)
            if status == NEED_DATA:
                break
            seen.append((pos, status))
            pos += frame_at(data, pos)[2] + 8
    assert seen == whole == [(sum(len(f) for f in frames[:i]), WATCHED) for i in (3, 4, 5)]


@settings(max_examples=300, deadline=None)
@given(data=st.binary(max_size=300), frame_max=st.sampled_from([0, 4096, 20]),
       watched=st.sampled_from([NOTHING, frozenset({0}), frozenset({1, 2})]))
def test_scan_watching_raises_what_scan_raises(data: bytes, frame_max: int,
                                              watched: frozenset[int]) -> None:
    """Watching changes where the scan stops, never which frame is wrong or why."""
    def outcome(fn: object) -> tuple[str, int, str] | None:
        pos = 0
        try:
            while True:
                if fn is scan:
                    pos, _, status = scan(data, pos, frame_max, NOTHING)
                else:
                    pos, _, status = scan_watching(data, pos, frame_max, NOTHING, watched)
                if status == NEED_DATA:
                    return None
                pos += frame_at(data, pos)[2] + 8
        except ProtocolError as err:
            return type(err).__name__, err.offset, err.reason
    assert outcome(scan_watching) == outcome(scan)
