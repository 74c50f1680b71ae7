"""The 1.0 credit gate's credit: the window a sender link sees, paced near capacity and within
its in-flight allowance; withheld while a queue it feeds is tripped (and signalled), restored
on release; links without credit past their deadline detached."""

from __future__ import annotations

import math
from collections.abc import Iterable

from floodwall.control.controller import PolicedQueue, QueueKey
from floodwall.enforce import events as ev
from floodwall.enforce.amqp10.links import (
    _DETACHING,
    _NO_KEYS,
    ASSUMED_MESSAGE_BYTES,
    IDLE,
    PACING_ROOM,
    PROTOCOL,
    RESOURCE_LIMIT_EXCEEDED,
    ROOM_PARTS,
    ROOM_WINDOW_BYTES,
    WINDOW_BYTES,
    SenderLink,
    _flag,
    _flow_link,
    _padded,
    _uint,
    encode_performative_fields,
    message_routing,
    paced_window,
    policy_window,
    room_window,
    window_for,
)
from floodwall.enforce.amqp10.sessions import Sessions
from floodwall.enforce.decision import Decision, Verdict, deadline_of, decide
from floodwall.enforce.shadow import ShadowRecorder
from floodwall.enforce.shared import GateContext
from floodwall.enforce.states import LinkInput
from floodwall.wire.amqp10.addresses import (
    Destination,
    parse_target,
    queues_for,
)
from floodwall.wire.amqp10.credit import (
    LinkFlow,
    serial_add,
)
from floodwall.wire.amqp10.framing import frame
from floodwall.wire.amqp10.performatives import (
    FLOW,
)
from floodwall.wire.amqp10.performatives import (
    FlowFields as F,
)
from floodwall.wire.amqp10.types import UInt

SQUEEZED_TOP_UP = 8
"""A link held to its part of the in-flight allowance is topped up once the room it has grown
by 1 / this of that part (``LinkCredit.after_transfer``)."""


class LinkCredit:
    """The credit each sender link gets: the part that rewrites the peers' flows, caps a
    link's credit by its window, withholds it while a queue it feeds is tripped, restores it
    on release and detaches a link without credit past its deadline.

    It is handed the sessions part (their tables, and the frames it makes: grants, detaches),
    the withheld links (``Sessions.withheld``) and the shadow part (a delivery's would-be
    verdict)."""

    def __init__(self, ctx: GateContext, lifecycle: Sessions, shadow: ShadowRecorder) -> None:
        self.ctx = ctx
        self.controller = ctx.controller  # (the process' one: read per transfer)
        self.lifecycle = lifecycle
        self.sessions = lifecycle.sessions
        self.by_server_channel = lifecycle.by_server_channel
        self.withheld = lifecycle.withheld
        self.shadow = shadow

    def expire(self, now: float) -> int:
        """Withheld links: note since when each has had no credit (``now``, the caller's
        clock; a link is seen out of credit at the first call after it ran out) and detach
        those out of credit for longer than their policy's ``deadline`` with
        ``amqp:resource-limit-exceeded``; returns how many were detached."""
        expired = 0
        for link in list(self.withheld.values()):
            if link.credit.client_credit > 0 or link.delivery.phase is not IDLE:
                continue
            since = link.starved_since
            if since is None:
                link.starved_since = now
                self.controller.starved(self.ctx.conn_id, link.ref, now)
                continue
            deadline = self._deadline(link)
            if now - since < deadline:
                continue
            session = self.sessions.get(link.channel)
            if session is None:
                continue
            expired += 1
            queues = sorted(q for _, q in self.controller.blocked_on(self.ctx.conn_id, link.ref)) \
                or [self.controller.alarm_reason or "?"]
            names = ",".join(queues)
            self.ctx.counters.deadline_expiries += 1
            why = f"still over capacity after the {deadline:g}s deadline"
            self.ctx.outbox.append(ev.DeadlineExpired(self.lifecycle.at(link), tuple(queues), why,
                                               ev.Answer.DETACHED, 0, round(now - since, 3)))
            self.ctx.to_server(self.lifecycle.detach_by_proxy(
                session, link, RESOURCE_LIMIT_EXCEEDED,
                f"floodwall: queue '{names}' {why}: no link credit for {now - since:.1f}s"))
        return expired

    def _deadline(self, link: SenderLink) -> float:
        """The shortest ``deadline`` among the policies of the queues ``link`` waits on."""
        return deadline_of(self.controller.queues,
                           self.controller.blocked_on(self.ctx.conn_id, link.ref))

    # -- flow frames -----------------------------------------------------------------------
    def on_client_flow(self, channel: int, fields: list[object]) -> bytes | None:
        session = self.sessions.get(channel)
        if session is None:
            return None
        link = _flow_link(session.links, fields)
        if link is _DETACHING:
            return b""
        changed = False
        if isinstance(link, SenderLink):
            sent = LinkFlow(_uint(fields, F.DELIVERY_COUNT, FLOW),
                            _uint(fields, F.LINK_CREDIT, FLOW) or 0,
                            _flag(fields, F.DRAIN, FLOW), _flag(fields, F.ECHO, FLOW))
            offset = link.credit.offset
            out = link.credit.client_flow(sent)
            if out.delivery_count != sent.delivery_count or out.link_credit != sent.link_credit \
                    or offset != link.credit.offset:
                fields = _padded(fields, F.LINK_CREDIT + 1)
                fields[F.DELIVERY_COUNT] = (None if out.delivery_count is None
                                            else UInt(out.delivery_count))
                fields[F.LINK_CREDIT] = UInt(out.link_credit)
                changed = True
        if session.dropped_frames:
            next_outgoing = _uint(fields, F.NEXT_OUTGOING_ID, FLOW)
            if next_outgoing is not None:
                fields = _padded(fields, F.NEXT_OUTGOING_ID + 1)
                fields[F.NEXT_OUTGOING_ID] = UInt(serial_add(next_outgoing,
                                                             -session.dropped_frames))
                changed = True
        if not changed:
            return None
        return frame(encode_performative_fields(FLOW, fields), channel)

    def on_server_flow(self, channel: int, fields: list[object], now: float) -> bytes | None:
        session = self.by_server_channel.get(channel)
        if session is None:
            return None
        next_incoming = _uint(fields, F.NEXT_INCOMING_ID, FLOW)
        session.next_incoming = next_incoming
        session.incoming_window = _uint(fields, F.INCOMING_WINDOW, FLOW) or 0
        session.next_outgoing = _uint(fields, F.NEXT_OUTGOING_ID, FLOW) or 0
        session.outgoing_window = _uint(fields, F.OUTGOING_WINDOW, FLOW) or 0
        link = _flow_link(session.by_server_handle, fields)
        if link is _DETACHING:
            return b""
        changed = False
        if isinstance(link, SenderLink):
            credit = link.credit
            credit.broker_flow(LinkFlow(_uint(fields, F.DELIVERY_COUNT, FLOW),
                                        _uint(fields, F.LINK_CREDIT, FLOW) or 0,
                                        _flag(fields, F.DRAIN, FLOW)))
            window = self._window(link, now)
            link.windowed = window is not None
            if window is None and credit.offset == 0 and not link.withheld and (
                    link.per_message or not self._lookup(link.destination, self._queues(link),
                                                         now)):
                credit.grant(None)  # the broker's own words: pass them as they are
            else:
                grant = self._decide(link, window, now)
                fields = _padded(fields, F.DRAIN + 1)
                fields[F.DELIVERY_COUNT] = UInt(grant.delivery_count or 0)
                fields[F.LINK_CREDIT] = UInt(grant.link_credit)
                changed = True
        if session.dropped_frames and next_incoming is not None:
            fields = _padded(fields, F.NEXT_INCOMING_ID + 1)
            fields[F.NEXT_INCOMING_ID] = UInt(serial_add(next_incoming, session.dropped_frames))
            changed = True
        if not changed:
            return None
        return frame(encode_performative_fields(FLOW, fields), channel)

    # -- decisions ---------------------------------------------------------------------------
    def _queues(self, link: SenderLink) -> frozenset[str]:
        """The queues the link's messages land in (per-message links: those it hit lately)."""
        if link.per_message:
            return frozenset(link.hit)
        return self._fixed_queues(link)

    def _fixed_queues(self, link: SenderLink) -> frozenset[str]:
        """A fixed destination's queues, kept on the link until the routing model or the
        policies change (``FlowController.generation``): the same answer, transfer after
        transfer, without routing each one."""
        generation = self.controller.generation
        route = link.route
        if route is not None and route[0] == generation:
            return route[1]
        queues = queues_for(self.controller, self.ctx.vhost, link.destination)
        link.route = (generation, queues)
        return queues

    def route(self, link: SenderLink, payload: bytes, start: int, end: int,
               now: float) -> frozenset[str]:
        if not link.per_message:
            if (route := link.route) is not None and route[0] == self.controller.generation:
                return route[1]  # (``_fixed_queues``' answer inline: per transfer)
            return self._fixed_queues(link)
        if not self.controller.queues and not self.controller.polices_vhost(self.ctx.vhost):
            return frozenset()
        found = message_routing(payload, start, end)
        if found is None:
            return frozenset()
        to, subject = found
        destination = link.destination
        if link.anonymous:
            destination = parse_target(to) if to else None
            link.delivery.message_to = to or ""
        queues = queues_for(self.controller, self.ctx.vhost, destination, subject)
        link.delivery.lookup = self._lookup(destination, queues, now, subject)
        return queues

    def _lookup(self, destination: Destination | None, queues: frozenset[str], now: float,
                subject: str | None = None) -> frozenset[QueueKey]:
        """The lookup pseudo-queue to withhold credit on until the broker was asked about
        a destination the model does not know (``FlowController.lookup_for``), or none."""
        if destination is None:
            return _NO_KEYS
        key = destination.routing_key if destination.routing_key is not None else subject
        if key is None:
            return _NO_KEYS
        pending = self.controller.lookup_for(self.ctx.vhost, destination.exchange, key, queues, now)
        return _NO_KEYS if pending is None else frozenset((pending,))

    def _policed(self, link: SenderLink,
                 names: frozenset[str] | None = None) -> frozenset[QueueKey]:
        """The policed queues among ``names`` (None: ``_queues(link)``)."""
        queues = self.controller.queues
        if not queues:
            return _NO_KEYS
        if names is None:
            names = self._queues(link)
        return self.controller.policed(self.ctx.vhost, names)

    def _window(self, link: SenderLink, now: float,
                names: frozenset[str] | None = None) -> int | None:
        """The link's credit cap, or None when nothing it sends to is policed (``names``:
        ``_queues(link)`` when the caller has just computed it): its window
        (``window_bytes``: its policy's, or its part of its queues' room and in-flight
        allowance when that is more: ``_room_window``) in messages, paced to the drain while
        the last count shows a queue near capacity."""
        policed = self._policed(link, names)
        if not policed and not self._may_be_policed(link):
            return None
        queues = self.controller.queues
        size = self._message_bytes(link, policed)
        link.window_queues = window_queues = tuple(queues[k] for k in policed)
        link.window_rebases = _rebases(window_queues)
        link.policy_bytes = in_bytes = min((policy_window(queues[k].policy) for k in policed),
                                           default=WINDOW_BYTES)
        room = PACING_ROOM * window_for(size, in_bytes) * size
        if policed:
            in_bytes = max(in_bytes, self._room_window(link, policed, size, now))
        link.window_bytes = in_bytes
        window = ceiling = window_for(size, in_bytes)
        for key in policed:
            q = queues[key]
            if q.counted_room() > room:  # (below 0 when unarmed: pace)
                continue
            depth = q.depth
            drain = depth.drain_rate
            interval = depth.sample_interval
            share = None
            if drain is not None and interval is not None:
                share = drain * interval * drain_part(q) / self._feeders(key[1])
            window = min(window, paced_window(ceiling, share))
        return window

    def _message_bytes(self, link: SenderLink, policed: Iterable[QueueKey]) -> int:
        """The message size a link's credit is counted in: its typical one, else the
        largest mean of its policed queues, else ``ASSUMED_MESSAGE_BYTES``."""
        size = link.typical_bytes
        if not size:
            queues = self.controller.queues
            size = max((queues[k].depth.average_body_bytes() for k in policed),
                       default=0) or ASSUMED_MESSAGE_BYTES
        return size

    def _room_window(self, link: SenderLink, policed: frozenset[QueueKey], size: int,
                     now: float) -> int:
        """``link``'s part of the room its queues have left and of their in-flight
        allowance (``room_window`` plus ``PolicedQueue.allowance_bytes``, at most the room the
        last count left, both shared by the links given a window from the queue:
        ``PolicedQueue.room_sharers``; the least over the queues; 0: no room, or it is not
        known), in bytes. The room is the bytes and messages (at ``size``) a queue may still
        take before an evaluation could trip it. What the link may have in flight is its part
        of the allowance
        (``_in_flight_window``): far from capacity that is its credit, so a fast sender keeps
        the broker's pipeline full; past the capacity the policy's window stands."""
        queues = self.controller.queues
        holder = (self.ctx.conn_id, link.ref)
        part = ROOM_WINDOW_BYTES
        for key in policed:
            q = queues[key]
            room = q.room(size)
            sharers = q.room_sharers(holder, now)
            extra = 0.0
            if 0 < room < math.inf:
                extra = max(0.0, min(q.counted_room(), q.allowance_bytes())) / sharers
            part = min(part, int(room_window(room, sharers) + extra))
            if not part:
                break
        return part

    def _feeders(self, queue: str) -> int:
        """This connection's sender links whose last message went to ``queue`` (at least 1):
        they share the queue's drain. Counted only near capacity (a scan of the links)."""
        n = 0
        for session in self.sessions.values():
            for link in session.links.values():
                if isinstance(link, SenderLink) and not link.detaching \
                        and queue in link.delivery.queues:
                    n += 1
        return n or 1

    def overshoot(self, names: frozenset[str], body_bytes: int) -> None:
        """A delivery to ``names`` forwarded while some of them are tripped: count it on each."""
        queues = self.controller.queues
        for key in self.controller.blocking(self.ctx.vhost, names):
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
            return bool(controller.queues) or controller.polices_vhost(self.ctx.vhost)
        destination = link.destination
        if destination is None or destination.routing_key is None:
            return False
        if destination.exchange:
            return controller.polices_vhost(self.ctx.vhost)
        return controller.enforces(self.ctx.vhost, destination.routing_key)

    # -- shadow mode -------------------------------------------------------------------------
    def shadow_transfer(self, link: SenderLink, queues: frozenset[str]) -> None:
        """A delivery's first frame, with shadow policies tripped (or the link's would-be
        hold to end): what enforcing them would have done (``enforce.shadow``). A fixed
        link's refused delivery withholds its credit, as enforced (``after_transfer``)."""
        at = self.lifecycle.at(link)
        would = self.shadow.would_wait_on(at, link.shadow, queues)
        if not would:
            return
        lookups = link.delivery.lookup if link.per_message else _NO_KEYS
        blocking = self.controller.blocking(self.ctx.vhost, queues) | lookups
        verdict = decide(self.ctx.vhost, queues, blocking, self.controller.queues, self.ctx.spool,
                         lookup=bool(lookups), behind=link.spool_refused, shadow=would).shadow
        if verdict is Verdict.REJECT and not link.per_message:
            verdict = Verdict.HOLD
        self.shadow.would_have(at, link.shadow, verdict, would, None)

    # -- spool -------------------------------------------------------------------------------
    def _spooling(self, link: SenderLink, queues: frozenset[str],
                  blocking: frozenset[QueueKey], lookups: frozenset[QueueKey]) -> Decision:
        """What the decision says of ``link``'s next messages (spooled: its credit stays)."""
        return decide(self.ctx.vhost, queues, blocking, self.controller.queues, self.ctx.spool,
                      lookup=bool(lookups), behind=link.spool_refused)

    def _decide(self, link: SenderLink, window: int | None, now: float) -> LinkFlow:
        """The credit to give the client now: withheld while a queue it feeds is tripped."""
        queues = self._queues(link)
        blocking = self.controller.blocking(self.ctx.vhost, queues)
        lookups = _NO_KEYS if link.per_message else self._lookup(link.destination, queues, now)
        blocking |= lookups
        if blocking and self._spooling(link, queues, blocking, lookups).verdict \
                is not Verdict.SPOOL and self._block(link, blocking, now):
            return link.credit.grant(0)
        if link.withheld:
            link.move(LinkInput.GRANTED)
            self._signalled(link, active=True)
        if link.held_bytes >= link.policy_bytes:
            return link.credit.grant(0)  # its held messages fill its window
        if window is not None:
            room = self._in_flight_window(link, window)
            link.squeezed = room < window
            if room < window:
                window = room
        return link.credit.grant(window)

    def _unsqueezed(self, link: SenderLink, ceiling: int) -> bool:
        """Whether no window up to ``ceiling`` can squeeze ``link`` now: its part of the
        in-flight allowance less what it has unsettled is at least that (a link squeezed by
        this very transfer is topped up as one: ``SQUEEZED_TOP_UP``)."""
        part = self.in_flight_part(link)
        return part is None or part - link.unsettled >= ceiling

    def _in_flight_window(self, link: SenderLink, window: int) -> int:
        """The credit a windowed link may have: its window, less what it has unsettled at the
        broker beyond its part of its queues' in-flight allowance (``in_flight_part``), at
        least 1 with nothing unsettled. Credit plus unsettled deliveries then stay within the
        allowance, which the counts take to hold what the broker has not settled
        (``floodwall.control.depth``): the depth stays within the capacity plus it."""
        part = self.in_flight_part(link)
        if part is None:
            return window
        room = part - link.unsettled
        if room >= window:
            return window
        return max(room, 0 if link.unsettled else 1)

    def in_flight_part(self, link: SenderLink) -> int | None:
        """``link``'s part of the in-flight allowance of the queues its deliveries count on
        (``PolicedQueue.allowance_bytes``, shared by the links given a window from the
        queue's room: ``room_leases``), in messages at its size as a window counts them
        (``window_for``; under ``max_messages``, at most its part of the queue's allowance in
        messages), the least over them; None when none is policed. Far from capacity (the
        room the estimate leaves more than ``ROOM_PARTS`` allowances) its part of half that
        room instead: deliveries unsettled beyond the allowance are counted in the estimate,
        and what is in flight within half the room cannot reach the capacity."""
        queues = link.in_flight_queues
        if not queues:
            queues = tuple(self.controller.queues[k] for k in self._policed(link))
            if not queues:
                return None
        size = self._message_bytes(link, (q.key for q in queues))
        least: int | None = None
        for q in queues:
            n = max(1, len(q.room_leases))
            allowance = q.allowance_bytes()
            room = q.room(size)
            if allowance * ROOM_PARTS < room < math.inf:  # far from capacity: half the room
                part = window_for(size, int(room / (ROOM_PARTS * n)))
            else:
                part = window_for(size, int(allowance / n))
                if q.policy.max_messages is not None:  # (and at most its part of those)
                    part = min(part, q.allowance(size) // n)
            least = part if least is None else min(least, part)
        return least

    def after_transfer(self, link: SenderLink, now: float,
                        routed: frozenset[str] | None = None) -> None:
        """After a client transfer: withhold credit if a queue tripped, else top it up.

        A per-message link under ``overflow: reject`` keeps its credit: what it sends to the
        tripped queue is refused one by one, what it sends elsewhere goes on. ``routed``: the
        fixed destination's queues, when the caller has just routed them (``_queues(link)``).
        """
        if link.blocked:
            if link.admitted_credit:
                self._admitted_sent(link)
            return
        fixed: frozenset[str] | None = None
        if link.per_message:
            queues = link.delivery.queues
            lookups = link.delivery.lookup
        else:
            queues = fixed = routed if routed is not None else self._queues(link)
            lookups = _NO_KEYS
        controller = self.controller
        blocking = controller.blocking(self.ctx.vhost, queues)
        if lookups:
            blocking |= lookups
        full = link.held_bytes >= link.policy_bytes  # (its held messages fill its window)
        if blocking:
            verdict = self._spooling(link, queues, blocking, lookups).verdict
            if not (link.per_message and verdict is Verdict.REJECT and not lookups) \
                    and verdict is not Verdict.SPOOL and (full or not link.delivery.held):
                self._block(link, blocking, now)  # no flow: the limit the client has stands
                return
        if full:
            return  # no top-up until the broker settles some (``CreditFlow.held_settled``)
        deliveries = link.deliveries
        if deliveries and link.windowed and not link.squeezed and link.window_generation \
                == controller.generation and _rebases(link.window_queues) == link.window_rebases:
            ceiling = window_for(-(-link.payload_bytes // deliveries), link.window_bytes)
            if link.credit.has_over_half(ceiling) and self._unsqueezed(link, ceiling):
                return  # over half its ceiling left: no window ``_window`` gives tops it up
        window = self._window(link, now, fixed)
        link.windowed = window is not None
        if window is None:
            link.squeezed = False
            return
        link.window_generation = controller.generation
        room = self._in_flight_window(link, window)
        credit = link.credit
        link.squeezed = room < window
        if room < window:
            # Squeezed: topped up as the broker's settlements free an eighth of its part of
            # the allowance (about one of RabbitMQ's dispositions), so what the link has in
            # flight stays near its part rather than swinging down to half of it.
            if room - credit.client_credit >= max(1, (room + link.unsettled) // SQUEEZED_TOP_UP) \
                    and credit.broker_credit > credit.client_credit:
                self.lifecycle.send_grant(link, credit.grant(room))
            return
        if credit.wants_top_up(window):
            self.lifecycle.send_grant(link, credit.grant(window))

    def _block(self, link: SenderLink, blocking: frozenset[QueueKey], now: float) -> bool:
        """Block the link on ``blocking``; False when they all released meanwhile."""
        if link.blocked:
            return True
        newly = self.controller.block(self.ctx.conn_id, link.ref, blocking, now,
                                      link.policy_bytes)
        if not newly and not self.controller.is_blocked(self.ctx.conn_id, link.ref):
            return False
        link.move(LinkInput.BLOCKED)
        link.starved_since = None
        self.withheld[link.ref] = link
        self.ctx.outbox.append(ev.PublisherHeld(self.lifecycle.at(link), blocking, True))
        self._signalled(link, active=False)
        return True

    def _signalled(self, link: SenderLink, active: bool) -> None:
        self.ctx.counters.signalled(PROTOCOL, active)
        self.ctx.outbox.append(ev.Signalled(self.lifecycle.at(link), active))

    def _link_of(self, channel: int) -> SenderLink | None:
        """The sender link of link_ref ``channel`` (None: gone, or detached by the proxy)."""
        session = self.sessions.get(channel >> 32)
        link = session.links.get(channel & 0xFFFFFFFF) if session is not None else None
        if not isinstance(link, SenderLink) or link.detaching:
            return None
        return link

    def channel_admitted(self, channel: int, now: float) -> None:
        """The controller: a held queue link ``channel`` (a link_ref) waits on has tokens
        (``floodwall.control.admission``), its turn in the round robin with the 0-9-1
        channels waiting on it. Only while something else keeps the queue held (a 0-9-1
        channel waiting here, other fleet members forwarding: ``held_by_others``); links
        alone on it wait for the release, as their credit near capacity is paced to the
        drain (``paced_window``), and the queue cycles through its resume level. The link
        gets credit for what the tokens left hold (less
        what other held links were admitted and have not sent: ``admission_room``), at most its
        window; that credit is reserved on the tokens until its transfers come
        (``FlowController.reserve``), so a 0-9-1 channel later in the round is not
        admitted on it too. The link stays blocked (its hold goes on)."""
        link = self._link_of(channel)
        if link is None or not link.blocked:
            return
        controller, conn = self.controller, self.ctx.conn_id
        keys = controller.blocked_on(conn, link.ref)
        if not keys or not controller.held_by_others(keys):
            return
        room = controller.admission_room(keys, now, conn, link.ref)
        if room is None:
            return
        size = link.typical_bytes or ASSUMED_MESSAGE_BYTES
        window = window_for(size, link.policy_bytes)
        admitted = int(min(window, room[0] // size, room[1]))  # (a room may be inf)
        if admitted <= link.credit.client_credit:
            return
        grant = link.credit.grant(admitted)
        link.admitted_credit = left = link.credit.client_credit
        controller.reserve(conn, link.ref, left, left * size)
        link.starved_since = None  # (its deadline counts from when it is out of credit again)
        self.lifecycle.send_grant(link, grant)

    def _admitted_sent(self, link: SenderLink) -> None:
        """A held link sent on admitted credit: its reservation is what it has left."""
        left = min(link.admitted_credit, link.credit.client_credit)
        link.admitted_credit = left
        self.controller.reserve(self.ctx.conn_id, link.ref, left,
                                left * (link.typical_bytes or ASSUMED_MESSAGE_BYTES))

    def channel_released(self, channel: int, now: float) -> None:
        """The controller: every queue link ``channel`` (a link_ref) waited on has drained."""
        link = self._link_of(channel)
        if link is None:
            return
        link.admitted_credit = 0  # (its reservation ended with its hold)
        link.move(LinkInput.RELEASED)
        link.starved_since = None
        self.withheld.pop(link.ref, None)
        link.spool_refused = False
        link.hit.clear()
        window = self._window(link, now)
        grant = self._decide(link, window, now)
        if not link.blocked:
            self.lifecycle.send_grant(link, grant)


def drain_part(q: PolicedQueue) -> float:
    """This sidecar's part (0..1) of ``q``'s drain: 1 alone; in a fleet, its rate share of
    the drain (``ShareRule.rate_share``: max-min fair on the members' announced demands),
    as a held 0-9-1 channel's admission has it, so N members pacing their links near
    capacity feed the queue at its drain together, not N times it."""
    rule = q.share
    if rule is None:
        return 1.0
    depth = q.depth
    drain = (depth.drain_rate or 0.0) * (depth.average_body_bytes() or ASSUMED_MESSAGE_BYTES)
    if drain <= 0:
        return 1.0
    return min(1.0, rule.rate_share(drain) / drain)


def _rebases(queues: tuple[PolicedQueue, ...]) -> int:
    """How many times ``queues`` took a new count (or management figure) as their base."""
    if len(queues) == 1:
        return queues[0].depth.rebases
    return sum(q.depth.rebases for q in queues)
