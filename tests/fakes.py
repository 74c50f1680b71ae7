"""Shared fakes for the pure layers' tests: a clock value, routers, the spool port, and what the
I/O layer does around the gates (``Board``: the switchboard without sockets).

A gate test builds a ``FlowController``, a ``Board`` over it and a core with its gate; feeds
bytes and ``now``; and after anything that can release a channel (a depth sample, a spool
drained, an alarm cleared, a lookup answered) calls ``board.settle()``, as io/ does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.events import ChannelAdmitted, ChannelFreed
from floodwall.enforce.counters import GateCounters
from floodwall.enforce.ports import SpoolRefused
from floodwall.enforce.shared import ConnectionGate, Enforcement
from floodwall.io.spool import DiskSpoolPort
from floodwall.spool.manager import SpoolManager
from floodwall.spool.records import SpoolRecord


class Clock:
    """A clock the test moves by hand (``t``); calling it reads it."""

    def __init__(self, t: float = 1000.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


class DefaultExchange:
    """Routes like the default exchange: the routing key names the queue."""

    generation = 0

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset({routing_key}) if exchange == "" else frozenset()

    def knows_exchange(self, vhost: str, name: str) -> bool:
        return True


class NoRoutes:
    """A routing model that knows every exchange and routes nothing."""

    generation = 0

    def route(self, vhost: str, exchange: str, routing_key: str,
              headers: dict[str, object] | None = None) -> frozenset[str]:
        return frozenset()

    def knows_exchange(self, vhost: str, name: str) -> bool:
        return True


@dataclass
class FakeSpool:
    """The spool port in memory: records by queue, a limit per append, ``accepting``."""

    accepting: bool = True
    records: dict[QueueKey, list[SpoolRecord]] = field(default_factory=dict)
    refuse: str | None = None  # set: every append is refused with this reason

    def has_backlog(self, key: QueueKey) -> bool:
        return bool(self.records.get(key))

    def room(self, key: QueueKey, size: int, max_bytes: int) -> str | None:
        if self.refuse is not None:
            return self.refuse
        if not self.accepting:
            return "draining"
        if sum(r.size for r in self.records.get(key, [])) + size > max_bytes:
            return f"spool of {key[1]!r} has no room for {size} bytes ({max_bytes} bytes)"
        return None

    def append(self, key: QueueKey, record: SpoolRecord, max_bytes: int) -> int:
        if self.refuse is not None:
            raise SpoolRefused(self.refuse)
        if not self.accepting:
            raise SpoolRefused("draining")
        queue = self.records.setdefault(key, [])
        if sum(r.size for r in queue) + record.size > max_bytes:
            raise SpoolRefused(f"spool of {key[1]!r} is at its limit ({max_bytes} bytes)")
        queue.append(dataclasses.replace(record, seq=len(queue) + 1))
        return len(queue)


def DiskSpool(manager: SpoolManager,
              controller: FlowController | None = None) -> DiskSpoolPort:
    """The spool port over a real ``SpoolManager``, as ``floodwall.io.spool`` makes it (without
    the group commit): with a controller, an append marks the queue backlogged, as the
    service does."""
    def appended(key: QueueKey) -> None:
        if controller is not None:
            controller.set_backlog(key, True)

    return DiskSpoolPort(manager, appended)


class Core(Protocol):
    def collect(self) -> None: ...


class Board:
    """What io/ does around the gates (``floodwall.io.switchboard``), for unit tests: carries
    the controller's freed channels to the gates and keeps every event it was handed."""

    def __init__(self, controller: FlowController, clock: Clock,
                 spool: FakeSpool | DiskSpoolPort | None = None) -> None:
        self.controller = controller
        self.clock = clock
        self.enforcement = Enforcement(controller, GateCounters(), spool)
        self.counters = self.enforcement.counters
        self.events: list[object] = []
        self.admitted: list[ChannelAdmitted] = []  # the admission ticks carried out
        # Times the I/O layer was handed output made outside a read (a release; an expiry
        # or a spool acknowledgement that made frames): each is one flush of the relay.
        self.flushes = 0
        self._conns: dict[int, tuple[Core, ConnectionGate]] = {}

    def attach(self, conn_id: int, core: Core, gate: ConnectionGate) -> None:
        self._conns[conn_id] = (core, gate)

    def settle(self) -> list[ChannelFreed]:
        """Carry out what the controller handed back; returns the freed channels."""
        freed: list[ChannelFreed] = []
        while self.controller.outbox:
            for item in self.controller.take_output():
                if isinstance(item, ChannelFreed):
                    freed.append(item)
                    found = self._conns.get(item.conn)
                    if found is not None:
                        core, gate = found
                        gate.channel_released(item.channel, self.clock())
                        core.collect()
                        self.flushes += 1
                elif isinstance(item, ChannelAdmitted):
                    self.admitted.append(item)
                    found = self._conns.get(item.conn)
                    if found is not None:
                        core, gate = found
                        gate.channel_admitted(item.channel, self.clock())
                        core.collect()
                        self.flushes += 1
                else:
                    self.events.append(item)
        return freed

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        for core, gate in self._conns.values():
            gate.spool_durable(durable)
            if gate.outbox:
                self.flushes += 1
            core.collect()

    def expire(self, now: float) -> int:
        expired = 0
        for core, gate in self._conns.values():
            n = gate.expire(now)
            if n:
                self.flushes += 1
            expired += n
            core.collect()
        return expired


def freed(outputs: Iterable[object]) -> list[tuple[int, int]]:
    """The (conn, channel) refs among a controller's outputs."""
    return [(o.conn, o.channel) for o in outputs if isinstance(o, ChannelFreed)]


class _Hub:
    """One controller's outbox, taken as io/ would: freed channels to their ``Owner``."""

    _hubs: dict[int, _Hub] = {}

    def __init__(self, controller: FlowController) -> None:
        self.controller = controller
        self.owners: dict[int, Owner] = {}
        self.events: list[object] = []

    @classmethod
    def of(cls, controller: FlowController) -> _Hub:
        hub = cls._hubs.get(id(controller))
        if hub is None or hub.controller is not controller:
            hub = cls._hubs[id(controller)] = cls(controller)
        return hub

    def take(self) -> None:
        for item in self.controller.take_output():
            if isinstance(item, ChannelFreed):
                owner = self.owners.get(item.conn)
                if owner is not None:
                    owner.freed.append(item.channel)
            else:
                self.events.append(item)


class Owner:
    """A connection as the controller's tests see it: ``released`` is the channels the
    controller freed for it (taken from its outbox when read, as io/ dispatches them)."""

    def __init__(self, conn_id: int = 1) -> None:
        self.conn_id = conn_id
        self.freed: list[int] = []
        self._hub: _Hub | None = None

    def watch(self, controller: FlowController) -> None:
        """From now on, channels ``controller`` frees for this connection are its own."""
        self._hub = _Hub.of(controller)
        self._hub.owners[self.conn_id] = self

    @property
    def released(self) -> list[int]:
        if self._hub is not None:
            self._hub.take()
        return self.freed
