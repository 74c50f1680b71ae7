"""The spool at run time: recovery, group commit, the replayer, metrics, /state, the drain.

``SpoolService`` owns the ``SpoolManager`` (floodwall/spool/) of ``--spool-dir``; the relay's
0-9-1 gate (``PublishFlow``) writes client publishes to it under ``overflow: spool``.

- **Start**: takes ``SPOOL_DIR/.lock``, recovers every queue's spool (torn tails dropped,
  damaged bytes skipped, entries that are no spool left alone; one log line per queue and
  per skipped entry), then lets the gate append (``manager.accepting``).
- **Group commit**: an append wakes the commit loop, which waits the queue's policy
  ``group_commit_ms`` (``fsync: group``; 0 for ``always`` and ``never``) to gather more,
  then syncs every spool with new records on a worker thread (``fsync: never`` only moves
  the durable mark) and calls ``spool_durable(durable)`` on each gate owner that has it:
  that is when confirm-mode clients are acked. ``fsync: always`` is therefore "fsync as
  soon as anything is pending": appends made during one fsync share the next (the
  classic group commit without a timer), never an fsync per record on the event loop.
- **Replay** (the way back to the broker): one task per queue with backlog. It runs while the
  queue is not tripped, the broker has no alarm, and flow control has its first depth
  round; it reads records in order and publishes them on a confirm channel of its own
  connection to the queue's vhost (``Publisher``, a window of ``window`` unconfirmed). A
  record goes to its original exchange and routing key when the routing model sends those
  to exactly this queue, else through the default exchange with the queue's name (logged
  once per queue), always ``mandatory`` so an unroutable record (queue deleted) comes back
  and stays on disk instead of being acked into nowhere. Each replayed publish is booked on
  the queue's depth (``FlowController.forwarded``), so replay stops when the queue trips
  again; a record is deleted only after the broker's ack (``confirmed_through``). Delivery
  is at least once: records replayed but not yet confirmed when the proxy dies are
  replayed again after the restart.
- **Drain** (SIGTERM): ``drain(deadline)`` stops taking records and keeps replaying until
  the spool is empty or the deadline; what is left stays on disk for the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from pamqp import frame as pamqp_frame
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from floodwall.control.controller import FlowController, QueueKey, Router
from floodwall.control.policy import Fsync, SpoolSettings
from floodwall.enforce.amqp10.links import message_routing
from floodwall.enforce.ports import SpoolRefused
from floodwall.io.amqp10_client import Amqp10Client, Amqp10Sender
from floodwall.io.amqp_client import AmqpClient, AmqpClientError, Confirm, Publisher
from floodwall.io.switchboard import Switchboard
from floodwall.io.tasks import spawn
from floodwall.io.tls import UpstreamTlsContext
from floodwall.io.upstreams import Upstreams
from floodwall.ops.config import AmqpCredentials
from floodwall.ops.logs import event
from floodwall.spool.events import ReplayEnded, SpoolFilling
from floodwall.spool.log import QueueSpool, ReadPosition, SpoolError
from floodwall.spool.manager import SpoolLimits, SpoolManager
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp10.addresses import parse_target, queues_for

log = logging.getLogger("floodwall.spool")

_HEADERS_FLAG = 1 << 13  # basic properties: the headers table is present
_DEFAULT_SPOOL = SpoolSettings()


@dataclass(frozen=True)
class SpoolServiceSettings:
    directory: Path
    upstreams: Upstreams
    credentials: AmqpCredentials = field(default_factory=AmqpCredentials)
    limits: SpoolLimits = field(default_factory=SpoolLimits)
    window: int = 1000  # unconfirmed replayed publishes per queue
    batch_bytes: int = 1 << 20  # records read from disk at a time
    connect_timeout: float = 5.0
    check_interval: float = 0.05  # how often waiting replayers look again
    retry_min: float = 0.5
    retry_max: float = 30.0
    tls: UpstreamTlsContext | None = None  # amqps for both replayers


@dataclass
class QueueReplay:
    """What the replayer did for one queue (for /state and metrics)."""

    state: str = "idle"
    replayed: int = 0  # records the broker confirmed
    replayed_bytes: int = 0
    sessions: int = 0
    rerouted: bool = False  # published via the default exchange
    last_error: str | None = None


@dataclass
class SessionResult:
    confirmed: int = 0
    confirmed_bytes: int = 0
    published: int = 0
    reason: str = "empty"
    seconds: float = 0.0  # how long the session took (the service sets it)


def record_headers(properties: bytes) -> dict[str, object] | None:
    """The headers table of a record's content header payload, decoded only if present."""
    if len(properties) < 14 or not int.from_bytes(properties[12:14], "big") & _HEADERS_FLAG:
        return None
    raw = b"".join((b"\x02\x00\x01", len(properties).to_bytes(4, "big"), properties, b"\xce"))
    try:
        _, _, value = pamqp_frame.unmarshal(raw)
    except Exception:
        return None
    headers = getattr(getattr(value, "properties", None), "headers", None)
    return dict(headers) if isinstance(headers, dict) else None


SendAmqp10 = Callable[[SpoolRecord], Awaitable["asyncio.Future[Confirm]"]]
"""Sends one AMQP 1.0 record; its future resolves as the broker settles it."""


async def replay_session(spool: QueueSpool, publisher: Publisher,
                         target: Callable[[SpoolRecord], tuple[str, str]],
                         stop_reason: Callable[[], str | None],
                         on_sent: Callable[[SpoolRecord], None] | None = None,
                         on_confirmed: Callable[[int, int], None] | None = None,
                         durable_wait: Callable[[], asyncio.Event] | None = None,
                         batch_bytes: int = 1 << 20, settle_timeout: float = 10.0,
                         amqp10: SendAmqp10 | None = None,
                         queue_exists: Callable[[], Awaitable[bool]] | None = None
                         ) -> SessionResult:
    """Publish ``spool``'s records in order until it is empty, ``stop_reason()`` says why
    not, or the broker refuses one; delete each record once confirmed (in order: a record
    is confirmed only when every record before it was). Returns what happened.

    AMQP 0-9-1 records go through ``publisher`` to ``target(rec)``; AMQP 1.0 records through
    ``amqp10`` (over AMQP 1.0, to their address). Where the path changes (0-9-1 to 1.0, or
    another 1.0 address), what is in flight is confirmed first: two connections or links
    keep no order between them, the queue must get its records in spool order.

    AMQP 1.0 has no ``mandatory``: RabbitMQ 3.10 accepts a transfer to a queue that does not
    exist and drops it. So before each batch with a 1.0 record ``queue_exists()`` is asked;
    False stops the session as "returned" (the records stay on disk). A queue deleted in the
    middle of a batch can still lose that batch's 1.0 records (at most ``batch_bytes``).

    ``durable_wait()`` gives an event set when more records become durable (else the
    session polls). Whatever is in flight at the end is waited for (``settle_timeout``).
    """
    session = ReplaySession(spool, publisher, target, stop_reason, on_sent, on_confirmed,
                            durable_wait, batch_bytes, settle_timeout, amqp10, queue_exists)
    return await session.run()


@dataclass
class ReplaySession:
    """One ``replay_session``: its records in flight, where it is in the spool, why it ended."""

    spool: QueueSpool
    publisher: Publisher
    target: Callable[[SpoolRecord], tuple[str, str]]
    stop_reason: Callable[[], str | None]
    on_sent: Callable[[SpoolRecord], None] | None
    on_confirmed: Callable[[int, int], None] | None
    durable_wait: Callable[[], asyncio.Event] | None
    batch_bytes: int
    settle_timeout: float
    amqp10: SendAmqp10 | None
    queue_exists: Callable[[], Awaitable[bool]] | None
    result: SessionResult = field(default_factory=SessionResult)
    inflight: deque[tuple[SpoolRecord, asyncio.Future[Confirm]]] = field(default_factory=deque)
    failed: str | None = None
    position: ReadPosition | None = None
    path: str | None = None  # where the last record went: None 0-9-1, else its 1.0 address

    async def run(self) -> SessionResult:
        after = self.spool.confirmed_seq
        try:
            while self.failed is None:
                why = self.stop_reason()
                if why is not None:
                    self.result.reason = why
                    break
                wake = self.durable_wait() if self.durable_wait is not None else None
                try:
                    batch = await asyncio.to_thread(self.spool.read_batch, after,
                                                    self.batch_bytes, self.position)
                except SpoolError as exc:
                    self.failed = f"read error: {exc}"
                    break
                if not batch:
                    if await self._idle(wake):
                        break
                    continue
                if not self.inflight:
                    self.spool.oldest_set(batch[0][0].accepted_at)
                if not await self._queue_there(batch):
                    break
                after = await self._send(batch, after)
                await asyncio.sleep(0)  # the relay shares this loop
        finally:
            if self.inflight and self.failed is None:
                await asyncio.wait([f for _, f in self.inflight], timeout=self.settle_timeout)
            self.settle()
        if self.failed is not None:
            self.result.reason = self.failed
        return self.result

    def settle(self) -> None:
        """Delete what the broker confirmed, in order; note a refusal."""
        inflight = self.inflight
        count = nbytes = last = 0
        while inflight and inflight[0][1].done():
            rec, fut = inflight[0]
            outcome = fut.result()
            if outcome is not Confirm.ACK:
                self.failed = self.failed or outcome.value
                break
            inflight.popleft()
            count += 1
            nbytes += rec.size
            last = rec.seq
        if count:
            self.spool.confirmed_through(last, nbytes, count)
            if inflight:
                self.spool.oldest_set(inflight[0][0].accepted_at)
            self.result.confirmed += count
            self.result.confirmed_bytes += nbytes
            if self.on_confirmed is not None:
                self.on_confirmed(count, nbytes)

    async def _idle(self, wake: asyncio.Event | None) -> bool:
        """Nothing new to read: settle, wait a moment for a confirm or a durable record.
        True when the session is over (empty, or refused)."""
        self.settle()
        if self.failed is not None:
            return True
        if not self.inflight and self.spool.empty:
            self.result.reason = "empty"
            return True
        waits: list[asyncio.Future[Any]] = [self.inflight[0][1]] if self.inflight else []
        waiter = asyncio.ensure_future(wake.wait()) if wake is not None else None
        if waiter is not None:
            waits.append(waiter)
        if waits:
            await asyncio.wait(waits, timeout=0.05, return_when=asyncio.FIRST_COMPLETED)
        else:
            await asyncio.sleep(0.01)
        if waiter is not None:
            waiter.cancel()
        return False

    async def _queue_there(self, batch: list[tuple[SpoolRecord, ReadPosition]]) -> bool:
        """A batch with a 1.0 record goes only to a queue that exists (1.0 has no
        ``mandatory``); False (the session ends) when it does not or cannot be asked."""
        if self.queue_exists is None or not any(rec.amqp10 for rec, _ in batch):
            return True
        try:
            there = await self.queue_exists()
        except (AmqpClientError, OSError, TimeoutError) as exc:
            self.failed = f"lost: {exc or type(exc).__name__}"
            return False
        if not there:
            self.failed = Confirm.RETURNED.value
        return there

    async def _send(self, batch: list[tuple[SpoolRecord, ReadPosition]], after: int) -> int:
        """Publish the batch in order (what is in flight is confirmed first where the path
        changes); returns the last seq sent."""
        for rec, pos in batch:
            if self.stop_reason() is not None:
                break
            rec_path = rec.address if rec.amqp10 else None
            if self.inflight and rec_path != self.path:
                await asyncio.wait([f for _, f in self.inflight], timeout=self.settle_timeout)
                self.settle()
                if self.failed is None and self.inflight:
                    self.failed = "lost: no confirm before switching connection"
                if self.failed is not None:
                    break
            self.path = rec_path
            fut = await self._publish(rec)
            if fut is None:
                break
            self.inflight.append((rec, fut))
            self.result.published += 1
            after, self.position = rec.seq, pos
            if self.on_sent is not None:
                self.on_sent(rec)
            if self.inflight[0][1].done():
                self.settle()
                if self.failed is not None:
                    break
        return after

    async def _publish(self, rec: SpoolRecord) -> asyncio.Future[Confirm] | None:
        """One record, over 0-9-1 or 1.0; None (the session fails) when it cannot go."""
        try:
            if rec.amqp10:
                if self.amqp10 is None:
                    self.failed = "an AMQP 1.0 record, and no AMQP 1.0 publisher"
                    return None
                return await self.amqp10(rec)
            exchange, routing_key = self.target(rec)
            return await self.publisher.publish(exchange, routing_key, rec.properties,
                                                rec.body, mandatory=True)
        except (AmqpClientError, OSError, TimeoutError) as exc:
            self.failed = f"lost: {exc or type(exc).__name__}"
            return None


class Amqp10Records:
    """Sends one queue's AMQP 1.0 records: a sender link per address, on the vhost's AMQP
    1.0 connection (asked for at the first 1.0 record, so a 0-9-1-only spool opens none)."""

    def __init__(self, client: Callable[[], Awaitable[Amqp10Client]], queue: str,
                 address_for: Callable[[SpoolRecord], str | None], timeout: float) -> None:
        self._client = client
        self._queue = queue
        self._address_for = address_for  # None: straight to the queue
        self._timeout = timeout
        self.senders: dict[str | None, Amqp10Sender] = {}

    async def __call__(self, rec: SpoolRecord) -> asyncio.Future[Confirm]:
        address = self._address_for(rec)
        sender = self.senders.get(address)
        if sender is None:
            client = await self._client()
            target = address if address is not None else client.queue_address(self._queue)
            sender = self.senders[address] = await client.open_sender(target, self._timeout)
        return await sender.send(rec.body, rec.message_format)

    async def close(self) -> None:
        for sender in self.senders.values():
            with contextlib.suppress(Exception):
                await sender.close()
        self.senders.clear()


async def queue_exists(client: AmqpClient, queue: str) -> bool:
    """Whether ``queue`` is there (a passive declare on ``client``'s probe channel)."""
    return await client.queue_counts(queue) is not None


class _Client(Protocol):
    """What the spool needs of its own upstream connections (0-9-1 and 1.0)."""

    @property
    def connected(self) -> bool: ...

    async def connect(self, timeout: float) -> None: ...

    async def close(self) -> None: ...


C = TypeVar("C", bound=_Client)


class DiskSpoolPort:
    """The gates' spool port (``enforce.ports.SpoolPort``) over the spool on disk: a record
    is stamped with the wall clock and written within the limits; ``appended(key)`` is told
    after each (the service marks the queue backlogged and wakes the group commit)."""

    def __init__(self, manager: SpoolManager, appended: Callable[[QueueKey], None],
                 clock: Callable[[], float] = time.time) -> None:
        self.manager = manager
        self._appended = appended
        self._clock = clock

    @property
    def accepting(self) -> bool:
        return self.manager.accepting

    def has_backlog(self, key: QueueKey) -> bool:
        return self.manager.has_backlog(key)

    def room(self, key: QueueKey, size: int, max_bytes: int) -> str | None:
        try:
            refused = self.manager.refusal(key, size, max_bytes)
        except OSError as exc:  # the free-space check (statvfs) failed: no room then
            return f"the spool's free space cannot be read: {exc.strerror or exc}"
        return None if refused is None else refused[1]

    def append(self, key: QueueKey, record: SpoolRecord, max_bytes: int) -> int:
        """SpoolRefused on a limit, while not accepting, or when the write fails."""
        try:
            seq = self.manager.append(key, dataclasses.replace(record, accepted_at=self._clock()),
                                      max_bytes)
        except SpoolError as exc:
            raise SpoolRefused(str(exc)) from None
        self._appended(key)
        return seq


class SpoolReplayer:
    """The spool service's replay (``SpoolService`` extends it): per queue with a backlog, a
    replayer that waits until the queue may take it, then runs replay sessions through the
    spool's own connections, backing off when the upstream fails."""

    settings: SpoolServiceSettings
    board: Switchboard
    controller: FlowController
    router: Router | None
    clock: Callable[[], float]
    manager: SpoolManager
    replays: dict[QueueKey, QueueReplay]
    _ready: Callable[[], bool] | None
    _depth_known: Callable[[QueueKey], bool] | None  # False: unknown since a reconnect
    _warm: bool
    _clients: dict[str, AmqpClient]
    _clients10: dict[str, Amqp10Client]
    _connecting: dict[tuple[str, str], asyncio.Lock]
    _replayers: dict[QueueKey, asyncio.Task[None]]
    _durable: asyncio.Event
    _stopping: asyncio.Event  # stop(): replayers end, their waits cut short
    _spooling: set[QueueKey]

    def hold_reason(self, key: QueueKey) -> str | None:
        """Why ``key`` must not be replayed into now; None: go."""
        if self._stopping.is_set():
            return "stopping"
        if not self._warm:
            if self._ready is None or not self._ready():
                return "flow control warming up"
            self._warm = True
        if self.controller.alarm_reason is not None:
            return "broker alarm"
        q = self.controller.queues.get(key)
        if q is not None and q.tripped:
            return "queue tripped"
        if q is not None and self._depth_known is not None and not self._depth_known(key):
            return "depth unknown"  # after a reconnect: no replay on a figure from before it
        return None

    def _target(self, key: QueueKey, replay: QueueReplay
                ) -> Callable[[SpoolRecord], tuple[str, str]]:
        vhost, queue = key
        just_this = frozenset({queue})
        router = self.router

        def target(rec: SpoolRecord) -> tuple[str, str]:
            if router is not None and router.route(
                    vhost, rec.exchange, rec.routing_key,
                    record_headers(rec.properties)) == just_this:
                return rec.exchange, rec.routing_key
            if (rec.exchange, rec.routing_key) == ("", queue):
                return "", queue
            if not replay.rerouted:
                replay.rerouted = True
                event(log, "spool_replay_rerouted", logging.WARNING, vhost=vhost, queue=queue,
                      exchange=rec.exchange, routing_key=rec.routing_key,
                      reason="the routing model does not send that to exactly this queue "
                             "(now)", action="publishing via the default exchange to the queue")
            return "", queue

        return target

    def _address(self, key: QueueKey, replay: QueueReplay
                 ) -> Callable[[SpoolRecord], str | None]:
        """Where an AMQP 1.0 record goes: its own address when the routing model sends that
        to exactly this queue, else straight to the queue (None; logged once per queue)."""
        vhost, queue = key
        just_this = frozenset({queue})
        direct: set[str] = set()  # addresses that name the queue itself (no lookup again)

        def address(rec: SpoolRecord) -> str | None:
            given = rec.address
            if given in direct:
                return given
            destination = parse_target(given)
            if destination is not None:
                if destination.exchange == "" and destination.routing_key == queue:
                    direct.add(given)
                    return given
                subject = None
                if destination.per_message:
                    found = message_routing(rec.body, 0, len(rec.body))
                    subject = found[1] if found is not None else None
                if queues_for(self.controller, vhost, destination, subject) == just_this:
                    return rec.address
            if not replay.rerouted:
                replay.rerouted = True
                event(log, "spool_replay_rerouted", logging.WARNING, vhost=vhost, queue=queue,
                      address=rec.address, protocol="amqp10",
                      reason="the routing model does not send that to exactly this queue "
                             "(now)", action="sending straight to the queue")
            return None

        return address

    async def _client(self, vhost: str) -> AmqpClient:
        return await self._connected(self._clients, "amqp091", vhost,
                                     functools.partial(AmqpClient, tls=self.settings.tls))

    async def _client10(self, vhost: str) -> Amqp10Client:
        return await self._connected(self._clients10, "amqp10", vhost,
                                     functools.partial(Amqp10Client, tls=self.settings.tls))

    async def _connected(self, clients: dict[str, C], kind: str, vhost: str,
                         factory: Callable[[Upstreams, str, str, str], C]) -> C:
        """The spool's own connection of ``kind`` to ``vhost``, (re)connected if need be."""
        client = clients.get(vhost)
        if client is not None and client.connected:
            return client
        lock = self._connecting.setdefault((kind, vhost), asyncio.Lock())
        async with lock:
            client = clients.get(vhost)
            if client is not None and client.connected:
                return client
            if client is not None:
                with contextlib.suppress(Exception):
                    await client.close()
            s = self.settings
            client = factory(s.upstreams, s.credentials.username,
                             s.credentials.password, vhost)
            try:
                await client.connect(s.connect_timeout)
            except BaseException:
                with contextlib.suppress(Exception):
                    await client.close()
                raise
            clients[vhost] = client
            return client

    # -- replay ------------------------------------------------------------------------
    async def _replay_supervisor(self) -> None:
        while not self._stopping.is_set():
            for key in list(self.manager.backlogged()):
                if key not in self._replayers:
                    task = asyncio.get_running_loop().create_task(
                        self._replay_queue(key), name=f"spool-replay-{key[1]}")
                    self._replayers[key] = task
                    task.add_done_callback(functools.partial(self._replayer_done, key))
            await self._pause(self.settings.check_interval)

    async def _pause(self, seconds: float) -> None:
        """Wait ``seconds`` between replay attempts, or until ``stop()``: a replayer backing
        off from a missing queue does not hold the proxy's shutdown for its backoff."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stopping.wait(), seconds)

    def _replayer_done(self, key: QueueKey, task: asyncio.Task[None]) -> None:
        if self._replayers.get(key) is task:
            del self._replayers[key]
        if not task.cancelled() and task.exception() is not None:
            event(log, "spool_replayer_failed", logging.ERROR, vhost=key[0], queue=key[1],
                  reason=repr(task.exception()))

    async def _replay_queue(self, key: QueueKey) -> None:
        vhost, queue = key
        replay = self.replays.setdefault(key, QueueReplay())
        s = self.settings
        backoff = s.retry_min
        announced: str | None = None
        try:
            while not self._stopping.is_set():
                spool = self.manager.spools.get(key)
                if spool is None or spool.empty:
                    self._spooling.discard(key)
                    self.controller.set_backlog(key, False)  # FIFO holds may go now
                    self.board.settle()
                    break
                why = self.hold_reason(key)
                if why is not None:
                    replay.state = f"waiting: {why}"
                    await self._pause(s.check_interval)
                    continue
                try:
                    client = await self._client(vhost)
                    publisher = await client.open_publisher(s.window, s.connect_timeout)
                except (AmqpClientError, OSError, TimeoutError) as exc:
                    reason = str(exc) or type(exc).__name__
                    replay.state = f"waiting: upstream ({reason})"
                    if announced != reason:
                        announced = reason
                        event(log, "spool_replay_upstream_failed", logging.WARNING,
                              vhost=vhost, queue=queue, reason=reason, retry_in=backoff)
                    await self._pause(backoff)
                    backoff = min(backoff * 2, s.retry_max)
                    continue
                announced = None
                result = await self._replay_once(key, replay, spool, client, publisher)
                failed = result.reason not in ("empty", "queue tripped", "broker alarm",
                                               "depth unknown",
                                               "stopping", "flow control warming up")
                self._log_session(key, spool, result, failed, backoff)
                if failed:
                    replay.last_error = result.reason
                    if result.reason == "returned":
                        event(log, "spool_queue_unroutable", logging.ERROR, vhost=vhost,
                              queue=queue, records=spool.pending_records,
                              action="kept on disk; re-create the queue, or "
                                     "`floodwall spool purge` them")
                    await self._pause(backoff)
                    backoff = min(backoff * 2, s.retry_max)
                else:
                    backoff = s.retry_min
        finally:
            if replay.state == "replaying":
                replay.state = "idle"

    async def _replay_once(self, key: QueueKey, replay: QueueReplay, spool: QueueSpool,
                           client: AmqpClient, publisher: Publisher) -> SessionResult:
        """One replay session of ``key``'s spool through ``publisher`` (1.0 records through
        the vhost's own 1.0 connection)."""
        vhost, queue = key
        s = self.settings
        replay.state = "replaying"
        replay.sessions += 1
        event(log, "spool_replay_started", vhost=vhost, queue=queue,
              records=spool.pending_records, bytes=spool.pending_bytes,
              session=replay.sessions)
        started = asyncio.get_running_loop().time()
        records10 = Amqp10Records(lambda: self._client10(vhost), queue,
                                  self._address(key, replay), s.connect_timeout)
        try:
            result = await replay_session(
                spool, publisher, self._target(key, replay),
                lambda: self.hold_reason(key),
                on_sent=functools.partial(self._replayed, key),
                on_confirmed=lambda n, b: self._confirmed(replay, n, b),
                durable_wait=lambda: self._durable, batch_bytes=s.batch_bytes,
                amqp10=records10, queue_exists=functools.partial(queue_exists, client, queue))
        finally:
            await records10.close()
            await publisher.close()
        result.seconds = asyncio.get_running_loop().time() - started
        replay.state = "idle" if result.reason == "empty" else result.reason
        return result

    def _log_session(self, key: QueueKey, spool: QueueSpool, result: SessionResult,
                     failed: bool, backoff: float) -> None:
        """The line and the telemetry event a replay session ends with."""
        seconds = result.seconds
        event(log, "spool_replay_stopped",
              logging.WARNING if failed else logging.INFO, vhost=key[0], queue=key[1],
              reason=result.reason, replayed=result.confirmed,
              replayed_bytes=result.confirmed_bytes, seconds=round(seconds, 3),
              rate=round(result.confirmed / seconds) if seconds > 0 else 0,
              records_left=spool.pending_records, bytes_left=spool.pending_bytes,
              **({"action": f"records kept; retrying in {backoff}s"} if failed else {}))
        self.board.report(ReplayEnded(
            key, result.reason, result.confirmed, result.confirmed_bytes,
            round(seconds, 3), spool.pending_records, spool.pending_bytes))

    def _replayed(self, key: QueueKey, rec: SpoolRecord) -> None:
        """A record was sent to the broker: it is booked on the queue's ledger."""
        self.controller.forwarded(key[0], frozenset({key[1]}), len(rec.body),
                                  self.board.clock())
        if self.board.pending:
            self.board.settle()

    def _confirmed(self, replay: QueueReplay, count: int, nbytes: int) -> None:
        replay.replayed += count
        replay.replayed_bytes += nbytes


class SpoolService(SpoolReplayer):
    """``--spool-dir`` at run time; construct, hand ``port`` to the gates as their spool
    (``Enforcement.spool``), ``start()``."""

    def __init__(self, settings: SpoolServiceSettings, board: Switchboard,
                 router: Router | None = None, ready: Callable[[], bool] | None = None,
                 clock: Callable[[], float] = time.time,
                 depth_known: Callable[[QueueKey], bool] | None = None) -> None:
        self.settings = settings
        self._depth_known = depth_known
        self.board = board
        self.controller: FlowController = board.controller
        self.router = router
        self._ready = ready
        self._warm = ready is None
        self.clock = clock
        self.manager = SpoolManager(settings.directory, settings.limits)
        self.port = DiskSpoolPort(self.manager, self._appended, clock)
        self.manager.accepting = False  # until start() has recovered what is on disk
        self.replays: dict[QueueKey, QueueReplay] = {}
        self.commits = 0
        self._clients: dict[str, AmqpClient] = {}
        self._clients10: dict[str, Amqp10Client] = {}
        self._connecting: dict[tuple[str, str], asyncio.Lock] = {}
        self._replayers: dict[QueueKey, asyncio.Task[None]] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._wake_commit: asyncio.Event | None = None
        self._durable = asyncio.Event()
        self._stopping = asyncio.Event()
        self._started = False
        self._sync_error_logged: dict[QueueKey, str] = {}
        self._spooling: set[QueueKey] = set()  # queues whose spool filled since it was empty
        self.recovery: dict[str, object] = {}  # what start() found on disk, for /state
        self.collector = SpoolCollector(self)

    # -- lifecycle ---------------------------------------------------------------------
    async def start(self) -> None:
        """Lock and recover the spool directory, then start committing and replaying."""
        self.manager.lock()
        t0 = time.monotonic()
        reports = await asyncio.to_thread(self.manager.recover)
        for key, r in reports.items():
            level = logging.WARNING if (r.torn_tail_bytes or r.problems) else logging.INFO
            event(log, "spool_recovered", level, vhost=key[0], queue=key[1],
                  records=r.records, bytes=r.bytes, segments=r.segments,
                  torn_tail_bytes=r.torn_tail_bytes, skipped_bytes=r.skipped_bytes,
                  lost_records=r.lost_records,
                  corrupt="; ".join(r.corrupt) if r.corrupt else "none",
                  skipped_entries="; ".join(r.bad_entries) if r.bad_entries else "none")
        self.recovery = {
            "torn_tail_bytes": sum(r.torn_tail_bytes for r in reports.values()),
            "skipped_bytes": sum(r.skipped_bytes for r in reports.values()),
            "lost_records": sum(r.lost_records for r in reports.values()),
            "problems": [f"{v}/{q}: {p}" for (v, q), r in reports.items() for p in r.problems]
            + [f"{e.path}: {e.reason}" for e in self.manager.unreadable]}
        for entry in self.manager.unreadable:
            event(log, "spool_entry_skipped", logging.WARNING, path=entry.path,
                  reason=entry.reason, action="left as it is; the other queues are recovered")
        event(log, "spool_opened", directory=self.manager.root, queues=len(reports),
              records=sum(r.records for r in reports.values()),
              bytes=sum(r.bytes for r in reports.values()),
              seconds=round(time.monotonic() - t0, 3),
              total_max=self.manager.limits.total_max_bytes,
              min_free=self.manager.limits.min_free_bytes)
        for key in self.manager.backlogged():
            self.controller.set_backlog(key, True)  # recovered records come first
        self._wake_commit = asyncio.Event()
        self.manager.accepting = True
        self._started = True
        self._spawn(self._commit_loop(), "spool-commit")
        self._spawn(self._replay_supervisor(), "spool-replay")

    async def drain(self, deadline: float) -> tuple[int, int]:
        """SIGTERM: take no more records; replay until empty or ``deadline`` (the running
        loop's ``time()``); returns the (records, bytes) left on disk."""
        self.manager.accepting = False
        loop = asyncio.get_running_loop()
        records, nbytes = self.left()
        event(log, "spool_draining", records=records, bytes=nbytes,
              seconds=round(max(0.0, deadline - loop.time()), 1))
        await self.commit()
        while True:
            left = deadline - loop.time()
            if not self.left()[0] or left <= 0:
                break
            await asyncio.sleep(min(0.05, left))
        records, nbytes = self.left()
        event(log, "spool_drained", logging.WARNING if records else logging.INFO,
              records_left=records, bytes_left=nbytes,
              queues_left=sum(1 for _ in self.manager.backlogged()))
        return records, nbytes

    async def stop(self) -> tuple[int, int]:
        """Stop replaying (what is in flight is awaited briefly), make every record
        durable, close; logs and returns the (records, bytes) left on disk."""
        self._stopping.set()
        self.manager.accepting = False
        replayers = list(self._replayers.values())
        if replayers:
            _, pending = await asyncio.wait(replayers, timeout=10)
            for task in pending:
                task.cancel()
            await asyncio.gather(*replayers, return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self._started:
            await asyncio.to_thread(self.manager.sync, True)
        clients: list[_Client] = [*self._clients.values(), *self._clients10.values()]
        for client in clients:
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()
        self._clients10.clear()
        records, nbytes = self.left()
        self.manager.close()
        event(log, "spool_stopped", logging.WARNING if records else logging.INFO,
              records_left=records, bytes_left=nbytes, directory=self.manager.root)
        return records, nbytes

    def left(self) -> tuple[int, int]:
        """(records, bytes) in the spool, not yet confirmed by the broker."""
        spools = list(self.manager.spools.values())
        return sum(s.pending_records for s in spools), sum(s.pending_bytes for s in spools)

    def _spawn(self, coro: Any, name: str) -> asyncio.Task[Any]:
        return spawn(self._tasks, coro, name, log, "spool_task_failed")

    # -- group commit ------------------------------------------------------------------
    def _appended(self, key: QueueKey) -> None:
        if key not in self._spooling:  # the queue's spool starts filling: one event
            self._spooling.add(key)
            self.board.report(SpoolFilling(key))
        self.controller.set_backlog(key, True)
        if self._wake_commit is not None:
            self._wake_commit.set()

    def spool_settings(self, key: QueueKey) -> SpoolSettings:
        q = self.controller.queues.get(key)
        policy = q.policy if q is not None else self.controller.policies.for_queue(*key)
        return policy.spool if policy is not None else _DEFAULT_SPOOL

    def _fsyncs(self, key: QueueKey) -> bool:
        return self.spool_settings(key).fsync is not Fsync.NEVER

    async def _commit_loop(self) -> None:
        wake = self._wake_commit
        assert wake is not None
        while True:
            await wake.wait()
            pending = self.manager.unsynced()
            waits = [s.group_commit_ms / 1000 for s in map(self.spool_settings, pending)
                     if s.fsync is Fsync.GROUP]
            if waits and len(waits) == len(pending):
                await asyncio.sleep(min(waits))
            wake.clear()
            await self.commit()
            if self.manager.sync_errors:
                await asyncio.sleep(0.1)  # then try again (the records stay unacked)
                wake.set()

    async def commit(self) -> dict[QueueKey, int]:
        """Sync every spool with new records; tell the gate what is durable now."""
        pending = self.manager.unsynced()
        if not pending:
            return {}
        fsyncs = {k: self._fsyncs(k) for k in pending}  # (policies read here, on the loop)
        if any(fsyncs.values()):
            durable = await asyncio.to_thread(self.manager.sync,
                                              lambda k: fsyncs.get(k, True))
        else:
            durable = self.manager.sync(False)
        self.commits += 1
        self._report_sync_errors()
        if durable:
            self.board.spool_durable(durable)
            ev, self._durable = self._durable, asyncio.Event()
            ev.set()
        return durable

    def _report_sync_errors(self) -> None:
        errors = self.manager.sync_errors
        for key, reason in errors.items():
            if self._sync_error_logged.get(key) != reason:
                event(log, "spool_sync_failed", logging.ERROR, vhost=key[0], queue=key[1],
                      reason=reason, action="records stay unacked; retrying")
        for key in [k for k in self._sync_error_logged if k not in errors]:
            event(log, "spool_sync_recovered", vhost=key[0], queue=key[1])
        self._sync_error_logged = dict(errors)

    # -- views -------------------------------------------------------------------------
    def queues(self) -> Iterator[tuple[QueueKey, QueueSpool]]:
        return iter(sorted(self.manager.spools.items()))

    def state(self) -> dict[str, object]:
        now = self.clock()
        records, nbytes = self.left()
        queues: list[dict[str, object]] = []
        for key, spool in self.queues():
            replay = self.replays.get(key, QueueReplay())
            if spool.empty and not replay.replayed:
                continue
            oldest = spool.oldest_accepted_at
            doc: dict[str, object] = {
                "vhost": key[0], "queue": key[1], "records": spool.pending_records,
                "bytes": spool.pending_bytes, "segments": spool.segment_count,
                "oldest_age_seconds": round(max(0.0, now - oldest), 3)
                if oldest is not None and not spool.empty else None,
                "replay": replay.state, "replayed": replay.replayed,
            }
            if replay.rerouted:
                doc["rerouted"] = True
            if replay.last_error:
                doc["last_error"] = replay.last_error
            if key in self.manager.sync_errors:
                doc["sync_error"] = self.manager.sync_errors[key]
            queues.append(doc)
        return {
            "directory": str(self.manager.root),
            "accepting": self.manager.accepting,
            "records": records,
            "bytes": nbytes,
            "limits": {"total_max_bytes": self.manager.limits.total_max_bytes,
                       "min_free_bytes": self.manager.limits.min_free_bytes},
            "write_errors": self.manager.write_errors,
            "full": dict(self.manager.full),
            "recovery": self.recovery,
            "queues": queues,
        }


class SpoolCollector(Collector):
    """``floodwall_spool_*`` families, read off the service at scrape time."""

    def __init__(self, service: SpoolService) -> None:
        self.service = service

    def collect(self) -> Iterator[Metric]:
        svc = self.service
        now = svc.clock()
        labels = ["vhost", "queue"]
        size = GaugeMetricFamily("floodwall_spool_bytes",
                                 "Bytes of spooled records not yet confirmed by the broker.",
                                 labels=labels)
        count = GaugeMetricFamily("floodwall_spool_records",
                                  "Spooled records not yet confirmed by the broker.",
                                  labels=labels)
        age = GaugeMetricFamily("floodwall_spool_oldest_record_age_seconds",
                                "Age of the oldest spooled record (0 when none).",
                                labels=labels)
        replayed = CounterMetricFamily("floodwall_spool_replayed_records",
                                       "Spooled records replayed and confirmed by the broker.",
                                       labels=labels)
        replayed_bytes = CounterMetricFamily(
            "floodwall_spool_replayed_bytes", "Bytes of spooled records replayed and "
            "confirmed by the broker.", labels=labels)
        for key, spool in svc.queues():
            values = list(key)
            size.add_metric(values, spool.pending_bytes)
            count.add_metric(values, spool.pending_records)
            oldest = spool.oldest_accepted_at
            age.add_metric(values, max(0.0, now - oldest)
                           if oldest is not None and not spool.empty else 0.0)
            replay = svc.replays.get(key)
            replayed.add_metric(values, replay.replayed if replay else 0)
            replayed_bytes.add_metric(values, replay.replayed_bytes if replay else 0)
        yield from (size, count, age, replayed, replayed_bytes, self._limits(labels))
        yield from self._totals()

    def _totals(self) -> Iterator[Metric]:
        """The families of the spool as a whole."""
        svc = self.service
        c = svc.board.enforcement.counters
        appended = CounterMetricFamily("floodwall_spool_appended_records",
                                       "Client publishes written to the spool.")
        appended.add_metric([], c.spooled_records)
        yield appended
        appended_bytes = CounterMetricFamily("floodwall_spool_appended_bytes",
                                             "Bytes of records written to the spool.")
        appended_bytes.add_metric([], c.spooled_bytes)
        yield appended_bytes
        errors = CounterMetricFamily("floodwall_spool_write_errors",
                                     "Spool appends and syncs that failed (disk full, I/O).")
        errors.add_metric([], svc.manager.write_errors)
        yield errors
        full = CounterMetricFamily("floodwall_spool_full",
                                   "Appends the spool refused, by the limit that said no.",
                                   labels=["reason"])
        for reason in ("queue_limit", "total_limit", "min_free", "draining",
                       "message_size"):
            full.add_metric([reason], svc.manager.full[reason])
        yield full
        fallbacks = CounterMetricFamily("floodwall_spool_fallbacks",
                                        "Publishes held because the spool refused them.")
        fallbacks.add_metric([], c.spool_fallbacks)
        yield fallbacks
        total = GaugeMetricFamily("floodwall_spool_total_bytes",
                                  "Bytes in the spool, all queues.")
        total.add_metric([], svc.left()[1])
        yield total
        yield GaugeMetricFamily("floodwall_spool_total_max_bytes",
                                "The spool's limit, all queues (--spool-total-max).",
                                value=svc.manager.limits.total_max_bytes)
        accepting = GaugeMetricFamily("floodwall_spool_accepting",
                                      "1 while the spool takes records (0 draining).")
        accepting.add_metric([], 1.0 if svc.manager.accepting else 0.0)
        yield accepting

    def _limits(self, labels: list[str]) -> Metric:
        """Each queue's spool limit (the total's is ``floodwall_spool_total_max_bytes``)."""
        limit = GaugeMetricFamily("floodwall_spool_max_bytes",
                                  "The queue's spool limit (its policy's spool.max_bytes).",
                                  labels=labels)
        for key, _ in self.service.queues():
            q = self.service.controller.queues.get(key)
            if q is not None:
                limit.add_metric(list(key), q.policy.spool.max_bytes)
        return limit
