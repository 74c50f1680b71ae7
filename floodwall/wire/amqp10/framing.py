"""AMQP 1.0 frames (spec part 2.3): header checks, size limits and performative peeks, no copies."""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from floodwall.wire.amqp10.errors import DecodeError, FramingError, ProtocolError
from floodwall.wire.amqp10.performatives import DISPOSITION, FLOW, SYMBOLIC_CODES
from floodwall.wire.amqp10.types import Symbol, decode_value

HEADER_SIZE: Final = 8
"""Both the protocol header and the fixed frame header are 8 bytes."""
MIN_MAX_FRAME_SIZE: Final = 512
"""Frame size limit before the receiving peer's Open, and always for SASL frames."""
AMQP_HEADER: Final = b"AMQP\x00\x01\x00\x00"
SASL_HEADER: Final = b"AMQP\x03\x01\x00\x00"
AMQP_FRAME: Final = 0x00
SASL_FRAME: Final = 0x01

_FRAME_HEADER = struct.Struct(">IBBH")  # size, doff, type, channel
_USUAL_START = struct.Struct(">IBBHBBB")  # ... and the first 3 body bytes: 0x00 0x53 code


class NeedData:
    """Type of ``NEED_DATA``: the bytes so far end inside a frame; not an error."""

    _instance: NeedData | None = None

    def __new__(cls) -> NeedData:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NEED_DATA"


NEED_DATA: Final = NeedData()

FrameHandler = Callable[[int, int, bytes, int, int, int], bool]
"""Called as ``handler(code, channel, buf, start, body, end)`` for a frame the scanner does not
skip.

``code`` is the performative's descriptor code (-1 for an unknown symbolic descriptor, the raw
value for an unknown numeric one), ``buf[start:end]`` the frame, ``buf[body:end]`` its body.
Returning True stops the scan right after this frame, so the caller can change what it expects
next.
"""


@dataclass(frozen=True, slots=True)
class Frame:
    """Where one complete frame lies in a buffer; ``code`` is None for an empty frame."""

    start: int
    end: int
    body: int
    type: int
    channel: int
    code: int | None


def _explain(size: int, doff: int, frame_type: int, limit: int, expected_type: int) -> str:
    if size < HEADER_SIZE:
        return f"frame size {size} is smaller than the 8-byte frame header"
    if doff < 2:
        return f"data offset {doff} is below the minimum of 2"
    if doff * 4 > size:
        return f"data offset {doff} ({doff * 4} bytes) is beyond the frame size {size}"
    if size > limit:
        return f"frame size {size} exceeds the max-frame-size {limit}"
    names = {AMQP_FRAME: "AMQP", SASL_FRAME: "SASL"}
    return (
        f"{names.get(frame_type, f'unknown (0x{frame_type:02x})')} frame where an "
        f"{names[expected_type]} frame was expected"
    )


def peek_performative(buf: bytes, body: int, end: int) -> int:
    """The descriptor code of the performative at ``buf[body:end]``, without decoding its fields.

    Returns -1 for a symbolic descriptor we do not know; raises DecodeError if the body does not
    start with a ulong or symbol descriptor.
    """
    if buf[body] != 0x00:
        raise DecodeError(f"frame body starts with 0x{buf[body]:02x}, not a described type")
    if end - body < 3:
        raise DecodeError("frame body ends inside the performative's descriptor")
    constructor = buf[body + 1]
    if constructor == 0x53:  # smallulong, the usual form
        return buf[body + 2]
    if constructor == 0x80:  # ulong
        if end - body < 10:
            raise DecodeError("frame body ends inside the performative's descriptor")
        return int.from_bytes(buf[body + 2 : body + 10], "big")
    if constructor == 0x44:  # ulong0
        return 0
    if constructor in (0xA3, 0xB3):  # sym8, sym32
        name, _ = decode_value(buf, body + 1, end)
        assert isinstance(name, Symbol)
        return SYMBOLIC_CODES.get(name, -1)
    raise DecodeError(f"performative descriptor 0x{constructor:02x} is neither ulong nor symbol")


def scan_frames(
    buf: bytes,
    pos: int,
    limit: int,
    frame_type: int,
    on_frame: FrameHandler,
    skip: tuple[int, int] = (FLOW, DISPOSITION),
) -> tuple[int, int, int]:
    """Walk the complete frames of ``buf`` from ``pos``; return ``(stop, frames, need)``.

    Every frame must be of ``frame_type`` and at most ``limit`` bytes. AMQP frames whose
    performative code lies in the ``skip`` range (by default flow, transfer and disposition)
    and empty AMQP frames (heartbeats) are passed by their size alone; every other frame goes
    to ``on_frame`` (an empty range such as ``(1, 0)`` skips only heartbeats). ``stop``: the
    start of an incomplete frame (``need``: the bytes it needs from ``stop``, at least 8), the
    end of ``buf`` (``need`` 8), or just after a frame ``on_frame`` returned True for (``need``
    0). Raises FramingError for a bad frame header and lets ``on_frame``'s ProtocolError
    through, both with ``offset`` set to the start of the offending frame.
    """
    unpack_usual = _USUAL_START.unpack_from
    unpack = _FRAME_HEADER.unpack_from
    skip_lo, skip_hi = skip
    size_of_buf = len(buf)
    frames = 0
    try:
        while True:
            left = size_of_buf - pos
            if left >= 11:
                # Fast path: the usual frame (doff 2, smallulong descriptor) in one unpack.
                size, doff, ftype, channel, d0, d1, code = unpack_usual(buf, pos)
                if doff == 2 and d0 == 0 and d1 == 0x53 and 11 <= size <= limit and (
                    ftype == frame_type
                ):
                    end = pos + size
                    if end > size_of_buf:
                        return pos, frames, size
                    if (ftype or code < skip_lo or code > skip_hi) and on_frame(
                        code, channel, buf, pos, pos + 8, end
                    ):
                        return end, frames + 1, 0
                    frames += 1
                    pos = end
                    continue
            elif left < 8:
                return pos, frames, HEADER_SIZE
            # General path: any valid frame, or the error that explains why it is not one.
            found = next_frame(buf, pos, limit, frame_type)
            if not isinstance(found, Frame):  # NEED_DATA: the frame is not all here
                return pos, frames, unpack(buf, pos)[0]
            code = found.code
            if code is not None and (found.type or code < skip_lo or code > skip_hi) and on_frame(
                code, found.channel, buf, pos, found.body, found.end
            ):
                return found.end, frames + 1, 0
            frames += 1
            pos = found.end
    except ProtocolError as exc:
        exc.offset = pos
        exc.frames_before = frames
        raise


def next_frame(buf: bytes, pos: int, limit: int, frame_type: int) -> Frame | NeedData:
    """The one frame at ``buf[pos:]``, or NEED_DATA while it is incomplete; same checks as scan."""
    if len(buf) - pos < HEADER_SIZE:
        return NEED_DATA
    size, doff, ftype, channel = _FRAME_HEADER.unpack_from(buf, pos)
    if size > limit or doff < 2 or doff * 4 > size or ftype != frame_type:
        raise FramingError(_explain(size, doff, ftype, limit, frame_type))
    end = pos + size
    if end > len(buf):
        return NEED_DATA
    body = pos + doff * 4
    if body == end:
        if ftype:
            raise FramingError("empty SASL frame")
        return Frame(pos, end, body, ftype, channel, None)
    return Frame(pos, end, body, ftype, channel, peek_performative(buf, body, end))


def frame(body: bytes, channel: int = 0, frame_type: int = AMQP_FRAME) -> bytes:
    """A frame around ``body`` with the minimal data offset (2)."""
    return _FRAME_HEADER.pack(HEADER_SIZE + len(body), 2, frame_type, channel) + body
