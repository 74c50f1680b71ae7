"""AMQP 0-9-1 frame layout, and a scanner that walks complete frames in buffers without copying."""

from __future__ import annotations

import struct
from collections.abc import Container
from typing import Final, TypeVar

from pamqp import base
from pamqp import frame as pamqp_frame

from floodwall.wire.amqp091.errors import (
    FrameError,
    MethodSyntaxError,
    ProtocolError,
    UnexpectedFrame,
)

FRAME_METHOD: Final = 1
FRAME_HEADER: Final = 2
FRAME_BODY: Final = 3
FRAME_HEARTBEAT: Final = 8
FRAME_END: Final = 0xCE
FRAME_MIN_SIZE: Final = 4096
HEADER_SIZE: Final = 7  # type (octet), channel (short), payload size (long)
CONTENT_HEADER_MIN: Final = 14
"""The smallest content header payload: class id, weight, body size, property flags."""
FRAME_OVERHEAD: Final = HEADER_SIZE + 1  # header plus frame-end octet; frame_max counts both

FRAME_TYPE_NAMES: Final = {
    FRAME_METHOD: "method",
    FRAME_HEADER: "content header",
    FRAME_BODY: "content body",
    FRAME_HEARTBEAT: "heartbeat",
}

NEED_DATA: Final = -1
"""``scan`` status: the frame at the returned offset is incomplete (or the buffer ended)."""

NO_LIMIT: Final = 0xFFFFFFFF  # a payload size can never exceed this (it is a 32-bit field)

Buffer = bytes | bytearray | memoryview

_HEADER = struct.Struct(">BHI")
_METHOD_KEY = struct.Struct(">I")
_METHOD_IDS = struct.Struct(">HH")

MethodT = TypeVar("MethodT", bound=base.Frame)


def method_key(class_id: int, method_id: int) -> int:
    """The 32-bit key ``class_id << 16 | method_id``: the first 4 payload bytes of a method
    frame, and pamqp's ``index`` for that method."""
    return (class_id << 16) | method_id


def payload_limit(frame_max: int) -> int:
    """The largest payload a frame may carry under ``frame_max`` (0 = no limit)."""
    return frame_max - FRAME_OVERHEAD if frame_max else NO_LIMIT


def scan(
    buf: Buffer,
    offset: int,
    frame_max: int,
    stop_at: Container[int],
    base_offset: int = 0,
) -> tuple[int, int, int]:
    """Walk the complete frames of ``buf`` from ``offset``, validating each one.

    Returns ``(stop, frames, status)``: ``frames`` complete frames were walked from
    ``offset`` to ``stop``. ``status`` is ``NEED_DATA`` when the frame at ``stop`` is
    incomplete or ``stop == len(buf)``; otherwise it is the method key (see
    ``method_key``) of the complete method frame at ``stop`` whose key is in ``stop_at``,
    which the caller handles and then resumes scanning after it.

    Raises a ``ProtocolError`` (``FrameError`` unless said otherwise) whose ``offset`` is
    the start of the first bad frame: unknown frame type, a frame larger than
    ``frame_max`` (``size + 8 > frame_max``, 0 = no limit), a bad frame-end octet, a
    method frame shorter than its class and method ids, a content header shorter than its
    fixed fields (``CONTENT_HEADER_MIN``), a heartbeat off channel 0 or with a payload, a
    content frame on channel 0 (``UnexpectedFrame``). Checks that need only
    the 7-byte header run as soon as it is in; so the error for a given stream is the
    same however it is chunked. ``base_offset`` is the stream position of ``buf[0]``,
    used only in error messages.
    """
    n = len(buf)
    limit = payload_limit(frame_max)
    unpack_header = _HEADER.unpack_from
    unpack_key = _METHOD_KEY.unpack_from
    frames = 0
    # Hot loop: literals, not module constants (a global lookup per use costs ~10% here).
    # 7 = HEADER_SIZE, 0xCE = FRAME_END, 1/2/3/8 = method/header/body/heartbeat.
    while offset + 7 <= n:
        ftype, channel, size = unpack_header(buf, offset)
        end = offset + 7 + size
        if size > limit or end >= n:
            if size > limit or not _header_ok(ftype, channel, size):
                raise _fault(buf, offset, frame_max, base_offset)
            break  # incomplete, and what its header tells is fine: wait for the rest
        if buf[end] != 0xCE:
            raise _fault(buf, offset, frame_max, base_offset)
        if ftype == 1:
            if size < 4:
                raise _fault(buf, offset, frame_max, base_offset)
            key = unpack_key(buf, offset + 7)[0]
            if key in stop_at:
                return offset, frames, key
        elif ftype == 3 or ftype == 2:
            if not channel or (ftype == 2 and size < 14):  # 14 = CONTENT_HEADER_MIN
                raise _fault(buf, offset, frame_max, base_offset)
        elif ftype != 8 or channel or size:
            raise _fault(buf, offset, frame_max, base_offset)
        offset = end + 1
        frames += 1
    return offset, frames, NEED_DATA


WATCHED: Final = -2
"""``scan_watching`` status: the complete frame at the returned offset is on a watched channel."""


def scan_watching(
    buf: Buffer,
    offset: int,
    frame_max: int,
    stop_at: Container[int],
    watched: Container[int],
    base_offset: int = 0,
) -> tuple[int, int, int]:
    """``scan``, that also stops at every complete frame on a channel in ``watched``.

    Returns ``(stop, frames, status)`` as ``scan`` does, and status ``WATCHED`` when the
    complete frame at ``stop`` (of any type, validated) is on a watched channel; a method
    frame in ``stop_at`` on a watched channel is reported as ``WATCHED``. Raises as ``scan``
    does, for the same frames. The held connection's other channels stay on this scan while
    the watched ones are read frame by frame.
    """
    n = len(buf)
    limit = payload_limit(frame_max)
    unpack_header = _HEADER.unpack_from
    unpack_key = _METHOD_KEY.unpack_from
    frames = 0
    while offset + 7 <= n:
        ftype, channel, size = unpack_header(buf, offset)
        end = offset + 7 + size
        if size > limit or end >= n:
            if size > limit or not _header_ok(ftype, channel, size):
                raise _fault(buf, offset, frame_max, base_offset)
            break
        if buf[end] != 0xCE:
            raise _fault(buf, offset, frame_max, base_offset)
        if ftype == 1:
            if size < 4:
                raise _fault(buf, offset, frame_max, base_offset)
            if channel in watched:
                return offset, frames, WATCHED
            key = unpack_key(buf, offset + 7)[0]
            if key in stop_at:
                return offset, frames, key
        elif ftype == 3 or ftype == 2:
            if not channel or (ftype == 2 and size < 14):  # 14 = CONTENT_HEADER_MIN
                raise _fault(buf, offset, frame_max, base_offset)
            if channel in watched:
                return offset, frames, WATCHED
        elif ftype != 8 or channel or size:
            raise _fault(buf, offset, frame_max, base_offset)
        offset = end + 1
        frames += 1
    return offset, frames, NEED_DATA


def _header_ok(ftype: int, channel: int, size: int) -> bool:
    """What the 7-byte header alone can tell: the same rules as the loop in ``scan``."""
    if ftype == FRAME_METHOD:
        return size >= 4
    if ftype == FRAME_HEADER:
        return channel != 0 and size >= CONTENT_HEADER_MIN
    if ftype == FRAME_BODY:
        return channel != 0
    if ftype == FRAME_HEARTBEAT:
        return not channel and not size
    return False


def _fault(buf: Buffer, offset: int, frame_max: int, base_offset: int) -> ProtocolError:
    """Explain why the frame at ``offset`` is bad; checks run in a fixed order, header first."""
    ftype, channel, size = _HEADER.unpack_from(buf, offset)
    at = f"at offset {base_offset + offset}"
    if ftype not in FRAME_TYPE_NAMES:
        return FrameError(f"unknown frame type 0x{ftype:02x} {at}", offset)
    kind = FRAME_TYPE_NAMES[ftype]
    if size > payload_limit(frame_max):
        return FrameError(
            f"{kind} frame of {size + FRAME_OVERHEAD} bytes on channel {channel} {at} "
            f"exceeds frame_max {frame_max}",
            offset,
        )
    if ftype == FRAME_HEARTBEAT and channel:
        return FrameError(f"heartbeat frame on channel {channel} {at}, must be 0", offset)
    if ftype == FRAME_HEARTBEAT and size:
        return FrameError(f"heartbeat frame with a {size}-byte payload {at}", offset)
    if ftype in (FRAME_HEADER, FRAME_BODY) and not channel:
        return UnexpectedFrame(f"{kind} frame on channel 0 {at}", offset)
    if ftype == FRAME_HEADER and size < CONTENT_HEADER_MIN:
        return FrameError(
            f"content header frame on channel {channel} {at} has a {size}-byte payload, "
            f"shorter than the {CONTENT_HEADER_MIN} bytes of its class id, weight, body size "
            f"and property flags",
            offset,
        )
    if ftype == FRAME_METHOD and size < 4:
        return FrameError(
            f"method frame {at} has a {size}-byte payload, too short for class and method ids",
            offset,
        )
    end = offset + HEADER_SIZE + size
    if end < len(buf) and buf[end] != FRAME_END:
        return FrameError(
            f"frame end octet 0x{buf[end]:02x} at offset {base_offset + end}, "
            f"expected 0x{FRAME_END:02x} ({kind} frame on channel {channel} {at})",
            offset,
        )
    return FrameError(f"malformed {kind} frame {at}", offset)  # pragma: no cover


def frame_at(buf: Buffer, offset: int) -> tuple[int, int, int]:
    """``(frame type, channel, payload size)`` of the frame whose header is at ``offset``."""
    ftype, channel, size = _HEADER.unpack_from(buf, offset)
    return ftype, channel, size


def method_ids(buf: Buffer, offset: int) -> tuple[int, int]:
    """``(class_id, method_id)`` of the method frame at ``offset``."""
    class_id, method_id = _METHOD_IDS.unpack_from(buf, offset + HEADER_SIZE)
    return class_id, method_id


def count_frames(buf: Buffer, start: int, stop: int) -> int:
    """How many frames lie between two frame boundaries already validated by ``scan``."""
    frames = 0
    while start < stop:
        start += _HEADER.unpack_from(buf, start)[2] + FRAME_OVERHEAD
        frames += 1
    return frames


def decode_method(
    buf: Buffer, offset: int, method_class: type[MethodT], base_offset: int = 0
) -> MethodT:
    """Decode the complete method frame at ``offset``, known to be a ``method_class``, with pamqp.

    Raises ``MethodSyntaxError`` (502) when its fields do not decode. Only for the few
    methods the proxy reads: this copies the payload and builds Python objects.
    """
    method = method_class()
    try:
        method.unmarshal(method_payload(buf, offset))
    # pamqp decodes untrusted bytes; whatever it raises means "these fields do not decode".
    except Exception as exc:
        raise method_syntax_error(buf, offset, method.name, base_offset, exc) from exc
    return method


def method_payload(buf: Buffer, offset: int) -> bytes:
    """A copy of the arguments of the complete method frame at ``offset`` (after its class
    and method ids)."""
    size = _HEADER.unpack_from(buf, offset)[2]
    return bytes(buf[offset + HEADER_SIZE + 4 : offset + HEADER_SIZE + size])


def method_syntax_error(buf: Buffer, offset: int, name: str, base_offset: int,
                        exc: Exception) -> MethodSyntaxError:
    """The 502 for the method frame at ``offset`` (``name``, e.g. "Connection.Close") whose
    fields did not decode (``exc``): where it is in the stream and its method ids."""
    channel = _HEADER.unpack_from(buf, offset)[1]
    class_id, method_id = method_ids(buf, offset)
    reason = str(exc) or type(exc).__name__
    return MethodSyntaxError(
        f"cannot decode {name} on channel {channel} at offset {base_offset + offset}: "
        f"{reason}", offset, class_id, method_id)


def encode_method(method: base.Frame, channel: int) -> bytes:
    """One complete method frame, encoded by pamqp."""
    return pamqp_frame.marshal(method, channel)
