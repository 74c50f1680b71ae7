"""The process-wide memory budget for held publishes: when it is reached, and who is paused.

Held publishes of every connection together (``GateCounters.held_bytes``, which counts the
publishes of clients that have gone too) are kept under ``limit``. Once the total reaches
it the budget is *engaged*: each connection that holds publishes is paused (its socket is not
read) at its next read, so it adds at most that one read; connections that hold nothing
(consumers, producers to free queues) keep being read. The budget disengages when the total
is back at or below ``resume`` (7/8 of the limit by default, so a release does not flap
it), and every paused connection is resumed, smallest holder first.

What it counts (``Switchboard.memory_bytes``): held publishes, messages being assembled for
the spool (kept under ``resume`` together: ``floodwall.enforce.capture``) and the cores'
incomplete frames (each at most the frame limit ``F``; a connection is never paused for one,
its frame could not complete).

Bound: counted bytes <= limit + (connections holding publishes) x (one read + ``F``) +
(connections with an incomplete frame) x 2 ``F``; a read is at most 256 KiB (asyncio's and
uvloop's read size), ``F`` the lower of the broker's and the client's ``frame_max`` (128 KiB
with RabbitMQ's defaults; 4096 bytes before both tunes, 512 for AMQP 1.0 before the
broker's open).

Pure: the relay (``floodwall.io.relay``) and the switchboard feed it totals and carry out
the pauses it hands back.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

MIB: Final = 1024 * 1024
#: The budget when the process has no memory limit of its own (no cgroup limit).
DEFAULT_MEMORY_BUDGET: Final = 96 * MIB
#: The share of a cgroup memory limit that held publishes may take; the rest is the
#: interpreter (about 50 MiB), the relay's buffers and the allocator's slack.
CGROUP_SHARE: Final = 3
#: Never less than this, whatever the limit.
MIN_MEMORY_BUDGET: Final = 8 * MIB
#: cgroup v2's and v1's limit files (the container's own cgroup, as mounted in it).
CGROUP_FILES: Final = (Path("/sys/fs/cgroup/memory.max"),
                       Path("/sys/fs/cgroup/memory/memory.limit_in_bytes"))
#: cgroup v1 says "no limit" with a number near 2**63 (rounded down to a page).
NO_LIMIT_ABOVE: Final = 1 << 60


def cgroup_limit(text: str) -> int | None:
    """A cgroup limit file's value, or None when it says there is no limit."""
    value = text.strip()
    if not value or value == "max":
        return None
    try:
        limit = int(value)
    except ValueError:
        return None
    return limit if 0 < limit < NO_LIMIT_ABOVE else None


def default_budget(limit: int | None) -> int:
    """``--memory-budget``'s default: a third of the container's memory limit, or
    ``DEFAULT_MEMORY_BUDGET`` without one."""
    if limit is None:
        return DEFAULT_MEMORY_BUDGET
    return max(MIN_MEMORY_BUDGET, limit // CGROUP_SHARE)


@dataclass
class MemoryBudget:
    """Held bytes of all connections against ``limit``; which connections it paused."""

    limit: int
    resume: int = -1  # -1: 7/8 of the limit
    engaged: bool = False
    paused: dict[int, int] = field(default_factory=dict)  # conn id -> held bytes at its pause
    pauses_total: int = 0  # connections paused, since the start
    engagements_total: int = 0  # times the budget was reached

    def __post_init__(self) -> None:
        if self.resume < 0:
            self.resume = self.limit - self.limit // 8

    def reached(self, total: int) -> bool:
        """Whether publishing connections must be paused at ``total`` held bytes; engages
        at the limit, disengages at ``resume`` (the caller then resumes ``paused``)."""
        if self.engaged:
            if total <= self.resume:
                self.engaged = False
        elif total >= self.limit:
            self.engaged = True
            self.engagements_total += 1
        return self.engaged

    def pause(self, conn: int, held: int) -> bool:
        """``conn`` holds ``held`` bytes while the budget is engaged: paused (True when it
        was not paused already)."""
        new = conn not in self.paused
        self.paused[conn] = held
        if new:
            self.pauses_total += 1
        return new

    def take_resumed(self) -> list[int]:
        """Once disengaged: every paused connection, smallest holder first (emptied)."""
        if self.engaged or not self.paused:
            return []
        order = sorted(self.paused, key=lambda c: (self.paused[c], c))
        self.paused.clear()
        return order

    def forget(self, conn: int) -> None:
        """The connection closed."""
        self.paused.pop(conn, None)

    def largest(self, n: int = 5) -> list[tuple[int, int]]:
        """The paused connections holding the most, (conn id, held bytes at the pause)."""
        return sorted(self.paused.items(), key=lambda kv: (-kv[1], kv[0]))[:n]
