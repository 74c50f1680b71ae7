"""Telemetry on disk: a timer that snapshots the FlowController, a thread that writes NDJSON.

Every ``interval`` the event loop builds one ``sample`` record per policed queue and one
``sidecar`` record (``floodwall.ops.telemetry``), adds the events the switchboard showed it
since the last tick (trips, releases, holds, signals, refusals, spool and replay: it observes
``Switchboard.report``) and hands the batch to a writer thread through a
bounded queue: the loop never touches the disk, and never waits for it. A full queue (a
disk slower than the records come) drops the batch; the ``sidecar`` record's
``dropped_records`` and the records' ``seq`` gaps say so. The thread encodes the records,
appends them to the current file, rotates it by size and age, and deletes the oldest
files when the directory holds more than its total.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING

from floodwall.control.controller import FlowController, QueueKey
from floodwall.ops.fleet_view import FleetFigures
from floodwall.ops.link_figures import LinkFigures
from floodwall.ops.logs import event
from floodwall.ops.telemetry import (
    FILE_PREFIX,
    FILE_SUFFIX,
    Record,
    RotationPolicy,
    Sampler,
    event_fields,
    file_name,
    sidecar_identity,
)

if TYPE_CHECKING:
    from floodwall.io.switchboard import Switchboard

log = logging.getLogger("floodwall.telemetry")

#: Most events kept between two ticks; past it they are dropped (and counted).
MAX_PENDING_EVENTS = 10_000
#: Most batches waiting for the writer thread.
MAX_PENDING_BATCHES = 64


@dataclass(frozen=True)
class TelemetrySettings:
    directory: Path
    interval: float = 1.0
    rotation: RotationPolicy = field(default_factory=RotationPolicy)
    sidecar: str = field(default_factory=sidecar_identity)


class TelemetryWriter:
    """Appends batches of records to rotated NDJSON files, in its own thread."""

    def __init__(self, directory: Path, sidecar: str, rotation: RotationPolicy,
                 max_pending: int = MAX_PENDING_BATCHES,
                 wall: Callable[[], float] = time.time) -> None:
        self.directory = directory
        self.sidecar = sidecar
        self.rotation = rotation
        self.wall = wall
        self._queue: queue.Queue[list[Record] | None] = queue.Queue(maxsize=max_pending)
        self._thread = threading.Thread(target=self._run, name="floodwall-telemetry",
                                        daemon=True)
        self._file: IO[bytes] | None = None
        self._name: str | None = None
        self._size = 0
        self._opened_at = 0.0
        self._seq = 0
        self._failing = False
        # Read by other threads for tests and logs (plain ints: no lock needed to read).
        self.records_written = 0
        self.files_deleted = 0
        self.write_errors = 0

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def submit(self, records: list[Record]) -> bool:
        """Queue a batch without waiting; False if the queue is full (the batch is dropped)."""
        try:
            self._queue.put_nowait(records)
        except queue.Full:
            return False
        return True

    def close(self, timeout: float = 10.0) -> None:
        """Write what is queued, close the file and end the thread (blocks: call off-loop)."""
        if not self._thread.is_alive():
            return
        with contextlib.suppress(queue.Full):
            self._queue.put(None, timeout=timeout)
        self._thread.join(timeout)

    # -- the thread ---------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                break
            try:
                self.write(batch)
            except OSError as exc:
                self.write_errors += 1
                self._close_file()
                if not self._failing:
                    event(log, "telemetry_write_failed", logging.ERROR,
                          directory=str(self.directory), reason=str(exc),
                          action="dropping records until writes succeed again")
                self._failing = True
            else:
                if self._failing:
                    event(log, "telemetry_write_recovered", directory=str(self.directory))
                self._failing = False
        self._close_file()

    def write(self, batch: list[Record]) -> None:
        """Append one batch (the thread's job; tests call it directly)."""
        data = "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in batch).encode()
        now = self.wall()
        if self._file is not None and self.rotation.should_rotate(
                self._size, self._opened_at, now, len(data)):
            self._close_file()
        if self._file is None:
            self._open(now)
        assert self._file is not None
        self._file.write(data)
        self._file.flush()
        self._size += len(data)
        self.records_written += len(batch)

    def _open(self, now: float) -> None:
        self._seq += 1
        self._name = file_name(self.sidecar, now, self._seq)
        path = self.directory / self._name
        self._file = open(path, "ab")  # kept open across batches
        self._size = path.stat().st_size
        self._opened_at = now
        self._enforce_total()

    def _close_file(self) -> None:
        f, self._file = self._file, None
        if f is not None:
            with contextlib.suppress(OSError):
                f.close()

    def _enforce_total(self) -> None:
        closed = [(p.name, p.stat().st_size)
                  for p in self.directory.glob(f"{FILE_PREFIX}-*{FILE_SUFFIX}*")
                  if p.name != self._name and p.is_file()]
        for name in self.rotation.to_delete(closed):
            with contextlib.suppress(FileNotFoundError):
                (self.directory / name).unlink()
                self.files_deleted += 1


class Telemetry:
    """The asyncio side: a timer, the controller's observer, and the writer thread."""

    def __init__(self, settings: TelemetrySettings, board: Switchboard,
                 depth_known: Callable[[], Mapping[QueueKey, bool]] | None = None,
                 wall: Callable[[], float] = time.time,
                 spooled: Callable[[], Mapping[QueueKey, int]] | None = None,
                 sampling: Callable[[], Mapping[QueueKey, float]] | None = None,
                 fleet: Callable[[], FleetFigures | None] | None = None,
                 links: Callable[[], Mapping[QueueKey, LinkFigures]] | None = None) -> None:
        self.settings = settings
        self.sampling = sampling  # each queue's depth sampling interval in force
        self.fleet = fleet
        self.links = links  # the 1.0 sender links feeding each policed queue
        self.board = board
        self.controller: FlowController = board.controller
        self.depth_known = depth_known
        self.spooled = spooled
        self.wall = wall
        self.sampler = Sampler(settings.sidecar, settings.interval)
        self.writer = TelemetryWriter(settings.directory, settings.sidecar, settings.rotation,
                                      wall=wall)
        self._events: list[Record] = []
        self._task: asyncio.Task[None] | None = None
        self._observer_failed = False
        self._dropping = False

    async def start(self) -> None:
        await asyncio.to_thread(self.writer.start)  # mkdir, thread start
        self.board.observe(self._on_event)
        self._task = asyncio.get_running_loop().create_task(self._loop(), name="telemetry")
        r = self.settings.rotation
        event(log, "telemetry_started", directory=str(self.settings.directory),
              sidecar=self.settings.sidecar, interval=self.settings.interval,
              file_bytes=r.max_file_bytes, file_age=r.max_file_age, total_bytes=r.max_total_bytes)

    async def stop(self) -> None:
        """One last tick (what happened since the previous one), then close the files."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self.tick()
        self.board.unobserve(self._on_event)
        await asyncio.to_thread(self.writer.close)
        event(log, "telemetry_stopped", records=self.writer.records_written,
              dropped=self.sampler.dropped, files_deleted=self.writer.files_deleted)

    async def _loop(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.interval
        next_at = loop.time() + interval
        while True:
            await asyncio.sleep(max(next_at - loop.time(), 0.0))
            self.tick()
            next_at += interval
            if next_at < loop.time():
                next_at = loop.time() + interval  # fell behind: no burst to catch up

    def tick(self) -> None:
        """Snapshot the controller; hand it, with the pending events, to the writer."""
        records, self._events = self._events, []
        known = self.depth_known() if self.depth_known is not None else None
        spooled = self.spooled() if self.spooled is not None else None
        sampling = self.sampling() if self.sampling is not None else None
        fleet = self.fleet() if self.fleet is not None else None
        links = self.links() if self.links is not None else None
        records.extend(self.sampler.snapshot(self.controller, self.board.enforcement.counters,
                                             self.wall(), self.board.clock(), known, spooled,
                                             sampling, fleet, links))
        if self.writer.submit(records):
            self._dropping = False
            return
        self.sampler.dropped += len(records)
        if not self._dropping:
            event(log, "telemetry_dropped", logging.WARNING, records=len(records),
                  reason="the writer is behind (slow disk?)")
        self._dropping = True

    def _on_event(self, item: object) -> None:
        """The switchboard's observer: on the hot path, so cheap, and never raises."""
        name = type(item).__name__
        try:
            found = event_fields(item)
            if found is None:
                return
            name = found[0]
            if len(self._events) >= MAX_PENDING_EVENTS:
                self.sampler.dropped += 1
                return
            self._events.extend(self.sampler.event(name, found[1], self.wall()))
        except Exception as exc:  # a telemetry bug must never break a publish
            if not self._observer_failed:
                event(log, "telemetry_event_failed", logging.ERROR, event_name=name,
                      reason=repr(exc))
            self._observer_failed = True
