"""A raw AMQP 1.0 sender for the benchmarks: proton's codec for control, transfers pre-encoded.

SASL PLAIN, open, begin, attach a sender link, then write unsettled transfers (delivery id
and tag patched into a pre-built frame) as fast as the socket, the link credit and the
session window allow; the broker's ``accepted`` dispositions are the count of messages it
took, as publisher confirms are in 0-9-1.
"""

from __future__ import annotations

import asyncio
import contextlib
import struct
import time
from collections.abc import Callable
from ssl import SSLContext
from typing import Any, cast

from proton import Data, Described, symbol, uint, ulong, ushort

SASL_HEADER = b"AMQP\x03\x01\x00\x00"
AMQP_HEADER = b"AMQP\x00\x01\x00\x00"
_FRAME = struct.Struct(">IBBH")
_U32 = struct.Struct(">I")

SASL_MECHANISMS, SASL_OUTCOME = 0x40, 0x44
OPEN, BEGIN, ATTACH, FLOW, TRANSFER, DISPOSITION, DETACH, END, CLOSE = range(0x10, 0x19)
ACCEPTED = 0x24
BATCH = 64


class Amqp10Error(RuntimeError):
    """The peer refused or closed something."""


def frame(performative: int, fields: list[Any], channel: int = 0, sasl: bool = False) -> bytes:
    data = Data()
    data.put_object(Described(ulong(performative), fields))
    body = bytes(data.encode())
    return _FRAME.pack(8 + len(body), 2, 1 if sasl else 0, channel) + body


def transfer_template(body: bytes) -> tuple[bytes, int, int]:
    """One transfer frame (handle 0, unsettled, one data section) and where its delivery id
    and 4-byte delivery tag go."""
    perf = (b"\x00\x53\x14"  # transfer
            + b"\xc0\x0f\x05"  # list8, 15 bytes, 5 fields
            + b"\x43"  # handle: uint0
            + b"\x70\x00\x00\x00\x00"  # delivery-id: uint
            + b"\xa0\x04\x00\x00\x00\x00"  # delivery-tag: vbin8, 4 bytes
            + b"\x43"  # message-format: uint0
            + b"\x42")  # settled: false
    section = b"\x00\x53\x75" + b"\xb0" + _U32.pack(len(body)) + body  # data section, vbin32
    payload = perf + section
    head = _FRAME.pack(8 + len(payload), 2, 0, 0)
    return head + payload, 8 + 3 + 3 + 1 + 1, 8 + 3 + 3 + 1 + 5 + 2


class Amqp10Client(asyncio.Protocol):
    """One connection with one session (channel 0) and one sender link (handle 0)."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self._buf = bytearray()
        self._frames: asyncio.Queue[tuple[int, Any]] = asyncio.Queue()
        self._writable = asyncio.Event()
        self._writable.set()
        self.flowed = asyncio.Event()
        self.lost: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.accepted = 0
        self.rejected = 0
        # link and session flow state, as the broker last told it
        self.link_credit = 0
        self.remote_delivery_count = 0
        self.remote_next_incoming = 0
        self.remote_incoming_window = 0
        self.next_delivery = 0  # also our session's next-outgoing-id (one frame each)
        self.error: str | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.transport.set_write_buffer_limits(high=512 * 1024)

    def pause_writing(self) -> None:
        self._writable.clear()

    def resume_writing(self) -> None:
        self._writable.set()

    def connection_lost(self, exc: Exception | None) -> None:
        self._writable.set()
        self.flowed.set()
        if not self.lost.done():
            self.lost.set_result(None)
        self._frames.put_nowait((-1, exc))

    def data_received(self, data: bytes) -> None:
        buf = self._buf
        buf += data
        pos, size = 0, len(buf)
        while size - pos >= 8:
            if buf[pos:pos + 4] == b"AMQP":
                self._frames.put_nowait((0, bytes(buf[pos:pos + 8])))
                pos += 8
                continue
            length, doff, _ftype, _ch = _FRAME.unpack_from(buf, pos)
            if size - pos < length:
                break
            start = pos + doff * 4
            if length > doff * 4:
                self._frame(buf, start, pos + length)
            pos += length
        if pos:
            del buf[:pos]

    def _frame(self, buf: bytearray, start: int, end: int) -> None:
        """A frame with a body (``buf[start:end]``)."""
        self._performative(bytes(buf[start:end]))

    def _performative(self, raw: bytes) -> None:
        data = Data()
        data.decode(raw)
        data.rewind()
        data.next()
        obj: Any = data.get_object()
        code, fields = int(obj.descriptor), list(obj.value or [])
        fields += [None] * (12 - len(fields))
        if code == DISPOSITION:
            first, last, state = fields[1], fields[2], fields[4]
            n = (last if last is not None else first) - first + 1
            if isinstance(state, Described) and state.descriptor == ACCEPTED:
                self.accepted += n
            else:
                self.rejected += n
            self.flowed.set()
            return
        if code == FLOW:
            (self.remote_next_incoming, self.remote_incoming_window) = (
                fields[0] or 0, fields[1] or 0)
            if fields[4] is not None:  # link flow
                self.remote_delivery_count = fields[5] or 0
                self.link_credit = fields[6] or 0
            self.flowed.set()
            return
        if code in (CLOSE, END, DETACH):
            self.error = f"peer sent {('detach', 'end', 'close')[code - DETACH]}: {fields}"
            self.flowed.set()
        self._frames.put_nowait((code, fields))

    # -- flow ----------------------------------------------------------------------------
    def sendable(self, max_unsettled: int) -> int:
        """Transfers the link credit, the broker's session window and our own bound on
        unsettled deliveries allow now."""
        credit = self.remote_delivery_count + self.link_credit - self.next_delivery
        window = self.remote_next_incoming + self.remote_incoming_window - self.next_delivery
        unsettled = max_unsettled - (self.next_delivery - self.accepted - self.rejected)
        return max(0, min(credit, window, unsettled))

    async def expect(self, code: int, timeout: float = 10.0) -> Any:
        got, value = await asyncio.wait_for(self._frames.get(), timeout)
        if got == -1:
            raise Amqp10Error(f"connection lost waiting for 0x{code:02x}: {value}")
        if got != code:
            raise Amqp10Error(f"waiting for 0x{code:02x}, got 0x{got:02x}: {value}")
        return value

    def write(self, data: bytes) -> None:
        assert self.transport is not None
        self.transport.write(data)

    async def begin(self, timeout: float) -> Any:
        """SASL PLAIN, open and begin (channel 0); the broker's begin fields."""
        self.write(SASL_HEADER)
        await self.expect(0, timeout)
        await self.expect(SASL_MECHANISMS, timeout)
        self.write(frame(0x41, [symbol("PLAIN"), b"\x00guest\x00guest"], sasl=True))
        outcome = await self.expect(SASL_OUTCOME, timeout)
        if outcome[0] != 0:
            raise Amqp10Error(f"SASL outcome {outcome[0]}")
        self.write(AMQP_HEADER)
        await self.expect(0, timeout)
        self.write(frame(OPEN, ["floodwall-bench", "localhost", uint(131072), ushort(255)]))
        await self.expect(OPEN, timeout)
        self.write(frame(BEGIN, [None, uint(0), uint(1 << 20), uint(1 << 20)]))
        return await self.expect(BEGIN, timeout)

    async def open_sender(self, address: str, timeout: float = 10.0) -> None:
        await self.begin(timeout)
        source = Described(ulong(0x28), ["bench-source"])
        target = Described(ulong(0x29), [address])
        self.write(frame(ATTACH, ["bench-sender", uint(0), False, None, None, source, target,
                                  None, None, uint(0)]))
        await self.expect(ATTACH, timeout)
        if self.error:
            raise Amqp10Error(self.error)

    async def close(self, timeout: float = 5.0) -> None:
        if self.transport is None or self.transport.is_closing():
            return
        self.write(frame(CLOSE, []))
        deadline = time.monotonic() + timeout
        try:
            while True:
                code, _ = await asyncio.wait_for(self._frames.get(),
                                                 max(0.001, deadline - time.monotonic()))
                if code in (-1, CLOSE):
                    break
        except TimeoutError:
            pass
        finally:
            self.transport.abort()


async def firehose(host: str, port: int, address: str, size: int, warmup: float,
                   seconds: float, mark: Callable[[], None],
                   max_unsettled: int = 10_000, ssl: SSLContext | None = None
                   ) -> dict[str, Any]:
    """Send as fast as allowed for ``warmup + seconds``; ``mark()`` is called at the start
    and the end of the measured window. Returns counts of accepted messages.

    RabbitMQ's 1.0 plugin reads transfers far ahead of routing them (it grants 64K of
    credit), so without a bound on unsettled deliveries a run leaves a backlog of tens of
    seconds behind it; 10,000 keeps the pipe full and the run short."""
    loop = asyncio.get_running_loop()
    tls: dict[str, Any] = {"ssl": ssl, "server_hostname": "localhost"} if ssl else {}
    _, client = await asyncio.wait_for(loop.create_connection(Amqp10Client, host, port, **tls),
                                       10)
    try:
        await client.open_sender(address)
    except BaseException:
        if client.transport is not None:
            client.transport.abort()
        raise
    template, id_at, tag_at = transfer_template(b"\xab" * size)
    stop = False

    async def writer() -> None:
        buf = bytearray(template * BATCH)
        step = len(template)
        pack = _U32.pack_into
        while not stop and not client.lost.done() and client.error is None:
            n = min(BATCH, client.sendable(max_unsettled))
            if n == 0:
                client.flowed.clear()
                await client.flowed.wait()
                continue
            d = client.next_delivery
            for i in range(n):
                pack(buf, i * step + id_at, d + i)
                pack(buf, i * step + tag_at, d + i)
            client.write(bytes(buf[:n * step]) if n < BATCH else bytes(buf))
            client.next_delivery = d + n
            if not client._writable.is_set():
                await client._writable.wait()
            else:
                await asyncio.sleep(0)

    task = loop.create_task(writer())
    try:
        await asyncio.sleep(warmup)
        a0 = client.accepted
        mark()
        await asyncio.sleep(seconds)
        a1 = client.accepted
        mark()
        stop = True
        await task
        deadline = time.monotonic() + 15  # let what is in flight settle before the next run
        while (client.accepted + client.rejected < client.next_delivery
               and not client.lost.done() and client.error is None):
            client.flowed.clear()
            left = deadline - time.monotonic()
            if left <= 0:
                break
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(client.flowed.wait(), left)
    finally:
        stop = True
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    error = client.error
    await client.close()
    if error:
        raise Amqp10Error(error)
    return {"msgs": a1 - a0, "sent": client.next_delivery, "accepted": client.accepted,
            "rejected": client.rejected}


# -- a receiver: the consumer drain ------------------------------------------------------------
def disposition_frame(first: int, last: int) -> bytes:
    """The receiver settles deliveries ``first``..``last``: accepted."""
    return frame(DISPOSITION, [True, uint(first & 0xFFFFFFFF), uint(last & 0xFFFFFFFF), True,
                               Described(ulong(ACCEPTED), [])])


class Amqp10Receiver(Amqp10Client):
    """One connection, one session, one receiver link (handle 0). Transfer frames are
    counted by their performative code without being decoded (the broker numbers a single
    link's deliveries one after the other from the first one's id), so the client costs
    about what a 0-9-1 consumer's frame scan does; everything else goes through proton's
    codec as the sender's frames do."""

    def __init__(self) -> None:
        super().__init__()
        self.deliveries = 0
        self.first_id: int | None = None
        self.on_delivery: Callable[[int], None] | None = None
        self.incoming_next = 0  # the broker's first transfer-id (its begin)
        self.initial_count = 0  # the broker's initial delivery-count (its attach)

    def _frame(self, buf: bytearray, start: int, end: int) -> None:
        if buf[start + 2] == TRANSFER and self.first_id is not None:
            self.deliveries += 1
            if self.on_delivery is not None:
                self.on_delivery(self.deliveries)
        else:
            self._performative(bytes(buf[start:end]))

    def _performative(self, raw: bytes) -> None:
        if raw[2] == TRANSFER:  # the first: its delivery-id numbers the rest
            data = Data()
            data.decode(raw)
            data.rewind()
            data.next()
            obj: Any = data.get_object()
            self.first_id = int(obj.value[1])
            self.deliveries += 1
            if self.on_delivery is not None:
                self.on_delivery(self.deliveries)
            return
        super()._performative(raw)

    async def open_receiver(self, address: str, credit: int, timeout: float = 10.0) -> None:
        begun = await self.begin(timeout)
        source = Described(ulong(0x28), [address])
        target = Described(ulong(0x29), ["bench-target"])
        self.write(frame(ATTACH, ["bench-receiver", uint(0), True, None, None, source, target]))
        attached = await self.expect(ATTACH, timeout)
        if self.error:
            raise Amqp10Error(self.error)
        self.incoming_next = int(begun[1] or 0)
        self.initial_count = int(attached[9] or 0)
        self.grant(credit)

    def grant(self, credit: int) -> None:
        """Link credit for ``credit`` more deliveries from the ones received so far."""
        self.write(frame(FLOW, [uint((self.incoming_next + self.deliveries) & 0xFFFFFFFF),
                                uint(1 << 20), uint(0), uint(1 << 20), uint(0),
                                uint((self.initial_count + self.deliveries) & 0xFFFFFFFF),
                                uint(credit)]))


async def drain(host: str, port: int, address: str, total: int, prefetch: int,
                ack_every: int, mark: Callable[[], None], ssl: SSLContext | None = None
                ) -> dict[str, Any]:
    """Receive ``total`` deliveries from ``address`` with ``prefetch`` link credit, settling
    (accepted) and granting credit again every ``ack_every`` deliveries, as the 0-9-1 drain
    acks with ``multiple``; ``mark()`` at the attach and at the last delivery."""
    loop = asyncio.get_running_loop()
    tls: dict[str, Any] = {"ssl": ssl, "server_hostname": "localhost"} if ssl else {}
    _, client = await asyncio.wait_for(
        loop.create_connection(Amqp10Receiver, host, port, **tls), 10)
    done: asyncio.Future[None] = loop.create_future()
    settled = 0

    def on_delivery(n: int) -> None:
        nonlocal settled
        if n % ack_every == 0 or n == total:
            first = client.first_id
            assert first is not None
            client.write(disposition_frame(first + settled, first + n - 1))
            settled = n
            client.grant(prefetch)
        if n >= total and not done.done():
            done.set_result(None)

    client.on_delivery = on_delivery
    try:
        mark()
        await client.open_receiver(address, prefetch)
        await asyncio.wait([done, client.lost], timeout=120,
                           return_when=asyncio.FIRST_COMPLETED)
        mark()
    finally:
        error = client.error
        await client.close()
    if client.deliveries < total:
        raise Amqp10Error(f"drain: {client.deliveries}/{total} delivered"
                          + (f" ({error})" if error else ""))
    return {"msgs": client.deliveries}
