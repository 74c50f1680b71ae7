"""A segment's bytes read record by record, past any damage: bytes in, records and skips out.

Records are length-prefixed and checksummed (``records``), so a reader that meets bytes
that are not a record can find the next one: it looks for the next ``MAGIC`` whose header,
checksum and fields all hold and whose sequence number fits (above the last good record's,
below the next segment's first), and goes on from there. What it passed over is a
``Skipped`` range; only the records whose bytes were damaged are lost. A skipped range that
no record follows is ``at_end``: in the newest segment that is a torn tail (an append the
crash interrupted, never acknowledged); anywhere else it is damage too.

No files here: the caller reads a segment into memory and hands its bytes over.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from floodwall.spool.records import MAGIC, RecordError, SpoolRecord, decode_at


@dataclass(frozen=True, slots=True)
class RecordAt:
    """A whole record and where it lies in the segment."""

    record: SpoolRecord
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Skipped:
    """Bytes ``[start, end)`` that are no record; ``reason``: why the first of them is not.
    ``at_end``: no valid record follows them."""

    start: int
    end: int
    reason: str
    at_end: bool

    @property
    def size(self) -> int:
        return self.end - self.start


def scan_segment(data: bytes, first_seq: int = 1,
                 next_segment_seq: int | None = None) -> Iterator[RecordAt | Skipped]:
    """The records of a segment's bytes in order, with every damaged range between them.

    ``first_seq``: the segment's first sequence number (its file name); a record found by
    resynchronising must have a higher one than the last good record (at least
    ``first_seq``) and, if given, a lower one than ``next_segment_seq``: a record that
    happens to sit inside another's body is not taken for a real one.
    """
    pos = 0
    floor = first_seq - 1  # the last good record's seq
    size = len(data)
    while pos < size:
        try:
            rec, end = decode_at(data, pos)
        except RecordError as exc:
            found = _resynchronise(data, pos + 1, floor, next_segment_seq)
            if found is None:
                yield Skipped(pos, size, str(exc), at_end=True)
                return
            yield Skipped(pos, found, str(exc), at_end=False)
            pos = found
            continue
        yield RecordAt(rec, pos, end)
        floor = max(floor, rec.seq)
        pos = end


def _resynchronise(data: bytes, start: int, floor: int, ceiling: int | None) -> int | None:
    """The offset of the next valid record at or after ``start`` whose seq is above
    ``floor`` (and below ``ceiling``); None if there is none."""
    pos = data.find(MAGIC, start)
    while pos >= 0:
        try:
            rec, _ = decode_at(data, pos)
        except RecordError:
            pass
        else:
            if rec.seq > floor and (ceiling is None or rec.seq < ceiling):
                return pos
        pos = data.find(MAGIC, pos + 1)
    return None
