"""The relay's socket side: one client connection and its upstream, driven by a sans-IO core."""

from __future__ import annotations

import asyncio
import functools
import logging
import socket
import ssl
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final, cast

from floodwall.control.controller import QueueKey
from floodwall.enforce.amqp091.gate import PublishFlow
from floodwall.enforce.amqp10.gate import CreditFlow
from floodwall.enforce.amqp10.links import LinkView
from floodwall.enforce.commands import SendHeld
from floodwall.enforce.shared import ConnectionGate
from floodwall.io.held_sender import HeldSender
from floodwall.io.read_buffers import ReadBuffers
from floodwall.io.splice import LaneState, SpliceLane, splice_available
from floodwall.io.tls import (
    ListenerTlsContext,
    TlsFailure,
    UpstreamTlsContext,
    ended_after_handshake,
    explain,
)
from floodwall.io.upstreams import Endpoint, Upstreams
from floodwall.ops.logs import event, event_limited
from floodwall.wire.amqp091.connection import Connection as Amqp091Connection
from floodwall.wire.amqp091.connection import close_frame
from floodwall.wire.amqp10.connection import Connection as Amqp10Connection
from floodwall.wire.amqp10.performatives import Outcome
from floodwall.wire.amqp10.types import Described, ULong
from floodwall.wire.detect import HEADER_SIZE, Detected, detect, header_reply
from floodwall.wire.relaycore import FrameCounts, RelayCore, Side
from floodwall.wire.topology import TopologyChange
from floodwall.wire.unreachable import UnreachableAnswer

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from floodwall.io.switchboard import Switchboard
    from floodwall.ops.metrics import RelayStats

log = logging.getLogger("floodwall.relay")

_NO_COUNTS = FrameCounts()
#: Seconds the broker has to answer the connection.close of a vanished client's connection.
RETIRE_TIMEOUT = 5.0


@dataclass(frozen=True)
class RelaySettings:
    """What every relayed connection needs to know."""

    upstreams: Upstreams  # the broker's nodes; the first that answers takes a connection
    connect_timeout: float = 5.0
    handshake_timeout: float = 10.0
    write_high_water: int = 256 * 1024
    board: Switchboard | None = None  # None: no policies, a plain relay (no gates)
    hold_budget: int = 8 * 1024 * 1024  # ops.config.DEFAULT_HOLD_BUDGET
    on_topology: Callable[[TopologyChange], None] | None = None  # declares/binds seen
    upstream_tls: UpstreamTlsContext | None = None  # amqps to the broker
    relay_external: bool = False  # let clients log in with SASL EXTERNAL (as the proxy)
    # 0-9-1 body bytes of one frame at least this many still to come move with splice(2),
    # plain TCP on both sides only (``floodwall.io.splice``); 0: never
    splice_threshold: int = 0
    held_sender: HeldSender | None = None  # sends 1.0 messages held for their queues


def make_core(detected: Detected, header: bytes, conn_id: int = 0,
              settings: RelaySettings | None = None
              ) -> tuple[RelayCore, ConnectionGate | None]:
    """The sans-IO core for a detected protocol, and its gate (with policies)."""
    refuse_external = settings is None or not settings.relay_external
    board = settings.board if settings is not None else None
    watch = settings is not None and settings.on_topology is not None
    if detected is Detected.AMQP091:
        gate = None
        if board is not None and settings is not None:
            gate = PublishFlow(board.enforcement, conn_id, settings.hold_budget)
        return Amqp091Connection(gate, conn_id, watch_topology=watch,
                                 refuse_external=refuse_external), gate
    if board is None or settings is None:
        return Amqp10Connection(header, refuse_external=refuse_external), None
    # (its hold budget bounds its spool captures: a credit gate holds nothing else)
    gate10 = CreditFlow(board.enforcement, conn_id, settings.hold_budget)
    return Amqp10Connection(header, gate10, conn_id, refuse_external=refuse_external), gate10


async def connect_to_broker(s: RelaySettings, side: Callable[[], UpstreamSide],
                            loop: asyncio.AbstractEventLoop) -> Endpoint:
    """Connect to the first of the broker's nodes that takes the connection, in
    ``Upstreams``' order (those that answer first; a name's addresses looked up once for
    many connections); a TLS failure is not tried again on the next node."""
    tls = s.upstream_tls
    endpoints = await s.upstreams.endpoints()
    for n, endpoint in enumerate(endpoints):
        try:
            if tls is None:
                await loop.create_connection(side, endpoint.address, endpoint.port)
            else:
                await loop.create_connection(
                    side, endpoint.address, endpoint.port, ssl=tls.context,
                    server_hostname=tls.server_name(endpoint.host),
                    ssl_handshake_timeout=s.connect_timeout)
        except OSError as exc:
            if isinstance(exc, ssl.SSLError):
                raise
            s.upstreams.failed(endpoint, str(exc) or type(exc).__name__)
            if n < len(endpoints) - 1:
                continue
            raise
        return endpoint
    raise OSError(f"no address for {s.upstreams.label}")  # endpoints() gives at least one


async def connect_upstream(conn: RelayedConnection, loop: asyncio.AbstractEventLoop) -> None:
    """``conn``'s task: connect to the broker, or tell the client why not. A timer that
    cancels it (``_connect_too_slow``) is its deadline, not asyncio.timeout or wait_for: no
    second task, no context manager, no get_running_loop() a connection (the cost of a
    connection)."""
    s = conn.settings
    try:
        node = await connect_to_broker(s, lambda: UpstreamSide(conn), loop)
    except asyncio.CancelledError:
        if conn._handshake_timer is not None or conn._closed:
            raise  # _close_both's cancel, not the connect deadline's
        if conn._connect_task is not None:
            conn._connect_task.uncancel()
        conn._connect_task = None
        if conn.upstream is None:  # connected as the deadline passed: that stands
            _unreachable(conn, TimeoutError())
        return
    except (OSError, TimeoutError) as exc:
        _connect_ended(conn)
        tls = s.upstream_tls
        if isinstance(exc, ssl.SSLError) and tls is not None:
            conn.upstream_tls_failed(tls.failure(exc, s.upstreams.host(None)), tell_client=True)
        else:
            _unreachable(conn, exc)
        return
    _connect_ended(conn)
    conn.node = node
    if not conn._closed:  # told if the node stops answering
        conn._unwatch = s.upstreams.watch(node, functools.partial(_node_lost, conn))


def _unwatched() -> None:
    """A connection not watching its node (``Upstreams.watch``) has nothing to forget."""


def _node_lost(conn: RelayedConnection, reason: str) -> None:
    """The readiness probe found ``conn``'s node no longer answering (hung, or gone without
    a reset): end the connection as a node's death would, so the client reconnects (to the
    next node). The upstream is aborted, not closed: a hung node never takes what is
    buffered for it, and a close would wait for that forever."""
    conn._unwatch = _unwatched
    conn._log_limited("upstream_node_lost", logging.WARNING, conn=conn.conn_id,
                      peer=conn.peer, upstream=str(conn.node), reason=reason,
                      action="the client connection is closed; it reconnects to the next node")
    if conn.upstream is not None:
        conn.upstream.abort()
        conn.upstream = None
    conn._close_both()


def _connect_too_slow(conn: RelayedConnection) -> None:
    """The upstream's connect took its whole ``connect_timeout``: cancel it (the task tells
    the client and closes)."""
    conn._handshake_timer = None
    if conn._connect_task is not None:
        conn._connect_task.cancel()


def _connect_ended(conn: RelayedConnection) -> None:
    conn._connect_task = None
    conn._cancel_handshake_timer()


def _unreachable(conn: RelayedConnection, exc: OSError | TimeoutError) -> None:
    s = conn.settings
    conn.stats.upstream_connect_failures += 1
    reason = str(exc) or type(exc).__name__
    if isinstance(exc, TimeoutError):
        reason = f"no connection within {s.connect_timeout:g}s"
    conn._log_limited("upstream_unreachable", logging.ERROR, conn=conn.conn_id,
                      peer=conn.peer, upstream=s.upstreams.label,
                      reason=reason, action="the client is told why and closed")
    conn._tell_unreachable(reason)


class Paused:
    """Why a client's socket is not read now: bits of an int, any of them stops it. Not an
    enum.Flag: its ``|``, ``&`` and ``~`` build Flag objects, 0.3-0.5 us each in Python 3.11
    (an int's: 0.01), several a connection."""

    CONNECTING: Final = 1  # until the upstream is there
    UPSTREAM_BACKPRESSURE: Final = 2  # the broker's side does not take more
    HOLD_BUDGET: Final = 4  # this connection holds more than its budget
    MEMORY_BUDGET: Final = 8  # the process' held bytes are at its memory budget
    TURN: Final = 16  # it had its READ_TURN_BYTES in this turn of the event loop
    SPLICE: Final = 32  # a splice lane reads it (``floodwall.io.splice``)


class UpstreamPaused:
    """Why the broker's socket is not read now: bits, as ``Paused``."""

    CLIENT_BACKPRESSURE: Final = 1  # the client's side does not take more
    SPLICE: Final = 2  # a splice lane reads it


NOT_PAUSED: Final = 0
#: Client bytes one connection relays in one turn of the event loop. libuv (uvloop) reads a
#: socket up to 32 times per wake-up while it fills the read buffer, so a full-speed
#: producer's 8 MiB (a hold budget) went through in one turn, and nothing else ran for it:
#: on a starved machine, 2-5 s without timers (the fleet's announcements: members fell
#: silent to each other; the depth probes). Past it the connection stops reading until the
#: loop's next turn (``take_turn``): a pause and a resume per 256 KiB, and per read when a
#: read is larger (up to ``READ_SIZE``: a turn is never smaller than one read).
READ_TURN_BYTES = 256 * 1024
#: The most one read of a socket takes. libuv reads into the buffer a protocol hands it
#: (``get_buffer``: the relay's sides are ``asyncio.BufferedProtocol``\ s): the process'
#: ``READ_BUFFERS`` (``floodwall.io.read_buffers``: a small read copied out of it, a large
#: one lent to a core that takes views). uvloop's own reads are 256,000 bytes: a sender
#: of 1 MiB messages took four reads a message, each a pass through the core and a write,
#: and the relay spent 0.2 ms of CPU a message more than a byte pump; reads of 1 MiB took
#: 5-16 % of it off (docs/performance.md, "Large messages"). A client's reads are smaller
#: before its upstream is there and when a gate may hold them (below).
READ_SIZE = 1024 * 1024
READ_BUFFERS = ReadBuffers(READ_SIZE)
#: The most a read takes before the connection relays (its upstream connected): what a client
#: sends before then waits in the proxy (``_pending``), a read of it at most, so a client
#: that sends first and waits costs no more than this.
EARLY_READ_SIZE = 64 * 1024
#: The most a read of a client with a gate takes (policies loaded: the gate may hold what it
#: reads). The hold and memory budgets are checked after each read, so a read is what a
#: connection can go over them by (docs/operations.md, "Memory budget"): a 1 MiB read would
#: make that four times as much.
GATED_READ_SIZE = 256 * 1024


def take_turn(conn: RelayedConnection, n: int) -> None:
    """``conn`` relayed ``n`` more client bytes: past ``READ_TURN_BYTES`` since its last
    turn, its socket waits for the loop's next turn (timers and other sockets go first)."""
    conn.turn_bytes += n
    if conn.turn_bytes >= READ_TURN_BYTES and not conn._paused & Paused.TURN:
        conn._pause_client(Paused.TURN)
        loop = conn._loop
        assert loop is not None  # set as the client connected
        loop.call_soon(_next_turn, conn)


def _next_turn(conn: RelayedConnection) -> None:
    conn.turn_bytes = 0
    conn._resume_client(Paused.TURN)


class RelayedConnection(asyncio.BufferedProtocol):
    """A client's socket: detects the protocol, opens the upstream, relays through the core.

    Reading stops on one side while the other side's write buffer is over its high-water
    mark (explicit backpressure, never unbounded buffering). Either side closing closes the
    other once what was queued for it has been written. Slots: one per connection (memory).
    """

    __slots__ = ("_budget_told", "_client_gone", "_clock", "_closed", "_connect_task",
                 "_handshake_timer", "_head", "_lanes", "_lend", "_loop", "_partial", "_paused",
                 "_pending", "_piped", "_retire_timer", "_server_spoke", "_splice",
                 "_unreachable", "_unwatch", "_upstream_paused", "client", "conn_id", "core",
                 "from_client", "from_server", "gate", "node", "peer", "protocol", "settings",
                 "stats", "turn_bytes", "upstream")

    def __init__(self, settings: RelaySettings, stats: RelayStats, conn_id: int) -> None:
        self.settings = settings
        self.stats = stats
        self.conn_id = conn_id
        self.protocol, self.peer = "unknown", "?"
        self.client: asyncio.Transport | None = None
        self.upstream: asyncio.Transport | None = None
        self.core: RelayCore | None = None
        self.from_client = self.from_server = _NO_COUNTS
        self._head = b""
        self._pending = bytearray()  # client bytes read before the upstream was connected
        self._connect_task: asyncio.Task[None] | None = None
        # The deadline of the step before relaying: the client's protocol header, then the
        # upstream's connect, or the client's part of being told the broker is unreachable.
        self._handshake_timer: asyncio.TimerHandle | None = None
        # connection_made's: asyncio.get_running_loop() is a getpid() syscall a call in
        # Python 3.11, four a connection
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closed = False
        self._server_spoke = False  # the broker's first bytes arrived (TLS: not refused)
        self._paused = NOT_PAUSED  # why the client's socket is not read
        self.turn_bytes = 0  # client bytes relayed since its last turn (``take_turn``)
        self.gate: ConnectionGate | None = None
        # Large reads of either side are lent to the core, not copied (``READ_BUFFERS``):
        # a core that takes views, without a gate (which could hold what it reads)
        self._lend = False
        self._client_gone = False
        self._budget_told = False  # hold_budget_exceeded logged; again once it holds nothing
        self._retire_timer: asyncio.TimerHandle | None = None
        self._unreachable: UnreachableAnswer | None = None  # telling the client why not
        self.node: Endpoint | None = None  # the broker node the upstream is connected to
        self._unwatch: Callable[[], None] = _unwatched  # forgets the watch on ``node``
        self._partial = 0  # bytes of incomplete frames the core holds, as the board counts them
        self._splice = False  # opaque runs move with splice(2) (``_enable_splice``)
        self._lanes: dict[Side, SpliceLane] = {}  # by the side they read
        self._piped = 0  # bytes in the lanes' pipes, as the board counts them
        self._upstream_paused = NOT_PAUSED  # why the broker's socket is not read
        board = settings.board
        self._clock: Callable[[], float] = board.clock if board is not None else time.monotonic

    # -- client side -----------------------------------------------------------------
    @property
    def held_bytes(self) -> int:
        """Bytes of publishes held now (for the metrics: the hold budget's measure)."""
        return self.gate.held_bytes if self.gate is not None else 0

    def state(self) -> dict[str, object]:
        """The connection in ``GET /state``: its id, peer, protocol, node; for AMQP 1.0
        through the credit gate, the broker's outcomes for its deliveries by kind, its
        sender links (``LinkView``) and its messages held per queue (``HeldView``)."""
        doc: dict[str, object] = {"id": self.conn_id, "peer": self.peer,
                                  "protocol": self.protocol,
                                  "node": str(self.node) if self.node is not None else None}
        if isinstance(self.gate, CreditFlow):
            doc["outcomes"] = self.gate.outcomes.as_dict()
            doc["links"] = [v.as_dict() for v in self.gate.link_views()]
            doc["held"] = [v.as_dict() for v in self.gate.held_views()]
        return doc

    def sender_links(self) -> tuple[str, list[LinkView]] | None:
        """Its vhost and its AMQP 1.0 sender links (None: not through the 1.0 credit gate),
        for the per-queue link figures (``floodwall.ops.link_figures``)."""
        if not isinstance(self.gate, CreditFlow):
            return None
        return self.gate.ctx.vhost, self.gate.link_views()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but behave as one.
        self.client = transport = cast(asyncio.Transport, transport)
        peer = transport.get_extra_info("peername")
        self.peer = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        transport.set_write_buffer_limits(high=self.settings.write_high_water)
        self._loop = loop = asyncio.get_running_loop()
        self._handshake_timer = loop.call_later(self.settings.handshake_timeout, self._no_header)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self.upstream is None:
            return READ_BUFFERS.view(EARLY_READ_SIZE)
        return READ_BUFFERS.view(READ_SIZE if self.gate is None else GATED_READ_SIZE)

    def buffer_updated(self, nbytes: int) -> None:
        data = READ_BUFFERS.take(nbytes, self._lend)
        if type(data) is memoryview:
            self.stats.lent_read_bytes["client"] += nbytes
        self.data_received(data)

    def data_received(self, data: bytes | memoryview) -> None:
        if self._unreachable is not None:
            self._answer(data)
            return
        core = self.core
        if core is not None and self.upstream is not None:
            try:
                core.receive_from_client(data, self._clock())
                self._flush(core)
            except Exception as exc:  # the proxy's fault: this connection alone ends
                core_failed(self, exc, "receive_from_client")
                return
            take_turn(self, len(data))
            if self._splice and core.opaque_from_client:
                start_lane(self, Side.CLIENT)
            return
        if core is None:
            self._detect(data)
        else:
            self._pending += data

    def _detect(self, data: bytes | memoryview) -> None:
        self._head += data
        found = detect(self._head)
        if found is Detected.NEED_DATA:
            return
        self._cancel_handshake_timer()
        if found is Detected.UNSUPPORTED:
            self.stats.rejected_headers += 1
            self._log_limited("unsupported_protocol_header", logging.WARNING,
                              conn=self.conn_id, peer=self.peer,
                              header=self._head[:HEADER_SIZE])
            assert self.client is not None
            self.client.write(header_reply(self._head))
            self.client.close()
            self._closed = True
            return
        header, rest = self._head[:HEADER_SIZE], self._head[HEADER_SIZE:]
        self._head = b""
        self.protocol = found.value
        self.core, self.gate = make_core(found, header, self.conn_id, self.settings)
        core = self.core
        self._lend = core.takes_views and self.gate is None
        self.from_client, self.from_server = core.from_client, core.from_server
        if self.gate is not None and self.settings.board is not None:
            self.settings.board.attach(self)
        self.stats.accepted[self.protocol] += 1
        self.stats.live.add(self)
        self._pending += header + rest
        self._pause_client(Paused.CONNECTING)
        loop = self._loop
        assert loop is not None
        self._connect_task = loop.create_task(connect_upstream(self, loop))
        self._handshake_timer = loop.call_later(self.settings.connect_timeout,
                                                _connect_too_slow, self)

    def _log_limited(self, name: str, level: int, **fields: Any) -> None:
        """One line per kind every 10 s at most; the next says how many were left out."""
        event_limited(self.stats.log_limits, time.monotonic(), log, name, level, **fields)

    def _tell_unreachable(self, reason: str) -> None:
        """The broker cannot be reached: answer the client in its protocol with a close that
        says so (``floodwall.wire.unreachable``), then close; it has ``handshake_timeout``
        to play its part."""
        if self._closed or self.client is None:
            self._close_both()
            return
        self._unreachable = UnreachableAnswer(Detected(self.protocol), reason)
        pending, self._pending = bytes(self._pending), bytearray()
        assert self._loop is not None
        self._handshake_timer = self._loop.call_later(self.settings.handshake_timeout,
                                                      self._close_both)
        self._answer(pending)
        self._resume_client(Paused.CONNECTING)

    def _answer(self, data: bytes | memoryview) -> None:
        answer = self._unreachable
        assert answer is not None
        out = answer.receive(bytes(data))
        if out and self.client is not None:
            self.client.write(out)
        if answer.done:
            self._close_both()  # close() writes out what is buffered first

    def upstream_tls_failed(self, failure: TlsFailure, tell_client: bool = False) -> None:
        """The TLS handshake to the broker failed (or the broker's alert right after it,
        with TLS 1.3): the client's connection ends now (told why, when its protocol header
        has not gone upstream yet: ``tell_client``), and the log says why."""
        s = self.settings
        self.stats.upstream_connect_failures += 1
        self.stats.upstream_tls_failures += 1
        self._log_limited("upstream_tls_failed", logging.ERROR, conn=self.conn_id,
                          peer=self.peer, upstream=s.upstreams.label,
                          reason=str(failure))
        if tell_client:
            self._tell_unreachable(str(failure))
        else:
            self._close_both()

    def upstream_connected(self, transport: asyncio.Transport) -> None:
        self.upstream = transport
        transport.set_write_buffer_limits(high=self.settings.write_high_water)
        if self._closed:
            transport.close()
            return
        pending, self._pending = bytes(self._pending), bytearray()
        # The protocol header goes upstream as the client sent it; the core starts after it.
        # What the client sent behind it goes in the same write: a broker that refuses the
        # header (RabbitMQ 4 to a 1.0 client without SASL) answers with its own and resets
        # the socket, and a second write into that reset would end the upstream before its
        # answer was read: the client would see its connection cut, not why.
        header, rest = pending[:HEADER_SIZE], pending[HEADER_SIZE:]
        assert self.core is not None and self.client is not None
        _enable_splice(self)
        if not rest:
            transport.write(header)
        else:
            try:
                self.core.receive_from_client(rest, self._clock())
            except Exception as exc:  # (raised into create_connection, it leaked both sockets)
                transport.write(header)
                core_failed(self, exc, "upstream_connected")
                return
            try:
                self._flush(self.core, header)
            except Exception as exc:
                core_failed(self, exc, "upstream_connected")
                return
        if not self._closed:
            self._resume_client(Paused.CONNECTING)

    def _pause_client(self, why: int) -> None:
        if not self._paused and self.client is not None:
            self.client.pause_reading()
        self._paused |= why

    def _resume_client(self, why: int) -> None:
        if not self._paused & why:
            return
        self._paused &= ~why
        if not self._paused and self.client is not None and not self._closed:
            self.client.resume_reading()

    # -- the gate, outside a read (the switchboard, the expiry timer, the spool) ---------
    def channel_released(self, channel: int, now: float) -> None:
        """Every queue ``channel`` (1.0: a link_ref) waited on has drained: its held frames
        (1.0: its credit) go now."""
        if self.gate is not None:
            from_gate(self, "channel_released", self.gate.channel_released, channel, now)

    def channel_admitted(self, channel: int, now: float) -> None:
        """A held queue ``channel`` waits on has tokens: what it admits goes now."""
        if self.gate is not None:
            from_gate(self, "channel_admitted", self.gate.channel_admitted, channel, now)

    def expire_held(self, now: float) -> None:
        """Refuse held publishes past their deadline, detach 1.0 links without credit past
        it (the proxy calls this periodically while anything is held or blocked)."""
        if self.gate is not None and not self._client_gone:
            from_gate(self, "expire", self.gate.expire, now)

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: ack (1.0: settle) the spooled publishes now durable."""
        if self.gate is not None:
            from_gate(self, "spool_durable", self.gate.spool_durable, durable)

    def _send_held(self, command: SendHeld) -> None:
        """A message the gate held for its queue may go: through the proxy's own sender
        (without one, a relay made without ``Proxy``, it is handed back ``released``)."""
        sender = self.settings.held_sender
        if sender is not None:
            sender.send(command, self.held_settled)
        else:
            self.held_settled(command.token, Described(ULong(Outcome.RELEASED), []))

    def held_settled(self, token: int, state: Described) -> None:
        """The broker's outcome for a held message: to the client, once."""
        if isinstance(self.gate, CreditFlow):
            from_gate(self, "held_settled", self.gate.held_settled, token, state, self._clock())

    def _gate_output(self, core: RelayCore) -> None:
        """The gate made output outside a read: into the core's queues, then written."""
        core.collect()
        self._flush(core)

    def _flush(self, core: RelayCore, server_first: bytes = b"") -> None:
        """Carry out what the core (and its gate) handed back: topology changes and events,
        then the bytes for each peer (``server_first`` ahead of the server's, in the same
        write); then what the controller handed back meanwhile."""
        events = core.events()
        if events:
            self._carry_out(events)
        # Large output goes as its pieces in one vectored write (writelines): no copy.
        to_server = core.chunks_for_server()
        if server_first:
            to_server.insert(0, server_first)
        if to_server and self.upstream is not None:
            _write(self.upstream, to_server)
        to_client = core.chunks_for_client()
        if to_client and self.client is not None:
            _write(self.client, to_client)
        board = self.settings.board
        if board is not None:
            if board.memory is not None and core.pending_bytes != self._partial:
                n = core.pending_bytes
                board.partial_bytes += n - self._partial
                self._partial = n
            if board.pending:
                board.settle()
        flow = self.gate
        if flow is not None:
            if self._client_gone and not flow.holding:
                self._retire_upstream(core)
                return
            self._check_budgets(flow)
        if core.failure is not None:
            f = core.failure
            if f.refused:
                event(log, "client_refused", logging.WARNING, conn=self.conn_id, peer=self.peer,
                      protocol=self.protocol, condition=f.condition, reason=f.reason)
            else:
                self.stats.protocol_errors[(self.protocol, f.side.value)] += 1
                self._log_limited("protocol_error", logging.WARNING, conn=self.conn_id,
                                  peer=self.peer, protocol=self.protocol, side=f.side.value,
                                  condition=f.condition, reason=f.reason)
            self._close_both()

    def _check_budgets(self, flow: ConnectionGate) -> None:
        """Stop reading this connection past its hold budget, or while the process' memory
        budget is reached and it holds publishes; read it again when it is back under.

        ``hold_budget_exceeded`` is logged once until the connection holds nothing again: a
        producer held at its consumers' pace is read and stopped again as every count lets
        some of its publishes go (tens of times a second)."""
        if flow.over_budget:
            if not self._budget_told and flow.held_bytes > flow.hold_budget:
                self._budget_told = True
                event(log, "hold_budget_exceeded", logging.WARNING, conn=self.conn_id,
                      peer=self.peer, held_bytes=flow.held_bytes, budget=flow.hold_budget,
                      action="stopped reading this connection until it is back under; "
                             "logged again once it has held nothing")
            self._pause_client(Paused.HOLD_BUDGET)
        else:
            if self._paused & Paused.HOLD_BUDGET:
                self._resume_client(Paused.HOLD_BUDGET)
            if self._budget_told and not flow.holding:
                self._budget_told = False
        board = self.settings.board
        if board is not None and board.memory is not None and not self._client_gone \
                and board.memory_reached(self.conn_id, flow.held_bytes):
            self._pause_client(Paused.MEMORY_BUDGET)

    def memory_resumed(self) -> None:
        """The process' held bytes are back under the memory budget's resume level."""
        self._resume_client(Paused.MEMORY_BUDGET)

    def _retire_upstream(self, core: RelayCore) -> None:
        """A vanished client's held publishes are all written: end its broker connection as
        a client would, with connection.close; the broker takes every frame before it, sends
        close-ok and closes the socket (``upstream_lost``). A socket closed right behind the
        publishes instead can lose the last of them: RabbitMQ's reader ends the connection's
        channels when it sees the socket close, whatever they still had to route. Closed
        from our side after ``RETIRE_TIMEOUT`` if the broker does not answer."""
        if self._retire_timer is not None:
            return
        event(log, "held_publishes_delivered", conn=self.conn_id, peer=self.peer)
        if self.upstream is None:
            self._close_both()
            return
        if isinstance(core, Amqp091Connection) and core.closing is None:
            self.upstream.write(close_frame(200, "floodwall: the client is gone; its held "
                                                 "publishes were delivered"))
        self._retire_timer = asyncio.get_running_loop().call_later(RETIRE_TIMEOUT,
                                                                   self._close_both)

    def _carry_out(self, events: Sequence[object]) -> None:
        on_topology = self.settings.on_topology
        board = self.settings.board
        for item in events:
            if isinstance(item, TopologyChange):
                if on_topology is not None:
                    on_topology(item)
            elif isinstance(item, SendHeld):
                self._send_held(item)
            elif board is not None:
                board.report(item)

    def pause_writing(self) -> None:  # the client's write buffer is full
        self._pause_upstream(UpstreamPaused.CLIENT_BACKPRESSURE)

    def resume_writing(self) -> None:
        self._resume_upstream(UpstreamPaused.CLIENT_BACKPRESSURE)

    def _pause_upstream(self, why: int) -> None:
        if not self._upstream_paused and self.upstream is not None:
            self.upstream.pause_reading()
        self._upstream_paused |= why

    def _resume_upstream(self, why: int) -> None:
        if not self._upstream_paused & why:
            return
        self._upstream_paused &= ~why
        if not self._upstream_paused and self.upstream is not None and not self._closed:
            self.upstream.resume_reading()

    # -- splice lanes (``floodwall.io.splice``) ----------------------------------------
    def lane_moved(self, side: Side, n: int) -> None:
        core = self.core
        assert core is not None
        if side is Side.CLIENT:
            core.skip_from_client(n)
        else:
            core.skip_from_server(n)
        self.stats.spliced_bytes[side.value] += n

    def lane_piped(self, delta: int) -> None:
        self._piped += delta
        board = self.settings.board
        if board is not None:
            board.partial_bytes += delta

    def lane_head(self, side: Side, data: bytes) -> None:
        if side is Side.CLIENT:
            self.data_received(data)
        else:
            self.server_data(data)

    def lane_may_read(self, side: Side) -> bool:
        if self._closed:
            return False
        if side is Side.CLIENT:
            return self._paused == Paused.SPLICE
        return self._upstream_paused == UpstreamPaused.SPLICE

    def lane_idle(self, side: Side) -> None:
        if side is Side.CLIENT:
            self._resume_client(Paused.SPLICE)
        else:
            self._resume_upstream(UpstreamPaused.SPLICE)

    def lane_failed(self, side: Side, reason: str, mid_frame: bool, dropped: int) -> None:
        """Inside a frame the other peer cannot be given anything else: the connection
        ends (unless that peer is a client already gone: ``_server_lane_to_nobody``).
        Between frames the transport reads again and meets the end (or error) as it would
        have."""
        self._lanes.pop(side, None)
        log.debug("splice_lane_ended conn=%d side=%s reason=%s mid_frame=%s", self.conn_id,
                  side.value, reason, mid_frame)
        if side is Side.SERVER and self._client_gone:
            self._server_lane_to_nobody(dropped)
        elif mid_frame:
            self._close_both()
        else:
            self.lane_idle(side)

    def lane_broken(self, side: Side, exc: Exception) -> None:
        self._lanes.pop(side, None)
        core_failed(self, exc, f"splice_{side.value}")

    def _server_lane_to_nobody(self, dropped: int) -> None:
        """The client went while the broker's bytes were spliced to it, and the upstream
        stays for held publishes: the run's bytes in the pipe were the client's (dropped,
        counted as moved); the rest is read as any bytes and dropped (``server_data``)."""
        lane = self._lanes.pop(Side.SERVER, None)
        if lane is not None:
            dropped += lane.close()
        if dropped and self.core is not None:
            self.core.skip_from_server(dropped)
        self._resume_upstream(UpstreamPaused.SPLICE)

    def eof_received(self) -> bool:
        return False  # close our side; connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:
        flow = self.gate
        if flow is not None and flow.holding and self.upstream is not None and not self._closed:
            # Held publishes are still delivered: keep the upstream until they have left.
            self._client_gone = True
            self.client = None
            self._server_lane_to_nobody(0)
            event(log, "client_gone_with_held_publishes", logging.WARNING, conn=self.conn_id,
                  peer=self.peer, held_bytes=flow.held_bytes,
                  action="keeping the broker connection until they are delivered")
            return
        self._close_both()

    # -- upstream side (called by UpstreamSide) ----------------------------------------
    def server_data(self, data: bytes | memoryview) -> None:
        self._server_spoke = True
        core = self.core
        assert core is not None
        try:
            core.receive_from_server(data, self._clock())
            if self._client_gone:
                core.data_for_client()  # nobody to tell
            self._flush(core)
        except Exception as exc:  # the proxy's fault: this connection alone ends
            core_failed(self, exc, "receive_from_server")
            return
        if self._splice and core.opaque_from_server:
            start_lane(self, Side.SERVER)

    def upstream_paused(self, paused: bool) -> None:
        if paused:
            self._pause_client(Paused.UPSTREAM_BACKPRESSURE)
        else:
            self._resume_client(Paused.UPSTREAM_BACKPRESSURE)

    def upstream_lost(self, exc: Exception | None = None) -> None:
        tls = self.settings.upstream_tls
        if tls is not None and not self._closed:
            if isinstance(exc, ssl.SSLError):
                self.upstream_tls_failed(tls.failure(exc, self.settings.upstreams.host(self.node)))
                return
            if not self._server_spoke and (
                    exc is None or isinstance(exc, (ConnectionResetError, BrokenPipeError))):
                self.upstream_tls_failed(
                    ended_after_handshake(tls, "EOF" if exc is None else type(exc).__name__))
                return
        self._close_both()

    # -- both ----------------------------------------------------------------------------
    def _no_header(self) -> None:
        self._handshake_timer = None
        self._log_limited("handshake_timeout", logging.WARNING, conn=self.conn_id,
                          peer=self.peer, seconds=self.settings.handshake_timeout,
                          received=len(self._head))
        self._close_both()

    def _cancel_handshake_timer(self) -> None:
        if self._handshake_timer is not None:
            self._handshake_timer.cancel()
            self._handshake_timer = None

    def _close_both(self) -> None:
        if self._closed and self.client is None and self.upstream is None:
            return
        self._closed = True
        self._unwatch()
        self._unwatch = _unwatched
        self._cancel_handshake_timer()
        if self._lanes:
            for lane in list(self._lanes.values()):
                lane.close()
            self._lanes.clear()
        if self._retire_timer is not None:
            self._retire_timer.cancel()
        if self._connect_task is not None:
            self._connect_task.cancel()
            self._connect_task = None
        # close() writes out what is buffered first; abort would drop a queued close frame.
        if self.client is not None:
            self.client.close()
            self.client = None
        if self.upstream is not None:
            self.upstream.close()
            self.upstream = None
        try:
            _forget_gate(self)
        finally:  # whatever the gate did, the connection is gone
            if self in self.stats.live:
                self.stats.retire(self)

    def close(self) -> None:
        """Close both sockets (shutdown)."""
        self._close_both()


def _enable_splice(conn: RelayedConnection) -> None:
    """At the upstream's connect: opaque runs move with splice(2) when the threshold is on,
    the protocol is 0-9-1 and neither side is TLS (its bytes are not the socket's)."""
    threshold = conn.settings.splice_threshold
    client, upstream = conn.client, conn.upstream
    if (threshold <= 0 or conn.settings.upstream_tls is not None or client is None
            or upstream is None or not isinstance(conn.core, Amqp091Connection)
            or client.get_extra_info("sslcontext") is not None
            or client.get_extra_info("socket") is None
            or upstream.get_extra_info("socket") is None or not splice_available()):
        return
    conn.core.opaque_min = threshold
    conn._splice = True


def start_lane(conn: RelayedConnection, side: Side) -> None:
    """The core opened an opaque run on ``side``: its socket stops being read by its
    transport and a lane moves the run. Not for a client whose gate holds publishes (a
    client gone inside a frame could not have them delivered after it); not when the lane
    cannot be made (no pipe: said once a kind, the connection copies)."""
    core = conn.core
    if core is None or conn._closed:
        return
    n = core.opaque_from_client if side is Side.CLIENT else core.opaque_from_server
    gate = conn.gate
    if not n or (side is Side.CLIENT and gate is not None and gate.holding):
        return
    lane = conn._lanes.get(side)
    if lane is None:
        src, dst = ((conn.client, conn.upstream) if side is Side.CLIENT
                    else (conn.upstream, conn.client))
        if src is None or dst is None or conn._loop is None:
            return
        try:
            lane = SpliceLane(conn._loop, conn, side, src.get_extra_info("socket").fileno(),
                              dst.get_extra_info("socket").fileno(), dst)
        except OSError as exc:
            conn._splice = False
            conn._log_limited("splice_unavailable", logging.WARNING, conn=conn.conn_id,
                              reason=str(exc), action="this connection copies its bodies")
            return
        conn._lanes[side] = lane
    if lane.state is LaneState.IDLE:
        if side is Side.CLIENT:
            conn._pause_client(Paused.SPLICE)
        else:
            conn._pause_upstream(UpstreamPaused.SPLICE)
    lane.start(n)


def from_gate(conn: RelayedConnection, where: str, call: Callable[..., object],
              *args: object) -> None:
    """A call into ``conn``'s gate outside a read (``where``: a release, an admission, the
    expiry timer, the spool's acknowledgement), then what it made written; an exception
    ends that connection alone (``core_failed``)."""
    core = conn.core
    if core is None or conn._closed:
        return
    try:
        call(*args)
        conn._gate_output(core)
    except Exception as exc:
        core_failed(conn, exc, where)


def _forget_gate(conn: RelayedConnection) -> None:
    """The connection closed: its gate lets go of what it held and blocked; the board
    forgets it (and the incomplete frames it counted)."""
    board = conn.settings.board
    if board is not None and conn._partial:
        board.partial_bytes -= conn._partial
        conn._partial = 0
    gate, conn.gate = conn.gate, None
    if gate is None:
        return
    try:
        if gate.holding:
            event(log, "held_publishes_lost", logging.ERROR, conn=conn.conn_id,
                  peer=conn.peer, held_bytes=gate.held_bytes,
                  reason="the broker connection closed")
        gate.close()
    finally:
        if board is not None:
            board.detach(conn)
            if board.memory is not None:
                board.memory.forget(conn.conn_id)
                board.relieve_memory()


def core_failed(conn: RelayedConnection, exc: Exception, where: str) -> None:
    """A call into the core or its gate (``where``) raised: the proxy's fault, not a
    peer's. This connection alone ends: each peer gets the protocol's internal error
    (0-9-1 connection.close 541, 1.0 close with amqp:internal-error), one line a kind
    every 10 s says why (never a traceback a frame), and both sockets close."""
    conn.stats.internal_errors[conn.protocol] += 1
    conn._log_limited("relay_internal_error", logging.ERROR, conn=conn.conn_id,
                      peer=conn.peer, protocol=conn.protocol, where=where,
                      error=f"{type(exc).__name__}: {exc}",
                      action="closed this connection on both sides")
    log.debug("relay_internal_error conn=%d where=%s", conn.conn_id, where, exc_info=exc)
    core = conn.core
    if core is not None and not conn._closed:
        to_server: list[Any] = []
        to_client: list[Any] = []
        try:
            core.abort(f"floodwall could not relay this connection ({type(exc).__name__}); "
                       "it was closed")
            to_server, to_client = core.chunks_for_server(), core.chunks_for_client()
        except Exception:  # the core is past telling anyone: the sockets still close
            log.debug("abort failed conn=%d", conn.conn_id, exc_info=True)
        if to_server and conn.upstream is not None:
            _write(conn.upstream, to_server)
        if to_client and conn.client is not None:
            _write(conn.client, to_client)
    conn._close_both()


class TlsListener:
    """The ``--listen-tls`` listener: accepts, runs each client's TLS handshake, then hands
    the TLS transport to a new ``RelayedConnection`` (which detects the protocol in what TLS
    decrypts). A handshake that fails (no or a refused client certificate, not TLS at all,
    too slow) is logged with the peer and why; nothing of it reaches the relay."""

    def __init__(self, sock: socket.socket, factory: Callable[[], RelayedConnection],
                 tls: ListenerTlsContext, handshake_timeout: float, stats: RelayStats) -> None:
        self.sock = sock
        self.factory = factory
        self.tls = tls
        self.handshake_timeout = handshake_timeout
        self.stats = stats
        self._handshakes: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None
        self._closed = asyncio.Event()

    @classmethod
    async def start(cls, host: str, port: int, factory: Callable[[], RelayedConnection],
                    tls: ListenerTlsContext, handshake_timeout: float, stats: RelayStats,
                    backlog: int = 1024) -> TlsListener:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.create_server((host, port), family=family, backlog=backlog)
        sock.setblocking(False)
        listener = cls(sock, factory, tls, handshake_timeout, stats)
        listener._accepting = asyncio.get_running_loop().create_task(
            listener._accept_forever(), name="tls-accept")
        return listener

    @property
    def port(self) -> int:
        return int(self.sock.getsockname()[1])

    async def _accept_forever(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            try:
                conn, addr = await loop.sock_accept(self.sock)
            except OSError as exc:  # e.g. EMFILE: say so, do not spin
                event(log, "accept_failed", logging.ERROR, reason=str(exc))
                await asyncio.sleep(0.1)
                continue
            task = loop.create_task(self._handshake(conn, addr))
            self._handshakes.add(task)
            task.add_done_callback(self._handshakes.discard)

    async def _handshake(self, conn: socket.socket, addr: object) -> None:
        loop = asyncio.get_running_loop()
        peer = f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr)
        try:
            await asyncio.wait_for(loop.connect_accepted_socket(
                self.factory, conn, ssl=self.tls.front,
                ssl_handshake_timeout=self.handshake_timeout), self.handshake_timeout + 1)
        except (OSError, TimeoutError) as exc:
            conn.close()
            self.stats.client_tls_failures += 1
            if isinstance(exc, ssl.SSLError):
                reason = explain(exc, None, self.tls.settings.client_ca)
            elif isinstance(exc, TimeoutError):
                reason = f"no TLS handshake within {self.handshake_timeout}s"
            else:
                reason = str(exc) or type(exc).__name__
            event(log, "client_tls_failed", logging.WARNING, peer=peer, reason=reason)

    def close(self) -> None:
        """Stop accepting (pending handshakes are cut); open connections are not touched."""
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._handshakes):
            task.cancel()
        self.sock.close()
        self._closed.set()

    async def wait_closed(self) -> None:
        await self._closed.wait()
        tasks = [t for t in (self._accepting, *self._handshakes) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)


VECTORED_WRITE_MIN = 64 * 1024
"""Output at least this large goes as the core's pieces in one vectored write (no copy of
what are mostly the reads themselves); smaller output is joined into one ``bytes`` first, so
that a view never keeps a whole read alive in a write buffer for a few bytes of it."""


def _write(transport: asyncio.Transport, chunks: list[Any]) -> None:
    if len(chunks) == 1:
        chunk = chunks[0]
        # One piece goes as it is: a read's bytes, or a view of at least half of one (the
        # complete frames of a small read joined to the frame held before it),
        # which keeps at most as many bytes alive as it writes.
        if type(chunk) is bytes or (type(chunk) is memoryview
                                    and 2 * chunk.nbytes >= len(cast(bytes, chunk.obj))):
            transport.write(chunk)
            return
    if sum(len(c) for c in chunks) >= VECTORED_WRITE_MIN:
        transport.writelines(chunks)
    else:
        transport.write(b"".join(chunks))


class UpstreamSide(asyncio.BufferedProtocol):
    """The proxy's socket to the broker for one client connection."""

    __slots__ = ("owner",)

    def __init__(self, owner: RelayedConnection) -> None:
        self.owner = owner

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.owner.upstream_connected(cast(asyncio.Transport, transport))

    def get_buffer(self, sizehint: int) -> memoryview:
        return READ_BUFFERS.view(READ_SIZE)

    def buffer_updated(self, nbytes: int) -> None:
        owner = self.owner
        data = READ_BUFFERS.take(nbytes, owner._lend)
        if type(data) is memoryview:
            owner.stats.lent_read_bytes["server"] += nbytes
        owner.server_data(data)

    def pause_writing(self) -> None:
        self.owner.upstream_paused(True)

    def resume_writing(self) -> None:
        self.owner.upstream_paused(False)

    def eof_received(self) -> bool:
        return False

    def connection_lost(self, exc: Exception | None) -> None:
        self.owner.upstream_lost(exc)


__all__ = ["RelaySettings", "RelayedConnection", "Side", "TlsListener", "make_core"]
