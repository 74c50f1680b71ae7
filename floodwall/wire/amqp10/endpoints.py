"""What one AMQP 1.0 peer has opened: its Open, its sessions by channel, their links by handle."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

from floodwall.wire.amqp10.performatives import Attach, Begin, Detach, Ending, Open, Role
from floodwall.wire.relaycore import Side


@dataclass(slots=True)
class Link:
    """One attached link endpoint of a peer; a SENDER link's messages go to ``target_address``."""

    name: str
    handle: int
    role: Role
    source_address: str | None
    target_address: str | None
    coordinator: bool = False


@dataclass(slots=True)
class Session:
    """One begun session of a peer, on the channel that peer sends it on."""

    channel: int
    remote_channel: int | None  # set in the answering Begin: the other peer's channel
    links: dict[int, Link] = field(default_factory=dict)


@dataclass(slots=True)
class Peer:
    """One side's connection-level state as seen in the frames it sent.

    Bookkeeping is lenient: a performative on a channel or handle the peer never opened is
    relayed and left for the receiving peer to reject; the proxy only records what exists.
    """

    side: Side
    sasl_mechanism: str | None = None
    sasl_outcome: int | None = None
    open: Open | None = None
    close: Ending | None = None
    sessions: dict[int, Session] = field(default_factory=dict)

    def begin(self, channel: int, begin: Begin) -> None:
        self.sessions[channel] = Session(channel, begin.remote_channel)

    def end(self, channel: int) -> None:
        self.sessions.pop(channel, None)

    def attach(self, channel: int, attach: Attach) -> None:
        session = self.sessions.get(channel)
        if session is not None:
            session.links[attach.handle] = Link(
                attach.name,
                attach.handle,
                attach.role,
                attach.source_address,
                attach.target_address,
                attach.coordinator,
            )

    def detach(self, channel: int, detach: Detach) -> None:
        session = self.sessions.get(channel)
        if session is not None:
            session.links.pop(detach.handle, None)

    def links(self) -> Iterator[tuple[int, Link]]:
        """Every attached link as (channel, link)."""
        for channel, session in self.sessions.items():
            for link in session.links.values():
                yield channel, link
