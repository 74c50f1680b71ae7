"""The 1.0 credit gate's state: sessions, sender and receiver links (a sender link's phase, its
delivery in progress, its spool capture), the window arithmetic, and the frames the gate makes
or rewrites (grants, dispositions, renumbered transfers)."""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

from floodwall.control.controller import PolicedQueue, QueueKey
from floodwall.control.policy.model import Policy
from floodwall.enforce import events as ev
from floodwall.enforce.shadow import ShadowHold
from floodwall.enforce.states import (
    DELIVERY_PHASES,
    DETACHING_PHASES,
    LINK_PHASES,
    LINK_RUN_PHASES,
    DeliveryInput,
    DeliveryPhase,
    LinkInput,
    LinkPhase,
    step,
)
from floodwall.wire.amqp10.addresses import (
    Destination,
)
from floodwall.wire.amqp10.credit import (
    MASK,
    DeliveryIds,
    SenderCredit,
    serial_diff,
)
from floodwall.wire.amqp10.errors import DecodeError
from floodwall.wire.amqp10.framing import frame
from floodwall.wire.amqp10.performatives import (
    DISPOSITION,
    ERROR,
    FLOW,
    MESSAGE_PROPERTIES,
    Outcome,
    field_label,
    performative,
    uint_bytes,
)
from floodwall.wire.amqp10.performatives import (
    DispositionFields as D,
)
from floodwall.wire.amqp10.performatives import (
    FlowFields as F,
)
from floodwall.wire.amqp10.performatives import (
    MessageProperties as P,
)
from floodwall.wire.amqp10.types import Described, Symbol, UInt, ULong, decode_value, encode

PROTOCOL: Final = ev.ProtocolName.AMQP10
WINDOW_BYTES: Final = 64 * 1024
"""Message bytes one policed link may have credit for: its share of the overshoot bound
(more for a queue of a large byte capacity: ``policy_window``)."""
MAX_WINDOW: Final = 256
"""Most credit the proxy gives one policed link with a ``WINDOW_BYTES`` window, however small
its messages (messages under ``WINDOW_BYTES / MAX_WINDOW`` bytes count as that many)."""
WINDOW_PARTS: Final = 1024
"""A queue's links may have credit for up to 1 / this of its byte capacity each, when that
is more than ``WINDOW_BYTES`` (``policy_window``): the overshoot bound stays a fixed part of
the capacity per link."""
MAX_WINDOW_BYTES: Final = 1024 * 1024
"""The largest window ``policy_window`` gives (a capacity of 1 GiB and more)."""
MIN_WINDOW: Final = 2
"""Least credit a paced link gets while its queue is not tripped (the floor of pacing)."""
ROOM_WINDOW_BYTES: Final = 512 * 1024
"""The largest window a queue's room and in-flight allowance give a link
(``LinkCredit._room_window``: half the room plus the allowance, shared)."""
ROOM_PARTS: Final = 2
"""The links sharing a queue's room get 1 / this of it between them (``room_window``): what
they have credit for is at most half the room when granted, so their sends reach the trip
point only after the credit they were given runs out, not before."""
PACING_ROOM: Final = 2
"""Windows of room below capacity under which a link's window is paced to the drain rate."""
ASSUMED_MESSAGE_BYTES: Final = 4096
"""Message size assumed before a link or its queue has shown one (window 16)."""
TRANSFER_LIMIT_EXCEEDED: Final = "amqp:link:transfer-limit-exceeded"
RESOURCE_LIMIT_EXCEEDED: Final = "amqp:resource-limit-exceeded"
ACCEPTED: Final = Outcome.ACCEPTED
REJECTED: Final = Outcome.REJECTED
_NO_KEYS: Final[frozenset[QueueKey]] = frozenset()
_DETACHING_PHASES: Final = tuple(DETACHING_PHASES)
_RUN_PHASES: Final = tuple(LINK_RUN_PHASES)
IDLE: Final = DeliveryPhase.IDLE
PROPERTIES: Final = MESSAGE_PROPERTIES
_SMALLEST: Final = WINDOW_BYTES // MAX_WINDOW
FIRST_BODY_SECTION: Final = 0x74  # application-properties and later: no ``to`` after them


def link_ref(channel: int, handle: int) -> int:
    """The int a 1.0 link is known by in the FlowController: session channel << 32 | handle."""
    return channel << 32 | handle


def policy_window(policy: Policy) -> int:
    """The message bytes a link feeding a queue under ``policy`` may have credit for:
    ``WINDOW_BYTES``, or ``capacity / WINDOW_PARTS`` when that is more (at most
    ``MAX_WINDOW_BYTES``). A policy that also limits messages keeps ``WINDOW_BYTES``: its
    window in messages is not scaled."""
    if policy.max_messages is not None:
        return WINDOW_BYTES
    return max(WINDOW_BYTES, min(policy.capacity // WINDOW_PARTS, MAX_WINDOW_BYTES))


def window_for(message_bytes: int, window: int = WINDOW_BYTES) -> int:
    """Credit for one policed link: ``window`` bytes of messages (``policy_window``), at least
    1; messages under ``WINDOW_BYTES / MAX_WINDOW`` (256) bytes count as 256, so a
    ``WINDOW_BYTES`` window is at most ``MAX_WINDOW`` messages."""
    return window // max(message_bytes, _SMALLEST) or 1


def room_window(room_bytes: float, sharers: int) -> int:
    """A link's part of a queue's room (the bytes it may still take before an evaluation
    could trip it): ``min(room, ROOM_WINDOW_BYTES) / (ROOM_PARTS x sharers)``, ``sharers``
    the links given a window from it (``PolicedQueue.room_sharers``); 0 when the room is not
    known (the depth unknown: infinite or NaN) or none is left."""
    if not room_bytes > 0 or room_bytes == math.inf:
        return 0
    return int(min(room_bytes, ROOM_WINDOW_BYTES) // (ROOM_PARTS * max(sharers, 1)))


def paced_window(ceiling: int, share: float | None) -> int:
    """The window of a link whose queue is near capacity: its ``share`` of the messages the
    queue's consumers take in one depth-probe interval (the credit that keeps them busy until
    the next decision: drain rate x probe interval / the connection's links feeding the
    queue), at least ``MIN_WINDOW``, at most ``ceiling`` (``window_for``); the ceiling while
    the drain rate is not known yet."""
    if share is None:
        return ceiling
    return max(min(ceiling, math.ceil(share)), min(MIN_WINDOW, ceiling))


def message_routing(payload: bytes, pos: int, end: int) -> tuple[str | None, str | None] | None:
    """``to`` and ``subject`` of the message whose encoded sections start at ``payload[pos]``.

    None when the bytes end before the properties section does (a long first frame of a
    multi-frame message) or do not decode.
    """
    try:
        while pos < end:
            value, pos = decode_value(payload, pos, end)
            if not isinstance(value, Described) or not isinstance(value.descriptor, ULong):
                return None
            code = int(value.descriptor)
            if code == PROPERTIES:
                fields = value.value if isinstance(value.value, list) else []
                to = fields[P.TO] if len(fields) > P.TO else None
                subject = fields[P.SUBJECT] if len(fields) > P.SUBJECT else None
                return (to if isinstance(to, str) else None,
                        subject if isinstance(subject, str) else None)
            if code >= FIRST_BODY_SECTION:
                return None, None
    except DecodeError:
        return None
    return None


#: The phases in which the proxy waits for a peer's detach (its own, absorbed when it comes).
ANSWERS_AWAITED: Final = frozenset({LinkPhase.DETACHES_DUE, LinkPhase.BROKER_DETACH_DUE,
                                    LinkPhase.CLIENT_DETACH_DUE})
CLIENT_DETACH_AWAITED: Final = frozenset({LinkPhase.DETACHES_DUE, LinkPhase.CLIENT_DETACH_DUE})


@dataclass(slots=True)
class Delivery:
    """The delivery a sender link is in the middle of: its phase (``enforce.states.
    DeliveryPhase``: its first frame decided its fate; IDLE between deliveries), its bytes so
    far, where it lands."""

    phase: DeliveryPhase = DeliveryPhase.IDLE
    bytes: int = 0
    queues: frozenset[str] = frozenset()  # where it lands
    # Lookups (control/lookups.py): the pseudo-queue its destination waits on (per-message
    # links).
    lookup: frozenset[QueueKey] = frozenset()
    message_to: str = ""  # an anonymous link's message: its ``to``
    id_shift: int = 0  # client - broker delivery-id
    tracked_id: int | None = None  # its broker id while counted in flight (``track``)
    held: bool = False  # the gate holds it for its queue (``enforce.amqp10.held``)

    def move(self, event: DeliveryInput) -> None:
        """Take ``event`` (``enforce.states.DELIVERY_PHASES``); one its phase does not take
        leaves it where it is."""
        self.phase = step(DELIVERY_PHASES, self.phase, event) or self.phase


@dataclass(slots=True)
class SpoolCapture:
    """A delivery on its way to a queue's spool: its frames gathered until the last one."""

    key: QueueKey
    address: str  # where it is replayed to: the link's target, or the message's ``to``
    delivery_id: int | None  # its client delivery-id; None: sent settled
    message_format: int
    parts: list[bytes] = field(default_factory=list)
    size: int = 0  # bytes in parts, counted as held (``floodwall.enforce.capture``)


@dataclass(frozen=True, slots=True)
class LinkView:
    """One sender link as ``/state`` shows it: where it sends, whether the proxy caps its
    credit by a window (``window_bytes``: of messages, the window in force; ``window``: that
    in messages at the link's typical size), the credit the client has now (``credit``: what
    the proxy admitted and the client has not used; ``admitted_credit``: of it, what a held
    queue's tokens admitted), its deliveries the broker has not settled, its phase."""

    session: int
    handle: int
    name: str
    address: str | None
    queues: tuple[str, ...]
    phase: str
    windowed: bool
    window_bytes: int | None
    window: int | None
    credit: int
    admitted_credit: int
    broker_credit: int
    unsettled: int
    deliveries: int
    payload_bytes: int

    def as_dict(self) -> dict[str, object]:
        return {f: getattr(self, f) for f in self.__slots__}


@dataclass(eq=False, slots=True)
class SenderLink:
    """A link on which the client sends: its credit as the proxy relays it, its phase
    (``enforce.states.LinkPhase``), the delivery in progress and, when that goes to the
    spool, its capture."""

    channel: int  # the client's session channel
    handle: int  # the client's handle
    name: str
    destination: Destination | None
    anonymous: bool  # null target: every message says where it goes
    credit: SenderCredit
    address: str | None = None  # the target address as attached
    server_handle: int | None = None
    phase: LinkPhase = LinkPhase.OPEN
    delivery: Delivery = field(default_factory=Delivery)
    capture: SpoolCapture | None = None
    hit: set[str] = field(default_factory=set)  # per-message links: queues sent to lately
    deliveries: int = 0
    payload_bytes: int = 0
    starved_since: float | None = None  # withheld and out of credit since (expire's now)
    # Withheld, the credit a held queue's tokens admitted that the client has not used yet
    # (``LinkCredit.channel_admitted``; reserved on the queues' tokens in the controller):
    # its deliveries on it are admitted, not overshoot.
    admitted_credit: int = 0
    # The spool said no, or the link sent a transactional transfer: held by credit until
    # its queue is released.
    spool_refused: bool = False
    # Deliveries forwarded unsettled while the link was windowed, not yet settled by the
    # broker (``SessionGate.in_flight``); the current one's broker id: ``delivery.tracked_id``.
    unsettled: int = 0
    # The policed queues its unsettled deliveries are counted on (``PolicedQueue.in_flight``)
    # and the queue names they were found for.
    in_flight_names: frozenset[str] | None = None
    in_flight_queues: tuple[PolicedQueue, ...] = ()
    in_flight_generation: int = -1  # the routing model's generation they were found at
    # (link, in_flight_queues): the entry each of its unsettled deliveries is kept under.
    in_flight_entry: tuple[SenderLink, tuple[PolicedQueue, ...]] | None = None
    squeezed: bool = False  # its last top-up was cut by what it has unsettled
    windowed: bool = False  # its credit was last capped by a window (``_window``)
    # The routing model's generation its window was last worked out at
    # (``LinkCredit.after_transfer`` skips the window while the client has over half its
    # ceiling and this still holds).
    window_generation: int = -1
    # ... and its queues then, with their rebases summed (a count since may have given them
    # room, and the window more: ``LinkCredit.after_transfer`` works it out again).
    window_queues: tuple[PolicedQueue, ...] = ()
    window_rebases: int = -1
    # Its window in bytes, as last worked out (``_window``): its policy's (``policy_bytes``)
    # or, while its queues have room, its part of the room (``room_window``) when that is more.
    window_bytes: int = WINDOW_BYTES
    # Its policy's window (``policy_window``): what it may hold (``held_bytes``) and be
    # admitted while its queue is held, and what it demands of a held queue.
    policy_bytes: int = WINDOW_BYTES
    not_spooled_reported: bool = False
    # Bytes of its messages the gate holds for their queues, or sends for it, until the
    # broker settles them (``enforce.amqp10.held``): at a window, its credit is withheld.
    held_bytes: int = 0
    shadow: ShadowHold = field(default_factory=ShadowHold)  # its would-be hold (shadow mode)
    # Every message says where it goes: fixed by the attach (read on every transfer).
    per_message: bool = field(init=False)
    # A fixed destination's queues, and the routing model's generation they were read at
    # (``credit.py``'s ``_fixed_queues``: read again when the model or the policies change).
    route: tuple[int, frozenset[str]] | None = None

    def __post_init__(self) -> None:
        destination = self.destination
        self.per_message = self.anonymous or (destination is not None
                                              and destination.per_message)

    @property
    def ref(self) -> int:
        return link_ref(self.channel, self.handle)

    @property
    def typical_bytes(self) -> int:
        return -(-self.payload_bytes // self.deliveries) if self.deliveries else 0

    @property
    def blocked(self) -> bool:
        """Blocked on queues in the controller (its credit withheld)."""
        return self.phase is LinkPhase.WITHHELD

    @property
    def withheld(self) -> bool:
        """The client was told to stop (no more credit) and not yet to go on."""
        return self.phase is LinkPhase.WITHHELD or self.phase is LinkPhase.RELEASED

    @property
    def detaching(self) -> bool:
        """The proxy detached it: its frames are dropped, both peers' detaches absorbed."""
        return self.phase in _DETACHING_PHASES  # (a tuple: an Enum's hash is a Python call)

    @property
    def may_run(self) -> bool:
        """Whether the link's own state lets its next deliveries be booked in a run, with no
        decision each (``enforce.amqp10.runs``; the per-frame path skips the same decisions
        when this holds): open (``LINK_RUN_PHASES``: neither blocked nor detached), between
        deliveries (nothing of one being dropped or captured), to a fixed destination (a
        per-message link routes each message) and not held in shadow (each delivery's
        would-be verdict is recorded). What its queues say (a trip, a backlog, a lookup, the
        room before an evaluation) is asked apart, as it is not the link's."""
        return (self.phase in _RUN_PHASES and self.delivery.phase is IDLE
                and not self.per_message and not self.shadow.on)

    def move(self, event: LinkInput) -> None:
        """Take ``event`` (``enforce.states.LINK_PHASES``); one its phase does not take
        leaves it where it is."""
        self.phase = step(LINK_PHASES, self.phase, event) or self.phase

    def view(self) -> LinkView:
        """The link as ``/state`` shows it (``LinkView``)."""
        credit = self.credit
        windowed = self.windowed
        queues = self.hit if self.per_message else (
            self.route[1] if self.route is not None else frozenset())
        return LinkView(
            self.channel, self.handle, self.name, self.address, tuple(sorted(queues)),
            self.phase.value, windowed, self.window_bytes if windowed else None,
            window_for(self.typical_bytes or ASSUMED_MESSAGE_BYTES, self.window_bytes)
            if windowed else None,
            credit.client_credit, self.admitted_credit, credit.broker_credit, self.unsettled,
            self.deliveries, self.payload_bytes)


@dataclass(eq=False, slots=True)
class ReceiverLink:
    """A link on which the client receives: only counted."""

    handle: int
    name: str
    queue: str | None
    server_handle: int | None = None
    in_delivery: bool = False


Link = SenderLink | ReceiverLink
InFlight = tuple[SenderLink, tuple[PolicedQueue, ...]]
"""An unsettled delivery counted in flight: its link, the queues it is counted on."""


class InFlightRanges:
    """A session's windowed deliveries the broker has not settled yet, as ranges of the
    broker's delivery-ids ``[first, last, entry]`` (``InFlight``: the link, the queues it is
    counted on), in the order they were forwarded. A session's broker ids are consecutive, so a
    sender's run of deliveries is one range however long, and a settlement cuts ranges: booking
    and settling cost per range, not per delivery. Iterating gives each delivery-id."""

    __slots__ = ("ranges",)

    def __init__(self) -> None:
        self.ranges: list[list[Any]] = []  # [first, last, entry]

    def __bool__(self) -> bool:
        return bool(self.ranges)

    def __len__(self) -> int:
        return sum(((last - first) & MASK) + 1 for first, last, _ in self.ranges)

    def __iter__(self) -> Iterator[int]:
        for first, last, _ in self.ranges:
            for i in range(((last - first) & MASK) + 1):
                yield (first + i) & MASK

    def __contains__(self, broker_id: object) -> bool:
        return isinstance(broker_id, int) and self.get(broker_id) is not None

    def get(self, broker_id: int) -> InFlight | None:
        """The entry ``broker_id`` is counted with (None: not in flight). Looked for from the
        newest range: the one asked about is the link's current delivery."""
        for first, last, entry in reversed(self.ranges):
            if serial_diff(broker_id, first) >= 0 and serial_diff(last, broker_id) >= 0:
                return entry  # type: ignore[no-any-return]
        return None

    def add(self, first: int, last: int, entry: InFlight) -> None:
        """Deliveries ``first..last`` are forwarded, counted with ``entry``: the newest range
        grows when they follow it with the same entry."""
        ranges = self.ranges
        if ranges:
            newest = ranges[-1]
            if (newest[1] + 1) & MASK == first and newest[2] is entry:
                newest[1] = last
                return
            if serial_diff(first, newest[1]) <= 0:  # (not after the newest: kept in order)
                base = ranges[0][0]
                at = bisect.bisect_left(ranges, serial_diff(first, base),
                                        key=lambda r: serial_diff(r[0], base))
                ranges.insert(at, [first, last, entry])
                return
        ranges.append([first, last, entry])

    def cut(self, first: int, last: int) -> list[tuple[InFlight, int]]:
        """Take ``first..last`` out (the broker settled them): how many of them each range cut
        held, with its entry."""
        ranges = self.ranges
        if not ranges:
            return []
        base = ranges[0][0]
        lo = serial_diff(first, base)
        hi = lo + serial_diff(last, first)
        if hi < 0 or hi < lo:
            return []
        i = 0 if lo <= 0 else bisect.bisect_left(ranges, lo,
                                                 key=lambda r: serial_diff(r[1], base))
        cut: list[tuple[InFlight, int]] = []
        whole_from = whole_to = -1  # ranges[whole_from:whole_to] are cut whole
        n = len(ranges)
        while i < n:
            r = ranges[i]
            r_lo = serial_diff(r[0], base)
            if r_lo > hi:
                break
            r_hi = serial_diff(r[1], base)
            if lo <= r_lo:
                if r_hi <= hi:
                    cut.append((r[2], r_hi - r_lo + 1))
                    if whole_from < 0:
                        whole_from = i
                    whole_to = i + 1
                else:  # its first part
                    cut.append((r[2], hi - r_lo + 1))
                    r[0] = (base + hi + 1) & MASK
                    break
            elif r_hi <= hi:  # its last part
                cut.append((r[2], r_hi - lo + 1))
                r[1] = (base + lo - 1) & MASK
            else:  # its middle: two ranges left
                cut.append((r[2], hi - lo + 1))
                ranges.insert(i + 1, [(base + hi + 1) & MASK, r[1], r[2]])
                r[1] = (base + lo - 1) & MASK
                break
            i += 1
        if whole_from >= 0:
            del ranges[whole_from:whole_to]
        return cut

    def take_link(self, link: SenderLink) -> list[tuple[InFlight, int]]:
        """Take out every range of ``link``: how many each held, with its entry."""
        taken = [(r[2], ((r[1] - r[0]) & MASK) + 1) for r in self.ranges if r[2][0] is link]
        if taken:
            self.ranges = [r for r in self.ranges if r[2][0] is not link]
        return taken

    def take_all(self) -> list[tuple[InFlight, int]]:
        """Take out every range: how many each held, with its entry."""
        taken = [(r[2], ((r[1] - r[0]) & MASK) + 1) for r in self.ranges]
        self.ranges = []
        return taken


@dataclass(eq=False, slots=True)
class SessionGate:
    """One session: its links by either peer's handle, and the broker's last session fields."""

    channel: int  # the client's channel
    server_channel: int | None = None
    client_next_outgoing: int = 0  # the client's begin: its first transfer-id
    links: dict[int, Link] = field(default_factory=dict)  # by the client's handle
    by_server_handle: dict[int, Link] = field(default_factory=dict)
    attaching: dict[str, Link] = field(default_factory=dict)  # by name, until the broker attaches
    declaring: dict[str, str] = field(default_factory=dict)  # link name -> queue it declares
    # The broker's session fields, as its last begin or flow gave them (for flows we make).
    next_incoming: int | None = None
    incoming_window: int = 0
    next_outgoing: int = 0  # kept current: + each transfer frame the broker sends
    outgoing_window: int = 0
    dropped_frames: int = 0  # client transfer frames the proxy did not forward
    ids: DeliveryIds = field(default_factory=DeliveryIds)  # client vs broker delivery-ids
    # Spooled deliveries to settle once durable: (queue, spool seq, client delivery-id).
    spool_acks: deque[tuple[QueueKey, int, int]] = field(default_factory=deque)
    # Windowed links' deliveries the broker has not settled yet, by the broker's delivery-id:
    # the link and the queues it is counted on.
    in_flight: InFlightRanges = field(default_factory=InFlightRanges)


K = TypeVar("K")


def _typed(fields: list[object], index: int, code: int, kind: type[K]) -> K | None:
    """Field ``index`` of performative ``code`` if it is of wire type ``kind``; None when
    absent; anything else is a ``DecodeError`` naming the field."""
    value = fields[index] if index < len(fields) else None
    if value is None or isinstance(value, kind):
        return value
    raise DecodeError(f"{field_label(code, index)} is {type(value).__name__}, expected "
                      f"{_KIND_NAMES.get(kind, kind.__name__)}")


def _uint(fields: list[object], index: int, code: int) -> int | None:
    """Field ``index`` of performative ``code``: an uint, or None when absent."""
    value = fields[index] if index < len(fields) else None
    if type(value) is UInt:  # per transfer: the common case without a call
        return int(value)
    typed = _typed(fields, index, code, UInt)
    return None if typed is None else int(typed)


def _flag(fields: list[object], index: int, code: int) -> bool:
    """Field ``index`` of performative ``code``: a boolean, False when absent."""
    value = fields[index] if index < len(fields) else None
    if value is True:  # per transfer: the common cases without a call
        return True
    if value is None or value is False:
        return False
    return _typed(fields, index, code, bool) or False


_KIND_NAMES: Final[dict[type, str]] = {bool: "boolean"}


_DETACHING: Final = object()


def _flow_link(links: dict[int, Link], fields: list[object]) -> Link | object | None:
    """The link a flow names among ``links`` (by handle); ``_DETACHING`` for a sender link
    the proxy is detaching (its flows are dropped)."""
    handle = _uint(fields, F.HANDLE, FLOW)
    link = links.get(handle) if handle is not None else None
    return _DETACHING if isinstance(link, SenderLink) and link.detaching else link


def _padded(fields: list[object], size: int) -> list[object]:
    return fields + [None] * (size - len(fields)) if len(fields) < size else list(fields)


_ACCEPTED: Final = Described(ULong(ACCEPTED), [])


def rejected_outcome(description: str) -> Described:
    """The ``rejected`` outcome the proxy settles with: amqp:resource-limit-exceeded."""
    return Described(ULong(REJECTED), [performative(
        ERROR, condition=Symbol(RESOURCE_LIMIT_EXCEEDED), description=description)])


def _range(fields: list[object]) -> tuple[int, int]:
    """A disposition's first..last."""
    first = _uint(fields, D.FIRST, DISPOSITION)
    if first is None:
        raise DecodeError("disposition.first is mandatory")
    last = _uint(fields, D.LAST, DISPOSITION)
    return first, first if last is None else last


def _renumber_disposition(fields: list[object], ids: DeliveryIds,
                          mapped: Callable[[int, int], list[tuple[int, int]]],
                          channel: int) -> bytes | None:
    """A disposition with its range mapped by ``mapped`` (None: unchanged, nothing dropped)."""
    if not ids.dropped:
        return None
    first, last = _range(fields)
    ranges = mapped(first, last)
    if ranges == [(first, last)]:
        return None
    return _dispositions(fields, ranges, channel)


def _dispositions(fields: list[object], ranges: list[tuple[int, int]], channel: int) -> bytes:
    """``fields``' disposition once per range (b"": none left)."""
    out = bytearray()
    for first, last in ranges:
        piece = _padded(fields, D.LAST + 1)
        piece[D.FIRST], piece[D.LAST] = UInt(first), UInt(last)
        out += frame(encode_performative_fields(DISPOSITION, piece), channel)
    return bytes(out)


def grant_flow_body(next_incoming: int | None, incoming_window: int, next_outgoing: int,
                    outgoing_window: int, handle: int, delivery_count: int, link_credit: int,
                    drain: bool) -> bytes:
    """The body of a flow the proxy grants credit with: the bytes ``encode_performative``
    makes of these fields (drain only when set), without its generic encoder.

    Seven or nine small fields always fit a list8.
    """
    fields = [b"\x40" if next_incoming is None else uint_bytes(next_incoming),
              uint_bytes(incoming_window), uint_bytes(next_outgoing),
              uint_bytes(outgoing_window), uint_bytes(handle), uint_bytes(delivery_count),
              uint_bytes(link_credit)]
    if drain:
        fields += (b"\x40", b"\x41")  # available: null; drain: true
    body = b"".join(fields)
    return b"\x00\x53\x13\xc0" + bytes((len(body) + 1, len(fields))) + body


def encode_performative_fields(code: int, fields: list[object]) -> bytes:
    """The body of a performative from its fields as decoded (typed values kept)."""
    while fields and fields[-1] is None:
        fields = fields[:-1]
    return encode(Described(ULong(code), fields))
