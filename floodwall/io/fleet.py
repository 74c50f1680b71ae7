"""The fleet channel through the broker (``FleetService``): sidecars that police queues on one
broker find each other with nothing but the broker they already use.

On each vhost with policed queues or a policy, on a connection of its own (``new_client``:
not the depth probes' connection, because RabbitMQ stops reading a connection that
publishes during a memory or disk alarm, and the probes must go on): a fanout exchange
``floodwall.fleet.<name>`` (not durable, not auto-delete), this sidecar's own exclusive,
auto-delete queue ``floodwall.fleet.<name>.<member id>`` bound to it and consumed without
acks, and a plain channel (no confirms) on which it announces its reports of that vhost's
policed queues (``floodwall.control.fleet.encode``): every ``interval`` (100 ms) while one
of them is hot (``hot_queues``), every ``cold_interval`` (1 s) otherwise, and at once when
a member joins. Every member hears every announcement, its own included (the echo says
this sidecar can hear the fleet). A member that dies stops announcing (gone after
``MEMBER_TIMEOUT``); its queue goes with its connection, which the broker's topology
events report at once (``member_queue_deleted``); one that stops cleanly says so (a
``leaving`` announcement). Membership and shares: ``floodwall.control.fleet``.

One management poller per queue: the member ``poller_of`` picks (rendezvous hashing over
the live members that police the queue) announces its management API samples of it; the
others feed those (``feed_shared_management``) and skip the queue in their own management
rounds while the poller's last sample is fresh (``covered``). Deaf, a sidecar polls
everything itself. So the API is asked about each policed queue once per
``management_interval`` per fleet, not once per sidecar. Likewise one member polls the
node alarms and one per vhost syncs the topology for the fleet (``FleetPolls``,
``floodwall.io.fleet_polls``).

Broker load per sidecar and vhost: 1 publish per interval (10/s hot, 1/s cold), each
delivered to the N members: 10 N (hot) or N (cold) deliveries/s received per sidecar,
each ~60 bytes + ~45 per policed queue."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import re
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any, Protocol

from floodwall.control.controller import FlowController, QueueKey
from floodwall.control.depth import ManagementSample
from floodwall.control.fleet import (
    ANNOUNCE_INTERVAL,
    COLD_INTERVAL,
    EXCHANGE_PREFIX,
    MEMBER_TIMEOUT,
    Announcement,
    FleetMessageError,
    FleetTable,
    IngressMeter,
    MemberBack,
    MemberJoined,
    MemberLeft,
    MemberSilent,
    QueueReport,
    SharedSample,
    ShareRule,
    announce_due,
    decode,
    encode,
    fleet_exchange,
    member_queue,
)
from floodwall.enforce.shared import Enforcement
from floodwall.io.amqp_client import AmqpClient, AmqpClientError, Delivery, QueueLocked
from floodwall.io.fleet_polls import FleetPolls, PollsHost
from floodwall.io.tasks import spawn
from floodwall.ops.fleet_view import (
    FleetCollector,
    FleetCounters,
    FleetFigures,
    fleet_figures,
    fleet_state,
    hot_queues,
    my_reports,
)
from floodwall.ops.logs import event
from floodwall.ops.telemetry import sidecar_identity

log = logging.getLogger("floodwall.fleet")

#: How long a vhost whose fleet channel could not be set up waits before trying again.
RETRY_SECONDS = 1.0
#: An echo of its own announcement this late, or its announcement timer firing this late (a
#: fifth of the timeout), is logged (``fleet_echo_late``, ``fleet_tick_late``): what makes
#: members silent to the others.
LATE_SECONDS = 0.5
#: Announcements past this many waiting in a member's queue are dropped, oldest first: a
#: stalled sidecar must not grow the broker (only the newest of each member counts).
MEMBER_QUEUE_MAX = 1000


def member_id(identity: str | None = None) -> str:
    """This process's id in the fleet: the pod's (or host's) name, the pid and a random
    suffix, so two processes in one pod, or a restarted one, never share one."""
    base = re.sub(r"[^A-Za-z0-9_.-]", "_", identity or sidecar_identity())[:80] or "sidecar"
    return f"{base}-{os.getpid()}-{secrets.token_hex(3)}"


@dataclass(frozen=True)
class FleetSettings:
    name: str = "default"
    member: str = ""  # "": member_id()
    interval: float = ANNOUNCE_INTERVAL  # while a policed queue of the vhost is hot
    cold_interval: float = COLD_INTERVAL  # while none is
    timeout: float = MEMBER_TIMEOUT
    setup_timeout: float = 5.0
    # A poller's management sample older than this no longer spares the others asking the
    # API themselves (the supervisor: 2 intervals + the API's timeout, below the depth's
    # unknown_after: 3 intervals + the timeout).
    sample_stale_after: float = 10.0
    # Likewise for the alarm poller's node alarms (2 alarm intervals + the API's timeout),
    # and the topology poller's last sync (2 topology intervals + the API's timeout); how
    # long two digests may differ for changes in flight (the topology's sync grace).
    alarm_stale_after: float = 9.0
    topology_stale_after: float = 65.0
    sync_grace: float = 2.0
    sync_spacing: float = 30.0  # the topology interval: digest-asked syncs at most this often


class FleetHost(PollsHost, Protocol):
    """What the fleet needs of the flow supervisor."""

    controller: FlowController
    enforcement: Enforcement

    def new_client(self, vhost: str) -> AmqpClient:
        """A new (unconnected) own connection to ``vhost``, for the fleet alone."""

    def feed_shared_management(self, key: QueueKey, sample: ManagementSample) -> None: ...


def _reason(exc: BaseException) -> str:
    text = str(exc)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


class FleetService:
    """Announces, listens, keeps the ``FleetTable``; ``start()``, ``await stop()``."""

    def __init__(self, settings: FleetSettings, host: FleetHost,
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.settings = settings
        self.name = settings.name
        self.me = settings.member or member_id()
        self.host = host
        self.clock = clock
        self.table = FleetTable(self.me, settings.timeout)
        self.meter = IngressMeter()
        self.counters = FleetCounters()
        self.started = wall()
        self.seq = 0
        self.figures: FleetFigures | None = None
        self.collector = FleetCollector(lambda: self.figures, self.counters)
        self.exchange = fleet_exchange(self.name)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._vhost_tasks: dict[str, asyncio.Task[None]] = {}
        self._live: dict[str, tuple[AmqpClient, int]] = {}  # vhost -> (client, channel)
        self._lost: dict[str, asyncio.Event] = {}  # vhost -> set when its channel broke
        # The management API samples this sidecar took (offered to the fleet), with an id
        # each; the ids of the fleet's samples already fed, by (member, queue).
        self._polled: dict[QueueKey, tuple[ManagementSample, int]] = {}
        self._sids = 0
        self._fed: dict[tuple[str, QueueKey], int] = {}
        self._announced: dict[str, float] = {}  # vhost -> when this sidecar last announced
        self._said: dict[QueueKey, QueueReport] = {}  # what it last announced of each queue
        self._since: dict[QueueKey, float] = {}  # when it began policing each queue
        # Silent members: when their queue was last checked, and those being checked now.
        self._checked: dict[str, float] = {}
        self._checking: set[str] = set()
        self._published: dict[int, float] = {}  # seq -> when, for the echo's delay
        host.controller.share_source = self._first_rule
        self.polls = FleetPolls(self.table, host, clock,
                                alarm_stale_after=settings.alarm_stale_after,
                                topology_stale_after=settings.topology_stale_after,
                                sync_grace=settings.sync_grace,
                                sync_spacing=settings.sync_spacing)

    def _first_rule(self, key: QueueKey, _now: float) -> ShareRule | None:
        """A queue this sidecar begins to police: its share rule at once, before the queue's
        first figure lets publishes go, with the members of its vhost counted as newcomers
        until they announce (``FleetTable.rule``'s pending ones); the next tick refines it.
        (At the next tick alone, the first figure could come first, and each member forward
        the whole room: 0.4-1.6 MiB over a 1 MiB capacity with 4 members.)"""
        now = self.clock()  # (the fleet's clock; the tick marks it newly policed)
        return self.table.rule(key, QueueReport(0.0, 0, None), now, self._since.get(key, now))

    # -- lifecycle ---------------------------------------------------------------------
    def start(self) -> None:
        event(log, "fleet_started", fleet=self.name, member=self.me, exchange=self.exchange,
              interval=self.settings.interval, timeout=self.settings.timeout)
        self._spawn(self._tick_forever(), "fleet-tick")

    async def stop(self) -> None:
        """Say goodbye where the channel is up (the others drop this member at once)."""
        for vhost, (client, channel) in list(self._live.items()):
            with contextlib.suppress(AmqpClientError, OSError):
                self._announce(vhost, client, channel, leaving=True)
                await asyncio.wait_for(client.drain(), 1.0)
        tasks = [*self._tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._vhost_tasks.clear()
        self._live.clear()

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[None]:
        return spawn(self._tasks, coro, name, log, "fleet_task_failed", _reason)

    # -- what the supervisor tells us ----------------------------------------------------
    def member_queue_deleted(self, queue: str) -> None:
        """A fleet member's queue is gone (a topology event): its connection died."""
        prefix = f"{EXCHANGE_PREFIX}{self.name}."
        if queue.startswith(prefix):
            self.table.gone(queue[len(prefix):], self.clock())
            self._log_changes()

    # -- one management poller per queue ------------------------------------------------
    def own_sample(self, key: QueueKey, sample: ManagementSample) -> None:
        """A management sample this sidecar took: announced while it polls ``key``."""
        self._sids += 1
        self._polled[key] = (sample, self._sids)

    def own_alarms(self, memory: tuple[str, ...], disk: tuple[str, ...]) -> None:
        """Node alarms this sidecar read on the API: announced while it polls them for
        the fleet, at once on every vhost when they changed."""
        if self.polls.own_alarms(memory, disk, self.clock()):
            self._announced.clear()

    def covered(self, key: QueueKey) -> bool:
        """Whether the fleet's poller of ``key`` is another member whose last sample is
        fresh (``sample_stale_after``): this sidecar need not ask the API itself."""
        now = self.clock()
        poller = self.table.poller(key, now)
        if poller == self.me:
            return False
        shared = self.table.shared_sample(key, poller, now)
        return (shared is not None
                and now - shared[1] + shared[0].age <= self.settings.sample_stale_after)

    def _with_samples(self, mine: dict[QueueKey, QueueReport], now: float
                      ) -> dict[QueueKey, QueueReport]:
        """The reports, each with this sidecar's last sample of the queues it polls."""
        for key in self._polled.keys() - mine.keys():
            del self._polled[key]
        out = dict(mine)
        for key, (sample, sid) in self._polled.items():
            if self.table.poller(key, now) == self.me:
                out[key] = replace(out[key], management=SharedSample.of(sample, now, sid))
        return out

    def _feed_samples(self, a: Announcement, now: float) -> None:
        """Feed the samples a member announced that this sidecar has not fed yet."""
        for name, report in a.queues.items():
            m, key = report.management, (a.vhost, name)
            if m is None or key not in self.host.controller.queues \
                    or self._fed.get((a.member, key)) == m.sid:
                continue
            self._fed[(a.member, key)] = m.sid
            self.counters.shared_samples += 1
            self.host.feed_shared_management(key, m.sample(now))

    # -- the tick: announce, expire, figures ---------------------------------------------
    async def _tick_forever(self) -> None:
        loop = asyncio.get_running_loop()
        interval = self.settings.interval
        next_at = loop.time()
        while True:
            late = loop.time() - next_at
            if late > self.counters.tick_late_max:
                self.counters.tick_late_max = late
            if late > LATE_SECONDS:
                event(log, "fleet_tick_late", logging.WARNING, fleet=self.name,
                      late_seconds=round(late, 3),
                      reason="the event loop ran late: announcements were late as much")
            self.tick()
            next_at += interval
            now = loop.time()
            if next_at < now:
                next_at = now
            await asyncio.sleep(next_at - now)

    def tick(self) -> None:
        """Announce on every vhost with policed queues that is due (``announce_due``);
        refresh the figures."""
        c = self.host.controller
        now = self.clock()
        vhosts = {k[0] for k in c.queues} | c.policies.vhosts
        self._reconcile(vhosts)
        self.table.expect(vhosts)
        mine = self._with_samples(my_reports(c, self.host.enforcement.counters, self.meter,
                                             now), now)
        hot = {k[0] for k in hot_queues(c)}
        for key in mine.keys() - self._since.keys():  # newly policed: announced at once
            self._since[key] = now
            self._announced.pop(key[0], None)
        self.seq += 1
        for vhost in sorted(vhosts):
            live = self._live.get(vhost)
            if live is None or not announce_due(self._announced.get(vhost), now,
                                                vhost in hot, self.settings.interval,
                                                self.settings.cold_interval):
                continue
            queues = {k[1]: r for k, r in mine.items() if k[0] == vhost}
            try:
                self._publish(live, Announcement(
                    self.me, self.started, self.seq, vhost, queues,
                    alarms=self.polls.announced_alarms(now),
                    topology=self.polls.announced_topology(vhost, now)))
                self._announced[vhost] = now
                self._said.update({(vhost, q): r for q, r in queues.items()})
            except AmqpClientError as exc:
                # The channel or connection is gone: the vhost's loop sets it up again.
                self._live.pop(vhost, None)
                if (lost := self._lost.get(vhost)) is not None:
                    lost.set()
                event(log, "fleet_channel_lost", logging.WARNING, fleet=self.name,
                      vhost=vhost, reason=_reason(exc))
        self._share(mine, now)
        self.polls.check_topology(vhosts, now)
        self._check_silent(now)
        self.figures = fleet_figures(self.name, self.table, c, mine, now)
        self._log_changes()
        heard = set(self.figures.members)
        for fed in [f for f in self._fed if f[0] not in heard or f[1] not in c.queues]:
            del self._fed[fed]

    def _share(self, mine: dict[QueueKey, QueueReport], now: float) -> None:
        """Hand the controller this sidecar's share rule of each policed queue: from the
        members' reports and its own as it last announced it (what the others compute
        with; ``FleetTable.rule``)."""
        c = self.host.controller
        for key in self._said.keys() - mine.keys():
            del self._said[key]
        for key in self._since.keys() - mine.keys():
            del self._since[key]
        for key, report in mine.items():
            c.set_share(key, self.table.rule(key, self._said.get(key, report), now,
                                             self._since.get(key)), now)

    # -- silent members: ask the broker whether their queue is still there ----------------
    def _check_silent(self, now: float) -> None:
        """For each silent member (unheard for the timeout, still counted), once per
        timeout: a passive declare of its own queue on the fleet connection of the vhost it
        was last heard on. Gone (404): its connection died, it leaves (``queue deleted``);
        there (405, another connection's exclusive queue): it is still connected, it keeps
        counting; no answer: nothing changes."""
        silent = self.table.silent_members(now)
        for member in self._checked.keys() - silent.keys():
            del self._checked[member]
        for member in silent:
            if member in self._checking or \
                    now - self._checked.get(member, -math.inf) < self.settings.timeout:
                continue
            vhost = self.table.vhost_of(member)
            live = self._live.get(vhost) if vhost is not None else None
            if live is None:
                continue
            self._checked[member] = now
            self._checking.add(member)
            self._spawn(self._check(member, live[0]), f"fleet-check-{member}")

    async def _check(self, member: str, client: AmqpClient) -> None:
        try:
            counts = await client.queue_counts(member_queue(self.name, member),
                                               self.settings.setup_timeout, lane="fleet-check")
        except QueueLocked:
            return  # its exclusive queue is there: its connection is up
        except (AmqpClientError, OSError, TimeoutError):
            return  # no answer says nothing
        finally:
            self._checking.discard(member)
        if counts is None:
            self.table.gone(member, self.clock())
            self._log_changes()

    def _announce(self, vhost: str, client: AmqpClient, channel: int,
                  leaving: bool = False) -> None:
        self.seq += 1
        self._publish((client, channel), Announcement(self.me, self.started, self.seq, vhost,
                                                      {}, leaving=leaving))

    def _publish(self, live: tuple[AmqpClient, int], a: Announcement) -> None:
        data = encode(a)
        client, channel = live
        client.publish_plain(channel, self.exchange, "", data)
        self._published[a.seq] = self.clock()
        if len(self._published) > 200:
            for seq in sorted(self._published)[:100]:
                del self._published[seq]
        self.counters.sent += 1
        self.counters.sent_bytes += len(data)

    def _on_message(self, delivery: Delivery) -> None:
        self.counters.received += 1
        self.counters.received_bytes += len(delivery.body)
        try:
            a = decode(delivery.body)
        except FleetMessageError as exc:
            self.counters.undecodable += 1
            self.table.ignored()
            if self.counters.undecodable == 1:
                event(log, "fleet_announcement_undecodable", logging.WARNING,
                      fleet=self.name, reason=str(exc))
            return
        if a is not None:
            now = self.clock()
            if a.member == self.me:
                self._echoed(a.seq, now)
            self.table.heard(a, now)
            if a.member != self.me:
                self._feed_samples(a, now)
                self.polls.feed(a, now)
            self._log_changes()

    def _echoed(self, seq: int, now: float) -> None:
        at = self._published.pop(seq, None)
        if at is None:
            return
        delay = now - at
        c = self.counters
        c.echo_delay_last = delay
        c.echo_delay_max = max(c.echo_delay_max, delay)
        if delay > LATE_SECONDS:
            event(log, "fleet_echo_late", logging.WARNING, fleet=self.name, seq=seq,
                  delay_seconds=round(delay, 3),
                  reason="its own announcement came back this late through the broker")

    def _log_changes(self) -> None:
        for ch in self.table.take_changes():
            if isinstance(ch, MemberJoined):
                self._announced.pop(ch.vhost, None)  # the newcomer hears this one at once
                event(log, "fleet_member_joined", fleet=self.name, member=ch.member,
                      vhost=ch.vhost, size=ch.size)
            elif isinstance(ch, MemberLeft):
                event(log, "fleet_member_left", fleet=self.name, member=ch.member,
                      reason=ch.reason, silent_seconds=ch.silent_seconds, size=ch.size)
            elif isinstance(ch, MemberSilent):
                event(log, "fleet_member_silent", logging.WARNING, fleet=self.name,
                      member=ch.member, silent_seconds=ch.silent_seconds, size=ch.size,
                      action=("still counted at an equal share until heard again or its "
                              "queue is gone; checking its queue on the broker"))
            elif isinstance(ch, MemberBack):
                event(log, "fleet_member_back", fleet=self.name, member=ch.member,
                      silent_seconds=ch.silent_seconds, size=ch.size)

    # -- one channel per vhost -----------------------------------------------------------
    def _reconcile(self, vhosts: set[str]) -> None:
        for vhost in vhosts - self._vhost_tasks.keys():
            self._vhost_tasks[vhost] = self._spawn(self._channel_loop(vhost),
                                                   f"fleet-{vhost}")
        for vhost in self._vhost_tasks.keys() - vhosts:
            self._vhost_tasks.pop(vhost).cancel()
            self._live.pop(vhost, None)

    async def _channel_loop(self, vhost: str) -> None:
        """Keep the vhost's fleet connection and channel up (reconnecting with backoff)."""
        failing, backoff = False, RETRY_SECONDS
        try:
            while True:
                client = self.host.new_client(vhost)
                try:
                    await client.connect(self.settings.setup_timeout)
                    channel = await self._setup(client, vhost)
                except (AmqpClientError, OSError, TimeoutError) as exc:
                    with contextlib.suppress(Exception):
                        await client.close()
                    self.counters.channel_failures += 1
                    if not failing:
                        event(log, "fleet_channel_failed", logging.WARNING, fleet=self.name,
                              vhost=vhost, reason=_reason(exc),
                              action=("retrying with backoff; until then this sidecar "
                                      "cannot hear the fleet and takes the fallback share"))
                    failing = True
                    await asyncio.sleep(backoff)
                    backoff = min(backoff * 2, 30.0)
                    continue
                if failing:
                    event(log, "fleet_channel_up", fleet=self.name, vhost=vhost)
                failing, backoff = False, RETRY_SECONDS
                try:
                    await self._announce_on(vhost, client, channel)
                finally:
                    with contextlib.suppress(Exception):
                        await client.close()
                await asyncio.sleep(RETRY_SECONDS)
        finally:
            self._live.pop(vhost, None)
            self._lost.pop(vhost, None)

    async def _announce_on(self, vhost: str, client: AmqpClient, channel: int) -> None:
        """Until the connection or the channel is lost, the tick announces on it."""
        self._live[vhost] = (client, channel)
        lost = self._lost[vhost] = asyncio.Event()
        waits = [asyncio.ensure_future(client.wait_closed()),
                 asyncio.ensure_future(lost.wait())]
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()
            if self._live.get(vhost, (None, 0))[0] is client:
                del self._live[vhost]

    async def _setup(self, client: AmqpClient, vhost: str) -> int:
        t = self.settings.setup_timeout
        await client.declare_exchange(self.exchange, "fanout", timeout=t)
        queue = member_queue(self.name, self.me)
        await client.declare_queue(queue, exclusive=True, auto_delete=True, timeout=t,
                                   arguments={"x-max-length": MEMBER_QUEUE_MAX})
        await client.bind_queue(queue, self.exchange, "", timeout=t)
        await client.consume(queue, functools.partial(self._on_delivery, vhost), timeout=t)
        return await client.open_plain_channel(t)

    def _on_delivery(self, _vhost: str, delivery: Delivery) -> None:
        self._on_message(delivery)

    # -- views ---------------------------------------------------------------------------
    def state(self) -> dict[str, object]:
        now = self.clock()
        fig = self.figures or fleet_figures(self.name, self.table, self.host.controller, {},
                                            now)
        return {**fleet_state(fig, self.table, self.counters, now),
                "polls": self.polls.state(now, self._vhost_tasks)}
