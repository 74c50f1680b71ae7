"""One proxied AMQP 0-9-1 connection as a sans-IO core: exact relay, tuning, close, channels."""

from __future__ import annotations

import math
import struct
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, Final

from pamqp import commands

from floodwall.wire import relaycore
from floodwall.wire.amqp091.errors import (
    AccessRefused,
    FrameError,
    MethodSyntaxError,
    NotAllowed,
    ProtocolError,
)
from floodwall.wire.amqp091.framing import (
    CONTENT_HEADER_MIN,
    FRAME_BODY,
    FRAME_END,
    FRAME_HEADER,
    FRAME_HEARTBEAT,
    FRAME_METHOD,
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    HEADER_SIZE,
    NEED_DATA,
    WATCHED,
    Buffer,
    count_frames,
    encode_method,
    frame_at,
    method_ids,
    method_key,
    payload_limit,
    scan,
    scan_watching,
)
from floodwall.wire.amqp091.handshake import read_close, read_open, read_start_ok, read_tune
from floodwall.wire.amqp091.hooks import ClientInfo, ForgetChannel, PublishHooks
from floodwall.wire.amqp091.runs import scan_publish_run
from floodwall.wire.amqp091.topology import REPLY_KEYS, REQUEST_KEYS, TopologyWatch
from floodwall.wire.relaycore import (
    EXTERNAL_REFUSED,
    JOINED_READ_MAX,
    CoreOutput,
    Failure,
    FrameCounts,
    GateOutputHooks,
    Side,
)

INTERNAL_ERROR: Final = 541
"""Reply code the client gets when the upstream broker sent a malformed frame."""

VIEWED_BODY_MIN: Final = 16 * 1024
"""A content body frame at least this large that a read leaves incomplete is held as views
of the reads, not copied (``FrameRelay._keep``)."""

SHORTSTR_MAX: Final = 255

_BODY_SIZE = struct.Struct(">Q")  # a content header's body size, after class id and weight
_CONTENT_FRAME_MIN: Final = 22  # a content header frame: 7 + 14 + frame end

_C = commands.Connection
_CH = commands.Channel
_B = commands.Basic
_CF = commands.Confirm


class ChannelState(Enum):
    """Where a channel is in its open/close handshake, as seen on the wire."""

    OPENING = "opening"  # client sent channel.open, broker has not answered open-ok
    OPEN = "open"
    CLOSING = "closing"  # a channel.close passed, its close-ok has not


class ChannelEvent(Enum):
    """A channel-lifecycle method seen passing, from either peer."""

    OPEN = "channel.open"
    OPEN_OK = "channel.open-ok"
    CLOSE = "channel.close"
    CLOSE_OK = "channel.close-ok"


CHANNEL_TRANSITIONS: Final[dict[tuple[ChannelState | None, ChannelEvent], ChannelState | None]] = {
    (None, ChannelEvent.OPEN): ChannelState.OPENING,
    (ChannelState.OPENING, ChannelEvent.OPEN_OK): ChannelState.OPEN,
    (ChannelState.OPENING, ChannelEvent.CLOSE): ChannelState.CLOSING,
    (ChannelState.OPEN, ChannelEvent.CLOSE): ChannelState.CLOSING,
    (ChannelState.CLOSING, ChannelEvent.CLOSE): ChannelState.CLOSING,  # both peers closed
    (ChannelState.CLOSING, ChannelEvent.CLOSE_OK): None,  # gone
}
"""(state, event) -> next state; None is "no such channel". A pair that is not here leaves
the state as it is: the broker, not the proxy, judges channel semantics and will close the
connection itself (e.g. 504 CHANNEL_ERROR for a second channel.open)."""


@dataclass(frozen=True, slots=True)
class TuneParams:
    """The fields of a connection.tune (server proposal) or tune-ok (client's answer)."""

    channel_max: int
    frame_max: int
    heartbeat: int


@dataclass(frozen=True, slots=True)
class CloseReply:
    """A connection.close seen passing: who sent it and why."""

    side: Side
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


Handler = Callable[[Any, int, Buffer, int, int], "int | None"]
"""(core, channel, buf, frame offset, base offset) -> None when the frame passes in place, or
the offset up to which the handler took frames out of the stream (held, absorbed, replaced).
A core's method, called unbound: a table serves every connection of its kind (``_TABLES``),
none is built a connection (the cost of a connection)."""

Tables = tuple[dict[int, Handler], dict[int, Handler]]
Table = tuple[dict[int, Handler], frozenset[int]]  # one direction's handlers, and their keys


class _Inbound:
    """One direction of the relay: its counters, held partial frame and output queue."""

    __slots__ = ("counts", "deferred", "end_due", "handlers", "need", "opaque", "opened_at",
                 "out", "parts", "parts_len", "side", "stop_at", "tail")

    def __init__(self, side: Side, counts: FrameCounts, out: list[Buffer]) -> None:
        self.side = side
        self.counts = counts
        self.out = out  # the queue of the *other* peer
        self.tail = bytearray()  # an incomplete frame, held until the rest arrives
        # Or, for a large content body frame, views of the reads that hold it (no copy).
        self.parts: list[Buffer] = []
        self.parts_len = 0  # bytes in parts
        self.need = 0  # the whole frame's length
        self.handlers: dict[int, Handler] = {}
        self.stop_at: frozenset[int] = frozenset()
        # An opaque run (``FrameRelay.opaque_min``): the body frame whose head has left and
        # whose body bytes pass untouched; ``opaque`` of them still to come, then its
        # frame-end octet (``end_due`` until it has passed, checked). Frames the gate makes
        # for this direction meanwhile wait in ``deferred``: they go after the frame.
        self.opaque = 0
        self.end_due = False
        self.opened_at = 0  # the run's frame's stream offset (error messages)
        self.deferred: list[Buffer] = []

    def read(self, table: Table) -> None:
        """Set what reads each method this direction stops at, and the set of them: both
        shared by every connection of a kind (600 bytes each, not per connection)."""
        self.handlers, self.stop_at = table


# (core class, gate, topology) -> each direction's handlers and the methods it stops at
_TABLES: dict[tuple[type, bool, bool], tuple[Table, ...]] = {}


_NO_CHANNELS: Final[frozenset[int]] = frozenset()


def close_frame(reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> bytes:
    """A connection.close on channel 0; the text is cut to the 255 bytes a shortstr holds."""
    text = reply_text.encode("utf-8")[:SHORTSTR_MAX].decode("utf-8", "ignore")
    method = _C.Close(reply_code, text, class_id, method_id)
    return encode_method(method, 0)


class FrameRelay:
    """The relay half of a 0-9-1 core: both byte streams, the methods every core reads
    (tuning, open, close, channel lifecycle), failures. ``Connection`` adds the publish gate's
    and the topology watch's methods (``_handlers``)."""

    def __init__(self, gate: PublishHooks | None = None, conn_id: int = 0,
                 watch_topology: bool = False, refuse_external: bool = True) -> None:
        """``gate``: the publish gate (with policies), asked about every publish and the
        frames around it. ``watch_topology``: the declares, deletes and binds the broker
        confirms become ``TopologyChange`` events. ``refuse_external``: a client's
        connection.start-ok with SASL EXTERNAL is not relayed; the client gets
        connection.close 403 (``EXTERNAL_REFUSED``)."""
        self.conn_id = conn_id
        self.refuse_external = refuse_external
        self.failure: Failure | None = None
        self.from_client = FrameCounts()
        self.from_server = FrameCounts()

        self.client: ClientInfo | None = None  # from connection.start-ok
        self.virtual_host: str | None = None  # from connection.open
        self.server_tune: TuneParams | None = None  # connection.tune, the broker's proposal
        self.client_tune: TuneParams | None = None  # connection.tune-ok, what is in force
        self.tuned = False
        self.frame_max = FRAME_MIN_SIZE  # until tune-ok, then its frame_max (0 = none)
        self.channel_max = 0  # negotiated by tune-ok (0 = no limit)
        self.heartbeat = 0  # negotiated by tune-ok, seconds (0 = none)
        self.opened = False  # connection.open-ok passed
        self.closing: Side | None = None  # who sent connection.close first
        self.close_reply: CloseReply | None = None
        self.closed = False  # connection.close-ok passed
        self.channels: dict[int, ChannelState] = {}

        self._frame_limit = FRAME_MIN_SIZE  # what scan() enforces; never below FRAME_MIN_SIZE
        # A body frame of which at least this many body bytes are still to come when a read
        # ends inside it passes as an opaque run (0: never): the I/O layer may move them
        # itself (``skip_from_client``), or feed them as any bytes.
        self.opaque_min = 0
        # Frames for each peer, events for the I/O layer; the gate's ForgetChannel, carried out.
        self.output = CoreOutput(_forget_channel, self.channels)
        self._now = 0.0  # the time the current receive call was given
        self._passed = 0  # where a run of publishes that passes in place ended (runs.py)
        self._held_frames = 0  # frames a held run took after its publish's method (runs.py)
        self._client_in = _Inbound(Side.CLIENT, self.from_client, self.output.to_server)
        self._server_in = _Inbound(Side.SERVER, self.from_server, self.output.to_client)
        self.gate = gate
        self.topology = TopologyWatch() if watch_topology else None
        kind = (type(self), gate is not None, watch_topology)
        tables = _TABLES.get(kind)
        if tables is None:
            tables = _TABLES[kind] = tuple((t, frozenset(t)) for t in self._handlers())
        self._client_in.read(tables[0])
        self._server_in.read(tables[1])

    def _handlers(self) -> Tables:
        """What each direction stops at, and what reads each method (``Connection``): the
        same for every core of one class with the same gate and topology settings."""
        raise NotImplementedError
    # --- RelayCore -------------------------------------------------------------------

    #: Reads may come as read-only views (``RelayCore.takes_views``): the core reads them
    #: with ``struct`` and slices, and copies what it decodes.
    takes_views: Final = True

    def receive_from_client(self, data: bytes | memoryview, now: float) -> None:
        """Take bytes read from the client; complete frames are queued for the server."""
        if self.failure is None and data:
            self._now = now
            self._receive(self._client_in, data)

    def receive_from_server(self, data: bytes | memoryview, now: float) -> None:
        """Take bytes read from the broker; complete frames are queued for the client."""
        if self.failure is None and data:
            self._now = now
            self._receive(self._server_in, data)

    # The queued output, read out of ``self.output``.
    data_for_server = relaycore.data_for_server
    data_for_client = relaycore.data_for_client
    chunks_for_server = relaycore.chunks_for_server
    chunks_for_client = relaycore.chunks_for_client
    events = relaycore.events

    # --- state for the rest of the proxy ----------------------------------------------

    @property
    def open_channels(self) -> set[int]:
        """Channels opened by the client whose close handshake has not completed."""
        return set(self.channels)

    @property
    def opaque_from_client(self) -> int:
        """How many of the client's next bytes are the body of a frame whose head has left
        for the broker: they pass untouched, whoever moves them (0: none now)."""
        return self._client_in.opaque

    @property
    def opaque_from_server(self) -> int:
        """As ``opaque_from_client``, for the broker's next bytes."""
        return self._server_in.opaque

    def skip_from_client(self, n: int) -> None:
        """The I/O layer moved ``n`` bytes of the client's opaque run to the broker itself."""
        _skip(self._client_in, n)

    def skip_from_server(self, n: int) -> None:
        """The I/O layer moved ``n`` bytes of the broker's opaque run to the client itself."""
        _skip(self._server_in, n)

    @property
    def pending_from_client(self) -> int:
        """Bytes of an incomplete client frame held back."""
        return len(self._client_in.tail) + self._client_in.parts_len

    @property
    def pending_from_server(self) -> int:
        """Bytes of an incomplete broker frame held back."""
        return len(self._server_in.tail) + self._server_in.parts_len

    # --- relay ------------------------------------------------------------------------

    def _receive(self, inbound: _Inbound, data: bytes | memoryview) -> None:
        if type(data) is not bytes and not (type(data) is memoryview and data.readonly):
            data = bytes(data)  # we keep views of it: it must not change under us
        pos = 0
        if inbound.end_due:
            pos = self._pass_opaque(inbound, data)
            if pos < 0:
                return
        elif inbound.parts:
            pos = self._finish_parts(inbound, data)
            if pos < 0:
                return
        elif inbound.tail:
            tail = inbound.tail
            if len(data) <= JOINED_READ_MAX and len(tail) >= HEADER_SIZE \
                    and frame_at(tail, 0)[2] + FRAME_OVERHEAD - len(tail) <= len(data):
                # The held frame ends in this small read: one pass over both.
                data = b"".join((tail, data))
                inbound.tail = bytearray()
            else:
                pos = self._finish_tail(inbound, data)
                if pos < 0:
                    return
        stop = self._relay(inbound, data, pos)
        if 0 <= stop < len(data):
            self._keep(inbound, data, stop)

    def _keep(self, inbound: _Inbound, data: Buffer, stop: int) -> None:
        """Hold the incomplete frame at ``data[stop:]``, its header already checked: a large
        content body frame as views of the reads (``_finish_parts``), anything else copied."""
        if len(data) - stop >= HEADER_SIZE:
            if self.opaque_min and self._open_run(inbound, data, stop):
                return
            ftype, _, size = frame_at(data, stop)
            if ftype == FRAME_BODY and size >= VIEWED_BODY_MIN:
                inbound.parts = [memoryview(data)[stop:]]
                inbound.parts_len = len(data) - stop
                inbound.need = size + FRAME_OVERHEAD
                return
        inbound.tail = bytearray(memoryview(data)[stop:])

    def _finish_parts(self, inbound: _Inbound, data: Buffer) -> int:
        """Complete the held body frame from ``data``; as ``_finish_tail``.

        Whole and well-ended, on a channel the gate does not read frame by frame, it leaves
        as the pieces of the reads it came in (the I/O layer writes them in one vectored
        write); otherwise it is joined and relayed as any frame (the scanner says what is
        wrong with it, the gate reads it)."""
        missing = inbound.need - inbound.parts_len
        parts = inbound.parts
        if len(data) < missing:
            parts.append(data)
            inbound.parts_len += len(data)
            return -1
        parts.append(memoryview(data)[:missing])
        inbound.parts, inbound.parts_len = [], 0
        channel = frame_at(parts[0], 0)[1]
        gate = self.gate if inbound is self._client_in else None
        if data[missing - 1] != FRAME_END or (gate is not None
                                               and channel in gate.slow_channels):
            return missing if self._relay(inbound, b"".join(parts), 0) >= 0 else -1
        inbound.out.extend(parts)
        inbound.counts.bytes += inbound.need
        inbound.counts.frames += 1
        return missing

    def _open_run(self, inbound: _Inbound, data: Buffer, stop: int) -> bool:
        """The incomplete frame at ``data[stop:]`` (its header checked) leaves now with an
        opaque run for the rest of its body, if it is a body frame with at least
        ``opaque_min`` body bytes to come that nobody must read: from the broker, or on a
        channel the gate does not read frame by frame. False: held as before."""
        left = self._run_left(inbound, data, stop)
        if not left:
            return False
        inbound.opened_at = inbound.counts.bytes
        inbound.counts.frames += 1
        _emit(inbound, data, stop, len(data))
        inbound.opaque = left
        inbound.end_due = True
        return True

    def _run_left(self, inbound: _Inbound, buf: Buffer, stop: int) -> int:
        """The opaque run the incomplete frame at ``buf[stop:]`` would have, or 0."""
        ftype, channel, size = frame_at(buf, stop)
        left = size + HEADER_SIZE - (len(buf) - stop)
        if ftype != FRAME_BODY or left < self.opaque_min:
            return 0
        gate = self.gate if inbound is self._client_in else None
        if gate is not None and channel in gate.slow_channels:
            return 0
        return left

    def _pass_opaque(self, inbound: _Inbound, data: Buffer) -> int:
        """Pass what ``data`` holds of the opaque run, then check its frame-end octet;
        returns where the frames after it start, or -1 (all used, or failed)."""
        n = min(inbound.opaque, len(data))
        _emit(inbound, data, 0, n)
        inbound.opaque -= n
        if n == len(data):
            return -1
        if data[n] != FRAME_END:
            self._fail(inbound.side, FrameError(
                f"frame end octet 0x{data[n]:02x} at offset {inbound.counts.bytes}, expected "
                f"0x{FRAME_END:02x} (body frame at offset {inbound.opened_at})", n))
            return -1
        _emit(inbound, data, n, n + 1)
        inbound.end_due = False
        if inbound.deferred:
            inbound.out.extend(inbound.deferred)
            inbound.deferred.clear()
        return n + 1

    def _take(self, gate: GateOutputHooks) -> None:
        """``self.output.take``; while a direction is inside an opaque run's frame, the
        gate's frames for it wait (``_Inbound.deferred``) until that frame has passed."""
        client_in, server_in = self._client_in, self._server_in
        self.output.take(gate, client_in.deferred if client_in.end_due else None,
                         server_in.deferred if server_in.end_due else None)

    def _finish_tail(self, inbound: _Inbound, data: Buffer) -> int:
        """Complete the held frame from ``data`` and relay it.

        Returns how much of ``data`` it used, or -1 if the frame is still incomplete (all
        of ``data`` is held) or failed.
        """
        tail = inbound.tail
        used = 0
        if len(tail) < HEADER_SIZE:
            used = min(HEADER_SIZE - len(tail), len(data))
            tail += data[:used]
            if len(tail) < HEADER_SIZE:
                return -1
        missing = frame_at(tail, 0)[2] + FRAME_OVERHEAD - len(tail)
        if len(data) - used < missing:
            tail += memoryview(data)[used:]
            # header checks now: no holding an oversize frame
            if self._relay(inbound, tail, 0) == 0 and self.opaque_min \
                    and self._run_left(inbound, tail, 0):
                inbound.tail = bytearray()
                self._open_run(inbound, bytes(tail), 0)
            return -1
        tail += memoryview(data)[used : used + missing]
        inbound.tail = bytearray()
        if self._relay(inbound, bytes(tail), 0) < 0:
            return -1
        return used + missing

    def _relay(self, inbound: _Inbound, buf: Buffer, pos: int) -> int:
        """Relay the complete frames of ``buf`` from ``pos``, reading those of interest.

        Returns where the first incomplete frame starts, or -1 after a failure. While the
        publish gate must see every frame of some channels (a channel holds, or a publish
        waits for its content: ``slow_channels``), the frames of those channels are taken
        one at a time; the connection's other channels stay on the scan.
        """
        counts = inbound.counts
        start = pos
        base = counts.bytes - pos  # stream position of buf[0], for error messages
        stop_at = inbound.stop_at
        handlers = inbound.handlers
        gate = self.gate if inbound is self._client_in else None
        try:
            while True:
                slow = gate.slow_channels if gate is not None else _NO_CHANNELS
                if slow:
                    assert gate is not None
                    pos, frames, key = scan_watching(buf, pos, self._frame_limit, stop_at,
                                                     slow, base)
                    counts.frames += frames
                    if key == WATCHED:  # what came before it goes first, once
                        _emit(inbound, buf, start, pos)
                        start = pos
                        pos, start = self._relay_one(inbound, gate, buf, pos, base)
                        continue
                else:
                    pos, frames, key = scan(buf, pos, self._frame_limit, stop_at, base)
                    counts.frames += frames
                if key == NEED_DATA:
                    break
                _, channel, size = frame_at(buf, pos)
                queued = len(inbound.out)
                took = handlers[key](self, channel, buf, pos, base)
                counts.frames += 1
                if took is None and len(inbound.out) == queued:
                    if self._passed:  # a run of publishes passes in place with it (runs)
                        pos, self._passed = self._passed, 0
                    else:
                        pos += size + FRAME_OVERHEAD  # passes in place: the common case
                    continue
                # The handler queued frames of its own, or took frames out of the stream:
                # what came before the frame goes first.
                _emit(inbound, buf, start, pos, queued)
                if took is None:
                    start, pos = pos, pos + size + FRAME_OVERHEAD
                else:
                    counts.frames += self._held_frames or count_frames(
                        buf, pos + size + FRAME_OVERHEAD, took)
                    self._held_frames = 0
                    counts.bytes += took - pos
                    start = pos = took
        except ProtocolError as err:
            counts.frames += count_frames(buf, pos, err.offset)
            _emit(inbound, buf, start, err.offset)
            self._fail(inbound.side, err)
            return -1
        _emit(inbound, buf, start, pos)
        return pos

    def _relay_one(self, inbound: _Inbound, gate: PublishHooks, buf: Buffer, pos: int,
                   base: int) -> tuple[int, int]:
        """Take the complete, validated frame at ``pos`` (on a channel the gate must see
        frame by frame) through the gate; returns (next pos, next start)."""
        ftype, channel, size = frame_at(buf, pos)
        end = pos + size + FRAME_OVERHEAD
        key = NEED_DATA
        if ftype == FRAME_METHOD:
            key = method_key(*method_ids(buf, pos))
        inbound.counts.frames += 1
        took: int | None = None
        if key == NEED_DATA:  # content or heartbeat, already validated
            if ftype != FRAME_HEARTBEAT and gate.on_content(channel, buf, pos, end, self._now):
                took = end
        else:
            handler = inbound.handlers.get(key)
            if handler is not None:
                took = handler(self, channel, buf, pos, base)
            if took is None and channel and gate.on_method_while_held(channel, key, buf, pos,
                                                                      end):
                took = end
        if gate.outbox:
            self._take(gate)
        if took is None:
            if self._passed:  # a run of publishes passes in place with it (runs)
                end, self._passed = self._passed, 0
            return end, pos
        inbound.counts.bytes += took - pos
        if took > end:  # a content header taken with its publish, or a held run (runs)
            inbound.counts.frames += self._held_frames or count_frames(buf, end, took)
            self._held_frames = 0
        return took, took

    def _fail(self, side: Side, err: ProtocolError) -> None:
        self.failure = Failure(side, err.condition, err.reason, isinstance(err, AccessRefused))
        for inbound in (self._client_in, self._server_in):
            inbound.tail = bytearray()
            inbound.parts, inbound.parts_len = [], 0
        # Inside an opaque run's frame a close does not fit: that peer gets the socket's
        # close alone.
        to_client = not self._server_in.end_due
        if side is Side.CLIENT:
            if to_client:
                self.output.to_client.append(
                    close_frame(err.reply_code, err.reply_text, err.class_id, err.method_id))
            return
        if not self._client_in.end_due:
            self.output.to_server.append(
                close_frame(err.reply_code, err.reply_text, err.class_id, err.method_id)
            )
        if to_client:
            self.output.to_client.append(close_frame(
                INTERNAL_ERROR,
                f"INTERNAL_ERROR - upstream broker sent a malformed frame: "
                f"{err.condition} - {err.reason}",
            ))

    # --- methods the core reads -------------------------------------------------------
    # Connection-class methods count only on channel 0 and channel-class ones only off
    # it; elsewhere they are relayed untouched for the broker (or client) to refuse.

    def _on_start_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            # Only client_properties is kept: ``response`` holds the credentials.
            properties, mechanism = read_start_ok(buf, offset, base)
            self.client = ClientInfo.from_properties(properties or {})
            if self.refuse_external and mechanism.upper() == "EXTERNAL":
                raise AccessRefused(EXTERNAL_REFUSED, offset, _C.StartOk.index >> 16,
                                    _C.StartOk.index & 0xFFFF)
            if self.gate is not None:
                self.gate.client_identified(self.client)

    def _on_tune(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.server_tune = TuneParams(*read_tune(buf, offset, _C.Tune.name, base))
            self._frame_limit = frame_limit(self.server_tune, self.client_tune)

    def _on_tune_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            tune = TuneParams(*read_tune(buf, offset, _C.TuneOk.name, base))
            broker = self.server_tune.frame_max if self.server_tune is not None else 0
            if broker and tune.frame_max > broker:  # (0, "no limit", is held to broker's)
                raise NotAllowed(
                    f"connection.tune-ok frame_max {tune.frame_max} is above the broker's "
                    f"frame_max {broker}", offset, _C.TuneOk.index >> 16,
                    _C.TuneOk.index & 0xFFFF)
            self.client_tune = tune
            self.tuned = True
            self.channel_max = tune.channel_max
            self.heartbeat = tune.heartbeat
            self.frame_max = tune.frame_max
            self._frame_limit = frame_limit(self.server_tune, tune)

    def _on_open(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.virtual_host = read_open(buf, offset, base)
            if self.gate is not None and self.virtual_host:
                self.gate.vhost_opened(self.virtual_host)
            if self.topology is not None and self.virtual_host:
                self.topology.vhost = self.virtual_host

    def _on_open_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.opened = True

    def _on_client_close(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._on_close(Side.CLIENT, channel, buf, offset, base)

    def _on_server_close(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._on_close(Side.SERVER, channel, buf, offset, base)

    def _on_close(self, side: Side, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            code, text, class_id, method_id = read_close(buf, offset, base)
            if self.closing is None:
                self.closing = side
                self.close_reply = CloseReply(side, code, text, class_id, method_id)

    def _on_close_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.closed = True
            self.channels.clear()

    # --- the publish gate's methods (only with a gate) --------------------------------

    def _on_channel_open(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._channel_event(channel, ChannelEvent.OPEN)

    def _on_channel_open_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._channel_event(channel, ChannelEvent.OPEN_OK)

    def _on_channel_close(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._channel_event(channel, ChannelEvent.CLOSE)

    def _on_channel_close_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._channel_event(channel, ChannelEvent.CLOSE_OK)

    def _channel_event(self, channel: int, event: ChannelEvent) -> None:
        if channel == 0:
            return
        state = self.channels.get(channel)
        key = (state, event)
        if key not in CHANNEL_TRANSITIONS:
            return
        after = CHANNEL_TRANSITIONS[key]
        if after is None:
            del self.channels[channel]
            if self.gate is not None:
                self.gate.on_channel_gone(channel)
            if self.topology is not None:
                self.topology.channel_gone(channel)
        else:
            self.channels[channel] = after




class Connection(FrameRelay):
    """One proxied AMQP 0-9-1 connection (client <-> proxy <-> broker); a ``RelayCore``.

    Starts at the first frame in both directions (the I/O layer has relayed the protocol
    header). Every frame is relayed exactly as it came; the core only reads the few
    methods below, and decodes them with pamqp. A chunk made only of complete frames, with
    nothing held before it, is forwarded as the very same bytes object.

    Frame size: both directions are held to FRAME_MIN_SIZE until the broker's tune and the
    client's tune-ok have both passed, then to the lower of their frame_max (0 = no limit
    from that peer), never below FRAME_MIN_SIZE; a tune-ok above the broker's frame_max is
    refused (530). A frame larger than the limit is refused from its 7-byte header, before
    any of it is held.

    Errors: a malformed frame from the client sets ``failure`` (side CLIENT) and queues a
    connection.close for the client with the spec's code (501/502/505); one from the
    broker sets ``failure`` (side SERVER), queues a connection.close 501 for the broker
    and a connection.close 541 INTERNAL_ERROR for the client that names the problem.
    Complete frames before the bad one are still relayed; later input is ignored.

    With a gate, it hands the gate every publish and the frames around it
    (``hooks.PublishHooks``); watching topology, the declares, deletes and binds the broker
    confirms become ``TopologyChange`` events.
    """

    def _handlers(self) -> Tables:
        """What each direction stops at: connection and channel lifecycle always; publishes,
        confirms and flow replies with a gate; declares and binds when watching topology."""
        cls = type(self)
        client: dict[int, Handler] = {
            _C.StartOk.index: cls._on_start_ok,
            _C.TuneOk.index: cls._on_tune_ok,
            _C.Open.index: cls._on_open,
            _C.Close.index: cls._on_client_close,
            _C.CloseOk.index: cls._on_close_ok,
            _CH.Open.index: cls._on_channel_open,
            _CH.Close.index: cls._on_channel_close,
            _CH.CloseOk.index: cls._on_channel_close_ok,
        }
        server: dict[int, Handler] = {
            _C.Tune.index: cls._on_tune,
            _C.OpenOk.index: cls._on_open_ok,
            _C.Close.index: cls._on_server_close,
            _C.CloseOk.index: cls._on_close_ok,
            _CH.OpenOk.index: cls._on_channel_open_ok,
            _CH.Close.index: cls._on_channel_close,
            _CH.CloseOk.index: cls._on_channel_close_ok,
        }
        if self.gate is not None:
            client.update({
                _B.Publish.index: cls._on_publish,
                _CF.Select.index: cls._on_confirm_select,
                commands.Tx.Select.index: cls._on_tx_select,
                _CH.FlowOk.index: cls._on_flow_reply,
                _CH.Flow.index: cls._on_flow_reply,
                _C.Close.index: cls._on_client_close_held,
            })
            server.update({
                _B.Ack.index: cls._on_broker_ack,
                _B.Nack.index: cls._on_broker_nack,
                _CH.CloseOk.index: cls._on_broker_channel_close_ok,
            })
        if self.topology is not None:
            client.update(dict.fromkeys(REQUEST_KEYS, cls._on_topology_request))
            server.update(dict.fromkeys(REPLY_KEYS, cls._on_topology_reply))
        return client, server

    def _on_publish(self, channel: int, buf: Buffer, offset: int, base: int) -> int | None:
        gate = self.gate
        assert gate is not None
        end = offset + frame_at(buf, offset)[2] + FRAME_OVERHEAD
        header_end = None
        n = len(buf)
        if end + HEADER_SIZE <= n:
            ftype, hchannel, hsize = frame_at(buf, end)
            header_stop = end + hsize + FRAME_OVERHEAD
            if ftype == FRAME_HEADER and hchannel == channel and header_stop <= n:
                # Validate it as the scanner would before the gate reads it (the scanner
                # says why when it is bad).
                if not hchannel or buf[header_stop - 1] != FRAME_END \
                        or hsize > payload_limit(self._frame_limit) \
                        or hsize < CONTENT_HEADER_MIN:
                    scan(memoryview(buf)[:header_stop], end, self._frame_limit, (), base)
                header_end = header_stop
        try:
            took = gate.on_publish(channel, buf, offset, end, header_end, self._now)
        except (ValueError, IndexError) as exc:
            raise MethodSyntaxError(f"cannot decode basic.publish on channel {channel}: {exc}",
                                    offset, 60, 40) from None
        if gate.outbox:
            self._take(gate)
            if took is None:
                return None  # (it made output: no run after it)
        # Passed or held with its content header: a run of whole publishes may follow (runs).
        if header_end is None or (took is not None and took != header_end):
            return took
        body_size = _BODY_SIZE.unpack_from(buf, end + HEADER_SIZE + 4)[0]
        if n - header_end <= body_size + (end - offset) + _CONTENT_FRAME_MIN:
            return took  # no whole publish after it in this read
        if took is None:
            self._read_run(gate, channel, buf, offset, end, header_end, body_size)
            return None
        return self._hold_run(gate, channel, buf, offset, end, header_end, body_size)

    def _read_run(self, gate: PublishHooks, channel: int, buf: Buffer, offset: int,
                  end: int, header_end: int, body_size: int) -> None:
        """After the publish at ``buf[offset:end]`` passed untouched with its content header
        (up to ``header_end``): the run of whole publishes that follows, as far as the gate
        allows (``runs``); ``_relay`` goes on from where it ends (``_passed``)."""
        allowed = gate.publish_run(channel, buf, end, self._now)
        if allowed is None:
            return
        stop, count, body_bytes, frames = scan_publish_run(
            buf, header_end, payload_limit(self._frame_limit), channel,
            bytes(buf[offset:end]), body_size, *allowed)
        if count:
            gate.on_publish_run(channel, count, body_bytes, self._now)
        self.from_client.frames += frames + 1  # its content header too
        self._passed = stop

    def _hold_run(self, gate: PublishHooks, channel: int, buf: Buffer, offset: int, end: int,
                  header_end: int, body_size: int) -> int:
        """After the publish at ``buf[offset:end]`` was held with its content header (up to
        ``header_end``): its body and the run of whole publishes that follows, held at once
        as far as the gate allows (``runs``: a held producer at its consumers' pace).
        Returns where the frames the gate took end."""
        if not gate.hold_run(channel, buf, end, self._now):
            return header_end
        limit = payload_limit(self._frame_limit)
        method = bytes(buf[offset:end])
        body_end, _, _, body_frames = scan_publish_run(buf, header_end, limit, channel, method,
                                                       body_size, 0, 0)
        if body_end - header_end - body_frames * FRAME_OVERHEAD != body_size:
            return header_end  # its body is not all here: frame by frame, as before
        ends: list[int] = []
        stop, _, _, frames = scan_publish_run(buf, body_end, limit, channel, method, 0,
                                              math.inf, math.inf, ends)
        gate.on_hold_run(channel, buf, header_end, body_end, ends, self._now)
        self._held_frames = 1 + body_frames + frames  # its content header too
        return stop

    def _on_confirm_select(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        assert self.gate is not None
        self.gate.on_confirm_select(channel)

    def _on_tx_select(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        assert self.gate is not None
        self.gate.on_tx_select(channel)

    def _on_flow_reply(self, channel: int, buf: Buffer, offset: int, base: int) -> int | None:
        assert self.gate is not None
        if self.gate.on_flow_reply(channel):
            return offset + frame_at(buf, offset)[2] + FRAME_OVERHEAD
        return None

    def _on_client_close_held(self, channel: int, buf: Buffer, offset: int, base: int
                              ) -> int | None:
        """connection.close from the client waits until every held publish has left."""
        assert self.gate is not None
        self._on_client_close(channel, buf, offset, base)
        end = offset + frame_at(buf, offset)[2] + FRAME_OVERHEAD
        if channel == 0 and self.gate.hold_connection_close(bytes(buf[offset:end])):
            return end
        return None

    def _on_broker_ack(self, channel: int, buf: Buffer, offset: int, base: int) -> int | None:
        return self._on_broker_confirm(channel, buf, offset, nack=False)

    def _on_broker_nack(self, channel: int, buf: Buffer, offset: int, base: int) -> int | None:
        return self._on_broker_confirm(channel, buf, offset, nack=True)

    def _on_broker_confirm(self, channel: int, buf: Buffer, offset: int, nack: bool
                           ) -> int | None:
        gate = self.gate
        assert gate is not None
        end = offset + frame_at(buf, offset)[2] + FRAME_OVERHEAD
        replaced = gate.on_broker_confirm(channel, buf, offset, end, nack)
        if gate.outbox:
            self._take(gate)
        return end if replaced else None

    def _on_broker_channel_close_ok(self, channel: int, buf: Buffer, offset: int, base: int
                                    ) -> int | None:
        gate = self.gate
        assert gate is not None
        absorbed = gate.on_broker_close_ok(channel)
        if gate.outbox:
            self._take(gate)
        if absorbed:
            return offset + frame_at(buf, offset)[2] + FRAME_OVERHEAD
        self._on_channel_close_ok(channel, buf, offset, base)
        return None

    def _on_topology_request(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        assert self.topology is not None
        key = (buf[offset + 7] << 24 | buf[offset + 8] << 16 | buf[offset + 9] << 8
               | buf[offset + 10])
        change = self.topology.request(key, channel, buf, offset, base)
        if change is not None:
            self.output.events.append(change)

    def _on_topology_reply(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        assert self.topology is not None
        key = (buf[offset + 7] << 24 | buf[offset + 8] << 16 | buf[offset + 9] << 8
               | buf[offset + 10])
        change = self.topology.reply(key, channel, buf, offset, base)
        if change is not None:
            self.output.events.append(change)

    def collect(self) -> None:
        """Take what the gate made outside a receive call (held frames released, expiries,
        spool acknowledgements) into the outgoing data and events."""
        if self.gate is not None and self.gate.outbox:
            self._take(self.gate)

    @property
    def pending_bytes(self) -> int:
        """Bytes of incomplete frames held back, both directions."""
        client, server = self._client_in, self._server_in
        return len(client.tail) + client.parts_len + len(server.tail) + server.parts_len

    def abort(self, reason: str) -> None:
        """The proxy failed on this connection: drop what is held and queued; each peer gets
        connection.close 541 INTERNAL_ERROR (the broker's none once a close has passed)."""
        for inbound in (self._client_in, self._server_in):
            inbound.tail = bytearray()
            inbound.parts, inbound.parts_len = [], 0
        self.output.clear()
        text = f"INTERNAL_ERROR - {reason}"
        # (not inside an opaque run's frame: the peer gets the socket's close alone)
        if not self._server_in.end_due:
            self.output.to_client.append(close_frame(INTERNAL_ERROR, text))
        if self.closing is None and not self._client_in.end_due:
            self.output.to_server.append(close_frame(INTERNAL_ERROR, text))


def _forget_channel(channels: dict[int, ChannelState], command: object) -> bool:
    """The core's own command (``CoreOutput.own``): a channel the proxy closed is gone."""
    if isinstance(command, ForgetChannel):
        channels.pop(command.channel, None)
        return True
    return False


def frame_limit(server: TuneParams | None, client: TuneParams | None) -> int:
    """The frame size both directions are held to (``scan``'s ``frame_max``, 0 = none):
    ``FRAME_MIN_SIZE`` until the broker's tune *and* the client's tune-ok have passed (a
    client that pipelines its tune-ok before the broker's tune gains nothing by it), then the
    lower of their frame_max (0 = no limit from that peer: the other's then), never below
    ``FRAME_MIN_SIZE`` (the spec lets any peer send frames that large)."""
    if server is None or client is None:
        return FRAME_MIN_SIZE
    limits = [n for n in (server.frame_max, client.frame_max) if n]
    return max(min(limits), FRAME_MIN_SIZE) if limits else 0


def _emit(inbound: _Inbound, buf: Buffer, start: int, stop: int, at: int | None = None) -> None:
    """Queue ``buf[start:stop]`` for the other peer: ``buf`` itself when that is all of it.

    ``at`` puts it at that position of the queue instead of the end.
    """
    if stop > start:
        inbound.counts.bytes += stop - start
        chunk = buf if start == 0 and stop == len(buf) else memoryview(buf)[start:stop]
        if at is None:
            inbound.out.append(chunk)
        else:
            inbound.out.insert(at, chunk)


def _skip(inbound: _Inbound, n: int) -> None:
    """``n`` bytes of ``inbound``'s opaque run were moved without the core."""
    if not 0 <= n <= inbound.opaque:
        raise ValueError(f"{n} bytes skipped, the opaque run has {inbound.opaque} left")
    inbound.opaque -= n
    inbound.counts.bytes += n
