"""The 0-9-1 publish gate's per-channel state: what it knows of a publish, the frames it holds,
the confirm numbers it renumbers, and each channel's phase (``enforce.states``)."""

from __future__ import annotations

import struct
from collections import deque
from dataclasses import dataclass, field
from typing import Final

from pamqp import commands
from pamqp import frame as pamqp_frame

from floodwall.control.controller import QueueKey
from floodwall.enforce import events as ev
from floodwall.enforce.shadow import ShadowHold
from floodwall.enforce.states import (
    CLOSING_PHASES,
    PUBLISH_PHASES,
    ChannelPhase,
    PublishInput,
    PublishPhase,
)
from floodwall.wire.amqp091.framing import HEADER_SIZE, Buffer, frame_at
from floodwall.wire.amqp091.runs import HEADERS_FLAG

PROTOCOL: Final = ev.ProtocolName.AMQP091
_B = commands.Basic
_CH = commands.Channel
_SHORT = struct.Struct(">H")
BODY_SIZE = struct.Struct(">HHQH")  # class id, weight, body size, property flags
DEFAULT_HOLD_BUDGET: Final = 8 * 1024 * 1024
#: Held bytes past which a connection is not read while a channel of it waits for a lookup
#: (floodwall/control/lookups.py): a lookup takes a round trip, and a flood read meanwhile
#: would only take the event loop from the answer.
LOOKUP_HOLD_BUDGET: Final = 256 * 1024

# Methods that keep flowing on a channel while its publishes are held: they cannot
# overtake a publish in any way the broker or the client could observe.
PASS_WHILE_HELD: Final = frozenset({
    _B.Ack.index, _B.Nack.index, _B.Reject.index, _B.Qos.index, _B.Consume.index,
    _B.Cancel.index, _B.Get.index, _B.Recover.index, _B.RecoverAsync.index,
    _CH.FlowOk.index, _CH.Flow.index,
})


@dataclass(frozen=True, slots=True)
class Publish:
    """What the gate needs to know of one basic.publish."""

    exchange: str
    routing_key: str
    mandatory: bool


def parse_publish(buf: Buffer, offset: int) -> Publish:
    """Read exchange, routing key and flags of the basic.publish frame at ``offset``.

    The caller has validated the frame; a field running past the frame's end raises
    ValueError, which the core turns into a 502 syntax error.
    """
    _, _, size = frame_at(buf, offset)
    end = offset + HEADER_SIZE + size
    pos = offset + HEADER_SIZE + 6  # class, method, ticket
    n = buf[pos]
    exchange = bytes(buf[pos + 1 : pos + 1 + n]).decode("utf-8", "replace")
    pos += 1 + n
    n = buf[pos]
    routing_key = bytes(buf[pos + 1 : pos + 1 + n]).decode("utf-8", "replace")
    pos += 1 + n
    if pos >= end:
        raise ValueError("basic.publish fields run past the end of the frame")
    return Publish(exchange, routing_key, bool(buf[pos] & 1))


@dataclass(eq=False, slots=True)
class HeldPublish:
    """A publish waiting at the proxy: its frames exactly as they came, and why it waits."""

    publish: Publish
    frames: list[bytes]
    body_size: int
    received: int  # body bytes that have arrived so far
    queues: frozenset[str]
    held_at: float
    client_seq: int  # its confirm sequence number on the client's side (0 = not confirming)
    spool_to: QueueKey | None = None  # goes to this queue's spool once its content is in
    generation: int = 0  # the routing model's generation ``queues`` was computed at

    @property
    def complete(self) -> bool:
        return self.received >= self.body_size

    @property
    def nbytes(self) -> int:
        return sum(len(f) for f in self.frames)


HeldItem = HeldPublish | bytes  # a held publish, or another frame waiting behind one


@dataclass(slots=True)
class ConfirmNumbers:
    """Client and broker publish sequence numbers of one channel in confirm mode.

    They differ once the proxy itself answered a publish (a nack for a refused or expired
    one): the broker never saw it. ``offsets`` records, from which broker number on, how
    far the client's numbers run ahead, so the broker's acks can be renumbered.
    """

    client_seq: int = 0  # publishes the client sent since confirm.select
    broker_seq: int = 0  # publishes forwarded to the broker
    ahead: int = 0  # client_seq - broker_seq for the next forwarded publish
    offsets: deque[tuple[int, int]] = field(default_factory=deque)  # (first broker seq, ahead)

    def forwarded(self, count: int = 1) -> None:
        """``count`` publishes forwarded (more than one: a run, ``enforce.amqp091.runs``)."""
        if self.ahead and (not self.offsets or self.offsets[-1][1] != self.ahead):
            self.offsets.append((self.broker_seq + 1, self.ahead))
        self.broker_seq += count

    def answered_by_proxy(self) -> None:
        self.ahead += 1

    def to_client(self, broker_tag: int) -> int:
        """The client's number for the broker's ``broker_tag``."""
        ahead = 0
        for first, value in self.offsets:
            if first > broker_tag:
                break
            ahead = value
        return broker_tag + ahead

    def acked_through(self, broker_tag: int) -> None:
        """Forget offsets no later ack can need (after an ack with multiple=true)."""
        offsets = self.offsets
        while len(offsets) > 1 and offsets[1][0] <= broker_tag:
            offsets.popleft()

    @property
    def renumbering(self) -> bool:
        return bool(self.offsets)


@dataclass(slots=True)
class ChannelFlow:
    """One channel's publish state: its phases (``enforce.states``: its publishes' content,
    ``publish``; its lifecycle, ``phase``) with what each phase is about (the publish
    ``awaiting`` its header, the one ``filling``, the body bytes ``discard_content`` drops), the
    frames it ``held``, its confirm numbers and its Channel.Flow of ours."""

    channel: int
    publish: PublishPhase = PublishPhase.READY
    phase: ChannelPhase = ChannelPhase.OPEN
    held: deque[HeldItem] = field(default_factory=deque)
    held_bytes: int = 0
    filling: HeldPublish | None = None  # FILLING: the held or captured publish
    awaiting: tuple[Publish, bytes] | None = None  # AWAITING_HEADER: the publish, its method
    discard_content: int = 0  # DISCARDING: body bytes still to drop
    confirms: ConfirmNumbers | None = None
    transactional: bool = False  # tx.select seen: its publishes are never spooled
    spool_acks: deque[tuple[QueueKey, int, int]] = field(default_factory=deque)
    # (queue, spool seq, client seq): spooled publishes whose ack waits for durability
    not_spooled_reported: bool = False
    signalled_off: bool = False  # we sent channel.flow(active=false)
    flow_replies: int = 0  # replies to injected channel.flow still to absorb
    reopen: list[bytes] = field(default_factory=list)  # client frames after its close-ok
    shadow: ShadowHold = field(default_factory=ShadowHold)  # its would-be hold (shadow mode)
    # The arguments of its last basic.publish as they came, and what they say (gate.py).
    last_publish: tuple[bytes, Publish] | None = None

    def move(self, event: PublishInput) -> None:
        """Step the publish phase (``PUBLISH_PHASES``); a pair the table does not hold is the
        gate's own fault (the core keeps content in order) and raises."""
        after = PUBLISH_PHASES.get((self.publish, event))
        if after is None:
            raise RuntimeError(f"channel {self.channel}: a {self.publish.value} channel "
                               f"takes no {event.name}")
        self.publish = after

    @property
    def closing_by_proxy(self) -> bool:
        """The proxy closed the channel on both sides and waits for the close-oks."""
        # per publish: an identity test first (an enum's hash is a Python call)
        return self.phase is not ChannelPhase.OPEN and self.phase in CLOSING_PHASES

    @property
    def holding(self) -> bool:
        """Frames wait at the proxy, or a publish's body is gathered here."""
        return bool(self.held) or self.filling is not None

    @property
    def on_fast_path(self) -> bool:
        """The core may pass the channel's frames on its scan without showing them to the gate:
        it is open, between publishes and holds nothing (``HeldChannels.slow_channels``)."""
        return (self.publish is PublishPhase.READY and not self.held
                and self.phase is ChannelPhase.OPEN)

    @property
    def may_run(self) -> bool:
        """Its next publishes may be booked as a run (``enforce.amqp091.runs``): on the fast
        path, no Channel.Flow of ours in force or unanswered, no would-be (shadow) hold."""
        return (self.on_fast_path and not self.flow_replies and not self.signalled_off
                and not self.shadow.on)


def headers_of(header_frame: Buffer) -> dict[str, object] | None:
    """The ``headers`` property of a content header frame, decoded only when present."""
    flags = BODY_SIZE.unpack_from(header_frame, HEADER_SIZE)[3]
    if not flags & HEADERS_FLAG:
        return None
    try:
        _, _, value = pamqp_frame.unmarshal(bytes(header_frame))
    except Exception:  # the broker will refuse it; route as if it had no headers
        return None
    headers = getattr(getattr(value, "properties", None), "headers", None)
    return dict(headers) if isinstance(headers, dict) else None
