"""The proxy's own minimal AMQP 1.0 *sender*: the spool replayer's way back to the broker.

The spool keeps an AMQP 1.0 message as the encoded sections a client transferred, with the
link's target address and the transfer's message-format. Replaying it through a general
client library would decode and re-encode the message (and lose what the library does not
model); this client sends the stored bytes unchanged as the transfer's payload, so the
broker stores exactly what it would have stored had the proxy not spooled it.

It is built on the proxy's own codec (``floodwall.wire.amqp10``) and does only what replay needs:
SASL (PLAIN, or ANONYMOUS without a username), one connection with one session, and sender
links in mode *unsettled* / *first*: every delivery is sent unsettled and the broker settles
it with its outcome, which resolves that delivery's future (``Confirm`` from the 0-9-1
client: ACK for *accepted*, NACK for any other outcome, LOST when the link, session or
connection ends first). Futures are always resolved with a ``Confirm``, never an exception.

Flow control follows the spec rather than RabbitMQ 3.10's generosity, because RabbitMQ 4
grants small windows and the replayer must neither stall nor overrun them:

* session flow (2.5.6): the broker's incoming window, ``next-incoming-id + incoming-window
  - next-outgoing-id`` from its begin and every flow, bounds the transfer *frames* we send;
* link credit (2.6.7): ``delivery-count + link-credit`` from the broker's flow bounds the
  deliveries; a drain request is answered, when nothing is waiting to be sent, by advancing
  the delivery-count to the limit and a flow with credit 0;
* both are pure arithmetic in ``SessionWindow`` and ``ReplayLinkCredit`` (serial numbers
  wrapping at 2^32), tested without a broker.

A message larger than the broker's max-frame-size goes out as several transfer frames with
``more=true``. Nothing is buffered without bound: ``send`` waits for credit, for the window
and, when the socket lags, for the transport's write buffer to drain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import struct
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from floodwall.io.amqp_client import WRITE_HIGH_WATER, AmqpClientError, Confirm
from floodwall.io.tls import TlsFailure, UpstreamTlsContext, tls_error
from floodwall.io.upstreams import Upstreams
from floodwall.io.writes import BatchedWrites
from floodwall.ops.logs import event
from floodwall.wire.amqp10.addresses import queue_address
from floodwall.wire.amqp10.credit import serial_add, serial_diff
from floodwall.wire.amqp10.errors import ProtocolError
from floodwall.wire.amqp10.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    HEADER_SIZE,
    MIN_MAX_FRAME_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    NeedData,
    frame,
    next_frame,
)
from floodwall.wire.amqp10.performatives import (
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SASL_INIT,
    SASL_MECHANISMS,
    SASL_OK,
    SASL_OUTCOME,
    SOURCE,
    TARGET,
    TRANSFER,
    Attach,
    Begin,
    Detach,
    Ending,
    ErrorInfo,
    Open,
    Role,
    SaslOutcome,
    decode_composite,
    descriptor_code,
    encode_performative,
    performative,
    transfer_body,
)
from floodwall.wire.amqp10.types import Array, Described, Symbol, UByte, UInt

__all__ = [
    "Amqp10Client",
    "Amqp10Sender",
    "ReplayLinkCredit",
    "SessionWindow",
    "outcome_confirm",
    "transfer_frames",
]

log = logging.getLogger("floodwall.upstream")

MAX_FRAME_SIZE: Final = 65536
"""The max-frame-size we announce: we only receive small frames (flow, disposition...)."""
INCOMING_WINDOW: Final = 65536
"""Our session incoming window. We never receive transfers; any value keeps the spec happy."""
OUTGOING_WINDOW: Final = 0xFFFFFFFF
"""Our outgoing window: informational in 1.0, the broker's incoming window is what binds us."""
INITIAL_OUTGOING_ID: Final = 0
"""Our first transfer-id (2.5.6 lets it be anything)."""
INITIAL_DELIVERY_COUNT: Final = 0
"""Every sender link's initial-delivery-count (2.6.7 lets it be anything)."""
CLOSE_WAIT: Final = 2.0
"""Seconds ``close`` waits for the broker's answering close (or detach)."""
SASL_CODES: Final = {1: "auth", 2: "sys", 3: "sys-perm", 4: "sys-temp"}

# Delivery states (part 3.4) by descriptor code.
RECEIVED: Final = 0x23
ACCEPTED: Final = 0x24
REJECTED: Final = 0x25
RELEASED: Final = 0x26
MODIFIED: Final = 0x27
_OUTCOMES: Final = {ACCEPTED: Confirm.ACK, REJECTED: Confirm.NACK, RELEASED: Confirm.NACK,
                    MODIFIED: Confirm.NACK}

_HEARTBEAT: Final = frame(b"", 0)
_TAG: Final = struct.Struct(">Q")


# ---------------------------------------------------------------------------------------------
# Pure accounting: no frames, no I/O; every id and count is a serial number modulo 2^32.


@dataclass(slots=True)
class SessionWindow:
    """The outgoing half of one session's flow control (2.5.6), as seen by a pure sender.

    ``next_outgoing_id`` numbers our transfer *frames* (a multi-frame delivery takes one id per
    frame); ``next_delivery_id`` numbers deliveries, a counter of its own, so dispositions name
    deliveries whatever their size. ``remote_limit`` is the transfer-id at which the broker's
    incoming window closes: its ``next-incoming-id + incoming-window`` (a flow that crossed our
    transfers in flight still gives the right limit, which a plain window figure would not).
    ``remote_next_outgoing_id`` is echoed as our next-incoming-id in the flows we send.
    """

    initial_outgoing_id: int = INITIAL_OUTGOING_ID
    next_outgoing_id: int = INITIAL_OUTGOING_ID
    next_delivery_id: int = 0
    remote_limit: int | None = None  # None: no begin from the broker yet
    remote_next_outgoing_id: int | None = None

    def remote_begin(self, next_outgoing_id: int, incoming_window: int) -> None:
        """The broker's begin: its window counts from our initial transfer-id."""
        self.remote_next_outgoing_id = next_outgoing_id
        self.remote_limit = serial_add(self.initial_outgoing_id, incoming_window)

    def remote_flow(self, next_incoming_id: int | None, incoming_window: int,
                    next_outgoing_id: int) -> None:
        """A flow from the broker; a null next-incoming-id means it has not seen our begin."""
        base = self.initial_outgoing_id if next_incoming_id is None else next_incoming_id
        self.remote_limit = serial_add(base, incoming_window)
        self.remote_next_outgoing_id = next_outgoing_id

    @property
    def room(self) -> int:
        """Transfer frames we may send now (0 before the broker's begin)."""
        if self.remote_limit is None:
            return 0
        return max(0, serial_diff(self.remote_limit, self.next_outgoing_id))

    def sent_frame(self) -> None:
        """One transfer frame went out: it took a transfer-id."""
        self.next_outgoing_id = serial_add(self.next_outgoing_id, 1)

    def take_delivery_id(self) -> int:
        """The delivery-id for a new delivery."""
        delivery_id = self.next_delivery_id
        self.next_delivery_id = serial_add(delivery_id, 1)
        return delivery_id


@dataclass(slots=True)
class ReplayLinkCredit:
    """One sender link's credit (2.6.7): how far its delivery-count may go.

    ``limit`` is the broker's ``delivery-count + link-credit`` (the broker's delivery-count is
    null until it has seen our attach; it then counts from our initial-delivery-count).
    ``drain`` is set while the broker asked us to use up or give back our credit.
    """

    initial_delivery_count: int = INITIAL_DELIVERY_COUNT
    delivery_count: int = INITIAL_DELIVERY_COUNT
    limit: int | None = None  # None: no credit granted yet
    drain: bool = False

    def receiver_flow(self, delivery_count: int | None, link_credit: int, drain: bool) -> None:
        """A flow from the broker (the receiver) for this link."""
        base = self.initial_delivery_count if delivery_count is None else delivery_count
        self.limit = serial_add(base, link_credit)
        self.drain = drain

    @property
    def credit(self) -> int:
        """Deliveries we may start now."""
        if self.limit is None:
            return 0
        return max(0, serial_diff(self.limit, self.delivery_count))

    def sent(self) -> None:
        """A delivery started (its first frame went out): it used one credit."""
        self.delivery_count = serial_add(self.delivery_count, 1)

    def complete_drain(self) -> bool:
        """With nothing to send: give back what credit is left, as a drain asks.

        Returns True when a flow must now tell the broker (delivery-count advanced to the
        limit, credit 0); False when no drain was asked for.
        """
        if not self.drain:
            return False
        if self.limit is not None and self.credit > 0:
            self.delivery_count = self.limit
        self.drain = False
        return True


def transfer_frames(handle: int, delivery_id: int, tag: bytes, message_format: int,
                    message: bytes, max_frame_size: int, channel: int = 0) -> list[bytes]:
    """The transfer frames of one unsettled delivery, split to fit ``max_frame_size``.

    The first frame carries delivery-id, delivery-tag and message-format; continuations carry
    only the handle and ``more`` (2.7.5 lets them omit the rest). Every frame but the last
    has ``more=true``. An empty message is one frame with an empty payload.
    """
    first_perf = transfer_body(handle, delivery_id, tag, message_format, more=False)
    room = max_frame_size - HEADER_SIZE - len(first_perf)
    if len(message) <= room:
        return [frame(first_perf + message, channel)]
    # true and false encode to one byte each: the performative's size does not change.
    more_first = transfer_body(handle, delivery_id, tag, message_format, more=True)
    cont_more = encode_performative(TRANSFER, handle=UInt(handle), more=True)
    cont_last = encode_performative(TRANSFER, handle=UInt(handle), more=False)
    frames = [frame(more_first + message[:room], channel)]
    pos = room
    cont_room = max_frame_size - HEADER_SIZE - len(cont_more)
    view = memoryview(message)
    while pos < len(message):
        chunk = view[pos:pos + cont_room]
        pos += len(chunk)
        perf = cont_more if pos < len(message) else cont_last
        frames.append(frame(perf + chunk, channel))
    return frames


def outcome_confirm(state: object) -> Confirm | None:
    """The Confirm for a disposition's delivery state; None when it is not an outcome yet.

    *accepted* is ACK; *rejected*, *released* and *modified* are NACK (the broker did not
    take the message: replay it again). A settlement with no state at all is NACK too, never
    ACK: we cannot tell it stored the message.
    """
    if state is None:
        return Confirm.NACK
    if not isinstance(state, Described):
        return Confirm.NACK
    code = descriptor_code(state.descriptor)
    if code == RECEIVED:
        return None
    return _OUTCOMES.get(code if code is not None else -1, Confirm.NACK)


def _error_text(error: ErrorInfo | None, default: str) -> str:
    if error is None:
        return default
    if error.description:
        return f"{error.condition}: {error.description}"
    return error.condition


def _mechanisms(fields: list[object]) -> list[str]:
    value = fields[0] if fields else None
    if isinstance(value, Symbol):
        return [str(value)]
    if isinstance(value, Array):
        return [str(item) for item in value.items]
    return []


def _uint(fields: list[object], index: int) -> int | None:
    value = fields[index] if index < len(fields) else None
    return int(value) if isinstance(value, int) and not isinstance(value, bool) else None


def _flag(fields: list[object], index: int) -> bool:
    return index < len(fields) and fields[index] is True


# ---------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Pending:
    sender: Amqp10Sender
    future: asyncio.Future[Confirm]
    # Told the broker's delivery state itself (an outcome) before the future resolves.
    on_state: Callable[[object], None] | None = None


class Amqp10Sender:
    """One sender link: ``await send(message)`` returns a future of its Confirm.

    Deliveries on one link go out one after another (a multi-frame delivery's frames are
    contiguous on its link); links of one client share the session's window.
    """

    def __init__(self, client: Amqp10Client, handle: int, name: str, address: str) -> None:
        self.client = client
        self.handle = handle
        self.name = name
        self.address = address
        self.remote_handle: int | None = None
        self.credit = ReplayLinkCredit()
        self.max_message_size: int | None = None
        self.closed_reason: str | None = None
        self._next_tag = 0
        self._lock = asyncio.Lock()
        self._busy = 0  # send() calls in progress (holding or awaiting the lock)
        loop = asyncio.get_running_loop()
        self._attached: asyncio.Future[Attach | Detach] = loop.create_future()
        self._detached: asyncio.Future[Detach] = loop.create_future()
        self.sent = 0
        self.acked = 0
        self.nacked = 0

    @property
    def open(self) -> bool:
        return self.closed_reason is None and self.client.connected

    @property
    def unsettled(self) -> int:
        return sum(1 for p in self.client._unsettled.values() if p.sender is self)

    async def send(self, message: bytes, message_format: int = 0,
                   on_state: Callable[[object], None] | None = None
                   ) -> asyncio.Future[Confirm]:
        """Send one message (its encoded sections) as an unsettled delivery (``on_state``:
        told the broker's outcome as it sent it, before the future resolves).

        Waits for link credit and for the session's window, frame by frame. Raises
        AmqpClientError when the link or connection is gone before the first frame went out;
        after that the future tells (LOST if the end came first). A message above the link's
        max-message-size is not sent: its future is NACK at once (the broker would detach).
        """
        client = self.client
        self._busy += 1
        try:
            async with self._lock:
                session = client.session
                if not await client._wait_until(
                        lambda: self.credit.credit > 0 and session.room > 0, self):
                    raise AmqpClientError(self._gone())
                fut: asyncio.Future[Confirm] = asyncio.get_running_loop().create_future()
                if self.max_message_size and len(message) > self.max_message_size:
                    self.nacked += 1
                    fut.set_result(Confirm.NACK)
                    return fut
                delivery_id = session.take_delivery_id()
                tag = _TAG.pack(self._next_tag)
                self._next_tag += 1
                frames = transfer_frames(self.handle, delivery_id, tag, message_format,
                                         message, client.max_frame_size)
                client._unsettled[delivery_id] = _Pending(self, fut, on_state)
                self.credit.sent()
                self.sent += 1
                written = 0
                try:
                    for data in frames:
                        if written and not await client._wait_until(
                                lambda: session.room > 0, self):
                            break  # gone mid-delivery: the future is LOST already
                        client._write(data)
                        session.sent_frame()
                        written += 1
                        if client.writes.backlog() > WRITE_HIGH_WATER:
                            await client.drain()
                except asyncio.CancelledError:
                    if 0 < written < len(frames):
                        # Half a delivery is on the link: the next one would read as its
                        # continuation. The link cannot be used again.
                        self._abandon("send cancelled in the middle of a multi-frame delivery")
                    raise
                return fut
        finally:
            self._busy -= 1
            if self._busy == 0:
                self._maybe_drain()

    def _gone(self) -> str:
        return self.closed_reason or self.client.closed_reason or "not connected"

    # -- frames from the broker --------------------------------------------------------
    def on_flow(self, fields: list[object]) -> None:
        credit = _uint(fields, 6)
        self.credit.receiver_flow(_uint(fields, 5), credit or 0, _flag(fields, 8))
        if _flag(fields, 9):  # echo: the broker wants our link state
            self.client._send_flow(self)
        if self._busy == 0:
            self._maybe_drain()

    def _maybe_drain(self) -> None:
        if self.closed_reason is None and self.credit.complete_drain():
            self.client._send_flow(self, drain=True)

    def _settled(self, result: Confirm) -> None:
        if result is Confirm.ACK:
            self.acked += 1
        else:
            self.nacked += 1

    def lost(self, reason: str) -> None:
        """The link (or all of the connection) is gone: its unsettled deliveries are LOST."""
        if self.closed_reason is None:
            self.closed_reason = reason
        client = self.client
        for delivery_id, pending in list(client._unsettled.items()):
            if pending.sender is self:
                del client._unsettled[delivery_id]
                if not pending.future.done():
                    pending.future.set_result(Confirm.LOST)
        client._forget(self)
        client._notify()

    def _abandon(self, reason: str) -> None:
        """Detach (closed) at once and fail what is in flight: the link is unusable."""
        if self.closed_reason is None:
            self.closed_reason = reason
            with contextlib.suppress(AmqpClientError):
                self.client._send(encode_performative(DETACH, handle=UInt(self.handle),
                                                      closed=True))
        self.lost(reason)

    async def close(self, timeout: float = CLOSE_WAIT) -> None:
        """Detach with closed=true and wait briefly for the broker's detach; deliveries it
        settles meanwhile resolve as usual, the rest become LOST. Never raises."""
        if self.closed_reason is not None:
            return
        self.closed_reason = "closed"  # no new sends; waiting ones give up
        client = self.client
        client._notify()
        if client.connected:
            with contextlib.suppress(AmqpClientError, OSError):
                client._send(encode_performative(DETACH, handle=UInt(self.handle), closed=True))
                with contextlib.suppress(TimeoutError, AmqpClientError):
                    await asyncio.wait_for(asyncio.shield(self._detached), timeout)
        self.lost("closed")


class Amqp10Reading:
    """What the proxy's own 1.0 connection does with what the broker sends (``Amqp10Client``
    extends it): flows, dispositions, detaches, the close; a broken connection fails every
    sender and every delivery waiting for its outcome."""

    _reader: asyncio.StreamReader | None
    writes: BatchedWrites
    _unwatch: Callable[[], None] | None  # forgets the watch on the node (``Upstreams``)
    _idle_timeout: float
    max_frame_size: int
    session: SessionWindow
    _senders: dict[int, Amqp10Sender]
    _by_remote: dict[int, Amqp10Sender]
    _unsettled: dict[int, _Pending]
    _changed: asyncio.Event
    _closing: bool
    _peer_closed: asyncio.Event | None
    closed_reason: str | None

    async def _read_frame(self, limit: int, frame_type: int) -> tuple[int | None, list[object]]:
        """The next frame: its performative code (None: a heartbeat) and fields."""
        assert self._reader is not None
        buf = await self._reader.readexactly(HEADER_SIZE)
        size = int.from_bytes(buf[:4], "big")
        if HEADER_SIZE < size <= limit:  # else next_frame explains what is wrong with it
            buf += await self._reader.readexactly(size - HEADER_SIZE)
        try:
            found = next_frame(buf, 0, limit, frame_type)
            if isinstance(found, NeedData):  # only when the size is below the header's
                raise AmqpClientError(f"frame size {size} is below the frame header's")
            if found.code is None:
                return None, []
            code, fields, _ = decode_composite(buf, found.body, found.end)
        except ProtocolError as exc:
            raise AmqpClientError(f"undecodable frame from broker: {exc}") from None
        return code, fields

    def _forget(self, sender: Amqp10Sender) -> None:
        if self._senders.get(sender.handle) is sender and sender._detached.done():
            del self._senders[sender.handle]
        if sender.remote_handle is not None and self._by_remote.get(
                sender.remote_handle) is sender and sender._detached.done():
            del self._by_remote[sender.remote_handle]

    def _send_flow(self, sender: Amqp10Sender | None, drain: bool = False) -> None:
        raise NotImplementedError

    def _send(self, body: bytes) -> None:
        raise NotImplementedError

    # -- reading -------------------------------------------------------------------------
    async def _read_forever(self) -> None:
        reason = "connection closed by broker"
        try:
            while True:
                if self._idle_timeout:
                    async with asyncio.timeout(self._idle_timeout):
                        code, fields = await self._read_frame(MAX_FRAME_SIZE, AMQP_FRAME)
                else:
                    code, fields = await self._read_frame(MAX_FRAME_SIZE, AMQP_FRAME)
                if code is not None and self._dispatch(code, fields):
                    return
        except TimeoutError:
            reason = f"broker silent for {self._idle_timeout}s (idle-time-out)"
        except asyncio.IncompleteReadError:
            reason = "connection closed by broker (EOF)"
        except (OSError, AmqpClientError) as exc:
            reason = f"connection lost: {exc}"
        except ProtocolError as exc:
            reason = f"undecodable frame from broker: {exc}"
        except Exception as exc:  # a bug here must not leave futures hanging
            log.exception("amqp10 client reader failed")
            reason = f"internal error: {exc!r}"
        self._fail(reason)

    def _dispatch(self, code: int, fields: list[object]) -> bool:
        """Handle one frame from the broker; True when the connection is over."""
        if code == FLOW:
            self._on_flow(fields)
        elif code == DISPOSITION:
            self._on_disposition(fields)
        elif code == ATTACH:
            attach = Attach.from_fields(fields)
            sender = self._by_name(attach.name)
            if sender is not None:
                sender.remote_handle = attach.handle
                self._by_remote[attach.handle] = sender
                if not sender._attached.done():
                    sender._attached.set_result(attach)
                max_size = _uint(fields, 10)
                sender.max_message_size = max_size or None
        elif code == DETACH:
            self._on_detach(Detach.from_fields(fields))
        elif code == END:
            # Our only session is gone (RabbitMQ 3.10 ends it to refuse an attach to a
            # missing exchange): answer, close the connection, fail everything in flight.
            error = Ending.from_fields(fields).error
            with contextlib.suppress(AmqpClientError):
                if not self._closing:
                    self._send(encode_performative(END))
                    self._send(encode_performative(CLOSE))
            self._fail(f"broker ended the session: {_error_text(error, 'no reason')}")
            return True
        elif code == CLOSE:
            error = Ending.from_fields(fields).error
            if self._peer_closed is not None:
                self._peer_closed.set()
            if not self._closing:
                with contextlib.suppress(AmqpClientError):
                    self._send(encode_performative(CLOSE))
                self._fail(f"broker closed the connection: {_error_text(error, 'no reason')}")
            else:
                self._fail("closed")
            return True
        return False

    def _by_name(self, name: str) -> Amqp10Sender | None:
        for sender in self._senders.values():
            if sender.name == name:
                return sender
        return None

    def _on_flow(self, fields: list[object]) -> None:
        incoming_window = _uint(fields, 1)
        next_outgoing_id = _uint(fields, 2)
        if incoming_window is not None and next_outgoing_id is not None:
            self.session.remote_flow(_uint(fields, 0), incoming_window, next_outgoing_id)
        handle = _uint(fields, 4)
        if handle is not None:
            sender = self._by_remote.get(handle)
            if sender is not None and sender.closed_reason is None:
                sender.on_flow(fields)
        elif _flag(fields, 9):  # a session-level echo
            self._send_flow(None)
        self._notify()

    def _on_disposition(self, fields: list[object]) -> None:
        if not _flag(fields, 0):  # role receiver: about our deliveries; sender: not ours
            return
        first = _uint(fields, 1)
        if first is None:
            return
        last = _uint(fields, 2)
        last = first if last is None else last
        state = fields[4] if len(fields) > 4 else None
        settled = _flag(fields, 3)
        result = outcome_confirm(state) if (settled or state is not None) else None
        if result is None:
            return
        span = serial_diff(last, first) + 1
        if span <= 0:
            return
        unsettled = self._unsettled
        if span <= len(unsettled):
            ids = [serial_add(first, i) for i in range(span)]
        else:  # a wide range (RabbitMQ sends overlapping ones): walk what is unsettled
            ids = [d for d in unsettled if 0 <= serial_diff(d, first) < span]
        for delivery_id in ids:
            pending = unsettled.pop(delivery_id, None)
            if pending is None:
                continue
            pending.sender._settled(result)
            if pending.on_state is not None:
                pending.on_state(state)
            if not pending.future.done():
                pending.future.set_result(result)
        if not settled:
            # The broker left the settling to us (it should not in mode first): settle.
            with contextlib.suppress(AmqpClientError):
                self._send(encode_performative(
                    DISPOSITION, role=Role.SENDER.value, first=UInt(first), last=UInt(last),
                    settled=True, state=state))

    def _on_detach(self, detach: Detach) -> None:
        sender = self._by_remote.get(detach.handle)
        if sender is None:
            return
        if not sender._detached.done():
            sender._detached.set_result(detach)
        if not sender._attached.done():
            sender._attached.set_result(detach)
        if sender.closed_reason is None:
            # The broker detached on its own: answer (2.6.5), fail what is in flight.
            with contextlib.suppress(AmqpClientError):
                self._send(encode_performative(DETACH, handle=UInt(sender.handle),
                                               closed=detach.closed))
            reason = _error_text(detach.error, "broker detached the link")
            event(log, "amqp10_link_detached", logging.WARNING, address=sender.address,
                  reason=reason)
            sender.lost(f"broker detached the link: {reason}")
        else:
            self._forget(sender)

    def _node_lost(self, reason: str) -> None:
        """The readiness probe found this connection's node no longer answering: end it now
        (a hung node's would wait for the idle timeout)."""
        self._unwatch = None
        if self.writes.writer is not None:
            self.writes.writer.transport.abort()
        self._fail(f"the broker node stopped answering: {reason}")

    def _fail(self, reason: str) -> None:
        """The connection is over: every pending future and waiter learns it."""
        if self._unwatch is not None:
            self._unwatch()
            self._unwatch = None
        if self.closed_reason is None:
            self.closed_reason = reason
            if not self._closing:
                event(log, "own_connection_lost", logging.WARNING, protocol="amqp10",
                      reason=reason)
        for sender in list(self._senders.values()):
            for fut in (sender._attached, sender._detached):
                if not fut.done():
                    fut.set_exception(AmqpClientError(reason))
                    fut.exception()  # retrieved: no "never retrieved" warning if unused
            sender.lost(reason)
        self._senders.clear()
        self._by_remote.clear()
        for pending in self._unsettled.values():
            if not pending.future.done():
                pending.future.set_result(Confirm.LOST)
        self._unsettled.clear()
        self.writes.flush()  # a last end or close goes out before the socket closes
        if self.writes.writer is not None:
            self.writes.writer.close()
        self._notify()

    # -- waiting -------------------------------------------------------------------------
    def _notify(self) -> None:
        """Wake every waiter (credit, window or liveness changed). Everyone waiting on the
        old event wakes; later waits use a fresh one, so no wake-up is ever missed and no
        waiter has to clear a shared event another may still be about to wait on."""
        self._changed.set()
        self._changed = asyncio.Event()


class Amqp10Client(Amqp10Reading):
    """One connection with one session; ``await connect()``, ``open_sender()``, ``close()``."""

    def __init__(self, upstreams: Upstreams, username: str, password: str, vhost: str,
                 container_id: str = "floodwall-spool-replay", idle_timeout: float = 60.0,
                 tls: UpstreamTlsContext | None = None) -> None:
        """``upstreams``: the broker's nodes (the first that takes the connection serves
        it). ``tls``: amqps (floodwall/io/tls.py); with its ``sasl_external`` the login is SASL
        EXTERNAL (the user is the client certificate's), else PLAIN (ANONYMOUS without a
        username)."""
        self.upstreams, self.vhost = upstreams, vhost
        self.host = upstreams.first[0]  # the node connected to, once connected
        self._unwatch: Callable[[], None] | None = None
        self.tls = tls
        self.container_id = container_id
        self._username, self._password = username, password
        self._idle_timeout = idle_timeout  # ours: the broker must send something this often
        self._reader: asyncio.StreamReader | None = None
        # The socket's writer once connected, and what is written to it, a loop turn at a time.
        self.writes = BatchedWrites(self._can_write)
        self._read_task: asyncio.Task[None] | None = None
        self._beat_task: asyncio.Task[None] | None = None
        self.max_frame_size = MIN_MAX_FRAME_SIZE  # the broker's, once it opened
        self.broker_open: Open | None = None
        self.broker_begin: Begin | None = None
        self.handle_max = 0xFFFFFFFF
        self.session = SessionWindow()
        self._senders: dict[int, Amqp10Sender] = {}  # by our handle
        self._by_remote: dict[int, Amqp10Sender] = {}  # by the broker's handle
        self._unsettled: dict[int, _Pending] = {}  # by delivery-id
        self._changed = asyncio.Event()
        self._closing = False
        self._peer_closed: asyncio.Event | None = None
        self.closed_reason: str | None = None
        self._greeted = False  # the broker's SASL header arrived

    @property
    def connected(self) -> bool:
        return (self.writes.writer is not None and self.closed_reason is None
                and not self._closing and self.broker_begin is not None)

    # -- connecting ----------------------------------------------------------------------
    async def connect(self, timeout: float) -> None:
        """TCP, SASL, open (hostname ``vhost:<vhost>``, RabbitMQ's way to pick a vhost) and
        one session. Raises AmqpClientError (refused, with the broker's reason), OSError or
        TimeoutError; on failure the socket is closed."""
        try:
            async with asyncio.timeout(timeout):
                reader, writer, endpoint = await self.upstreams.open(self.tls, timeout)
                self._reader, self.writes.writer, self.host = reader, writer, endpoint.host
                try:
                    await self._sasl()
                    await self._open()
                except (OSError, asyncio.IncompleteReadError) as exc:
                    # TLS 1.3: a refused certificate shows after the handshake
                    failure = tls_error(exc, self.tls, self.host, greeted=self._greeted)
                    if isinstance(failure, asyncio.IncompleteReadError):
                        raise AmqpClientError(
                            "broker closed the connection during the handshake") from None
                    raise failure from None
        except BaseException:
            if self.writes.writer is not None:
                self.writes.writer.close()
            self.closed_reason = self.closed_reason or "connect failed"
            raise
        self._peer_closed = asyncio.Event()
        self._unwatch = self.upstreams.watch(endpoint, self._node_lost)
        loop = asyncio.get_running_loop()
        self._read_task = loop.create_task(self._read_forever(), name="amqp10-client-read")
        idle = self.broker_open.idle_time_out if self.broker_open else None
        if idle:
            self._beat_task = loop.create_task(self._beat_forever(idle / 2000),
                                               name="amqp10-client-beat")

    async def _header(self, expected: bytes) -> None:
        assert self._reader is not None
        try:
            got = await self._reader.readexactly(HEADER_SIZE)
        except asyncio.IncompleteReadError as exc:
            failure = tls_error(exc, self.tls, self.host,
                                greeted=self._greeted or bool(exc.partial))
            if isinstance(failure, TlsFailure):
                raise failure from None
            raise AmqpClientError(f"broker closed the connection instead of answering the "
                                  f"protocol header (got {exc.partial!r})") from None
        if got != expected:
            raise AmqpClientError(f"broker answered protocol header {got!r}, not {expected!r}")

    async def _sasl(self) -> None:
        assert self.writes.writer is not None
        self.writes.writer.write(SASL_HEADER)
        await self._header(SASL_HEADER)
        self._greeted = True
        code, fields = await self._read_frame(MIN_MAX_FRAME_SIZE, SASL_FRAME)
        if code != SASL_MECHANISMS:
            raise AmqpClientError(f"expected sasl-mechanisms, got performative {code}")
        offered = _mechanisms(fields)
        external = self.tls is not None and self.tls.settings.sasl_external
        mechanism = "EXTERNAL" if external else "PLAIN" if self._username else "ANONYMOUS"
        if mechanism not in offered:
            raise AmqpClientError(f"broker does not offer SASL {mechanism} (offers {offered})")
        response = (f"\0{self._username}\0{self._password}".encode()
                    if mechanism == "PLAIN" else b"")
        self.writes.writer.write(frame(encode_performative(
            SASL_INIT, mechanism=Symbol(mechanism), initial_response=response,
            hostname=self.host), 0, SASL_FRAME))
        code, fields = await self._read_frame(MIN_MAX_FRAME_SIZE, SASL_FRAME)
        if code != SASL_OUTCOME:
            raise AmqpClientError(f"expected sasl-outcome, got performative {code}")
        try:
            outcome = SaslOutcome.from_fields(fields)
        except ProtocolError as exc:
            raise AmqpClientError(f"undecodable sasl-outcome: {exc}") from None
        if outcome.code != SASL_OK:
            raise AmqpClientError(
                f"broker refused SASL {mechanism} login"
                f"{f' for {self._username!r}' if self._username else ''}: sasl-outcome "
                f"{outcome.code} ({SASL_CODES.get(outcome.code, 'unknown')})")

    async def _open(self) -> None:
        """Open, then begin once the broker's open is in: RabbitMQ 4 refuses an unknown vhost
        with a close and closes the socket at once, and a begin sent after it would turn that
        into a reset that discards its close (and reason) unread."""
        assert self.writes.writer is not None
        self.writes.writer.write(AMQP_HEADER + frame(encode_performative(
            OPEN, container_id=self.container_id, hostname=f"vhost:{self.vhost}",
            max_frame_size=UInt(MAX_FRAME_SIZE),
            idle_time_out=UInt(int(self._idle_timeout * 1000)) if self._idle_timeout else None,
        )))
        await self._header(AMQP_HEADER)
        while self.broker_begin is None:
            try:
                code, fields = await self._read_frame(MAX_FRAME_SIZE, AMQP_FRAME)
            except (ConnectionResetError, asyncio.IncompleteReadError):
                if self.broker_open is not None:
                    raise
                # RabbitMQ 4.0 drops the connection without a close for a vhost that does
                # not exist (or that the user may not open)
                raise AmqpClientError(
                    f"broker refused the connection (vhost {self.vhost!r}): it closed the "
                    "connection at open without a reason (an unknown vhost, or one the "
                    "user may not open)") from None
            try:
                if code == OPEN:
                    self.broker_open = Open.from_fields(fields)
                    self.max_frame_size = max(MIN_MAX_FRAME_SIZE,
                                              self.broker_open.max_frame_size)
                    self.writes.writer.write(frame(encode_performative(
                        BEGIN, next_outgoing_id=UInt(INITIAL_OUTGOING_ID),
                        incoming_window=UInt(INCOMING_WINDOW),
                        outgoing_window=UInt(OUTGOING_WINDOW))))
                elif code == BEGIN:
                    begin = Begin.from_fields(fields)
                    self.session.remote_begin(begin.next_outgoing_id, begin.incoming_window)
                    self.handle_max = begin.handle_max
                    self.broker_begin = begin
                elif code == CLOSE:
                    error = Ending.from_fields(fields).error
                    raise AmqpClientError("broker refused the connection (vhost "
                                          f"{self.vhost!r}): {_error_text(error, 'no reason')}")
                elif code == END:
                    error = Ending.from_fields(fields).error
                    raise AmqpClientError(
                        f"broker refused the session: {_error_text(error, 'no reason')}")
            except ProtocolError as exc:
                raise AmqpClientError(f"undecodable frame from broker: {exc}") from None

    # -- links ---------------------------------------------------------------------------
    def queue_address(self, queue: str) -> str:
        """The target straight to ``queue`` on the broker connected to (its version's form)."""
        return queue_address(queue, self.broker_open.version if self.broker_open else None)

    async def open_sender(self, address: str, timeout: float) -> Amqp10Sender:
        """Attach a sender link to ``address`` (mode unsettled/first).

        Raises AmqpClientError when the broker refuses it (RabbitMQ answers with a null
        target and a detach carrying the error, or with the detach alone), TimeoutError
        when it does not answer in time.
        """
        if not self.connected:
            raise AmqpClientError(self.closed_reason or "not connected")
        handle = 0
        while handle in self._senders:
            handle += 1
        if handle > self.handle_max:
            raise AmqpClientError(f"no link handle left (handle-max {self.handle_max})")
        name = f"{self.container_id}-{handle}-{uuid.uuid4().hex[:12]}"
        sender = Amqp10Sender(self, handle, name, address)
        self._senders[handle] = sender
        try:
            self._send(encode_performative(
                ATTACH, name=name, handle=UInt(handle), role=Role.SENDER.value,
                snd_settle_mode=UByte(0), rcv_settle_mode=UByte(0),
                source=performative(SOURCE), target=performative(TARGET, address=address),
                initial_delivery_count=UInt(INITIAL_DELIVERY_COUNT)))
            async with asyncio.timeout(timeout):
                reply = await sender._attached
                if isinstance(reply, Attach) and reply.target_address is None:
                    # Refused: the reason follows in the broker's detach.
                    reply = await sender._detached
        except BaseException:
            if sender.closed_reason is None:
                sender.lost("attach failed")
            raise
        if isinstance(reply, Detach):
            reason = _error_text(reply.error, "broker detached the link without a reason")
            sender.lost(reason)
            raise AmqpClientError(f"broker refused a sender link to {address!r}: {reason}")
        if sender.closed_reason is not None:  # detached (or the connection died) right after
            raise AmqpClientError(f"broker refused a sender link to {address!r}: "
                                  f"{sender.closed_reason}")
        return sender

    # -- writing -------------------------------------------------------------------------
    def _write(self, data: bytes) -> None:
        """Queue bytes for the socket: written at the end of this loop turn, or at once past
        64 KiB. One write per turn instead of one per frame (a syscall each) is most of the
        replay rate for small messages. Every frame takes this path, so order holds."""
        if self.writes.writer is None or self.closed_reason is not None:
            raise AmqpClientError(self.closed_reason or "not connected")
        self.writes.write(data)

    def _can_write(self) -> bool:
        # Also once closed_reason is set: a last end or close still goes out.
        return self.writes.writer is not None and not self.writes.writer.is_closing()

    async def drain(self) -> None:
        """Until the socket took what was written (or the connection is gone)."""
        await self.writes.drain(self.closed_reason is None)

    def _send(self, body: bytes) -> None:
        self._write(frame(body, 0))

    def _send_flow(self, sender: Amqp10Sender | None, drain: bool = False) -> None:
        """Our session state, and ``sender``'s link state when given (drain, echo)."""
        session = self.session
        link: dict[str, object] = {}
        if sender is not None:
            credit = sender.credit
            link = dict(handle=UInt(sender.handle), delivery_count=UInt(credit.delivery_count),
                        link_credit=UInt(credit.credit), available=UInt(0), drain=drain)
        with contextlib.suppress(AmqpClientError):
            self._send(encode_performative(
                FLOW, next_incoming_id=None if session.remote_next_outgoing_id is None
                else UInt(session.remote_next_outgoing_id),
                incoming_window=UInt(INCOMING_WINDOW),
                next_outgoing_id=UInt(session.next_outgoing_id),
                outgoing_window=UInt(OUTGOING_WINDOW), **link))


    async def _wait_until(self, condition: Callable[[], bool], sender: Amqp10Sender) -> bool:
        """Until ``condition`` holds (True) or the link or connection is gone (False)."""
        while True:
            if sender.closed_reason is not None or not self.connected:
                return False
            if condition():
                return True
            await self._changed.wait()

    async def _beat_forever(self, interval: float) -> None:
        """Empty frames at half the broker's idle-time-out, so it never thinks us dead."""
        interval = max(interval, 0.05)
        while self.closed_reason is None:
            await asyncio.sleep(interval)
            with contextlib.suppress(AmqpClientError, OSError):
                self._write(_HEARTBEAT)

    # -- closing -------------------------------------------------------------------------
    async def close(self) -> None:
        """Close cleanly: send close and wait briefly (``CLOSE_WAIT``) for the broker's;
        deliveries it settles meanwhile resolve as usual, the rest become LOST. Never raises."""
        try:
            if self.writes.writer is not None and self.closed_reason is None and not self._closing:
                # Deliveries stay pending until the broker's close: a disposition that
                # arrives before it still resolves them (fewer LOST, fewer duplicates).
                self._closing = True
                self._notify()
                with contextlib.suppress(AmqpClientError, OSError):
                    self._send(encode_performative(CLOSE))
                    if self._peer_closed is not None:
                        with contextlib.suppress(TimeoutError):
                            await asyncio.wait_for(self._peer_closed.wait(), CLOSE_WAIT)
            self._fail("closed")
            for task in (self._read_task, self._beat_task):
                if task is not None and not task.done():
                    task.cancel()
            for task in (self._read_task, self._beat_task):
                if task is not None:
                    with contextlib.suppress(asyncio.CancelledError, Exception):
                        await task
            if self.writes.writer is not None:
                with contextlib.suppress(OSError, ConnectionError):
                    await self.writes.writer.wait_closed()
        except Exception as exc:  # close never raises: log and move on
            event(log, "own_connection_close_failed", logging.WARNING, protocol="amqp10",
                  reason=repr(exc))

