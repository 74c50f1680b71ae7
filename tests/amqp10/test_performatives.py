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


def test_open_reads_the_peers_version_property() -> None:
    body = encode_performative(OPEN, container_id="c", properties={
        Symbol("product"): "RabbitMQ", Symbol("version"): "4.0.5"})
    assert Open.from_fields(fields_of(body)).version == "4.0.5"
    odd = encode_performative(OPEN, container_id="c", properties={Symbol("version"): UInt(4)})
    assert Open.from_fields(fields_of(odd)).version is None  # not a string: unknown


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


def test_named_field_positions_come_from_the_layouts() -> None:
    from floodwall.wire.amqp10.performatives import (
        DISPOSITION,
        FLOW,
        LAYOUTS,
        MESSAGE_PROPERTIES_LAYOUT,
        TRANSFER,
        DispositionFields,
        FlowFields,
        MessageProperties,
        TransferFields,
        field_label,
    )

    for names, code in ((FlowFields, FLOW), (TransferFields, TRANSFER),
                        (DispositionFields, DISPOSITION)):
        fields = LAYOUTS[code][1]
        for attr, index in vars(names).items():
            if attr.isupper():
                assert fields[index] == attr.lower().replace("_", "-"), (code, attr)
    assert MESSAGE_PROPERTIES_LAYOUT[MessageProperties.TO] == "to"
    assert MESSAGE_PROPERTIES_LAYOUT[MessageProperties.SUBJECT] == "subject"
    assert field_label(FLOW, FlowFields.HANDLE) == "flow.handle"
    assert field_label(TRANSFER, TransferFields.DELIVERY_ID) == "transfer.delivery-id"


def test_peek_disposition_agrees_with_decode_composite_or_declines() -> None:
    """Where the full decoder reads a disposition, the peek gives its role, first, last
    (last = first when null or absent) and state's descriptor code (0: none), or declines;
    never a value the bytes do not say."""
    from floodwall.wire.amqp10.performatives import DISPOSITION, peek_disposition
    from floodwall.wire.amqp10.types import Described, UByte, ULong, encode

    rng = random.Random(12)
    roles: list[object] = [True, False, None, UInt(1)]
    numbers: list[object] = [UInt(0), UInt(5), UInt(300), UInt(2**32 - 1), None, UByte(1),
                             ULong(3), b"x"]
    tails: list[object] = [None, True, False, Described(ULong(0x24), []), "s",
                           Described(ULong(0x26), []), Described(ULong(0x25), [None])]
    samples = []
    for _ in range(3000):
        fields = [rng.choice(roles), rng.choice(numbers), rng.choice(numbers),
                  rng.choice(tails), rng.choice(tails), rng.choice(tails)]
        raw = bytearray(encode(Described(ULong(DISPOSITION), fields[:rng.randrange(7)])))
        for _ in range(rng.choice([0, 0, 1, 2])):
            raw[rng.randrange(len(raw))] = rng.randrange(256)
        if rng.random() < 0.2:
            raw = raw[: rng.randrange(len(raw) + 1)]
        samples.append(b"xx" + bytes(raw))
    peeked = 0
    for buf in _composite_samples() + samples:
        fast = peek_disposition(buf, 2, len(buf))
        try:
            code, fields, _ = decode_composite(buf, 2, len(buf))
        except DecodeError:
            continue
        if fast is None:
            continue
        peeked += 1
        assert code == DISPOSITION
        last = fields[2] if len(fields) > 2 and fields[2] is not None else fields[1]
        state = fields[4] if len(fields) > 4 else None
        code = 0 if state is None else state.descriptor  # type: ignore[attr-defined]
        assert fast == (fields[0], fields[1], last, code)
        assert isinstance(fields[0], bool) and isinstance(fields[1], UInt)
        assert len(fields) < 4 or fields[3] is None or isinstance(fields[3], bool)
    assert peeked > 100


@pytest.mark.parametrize("first,last", [(0, None), (0, 0), (5, 300), (300, 2**32 - 1)])
@pytest.mark.parametrize("role", [True, False])
def test_peek_disposition_reads_the_brokers_encodings(first: int, last: int | None,
                                                      role: bool) -> None:
    from floodwall.wire.amqp10.performatives import (
        DISPOSITION,
        encode_performative,
        peek_disposition,
    )
    from floodwall.wire.amqp10.types import Described, UInt, ULong

    accepted = Described(ULong(0x24), [])
    expected = (role, first, first if last is None else last)
    for body, state in (
        (encode_performative(DISPOSITION, role=role, first=UInt(first),
                             last=None if last is None else UInt(last), settled=True,
                             state=accepted), 0x24),
        (encode_performative(DISPOSITION, role=role, first=UInt(first),
                             last=None if last is None else UInt(last)), 0),
        (encode_performative(DISPOSITION, role=role, first=UInt(first),
                             last=None if last is None else UInt(last), settled=True,
                             state=accepted, batchable=True), 0x24),
        (encode_performative(DISPOSITION, role=role, first=UInt(first),
                             last=None if last is None else UInt(last), settled=True,
                             state=Described(ULong(0x26), [])), 0x26),
    ):
        assert peek_disposition(body, 0, len(body)) == (*expected, state)
    for body in (
        encode_performative(DISPOSITION, role=role, first=UInt(first),
                            last=None if last is None else UInt(last), settled=True,
                            state=accepted),
        encode_performative(DISPOSITION, role=role, first=UInt(first),
                            last=None if last is None else UInt(last)),
        encode_performative(DISPOSITION, role=role, first=UInt(first),
                            last=None if last is None else UInt(last), settled=True,
                            state=accepted, batchable=True),
    ):
        assert peek_disposition(body, 0, len(body))[:3] == expected  # type: ignore[index]
    # role as the 2-byte boolean form
    body = encode_performative(DISPOSITION, role=role, first=UInt(first))
    two_byte = body[:6] + (b"\x56\x01" if role else b"\x56\x00") + body[7:]
    two_byte = two_byte[:4] + bytes((two_byte[4] + 1,)) + two_byte[5:]  # list8 size + 1
    assert peek_disposition(two_byte, 0, len(two_byte)) == (role, first, first, 0)
    assert decode_composite(two_byte, 0, len(two_byte))[1][:2] == [role, UInt(first)]


def test_peek_disposition_declines_what_it_does_not_read() -> None:
    from floodwall.wire.amqp10.performatives import (
        DISPOSITION,
        FLOW,
        encode_performative,
        peek_disposition,
    )
    from floodwall.wire.amqp10.types import UInt

    body = encode_performative(DISPOSITION, role=True, first=UInt(7), last=UInt(9),
                               settled=True)
    assert peek_disposition(body, 0, len(body)) == (True, 7, 9, 0)
    for cut in range(len(body)):  # cut short anywhere: declined, never misread
        assert peek_disposition(body[:cut], 0, cut) is None
    flow = encode_performative(FLOW, next_incoming_id=UInt(1), incoming_window=UInt(2),
                               next_outgoing_id=UInt(3), outgoing_window=UInt(4))
    assert peek_disposition(flow, 0, len(flow)) is None  # not a disposition
    assert peek_disposition(b"\x00\x53\x15\x45", 0, 4) is None  # list0: no first
    list32 = (b"\x00\x53\x15\xd0" + (1 + 4 + 5 + 1).to_bytes(4, "big") + (2).to_bytes(4, "big")
              + b"\x41\x70\x00\x00\x00\x07")
    assert peek_disposition(list32, 0, len(list32)) is None
    ulong_code = b"\x00\x80" + DISPOSITION.to_bytes(8, "big") + body[3:]
    assert peek_disposition(ulong_code, 0, len(ulong_code)) is None
    wrong_role = body[:6] + b"\x43" + body[7:]  # a uint where the boolean goes
    assert peek_disposition(wrong_role, 0, len(wrong_role)) is None
    wrong_first = body[:7] + b"\xa1\x01x" + body[12:]
    assert peek_disposition(wrong_first, 0, len(wrong_first)) is None
