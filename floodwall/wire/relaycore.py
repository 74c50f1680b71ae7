"""The contract between the I/O layer and a sans-IO protocol core: one proxied connection.

Also the two commands every core and gate output comes down to, frames the proxy itself sends
a peer (``ToClient``, ``ToServer``): a gate appends them to its outbox, the core moves them
into its outgoing data in order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any, Generic, Protocol, TypeVar

EXTERNAL_REFUSED = (
    "SASL EXTERNAL through floodwall would log in as the proxy's own TLS certificate, not "
    "the client's: refused (--upstream-tls-relay-external allows it)")
"""Why both cores refuse a client's SASL EXTERNAL by default (docs/design/tls.md, "SASL EXTERNAL"):
RabbitMQ's EXTERNAL takes the user from the certificate on *its* side of the socket, which
is the proxy's; a relayed EXTERNAL login would give every client the proxy's identity."""

JOINED_READ_MAX = 16 * 1024
"""Both cores: a read that completes the frame held from the read before, with at most this
many bytes of it beyond (0-9-1: the read itself at most this large), is joined to the held
frame and the whole read in one pass, one piece of output: copying a small read costs less
than a pass of its own (a consumer's reads on a quiet machine hold one or two deliveries,
most cut inside a frame; the I/O layer would join the two pieces for its write anyway). From
a larger read the held frame takes just the bytes it misses and is read on its own, and the
rest of the read is read where it lies and relayed as views of it: a stream cut inside its
frames (a sender at full speed: nearly every read) is never copied whole, and copying stays
linear however the stream is cut."""


class Side(Enum):
    """Which peer of a proxied connection a byte stream comes from."""

    CLIENT = "client"
    SERVER = "server"


@dataclass(frozen=True, slots=True)
class Failure:
    """Why a core gave up on its connection.

    The core has already queued the protocol's close frame for ``side``'s peer where the
    protocol has one (0-9-1 ``connection.close`` 501, 1.0 ``close`` with an error); the I/O
    layer flushes what the core queued, logs ``reason`` once and closes both sockets.
    """

    side: Side
    condition: str  # "501 FRAME_ERROR", "amqp:decode-error", ...
    reason: str
    refused: bool = False  # well-formed, but the proxy refuses it (SASL EXTERNAL relayed)


@dataclass(slots=True)
class FrameCounts:
    """Frames and bytes a core has relayed in one direction; plain ints for the hot path."""

    frames: int = 0
    bytes: int = 0


@dataclass(frozen=True, slots=True)
class ToClient:
    """Bytes (whole frames) the proxy itself sends the client."""

    data: bytes


@dataclass(frozen=True, slots=True)
class ToServer:
    """Bytes (whole frames) the proxy itself sends the broker."""

    data: bytes


class GateOutputHooks(Protocol):
    """A gate's outbox, as a core empties it (``floodwall.enforce.shared.GateContext``)."""

    @property
    def outbox(self) -> Sequence[object]: ...

    def take_output(self) -> Sequence[object]: ...


S = TypeVar("S")


class CoreOutput(Generic[S]):
    """What a core has made for the I/O layer, a part each core owns: the bytes for each peer
    (``to_server``, ``to_client``: whole frames, or views of bytes that never change) and the
    typed values besides them (``events``: topology changes, the gate's events).

    ``take`` moves a gate's output in at the point the gate made it: frames into the queues,
    commands meant for the core itself to ``own`` (called with ``core_state``, the part of
    the core's state it changes, and the command; True when it carried it out), the rest into
    ``events``. ``own`` is a function shared by every core of a kind, not a method of the
    core: nothing per connection is made for it, and the output keeps no reference back to
    its core (a 0-9-1 core is freed by its last reference). A core empties the queues with
    ``take_all``."""

    __slots__ = ("core_state", "events", "own", "to_client", "to_server")

    def __init__(self, own: Callable[[S, object], bool], core_state: S) -> None:
        self.to_server: list[Any] = []
        self.to_client: list[Any] = []
        self.events: list[object] = []
        self.own = own
        self.core_state = core_state

    def take_events(self) -> Sequence[object]:
        """What the gate made besides frames, in order (and forget it)."""
        if not self.events:
            return ()
        out, self.events = self.events, []
        return out

    def take(self, gate: GateOutputHooks, to_server: list[Any] | None = None,
             to_client: list[Any] | None = None) -> None:
        """Move the gate's output into the queues, in order; keep its events. A core that
        holds a peer's frames back for now (inside a frame of its own it has begun to
        send that peer) names the list they wait in instead (``to_server``,
        ``to_client``)."""
        if to_server is None:
            to_server = self.to_server
        if to_client is None:
            to_client = self.to_client
        for command in gate.take_output():
            if isinstance(command, ToServer):
                to_server.append(command.data)
            elif isinstance(command, ToClient):
                to_client.append(command.data)
            elif not self.own(self.core_state, command):
                self.events.append(command)

    def clear(self) -> None:
        """Drop the bytes queued for both peers (the core aborts)."""
        self.to_server.clear()
        self.to_client.clear()


class OwnsOutput(Protocol):
    """A core that owns a ``CoreOutput``: what the ``RelayCore`` accessors below read."""

    @property
    def output(self) -> CoreOutput[Any]: ...


# The ``RelayCore`` accessors of a core that owns a ``CoreOutput``, one function each for
# every kind of core: a core's class names them (``data_for_server = relaycore.data_for_server``).


def data_for_server(core: OwnsOutput) -> bytes:
    """Everything queued for the broker (b"" if nothing), and forget it."""
    return drain(core.output.to_server)


def data_for_client(core: OwnsOutput) -> bytes:
    """Everything queued for the client (b"" if nothing), and forget it."""
    return drain(core.output.to_client)


def chunks_for_server(core: OwnsOutput) -> list[Any]:
    """``data_for_server`` as the pieces it would join, for a vectored write."""
    return take_all(core.output.to_server)


def chunks_for_client(core: OwnsOutput) -> list[Any]:
    """``data_for_client`` as the pieces it would join, for a vectored write."""
    return take_all(core.output.to_client)


def events(core: OwnsOutput) -> Sequence[object]:
    """What the core and its gate made besides frames, in order (and forget it)."""
    return core.output.take_events()


def drain(queue: list[Any]) -> bytes:
    """A queue's pieces joined into bytes (b"" if none), and the queue emptied."""
    if not queue:
        return b""
    if len(queue) == 1:
        chunk = queue[0]
        queue.clear()
        return chunk if type(chunk) is bytes else bytes(chunk)
    data = b"".join(queue)
    queue.clear()
    return data


def take_all(queue: list[Any]) -> list[Any]:
    """A core's ``chunks_for_server`` / ``chunks_for_client``: what its ``data_for_server``
    (``data_for_client``) would return, as the pieces it would join (bytes, or views of bytes
    that never change), and forget it: for a vectored write, no copy."""
    if not queue:
        return []
    out = queue[:]  # the queue itself stays: the core's directions hold it
    queue.clear()
    return out


class RelayCore(Protocol):
    """One proxied connection's protocol state, both directions, no I/O.

    The I/O layer feeds what it reads from each socket, with the time (``now``: the
    caller's monotonic clock, seconds; the core reads no clock), into ``receive_from_client``
    / ``receive_from_server`` and writes what ``data_for_server`` / ``data_for_client`` hand
    back (or the pieces of it, ``chunks_for_server`` / ``chunks_for_client``, for a
    vectored write); ``events`` hands back the typed values the core and its gate produced
    (topology changes, gate events) for the I/O layer to act on. Frames the core does not
    change leave exactly as they came, in order; a partial frame is kept until the rest
    arrives. After a call, ``failure`` set means: flush, close; an exception out of a call
means the proxy failed, not a peer: the I/O layer calls ``abort``, writes what it queued and
closes both sides (``floodwall.io.relay``). ``collect`` takes what the
    core's gate produced outside a receive call (a release, an expiry, a spool
    acknowledgement) into the same outgoing data and events.
    """

    failure: Failure | None
    from_client: FrameCounts
    from_server: FrameCounts

    @property
    def takes_views(self) -> bool:
        """The core may be given its reads as read-only ``memoryview``\\ s whose bytes the
        caller never changes while any view of them lives (no copy into ``bytes``); False:
        bytes only (anything else is copied)."""

    @property
    def pending_bytes(self) -> int:
        """Bytes of incomplete frames held back, both directions (the memory budget counts
        them)."""

    @property
    def opaque_from_client(self) -> int:
        """How many of the client's next bytes pass untouched as the body of a frame whose
        head has left (an opaque run; 0: none now): the I/O layer may move them itself
        and say so with ``skip_from_client``, or feed them as any bytes."""

    @property
    def opaque_from_server(self) -> int:
        """As ``opaque_from_client``, for the broker's next bytes."""

    def skip_from_client(self, n: int) -> None:
        """The I/O layer moved ``n`` bytes of the client's opaque run itself."""

    def skip_from_server(self, n: int) -> None:
        """The I/O layer moved ``n`` bytes of the broker's opaque run itself."""

    def receive_from_client(self, data: bytes | memoryview, now: float) -> None: ...

    def receive_from_server(self, data: bytes | memoryview, now: float) -> None: ...

    def data_for_server(self) -> bytes: ...

    def data_for_client(self) -> bytes: ...

    def chunks_for_server(self) -> list[Any]: ...

    def chunks_for_client(self) -> list[Any]: ...

    def events(self) -> Sequence[object]: ...

    def collect(self) -> None: ...

    def abort(self, reason: str) -> None:
        """The proxy itself failed on this connection (not the peers): what the core holds
        and has queued is dropped, and each peer that can take one gets the protocol's
        internal-error close saying ``reason``; the I/O layer writes them and closes."""
