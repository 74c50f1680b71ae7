"""The depth and alarm side of the flow supervisor (``DepthProbes``, which ``FlowSupervisor``
extends): management API samples of every policed queue, one own AMQP connection per vhost
passive-declaring them every ``depth_interval`` (a hot queue back to back, at most one
every ``hot_interval``: ``floodwall.control.schedule``), and the broker's alarms (the API's node
alarms, the own connections' connection.blocked)."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import zlib

from floodwall.control.controller import QueueKey
from floodwall.control.events import QueueTripped
from floodwall.control.fleet_polls import fleet_count_interval
from floodwall.control.routing import ChangeKind, QueueType, Topology, TopologyChange
from floodwall.control.routing.sync import ChangeSource
from floodwall.control.schedule import sampling_interval
from floodwall.io.amqp_client import AmqpClient, AmqpClientError
from floodwall.io.management import (
    ManagementError,
)
from floodwall.io.management_probes import ManagementProbes, error_text
from floodwall.ops.logs import event
from floodwall.ops.supervision import (
    broker_alarm,
    management_alarm,
)

log = logging.getLogger("floodwall.flow")

#: Channels the hot queues of one vhost are counted on, side by side (more share them).
HOT_LANES = 8


class DepthProbes(ManagementProbes):
    """What feeds the controller depth and alarms, on timers; ``FlowSupervisor`` builds the
    parts (``__init__``) and adds policing, policies and the admin views."""

    topology: Topology
    _vhost_tasks: dict[str, asyncio.Task[None]]
    _clients: dict[str, AmqpClient]
    _client_up: dict[str, asyncio.Event]
    _vhost_kick: dict[str, asyncio.Event]
    _probe_wake: dict[str, asyncio.Event]
    _management_alarm: str | None
    _blocked_alarm: dict[str, str]
    _running: bool

    def feed_ready_count(self, key: QueueKey, requested_at: float, ready: int,
                         rtt: float | None) -> None:
        """A passive declare's (or declare-ok's) ready count of ``key``, if policed.

        A stream's count is the broker's statistics figure, up to its statistics interval
        old: it is dated back by ``management_stats_age``, so the ledger adds what was
        forwarded since (the estimate errs high, never low); a stream does not drain.
        """
        if key not in self.controller.queues or not self._fresh_figure(key, requested_at):
            return
        stream = self.topology.queue_type(*key) is QueueType.STREAM
        if stream:
            requested_at -= self.settings.management_stats_age
            rtt = None
        self.stats.ready_counts[key] += 1
        self.controller.sampled_ready_count(key, requested_at, ready, rtt, self.clock(),
                                            drains=not stream)
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

    async def _confirm_gone(self, key: QueueKey) -> bool:
        """Missing from a topology listing: ask the broker itself if we can."""
        client = self._clients.get(key[0])
        if client is None or not client.connected:
            return True
        try:
            return await client.queue_counts(key[1], self.settings.probe_timeout) is None
        except (AmqpClientError, TimeoutError):
            return False

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
                client = AmqpClient(s.upstreams, s.amqp_credentials.username,
                                    s.amqp_credentials.password, vhost,
                                    on_blocked=functools.partial(self._on_blocked, vhost),
                                    tls=s.upstream_tls)
                try:
                    await client.connect(s.connect_timeout)
                except Exception as exc:
                    with contextlib.suppress(Exception):
                        await client.close()
                    reason = error_text(exc)
                    self.stats.own_connections[vhost] = f"down: {reason}"
                    self.stats.own_connection_failures += 1
                    if not failing:
                        event(log, "own_connection_failed", logging.WARNING, vhost=vhost,
                              upstream=s.upstreams.label, reason=reason,
                              action="retrying with backoff; management samples go on")
                    failing = True
                    await self._pause(vhost, backoff)
                    backoff = min(backoff * 2, s.reconnect_max)
                    continue
                with contextlib.suppress(AmqpClientError, TimeoutError):
                    await client.open_lane("lookup", s.connect_timeout)
                event(log, "own_connection_up", vhost=vhost,
                      upstream=str(client.endpoint))
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
                self._mark_stale([k for k in self.controller.queues if k[0] == vhost],
                                 f"own connection to vhost {vhost} lost: {reason}")
                self.stats.own_connections[vhost] = f"down: {reason}"
                self.stats.own_connection_failures += 1
                event(log, "own_connection_reconnecting", logging.WARNING, vhost=vhost,
                      reason=reason, retry_in=backoff)
                failing = True
                await self._pause(vhost, backoff)
        finally:
            self.stats.own_connections.pop(vhost, None)

    async def _probe_forever(self, client: AmqpClient, vhost: str) -> None:
        """Passive-declare each cold policed queue of ``vhost`` every depth interval; a hot
        one (``floodwall.control.schedule``: held, or about to fill) gets a task of its own
        that counts it back to back on a channel of its own (``_probe_hot``), so several
        hot queues are counted side by side. A trip wakes the loop (``_on_flow_event``)."""
        loop = asyncio.get_running_loop()
        interval = self.settings.depth_interval
        wake = self._probe_wake.setdefault(vhost, asyncio.Event())
        hot: dict[QueueKey, asyncio.Task[None]] = {}
        next_at = loop.time()
        try:
            while client.connected:
                wake.clear()
                for key in [k for k in self.controller.queues if k[0] == vhost]:
                    task = hot.get(key)
                    if task is not None and not task.done():
                        continue
                    if self._is_hot(key):
                        hot[key] = self._spawn(self._probe_hot(client, key),
                                               f"flow-hot-{vhost}-{key[1]}")
                    elif not await self._probe_once(client, key):
                        return
                now = loop.time()
                next_at = max(next_at + interval, now)  # fell behind: no burst to catch up
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(wake.wait(), next_at - now)
        finally:
            for task in hot.values():
                task.cancel()

    async def _probe_hot(self, client: AmqpClient, key: QueueKey) -> None:
        """Count hot queue ``key`` back to back, one passive declare in flight, at most one
        every ``hot_interval`` (in a fleet with A active members on it, every A x
        ``hot_interval``; idle, every depth interval: ``fleet_count_interval``), until it is
        cold again (the slow loop takes it back)."""
        loop = asyncio.get_running_loop()
        # A channel of the lane's own; at most HOT_LANES of them (hot queues beyond share)
        lane = f"hot:{zlib.crc32(key[1].encode()) % HOT_LANES}"
        while client.connected and self._is_hot(key):
            started = loop.time()
            if not await self._probe_once(client, key, lane):
                return
            q = self.controller.queues.get(key)
            every = fleet_count_interval(self.settings.hot_interval,
                                         None if q is None else q.share,
                                         self.settings.depth_interval)
            await asyncio.sleep(max(0.0, every - (loop.time() - started)))

    def _is_hot(self, key: QueueKey) -> bool:
        """Whether ``key`` is counted at the hot interval now (and note the interval in force
        for the metrics and /state)."""
        q = self.controller.queues.get(key)
        if q is None:
            return False
        s = self.settings
        interval = sampling_interval(q.depth, q.policy, q.tripped, self.clock(),
                                     s.depth_interval, s.hot_interval, q.share)
        hot = interval < s.depth_interval
        self.stats.sampling_interval[key] = (
            fleet_count_interval(interval, q.share, s.depth_interval) if hot else interval)
        return hot

    def _on_flow_event(self, item: object) -> None:
        """A queue tripped between two slow rounds: its loop makes it hot at once."""
        if isinstance(item, QueueTripped):
            wake = self._probe_wake.get(item.key[0])
            if wake is not None:
                wake.set()

    async def _probe_once(self, client: AmqpClient, key: QueueKey, lane: str = "probe") -> bool:
        """One passive declare of ``key`` fed to the controller; False when the connection
        cannot be used any more (it is gone, or did not answer in time)."""
        if self.depth_is_unknown(key):
            self.controller.depth_unknown(key, self.clock())
            self.board.settle()
            return True
        requested_at = self.clock()
        self.controller.count_asked(key, requested_at)
        try:
            counts = await client.queue_counts(key[1], self.settings.probe_timeout, lane)
        except TimeoutError:
            event(log, "own_connection_unresponsive", logging.WARNING, vhost=key[0],
                  queue=key[1], timeout=self.settings.probe_timeout)
            return False
        except AmqpClientError as exc:
            if not client.connected:
                return False
            self._refused(key, str(exc))
            return True
        if self._probe_refused.pop(key, None) is not None:
            event(log, "queue_probe_ok", vhost=key[0], queue=key[1])
        if counts is None:
            if key in self.controller.queues:
                self.feed.apply(TopologyChange(ChangeKind.DELETE_QUEUE, *key),
                                ChangeSource.LOOKUP)
        elif key in self.controller.queues:
            rtt = self.clock() - requested_at
            self.feed_ready_count(key, requested_at, counts.messages, rtt)
        return True

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
            if not self.alarms_shared_elsewhere():
                await self.poll_alarms()
            await asyncio.sleep(self.settings.alarm_interval)

    async def poll_alarms(self) -> None:
        """Ask the management API for node alarms; an error keeps the last answer."""
        try:
            alarms = await self._ask(self.api.alarms)
        except ManagementError:
            return
        self.node_alarms(alarms.memory, alarms.disk)

    def node_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        """The nodes in a memory and in a disk alarm, as the management API said."""
        self._management_alarm = management_alarm(memory, disk)
        self._update_alarm()

    def alarms_shared_elsewhere(self) -> bool:
        """Whether another sidecar of the fleet polls the node alarms for this one (see
        ``FlowSupervisor``); alone, never."""
        return False
