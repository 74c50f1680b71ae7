"""The flow supervisor's own AMQP connections (``OwnConnections``, a part the supervisor
owns): one per vhost with policed queues or a policy, passive-declaring each policed queue
every ``depth_interval`` (a hot queue back to back, at most one every ``hot_interval``:
``floodwall.control.schedule``), answering the topology feed's lookups, and reporting the
broker's connection.blocked notices."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import zlib
from collections.abc import Callable
from typing import Protocol

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.events import QueueTripped
from floodwall.control.fleet_polls import fleet_count_interval
from floodwall.control.routing import ChangeKind, TopologyChange
from floodwall.control.routing.sync import ChangeSource
from floodwall.control.schedule import held_interval, sampling_interval
from floodwall.io.amqp_client import AmqpClient, AmqpClientError
from floodwall.io.broker_alarms import BrokerAlarms
from floodwall.io.depth_feed import DepthFeed
from floodwall.io.flow_settings import FlowSettings
from floodwall.io.management_sampling import error_text
from floodwall.io.switchboard import Switchboard
from floodwall.io.tasks import Spawn
from floodwall.io.topology import TopologyFeed
from floodwall.ops.flow_metrics import FlowStats
from floodwall.ops.logs import event

log = logging.getLogger("floodwall.flow")

#: Channels the hot queues of one vhost are counted on, side by side (more share them).
HOT_LANES = 8


class OwnConnectionsHost(Protocol):
    """What the own connections need of the flow supervisor."""

    @property
    def running(self) -> bool:
        """Between start and stop: a vhost's connection may be opened."""


class OwnConnections:
    """The own connection of each vhost (``reconcile``, ``client_for``) and the ready counts
    its passive declares feed through the ``DepthFeed``; a connection lost makes its queues'
    depth stale, its connection.blocked goes to the ``BrokerAlarms``."""

    def __init__(self, settings: FlowSettings, clock: Callable[[], float],
                 controller: FlowController, board: Switchboard, stats: FlowStats,
                 depth: DepthFeed, alarms: BrokerAlarms, feed: TopologyFeed,
                 host: OwnConnectionsHost, spawn: Spawn) -> None:
        self.settings = settings
        self.clock = clock
        self.controller = controller
        self.board = board
        self.stats = stats
        self.depth = depth
        self.alarms = alarms
        self.feed = feed
        self.host = host
        self._spawn = spawn
        self._vhost_tasks: dict[str, asyncio.Task[None]] = {}
        self._clients: dict[str, AmqpClient] = {}
        self._client_up: dict[str, asyncio.Event] = {}  # vhost -> set while connected
        self._vhost_kick: dict[str, asyncio.Event] = {}  # vhost -> retry connecting now
        self._probe_wake: dict[str, asyncio.Event] = {}  # vhost -> a queue tripped: hot now
        self._hot_wake: dict[QueueKey, asyncio.Event] = {}  # a hot queue tripped: count now

    async def close(self) -> None:
        """Close every own connection (the owner has cancelled the tasks)."""
        self._vhost_tasks.clear()
        for client in list(self._clients.values()):
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()

    async def client_for(self, vhost: str) -> AmqpClient:
        """The vhost's own connection, waiting for it (and asking it to retry now) if it is
        not up; the caller bounds the wait."""
        client = self._clients.get(vhost)
        if client is not None and client.connected:
            return client
        if vhost not in self._vhost_tasks and self.host.running:
            self._vhost_tasks[vhost] = self._spawn(self._own_connection_loop(vhost),
                                                   f"flow-own-{vhost}")
        self.kick(vhost)
        up = self._client_up.setdefault(vhost, asyncio.Event())
        while True:
            await up.wait()
            client = self._clients.get(vhost)
            if client is not None and client.connected:
                return client
            up.clear()

    def kick(self, vhost: str) -> None:
        """Let the vhost's connection loop retry at once (the vhost may exist now)."""
        kick = self._vhost_kick.get(vhost)
        if kick is not None:
            kick.set()

    async def confirm_gone(self, key: QueueKey) -> bool:
        """Missing from a topology listing: ask the broker itself if we can."""
        client = self._clients.get(key[0])
        if client is None or not client.connected:
            return True
        try:
            return await client.queue_counts(key[1], self.settings.probe_timeout) is None
        except (AmqpClientError, TimeoutError):
            return False

    # -- depth: own connections, one per vhost -----------------------------------------
    def reconcile(self) -> None:
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
                                    on_blocked=functools.partial(self.alarms.blocked, vhost),
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
                    self.alarms.connection_lost(vhost)
                    with contextlib.suppress(Exception):
                        await client.close()
                reason = client.closed_reason or "closed"
                self.depth.mark_stale([k for k in self.controller.queues if k[0] == vhost],
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
        hot queues are counted side by side. A trip wakes the loop (``on_flow_event``)."""
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
                    if self._count_every(key) is not None:
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
        """Count hot queue ``key`` back to back, one passive declare in flight, as often as
        ``_count_every`` says, until it is cold again (the slow loop takes it back); a trip
        (``on_flow_event``) ends the wait for the next count at once."""
        loop = asyncio.get_running_loop()
        # A channel of the lane's own; at most HOT_LANES of them (hot queues beyond share)
        lane = f"hot:{zlib.crc32(key[1].encode()) % HOT_LANES}"
        tripped = self._hot_wake.setdefault(key, asyncio.Event())
        try:
            while client.connected and self._count_every(key) is not None:
                started = loop.time()
                tripped.clear()
                if not await self._probe_once(client, key, lane):
                    return
                every = self._count_every(key)
                if every is None:
                    return
                with contextlib.suppress(TimeoutError):  # (a trip: counted at once)
                    await asyncio.wait_for(tripped.wait(),
                                           max(0.0, every - (loop.time() - started)))
        finally:
            if self._hot_wake.get(key) is tripped:
                del self._hot_wake[key]

    def _count_every(self, key: QueueKey) -> float | None:
        """How often ``key`` is counted now while it is hot, None while it is cold (the
        schedule's ``sampling_interval``); notes the interval in force for the metrics and
        /state. Hot and tripped: every hot interval, less often while nothing moves or
        its consumers are slow for its limit (``held_interval``); hot and untripped: as
        often as its ingress needs; in a fleet with A active members on it, every A x
        that, idle every depth interval (``fleet_count_interval``)."""
        q = self.controller.queues.get(key)
        if q is None:
            return None
        s = self.settings
        now = self.clock()
        every = sampling_interval(q.depth, q.policy, q.tripped, now, s.depth_interval,
                                  s.hot_interval, q.share)
        if every >= s.depth_interval:
            self.stats.sampling_interval[key] = every
            return None
        if q.tripped:
            every = held_interval(q.depth, q.policy, now, s.hot_interval, q.share is None)
        every = fleet_count_interval(every, q.share, s.depth_interval)
        self.stats.sampling_interval[key] = every
        return every

    def on_flow_event(self, item: object) -> None:
        """A queue tripped between two slow rounds: its loop makes it hot at once."""
        if isinstance(item, QueueTripped):
            wake = self._probe_wake.get(item.key[0])
            if wake is not None:
                wake.set()
            counting = self._hot_wake.get(item.key)
            if counting is not None:
                counting.set()

    async def _probe_once(self, client: AmqpClient, key: QueueKey, lane: str = "probe") -> bool:
        """One passive declare of ``key`` fed to the controller; False when the connection
        cannot be used any more (it is gone, or did not answer in time)."""
        if self.depth.depth_is_unknown(key):
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
        if self.depth.probe_refused.pop(key, None) is not None:
            event(log, "queue_probe_ok", vhost=key[0], queue=key[1])
        if counts is None:
            if key in self.controller.queues:
                self.feed.apply(TopologyChange(ChangeKind.DELETE_QUEUE, *key),
                                ChangeSource.LOOKUP)
        elif key in self.controller.queues:
            rtt = self.clock() - requested_at
            self.depth.feed_ready_count(key, requested_at, counts.messages, rtt)
        return True

    def _refused(self, key: QueueKey, reason: str) -> None:
        if self.depth.probe_refused.get(key) != reason:
            event(log, "queue_probe_refused", logging.WARNING, vhost=key[0], queue=key[1],
                  reason=reason, action="depth from management samples only")
        self.depth.probe_refused[key] = reason
