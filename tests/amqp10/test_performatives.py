"""Performative layouts and the typed views of open, begin, attach, detach, end, close, SASL."""

from __future__ import annotations

import random

import pytest

from floodwall.wire.amqp10.errors import DecodeError
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    BEGIN,
    CLOSE,
    COORDINATOR,
    DETACH,
    OPEN,
    SASL_OUTCOME,
    SOURCE,
    TARGET,
    Attach,
    Begin,
    Detach,
    Ending,
    ErrorInfo,
    Open,
    Role,
    SaslOutcome,
    close_body,
    decode_composite,
    descriptor_code,
    encode_performative,
    performative,
)
from floodwall.wire.amqp10.types import Described, Symbol, UByte, UInt, ULong, UShort, encode


def fields_of(body: bytes) -> list[object]:
    return decode_composite(body, 0, len(body))[1]


def test_open_defaults_follow_the_spec() -> None:
    opened = Open.from_fields(fields_of(encode_performative(OPEN, container_id="c")))
    assert opened == Open("c", None, 0xFFFFFFFF, 0xFFFF, None)


def test_open_reads_its_limits() -> None:
    body = encode_performative(
        OPEN,
        container_id="c",
        hostname="h",
        max_frame_size=UInt(4096),
        channel_max=UShort(9),
        idle_time_out=UInt(60000),
    )
    assert Open.from_fields(fields_of(body)) == Open("c", "h", 4096, 9, 60000)


def test_open_refuses_a_max_frame_size_of_the_wrong_wire_type() -> None:
    body = encode_performative(OPEN, container_id="c", max_frame_size=ULong(4096))
    with pytest.raises(DecodeError, match=r"open\.max-frame-size is ULong, expected UInt"):
        Open.from_fields(fields_of(body))


def test_begin_needs_its_mandatory_fields() -> None:
    body = encode_performative(BEGIN, next_outgoing_id=UInt(0), incoming_window=UInt(5))
    with pytest.raises(DecodeError, match=r"begin\.outgoing-window is mandatory"):
        Begin.from_fields(fields_of(body))


def test_attach_reads_role_and_addresses() -> None:
    body = encode_performative(
        ATTACH,
        name="l",
        handle=UInt(3),
        role=True,
        source=performative(SOURCE, address="q1"),
        target=performative(TARGET),
    )
    assert Attach.from_fields(fields_of(body)) == Attach("l", 3, Role.RECEIVER, "q1", None)


def test_attach_to_a_transaction_coordinator() -> None:
    body = encode_performative(
        ATTACH, name="txn", handle=UInt(0), role=False, target=performative(COORDINATOR)
    )
    attach = Attach.from_fields(fields_of(body))
    assert attach.coordinator and attach.target_address is None


def test_attach_refuses_a_source_that_is_not_a_source() -> None:
    body = encode_performative(
        ATTACH, name="l", handle=UInt(0), role=False, source=performative(TARGET)
    )
    with pytest.raises(DecodeError, match="attach holds a target"):
        Attach.from_fields(fields_of(body))


def test_detach_and_close_carry_errors() -> None:
    error = ErrorInfo("amqp:not-found", "no queue")
    body = encode_performative(DETACH, handle=UInt(2), closed=True, error=error.to_value())
    assert Detach.from_fields(fields_of(body)) == Detach(2, True, error)
    assert Ending.from_fields(fields_of(close_body("amqp:x", "y"))) == Ending(
        ErrorInfo("amqp:x", "y")
    )
    assert Ending.from_fields(fields_of(encode_performative(CLOSE))) == Ending(None)


def test_sasl_outcome_code() -> None:
    body = encode_performative(SASL_OUTCOME, code=UByte(1))
    assert SaslOutcome.from_fields(fields_of(body)) == SaslOutcome(1)


def test_descriptor_codes_by_number_or_symbol() -> None:
    assert descriptor_code(ULong(0x12)) == ATTACH
    assert descriptor_code(Symbol("amqp:attach:list")) == ATTACH
    assert descriptor_code(Symbol("com.example:thing")) is None
    assert descriptor_code("amqp:attach:list") is None  # a string is not a symbol


def test_performative_drops_trailing_nulls_and_checks_names() -> None:
    assert performative(OPEN, container_id="c") == Described(ULong(OPEN), ["c"])
    assert encode(performative(CLOSE)) == b"\x00\x53\x18\x45"
    with pytest.raises(TypeError):
        performative(OPEN, container="c")


def test_a_performative_that_is_not_a_described_list_is_refused() -> None:
    with pytest.raises(DecodeError, match="not a list"):
        decode_composite(b"\x00\x53\x10\x40", 0, 4)
    with pytest.raises(DecodeError, match="expected a described list"):
        decode_composite(b"\x45", 0, 1)
    with pytest.raises(DecodeError, match="unknown descriptor"):
        decode_composite(b"\x00\xa3\x01x\x45", 0, 5)


def _composite_samples() -> list[bytes]:
    """Transfer, flow and disposition bodies, whole, cut short and with a byte changed."""
    from floodwall.wire.amqp10.performatives import DISPOSITION, FLOW, TRANSFER
    from floodwall.wire.amqp10.types import Described, UByte, UInt, ULong, encode

    rng = random.Random(7)
    values: list[object] = [None, True, False, UInt(0), UInt(5), UInt(300), UInt(2**32 - 1),
                            UByte(1), b"", b"tag", ULong(3), "s", Described(ULong(0x24), [])]
    samples = []
    for _ in range(3000):
        code = rng.choice([TRANSFER, FLOW, DISPOSITION])
        fields = [rng.choice(values) for _ in range(rng.randrange(12))]
        raw = bytearray(encode(Described(ULong(code), fields)) + b"payload")
        for _ in range(rng.choice([0, 0, 1, 2])):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if rng.random() < 0.2:
            raw = raw[: rng.randrange(len(raw) + 1)]
        samples.append(b"xx" + bytes(raw))
    return samples


def test_peek_composite_agrees_with_decode_composite_or_declines() -> None:
    from floodwall.wire.amqp10.performatives import peek_composite

    peeked = 0
    for buf in _composite_samples():
        fast = peek_composite(buf, 2, len(buf))
        if fast is None:
            continue
        peeked += 1
        _, fields, stop = decode_composite(buf, 2, len(buf))  # never raises where peek reads
        assert (fields, stop) == fast
        assert [type(f) for f in fields] == [type(f) for f in fast[0]]
    assert peeked > 300


@pytest.mark.parametrize("handle", [0, 1, 255, 256, 2**32 - 1])
@pytest.mark.parametrize("delivery_id", [0, 7, 300, 2**31])
@pytest.mark.parametrize("tag", [b"", b"\x00\x00\x00\x01", b"t" * 32, b"t" * 33])
@pytest.mark.parametrize("more", [False, True])
def test_transfer_body_is_the_bytes_the_generic_encoder_makes(handle: int, delivery_id: int,
                                                              tag: bytes, more: bool) -> None:
    from floodwall.wire.amqp10.performatives import TRANSFER, encode_performative, transfer_body

    for message_format in (0, 0x80013700):
        assert transfer_body(handle, delivery_id, tag, message_format, more) == \
            encode_performative(TRANSFER, handle=UInt(handle), delivery_id=UInt(delivery_id),
                                delivery_tag=tag, message_format=UInt(message_format),
                                settled=False, more=more)
