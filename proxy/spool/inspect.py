"""Read a spool directory without changing it: for ``floodwall spool ls`` and ``show``.

Opening a ``QueueSpool`` recovers it (cuts torn tails, deletes confirmed segments), which
only the spool's owner may do; these functions only read, so they are safe on the spool
of a running proxy too (its newest records may be mid-write: a torn tail is reported, not
cut).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from floodwall.spool.log import SEGMENT_SUFFIX
from floodwall.spool.manager import QueueKey, _decode, _encode
from floodwall.spool.records import RecordError, SpoolRecord, decode_at


@dataclass
class QueueSummary:
    """One queue's spool as found on disk."""

    key: QueueKey
    directory: Path
    records: int = 0  # not yet confirmed
    bytes: int = 0
    segments: int = 0
    confirmed_seq: int = 0
    first_seq: int | None = None  # oldest unconfirmed record
    last_seq: int | None = None
    oldest_accepted_at: float | None = None
    torn_tail_bytes: int = 0
    problems: tuple[str, ...] = ()


def queue_dirs(root: Path) -> Iterator[tuple[QueueKey, Path]]:
    """Every queue directory under a spool root, as ((vhost, queue), path)."""
    if not root.is_dir():
        return
    for vdir in sorted(p for p in root.iterdir() if p.is_dir()):
        for qdir in sorted(p for p in vdir.iterdir() if p.is_dir()):
            yield (_decode(vdir.name), _decode(qdir.name)), qdir


def queue_dir(root: Path, key: QueueKey) -> Path:
    return root / _encode(key[0]) / _encode(key[1])


def read_cursor(directory: Path) -> int:
    try:
        return int((directory / "cursor").read_text().strip() or 0)
    except (OSError, ValueError):
        return 0


class Scan:
    """One pass over a queue's directory: iterate ``records()`` (unconfirmed, oldest
    first); ``summary`` is complete once that iterator is exhausted."""

    def __init__(self, directory: Path, key: QueueKey) -> None:
        self.summary = QueueSummary(key, directory, confirmed_seq=read_cursor(directory))

    def records(self) -> Iterator[SpoolRecord]:
        summary = self.summary
        problems: list[str] = []
        paths = sorted(summary.directory.glob("*" + SEGMENT_SUFFIX))
        for i, path in enumerate(paths):
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # deleted by the running proxy meanwhile
            pos = 0
            counted = False
            while pos < len(data):
                try:
                    rec, end = decode_at(data, pos)
                except RecordError as exc:
                    if i == len(paths) - 1:
                        summary.torn_tail_bytes = len(data) - pos
                    else:
                        problems.append(f"{path.name}: {exc} at byte {pos}")
                        summary.problems = tuple(problems)
                    break
                if rec.seq > summary.confirmed_seq:
                    if not counted:
                        summary.segments += 1
                        counted = True
                    summary.records += 1
                    summary.bytes += end - pos
                    if summary.first_seq is None:
                        summary.first_seq = rec.seq
                        summary.oldest_accepted_at = rec.accepted_at
                    summary.last_seq = rec.seq
                    yield rec
                pos = end


def summarize(directory: Path, key: QueueKey) -> QueueSummary:
    scan = Scan(directory, key)
    for _ in scan.records():
        pass
    return scan.summary
