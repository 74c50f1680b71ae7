"""One proxied AMQP 0-9-1 connection as a sans-IO core: exact relay, tuning, close, channels."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Final

from pamqp import commands
from pamqp.common import FieldTable

from proxy.amqp091.errors import ProtocolError
from proxy.amqp091.framing import (
    FRAME_MIN_SIZE,
    FRAME_OVERHEAD,
    HEADER_SIZE,
    NEED_DATA,
    Buffer,
    count_frames,
    decode_method,
    encode_method,
    frame_at,
    scan,
)
from proxy.core import Failure, FrameCounts, Side

INTERNAL_ERROR: Final = 541
"""Reply code the client gets when the upstream broker sent a malformed frame."""

SHORTSTR_MAX: Final = 255

_C = commands.Connection
_CH = commands.Channel


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
class ClientInfo:
    """What a client says about itself in connection.start-ok's client_properties."""

    product: str | None
    version: str | None
    platform: str | None
    information: str | None
    properties: FieldTable  # all of them, e.g. ``capabilities``

    @classmethod
    def from_properties(cls, properties: FieldTable) -> ClientInfo:
        """Read the well-known keys; absent ones are None, non-text ones are str()-ed."""

        def text(key: str) -> str | None:
            value = properties.get(key)
            if value is None:
                return None
            if isinstance(value, bytes | bytearray):
                return bytes(value).decode("utf-8", "replace")
            return str(value)

        return cls(
            product=text("product"),
            version=text("version"),
            platform=text("platform"),
            information=text("information"),
            properties=properties,
        )


@dataclass(frozen=True, slots=True)
class CloseReply:
    """A connection.close seen passing: who sent it and why."""

    side: Side
    reply_code: int
    reply_text: str
    class_id: int
    method_id: int


Handler = Callable[[int, Buffer, int, int], None]  # (channel, buf, frame offset, base offset)


class _Inbound:
    """One direction of the relay: its counters, held partial frame and output queue."""

    __slots__ = ("counts", "handlers", "out", "side", "stop_at", "tail")

    def __init__(self, side: Side, counts: FrameCounts, out: list[Buffer]) -> None:
        self.side = side
        self.counts = counts
        self.out = out  # the queue of the *other* peer
        self.tail = bytearray()  # an incomplete frame, held until the rest arrives
        self.handlers: dict[int, Handler] = {}
        self.stop_at: frozenset[int] = frozenset()

    def read(self, handlers: dict[int, Handler]) -> None:
        """Set the methods this direction stops at, and what reads each."""
        self.handlers = handlers
        self.stop_at = frozenset(handlers)


def close_frame(reply_code: int, reply_text: str, class_id: int = 0, method_id: int = 0) -> bytes:
    """A connection.close on channel 0; the text is cut to the 255 bytes a shortstr holds."""
    text = reply_text.encode("utf-8")[:SHORTSTR_MAX].decode("utf-8", "ignore")
    method = _C.Close(reply_code, text, class_id, method_id)
    return encode_method(method, 0)


class Connection:
    """One proxied AMQP 0-9-1 connection (client <-> proxy <-> broker); a ``RelayCore``.

    Starts at the first frame in both directions (the I/O layer has relayed the protocol
    header). Every frame is relayed exactly as it came; the core only reads the few
    methods below, and decodes them with pamqp. A chunk made only of complete frames, with
    nothing held before it, is forwarded as the very same bytes object.

    Frame size: both directions are held to FRAME_MIN_SIZE until the client's tune-ok
    passes, then to its frame_max (0 = none), never below FRAME_MIN_SIZE.

    Errors: a malformed frame from the client sets ``failure`` (side CLIENT) and queues a
    connection.close for the client with the spec's code (501/502/505); one from the
    broker sets ``failure`` (side SERVER), queues a connection.close 501 for the broker
    and a connection.close 541 INTERNAL_ERROR for the client that names the problem.
    Complete frames before the bad one are still relayed; later input is ignored.
    """

    def __init__(self) -> None:
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
        self._to_server: list[Buffer] = []
        self._to_client: list[Buffer] = []
        self._client_in = _Inbound(Side.CLIENT, self.from_client, self._to_server)
        self._server_in = _Inbound(Side.SERVER, self.from_server, self._to_client)
        self._client_in.read(
            {
                _C.StartOk.index: self._on_start_ok,
                _C.TuneOk.index: self._on_tune_ok,
                _C.Open.index: self._on_open,
                _C.Close.index: self._on_client_close,
                _C.CloseOk.index: self._on_close_ok,
                _CH.Open.index: self._on_channel_open,
                _CH.Close.index: self._on_channel_close,
                _CH.CloseOk.index: self._on_channel_close_ok,
            }
        )
        self._server_in.read(
            {
                _C.Tune.index: self._on_tune,
                _C.OpenOk.index: self._on_open_ok,
                _C.Close.index: self._on_server_close,
                _C.CloseOk.index: self._on_close_ok,
                _CH.OpenOk.index: self._on_channel_open_ok,
                _CH.Close.index: self._on_channel_close,
                _CH.CloseOk.index: self._on_channel_close_ok,
            }
        )

    # --- RelayCore -------------------------------------------------------------------

    def receive_from_client(self, data: bytes) -> None:
        """Take bytes read from the client; complete frames are queued for the server."""
        if self.failure is None and data:
            self._receive(self._client_in, data)

    def receive_from_server(self, data: bytes) -> None:
        """Take bytes read from the broker; complete frames are queued for the client."""
        if self.failure is None and data:
            self._receive(self._server_in, data)

    def data_for_server(self) -> bytes:
        """Everything queued for the broker (b"" if nothing), and forget it."""
        return _drain(self._to_server)

    def data_for_client(self) -> bytes:
        """Everything queued for the client (b"" if nothing), and forget it."""
        return _drain(self._to_client)

    # --- state for the rest of the proxy ----------------------------------------------

    @property
    def open_channels(self) -> set[int]:
        """Channels opened by the client whose close handshake has not completed."""
        return set(self.channels)

    @property
    def pending_from_client(self) -> int:
        """Bytes of an incomplete client frame held back."""
        return len(self._client_in.tail)

    @property
    def pending_from_server(self) -> int:
        """Bytes of an incomplete broker frame held back."""
        return len(self._server_in.tail)

    # --- relay ------------------------------------------------------------------------

    def _receive(self, inbound: _Inbound, data: bytes) -> None:
        if type(data) is not bytes:  # we keep views of it: it must not change under us
            data = bytes(data)
        pos = 0
        if inbound.tail:
            pos = self._finish_tail(inbound, data)
            if pos < 0:
                return
        stop = self._relay(inbound, data, pos)
        if 0 <= stop < len(data):
            inbound.tail = bytearray(memoryview(data)[stop:])

    def _finish_tail(self, inbound: _Inbound, data: bytes) -> int:
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
            self._relay(inbound, tail, 0)  # header checks now: no holding an oversize frame
            return -1
        tail += memoryview(data)[used : used + missing]
        inbound.tail = bytearray()
        if self._relay(inbound, bytes(tail), 0) < 0:
            return -1
        return used + missing

    def _relay(self, inbound: _Inbound, buf: Buffer, pos: int) -> int:
        """Relay the complete frames of ``buf`` from ``pos``, reading those of interest.

        Returns where the first incomplete frame starts, or -1 after a failure.
        """
        counts = inbound.counts
        start = pos
        base = counts.bytes - pos  # stream position of buf[0], for error messages
        stop_at = inbound.stop_at
        try:
            while True:
                pos, frames, key = scan(buf, pos, self._frame_limit, stop_at, base)
                counts.frames += frames
                if key == NEED_DATA:
                    break
                _, channel, size = frame_at(buf, pos)
                inbound.handlers[key](channel, buf, pos, base)
                pos += size + FRAME_OVERHEAD
                counts.frames += 1
        except ProtocolError as err:
            counts.frames += count_frames(buf, pos, err.offset)
            _emit(inbound, buf, start, err.offset)
            self._fail(inbound.side, err)
            return -1
        _emit(inbound, buf, start, pos)
        return pos

    def _fail(self, side: Side, err: ProtocolError) -> None:
        self.failure = Failure(side, err.condition, err.reason)
        self._client_in.tail = bytearray()
        self._server_in.tail = bytearray()
        if side is Side.CLIENT:
            self._to_client.append(
                close_frame(err.reply_code, err.reply_text, err.class_id, err.method_id)
            )
            return
        self._to_server.append(
            close_frame(err.reply_code, err.reply_text, err.class_id, err.method_id)
        )
        self._to_client.append(
            close_frame(
                INTERNAL_ERROR,
                f"INTERNAL_ERROR - upstream broker sent a malformed frame: "
                f"{err.condition} - {err.reason}",
            )
        )

    # --- methods the core reads -------------------------------------------------------
    # Connection-class methods count only on channel 0 and channel-class ones only off
    # it; elsewhere they are relayed untouched for the broker (or client) to refuse.

    def _on_start_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            # Only client_properties is kept: ``response`` holds the credentials.
            method = decode_method(buf, offset, _C.StartOk, base)
            self.client = ClientInfo.from_properties(method.client_properties or {})

    def _on_tune(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            method = decode_method(buf, offset, _C.Tune, base)
            self.server_tune = TuneParams(method.channel_max, method.frame_max, method.heartbeat)

    def _on_tune_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            method = decode_method(buf, offset, _C.TuneOk, base)
            tune = TuneParams(method.channel_max, method.frame_max, method.heartbeat)
            self.client_tune = tune
            self.tuned = True
            self.channel_max = tune.channel_max
            self.heartbeat = tune.heartbeat
            self.frame_max = tune.frame_max
            # The spec lets any peer send FRAME_MIN_SIZE frames whatever was negotiated.
            self._frame_limit = max(tune.frame_max, FRAME_MIN_SIZE) if tune.frame_max else 0

    def _on_open(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.virtual_host = decode_method(buf, offset, _C.Open, base).virtual_host

    def _on_open_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.opened = True

    def _on_client_close(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._on_close(Side.CLIENT, channel, buf, offset, base)

    def _on_server_close(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        self._on_close(Side.SERVER, channel, buf, offset, base)

    def _on_close(self, side: Side, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            method = decode_method(buf, offset, _C.Close, base)
            if self.closing is None:
                self.closing = side
                self.close_reply = CloseReply(
                    side,
                    method.reply_code or 0,
                    method.reply_text or "",
                    method.class_id or 0,
                    method.method_id or 0,
                )

    def _on_close_ok(self, channel: int, buf: Buffer, offset: int, base: int) -> None:
        if channel == 0:
            self.closed = True
            self.channels.clear()

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
        else:
            self.channels[channel] = after


def _emit(inbound: _Inbound, buf: Buffer, start: int, stop: int) -> None:
    """Queue ``buf[start:stop]`` for the other peer: ``buf`` itself when that is all of it."""
    if stop > start:
        inbound.counts.bytes += stop - start
        if start == 0 and stop == len(buf):
            inbound.out.append(buf)
        else:
            inbound.out.append(memoryview(buf)[start:stop])


def _drain(out: list[Buffer]) -> bytes:
    if not out:
        return b""
    if len(out) == 1:
        chunk = out[0]
        out.clear()
        return chunk if type(chunk) is bytes else bytes(chunk)
    data = b"".join(out)
    out.clear()
    return data
