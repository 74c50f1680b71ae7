"""The AMQP 1.0 type codec: every constructor decodes, values round-trip, bad bytes DecodeError."""

from __future__ import annotations

import math
import struct
import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from floodwall.wire.amqp10.errors import DecodeError, ProtocolError
from floodwall.wire.amqp10.types import (
    MAX_DEPTH,
    Array,
    Byte,
    Char,
    Decimal32,
    Decimal64,
    Decimal128,
    Described,
    Float32,
    Int,
    Short,
    Symbol,
    Timestamp,
    UByte,
    UInt,
    ULong,
    UShort,
    decode,
    decode_value,
    encode,
)

UUID = uuid.UUID("12345678-1234-5678-1234-567812345678")

# (wire bytes, value): every constructor code of part 1, including the wide forms the encoder
# never picks for small values.
VECTORS: list[tuple[bytes, object]] = [
    (b"\x40", None),
    (b"\x41", True),
    (b"\x42", False),
    (b"\x56\x01", True),
    (b"\x56\x00", False),
    (b"\x50\xff", UByte(255)),
    (b"\x60\x01\x00", UShort(256)),
    (b"\x70\x00\x00\x00\x05", UInt(5)),
    (b"\x52\x07", UInt(7)),
    (b"\x43", UInt(0)),
    (b"\x80\x00\x00\x00\x00\x00\x00\x00\x10", ULong(16)),
    (b"\x53\x10", ULong(16)),
    (b"\x44", ULong(0)),
    (b"\x51\xff", Byte(-1)),
    (b"\x61\xff\xfe", Short(-2)),
    (b"\x71\xff\xff\xff\xfd", Int(-3)),
    (b"\x54\xfc", Int(-4)),
    (b"\x81\xff\xff\xff\xff\xff\xff\xff\xfb", -5),
    (b"\x55\xfa", -6),
    (b"\x72\x3f\xc0\x00\x00", Float32(1.5)),
    (b"\x82" + struct.pack(">d", 2.25), 2.25),
    (b"\x74\x01\x02\x03\x04", Decimal32(b"\x01\x02\x03\x04")),
    (b"\x84" + bytes(range(8)), Decimal64(bytes(range(8)))),
    (b"\x94" + bytes(range(16)), Decimal128(bytes(range(16)))),
    (b"\x73\x00\x01\xf6\x00", Char("\U0001f600")),
    (b"\x83\x00\x00\x01\x8b\xcf\xe5\x68\x00", Timestamp(1700000000000)),
    (b"\x98" + UUID.bytes, UUID),
    (b"\xa0\x03abc", b"abc"),
    (b"\xb0\x00\x00\x00\x03abc", b"abc"),
    (b"\xa1\x02\xc3\xa9", "é"),
    (b"\xb1\x00\x00\x00\x02\xc3\xa9", "é"),
    (b"\xa3\x04PLAI", Symbol("PLAI")),
    (b"\xb3\x00\x00\x00\x01x", Symbol("x")),
    (b"\x45", []),
    (b"\xc0\x03\x02\x41\x40", [True, None]),
    (b"\xd0\x00\x00\x00\x06\x00\x00\x00\x02\x41\x40", [True, None]),
    (b"\xc1\x05\x02\xa3\x01k\x41", {Symbol("k"): True}),
    (b"\xd1\x00\x00\x00\x08\x00\x00\x00\x02\xa3\x01k\x41", {Symbol("k"): True}),
    (b"\xe0\x06\x02\xa3\x01a\x01b", Array(0xA3, (Symbol("a"), Symbol("b")))),
    (
        b"\xf0\x00\x00\x00\x0f\x00\x00\x00\x02\xb3\x00\x00\x00\x01a\x00\x00\x00\x01b",
        Array(0xB3, (Symbol("a"), Symbol("b"))),
    ),
    (b"\xe0\x02\x01\x41", Array(0x41, (True,))),
    (b"\xe0\x05\x02\x00\x53\x24\x45", Array(0x45, ([], []), ULong(0x24))),
    (b"\x00\x53\x10\x45", Described(ULong(0x10), [])),
    (b"\x00\xa3\x03a:b\x40", Described(Symbol("a:b"), None)),
]


@pytest.mark.parametrize(("wire", "value"), VECTORS, ids=[v[0][:1].hex() for v in VECTORS])
def test_decodes_every_constructor(wire: bytes, value: object) -> None:
    decoded = decode(wire)
    assert decoded == value
    assert type(decoded) is type(value)
    assert decode(encode(decoded)) == value  # and whatever form we pick decodes back


@pytest.mark.parametrize(
    ("value", "wire"),
    [
        (UInt(0), b"\x43"),
        (UInt(255), b"\x52\xff"),
        (UInt(256), b"\x70\x00\x00\x01\x00"),
        (ULong(0), b"\x44"),
        (ULong(0x13), b"\x53\x13"),
        (ULong(1 << 40), b"\x80\x00\x00\x01\x00\x00\x00\x00\x00"),
        (Int(-128), b"\x54\x80"),
        (Int(128), b"\x71\x00\x00\x00\x80"),
        (127, b"\x55\x7f"),
        (-129, b"\x81" + (-129).to_bytes(8, "big", signed=True)),
        (True, b"\x41"),
        (False, b"\x42"),
        (None, b"\x40"),
        (Symbol("amqp:decode-error"), b"\xa3\x11amqp:decode-error"),
        ("x" * 256, b"\xb1\x00\x00\x01\x00" + b"x" * 256),
        (b"", b"\xa0\x00"),
        ([], b"\x45"),
        ({}, b"\xc1\x01\x00"),
        ([None] * 254, b"\xc0\xff\xfe" + b"\x40" * 254),
        ([None] * 255, b"\xd0\x00\x00\x01\x03\x00\x00\x00\xff" + b"\x40" * 255),
        (Described(ULong(0x18), [None]), b"\x00\x53\x18\xc0\x02\x01\x40"),
    ],
)
def test_encodes_the_most_compact_form(value: object, wire: bytes) -> None:
    assert encode(value) == wire


def test_encode_refuses_python_types_without_an_amqp_mapping() -> None:
    with pytest.raises(TypeError):
        encode(object())
    with pytest.raises(TypeError):
        encode((1, 2))  # tuples are not lists


def test_decode_value_reports_where_the_value_ends() -> None:
    wire = b"\xff\x52\x07\x41"
    assert decode_value(wire, 1) == (UInt(7), 3)
    assert decode_value(wire, 1, 3) == (UInt(7), 3)


def test_nan_round_trips() -> None:
    value = decode(encode(float("nan")))
    assert isinstance(value, float) and math.isnan(value)


@pytest.mark.parametrize(
    ("wire", "reason_part"),
    [
        (b"", "no constructor"),
        (b"\x01", "unknown constructor 0x01"),
        (b"\x70\x00\x00", "uint needs 4 bytes"),
        (b"\x56\x02", "boolean octet 0x02"),
        (b"\x56", "boolean needs 1 byte"),
        (b"\x73\x00\x11\x00\x00", "not a Unicode code point"),
        (b"\xa1\x02\xc3", "overruns"),
        (b"\xa1\x01\xff", "not UTF-8"),
        (b"\xa3\x01\xc3", "not ASCII"),
        (b"\xb0\x00\x00", "length overruns"),
        (b"\xc0\x05\x03\x40\x40", "overruns"),
        (b"\xc0\x03\x03\x40\x40", "claims 3 elements"),
        (b"\xc0\x03\x01\x40\x40", "bytes after its 1 elements"),
        (b"\xc0\x00\x00", "size 0"),
        (b"\xc1\x02\x01\x40", "odd number"),
        (b"\xc1\x05\x02\x45\x40\x40\x40", "2 bytes after its 2 elements"),
        (b"\xc1\x03\x02\x45\x40", "unhashable"),
        (b"\xe0\x02\x03\x41", "claims 3 elements"),  # zero-width elements: count <= bytes
        (b"\xe0\x01\x00", "no element constructor"),
        (b"\xe0\x02\x01\x01", "invalid element constructor 0x01"),
        (b"\xe0\x03\x01\x00\x40", "no element constructor"),
        (b"\xe0\x02\x01\x70", "uint needs 4 bytes"),
        (b"\xd0\xff\xff\xff\xff\xff\xff\xff\xff", "overruns"),
        (b"\x00\x53\x10", "no constructor"),
        (b"\x40\x40", "1 bytes after the value"),
    ],
)
def test_malformed_values_raise_decode_error(wire: bytes, reason_part: str) -> None:
    with pytest.raises(DecodeError) as caught:
        decode(wire)
    assert isinstance(caught.value, ProtocolError)
    assert caught.value.condition == "amqp:decode-error"
    assert reason_part in str(caught.value)


def test_nesting_is_bounded() -> None:
    deep: object = None
    for _ in range(MAX_DEPTH + 1):
        deep = [deep]
    with pytest.raises(DecodeError, match="deeper"):
        decode(encode(deep))
    shallow: object = None
    for _ in range(MAX_DEPTH - 1):
        shallow = [shallow]
    assert decode(encode(shallow)) == shallow


def test_a_huge_array_count_is_refused_before_any_work() -> None:
    wire = b"\xf0\x00\x00\x00\x05\xff\xff\xff\xff\x40"  # 4G nulls in 5 bytes
    with pytest.raises(DecodeError, match="claims"):
        decode(wire)


# -- property tests ----------------------------------------------------------------------------

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(0, 255).map(UByte),
    st.integers(0, 2**16 - 1).map(UShort),
    st.integers(0, 2**32 - 1).map(UInt),
    st.integers(0, 2**64 - 1).map(ULong),
    st.integers(-(2**7), 2**7 - 1).map(Byte),
    st.integers(-(2**15), 2**15 - 1).map(Short),
    st.integers(-(2**31), 2**31 - 1).map(Int),
    st.integers(-(2**63), 2**63 - 1),
    st.floats(allow_nan=False, width=32).map(Float32),
    st.floats(allow_nan=False),
    st.binary(min_size=4, max_size=4).map(Decimal32),
    st.binary(min_size=8, max_size=8).map(Decimal64),
    st.binary(min_size=16, max_size=16).map(Decimal128),
    st.characters().map(Char),
    st.integers(-(2**63), 2**63 - 1).map(Timestamp),
    st.uuids(),
    st.binary(max_size=300),
    st.text(max_size=300),
    st.text(st.characters(max_codepoint=127), max_size=300).map(Symbol),
)
_keys = st.one_of(st.text(st.characters(max_codepoint=127), max_size=20).map(Symbol), st.text())
_symbol_arrays = st.lists(st.text(st.characters(max_codepoint=127), max_size=10).map(Symbol)).map(
    lambda items: Array(0xA3, tuple(items))
)
_uint_arrays = st.lists(st.integers(0, 2**32 - 1).map(UInt)).map(
    lambda items: Array(0x70, tuple(items))
)
values = st.recursive(
    st.one_of(_scalars, _symbol_arrays, _uint_arrays),
    lambda children: st.one_of(
        st.lists(children, max_size=8),
        st.dictionaries(_keys, children, max_size=5),
        st.builds(Described, st.integers(0, 2**64 - 1).map(ULong), children),
    ),
    max_leaves=30,
)


def _same(a: object, b: object) -> bool:
    """Equal and of the same AMQP type all the way down."""
    if type(a) is not type(b):
        return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, Described) and isinstance(b, Described):
        return _same(a.descriptor, b.descriptor) and _same(a.value, b.value)
    return a == b


@given(values)
def test_values_round_trip_with_their_types(value: object) -> None:
    assert _same(decode(encode(value)), value)


@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_decode_error(data: bytes) -> None:
    try:
        decode(data)
    except DecodeError:
        pass


@given(values, st.data())
def test_mutated_encodings_decode_or_raise_decode_error(value: object, data: st.DataObject) -> None:
    wire = bytearray(encode(value))
    if not wire:
        return
    for _ in range(data.draw(st.integers(1, 4))):
        index = data.draw(st.integers(0, len(wire) - 1))
        wire[index] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(wire)))
    try:
        decode(bytes(wire[:cut]))
    except DecodeError:
        pass
