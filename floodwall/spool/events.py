"""What the spool service reports besides log lines, as values: a queue's spool started filling,
a replay session ended. The I/O layer (``floodwall.io.spool``) makes them; the telemetry
records them (``floodwall.ops.telemetry.event_fields``)."""

from __future__ import annotations

from dataclasses import dataclass

QueueKey = tuple[str, str]  # (vhost, queue)


@dataclass(frozen=True, slots=True)
class SpoolFilling:
    """A queue's spool took its first record since it was last empty."""

    key: QueueKey


@dataclass(frozen=True, slots=True)
class ReplayEnded:
    """One replay session of a queue's spool ended (``reason``: "empty", "queue tripped", ...)."""

    key: QueueKey
    reason: str
    replayed: int
    replayed_bytes: int
    seconds: float
    records_left: int
    bytes_left: int
