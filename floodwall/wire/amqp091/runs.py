"""Runs of whole publishes on one channel, read in one pass (the policed publish's cost).

A publisher at full speed puts tens of publishes of one channel into every read, each the same
``basic.publish`` (exchange, routing key, flags) followed by its content header and body
frames. While the publish gate can book such a publish without deciding anything about it
(``PublishHooks.publish_run``), the core reads the run with ``scan_publish_run`` and hands
the gate the run's totals (``on_publish_run``) instead of stopping at each publish. The bytes
are relayed unchanged either way; what the run saves is the per-publish calls.

The scan is strict and silent: the first frame that is anything else (another channel,
another method or other arguments, a content header carrying the ``headers`` property, body
frames that do not add up to the header's body size, a malformed or incomplete frame) ends
the run before the publish it belongs to, and the core reads that publish the usual way,
which also reports what is wrong with a frame.
"""

from __future__ import annotations

import struct
from typing import Final

from floodwall.wire.amqp091.framing import Buffer

_HEADER = struct.Struct(">BHI")
_CONTENT = struct.Struct(">BHIHHQH")  # frame header, class id, weight, body size, flags
HEADERS_FLAG: Final = 0x2000  # property flag bit of ``headers``: it may change the route
CONTENT_MIN: Final = 14  # class id, weight, body size, property flags


def scan_publish_run(buf: Buffer, pos: int, limit: int, channel: int, method: bytes,
                     body_left: int, max_count: float, max_bytes: float,
                     ends: list[int] | None = None) -> tuple[int, int, int, int]:
    """From ``buf[pos]``, where the body frames of a publish still owed ``body_left`` body
    bytes begin: those body frames, then the whole publishes of a run. Returns ``(end, count,
    body_bytes, frames)``: where it stopped (a frame boundary), the run's publishes, their
    headers' body sizes, the frames from ``pos`` to ``end``; ``ends`` (a held run) gets where
    each publish of the run ends. A body frame is taken when complete, on ``channel``, at
    most ``limit`` bytes of payload, well ended and within what its publish owes. A publish
    is in the run when its method frame is the very bytes ``method``, its content header
    follows on ``channel`` (complete, well ended, 14 to ``limit`` bytes, no ``headers``), then
    its body frames, adding up to its body size; ``max_count`` of them, ``max_bytes``."""
    n = len(buf)
    unpack = _HEADER.unpack_from
    frames = 0
    # the rest of the current publish's content: each whole body frame passes as the scan would
    while body_left > 0 and pos + 7 <= n:
        ftype, ch, size = unpack(buf, pos)
        end = pos + 7 + size
        if ftype != 3 or ch != channel or size > limit or size > body_left or end >= n \
                or buf[end] != 0xCE:
            return pos, 0, 0, frames
        body_left -= size
        pos = end + 1
        frames += 1
    if body_left > 0:
        return pos, 0, 0, frames
    m = len(method)
    content = _CONTENT.unpack_from
    count = total = 0
    while count < max_count:
        h = pos + m  # the content header's frame
        if h + 7 + CONTENT_MIN >= n or buf[pos:h] != method:
            break
        ftype, ch, size, _, _, body_size, flags = content(buf, h)
        p = h + 7 + size
        if ftype != 2 or ch != channel or size < CONTENT_MIN or size > limit or p >= n \
                or buf[p] != 0xCE or flags & HEADERS_FLAG or total + body_size > max_bytes:
            break
        p += 1
        parts = 2
        left = body_size
        while left > 0 and p + 7 <= n:
            ftype, ch, size = unpack(buf, p)
            end = p + 7 + size
            if ftype != 3 or ch != channel or size > limit or size > left or end >= n \
                    or buf[end] != 0xCE:
                break
            left -= size
            p = end + 1
            parts += 1
        if left > 0:
            break
        pos = p
        frames += parts
        count += 1
        total += body_size
        if ends is not None:
            ends.append(p)
    return pos, count, total, frames


__all__ = ["CONTENT_MIN", "HEADERS_FLAG", "scan_publish_run"]
