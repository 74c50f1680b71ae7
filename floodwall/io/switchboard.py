"""Carries out what the flow controller hands back, and takes the gates' events where they go.

The pure ``FlowController`` does not call into connections: a release appends ``ChannelFreed``
to its outbox, a trip or the broker alarm a typed event (``floodwall.control.events``).
Whatever in io/ fed it (a depth sample, an alarm, a lookup's answer, a spool drained, or a
relayed publish that tripped a queue) calls ``settle()`` afterwards: each freed channel goes to
its connection (``RelayedConnection.channel_released``: the gate lets its held frames go, the
relay writes them), each event to the log (``floodwall.ops.logs.log_event``) and to every
observer (the telemetry), and due lookups to the topology feed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from typing import Protocol

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.events import ChannelAdmitted, ChannelFreed
from floodwall.control.memory import MemoryBudget
from floodwall.enforce.shared import Enforcement
from floodwall.ops.logs import event, log_event

log = logging.getLogger("floodwall.spool")  # spool_ack_failed
memory_log = logging.getLogger("floodwall.memory")

Observer = Callable[[object], None]


class Released(Protocol):
    """A relayed connection, as the switchboard sees it."""

    conn_id: int

    def channel_released(self, channel: int, now: float) -> None: ...

    def channel_admitted(self, channel: int, now: float) -> None: ...

    def spool_durable(self, durable: dict[QueueKey, int]) -> None: ...

    def memory_resumed(self) -> None: ...


class LookupStarter(Protocol):
    """The topology feed, as the switchboard sees it."""

    def dispatch_lookups(self) -> None: ...


class Switchboard:
    """One per process (owned by the ``FlowSupervisor``): the connections with a gate, the
    observers of events, and where due lookups go."""

    def __init__(self, enforcement: Enforcement, clock: Callable[[], float]) -> None:
        self.enforcement = enforcement
        self.controller: FlowController = enforcement.controller
        self.clock = clock
        self._connections: dict[int, Released] = {}
        self._observers: list[Observer] = []
        self._lookups: LookupStarter | None = None
        self._settling = False
        self.memory: MemoryBudget | None = None  # the process-wide budget of held bytes
        # Bytes of incomplete frames the cores hold (each relay adds its own changes): they
        # count against the memory budget with the held bytes. A connection is not paused
        # for them (its frame could never complete): its frame limit bounds them.
        self.partial_bytes = 0
        self._engaged_at = 0.0

    # -- wiring ---------------------------------------------------------------------------
    def attach(self, conn: Released) -> None:
        self._connections[conn.conn_id] = conn

    def detach(self, conn: Released) -> None:
        if self._connections.get(conn.conn_id) is conn:
            del self._connections[conn.conn_id]

    def connections(self) -> Iterator[Released]:
        return iter(list(self._connections.values()))

    def observe(self, observer: Observer) -> None:
        self._observers.append(observer)

    def unobserve(self, observer: Observer) -> None:
        if observer in self._observers:
            self._observers.remove(observer)

    def start_lookups_with(self, starter: LookupStarter) -> None:
        self._lookups = starter

    # -- carrying out -----------------------------------------------------------------------
    @property
    def pending(self) -> bool:
        """Whether the controller has output to carry out or lookups are due."""
        return bool(self.controller.outbox) or self.controller.lookups.due

    def settle(self) -> None:
        """Carry out everything the controller handed back, until it hands back nothing
        (a release can trip a queue again: that is carried out in the same call)."""
        if self._settling:
            return  # the outer call's loop takes what this one would
        self._settling = True
        try:
            controller = self.controller
            while controller.outbox:
                now = self.clock()
                for item in controller.take_output():
                    if isinstance(item, ChannelFreed):
                        conn = self._connections.get(item.conn)
                        if conn is not None:
                            conn.channel_released(item.channel, now)
                    elif isinstance(item, ChannelAdmitted):
                        conn = self._connections.get(item.conn)
                        if conn is not None:
                            conn.channel_admitted(item.channel, now)
                    else:
                        self.report(item)
        finally:
            self._settling = False
        if self._lookups is not None and self.controller.lookups.due:
            self._lookups.dispatch_lookups()

    # -- the memory budget ----------------------------------------------------------------
    @property
    def memory_bytes(self) -> int:
        """What the memory budget counts: held publishes (spool captures included) and
        incomplete frames."""
        return self.enforcement.counters.held_bytes + self.partial_bytes

    def memory_reached(self, conn: int, held: int) -> bool:
        """Whether connection ``conn``, holding ``held`` bytes, must stop being read now:
        the budget is engaged and it holds publishes (it would add to them). Called after
        each of its reads; the first pause of an engagement is logged."""
        budget = self.memory
        if budget is None:
            return False
        if not budget.reached(self.memory_bytes):
            if budget.paused:
                self.relieve_memory()
            return False
        if held <= 0:
            return False
        if budget.pause(conn, held) and len(budget.paused) == 1:
            self._engaged_at = self.clock()
            event(memory_log, "memory_budget_reached", logging.WARNING,
                  held_bytes=self.enforcement.counters.held_bytes,
                  partial_frame_bytes=self.partial_bytes, budget=budget.limit,
                  action="stopped reading the connections that hold publishes until held "
                         f"bytes are back at {budget.resume}")
        return True

    def relieve_memory(self) -> None:
        """Held bytes went down (a release, a refusal, a connection closed): once the
        budget disengages, every connection it paused is read again."""
        budget = self.memory
        if budget is None or not budget.paused or budget.reached(self.memory_bytes):
            return
        resumed = budget.take_resumed()
        event(memory_log, "memory_budget_relieved", held_bytes=self.enforcement.counters
              .held_bytes, budget=budget.limit, resumed_connections=len(resumed),
              seconds=round(self.clock() - self._engaged_at, 3))
        for conn_id in resumed:
            conn = self._connections.get(conn_id)
            if conn is not None:
                conn.memory_resumed()

    def report(self, item: object) -> None:
        """One typed event: logged, and shown to every observer (never raises for one)."""
        log_event(item)
        for observer in self._observers:
            observer(item)

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: every connection acks or settles what is now durable."""
        for conn in self.connections():
            try:
                conn.spool_durable(durable)
            except Exception as exc:  # one connection's bug must not stop the acks
                event(log, "spool_ack_failed", logging.ERROR, conn=conn.conn_id,
                      reason=repr(exc))
