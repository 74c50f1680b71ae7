"""The flow supervisor: feeds the FlowController with depth, topology, alarms and policies.

Everything the pure ``FlowController`` (proxy/gate.py) needs from the outside world comes
through here, on timers, independent of how many clients are connected:

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
import contextlib
import functools
import logging
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.policy import PolicySet, PolicyStore, ReloadResult
from floodwall.control.routing import ChangeKind, QueueType, Topology, TopologyChange
from floodwall.control.routing.sync import ChangeSource
from floodwall.io.amqp_client import AmqpClient, AmqpClientError
from floodwall.io.management import ManagementApi, ManagementError
from floodwall.io.tls import ManagementTlsContext, UpstreamTlsContext
from floodwall.io.topology import TOPOLOGY_PATHS, TopologyFeed
from floodwall.ops.config import AmqpCredentials, ManagementCredentials, ProxySettings
from floodwall.ops.flow_metrics import (
    FlowCollector,
    FlowStats,
    ManagementStatus,
    flow_state,
    key_label,
    topology_state,
)
from floodwall.ops.logs import event

__all__ = ["TOPOLOGY_PATHS", "FlowSettings", "FlowSupervisor", "describe_policy_changes"]

log = logging.getLogger("floodwall.flow")

T = TypeVar("T")
#: Most queue names one log line lists.
LOG_LIST_LIMIT = 20


@dataclass(frozen=True)
class FlowSettings:
    """What the flow supervisor needs; ``from_proxy_settings`` for ``floodwall run``."""

    policies: Path
    management_url: str
    management_credentials: ManagementCredentials
    amqp_host: str
    amqp_port: int
    amqp_credentials: AmqpCredentials
    depth_interval: float = 0.2
    management_interval: float = 5.0
    alarm_interval: float = 2.0
    topology_interval: float = 30.0
    policy_poll_interval: float = 2.0
    holding_log_interval: float = 5.0
    management_timeout: float = 5.0
    connect_timeout: float = 5.0
    probe_timeout: float = 5.0
    reconnect_min: float = 0.5
    reconnect_max: float = 30.0
    management_concurrency: int = 4
    # How old the management API's queue figures can be when it answers: RabbitMQ's
    # collect_statistics_interval (5 s by default). Samples are dated back by this much, so
    # a real-time ready count taken meanwhile is never overruled by an older figure.
    management_stats_age: float = 5.0
    unknown_after: float | None = None  # None: 3 * management_interval + management_timeout
    # The routing model's live feed (proxy/io/topology.py).
    topology_events: bool = True  # consume amq.rabbitmq.event when the broker has it
    event_vhost: str = "/"  # where the rabbitmq_event_exchange plugin declares its exchange
    lookup_timeout: float = 2.0  # longest a publish waits for a lookup before on_unknown_depth
    lookup_ttl: float = 1.0  # how long "absent" (or "failed, allowed") is remembered
    lookup_retry: float = 1.0  # a failed lookup a policy blocks on is asked again this often
    sync_grace: float = 2.0  # how long changes in flight may explain a sync's difference
    upstream_tls: UpstreamTlsContext | None = None  # amqps for the depth probes
    management_tls: ManagementTlsContext | None = None  # https to the management API

    @property
    def depth_unknown_after(self) -> float:
        if self.unknown_after is not None:
            return self.unknown_after
        return 3 * self.management_interval + self.management_timeout

    @classmethod
    def from_proxy_settings(cls, s: ProxySettings, upstream_tls: UpstreamTlsContext | None = None,
                            management_tls: ManagementTlsContext | None = None
                            ) -> FlowSettings:
        if s.policies is None:
            raise ValueError("flow control needs a policies file")
        return cls(
            policies=s.policies,
            management_url=s.effective_management_url,
            management_credentials=s.credentials,
            amqp_host=s.upstream[0],
            amqp_port=s.upstream[1],
            amqp_credentials=s.effective_amqp_credentials,
            depth_interval=s.depth_interval,
            management_interval=s.management_interval,
            alarm_interval=s.alarm_interval,
            topology_interval=s.topology_interval,
            topology_events=s.topology_events,
            policy_poll_interval=s.policy_poll_interval,
            holding_log_interval=s.holding_log_interval,
            connect_timeout=s.connect_timeout,
            upstream_tls=upstream_tls,
            management_tls=management_tls,
        )


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


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FlowSupervisor:
    """Owns the FlowController, the Topology and every timer that feeds them.

    Construct (loads the policies: ``PolicyError`` on a bad file), ``await start()``,
    ``await stop()``. The relay reaches ``controller`` and ``topology``.
    """

    def __init__(self, settings: FlowSettings, topology: Topology | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.settings = settings
        self.clock = clock
        self.store = PolicyStore.from_file(settings.policies)
        self.topology = topology if topology is not None else Topology()
        self.controller = FlowController(self.topology, clock, self.store.current)
        self.api = ManagementApi(settings.management_url, settings.management_credentials,
                                 settings.management_timeout, settings.management_tls)
        self.stats = FlowStats(self.store.current, self.store.generation,
                               ManagementStatus(settings.management_url))
        self.collector = FlowCollector(self.controller, self.stats)
        self.feed = TopologyFeed(settings, self.topology, self.controller, self.api,
                                 self.stats, self, clock)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._vhost_tasks: dict[str, asyncio.Task[None]] = {}
        self._clients: dict[str, AmqpClient] = {}
        self._client_up: dict[str, asyncio.Event] = {}  # vhost -> set while connected
        self._vhost_kick: dict[str, asyncio.Event] = {}  # vhost -> retry connecting now
        self._sampled_at: dict[QueueKey, float] = {}  # last good management sample
        self._asked: set[QueueKey] = set()  # the management API was asked about these
        self._probe_refused: dict[QueueKey, str] = {}  # passive declare refused (not 404)
        self._warm = False
        self._management_alarm: str | None = None
        self._blocked_alarm: dict[str, str] = {}  # vhost -> connection.blocked reason
        self._wake_management: asyncio.Event | None = None
        self._running = False

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Start every timer; returns at once (readiness says when the first round is in)."""
        self._running = True
        self._wake_management = asyncio.Event()
        event(log, "flow_started", policies=self.store.path, entries=len(self.store.current),
              management=self.settings.management_url,
              upstream=f"{self.settings.amqp_host}:{self.settings.amqp_port}",
              depth_interval=self.settings.depth_interval,
              management_interval=self.settings.management_interval,
              topology_interval=self.settings.topology_interval,
              topology_events="on" if self.settings.topology_events else "off")
        self.feed.start()
        self._spawn(self._management_loop(), "flow-management")
        self._spawn(self._alarm_loop(), "flow-alarms")
        self._spawn(self._policy_watch_loop(), "flow-policy-watch")
        self._spawn(self._holding_log_loop(), "flow-holding-log")
        self._reconcile_vhosts()  # queues policed before start (the topology adds more)

    async def stop(self) -> None:
        self._running = False
        await self.feed.stop()
        tasks = [*self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._vhost_tasks.clear()
        for client in list(self._clients.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            exc = task.exception()
            event(log, "flow_task_failed", logging.ERROR, task=task.get_name(),
                  reason=_reason(exc) if exc else "?")

    # -- what the relay and the topology feed tell us ----------------------------------
    def topology_changed(self, change: TopologyChange) -> None:
        """A declare, delete or bind a client made through the proxy, confirmed by the
        broker."""
        self.feed.apply(change, ChangeSource.RELAYED)

    def topology_applied(self, change: TopologyChange, source: ChangeSource) -> None:
        """A change is in the routing model (``TopologyFeed.apply``): police what a policy
        matches from this moment, forget what is gone."""
        c, kind = change, change.kind
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
            self._kick(c.name)
        elif kind is ChangeKind.DELETE_VHOST:
            for key in [k for k in self.controller.queues if k[0] == c.name]:
                self._gone(key, source)

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
        new = [k for k in keys
               if k not in self.controller.queues and self.controller.queue_seen(k) is not None]
        if new:
            event(log, "queues_policed", queues=_short_list(new), count=len(new),
                  learned_by=source.value)
            self._after_queue_change()

    def feed_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                         rtt: float | None) -> None:
        """A passive declare's (or declare-ok's) ready count of ``key``, if policed.

        A stream's count is the broker's statistics figure, up to its statistics interval
        old: it is dated back by ``management_stats_age``, so the ledger adds what was
        forwarded since (the estimate errs high, never low).
        """
        if key not in self.controller.queues:
            return
        if self.topology.queue_type(*key) is QueueType.STREAM:
            requested_at -= self.settings.management_stats_age
            rtt = None
        self.controller.sampled_ready_count(key, requested_at, ready, rtt)

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample of ``key``, dated back by the broker's statistics interval."""
        if key not in self.controller.queues:
            return
        self._asked.add(key)
        self._sampled_at[key] = self.clock()
        self.controller.sampled_management(
            key, replace(sample, taken_at=sample.taken_at - self.settings.management_stats_age))

    async def queues_listed(self, listed: set[QueueKey]) -> None:
        """A sync listed these queues: police new ones; a policed queue the listing lacks
        is forgotten once the broker confirms it is gone."""
        self._queues_appeared(sorted(listed), ChangeSource.SYNC)
        for key in sorted(set(self.controller.queues) - listed):
            if await self._confirm_gone(key):
                self._gone(key, ChangeSource.SYNC)
        self._reconcile_vhosts()
        self._wake_until_warm()

    async def client_for(self, vhost: str) -> AmqpClient:
        """The vhost's own connection, waiting for it (and asking it to retry now) if it is
        not up; the caller bounds the wait."""
        client = self._clients.get(vhost)
        if client is not None and client.connected:
            return client
        if vhost not in self._vhost_tasks and self._running:
            self._vhost_tasks[vhost] = self._spawn(self._own_connection_loop(vhost),
                                                   f"flow-own-{vhost}")
        self._kick(vhost)
        up = self._client_up.setdefault(vhost, asyncio.Event())
        while True:
            await up.wait()
            client = self._clients.get(vhost)
            if client is not None and client.connected:
                return client
            up.clear()

    async def ask(self, call: Callable[[], Awaitable[T]]) -> T:
        """One management API call, counted (for the topology feed)."""
        return await self._ask(call)

    def _kick(self, vhost: str) -> None:
        """Let the vhost's connection loop retry at once (the vhost may exist now)."""
        kick = self._vhost_kick.get(vhost)
        if kick is not None:
            kick.set()

    def _forget(self, key: QueueKey) -> None:
        if key in self.controller.queues:
            self.controller.queue_deleted(key)
        self._sampled_at.pop(key, None)
        self._asked.discard(key)
        self._probe_refused.pop(key, None)
        self.stats.depth_known.pop(key, None)
        self._after_queue_change()

    def _after_queue_change(self) -> None:
        if not self._running:
            return
        self._reconcile_vhosts()
        # A new queue's first figure is its lookup (a passive declare, at once); its bytes
        # come with the next management round. Until warm, a round at once.
        self._wake_until_warm()

    def known_queues(self) -> set[QueueKey]:
        """Every queue the topology knows, plus those policed now."""
        known = {(v, q) for v in self.topology.vhosts() for q in self.topology.queues(v)}
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
        self.stats.reloads["ok"] += 1
        self.stats.last_reload_error = None
        before = set(self.controller.queues)
        self.controller.set_policies(result.policies, self.known_queues())
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
        while True:
            await asyncio.sleep(self.settings.policy_poll_interval)
            if self.store.changed_since_last_load():
                self.reload("file changed")

    # -- the management API ------------------------------------------------------------
    async def _ask(self, call: Callable[[], Awaitable[T]]) -> T:
        """One management API call, counted, with the API's state logged when it changes."""
        try:
            result = await call()
        except ManagementError as exc:
            self._management_failed(exc)
            raise
        except Exception as exc:  # e.g. http.client's protocol errors
            error = ManagementError("bad_reply", f"{self.api.url}: {_reason(exc)}")
            self._management_failed(error)
            raise error from exc
        finally:
            self.stats.management_requests = self.api.requests
        self._management_ok()
        return result

    def _management_failed(self, exc: ManagementError) -> None:
        self.stats.management_errors[exc.kind] += 1
        status = self.stats.management
        if status.ok is not False or status.kind != exc.kind:
            event(log, "management_api_failed", logging.WARNING, kind=exc.kind,
                  reason=str(exc), url=self.api.url,
                  action=(f"depth of policed queues becomes unknown after "
                          f"{self.settings.depth_unknown_after:g}s without figures; "
                          "their policies' on_unknown_depth applies"))
            if status.ok is not False:
                status.since = self.clock()
        status.ok, status.kind, status.error = False, exc.kind, str(exc)

    def _management_ok(self) -> None:
        status = self.stats.management
        if status.ok is not True:
            if status.ok is False:
                event(log, "management_api_recovered", url=self.api.url,
                      after_seconds=round(self.clock() - (status.since or self.clock()), 1))
            status.since = self.clock()
        status.ok, status.kind, status.error = True, None, None

    # -- topology ----------------------------------------------------------------------
    async def sync_topology(self) -> bool:
        """One full sync of the routing model now (``TopologyFeed.sync``)."""
        ok = await self.feed.sync()
        self._wake_until_warm()
        return ok

    def _wake_until_warm(self) -> None:
        """Until the first round is complete, a topology answer triggers a depth round."""
        if not self._warm and self._wake_management is not None:
            self._wake_management.set()

    async def _confirm_gone(self, key: QueueKey) -> bool:
        """Missing from a topology listing: ask the broker itself if we can."""
        client = self._clients.get(key[0])
        if client is None or not client.connected:
            return True
        try:
            return await client.queue_counts(key[1], self.settings.probe_timeout) is None
        except (AmqpClientError, TimeoutError):
            return False

    # -- depth: management samples -----------------------------------------------------
    async def _management_loop(self) -> None:
        wake = self._wake_management
        assert wake is not None
        while True:
            wake.clear()
            await self.sample_management()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(wake.wait(), self.settings.management_interval)

    async def sample_management(self) -> None:
        """One management sample of every policed queue, then the unknown-depth rule."""
        keys = sorted(self.controller.queues)
        limit = asyncio.Semaphore(self.settings.management_concurrency)

        async def one(key: QueueKey) -> ManagementSample | ManagementError | None:
            async with limit:
                try:
                    return await self._ask(functools.partial(self.api.queue_sample, *key))
                except ManagementError as exc:
                    return exc

        results = await asyncio.gather(*(one(k) for k in keys))
        now = self.clock()
        for key, result in zip(keys, results, strict=True):
            if key not in self.controller.queues:
                continue  # dropped while we asked
            self._asked.add(key)
            if isinstance(result, ManagementSample):
                self.feed_management(key, result)
                self._sampled_at[key] = now
            # None: the API does not know it; the passive declare decides whether it is gone
        self.apply_unknown_depth()
        if self.feed.loaded or self.feed.error is not None:
            if not self._warm and all(k in self._asked for k in self.controller.queues):
                self._warm = True
                event(log, "flow_ready", policed_queues=len(self.controller.queues),
                      management="ok" if self.stats.management.ok else
                      f"failing ({self.stats.management.kind})")

    def depth_is_unknown(self, key: QueueKey, now: float | None = None) -> bool:
        if key not in self._asked:
            return False  # not asked yet: the ready count and ledger decide meanwhile
        sampled = self._sampled_at.get(key)
        now = self.clock() if now is None else now
        return sampled is None or now - sampled > self.settings.depth_unknown_after

    def apply_unknown_depth(self) -> None:
        now = self.clock()
        for key in list(self.controller.queues):
            unknown = self.depth_is_unknown(key, now)
            self.stats.depth_known[key] = not unknown
            if unknown:
                self.controller.depth_unknown(key)

    # -- depth: own connections, one per vhost -----------------------------------------
    def _reconcile_vhosts(self) -> None:
        """One own connection per vhost with policed queues or a policy (lookups and the
        first figures of new queues need it at once)."""
        wanted = {k[0] for k in self.controller.queues} | self.controller.policies.vhosts
        for vhost in wanted - self._vhost_tasks.keys():
            self._vhost_tasks[vhost] = self._spawn(self._own_connection_loop(vhost),
                                                   f"flow-own-{vhost}")
        for vhost in self._vhost_tasks.keys() - wanted:
            self._vhost_tasks.pop(vhost).cancel()
            self.stats.own_connections.pop(vhost, None)

    async def _pause(self, vhost: str, seconds: float) -> None:
        """Sleep before reconnecting, unless kicked (the vhost appeared, a lookup waits)."""
        kick = self._vhost_kick.setdefault(vhost, asyncio.Event())
        kick.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(kick.wait(), seconds)

    async def _own_connection_loop(self, vhost: str) -> None:
        s = self.settings
        backoff = s.reconnect_min
        failing = False
        try:
            while True:
                client = AmqpClient(s.amqp_host, s.amqp_port, s.amqp_credentials.username,
                                    s.amqp_credentials.password, vhost,
                                    on_blocked=functools.partial(self._on_blocked, vhost),
                                    tls=s.upstream_tls)
                try:
                    await client.connect(s.connect_timeout)
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        await client.close()
                    reason = _reason(exc)
                    self.stats.own_connections[vhost] = f"down: {reason}"
                    self.stats.own_connection_failures += 1
                    if not failing:
                        event(log, "own_connection_failed", logging.WARNING, vhost=vhost,
                              upstream=f"{s.amqp_host}:{s.amqp_port}", reason=reason,
                              action="retrying with backoff; management samples go on")
                    failing = True
                    await self._pause(vhost, backoff)
                    backoff = min(backoff * 2, s.reconnect_max)
                    continue
                with contextlib.suppress(AmqpClientError, TimeoutError):
                    await client.open_lane("lookup", s.connect_timeout)
                event(log, "own_connection_up", vhost=vhost,
                      upstream=f"{s.amqp_host}:{s.amqp_port}")
                failing, backoff = False, s.reconnect_min
                self.stats.own_connections[vhost] = "up"
                self._clients[vhost] = client
                self._client_up.setdefault(vhost, asyncio.Event()).set()
                try:
                    await self._probe_forever(client, vhost)
                finally:
                    self._client_up[vhost].clear()
                    self._clients.pop(vhost, None)
                    if self._blocked_alarm.pop(vhost, None) is not None:
                        self._update_alarm()
                    with contextlib.suppress(Exception):
                        await client.close()
                reason = client.closed_reason or "closed"
                self.stats.own_connections[vhost] = f"down: {reason}"
                self.stats.own_connection_failures += 1
                event(log, "own_connection_reconnecting", logging.WARNING, vhost=vhost,
                      reason=reason, retry_in=backoff)
                failing = True
                await self._pause(vhost, backoff)
        finally:
            self.stats.own_connections.pop(vhost, None)

    async def _probe_forever(self, client: AmqpClient, vhost: str) -> None:
        """Passive-declare each policed queue of ``vhost`` every depth interval."""
        loop = asyncio.get_running_loop()
        interval = self.settings.depth_interval
        next_at = loop.time()
        while client.connected:
            for key in [k for k in self.controller.queues if k[0] == vhost]:
                if self.depth_is_unknown(key):
                    self.controller.depth_unknown(key)
                    continue
                requested_at = self.clock()
                try:
                    counts = await client.queue_counts(key[1], self.settings.probe_timeout)
                except TimeoutError:
                    event(log, "own_connection_unresponsive", logging.WARNING, vhost=vhost,
                          queue=key[1], timeout=self.settings.probe_timeout)
                    return
                except AmqpClientError as exc:
                    if not client.connected:
                        return
                    self._refused(key, str(exc))
                    continue
                if self._probe_refused.pop(key, None) is not None:
                    event(log, "queue_probe_ok", vhost=key[0], queue=key[1])
                if counts is None:
                    if key in self.controller.queues:
                        self.feed.apply(TopologyChange(ChangeKind.DELETE_QUEUE, *key),
                                        ChangeSource.LOOKUP)
                elif key in self.controller.queues:
                    rtt = self.clock() - requested_at
                    self.feed_ready_count(key, requested_at, counts.messages, rtt)
            next_at += interval
            now = loop.time()
            if next_at < now:
                next_at = now  # fell behind (many queues, slow broker): no burst to catch up
            await asyncio.sleep(next_at - now)

    def _refused(self, key: QueueKey, reason: str) -> None:
        if self._probe_refused.get(key) != reason:
            event(log, "queue_probe_refused", logging.WARNING, vhost=key[0], queue=key[1],
                  reason=reason, action="depth from management samples only")
        self._probe_refused[key] = reason

    # -- broker alarms -----------------------------------------------------------------
    def _on_blocked(self, vhost: str, reason: str | None) -> None:
        if reason is None:
            self._blocked_alarm.pop(vhost, None)
        else:
            self._blocked_alarm[vhost] = f"connection.blocked: {reason}"
        self._update_alarm()

    def _update_alarm(self) -> None:
        reason = self._management_alarm
        if reason is None and self._blocked_alarm:
            reason = self._blocked_alarm[min(self._blocked_alarm)]
        self.controller.set_alarm(reason)

    async def _alarm_loop(self) -> None:
        while True:
            await self.poll_alarms()
            await asyncio.sleep(self.settings.alarm_interval)

    async def poll_alarms(self) -> None:
        """Ask the management API for node alarms; an error keeps the last answer."""
        try:
            alarms = await self._ask(self.api.alarms)
        except ManagementError:
            return
        parts = []
        if alarms.memory:
            parts.append("memory alarm on " + ",".join(alarms.memory))
        if alarms.disk:
            parts.append("disk alarm on " + ",".join(alarms.disk))
        self._management_alarm = "; ".join(parts) or None
        self._update_alarm()

    # -- the repeating "publishes held" lines ------------------------------------------
    async def _holding_log_loop(self) -> None:
        while True:
            await asyncio.sleep(self.settings.holding_log_interval)
            self.log_holding()

    def log_holding(self) -> None:
        """One line per blocked channel (seed 000: repeat until released)."""
        now = self.clock()
        for b in sorted(self.controller.blocked_channels(),
                        key=lambda b: (b.conn_id, b.channel)):
            event(log, "publishes_held", conn=b.conn_id, channel=b.channel,
                  queues=",".join(key_label(k) for k in sorted(b.queues)),
                  seconds=round(now - b.since, 1))

    # -- admin views -------------------------------------------------------------------
    def readiness(self) -> tuple[bool, dict[str, object]]:
        """Ready once the startup round is in: policies loaded (always, or we would not
        run), the topology loaded or its failure reported, and every queue policed then
        asked about once. Afterwards management trouble shows here but does not unready
        the proxy: the relay still works and on_unknown_depth keeps queues safe.
        """
        now = self.clock()
        detail: dict[str, object] = {
            "policies": {"source": self.store.path, "generation": self.store.generation,
                         "entries": len(self.store.current)},
            "management": self.stats.management.as_dict(now),
            "policed_queues": len(self.controller.queues),
        }
        if not self._warm:
            waiting = [key_label(k) for k in sorted(self.controller.queues)
                       if k not in self._asked]
            detail["warming_up"] = ({"first_depth_sample": waiting[:LOG_LIST_LIMIT]} if waiting
                                    else {"topology": "not loaded yet"})
        if self.feed.error is not None:
            detail["topology_error"] = self.feed.error
        if self.stats.events_status != "up":
            # Not a reason to be unready (lookups and syncs go on), but say how stale the
            # model can be: changes to known exchanges wait for the next sync.
            detail["topology"] = topology_state(self.controller, self.stats, now)
        unknown = [key_label(k) for k in sorted(self.controller.queues)
                   if self.depth_is_unknown(k, now)]
        if unknown:
            detail["depth_unknown"] = unknown[:LOG_LIST_LIMIT]
        down = {v: r for v, r in self.stats.own_connections.items() if r != "up"}
        if down:
            detail["own_connections_down"] = down
        if self.controller.alarm_reason is not None:
            detail["broker_alarm"] = self.controller.alarm_reason
        return self._warm, detail

    def state(self) -> dict[str, object]:
        return flow_state(self.controller, self.stats, self.clock())
