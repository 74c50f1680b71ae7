"""Per-connection credit gate for AMQP 1.0: the proxy issues the link credit a sender sees.

The 0-9-1 gate (``proxy.amqp091.flow``) holds publishes; AMQP 1.0 has a better lever. For a
client *sender* link whose target routes to a policed queue, the broker's flow frames are
rewritten on their way to the client: the credit the client sees is the broker's grant
capped by a small window (``window_for``) while the queue is under capacity, and zero once it
is tripped. The proxy tops the client up itself as it sends (it never waits for the broker to
repeat a grant it considers current), and sends the flow that restores credit when the
``FlowController`` releases the link. Transfers are never held: a client only ever sends
what it had credit for, and that is at most one window per link, which bounds the overshoot.

Arithmetic: ``proxy.amqp10.credit.SenderCredit`` (2.6.7, RFC-1982 serial numbers). Drain and
echo are relayed with translated counts; session fields are left as the broker sent them
(a flow the proxy makes repeats the broker's last session fields, so the session windows the
client computes do not change).

Links are identified to the ``FlowController`` (which knows "channels") by ``link_ref``: the
client's session channel << 32 | the client's handle, a stable int per link.

Anonymous terminus (null target) and per-message targets (``/exchange/X``, ``/queue``):
credit cannot name one queue. Each message is routed by its ``to`` / ``subject``. Such a
link's credit is always capped by the window when anything is policed. A message to a
tripped queue is forwarded (it was sent on credit; holding it would reorder the session's
delivery-ids) and the link's credit is then withheld until every queue it hit drains; under
``overflow: reject`` the message is instead settled ``rejected`` with
``amqp:resource-limit-exceeded`` by the proxy and never reaches the broker.

A client that transfers beyond every limit the proxy ever granted gets that link detached
with ``amqp:link:transfer-limit-exceeded`` (the broker's end of the link is detached too, both
replies are absorbed, later transfers on it are dropped). Transfer frames the proxy drops are
accounted per session, and the ``next-incoming-id`` / ``next-outgoing-id`` of flows on that
session are shifted by that many, so the two peers' transfer-ids still agree.

Receiver links pass untouched; their deliveries from a policed queue are counted in its
ledger (``QueueDepth.delivered``).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

from proxy.amqp10.addresses import (
    Destination,
    declared_queue,
    parse_target,
    queues_for,
    source_queue,
)
from proxy.amqp10.credit import LinkFlow, SenderCredit, serial_add, serial_diff
from proxy.amqp10.errors import DecodeError
from proxy.amqp10.framing import frame
from proxy.amqp10.performatives import (
    DETACH,
    DISPOSITION,
    ERROR,
    FLOW,
    Attach,
    Begin,
    Role,
    encode_performative,
    performative,
)
from proxy.amqp10.types import Described, Symbol, UInt, ULong, decode_value, encode
from proxy.gate import ALARM, FlowController, QueueKey
from proxy.logs import event
from proxy.policy import Overflow

log = logging.getLogger("floodwall.flow")

PROTOCOL: Final = "amqp10"
WINDOW_BYTES: Final = 64 * 1024
"""Message bytes one policed link may have credit for: its share of the overshoot bound."""
MAX_WINDOW: Final = 256
"""Most credit the proxy gives one policed link, however small its messages."""
ASSUMED_MESSAGE_BYTES: Final = 4096
"""Message size assumed before a link or its queue has shown one (window 16)."""
TRANSFER_LIMIT_EXCEEDED: Final = "amqp:link:transfer-limit-exceeded"
RESOURCE_LIMIT_EXCEEDED: Final = "amqp:resource-limit-exceeded"
REJECTED: Final = 0x25
DROPPED_ID_HORIZON: Final = 1 << 16
"""A broker's disposition never reaches further back than its session window (65535)."""
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
    server_handle: int | None = None
    in_delivery: bool = False
    dropping: bool = False  # the current delivery is being dropped (rejected by the proxy)
    delivery_bytes: int = 0
    delivery_queues: frozenset[str] = frozenset()
    hit: set[str] = field(default_factory=set)  # per-message links: queues sent to lately
    deliveries: int = 0
    payload_bytes: int = 0
    blocked: bool = False
    withheld: bool = False  # the client was told credit 0 because of a tripped queue
    detaching: bool = False  # the proxy detached it: drop its frames, absorb the replies
    replies_due: set[str] = field(default_factory=set)  # "client", "broker"
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
    dropped_ids: deque[int] = field(default_factory=deque)  # their delivery-ids, in order


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
                 hold_budget: int = 0) -> None:
        self.controller = controller
        self.conn_id = conn_id
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
        controller.register(self)

    def close(self) -> None:
        self.controller.unregister(self)
        self.sessions.clear()
        self.by_server_channel.clear()

    def expire(self, now: float) -> int:
        """Nothing is held, so nothing expires (a link without credit is not a message)."""
        return 0

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
                              address is None, SenderCredit(initial))
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
        self._link_gone(link)

    def _link_gone(self, link: Link) -> None:
        if isinstance(link, SenderLink) and link.blocked:
            link.blocked = False
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
            if window is None and credit.offset == 0 and not link.withheld:
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
        if not isinstance(link, SenderLink):
            return None
        if link.detaching:
            session.dropped_frames += 1
            if not link.in_delivery:
                self._dropped_id(session, fields)
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
                self._dropped_id(session, fields)
                return self._transfer_limit_exceeded(session, link)
            link.delivery_bytes = 0
            link.dropping = False
            link.delivery_queues = self._route(link, payload, start, end)
            blocking = (self.controller.blocking(self.vhost, link.delivery_queues)
                        if link.per_message else _NO_KEYS)
            if blocking and self._overflow(blocking) is Overflow.REJECT:
                link.dropping = True
                link.credit.dropped()
                self._dropped_id(session, fields)
                self._reject(session, link, fields, blocking)
        link.in_delivery = more and not aborted
        if link.dropping:
            session.dropped_frames += 1
            replacement = b""
        else:
            link.delivery_bytes += end - start
        if not link.in_delivery:
            if not link.dropping and not aborted:
                link.deliveries += 1
                link.payload_bytes += link.delivery_bytes
                self.controller.forwarded(self.vhost, link.delivery_queues, link.delivery_bytes)
                if link.per_message and self.controller.queues:
                    link.hit.update(q for q in link.delivery_queues
                                    if (self.vhost, q) in self.controller.queues)
            link.dropping = False
        if first or not link.in_delivery:
            # A fixed destination's queues were routed just now for a first frame: the same.
            self._after_transfer(link, link.delivery_queues if first else None)
        return replacement

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

    def _dropped_id(self, session: SessionGate, fields: list[object]) -> None:
        """Remember a delivery-id the broker will never see (its dispositions may span it)."""
        delivery_id = _uint(fields, 1, "transfer.delivery-id")
        if delivery_id is None:
            return
        session.dropped_ids.append(delivery_id)
        if not self.dropping:
            self.dropping = True
            self.on_drop()

    def on_server_disposition(self, channel: int, fields: list[object]) -> bytes | None:
        """The broker settles the client's deliveries (role receiver): leave out of its ranges
        the delivery-ids the proxy settled itself (RabbitMQ's ranges span the gaps)."""
        session = self.by_server_channel.get(channel)
        if session is None or not session.dropped_ids or not fields or fields[0] is not True:
            return None
        first = _uint(fields, 1, "disposition.first")
        if first is None:
            raise DecodeError("disposition.first is mandatory")
        last = _uint(fields, 2, "disposition.last")
        last = first if last is None else last
        dropped = session.dropped_ids
        while dropped and serial_diff(last, dropped[0]) >= DROPPED_ID_HORIZON:
            dropped.popleft()
        inside = sorted((i for i in dropped if serial_diff(i, first) >= 0
                         and serial_diff(last, i) >= 0), key=lambda i: serial_diff(i, first))
        if not inside:
            return None
        out = bytearray()
        start = first
        for gap in [*inside, serial_add(last, 1)]:
            if serial_diff(gap, start) > 0:
                piece = _padded(fields, 3)
                piece[1], piece[2] = UInt(start), UInt(serial_add(gap, -1))
                out += frame(encode_performative_fields(DISPOSITION, piece), channel)
            start = serial_add(gap, 1)
        return bytes(out)

    # -- decisions ---------------------------------------------------------------------------
    def _queues(self, link: SenderLink) -> frozenset[str]:
        """The queues the link's messages land in (per-message links: those it hit lately)."""
        if link.per_message:
            return frozenset(link.hit)
        return queues_for(self.controller, self.vhost, link.destination)

    def _route(self, link: SenderLink, payload: bytes, start: int, end: int) -> frozenset[str]:
        if not link.per_message:
            return queues_for(self.controller, self.vhost, link.destination)
        if not self.controller.queues:
            return frozenset()
        found = message_routing(payload, start, end)
        if found is None:
            return frozenset()
        to, subject = found
        destination = link.destination
        if link.anonymous:
            destination = parse_target(to) if to else None
        return queues_for(self.controller, self.vhost, destination, subject)

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
        if not policed and not (link.per_message and self.controller.queues):
            return None
        size = link.typical_bytes
        if not size:
            size = max((self.controller.queues[k].depth.average_body_bytes() for k in policed),
                       default=0) or ASSUMED_MESSAGE_BYTES
        return window_for(size)

    def _decide(self, link: SenderLink, window: int | None) -> LinkFlow:
        """The credit to give the client now: withheld while a queue it feeds is tripped."""
        blocking = self.controller.blocking(self.vhost, self._queues(link))
        if blocking and self._block(link, blocking):
            link.withheld = True
            return link.credit.grant(0)
        if link.withheld:
            link.withheld = False
            self._signalled(link, active=True)
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
        else:
            queues = fixed = routed if routed is not None else self._queues(link)
        blocking = self.controller.blocking(self.vhost, queues)
        if blocking and not (link.per_message and self._overflow(blocking) is Overflow.REJECT):
            if self._block(link, blocking) and not link.withheld:
                link.withheld = True
                self._send_grant(link, link.credit.grant(0))
            return
        window = self._window(link, fixed)
        if window is not None and link.credit.wants_top_up(window):
            self._send_grant(link, link.credit.grant(window))

    def _block(self, link: SenderLink, blocking: frozenset[QueueKey]) -> bool:
        """Block the link on ``blocking``; False when they all released meanwhile."""
        if link.blocked:
            return True
        newly = self.controller.block(self, link.ref, blocking)
        if not newly and not self.controller.is_blocked(self, link.ref):
            return False
        link.blocked = True
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
        link.detaching = True
        link.in_delivery = False
        self._link_gone(link)
        event(log, "link_detached_by_proxy", logging.WARNING, conn=self.conn_id,
              channel=link.ref, link=link.name, condition=TRANSFER_LIMIT_EXCEEDED,
              reason="transfer beyond the link credit the proxy granted", protocol=PROTOCOL)
        error = performative(ERROR, condition=Symbol(TRANSFER_LIMIT_EXCEEDED),
                             description="floodwall: transfer beyond the granted link credit")
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
        if session.server_channel is None:
            return
        state = Described(ULong(REJECTED), [performative(
            ERROR, condition=Symbol(RESOURCE_LIMIT_EXCEEDED),
            description=f"floodwall: queue '{names}' is over capacity")])
        self._to_client(frame(encode_performative(
            DISPOSITION, role=True, first=UInt(delivery_id), settled=True, state=state),
            session.server_channel))


_UINT0: Final = b"\x43"
_UINT_BYTES: Final = tuple(bytes((0x52, i)) for i in range(256))


def _uint_bytes(value: int) -> bytes:
    """A uint's most compact encoding, as ``encode(UInt(value))`` gives it."""
    if value < 256:
        return _UINT_BYTES[value] if value else _UINT0
    return b"\x70" + value.to_bytes(4, "big")


def grant_flow_body(next_incoming: int | None, incoming_window: int, next_outgoing: int,
                    outgoing_window: int, handle: int, delivery_count: int, link_credit: int,
                    drain: bool) -> bytes:
    """The body of a flow the proxy grants credit with: the bytes ``encode_performative``
    makes of these fields (drain only when set), without its generic encoder.

    Seven or nine small fields always fit a list8.
    """
    fields = [b"\x40" if next_incoming is None else _uint_bytes(next_incoming),
              _uint_bytes(incoming_window), _uint_bytes(next_outgoing),
              _uint_bytes(outgoing_window), _uint_bytes(handle), _uint_bytes(delivery_count),
              _uint_bytes(link_credit)]
    if drain:
        fields += (b"\x40", b"\x41")  # available: null; drain: true
    body = b"".join(fields)
    return b"\x00\x53\x13\xc0" + bytes((len(body) + 1, len(fields))) + body


def encode_performative_fields(code: int, fields: list[object]) -> bytes:
    """The body of a performative from its fields as decoded (typed values kept)."""
    while fields and fields[-1] is None:
        fields = fields[:-1]
    return encode(Described(ULong(code), fields))
