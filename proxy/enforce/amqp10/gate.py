"""Per-connection credit gate for AMQP 1.0: the proxy issues the link credit a sender sees.

The 0-9-1 gate (``floodwall.enforce.amqp091.gate``) holds publishes; AMQP 1.0 has a better
lever. For a
client *sender* link whose target routes to a policed queue, the broker's flow frames are
rewritten on their way to the client: the credit the client sees is the broker's grant
capped by a small window (``window_for``, paced to the queue's drain rate near capacity:
``paced_window``) while the queue is under capacity, and no more once it is tripped. The proxy
tops the client up itself as it sends (it never waits for the broker to repeat a grant it
considers current), and sends the flow that restores credit when the ``FlowController``
releases the link. Transfers are never held.

A trip never lowers the limit the client already has (``SenderCredit.grant``: a lower limit
crossing transfers in flight reads as negative credit, which proton-c wraps to about 2^32):
the proxy stops topping up, and what the client still had credit for, at most one window,
is forwarded (the broker's credit allows it: the window is below the broker's grant) and
counted as overshoot (``PolicedQueue.overshoot_*``). Bound, per policed queue:
``overshoot_messages <= sum over the links feeding it of their window``, so at most
``links x WINDOW_BYTES`` of message bytes (windows are at most ``WINDOW_BYTES`` of the
link's typical message).

The depth estimate (a ready count plus the ledger) cannot see messages the broker has taken
off the socket but not yet put in the queue; RabbitMQ's internal flow control can hold
hundreds of them when it is busy. A windowed link's unsettled deliveries therefore count
against its window until the broker settles them (``_track``, ``_broker_settled``): credit
plus unsettled stay within ``IN_FLIGHT_WINDOWS`` windows, which bounds what a broker slow to
enqueue hides from the estimate to ``links x IN_FLIGHT_WINDOWS x WINDOW_BYTES``. Deliveries
sent settled get no disposition and are not counted.

A link without credit for longer than its policy's ``deadline`` (``expire(now)``) gets what a
0-9-1 publisher gets: it is detached with ``amqp:resource-limit-exceeded`` and a description
naming the queue, counted in ``deadline_expiries``. How long each withheld link has had no
credit is in ``/state`` (``FlowController.starved``).

Arithmetic: ``floodwall.wire.amqp10.credit.SenderCredit`` (2.6.7, RFC-1982 serial numbers).
Drain and
echo are relayed with translated counts; session fields are left as the broker sent them
(a flow the proxy makes repeats the broker's last session fields, so the session windows the
client computes do not change).

Links are identified to the ``FlowController`` (which knows "channels") by ``link_ref``: the
client's session channel << 32 | the client's handle, a stable int per link.

Anonymous terminus (null target) and per-message targets (``/exchange/X``, ``/queue``):
credit cannot name one queue. Each message is routed by its ``to`` / ``subject``. Such a
link's credit is always capped by the window when anything is policed (or a policy names
the vhost), as is any link that may come to feed a policed queue (``_may_be_policed``).
A destination the routing model does not know withholds the link's credit until the
broker was asked (``_lookup``: proxy/lookups.py). A message to a
tripped queue is forwarded (it was sent on credit; holding it would reorder the session's
delivery-ids) and the link's credit is then withheld until every queue it hit drains; under
``overflow: reject`` the message is instead settled ``rejected`` with
``amqp:resource-limit-exceeded`` by the proxy and never reaches the broker.

Spool (``overflow: spool`` with ``--spool-dir``): a link whose messages land in exactly one
queue keeps its credit while that queue is tripped, or has spooled backlog (FIFO), and its
transfers go to the queue's spool instead of the broker: the proxy settles each such delivery
``accepted`` once its record is durable (``spool_durable``; at once under ``fsync: never``;
nothing for a delivery sent settled). The replayer (``floodwall.io.spool``) sends the record over
AMQP 1.0 to the same address later. Not spooled: transactional transfers, and anything while
the broker has an alarm or the spool refuses (limits, disk, draining): then the link's credit is
withheld as under ``hold``, and a delivery the spool refused after the proxy took it is settled
``rejected`` (amqp:resource-limit-exceeded) so the client knows it was not stored.

A client that transfers beyond every limit the proxy ever granted gets that link detached
with ``amqp:link:transfer-limit-exceeded`` (the broker's end of the link is detached too, both
replies are absorbed, later transfers on it are dropped).

Deliveries the proxy consumes (rejected, spooled, sent on a link it detached) never reach the
broker, so the two peers' numbering is translated per session: transfer-ids (the
``next-incoming-id`` / ``next-outgoing-id`` of flows on that session are shifted by the
transfer frames dropped) and delivery-ids (``floodwall.wire.amqp10.credit.DeliveryIds``: forwarded
transfers carry the broker's consecutive ids, dispositions are mapped range by range both
ways, and a client disposition that names only consumed deliveries is absorbed).

Receiver links pass untouched; their deliveries from a policed queue are counted in its
ledger (``QueueDepth.delivered``).
"""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from floodwall.control.controller import ALARM, FlowController, QueueKey
from floodwall.control.policy import Fsync, Overflow
from floodwall.ops.logs import event
from floodwall.spool.log import SpoolError
from floodwall.spool.manager import SpoolManager
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp10.addresses import (
    Destination,
    declared_queue,
    parse_target,
    queues_for,
    source_queue,
)
from floodwall.wire.amqp10.credit import (
    DeliveryIds,
    LinkFlow,
    SenderCredit,
    serial_add,
    serial_diff,
)
from floodwall.wire.amqp10.errors import DecodeError
from floodwall.wire.amqp10.framing import frame
from floodwall.wire.amqp10.performatives import (
    DETACH,
    DISPOSITION,
    ERROR,
    FLOW,
    TRANSFER,
    Attach,
    Begin,
    Role,
    encode_performative,
    performative,
    uint_bytes,
)
from floodwall.wire.amqp10.types import Described, Symbol, UInt, ULong, decode_value, encode

log = logging.getLogger("floodwall.flow")

PROTOCOL: Final = "amqp10"
WINDOW_BYTES: Final = 64 * 1024
"""Message bytes one policed link may have credit for: its share of the overshoot bound."""
MAX_WINDOW: Final = 256
"""Most credit the proxy gives one policed link, however small its messages."""
MIN_WINDOW: Final = 2
"""Least credit a paced link gets while its queue is not tripped (the floor of pacing)."""
IN_FLIGHT_WINDOWS: Final = 2
"""A windowed link's credit plus its deliveries the broker has not settled yet stay within
this many windows (see ``_in_flight_window``)."""
PACING_ROOM: Final = 2
"""Windows of room below capacity under which a link's window is paced to the drain rate."""
ASSUMED_MESSAGE_BYTES: Final = 4096
"""Message size assumed before a link or its queue has shown one (window 16)."""
TRANSFER_LIMIT_EXCEEDED: Final = "amqp:link:transfer-limit-exceeded"
RESOURCE_LIMIT_EXCEEDED: Final = "amqp:resource-limit-exceeded"
DEFAULT_DEADLINE: Final = 30.0
"""Seconds a link waits without credit when no policy names one (the broker alarm)."""
ACCEPTED: Final = 0x24
REJECTED: Final = 0x25
TRANSACTIONAL_STATE: Final = 0x34
_NO_KEYS: Final[frozenset[QueueKey]] = frozenset()
PROPERTIES: Final = 0x73
FIRST_BODY_SECTION: Final = 0x74  # application-properties and later: no ``to`` after them


def link_ref(channel: int, handle: int) -> int:
    """The int a 1.0 link is known by in the FlowController: session channel << 32 | handle."""
    return channel << 32 | handle


def window_for(message_bytes: int) -> int:
    """Credit for one policed link: WINDOW_BYTES of messages, at least 1, at most MAX_WINDOW."""
    if message_bytes <= WINDOW_BYTES // MAX_WINDOW:  # sizes up to 256 (and 0): the most
        return MAX_WINDOW
    return WINDOW_BYTES // message_bytes or 1


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
                to = fields[2] if len(fields) > 2 else None
                subject = fields[3] if len(fields) > 3 else None
                return (to if isinstance(to, str) else None,
                        subject if isinstance(subject, str) else None)
            if code >= FIRST_BODY_SECTION:
                return None, None
    except DecodeError:
        return None
    return None


@dataclass(eq=False, slots=True)
class SenderLink:
    """A link on which the client sends: its credit as the proxy relays it."""

    channel: int  # the client's session channel
    handle: int  # the client's handle
    name: str
    destination: Destination | None
    anonymous: bool  # null target: every message says where it goes
    credit: SenderCredit
    address: str | None = None  # the target address as attached
    server_handle: int | None = None
    in_delivery: bool = False
    dropping: bool = False  # the current delivery is being dropped (rejected by the proxy)
    delivery_bytes: int = 0
    delivery_queues: frozenset[str] = frozenset()
    hit: set[str] = field(default_factory=set)  # per-message links: queues sent to lately
    deliveries: int = 0
    payload_bytes: int = 0
    blocked: bool = False
    withheld: bool = False  # no more credit: a queue it feeds is tripped
    starved_since: float | None = None  # withheld and out of credit since (expire's now)
    detaching: bool = False  # the proxy detached it: drop its frames, absorb the replies
    replies_due: set[str] = field(default_factory=set)  # "client", "broker"
    # The delivery in progress goes to this queue's spool (its frames are gathered).
    spool_to: QueueKey | None = None
    spool_parts: list[bytes] = field(default_factory=list)
    spool_address: str = ""
    spool_delivery: int | None = None  # its client delivery-id; None: sent settled
    spool_format: int = 0
    # The spool said no, or the link sent a transactional transfer: held by credit until
    # its queue is released.
    spool_refused: bool = False
    message_to: str = ""  # an anonymous link's current message: its ``to``
    id_shift: int = 0  # client - broker delivery-id of its current delivery
    # Deliveries forwarded unsettled while the link was windowed, not yet settled by the
    # broker (``SessionGate.in_flight``), and the broker's id of the current one.
    unsettled: int = 0
    windowed: bool = False  # its credit was last capped by a window (``_window``)
    tracked_id: int | None = None
    not_spooled_reported: bool = False
    # Lookups (proxy/lookups.py): the pseudo-queue the current delivery's destination waits
    # on (per-message links).
    delivery_lookup: frozenset[QueueKey] = frozenset()
    # Every message says where it goes: fixed by the attach (read on every transfer).
    per_message: bool = field(init=False)

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


@dataclass(eq=False, slots=True)
class ReceiverLink:
    """A link on which the client receives: only counted."""

    handle: int
    name: str
    queue: str | None
    server_handle: int | None = None
    in_delivery: bool = False


Link = SenderLink | ReceiverLink


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
    # Windowed links' deliveries the broker has not settled yet, by the broker's delivery-id.
    in_flight: dict[int, SenderLink] = field(default_factory=dict)


def _uint(fields: list[object], index: int, what: str) -> int | None:
    value = fields[index] if index < len(fields) else None
    if value is None:
        return None
    if not isinstance(value, UInt):
        raise DecodeError(f"{what} is {type(value).__name__}, expected UInt")
    return int(value)


def _flag(fields: list[object], index: int, what: str) -> bool:
    value = fields[index] if index < len(fields) else None
    if value is None:
        return False
    if not isinstance(value, bool):
        raise DecodeError(f"{what} is {type(value).__name__}, expected boolean")
    return value


def _padded(fields: list[object], size: int) -> list[object]:
    return fields + [None] * (size - len(fields)) if len(fields) < size else list(fields)


class CreditFlow:
    """The credit gate of one AMQP 1.0 connection; owned by its ``amqp10.Connection``.

    The core hands it the frames it needs (``on_*``); an ``on_*`` returning bytes means "send
    these instead of the frame" (b"" drops it). ``to_client`` / ``to_server`` append frames the
    proxy makes on its own to the core's output queues; ``notify`` tells the I/O layer about
    output made outside a receive call (a release).

    The I/O layer reads ``holding``, ``held_bytes``, ``over_budget`` and calls ``expire`` as
    it does for 0-9-1's ``PublishFlow``: this gate never holds a message, so they are inert.
    """

    holding: Final = False
    held_bytes: Final = 0
    over_budget: Final = False

    def __init__(self, controller: FlowController, conn_id: int,
                 to_server: Callable[[bytes], None], to_client: Callable[[bytes], None],
                 hold_budget: int = 0, spool: SpoolManager | None = None) -> None:
        self.controller = controller
        self.conn_id = conn_id
        self.spool = spool
        self._to_server = to_server
        self._to_client = to_client
        self.hold_budget = hold_budget
        self.vhost = "/"
        self.sessions: dict[int, SessionGate] = {}  # by the client's channel
        self.by_server_channel: dict[int, SessionGate] = {}
        self.notify: Callable[[], None] = lambda: None
        self.on_declare: Callable[[str, str], None] | None = None  # (vhost, queue)
        # The first delivery the proxy drops: the core starts reading the broker's dispositions.
        self.on_drop: Callable[[], None] = lambda: None
        self.dropping = False
        # The first delivery counted in flight: the core starts reading the broker's
        # dispositions.
        self.on_track: Callable[[], None] = lambda: None
        self.tracking = False
        self.withheld_links: dict[int, SenderLink] = {}  # blocked links by link_ref
        controller.register(self)

    def close(self) -> None:
        self.controller.unregister(self)
        self.sessions.clear()
        self.by_server_channel.clear()

    def expire(self, now: float) -> int:
        """Withheld links: note since when each has had no credit (``now``, the caller's
        clock; a link is seen out of credit at the first call after it ran out) and detach
        those out of credit for longer than their policy's ``deadline`` with
        ``amqp:resource-limit-exceeded``; returns how many were detached."""
        expired = 0
        for link in list(self.withheld_links.values()):
            if link.credit.client_credit > 0 or link.in_delivery:
                continue
            since = link.starved_since
            if since is None:
                link.starved_since = now
                self.controller.starved(self, link.ref, now)
                continue
            deadline = self._deadline(link)
            if now - since < deadline:
                continue
            session = self.sessions.get(link.channel)
            if session is None:
                continue
            expired += 1
            queues = sorted(q for _, q in self.controller.blocked_on(self, link.ref)) \
                or [self.controller.alarm_reason or "?"]
            names = ",".join(queues)
            self.controller.deadline_expiries += 1
            self.controller.emit("deadline", {
                "vhost": self.vhost, "conn": self.conn_id, "channel": link.ref,
                "body_bytes": 0, "waited": round(now - since, 3), "queues": queues})
            why = f"still over capacity after the {deadline:g}s deadline"
            event(log, "publish_refused", logging.WARNING, conn=self.conn_id, channel=link.ref,
                  link=link.name, queues=names, reason=why, waited=round(now - since, 3),
                  answer=RESOURCE_LIMIT_EXCEEDED, protocol=PROTOCOL)
            self._to_server(self._detach_by_proxy(
                session, link, RESOURCE_LIMIT_EXCEEDED,
                f"floodwall: queue '{names}' {why}: no link credit for {now - since:.1f}s"))
        if expired:
            self.notify()
        return expired

    def _deadline(self, link: SenderLink) -> float:
        """The shortest ``deadline`` among the policies of the queues ``link`` waits on."""
        deadlines = [q.policy.deadline for key in self.controller.blocked_on(self, link.ref)
                     if (q := self.controller.queues.get(key)) is not None]
        return min(deadlines, default=DEFAULT_DEADLINE)

    # -- sessions and links -----------------------------------------------------------------
    def client_begin(self, channel: int, begin: Begin) -> None:
        self.sessions[channel] = SessionGate(channel, client_next_outgoing=begin.next_outgoing_id)

    def server_begin(self, channel: int, begin: Begin) -> None:
        if begin.remote_channel is None:
            return
        session = self.sessions.get(begin.remote_channel)
        if session is None:
            return
        session.server_channel = channel
        session.next_incoming = session.client_next_outgoing
        session.incoming_window = begin.incoming_window
        session.next_outgoing = begin.next_outgoing_id
        session.outgoing_window = begin.outgoing_window
        self.by_server_channel[channel] = session

    def client_end(self, channel: int) -> None:
        session = self.sessions.pop(channel, None)
        if session is None:
            return
        for link in session.links.values():
            self._link_gone(link)
        if session.server_channel is not None:
            self.by_server_channel.pop(session.server_channel, None)

    def server_end(self, channel: int) -> None:
        session = self.by_server_channel.get(channel)
        if session is not None:
            session.by_server_handle.clear()

    def client_attach(self, channel: int, attach: Attach) -> None:
        session = self.sessions.get(channel)
        if session is None:
            return
        link: Link
        if attach.role is Role.SENDER:
            if attach.coordinator:
                return  # transactions: not a node, nothing to police
            address = attach.target_address
            initial = attach.initial_delivery_count or 0
            link = SenderLink(channel, attach.handle, attach.name,
                              None if address is None else parse_target(address),
                              address is None, SenderCredit(initial), address)
        else:
            link = ReceiverLink(attach.handle, attach.name, source_queue(attach.source_address))
        session.links[attach.handle] = link
        session.attaching[attach.name] = link
        address = attach.target_address if attach.role is Role.SENDER else attach.source_address
        declared = declared_queue(address)
        if declared is not None and self.on_declare is not None:
            session.declaring[attach.name] = declared

    def server_attach(self, channel: int, attach: Attach) -> None:
        session = self.by_server_channel.get(channel)
        if session is None:
            return
        declared = session.declaring.pop(attach.name, None)
        answered = attach.source_address if attach.role is Role.SENDER else attach.target_address
        if declared is not None and answered is not None and self.on_declare is not None:
            self.on_declare(self.vhost, declared)  # the broker declared it for the link
        link = session.attaching.pop(attach.name, None)
        if link is None:
            return
        link.server_handle = attach.handle
        session.by_server_handle[attach.handle] = link

    def client_detach(self, channel: int, handle: int) -> bytes | None:
        session = self.sessions.get(channel)
        link = session.links.get(handle) if session is not None else None
        if session is None or link is None:
            return None
        if isinstance(link, SenderLink) and link.detaching and "client" in link.replies_due:
            link.replies_due.discard("client")  # the answer to the detach the proxy sent
            self._forget(session, link)
            return b""
        self._forget(session, link)
        return None

    def server_detach(self, channel: int, handle: int) -> bytes | None:
        session = self.by_server_channel.get(channel)
        link = session.by_server_handle.get(handle) if session is not None else None
        if session is None or link is None:
            return None
        session.by_server_handle.pop(handle, None)
        if isinstance(link, SenderLink) and link.detaching:
            link.replies_due.discard("broker")
            self._forget(session, link)
            return b""
        return None

    def _forget(self, session: SessionGate, link: Link) -> None:
        """Forget the link once neither peer will speak of it again."""
        if isinstance(link, SenderLink) and link.replies_due:
            return
        if session.links.get(link.handle) is link:
            del session.links[link.handle]
        if session.attaching.get(link.name) is link:
            del session.attaching[link.name]
        if isinstance(link, SenderLink) and link.unsettled:
            for broker_id in [i for i, lk in session.in_flight.items() if lk is link]:
                del session.in_flight[broker_id]
            link.unsettled = 0
        self._link_gone(link)

    def _link_gone(self, link: Link) -> None:
        if isinstance(link, SenderLink) and link.blocked:
            link.blocked = False
            self.withheld_links.pop(link.ref, None)
            self.controller.channel_closed(self, link.ref)

    # -- flow frames -----------------------------------------------------------------------
    def on_client_flow(self, channel: int, fields: list[object]) -> bytes | None:
        session = self.sessions.get(channel)
        if session is None:
            return None
        handle = _uint(fields, 4, "flow.handle")
        link = session.links.get(handle) if handle is not None else None
        changed = False
        if isinstance(link, SenderLink):
            if link.detaching:
                return b""
            sent = LinkFlow(_uint(fields, 5, "flow.delivery-count"),
                            _uint(fields, 6, "flow.link-credit") or 0,
                            _flag(fields, 8, "flow.drain"), _flag(fields, 9, "flow.echo"))
            offset = link.credit.offset
            out = link.credit.client_flow(sent)
            if out.delivery_count != sent.delivery_count or out.link_credit != sent.link_credit \
                    or offset != link.credit.offset:
                fields = _padded(fields, 7)
                fields[5] = None if out.delivery_count is None else UInt(out.delivery_count)
                fields[6] = UInt(out.link_credit)
                changed = True
        if session.dropped_frames:
            next_outgoing = _uint(fields, 2, "flow.next-outgoing-id")
            if next_outgoing is not None:
                fields = _padded(fields, 4)
                fields[2] = UInt(serial_add(next_outgoing, -session.dropped_frames))
                changed = True
        if not changed:
            return None
        return frame(encode_performative_fields(FLOW, fields), channel)

    def on_server_flow(self, channel: int, fields: list[object]) -> bytes | None:
        session = self.by_server_channel.get(channel)
        if session is None:
            return None
        next_incoming = _uint(fields, 0, "flow.next-incoming-id")
        session.next_incoming = next_incoming
        session.incoming_window = _uint(fields, 1, "flow.incoming-window") or 0
        session.next_outgoing = _uint(fields, 2, "flow.next-outgoing-id") or 0
        session.outgoing_window = _uint(fields, 3, "flow.outgoing-window") or 0
        handle = _uint(fields, 4, "flow.handle")
        link = session.by_server_handle.get(handle) if handle is not None else None
        changed = False
        if isinstance(link, SenderLink):
            if link.detaching:
                return b""
            credit = link.credit
            credit.broker_flow(LinkFlow(_uint(fields, 5, "flow.delivery-count"),
                                        _uint(fields, 6, "flow.link-credit") or 0,
                                        _flag(fields, 8, "flow.drain")))
            window = self._window(link)
            link.windowed = window is not None
            if window is None and credit.offset == 0 and not link.withheld and (
                    link.per_message or not self._lookup(link.destination, self._queues(link))):
                credit.grant(None)  # the broker's own words: pass them as they are
            else:
                grant = self._decide(link, window)
                fields = _padded(fields, 9)
                fields[5] = UInt(grant.delivery_count or 0)
                fields[6] = UInt(grant.link_credit)
                changed = True
        if session.dropped_frames and next_incoming is not None:
            fields = _padded(fields, 4)
            fields[0] = UInt(serial_add(next_incoming, session.dropped_frames))
            changed = True
        if not changed:
            return None
        return frame(encode_performative_fields(FLOW, fields), channel)

    # -- transfers ---------------------------------------------------------------------------
    def on_client_transfer(self, channel: int, fields: list[object], payload: bytes,
                           start: int, end: int) -> bytes | None:
        session = self.sessions.get(channel)
        if session is None:
            return None
        handle = _uint(fields, 0, "transfer.handle")
        link = session.links.get(handle) if handle is not None else None
        if not isinstance(link, SenderLink):  # a transaction coordinator's, say
            return self._renumbered(session.ids.dropped, fields, payload, start, end, channel)
        if link.detaching:
            session.dropped_frames += 1
            if not link.in_delivery:
                self._drop_delivery(session, fields)
            link.in_delivery = _flag(fields, 5, "transfer.more")
            return b""
        count = len(fields)  # most transfers end before more (5) and aborted (9)
        more = count > 5 and _flag(fields, 5, "transfer.more")
        aborted = count > 9 and _flag(fields, 9, "transfer.aborted")
        first = not link.in_delivery
        replacement: bytes | None = None
        if first:
            if not link.credit.transfer():
                session.dropped_frames += 1
                self._drop_delivery(session, fields)
                return self._transfer_limit_exceeded(session, link)
            link.delivery_bytes = 0
            link.dropping = False
            queues = link.delivery_queues = self._route(link, payload, start, end)
            if link.per_message or self.spool is not None:
                blocking = self.controller.blocking(self.vhost, queues)
                if blocking:
                    self._consume(session, link, fields, blocking)
            # The broker numbers this delivery by the drops before it, also if one happens
            # on another link between its frames (a continuation may repeat its id).
            link.id_shift = session.ids.dropped
        link.in_delivery = more and not aborted
        if link.dropping:
            session.dropped_frames += 1
            replacement = b""
            if link.spool_to is not None:
                if aborted:  # the client gave up on it: nothing to store or settle
                    link.spool_to = None
                    link.spool_parts = []
                else:
                    link.spool_parts.append(payload[start:end])
                    if not more:
                        self._spool(session, link)
        else:
            link.delivery_bytes += end - start
            if link.id_shift:
                replacement = self._renumbered(link.id_shift, fields, payload, start, end,
                                               channel)
            if first and link.windowed and not (count > 4 and _flag(fields, 4,
                                                                     "transfer.settled")):
                self._track(session, link, fields)
            elif aborted and link.tracked_id is not None:  # the broker will not settle it
                self._untrack(session, link)
        if not link.in_delivery:
            if not link.dropping and not aborted:
                link.deliveries += 1
                link.payload_bytes += link.delivery_bytes
                if self.controller.tripped:  # sent on credit granted before a trip
                    self._overshoot(link.delivery_queues, link.delivery_bytes)
                self.controller.forwarded(self.vhost, link.delivery_queues, link.delivery_bytes)
                if link.per_message and self.controller.queues:
                    link.hit.update(q for q in link.delivery_queues
                                    if (self.vhost, q) in self.controller.queues)
            link.dropping = False
        if first or not link.in_delivery:
            # A fixed destination's queues were routed just now for a first frame: the same.
            self._after_transfer(link, link.delivery_queues if first else None)
        return replacement

    def _track(self, session: SessionGate, link: SenderLink, fields: list[object]) -> None:
        """Count a forwarded unsettled delivery of a windowed link until the broker settles
        it: what the broker has not settled may not be in its queue yet (RabbitMQ's internal
        flow control can hold hundreds of messages between the socket and the queue, and a
        ready count does not see them), so it counts against the link's window."""
        delivery_id = _uint(fields, 1, "transfer.delivery-id")
        if delivery_id is None:
            return
        broker_id = serial_add(delivery_id, -link.id_shift) if link.id_shift else delivery_id
        session.in_flight[broker_id] = link
        link.tracked_id = broker_id
        link.unsettled += 1
        if not self.tracking:
            self.tracking = True
            self.on_track()

    def _untrack(self, session: SessionGate, link: SenderLink) -> None:
        if session.in_flight.pop(link.tracked_id, None) is link:  # type: ignore[arg-type]
            link.unsettled -= 1
        link.tracked_id = None

    def _broker_settled(self, session: SessionGate, first: int, last: int) -> None:
        """The broker settled deliveries ``first``..``last`` (its ids): their links' windows
        have room again."""
        in_flight = session.in_flight
        span = serial_diff(last, first) + 1
        settled: list[SenderLink] = []
        if span <= 2 * len(in_flight):
            ids = [serial_add(first, i) for i in range(span)]
        else:
            ids = [i for i in in_flight if 0 <= serial_diff(i, first) < span]
        for broker_id in ids:
            link = in_flight.pop(broker_id, None)
            if link is not None:
                link.unsettled -= 1
                if link.tracked_id == broker_id:
                    link.tracked_id = None
                settled.append(link)
        for link in set(settled):
            if not link.detaching and not link.in_delivery:
                self._after_transfer(link)

    def _in_flight_window(self, link: SenderLink, window: int) -> int:
        """The credit a windowed link may have: its window, less what it has unsettled at the
        broker beyond ``IN_FLIGHT_WINDOWS - 1`` windows. Credit plus unsettled deliveries
        stay within ``IN_FLIGHT_WINDOWS x window``, so a broker slow to enqueue cannot have
        more than that of the link's messages out of the proxy's sight."""
        room = IN_FLIGHT_WINDOWS * window - link.unsettled
        return window if room >= window else max(room, 0)

    def _consume(self, session: SessionGate, link: SenderLink, fields: list[object],
                 blocking: frozenset[QueueKey]) -> None:
        """A delivery's first frame, to a tripped (or backlogged) queue: refuse it under
        ``overflow: reject`` (per-message links), spool it under ``overflow: spool``, else
        let it through (it was sent on credit; the link's credit is withheld after it)."""
        if link.per_message and self._overflow(blocking) is Overflow.REJECT:
            link.dropping = True
            link.credit.dropped()
            self._drop_delivery(session, fields)
            self._reject(session, link, fields, blocking)
            return
        key = self._spool_key(link, link.delivery_queues, blocking)
        if key is None:
            return
        if len(fields) > 7 and isinstance(fields[7], Described) \
                and fields[7].descriptor == TRANSACTIONAL_STATE:
            link.spool_refused = True  # so its credit is withheld after this one
            if not link.not_spooled_reported:
                link.not_spooled_reported = True
                event(log, "publish_not_spooled", conn=self.conn_id, channel=link.ref,
                      link=link.name, queue=key[1], reason="transactional transfer",
                      action="held by credit", protocol=PROTOCOL)
            return
        delivery_id = _uint(fields, 1, "transfer.delivery-id")
        link.dropping = True
        link.spool_to = key
        link.spool_parts = []
        link.spool_delivery = None if _flag(fields, 4, "transfer.settled") else delivery_id
        link.spool_format = _uint(fields, 3, "transfer.message-format") or 0
        link.spool_address = link.message_to if link.anonymous else (link.address or "")
        link.credit.dropped()
        self._drop_delivery(session, fields)

    def _renumbered(self, shift: int, fields: list[object], payload: bytes, start: int,
                    end: int, channel: int) -> bytes | None:
        """A forwarded transfer with the broker's delivery-id, its client id less ``shift``
        (None: unchanged)."""
        if not shift or len(fields) < 2 or fields[1] is None:
            return None
        delivery_id = _uint(fields, 1, "transfer.delivery-id")
        assert delivery_id is not None
        fields = list(fields)
        fields[1] = UInt(serial_add(delivery_id, -shift))
        return frame(encode_performative_fields(TRANSFER, fields) + payload[start:end], channel)

    def on_server_transfer(self, channel: int, fields: list[object]) -> None:
        """A transfer from the broker: the session's transfer-id, a counted delivery."""
        session = self.by_server_channel.get(channel)
        if session is None:
            return
        session.next_outgoing = serial_add(session.next_outgoing, 1)
        handle = _uint(fields, 0, "transfer.handle")
        link = session.by_server_handle.get(handle) if handle is not None else None
        if not isinstance(link, ReceiverLink) or link.queue is None:
            return
        if not link.in_delivery:
            q = self.controller.queues.get((self.vhost, link.queue))
            if q is not None:
                q.depth.delivered()
        link.in_delivery = _flag(fields, 5, "transfer.more") and not _flag(
            fields, 9, "transfer.aborted")

    def _drop_delivery(self, session: SessionGate, fields: list[object]) -> None:
        """The delivery whose first frame this is will not reach the broker: renumber."""
        delivery_id = _uint(fields, 1, "transfer.delivery-id")
        if delivery_id is None:
            raise DecodeError("transfer.delivery-id is mandatory on a delivery's first frame")
        session.ids.drop(delivery_id)
        if not self.dropping:
            self.dropping = True
            self.on_drop()

    def on_server_disposition(self, channel: int, fields: list[object]) -> bytes | None:
        """The broker settles the client's deliveries (role receiver): its delivery-ids are
        mapped to the client's, skipping those the proxy consumed."""
        session = self.by_server_channel.get(channel)
        if session is None or not fields or fields[0] is not True:
            return None
        if session.in_flight:
            first, last = _range(fields)
            self._broker_settled(session, first, last)
        return _renumber_disposition(fields, session.ids, session.ids.client_ranges, channel)

    def on_client_disposition(self, channel: int, fields: list[object]) -> bytes | None:
        """The client settles its own deliveries (role sender): mapped to the broker's ids;
        those the proxy consumed (and settled itself) are left out."""
        session = self.sessions.get(channel)
        if session is None or not fields or fields[0] is not False:
            return None
        return _renumber_disposition(fields, session.ids, session.ids.broker_ranges, channel)

    # -- spool -------------------------------------------------------------------------------
    def _spool_key(self, link: SenderLink, queues: frozenset[str],
                   blocking: frozenset[QueueKey]) -> QueueKey | None:
        """The queue whose spool takes ``link``'s messages now, or None (credit decides).

        Spooled: messages that land in exactly one queue whose policy says ``spool``, while it
        is tripped or has spooled backlog, the broker has no alarm and the spool accepts.
        """
        spool = self.spool
        if spool is None or not spool.accepting or len(queues) != 1 or ALARM in blocking \
                or link.spool_refused:
            return None
        key = (self.vhost, next(iter(queues)))
        if key not in blocking:
            return None
        q = self.controller.queues.get(key)
        if q is None or q.policy.overflow is not Overflow.SPOOL:
            return None
        return key

    def _spool(self, session: SessionGate, link: SenderLink) -> None:
        """The last frame of a delivery to spool is in: write the record."""
        key = link.spool_to
        assert key is not None and self.spool is not None
        message = b"".join(link.spool_parts)
        link.spool_to = None
        link.spool_parts = []
        q = self.controller.queues.get(key)
        settings = q.policy.spool if q is not None else None
        record = SpoolRecord.amqp10_message(0, time.time(), link.spool_address,
                                            link.spool_format, message)
        delivery_id = link.spool_delivery
        try:
            seq = self.spool.append(key, record, settings.max_bytes if settings else 1 << 30)
        except SpoolError as exc:
            self.controller.spool_fallbacks += 1
            link.spool_refused = True
            event(log, "spool_refused", logging.WARNING, conn=self.conn_id, channel=link.ref,
                  link=link.name, queue=key[1], reason=str(exc),
                  action="rejected; the link's credit is withheld until the queue drains",
                  protocol=PROTOCOL)
            if delivery_id is not None:
                self._settle(session, delivery_id, delivery_id, _rejected(
                    f"floodwall: the spool of queue '{key[1]}' refused the message ({exc})"))
            return
        self.controller.spooled_records += 1
        self.controller.spooled_bytes += record.size
        if delivery_id is None:
            return
        if settings is not None and settings.fsync is Fsync.NEVER:
            self._settle(session, delivery_id, delivery_id, _ACCEPTED)
        else:
            session.spool_acks.append((key, seq, delivery_id))

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: settle ``accepted`` the spooled deliveries now durable."""
        sent = False
        for session in self.sessions.values():
            acks = session.spool_acks
            first = last = -1
            while acks:
                key, seq, delivery_id = acks[0]
                if durable.get(key, 0) < seq:
                    break
                acks.popleft()
                if first >= 0 and delivery_id == serial_add(last, 1):
                    last = delivery_id
                    continue
                if first >= 0:
                    self._settle(session, first, last, _ACCEPTED)
                first = last = delivery_id
            if first >= 0:
                self._settle(session, first, last, _ACCEPTED)
                sent = True
        if sent:
            self.notify()

    def _settle(self, session: SessionGate, first: int, last: int, state: Described) -> None:
        """Settle the client's deliveries ``first..last`` with ``state``, as the receiver."""
        if session.server_channel is None:
            return
        self._to_client(frame(encode_performative(
            DISPOSITION, role=True, first=UInt(first),
            last=None if last == first else UInt(last), settled=True, state=state),
            session.server_channel))

    # -- decisions ---------------------------------------------------------------------------
    def _queues(self, link: SenderLink) -> frozenset[str]:
        """The queues the link's messages land in (per-message links: those it hit lately)."""
        if link.per_message:
            return frozenset(link.hit)
        return queues_for(self.controller, self.vhost, link.destination)

    def _route(self, link: SenderLink, payload: bytes, start: int, end: int) -> frozenset[str]:
        if not link.per_message:
            return queues_for(self.controller, self.vhost, link.destination)
        if not self.controller.queues and not self.controller.polices_vhost(self.vhost):
            return frozenset()
        found = message_routing(payload, start, end)
        if found is None:
            return frozenset()
        to, subject = found
        destination = link.destination
        if link.anonymous:
            destination = parse_target(to) if to else None
            link.message_to = to or ""
        queues = queues_for(self.controller, self.vhost, destination, subject)
        link.delivery_lookup = self._lookup(destination, queues, subject)
        return queues

    def _lookup(self, destination: Destination | None, queues: frozenset[str],
                subject: str | None = None) -> frozenset[QueueKey]:
        """The lookup pseudo-queue to withhold credit on until the broker was asked about
        a destination the model does not know (``FlowController.lookup_for``), or none."""
        if destination is None:
            return _NO_KEYS
        key = destination.routing_key if destination.routing_key is not None else subject
        if key is None:
            return _NO_KEYS
        pending = self.controller.lookup_for(self.vhost, destination.exchange, key, queues)
        return _NO_KEYS if pending is None else frozenset((pending,))

    def _policed(self, link: SenderLink,
                 names: frozenset[str] | None = None) -> frozenset[QueueKey]:
        """The policed queues among ``names`` (None: ``_queues(link)``)."""
        queues = self.controller.queues
        if not queues:
            return _NO_KEYS
        if names is None:
            names = self._queues(link)
        return self.controller.policed(self.vhost, names)

    def _window(self, link: SenderLink, names: frozenset[str] | None = None) -> int | None:
        """The link's credit cap, or None when nothing it sends to is policed.

        ``names``: ``_queues(link)`` when the caller has just computed it.
        """
        policed = self._policed(link, names)
        if not policed and not self._may_be_policed(link):
            return None
        queues = self.controller.queues
        size = link.typical_bytes
        if not size:
            size = max((queues[k].depth.average_body_bytes() for k in policed),
                       default=0) or ASSUMED_MESSAGE_BYTES
        window = ceiling = window_for(size)
        room = PACING_ROOM * ceiling * size
        for key in policed:
            q = queues[key]
            # Bytes the queue may still take before its next evaluation could trip it (the
            # armed headroom less the ledger; -1 - total when unarmed: pace).
            if q.quiet_bytes - q.depth.forwarded_bytes_total > room:
                continue
            depth = q.depth
            drain = depth.drain_rate
            interval = depth.sample_interval
            share = None
            if drain is not None and interval is not None:
                share = drain * interval / self._feeders(key[1])
            window = min(window, paced_window(ceiling, share))
        return window

    def _feeders(self, queue: str) -> int:
        """This connection's sender links whose last message went to ``queue`` (at least 1):
        they share the queue's drain. Counted only near capacity (a scan of the links)."""
        n = 0
        for session in self.sessions.values():
            for link in session.links.values():
                if isinstance(link, SenderLink) and not link.detaching \
                        and queue in link.delivery_queues:
                    n += 1
        return n or 1

    def _overshoot(self, names: frozenset[str], body_bytes: int) -> None:
        """A delivery to ``names`` forwarded while some of them are tripped: count it on each."""
        queues = self.controller.queues
        for key in self.controller.blocking(self.vhost, names):
            q = queues.get(key)
            if q is not None and q.tripped:
                q.overshoot_messages += 1
                q.overshoot_bytes += body_bytes

    def _may_be_policed(self, link: SenderLink) -> bool:
        """Whether the link can come to feed a policed queue at any moment, with nothing
        sent through the proxy: a binding made elsewhere to its exchange, a queue a policy
        matches declared elsewhere. Its credit is capped by the window too, so what it holds
        when that happens is one window, not the broker's whole grant."""
        controller = self.controller
        if link.per_message:
            return bool(controller.queues) or controller.polices_vhost(self.vhost)
        destination = link.destination
        if destination is None or destination.routing_key is None:
            return False
        if destination.exchange:
            return controller.polices_vhost(self.vhost)
        return controller.policies.for_queue(self.vhost, destination.routing_key) is not None

    def _decide(self, link: SenderLink, window: int | None) -> LinkFlow:
        """The credit to give the client now: withheld while a queue it feeds is tripped."""
        queues = self._queues(link)
        blocking = self.controller.blocking(self.vhost, queues)
        if not link.per_message:
            blocking |= self._lookup(link.destination, queues)
        if blocking and self._spool_key(link, queues, blocking) is None \
                and self._block(link, blocking):
            link.withheld = True
            return link.credit.grant(0)
        if link.withheld:
            link.withheld = False
            self._signalled(link, active=True)
        if window is not None and link.unsettled:
            window = self._in_flight_window(link, window)
        return link.credit.grant(window)

    def _after_transfer(self, link: SenderLink, routed: frozenset[str] | None = None) -> None:
        """After a client transfer: withhold credit if a queue tripped, else top it up.

        A per-message link under ``overflow: reject`` keeps its credit: what it sends to the
        tripped queue is refused one by one, what it sends elsewhere goes on. ``routed``: the
        fixed destination's queues, when the caller has just routed them (``_queues(link)``).
        """
        if link.blocked:
            return
        fixed: frozenset[str] | None = None
        if link.per_message:
            queues = link.delivery_queues
            lookups = link.delivery_lookup
        else:
            queues = fixed = routed if routed is not None else self._queues(link)
            lookups = _NO_KEYS
        blocking = self.controller.blocking(self.vhost, queues)
        if lookups:
            blocking |= lookups
        if blocking and not (link.per_message and self._overflow(blocking) is Overflow.REJECT
                             and not lookups) \
                and self._spool_key(link, queues, blocking) is None:
            if self._block(link, blocking):
                link.withheld = True  # no flow: the limit the client has stands (grant)
            return
        window = self._window(link, fixed)
        link.windowed = window is not None
        if window is None:
            return
        if link.unsettled:
            window = self._in_flight_window(link, window)
            if not window:
                return
        if link.credit.wants_top_up(window):
            self._send_grant(link, link.credit.grant(window))

    def _block(self, link: SenderLink, blocking: frozenset[QueueKey]) -> bool:
        """Block the link on ``blocking``; False when they all released meanwhile."""
        if link.blocked:
            return True
        newly = self.controller.block(self, link.ref, blocking)
        if not newly and not self.controller.is_blocked(self, link.ref):
            return False
        link.blocked = True
        link.starved_since = None
        self.withheld_links[link.ref] = link
        names = ",".join(q for _, q in sorted(blocking))
        event(log, "publisher_held", logging.INFO, conn=self.conn_id, channel=link.ref,
              session=link.channel, handle=link.handle, link=link.name, vhost=self.vhost,
              queues=names, signalled=True, protocol=PROTOCOL)
        self.controller.emit("hold", {"vhost": self.vhost, "conn": self.conn_id,
                                      "channel": link.ref,
                                      "queues": [k[1] for k in blocking if k != ALARM]})
        self._signalled(link, active=False)
        return True

    def _signalled(self, link: SenderLink, active: bool) -> None:
        self.controller.signalled(PROTOCOL, active)
        event(log, "publisher_signalled", conn=self.conn_id, channel=link.ref, link=link.name,
              active=active, protocol=PROTOCOL)
        self.controller.emit("signal", {"vhost": self.vhost, "conn": self.conn_id,
                                        "channel": link.ref, "active": active})

    def _overflow(self, blocking: frozenset[QueueKey]) -> Overflow:
        """What the strictest policy among ``blocking`` says: reject wins."""
        overflow = Overflow.HOLD
        for key in blocking:
            q = self.controller.queues.get(key)
            if q is not None and q.policy.effective_overflow is Overflow.REJECT:
                return Overflow.REJECT
        return overflow

    def channel_released(self, channel: int) -> None:
        """The controller: every queue link ``channel`` (a link_ref) waited on has drained."""
        session = self.sessions.get(channel >> 32)
        link = session.links.get(channel & 0xFFFFFFFF) if session is not None else None
        if not isinstance(link, SenderLink) or link.detaching:
            return
        link.blocked = False
        link.starved_since = None
        self.withheld_links.pop(link.ref, None)
        link.spool_refused = False
        link.hit.clear()
        window = self._window(link)
        grant = self._decide(link, window)
        if not link.blocked:
            self._send_grant(link, grant)
        self.notify()

    # -- frames the proxy makes --------------------------------------------------------------
    def _send_grant(self, link: SenderLink, grant: LinkFlow) -> None:
        """A flow to the client for ``link``, with the broker's last session fields."""
        session = self.sessions.get(link.channel)
        if session is None or session.server_channel is None or link.server_handle is None:
            return
        next_incoming = session.next_incoming
        if next_incoming is not None and session.dropped_frames:
            next_incoming = serial_add(next_incoming, session.dropped_frames)
        self._to_client(frame(grant_flow_body(
            next_incoming, session.incoming_window, session.next_outgoing,
            session.outgoing_window, link.server_handle, grant.delivery_count or 0,
            grant.link_credit, grant.drain), session.server_channel))

    def _transfer_limit_exceeded(self, session: SessionGate, link: SenderLink) -> bytes:
        """Detach the link on both sides; the broker's detach replaces the transfer."""
        return self._detach_by_proxy(session, link, TRANSFER_LIMIT_EXCEEDED,
                                     "floodwall: transfer beyond the granted link credit")

    def _detach_by_proxy(self, session: SessionGate, link: SenderLink, condition: str,
                         description: str) -> bytes:
        """Detach ``link`` on both sides: the client's detach is queued, the broker's returned.

        Later frames of the link are dropped, both peers' answering detaches absorbed."""
        link.detaching = True
        link.in_delivery = False
        self._link_gone(link)
        event(log, "link_detached_by_proxy", logging.WARNING, conn=self.conn_id,
              channel=link.ref, link=link.name, condition=condition, reason=description,
              protocol=PROTOCOL)
        error = performative(ERROR, condition=Symbol(condition), description=description)
        if session.server_channel is not None and link.server_handle is not None:
            link.replies_due.add("client")
            self._to_client(frame(encode_performative(
                DETACH, handle=UInt(link.server_handle), closed=True, error=error),
                session.server_channel))
        link.replies_due.add("broker")
        return frame(encode_performative(DETACH, handle=UInt(link.handle), closed=True,
                                         error=error), link.channel)

    def _reject(self, session: SessionGate, link: SenderLink, fields: list[object],
                blocking: frozenset[QueueKey]) -> None:
        """Settle the delivery ``rejected`` ourselves (it will not reach the broker)."""
        self.controller.rejects += 1
        names = ",".join(q for _, q in sorted(blocking))
        event(log, "publish_refused", logging.WARNING, conn=self.conn_id, channel=link.ref,
              link=link.name, queues=names, reason="over capacity (overflow: reject)",
              answer="rejected", protocol=PROTOCOL)
        self.controller.emit("reject", {"vhost": self.vhost, "conn": self.conn_id,
                                        "channel": link.ref, "body_bytes": 0,
                                        "queues": [k[1] for k in blocking if k != ALARM]})
        delivery_id = _uint(fields, 1, "transfer.delivery-id")
        if _flag(fields, 4, "transfer.settled") or delivery_id is None:
            return
        self._settle(session, delivery_id, delivery_id,
                     _rejected(f"floodwall: queue '{names}' is over capacity"))


_ACCEPTED: Final = Described(ULong(ACCEPTED), [])


def _rejected(description: str) -> Described:
    """The ``rejected`` outcome the proxy settles with: amqp:resource-limit-exceeded."""
    return Described(ULong(REJECTED), [performative(
        ERROR, condition=Symbol(RESOURCE_LIMIT_EXCEEDED), description=description)])


def _range(fields: list[object]) -> tuple[int, int]:
    """A disposition's first..last."""
    first = _uint(fields, 1, "disposition.first")
    if first is None:
        raise DecodeError("disposition.first is mandatory")
    last = _uint(fields, 2, "disposition.last")
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
        piece = _padded(fields, 3)
        piece[1], piece[2] = UInt(first), UInt(last)
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
