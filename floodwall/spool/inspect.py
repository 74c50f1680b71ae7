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

from floodwall.spool.log import segment_files
from floodwall.spool.names import (
    QueueKey,
    UnreadableEntry,
    existing_queue_directory,
    queue_directories,
)
from floodwall.spool.records import SpoolRecord
from floodwall.spool.segments import Skipped, scan_segment


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
    skipped_bytes: int = 0  # damaged bytes the reader passed over (the next start drops them)
    problems: tuple[str, ...] = ()


def queue_dirs(root: Path) -> Iterator[tuple[QueueKey, Path]]:
    """Every queue directory under a spool root, as ((vhost, queue), path)."""
    for found in queue_directories(root):
        if not isinstance(found, UnreadableEntry):
            yield found


def unreadable_entries(root: Path) -> list[UnreadableEntry]:
    """What under a spool root is no queue's spool directory (and why)."""
    return [f for f in queue_directories(root) if isinstance(f, UnreadableEntry)]


def queue_dir(root: Path, key: QueueKey) -> Path:
    """Where ``key``'s spool is (also one an older floodwall made); ``SpoolPathError`` if
    that would be outside the root."""
    return existing_queue_directory(root, key)


def read_cursor(directory: Path) -> int:
    try:
        return int((directory / "cursor").read_text().strip() or 0)
    except (OSError, ValueError, UnicodeDecodeError):
        return 0


class Scan:
    """One pass over a queue's directory: iterate ``records()`` (unconfirmed, oldest
    first); ``summary`` is complete once that iterator is exhausted."""

    def __init__(self, directory: Path, key: QueueKey) -> None:
        self.summary = QueueSummary(key, directory, confirmed_seq=read_cursor(directory))

    def records(self) -> Iterator[SpoolRecord]:
        summary = self.summary
        found, bad = segment_files(summary.directory, tidy=False)
        problems = list(bad)
        summary.problems = tuple(problems)
        for i, (first_seq, path) in enumerate(found):
            following = found[i + 1][0] if i + 1 < len(found) else None
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                continue  # deleted by the running proxy meanwhile
            except OSError as exc:
                problems.append(f"{path.name}: cannot be read ({exc.strerror or exc})")
                summary.problems = tuple(problems)
                continue
            counted = False
            for item in scan_segment(data, first_seq, following):
                if isinstance(item, Skipped):
                    if item.at_end and following is None:
                        summary.torn_tail_bytes = item.size
                    else:
                        summary.skipped_bytes += item.size
                        problems.append(f"{path.name}: {item.reason} at byte {item.start}; "
                                        f"{item.size} bytes skipped")
                        summary.problems = tuple(problems)
                    continue
                rec = item.record
                if rec.seq > summary.confirmed_seq:
                    if not counted:
                        summary.segments += 1
                        counted = True
                    summary.records += 1
                    summary.bytes += item.end - item.start
                    if summary.first_seq is None:
                        summary.first_seq = rec.seq
                        summary.oldest_accepted_at = rec.accepted_at
                    summary.last_seq = rec.seq
                    yield rec


def summarize(directory: Path, key: QueueKey) -> QueueSummary:
    scan = Scan(directory, key)
    for _ in scan.records():
        pass
    return scan.summary
