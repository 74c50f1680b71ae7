"""The 1.0 credit gate's deliveries in flight: a windowed link's forwarded unsettled deliveries,
counted on the link and on its policed queues (``PolicedQueue.in_flight``) until the broker
settles them (``SessionGate.in_flight``: ranges of the broker's delivery-ids), so that what the
broker may hold unseen counts against the link's part of the queue's in-flight allowance
(``credit.LinkCredit._in_flight_window``), and each settlement is counted back into the
queue's depth (``PolicedQueue.settled``)."""

from __future__ import annotations

from floodwall.enforce.amqp10.links import InFlight, SenderLink, SessionGate, _uint
from floodwall.enforce.commands import ReadEveryFrame
from floodwall.enforce.shared import GateContext
from floodwall.wire.amqp10.credit import MASK, serial_add, serial_diff
from floodwall.wire.amqp10.performatives import TRANSFER
from floodwall.wire.amqp10.performatives import TransferFields as T


class InFlightDeliveries:
    """Counts each windowed link's unsettled deliveries (``SessionGate.in_flight``,
    ``SenderLink.unsettled``) from the transfer the gate forwards to the broker's settlement.

    The first one counted asks the core to read the broker's every disposition
    (``ReadEveryFrame(broker_only=True)``), once per connection."""

    def __init__(self, ctx: GateContext) -> None:
        self.ctx = ctx
        self.tracking = False  # ReadEveryFrame(broker_only=True) was asked for

    def track(self, session: SessionGate, link: SenderLink, fields: list[object]) -> None:
        """Count a forwarded unsettled delivery of a windowed link until the broker settles
        it: what the broker has not settled may not be in its queue yet (RabbitMQ's internal
        flow control can hold hundreds of messages between the socket and the queue, and a
        ready count does not see them), so it counts against the link's in-flight allowance."""
        delivery_id = _uint(fields, T.DELIVERY_ID, TRANSFER)
        if delivery_id is None:
            return
        shift = link.delivery.id_shift
        broker_id = serial_add(delivery_id, -shift) if shift else delivery_id
        entry = self.entry(link)
        for q in entry[1]:
            q.in_flight += 1
        session.in_flight.add(broker_id, broker_id, entry)
        link.delivery.tracked_id = broker_id
        link.unsettled += 1
        if not self.tracking:
            self._start_tracking()

    def track_run(self, session: SessionGate, link: SenderLink, ids: list[int]) -> None:
        """``track`` for each of ``ids`` (the broker's ids, in order): one range when they
        are consecutive, as a run sent unsettled is."""
        entry = self.entry(link)
        n = len(ids)
        for q in entry[1]:
            q.in_flight += n
        if (ids[-1] - ids[0]) & MASK == n - 1:
            session.in_flight.add(ids[0], ids[-1], entry)
        else:  # (some of the run were sent settled; ``add`` joins the consecutive ones)
            for broker_id in ids:
                session.in_flight.add(broker_id, broker_id, entry)
        link.delivery.tracked_id = ids[-1]
        link.unsettled += n
        if not self.tracking:
            self._start_tracking()

    def _start_tracking(self) -> None:
        self.tracking = True
        self.ctx.outbox.append(ReadEveryFrame(broker_only=True))

    def untrack(self, session: SessionGate, link: SenderLink) -> None:
        """The link's current delivery will not be settled by the broker (it was aborted)."""
        tracked = link.delivery.tracked_id
        if tracked is not None:
            entry = session.in_flight.get(tracked)
            if entry is not None and entry[0] is link:
                session.in_flight.cut(tracked, tracked)
                link.unsettled -= 1
                for q in entry[1]:
                    q.settled(1)
        link.delivery.tracked_id = None

    def entry(self, link: SenderLink) -> InFlight:
        """The in-flight entry of the link's deliveries: the link and the policed queues they
        count on (one tuple per link, made again when its queues or the policies change)."""
        names = link.delivery.queues
        controller = self.ctx.controller
        entry = link.in_flight_entry
        if entry is None or names != link.in_flight_names \
                or link.in_flight_generation != controller.generation:
            queues = controller.queues
            link.in_flight_names = names
            link.in_flight_generation = controller.generation
            policed = controller.policed(self.ctx.vhost, names) if queues else ()
            link.in_flight_queues = tuple(queues[k] for k in policed)
            entry = link.in_flight_entry = (link, link.in_flight_queues)
        return entry

    def settled(self, session: SessionGate, first: int, last: int) -> list[SenderLink]:
        """The broker settled deliveries ``first``..``last`` (its ids): they count no more.
        Returns the squeezed links among theirs (``SenderLink.squeezed``), whose windows have
        room again."""
        cut = session.in_flight.cut(first, last)
        if not cut:
            return []
        span = serial_diff(last, first)
        links: dict[int, SenderLink] = {}
        for (link, counted), n in cut:
            for q in counted:
                q.settled(n)
            link.unsettled -= n
            tracked = link.delivery.tracked_id
            if tracked is not None and 0 <= serial_diff(tracked, first) <= span:
                link.delivery.tracked_id = None
            if link.squeezed:  # (else its own transfers top it up, as they do)
                links[id(link)] = link
        return list(links.values())

    @staticmethod
    def forget_link(session: SessionGate, link: SenderLink) -> None:
        """The link is forgotten: its unsettled deliveries count no more."""
        if not link.unsettled:
            return
        for (_, counted), n in session.in_flight.take_link(link):
            for q in counted:
                q.settled(n)
        link.unsettled = 0

    @staticmethod
    def forget_session(session: SessionGate) -> None:
        """The session is gone: its deliveries no longer count in flight on their queues."""
        for (_, counted), n in session.in_flight.take_all():
            for q in counted:
                q.settled(n)
