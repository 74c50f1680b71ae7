"""Which telemetry files a run reads: the date/sidecar layout, file names, and time ranges.

The proxy names each file ``telemetry-<sidecar>-<UTC YYYYmmddTHHMMSS>-<n>.ndjson`` after the
moment it opened it (floodwall/ops/telemetry.py ``file_name``). A fleet's files are kept in a layout
partitioned by date and sidecar (docs/pipeline.md, "Incremental runs")::

    ROOT/date=2026-11-21/sidecar=orders-api-7d9f-x2/telemetry-orders-api-...-000042.ndjson

With ``--since``/``--until`` a run lists only the date partitions that can hold records of
the range and, in them, reads only the files whose records can fall in it. Pure Python
except ``list_files`` (the Hadoop file system API, so ``s3a://`` works as a local path does).

Which file holds what: a file's records were written while it was the sidecar's current
file, so they lie between its opening time (less ``LAG``: a batch built just before the
file opened is written into it) and the opening of the sidecar's next file. Without a next
file (the newest, or the sidecar stopped) a file is assumed to span at most ``MAX_SPAN``
(the proxy rotates hourly by default: ``--telemetry-file-age``); in any case at least
``MIN_SPAN``, which covers two processes writing under one sidecar name at once.
"""

from __future__ import annotations

import calendar
import datetime as dt
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Records can be older than their file's name by the writer's queue: 64 batches of one
#: interval each (docs/telemetry.md), 64 s at the default 1 s; 10 minutes covers 9 s intervals.
LAG = 600.0
#: The longest a file without a successor is assumed to cover.
MAX_SPAN = 86_400.0
#: The least any file is assumed to cover (the proxy's default rotation age).
MIN_SPAN = 3_600.0

NAME = re.compile(r"^telemetry-(?P<sidecar>.+)-(?P<stamp>\d{8}T\d{6})-(?P<seq>\d+)\.ndjson(\..+)?$")
DATE_DIR = "date="
SIDECAR_DIR = "sidecar="


class TimeRangeError(ValueError):
    """A --since/--until value that is not a UTC date or date and time."""


@dataclass(frozen=True)
class FileName:
    """What a telemetry file's name says."""

    sidecar: str  # as it appears in the name (unsafe characters already replaced)
    opened_at: float  # seconds since the epoch, UTC
    seq: int


def parse_name(name: str) -> FileName | None:
    """The parts of a proxy-written file name; None for any other name."""
    m = NAME.match(name.rsplit("/", 1)[-1])
    if m is None:
        return None
    opened = calendar.timegm(time.strptime(m["stamp"], "%Y%m%dT%H%M%S"))
    return FileName(m["sidecar"], float(opened), int(m["seq"]))


def parse_time(text: str) -> float:
    """``2026-11-21``, ``2026-11-21T06:00``, ``2026-11-21T06:00:30`` (UTC; a trailing ``Z`` or
    ``+00:00`` is accepted): seconds since the epoch."""
    value = text.strip()
    if value.endswith("Z"):
        value = value[:-1]
    try:
        parsed = dt.datetime.fromisoformat(value)
    except ValueError:
        raise TimeRangeError(f"{text!r} is not a UTC date or date and time "
                             "(2026-11-21 or 2026-11-21T06:00)") from None
    if parsed.tzinfo is not None:
        if parsed.utcoffset() != dt.timedelta(0):
            raise TimeRangeError(f"{text!r}: give the time in UTC")
        parsed = parsed.replace(tzinfo=None)
    return calendar.timegm(parsed.timetuple()) + parsed.microsecond / 1e6


def format_time(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts))


@dataclass(frozen=True)
class TimeRange:
    """Records with ``since <= ts < until``; either end may be open (None)."""

    since: float | None = None
    until: float | None = None

    def __post_init__(self) -> None:
        if self.since is not None and self.until is not None and self.until <= self.since:
            raise TimeRangeError(f"--until {format_time(self.until)} is not after --since "
                                 f"{format_time(self.since)}")

    @property
    def bounded(self) -> bool:
        return self.since is not None or self.until is not None

    def describe(self) -> str:
        a = format_time(self.since) if self.since is not None else "the start"
        b = format_time(self.until) if self.until is not None else "the end"
        return f"{a} to {b}"

    def dates(self) -> list[str] | None:
        """The date partitions that can hold files with records in the range: from the day
        before ``since`` (a file opened then may reach past midnight) to the day of ``until``
        (a file opened just before it may hold records from ``LAG`` earlier). None when the
        range is open at either end (every partition)."""
        if self.since is None or self.until is None:
            return None
        first = dt.datetime.fromtimestamp(self.since - MAX_SPAN, dt.UTC).date()
        last = dt.datetime.fromtimestamp(self.until + LAG, dt.UTC).date()
        out = []
        day = first
        while day <= last:
            out.append(day.isoformat())
            day += dt.timedelta(days=1)
        return out


def select(paths: Iterable[str], rng: TimeRange) -> list[str]:
    """The files (of ``paths``) that can hold records in ``rng``, sorted.

    A file whose name is not the proxy's is always kept: nothing says what it holds. Files
    are grouped by the sidecar in their name; each covers ``[opened - LAG, end)`` where
    ``end`` is the next file's opening (at least ``MIN_SPAN`` later), or ``MAX_SPAN`` after
    its own opening for the sidecar's newest file.
    """
    keep: list[str] = []
    by_sidecar: dict[str, list[tuple[FileName, str]]] = {}
    for path in paths:
        name = parse_name(path)
        if name is None:
            keep.append(path)
        else:
            by_sidecar.setdefault(name.sidecar, []).append((name, path))
    for files in by_sidecar.values():
        files.sort(key=lambda f: (f[0].opened_at, f[0].seq, f[1]))
        for i, (name, path) in enumerate(files):
            start = name.opened_at - LAG
            if i + 1 < len(files):
                end = max(files[i + 1][0].opened_at, name.opened_at + MIN_SPAN)
            else:
                end = name.opened_at + MAX_SPAN
            if rng.until is not None and start >= rng.until:
                continue
            if rng.since is not None and end <= rng.since:
                continue
            keep.append(path)
    return sorted(keep)


def partition_dir(sidecar: str, opened_at: float) -> str:
    """``date=YYYY-MM-DD/sidecar=NAME``: where a file opened at ``opened_at`` belongs."""
    day = time.strftime("%Y-%m-%d", time.gmtime(opened_at))
    return f"{DATE_DIR}{day}/{SIDECAR_DIR}{sidecar}"


# -- listing (the Hadoop file system API, through the Spark JVM) --------------------------
def _is_telemetry(name: str) -> bool:
    return ".ndjson" in name and not name.startswith((".", "_"))


def list_files(spark: Any, roots: Sequence[str], dates: Sequence[str] | None) -> list[str]:
    """Telemetry files under ``roots``: a root that is a file is itself; a directory with
    ``date=`` partitions is listed only in ``dates`` (every one when None); any other
    directory is listed recursively. Hadoop paths (``file:/``, ``s3a://...``)."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    found: list[str] = []

    def walk(fs: Any, path: Any) -> None:
        for st in fs.listStatus(path):
            p = st.getPath()
            name = p.getName()
            if st.isDirectory():
                if not name.startswith((".", "_")):
                    walk(fs, p)
            elif _is_telemetry(name):
                found.append(p.toString())

    for root in roots:
        path = jvm.org.apache.hadoop.fs.Path(root)
        fs = path.getFileSystem(conf)
        if not fs.exists(path):
            raise FileNotFoundError(f"no such path: {root}")
        st = fs.getFileStatus(path)
        if not st.isDirectory():
            found.append(fs.makeQualified(path).toString())
            continue
        children = list(fs.listStatus(path))
        partitioned = [c for c in children
                       if c.isDirectory() and c.getPath().getName().startswith(DATE_DIR)]
        if partitioned and dates is not None:
            wanted = {DATE_DIR + d for d in dates}
            for c in partitioned:
                if c.getPath().getName() in wanted:
                    walk(fs, c.getPath())
            for c in children:  # files and other directories beside the partitions
                if c.isDirectory() and not c.getPath().getName().startswith(DATE_DIR):
                    if not c.getPath().getName().startswith((".", "_")):
                        walk(fs, c.getPath())
                elif not c.isDirectory() and _is_telemetry(c.getPath().getName()):
                    found.append(c.getPath().toString())
        else:
            walk(fs, path)
    return sorted(set(found))
