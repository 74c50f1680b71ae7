"""The proxy's own AMQP 0-9-1 connection to the broker: queue probes, broker alarms.

A small client on pamqp: handshake (PLAIN), heartbeats, one channel per outstanding RPC,
``connection.blocked`` notices. It is not on the relay's path; client traffic never uses it.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pamqp import commands, frame, heartbeat
from pamqp.exceptions import UnmarshalingException
from pamqp.header import ProtocolHeader

from proxy import __version__
from proxy.logs import event

log = logging.getLogger("floodwall.upstream")


class AmqpClientError(RuntimeError):
    """The broker refused or dropped the proxy's own connection."""


@dataclass(frozen=True)
class QueueCounts:
    """What a passive queue.declare says: ready messages and consumers, right now."""

    messages: int
    consumers: int


class AmqpClient:
    """One connection; ``await connect()``, then RPCs; ``close()`` when done."""

    def __init__(self, host: str, port: int, username: str, password: str, vhost: str = "/",
                 heartbeat_seconds: int = 30,
                 on_blocked: Callable[[str | None], None] | None = None) -> None:
        self.host, self.port, self.vhost = host, port, vhost
        self._username, self._password = username, password
        self._heartbeat = heartbeat_seconds
        self.on_blocked = on_blocked  # called with a reason when blocked, None when unblocked
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self._waiters: dict[int, asyncio.Future[Any]] = {}
        self._channel_ids = itertools.cycle(range(1, 2048))
        self._frame_max = 131072
        self._probe_channel: int | None = None
        self.closed_reason: str | None = None

    @property
    def connected(self) -> bool:
        return self._writer is not None and self.closed_reason is None

    async def connect(self, timeout: float = 10.0) -> None:
        reader, writer = await asyncio.wait_for(
            asyncio.open_connection(self.host, self.port), timeout)
        self._reader, self._writer = reader, writer
        writer.write(frame.marshal(ProtocolHeader(), 0))
        await asyncio.wait_for(self._handshake(), timeout)
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
        assert self._writer is not None
        _, start = await self._next_frame()
        if not isinstance(start, commands.Connection.Start):
            raise AmqpClientError(f"expected connection.start, got {start!r}")
        props: dict[str, Any] = {"product": "floodwall", "version": __version__,
                 "capabilities": {"connection.blocked": True, "publisher_confirms": True,
                                  "consumer_cancel_notify": True}}
        self._send(0, commands.Connection.StartOk(
            client_properties=props, mechanism="PLAIN",
            response=f"\0{self._username}\0{self._password}"))
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
        if self._writer is None:
            raise AmqpClientError("not connected")
        self._writer.write(frame.marshal(value, channel))

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
        waiter = self._waiters.get(channel)
        if waiter is not None and not waiter.done():
            waiter.set_result(value)

    def _fail(self, reason: str) -> None:
        if self.closed_reason is None:
            self.closed_reason = reason
            event(log, "own_connection_lost", logging.WARNING, reason=reason)
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_exception(AmqpClientError(reason))
        if self._writer is not None:
            self._writer.close()

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
            return await asyncio.wait_for(waiter, timeout)
        finally:
            self._waiters.pop(channel, None)

    async def _open_channel(self, timeout: float) -> int:
        channel = next(self._channel_ids)
        while channel in self._waiters:
            channel = next(self._channel_ids)
        opened = await self._rpc(channel, commands.Channel.Open(), timeout)
        if not isinstance(opened, commands.Channel.OpenOk):
            raise AmqpClientError(f"channel.open refused: {opened!r}")
        return channel

    async def queue_counts(self, queue: str, timeout: float = 5.0) -> QueueCounts | None:
        """Ready messages and consumers of ``queue`` now; None when it does not exist.

        Uses one long-lived probe channel; a 404 closes it and the next call opens another.
        """
        if not self.connected:
            raise AmqpClientError(self.closed_reason or "not connected")
        if self._probe_channel is None:
            self._probe_channel = await self._open_channel(timeout)
        channel = self._probe_channel
        reply = await self._rpc(channel, commands.Queue.Declare(queue=queue, passive=True),
                                timeout)
        if isinstance(reply, commands.Channel.Close):  # the broker closed the channel
            self._probe_channel = None
            if reply.reply_code == 404:
                return None
            raise AmqpClientError(f"queue.declare {queue!r}: {reply.reply_code} "
                                  f"{reply.reply_text}")
        if not isinstance(reply, commands.Queue.DeclareOk):
            raise AmqpClientError(f"queue.declare {queue!r}: unexpected {reply!r}")
        return QueueCounts(reply.message_count or 0, reply.consumer_count or 0)

    async def close(self) -> None:
        for task in (self._read_task, self._beat_task):
            if task is not None:
                task.cancel()
        for task in (self._read_task, self._beat_task):
            if task is not None:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
        if self._writer is not None:
            if self.closed_reason is None:
                with contextlib.suppress(OSError, AmqpClientError):
                    self._send(0, commands.Connection.Close(reply_code=200, class_id=0, method_id=0,
                                                            reply_text="floodwall closing"))
            self._writer.close()
            with contextlib.suppress(OSError):
                await self._writer.wait_closed()
        self.closed_reason = self.closed_reason or "closed"
