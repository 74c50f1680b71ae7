"""Per-connection credit gate for AMQP 1.0: the proxy issues the link credit a sender sees.

The 0-9-1 gate (``floodwall.enforce.amqp091.gate``) holds publishes; AMQP 1.0 has a better
lever. For a
client *sender* link whose target routes to a policed queue, the broker's flow frames are
rewritten on their way to the client: the credit the client sees is the broker's grant
capped by a window (``window_for``: its policy's, or while the queue has room to spare its
part of that room, ``room_window``; paced to the queue's drain rate near capacity:
``paced_window``) while the queue is under capacity, and no more once it is tripped. The proxy
tops the client up itself as it sends (it never waits for the broker to repeat a grant it
considers current), and sends the flow that restores credit when the ``FlowController``
releases the link. Transfers are never held.

A trip never lowers the limit the client already has (``SenderCredit.grant``: a lower limit
crossing transfers in flight reads as negative credit, which proton-c wraps to about 2^32):
the proxy stops topping up, and what the client still had credit for is forwarded (the
broker's credit allows it: the proxy's grant is below the broker's) and counted as overshoot
(``PolicedQueue.overshoot_*``). A link's window (``LinkCredit._window``) is its policy's
(``WINDOW_BYTES`` of its typical message, or ``capacity / WINDOW_PARTS`` of a large queue's, at
most ``MAX_WINDOW_BYTES``), or, when more, its part of half the queue's room plus its part of
the queue's in-flight allowance (up to the room the last count leaves; at most
``ROOM_WINDOW_BYTES``); paced to the drain while the last count shows the queue within two
policy windows of capacity. What bounds the overshoot is the in-flight allowance (below).

The depth estimate (a ready count plus the ledger) cannot see messages the broker has taken
off the socket but not yet put in the queue; RabbitMQ's internal flow control can hold
hundreds of them when it is busy. A windowed link's unsettled deliveries are therefore counted
until the broker settles them (``InFlightDeliveries``). The counts take up
to the queue's in-flight allowance of them to be in the queue already (``IN_FLIGHT_ALLOWANCE``,
256 KiB: RabbitMQ's whole pipeline for a sender at full speed, out of the estimate), counting
back those that can no longer be unsettled as the broker settles them
(``PolicedQueue.settled``), so the estimate is short by at most what is unsettled now; a link's
credit plus its unsettled deliveries stay within its part of that allowance
(``LinkCredit._in_flight_window``), so the depth stays within the capacity plus the allowance
whatever the broker hides (docs/design/amqp10-credit.md, "The in-flight allowance"). A link
held to its part (squeezed) is topped up once an eighth of that part is free again, not per
disposition. The broker's
dispositions are read by role, first, last and state code alone (``on_server_settled``,
``peek_disposition``; the outcome counted: ``BrokerOutcomes``) unless the session's
delivery-ids are renumbered or the state is ``rejected`` (its error is read) or
transactional; runs of them as ranges (``on_server_settle_run``, renumbered sessions too).
Deliveries sent settled get no disposition and are not counted.

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
broker was asked (``_lookup``: floodwall/control/lookups.py). Each message is decided on
its own, and the link keeps its credit for the others: under ``overflow: hold`` a message to
a tripped queue (or to one with messages of this connection held before it) is consumed and
held for its queue (``_hold``; ``floodwall.enforce.amqp10.held``), unsettled, and sent
through the proxy's own 1.0 sender when the queue is admitted or drains (``SendHeld``), its
client told the broker's outcome once (``held_settled``); under ``overflow: reject`` it is
settled ``rejected`` with ``amqp:resource-limit-exceeded`` by the proxy and never reaches the
broker. A link's held bytes at its window withhold its credit, as does a message that cannot
be held per message (more than one frame, transactional, more than one queue, a lookup, the
broker's alarm): that one is forwarded, and the link's credit withheld until every queue it
hit drains.

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

Deliveries the proxy consumes (rejected, spooled, held, sent on a link it detached) never reach
the broker directly, so the two peers' numbering is translated per session: transfer-ids (the
``next-incoming-id`` / ``next-outgoing-id`` of flows on that session are shifted by the
transfer frames dropped) and delivery-ids (``floodwall.wire.amqp10.credit.DeliveryIds``: forwarded
transfers carry the broker's consecutive ids, dispositions are mapped range by range both
ways, and a client disposition that names only consumed deliveries is absorbed).

Receiver links pass untouched; their deliveries from a policed queue are counted in its
ledger (``QueueDepth.delivered``).

Output is a value: frames the proxy makes (grants, settlements, detaches), topology changes
(a link that declared a queue), ``ReadEveryFrame`` and typed events go to ``outbox`` in order;
every entry point that needs the time takes ``now``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from floodwall.control.controller import QueueKey
from floodwall.control.policy import Fsync
from floodwall.enforce import events as ev
from floodwall.enforce.amqp10.credit import LinkCredit
from floodwall.enforce.amqp10.held import HELD_REF_BASE, HeldView
from floodwall.enforce.amqp10.inflight import InFlightDeliveries
from floodwall.enforce.amqp10.links import (
    _ACCEPTED,
    IDLE,
    LinkView,
    ReceiverLink,
    SenderLink,
    SessionGate,
    SpoolCapture,
    _flag,
    _range,
    _renumber_disposition,
    _uint,
    encode_performative_fields,
    rejected_outcome,
)
from floodwall.enforce.amqp10.outcomes import BrokerOutcomes
from floodwall.enforce.amqp10.runs import TransferRuns
from floodwall.enforce.amqp10.sessions import Sessions
from floodwall.enforce.capture import capture_refusal
from floodwall.enforce.commands import Outbox, ReadEveryFrame
from floodwall.enforce.decision import Verdict, decide
from floodwall.enforce.ports import SpoolRefused
from floodwall.enforce.shadow import ShadowRecorder
from floodwall.enforce.shared import Enforcement, GateContext
from floodwall.enforce.states import DeliveryInput, DeliveryPhase
from floodwall.spool.records import SpoolRecord
from floodwall.wire.amqp10.credit import serial_add
from floodwall.wire.amqp10.errors import DecodeError
from floodwall.wire.amqp10.framing import frame
from floodwall.wire.amqp10.performatives import (
    TRANSACTIONAL_STATE,
    TRANSFER,
    Attach,
    Begin,
    Outcome,
)
from floodwall.wire.amqp10.performatives import (
    DispositionFields as D,
)
from floodwall.wire.amqp10.performatives import (
    TransferFields as T,
)
from floodwall.wire.amqp10.types import Described, UInt

_FIRST_OUTCOME: Final = int(min(Outcome))
_LAST_OUTCOME: Final = int(max(Outcome))
_FORWARDING: Final = DeliveryPhase.FORWARDING
_CAPTURING: Final = DeliveryPhase.CAPTURING


class CreditFlow:
    """The credit gate of one AMQP 1.0 connection; asked by its ``amqp10.Connection``
    (``floodwall.wire.amqp10.hooks.TransferHooks``), released and expired by the I/O layer.

    The core hands it the frames it needs (``on_*``); an ``on_*`` returning bytes means "send
    these instead of the frame" (b"" drops it). Frames the proxy makes on its own, and events,
    go to ``outbox`` (``take_output`` empties it).

    The I/O layer reads ``holding``, ``held_bytes``, ``over_budget`` and calls ``expire`` as
    it does for 0-9-1's ``PublishFlow``: ``held_bytes`` are the messages held for their
    queues (``HeldMessages``: the memory budget pauses the connection by them); the gate
    delivers none of them once its client is gone (``holding`` is False), and its own
    hold budget is checked before a message is held (``over_budget`` is False).

    The gate owns its context (``GateContext``: the process' parts, the connection, the
    outbox), the tables (``sessions`` and ``by_server_channel``: a connection's sessions by
    either peer's channel, their links inside; the links whose credit is withheld) and its
    parts, each handed the context and the tables it needs, none standing on another:
    ``lifecycle`` (``Sessions``: sessions and links as the peers make and end them, spool
    captures, the frames the proxy makes about a link), ``credit`` (``LinkCredit``: windows,
    withholding, release, deadlines), ``runs`` (``TransferRuns``), ``in_flight``
    (``InFlightDeliveries``) and ``shadow`` (``ShadowRecorder``). It keeps the transfers
    themselves: a delivery's fate (forwarded, refused, spooled), renumbering, the broker's
    settlements, the spool.
    """

    holding: Final = False  # (held messages are dropped with their link: none to deliver)
    over_budget: Final = False

    # The hooks the parts answer, bound in ``__init__`` (see there).
    client_begin: Callable[[int, Begin], None]
    server_begin: Callable[[int, Begin], None]
    client_attach: Callable[[int, Attach], None]
    server_attach: Callable[[int, Attach], None]
    client_detach: Callable[[int, int], bytes | None]
    server_detach: Callable[[int, int], bytes | None]
    client_end: Callable[[int], None]
    server_end: Callable[[int], None]
    on_client_disposition: Callable[[int, list[object]], bytes | None]
    on_client_flow: Callable[[int, list[object]], bytes | None]
    on_server_flow: Callable[[int, list[object], float], bytes | None]
    transfer_run: Callable[[int, int], tuple[int, float] | None]
    on_transfer_run: Callable[[int, int, int, int, list[int], float], int]
    server_transfer_run: Callable[[int, int], bool]
    on_server_transfer_run: Callable[[int, int, int], None]
    take_output: Callable[[], Outbox]

    def __init__(self, shared: Enforcement, conn_id: int, hold_budget: int = 0) -> None:
        ctx = self.ctx = GateContext(shared, conn_id, hold_budget)
        self.controller = ctx.controller  # (the process' one: read per transfer)
        self.outbox = ctx.outbox  # one list for the connection's life; the core reads it
        self.sessions: dict[int, SessionGate] = {}  # by the client's channel
        self.by_server_channel: dict[int, SessionGate] = {}
        self.withheld: dict[int, SenderLink] = {}  # links whose credit is withheld, by link_ref
        self.dropping = False  # a delivery was consumed: ReadEveryFrame was asked for
        self.shadow = ShadowRecorder(ctx)
        self.outcomes = outcomes = BrokerOutcomes(ctx)
        self.in_flight = in_flight = InFlightDeliveries(ctx)
        self.lifecycle = lifecycle = Sessions(ctx, self.sessions, self.by_server_channel,
                                              self.withheld, in_flight, outcomes)
        self.held = lifecycle.held
        self.credit = credit = LinkCredit(ctx, lifecycle, self.shadow)
        self.runs = runs = TransferRuns(ctx, self.sessions, self.by_server_channel, credit,
                                        in_flight)
        # The hooks a part answers are that part's bound methods, set here rather than
        # wrapped in a method of the gate that calls the part: the core calls the per-transfer
        # ones (runs, flows) once per run or flow, and a wrapper would add a call to each.
        # Tests may replace one on the gate, as they may a method.
        self.take_output = ctx.take_output
        self.client_begin, self.server_begin = lifecycle.client_begin, lifecycle.server_begin
        self.client_attach = lifecycle.client_attach
        self.server_attach = lifecycle.server_attach
        self.client_detach = lifecycle.client_detach
        self.server_detach = lifecycle.server_detach
        self.client_end, self.server_end = lifecycle.client_end, lifecycle.server_end
        self.on_client_disposition = lifecycle.on_client_disposition
        self.on_client_flow, self.on_server_flow = credit.on_client_flow, credit.on_server_flow
        self.transfer_run, self.on_transfer_run = runs.transfer_run, runs.on_transfer_run
        self.server_transfer_run = runs.server_transfer_run
        self.on_server_transfer_run = runs.on_server_transfer_run
        # The parts' methods the per-frame path calls, bound once for the same reason.
        self._route, self._after_transfer = credit.route, credit.after_transfer
        self._track = in_flight.track
        self._outcome_counts, self._outcome_total = outcomes.counts, outcomes.total

    # -- what the I/O layer and the core read ------------------------------------------------
    @property
    def hold_budget(self) -> int:
        return self.ctx.hold_budget

    @hold_budget.setter
    def hold_budget(self, budget: int) -> None:
        self.ctx.hold_budget = budget

    @property
    def held_bytes(self) -> int:
        """Bytes of messages held for their queues (``HeldMessages``), sent or not."""
        return self.held.bytes

    def held_views(self) -> list[HeldView]:
        """The connection's held messages per queue, as ``/state`` shows them."""
        return self.held.views()

    # -- the controller and the clock -----------------------------------------------------
    def channel_released(self, channel: int, now: float) -> None:
        """The controller: every queue link ``channel`` (a ``link_ref``) waited on drained,
        or a held queue's ref (``HELD_REF_BASE`` and above) was freed: its messages go."""
        if channel >= HELD_REF_BASE:
            self.held.released(channel, now)
        else:
            self.credit.channel_released(channel, now)

    def channel_admitted(self, channel: int, now: float) -> None:
        """The controller: a held queue link or held-queue ref ``channel`` waits on has
        tokens (``LinkCredit.channel_admitted``; held messages go while they admit them)."""
        if channel >= HELD_REF_BASE:
            self.held.released(channel, now)
        else:
            self.credit.channel_admitted(channel, now)

    def expire(self, now: float) -> int:
        """Links without credit past their deadline are detached, messages held past it are
        settled ``rejected``; returns how many links were detached."""
        for link in self.held.expire(now):
            self._held_room(link, now)
        return self.credit.expire(now)

    def held_settled(self, token: int, state: Described, now: float) -> None:
        """The broker settled held message ``token`` (``SendHeld``) with ``state`` (an
        outcome; the I/O layer makes ``released`` of one whose outcome it lost): told to the
        client once, for the delivery-id it sent it with."""
        link = self.held.settled(token, state, now)
        if link is not None:
            self._held_room(link, now)

    def _held_room(self, link: SenderLink, now: float) -> None:
        """``link``'s held bytes fell below its window: its credit is worked out again."""
        if not link.detaching and link.delivery.phase is IDLE:
            self._after_transfer(link, now)

    @property
    def captured_bytes(self) -> int:
        """Bytes of its links' spool captures (counted as held)."""
        return self.lifecycle.captured_bytes

    def link_views(self) -> list[LinkView]:
        """The connection's sender links, as ``/state`` shows them."""
        return [link.view() for session in self.sessions.values()
                for link in session.links.values()
                if isinstance(link, SenderLink) and not link.detaching]

    def vhost_opened(self, vhost: str) -> None:
        self.ctx.vhost = vhost

    def close(self) -> None:
        """The connection is gone: none of its links is blocked any more, nothing of it is
        captured for the spool."""
        self.lifecycle.close()

    # -- transfers ---------------------------------------------------------------------------
    def on_client_transfer(self, channel: int, fields: list[object], payload: bytes,
                           start: int, end: int, now: float) -> bytes | None:
        session = self.sessions.get(channel)
        if session is None:
            return None
        handle = fields[T.HANDLE] if fields else None  # (an uint: the common case inline)
        if type(handle) is not UInt:
            handle = _uint(fields, T.HANDLE, TRANSFER)
        link = session.links.get(handle) if handle is not None else None
        if not isinstance(link, SenderLink):  # a transaction coordinator's, say
            return self._renumbered(session.ids.dropped, fields, payload, start, end, channel)
        if link.detaching:
            return self._dropped_frame(session, link, fields)
        count = len(fields)  # most transfers end before more (5) and aborted (9)
        more = count > T.MORE and _flag(fields, T.MORE, TRANSFER)
        aborted = count > T.ABORTED and _flag(fields, T.ABORTED, TRANSFER)
        delivery = link.delivery
        first = delivery.phase is IDLE
        replacement: bytes | None = None
        if first:
            if not link.credit.transfer():
                session.dropped_frames += 1
                self._drop_delivery(session, fields)
                return self.lifecycle.transfer_limit_exceeded(session, link)
            delivery.bytes = 0
            delivery.held = False
            queues = delivery.queues = self._route(link, payload, start, end, now)
            # The link's own state has nothing to decide (as for a run) unless it says so;
            # a shadow trip or the spool may still have.
            plain = link.may_run
            delivery.phase = _FORWARDING  # (DELIVERY_PHASES' FIRST_FRAME, inline: per transfer)
            if not plain or self.controller.trips.shadow or self.ctx.spool is not None:
                self._first_frame(session, link, fields, queues, payload, start, end, now)
            # The broker numbers it by the drops before it (also on other links meanwhile).
            delivery.id_shift = session.ids.dropped
        in_progress = more and not aborted
        if delivery.phase is not _FORWARDING:
            session.dropped_frames, replacement = session.dropped_frames + 1, b""
            if delivery.phase is _CAPTURING:
                if aborted:  # the client gave up on it: nothing to store or settle
                    self.lifecycle.uncapture(link)
                else:
                    self._capture_part(session, link, payload[start:end], more)
        else:
            delivery.bytes += end - start
            if delivery.id_shift:
                replacement = self._renumbered(delivery.id_shift, fields, payload, start, end,
                                               channel)
            if first and link.windowed and not (count > T.SETTLED
                                                 and _flag(fields, T.SETTLED, TRANSFER)):
                self._track(session, link, fields)
            elif aborted and delivery.tracked_id is not None:  # the broker will not settle
                self.in_flight.untrack(session, link)
        if not in_progress:
            self._delivered(link, aborted, now)
        if first or not in_progress:  # (a first frame's queues were routed just now)
            self._after_transfer(link, now, delivery.queues if first else None)
        return replacement

    def _first_frame(self, session: SessionGate, link: SenderLink, fields: list[object],
                     queues: frozenset[str], payload: bytes, start: int, end: int,
                     now: float) -> None:
        """A delivery's first frame (its payload ``payload[start:end]``, copied only when the
        proxy holds it), on a link that may not run, or with a shadow queue tripped or a
        spool: what enforcing the shadow policies would do, and whether the proxy refuses,
        spools or holds it (``_consume``)."""
        if link.shadow.on or self.controller.trips.shadow:
            self.credit.shadow_transfer(link, queues)
        if link.per_message or self.ctx.spool is not None:
            blocking = self.controller.blocking(self.ctx.vhost, queues)
            if blocking:
                self._consume(session, link, fields, blocking, payload, start, end, now)
            elif link.per_message and self.held.queues and len(queues) == 1:
                key = self.held.behind(queues)
                if key is not None and self._holds(link, fields, frozenset((key,)),
                                                   _transactional(fields)):
                    self._hold(session, link, fields, key, payload[start:end], now)  # behind

    def _dropped_frame(self, session: SessionGate, link: SenderLink,
                       fields: list[object]) -> bytes:
        """A frame of a link the proxy detached: dropped (b""), the session renumbered."""
        session.dropped_frames += 1
        delivery = link.delivery
        if delivery.phase is IDLE:
            self._drop_delivery(session, fields)
            delivery.move(DeliveryInput.DROPPED_FIRST_FRAME)
        if not _flag(fields, T.MORE, TRANSFER):
            delivery.move(DeliveryInput.LAST_FRAME)
        return b""

    def _delivered(self, link: SenderLink, aborted: bool, now: float) -> None:
        """A delivery's last frame: a forwarded one is booked on the queues it lands in."""
        delivery = link.delivery
        if delivery.phase is _FORWARDING and not aborted:
            link.deliveries += 1
            link.payload_bytes += delivery.bytes
            controller = self.controller
            if controller.any_tripped and not link.admitted_credit:  # (credit granted
                self.credit.overshoot(delivery.queues, delivery.bytes)  # before a trip)
            controller.forwarded(self.ctx.vhost, delivery.queues, delivery.bytes, now,
                                 delivery.tracked_id is not None)
            if link.per_message and controller.queues:
                link.hit.update(q for q in delivery.queues
                                if (self.ctx.vhost, q) in controller.queues)
        delivery.phase = IDLE  # (DELIVERY_PHASES' LAST_FRAME, inline: per transfer)

    def _broker_settled(self, session: SessionGate, first: int, last: int, now: float) -> None:
        """The broker settled deliveries ``first``..``last`` (its ids): their links' windows
        have room again."""
        for link in self.in_flight.settled(session, first, last):
            if not link.detaching and link.delivery.phase is IDLE:
                self._after_transfer(link, now)  # (works out whether it is still squeezed)

    def _consume(self, session: SessionGate, link: SenderLink, fields: list[object],
                 blocking: frozenset[QueueKey], payload: bytes, start: int, end: int,
                 now: float) -> None:
        """A delivery's first frame, to a tripped (or backlogged) queue: refuse it under
        ``overflow: reject`` (per-message links), spool it under ``overflow: spool``, hold it
        for its queue under ``hold`` (per-message links: ``_holds``), else let it through (it
        was sent on credit; the link's credit is withheld after it)."""
        transactional = _transactional(fields)
        decision = decide(self.ctx.vhost, link.delivery.queues, blocking, self.controller.queues,
                          self.ctx.spool, transactional=transactional, behind=link.spool_refused)
        if decision.verdict is Verdict.REJECT and link.per_message:
            link.delivery.move(DeliveryInput.REFUSED)
            link.credit.dropped()
            self._drop_delivery(session, fields)
            self._reject(session, link, fields, blocking)
            return
        if decision.verdict is Verdict.HOLD and self._holds(link, fields, blocking,
                                                            transactional):
            self._hold(session, link, fields, next(iter(blocking)), payload[start:end], now)
            return
        if decision.not_spooled is not None:
            link.spool_refused = True  # so its credit is withheld after this one
            if not link.not_spooled_reported:
                link.not_spooled_reported = True
                self.outbox.append(ev.NotSpooled(
                    self.lifecycle.at(link), next(iter(link.delivery.queues)),
                    "transactional transfer", "held by credit"))
            return
        key = decision.spool_to
        if key is None:
            return
        delivery_id = _uint(fields, T.DELIVERY_ID, TRANSFER)
        link.delivery.move(DeliveryInput.SPOOLED)
        link.capture = SpoolCapture(
            key, link.delivery.message_to if link.anonymous else (link.address or ""),
            None if _flag(fields, T.SETTLED, TRANSFER) else delivery_id,
            _uint(fields, T.MESSAGE_FORMAT, TRANSFER) or 0)
        link.credit.dropped()
        self._drop_delivery(session, fields)

    def _holds(self, link: SenderLink, fields: list[object], blocking: frozenset[QueueKey],
               transactional: bool) -> bool:
        """Whether a delivery held back (``Verdict.HOLD``) is held for its queue rather than
        by its link's credit: a per-message link's whole delivery (one frame), not
        transactional, landing in one policed queue that is all that blocks it (no alarm, no
        lookup). Past its window of held bytes the link's credit is withheld
        (``LinkCredit.after_transfer``); what it had credit for is still held, in order."""
        return (link.per_message and not transactional and len(blocking) == 1
                and len(link.delivery.queues) == 1 and not link.delivery.lookup
                and not _flag(fields, T.MORE, TRANSFER)
                and next(iter(blocking)) in self.controller.queues)

    def _hold(self, session: SessionGate, link: SenderLink, fields: list[object],
              key: QueueKey, part: bytes, now: float) -> None:
        """Consume the delivery and hold it for ``key`` (``HeldMessages``), unsettled; or
        settle it ``rejected`` when the budgets have no room for it."""
        link.delivery.move(DeliveryInput.HELD)
        link.delivery.held = True
        link.credit.dropped()
        self._drop_delivery(session, fields)
        delivery_id = None if _flag(fields, T.SETTLED, TRANSFER) else _uint(
            fields, T.DELIVERY_ID, TRANSFER)
        why = self.held.refusal(len(part))
        if why is not None:
            self.ctx.counters.rejects += 1
            self.outbox.append(ev.Refused(self.lifecycle.at(link), frozenset((key,)),
                                          f"over capacity and {why}", ev.Answer.REJECTED, 0))
            if delivery_id is not None:
                self.lifecycle.settle(session, delivery_id, delivery_id, rejected_outcome(
                    f"floodwall: queue '{key[1]}' is over capacity and {why}"))
            return
        self.held.hold(session, link, key, delivery_id,
                       link.delivery.message_to if link.anonymous else (link.address or ""),
                       _uint(fields, T.MESSAGE_FORMAT, TRANSFER) or 0, part, now)

    def _renumbered(self, shift: int, fields: list[object], payload: bytes, start: int,
                    end: int, channel: int) -> bytes | None:
        """A forwarded transfer with the broker's delivery-id, its client id less ``shift``
        (None: unchanged)."""
        if not shift or len(fields) <= T.DELIVERY_ID or fields[T.DELIVERY_ID] is None:
            return None
        delivery_id = _uint(fields, T.DELIVERY_ID, TRANSFER)
        assert delivery_id is not None
        fields = list(fields)
        fields[T.DELIVERY_ID] = UInt(serial_add(delivery_id, -shift))
        return frame(encode_performative_fields(TRANSFER, fields) + payload[start:end], channel)

    def on_server_transfer(self, channel: int, fields: list[object]) -> None:
        """A transfer from the broker: the session's transfer-id, a counted delivery."""
        session = self.by_server_channel.get(channel)
        if session is None:
            return
        session.next_outgoing = serial_add(session.next_outgoing, 1)
        handle = _uint(fields, T.HANDLE, TRANSFER)
        link = session.by_server_handle.get(handle) if handle is not None else None
        if not isinstance(link, ReceiverLink) or link.queue is None:
            return
        if not link.in_delivery:
            q = self.controller.queues.get((self.ctx.vhost, link.queue))
            if q is not None:
                q.depth.delivered()
        link.in_delivery = _flag(fields, T.MORE, TRANSFER) and not _flag(
            fields, T.ABORTED, TRANSFER)

    def _drop_delivery(self, session: SessionGate, fields: list[object]) -> None:
        """The delivery whose first frame this is will not reach the broker: renumber."""
        delivery_id = _uint(fields, T.DELIVERY_ID, TRANSFER)
        if delivery_id is None:
            raise DecodeError("transfer.delivery-id is mandatory on a delivery's first frame")
        session.ids.drop(delivery_id)
        if not self.dropping:
            self.dropping = True
            self.outbox.append(ReadEveryFrame())

    def on_server_disposition(self, channel: int, fields: list[object],
                              now: float) -> bytes | None:
        """The broker settles the client's deliveries (role receiver): its outcome counted
        (``BrokerOutcomes``), its delivery-ids mapped to the client's, skipping those the
        proxy consumed."""
        session = self.by_server_channel.get(channel)
        if session is None or not fields or fields[D.ROLE] is not True:
            return None
        first, last = _range(fields)
        if len(fields) > D.STATE:
            self.outcomes.settled(session.channel, fields[D.STATE], first, last, now)
        if session.in_flight:
            self._broker_settled(session, first, last, now)
        return _renumber_disposition(fields, session.ids, session.ids.client_ranges, channel)

    def on_server_settled(self, channel: int, receiver: bool, first: int, last: int,
                          state: int, now: float) -> bool:
        """``on_server_disposition`` from a disposition's role, first, last and state code
        alone (``peek_disposition``): True when that is all it needs (nothing to renumber,
        the state an outcome counted as it is: not ``rejected``, whose error is read, nor a
        transactional state); False, having done nothing, when the frame must be decoded."""
        session = self.by_server_channel.get(channel)
        if session is None or not receiver:
            return True
        if session.ids.dropped or state == Outcome.REJECTED or state == TRANSACTIONAL_STATE:
            return False
        self._settled(session, first, last, state, now)
        return True

    def on_server_settle_run(self, channel: int, first: int, last: int, state: int,
                             now: float) -> list[tuple[int, int]] | None:
        """A range of the broker's settlements read as a run (``server_settle_run``; its
        state an outcome counted as it is): booked as ``on_server_settled`` books one; the
        client's ids of it, as ranges, where the session is renumbered (None: they pass
        unchanged)."""
        session = self.by_server_channel.get(channel)
        if session is None:
            return None
        self._settled(session, first, last, state, now)
        return session.ids.client_ranges(first, last) if session.ids.dropped else None

    def _settled(self, session: SessionGate, first: int, last: int, state: int,
                 now: float) -> None:
        """The broker settled ``first..last`` with ``state`` (a code ``peek_state`` read)."""
        if _FIRST_OUTCOME <= state <= _LAST_OUTCOME:  # (``BrokerOutcomes.count``, inline)
            n = 1 if first == last else ((last - first) & 0xFFFFFFFF) + 1
            self._outcome_counts[state] += n
            self._outcome_total[state] += n
        if session.in_flight:
            self._broker_settled(session, first, last, now)

    def server_settle_run(self, channel: int, alone: bool) -> bool:
        """Whether the broker's settlements on ``channel`` that begin with the disposition
        read now are bookkeeping only, and may be booked as ranges (``TransferHooks``):
        none of the session's links is squeezed (only a squeezed link's credit is worked out
        again when the broker settles; ``_broker_settled``). On a renumbered session they
        are relayed mapped to the client's ids (``on_server_settle_run``), a disposition
        ``alone`` in its read too (else decoded and encoded again); elsewhere such a one is
        cheaper read by ``on_server_settled``."""
        session = self.by_server_channel.get(channel)
        if session is None or (alone and not session.ids.dropped):
            return False
        for link in session.links.values():
            if type(link) is SenderLink and link.squeezed:
                return False
        return True

    def _capture_part(self, session: SessionGate, link: SenderLink, part: bytes,
                      more: bool) -> None:
        """A transfer frame of a delivery to spool: kept (counted as held) while the whole
        fits the spool and the budgets (``capture_refusal``), spooled with its last frame;
        else the capture is dropped and the delivery rejected at once."""
        capture = link.capture
        assert capture is not None and self.ctx.spool is not None
        q = self.controller.queues.get(capture.key)
        why = capture_refusal(self.ctx.spool, capture.key, capture.size + len(part),
                              q.policy.spool.max_bytes if q is not None else 1 << 30,
                              len(part), self.captured_bytes, self.ctx.hold_budget,
                              self.ctx.counters.held_bytes, self.ctx.shared.memory)
        if why is not None:
            self._capture_refused(session, link, why)
            return
        self.lifecycle.keep(capture, part)
        if not more:
            self._spool(session, link)

    def _capture_refused(self, session: SessionGate, link: SenderLink, why: str) -> None:
        """The delivery being captured cannot be spooled (``why``): what came of it is
        dropped, and so is the rest as it comes; it is settled ``rejected``
        (amqp:resource-limit-exceeded, naming the queue) now, and the link's credit is
        withheld until the queue drains, as after a full spool."""
        capture = self.lifecycle.uncapture(link)
        assert capture is not None
        link.delivery.move(DeliveryInput.CAPTURE_REFUSED)
        self.ctx.counters.spool_fallbacks += 1
        link.spool_refused = True
        self.outbox.append(ev.SpoolFellBack(
            self.lifecycle.at(link), capture.key[1], why,
            "rejected; the link's credit is withheld until the queue drains"))
        if capture.delivery_id is not None:
            self.lifecycle.settle(
                session, capture.delivery_id, capture.delivery_id, rejected_outcome(
                    f"floodwall: the message cannot be spooled for queue '{capture.key[1]}' "
                    f"({why})"))

    def _spool(self, session: SessionGate, link: SenderLink) -> None:
        """The last frame of a delivery to spool is in: write the record."""
        capture = self.lifecycle.uncapture(link)
        assert capture is not None and self.ctx.spool is not None
        key = capture.key
        q = self.controller.queues.get(key)
        settings = q.policy.spool if q is not None else None
        record = SpoolRecord.amqp10_message(0, 0.0, capture.address, capture.message_format,
                                            b"".join(capture.parts))
        delivery_id = capture.delivery_id
        try:
            seq = self.ctx.spool.append(key, record, settings.max_bytes if settings else 1 << 30)
        except SpoolRefused as exc:
            self.ctx.counters.spool_fallbacks += 1
            link.spool_refused = True
            self.outbox.append(ev.SpoolFellBack(
                self.lifecycle.at(link), key[1], str(exc),
                "rejected; the link's credit is withheld until the queue drains"))
            if delivery_id is not None:
                self.lifecycle.settle(session, delivery_id, delivery_id, rejected_outcome(
                    f"floodwall: the spool of queue '{key[1]}' refused the message ({exc})"))
            return
        self.ctx.counters.spooled_records += 1
        self.ctx.counters.spooled_bytes += record.size
        if delivery_id is None:
            return
        if settings is not None and settings.fsync is Fsync.NEVER:
            self.lifecycle.settle(session, delivery_id, delivery_id, _ACCEPTED)
        else:
            session.spool_acks.append((key, seq, delivery_id))

    def spool_durable(self, durable: dict[QueueKey, int]) -> None:
        """The spool synced: settle ``accepted`` the spooled deliveries now durable."""
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
                    self.lifecycle.settle(session, first, last, _ACCEPTED)
                first = last = delivery_id
            if first >= 0:
                self.lifecycle.settle(session, first, last, _ACCEPTED)

    def _reject(self, session: SessionGate, link: SenderLink, fields: list[object],
                blocking: frozenset[QueueKey]) -> None:
        """Settle the delivery ``rejected`` ourselves (it will not reach the broker)."""
        self.ctx.counters.rejects += 1
        names = ",".join(q for _, q in sorted(blocking))
        self.outbox.append(ev.Refused(self.lifecycle.at(link), blocking,
                                      "over capacity (overflow: reject)", ev.Answer.REJECTED, 0))
        delivery_id = _uint(fields, T.DELIVERY_ID, TRANSFER)
        if _flag(fields, T.SETTLED, TRANSFER) or delivery_id is None:
            return
        self.lifecycle.settle(session, delivery_id, delivery_id,
                     rejected_outcome(f"floodwall: queue '{names}' is over capacity"))




def _transactional(fields: list[object]) -> bool:
    """Whether a transfer's state is a transactional state."""
    state = fields[T.STATE] if len(fields) > T.STATE else None
    return isinstance(state, Described) and state.descriptor == TRANSACTIONAL_STATE
