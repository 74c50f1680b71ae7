"""The proxy's own AMQP 0-9-1 connection to the broker: queue probes, lookups, topology
events, broker alarms, replay.

A small client on pamqp: handshake (PLAIN), heartbeats, one channel per outstanding RPC,
``connection.blocked`` notices. It is not on the relay's path; client traffic never uses it.

RPCs run on *lanes*: a lane is one long-lived channel with one RPC at a time on it (a
passive declare that finds nothing closes the channel; the lane opens another). The depth
probes and the lookups have a lane each, so a lookup never waits behind a probe round.
``consume()`` gives a ``Consumer`` (no-ack deliveries, assembled with their content) for the
topology events.

``open_publisher()`` gives a ``Publisher``: a channel in confirm mode for the spool's
replayer. Publishes are pipelined (up to ``window`` unconfirmed), their frames encoded here
(the content header payload is passed through byte-exact) and written in batches; each
publish returns a future of its ``Confirm``. Returns (``mandatory``) are told apart from
acks conservatively: the broker sends a message's basic.return before its basic.ack, so a
return marks every publish still unconfirmed at that moment as possibly returned
(``Confirm.RETURNED``); nothing that was routed is ever reported as lost, at worst a routed
one is reported returned (and replayed again: a duplicate, never a loss).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import functools
import itertools
import logging
import struct
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import body as pamqp_body
from pamqp import commands, frame, header, heartbeat
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ProtocolHeader

from floodwall import __version__
from floodwall.io.tls import UpstreamTlsContext, tls_error
from floodwall.io.upstreams import Endpoint, Upstreams
from floodwall.io.writes import BatchedWrites
from floodwall.ops.logs import event

log = logging.getLogger("floodwall.upstream")


class AmqpClientError(RuntimeError):
    """The broker refused or dropped the proxy's own connection."""


class QueueLocked(AmqpClientError):
    """405 RESOURCE_LOCKED: the queue is exclusive to another connection (a passive declare
    of it is refused; its figures come from the management API)."""


@dataclass(frozen=True)
class QueueCounts:
    """What a passive queue.declare says: ready messages and consumers, right now."""

    messages: int
    consumers: int


@dataclass(frozen=True)
class Delivery:
    """One message a consumer received: routing key, properties, body."""

    exchange: str
    routing_key: str
    properties: Any  # pamqp commands.Basic.Properties
    body: bytes


class Consumer:
    """A no-ack consumer on its own channel: each complete delivery goes to ``on_message``."""

    def __init__(self, client: AmqpClient, channel: int,
                 on_message: Callable[[Delivery], None]) -> None:
        self.client = client
        self.channel = channel
        self.on_message = on_message
        self.closed_reason: str | None = None
        self.received = 0
        self._deliver: Any = None  # the basic.deliver whose content is arriving
        self._properties: Any = None
        self._size = 0
        self._parts: list[bytes] = []

    def on_frame(self, value: Any) -> None:
        if isinstance(value, commands.Basic.Deliver):
            self._deliver, self._properties, self._parts = value, None, []
        elif isinstance(value, header.ContentHeader) and self._deliver is not None:
            self._properties, self._size = value.properties, value.body_size
            if not self._size:
                self._done()
        elif isinstance(value, pamqp_body.ContentBody) and self._deliver is not None:
            self._parts.append(bytes(value.value))
            self._size -= len(value.value)
            if self._size <= 0:
                self._done()
        elif isinstance(value, commands.Channel.Close | commands.Basic.Cancel):
            reason = (f"broker closed the channel: {value.reply_code} {value.reply_text}"
                      if isinstance(value, commands.Channel.Close) else "consumer cancelled")
            self.lost(reason)

    def _done(self) -> None:
        deliver, self._deliver = self._deliver, None
        self.received += 1
        self.on_message(Delivery(deliver.exchange or "", deliver.routing_key or "",
                                 self._properties, b"".join(self._parts)))
        self._parts = []

    def lost(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
        self.client.forget_consumer(self)


class Confirm(enum.Enum):
    """How the broker answered one publish on a confirm channel."""

    ACK = "ack"
    NACK = "nack"
    RETURNED = "returned"  # unroutable (mandatory) -- or maybe: see the module docstring
    LOST = "lost"  # the channel or connection closed before an answer


_FRAME_END = b"\xce"
_FRAME_HEAD = struct.Struct(">BHI")
_PUBLISH_HEAD = struct.Struct(">HHH")  # class 60, method 40, reserved
_BODY_SIZE_AT = 4  # content header payload: class id, weight, then body size (u64)
_BARE_HEADER = struct.Struct(">HHQH")  # class 60, weight 0, body size, no property flags
#: Unsent bytes past which publish() waits for the socket.
WRITE_HIGH_WATER = 4 * 1024 * 1024


def _shortstr(text: str) -> bytes:
    data = text.encode()
    if len(data) > 255:
        raise ValueError(f"{text[:40]!r}...: longer than 255 bytes")
    return bytes([len(data)]) + data


def encode_publish(channel: int, exchange: str, routing_key: str, properties: bytes,
                   body: bytes, frame_max: int, mandatory: bool = False,
                   method: bytes | None = None) -> bytes:
    """basic.publish, its content header (``properties`` is the header frame's payload as
    a client sent it: class id, weight, body size, flags, property list) and body frames.
    ``method`` is the method frame when the caller has it cached
    (``encode_publish_method``)."""
    if len(properties) < 14 or int.from_bytes(
            properties[_BODY_SIZE_AT:_BODY_SIZE_AT + 8], "big") != len(body):
        raise ValueError("content header does not match the body size")
    if method is None:
        method = encode_publish_method(channel, exchange, routing_key, mandatory)
    room = frame_max - 8
    if len(body) <= room:
        return b"".join((method, _FRAME_HEAD.pack(2, channel, len(properties)), properties,
                         _FRAME_END, _FRAME_HEAD.pack(3, channel, len(body)), body,
                         _FRAME_END) if body else
                        (method, _FRAME_HEAD.pack(2, channel, len(properties)), properties,
                         _FRAME_END))
    parts = [method, _FRAME_HEAD.pack(2, channel, len(properties)), properties, _FRAME_END]
    for start in range(0, len(body), room):
        chunk = body[start:start + room]
        parts += (_FRAME_HEAD.pack(3, channel, len(chunk)), chunk, _FRAME_END)
    return b"".join(parts)


def encode_publish_method(channel: int, exchange: str, routing_key: str,
                          mandatory: bool) -> bytes:
    """The basic.publish method frame."""
    payload = b"".join((_PUBLISH_HEAD.pack(60, 40, 0), _shortstr(exchange),
                        _shortstr(routing_key), b"\x01" if mandatory else b"\x00"))
    return b"".join((_FRAME_HEAD.pack(1, channel, len(payload)), payload, _FRAME_END))


class Publisher:
    """A channel in confirm mode: ``await publish(...)`` returns a future of its Confirm.

    At most ``window`` publishes are unconfirmed; ``publish`` waits for room (and for the
    socket when it lags). Futures are always resolved with a Confirm, never an exception.
    """

    def __init__(self, client: AmqpClient, channel: int, window: int) -> None:
        self.client = client
        self.channel = channel
        self.window = window
        self._next_tag = 1
        self._pending: dict[int, asyncio.Future[Confirm]] = {}
        self._order: deque[int] = deque()
        self._room = asyncio.Event()
        self._room.set()
        self._suspect_through = 0  # publishes up to this tag may have been returned
        self._methods: dict[tuple[str, str, bool], bytes] = {}  # encoded method frames
        self._loop = asyncio.get_running_loop()
        self.closed_reason: str | None = None
        self.published = 0
        self.acked = 0
        self.nacked = 0
        self.returns = 0

    @property
    def unconfirmed(self) -> int:
        return len(self._pending)

    @property
    def open(self) -> bool:
        return self.closed_reason is None and self.client.connected

    async def publish(self, exchange: str, routing_key: str, properties: bytes, body: bytes,
                      mandatory: bool = False) -> asyncio.Future[Confirm]:
        """Send one publish when the window has room; the future says how it went."""
        while len(self._pending) >= self.window and self.closed_reason is None:
            self._room.clear()
            await self._room.wait()
        if self.client.writes.backlog() > WRITE_HIGH_WATER:
            await self.client.drain()
        return self.publish_nowait(exchange, routing_key, properties, body, mandatory)

    def publish_nowait(self, exchange: str, routing_key: str, properties: bytes, body: bytes,
                       mandatory: bool = False) -> asyncio.Future[Confirm]:
        """Send one publish now, window or not (``publish`` is the polite way)."""
        if self.closed_reason is not None or not self.client.connected:
            raise AmqpClientError(self.closed_reason or self.client.closed_reason
                                  or "not connected")
        key = (exchange, routing_key, mandatory)
        method = self._methods.get(key)
        if method is None:
            if len(self._methods) > 1024:
                self._methods.clear()
            method = self._methods[key] = encode_publish_method(self.channel, *key)
        data = encode_publish(self.channel, exchange, routing_key, properties, body,
                              self.client.frame_max, mandatory, method)
        fut: asyncio.Future[Confirm] = self._loop.create_future()
        tag = self._next_tag
        self._next_tag += 1
        self._pending[tag] = fut
        self._order.append(tag)
        self.published += 1
        self.client.writes.write(data)
        return fut

    # -- frames from the broker --------------------------------------------------------
    def on_frame(self, value: Any) -> None:
        if isinstance(value, commands.Basic.Ack):
            self._confirmed(value.delivery_tag, value.multiple, Confirm.ACK)
        elif isinstance(value, commands.Basic.Nack):
            self._confirmed(value.delivery_tag, value.multiple, Confirm.NACK)
        elif isinstance(value, commands.Basic.Return):
            self.returns += 1
            self._suspect_through = self._next_tag - 1
        elif isinstance(value, commands.Channel.Close):
            self.lost(f"broker closed the channel: {value.reply_code} {value.reply_text}")
        # content header and body frames of a return: nothing to do

    def _confirmed(self, tag: int, multiple: bool, result: Confirm) -> None:
        pending, order = self._pending, self._order
        if multiple:
            while order and order[0] <= tag:
                self._resolve(order.popleft(), result)
        else:
            self._resolve(tag, result)
            while order and order[0] not in pending:
                order.popleft()
        if len(pending) < self.window:
            self._room.set()

    def _resolve(self, tag: int, result: Confirm) -> None:
        fut = self._pending.pop(tag, None)
        if fut is None:
            return
        if result is Confirm.ACK:
            if tag <= self._suspect_through:
                result = Confirm.RETURNED
            else:
                self.acked += 1
        elif result is Confirm.NACK:
            self.nacked += 1
        if not fut.done():
            fut.set_result(result)

    def lost(self, reason: str) -> None:
        """The channel or connection is gone: every unanswered publish is LOST."""
        if self.closed_reason is None:
            self.closed_reason = reason
        pending, self._pending = self._pending, {}
        self._order.clear()
        for fut in pending.values():
            if not fut.done():
                fut.set_result(Confirm.LOST)
        self._room.set()
        self.client.forget_publisher(self)

    async def close(self, timeout: float = 5.0) -> None:
        """Close the channel (unanswered publishes become LOST)."""
        if self.closed_reason is not None:
            return
        self.lost("closed")
        if self.client.connected:
            with contextlib.suppress(AmqpClientError, TimeoutError, OSError):
                await self.client.close_channel(self.channel, timeout)


class AmqpClient:
    """One connection; ``await connect()``, then RPCs; ``close()`` when done."""

    def __init__(self, upstreams: Upstreams, username: str, password: str, vhost: str = "/",
                 heartbeat_seconds: int = 30,
                 on_blocked: Callable[[str | None], None] | None = None,
                 tls: UpstreamTlsContext | None = None) -> None:
        """``upstreams``: the broker's nodes (the first that takes the connection serves
        it). ``tls``: amqps (floodwall/io/tls.py); with its ``sasl_external`` the login is SASL
        EXTERNAL (the broker takes the user from the client certificate), else PLAIN."""
        self.upstreams, self.vhost = upstreams, vhost
        self.endpoint: Endpoint | None = None  # the node connected to
        self._unwatch: Callable[[], None] | None = None
        self.tls = tls
        self._username, self._password = username, password
        self._heartbeat = heartbeat_seconds
        self.on_blocked = on_blocked  # called with a reason when blocked, None when unblocked
        self._reader: asyncio.StreamReader | None = None
        # The socket's writer once connected, and what is written to it, a loop turn at a time.
        self.writes = BatchedWrites(lambda: self.connected)
        self._read_task: asyncio.Task[None] | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._channel_ids = itertools.cycle(range(1, 2048))
        self._frame_max = 131072
        self._lanes: dict[str, int] = {}  # lane name -> its channel
        self._lane_locks: dict[str, asyncio.Lock] = {}
        self._background: set[asyncio.Task[None]] = set()  # lanes being reopened
        self._publishers: dict[int, Publisher] = {}
        self._consumers: dict[int, Consumer] = {}
        self._plain: set[int] = set()  # channels for publishes without confirms (the fleet)
        self.closed_reason: str | None = None
        self._lost: asyncio.Event | None = None
        self._greeted = False  # the broker's connection.start arrived

    @property
    def frame_max(self) -> int:
        return self._frame_max

    @property
    def connected(self) -> bool:
        return self.writes.writer is not None and self.closed_reason is None

    async def drain(self) -> None:
        """Until the socket took what was written (or the connection is gone)."""
        await self.writes.drain(self.closed_reason is None)

    async def connect(self, timeout: float = 10.0) -> None:
        self._lost = asyncio.Event()
        reader, writer, endpoint = await self.upstreams.open(self.tls, timeout)
        self._reader, self.writes.writer, self.endpoint = reader, writer, endpoint
        writer.write(frame.marshal(ProtocolHeader(), 0))
        self._greeted = False
        try:
            await asyncio.wait_for(self._handshake(), timeout)
        except TimeoutError:
            if not self._greeted:  # connected, but the node does not answer: try another next
                self.upstreams.failed(endpoint, "no connection.start")
            writer.transport.abort()
            raise
        except (OSError, asyncio.IncompleteReadError) as exc:
            # a TLS 1.3 broker refuses our certificate after the handshake
            raise tls_error(exc, self.tls, endpoint.host, greeted=self._greeted) from None
        self._unwatch = self.upstreams.watch(endpoint, functools.partial(_node_lost, self))
        loop = asyncio.get_running_loop()
        self._read_task = loop.create_task(self._read_forever(), name="amqp-client-read")
        if self._heartbeat:
            self._beat_task = loop.create_task(self._beat_forever(), name="amqp-client-beat")

    async def _next_frame(self) -> tuple[int, Any]:
        assert self._reader is not None
        head = await self._reader.readexactly(7)
        size = int.from_bytes(head[3:7], "big")
        rest = await self._reader.readexactly(size + 1)
        try:
            _, channel, value = frame.unmarshal(head + rest)
        except UnmarshalingException as exc:
            raise AmqpClientError(f"undecodable frame from broker: {exc}") from None
        return channel, value

    async def _handshake(self) -> None:
        assert self.writes.writer is not None
        _, start = await self._next_frame()
        self._greeted = True
        if not isinstance(start, commands.Connection.Start):
            raise AmqpClientError(f"expected connection.start, got {start!r}")
        props: dict[str, Any] = {"product": "floodwall", "version": __version__,
                 "capabilities": {"connection.blocked": True, "publisher_confirms": True,
                                  "consumer_cancel_notify": True}}
        if self.tls is not None and self.tls.settings.sasl_external:
            mechanism, response = "EXTERNAL", ""
            offered = str(start.mechanisms or "").split()
            if mechanism not in offered:
                raise AmqpClientError(
                    f"broker does not offer SASL EXTERNAL (offers {' '.join(offered)}): it "
                    "needs the rabbitmq_auth_mechanism_ssl plugin, EXTERNAL in its "
                    "auth_mechanisms and a client certificate it verified")
        else:
            mechanism, response = "PLAIN", f"\0{self._username}\0{self._password}"
        self._send(0, commands.Connection.StartOk(
            client_properties=props, mechanism=mechanism, response=response))
        _, tune = await self._next_frame()
        if isinstance(tune, commands.Connection.Close):
            raise AmqpClientError(f"broker refused login: {tune.reply_code} {tune.reply_text}")
        if not isinstance(tune, commands.Connection.Tune):
            raise AmqpClientError(f"expected connection.tune, got {tune!r}")
        self._frame_max = min(tune.frame_max or 131072, 131072)
        beat = min(self._heartbeat, tune.heartbeat) if tune.heartbeat else self._heartbeat
        self._heartbeat = beat
        self._send(0, commands.Connection.TuneOk(channel_max=2047, frame_max=self._frame_max,
                                                 heartbeat=beat))
        self._send(0, commands.Connection.Open(virtual_host=self.vhost))
        _, opened = await self._next_frame()
        if isinstance(opened, commands.Connection.Close):
            raise AmqpClientError(f"broker refused vhost {self.vhost!r}: "
                                  f"{opened.reply_code} {opened.reply_text}")
        if not isinstance(opened, commands.Connection.OpenOk):
            raise AmqpClientError(f"expected connection.open-ok, got {opened!r}")

    def _send(self, channel: int, value: Any) -> None:
        writer = self.writes.writer
        if writer is None:
            raise AmqpClientError("not connected")
        self.writes.flush()
        writer.write(frame.marshal(value, channel))

    async def _read_forever(self) -> None:
        try:
            while True:
                channel, value = await self._next_frame()
                self._dispatch(channel, value)
        except (asyncio.IncompleteReadError, OSError, AmqpClientError) as exc:
            self._fail(f"connection lost: {exc}")
        except asyncio.CancelledError:
            raise

    def _dispatch(self, channel: int, value: Any) -> None:
        if isinstance(value, heartbeat.Heartbeat):
            return
        if channel == 0:
            if isinstance(value, commands.Connection.Blocked):
                if self.on_blocked:
                    self.on_blocked(value.reason or "blocked")
            elif isinstance(value, commands.Connection.Unblocked):
                if self.on_blocked:
                    self.on_blocked(None)
            elif isinstance(value, commands.Connection.Close):
                self._send(0, commands.Connection.CloseOk())
                self._fail(f"broker closed the connection: {value.reply_code} "
                           f"{value.reply_text}")
            return
        if isinstance(value, commands.Channel.Close):
            self._send(channel, commands.Channel.CloseOk())
            self._plain.discard(channel)
        publisher = self._publishers.get(channel)
        if publisher is not None:
            publisher.on_frame(value)
            return
        consumer = self._consumers.get(channel)
        if consumer is not None:
            consumer.on_frame(value)
            if not isinstance(value, commands.Basic.ConsumeOk | commands.Channel.Close):
                return
        waiter = self._waiters.get(channel)
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _fail(self, reason: str) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self.closed_reason is None:
            self.closed_reason = reason
            event(log, "own_connection_lost", logging.WARNING, reason=reason)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(AmqpClientError(reason))
        for publisher in list(self._publishers.values()):
            publisher.lost(reason)
        for consumer in list(self._consumers.values()):
            consumer.lost(reason)
        if self._lost is not None:
            self._lost.set()
        if self.writes.writer is not None:
            self.writes.writer.close()

    async def _beat_forever(self) -> None:
        interval = max(self._heartbeat / 2, 1)
        while self.connected:
            await asyncio.sleep(interval)
            with contextlib.suppress(AmqpClientError, OSError):
                self._send(0, heartbeat.Heartbeat())

    async def _rpc(self, channel: int, value: Any, timeout: float) -> Any:
        loop = asyncio.get_running_loop()
        waiter: asyncio.Future[Any] = loop.create_future()
        self._waiters[channel] = waiter
        try:
            self._send(channel, value)
            async with asyncio.timeout(timeout):  # (one wake-up less than wait_for)
                return await waiter
        finally:
            self._waiters.pop(channel, None)

    async def _open_channel(self, timeout: float) -> int:
        channel = next(self._channel_ids)
        lanes = self._lanes.values()
        while (channel in self._waiters or channel in self._publishers
               or channel in self._consumers or channel in lanes or channel in self._plain):
            channel = next(self._channel_ids)
        opened = await self._rpc(channel, commands.Channel.Open(), timeout)
        if not isinstance(opened, commands.Channel.OpenOk):
            raise AmqpClientError(f"channel.open refused: {opened!r}")
        return channel

    async def _lane_rpc(self, lane: str, value: Any, timeout: float) -> Any:
        """One RPC on ``lane``'s channel (opened when needed), after the lane's previous one.

        A channel.close in reply (a passive declare of nothing) retires the lane's channel;
        so does a timeout (a late reply must not answer the next request).
        """
        if not self.connected:
            raise AmqpClientError(self.closed_reason or "not connected")
        lock = self._lane_locks.get(lane)
        if lock is None:
            lock = self._lane_locks[lane] = asyncio.Lock()
        async with lock:
            channel = self._lanes.get(lane)
            if channel is None:
                channel = self._lanes[lane] = await self._open_channel(timeout)
            try:
                reply = await self._rpc(channel, value, timeout)
            except TimeoutError:
                self._lanes.pop(lane, None)
                raise
            if isinstance(reply, commands.Channel.Close):
                self._lanes.pop(lane, None)
                # Reopen it now, so the lane's next RPC (a lookup) is one round trip.
                reopen = asyncio.get_running_loop().create_task(self._reopen(lane, timeout))
                self._background.add(reopen)
                reopen.add_done_callback(self._background.discard)
            return reply

    async def _reopen(self, lane: str, timeout: float) -> None:
        with contextlib.suppress(AmqpClientError, TimeoutError, OSError):
            await self.open_lane(lane, timeout)

    async def open_lane(self, lane: str, timeout: float = 5.0) -> None:
        """Open ``lane``'s channel now, so its first RPC is one round trip."""
        lock = self._lane_locks.setdefault(lane, asyncio.Lock())
        async with lock:
            if lane not in self._lanes:
                self._lanes[lane] = await self._open_channel(timeout)

    async def queue_counts(self, queue: str, timeout: float = 5.0,
                           lane: str = "probe") -> QueueCounts | None:
        """Ready messages and consumers of ``queue`` now; None when it does not exist."""
        reply = await self._lane_rpc(lane, commands.Queue.Declare(queue=queue, passive=True),
                                     timeout)
        if isinstance(reply, commands.Channel.Close):  # the broker closed the channel
            if reply.reply_code == 404:
                return None
            error = QueueLocked if reply.reply_code == 405 else AmqpClientError
            raise error(f"queue.declare {queue!r}: {reply.reply_code} {reply.reply_text}")
        if not isinstance(reply, commands.Queue.DeclareOk):
            raise AmqpClientError(f"queue.declare {queue!r}: unexpected {reply!r}")
        return QueueCounts(reply.message_count or 0, reply.consumer_count or 0)

    async def exchange_exists(self, exchange: str, timeout: float = 5.0,
                              lane: str = "probe") -> bool:
        """Whether ``exchange`` exists (a passive exchange.declare)."""
        reply = await self._lane_rpc(
            lane, commands.Exchange.Declare(exchange=exchange, passive=True), timeout)
        if isinstance(reply, commands.Channel.Close):
            if reply.reply_code == 404:
                return False
            raise AmqpClientError(f"exchange.declare {exchange!r}: {reply.reply_code} "
                                  f"{reply.reply_text}")
        if not isinstance(reply, commands.Exchange.DeclareOk):
            raise AmqpClientError(f"exchange.declare {exchange!r}: unexpected {reply!r}")
        return True

    async def declare_queue(self, queue: str = "", *, exclusive: bool = False,
                            auto_delete: bool = False,
                            arguments: dict[str, Any] | None = None,
                            timeout: float = 5.0) -> str:
        """Declare a queue (``""``: the broker names it); its name."""
        reply = await self._lane_rpc("setup", commands.Queue.Declare(
            queue=queue, exclusive=exclusive, auto_delete=auto_delete,
            arguments=arguments or {}), timeout)
        if not isinstance(reply, commands.Queue.DeclareOk):
            raise AmqpClientError(f"queue.declare {queue!r}: {_refusal(reply)}")
        return str(reply.queue)

    async def declare_exchange(self, exchange: str, kind: str, *, durable: bool = False,
                               auto_delete: bool = False, timeout: float = 5.0) -> None:
        reply = await self._lane_rpc("setup", commands.Exchange.Declare(
            exchange=exchange, exchange_type=kind, durable=durable, auto_delete=auto_delete),
            timeout)
        if not isinstance(reply, commands.Exchange.DeclareOk):
            raise AmqpClientError(f"exchange.declare {exchange!r}: {_refusal(reply)}")

    async def open_plain_channel(self, timeout: float = 5.0) -> int:
        """A channel for publishes without confirms (``publish_plain``), open until the
        broker closes it or the connection goes."""
        if not self.connected:
            raise AmqpClientError(self.closed_reason or "not connected")
        channel = await self._open_channel(timeout)
        self._plain.add(channel)
        return channel

    def publish_plain(self, channel: int, exchange: str, routing_key: str,
                      body: bytes) -> None:
        """One publish without properties on a plain channel; fire and forget."""
        if channel not in self._plain or not self.connected:
            raise AmqpClientError(self.closed_reason or f"channel {channel} is closed")
        header_payload = _BARE_HEADER.pack(60, 0, len(body), 0)
        self.writes.write(encode_publish(channel, exchange, routing_key, header_payload,
                                           body, self._frame_max))

    async def bind_queue(self, queue: str, exchange: str, routing_key: str,
                         timeout: float = 5.0) -> None:
        reply = await self._lane_rpc("setup", commands.Queue.Bind(
            queue=queue, exchange=exchange, routing_key=routing_key), timeout)
        if not isinstance(reply, commands.Queue.BindOk):
            raise AmqpClientError(f"queue.bind {queue!r} to {exchange!r}: {_refusal(reply)}")

    async def consume(self, queue: str, on_message: Callable[[Delivery], None],
                      timeout: float = 5.0) -> Consumer:
        """A no-ack consumer of ``queue`` on a channel of its own."""
        if not self.connected:
            raise AmqpClientError(self.closed_reason or "not connected")
        channel = await self._open_channel(timeout)
        consumer = Consumer(self, channel, on_message)
        self._consumers[channel] = consumer
        try:
            reply = await self._rpc(channel, commands.Basic.Consume(queue=queue, no_ack=True),
                                    timeout)
        except BaseException:
            self.forget_consumer(consumer)
            raise
        if not isinstance(reply, commands.Basic.ConsumeOk):
            self.forget_consumer(consumer)
            raise AmqpClientError(f"basic.consume {queue!r}: {_refusal(reply)}")
        return consumer

    def forget_consumer(self, consumer: Consumer) -> None:
        if self._consumers.get(consumer.channel) is consumer:
            del self._consumers[consumer.channel]

    async def wait_closed(self) -> None:
        """Until the connection is lost or closed."""
        if self._lost is not None:
            await self._lost.wait()

    async def open_publisher(self, window: int = 1000, timeout: float = 5.0) -> Publisher:
        """A new channel in confirm mode (``confirm.select``)."""
        if not self.connected:
            raise AmqpClientError(self.closed_reason or "not connected")
        channel = await self._open_channel(timeout)
        reply = await self._rpc(channel, commands.Confirm.Select(), timeout)
        if not isinstance(reply, commands.Confirm.SelectOk):
            raise AmqpClientError(f"confirm.select refused: {reply!r}")
        publisher = Publisher(self, channel, window)
        self._publishers[channel] = publisher
        return publisher

    def forget_publisher(self, publisher: Publisher) -> None:
        if self._publishers.get(publisher.channel) is publisher:
            del self._publishers[publisher.channel]

    async def close_channel(self, channel: int, timeout: float = 5.0) -> None:
        reply = await self._rpc(channel, commands.Channel.Close(
            reply_code=200, reply_text="done", class_id=0, method_id=0), timeout)
        if not isinstance(reply, commands.Channel.CloseOk | commands.Channel.Close):
            raise AmqpClientError(f"channel.close: unexpected {reply!r}")

    async def close(self) -> None:
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        for reopening in list(self._background):
            reopening.cancel()
        for publisher in list(self._publishers.values()):
            publisher.lost("connection closing")
        self.writes.flush()
        for task in (self._read_task, self._beat_task):
            if task is not None:
                task.cancel()
        for task in (self._read_task, self._beat_task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._lost is not None:
            self._lost.set()
        writer = self.writes.writer
        if writer is not None:
            if self.closed_reason is None:
                with contextlib.suppress(OSError, AmqpClientError):
                    self._send(0, commands.Connection.Close(reply_code=200, class_id=0, method_id=0,
                                                            reply_text="floodwall closing"))
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()
        self.closed_reason = self.closed_reason or "closed"


def _node_lost(client: AmqpClient, reason: str) -> None:
    """The readiness probe found ``client``'s node no longer answering: end the connection
    now (a hung node's would wait for heartbeats), so its owner reconnects to the next
    node. Aborted: a hung node never takes what is buffered for it."""
    client._unwatch = None
    if client.writes.writer is not None:
        client.writes.writer.transport.abort()
    client._fail(f"the broker node stopped answering: {reason}")


def _refusal(reply: Any) -> str:
    if isinstance(reply, commands.Channel.Close):
        return f"{reply.reply_code} {reply.reply_text}"
    return f"unexpected {reply!r}"
