"""The flow supervisor: feeds the FlowController with depth, topology, alarms and policies.

Everything the pure ``FlowController`` (floodwall/control/controller.py) needs from the
outside world comes through here, on timers, independent of how many clients are connected:

- policies: loaded at startup (a bad file refuses to start), reloaded on SIGHUP and when the
  file changes (a bad reload keeps the old set);
- topology: ``floodwall.io.topology.TopologyFeed`` keeps the routing model in step with the
  broker (its topology events, lookups for publishes that name something unknown, a full
  sync every ``topology_interval``) and tells the supervisor each change
  (``topology_applied``): new queues a policy matches are policed at once, their first
  depth figure asked for at once (a lookup: publishes to them wait for it); gone ones are
  forgotten. What the relay sees (declares, binds, deletes confirmed by the broker) goes
  the same way (``topology_changed``);
- depth: per vhost a policy names (or with policed queues), one own AMQP connection that
  passive-declares each policed queue every ``depth_interval`` (a real-time ready count)
  and answers lookups, and one management API sample of each policed queue every
  ``management_interval`` (bytes, unacked);
- broker alarms: the management API's node alarms every ``alarm_interval`` and the
  ``connection.blocked`` notices of the own connections;
- the repeating "publishes held" log line.

Management samples are dated back by the broker's statistics interval (``management_stats_age``):
the API stamps nothing, and a figure up to 5 s old must not overrule a real-time ready count
taken meanwhile (the estimate would flap between the two).

Depth is *unknown* for a queue once the management API was asked about it and has given no
figures for ``unknown_after`` seconds (default 3 management intervals plus its timeout): the
passive declare alone counts ready messages but neither their bytes nor the unacked ones.
While unknown, ready counts are not fed (they would fight the policy's ``on_unknown_depth``)
and ``FlowController.depth_unknown`` is called instead.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.fleet import is_fleet_queue
from floodwall.control.policy import PolicySet, PolicyStore, ReloadResult
from floodwall.control.routing import ChangeKind, Topology, TopologyChange
from floodwall.control.routing.sync import ChangeSource
from floodwall.enforce.shared import Enforcement
from floodwall.io.amqp_client import AmqpClient
from floodwall.io.broker_alarms import BrokerAlarms
from floodwall.io.depth_feed import DepthFeed
from floodwall.io.fleet import FleetService, FleetSettings
from floodwall.io.flow_settings import FlowSettings
from floodwall.io.management import ManagementApi, ManagementError
from floodwall.io.management_sampling import ManagementSampling, error_text
from floodwall.io.own_connections import OwnConnections
from floodwall.io.prometheus import PrometheusEndpoint
from floodwall.io.switchboard import Switchboard
from floodwall.io.tasks import spawn
from floodwall.io.topology import TOPOLOGY_PATHS, TopologyFeed
from floodwall.ops.flow_metrics import (
    FlowCollector,
    FlowStats,
    ManagementStatus,
    flow_state,
    key_label,
    topology_state,
)
from floodwall.ops.logs import event
from floodwall.ops.supervision import (
    SupervisorView,
    readiness,
)

__all__ = ["TOPOLOGY_PATHS", "FlowSettings", "FlowSupervisor", "describe_policy_changes"]

log = logging.getLogger("floodwall.flow")

T = TypeVar("T")
#: Most queue names one log line lists.
LOG_LIST_LIMIT = 20
_QUEUE_CHANGES = (ChangeKind.DECLARE_QUEUE, ChangeKind.DELETE_QUEUE, ChangeKind.BIND_QUEUE)


def describe_policy_changes(old: PolicySet, new: PolicySet) -> dict[str, str]:
    """What a reload changed, by policy name and defaults vhost, for one log line."""
    old_by = {p.name: p for p in old.policies}
    new_by = {p.name: p for p in new.policies}
    changes = {
        "added": sorted(new_by.keys() - old_by.keys()),
        "removed": sorted(old_by.keys() - new_by.keys()),
        "changed": sorted(n for n in old_by.keys() & new_by.keys() if old_by[n] != new_by[n]),
        "defaults_changed": sorted(
            v for v in old.defaults.keys() | new.defaults.keys()
            if old.defaults.get(v) != new.defaults.get(v)),
    }
    if [p.name for p in old.policies if p.name in new_by] != [
            p.name for p in new.policies if p.name in old_by]:
        changes["reordered"] = ["yes"]
    return {k: ",".join(v) for k, v in changes.items() if v}


def _short_list(keys: list[QueueKey]) -> str:
    labels = [key_label(k) for k in sorted(keys)]
    more = len(labels) - LOG_LIST_LIMIT
    return ",".join(labels[:LOG_LIST_LIMIT]) + (f",... ({more} more)" if more > 0 else "")


class FlowSupervisor:
    """Owns the FlowController, the Topology and every timer that feeds them.

    Its parts: the ``TopologyFeed`` (``feed``), the depth figures and their unknown-depth
    rules (``depth``: ``DepthFeed``), the management API's depth rounds (``sampling``:
    ``ManagementSampling``), the own connection of each vhost and its passive declares
    (``own_connections``: ``OwnConnections``), the broker's alarms (``alarms``:
    ``BrokerAlarms``) and the fleet (``fleet``); each is handed what it needs, and what it
    needs of the supervisor is a small protocol (``Policing``, ``SamplingHost``,
    ``OwnConnectionsHost``, ``FleetHost``). The supervisor adds policing (which queues, from
    the topology's changes), policies and the admin views.

    Construct (loads the policies: ``PolicyError`` on a bad file), ``await start()``,
    ``await stop()``. The relay reaches ``controller`` and ``topology``.
    """

    def __init__(self, settings: FlowSettings, topology: Topology | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.store = PolicyStore.from_file(settings.policies, settings.shadow)
        self.topology = topology if topology is not None else Topology()
        self.controller = FlowController(self.topology, self.store.current)
        # The gates' shared parts (the app adds the spool) and where what the controller
        # hands back is carried out.
        self.enforcement = Enforcement(self.controller)
        self.board = Switchboard(self.enforcement, clock)
        self.controller.admission.hot_interval = settings.hot_interval
        self.stats = FlowStats(self.store.current, self.store.generation,
                               ManagementStatus(",".join(settings.management_urls)))
        self.api = ManagementApi(settings.management_urls, settings.management_credentials,
                                 settings.management_timeout, settings.management_tls,
                                 settings.management_connections,
                                 observe=self.stats.observe_management)
        self.prometheus = None if not settings.prometheus_urls else PrometheusEndpoint(
            settings.prometheus_urls, settings.management_timeout, settings.management_tls,
            observe=self.stats.observe_management)
        self.collector = FlowCollector(self.controller, self.enforcement.counters, self.stats,
                                       clock)
        self.feed = TopologyFeed(settings, self.topology, self.board, self.api,
                                 self.stats, self, clock)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.running = False  # between start and stop
        self.depth = DepthFeed(settings, clock, self.controller, self.board, self.stats,
                               self.topology)
        self.alarms = BrokerAlarms(self.controller, self.board, clock)
        self.sampling = ManagementSampling(settings, clock, self.controller, self.api,
                                           self.prometheus, self.stats, self.depth, self.feed,
                                           self, self._spawn)
        self.own_connections = OwnConnections(settings, clock, self.controller, self.board,
                                              self.stats, self.depth, self.alarms, self.feed,
                                              self, self._spawn)
        self.board.observe(self.own_connections.on_flow_event)
        # The fleet through the broker (--fleet NAME; None: off, nothing of it runs).
        self.fleet = (FleetService(FleetSettings(
            settings.fleet, sample_stale_after=(2 * settings.management_interval
                                                + settings.management_timeout),
            alarm_stale_after=2 * settings.alarm_interval + settings.management_timeout,
            topology_stale_after=2 * settings.topology_interval + settings.management_timeout,
            sync_grace=settings.sync_grace, sync_spacing=settings.topology_interval),
            self, clock)
                      if settings.fleet else None)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start every timer; returns at once (readiness says when the first round is in)."""
        self.running = True
        event(log, "flow_started", policies=self.store.path, entries=len(self.store.current),
              management=",".join(self.settings.management_urls),
              upstream=self.settings.upstreams.label,
              depth_interval=self.settings.depth_interval,
              management_interval=self.settings.management_interval,
              topology_interval=self.settings.topology_interval,
              topology_events="on" if self.settings.topology_events else "off",
              mode="shadow" if self.store.shadow else "enforce")
        self.feed.start()
        self.sampling.start()
        self._spawn(self._alarm_loop(), "flow-alarms")
        self._spawn(self._policy_watch_loop(), "flow-policy-watch")
        self._spawn(self._holding_log_loop(), "flow-holding-log")
        self.own_connections.reconcile()  # queues policed before start (the topology adds more)
        if self.fleet is not None:
            self.fleet.start()

    async def stop(self) -> None:
        self.running = False
        if self.fleet is not None:
            await self.fleet.stop()
        await self.feed.stop()
        tasks = [*self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.own_connections.close()
        await self.api.close()
        if self.prometheus is not None:
            await self.prometheus.close()

    # -- what the relay and the topology feed tell us ----------------------------------
    def topology_changed(self, change: TopologyChange) -> None:
        """A declare, delete or bind a client made through the proxy, confirmed by the
        broker."""
        self.feed.apply(change, ChangeSource.RELAYED)

    def topology_applied(self, change: TopologyChange, source: ChangeSource) -> None:
        """A change is in the routing model (``TopologyFeed.apply``): police what a policy
        matches from this moment, forget what is gone."""
        c, kind = change, change.kind
        if kind in _QUEUE_CHANGES and is_fleet_queue(c.name):
            if kind is ChangeKind.DELETE_QUEUE and self.fleet is not None:
                self.fleet.member_queue_deleted(c.name)  # a member's connection died
            return  # a fleet member's own queue is never policed
        if kind is ChangeKind.DECLARE_QUEUE:
            key = (c.vhost, c.name)
            self._queues_appeared([key], source)
            q = self.controller.queues.get(key)
            if c.message_count is not None and q is not None and q.depth.estimate() is None:
                # A declare-ok's count is a real-time ready count: the queue's first figure.
                self.feed_ready_count(key, self.clock(), c.message_count, None)
        elif kind is ChangeKind.DELETE_QUEUE:
            self._gone((c.vhost, c.name), source)
        elif kind is ChangeKind.BIND_QUEUE:
            self._queues_appeared([(c.vhost, c.name)], source)
        elif kind is ChangeKind.DECLARE_VHOST:
            self.own_connections.kick(c.name)
        elif kind is ChangeKind.DELETE_VHOST:
            for key in [k for k in self.controller.queues if k[0] == c.name]:
                self._gone(key, source)
        self.board.settle()

    # -- the fleet ---------------------------------------------------------------------
    def new_client(self, vhost: str) -> AmqpClient:
        """An own connection to ``vhost`` for the fleet (not the probes': it publishes,
        and the broker stops reading a connection that publishes during an alarm)."""
        s = self.settings
        return AmqpClient(s.upstreams, s.amqp_credentials.username,
                          s.amqp_credentials.password, vhost, tls=s.upstream_tls)

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample this sidecar asked for: fed, and offered to the fleet."""
        self.depth.feed_management(key, sample)
        if self.fleet is not None and key in self.controller.queues:
            self.fleet.own_sample(key, sample)

    def feed_shared_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample the fleet's poller of ``key`` asked for: as good as one of
        this sidecar's own (while they come, the depth is known)."""
        if key in self.controller.queues:
            self.depth.had_figures.add(key)  # (a later "no statistics": a restart, not a new queue)
        self.depth.feed_management(key, sample)

    def feed_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                         rtt: float | None) -> None:
        """A passive declare's (or declare-ok's) ready count of ``key``, if policed."""
        self.depth.feed_ready_count(key, requested_at, ready, rtt)

    async def client_for(self, vhost: str) -> AmqpClient:
        """The vhost's own connection, once it is up (the caller bounds the wait)."""
        return await self.own_connections.client_for(vhost)

    def shared_elsewhere(self, key: QueueKey) -> bool:
        """Whether another sidecar of the fleet samples ``key`` for this one."""
        return self.fleet is not None and self.fleet.covered(key)

    # -- broker alarms -----------------------------------------------------------------
    async def _alarm_loop(self) -> None:
        while True:
            if not self.alarms_shared_elsewhere():
                await self.poll_alarms()
            await asyncio.sleep(self.settings.alarm_interval)

    async def poll_alarms(self) -> None:
        """Ask the management API for node alarms; an error keeps the last answer."""
        try:
            alarms = await self.sampling.ask(self.api.alarms)
        except ManagementError:
            return
        self.node_alarms(alarms.memory, alarms.disk)

    def node_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        """Node alarms this sidecar read on the API: applied, and offered to the fleet."""
        self.alarms.node_alarms(memory, disk)
        if self.fleet is not None:
            self.fleet.own_alarms(memory, disk)

    def feed_shared_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        """The node alarms the fleet's alarm poller read: as good as this sidecar's own."""
        self.alarms.node_alarms(memory, disk)

    def alarms_shared_elsewhere(self) -> bool:
        """Whether another sidecar of the fleet polls the node alarms for this one."""
        return self.fleet is not None and self.fleet.polls.alarms_covered()

    def topology_covered(self) -> bool:
        """Whether the fleet's topology pollers' syncs stand for this sidecar's periodic
        one (``floodwall.io.fleet_polls``)."""
        return self.fleet is not None and self.fleet.polls.topology_covered()

    def topology_sync_age(self) -> float | None:
        at = self.stats.last_sync_at
        return None if at is None else max(0.0, self.clock() - at)

    def request_topology_sync(self, why: str) -> None:
        self.feed.request_sync(why)

    def _gone(self, key: QueueKey, source: ChangeSource) -> None:
        if key in self.controller.queues:
            event(log, "policed_queue_gone", vhost=key[0], queue=key[1], seen_by=source.value)
        self._forget(key)

    def queue_declared(self, vhost: str, queue: str, message_count: int | None = None) -> None:
        """A queue the proxy knows exists (its spool has a backlog for it): into the model,
        policed if a policy says (``message_count``: its ready count, when known)."""
        self.topology.declare_queue(vhost, queue)
        self.topology_applied(TopologyChange(ChangeKind.DECLARE_QUEUE, vhost, queue,
                                             message_count=message_count),
                              ChangeSource.RELAYED)

    def queue_deleted(self, vhost: str, queue: str) -> None:
        """A queue is gone."""
        self.topology.delete_queue(vhost, queue)
        self._forget((vhost, queue))

    def _queues_appeared(self, keys: list[QueueKey],
                         source: ChangeSource = ChangeSource.SYNC) -> None:
        now = self.clock()
        new = [k for k in keys if k not in self.controller.queues and not is_fleet_queue(k[1])
               and self.controller.queue_seen(k, now) is not None]
        self.board.settle()
        if new:
            event(log, "queues_policed", queues=_short_list(new), count=len(new),
                  learned_by=source.value)
            self._after_queue_change()

    async def queues_listed(self, listed: set[QueueKey]) -> None:
        """A sync listed these queues: police new ones; a policed queue the listing lacks
        is forgotten once the broker confirms it is gone."""
        self._queues_appeared(sorted(listed), ChangeSource.SYNC)
        for key in sorted(set(self.controller.queues) - listed):
            if await self.own_connections.confirm_gone(key):
                self._gone(key, ChangeSource.SYNC)
        self.own_connections.reconcile()
        self.sampling.wake_until_warm()

    async def ask(self, call: Callable[[], Awaitable[T]]) -> T:
        """One management API call, counted (for the topology feed)."""
        return await self.sampling.ask(call)

    def _forget(self, key: QueueKey) -> None:
        if key in self.controller.queues:
            self.controller.queue_deleted(key, self.clock())
            self.board.settle()
        self.depth.forget(key)
        self.stats.sampling_interval.pop(key, None)
        self._after_queue_change()

    def _after_queue_change(self) -> None:
        if not self.running:
            return
        self.own_connections.reconcile()
        # A new queue's first figure is its lookup (a passive declare, at once); its bytes
        # come with the next management round. Until warm, a round at once.
        self.sampling.wake_until_warm()

    def known_queues(self) -> set[QueueKey]:
        """Every queue the topology knows, plus those policed now."""
        known = {(v, q) for v in self.topology.vhosts() for q in self.topology.queues(v)
                 if not is_fleet_queue(q)}
        return known | set(self.controller.queues)

    # -- policies ----------------------------------------------------------------------
    def reload(self, trigger: str = "SIGHUP") -> ReloadResult:
        """Reload the policy file; a bad one keeps the policies in effect."""
        old = self.store.current
        result = self.store.reload()
        if not result.ok:
            self.stats.reloads["error"] += 1
            self.stats.last_reload_error = result.reason
            event(log, "policy_reload_failed", logging.ERROR, trigger=trigger,
                  reason=result.reason, action="keeping the policies in effect",
                  generation=self.store.generation)
            return result
        before = set(self.controller.queues)
        try:
            self.controller.set_policies(result.policies, self.known_queues(), self.clock())
        except Exception as exc:  # never expected: put the old set back and say so
            self.store.revert(old)
            self.controller.set_policies(old, self.known_queues(), self.clock())
            self.board.settle()
            failed = ReloadResult(ok=False, policies=old,
                                  reason=f"applying them failed: {type(exc).__name__}: {exc}")
            self.stats.reloads["error"] += 1
            self.stats.last_reload_error = failed.reason
            event(log, "policy_reload_failed", logging.ERROR, trigger=trigger,
                  reason=failed.reason, action="keeping the policies in effect",
                  generation=self.store.generation)
            return failed
        self.stats.reloads["ok"] += 1
        self.stats.last_reload_error = None
        self.board.settle()
        after = set(self.controller.queues)
        self.stats.policies = result.policies
        self.stats.policies_generation = self.store.generation
        changes = describe_policy_changes(old, result.policies) if result.changed else {}
        for key in before - after:
            self._forget(key)
        if not changes:
            changes = {"changed": "nothing"}
        event(log, "policies_reloaded", logging.INFO, trigger=trigger, source=self.store.path,
              generation=self.store.generation, **changes,
              now_policed=_short_list(list(after - before)) or "-",
              no_longer_policed=_short_list(list(before - after)) or "-",
              policed_queues=len(after))
        self._after_queue_change()
        return result

    async def _policy_watch_loop(self) -> None:
        """Reload when the file changes. Nothing a reload raises ends this loop: it is
        logged, the policies in effect stay, and the next change is read again."""
        while True:
            await asyncio.sleep(self.settings.policy_poll_interval)
            try:
                if self.store.changed_since_last_load():
                    self.reload("file changed")
            except Exception as exc:
                self.stats.reloads["error"] += 1
                self.stats.last_reload_error = f"{type(exc).__name__}: {exc}"
                event(log, "policy_reload_failed", logging.ERROR, trigger="file changed",
                      reason=self.stats.last_reload_error,
                      action="keeping the policies in effect; the next change is read again",
                      generation=self.store.generation)

    # -- topology ----------------------------------------------------------------------
    async def sync_topology(self) -> bool:
        """One full sync of the routing model now (``TopologyFeed.sync``)."""
        ok = await self.feed.sync()
        self.sampling.wake_until_warm()
        return ok

    # -- the repeating "publishes held" lines ------------------------------------------
    async def _holding_log_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.holding_log_interval)
            self.log_holding()

    def log_holding(self) -> None:
        """One line per blocked channel, repeated until it is released."""
        now = self.clock()
        for b in sorted(self.controller.blocked_channels(),
                        key=lambda b: (b.conn_id, b.channel)):
            event(log, "publishes_held", conn=b.conn_id, channel=b.channel,
                  queues=",".join(key_label(k) for k in sorted(b.queues)),
                  seconds=round(now - b.since, 1))

    # -- tasks ---------------------------------------------------------------------------
    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        """Start a task the supervisor keeps until it ends (and cancels on stop); a failure
        is logged as ``flow_task_failed``."""
        return spawn(self._tasks, coro, name, log, "flow_task_failed", error_text)

    # -- admin views -------------------------------------------------------------------
    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready once the startup round is in (``ops.supervision.readiness``)."""
        now = self.clock()
        return readiness(SupervisorView(
            warm=self.sampling.warm,
            policies={"source": self.store.path, "generation": self.store.generation,
                      "entries": len(self.store.current)},
            management=self.stats.management.as_dict(now),
            policed=self.controller.queues, asked=self.depth.asked,
            unknown=[k for k in self.controller.queues if self.depth.depth_unknown_now(k, now)],
            topology_error=self.feed.error,
            topology=(None if self.stats.events_status == "up"
                      else topology_state(self.controller, self.stats, now)),
            own_connections=self.stats.own_connections,
            alarm=self.controller.alarm_reason))

    def state(self) -> dict[str, object]:
        doc = flow_state(self.controller, self.enforcement.counters, self.stats, self.clock())
        if self.fleet is not None:
            doc["fleet"] = self.fleet.state()
        return doc

