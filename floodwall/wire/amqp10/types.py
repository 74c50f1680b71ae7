"""The AMQP 1.0 type system (spec part 1): decodes every encoding, encodes what the proxy emits."""

from __future__ import annotations

import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Final

from floodwall.wire.amqp10.errors import DecodeError, ProtocolError

__all__ = [
    "MAX_DEPTH",
    "Array",
    "Byte",
    "Char",
    "Decimal32",
    "Decimal64",
    "Decimal128",
    "DecodeError",
    "Described",
    "Float32",
    "Int",
    "ProtocolError",
    "Short",
    "Symbol",
    "Timestamp",
    "UByte",
    "UInt",
    "ULong",
    "UShort",
    "decode",
    "decode_value",
    "encode",
    "encode_into",
]

MAX_DEPTH: Final = 32
"""Deepest nesting of compound and described values we decode; deeper input is malformed."""


# ---------------------------------------------------------------------------------------------
# Python types for the AMQP types that Python's own types cannot tell apart.
# Decoding returns them; encoding picks the wire type from them. Plain ``int`` is ``long``,
# ``float`` is ``double``, ``str`` is ``string``, ``bytes`` is ``binary``, ``list`` is ``list``,
# ``dict`` is ``map``, ``uuid.UUID`` is ``uuid``, ``None`` is ``null``, ``bool`` is ``boolean``.


class _TypedRepr:
    """Shows the AMQP type in reprs, so test failures say ``UInt(5)`` rather than ``5``."""

    __slots__ = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({super().__repr__()})"


class Symbol(_TypedRepr, str):
    """AMQP ``symbol``: an ASCII name from a constrained domain."""

    __slots__ = ()


class Char(_TypedRepr, str):
    """AMQP ``char``: one Unicode code point."""

    __slots__ = ()


class UByte(_TypedRepr, int):
    """AMQP ``ubyte``."""

    __slots__ = ()


class UShort(_TypedRepr, int):
    """AMQP ``ushort``."""

    __slots__ = ()


class UInt(_TypedRepr, int):
    """AMQP ``uint``."""

    __slots__ = ()


class ULong(_TypedRepr, int):
    """AMQP ``ulong``."""

    __slots__ = ()


class Byte(_TypedRepr, int):
    """AMQP ``byte`` (signed)."""

    __slots__ = ()


class Short(_TypedRepr, int):
    """AMQP ``short``."""

    __slots__ = ()


class Int(_TypedRepr, int):
    """AMQP ``int`` (32-bit; plain Python ``int`` encodes as ``long``)."""

    __slots__ = ()


class Timestamp(_TypedRepr, int):
    """AMQP ``timestamp``: milliseconds since the Unix epoch."""

    __slots__ = ()


class Float32(_TypedRepr, float):
    """AMQP ``float`` (IEEE 754 binary32; plain Python ``float`` encodes as ``double``)."""

    __slots__ = ()


class Decimal32(_TypedRepr, bytes):
    """AMQP ``decimal32``, kept as its 4 raw IEEE 754 bytes."""

    __slots__ = ()


class Decimal64(_TypedRepr, bytes):
    """AMQP ``decimal64``, kept as its 8 raw IEEE 754 bytes."""

    __slots__ = ()


class Decimal128(_TypedRepr, bytes):
    """AMQP ``decimal128``, kept as its 16 raw IEEE 754 bytes."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Described:
    """A described type: a descriptor (usually ``ULong`` or ``Symbol``) and the value it labels."""

    descriptor: object
    value: object


@dataclass(frozen=True, slots=True)
class Array:
    """An AMQP array: elements of one wire type, named by its constructor ``code``.

    ``descriptor`` is set when every element is described by the same descriptor; ``items``
    then holds the undescribed values.
    """

    code: int
    items: tuple[object, ...]
    descriptor: object = None


# ---------------------------------------------------------------------------------------------
# Decoding: one small decoder per constructor code, made by the factories below.
# A decoder reads the value after its constructor byte from buf[pos:end] and returns the value
# and the position just after it. It raises DecodeError for anything malformed, including a
# value that overruns ``end`` (the framer hands over whole frames, so short means malformed).

Decoder = Callable[[bytes, int, int, int], tuple[object, int]]

_U8 = struct.Struct(">B")
_U32 = struct.Struct(">I")
_U8_PAIR = struct.Struct(">BB")
_U32_PAIR = struct.Struct(">II")


def _constant(name: str, make: Callable[[], object]) -> Decoder:
    """A zero-width encoding whose constructor is the whole value (null, true, uint0, list0...)."""

    def decode(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
        return make(), pos

    decode.__name__ = f"decode_{name}"
    return decode


def _fixed(name: str, fmt: str, wrap: Callable[[Any], object]) -> Decoder:
    """A fixed-width encoding read with one struct format."""
    layout = struct.Struct(fmt)
    width = layout.size

    def decode(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
        stop = pos + width
        if stop > end:
            raise DecodeError(f"{name} needs {width} bytes, {max(end - pos, 0)} left")
        return wrap(layout.unpack_from(buf, pos)[0]), stop

    decode.__name__ = f"decode_{name}"
    return decode


def _variable(name: str, width: int, convert: Callable[[bytes], object]) -> Decoder:
    """A variable-width encoding: a 1- or 4-byte length, then that many bytes."""
    length = _U8 if width == 1 else _U32

    def decode(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
        start = pos + width
        if start > end:
            raise DecodeError(f"{name} length overruns its container")
        stop = start + length.unpack_from(buf, pos)[0]
        if stop > end:
            raise DecodeError(f"{name} of {stop - start} bytes overruns its container")
        return convert(buf[start:stop]), stop

    decode.__name__ = f"decode_{name}"
    return decode


def _sized_header(
    name: str, width: int, buf: bytes, pos: int, end: int, depth: int
) -> tuple[int, int, int]:
    """Read a compound or array's size and count; return (count, first element pos, stop)."""
    if depth >= MAX_DEPTH:
        raise DecodeError(f"{name} nested deeper than {MAX_DEPTH}")
    first = pos + 2 * width
    if first > end:
        raise DecodeError(f"{name} header overruns its container")
    size, count = (_U8_PAIR if width == 1 else _U32_PAIR).unpack_from(buf, pos)
    stop = pos + width + size
    if size < width or stop > end:
        raise DecodeError(f"{name} size {size} overruns its container")
    if count > stop - first:  # every element takes at least one byte (or, in arrays, bounds work)
        raise DecodeError(f"{name} claims {count} elements in {size} bytes")
    return count, first, stop


def _compound(name: str, width: int, build: Callable[[list[object]], object]) -> Decoder:
    """list8/list32/map8/map32: size, count, then ``count`` self-describing values."""

    def decode(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
        count, p, stop = _sized_header(name, width, buf, pos, end, depth)
        items: list[object] = []
        for _ in range(count):
            item, p = decode_value(buf, p, stop, depth + 1)
            items.append(item)
        if p != stop:
            raise DecodeError(f"{name} has {stop - p} bytes after its {count} elements")
        return build(items), stop

    decode.__name__ = f"decode_{name}"
    return decode


def _array(name: str, width: int) -> Decoder:
    """array8/array32: size, count, one element constructor, then ``count`` bare elements."""

    def decode(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
        count, p, stop = _sized_header(name, width, buf, pos, end, depth)
        descriptor: object = None
        if p < stop and buf[p] == 0x00:
            descriptor, p = decode_value(buf, p + 1, stop, depth + 1)
        if p >= stop:
            raise DecodeError(f"{name} has no element constructor")
        code = buf[p]
        element = _DECODERS[code]
        if element is None or code == 0x00:
            raise DecodeError(f"{name} has invalid element constructor 0x{code:02x}")
        p += 1
        items: list[object] = []
        for _ in range(count):
            item, p = element(buf, p, stop, depth + 1)
            items.append(item)
        if p != stop:
            raise DecodeError(f"{name} has {stop - p} bytes after its {count} elements")
        return Array(code, tuple(items), descriptor), stop

    decode.__name__ = f"decode_{name}"
    return decode


def _described(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
    if depth >= MAX_DEPTH:
        raise DecodeError(f"described value nested deeper than {MAX_DEPTH}")
    descriptor, pos = decode_value(buf, pos, end, depth + 1)
    value, pos = decode_value(buf, pos, end, depth + 1)
    return Described(descriptor, value), pos


def _boolean(buf: bytes, pos: int, end: int, depth: int) -> tuple[object, int]:
    if pos >= end:
        raise DecodeError("boolean needs 1 byte, 0 left")
    octet = buf[pos]
    if octet > 1:
        raise DecodeError(f"boolean octet 0x{octet:02x} is neither 0x00 nor 0x01")
    return octet == 1, pos + 1


def _char(code_point: int) -> Char:
    if code_point > 0x10FFFF:
        raise DecodeError(f"char 0x{code_point:x} is not a Unicode code point")
    return Char(chr(code_point))


def _utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DecodeError(f"string is not UTF-8: {exc.reason}") from None


def _ascii(raw: bytes) -> Symbol:
    try:
        return Symbol(raw.decode("ascii"))
    except UnicodeDecodeError:
        raise DecodeError("symbol is not ASCII") from None


def _map(items: list[object]) -> dict[object, object]:
    if len(items) % 2:
        raise DecodeError(f"map has an odd number ({len(items)}) of keys and values")
    try:
        return dict(zip(items[0::2], items[1::2], strict=True))
    except TypeError:  # a list or map used as a key: legal AMQP we cannot represent
        raise DecodeError("map key of an unhashable type (list or map)") from None


_DECODER_TABLE: Final[tuple[tuple[int, Decoder], ...]] = (
    (0x00, _described),
    (0x40, _constant("null", lambda: None)),
    (0x41, _constant("true", lambda: True)),
    (0x42, _constant("false", lambda: False)),
    (0x56, _boolean),
    (0x50, _fixed("ubyte", ">B", UByte)),
    (0x60, _fixed("ushort", ">H", UShort)),
    (0x70, _fixed("uint", ">I", UInt)),
    (0x52, _fixed("smalluint", ">B", UInt)),
    (0x43, _constant("uint0", lambda: UInt(0))),
    (0x80, _fixed("ulong", ">Q", ULong)),
    (0x53, _fixed("smallulong", ">B", ULong)),
    (0x44, _constant("ulong0", lambda: ULong(0))),
    (0x51, _fixed("byte", ">b", Byte)),
    (0x61, _fixed("short", ">h", Short)),
    (0x71, _fixed("int", ">i", Int)),
    (0x54, _fixed("smallint", ">b", Int)),
    (0x81, _fixed("long", ">q", int)),
    (0x55, _fixed("smalllong", ">b", int)),
    (0x72, _fixed("float", ">f", Float32)),
    (0x82, _fixed("double", ">d", float)),
    (0x74, _fixed("decimal32", "4s", Decimal32)),
    (0x84, _fixed("decimal64", "8s", Decimal64)),
    (0x94, _fixed("decimal128", "16s", Decimal128)),
    (0x73, _fixed("char", ">I", _char)),
    (0x83, _fixed("timestamp", ">q", Timestamp)),
    (0x98, _fixed("uuid", "16s", lambda raw: uuid.UUID(bytes=raw))),
    (0xA0, _variable("vbin8", 1, bytes)),
    (0xB0, _variable("vbin32", 4, bytes)),
    (0xA1, _variable("str8-utf8", 1, _utf8)),
    (0xB1, _variable("str32-utf8", 4, _utf8)),
    (0xA3, _variable("sym8", 1, _ascii)),
    (0xB3, _variable("sym32", 4, _ascii)),
    (0x45, _constant("list0", list)),
    (0xC0, _compound("list8", 1, list)),
    (0xD0, _compound("list32", 4, list)),
    (0xC1, _compound("map8", 1, _map)),
    (0xD1, _compound("map32", 4, _map)),
    (0xE0, _array("array8", 1)),
    (0xF0, _array("array32", 4)),
)

_DECODERS: Final[list[Decoder | None]] = [None] * 256
for _code, _decoder in _DECODER_TABLE:
    _DECODERS[_code] = _decoder


def decode_value(buf: bytes, pos: int = 0, end: int | None = None, depth: int = 0) -> tuple[
    object, int
]:
    """Decode the one value starting at ``buf[pos]`` and ending by ``end``; return it and its end.

    Raises DecodeError for malformed or truncated input; never any other exception.
    """
    if end is None:
        end = len(buf)
    if pos >= end:
        raise DecodeError("value missing: no constructor byte left")
    decoder = _DECODERS[buf[pos]]
    if decoder is None:
        raise DecodeError(f"unknown constructor 0x{buf[pos]:02x}")
    return decoder(buf, pos + 1, end, depth)


def decode(data: bytes) -> object:
    """Decode ``data`` as exactly one value; trailing bytes are malformed."""
    value, pos = decode_value(data, 0, len(data))
    if pos != len(data):
        raise DecodeError(f"{len(data) - pos} bytes after the value")
    return value


# ---------------------------------------------------------------------------------------------
# Encoding: a payload writer per constructor code (also used for array elements), and a writer
# per Python type that picks the most compact constructor for the value.

PayloadWriter = Callable[[bytearray, Any], None]


def _nothing(out: bytearray, value: Any) -> None:
    """Zero-width encodings carry no payload."""


def _pack(fmt: str, convert: Callable[[Any], Any] = lambda value: value) -> PayloadWriter:
    layout = struct.Struct(fmt)

    def write(out: bytearray, value: Any) -> None:
        out += layout.pack(convert(value))

    return write


def _raw(width: int) -> PayloadWriter:
    def write(out: bytearray, value: Any) -> None:
        if len(value) != width:
            raise ValueError(f"needs exactly {width} bytes, got {len(value)}")
        out += value

    return write


def _sized(width: int, to_bytes: Callable[[Any], bytes]) -> PayloadWriter:
    length = _U8 if width == 1 else _U32

    def write(out: bytearray, value: Any) -> None:
        raw = to_bytes(value)
        out += length.pack(len(raw))
        out += raw

    return write


def _compound_payload(out: bytearray, width: int, count: int, body: bytes | bytearray) -> None:
    if width == 1:
        out += _U8_PAIR.pack(len(body) + 1, count)
    else:
        out += _U32_PAIR.pack(len(body) + 4, count)
    out += body


def _list_payload(width: int) -> PayloadWriter:
    def write(out: bytearray, value: Any) -> None:
        body = bytearray()
        for item in value:
            encode_into(body, item)
        _compound_payload(out, width, len(value), body)

    return write


def _map_payload(width: int) -> PayloadWriter:
    def write(out: bytearray, value: Any) -> None:
        body = _map_body(value)
        _compound_payload(out, width, 2 * len(value), body)

    return write


def _array_payload(width: int) -> PayloadWriter:
    def write(out: bytearray, value: Any) -> None:
        _compound_payload(out, width, len(value.items), _array_body(value))

    return write


_PAYLOAD_WRITERS: Final[dict[int, PayloadWriter]] = {
    0x40: _nothing,
    0x41: _nothing,
    0x42: _nothing,
    0x43: _nothing,
    0x44: _nothing,
    0x45: _nothing,
    0x56: _pack(">B", int),
    0x50: _pack(">B"),
    0x60: _pack(">H"),
    0x70: _pack(">I"),
    0x52: _pack(">B"),
    0x80: _pack(">Q"),
    0x53: _pack(">B"),
    0x51: _pack(">b"),
    0x61: _pack(">h"),
    0x71: _pack(">i"),
    0x54: _pack(">b"),
    0x81: _pack(">q"),
    0x55: _pack(">b"),
    0x72: _pack(">f"),
    0x82: _pack(">d"),
    0x74: _raw(4),
    0x84: _raw(8),
    0x94: _raw(16),
    0x73: _pack(">I", ord),
    0x83: _pack(">q"),
    0x98: lambda out, value: out.extend(value.bytes),
    0xA0: _sized(1, bytes),
    0xB0: _sized(4, bytes),
    0xA1: _sized(1, lambda value: value.encode("utf-8")),
    0xB1: _sized(4, lambda value: value.encode("utf-8")),
    0xA3: _sized(1, lambda value: value.encode("ascii")),
    0xB3: _sized(4, lambda value: value.encode("ascii")),
    0xC0: _list_payload(1),
    0xD0: _list_payload(4),
    0xC1: _map_payload(1),
    0xD1: _map_payload(4),
    0xE0: _array_payload(1),
    0xF0: _array_payload(4),
}


def _map_body(value: dict[Any, Any]) -> bytearray:
    body = bytearray()
    for key, item in value.items():
        encode_into(body, key)
        encode_into(body, item)
    return body


def _array_body(value: Array) -> bytearray:
    body = bytearray()
    if value.descriptor is not None:
        body.append(0x00)
        encode_into(body, value.descriptor)
    body.append(value.code)
    write = _PAYLOAD_WRITERS[value.code]
    for item in value.items:
        write(body, item)
    return body


def _compact(small: int, wide: int, count: int, body: bytes | bytearray) -> tuple[int, int]:
    """The 1-byte-width constructor when size and count fit in a byte, else the 4-byte one."""
    if count < 256 and len(body) < 255:
        return small, 1
    return wide, 4


def _write_list(out: bytearray, value: list[Any]) -> None:
    if not value:
        out.append(0x45)
        return
    body = bytearray()
    for item in value:
        encode_into(body, item)
    code, width = _compact(0xC0, 0xD0, len(value), body)
    out.append(code)
    _compound_payload(out, width, len(value), body)


def _write_map(out: bytearray, value: dict[Any, Any]) -> None:
    body = _map_body(value)
    code, width = _compact(0xC1, 0xD1, 2 * len(value), body)
    out.append(code)
    _compound_payload(out, width, 2 * len(value), body)


def _write_array(out: bytearray, value: Array) -> None:
    body = _array_body(value)
    code, width = _compact(0xE0, 0xF0, len(value.items), body)
    out.append(code)
    _compound_payload(out, width, len(value.items), body)


def _write_described(out: bytearray, value: Described) -> None:
    out.append(0x00)
    encode_into(out, value.descriptor)
    encode_into(out, value.value)


def _by_code(choose: Callable[[Any], int]) -> PayloadWriter:
    """A writer that picks the constructor for the value, then writes its payload."""

    def write(out: bytearray, value: Any) -> None:
        code = choose(value)
        out.append(code)
        _PAYLOAD_WRITERS[code](out, value)

    return write


def _unsigned(zero: int, small: int, wide: int) -> PayloadWriter:
    return _by_code(lambda value: zero if value == 0 else small if value < 256 else wide)


def _signed(small: int, wide: int) -> PayloadWriter:
    return _by_code(lambda value: small if -128 <= value <= 127 else wide)


def _variable_width(small: int, wide: int, to_bytes: Callable[[Any], bytes]) -> PayloadWriter:
    return _by_code(lambda value: small if len(to_bytes(value)) < 256 else wide)


_WRITERS: Final[dict[type, PayloadWriter]] = {
    type(None): _by_code(lambda value: 0x40),
    bool: _by_code(lambda value: 0x41 if value else 0x42),
    UByte: _by_code(lambda value: 0x50),
    UShort: _by_code(lambda value: 0x60),
    UInt: _unsigned(0x43, 0x52, 0x70),
    ULong: _unsigned(0x44, 0x53, 0x80),
    Byte: _by_code(lambda value: 0x51),
    Short: _by_code(lambda value: 0x61),
    Int: _signed(0x54, 0x71),
    int: _signed(0x55, 0x81),
    Float32: _by_code(lambda value: 0x72),
    float: _by_code(lambda value: 0x82),
    Decimal32: _by_code(lambda value: 0x74),
    Decimal64: _by_code(lambda value: 0x84),
    Decimal128: _by_code(lambda value: 0x94),
    Char: _by_code(lambda value: 0x73),
    Timestamp: _by_code(lambda value: 0x83),
    uuid.UUID: _by_code(lambda value: 0x98),
    bytes: _variable_width(0xA0, 0xB0, bytes),
    str: _variable_width(0xA1, 0xB1, lambda value: value.encode("utf-8")),
    Symbol: _variable_width(0xA3, 0xB3, lambda value: value.encode("ascii")),
    list: _write_list,
    dict: _write_map,
    Array: _write_array,
    Described: _write_described,
}


def encode_into(out: bytearray, value: object) -> None:
    """Append ``value``'s most compact encoding to ``out``.

    Raises TypeError for a Python type with no AMQP mapping (a programming error, not bad input).
    """
    write = _WRITERS.get(type(value))
    if write is None:
        raise TypeError(f"no AMQP 1.0 encoding for {type(value).__name__}")
    write(out, value)


def encode(value: object) -> bytes:
    """The most compact AMQP 1.0 encoding of ``value``."""
    out = bytearray()
    encode_into(out, value)
    return bytes(out)
