"""A raw AMQP 0-9-1 client for the benchmarks: pamqp for the handshake, offsets on the hot path.

The point is to spend as little client CPU per message as possible, so that what the
benchmark measures is the relay and the broker, not the client: messages are encoded once
and written as pre-built bytes, and incoming frames are walked by offset; only methods the
hot path does not know (handshake, declare-ok, ...) are decoded with pamqp.
"""

from __future__ import annotations

import asyncio
import struct
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import Any, cast

from pamqp import body as pbody
from pamqp import commands
from pamqp import frame as pframe
from pamqp import header as pheader

FRAME_END = 0xCE
_FRAME_HEAD = struct.Struct(">BHI")
_CLASS_METHOD = struct.Struct(">HH")
_U64 = struct.Struct(">Q")

BASIC_DELIVER = (60, 60)
BASIC_ACK = (60, 80)
BASIC_NACK = (60, 120)


class ProtocolError(RuntimeError):
    """The peer closed the connection or a channel, or sent something unexpected."""


def encode(frame_value: Any, channel: int) -> bytes:
    """One frame as bytes."""
    return bytes(pframe.marshal(frame_value, channel))


BODY_FRAME_MAX = 131_072
"""The frame_max RabbitMQ proposes (and these clients accept): a body frame's size limit."""


def publish_frames(routing_key: str, body: bytes, channel: int = 1, exchange: str = "",
                   properties: commands.Basic.Properties | None = None) -> bytes:
    """Basic.Publish + ContentHeader + ContentBody frames (as many as ``BODY_FRAME_MAX``
    needs: one for a 1 KiB body, 9 for 1 MiB), encoded once, for one message."""
    props = properties or commands.Basic.Properties()
    step = BODY_FRAME_MAX - 8
    return (
        encode(commands.Basic.Publish(exchange=exchange, routing_key=routing_key), channel)
        + encode(pheader.ContentHeader(body_size=len(body), properties=props), channel)
        + b"".join(encode(pbody.ContentBody(body[i:i + step]), channel)
                   for i in range(0, max(len(body), 1), step))
    )


class Amqp091Client(asyncio.Protocol):
    """One client connection. ``await connect(...)`` then use the channel-1 helpers.

    Counters kept on the hot path:
    - ``confirmed`` / ``nacked``: broker confirms on a confirm-mode channel (multiple aware);
    - ``deliveries`` / ``last_delivery_tag``: Basic.Deliver frames received;
    - ``on_body(payload, received_ns)``: called for each content body frame when set.
    """

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._methods: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._writable = asyncio.Event()
        self._writable.set()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.confirmed = 0
        self.nacked = 0
        self.deliveries = 0
        self.last_delivery_tag = 0
        self.bytes_in = 0
        self.on_body: Callable[[memoryview, int], None] | None = None
        self.on_delivery: Callable[[int], None] | None = None
        self.on_confirm: Callable[[int], None] | None = None  # (highest tag confirmed)

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        self.transport = transport
        transport.set_write_buffer_limits(high=512 * 1024)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        if not self.lost.done():
            self.lost.set_result(None)
        self._methods.put_nowait((-1, exc))

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        self.bytes_in += len(data)
        buf = self._buf
        buf += data
        size = len(buf)
        pos = 0
        head = _FRAME_HEAD.unpack_from
        mv = memoryview(buf)
        try:
            while size - pos >= 8:
                ftype, _, length = head(buf, pos)
                end = pos + 7 + length
                if end >= size:
                    break
                if ftype == 3:
                    if self.on_body is not None:
                        self.on_body(mv[pos + 7:end], now)
                elif ftype == 1:
                    cm = _CLASS_METHOD.unpack_from(buf, pos + 7)
                    if cm == BASIC_DELIVER:
                        ctag_len = buf[pos + 11]
                        tag = _U64.unpack_from(buf, pos + 12 + ctag_len)[0]
                        self.deliveries += 1
                        self.last_delivery_tag = tag
                        if self.on_delivery is not None:
                            self.on_delivery(tag)
                    elif cm == BASIC_ACK or cm == BASIC_NACK:
                        tag = _U64.unpack_from(buf, pos + 11)[0]
                        if cm == BASIC_NACK:
                            multiple = buf[pos + 19] & 1
                            self.nacked += (tag - self.confirmed) if multiple else 1
                        if tag > self.confirmed:
                            self.confirmed = tag
                            if self.on_confirm is not None:
                                self.on_confirm(tag)
                    else:
                        _, ch, value = pframe.unmarshal(bytes(buf[pos:end + 1]))
                        self._methods.put_nowait((ch, value))
                # type 2 (content header) and 8 (heartbeat): nothing to do
                pos = end + 1
        finally:
            mv.release()
        if pos:
            del buf[:pos]

    # -- writing --------------------------------------------------------------------------
    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def writable(self) -> None:
        """Return once the write buffer is below its high-water mark."""
        await self._writable.wait()

    @property
    def paused(self) -> bool:
        return not self._writable.is_set()

    def send(self, value: Any, channel: int = 1) -> None:
        self.write(encode(value, channel))

    async def expect(self, kind: type, timeout: float = 10.0) -> Any:
        """The next decoded method, which must be a ``kind``."""
        ch, value = await asyncio.wait_for(self._methods.get(), timeout)
        if ch == -1:
            raise ProtocolError(f"connection lost waiting for {kind.__name__}: {value}")
        if isinstance(value, commands.Connection.Close | commands.Channel.Close):
            raise ProtocolError(f"waiting for {kind.__name__}, got {value!r} "
                                f"{value.reply_code} {value.reply_text}")
        if not isinstance(value, kind):
            raise ProtocolError(f"waiting for {kind.__name__}, got {type(value).__name__}")
        return value

    async def call(self, value: Any, reply: type, channel: int = 1,
                   timeout: float = 10.0) -> Any:
        self.send(value, channel)
        return await self.expect(reply, timeout)

    # -- connection -----------------------------------------------------------------------
    async def handshake(self, timeout: float = 10.0, open_channel: bool = True) -> None:
        """Protocol header, Start/StartOk PLAIN guest/guest, Tune/TuneOk, Open, Channel.Open."""
        self.write(bytes(pframe.marshal(pheader.ProtocolHeader(), 0)))
        await self.expect(commands.Connection.Start, timeout)
        self.send(commands.Connection.StartOk(
            client_properties={"product": "floodwall-bench", "capabilities": {
                "publisher_confirms": True, "basic.nack": True}},
            mechanism="PLAIN", response="\x00guest\x00guest"), 0)
        tune = await self.expect(commands.Connection.Tune, timeout)
        self.send(commands.Connection.TuneOk(channel_max=tune.channel_max,
                                             frame_max=tune.frame_max, heartbeat=0), 0)
        await self.call(commands.Connection.Open(virtual_host="/"),
                        commands.Connection.OpenOk, 0, timeout)
        if open_channel:
            await self.call(commands.Channel.Open(), commands.Channel.OpenOk, 1, timeout)

    async def close(self, timeout: float = 5.0) -> None:
        """Connection.Close, wait for CloseOk (or the socket to go), then drop the socket."""
        if self.transport is None or self.transport.is_closing():
            return
        self.send(commands.Connection.Close(reply_code=200, reply_text="bench done",
                                            class_id=0, method_id=0), 0)
        deadline = time.monotonic() + timeout
        try:
            while True:
                left = deadline - time.monotonic()
                ch, value = await asyncio.wait_for(self._methods.get(), max(left, 0.001))
                if ch == -1 or isinstance(value, commands.Connection.CloseOk):
                    break
        except TimeoutError:
            pass
        finally:
            self.transport.abort()

    def abort(self) -> None:
        if self.transport is not None:
            self.transport.abort()

    # -- channel 1 helpers --------------------------------------------------------------
    async def declare(self, queue: str, arguments: dict[str, Any] | None = None,
                      passive: bool = False, exclusive: bool = False,
                      auto_delete: bool = False) -> int:
        ok = await self.call(commands.Queue.Declare(
            queue=queue, passive=passive, exclusive=exclusive, auto_delete=auto_delete,
            arguments=arguments or {}), commands.Queue.DeclareOk)
        return int(ok.message_count)

    async def bind(self, queue: str, exchange: str, routing_key: str) -> None:
        await self.call(commands.Queue.Bind(queue=queue, exchange=exchange,
                                            routing_key=routing_key), commands.Queue.BindOk)

    async def purge(self, queue: str) -> int:
        ok = await self.call(commands.Queue.Purge(queue=queue), commands.Queue.PurgeOk)
        return int(ok.message_count)

    async def delete(self, queue: str) -> None:
        await self.call(commands.Queue.Delete(queue=queue), commands.Queue.DeleteOk)

    async def confirm_select(self) -> None:
        await self.call(commands.Confirm.Select(), commands.Confirm.SelectOk)

    async def qos(self, prefetch: int) -> None:
        await self.call(commands.Basic.Qos(prefetch_count=prefetch), commands.Basic.QosOk)

    async def consume(self, queue: str, no_ack: bool, tag: str = "b") -> None:
        await self.call(commands.Basic.Consume(queue=queue, consumer_tag=tag, no_ack=no_ack),
                        commands.Basic.ConsumeOk)

    def ack(self, tag: int, multiple: bool = True) -> None:
        self.send(commands.Basic.Ack(delivery_tag=tag, multiple=multiple))


async def connect(host: str, port: int, timeout: float = 10.0,
                  open_channel: bool = True, ssl: SSLContext | None = None
                  ) -> Amqp091Client:
    """A connected, handshaken client (channel 1 open when ``open_channel``); over TLS with
    ``ssl`` (the name verified is ``localhost``, the bench's certificate)."""
    loop = asyncio.get_running_loop()
    tls: dict[str, Any] = {"ssl": ssl, "server_hostname": "localhost"} if ssl else {}
    _, client = await asyncio.wait_for(loop.create_connection(Amqp091Client, host, port, **tls),
                                       timeout)
    try:
        await client.handshake(timeout, open_channel)
    except BaseException:
        client.abort()
        raise
    return client
