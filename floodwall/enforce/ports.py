"""The spool as the gates see it: a narrow port, implemented by ``floodwall.io.spool`` over the
spool on disk (``floodwall.spool``) and faked by the tests (``tests/fakes.py``)."""

from __future__ import annotations

from typing import Protocol

from floodwall.spool.records import SpoolRecord

QueueKey = tuple[str, str]  # (vhost, queue)


class SpoolRefused(Exception):
    """The spool did not take a record (a limit, the disk, a failed write, draining); the
    gate falls back to holding. ``str()`` says why."""


class SpoolPort(Protocol):
    """Where ``overflow: spool`` writes."""

    @property
    def accepting(self) -> bool:
        """False while the spool takes nothing (recovering at start, draining at stop)."""

    def has_backlog(self, key: QueueKey) -> bool:
        """Whether ``key``'s spool holds records the broker has not confirmed yet."""

    def room(self, key: QueueKey, size: int, max_bytes: int) -> str | None:
        """Why a record of ``size`` bytes would not fit ``key``'s spool now (its
        ``max_bytes``, the total, the free disk, draining), or None: asked before a message
        is assembled in memory, so one that cannot be spooled is never assembled."""

    def append(self, key: QueueKey, record: SpoolRecord, max_bytes: int) -> int:
        """Write ``record`` to ``key``'s spool within ``max_bytes`` for that queue; returns
        its sequence number. The port sets the record's ``seq`` and ``accepted_at`` (the wall
        clock is the port's, not the gate's). Raises ``SpoolRefused``; the spool tells the
        gates when records are durable (``spool_durable``)."""
