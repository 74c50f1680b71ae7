"""The 1.0 credit gate's sessions and links: their lifecycle as both peers begin, attach, detach
and end them; what a link's spool capture holds, and its messages held for their queues
(``HeldMessages``, owned here: a link that goes loses them); the frames the proxy makes for a
link (grants, settlements, detaches)."""

from __future__ import annotations

from floodwall.enforce import events as ev
from floodwall.enforce.amqp10.held import HeldMessages
from floodwall.enforce.amqp10.inflight import InFlightDeliveries
from floodwall.enforce.amqp10.links import (
    ANSWERS_AWAITED,
    CLIENT_DETACH_AWAITED,
    PROTOCOL,
    TRANSFER_LIMIT_EXCEEDED,
    Link,
    ReceiverLink,
    SenderLink,
    SessionGate,
    SpoolCapture,
    _renumber_disposition,
    grant_flow_body,
)
from floodwall.enforce.amqp10.outcomes import BrokerOutcomes
from floodwall.enforce.shared import GateContext
from floodwall.enforce.states import DeliveryInput, LinkInput
from floodwall.wire.amqp10.addresses import (
    declared_queue,
    parse_target,
    source_queue,
)
from floodwall.wire.amqp10.credit import (
    LinkFlow,
    SenderCredit,
    serial_add,
)
from floodwall.wire.amqp10.framing import frame
from floodwall.wire.amqp10.performatives import (
    DETACH,
    DISPOSITION,
    ERROR,
    Attach,
    Begin,
    Role,
    encode_performative,
    performative,
)
from floodwall.wire.amqp10.performatives import (
    DispositionFields as D,
)
from floodwall.wire.amqp10.types import Described, Symbol, UInt
from floodwall.wire.topology import ChangeKind, TopologyChange


class Sessions:
    """A connection's sessions and links as its credit gate keeps them: the part that begins,
    attaches, detaches and ends them (both peers' frames), and makes the frames the proxy
    sends about a link.

    It is handed the gate's tables: ``sessions`` (by the client's channel) and
    ``by_server_channel`` (the same sessions by the broker's), ``withheld`` (the links whose
    credit is withheld, by ``link_ref``: a link that goes is released from the controller)
    and the deliveries in flight (a link or session that goes counts none)."""

    def __init__(self, ctx: GateContext, sessions: dict[int, SessionGate],
                 by_server_channel: dict[int, SessionGate], withheld: dict[int, SenderLink],
                 in_flight: InFlightDeliveries, outcomes: BrokerOutcomes) -> None:
        self.ctx = ctx
        self.sessions = sessions
        self.by_server_channel = by_server_channel
        self.withheld = withheld
        self.in_flight = in_flight
        self.captured_bytes = 0  # bytes of its links' spool captures (counted as held)
        self.held = HeldMessages(ctx, self, outcomes)  # messages held for their queues

    def close(self) -> None:
        """The connection is gone: none of its links is blocked any more, nothing of it is
        captured for the spool."""
        self.ctx.controller.connection_closed(self.ctx.conn_id)
        for session in self.sessions.values():
            self.in_flight.forget_session(session)
            for link in session.links.values():
                if isinstance(link, SenderLink):
                    self.uncapture(link)
        self.held.close()
        self.sessions.clear()
        self.by_server_channel.clear()

    # -- output ------------------------------------------------------------------------------
    def at(self, link: SenderLink) -> ev.At:
        """Where an event about ``link`` happened."""
        ctx = self.ctx
        return ev.At(PROTOCOL, ctx.conn_id, ctx.vhost, link.ref,
                     ev.LinkName(link.channel, link.handle, link.name))

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
        self.in_flight.forget_session(session)
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
        if declared is not None:
            session.declaring[attach.name] = declared

    def server_attach(self, channel: int, attach: Attach) -> None:
        session = self.by_server_channel.get(channel)
        if session is None:
            return
        declared = session.declaring.pop(attach.name, None)
        answered = attach.source_address if attach.role is Role.SENDER else attach.target_address
        if declared is not None and answered is not None:  # the broker declared it for the link
            self.ctx.outbox.append(TopologyChange(ChangeKind.DECLARE_QUEUE, self.ctx.vhost,
                                                  declared))
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
        if isinstance(link, SenderLink) and link.phase in CLIENT_DETACH_AWAITED:
            link.move(LinkInput.CLIENT_DETACH)  # the answer to the detach the proxy sent
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
            link.move(LinkInput.BROKER_DETACH)
            self._forget(session, link)
            return b""
        return None

    def _forget(self, session: SessionGate, link: Link) -> None:
        """Forget the link once neither peer will speak of it again."""
        if isinstance(link, SenderLink) and link.phase in ANSWERS_AWAITED:
            return
        if session.links.get(link.handle) is link:
            del session.links[link.handle]
        if session.attaching.get(link.name) is link:
            del session.attaching[link.name]
        if isinstance(link, SenderLink):
            self.in_flight.forget_link(session, link)
        self._link_gone(link)

    # -- spool captures ----------------------------------------------------------------------
    def keep(self, capture: SpoolCapture, part: bytes) -> None:
        """A frame's payload of a delivery being captured: kept, counted as held."""
        n = len(part)
        capture.parts.append(part)
        capture.size += n
        self.captured_bytes += n
        self.ctx.counters.held_bytes += n

    def uncapture(self, link: SenderLink) -> SpoolCapture | None:
        """The link's spool capture, which stops counting as held (None: it had none)."""
        capture, link.capture = link.capture, None
        if capture is not None and capture.size:
            self.captured_bytes -= capture.size
            self.ctx.counters.held_bytes -= capture.size
        return capture

    def _link_gone(self, link: Link) -> None:
        if isinstance(link, SenderLink):
            self.uncapture(link)
            self.held.link_gone(link)
        if isinstance(link, SenderLink) and link.blocked:
            link.move(LinkInput.RELEASED)
            self.withheld.pop(link.ref, None)
            self.ctx.controller.channel_closed(self.ctx.conn_id, link.ref)

    def on_client_disposition(self, channel: int, fields: list[object]) -> bytes | None:
        """The client settles its own deliveries (role sender): mapped to the broker's ids;
        those the proxy consumed (and settled itself) are left out."""
        session = self.sessions.get(channel)
        if session is None or not fields or fields[D.ROLE] is not False:
            return None
        return _renumber_disposition(fields, session.ids, session.ids.broker_ranges, channel)

    # -- frames the proxy makes --------------------------------------------------------------
    def send_grant(self, link: SenderLink, grant: LinkFlow) -> None:
        """A flow to the client for ``link``, with the broker's last session fields."""
        session = self.sessions.get(link.channel)
        if session is None or session.server_channel is None or link.server_handle is None:
            return
        next_incoming = session.next_incoming
        if next_incoming is not None and session.dropped_frames:
            next_incoming = serial_add(next_incoming, session.dropped_frames)
        self.ctx.to_client(frame(grant_flow_body(
            next_incoming, session.incoming_window, session.next_outgoing,
            session.outgoing_window, link.server_handle, grant.delivery_count or 0,
            grant.link_credit, grant.drain), session.server_channel))

    def settle(self, session: SessionGate, first: int, last: int, state: Described) -> None:
        """Settle the client's deliveries ``first..last`` with ``state``, as the receiver."""
        if session.server_channel is None:
            return
        self.ctx.to_client(frame(encode_performative(
            DISPOSITION, role=True, first=UInt(first),
            last=None if last == first else UInt(last), settled=True, state=state),
            session.server_channel))

    def transfer_limit_exceeded(self, session: SessionGate, link: SenderLink) -> bytes:
        """Detach the link on both sides; the broker's detach replaces the transfer."""
        return self.detach_by_proxy(session, link, TRANSFER_LIMIT_EXCEEDED,
                                     "floodwall: transfer beyond the granted link credit")

    def detach_by_proxy(self, session: SessionGate, link: SenderLink, condition: str,
                        description: str) -> bytes:
        """Detach ``link`` on both sides: the client's detach is queued, the broker's returned.

        Later frames of the link are dropped, both peers' answering detaches absorbed."""
        link.delivery.move(DeliveryInput.PROXY_DETACHES)
        self._link_gone(link)
        self.ctx.outbox.append(ev.EndedByProxy(self.at(link), description, condition))
        error = performative(ERROR, condition=Symbol(condition), description=description)
        if session.server_channel is not None and link.server_handle is not None:
            link.move(LinkInput.PROXY_DETACHES)  # both peers answer
            self.ctx.to_client(frame(encode_performative(
                DETACH, handle=UInt(link.server_handle), closed=True, error=error),
                session.server_channel))
        else:  # the client has not heard of the broker's end: only the broker answers
            link.move(LinkInput.PROXY_DETACHES_BROKER_SIDE)
        return frame(encode_performative(DETACH, handle=UInt(link.handle), closed=True,
                                         error=error), link.channel)
