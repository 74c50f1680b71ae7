"""Runs of whole deliveries on one sender link, read in one pass (the per-transfer cost).

A sender at full speed puts tens of transfers of one link into every read: the same channel,
the same handle, delivery-ids one after another, each a whole message (``more`` false) in
the usual encoding. While the credit gate can book such a delivery without deciding anything
about it (``TransferHooks.transfer_run``), the core reads the run with ``scan_transfer_run``
and hands the gate the run's totals (``on_transfer_run``) instead of each transfer's fields.
The bytes are relayed unchanged either way (but for the delivery-ids of a session the proxy
renumbered, ``renumber_run``); what the run saves is the per-frame calls.

Two shortcuts keep the scan near a scan by length. A transfer is first compared with the
previous one (its bytes before the delivery-id and after the tag) before it is parsed field
by field; and after a run's first transfer, the frames that follow are read with one struct
when they are that transfer again (``_alike``: the same size, the same bytes but for the
delivery-id, the tag's bytes and the payload, the delivery-ids consecutive), else one by one.

The broker's settlements of those deliveries, a disposition each, are read the same way
(``scan_settlements``, below).

The scan is strict and silent: the first frame that is anything else (another channel or
link, a gap in the delivery-ids, a multi-frame delivery, a state, an unusual encoding, a
malformed or incomplete frame) ends the run, and the core reads that frame the usual way,
which also reports what is wrong with it.
"""

from __future__ import annotations

import functools
import struct
from typing import Final

from floodwall.wire.amqp10.performatives import NO_STATE, TRANSFER, peek_state, uint_bytes

_USUAL_START = struct.Struct(">IBBHBBB")  # size, doff, type, channel, 0x00 0x53 code
_U32 = struct.Struct(">I")
_MASK: Final = 0xFFFFFFFF


def scan_transfer_run(buf: bytes, pos: int, limit: int, channel: int, handle: int,
                      next_id: int, max_count: int, max_bytes: float,
                      unsettled: list[int] | None) -> tuple[int, int, int]:
    """From ``buf[pos]``, the complete transfer frames of a run; returns ``(end, count,
    payload_bytes)``: where the run ends, its deliveries, their payload bytes.

    A frame belongs to the run when it is an AMQP frame (doff 2, at most ``limit`` bytes) on
    ``channel`` with a smallulong transfer descriptor and a list8 or list32 of fields:
    ``handle``; delivery-id ``next_id`` (then the next one, modulo 2^32); a binary
    delivery-tag; an uint or null message-format; settled as a boolean or null; and after
    them only ``more`` false or null, rcv-settle-mode, no state, resume and aborted false or
    null, batchable. At most ``max_count`` deliveries and ``max_bytes`` of payload. The
    unsettled ones' delivery-ids are appended to ``unsettled`` (None: the broker's, untracked).
    """
    u32 = _U32.unpack_from
    size_of_buf = len(buf)
    count = total = 0
    # The previous transfer's shape: its bytes from after the frame size to its delivery-id,
    # where its fields end, its bytes after the delivery-tag. A sender encodes its deliveries
    # alike: the next one is compared with them before it is parsed field by field.
    prefix = tail = b""
    span = 0
    settled = False
    bulk = True
    try:
        while count < max_count and size_of_buf - pos >= 14:
            end = -1
            if prefix and buf.startswith(prefix, pos + 4):
                size = u32(buf, pos)[0]
                end, stop = pos + size, pos + span
                if not (stop <= end <= size_of_buf and size <= limit and _after_tag(
                        buf, pos + 4 + len(prefix), next_id) + len(tail) == stop
                        and buf.startswith(tail, stop - len(tail))):
                    end = -1
            if end < 0:
                shape = _shape(buf, pos, limit, channel, handle, next_id)
                if shape is None:
                    break
                end, stop, prefix, tail, settled = shape
                span = stop - pos
            if total + end - stop > max_bytes:
                break
            total += end - stop
            count += 1
            if not settled and unsettled is not None:
                unsettled.append(next_id)
            next_id = (next_id + 1) & _MASK
            if bulk and count < max_count:  # the ones alike (a miss costs a read of them)
                n = _alike(buf, pos, end, len(prefix) + 5, len(tail), next_id,
                           max_count - count, (max_bytes - total, end - stop))
                bulk = n == ALIKE_MOST  # (more may follow: looked for after the next one)
                if n:
                    if not settled and unsettled is not None:
                        unsettled.extend(range(next_id, next_id + n))
                    count, total = count + n, total + n * (end - stop)
                    next_id, end = next_id + n, end + n * (end - pos)
            pos = end
    except (IndexError, struct.error):  # a frame cut short inside its fields: not a run frame
        pass
    return pos, count, total


ALIKE_MOST: Final = 32
"""Most transfers ``_alike`` reads at once (the structs it keeps stay a few KiB each)."""


@functools.lru_cache(maxsize=128)
def _reader(layout: tuple[int, int, int, int, int], n: int) -> struct.Struct:
    """The struct that reads ``n`` transfers of ``layout`` (``_alike``): per transfer its
    head, delivery-id, tag header and tail; a few per sender."""
    head, tag_head, tag, tail, payload = layout
    return struct.Struct(">" + f"{head}sI{tag_head}s{tag}x{tail}s{payload}x" * n)


def _alike(buf: bytes, pos: int, end: int, head: int, tail: int, next_id: int, most: int,
           room: tuple[float, int]) -> int:
    """How many frames from ``end`` on are the transfer at ``buf[pos:end]`` again with the
    delivery-ids ``next_id``, ``next_id + 1``, ... (at most ``most`` and ``ALIKE_MOST``, and
    their payloads, of ``room[1]`` bytes each, within ``room[0]``): the same size and the same
    bytes except the
    delivery-id, the delivery-tag's bytes and the payload, all read with one struct; 0 unless
    all of them are (the caller then compares them one by one).

    ``head``: the bytes from the frame's start to its delivery-id (the frame size, header,
    descriptor, list header, handle and the id's constructor, which must be an uint's);
    ``tail``: the bytes between the delivery-tag and the payload. The transfer at ``pos`` was
    read field by field (``_shape``): a frame alike in those bytes is read alike."""
    size = end - pos
    left, payload = room
    n = min(most, ALIKE_MOST, (len(buf) - end) // size)
    if payload and left < n * payload:
        n = min(n, int(left // payload))
    if n < 2 or next_id + n > _MASK or buf[pos + head - 1] != 0x70:
        return 0
    at = pos + head + 4  # the delivery-tag's constructor
    tag_head = 2 if buf[at] == 0xA0 else 5
    tag = buf[at + 1] if tag_head == 2 else _U32.unpack_from(buf, at + 1)[0]
    if not buf.startswith(buf[pos:pos + head], end):  # (the next one at least, before all)
        return 0
    layout = (head, tag_head, tag, tail, size - head - 4 - tag_head - tag - tail)
    reader = _reader(layout, n)
    fields = reader.unpack_from(buf, end)
    first = buf[pos:pos + head], buf[at:at + tag_head], buf[at + tag_head + tag:
                                                            at + tag_head + tag + tail]
    if fields[0::4].count(first[0]) != n or fields[2::4].count(first[1]) != n \
            or fields[3::4].count(first[2]) != n \
            or fields[1::4] != tuple(range(next_id, next_id + n)):
        return 0
    return n


def _shape(buf: bytes, pos: int, limit: int, channel: int, handle: int,
           delivery_id: int) -> tuple[int, int, bytes, bytes, bool] | None:
    """The transfer at ``buf[pos]`` read field by field, when it is one of the run: where it
    ends, where its fields end, its bytes from after the frame size to its delivery-id and
    after its delivery-tag, and whether it was sent settled; None when it is not."""
    size, doff, ftype, ch, d0, d1, code = _USUAL_START.unpack_from(buf, pos)
    end = pos + size
    if not (code == TRANSFER and ch == channel and doff == 2 and ftype == 0 and d0 == 0
            and d1 == 0x53 and size <= limit and end <= len(buf)):
        return None
    p = pos + 11
    c = buf[p]
    if c == 0xC0:
        stop, fields, p = p + 2 + buf[p + 1], buf[p + 2], p + 3
    elif c == 0xD0:
        stop, fields, p = (p + 5 + _U32.unpack_from(buf, p + 1)[0],
                           _U32.unpack_from(buf, p + 5)[0], p + 9)
    else:
        return None
    if fields < 3 or fields > 11 or stop > end:
        return None
    past, settled, tag_end = _fields(buf, p, fields, handle, delivery_id)
    if past != stop:
        return None
    return end, stop, buf[pos + 4:_past_uint(buf, p)], buf[tag_end:stop], settled


def _past_uint(buf: bytes, p: int) -> int:
    """Past the uint at ``buf[p]`` (uint0, smalluint or uint: ``_fields`` checked it)."""
    c = buf[p]
    return p + 1 if c == 0x43 else p + 2 if c == 0x52 else p + 5


def _after_tag(buf: bytes, p: int, delivery_id: int) -> int:
    """Past a delivery-id equal to ``delivery_id`` and a binary delivery-tag at ``buf[p]``;
    -1 for anything else."""
    c = buf[p]
    if c == 0x52:
        if buf[p + 1] != delivery_id:
            return -1
        p += 2
    elif c == 0x70:
        if _U32.unpack_from(buf, p + 1)[0] != delivery_id:
            return -1
        p += 5
    elif c == 0x43 and delivery_id == 0:
        p += 1
    else:
        return -1
    c = buf[p]
    if c == 0xA0:
        return p + 2 + buf[p + 1]
    if c == 0xB0:
        return p + 5 + int(_U32.unpack_from(buf, p + 1)[0])
    return -1


def _fields(buf: bytes, p: int, fields: int, handle: int,
            delivery_id: int) -> tuple[int, bool, int]:
    """Past the ``fields`` fields of a transfer at ``buf[p]`` that is a whole delivery of
    ``handle`` with ``delivery_id``, whether it was sent settled, and where its delivery-tag
    ends; (-1, False, -1) for any other transfer (or encoding)."""
    for expected in (handle, delivery_id):
        c = buf[p]
        if c == 0x52:
            value, p = buf[p + 1], p + 2
        elif c == 0x43:
            value, p = 0, p + 1
        elif c == 0x70:
            value, p = _U32.unpack_from(buf, p + 1)[0], p + 5
        else:
            return -1, False, -1
        if value != expected:
            return -1, False, -1
    c = buf[p]  # delivery-tag
    if c == 0xA0:
        p += 2 + buf[p + 1]
    elif c == 0xB0:
        p += 5 + _U32.unpack_from(buf, p + 1)[0]
    else:
        return -1, False, -1
    tag_end = p
    settled = False
    if fields > 3:
        p = _format(buf, p)
        if fields > 4 and p >= 0:
            c = buf[p]
            if c == 0x42 or c == 0x40:
                p += 1
            elif c == 0x41:
                settled, p = True, p + 1
            elif c == 0x56 and buf[p + 1] <= 1:
                settled, p = buf[p + 1] == 1, p + 2
            else:
                return -1, False, -1
            if fields > 5:
                p = _tail(buf, p, fields)
    return p, settled, tag_end


def _format(buf: bytes, p: int) -> int:
    """Past a message-format (uint0, smalluint, uint or null); -1 for anything else."""
    c = buf[p]
    if c == 0x43 or c == 0x40:
        return p + 1
    if c == 0x52:
        return p + 2
    if c == 0x70:
        return p + 5
    return -1


def _tail(buf: bytes, p: int, fields: int) -> int:
    """Past fields 5 to ``fields - 1`` of a transfer, when they change nothing the gate
    books: more false or null (5), rcv-settle-mode (6), no state (7), resume and aborted
    false or null (8, 9), batchable (10); -1 for anything else."""
    for index in range(5, fields):
        c = buf[p]
        if c == 0x40:
            p += 1
        elif index == 6:
            if c != 0x50:
                return -1
            p += 2
        elif index == 7:
            return -1
        elif c == 0x42 or (c == 0x41 and index == 10):
            p += 1
        elif c == 0x56 and (buf[p + 1] == 0 or (buf[p + 1] == 1 and index == 10)):
            p += 2
        else:
            return -1
    return p


def renumber_run(buf: bytes, pos: int, end: int, shift: int) -> bytes:
    """The transfers ``scan_transfer_run`` read at ``buf[pos:end]``, each delivery-id less
    ``shift`` (modulo 2^32): a session some of whose deliveries the proxy took for itself
    goes on in the broker's numbering. Each id is written in the shortest uint encoding and
    the performative's list and the frame are sized to it (a list8 or list32 as the encoder
    chooses, ``encode``); every other byte is the client's."""
    u32 = _U32.unpack_from
    # Usually each id is an uint in a list8 both before and after (past the session's first
    # 256 deliveries): the run's bytes again, each id overwritten in place.
    out = bytearray(buf[pos:end])
    pack_into = _U32.pack_into
    at = pos
    while at < end:
        p = at + 11  # the list's constructor (``_shape`` checked the frame up to it)
        id_at = _past_uint(buf, p + 3) if buf[p] == 0xC0 else -1
        if id_at < 0 or buf[id_at] != 0x70:
            return _resized_run(buf, pos, end, shift)
        new_id = (u32(buf, id_at + 1)[0] - shift) & _MASK
        if new_id < 256:
            return _resized_run(buf, pos, end, shift)
        pack_into(out, id_at + 1 - pos, new_id)
        at += u32(buf, at)[0]
    return bytes(out)


def _resized_run(buf: bytes, pos: int, end: int, shift: int) -> bytes:
    """``renumber_run`` where some id's encoding changes size: each frame written again."""
    out: list[bytes] = []
    u32 = _U32.unpack_from
    while pos < end:
        frame_end = pos + u32(buf, pos)[0]
        p = pos + 11  # the list's constructor (``_shape`` checked the frame up to it)
        if buf[p] == 0xC0:
            count, fields_at, list_end = buf[p + 2], p + 3, p + 2 + buf[p + 1]
        else:
            count, fields_at, list_end = u32(buf, p + 5)[0], p + 9, p + 5 + u32(buf, p + 1)[0]
        id_at = _past_uint(buf, fields_at)
        id_end = _past_uint(buf, id_at)
        c = buf[id_at]
        old = 0 if c == 0x43 else buf[id_at + 1] if c == 0x52 else u32(buf, id_at + 1)[0]
        id_bytes = uint_bytes((old - shift) & _MASK)
        body = (id_at - fields_at) + len(id_bytes) + (list_end - id_end)
        if body < 255 and count <= 255:
            head = bytes((0xC0, body + 1, count))
        else:
            head = b"\xd0" + (body + 4).to_bytes(4, "big") + count.to_bytes(4, "big")
        size = 11 + len(head) + body + (frame_end - list_end)
        out += (size.to_bytes(4, "big"), buf[pos + 4:p], head, buf[fields_at:id_at], id_bytes,
                buf[id_end:frame_end])
        pos = frame_end
    return b"".join(out)


# -- the broker's settlements ------------------------------------------------------------------
# A broker settles a fast sender's deliveries with a disposition each (RabbitMQ: role
# receiver, first and last the delivery-id, settled, accepted), tens to a read. When the gate
# says booking them is bookkeeping only (``TransferHooks.server_settle_run``), a disposition
# and the frames after it that are that disposition again but for first and last are read
# with ``scan_settlements`` and booked as ranges of consecutive ids. Alike, they have one
# state (``settle_state``): the ranges are counted as that outcome.

_SETTLE_IDS = struct.Struct(">IxI")  # first, (0x70), last
_SETTLE_WRITE = struct.Struct(">IBI")  # first, 0x70, last
_SETTLE_HEAD: Final = 16  # frame header, descriptor, list8 size and count, role, 0x70
_SETTLE_TAIL: Final = 25  # where the bytes after last begin
SETTLE_SPAN: Final = 1 << 20
"""The most ids one range of ``scan_settlements`` spans (far from serial wrap-around)."""


def settle_template(buf: bytes, start: int, end: int) -> bool:
    """Whether the disposition frame ``buf[start:end]`` has the shape a settlement run is read
    with: data offset 2, a list8, role receiver (true), first and last uints (0x70), last
    not before first (and under ``SETTLE_SPAN`` past it)."""
    return end - start >= _SETTLE_TAIL and buf[start + 4] == 2 \
        and buf.startswith(b"\x00\x53\x15\xc0", start + 8) and buf[start + 14] == 0x41 \
        and buf[start + 15] == 0x70 and buf[start + 20] == 0x70 \
        and _span(*_SETTLE_IDS.unpack_from(buf, start + _SETTLE_HEAD)) < SETTLE_SPAN


def settle_state(buf: bytes, start: int, end: int) -> int | None:
    """The state of the disposition ``buf[start:end]`` (``settle_template``): its
    descriptor code (``peek_state``), the same for every frame of the run it begins (they are
    alike but for first and last); None when not in the usual encoding."""
    count = buf[start + 13]
    return peek_state(buf, start + _SETTLE_TAIL, min(end, start + 13 + buf[start + 12]),
                      count - 3) if count > 3 else NO_STATE


def _span(first: int, last: int) -> int:
    return (last - first) & _MASK


def settle_frames(buf: bytes, start: int, end: int, ranges: list[tuple[int, int]]) -> bytes:
    """The disposition ``buf[start:end]`` (``settle_template``) once per range of
    ``ranges``, with its first and last: a run of the broker's settlements on a session the
    proxy renumbered, in the client's ids (one frame per range: the client learns the same
    outcome for the same deliveries, in fewer frames than the broker sent)."""
    head, tail = buf[start:start + _SETTLE_HEAD], buf[start + _SETTLE_TAIL:end]
    pack = _SETTLE_WRITE.pack
    return b"".join(head + pack(first, 0x70, last) + tail for first, last in ranges)


SETTLE_ALIKE: Final = 32
"""Most settlements ``_settled_alike`` reads at once."""


@functools.lru_cache(maxsize=32)
def _settle_reader(tail: int, n: int) -> struct.Struct:
    """The struct that reads ``n`` settlements: per frame its head, first, the constructor
    of last, last and the bytes after it (``tail`` of them)."""
    return struct.Struct(">" + f"{_SETTLE_HEAD}sIsI{tail}s" * n)


def _settled_alike(buf: bytes, pos: int, size: int, n: int, head: bytes, tail: bytes) -> int:
    """The first of ``n`` settlements from ``pos`` that are the template again, each of one
    delivery-id, consecutive (the broker settling a fast sender's deliveries in order),
    read with one struct; -1 unless all of them are (the caller reads them one by one)."""
    fields = _settle_reader(size - _SETTLE_TAIL, n).unpack_from(buf, pos)
    firsts = fields[1::5]
    first: int = firsts[0]
    if fields[0::5].count(head) != n or fields[2::5].count(b"\x70") != n \
            or fields[4::5].count(tail) != n or fields[3::5] != firsts \
            or firsts != tuple(range(first, first + n)):
        return -1
    return first


def scan_settlements(buf: bytes, start: int, pos: int) -> tuple[int, int, list[tuple[int, int]]]:
    """The disposition ``buf[start:pos]`` (``settle_template``) and the frames from ``pos``
    that are it again, byte for byte, but for first and last: ``(end, how many after it,
    ranges)``, the ranges their first..last with consecutive ones joined (at most
    ``SETTLE_SPAN`` ids each). A frame with last before first, or anything else, ends the
    scan (read the usual way)."""
    size = pos - start
    head = buf[start:start + _SETTLE_HEAD]
    tail = buf[start + _SETTLE_TAIL:pos]
    unpack = _SETTLE_IDS.unpack_from
    stop = len(buf) - size
    ranges: list[tuple[int, int]] = []
    lo, hi = unpack(buf, start + _SETTLE_HEAD)
    count = 0
    alike = True
    while True:
        n = min(SETTLE_ALIKE, (stop - pos) // size + 1)
        if alike and n >= 2:
            first = _settled_alike(buf, pos, size, n, head, tail)
            if first >= 0:
                lo, hi = _joined(ranges, lo, hi, first, first + n - 1)
                count += n
                pos += n * size
                continue
            alike = False  # (one by one from here)
        if not (pos <= stop and buf.startswith(head, pos) and buf[pos + 20] == 0x70
                and buf.startswith(tail, pos + _SETTLE_TAIL)):
            break
        first, last = unpack(buf, pos + _SETTLE_HEAD)
        if _span(first, last) >= SETTLE_SPAN:
            break
        lo, hi = _joined(ranges, lo, hi, first, last)
        count += 1
        pos += size
    ranges.append((lo, hi))
    return pos, count, ranges


def _joined(ranges: list[tuple[int, int]], lo: int, hi: int, first: int, last: int
            ) -> tuple[int, int]:
    """The range being read, ``lo..hi``, with ``first..last`` after it: joined when
    consecutive (within ``SETTLE_SPAN``), else ``lo..hi`` goes to ``ranges`` and
    ``first..last`` is the range being read."""
    if first == (hi + 1) & _MASK and _span(lo, last) < SETTLE_SPAN:
        return lo, last
    ranges.append((lo, hi))
    return first, last
