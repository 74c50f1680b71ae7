"""The depth and alarm side of the flow supervisor (``DepthProbes``, which ``FlowSupervisor``
extends): management API samples of every policed queue, one own AMQP connection per vhost
passive-declaring them every ``depth_interval``, and the broker's alarms (the API's node
alarms, the own connections' connection.blocked)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import replace
from typing import Any, TypeVar

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.routing import ChangeKind, QueueType, Topology, TopologyChange
from floodwall.control.routing.sync import ChangeSource
from floodwall.io.amqp_client import AmqpClient, AmqpClientError
from floodwall.io.flow_settings import FlowSettings
from floodwall.io.management import ManagementApi, ManagementError
from floodwall.io.switchboard import Switchboard
from floodwall.io.tasks import spawn
from floodwall.io.topology import TopologyFeed
from floodwall.ops.flow_metrics import (
    FlowStats,
)
from floodwall.ops.logs import event
from floodwall.ops.supervision import (
    broker_alarm,
    depth_is_unknown,
    first_round_in,
    management_alarm,
)

log = logging.getLogger("floodwall.flow")

T = TypeVar("T")


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class DepthProbes:
    """What feeds the controller depth and alarms, on timers; ``FlowSupervisor`` builds the
    parts (``__init__``) and adds policing, policies and the admin views."""

    settings: FlowSettings
    clock: Callable[[], float]
    topology: Topology
    controller: FlowController
    board: Switchboard
    api: ManagementApi
    stats: FlowStats
    feed: TopologyFeed
    _tasks: set[asyncio.Task[Any]]
    _vhost_tasks: dict[str, asyncio.Task[None]]
    _clients: dict[str, AmqpClient]
    _client_up: dict[str, asyncio.Event]
    _vhost_kick: dict[str, asyncio.Event]
    _sampled_at: dict[QueueKey, float]
    _asked: set[QueueKey]
    _probe_refused: dict[QueueKey, str]
    _warm: bool
    _management_alarm: str | None
    _blocked_alarm: dict[str, str]
    _wake_management: asyncio.Event | None
    _running: bool

    def _spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        return spawn(self._tasks, coro, name, log, "flow_task_failed", _reason)

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
        self.controller.sampled_ready_count(key, requested_at, ready, rtt, self.clock())
        self.board.settle()

    def feed_management(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample of ``key``, dated back by the broker's statistics interval."""
        if key not in self.controller.queues:
            return
        self._asked.add(key)
        now = self._sampled_at[key] = self.clock()
        self.controller.sampled_management(
            key, replace(sample, taken_at=sample.taken_at - self.settings.management_stats_age),
            now)
        self.board.settle()

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

    def _kick(self, vhost: str) -> None:
        """Let the vhost's connection loop retry at once (the vhost may exist now)."""
        kick = self._vhost_kick.get(vhost)
        if kick is not None:
            kick.set()

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
        """One management sample of every policed queue (but those the fleet's poller
        samples: ``shared_elsewhere``), then the unknown-depth rule."""
        keys = sorted(k for k in self.controller.queues if not self.shared_elsewhere(k))
        limit = asyncio.Semaphore(self.settings.management_connections)

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
        if not self._warm and first_round_in(self.feed.loaded or self.feed.error is not None,
                                             self.controller.queues, self._asked):
            self._warm = True
            event(log, "flow_ready", policed_queues=len(self.controller.queues),
                  management="ok" if self.stats.management.ok else
                  f"failing ({self.stats.management.kind})")

    def shared_elsewhere(self, key: QueueKey) -> bool:
        """Whether another sidecar of the fleet samples ``key`` for this one (see
        ``FlowSupervisor``); alone, never."""
        return False

    def depth_is_unknown(self, key: QueueKey, now: float | None = None) -> bool:
        return depth_is_unknown(key in self._asked, self._sampled_at.get(key),
                                self.clock() if now is None else now,
                                self.settings.depth_unknown_after)

    def apply_unknown_depth(self) -> None:
        now = self.clock()
        for key in list(self.controller.queues):
            unknown = self.depth_is_unknown(key, now)
            self.stats.depth_known[key] = not unknown
            if unknown:
                self.controller.depth_unknown(key, now)
        self.board.settle()

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
                    self.controller.depth_unknown(key, self.clock())
                    self.board.settle()
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
        self.controller.set_alarm(broker_alarm(self._management_alarm, self._blocked_alarm),
                                 self.clock())
        self.board.settle()

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
        self._management_alarm = management_alarm(alarms.memory, alarms.disk)
        self._update_alarm()
