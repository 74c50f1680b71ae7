"""Protocol detection from the first bytes of a connection."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.wire.detect import (
    AMQP091_HEADER,
    AMQP10_HEADER,
    AMQP10_SASL_HEADER,
    Detected,
    detect,
    header_reply,
)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (AMQP091_HEADER, Detected.AMQP091),
        (AMQP10_HEADER, Detected.AMQP10),
        (AMQP10_SASL_HEADER, Detected.AMQP10),
        (AMQP091_HEADER + b"\x01\x00\x00", Detected.AMQP091),
        (b"AMQP\x00\x00\x09\x02", Detected.UNSUPPORTED),
        (b"AMQP\x01\x01\x00\x09", Detected.UNSUPPORTED),  # 0-9 (pre-0-9-1) header
        (b"AMQP\x02\x01\x00\x00", Detected.UNSUPPORTED),  # 1.0 over TLS
        (b"GET / HTTP/1.1\r\n", Detected.UNSUPPORTED),
    ],
)
def test_whole_headers(head: bytes, expected: Detected) -> None:
    assert detect(head) is expected


@pytest.mark.parametrize("header", [AMQP091_HEADER, AMQP10_HEADER, AMQP10_SASL_HEADER])
def test_a_known_header_arriving_byte_by_byte_needs_data_until_complete(header: bytes) -> None:
    for i in range(len(header)):
        assert detect(header[:i]) is Detected.NEED_DATA
    assert detect(header) is not Detected.NEED_DATA


def test_non_amqp_bytes_are_refused_without_waiting_for_eight() -> None:
    assert detect(b"GE") is Detected.UNSUPPORTED
    assert detect(b"AMQX") is Detected.UNSUPPORTED


@pytest.mark.parametrize(
    ("head", "reply"),
    [
        (b"GET / HTTP/1.1", AMQP091_HEADER),
        (b"AMQP\x01\x01\x00\x09", AMQP091_HEADER),
        (b"AMQP\x00\x00\x09\x02", AMQP091_HEADER),
        (b"AMQP\x02\x01\x00\x00", AMQP10_SASL_HEADER),  # TLS asked: offer SASL
        (b"AMQP\x00\x01\x00\x01", AMQP10_HEADER),
        (b"AMQP\x03\x01\x01\x00", AMQP10_SASL_HEADER),
    ],
)
def test_unsupported_headers_get_the_nearest_header_we_speak(head: bytes, reply: bytes) -> None:
    assert detect(head) is Detected.UNSUPPORTED
    assert header_reply(head) == reply


@given(st.binary(max_size=16))
def test_any_input_is_classified(head: bytes) -> None:
    found = detect(head)
    assert isinstance(found, Detected)
    if found is Detected.UNSUPPORTED:
        assert header_reply(head) in (AMQP091_HEADER, AMQP10_HEADER, AMQP10_SASL_HEADER)
