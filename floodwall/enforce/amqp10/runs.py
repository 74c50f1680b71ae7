"""A sender link's run of whole deliveries booked at once (the per-transfer cost).

``on_client_transfer`` decides about each delivery: its credit, its queues, a trip, a spool,
a shadow verdict, renumbering, the window. Most of the time, on a link far from its queues'
capacities, every one of those answers is "as before", and working them out per transfer is
most of a policed 1.0 sender's cost in the proxy. So after a delivery went through
``on_client_transfer``, the core asks ``transfer_run`` how many more deliveries of the same
link could be booked with no decision at all, reads that many (or fewer) in one pass
(``floodwall.wire.amqp10.runs.scan_transfer_run``) and hands the totals to
``on_transfer_run``.

A run is allowed only while nothing it books can change a decision: the link's own state
allows it (``SenderLink.may_run``: not blocked or detaching, between deliveries, not
per-message, not held in shadow); none of its queues is blocking (a trip, a backlog, an
alarm, a lookup) and no shadow queue is tripped; and the run stays within the client's
credit (the highest limit granted: one more is a transfer-limit violation, read the usual
way) and below the ledger totals at which the controller would evaluate any of its queues again
(``floodwall.control.controller.quiet_room``). Within those bounds ``on_transfer_run`` books
exactly what ``on_client_transfer`` would, delivery by delivery: the credit's delivery-count,
the link's counts, the queues' ledgers, each unsettled delivery in flight (by the broker's
id: on a session some of whose deliveries the proxy consumed, the broker's ids run behind the
client's by as many, and the core relays the run with each id renumbered, as it would each
transfer). The one difference is the window: it is worked out once after the run instead
of after each delivery, so the client gets at most one top-up flow per run (a flow states
the credit absolutely: the later one grants what the earlier ones would have, and the window
bounds it as before).
"""

from __future__ import annotations

from floodwall.control.controller import forwarded_run, quiet_room
from floodwall.enforce.amqp10.credit import LinkCredit
from floodwall.enforce.amqp10.inflight import InFlightDeliveries
from floodwall.enforce.amqp10.links import ReceiverLink, SenderLink, SessionGate
from floodwall.enforce.shared import GateContext
from floodwall.wire.amqp10.credit import serial_add


class TransferRuns:
    """The credit gate's run booking (``TransferHooks.transfer_run`` / ``on_transfer_run``,
    and the broker's side: ``server_transfer_run`` / ``on_server_transfer_run``).

    It is handed the session tables, the credit part (a run ends as a delivery does: its
    window worked out, ``LinkCredit.after_transfer``) and the deliveries in flight (a run's
    unsettled deliveries count as each would)."""

    def __init__(self, ctx: GateContext, sessions: dict[int, SessionGate],
                 by_server_channel: dict[int, SessionGate], credit: LinkCredit,
                 in_flight: InFlightDeliveries) -> None:
        self.ctx = ctx
        self.controller = ctx.controller  # (the process' one: read per run)
        self.sessions = sessions
        self.by_server_channel = by_server_channel
        self.credit = credit
        self.in_flight = in_flight

    def transfer_run(self, channel: int, handle: int) -> tuple[int, float] | None:
        """After a whole delivery of ``handle`` went through ``on_client_transfer`` (or, at
        the start of a read, a run the last read ended with): how many more whole deliveries
        of that link (at most), and how many payload bytes, the gate books with
        ``on_transfer_run`` as it would one at a time; None when it would decide something
        about the next one, or route it again (the routing model or policies changed since
        its link's last delivery was routed)."""
        session = self.sessions.get(channel)
        if session is None:
            return None
        link = session.links.get(handle)
        if type(link) is not SenderLink or not link.may_run:
            return None
        delivery = link.delivery
        controller = self.controller
        route = link.route  # (asked again by the next read: routed as its last delivery was)
        if route is None or route[1] is not delivery.queues \
                or route[0] != controller.generation:
            return None
        vhost = self.ctx.vhost
        if controller.trips.shadow or controller.blocking(vhost, delivery.queues):
            return None
        count = link.credit.room()
        if count <= 0:
            return None
        room = quiet_room(controller.queues, vhost, delivery.queues)
        if room is None:
            return None
        room_bytes, room_messages = room
        if room_messages < count:
            count = int(room_messages)
        if count <= 0 or room_bytes <= 0:
            return None
        return count, room_bytes

    def on_transfer_run(self, channel: int, handle: int, count: int, payload_bytes: int,
                        unsettled: list[int], now: float) -> int:
        """``count`` whole deliveries of the link, ``payload_bytes`` in all, within what
        ``transfer_run`` allowed; ``unsettled``: the client's delivery-ids of those sent
        unsettled. Returns the session's renumbering: the deliveries consumed before them,
        by which the broker's ids run behind the client's."""
        session = self.sessions[channel]
        link = session.links[handle]
        assert type(link) is SenderLink
        shift = link.delivery.id_shift = session.ids.dropped
        if shift and unsettled:
            unsettled = [serial_add(i, -shift) for i in unsettled]
        link.credit.transferred(count)
        link.deliveries += count
        link.payload_bytes += payload_bytes
        queues = link.delivery.queues
        tracked = bool(unsettled) and link.windowed
        forwarded_run(self.controller.queues, self.ctx.vhost, queues, payload_bytes, count, now,
                      len(unsettled) if tracked else 0)
        if tracked:
            self.in_flight.track_run(session, link, unsettled)
        self.credit.after_transfer(link, now, queues)
        return shift

    # -- the broker's deliveries to the client ---------------------------------------------
    def server_transfer_run(self, channel: int, handle: int) -> bool:
        """After ``on_server_transfer`` took a whole delivery of the broker's ``handle``:
        whether the following whole deliveries of that link are booked as a run (nothing is
        decided about them: the session's transfer count and the queue's delivered count)."""
        session = self.by_server_channel.get(channel)
        if session is None:
            return False
        link = session.by_server_handle.get(handle)
        return type(link) is ReceiverLink and not link.in_delivery

    def on_server_transfer_run(self, channel: int, handle: int, count: int) -> None:
        """``count`` whole deliveries of the broker's ``handle``, relayed unchanged: what
        ``on_server_transfer`` books for each."""
        session = self.by_server_channel[channel]
        session.next_outgoing = serial_add(session.next_outgoing, count)
        link = session.by_server_handle[handle]
        assert type(link) is ReceiverLink
        if link.queue is not None:
            q = self.controller.queues.get((self.ctx.vhost, link.queue))
            if q is not None:
                q.depth.delivered(count)
