"""What every gate of one process shares (the flow controller, the counters, the spool port), and
what the I/O layer asks of a connection's gate (``ConnectionGate``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from floodwall.control.controller import FlowController, QueueKey
from floodwall.enforce.counters import GateCounters
from floodwall.enforce.ports import SpoolPort


@dataclass
class Enforcement:
    """The process-wide parts of enforcement, handed to each connection's gate.

    ``spool`` is None without ``--spool-dir``: ``overflow: spool`` then acts as ``hold``.
    """

    controller: FlowController
    counters: GateCounters = field(default_factory=GateCounters)
    spool: SpoolPort | None = None

    @property
    def spooling(self) -> bool:
        """Whether ``overflow: spool`` can spool (a spool exists), else it holds."""
        return self.spool is not None


class ConnectionGate(Protocol):
    """A connection's gate, as the I/O layer drives it (``PublishFlow``, ``CreditFlow``): what
    it holds, and the calls made outside a read. Their output goes to the gate's outbox."""

    @property
    def outbox(self) -> Sequence[object]: ...

    @property
    def holding(self) -> bool: ...

    @property
    def held_bytes(self) -> int: ...

    @property
    def hold_budget(self) -> int: ...

    @property
    def over_budget(self) -> bool: ...

    def channel_released(self, channel: int, now: float) -> None: ...

    def expire(self, now: float) -> int: ...

    def spool_durable(self, durable: dict[QueueKey, int]) -> None: ...

    def close(self) -> None: ...
