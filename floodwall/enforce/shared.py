"""What every gate of one process shares (the flow controller, the counters, the spool port), and
what the I/O layer asks of a connection's gate (``ConnectionGate``)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.memory import MemoryBudget
from floodwall.enforce.commands import Outbox, ToClient, ToServer
from floodwall.enforce.counters import GateCounters
from floodwall.enforce.ports import SpoolPort


@dataclass
class Enforcement:
    """The process-wide parts of enforcement, handed to each connection's gate.

    ``spool`` is None without ``--spool-dir``: ``overflow: spool`` then acts as ``hold``.
    ``memory``: the process' memory budget (the I/O layer pauses connections by it; the
    gates keep spool captures under it, ``floodwall.enforce.capture``).
    """

    controller: FlowController
    counters: GateCounters = field(default_factory=GateCounters)
    spool: SpoolPort | None = None
    memory: MemoryBudget | None = None

    @property
    def spooling(self) -> bool:
        """Whether ``overflow: spool`` can spool (a spool exists), else it holds."""
        return self.spool is not None


class GateContext:
    """What the parts of one connection's gate share: the process' enforcement, the
    connection's id, vhost and hold budget, and the outbox (``floodwall.enforce.commands``):
    what the gate made since ``take_output`` last emptied it, in order.

    The gate and each part it owns (holding, refusals, runs, shadow, ...) keep a reference to
    the one context; ``outbox`` is one list for the connection's life (``take_output`` empties
    it in place), so a part may keep it too."""

    __slots__ = (
        "conn_id",
        "controller",
        "counters",
        "hold_budget",
        "outbox",
        "shared",
        "spool",
        "vhost",
    )

    def __init__(self, shared: Enforcement, conn_id: int, hold_budget: int) -> None:
        self.controller = shared.controller
        self.counters = shared.counters
        self.spool = shared.spool
        self.shared = shared  # (its memory budget is set after the gates exist)
        self.conn_id = conn_id
        self.hold_budget = hold_budget
        self.vhost = "/"
        self.outbox: Outbox = []

    def take_output(self) -> Outbox:
        """What the gate made since the last call, in order; the outbox is empty after."""
        out = self.outbox.copy()
        self.outbox.clear()
        return out

    def to_server(self, data: bytes) -> None:
        self.outbox.append(ToServer(data))

    def to_client(self, data: bytes) -> None:
        self.outbox.append(ToClient(data))


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

    def channel_admitted(self, channel: int, now: float) -> None: ...

    def expire(self, now: float) -> int: ...

    def spool_durable(self, durable: dict[QueueKey, int]) -> None: ...

    def close(self) -> None: ...
