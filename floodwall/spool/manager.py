"""All queues' spools under one directory, and the limits that bound them.

``SPOOL_DIR/<vhost>/<queue>/`` holds one queue's segments (``names``: every vhost and queue
name its own directory, never outside the root). Limits are checked before each append:
the policy's per-queue ``spool.max_bytes``, a total across queues, and a minimum of free
disk; past any of them ``append`` raises ``SpoolFull`` and the caller falls back to holding.
So does a message larger than the broker's ``max_message_size`` (``max_message_bytes``): the
broker would refuse it at replay, after the client was acked; held, it goes to the broker
when the queue is released and the client hears the broker's own refusal.
So does ``accepting = False`` (the proxy is draining, or has not recovered its spool yet).

One process at a time: the running proxy (and ``floodwall spool replay|purge``) holds
``SPOOL_DIR/.lock`` (``lock()``); ``floodwall spool ls|show`` only read.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from floodwall.spool.log import DEFAULT_SEGMENT_BYTES, QueueSpool, RecoveryReport, SpoolError
from floodwall.spool.names import (
    QueueKey,
    UnreadableEntry,
    existing_queue_directory,
    make_queue_directory,
    queue_directories,
)
from floodwall.spool.records import SpoolRecord

__all__ = ["QueueKey", "SpoolError", "SpoolFull", "SpoolLocked", "SpoolManager"]

DEFAULT_TOTAL_MAX = 10 * 1024**3
DEFAULT_MIN_FREE = 512 * 1024**2
#: RabbitMQ 4's ``max_message_size`` (3.x: 128 MiB): a larger message is not spooled, since
#: the broker would refuse it at replay, after the client had its ack.
DEFAULT_MAX_MESSAGE = 16 * 1024**2


class SpoolFull(SpoolError):
    """A limit says no: the record was not written."""


class SpoolLocked(SpoolError):
    """Another process (a running proxy) has the spool directory."""


LOCK_FILE = ".lock"


@dataclass(frozen=True)
class SpoolLimits:
    total_max_bytes: int = DEFAULT_TOTAL_MAX
    min_free_bytes: int = DEFAULT_MIN_FREE
    max_message_bytes: int = DEFAULT_MAX_MESSAGE  # the broker's max_message_size


class SpoolManager:
    """Open spools by queue; append within limits; sync them all."""

    def __init__(self, root: Path, limits: SpoolLimits = SpoolLimits(),
                 segment_bytes: int = DEFAULT_SEGMENT_BYTES) -> None:
        self.root = Path(root)
        self.limits = limits
        self.segment_bytes = segment_bytes
        self.spools: dict[QueueKey, QueueSpool] = {}
        self._free_checked_at_bytes = 0
        self._free_bytes = 0
        self.accepting = True  # False: append raises SpoolFull("draining")
        self.full: Counter[str] = Counter()  # appends refused, by reason
        self.write_errors = 0  # appends and syncs that failed (disk full, I/O error)
        self.sync_errors: dict[QueueKey, str] = {}  # queues whose last sync failed
        self._lock_fd: int | None = None
        self.unreadable: list[UnreadableEntry] = []  # what the last ``recover`` skipped
        self.root.mkdir(parents=True, exist_ok=True)

    def lock(self) -> None:
        """Take ``SPOOL_DIR/.lock`` (flock); SpoolLocked if a live process holds it."""
        if self._lock_fd is not None:
            return
        fd = os.open(self.root / LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o640)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "?"
            os.close(fd)
            raise SpoolLocked(errno.EBUSY, f"spool {self.root} is in use by another "
                                           f"process (pid {holder})") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._lock_fd = fd

    def directory(self, key: QueueKey) -> Path:
        """Where ``key``'s spool is (or would be); ``SpoolPathError`` (an OSError) if that
        is anywhere but two levels under the root."""
        return existing_queue_directory(self.root, key)

    def recover(self) -> dict[QueueKey, RecoveryReport]:
        """Open every spool found on disk (after a restart or a crash); what cannot be
        opened is skipped and listed in ``unreadable`` (the rest is recovered all the same)."""
        reports: dict[QueueKey, RecoveryReport] = {}
        skipped = self.unreadable = []
        for found in queue_directories(self.root):
            if isinstance(found, UnreadableEntry):
                skipped.append(found)
                continue
            key, path = found
            if key in self.spools:
                skipped.append(UnreadableEntry(path, f"a second directory for queue {key[1]!r}"
                                                     f" of vhost {key[0]!r} (the first: "
                                                     f"{self.spools[key].directory})"))
                continue
            try:
                spool = self.spools[key] = QueueSpool(path, self.segment_bytes)
            except OSError as exc:
                skipped.append(UnreadableEntry(path, f"cannot be opened: "
                                                     f"{exc.strerror or exc}"))
                continue
            reports[key] = spool.report
        return reports

    def spool(self, key: QueueKey) -> QueueSpool:
        """``key``'s spool, opened (its directory made) at the first call."""
        spool = self.spools.get(key)
        if spool is None:
            directory = make_queue_directory(self.root, key)
            spool = self.spools[key] = QueueSpool(directory, self.segment_bytes)
        return spool

    def has_backlog(self, key: QueueKey) -> bool:
        spool = self.spools.get(key)
        return spool is not None and not spool.empty

    def backlogged(self) -> Iterator[QueueKey]:
        return (k for k, s in self.spools.items() if not s.empty)

    @property
    def total_bytes(self) -> int:
        return sum(s.pending_bytes for s in self.spools.values())

    def append(self, key: QueueKey, record: SpoolRecord, max_bytes: int) -> int:
        """Write ``record`` to ``key``'s spool within the limits; returns its seq.

        Raises SpoolFull (a limit, or not ``accepting``) or SpoolError (the disk); never
        anything else, and a failed write leaves the segment whole.
        """
        if len(record.body) > self.limits.max_message_bytes:
            self.full["message_size"] += 1
            raise SpoolFull(errno.EFBIG, f"a message of {len(record.body)} bytes is larger than "
                                         f"the broker's max_message_size "
                                         f"({self.limits.max_message_bytes} bytes)")
        size = record.size
        spool = self.spools.get(key)
        try:
            refused = self.refusal(key, size, max_bytes)
            if refused is not None:
                self.full[refused[0]] += 1
                raise SpoolFull(28, refused[1])
            if spool is None:
                spool = self.spool(key)
            seq = spool.append(record)
        except SpoolFull:
            raise
        except SpoolError:
            self.write_errors += 1
            self._free_bytes = 0  # ask the filesystem again next time
            raise
        except OSError as exc:  # opening the queue's directory (mkdir, recovery read)
            self.write_errors += 1
            raise SpoolError(exc.errno or errno.EIO, f"spool of {key[1]!r}: "
                             f"{exc.strerror or exc}") from None
        return seq

    def refusal(self, key: QueueKey, size: int, max_bytes: int) -> tuple[str, str] | None:
        """Why ``append`` would refuse a record of ``size`` bytes for ``key`` now, as
        (reason, message), or None. The reasons: ``draining``, ``queue_limit``,
        ``total_limit``, ``min_free``."""
        if not self.accepting:
            return "draining", "draining"
        spool = self.spools.get(key)
        pending = spool.pending_bytes if spool is not None else 0
        if pending + size > max_bytes:
            return "queue_limit", (f"spool of {key[1]!r} is at its limit ({max_bytes} bytes): "
                                   f"no room for {size} bytes, {pending} spooled")
        total = self.total_bytes
        if total + size > self.limits.total_max_bytes:
            return "total_limit", (f"spool total is at its limit "
                                   f"({self.limits.total_max_bytes} bytes): no room for {size} "
                                   f"bytes, {total} spooled")
        if self._free_space(total) - size < self.limits.min_free_bytes:
            return "min_free", (f"less than {self.limits.min_free_bytes} bytes free on "
                                f"{self.root} after {size} more bytes")
        return None

    def _free_space(self, total: int) -> int:
        # statvfs is cheap but not free: ask again after every 1 MiB written.
        if abs(total - self._free_checked_at_bytes) >= 1 << 20 or not self._free_bytes:
            self._free_bytes = shutil.disk_usage(self.root).free
            self._free_checked_at_bytes = total
        return self._free_bytes - (total - self._free_checked_at_bytes)

    def unsynced(self) -> list[QueueKey]:
        """Queues with records appended but not yet durable."""
        return [k for k, s in list(self.spools.items()) if s.durable_seq < s.next_seq - 1]

    def sync(self, fsync: bool | Callable[[QueueKey], bool] = True) -> dict[QueueKey, int]:
        """fsync every spool with unsynced records; returns each queue's durable seq.

        ``fsync`` False (or a function saying False for a queue: ``fsync: never``) moves
        the durable seq without an fsync. A queue whose fsync failed is left out of the
        answer (its records stay unacked) and named in ``sync_errors`` until a sync of it
        succeeds; this never raises.
        """
        durable: dict[QueueKey, int] = {}
        for k, s in list(self.spools.items()):
            if s.durable_seq >= s.next_seq - 1:
                continue
            try:
                durable[k] = s.sync(fsync(k) if callable(fsync) else fsync)
                self.sync_errors.pop(k, None)
            except SpoolError as exc:
                self.write_errors += 1
                self.sync_errors[k] = str(exc)
        return durable

    def purge(self, key: QueueKey) -> int:
        """Delete a queue's spool; returns the records dropped."""
        spool = self.spools.pop(key, None)
        dropped = spool.pending_records if spool is not None else 0
        if spool is not None:
            spool.close()
        directory = spool.directory if spool is not None else self.directory(key)
        shutil.rmtree(directory, ignore_errors=True)
        return dropped

    def close(self) -> None:
        for s in self.spools.values():
            s.close()
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # releases the flock
            self._lock_fd = None

