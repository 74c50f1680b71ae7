"""AMQP 1.0 performatives (parts 2, 5): codes, field layouts, typed views of the rare ones."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import Enum, IntEnum
from typing import Final, TypeVar

from floodwall.wire.amqp10.errors import DecodeError
from floodwall.wire.amqp10.types import (
    Array,
    Described,
    Symbol,
    UByte,
    UInt,
    ULong,
    UShort,
    decode_value,
    encode,
)

# Descriptor codes (domain 0x00000000). Connection, session and link performatives:
OPEN: Final = 0x10
BEGIN: Final = 0x11
ATTACH: Final = 0x12
FLOW: Final = 0x13
TRANSFER: Final = 0x14
DISPOSITION: Final = 0x15
DETACH: Final = 0x16
END: Final = 0x17
CLOSE: Final = 0x18
# Composite types that performatives carry:
ERROR: Final = 0x1D
SOURCE: Final = 0x28
TARGET: Final = 0x29
COORDINATOR: Final = 0x30
# Delivery states (3.4): the outcomes, and the transactional state that wraps one.
TRANSACTIONAL_STATE: Final = 0x34
NO_STATE: Final = 0
"""``peek_disposition``'s state code for a disposition without a state (absent or null)."""
# SASL performatives (part 5):
SASL_MECHANISMS: Final = 0x40
SASL_INIT: Final = 0x41
SASL_CHALLENGE: Final = 0x42
SASL_RESPONSE: Final = 0x43
SASL_OUTCOME: Final = 0x44

LAYOUTS: Final[dict[int, tuple[str, tuple[str, ...]]]] = {
    OPEN: ("open", ("container-id", "hostname", "max-frame-size", "channel-max",
                    "idle-time-out", "outgoing-locales", "incoming-locales",
                    "offered-capabilities", "desired-capabilities", "properties")),
    BEGIN: ("begin", ("remote-channel", "next-outgoing-id", "incoming-window",
                      "outgoing-window", "handle-max", "offered-capabilities",
                      "desired-capabilities", "properties")),
    ATTACH: ("attach", ("name", "handle", "role", "snd-settle-mode", "rcv-settle-mode",
                        "source", "target", "unsettled", "incomplete-unsettled",
                        "initial-delivery-count", "max-message-size", "offered-capabilities",
                        "desired-capabilities", "properties")),
    FLOW: ("flow", ("next-incoming-id", "incoming-window", "next-outgoing-id",
                    "outgoing-window", "handle", "delivery-count", "link-credit", "available",
                    "drain", "echo", "properties")),
    TRANSFER: ("transfer", ("handle", "delivery-id", "delivery-tag", "message-format",
                            "settled", "more", "rcv-settle-mode", "state", "resume", "aborted",
                            "batchable")),
    DISPOSITION: ("disposition", ("role", "first", "last", "settled", "state", "batchable")),
    DETACH: ("detach", ("handle", "closed", "error")),
    END: ("end", ("error",)),
    CLOSE: ("close", ("error",)),
    ERROR: ("error", ("condition", "description", "info")),
    SOURCE: ("source", ("address", "durable", "expiry-policy", "timeout", "dynamic",
                        "dynamic-node-properties", "distribution-mode", "filter",
                        "default-outcome", "outcomes", "capabilities")),
    TARGET: ("target", ("address", "durable", "expiry-policy", "timeout", "dynamic",
                        "dynamic-node-properties", "capabilities")),
    COORDINATOR: ("coordinator", ("capabilities",)),
    SASL_MECHANISMS: ("sasl-mechanisms", ("sasl-server-mechanisms",)),
    SASL_INIT: ("sasl-init", ("mechanism", "initial-response", "hostname")),
    SASL_CHALLENGE: ("sasl-challenge", ("challenge",)),
    SASL_RESPONSE: ("sasl-response", ("response",)),
    SASL_OUTCOME: ("sasl-outcome", ("code", "additional-data")),
}
"""Name and field names of every composite type the proxy knows, by descriptor code."""


def field_at(code: int, name: str) -> int:
    """The position of field ``name`` in the layout of ``code`` (raises KeyError if none)."""
    try:
        return LAYOUTS[code][1].index(name)
    except ValueError:
        raise KeyError(f"{LAYOUTS[code][0]} has no field {name!r}") from None


def field_label(code: int, index: int) -> str:
    """``flow.handle``: the performative's and the field's names, for error messages."""
    name, fields = LAYOUTS[code]
    return f"{name}.{fields[index]}" if index < len(fields) else f"{name}.{index}"


class FlowFields:
    """Positions of a flow's fields (``LAYOUTS[FLOW]``)."""

    NEXT_INCOMING_ID: Final = field_at(FLOW, "next-incoming-id")
    INCOMING_WINDOW: Final = field_at(FLOW, "incoming-window")
    NEXT_OUTGOING_ID: Final = field_at(FLOW, "next-outgoing-id")
    OUTGOING_WINDOW: Final = field_at(FLOW, "outgoing-window")
    HANDLE: Final = field_at(FLOW, "handle")
    DELIVERY_COUNT: Final = field_at(FLOW, "delivery-count")
    LINK_CREDIT: Final = field_at(FLOW, "link-credit")
    DRAIN: Final = field_at(FLOW, "drain")
    ECHO: Final = field_at(FLOW, "echo")


class TransferFields:
    """Positions of a transfer's fields (``LAYOUTS[TRANSFER]``)."""

    HANDLE: Final = field_at(TRANSFER, "handle")
    DELIVERY_ID: Final = field_at(TRANSFER, "delivery-id")
    MESSAGE_FORMAT: Final = field_at(TRANSFER, "message-format")
    SETTLED: Final = field_at(TRANSFER, "settled")
    MORE: Final = field_at(TRANSFER, "more")
    STATE: Final = field_at(TRANSFER, "state")
    ABORTED: Final = field_at(TRANSFER, "aborted")


class DispositionFields:
    """Positions of a disposition's fields (``LAYOUTS[DISPOSITION]``)."""

    ROLE: Final = field_at(DISPOSITION, "role")
    FIRST: Final = field_at(DISPOSITION, "first")
    LAST: Final = field_at(DISPOSITION, "last")
    STATE: Final = field_at(DISPOSITION, "state")


class Outcome(IntEnum):
    """The terminal delivery states (3.4.2 to 3.4.5) by descriptor code: what a receiver
    settles a delivery with."""

    ACCEPTED = 0x24
    REJECTED = 0x25
    RELEASED = 0x26
    MODIFIED = 0x27

    @property
    def label(self) -> str:
        """The outcome's name in the spec (metrics, ``/state``)."""
        return self.name.lower()


MESSAGE_PROPERTIES: Final = 0x73
"""Descriptor code of a message's properties section (3.2.4)."""
MESSAGE_PROPERTIES_LAYOUT: Final = (
    "message-id", "user-id", "to", "subject", "reply-to", "correlation-id",
    "content-type", "content-encoding", "absolute-expiry-time", "creation-time", "group-id",
    "group-sequence", "reply-to-group-id")
"""The fields of a message's properties section, in order (3.2.4)."""


class MessageProperties:
    """Positions of a message properties section's fields (``MESSAGE_PROPERTIES_LAYOUT``)."""

    TO: Final = MESSAGE_PROPERTIES_LAYOUT.index("to")
    SUBJECT: Final = MESSAGE_PROPERTIES_LAYOUT.index("subject")

SYMBOLIC_CODES: Final[dict[str, int]] = {
    f"amqp:{name}:list": code for code, (name, _) in LAYOUTS.items()
}
"""The symbolic descriptors ("amqp:open:list") a peer may use instead of the numeric code."""

AMQP_PERFORMATIVES: Final = frozenset(range(OPEN, CLOSE + 1))

SASL_OK: Final = 0
"""sasl-outcome code for successful authentication."""


def name_of(code: int) -> str:
    """A descriptor code's name for messages ("open"), or its hex form when unknown."""
    layout = LAYOUTS.get(code)
    return layout[0] if layout else f"0x{code:02x}"


def descriptor_code(descriptor: object) -> int | None:
    """The numeric code of a ulong or symbolic descriptor; None when it names nothing we know."""
    if isinstance(descriptor, ULong):
        return int(descriptor)
    if isinstance(descriptor, Symbol):
        return SYMBOLIC_CODES.get(descriptor)
    return None


def decode_composite(buf: bytes, pos: int, end: int) -> tuple[int, list[object], int]:
    """Decode the described list at ``buf[pos:end]``: its code, its fields and where it ends."""
    value, stop = decode_value(buf, pos, end)
    code, fields = composite_fields(value)
    return code, fields, stop


_SMALL_UINTS: Final = tuple(UInt(i) for i in range(256))
_UNPACK_U32: Final = struct.Struct(">I").unpack_from


def peek_composite(buf: bytes, pos: int, end: int) -> tuple[list[object], int] | None:
    """``decode_composite``'s fields and end for the usual encoding of a hot performative.

    Reads a smallulong descriptor and a list0/list8 whose elements are all null, boolean,
    uint, ubyte or vbin8, the encodings transfer and flow frames are made of, without the
    general decoder's per-value calls. The fields are the values ``decode_composite`` gives.
    Returns None for any other (or malformed) encoding: the caller then decodes the frame in
    full, which also explains what is wrong with it.
    """
    header = _list8(buf, pos, end)
    if header is None:
        return None
    p, stop, count = header
    if count < 0:  # list0
        return [], p
    fields: list[object] = []
    append = fields.append
    uints = _SMALL_UINTS
    for _ in range(count):
        if p >= stop:
            return None
        c = buf[p]
        p += 1
        # The commonest first: a transfer is uint0 or smalluint, uint, vbin8, uint0, false.
        if c == 0x43:  # uint0
            append(uints[0])
        elif c == 0x70:  # uint
            if p + 4 > stop:
                return None
            append(UInt(_UNPACK_U32(buf, p)[0]))
            p += 4
        elif c == 0x52:  # smalluint
            if p >= stop:
                return None
            append(uints[buf[p]])
            p += 1
        elif c == 0x42:
            append(False)
        elif c == 0xA0:  # vbin8
            if p >= stop:
                return None
            n = p + 1 + buf[p]
            if n > stop:
                return None
            append(buf[p + 1 : n])
            p = n
        else:
            rare = _rare_field(buf, p, stop, c)
            if rare is None:
                return None
            append(rare[0])
            p = rare[1]
    if p != stop:
        return None
    return fields, stop


def peek_disposition(buf: bytes, pos: int, end: int) -> tuple[bool, int, int, int] | None:
    """A disposition's role, first, last (``first`` when absent) and state from its usual
    encoding, without decoding the state's fields.

    ``buf[pos:end]`` is the frame body. Reads a smallulong descriptor 0x15 and a list8 whose
    role is a boolean, whose first and last are uints (last may be null or absent), settled a
    boolean or null, and whose state, if any, has a smallulong descriptor: the state is
    given by that descriptor's code (``Outcome``, ``TRANSACTIONAL_STATE``, ...; ``NO_STATE``
    when absent or null); batchable is not read. Returns None for any other (or malformed)
    encoding: the caller then decodes the frame in full, which also explains what is wrong
    with it.
    """
    if end - pos < 8 or buf[pos + 2] != 0x15:
        return None
    header = _list8(buf, pos, end)
    if header is None:
        return None
    p, stop, count = header
    if count < 2:  # list0 or no first: the full decoder's error
        return None
    c = buf[p]
    if c == 0x41:
        role, p = True, p + 1
    elif c == 0x42:
        role, p = False, p + 1
    elif c == 0x56 and p + 1 < stop and buf[p + 1] <= 1:
        role, p = buf[p + 1] == 1, p + 2
    else:
        return None
    first = _peek_uint(buf, p, stop)
    if first is None:
        return None
    value, p = first
    last = value
    if count > 2:
        if p >= stop:
            return None
        if buf[p] != 0x40:  # null: last = first
            found = _peek_uint(buf, p, stop)
            if found is None:
                return None
            last, p = found
        else:
            p += 1
    if count > 4 and p + 3 < stop and buf[p] == 0x41 and buf[p + 1] == 0 \
            and buf[p + 2] == 0x53:  # settled true and a state: RabbitMQ's (inline)
        return role, value, last, buf[p + 3]
    state = peek_state(buf, p, stop, count - 3) if count > 3 else NO_STATE
    if state is None:
        return None
    return role, value, last, state


def peek_state(buf: bytes, p: int, stop: int, fields: int) -> int | None:
    """A disposition's state from its settled field at ``buf[p]`` on (``fields`` of them
    from there, settled first): the state's smallulong descriptor code, ``NO_STATE`` when
    absent or null; None when settled is not a boolean or null, or the state is encoded
    otherwise."""
    if p >= stop:
        return None
    c = buf[p]
    if c == 0x41 or c == 0x42 or c == 0x40:
        p += 1
    elif c == 0x56 and p + 1 < stop and buf[p + 1] <= 1:
        p += 2
    else:
        return None
    if fields < 2:
        return NO_STATE
    if p >= stop:
        return None
    if buf[p] == 0x40:
        return NO_STATE
    if p + 3 > stop or buf[p] != 0x00 or buf[p + 1] != 0x53:
        return None
    return buf[p + 2]


def _peek_uint(buf: bytes, p: int, stop: int) -> tuple[int, int] | None:
    """The uint at ``buf[p]`` (uint0, smalluint or uint) and where the next field starts."""
    if p >= stop:
        return None
    c = buf[p]
    if c == 0x43:
        return 0, p + 1
    if c == 0x52 and p + 2 <= stop:
        return buf[p + 1], p + 2
    if c == 0x70 and p + 5 <= stop:
        return _UNPACK_U32(buf, p + 1)[0], p + 5
    return None


def _list8(buf: bytes, pos: int, end: int) -> tuple[int, int, int] | None:
    """A smallulong-described list0 or list8 at ``buf[pos:end]``: (where its first element
    starts, where the list ends, how many elements: -1 for list0), or None for anything
    else (list32: the general decoder)."""
    if pos + 4 > end or buf[pos] != 0x00 or buf[pos + 1] != 0x53:
        return None
    kind = buf[pos + 3]
    p = pos + 4
    if kind == 0x45:  # list0
        return p, p, -1
    if kind != 0xC0 or p + 2 > end:
        return None
    size = buf[p]
    count = buf[p + 1]
    stop = p + 1 + size
    p += 2
    if size < 1 or stop > end or count > stop - p:
        return None
    return p, stop, count


def _rare_field(buf: bytes, p: int, stop: int, c: int) -> tuple[object, int] | None:
    """``peek_composite``'s less common field encodings (null, true, ubyte, boolean): the
    value and where the next field starts, or None for anything else."""
    if c == 0x40:
        return None, p
    if c == 0x41:
        return True, p
    if p >= stop:
        return None
    if c == 0x50:  # ubyte
        return UByte(buf[p]), p + 1
    if c == 0x56 and buf[p] <= 1:  # boolean
        return buf[p] == 1, p + 1
    return None


def composite_fields(value: object) -> tuple[int, list[object]]:
    """Split a decoded described list into its descriptor code and fields."""
    if not isinstance(value, Described):
        raise DecodeError(f"expected a described list, got {type(value).__name__}")
    code = descriptor_code(value.descriptor)
    if code is None:
        raise DecodeError(f"unknown descriptor {value.descriptor!r}")
    if not isinstance(value.value, list):
        raise DecodeError(f"{name_of(code)} is not a list")
    return code, value.value


def performative(code: int, /, **fields: object) -> Described:
    """A composite value by field name (``max_frame_size=UInt(4096)``); trailing nulls omitted."""
    names = LAYOUTS[code][1]
    unknown = set(fields) - {name.replace("-", "_") for name in names}
    if unknown:
        raise TypeError(f"{name_of(code)} has no field(s) {sorted(unknown)}")
    values = [fields.get(name.replace("-", "_")) for name in names]
    while values and values[-1] is None:
        values.pop()
    return Described(ULong(code), values)


def encode_performative(code: int, /, **fields: object) -> bytes:
    """The encoded body of a performative; see ``performative``."""
    return encode(performative(code, **fields))


_UINT0: Final = b"\x43"
_UINT_BYTES: Final = tuple(bytes((0x52, i)) for i in range(256))


def uint_bytes(value: int) -> bytes:
    """A uint's most compact encoding, as ``encode(UInt(value))`` gives it."""
    if value < 256:
        return _UINT_BYTES[value] if value else _UINT0
    return b"\x70" + value.to_bytes(4, "big")


def transfer_body(handle: int, delivery_id: int, tag: bytes, message_format: int,
                  more: bool) -> bytes:
    """The body of an unsettled delivery's first transfer (handle, delivery-id, delivery-tag,
    message-format, settled false, ``more``): the bytes ``encode_performative`` makes of
    those fields, without its generic encoder (the spool replayer sends one per record).
    A tag of up to 32 bytes keeps it a list8."""
    if len(tag) > 32:
        return encode_performative(TRANSFER, handle=UInt(handle),
                                   delivery_id=UInt(delivery_id), delivery_tag=tag,
                                   message_format=UInt(message_format), settled=False,
                                   more=more)
    body = b"".join((uint_bytes(handle), uint_bytes(delivery_id), b"\xa0", bytes((len(tag),)),
                     tag, uint_bytes(message_format), b"\x42", b"\x41" if more else b"\x42"))
    return b"\x00\x53\x14\xc0" + bytes((len(body) + 1, 6)) + body


# ---------------------------------------------------------------------------------------------
# Typed views of the rare performatives. Each checks the wire type of the fields it reads:
# a field of the wrong type, or a missing mandatory one, makes the frame undecodable.

T = TypeVar("T")


def _field(fields: list[object], name: str, where: int, kind: type[T]) -> T | None:
    """Field ``name`` of composite ``where`` (by its layout), of wire type ``kind``."""
    index = field_at(where, name)
    value = fields[index] if index < len(fields) else None
    if value is None:
        return None
    if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
        raise DecodeError(
            f"{name_of(where)}.{name} is {type(value).__name__}, expected {kind.__name__}"
        )
    return value


def _mandatory(fields: list[object], name: str, where: int, kind: type[T]) -> T:
    value = _field(fields, name, where, kind)
    if value is None:
        raise DecodeError(f"{name_of(where)}.{name} is mandatory")
    return value


def _raw(fields: list[object], name: str, where: int) -> object:
    """Field ``name`` of composite ``where`` as decoded (None when absent)."""
    index = field_at(where, name)
    return fields[index] if index < len(fields) else None


def _optional_int(value: int | None) -> int | None:
    return None if value is None else int(value)


def _composite(value: object, where: int, expected: frozenset[int]) -> tuple[int, list[object]]:
    code, fields = composite_fields(value)
    if code not in expected:
        raise DecodeError(f"{name_of(where)} holds a {name_of(code)}")
    return code, fields


class Role(Enum):
    """A link endpoint's role; on the wire a boolean (false = sender, true = receiver)."""

    SENDER = False
    RECEIVER = True


@dataclass(frozen=True, slots=True)
class ErrorInfo:
    """An ``error`` composite: condition symbol and optional description (info is dropped)."""

    condition: str
    description: str | None = None

    @classmethod
    def from_value(cls, value: object) -> ErrorInfo | None:
        if value is None:
            return None
        _, fields = _composite(value, ERROR, frozenset({ERROR}))
        return cls(
            condition=str(_mandatory(fields, "condition", ERROR, Symbol)),
            description=_field(fields, "description", ERROR, str),
        )

    def to_value(self) -> Described:
        return performative(ERROR, condition=Symbol(self.condition), description=self.description)


@dataclass(frozen=True, slots=True)
class Open:
    """The ``open`` fields the proxy uses; max_frame_size and channel_max carry spec defaults."""

    container_id: str
    hostname: str | None = None
    max_frame_size: int = 0xFFFFFFFF
    channel_max: int = 0xFFFF
    idle_time_out: int | None = None  # milliseconds
    version: str | None = None  # the peer's ``version`` property (RabbitMQ: "4.0.5")

    @classmethod
    def from_fields(cls, fields: list[object]) -> Open:
        max_frame_size = _field(fields, "max-frame-size", OPEN, UInt)
        channel_max = _field(fields, "channel-max", OPEN, UShort)
        properties = _field(fields, "properties", OPEN, dict)
        version = properties.get(Symbol("version")) if properties else None
        return cls(
            container_id=_mandatory(fields, "container-id", OPEN, str),
            hostname=_field(fields, "hostname", OPEN, str),
            max_frame_size=0xFFFFFFFF if max_frame_size is None else int(max_frame_size),
            channel_max=0xFFFF if channel_max is None else int(channel_max),
            idle_time_out=_optional_int(_field(fields, "idle-time-out", OPEN, UInt)),
            version=version if isinstance(version, str) else None,
        )


@dataclass(frozen=True, slots=True)
class Begin:
    """The ``begin`` fields the proxy uses."""

    remote_channel: int | None
    next_outgoing_id: int
    incoming_window: int
    outgoing_window: int
    handle_max: int = 0xFFFFFFFF

    @classmethod
    def from_fields(cls, fields: list[object]) -> Begin:
        handle_max = _field(fields, "handle-max", BEGIN, UInt)
        return cls(
            remote_channel=_optional_int(_field(fields, "remote-channel", BEGIN, UShort)),
            next_outgoing_id=int(_mandatory(fields, "next-outgoing-id", BEGIN, UInt)),
            incoming_window=int(_mandatory(fields, "incoming-window", BEGIN, UInt)),
            outgoing_window=int(_mandatory(fields, "outgoing-window", BEGIN, UInt)),
            handle_max=0xFFFFFFFF if handle_max is None else int(handle_max),
        )


@dataclass(frozen=True, slots=True)
class Attach:
    """The ``attach`` fields the proxy uses: who sends, and the source and target addresses."""

    name: str
    handle: int
    role: Role
    source_address: str | None = None
    target_address: str | None = None
    coordinator: bool = False  # the target is a transaction coordinator, not a node
    initial_delivery_count: int | None = None  # a sender's; None from a receiver

    @classmethod
    def from_fields(cls, fields: list[object]) -> Attach:
        source_address: str | None = None
        target_address: str | None = None
        coordinator = False
        source = _raw(fields, "source", ATTACH)
        if source is not None:
            _, terminus = _composite(source, ATTACH, frozenset({SOURCE}))
            source_address = _field(terminus, "address", SOURCE, str)
        target = _raw(fields, "target", ATTACH)
        if target is not None:
            code, terminus = _composite(target, ATTACH, frozenset({TARGET, COORDINATOR}))
            coordinator = code == COORDINATOR
            if not coordinator:
                target_address = _field(terminus, "address", TARGET, str)
        return cls(
            name=_mandatory(fields, "name", ATTACH, str),
            handle=int(_mandatory(fields, "handle", ATTACH, UInt)),
            role=Role(_mandatory(fields, "role", ATTACH, bool)),
            source_address=source_address,
            target_address=target_address,
            coordinator=coordinator,
            initial_delivery_count=_optional_int(
                _field(fields, "initial-delivery-count", ATTACH, UInt)),
        )


@dataclass(frozen=True, slots=True)
class Detach:
    """A ``detach``: which handle, whether the link is closed, and why."""

    handle: int
    closed: bool = False
    error: ErrorInfo | None = None

    @classmethod
    def from_fields(cls, fields: list[object]) -> Detach:
        return cls(
            handle=int(_mandatory(fields, "handle", DETACH, UInt)),
            closed=bool(_field(fields, "closed", DETACH, bool)),
            error=ErrorInfo.from_value(_raw(fields, "error", DETACH)),
        )


@dataclass(frozen=True, slots=True)
class Ending:
    """An ``end`` or ``close``: only the optional error."""

    error: ErrorInfo | None = None

    @classmethod
    def from_fields(cls, fields: list[object]) -> Ending:
        return cls(error=ErrorInfo.from_value(_raw(fields, "error", END)))


@dataclass(frozen=True, slots=True)
class SaslInit:
    """A ``sasl-init``; the initial response (credentials) is checked but never kept."""

    mechanism: str
    hostname: str | None = None

    @classmethod
    def from_fields(cls, fields: list[object]) -> SaslInit:
        _field(fields, "initial-response", SASL_INIT, bytes)
        return cls(
            mechanism=str(_mandatory(fields, "mechanism", SASL_INIT, Symbol)),
            hostname=_field(fields, "hostname", SASL_INIT, str),
        )


@dataclass(frozen=True, slots=True)
class SaslOutcome:
    """A ``sasl-outcome``: 0 ok, 1 auth, 2 sys, 3 sys-perm, 4 sys-temp."""

    code: int

    @classmethod
    def from_fields(cls, fields: list[object]) -> SaslOutcome:
        _field(fields, "additional-data", SASL_OUTCOME, bytes)
        return cls(code=int(_mandatory(fields, "code", SASL_OUTCOME, UByte)))


def check_sasl_fields(code: int, fields: list[object]) -> None:
    """Check sasl-mechanisms' symbols and the binary of sasl-challenge / sasl-response."""
    if code in (SASL_CHALLENGE, SASL_RESPONSE):
        _mandatory(fields, LAYOUTS[code][1][0], code, bytes)  # challenge, response
    elif code == SASL_MECHANISMS:
        mechanisms = _raw(fields, "sasl-server-mechanisms", SASL_MECHANISMS)
        symbols = isinstance(mechanisms, Symbol) or (
            isinstance(mechanisms, Array) and mechanisms.code in (0xA3, 0xB3)
        )
        if not symbols:
            raise DecodeError("sasl-mechanisms.sasl-server-mechanisms must be symbols")


def open_body(container_id: str) -> bytes:
    """An ``open`` with only the mandatory container-id (spec defaults for the rest)."""
    return encode_performative(OPEN, container_id=container_id)


def close_body(condition: str, description: str) -> bytes:
    """A ``close`` carrying an error."""
    return encode_performative(CLOSE, error=ErrorInfo(condition, description).to_value())
