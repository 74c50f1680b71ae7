"""One queue's spool on disk: segment files appended in order, a cursor of what was confirmed.

Layout of a queue's directory::

    00000000000000000001.seg   records with seq 1 .. (rotated past ``segment_bytes``)
    00000000000000004097.seg   the next segment: its name is its first record's seq
    cursor                     "N\\n": every record with seq <= N reached the broker

Appends go to the newest segment through the OS (``append``); ``sync`` makes them durable
(fsync), and ``durable_seq`` says how far that reaches. A record is deleted only when the
broker confirmed it (``confirmed_through``): whole segments are removed once the cursor
passes their last record; the cursor is written by rename, so it is either old or new.
Delivery across a crash is therefore at least once: a record replayed but not yet
confirmed (or confirmed after the last cursor write) is replayed again.

Opening a spool recovers it: a torn tail (an append a crash interrupted) is cut; damaged
bytes anywhere else are skipped, reading on from the next whole record
(``segments.scan_segment``), and the segment is rewritten without them; entries that are
no segment (``x.seg``, a directory ``5.seg``) are left alone. ``report`` says what it found.

Plain blocking file I/O: the asyncio layer calls ``sync`` and ``read_batch`` on worker
threads. The lock guards the bookkeeping only; ``fsync`` runs outside it (on a duplicate of
the segment's descriptor), so an append on the event loop never waits for the disk.
A rotated-out segment keeps its descriptor until the next ``sync`` has fsynced it.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from floodwall.spool.records import HEAD_SIZE, RecordError, SpoolRecord, decode_at
from floodwall.spool.segments import Skipped, scan_segment

SEGMENT_SUFFIX = ".seg"
REWRITE_SUFFIX = ".tmp"  # a segment being rewritten without its damaged bytes
MAX_SEQ = (1 << 64) - 1  # a record's seq is a u64
DEFAULT_SEGMENT_BYTES = 64 * 1024 * 1024


class SpoolError(OSError):
    """The spool could not take or give a record (disk full, I/O error, limits)."""


@dataclass
class Segment:
    path: Path
    first_seq: int
    last_seq: int = 0  # 0: empty
    size: int = 0


@dataclass(frozen=True, slots=True)
class ReadPosition:
    """Where a reader stands: just after record ``after``, at ``offset`` in the segment
    whose first record is ``first_seq`` (``read_batch`` continues from there)."""

    first_seq: int
    offset: int
    after: int


@dataclass
class RecoveryReport:
    """What opening a spool found."""

    segments: int = 0
    records: int = 0
    bytes: int = 0
    torn_tail_bytes: int = 0  # an interrupted last append, dropped
    skipped_bytes: int = 0  # damaged bytes passed over (each range in ``corrupt``)
    lost_records: int = 0  # unconfirmed records that were in the damaged bytes
    corrupt: list[str] = field(default_factory=list)  # what was damaged, one line each
    bad_entries: list[str] = field(default_factory=list)  # files that are no segment

    @property
    def problems(self) -> list[str]:
        return [*self.corrupt, *self.bad_entries]


class QueueSpool:
    """The spool of one queue."""

    def __init__(self, directory: Path, segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.directory = Path(directory)
        self.segment_bytes = segment_bytes
        self.segments: list[Segment] = []
        self.confirmed_seq = 0  # every record <= this reached the broker
        self.next_seq = 1
        self.durable_seq = 0
        self._fd: int | None = None
        self._pending_bytes = 0  # on disk, not confirmed (what limits count)
        self._pending_records = 0
        self._oldest_at: float | None = None
        self._lock = threading.Lock()  # sync() runs on a worker thread, append() on the loop
        self._retired: list[int] = []  # descriptors of rotated-out segments, not yet fsynced
        self._dir_dirty = False  # a segment was created since the last sync
        self._broken = False  # a failed write could not be cut back: next append rotates
        self.report = self._recover()

    # -- opening -----------------------------------------------------------------------
    def _recover(self) -> RecoveryReport:
        self.directory.mkdir(parents=True, exist_ok=True)
        report = RecoveryReport()
        cursor = self.directory / "cursor"
        if cursor.exists():
            try:
                confirmed = _cursor_value(cursor.read_bytes())
            except OSError:
                confirmed = None
            if confirmed is None:
                report.corrupt.append(f"{cursor}: unreadable cursor, replaying everything")
            else:
                self.confirmed_seq = confirmed
        found, report.bad_entries = segment_files(self.directory)
        unread_above = 0
        for i, (first_seq, path) in enumerate(found):
            following = found[i + 1][0] if i + 1 < len(found) else None
            try:
                data = path.read_bytes()
            except OSError as exc:
                report.bad_entries.append(f"{path}: cannot be read "
                                          f"({exc.strerror or exc}); left as it is")
                unread_above = max(unread_above, first_seq)
                continue
            try:
                seg = self._recover_segment(path, first_seq, data, following, report)
            except OSError as exc:
                report.bad_entries.append(f"{path}: cannot be repaired "
                                          f"({exc.strerror or exc}); left as it is")
                unread_above = max(unread_above, first_seq)
                continue
            if seg is None:
                continue
            self.segments.append(seg)
            report.segments += 1
        last = max((s.last_seq for s in self.segments), default=0)
        # (past an unreadable segment's first seq: a new segment never takes its name)
        self.next_seq = max(last, self.confirmed_seq, unread_above) + 1
        self.durable_seq = self.next_seq - 1
        report.records = self._pending_records
        report.bytes = self._pending_bytes
        return report

    def _recover_segment(self, path: Path, first_seq: int, data: bytes,
                         following: int | None, report: RecoveryReport) -> Segment | None:
        """One segment's records booked; damage skipped (the segment rewritten without
        it), a torn tail cut. None: nothing of it is left (deleted)."""
        seg = Segment(path, first_seq)
        kept: list[tuple[int, int]] = []  # byte ranges of whole records
        lost_after: int | None = None  # the last good seq before a skipped range
        for item in scan_segment(data, first_seq, following):
            if isinstance(item, Skipped):
                if item.at_end and following is None:
                    report.torn_tail_bytes = item.size  # the interrupted last append
                    break
                report.skipped_bytes += item.size
                report.corrupt.append(
                    f"{path}: {item.reason} at byte {item.start}; {item.size} bytes "
                    + ("skipped, to the end of the segment" if item.at_end else
                       "skipped, reading on from the next whole record"))
                lost_after = seg.last_seq or first_seq - 1
                if item.at_end and following is not None:
                    report.lost_records += self._unconfirmed_between(lost_after, following)
                continue
            rec = item.record
            if lost_after is not None:
                report.lost_records += self._unconfirmed_between(lost_after, rec.seq)
                lost_after = None
            seg.last_seq = rec.seq
            if rec.seq > self.confirmed_seq:
                self._pending_records += 1
                self._pending_bytes += item.end - item.start
                if self._oldest_at is None:
                    self._oldest_at = rec.accepted_at
            kept.append((item.start, item.end))
        seg.size = sum(end - start for start, end in kept)
        if seg.size != len(data):
            if not kept or kept[-1][1] == seg.size:  # only a tail to cut
                with open(path, "r+b") as f:
                    f.truncate(seg.size)
                    os.fsync(f.fileno())
            else:
                _rewrite(path, data, kept)
        if seg.last_seq and seg.last_seq <= self.confirmed_seq:
            path.unlink()  # confirmed before the crash; its deletion did not happen
            return None
        if not seg.last_seq and following is not None:
            path.unlink()  # an older segment with nothing left in it
            return None
        return seg

    def _unconfirmed_between(self, before: int, after: int) -> int:
        """Seqs strictly between ``before`` and ``after`` that were not yet confirmed."""
        return max(0, after - max(before, self.confirmed_seq) - 1)

    # -- appending ---------------------------------------------------------------------
    def append(self, record: SpoolRecord) -> int:
        """Write a record (seq is assigned here); returns its seq. Durable after ``sync``.

        A failed write (disk full, I/O error) is cut back off the segment, so the segment
        stays whole, and raises SpoolError.
        """
        with self._lock:
            return self._append(record)

    def _append(self, record: SpoolRecord) -> int:
        seq = self.next_seq
        if seq > MAX_SEQ:
            raise SpoolError(errno.EOVERFLOW, f"spool of {self.directory} has used every "
                             f"sequence number (the last is {seq - 1})")
        data = SpoolRecord(seq, record.accepted_at, record.exchange, record.routing_key,
                           record.properties, record.body, record.mandatory,
                           record.amqp10).encode()
        try:
            seg = self._writable_segment(seq)
        except OSError as exc:
            raise SpoolError(exc.errno or errno.EIO, f"spool segment of {self.directory} "
                             f"could not be opened: {exc.strerror or exc}") from None
        fd = self._fd
        assert fd is not None
        try:
            written = os.write(fd, data)
            while written < len(data):
                written += os.write(fd, data[written:])
        except OSError as exc:
            self._cut_back(seg)
            raise SpoolError(exc.errno or errno.EIO, f"spool append failed in "
                             f"{seg.path}: {exc.strerror or exc}") from None
        seg.size += len(data)
        seg.last_seq = seq
        self.next_seq = seq + 1
        self._pending_bytes += len(data)
        self._pending_records += 1
        if self._oldest_at is None:
            self._oldest_at = record.accepted_at
        return seq

    def _writable_segment(self, seq: int) -> Segment:
        seg = self.segments[-1] if self.segments else None
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        if seg is not None and self._broken and not seg.last_seq:
            # An empty segment whose first write could not be cut back: start it again.
            fd = os.open(seg.path, flags | os.O_TRUNC, 0o640)
            self._replace_fd(fd)
            seg.size = 0
            self._broken = False
        elif seg is None or self._broken or (seg.size >= self.segment_bytes and seg.last_seq):
            path = self.directory / f"{seq:020d}{SEGMENT_SUFFIX}"
            fd = os.open(path, flags, 0o640)  # first: a failure leaves the bookkeeping alone
            self._replace_fd(fd)
            seg = Segment(path, seq)
            self.segments.append(seg)
            self._dir_dirty = True
            self._broken = False
        elif self._fd is None:
            self._fd = os.open(seg.path, flags, 0o640)
        return seg

    def _replace_fd(self, fd: int) -> None:
        if self._fd is not None:
            self._retired.append(self._fd)  # closed by the next sync, after its fsync
        self._fd = fd

    def _cut_back(self, seg: Segment) -> None:
        """Cut a failed write off; if even that fails, the next append starts a segment
        (recovery then cuts this one's tail as corruption, keeping every whole record)."""
        try:
            os.ftruncate(self._fd if self._fd is not None else -1, seg.size)
        except OSError:
            self._broken = True

    def sync(self, fsync: bool = True) -> int:
        """Make every appended record durable; returns ``durable_seq``.

        ``fsync=False`` (the policy's ``fsync: never``) leaves durability to the OS but
        moves ``durable_seq`` all the same: what the replayer may read and what clients
        are acked for. An fsync failure raises SpoolError and ``durable_seq`` stays.
        """
        with self._lock:
            target = self.next_seq - 1
            if self.durable_seq >= target and not self._retired:
                return self.durable_seq
            fds, self._retired = self._retired, []
            dir_dirty, self._dir_dirty = self._dir_dirty, False
            try:
                if self._fd is not None:
                    fds.append(os.dup(self._fd))
            except OSError as exc:
                self._retired, self._dir_dirty = fds, dir_dirty
                raise SpoolError(exc.errno or errno.EIO, f"spool sync of {self.directory}: "
                                 f"{exc.strerror or exc}") from None
        try:
            if fsync:
                for fd in fds:
                    os.fsync(fd)
                if dir_dirty:
                    _fsync_dir(self.directory)  # new segments' directory entries
        except OSError as exc:
            with self._lock:
                self._dir_dirty = self._dir_dirty or dir_dirty
            raise SpoolError(exc.errno or errno.EIO, f"spool fsync in {self.directory} "
                             f"failed: {exc.strerror or exc}") from None
        finally:
            for fd in fds:
                try:
                    os.close(fd)
                except OSError:
                    pass
        with self._lock:
            self.durable_seq = max(self.durable_seq, target)
            return self.durable_seq

    # -- reading and confirming --------------------------------------------------------
    def records(self, after: int | None = None) -> Iterator[SpoolRecord]:
        """Durable records with seq > ``after`` (default: the cursor), oldest first."""
        floor = self.confirmed_seq if after is None else after
        with self._lock:
            segments = [(s.path, s.size, s.last_seq) for s in self.segments]
        for path, size, last_seq in segments:
            if last_seq and last_seq <= floor:
                continue
            try:
                with open(path, "rb") as f:
                    data = f.read(size)
            except FileNotFoundError:
                continue
            pos = 0
            while pos < len(data):
                rec, pos = decode_at(data, pos)
                if rec.seq > floor and rec.seq <= self.durable_seq:
                    yield rec

    def read_batch(self, after: int, max_bytes: int = 1 << 20,
                   position: ReadPosition | None = None
                   ) -> list[tuple[SpoolRecord, ReadPosition]]:
        """Durable records with seq > ``after``, oldest first, about ``max_bytes`` of them
        (at least one when there is one), each with the position just after it.

        ``position`` (from the last record of the previous batch, when its ``after`` is
        this ``after``) lets the read start where the previous one ended instead of at the
        segment's beginning. Corruption inside the durable part raises SpoolError.
        """
        with self._lock:
            segments = [(s.path, s.first_seq, s.size, s.last_seq) for s in self.segments]
            durable = self.durable_seq
        out: list[tuple[SpoolRecord, ReadPosition]] = []
        taken = 0
        if position is not None and position.after != after:
            position = None
        for path, first_seq, size, last_seq in segments:
            if (last_seq and last_seq <= after) or not size:
                continue
            offset = position.offset if position and position.first_seq == first_seq else 0
            position = None
            try:
                with open(path, "rb") as f:
                    while offset < size:
                        f.seek(offset)
                        data = f.read(min(size - offset, max(max_bytes - taken, 1 << 16)))
                        pos = 0
                        while pos < len(data):
                            try:
                                rec, end = decode_at(data, pos)
                            except RecordError:
                                if offset + len(data) >= size:
                                    raise  # the segment's durable part ends mid-record
                                break  # the chunk cut this record: read on from it
                            if rec.seq > durable:
                                return out
                            pos = end
                            if rec.seq > after:
                                out.append((rec, ReadPosition(first_seq, offset + pos, rec.seq)))
                                taken += rec.size
                                if taken >= max_bytes:
                                    return out
                        if pos == 0:  # one record longer than the chunk
                            rec, pos = _read_whole(f, offset, size, data)
                            if rec.seq > durable:
                                return out
                            if rec.seq > after:
                                out.append((rec, ReadPosition(first_seq, offset + pos, rec.seq)))
                                taken += rec.size
                                if taken >= max_bytes:
                                    return out
                        offset += pos
            except FileNotFoundError:
                continue  # confirmed and deleted meanwhile
            except RecordError as exc:
                raise SpoolError(errno.EIO, f"spool segment {path} is corrupt inside its "
                                 f"durable part: {exc}") from None
        return out

    def confirmed_through(self, seq: int, sizes: int = 0, count: int = 0) -> None:
        """The broker confirmed every record up to ``seq``; drop what is wholly confirmed.

        ``sizes`` and ``count`` are the bytes and records this confirmation covers (the
        replayer knows them), for the pending figures.
        """
        with self._lock:
            self._confirmed_through(seq, sizes, count)

    def _confirmed_through(self, seq: int, sizes: int, count: int) -> None:
        if seq <= self.confirmed_seq:
            return
        self.confirmed_seq = seq
        self._pending_bytes = max(0, self._pending_bytes - sizes)
        self._pending_records = max(0, self._pending_records - count)
        if self._pending_records == 0:
            self._oldest_at = None
        tmp = self.directory / "cursor.tmp"
        try:
            tmp.write_text(f"{seq}\n")
            os.replace(tmp, self.directory / "cursor")
        except OSError:
            # (disk full): an old cursor only means more duplicates after a crash; deleting
            # the confirmed segments below is what frees the space, so go on.
            pass
        while self.segments and self.segments[0].last_seq and \
                self.segments[0].last_seq <= seq and len(self.segments) > 1:
            self.segments.pop(0).path.unlink(missing_ok=True)
        if self.segments and self.segments[0].last_seq and self.segments[0].last_seq <= seq \
                and self.next_seq - 1 <= seq:
            # Everything confirmed: start afresh (the active segment too).
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
            self.segments.pop(0).path.unlink(missing_ok=True)

    def oldest_set(self, accepted_at: float | None) -> None:
        """The replayer tells the accept time of the oldest unconfirmed record."""
        self._oldest_at = accepted_at

    # -- figures -----------------------------------------------------------------------
    @property
    def pending_bytes(self) -> int:
        return self._pending_bytes

    @property
    def pending_records(self) -> int:
        return self._pending_records

    @property
    def oldest_accepted_at(self) -> float | None:
        return self._oldest_at

    @property
    def empty(self) -> bool:
        return self._pending_records == 0

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    def close(self) -> None:
        with self._lock:
            for fd in [*self._retired, *([self._fd] if self._fd is not None else [])]:
                try:
                    os.close(fd)
                except OSError:
                    pass
            self._retired = []
            self._fd = None


def segment_files(directory: Path, tidy: bool = True
                  ) -> tuple[list[tuple[int, Path]], list[str]]:
    """The segments of a queue's directory as (first seq, path), oldest first, and a line
    for each entry that looks like one but is not (``x.seg``, a directory ``5.seg``).
    ``tidy``: remove the leftover of an interrupted rewrite (``*.seg.tmp``)."""
    found: list[tuple[int, Path]] = []
    bad: list[str] = []
    try:
        entries = sorted(directory.iterdir())
    except FileNotFoundError:
        return [], []
    for path in entries:
        if path.name.endswith(SEGMENT_SUFFIX + REWRITE_SUFFIX):
            if tidy and path.is_file():
                path.unlink(missing_ok=True)
            continue
        if not path.name.endswith(SEGMENT_SUFFIX):
            continue
        stem = path.name[:-len(SEGMENT_SUFFIX)]
        if not (stem.isascii() and stem.isdigit()):
            bad.append(f"{path}: not a segment name (digits.seg); skipped")
        elif path.is_symlink() or not path.is_file():
            bad.append(f"{path}: not a regular file; skipped")
        else:
            found.append((int(stem), path))
    found.sort()
    return found, bad


def _rewrite(path: Path, data: bytes, kept: list[tuple[int, int]]) -> None:
    """Replace a segment by the byte ranges ``kept`` of its ``data`` (atomically: a crash
    leaves the old file or the new one, and a ``*.seg.tmp`` that the next start removes)."""
    tmp = path.with_name(path.name + REWRITE_SUFFIX)
    with open(tmp, "wb") as f:
        for start, end in kept:
            f.write(data[start:end])
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _cursor_value(text: bytes) -> int | None:
    """The cursor file's sequence number, or None when it holds none a record can have
    (not a decimal number, or past ``MAX_SEQ``)."""
    value = text.strip()
    if not value:
        return 0
    if not value.isdigit() or len(value) > 20 or int(value) > MAX_SEQ:
        return None
    return int(value)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _read_whole(f: BinaryIO, offset: int, size: int, head: bytes) -> tuple[SpoolRecord, int]:
    """The record at ``offset`` of a segment of ``size`` bytes, read in one piece (``head``:
    the chunk read there, too short for it)."""
    length = int.from_bytes(head[4:8], "big") if len(head) >= 8 else 0
    f.seek(offset)
    return decode_at(f.read(min(size - offset, HEAD_SIZE + length)), 0)
