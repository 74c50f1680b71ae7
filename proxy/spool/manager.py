"""All queues' spools under one directory, and the limits that bound them.

``SPOOL_DIR/<vhost>/<queue>/`` holds one queue's segments (names percent-encoded so any
vhost or queue name is a safe directory name). Limits are checked before each append:
the policy's per-queue ``spool.max_bytes``, a total across queues, and a minimum of free
disk; past any of them ``append`` raises ``SpoolFull`` and the caller falls back to holding.
"""

from __future__ import annotations

import shutil
import urllib.parse
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from proxy.spool.log import DEFAULT_SEGMENT_BYTES, QueueSpool, RecoveryReport, SpoolError
from proxy.spool.records import SpoolRecord

QueueKey = tuple[str, str]

DEFAULT_TOTAL_MAX = 10 * 1024**3
DEFAULT_MIN_FREE = 512 * 1024**2


class SpoolFull(SpoolError):
    """A limit says no: the record was not written."""


def _encode(name: str) -> str:
    return urllib.parse.quote(name, safe="") or "%"  # "" (the default vhost never is) -> "%"


def _decode(name: str) -> str:
    return "" if name == "%" else urllib.parse.unquote(name)


@dataclass(frozen=True)
class SpoolLimits:
    total_max_bytes: int = DEFAULT_TOTAL_MAX
    min_free_bytes: int = DEFAULT_MIN_FREE


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
        self.root.mkdir(parents=True, exist_ok=True)

    def directory(self, key: QueueKey) -> Path:
        return self.root / _encode(key[0]) / _encode(key[1])

    def recover(self) -> dict[QueueKey, RecoveryReport]:
        """Open every spool found on disk (after a restart or a crash)."""
        reports: dict[QueueKey, RecoveryReport] = {}
        for vdir in sorted(p for p in self.root.iterdir() if p.is_dir()):
            for qdir in sorted(p for p in vdir.iterdir() if p.is_dir()):
                key = (_decode(vdir.name), _decode(qdir.name))
                reports[key] = self.spool(key).report
        return reports

    def spool(self, key: QueueKey) -> QueueSpool:
        spool = self.spools.get(key)
        if spool is None:
            spool = self.spools[key] = QueueSpool(self.directory(key), self.segment_bytes)
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
        """Write ``record`` to ``key``'s spool within the limits; returns its seq."""
        spool = self.spool(key)
        size = record.size
        if spool.pending_bytes + size > max_bytes:
            raise SpoolFull(28, f"spool of {key[1]!r} is at its limit ({max_bytes} bytes)")
        total = self.total_bytes
        if total + size > self.limits.total_max_bytes:
            raise SpoolFull(28, f"spool total is at its limit "
                                f"({self.limits.total_max_bytes} bytes)")
        if self._free_space(total) - size < self.limits.min_free_bytes:
            raise SpoolFull(28, f"less than {self.limits.min_free_bytes} bytes free on "
                                f"{self.root}")
        return spool.append(record)

    def _free_space(self, total: int) -> int:
        # statvfs is cheap but not free: ask again after every 1 MiB written.
        if abs(total - self._free_checked_at_bytes) >= 1 << 20 or not self._free_bytes:
            self._free_bytes = shutil.disk_usage(self.root).free
            self._free_checked_at_bytes = total
        return self._free_bytes - (total - self._free_checked_at_bytes)

    def sync(self) -> dict[QueueKey, int]:
        """fsync every spool with unsynced records; returns each queue's durable seq."""
        return {k: s.sync() for k, s in list(self.spools.items())
                if s.durable_seq < s.next_seq - 1}

    def purge(self, key: QueueKey) -> int:
        """Delete a queue's spool; returns the records dropped."""
        spool = self.spools.pop(key, None)
        dropped = spool.pending_records if spool is not None else 0
        if spool is not None:
            spool.close()
        shutil.rmtree(self.directory(key), ignore_errors=True)
        return dropped

    def close(self) -> None:
        for s in self.spools.values():
            s.close()

