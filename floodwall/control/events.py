"""What the flow controller hands back: queues tripped and released, the broker alarm, and the
channels (0-9-1) or links (1.0) whose every blocking queue has drained.

Values, not callbacks: the controller appends them to its outbox (``FlowController.outbox``);
the I/O layer takes them (``take_output``), hands each freed channel to its connection's
gate, and the events to the log (``floodwall.ops.logs``) and the telemetry.
"""

from __future__ import annotations

from dataclasses import dataclass

QueueKey = tuple[str, str]  # (vhost, queue)


@dataclass(frozen=True, slots=True)
class ChannelFreed:
    """Every queue ``channel`` of connection ``conn`` was blocked on has drained: its gate
    may let what it holds go (1.0: ``channel`` is the link's ``link_ref``)."""

    conn: int
    channel: int


@dataclass(frozen=True, slots=True)
class ChannelAdmitted:
    """A queue ``channel`` waits on is held but has tokens (``floodwall.control.admission``):
    its gate may let held publishes go while the controller ``admits`` them. The channel
    stays blocked (0-9-1; a 1.0 link keeps waiting for its release)."""

    conn: int
    channel: int


@dataclass(frozen=True, slots=True)
class QueueTripped:
    """A policed queue went over its limit: publishes to it are held from now."""

    key: QueueKey
    policy: str
    depth_bytes: int  # -1: unknown
    depth_messages: int
    capacity: int
    max_messages: int | None
    publishers: str  # "conn/channel,..." already blocked on it
    shadow: bool = False  # its policy is in shadow mode: nothing is held
    # A fleet member: the depth at which its share of the room ran out (None: no fleet).
    share_limit_bytes: int | None = None


@dataclass(frozen=True, slots=True)
class QueueReleased:
    """A tripped queue is at or below its resume levels again (or no longer policed)."""

    key: QueueKey
    policy: str
    depth_bytes: int
    depth_messages: int
    resume: int
    reason: str  # "depth", "no longer policed"
    blocked: str  # "conn/channel,..." blocked on it when it released
    shadow: bool = False  # its policy is in shadow mode


@dataclass(frozen=True, slots=True)
class AlarmRaised:
    """The broker raised a memory or disk alarm: every publish is held until it clears."""

    reason: str


@dataclass(frozen=True, slots=True)
class AlarmCleared:
    """The broker's alarm cleared."""


ControlEvent = QueueTripped | QueueReleased | AlarmRaised | AlarmCleared
ControlOutput = ControlEvent | ChannelFreed | ChannelAdmitted
