"""The routing model's live feed: the broker's topology events, lookups on the spot, full syncs.

Three sources keep ``floodwall.control.routing.Topology`` and the set of policed queues in
step with the
broker, whoever changes it (clients of this proxy or not, the management UI, a definitions
import, the broker deleting exclusive and auto-delete queues):

- **events**: one consumer of ``amq.rabbitmq.event`` (the ``rabbitmq_event_exchange``
  plugin, vhost ``event_vhost``) on a connection of the proxy's own, an exclusive
  server-named queue bound to ``queue.*``, ``exchange.*``, ``binding.*``, ``vhost.*`` and
  ``policy.*``. Each event is applied as it arrives (``floodwall.control.routing.events``). When the
  exchange does not exist (passive declare: 404) or the login may not use it, that is said
  once in the log and shown in ``/readyz`` and ``/state``; it is asked again at each sync.
  A (re)subscription asks for a full sync, which covers what happened while it was down.
- **lookups**: the gate asks (``FlowController.lookups``) before forwarding a publish that
  names what the model does not know, and for the first depth figure of a queue just policed.
  A queue is looked up with a passive declare on the vhost's own connection (its ready count
  is the queue's first figure); an exchange through the management API (its declaration and
  its bindings, then any exchange they lead to that the model lacks), or, when that API
  cannot answer, a passive declare that can at least say "absent".
- **sync**: the management API's full listing every ``topology_interval`` (and when asked:
  events reconnected, a policy changed, an event could not be read). Changes that arrive
  while the listing is read are applied again on top of it, so a sync never undoes a newer
  change. A difference between the model and the listing is logged: at warning
  (``topology_out_of_step``) when the events were up all along, since it means a missed
  change; at info (``topology_sync_learned``) when they were not and the sync is how the
  model learns.

Every change goes through ``apply`` with its source, counted per source (metrics) and handed
to the flow supervisor, which polices new queues and forgets gone ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import TYPE_CHECKING, Any, Final, Protocol, TypeVar

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.lookups import Lookup, LookupKind, LookupResult
from floodwall.control.routing import (
    ChangeKind,
    Topology,
    TopologyChange,
    TopologyError,
    exchange_changes,
)
from floodwall.control.routing.events import (
    EVENT_BINDING_KEYS,
    EVENT_EXCHANGE,
    EventError,
    EventNote,
    read_event,
)
from floodwall.control.routing.sync import ChangeSource, SyncDifference, describe
from floodwall.io.amqp_client import AmqpClient, AmqpClientError, Delivery, QueueLocked
from floodwall.io.management import NO_STATISTICS, ManagementApi, ManagementError
from floodwall.io.switchboard import Switchboard
from floodwall.io.tasks import spawn
from floodwall.ops.flow_metrics import FlowStats
from floodwall.ops.logs import event

if TYPE_CHECKING:
    from floodwall.io.flow_settings import FlowSettings

log = logging.getLogger("floodwall.topology")

T = TypeVar("T")

# What the routing model reads (the management API's defaults omit policy/auto_delete).
TOPOLOGY_PATHS: Final = (
    "/api/exchanges?columns=name,vhost,type,durable,auto_delete,internal,arguments,policy",
    "/api/queues?columns=name,vhost,type",
    "/api/bindings",
    "/api/policies",
)
#: Most exchanges one exchange lookup follows (bindings to exchanges, alternate exchanges).
LOOKUP_EXCHANGES_MAX: Final = 16
#: Events past this many waiting in the proxy's event queue at the broker are dropped
#: (oldest first): a stalled proxy must not grow the broker it protects; the next sync
#: finds what was dropped.
EVENT_QUEUE_MAX: Final = 10_000
#: The shortest time between two syncs asked for by events (reconnects, policies).
SYNC_MIN_SPACING: Final = 1.0


class Policing(Protocol):
    """What the feed needs from the flow supervisor."""

    def topology_applied(self, change: TopologyChange, source: ChangeSource) -> None:
        """A change is in the model: police new queues, forget gone ones."""

    def queues_listed(self, listed: set[QueueKey]) -> Awaitable[None]:
        """A sync listed these queues: police new ones, confirm and forget missing ones."""

    async def client_for(self, vhost: str) -> AmqpClient:
        """The vhost's own connection, once it is up (the caller bounds the wait)."""

    def feed_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                         rtt: float | None) -> None:
        """A passive declare's ready count of a policed queue."""

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management API sample of a policed queue."""

    async def ask(self, call: Callable[[], Awaitable[T]]) -> T:
        """One counted management API call."""

    def topology_covered(self) -> bool:
        """Whether another sidecar's syncs stand for this one's periodic sync now (a
        fleet's topology poller, ``floodwall.io.fleet_polls``)."""


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FeedLookups:
    """The topology feed's lookups (``TopologyFeed`` extends it): the names a publish waits
    on, asked of the broker on the spot; and how every change enters the model (``apply``).
    """

    settings: FlowSettings
    topology: Topology
    board: Switchboard
    controller: FlowController
    api: ManagementApi
    stats: FlowStats
    policing: Policing
    clock: Callable[[], float]
    _tasks: set[asyncio.Task[Any]]
    _timers: set[asyncio.TimerHandle]
    _journal: list[TopologyChange] | None
    _differences: list[SyncDifference]
    _lookups_failing: bool
    _started: bool

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return spawn(self._tasks, coro, name, log, "topology_task_failed", _reason)

    def _later(self, delay: float, callback: Callable[[], None]) -> None:
        def fire() -> None:
            self._timers.discard(handle)
            callback()

        handle = asyncio.get_running_loop().call_later(delay, fire)
        self._timers.add(handle)

    # -- every change --------------------------------------------------------------------
    def apply(self, change: TopologyChange, source: ChangeSource) -> None:
        """One change into the model, counted by source, then policed."""
        self.topology.apply(change)
        if self._journal is not None:
            self._journal.append(change)
        for difference in self._differences:
            difference.note(change)
        self.stats.changes[source.value] += 1
        event(log, "topology_change", logging.DEBUG, source=source.value,
              kind=change.kind.value, vhost=change.vhost, item=change.name,
              exchange=change.source or None)
        self.policing.topology_applied(change, source)

    # -- lookups ---------------------------------------------------------------------------
    def dispatch_lookups(self) -> None:
        """The gate asked for lookups: start each at once (a task each), in the same
        callback that held the publish, so the question leaves before the next read."""
        if not self._started:
            return  # start() takes them
        for lookup in self.controller.lookups.take_due():
            self._spawn(self._lookup_task(lookup), f"lookup-{lookup.kind.value}")

    async def _lookup_task(self, lookup: Lookup) -> None:
        await self.lookup(lookup)

    async def lookup(self, lookup: Lookup) -> LookupResult:
        """Ask the broker about one name; tell the controller."""
        started = self.clock()
        reason = ""
        try:
            async with asyncio.timeout(self.settings.lookup_timeout):
                result = await self._ask_broker(lookup)
        except TimeoutError:
            result, reason = LookupResult.FAILED, f"no answer in {self.settings.lookup_timeout:g}s"
        except (AmqpClientError, ManagementError, TopologyError, OSError) as exc:
            result, reason = LookupResult.FAILED, _reason(exc)
        elapsed = self.clock() - started
        self.stats.lookups[(lookup.kind.value, result.value)] += 1
        self.stats.lookup_seconds.observe(elapsed)
        if result is LookupResult.FAILED:
            if not self._lookups_failing:
                event(log, "topology_lookup_failed", logging.WARNING, vhost=lookup.vhost,
                      kind=lookup.kind.value, item=lookup.name, reason=reason,
                      action="the policy's on_unknown_depth decides (block: ask again)")
            self._lookups_failing = True
        else:
            if self._lookups_failing:
                event(log, "topology_lookups_recovered", vhost=lookup.vhost,
                      kind=lookup.kind.value, item=lookup.name)
            self._lookups_failing = False
            event(log, "topology_lookup", logging.DEBUG, vhost=lookup.vhost,
                  kind=lookup.kind.value, item=lookup.name, result=result.value,
                  seconds=round(elapsed, 6))
        if self.controller.lookup_answered(lookup, result, self.clock()):
            self._later(self.settings.lookup_retry, functools.partial(self._retry, lookup))
        self.board.settle()
        return result

    def _retry(self, lookup: Lookup) -> None:
        """Ask again (a failed lookup whose policy says block)."""
        self.controller.lookups.retry(lookup)
        self.dispatch_lookups()

    async def _ask_broker(self, lookup: Lookup) -> LookupResult:
        if lookup.kind is LookupKind.QUEUE:
            return await self._lookup_queue(lookup)
        return await self._lookup_exchange(lookup)

    async def _lookup_queue(self, lookup: Lookup) -> LookupResult:
        """A passive declare: the queue's existence and its ready count, now. A queue
        exclusive to another connection refuses it: the management API answers instead."""
        vhost, name = lookup.vhost, lookup.name
        client = await self.policing.client_for(vhost)
        requested_at = self.clock()
        try:
            counts = await client.queue_counts(name, self.settings.lookup_timeout,
                                               lane="lookup")
        except QueueLocked:
            return await self._lookup_locked_queue(lookup)
        if counts is None:
            if self.topology.knows_queue(vhost, name) \
                    or (vhost, name) in self.controller.queues:
                self.apply(TopologyChange(ChangeKind.DELETE_QUEUE, vhost, name),
                           ChangeSource.LOOKUP)
            return LookupResult.ABSENT
        rtt = self.clock() - requested_at
        if not self.topology.knows_queue(vhost, name):
            self.apply(TopologyChange(ChangeKind.DECLARE_QUEUE, vhost, name),
                       ChangeSource.LOOKUP)
        key = (vhost, name)
        q = self.controller.queues.get(key)
        if counts.messages and q is not None and q.depth.management is None \
                and not q.depth.forwarded_messages_total:
            # Messages of a size nobody has seen yet: their bytes come from the management
            # API first, or the count would weigh nothing against a byte capacity.
            with contextlib.suppress(ManagementError):
                sample = await self.policing.ask(
                    functools.partial(self.api.queue_sample, vhost, name))
                if isinstance(sample, ManagementSample):
                    self.policing.feed_management(key, sample)
        self.policing.feed_ready_count(key, requested_at, counts.messages, rtt)
        return LookupResult.FOUND

    async def _lookup_locked_queue(self, lookup: Lookup) -> LookupResult:
        vhost, name = lookup.vhost, lookup.name
        sample = await self.policing.ask(functools.partial(self.api.queue_sample, vhost, name))
        if sample is None:
            return LookupResult.ABSENT
        if not self.topology.knows_queue(vhost, name):
            self.apply(TopologyChange(ChangeKind.DECLARE_QUEUE, vhost, name),
                       ChangeSource.LOOKUP)
        if sample is NO_STATISTICS:  # a queue just declared: empty, the ledger adds on
            sample = ManagementSample(time.monotonic(), 0, 0, 0, 0, 0)
        self.policing.feed_management((vhost, name), sample)
        return LookupResult.FOUND

    async def _lookup_exchange(self, lookup: Lookup) -> LookupResult:
        """The exchange and its bindings from the management API, following bindings and
        alternate exchanges to exchanges the model lacks; when the API cannot answer, a
        passive declare can still say the exchange is absent."""
        try:
            found = await self._exchange_from_management(lookup.vhost, lookup.name)
        except ManagementError:
            client = await self.policing.client_for(lookup.vhost)
            if not await client.exchange_exists(lookup.name, self.settings.lookup_timeout,
                                                lane="lookup"):
                return LookupResult.ABSENT
            raise
        return LookupResult.FOUND if found else LookupResult.ABSENT

    async def _exchange_from_management(self, vhost: str, name: str) -> bool:
        todo, seen, found = [name], set[str](), False
        while todo and len(seen) < LOOKUP_EXCHANGES_MAX:
            current = todo.pop()
            if current in seen:
                continue
            seen.add(current)
            doc = await self.policing.ask(
                functools.partial(self.api.item, "exchanges", vhost, current))
            if doc is None:
                continue
            bindings = await self.policing.ask(
                functools.partial(self.api.bindings_from, vhost, current))
            changes = exchange_changes(doc, bindings)
            if current == name:
                found = True
            for change in changes:
                self.apply(change, ChangeSource.LOOKUP)
                if change.kind is ChangeKind.BIND_EXCHANGE \
                        and not self.topology.knows_exchange(vhost, change.name):
                    todo.append(change.name)
            x = self.topology.exchange(vhost, current)
            ae = x.alternate_exchange if x is not None else None
            if ae and not self.topology.knows_exchange(vhost, ae):
                todo.append(ae)
        return found


class TopologyFeed(FeedLookups):
    """Events, lookups and syncs into one ``Topology``; owned by the ``FlowSupervisor``."""

    def __init__(self, settings: FlowSettings, topology: Topology,
                 board: Switchboard, api: ManagementApi, stats: FlowStats,
                 policing: Policing, clock: Callable[[], float]) -> None:
        self.settings = settings
        self.topology = topology
        self.board = board
        self.controller: FlowController = board.controller
        self.api = api
        self.stats = stats
        self.policing = policing
        self.clock = clock
        self.loaded = False  # a sync has succeeded once
        self.error: str | None = None  # why the last sync failed
        self._tasks: set[asyncio.Task[Any]] = set()
        self._timers: set[asyncio.TimerHandle] = set()
        self._journal: list[TopologyChange] | None = None  # changes while a sync lists
        self._differences: list[SyncDifference] = []  # sync differences in their grace
        self._last_sync_at: float | None = None
        self._events_up_since: float | None = None
        self._events_reported: str | None = None  # the last unavailability logged
        self._event_errors: set[str] = set()
        self._lookups_failing = False
        self._sync_wake = asyncio.Event()
        self._started = False
        board.start_lookups_with(self)
        self.controller.lookups.ttl = settings.lookup_ttl
        self.stats.events_status = "off" if not settings.topology_events else "starting"

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        self._started = True
        self._spawn(self._sync_loop(), "topology-sync")
        self.dispatch_lookups()  # those asked for before the start
        if self.settings.topology_events:
            self._spawn(self._events_loop(), "topology-events")
        else:
            event(log, "topology_events_off", reason="turned off (--topology-events off)",
                  action=f"the model follows lookups and a full sync every "
                         f"{self.settings.topology_interval:g}s")

    async def stop(self) -> None:
        self._started = False
        for timer in self._timers:
            timer.cancel()
        self._timers.clear()
        tasks = [*self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    @property
    def events_up(self) -> bool:
        return self._events_up_since is not None

    # -- full sync -----------------------------------------------------------------------
    def request_sync(self, why: str) -> None:
        event(log, "topology_sync_requested", logging.DEBUG, reason=why)
        self._sync_wake.set()

    async def _sync_loop(self) -> None:
        while True:
            asked = self._sync_wake.is_set()
            self._sync_wake.clear()
            if asked or not self.loaded or not self.policing.topology_covered():
                await self.sync()
            else:  # the fleet's topology poller synced for this sidecar
                self.stats.syncs["covered"] += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._sync_wake.wait(), self.settings.topology_interval)
            await asyncio.sleep(SYNC_MIN_SPACING if self._sync_wake.is_set() else 0)

    async def sync(self) -> bool:
        """Reload the model from the management API's listing; police new queues, drop gone
        ones; judge what the listing had that the model did not."""
        self._journal = []
        try:
            docs = [await self.policing.ask(functools.partial(self.api.get, path))
                    for path in TOPOLOGY_PATHS]
            before = self.topology.items() if self.loaded else None
            journal = self._journal
            self.topology.load_management(*docs)
        except (ManagementError, TopologyError) as exc:
            reason = str(exc)
            if isinstance(exc, TopologyError) and self.error != reason:
                # (a ManagementError was logged by ask, once per state change)
                event(log, "topology_load_failed", logging.ERROR, reason=reason,
                      action="routing keeps the model it has")
            self.error = reason
            self.stats.syncs["error"] += 1
            return False
        finally:
            self._journal = None
        for change in journal:  # newer than the listing: they stand
            self.topology.apply(change)
        now = self.clock()
        self.stats.syncs["ok"] += 1
        if self.error is not None:
            event(log, "topology_loaded", after_error=self.error)
        self.error = None
        if before is not None:
            after = self.topology.items()
            if after != before:
                self._judge_later(SyncDifference(after - before, before - after, now,
                                                 self._last_sync_at))
        self._last_sync_at = now
        self.stats.last_sync_at = now
        self.loaded = True
        listed = {(v, q) for v in self.topology.vhosts() for q in self.topology.queues(v)}
        await self.policing.queues_listed(listed)
        return True

    def _judge_later(self, difference: SyncDifference) -> None:
        """Judge a difference once changes in flight when the listing was read are in."""
        events_up_throughout = (self._events_up_since is not None
                                and difference.in_step_since is not None
                                and self._events_up_since <= difference.in_step_since)
        self._differences.append(difference)

        def judge() -> None:
            self._differences.remove(difference)
            self._report(difference, events_up_throughout and self.events_up)

        self._later(self.settings.sync_grace, judge)

    def _report(self, difference: SyncDifference, events_up: bool) -> None:
        missing, extra = difference.confirmed()
        if not missing and not extra:
            return
        count = len(missing) + len(extra)
        self.stats.changes[ChangeSource.SYNC.value] += count
        out_of_step = difference.out_of_step_seconds()
        fields: dict[str, Any] = {
            "missing": describe(missing) or "-", "extra": describe(extra) or "-",
            "count": count,
            "out_of_step_seconds_at_most": (round(out_of_step, 1) if out_of_step is not None
                                            else None),
            "events": self.stats.events_status,
            "action": "the model follows the listing now"}
        if events_up:
            self.stats.sync_differences += 1
            self.stats.out_of_step_seconds = out_of_step
            event(log, "topology_out_of_step", logging.WARNING, **fields,
                  reason="the broker's events did not tell the model about these changes")
        else:
            event(log, "topology_sync_learned", logging.INFO, **fields)

    # -- events ----------------------------------------------------------------------------
    async def _events_loop(self) -> None:
        s = self.settings
        backoff = s.reconnect_min
        while True:
            client = AmqpClient(s.upstreams, s.amqp_credentials.username,
                                s.amqp_credentials.password, s.event_vhost, tls=s.upstream_tls)
            try:
                try:
                    unavailable = await self._subscribe(client)
                except (AmqpClientError, OSError, TimeoutError) as exc:
                    self._events_down(_reason(exc))
                    wait = backoff
                    backoff = min(backoff * 2, s.reconnect_max)
                else:
                    if unavailable is not None:
                        self._events_unavailable(unavailable)
                        wait = s.topology_interval
                    else:
                        backoff = s.reconnect_min
                        self._events_up()
                        await client.wait_closed()
                        self._events_down(client.closed_reason or "closed")
                        wait = 0.0
            finally:  # (also when cancelled: the proxy is stopping)
                with contextlib.suppress(Exception):
                    await client.close()
            await asyncio.sleep(wait)

    async def _subscribe(self, client: AmqpClient) -> str | None:
        """Connect, declare and bind the event queue, consume. Returns why the events
        cannot be had (plugin missing, refused), or None when consuming."""
        s = self.settings
        timeout = s.connect_timeout
        try:
            await client.connect(timeout)
        except AmqpClientError as exc:  # login or vhost refused: not a network trouble
            return f"the proxy's login cannot open vhost {s.event_vhost!r}: {exc}"
        if not await client.exchange_exists(EVENT_EXCHANGE, timeout):
            return (f"exchange {EVENT_EXCHANGE!r} not found in vhost {s.event_vhost!r}: the "
                    "broker's rabbitmq_event_exchange plugin is not enabled")
        try:
            queue = await client.declare_queue(
                "", exclusive=True, arguments={"x-max-length": EVENT_QUEUE_MAX},
                timeout=timeout)
            for key in EVENT_BINDING_KEYS:
                await client.bind_queue(queue, EVENT_EXCHANGE, key, timeout)
            await client.consume(queue, self._on_event, timeout)
        except AmqpClientError as exc:
            if not client.connected:
                raise
            return (f"the proxy's login may not consume {EVENT_EXCHANGE!r} ({exc}); it needs "
                    f"configure and write permission on '^amq\\.gen-.*' and read permission "
                    f"on {EVENT_EXCHANGE!r} in vhost {s.event_vhost!r}")
        return None

    def _events_up(self) -> None:
        self._events_up_since = self.clock()
        self._events_reported = None
        self.stats.events_status = "up"
        event(log, "topology_events_up", exchange=EVENT_EXCHANGE, vhost=self.settings.event_vhost,
              action="changes by any client are applied as they happen; syncing once to "
                     "cover the time before")
        self.request_sync("events subscribed")

    def _events_down(self, reason: str) -> None:
        was_up = self._events_up_since is not None
        self._events_up_since = None
        self.stats.events_status = f"down: {reason}"
        if was_up or self._events_reported != "down":
            event(log, "topology_events_down", logging.WARNING, reason=reason,
                  action="reconnecting; meanwhile lookups and the full sync every "
                         f"{self.settings.topology_interval:g}s")
        self._events_reported = "down"

    def _events_unavailable(self, reason: str) -> None:
        self._events_up_since = None
        self.stats.events_status = f"unavailable: {reason}"
        if self._events_reported != reason:
            event(log, "topology_events_unavailable", logging.WARNING, reason=reason,
                  action=f"the model follows lookups and a full sync every "
                         f"{self.settings.topology_interval:g}s: a binding made elsewhere to "
                         f"an exchange already known is seen only at the next sync "
                         f"(enable the plugin: rabbitmq-plugins enable "
                         f"rabbitmq_event_exchange)")
        self._events_reported = reason

    def _on_event(self, delivery: Delivery) -> None:
        self.stats.events_received += 1
        headers = getattr(delivery.properties, "headers", None) or {}
        stamp = headers.get("timestamp_in_ms")
        if isinstance(stamp, int):
            self.stats.event_lag_seconds = max(0.0, time.time() - stamp / 1000)
        try:
            change = read_event(delivery.routing_key, headers)
        except EventError as exc:
            reason = str(exc)
            if reason not in self._event_errors and len(self._event_errors) < 100:
                self._event_errors.add(reason)
                event(log, "topology_event_unreadable", logging.WARNING,
                      event_name=delivery.routing_key, reason=reason,
                      action="syncing from the management API instead")
            self.request_sync("unreadable event")
            return
        if change is None:
            return
        if change is EventNote.POLICY_CHANGED:
            self.request_sync("policy changed")  # alternate exchanges may have changed
            return
        self.apply(change, ChangeSource.EVENT)

