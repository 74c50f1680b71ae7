"""One proxied AMQP 1.0 connection, sans-IO: relays both streams byte-exactly, tracks its state."""

from __future__ import annotations

import math
from enum import Enum
from typing import Any, Final

from floodwall.wire import relaycore
from floodwall.wire.amqp10.addresses import vhost_of
from floodwall.wire.amqp10.endpoints import Peer
from floodwall.wire.amqp10.errors import DecodeError, FramingError, ProtocolError, SaslRefused
from floodwall.wire.amqp10.framing import (
    AMQP_FRAME,
    AMQP_HEADER,
    HEADER_SIZE,
    MIN_MAX_FRAME_SIZE,
    SASL_FRAME,
    SASL_HEADER,
    FrameHandler,
    frame,
    scan_frames,
)
from floodwall.wire.amqp10.hooks import ReadEveryFrame, TransferHooks
from floodwall.wire.amqp10.performatives import (
    AMQP_PERFORMATIVES,
    ATTACH,
    BEGIN,
    CLOSE,
    DETACH,
    DISPOSITION,
    END,
    FLOW,
    OPEN,
    SASL_CHALLENGE,
    SASL_INIT,
    SASL_MECHANISMS,
    SASL_OK,
    SASL_OUTCOME,
    SASL_RESPONSE,
    TRANSACTIONAL_STATE,
    TRANSFER,
    Attach,
    Begin,
    Detach,
    Ending,
    Open,
    Outcome,
    SaslInit,
    SaslOutcome,
    check_sasl_fields,
    close_body,
    decode_composite,
    encode_performative,
    name_of,
    open_body,
    peek_composite,
    peek_disposition,
)
from floodwall.wire.amqp10.runs import (
    renumber_run,
    scan_settlements,
    scan_transfer_run,
    settle_frames,
    settle_state,
    settle_template,
)
from floodwall.wire.amqp10.types import UByte, UInt
from floodwall.wire.relaycore import (
    EXTERNAL_REFUSED,
    JOINED_READ_MAX,
    CoreOutput,
    Failure,
    FrameCounts,
    Side,
)

RUN_MOST: Final = 1 << 31
"""Most deliveries of a run from the broker (nothing bounds them but the read)."""
SETTLEMENTS: Final = -1
"""``stream.run``'s handle for a run of the broker's settlements (``_settlements_follow``)."""
CONTAINER_ID: Final = "floodwall"
"""container-id of the Open the proxy sends when it must close a peer that has seen none."""

DESCRIPTION_LIMIT: Final = 256
"""Bytes of UTF-8 kept of an injected close's description, so the frame stays under 512."""

SASL_AUTH: Final = 1
"""sasl-outcome code ``auth``: authentication failed (the credentials or mechanism)."""

_CLIENT_SASL_FRAMES: Final = frozenset({SASL_INIT, SASL_RESPONSE})
_SERVER_SASL_FRAMES: Final = frozenset({SASL_MECHANISMS, SASL_CHALLENGE, SASL_OUTCOME})


class Phase(Enum):
    """What a byte stream carries next."""

    SASL_HEADER = "sasl-header"  # the server's answer to the client's SASL header
    SASL = "sasl"  # SASL frames (and, from the client, its AMQP header after sasl-init)
    AMQP_HEADER = "amqp-header"  # the server's AMQP header
    AMQP = "amqp"  # AMQP frames
    REFUSED = "refused"  # the server answered with another protocol header: nothing follows


HOT_PERFORMATIVES: Final = (FLOW, DISPOSITION)
"""Frames passed by size alone on a plain relay: flow, transfer, disposition."""
GATED_SKIP: Final = (DISPOSITION, DISPOSITION)
"""With the credit gate, the client's flow and transfer frames are read too; its
dispositions still pass (the broker's are read: their outcomes are counted)."""
SKIP_NONE: Final = (1, 0)
"""Every frame read: both peers' dispositions once the proxy consumed a delivery itself."""


def _no_frames(code: int, channel: int, buf: bytes, start: int, body: int, end: int) -> bool:
    raise AssertionError("stream handlers not installed")


class _Stream:
    """One direction of the connection: what one peer sends, relayed to the other."""

    __slots__ = (
        "close_relayed",
        "counts",
        "limit",
        "mark",
        "need",
        "on_amqp",
        "on_sasl",
        "open_relayed",
        "peer",
        "phase",
        "queue",
        "resume",
        "run",
        "sasl_refused",
        "side",
        "skip",
        "tail",
    )

    def __init__(
        self, side: Side, phase: Phase, counts: FrameCounts, queue: list[Any]
    ) -> None:
        self.side = side
        self.phase = phase
        self.counts = counts
        self.queue = queue  # for the other peer: relayed frames (views of reads), injected ones
        self.peer = Peer(side)
        self.limit = MIN_MAX_FRAME_SIZE  # until the receiving peer's Open says otherwise
        self.tail = bytearray()  # a partial frame or header, held back
        self.need = 0  # bytes the tail must reach before it is worth scanning again
        self.mark = 0  # where the bytes of the buffer being read not yet queued start
        self.skip = HOT_PERFORMATIVES  # performative codes the scanner passes by size
        # A run of one link's whole deliveries to read next (``runs``): channel, handle, the
        # next delivery-id, at most how many and how many payload bytes.
        self.run: tuple[int, int, int, int, float] | None = None
        # When the last frame read was a whole delivery booked unchanged (a run's last, or the
        # one that announced it): its channel, handle and the next delivery-id. The next read
        # may go on with that run, if the gate, asked again, allows one.
        self.resume: tuple[int, int, int] | None = None
        self.open_relayed = False
        self.close_relayed = False
        self.sasl_refused = False  # a sasl-outcome other than ok: no AMQP layer will follow
        self.on_amqp: FrameHandler = _no_frames
        self.on_sasl: FrameHandler = _no_frames


def _clip(text: str) -> str:
    raw = text.encode("utf-8")
    if len(raw) <= DESCRIPTION_LIMIT:
        return text
    return raw[: DESCRIPTION_LIMIT - 3].decode("utf-8", "ignore") + "..."


class Connection:
    """The AMQP 1.0 ``RelayCore``: relays both directions unchanged and tracks the connection.

    Built with the client's first protocol header, which the I/O layer has already read and
    forwarded upstream (SASL ``AMQP\\x03\\x01\\x00\\x00`` or plain ``AMQP\\x00\\x01\\x00\\x00``).
    It reads the server's header(s), SASL frames and AMQP frames; decodes open, begin, attach,
    detach, end, close and the SASL performatives; and passes flow, transfer, disposition and
    empty frames by their size alone. Input must be ``bytes`` (immutable): a chunk made only of
    whole frames is handed on as the very same object.

    On bad input ``failure`` is set, both streams stop, and the core queues, where the
    receiving peer is in the AMQP layer, a ``close`` with an error (preceded by an AMQP header
    and an ``open`` if that peer has not received them yet, as the spec wants an open before a
    close). The offending peer gets the error itself; the innocent peer gets
    ``amqp:connection:forced`` (the server, for a client failure) or ``amqp:internal-error``
    (the client, for a server failure). A peer still in SASL gets nothing.
    """

    failure: Failure | None
    from_client: FrameCounts
    from_server: FrameCounts

    def __init__(self, first_header: bytes, gate: TransferHooks | None = None,
                 conn_id: int = 0, refuse_external: bool = True) -> None:
        """``gate``: the credit gate (with policies), handed flow, transfer and disposition
        frames and the session and link lifecycle. ``refuse_external``: a client's sasl-init
        with EXTERNAL is not relayed; the client gets sasl-outcome ``auth`` and the
        connection closes."""
        self.refuse_external = refuse_external
        if first_header == SASL_HEADER:
            client_phase, server_phase = Phase.SASL, Phase.SASL_HEADER
        elif first_header == AMQP_HEADER:
            client_phase, server_phase = Phase.AMQP, Phase.AMQP_HEADER
        else:
            raise ValueError(f"not an AMQP 1.0 protocol header: {first_header!r}")
        self.failure = None
        self.from_client = FrameCounts()
        self.from_server = FrameCounts()
        self._now = 0.0  # the time the current receive call was given
        # Frames for each peer, events for the I/O layer; the gate's ReadEveryFrame, carried out
        # on the two streams (client's, server's: in once made).
        streams: list[_Stream] = []
        self.output = CoreOutput(_read_every_frame, streams)
        self._client = _Stream(Side.CLIENT, client_phase, self.from_client,
                               self.output.to_server)
        self._server = _Stream(Side.SERVER, server_phase, self.from_server,
                               self.output.to_client)
        streams += (self._client, self._server)
        client, server = self._client, self._server
        client.on_amqp = lambda c, ch, buf, st, b, e: self._amqp_frame(
            client, server, c, ch, buf, st, b, e)
        server.on_amqp = lambda c, ch, buf, st, b, e: self._amqp_frame(
            server, client, c, ch, buf, st, b, e)
        client.on_sasl = self._client_sasl_frame
        server.on_sasl = self._server_sasl_frame
        self.conn_id = conn_id
        self.gate = gate
        if gate is not None:
            client.skip, server.skip = GATED_SKIP, SKIP_NONE

    # -- the RelayCore interface ------------------------------------------------------------

    def receive_from_client(self, data: bytes | memoryview, now: float) -> None:
        if self.failure is None and data:
            self._now = now
            self._receive(self._client, data)

    def receive_from_server(self, data: bytes | memoryview, now: float) -> None:
        if self.failure is None and data:
            self._now = now
            self._receive(self._server, data)

    # The queued output, read out of ``self.output``.
    data_for_server = relaycore.data_for_server
    data_for_client = relaycore.data_for_client
    chunks_for_server = relaycore.chunks_for_server
    chunks_for_client = relaycore.chunks_for_client
    events = relaycore.events

    #: Reads are copied into bytes unless they are (``RelayCore.takes_views``): the type
    #: decoders take bytes.
    takes_views: Final = False

    # No opaque runs (yet): a transfer's payload is read as the rest of its frame.
    opaque_from_client: Final = 0
    opaque_from_server: Final = 0

    def skip_from_client(self, n: int) -> None:
        """There is no opaque run to skip."""
        if n:
            raise ValueError(f"{n} bytes skipped, the opaque run has 0 left")

    def skip_from_server(self, n: int) -> None:
        """There is no opaque run to skip."""
        self.skip_from_client(n)

    @property
    def pending_bytes(self) -> int:
        """Bytes of incomplete frames (or headers) held back, both directions."""
        return len(self._client.tail) + len(self._server.tail)

    def collect(self) -> None:
        """Take what the gate made outside a receive call (a release, an expiry, a spool
        acknowledgement) into the outgoing data and events."""
        if self.gate is not None and self.gate.outbox:
            self.output.take(self.gate)

    # -- what the frames said -----------------------------------------------------------------

    @property
    def client(self) -> Peer:
        """The client's SASL choice, Open, sessions and links."""
        return self._client.peer

    @property
    def server(self) -> Peer:
        """The server's SASL outcome, Open, sessions and links."""
        return self._server.peer

    # -- relaying ---------------------------------------------------------------------------------

    def _receive(self, stream: _Stream, data: bytes | memoryview) -> None:
        """Read ``data`` after what ``stream`` holds (``JOINED_READ_MAX``)."""
        if type(data) is not bytes:  # views of it are relayed: it must not change under us
            data = bytes(data)
        start = 0
        while stream.tail:
            tail = stream.tail
            missing = stream.need - len(tail)
            left = len(data) - start
            if left < missing:
                tail += memoryview(data)[start:]
                return
            stream.tail = bytearray()
            if missing <= 0 or left - missing <= JOINED_READ_MAX:
                tail += memoryview(data)[start:]
                data, start = bytes(tail), 0
                break
            tail += memoryview(data)[start:start + missing]
            start += missing
            if not self._read(stream, bytes(tail), 0):
                return
        self._read(stream, data, start)

    def _read(self, stream: _Stream, buf: bytes, start: int) -> bool:
        """Read ``buf`` from ``start``: relay what is complete, hold the rest; False when it
        failed the connection."""
        stream.mark = start
        try:
            stop, need = self._advance(stream, buf, start)
        except ProtocolError as exc:
            assert exc.offset is not None
            _relay(stream, buf, exc.offset)
            self._fail(stream, exc)
            return False
        _relay(stream, buf, stop)
        if stop < len(buf):
            stream.tail = bytearray(memoryview(buf)[stop:])
            stream.need = need
        return True

    def _advance(self, stream: _Stream, buf: bytes, pos: int = 0) -> tuple[int, int]:
        """Walk ``buf`` from ``pos`` through headers and frames; return (end of what is
        complete, need)."""
        # A run is read within the buffer that announced it, or one that goes on with it.
        stream.run = None if stream.resume is None else _resumed(stream, self.gate)
        size = len(buf)
        try:
            while pos < size:
                phase = stream.phase
                if phase is Phase.AMQP:
                    if stream.run is not None and self.gate is not None:
                        pos = _read_run(stream, self.gate, buf, pos, self._now)
                        if self.gate.outbox:
                            self.output.take(self.gate)
                        continue
                    pos, frames, need = scan_frames(
                        buf, pos, stream.limit, AMQP_FRAME, stream.on_amqp, stream.skip
                    )
                elif phase is Phase.SASL:
                    if stream.side is Side.CLIENT and buf[pos] == 0x41:  # "A" of "AMQP"
                        if size - pos < HEADER_SIZE:
                            return pos, HEADER_SIZE
                        self._client_amqp_header(buf[pos : pos + HEADER_SIZE])
                        pos += HEADER_SIZE
                        continue
                    pos, frames, need = scan_frames(
                        buf, pos, MIN_MAX_FRAME_SIZE, SASL_FRAME, stream.on_sasl
                    )
                elif phase is Phase.REFUSED:
                    raise FramingError("data after a refused protocol header")
                else:
                    if size - pos < HEADER_SIZE:
                        return pos, HEADER_SIZE
                    self._server_header(buf[pos : pos + HEADER_SIZE], pos)
                    pos += HEADER_SIZE
                    continue
                stream.counts.frames += frames
                if frames:
                    stream.resume = None
                if need:
                    return pos, need
        except ProtocolError as exc:
            stream.counts.frames += exc.frames_before
            if exc.offset is None:
                exc.offset = pos
            raise
        if stream.run is not None:  # announced by the read's last frame: the next read's
            stream.resume = stream.run[:3]
        return pos, 0

    # -- headers ----------------------------------------------------------------------------------

    def _client_amqp_header(self, header: bytes) -> None:
        if header != AMQP_HEADER:
            raise FramingError(f"client sent protocol header {header!r} after SASL")
        if self._client.peer.sasl_mechanism is None:
            raise FramingError("client sent its AMQP header before sasl-init")
        self._client.phase = Phase.AMQP

    def _server_header(self, header: bytes, pos: int) -> None:
        stream = self._server
        expected = SASL_HEADER if stream.phase is Phase.SASL_HEADER else AMQP_HEADER
        if header != expected:
            stream.phase = Phase.REFUSED
            exc = FramingError(f"server answered protocol header {header!r} to {expected!r}")
            if header.startswith(b"AMQP"):  # a real answer: pass it on, as the server meant
                exc.offset = pos + HEADER_SIZE
            raise exc
        stream.phase = Phase.SASL if expected == SASL_HEADER else Phase.AMQP

    # -- frames -----------------------------------------------------------------------------------

    def _client_sasl_frame(
        self, code: int, channel: int, buf: bytes, start: int, body: int, end: int
    ) -> bool:
        peer = self._client.peer
        fields = _sasl_fields(Side.CLIENT, _CLIENT_SASL_FRAMES, buf, body, end)
        if code == SASL_INIT:
            if peer.sasl_mechanism is not None:
                raise DecodeError("client sent a second sasl-init")
            mechanism = SaslInit.from_fields(fields).mechanism
            if self.refuse_external and mechanism.upper() == "EXTERNAL":
                raise SaslRefused(EXTERNAL_REFUSED)
            peer.sasl_mechanism = mechanism
        else:
            if peer.sasl_mechanism is None:
                raise DecodeError("client sent sasl-response before sasl-init")
            check_sasl_fields(code, fields)
        return True  # its AMQP header may follow: let _advance look

    def _server_sasl_frame(
        self, code: int, channel: int, buf: bytes, start: int, body: int, end: int
    ) -> bool:
        stream = self._server
        fields = _sasl_fields(Side.SERVER, _SERVER_SASL_FRAMES, buf, body, end)
        if code == SASL_OUTCOME:
            outcome = SaslOutcome.from_fields(fields).code
            stream.peer.sasl_outcome = outcome
            stream.sasl_refused = outcome != SASL_OK
            stream.phase = Phase.AMQP_HEADER
        else:
            check_sasl_fields(code, fields)
        return True

    def _amqp_frame(
        self,
        stream: _Stream,
        other: _Stream,
        code: int,
        channel: int,
        buf: bytes,
        start: int,
        body: int,
        end: int,
    ) -> bool:
        if code not in AMQP_PERFORMATIVES:
            raise DecodeError(f"{name_of(code)} is not an AMQP performative")
        gate = self.gate
        if gate is not None and FLOW <= code <= DISPOSITION:
            if code == DISPOSITION and stream.side is Side.SERVER:
                if _settlements_follow(stream, gate, channel, buf, start, end):
                    if end < len(buf):
                        return True  # (this one first in the run)
                    _read_run(stream, gate, buf, end, self._now)  # (a run of one: now)
                    if gate.outbox:
                        self.output.take(gate)
                    return False
                # The broker settling: role, first and last do unless renumbered (decoded).
                settled = peek_disposition(buf, body, end)
                if settled is not None and gate.on_server_settled(channel, *settled, self._now):
                    if gate.outbox:
                        self.output.take(gate)
                    return False
            peeked = peek_composite(buf, body, end)
            if peeked is None:
                _, fields, payload = decode_composite(buf, body, end)
            else:
                fields, payload = peeked
            run = self._gate_frame(gate, stream, code, channel, fields, buf, start, payload, end)
            if gate.outbox:
                self.output.take(gate)
            return run
        _, fields, _ = decode_composite(buf, body, end)
        replacement = self._lifecycle(stream, other, code, channel, fields)
        if gate is not None and gate.outbox:
            self.output.take(gate)
        if replacement is not None:
            _replace(stream, buf, start, end, replacement)
        return False

    def _lifecycle(self, stream: _Stream, other: _Stream, code: int, channel: int,
                   fields: list[object]) -> bytes | None:
        """Open, begin, attach, detach, end, close: what the peers and the gate learn; the
        gate's replacement for the frame, if any (a detach it absorbs)."""
        gate = self.gate
        peer = stream.peer
        client = stream.side is Side.CLIENT
        replacement: bytes | None = None
        if code == OPEN:
            if peer.open is not None:
                raise DecodeError(f"{stream.side.value} sent a second open")
            peer.open = Open.from_fields(fields)
            # The peer declares what it accepts: that limits frames sent *to* it.
            other.limit = max(peer.open.max_frame_size, MIN_MAX_FRAME_SIZE)
            stream.open_relayed = True
            if gate is not None and client:
                gate.vhost_opened(vhost_of(peer.open.hostname))
        elif code == BEGIN:
            begin = Begin.from_fields(fields)
            peer.begin(channel, begin)
            if gate is not None:
                (gate.client_begin if client else gate.server_begin)(channel, begin)
        elif code == ATTACH:
            attach = Attach.from_fields(fields)
            peer.attach(channel, attach)
            if gate is not None:
                (gate.client_attach if client else gate.server_attach)(channel, attach)
        elif code == DETACH:
            detach = Detach.from_fields(fields)
            peer.detach(channel, detach)
            if gate is not None:
                replacement = (gate.client_detach if client else gate.server_detach)(
                    channel, detach.handle)
        elif code == END:
            Ending.from_fields(fields)
            peer.end(channel)
            if gate is not None:
                (gate.client_end if client else gate.server_end)(channel)
        elif code == CLOSE:
            peer.close = Ending.from_fields(fields)
            stream.close_relayed = True
        return replacement

    def _gate_frame(self, gate: TransferHooks, stream: _Stream, code: int, channel: int,
                    fields: list[object], buf: bytes, start: int, payload: int,
                    end: int) -> bool:
        """A flow, transfer or disposition frame, gated; True: a run follows (``runs``)."""
        replacement: bytes | None
        if stream.side is Side.CLIENT:
            if code == TRANSFER:
                replacement = gate.on_client_transfer(channel, fields, buf, payload, end,
                                                      self._now)
                if replacement != b"" and len(fields) > 1 \
                        and type(handle := fields[0]) is UInt \
                        and type(delivery_id := fields[1]) is UInt:  # (forwarded)
                    allowed = gate.transfer_run(channel, handle)
                    if allowed is not None:
                        if replacement is not None:  # renumbered
                            _replace(stream, buf, start, end, replacement)
                        stream.run = (channel, handle, (delivery_id + 1) & 0xFFFFFFFF,
                                      *allowed)
                        return True
            elif code == FLOW:
                replacement = gate.on_client_flow(channel, fields)
            else:
                replacement = gate.on_client_disposition(channel, fields)
        elif code == TRANSFER:
            gate.on_server_transfer(channel, fields)
            if len(fields) > 1 and type(handle := fields[0]) is UInt \
                    and type(delivery_id := fields[1]) is UInt \
                    and gate.server_transfer_run(channel, handle):
                stream.run = (channel, handle, (delivery_id + 1) & 0xFFFFFFFF, RUN_MOST,
                              math.inf)
                return True
            return False
        elif code == FLOW:
            replacement = gate.on_server_flow(channel, fields, self._now)
        else:
            replacement = gate.on_server_disposition(channel, fields, self._now)
        if replacement is not None:
            _replace(stream, buf, start, end, replacement)
        return False

    # -- failing ----------------------------------------------------------------------------------

    def _fail(self, stream: _Stream, exc: ProtocolError) -> None:
        reason = str(exc)
        refused = isinstance(exc, SaslRefused)
        self.failure = Failure(stream.side, exc.condition, reason, refused)
        self._client.tail = bytearray()
        self._server.tail = bytearray()
        if refused:  # the client waits for a sasl-outcome; the broker for a sasl-init
            self.output.to_client.append(frame(encode_performative(SASL_OUTCOME, code=UByte(
                SASL_AUTH)), 0, SASL_FRAME))
            return
        blame = f"floodwall closed the connection: the {stream.side.value} sent bad data"
        if stream.side is Side.CLIENT:
            self._close(exc.condition, reason, "amqp:connection:forced",
                        f"{blame} ({exc.condition}: {reason})")
        else:
            self._close("amqp:internal-error", f"{blame} ({exc.condition}: {reason})",
                        exc.condition, reason)

    def abort(self, reason: str) -> None:
        """The proxy failed: all held and queued is dropped, each peer told internal-error."""
        self._client.tail, self._server.tail = bytearray(), bytearray()
        self.output.clear()
        self._close("amqp:internal-error", reason, "amqp:internal-error", reason)

    def _close(self, client_condition: str, client_description: str,
               server_condition: str, server_description: str) -> None:
        """Queue a close for each peer that can take one."""
        to_client = close_for_client(self._client, self._server, client_condition,
                                     client_description)
        if to_client:
            self.output.to_client.append(to_client)
        to_server = close_for_server(self._client, self._server, server_condition,
                                     server_description)
        if to_server:
            self.output.to_server.append(to_server)


def close_for_client(client: _Stream, server: _Stream, condition: str,
                     description: str) -> bytes:
    """A close for the client if it is in the AMQP layer and has not been closed (after an
    AMQP header and an open if the broker's have not passed), else b""."""
    if client.phase is not Phase.AMQP or server.close_relayed or server.sasl_refused:
        return b""
    if server.phase is Phase.AMQP_HEADER:
        prologue = AMQP_HEADER + frame(open_body(CONTAINER_ID))
    elif server.phase is Phase.AMQP:
        prologue = b"" if server.open_relayed else frame(open_body(CONTAINER_ID))
    else:  # the client still waits for SASL frames (or was refused): nothing fits
        return b""
    return prologue + frame(close_body(condition, _clip(description)))


def close_for_server(client: _Stream, server: _Stream, condition: str,
                     description: str) -> bytes:
    """A close for the server if it has the client's Open and no Close yet, else b""."""
    if not client.open_relayed or client.close_relayed:
        return b""
    if server.phase is Phase.REFUSED or server.sasl_refused:
        return b""
    return frame(close_body(condition, _clip(description)))


def _sasl_fields(
    side: Side, allowed: frozenset[int], buf: bytes, body: int, end: int
) -> list[object]:
    code, fields, _ = decode_composite(buf, body, end)
    if code not in allowed:
        raise DecodeError(f"{name_of(code)} is not a SASL frame the {side.value} may send")
    return fields


def _read_every_frame(streams: list[_Stream], command: object) -> bool:
    """The core's own command (``CoreOutput.own``): the gate consumed a delivery (both peers'
    dispositions are renumbered from now), or counts a windowed link's deliveries until the
    broker settles them (``broker_only``: the broker's)."""
    if isinstance(command, ReadEveryFrame):
        client, server = streams
        server.skip = SKIP_NONE
        if not command.broker_only:
            client.skip = SKIP_NONE
        return True
    return False


def _resumed(stream: _Stream, gate: TransferHooks | None
             ) -> tuple[int, int, int, int, float] | None:
    """The run a read may begin with: the link whose whole deliveries the last read ended
    with, when the gate, asked now, would book the next ones as a run."""
    assert stream.resume is not None
    channel, handle, next_id = stream.resume
    stream.resume = None
    if gate is None or stream.phase is not Phase.AMQP:
        return None
    if stream.side is Side.CLIENT:
        allowed = gate.transfer_run(channel, handle)
        return None if allowed is None else (channel, handle, next_id, *allowed)
    if gate.server_transfer_run(channel, handle):
        return channel, handle, next_id, RUN_MOST, math.inf
    return None


def _read_run(stream: _Stream, gate: TransferHooks, buf: bytes, pos: int, now: float) -> int:
    """Read the run ``stream.run`` announced from ``buf[pos]`` (``runs``); where it ends."""
    assert stream.run is not None
    channel, handle, next_id, most, most_bytes = stream.run
    stream.run = None
    if handle == SETTLEMENTS:  # (next_id: where the disposition that begins it begins;
        end, count, ranges = scan_settlements(buf, next_id, pos)  # most: its state)
        stream.counts.frames += count
        theirs: list[tuple[int, int]] = []  # the client's ids, where the session renumbers
        for first, last in ranges:
            mapped = gate.on_server_settle_run(channel, first, last, most, now)
            if mapped is not None:
                theirs += mapped
        if theirs:  # (a frame per range of the client's ids)
            _replace(stream, buf, next_id, end, settle_frames(buf, next_id, pos, theirs))
        return end
    client = stream.side is Side.CLIENT
    unsettled: list[int] = []  # the client's (the broker's are not tracked)
    end, count, payload_bytes = scan_transfer_run(buf, pos, stream.limit, channel, handle,
                                                  next_id, most, most_bytes,
                                                  unsettled if client else None)
    stream.resume = (channel, handle, (next_id + count) & 0xFFFFFFFF)
    if count:
        stream.counts.frames += count
        if client:
            shift = gate.on_transfer_run(channel, handle, count, payload_bytes, unsettled, now)
            if shift:  # the broker's delivery-ids run behind the client's on the session
                _replace(stream, buf, pos, end, renumber_run(buf, pos, end, shift))
        else:
            gate.on_server_transfer_run(channel, handle, count)
    return end


def _settlements_follow(stream: _Stream, gate: TransferHooks, channel: int, buf: bytes,
                        start: int, end: int) -> bool:
    """The broker's disposition ``buf[start:end]``: True, announcing the run of settlements
    it begins (``stream.run``), when it has the shape such a run is read with, its state one
    the gate counts as it is (not ``rejected``, whose error it reads) and the gate books
    them as ranges (``server_settle_run``, told whether anything follows it in the read)."""
    if not gate.server_settle_run(channel, end == len(buf)) \
            or not settle_template(buf, start, end):
        return False
    state = settle_state(buf, start, end)
    if state is None or state == Outcome.REJECTED or state == TRANSACTIONAL_STATE:
        return False
    stream.run = (channel, SETTLEMENTS, start, state, 0.0)
    return True


def _relay(stream: _Stream, buf: bytes, stop: int) -> None:
    """Queue ``buf[mark:stop]`` for the other peer: the object itself when it is all of ``buf``,
    else a view of it (the I/O layer joins small pieces for its write)."""
    mark = stream.mark
    if stop > mark:
        stream.queue.append(buf if mark == 0 and stop == len(buf)
                            else memoryview(buf)[mark:stop])
        stream.counts.bytes += stop - mark
        stream.mark = stop


def _replace(stream: _Stream, buf: bytes, start: int, end: int, replacement: bytes) -> None:
    """Queue what precedes the frame ``buf[start:end]``, then ``replacement`` in its place."""
    _relay(stream, buf, start)
    if replacement:
        stream.queue.append(replacement)
    stream.counts.bytes += end - start
    stream.mark = end
